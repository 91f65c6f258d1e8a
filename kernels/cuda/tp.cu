/* Vocab-parallel cross-entropy (kernels/tp.h): this rank's slice of the logits [N,Vl], the
 * per-row parts around the TP group's all-reduces. One block per row for the reductions
 * (no atomics: a fixed tree, the same bits run to run), one thread per element for the
 * rest. Every arithmetic step is an explicitly rounded intrinsic (__fadd_rn, __dsub_rn...),
 * so nvcc contracts nothing into an FMA the CPU loop does not have:
 *   max     bit-identical to the CPU (a max is exact in any order);
 *   sums    the same double terms, summed in a tree instead of column order, then rounded
 *           to float: equal, or 1 ulp apart when the double sum sits at a float rounding
 *           boundary; the target's logit exact;
 *   finish  logf within CUDA's 1 ulp of glibc's;
 *   bwd     expf within CUDA's 2 ulp of glibc's, then the CPU's rounded multiply and
 *           subtract; padded columns exactly 0. */
#include <math.h>

#include "kernels/cuda/common.cuh"

#define TP_THREADS 256

/* the CPU loop's max step (NaN never replaces a number) */
static __device__ __forceinline__ float max_step(float v, float x)
{
    return x > v ? x : v;
}

static __global__ void tp_xent_max_kernel(float *mx, const float *logits, int Vl, int valid)
{
    __shared__ float part[TP_THREADS / 32];
    const float *row = logits + (size_t)blockIdx.x * Vl;
    float v = -INFINITY;
    for (int j = threadIdx.x; j < valid; j += TP_THREADS) {
        v = max_step(v, row[j]);
    }
    for (int o = 16; o > 0; o >>= 1) {
        v = max_step(v, __shfl_xor_sync(0xffffffffu, v, o));
    }
    if (threadIdx.x % 32 == 0) {
        part[threadIdx.x / 32] = v;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        float r = part[0];
        for (int w = 1; w < TP_THREADS / 32; w++) {
            r = max_step(r, part[w]);
        }
        mx[blockIdx.x] = r;
    }
}

static __global__ void tp_xent_sums_kernel(float *sum, float *tl, const float *logits,
                                           const float *mx, const int32_t *targets, int v0, int Vl,
                                           int valid)
{
    __shared__ double part[TP_THREADS / 32];
    const float *row = logits + (size_t)blockIdx.x * Vl;
    double m = (double)mx[blockIdx.x], acc = 0.0;
    for (int j = threadIdx.x; j < valid; j += TP_THREADS) {
        acc = __dadd_rn(acc, exp(__dsub_rn((double)row[j], m)));
    }
    for (int o = 16; o > 0; o >>= 1) {
        acc = __dadd_rn(acc, __shfl_xor_sync(0xffffffffu, acc, o));
    }
    if (threadIdx.x % 32 == 0) {
        part[threadIdx.x / 32] = acc;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        double r = part[0];
        for (int w = 1; w < TP_THREADS / 32; w++) {
            r = __dadd_rn(r, part[w]);
        }
        long t = (long)targets[blockIdx.x] - v0;
        sum[blockIdx.x] = (float)r;
        tl[blockIdx.x] = t >= 0 && t < valid ? row[t] : 0.0f;
    }
}

static __global__ void tp_xent_finish_kernel(float *lse, float *losses, const float *mx,
                                             const float *sum, const float *tl, int N)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N) {
        return;
    }
    float l = __fadd_rn(mx[i], logf(sum[i]));
    lse[i] = l;
    losses[i] = __fsub_rn(l, tl[i]);
}

static __global__ void tp_xent_bwd_kernel(float *logits, const float *lse, const int32_t *targets,
                                          float scale, int v0, int Vl, int valid, size_t total)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) {
        return;
    }
    size_t n = i / Vl;
    int j = (int)(i % Vl);
    if (j >= valid) {
        logits[i] = 0.0f;
        return;
    }
    float d = __fmul_rn(expf(__fsub_rn(logits[i], lse[n])), scale);
    long t = (long)targets[n] - v0;
    logits[i] = t == j ? __fsub_rn(d, scale) : d;
}

static int check_shape(int N, int Vl, int valid)
{
    return N > 0 && Vl > 0 && valid >= 0 && valid <= Vl ? 0 : -EINVAL;
}

extern "C" int kn_cuda_tp_xent_max(float *mx, const float *logits, int N, int Vl, int valid,
                                   kn_stream_t stream)
{
    int rc = check_shape(N, Vl, valid);
    if (rc < 0) {
        return rc;
    }
    tp_xent_max_kernel<<<N, TP_THREADS, 0, stream>>>(mx, logits, Vl, valid);
    return kn_cu_launched();
}

extern "C" int kn_cuda_tp_xent_sums(float *sum, float *tl, const float *logits, const float *mx,
                                    const int32_t *targets, int v0, int N, int Vl, int valid,
                                    kn_stream_t stream)
{
    int rc = check_shape(N, Vl, valid);
    if (rc < 0) {
        return rc;
    }
    tp_xent_sums_kernel<<<N, TP_THREADS, 0, stream>>>(sum, tl, logits, mx, targets, v0, Vl, valid);
    return kn_cu_launched();
}

extern "C" int kn_cuda_tp_xent_finish(float *lse, float *losses, const float *mx, const float *sum,
                                      const float *tl, int N, kn_stream_t stream)
{
    if (N <= 0) {
        return -EINVAL;
    }
    tp_xent_finish_kernel<<<kn_cu_blocks((size_t)N, 256), 256, 0, stream>>>(lse, losses, mx, sum,
                                                                            tl, N);
    return kn_cu_launched();
}

extern "C" int kn_cuda_tp_xent_bwd(float *logits, const float *lse, const int32_t *targets,
                                   float scale, int v0, int N, int Vl, int valid,
                                   kn_stream_t stream)
{
    int rc = check_shape(N, Vl, valid);
    if (rc < 0) {
        return rc;
    }
    size_t total = (size_t)N * Vl;
    tp_xent_bwd_kernel<<<kn_cu_blocks(total, 256), 256, 0, stream>>>(logits, lse, targets, scale,
                                                                     v0, Vl, valid, total);
    return kn_cu_launched();
}
