/* LayerNorm forward/backward (kernels/layernorm.h), one warp per row.
 *
 * The forward is the reference's two passes (mean, then the variance of x - mean) with
 * each lane summing a strided slice and a shuffle tree joining the lanes.
 * The backward writes dinp per row like the forward and sums dweight/dbias without atomics:
 * KN_CUDA_LN_PARTIALS warps (a fixed grid) each own one partial row pair in scratch and
 * visit rows warp, warp + P, warp + 2P, ...; a second kernel adds the partials in order.
 * A split backward (ZB-H1) runs either half alone: a kernel variant without the partials
 * (input pass) or without dinp and any read of the weight (weight pass). */
#include <math.h>

#include "kernels/cuda/common.cuh"
#include "kernels/layernorm.h" /* KN_LN_EPS */

#define LN_WARPS 4 /* warps per block */

static __global__ void ln_fwd_kernel(float *out, float *mean, float *rstd, const float *inp,
                                     const float *weight, const float *bias, int N, int C)
{
    int lane = threadIdx.x % 32;
    int row = blockIdx.x * LN_WARPS + threadIdx.x / 32;
    if (row >= N) {
        return;
    }
    const float *x = inp + (size_t)row * C;
    float s = 0.0f;
    for (int i = lane; i < C; i += 32) {
        s += x[i];
    }
    float m = kn_warp_sum(s) / C;
    float v = 0.0f;
    for (int i = lane; i < C; i += 32) {
        float d = x[i] - m;
        v += d * d;
    }
    v = kn_warp_sum(v) / C;
    float r = 1.0f / sqrtf(v + KN_LN_EPS);
    float *o = out + (size_t)row * C;
    for (int i = lane; i < C; i += 32) {
        o[i] = (x[i] - m) * r * weight[i] + bias[i];
    }
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = r;
    }
}

extern "C" int kn_cuda_layernorm_fwd(float *out, float *mean, float *rstd, const float *inp,
                                     const float *weight, const float *bias, int N, int C,
                                     kn_stream_t stream)
{
    if (N <= 0 || C <= 0) {
        return -EINVAL;
    }
    ln_fwd_kernel<<<kn_cu_blocks((size_t)N, LN_WARPS), 32 * LN_WARPS, 0, stream>>>(
        out, mean, rstd, inp, weight, bias, N, C);
    return kn_cu_launched();
}

/* DINP: write dinp (reads weight); PARAMS: the partial sums of dweight/dbias (a split
 * backward's input pass is <true, false>, its weight pass <false, true>; the arithmetic of
 * each output is the same in every variant, so the halves give the whole one's bits) */
template <bool DINP, bool PARAMS>
static __global__ void ln_bwd_kernel(float *dinp, float *partials, const float *dout,
                                     const float *inp, const float *weight, const float *mean,
                                     const float *rstd, int N, int C)
{
    int lane = threadIdx.x % 32;
    int warp = blockIdx.x * LN_WARPS + threadIdx.x / 32; /* < KN_CUDA_LN_PARTIALS */
    float *pdw = PARAMS ? partials + (size_t)warp * 2 * C : NULL;
    float *pdb = PARAMS ? pdw + C : NULL;
    for (int i = lane; PARAMS && i < C; i += 32) {
        pdw[i] = 0.0f;
        pdb[i] = 0.0f;
    }
    for (int row = warp; row < N; row += KN_CUDA_LN_PARTIALS) {
        const float *dy = dout + (size_t)row * C;
        const float *x = inp + (size_t)row * C;
        float m = mean[row], r = rstd[row];
        float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
        if (DINP) {
            float a1 = 0.0f, a2 = 0.0f;
            for (int i = lane; i < C; i += 32) {
                float norm = (x[i] - m) * r;
                float dnorm = weight[i] * dy[i];
                a1 += dnorm;
                a2 += dnorm * norm;
            }
            dnorm_mean = kn_warp_sum(a1) / C;
            dnorm_norm_mean = kn_warp_sum(a2) / C;
        }
        for (int i = lane; i < C; i += 32) {
            float norm = (x[i] - m) * r;
            if (PARAMS) {
                pdb[i] += dy[i];
                pdw[i] += norm * dy[i];
            }
            if (DINP) {
                float dnorm = weight[i] * dy[i];
                dinp[(size_t)row * C + i] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * r;
            }
        }
    }
}

/* one thread per entry of [dweight | dbias] */
static __global__ void ln_bwd_sum_kernel(float *dweight, float *dbias, const float *partials, int C)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= 2 * C) {
        return;
    }
    float s = 0.0f;
    for (int p = 0; p < KN_CUDA_LN_PARTIALS; p++) {
        s += partials[(size_t)p * 2 * C + i];
    }
    if (i < C && dweight != NULL) {
        dweight[i] += s;
    } else if (i >= C && dbias != NULL) {
        dbias[i - C] += s;
    }
}

extern "C" int kn_cuda_layernorm_bwd(float *dinp, float *dweight, float *dbias, float *scratch,
                                     const float *dout, const float *inp, const float *weight,
                                     const float *mean, const float *rstd, int N, int C,
                                     kn_stream_t stream)
{
    if (N <= 0 || C <= 0) {
        return -EINVAL;
    }
    int params = dweight != NULL || dbias != NULL, rc = 0;
    dim3 grid(KN_CUDA_LN_PARTIALS / LN_WARPS), block(32 * LN_WARPS);
    if (dinp != NULL && params) {
        ln_bwd_kernel<true, true>
            <<<grid, block, 0, stream>>>(dinp, scratch, dout, inp, weight, mean, rstd, N, C);
    } else if (dinp != NULL) {
        ln_bwd_kernel<true, false>
            <<<grid, block, 0, stream>>>(dinp, NULL, dout, inp, weight, mean, rstd, N, C);
    } else if (params) {
        ln_bwd_kernel<false, true>
            <<<grid, block, 0, stream>>>(NULL, scratch, dout, inp, NULL, mean, rstd, N, C);
    } else {
        return 0; /* nothing asked */
    }
    rc = kn_cu_launched();
    if (rc == 0 && params) {
        ln_bwd_sum_kernel<<<kn_cu_blocks((size_t)2 * C, 256), 256, 0, stream>>>(dweight, dbias,
                                                                                scratch, C);
        rc = kn_cu_launched();
    }
    return rc;
}
