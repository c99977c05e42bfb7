/* Makes a real hang or mismatch for test_doctor.sh: every rank runs three calls on the world
 * (seq 1-3), then at seq 4 an all_reduce of 1024 floats, except rank 1, which by MODE:
 *   skip   sleeps past HCOMM_TIMEOUT and then calls hcomm_barrier instead,
 *   count  calls the all_reduce with count 512,
 *   dead   stops: returns from its rank function without calling it;
 *   lost   stops for good (hcomm_fault_stop: local, its thread; mpi, SIGKILL);
 * or, in MODE pp, rank 0 sends rank 1 a PP message of 64 KiB (rendezvous: the send waits for
 * its receive) that rank 1 never receives, and every other rank goes on to the all_reduce; or,
 * in MODE subcount, all ranks split the world in reverse order (seq 4) and rank 1 calls the
 * new communicator's first all_reduce with count 512 (the doctor names world ranks).
 * Usage: hang BACKEND NRANKS MODE (NRANKS 0 under mpirun). Exits 0 when launch failed as a hang
 * should (the dumps are what the test reads), 1 when every call succeeded. */
#include "hcomm/api.h"
#include "hcomm/pp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Each rank's buffers (on local the ranks are threads of this process). */
typedef struct bufs {
    float in[16384], out[1024];
} bufs_t;

static hcomm_result_t warm_up(hcomm_comm_t *w, float *in, float *out) {
    hcomm_result_t r = hcomm_barrier(w);
    if (r == HCOMM_OK)
        r = hcomm_all_reduce(w, in, out, 8, HCOMM_F32, HCOMM_SUM);
    if (r == HCOMM_OK)
        r = hcomm_broadcast(w, in, 64, 0);
    return r;
}

/* Rank 0 sends a message nobody receives, then joins the all_reduce; the others join it. */
static hcomm_result_t pp_body(hcomm_comm_t *w, int rank, float *in, float *out) {
    hcomm_tensor_t t;
    int64_t shape[1] = {16384};
    hcomm_result_t r = hcomm_tensor_init(&t, in, HCOMM_F32, 1, shape);
    if (r == HCOMM_OK && rank == 0)
        r = hcomm_pp_send(w, &t, 1, 7);
    return r == HCOMM_OK ? hcomm_all_reduce(w, in, out, 1024, HCOMM_F32, HCOMM_SUM) : r;
}

/* What rank 1 does at seq 4 in MODE skip, count or dead. */
static hcomm_result_t rank1(hcomm_comm_t *w, const char *mode, bufs_t *b) {
    if (strcmp(mode, "count") == 0)
        return hcomm_all_reduce(w, b->in, b->out, 512, HCOMM_F32, HCOMM_SUM);
    if (strcmp(mode, "dead") == 0)
        return HCOMM_ERR_INVALID_ARG;
    if (strcmp(mode, "lost") == 0)
        return hcomm_fault_stop(w);
    const char *t = getenv("HCOMM_TIMEOUT");
    sleep((unsigned)(t ? atoi(t) : 1) * 3 + 1);
    return hcomm_barrier(w);
}

static hcomm_result_t sub_count(hcomm_comm_t *w, int rank, bufs_t *b) {
    int size = 0;
    hcomm_comm_t *s = NULL;
    hcomm_comm_size(w, &size);
    hcomm_result_t r = hcomm_comm_split(w, 0, size - 1 - rank, &s);
    if (r == HCOMM_OK)
        r = hcomm_all_reduce(s, b->in, b->out, rank == 1 ? 512 : 1024, HCOMM_F32, HCOMM_SUM);
    if (s)
        hcomm_comm_destroy(s);
    return r;
}

static hcomm_result_t run(hcomm_comm_t *w, const char *mode, bufs_t *b) {
    int rank = 0;
    hcomm_comm_rank(w, &rank);
    hcomm_result_t r = warm_up(w, b->in, b->out);
    if (r == HCOMM_OK && strcmp(mode, "pp") == 0)
        return pp_body(w, rank, b->in, b->out);
    if (r == HCOMM_OK && strcmp(mode, "subcount") == 0)
        return sub_count(w, rank, b);
    if (r == HCOMM_OK && rank == 1)
        return rank1(w, mode, b);
    return r == HCOMM_OK ? hcomm_all_reduce(w, b->in, b->out, 1024, HCOMM_F32, HCOMM_SUM) : r;
}

static hcomm_result_t body(hcomm_comm_t *w, void *arg) {
    bufs_t *b = calloc(1, sizeof *b);
    if (!b)
        return HCOMM_ERR_NOMEM;
    hcomm_result_t r = run(w, arg, b);
    free(b);
    return r;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: hang BACKEND NRANKS skip|count|dead|lost|pp|subcount\n");
        return 2;
    }
    hcomm_result_t r = hcomm_launch(argv[1], atoi(argv[2]), body, argv[3]);
    printf("hang %s: launch returned %s (%s)\n", argv[3], hcomm_result_name(r), hcomm_last_error());
    return r == HCOMM_OK ? 1 : 0;
}
