#include "harness.h"

#include "core/internal.h"

atomic_int t_failures;
atomic_int t_checks;

const char *t_backend(void) {
    const char *b = getenv("HCOMM_BACKEND");
    return (b && strcmp(b, "mpi") == 0) ? "mpi" : "local";
}

void t_for_each_world(hcomm_rank_fn_t fn, void *arg, int max_ranks) {
    if (strcmp(t_backend(), "mpi") == 0) {
        T_OK(hcomm_launch("mpi", 0, fn, arg));
        return;
    }
    for (int n = 1; n <= max_ranks; n++)
        T_OK(hcomm_launch("local", n, fn, arg));
}

int t_rank(const hcomm_comm_t *g) {
    int r = -1;
    hcomm_comm_rank(g, &r);
    return r;
}

int t_size(const hcomm_comm_t *g) {
    int n = 0;
    hcomm_comm_size(g, &n);
    return n;
}

int t_finish(const char *name) {
    int f = atomic_load(&t_failures), c = atomic_load(&t_checks);
    printf("%s: %d checks, %d failed\n", name, c, f);
    return f == 0 && c > 0 ? 0 : 1;
}

/* Typed element access for tests that cover every dtype through doubles. */
void t_set_val(hcomm_dtype_t dt, void *b, size_t i, double v) {
    switch (dt) {
    case HCOMM_F32:
        ((float *)b)[i] = (float)v;
        break;
    case HCOMM_F64:
        ((double *)b)[i] = v;
        break;
    case HCOMM_F16:
        ((uint16_t *)b)[i] = hcomm__f32_to_f16((float)v);
        break;
    case HCOMM_BF16:
        ((uint16_t *)b)[i] = hcomm__f32_to_bf16((float)v);
        break;
    case HCOMM_I8:
        ((int8_t *)b)[i] = (int8_t)v;
        break;
    case HCOMM_U8:
        ((uint8_t *)b)[i] = (uint8_t)v;
        break;
    case HCOMM_I32:
        ((int32_t *)b)[i] = (int32_t)v;
        break;
    case HCOMM_I64:
        ((int64_t *)b)[i] = (int64_t)v;
        break;
    default:
        break;
    }
}

double t_get_val(hcomm_dtype_t dt, const void *b, size_t i) {
    switch (dt) {
    case HCOMM_F32:
        return ((const float *)b)[i];
    case HCOMM_F64:
        return ((const double *)b)[i];
    case HCOMM_F16:
        return hcomm__f16_to_f32(((const uint16_t *)b)[i]);
    case HCOMM_BF16:
        return hcomm__bf16_to_f32(((const uint16_t *)b)[i]);
    case HCOMM_I8:
        return ((const int8_t *)b)[i];
    case HCOMM_U8:
        return ((const uint8_t *)b)[i];
    case HCOMM_I32:
        return ((const int32_t *)b)[i];
    case HCOMM_I64:
        return (double)((const int64_t *)b)[i];
    default:
        return 0;
    }
}

/* What hcomm's AVG gives for an exact integer sum over p ranks, per dtype. */
double t_avg_ref(hcomm_dtype_t dt, double sum, int p) {
    switch (dt) {
    case HCOMM_F32:
        return (float)sum / (float)p;
    case HCOMM_F64:
        return sum / p;
    case HCOMM_F16:
        return hcomm__f16_to_f32(hcomm__f32_to_f16((float)sum / (float)p));
    case HCOMM_BF16:
        return hcomm__bf16_to_f32(hcomm__f32_to_bf16((float)sum / (float)p));
    default:
        return (double)((long long)sum / p);
    }
}
