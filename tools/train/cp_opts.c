/* The attention and context-parallel flags of hcomm-train: their checks, and the attention
 * block size when --attn-block is not given. */
#include "opts.h"

#include <string.h>

static const char *const ALGOS[] = {"ring", "allgather", "ulysses", "a2a+p2p"};

/* Tokens of one sequence each CP rank holds as one contiguous piece of positions: the zigzag
 * chunk (ring, allgather, a2a+p2p) or the whole part (ulysses). */
static int chunk_len(const train_opts_t *o) {
    return strcmp(o->cp_algo, "ulysses") == 0 ? o->seq / o->cp : o->seq / (2 * o->cp);
}

/* The largest divisor of the chunk that is at most max(1, seq / 8). */
static int default_block(const train_opts_t *o) {
    int chunk = chunk_len(o), want = o->seq / 8 > 0 ? o->seq / 8 : 1, b = 1;
    for (int d = 1; d <= want && d <= chunk; d++)
        if (chunk % d == 0)
            b = d;
    return b;
}

static int check_algo(const train_opts_t *o, FILE *err) {
    for (size_t i = 0; i < sizeof ALGOS / sizeof ALGOS[0]; i++)
        if (strcmp(o->cp_algo, ALGOS[i]) == 0)
            return 0;
    fprintf(err, "hcomm-train: --cp-algo %s is unknown (ring, allgather, ulysses or a2a+p2p)\n",
            o->cp_algo);
    return -1;
}

static int check_heads(const train_opts_t *o, FILE *err) {
    if (!strcmp(o->cp_algo, "a2a+p2p") && o->cp_a2a > 0 && o->cp % o->cp_a2a != 0) {
        fprintf(err, "hcomm-train: --cp-a2a %d must divide --cp %d\n", o->cp_a2a, o->cp);
        return -1;
    }
    if (o->heads % o->tp != 0 || o->hidden % o->heads != 0) {
        fprintf(err,
                "hcomm-train: --heads %d must be divisible by --tp %d and divide --hidden %d "
                "(heads split over TP as Megatron does)\n",
                o->heads, o->tp, o->hidden);
        return -1;
    }
    int per = o->heads / o->tp, a2a = !strcmp(o->cp_algo, "a2a+p2p") ? o->cp_a2a : o->cp;
    if ((!strcmp(o->cp_algo, "ulysses") || (a2a > 0 && !strcmp(o->cp_algo, "a2a+p2p"))) &&
        per % a2a != 0) {
        fprintf(err,
                "hcomm-train: --cp-algo %s: the %d heads per TP rank (--heads %d / --tp %d) are "
                "not divisible by the %d Ulysses ranks\n",
                o->cp_algo, per, o->heads, o->tp, a2a);
        return -1;
    }
    return 0;
}

static int check_seq(const train_opts_t *o, FILE *err) {
    int ulysses = strcmp(o->cp_algo, "ulysses") == 0, parts = ulysses ? o->cp : 2 * o->cp;
    if (o->seq % parts != 0) {
        fprintf(err, "hcomm-train: --seq %d is not divisible by %s = %d (--cp-algo %s)\n", o->seq,
                ulysses ? "cp" : "2*cp", parts, o->cp_algo);
        return -1;
    }
    if (o->attn_block > 0 && chunk_len(o) % o->attn_block != 0) {
        fprintf(err,
                "hcomm-train: --attn-block %d does not divide the %d positions of a CP chunk "
                "(--seq %d over %s %d)\n",
                o->attn_block, chunk_len(o), o->seq, ulysses ? "cp" : "2*cp", parts);
        return -1;
    }
    return 0;
}

int opts_validate_cp(train_opts_t *o, FILE *err) {
    if (check_algo(o, err) != 0 || check_heads(o, err) != 0 || check_seq(o, err) != 0)
        return -1;
    if (o->sequence_parallel && (o->batch / o->dp / o->micro_batches) * o->seq / o->cp % o->tp) {
        fprintf(err,
                "hcomm-train: --sequence-parallel: the %d tokens of a micro-batch on a CP rank "
                "are not divisible by --tp %d\n",
                (o->batch / o->dp / o->micro_batches) * o->seq / o->cp, o->tp);
        return -1;
    }
    if (o->attn_block == 0)
        o->attn_block = default_block(o);
    return 0;
}
