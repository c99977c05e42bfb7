/* HCOMM_TOPO, HCOMM_TUNING_FILE and the digests of the selection inputs (see topo_spec.h). */
#include "core/topo_spec.h"

#include "core/env.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdatomic.h>
#include <string.h>

#define FORMS                                                                                      \
    "mesh, ring, nodes=NxG, nodes=A,B,... and class tables intra=LAT,BW[,RED] / "                  \
    "inter=LAT,BW[,RED] (LAT in ns/us/ms/s up to 1 s, BW and RED in B/s/KB/s/MB/s/GB/s from "      \
    "1 KB/s), fields separated by ';', e.g. \"nodes=2x4;inter=10us,1GB/s\""

/* A link slower than this is a typo, not a machine: every simulated message would wait on it
 * until HCOMM_TIMEOUT, whose message would not name the cause. */
#define MAX_ALPHA_S 1.0
#define MAX_SECONDS_PER_BYTE 1e-3 /* 1 KB/s */

static bool link_plausible(const hcomm__link_t *l) {
    return l->alpha <= MAX_ALPHA_S && l->beta <= MAX_SECONDS_PER_BYTE &&
           l->gamma <= MAX_SECONDS_PER_BYTE;
}

/* Defaults without a tuning file: threads or processes of one host exchange through shared
 * memory at a few GB/s with microseconds of software overhead; between hosts a 10 Gbit/s TCP
 * network (Open MPI's tcp btl) with tens of microseconds. Reductions run at memory speed. */
static const hcomm__link_t link_defaults[HCOMM__LINK_CLASSES] = {
    [HCOMM__LINK_INTRA] = {2e-6, 1.0 / 5e9, 1.0 / 8e9},
    [HCOMM__LINK_INTER] = {20e-6, 1.0 / 1.25e9, 1.0 / 8e9},
};

uint64_t hcomm__fnv(const void *p, size_t n, uint64_t h) {
    for (size_t i = 0; i < n; i++)
        h = (h ^ ((const unsigned char *)p)[i]) * 0x100000001b3ull;
    return h;
}

static hcomm_result_t bad(const char *fn, const char *var, const char *text, const char *what,
                          int len, const char *s) {
    return hcomm__err(HCOMM_ERR_INVALID_ARG, fn, "%s=\"%s\": %s \"%.*s\"; valid: " FORMS, var, text,
                      what, len, s);
}

/* A positive decimal number followed by one of units (scale[i] per unit) filling exactly len
 * bytes, blanks allowed around either ("10 us"); hexadecimal is refused ("0x10us"). */
static bool number_unit(const char *s, size_t len, const char *const *units, const double *scale,
                        double *out) {
    char buf[64];
    s = hcomm__strip(s, &len);
    if (len == 0 || len >= sizeof buf)
        return false;
    memcpy(buf, s, len);
    buf[len] = '\0';
    if (strpbrk(buf, "xX"))
        return false;
    char *end = NULL;
    errno = 0;
    double v = strtod(buf, &end);
    if (errno != 0 || end == buf || !isfinite(v) || v < 0.0)
        return false;
    while (isspace((unsigned char)*end))
        end++;
    for (int i = 0; units[i]; i++)
        if (strcmp(end, units[i]) == 0) {
            *out = v * scale[i];
            return true;
        }
    return false;
}

static bool latency(const char *s, size_t len, double *out) {
    static const char *const units[] = {"ns", "us", "ms", "s", NULL};
    static const double scale[] = {1e-9, 1e-6, 1e-3, 1.0};
    return number_unit(s, len, units, scale, out);
}

/* Seconds per byte from a rate such as "10GB/s". */
static bool per_byte(const char *s, size_t len, double *out) {
    static const char *const units[] = {"B/s", "KB/s", "MB/s", "GB/s", NULL};
    static const double scale[] = {1.0, 1e3, 1e6, 1e9};
    double rate;
    if (!number_unit(s, len, units, scale, &rate))
        return false;
    *out = rate > 0.0 ? 1.0 / rate : INFINITY; /* 0 parses: link_plausible names its range */
    return true;
}

/* "LAT,BW[,RED]" into link (gamma keeps its default when RED is absent). */
static bool link_table(const char *s, size_t len, hcomm__link_t *link) {
    const char *c1 = memchr(s, ',', len);
    if (!c1)
        return false;
    const char *rest = c1 + 1;
    size_t rlen = len - (size_t)(rest - s);
    const char *c2 = memchr(rest, ',', rlen);
    size_t bwlen = c2 ? (size_t)(c2 - rest) : rlen;
    if (!latency(s, (size_t)(c1 - s), &link->alpha) || !per_byte(rest, bwlen, &link->beta))
        return false;
    return !c2 || per_byte(c2 + 1, rlen - bwlen - 1, &link->gamma);
}

static bool positive_int(const char *s, size_t len, int *out) {
    s = hcomm__strip(s, &len);
    if (len == 0 || len > 6)
        return false;
    int v = 0;
    for (size_t i = 0; i < len; i++) {
        if (!isdigit((unsigned char)s[i]))
            return false;
        v = v * 10 + (s[i] - '0');
    }
    *out = v;
    return v > 0;
}

/* "NxG" or "A,B,...". */
static bool node_shape(const char *s, size_t len, hcomm__topo_spec_t *out) {
    const char *x = memchr(s, 'x', len);
    if (x)
        return positive_int(s, (size_t)(x - s), &out->nnodes) &&
               positive_int(x + 1, len - (size_t)(x + 1 - s), &out->per_node) &&
               (long)out->nnodes * out->per_node <= 1 << 20;
    out->nnodes = 0;
    while (len > 0) {
        const char *comma = memchr(s, ',', len);
        size_t n = comma ? (size_t)(comma - s) : len;
        if (out->nnodes == HCOMM__TOPO_MAX_LIST || !positive_int(s, n, &out->sizes[out->nnodes]))
            return false;
        out->nnodes++;
        s += n + (comma ? 1 : 0);
        len -= n + (comma ? 1 : 0);
        if (comma && len == 0)
            return false;
    }
    return out->nnodes > 0;
}

static hcomm_result_t parse_field(const char *fn, const char *var, const char *text, const char *s,
                                  size_t len, hcomm__topo_spec_t *out) {
    const char *eq = memchr(s, '=', len);
    size_t key = eq ? (size_t)(eq - s) : len;
    const char *val = eq ? eq + 1 : s + len;
    size_t vlen = len - key - (eq ? 1 : 0);
    hcomm__strip(s, &key); /* s has no leading blank: the caller stripped the field */
    bool shape =
        !eq && (strncmp(s, "mesh", len) == 0 || strncmp(s, "ring", len) == 0) && (len == 4);
    bool nodes = eq && key == 5 && strncmp(s, "nodes", 5) == 0;
    if ((shape || nodes) && out->kind != HCOMM__TOPO_DETECT)
        return bad(fn, var, text, "declares a second shape with", (int)len, s);
    if (shape) {
        out->kind = s[0] == 'm' ? HCOMM__TOPO_MESH : HCOMM__TOPO_RING;
        return HCOMM_OK;
    }
    if (nodes) {
        if (!node_shape(val, vlen, out))
            return bad(fn, var, text, "has a malformed node shape", (int)len, s);
        out->kind = HCOMM__TOPO_NODES;
        return HCOMM_OK;
    }
    int cls = !eq                                       ? -1
              : key == 5 && strncmp(s, "intra", 5) == 0 ? HCOMM__LINK_INTRA
              : key == 5 && strncmp(s, "inter", 5) == 0 ? HCOMM__LINK_INTER
                                                        : -1;
    if (cls < 0)
        return bad(fn, var, text, "has an unknown field", (int)len, s);
    if (out->has_link[cls])
        return bad(fn, var, text, "declares a link class twice with", (int)len, s);
    if (!link_table(val, vlen, &out->link[cls]))
        return bad(fn, var, text, "has a malformed link class", (int)len, s);
    if (!link_plausible(&out->link[cls]))
        return bad(fn, var, text,
                   "has a link class out of range (latency over 1 s or a rate below 1 KB/s)",
                   (int)len, s);
    out->has_link[cls] = true;
    return HCOMM_OK;
}

/* Of what the text declares, not of the text: "nodes=2x4" and " nodes=4,4 ;" describe one
 * machine, and ranks compare digests. 0 for the detected topology without tables. */
static uint64_t spec_digest(const hcomm__topo_spec_t *t) {
    if (t->kind == HCOMM__TOPO_DETECT && !t->has_link[0] && !t->has_link[1])
        return 0;
    uint64_t h = hcomm__fnv(&t->kind, sizeof t->kind, HCOMM__FNV_SEED);
    for (int i = 0; t->kind == HCOMM__TOPO_NODES && i < t->nnodes; i++) {
        int size = t->per_node > 0 ? t->per_node : t->sizes[i];
        h = hcomm__fnv(&size, sizeof size, h);
    }
    for (int k = 0; k < HCOMM__LINK_CLASSES; k++)
        if (t->has_link[k]) {
            h = hcomm__fnv(&k, sizeof k, h);
            h = hcomm__fnv(&t->link[k], sizeof t->link[k], h);
        }
    return h | 1;
}

hcomm_result_t hcomm__topo_spec_parse(const char *fn, const char *var, const char *text,
                                      hcomm__topo_spec_t *out) {
    memset(out, 0, sizeof *out);
    hcomm__link_default(out->link);
    if (!text || !text[0])
        return HCOMM_OK;
    for (const char *s = text; *s;) {
        const char *semi = strchr(s, ';');
        size_t len = semi ? (size_t)(semi - s) : strlen(s), flen = len;
        const char *field = hcomm__strip(s, &flen);
        if (flen > 0)
            HCOMM__TRY(parse_field(fn, var, text, field, flen, out));
        s += len + (semi ? 1 : 0);
    }
    out->digest = spec_digest(out);
    return HCOMM_OK;
}

int hcomm__topo_spec_ranks(const hcomm__topo_spec_t *s) {
    if (s->kind != HCOMM__TOPO_NODES)
        return 0;
    if (s->per_node > 0)
        return s->nnodes * s->per_node;
    int n = 0;
    for (int i = 0; i < s->nnodes; i++)
        n += s->sizes[i];
    return n;
}

int hcomm__topo_spec_node(const hcomm__topo_spec_t *s, int r) {
    if (s->kind != HCOMM__TOPO_NODES || r < 0)
        return -1;
    if (s->per_node > 0)
        return r / s->per_node < s->nnodes ? r / s->per_node : -1;
    for (int i = 0; i < s->nnodes; i++) {
        if (r < s->sizes[i])
            return i;
        r -= s->sizes[i];
    }
    return -1;
}

/* --- HCOMM_TOPO, once per process --- */

static hcomm__topo_spec_t env_spec;
static hcomm_result_t env_res = HCOMM_OK;
static char env_msg[768];
static pthread_once_t env_once = PTHREAD_ONCE_INIT;

static void read_env(void) {
    env_res = hcomm__topo_spec_parse("hcomm", "HCOMM_TOPO", getenv("HCOMM_TOPO"), &env_spec);
    if (env_res != HCOMM_OK) {
        snprintf(env_msg, sizeof env_msg, "%s", hcomm__err_detail("hcomm"));
        hcomm__topo_spec_parse("hcomm", "HCOMM_TOPO", NULL, &env_spec);
    }
}

const hcomm__topo_spec_t *hcomm__topo_spec_env(void) {
    pthread_once(&env_once, read_env);
    return &env_spec;
}

hcomm_result_t hcomm__topo_spec_env_validate(const char *fn) {
    pthread_once(&env_once, read_env);
    return env_res == HCOMM_OK ? HCOMM_OK : hcomm__err(env_res, fn, "%s", env_msg);
}

hcomm_result_t hcomm__topo_spec_env_fits(const char *fn, int world) {
    const hcomm__topo_spec_t *s = hcomm__topo_spec_env();
    int declared = hcomm__topo_spec_ranks(s);
    if (s->kind != HCOMM__TOPO_NODES || declared == world)
        return HCOMM_OK;
    return hcomm__err(HCOMM_ERR_INVALID_ARG, fn,
                      "HCOMM_TOPO=\"%s\" declares %d ranks but the world has %d",
                      getenv("HCOMM_TOPO"), declared, world);
}

/* --- HCOMM_TUNING_FILE, once per process --- */

static hcomm__link_t tuned[HCOMM__LINK_CLASSES];
static uint64_t tuning_digest;
static hcomm_result_t tuning_res = HCOMM_OK;
static char tuning_msg[768];
static pthread_once_t tuning_once = PTHREAD_ONCE_INIT;

static char *trim(char *s) {
    while (isspace((unsigned char)*s))
        s++;
    char *e = s + strlen(s);
    while (e > s && isspace((unsigned char)e[-1]))
        *--e = '\0';
    return s;
}

/* One "key = value" line into tuned[]; false when the key or value is unknown, out of range
 * (as HCOMM_TOPO's tables) or set by an earlier line (bit per class and field in *seen). */
static bool tuning_line(char *key, const char *val, unsigned *seen) {
    static const char *const fields[] = {"alpha_us", "bw_GBps", "reduce_GBps"};
    char *dot = strchr(key, '.');
    if (!dot)
        return false;
    *dot = '\0';
    int cls = strcmp(key, "intra") == 0   ? HCOMM__LINK_INTRA
              : strcmp(key, "inter") == 0 ? HCOMM__LINK_INTER
                                          : -1;
    int f = 0;
    while (f < 3 && strcmp(dot + 1, fields[f]) != 0)
        f++;
    char *end = NULL;
    double v = strtod(val, &end);
    if (cls < 0 || f == 3 || end == val || *end != '\0' || !isfinite(v) || v <= 0.0)
        return false;
    double sec = f == 0 ? v * 1e-6 : 1.0 / (v * 1e9);
    unsigned bit = 1u << (cls * 3 + f);
    if (!isfinite(sec) || sec <= 0.0 || (*seen & bit)) /* 1e-320 GB/s: no finite time per byte */
        return false;
    hcomm__link_t link = tuned[cls];
    *(f == 0 ? &link.alpha : f == 1 ? &link.beta : &link.gamma) = sec;
    if (!link_plausible(&link)) /* the bounds of HCOMM_TOPO's tables */
        return false;
    *seen |= bit;
    tuned[cls] = link;
    return true;
}

static void read_tuning(void) {
    memcpy(tuned, link_defaults, sizeof tuned);
    const char *path = getenv("HCOMM_TUNING_FILE");
    if (!path || !path[0])
        return;
    FILE *f = fopen(path, "r");
    if (!f) {
        tuning_res =
            hcomm__err(HCOMM_ERR_INVALID_ARG, "hcomm",
                       "HCOMM_TUNING_FILE=\"%s\" cannot be read: %s", path, strerror(errno));
        snprintf(tuning_msg, sizeof tuning_msg, "%s", hcomm__err_detail("hcomm"));
        tuning_digest = 1;
        return;
    }
    char *line = NULL; /* getline: a long comment line stays one line */
    size_t cap = 0;
    ssize_t got;
    uint64_t h = HCOMM__FNV_SEED;
    unsigned seen = 0;
    for (int no = 1; (got = getline(&line, &cap, f)) >= 0; no++) {
        h = hcomm__fnv(line, (size_t)got, h);
        char *hash = strchr(line, '#');
        if (hash)
            *hash = '\0';
        char *s = trim(line), *eq = strchr(s, '=');
        if (!*s)
            continue;
        if (eq)
            *eq = '\0';
        if (eq && tuning_line(trim(s), trim(eq + 1), &seen))
            continue;
        if (tuning_res == HCOMM_OK) {
            tuning_res = hcomm__err(HCOMM_ERR_INVALID_ARG, "hcomm",
                                    "HCOMM_TUNING_FILE=\"%s\" line %d is not \"CLASS.KEY = "
                                    "positive number\" with CLASS intra or inter and KEY "
                                    "alpha_us (at most 1e6), bw_GBps or reduce_GBps (at least "
                                    "1e-6), each key once",
                                    path, no);
            snprintf(tuning_msg, sizeof tuning_msg, "%s", hcomm__err_detail("hcomm"));
        }
    }
    if (ferror(f) && tuning_res == HCOMM_OK) { /* a directory opens but does not read */
        tuning_res =
            hcomm__err(HCOMM_ERR_INVALID_ARG, "hcomm",
                       "HCOMM_TUNING_FILE=\"%s\" cannot be read: %s", path, strerror(errno));
        snprintf(tuning_msg, sizeof tuning_msg, "%s", hcomm__err_detail("hcomm"));
    }
    if (seen == 0 && tuning_res == HCOMM_OK) {
        tuning_res = hcomm__err(HCOMM_ERR_INVALID_ARG, "hcomm",
                                "HCOMM_TUNING_FILE=\"%s\" sets nothing (expected lines such as "
                                "\"inter.bw_GBps = 1.25\", as hcomm-bench --calibrate writes)",
                                path);
        snprintf(tuning_msg, sizeof tuning_msg, "%s", hcomm__err_detail("hcomm"));
    }
    free(line);
    fclose(f);
    tuning_digest = h | 1;
    if (tuning_res != HCOMM_OK)
        memcpy(tuned, link_defaults, sizeof tuned);
}

void hcomm__link_default(hcomm__link_t link[HCOMM__LINK_CLASSES]) {
    pthread_once(&tuning_once, read_tuning);
    memcpy(link, tuned, sizeof tuned);
}

hcomm_result_t hcomm__tuning_validate(const char *fn) {
    pthread_once(&tuning_once, read_tuning);
    return tuning_res == HCOMM_OK ? HCOMM_OK : hcomm__err(tuning_res, fn, "%s", tuning_msg);
}

/* --- what every rank must share --- */

static const char *const sel_vars[HCOMM__SEL_COUNT] = {
    "HCOMM_ALGO", "HCOMM_TOPO", "HCOMM_TUNING_FILE", "HCOMM_CHECK", "HCOMM_EAGER_LIMIT"};

static _Atomic(hcomm__algo_digest_fn) algo_digest;

void hcomm__selection_register_algo_digest(hcomm__algo_digest_fn fn) {
    atomic_store(&algo_digest, fn);
}

const char *hcomm__selection_var(int i) {
    return i >= 0 && i < HCOMM__SEL_COUNT ? sel_vars[i] : "?";
}

void hcomm__selection_digests(uint64_t out[HCOMM__SEL_COUNT]) {
    const char *algo = getenv(sel_vars[HCOMM__SEL_ALGO]);
    hcomm__algo_digest_fn parsed = atomic_load(&algo_digest);
    out[HCOMM__SEL_ALGO] = parsed            ? parsed()
                           : algo && algo[0] ? hcomm__fnv(algo, strlen(algo), HCOMM__FNV_SEED) | 1
                                             : 0;
    out[HCOMM__SEL_TOPO] = hcomm__topo_spec_env()->digest; /* what it declares, not its text */
    pthread_once(&tuning_once, read_tuning);
    out[HCOMM__SEL_TUNING] = tuning_digest; /* the contents: paths may differ per node */
    /* the mode, not the text: unset and "always" are the same */
    out[HCOMM__SEL_CHECK] = (uint64_t)hcomm__check_mode() + 1;
    size_t eager = 0; /* 0 for a malformed value: the comm's creation names it */
    bool ok = hcomm__env_eager_limit("hcomm_launch", &eager) == HCOMM_OK;
    out[HCOMM__SEL_EAGER] = ok ? (uint64_t)eager + 1 : 0;
}
