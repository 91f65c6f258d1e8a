/* GPT-2 model (workerd/model.h): the parameter table, initialisation, and the whole
 * model's loss and gradients against a double-precision GPT-2 written here (central
 * finite differences of its loss), on a tiny config. */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "workerd/engine/model.h"

static const eng_config_t tiny = {
    .layers = 2, .heads = 2, .embd = 8, .vocab = 11, .padded_vocab = 16, .seq_len = 5};
enum { TB = 2, TT = 5 };
static const int32_t tiny_inputs[TB * TT] = {1, 4, 10, 0, 7, 3, 3, 9, 2, 5};
static const int32_t tiny_targets[TB * TT] = {4, 10, 0, 7, 2, 3, 9, 2, 5, 8};

static eng_model_t *make(const eng_config_t *cfg, uint32_t max_B, uint64_t seed)
{
    eng_model_t *m = NULL;
    int rc = eng_model_create(cfg, max_B, seed, &m);
    cr_assert_eq(rc, 0, "eng_model_create: %d", rc);
    return m;
}

__attribute__((format(printf, 2, 3))) static const eng_tensor_t *find(const eng_model_t *m,
                                                                      const char *fmt, ...)
{
    char name[64];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    const eng_tensor_t *t = eng_model_find(m, name);
    cr_assert_not_null(t, "no tensor %s", name);
    return t;
}

// ----------------------------------------------------------------------------
// a double-precision GPT-2 over the model's slab layout

typedef struct dgpt {
    const eng_model_t *m;
    double *p; /* parameters, same layout as the slab */
    const int32_t *inp, *tgt;
    int B, T;
} dgpt_t;

/* the double parameters of tensor h.{l}.<suffix>, or of a top-level tensor when l < 0 */
static const double *dp(const dgpt_t *g, const char *suffix, int l)
{
    const eng_tensor_t *t = l < 0 ? find(g->m, "%s", suffix) : find(g->m, "h.%d.%s", l, suffix);
    return g->p + t->offset;
}

static void d_layernorm(double *out, const double *x, const double *w, const double *b, int N,
                        int C)
{
    for (int n = 0; n < N; n++) {
        const double *r = x + (size_t)n * C;
        double mean = 0.0, var = 0.0;
        for (int i = 0; i < C; i++) {
            mean += r[i] / C;
        }
        for (int i = 0; i < C; i++) {
            var += (r[i] - mean) * (r[i] - mean) / C;
        }
        for (int i = 0; i < C; i++) {
            out[(size_t)n * C + i] = (r[i] - mean) / sqrt(var + 1e-5) * w[i] + b[i];
        }
    }
}

static void d_linear(double *out, const double *x, const double *w, const double *b, int N, int C,
                     int OC)
{
    for (int n = 0; n < N; n++) {
        for (int o = 0; o < OC; o++) {
            double v = b[o];
            for (int i = 0; i < C; i++) {
                v += x[(size_t)n * C + i] * w[(size_t)i * OC + o];
            }
            out[(size_t)n * OC + o] = v;
        }
    }
}

static void d_attention(double *out, const double *qkv, int B, int T, int C, int NH)
{
    int hs = C / NH;
    double s[TT];
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            for (int h = 0; h < NH; h++) {
                const double *q = qkv + ((size_t)b * T + t) * 3 * C + h * hs;
                double mx = -INFINITY, sum = 0.0;
                for (int u = 0; u <= t; u++) {
                    const double *k = qkv + ((size_t)b * T + u) * 3 * C + C + h * hs;
                    s[u] = 0.0;
                    for (int i = 0; i < hs; i++) {
                        s[u] += q[i] * k[i] / sqrt((double)hs);
                    }
                    mx = fmax(mx, s[u]);
                }
                for (int u = 0; u <= t; u++) {
                    s[u] = exp(s[u] - mx);
                    sum += s[u];
                }
                for (int i = 0; i < hs; i++) {
                    double y = 0.0;
                    for (int u = 0; u <= t; u++) {
                        y += s[u] / sum * qkv[((size_t)b * T + u) * 3 * C + 2 * C + h * hs + i];
                    }
                    out[((size_t)b * T + t) * C + h * hs + i] = y;
                }
            }
        }
    }
}

/* mean cross-entropy of the double model */
static double dgpt_loss(void *ctx)
{
    dgpt_t *g = ctx;
    const eng_config_t *c = eng_model_config(g->m);
    int B = g->B, T = g->T, C = (int)c->embd, N = B * T, V = (int)c->vocab;
    double *x = calloc((size_t)N * C, sizeof *x), *ln = calloc((size_t)N * C, sizeof *ln);
    double *big = calloc((size_t)N * 4 * C, sizeof *big), *y = calloc((size_t)N * C, sizeof *y);
    cr_assert(x && ln && big && y);
    const double *wte = dp(g, "wte.weight", -1), *wpe = dp(g, "wpe.weight", -1);
    for (int n = 0; n < N; n++) {
        for (int i = 0; i < C; i++) {
            x[(size_t)n * C + i] = wte[(size_t)g->inp[n] * C + i] + wpe[(size_t)(n % T) * C + i];
        }
    }
    for (unsigned l = 0; l < c->layers; l++) {
        d_layernorm(ln, x, dp(g, "ln_1.weight", (int)l), dp(g, "ln_1.bias", (int)l), N, C);
        d_linear(big, ln, dp(g, "attn.c_attn.weight", (int)l), dp(g, "attn.c_attn.bias", (int)l), N,
                 C, 3 * C);
        d_attention(ln, big, B, T, C, (int)c->heads);
        d_linear(y, ln, dp(g, "attn.c_proj.weight", (int)l), dp(g, "attn.c_proj.bias", (int)l), N,
                 C, C);
        for (size_t i = 0; i < (size_t)N * C; i++) {
            x[i] += y[i];
        }
        d_layernorm(ln, x, dp(g, "ln_2.weight", (int)l), dp(g, "ln_2.bias", (int)l), N, C);
        d_linear(big, ln, dp(g, "mlp.c_fc.weight", (int)l), dp(g, "mlp.c_fc.bias", (int)l), N, C,
                 4 * C);
        for (size_t i = 0; i < (size_t)N * 4 * C; i++) {
            double u = big[i];
            big[i] = 0.5 * u * (1.0 + tanh(sqrt(2.0 / M_PI) * (u + 0.044715 * u * u * u)));
        }
        d_linear(y, big, dp(g, "mlp.c_proj.weight", (int)l), dp(g, "mlp.c_proj.bias", (int)l), N,
                 4 * C, C);
        for (size_t i = 0; i < (size_t)N * C; i++) {
            x[i] += y[i];
        }
    }
    d_layernorm(ln, x, dp(g, "ln_f.weight", -1), dp(g, "ln_f.bias", -1), N, C);
    double loss = 0.0;
    for (int n = 0; n < N; n++) {
        double logit[64], mx = -INFINITY, sum = 0.0;
        cr_assert(V <= 64);
        for (int v = 0; v < V; v++) {
            logit[v] = 0.0;
            for (int i = 0; i < C; i++) {
                logit[v] += ln[(size_t)n * C + i] * wte[(size_t)v * C + i];
            }
            mx = fmax(mx, logit[v]);
        }
        for (int v = 0; v < V; v++) {
            sum += exp(logit[v] - mx);
        }
        loss += (mx + log(sum) - logit[g->tgt[n]]) / N;
    }
    free(x), free(ln), free(big), free(y);
    return loss;
}

// ----------------------------------------------------------------------------
// tests

Test(model, tensor_table_matches_hugging_face_order)
{
    eng_model_t *m = make(&tiny, TB, 1);
    const char *block[] = {"ln_1.weight",      "ln_1.bias",          "attn.c_attn.weight",
                           "attn.c_attn.bias", "attn.c_proj.weight", "attn.c_proj.bias",
                           "ln_2.weight",      "ln_2.bias",          "mlp.c_fc.weight",
                           "mlp.c_fc.bias",    "mlp.c_proj.weight",  "mlp.c_proj.bias"};
    cr_assert_eq(eng_model_ntensors(m), 2 + 12 * tiny.layers + 2);
    size_t off = 0;
    for (size_t i = 0; i < eng_model_ntensors(m); i++) {
        const eng_tensor_t *t = eng_model_tensor(m, i);
        cr_assert_eq(t->offset, off, "%s not contiguous", t->name);
        off += t->numel;
        if (i >= 2 && i < 2 + 12 * tiny.layers) {
            char want[64];
            snprintf(want, sizeof want, "h.%zu.%s", (i - 2) / 12, block[(i - 2) % 12]);
            cr_assert_str_eq(t->name, want);
            cr_assert_eq(t->block, (int)((i - 2) / 12));
        }
        cr_assert_eq(t->decay, t->ndim == 2, "%s decay", t->name);
    }
    cr_assert_eq(off, eng_model_nparams(m));
    const eng_tensor_t *wte = eng_model_tensor(m, 0);
    cr_assert_str_eq(wte->name, "wte.weight");
    cr_assert(wte->shape[0] == 11 && wte->shape[1] == 8 && wte->numel == 16 * 8);
    const eng_tensor_t *qkv = find(m, "h.%u.attn.c_attn.weight", 1);
    cr_assert(qkv->shape[0] == 8 && qkv->shape[1] == 24);
    const eng_tensor_t *fcp = find(m, "h.%u.mlp.c_proj.weight", 0);
    cr_assert(fcp->shape[0] == 32 && fcp->shape[1] == 8);
    cr_assert_str_eq(eng_model_tensor(m, eng_model_ntensors(m) - 1)->name, "ln_f.bias");
    cr_assert_null(eng_model_find(m, "h.2.ln_1.weight"));
    eng_model_destroy(m);
}

Test(model, init_is_counter_based_and_deterministic)
{
    eng_model_t *a = make(&tiny, TB, 42), *b = make(&tiny, 1, 42), *c = make(&tiny, TB, 43);
    size_t n = eng_model_nparams(a);
    cr_assert(memcmp(eng_model_params(a), eng_model_params(b), n * sizeof(float)) == 0);
    cr_assert(memcmp(eng_model_params(a), eng_model_params(c), n * sizeof(float)) != 0);

    const float *p = eng_model_params(a);
    const eng_tensor_t *t = find(a, "h.%u.attn.c_attn.weight", 1);
    for (uint64_t i = 0; i < t->numel; i += 7) {
        cr_assert_eq(p[t->offset + i], 0.02f * ch_rng_normal(42, t->name, i));
    }
    float resid_std = 0.02f / sqrtf(4.0f);
    t = find(a, "h.%u.mlp.c_proj.weight", 0);
    cr_assert_eq(p[t->offset + 5], resid_std * ch_rng_normal(42, t->name, 5));
    t = find(a, "wpe.weight");
    cr_assert_eq(p[t->offset + 3], 0.02f * ch_rng_normal(42, "wpe.weight", 3));
    t = find(a, "wte.weight");
    for (size_t i = (size_t)tiny.vocab * tiny.embd; i < t->numel; i++) {
        cr_assert_eq(p[t->offset + i], 0.0f, "padded wte row not zero");
    }
    t = find(a, "h.%u.ln_2.weight", 1);
    cr_assert(p[t->offset] == 1.0f && p[t->offset + 7] == 1.0f);
    t = find(a, "h.%u.mlp.c_fc.bias", 1);
    for (size_t i = 0; i < t->numel; i++) {
        cr_assert_eq(p[t->offset + i], 0.0f);
    }
    /* the generator is order-independent: same (seed, name, index), same value */
    cr_assert_eq(ch_rng_normal(7, "x", 1000), ch_rng_normal(7, "x", 1000));
    cr_assert_neq(ch_rng_normal(7, "x", 1000), ch_rng_normal(7, "y", 1000));
    eng_model_destroy(a), eng_model_destroy(b), eng_model_destroy(c);
}

Test(model, rng_moments)
{
    double s = 0.0, s2 = 0.0;
    int n = 200000;
    for (int i = 0; i < n; i++) {
        double z = ch_rng_normal(3, "moments", (uint64_t)i);
        s += z;
        s2 += z * z;
    }
    cr_assert(fabs(s / n) < 0.01, "mean %g", s / n);
    cr_assert(fabs(s2 / n - 1.0) < 0.01, "variance %g", s2 / n);
}

Test(model, loss_at_init_is_log_vocab)
{
    eng_config_t cfg = tiny;
    cfg.vocab = 50, cfg.padded_vocab = 64;
    eng_model_t *m = make(&cfg, TB, 5);
    float loss = 0.0f;
    cr_assert_eq(eng_model_forward(m, tiny_inputs, tiny_targets, TB, TT, &loss), 0);
    cr_assert(fabs(loss - log(50.0)) < 0.05, "loss %g, ln V %g", loss, log(50.0));
    eng_model_destroy(m);
}

/* Spread the parameters out so every gradient is well above rounding noise. */
static void randomise(eng_model_t *m)
{
    float *p = eng_model_params(m);
    for (size_t i = 0; i < eng_model_ntensors(m); i++) {
        const eng_tensor_t *t = eng_model_tensor(m, i);
        int is_ln_weight = strstr(t->name, "ln_") != NULL && strstr(t->name, "weight") != NULL;
        for (size_t j = 0; j < t->numel; j++) {
            float z = ch_rng_normal(99, t->name, j);
            p[t->offset + j] = is_ln_weight ? 1.0f + 0.2f * z : 0.3f * z;
        }
    }
    const eng_tensor_t *wte = eng_model_tensor(m, 0);
    size_t real = (size_t)wte->shape[0] * wte->shape[1];
    memset(p + wte->offset + real, 0, (wte->numel - real) * sizeof(float));
}

Test(model, gradients_match_double_precision_finite_differences)
{
    eng_model_t *m = make(&tiny, TB, 11);
    randomise(m);
    size_t n = eng_model_nparams(m);
    float loss = 0.0f;
    eng_model_zero_grad(m);
    cr_assert_eq(eng_model_forward(m, tiny_inputs, tiny_targets, TB, TT, &loss), 0);
    cr_assert_eq(eng_model_backward(m, 1.0f / (TB * TT)), 0);
    const float *grad = eng_model_grads(m);

    dgpt_t g = {m, malloc(n * sizeof(double)), tiny_inputs, tiny_targets, TB, TT};
    cr_assert_not_null(g.p);
    for (size_t i = 0; i < n; i++) {
        g.p[i] = eng_model_params(m)[i];
    }
    double want_loss = dgpt_loss(&g);
    cr_assert(fabs(loss - want_loss) < 1e-5 * want_loss, "loss %.9g, double %.9g", loss, want_loss);

    const double h = 1e-5;
    for (size_t ti = 0; ti < eng_model_ntensors(m); ti++) {
        const eng_tensor_t *t = eng_model_tensor(m, ti);
        double maxabs = 0.0;
        double *fd = malloc(t->numel * sizeof *fd);
        cr_assert_not_null(fd);
        for (size_t j = 0; j < t->numel; j++) {
            double *x = &g.p[t->offset + j], x0 = *x;
            *x = x0 + h;
            double lp = dgpt_loss(&g);
            *x = x0 - h;
            double lm = dgpt_loss(&g);
            *x = x0;
            fd[j] = (lp - lm) / (2 * h);
            maxabs = fmax(maxabs, fabs(fd[j]));
        }
        cr_assert(maxabs > 1e-4, "%s: gradient vanishes, check is vacuous", t->name);
        for (size_t j = 0; j < t->numel; j++) {
            float a = grad[t->offset + j];
            cr_assert(fabs(a - fd[j]) <= 1e-3 * fabs(fd[j]) + 1e-4 * maxabs,
                      "%s[%zu]: analytic %.8g, finite differences %.8g", t->name, j, a, fd[j]);
        }
        free(fd);
    }
    const eng_tensor_t *wte = eng_model_tensor(m, 0);
    for (size_t j = (size_t)tiny.vocab * tiny.embd; j < wte->numel; j++) {
        cr_assert_eq(grad[wte->offset + j], 0.0f, "padded wte row got gradient");
    }
    free(g.p);
    eng_model_destroy(m);
}

Test(model, backward_accumulates_with_scale)
{
    eng_model_t *m = make(&tiny, TB, 3);
    size_t n = eng_model_nparams(m);
    float loss;
    cr_assert_eq(eng_model_forward(m, tiny_inputs, tiny_targets, TB, TT, &loss), 0);
    cr_assert_eq(eng_model_backward(m, 0.5f), 0);
    float *once = malloc(n * sizeof *once);
    cr_assert_not_null(once);
    memcpy(once, eng_model_grads(m), n * sizeof *once);
    cr_assert_eq(eng_model_forward(m, tiny_inputs, tiny_targets, TB, TT, &loss), 0);
    cr_assert_eq(eng_model_backward(m, 1.5f), 0);
    const float *twice = eng_model_grads(m);
    double maxabs = 0.0;
    for (size_t i = 0; i < n; i++) {
        maxabs = fmax(maxabs, fabs(once[i]));
    }
    for (size_t i = 0; i < n; i++) {
        cr_assert(fabs(twice[i] - 4.0f * once[i]) <= 1e-5 * fabs(4.0f * once[i]) + 1e-6 * maxabs,
                  "grad[%zu]: %g after both, %g after the first", i, twice[i], once[i]);
    }
    /* a second backward without a forward has nothing to differentiate */
    cr_assert_lt(eng_model_backward(m, 1.0f), 0);
    eng_model_zero_grad(m);
    for (size_t i = 0; i < n; i++) {
        cr_assert_eq(eng_model_grads(m)[i], 0.0f);
    }
    free(once);
    eng_model_destroy(m);
}

Test(model, sgd_step_lowers_loss)
{
    eng_model_t *m = make(&tiny, TB, 8);
    float before = 0.0f, after = 0.0f;
    eng_model_zero_grad(m);
    cr_assert_eq(eng_model_forward(m, tiny_inputs, tiny_targets, TB, TT, &before), 0);
    cr_assert_eq(eng_model_backward(m, 1.0f / (TB * TT)), 0);
    float *p = eng_model_params(m);
    const float *g = eng_model_grads(m);
    for (size_t i = 0; i < eng_model_nparams(m); i++) {
        p[i] -= 0.1f * g[i];
    }
    cr_assert_eq(eng_model_forward(m, tiny_inputs, tiny_targets, TB, TT, &after), 0);
    cr_assert_lt(after, before, "loss %g -> %g", before, after);
    eng_model_destroy(m);
}

Test(model, logits_and_input_checks)
{
    eng_model_t *m = make(&tiny, TB, 4);
    cr_assert_eq(eng_model_forward(m, tiny_inputs, NULL, TB, TT, NULL), 0);
    const float *logits = eng_model_logits(m);
    cr_assert_not_null(logits);
    /* the loss equals the cross-entropy of the returned logits over the real vocab */
    float loss = 0.0f;
    cr_assert_eq(eng_model_forward(m, tiny_inputs, tiny_targets, TB, TT, &loss), 0);
    double want = 0.0;
    for (int n = 0; n < TB * TT; n++) {
        const float *row = logits + (size_t)n * tiny.padded_vocab;
        double sum = 0.0;
        for (uint32_t v = 0; v < tiny.vocab; v++) {
            sum += exp(row[v]);
        }
        want += (log(sum) - row[tiny_targets[n]]) / (TB * TT);
    }
    cr_assert(fabs(loss - want) < 1e-5, "loss %g want %g", loss, want);
    /* a shorter sequence and a smaller batch are fine */
    cr_assert_eq(eng_model_forward(m, tiny_inputs, tiny_targets, 1, 3, &loss), 0);
    cr_assert_eq(eng_model_backward(m, 1.0f), 0);
    /* out-of-range shapes and tokens are refused */
    int32_t bad[TB * TT];
    memcpy(bad, tiny_inputs, sizeof bad);
    bad[3] = 11;
    cr_assert_eq(eng_model_forward(m, bad, NULL, TB, TT, NULL), -EINVAL);
    cr_assert_eq(eng_model_forward(m, tiny_inputs, bad, TB, TT, &loss), -EINVAL);
    cr_assert_eq(eng_model_forward(m, tiny_inputs, NULL, TB + 1, TT, NULL), -EINVAL);
    cr_assert_eq(eng_model_forward(m, tiny_inputs, NULL, TB, TT + 1, NULL), -EINVAL);
    eng_model_destroy(m);

    eng_config_t cfg = tiny;
    cfg.heads = 3; /* 8 channels do not split into 3 heads */
    cr_assert_eq(eng_model_create(&cfg, 1, 0, &m), -EINVAL);
    cfg = tiny;
    cfg.padded_vocab = 10;
    cr_assert_eq(eng_model_create(&cfg, 1, 0, &m), -EINVAL);
}

/* With B*T above the logits budget the LM head runs in chunks and the backward
 * recomputes all but the last chunk; gradients must equal the unchunked ones. */
Test(model, chunked_lm_head_matches_unchunked)
{
    eng_config_t cfg = {.layers = 1,
                        .heads = 1,
                        .embd = 8,
                        .vocab = 299999,
                        .padded_vocab = 300000,
                        .seq_len = 128};
    eng_model_t *m = make(&cfg, 2, 6);
    size_t n = eng_model_nparams(m), N = 2 * 128;
    int32_t *inp = malloc(N * sizeof *inp), *tgt = malloc(N * sizeof *tgt);
    float *sum = calloc(n, sizeof *sum);
    cr_assert(inp && tgt && sum);
    for (size_t i = 0; i < N; i++) {
        inp[i] = (int32_t)((i * 7919) % cfg.vocab);
        tgt[i] = (int32_t)((i * 104729 + 13) % cfg.vocab);
    }
    /* one sequence at a time fits the budget (64M floats / 300000 = 223 rows) */
    float loss0 = 0.0f, loss1 = 0.0f, loss = 0.0f;
    eng_model_zero_grad(m);
    cr_assert_eq(eng_model_forward(m, inp, tgt, 1, 128, &loss0), 0);
    cr_assert_not_null(eng_model_logits(m));
    cr_assert_eq(eng_model_backward(m, 1.0f / N), 0);
    cr_assert_eq(eng_model_forward(m, inp + 128, tgt + 128, 1, 128, &loss1), 0);
    cr_assert_eq(eng_model_backward(m, 1.0f / N), 0);
    memcpy(sum, eng_model_grads(m), n * sizeof *sum);
    /* both at once: 256 rows, two chunks */
    eng_model_zero_grad(m);
    cr_assert_eq(eng_model_forward(m, inp, tgt, 2, 128, &loss), 0);
    cr_assert_null(eng_model_logits(m), "logits of a chunked forward are not all kept");
    cr_assert_eq(eng_model_backward(m, 1.0f / N), 0);
    cr_assert(fabs(loss - 0.5f * (loss0 + loss1)) < 1e-5f * loss);
    const float *g = eng_model_grads(m);
    double maxabs = 0.0;
    for (size_t i = 0; i < n; i++) {
        maxabs = fmax(maxabs, fabs(sum[i]));
    }
    for (size_t i = 0; i < n; i++) {
        cr_assert(fabs(g[i] - sum[i]) <= 1e-4 * fabs(sum[i]) + 1e-5 * maxabs, "grad[%zu] %g vs %g",
                  i, g[i], sum[i]);
    }
    free(inp), free(tgt), free(sum);
    eng_model_destroy(m);
}

Test(model, flops_formula)
{
    eng_config_t gpt2 = {.layers = 12,
                         .heads = 12,
                         .embd = 768,
                         .vocab = 50257,
                         .padded_vocab = 50304,
                         .seq_len = 1024};
    double s = 1024, l = 12, h = 768, V = 50304;
    double want = 72.0 * 8 * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h));
    cr_assert(fabs(ch_plan_flops(&gpt2, 8) - want) < 1e-6 * want);
    /* about 6 * params * tokens plus attention: 124M params, 8K tokens */
    cr_assert(ch_plan_flops(&gpt2, 8) > 6.0 * 124e6 * 8192);
}

/* Megatron's split of every tensor: QKV and MLP-up column parallel (weights and biases),
 * attention-out and MLP-down row parallel (weights; their biases added once after the
 * all-reduce are whole), wte vocab parallel, LayerNorms and wpe replicated. */
Test(model, every_tensor_has_its_tensor_parallel_split)
{
    eng_model_t *m = make(&tiny, TB, 1);
    static const struct {
        const char *suffix;
        eng_split_t split;
    } block[] = {
        {"ln_1.weight", ENG_SPLIT_NONE},          {"ln_1.bias", ENG_SPLIT_NONE},
        {"attn.c_attn.weight", ENG_SPLIT_COLUMN}, {"attn.c_attn.bias", ENG_SPLIT_COLUMN},
        {"attn.c_proj.weight", ENG_SPLIT_ROW},    {"attn.c_proj.bias", ENG_SPLIT_NONE},
        {"ln_2.weight", ENG_SPLIT_NONE},          {"ln_2.bias", ENG_SPLIT_NONE},
        {"mlp.c_fc.weight", ENG_SPLIT_COLUMN},    {"mlp.c_fc.bias", ENG_SPLIT_COLUMN},
        {"mlp.c_proj.weight", ENG_SPLIT_ROW},     {"mlp.c_proj.bias", ENG_SPLIT_NONE},
    };
    for (uint32_t l = 0; l < tiny.layers; l++) {
        for (size_t i = 0; i < sizeof block / sizeof block[0]; i++) {
            const eng_tensor_t *t = find(m, "h.%u.%s", l, block[i].suffix);
            cr_expect_eq(t->split, block[i].split, "%s: split %d, expected %d", t->name, t->split,
                         block[i].split);
        }
    }
    cr_expect_eq(find(m, "wte.weight")->split, ENG_SPLIT_VOCAB);
    cr_expect_eq(find(m, "wpe.weight")->split, ENG_SPLIT_NONE);
    cr_expect_eq(find(m, "ln_f.weight")->split, ENG_SPLIT_NONE);
    cr_expect_eq(find(m, "ln_f.bias")->split, ENG_SPLIT_NONE);
    eng_model_destroy(m);
}
