/* The engine's backend table (workerd/engine/backend.h): the model on the CPU backend and on a
 * test backend that forwards every call to the CPU table and counts it give the same bits, the
 * model reaches every kernel through the table, and every allocation it makes is freed. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "workerd/engine/backend.h"
#include "workerd/engine/model.h"
#include "workerd/engine/optim.h"

// ----------------------------------------------------------------------------
// a counting backend: the CPU table underneath, counters in ud

enum {
    OP_ENCODER_FWD,
    OP_ENCODER_BWD,
    OP_LAYERNORM_FWD,
    OP_LAYERNORM_BWD,
    OP_MATMUL_FWD,
    OP_MATMUL_BWD,
    OP_ATTENTION_FWD,
    OP_ATTENTION_BWD,
    OP_GELU_FWD,
    OP_GELU_BWD,
    OP_RESIDUAL_FWD,
    OP_LMHEAD_FWD,
    OP_LMHEAD_BWD,
    OP_ADAMW,
    OP_COPY,
    OP_MEMSET,
    NOPS
};

enum { MAX_LIVE = 64 };

typedef struct counts {
    const eng_backend_t *cpu;
    long calls[NOPS];
    long allocs, frees;
    void *live[MAX_LIVE]; /* pointers handed out and not yet freed */
    size_t nlive;
    int bad_free; /* a free of a pointer this backend did not hand out */
} counts_t;

static counts_t *cnt(const eng_backend_t *be, int op)
{
    counts_t *c = be->ud;
    if (op >= 0)
        c->calls[op]++;
    return c;
}

static int t_alloc(const eng_backend_t *be, size_t bytes, void **out)
{
    counts_t *c = cnt(be, -1);
    cr_assert_lt(c->nlive, MAX_LIVE);
    int rc = c->cpu->alloc(c->cpu, bytes, out);
    if (rc == 0) {
        c->allocs++;
        c->live[c->nlive++] = *out;
    }
    return rc;
}

static void t_free(const eng_backend_t *be, void *p)
{
    counts_t *c = cnt(be, -1);
    if (p == NULL)
        return;
    size_t i = 0;
    while (i < c->nlive && c->live[i] != p)
        i++;
    if (i == c->nlive) {
        c->bad_free = 1;
        return;
    }
    c->live[i] = c->live[--c->nlive];
    c->frees++;
    c->cpu->free(c->cpu, p);
}

static int t_copy(const eng_backend_t *be, void *dst, const void *src, size_t bytes,
                  eng_copy_dir_t dir)
{
    counts_t *c = cnt(be, OP_COPY);
    return c->cpu->copy(c->cpu, dst, src, bytes, dir);
}

static int t_memset(const eng_backend_t *be, void *p, int value, size_t bytes)
{
    counts_t *c = cnt(be, OP_MEMSET);
    return c->cpu->memset(c->cpu, p, value, bytes);
}

static void t_encoder_fwd(const eng_backend_t *be, float *out, const int32_t *inp, const float *wte,
                          const float *wpe, int B, int T, int C)
{
    counts_t *c = cnt(be, OP_ENCODER_FWD);
    c->cpu->encoder_fwd(c->cpu, out, inp, wte, wpe, B, T, C);
}

static void t_encoder_bwd(const eng_backend_t *be, float *dwte, float *dwpe, const float *dout,
                          const int32_t *inp, int B, int T, int C)
{
    counts_t *c = cnt(be, OP_ENCODER_BWD);
    c->cpu->encoder_bwd(c->cpu, dwte, dwpe, dout, inp, B, T, C);
}

static void t_layernorm_fwd(const eng_backend_t *be, float *out, float *mean, float *rstd,
                            const float *inp, const float *w, const float *b, int N, int C)
{
    counts_t *c = cnt(be, OP_LAYERNORM_FWD);
    c->cpu->layernorm_fwd(c->cpu, out, mean, rstd, inp, w, b, N, C);
}

static void t_layernorm_bwd(const eng_backend_t *be, float *dinp, float *dw, float *db,
                            const float *dout, const float *inp, const float *w, const float *mean,
                            const float *rstd, int N, int C)
{
    counts_t *c = cnt(be, OP_LAYERNORM_BWD);
    c->cpu->layernorm_bwd(c->cpu, dinp, dw, db, dout, inp, w, mean, rstd, N, C);
}

static void t_matmul_fwd(const eng_backend_t *be, float *out, const float *inp, const float *w,
                         const float *b, int N, int C, int OC)
{
    counts_t *c = cnt(be, OP_MATMUL_FWD);
    c->cpu->matmul_fwd(c->cpu, out, inp, w, b, N, C, OC);
}

static void t_matmul_bwd(const eng_backend_t *be, float *dinp, float *dw, float *db,
                         const float *dout, const float *inp, const float *w, int N, int C, int OC)
{
    counts_t *c = cnt(be, OP_MATMUL_BWD);
    c->cpu->matmul_bwd(c->cpu, dinp, dw, db, dout, inp, w, N, C, OC);
}

static void t_attention_fwd(const eng_backend_t *be, float *out, float *att, float *scratch,
                            const float *qkv, int B, int T, int C, int NH)
{
    counts_t *c = cnt(be, OP_ATTENTION_FWD);
    c->cpu->attention_fwd(c->cpu, out, att, scratch, qkv, B, T, C, NH);
}

static void t_attention_bwd(const eng_backend_t *be, float *dqkv, float *scratch, const float *dout,
                            const float *qkv, const float *att, int B, int T, int C, int NH)
{
    counts_t *c = cnt(be, OP_ATTENTION_BWD);
    c->cpu->attention_bwd(c->cpu, dqkv, scratch, dout, qkv, att, B, T, C, NH);
}

static void t_gelu_fwd(const eng_backend_t *be, float *out, const float *inp, size_t n)
{
    counts_t *c = cnt(be, OP_GELU_FWD);
    c->cpu->gelu_fwd(c->cpu, out, inp, n);
}

static void t_gelu_bwd(const eng_backend_t *be, float *dinp, const float *inp, const float *dout,
                       size_t n)
{
    counts_t *c = cnt(be, OP_GELU_BWD);
    c->cpu->gelu_bwd(c->cpu, dinp, inp, dout, n);
}

static void t_residual_fwd(const eng_backend_t *be, float *out, const float *a, const float *b,
                           size_t n)
{
    counts_t *c = cnt(be, OP_RESIDUAL_FWD);
    c->cpu->residual_fwd(c->cpu, out, a, b, n);
}

static void t_lmhead_fwd(const eng_backend_t *be, float *logits, float *lse, float *losses,
                         const float *x, const float *wte, const int32_t *targets, int N, int C,
                         int V, int Vp)
{
    counts_t *c = cnt(be, OP_LMHEAD_FWD);
    c->cpu->lmhead_fwd(c->cpu, logits, lse, losses, x, wte, targets, N, C, V, Vp);
}

static void t_lmhead_bwd(const eng_backend_t *be, float *dx, float *dwte, float *logits,
                         const float *lse, const float *x, const float *wte, const int32_t *targets,
                         float scale, int N, int C, int V, int Vp)
{
    counts_t *c = cnt(be, OP_LMHEAD_BWD);
    c->cpu->lmhead_bwd(c->cpu, dx, dwte, logits, lse, x, wte, targets, scale, N, C, V, Vp);
}

static void t_adamw(const eng_backend_t *be, float *p, const float *g, float *m, float *v, size_t n,
                    double lr, double b1, double b2, double eps, double wd, uint64_t t)
{
    counts_t *c = cnt(be, OP_ADAMW);
    c->cpu->adamw(c->cpu, p, g, m, v, n, lr, b1, b2, eps, wd, t);
}

static eng_backend_t counting_backend(counts_t *c, int host_memory)
{
    memset(c, 0, sizeof *c);
    c->cpu = eng_backend_cpu();
    return (eng_backend_t){
        .name = "counting",
        .host_memory = host_memory,
        .ud = c,
        .alloc = t_alloc,
        .free = t_free,
        .copy = t_copy,
        .memset = t_memset,
        .encoder_fwd = t_encoder_fwd,
        .encoder_bwd = t_encoder_bwd,
        .layernorm_fwd = t_layernorm_fwd,
        .layernorm_bwd = t_layernorm_bwd,
        .matmul_fwd = t_matmul_fwd,
        .matmul_bwd = t_matmul_bwd,
        .attention_fwd = t_attention_fwd,
        .attention_bwd = t_attention_bwd,
        .gelu_fwd = t_gelu_fwd,
        .gelu_bwd = t_gelu_bwd,
        .residual_fwd = t_residual_fwd,
        .lmhead_fwd = t_lmhead_fwd,
        .lmhead_bwd = t_lmhead_bwd,
        .adamw = t_adamw,
    };
}

// ----------------------------------------------------------------------------
// tests

static const eng_config_t tiny = {
    .layers = 2, .heads = 2, .embd = 8, .vocab = 11, .padded_vocab = 16, .seq_len = 5};
enum { TB = 2, TT = 5, L = 2 };
static const int32_t inputs[TB * TT] = {1, 4, 10, 0, 7, 3, 3, 9, 2, 5};
static const int32_t targets[TB * TT] = {4, 10, 0, 7, 2, 3, 9, 2, 5, 8};

/* Two training steps (forward, backward, AdamW); the final parameters and the losses. */
static void train(eng_model_t *m, float *loss)
{
    eng_optim_t o;
    cr_assert_eq(eng_optim_init(&o, eng_model_nparams(m)), 0);
    for (int s = 0; s < 2; s++) {
        eng_model_zero_grad(m);
        cr_assert_eq(eng_model_forward(m, inputs, targets, TB, TT, &loss[s]), 0);
        cr_assert_eq(eng_model_backward(m, 1.0f / (TB * TT)), 0);
        cr_assert_eq(eng_optim_step(&o, m, 1e-2), 0);
    }
    eng_optim_fini(&o);
}

Test(backend, a_wrapping_backend_gives_the_cpu_results_and_sees_every_call)
{
    counts_t c;
    eng_backend_t be = counting_backend(&c, 1);
    eng_model_opts_t opts = {.backend = &be};
    eng_model_t *ref = NULL, *m = NULL;
    cr_assert_eq(eng_model_create(&tiny, TB, 9, &ref), 0);
    cr_assert_eq(eng_model_create_opts(&tiny, &opts, TB, 9, &m), 0);
    cr_assert_eq(eng_model_backend(ref), eng_backend_cpu());
    cr_assert_eq(eng_model_backend(m), &be);
    cr_assert_gt(c.allocs, 0, "the model allocated nothing through its backend");
    size_t n = eng_model_nparams(m);
    cr_assert(memcmp(eng_model_params(ref), eng_model_params(m), n * sizeof(float)) == 0);

    /* one forward and backward: each kernel as often as GPT-2's graph says */
    memset(c.calls, 0, sizeof c.calls);
    float loss = 0;
    cr_assert_eq(eng_model_forward(m, inputs, targets, TB, TT, &loss), 0);
    cr_assert_eq(eng_model_backward(m, 1.0f), 0);
    long want[NOPS] = {[OP_ENCODER_FWD] = 1,
                       [OP_ENCODER_BWD] = 1,
                       [OP_LAYERNORM_FWD] = 2 * L + 1,
                       [OP_LAYERNORM_BWD] = 2 * L + 1,
                       [OP_MATMUL_FWD] = 4 * L,
                       [OP_MATMUL_BWD] = 4 * L,
                       [OP_ATTENTION_FWD] = L,
                       [OP_ATTENTION_BWD] = L,
                       [OP_GELU_FWD] = L,
                       [OP_GELU_BWD] = L,
                       [OP_RESIDUAL_FWD] = 2 * L,
                       [OP_LMHEAD_FWD] = 1,
                       [OP_LMHEAD_BWD] = 1};
    for (int op = 0; op < OP_ADAMW; op++)
        cr_expect_eq(c.calls[op], want[op], "kernel %d called %ld times, expected %ld", op,
                     c.calls[op], want[op]);

    /* two training steps on each: the same bits */
    float la[2], lb[2];
    eng_model_t *fresh = NULL;
    eng_model_destroy(m);
    cr_assert_eq(eng_model_create_opts(&tiny, &opts, TB, 9, &fresh), 0);
    memset(c.calls, 0, sizeof c.calls);
    train(ref, la);
    train(fresh, lb);
    cr_expect_eq(c.calls[OP_ADAMW], 2 * (long)eng_model_ntensors(fresh));
    cr_expect_eq(memcmp(la, lb, sizeof la), 0, "losses %.9g %.9g vs %.9g %.9g", la[0], la[1], lb[0],
                 lb[1]);
    cr_expect_eq(memcmp(eng_model_params(ref), eng_model_params(fresh), n * sizeof(float)), 0,
                 "parameters differ after two steps");
    cr_expect_eq(memcmp(eng_model_grads(ref), eng_model_grads(fresh), n * sizeof(float)), 0,
                 "gradients differ");
    eng_model_destroy(fresh);
    eng_model_destroy(ref);

    /* every allocation handed back, none freed that was not ours */
    cr_expect_eq(c.nlive, 0, "%zu allocations not freed", c.nlive);
    cr_expect_eq(c.allocs, c.frees);
    cr_expect_eq(c.bad_free, 0);
}

Test(backend, the_cpu_table_is_complete)
{
    const eng_backend_t *be = eng_backend_cpu();
    cr_assert_str_eq(be->name, "cpu");
    cr_assert(be->host_memory);
    int complete = be->alloc && be->free && be->copy && be->memset && be->encoder_fwd &&
                   be->encoder_bwd && be->layernorm_fwd && be->layernorm_bwd && be->matmul_fwd &&
                   be->matmul_bwd && be->attention_fwd && be->attention_bwd && be->gelu_fwd &&
                   be->gelu_bwd && be->residual_fwd && be->lmhead_fwd && be->lmhead_bwd &&
                   be->adamw;
    cr_assert(complete, "an entry of the CPU table is NULL");
    void *p = NULL;
    cr_assert_eq(be->alloc(be, 100, &p), 0);
    cr_assert_eq((uintptr_t)p % 64, 0, "not 64-byte aligned");
    cr_assert_eq(be->memset(be, p, 0, 100), 0);
    char q[100];
    cr_assert_eq(be->copy(be, q, p, 100, ENG_COPY_D2H), 0);
    for (int i = 0; i < 100; i++)
        cr_assert_eq(q[i], 0);
    be->free(be, p);
    be->free(be, NULL);
}

/* A backend that says its memory is not the host's (as CUDA's): the model makes each
 * tensor's initial values on the host and copies them in, and moves tokens and losses
 * with copy; the results are the same bits. */
Test(backend, a_device_memory_backend_is_initialised_through_copies)
{
    counts_t c;
    eng_backend_t be = counting_backend(&c, 0);
    eng_model_opts_t opts = {.backend = &be};
    eng_model_t *ref = NULL, *m = NULL;
    cr_assert_eq(eng_model_create(&tiny, TB, 4, &ref), 0);
    cr_assert_eq(eng_model_create_opts(&tiny, &opts, TB, 4, &m), 0);
    /* one copy per tensor that is not all zero: wte, wpe, 6 per block (4 weights and the
     * LayerNorm weights), ln_f.weight */
    cr_expect_eq(c.calls[OP_COPY], 2 + 6 * L + 1);
    size_t n = eng_model_nparams(m);
    cr_assert(memcmp(eng_model_params(ref), eng_model_params(m), n * sizeof(float)) == 0);
    float la[2], lb[2];
    train(ref, la);
    train(m, lb);
    cr_expect_eq(memcmp(la, lb, sizeof la), 0);
    cr_expect_eq(memcmp(eng_model_params(ref), eng_model_params(m), n * sizeof(float)), 0);
    eng_model_destroy(m);
    eng_model_destroy(ref);
    cr_expect_eq(c.nlive, 0);
    cr_expect_eq(c.allocs, c.frees);
}
