/* hcomm_mem_alloc: buffers that work with every call, shared-memory backed (peers on a node can
 * map them), freed once; a pointer that did not come from it is refused. HCOMM_TEST_MPI */
#include "harness.h"
#include "transport/transport.h"

#include <stdint.h>
#include <string.h>

static hcomm_result_t body(hcomm_comm_t *w, void *arg) {
    (void)arg;
    int p = t_size(w), r = t_rank(w);
    size_t n = 100000;
    double *in = NULL, *out = NULL;
    T_TRY(hcomm_mem_alloc(n * sizeof *in, (void **)&in));
    T_TRY(hcomm_mem_alloc(n * sizeof *out, (void **)&out));
    T_CHECK(((uintptr_t)in & 4095) == 0, "hcomm_mem_alloc memory is not page-aligned");
    const char *name = NULL;
    size_t off = 0;
    T_CHECK(hcomm__mem_shared(in + 10, &name, &off) && off == 10 * sizeof *in && name[0] == '/',
            "a buffer from hcomm_mem_alloc is not a named shared object");
    T_CHECK(!hcomm__mem_shared(&n, NULL, NULL), "a stack variable counts as shared memory");
    for (size_t i = 0; i < n; i++)
        in[i] = (double)(r + (int)(i % 5));
    T_TRY(hcomm_all_reduce(w, in, out, n, HCOMM_F64, HCOMM_SUM));
    long bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += out[i] != (double)(p * (int)(i % 5)) + (double)p * (p - 1) / 2;
    T_CHECK(bad == 0, "%ld wrong elements in hcomm_mem_alloc buffers", bad);
    T_TRY(hcomm_mem_free(in));
    T_TRY(hcomm_mem_free(out));
    T_ERR(hcomm_mem_free(in), HCOMM_ERR_INVALID_ARG);
    T_ERR(hcomm_mem_free(&n), HCOMM_ERR_INVALID_ARG);
    T_OK(hcomm_mem_free(NULL));
    T_ERR(hcomm_mem_alloc(8, NULL), HCOMM_ERR_NULL);
    return hcomm_barrier(w);
}

int main(void) {
    t_for_each_world(body, NULL, 4);
    return t_finish("test_mem");
}
