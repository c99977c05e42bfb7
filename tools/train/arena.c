/* A per-rank bump allocator for the buffers of one step. */
#include "arena.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void *train_alloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (p == NULL) {
        fprintf(stderr, "hcomm-train: out of memory (%zu bytes)\n", bytes);
        exit(1);
    }
    return p;
}

void *arena_alloc(arena_t *a, size_t bytes) {
    bytes = (bytes + 63) & ~(size_t)63;
    if (bytes == 0)
        bytes = 64;
    a->want += bytes;
    if (a->used + bytes <= a->cap) {
        void *p = a->base + a->used;
        a->used += bytes;
        return p;
    }
    if (a->nextra == a->cap_extra) {
        a->cap_extra = a->cap_extra ? 2 * a->cap_extra : 16;
        void **bigger = realloc(a->extra, (size_t)a->cap_extra * sizeof *bigger);
        if (bigger == NULL) {
            fprintf(stderr, "hcomm-train: out of memory\n");
            exit(1);
        }
        a->extra = bigger;
    }
    return a->extra[a->nextra++] = train_alloc(bytes);
}

void arena_reset(arena_t *a) {
    for (int i = 0; i < a->nextra; i++)
        free(a->extra[i]);
    a->nextra = 0;
    if (a->want > a->cap) {
        /* A quarter more than this step needed: the MoE rows vary from step to step. */
        free(a->base);
        a->cap = a->want + a->want / 4;
        a->base = train_alloc(a->cap);
    }
    a->used = 0;
    a->want = 0;
}

void arena_free(arena_t *a) {
    arena_reset(a);
    free(a->base);
    free(a->extra);
    memset(a, 0, sizeof *a);
}
