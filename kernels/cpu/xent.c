/* LM head (tied to wte) fused with softmax cross-entropy (kernels/xent.h).
 * Per row: logsumexp over the V real columns; the backward writes
 * dlogits = scale * (softmax - onehot(target)) over those columns in place of the logits
 * and feeds them to two SGEMMs restricted to the real vocab. */
#include <cblas.h>
#include <math.h>

#include "kernels/pool.h"
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
    for (int n = 0; dx && n < N; n++) {
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
    for (int v = 0; dwte && v < V; v++) {
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

/* Rows [lo, hi) of a chunk: lse, losses, and with grad also the unscaled or scaled
 * dlogits in place. Rows are independent: split over the pool anywhere, the same bits. */
typedef struct xent_rows {
    float *logits, *lse, *losses;
    const int32_t *targets;
    int N, V, Vp;
    int want_lse;  /* compute lse (and losses when given) from the logits */
    int want_grad; /* overwrite the logits with (softmax - onehot) * scale */
    float scale;
} xent_rows_t;

static void xent_rows_part(void *ctx, int part, int nparts)
{
    const xent_rows_t *j = ctx;
    size_t lo, hi;
    kn_part_range((size_t)j->N, 1, part, nparts, &lo, &hi);
    for (size_t n = lo; n < hi; n++) {
        float *row = j->logits + n * (size_t)j->Vp;
        if (j->want_lse) {
            float maxval = kn_vmax(row, (size_t)j->V);
            j->lse[n] = maxval + logf(sum_exp(row, maxval, j->V));
            if (j->targets != NULL && j->losses != NULL) {
                j->losses[n] = j->lse[n] - row[j->targets[n]];
            }
        }
        if (j->want_grad) {
            float shift = j->lse[n], scale = j->scale;
            for (int v = 0; v < j->V; v++) {
                row[v] = kn_vexpf(row[v] - shift) * scale;
            }
            row[j->targets[n]] -= scale;
        }
    }
}

/* rows of ~V exponentials each: a part needs a few rows to be worth a thread */
static void xent_rows(xent_rows_t *j)
{
    kn_parallel(xent_rows_part, j, kn_pool_parts((size_t)j->N * (size_t)j->V, (size_t)1 << 17));
}

void kn_lmhead_fwd(float *logits, float *lse, float *losses, const float *x, const float *wte,
                   const int32_t *targets, int N, int C, int V, int Vp)
{
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, Vp, C, 1.0f, x, C, wte, C, 0.0f, logits,
                Vp);
    if (lse == NULL) {
        return;
    }
    xent_rows_t j = {logits, lse, losses, targets, N, V, Vp, 1, 0, 0.0f};
    xent_rows(&j);
}

void kn_lmhead_bwd(float *dx, float *dwte, float *logits, const float *lse, const float *x,
                   const float *wte, const int32_t *targets, float scale, int N, int C, int V,
                   int Vp)
{
    if (dx) { /* the input half: dlogits in place, dx */
        xent_rows_t j = {logits, (float *)lse, NULL, targets, N, V, Vp, 0, 1, scale};
        xent_rows(&j);
        // only the V real columns/rows take part; padded wte rows get nothing
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, V, 1.0f, logits, Vp, wte, C,
                    0.0f, dx, C);
    }
    if (dwte)
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, V, C, N, 1.0f, logits, Vp, x, C, 1.0f,
                    dwte, C);
}

void kn_lmhead_fwdbwd(float *dx, float *dwte, float *logits, float *lse, float *losses,
                      const float *x, const float *wte, const int32_t *targets, int acc, int N,
                      int C, int V, int Vp)
{
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, Vp, C, 1.0f, x, C, wte, C, 0.0f, logits,
                Vp);
    xent_rows_t j = {logits, lse, losses, targets, N, V, Vp, 1, 1, 1.0f};
    xent_rows(&j);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, V, 1.0f, logits, Vp, wte, C, 0.0f,
                dx, C);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, V, C, N, 1.0f, logits, Vp, x, C,
                acc ? 1.0f : 0.0f, dwte, C);
}

float kn_loss_mean(const float *losses, size_t n)
{
    double sum = 0.0;
    for (size_t i = 0; i < n; i++)
        sum += losses[i];
    return (float)(sum / (double)n);
}
