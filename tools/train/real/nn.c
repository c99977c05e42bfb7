/* Dense kernels of the model, forward and backward side by side. <tgmath.h> and real_t
 * constants keep every operation in real_t (tanhf, expf, logf in the f32 copy). */
#include "nn.h"

#include <tgmath.h>
#include <string.h>

static void nn_linear_fwd(const real_t *x, const real_t *w, const real_t *b, real_t *y, int64_t n,
                          int64_t in, int64_t out) {
    for (int64_t r = 0; r < n; r++) {
        real_t *yr = y + r * out;
        const real_t *xr = x + r * in;
        if (b != NULL)
            memcpy(yr, b, (size_t)out * sizeof *yr);
        else
            memset(yr, 0, (size_t)out * sizeof *yr);
        /* y[r, :] += x[r, i] * w[i, :] keeps the inner loop contiguous. */
        for (int64_t i = 0; i < in; i++) {
            const real_t xi = xr[i], *wi = w + i * out;
            for (int64_t o = 0; o < out; o++)
                yr[o] += xi * wi[o];
        }
    }
}

static void nn_linear_bwd_input(const real_t *dy, const real_t *w, real_t *dx, real_t *wt,
                                int64_t n, int64_t in, int64_t out) {
    /* With w transposed once, each row is a sum of contiguous rows of w^T, which vectorizes;
     * every dx[r, i] still adds its terms in the order o = 0, 1, ... */
    for (int64_t i = 0; i < in; i++)
        for (int64_t o = 0; o < out; o++)
            wt[o * in + i] = w[i * out + o];
    for (int64_t r = 0; r < n; r++) {
        const real_t *dyr = dy + r * out;
        real_t *dxr = dx + r * in;
        memset(dxr, 0, (size_t)in * sizeof *dxr);
        for (int64_t o = 0; o < out; o++) {
            const real_t d = dyr[o], *wo = wt + o * in;
            for (int64_t i = 0; i < in; i++)
                dxr[i] += d * wo[i];
        }
    }
}

static void nn_linear_bwd_params(const real_t *x, const real_t *dy, real_t *dw, real_t *db,
                                 int64_t n, int64_t in, int64_t out) {
    for (int64_t r = 0; r < n; r++) {
        const real_t *xr = x + r * in, *dyr = dy + r * out;
        for (int64_t i = 0; i < in; i++) {
            const real_t xi = xr[i];
            real_t *dwi = dw + i * out;
            for (int64_t o = 0; o < out; o++)
                dwi[o] += xi * dyr[o];
        }
        if (db != NULL)
            for (int64_t o = 0; o < out; o++)
                db[o] += dyr[o];
    }
}

#define GELU_K 0.7978845608028654 /* sqrt(2 / pi) */
#define GELU_A 0.044715

static void nn_gelu_fwd(const real_t *z, real_t *g, int64_t count) {
    for (int64_t i = 0; i < count; i++) {
        const real_t v = z[i], k = (real_t)GELU_K, a = (real_t)GELU_A, half = (real_t)0.5;
        g[i] = half * v * ((real_t)1 + tanh(k * (v + a * v * v * v)));
    }
}

static void nn_gelu_bwd(const real_t *z, const real_t *dg, real_t *dz, int64_t count) {
    for (int64_t i = 0; i < count; i++) {
        const real_t v = z[i], k = (real_t)GELU_K, a = (real_t)GELU_A, half = (real_t)0.5;
        const real_t one = 1, t = tanh(k * (v + a * v * v * v)), du = k * (one + 3 * a * v * v);
        dz[i] = dg[i] * (half * (one + t) + half * v * (one - t * t) * du);
    }
}

static void nn_softmax_rows(real_t *x, int64_t n, int64_t k) {
    for (int64_t r = 0; r < n; r++) {
        real_t *xr = x + r * k, mx = xr[0], sum = 0;
        for (int64_t j = 1; j < k; j++)
            mx = xr[j] > mx ? xr[j] : mx;
        for (int64_t j = 0; j < k; j++)
            sum += (xr[j] = exp(xr[j] - mx));
        for (int64_t j = 0; j < k; j++)
            xr[j] /= sum;
    }
}

static double nn_softmax_xent_fwd(real_t *logits, const int32_t *targets, int64_t n, int64_t k) {
    double loss = 0.0;
    nn_softmax_rows(logits, n, k);
    for (int64_t r = 0; r < n; r++) {
        const real_t p = logits[r * k + targets[r]];
        loss -= (double)log(p > REAL_TINY ? p : REAL_TINY);
    }
    return loss;
}

static void nn_softmax_xent_bwd(const real_t *p, const int32_t *targets, real_t *dlogits, int64_t n,
                                int64_t k, real_t scale) {
    for (int64_t r = 0; r < n; r++) {
        for (int64_t j = 0; j < k; j++)
            dlogits[r * k + j] = p[r * k + j] * scale;
        dlogits[r * k + targets[r]] -= scale;
    }
}

static void nn_add(real_t *dst, const real_t *src, int64_t count) {
    for (int64_t i = 0; i < count; i++)
        dst[i] += src[i];
}
