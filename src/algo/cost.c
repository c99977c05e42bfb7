/* Cost-model selection (see cost.h). Estimates follow the alpha-beta-gamma model of Thakur,
 * Rabenseifner & Gropp 2005 (Optimization of Collective Communication Operations in MPICH),
 * with the link class each phase crosses: flat algorithms run at the pace of the slowest link
 * in the group (each ring step waits for its slowest transfer), hierarchical ones pay the
 * inter-node class only for their inter-node phase. S is the whole vector in bytes. */
#include "algo/cost.h"

#include "core/log.h"
#include "topo/topo.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#define RING_SEGMENT ((double)(4u << 20)) /* ring.c's all_reduce segment */
#define RD_PIECE 4096.0                   /* coll.c's recursive-doubling piece */

typedef struct model {
    const hcomm__topo_t *t;
    hcomm__link_t flat, in, out; /* slowest class in the group, intra, inter */
    double gamma;                /* reduction: a rank's own memory speed */
    double hop;                  /* ring topology: mean hops of a non-neighbour message */
    int p, lg, pof2;
    bool shm;
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

static double naive_ar(const model_t *m, double S) {
    return m->hop * ((m->p - 1.0) * (m->flat.alpha + S * m->flat.beta) +
                     m->lg * (m->flat.alpha + S * m->flat.beta)) +
           (m->p - 1.0) * S * m->gamma;
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
    if (coll == HCOMM__COLL_ALLREDUCE) /* reduce_scatter + all_gather in both phases */
        return intra + (G - 1.0) * (m->in.alpha + share * m->in.beta) + inter +
               (N - 1.0) * (m->out.alpha + share / N * m->out.beta);
    return intra + inter + lanes + S * m->in.beta; /* + the copy into / out of lane order */
}

/* The backend's own: shared-memory transports read peers' buffers once (not over the
 * simulated links, so not a candidate there); Open MPI picks among the flat schemes as if
 * every pair were linked alike (it does not know a declared ring), and runs that one here. */
static double native(const model_t *m, int coll, double S) {
    double f = (m->p - 1.0) / m->p;
    if (m->shm)
        return m->t->simulated && m->t->nnodes > 1 ? INFINITY
               : coll == HCOMM__COLL_ALLREDUCE
                   ? 2.0 * m->in.alpha + 2.0 * f * S * m->in.beta + f * S * m->gamma
                   : m->in.alpha + f * S * (m->in.beta + (coll ? m->gamma : 0.0));
    if (coll == HCOMM__COLL_ALLREDUCE) {
        model_t mesh = *m;
        mesh.hop = 1.0;
        double ring = ring_ar(&mesh, S), rhd = rhd_ar(&mesh, S), rd = rd_ar(&mesh, S);
        return ring <= rhd && ring <= rd ? ring_ar(m, S) : rhd <= rd ? rhd_ar(m, S) : rd_ar(m, S);
    }
    return (m->p - 1.0) * (m->flat.alpha + S / m->p * m->flat.beta) +
           (coll == HCOMM__COLL_REDUCESCATTER ? f * S * m->gamma : 0.0);
}

/* The signature agreement before the call (coll.c): a meeting in the posted slots on
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
 * sizes the receiver learns by a probe; above the eager limit (A2A_BUNDLE_MAX) they measured
 * several times slower than pairwise (simulated 2x4, 32 KiB blocks: 1.4-1.6x; 128 KiB: 7x),
 * so the model leaves them out there. */
#define A2A_BUNDLE_MAX 65536.0

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
        if (p / 2.0 * (b + 16.0) > A2A_BUNDLE_MAX)
            return INFINITY;
        return steps * (m->flat.alpha + p / 2.0 * (b + 16.0) * m->flat.beta) +
               2.0 * p * b * m->in.beta;
    case HCOMM__ALGO_DIRECT:
        return N > 1 ? INFINITY : (p - 1.0 + steps) * m->in.alpha + (p - 1.0) * b * m->in.beta;
    case HCOMM__ALGO_HIER:
        if (G * (b + 24.0) > A2A_BUNDLE_MAX)
            return INFINITY;
        if (N > 1 && t->min_node == t->max_node)
            return (G - 1.0) * (m->in.alpha + N * (b + 24.0) * m->in.beta) +
                   (N - 1.0) * (m->out.alpha + G * (b + 24.0) * m->out.beta) +
                   3.0 * p * b * m->in.beta;
        return N < 2
                   ? INFINITY
                   : (G - 1.0) * (m->in.alpha + b * m->in.beta) +
                         2.0 * (G - 1.0) * (m->in.alpha + (N - 1.0) * G * (b + 24.0) * m->in.beta) +
                         (N - 1.0) * (m->out.alpha + G * G * (b + 24.0) * m->out.beta);
    default:
        return INFINITY;
    }
}

static double transfer(const model_t *m, int coll, int algo, double S) {
    double f = (m->p - 1.0) / m->p;
    if (coll == HCOMM__COLL_ALLTOALLV)
        return a2a(m, algo, S);
    if (algo == HCOMM__ALGO_NATIVE)
        return native(m, coll, S);
    if (algo == HCOMM__ALGO_HIER) /* on one node it is a ring without segments: leave it out */
        return m->t->nnodes > 1 ? hier(m, coll, S) : INFINITY;
    if (coll == HCOMM__COLL_ALLREDUCE)
        return algo == HCOMM__ALGO_RING    ? ring_ar(m, S)
               : algo == HCOMM__ALGO_RHD   ? rhd_ar(m, S)
               : algo == HCOMM__ALGO_RD    ? rd_ar(m, S)
               : algo == HCOMM__ALGO_NAIVE ? naive_ar(m, S)
                                           : INFINITY;
    if (algo != HCOMM__ALGO_RING)
        return INFINITY;
    double ag = (m->p - 1.0) * (m->flat.alpha + S / m->p * m->flat.beta);
    return coll == HCOMM__COLL_ALLGATHER ? ag : ag + f * S * m->gamma + S * m->in.beta;
}

static double estimate(const model_t *m, int coll, int algo, double S) {
    return agreement(m, algo) + transfer(m, coll, algo, S);
}

static void model_of(const hcomm__topo_t *t, bool shm, model_t *m) {
    m->t = t;
    m->in = t->link[HCOMM__LINK_INTRA];
    m->out = t->link[HCOMM__LINK_INTER];
    m->flat = t->nnodes > 1 ? m->out : m->in;
    m->gamma = m->in.gamma;
    m->p = t->size;
    m->pof2 = 1, m->lg = 0;
    while (m->pof2 * 2 <= m->p)
        m->pof2 *= 2, m->lg++;
    m->hop = t->kind == HCOMM__TOPO_RING && m->p > 4 ? m->p / 4.0 : 1.0;
    m->shm = shm;
}

double hcomm__cost_estimate(hcomm_comm_t *c, int coll, int algo, size_t bytes, bool shm) {
    hcomm__topo_t *t;
    if ((coll > HCOMM__COLL_REDUCESCATTER && coll != HCOMM__COLL_ALLTOALLV) ||
        hcomm__topo_get(c, &t) != HCOMM_OK)
        return INFINITY;
    model_t m;
    model_of(t, shm, &m);
    return estimate(&m, coll, algo, (double)bytes);
}

static hcomm__algo_set_t every;
static pthread_once_t every_once = PTHREAD_ONCE_INIT;

static void read_every(void) {
    hcomm__algo_parse("hcomm", "HCOMM_ALGO", NULL, &every);
}

/* Band b holds sizes in [2^(b-1), 2^b); it is judged at 1.5 * 2^(b-1), so the choice depends
 * only on what every rank of the call shares. */
static int band_of(size_t bytes, double *rep) {
    int b = 0;
    while (b < HCOMM__CHOICE_BANDS - 1 && ((size_t)1 << b) <= bytes)
        b++;
    *rep = bytes == 0 ? 0.0 : 1.5 * ldexp(1.0, b - 1);
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
               "rank %d: cost model for %s of about %.0f bytes on %d ranks (%d nodes):%s -> %s",
               c->rank, hcomm__coll_name(coll), S, m->p, m->t->nnodes, line,
               hcomm__algo_name(best));
}

int hcomm__cost_choose(hcomm_comm_t *c, const hcomm__algo_set_t *set, int coll, size_t bytes,
                       bool shm, double *est_s) {
    hcomm__topo_t *t;
    if ((coll > HCOMM__COLL_REDUCESCATTER && coll != HCOMM__COLL_ALLTOALLV) ||
        hcomm__topo_get(c, &t) != HCOMM_OK ||
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
    model_of(t, shm, &m);
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
