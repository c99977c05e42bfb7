/* Command-line options of hcomm-train: one table lists every flag, its default and its help,
 * so parsing, defaults and --help never drift apart. */
#include "opts.h"

#include "hcomm/core.h"

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* OPT_FLAG takes no value and sets an int to 1. */
typedef enum opt_kind { OPT_INT, OPT_U64, OPT_DOUBLE, OPT_STRING, OPT_FLAG } opt_kind_t;

/* Bits of opt_def_t.open: which ends of a number flag's range are excluded. */
enum { LO_OPEN = 1, HI_OPEN = 2 };

typedef struct opt_def {
    const char *name; /* without the leading "--" */
    opt_kind_t kind;
    size_t offset;     /* of the field in train_opts_t */
    const char *deflt; /* default, parsed like a command-line value; NULL: opts_parse picks it */
    const char *shown; /* the default as --help shows it */
    const char *help;
    double lo, hi; /* allowed values of OPT_INT and OPT_DOUBLE flags */
    int open;      /* OPT_DOUBLE: LO_OPEN | HI_OPEN */
} opt_def_t;

#define OPT_(name, kind, field, deflt, shown, help, lo, hi, open)                                  \
    { name, kind, offsetof(train_opts_t, field), deflt, shown, help, lo, hi, open }
#define OPT_INT_(name, field, deflt, lo, hi, help)                                                 \
    OPT_(name, OPT_INT, field, deflt, deflt, help, lo, hi, 0)
#define OPT_DBL_(name, field, deflt, lo, hi, open, help)                                           \
    OPT_(name, OPT_DOUBLE, field, deflt, deflt, help, lo, hi, open)
#define OPT_STR_(name, field, deflt, help)                                                         \
    OPT_(name, OPT_STRING, field, deflt, deflt, help, 0, 0, 0)

static const opt_def_t OPTS[] = {
    OPT_INT_("tp", tp, "2", 1, 4096, "tensor-parallel size (also the expert-TP size)"),
    OPT_INT_("pp", pp, "2", 1, 4096,
             "pipeline stages, at most the units: embed, --layers x (TP block, MoE), head"),
    OPT_INT_("dp", dp, "2", 1, 4096, "data-parallel size; world size = tp * cp * pp * dp"),
    OPT_INT_("cp", cp, "1", 1, 4096, "context-parallel size: each sequence split over cp ranks"),
    OPT_STR_("cp-algo", cp_algo, "ring",
             "how CP ranks see each other's keys: ring (KV ring, zigzag split), allgather (KV "
             "all_gather, zigzag), ulysses (all-to-all of heads; heads/tp divisible by cp), "
             "a2a+p2p (Ulysses in a node, ring across; --cp-a2a)"),
    OPT_INT_("cp-a2a", cp_a2a, "0", 0, 4096,
             "a2a+p2p: ranks per Ulysses group; 0: the ranks per node (hosts or HCOMM_TOPO)"),
    OPT_INT_("heads", heads, "8", 1, 4096, "attention heads; divisible by --tp, dividing --hidden"),
    OPT_("attn-block", OPT_INT, attn_block, NULL, "seq/8 (a divisor of a CP chunk)",
         "keys per attention block, merged in ascending order on every layout", 1, 1 << 20, 0),
    OPT_("sequence-parallel", OPT_FLAG, sequence_parallel, NULL, "off",
         "Megatron's sequence parallelism: outside the TP block each TP rank keeps 1/tp of the "
         "tokens",
         0, 0, 0),
    OPT_("ep", OPT_INT, ep, NULL, "2 if 2 divides --dp and --experts, else 1",
         "expert-parallel size; must divide dp and --experts", 1, 4096, 0),
    OPT_INT_("experts", experts, "4", 1, 4096, "experts in the MoE layer"),
    OPT_INT_("topk", topk, "1", 1, 4096,
             "experts per token: the top-k of the router's softmax, weighted by their "
             "probabilities (not renormalized); at most --experts"),
    OPT_DBL_("capacity-factor", capacity_factor, "0", 0.0, 1e6, 0,
             "0: dropless; X > 0: each expert takes at most ceil(T*k/E * X) slots per source "
             "rank, the earliest (T: the most tokens of any EP rank)"),
    OPT_INT_("hidden", hidden, "64", 1, 4096, "model width C (TP FFN 4C, expert FFN 2C)"),
    OPT_INT_("layers", layers, "1", 1, 256, "(TP block, MoE) pairs stacked between embed and head"),
    OPT_INT_("steps", steps, "300", 1, 100000000, "optimizer steps"),
    OPT_INT_("micro-batches", micro_batches, "2", 1, 1 << 20, "micro-batches per step per DP rank"),
    OPT_INT_("batch", batch, "16", 1, 1 << 20, "global batch in sequences; divisible by dp*micro"),
    OPT_INT_("seq", seq, "32", 1, 1 << 20, "characters per sequence"),
    OPT_("seed", OPT_U64, seed, "1234", "1234", "seed of the weights and of the data sampler", 0, 0,
         0),
    OPT_DBL_("lr", lr, "0.3", 0.0, 100.0, LO_OPEN, "SGD learning rate, 0 < lr <= 100"),
    OPT_DBL_("momentum", momentum, "0.9", 0.0, 1.0, HI_OPEN, "SGD momentum, 0 <= m < 1"),
    OPT_("backend", OPT_STRING, backend, NULL,
         "$HCOMM_BACKEND, else mpi under mpirun/srun, else local",
         "local (ranks are threads) or mpi (mpirun)", 0, 0, 0),
    OPT_STR_("data", data, "/usr/share/common-licenses/GPL-3", "training text file"),
    OPT_STR_("metrics", metrics, "", "write CSV step,loss,... to this file"),
    OPT_INT_("log-every", log_every, "10", 1, 1 << 30, "steps between progress lines"),
    OPT_STR_("dtype", dtype, "f64",
             "compute precision: f64; f32; bf16 (bf16 weights, activations and PP/TP/EP "
             "messages; f32 sums, master weights and DP gradients). Per-step losses vs the "
             "1-rank run of the same dtype: f64 equal in all 10 digits of --metrics; f32 "
             "within 1e-5 relative, bf16 within 5e-2 (TP shards sum in another order; "
             "measured 4e-8 and 2e-3 over 40 steps)"),
    OPT_STR_("schedule", schedule, "gpipe",
             "pipeline schedule: gpipe (all forwards, then all backwards), 1f1b, or "
             "interleaved (1F1B over --virtual-stages chunks per stage; micro-batches "
             "divisible by pp)"),
    OPT_INT_("virtual-stages", virtual_stages, "1", 1, 4096,
             "model chunks per pipeline stage (--schedule interleaved)"),
    OPT_INT_("dp-overlap", dp_overlap, "1", 0, 1,
             "1: reduce DP gradient buckets during backward (DDP-style); 0: after it"),
    OPT_INT_("zero", zero, "0", 0, 3,
             "ZeRO stage: 0 replicated DP; 1 momentum sharded; 2 gradients too; 3 parameters "
             "too, gathered per unit just in time (tools/train/real/zero.c)"),
    OPT_("dp-shard", OPT_INT, dp_shard, "0", "--dp",
         "with --zero: DP ranks sharing one copy of "
         "the state (divides --dp; the rest of --dp replicates it, HSDP)",
         0, 4096, 0),
    OPT_INT_("deterministic", deterministic, "1", 0, 1,
             "1: every reduction gives the serial rank-order bits whatever algorithm runs "
             "(hcomm_comm_set_deterministic), so f64 losses equal the 1-rank run on any layout "
             "and backend; 0: the faster algorithms' own order"),
    OPT_STR_("val-data", val_data, "", "held-out text (default: the last 10% of --data)"),
    OPT_INT_("eval-every", eval_every, "50", 1, 1 << 30,
             "steps between validation losses (also at the end)"),
    OPT_("binary", OPT_FLAG, binary, NULL, "off",
         "train on a file that is not text (NUL bytes, >1% non-UTF-8)", 0, 0, 0),
    OPT_INT_("sample", sample, "200", 0, 1 << 20, "characters to generate at the end; 0: none"),
    OPT_("prompt", OPT_STRING, prompt, NULL,
         "\"The \" if --data has those characters, else its first 4", "text the sample continues",
         0, 0, 0),
    OPT_DBL_("temperature", temperature, "0.8", 0.0, 100.0, 0,
             "sampling temperature; 0: greedy (seeded by --seed)"),
    OPT_STR_("save", save, "", "checkpoint directory, written every --save-every and at the end"),
    OPT_INT_("save-every", save_every, "0", 0, 100000000,
             "steps between checkpoints; 0: only at the end"),
    OPT_STR_("resume", resume, "",
             "continue from the latest checkpoint in this directory; --steps stays the total"),
    OPT_INT_("max-failures", max_failures, "0", 0, 4096,
             "lost ranks the run survives in the job: the survivors shrink the world, drop the "
             "replicas that lost a member and redo the step with a smaller --dp (needs --ep 1, "
             "and --zero 0 or HSDP, --dp-shard < --dp, whose shard groups are the replicas; on "
             "mpi, every rank on one host under mpirun --enable-recovery)"),
    OPT_STR_("inject-failure", inject_failure, "",
             "RANK:STEP: world rank RANK stops for good during step STEP (mpi: SIGKILL of its "
             "process; local: its thread stops), as --metrics numbers steps"),
};
#define NUM_OPTS ((int)(sizeof OPTS / sizeof OPTS[0]))

/* Results of the parse_ functions. */
enum { PARSE_OK = 0, PARSE_SYNTAX = -1, PARSE_RANGE = -2 };

static int parse_int(const opt_def_t *d, const char *s, int *out) {
    char *end = NULL;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || *end != '\0')
        return PARSE_SYNTAX;
    if (errno == ERANGE || (double)v < d->lo || (double)v > d->hi)
        return PARSE_RANGE;
    *out = (int)v;
    return PARSE_OK;
}

static int parse_u64(const char *s, uint64_t *out) {
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (end == s || *end != '\0')
        return PARSE_SYNTAX;
    /* strtoull negates "-1" to 2^64 - 1: refuse a sign rather than wrap. */
    if (errno == ERANGE || strchr(s, '-') != NULL)
        return PARSE_RANGE;
    *out = (uint64_t)v;
    return PARSE_OK;
}

static int parse_double(const opt_def_t *d, const char *s, double *out) {
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end != '\0' || v != v)
        return PARSE_SYNTAX;
    /* ERANGE: too large, or too small to be told from 0. */
    if (errno == ERANGE || v < d->lo || v > d->hi || ((d->open & LO_OPEN) && v == d->lo) ||
        ((d->open & HI_OPEN) && v == d->hi))
        return PARSE_RANGE;
    *out = v;
    return PARSE_OK;
}

/* Says what a flag accepts: "1..4", "(0, 100]", "0..18446744073709551615". */
static void opt_range(const opt_def_t *d, char *buf, size_t size) {
    if (d->kind == OPT_INT)
        snprintf(buf, size, "%.0f..%.0f", d->lo, d->hi);
    else if (d->kind == OPT_U64)
        snprintf(buf, size, "0..%llu", (unsigned long long)UINT64_MAX);
    else
        snprintf(buf, size, "%c%g, %g%c", (d->open & LO_OPEN) ? '(' : '[', d->lo, d->hi,
                 (d->open & HI_OPEN) ? ')' : ']');
}

/* Stores the text value of one flag into its field. */
static int opt_set(const opt_def_t *d, const char *value, train_opts_t *o, FILE *err) {
    char *field = (char *)o + d->offset;
    int bad = PARSE_OK;
    switch (d->kind) {
    case OPT_INT:
        bad = parse_int(d, value, (int *)(void *)field);
        break;
    case OPT_U64:
        bad = parse_u64(value, (uint64_t *)(void *)field);
        break;
    case OPT_DOUBLE:
        bad = parse_double(d, value, (double *)(void *)field);
        break;
    case OPT_STRING:
        if (strncmp(value, "--", 2) == 0) { /* "--schedule --steps 1": the value is missing */
            fprintf(err, "hcomm-train: --%s needs a value (got the flag %s)\n", d->name, value);
            return -1;
        }
        *(const char **)(void *)field = value;
        break;
    case OPT_FLAG:
        *(int *)(void *)field = 1;
        break;
    }
    if (bad == PARSE_SYNTAX) {
        const char *what = d->kind == OPT_DOUBLE ? "a number" : "an integer";
        fprintf(err, "hcomm-train: --%s %s: expected %s\n", d->name, value, what);
        return -1;
    }
    if (bad == PARSE_RANGE) {
        char range[64];
        opt_range(d, range, sizeof range);
        fprintf(err, "hcomm-train: --%s %s: out of range %s\n", d->name, value, range);
        return -1;
    }
    return 0;
}

static const opt_def_t *opt_find(const char *name, size_t len) {
    for (int i = 0; i < NUM_OPTS; i++)
        if (strlen(OPTS[i].name) == len && strncmp(OPTS[i].name, name, len) == 0)
            return &OPTS[i];
    return NULL;
}

/* --zero and --dp-shard: see tools/train/real/zero.c. */
static int opts_validate_zero(const train_opts_t *o, FILE *err) {
    if (o->dp_shard > 0 && o->zero == 0) {
        fprintf(err,
                "hcomm-train: --dp-shard %d needs --zero 1, 2 or 3 (--zero 0 replicates "
                "everything over --dp)\n",
                o->dp_shard);
        return -1;
    }
    const int shard = o->dp_shard > 0 ? o->dp_shard : o->dp;
    if (o->zero > 0 && o->dp % shard != 0) {
        fprintf(err, "hcomm-train: --dp-shard %d does not divide --dp %d\n", shard, o->dp);
        return -1;
    }
    if (o->zero > 0 && (o->dp / o->ep) % (o->dp / shard) != 0) {
        fprintf(err,
                "hcomm-train: the %d replicas of --dp %d / --dp-shard %d must divide the expert "
                "data-parallel size --dp / --ep = %d\n",
                o->dp / shard, o->dp, shard, o->dp / o->ep);
        return -1;
    }
    if (o->zero > 0 && (o->save != NULL || o->resume != NULL)) {
        fprintf(err, "hcomm-train: --save and --resume are not supported with --zero yet\n");
        return -1;
    }
    if (o->zero > 0 && o->sequence_parallel) { /* its TP sums of whole weights come first */
        fprintf(err, "hcomm-train: --sequence-parallel is not supported with --zero yet\n");
        return -1;
    }
    return 0;
}

/* Checks the values together; says which flag to change. */
static int opts_validate(train_opts_t *o, FILE *err) {
    if (strcmp(o->dtype, "f64") != 0 && strcmp(o->dtype, "f32") != 0 &&
        strcmp(o->dtype, "bf16") != 0) {
        fprintf(err, "hcomm-train: --dtype %s is unknown (f64, f32 or bf16)\n", o->dtype);
        return -1;
    }
    const int interleaved = strcmp(o->schedule, "interleaved") == 0;
    if (strcmp(o->schedule, "gpipe") != 0 && strcmp(o->schedule, "1f1b") != 0 && !interleaved) {
        fprintf(err, "hcomm-train: --schedule %s is unknown (gpipe, 1f1b or interleaved)\n",
                o->schedule);
        return -1;
    }
    if (o->virtual_stages > 1 && !interleaved) {
        fprintf(err, "hcomm-train: --virtual-stages %d needs --schedule interleaved\n",
                o->virtual_stages);
        return -1;
    }
    if (interleaved && (o->pp < 2 || o->micro_batches % o->pp != 0)) {
        fprintf(err,
                "hcomm-train: --schedule interleaved needs --pp >= 2 and --micro-batches "
                "divisible by it (Megatron's interleaved 1F1B runs micro-batches in groups of "
                "pp); got --pp %d, --micro-batches %d\n",
                o->pp, o->micro_batches);
        return -1;
    }
    if ((long long)o->tp * o->cp * o->pp * o->dp > 4096) {
        fprintf(err, "hcomm-train: world size tp*cp*pp*dp = %lld is over 4096\n",
                (long long)o->tp * o->cp * o->pp * o->dp);
        return -1;
    }
    if (o->pp > 2 + 2 * o->layers) {
        fprintf(err,
                "hcomm-train: --pp %d: out of range 1..%d: the model has %d units to split into "
                "stages (embed, %d x (TP block, MoE), head); raise --layers for more stages\n",
                o->pp, 2 + 2 * o->layers, 2 + 2 * o->layers, o->layers);
        return -1;
    }
    if ((long long)o->pp * o->virtual_stages > 2 + 2 * o->layers) {
        fprintf(err,
                "hcomm-train: --pp %d x --virtual-stages %d = %lld chunks, but the model has "
                "%d units (embed, %d x (TP block, MoE), head); raise --layers to %lld or more\n",
                o->pp, o->virtual_stages, (long long)o->pp * o->virtual_stages, 2 + 2 * o->layers,
                o->layers, ((long long)o->pp * o->virtual_stages - 1) / 2);
        return -1;
    }
    if (o->batch % (o->dp * o->micro_batches) != 0) {
        fprintf(err,
                "hcomm-train: --batch %d is not divisible by dp * micro-batches = %d * %d; "
                "each DP rank takes batch/dp sequences, split into micro-batches\n",
                o->batch, o->dp, o->micro_batches);
        return -1;
    }
    if (o->topk > o->experts) {
        fprintf(err, "hcomm-train: --topk %d is more than --experts %d\n", o->topk, o->experts);
        return -1;
    }
    if (o->experts % o->ep != 0) {
        fprintf(err, "hcomm-train: --experts %d is not divisible by --ep %d\n", o->experts, o->ep);
        return -1;
    }
    if (o->dp % o->ep != 0) {
        fprintf(err,
                "hcomm-train: --ep %d does not divide --dp %d; experts are sharded over the TP "
                "group (etp = tp), so the EP group is a part of the DP group\n",
                o->ep, o->dp);
        return -1;
    }
    if ((4 * o->hidden) % o->tp != 0 || (2 * o->hidden) % o->tp != 0) {
        fprintf(err, "hcomm-train: --tp %d does not divide the FFN widths 4C = %d and 2C = %d\n",
                o->tp, 4 * o->hidden, 2 * o->hidden);
        return -1;
    }
    if (opts_validate_zero(o, err) != 0)
        return -1;
    if (o->sample > 0 && o->prompt != NULL && o->prompt[0] == '\0') {
        fprintf(err, "hcomm-train: --prompt is empty; the sample needs at least one character "
                     "to continue (or pass --sample 0)\n");
        return -1;
    }
    if (opts_validate_cp(o, err) != 0 || opts_validate_fault(o, err) != 0)
        return -1;
    const char *backend = opts_backend(o);
    if (strcmp(backend, "local") != 0 && strcmp(backend, "mpi") != 0) {
        if (o->backend != NULL)
            fprintf(err, "hcomm-train: --backend %s: expected local or mpi\n", backend);
        else
            fprintf(err,
                    "hcomm-train: HCOMM_BACKEND=%s: expected local or mpi (or pass --backend)\n",
                    backend);
        return -1;
    }
    return 0;
}

static int opts_defaults(train_opts_t *o, FILE *err) {
    memset(o, 0, sizeof *o);
    for (int i = 0; i < NUM_OPTS; i++)
        if (OPTS[i].deflt != NULL && opt_set(&OPTS[i], OPTS[i].deflt, o, err) != 0)
            return -1;
    return 0;
}

int opts_parse(int argc, char **argv, train_opts_t *o, FILE *err) {
    int ep_given = 0;
    if (opts_defaults(o, err) != 0)
        return -1;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            o->help = 1;
            return 0;
        }
        if (strcmp(arg, "--version") == 0) {
            o->version = 1;
            return 0;
        }
        if (strncmp(arg, "--", 2) != 0) {
            fprintf(err, "hcomm-train: unexpected argument '%s' (see --help)\n", arg);
            return -1;
        }
        const char *name = arg + 2, *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        const opt_def_t *d = opt_find(name, len);
        if (d == NULL) {
            fprintf(err, "hcomm-train: unknown option %s (see --help)\n", arg);
            return -1;
        }
        if (d->kind == OPT_FLAG) {
            if (eq != NULL) {
                fprintf(err, "hcomm-train: --%s takes no value\n", d->name);
                return -1;
            }
            opt_set(d, "", o, err);
            continue;
        }
        const char *value = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
        if (value == NULL) {
            fprintf(err, "hcomm-train: --%s needs a value (see --help)\n", d->name);
            return -1;
        }
        if (opt_set(d, value, o, err) != 0)
            return -1;
        ep_given |= d->offset == offsetof(train_opts_t, ep);
    }
    /* The default --ep must not break a layout that never mentions experts: 2 where it fits. */
    if (!ep_given)
        o->ep = o->dp % 2 == 0 && o->experts % 2 == 0 ? 2 : 1;
    if (o->zero > 0 && o->dp_shard == 0)
        o->dp_shard = o->dp;
    /* An empty string is "none" for the optional paths. */
    const char **paths[] = {&o->metrics, &o->val_data, &o->save, &o->resume, &o->inject_failure};
    for (size_t k = 0; k < sizeof paths / sizeof paths[0]; k++)
        if (*paths[k] != NULL && (*paths[k])[0] == '\0')
            *paths[k] = NULL;
    if (o->backend == NULL && hcomm_launch_backend(NULL, &o->chosen) != HCOMM_OK) {
        fprintf(err, "hcomm-train: %s\n", hcomm_last_error());
        return -1;
    }
    return opts_validate(o, err);
}

void opts_usage(FILE *out) {
    fprintf(out, "usage: hcomm-train [flags]\n"
                 "Trains a small character-level language model (embedding, TP block, MoE\n"
                 "layer, softmax head) with hcomm over tp x pp x dp ranks.\n\nflags:\n");
    for (int i = 0; i < NUM_OPTS; i++) {
        char left[40];
        snprintf(
            left, sizeof left, "--%s %s", OPTS[i].name,
            OPTS[i].kind == OPT_FLAG
                ? ""
                : (OPTS[i].kind == OPT_STRING ? "S" : (OPTS[i].kind == OPT_DOUBLE ? "X" : "N")));
        const char *d = OPTS[i].shown[0] ? OPTS[i].shown : "none";
        fprintf(out, "  %-20s %s (default: %s)\n", left, OPTS[i].help, d);
    }
    fprintf(out, "  %-20s print the version and the backends built\n", "--version");
    fprintf(out, "  %-20s print this help\n", "--help");
}

const char *opts_backend(const train_opts_t *o) {
    return o->backend != NULL ? o->backend : o->chosen;
}

int opts_world_size(const train_opts_t *o) {
    return o->tp * o->cp * o->pp * o->dp;
}
