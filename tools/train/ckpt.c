/* Checkpoints of hcomm-train: gather, atomic write, load and checks (format in ckpt.h). */
#include "ckpt.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define CKPT_MAGIC "HCOMMCKP"
#define CKPT_END "HCKPTEND"
enum { CKPT_VERSION = 3, CKPT_NFIELDS = 18 };

/* The header's u64 fields after the version, in file order. */
static const char *const FIELD_NAMES[CKPT_NFIELDS] = {
    "step",  "data_rng", "first_loss", "seed",      "hidden", "experts",
    "vocab", "batch",    "seq",        "data_hash", "tp",     "pp",
    "dp",    "ep",       "layers",     "tensors",   "dtype",  "heads"};

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}
#define FNV0 0xcbf29ce484222325ull

/* The header's code of each --dtype (0 is no dtype: a corrupt field). */
static const char *const DTYPES[] = {"?", "f64", "f32", "bf16"};

int ckpt_dtype_code(const char *dtype) {
    for (int i = 1; i < (int)(sizeof DTYPES / sizeof DTYPES[0]); i++)
        if (strcmp(dtype, DTYPES[i]) == 0)
            return i;
    return 0;
}

size_t ckpt_value_size(const char *dtype) {
    return strcmp(dtype, "f64") == 0 ? 8 : 4; /* bf16 keeps f32 master weights */
}

/* ---------------------------------------------------------------- writing */

/* A file being written, with the checksum of the current record. */
typedef struct wfile {
    FILE *f;
    uint64_t sum;
    int bad;
} wfile_t;

static void w_bytes(wfile_t *w, const void *p, size_t n) {
    w->sum = fnv(w->sum, p, n);
    if (n > 0 && fwrite(p, 1, n, w->f) != n)
        w->bad = 1;
}

static void w_u64(wfile_t *w, uint64_t v) {
    w_bytes(w, &v, sizeof v);
}

/* Ends a record with its checksum and starts the next one. */
static void w_sum(wfile_t *w) {
    uint64_t s = w->sum;
    w_bytes(w, &s, sizeof s);
    w->sum = FNV0;
}

/* Test hook: HCOMM_TRAIN_TEST_SAVE_DELAY=seconds pauses a save half-way through its file, so
 * that a test can kill the run while it writes. */
static void test_delay(void) {
    const char *s = getenv("HCOMM_TRAIN_TEST_SAVE_DELAY");
    double d = s != NULL ? strtod(s, NULL) : 0.0;
    if (d > 0) {
        struct timespec ts = {(time_t)d, (long)((d - (double)(time_t)d) * 1e9)};
        nanosleep(&ts, NULL);
    }
}

/* fsync of a directory, so that a rename in it is on disk. */
static int sync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY);
    if (fd < 0)
        return -1;
    int r = fsync(fd);
    close(fd);
    return r;
}

/* Writes @p tmp, fsyncs it and renames it to @p final; says what failed. */
static int commit_file(FILE *f, int bad, const char *tmp, const char *final) {
    if (bad || fflush(f) != 0 || fsync(fileno(f)) != 0) {
        fprintf(stderr, "hcomm-train: writing checkpoint %s failed: %s\n", tmp, strerror(errno));
        fclose(f);
        return -1;
    }
    if (fclose(f) != 0 || rename(tmp, final) != 0) {
        fprintf(stderr, "hcomm-train: cannot rename %s to %s: %s\n", tmp, final, strerror(errno));
        return -1;
    }
    return 0;
}

int ckpt_write(const train_job_t *job, const train_state_t *st, const model_tensor_t *ts, int nt,
               const void *full) {
    const train_opts_t *o = job->opts;
    char name[64], path[4200], tmp[4200];
    if (mkdir(o->save, 0777) != 0 && errno != EEXIST) {
        fprintf(stderr, "hcomm-train: cannot create --save %s: %s\n", o->save, strerror(errno));
        return -1;
    }
    snprintf(name, sizeof name, "ckpt-%08d.bin", st->step);
    snprintf(path, sizeof path, "%s/%s", o->save, name);
    snprintf(tmp, sizeof tmp, "%s/.%s.tmp", o->save, name);
    wfile_t w = {fopen(tmp, "wb"), FNV0, 0};
    if (w.f == NULL) {
        fprintf(stderr, "hcomm-train: cannot write checkpoint %s: %s\n", tmp, strerror(errno));
        return -1;
    }
    uint64_t first;
    memcpy(&first, &st->first_loss, sizeof first);
    const uint64_t fields[] = {(uint64_t)st->step,
                               st->data_rng.state,
                               first,
                               o->seed,
                               (uint64_t)o->hidden,
                               (uint64_t)o->experts,
                               (uint64_t)job->corpus->vocab,
                               (uint64_t)o->batch,
                               (uint64_t)o->seq,
                               corpus_hash(job->corpus),
                               (uint64_t)o->tp,
                               (uint64_t)o->pp,
                               (uint64_t)o->dp,
                               (uint64_t)o->ep,
                               (uint64_t)o->layers,
                               (uint64_t)nt,
                               (uint64_t)ckpt_dtype_code(o->dtype),
                               (uint64_t)o->heads};
    /* A field left out would be written as 0 by a sized initializer: count them instead. */
    _Static_assert(sizeof fields / sizeof fields[0] == CKPT_NFIELDS, "one value per field name");
    w_bytes(&w, CKPT_MAGIC, 8);
    w_u64(&w, CKPT_VERSION);
    for (int i = 0; i < CKPT_NFIELDS; i++)
        w_u64(&w, fields[i]);
    uint8_t chars[256] = {0};
    memcpy(chars, job->corpus->chars, (size_t)job->corpus->vocab);
    w_bytes(&w, chars, sizeof chars);
    w_sum(&w);
    const size_t elem = ckpt_value_size(o->dtype);
    size_t off = 0;
    for (int i = 0; i < nt; i++) {
        const size_t n = (size_t)(ts[i].rows * ts[i].cols);
        w_u64(&w, strlen(ts[i].name));
        w_bytes(&w, ts[i].name, strlen(ts[i].name));
        w_u64(&w, (uint64_t)ts[i].rows);
        w_u64(&w, (uint64_t)ts[i].cols);
        w_bytes(&w, (const char *)full + off, 2 * n * elem);
        w_sum(&w);
        off += 2 * n * elem;
        if (i == nt / 2)
            test_delay();
    }
    w_bytes(&w, CKPT_END, 8);
    if (commit_file(w.f, w.bad, tmp, path) != 0)
        return -1;
    /* Only now does `latest` move: before this point a crash leaves the previous one. */
    snprintf(path, sizeof path, "%s/latest", o->save);
    snprintf(tmp, sizeof tmp, "%s/.latest.tmp", o->save);
    FILE *f = fopen(tmp, "w");
    if (f == NULL) {
        fprintf(stderr, "hcomm-train: cannot write %s: %s\n", tmp, strerror(errno));
        return -1;
    }
    int bad = fprintf(f, "%s\n", name) < 0;
    if (commit_file(f, bad, tmp, path) != 0 || sync_dir(o->save) != 0)
        return -1;
    return 0;
}

/* ---------------------------------------------------------------- reading */

/* A checkpoint in memory and the read position; errors name the file and the field. */
typedef struct rfile {
    const char *path;
    const uint8_t *b;
    size_t len, pos;
    FILE *err;
} rfile_t;

static int r_bytes(rfile_t *r, const char *field, void *dst, size_t n, const void **at) {
    if (r->len - r->pos < n) {
        fprintf(r->err,
                "hcomm-train: checkpoint %s is truncated: field '%s' needs %zu bytes at offset "
                "%zu, the file has %zu\n",
                r->path, field, n, r->pos, r->len);
        return -1;
    }
    if (dst != NULL)
        memcpy(dst, r->b + r->pos, n);
    if (at != NULL)
        *at = r->b + r->pos;
    r->pos += n;
    return 0;
}

static int r_u64(rfile_t *r, const char *field, uint64_t *v) {
    return r_bytes(r, field, v, sizeof *v, NULL);
}

/* Checks the checksum of the record that started at @p from. */
static int r_sum(rfile_t *r, const char *field, size_t from) {
    uint64_t stored, have = fnv(FNV0, r->b + from, r->pos - from);
    if (r_u64(r, field, &stored) != 0)
        return -1;
    if (stored != have) {
        fprintf(r->err,
                "hcomm-train: checkpoint %s is corrupt: the checksum of %s does not match "
                "(stored %016llx, computed %016llx)\n",
                r->path, field, (unsigned long long)stored, (unsigned long long)have);
        return -1;
    }
    return 0;
}

/* A header field that must equal what this run has. */
static int expect(const ckpt_t *ck, FILE *err, const char *field, uint64_t have, uint64_t want,
                  const char *flag) {
    if (have == want)
        return 0;
    fprintf(err,
            "hcomm-train: checkpoint %s does not fit this run: field '%s' is %llu, but %s is "
            "%llu; resume with the flags it was saved with\n",
            ck->file, field, (unsigned long long)have, flag, (unsigned long long)want);
    return -1;
}

static int read_header(rfile_t *r, ckpt_t *ck, const train_opts_t *o, const corpus_t *c) {
    char magic[8];
    uint64_t version, f[CKPT_NFIELDS];
    uint8_t chars[256], want_chars[256] = {0};
    if (r_bytes(r, "magic", magic, 8, NULL) != 0)
        return -1;
    if (memcmp(magic, CKPT_MAGIC, 8) != 0) {
        fprintf(r->err, "hcomm-train: %s is not an hcomm-train checkpoint (field 'magic')\n",
                r->path);
        return -1;
    }
    if (r_u64(r, "version", &version) != 0)
        return -1;
    for (int i = 0; i < CKPT_NFIELDS; i++)
        if (r_u64(r, FIELD_NAMES[i], &f[i]) != 0)
            return -1;
    if (r_bytes(r, "vocabulary", chars, sizeof chars, NULL) != 0 ||
        r_sum(r, "the header (fields version..vocabulary)", 0) != 0)
        return -1;
    if (version != CKPT_VERSION) {
        fprintf(r->err,
                "hcomm-train: checkpoint %s: field 'version' is %llu; this hcomm-train "
                "reads version %d\n",
                r->path, (unsigned long long)version, CKPT_VERSION);
        return -1;
    }
    ck->step = f[0];
    ck->rng_state = f[1];
    memcpy(&ck->first_loss, &f[2], sizeof f[2]);
    ck->seed = f[3];
    ck->tp = f[10];
    ck->pp = f[11];
    ck->dp = f[12];
    ck->ep = f[13];
    memcpy(want_chars, c->chars, (size_t)c->vocab);
    if (expect(ck, r->err, "hidden", f[4], (uint64_t)o->hidden, "--hidden") != 0 ||
        expect(ck, r->err, "experts", f[5], (uint64_t)o->experts, "--experts") != 0 ||
        expect(ck, r->err, "vocab", f[6], (uint64_t)c->vocab, "the vocabulary of --data") != 0 ||
        expect(ck, r->err, "batch", f[7], (uint64_t)o->batch, "--batch") != 0 ||
        expect(ck, r->err, "seq", f[8], (uint64_t)o->seq, "--seq") != 0 ||
        expect(ck, r->err, "layers", f[14], (uint64_t)o->layers, "--layers") != 0 ||
        expect(ck, r->err, "heads", f[17], (uint64_t)o->heads, "--heads") != 0)
        return -1;
    if (f[16] != (uint64_t)ckpt_dtype_code(o->dtype)) {
        fprintf(r->err,
                "hcomm-train: checkpoint %s does not fit this run: field 'dtype' is %s, but "
                "--dtype is %s; resume with --dtype %s (a checkpoint is not converted between "
                "precisions)\n",
                ck->file, f[16] < 4 ? DTYPES[f[16]] : "unknown", o->dtype,
                f[16] < 4 ? DTYPES[f[16]] : "of the saving run");
        return -1;
    }
    if (f[9] != corpus_hash(c) || memcmp(chars, want_chars, sizeof chars) != 0) {
        fprintf(r->err,
                "hcomm-train: checkpoint %s does not fit this run: fields 'data_hash' and "
                "'vocabulary' say it was trained on other text than --data %s\n",
                ck->file, o->data);
        return -1;
    }
    if (ck->step >= (uint64_t)o->steps) {
        fprintf(r->err,
                "hcomm-train: checkpoint %s is at step %llu and --steps is %d: nothing left to "
                "train (--steps is the total, also when resuming)\n",
                ck->file, (unsigned long long)ck->step, o->steps);
        return -1;
    }
    ck->ntensors = (int)f[15];
    return 0;
}

static int read_tensors(rfile_t *r, ckpt_t *ck, const train_opts_t *o, int vocab) {
    const size_t elem = ckpt_value_size(o->dtype);
    model_tensor_t *ts = train_alloc((size_t)model_num_tensors(o) * sizeof *ts);
    const int nt = model_tensors(o, vocab, ts);
    int bad = expect(ck, r->err, "tensors", (uint64_t)ck->ntensors, (uint64_t)nt, "the model's");
    ck->ntensors = bad ? 0 : nt;
    ck->t = bad ? NULL : calloc((size_t)nt, sizeof *ck->t);
    for (int i = 0; i < nt && !bad; i++) {
        ckpt_tensor_t *t = &ck->t[i];
        char field[96];
        uint64_t nlen, rows, cols;
        const size_t from = r->pos;
        const void *w = NULL;
        snprintf(field, sizeof field, "tensor %d (%s) name", i, ts[i].name);
        bad = r_u64(r, field, &nlen) != 0 || nlen >= sizeof t->name ||
              r_bytes(r, field, t->name, (size_t)nlen, NULL) != 0;
        snprintf(field, sizeof field, "tensor %s shape", ts[i].name);
        bad = bad || r_u64(r, field, &rows) != 0 || r_u64(r, field, &cols) != 0;
        if (!bad && (strcmp(t->name, ts[i].name) != 0 || rows != (uint64_t)ts[i].rows ||
                     cols != (uint64_t)ts[i].cols)) {
            fprintf(r->err,
                    "hcomm-train: checkpoint %s does not fit this run: tensor %d is '%s' "
                    "[%llu, %llu], the model's is '%s' [%lld, %lld]\n",
                    ck->file, i, t->name, (unsigned long long)rows, (unsigned long long)cols,
                    ts[i].name, (long long)ts[i].rows, (long long)ts[i].cols);
            bad = 1;
        }
        snprintf(field, sizeof field, "tensor %s values", ts[i].name);
        bad = bad || r_bytes(r, field, NULL, 2 * rows * cols * elem, &w) != 0;
        snprintf(field, sizeof field, "tensor '%s'", ts[i].name);
        bad = bad || r_sum(r, field, from) != 0;
        if (!bad) {
            t->rows = (int64_t)rows;
            t->cols = (int64_t)cols;
            /* The values sit at an offset that is a multiple of 8 in a malloc'ed buffer
             * only by chance of the name length: copy them out aligned. */
            t->w = train_alloc(2 * rows * cols * elem);
            memcpy(t->w, w, 2 * rows * cols * elem);
            t->v = (char *)t->w + rows * cols * elem;
        }
    }
    char end[8];
    bad = bad || r_bytes(r, "end marker", end, 8, NULL) != 0;
    if (!bad && (memcmp(end, CKPT_END, 8) != 0 || r->pos != r->len)) {
        fprintf(r->err,
                "hcomm-train: checkpoint %s is corrupt: field 'end marker' is wrong or "
                "followed by extra bytes\n",
                r->path);
        bad = 1;
    }
    free(ts);
    return bad ? -1 : 0;
}

/* The checkpoint file @p path names: a file itself, or a directory's `latest`. */
static int resolve(const char *path, char *file, size_t size, FILE *err) {
    struct stat sb;
    if (stat(path, &sb) != 0) {
        fprintf(err, "hcomm-train: cannot read --resume %s: %s\n", path, strerror(errno));
        return -1;
    }
    if (!S_ISDIR(sb.st_mode)) {
        snprintf(file, size, "%s", path);
        return 0;
    }
    char latest[4200], name[256] = "";
    snprintf(latest, sizeof latest, "%s/latest", path);
    FILE *f = fopen(latest, "r");
    if (f == NULL || fgets(name, sizeof name, f) == NULL) {
        fprintf(err,
                "hcomm-train: cannot read %s: %s; --resume takes a directory written by --save\n",
                latest, f == NULL ? strerror(errno) : "it is empty");
        if (f != NULL)
            fclose(f);
        return -1;
    }
    fclose(f);
    name[strcspn(name, "\n")] = '\0';
    if (name[0] == '\0' || strchr(name, '/') != NULL) {
        fprintf(err, "hcomm-train: %s is corrupt: '%s' is not a checkpoint file name\n", latest,
                name);
        return -1;
    }
    snprintf(file, size, "%s/%s", path, name);
    return 0;
}

int ckpt_load(const char *path, const train_opts_t *o, const corpus_t *c, ckpt_t *ck, FILE *err) {
    memset(ck, 0, sizeof *ck);
    if (resolve(path, ck->file, sizeof ck->file, err) != 0)
        return -1;
    FILE *f = fopen(ck->file, "rb");
    struct stat sb;
    if (f == NULL || fstat(fileno(f), &sb) != 0) {
        fprintf(err, "hcomm-train: cannot read checkpoint %s: %s\n", ck->file, strerror(errno));
        if (f != NULL)
            fclose(f);
        return -1;
    }
    ck->buf = train_alloc((size_t)sb.st_size);
    size_t len = fread(ck->buf, 1, (size_t)sb.st_size, f);
    fclose(f);
    rfile_t r = {ck->file, ck->buf, len, 0, err};
    if (read_header(&r, ck, o, c) != 0 || read_tensors(&r, ck, o, c->vocab) != 0) {
        ckpt_free(ck);
        return -1;
    }
    return 0;
}

void ckpt_free(ckpt_t *ck) {
    for (int i = 0; ck->t != NULL && i < ck->ntensors; i++)
        free(ck->t[i].w);
    free(ck->t);
    free(ck->buf);
    memset(ck, 0, sizeof *ck);
}

void ckpt_state(const ckpt_t *ck, train_state_t *st) {
    st->step = (int)ck->step;
    st->data_rng.state = ck->rng_state;
    st->first_loss = ck->first_loss;
}
