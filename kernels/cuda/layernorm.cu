/* LayerNorm forward/backward (kernels/layernorm.h), one warp per row.
 *
 * The forward is the reference's two passes (mean, then the variance of x - mean) with
 * each lane summing a strided slice and a shuffle tree joining the lanes.
 * The backward writes dinp per row like the forward and sums dweight/dbias without atomics:
 * KN_CUDA_LN_PARTIALS warps (a fixed grid) each own one partial row pair in scratch and
 * visit rows warp, warp + P, warp + 2P, ...; a second kernel adds the partials in order. */
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

static __global__ void ln_bwd_kernel(float *dinp, float *partials, const float *dout,
                                     const float *inp, const float *weight, const float *mean,
                                     const float *rstd, int N, int C)
{
    int lane = threadIdx.x % 32;
    int warp = blockIdx.x * LN_WARPS + threadIdx.x / 32; /* < KN_CUDA_LN_PARTIALS */
    float *pdw = partials + (size_t)warp * 2 * C;
    float *pdb = pdw + C;
    for (int i = lane; i < C; i += 32) {
        pdw[i] = 0.0f;
        pdb[i] = 0.0f;
    }
    for (int row = warp; row < N; row += KN_CUDA_LN_PARTIALS) {
        const float *dy = dout + (size_t)row * C;
        const float *x = inp + (size_t)row * C;
        float m = mean[row], r = rstd[row];
        float a1 = 0.0f, a2 = 0.0f;
        for (int i = lane; i < C; i += 32) {
            float norm = (x[i] - m) * r;
            float dnorm = weight[i] * dy[i];
            a1 += dnorm;
            a2 += dnorm * norm;
        }
        float dnorm_mean = kn_warp_sum(a1) / C;
        float dnorm_norm_mean = kn_warp_sum(a2) / C;
        float *dx = dinp + (size_t)row * C;
        for (int i = lane; i < C; i += 32) {
            float norm = (x[i] - m) * r;
            float dnorm = weight[i] * dy[i];
            pdb[i] += dy[i];
            pdw[i] += norm * dy[i];
            dx[i] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * r;
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
    if (i < C) {
        dweight[i] += s;
    } else {
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
    ln_bwd_kernel<<<KN_CUDA_LN_PARTIALS / LN_WARPS, 32 * LN_WARPS, 0, stream>>>(
        dinp, scratch, dout, inp, weight, mean, rstd, N, C);
    int rc = kn_cu_launched();
    if (rc == 0) {
        ln_bwd_sum_kernel<<<kn_cu_blocks((size_t)2 * C, 256), 256, 0, stream>>>(dweight, dbias,
                                                                                scratch, C);
        rc = kn_cu_launched();
    }
    return rc;
}
