/* The cuBLAS context, the error conversions and the GEMM helpers (kernels/cuda.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernels/cuda/common.cuh"

// ----------------------------------------------------------------------------
// errors

int kn_cu_err(cudaError_t e)
{
    if (e == cudaSuccess) {
        return 0;
    }
    if (e == cudaErrorMemoryAllocation) {
        return -ENOMEM;
    }
    if (e == cudaErrorInvalidValue || e == cudaErrorInvalidConfiguration) {
        return -EINVAL;
    }
    return KN_E_CUDA;
}

int kn_cu_blas_err(kn_cuda_t *ctx, cublasStatus_t s, const char *what)
{
    if (s == CUBLAS_STATUS_SUCCESS) {
        return 0;
    }
    snprintf(ctx->err, sizeof ctx->err, "%s: %s", what, cublasGetStatusString(s));
    if (s == CUBLAS_STATUS_ALLOC_FAILED) {
        return -ENOMEM;
    }
    if (s == CUBLAS_STATUS_INVALID_VALUE) {
        return -EINVAL;
    }
    return KN_E_CUDA;
}

extern "C" const char *kn_cuda_error_text(void)
{
    return cudaGetErrorString(cudaGetLastError());
}

extern "C" const char *kn_cuda_ctx_error(const kn_cuda_t *ctx)
{
    return ctx->err;
}

// ----------------------------------------------------------------------------
// context

extern "C" int kn_cuda_create(kn_cuda_t **out, int tf32)
{
    *out = NULL;
    kn_cuda_t *ctx = (kn_cuda_t *)calloc(1, sizeof *ctx);
    if (ctx == NULL) {
        return -ENOMEM;
    }
    ctx->tf32 = tf32 != 0;
    int rc = kn_cu_blas_err(ctx, cublasCreate(&ctx->blas), "cublasCreate");
    if (rc == 0) {
        rc = kn_cu_blas_err(ctx, cublasLtCreate(&ctx->lt), "cublasLtCreate");
    }
    if (rc == 0) {
        rc = kn_cu_err(cudaMalloc(&ctx->workspace, KN_CU_WORKSPACE));
    }
    if (rc == 0) {
        rc = kn_cu_blas_err(ctx, cublasSetWorkspace(ctx->blas, ctx->workspace, KN_CU_WORKSPACE),
                            "cublasSetWorkspace");
    }
    if (rc < 0) {
        kn_cuda_destroy(ctx);
        return rc;
    }
    *out = ctx;
    return 0;
}

extern "C" void kn_cuda_destroy(kn_cuda_t *ctx)
{
    if (ctx == NULL) {
        return;
    }
    kn_cu_lt_plans_free(ctx);
    kn_cu_bf16_plans_free(ctx);
    if (ctx->lt != NULL) {
        cublasLtDestroy(ctx->lt);
    }
    if (ctx->blas != NULL) {
        cublasDestroy(ctx->blas);
    }
    cudaFree(ctx->ones);
    cudaFree(ctx->half);
    cudaFree(ctx->workspace);
    free(ctx);
}

extern "C" void kn_cuda_set_tf32(kn_cuda_t *ctx, int tf32)
{
    ctx->tf32 = tf32 != 0;
}

// ----------------------------------------------------------------------------
// GEMM helpers

int kn_cu_bind(kn_cuda_t *ctx, cudaStream_t stream)
{
    if (ctx->bound_set && ctx->bound == stream) {
        return 0;
    }
    int rc = kn_cu_blas_err(ctx, cublasSetStream(ctx->blas, stream), "cublasSetStream");
    if (rc == 0) {
        rc = kn_cu_blas_err(ctx, cublasSetWorkspace(ctx->blas, ctx->workspace, KN_CU_WORKSPACE),
                            "cublasSetWorkspace");
    }
    ctx->bound = stream;
    ctx->bound_set = rc == 0;
    return rc;
}

int kn_cu_gemm(kn_cuda_t *ctx, cudaStream_t stream, cublasOperation_t ta, cublasOperation_t tb,
               int m, int n, int k, float alpha, const float *A, int lda, long long sA,
               const float *B, int ldb, long long sB, float beta, float *C, int ldc, long long sC,
               int batch)
{
    cublasComputeType_t compute = ctx->tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    int rc = kn_cu_bind(ctx, stream);
    if (rc < 0) {
        return rc;
    }
    if (batch == 1) {
        return kn_cu_blas_err(ctx,
                              cublasGemmEx(ctx->blas, ta, tb, m, n, k, &alpha, A, CUDA_R_32F, lda,
                                           B, CUDA_R_32F, ldb, &beta, C, CUDA_R_32F, ldc, compute,
                                           CUBLAS_GEMM_DEFAULT),
                              "cublasGemmEx");
    }
    return kn_cu_blas_err(ctx,
                          cublasGemmStridedBatchedEx(ctx->blas, ta, tb, m, n, k, &alpha, A,
                                                     CUDA_R_32F, lda, sA, B, CUDA_R_32F, ldb, sB,
                                                     &beta, C, CUDA_R_32F, ldc, sC, batch, compute,
                                                     CUBLAS_GEMM_DEFAULT),
                          "cublasGemmStridedBatchedEx");
}

void kn_cu_lt_destroy(cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t la,
                      cublasLtMatrixLayout_t lb, cublasLtMatrixLayout_t lc)
{
    if (lc != NULL) {
        cublasLtMatrixLayoutDestroy(lc);
    }
    if (lb != NULL) {
        cublasLtMatrixLayoutDestroy(lb);
    }
    if (la != NULL) {
        cublasLtMatrixLayoutDestroy(la);
    }
    if (desc != NULL) {
        cublasLtMatmulDescDestroy(desc);
    }
}

int kn_cu_lt_choose(kn_cuda_t *ctx, cublasStatus_t s, cublasLtMatmulDesc_t desc,
                    cublasLtMatrixLayout_t la, cublasLtMatrixLayout_t lb, cublasLtMatrixLayout_t lc,
                    int align, cublasLtMatmulAlgo_t *algo, int *usable, const char *what)
{
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t heur;
    size_t ws = KN_CU_WORKSPACE;
    uint32_t a = (uint32_t)align;
    int found = 0;
    if (s == CUBLAS_STATUS_SUCCESS) {
        s = cublasLtMatmulPreferenceCreate(&pref);
    }
    const cublasLtMatmulPreferenceAttributes_t aligns[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4 && s == CUBLAS_STATUS_SUCCESS; i++) {
        s = cublasLtMatmulPreferenceSetAttribute(pref, aligns[i], &a, sizeof a);
    }
    if (s == CUBLAS_STATUS_SUCCESS) {
        s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                 &ws, sizeof ws);
    }
    if (s == CUBLAS_STATUS_SUCCESS) {
        s = cublasLtMatmulAlgoGetHeuristic(ctx->lt, desc, la, lb, lc, lc, pref, 1, &heur, &found);
    }
    if (pref != NULL) {
        cublasLtMatmulPreferenceDestroy(pref);
    }
    if (s == CUBLAS_STATUS_ALLOC_FAILED) {
        return kn_cu_blas_err(ctx, s, what);
    }
    /* any other refusal only means: no cuBLASLt algorithm at this shape */
    *usable = s == CUBLAS_STATUS_SUCCESS && found > 0;
    if (*usable) {
        *algo = heur.algo;
    }
    return 0;
}

static __global__ void fill_kernel(float *x, float v, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        x[i] = v;
    }
}

/* Grows ctx->ones to n. Freeing the old vector waits for the device: a backend reserves the
 * largest row count before the first step (kn_cuda_reserve_rows), so steps do not grow it. */
static int ones_reserve(kn_cuda_t *ctx, cudaStream_t stream, size_t n)
{
    if (n <= ctx->ones_cap) {
        return 0;
    }
    int rc = kn_cu_err(cudaFree(ctx->ones));
    ctx->ones = NULL;
    ctx->ones_cap = 0;
    if (rc == 0) {
        rc = kn_cu_err(cudaMalloc(&ctx->ones, n * sizeof(float)));
    }
    if (rc < 0) {
        ctx->ones = NULL;
        return rc;
    }
    fill_kernel<<<kn_cu_blocks(n, 256), 256, 0, stream>>>(ctx->ones, 1.0f, n);
    rc = kn_cu_launched();
    if (rc == 0) {
        ctx->ones_cap = n;
    }
    return rc;
}

extern "C" int kn_cuda_reserve_rows(kn_cuda_t *ctx, size_t rows, kn_stream_t stream)
{
    return ones_reserve(ctx, stream, rows);
}

int kn_cu_colsum_acc(kn_cuda_t *ctx, cudaStream_t stream, float *y, const float *A, int m, int n,
                     int lda)
{
    // GEMV in plain fp32 (cuBLAS has no TF32 GEMV), deterministic (no atomics by default)
    int rc = ones_reserve(ctx, stream, (size_t)n);
    if (rc == 0) {
        rc = kn_cu_bind(ctx, stream);
    }
    if (rc < 0) {
        return rc;
    }
    const float one = 1.0f;
    return kn_cu_blas_err(
        ctx, cublasSgemv(ctx->blas, CUBLAS_OP_N, m, n, &one, A, lda, ctx->ones, 1, &one, y, 1),
        "cublasSgemv");
}
