/* LayerNorm forward/backward (kernels/layernorm.h), after llm.c's layernorm_forward and
 * layernorm_backward. Rows are independent; the fast version replaces each row's
 * sequential sums with lane sums (kernels/vmath.h) so every loop vectorises. */
#include <math.h>

#include "kernels/layernorm.h"
#include "kernels/vmath.h"

// ----------------------------------------------------------------------------
// reference

void kn_layernorm_fwd_ref(float *out, float *mean, float *rstd, const float *inp,
                          const float *weight, const float *bias, int N, int C)
{
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        float m = 0.0f;
        for (int i = 0; i < C; i++) {
            m += x[i];
        }
        m = m / C;
        float v = 0.0f;
        for (int i = 0; i < C; i++) {
            float xshift = x[i] - m;
            v += xshift * xshift;
        }
        v = v / C;
        float s = 1.0f / sqrtf(v + KN_LN_EPS);
        float *o = out + (size_t)n * C;
        for (int i = 0; i < C; i++) {
            float norm = (x[i] - m) * s;
            o[i] = norm * weight[i] + bias[i];
        }
        mean[n] = m;
        rstd[n] = s;
    }
}

void kn_layernorm_bwd_ref(float *dinp, float *dweight, float *dbias, const float *dout,
                          const float *inp, const float *weight, const float *mean,
                          const float *rstd, int N, int C)
{
    for (int n = 0; n < N; n++) {
        const float *dout_n = dout + (size_t)n * C;
        const float *inp_n = inp + (size_t)n * C;
        float *dinp_n = dinp + (size_t)n * C;
        float mean_n = mean[n];
        float rstd_n = rstd[n];

        // two reductions: mean of dnorm and mean of dnorm * norm
        float dnorm_mean = 0.0f;
        float dnorm_norm_mean = 0.0f;
        for (int i = 0; i < C; i++) {
            float norm_i = (inp_n[i] - mean_n) * rstd_n;
            float dnorm_i = weight[i] * dout_n[i];
            dnorm_mean += dnorm_i;
            dnorm_norm_mean += dnorm_i * norm_i;
        }
        dnorm_mean = dnorm_mean / C;
        dnorm_norm_mean = dnorm_norm_mean / C;

        for (int i = 0; i < C; i++) {
            float norm_i = (inp_n[i] - mean_n) * rstd_n;
            float dnorm_i = weight[i] * dout_n[i];
            dbias[i] += dout_n[i];
            dweight[i] += norm_i * dout_n[i];
            float dval = dnorm_i - dnorm_mean - norm_i * dnorm_norm_mean;
            dinp_n[i] += dval * rstd_n;
        }
    }
}

// ----------------------------------------------------------------------------
// fast

static void ln_row_fwd(float *restrict o, const float *restrict x, const float *restrict w,
                       const float *restrict b, float *mean_out, float *rstd_out, int C)
{
    float m = kn_vsum(x, (size_t)C) / C;
    float acc[KN_LANES] = {0};
    int i = 0;
    for (; i + KN_LANES <= C; i += KN_LANES) {
        for (int j = 0; j < KN_LANES; j++) {
            float d = x[i + j] - m;
            acc[j] += d * d;
        }
    }
    float v = kn_vsum(acc, KN_LANES);
    for (; i < C; i++) {
        float d = x[i] - m;
        v += d * d;
    }
    v = v / C;
    float s = 1.0f / sqrtf(v + KN_LN_EPS);
    for (i = 0; i < C; i++) {
        o[i] = (x[i] - m) * s * w[i] + b[i];
    }
    *mean_out = m;
    *rstd_out = s;
}

void kn_layernorm_fwd(float *out, float *mean, float *rstd, const float *inp, const float *weight,
                      const float *bias, int N, int C)
{
    for (int n = 0; n < N; n++) {
        ln_row_fwd(out + (size_t)n * C, inp + (size_t)n * C, weight, bias, &mean[n], &rstd[n], C);
    }
}

/* The two row means the input gradient needs: of dnorm = w * dy, and of dnorm * norm. */
static void ln_row_dnorm_means(const float *restrict dy, const float *restrict x,
                               const float *restrict w, float m, float s, int C, float *mean_out,
                               float *norm_mean_out)
{
    float a1[KN_LANES] = {0}, a2[KN_LANES] = {0};
    int i = 0;
    for (; i + KN_LANES <= C; i += KN_LANES) {
        for (int j = 0; j < KN_LANES; j++) {
            float norm = (x[i + j] - m) * s;
            float dnorm = w[i + j] * dy[i + j];
            a1[j] += dnorm;
            a2[j] += dnorm * norm;
        }
    }
    float dnorm_mean = kn_vsum(a1, KN_LANES);
    float dnorm_norm_mean = kn_vsum(a2, KN_LANES);
    for (; i < C; i++) {
        float norm = (x[i] - m) * s;
        float dnorm = w[i] * dy[i];
        dnorm_mean += dnorm;
        dnorm_norm_mean += dnorm * norm;
    }
    *mean_out = dnorm_mean / C;
    *norm_mean_out = dnorm_norm_mean / C;
}

static void ln_row_bwd(float *restrict dx, float *restrict dw, float *restrict db,
                       const float *restrict dy, const float *restrict x, const float *restrict w,
                       float m, float s, int C)
{
    float dnorm_mean, dnorm_norm_mean;
    ln_row_dnorm_means(dy, x, w, m, s, C, &dnorm_mean, &dnorm_norm_mean);
    for (int i = 0; i < C; i++) {
        float norm = (x[i] - m) * s;
        float dnorm = w[i] * dy[i];
        db[i] += dy[i];
        dw[i] += norm * dy[i];
        dx[i] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
    }
}

/* One row's weight and bias gradients alone: ln_row_bwd's arithmetic for them. */
static void ln_row_bwd_weight(float *restrict dw, float *restrict db, const float *restrict dy,
                              const float *restrict x, float m, float s, int C)
{
    for (int i = 0; i < C; i++) {
        float norm = (x[i] - m) * s;
        db[i] += dy[i];
        dw[i] += norm * dy[i];
    }
}

/* One row's input gradient alone: ln_row_bwd's arithmetic for it. */
static void ln_row_bwd_input(float *restrict dx, const float *restrict dy, const float *restrict x,
                             const float *restrict w, float m, float s, int C)
{
    float dnorm_mean, dnorm_norm_mean;
    ln_row_dnorm_means(dy, x, w, m, s, C, &dnorm_mean, &dnorm_norm_mean);
    for (int i = 0; i < C; i++) {
        float norm = (x[i] - m) * s;
        float dnorm = w[i] * dy[i];
        dx[i] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
    }
}

void kn_layernorm_bwd(float *dinp, float *dweight, float *dbias, const float *dout,
                      const float *inp, const float *weight, const float *mean, const float *rstd,
                      int N, int C)
{
    for (int n = 0; n < N; n++) {
        size_t r = (size_t)n * C;
        if (dinp != NULL && dweight != NULL) {
            ln_row_bwd(dinp + r, dweight, dbias, dout + r, inp + r, weight, mean[n], rstd[n], C);
        } else if (dinp != NULL) {
            ln_row_bwd_input(dinp + r, dout + r, inp + r, weight, mean[n], rstd[n], C);
        } else {
            ln_row_bwd_weight(dweight, dbias, dout + r, inp + r, mean[n], rstd[n], C);
        }
    }
}
