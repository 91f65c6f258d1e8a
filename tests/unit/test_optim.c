/* workerd/optim: AdamW against hand-computed values, the LR schedule, clipping. */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/jobspec.h"
#include "workerd/engine/model.h"
#include "workerd/engine/optim.h"

static eng_model_t *tiny_model(void)
{
    eng_config_t cfg = {
        .layers = 1, .heads = 2, .embd = 8, .vocab = 13, .padded_vocab = 16, .seq_len = 4};
    eng_model_t *m = NULL;
    cr_assert_eq(eng_model_create(&cfg, 2, 1, &m), 0);
    return m;
}

Test(optim, adamw_first_step_by_hand)
{
    /* Step 1: mhat = g and vhat = g^2, so the update is lr * g / (|g| + eps):
     * decayed weight 1.0, g = 0.5, lr 0.1: 1 * (1 - 0.1 * 0.1) - 0.1 * 0.5 / 0.50000001
     *   = 0.99 - 0.0999999980 = 0.8900000020;
     * a bias (no decay) 1.0, g = -2: 1 + 0.1 * 2 / 2.00000001 = 1.0999999995. */
    eng_model_t *m = tiny_model();
    eng_optim_t o;
    cr_assert_eq(eng_optim_init(&o, eng_model_nparams(m)), 0);
    const eng_tensor_t *w = eng_model_find(m, "h.0.attn.c_attn.weight");
    const eng_tensor_t *b = eng_model_find(m, "h.0.attn.c_attn.bias");
    cr_assert(w && b && w->decay && !b->decay);
    float *p = eng_model_params(m), *g = eng_model_grads(m);
    memset(g, 0, eng_model_nparams(m) * sizeof *g);
    p[w->offset] = 1.0f;
    g[w->offset] = 0.5f;
    p[b->offset] = 1.0f;
    g[b->offset] = -2.0f;
    float untouched = p[w->offset + 1]; /* zero gradient, decayed only */
    cr_assert_eq(eng_optim_step(&o, m, 0.1), 0);
    cr_expect_float_eq(p[w->offset], 0.8900000020f, 1e-7);
    cr_expect_float_eq(p[b->offset], 1.0999999995f, 1e-7);
    cr_expect_float_eq(p[w->offset + 1], untouched * 0.99f, 1e-9);
    cr_expect_float_eq(o.m[w->offset], 0.05f, 1e-9);
    cr_expect_float_eq(o.v[w->offset], 0.0125f, 1e-9);
    cr_expect_eq(o.t, 1);
    eng_optim_fini(&o);
    eng_model_destroy(m);
}

Test(optim, adamw_three_steps_match_the_formula)
{
    eng_model_t *m = tiny_model();
    eng_optim_t o;
    cr_assert_eq(eng_optim_init(&o, eng_model_nparams(m)), 0);
    float *p = eng_model_params(m), *g = eng_model_grads(m);
    size_t n = eng_model_nparams(m);
    float *p0 = malloc(n * sizeof *p0);
    memcpy(p0, p, n * sizeof *p0);
    double lrs[3] = {1e-3, 5e-4, 2e-3};
    double gs[3][4] = {{0.3, -0.1, 1e-3, 2}, {-0.2, -0.1, 5e-3, 1}, {0.1, 0.4, -1e-3, -3}};
    for (int s = 0; s < 3; s++) {
        for (size_t i = 0; i < n; i++)
            g[i] = (float)gs[s][i % 4];
        cr_assert_eq(eng_optim_step(&o, m, lrs[s]), 0);
    }
    /* the textbook formula in double, per element */
    for (size_t k = 0; k < eng_model_ntensors(m); k++) {
        const eng_tensor_t *t = eng_model_tensor(m, k);
        for (size_t e = 0; e < t->numel; e += 7) {
            size_t i = t->offset + e;
            double pp = p0[i], mm = 0, vv = 0, wd = t->decay ? 0.1 : 0.0;
            for (int s = 0; s < 3; s++) {
                double gg = (float)gs[s][i % 4];
                pp *= 1 - lrs[s] * wd;
                mm = 0.9 * mm + 0.1 * gg;
                vv = 0.95 * vv + 0.05 * gg * gg;
                pp -= lrs[s] * (mm / (1 - pow(0.9, s + 1))) /
                      (sqrt(vv / (1 - pow(0.95, s + 1))) + 1e-8);
            }
            cr_assert(fabs(p[i] - pp) <= 1e-6 * fabs(pp) + 1e-7, "%s[%zu]: %.9g vs %.9g", t->name,
                      e, p[i], pp);
        }
    }
    free(p0);
    eng_optim_fini(&o);
    eng_model_destroy(m);
}

Test(optim, schedule_warmup_then_cosine)
{
    ch_jobspec_t j;
    ch_jobspec_defaults(&j);
    j.train.lr = 1e-3;
    j.train.lr_min = -1;
    j.train.warmup = 10;
    j.train.steps = 110;
    eng_lr_t s = eng_lr_from_spec(&j);
    cr_expect_float_eq(s.lr_min, 1e-4, 1e-15);
    cr_expect_float_eq(eng_lr_at(&s, 0), 1e-4, 1e-15);  /* lr / warmup */
    cr_expect_float_eq(eng_lr_at(&s, 4), 5e-4, 1e-15);  /* lr * 5 / 10 */
    cr_expect_float_eq(eng_lr_at(&s, 9), 1e-3, 1e-15);  /* lr */
    cr_expect_float_eq(eng_lr_at(&s, 10), 1e-3, 1e-15); /* cosine starts at lr */
    /* half way through the cosine (10 + 99/2): lr_min + (lr - lr_min) / 2 */
    ch_jobspec_t j2 = j;
    j2.train.steps = 111; /* cosine span 100 steps: s = 60 is the midpoint */
    eng_lr_t s2 = eng_lr_from_spec(&j2);
    cr_expect_float_eq(eng_lr_at(&s2, 60), 5.5e-4, 1e-15);
    cr_expect_float_eq(eng_lr_at(&s, 109), 1e-4, 1e-15); /* lr_min at the last step */
    for (int64_t k = 11; k < 110; k++)
        cr_expect_lt(eng_lr_at(&s, k), eng_lr_at(&s, k - 1));

    j.train.warmup = 0;
    j.train.lr_min = 1e-3;
    s = eng_lr_from_spec(&j);
    for (int64_t k = 0; k < 110; k += 13)
        cr_expect_eq(eng_lr_at(&s, k), 1e-3);
    j.train.lr_min = 0;
    s = eng_lr_from_spec(&j);
    cr_expect_eq(eng_lr_at(&s, 0), 1e-3);
    cr_expect_float_eq(eng_lr_at(&s, 109), 0.0, 1e-18);
}

Test(optim, clipping_like_clip_grad_norm)
{
    float g[4] = {3, 4, 0, 0}; /* norm 5 */
    double norm = eng_grad_clip(g, 4, 1.0);
    cr_expect_float_eq(norm, 5.0, 1e-12);
    float coef = (float)(1.0 / (5.0 + 1e-6));
    cr_expect_eq(g[0], 3 * coef);
    cr_expect_eq(g[1], 4 * coef);
    cr_expect_float_eq(eng_grad_norm(g, 4), 1.0, 1e-6);
    float small[3] = {0.1f, 0.2f, -0.2f}; /* norm 0.3: untouched */
    norm = eng_grad_clip(small, 3, 1.0);
    cr_expect_float_eq(norm, 0.3, 1e-7);
    cr_expect_eq(small[0], 0.1f);
    cr_expect_eq(small[2], -0.2f);
    float exact[1] = {1.0f}; /* coef = 1 / (1 + 1e-6) < 1: torch clips even here */
    eng_grad_clip(exact, 1, 1.0);
    cr_expect_lt(exact[0], 1.0f);
}

/* GPT-2's shape at a small width: enough parameters that the optimizer's passes run on
 * the kernels' pool. */
static eng_model_t *wide_model(void)
{
    eng_config_t cfg = {
        .layers = 2, .heads = 4, .embd = 128, .vocab = 500, .padded_vocab = 512, .seq_len = 16};
    eng_model_t *m = NULL;
    cr_assert_eq(eng_model_create(&cfg, 2, 3, &m), 0);
    float *g = eng_model_grads(m);
    for (size_t i = 0; i < eng_model_nparams(m); i++)
        g[i] = (float)sin((double)i * 0.37) * 3.0f; /* norm far above 1: clipping applies */
    return m;
}

/* The fused step (clip coefficient, AdamW, gradient reset in one pass over the kernels'
 * threads) gives the bits of eng_grad_clip, eng_optim_step and zeroing, for two steps. */
Test(optim, fused_step_equals_clip_then_step_then_zero)
{
    eng_model_t *a = wide_model(), *b = wide_model();
    size_t n = eng_model_nparams(a);
    eng_optim_t oa, ob;
    cr_assert_eq(eng_optim_init(&oa, n), 0);
    cr_assert_eq(eng_optim_init(&ob, n), 0);
    for (int s = 0; s < 2; s++) {
        double na = eng_grad_norm(eng_model_grads(a), n);
        float coef = eng_clip_coef(na, oa.max_grad_norm);
        cr_assert_lt(coef, 1.0f);
        cr_assert_eq(eng_optim_step_fused(&oa, a, 1e-3, coef, 1), 0);
        double nb = eng_grad_clip(eng_model_grads(b), n, ob.max_grad_norm);
        cr_assert_eq(na, nb);
        cr_assert_eq(eng_optim_step(&ob, b, 1e-3), 0);
        cr_assert(memcmp(eng_model_params(a), eng_model_params(b), n * sizeof(float)) == 0,
                  "step %d: parameters differ", s);
        cr_assert(memcmp(oa.m, ob.m, n * sizeof(float)) == 0);
        cr_assert(memcmp(oa.v, ob.v, n * sizeof(float)) == 0);
        for (size_t i = 0; i < n; i++)
            cr_assert_eq(eng_model_grads(a)[i], 0.0f, "gradient %zu not reset", i);
        /* the next step's gradients, the same for both */
        float *ga = eng_model_grads(a), *gb = eng_model_grads(b);
        for (size_t i = 0; i < n; i++)
            ga[i] = gb[i] = (float)cos((double)i * 0.11 + s);
    }
    eng_optim_fini(&oa), eng_optim_fini(&ob);
    eng_model_destroy(a), eng_model_destroy(b);
}

/* ZeRO-3's shape: the slab cut at arbitrary points (mid-tensor) into shards, each updated
 * from its own buffers and state, gives the whole-slab update bit for bit, weight decay
 * following the tensors across the cuts. */
Test(optim, shard_ranges_equal_the_whole_step)
{
    eng_model_t *a = wide_model(), *b = wide_model();
    size_t n = eng_model_nparams(a);
    size_t cut[4] = {0, n / 3 + 5, 2 * n / 3 + 1, n};
    eng_optim_t whole, part[3];
    cr_assert_eq(eng_optim_init(&whole, n), 0);
    cr_assert_eq(eng_optim_step_fused(&whole, a, 2e-3, 0.5f, 0), 0);
    float *p = eng_model_params(b), *g = eng_model_grads(b);
    for (int k = 0; k < 3; k++) {
        size_t lo = cut[k], hi = cut[k + 1];
        float *ps = malloc((hi - lo) * sizeof *ps), *gs = malloc((hi - lo) * sizeof *gs);
        cr_assert(ps && gs);
        memcpy(ps, p + lo, (hi - lo) * sizeof *ps);
        memcpy(gs, g + lo, (hi - lo) * sizeof *gs);
        cr_assert_eq(eng_optim_init(&part[k], hi - lo), 0);
        cr_assert_eq(eng_optim_step_range(&part[k], b, lo, hi, ps, gs, 2e-3, 0.5f, 1), 0);
        cr_assert(memcmp(ps, eng_model_params(a) + lo, (hi - lo) * sizeof *ps) == 0,
                  "shard %d differs", k);
        cr_assert(memcmp(part[k].v, whole.v + lo, (hi - lo) * sizeof(float)) == 0);
        cr_assert_eq(gs[0], 0.0f);
        cr_assert_eq(eng_optim_step_range(&part[k], b, lo, hi + 1, ps, gs, 2e-3, 1.0f, 0), -EINVAL);
        eng_optim_fini(&part[k]);
        free(ps), free(gs);
    }
    eng_optim_fini(&whole);
    eng_model_destroy(a), eng_model_destroy(b);
}
