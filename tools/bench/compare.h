/* hcomm-bench --op compare: hcomm against raw MPI and memcpy in the same run (compare.c). */
#ifndef HCOMM_TOOLS_BENCH_COMPARE_H_
#define HCOMM_TOOLS_BENCH_COMPARE_H_

#include "bench.h"

/* Collective over w: prints the comparison tables on rank 0; o's -b/-e/-f/-i and -n where the
 * command line gave them (min_given, max_given, step_given, iters_given). */
hcomm_result_t hcomm_bench_compare(hcomm_comm_t *w, const bench_opts_t *o);

#endif /* HCOMM_TOOLS_BENCH_COMPARE_H_ */
