/* Call kinds: pipeline-parallel point-to-point (pp.h). Only the two ranks of a transfer call;
 * a rank's invalid PP call is made on its own (it must fail locally, with no peer waiting). */
#include "fuzz.h"

#include <limits.h>
#include <string.h>

/* An agreed tensor: dtype, up to 3 dims, sometimes past the eager limit. */
typedef struct ppt {
    hcomm_dtype_t dt;
    int ndim;
    int64_t shape[3];
    size_t numel;
} ppt_t;

static ppt_t draw_tensor(fz_t *f) {
    ppt_t t = {.dt = fz_dtype(&f->ag), .ndim = (int)fz_below(&f->ag, 4), .numel = 1};
    int big = fz_chance(&f->ag, 15);
    for (int d = 0; d < t.ndim; d++) {
        t.shape[d] = big && d == 0 ? 3000 : (int64_t)fz_below(&f->ag, 6);
        t.numel *= (size_t)t.shape[d];
    }
    return t;
}

static void make(fz_t *f, const ppt_t *t, hcomm_tensor_t *x, int fill_from) {
    void *data = fz_alloc(f, t->numel * fz_dsize(t->dt), 0);
    hcomm_tensor_init(x, data, t->dt, t->ndim, t->shape);
    for (size_t i = 0; i < t->numel; i++)
        fz_put(t->dt, data, i, fill_from >= 0 ? fz_val(f, fill_from, 70, i, 50) : 99);
}

static long wrong_elems(const fz_t *f, const ppt_t *t, const void *data, int from) {
    long wrong = 0;
    for (size_t i = 0; i < t->numel; i++)
        wrong += fz_get(t->dt, data, i) != fz_val(f, from, 70, i, 50);
    return wrong;
}

static void send_side(fz_t *f, int variant, const hcomm_tensor_t *x, int to, int tag) {
    hcomm_result_t r;
    hcomm_pp_req_t *req = NULL;
    if (variant == 1) {
        r = hcomm_pp_isend(f->comm, x, to, tag, &req);
        if (r == HCOMM_OK)
            r = hcomm_pp_wait(req);
    } else if (variant == 4)
        r = hcomm_pp_send_recv(f->comm, x, to, tag, NULL, -1, 0);
    else if (variant == 5) {
        hcomm_pp_group_start(f->comm);
        hcomm_pp_isend(f->comm, x, to, tag, &req);
        r = hcomm_pp_group_end(f->comm);
    } else
        r = hcomm_pp_send(f->comm, x, to, tag);
    fz_check(f, "hcomm_pp_send|hcomm_pp_isend|hcomm_pp_wait|hcomm_pp_send_recv|hcomm_pp_group_end",
             r, FZ_EXPECT_ANY); /* a send whose receiver expects another shape may fail */
}

/* recv_any's tensor is compared with the expected one here; *differs tells the caller. */
static hcomm_result_t recv_side(fz_t *f, int variant, hcomm_tensor_t *x, int from, int tag,
                                int *differs) {
    hcomm_pp_req_t *req = NULL;
    hcomm_tensor_t desc, any;
    hcomm_result_t r;
    if (variant == 1 && (r = hcomm_pp_irecv(f->comm, x, from, tag, &req)) == HCOMM_OK)
        return hcomm_pp_wait(req);
    if (variant == 2 && (r = hcomm_pp_probe(f->comm, from, tag, &desc)) != HCOMM_OK)
        return r;
    if (variant == 3) {
        if ((r = hcomm_pp_recv_any(f->comm, from, tag, &any)) != HCOMM_OK)
            return r;
        /* compared against the expected descriptor as a receive would be */
        int same = any.dtype == x->dtype && any.ndim == x->ndim &&
                   !memcmp(any.shape, x->shape, sizeof(int64_t) * (size_t)x->ndim);
        size_t bytes = 0;
        hcomm_tensor_numel(&any, &bytes);
        if (same && bytes)
            memcpy(x->data, any.data, bytes * fz_dsize(x->dtype));
        hcomm_mem_free(any.data);
        *differs = !same;
        return HCOMM_OK;
    }
    if (variant == 4)
        return hcomm_pp_send_recv(f->comm, NULL, -1, 0, x, from, tag);
    if (variant == 5) {
        hcomm_pp_group_start(f->comm);
        hcomm_pp_irecv(f->comm, x, from, tag, &req);
        return hcomm_pp_group_end(f->comm);
    }
    return hcomm_pp_recv(f->comm, x, from, tag);
}

static void k_pp_pair(fz_t *f) {
    if (f->size < 2)
        return;
    int s = (int)fz_below(&f->ag, (uint64_t)f->size);
    int t = (s + 1 + (int)fz_below(&f->ag, (uint64_t)f->size - 1)) % f->size;
    int variant = (int)fz_below(&f->ag, 6), tag = (int)(f->idx % 1000) + 10;
    ppt_t sent = draw_tensor(f), want = sent;
    int mismatch = fz_chance(&f->ag, 15);
    if (mismatch)
        want.shape[0] = want.ndim ? want.shape[0] + 1 : 0, want.ndim = want.ndim ? want.ndim : 1,
        want.numel = want.numel / (size_t)(sent.ndim && sent.shape[0] ? sent.shape[0] : 1) *
                     (size_t)want.shape[0];
    fz_describe(f, "pp transfer %d -> %d variant %d, dtype %d ndim %d numel %zu, mismatch %d", s, t,
                variant, sent.dt, sent.ndim, sent.numel, mismatch);
    hcomm_tensor_t x;
    if (f->rank == s) {
        make(f, &sent, &x, f->wrank);
        send_side(f, variant, &x, t, tag);
    } else if (f->rank == t) {
        make(f, &want, &x, -1);
        int differs = 0;
        hcomm_result_t r = recv_side(f, variant, &x, s, tag, &differs);
        const char *names = "hcomm_pp_recv|hcomm_pp_irecv|hcomm_pp_wait|hcomm_pp_probe|"
                            "hcomm_pp_recv_any|hcomm_pp_send_recv|hcomm_pp_group_end";
        if (fz_check(f, names, r, mismatch && variant != 3 ? FZ_EXPECT_ERR : FZ_EXPECT_OK) &&
            !mismatch)
            fz_check_data(f, "hcomm_pp_recv",
                          differs ? 1 : wrong_elems(f, &sent, x.data, f->members[s]),
                          "against the sender's tensor");
        if (variant == 3 && mismatch && !differs)
            fz_finding(
                f, "hcomm_pp_recv_any: got the expected descriptor of a tensor sent with another");
    }
}

/* Up to 150 small messages in a row: a send that returned must be receivable without any
 * further call by its sender (the sender goes on to the fuzzer's exchange on another
 * communicator). */
static void k_pp_burst(fz_t *f) {
    if (f->size < 2)
        return;
    int s = (int)fz_below(&f->ag, (uint64_t)f->size), t = (s + 1) % f->size;
    int n = 1 + (int)fz_below(&f->ag, 150), tag = (int)(f->idx % 1000) + 10;
    fz_describe(f, "pp burst of %d messages %d -> %d", n, s, t);
    int32_t v;
    hcomm_tensor_t x;
    hcomm_tensor_init(&x, &v, HCOMM_I32, 1, (int64_t[]){1});
    for (int i = 0; i < n && !f->finding; i++) {
        v = i;
        if (f->rank == s)
            fz_check(f, "hcomm_pp_send", hcomm_pp_send(f->comm, &x, t, tag), FZ_EXPECT_OK);
        else if (f->rank == t &&
                 fz_check(f, "hcomm_pp_recv", hcomm_pp_recv(f->comm, &x, s, tag), FZ_EXPECT_OK))
            fz_check_data(f, "hcomm_pp_recv", v != i, "the burst's messages in order");
    }
}

/* One invalid PP call by every rank on its own: each must fail at once, naming itself. */
static void k_pp_bad(fz_t *f) {
    fz_rng_t r = fz_rank_rng(f, f->wrank, 80);
    int32_t v[4] = {0};
    hcomm_tensor_t x;
    hcomm_tensor_init(&x, v, HCOMM_I32, 1, (int64_t[]){4});
    int peer = (f->rank + 1) % f->size, tag = 5, what = (int)fz_below(&r, 8);
    if (what == 0)
        peer = (int)fz_below(&r, 2) ? -1 - (int)fz_below(&r, 5) : f->size + (int)fz_below(&r, 3);
    else if (what == 1)
        peer = f->rank; /* self */
    else if (what == 2)
        tag = fz_below(&r, 2) ? -1 : HCOMM_PP_TAG_MAX + 1;
    else if (what == 3)
        x.dtype = (hcomm_dtype_t)(fz_below(&r, 2) ? -1 : HCOMM_DTYPE_COUNT);
    else if (what == 4)
        x.ndim = fz_below(&r, 2) ? -1 : HCOMM_MAX_DIMS + 1;
    else if (what == 5)
        x.shape[0] = -3;
    else if (what == 6)
        x.data = NULL;
    fz_describe(f, "invalid pp call %d (peer %d tag %d)", what, peer, tag);
    hcomm_pp_req_t *req = NULL;
    if (what == 7) {
        fz_check(f, "hcomm_pp_group_end", hcomm_pp_group_end(f->comm), FZ_EXPECT_ERR);
        fz_check(f, "hcomm_pp_wait_all", hcomm_pp_wait_all(NULL, 3), FZ_EXPECT_ERR);
        fz_check(f, "hcomm_pp_wait_all", hcomm_pp_wait_all(&req, -1), FZ_EXPECT_ERR);
    } else if (fz_below(&r, 2))
        fz_check(f, "hcomm_pp_send", hcomm_pp_send(f->comm, &x, peer, tag), FZ_EXPECT_ERR);
    else
        fz_check(f, "hcomm_pp_irecv", hcomm_pp_irecv(f->comm, &x, peer, tag, &req), FZ_EXPECT_ERR);
}

const fz_kind_t fz_pp_kinds[] = {
    {"pp_pair", 6, k_pp_pair},
    {"pp_burst", 2, k_pp_burst},
    {"pp_bad", 2, k_pp_bad},
};
const int fz_pp_nkinds = (int)(sizeof fz_pp_kinds / sizeof fz_pp_kinds[0]);
