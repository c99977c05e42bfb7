/* Signatures and the wording of a difference (sig.h). */
#include "algo/sig.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const call_names[HCOMM__CALL_KINDS] = {
    "(failed call)",   "all_reduce",
    "reduce_scatter",  "all_gather",
    "broadcast",       "all_to_allv",
    "barrier",         "split",
    "reduce",          "gather",
    "scatter",         "all_gatherv",
    "reduce_scatterv", "a nonblocking collective"};
static const char *const count_names[HCOMM__CALL_KINDS] = {
    "count", "count", "recvcount", "bytes", "bytes",       "count",       "count",
    "count", "count", "bytes",     "bytes", "total bytes", "total count", "count"};
static const char *const op_names[HCOMM_OP_COUNT] = {"sum", "prod", "max", "min", "avg"};

/* The fields of a signature in the order a difference is named. */
enum { F_CALL, F_DTYPE, F_OP, F_ROOT, F_COUNT, F_EXTRA, F_ALGO, F_DETERMINISTIC };

const char *hcomm__call_name(uint32_t kind) {
    return kind < HCOMM__CALL_KINDS ? call_names[kind] : "?";
}

const char *hcomm__op_name(int op) {
    return op >= 0 && op < HCOMM_OP_COUNT ? op_names[op] : "?";
}

const char *hcomm__call_count_name(uint32_t kind) {
    return kind < HCOMM__CALL_KINDS ? count_names[kind] : "count";
}

static hcomm__sig_t sig_of_posted(const hcomm__posted_sig_t *p) {
    return (hcomm__sig_t){.call = (uint32_t)p->words[0],
                          .dtype = (int32_t)(uint32_t)p->words[1],
                          .op = (int32_t)(p->words[1] >> 32),
                          .root = (int32_t)p->words[2],
                          .count = p->words[3],
                          .extra = p->words[4],
                          .algo = (int32_t)(p->words[0] >> 32)};
}

/* What a v-call's per-rank array holds ("bytes", "counts"); NULL for other calls. */
static const char *vcall_unit(uint32_t call) {
    return call == HCOMM__CALL_ALL_GATHERV       ? "bytes"
           : call == HCOMM__CALL_REDUCE_SCATTERV ? "counts"
                                                 : NULL;
}

static void extra_field_text(const hcomm__sig_t *s, char *buf, size_t n, const char *extra) {
    if (extra && extra[0])
        snprintf(buf, n, "%s", extra);
    else if (vcall_unit(s->call))
        snprintf(buf, n, "other per-rank %s with the same total", vcall_unit(s->call));
    else
        snprintf(buf, n, "a different tensor list");
}

static void field_text(const hcomm__sig_t *s, int field, char *buf, size_t n, const char *extra) {
    const char *dname = "?";
    switch (field) {
    case F_CALL:
        snprintf(buf, n, "%s", hcomm__call_name(s->call));
        break;
    case F_DTYPE:
        hcomm_dtype_name((hcomm_dtype_t)s->dtype, &dname);
        snprintf(buf, n, "dtype=%s", dname);
        break;
    case F_OP:
        snprintf(buf, n, "op=%s", s->op >= 0 && s->op < HCOMM_OP_COUNT ? op_names[s->op] : "?");
        break;
    case F_ROOT:
        snprintf(buf, n, "root=%d", s->root);
        break;
    case F_COUNT:
        snprintf(buf, n, "%s=%llu", hcomm__call_count_name(s->call), (unsigned long long)s->count);
        break;
    case F_EXTRA:
        extra_field_text(s, buf, n, extra);
        break;
    case F_ALGO:
        snprintf(buf, n, "algo=%s", hcomm__algo_name(s->algo));
        break;
    default:
        snprintf(buf, n, "deterministic=%d", (s->algo & HCOMM__ALGO_DET) != 0);
        break;
    }
}

/* The first field in which a and b differ, or -1 (deterministic mode before the algorithm:
 * ranks that differ only in it chose the same algorithm). */
static int first_difference(const hcomm__sig_t *a, const hcomm__sig_t *b) {
    const bool differs[] = {
        [F_CALL] = a->call != b->call,    [F_DTYPE] = a->dtype != b->dtype,
        [F_OP] = a->op != b->op,          [F_ROOT] = a->root != b->root,
        [F_COUNT] = a->count != b->count, [F_EXTRA] = a->extra != b->extra,
    };
    if (!differs[F_CALL] && differs[F_EXTRA] && !vcall_unit(a->call))
        return F_EXTRA; /* a tensor list decides the dtype and count: name the cause */
    for (int f = F_CALL; f <= F_EXTRA; f++)
        if (differs[f])
            return f;
    if ((a->algo ^ b->algo) == HCOMM__ALGO_DET)
        return F_DETERMINISTIC;
    return a->algo != b->algo ? F_ALGO : -1;
}

/* "hcomm_x: count=8 on rank 0 but count=5 on rank 1", lower rank first so both sides agree.
 * mine_desc describes this rank's extra field; the peer's is named only as different. */
static hcomm_result_t mismatch(hcomm_comm_t *c, const hcomm__sig_t *mine, int me,
                               const hcomm__sig_t *theirs, int peer, const char *mine_desc) {
    int f = first_difference(mine, theirs), lo = me < peer ? me : peer, hi = me < peer ? peer : me;
    char a[256], b[256];
    if (f == F_EXTRA && !(mine_desc && mine_desc[0])) { /* neither side's values known here */
        char what[64] = "the tensor lists";
        if (vcall_unit(mine->call))
            snprintf(what, sizeof what, "per-rank %s (same total)", vcall_unit(mine->call));
        return hcomm__err(HCOMM_ERR_MISMATCH, c->call_fn, "%s differ between rank %d and rank %d",
                          what, lo, hi);
    }
    field_text(me < peer ? mine : theirs, f, a, sizeof a, me < peer ? mine_desc : NULL);
    field_text(me < peer ? theirs : mine, f, b, sizeof b, me < peer ? NULL : mine_desc);
    if (f == F_CALL)
        return hcomm__err(HCOMM_ERR_MISMATCH, c->call_fn, "rank %d called %s but rank %d called %s",
                          lo, a, hi, b);
    return hcomm__err(HCOMM_ERR_MISMATCH, c->call_fn, "%s on rank %d but %s on rank %d", a, lo, b,
                      hi);
}

uint64_t hcomm__sig_counts(hcomm__call_t *k, const size_t *counts) {
    uint64_t h = 0xcbf29ce484222325ull, total = 0;
    for (int i = 0; i < k->c->size; i++) {
        h = (h ^ counts[i]) * 0x100000001b3ull;
        total += counts[i];
    }
    k->sig.count = total;
    k->sig.extra = h;
    k->f->sig = k->sig;
    k->vcounts = counts;
    return total;
}

/* "counts=[3, 4, 5]" (a v-call's per-rank array of p entries) into buf (n bytes). */
static const char *vcounts_text(const hcomm__call_t *k, const size_t *v, char *buf, size_t n) {
    size_t len = (size_t)snprintf(buf, n, "%s=[", vcall_unit(k->sig.call));
    for (int r = 0; r < k->c->size && len < n - 24; r++)
        len += (size_t)snprintf(buf + len, n - len, "%s%zu", r ? ", " : "", v[r]);
    snprintf(buf + len, n - len, "%s]", len >= n - 24 ? ", ..." : "");
    return buf;
}

/* This rank's side of a differing extra field: a v-call's per-rank counts, formatted into buf
 * (n bytes) only on this error path, else what the primitive described. */
static const char *extra_text(const hcomm__call_t *k, char *buf, size_t n) {
    return k->vcounts ? vcounts_text(k, k->vcounts, buf, n) : k->a->extra_desc;
}

hcomm_result_t hcomm__sig_check(hcomm__call_t *k, int peer, const hcomm__sig_t *theirs) {
    if (first_difference(&k->sig, theirs) < 0)
        return HCOMM_OK;
    char desc[200];
    hcomm_result_t res =
        mismatch(k->c, &k->sig, k->c->rank, theirs, peer, extra_text(k, desc, sizeof desc));
    char text[512];
    snprintf(text, sizeof text, "%s", hcomm__err_detail(k->c->call_fn));
    hcomm__notify_error(k->c, k->seq, res, text);
    return hcomm__err(res, k->c->call_fn, "%s", text);
}

/* Ranks 0 and r send their per-rank arrays to every rank (the signature holds only their total
 * and digest), so that every rank names both arrays alike. Runs only on this error path, where
 * every rank reached the same verdict from the same posts; if the exchange fails, the caller
 * words it without. */
static hcomm_result_t send_vcounts(hcomm__call_t *k, const int from[2], size_t *theirs[2]) {
    hcomm_comm_t *c = k->c;
    size_t bytes = sizeof(size_t) * (size_t)c->size;
    hcomm_result_t res = hcomm__group_start(c);
    if (res != HCOMM_OK)
        return res;
    for (int i = 0; res == HCOMM_OK && i < 2; i++) {
        hcomm__req_t *req; /* completed and freed by group_end */
        if (c->rank != from[i]) {
            res = hcomm__irecv(c, HCOMM__CH_CTRL, (int)k->seq, from[i], theirs[i], bytes,
                               HCOMM__RECV_EXACT, &req);
            continue;
        }
        memcpy(theirs[i], k->vcounts, bytes);
        for (int q = 0; res == HCOMM_OK && q < c->size; q++)
            if (q != c->rank)
                res =
                    hcomm__isend(c, HCOMM__CH_CTRL, (int)k->seq, q, k->vcounts, bytes, NULL, &req);
    }
    hcomm_result_t end = hcomm__group_end(c);
    return res != HCOMM_OK ? res : end;
}

static hcomm_result_t vcounts_mismatch(hcomm__call_t *k, int r) {
    size_t bytes = sizeof(size_t) * (size_t)k->c->size;
    size_t *theirs[2] = {malloc(bytes), malloc(bytes)};
    int from[2] = {0, r};
    hcomm_result_t res = theirs[0] && theirs[1] ? send_vcounts(k, from, theirs) : HCOMM_ERR_NOMEM;
    if (res == HCOMM_OK) {
        char a[200], b[200];
        res = hcomm__err(HCOMM_ERR_MISMATCH, k->c->call_fn, "%s on rank 0 but %s on rank %d",
                         vcounts_text(k, theirs[0], a, sizeof a),
                         vcounts_text(k, theirs[1], b, sizeof b), r);
    } else {
        res = HCOMM_ERR_INTERNAL;
    }
    free(theirs[0]);
    free(theirs[1]);
    return res;
}

/* Rank r's posted signature, from the transport's slots or the board. */
static const hcomm__posted_sig_t *post_of(hcomm_comm_t *c, int r, bool on_board,
                                          hcomm__posted_sig_t *tmp) {
    if (!on_board)
        return c->tr->posted_sig(c, r);
    hcomm__board_peer(c, r, tmp, NULL);
    return tmp;
}

/* The message of a rank r whose post differs from rank 0's (first). */
static hcomm_result_t differs(hcomm__call_t *k, const hcomm__posted_sig_t *first,
                              const hcomm__posted_sig_t *p, int r) {
    hcomm_comm_t *c = k->c;
    hcomm__sig_t a = sig_of_posted(first), b = sig_of_posted(p);
    int f = first_difference(&a, &b); /* the totals, or the arrays' digests */
    if (k->vcounts && (f == F_COUNT || f == F_EXTRA) &&
        vcounts_mismatch(k, r) == HCOMM_ERR_MISMATCH)
        return HCOMM_ERR_MISMATCH;
    char desc[200];
    const char *mine_desc = extra_text(k, desc, sizeof desc);
    return c->rank == r ? mismatch(c, &b, r, &a, 0, mine_desc)
                        : mismatch(c, &a, 0, &b, r, c->rank == 0 ? mine_desc : NULL);
}

hcomm_result_t hcomm__sig_verdict(hcomm__call_t *k, const hcomm__posted_sig_t *mine,
                                  bool on_board) {
    hcomm_comm_t *c = k->c;
    hcomm__posted_sig_t t0, tr;
    const hcomm__posted_sig_t *first = post_of(c, 0, on_board, &t0);
    for (int r = 0; r < c->size; r++) {
        const hcomm__posted_sig_t *p = post_of(c, r, on_board, &tr);
        if (p->failed != HCOMM_OK)
            return r == c->rank ? mine->failed
                                : hcomm__err(HCOMM_ERR_PEER, c->call_fn,
                                             "rank %d failed its own checks in this call, nothing "
                                             "moved: %s",
                                             r, p->failed_text ? p->failed_text : "");
        if (memcmp(p->words, first->words, sizeof p->words) != 0)
            return differs(k, first, p, r);
    }
    return HCOMM_OK;
}

hcomm_result_t hcomm__sig_posted_verdict(hcomm__call_t *k, const hcomm__posted_sig_t *mine) {
    hcomm_result_t res = hcomm__sig_verdict(k, mine, false);
    hcomm_result_t rel = k->c->tr->posted_release(k->c);
    return res != HCOMM_OK ? res : rel;
}
