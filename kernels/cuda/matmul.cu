/* Linear layer in Hugging Face Conv1D layout (kernels/matmul.h) on cuBLAS.
 *
 * cuBLAS is column-major; a row-major [R,K] matrix is a column-major [K,R] one. So
 *   out[N,OC] = inp[N,C] @ W[C,OC]          is  out' (OC x N) = W' (OC x C) @ inp' (C x N)
 *   dinp[N,C] = dout[N,OC] @ W^T            is  dinp' (C x N) = (W')^T @ dout'
 *   dW[C,OC] += inp^T @ dout                is  dW' (OC x C) += dout' @ (inp')^T
 * where X' is X read column-major. The forward fuses the bias into the GEMM with cuBLASLt's
 * bias epilogue, planned once per shape, precision and pointer alignment (descriptor,
 * layouts and the heuristic's algorithm cached in the context); if cuBLASLt offers no
 * algorithm (an unaligned bias, say) or refuses to run it, it seeds out with the bias and
 * lets a plain GEMM add onto it. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "kernels/cuda/common.cuh"

static __global__ void bias_rows_kernel(float *out, const float *bias, int N, int OC)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < (size_t)N * OC) {
        out[i] = bias[i % OC];
    }
}

static void plan_release(kn_cu_lt_plan_t *p)
{
    kn_cu_lt_destroy(p->desc, p->la, p->lb, p->lc);
    memset(p, 0, sizeof *p);
}

void kn_cu_lt_plans_free(kn_cuda_t *ctx)
{
    for (int i = 0; i < ctx->nplans; i++) {
        plan_release(&ctx->plans[i]);
    }
    ctx->nplans = 0;
}

/* the alignment (16, 8 or 4 bytes) every one of the call's pointers has */
static int common_alignment(const void *a, const void *b, const void *c, const void *d)
{
    uintptr_t u = (uintptr_t)a | (uintptr_t)b | (uintptr_t)c | (uintptr_t)d;
    return u % 16 == 0 ? 16 : u % 8 == 0 ? 8 : 4;
}

/* Descriptor, layouts and the heuristic's best algorithm for out' = W' @ inp' + bias at
 * this shape, with the pointers' alignment stated (the heuristic may then pick kernels that
 * need it). p->usable = 0 when cuBLASLt offers none. */
static int plan_build(kn_cuda_t *ctx, kn_cu_lt_plan_t *p)
{
    cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    cublasComputeType_t compute = p->tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    cublasStatus_t s = cublasLtMatmulDescCreate(&p->desc, compute, CUDA_R_32F);
    if (s == CUBLAS_STATUS_SUCCESS) {
        s = cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi,
                                           sizeof epi);
    }
    if (s == CUBLAS_STATUS_SUCCESS) {
        s = cublasLtMatrixLayoutCreate(&p->la, CUDA_R_32F, p->OC, p->C, p->OC);
    }
    if (s == CUBLAS_STATUS_SUCCESS) {
        s = cublasLtMatrixLayoutCreate(&p->lb, CUDA_R_32F, p->C, p->N, p->C);
    }
    if (s == CUBLAS_STATUS_SUCCESS) {
        s = cublasLtMatrixLayoutCreate(&p->lc, CUDA_R_32F, p->OC, p->N, p->OC);
    }
    return kn_cu_lt_choose(ctx, s, p->desc, p->la, p->lb, p->lc, p->align, &p->algo, &p->usable,
                           "cuBLASLt plan");
}

/* The plan for this call: cached (the first KN_CU_LT_PLANS shapes), NULL when the cache is
 * full (the caller falls back). */
static kn_cu_lt_plan_t *plan_for(kn_cuda_t *ctx, int N, int C, int OC, int align, int *rc)
{
    *rc = 0;
    for (int i = 0; i < ctx->nplans; i++) {
        kn_cu_lt_plan_t *p = &ctx->plans[i];
        if (p->N == N && p->C == C && p->OC == OC && p->tf32 == ctx->tf32 && p->align == align) {
            return p;
        }
    }
    if (ctx->nplans == KN_CU_LT_PLANS) {
        return NULL;
    }
    kn_cu_lt_plan_t *p = &ctx->plans[ctx->nplans];
    memset(p, 0, sizeof *p);
    p->N = N, p->C = C, p->OC = OC, p->tf32 = ctx->tf32, p->align = align;
    if ((*rc = plan_build(ctx, p)) < 0) {
        plan_release(p);
        return NULL;
    }
    ctx->nplans++;
    return p;
}

/* out' = W' @ inp' + bias through cuBLASLt's bias epilogue; *done = 0 when it has no
 * algorithm for the shape or refuses to run it: the caller computes the same without. */
static int lt_bias_gemm(kn_cuda_t *ctx, float *out, const float *inp, const float *weight,
                        const float *bias, int N, int C, int OC, cudaStream_t stream, int *done)
{
    const float one = 1.0f, zero = 0.0f;
    int rc = 0;
    *done = 0;
    kn_cu_lt_plan_t *p = plan_for(ctx, N, C, OC, common_alignment(out, inp, weight, bias), &rc);
    if (p == NULL || !p->usable) {
        return rc;
    }
    cublasStatus_t s = cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                      &bias, sizeof bias);
    if (s == CUBLAS_STATUS_SUCCESS) {
        s = cublasLtMatmul(ctx->lt, p->desc, &one, weight, p->la, inp, p->lb, &zero, out, p->lc,
                           out, p->lc, &p->algo, ctx->workspace, KN_CU_WORKSPACE, stream);
    }
    if (s == CUBLAS_STATUS_SUCCESS) {
        *done = 1;
        return 0;
    }
    /* refused: remembered, and this shape takes the plain GEMM from now on */
    snprintf(ctx->err, sizeof ctx->err, "cublasLtMatmul (N %d C %d OC %d): %s; plain GEMM", N, C,
             OC, cublasGetStatusString(s));
    p->usable = 0;
    return 0;
}

/* One GEMM of a matmul (alpha 1): bf16 operands under kn_cuda_set_bf16, else fp32/TF32. */
static int gemm(kn_cuda_t *ctx, cudaStream_t stream, cublasOperation_t ta, cublasOperation_t tb,
                int m, int n, int k, const float *A, int lda, const float *B, int ldb, float beta,
                float *C, int ldc)
{
    if (ctx->bf16) {
        return kn_cu_gemm_bf16(ctx, stream, ta, tb, m, n, k, A, lda, B, ldb, beta, C, ldc);
    }
    return kn_cu_gemm(ctx, stream, ta, tb, m, n, k, 1.0f, A, lda, 0, B, ldb, 0, beta, C, ldc, 0, 1);
}

extern "C" int kn_cuda_matmul_fwd(kn_cuda_t *ctx, float *out, const float *inp, const float *weight,
                                  const float *bias, int N, int C, int OC, kn_stream_t stream)
{
    if (N <= 0 || C <= 0 || OC <= 0) {
        return -EINVAL;
    }
    float beta = 0.0f;
    if (bias != NULL) {
        /* fp32/TF32: cuBLASLt's bias epilogue when it has one for the shape; bf16 operands
         * (and the fallback): out = the bias rows, then the GEMM adds into them */
        int done = 0, rc = 0;
        if (!ctx->bf16) {
            rc = lt_bias_gemm(ctx, out, inp, weight, bias, N, C, OC, stream, &done);
        }
        if (rc < 0 || done) {
            return rc;
        }
        bias_rows_kernel<<<kn_cu_blocks((size_t)N * OC, 256), 256, 0, stream>>>(out, bias, N, OC);
        if ((rc = kn_cu_launched()) < 0) {
            return rc;
        }
        beta = 1.0f;
    }
    return gemm(ctx, stream, CUBLAS_OP_N, CUBLAS_OP_N, OC, N, C, weight, OC, inp, C, beta, out, OC);
}

extern "C" int kn_cuda_matmul_bwd(kn_cuda_t *ctx, float *dinp, float *dweight, float *dbias,
                                  const float *dout, const float *inp, const float *weight, int N,
                                  int C, int OC, kn_stream_t stream)
{
    if (N <= 0 || C <= 0 || OC <= 0) {
        return -EINVAL;
    }
    /* a split backward (ZB-H1) asks for one half: the input pass passes NULL dweight and
     * dbias (inp unread), the weight pass NULL dinp (weight unread, may be NULL); each GEMM
     * is the one the whole backward runs, so the halves give its bits */
    int rc = 0;
    if (dinp != NULL) {
        rc = gemm(ctx, stream, CUBLAS_OP_T, CUBLAS_OP_N, C, N, OC, weight, OC, dout, OC, 0.0f, dinp,
                  C);
    }
    if (rc == 0 && dweight != NULL) {
        rc = gemm(ctx, stream, CUBLAS_OP_N, CUBLAS_OP_T, OC, C, N, dout, OC, inp, C, 1.0f, dweight,
                  OC);
    }
    if (rc == 0 && dbias != NULL) {
        rc = kn_cu_colsum_acc(ctx, stream, dbias, dout, OC, N, OC);
    }
    return rc;
}
