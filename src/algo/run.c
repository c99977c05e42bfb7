/* Running a chosen algorithm (run.h). */
#include "algo/run.h"

#include "algo/agree.h"
#include "algo/algos.h"
#include "core/env.h"

#include <stdlib.h>
#include <string.h>

static hcomm_result_t nomem(const hcomm__call_t *k) {
    return hcomm__err(HCOMM_ERR_NOMEM, k->c->call_fn, "out of memory");
}

/* counts: size entries of n each (freed by the caller), or NULL without memory. */
static size_t *equal_counts(int size, size_t n) {
    size_t *counts = malloc(sizeof(size_t) * (size_t)size);
    for (int i = 0; counts && i < size; i++)
        counts[i] = n;
    return counts;
}

/* --- reductions: AVG and half precision around every algorithm --- */

/* One reduction as its algorithm sees it: op is AVG only for f16/bf16 on the algorithms that
 * reduce those in f32 themselves (reduces_half). */
typedef struct red {
    hcomm__call_t *k;
    int algo, root;
    const void *send;
    void *recv;
    size_t in, out;       /* elements this rank passes in and gets out */
    const size_t *counts; /* reduce_scatterv: per-rank counts */
    hcomm_dtype_t dt;
    hcomm_op_t op;
} red_t;

typedef hcomm_result_t (*red_run_t)(red_t *r);

static hcomm_result_t ar_algo(red_t *r);
static hcomm_result_t rs_algo(red_t *r);
static hcomm_result_t reduce_algo(red_t *r);

/* f16/bf16 sums and products accumulate in f32 and are rounded once at the end, so no partial
 * result rounds or overflows (MAX and MIN are exact in any width). Where partial results travel
 * between ranks, the algorithm runs on a widened f32 copy (run_widened); twoshot and direct,
 * which read every input where it lies, accumulate each piece in f32 themselves (peer_reduce.c):
 * widening first doubled the bytes every peer reads and cost a pass over each vector
 * (docs/tuning.md: widen.in-place). */
static bool reduces_half(const red_t *r, red_run_t run) {
    if (r->algo == HCOMM__ALGO_TWOSHOT)
        return run == ar_algo;
    return r->algo == HCOMM__ALGO_DIRECT && (run == rs_algo || run == reduce_algo);
}

/* The widened copies kept between calls: up to this much stays (a fresh malloc of 32 MiB or
 * more faults every page each call); a larger call, which only reduce_scatter and reduce make
 * (all_reduce widens a segment at a time), frees its copies after it, so a 1 GiB bf16 bucket
 * does not pin 6 GiB of f32 for the communicator's life. */
#define WIDEN_KEEP_BYTES ((size_t)64 << 20)

/* Widens one reduction: f16/bf16 in -> f32, run, (AVG: divide), round once into recv. The f32
 * copies live in the communicator's scratch for widening: the algorithm's own scratch may move
 * while it runs. */
static hcomm_result_t run_widened(red_t *r, red_run_t run, hcomm_op_t op) {
    void *at_out;
    float *win = hcomm__scratch_two(&r->k->a->widened, r->in * 4, r->out * 4, &at_out),
          *wout = at_out;
    hcomm_result_t res = HCOMM_OK;
    if (!win)
        res = hcomm__err(HCOMM_ERR_NOMEM, r->k->c->call_fn, "cannot allocate %zu bytes",
                         (r->in + r->out) * 4);
    if (res == HCOMM_OK) {
        hcomm__widen(win, r->send, r->in, r->dt);
        red_t w = {r->k, r->algo, r->root, win, wout, r->in, r->out, r->counts, HCOMM_F32, r->op};
        res = run(&w);
    }
    if (res == HCOMM_OK && op == HCOMM_AVG) /* divide before rounding: the mean fits */
        hcomm__scale_div(wout, r->out, HCOMM_F32, r->k->c->size);
    if (res == HCOMM_OK)
        hcomm__narrow(r->recv, wout, r->out, r->dt);
    hcomm__scratch_trim(&r->k->a->widened, WIDEN_KEEP_BYTES);
    return res;
}

/* An all_reduce is elementwise, so its widened copy is made a segment at a time: the scratch
 * stays 2 x WIDEN_SEGMENT f32 however large the tensor (a 1 GiB bf16 gradient would otherwise
 * need 4 GiB more). A zero count still runs once: rd checks the signature in its exchange. */
#define WIDEN_SEGMENT ((size_t)1 << 20)

static hcomm_result_t run_widened_segments(red_t *r, red_run_t run, hcomm_op_t op) {
    size_t es = hcomm__dtype_size(r->dt), done = 0;
    hcomm_result_t res;
    do {
        size_t n = r->in - done < WIDEN_SEGMENT ? r->in - done : WIDEN_SEGMENT;
        red_t seg = *r;
        seg.send = (const char *)r->send + done * es;
        seg.recv = (char *)r->recv + done * es;
        seg.in = seg.out = n;
        res = run_widened(&seg, run, op);
        done += n;
    } while (res == HCOMM_OK && done < r->in);
    return res;
}

static hcomm_result_t run_reduction(red_t *r, red_run_t run) {
    hcomm_op_t op = r->op;
    if (hcomm__sums_in_f32(r->dt, op) && reduces_half(r, run))
        return run(r); /* AVG too: it divides before rounding */
    r->op = op == HCOMM_AVG ? HCOMM_SUM : op;
    if (hcomm__sums_in_f32(r->dt, op))
        return run == ar_algo ? run_widened_segments(r, run, op) : run_widened(r, run, op);
    HCOMM__TRY(run(r));
    if (op == HCOMM_AVG)
        hcomm__scale_div(r->recv, r->out, r->dt, r->k->c->size);
    return HCOMM_OK;
}

static red_t red_of(hcomm__call_t *k, int algo, const hcomm__args_t *a) {
    return (red_t){k, algo, a->root, a->send, a->recv, a->in, a->out, a->counts, a->dt, a->op};
}

/* The in-place algorithms (ring, rhd, naive) work on recv: a copy of send first. */
static void copy_in(const red_t *r) {
    size_t bytes = r->in * hcomm__dtype_size(r->dt);
    if (r->send != r->recv && bytes)
        memcpy(r->recv, r->send, bytes);
}

static hcomm_result_t ar_algo(red_t *r) {
    hcomm_comm_t *c = r->k->c;
    hcomm__xfer_t x = hcomm__call_xfer(r->k);
    if (r->algo & HCOMM__ALGO_DET) {
        copy_in(r);
        return hcomm__ar_det(&x, r->algo, r->recv, r->in, r->dt, r->op);
    }
    switch (r->algo) {
    case HCOMM__ALGO_NATIVE: /* agreed already */
        return c->tr->native->all_reduce(c, r->send, r->recv, r->in, r->dt, r->op);
    case HCOMM__ALGO_RD:
        return hcomm__ar_rd(&x, r->send, r->recv, r->in, r->dt, r->op);
    case HCOMM__ALGO_TWOSHOT:
        return hcomm__ar_twoshot(&x, r->send, r->recv, r->in, r->dt, r->op);
    case HCOMM__ALGO_HIER:
        return hcomm__ar_hier(&x, r->send, r->recv, r->in, r->dt, r->op);
    case HCOMM__ALGO_RING:
        copy_in(r);
        return hcomm__ar_ring(&x, r->recv, r->in, r->dt, r->op);
    case HCOMM__ALGO_RHD:
        copy_in(r);
        return hcomm__ar_rhd(&x, r->recv, r->in, r->dt, r->op);
    default:
        copy_in(r);
        return hcomm__ar_naive(&x, r->recv, r->in, r->dt, r->op);
    }
}

/* reduce_scatterv by algorithm: ring, rhd's halving, or the deterministic form. */
static hcomm_result_t rsv_algo(const hcomm__xfer_t *x, const red_t *r, const size_t *counts) {
    if (r->algo & HCOMM__ALGO_DET)
        return hcomm__rsv_det(x, r->send, r->recv, counts, r->dt, r->op);
    if (r->algo == HCOMM__ALGO_RHD)
        return hcomm__rsv_rh(x, r->send, r->recv, counts, r->dt, r->op);
    return hcomm__rsv_ring(x, r->send, r->recv, counts, r->dt, r->op);
}

static hcomm_result_t rs_algo(red_t *r) {
    hcomm_comm_t *c = r->k->c;
    if (r->algo == HCOMM__ALGO_NATIVE) /* agreed already */
        return c->tr->native->reduce_scatter(c, r->send, r->recv, r->out, r->dt, r->op);
    hcomm__xfer_t x = hcomm__call_xfer(r->k);
    if (r->counts && r->algo == HCOMM__ALGO_DIRECT)
        return hcomm__rsv_direct(&x, r->send, r->recv, r->counts, r->dt, r->op);
    if (r->counts)
        return rsv_algo(&x, r, r->counts);
    if (hcomm__on_pair_lane(r->k, r->algo))
        return hcomm__pair_reduce_scatter(&x, r->send, r->recv, r->out, r->dt, r->op);
    if (r->algo == HCOMM__ALGO_RD) /* not deterministic: that flag runs below */
        return hcomm__rs_rd(&x, r->send, r->recv, r->out, r->dt, r->op);
    if (r->algo == HCOMM__ALGO_DIRECT)
        return hcomm__rs_direct(&x, r->send, r->recv, r->out, r->dt, r->op);
    if (r->algo == HCOMM__ALGO_HIER)
        return hcomm__rs_hier(&x, r->send, r->recv, r->out, r->dt, r->op);
    size_t *counts = equal_counts(c->size, r->out);
    if (!counts)
        return nomem(r->k);
    hcomm_result_t res = rsv_algo(&x, r, counts);
    free(counts);
    return res;
}

/* The tree reduces in place: on the root in recv, elsewhere in a copy of send; the copy and
 * the receive space live in the communicator's scratch, kept between calls (a fresh 32 MiB+
 * malloc faults). */
static hcomm_result_t reduce_tree(red_t *r, const hcomm__xfer_t *x) {
    size_t bytes = r->in * hcomm__dtype_size(r->dt);
    void *tmp, *buf = r->recv;
    if (r->k->c->rank == r->root)
        tmp = hcomm__x_scratch(x, bytes);
    else
        hcomm__x_scratch_pair(x, bytes, bytes, &tmp, &buf);
    if (!tmp)
        return nomem(r->k);
    if (buf != r->send && bytes)
        memcpy(buf, r->send, bytes);
    return hcomm__reduce_tree(x, buf, tmp, r->in, r->dt, r->op, r->root);
}

static hcomm_result_t reduce_algo(red_t *r) {
    hcomm_comm_t *c = r->k->c;
    hcomm__xfer_t x = hcomm__call_xfer(r->k);
    if (r->algo & HCOMM__ALGO_DET)
        return hcomm__reduce_det(&x, r->send, r->recv, r->in, r->dt, r->op, r->root);
    if (r->algo == HCOMM__ALGO_NATIVE) /* agreed already */
        return c->tr->native->reduce(c, r->send, r->recv, r->in, r->dt, r->op, r->root);
    if (r->algo == HCOMM__ALGO_RHD)
        return hcomm__reduce_rhd(&x, r->send, r->recv, r->in, r->dt, r->op, r->root);
    if (r->algo == HCOMM__ALGO_DIRECT)
        return hcomm__reduce_direct(&x, r->send, r->recv, r->in, r->dt, r->op, r->root);
    return reduce_tree(r, &x);
}

hcomm_result_t hcomm__run_all_reduce(hcomm__call_t *k, int algo, const hcomm__args_t *a) {
    red_t r = red_of(k, algo, a);
    return run_reduction(&r, ar_algo);
}

hcomm_result_t hcomm__run_reduce_scatter(hcomm__call_t *k, int algo, const hcomm__args_t *a) {
    red_t r = red_of(k, algo, a);
    return run_reduction(&r, rs_algo);
}

hcomm_result_t hcomm__run_reduce(hcomm__call_t *k, int algo, const hcomm__args_t *a) {
    red_t r = red_of(k, algo, a);
    return run_reduction(&r, reduce_algo);
}

/* --- moves --- */

/* Direct all_gather lets its peers load this rank's block from send, which the rank's own copy
 * into recv then does not delay (and which stays in the readers' caches while the caller leaves
 * it unchanged), unless only recv lies in memory the peers map (the transport's mem_kind: every
 * buffer of local's threads, hcomm_mem_alloc's on mpi; docs/tuning.md: ag.reads-send). */
static bool ag_reads_send(hcomm_comm_t *c, const void *send, const char *mine) {
    return c->tr->mem_kind(c, send) == HCOMM__MEM_SHARED ||
           c->tr->mem_kind(c, mine) != HCOMM__MEM_SHARED;
}

/* all_gather's algorithms that take this rank's block in place in recv. */
static hcomm_result_t ag_in_place(hcomm__call_t *k, const hcomm__xfer_t *x, int algo, void *recv,
                                  size_t bytes) {
    hcomm_comm_t *c = k->c;
    if (algo == HCOMM__ALGO_DIRECT)
        return hcomm__ag_direct(x, (char *)recv + (size_t)c->rank * bytes, recv, bytes);
    if (algo == HCOMM__ALGO_HIER)
        return hcomm__ag_hier(x, recv, bytes);
    size_t *each = equal_counts(c->size, bytes);
    hcomm_result_t res = each ? hcomm__agv_run(x, algo, recv, each) : nomem(k);
    free(each);
    return res;
}

hcomm_result_t hcomm__run_all_gather(hcomm__call_t *k, int algo, const hcomm__args_t *a) {
    hcomm_comm_t *c = k->c;
    hcomm__xfer_t x = hcomm__call_xfer(k);
    if (hcomm__on_pair_lane(k, algo))
        return hcomm__pair_all_gather(&x, a->send, a->recv, a->in);
    if (hcomm__ag_whole_on_lane(k, algo))
        return hcomm__ag_rd_whole(&x, a->send, a->recv, a->in);
    if (algo == HCOMM__ALGO_NATIVE) /* agreed already */
        return c->tr->native->all_gather(c, a->send, a->recv, a->in);
    char *mine = (char *)a->recv + (size_t)c->rank * a->in;
    if (algo == HCOMM__ALGO_DIRECT && ag_reads_send(c, a->send, mine))
        return hcomm__ag_direct(&x, a->send, a->recv, a->in);
    if (mine != a->send && a->in)
        memcpy(mine, a->send, a->in);
    return ag_in_place(k, &x, algo, a->recv, a->in);
}

hcomm_result_t hcomm__run_all_gatherv(hcomm__call_t *k, int algo, const hcomm__args_t *a) {
    hcomm__xfer_t x = hcomm__call_xfer(k);
    if (algo == HCOMM__ALGO_DIRECT)
        return hcomm__agv_direct(&x, a->send, a->recv, a->counts);
    size_t off = 0, own = a->counts[k->c->rank];
    for (int r = 0; r < k->c->rank; r++)
        off += a->counts[r];
    if ((char *)a->recv + off != a->send && own)
        memcpy((char *)a->recv + off, a->send, own);
    return hcomm__agv_run(&x, algo, a->recv, a->counts);
}

hcomm_result_t hcomm__run_broadcast(hcomm__call_t *k, int algo, const hcomm__args_t *a) {
    hcomm_comm_t *c = k->c;
    hcomm__xfer_t x = hcomm__call_xfer(k);
    if (hcomm__on_pair_lane(k, algo))
        return hcomm__pair_broadcast(&x, a->recv, a->in, a->root,
                                     hcomm__check_mode() != HCOMM__CHECK_OFF);
    switch (algo) {
    case HCOMM__ALGO_NATIVE: /* agreed already */
        return c->tr->native->broadcast(c, a->recv, a->in, a->root);
    case HCOMM__ALGO_RD:
        return hcomm__bc_rd(&x, a->recv, a->in, a->root);
    case HCOMM__ALGO_CHAIN:
        return hcomm__bc_chain(&x, a->recv, a->in, a->root);
    case HCOMM__ALGO_SCATTER_ALLGATHER:
        return hcomm__bc_scatter_allgather(&x, a->recv, a->in, a->root);
    case HCOMM__ALGO_DIRECT:
        return hcomm__bc_direct(&x, a->recv, a->in, a->root);
    default:
        return hcomm__bc_tree(&x, a->recv, a->in, a->root);
    }
}

/* The root's own block of a gather or scatter: a local copy. */
static void root_block(hcomm__call_t *k, bool gather, const hcomm__args_t *a) {
    if (k->c->rank != a->root || !a->in)
        return;
    char *dst = gather ? (char *)a->recv + (size_t)a->root * a->in : a->recv;
    const char *src = gather ? a->send : (const char *)a->send + (size_t)a->root * a->in;
    if (dst != src)
        memcpy(dst, src, a->in);
}

/* gather or scatter after the agreement: the native call moves the root's block too; hcomm's
 * own leave it to a local copy. */
static hcomm_result_t run_rooted(hcomm__call_t *k, int algo, const hcomm__args_t *a, bool gather) {
    hcomm_comm_t *c = k->c;
    const hcomm__native_ops_t *n = c->tr->native;
    if (algo == HCOMM__ALGO_NATIVE) /* agreed already */
        return gather ? n->gather(c, a->send, a->recv, a->in, a->root)
                      : n->scatter(c, a->send, a->recv, a->in, a->root);
    root_block(k, gather, a);
    hcomm__xfer_t x = hcomm__call_xfer(k);
    bool tree = algo == HCOMM__ALGO_TREE;
    if (gather)
        return tree ? hcomm__gather_tree(&x, a->send, a->recv, a->in, a->root)
                    : hcomm__gather_direct(&x, a->send, a->recv, a->in, a->root);
    return tree ? hcomm__scatter_tree(&x, a->send, a->recv, a->in, a->root)
                : hcomm__scatter_direct(&x, a->send, a->recv, a->in, a->root);
}

hcomm_result_t hcomm__run_gather(hcomm__call_t *k, int algo, const hcomm__args_t *a) {
    return run_rooted(k, algo, a, true);
}

hcomm_result_t hcomm__run_scatter(hcomm__call_t *k, int algo, const hcomm__args_t *a) {
    return run_rooted(k, algo, a, false);
}

/* --- the meeting forms: each checks the call in its meetings, before anything moves --- */

hcomm_result_t hcomm__meet_all_reduce(hcomm__call_t *k, int algo, const hcomm__args_t *a) {
    (void)algo; /* AVG and halves in one pass */
    hcomm__xfer_t x = hcomm__call_xfer(k);
    return hcomm__ar_shm(&x, a->send, a->recv, a->in, a->dt, a->op);
}

hcomm_result_t hcomm__meet_reduce_scatter(hcomm__call_t *k, int algo, const hcomm__args_t *a) {
    (void)algo;
    hcomm__xfer_t x = hcomm__call_xfer(k);
    if (a->counts)
        return hcomm__rsv_shm(&x, a->send, a->recv, a->counts, a->dt, a->op);
    return hcomm__rs_shm(&x, a->send, a->recv, a->out, a->dt, a->op);
}

hcomm_result_t hcomm__meet_reduce(hcomm__call_t *k, int algo, const hcomm__args_t *a) {
    (void)algo;
    hcomm__xfer_t x = hcomm__call_xfer(k);
    return hcomm__reduce_shm(&x, a->send, a->recv, a->in, a->dt, a->op, a->root);
}

hcomm_result_t hcomm__meet_all_gather(hcomm__call_t *k, int algo, const hcomm__args_t *a) {
    (void)algo;
    hcomm__xfer_t x = hcomm__call_xfer(k);
    return hcomm__ag_shm(&x, a->send, a->recv, a->in);
}

hcomm_result_t hcomm__meet_all_gatherv(hcomm__call_t *k, int algo, const hcomm__args_t *a) {
    (void)algo;
    hcomm__xfer_t x = hcomm__call_xfer(k);
    return hcomm__agv_shm(&x, a->send, a->recv, a->counts);
}

hcomm_result_t hcomm__meet_broadcast(hcomm__call_t *k, int algo, const hcomm__args_t *a) {
    hcomm__xfer_t x = hcomm__call_xfer(k);
    if (algo == HCOMM__ALGO_SHM)
        return hcomm__bc_shm(&x, a->recv, a->in, a->root);
    return hcomm__bc_board_direct(&x, a->recv, a->in, a->root);
}

/* gather or scatter in meetings; the root's own block is a local copy. */
static hcomm_result_t meet_rooted(hcomm__call_t *k, int algo, const hcomm__args_t *a, bool gather) {
    hcomm__xfer_t x = hcomm__call_xfer(k);
    bool shm = algo == HCOMM__ALGO_SHM;
    if (gather)
        HCOMM__TRY(shm ? hcomm__gather_shm(&x, a->send, a->recv, a->in, a->root)
                       : hcomm__gather_board_direct(&x, a->send, a->recv, a->in, a->root));
    else
        HCOMM__TRY(shm ? hcomm__scatter_shm(&x, a->send, a->recv, a->in, a->root)
                       : hcomm__scatter_board_direct(&x, a->send, a->recv, a->in, a->root));
    root_block(k, gather, a);
    return HCOMM_OK;
}

hcomm_result_t hcomm__meet_gather(hcomm__call_t *k, int algo, const hcomm__args_t *a) {
    return meet_rooted(k, algo, a, true);
}

hcomm_result_t hcomm__meet_scatter(hcomm__call_t *k, int algo, const hcomm__args_t *a) {
    return meet_rooted(k, algo, a, false);
}
