/* The verdict on each communicator: the first sequence number some member has not finished,
 * and what every member did there. */
#include "doctor.h"

#include <stdlib.h>
#include <string.h>

/* What a member did at the verdict's sequence number. */
typedef enum { C_WAIT, C_DONE, C_BEHIND, C_NODUMP, C_OTHER, C_DIFFER, C_KINDS } cls_t;

typedef struct verdict {
    const doc_set_t *set;
    const doc_rec_t *any; /* a record of the communicator: its members */
    unsigned seq;         /* the first call not done (0: none) */
    const doc_call_t *ref;
    int ref_rank;
    const doc_rec_t **rec; /* per member; NULL: no dump */
    cls_t *cls;
} verdict_t;

static bool pending(const doc_call_t *c) {
    return strcmp(c->state, "done") != 0;
}

static unsigned first_pending(const doc_set_t *s, const char *comm) {
    unsigned seq = 0;
    for (int i = 0; i < s->nrecs; i++)
        for (int k = 0; strcmp(s->recs[i].comm, comm) == 0 && k < s->recs[i].ncalls; k++) {
            const doc_call_t *c = &s->recs[i].calls[k];
            if (pending(c) && (seq == 0 || c->seq < seq))
                seq = c->seq;
        }
    return seq;
}

static bool same_call(const doc_call_t *a, const doc_call_t *b) {
    return strcmp(a->fn, b->fn) == 0 && strcmp(a->kind, b->kind) == 0;
}

static bool same_args(const doc_call_t *a, const doc_call_t *b) {
    return same_call(a, b) && a->count == b->count && strcmp(a->dtype, b->dtype) == 0 &&
           strcmp(a->op, b->op) == 0 && a->root == b->root;
}

/* The call most members made at v->seq (ties: the first member's in the communicator's order). */
static void pick_ref(verdict_t *v) {
    int best = -1, n = v->any->size;
    for (int i = 0; i < n; i++) {
        const doc_call_t *c = doc_call_at(v->rec[i], v->seq);
        int votes = 0;
        for (int j = 0; c && j < n; j++) {
            const doc_call_t *o = doc_call_at(v->rec[j], v->seq);
            votes += o && same_args(c, o);
        }
        if (c && votes > best) {
            best = votes;
            v->ref = c;
            v->ref_rank = v->any->members[i];
        }
    }
}

static cls_t classify(const verdict_t *v, int i) {
    const doc_call_t *c = doc_call_at(v->rec[i], v->seq);
    if (!v->rec[i])
        return C_NODUMP;
    if (!c)
        return C_BEHIND;
    if (!same_call(c, v->ref))
        return C_OTHER;
    if (!same_args(c, v->ref))
        return C_DIFFER;
    return pending(c) ? C_WAIT : C_DONE;
}

static bool verdict_make(verdict_t *v, const doc_set_t *s, const doc_rec_t *any) {
    int n = any->size;
    *v = (verdict_t){.set = s, .any = any, .seq = first_pending(s, any->comm), .ref_rank = -1};
    v->rec = calloc((size_t)(n > 0 ? n : 1), sizeof *v->rec);
    v->cls = calloc((size_t)(n > 0 ? n : 1), sizeof *v->cls);
    if (!v->rec || !v->cls)
        return false;
    for (int i = 0; i < n; i++)
        v->rec[i] = doc_find(s, any->comm, any->members[i]);
    if (v->seq == 0)
        return true;
    pick_ref(v);
    for (int i = 0; i < n; i++)
        v->cls[i] = classify(v, i);
    return true;
}

static void verdict_free(verdict_t *v) {
    free(v->rec);
    free(v->cls);
}

/* --- text --- */

/* Ranks of class k (C_KINDS: every member) as "0-3, 5"; false when there are none. */
static bool ranks_of(const verdict_t *v, cls_t k, char *buf, size_t n) {
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < v->any->size; i++) {
        if (v->cls[i] != k && k != C_KINDS)
            continue;
        int j = i;
        while (j + 1 < v->any->size && (v->cls[j + 1] == k || k == C_KINDS) &&
               v->any->members[j + 1] == v->any->members[j] + 1)
            j++;
        int w = snprintf(buf + used, n - used, "%s%d", used ? ", " : "", v->any->members[i]);
        if (w > 0 && (size_t)w < n - used)
            used += (size_t)w;
        if (j > i + 1 && (w = snprintf(buf + used, n - used, "-%d", v->any->members[j])) > 0 &&
            (size_t)w < n - used)
            used += (size_t)w;
        i = j > i + 1 ? j : i;
    }
    return used > 0;
}

static void signature(const doc_call_t *c, char *buf, size_t n) {
    int w = snprintf(buf, n, "%s count=%llu dtype=%s", c->kind, c->count, c->dtype);
    if (c->op[0] && w > 0 && (size_t)w < n)
        w += snprintf(buf + w, n - (size_t)w, " op=%s", c->op);
    if (c->root >= 0 && w > 0 && (size_t)w < n)
        w += snprintf(buf + w, n - (size_t)w, " root=%d", c->root);
    if (w > 0 && (size_t)w < n)
        snprintf(buf + w, n - (size_t)w, " algo=%s", c->algo);
}

/* The first argument in which c differs from ref: its name, and both values into mine and
 * theirs. */
static const char *differ(const doc_call_t *c, const doc_call_t *ref, char *mine, char *theirs,
                          size_t n) {
    if (c->count != ref->count) {
        snprintf(mine, n, "%llu", c->count);
        snprintf(theirs, n, "%llu", ref->count);
        return "count";
    }
    bool dt = strcmp(c->dtype, ref->dtype) != 0, op = strcmp(c->op, ref->op) != 0;
    snprintf(mine, n, "%s", dt ? c->dtype : op ? c->op : "");
    snprintf(theirs, n, "%s", dt ? ref->dtype : op ? ref->op : "");
    if (dt || op)
        return dt ? "dtype" : "op";
    snprintf(mine, n, "%d", c->root);
    snprintf(theirs, n, "%d", ref->root);
    return "root";
}

/* "hcomm_all_reduce: count=1024 on rank 0 but count=512 on rank 1", lower rank first. */
static void mismatch_text(const verdict_t *v, int i, char *buf, size_t n) {
    char mine[64], theirs[64];
    int r = v->any->members[i];
    const char *f = differ(doc_call_at(v->rec[i], v->seq), v->ref, mine, theirs, sizeof mine);
    if (r < v->ref_rank)
        snprintf(buf, n, "%s: %s=%s on rank %d but %s=%s on rank %d", v->ref->fn, f, mine, r, f,
                 theirs, v->ref_rank);
    else
        snprintf(buf, n, "%s: %s=%s on rank %d but %s=%s on rank %d", v->ref->fn, f, theirs,
                 v->ref_rank, f, mine, r);
}

/* The peers the waiters' failed waits were waiting on, as world ranks (-1: none known). */
static int peers_of(const verdict_t *v, int *peers, int cap) {
    int n = 0;
    for (int i = 0; i < v->any->size; i++) {
        const doc_rec_t *r = v->rec[i];
        bool known = r && v->cls[i] == C_WAIT && r->failed_seq == v->seq && r->peer >= 0;
        for (int k = 0; known && k < n; k++)
            known = peers[k] != r->peer;
        if (known && n < cap)
            peers[n++] = r->peer;
    }
    return n;
}

static const doc_call_t *last_call(const doc_rec_t *r) {
    return r->ncalls ? &r->calls[r->ncalls - 1] : NULL;
}

/* At most this many lines per kind of finding, so that the verdict fits a screen. */
enum { SHOWN = 6 };

/* "; it failed in hcomm_pp_send (HCOMM_ERR_TIMEOUT) waiting on rank 1" where r failed in a call
 * that is not a collective of its record, else "". */
static const char *failed_elsewhere(const doc_rec_t *r, char *buf, size_t n) {
    buf[0] = '\0';
    if (r->failed_seq != 0 || !r->failed_fn[0])
        return buf;
    int w = snprintf(buf, n, "; it failed in %s (%s)", r->failed_fn, r->result);
    if (r->peer >= 0 && w > 0 && (size_t)w < n)
        snprintf(buf + w, n - (size_t)w, " waiting on rank %d", r->peer);
    return buf;
}

/* A member whose record ends before the verdict's call. */
static void text_behind(FILE *out, const verdict_t *v, int i) {
    const doc_call_t *l = last_call(v->rec[i]);
    char why[256];
    fprintf(out, "  behind:     rank %d has not reached seq %u: ", v->any->members[i], v->seq);
    if (l)
        fprintf(out, "its last call is seq %u %s (%s)", l->seq, l->fn, l->state);
    else
        fprintf(out, "no call on this communicator");
    fprintf(out, "%s\n", failed_elsewhere(v->rec[i], why, sizeof why));
}

/* The world rank of a member whose call on this communicator failed with PEER_LOST naming
 * world rank r as the peer it waited on, or -1. */
static int lost_by(const verdict_t *v, int r) {
    for (int i = 0; i < v->any->size; i++) {
        const doc_rec_t *x = v->rec[i];
        if (x && strcmp(x->result, "HCOMM_ERR_PEER_LOST") == 0 && x->peer >= 0 &&
            x->peer < x->size && x->members[x->peer] == r)
            return x->rank;
    }
    return -1;
}

/* A member without a record of this communicator: dead, or failed on another one. */
static void text_nodump(FILE *out, const verdict_t *v, int r) {
    const doc_rec_t *other = NULL;
    for (int i = 0; i < v->set->nrecs && !other; i++)
        other = v->set->recs[i].rank == r ? &v->set->recs[i] : NULL;
    const doc_call_t *l = other ? last_call(other) : NULL;
    int seen_lost = lost_by(v, r);
    if (!other && seen_lost >= 0)
        fprintf(out,
                "  behind:     rank %d wrote no dump and was lost: rank %d's call failed with "
                "HCOMM_ERR_PEER_LOST naming it (its process or thread stopped)\n",
                r, seen_lost);
    else if (!other)
        fprintf(out, "  behind:     rank %d wrote no dump: dead or stuck outside hcomm\n", r);
    else if (l)
        fprintf(out,
                "  behind:     rank %d dumped only other communicators: seq %u %s (%s) on %s\n", r,
                l->seq, l->fn, l->state, other->comm);
    else
        fprintf(out, "  behind:     rank %d dumped only other communicators (%s)\n", r,
                other->comm);
}

static void text_member(FILE *out, const verdict_t *v, int i) {
    int r = v->any->members[i];
    const doc_call_t *c = doc_call_at(v->rec[i], v->seq);
    char text[512];
    switch (v->cls[i]) {
    case C_NODUMP:
        text_nodump(out, v, r);
        break;
    case C_BEHIND:
        text_behind(out, v, i);
        break;
    case C_OTHER:
        fprintf(out, "  other call: rank %d called %s (%s) at seq %u where rank %d called %s\n", r,
                c->fn, c->state, v->seq, v->ref_rank, v->ref->fn);
        break;
    case C_DIFFER:
        mismatch_text(v, i, text, sizeof text);
        fprintf(out, "  mismatch:   %s\n", text);
        break;
    default:
        break;
    }
}

/* " (timed out: rank 2, 5)" for the waiters whose own wait timed out, else "". */
static const char *timed_out(const verdict_t *v, char *buf, size_t n) {
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < v->any->size && used + 16 < n; i++)
        if (v->cls[i] == C_WAIT && strstr(doc_call_at(v->rec[i], v->seq)->state, "TIMEOUT"))
            used += (size_t)snprintf(buf + used, n - used, "%s%d",
                                     used ? ", " : " (timed out: rank ", v->any->members[i]);
    if (used)
        snprintf(buf + used, n - used, ")");
    return buf;
}

static void text_waiting(FILE *out, const verdict_t *v) {
    char ranks[256], sig[256], timed[128];
    int peers[SHOWN], np = peers_of(v, peers, SHOWN);
    signature(v->ref, sig, sizeof sig);
    fprintf(out, "  seq %u:      %s (%s)\n", v->seq, v->ref->fn, sig);
    if (ranks_of(v, C_WAIT, ranks, sizeof ranks))
        fprintf(out, "  waiting:    ranks %s in %s seq %u%s\n", ranks, v->ref->fn, v->seq,
                timed_out(v, timed, sizeof timed));
    if (ranks_of(v, C_DONE, ranks, sizeof ranks))
        fprintf(out, "  finished:   ranks %s finished seq %u\n", ranks, v->seq);
    for (int k = 0; k < np; k++)
        fprintf(out, "%s%d", k ? ", " : "  waited on:  rank ", peers[k]);
    fprintf(out, "%s", np ? "\n" : "");
}

static void text_comm(FILE *out, const verdict_t *v) {
    char ranks[256];
    ranks_of(v, C_KINDS, ranks, sizeof ranks);
    fprintf(out, "communicator %s (%d ranks; world ranks in its order: %s)\n", v->any->comm,
            v->any->size, ranks);
    if (v->seq == 0) {
        fprintf(out, "  no call pending on the ranks that dumped it\n");
        return;
    }
    text_waiting(out, v);
    int shown[C_KINDS] = {0};
    for (int i = 0; i < v->any->size; i++)
        if (shown[v->cls[i]]++ < SHOWN)
            text_member(out, v, i);
    for (int k = C_BEHIND; k < C_KINDS; k++)
        if (shown[k] > SHOWN)
            fprintf(out, "  (%d more like the last line)\n", shown[k] - SHOWN);
}

/* --- JSON --- */

static void json_ranks(FILE *out, const char *key, const verdict_t *v, cls_t k) {
    fprintf(out, ", \"%s\": [", key);
    for (int i = 0, n = 0; i < v->any->size; i++)
        if (v->cls[i] == k || k == C_KINDS)
            fprintf(out, "%s%d", n++ ? ", " : "", v->any->members[i]);
    fprintf(out, "]");
}

static void json_member(FILE *out, const verdict_t *v, int i, int n) {
    const doc_call_t *c = doc_call_at(v->rec[i], v->seq), *l;
    int r = v->any->members[i];
    char text[512], mine[64], theirs[64];
    fprintf(out, "%s\n     {\"rank\": %d", n ? "," : "", r);
    if (v->cls[i] == C_BEHIND && (l = last_call(v->rec[i])) != NULL)
        fprintf(out, ", \"last_seq\": %u, \"last_call\": \"%s\", \"state\": \"%s\"", l->seq, l->fn,
                l->state);
    if (v->cls[i] == C_BEHIND && v->rec[i]->failed_seq == 0)
        fprintf(out, ", \"failed_call\": \"%s\", \"result\": \"%s\", \"waiting_on\": %d",
                v->rec[i]->failed_fn, v->rec[i]->result, v->rec[i]->peer);
    if (v->cls[i] == C_OTHER)
        fprintf(out, ", \"call\": \"%s\", \"state\": \"%s\"", c->fn, c->state);
    if (v->cls[i] == C_DIFFER) {
        const char *f = differ(c, v->ref, mine, theirs, sizeof mine);
        mismatch_text(v, i, text, sizeof text);
        fprintf(out,
                ", \"field\": \"%s\", \"value\": \"%s\", \"ref_rank\": %d, \"ref_value\": \"%s\", "
                "\"text\": \"%s\"",
                f, mine, v->ref_rank, theirs, text);
    }
    fprintf(out, "}");
}

static void json_members(FILE *out, const char *key, const verdict_t *v, cls_t k) {
    fprintf(out, ",\n    \"%s\": [", key);
    for (int i = 0, n = 0; i < v->any->size; i++)
        if (v->cls[i] == k)
            json_member(out, v, i, n++);
    fprintf(out, "]");
}

static void json_comm(FILE *out, const verdict_t *v, bool more) {
    char sig[256];
    int peers[64], np = v->seq ? peers_of(v, peers, 64) : 0;
    fprintf(out, "   {\"comm\": \"%s\", \"size\": %d", v->any->comm, v->any->size);
    json_ranks(out, "members", v, C_KINDS);
    fprintf(out, ", \"seq\": %u", v->seq);
    if (v->seq) {
        signature(v->ref, sig, sizeof sig);
        fprintf(out, ", \"call\": \"%s\", \"signature\": \"%s\", \"ref_rank\": %d", v->ref->fn, sig,
                v->ref_rank);
        json_ranks(out, "waiting", v, C_WAIT);
        json_ranks(out, "finished", v, C_DONE);
        json_ranks(out, "no_dump", v, C_NODUMP);
        fprintf(out, ", \"lost\": [");
        for (int i = 0, n = 0; i < v->any->size; i++)
            if (v->cls[i] == C_NODUMP && lost_by(v, v->any->members[i]) >= 0)
                fprintf(out, "%s%d", n++ ? ", " : "", v->any->members[i]);
        fprintf(out, "]");
        fprintf(out, ", \"waited_on\": [");
        for (int k = 0; k < np; k++)
            fprintf(out, "%s%d", k ? ", " : "", peers[k]);
        fprintf(out, "]");
        json_members(out, "behind", v, C_BEHIND);
        json_members(out, "other_call", v, C_OTHER);
        json_members(out, "mismatch", v, C_DIFFER);
    }
    fprintf(out, "}%s\n", more ? "," : "");
}

/* --- every communicator --- */

static bool first_of_comm(const doc_set_t *s, int i) {
    for (int j = 0; j < i; j++)
        if (strcmp(s->recs[j].comm, s->recs[i].comm) == 0)
            return false;
    return true;
}

void doc_verdict(FILE *out, const doc_set_t *s, bool json) {
    int last = -1;
    for (int i = 0; i < s->nrecs; i++)
        last = first_of_comm(s, i) ? i : last;
    if (json)
        fprintf(out, "{\"dumps\": %d, \"comms\": [\n", s->files);
    else
        fprintf(out, "hcomm-doctor: %d rank dumps\n", s->files);
    for (int i = 0; i < s->nrecs; i++) {
        verdict_t v;
        if (!first_of_comm(s, i) || !verdict_make(&v, s, &s->recs[i]))
            continue;
        if (json)
            json_comm(out, &v, i < last);
        else
            text_comm(out, &v);
        verdict_free(&v);
    }
    if (json)
        fprintf(out, "]}\n");
}
