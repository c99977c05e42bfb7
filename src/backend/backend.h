/* The backend interface: what primitives and algorithms need from the transport underneath.
 * Every backend fills one hcomm__backend_ops_t; a communicator carries a pointer to it.
 * Buffers are host memory here; device buffers and streams (NCCL/HCCL) will come as an extra
 * memory-kind argument on the same entries, not as a new interface.
 * Byte counts are size_t; element counts go with a dtype. Peers and roots are ranks in the
 * communicator. Tags are >= 0 and <= HCOMM__TAG_MAX. All calls are blocking unless named i*. */
#ifndef HCOMM_C_BACKEND_H_
#define HCOMM_C_BACKEND_H_

#include "core/internal.h"

#define HCOMM__TAG_MAX 32767

typedef struct hcomm__req hcomm__req_t; /* a pending isend/irecv; backend-defined */

typedef struct hcomm__backend_ops {
    const char *name;
    /* Point-to-point. A receive whose incoming message size differs from bytes fails with
     * HCOMM_ERR_MISMATCH (the message is consumed). Sends may complete before the matching
     * receive is posted. Messages of one (source, tag) pair are non-overtaking. */
    hcomm_result_t (*send)(hcomm_comm_t *c, const void *buf, size_t bytes, int peer, int tag);
    hcomm_result_t (*recv)(hcomm_comm_t *c, void *buf, size_t bytes, int peer, int tag);
    hcomm_result_t (*isend)(hcomm_comm_t *c, const void *buf, size_t bytes, int peer, int tag,
                            hcomm__req_t **req);
    hcomm_result_t (*irecv)(hcomm_comm_t *c, void *buf, size_t bytes, int peer, int tag,
                            hcomm__req_t **req);
    /* Completes and frees req (also on failure). */
    hcomm_result_t (*wait)(hcomm_comm_t *c, hcomm__req_t *req);
    /* Backend-native collectives. sendbuf == recvbuf means in place. op is never AVG. */
    hcomm_result_t (*all_reduce)(hcomm_comm_t *c, const void *sendbuf, void *recvbuf, size_t count,
                                 hcomm_dtype_t dt, hcomm_op_t op);
    /* recvbuf gets size blocks of bytes_per_rank, rank order. In place when sendbuf ==
     * recvbuf + rank * bytes_per_rank; otherwise the buffers must not overlap (local reads the
     * peers' sendbufs while it writes recvbuf). */
    hcomm_result_t (*all_gather)(hcomm_comm_t *c, const void *sendbuf, void *recvbuf,
                                 size_t bytes_per_rank);
    /* sendbuf holds size blocks of count elements; rank r gets block r reduced into
     * recvbuf[0..count). In place when sendbuf == recvbuf (the result lands at the start) or
     * when recvbuf is this rank's block, sendbuf + rank * count elements. */
    hcomm_result_t (*reduce_scatter)(hcomm_comm_t *c, const void *sendbuf, void *recvbuf,
                                     size_t count, hcomm_dtype_t dt, hcomm_op_t op);
    hcomm_result_t (*broadcast)(hcomm_comm_t *c, void *buf, size_t bytes, int root);
    /* Byte counts and displacements, one per peer (as MPI_Alltoallv over MPI_BYTE). Send and
     * receive ranges must not overlap. */
    hcomm_result_t (*all_to_allv)(hcomm_comm_t *c, const void *sendbuf, const size_t *sendcounts,
                                  const size_t *sdispls, void *recvbuf, const size_t *recvcounts,
                                  const size_t *rdispls);
    hcomm_result_t (*barrier)(hcomm_comm_t *c);
    /* As MPI_Comm_split; color < 0 gives *out = NULL. The new comm's world_ranks are filled. */
    hcomm_result_t (*split)(hcomm_comm_t *c, int color, int key, hcomm_comm_t **out);
    /* Frees c->impl and whatever the backend owns; the caller frees c itself. */
    void (*destroy)(hcomm_comm_t *c);
} hcomm__backend_ops_t;

struct hcomm_comm {
    const hcomm__backend_ops_t *ops;
    void *impl;       /* backend state */
    int rank, size;   /* this rank's index, members */
    int *world_ranks; /* [size] members as world ranks, malloc'ed */
    bool is_world;    /* the communicator handed to a rank function; not destroyable */
    bool has_ctx;     /* a domain context is built on it (one at a time); set by src/domain */
};

/* Allocates a comm with world_ranks[size]; NULL on out-of-memory. */
hcomm_comm_t *hcomm__comm_alloc(const hcomm__backend_ops_t *ops, void *impl, int rank, int size);
/* Calls ops->destroy then frees the comm and its world_ranks. */
void hcomm__comm_free(hcomm_comm_t *c);

/* The backend hcomm_launch runs for @p requested (NULL: none named): requested, else
 * HCOMM_BACKEND, else mpi when an MPI launcher (mpirun, srun) started a job of more than one
 * process, else local. Fails on torchrun's variables and on local inside a multi-process MPI
 * job (unless HCOMM_BACKEND=local). Logs the choice at info level. (launch_detect.c) */
hcomm_result_t hcomm__launch_detect(const char *fn, const char *requested, const char **backend);

/* Launchers, one per backend (core/launch.c picks one). */
hcomm_result_t hcomm__local_launch(int nranks, hcomm_rank_fn_t fn, void *arg);
hcomm_result_t hcomm__mpi_launch(int nranks, hcomm_rank_fn_t fn, void *arg);

#endif /* HCOMM_C_BACKEND_H_ */
