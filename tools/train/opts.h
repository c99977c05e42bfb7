/* Command-line options of hcomm-train: parsing, defaults, validation and --help. */
#ifndef HCOMM_TRAIN_OPTS_H_
#define HCOMM_TRAIN_OPTS_H_

#include <stdint.h>
#include <stdio.h>

/* Every flag of hcomm-train; the layout is tp x cp x pp x dp ranks, experts spread over
 * ep ranks, and sharded over the expert-TP group, which is the TP group (etp = tp). */
typedef struct train_opts {
    int tp, pp, dp, ep;     /* parallel sizes */
    int experts;            /* number of experts of the MoE layer */
    int topk;               /* experts per token */
    double capacity_factor; /* 0: dropless; else hcomm_moe_options_t.capacity_factor */
    int hidden;             /* model width C; the TP FFN is 4C wide, each expert's FFN 2C */
    int layers;             /* (TP block, MoE) pairs between the embedding and the head */
    int steps;              /* optimizer steps */
    int micro_batches;      /* micro-batches per step on each DP rank */
    int batch;              /* global batch, in sequences */
    int seq;                /* characters per sequence */
    int log_every;          /* steps between progress lines */
    int dp_overlap;         /* 1: DP gradient buckets reduced during backward (the reducer) */
    int deterministic;      /* 1: hcomm_comm_set_deterministic on the world (inherited by groups) */
    const char *schedule;   /* "gpipe", "1f1b" or "interleaved" */
    int virtual_stages;     /* model chunks per stage (interleaved) */
    const char *dtype;      /* "f64", "f32" or "bf16" (real/real.h) */
    uint64_t seed;          /* seeds the weights and the data sampler */
    double lr;              /* SGD learning rate */
    double momentum;        /* SGD momentum */
    const char *backend;    /* --backend, or NULL: see opts_backend() */
    const char *chosen;     /* without --backend: what hcomm_launch_backend() picks */
    const char *data;       /* training text */
    const char *metrics;    /* CSV output, or NULL */
    const char *val_data;   /* held-out text, or NULL: the last 10% of data */
    int eval_every;         /* steps between validation losses (and at the end) */
    int binary;             /* --binary: train on a file that is not text */
    int sample;             /* characters to generate at the end; 0: none */
    const char *prompt;     /* text the sample continues */
    double temperature;     /* 0: greedy; else sampling from softmax(logits / T) */
    const char *save;       /* checkpoint directory, or NULL */
    int save_every;         /* steps between checkpoints (and at the end); 0: only at the end */
    const char *resume;     /* checkpoint directory (or file) to continue from, or NULL */
    int help;               /* --help was given */
    int version;            /* --version was given */
    int zero;               /* ZeRO stage 0..3 (0: replicated DP) */
    int dp_shard;           /* ranks of DP sharing one copy of the state; 0: dp (with --zero) */
    int heads;              /* attention heads of each TP block (split over TP) */
    int attn_block;         /* keys per attention block; 0 until opts_validate_cp picks it */
    int cp;                 /* context-parallel size (world = tp * cp * pp * dp) */
    const char *cp_algo;    /* "ring", "allgather", "ulysses" or "a2a+p2p" */
    int cp_a2a;             /* a2a+p2p: the a2a size; 0: from the node layout */
    int sequence_parallel;  /* --sequence-parallel: activations split over TP along the sequence */
    int max_failures;       /* lost ranks the run survives in the job (fault_opts.c); 0: none */
    const char *inject_failure;   /* "RANK:STEP": that rank stops for good during that step */
    int inject_rank, inject_step; /* parsed from inject_failure; -1: none */
} train_opts_t;

/* Fills *o from argv. Returns 0, or -1 after writing one line saying what is wrong to err. */
int opts_parse(int argc, char **argv, train_opts_t *o, FILE *err);
/* Prints the usage text with every flag and its default. */
void opts_usage(FILE *out);
/* The backend to run on: --backend, else $HCOMM_BACKEND, else mpi under mpirun/srun, else
 * local (as hcomm_launch picks it from NULL). */
const char *opts_backend(const train_opts_t *o);
/* Checks and completes the attention and context-parallel flags (cp_opts.c). Returns 0, or -1
 * after writing one line saying what is wrong to err. */
int opts_validate_cp(train_opts_t *o, FILE *err);
/* Checks --max-failures and --inject-failure (fault_opts.c); fills inject_rank/step. Returns 0,
 * or -1 after writing one line saying what is wrong to err. */
int opts_validate_fault(train_opts_t *o, FILE *err);
/* Number of ranks the layout needs: tp * cp * pp * dp. */
int opts_world_size(const train_opts_t *o);

#endif /* HCOMM_TRAIN_OPTS_H_ */
