/* hcomm-bench --op compare: hcomm against raw MPI and memcpy in the same run (compare.c). */
#ifndef HCOMM_TOOLS_BENCH_COMPARE_H_
#define HCOMM_TOOLS_BENCH_COMPARE_H_

#include "hcomm/api.h"

#include <stdbool.h>

/* Collective over w: prints the comparison tables on rank 0 (only the pp_send_recv one when
 * pp_only). */
hcomm_result_t hcomm_bench_compare(hcomm_comm_t *w, bool pp_only);

#endif /* HCOMM_TOOLS_BENCH_COMPARE_H_ */
