/* bf16 mixed precision on the GPU (kernels/cuda.h): the casts, and the matmul's GEMMs
 * on bf16 operands with fp32 accumulation and an fp32 result through cuBLASLt (A and B
 * CUDA_R_16BF, C and D CUDA_R_32F, CUBLAS_COMPUTE_32F), the arithmetic the CPU emulation
 * (workerd/engine/backend_bf16.h) rounds at. The operands arrive as fp32 tensors holding
 * bf16 values (the emulation's layout); each GEMM casts them into the context's bf16
 * scratch (exactly: they are bf16 values already) and multiplies there.
 *
 * Unrun so far (no GPU was lent when it was written): tests/gpu/check.sh runs it against the
 * emulation. */
#include <cuda_bf16.h>

#include "kernels/cuda/common.cuh"

static __global__ void round_kernel(float *dst, const float *src, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        dst[i] = __bfloat162float(__float2bfloat16_rn(src[i]));
    }
}

/* fp32 -> bf16 rounds to nearest even; bf16 -> fp32 is exact (the type of dst picks) */
static __device__ __nv_bfloat16 convert(float x, const __nv_bfloat16 *)
{
    return __float2bfloat16_rn(x);
}

static __device__ float convert(__nv_bfloat16 x, const float *)
{
    return __bfloat162float(x);
}

template <typename D, typename S> static __global__ void cast_kernel(D *dst, const S *src, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        dst[i] = convert(src[i], dst);
    }
}

extern "C" int kn_cuda_bf16_round(float *dst, const float *src, size_t n, kn_stream_t stream)
{
    if (n == 0) {
        return 0;
    }
    round_kernel<<<kn_cu_blocks(n, 256), 256, 0, stream>>>(dst, src, n);
    return kn_cu_launched();
}

extern "C" int kn_cuda_bf16_pack(uint16_t *dst, const float *src, size_t n, kn_stream_t stream)
{
    if (n == 0) {
        return 0;
    }
    cast_kernel<<<kn_cu_blocks(n, 256), 256, 0, stream>>>((__nv_bfloat16 *)dst, src, n);
    return kn_cu_launched();
}

extern "C" int kn_cuda_bf16_unpack(float *dst, const uint16_t *src, size_t n, kn_stream_t stream)
{
    if (n == 0) {
        return 0;
    }
    cast_kernel<<<kn_cu_blocks(n, 256), 256, 0, stream>>>(dst, (const __nv_bfloat16 *)src, n);
    return kn_cu_launched();
}

extern "C" void kn_cuda_set_bf16(kn_cuda_t *ctx, int bf16)
{
    ctx->bf16 = bf16 != 0;
}

/* ctx->half holds at least n bf16 elements. Growing waits for the device (the old buffer may
 * be in use by queued GEMMs): a backend's first steps grow it to the largest operands once. */
static int scratch_reserve(kn_cuda_t *ctx, cudaStream_t stream, size_t n)
{
    if (n <= ctx->half_cap) {
        return 0;
    }
    int rc = kn_cu_err(cudaStreamSynchronize(stream));
    if (rc == 0) {
        rc = kn_cu_err(cudaFree(ctx->half));
    }
    ctx->half = NULL;
    ctx->half_cap = 0;
    if (rc == 0) {
        rc = kn_cu_err(cudaMalloc(&ctx->half, n * sizeof(__nv_bfloat16)));
    }
    if (rc < 0) {
        ctx->half = NULL;
        return rc;
    }
    ctx->half_cap = n;
    return 0;
}

/* The cuBLASLt call of a bf16 GEMM: C = alpha op(A) op(B) + beta C, A [a_rows, a_cols] and
 * B [b_rows, b_cols] column-major bf16, C [m, n] fp32. */
static int lt_gemm_bf16(kn_cuda_t *ctx, cudaStream_t stream, cublasOperation_t ta,
                        cublasOperation_t tb, int m, int n, int k, const __nv_bfloat16 *A, int lda,
                        const __nv_bfloat16 *B, int ldb, float beta, float *C, int ldc)
{
    cublasLtMatmulDesc_t desc = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t heur;
    int found = 0;
    size_t ws = KN_CU_WORKSPACE;
    const float alpha = 1.0f;
    cublasStatus_t s = cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    if (s == CUBLAS_STATUS_SUCCESS) {
        s = cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
    }
    if (s == CUBLAS_STATUS_SUCCESS) {
        s = cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
    }
    if (s == CUBLAS_STATUS_SUCCESS) {
        s = cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, ta == CUBLAS_OP_N ? m : k,
                                       ta == CUBLAS_OP_N ? k : m, lda);
    }
    if (s == CUBLAS_STATUS_SUCCESS) {
        s = cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, tb == CUBLAS_OP_N ? k : n,
                                       tb == CUBLAS_OP_N ? n : k, ldb);
    }
    if (s == CUBLAS_STATUS_SUCCESS) {
        s = cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, m, n, ldc);
    }
    if (s == CUBLAS_STATUS_SUCCESS) {
        s = cublasLtMatmulPreferenceCreate(&pref);
    }
    if (s == CUBLAS_STATUS_SUCCESS) {
        s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                 &ws, sizeof ws);
    }
    if (s == CUBLAS_STATUS_SUCCESS) {
        s = cublasLtMatmulAlgoGetHeuristic(ctx->lt, desc, la, lb, lc, lc, pref, 1, &heur, &found);
    }
    if (s == CUBLAS_STATUS_SUCCESS && found == 0) {
        s = CUBLAS_STATUS_NOT_SUPPORTED;
    }
    if (s == CUBLAS_STATUS_SUCCESS) {
        s = cublasLtMatmul(ctx->lt, desc, &alpha, A, la, B, lb, &beta, C, lc, C, lc, &heur.algo,
                           ctx->workspace, ws, stream);
    }
    if (pref != NULL) {
        cublasLtMatmulPreferenceDestroy(pref);
    }
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
    return kn_cu_blas_err(ctx, s, "cuBLASLt bf16 GEMM");
}

int kn_cu_gemm_bf16(kn_cuda_t *ctx, cudaStream_t stream, cublasOperation_t ta, cublasOperation_t tb,
                    int m, int n, int k, const float *A, int lda, const float *B, int ldb,
                    float beta, float *C, int ldc)
{
    /* the operands' stored extents: lda x (columns of A as stored), the same for B */
    size_t na = (size_t)lda * (size_t)(ta == CUBLAS_OP_N ? k : m);
    size_t nb = (size_t)ldb * (size_t)(tb == CUBLAS_OP_N ? n : k);
    int rc = scratch_reserve(ctx, stream, na + nb);
    if (rc < 0) {
        return rc;
    }
    __nv_bfloat16 *a = (__nv_bfloat16 *)ctx->half, *b = a + na;
    cast_kernel<<<kn_cu_blocks(na, 256), 256, 0, stream>>>(a, A, na);
    cast_kernel<<<kn_cu_blocks(nb, 256), 256, 0, stream>>>(b, B, nb);
    if ((rc = kn_cu_launched()) < 0) {
        return rc;
    }
    return lt_gemm_bf16(ctx, stream, ta, tb, m, n, k, a, lda, b, ldb, beta, C, ldc);
}
