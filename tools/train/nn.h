/* Dense kernels of the model, forward and backward side by side. Row-major double arrays;
 * n rows (tokens), in/out features. Plain loops with the innermost index contiguous. */
#ifndef HCOMM_TRAIN_NN_H_
#define HCOMM_TRAIN_NN_H_

#include <stdint.h>

/* y[n, out] = x[n, in] w[in, out] (+ b[out] when b is not NULL). */
void nn_linear_fwd(const double *x, const double *w, const double *b, double *y, int64_t n,
                   int64_t in, int64_t out);
/* dx[n, in] = dy[n, out] w[in, out]^T (overwrites dx); wt [out, in] is scratch for w^T. */
void nn_linear_bwd_input(const double *dy, const double *w, double *dx, double *wt, int64_t n,
                         int64_t in, int64_t out);
/* dw[in, out] += x^T dy; db[out] += sum over rows of dy (db may be NULL). */
void nn_linear_bwd_params(const double *x, const double *dy, double *dw, double *db, int64_t n,
                          int64_t in, int64_t out);

/* g = gelu(z), tanh form (Hendrycks & Gimpel 2016), count elements. */
void nn_gelu_fwd(const double *z, double *g, int64_t count);
/* dz = dg * gelu'(z). */
void nn_gelu_bwd(const double *z, const double *dg, double *dz, int64_t count);

/* Softmax of each of the n rows of x[n, k], in place. */
void nn_softmax_rows(double *x, int64_t n, int64_t k);

/* Softmax cross-entropy of logits[n, k] (turned into probabilities in place) against targets;
 * returns the sum of -log p[target] over rows. */
double nn_softmax_xent_fwd(double *logits, const int32_t *targets, int64_t n, int64_t k);
/* dlogits = (p - onehot(target)) * scale, from the probabilities the forward left. */
void nn_softmax_xent_bwd(const double *p, const int32_t *targets, double *dlogits, int64_t n,
                         int64_t k, double scale);

/* dst[i] += src[i]. */
void nn_add(double *dst, const double *src, int64_t count);

#endif /* HCOMM_TRAIN_NN_H_ */
