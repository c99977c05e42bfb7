/* The flight recorder as JSON for hcomm-doctor (dump.h). On the local backend the ranks are
 * threads of one process: each copies its own communicator's records into the process's list
 * under a mutex, and files are written from those copies only. One call or communicator header
 * per line, so that the doctor's reader stays small. */
#include "algo/dump.h"

#include "algo/sig.h"
#include "core/env.h"
#include "core/log.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* One communicator's records as one rank dumped them last. */
typedef struct snap {
    int world_rank, index, size, peer;
    uint64_t id;
    int *members;                   /* world ranks */
    const char *result, *failed_fn; /* the public call that failed: maybe not a collective */
    uint32_t failed_seq;            /* 0: the failure came before a sequence number */
    unsigned ncalls;
    hcomm__flight_t calls[HCOMM__FLIGHT];
} snap_t;

static pthread_mutex_t dump_mu = PTHREAD_MUTEX_INITIALIZER;
static snap_t *snaps;
static int nsnaps, snaps_cap;

/* This rank's slot for communicator id (a new one at the end), under dump_mu; NULL: no
 * memory. */
static snap_t *slot(int world_rank, uint64_t id) {
    for (int i = 0; i < nsnaps; i++)
        if (snaps[i].world_rank == world_rank && snaps[i].id == id)
            return &snaps[i];
    if (nsnaps == snaps_cap) {
        int cap = snaps_cap ? 2 * snaps_cap : 8;
        snap_t *n = realloc(snaps, sizeof *n * (size_t)cap);
        if (!n)
            return NULL;
        snaps = n;
        snaps_cap = cap;
    }
    snaps[nsnaps] = (snap_t){.world_rank = world_rank, .id = id};
    return &snaps[nsnaps++];
}

static bool fill(snap_t *s, hcomm_comm_t *c, const algo_state_t *a, hcomm_result_t res) {
    int *m = realloc(s->members, sizeof(int) * (size_t)c->size);
    if (!m)
        return false;
    memcpy(m, c->world_ranks, sizeof(int) * (size_t)c->size);
    s->members = m;
    s->index = c->rank;
    s->size = c->size;
    s->result = hcomm_result_name(res);
    s->failed_fn = c->call_fn;
    s->ncalls = a->nflight < HCOMM__FLIGHT ? a->nflight : HCOMM__FLIGHT;
    unsigned first = a->nflight - s->ncalls;
    for (unsigned i = 0; i < s->ncalls; i++)
        s->calls[i] = a->flight[(first + i) % HCOMM__FLIGHT];
    const hcomm__flight_t *last = s->ncalls ? &s->calls[s->ncalls - 1] : NULL;
    bool pending = last && strcmp(last->state, "done") != 0;
    s->failed_seq = pending ? last->seq : 0;
    bool known = c->wait_peer >= 0 && c->wait_peer < c->size; /* this call's (hcomm__enter) */
    s->peer = known ? c->world_ranks[c->wait_peer] : -1;
    return true;
}

/* --- writing --- */

static bool is_reduction(uint32_t kind) {
    return kind == HCOMM__CALL_ALL_REDUCE || kind == HCOMM__CALL_REDUCE_SCATTER ||
           kind == HCOMM__CALL_REDUCE || kind == HCOMM__CALL_REDUCE_SCATTERV;
}

static bool is_rooted(uint32_t kind) {
    return kind == HCOMM__CALL_BROADCAST || kind == HCOMM__CALL_REDUCE ||
           kind == HCOMM__CALL_GATHER || kind == HCOMM__CALL_SCATTER;
}

static void write_call(FILE *f, const hcomm__flight_t *e, bool more) {
    const char *dt = "?"; /* a failed rank's dtype may be invalid: no error may replace its own */
    if (!hcomm__dtype_valid((hcomm_dtype_t)e->sig.dtype) ||
        hcomm_dtype_name((hcomm_dtype_t)e->sig.dtype, &dt) != HCOMM_OK)
        dt = "?";
    fprintf(f,
            "      {\"seq\": %u, \"call\": \"%s\", \"kind\": \"%s\", \"count\": %llu, "
            "\"dtype\": \"%s\", \"op\": \"%s\", \"root\": %d, \"algo\": \"%s\", \"state\": "
            "\"%s\"}%s\n",
            (unsigned)e->seq, e->fn, hcomm__call_name(e->sig.call),
            (unsigned long long)e->sig.count, dt,
            is_reduction(e->sig.call) ? hcomm__op_name(e->sig.op) : "",
            is_rooted(e->sig.call) ? (int)e->sig.root : -1, hcomm__algo_name(e->sig.algo), e->state,
            more ? "," : "");
}

static void write_comm(FILE *f, const snap_t *s, bool more) {
    fprintf(f, "    {\"comm\": \"%016llx\", \"size\": %d, \"index\": %d, \"members\": [",
            (unsigned long long)s->id, s->size, s->index);
    for (int r = 0; r < s->size; r++)
        fprintf(f, "%s%d", r ? ", " : "", s->members[r]);
    fprintf(f,
            "], \"result\": \"%s\", \"failed_call\": \"%s\", \"failed_seq\": %u, \"peer\": %d, "
            "\"calls\": [\n",
            s->result, s->failed_fn, (unsigned)s->failed_seq, s->peer);
    for (unsigned i = 0; i < s->ncalls; i++)
        write_call(f, &s->calls[i], i + 1 < s->ncalls);
    fprintf(f, "    ]}%s\n", more ? "," : "");
}

static void write_rank_to(FILE *f, int w) {
    char host[256] = "?";
    if (gethostname(host, sizeof host - 1) != 0 || strpbrk(host, "\"\\"))
        snprintf(host, sizeof host, "?");
    fprintf(f,
            "{\"hcomm_dump\": 1, \"rank\": %d, \"host\": \"%s\", \"pid\": %ld, \"time\": %lld,\n",
            w, host, (long)getpid(), (long long)time(NULL));
    fprintf(f, "  \"comms\": [\n");
    int last = -1;
    for (int i = 0; i < nsnaps; i++)
        if (snaps[i].world_rank == w)
            last = i;
    for (int i = 0; i <= last; i++)
        if (snaps[i].world_rank == w)
            write_comm(f, &snaps[i], i < last);
    fprintf(f, "  ]}\n");
}

/* Writes a temporary file and renames it over the last one, so a reader never sees half. */
static bool write_rank(const char *dir, int w) {
    char path[4096], tmp[4200];
    snprintf(path, sizeof path, "%s/hcomm-rank%d.json", dir, w);
    snprintf(tmp, sizeof tmp, "%s/.hcomm-rank%d.json.%ld.tmp", dir, w, (long)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f)
        return false;
    write_rank_to(f, w);
    bool ok = fclose(f) == 0;
    if (ok && rename(tmp, path) == 0)
        return true;
    remove(tmp);
    return false;
}

void hcomm__dump_comm(hcomm_comm_t *c, const algo_state_t *a, hcomm_result_t res) {
    const char *dir = hcomm__dump_dir();
    if (!dir)
        return;
    int w = c->world_ranks[c->rank];
    pthread_mutex_lock(&dump_mu);
    snap_t *s = slot(w, hcomm__comm_id(c));
    bool ok = s && fill(s, c, a, res) && write_rank(dir, w);
    pthread_mutex_unlock(&dump_mu);
    if (!ok)
        HCOMM__LOG(HCOMM__LOG_WARN, HCOMM__SUB_ALGO, "cannot write %s/hcomm-rank%d.json", dir, w);
}
