/* Meetings on the transport's board (p2p.h): each rank posts in its own region of shared
 * memory and loads its peers' regions, so a meeting of p ranks costs p stores and p loads of
 * a cache line, where a signature agreement over messages takes log2 p round trips through
 * the backend (docs/tuning.md: p2p.board-meeting). The same scheme as the local transport's
 * posted slots and Open MPI's coll/sm: flags with release/acquire ordering, the owner the only
 * writer of its region. */

#include "p2p/p2p.h"

#include "core/env.h"
#include "core/internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define INLINE_BYTES 8u

/* A member's post of one meeting: one cache line, so that a meeting of payloads up to
 * INLINE_BYTES (a loss, a norm, a count) loads one line of each peer's, not two. */
typedef struct post {
    _Alignas(64) _Atomic uint64_t id; /* the meeting it belongs to */
    uint64_t words[5];                /* the caller's signature */
    int32_t failed;                   /* HCOMM_OK, or why the poster's own checks failed */
    uint32_t small;                   /* the payload is `inl`, not the half's room */
    _Alignas(8) unsigned char inl[INLINE_BYTES];
} post_t;

/* The head of a member's region; the two halves of payload follow at HDR_BYTES. */
typedef struct region {
    _Alignas(64) _Atomic uint64_t arrive; /* the meeting this member posted last */
    _Alignas(64) _Atomic uint64_t leave;  /* the meeting whose reading it finished last */
    post_t post[2];
    char text[2][512]; /* a failed post's message */
} region_t;

#define HDR_BYTES 4096u
_Static_assert(sizeof(post_t) == 64, "a post is one cache line");
_Static_assert(sizeof(region_t) <= HCOMM__BOARD_FT_AT, "the head leaves the slot of ft.c alone");
_Static_assert(HDR_BYTES + 2 * HCOMM__BOARD_ROOM <= HCOMM__BOARD_BYTES, "the region holds both");

/* Meeting ids: (wraps of the call's 32-bit sequence number, the number, step), increasing. */
#define STEP_BITS 24

typedef struct board {
    uint64_t last[2]; /* the meeting each half of this rank's region held last */
    uint64_t *seen;   /* [size] the latest meeting each member was seen to have posted */
    uint64_t id;      /* the current meeting */
    uint32_t seq, wraps;
    unsigned half;     /* the half the next (or current) post takes */
    bool reserved;     /* hcomm__board_space made that half writable already */
    bool small;        /* and put the payload in that half's post */
    unsigned char *at; /* [size] the half holding each member's post of id */
} board_t;

static region_t *region(hcomm_comm_t *c, int r) {
    return c->tr->board(c, r);
}

static void board_free(void *p) {
    board_t *b = p;
    free(b->at);
    free(b->seen);
    free(b);
}

static board_t *board_of(hcomm_comm_t *c) {
    if (!c->layer[HCOMM__LAYER_BOARD]) {
        board_t *b = calloc(1, sizeof *b);
        if (b && (!(b->at = calloc((size_t)c->size, 1)) ||
                  !(b->seen = calloc((size_t)c->size, sizeof *b->seen)))) {
            board_free(b);
            b = NULL;
        }
        c->layer[HCOMM__LAYER_BOARD] = b;
        c->layer_free[HCOMM__LAYER_BOARD] = board_free;
    }
    return c->layer[HCOMM__LAYER_BOARD];
}

bool hcomm__board_on(hcomm_comm_t *c) {
    return c->tr->board && c->tr->board(c, c->rank) != NULL;
}

static uint64_t meeting_id(board_t *b, uint32_t seq, uint32_t step) {
    if (seq < b->seq)
        b->wraps++;
    b->seq = seq;
    return ((uint64_t)b->wraps << 32 | seq) << STEP_BITS | (step & ((1u << STEP_BITS) - 1));
}

/* Rank r has arrived at id (arrive) or finished reading `id` (leave: it left it, or went on
 * past it without reading). */
static bool reached(const region_t *g, uint64_t id, bool arrive) {
    if (arrive)
        return atomic_load_explicit(&g->arrive, memory_order_acquire) >= id;
    return atomic_load_explicit(&g->leave, memory_order_acquire) >= id ||
           atomic_load_explicit(&g->arrive, memory_order_acquire) > id;
}

/* One round of a wait for rank r (hcomm__backoff: spin, yield the core to peers, nap), checking
 * the verdict every 256 rounds: a meeting's waits are short, and the check polls the backend. */
static hcomm_result_t pause_for(hcomm_comm_t *c, uint32_t seq, int r, hcomm__backoff_t *k) {
    double waited = hcomm__backoff(k);
    if ((k->iter & 255) != 0)
        return HCOMM_OK;
    char what[64];
    snprintf(what, sizeof what, "rank %d in shared memory", r);
    c->wait_peer = r; /* for the flight recorder's dump */
    return hcomm__coll_wait_verdict(c, seq, what, waited);
}

static hcomm_result_t await(hcomm_comm_t *c, uint32_t seq, int r, uint64_t id, bool arrive) {
    const region_t *g = region(c, r);
    hcomm__backoff_t k;
    hcomm__backoff_init(&k);
    while (!reached(g, id, arrive))
        HCOMM__TRY(pause_for(c, seq, r, &k));
    return HCOMM_OK;
}

/* Makes this rank's next half writable: no peer still reads what it held. A comm the backend
 * gave up on stays unusable here too (core.h), though a meeting would not touch the backend.
 * A peer seen to have posted a later meeting has left that one (reached): its line is not
 * loaded again, which took one cross-core load off every meeting of a loop of calls. */
static hcomm_result_t reserve(hcomm_comm_t *c, board_t *b, uint32_t seq) {
    if (b->reserved)
        return HCOMM_OK;
    if (c->tr->usable)
        HCOMM__TRY(c->tr->usable(c));
    for (int r = 0; r < c->size; r++)
        if (r != c->rank && b->seen[r] <= b->last[b->half])
            HCOMM__TRY(await(c, seq, r, b->last[b->half], false));
    b->reserved = true;
    return HCOMM_OK;
}

hcomm_result_t hcomm__board_space(hcomm_comm_t *c, uint32_t seq, size_t bytes, void **data) {
    board_t *b = board_of(c);
    if (!b)
        return hcomm__err(HCOMM_ERR_NOMEM, c->call_fn, "out of memory for the board");
    HCOMM__TRY(reserve(c, b, seq));
    region_t *g = region(c, c->rank);
    b->small = bytes <= INLINE_BYTES;
    *data = b->small ? (void *)g->post[b->half].inl
                     : (char *)g + HDR_BYTES + b->half * HCOMM__BOARD_ROOM;
    return HCOMM_OK;
}

/* Finds where rank r posted meeting id; false when it went past it without a post. Ranks
 * that make the same calls post each meeting in the same half, so this rank's is looked at
 * first: one load of a peer's line fewer on every other meeting. */
static bool find_post(hcomm_comm_t *c, board_t *b, int r, uint64_t id) {
    const region_t *g = region(c, r);
    for (unsigned char i = 0; i < 2; i++) {
        unsigned char h = b->at[c->rank] ^ i;
        if (atomic_load_explicit(&g->post[h].id, memory_order_relaxed) == id) {
            b->at[r] = h;
            return true;
        }
    }
    return false;
}

/* The post's id is stored last, with release: a peer that loads it (acquire) sees the post
 * and the payload written before it, without waiting for arrive's line too. */
static void post(region_t *g, unsigned half, uint64_t id, const hcomm__posted_sig_t *sig,
                 bool small) {
    post_t *p = &g->post[half];
    memcpy(p->words, sig->words, sizeof p->words);
    p->failed = sig->failed;
    p->small = small;
    g->text[half][0] = '\0';
    if (sig->failed != HCOMM_OK && sig->failed_text)
        snprintf(g->text[half], sizeof g->text[half], "%s", sig->failed_text);
    atomic_store_explicit(&p->id, id, memory_order_release);
    atomic_store_explicit(&g->arrive, id, memory_order_release);
}

/* Waits for rank r's post of meeting id. Ranks that make the same calls post each meeting in
 * the same half, so that post's line is watched first: it holds the id and the signature, one
 * cross-core load where arrive's line and then the post's took two in turn. Only where r went
 * on in the other half (or past id) does it fall back to arrive and both halves. */
static hcomm_result_t await_post(hcomm_comm_t *c, board_t *b, uint32_t seq, int r, uint64_t id,
                                 bool *found) {
    const region_t *g = region(c, r);
    unsigned char h = b->at[c->rank];
    hcomm__backoff_t k;
    hcomm__backoff_init(&k);
    for (;;) {
        if (atomic_load_explicit(&g->post[h].id, memory_order_acquire) == id) {
            b->at[r] = h;
            *found = true;
            return HCOMM_OK;
        }
        if (reached(g, id, true))
            break;
        HCOMM__TRY(pause_for(c, seq, r, &k));
    }
    *found = find_post(c, b, r, id);
    return HCOMM_OK;
}

hcomm_result_t hcomm__board_meet(hcomm_comm_t *c, uint32_t seq, uint32_t step,
                                 const hcomm__posted_sig_t *sig, int wait_for) {
    board_t *b = board_of(c);
    if (!b)
        return hcomm__err(HCOMM_ERR_NOMEM, c->call_fn, "out of memory for the board");
    HCOMM__TRY(reserve(c, b, seq));
    region_t *mine = region(c, c->rank);
    b->id = meeting_id(b, seq, step);
    post(mine, b->half, b->id, sig, b->small);
    b->at[c->rank] = (unsigned char)b->half;
    b->last[b->half] = b->id;
    b->half ^= 1;
    b->reserved = b->small = false;
    hcomm_result_t res = HCOMM_OK;
    bool wait = wait_for != HCOMM__MEET_NONE && wait_for != c->rank;
    for (int r = 0; wait && res == HCOMM_OK && r < c->size; r++) {
        if (r == c->rank || (wait_for >= 0 && r != wait_for))
            continue;
        bool found = false;
        res = await_post(c, b, seq, r, b->id, &found);
        if (res == HCOMM_OK && found) /* meeting ids only grow */
            b->seen[r] = b->id;
        if (res == HCOMM_OK && !found)
            res = hcomm__err(HCOMM_ERR_MISMATCH, c->call_fn,
                             "rank %d went past this call (seq %u) without joining it: the ranks' "
                             "calls differ%s",
                             r, (unsigned)seq, hcomm__check_hint(false));
    }
    if (!wait || res != HCOMM_OK)
        hcomm__board_leave(c);
    return res;
}

void hcomm__board_peer(hcomm_comm_t *c, int r, hcomm__posted_sig_t *sig, const void **data) {
    board_t *b = c->layer[HCOMM__LAYER_BOARD];
    const region_t *g = region(c, r);
    const post_t *p = &g->post[b->at[r]];
    if (sig) {
        memcpy(sig->words, p->words, sizeof sig->words);
        sig->failed = (hcomm_result_t)p->failed;
        sig->failed_text = g->text[b->at[r]];
    }
    if (data)
        *data = p->small ? (const void *)p->inl
                         : (const char *)g + HDR_BYTES + b->at[r] * HCOMM__BOARD_ROOM;
}

void hcomm__board_leave(hcomm_comm_t *c) {
    board_t *b = c->layer[HCOMM__LAYER_BOARD];
    atomic_store_explicit(&region(c, c->rank)->leave, b->id, memory_order_release);
}
