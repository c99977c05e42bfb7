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

/* Bytes of the UTF-8 sequence at b[0..n) that starts with a valid lead byte, or 0. */
static size_t utf8_len(const uint8_t *b, size_t n) {
    size_t k = b[0] >= 0xF0 && b[0] <= 0xF4 ? 4 : b[0] >= 0xE0 ? 3 : b[0] >= 0xC2 ? 2 : 0;
    if (b[0] >= 0xF8 || k == 0 || k > n)
        return 0;
    for (size_t i = 1; i < k; i++)
        if ((b[i] & 0xC0) != 0x80)
            return 0;
    return k;
}

/* Whether the bytes look like text: no NUL, and at most 1% control characters (other than
 * tab, newline, form feed and carriage return) or bytes outside valid UTF-8. Says why not. */
static int text_check(const char *path, const uint8_t *b, size_t len, FILE *err) {
    size_t bad = 0;
    for (size_t i = 0; i < len;) {
        if (b[i] == 0) {
            fprintf(err,
                    "hcomm-train: %s is not text: a NUL byte at offset %zu; pass --binary to "
                    "train on its bytes anyway\n",
                    path, i);
            return -1;
        }
        if (b[i] < 0x80) {
            bad += (b[i] < 0x20 && b[i] != '\t' && b[i] != '\n' && b[i] != '\f' && b[i] != '\r') ||
                   b[i] == 0x7F;
            i++;
            continue;
        }
        size_t k = utf8_len(b + i, len - i);
        bad += k == 0;
        i += k == 0 ? 1 : k;
    }
    if (bad * 100 > len) {
        fprintf(err,
                "hcomm-train: %s is not text: %zu of %zu bytes (%.1f%%, more than 1%%) are not "
                "printable UTF-8; pass --binary to train on its bytes anyway\n",
                path, bad, len, 100.0 * (double)bad / (double)len);
        return -1;
    }
    return 0;
}

/* Reads one input file whole; says why on failure. */
static uint8_t *load_one(const char *flag, const char *path, int binary, size_t *len, FILE *err) {
    uint8_t *bytes = read_file(path, len);
    if (bytes == NULL || *len == 0) {
        fprintf(err, "hcomm-train: cannot read %s %s: %s; pass %s with a text file\n", flag, path,
                bytes == NULL ? strerror(errno) : "the file is empty", flag);
        free(bytes);
        return NULL;
    }
    if (!binary && text_check(path, bytes, *len, err) != 0) {
        free(bytes);
        return NULL;
    }
    return bytes;
}

int corpus_load(const char *path, const char *val_path, int binary, corpus_t *c, FILE *err) {
    memset(c, 0, sizeof *c);
    size_t len = 0, vlen = 0;
    uint8_t *bytes = load_one("--data", path, binary, &len, err), *vbytes = NULL;
    if (bytes == NULL)
        return -1;
    if (val_path != NULL) {
        vbytes = load_one("--val-data", val_path, binary, &vlen, err);
        uint8_t *both = vbytes == NULL ? NULL : realloc(bytes, len + vlen);
        if (both == NULL) {
            free(bytes);
            free(vbytes);
            return -1;
        }
        bytes = both;
        memcpy(bytes + len, vbytes, vlen);
        free(vbytes);
    }
    c->train_len = val_path != NULL ? len : len - len / 10;
    len += vlen;
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

uint64_t corpus_hash(const corpus_t *c) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < c->train_len; i++)
        h = (h ^ c->chars[c->ids[i]]) * 0x100000001b3ull;
    return h;
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
    uint64_t choices = (uint64_t)c->train_len - (uint64_t)seq - 1;
    for (int b = 0; b < batch; b++)
        starts[b] = 1 + (int64_t)rng_below(r, choices);
}

void val_starts(const corpus_t *c, int count, int seq, int64_t *starts) {
    /* s ranges over train_len + 1 .. len - seq - 1, as in batch_sample. */
    uint64_t choices = (uint64_t)(c->len - c->train_len) - (uint64_t)seq - 1;
    for (int i = 0; i < count; i++)
        starts[i] = (int64_t)c->train_len + 1 + (int64_t)((uint64_t)i * choices / (uint64_t)count);
}
