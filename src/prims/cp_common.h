/* Helpers shared by the context-parallel files (cp.c, cp_ring.c, cp_a2a.c, cp_hier.c): the
 * members' agreement on what they passed, strided box copies, and the nonblocking entry. */
#ifndef HCOMM_C_PRIMS_CP_COMMON_H_
#define HCOMM_C_PRIMS_CP_COMMON_H_

#include "hcomm/cp.h"
#include "algo/async.h"
#include "prims/prims.h"

/* What a member passed: a tensor's dtype and shape and up to three integer arguments, named in
 * a mismatch message by pnames ("seq_dim,flags"). */
typedef struct cp_desc {
    int32_t dtype, ndim;
    int32_t p[3];
    int32_t pad;
    int64_t shape[HCOMM_MAX_DIMS];
} cp_desc_t;

/* Describes t (NULL: no tensor) with the arguments p0..p2. */
cp_desc_t hcomm__cp_desc(const hcomm_tensor_t *t, int p0, int p1, int p2);

/* The members exchange their descriptions (one all_gather): any difference fails every member
 * with HCOMM_ERR_MISMATCH naming the first member that differs from rank 0, both ranks and what
 * each passed; tname names the tensor, pnames the arguments (comma-separated, at most 3). */
hcomm_result_t hcomm__cp_agree(hcomm_comm_t *g, const char *fn, const cp_desc_t *mine,
                               const char *tname, const char *pnames);

/* Copies the box of extents ext at soff in src (shape sshape) to doff in dst (shape dshape),
 * both ndim-dimensional with dt's elements; add sums into dst (hcomm__reduce) instead. */
void hcomm__cp_box(void *dst, const int64_t *dshape, const int64_t *doff, const void *src,
                   const int64_t *sshape, const int64_t *soff, const int64_t *ext, int ndim,
                   hcomm_dtype_t dt, bool add);

/* Fails with HCOMM_ERR_INVALID_ARG unless a and b share no byte. */
hcomm_result_t hcomm__cp_disjoint(const char *fn, const char *an, const hcomm_tensor_t *a,
                                  const char *bn, const hcomm_tensor_t *b);

/* Fails with HCOMM_ERR_SHAPE unless t's shape is ref's with dims d0, d1 (-1: none) set to
 * e0, e1. */
hcomm_result_t hcomm__cp_shape_as(const char *fn, const char *name, const hcomm_tensor_t *t,
                                  const hcomm_tensor_t *ref, int d0, int64_t e0, int d1,
                                  int64_t e1);

/* A failed check inside a collective body: this rank joins its peers' call (they get
 * HCOMM_ERR_PEER) and returns its own error. */
#define CP_CHECK(group, call)                                                                      \
    do {                                                                                           \
        hcomm_result_t chk_ = (call);                                                              \
        if (chk_ != HCOMM_OK)                                                                      \
            return hcomm__coll_fail(group, chk_);                                                  \
    } while (0)

/* One collective CP call, as data: the blocking call runs body now, the nonblocking one on
 * the group's worker (cp.c). */
typedef struct cp_op cp_op_t;
typedef hcomm_result_t (*cp_body_t)(hcomm_comm_t *g, const cp_op_t *op, const hcomm_tensor_t *in,
                                    hcomm_tensor_t *out);
struct cp_op {
    const char *fn;
    cp_body_t body;
    hcomm_tensor_t in, out; /* the queued form's copies of the caller's descriptors */
    int a, b;               /* the call's dims and flags */
};

/* Runs op now on g under op->fn's name; NULL tensors are checked here. */
hcomm_result_t hcomm__cp_run(hcomm_comm_t *g, const hcomm_tensor_t *in, hcomm_tensor_t *out,
                             cp_op_t op);
/* Queues op on g's worker; *req gets its request (the errors at issue: NULL group or req). */
hcomm_result_t hcomm__cp_issue(hcomm_comm_t *g, const hcomm_tensor_t *in, hcomm_tensor_t *out,
                               cp_op_t op, hcomm_request_t **req);

#endif /* HCOMM_C_PRIMS_CP_COMMON_H_ */
