/* Dense kernels of the model, forward and backward side by side. */
#include "nn.h"

#include <math.h>
#include <string.h>

void nn_linear_fwd(const double *x, const double *w, const double *b, double *y, int64_t n,
                   int64_t in, int64_t out) {
    for (int64_t r = 0; r < n; r++) {
        double *yr = y + r * out;
        const double *xr = x + r * in;
        if (b != NULL)
            memcpy(yr, b, (size_t)out * sizeof *yr);
        else
            memset(yr, 0, (size_t)out * sizeof *yr);
        /* y[r, :] += x[r, i] * w[i, :] keeps the inner loop contiguous. */
        for (int64_t i = 0; i < in; i++) {
            const double xi = xr[i], *wi = w + i * out;
            for (int64_t o = 0; o < out; o++)
                yr[o] += xi * wi[o];
        }
    }
}

void nn_linear_bwd_input(const double *dy, const double *w, double *dx, double *wt, int64_t n,
                         int64_t in, int64_t out) {
    /* With w transposed once, each row is a sum of contiguous rows of w^T, which vectorizes;
     * every dx[r, i] still adds its terms in the order o = 0, 1, ... */
    for (int64_t i = 0; i < in; i++)
        for (int64_t o = 0; o < out; o++)
            wt[o * in + i] = w[i * out + o];
    for (int64_t r = 0; r < n; r++) {
        const double *dyr = dy + r * out;
        double *dxr = dx + r * in;
        memset(dxr, 0, (size_t)in * sizeof *dxr);
        for (int64_t o = 0; o < out; o++) {
            const double d = dyr[o], *wo = wt + o * in;
            for (int64_t i = 0; i < in; i++)
                dxr[i] += d * wo[i];
        }
    }
}

void nn_linear_bwd_params(const double *x, const double *dy, double *dw, double *db, int64_t n,
                          int64_t in, int64_t out) {
    for (int64_t r = 0; r < n; r++) {
        const double *xr = x + r * in, *dyr = dy + r * out;
        for (int64_t i = 0; i < in; i++) {
            const double xi = xr[i];
            double *dwi = dw + i * out;
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

void nn_gelu_fwd(const double *z, double *g, int64_t count) {
    for (int64_t i = 0; i < count; i++) {
        const double v = z[i];
        g[i] = 0.5 * v * (1.0 + tanh(GELU_K * (v + GELU_A * v * v * v)));
    }
}

void nn_gelu_bwd(const double *z, const double *dg, double *dz, int64_t count) {
    for (int64_t i = 0; i < count; i++) {
        const double v = z[i], t = tanh(GELU_K * (v + GELU_A * v * v * v));
        const double du = GELU_K * (1.0 + 3.0 * GELU_A * v * v);
        dz[i] = dg[i] * (0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * du);
    }
}

void nn_softmax_rows(double *x, int64_t n, int64_t k) {
    for (int64_t r = 0; r < n; r++) {
        double *xr = x + r * k, mx = xr[0], sum = 0.0;
        for (int64_t j = 1; j < k; j++)
            mx = xr[j] > mx ? xr[j] : mx;
        for (int64_t j = 0; j < k; j++)
            sum += (xr[j] = exp(xr[j] - mx));
        for (int64_t j = 0; j < k; j++)
            xr[j] /= sum;
    }
}

double nn_softmax_xent_fwd(double *logits, const int32_t *targets, int64_t n, int64_t k) {
    double loss = 0.0;
    nn_softmax_rows(logits, n, k);
    for (int64_t r = 0; r < n; r++) {
        const double p = logits[r * k + targets[r]];
        loss -= log(p > 1e-300 ? p : 1e-300);
    }
    return loss;
}

void nn_softmax_xent_bwd(const double *p, const int32_t *targets, double *dlogits, int64_t n,
                         int64_t k, double scale) {
    for (int64_t r = 0; r < n; r++) {
        for (int64_t j = 0; j < k; j++)
            dlogits[r * k + j] = p[r * k + j] * scale;
        dlogits[r * k + targets[r]] -= scale;
    }
}

void nn_add(double *dst, const double *src, int64_t count) {
    for (int64_t i = 0; i < count; i++)
        dst[i] += src[i];
}
