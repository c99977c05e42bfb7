/* Algorithm selection and the HCOMM_ALGO syntax (see select.h). */
#include "algo/select.h"

#include "core/env.h"
#include "core/log.h"
#include "core/topo_spec.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Largest all_reduce (bytes) that runs as recursive doubling on a transport without
 * shared-memory collectives: below it latency rules, and one round trip per doubling beats a
 * separate signature check plus the native call. */
#define RD_MAX_BYTES 4096

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

/* Between two processes on a transport without shared-memory collectives (mpi), small calls
 * run hcomm's own single exchange instead of Open MPI's call: rd all_reduce, rd all_gather, rhd
 * reduce_scatter and tree broadcast, one lane message each way per 3968-byte piece with the
 * signature inside, so no agreement runs first (coll.c, pair.c). The native path pays the
 * agreement and Open MPI's nonblocking collective (hcomm keeps its calls abortable), which is
 * about twice the blocking call's time at small sizes. Measured with hcomm-bench --algo (mpi, 2
 * processes, 2 cores, checking on): all_gather rd 1.2 us against native 2.8 and raw
 * MPI_Allgather 1.1 at 8 B, 4.6 against 6.2 (raw 5.0) at 16 KiB, behind from 32 KiB, where
 * direct reads take over (twoshot.c: 6.6 against native 7.9 and raw 7.5 at 32 KiB, 28 against
 * 30 and 26 at 256 KiB, 742 against 787 and 917 at 4 MiB; with checking off too); reduce_scatter
 * rhd 1.3 against 3.2 (raw 1.3) at 8 B, 3.2-4.5 against 5.7-7.3 (raw 6.1-6.7) at 8 KiB, and from 32
 * KiB direct, each rank reducing its block straight from the peer's input (twoshot.c; coll.c falls
 * back to rhd where peers cannot be read): 32 KiB 8.6-10.6 us against rhd 9.2-14.8 and
 * raw 10.1-11.5, 128 KiB 19.6-23.8 against 30.6-53.2 and 25.9-30.7, 1 MiB 135-148 against 270 and
 * 252-289, 16 MiB 5.5 ms against 7.5 and 18-19; broadcast tree 1.1 against 2.5 (raw 1.0) at 8
 * B, 3.6-3.8 against native 4.8-5.8 (raw 4.2-4.3) at 8 KiB (medians of 3 interleaved runs), behind
 * at 32 KiB (11.3 against 9.0). With checking off a broadcast's receiver does not answer, as in
 * MPI_Bcast. Messages over 256 bytes (payload plus hcomm's 64-byte header) leave Open MPI's inline
 * path (btl_vader_max_inline_send), so from 192-byte pieces hcomm's exchange pays that step where
 * the raw call's does from 256. More processes: many_default below. */
/* Since direct loads the root's hcomm_mem_alloc buffer in place, a broadcast runs direct from 8
 * KiB (below that tree): hcomm-bench --algo all, 2 processes, 100-200 calls, 2 runs, in place.
 * On shared buffers direct 2.8-3.3 us against tree 5.6-5.8 and native 4.1-4.6 (raw 2.9-3.4) at 8
 * KiB, 4.1 against native 5.7 at 32 KiB, 7.1 against 11.7 at 128 KiB, 187 against 258 at 2 MiB,
 * 6.9 against 10.5 ms at 32 MiB; tree still ahead at 2 KiB (1.8 against 2.7). On malloc's
 * buffers (process_vm_readv) direct is at par with native from 8 KiB (3.3-3.9 against 3.3-4.2;
 * 10.0 against 10.2 at 128 KiB, 1.04x native from 2 MiB) and tree, at 2.4-5.2, on either side.
 * With more processes direct leads on shared buffers from 128 KiB and by 1.7-1.8x from 512 KiB
 * (4 processes: 111 against native 186 us at 512 KiB, 2.0 against 3.6 ms at 8 MiB); on malloc's
 * it trails native by up to 1.4x to 128 KiB, is at par at 512 KiB (212 against 218) and 1.10-1.14x
 * behind from 2 MiB: from 512 KiB, where the gain on shared buffers outweighs that. These are
 * the sizes without a board; on one (every rank on one host, the usual case) coll.c runs shm
 * below 4 KiB / 64 KiB and direct above. */
#define PAIR_BROADCAST_DIRECT_BYTES ((size_t)8 << 10)
#define MANY_BROADCAST_DIRECT_BYTES ((size_t)512 << 10)
/* Since direct loads hcomm_mem_alloc buffers in place (no process_vm_readv), it leads from 8
 * KiB (reduce_scatter: 2.4 us against rhd 3.5 and raw 5.2-5.6; on malloc's buffers 3.8 against
 * 3.5), and so it does for all_gather, where from 8 KiB rd's 4 KiB blocks no longer fit one lane
 * message (2.6-2.7 us against rd 3.3 and raw 3.7-3.8 at 8 KiB, at par with rd at 6 KiB; on
 * malloc's buffers 4.0-4.1 against rd 3.4-3.7 at 8 KiB, 4.4 against 4.3-4.6 at 10 KiB, 3.2
 * against 4.4 at 16 KiB); 200 calls each, 2 runs. */
#define PAIR_REDUCESCATTER_DIRECT_BYTES ((size_t)8 << 10)
#define PAIR_ALLGATHER_DIRECT_BYTES ((size_t)8 << 10)
/* rd on the lane: one message per 3968-byte piece each way, no agreement; measured ahead of
 * rhd and twoshot up to 4 KiB (4 KiB: rd 3.2-3.4 us, twoshot 3.2-3.5 on hcomm_mem_alloc buffers,
 * which it loads in place, 6.0-6.8 on malloc's, which it copies with process_vm_readv) and behind
 * twoshot from 8 KiB (rd 6.0-6.8, twoshot 3.3-4.1, or 6.3-6.4 on malloc's buffers; medians of
 * 200 calls, 2 runs each) */
#define PAIR_ALLREDUCE_RD_MAX_BYTES ((size_t)8 << 10) /* twoshot from here (coll.c) */

static int pair_default(int coll, size_t bytes) {
    if (coll == HCOMM__COLL_ALLREDUCE && bytes < PAIR_ALLREDUCE_RD_MAX_BYTES)
        return HCOMM__ALGO_RD;
    if (coll == HCOMM__COLL_REDUCESCATTER)
        return bytes < PAIR_REDUCESCATTER_DIRECT_BYTES ? HCOMM__ALGO_RHD : HCOMM__ALGO_DIRECT;
    if (coll == HCOMM__COLL_BROADCAST)
        return bytes < PAIR_BROADCAST_DIRECT_BYTES ? HCOMM__ALGO_TREE : HCOMM__ALGO_DIRECT;
    if (coll == HCOMM__COLL_ALLGATHER)
        return bytes < PAIR_ALLGATHER_DIRECT_BYTES ? HCOMM__ALGO_RD : HCOMM__ALGO_DIRECT;
    return -1;
}

/* With more than two processes on such a transport: recursive doubling over the whole
 * vector on the lane (coll.c's rd_union, rd_broadcast, rd_reduce_scatter), log2 p exchanges
 * with the signature inside, against the agreement's log2 p and then Open MPI's nonblocking
 * call. Measured with hcomm-bench --algo all (mpi, 4 processes on 2 cores, checking on):
 * all_gather rd 16-23 us against native 26-29 and raw MPI_Allgather 16-24 up to 1 KiB, 21
 * against 33-35 at 2 KiB (medians of 3 interleaved runs), behind at 4 KiB (42 against 35);
 * reduce_scatter rd 16-18 against 27-30 (raw 16-22) up to 1 KiB, 36 against 42 at 4 KiB (unchecked
 * 31 against 27.5), behind at 16 KiB (96 against 56); broadcast rd 17-18.5 against 20-23 up to 1
 * KiB (raw MPI_Bcast 10.5-12: its root only sends), behind at 4 KiB (37 against 31). From 32 KiB a
 * reduce_scatter runs direct (twoshot.c, as with 2; addresses and barriers on the lane, no
 * agreement): 54-58 against native 68-70 (raw 54-56) at 32 KiB, 90-92 against 143-145 at 128
 * KiB, 3.5 against 6.3 ms at 4 MiB, 13 against 54 (raw 49) at 16 MiB. all_gather direct from 32
 * KiB: 50 against native 60 (raw 39) at 32 KiB, 172 against 199 (175) at 512 KiB, 3.4 against 3.5
 * (4.2) ms at 8 MiB. Since direct loads hcomm_mem_alloc buffers in place it leads both from 16
 * KiB on either kind of buffer (60 calls, 4 processes: all_gather 25 us against native 40 on
 * shared buffers, 31 against 36 on malloc's; reduce_scatter 21 against 32, 42.5 against 47);
 * below, only on shared ones: reduce_scatter runs direct from 8 KiB, where the gain there (2
 * runs of 60 calls: 23 us against native 30-31) outweighs the loss on malloc's buffers (33-40
 * against 31-35); all_gather stays native at 8 KiB (shared 23 against 25-26, malloc's 30-33
 * against 24-25), and so does all_reduce (twoshot 30-32 against 34-37; malloc's 45-50 against
 * 37). */
#define MANY_ALLGATHER_RD_MAX_BYTES 2048
#define MANY_REDUCESCATTER_RD_MAX_BYTES 2048
#define MANY_BROADCAST_RD_MAX_BYTES 1024
#define MANY_REDUCESCATTER_DIRECT_BYTES ((size_t)8 << 10)
#define MANY_ALLGATHER_DIRECT_BYTES ((size_t)16 << 10)

/* With HCOMM_CHECK=off (the same on every rank: hcomm_launch compares it) Open MPI's own
 * collectives run unchecked. Its broadcast's root only sends: 12.4-13.9 us against rd's
 * 20.2-20.5 up to 1 KiB (raw 11.4-13.5; 4 processes). Its all_gather stays ahead of direct up
 * to 256 KiB (2 interleaved runs, 4 processes: 32 KiB 44-48 us against 50-54, 128 KiB 67-70
 * against 70-76, 256 KiB 100-104 against 99-106; raw 40-43, 63-68, 98-104), behind from 512 KiB
 * (1 MiB: 325-401 against 308-394). That was with cross-memory attach on every buffer; on
 * hcomm_mem_alloc buffers, which direct loads in place, it leads from 64 KiB (25 against 27, 256
 * KiB 51.5 against 64-69), on malloc's it is at par at 256 KiB (79 against 79). A later run (30
 * calls each) put direct at 36 us against native 50.6 at 128 KiB on shared buffers and 62 against
 * 55 on malloc's, so direct runs from 128 KiB. Unchecked, direct broadcast (no agreement either)
 * leads on shared buffers from 128 KiB too (37 against 48; 50 against 79 at 256 KiB), on
 * malloc's it is 1.06x behind at 128 KiB and ahead at 256 KiB (63 against 76). */
#define MANY_ALLGATHER_DIRECT_BYTES_OFF ((size_t)128 << 10)
#define MANY_BROADCAST_DIRECT_BYTES_OFF ((size_t)128 << 10)

static int many_default(int coll, size_t bytes) {
    bool off = hcomm__check_mode() == HCOMM__CHECK_OFF;
    if (coll == HCOMM__COLL_ALLGATHER && bytes <= MANY_ALLGATHER_RD_MAX_BYTES)
        return HCOMM__ALGO_RD;
    if (coll == HCOMM__COLL_ALLGATHER &&
        bytes >= (off ? MANY_ALLGATHER_DIRECT_BYTES_OFF : MANY_ALLGATHER_DIRECT_BYTES))
        return HCOMM__ALGO_DIRECT;
    if (coll == HCOMM__COLL_REDUCESCATTER && bytes <= MANY_REDUCESCATTER_RD_MAX_BYTES)
        return HCOMM__ALGO_RD;
    if (coll == HCOMM__COLL_REDUCESCATTER && bytes >= MANY_REDUCESCATTER_DIRECT_BYTES)
        return HCOMM__ALGO_DIRECT;
    if (coll == HCOMM__COLL_BROADCAST && bytes <= MANY_BROADCAST_RD_MAX_BYTES && !off)
        return HCOMM__ALGO_RD;
    if (coll == HCOMM__COLL_BROADCAST &&
        bytes >= (off ? MANY_BROADCAST_DIRECT_BYTES_OFF : MANY_BROADCAST_DIRECT_BYTES))
        return HCOMM__ALGO_DIRECT;
    return -1;
}

/* reduce: the root's direct reads of every input (coll.c falls back to tree where peers cannot
 * be read) against the binomial tree, hcomm-bench reduce --algo all, 10 calls, f32 sum. On mpi
 * ahead from 4 KiB on either kind of buffer: 2 processes 2.6 us against tree 5.1 (raw
 * MPI_Reduce 2.8) at 4 KiB, 17.5 against 63 (raw 25) at 256 KiB, 11 against 35 ms at 16 MiB
 * (malloc's: 4.1 against 5.8, 47 against 70, 13.6 against 32.6 ms); 4 processes 22.6 against 44
 * at 16 KiB, 1.4 against 3.8 ms at 4 MiB. On local threads (4 ranks) tree leads to 16 KiB (21
 * against 34 us) and direct from 256 KiB (94 against 103; 1.25 against 2.2 ms at 4 MiB); with
 * 2, whose waits spin (core/wait.c), direct from 4 KiB (200 calls, 2 runs: 2.8 against 3.0-3.1
 * at 4 KiB, 2.6-3.0 against 3.9-4.1 at 8 KiB, 4.0 against 8.0-8.5 at 32 KiB; tree 2.0-2.1
 * against 2.7-2.8 at 1 KiB); with 4, direct from 64 KiB (3 runs of 100 calls: 31-36 against
 * 35-38 us, at par in 4 more of 200, 32.6-37.4 against 32.6-36.6; 32 KiB 31-43 against 26-34;
 * 128 KiB 42-58 against 52-65), and so bf16 from 32 KiB, sized as f32 (coll.c: 31-38 against
 * tree's 39-48); with 8, tree still leads at 128 KiB.
 * Rabenseifner's reduce (rhd) trails both here. Gather and scatter stay direct: tree is behind it
 * at every size measured (4 local ranks, 1 KiB to 4 MiB). */
#define REDUCE_DIRECT_BYTES ((size_t)4 << 10)
#define REDUCE_DIRECT_BYTES_SHM ((size_t)256 << 10)
#define REDUCE_DIRECT_BYTES_SHM_4 ((size_t)64 << 10)

/* Where reduce turns from tree to direct on a shared-memory transport with p ranks. */
static size_t reduce_direct_bytes_shm(int p) {
    return p == 2   ? REDUCE_DIRECT_BYTES
           : p <= 4 ? REDUCE_DIRECT_BYTES_SHM_4
                    : REDUCE_DIRECT_BYTES_SHM;
}

/* all_to_allv by its largest per-peer block (bytes), as measured with hcomm-bench all_to_all
 * --algo all on this 2-core machine: shared-memory transports' native one-copy exchange wins
 * at every size (local, 2 to 8 ranks: pairwise 2x, direct 3x slower at 8 B). Under mpi the
 * native call pays a signature agreement and a count check before MPI_Ialltoallv, so small
 * blocks run pairwise (2 processes: 3.4 against 8.4 us at 8 B; 4: 70 against 86-106 us);
 * from 8 processes Bruck's log2(p) steps win up to 512 B blocks (8 B: 146 against 187-201
 * us). Larger blocks: with 2 processes direct reads (one copy: 10.5 against 20.6 us at
 * 4 KiB, the caller falls back where peers cannot be read), else the native call. */
static int a2a_default(size_t bytes, int p, bool shm) {
    if (shm)
        return HCOMM__ALGO_NATIVE;
    if (p >= 8 && bytes <= 512)
        return HCOMM__ALGO_BRUCK;
    if (bytes <= (p <= 2 ? (size_t)2048 : (size_t)8192))
        return HCOMM__ALGO_PAIRWISE;
    return p <= 2 ? HCOMM__ALGO_DIRECT : HCOMM__ALGO_NATIVE;
}

/* Today's measured defaults: shared-memory transports run their one-copy native collectives;
 * elsewhere a small all_reduce runs recursive doubling, two processes' small calls a single
 * exchange (pair_default), more processes' recursive doubling (many_default), and everything
 * else the native one. */
static int default_algo(int coll, size_t bytes, int p, bool shm) {
    if (coll == HCOMM__COLL_ALLTOALLV)
        return a2a_default(bytes, p, shm);
    if (coll == HCOMM__COLL_ALLREDUCE && !shm && bytes <= RD_MAX_BYTES)
        return HCOMM__ALGO_RD;
    int pair = shm ? -1 : p == 2 ? pair_default(coll, bytes) : many_default(coll, bytes);
    if (pair >= 0)
        return pair;
    if (coll == HCOMM__COLL_REDUCE)
        return bytes >= (shm ? reduce_direct_bytes_shm(p) : REDUCE_DIRECT_BYTES)
                   ? HCOMM__ALGO_DIRECT
                   : HCOMM__ALGO_TREE;
    /* Both ahead of tree. Open MPI's (mpi: 4 processes, hcomm_mem_alloc buffers, checked) at
     * 256 KiB gather 29 us against direct 43, scatter 30 against 40; 2 MiB 228 against 238 and
     * 181 against 245; 16 MiB at par and 2.0 against 2.1 ms (2 processes: at par to 1.04x
     * ahead from 256 KiB); the board's shm leads below (coll.c). */
    if (coll == HCOMM__COLL_GATHER || coll == HCOMM__COLL_SCATTER)
        return shm ? HCOMM__ALGO_DIRECT : HCOMM__ALGO_NATIVE;
    if (valid[coll] & BIT(HCOMM__ALGO_NATIVE))
        return HCOMM__ALGO_NATIVE;
    for (int i = 0; i < HCOMM__ALGO_COUNT; i++)
        if (valid[coll] & BIT(preference[i]))
            return preference[i];
    return HCOMM__ALGO_NATIVE;
}

uint32_t hcomm__algo_mask(const hcomm__algo_set_t *over, int coll) {
    const hcomm__algo_set_t *set = over ? over : hcomm__algo_env();
    return valid[coll] & (set ? set->allowed[coll] : ~0u);
}

bool hcomm__algo_allowed(const hcomm__algo_set_t *over, int coll, int algo) {
    return (hcomm__algo_mask(over, coll) & BIT(algo)) != 0;
}

int hcomm__algo_choose(const hcomm__algo_set_t *over, int coll, size_t bytes, int p, bool shm,
                       const char **why) {
    const hcomm__algo_set_t *set = over ? over : hcomm__algo_env();
    int algo = default_algo(coll, bytes, p, shm);
    *why = "default";
    if (set && !(set->allowed[coll] & BIT(algo))) {
        *why = over ? "hcomm_comm_set_algo" : "HCOMM_ALGO";
        for (int i = 0; i < HCOMM__ALGO_COUNT; i++)
            if (set->allowed[coll] & BIT(preference[i])) {
                algo = preference[i];
                break;
            }
    }
    return algo;
}
