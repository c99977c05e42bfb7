/* The reader of hcomm's dumps: the format dump.c writes, a header, communicator or call per
 * line, each field as "key": value. */
#include "doctor.h"

#include <dirent.h>
#include <stdlib.h>
#include <string.h>

/* The text after "key": on line, or NULL. */
static const char *after(const char *line, const char *key) {
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\": ", key);
    const char *p = strstr(line, pat);
    return p ? p + strlen(pat) : NULL;
}

static long long num(const char *line, const char *key, long long dflt) {
    const char *p = after(line, key);
    return p ? strtoll(p, NULL, 10) : dflt;
}

static void str(const char *line, const char *key, char *buf, size_t n) {
    const char *p = after(line, key);
    buf[0] = '\0';
    if (!p || *p != '"')
        return;
    size_t len = strcspn(p + 1, "\"");
    len = len < n - 1 ? len : n - 1;
    memcpy(buf, p + 1, len);
    buf[len] = '\0';
}

static bool members(const char *line, doc_rec_t *r) {
    const char *p = after(line, "members");
    r->members = calloc((size_t)(r->size > 0 ? r->size : 1), sizeof(int));
    if (!p || !r->members)
        return false;
    p++; /* '[' */
    for (int i = 0; i < r->size; i++) {
        char *end;
        r->members[i] = (int)strtol(p, &end, 10);
        p = end + (*end == ',' ? 1 : 0);
    }
    return true;
}

static doc_rec_t *new_rec(doc_set_t *s, const doc_rec_t *head, const char *line) {
    if (s->nrecs == s->cap) {
        int cap = s->cap ? 2 * s->cap : 16;
        doc_rec_t *n = realloc(s->recs, sizeof *n * (size_t)cap);
        if (!n)
            return NULL;
        s->recs = n;
        s->cap = cap;
    }
    doc_rec_t *r = &s->recs[s->nrecs++];
    *r = *head;
    str(line, "comm", r->comm, sizeof r->comm);
    str(line, "result", r->result, sizeof r->result);
    str(line, "failed_call", r->failed_fn, sizeof r->failed_fn);
    r->size = (int)num(line, "size", 0);
    r->index = (int)num(line, "index", -1);
    r->failed_seq = (unsigned)num(line, "failed_seq", 0);
    r->peer = (int)num(line, "peer", -1);
    return members(line, r) ? r : NULL;
}

static void add_call(doc_rec_t *r, const char *line) {
    if (r->ncalls == DOC_CALLS)
        return;
    doc_call_t *c = &r->calls[r->ncalls++];
    c->seq = (unsigned)num(line, "seq", 0);
    c->count = (unsigned long long)num(line, "count", 0);
    c->root = (int)num(line, "root", -1);
    str(line, "call", c->fn, sizeof c->fn);
    str(line, "kind", c->kind, sizeof c->kind);
    str(line, "dtype", c->dtype, sizeof c->dtype);
    str(line, "op", c->op, sizeof c->op);
    str(line, "algo", c->algo, sizeof c->algo);
    str(line, "state", c->state, sizeof c->state);
}

static bool read_file(const char *path, doc_set_t *s) {
    FILE *f = fopen(path, "r");
    char line[4096];
    doc_rec_t head = {.rank = -1}, *cur = NULL;
    if (!f)
        return false;
    while (fgets(line, sizeof line, f)) {
        if (after(line, "hcomm_dump")) {
            head.rank = (int)num(line, "rank", -1);
            head.pid = (long)num(line, "pid", 0);
            str(line, "host", head.host, sizeof head.host);
        } else if (after(line, "comm") && (cur = new_rec(s, &head, line)) == NULL) {
            break;
        } else if (cur && after(line, "seq")) {
            add_call(cur, line);
        }
    }
    fclose(f);
    return head.rank >= 0;
}

static bool is_dump(const char *name) {
    size_t n = strlen(name);
    return strncmp(name, "hcomm-rank", 10) == 0 && n > 15 && strcmp(name + n - 5, ".json") == 0;
}

bool doc_read_dir(const char *dir, doc_set_t *s) {
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, "hcomm-doctor: cannot read directory %s\n", dir);
        return false;
    }
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (is_dump(e->d_name) && read_file(path, s))
            s->files++;
        else if (is_dump(e->d_name))
            fprintf(stderr, "hcomm-doctor: %s is not an hcomm dump\n", path);
    }
    closedir(d);
    if (s->files == 0)
        fprintf(stderr, "hcomm-doctor: no hcomm-rank*.json in %s (set HCOMM_DUMP_DIR)\n", dir);
    return s->files > 0;
}

void doc_free(doc_set_t *s) {
    for (int i = 0; i < s->nrecs; i++)
        free(s->recs[i].members);
    free(s->recs);
}

const doc_rec_t *doc_find(const doc_set_t *s, const char *comm, int rank) {
    for (int i = 0; i < s->nrecs; i++)
        if (s->recs[i].rank == rank && strcmp(s->recs[i].comm, comm) == 0)
            return &s->recs[i];
    return NULL;
}

const doc_call_t *doc_call_at(const doc_rec_t *r, unsigned seq) {
    for (int i = 0; r && i < r->ncalls; i++)
        if (r->calls[i].seq == seq)
            return &r->calls[i];
    return NULL;
}
