/* Call kinds: MoE top-k routing with weights (moe.h): hcomm_moe_dispatch_topk with and without
 * capacity (position drops), and plans (create, dispatch, free, pad-to-capacity too); received
 * rows go back unchanged through hcomm_moe_combine_topk, so out[t] = sum of w[t, j] * x[t] over
 * the kept slots. Per-rank mistakes: an expert id out of range, k < 1, NULL ids, a bad dtype,
 * another E, a weight that is not finite, expert_out with a row too many, more tokens than the
 * plan's maximum. */
#include "cargs.h"

#include <math.h>
#include <string.h>

enum { MT = 8, MK = 3 }; /* a plan's max_tokens_per_rank is MT; a mistake passes MT + 1 */

typedef struct mt {
    int E, H, k, T, tmax, pad;
    hcomm_dtype_t dt;
    double cf; /* capacity factor, 0: dropless */
    int32_t ids[(MT + 1) * MK];
    float w[(MT + 1) * MK];
    int bad_id, bad_k, null_ids, bad_dt, bad_e, bad_w, bad_rows, bad_t;
} mt_t;

/* The agreed routing parameters; k <= E so a token's experts can be distinct. */
static mt_t mt_agreed(fz_t *f, int plan) {
    static const hcomm_dtype_t fl[] = {HCOMM_F32, HCOMM_F64, HCOMM_F16, HCOMM_BF16};
    mt_t m = {.E = f->size * (1 + (int)fz_below(&f->ag, 3)), .H = 1 + (int)fz_below(&f->ag, 4)};
    m.k = 1 + (int)fz_below(&f->ag, (uint64_t)(m.E < MK ? m.E : MK));
    m.dt = fl[fz_below(&f->ag, 4)];
    m.cf = fz_chance(&f->ag, 40) ? 0.25 * (double)(1 + fz_below(&f->ag, 6)) : 0;
    m.pad = plan && m.cf > 0 && fz_chance(&f->ag, 40);
    m.tmax = MT;
    return m;
}

/* Rank wrank's tokens' routing and its mistake (one of fz_mut_t's, as the header says). */
static mt_t mt_for(const fz_t *f, const mt_t *ag, int wrank, int plan) {
    mt_t m = *ag;
    fz_rng_t r = fz_rank_rng(f, wrank, 140);
    unsigned takes = FZ_TAKES(FZ_MUT_ROOT) | FZ_TAKES(FZ_MUT_COUNT) | FZ_TAKES(FZ_MUT_NULL) |
                     FZ_TAKES(FZ_MUT_DTYPE) | FZ_TAKES(FZ_MUT_HUGE) | FZ_TAKES(FZ_MUT_OP);
    fz_mut_t mu = fz_mutation(f, wrank, takes);
    m.bad_t = mu == FZ_MUT_HUGE && plan;
    m.T = m.bad_t ? MT + 1 : (int)fz_below(&r, MT + 1);
    for (int t = 0; t < m.T; t++)
        for (int j = 0; j < m.k; j++) {
            int e = (int)fz_below(&r, (uint64_t)m.E), again = 1;
            while (again) /* distinct experts per token */
                for (int i = again = 0; i < j; i++)
                    again |= m.ids[t * m.k + i] == e ? (e = (e + 1) % m.E, 1) : 0;
            m.ids[t * m.k + j] = fz_chance(&r, 15) ? -1 : e;
            m.w[t * m.k + j] = (float)(0.5 * (double)(1 << fz_below(&r, 3)));
        }
    int slot = m.T ? (int)fz_below(&r, (uint64_t)(m.T * m.k)) : -1;
    m.bad_id = mu == FZ_MUT_ROOT && slot >= 0;
    if (m.bad_id)
        m.ids[slot] = fz_chance(&r, 50) ? m.E : -2;
    m.bad_k = mu == FZ_MUT_COUNT && fz_chance(&r, 50);
    m.bad_rows = mu == FZ_MUT_COUNT && !m.bad_k;
    m.null_ids = mu == FZ_MUT_NULL && m.T;
    m.bad_dt = mu == FZ_MUT_DTYPE;
    m.bad_e = mu == FZ_MUT_HUGE && !plan && f->size > 1; /* E + 1: no multiple of the size */
    m.bad_w = mu == FZ_MUT_OP && slot >= 0 && m.ids[slot] >= 0;
    if (m.bad_w)
        m.w[slot] = NAN;
    return m;
}

static int mt_bad(const mt_t *m) {
    return m->bad_id || m->bad_k || m->null_ids || m->bad_dt || m->bad_e || m->bad_w || m->bad_t;
}

/* Slots per expert and source rank kept (position order) under capacity cap (< 0: all). */
static void mt_kept(const mt_t *m, int cap, unsigned char *keep) {
    int used[FZ_MAX_RANKS * 3 + 1] = {0};
    for (int s = 0; s < m->T * m->k; s++)
        keep[s] = m->ids[s] >= 0 && (cap < 0 || used[m->ids[s]]++ < cap);
}

/* min(ceil(T_max * k / E * cf), T_max * k), or -1 when dropless (moe.h). */
static int mt_cap(const mt_t *m, int tmax) {
    if (m->cf <= 0)
        return -1;
    double c = ceil((double)tmax * m->k / m->E * m->cf);
    return c < tmax * m->k ? (int)c : tmax * m->k;
}

static double mt_x(const fz_t *f, int wrank, int t, int h) {
    return fz_val(f, wrank, 141, (size_t)t * 16 + (size_t)h, 8);
}

/* Rows this rank must receive: kept slots to its experts from every member (pad: all fixed). */
static int64_t mt_rows(const fz_t *f, const mt_t *ag, int plan, int cap) {
    int per = ag->E / f->size;
    if (ag->pad)
        return (int64_t)per * f->size * cap;
    int64_t rows = 0;
    unsigned char keep[(MT + 1) * MK];
    for (int p = 0; p < f->size; p++) {
        mt_t m = mt_for(f, ag, f->members[p], plan);
        mt_kept(&m, cap, keep);
        for (int s = 0; s < m.T * m.k; s++)
            rows += keep[s] && m.ids[s] / per == f->rank;
    }
    return rows;
}

/* Wrong elements of out [T, H] against sum over kept slots of w * x. */
static long mt_out_wrong(const fz_t *f, const mt_t *m, int cap, const void *out) {
    unsigned char keep[(MT + 1) * MK];
    mt_kept(m, cap, keep);
    long wrong = 0;
    for (int t = 0; t < m->T; t++)
        for (int h = 0; h < m->H; h++) {
            double want = 0;
            for (int j = 0; j < m->k; j++)
                want += keep[t * m->k + j] ? m->w[t * m->k + j] * mt_x(f, f->wrank, t, h) : 0;
            wrong += fz_get(m->dt, out, (size_t)(t * m->H + h)) != want;
        }
    return wrong;
}

/* Received rows back through combine_topk unchanged (one row more where this rank errs). */
static void mt_combine(fz_t *f, const mt_t *ag, const mt_t *m, hcomm_moe_handle_t *hd, int plan,
                       int cap) {
    hcomm_tensor_t recv, eo, out;
    fz_check(f, "hcomm_moe_received", hcomm_moe_received(hd, &recv, NULL), FZ_EXPECT_OK);
    int64_t want = mt_rows(f, ag, plan, cap), rows = recv.shape[0] + m->bad_rows;
    fz_check_data(f, "hcomm_moe_dispatch_topk", recv.shape[0] != want, "rows received");
    size_t es = fz_dsize(m->dt), row = (size_t)m->H * es;
    char *eb = fz_alloc(f, (size_t)rows * row, 0), *ob = fz_alloc(f, (size_t)m->T * row, 0);
    memset(eb, 0, (size_t)rows * row);
    if (recv.shape[0] == want)
        memcpy(eb, recv.data, (size_t)recv.shape[0] * row);
    hcomm_tensor_init(&eo, eb, m->dt, 2, (int64_t[]){rows, m->H});
    hcomm_tensor_init(&out, ob, m->dt, 2, (int64_t[]){m->T, m->H});
    fz_expect_t e = FZ_EXPECT_OK;
    for (int p = 0; p < f->size; p++)
        e = mt_for(f, ag, f->members[p], plan).bad_rows ? FZ_EXPECT_ERR : e;
    hcomm_result_t r = hcomm_moe_combine_topk(hd, &eo, &out);
    if (fz_check_coll(f, "hcomm_moe_combine_topk", r, e) && e == FZ_EXPECT_OK)
        fz_check_data(f, "hcomm_moe_combine_topk", mt_out_wrong(f, m, cap, ob), "weighted sum");
}

/* Every member's dispatch mistakes fail every member; T_max for the capacity. */
static fz_expect_t mt_expect(const fz_t *f, const mt_t *ag, int plan, int *tmax) {
    fz_expect_t e = FZ_EXPECT_OK;
    *tmax = 0;
    for (int p = 0; p < f->size; p++) {
        mt_t m = mt_for(f, ag, f->members[p], plan);
        e = mt_bad(&m) ? FZ_EXPECT_ERR : e;
        *tmax = m.T > *tmax ? m.T : *tmax;
    }
    return e;
}

static void mt_tokens(fz_t *f, const mt_t *m, hcomm_tensor_t *tok) {
    void *buf = fz_alloc(f, (size_t)(m->T * m->H) * fz_dsize(m->dt), 0);
    for (int t = 0; t < m->T; t++)
        for (int h = 0; h < m->H; h++)
            fz_put(m->dt, buf, (size_t)(t * m->H + h), mt_x(f, f->wrank, t, h));
    hcomm_tensor_init(tok, buf, m->dt, 2, (int64_t[]){m->T, m->H});
    if (m->bad_dt)
        tok->dtype = (hcomm_dtype_t)fz_bad_enum(f, f->wrank, HCOMM_DTYPE_COUNT);
}

static void k_moe_topk(fz_t *f) {
    mt_t ag = mt_agreed(f, 0), m = mt_for(f, &ag, f->wrank, 0);
    int tmax;
    fz_expect_t e = mt_expect(f, &ag, 0, &tmax);
    hcomm_tensor_t tok;
    mt_tokens(f, &m, &tok);
    hcomm_moe_options_t opt = {.capacity_factor = ag.cf, .drop_policy = HCOMM_MOE_DROP_POSITION};
    fz_describe(
        f, "hcomm_moe_dispatch_topk(E=%d, H=%d, k=%d, T=%d, dtype %d, cf %g, bad %d%d%d%d%d%d)",
        m.E, m.H, m.k, m.T, m.dt, m.cf, m.bad_id, m.bad_k, m.null_ids, m.bad_dt, m.bad_e, m.bad_w);
    hcomm_moe_handle_t *hd = NULL;
    hcomm_result_t r = hcomm_moe_dispatch_topk(f->comm, &tok, m.null_ids ? NULL : m.ids, m.w,
                                               m.bad_k ? 0 : m.k, m.E + m.bad_e, &opt, &hd);
    if (fz_check_coll(f, "hcomm_moe_dispatch_topk", r, e) && e == FZ_EXPECT_OK)
        mt_combine(f, &ag, &m, hd, 0, mt_cap(&m, tmax));
    hcomm_moe_handle_free(hd);
}

/* A plan over the agreed limits (a rank's k < 1 or bad dtype fails the creation everywhere),
 * one dispatch through it, combine, free. */
static void k_moe_plan(fz_t *f) {
    mt_t ag = mt_agreed(f, 1), m = mt_for(f, &ag, f->wrank, 1);
    fz_expect_t ce = FZ_EXPECT_OK;
    for (int p = 0; p < f->size; p++) {
        mt_t x = mt_for(f, &ag, f->members[p], 1);
        ce = x.bad_k || x.bad_dt ? FZ_EXPECT_ERR : ce;
    }
    hcomm_moe_plan_desc_t d = {MT,   m.H,  m.bad_k ? 0 : m.k,       m.E,
                               m.dt, m.cf, HCOMM_MOE_DROP_POSITION, m.pad};
    d.dtype = m.bad_dt ? (hcomm_dtype_t)fz_bad_enum(f, f->wrank, HCOMM_DTYPE_COUNT) : m.dt;
    fz_describe(f, "hcomm_moe_plan_create(E=%d, H=%d, k=%d, dtype %d, cf %g, pad %d), T=%d", m.E,
                m.H, d.k, d.dtype, m.cf, m.pad, m.T);
    hcomm_moe_plan_t *plan = NULL;
    hcomm_result_t r = hcomm_moe_plan_create(f->comm, &d, &plan);
    if (!fz_check_coll(f, "hcomm_moe_plan_create", r, ce) || ce == FZ_EXPECT_ERR)
        return;
    int tmax;
    fz_expect_t e = mt_expect(f, &ag, 1, &tmax);
    hcomm_tensor_t tok;
    mt_tokens(f, &m, &tok);
    hcomm_moe_handle_t *hd = NULL;
    r = hcomm_moe_plan_dispatch(plan, &tok, m.null_ids ? NULL : m.ids, m.w, &hd);
    if (fz_check_coll(f, "hcomm_moe_plan_dispatch", r, e) && e == FZ_EXPECT_OK)
        mt_combine(f, &ag, &m, hd, 1, mt_cap(&m, MT));
    fz_check(f, "hcomm_moe_plan_free", hcomm_moe_plan_free(plan), FZ_EXPECT_OK);
}

const fz_kind_t fz_moe_kinds[] = {
    {"moe_topk", 4, k_moe_topk},
    {"moe_plan", 3, k_moe_plan},
};
const int fz_moe_nkinds = (int)(sizeof fz_moe_kinds / sizeof fz_moe_kinds[0]);
