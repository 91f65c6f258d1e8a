/* LM head (tied to wte) fused with softmax cross-entropy over the V real columns
 * (kernels/xent.h), and llm.c's fused classifier. cuBLAS makes the logits, one block per row
 * makes lse and the loss and/or turns the row into dlogits in place, and two GEMMs over the
 * real vocab make dx and dwte. Column-major views (X' is row-major X read column-major):
 *   logits' (Vp x N) = wte'^T (Vp x C) x'            (wte' is C x Vp, ld C)
 *   dx'     (C x N)  = wte'[:, :V] dlogits'[:V, :]   (dlogits' ld Vp)
 *   dwte'   (C x V) += x' dlogits'[:V, :]^T */
#include <math.h>

#include "kernels/cuda/common.cuh"

#define XENT_THREADS 512

/* block-wide max or sum (fixed order), the result in every thread */
static __device__ float block_reduce(float v, int is_max)
{
    __shared__ float part[XENT_THREADS / 32];
    __shared__ float result;
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    v = is_max ? kn_warp_max(v) : kn_warp_sum(v);
    if (lane == 0) {
        part[warp] = v;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        float r = part[0];
        for (int w = 1; w < XENT_THREADS / 32; w++) {
            r = is_max ? fmaxf(r, part[w]) : r + part[w];
        }
        result = r;
    }
    __syncthreads();
    float r = result;
    __syncthreads(); /* result and part are reused by the next call */
    return r;
}

static __device__ float row_lse(const float *row, int V)
{
    float mx = -INFINITY;
    for (int v = threadIdx.x; v < V; v += XENT_THREADS) {
        mx = fmaxf(mx, row[v]);
    }
    mx = block_reduce(mx, 1);
    float s = 0.0f;
    for (int v = threadIdx.x; v < V; v += XENT_THREADS) {
        s += expf(row[v] - mx);
    }
    return mx + logf(block_reduce(s, 0));
}

/* row <- scale * (softmax - onehot(target)) over the V real columns */
static __device__ void row_dlogits(float *row, float lse, int target, float scale, int V)
{
    for (int v = threadIdx.x; v < V; v += XENT_THREADS) {
        float d = expf(row[v] - lse) * scale;
        row[v] = v == target ? d - scale : d;
    }
}

/* grid N: lse and losses of each row; with dlogits != 0 also the row's dlogits */
static __global__ void xent_fwd_kernel(float *logits, float *lse, float *losses,
                                       const int32_t *targets, float scale, int V, int Vp,
                                       int dlogits)
{
    float *row = logits + (size_t)blockIdx.x * Vp;
    float l = row_lse(row, V);
    int target = targets != NULL ? targets[blockIdx.x] : -1;
    if (threadIdx.x == 0) {
        lse[blockIdx.x] = l;
        if (losses != NULL && target >= 0) {
            losses[blockIdx.x] = l - row[target];
        }
    }
    if (dlogits) {
        __syncthreads(); /* row[target] is read above before it is overwritten */
        row_dlogits(row, l, target, scale, V);
    }
}

static __global__ void xent_bwd_kernel(float *logits, const float *lse, const int32_t *targets,
                                       float scale, int V, int Vp)
{
    float *row = logits + (size_t)blockIdx.x * Vp;
    row_dlogits(row, lse[blockIdx.x], targets[blockIdx.x], scale, V);
}

static int check_shape(int N, int C, int V, int Vp)
{
    return N > 0 && C > 0 && V > 0 && Vp >= V ? 0 : -EINVAL;
}

/* Under kn_cuda_set_bf16 on TF32 tensor cores: x and wte then hold bf16 values (the bf16
 * wrapper rounds them), which TF32 represents exactly, so the products are exact and sum in
 * fp32, the fp32 GEMM's arithmetic. (The backward's GEMMs read dlogits, fp32 values TF32
 * would round: they stay fp32.) */
static int logits_gemm(kn_cuda_t *ctx, float *logits, const float *x, const float *wte, int N,
                       int C, int Vp, cudaStream_t stream)
{
    int tf32 = ctx->tf32;
    ctx->tf32 = tf32 || ctx->bf16;
    int rc = kn_cu_gemm(ctx, stream, CUBLAS_OP_T, CUBLAS_OP_N, Vp, N, C, 1.0f, wte, C, 0, x, C, 0,
                        0.0f, logits, Vp, 0, 1);
    ctx->tf32 = tf32;
    return rc;
}

/* dx = dlogits @ wte[:V] (overwritten); dwte[:V] = beta dwte + dlogits^T @ x (beta 1:
 * accumulate, 0: overwrite) */
/* dx NULL or dwte NULL: that GEMM skipped (a split backward's other half) */
static int backward_gemms(kn_cuda_t *ctx, float *dx, float *dwte, const float *dlogits,
                          const float *x, const float *wte, int N, int C, int V, int Vp, float beta,
                          cudaStream_t stream)
{
    int rc = dx ? kn_cu_gemm(ctx, stream, CUBLAS_OP_N, CUBLAS_OP_N, C, N, V, 1.0f, wte, C, 0,
                             dlogits, Vp, 0, 0.0f, dx, C, 0, 1)
                : 0;
    if (rc == 0 && dwte) {
        rc = kn_cu_gemm(ctx, stream, CUBLAS_OP_N, CUBLAS_OP_T, C, V, N, 1.0f, x, C, 0, dlogits, Vp,
                        0, beta, dwte, C, 0, 1);
    }
    return rc;
}

extern "C" int kn_cuda_lmhead_fwd(kn_cuda_t *ctx, float *logits, float *lse, float *losses,
                                  const float *x, const float *wte, const int32_t *targets, int N,
                                  int C, int V, int Vp, kn_stream_t stream)
{
    int rc = check_shape(N, C, V, Vp);
    if (rc == 0) {
        rc = logits_gemm(ctx, logits, x, wte, N, C, Vp, stream);
    }
    if (rc < 0 || lse == NULL) {
        return rc;
    }
    xent_fwd_kernel<<<N, XENT_THREADS, 0, stream>>>(logits, lse, losses, targets, 0.0f, V, Vp, 0);
    return kn_cu_launched();
}

extern "C" int kn_cuda_lmhead_bwd(kn_cuda_t *ctx, float *dx, float *dwte, float *logits,
                                  const float *lse, const float *x, const float *wte,
                                  const int32_t *targets, float scale, int N, int C, int V, int Vp,
                                  kn_stream_t stream)
{
    int rc = check_shape(N, C, V, Vp);
    if (rc < 0) {
        return rc;
    }
    if (dx) { /* dx NULL: the weight half, on the dlogits the input half left */
        xent_bwd_kernel<<<N, XENT_THREADS, 0, stream>>>(logits, lse, targets, scale, V, Vp);
        if ((rc = kn_cu_launched()) < 0) {
            return rc;
        }
    }
    return backward_gemms(ctx, dx, dwte, logits, x, wte, N, C, V, Vp, 1.0f, stream);
}

extern "C" int kn_cuda_lmhead_fused(kn_cuda_t *ctx, float *dx, float *dwte, float *logits,
                                    float *lse, float *losses, const float *x, const float *wte,
                                    const int32_t *targets, float scale, int N, int C, int V,
                                    int Vp, kn_stream_t stream)
{
    int rc = check_shape(N, C, V, Vp);
    if (rc == 0) {
        rc = logits_gemm(ctx, logits, x, wte, N, C, Vp, stream);
    }
    if (rc < 0) {
        return rc;
    }
    xent_fwd_kernel<<<N, XENT_THREADS, 0, stream>>>(logits, lse, losses, targets, scale, V, Vp, 1);
    if ((rc = kn_cu_launched()) < 0) {
        return rc;
    }
    return backward_gemms(ctx, dx, dwte, logits, x, wte, N, C, V, Vp, 1.0f, stream);
}

extern "C" int kn_cuda_lmhead_fwdbwd(kn_cuda_t *ctx, float *dx, float *dwte, float *logits,
                                     float *lse, float *losses, const float *x, const float *wte,
                                     const int32_t *targets, int acc, int N, int C, int V, int Vp,
                                     kn_stream_t stream)
{
    int rc = check_shape(N, C, V, Vp);
    if (rc == 0) {
        rc = logits_gemm(ctx, logits, x, wte, N, C, Vp, stream);
    }
    if (rc < 0) {
        return rc;
    }
    /* scale 1: d * 1.0f and d - 1.0f, the unscaled gradient */
    xent_fwd_kernel<<<N, XENT_THREADS, 0, stream>>>(logits, lse, losses, targets, 1.0f, V, Vp, 1);
    if ((rc = kn_cu_launched()) < 0) {
        return rc;
    }
    return backward_gemms(ctx, dx, dwte, logits, x, wte, N, C, V, Vp, acc ? 1.0f : 0.0f, stream);
}
