/* Test harness: checks that print both values, run over world sizes 1..8 (local backend) or
 * once over the MPI world (HCOMM_BACKEND=mpi). A test file that also runs under mpirun
 * contains the marker HCOMM_TEST_MPI (test/CMakeLists.txt registers np 2, 3 and 4). */
#ifndef HCOMM_TEST_HARNESS_H_
#define HCOMM_TEST_HARNESS_H_

#include "hcomm/api.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern atomic_int t_failures;
extern atomic_int t_checks;

#define T_FAIL_(...)                                                                               \
    do {                                                                                           \
        fprintf(stderr, "%s:%d: FAIL: ", __FILE__, __LINE__);                                      \
        fprintf(stderr, __VA_ARGS__);                                                              \
        fprintf(stderr, "\n");                                                                     \
        atomic_fetch_add(&t_failures, 1);                                                          \
    } while (0)

/* Fails (and goes on) unless cond holds; the message says what was expected. */
#define T_CHECK(cond, ...)                                                                         \
    do {                                                                                           \
        atomic_fetch_add(&t_checks, 1);                                                            \
        if (!(cond))                                                                               \
            T_FAIL_(__VA_ARGS__);                                                                  \
    } while (0)

#define T_EQ_INT(a, b)                                                                             \
    do {                                                                                           \
        long long t_a_ = (long long)(a), t_b_ = (long long)(b);                                    \
        T_CHECK(t_a_ == t_b_, "%s == %s: got %lld, expected %lld", #a, #b, t_a_, t_b_);            \
    } while (0)

/* Expects a call to return HCOMM_OK; prints the result name and last error otherwise. */
#define T_OK(call)                                                                                 \
    do {                                                                                           \
        hcomm_result_t t_r_ = (call);                                                              \
        T_CHECK(t_r_ == HCOMM_OK, "%s returned %s (%s)", #call, hcomm_result_name(t_r_),           \
                hcomm_last_error());                                                               \
    } while (0)

/* Expects a call to fail with a given result and to leave a last-error message. */
#define T_ERR(call, expected)                                                                      \
    do {                                                                                           \
        hcomm_result_t t_r_ = (call);                                                              \
        T_CHECK(t_r_ == (expected), "%s returned %s, expected %s", #call, hcomm_result_name(t_r_), \
                hcomm_result_name(expected));                                                      \
        T_CHECK(t_r_ == HCOMM_OK || hcomm_last_error()[0] != '\0',                                 \
                "%s failed without a last-error message", #call);                                  \
    } while (0)

/* Checks a call the rest of a rank function depends on: a failure is counted and returned, so
 * the launch reports it and peers are released instead of waiting. */
#define T_TRY(call)                                                                                \
    do {                                                                                           \
        hcomm_result_t t_try_ = (call);                                                            \
        T_CHECK(t_try_ == HCOMM_OK, "%s returned %s (%s)", #call, hcomm_result_name(t_try_),       \
                hcomm_last_error());                                                               \
        if (t_try_ != HCOMM_OK)                                                                    \
            return t_try_;                                                                         \
    } while (0)

/* This rank's index in g and g's size (-1 / 0 if g is NULL). */
int t_rank(const hcomm_comm_t *g);
int t_size(const hcomm_comm_t *g);

/* Runs fn on every world size from 1 to max_ranks (local), or once on the MPI world. */
void t_for_each_world(hcomm_rank_fn_t fn, void *arg, int max_ranks);
/* The backend tests run on: "local" or "mpi" (from HCOMM_BACKEND). */
const char *t_backend(void);
/* Prints "N passed, N failed" style totals and returns the process exit code. */
int t_finish(const char *name);

/* Element i of a buffer of dtype dt, as a double (f16/bf16 converted exactly). */
double t_get_val(hcomm_dtype_t dt, const void *b, size_t i);
/* Stores v (converted to dt, f16/bf16 rounded to nearest even) at element i. */
void t_set_val(hcomm_dtype_t dt, void *b, size_t i, double v);
/* What hcomm's AVG gives for an exact integer sum over p ranks, per dtype. */
double t_avg_ref(hcomm_dtype_t dt, double sum, int p);

#endif /* HCOMM_TEST_HARNESS_H_ */
