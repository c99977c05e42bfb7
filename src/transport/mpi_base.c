/* The bottom of the mpi transport (mpi_base.h): MPI's errors in hcomm's words, and the polled
 * wait every MPI request of hcomm ends in.
 *
 * Why every wait polls: blocking MPI calls cannot time out, and hcomm promises that a peer
 * that never arrives gives HCOMM_ERR_TIMEOUT (after HCOMM_TIMEOUT seconds) and that a peer
 * whose rank function failed gives HCOMM_ERR_ABORTED instead of a hang. So each call posts
 * the nonblocking MPI operation and tests it in a loop, also checking for an abort notice
 * that a failing rank sends to every process on a control communicator (the launch's,
 * mpi_launch.c). */
#include "transport/mpi_base.h"

#include "core/env.h"

#include <stdio.h>

MPI_Comm hcomm__mpi_abort_comm = MPI_COMM_NULL;
atomic_bool hcomm__mpi_poisoned;

/* --- errors --- */

hcomm_result_t hcomm__mpi_fail(const char *fn, const char *call, int rc) {
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS)
        snprintf(text, sizeof text, "MPI error code %d", rc);
    return hcomm__err(HCOMM_ERR_BACKEND, fn, "%s failed: %s", call, text);
}

hcomm_result_t hcomm__mpi_error(const char *fn, const char *call, int rc) {
    int cls = MPI_ERR_OTHER;
    MPI_Error_class(rc, &cls);
    if (cls != MPI_ERR_TRUNCATE)
        return hcomm__mpi_fail(fn, call, rc);
    return hcomm__err(HCOMM_ERR_MISMATCH, fn,
                      "%s failed: a message was longer than its receive buffer (MPI_ERR_TRUNCATE); "
                      "ranks passed different sizes",
                      call);
}

hcomm_result_t hcomm__mpi_unusable(const char *fn, hcomm_result_t why) {
    return hcomm__err(why, fn,
                      "communicator unusable: an earlier collective or send on it failed with %s; "
                      "it may still be pending inside MPI, or its ranks may disagree on which "
                      "operation comes next",
                      hcomm_result_name(why));
}

/* --- polling waits --- */

typedef int (*poll_step_t)(void *ctx, int *done);

bool hcomm__mpi_peer_aborted(void) {
    int flag = 0;
    if (hcomm__mpi_abort_comm == MPI_COMM_NULL)
        return false;
    MPI_Iprobe(MPI_ANY_SOURCE, ABORT_TAG, hcomm__mpi_abort_comm, &flag, MPI_STATUS_IGNORE);
    return flag != 0;
}

/* Runs step until it reports done or an MPI error (then *mpi_rc holds its code and the result
 * is HCOMM_OK), a peer's abort notice arrives or hcomm_comm_abort() is called on c
 * (HCOMM_ERR_ABORTED), or the timeout passes (HCOMM_ERR_TIMEOUT). c may be NULL (creating a
 * comm: the environment's timeout applies). */
static hcomm_result_t poll_until(hcomm_comm_t *c, const char *fn, const char *what,
                                 poll_step_t step, void *ctx, int *mpi_rc) {
    double limit = 300.0;
    if (c)
        limit = c->timeout_s;
    else if (hcomm__env_timeout(fn, &limit) != HCOMM_OK)
        limit = 300.0;
    hcomm__backoff_t b;
    hcomm__backoff_init(&b);
    for (;;) {
        int done = 0;
        *mpi_rc = step(ctx, &done);
        if (*mpi_rc != MPI_SUCCESS || done)
            return HCOMM_OK;
        double waited = hcomm__backoff(&b);
        if ((b.iter & 63) != 0)
            continue;
        if (hcomm__mpi_peer_aborted())
            return hcomm__err(HCOMM_ERR_ABORTED, fn, "%s abandoned: another rank's function failed",
                              what);
        if (c && c->idle)
            c->idle(c); /* a peer's revoke notice arrives as a frame */
        if (c && hcomm__aborted(c) && atomic_load(&c->aborted) == HCOMM__REVOKE_CALLED)
            return hcomm__err(HCOMM_ERR_REVOKED, fn, "%s abandoned: the communicator was revoked",
                              what);
        if (c && hcomm__aborted(c))
            return hcomm__err(HCOMM_ERR_ABORTED, fn, "%s abandoned: hcomm_comm_abort() was called",
                              what);
        if (c)
            HCOMM__TRY(hcomm__lost_verdict(c, -1));
        if (waited > limit)
            return hcomm__err(HCOMM_ERR_TIMEOUT, fn,
                              "%s: no matching peer after %g s (seq %u, HCOMM_TIMEOUT%s)", what,
                              limit, c ? (unsigned)c->call_seq : 0u, hcomm__check_hint(false));
    }
}

typedef struct {
    MPI_Request *req;
    MPI_Status *st;
} test_ctx_t;

static int test_step(void *ctx, int *done) {
    test_ctx_t *t = ctx;
    return MPI_Test(t->req, done, t->st);
}

hcomm_result_t hcomm__mpi_wait_setup(const char *fn, const char *what, MPI_Request *req) {
    MPI_Status st;
    test_ctx_t t = {req, &st};
    int rc = MPI_SUCCESS;
    HCOMM__TRY(poll_until(NULL, fn, what, test_step, &t, &rc));
    return rc == MPI_SUCCESS ? HCOMM_OK : hcomm__mpi_fail(fn, what, rc);
}

hcomm_result_t hcomm__mpi_wait_making(hcomm_comm_t *c, const char *fn, const char *what,
                                      MPI_Request *req) {
    MPI_Status st;
    test_ctx_t t = {req, &st};
    int rc = MPI_SUCCESS;
    HCOMM__TRY(poll_until(c, fn, what, test_step, &t, &rc));
    return rc == MPI_SUCCESS ? HCOMM_OK : hcomm__mpi_fail(fn, what, rc);
}

hcomm_result_t hcomm__mpi_wait_request(hcomm_comm_t *c, const char *fn, const char *what,
                                       MPI_Request *req) {
    MPI_Status st;
    test_ctx_t t = {req, &st};
    int rc = MPI_SUCCESS;
    hcomm_result_t r = poll_until(c, fn, what, test_step, &t, &rc);
    if (r != HCOMM_OK) {
        mark_broken(c, r, true);
        return r;
    }
    if (rc == MPI_SUCCESS)
        return HCOMM_OK;
    r = hcomm__mpi_error(fn, what, rc);
    mark_broken(c, r, *req != MPI_REQUEST_NULL);
    return r;
}
