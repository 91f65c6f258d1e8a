/* LM head (tied to wte) fused with softmax cross-entropy (kernels/xent.h).
 * Per row: logsumexp over the V real columns; the backward writes
 * dlogits = scale * (softmax - onehot(target)) over those columns in place of the logits
 * and feeds them to two SGEMMs restricted to the real vocab. */
#include <cblas.h>
#include <math.h>

#include "kernels/vmath.h"
#include "kernels/xent.h"

// ----------------------------------------------------------------------------
// reference

void kn_lmhead_fwd_ref(float *logits, float *lse, float *losses, const float *x, const float *wte,
                       const int32_t *targets, int N, int C, int V, int Vp)
{
    for (int n = 0; n < N; n++) {
        float *row = logits + (size_t)n * Vp;
        for (int v = 0; v < Vp; v++) {
            double val = 0.0;
            for (int i = 0; i < C; i++) {
                val += (double)x[(size_t)n * C + i] * wte[(size_t)v * C + i];
            }
            row[v] = (float)val;
        }
        if (lse == NULL) {
            continue;
        }
        float maxval = -INFINITY;
        for (int v = 0; v < V; v++) {
            maxval = row[v] > maxval ? row[v] : maxval;
        }
        double sum = 0.0;
        for (int v = 0; v < V; v++) {
            sum += exp((double)row[v] - maxval);
        }
        lse[n] = (float)(maxval + log(sum));
        if (targets != NULL && losses != NULL) {
            losses[n] = lse[n] - row[targets[n]];
        }
    }
}

void kn_lmhead_bwd_ref(float *dx, float *dwte, float *logits, const float *lse, const float *x,
                       const float *wte, const int32_t *targets, float scale, int N, int C, int V,
                       int Vp)
{
    for (int n = 0; n < N; n++) {
        float *row = logits + (size_t)n * Vp;
        for (int v = 0; v < V; v++) {
            double p = exp((double)row[v] - lse[n]);
            row[v] = (float)((p - (v == targets[n] ? 1.0 : 0.0)) * scale);
        }
        for (int i = 0; i < C; i++) {
            double val = 0.0;
            for (int v = 0; v < V; v++) {
                val += (double)row[v] * wte[(size_t)v * C + i];
            }
            dx[(size_t)n * C + i] = (float)val;
        }
    }
    for (int v = 0; v < V; v++) {
        for (int i = 0; i < C; i++) {
            double val = 0.0;
            for (int n = 0; n < N; n++) {
                val += (double)logits[(size_t)n * Vp + v] * x[(size_t)n * C + i];
            }
            dwte[(size_t)v * C + i] += (float)val;
        }
    }
}

// ----------------------------------------------------------------------------
// fast

/* sum of exp(x[i] - shift) without storing the exponentials */
static float sum_exp(const float *x, float shift, int n)
{
    float acc[KN_LANES] = {0};
    int i = 0;
    for (; i + KN_LANES <= n; i += KN_LANES) {
        for (int j = 0; j < KN_LANES; j++) {
            acc[j] += kn_vexpf(x[i + j] - shift);
        }
    }
    float s = kn_vsum(acc, KN_LANES);
    for (; i < n; i++) {
        s += kn_vexpf(x[i] - shift);
    }
    return s;
}

void kn_lmhead_fwd(float *logits, float *lse, float *losses, const float *x, const float *wte,
                   const int32_t *targets, int N, int C, int V, int Vp)
{
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, Vp, C, 1.0f, x, C, wte, C, 0.0f, logits,
                Vp);
    if (lse == NULL) {
        return;
    }
    for (int n = 0; n < N; n++) {
        const float *row = logits + (size_t)n * Vp;
        float maxval = kn_vmax(row, (size_t)V);
        lse[n] = maxval + logf(sum_exp(row, maxval, V));
        if (targets != NULL && losses != NULL) {
            losses[n] = lse[n] - row[targets[n]];
        }
    }
}

void kn_lmhead_bwd(float *dx, float *dwte, float *logits, const float *lse, const float *x,
                   const float *wte, const int32_t *targets, float scale, int N, int C, int V,
                   int Vp)
{
    for (int n = 0; n < N; n++) {
        float *row = logits + (size_t)n * Vp;
        float shift = lse[n];
        for (int v = 0; v < V; v++) {
            row[v] = kn_vexpf(row[v] - shift) * scale;
        }
        row[targets[n]] -= scale;
    }
    // only the V real columns/rows take part; padded wte rows get nothing
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, V, 1.0f, logits, Vp, wte, C, 0.0f,
                dx, C);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, V, C, N, 1.0f, logits, Vp, x, C, 1.0f,
                dwte, C);
}
