/* The fuzzer's shared state (docs/fuzz.md). Every rank runs the same sequence of call kinds,
 * drawn from the seed; each kind draws its arguments, makes its calls and checks each outcome
 * against the contract: an error whose hcomm_last_error() starts with the public call's name, or
 * HCOMM_OK with the result of a serial reference computed locally. A rank can draw any other
 * rank's arguments too (they are a function of seed, call index and world rank), so it knows
 * whether a call must fail somewhere and every member must then fail. */
#ifndef HCOMM_FUZZ_H_
#define HCOMM_FUZZ_H_

#include "hcomm/api.h"

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define FZ_MAX_RANKS 8
#define FZ_MAX_ALLOCS 64
#define FZ_HUGE_A ((size_t)-1)
#define FZ_HUGE_B (((size_t)1 << 62) + 3)

typedef struct fz_rng {
    uint64_t s;
} fz_rng_t;

/* What a rank's arguments do to a call. */
typedef enum fz_expect { FZ_EXPECT_OK, FZ_EXPECT_ANY, FZ_EXPECT_ERR } fz_expect_t;

/* Per-rank mutations of a call's agreed arguments (each kind applies those that fit it). */
typedef enum fz_mut {
    FZ_MUT_NONE,
    FZ_MUT_NULL,      /* a buffer NULL */
    FZ_MUT_HUGE,      /* a size no buffer can have */
    FZ_MUT_COUNT,     /* a size other ranks do not pass */
    FZ_MUT_DTYPE,     /* an out-of-range dtype */
    FZ_MUT_OP,        /* an out-of-range op */
    FZ_MUT_ROOT,      /* a root outside the group */
    FZ_MUT_UNALIGNED, /* buffers one byte past their alignment */
    FZ_MUT_OVERLAP,   /* output partly over the input */
    FZ_MUT_COUNT_
} fz_mut_t;

/* One rank's fuzzing state; the fields below "this call" are reset before each call. */
typedef struct fz {
    uint64_t seed;
    long idx;                  /* call index, the same on every rank */
    hcomm_comm_t *world, *ctl; /* ctl: the fuzzer's own communicator, never fuzzed */
    hcomm_comm_t *comm;        /* the fuzzed communicator (NULL: not a member this session) */
    int wrank, wsize, color;   /* world rank and size; comm's split color (-1: none) */
    int rank, size;            /* in comm */
    int members[FZ_MAX_RANKS]; /* world ranks of comm's members, by comm rank */
    double timeout_s;
    /* this call */
    fz_rng_t ag; /* the agreed stream: the same draws on every rank */
    const char *kind;
    char what[160]; /* the call and its agreed arguments, for the log */
    int nsteps;     /* collective steps checked; okmask bit i: step i returned HCOMM_OK */
    uint32_t okmask;
    int finding;
    char text[700]; /* the first finding's description */
    void *allocs[FZ_MAX_ALLOCS];
    int nallocs;
} fz_t;

/* One kind of call: draws arguments, calls, checks (fz_check*). */
typedef struct fz_kind {
    const char *name;
    int weight;
    void (*run)(fz_t *f);
    int ends_comm; /* the kind ends its communicator (abort): the next call gets a fresh one */
} fz_kind_t;

extern const fz_kind_t fz_a2a_kind;
extern const fz_kind_t fz_coll_kinds[];
extern const int fz_coll_nkinds;
extern const fz_kind_t fz_pp_kinds[];
extern const int fz_pp_nkinds;
extern const fz_kind_t fz_prim_kinds[];
extern const int fz_prim_nkinds;
extern const fz_kind_t fz_collv_kinds[]; /* collv.c: all_gatherv, reduce_scatterv */
extern const int fz_collv_nkinds;
extern const fz_kind_t fz_tp_kinds[]; /* tp.c */
extern const int fz_tp_nkinds;
extern const fz_kind_t fz_moe_kinds[]; /* moe.c: top-k and plans */
extern const int fz_moe_nkinds;

/* rng.c: splitmix64 streams. */
uint64_t fz_next(fz_rng_t *r);
uint64_t fz_below(fz_rng_t *r, uint64_t n);
int fz_chance(fz_rng_t *r, int percent);
/* The stream of world rank @p wrank for this call (its deliberate disagreements). */
fz_rng_t fz_rank_rng(const fz_t *f, int wrank, int salt);
/* Input element i of world rank wrank (salt tells buffers apart), in 0..range-1 (+ lo). */
double fz_val(const fz_t *f, int wrank, int salt, size_t i, int range);

/* values.c: element access and reductions as the contract words them. */
size_t fz_dsize(hcomm_dtype_t dt);
void fz_put(hcomm_dtype_t dt, void *buf, size_t i, double v);
double fz_get(hcomm_dtype_t dt, const void *buf, size_t i);
double fz_reduce(hcomm_dtype_t dt, hcomm_op_t op, const double *v, int n);
/* The value range that keeps op exact in every dtype over up to FZ_MAX_RANKS ranks. */
int fz_range(hcomm_op_t op);
/* A size of the agreed stream: mostly small, sometimes 0, 1 or a few thousand. */
size_t fz_size(fz_rng_t *r, size_t small);
hcomm_dtype_t fz_dtype(fz_rng_t *r);
hcomm_op_t fz_op(fz_rng_t *r);
/* The mutation world rank wrank applies to this call (FZ_MUT_NONE mostly); the kinds a call
 * does not take (bit mask of fz_mut_t) fall back to none. */
fz_mut_t fz_mutation(const fz_t *f, int wrank, unsigned takes);
/* A huge size of rank wrank's stream. */
size_t fz_huge(const fz_t *f, int wrank);
/* Out-of-range dtype / op / root values. */
int fz_bad_enum(const fz_t *f, int wrank, int count);

/* check.c */
void *fz_alloc(fz_t *f, size_t bytes, int misalign);
void fz_free_all(fz_t *f);
void fz_finding(fz_t *f, const char *fmt, ...);
/* Checks one call's outcome: an error must carry a message starting with one of the names in
 * @p names ("a|b"); HCOMM_OK is a finding where @p e is FZ_EXPECT_ERR, an error where it is
 * FZ_EXPECT_OK. Returns 1 when r is HCOMM_OK. */
int fz_check(fz_t *f, const char *names, hcomm_result_t r, fz_expect_t e);
/* The same for a collective step: every member must also agree on success or failure. */
int fz_check_coll(fz_t *f, const char *names, hcomm_result_t r, fz_expect_t e);
/* Reports @p wrong elements (a finding when nonzero) of @p call's result. */
void fz_check_data(fz_t *f, const char *call, long wrong, const char *detail);
/* The worst of each member's expectation (any invalid -> every rank must fail). */
fz_expect_t fz_worst(fz_expect_t a, fz_expect_t b);
void fz_describe(fz_t *f, const char *fmt, ...);

/* main.c: mutations left out (--avoid, a bit per fz_mut_t) and the names --avoid takes. */
extern unsigned fz_avoid;
extern const char *fz_avoid_names; /* also call kinds left out, by name */
extern const char *const fz_mut_names[FZ_MUT_COUNT_];
/* main.c: totals over the run (every rank adds its own). */
extern atomic_long fz_calls, fz_errors, fz_ok_checked;

#endif /* HCOMM_FUZZ_H_ */
