/* The defaults table's answer (select_table.h) in the terms test_algos and test_algo_env used
 * before selection became a table: shm = a shared-memory transport with posted checks. */
#ifndef HCOMM_TEST_CHOOSE_DEFAULT_H_
#define HCOMM_TEST_CHOOSE_DEFAULT_H_

#include "algo/select_table.h"
#include "core/env.h"

static inline int choose_default(const hcomm__algo_set_t *over, int coll, size_t bytes, int p,
                                 bool shm, const char **why) {
    unsigned has = (shm ? HCOMM__HAS_POSTED : 0) |
                   (hcomm__check_mode() == HCOMM__CHECK_OFF ? HCOMM__HAS_OFF : 0);
    hcomm__sel_t s = {coll, bytes, p, has, over};
    hcomm__why_t w;
    int algo = hcomm__select_default(&s, &w);
    *why = hcomm__why_text(w);
    return algo;
}

#endif /* HCOMM_TEST_CHOOSE_DEFAULT_H_ */
