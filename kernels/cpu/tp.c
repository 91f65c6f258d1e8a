/* The vocab-parallel embedding and cross-entropy (kernels/tp.h): plain loops, one thread. */
#include <math.h>
#include <stddef.h>

#include "kernels/tp.h"

/* the slice's row of token tok, or NULL */
static const float *slice_row(const float *w, long tok, long v0, long Vl, size_t C)
{
    return tok >= v0 && tok < v0 + Vl ? w + (size_t)(tok - v0) * C : NULL;
}

void kn_tp_embed_fwd(float *out, const int32_t *inp, const float *wte, const float *wpe, int v0,
                     int Vl, int B, int T, int C)
{
    size_t N = (size_t)B * T;
    for (size_t n = 0; n < N; n++) {
        size_t t = n % (size_t)T;
        const float *w = slice_row(wte, inp[n], v0, Vl, (size_t)C);
        float *row = out + n * C;
        for (size_t i = 0; i < (size_t)C; i++) {
            float e = w != NULL ? w[i] : 0.0f;
            row[i] = wpe != NULL ? e + wpe[t * C + i] : e;
        }
    }
}

void kn_tp_embed_bwd(float *dwte, float *dwpe, const float *dout, const int32_t *inp, int v0,
                     int Vl, int B, int T, int C)
{
    size_t N = (size_t)B * T;
    for (size_t n = 0; n < N; n++) {
        size_t t = n % (size_t)T;
        const float *d = dout + n * C;
        float *w = (float *)slice_row(dwte, inp[n], v0, Vl, (size_t)C);
        for (size_t i = 0; i < (size_t)C; i++) {
            if (w != NULL) {
                w[i] += d[i];
            }
            dwpe[t * C + i] += d[i];
        }
    }
}

void kn_tp_xent_max(float *mx, const float *logits, int N, int Vl, int valid)
{
    for (size_t n = 0; n < (size_t)N; n++) {
        const float *row = logits + n * Vl;
        float v = -INFINITY;
        for (int j = 0; j < valid; j++) {
            v = row[j] > v ? row[j] : v;
        }
        mx[n] = v;
    }
}

void kn_tp_xent_sums(float *sum, float *tl, const float *logits, const float *mx,
                     const int32_t *targets, int v0, int N, int Vl, int valid)
{
    for (size_t n = 0; n < (size_t)N; n++) {
        const float *row = logits + n * Vl;
        double acc = 0.0;
        for (int j = 0; j < valid; j++) {
            acc += exp((double)row[j] - mx[n]);
        }
        long t = (long)targets[n] - v0;
        sum[n] = (float)acc;
        tl[n] = t >= 0 && t < valid ? row[t] : 0.0f;
    }
}

void kn_tp_xent_finish(float *lse, float *losses, const float *mx, const float *sum,
                       const float *tl, int N)
{
    for (size_t n = 0; n < (size_t)N; n++) {
        lse[n] = mx[n] + logf(sum[n]);
        losses[n] = lse[n] - tl[n];
    }
}

void kn_tp_xent_bwd(float *logits, const float *lse, const int32_t *targets, float scale, int v0,
                    int N, int Vl, int valid)
{
    for (size_t n = 0; n < (size_t)N; n++) {
        float *row = logits + n * Vl, l = lse[n];
        long t = (long)targets[n] - v0;
        for (int j = 0; j < Vl; j++) {
            row[j] = j < valid ? expf(row[j] - l) * scale : 0.0f;
        }
        if (t >= 0 && t < valid) {
            row[t] -= scale;
        }
    }
}
