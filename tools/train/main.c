/* hcomm-train: trains a small character-level language model with hcomm, over any layout of
 * tensor, pipeline, data and expert parallelism, with hand-written forward and backward.
 * Every byte between ranks goes through hcomm; the same seed gives the same losses on every
 * layout (see test/test_train_parity.sh). */
#include "ckpt.h"
#include "train.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int check_metrics_path(const char *path, FILE *err) {
    if (path == NULL)
        return 0;
    /* "a" tests that the file can be written without truncating it: with mpirun every process
     * runs this, and only world rank 0 writes the file later. */
    FILE *f = fopen(path, "a");
    if (f == NULL) {
        fprintf(err, "hcomm-train: cannot write --metrics %s: %s\n", path, strerror(errno));
        return -1;
    }
    fclose(f);
    return 0;
}

/* The first of the environment variables @p names that is set, as an integer; -1 if none is. */
static long env_first_int(const char *const *names) {
    for (; *names != NULL; names++) {
        const char *s = getenv(*names);
        if (s != NULL && s[0] != '\0')
            return strtol(s, NULL, 10);
    }
    return -1;
}

/* mpirun -np N with the local backend would run N copies of the whole job, all writing the
 * same --metrics file: refuse it. Only the launcher's rank 0 says why, so the reason shows once. */
/* Where the checks before the launch report: under mpirun every process runs them on the same
 * files, so only the launcher's rank 0 (or a process outside MPI) says what is wrong. */
static FILE *input_errors(void) {
    static const char *const rank_vars[] = {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK",
                                            "SLURM_PROCID", NULL};
    FILE *null = env_first_int(rank_vars) > 0 ? fopen("/dev/null", "w") : NULL;
    return null != NULL ? null : stderr;
}

static int check_not_duplicated(const train_opts_t *o) {
    static const char *const size_vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", NULL};
    static const char *const rank_vars[] = {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", NULL};
    long procs = env_first_int(size_vars);
    if (strcmp(opts_backend(o), "local") != 0 || procs <= 1)
        return 0;
    if (env_first_int(rank_vars) <= 0)
        fprintf(stderr,
                "hcomm-train: started by mpirun with %ld processes but --backend local; pass "
                "--backend mpi (or HCOMM_BACKEND=mpi)\n",
                procs);
    return -1;
}

/* Whether every byte of @p s is in the vocabulary. */
static int readable(const corpus_t *c, const char *s) {
    for (; *s != '\0'; s++)
        if (memchr(c->chars, (unsigned char)*s, (size_t)c->vocab) == NULL)
            return 0;
    return 1;
}

/* Checks that the text is long enough for its sequences and that the prompt can be read; picks
 * the default prompt: "The ", or the text's first characters where it has no "The ". */
static int check_corpus(train_opts_t *o, const corpus_t *c, FILE *err) {
    static char first[5];
    if (o->prompt == NULL && readable(c, "The ")) {
        o->prompt = "The ";
    } else if (o->prompt == NULL) {
        for (size_t i = 0; i < 4 && i < c->len; i++)
            first[i] = (char)c->chars[c->ids[i]];
        o->prompt = first;
    }
    const size_t val = c->len - c->train_len, need = (size_t)o->seq + 2;
    if (c->train_len < need || val < need) {
        fprintf(err,
                "hcomm-train: --data %s has %zu bytes of training text and %zu held out; --seq "
                "%d needs at least %zu of each (the held-out part is the last 10%% of --data, "
                "or --val-data)\n",
                o->data, c->train_len, val, o->seq, need);
        return -1;
    }
    for (const char *p = o->sample > 0 ? o->prompt : ""; *p != '\0'; p++) {
        if (memchr(c->chars, (unsigned char)*p, (size_t)c->vocab) == NULL) {
            fprintf(err,
                    "hcomm-train: --prompt: the character '%c' (byte 0x%02x) never occurs in the "
                    "text, so the model cannot read it; use characters of --data\n",
                    *p, (unsigned char)*p);
            return -1;
        }
    }
    return 0;
}

int main(int argc, char **argv) {
    train_opts_t opts;
    corpus_t corpus;
    if (opts_parse(argc, argv, &opts, stderr) != 0)
        return 2;
    if (opts.help) {
        opts_usage(stdout);
        return 0;
    }
    if (opts.version) {
        int major, minor, patch;
        const char *backends;
        hcomm_version(&major, &minor, &patch, &backends);
        printf("hcomm-train %s (hcomm library %d.%d.%d; backends: %s)\n", HCOMM_VERSION_STRING,
               major, minor, patch, backends);
        return 0;
    }
    if (check_not_duplicated(&opts) != 0)
        return 2;
    FILE *err = input_errors();
    int bad = corpus_load(opts.data, opts.val_data, opts.binary, &corpus, err) != 0;
    ckpt_t ck = {0};
    bad = bad || check_corpus(&opts, &corpus, err) != 0 ||
          check_metrics_path(opts.metrics, err) != 0 ||
          (opts.resume != NULL && ckpt_load(opts.resume, &opts, &corpus, &ck, err) != 0);
    bool quiet = err != stderr;
    if (quiet)
        fclose(err);
    if (bad) {
        /* Under mpirun every process refuses the input and rank 0 says why; mpirun ends the job
         * at the first failed exit, so the others wait a little before theirs (under a
         * sanitizer rank 0 was killed before it had written the reason). */
        if (quiet)
            sleep(2);
        corpus_free(&corpus);
        return 1;
    }
    atomic_int explained = 0;
    train_job_t job = {&opts, &corpus, opts.resume != NULL ? &ck : NULL, &explained};
    hcomm_rank_fn_t body = strcmp(opts.dtype, "f64") == 0 ? train_rank_f64 : train_rank_f32;
    hcomm_result_t r = hcomm_launch(opts_backend(&opts), opts_world_size(&opts), body, &job);
    if (r != HCOMM_OK && atomic_load(&explained) == 0) {
        fprintf(stderr, "hcomm-train: training failed: %s: %s\n", hcomm_result_name(r),
                hcomm_last_error());
        if (r == HCOMM_ERR_INVALID_ARG && strcmp(opts_backend(&opts), "mpi") == 0)
            fprintf(stderr,
                    "hcomm-train: with --backend mpi the world size tp*cp*pp*dp = %d must "
                    "equal the number of processes mpirun starts\n",
                    opts_world_size(&opts));
    }
    ckpt_free(&ck);
    corpus_free(&corpus);
    return r == HCOMM_OK ? 0 : 1;
}
