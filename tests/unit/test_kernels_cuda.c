/* CUDA kernels (kernels/cuda.h) against the CPU kernels on the same inputs, forward and
 * backward. Each test says its tolerance: |got - want| <= rtol |want| + atol max|want|.
 * Exact (bit-identical) where the GPU kernel repeats the CPU operation order: encoder,
 * residual, axpy, AdamW and its fused form (against the fast CPU kernels), the fused
 * classifier against the split one, the unscaled fused head against the fused classifier
 * at scale 1, the vocab-parallel embedding and row max (kernels/tp.h).
 * GEMMs run in full fp32 unless a test turns TF32 on.
 *
 * Without a visible GPU every test that needs one skips with a message; the argument
 * checks, which touch no device, run everywhere. */
#include <criterion/criterion.h>
#include <cuda_runtime_api.h>
#include <errno.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/err.h"
#include "common/rng.h"
#include "kernels/adamw.h"
#include "kernels/attention.h"
#include "kernels/bf16.h"
#include "kernels/cuda.h"
#include "kernels/encoder.h"
#include "kernels/gelu.h"
#include "kernels/layernorm.h"
#include "kernels/matmul.h"
#include "kernels/residual.h"
#include "kernels/tp.h"
#include "kernels/xent.h"

_Static_assert(KN_E_CUDA == CH_E_CUDA, "kernels/cuda.h's CUDA error code is common/err.h's");

// ----------------------------------------------------------------------------
// helpers

static void need_gpu(void)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        cr_skip_test("no CUDA device visible (cudaGetDeviceCount: %s, %d devices): CUDA kernel "
                     "test skipped",
                     e != cudaSuccess ? cudaGetErrorString(e) : "ok", n);
    }
}

static kn_cuda_t *ctx_new(int tf32)
{
    kn_cuda_t *ctx = NULL;
    cr_assert_eq(kn_cuda_create(&ctx, tf32), 0, "kn_cuda_create");
    return ctx;
}

static float *randn(size_t n, const char *name, float std)
{
    float *x = malloc((n ? n : 1) * sizeof *x);
    cr_assert_not_null(x);
    ch_rng_fill_normal(x, n, 4321, name, 0, std);
    return x;
}

static float *zeros(size_t n)
{
    float *x = calloc(n ? n : 1, sizeof *x);
    cr_assert_not_null(x);
    return x;
}

static void *dev_alloc(size_t bytes)
{
    void *d = NULL;
    cr_assert_eq(cudaMalloc(&d, bytes ? bytes : 4), cudaSuccess, "cudaMalloc %zu", bytes);
    return d;
}

/* a device copy of host[0..bytes) */
static void *up(const void *host, size_t bytes)
{
    void *d = dev_alloc(bytes);
    cr_assert_eq(cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice), cudaSuccess);
    return d;
}

static float *upf(const float *host, size_t n)
{
    return up(host, n * sizeof(float));
}

/* wait for the launched work, then a host copy of the device floats */
static float *down(const float *dev, size_t n)
{
    cr_assert_eq(cudaDeviceSynchronize(), cudaSuccess, "kernel failed: %s", kn_cuda_error_text());
    float *h = zeros(n);
    cr_assert_eq(cudaMemcpy(h, dev, n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
}

static void assert_close(const char *what, const float *got, const float *want, size_t n,
                         double rtol, double atol)
{
    double maxabs = 0.0;
    for (size_t i = 0; i < n; i++) {
        maxabs = fmax(maxabs, fabs(want[i]));
    }
    for (size_t i = 0; i < n; i++) {
        double err = fabs((double)got[i] - want[i]);
        cr_assert(err <= rtol * fabs(want[i]) + atol * maxabs + 1e-30,
                  "%s[%zu]: got %.9g want %.9g (max |want| %.3g)", what, i, got[i], want[i],
                  maxabs);
    }
}

static void assert_same(const char *what, const float *got, const float *want, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        cr_assert(memcmp(&got[i], &want[i], sizeof(float)) == 0, "%s[%zu]: got %.9g want %.9g",
                  what, i, got[i], want[i]);
    }
}

/* device result vs host expectation, freeing the download */
static void check_dev(const char *what, const float *dev, const float *want, size_t n, double rtol,
                      double atol)
{
    float *got = down(dev, n);
    if (rtol == 0.0 && atol == 0.0) {
        assert_same(what, got, want, n);
    } else {
        assert_close(what, got, want, n, rtol, atol);
    }
    free(got);
}

// ----------------------------------------------------------------------------
// arguments: no device needed

Test(cuda_args, bad_shapes_are_einval_before_any_launch)
{
    cr_assert_eq(kn_cuda_flash_attention_fwd(NULL, NULL, NULL, 1, 8, 2 * 256, 2, NULL), -EINVAL,
                 "head size above KN_CUDA_FLASH_MAX_HS");
    cr_assert_eq(kn_cuda_flash_attention_fwd(NULL, NULL, NULL, 1, 8, 30, 4, NULL), -EINVAL,
                 "C not a multiple of NH");
    cr_assert_eq(kn_cuda_layernorm_fwd(NULL, NULL, NULL, NULL, NULL, NULL, 0, 8, NULL), -EINVAL);
    cr_assert_eq(kn_cuda_encoder_fwd(NULL, NULL, NULL, NULL, 1, 0, 8, NULL), -EINVAL);
    cr_assert_eq(kn_cuda_gelu_fwd(NULL, NULL, 0, NULL), 0, "empty is a no-op");
    cr_assert_eq(kn_cuda_adamw(NULL, NULL, NULL, NULL, 4, 1e-3, 0.9, 0.95, 1e-8, 0.1, 0, NULL),
                 -EINVAL, "step 0");
    cr_assert_eq(kn_cuda_adamw_fused(NULL, NULL, NULL, NULL, 4, 1e-3, 0.9, 0.95, 1e-8, 0.1, 0, 0.5f,
                                     1, NULL),
                 -EINVAL, "fused, step 0");
    cr_assert_eq(kn_cuda_adamw_fused(NULL, NULL, NULL, NULL, 0, 1e-3, 0.9, 0.95, 1e-8, 0.1, 1, 0.5f,
                                     1, NULL),
                 0, "fused, empty is a no-op");
    cr_assert_eq(kn_cuda_axpy(NULL, NULL, 0, 2.0f, NULL), 0, "axpy, empty is a no-op");
    cr_assert_eq(kn_cuda_lmhead_fwdbwd(NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0, 4,
                                       8, 50, 40, NULL),
                 -EINVAL, "fwdbwd, Vp < V");
    cr_assert_eq(kn_cuda_tp_embed_fwd(NULL, NULL, NULL, NULL, 0, 0, 1, 4, 8, NULL), -EINVAL,
                 "tp embedding, empty slice");
    cr_assert_eq(kn_cuda_tp_xent_max(NULL, NULL, 4, 8, 9, NULL), -EINVAL, "valid > Vl");
    cr_assert_eq(kn_cuda_tp_xent_bwd(NULL, NULL, NULL, 1.0f, 0, 4, 8, -1, NULL), -EINVAL,
                 "valid < 0");
    cr_assert_eq(kn_cuda_tp_xent_finish(NULL, NULL, NULL, NULL, NULL, 0, NULL), -EINVAL);
}

// ----------------------------------------------------------------------------
// encoder: bit-identical to the reference, forward and backward

Test(cuda_encoder, fwd_bwd_bit_identical)
{
    need_gpu();
    int B = 3, T = 17, C = 45, V = 11, N = B * T;
    int32_t inp[3 * 17];
    for (int i = 0; i < N; i++) {
        inp[i] = (i * 7 + i / 5) % V; /* repeats, within and across rows */
    }
    inp[4] = inp[5] = inp[6] = 3;
    float *wte = randn((size_t)V * C, "wte", 1), *wpe = randn((size_t)T * C, "wpe", 1);
    float *dout = randn((size_t)N * C, "dout", 1);
    float *dwte = randn((size_t)V * C, "dwte0", 1), *dwpe = randn((size_t)T * C, "dwpe0", 1);
    float *out = zeros((size_t)N * C);

    int32_t *d_inp = up(inp, sizeof inp);
    float *d_wte = upf(wte, (size_t)V * C), *d_wpe = upf(wpe, (size_t)T * C);
    float *d_out = dev_alloc((size_t)N * C * sizeof(float));
    float *d_dout = upf(dout, (size_t)N * C);
    float *d_dwte = upf(dwte, (size_t)V * C), *d_dwpe = upf(dwpe, (size_t)T * C);
    void *scratch = dev_alloc(kn_cuda_encoder_bwd_scratch_bytes(B, T));

    cr_assert_eq(kn_cuda_encoder_fwd(d_out, d_inp, d_wte, d_wpe, B, T, C, NULL), 0);
    kn_encoder_fwd_ref(out, inp, wte, wpe, B, T, C);
    check_dev("encoder out", d_out, out, (size_t)N * C, 0, 0);

    cr_assert_eq(kn_cuda_encoder_bwd(d_dwte, d_dwpe, scratch, d_dout, d_inp, B, T, C, NULL), 0);
    kn_encoder_bwd_ref(dwte, dwpe, dout, inp, B, T, C);
    check_dev("dwte", d_dwte, dwte, (size_t)V * C, 0, 0);
    check_dev("dwpe", d_dwpe, dwpe, (size_t)T * C, 0, 0);

    cudaFree(scratch), cudaFree(d_dwpe), cudaFree(d_dwte), cudaFree(d_dout), cudaFree(d_out);
    cudaFree(d_wpe), cudaFree(d_wte), cudaFree(d_inp);
    free(out), free(dwpe), free(dwte), free(dout), free(wpe), free(wte);
}

// ----------------------------------------------------------------------------
// layernorm: forward 1e-5, backward (accumulating onto nonzero gradients) 1e-4

Test(cuda_layernorm, fwd_bwd_match_reference)
{
    need_gpu();
    int N = 1100, C = 77; /* more rows than KN_CUDA_LN_PARTIALS: partials take several rows */
    size_t NC = (size_t)N * C;
    float *x = randn(NC, "x", 2), *w = randn(C, "w", 1), *b = randn(C, "b", 1);
    float *out = zeros(NC), *mean = zeros(N), *rstd = zeros(N);
    float *dout = randn(NC, "dout", 1), *dx = randn(NC, "dx0", 1);
    float *dw = randn(C, "dw0", 1), *db = randn(C, "db0", 1);

    float *d_x = upf(x, NC), *d_w = upf(w, C), *d_b = upf(b, C), *d_out = upf(out, NC);
    float *d_mean = upf(mean, N), *d_rstd = upf(rstd, N), *d_dout = upf(dout, NC);
    float *d_dx = upf(dx, NC), *d_dw = upf(dw, C), *d_db = upf(db, C);
    float *scratch = dev_alloc(KN_CUDA_LN_BWD_SCRATCH(C) * sizeof(float));

    cr_assert_eq(kn_cuda_layernorm_fwd(d_out, d_mean, d_rstd, d_x, d_w, d_b, N, C, NULL), 0);
    kn_layernorm_fwd_ref(out, mean, rstd, x, w, b, N, C);
    check_dev("ln out", d_out, out, NC, 1e-5, 1e-5);
    check_dev("ln mean", d_mean, mean, N, 1e-5, 1e-5);
    check_dev("ln rstd", d_rstd, rstd, N, 1e-5, 1e-5);

    // the backward reads the CPU's mean/rstd so only the backward is compared
    cr_assert_eq(cudaMemcpy(d_mean, mean, N * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
    cr_assert_eq(cudaMemcpy(d_rstd, rstd, N * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
    cr_assert_eq(kn_cuda_layernorm_bwd(d_dx, d_dw, d_db, scratch, d_dout, d_x, d_w, d_mean, d_rstd,
                                       N, C, NULL),
                 0);
    kn_layernorm_bwd_ref(dx, dw, db, dout, x, w, mean, rstd, N, C);
    check_dev("ln dinp", d_dx, dx, NC, 1e-4, 1e-5);
    check_dev("ln dweight", d_dw, dw, C, 1e-4, 1e-5);
    check_dev("ln dbias", d_db, db, C, 1e-4, 1e-5);

    cudaFree(scratch), cudaFree(d_db), cudaFree(d_dw), cudaFree(d_dx), cudaFree(d_dout);
    cudaFree(d_rstd), cudaFree(d_mean), cudaFree(d_out), cudaFree(d_b), cudaFree(d_w);
    cudaFree(d_x);
    free(db), free(dw), free(dx), free(dout), free(rstd), free(mean), free(out), free(b), free(w);
    free(x);
}

/* ZB-H1's split backward: the input half (dweight, dbias NULL; no scratch) and the weight
 * half (dinp NULL; weight NULL: never read) give the whole backward's bits */
Test(cuda_layernorm, split_backward_halves_give_the_whole_bits)
{
    need_gpu();
    int N = 1100, C = 77;
    size_t NC = (size_t)N * C;
    float *x = randn(NC, "x", 2), *w = randn(C, "w", 1), *mean = zeros(N), *rstd = zeros(N);
    float *dout = randn(NC, "dout", 1), *dx = randn(NC, "dx0", 1);
    float *dw = randn(C, "dw0", 1), *db = randn(C, "db0", 1);
    kn_layernorm_fwd_ref(zeros(NC), mean, rstd, x, w, w, N, C);
    float *d_x = upf(x, NC), *d_w = upf(w, C), *d_mean = upf(mean, N), *d_rstd = upf(rstd, N);
    float *d_dout = upf(dout, NC), *scratch = dev_alloc(KN_CUDA_LN_BWD_SCRATCH(C) * sizeof(float));
    float *d_dx = upf(dx, NC), *d_dw = upf(dw, C), *d_db = upf(db, C);
    float *s_dx = upf(dx, NC), *s_dw = upf(dw, C), *s_db = upf(db, C);
    cr_assert_eq(kn_cuda_layernorm_bwd(d_dx, d_dw, d_db, scratch, d_dout, d_x, d_w, d_mean, d_rstd,
                                       N, C, NULL),
                 0);
    cr_assert_eq(
        kn_cuda_layernorm_bwd(s_dx, NULL, NULL, NULL, d_dout, d_x, d_w, d_mean, d_rstd, N, C, NULL),
        0);
    cr_assert_eq(kn_cuda_layernorm_bwd(NULL, s_dw, s_db, scratch, d_dout, d_x, NULL, d_mean, d_rstd,
                                       N, C, NULL),
                 0);
    assert_same("ln split dinp", down(s_dx, NC), down(d_dx, NC), NC);
    assert_same("ln split dweight", down(s_dw, C), down(d_dw, C), C);
    assert_same("ln split dbias", down(s_db, C), down(d_db, C), C);
    cudaFree(s_db), cudaFree(s_dw), cudaFree(s_dx), cudaFree(d_db), cudaFree(d_dw), cudaFree(d_dx);
    cudaFree(scratch), cudaFree(d_dout), cudaFree(d_rstd), cudaFree(d_mean), cudaFree(d_w);
    cudaFree(d_x);
}

Test(cuda_matmul, split_backward_halves_give_the_whole_bits)
{
    need_gpu();
    for (int tf32 = 0; tf32 < 2; tf32++) {
        kn_cuda_t *ctx = ctx_new(tf32);
        int N = 96, C = 64, OC = 160;
        size_t nI = (size_t)N * C, nW = (size_t)C * OC, nO = (size_t)N * OC;
        float *x = randn(nI, "x", 1), *w = randn(nW, "w", 0.1f), *dout = randn(nO, "dout", 1);
        float *dw = randn(nW, "dw0", 1), *db = randn(OC, "db0", 1);
        float *d_x = upf(x, nI), *d_w = upf(w, nW), *d_dout = upf(dout, nO);
        float *d_dx = upf(zeros(nI), nI), *d_dw = upf(dw, nW), *d_db = upf(db, OC);
        float *s_dx = upf(zeros(nI), nI), *s_dw = upf(dw, nW), *s_db = upf(db, OC);
        cr_assert_eq(kn_cuda_matmul_bwd(ctx, d_dx, d_dw, d_db, d_dout, d_x, d_w, N, C, OC, NULL), 0,
                     "%s", kn_cuda_ctx_error(ctx));
        cr_assert_eq(kn_cuda_matmul_bwd(ctx, s_dx, NULL, NULL, d_dout, NULL, d_w, N, C, OC, NULL),
                     0, "%s", kn_cuda_ctx_error(ctx));
        cr_assert_eq(kn_cuda_matmul_bwd(ctx, NULL, s_dw, s_db, d_dout, d_x, NULL, N, C, OC, NULL),
                     0, "%s", kn_cuda_ctx_error(ctx));
        assert_same("matmul split dinp", down(s_dx, nI), down(d_dx, nI), nI);
        assert_same("matmul split dweight", down(s_dw, nW), down(d_dw, nW), nW);
        assert_same("matmul split dbias", down(s_db, OC), down(d_db, OC), OC);
        cudaFree(s_db), cudaFree(s_dw), cudaFree(s_dx), cudaFree(d_db), cudaFree(d_dw);
        cudaFree(d_dx), cudaFree(d_dout), cudaFree(d_w), cudaFree(d_x);
        kn_cuda_destroy(ctx);
    }
}

// ----------------------------------------------------------------------------
// matmul: fp32 1e-5 (forward) / 1e-4 (backward); TF32 5e-3 of the largest entry

static void matmul_case(int N, int C, int OC, int with_bias, int tf32)
{
    kn_cuda_t *ctx = ctx_new(tf32);
    double rtol = tf32 ? 0.0 : 1e-5, atol = tf32 ? 5e-3 : 1e-5;
    size_t nI = (size_t)N * C, nW = (size_t)C * OC, nO = (size_t)N * OC;
    float *x = randn(nI, "x", 1), *w = randn(nW, "w", 0.1f), *b = randn(OC, "b", 1);
    float *out = zeros(nO), *dout = randn(nO, "dout", 1), *dx = zeros(nI);
    float *dw = randn(nW, "dw0", 1), *db = randn(OC, "db0", 1);
    float *bias = with_bias ? b : NULL;

    float *d_x = upf(x, nI), *d_w = upf(w, nW), *d_b = upf(b, OC), *d_out = upf(out, nO);
    float *d_dout = upf(dout, nO), *d_dx = upf(dx, nI), *d_dw = upf(dw, nW), *d_db = upf(db, OC);

    cr_assert_eq(kn_cuda_matmul_fwd(ctx, d_out, d_x, d_w, with_bias ? d_b : NULL, N, C, OC, NULL),
                 0, "%s", kn_cuda_ctx_error(ctx));
    kn_matmul_fwd_ref(out, x, w, bias, N, C, OC);
    check_dev("matmul out", d_out, out, nO, rtol, atol);

    cr_assert_eq(kn_cuda_matmul_bwd(ctx, d_dx, d_dw, with_bias ? d_db : NULL, d_dout, d_x, d_w, N,
                                    C, OC, NULL),
                 0, "%s", kn_cuda_ctx_error(ctx));
    kn_matmul_bwd_ref(dx, dw, with_bias ? db : NULL, dout, x, w, N, C, OC);
    check_dev("matmul dinp", d_dx, dx, nI, rtol * 10, atol);
    check_dev("matmul dweight", d_dw, dw, nW, rtol * 10, atol);
    check_dev("matmul dbias", d_db, db, OC, rtol * 10, atol);

    cudaFree(d_db), cudaFree(d_dw), cudaFree(d_dx), cudaFree(d_dout), cudaFree(d_out);
    cudaFree(d_b), cudaFree(d_w), cudaFree(d_x);
    free(db), free(dw), free(dx), free(dout), free(out), free(b), free(w), free(x);
    kn_cuda_destroy(ctx);
}

Test(cuda_matmul, fp32_bias_aligned)
{
    need_gpu();
    matmul_case(64, 96, 192, 1, 0);
}

Test(cuda_matmul, fp32_odd_shapes_with_and_without_bias)
{
    need_gpu();
    matmul_case(37, 29, 53, 1, 0);
    matmul_case(37, 29, 53, 0, 0);
}

Test(cuda_matmul, tf32)
{
    need_gpu();
    matmul_case(256, 128, 384, 1, 1);
}

/* One context over several calls: the cuBLASLt plans (cached per shape, precision and the
 * pointers' alignment) give the reference's result on a repeated call, on pointers aligned
 * to 4 bytes only (one float off: the plan states that alignment, or the plain GEMM takes
 * over), and after switching to TF32 and back. */
Test(cuda_matmul, cached_plans_across_calls_alignments_and_precisions)
{
    need_gpu();
    kn_cuda_t *ctx = ctx_new(0);
    const int N = 64, C = 96, OC = 192;
    size_t nI = (size_t)N * C, nW = (size_t)C * OC, nO = (size_t)N * OC;
    float *x = randn(nI + 1, "x", 1), *w = randn(nW + 1, "w", 0.1f), *b = randn(OC + 1, "b", 1);
    float *out = zeros(nO + 1);
    float *d_x = upf(x, nI + 1), *d_w = upf(w, nW + 1), *d_b = upf(b, OC + 1);
    float *d_out = upf(out, nO + 1);
    const int tf32s[3] = {0, 1, 0};
    for (int k = 0; k < 3; k++) {
        kn_cuda_set_tf32(ctx, tf32s[k]);
        for (int off = 0; off < 2; off++) {
            for (int rep = 0; rep < 2; rep++) {
                cr_assert_eq(kn_cuda_matmul_fwd(ctx, d_out + off, d_x + off, d_w + off, d_b + off,
                                                N, C, OC, NULL),
                             0, "%s", kn_cuda_ctx_error(ctx));
                kn_matmul_fwd_ref(out, x + off, w + off, b + off, N, C, OC);
                check_dev("matmul out (cached plan)", d_out + off, out, nO, tf32s[k] ? 0.0 : 1e-5,
                          tf32s[k] ? 5e-3 : 1e-5);
            }
        }
    }
    cudaFree(d_out), cudaFree(d_b), cudaFree(d_w), cudaFree(d_x);
    free(out), free(b), free(w), free(x);
    kn_cuda_destroy(ctx);
}

// ----------------------------------------------------------------------------
// attention: materialised and fused against the reference; forward 1e-5, backward 1e-4

typedef struct att_case {
    int B, T, C, NH;
    float *qkv, *dout;     /* host inputs */
    float *out, *att;      /* reference forward */
    float *dqkv;           /* reference backward */
    float *d_qkv, *d_dout; /* device inputs */
} att_case_t;

static void att_setup(att_case_t *a, int B, int T, int C, int NH)
{
    memset(a, 0, sizeof *a);
    a->B = B, a->T = T, a->C = C, a->NH = NH;
    size_t nqkv = (size_t)B * T * 3 * C, nout = (size_t)B * T * C;
    a->qkv = randn(nqkv, "qkv", 1);
    a->dout = randn(nout, "dout", 1);
    a->out = zeros(nout);
    a->att = zeros((size_t)B * NH * T * T);
    a->dqkv = zeros(nqkv);
    kn_attention_fwd_ref(a->out, a->att, a->qkv, B, T, C, NH);
    kn_attention_bwd_ref(a->dqkv, a->dout, a->qkv, a->att, B, T, C, NH);
    a->d_qkv = upf(a->qkv, nqkv);
    a->d_dout = upf(a->dout, nout);
}

static void att_free(att_case_t *a)
{
    cudaFree(a->d_dout), cudaFree(a->d_qkv);
    free(a->dqkv), free(a->att), free(a->out), free(a->dout), free(a->qkv);
}

static void att_materialised(int B, int T, int C, int NH)
{
    att_case_t a;
    att_setup(&a, B, T, C, NH);
    kn_cuda_t *ctx = ctx_new(0);
    size_t nqkv = (size_t)B * T * 3 * C, nout = (size_t)B * T * C, natt = (size_t)B * NH * T * T;
    float *d_out = dev_alloc(nout * sizeof(float)), *d_att = dev_alloc(natt * sizeof(float));
    float *d_dqkv = dev_alloc(nqkv * sizeof(float));
    float *scratch = dev_alloc(KN_CUDA_ATT_BWD_SCRATCH(T, NH) * sizeof(float));

    cr_assert_eq(kn_cuda_attention_fwd(ctx, d_out, d_att, a.d_qkv, B, T, C, NH, NULL), 0, "%s",
                 kn_cuda_ctx_error(ctx));
    check_dev("attention out", d_out, a.out, nout, 1e-5, 1e-5);
    check_dev("attention att", d_att, a.att, natt, 1e-5, 1e-5);
    cr_assert_eq(
        kn_cuda_attention_bwd(ctx, d_dqkv, scratch, a.d_dout, a.d_qkv, d_att, B, T, C, NH, NULL), 0,
        "%s", kn_cuda_ctx_error(ctx));
    check_dev("attention dqkv", d_dqkv, a.dqkv, nqkv, 1e-4, 1e-5);
    /* the probabilities alone, one sequence at a time (the backend's recomputation under
     * selective): the forward's bits */
    float *d_p = dev_alloc((size_t)NH * T * T * sizeof(float)), *want = down(d_att, natt);
    for (int b = 0; b < B; b++) {
        cr_assert_eq(
            kn_cuda_attention_probs(ctx, d_p, a.d_qkv + (size_t)b * T * 3 * C, 1, T, C, NH, NULL),
            0, "%s", kn_cuda_ctx_error(ctx));
        float *got = down(d_p, (size_t)NH * T * T);
        assert_same("attention probs again", got, want + (size_t)b * NH * T * T,
                    (size_t)NH * T * T);
        free(got);
    }
    free(want), cudaFree(d_p);

    cudaFree(scratch), cudaFree(d_dqkv), cudaFree(d_att), cudaFree(d_out);
    kn_cuda_destroy(ctx);
    att_free(&a);
}

static void att_flash(int B, int T, int C, int NH)
{
    att_case_t a;
    att_setup(&a, B, T, C, NH);
    size_t nqkv = (size_t)B * T * 3 * C, nout = (size_t)B * T * C, nlse = (size_t)B * NH * T;
    int hs = C / NH;
    // lse of the scaled scores, from the reference's inputs, in double
    float *lse = zeros(nlse);
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            for (int t = 0; t < T; t++) {
                const float *q = a.qkv + ((size_t)b * T + t) * 3 * C + h * hs;
                double mx = -INFINITY, s[1024];
                cr_assert(T <= 1024);
                for (int j = 0; j <= t; j++) {
                    const float *k = a.qkv + ((size_t)b * T + j) * 3 * C + C + h * hs;
                    double d = 0.0;
                    for (int i = 0; i < hs; i++) {
                        d += (double)q[i] * k[i];
                    }
                    s[j] = d / sqrt((double)hs);
                    mx = fmax(mx, s[j]);
                }
                double sum = 0.0;
                for (int j = 0; j <= t; j++) {
                    sum += exp(s[j] - mx);
                }
                lse[((size_t)b * NH + h) * T + t] = (float)(mx + log(sum));
            }
        }
    }
    float *d_out = dev_alloc(nout * sizeof(float)), *d_lse = dev_alloc(nlse * sizeof(float));
    float *d_dqkv = dev_alloc(nqkv * sizeof(float));
    float *scratch = dev_alloc(KN_CUDA_FLASH_BWD_SCRATCH(B, T, NH) * sizeof(float));

    cr_assert_eq(kn_cuda_flash_attention_fwd(d_out, d_lse, a.d_qkv, B, T, C, NH, NULL), 0);
    check_dev("flash out", d_out, a.out, nout, 1e-5, 1e-5);
    check_dev("flash lse", d_lse, lse, nlse, 1e-5, 1e-6);
    cr_assert_eq(kn_cuda_flash_attention_bwd(d_dqkv, scratch, a.d_dout, a.d_qkv, d_out, d_lse, B, T,
                                             C, NH, NULL),
                 0);
    check_dev("flash dqkv", d_dqkv, a.dqkv, nqkv, 1e-4, 1e-5);

    cudaFree(scratch), cudaFree(d_dqkv), cudaFree(d_lse), cudaFree(d_out);
    free(lse);
    att_free(&a);
}

Test(cuda_attention, materialised_matches_reference)
{
    need_gpu();
    att_materialised(2, 37, 32, 4);
    att_materialised(1, 130, 128, 2);
}

Test(cuda_attention, fused_matches_reference_each_head_size)
{
    need_gpu();
    att_flash(2, 37, 32, 4);   /* hs 8: the 32-wide path, T not a tile multiple */
    att_flash(1, 130, 128, 2); /* hs 64 */
    att_flash(2, 45, 192, 2);  /* hs 96: the 128-wide path */
}

// ----------------------------------------------------------------------------
// gelu (1e-5 of the value, 1e-6 of the largest), residual (exact)

Test(cuda_elementwise, gelu_residual_and_scale)
{
    need_gpu();
    size_t n = 100003;
    float *x = randn(n, "x", 3), *dout = randn(n, "dout", 1), *y = zeros(n), *dx = zeros(n);
    x[0] = 30.0f, x[1] = -30.0f, x[2] = 0.0f;
    float *d_x = upf(x, n), *d_dout = upf(dout, n), *d_y = dev_alloc(n * sizeof(float));
    float *d_dx = dev_alloc(n * sizeof(float));

    cr_assert_eq(kn_cuda_gelu_fwd(d_y, d_x, n, NULL), 0);
    kn_gelu_fwd_ref(y, x, n);
    check_dev("gelu", d_y, y, n, 1e-5, 1e-6);
    cr_assert_eq(kn_cuda_gelu_bwd(d_dx, d_x, d_dout, n, NULL), 0);
    kn_gelu_bwd_ref(dx, x, dout, n);
    check_dev("gelu dinp", d_dx, dx, n, 1e-5, 1e-6);

    cr_assert_eq(kn_cuda_residual_fwd(d_y, d_x, d_dout, n, NULL), 0);
    kn_residual_fwd_ref(y, x, dout, n);
    check_dev("residual", d_y, y, n, 0, 0);
    cr_assert_eq(kn_cuda_residual_fwd(d_x, d_x, d_dout, n, NULL), 0); /* in place */
    check_dev("residual in place", d_x, y, n, 0, 0);

    /* clipping's scale: the host loop's single multiply, bit for bit */
    const float c = 0.3183099f;
    cr_assert_eq(kn_cuda_scale(d_x, c, n, NULL), 0);
    for (size_t i = 0; i < n; i++) {
        y[i] *= c;
    }
    check_dev("scale", d_x, y, n, 0, 0);

    cudaFree(d_dx), cudaFree(d_y), cudaFree(d_dout), cudaFree(d_x);
    free(dx), free(y), free(dout), free(x);
}

/* y += a x: kn_axpy's bits (two rounded operations, no FMA); a = 1 onto zeros gives x */
Test(cuda_elementwise, axpy_bit_identical_to_cpu)
{
    need_gpu();
    size_t n = 100003;
    float *x = randn(n, "x", 3), *y = randn(n, "y", 1), *z = zeros(n);
    float *d_x = upf(x, n), *d_y = upf(y, n), *d_z = upf(z, n);
    const float a = 0.3183099f;
    cr_assert_eq(kn_cuda_axpy(d_y, d_x, n, a, NULL), 0);
    kn_axpy(y, x, n, a);
    check_dev("axpy", d_y, y, n, 0, 0);
    cr_assert_eq(kn_cuda_axpy(d_y, d_x, n, -1.5f, NULL), 0); /* again, onto the result */
    kn_axpy(y, x, n, -1.5f);
    check_dev("axpy twice", d_y, y, n, 0, 0);
    cr_assert_eq(kn_cuda_axpy(d_z, d_x, n, 1.0f, NULL), 0);
    check_dev("axpy a = 1 onto zeros", d_z, x, n, 0, 0);
    cudaFree(d_z), cudaFree(d_y), cudaFree(d_x);
    free(z), free(y), free(x);
}

// ----------------------------------------------------------------------------
// the thread's last error: a stale "not yet" is no launch failure

static atomic_int hold_released;

/* A host function holding its stream until the test releases it (10 s at most). */
static void CUDART_CB hold_stream(void *arg)
{
    (void)arg;
    for (int i = 0; i < 10000 && !atomic_load(&hold_released); i++) {
        nanosleep(&(struct timespec){.tv_nsec = 1000000}, NULL);
    }
}

/* NCCL's request polls (workerd/coll/coll_nccl.c: cudaEventQuery on the training thread,
 * through the same libcudart) leave cudaErrorNotReady as the thread's last error while a
 * collective runs. The launchers that follow, a plain kernel and the CUB sort of the
 * encoder backward, must launch and compute as the CPU does: before kn_cu_launched cleared
 * a stale "not yet", both returned KN_E_CUDA and the backend failed the step. */
Test(cuda_errors, a_pending_event_query_fails_no_launch)
{
    need_gpu();
    int B = 2, T = 9, C = 40, V = 7, N = B * T;
    int32_t inp[2 * 9];
    for (int i = 0; i < N; i++) {
        inp[i] = (i * 5) % V;
    }
    size_t n = (size_t)N * C;
    float *x = randn(n, "x", 2), *y = zeros(n), *dwte = randn((size_t)V * C, "dwte0", 1);
    float *dwpe = randn((size_t)T * C, "dwpe0", 1);
    int32_t *d_inp = up(inp, sizeof inp);
    float *d_x = upf(x, n), *d_y = dev_alloc(n * sizeof(float));
    float *d_dwte = upf(dwte, (size_t)V * C), *d_dwpe = upf(dwpe, (size_t)T * C);
    void *scratch = dev_alloc(kn_cuda_encoder_bwd_scratch_bytes(B, T));
    cudaStream_t st = NULL;
    cudaEvent_t ev = NULL;
    cr_assert_eq(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), cudaSuccess);
    cr_assert_eq(cudaEventCreate(&ev), cudaSuccess);

    atomic_store(&hold_released, 0);
    cr_assert_eq(cudaLaunchHostFunc(st, hold_stream, NULL), cudaSuccess);
    cr_assert_eq(cudaEventRecord(ev, st), cudaSuccess);
    cr_assert_eq(cudaEventQuery(ev), cudaErrorNotReady, "the stream is held");
    cr_log_info("last error after the query: %s", cudaGetErrorName(cudaPeekAtLastError()));
    int rc_gelu = kn_cuda_gelu_fwd(d_y, d_x, n, st);
    cr_assert_eq(cudaEventQuery(ev), cudaErrorNotReady, "still held: a poll again");
    int rc_enc = kn_cuda_encoder_bwd(d_dwte, d_dwpe, scratch, d_x, d_inp, B, T, C, st);
    atomic_store(&hold_released, 1);
    cr_assert_eq(cudaStreamSynchronize(st), cudaSuccess);
    cr_assert_eq(rc_gelu, 0, "gelu after a pending event query: %d", rc_gelu);
    cr_assert_eq(rc_enc, 0, "encoder backward (CUB) after a pending event query: %d", rc_enc);

    kn_gelu_fwd_ref(y, x, n);
    check_dev("gelu after the query", d_y, y, n, 1e-5, 1e-6);
    kn_encoder_bwd_ref(dwte, dwpe, x, inp, B, T, C);
    check_dev("dwte after the query", d_dwte, dwte, (size_t)V * C, 0, 0);
    check_dev("dwpe after the query", d_dwpe, dwpe, (size_t)T * C, 0, 0);

    cudaEventDestroy(ev), cudaStreamDestroy(st);
    cudaFree(scratch), cudaFree(d_dwpe), cudaFree(d_dwte), cudaFree(d_y), cudaFree(d_x);
    cudaFree(d_inp);
    free(dwpe), free(dwte), free(y), free(x);
}

// ----------------------------------------------------------------------------
// LM head + cross-entropy: 1e-5 (forward) / 1e-4 (backward); fused == split, bit for bit

Test(cuda_xent, split_and_fused_match_reference)
{
    need_gpu();
    kn_cuda_t *ctx = ctx_new(0);
    int N = 13, C = 24, V = 50, Vp = 64;
    float scale = 1.0f / N;
    int32_t targets[13];
    for (int n = 0; n < N; n++) {
        targets[n] = (n * 17 + 3) % V;
    }
    targets[0] = V - 1;
    float *x = randn((size_t)N * C, "x", 1), *wte = randn((size_t)Vp * C, "wte", 1);
    for (size_t i = (size_t)V * C; i < (size_t)Vp * C; i++) {
        wte[i] = 0.0f; /* padded rows are zero, as in the model */
    }
    float *logits = zeros((size_t)N * Vp), *lse = zeros(N), *losses = zeros(N);
    float *dx = zeros((size_t)N * C), *dwte = randn((size_t)Vp * C, "dwte0", 1);

    int32_t *d_t = up(targets, sizeof targets);
    float *d_x = upf(x, (size_t)N * C), *d_wte = upf(wte, (size_t)Vp * C);
    float *d_logits = dev_alloc((size_t)N * Vp * sizeof(float)), *d_lse = dev_alloc(N * 4);
    float *d_losses = dev_alloc(N * 4), *d_dx = dev_alloc((size_t)N * C * 4);
    float *d_dwte = upf(dwte, (size_t)Vp * C);

    cr_assert_eq(
        kn_cuda_lmhead_fwd(ctx, d_logits, d_lse, d_losses, d_x, d_wte, d_t, N, C, V, Vp, NULL), 0,
        "%s", kn_cuda_ctx_error(ctx));
    kn_lmhead_fwd_ref(logits, lse, losses, x, wte, targets, N, C, V, Vp);
    check_dev("logits", d_logits, logits, (size_t)N * Vp, 1e-5, 1e-5);
    check_dev("lse", d_lse, lse, N, 1e-5, 1e-6);
    check_dev("losses", d_losses, losses, N, 1e-5, 1e-6);

    cr_assert_eq(kn_cuda_lmhead_bwd(ctx, d_dx, d_dwte, d_logits, d_lse, d_x, d_wte, d_t, scale, N,
                                    C, V, Vp, NULL),
                 0, "%s", kn_cuda_ctx_error(ctx));
    float *split_dx = down(d_dx, (size_t)N * C), *split_dwte = down(d_dwte, (size_t)Vp * C);
    float *split_dlogits = down(d_logits, (size_t)N * Vp);
    kn_lmhead_bwd_ref(dx, dwte, logits, lse, x, wte, targets, scale, N, C, V, Vp);
    assert_close("dx", split_dx, dx, (size_t)N * C, 1e-4, 1e-5);
    assert_close("dwte", split_dwte, dwte, (size_t)Vp * C, 1e-4, 1e-5);

    // the fused classifier, from the same starting dwte, gives the same bits
    float *dwte0 = randn((size_t)Vp * C, "dwte0", 1);
    cr_assert_eq(cudaMemcpy(d_dwte, dwte0, (size_t)Vp * C * 4, cudaMemcpyHostToDevice),
                 cudaSuccess);
    float *split_lse = down(d_lse, N), *split_losses = down(d_losses, N);
    cr_assert_eq(kn_cuda_lmhead_fused(ctx, d_dx, d_dwte, d_logits, d_lse, d_losses, d_x, d_wte, d_t,
                                      scale, N, C, V, Vp, NULL),
                 0, "%s", kn_cuda_ctx_error(ctx));
    check_dev("fused lse", d_lse, split_lse, N, 0, 0);
    check_dev("fused losses", d_losses, split_losses, N, 0, 0);
    check_dev("fused dlogits", d_logits, split_dlogits, (size_t)N * Vp, 0, 0);
    check_dev("fused dx", d_dx, split_dx, (size_t)N * C, 0, 0);
    check_dev("fused dwte", d_dwte, split_dwte, (size_t)Vp * C, 0, 0);

    cudaFree(d_dwte), cudaFree(d_dx), cudaFree(d_losses), cudaFree(d_lse), cudaFree(d_logits);
    cudaFree(d_wte), cudaFree(d_x), cudaFree(d_t);
    free(split_losses), free(split_lse), free(dwte0), free(split_dlogits), free(split_dwte);
    free(split_dx), free(dwte), free(dx), free(losses), free(lse), free(logits), free(wte), free(x);
    kn_cuda_destroy(ctx);
}

/* The unscaled fused head (kn_lmhead_fwdbwd's contract) over two chunks of rows: the first
 * overwrites dwte (acc 0: a NaN-filled buffer comes out clean), the second accumulates. CPU
 * tolerances as the split head's; the second chunk against kn_cuda_lmhead_fused at scale 1
 * from the same dwte, bit for bit (the same kernels). Padded rows of dwte are not touched. */
Test(cuda_xent, fwdbwd_unscaled_two_chunks)
{
    need_gpu();
    kn_cuda_t *ctx = ctx_new(0);
    int N = 13, C = 24, V = 50, Vp = 64, N1 = 8, N2 = N - N1;
    int32_t targets[13];
    for (int n = 0; n < N; n++) {
        targets[n] = (n * 29 + 5) % V;
    }
    targets[3] = V - 1;
    float *x = randn((size_t)N * C, "x", 1), *wte = randn((size_t)Vp * C, "wte", 1);
    for (size_t i = (size_t)V * C; i < (size_t)Vp * C; i++) {
        wte[i] = 0.0f;
    }
    size_t nw = (size_t)Vp * C;
    float *logits = zeros((size_t)N * Vp), *lse = zeros(N), *losses = zeros(N);
    float *dx = zeros((size_t)N * C), *dwte = zeros(nw);
    for (size_t i = 0; i < nw; i++) {
        dwte[i] = i < (size_t)V * C ? NAN : 7.0f; /* acc 0 must not read; padded rows sentinels */
    }

    int32_t *d_t = up(targets, sizeof targets);
    float *d_x = upf(x, (size_t)N * C), *d_wte = upf(wte, nw), *d_dwte = upf(dwte, nw);
    float *d_logits = dev_alloc((size_t)N * Vp * sizeof(float)), *d_lse = dev_alloc(N * 4);
    float *d_losses = dev_alloc(N * 4), *d_dx = dev_alloc((size_t)N * C * 4);

    // chunk 1 (rows 0..N1), acc 0
    cr_assert_eq(kn_cuda_lmhead_fwdbwd(ctx, d_dx, d_dwte, d_logits, d_lse, d_losses, d_x, d_wte,
                                       d_t, 0, N1, C, V, Vp, NULL),
                 0, "%s", kn_cuda_ctx_error(ctx));
    kn_lmhead_fwdbwd(dx, dwte, logits, lse, losses, x, wte, targets, 0, N1, C, V, Vp);
    check_dev("chunk 1 lse", d_lse, lse, N1, 1e-5, 1e-6);
    check_dev("chunk 1 losses", d_losses, losses, N1, 1e-5, 1e-6);
    check_dev("chunk 1 G", d_logits, logits, (size_t)N1 * Vp, 1e-4, 1e-5);
    check_dev("chunk 1 dx", d_dx, dx, (size_t)N1 * C, 1e-4, 1e-5);
    check_dev("chunk 1 dwte", d_dwte, dwte, nw, 1e-4, 1e-5);

    // chunk 2 (rows N1..N), acc 1; first the fused classifier at scale 1 from the same dwte
    float *dwte1 = down(d_dwte, nw);
    float *d_dwte_f = upf(dwte1, nw), *d_dx_f = dev_alloc((size_t)N2 * C * 4);
    float *d_logits_f = dev_alloc((size_t)N2 * Vp * sizeof(float));
    float *d_lse_f = dev_alloc(N2 * 4), *d_losses_f = dev_alloc(N2 * 4);
    cr_assert_eq(kn_cuda_lmhead_fused(ctx, d_dx_f, d_dwte_f, d_logits_f, d_lse_f, d_losses_f,
                                      d_x + (size_t)N1 * C, d_wte, d_t + N1, 1.0f, N2, C, V, Vp,
                                      NULL),
                 0, "%s", kn_cuda_ctx_error(ctx));
    cr_assert_eq(kn_cuda_lmhead_fwdbwd(ctx, d_dx + (size_t)N1 * C, d_dwte, d_logits, d_lse + N1,
                                       d_losses + N1, d_x + (size_t)N1 * C, d_wte, d_t + N1, 1, N2,
                                       C, V, Vp, NULL),
                 0, "%s", kn_cuda_ctx_error(ctx));
    kn_lmhead_fwdbwd(dx + (size_t)N1 * C, dwte, logits, lse + N1, losses + N1, x + (size_t)N1 * C,
                     wte, targets + N1, 1, N2, C, V, Vp);
    check_dev("lse", d_lse, lse, N, 1e-5, 1e-6);
    check_dev("losses", d_losses, losses, N, 1e-5, 1e-6);
    check_dev("dx", d_dx, dx, (size_t)N * C, 1e-4, 1e-5);
    check_dev("dwte", d_dwte, dwte, nw, 1e-4, 1e-5);
    float *got_dwte = down(d_dwte, nw);
    for (size_t i = (size_t)V * C; i < nw; i++) {
        cr_assert(got_dwte[i] == 7.0f, "padded dwte[%zu] touched: %.9g", i, got_dwte[i]);
    }
    float *fused_dwte = down(d_dwte_f, nw), *fused_dx = down(d_dx_f, (size_t)N2 * C);
    float *fused_g = down(d_logits_f, (size_t)N2 * Vp);
    assert_same("fwdbwd dwte vs fused", got_dwte, fused_dwte, nw);
    check_dev("fwdbwd dx vs fused", d_dx + (size_t)N1 * C, fused_dx, (size_t)N2 * C, 0, 0);
    check_dev("fwdbwd G vs fused", d_logits, fused_g, (size_t)N2 * Vp, 0, 0);

    cudaFree(d_losses_f), cudaFree(d_lse_f), cudaFree(d_logits_f), cudaFree(d_dx_f);
    cudaFree(d_dwte_f), cudaFree(d_dx), cudaFree(d_losses), cudaFree(d_logits), cudaFree(d_lse);
    cudaFree(d_dwte), cudaFree(d_wte), cudaFree(d_x), cudaFree(d_t);
    free(fused_g), free(fused_dx), free(fused_dwte), free(got_dwte), free(dwte1);
    free(dwte), free(dx), free(losses), free(lse), free(logits), free(wte), free(x);
    kn_cuda_destroy(ctx);
}

// ----------------------------------------------------------------------------
// AdamW: bit-identical to the fast CPU kernel over three steps; sum of squares 1e-12

Test(cuda_optim, adamw_bit_identical_to_cpu)
{
    need_gpu();
    size_t n = 4099;
    float *p = randn(n, "p", 1), *g = randn(n, "g", 1), *m = zeros(n), *v = zeros(n);
    float *d_p = upf(p, n), *d_g = upf(g, n), *d_m = upf(m, n), *d_v = upf(v, n);
    for (uint64_t t = 1; t <= 3; t++) {
        cr_assert_eq(kn_cuda_adamw(d_p, d_g, d_m, d_v, n, 6e-4, 0.9, 0.95, 1e-8, 0.1, t, NULL), 0);
        kn_adamw(p, g, m, v, n, 6e-4, 0.9, 0.95, 1e-8, 0.1, t);
    }
    check_dev("adamw p", d_p, p, n, 0, 0);
    check_dev("adamw m", d_m, m, n, 0, 0);
    check_dev("adamw v", d_v, v, n, 0, 0);
    cudaFree(d_v), cudaFree(d_m), cudaFree(d_g), cudaFree(d_p);
    free(v), free(m), free(g), free(p);
}

/* The fused step (clip scale, update, gradient reset): kn_adamw_fused's bits over three
 * steps (scale 1 without reset, a clip with reset, a clip without), g included; and equal
 * to kn_cuda_scale then kn_cuda_adamw on the GPU. */
Test(cuda_optim, adamw_fused_bit_identical_to_cpu)
{
    need_gpu();
    size_t n = 4099;
    float *p = randn(n, "p", 1), *g = randn(n, "g", 1), *m = zeros(n), *v = zeros(n);
    float *d_p = upf(p, n), *d_g = upf(g, n), *d_m = upf(m, n), *d_v = upf(v, n);
    /* the unfused twin on the GPU: scale, then the plain kernel */
    float *d_p2 = upf(p, n), *d_g2 = upf(g, n), *d_m2 = upf(m, n), *d_v2 = upf(v, n);
    const float gscale[3] = {1.0f, 0.3183099f, 0.71f};
    const int zero_g[3] = {0, 1, 0};
    for (uint64_t t = 1; t <= 3; t++) {
        float c = gscale[t - 1];
        int z = zero_g[t - 1];
        if (t == 3) { /* the reset gradient refilled, as a backward would */
            free(g);
            g = randn(n, "g3", 2);
            cr_assert_eq(cudaMemcpy(d_g, g, n * 4, cudaMemcpyHostToDevice), cudaSuccess);
            cr_assert_eq(cudaMemcpy(d_g2, g, n * 4, cudaMemcpyHostToDevice), cudaSuccess);
        }
        cr_assert_eq(
            kn_cuda_adamw_fused(d_p, d_g, d_m, d_v, n, 6e-4, 0.9, 0.95, 1e-8, 0.1, t, c, z, NULL),
            0);
        cr_assert_eq(kn_cuda_scale(d_g2, c, n, NULL), 0);
        cr_assert_eq(kn_cuda_adamw(d_p2, d_g2, d_m2, d_v2, n, 6e-4, 0.9, 0.95, 1e-8, 0.1, t, NULL),
                     0);
        kn_adamw_fused(p, g, m, v, n, 6e-4, 0.9, 0.95, 1e-8, 0.1, t, c, z);
        check_dev("adamw_fused g", d_g, g, n, 0, 0);
        if (z) {
            for (size_t i = 0; i < n; i++) {
                cr_assert(g[i] == 0.0f, "the CPU kernel left g[%zu] = %g", i, g[i]);
            }
        }
    }
    check_dev("adamw_fused p", d_p, p, n, 0, 0);
    check_dev("adamw_fused m", d_m, m, n, 0, 0);
    check_dev("adamw_fused v", d_v, v, n, 0, 0);
    check_dev("scale + adamw p", d_p2, p, n, 0, 0);
    check_dev("scale + adamw m", d_m2, m, n, 0, 0);
    check_dev("scale + adamw v", d_v2, v, n, 0, 0);
    cudaFree(d_v2), cudaFree(d_m2), cudaFree(d_g2), cudaFree(d_p2);
    cudaFree(d_v), cudaFree(d_m), cudaFree(d_g), cudaFree(d_p);
    free(v), free(m), free(g), free(p);
}

Test(cuda_optim, sumsq_matches_reference)
{
    need_gpu();
    size_t n = ((size_t)1 << 20) + 7;
    float *x = randn(n, "x", 1);
    float *d_x = upf(x, n);
    double *d_out = dev_alloc(sizeof(double));
    double *scratch = dev_alloc(KN_CUDA_SUMSQ_PARTIALS * sizeof(double));
    double want = kn_sumsq_ref(x, n), got = 0.0, got2 = 0.0;

    cr_assert_eq(kn_cuda_sumsq(d_out, scratch, d_x, n, 0, NULL), 0);
    cr_assert_eq(cudaMemcpy(&got, d_out, sizeof got, cudaMemcpyDeviceToHost), cudaSuccess);
    cr_assert(fabs(got - want) <= 1e-12 * want, "sumsq %.17g want %.17g", got, want);
    cr_assert_eq(kn_cuda_sumsq(d_out, scratch, d_x, 5, 1, NULL), 0); /* accumulate */
    cr_assert_eq(cudaMemcpy(&got2, d_out, sizeof got2, cudaMemcpyDeviceToHost), cudaSuccess);
    double want2 = got + kn_sumsq_ref(x, 5);
    cr_assert(fabs(got2 - want2) <= 1e-12 * want2, "accumulated %.17g want %.17g", got2, want2);

    cudaFree(scratch), cudaFree(d_out), cudaFree(d_x);
    free(x);
}

/* Two micro-batches' losses summed on the device as the CPU sums them (kn_loss_mean each,
 * added in double): the block's order of the double sums, equal to the float they round to
 * within an ulp. */
Test(cuda_optim, loss_acc_matches_reference)
{
    need_gpu();
    size_t n = 4096 + 3;
    float *l = randn(2 * n, "losses", 1);
    for (size_t i = 0; i < 2 * n; i++)
        l[i] = fabsf(l[i]) + 1.0f;
    float *d_l = upf(l, 2 * n);
    double *d_acc = dev_alloc(sizeof(double)), got = 0.0;
    cr_assert_eq(cudaMemset(d_acc, 0, sizeof(double)), cudaSuccess);
    cr_assert_eq(kn_cuda_loss_acc(d_acc, d_l, n, NULL), 0);
    cr_assert_eq(kn_cuda_loss_acc(d_acc, d_l + n, n, NULL), 0);
    cr_assert_eq(cudaMemcpy(&got, d_acc, sizeof got, cudaMemcpyDeviceToHost), cudaSuccess);
    double want = (double)kn_loss_mean(l, n) + (double)kn_loss_mean(l + n, n);
    cr_assert(fabs(got - want) <= 2.5e-7 * want, "loss sum %.17g want %.17g", got, want);
    cudaFree(d_acc), cudaFree(d_l);
    free(l);
}

// ----------------------------------------------------------------------------
// vocab-parallel embedding and cross-entropy (kernels/tp.h) against the CPU loops: the
// embedding and the row max bit for bit; the sums of exponentials (a tree of the same double
// terms, then float) 1e-6 relative, the target's logit exact; lse and losses (CUDA's logf)
// 1e-6; dlogits (CUDA's expf) 1e-6 relative + 1e-6 of the largest, padded columns exactly 0.

Test(cuda_tp, embedding_bit_identical_on_a_slice)
{
    need_gpu();
    int B = 3, T = 17, C = 45, V = 11, v0 = 4, Vl = 5, N = B * T;
    int32_t inp[3 * 17];
    for (int i = 0; i < N; i++) {
        inp[i] = (i * 7 + i / 5) % V; /* in and out of the slice, repeated */
    }
    inp[4] = inp[5] = inp[6] = 6;
    float *wte = randn((size_t)Vl * C, "wte", 1), *wpe = randn((size_t)T * C, "wpe", 1);
    float *dout = randn((size_t)N * C, "dout", 1);
    float *dwte = randn((size_t)Vl * C, "dwte0", 1), *dwpe = randn((size_t)T * C, "dwpe0", 1);
    float *out = zeros((size_t)N * C);

    int32_t *d_inp = up(inp, sizeof inp);
    float *d_wte = upf(wte, (size_t)Vl * C), *d_wpe = upf(wpe, (size_t)T * C);
    float *d_out = dev_alloc((size_t)N * C * sizeof(float));
    float *d_dout = upf(dout, (size_t)N * C);
    float *d_dwte = upf(dwte, (size_t)Vl * C), *d_dwpe = upf(dwpe, (size_t)T * C);
    void *scratch = dev_alloc(kn_cuda_encoder_bwd_scratch_bytes(B, T));

    for (int with_pos = 1; with_pos >= 0; with_pos--) {
        cr_assert_eq(kn_cuda_tp_embed_fwd(d_out, d_inp, d_wte, with_pos ? d_wpe : NULL, v0, Vl, B,
                                          T, C, NULL),
                     0);
        kn_tp_embed_fwd(out, inp, wte, with_pos ? wpe : NULL, v0, Vl, B, T, C);
        check_dev(with_pos ? "tp embedding with positions" : "tp embedding", d_out, out,
                  (size_t)N * C, 0, 0);
        cr_assert_eq(
            kn_cuda_tp_embed_bwd(d_dwte, d_dwpe, scratch, d_dout, d_inp, v0, Vl, B, T, C, NULL), 0);
        kn_tp_embed_bwd(dwte, dwpe, dout, inp, v0, Vl, B, T, C);
        check_dev("tp dwte", d_dwte, dwte, (size_t)Vl * C, 0, 0);
        check_dev("tp dwpe", d_dwpe, dwpe, (size_t)T * C, 0, 0);
    }

    cudaFree(scratch), cudaFree(d_dwpe), cudaFree(d_dwte), cudaFree(d_dout), cudaFree(d_out);
    cudaFree(d_wpe), cudaFree(d_wte), cudaFree(d_inp);
    free(out), free(dwpe), free(dwte), free(dout), free(wpe), free(wte);
}

/* A slice wider than a block's threads; `valid` all of it (a first rank) or part of it (the
 * last rank, padding after the real vocab). Each entry gets the CPU's inputs, so each is
 * checked on its own. */
static void tp_xent_case(int v0, int Vl, int valid)
{
    int N = 37;
    float scale = 1.0f / 64;
    int32_t targets[37];
    for (int n = 0; n < N; n++) {
        targets[n] = v0 + (n * 131 + 7) % (valid + 40) - 20; /* in the slice and either side */
        targets[n] = targets[n] < 0 ? 0 : targets[n];
    }
    targets[0] = v0 + valid - 1;
    targets[1] = v0;
    float *logits = randn((size_t)N * Vl, "tp logits", 3);
    float *mx = zeros(N), *sum = zeros(N), *tl = zeros(N), *lse = zeros(N), *losses = zeros(N);

    int32_t *d_t = up(targets, sizeof targets);
    float *d_logits = upf(logits, (size_t)N * Vl);
    float *d_mx = dev_alloc(N * 4), *d_sum = dev_alloc(N * 4), *d_tl = dev_alloc(N * 4);
    float *d_lse = dev_alloc(N * 4), *d_losses = dev_alloc(N * 4);

    cr_assert_eq(kn_cuda_tp_xent_max(d_mx, d_logits, N, Vl, valid, NULL), 0);
    kn_tp_xent_max(mx, logits, N, Vl, valid);
    check_dev("tp max", d_mx, mx, N, 0, 0);

    cr_assert_eq(kn_cuda_tp_xent_sums(d_sum, d_tl, d_logits, d_mx, d_t, v0, N, Vl, valid, NULL), 0);
    kn_tp_xent_sums(sum, tl, logits, mx, targets, v0, N, Vl, valid);
    check_dev("tp sums", d_sum, sum, N, 1e-6, 0);
    check_dev("tp target logits", d_tl, tl, N, 0, 0);

    float *d_sum_cpu = upf(sum, N);
    cr_assert_eq(kn_cuda_tp_xent_finish(d_lse, d_losses, d_mx, d_sum_cpu, d_tl, N, NULL), 0);
    kn_tp_xent_finish(lse, losses, mx, sum, tl, N);
    check_dev("tp lse", d_lse, lse, N, 1e-6, 1e-7);
    check_dev("tp losses", d_losses, losses, N, 1e-6, 1e-6);

    float *d_lse_cpu = upf(lse, N);
    cr_assert_eq(kn_cuda_tp_xent_bwd(d_logits, d_lse_cpu, d_t, scale, v0, N, Vl, valid, NULL), 0);
    kn_tp_xent_bwd(logits, lse, targets, scale, v0, N, Vl, valid);
    float *got = down(d_logits, (size_t)N * Vl);
    assert_close("tp dlogits", got, logits, (size_t)N * Vl, 1e-6, 1e-6);
    for (int n = 0; n < N; n++) {
        for (int j = valid; j < Vl; j++) {
            cr_assert(got[(size_t)n * Vl + j] == 0.0f && !signbit(got[(size_t)n * Vl + j]),
                      "padded column %d of row %d: %g", j, n, got[(size_t)n * Vl + j]);
        }
    }

    free(got);
    cudaFree(d_lse_cpu), cudaFree(d_sum_cpu), cudaFree(d_losses), cudaFree(d_lse);
    cudaFree(d_tl), cudaFree(d_sum), cudaFree(d_mx), cudaFree(d_logits), cudaFree(d_t);
    free(losses), free(lse), free(tl), free(sum), free(mx), free(logits);
}

Test(cuda_tp, cross_entropy_matches_the_cpu_loops)
{
    need_gpu();
    tp_xent_case(0, 1000, 1000);
    tp_xent_case(3000, 1000, 777);
}

// ----------------------------------------------------------------------------
// bf16 (issue 23): the cast kernel against kernels/bf16.h, and the matmuls on bf16 operands
// against the CPU's fp32 reference on the same (bf16-valued) inputs

Test(cuda_bf16, round_matches_the_cpu_bit_for_bit)
{
    need_gpu();
    enum { N = 4096 };
    float *x = randn(N, "bf16 x", 3), *y = zeros(N);
    /* the hand cases of test_bf16.c: ties both ways, subnormals, overflow, infinities */
    const uint32_t special[] = {0x3f808000u, 0x3f818000u, 0x3f807fffu, 0x00008000u,
                                0x00018000u, 0x007fffffu, 0x7f7fffffu, 0x7f7f7fffu,
                                0x7f800000u, 0xff800000u, 0x80000000u, 0x3fff8000u};
    for (size_t i = 0; i < sizeof special / sizeof special[0]; i++)
        x[i] = kn_f32_of_bits(special[i]);
    for (size_t i = 64; i < N; i += 7)
        x[i] *= 1e-39f; /* subnormals */
    float *d = upf(x, N);
    cr_assert_eq(kn_cuda_bf16_round(d, d, N, NULL), 0);
    cr_assert_eq(cudaMemcpy(y, d, N * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    for (size_t i = 0; i < N; i++)
        cr_expect_eq(kn_f32_bits(y[i]), kn_f32_bits(kn_bf16_round1(x[i])), "element %zu", i);
    cudaFree(d);
    free(y), free(x);
}

/* The message casts (a bf16 collective's pack and unpack): pack is kn_bf16_pack's bits, and
 * unpacking gives them back widened, every value of the round test (NaN: any NaN). */
Test(cuda_bf16, pack_and_unpack_match_the_cpu)
{
    need_gpu();
    enum { N = 4099 };
    float *x = randn(N, "bf16 pack x", 5), *y = zeros(N);
    x[0] = kn_f32_of_bits(0x3f808000u), x[1] = kn_f32_of_bits(0x3f818000u);
    x[2] = kn_f32_of_bits(0x7f7fffffu), x[3] = kn_f32_of_bits(0x00008000u);
    kn_bf16_t *want = malloc(N * sizeof *want), *got = malloc(N * sizeof *got);
    kn_bf16_pack(want, x, N);
    float *d = upf(x, N), *w = zeros(N);
    void *h = NULL;
    cr_assert_eq(cudaMalloc(&h, N * sizeof(kn_bf16_t)), cudaSuccess);
    cr_assert_eq(kn_cuda_bf16_pack(h, d, N, NULL), 0);
    cr_assert_eq(cudaMemcpy(got, h, N * sizeof *got, cudaMemcpyDeviceToHost), cudaSuccess);
    for (size_t i = 0; i < N; i++)
        cr_expect_eq(got[i], want[i], "element %zu: %04x, want %04x", i, got[i], want[i]);
    cr_assert_eq(kn_cuda_bf16_unpack(d, h, N, NULL), 0);
    cr_assert_eq(cudaMemcpy(y, d, N * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    kn_bf16_unpack(w, want, N);
    for (size_t i = 0; i < N; i++)
        cr_expect_eq(kn_f32_bits(y[i]), kn_f32_bits(w[i]), "element %zu", i);
    cudaFree(h), cudaFree(d);
    free(w), free(got), free(want), free(y), free(x);
}

Test(cuda_bf16, matmul_on_bf16_operands)
{
    need_gpu();
    const int N = 64, C = 96, OC = 160;
    kn_cuda_t *ctx = ctx_new(0);
    kn_cuda_set_bf16(ctx, 1);
    size_t nI = (size_t)N * C, nW = (size_t)C * OC, nO = (size_t)N * OC;
    float *x = randn(nI, "x16", 1), *w = randn(nW, "w16", 0.1f), *b = randn(OC, "b16", 1);
    float *dout = randn(nO, "dout16", 1), *out = zeros(nO), *dx = zeros(nI), *dw = zeros(nW);
    float *db = zeros(OC);
    kn_bf16_round(x, nI), kn_bf16_round(w, nW), kn_bf16_round(b, OC), kn_bf16_round(dout, nO);
    float *d_x = upf(x, nI), *d_w = upf(w, nW), *d_b = upf(b, OC), *d_out = upf(out, nO);
    float *d_dout = upf(dout, nO), *d_dx = upf(dx, nI), *d_dw = upf(dw, nW), *d_db = upf(db, OC);
    cr_assert_eq(kn_cuda_matmul_fwd(ctx, d_out, d_x, d_w, d_b, N, C, OC, NULL), 0, "%s",
                 kn_cuda_ctx_error(ctx));
    kn_matmul_fwd_ref(out, x, w, b, N, C, OC);
    /* bf16 products are exact in fp32: only the summation order differs */
    check_dev("bf16 matmul out", d_out, out, nO, 1e-5, 1e-5);
    cr_assert_eq(kn_cuda_matmul_bwd(ctx, d_dx, d_dw, d_db, d_dout, d_x, d_w, N, C, OC, NULL), 0,
                 "%s", kn_cuda_ctx_error(ctx));
    kn_matmul_bwd_ref(dx, dw, db, dout, x, w, N, C, OC);
    check_dev("bf16 matmul dinp", d_dx, dx, nI, 1e-4, 1e-5);
    check_dev("bf16 matmul dweight", d_dw, dw, nW, 1e-4, 1e-5);
    check_dev("bf16 matmul dbias", d_db, db, OC, 1e-4, 1e-5);
    cudaFree(d_db), cudaFree(d_dw), cudaFree(d_dx), cudaFree(d_dout), cudaFree(d_out);
    cudaFree(d_b), cudaFree(d_w), cudaFree(d_x);
    free(db), free(dw), free(dx), free(out), free(dout), free(b), free(w), free(x);
    kn_cuda_destroy(ctx);
}

/* The parameters' working copy (kn_cuda_set_weights16): a matmul whose weight lies in the
 * registered fp32 range reads the bf16 copy, not the fp32 values. The copy here holds another
 * matrix (w2), so the results must be w2's bits, and w's again once the copy is dropped. */
Test(cuda_bf16, matmul_reads_the_working_copy)
{
    need_gpu();
    const int N = 32, C = 64, OC = 96;
    kn_cuda_t *ctx = ctx_new(0);
    kn_cuda_set_bf16(ctx, 1);
    size_t nI = (size_t)N * C, nW = (size_t)C * OC, nO = (size_t)N * OC;
    float *x = randn(nI, "xw", 1), *w = randn(nW, "ww", 0.1f), *w2 = randn(nW, "ww2", 0.1f);
    float *dout = randn(nO, "doutw", 1);
    kn_bf16_round(x, nI), kn_bf16_round(w, nW), kn_bf16_round(w2, nW), kn_bf16_round(dout, nO);
    float *d_x = upf(x, nI), *d_w = upf(w, nW), *d_w2 = upf(w2, nW), *d_dout = upf(dout, nO);
    float *d_out = upf(zeros(nO), nO), *d_dx = upf(zeros(nI), nI);
    float *d_out2 = upf(zeros(nO), nO), *d_dx2 = upf(zeros(nI), nI);
    uint16_t *w16 = NULL;
    cr_assert_eq(cudaMalloc((void **)&w16, nW * sizeof *w16), cudaSuccess);
    cr_assert_eq(kn_cuda_bf16_pack(w16, d_w2, nW, NULL), 0);
    /* w2 plainly, then w through the copy of w2 */
    cr_assert_eq(kn_cuda_matmul_fwd(ctx, d_out2, d_x, d_w2, NULL, N, C, OC, NULL), 0);
    cr_assert_eq(kn_cuda_matmul_bwd(ctx, d_dx2, NULL, NULL, d_dout, NULL, d_w2, N, C, OC, NULL), 0);
    kn_cuda_set_weights16(ctx, d_w, w16, nW);
    cr_assert_eq(kn_cuda_matmul_fwd(ctx, d_out, d_x, d_w, NULL, N, C, OC, NULL), 0, "%s",
                 kn_cuda_ctx_error(ctx));
    cr_assert_eq(kn_cuda_matmul_bwd(ctx, d_dx, NULL, NULL, d_dout, NULL, d_w, N, C, OC, NULL), 0);
    assert_same("out from the copy", down(d_out, nO), down(d_out2, nO), nO);
    assert_same("dinp from the copy", down(d_dx, nI), down(d_dx2, nI), nI);
    /* dropped: w's own values again (fp32 reference on the same bf16 values) */
    kn_cuda_set_weights16(ctx, NULL, NULL, 0);
    cr_assert_eq(kn_cuda_matmul_fwd(ctx, d_out, d_x, d_w, NULL, N, C, OC, NULL), 0);
    float *out = zeros(nO);
    kn_matmul_fwd_ref(out, x, w, NULL, N, C, OC);
    check_dev("out after the copy is dropped", d_out, out, nO, 1e-5, 1e-5);
    cudaFree(w16), cudaFree(d_dx2), cudaFree(d_out2), cudaFree(d_dx), cudaFree(d_out);
    cudaFree(d_dout), cudaFree(d_w2), cudaFree(d_w), cudaFree(d_x);
    free(out), free(dout), free(w2), free(w), free(x);
    kn_cuda_destroy(ctx);
}

/* Under bf16 the LM head's logits GEMM runs on TF32 tensor cores: exact on bf16 values (TF32
 * holds them), so the logits match the fp32 reference as closely as the fp32 GEMM's do. */
Test(cuda_bf16, lmhead_logits_exact_on_bf16_values)
{
    need_gpu();
    const int N = 40, C = 64, V = 500, Vp = 512;
    kn_cuda_t *ctx = ctx_new(0);
    kn_cuda_set_bf16(ctx, 1);
    int32_t targets[40];
    for (int n = 0; n < N; n++) {
        targets[n] = (n * 37 + 5) % V;
    }
    float *x = randn((size_t)N * C, "xh", 1), *wte = randn((size_t)Vp * C, "wteh", 1);
    for (size_t i = (size_t)V * C; i < (size_t)Vp * C; i++) {
        wte[i] = 0.0f;
    }
    kn_bf16_round(x, (size_t)N * C), kn_bf16_round(wte, (size_t)Vp * C);
    float *logits = zeros((size_t)N * Vp), *lse = zeros(N), *losses = zeros(N);
    int32_t *d_t = up(targets, sizeof targets);
    float *d_x = upf(x, (size_t)N * C), *d_wte = upf(wte, (size_t)Vp * C);
    float *d_logits = dev_alloc((size_t)N * Vp * 4), *d_lse = dev_alloc(N * 4);
    float *d_losses = dev_alloc(N * 4);
    cr_assert_eq(
        kn_cuda_lmhead_fwd(ctx, d_logits, d_lse, d_losses, d_x, d_wte, d_t, N, C, V, Vp, NULL), 0,
        "%s", kn_cuda_ctx_error(ctx));
    kn_lmhead_fwd_ref(logits, lse, losses, x, wte, targets, N, C, V, Vp);
    check_dev("bf16 head logits", d_logits, logits, (size_t)N * Vp, 1e-5, 1e-5);
    check_dev("bf16 head losses", d_losses, losses, N, 1e-5, 1e-6);
    cudaFree(d_losses), cudaFree(d_lse), cudaFree(d_logits), cudaFree(d_wte), cudaFree(d_x);
    cudaFree(d_t);
    free(losses), free(lse), free(logits), free(wte), free(x);
    kn_cuda_destroy(ctx);
}
