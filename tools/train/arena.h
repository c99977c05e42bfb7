/* A per-rank bump allocator for the buffers of one step: one block reused every step, so the
 * step loop neither calls malloc nor faults in fresh pages (8 rank threads on 2 cores felt
 * both). */
#ifndef HCOMM_TRAIN_ARENA_H_
#define HCOMM_TRAIN_ARENA_H_

#include <stddef.h>
#include <stdint.h>

typedef struct arena {
    char *base;   /* the reused block */
    size_t cap;   /* its size in bytes */
    size_t used;  /* bytes handed out from it this step */
    size_t want;  /* bytes asked for this step, in all */
    void **extra; /* blocks malloc'ed when base was full; freed at the next reset */
    int nextra, cap_extra;
} arena_t;

/* @p bytes of uninitialized memory, 64-byte granular, valid until arena_reset(). */
void *arena_alloc(arena_t *a, size_t bytes);
/* Takes back everything; grows the block to what the step needed, so the next one fits. */
void arena_reset(arena_t *a);
void arena_free(arena_t *a);

/* malloc that ends the program with a message when memory runs out. */
void *train_alloc(size_t bytes);

#endif /* HCOMM_TRAIN_ARENA_H_ */
