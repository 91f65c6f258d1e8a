/* Token + position embedding, forward and backward (kernels/encoder.h). */
#include <string.h>

#include "kernels/encoder.h"

// ----------------------------------------------------------------------------
// reference

void kn_encoder_fwd_ref(float *out, const int32_t *inp, const float *wte, const float *wpe, int B,
                        int T, int C)
{
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            float *out_bt = out + ((size_t)b * T + t) * C;
            const float *wte_ix = wte + (size_t)inp[b * T + t] * C;
            const float *wpe_t = wpe + (size_t)t * C;
            for (int i = 0; i < C; i++) {
                out_bt[i] = wte_ix[i] + wpe_t[i];
            }
        }
    }
}

void kn_encoder_bwd_ref(float *dwte, float *dwpe, const float *dout, const int32_t *inp, int B,
                        int T, int C)
{
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            const float *dout_bt = dout + ((size_t)b * T + t) * C;
            float *dwte_ix = dwte + (size_t)inp[b * T + t] * C;
            float *dwpe_t = dwpe + (size_t)t * C;
            for (int i = 0; i < C; i++) {
                dwte_ix[i] += dout_bt[i];
                dwpe_t[i] += dout_bt[i];
            }
        }
    }
}

// ----------------------------------------------------------------------------
// fast: the same row operations on restrict-qualified rows so each one is a
// straight vector loop; b is the outer loop of the backward so a dwpe row is
// updated in the same order as the reference (bit-identical results).

static void add_rows(float *restrict out, const float *restrict a, const float *restrict b, int C)
{
    for (int i = 0; i < C; i++) {
        out[i] = a[i] + b[i];
    }
}

static void acc_row(float *restrict acc, const float *restrict x, int C)
{
    for (int i = 0; i < C; i++) {
        acc[i] += x[i];
    }
}

void kn_encoder_fwd(float *out, const int32_t *inp, const float *wte, const float *wpe, int B,
                    int T, int C)
{
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            add_rows(out + ((size_t)b * T + t) * C, wte + (size_t)inp[b * T + t] * C,
                     wpe + (size_t)t * C, C);
        }
    }
}

void kn_encoder_bwd(float *dwte, float *dwpe, const float *dout, const int32_t *inp, int B, int T,
                    int C)
{
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            const float *dout_bt = dout + ((size_t)b * T + t) * C;
            acc_row(dwte + (size_t)inp[b * T + t] * C, dout_bt, C);
            acc_row(dwpe + (size_t)t * C, dout_bt, C);
        }
    }
}
