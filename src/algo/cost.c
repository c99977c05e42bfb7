/* Cost-model selection (see cost.h). Estimates follow the alpha-beta-gamma model of Thakur,
 * Rabenseifner & Gropp 2005 (Optimization of Collective Communication Operations in MPICH,
 * IJHPCA 19(1)) and Chan, Heimlich, Purkayastha & van de Geijn 2007 (Collective communication:
 * theory, practice, and experience, CCPE 19(13)), with the link class each phase crosses: flat
 * algorithms run at the pace of the slowest link in the group (each step waits for its slowest
 * transfer), hierarchical ones pay the inter-node class only for their inter-node phase. On a
 * declared ring a message between non-neighbours costs the mean hops (hop); the ring and chain
 * schemes only talk to neighbours. S is the bytes the call is selected by (coll.c): the
 * whole vector (all_reduce, reduce, broadcast), the whole result (all_gather(v), gather) or
 * the whole input (reduce_scatter(v), scatter). p ranks, lg = floor(log2 p), clg = ceil. */
#include "algo/cost.h"
#include "algo/algos.h"

#include "core/log.h"
#include "topo/topo.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#define RING_SEGMENT ((double)HCOMM__RING_SEGMENT_BYTES)
#define RD_PIECE ((double)HCOMM__RD_PIECE_BYTES)
#define CHAIN_SEGMENT ((double)HCOMM__CHAIN_SEGMENT_BYTES)

typedef struct model {
    const hcomm__topo_t *t;
    hcomm__link_t flat, in, out; /* slowest class in the group, intra, inter */
    double gamma;                /* reduction: a rank's own memory speed */
    double hop;                  /* ring topology: mean hops of a non-neighbour message */
    int p, lg, clg, pof2;
    bool shm;
    bool reads; /* every rank can read every other's memory (transport.peer_read_ok) */
} model_t;

static double ring_ar(const model_t *m, double S) {
    double segs = S > RING_SEGMENT ? ceil(S / RING_SEGMENT) : 1.0, f = (m->p - 1.0) / m->p;
    return 2.0 * (m->p - 1) * segs * m->flat.alpha + 2.0 * f * S * m->flat.beta + f * S * m->gamma;
}

/* Extra ranks of a non-power-of-two group fold into a neighbour first and get the result
 * back: two more messages of the whole vector and one more reduction. */
static double fold(const model_t *m, double S) {
    return m->p == m->pof2 ? 0.0 : 2.0 * (m->flat.alpha + S * m->flat.beta) + S * m->gamma;
}

static double rhd_ar(const model_t *m, double S) {
    double f = (m->pof2 - 1.0) / m->pof2;
    return m->hop * (2.0 * m->lg * m->flat.alpha + 2.0 * f * S * m->flat.beta + fold(m, S)) +
           f * S * m->gamma;
}

static double rd_ar(const model_t *m, double S) {
    double pieces = S > RD_PIECE ? ceil(S / RD_PIECE) : 1.0, sz = S / pieces;
    return pieces * (m->hop * m->lg * (m->flat.alpha + sz * m->flat.beta) + m->lg * sz * m->gamma +
                     fold(m, sz));
}

/* naive (linear.c): every rank sends its vector to rank 0 at once, each on its own link (one
 * per rank, as the simulated machine has), so their link times overlap; rank 0 takes and
 * reduces the p - 1 vectors in turn (the copies out of the receives are not charged: they run
 * at memory speed, which the reductions' gamma dominates); then a binomial broadcast from rank 0,
 * whose rounds cross nodes only while the subtrees span several (ceil(log2 N) of them: ranks lie
 * node after node). */
static double naive_ar(const model_t *m, double S) {
    double inter = m->t->nnodes > 1 ? ceil(log2(m->t->nnodes)) : 0.0;
    double bcast = inter * (m->out.alpha + S * m->out.beta) +
                   (m->clg - inter) * (m->in.alpha + S * m->in.beta);
    return m->hop * (m->flat.alpha + S * m->flat.beta + bcast) + (m->p - 1.0) * S * m->gamma;
}

/* A read of a peer's memory is one copy with no message around it; the model has no copy rate
 * of its own, so it takes the faster of the intra link and the reduction kernel, which streams
 * the same memory (a message may cost more than one copy: staging, protocol). */
static double read_beta(const model_t *m) {
    return fmin(m->in.beta, m->gamma);
}

/* twoshot's all_reduce of S bytes among n ranks of one node (twoshot.c, and hier's node phases):
 * the addresses go to every peer (n - 1 messages), the reduce phase reads (n-1)/n of the vector
 * from the peers and reduces it, a dissemination barrier (ceil(log2 n) messages), the gather
 * phase reads the other (n-1)/n, and a second barrier; hop as model_t's. */
static double direct_ar(const model_t *m, double n, double S, double hop) {
    double f = (n - 1.0) / n;
    return hop * ((n - 1.0 + 2.0 * ceil(log2(n))) * m->in.alpha + 2.0 * f * S * read_beta(m)) +
           f * S * m->gamma;
}

/* Lanes L (fewest ranks on a node), G (most), N nodes; per lane, up to ceil(G/L) ranks per
 * node share one representative. */
static double hier(const model_t *m, int coll, double S) {
    const hcomm__topo_t *t = m->t;
    double L = t->min_node, G = t->max_node, N = t->nnodes, share = S / L, per = S / m->p;
    double members = ceil(G / L), red = coll == HCOMM__COLL_ALLGATHER ? 0.0 : m->gamma;
    double intra = (G - 1.0) * (m->in.alpha + share * (m->in.beta + red));
    double inter = (N - 1.0) * (m->out.alpha + share / N * (m->out.beta + red));
    double lanes = (members - 1.0) * (m->in.alpha + per * m->in.beta);
    if (coll == HCOMM__COLL_ALLREDUCE && m->reads)
        return direct_ar(m, G, G * share, 1.0) + inter +
               (N - 1.0) * (m->out.alpha + share / N * m->out.beta);
    if (coll == HCOMM__COLL_ALLREDUCE) /* reduce_scatter + all_gather in both phases */
        return intra + (G - 1.0) * (m->in.alpha + share * m->in.beta) + inter +
               (N - 1.0) * (m->out.alpha + share / N * m->out.beta);
    return intra + inter + lanes + S * m->in.beta; /* + the copy into / out of lane order */
}

static double transfer(const model_t *m, int coll, int algo, double S);
static double a2a(const model_t *m, int algo, double b);

/* --- all_reduce on one node by peer reads (twoshot.c) --- */

/* Reads cannot cross nodes, and on a simulated machine they would bypass its links, so twoshot
 * is no candidate beyond one node. */
static double twoshot_ar(const model_t *m, double S) {
    return m->t->nnodes > 1 ? INFINITY : direct_ar(m, m->p, S, m->hop);
}

/* --- all_gather(v) (S: the whole result) --- */

static double ring_ag(const model_t *m, double S) {
    return (m->p - 1.0) * (m->flat.alpha + S / m->p * m->flat.beta);
}

/* Bruck et al. 1997 (Thakur et al. 2005, 4.1): clg steps, (p-1)/p of the result received,
 * plus the copy into its scratch and the rotation out of it (one more pass over S). */
static double bruck_ag(const model_t *m, double S) {
    double f = (m->p - 1.0) / m->p;
    return m->hop * (m->clg * m->flat.alpha + f * S * m->flat.beta) + S * m->in.beta;
}

/* Recursive doubling: lg steps in place on a power of two; otherwise it runs Bruck. */
static double rd_ag(const model_t *m, double S) {
    if (m->p != m->pof2)
        return bruck_ag(m, S);
    return m->hop * (m->lg * m->flat.alpha + (m->p - 1.0) / m->p * S * m->flat.beta);
}

/* direct (one node, direct.c): p - 1 address messages, reads of `read` bytes, a barrier.
 * all_gather reads (p-1)/p of S, reduce_scatter as much (S/p from every rank, reduced), and
 * broadcast all of S. Like twoshot, no candidate beyond one node. */
static double direct_reads(const model_t *m, double read) {
    if (m->t->nnodes > 1)
        return INFINITY;
    return m->hop * (m->p - 1.0 + m->clg) * m->in.alpha + read * fmin(m->in.beta, m->gamma);
}

static double all_gather(const model_t *m, int algo, double S) {
    return algo == HCOMM__ALGO_RING     ? ring_ag(m, S)
           : algo == HCOMM__ALGO_RD     ? rd_ag(m, S)
           : algo == HCOMM__ALGO_BRUCK  ? bruck_ag(m, S)
           : algo == HCOMM__ALGO_DIRECT ? direct_reads(m, (m->p - 1.0) / m->p * S)
                                        : INFINITY;
}

/* --- reduce_scatter(v) (S: the whole input) --- */

/* Ring: p - 1 steps of S/p, each reduced, plus the copy of the own block out. */
static double ring_rs(const model_t *m, double S) {
    double f = (m->p - 1.0) / m->p;
    return ring_ag(m, S) + f * S * m->gamma + S * m->in.beta;
}

/* Recursive halving (Thakur et al. 2005, 4.2; rhd.c): lg steps among pof2 ranks exchanging
 * S/2, S/4, ..., each reduced; an extra rank of a non-power-of-two group first hands its
 * whole vector to its neighbour, which reduces it, and gets its block back at the end. */
static double rh_rs(const model_t *m, double S) {
    double f = (m->pof2 - 1.0) / m->pof2;
    double extra =
        m->p == m->pof2 ? 0.0 : 2.0 * m->flat.alpha + (S + S / m->p) * m->flat.beta + S * m->gamma;
    return m->hop * (m->lg * m->flat.alpha + f * S * m->flat.beta + extra) + f * S * m->gamma;
}

/* rd: an all_reduce of the whole vector (rd.c's hcomm__rs_rd), this rank's block kept. */
static double reduce_scatter(const model_t *m, int algo, double S) {
    return algo == HCOMM__ALGO_RING  ? ring_rs(m, S)
           : algo == HCOMM__ALGO_RHD ? rh_rs(m, S)
           : algo == HCOMM__ALGO_RD  ? rd_ar(m, S)
           : algo == HCOMM__ALGO_DIRECT
               ? direct_reads(m, (m->p - 1.0) / m->p * S) + (m->p - 1.0) / m->p * S * m->gamma
               : INFINITY;
}

/* --- broadcast (S: the buffer) --- */

/* Binomial tree: clg rounds, each carrying the whole buffer (Thakur et al. 2005, 4.1). */
static double tree_bc(const model_t *m, double S) {
    return m->hop * m->clg * (m->flat.alpha + S * m->flat.beta);
}

/* van de Geijn: binomial scatter (clg rounds, (p-1)/p of S leaves the root) then a ring
 * all_gather: (clg + p - 1) alpha + 2 (p-1)/p S beta. */
static double scatter_allgather_bc(const model_t *m, double S) {
    double f = (m->p - 1.0) / m->p;
    return m->hop * (m->clg * m->flat.alpha + f * S * m->flat.beta) + ring_ag(m, S);
}

/* Pipelined chain of k segments (Chan et al. 2007; bcast.c): the last rank has the last
 * segment after p - 1 + k - 1 segment steps; only neighbours talk. */
static double chain_bc(const model_t *m, double S) {
    double k = S > CHAIN_SEGMENT ? ceil(S / CHAIN_SEGMENT) : 1.0;
    return (m->p - 2.0 + k) * (m->flat.alpha + S / k * m->flat.beta);
}

/* rd: recursive doubling over the whole buffer, partners merging what they hold (rd.c's
 * hcomm__bc_rd): rd all_reduce's messages without its reduction. */
static double broadcast(const model_t *m, int algo, double S) {
    return algo == HCOMM__ALGO_TREE                ? tree_bc(m, S)
           : algo == HCOMM__ALGO_RD                ? rd_ar(m, S) - m->lg * S * m->gamma
           : algo == HCOMM__ALGO_DIRECT            ? direct_reads(m, S)
           : algo == HCOMM__ALGO_SCATTER_ALLGATHER ? scatter_allgather_bc(m, S)
           : algo == HCOMM__ALGO_CHAIN             ? chain_bc(m, S)
                                                   : INFINITY;
}

/* --- the rooted collectives --- */

/* reduce (S: the vector). Binomial tree: clg rounds of the whole vector, each reduced;
 * Rabenseifner (rhd): recursive-halving reduce_scatter then a binomial gather of the blocks,
 * 2 lg alpha + 2 (p-1)/p S beta + (p-1)/p S gamma (Thakur et al. 2005, 4.4); direct: the root
 * receives and reduces every rank's vector itself, or (one node, peers' memory readable) from
 * hcomm__reduce_split_bytes each rank reads and reduces its block of every vector and writes it
 * to the root. */
static double reduce(const model_t *m, int algo, double S) {
    double f = (m->pof2 - 1.0) / m->pof2;
    if (algo == HCOMM__ALGO_TREE)
        return m->hop * m->clg * (m->flat.alpha + S * m->flat.beta) + m->clg * S * m->gamma;
    if (algo == HCOMM__ALGO_RHD)
        return rh_rs(m, S) + m->hop * (m->lg * m->flat.alpha + f * S * m->flat.beta);
    if (algo == HCOMM__ALGO_DIRECT && m->reads && m->t->nnodes <= 1 &&
        S >= (double)hcomm__reduce_split_bytes(m->p))
        return m->hop * ((m->p - 1.0) * m->flat.alpha + S * m->flat.beta) +
               (m->p - 1.0) / m->p * S * m->gamma;
    if (algo == HCOMM__ALGO_DIRECT)
        return (m->p - 1.0) * (m->hop * (m->flat.alpha + S * m->flat.beta) + S * m->gamma);
    return INFINITY;
}

/* gather and scatter (S: the root's whole buffer). Direct: the root exchanges S/p with each
 * rank in turn; binomial tree: clg rounds, (p-1)/p of S through the root (Thakur et al. 2005,
 * section 4; Chan et al. 2007). */
static double rooted_move(const model_t *m, int algo, double S) {
    double f = (m->p - 1.0) / m->p;
    if (algo == HCOMM__ALGO_DIRECT)
        return m->hop * (m->p - 1.0) * (m->flat.alpha + S / m->p * m->flat.beta);
    if (algo == HCOMM__ALGO_TREE)
        return m->hop * (m->clg * m->flat.alpha + f * S * m->flat.beta);
    return INFINITY;
}

/* --- the backend's own --- */

/* Shared-memory transports (local) read peers' buffers once per byte, not over the simulated
 * links (so no candidate there). */
static double native_shm(const model_t *m, int coll, double S) {
    double f = (m->p - 1.0) / m->p;
    if (m->t->simulated && m->t->nnodes > 1)
        return INFINITY;
    switch (coll) {
    case HCOMM__COLL_ALLREDUCE:
        return 2.0 * m->in.alpha + 2.0 * f * S * m->in.beta + f * S * m->gamma;
    case HCOMM__COLL_REDUCESCATTER:
    case HCOMM__COLL_REDUCESCATTERV:
        return m->in.alpha + f * S * (m->in.beta + m->gamma);
    case HCOMM__COLL_REDUCE: /* the root reads and reduces every vector */
        return m->in.alpha + (m->p - 1.0) * S * (m->in.beta + m->gamma);
    case HCOMM__COLL_BROADCAST:
        return m->in.alpha + S * m->in.beta;
    default: /* all_gather(v), gather, scatter: (p-1)/p of S copied */
        return m->in.alpha + f * S * m->in.beta;
    }
}

/* Open MPI picks among the flat schemes as if every pair were linked alike (it does not know
 * a declared ring), and runs that one here. */
static double native(const model_t *m, int coll, double S) {
    if (m->shm)
        return native_shm(m, coll, S);
    model_t mesh = *m;
    mesh.hop = 1.0;
    static const int ar[] = {HCOMM__ALGO_RING, HCOMM__ALGO_RHD, HCOMM__ALGO_RD, -1};
    static const int bc[] = {HCOMM__ALGO_TREE, HCOMM__ALGO_SCATTER_ALLGATHER, -1};
    static const int red[] = {HCOMM__ALGO_TREE, HCOMM__ALGO_RHD, -1};
    static const int mv[] = {HCOMM__ALGO_TREE, HCOMM__ALGO_DIRECT, -1};
    const int *cand = coll == HCOMM__COLL_ALLREDUCE                               ? ar
                      : coll == HCOMM__COLL_BROADCAST                             ? bc
                      : coll == HCOMM__COLL_REDUCE                                ? red
                      : coll == HCOMM__COLL_GATHER || coll == HCOMM__COLL_SCATTER ? mv
                                                                                  : NULL;
    double f = (m->p - 1.0) / m->p;
    if (!cand) /* all_gather(v), reduce_scatter(v): ring-like, p - 1 steps */
        return ring_ag(m, S) +
               (coll == HCOMM__COLL_REDUCESCATTER || coll == HCOMM__COLL_REDUCESCATTERV
                    ? f * S * m->gamma
                    : 0.0);
    int best = cand[0];
    double best_est = INFINITY;
    for (int i = 0; cand[i] >= 0; i++) {
        double e = transfer(&mesh, coll, cand[i], S);
        if (e < best_est)
            best = cand[i], best_est = e;
    }
    return transfer(m, coll, best, S);
}

/* hier on one node is a ring without segments: costed a little above the ring, so that it
 * stays a finite choice there but never beats the scheme it reduces to. */
static double hier_or_ring(const model_t *m, int coll, double S) {
    if (m->t->nnodes > 1)
        return hier(m, coll, S);
    return transfer(m, coll, HCOMM__ALGO_RING, S) + m->in.alpha;
}

/* shm (shm.c), one node only: a meeting per HCOMM__BOARD_ROOM bytes a rank posts, its part
 * copied in, what it needs copied (or reduced) out. */
static double shm_coll(const model_t *m, int coll, double S) {
    double p = m->p, f = (p - 1.0) / p, room = HCOMM__BOARD_ROOM;
    if (m->t->nnodes > 1)
        return INFINITY;
    switch (coll) {
    case HCOMM__COLL_ALLREDUCE:
    case HCOMM__COLL_REDUCE:
        return fmax(1.0, ceil(S / room)) * m->in.alpha + S * m->in.beta + p * S * m->gamma;
    case HCOMM__COLL_REDUCESCATTER:
    case HCOMM__COLL_REDUCESCATTERV:
        return fmax(1.0, ceil(S / room)) * m->in.alpha + S * m->in.beta + S * m->gamma;
    case HCOMM__COLL_ALLGATHER:
    case HCOMM__COLL_ALLGATHERV:
    case HCOMM__COLL_GATHER:
        return fmax(1.0, ceil(S / p / room)) * m->in.alpha + (1.0 / p + f) * S * m->in.beta;
    case HCOMM__COLL_BROADCAST:
    case HCOMM__COLL_SCATTER:
        return fmax(1.0, ceil(S / room)) * m->in.alpha + 2.0 * S * m->in.beta;
    default:
        return INFINITY;
    }
}

static double transfer(const model_t *m, int coll, int algo, double S) {
    if (coll == HCOMM__COLL_ALLTOALLV)
        return a2a(m, algo, S);
    if (algo == HCOMM__ALGO_SHM)
        return shm_coll(m, coll, S);
    if (algo == HCOMM__ALGO_NATIVE)
        return native(m, coll, S);
    if (algo == HCOMM__ALGO_HIER && coll <= HCOMM__COLL_REDUCESCATTER)
        return hier_or_ring(m, coll, S);
    switch (coll) {
    case HCOMM__COLL_ALLREDUCE:
        return algo == HCOMM__ALGO_RING      ? ring_ar(m, S)
               : algo == HCOMM__ALGO_RHD     ? rhd_ar(m, S)
               : algo == HCOMM__ALGO_RD      ? rd_ar(m, S)
               : algo == HCOMM__ALGO_NAIVE   ? naive_ar(m, S)
               : algo == HCOMM__ALGO_TWOSHOT ? twoshot_ar(m, S)
                                             : INFINITY;
    case HCOMM__COLL_ALLGATHER:
    case HCOMM__COLL_ALLGATHERV:
        return all_gather(m, algo, S);
    case HCOMM__COLL_REDUCESCATTER:
    case HCOMM__COLL_REDUCESCATTERV:
        return reduce_scatter(m, algo, S);
    case HCOMM__COLL_BROADCAST:
        return broadcast(m, algo, S);
    case HCOMM__COLL_REDUCE:
        return reduce(m, algo, S);
    case HCOMM__COLL_GATHER:
    case HCOMM__COLL_SCATTER:
        return rooted_move(m, algo, S);
    default:
        return INFINITY;
    }
}

/* The signature agreement before the call (agree.c): a meeting in the posted slots on
 * shared-memory transports (none for their native path), else an empty recursive doubling
 * (HCOMM_CHECK=always); rd needs none, its first exchange is the check. */
static double agreement(const model_t *m, int algo) {
    if (algo == HCOMM__ALGO_RD)
        return 0.0;
    if (m->shm)
        return algo == HCOMM__ALGO_NATIVE ? 0.0 : m->in.alpha;
    return m->lg * m->flat.alpha;
}

/* all_to_allv, b the largest block of a pair (bytes): pairwise p - 1 steps of one block;
 * Bruck (1997) ceil(log2 p) steps of about p/2 blocks with a 16-byte size header each, plus
 * packing copies; direct (one node) p - 1 address messages, a barrier and one read per block;
 * hier (N nodes of G ranks, 24-byte record headers) on equal nodes G - 1 node-local bundles
 * of N blocks, then N - 1 inter-node bundles of G blocks per rank (rails), plus about three
 * copies of every block; on uneven ones a node-local pairwise, the node's blocks through its
 * leader and one inter-node message of G * G blocks per node pair; the backend's own as
 * pairwise (Open MPI) or one shared-memory read per block. Bruck's and hier's messages have
 * sizes the receiver learns by a probe; above the eager limit (A2A_BUNDLE_MAX) they ran several
 * times slower than pairwise (docs/tuning.md: cost.a2a-bundle), so the model charges them
 * A2A_BUNDLE_PENALTY times there (finite: a forced choice still has an estimate, but they
 * never win). hier on one node runs the pairwise exchange. */
#define A2A_BUNDLE_MAX 65536.0
#define A2A_BUNDLE_PENALTY 8.0

static double a2a_hier(const model_t *m, double b) {
    const hcomm__topo_t *t = m->t;
    double p = m->p, G = t->max_node, N = t->nnodes;
    if (t->min_node == t->max_node)
        return (G - 1.0) * (m->in.alpha + N * (b + 24.0) * m->in.beta) +
               (N - 1.0) * (m->out.alpha + G * (b + 24.0) * m->out.beta) + 3.0 * p * b * m->in.beta;
    return (G - 1.0) * (m->in.alpha + b * m->in.beta) +
           2.0 * (G - 1.0) * (m->in.alpha + (N - 1.0) * G * (b + 24.0) * m->in.beta) +
           (N - 1.0) * (m->out.alpha + G * G * (b + 24.0) * m->out.beta);
}

static double a2a(const model_t *m, int algo, double b) {
    const hcomm__topo_t *t = m->t;
    double p = m->p, steps = ceil(log2(p > 1 ? p : 1)), G = t->max_node, N = t->nnodes;
    double pw = (p - 1.0) * (m->flat.alpha + b * m->flat.beta);
    switch (algo) {
    case HCOMM__ALGO_NATIVE:
        if (m->shm)
            return t->simulated && N > 1 ? INFINITY : m->in.alpha + (p - 1.0) * b * m->in.beta;
        return pw;
    case HCOMM__ALGO_PAIRWISE:
        return pw;
    case HCOMM__ALGO_BRUCK:
        return (p / 2.0 * (b + 16.0) > A2A_BUNDLE_MAX ? A2A_BUNDLE_PENALTY : 1.0) *
               (steps * (m->flat.alpha + p / 2.0 * (b + 16.0) * m->flat.beta) +
                2.0 * p * b * m->in.beta);
    case HCOMM__ALGO_DIRECT:
        return N > 1 ? INFINITY : (p - 1.0 + steps) * m->in.alpha + (p - 1.0) * b * m->in.beta;
    case HCOMM__ALGO_SHM: /* one meeting; blocks through the board, or read where they lie */
        return N > 1 ? INFINITY : m->in.alpha + 2.0 * (p - 1.0) * b * m->in.beta;
    case HCOMM__ALGO_HIER:
        return N < 2
                   ? pw + m->in.alpha
                   : (G * (b + 24.0) > A2A_BUNDLE_MAX ? A2A_BUNDLE_PENALTY : 1.0) * a2a_hier(m, b);
    default:
        return INFINITY;
    }
}

static double estimate(const model_t *m, int coll, int algo, double S) {
    return agreement(m, algo) + transfer(m, coll, algo, S);
}

/* A message between ranks that share cores waits for its receiver to be scheduled, so with
 * more ranks than cores the intra-node latency a ping-pong measures (two ranks, the others
 * idle) grows with the oversubscription (docs/tuning.md: cost.oversubscribed). A simulated
 * inter-node message waits for that turn too, after its link time, so both classes get the
 * same added wait. Only on the local backend, whose ranks all read the same host, so every
 * rank chooses alike. */
static double oversubscription(const model_t *m) {
    int cores = 1, numa = 1;
    if (!m->shm)
        return 1.0;
    hcomm__host_info(&cores, &numa);
    return cores > 0 && m->p > cores ? (double)m->p / cores : 1.0;
}

static void model_of(hcomm_comm_t *c, const hcomm__topo_t *t, bool shm, model_t *m) {
    m->t = t;
    m->shm = shm;
    m->p = t->size;
    m->reads = hcomm__peer_reads(c);
    m->in = t->link[HCOMM__LINK_INTRA];
    m->out = t->link[HCOMM__LINK_INTER];
    double wait = (oversubscription(m) - 1.0) * m->in.alpha; /* the receiver's turn on a core */
    m->in.alpha += wait;
    m->out.alpha += wait;
    m->flat = t->nnodes > 1 ? m->out : m->in;
    m->gamma = m->in.gamma;
    m->pof2 = 1, m->lg = 0;
    while (m->pof2 * 2 <= m->p)
        m->pof2 *= 2, m->lg++;
    m->clg = m->lg + (m->pof2 < m->p);
    m->hop = t->kind == HCOMM__TOPO_RING && m->p > 4 ? m->p / 4.0 : 1.0;
}

double hcomm__cost_estimate(hcomm_comm_t *c, int coll, int algo, size_t bytes, bool shm) {
    hcomm__topo_t *t;
    if (coll < 0 || coll >= HCOMM__COLL_COUNT || hcomm__topo_get(c, &t) != HCOMM_OK)
        return INFINITY;
    model_t m;
    model_of(c, t, shm, &m);
    return estimate(&m, coll, algo, (double)bytes);
}

static hcomm__algo_set_t every;
static pthread_once_t every_once = PTHREAD_ONCE_INIT;

static void read_every(void) {
    hcomm__algo_parse("hcomm", "HCOMM_ALGO", NULL, &every);
}

/* Band b holds sizes in [2^(b-1), 2^b); it is judged at its lower bound, so the choice depends
 * only on what every rank of the call shares. The schemes' own steps (rd's 4 KiB pieces, the
 * ring's and chain's segments, a board room) fall on powers of two, as do most tensors' sizes:
 * judged at its bound, a band sees each step where it happens (docs/tuning.md: cost.bands). */
static int band_of(size_t bytes, double *rep) {
    int b = 0;
    while (b < HCOMM__CHOICE_BANDS - 1 && ((size_t)1 << b) <= bytes)
        b++;
    *rep = bytes == 0 ? 0.0 : ldexp(1.0, b - 1);
    return b;
}

static void log_choice(hcomm_comm_t *c, const model_t *m, int coll, uint32_t allowed, double S,
                       int best) {
    char line[512];
    int n = 0;
    for (int a = 0; a < HCOMM__ALGO_COUNT && n < (int)sizeof line - 40; a++)
        if (allowed & (1u << a))
            n += snprintf(line + n, sizeof line - (size_t)n, " %s=%.4g us", hcomm__algo_name(a),
                          estimate(m, coll, a, S) * 1e6);
    hcomm__log(HCOMM__LOG_DEBUG, HCOMM__SUB_ALGO,
               "rank %d: cost model for %s of about %.0f bytes on %d ranks (%d node%s):%s -> %s",
               c->rank, hcomm__coll_name(coll), S, m->p, m->t->nnodes, m->t->nnodes == 1 ? "" : "s",
               line, hcomm__algo_name(best));
}

int hcomm__cost_choose(hcomm_comm_t *c, const hcomm__algo_set_t *set, int coll, size_t bytes,
                       bool shm, double *est_s) {
    hcomm__topo_t *t;
    if (coll < 0 || coll >= HCOMM__CHOICE_COLLS || hcomm__topo_get(c, &t) != HCOMM_OK ||
        (t->nnodes == 1 && t->kind != HCOMM__TOPO_MESH && t->kind != HCOMM__TOPO_RING))
        return -1; /* one node (say, a TP group inside a declared one): the measured defaults */
    pthread_once(&every_once, read_every);
    uint32_t allowed = (set ? set : &every)->allowed[coll];
    double S;
    hcomm__choice_t *ch = &t->choice[coll][band_of(bytes, &S)];
    if (ch->algo >= 0 && ch->allowed == allowed) {
        *est_s = ch->est;
        return ch->algo;
    }
    model_t m;
    model_of(c, t, shm, &m);
    int best = -1;
    double best_est = INFINITY;
    for (int a = 0; a < HCOMM__ALGO_COUNT; a++) {
        double e = allowed & (1u << a) ? estimate(&m, coll, a, S) : INFINITY;
        if (e < best_est || (e == best_est && best == HCOMM__ALGO_NATIVE))
            best = a,
            best_est = e; /* a tie goes to hcomm's own scheme, which the model describes */
    }
    if (best < 0)
        return -1; /* nothing allowed has a model: the defaults decide */
    if (hcomm__log_on(HCOMM__LOG_DEBUG, HCOMM__SUB_ALGO))
        log_choice(c, &m, coll, allowed, S, best);
    *ch = (hcomm__choice_t){.allowed = allowed, .algo = best, .est = best_est};
    *est_s = best_est;
    return best;
}
