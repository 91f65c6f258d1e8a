/* The model's seams for the 3D engine (workerd/engine/model.h): activations per micro-batch
 * with several in flight, a parameter base per block, and the stage API run as two pipeline
 * stages; each must give exactly the bits of the whole-model path. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "workerd/engine/model.h"

static const eng_config_t tiny = {
    .layers = 2, .heads = 2, .embd = 8, .vocab = 11, .padded_vocab = 16, .seq_len = 5};
enum { TB = 2, TT = 5, N = TB * TT, C = 8 };
static const int32_t in1[N] = {1, 4, 10, 0, 7, 3, 3, 9, 2, 5};
static const int32_t tg1[N] = {4, 10, 0, 7, 2, 3, 9, 2, 5, 8};
static const int32_t in2[N] = {6, 6, 1, 8, 0, 2, 10, 4, 4, 9};
static const int32_t tg2[N] = {6, 1, 8, 0, 3, 10, 4, 4, 9, 7};

static eng_model_t *make(const eng_model_opts_t *opts, uint64_t seed)
{
    eng_model_t *m = NULL;
    int rc = eng_model_create_opts(&tiny, opts, TB, seed, &m);
    cr_assert_eq(rc, 0, "eng_model_create_opts: %d", rc);
    return m;
}

static eng_acts_t *acts(eng_model_t *m)
{
    eng_acts_t *a = NULL;
    cr_assert_eq(eng_acts_create(m, TB, &a), 0);
    return a;
}

static float *copy_of(const float *x, size_t n)
{
    float *c = malloc(n * sizeof *c);
    cr_assert_not_null(c);
    memcpy(c, x, n * sizeof *c);
    return c;
}

static int same(const float *a, const float *b, size_t n)
{
    return memcmp(a, b, n * sizeof(float)) == 0;
}

// ----------------------------------------------------------------------------
// activations per micro-batch

/* 1F1B's order on one stage: forward 1, forward 2, backward 2, backward 1. Each backward
 * must use its own micro-batch's activations: the gradients are those of running the two
 * one after another in the same backward order, bit for bit. */
Test(model_stage, micro_batches_in_flight_give_the_gradients_of_one_after_another)
{
    eng_model_t *m = make(NULL, 11);
    size_t n = eng_model_nparams(m);
    eng_acts_t *a1 = acts(m), *a2 = acts(m);
    float l1 = 0, l2 = 0, f1 = 0, f2 = 0;

    eng_model_zero_grad(m);
    cr_assert_eq(eng_model_forward_acts(m, a1, in2, tg2, TB, TT, &l2), 0);
    cr_assert_eq(eng_model_backward_acts(m, a1, 1.0f / (2 * N)), 0);
    cr_assert_eq(eng_model_forward_acts(m, a1, in1, tg1, TB, TT, &l1), 0);
    cr_assert_eq(eng_model_backward_acts(m, a1, 1.0f / (2 * N)), 0);
    float *seq = copy_of(eng_model_grads(m), n);

    eng_model_zero_grad(m);
    cr_assert_eq(eng_model_forward_acts(m, a1, in1, tg1, TB, TT, &f1), 0);
    cr_assert_eq(eng_model_forward_acts(m, a2, in2, tg2, TB, TT, &f2), 0);
    cr_assert_eq(eng_model_backward_acts(m, a2, 1.0f / (2 * N)), 0);
    cr_assert_eq(eng_model_backward_acts(m, a1, 1.0f / (2 * N)), 0);
    cr_expect(f1 == l1 && f2 == l2, "losses %.9g %.9g in flight, %.9g %.9g one by one", f1, f2, l1,
              l2);
    cr_expect(same(eng_model_grads(m), seq, n),
              "gradients differ with two micro-batches in flight");
    /* each forward was consumed by its backward */
    cr_expect_eq(eng_model_backward_acts(m, a1, 1.0f), CH_E_STATE);
    cr_expect_eq(eng_model_backward_acts(m, a2, 1.0f), CH_E_STATE);

    /* and the forward order's sum agrees up to the order of the additions */
    eng_model_zero_grad(m);
    cr_assert_eq(eng_model_forward_acts(m, a1, in1, tg1, TB, TT, &f1), 0);
    cr_assert_eq(eng_model_backward_acts(m, a1, 1.0f / (2 * N)), 0);
    cr_assert_eq(eng_model_forward_acts(m, a1, in2, tg2, TB, TT, &f2), 0);
    cr_assert_eq(eng_model_backward_acts(m, a1, 1.0f / (2 * N)), 0);
    const float *g = eng_model_grads(m);
    for (size_t i = 0; i < n; i++)
        cr_assert(fabsf(g[i] - seq[i]) <= 1e-5f * fabsf(seq[i]) + 1e-8f, "grad[%zu] %g vs %g", i,
                  g[i], seq[i]);
    free(seq);
    eng_acts_destroy(a1);
    eng_acts_destroy(a2);
    eng_model_destroy(m);
}

Test(model_stage, acts_refuse_what_they_cannot_hold)
{
    eng_model_t *m = make(NULL, 2), *other = make(NULL, 2);
    eng_acts_t *a = NULL, *b = NULL;
    cr_expect_eq(eng_acts_create(m, TB + 1, &a), -EINVAL);
    cr_expect_null(a);
    cr_assert_eq(eng_acts_create(m, 1, &a), 0);
    cr_expect_eq(eng_model_forward_acts(m, a, in1, tg1, TB, TT, NULL), -EINVAL, "B above acts' B");
    cr_expect_eq(eng_model_backward_acts(m, a, 1.0f), CH_E_STATE);
    cr_assert_eq(eng_acts_create(other, TB, &b), 0);
    cr_expect_eq(eng_model_forward_acts(m, b, in1, tg1, TB, TT, NULL), -EINVAL, "another's acts");
    /* a forward without targets leaves nothing to differentiate */
    cr_assert_eq(eng_model_forward_acts(m, a, in1, NULL, 1, TT, NULL), 0);
    cr_expect_not_null(eng_model_logits(m));
    cr_expect_eq(eng_model_backward_acts(m, a, 1.0f), CH_E_STATE);
    eng_acts_destroy(a);
    eng_acts_destroy(b);
    eng_model_destroy(m);
    eng_model_destroy(other);
}

// ----------------------------------------------------------------------------
// a parameter base per block

Test(model_stage, a_block_pointed_at_another_buffer_computes_the_same)
{
    eng_model_t *ref = make(NULL, 5), *m = make(NULL, 5);
    size_t n = eng_model_nparams(m);
    float lref = 0, l = 0;
    cr_assert_eq(eng_model_forward(ref, in1, tg1, TB, TT, &lref), 0);
    cr_assert_eq(eng_model_backward(ref, 1.0f / N), 0);

    /* the block's range is contiguous and starts at h.1.ln_1.weight */
    float *p = NULL;
    size_t count = 0;
    cr_assert_eq(eng_model_block_params(m, 1, &p, &count), 0);
    const eng_tensor_t *first = eng_model_find(m, "h.1.ln_1.weight");
    const eng_tensor_t *last = eng_model_find(m, "h.1.mlp.c_proj.bias");
    cr_assert_eq(p, eng_model_params(m) + first->offset);
    cr_assert_eq(count, last->offset + last->numel - first->offset);
    cr_expect_eq(count, 12 * (size_t)C * C + 13 * (size_t)C);

    /* gather it elsewhere (as ZeRO-3 does), point the block there, poison the slab */
    float *gathered = copy_of(p, count), *gbuf = calloc(count, sizeof *gbuf);
    cr_assert_not_null(gbuf);
    cr_assert_eq(eng_model_set_block_params(m, 1, gathered), 0);
    cr_assert_eq(eng_model_set_block_grads(m, 1, gbuf), 0);
    for (size_t i = 0; i < count; i++)
        p[i] = NAN;
    float *q = NULL;
    cr_assert_eq(eng_model_block_params(m, 1, &q, &count), 0);
    cr_expect_eq(q, gathered);

    cr_assert_eq(eng_model_forward(m, in1, tg1, TB, TT, &l), 0);
    cr_assert_eq(eng_model_backward(m, 1.0f / N), 0);
    cr_expect_eq(l, lref, "loss %.9g vs %.9g", l, lref);
    const float *g = eng_model_grads(m), *gref = eng_model_grads(ref);
    size_t off = first->offset;
    /* block 1's gradients went to its buffer, everything else to the slab */
    cr_expect(same(gbuf, gref + off, count), "block 1's gradients differ");
    cr_expect(same(g, gref, off), "gradients before block 1 differ");
    cr_expect(same(g + off + count, gref + off + count, n - off - count),
              "gradients after block 1 differ");
    for (size_t i = 0; i < count; i++)
        cr_assert_eq(g[off + i], 0.0f, "the slab's range of block 1 got gradient");

    /* back to the slab */
    memcpy(p, gathered, count * sizeof *p);
    cr_assert_eq(eng_model_set_block_params(m, 1, NULL), 0);
    cr_assert_eq(eng_model_set_block_grads(m, 1, NULL), 0);
    cr_assert_eq(eng_model_block_grads(m, 1, &q, &count), 0);
    cr_expect_eq(q, eng_model_grads(m) + off);
    cr_assert_eq(eng_model_forward(m, in1, tg1, TB, TT, &l), 0);
    cr_expect_eq(l, lref);
    cr_expect_eq(eng_model_block_params(m, 2, &q, &count), -EINVAL);
    cr_expect_eq(eng_model_set_block_params(m, 2, gathered), -EINVAL);
    free(gathered);
    free(gbuf);
    eng_model_destroy(m);
    eng_model_destroy(ref);
}

// ----------------------------------------------------------------------------
// the stage API

/* The whole model's loss and gradients, one forward and backward on inputs 1. */
static eng_model_t *whole_run(float *loss)
{
    eng_model_t *w = make(NULL, 7);
    cr_assert_eq(eng_model_forward(w, in1, tg1, TB, TT, loss), 0);
    cr_assert_eq(eng_model_backward(w, 1.0f / N), 0);
    return w;
}

static void expect_grads_equal(eng_model_t *part, eng_model_t *whole)
{
    for (size_t i = 0; i < eng_model_ntensors(part); i++) {
        const eng_tensor_t *t = eng_model_tensor(part, i), *u = eng_model_find(whole, t->name);
        cr_assert_not_null(u, "%s", t->name);
        cr_assert_eq(t->numel, u->numel);
        cr_expect(
            same(eng_model_params(part) + t->offset, eng_model_params(whole) + u->offset, t->numel),
            "%s: parameters differ", t->name);
        cr_expect(
            same(eng_model_grads(part) + t->offset, eng_model_grads(whole) + u->offset, t->numel),
            "%s: gradients differ", t->name);
    }
}

Test(model_stage, two_pipeline_stages_equal_the_whole_model_bit_for_bit)
{
    float lw = 0, loss = 0;
    eng_model_t *w = whole_run(&lw);
    eng_model_t *s0 = make(&(eng_model_opts_t){.pp = 2, .stage = 0}, 7);
    eng_model_t *s1 = make(&(eng_model_opts_t){.pp = 2, .stage = 1}, 7);
    eng_model_part_t p0 = eng_model_part(s0), p1 = eng_model_part(s1);
    cr_assert(p0.first == 0 && p0.last == 1 && p0.embedding && !p0.head);
    cr_assert(p1.first == 1 && p1.last == 2 && !p1.embedding && p1.head);
    /* each stage's table: its rows of the whole table, in order; the last keeps wte */
    cr_expect_eq(eng_model_ntensors(s0), 2 + 12);
    cr_expect_eq(eng_model_ntensors(s1), 1 + 12 + 2);
    cr_expect_str_eq(eng_model_tensor(s1, 0)->name, "wte.weight");
    cr_expect_str_eq(eng_model_tensor(s1, 1)->name, "h.1.ln_1.weight");
    cr_expect_null(eng_model_find(s1, "wpe.weight"));
    cr_expect_null(eng_model_find(s0, "ln_f.weight"));

    eng_acts_t *a0 = acts(s0), *a1 = acts(s1);
    float x0[N * C], y0[N * C], x1[N * C], y1[N * C], d1[N * C], d0[N * C], dx0[N * C];
    // stage 0 forward, "send" y0; stage 1 receives it as x1
    cr_assert_eq(eng_model_embed_forward(s0, a0, in1, TB, TT, x0), 0);
    cr_assert_eq(eng_model_blocks_forward(s0, a0, 0, 1, x0, y0, TB, TT), 0);
    memcpy(x1, y0, sizeof x1);
    memset(y0, 0xff, sizeof y0); /* free once sent */
    cr_assert_eq(eng_model_blocks_forward(s1, a1, 1, 2, x1, y1, TB, TT), 0);
    cr_assert_eq(eng_model_head_forward(s1, a1, y1, tg1, TB, TT, &loss), 0);
    cr_expect_eq(loss, lw, "loss %.9g through the stages, %.9g whole", loss, lw);
    // stage 1 backward, "send" its input gradient to stage 0
    cr_assert_eq(eng_model_head_backward(s1, a1, 1.0f / N, d1), 0);
    cr_assert_eq(eng_model_blocks_backward(s1, a1, 1, 2, d1, d1), 0);
    memcpy(d0, d1, sizeof d0);
    /* the tied wte: the whole model adds the head's gradient first, then the embedding's;
     * handing stage 0 the head's part first (the embedding group's job) keeps that order */
    const eng_tensor_t *wte0 = eng_model_find(s0, "wte.weight");
    memcpy(eng_model_grads(s0) + wte0->offset, eng_model_grads(s1), wte0->numel * sizeof(float));
    cr_assert_eq(eng_model_blocks_backward(s0, a0, 0, 1, d0, dx0), 0); /* dx apart from dy */
    cr_assert_eq(eng_model_embed_backward(s0, a0, dx0), 0);

    expect_grads_equal(s0, w);
    for (size_t i = 1; i < eng_model_ntensors(s1); i++) /* all but wte: its head part alone */
        cr_expect(
            same(eng_model_grads(s1) + eng_model_tensor(s1, i)->offset,
                 eng_model_grads(w) + eng_model_find(w, eng_model_tensor(s1, i)->name)->offset,
                 eng_model_tensor(s1, i)->numel),
            "%s: gradients differ", eng_model_tensor(s1, i)->name);

    /* each part's backward needs its forward */
    cr_expect_eq(eng_model_head_backward(s1, a1, 1.0f, d1), CH_E_STATE);
    cr_expect_eq(eng_model_blocks_backward(s0, a0, 0, 1, d0, d0), CH_E_STATE);
    cr_expect_eq(eng_model_embed_backward(s0, a0, d0), CH_E_STATE);
    /* and runs only on what its model holds */
    cr_expect_eq(eng_model_embed_forward(s1, a1, in1, TB, TT, x0), -EINVAL);
    cr_expect_eq(eng_model_head_forward(s0, a0, x0, tg1, TB, TT, NULL), -EINVAL);
    cr_expect_eq(eng_model_blocks_forward(s0, a0, 0, 2, x0, y0, TB, TT), -EINVAL);
    cr_expect_eq(eng_model_blocks_forward(s0, a0, 0, 1, x0, x0, TB, TT), -EINVAL, "y == x");
    cr_expect_eq(eng_model_forward(s0, in1, tg1, TB, TT, NULL), -EINVAL, "not the whole model");
    cr_expect_eq(eng_model_create_opts(&tiny, &(eng_model_opts_t){.pp = 3}, TB, 7, &s0), -EINVAL);
    eng_acts_destroy(a0);
    eng_acts_destroy(a1);
    eng_model_destroy(s0);
    eng_model_destroy(s1);
    eng_model_destroy(w);
}

/* ZB-H1's last stage with the head split (opts.split_head): two micro-batches' input passes,
 * then their weight passes in order, leave the gradients of the whole backwards in the same
 * order, bit for bit; the wte gradient waits for the weight pass; out of order is refused. */
Test(model_stage, a_split_head_defers_wte_to_the_weight_pass_with_the_same_bits)
{
    eng_model_opts_t whole = {.pp = 2, .stage = 1, .split_backward = 1}, split = whole;
    split.split_head = 1;
    eng_model_t *w = make(&whole, 7), *s = make(&split, 7);
    size_t n = eng_model_nparams(w);
    cr_assert_eq(n, eng_model_nparams(s));
    const eng_tensor_t *wte = eng_model_find(s, "wte.weight");
    cr_assert_not_null(wte);
    const int32_t *in[2] = {in1, in2}, *tg[2] = {tg1, tg2};
    float x[2][N * C], d[N * C];
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < N * C; i++)
            x[k][i] = 0.01f * (float)((in[k][i % N] * 7 + i) % 23) - 0.1f;
    eng_acts_t *aw[2] = {acts(w), acts(w)}, *as[2] = {acts(s), acts(s)};
    eng_model_zero_grad(w);
    eng_model_zero_grad(s);
    float y[N * C], lw[2] = {0}, ls[2] = {0};
    for (int k = 0; k < 2; k++) {
        cr_assert_eq(eng_model_blocks_forward(w, aw[k], 1, 2, x[k], y, TB, TT), 0);
        cr_assert_eq(eng_model_head_forward(w, aw[k], y, tg[k], TB, TT, &lw[k]), 0);
        cr_assert_eq(eng_model_head_backward(w, aw[k], 1.0f / N, d), 0);
        cr_assert_eq(eng_model_blocks_backward(w, aw[k], 1, 2, d, d), 0);
    }
    float ds[2][N * C], ys[2][N * C];
    for (int k = 0; k < 2; k++) {
        cr_assert_eq(eng_model_blocks_forward(s, as[k], 1, 2, x[k], ys[k], TB, TT), 0);
        cr_assert_eq(eng_model_head_forward(s, as[k], ys[k], tg[k], TB, TT, &ls[k]), 0);
        cr_expect_eq(ls[k], lw[k], "micro-batch %d: loss %.9g split, %.9g whole", k, ls[k], lw[k]);
    }
    for (int k = 0; k < 2; k++) {
        cr_assert_eq(eng_model_head_backward(s, as[k], 1.0f / N, ds[k]), 0);
        cr_assert_eq(eng_model_blocks_backward_input(s, as[k], 1, 2, ds[k], ds[k]), 0);
    }
    /* the input passes left wte's gradient untouched */
    const float *gs = eng_model_grads(s);
    for (uint64_t i = 0; i < wte->numel; i++)
        cr_assert_eq(gs[wte->offset + i], 0.0f, "wte grad[%llu] before the weight pass",
                     (unsigned long long)i);
    /* a pending weight pass keeps its acts: no new head forward, no second backward */
    cr_expect_eq(eng_model_head_forward(s, as[0], ys[0], tg1, TB, TT, NULL), CH_E_STATE);
    cr_expect_eq(eng_model_head_backward(s, as[0], 1.0f / N, d), CH_E_STATE);
    for (int k = 0; k < 2; k++) {
        cr_assert_eq(eng_model_blocks_backward_weight(s, as[k], 1, 2), 0);
        cr_assert_eq(eng_model_head_backward_weight(s, as[k]), 0);
    }
    cr_expect(same(eng_model_grads(s), eng_model_grads(w), n),
              "split head: gradients differ from the whole backward's");
    cr_expect(same(ds[1], d, N * C), "split head: the input gradient differs");
    cr_expect_eq(eng_model_head_backward_weight(s, as[0]), CH_E_STATE, "weight pass twice");
    cr_expect_eq(eng_model_head_backward_weight(w, aw[0]), -EINVAL, "head not split");
    /* the head splits only under a split backward, on the head's part, at tp 1 */
    eng_model_t *bad = NULL;
    cr_expect_eq(eng_model_create_opts(
                     &tiny, &(eng_model_opts_t){.pp = 2, .stage = 1, .split_head = 1}, TB, 7, &bad),
                 -EINVAL);
    cr_expect_eq(eng_model_create_opts(
                     &tiny,
                     &(eng_model_opts_t){.pp = 2, .stage = 0, .split_backward = 1, .split_head = 1},
                     TB, 7, &bad),
                 -EINVAL);
    for (int k = 0; k < 2; k++) {
        eng_acts_destroy(aw[k]);
        eng_acts_destroy(as[k]);
    }
    eng_model_destroy(w);
    eng_model_destroy(s);
}

/* One model called piecewise: embedding, blocks [0,1), blocks [1,2), head and back. */
Test(model_stage, the_whole_model_run_piecewise_is_the_whole_model)
{
    float lw = 0, loss = 0;
    eng_model_t *w = whole_run(&lw), *m = make(NULL, 7);
    eng_acts_t *a = acts(m);
    float x[N * C], h[N * C], y[N * C], d[N * C];
    eng_model_zero_grad(m);
    cr_assert_eq(eng_model_embed_forward(m, a, in1, TB, TT, x), 0);
    cr_assert_eq(eng_model_blocks_forward(m, a, 0, 1, x, h, TB, TT), 0);
    cr_expect_eq(eng_model_blocks_forward(m, a, 1, 2, h, y, 1, TT), -EINVAL, "shape changed");
    cr_assert_eq(eng_model_blocks_forward(m, a, 1, 2, h, y, TB, TT), 0);
    cr_assert_eq(eng_model_head_forward(m, a, y, tg1, TB, TT, &loss), 0);
    cr_expect_eq(loss, lw);
    cr_assert_eq(eng_model_head_backward(m, a, 1.0f / N, d), 0);
    cr_assert_eq(eng_model_blocks_backward(m, a, 1, 2, d, d), 0);
    cr_assert_eq(eng_model_blocks_backward(m, a, 0, 1, d, d), 0);
    cr_assert_eq(eng_model_embed_backward(m, a, d), 0);
    expect_grads_equal(m, w);
    eng_acts_destroy(a);
    eng_model_destroy(m);
    eng_model_destroy(w);
}

// ----------------------------------------------------------------------------
// the LM head past the logits budget

/* A micro-batch of more rows than the logits budget (256 MiB of a 50304-wide vocab: 1334
 * rows) runs the head's forward and backward in one pass per cache-sized chunk; its
 * gradients and loss are those of the same tokens as two micro-batches that fit (computed
 * the plain way), to float rounding, and a backward whose forward was displaced by another
 * micro-batch's (it recomputes) agrees as well. */
Test(model_stage, a_head_past_the_logits_budget_is_computed_once_and_right)
{
    const eng_config_t wide = {
        .layers = 1, .heads = 2, .embd = 16, .vocab = 50257, .padded_vocab = 50304, .seq_len = 256};
    enum { B = 8, T = 256, NT = B * T };
    eng_model_t *big = NULL, *two = NULL;
    cr_assert_eq(eng_model_create(&wide, B, 5, &big), 0);
    cr_assert_eq(eng_model_create(&wide, B, 5, &two), 0);
    size_t n = eng_model_nparams(big);
    int32_t *tok = malloc((NT + 1) * sizeof *tok);
    cr_assert_not_null(tok);
    for (int i = 0; i <= NT; i++)
        tok[i] = (int32_t)(((uint64_t)i * 2654435761u) % wide.vocab);
    float scale = 1.0f / NT, lb = 0, l1 = 0, l2 = 0;
    eng_model_zero_grad(big);
    cr_assert_eq(eng_model_forward(big, tok, tok + 1, B, T, &lb), 0);
    cr_assert_null(eng_model_logits(big), "the logits of 2048 rows are never held whole");
    cr_assert_eq(eng_model_backward(big, scale), 0);
    eng_model_zero_grad(two);
    cr_assert_eq(eng_model_forward(two, tok, tok + 1, B / 2, T, &l1), 0);
    cr_assert_eq(eng_model_backward(two, scale), 0);
    cr_assert_eq(eng_model_forward(two, tok + NT / 2, tok + NT / 2 + 1, B / 2, T, &l2), 0);
    cr_assert_eq(eng_model_backward(two, scale), 0);
    cr_assert(fabsf(lb - (l1 + l2) / 2) < 1e-5f * lb, "loss %.7g vs %.7g", lb, (l1 + l2) / 2);
    const float *gb = eng_model_grads(big), *g2 = eng_model_grads(two);
    double worst = 0, gmax = 0;
    for (size_t i = 0; i < n; i++) {
        worst = fmax(worst, fabs((double)gb[i] - g2[i]));
        gmax = fmax(gmax, fabs((double)g2[i]));
    }
    cr_assert(gmax > 0 && worst <= 1e-5 * gmax, "gradients differ by %g (largest %g)", worst, gmax);

    /* forward 1, forward 2, backward 2, backward 1: the second backward recomputes */
    eng_acts_t *a1 = NULL, *a2 = NULL;
    cr_assert_eq(eng_acts_create(big, B, &a1), 0);
    cr_assert_eq(eng_acts_create(big, B, &a2), 0);
    float *want = copy_of(gb, n);
    eng_model_zero_grad(big);
    cr_assert_eq(eng_model_forward_acts(big, a1, tok, tok + 1, B, T, &l1), 0);
    cr_assert_eq(eng_model_forward_acts(big, a2, tok, tok + 1, B, T, &l2), 0);
    cr_assert_eq(l1, lb);
    cr_assert_eq(eng_model_backward_acts(big, a2, scale), 0);
    cr_assert(same(eng_model_grads(big), want, n), "the fused path is deterministic");
    cr_assert_eq(eng_model_backward_acts(big, a1, scale), 0);
    worst = 0;
    for (size_t i = 0; i < n; i++)
        worst = fmax(worst, fabs((double)eng_model_grads(big)[i] - 2.0 * want[i]));
    cr_assert(worst <= 2e-5 * gmax, "recomputed backward differs by %g", worst);
    eng_acts_destroy(a1), eng_acts_destroy(a2);
    free(want), free(tok);
    eng_model_destroy(big), eng_model_destroy(two);
}
