/* Algorithm and collective names, what each collective can run, and the HCOMM_ALGO syntax
 * (select.h). */
#include "algo/select.h"

#include "core/env.h"
#include "core/log.h"
#include "core/topo_spec.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BIT(a) (1u << (a))

static const char *const algo_names[HCOMM__ALGO_COUNT] = {
    "native",   "rd",   "ring",    "rhd",   "naive", "tree",
    "direct",   "hier", "twoshot", "bruck", "chain", "scatter_allgather",
    "pairwise", "shm"};
static const char *const det_names[HCOMM__ALGO_COUNT] = {
    "native+deterministic",   "rd+deterministic",    "ring+deterministic",
    "rhd+deterministic",      "naive+deterministic", "tree+deterministic",
    "direct+deterministic",   "hier+deterministic",  "twoshot+deterministic",
    "bruck+deterministic",    "chain+deterministic", "scatter_allgather+deterministic",
    "pairwise+deterministic", "shm+deterministic"};
static const char *const coll_names[HCOMM__COLL_COUNT] = {
    "allreduce", "allgather", "reducescatter", "broadcast",      "reduce",
    "gather",    "scatter",   "allgatherv",    "reducescatterv", "alltoallv"};

/* What each collective can run. */
static const uint32_t valid[HCOMM__COLL_COUNT] = {
    [HCOMM__COLL_ALLREDUCE] = BIT(HCOMM__ALGO_NATIVE) | BIT(HCOMM__ALGO_RD) |
                              BIT(HCOMM__ALGO_RING) | BIT(HCOMM__ALGO_RHD) |
                              BIT(HCOMM__ALGO_NAIVE) | BIT(HCOMM__ALGO_HIER) |
                              BIT(HCOMM__ALGO_TWOSHOT) | BIT(HCOMM__ALGO_SHM),
    [HCOMM__COLL_ALLGATHER] = BIT(HCOMM__ALGO_NATIVE) | BIT(HCOMM__ALGO_RING) |
                              BIT(HCOMM__ALGO_HIER) | BIT(HCOMM__ALGO_RD) | BIT(HCOMM__ALGO_BRUCK) |
                              BIT(HCOMM__ALGO_DIRECT) | BIT(HCOMM__ALGO_SHM),
    [HCOMM__COLL_REDUCESCATTER] =
        BIT(HCOMM__ALGO_NATIVE) | BIT(HCOMM__ALGO_RING) | BIT(HCOMM__ALGO_HIER) |
        BIT(HCOMM__ALGO_RHD) | BIT(HCOMM__ALGO_RD) | BIT(HCOMM__ALGO_DIRECT) | BIT(HCOMM__ALGO_SHM),
    [HCOMM__COLL_BROADCAST] = BIT(HCOMM__ALGO_NATIVE) | BIT(HCOMM__ALGO_TREE) |
                              BIT(HCOMM__ALGO_CHAIN) | BIT(HCOMM__ALGO_SCATTER_ALLGATHER) |
                              BIT(HCOMM__ALGO_RD) | BIT(HCOMM__ALGO_DIRECT) | BIT(HCOMM__ALGO_SHM),
    [HCOMM__COLL_REDUCE] = BIT(HCOMM__ALGO_TREE) | BIT(HCOMM__ALGO_RHD) | BIT(HCOMM__ALGO_DIRECT) |
                           BIT(HCOMM__ALGO_SHM) | BIT(HCOMM__ALGO_NATIVE),
    [HCOMM__COLL_GATHER] = BIT(HCOMM__ALGO_DIRECT) | BIT(HCOMM__ALGO_TREE) | BIT(HCOMM__ALGO_SHM) |
                           BIT(HCOMM__ALGO_NATIVE),
    [HCOMM__COLL_SCATTER] = BIT(HCOMM__ALGO_DIRECT) | BIT(HCOMM__ALGO_TREE) | BIT(HCOMM__ALGO_SHM) |
                            BIT(HCOMM__ALGO_NATIVE),
    [HCOMM__COLL_ALLGATHERV] = BIT(HCOMM__ALGO_NATIVE) | BIT(HCOMM__ALGO_RING) |
                               BIT(HCOMM__ALGO_RD) | BIT(HCOMM__ALGO_BRUCK) | BIT(HCOMM__ALGO_SHM) |
                               BIT(HCOMM__ALGO_DIRECT),
    [HCOMM__COLL_REDUCESCATTERV] = BIT(HCOMM__ALGO_NATIVE) | BIT(HCOMM__ALGO_RING) |
                                   BIT(HCOMM__ALGO_RHD) | BIT(HCOMM__ALGO_DIRECT) |
                                   BIT(HCOMM__ALGO_SHM),
    [HCOMM__COLL_ALLTOALLV] = BIT(HCOMM__ALGO_NATIVE) | BIT(HCOMM__ALGO_PAIRWISE) |
                              BIT(HCOMM__ALGO_BRUCK) | BIT(HCOMM__ALGO_DIRECT) |
                              BIT(HCOMM__ALGO_HIER) | BIT(HCOMM__ALGO_SHM),
};

/* When the default is excluded, the first allowed of these runs. */
static const int preference[HCOMM__ALGO_COUNT] = {HCOMM__ALGO_RING,  HCOMM__ALGO_PAIRWISE,
                                                  HCOMM__ALGO_RHD,   HCOMM__ALGO_TREE,
                                                  HCOMM__ALGO_RD,    HCOMM__ALGO_DIRECT,
                                                  HCOMM__ALGO_HIER,  HCOMM__ALGO_TWOSHOT,
                                                  HCOMM__ALGO_BRUCK, HCOMM__ALGO_SCATTER_ALLGATHER,
                                                  HCOMM__ALGO_CHAIN, HCOMM__ALGO_NAIVE,
                                                  HCOMM__ALGO_SHM,   HCOMM__ALGO_NATIVE};

const char *hcomm__algo_name(int algo) {
    const char *const *names = algo & HCOMM__ALGO_DET ? det_names : algo_names;
    algo &= ~HCOMM__ALGO_DET;
    return algo >= 0 && algo < HCOMM__ALGO_COUNT ? names[algo] : "?";
}

const char *hcomm__coll_name(int coll) {
    return coll >= 0 && coll < HCOMM__COLL_COUNT ? coll_names[coll] : "?";
}

static int find(const char *const *names, int n, const char *s, size_t len) {
    for (int i = 0; i < n; i++)
        if (strlen(names[i]) == len && strncmp(names[i], s, len) == 0)
            return i;
    return -1;
}

/* A collective's name, as NCCL_ALGO spells it or as hcomm's calls do ("all_reduce" is
 * "allreduce"); "alltoall" is all_to_allv too (hcomm has one call for both). */
static int find_coll(const char *s, size_t len) {
    char bare[32];
    size_t n = 0;
    for (size_t i = 0; i < len && n < sizeof bare; i++)
        if (s[i] != '_')
            bare[n++] = s[i];
    if (n == sizeof bare)
        return -1;
    if (n == 8 && strncmp(bare, "alltoall", 8) == 0)
        return HCOMM__COLL_ALLTOALLV;
    return find(coll_names, HCOMM__COLL_COUNT, bare, n);
}

int hcomm__coll_find(const char *name) {
    return find_coll(name, strlen(name));
}

static void join(char *out, size_t cap, const char *const *names, int n, uint32_t mask) {
    out[0] = '\0';
    for (int i = 0; i < n; i++)
        if (mask & BIT(i)) {
            strncat(out, out[0] ? ", " : "", cap - strlen(out) - 1);
            strncat(out, names[i], cap - strlen(out) - 1);
        }
}

/* Parses "[^]name[,name...]" (len bytes) into a mask of algorithms; empty names are skipped. */
static hcomm_result_t parse_names(const char *fn, const char *var, const char *s, size_t len,
                                  uint32_t *mask, bool *exclude) {
    s = hcomm__strip(s, &len);
    *exclude = len > 0 && s[0] == '^';
    if (*exclude)
        s++, len--;
    *mask = 0;
    while (len > 0) {
        const char *comma = memchr(s, ',', len), *name = s;
        size_t n = comma ? (size_t)(comma - s) : len, nlen = n;
        name = hcomm__strip(name, &nlen);
        int a = nlen ? find(algo_names, HCOMM__ALGO_COUNT, name, nlen) : -2;
        if (a == -1) {
            char list[256];
            join(list, sizeof list, algo_names, HCOMM__ALGO_COUNT, ~0u);
            return hcomm__err(HCOMM_ERR_INVALID_ARG, fn,
                              "%s: \"%.*s\" is not an algorithm; valid: %s", var, (int)nlen, name,
                              list);
        }
        *mask |= a >= 0 ? BIT(a) : 0; /* an empty name (",ring", "ring,") is skipped, as an
                                        empty entry is */
        s += n + (comma ? 1 : 0);
        len -= n + (comma ? 1 : 0);
    }
    return HCOMM_OK;
}

/* Applies one entry to the collectives it names; each must keep an algorithm it can run. */
static hcomm_result_t apply(const char *fn, const char *var, int coll, uint32_t mask, bool exclude,
                            hcomm__algo_set_t *out) {
    for (int k = 0; k < HCOMM__COLL_COUNT; k++) {
        if (coll >= 0 && k != coll)
            continue;
        uint32_t allowed = exclude ? valid[k] & ~mask : valid[k] & mask;
        if (allowed != 0) {
            out->allowed[k] = allowed;
            continue;
        }
        if (coll < 0 && !exclude)
            continue; /* a list for every collective applies where its names are valid */
        char list[256];
        join(list, sizeof list, algo_names, HCOMM__ALGO_COUNT, valid[k]);
        return hcomm__err(HCOMM_ERR_INVALID_ARG, fn, "%s leaves no algorithm for %s; valid: %s",
                          var, coll_names[k], list);
    }
    return HCOMM_OK;
}

/* One "[coll:]names" entry; a collective named by an earlier entry is an error (which one
 * would win is a guess), and so is an entry for every collective after per-collective ones,
 * which it would silently replace. */
static hcomm_result_t parse_entry(const char *fn, const char *var, const char *s, size_t len,
                                  uint32_t *named, hcomm__algo_set_t *out) {
    const char *colon = memchr(s, ':', len), *cname = s;
    int coll = -1;
    if (colon) {
        size_t clen = (size_t)(colon - s);
        cname = hcomm__strip(cname, &clen);
        coll = find_coll(cname, clen);
        if (coll < 0) {
            char list[200];
            join(list, sizeof list, coll_names, HCOMM__COLL_COUNT, ~0u);
            return hcomm__err(HCOMM_ERR_INVALID_ARG, fn,
                              "%s: \"%.*s\" is not a collective; valid: %s", var, (int)clen, cname,
                              list);
        }
        if (*named & BIT(coll))
            return hcomm__err(HCOMM_ERR_INVALID_ARG, fn, "%s: %s is named by two entries", var,
                              coll_names[coll]);
        *named |= BIT(coll);
        len -= (size_t)(colon + 1 - s);
        s = colon + 1;
    } else if (*named) {
        return hcomm__err(HCOMM_ERR_INVALID_ARG, fn,
                          "%s: \"%.*s\" names no collective, so it must come before the entries "
                          "that do",
                          var, (int)len, s);
    }
    uint32_t mask;
    bool exclude;
    HCOMM__TRY(parse_names(fn, var, s, len, &mask, &exclude));
    if (mask == 0)
        return hcomm__err(HCOMM_ERR_INVALID_ARG, fn, "%s: an entry names no algorithm", var);
    return apply(fn, var, coll, mask, exclude, out);
}

hcomm_result_t hcomm__algo_parse(const char *fn, const char *var, const char *spec,
                                 hcomm__algo_set_t *out) {
    uint32_t named = 0;
    for (int k = 0; k < HCOMM__COLL_COUNT; k++)
        out->allowed[k] = valid[k];
    while (spec && *spec) {
        const char *semi = strchr(spec, ';'), *entry = spec;
        size_t len = semi ? (size_t)(semi - spec) : strlen(spec), elen = len;
        entry = hcomm__strip(entry, &elen);
        if (elen > 0)
            HCOMM__TRY(parse_entry(fn, var, entry, elen, &named, out));
        spec += len + (semi ? 1 : 0);
    }
    return HCOMM_OK;
}

static hcomm__algo_set_t env_set;
static bool env_given;
static hcomm_result_t env_res = HCOMM_OK;
static char env_msg[512];
static pthread_once_t env_once = PTHREAD_ONCE_INIT;

static void read_env(void) {
    const char *s = getenv("HCOMM_ALGO");
    env_given = s && s[0];
    if (!env_given)
        return;
    env_res = hcomm__algo_parse("hcomm", "HCOMM_ALGO", s, &env_set);
    if (env_res != HCOMM_OK)
        snprintf(env_msg, sizeof env_msg, "%s", hcomm__err_detail("hcomm"));
}

const hcomm__algo_set_t *hcomm__algo_env(void) {
    pthread_once(&env_once, read_env);
    return env_given && env_res == HCOMM_OK ? &env_set : NULL;
}

hcomm_result_t hcomm__algo_env_validate(const char *fn) {
    pthread_once(&env_once, read_env);
    if (env_res == HCOMM_OK)
        return HCOMM_OK;
    return hcomm__err(env_res, fn, "%s", env_msg);
}

/* What HCOMM_ALGO allows, so that ranks compare meaning, not spelling ("allreduce:ring" and
 * " all_reduce : ring ;" agree); 0 when unset, the text's digest when it does not parse (the
 * launch then fails on its own check anyway). */
static uint64_t algo_env_digest(void) {
    pthread_once(&env_once, read_env);
    if (!env_given)
        return 0;
    const char *text = getenv("HCOMM_ALGO");
    uint64_t h = env_res == HCOMM_OK ? hcomm__fnv(&env_set, sizeof env_set, HCOMM__FNV_SEED)
                                     : hcomm__fnv(text, strlen(text), HCOMM__FNV_SEED);
    return h | 1;
}

/* HCOMM_ALGO is checked with the other variables at launch, and compared across ranks by its
 * digest; core cannot include this layer. */
__attribute__((constructor)) static void register_env_check(void) {
    hcomm__env_register_check(hcomm__algo_env_validate);
    hcomm__selection_register_algo_digest(algo_env_digest);
}

uint32_t hcomm__algo_mask(const hcomm__algo_set_t *over, int coll) {
    const hcomm__algo_set_t *set = over ? over : hcomm__algo_env();
    return valid[coll] & (set ? set->allowed[coll] : ~0u);
}

bool hcomm__algo_allowed(const hcomm__algo_set_t *over, int coll, int algo) {
    return (hcomm__algo_mask(over, coll) & BIT(algo)) != 0;
}

int hcomm__algo_preferred(uint32_t allowed) {
    for (int i = 0; i < HCOMM__ALGO_COUNT; i++)
        if (allowed & BIT(preference[i]))
            return preference[i];
    return -1;
}
