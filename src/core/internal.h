/* Internal helpers shared by every layer: error recording and argument checks, dtype and tensor
 * checks, reduction and conversion kernels, streaming copies, scratch buffers, waits and time. */
#ifndef HCOMM_C_INTERNAL_H_
#define HCOMM_C_INTERNAL_H_

#include "hcomm/core.h"

#include <stdbool.h>

#if defined(__GNUC__)
#define HCOMM__PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define HCOMM__PRINTF(a, b)
#endif

/* Records "fn: message" as this thread's last error and returns r. */
hcomm_result_t hcomm__err(hcomm_result_t r, const char *fn, const char *fmt, ...)
    HCOMM__PRINTF(3, 4);

/* Records text as it is (already "fn: message") as this thread's last error; returns r. */
hcomm_result_t hcomm__err_text(hcomm_result_t r, const char *text);

/* This thread's last error without its leading "fn: " (the whole message when it lacks one):
 * what is kept to be re-reported for another call, or told to a peer, under another name. */
const char *hcomm__err_detail(const char *fn);

/* Argument checks for public functions: fail with a message naming the argument. */
#define HCOMM__CHECK_NULL(p)                                                                       \
    do {                                                                                           \
        if ((p) == NULL)                                                                           \
            return hcomm__err(HCOMM_ERR_NULL, __func__, "argument '%s' is NULL", #p);              \
    } while (0)

/* Propagates a failure; the callee already recorded the message. */
#define HCOMM__TRY(call)                                                                           \
    do {                                                                                           \
        hcomm_result_t hcomm__r_ = (call);                                                         \
        if (hcomm__r_ != HCOMM_OK)                                                                 \
            return hcomm__r_;                                                                      \
    } while (0)

/* On failure stores the result in res and jumps to the function's single cleanup label. */
#define HCOMM__TRY_GOTO(call, res, label)                                                          \
    do {                                                                                           \
        (res) = (call);                                                                            \
        if ((res) != HCOMM_OK)                                                                     \
            goto label;                                                                            \
    } while (0)

/* Element size in bytes, 0 for an invalid dtype. */
size_t hcomm__dtype_size(hcomm_dtype_t dt);
bool hcomm__dtype_valid(hcomm_dtype_t dt);
/* "f32", "bf16", ... for messages; "?" for an invalid dtype. */
const char *hcomm__dtype_str(hcomm_dtype_t dt);
/* f16, bf16, f32 or f64. */
bool hcomm__dtype_is_float(hcomm_dtype_t dt);
bool hcomm__op_valid(hcomm_op_t op);

/* Tensor checks for public functions; fn and arg name the caller and argument in messages. */
hcomm_result_t hcomm__tensor_check(const char *fn, const char *arg, const hcomm_tensor_t *t,
                                   size_t *numel);
/* Normalizes dim (negative counts from the end) against t->ndim into *out. */
hcomm_result_t hcomm__tensor_dim(const char *fn, const char *arg, const hcomm_tensor_t *t, int dim,
                                 int *out);
/* Bytes of a checked tensor. */
size_t hcomm__tensor_bytes(const hcomm_tensor_t *t);
/* Fails with HCOMM_ERR_SHAPE unless a and b have identical ndim and shape. */
hcomm_result_t hcomm__tensor_same_shape(const char *fn, const char *an, const hcomm_tensor_t *a,
                                        const char *bn, const hcomm_tensor_t *b);
/* Writes "[2, 3, 4]" into buf (for messages). */
const char *hcomm__shape_str(const hcomm_tensor_t *t, char *buf, size_t cap);

/* dst[i] = dst[i] op src[i] for i < count (op != AVG; AVG reduces as SUM). MAX/MIN of
 * floats are NaN where either operand is NaN, whichever it is. */
void hcomm__reduce(void *dst, const void *src, size_t count, hcomm_dtype_t dt, hcomm_op_t op);
/* dst[i] = a[i] op b[i] for i < count, rounded as hcomm__reduce rounds; dst may be a or b but
 * must not overlap either otherwise. One pass where a copy and a reduce would make two. */
void hcomm__reduce_to(void *dst, const void *a, const void *b, size_t count, hcomm_dtype_t dt,
                      hcomm_op_t op);
/* dst[i] = srcs[0][off+i] op srcs[1][off+i] op ... op srcs[n-1][off+i], in input order, for
 * i < count (off and count in elements). f16/bf16 accumulate in f32 and round once; AVG sums,
 * then divides by n (f16/bf16 before rounding, so a representable mean never overflows).
 * MAX/MIN of floats are NaN where any input is NaN. dst may be one of the sources at element off
 * (reduced in place); it must not overlap them otherwise. */
void hcomm__reduce_many(void *dst, const void *const *srcs, int n, size_t off, size_t count,
                        hcomm_dtype_t dt, hcomm_op_t op);
/* buf[i] /= divisor for i < count (the AVG step; integer division truncates). */
void hcomm__scale_div(void *buf, size_t count, hcomm_dtype_t dt, int divisor);
/* Block r of count elements split over p ranks: the first count % p ranks get ceil(count / p)
 * elements, the rest floor(count / p), back to back in rank order; *off and *len in elements
 * (block.c). */
void hcomm__block(size_t count, int p, int r, size_t *off, size_t *len);
/* Where block r starts (r >= p: count, the end). */
size_t hcomm__block_start(size_t count, int p, int r);

/* IEEE binary16 / bfloat16 conversions, round to nearest even. */
float hcomm__f16_to_f32(uint16_t h);
uint16_t hcomm__f32_to_f16(float f);
float hcomm__bf16_to_f32(uint16_t h);
uint16_t hcomm__f32_to_bf16(float f);
/* n elements of f16 or bf16 (dt) to f32, and back (round to nearest even): the conversions
 * above, bit for bit, as whole-block loops (F16C / AVX2 vector code on x86-64 where the CPU has
 * it); the 16-bit side need not be 2-byte aligned. */
void hcomm__widen(float *dst, const void *src, size_t n, hcomm_dtype_t dt);
void hcomm__narrow(void *dst, const float *src, size_t n, hcomm_dtype_t dt);
/* out[i] = w[0] * rows[0][i] + w[1] * rows[1][i] + ... (nrows >= 1 rows of n elements of f16,
 * bf16 or f32, dt; out the same), in f32, each product then its sum in row order, rounded
 * once: bit for bit what a loop of acc += w[j] * widen(row j) over whole rows gives, with the
 * terms in registers (AVX-512 or AVX2 for bf16) instead of an accumulator in memory. */
void hcomm__weighted_sum(void *out, const void *const *rows, const float *w, int nrows, size_t n,
                         hcomm_dtype_t dt);

/* True where f16/bf16 values are reduced in f32 and rounded once (SUM, PROD, AVG; MAX and MIN
 * are exact in any width). */
bool hcomm__sums_in_f32(hcomm_dtype_t dt, hcomm_op_t op);
/* acc[i] = acc[i] op widen(src[i]) for i < n: one more input of an f32 accumulation of f16/bf16
 * (dt) values, as hcomm__reduce_many accumulates (AVG sums; MAX and MIN as hcomm__reduce). */
void hcomm__accumulate_half(float *acc, const void *src, size_t n, hcomm_dtype_t dt, hcomm_op_t op);
/* Ends that accumulation: AVG divides acc by inputs in f32, then dst[0..n) = acc rounded once
 * to dt. acc is overwritten. */
void hcomm__round_half(void *dst, float *acc, size_t n, hcomm_dtype_t dt, hcomm_op_t op,
                       int inputs);

/* memcpy with non-temporal stores (SSE2; plain memcpy elsewhere): for copies far larger than
 * the cache, whose destination is not read again soon, it saves the read of every destination
 * line before its write, as glibc's memcpy does from about 3/4 of the last-level cache. src and
 * dst must not overlap. The stores become visible to other cores and processes only after
 * hcomm__stream_fence(), which must come before anything that tells them the data is there. */
void hcomm__copy_stream(void *dst, const void *src, size_t bytes);
/* From this many bytes a copy or result whose destination is not read again soon is written
 * with non-temporal stores (hcomm__copy_stream, hcomm__reduce_stream), as glibc's memcpy streams
 * a copy of that size: no line of the output is read from memory before it is written
 * (docs/tuning.md: stream-min). */
#define HCOMM__STREAM_MIN_BYTES ((size_t)64 << 20)
/* memcpy a piece at a time, in pieces of a few hundred KiB, cut where glibc's memcpy would
 * change method: one core copies a large buffer faster so (stream.c). src and dst must not
 * overlap. */
void hcomm__copy_pieces(void *dst, const void *src, size_t bytes);
/* hcomm__reduce_to whose results reach dst with non-temporal stores (through a scratch block
 * that stays in the first-level cache); the same aliasing rules. Fence as above. */
void hcomm__reduce_stream(void *dst, const void *a, const void *b, size_t count, hcomm_dtype_t dt,
                          hcomm_op_t op);
void hcomm__stream_fence(void);
/* True when [a, a+an) and [b, b+bn) share a byte. */
bool hcomm__overlaps(const void *a, size_t an, const void *b, size_t bn);

/* The most bytes one buffer can span (core.h, "Buffers"): 2^47 on 64-bit machines, the user
 * address space of x86-64 and of AArch64 Linux (which map nothing above it unless a program
 * asks with an mmap hint), half the address space elsewhere. Checked before any pointer
 * arithmetic on user sizes, so none can wrap. */
#define HCOMM__MAX_BUFFER_BYTES (SIZE_MAX > 0xffffffffu ? (SIZE_MAX >> 17) + 1 : SIZE_MAX >> 1)
/* times blocks of count elements of es bytes as *bytes, or HCOMM_ERR_INVALID_ARG naming
 * `name=count` (and the ranks where times > 1) when no buffer can span that. */
hcomm_result_t hcomm__span(const char *fn, const char *name, size_t count, size_t es, size_t times,
                           size_t *bytes);
/* HCOMM_ERR_INVALID_ARG naming `name` unless buf is aligned to dt's element size (core.h). */
hcomm_result_t hcomm__check_aligned(const char *fn, const char *name, const void *buf,
                                    hcomm_dtype_t dt);

/* Zeroed memory for n objects of `size` bytes that starts on a cache line and fills whole
 * lines (free() releases it), or NULL: what one rank writes on every call (its communicator,
 * its transport state, the posts peers poll) must not share a line with another rank's, and
 * calloc's 16-byte alignment let the local backend's per-rank structures, allocated one after
 * another by the launching thread, do so. */
void *hcomm__calloc_lines(size_t n, size_t size);

/* A layer's state on one communicator, created on first use: *slot, or, while it is NULL, a new
 * object of size zeroed bytes from alloc (calloc or hcomm__calloc_lines), with *slot_free set to
 * free_fn, which frees it with the communicator. NULL when out of memory (the next call tries
 * again). slot and slot_free are the layer's entries of the communicator's layer tables. */
static inline void *hcomm__layer_state(void **slot, void (**slot_free)(void *), size_t size,
                                       void *(*alloc)(size_t, size_t), void (*free_fn)(void *)) {
    if (!*slot) {
        *slot = alloc(1, size);
        *slot_free = free_fn;
    }
    return *slot;
}

/* Monotonic clock in seconds. */
double hcomm__now(void);

/* A buffer kept between calls and grown on demand: a malloc per call pays its page faults every
 * time once glibc maps it afresh (from 32 MiB). Zero-initialise; free with free(s->p). */
typedef struct hcomm__scratch {
    void *p;
    size_t cap;
} hcomm__scratch_t;
/* At least bytes of s (the previous content is not kept); NULL: out of memory. */
void *hcomm__scratch(hcomm__scratch_t *s, size_t bytes);
/* Tests: the calling thread's next hcomm__scratch fails as out of memory would, on that rank
 * alone (a process limit would hit ranks at random, and ASan reserves far more than it). */
extern _Thread_local bool hcomm__scratch_fails_next;
/* Two buffers of first and second bytes in s, the second on a cache line of its own: returns
 * the first and sets *at_second (both NULL: out of memory). */
void *hcomm__scratch_two(hcomm__scratch_t *s, size_t first, size_t second, void **at_second);
/* Frees s's buffer when it holds more than keep bytes (s stays usable). */
void hcomm__scratch_trim(hcomm__scratch_t *s, size_t keep);

/* How a waiter spends a wait: it spins first (longer where every rank of this node has a
 * core), then yields its core to peers (ranks may outnumber cores), then naps;
 * hcomm__backoff() does the step for the current iteration. */
typedef struct hcomm__backoff {
    double start;
    unsigned long iter;
    double waited; /* seconds, refreshed every 64 iterations */
    bool spinning, napping;
} hcomm__backoff_t;
/* A transport adds the ranks a world puts in this process and on this node when it starts it,
 * and takes them away when it ends (the nonblocking executor counts its worker while it runs):
 * a waiter spins only while some are counted and they do not outnumber the cores. */
void hcomm__ranks_here(int in_process, int on_node);
void hcomm__backoff_init(hcomm__backoff_t *b);
/* Seconds since the wait began (refreshed every 64 iterations). Call once per polling round;
 * check the verdict (timeout, abort) whenever (b->iter & 63) == 0. */
double hcomm__backoff(hcomm__backoff_t *b);

#endif /* HCOMM_C_INTERNAL_H_ */
