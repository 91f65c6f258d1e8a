/* AdamW and the sum of squares (kernels/adamw.h).
 *
 * AdamW repeats the CPU fast kernel's fp32 sequence with each operation rounded on its own
 * (__fmul_rn and friends keep nvcc from contracting into FMAs; sqrt and division are IEEE),
 * so GPU and CPU updates are bit-identical and a checkpoint moves between them unchanged.
 * The fused form (clip scale, update, gradient reset in one pass) is the same kernel: the
 * plain one is it with gscale 1 (an exact multiply) and the gradient left alone.
 *
 * The sum of squares is deterministic: a fixed grid of KN_CUDA_SUMSQ_PARTIALS blocks, each a
 * fixed-order double sum of a grid-stride slice, then one block adds the partials in order. */
#include <math.h>

#include "kernels/cuda/common.cuh"

struct adamw_consts {
    float decay, b1, one_minus_b1, b2, one_minus_b2, bc2_sqrt, neg_step, eps;
};

/* kn_cuda_adamw on g[i] * gscale (one rounded multiply: exact when gscale is 1), then
 * g[i] = 0 when zero_g. g is read once, before it is zeroed. */
static __global__ void adamw_kernel(float *p, float *g, float *m, float *v, size_t n,
                                    adamw_consts k, float gscale, int zero_g)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float gi = __fmul_rn(g[i], gscale);
        if (zero_g) {
            g[i] = 0.0f;
        }
        float mi = __fadd_rn(__fmul_rn(m[i], k.b1), __fmul_rn(gi, k.one_minus_b1));
        float vi = __fadd_rn(__fmul_rn(v[i], k.b2), __fmul_rn(__fmul_rn(k.one_minus_b2, gi), gi));
        m[i] = mi;
        v[i] = vi;
        float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), k.bc2_sqrt), k.eps);
        p[i] = __fadd_rn(__fmul_rn(p[i], k.decay), __fdiv_rn(__fmul_rn(k.neg_step, mi), denom));
    }
}

static int adamw_launch(float *p, float *g, float *m, float *v, size_t n, double lr, double beta1,
                        double beta2, double eps, double wd, uint64_t t, float gscale, int zero_g,
                        kn_stream_t stream)
{
    if (n == 0) {
        return 0;
    }
    if (t == 0) {
        return -EINVAL;
    }
    // the scalars exactly as kn_adamw computes them (double, rounded once)
    adamw_consts k;
    k.decay = (float)(1.0 - lr * wd);
    k.b1 = (float)beta1;
    k.one_minus_b1 = (float)(1.0 - beta1);
    k.b2 = (float)beta2;
    k.one_minus_b2 = (float)(1.0 - beta2);
    k.bc2_sqrt = (float)sqrt(1.0 - pow(beta2, (double)t));
    k.neg_step = (float)(-(lr / (1.0 - pow(beta1, (double)t))));
    k.eps = (float)eps;
    unsigned blocks = kn_cu_blocks(n, 256);
    blocks = blocks > 65536u ? 65536u : blocks;
    adamw_kernel<<<blocks, 256, 0, stream>>>(p, g, m, v, n, k, gscale, zero_g);
    return kn_cu_launched();
}

extern "C" int kn_cuda_adamw(float *p, const float *g, float *m, float *v, size_t n, double lr,
                             double beta1, double beta2, double eps, double wd, uint64_t t,
                             kn_stream_t stream)
{
    /* zero_g = 0: g is only read; times 1.0f is exact */
    return adamw_launch(p, (float *)g, m, v, n, lr, beta1, beta2, eps, wd, t, 1.0f, 0, stream);
}

extern "C" int kn_cuda_adamw_fused(float *p, float *g, float *m, float *v, size_t n, double lr,
                                   double beta1, double beta2, double eps, double wd, uint64_t t,
                                   float gscale, int zero_g, kn_stream_t stream)
{
    return adamw_launch(p, g, m, v, n, lr, beta1, beta2, eps, wd, t, gscale, zero_g, stream);
}

#define SUMSQ_THREADS 256

/* One block's fixed-order reduction of per-thread doubles; the result in thread 0. */
static __device__ double block_sum_d(double s)
{
    __shared__ double warps[SUMSQ_THREADS / 32];
    s = kn_warp_sum_d(s);
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    if (lane == 0) {
        warps[warp] = s;
    }
    __syncthreads();
    s = 0.0;
    if (threadIdx.x == 0) {
        for (int w = 0; w < SUMSQ_THREADS / 32; w++) {
            s += warps[w];
        }
    }
    return s;
}

static __global__ void sumsq_partial_kernel(double *partials, const float *x, size_t n)
{
    double s = 0.0;
    for (size_t i = (size_t)blockIdx.x * SUMSQ_THREADS + threadIdx.x; i < n;
         i += (size_t)KN_CUDA_SUMSQ_PARTIALS * SUMSQ_THREADS) {
        double xi = x[i];
        s += xi * xi;
    }
    s = block_sum_d(s);
    if (threadIdx.x == 0) {
        partials[blockIdx.x] = s;
    }
}

static __global__ void sumsq_final_kernel(double *out, const double *partials, int accumulate)
{
    double s = 0.0;
    for (int i = threadIdx.x; i < KN_CUDA_SUMSQ_PARTIALS; i += SUMSQ_THREADS) {
        s += partials[i];
    }
    s = block_sum_d(s);
    if (threadIdx.x == 0) {
        *out = accumulate ? *out + s : s;
    }
}

extern "C" int kn_cuda_sumsq(double *out, double *scratch, const float *x, size_t n, int accumulate,
                             kn_stream_t stream)
{
    sumsq_partial_kernel<<<KN_CUDA_SUMSQ_PARTIALS, SUMSQ_THREADS, 0, stream>>>(scratch, x, n);
    int rc = kn_cu_launched();
    if (rc == 0) {
        sumsq_final_kernel<<<1, SUMSQ_THREADS, 0, stream>>>(out, scratch, accumulate);
        rc = kn_cu_launched();
    }
    return rc;
}

static __global__ void loss_acc_kernel(double *acc, const float *losses, size_t n)
{
    double s = 0.0;
    for (size_t i = threadIdx.x; i < n; i += SUMSQ_THREADS) {
        s += (double)losses[i];
    }
    s = block_sum_d(s);
    if (threadIdx.x == 0) {
        *acc += (double)(float)(s / (double)n);
    }
}

extern "C" int kn_cuda_loss_acc(double *acc, const float *losses, size_t n, kn_stream_t stream)
{
    loss_acc_kernel<<<1, SUMSQ_THREADS, 0, stream>>>(acc, losses, n);
    return kn_cu_launched();
}
