/* The fuzzer's driver (main.c, session.c): options, the watchdog and the corpus. */
#ifndef HCOMM_FUZZ_MAIN_H_
#define HCOMM_FUZZ_MAIN_H_

#include "fuzz.h"

typedef struct fz_opts {
    uint64_t seed;
    long calls;     /* stop after this many calls (0: no limit) */
    double seconds; /* stop after this long (0: no limit) */
    const char *backend;
    int ranks; /* local: threads; mpi: the job's size (0) */
    const char *corpus_dir;
    int verbose;
    /* Which kind tables draw: 1 those before all_gatherv, TP and MoE top-k joined, so corpus
     * files without a gen= line replay the sequence they were found with; FZ_GEN all. */
    int gen;
} fz_opts_t;

#define FZ_GEN 2

extern fz_opts_t fz_opt;
/* Set when any rank of this process found something (the exit code). */
extern atomic_int fz_failed;

/* The rank function hcomm_launch runs (session.c). */
hcomm_result_t fz_rank_main(hcomm_comm_t *world, void *arg);
/* Records that world rank wrank starts call idx of kind (for the watchdog and crash report). */
void fz_progress(int wrank, long idx, const char *kind);
/* Writes a corpus file for a failure at call idx and prints how to replay it. */
void fz_write_corpus(long idx, const char *found);

#endif /* HCOMM_FUZZ_MAIN_H_ */
