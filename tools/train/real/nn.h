/* Dense kernels of the model, forward and backward side by side. Row-major real_t arrays
 * (real.h); n rows (tokens), in/out features. Plain loops with the innermost index contiguous,
 * sums accumulated in real_t. */
#ifndef HCOMM_TRAIN_NN_H_
#define HCOMM_TRAIN_NN_H_

#include "real.h"

#include <stdint.h>

/* y[n, out] = x[n, in] w[in, out] (+ b[out] when b is not NULL). */
static void nn_linear_fwd(const real_t *x, const real_t *w, const real_t *b, real_t *y, int64_t n,
                          int64_t in, int64_t out);
/* dx[n, in] = dy[n, out] w[in, out]^T (overwrites dx); wt [out, in] is scratch for w^T. */
static void nn_linear_bwd_input(const real_t *dy, const real_t *w, real_t *dx, real_t *wt,
                                int64_t n, int64_t in, int64_t out);
/* dw[in, out] += x^T dy; db[out] += sum over rows of dy (db may be NULL). */
static void nn_linear_bwd_params(const real_t *x, const real_t *dy, real_t *dw, real_t *db,
                                 int64_t n, int64_t in, int64_t out);

/* g = gelu(z), tanh form (Hendrycks & Gimpel 2016), count elements. */
static void nn_gelu_fwd(const real_t *z, real_t *g, int64_t count);
/* dz = dg * gelu'(z). */
static void nn_gelu_bwd(const real_t *z, const real_t *dg, real_t *dz, int64_t count);

/* Softmax of each of the n rows of x[n, k], in place. */
static void nn_softmax_rows(real_t *x, int64_t n, int64_t k);

/* Softmax cross-entropy of logits[n, k] (turned into probabilities in place) against targets;
 * returns the sum of -log p[target] over rows (each term in real_t, the sum in double: it is
 * only reported). */
static double nn_softmax_xent_fwd(real_t *logits, const int32_t *targets, int64_t n, int64_t k);
/* dlogits = (p - onehot(target)) * scale, from the probabilities the forward left. */
static void nn_softmax_xent_bwd(const real_t *p, const int32_t *targets, real_t *dlogits, int64_t n,
                                int64_t k, real_t scale);

/* dst[i] += src[i]. */
static void nn_add(real_t *dst, const real_t *src, int64_t count);

#endif /* HCOMM_TRAIN_NN_H_ */
