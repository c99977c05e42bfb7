/* Result codes, strerror and the per-thread last-error message. */
#include "harness.h"

static void test_strerror_covers_every_code(void) {
    for (int r = 0; r < HCOMM_RESULT_COUNT; r++) {
        T_CHECK(strcmp(hcomm_strerror((hcomm_result_t)r), "unknown result") != 0,
                "result %d has no text", r);
        T_CHECK(strncmp(hcomm_result_name((hcomm_result_t)r), "HCOMM_", 6) == 0,
                "result %d has name %s", r, hcomm_result_name((hcomm_result_t)r));
    }
    T_CHECK(strcmp(hcomm_strerror((hcomm_result_t)999), "unknown result") == 0,
            "out-of-range code: %s", hcomm_strerror((hcomm_result_t)999));
    T_EQ_INT(HCOMM_OK, 0);
}

static void test_last_error_names_argument_and_value(void) {
    size_t sz = 0;
    T_ERR(hcomm_dtype_size((hcomm_dtype_t)42, &sz), HCOMM_ERR_DTYPE);
    T_CHECK(strstr(hcomm_last_error(), "hcomm_dtype_size") != NULL, "got '%s'", hcomm_last_error());
    T_CHECK(strstr(hcomm_last_error(), "42") != NULL, "got '%s'", hcomm_last_error());
    T_ERR(hcomm_dtype_size(HCOMM_F32, NULL), HCOMM_ERR_NULL);
    T_CHECK(strstr(hcomm_last_error(), "'bytes'") != NULL, "got '%s'", hcomm_last_error());
}

static void test_dtype_sizes(void) {
    const size_t expect[HCOMM_DTYPE_COUNT] = {4, 8, 2, 2, 1, 1, 4, 8};
    for (int d = 0; d < HCOMM_DTYPE_COUNT; d++) {
        size_t sz = 0;
        const char *name = NULL;
        T_OK(hcomm_dtype_size((hcomm_dtype_t)d, &sz));
        T_EQ_INT(sz, expect[d]);
        T_OK(hcomm_dtype_name((hcomm_dtype_t)d, &name));
        T_CHECK(name && name[0], "dtype %d has no name", d);
    }
}

static void test_tensor_init_checks(void) {
    hcomm_tensor_t t;
    int64_t shape[2] = {3, -1};
    float buf[6];
    T_ERR(hcomm_tensor_init(&t, buf, HCOMM_F32, 2, shape), HCOMM_ERR_SHAPE);
    T_CHECK(strstr(hcomm_last_error(), "shape[1]=-1") != NULL, "got '%s'", hcomm_last_error());
    T_ERR(hcomm_tensor_init(&t, buf, HCOMM_F32, 9, shape), HCOMM_ERR_SHAPE);
    T_ERR(hcomm_tensor_init(NULL, buf, HCOMM_F32, 1, shape), HCOMM_ERR_NULL);
    shape[1] = 2;
    T_OK(hcomm_tensor_init(&t, buf, HCOMM_F32, 2, shape));
    size_t n = 0;
    T_OK(hcomm_tensor_numel(&t, &n));
    T_EQ_INT(n, 6);
    t.data = NULL;
    T_ERR(hcomm_tensor_numel(&t, &n), HCOMM_ERR_NULL);
}

static void test_launch_bad_args(void) {
    T_ERR(hcomm_launch("local", 0, NULL, NULL), HCOMM_ERR_NULL);
    T_ERR(hcomm_launch("carrier-pigeon", 2, (hcomm_rank_fn_t)1, NULL), HCOMM_ERR_INVALID_ARG);
    T_CHECK(strstr(hcomm_last_error(), "carrier-pigeon") != NULL, "got '%s'", hcomm_last_error());
}

int main(void) {
    test_strerror_covers_every_code();
    test_last_error_names_argument_and_value();
    test_dtype_sizes();
    test_tensor_init_checks();
    test_launch_bad_args();
    return t_finish("test_errors");
}
