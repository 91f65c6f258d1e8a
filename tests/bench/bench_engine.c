/* chorus-bench-engine: training-step throughput of the CPU engine.
 *
 * In one run, with the kernels on 2 threads (both cores of the CI machine; OpenBLAS and the
 * kernels' pool alike):
 *   1. SGEMM peak: a 2048^3 single-precision matmul through kn_matmul_fwd (OpenBLAS,
 *      2 threads; best of 5, measured again after each model, the highest kept), the
 *      reference for MFU;
 *   2. for a small GPT (6 x 384, seq 256, B 4) and GPT-2 124M (seq 1024 B 1, seq 64 B 4,
 *      seq 256 B 8): full training steps as the trainer takes them (forward and backward on
 *      one micro-batch's acts, the global gradient norm, then clipping, AdamW and the
 *      gradient reset in one fused pass: eng_optim_step_fused; all through the backend
 *      table), model FLOP/s by the DESIGN §7 formula, MFU = that / SGEMM peak, tokens/s, all
 *      from the fastest timed step (the machines are shared; best-of is what repeats), and
 *      the optimizer's share of the step (norm + update);
 *   3. a per-kernel breakdown of those same timed steps: the model runs on a profiling
 *      backend that times every call of the CPU table (the shapes, caches and threads of
 *      training, because it is training), plus the gradient norm; the rows' sum is printed
 *      against the mean step, and what is left is the host code between kernels;
 *   4. when /usr/bin/python3 has torch: the same models in PyTorch on the same cores
 *      (tests/bench/torch_engine.py), for the tokens/s ratio against PyTorch at its best:
 *      for the small model the script sweeps PyTorch's CPU options (threads, mkldnn,
 *      AdamW foreach, jit.trace with the CPU fuser) from its defaults and keeps the
 *      fastest; GPT-2 124M runs PyTorch's defaults and the small model's winner (a sweep
 *      there would take many minutes). Each ratio is given against the best variant
 *      (pytorch-best, named) and against PyTorch's defaults (pytorch-default).
 * Arguments: config names to run (default: all); --unfused takes the optimizer the old way
 * (eng_model_zero_grad, eng_grad_clip, eng_optim_step: three passes) for comparison;
 * --no-torch skips PyTorch.
 *
 * --device cuda (default cpu) runs none of the above but GPT-2 124M at seq 1024 on GPU 0
 * through the CUDA backend (backend.h), the largest micro-batch that fits: B 64 halved while
 * the GPU's memory does not take it (--batch N: N only), for each precision of --precision
 * fp32|tf32|bf16|both (default both: fp32 and tf32; bf16: the trainer's mixed precision,
 * the model on the bf16 wrapper of workerd/engine/backend_bf16.h over the CUDA backend with
 * bf16 GEMMs, its peak the matmul_fwd GEMM on bf16 operands; unmeasured so far):
 *   1. the GEMM peak at that precision: an 8192^3 SGEMM through the backend's matmul_fwd
 *      (cuBLAS), synchronised, best of 5 rounds of 4;
 *   2. warm-up steps, then timed training steps as the trainer takes them (forward and
 *      backward on device memory, the global norm by the backend's sumsq, clipping, AdamW
 *      and the gradient reset by its adamw_fused; the Adam state in device memory), the
 *      backend synchronised before every clock read; tokens/s and MFU from the mean step,
 *      model FLOPs by the DESIGN §7 formula against the peak of 1;
 *   3. unless --no-torch, once Chorus has freed the GPU: the same model, batch and precision
 *      in PyTorch on the same GPU (tests/bench/torch_gpu.py, found beside the program or the
 *      source; python3 on the PATH or CHORUS_PYTHON), eager and torch.compile, tokens/s
 *      against Chorus's in a RESULT line each.
 * Without a GPU (or a build without CUDA) it says so and exits 2 at once.
 * Each comparison ends with a RESULT line (DESIGN §12). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "chorus/config.h"
#include "common/rng.h"
#include "common/util.h"
#include "kernels/matmul.h"
#include "workerd/engine/backend.h"
#include "workerd/engine/backend_bf16.h"
#include "workerd/engine/model.h"
#include "workerd/engine/optim.h"

#define THREADS 2

static int cuda_main(uint32_t batch, const char *precision, int no_torch);

typedef struct bench_cfg {
    const char *name;
    eng_config_t cfg;
    uint32_t B;
    int steps;       /* timed, after one warm-up step */
    int torch_steps; /* the same for each PyTorch variant, which is far slower */
    int torch_sweep; /* sweep PyTorch's options (else: its defaults and the last winner) */
} bench_cfg_t;

static const bench_cfg_t configs[] = {
    {"small", {6, 6, 384, 50257, 50304, 256, 0, CH_SCHEDULE_1F1B, 0, 0, 0}, 4, 5, 2, 1},
    {"gpt2_124m", {12, 12, 768, 50257, 50304, 1024, 0, CH_SCHEDULE_1F1B, 0, 0, 0}, 1, 3, 1, 0},
    {"gpt2_124m_b4t64", {12, 12, 768, 50257, 50304, 64, 0, CH_SCHEDULE_1F1B, 0, 0, 0}, 4, 5, 1, 0},
    {"gpt2_124m_b8t256",
     {12, 12, 768, 50257, 50304, 256, 0, CH_SCHEDULE_1F1B, 0, 0, 0},
     8,
     3,
     1,
     0},
};

static int unfused; /* --unfused: the optimizer in three passes, as before the fused step */

static double secs(uint64_t t0)
{
    return (double)(ch_now_ns() - t0) * 1e-9;
}

static float *buf(size_t n, const char *name)
{
    float *x = malloc(n * sizeof *x);
    if (x == NULL) {
        fprintf(stderr, "bench-engine: out of memory (%zu floats)\n", n);
        exit(1);
    }
    ch_rng_fill_normal(x, n, 1, name, 0, 0.5f);
    return x;
}

// ----------------------------------------------------------------------------
// SGEMM peak

static double sgemm_peak_gflops(void)
{
    const int n = 2048;
    float *a = buf((size_t)n * n, "a"), *b = buf((size_t)n * n, "b"), *c = buf((size_t)n * n, "c");
    double best = 0.0;
    kn_matmul_fwd(c, a, b, NULL, n, n, n); /* warm-up: threads, page faults */
    for (int r = 0; r < 5; r++) {
        uint64_t t0 = ch_now_ns();
        kn_matmul_fwd(c, a, b, NULL, n, n, n);
        double g = 2.0 * n * n * n / secs(t0) * 1e-9;
        best = g > best ? g : best;
    }
    free(a), free(b), free(c);
    return best;
}

// ----------------------------------------------------------------------------
// the profiling backend: the CPU table underneath, every call timed into a row

#define MAX_ROWS 48

typedef struct prof_row {
    char name[48];
    double s, flop; /* summed over the calls */
    long calls;
} prof_row_t;

static struct {
    const eng_backend_t *cpu;
    int C; /* the model's width, to name the matmuls */
    prof_row_t rows[MAX_ROWS];
    int n;
} prof;

static void prof_add(const char *name, uint64_t t0, double flop)
{
    double dt = secs(t0);
    int i = 0;
    while (i < prof.n && strcmp(prof.rows[i].name, name) != 0) {
        i++;
    }
    if (i == prof.n) {
        if (prof.n == MAX_ROWS) {
            return;
        }
        snprintf(prof.rows[prof.n++].name, sizeof prof.rows[0].name, "%s", name);
    }
    prof.rows[i].s += dt;
    prof.rows[i].flop += flop;
    prof.rows[i].calls++;
}

#define TIMED(name, flop, call)                                                                    \
    do {                                                                                           \
        uint64_t t0_ = ch_now_ns();                                                                \
        call;                                                                                      \
        prof_add(name, t0_, flop);                                                                 \
    } while (0)

static const char *mm_name(int fwd, int C, int OC)
{
    int c = prof.C;
    if (C == c && OC == 3 * c) {
        return fwd ? "matmul fwd c_attn" : "matmul bwd c_attn";
    }
    if (C == c && OC == c) {
        return fwd ? "matmul fwd attn.c_proj" : "matmul bwd attn.c_proj";
    }
    if (C == c && OC == 4 * c) {
        return fwd ? "matmul fwd c_fc" : "matmul bwd c_fc";
    }
    if (C == 4 * c && OC == c) {
        return fwd ? "matmul fwd mlp.c_proj" : "matmul bwd mlp.c_proj";
    }
    return fwd ? "matmul fwd other" : "matmul bwd other";
}

static int p_alloc(const eng_backend_t *be, size_t bytes, void **out)
{
    (void)be;
    return prof.cpu->alloc(prof.cpu, bytes, out);
}

static void p_free(const eng_backend_t *be, void *p)
{
    (void)be;
    prof.cpu->free(prof.cpu, p);
}

static int p_copy(const eng_backend_t *be, void *dst, const void *src, size_t bytes,
                  eng_copy_dir_t dir)
{
    (void)be;
    int rc;
    TIMED("copy", 0, rc = prof.cpu->copy(prof.cpu, dst, src, bytes, dir));
    return rc;
}

static int p_memset(const eng_backend_t *be, void *p, int value, size_t bytes)
{
    (void)be;
    int rc;
    TIMED("memset (zero_grad, dx)", 0, rc = prof.cpu->memset(prof.cpu, p, value, bytes));
    return rc;
}

static void p_encoder_fwd(const eng_backend_t *be, float *out, const int32_t *inp, const float *wte,
                          const float *wpe, int B, int T, int C)
{
    (void)be;
    TIMED("encoder fwd", 0, prof.cpu->encoder_fwd(prof.cpu, out, inp, wte, wpe, B, T, C));
}

static void p_encoder_bwd(const eng_backend_t *be, float *dwte, float *dwpe, const float *dout,
                          const int32_t *inp, int B, int T, int C)
{
    (void)be;
    TIMED("encoder bwd", 0, prof.cpu->encoder_bwd(prof.cpu, dwte, dwpe, dout, inp, B, T, C));
}

static void p_layernorm_fwd(const eng_backend_t *be, float *out, float *mean, float *rstd,
                            const float *inp, const float *weight, const float *bias, int N, int C)
{
    (void)be;
    TIMED("layernorm fwd", 0,
          prof.cpu->layernorm_fwd(prof.cpu, out, mean, rstd, inp, weight, bias, N, C));
}

static void p_layernorm_bwd(const eng_backend_t *be, float *dinp, float *dweight, float *dbias,
                            const float *dout, const float *inp, const float *weight,
                            const float *mean, const float *rstd, int N, int C)
{
    (void)be;
    TIMED("layernorm bwd", 0,
          prof.cpu->layernorm_bwd(prof.cpu, dinp, dweight, dbias, dout, inp, weight, mean, rstd, N,
                                  C));
}

static void p_matmul_fwd(const eng_backend_t *be, float *out, const float *inp, const float *weight,
                         const float *bias, int N, int C, int OC)
{
    (void)be;
    TIMED(mm_name(1, C, OC), 2.0 * N * C * OC,
          prof.cpu->matmul_fwd(prof.cpu, out, inp, weight, bias, N, C, OC));
}

static void p_matmul_bwd(const eng_backend_t *be, float *dinp, float *dweight, float *dbias,
                         const float *dout, const float *inp, const float *weight, int N, int C,
                         int OC)
{
    (void)be;
    TIMED(mm_name(0, C, OC), 4.0 * N * C * OC,
          prof.cpu->matmul_bwd(prof.cpu, dinp, dweight, dbias, dout, inp, weight, N, C, OC));
}

/* QK^T and PV over the causal half */
static double att_flop(int B, int T, int C)
{
    return 2.0 * 2.0 * B * (double)T * T / 2 * C;
}

static void p_attention_fwd(const eng_backend_t *be, float *out, float *att, float *scratch,
                            const float *qkv, int B, int T, int C, int NH)
{
    (void)be;
    TIMED("attention fwd", att_flop(B, T, C),
          prof.cpu->attention_fwd(prof.cpu, out, att, scratch, qkv, B, T, C, NH));
}

static void p_attention_bwd(const eng_backend_t *be, float *dqkv, float *scratch, const float *dout,
                            const float *qkv, const float *att, int B, int T, int C, int NH)
{
    (void)be;
    TIMED("attention bwd", 2 * att_flop(B, T, C),
          prof.cpu->attention_bwd(prof.cpu, dqkv, scratch, dout, qkv, att, B, T, C, NH));
}

static void p_gelu_fwd(const eng_backend_t *be, float *out, const float *inp, size_t n)
{
    (void)be;
    TIMED("gelu fwd", 0, prof.cpu->gelu_fwd(prof.cpu, out, inp, n));
}

static void p_gelu_bwd(const eng_backend_t *be, float *dinp, const float *inp, const float *dout,
                       size_t n)
{
    (void)be;
    TIMED("gelu bwd", 0, prof.cpu->gelu_bwd(prof.cpu, dinp, inp, dout, n));
}

static void p_residual_fwd(const eng_backend_t *be, float *out, const float *a, const float *b,
                           size_t n)
{
    (void)be;
    TIMED("residual", 0, prof.cpu->residual_fwd(prof.cpu, out, a, b, n));
}

static void p_lmhead_fwd(const eng_backend_t *be, float *logits, float *lse, float *losses,
                         const float *x, const float *wte, const int32_t *targets, int N, int C,
                         int V, int Vp)
{
    (void)be;
    TIMED("lm head + xent fwd", 2.0 * N * C * Vp,
          prof.cpu->lmhead_fwd(prof.cpu, logits, lse, losses, x, wte, targets, N, C, V, Vp));
}

static void p_lmhead_bwd(const eng_backend_t *be, float *dx, float *dwte, float *logits,
                         const float *lse, const float *x, const float *wte, const int32_t *targets,
                         float scale, int N, int C, int V, int Vp)
{
    (void)be;
    TIMED(
        "lm head + xent bwd", 4.0 * N * C * V,
        prof.cpu->lmhead_bwd(prof.cpu, dx, dwte, logits, lse, x, wte, targets, scale, N, C, V, Vp));
}

static void p_lmhead_fwdbwd(const eng_backend_t *be, float *dx, float *dwte, float *logits,
                            float *lse, float *losses, const float *x, const float *wte,
                            const int32_t *targets, int acc, int N, int C, int V, int Vp)
{
    (void)be;
    TIMED("lm head + xent fwd+bwd", 2.0 * N * C * Vp + 4.0 * N * C * V,
          prof.cpu->lmhead_fwdbwd(prof.cpu, dx, dwte, logits, lse, losses, x, wte, targets, acc, N,
                                  C, V, Vp));
}

static void p_axpy(const eng_backend_t *be, float *y, const float *x, size_t n, float a)
{
    (void)be;
    TIMED("axpy (head grads)", 0, prof.cpu->axpy(prof.cpu, y, x, n, a));
}

static void p_adamw(const eng_backend_t *be, float *p, const float *g, float *m, float *v, size_t n,
                    double lr, double b1, double b2, double eps, double wd, uint64_t t)
{
    (void)be;
    TIMED("adamw", 0, prof.cpu->adamw(prof.cpu, p, g, m, v, n, lr, b1, b2, eps, wd, t));
}

static void p_adamw_fused(const eng_backend_t *be, float *p, float *g, float *m, float *v, size_t n,
                          double lr, double b1, double b2, double eps, double wd, uint64_t t,
                          float gscale, int zero_g)
{
    (void)be;
    TIMED("adamw + clip + zero (fused)", 0,
          prof.cpu->adamw_fused(prof.cpu, p, g, m, v, n, lr, b1, b2, eps, wd, t, gscale, zero_g));
}

static double p_sumsq(const eng_backend_t *be, const float *x, size_t n)
{
    (void)be;
    double r;
    TIMED("sumsq", 0, r = prof.cpu->sumsq(prof.cpu, x, n));
    return r;
}

static void p_scale(const eng_backend_t *be, float *x, size_t n, float c)
{
    (void)be;
    TIMED("scale", 0, prof.cpu->scale(prof.cpu, x, n, c));
}

static const eng_backend_t prof_backend = {
    .name = "profiling",
    .host_memory = 1,
    .alloc = p_alloc,
    .free = p_free,
    .copy = p_copy,
    .memset = p_memset,
    .encoder_fwd = p_encoder_fwd,
    .encoder_bwd = p_encoder_bwd,
    .layernorm_fwd = p_layernorm_fwd,
    .layernorm_bwd = p_layernorm_bwd,
    .matmul_fwd = p_matmul_fwd,
    .matmul_bwd = p_matmul_bwd,
    .attention_fwd = p_attention_fwd,
    .attention_bwd = p_attention_bwd,
    .gelu_fwd = p_gelu_fwd,
    .gelu_bwd = p_gelu_bwd,
    .residual_fwd = p_residual_fwd,
    .lmhead_fwd = p_lmhead_fwd,
    .lmhead_bwd = p_lmhead_bwd,
    .lmhead_fwdbwd = p_lmhead_fwdbwd,
    .axpy = p_axpy,
    .adamw = p_adamw,
    .adamw_fused = p_adamw_fused,
    .sumsq = p_sumsq,
    .scale = p_scale,
};

// ----------------------------------------------------------------------------
// whole training steps

typedef struct run {
    double step_s, mean_s, gflops, tokens_per_s; /* step_s: the fastest timed step */
    double optim_s;                              /* mean over the timed steps: norm + update */
} run_t;

static int cmp_rows(const void *a, const void *b)
{
    double x = ((const prof_row_t *)a)->s, y = ((const prof_row_t *)b)->s;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* The profile of the timed steps, per step, against their mean. */
static void print_profile(const bench_cfg_t *bc, int steps, double mean_s)
{
    qsort(prof.rows, (size_t)prof.n, sizeof prof.rows[0], cmp_rows);
    printf("  %s per-kernel profile of the timed steps (the calls training makes, timed in "
           "place; per step):\n",
           bc->name);
    printf("    %-30s %8s %10s %10s %7s %9s\n", "kernel", "calls", "ms/call", "ms/step", "% step",
           "GFLOP/s");
    double sum = 0.0;
    for (int i = 0; i < prof.n; i++) {
        const prof_row_t *r = &prof.rows[i];
        double per_step = r->s / steps;
        sum += per_step;
        printf("    %-30s %8.1f %10.3f %10.2f %6.1f%%", r->name, (double)r->calls / steps,
               r->s / (double)r->calls * 1e3, per_step * 1e3, 100.0 * per_step / mean_s);
        if (r->flop > 0) {
            printf(" %9.1f", r->flop / r->s * 1e-9);
        }
        printf("\n");
    }
    printf("    %-30s %8s %10s %10.2f %6.1f%% of the mean step %.2f ms (the rest, %.2f ms: host "
           "code between kernels)\n",
           "sum", "", "", sum * 1e3, 100.0 * sum / mean_s, mean_s * 1e3, (mean_s - sum) * 1e3);
}

static int train_steps(const bench_cfg_t *bc, run_t *out)
{
    const eng_config_t *c = &bc->cfg;
    uint32_t B = bc->B, T = c->seq_len;
    size_t N = (size_t)B * T;
    eng_model_t *m = NULL;
    eng_model_opts_t mo = {.backend = &prof_backend};
    prof.cpu = eng_backend_cpu();
    prof.C = (int)c->embd;
    uint64_t t0 = ch_now_ns();
    int rc = eng_model_create_opts(c, &mo, B, 1337, &m);
    if (rc < 0) {
        fprintf(stderr, "bench-engine: eng_model_create: %d\n", rc);
        return rc;
    }
    printf("  %s: %zu parameters, created in %.2f s\n", bc->name, eng_model_nparams(m), secs(t0));
    size_t n = eng_model_nparams(m);
    eng_optim_t o;
    int32_t *tok = malloc((N + 1) * sizeof *tok);
    eng_acts_t *acts = NULL;
    if (eng_optim_init(&o, n) < 0) {
        free(tok);
        eng_model_destroy(m);
        return -1;
    }
    if (!tok || eng_acts_create(m, B, &acts) < 0) {
        rc = -1;
        goto out;
    }
    for (size_t i = 0; i <= N; i++) {
        tok[i] = (int32_t)(ch_rng_uniform_key(42, i) * c->vocab);
    }
    double total = 0.0, best = INFINITY, optim = 0.0;
    for (int s = 0; s <= bc->steps; s++) {
        float loss = 0.0f;
        if (s == 1) {
            memset(&prof.rows, 0, sizeof prof.rows); /* the warm-up step is not profiled */
            prof.n = 0;
        }
        t0 = ch_now_ns();
        if (unfused) {
            eng_model_zero_grad(m);
        }
        rc = eng_model_forward_acts(m, acts, tok, tok + 1, B, T, &loss);
        rc = rc < 0 ? rc : eng_model_backward_acts(m, acts, 1.0f / (float)N);
        if (rc < 0) {
            fprintf(stderr, "bench-engine: step: %d\n", rc);
            goto out;
        }
        uint64_t t_opt = ch_now_ns();
        double norm = 0.0;
        if (unfused) {
            TIMED("grad norm + clip (unfused)", 0,
                  norm = eng_grad_clip(eng_model_grads(m), n, o.max_grad_norm));
            rc = eng_optim_step(&o, m, 6e-4);
        } else {
            TIMED("grad norm (sum of squares)", 0, norm = eng_grad_norm(eng_model_grads(m), n));
            rc = eng_optim_step_fused(&o, m, 6e-4, eng_clip_coef(norm, o.max_grad_norm), 1);
        }
        double dt = secs(t0), dopt = secs(t_opt);
        printf("  %s step %d: loss %.4f, norm %.3f, %.3f s (optimizer %.1f ms)%s\n", bc->name, s,
               loss, norm, dt, dopt * 1e3, s == 0 ? " (warm-up)" : "");
        if (s > 0) {
            total += dt;
            optim += dopt;
            best = dt < best ? dt : best;
        }
    }
    out->step_s = best;
    out->mean_s = total / bc->steps;
    out->optim_s = optim / bc->steps;
    out->gflops = ch_plan_flops(c, B) / out->step_s * 1e-9;
    out->tokens_per_s = (double)N / out->step_s;
    print_profile(bc, bc->steps, out->mean_s);
out:
    free(tok);
    eng_optim_fini(&o);
    eng_acts_destroy(acts);
    eng_model_destroy(m);
    return rc;
}

// ----------------------------------------------------------------------------
// --device cuda: GPT-2 124M on one GPU

#if CHORUS_HAVE_CUDA

#define CUDA_PEAK_N   8192
#define CUDA_WARMUP   3
#define CUDA_STEPS    10
#define CUDA_MAX_B    64 /* halved until the model, its Adam state and activations fit */
#define CUDA_FILL_MAX ((size_t)1 << 20)

static const eng_config_t gpt2_124m = {12, 12, 768, 50257, 50304, 1024, 0, CH_SCHEDULE_1F1B,
                                       0,  0,  0};

/* n floats of backend memory filled with a repeated normal pattern (not zeros: a GEMM on
 * zeros draws less power and clocks higher than on data); NULL when it does not fit */
static float *cuda_filled(const eng_backend_t *be, size_t n, const float *pattern)
{
    void *d = NULL;
    if (be->alloc(be, n * sizeof(float), &d) < 0) {
        return NULL;
    }
    for (size_t i = 0; i < n; i += CUDA_FILL_MAX) {
        size_t k = n - i < CUDA_FILL_MAX ? n - i : CUDA_FILL_MAX;
        if (be->copy(be, (float *)d + i, pattern, k * sizeof(float), ENG_COPY_H2D) < 0) {
            be->free(be, d);
            return NULL;
        }
    }
    return d;
}

/* The GEMM peak at the backend's current precision in TFLOP/s: C = A B at n^3 through
 * matmul_fwd (cuBLAS), best of 5 rounds of 4 back-to-back GEMMs timed between syncs.
 * 0 on a failure (printed). */
static double cuda_gemm_peak(const eng_backend_t *be, int n)
{
    size_t nn = (size_t)n * n;
    float *pattern = buf(CUDA_FILL_MAX, "gemm");
    float *a = cuda_filled(be, nn, pattern), *b = cuda_filled(be, nn, pattern);
    float *c = cuda_filled(be, nn, pattern);
    free(pattern);
    double best = 0.0;
    int rc = a && b && c ? 0 : -1;
    if (rc == 0) {
        be->matmul_fwd(be, c, a, b, NULL, n, n, n); /* warm-up: cuBLAS picks its kernel */
        rc = be->sync(be);
    }
    for (int r = 0; rc == 0 && r < 5; r++) {
        uint64_t t0 = ch_now_ns();
        for (int k = 0; k < 4; k++) {
            be->matmul_fwd(be, c, a, b, NULL, n, n, n);
        }
        rc = be->sync(be);
        double tf = 4 * 2.0 * (double)n * n * n / secs(t0) * 1e-12;
        best = tf > best ? tf : best;
    }
    if (rc < 0) {
        fprintf(stderr, "bench-engine: the %d^3 GEMM failed (%d)\n", n, rc);
        best = 0.0;
    }
    be->free(be, c), be->free(be, b), be->free(be, a);
    return best;
}

typedef struct cuda_bench {
    const eng_backend_t *be;
    eng_model_t *m;
    eng_optim_t o;
    int32_t *tok; /* B*T + 1 host tokens: inputs tok, targets tok + 1 */
    uint32_t B;
} cuda_bench_t;

static void cuda_bench_free(cuda_bench_t *cb)
{
    if (cb->o.m != NULL) {
        cb->be->free(cb->be, cb->o.m);
        cb->be->free(cb->be, cb->o.v);
        cb->o.m = cb->o.v = NULL;
    }
    eng_optim_fini(&cb->o);
    eng_model_destroy(cb->m);
    cb->m = NULL;
    free(cb->tok);
    cb->tok = NULL;
}

/* One training step as the trainer takes it, on device memory; the seconds of forward +
 * backward + norm (sumsq returns to the host: a sync) and of the optimizer (then synced)
 * into *fb, *opt. 0 or the first failure. */
static int cuda_step(cuda_bench_t *cb, float *loss, double *fb, double *opt)
{
    const eng_backend_t *be = cb->be;
    uint32_t T = gpt2_124m.seq_len;
    size_t n = eng_model_nparams(cb->m), N = (size_t)cb->B * T;
    uint64_t t0 = ch_now_ns();
    int rc = eng_model_forward(cb->m, cb->tok, cb->tok + 1, cb->B, T, loss);
    rc = rc < 0 ? rc : eng_model_backward(cb->m, 1.0f / (float)N);
    if (rc < 0) {
        return rc;
    }
    double norm = sqrt(be->sumsq(be, eng_model_grads(cb->m), n));
    rc = be->sync(be);
    *fb = secs(t0);
    uint64_t t1 = ch_now_ns();
    rc = rc < 0 ? rc
                : eng_optim_step_fused(&cb->o, cb->m, 6e-4,
                                       eng_clip_coef(norm, cb->o.max_grad_norm), 1);
    rc = rc < 0 ? rc : be->sync(be);
    *opt = secs(t1);
    return rc;
}

/* The model, its Adam state on the GPU and one warm-up step at B sequences; -ENOMEM when
 * the GPU's memory does not take them. */
static int cuda_bench_init(cuda_bench_t *cb, const eng_backend_t *be, uint32_t B)
{
    memset(cb, 0, sizeof *cb);
    cb->be = be;
    cb->B = B;
    size_t N = (size_t)B * gpt2_124m.seq_len;
    eng_model_opts_t mo = {.backend = be};
    int rc = eng_model_create_opts(&gpt2_124m, &mo, B, 1337, &cb->m);
    if (rc < 0) {
        return rc;
    }
    size_t n = eng_model_nparams(cb->m);
    cb->tok = malloc((N + 1) * sizeof *cb->tok);
    if (cb->tok == NULL || (rc = eng_optim_init(&cb->o, n)) < 0) {
        cuda_bench_free(cb);
        return -ENOMEM;
    }
    /* the Adam state in device memory: eng_optim_step_fused runs the model's backend */
    free(cb->o.m), free(cb->o.v);
    cb->o.m = cb->o.v = NULL;
    void *dm = NULL, *dv = NULL;
    if ((rc = be->alloc(be, n * sizeof(float), &dm)) < 0 ||
        (rc = be->alloc(be, n * sizeof(float), &dv)) < 0) {
        be->free(be, dm);
        cuda_bench_free(cb);
        return rc;
    }
    cb->o.m = dm, cb->o.v = dv;
    rc = be->memset(be, dm, 0, n * sizeof(float));
    rc = rc < 0 ? rc : be->memset(be, dv, 0, n * sizeof(float));
    for (size_t i = 0; i <= N; i++) {
        cb->tok[i] = (int32_t)(ch_rng_uniform_key(42, i) * gpt2_124m.vocab);
    }
    /* the first step makes the model's activations: the rest of what B costs */
    float loss = 0.0f;
    double fb = 0.0, opt = 0.0;
    rc = rc < 0 ? rc : cuda_step(cb, &loss, &fb, &opt);
    if (rc < 0) {
        cuda_bench_free(cb);
        return rc;
    }
    printf("  B %u: %zu parameters; first step %.2f s, loss %.4f\n", B, n, fb + opt, loss);
    return 0;
}

/* Warm-up and timed steps at the backend's current precision, the RESULT line; *tps_out
 * the tokens/s. */
static int cuda_measure(cuda_bench_t *cb, const char *prec, double peak_tflops, double *tps_out)
{
    uint32_t T = gpt2_124m.seq_len;
    size_t N = (size_t)cb->B * T;
    double total = 0.0, best = INFINITY, opt_total = 0.0;
    for (int s = 0; s < CUDA_WARMUP + CUDA_STEPS; s++) {
        float loss = 0.0f;
        double fb = 0.0, opt = 0.0;
        int rc = cuda_step(cb, &loss, &fb, &opt);
        if (rc < 0) {
            fprintf(stderr, "bench-engine: cuda %s step %d: %d\n", prec, s, rc);
            return rc;
        }
        double dt = fb + opt;
        printf("  %s step %d: loss %.4f, %.1f ms (forward+backward+norm %.1f, optimizer %.1f)%s\n",
               prec, s, loss, dt * 1e3, fb * 1e3, opt * 1e3, s < CUDA_WARMUP ? " (warm-up)" : "");
        if (s >= CUDA_WARMUP) {
            total += dt;
            opt_total += opt;
            best = dt < best ? dt : best;
        }
    }
    double mean = total / CUDA_STEPS;
    double tflops = ch_plan_flops(&gpt2_124m, cb->B) / mean * 1e-12;
    double tps = (double)N / mean, mfu = tflops / peak_tflops;
    printf("engine_cuda_%s: B %u T %u, mean step %.1f ms (fastest %.1f, optimizer %.1f), "
           "%.0f tokens/s, %.1f model TFLOP/s, MFU %.3f of the %s GEMM peak %.1f TFLOP/s\n",
           prec, cb->B, T, mean * 1e3, best * 1e3, opt_total / CUDA_STEPS * 1e3, tps, tflops, mfu,
           prec, peak_tflops);
    /* the materialised attention (CHORUS_CUDA_ATTENTION=materialised; the fused one is the
     * default, backend_cuda.c) is measured under a name of its own */
    const char *att = getenv("CHORUS_CUDA_ATTENTION");
    printf("RESULT name=engine_cuda_%s%s value=%.1f unit=TFLOP/s ref=cublas_gemm_peak(%s,%d^3,"
           "best_of_5) ref_value=%.1f ratio=%.3f tokens_per_s=%.0f mfu=%.3f peak_tflops=%.1f "
           "batch=%u seq=%u\n",
           prec, att != NULL && strcmp(att, "materialised") == 0 ? "_materialised" : "", tflops,
           prec, CUDA_PEAK_N, peak_tflops, mfu, tps, mfu, peak_tflops, cb->B, T);
    *tps_out = tps;
    return 0;
}

/* torch_gpu.py: beside this program (a bundle) or beside this source file. */
static int torch_gpu_script(char *path, size_t len)
{
    char exe[512];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash != NULL) {
            *slash = '\0';
            snprintf(path, len, "%s/torch_gpu.py", exe);
            if (access(path, R_OK) == 0) {
                return 0;
            }
        }
    }
    snprintf(path, len, "%s", __FILE__);
    char *slash = strrchr(path, '/');
    if (slash == NULL || (size_t)(slash - path) + sizeof "/torch_gpu.py" > len) {
        return -1;
    }
    strcpy(slash, "/torch_gpu.py");
    return access(path, R_OK) == 0 ? 0 : -1;
}

/* PyTorch on the same GPU at the same batch and precision (after Chorus freed its memory):
 * eager and torch.compile, each against Chorus's tokens/s, a RESULT line each. python3 on
 * the PATH (CHORUS_PYTHON to choose another); nothing when it has no torch with CUDA. */
static void cuda_vs_torch(uint32_t B, const char *prec, double tps)
{
    char script[600], cmd[1024], line[512];
    const char *py = getenv("CHORUS_PYTHON") ? getenv("CHORUS_PYTHON") : "python3";
    if (torch_gpu_script(script, sizeof script) < 0) {
        printf("PyTorch comparison not run: torch_gpu.py not found\n");
        return;
    }
    snprintf(cmd, sizeof cmd, "%s %s --batch %u --seq %u --precision %s 2>&1", py, script, B,
             gpt2_124m.seq_len, prec);
    FILE *f = popen(cmd, "r");
    if (f == NULL) {
        return;
    }
    while (fgets(line, sizeof line, f) != NULL) {
        char mode[32], p[16];
        double step_ms = 0.0, ttps = 0.0;
        printf("    torch: %s", line);
        if (sscanf(line, "mode=%31s precision=%15s step_ms=%lf tokens_per_s=%lf", mode, p, &step_ms,
                   &ttps) == 4 &&
            ttps > 0) {
            printf("RESULT name=engine_cuda_%s_vs_torch_%s value=%.3f unit=ratio "
                   "tokens_per_s=%.0f ref=torch_%s(%s) ref_value=%.0f batch=%u seq=%u\n",
                   prec, mode, tps / ttps, tps, mode, prec, ttps, B, gpt2_124m.seq_len);
        }
    }
    int st = pclose(f);
    if (st != 0) {
        printf("PyTorch comparison: %s exited with status %d (no torch with CUDA there?)\n", py,
               WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    }
}

/* --precision bf16: the GEMM peak on bf16 operands, then the model's steps through the bf16
 * wrapper over be (bf16 GEMMs on). *tps: its tokens/s. */
static int cuda_bf16(eng_backend_t *be, uint32_t B, double *tps)
{
    eng_backend_t *w = NULL;
    cuda_bench_t cb;
    eng_backend_cuda_set_tf32(be, 0);
    eng_backend_cuda_set_bf16(be, 1);
    double peak = cuda_gemm_peak(be, CUDA_PEAK_N);
    printf("bf16 GEMM peak (matmul_fwd %d^3 on bf16 operands, cuBLASLt, best of 5 rounds of 4, "
           "casts included): %.1f TFLOP/s\n",
           CUDA_PEAK_N, peak);
    int rc = peak > 0 ? eng_backend_bf16_create(be, &w) : -1;
    if (rc == 0 && (rc = cuda_bench_init(&cb, w, B)) == 0) {
        rc = cuda_measure(&cb, "bf16", peak, tps);
        cuda_bench_free(&cb);
    }
    eng_backend_bf16_destroy(w);
    eng_backend_cuda_set_bf16(be, 0);
    return rc;
}

static int cuda_main(uint32_t batch, const char *precision, int no_torch)
{
    int n = 0, rc = eng_backend_cuda_devices(&n);
    if (rc < 0) {
        fprintf(stderr,
                "chorus-bench-engine --device cuda: the CUDA runtime failed (%d): no GPU "
                "benchmark\n",
                rc);
        return 2;
    }
    if (n == 0) {
        fprintf(stderr, "chorus-bench-engine --device cuda: no GPU visible (no CUDA device or "
                        "driver on this machine): no GPU benchmark\n");
        return 2;
    }
    eng_backend_t *be = NULL;
    if ((rc = eng_backend_cuda_create(0, &be)) < 0) {
        fprintf(stderr, "chorus-bench-engine --device cuda: GPU 0: backend setup failed (%d)\n",
                rc);
        return 1;
    }
    const eng_config_t *c = &gpt2_124m;
    printf("chorus-bench-engine --device cuda: GPU 0 of %d; gpt2_124m: layers %u heads %u embd "
           "%u vocab %u (padded %u) seq %u\n",
           n, c->layers, c->heads, c->embd, c->vocab, c->padded_vocab, c->seq_len);
    cuda_bench_t cb;
    uint32_t B = batch > 0 ? batch : CUDA_MAX_B;
    uint64_t t0 = ch_now_ns();
    while ((rc = cuda_bench_init(&cb, be, B)) == -ENOMEM && batch == 0 && B > 1) {
        printf("  B %u does not fit in the GPU's memory: trying %u\n", B, B / 2);
        B /= 2;
    }
    if (rc < 0) {
        fprintf(stderr, "chorus-bench-engine --device cuda: model at B %u: %d\n", B, rc);
        eng_backend_cuda_destroy(be);
        return 1;
    }
    printf("gpt2_124m on the GPU: batch %u x seq %u = %u tokens per step; set up in %.1f s\n", B,
           c->seq_len, B * c->seq_len, secs(t0));
    const char *precs[2] = {"fp32", "tf32"};
    double tps[2] = {0.0, 0.0};
    for (int p = 0; rc == 0 && p < 2; p++) {
        if (strcmp(precision, "both") != 0 && strcmp(precision, precs[p]) != 0) {
            continue;
        }
        eng_backend_cuda_set_tf32(be, p == 1);
        double peak = cuda_gemm_peak(be, CUDA_PEAK_N);
        printf("%s GEMM peak (matmul_fwd %d^3, cuBLAS, best of 5 rounds of 4): %.1f TFLOP/s\n",
               precs[p], CUDA_PEAK_N, peak);
        rc = peak > 0 ? cuda_measure(&cb, precs[p], peak, &tps[p]) : -1;
    }
    cuda_bench_free(&cb);
    double tps16 = 0.0;
    if (rc == 0 && strcmp(precision, "bf16") == 0) {
        rc = cuda_bf16(be, B, &tps16);
    }
    for (int p = 0; rc == 0 && !no_torch && p < 2; p++) {
        if (tps[p] > 0) {
            cuda_vs_torch(B, precs[p], tps[p]);
        }
    }
    if (rc == 0 && !no_torch && tps16 > 0) {
        cuda_vs_torch(B, "bf16", tps16);
    }
    eng_backend_cuda_destroy(be);
    return rc < 0 ? 1 : 0;
}

#else

static int cuda_main(uint32_t batch, const char *precision, int no_torch)
{
    (void)batch, (void)precision, (void)no_torch;
    fprintf(stderr, "chorus-bench-engine --device cuda: this build has no CUDA backend "
                    "(configure with -DCHORUS_CUDA=ON where the CUDA toolkit and NCCL are)\n");
    return 2;
}

#endif

// ----------------------------------------------------------------------------
// PyTorch reference

#define PYTHON "/usr/bin/python3"

/* PyTorch's tokens/s: at its defaults and its best variant (label in best_label, which
 * also carries the variant to try when sweep is 0; "" for none). 0 when not available. */
typedef struct torch_ref {
    double dflt_tps, best_tps;
    char dflt_label[96], best_label[96];
} torch_ref_t;

static int torch_available(void)
{
    return system(PYTHON " -c 'import torch' >/dev/null 2>&1") == 0;
}

static int torch_run(const bench_cfg_t *bc, torch_ref_t *t)
{
    char dir[512], cmd[1536], line[512];
    snprintf(dir, sizeof dir, "%s", __FILE__);
    char *slash = strrchr(dir, '/');
    if (slash == NULL) {
        return -1;
    }
    *slash = '\0';
    const eng_config_t *c = &bc->cfg;
    char what[128] = "--sweep";
    if (!bc->torch_sweep) {
        snprintf(what, sizeof what, "%s%s", t->best_label[0] ? "--variants " : "", t->best_label);
    }
    snprintf(cmd, sizeof cmd,
             PYTHON " %s/torch_engine.py --layers %u --heads %u --embd %u --vocab %u --seq %u "
                    "--batch %u --steps %d %s 2>&1",
             dir, c->layers, c->heads, c->embd, c->padded_vocab, c->seq_len, bc->B, bc->torch_steps,
             what);
    FILE *f = popen(cmd, "r");
    if (f == NULL) {
        return -1;
    }
    t->dflt_tps = t->best_tps = 0.0;
    while (fgets(line, sizeof line, f) != NULL) {
        printf("    torch: %s", line);
        sscanf(line, "default=%95s tokens_per_s=%lf", t->dflt_label, &t->dflt_tps);
        sscanf(line, "best=%95s tokens_per_s=%lf", t->best_label, &t->best_tps);
    }
    int st = pclose(f);
    return st == 0 && t->dflt_tps > 0 && t->best_tps > 0 ? 0 : -1;
}

/* Optional argument: run only the named config (default: all). */
int main(int argc, char **argv)
{
    int only = 0, no_torch = 0;
    const char *device = "cpu", *precision = "both";
    uint32_t batch = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--unfused") == 0) {
            unfused = 1;
        } else if (strcmp(argv[i], "--no-torch") == 0) {
            no_torch = 1;
        } else if (strcmp(argv[i], "--device") == 0 && i + 1 < argc) {
            device = argv[++i];
        } else if (strcmp(argv[i], "--precision") == 0 && i + 1 < argc) {
            precision = argv[++i];
        } else if (strcmp(argv[i], "--batch") == 0 && i + 1 < argc) {
            batch = (uint32_t)strtoul(argv[++i], NULL, 10);
        } else {
            only = 1;
        }
    }
    if (strcmp(device, "cuda") == 0) {
        if (strcmp(precision, "fp32") != 0 && strcmp(precision, "tf32") != 0 &&
            strcmp(precision, "bf16") != 0 && strcmp(precision, "both") != 0) {
            fprintf(stderr, "bench-engine: --precision %s: fp32, tf32, bf16 or both\n", precision);
            return 1;
        }
        return cuda_main(batch, precision, no_torch);
    }
    if (strcmp(device, "cpu") != 0) {
        fprintf(stderr, "bench-engine: --device %s: cpu or cuda\n", device);
        return 1;
    }
    kn_blas_set_threads(THREADS);
    printf("chorus-bench-engine: OpenBLAS threads %d\n", kn_blas_threads());
    /* the machines are shared: the peak is the best of several runs, taken again after
     * each model so a busy spell does not inflate the ratio */
    double peak = sgemm_peak_gflops();
    printf("SGEMM peak (kn_matmul_fwd 2048^3, OpenBLAS %d threads, best of 5): %.1f GFLOP/s\n",
           THREADS, peak);
    int have_torch = !no_torch && torch_available();
    if (!have_torch) {
        printf("PyTorch reference skipped: %s\n",
               no_torch ? "--no-torch"
                        : PYTHON " cannot import torch (Debian: apt-get install python3-torch)");
    }
    torch_ref_t tr = {0};
    int rc = 0;
    for (size_t i = 0; i < sizeof configs / sizeof configs[0]; i++) {
        const bench_cfg_t *bc = &configs[i];
        int wanted = !only;
        for (int a = 1; a < argc; a++) {
            wanted |= strcmp(argv[a], bc->name) == 0;
        }
        if (!wanted) {
            continue;
        }
        run_t r;
        printf("%s: layers %u heads %u embd %u vocab %u seq %u batch %u\n", bc->name,
               bc->cfg.layers, bc->cfg.heads, bc->cfg.embd, bc->cfg.vocab, bc->cfg.seq_len, bc->B);
        if (train_steps(bc, &r) < 0) {
            rc = 1;
            continue;
        }
        double again = sgemm_peak_gflops();
        printf("SGEMM peak again: %.1f GFLOP/s; the reference is the highest so far\n", again);
        peak = again > peak ? again : peak;
        printf("%s: fastest step %.3f s, mean %.3f s, %.1f model GFLOP/s, MFU %.3f; optimizer "
               "%.1f ms = %.1f%% of the mean step (%s)\n",
               bc->name, r.step_s, r.mean_s, r.gflops, r.gflops / peak, r.optim_s * 1e3,
               100.0 * r.optim_s / r.mean_s,
               unfused ? "unfused: clip, AdamW, zero_grad" : "fused: norm, then one pass");
        printf("RESULT name=%s_mfu value=%.1f unit=GFLOP/s "
               "ref=sgemm_peak(2048^3,%d_threads,best_of_5,highest_of_runs) ref_value=%.1f "
               "ratio=%.3f\n",
               bc->name, r.gflops, THREADS, peak, r.gflops / peak);
        if (!have_torch) {
            printf("%s tokens/s: %.1f (no PyTorch reference)\n", bc->name, r.tokens_per_s);
            continue;
        }
        if (torch_run(bc, &tr) < 0) {
            printf("%s tokens/s: %.1f (the PyTorch reference failed)\n", bc->name, r.tokens_per_s);
            rc = 1;
            continue;
        }
        printf("RESULT name=%s_tokens_per_s value=%.1f unit=tokens/s ref=pytorch-best(%s) "
               "ref_value=%.1f ratio=%.3f\n",
               bc->name, r.tokens_per_s, tr.best_label, tr.best_tps, r.tokens_per_s / tr.best_tps);
        printf("RESULT name=%s_tokens_per_s value=%.1f unit=tokens/s ref=pytorch-default(%s) "
               "ref_value=%.1f ratio=%.3f\n",
               bc->name, r.tokens_per_s, tr.dflt_label, tr.dflt_tps, r.tokens_per_s / tr.dflt_tps);
    }
    return rc;
}
