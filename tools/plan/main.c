/* hcomm-plan: prints the parallel groups of a job (Megatron-Core layout) without running
 * anything, as a table or as JSON. Uses only the public plan API (hcomm/domain.h).
 *
 *   hcomm-plan --world 32 --tp 4 --pp 2 --json
 *   hcomm-plan --world 32 --tp 4 --pp 2 --rank 5     (only the groups of rank 5)
 *
 * Exit status: 0 ok, 1 invalid configuration (hcomm's message on stderr), 2 bad usage. */
#include "hcomm/api.h"

#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Table mode shows this many members of a long group (every group, unless --max-groups). */
#define SHOW_MEMBERS 16

typedef struct options {
    int world;
    int max_groups; /* --max-groups: groups shown per kind in the table; 0: all */
    int rank;       /* --rank: print only this world rank's groups; -1: every group */
    bool have_world, json;
    hcomm_parallel_config_t cfg;
} options_t;

static void usage(FILE *f) {
    fputs("usage: hcomm-plan --world W [--tp T] [--pp P] [--dp D] [--cp C] [--ep E] [--etp X]\n"
          "                  [--experts N] [--dp-shard S] [--order O] [--json]\n"
          "Prints every parallel group (tp, pp, dp, cp, dp_cp, tp_pp, ep, etp, edp, embedding,\n"
          "dp_shard, dp_replicate, edp_shard, edp_replicate) of a job laid out as Megatron-Core's\n"
          "RankGenerator does, without running anything.\n"
          "  --world W    number of ranks (required, at most 16777216)\n"
          "  --tp T       tensor parallel size (default 1)\n"
          "  --pp P       pipeline parallel size (default 1)\n"
          "  --dp D       data parallel size (default world/(tp*pp*cp))\n"
          "  --cp C       context parallel size (default 1)\n"
          "  --ep E       expert parallel size (default 1)\n"
          "  --etp X      expert tensor parallel size (default tp)\n"
          "  --experts N  number of experts, checked to be divisible by ep (default: no check)\n"
          "  --dp-shard S ranks of dp sharing one copy of sharded state (ZeRO/FSDP; default dp);\n"
          "               the other dp/S replicate it (HSDP), shard index innermost\n"
          "  --order O    axes fastest-varying first (default tp-cp-ep-dp-pp)\n"
          "  --max-groups N  show the first N groups of each kind in the table (default: all)\n"
          "  --rank R     only the groups of world rank R (0..W-1) and its index in each\n"
          "  --json       one JSON object: a list of groups (world ranks) per kind\n"
          "  --help       this text\n",
          f);
}

/* Every group of every kind is held in memory (14 ints per rank): 16M ranks is ~1 GB. */
#define HCOMM_PLAN_MAX_WORLD (1 << 24)

/* Parses a whole decimal int in 1..HCOMM_PLAN_MAX_WORLD (every flag is a size or a count); on
 * failure says which flag and value, and returns false. */
static bool parse_int(const char *flag, const char *text, int *out) {
    char *end = NULL;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (text[0] == '\0' || *end != '\0') {
        fprintf(stderr, "hcomm-plan: %s: '%s' is not an integer\n", flag, text);
        return false;
    }
    if (errno == ERANGE || v < 1 || v > HCOMM_PLAN_MAX_WORLD) {
        fprintf(stderr, "hcomm-plan: %s %s: out of range 1..%d\n", flag, text,
                HCOMM_PLAN_MAX_WORLD);
        return false;
    }
    *out = (int)v;
    return true;
}

/* --rank's value: a whole decimal int from 0 (checked against --world once both are known). */
static bool parse_rank(const char *text, int *out) {
    char *end = NULL;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (text[0] == '\0' || *end != '\0' || errno == ERANGE || v < 0 || v >= HCOMM_PLAN_MAX_WORLD) {
        fprintf(stderr, "hcomm-plan: --rank: '%s' is not a rank (0..%d)\n", text,
                HCOMM_PLAN_MAX_WORLD - 1);
        return false;
    }
    *out = (int)v;
    return true;
}

/* The int that a numeric flag sets, or NULL if flag is not one. */
static int *int_flag(options_t *o, const char *flag) {
    const struct {
        const char *name;
        int *dst;
    } flags[] = {{"--world", &o->world},
                 {"--tp", &o->cfg.tp},
                 {"--pp", &o->cfg.pp},
                 {"--dp", &o->cfg.dp},
                 {"--cp", &o->cfg.cp},
                 {"--ep", &o->cfg.ep},
                 {"--etp", &o->cfg.etp},
                 {"--experts", &o->cfg.num_experts},
                 {"--dp-shard", &o->cfg.dp_shard},
                 {"--max-groups", &o->max_groups}};
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++)
        if (strcmp(flag, flags[i].name) == 0)
            return flags[i].dst;
    return NULL;
}

/* Applies one "--flag value" (value NULL if missing). Returns false after a message. */
static bool apply_flag(options_t *o, const char *flag, const char *value) {
    int *dst = int_flag(o, flag);
    if (strcmp(flag, "--rank") == 0 && value)
        return parse_rank(value, &o->rank);
    if (!dst && strcmp(flag, "--order") != 0 && strcmp(flag, "--rank") != 0) {
        fprintf(stderr, "hcomm-plan: unknown option %s (see --help)\n", flag);
        return false;
    }
    if (!value) {
        fprintf(stderr, "hcomm-plan: %s needs a value\n", flag);
        return false;
    }
    if (!dst) {
        o->cfg.order = value;
        return true;
    }
    if (dst == &o->world)
        o->have_world = true;
    return parse_int(flag, value, dst);
}

/* Returns 0 to go on, 1 after --help, 2 after a usage error. Accepts --flag=value too. */
static int parse_args(int argc, char **argv, options_t *o) {
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            usage(stdout);
            return 1;
        }
        if (strcmp(arg, "--json") == 0) {
            o->json = true;
            continue;
        }
        const char *eq = strchr(arg, '=');
        size_t len = eq ? (size_t)(eq - arg) : strlen(arg);
        char flag[32];
        if (len >= sizeof flag) {
            fprintf(stderr, "hcomm-plan: unknown option %.40s (see --help)\n", arg);
            return 2;
        }
        memcpy(flag, arg, len);
        flag[len] = '\0';
        const char *value = eq ? eq + 1 : i + 1 < argc ? argv[++i] : NULL;
        if (!apply_flag(o, flag, value))
            return 2;
    }
    if (!o->have_world) {
        fprintf(stderr, "hcomm-plan: --world is required (see --help)\n");
        return 2;
    }
    if (o->rank >= o->world) {
        fprintf(stderr, "hcomm-plan: --rank %d outside 0..%d (--world %d)\n", o->rank, o->world - 1,
                o->world);
        return 2;
    }
    return 0;
}

static void print_group_json(FILE *f, const int *members, int n) {
    fputc('[', f);
    for (int m = 0; m < n; m++)
        fprintf(f, m ? ",%d" : "%d", members[m]);
    fputc(']', f);
}

/* Exactly the group kinds as keys, so a consumer can compare the object as a whole; the
 * resolved sizes are in the table view. */
static void print_json(FILE *f, const hcomm_group_list_t lists[HCOMM_GROUP_COUNT]) {
    for (int k = 0; k < HCOMM_GROUP_COUNT; k++) {
        const char *name = "";
        hcomm_group_kind_name((hcomm_group_kind_t)k, &name);
        fprintf(f, "%s\"%s\": [", k ? ",\n " : "{", name);
        const hcomm_group_list_t *l = &lists[k];
        for (int g = 0; g < l->num_groups; g++) {
            if (g)
                fputc(',', f);
            print_group_json(f, l->ranks + (size_t)g * (size_t)l->group_size, l->group_size);
        }
        fputc(']', f);
    }
    fputs("}\n", f);
}

/* "[0, 1, 2, 3]"; a long group shows its first members, "...", and its last. */
static void print_group_table(FILE *f, const int *members, int n) {
    fputs("  [", f);
    for (int m = 0; m < n; m++) {
        if (n > SHOW_MEMBERS && m == SHOW_MEMBERS / 2) {
            fputs(", ...", f);
            m = n - 1;
        }
        fprintf(f, m ? ", %d" : "%d", members[m]);
    }
    fputc(']', f);
    if (n > SHOW_MEMBERS)
        fprintf(f, " (%d ranks)", n);
    fputc('\n', f);
}

static void print_table(FILE *f, int world, const hcomm_parallel_config_t *c, int edp,
                        const hcomm_group_list_t lists[HCOMM_GROUP_COUNT], int max_groups) {
    fprintf(f,
            "world=%d tp=%d pp=%d dp=%d cp=%d ep=%d etp=%d edp=%d experts=%d order=%s "
            "dp_shard=%d dp_replicate=%d\n",
            world, c->tp, c->pp, c->dp, c->cp, c->ep, c->etp, edp, c->num_experts, c->order,
            c->dp_shard, c->dp / c->dp_shard);
    for (int k = 0; k < HCOMM_GROUP_COUNT; k++) {
        const char *name = "";
        hcomm_group_kind_name((hcomm_group_kind_t)k, &name);
        const hcomm_group_list_t *l = &lists[k];
        fprintf(f, "%s: %d group%s of %d\n", name, l->num_groups, l->num_groups == 1 ? "" : "s",
                l->group_size);
        const int shown = max_groups > 0 && max_groups < l->num_groups ? max_groups : l->num_groups;
        for (int g = 0; g < shown; g++)
            print_group_table(f, l->ranks + (size_t)g * (size_t)l->group_size, l->group_size);
        if (shown < l->num_groups)
            fprintf(f, "  ... %d more (%d groups; --max-groups %d cut the list)\n",
                    l->num_groups - shown, l->num_groups, max_groups);
    }
}

/* The group of list l that holds world rank r (its members, and r's index in *idx), or NULL
 * (embedding on a middle stage). */
static const int *group_of(const hcomm_group_list_t *l, int r, int *idx) {
    for (int g = 0; g < l->num_groups; g++)
        for (int m = 0; m < l->group_size; m++)
            if (l->ranks[(size_t)g * (size_t)l->group_size + (size_t)m] == r) {
                *idx = m;
                return l->ranks + (size_t)g * (size_t)l->group_size;
            }
    return NULL;
}

/* --rank: one line (table) or one key (JSON) per kind with the rank's group, or none. */
static void print_rank(FILE *f, int r, bool json,
                       const hcomm_group_list_t lists[HCOMM_GROUP_COUNT]) {
    if (!json)
        fprintf(f, "rank %d:\n", r);
    for (int k = 0; k < HCOMM_GROUP_COUNT; k++) {
        const char *name = "";
        hcomm_group_kind_name((hcomm_group_kind_t)k, &name);
        int idx = -1, n = lists[k].group_size;
        const int *g = group_of(&lists[k], r, &idx);
        if (json) {
            fprintf(f, "%s\"%s\": ", k ? ",\n " : "{", name);
            if (g)
                print_group_json(f, g, n);
            else
                fputs("null", f);
            continue;
        }
        fprintf(f, "%s:", name);
        if (!g) {
            fputs(" none (not in any group of this kind)\n", f);
            continue;
        }
        fprintf(f, " rank %d of %d", idx, n);
        print_group_table(f, g, n);
    }
    if (json)
        fputs("}\n", f);
}

/* Computes every kind's groups and prints them; returns the exit status. */
static int plan(const options_t *o) {
    hcomm_group_list_t lists[HCOMM_GROUP_COUNT];
    memset(lists, 0, sizeof lists);
    hcomm_parallel_config_t resolved;
    int status = 1;
    if (hcomm_parallel_config_resolve(&o->cfg, o->world, &resolved) != HCOMM_OK)
        goto done;
    for (int k = 0; k < HCOMM_GROUP_COUNT; k++)
        if (hcomm_plan_groups(&o->cfg, o->world, (hcomm_group_kind_t)k, &lists[k]) != HCOMM_OK)
            goto done;
    int edp = lists[HCOMM_GROUP_EDP].group_size;
    if (o->rank >= 0)
        print_rank(stdout, o->rank, o->json, lists);
    else if (o->json)
        print_json(stdout, lists);
    else
        print_table(stdout, o->world, &resolved, edp, lists, o->max_groups);
    status = fflush(stdout) == 0 ? 0 : 1;
    if (status)
        fprintf(stderr, "hcomm-plan: cannot write the output: %s\n", strerror(errno));
done:
    if (status && hcomm_last_error()[0])
        fprintf(stderr, "hcomm-plan: %s\n", hcomm_last_error());
    for (int k = 0; k < HCOMM_GROUP_COUNT; k++)
        hcomm_group_list_free(&lists[k]);
    return status;
}

int main(int argc, char **argv) {
    options_t o;
    memset(&o, 0, sizeof o);
    o.rank = -1;
    int r = parse_args(argc, argv, &o);
    if (r != 0)
        return r == 1 ? 0 : 2;
    /* Full buffering: a world of 65,536 prints megabytes of JSON. */
    static char buf[1 << 16];
    setvbuf(stdout, buf, _IOFBF, sizeof buf);
    return plan(&o);
}
