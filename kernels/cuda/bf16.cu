/* bf16 mixed precision on the GPU (kernels/cuda.h): the casts, and the matmul's GEMMs
 * on bf16 operands with fp32 accumulation and an fp32 result through cuBLASLt (A and B
 * CUDA_R_16BF, C and D CUDA_R_32F, CUBLAS_COMPUTE_32F), the arithmetic the CPU emulation
 * (workerd/engine/backend_bf16.h) rounds at. The operands arrive as fp32 tensors holding
 * bf16 values (the emulation's layout); each GEMM casts them into the context's bf16
 * scratch (exactly: they are bf16 values already) and multiplies there, with the
 * cuBLASLt plan of the shape cached like matmul.cu's (cublasGemmEx where cuBLASLt has none
 * or refuses it).
 *
 * Unrun so far (no GPU was lent when it was written): tests/gpu/check.sh runs it against the
 * emulation. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

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

extern "C" void kn_cuda_set_weights16(kn_cuda_t *ctx, const float *w32, const uint16_t *w16,
                                      size_t n)
{
    ctx->w32 = n ? w32 : NULL;
    ctx->w16 = n ? w16 : NULL;
    ctx->wn = n;
}

/* X's bf16 copy when X[0..len) lies wholly inside the working copy's range, else NULL */
static const __nv_bfloat16 *from_copy(const kn_cuda_t *ctx, const float *X, size_t len)
{
    uintptr_t p = (uintptr_t)X, b = (uintptr_t)ctx->w32;
    if (ctx->wn == 0 || p < b || (p - b) % sizeof(float) != 0 ||
        (p - b) / sizeof(float) + len > ctx->wn) {
        return NULL;
    }
    return (const __nv_bfloat16 *)ctx->w16 + (p - b) / sizeof(float);
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

extern "C" int kn_cuda_reserve_bf16(kn_cuda_t *ctx, size_t rows, size_t C, kn_stream_t stream)
{
    if (!ctx->bf16 || rows == 0 || C == 0) {
        return 0;
    }
    /* kn_cu_gemm_bf16's layout: A, padded to 16 bytes, then B. The largest pair: a weight
     * (up to C x 4C) with activations (up to rows x 4C), or, for a weight gradient, both
     * activations (rows x C and rows x 4C) */
    size_t wa = 4 * C * C + 4 * C * rows, aa = 5 * C * rows;
    return scratch_reserve(ctx, stream, (wa > aa ? wa : aa) + 8);
}

static void bplan_release(kn_cu_bf16_plan_t *p)
{
    kn_cu_lt_destroy(p->desc, p->la, p->lb, p->lc);
    memset(p, 0, sizeof *p);
}

void kn_cu_bf16_plans_free(kn_cuda_t *ctx)
{
    for (int i = 0; i < ctx->nbplans; i++) {
        bplan_release(&ctx->bplans[i]);
    }
    ctx->nbplans = 0;
}

/* Descriptor, layouts (A [a_rows, a_cols] and B [b_rows, b_cols] column-major bf16, C [m, n]
 * fp32) and the heuristic's best algorithm for the plan's shape, with the pointers'
 * alignment stated. p->usable = 0 when cuBLASLt offers none (the caller takes GemmEx). */
static int bplan_build(kn_cuda_t *ctx, kn_cu_bf16_plan_t *p)
{
    cublasOperation_t ta = (cublasOperation_t)p->ta, tb = (cublasOperation_t)p->tb;
    cublasStatus_t s = cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    if (s == CUBLAS_STATUS_SUCCESS) {
        s = cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
    }
    if (s == CUBLAS_STATUS_SUCCESS) {
        s = cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
    }
    if (s == CUBLAS_STATUS_SUCCESS) {
        s = cublasLtMatrixLayoutCreate(&p->la, CUDA_R_16BF, ta == CUBLAS_OP_N ? p->m : p->k,
                                       ta == CUBLAS_OP_N ? p->k : p->m, p->lda);
    }
    if (s == CUBLAS_STATUS_SUCCESS) {
        s = cublasLtMatrixLayoutCreate(&p->lb, CUDA_R_16BF, tb == CUBLAS_OP_N ? p->k : p->n,
                                       tb == CUBLAS_OP_N ? p->n : p->k, p->ldb);
    }
    if (s == CUBLAS_STATUS_SUCCESS) {
        s = cublasLtMatrixLayoutCreate(&p->lc, CUDA_R_32F, p->m, p->n, p->ldc);
    }
    return kn_cu_lt_choose(ctx, s, p->desc, p->la, p->lb, p->lc, p->align, &p->algo, &p->usable,
                           "cuBLASLt bf16 plan");
}

/* The plan for this call: cached (the first KN_CU_LT_PLANS shapes), NULL when the cache is
 * full or the plan could not be built (the caller takes GemmEx). */
static kn_cu_bf16_plan_t *bplan_for(kn_cuda_t *ctx, const kn_cu_bf16_plan_t *key, int *rc)
{
    *rc = 0;
    for (int i = 0; i < ctx->nbplans; i++) {
        kn_cu_bf16_plan_t *p = &ctx->bplans[i];
        if (p->ta == key->ta && p->tb == key->tb && p->m == key->m && p->n == key->n &&
            p->k == key->k && p->lda == key->lda && p->ldb == key->ldb && p->ldc == key->ldc &&
            p->align == key->align) {
            return p;
        }
    }
    if (ctx->nbplans == KN_CU_LT_PLANS) {
        return NULL;
    }
    kn_cu_bf16_plan_t *p = &ctx->bplans[ctx->nbplans];
    memset(p, 0, sizeof *p);
    p->ta = key->ta, p->tb = key->tb, p->m = key->m, p->n = key->n, p->k = key->k;
    p->lda = key->lda, p->ldb = key->ldb, p->ldc = key->ldc, p->align = key->align;
    if ((*rc = bplan_build(ctx, p)) < 0) {
        bplan_release(p);
        return NULL;
    }
    ctx->nbplans++;
    return p;
}

/* the alignment (16, 8, 4 or 2 bytes) every one of the call's pointers has */
static int bf16_alignment(const void *a, const void *b, const void *c)
{
    uintptr_t u = (uintptr_t)a | (uintptr_t)b | (uintptr_t)c;
    return u % 16 == 0 ? 16 : u % 8 == 0 ? 8 : u % 4 == 0 ? 4 : 2;
}

/* C = op(A) op(B) + beta C on bf16 A and B, fp32 C and accumulation: cuBLASLt with the
 * shape's cached plan; where cuBLASLt offers no algorithm or refuses to run it, the same
 * product through cublasGemmEx (CUDA_R_16BF inputs, CUBLAS_COMPUTE_32F). */
static int lt_gemm_bf16(kn_cuda_t *ctx, cudaStream_t stream, cublasOperation_t ta,
                        cublasOperation_t tb, int m, int n, int k, const __nv_bfloat16 *A, int lda,
                        const __nv_bfloat16 *B, int ldb, float beta, float *C, int ldc)
{
    const float alpha = 1.0f;
    kn_cu_bf16_plan_t key;
    memset(&key, 0, sizeof key);
    key.ta = (int)ta, key.tb = (int)tb, key.m = m, key.n = n, key.k = k;
    key.lda = lda, key.ldb = ldb, key.ldc = ldc, key.align = bf16_alignment(A, B, C);
    int rc = 0;
    kn_cu_bf16_plan_t *p = bplan_for(ctx, &key, &rc);
    if (rc < 0) {
        return rc;
    }
    if (p != NULL && p->usable) {
        cublasStatus_t s =
            cublasLtMatmul(ctx->lt, p->desc, &alpha, A, p->la, B, p->lb, &beta, C, p->lc, C, p->lc,
                           &p->algo, ctx->workspace, KN_CU_WORKSPACE, stream);
        if (s == CUBLAS_STATUS_SUCCESS) {
            return 0;
        }
        /* refused: remembered, and this shape takes GemmEx from now on */
        snprintf(ctx->err, sizeof ctx->err, "cublasLtMatmul bf16 (m %d n %d k %d): %s; GemmEx", m,
                 n, k, cublasGetStatusString(s));
        p->usable = 0;
    }
    if ((rc = kn_cu_bind(ctx, stream)) < 0) {
        return rc;
    }
    return kn_cu_blas_err(ctx,
                          cublasGemmEx(ctx->blas, ta, tb, m, n, k, &alpha, A, CUDA_R_16BF, lda, B,
                                       CUDA_R_16BF, ldb, &beta, C, CUDA_R_32F, ldc,
                                       CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                          "cublasGemmEx bf16");
}

int kn_cu_gemm_bf16(kn_cuda_t *ctx, cudaStream_t stream, cublasOperation_t ta, cublasOperation_t tb,
                    int m, int n, int k, const float *A, int lda, const float *B, int ldb,
                    float beta, float *C, int ldc)
{
    /* the operands' stored extents: lda x (columns of A as stored), the same for B */
    size_t na = (size_t)lda * (size_t)(ta == CUBLAS_OP_N ? k : m);
    size_t nb = (size_t)ldb * (size_t)(tb == CUBLAS_OP_N ? n : k);
    /* an operand in the parameters' working copy is read from it (cast once a step);
     * the others are cast into the scratch, B from a 16-byte boundary (cuBLASLt's fast
     * kernels want it) */
    const __nv_bfloat16 *a16 = from_copy(ctx, A, na), *b16 = from_copy(ctx, B, nb);
    size_t acap = a16 ? 0 : na, boff = (acap + 7) & ~(size_t)7;
    int rc = scratch_reserve(ctx, stream, boff + (b16 ? 0 : nb));
    if (rc < 0) {
        return rc;
    }
    __nv_bfloat16 *a = (__nv_bfloat16 *)ctx->half, *b = a + boff;
    if (a16 == NULL) {
        cast_kernel<<<kn_cu_blocks(na, 256), 256, 0, stream>>>(a, A, na);
    }
    if (b16 == NULL) {
        cast_kernel<<<kn_cu_blocks(nb, 256), 256, 0, stream>>>(b, B, nb);
    }
    if ((rc = kn_cu_launched()) < 0) {
        return rc;
    }
    return lt_gemm_bf16(ctx, stream, ta, tb, m, n, k, a16 ? a16 : a, lda, b16 ? b16 : b, ldb, beta,
                        C, ldc);
}
