/* Checkpoints of hcomm-train: the full (unsharded) tensors, so that any layout can load them.
 *
 * One file per checkpoint, DIR/ckpt-NNNNNNNN.bin (NNNNNNNN: steps done), native byte order:
 *   "HCOMMCKP", u64 version (1), u64 fields: step, data RNG state, first loss (f64 bits),
 *   seed, hidden, experts, vocab, batch, seq, data hash, tp, pp, dp, ep, layers, tensor count;
 *   the vocabulary (256 bytes); u64 FNV-1a of everything before it (the header checksum);
 *   then per tensor: u64 name length, name, u64 rows, u64 cols, rows*cols f64 weights, as
 *   many f64 momentum values, u64 FNV-1a of the tensor's record; then "HCKPTEND".
 * Writing is atomic: a temporary file is written, fsync'ed and renamed, then DIR/latest (the
 * file name, one line) is replaced the same way, so a crash at any point leaves `latest`
 * naming a complete checkpoint. */
#ifndef HCOMM_TRAIN_CKPT_H_
#define HCOMM_TRAIN_CKPT_H_

#include "data.h"
#include "model.h"
#include "opts.h"
#include "train.h"

/* What a resumed run continues from, besides the weights. */
typedef struct train_state {
    int step;          /* steps done */
    rng_t data_rng;    /* the batch sampler's stream after those steps */
    double first_loss; /* the loss of step 0: the divergence check compares with it */
} train_state_t;

typedef struct ckpt_tensor {
    char name[48];
    int64_t rows, cols;
    double *w, *v; /* [rows * cols] weights and momentum */
} ckpt_tensor_t;

typedef struct ckpt {
    char file[4200]; /* the file it was read from */
    uint64_t step, rng_state, seed, hidden, experts, vocab, batch, seq, data_hash;
    uint64_t tp, pp, dp, ep; /* the layout it was saved from (any layout loads it) */
    double first_loss;
    int ntensors;
    ckpt_tensor_t *t; /* in model_tensors() order */
    uint8_t *buf;     /* the file's bytes; w and v point into it */
} ckpt_t;

/* Reads the checkpoint @p path names (a --save directory: its `latest`; or a file) and checks
 * it against the options and the text. Returns 0, or -1 after saying which file and which
 * field is wrong to err. */
int ckpt_load(const char *path, const train_opts_t *o, const corpus_t *c, ckpt_t *ck, FILE *err);
void ckpt_free(ckpt_t *ck);
/* The step, sampler state and first loss stored in @p ck. */
void ckpt_state(const ckpt_t *ck, train_state_t *st);
/* Gathers the full tensors from their owners to world rank 0, which writes the checkpoint of
 * the state after st->step steps into o->save. Collective over the world. */
hcomm_result_t ckpt_save(const train_job_t *job, const model_t *m, train_rt_t *rt,
                         const train_state_t *st);

#endif /* HCOMM_TRAIN_CKPT_H_ */
