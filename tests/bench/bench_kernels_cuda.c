/* chorus-bench-kernels-cuda: the CUDA kernels at GPT-2 124M shapes (B 8, T 1024, C 768,
 * 12 heads, vocab 50257 padded to 50304) on one GPU.
 *
 * References measured in the same run (DESIGN §12): a device-to-device cudaMemcpy's bandwidth
 * (bytes read + written per second) for the memory-bound kernels, and cuBLAS SGEMM's rate at
 * 8192^3 (fp32 and TF32) for the GEMM-bound ones. Each kernel is timed with CUDA events over
 * repeated launches after a warm-up; bytes are the minimum the kernel must move, FLOPs the
 * useful ones (causal attention counts the lower triangle only).
 * Exits 2 with a message where no GPU is visible. */
#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda.h"

#define B  8
#define T  1024
#define C  768
#define NH 12
#define V  50257
#define VP 50304
#define N  (B * T)

typedef struct bench {
    kn_cuda_t *ctx;
    float *x, *y, *w, *bias, *qkv, *att, *dqkv, *big, *dbig, *scratch, *mean, *rstd, *lse;
    float *wte, *wpe, *logits, *dwte, *losses, *p, *m, *v;
    double *sumsq, *sumsq_scratch;
    int32_t *tokens;
    void *enc_scratch;
    float *a, *b; /* GEMM peak operands, 8192 x 8192 */
} bench_t;

typedef int (*op_fn)(bench_t *s);

static int fail(const char *what, cudaError_t e)
{
    fprintf(stderr, "bench-kernels-cuda: %s: %s\n", what, cudaGetErrorString(e));
    return 1;
}

/* mean milliseconds of one call of fn over reps calls, after 2 warm-up calls; < 0 on error */
static double time_op(bench_t *s, op_fn fn, int reps)
{
    cudaEvent_t e0, e1;
    float ms = -1.0f;
    if (cudaEventCreate(&e0) != cudaSuccess || cudaEventCreate(&e1) != cudaSuccess) {
        return -1.0;
    }
    int rc = fn(s);
    rc = rc ? rc : fn(s);
    cudaEventRecord(e0, NULL);
    for (int i = 0; i < reps && rc == 0; i++) {
        rc = fn(s);
    }
    cudaEventRecord(e1, NULL);
    if (rc == 0 && cudaEventSynchronize(e1) == cudaSuccess) {
        cudaEventElapsedTime(&ms, e0, e1);
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    if (rc != 0 || ms < 0) {
        fprintf(stderr, "bench-kernels-cuda: op failed (%d): %s / %s\n", rc, kn_cuda_error_text(),
                kn_cuda_ctx_error(s->ctx));
        return -1.0;
    }
    return ms / reps;
}

// ----------------------------------------------------------------------------
// the ops, at the model's shapes

static int op_gemm(bench_t *s)
{
    return kn_cuda_matmul_fwd(s->ctx, s->b, s->a, s->a, NULL, 8192, 8192, 8192, NULL);
}
static int op_encoder_fwd(bench_t *s)
{
    return kn_cuda_encoder_fwd(s->x, s->tokens, s->wte, s->wpe, B, T, C, NULL);
}
static int op_encoder_bwd(bench_t *s)
{
    return kn_cuda_encoder_bwd(s->dwte, s->wpe, s->enc_scratch, s->x, s->tokens, B, T, C, NULL);
}
static int op_ln_fwd(bench_t *s)
{
    return kn_cuda_layernorm_fwd(s->y, s->mean, s->rstd, s->x, s->w, s->bias, N, C, NULL);
}
static int op_ln_bwd(bench_t *s)
{
    return kn_cuda_layernorm_bwd(s->y, s->p, s->m, s->scratch, s->x, s->x, s->w, s->mean, s->rstd,
                                 N, C, NULL);
}
static int op_qkv_fwd(bench_t *s)
{
    return kn_cuda_matmul_fwd(s->ctx, s->qkv, s->x, s->w, s->bias, N, C, 3 * C, NULL);
}
static int op_fc_fwd(bench_t *s)
{
    return kn_cuda_matmul_fwd(s->ctx, s->big, s->x, s->w, s->bias, N, C, 4 * C, NULL);
}
static int op_fc_bwd(bench_t *s)
{
    return kn_cuda_matmul_bwd(s->ctx, s->y, s->p, s->m, s->big, s->x, s->w, N, C, 4 * C, NULL);
}
static int op_att_fwd(bench_t *s)
{
    return kn_cuda_attention_fwd(s->ctx, s->y, s->att, s->qkv, B, T, C, NH, NULL);
}
static int op_att_bwd(bench_t *s)
{
    return kn_cuda_attention_bwd(s->ctx, s->dqkv, s->scratch, s->x, s->qkv, s->att, B, T, C, NH,
                                 NULL);
}
static int op_flash_fwd(bench_t *s)
{
    return kn_cuda_flash_attention_fwd(s->y, s->lse, s->qkv, B, T, C, NH, NULL);
}
static int op_flash_bwd(bench_t *s)
{
    return kn_cuda_flash_attention_bwd(s->dqkv, s->scratch, s->x, s->qkv, s->y, s->lse, B, T, C, NH,
                                       NULL);
}
static int op_gelu_fwd(bench_t *s)
{
    return kn_cuda_gelu_fwd(s->dbig, s->big, (size_t)N * 4 * C, NULL);
}
static int op_gelu_bwd(bench_t *s)
{
    return kn_cuda_gelu_bwd(s->dbig, s->big, s->dbig, (size_t)N * 4 * C, NULL);
}
static int op_residual(bench_t *s)
{
    return kn_cuda_residual_fwd(s->y, s->y, s->x, (size_t)N * C, NULL);
}
static int op_classifier(bench_t *s)
{
    return kn_cuda_lmhead_fused(s->ctx, s->y, s->dwte, s->logits, s->lse, s->losses, s->x, s->wte,
                                s->tokens, 1.0f / N, N, C, V, VP, NULL);
}
static int op_adamw(bench_t *s)
{
    return kn_cuda_adamw(s->wte, s->dwte, s->p, s->v, (size_t)VP * C, 6e-4, 0.9, 0.95, 1e-8, 0.1,
                         10, NULL);
}
static int op_sumsq(bench_t *s)
{
    return kn_cuda_sumsq(s->sumsq, s->sumsq_scratch, s->wte, (size_t)VP * C, 0, NULL);
}

// ----------------------------------------------------------------------------

static void result(const char *name, double value, const char *unit, const char *ref,
                   double ref_value)
{
    printf("RESULT name=%s value=%.2f unit=%s ref=%s ref_value=%.2f ratio=%.3f\n", name, value,
           unit, ref, ref_value, value / ref_value);
}

static float *dalloc(size_t n, int *rc)
{
    void *p = NULL;
    if (*rc == 0 && cudaMalloc(&p, n * sizeof(float)) != cudaSuccess) {
        *rc = 1;
        return NULL;
    }
    if (p != NULL) {
        cudaMemset(p, 0, n * sizeof(float)); /* zeros are valid inputs to every op */
    }
    return p;
}

int main(void)
{
    int ndev = 0;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess || ndev == 0) {
        fprintf(stderr, "bench-kernels-cuda: no CUDA device visible (%s)\n",
                e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
        return 2;
    }
    struct cudaDeviceProp prop;
    cudaGetDeviceProperties(&prop, 0);
    printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);

    bench_t s;
    memset(&s, 0, sizeof s);
    int rc = kn_cuda_create(&s.ctx, 0);
    if (rc != 0) {
        fprintf(stderr, "bench-kernels-cuda: kn_cuda_create: %d\n", rc);
        return 1;
    }
    size_t big = (size_t)N * 4 * C;
    s.x = dalloc((size_t)N * C, &rc), s.y = dalloc((size_t)N * C, &rc);
    s.w = dalloc((size_t)C * 4 * C, &rc), s.bias = dalloc(4 * C, &rc);
    s.qkv = dalloc((size_t)N * 3 * C, &rc), s.dqkv = dalloc((size_t)N * 3 * C, &rc);
    s.att = dalloc((size_t)B * NH * T * T, &rc), s.big = dalloc(big, &rc);
    s.dbig = dalloc(big, &rc), s.mean = dalloc(N, &rc), s.rstd = dalloc(N, &rc);
    s.scratch = dalloc(KN_CUDA_ATT_BWD_SCRATCH(T, NH) + KN_CUDA_LN_BWD_SCRATCH(C), &rc);
    s.lse = dalloc((size_t)B * NH * T, &rc), s.losses = dalloc(N, &rc);
    s.wte = dalloc((size_t)VP * C, &rc), s.wpe = dalloc((size_t)T * C, &rc);
    s.dwte = dalloc((size_t)VP * C, &rc), s.logits = dalloc((size_t)N * VP, &rc);
    s.p = dalloc((size_t)VP * C, &rc), s.m = dalloc((size_t)VP * C, &rc);
    s.v = dalloc((size_t)VP * C, &rc);
    s.a = dalloc((size_t)8192 * 8192, &rc), s.b = dalloc((size_t)8192 * 8192, &rc);
    s.sumsq = (double *)dalloc(2, &rc), s.sumsq_scratch = (double *)dalloc(2 * 1024, &rc);
    s.tokens = (int32_t *)dalloc(N, &rc);
    s.enc_scratch = dalloc(kn_cuda_encoder_bwd_scratch_bytes(B, T) / 4 + 1, &rc);
    if (rc != 0) {
        return fail("cudaMalloc", cudaErrorMemoryAllocation);
    }
    // tokens: a fixed pseudo-random sequence over the real vocab
    int32_t *tok = malloc(N * sizeof *tok);
    uint64_t r = 88172645463325252ull;
    for (int i = 0; i < N; i++) {
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        tok[i] = (int32_t)(r % V);
    }
    cudaMemcpy(s.tokens, tok, N * sizeof *tok, cudaMemcpyHostToDevice);
    free(tok);
    // GEMM operands and activations: values in [-1, 1) (zeros would flatter the GEMMs)
    size_t nfill = (size_t)8192 * 8192;
    float *h = malloc(nfill * sizeof *h);
    if (h == NULL) {
        return fail("malloc", cudaErrorMemoryAllocation);
    }
    for (size_t i = 0; i < nfill; i++) {
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        h[i] = (float)(r >> 40) / (float)(1 << 23) - 1.0f;
    }
    cudaMemcpy(s.a, h, nfill * sizeof *h, cudaMemcpyHostToDevice);
    cudaMemcpy(s.x, h, (size_t)N * C * sizeof *h, cudaMemcpyHostToDevice);
    cudaMemcpy(s.w, h, (size_t)C * 4 * C * sizeof *h, cudaMemcpyHostToDevice);
    cudaMemcpy(s.wte, h, (size_t)VP * C * sizeof *h, cudaMemcpyHostToDevice);
    cudaMemcpy(s.qkv, h, (size_t)N * 3 * C * sizeof *h, cudaMemcpyHostToDevice);
    free(h);

    // references: copy bandwidth, SGEMM peak (fp32 and TF32)
    size_t cbytes = (size_t)8192 * 8192 * sizeof(float);
    cudaEvent_t e0, e1;
    float ms = 0;
    cudaEventCreate(&e0), cudaEventCreate(&e1);
    cudaMemcpy(s.b, s.a, cbytes, cudaMemcpyDeviceToDevice);
    cudaEventRecord(e0, NULL);
    for (int i = 0; i < 20; i++) {
        cudaMemcpyAsync(s.b, s.a, cbytes, cudaMemcpyDeviceToDevice, NULL);
    }
    cudaEventRecord(e1, NULL);
    if ((e = cudaEventSynchronize(e1)) != cudaSuccess) {
        return fail("memcpy", e);
    }
    cudaEventElapsedTime(&ms, e0, e1);
    double copy_gbs = 2.0 * cbytes * 20 / (ms * 1e-3) / 1e9;
    double gemm_flop = 2.0 * 8192.0 * 8192.0 * 8192.0;
    double sgemm = gemm_flop / (time_op(&s, op_gemm, 5) * 1e-3) / 1e12;
    kn_cuda_set_tf32(s.ctx, 1);
    double tf32 = gemm_flop / (time_op(&s, op_gemm, 10) * 1e-3) / 1e12;
    printf("reference: device copy %.0f GB/s, SGEMM %.1f TFLOP/s, TF32 GEMM %.1f TFLOP/s\n",
           copy_gbs, sgemm, tf32);

    // memory-bound kernels: GB/s against the copy
    struct {
        const char *name;
        op_fn fn;
        double bytes;
    } mem[] = {
        {"encoder_fwd", op_encoder_fwd, 4.0 * (3.0 * N * C + N)},
        {"encoder_bwd", op_encoder_bwd, 4.0 * (3.0 * N * C + 2.0 * T * C + 4.0 * N)},
        {"layernorm_fwd", op_ln_fwd, 4.0 * (2.0 * N * C + 2.0 * N)},
        {"layernorm_bwd", op_ln_bwd, 4.0 * (4.0 * N * C + 2.0 * N)},
        {"gelu_fwd", op_gelu_fwd, 4.0 * 2.0 * big},
        {"gelu_bwd", op_gelu_bwd, 4.0 * 3.0 * big},
        {"residual_fwd", op_residual, 4.0 * 3.0 * N * C},
        {"adamw", op_adamw, 4.0 * 7.0 * VP * C},
        {"sumsq", op_sumsq, 4.0 * VP * C},
    };
    // GEMM-bound kernels: TFLOP/s against the TF32 peak (these run with TF32 on)
    double att_flop = 2.0 * 2.0 * B * NH * (double)T * (T + 1) / 2.0 * (C / NH);
    struct {
        const char *name;
        op_fn fn;
        double flop;
    } fl[] = {
        {"matmul_qkv_fwd", op_qkv_fwd, 2.0 * N * C * 3.0 * C},
        {"matmul_fc_fwd", op_fc_fwd, 2.0 * N * C * 4.0 * C},
        {"matmul_fc_bwd", op_fc_bwd, 4.0 * N * C * 4.0 * C},
        {"attention_fwd", op_att_fwd, att_flop},
        {"attention_bwd", op_att_bwd, 2.0 * att_flop},
        {"flash_attention_fwd", op_flash_fwd, att_flop},
        {"flash_attention_bwd", op_flash_bwd, 2.0 * att_flop},
        {"classifier_fused", op_classifier, 3.0 * 2.0 * N * (double)C * VP},
    };
    int failed = 0;
    char name[96];
    for (size_t i = 0; i < sizeof mem / sizeof mem[0]; i++) {
        double t = time_op(&s, mem[i].fn, 20);
        if (t < 0) {
            failed = 1;
            continue;
        }
        snprintf(name, sizeof name, "cuda_%s_bandwidth", mem[i].name);
        printf("%-22s %8.3f ms\n", mem[i].name, t);
        result(name, mem[i].bytes / (t * 1e-3) / 1e9, "GB/s", "device_copy", copy_gbs);
    }
    double att_ms = 0, flash_ms = 0;
    for (size_t i = 0; i < sizeof fl / sizeof fl[0]; i++) {
        double t = time_op(&s, fl[i].fn, 10);
        if (t < 0) {
            failed = 1;
            continue;
        }
        att_ms += strncmp(fl[i].name, "attention", 9) == 0 ? t : 0;
        flash_ms += strncmp(fl[i].name, "flash", 5) == 0 ? t : 0;
        snprintf(name, sizeof name, "cuda_%s_tflops", fl[i].name);
        printf("%-22s %8.3f ms\n", fl[i].name, t);
        result(name, fl[i].flop / (t * 1e-3) / 1e12, "TFLOP/s", "tf32_gemm_peak", tf32);
    }
    result("cuda_sgemm_fp32_tflops", sgemm, "TFLOP/s", "tf32_gemm_peak", tf32);
    if (att_ms > 0 && flash_ms > 0) {
        result("cuda_flash_attention_speedup", att_ms / flash_ms, "x", "materialised_attention",
               1.0);
    }
    kn_cuda_destroy(s.ctx);
    return failed;
}
