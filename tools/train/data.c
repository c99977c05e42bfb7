/* Training text, its byte vocabulary, the random streams and the batch sampler. */
#include "data.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Reads the whole file; NULL with errno set on failure. */
static uint8_t *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return NULL;
    size_t cap = 1 << 16, n = 0;
    uint8_t *buf = malloc(cap);
    int saved_errno = ENOMEM;
    while (buf != NULL) {
        errno = 0;
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap)
            break;
        uint8_t *bigger = realloc(buf, cap * 2);
        if (bigger == NULL) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = bigger;
        cap *= 2;
    }
    /* The failed fread left the reason in errno (EISDIR for a directory): keep it. */
    if (buf != NULL && ferror(f)) {
        saved_errno = errno != 0 ? errno : EIO;
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf == NULL)
        errno = saved_errno;
    *len = n;
    return buf;
}

int corpus_load(const char *path, corpus_t *c, FILE *err) {
    memset(c, 0, sizeof *c);
    size_t len = 0;
    uint8_t *bytes = read_file(path, &len);
    if (bytes == NULL || len == 0) {
        fprintf(err, "hcomm-train: cannot read --data %s: %s; pass --data with a text file\n", path,
                bytes == NULL ? strerror(errno) : "the file is empty");
        free(bytes);
        return -1;
    }
    /* Vocabulary: the distinct bytes in ascending order, so every rank builds the same one. */
    int index[256], seen[256] = {0};
    for (size_t i = 0; i < len; i++)
        seen[bytes[i]] = 1;
    for (int b = 0; b < 256; b++) {
        index[b] = c->vocab;
        if (seen[b])
            c->chars[c->vocab++] = (uint8_t)b;
    }
    for (size_t i = 0; i < len; i++)
        bytes[i] = (uint8_t)index[bytes[i]];
    c->ids = bytes;
    c->len = len;
    return 0;
}

void corpus_free(corpus_t *c) {
    free(c->ids);
    memset(c, 0, sizeof *c);
}

void rng_seed(rng_t *r, uint64_t seed, uint64_t stream) {
    r->state = seed ^ (stream * 0xD1B54A32D192ED03ull);
    (void)rng_next(r);
}

uint64_t rng_next(rng_t *r) {
    uint64_t z = (r->state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

uint64_t rng_below(rng_t *r, uint64_t n) {
    return rng_next(r) % n;
}

double rng_normal(rng_t *r) {
    /* u1 in (0, 1] keeps log() finite. */
    double u1 = ((double)(rng_next(r) >> 11) + 1.0) * 0x1.0p-53;
    double u2 = (double)(rng_next(r) >> 11) * 0x1.0p-53;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

void batch_sample(rng_t *r, const corpus_t *c, int batch, int seq, int64_t *starts) {
    /* s ranges over 1 .. len - seq - 1: s - 1 and s + seq must be inside the text. */
    uint64_t choices = (uint64_t)c->len - (uint64_t)seq - 1;
    for (int b = 0; b < batch; b++)
        starts[b] = 1 + (int64_t)rng_below(r, choices);
}
