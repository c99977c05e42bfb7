/* Quickstart: 8 ranks as threads; build the groups of a tp 2 × pp 2 × dp 2 job and
 * all_gather a column-parallel activation inside each TP group.
 * Build against an installed hcomm: cc quickstart.c $(pkg-config --cflags --libs hcomm)
 * or with CMake: find_package(hcomm) and target_link_libraries(app hcomm::hcomm). */
#include <hcomm/api.h>

#include <stdio.h>

#define CHECK(call)                                                                                \
    do {                                                                                           \
        hcomm_result_t r_ = (call);                                                                \
        if (r_ != HCOMM_OK) {                                                                      \
            fprintf(stderr, "%s failed: %s (%s)\n", #call, hcomm_strerror(r_),                     \
                    hcomm_last_error());                                                           \
            return r_;                                                                             \
        }                                                                                          \
    } while (0)

static hcomm_result_t rank_main(hcomm_comm_t *world, void *arg) {
    (void)arg;
    hcomm_parallel_config_t cfg = {.tp = 2, .pp = 2, .dp = 2};
    hcomm_ctx_t *ctx = NULL;
    CHECK(hcomm_ctx_create(world, &cfg, &ctx));
    hcomm_comm_t *tp = NULL;
    CHECK(hcomm_ctx_group(ctx, HCOMM_GROUP_TP, &tp));
    int wr, tr, ts;
    CHECK(hcomm_comm_rank(world, &wr));
    CHECK(hcomm_ctx_rank(ctx, HCOMM_GROUP_TP, &tr, &ts));

    /* Each TP rank holds a [2, 3] slice of a [2, 6] activation (split along the last dim). */
    float part[2][3], full[2][6];
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 3; j++)
            part[i][j] = (float)(10 * i + 3 * tr + j);
    hcomm_tensor_t in, out;
    CHECK(hcomm_tensor_init(&in, part, HCOMM_F32, 2, (int64_t[]){2, 3}));
    CHECK(hcomm_tensor_init(&out, full, HCOMM_F32, 2, (int64_t[]){2, 3 * ts}));
    CHECK(hcomm_tp_all_gather(tp, &in, &out, -1));
    if (wr == 0)
        printf("rank 0 gathered row 1: %g %g %g %g %g %g\n", full[1][0], full[1][1], full[1][2],
               full[1][3], full[1][4], full[1][5]);
    return hcomm_ctx_destroy(ctx);
}

int main(void) {
    hcomm_result_t r = hcomm_launch(NULL, 8, rank_main, NULL);
    if (r != HCOMM_OK)
        fprintf(stderr, "hcomm_launch: %s (%s)\n", hcomm_strerror(r), hcomm_last_error());
    return r == HCOMM_OK ? 0 : 1;
}
