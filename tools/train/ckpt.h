/* Checkpoints of hcomm-train: the full (unsharded) tensors, so that any layout can load them.
 *
 * One file per checkpoint, DIR/ckpt-NNNNNNNN.bin (NNNNNNNN: steps done), native byte order:
 *   "HCOMMCKP", u64 version (3: the model with attention), u64 fields: step, data RNG state,
 *   first loss (f64 bits), seed, hidden, experts, vocab, batch, seq, data hash, tp, pp, dp, ep,
 *   layers, tensor count, dtype (1 f64, 2 f32, 3 bf16), heads; the vocabulary (256 bytes); u64
 * FNV-1a of everything before it (the header checksum); then per tensor: u64 name length, name, u64
 * rows, u64 cols, rows*cols weights, as many momentum values, u64 FNV-1a of the tensor's record;
 * then "HCKPTEND". Values are f64 for --dtype f64, f32 for f32 and bf16 (whose master weights are
 *   f32), so a resumed run continues bit for bit; resuming with another --dtype is an error.
 * Writing is atomic: a temporary file is written, fsync'ed and renamed, then DIR/latest (the
 * file name, one line) is replaced the same way, so a crash at any point leaves `latest`
 * naming a complete checkpoint. */
#ifndef HCOMM_TRAIN_CKPT_H_
#define HCOMM_TRAIN_CKPT_H_

#include "data.h"
#include "opts.h"
#include "rt.h"
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
    void *w, *v; /* [rows * cols] weights and momentum, of ckpt_value_size(--dtype) bytes each */
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
/* Header code of --dtype @p dtype ("f64" 1, "f32" 2, "bf16" 3; 0 for anything else) and the
 * bytes of each stored value (8 for f64, else 4). */
int ckpt_dtype_code(const char *dtype);
size_t ckpt_value_size(const char *dtype);
/* Writes the checkpoint of the state after st->step steps into --save (world rank 0 only):
 * @p full holds the full tensors @p ts in order, each as weights then momentum, values of
 * ckpt_value_size() bytes. Returns 0, or -1 after saying what failed. */
int ckpt_write(const train_job_t *job, const train_state_t *st, const model_tensor_t *ts, int nt,
               const void *full);

#endif /* HCOMM_TRAIN_CKPT_H_ */
