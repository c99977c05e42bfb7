/* Random streams, element values, reductions as the contract words them, and the outcome
 * checks every call kind uses. */
#include "fuzz.h"

#include "core/internal.h"
#include "harness.h"

#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

uint64_t fz_next(fz_rng_t *r) { /* splitmix64 (Steele, Lea & Flood 2014) */
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

uint64_t fz_below(fz_rng_t *r, uint64_t n) {
    return n ? fz_next(r) % n : 0;
}

int fz_chance(fz_rng_t *r, int percent) {
    return (int)fz_below(r, 100) < percent;
}

fz_rng_t fz_rank_rng(const fz_t *f, int wrank, int salt) {
    fz_rng_t r = {f->seed ^ ((uint64_t)f->idx * 0x2545f4914f6cdd1dull)};
    r.s ^= ((uint64_t)(wrank + 2) << 40) ^ ((uint64_t)salt << 20);
    fz_next(&r);
    return r;
}

double fz_val(const fz_t *f, int wrank, int salt, size_t i, int range) {
    fz_rng_t r = fz_rank_rng(f, wrank, salt);
    r.s ^= (uint64_t)i * 0xd1342543de82ef95ull;
    return (double)fz_below(&r, (uint64_t)range);
}

size_t fz_dsize(hcomm_dtype_t dt) {
    static const size_t sz[HCOMM_DTYPE_COUNT] = {4, 8, 2, 2, 1, 1, 4, 8};
    return (unsigned)dt < HCOMM_DTYPE_COUNT ? sz[dt] : 1;
}

/* memcpy: the fuzzer's own buffers may be misaligned on purpose. */
void fz_put(hcomm_dtype_t dt, void *buf, size_t i, double v) {
    char *p = (char *)buf + i * fz_dsize(dt);
    float f = (float)v;
    uint16_t h = dt == HCOMM_F16 ? hcomm__f32_to_f16(f) : hcomm__f32_to_bf16(f);
    int8_t i8 = (int8_t)v;
    uint8_t u8 = (uint8_t)v;
    int32_t i32 = (int32_t)v;
    int64_t i64 = (int64_t)v;
    const void *src[HCOMM_DTYPE_COUNT] = {&f, &v, &h, &h, &i8, &u8, &i32, &i64};
    memcpy(p, src[dt], fz_dsize(dt));
}

double fz_get(hcomm_dtype_t dt, const void *buf, size_t i) {
    const char *p = (const char *)buf + i * fz_dsize(dt);
    union {
        float f;
        double d;
        uint16_t h;
        int8_t i8;
        uint8_t u8;
        int32_t i32;
        int64_t i64;
    } u;
    memcpy(&u, p, fz_dsize(dt));
    switch (dt) {
    case HCOMM_F32:
        return u.f;
    case HCOMM_F64:
        return u.d;
    case HCOMM_F16:
        return hcomm__f16_to_f32(u.h);
    case HCOMM_BF16:
        return hcomm__bf16_to_f32(u.h);
    case HCOMM_I8:
        return u.i8;
    case HCOMM_U8:
        return u.u8;
    case HCOMM_I32:
        return u.i32;
    default:
        return (double)u.i64;
    }
}

double fz_reduce(hcomm_dtype_t dt, hcomm_op_t op, const double *v, int n) {
    double acc = v[0];
    for (int i = 1; i < n; i++) {
        if (op == HCOMM_SUM || op == HCOMM_AVG)
            acc += v[i];
        else if (op == HCOMM_PROD)
            acc *= v[i];
        else if (op == HCOMM_MAX)
            acc = v[i] > acc ? v[i] : acc;
        else
            acc = v[i] < acc ? v[i] : acc;
    }
    return op == HCOMM_AVG ? t_avg_ref(dt, acc, n) : acc;
}

int fz_range(hcomm_op_t op) {
    return op == HCOMM_PROD ? 2 : op == HCOMM_MAX || op == HCOMM_MIN ? 100 : 4;
}

size_t fz_size(fz_rng_t *r, size_t small) {
    uint64_t k = fz_below(r, 20);
    if (k < 2)
        return k; /* 0 and 1 */
    if (k == 2)
        return 1000 + fz_below(r, 5000); /* past the eager limit and the shm blocks */
    return 1 + fz_below(r, small);
}

hcomm_dtype_t fz_dtype(fz_rng_t *r) {
    return (hcomm_dtype_t)fz_below(r, HCOMM_DTYPE_COUNT);
}

hcomm_op_t fz_op(fz_rng_t *r) {
    return (hcomm_op_t)fz_below(r, HCOMM_OP_COUNT);
}

fz_mut_t fz_mutation(const fz_t *f, int wrank, unsigned takes) {
    fz_rng_t plan = fz_rank_rng(f, -1, 7), mine = fz_rank_rng(f, wrank, 7);
    if (!fz_chance(&plan, 30))
        return FZ_MUT_NONE;
    uint64_t mode = fz_below(&plan, 3), victim = fz_below(&plan, (uint64_t)f->wsize);
    fz_mut_t all = (fz_mut_t)(1 + fz_below(&plan, FZ_MUT_COUNT_ - 1));
    fz_mut_t own = (fz_mut_t)(1 + fz_below(&mine, FZ_MUT_COUNT_ - 1));
    fz_mut_t m = FZ_MUT_NONE;
    if (mode == 0 && (uint64_t)wrank == victim)
        m = own; /* one rank disagrees */
    else if (mode == 1)
        m = all; /* every rank makes the same mistake */
    else if (mode == 2 && fz_chance(&mine, 50))
        m = own;
    return (takes & ~fz_avoid) >> m & 1u ? m : FZ_MUT_NONE;
}

size_t fz_huge(const fz_t *f, int wrank) {
    (void)wrank; /* every mutated rank passes the same huge size: agreed, yet impossible */
    fz_rng_t plan = fz_rank_rng(f, -1, 8);
    static const size_t huge[] = {FZ_HUGE_A, FZ_HUGE_B, FZ_HUGE_A / 2, (size_t)1 << 48};
    return huge[fz_below(&plan, 4)];
}

int fz_bad_enum(const fz_t *f, int wrank, int count) {
    fz_rng_t r = fz_rank_rng(f, wrank, 9);
    const int bad[] = {-1, count, count + 7, INT_MAX, INT_MIN};
    return bad[fz_below(&r, 5)];
}

void *fz_alloc(fz_t *f, size_t bytes, int misalign) {
    if (f->nallocs == FZ_MAX_ALLOCS) {
        fz_finding(f, "fuzzer: more than %d buffers in one call", FZ_MAX_ALLOCS);
        return NULL;
    }
    char *p = malloc(bytes + (size_t)misalign + 1); /* + 1: malloc(0) may give NULL */
    if (!p) {
        fprintf(stderr, "fuzz: out of memory for %zu bytes\n", bytes);
        abort();
    }
    f->allocs[f->nallocs++] = p;
    return p + misalign;
}

void fz_free_all(fz_t *f) {
    for (int i = 0; i < f->nallocs; i++)
        free(f->allocs[i]);
    f->nallocs = 0;
}

void fz_finding(fz_t *f, const char *fmt, ...) {
    if (f->finding)
        return;
    f->finding = 1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(f->text, sizeof f->text, fmt, ap);
    va_end(ap);
}

void fz_describe(fz_t *f, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(f->what, sizeof f->what, fmt, ap);
    va_end(ap);
}

fz_expect_t fz_worst(fz_expect_t a, fz_expect_t b) {
    return a > b ? a : b;
}

/* Whether msg starts with one of the '|'-separated names followed by ": ". */
static int names_call(const char *msg, const char *names) {
    for (const char *p = names; *p;) {
        size_t n = strcspn(p, "|");
        if (strncmp(msg, p, n) == 0 && strncmp(msg + n, ": ", 2) == 0)
            return 1;
        p += n + (p[n] == '|');
    }
    return 0;
}

int fz_check(fz_t *f, const char *names, hcomm_result_t r, fz_expect_t e) {
    const char *msg = hcomm_last_error();
    atomic_fetch_add(&fz_calls, 1);
    if (r != HCOMM_OK)
        atomic_fetch_add(&fz_errors, 1);
    char first[64];
    snprintf(first, sizeof first, "%.*s", (int)strcspn(names, "|"), names);
    if ((unsigned)r >= HCOMM_RESULT_COUNT)
        fz_finding(f, "%s returned %d, not a result code", first, (int)r);
    else if (r != HCOMM_OK && !names_call(msg, names))
        fz_finding(f, "%s returned %s with a message that does not start with '%s: ': '%s'", first,
                   hcomm_result_name(r), first, msg);
    else if (r != HCOMM_OK && e == FZ_EXPECT_OK)
        fz_finding(f, "%s returned %s though every rank's arguments were valid: '%s'", first,
                   hcomm_result_name(r), msg);
    else if (r == HCOMM_OK && e == FZ_EXPECT_ERR)
        fz_finding(f, "%s returned HCOMM_OK for arguments that must fail (%s)", first, f->what);
    return r == HCOMM_OK;
}

int fz_check_coll(fz_t *f, const char *names, hcomm_result_t r, fz_expect_t e) {
    if (f->nsteps < 32 && r == HCOMM_OK)
        f->okmask |= 1u << f->nsteps;
    f->nsteps++;
    return fz_check(f, names, r, e);
}

void fz_check_data(fz_t *f, const char *call, long wrong, const char *detail) {
    atomic_fetch_add(&fz_ok_checked, 1);
    if (wrong)
        fz_finding(f, "%s returned HCOMM_OK with %ld wrong elements (%s; %s)", call, wrong, detail,
                   f->what);
}
