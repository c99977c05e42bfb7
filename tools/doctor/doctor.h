/* hcomm-doctor: reads the flight recorders hcomm writes into HCOMM_DUMP_DIR (one JSON file per
 * rank, one call or communicator per line: src/algo/dump.c) and names the rank behind. */
#ifndef HCOMM_DOCTOR_H_
#define HCOMM_DOCTOR_H_

#include <stdbool.h>
#include <stdio.h>

enum { DOC_CALLS = 64, DOC_NAME = 48 };

/* One call as a rank recorded it. */
typedef struct doc_call {
    unsigned seq;
    unsigned long long count;
    int root;
    char fn[DOC_NAME], kind[DOC_NAME], dtype[16], op[16], algo[DOC_NAME], state[DOC_NAME];
} doc_call_t;

/* One communicator as one rank dumped it. */
typedef struct doc_rec {
    int rank, index, size, peer;
    long pid;
    unsigned failed_seq;
    char host[64], comm[24], result[DOC_NAME], failed_fn[DOC_NAME];
    int *members;
    int ncalls;
    doc_call_t calls[DOC_CALLS];
} doc_rec_t;

typedef struct doc_set {
    doc_rec_t *recs;
    int nrecs, cap;
    int files;
} doc_set_t;

/* Reads every hcomm-rank*.json in dir into s; false (with a message on stderr) when the
 * directory cannot be read or holds no dump. (read.c) */
bool doc_read_dir(const char *dir, doc_set_t *s);
void doc_free(doc_set_t *s);

/* The record of communicator comm by world rank, or NULL; the call at seq in r, or NULL. */
const doc_rec_t *doc_find(const doc_set_t *s, const char *comm, int rank);
const doc_call_t *doc_call_at(const doc_rec_t *r, unsigned seq);

/* Prints the verdict on every communicator of s, as text or as JSON. (verdict.c) */
void doc_verdict(FILE *out, const doc_set_t *s, bool json);

#endif /* HCOMM_DOCTOR_H_ */
