/* Training text, its byte vocabulary, the random streams and the batch sampler. */
#ifndef HCOMM_TRAIN_DATA_H_
#define HCOMM_TRAIN_DATA_H_

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* The text as vocabulary indices; the vocabulary is the distinct bytes of the training and
 * validation text, sorted. ids[0, train_len) is the training text, ids[train_len, len) the
 * held-out text: the last 10% of --data, or the file --val-data. */
typedef struct corpus {
    uint8_t *ids;       /* [len] vocabulary index of each byte */
    size_t len;         /* bytes in all */
    size_t train_len;   /* bytes of training text, at the start */
    int vocab;          /* distinct bytes */
    uint8_t chars[256]; /* vocabulary index -> byte */
} corpus_t;

/* Reads @p path (and @p val_path, or NULL to hold out the last 10% of @p path) into @p c.
 * Unless @p binary, a file with a NUL byte or more than 1% of bytes that are not printable
 * UTF-8 is refused. Returns 0, or -1 after writing why (and what to do) to err. */
int corpus_load(const char *path, const char *val_path, int binary, corpus_t *c, FILE *err);
/* FNV-1a of the training ids: tells a checkpoint which text it was trained on. */
uint64_t corpus_hash(const corpus_t *c);
void corpus_free(corpus_t *c);

/* splitmix64 (Steele, Lea, Flood 2014): one 64-bit state, so any (seed, stream) pair gives an
 * independent, reproducible sequence on every rank. */
typedef struct rng {
    uint64_t state;
} rng_t;

void rng_seed(rng_t *r, uint64_t seed, uint64_t stream);
uint64_t rng_next(rng_t *r);
/* Uniform in [0, n), n >= 1. */
uint64_t rng_below(rng_t *r, uint64_t n);
/* Standard normal (Box-Muller). */
double rng_normal(rng_t *r);

/* Draws @p batch sequence starts for sequences of @p seq characters from the training text:
 * each sequence at start s reads inputs s..s+seq-1, previous characters s-1.., and targets
 * s+1..s+seq. Needs c->train_len >= seq + 2. */
void batch_sample(rng_t *r, const corpus_t *c, int batch, int seq, int64_t *starts);
/* The @p count fixed starts of the validation sequences, spread evenly over the held-out text
 * (the same on every rank and every call). Needs len - train_len >= seq + 2. */
void val_starts(const corpus_t *c, int count, int seq, int64_t *starts);

#endif /* HCOMM_TRAIN_DATA_H_ */
