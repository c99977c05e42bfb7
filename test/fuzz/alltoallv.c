/* Call kind: hcomm_all_to_allv with random per-pair sizes, gaps between blocks, and per-rank
 * mistakes: a count its receiver does not expect, a huge displacement (of an empty block too,
 * which core.h says is never used), NULL arrays. */
#include "cargs.h"

#include <string.h>

enum { A_NONE, A_COUNT, A_HUGE_FULL, A_HUGE_EMPTY, A_NULL, A_KINDS };

typedef struct a2a {
    size_t sc[FZ_MAX_RANKS], sd[FZ_MAX_RANKS], rc[FZ_MAX_RANKS], rd[FZ_MAX_RANKS];
    size_t sbytes, rbytes;
    int mistake, peer; /* the mistake and the block it touches */
} a2a_t;

/* Bytes comm rank p sends to q, agreed. */
static size_t pair_bytes(const fz_t *f, int p, int q) {
    fz_rng_t r = fz_rank_rng(f, -1, 40 + p * FZ_MAX_RANKS + q);
    uint64_t k = fz_below(&r, 10);
    return k < 3 ? 0 : k == 9 ? 2000 + fz_below(&r, 3000) : fz_below(&r, 80);
}

/* Rank crank's arrays: blocks laid out with gaps, then its mistake (if any) applied. */
static void a2a_for(const fz_t *f, int crank, a2a_t *x) {
    memset(x, 0, sizeof *x);
    fz_rng_t r = fz_rank_rng(f, f->members[crank], 41);
    for (int q = 0; q < f->size; q++) {
        x->sc[q] = pair_bytes(f, crank, q);
        x->rc[q] = pair_bytes(f, q, crank);
        x->sd[q] = x->sbytes + fz_below(&r, 3);
        x->sbytes = x->sd[q] + x->sc[q];
        x->rd[q] = x->rbytes + fz_below(&r, 3);
        x->rbytes = x->rd[q] + x->rc[q];
    }
    fz_mut_t m =
        fz_mutation(f, f->members[crank],
                    FZ_TAKES(FZ_MUT_COUNT) | FZ_TAKES(FZ_MUT_HUGE) | FZ_TAKES(FZ_MUT_NULL));
    x->peer = (int)fz_below(&r, (uint64_t)f->size);
    x->mistake = m == FZ_MUT_COUNT ? A_COUNT : m == FZ_MUT_NULL ? A_NULL : A_NONE;
    if (m == FZ_MUT_HUGE)
        x->mistake = x->sc[x->peer] ? A_HUGE_FULL : A_HUGE_EMPTY;
    if (x->mistake == A_COUNT)
        x->sc[x->peer]++, x->sbytes++;
    if (x->mistake == A_HUGE_FULL || x->mistake == A_HUGE_EMPTY)
        x->sd[x->peer] = fz_huge(f, f->members[crank]);
}

static fz_expect_t a2a_expect(const fz_t *f, a2a_t *mine) {
    fz_expect_t e = FZ_EXPECT_OK;
    for (int p = 0; p < f->size; p++) {
        a2a_t x;
        a2a_for(f, p, &x);
        if (p == f->rank)
            *mine = x;
        if (x.mistake == A_COUNT || x.mistake == A_HUGE_FULL || x.mistake == A_NULL)
            e = FZ_EXPECT_ERR;
    }
    return e;
}

static void fill_send(const fz_t *f, const a2a_t *x, unsigned char *s) {
    for (int q = 0; q < f->size; q++)
        for (size_t j = 0; j < x->sc[q] && x->sd[q] < x->sbytes; j++)
            s[x->sd[q] + j] = (unsigned char)fz_val(f, f->wrank, 60 + q, j, 256);
}

static void k_all_to_allv(fz_t *f) {
    a2a_t x;
    fz_expect_t e = a2a_expect(f, &x);
    unsigned char *s = fz_alloc(f, x.sbytes, 0), *rv = fz_alloc(f, x.rbytes, 0);
    fill_send(f, &x, s);
    fz_describe(f, "hcomm_all_to_allv(sbytes %zu, rbytes %zu, mistake %d at block %d)", x.sbytes,
                x.rbytes, x.mistake, x.peer);
    int null = x.mistake == A_NULL;
    hcomm_result_t r = hcomm_all_to_allv(f->comm, s, null ? NULL : x.sc, x.sd, rv, x.rc, x.rd);
    if (!fz_check_coll(f, "hcomm_all_to_allv", r, e) || e == FZ_EXPECT_ERR)
        return;
    long wrong = 0;
    for (int p = 0; p < f->size; p++)
        for (size_t j = 0; j < x.rc[p]; j++)
            wrong +=
                rv[x.rd[p] + j] != (unsigned char)fz_val(f, f->members[p], 60 + f->rank, j, 256);
    fz_check_data(f, "hcomm_all_to_allv", wrong, "against every sender's block");
}

const fz_kind_t fz_a2a_kind = {"all_to_allv", 5, k_all_to_allv};
