/* hcomm-bench --op compare: hcomm against raw MPI and memcpy in the same run (compare.c). */
#ifndef HCOMM_TOOLS_BENCH_COMPARE_H_
#define HCOMM_TOOLS_BENCH_COMPARE_H_

#include "hcomm/api.h"

/* Collective over w: prints the comparison table on rank 0. */
hcomm_result_t hcomm_bench_compare(hcomm_comm_t *w);

#endif /* HCOMM_TOOLS_BENCH_COMPARE_H_ */
