/* Nonblocking collectives. The first nonblocking call on a communicator (a collective call, so
 * every rank makes it at the same point) splits off a private duplicate and starts one worker
 * thread that owns it; every later nonblocking call queues an operation that the worker runs
 * in issue order through the same algorithms and checks as the blocking calls. The caller
 * keeps computing (backward passes overlap their gradient all_reduce this way) and its thread
 * never touches the duplicate, so the one-thread-per-communicator rule holds for both.
 * Completion is a release store of the request's done flag; the result and message travel in
 * the request. Where the transport cannot run two communicators from two threads (MPI below
 * MPI_THREAD_MULTIPLE), the operation runs at once in the caller's thread instead. */
#include "algo/async.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum { OP_ALL_REDUCE, OP_ALL_GATHER, OP_REDUCE_SCATTER, OP_FAIL, OP_CALL } op_kind_t;

struct hcomm_request {
    struct hcomm_request *next;
    op_kind_t kind;
    const char *fn;
    const void *send;
    void *recv;
    size_t count;
    hcomm_dtype_t dt;
    hcomm_op_t op;
    hcomm__icall_fn_t call; /* OP_CALL: a primitive's body, run on the duplicate */
    bool deterministic;     /* the issuing comm's mode when the operation was queued */
    _Alignas(16) unsigned char ctx[HCOMM__ICALL_CTX];
    atomic_int done;
    hcomm_result_t res;
    char msg[512];
    hcomm_comm_t *owner; /* the issuing comm, progressed while its owner waits */
};

typedef struct async {
    hcomm_comm_t *comm, *dup; /* the user's communicator, the worker's duplicate of it */
    pthread_t worker;
    bool started, stop;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    hcomm_request_t *head, *tail;
} async_t;

static hcomm_result_t run_op(hcomm_comm_t *c, hcomm_request_t *q) {
    c->deterministic = q->deterministic; /* the duplicate follows its comm's mode per call */
    hcomm__enter(c, q->fn);
    hcomm_result_t r;
    switch (q->kind) {
    case OP_ALL_REDUCE:
        r = hcomm__coll_all_reduce(c, q->send, q->recv, q->count, q->dt, q->op);
        break;
    case OP_ALL_GATHER:
        r = hcomm__coll_all_gather(c, q->send, q->recv, q->count);
        break;
    case OP_CALL:
        r = q->call(c, q->ctx);
        break;
    case OP_FAIL: /* this rank's checks failed: its peers' operation gets HCOMM_ERR_PEER */
        hcomm__err_text(q->res, q->msg);
        r = hcomm__coll_fail(c, q->res);
        break;
    default:
        r = hcomm__coll_reduce_scatter(c, q->send, q->recv, q->count, q->dt, q->op);
        break;
    }
    return hcomm__leave(c, r);
}

static void complete(hcomm_request_t *q, hcomm_result_t r) {
    q->res = r;
    if (r != HCOMM_OK)
        snprintf(q->msg, sizeof q->msg, "%s", hcomm_last_error());
    atomic_store_explicit(&q->done, 1, memory_order_release);
}

static hcomm_request_t *next_op(async_t *a) {
    pthread_mutex_lock(&a->mu);
    while (!a->head && !a->stop)
        pthread_cond_wait(&a->cv, &a->mu);
    hcomm_request_t *q = a->head;
    if (q) {
        a->head = q->next;
        if (!a->head)
            a->tail = NULL;
    }
    pthread_mutex_unlock(&a->mu);
    return q;
}

static void *worker_main(void *arg) {
    async_t *a = arg;
    hcomm_request_t *q;
    while ((q = next_op(a)) != NULL) {
        hcomm__ranks_here(1, 1); /* a thread that needs a core: waiters yield to it */
        hcomm_result_t r = run_op(a->dup, q);
        hcomm__ranks_here(-1, -1);
        complete(q, r);
    }
    return NULL;
}

/* Stops the worker once it has drained its queue, then frees the duplicate. */
static void async_free(void *p) {
    async_t *a = p;
    if (a->comm)
        atomic_store(&a->comm->abort_with, NULL);
    if (a->started) {
        pthread_mutex_lock(&a->mu);
        a->stop = true;
        pthread_cond_signal(&a->cv);
        pthread_mutex_unlock(&a->mu);
        pthread_join(a->worker, NULL);
    }
    hcomm__comm_free(a->dup);
    pthread_mutex_destroy(&a->mu);
    pthread_cond_destroy(&a->cv);
    free(a);
}

/* The comm's executor, created by the first nonblocking call (collective: all ranks are here). */
static hcomm_result_t executor(hcomm_comm_t *c, async_t **out) {
    *out = c->layer[HCOMM__LAYER_ASYNC];
    if (*out || !c->tr->threads_ok())
        return HCOMM_OK;
    async_t *a = calloc(1, sizeof *a);
    if (!a)
        return hcomm__err(HCOMM_ERR_NOMEM, c->call_fn, "out of memory for a nonblocking executor");
    pthread_mutex_init(&a->mu, NULL);
    pthread_cond_init(&a->cv, NULL);
    hcomm_result_t r = hcomm__coll_worker_dup(c, &a->dup);
    if (r == HCOMM_OK && pthread_create(&a->worker, NULL, worker_main, a) != 0)
        r = hcomm__err(HCOMM_ERR_BACKEND, c->call_fn, "cannot start the nonblocking executor");
    a->started = r == HCOMM_OK;
    if (r != HCOMM_OK) {
        async_free(a);
        return r;
    }
    a->comm = c; /* hcomm_comm_abort(c) ends the worker's operations too */
    atomic_store(&c->abort_with, a->dup);
    if (atomic_load(&c->aborted))
        atomic_store(&a->dup->aborted, 1);
    c->layer[HCOMM__LAYER_ASYNC] = a;
    c->layer_free[HCOMM__LAYER_ASYNC] = async_free;
    *out = a;
    return HCOMM_OK;
}

static hcomm_result_t submit(hcomm_comm_t *c, hcomm_request_t *q, hcomm_request_t **req) {
    async_t *a = NULL;
    q->deterministic = c->deterministic;
    q->owner = c;
    hcomm_result_t r = executor(c, &a);
    if (r != HCOMM_OK) {
        free(q);
        return r;
    }
    atomic_init(&q->done, 0);
    *req = q;
    if (!a) { /* no worker possible: run it now */
        complete(q, run_op(c, q));
        return HCOMM_OK;
    }
    pthread_mutex_lock(&a->mu);
    if (a->tail)
        a->tail->next = q;
    else
        a->head = q;
    a->tail = q;
    pthread_cond_signal(&a->cv);
    pthread_mutex_unlock(&a->mu);
    return HCOMM_OK;
}

hcomm_result_t hcomm__icoll(hcomm_comm_t *c, hcomm__icoll_t kind, const void *send, void *recv,
                            size_t count, hcomm_dtype_t dt, hcomm_op_t op, hcomm_request_t **req) {
    hcomm_request_t *q = calloc(1, sizeof *q);
    if (!q)
        return hcomm__err(HCOMM_ERR_NOMEM, c->call_fn, "out of memory for a request");
    *q = (hcomm_request_t){.kind = (op_kind_t)kind,
                           .fn = c->call_fn,
                           .send = send,
                           .recv = recv,
                           .count = count,
                           .dt = dt,
                           .op = op};
    return submit(c, q, req);
}

hcomm_result_t hcomm__icall(hcomm_comm_t *c, hcomm__icall_fn_t fn, const void *ctx, size_t bytes,
                            hcomm_request_t **req) {
    if (bytes > HCOMM__ICALL_CTX)
        return hcomm__err(HCOMM_ERR_INTERNAL, c->call_fn, "a call context of %zu bytes", bytes);
    hcomm_request_t *q = calloc(1, sizeof *q);
    if (!q)
        return hcomm__err(HCOMM_ERR_NOMEM, c->call_fn, "out of memory for a request");
    *q = (hcomm_request_t){.kind = OP_CALL, .fn = c->call_fn, .call = fn};
    memcpy(q->ctx, ctx, bytes);
    return submit(c, q, req);
}

hcomm_result_t hcomm__icoll_fail(hcomm_comm_t *c, hcomm_result_t why, hcomm_request_t **req) {
    hcomm_request_t *q = calloc(1, sizeof *q);
    if (!q)
        return hcomm__err(HCOMM_ERR_NOMEM, c->call_fn, "out of memory for a request");
    *q = (hcomm_request_t){.kind = OP_FAIL, .fn = c->call_fn, .res = why};
    snprintf(q->msg, sizeof q->msg, "%s", hcomm_last_error());
    return submit(c, q, req);
}

hcomm_result_t hcomm__icoll_fail_now(hcomm_comm_t *c, hcomm_result_t why) {
    hcomm_request_t *q = NULL;
    HCOMM__TRY(hcomm__icoll_fail(c, why, &q));
    return hcomm__request_wait(q);
}

hcomm_result_t hcomm__request_done(hcomm_request_t *q, bool *done) {
    *done = atomic_load_explicit(&q->done, memory_order_acquire) != 0;
    return HCOMM_OK;
}

/* The worker ends every operation (its collectives time out), so this wait is bounded. The
 * issuing comm is progressed meanwhile: a peer's revoke arrives there, and revokes the
 * worker's duplicate too (p2p's record of the notice), which ends the operation now. */
hcomm_result_t hcomm__request_wait(hcomm_request_t *q) {
    hcomm__backoff_t b;
    hcomm__backoff_init(&b);
    while (!atomic_load_explicit(&q->done, memory_order_acquire)) {
        hcomm__backoff(&b);
        if ((b.iter & 63) == 0 && b.napping && q->owner && q->owner->idle)
            q->owner->idle(q->owner);
    }
    hcomm_result_t r = q->res;
    if (r != HCOMM_OK)
        hcomm__err_text(r, q->msg);
    free(q);
    return r;
}
