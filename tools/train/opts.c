/* Command-line options of hcomm-train: one table lists every flag, its default and its help,
 * so parsing, defaults and --help never drift apart. */
#include "opts.h"

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

typedef enum opt_kind { OPT_INT, OPT_U64, OPT_DOUBLE, OPT_STRING } opt_kind_t;

typedef struct opt_def {
    const char *name; /* without the leading "--" */
    opt_kind_t kind;
    size_t offset;     /* of the field in train_opts_t */
    const char *deflt; /* default, parsed like a command-line value */
    const char *help;
} opt_def_t;

#define OPT_(name, kind, field, deflt, help)                                                       \
    { name, kind, offsetof(train_opts_t, field), deflt, help }

static const opt_def_t OPTS[] = {
    OPT_("tp", OPT_INT, tp, "2", "tensor-parallel size (also the expert-TP size)"),
    OPT_("pp", OPT_INT, pp, "2", "pipeline stages, 1..4 (units: embed, TP block, MoE, head)"),
    OPT_("dp", OPT_INT, dp, "2", "data-parallel size; world size = tp * pp * dp"),
    OPT_("ep", OPT_INT, ep, "2", "expert-parallel size; must divide dp and --experts"),
    OPT_("experts", OPT_INT, experts, "4", "experts in the MoE layer (top-1 routing)"),
    OPT_("hidden", OPT_INT, hidden, "64", "model width C (TP FFN 4C, expert FFN 2C)"),
    OPT_("steps", OPT_INT, steps, "300", "optimizer steps"),
    OPT_("micro-batches", OPT_INT, micro_batches, "2", "micro-batches per step per DP rank"),
    OPT_("batch", OPT_INT, batch, "16", "global batch in sequences; divisible by dp*micro"),
    OPT_("seq", OPT_INT, seq, "32", "characters per sequence"),
    OPT_("seed", OPT_U64, seed, "1234", "seed of the weights and of the data sampler"),
    OPT_("lr", OPT_DOUBLE, lr, "0.3", "SGD learning rate"),
    OPT_("momentum", OPT_DOUBLE, momentum, "0.9", "SGD momentum, 0 <= m < 1"),
    OPT_("backend", OPT_STRING, backend, "local", "local (ranks are threads) or mpi (mpirun)"),
    OPT_("data", OPT_STRING, data, "/usr/share/common-licenses/GPL-3", "training text file"),
    OPT_("metrics", OPT_STRING, metrics, "", "write CSV step,loss,... to this file"),
    OPT_("log-every", OPT_INT, log_every, "10", "steps between progress lines"),
};
#define NUM_OPTS ((int)(sizeof OPTS / sizeof OPTS[0]))

static int parse_int(const char *s, int *out) {
    char *end = NULL;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v < -1000000000L || v > 1000000000L)
        return -1;
    *out = (int)v;
    return 0;
}

static int parse_u64(const char *s, uint64_t *out) {
    char *end = NULL;
    errno = 0;
    if (s[0] == '-')
        return -1;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0')
        return -1;
    *out = (uint64_t)v;
    return 0;
}

static int parse_double(const char *s, double *out) {
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (errno != 0 || end == s || *end != '\0' || v != v)
        return -1;
    *out = v;
    return 0;
}

/* Stores the text value of one flag into its field. */
static int opt_set(const opt_def_t *d, const char *value, train_opts_t *o, FILE *err) {
    char *field = (char *)o + d->offset;
    int bad = 0;
    switch (d->kind) {
    case OPT_INT:
        bad = parse_int(value, (int *)(void *)field);
        break;
    case OPT_U64:
        bad = parse_u64(value, (uint64_t *)(void *)field);
        break;
    case OPT_DOUBLE:
        bad = parse_double(value, (double *)(void *)field);
        break;
    case OPT_STRING:
        *(const char **)(void *)field = value;
        break;
    }
    if (bad) {
        const char *what = d->kind == OPT_DOUBLE ? "a number" : "an integer";
        fprintf(err, "hcomm-train: --%s %s: expected %s\n", d->name, value, what);
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

/* Checks the values together; says which flag to change. */
static int opts_validate(const train_opts_t *o, FILE *err) {
    struct {
        const char *name;
        int value, min, max;
    } ranges[] = {
        {"tp", o->tp, 1, 4096},
        {"pp", o->pp, 1, 4},
        {"dp", o->dp, 1, 4096},
        {"ep", o->ep, 1, 4096},
        {"experts", o->experts, 1, 4096},
        {"hidden", o->hidden, 1, 4096},
        {"steps", o->steps, 1, 100000000},
        {"micro-batches", o->micro_batches, 1, 1 << 20},
        {"batch", o->batch, 1, 1 << 20},
        {"seq", o->seq, 1, 1 << 20},
        {"log-every", o->log_every, 1, 1 << 30},
    };
    for (size_t i = 0; i < sizeof ranges / sizeof ranges[0]; i++) {
        if (ranges[i].value < ranges[i].min || ranges[i].value > ranges[i].max) {
            fprintf(err, "hcomm-train: --%s %d out of range %d..%d\n", ranges[i].name,
                    ranges[i].value, ranges[i].min, ranges[i].max);
            return -1;
        }
    }
    if ((long long)o->tp * o->pp * o->dp > 4096) {
        fprintf(err, "hcomm-train: world size tp*pp*dp = %lld is over 4096\n",
                (long long)o->tp * o->pp * o->dp);
        return -1;
    }
    if (o->batch % (o->dp * o->micro_batches) != 0) {
        fprintf(err,
                "hcomm-train: --batch %d is not divisible by dp * micro-batches = %d * %d; "
                "each DP rank takes batch/dp sequences, split into micro-batches\n",
                o->batch, o->dp, o->micro_batches);
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
    if (!(o->lr > 0.0) || o->lr > 100.0) {
        fprintf(err, "hcomm-train: --lr %g must be in (0, 100]\n", o->lr);
        return -1;
    }
    if (!(o->momentum >= 0.0 && o->momentum < 1.0)) {
        fprintf(err, "hcomm-train: --momentum %g must be in [0, 1)\n", o->momentum);
        return -1;
    }
    if (strcmp(o->backend, "local") != 0 && strcmp(o->backend, "mpi") != 0) {
        fprintf(err, "hcomm-train: --backend %s: expected local or mpi\n", o->backend);
        return -1;
    }
    return 0;
}

static int opts_defaults(train_opts_t *o, FILE *err) {
    memset(o, 0, sizeof *o);
    for (int i = 0; i < NUM_OPTS; i++)
        if (opt_set(&OPTS[i], OPTS[i].deflt, o, err) != 0)
            return -1;
    return 0;
}

int opts_parse(int argc, char **argv, train_opts_t *o, FILE *err) {
    if (opts_defaults(o, err) != 0)
        return -1;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            o->help = 1;
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
            fprintf(err, "hcomm-train: unknown flag '%s' (see --help)\n", arg);
            return -1;
        }
        const char *value = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
        if (value == NULL) {
            fprintf(err, "hcomm-train: --%s needs a value (see --help)\n", d->name);
            return -1;
        }
        if (opt_set(d, value, o, err) != 0)
            return -1;
    }
    if (o->metrics != NULL && o->metrics[0] == '\0')
        o->metrics = NULL;
    return opts_validate(o, err);
}

void opts_usage(FILE *out) {
    fprintf(out, "usage: hcomm-train [flags]\n"
                 "Trains a small character-level language model (embedding, TP block, MoE\n"
                 "layer, softmax head) with hcomm over tp x pp x dp ranks.\n\nflags:\n");
    for (int i = 0; i < NUM_OPTS; i++) {
        char left[40];
        snprintf(left, sizeof left, "--%s %s", OPTS[i].name,
                 OPTS[i].kind == OPT_STRING ? "S" : (OPTS[i].kind == OPT_DOUBLE ? "X" : "N"));
        const char *d = OPTS[i].deflt[0] ? OPTS[i].deflt : "none";
        fprintf(out, "  %-20s %s (default %s)\n", left, OPTS[i].help, d);
    }
    fprintf(out, "  %-20s print this help\n", "--help");
}

int opts_world_size(const train_opts_t *o) {
    return o->tp * o->pp * o->dp;
}
