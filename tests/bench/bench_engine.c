/* chorus-bench-engine: training-step throughput of the CPU engine.
 *
 * In one run, with OpenBLAS on 2 threads (both cores of the CI machine):
 *   1. SGEMM peak: a 2048^3 single-precision matmul through kn_matmul_fwd (OpenBLAS,
 *      2 threads; best of 5, measured again after each model, the highest kept), the
 *      reference for MFU;
 *   2. for a small GPT (6 x 384, seq 256, B 4) and GPT-2 124M (12 x 768, seq 1024, B 1):
 *      full training steps (zero_grad, forward and backward on one micro-batch's acts,
 *      AdamW, all through the CPU backend table), model FLOP/s by the
 *      DESIGN §7 formula, MFU = that / SGEMM peak, tokens/s, all from the fastest timed
 *      step (the machines are shared; best-of is what repeats);
 *   3. a per-kernel breakdown at the same shapes (each kernel of the backend table timed alone,
 * times the number of calls in a step);
 *   4. when /usr/bin/python3 has torch: the same models in PyTorch on the same cores
 *      (tests/bench/torch_engine.py), for the tokens/s ratio against PyTorch at its best:
 *      for the small model the script sweeps PyTorch's CPU options (threads, mkldnn,
 *      AdamW foreach, jit.trace with the CPU fuser) from its defaults and keeps the
 *      fastest; GPT-2 124M runs PyTorch's defaults and the small model's winner (a sweep
 *      there would take many minutes). Each ratio is given against the best variant
 *      (pytorch-best, named) and against PyTorch's defaults (pytorch-default).
 * An optional argument runs one config only ("small" or "gpt2_124m").
 * Each comparison ends with a RESULT line (DESIGN §12). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "common/util.h"
#include "kernels/matmul.h"
#include "workerd/engine/backend.h"
#include "workerd/engine/model.h"

#define THREADS 2

typedef struct bench_cfg {
    const char *name;
    eng_config_t cfg;
    uint32_t B;
    int steps;       /* timed, after one warm-up step */
    int torch_steps; /* the same for each PyTorch variant, which is far slower */
    int torch_sweep; /* sweep PyTorch's options (else: its defaults and the last winner) */
} bench_cfg_t;

static const bench_cfg_t configs[] = {
    {"small", {6, 6, 384, 50257, 50304, 256}, 4, 5, 2, 1},
    {"gpt2_124m", {12, 12, 768, 50257, 50304, 1024}, 1, 3, 1, 0},
};

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
// whole training steps

typedef struct run {
    double step_s, mean_s, gflops, tokens_per_s; /* step_s: the fastest timed step */
} run_t;

static int train_steps(const bench_cfg_t *bc, run_t *out)
{
    const eng_config_t *c = &bc->cfg;
    uint32_t B = bc->B, T = c->seq_len;
    size_t N = (size_t)B * T;
    eng_model_t *m = NULL;
    uint64_t t0 = ch_now_ns();
    int rc = eng_model_create(c, B, 1337, &m);
    if (rc < 0) {
        fprintf(stderr, "bench-engine: eng_model_create: %d\n", rc);
        return rc;
    }
    printf("  %s: %zu parameters, created in %.2f s\n", bc->name, eng_model_nparams(m), secs(t0));
    size_t n = eng_model_nparams(m);
    const eng_backend_t *be = eng_model_backend(m);
    float *mom = calloc(n, sizeof *mom), *vel = calloc(n, sizeof *vel);
    int32_t *tok = malloc((N + 1) * sizeof *tok);
    eng_acts_t *acts = NULL;
    if (!mom || !vel || !tok || eng_acts_create(m, B, &acts) < 0) {
        rc = -1;
        goto out;
    }
    for (size_t i = 0; i <= N; i++) {
        tok[i] = (int32_t)(ch_rng_uniform_key(42, i) * c->vocab);
    }
    double total = 0.0, best = INFINITY;
    for (int s = 0; s <= bc->steps; s++) {
        float loss = 0.0f;
        t0 = ch_now_ns();
        eng_model_zero_grad(m);
        rc = eng_model_forward_acts(m, acts, tok, tok + 1, B, T, &loss);
        rc = rc < 0 ? rc : eng_model_backward_acts(m, acts, 1.0f / (float)N);
        if (rc < 0) {
            fprintf(stderr, "bench-engine: step: %d\n", rc);
            goto out;
        }
        float *p = eng_model_params(m);
        const float *g = eng_model_grads(m);
        for (size_t i = 0; i < eng_model_ntensors(m); i++) {
            const eng_tensor_t *t = eng_model_tensor(m, i);
            be->adamw(be, p + t->offset, g + t->offset, mom + t->offset, vel + t->offset, t->numel,
                      6e-4, 0.9, 0.95, 1e-8, t->decay ? 0.1 : 0.0, (uint64_t)s + 1);
        }
        double dt = secs(t0);
        printf("  %s step %d: loss %.4f, %.3f s%s\n", bc->name, s, loss, dt,
               s == 0 ? " (warm-up)" : "");
        if (s > 0) {
            total += dt;
            best = dt < best ? dt : best;
        }
    }
    out->step_s = best;
    out->mean_s = total / bc->steps;
    out->gflops = ch_plan_flops(c, B) / out->step_s * 1e-9;
    out->tokens_per_s = (double)N / out->step_s;
out:
    free(tok), free(mom), free(vel);
    eng_acts_destroy(acts);
    eng_model_destroy(m);
    return rc;
}

// ----------------------------------------------------------------------------
// per-kernel breakdown

typedef struct row {
    const char *name;
    double call_s;
    int calls;
    double flop; /* per call, 0 if not a matmul */
} row_t;

static void breakdown(const bench_cfg_t *bc, double step_s)
{
    const eng_backend_t *be = eng_backend_cpu();
    const eng_config_t *c = &bc->cfg;
    int B = (int)bc->B, T = (int)c->seq_len, C = (int)c->embd, NH = (int)c->heads;
    int L = (int)c->layers, V = (int)c->vocab, Vp = (int)c->padded_vocab, N = B * T;
    size_t NC = (size_t)N * C;
    float *x = buf(NC * 4, "x"), *y = buf(NC * 4, "y"), *dy = buf(NC * 4, "dy");
    float *w = buf((size_t)C * 4 * C, "w"), *dw = buf((size_t)C * 4 * C, "dw");
    float *wte = buf((size_t)Vp * C, "wte"), *dwte = buf((size_t)Vp * C, "dwte");
    float *att = buf((size_t)B * NH * T * T, "att"), *scratch = buf((size_t)T * T, "s");
    float *logits = buf((size_t)N * Vp, "logits"), *lse = buf((size_t)N, "lse");
    float *loss = buf((size_t)N, "loss"), *mean = buf((size_t)N, "m"), *rstd = buf((size_t)N, "r");
    int32_t *tok = malloc((size_t)N * sizeof *tok);
    if (tok == NULL) {
        exit(1);
    }
    for (int i = 0; i < N; i++) {
        tok[i] = (int32_t)(ch_rng_uniform_key(7, (uint64_t)i) * V);
    }
    size_t nparams =
        (size_t)Vp * C + (size_t)T * C + (size_t)L * (12 * (size_t)C * C + 13 * C) + 2 * C;
    float *p = buf(nparams, "p"), *g = buf(nparams, "g"), *mo = calloc(nparams, 4),
          *ve = calloc(nparams, 4);
    if (!mo || !ve) {
        exit(1);
    }

    row_t rows[20];
    int nr = 0;
    uint64_t t0;
    double lin = 2.0 * N * C * C; /* FLOP of an [N,C] x [C,C] matmul */
    /* attention: QK^T and PV over the causal half, forward */
    double attf = 2.0 * 2.0 * B * NH * (double)T * T / 2 * (C / NH);

    /* two passes; the first warms caches, page mappings and the BLAS threads */
    for (int pass = 0; pass < 2; pass++) {
        nr = 0;
        t0 = ch_now_ns(), be->encoder_fwd(be, x, tok, wte, wte, B, T, C);
        rows[nr++] = (row_t){"encoder fwd", secs(t0), 1, 0};
        t0 = ch_now_ns(), be->encoder_bwd(be, dwte, dwte, dy, tok, B, T, C);
        rows[nr++] = (row_t){"encoder bwd", secs(t0), 1, 0};
        t0 = ch_now_ns(), be->layernorm_fwd(be, y, mean, rstd, x, w, w, N, C);
        rows[nr++] = (row_t){"layernorm fwd", secs(t0), 2 * L + 1, 0};
        t0 = ch_now_ns(), be->layernorm_bwd(be, dy, dw, dw, y, x, w, mean, rstd, N, C);
        rows[nr++] = (row_t){"layernorm bwd", secs(t0), 2 * L + 1, 0};
        t0 = ch_now_ns(), be->matmul_fwd(be, y, x, w, w, N, C, 3 * C);
        rows[nr++] = (row_t){"matmul fwd c_attn", secs(t0), L, 3 * lin};
        t0 = ch_now_ns(), be->matmul_bwd(be, dy, dw, dw, y, x, w, N, C, 3 * C);
        rows[nr++] = (row_t){"matmul bwd c_attn", secs(t0), L, 6 * lin};
        t0 = ch_now_ns(), be->matmul_fwd(be, y, x, w, w, N, C, C);
        rows[nr++] = (row_t){"matmul fwd attn.c_proj", secs(t0), L, lin};
        t0 = ch_now_ns(), be->matmul_bwd(be, dy, dw, dw, y, x, w, N, C, C);
        rows[nr++] = (row_t){"matmul bwd attn.c_proj", secs(t0), L, 2 * lin};
        t0 = ch_now_ns(), be->matmul_fwd(be, y, x, w, w, N, C, 4 * C);
        rows[nr++] = (row_t){"matmul fwd c_fc", secs(t0), L, 4 * lin};
        t0 = ch_now_ns(), be->matmul_bwd(be, dy, dw, dw, y, x, w, N, C, 4 * C);
        rows[nr++] = (row_t){"matmul bwd c_fc", secs(t0), L, 8 * lin};
        t0 = ch_now_ns(), be->matmul_fwd(be, y, x, w, w, N, 4 * C, C);
        rows[nr++] = (row_t){"matmul fwd mlp.c_proj", secs(t0), L, 4 * lin};
        t0 = ch_now_ns(), be->matmul_bwd(be, dy, dw, dw, y, x, w, N, 4 * C, C);
        rows[nr++] = (row_t){"matmul bwd mlp.c_proj", secs(t0), L, 8 * lin};
        t0 = ch_now_ns(), be->attention_fwd(be, y, att, x, B, T, C, NH);
        rows[nr++] = (row_t){"attention fwd", secs(t0), L, attf};
        t0 = ch_now_ns(), be->attention_bwd(be, dy, scratch, y, x, att, B, T, C, NH);
        rows[nr++] = (row_t){"attention bwd", secs(t0), L, 2 * attf};
        t0 = ch_now_ns(), be->gelu_fwd(be, y, x, NC * 4);
        rows[nr++] = (row_t){"gelu fwd", secs(t0), L, 0};
        t0 = ch_now_ns(), be->gelu_bwd(be, dy, x, dy, NC * 4);
        rows[nr++] = (row_t){"gelu bwd", secs(t0), L, 0};
        t0 = ch_now_ns(), be->residual_fwd(be, y, y, x, NC);
        rows[nr++] = (row_t){"residual", secs(t0), 2 * L, 0};
        t0 = ch_now_ns(), be->lmhead_fwd(be, logits, lse, loss, x, wte, tok, N, C, V, Vp);
        rows[nr++] = (row_t){"lm head + xent fwd", secs(t0), 1, 2.0 * N * C * Vp};
        t0 = ch_now_ns(),
        be->lmhead_bwd(be, y, dwte, logits, lse, x, wte, tok, 1.0f / N, N, C, V, Vp);
        rows[nr++] = (row_t){"lm head + xent bwd", secs(t0), 1, 4.0 * N * C * V};
        t0 = ch_now_ns(), be->adamw(be, p, g, mo, ve, nparams, 1e-3, 0.9, 0.95, 1e-8, 0.1, 1);
        rows[nr++] = (row_t){"adamw", secs(t0), 1, 0};
    }
    printf("  %s per-kernel breakdown (each kernel alone, second of two runs, x calls per step):\n",
           bc->name);
    printf("    %-24s %10s %6s %10s %7s %9s\n", "kernel", "ms/call", "calls", "ms/step", "% step",
           "GFLOP/s");
    double sum = 0.0;
    for (int i = 0; i < nr; i++) {
        double per_step = rows[i].call_s * rows[i].calls;
        sum += per_step;
        printf("    %-24s %10.3f %6d %10.2f %6.1f%%", rows[i].name, rows[i].call_s * 1e3,
               rows[i].calls, per_step * 1e3, 100.0 * per_step / step_s);
        if (rows[i].flop > 0) {
            printf(" %9.1f", rows[i].flop / rows[i].call_s * 1e-9);
        }
        printf("\n");
    }
    printf("    %-24s %10s %6s %10.2f %6.1f%% (measured step %.2f ms)\n", "sum", "", "", sum * 1e3,
           100.0 * sum / step_s, step_s * 1e3);
    free(x), free(y), free(dy), free(w), free(dw), free(wte), free(dwte), free(att), free(scratch);
    free(logits), free(lse), free(loss), free(mean), free(rstd), free(tok);
    free(p), free(g), free(mo), free(ve);
}

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
    kn_blas_set_threads(THREADS);
    printf("chorus-bench-engine: OpenBLAS threads %d\n", kn_blas_threads());
    /* the machines are shared: the peak is the best of several runs, taken again after
     * each model so a busy spell does not inflate the ratio */
    double peak = sgemm_peak_gflops();
    printf("SGEMM peak (kn_matmul_fwd 2048^3, OpenBLAS %d threads, best of 5): %.1f GFLOP/s\n",
           THREADS, peak);
    int have_torch = torch_available();
    if (!have_torch) {
        printf("PyTorch reference skipped: " PYTHON " cannot import torch "
               "(Debian: apt-get install python3-torch)\n");
    }
    torch_ref_t tr = {0};
    int rc = 0;
    for (size_t i = 0; i < sizeof configs / sizeof configs[0]; i++) {
        const bench_cfg_t *bc = &configs[i];
        if (argc > 1 && strcmp(argv[1], bc->name) != 0) {
            continue;
        }
        run_t r;
        printf("%s: layers %u heads %u embd %u vocab %u seq %u batch %u\n", bc->name,
               bc->cfg.layers, bc->cfg.heads, bc->cfg.embd, bc->cfg.vocab, bc->cfg.seq_len, bc->B);
        if (train_steps(bc, &r) < 0) {
            rc = 1;
            continue;
        }
        breakdown(bc, r.step_s);
        double again = sgemm_peak_gflops();
        printf("SGEMM peak again: %.1f GFLOP/s; the reference is the highest so far\n", again);
        peak = again > peak ? again : peak;
        printf("%s: fastest step %.3f s, mean %.3f s, %.1f model GFLOP/s\n", bc->name, r.step_s,
               r.mean_s, r.gflops);
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
