/* Internals shared by the files of kernels/cuda (never included outside this folder): the
 * context's layout, the one CUDA/cuBLAS -> error-code conversion, column-major GEMM helpers
 * and warp/block reductions. */
#ifndef KN_CUDA_COMMON_CUH
#define KN_CUDA_COMMON_CUH

#include <errno.h>

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "kernels/cuda.h"

/* A cuBLASLt bias-epilogue GEMM planned once per shape, precision and pointer alignment:
 * its descriptor, layouts and the heuristic's algorithm (matmul.cu). */
typedef struct kn_cu_lt_plan {
    int N, C, OC, tf32, align; /* align: bytes every pointer of the call is aligned to */
    int usable;                /* 1: an algorithm; 0: none offered or the run refused */
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
} kn_cu_lt_plan_t;

#define KN_CU_LT_PLANS 64

/* A cuBLASLt bf16 GEMM (bf16 A and B, fp32 C, fp32 accumulation) planned once per shape,
 * transposes, leading dimensions and pointer alignment (bf16.cu). */
typedef struct kn_cu_bf16_plan {
    int ta, tb, m, n, k, lda, ldb, ldc, align;
    int usable; /* 1: cuBLASLt offered an algorithm and has not refused it; 0: cublasGemmEx */
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
} kn_cu_bf16_plan_t;

struct kn_cuda {
    cublasHandle_t blas;
    cublasLtHandle_t lt;
    void *workspace; /* cuBLAS / cuBLASLt workspace, KN_CU_WORKSPACE bytes */
    float *ones;     /* ones_cap ones, for column sums as a GEMV */
    size_t ones_cap;
    int tf32;
    int bf16;   /* the matmuls' GEMMs on bf16 operands (bf16.cu) */
    void *half; /* their bf16 operands, half_cap elements */
    /* kn_cuda_set_weights16: w16[0..wn) is w32[0..wn) in bf16; an operand inside w32's range
     * is read from w16 instead of being cast into half */
    const float *w32;
    const void *w16;
    size_t wn;
    size_t half_cap;
    cudaStream_t bound; /* the stream the cuBLAS handle is on (bound_set: it was set) */
    int bound_set;
    kn_cu_lt_plan_t plans[KN_CU_LT_PLANS];
    int nplans;
    kn_cu_bf16_plan_t bplans[KN_CU_LT_PLANS];
    int nbplans;
    char err[160]; /* last cuBLAS failure */
};

#define KN_CU_WORKSPACE ((size_t)32 << 20)

/* The one conversion of a CUDA runtime status (kernels/cuda.h's codes). */
int kn_cu_err(cudaError_t e);
/* The one conversion of a cuBLAS status; records what failed in ctx. */
int kn_cu_blas_err(kn_cuda_t *ctx, cublasStatus_t s, const char *what);
/* After a launch: the launch's own status (not clearing it: kn_cuda_error_text does).
 * The last error is the thread's, left by any runtime call, and a cudaEventQuery or
 * cudaStreamQuery answering "not yet" leaves cudaErrorNotReady there: the NCCL
 * collectives poll their events on this thread through the same libcudart
 * (workerd/coll/coll_nccl.c), so a peek alone would fail the next launch. A launch never
 * fails with cudaErrorNotReady (a failed launch overwrites the last error), so that one
 * is a stale "not yet" and is cleared; anything else is kept. The clear also keeps CUB
 * (encoder.cu), which peeks after its own launches, from failing on it. */
static inline int kn_cu_launched(void)
{
    cudaError_t e = cudaPeekAtLastError();
    if (e == cudaErrorNotReady) {
        (void)cudaGetLastError();
        e = cudaPeekAtLastError();
    }
    return kn_cu_err(e);
}

/* Put the cuBLAS handle on stream (once per stream change) with ctx's workspace:
 * cublasSetStream resets the workspace to cuBLAS's default pool, so it is set again. */
int kn_cu_bind(kn_cuda_t *ctx, cudaStream_t stream);
/* The handles of a cuBLASLt plan destroyed (any may be NULL). */
void kn_cu_lt_destroy(cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t la,
                      cublasLtMatrixLayout_t lb, cublasLtMatrixLayout_t lc);
/* The rest of a plan once its descriptor and layouts are made (s: how making them went):
 * the heuristic's best algorithm with every pointer's alignment (bytes) and the context's
 * workspace stated. *usable = 0 when cuBLASLt offers none or refused a step (the caller
 * computes without it); an error only when cuBLASLt ran out of memory. */
int kn_cu_lt_choose(kn_cuda_t *ctx, cublasStatus_t s, cublasLtMatmulDesc_t desc,
                    cublasLtMatrixLayout_t la, cublasLtMatrixLayout_t lb, cublasLtMatrixLayout_t lc,
                    int align, cublasLtMatmulAlgo_t *algo, int *usable, const char *what);
/* Release the cuBLASLt plans (matmul.cu). */
void kn_cu_lt_plans_free(kn_cuda_t *ctx);
/* Release the bf16 GEMMs' cuBLASLt plans (bf16.cu). */
void kn_cu_bf16_plans_free(kn_cuda_t *ctx);

/* Column-major C = alpha op(A) op(B) + beta C over `batch` matrices at the given strides
 * (elements), on ctx's stream setting, fp32 or TF32 per ctx. */
int kn_cu_gemm(kn_cuda_t *ctx, cudaStream_t stream, cublasOperation_t ta, cublasOperation_t tb,
               int m, int n, int k, float alpha, const float *A, int lda, long long sA,
               const float *B, int ldb, long long sB, float beta, float *C, int ldc, long long sC,
               int batch);
/* kn_cu_gemm (batch 1, alpha 1) on bf16 copies of A and B, fp32 accumulation into fp32 C,
 * through cuBLASLt (bf16.cu): the matmuls' GEMMs under kn_cuda_set_bf16. */
int kn_cu_gemm_bf16(kn_cuda_t *ctx, cudaStream_t stream, cublasOperation_t ta, cublasOperation_t tb,
                    int m, int n, int k, const float *A, int lda, const float *B, int ldb,
                    float beta, float *C, int ldc);
/* y[m] += A[m,n] (column-major, lda) @ ones[n]: the column sums of a row-major [n,m] matrix. */
int kn_cu_colsum_acc(kn_cuda_t *ctx, cudaStream_t stream, float *y, const float *A, int m, int n,
                     int lda);

static inline unsigned kn_cu_blocks(size_t n, unsigned threads)
{
    size_t b = (n + threads - 1) / threads;
    return b > 0x7fffffffu ? 0x7fffffffu : (unsigned)b;
}

__device__ __forceinline__ float kn_warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1) {
        v += __shfl_xor_sync(0xffffffffu, v, o);
    }
    return v;
}

__device__ __forceinline__ double kn_warp_sum_d(double v)
{
    for (int o = 16; o > 0; o >>= 1) {
        v += __shfl_xor_sync(0xffffffffu, v, o);
    }
    return v;
}

__device__ __forceinline__ float kn_warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1) {
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    }
    return v;
}

#endif
