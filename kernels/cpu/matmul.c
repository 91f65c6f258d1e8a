/* Linear layer, Hugging Face Conv1D layout (kernels/matmul.h). The fast version is
 * OpenBLAS SGEMM; this file is the one place that includes cblas.h. */
#include <cblas.h>
#include <string.h>

#include "kernels/matmul.h"
#include "kernels/pool.h"

// ----------------------------------------------------------------------------
// reference: plain loops, double accumulators

void kn_matmul_fwd_ref(float *out, const float *inp, const float *weight, const float *bias, int N,
                       int C, int OC)
{
    for (int n = 0; n < N; n++) {
        for (int o = 0; o < OC; o++) {
            double val = bias != NULL ? bias[o] : 0.0;
            for (int i = 0; i < C; i++) {
                val += (double)inp[(size_t)n * C + i] * weight[(size_t)i * OC + o];
            }
            out[(size_t)n * OC + o] = (float)val;
        }
    }
}

void kn_matmul_bwd_ref(float *dinp, float *dweight, float *dbias, const float *dout,
                       const float *inp, const float *weight, int N, int C, int OC)
{
    for (int n = 0; n < N; n++) {
        for (int i = 0; i < C; i++) {
            double val = 0.0;
            for (int o = 0; o < OC; o++) {
                val += (double)dout[(size_t)n * OC + o] * weight[(size_t)i * OC + o];
            }
            dinp[(size_t)n * C + i] = (float)val;
        }
    }
    for (int i = 0; i < C; i++) {
        for (int o = 0; o < OC; o++) {
            double val = 0.0;
            for (int n = 0; n < N; n++) {
                val += (double)inp[(size_t)n * C + i] * dout[(size_t)n * OC + o];
            }
            dweight[(size_t)i * OC + o] += (float)val;
        }
    }
    if (dbias != NULL) {
        for (int o = 0; o < OC; o++) {
            double val = 0.0;
            for (int n = 0; n < N; n++) {
                val += dout[(size_t)n * OC + o];
            }
            dbias[o] += (float)val;
        }
    }
}

// ----------------------------------------------------------------------------
// fast

void kn_matmul_fwd(float *out, const float *inp, const float *weight, const float *bias, int N,
                   int C, int OC)
{
    // seed out with the bias and let SGEMM accumulate onto it (beta = 1): one pass fewer
    // than adding the bias afterwards
    float beta = 0.0f;
    if (bias != NULL) {
        for (int n = 0; n < N; n++) {
            memcpy(out + (size_t)n * OC, bias, (size_t)OC * sizeof(float));
        }
        beta = 1.0f;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, OC, C, 1.0f, inp, C, weight, OC, beta,
                out, OC);
}

static void colsum_acc(float *restrict dbias, const float *restrict dout, int N, int OC)
{
    for (int n = 0; n < N; n++) {
        const float *row = dout + (size_t)n * OC;
        for (int o = 0; o < OC; o++) {
            dbias[o] += row[o];
        }
    }
}

void kn_matmul_bwd(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                   const float *weight, int N, int C, int OC)
{
    if (dinp != NULL) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, C, OC, 1.0f, dout, OC, weight, OC,
                    0.0f, dinp, C);
    }
    if (dweight != NULL) {
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, C, OC, N, 1.0f, inp, C, dout, OC, 1.0f,
                    dweight, OC);
    }
    if (dbias != NULL) {
        colsum_acc(dbias, dout, N, OC);
    }
}

void kn_blas_set_threads(int n)
{
    openblas_set_num_threads(n);
    kn_pool_set_threads(n);
}

int kn_blas_threads(void)
{
    return openblas_get_num_threads();
}
