/* Causal multi-head attention, materialised (kernels/attention.h's contract): the CPU fast
 * version's algorithm on cuBLAS batched GEMMs, one batch of NH heads per b.
 *
 * For one (b, h), Q, K, V are [T,hs] row-major with row stride 3C (so column-major [hs,T]
 * with ld 3C), S/P/dP are [T,T] row-major (column-major S^T, ld T), Y/dY [T,hs] with ld C:
 *   S^T  = scale K'^T Q'        dP^T = V'^T dY'      (m = n = T, k = hs)
 *   Y'   = V' P^T               dQ'  = K' dS^T       (m = hs, n = k = T)
 *   dV'  = dY' (P^T)^T          dK'  = Q' (dS^T)^T
 * The softmax kernels own the causal mask: entries above the diagonal become zero, so the
 * full-square GEMMs that follow add nothing from them. */
#include <math.h>

#include "kernels/cuda/common.cuh"

#define SM_WARPS 4

/* rows [B*NH*T] of att, scores in, probabilities out; row r is query t = r % T */
static __global__ void softmax_fwd_kernel(float *att, int T, size_t rows)
{
    int lane = threadIdx.x % 32;
    size_t r = (size_t)blockIdx.x * SM_WARPS + threadIdx.x / 32;
    if (r >= rows) {
        return;
    }
    int t = (int)(r % T);
    float *p = att + r * T;
    float mx = -INFINITY;
    for (int i = lane; i <= t; i += 32) {
        mx = fmaxf(mx, p[i]);
    }
    mx = kn_warp_max(mx);
    float sum = 0.0f;
    for (int i = lane; i <= t; i += 32) {
        float e = expf(p[i] - mx);
        p[i] = e;
        sum += e;
    }
    float inv = 1.0f / kn_warp_sum(sum);
    for (int i = lane; i < T; i += 32) {
        p[i] = i <= t ? p[i] * inv : 0.0f;
    }
}

/* rows [NH*T] for one b: dp (in scratch) becomes ds = p (dp - sum(p dp)) scale */
static __global__ void softmax_bwd_kernel(float *dp, const float *att, int T, size_t rows,
                                          float scale)
{
    int lane = threadIdx.x % 32;
    size_t r = (size_t)blockIdx.x * SM_WARPS + threadIdx.x / 32;
    if (r >= rows) {
        return;
    }
    int t = (int)(r % T);
    float *d = dp + r * T;
    const float *p = att + r * T;
    float s = 0.0f;
    for (int i = lane; i <= t; i += 32) {
        s += p[i] * d[i];
    }
    s = kn_warp_sum(s);
    for (int i = lane; i < T; i += 32) {
        d[i] = i <= t ? p[i] * (d[i] - s) * scale : 0.0f;
    }
}

static int check_shape(int B, int T, int C, int NH)
{
    return B > 0 && T > 0 && C > 0 && NH > 0 && C % NH == 0 ? 0 : -EINVAL;
}

/* One GEMM per b (a batch of NH heads) and one softmax over all rows: a call per b
 * (B = 1, as the recomputing backward makes) has the same bits, each row being its own. */
extern "C" int kn_cuda_attention_probs(kn_cuda_t *ctx, float *att, const float *qkv, int B, int T,
                                       int C, int NH, kn_stream_t stream)
{
    int rc = check_shape(B, T, C, NH);
    int hs = C / NH, C3 = 3 * C;
    long long TT = (long long)T * T;
    float scale = 1.0f / sqrtf((float)hs);
    for (int b = 0; b < B && rc == 0; b++) {
        const float *q = qkv + (size_t)b * T * C3, *k = q + C;
        rc = kn_cu_gemm(ctx, stream, CUBLAS_OP_T, CUBLAS_OP_N, T, T, hs, scale, k, C3, hs, q, C3,
                        hs, 0.0f, att + (size_t)b * NH * TT, T, TT, NH);
    }
    if (rc < 0) {
        return rc;
    }
    size_t rows = (size_t)B * NH * T;
    softmax_fwd_kernel<<<kn_cu_blocks(rows, SM_WARPS), 32 * SM_WARPS, 0, stream>>>(att, T, rows);
    return kn_cu_launched();
}

extern "C" int kn_cuda_attention_fwd(kn_cuda_t *ctx, float *out, float *att, const float *qkv,
                                     int B, int T, int C, int NH, kn_stream_t stream)
{
    int rc = kn_cuda_attention_probs(ctx, att, qkv, B, T, C, NH, stream);
    int hs = rc == 0 ? C / NH : 1, C3 = 3 * C;
    long long TT = (long long)T * T;
    for (int b = 0; b < B && rc == 0; b++) {
        const float *v = qkv + (size_t)b * T * C3 + 2 * C;
        rc = kn_cu_gemm(ctx, stream, CUBLAS_OP_N, CUBLAS_OP_N, hs, T, T, 1.0f, v, C3, hs,
                        att + (size_t)b * NH * TT, T, TT, 0.0f, out + (size_t)b * T * C, C, hs, NH);
    }
    return rc;
}

extern "C" int kn_cuda_attention_bwd(kn_cuda_t *ctx, float *dqkv, float *scratch, const float *dout,
                                     const float *qkv, const float *att, int B, int T, int C,
                                     int NH, kn_stream_t stream)
{
    int rc = check_shape(B, T, C, NH);
    int hs = C / NH, C3 = 3 * C;
    long long TT = (long long)T * T;
    float scale = 1.0f / sqrtf((float)hs);
    size_t rows = (size_t)NH * T;
    for (int b = 0; b < B && rc == 0; b++) {
        const float *q = qkv + (size_t)b * T * C3, *k = q + C, *v = q + 2 * C;
        float *dq = dqkv + (size_t)b * T * C3, *dk = dq + C, *dv = dq + 2 * C;
        const float *p = att + (size_t)b * NH * TT;
        const float *dy = dout + (size_t)b * T * C;
        // dP into scratch, dV = P^T dY
        rc = kn_cu_gemm(ctx, stream, CUBLAS_OP_T, CUBLAS_OP_N, T, T, hs, 1.0f, v, C3, hs, dy, C, hs,
                        0.0f, scratch, T, TT, NH);
        if (rc == 0) {
            rc = kn_cu_gemm(ctx, stream, CUBLAS_OP_N, CUBLAS_OP_T, hs, T, T, 1.0f, dy, C, hs, p, T,
                            TT, 0.0f, dv, C3, hs, NH);
        }
        if (rc == 0) {
            softmax_bwd_kernel<<<kn_cu_blocks(rows, SM_WARPS), 32 * SM_WARPS, 0, stream>>>(
                scratch, p, T, rows, scale);
            rc = kn_cu_launched();
        }
        // dQ = dS K, dK = dS^T Q
        if (rc == 0) {
            rc = kn_cu_gemm(ctx, stream, CUBLAS_OP_N, CUBLAS_OP_N, hs, T, T, 1.0f, k, C3, hs,
                            scratch, T, TT, 0.0f, dq, C3, hs, NH);
        }
        if (rc == 0) {
            rc = kn_cu_gemm(ctx, stream, CUBLAS_OP_N, CUBLAS_OP_T, hs, T, T, 1.0f, q, C3, hs,
                            scratch, T, TT, 0.0f, dk, C3, hs, NH);
        }
    }
    return rc;
}
