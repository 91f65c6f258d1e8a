/* Tensor parallelism (workerd/engine/tp.c and the model's TP slices): ranks as threads,
 * each with its own collectives context and groups, against the one-rank model. */
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "support.h"
#include "workerd/coll/coll.h"
#include "workerd/engine/groups.h"
#include "workerd/engine/model.h"
#include "workerd/engine/trainer.h"

enum { STEPS = 20, MAX_RANKS = 4, LB = 2, LT = 16 };

static void tp_spec(ch_jobspec_t *j, uint32_t tp)
{
    ch_jobspec_defaults(j);
    strcpy(j->name, "tp");
    j->model.layers = 2;
    j->model.heads = 4;
    j->model.embd = 32;
    j->model.vocab = 29; /* padded to 32 (tp 1, 2) or 32 (tp 4): the last slice has padding */
    j->model.seq_len = 16;
    j->parallel.tp = tp;
    j->parallel.microbatches = 2;
    j->parallel.micro_batch_size = 4;
    j->train.steps = STEPS;
    j->train.lr = 3e-3;
    j->train.warmup = 5;
    j->train.seed = 99;
}

typedef struct tp_rank {
    uint32_t rank, n;
    ts_rdzv_table_t *table;
    const ch_jobspec_t *spec;
    double losses[STEPS];
    float *params; /* copy at the end, caller frees */
    float *logits; /* [LB, LT, Vl] of an evaluation forward, caller frees */
    eng_tensor_t *tensors;
    size_t nparams, ntensors, logits_n;
    int rc;
    char msg[512];
} tp_rank_t;

/* The evaluation batch: the same tokens for every layout. */
static void eval_tokens(int32_t *tok, uint32_t vocab)
{
    for (int i = 0; i < LB * LT; i++)
        tok[i] = (int32_t)((i * 7 + 3) % vocab);
}

static void keep_results(tp_rank_t *d, eng_trainer_t *t)
{
    eng_model_t *m = eng_trainer_model(t);
    int32_t tok[LB * LT];
    eval_tokens(tok, d->spec->model.vocab);
    d->rc = eng_model_forward(m, tok, NULL, LB, LT, NULL);
    if (d->rc < 0)
        return;
    d->nparams = eng_model_nparams(m);
    d->ntensors = eng_model_ntensors(m);
    d->params = malloc(d->nparams * sizeof *d->params);
    d->tensors = malloc(d->ntensors * sizeof *d->tensors);
    d->logits_n = (size_t)LB * LT * eng_model_config(m)->padded_vocab / d->spec->parallel.tp;
    d->logits = malloc(d->logits_n * sizeof *d->logits);
    memcpy(d->params, eng_model_params(m), d->nparams * sizeof(float));
    for (size_t i = 0; i < d->ntensors; i++)
        d->tensors[i] = *eng_model_tensor(m, i);
    memcpy(d->logits, eng_model_logits(m), d->logits_n * sizeof(float));
}

static void *rank_main(void *arg)
{
    tp_rank_t *d = arg;
    wrk_coll_t *c = NULL;
    eng_groups_t *g = NULL;
    eng_trainer_t *t = NULL;
    if (d->n > 1) {
        d->rc = ts_coll_create(d->table, d->rank, d->n, 60000, &c);
        if (d->rc == 0)
            d->rc = eng_groups_create(c, ch_jobspec_layout(d->spec), d->rank, &g);
    }
    eng_trainer_opts_t opts = {.peak_flops = 1e9, .groups = g};
    if (d->rc == 0)
        d->rc = eng_trainer_create(d->spec, &opts, &t, d->msg, sizeof d->msg);
    while (d->rc == 0 && eng_trainer_next_step(t) < eng_trainer_total_steps(t)) {
        eng_step_info_t info;
        if ((d->rc = eng_trainer_step(t, &info)) < 0)
            break;
        d->losses[info.step] = info.loss;
    }
    if (d->rc == 0)
        keep_results(d, t);
    eng_trainer_destroy(t);
    eng_groups_destroy(g);
    wrk_coll_destroy(c);
    return NULL;
}

static void run(const ch_jobspec_t *j, tp_rank_t *ranks)
{
    uint32_t n = ch_layout_world(ch_jobspec_layout(j));
    cr_assert_leq(n, MAX_RANKS);
    ts_rdzv_table_t table;
    ts_rdzv_table_init(&table);
    pthread_t th[MAX_RANKS];
    for (uint32_t i = 0; i < n; i++) {
        ranks[i] = (tp_rank_t){.rank = i, .n = n, .table = &table, .spec = j};
        cr_assert_eq(pthread_create(&th[i], NULL, rank_main, &ranks[i]), 0);
    }
    for (uint32_t i = 0; i < n; i++)
        pthread_join(th[i], NULL);
    ts_rdzv_table_fini(&table);
    for (uint32_t i = 0; i < n; i++)
        cr_assert_eq(ranks[i].rc, 0, "rank %u: %s %s", i, ch_strerror(ranks[i].rc), ranks[i].msg);
}

static void release(tp_rank_t *ranks, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        free(ranks[i].params);
        free(ranks[i].tensors);
        free(ranks[i].logits);
    }
}

/* Where element (r, c) of the full tensor t (padded rows for wte) lies in the one-rank
 * model's slab, given the one-rank table row full. */
static size_t full_index(const eng_tensor_t *full, uint32_t r, uint32_t c)
{
    return full->offset + (size_t)r * (full->ndim == 2 ? full->shape[1] : 1) + c;
}

/* Compare a rank's slice of t with the same elements of the one-rank model: relative L2. */
static double slice_rel_l2(const tp_rank_t *one, const tp_rank_t *d, const eng_tensor_t *t)
{
    const eng_tensor_t *full = NULL;
    for (size_t i = 0; i < one->ntensors; i++)
        if (strcmp(one->tensors[i].name, t->name) == 0)
            full = &one->tensors[i];
    cr_assert_not_null(full, "%s", t->name);
    double diff = 0, norm = 0;
    const float *p = d->params + t->offset;
    int two = t->ndim == 2;
    uint32_t rlo = two ? t->lo[0] : 0, rhi = two ? t->hi[0] : 1;
    uint32_t clo = t->lo[two], chi = t->hi[two];
    uint32_t part_w = (two ? t->shape[1] : t->shape[0]) / t->parts;
    for (uint32_t r = rlo; r < rhi; r++)
        for (uint32_t q = 0; q < t->parts; q++)
            for (uint32_t c = clo; c < chi; c++, p++) {
                double b = two ? one->params[full_index(full, r, q * part_w + c)]
                               : one->params[full->offset + q * part_w + c];
                diff += (*p - b) * (*p - b);
                norm += b * b;
            }
    return norm > 0 ? sqrt(diff / norm) : sqrt(diff);
}

static void layout_like_one_rank(uint32_t tp)
{
    ch_jobspec_t j1, jt;
    tp_spec(&j1, 1);
    tp_spec(&jt, tp);
    tp_rank_t one[1], many[MAX_RANKS];
    run(&j1, one);
    run(&jt, many);
    for (int s = 0; s < STEPS; s++) {
        for (uint32_t r = 0; r < tp; r++) {
            double rel = fabs(many[r].losses[s] - one[0].losses[s]) / one[0].losses[s];
            cr_expect_lt(rel, 1e-4, "tp=%u rank %u step %d: loss %.8f vs %.8f", tp, r, s,
                         many[r].losses[s], one[0].losses[s]);
        }
    }
    double worst = 0;
    for (uint32_t r = 0; r < tp; r++) {
        cr_assert_eq(many[r].ntensors, one[0].ntensors);
        for (size_t i = 0; i < many[r].ntensors; i++) {
            double rel = slice_rel_l2(&one[0], &many[r], &many[r].tensors[i]);
            worst = rel > worst ? rel : worst;
            cr_expect_lt(rel, 1e-4, "tp=%u rank %u %s: relative L2 %.3g", tp, r,
                         many[r].tensors[i].name, rel);
        }
        /* the evaluation logits: this rank's vocab slice of the one-rank logits */
        uint32_t Vp = (uint32_t)(one[0].logits_n / (LB * LT)), Vl = Vp / tp;
        cr_assert_eq(many[r].logits_n, (size_t)LB * LT * Vl);
        double diff = 0, norm = 0;
        for (size_t n = 0; n < (size_t)LB * LT; n++)
            for (uint32_t v = 0; v < Vl; v++) {
                double a = many[r].logits[n * Vl + v], b = one[0].logits[n * Vp + r * Vl + v];
                diff += (a - b) * (a - b);
                norm += b * b;
            }
        cr_expect_lt(sqrt(diff / norm), 1e-4, "tp=%u rank %u logits", tp, r);
    }
    printf("tp=%u: loss step 0 %.6f / %.6f, step %d %.6f / %.6f, worst tensor rel L2 %.3g\n", tp,
           many[0].losses[0], one[0].losses[0], STEPS - 1, many[0].losses[STEPS - 1],
           one[0].losses[STEPS - 1], worst);
    release(one, 1);
    release(many, tp);
}

Test(tp, two_ranks_train_like_one)
{
    layout_like_one_rank(2);
}

Test(tp, four_ranks_train_like_one)
{
    layout_like_one_rank(4);
}

Test(tp, same_layout_twice_is_bit_identical)
{
    ch_jobspec_t j;
    tp_spec(&j, 2);
    tp_rank_t a[2], b[2];
    run(&j, a);
    run(&j, b);
    for (uint32_t r = 0; r < 2; r++) {
        cr_expect_eq(memcmp(a[r].losses, b[r].losses, sizeof a[r].losses), 0, "rank %u", r);
        cr_assert_eq(a[r].nparams, b[r].nparams);
        cr_expect_eq(memcmp(a[r].params, b[r].params, a[r].nparams * sizeof(float)), 0, "rank %u",
                     r);
    }
    /* the replicated tensors are the same bits on both ranks */
    for (size_t i = 0; i < a[0].ntensors; i++) {
        const eng_tensor_t *t = &a[0].tensors[i];
        if (t->split == ENG_SPLIT_NONE)
            cr_expect_eq(
                memcmp(a[0].params + t->offset, a[1].params + t->offset, t->numel * sizeof(float)),
                0, "%s differs between the TP ranks", t->name);
    }
    release(a, 2);
    release(b, 2);
}

Test(tp, table_holds_the_slices)
{
    ch_jobspec_t j;
    tp_spec(&j, 2);
    j.train.steps = 1;
    j.train.warmup = 0;
    tp_rank_t d[2];
    run(&j, d);
    uint32_t C = 32, Vp = 32;
    for (uint32_t r = 0; r < 2; r++) {
        size_t total = 0;
        for (size_t i = 0; i < d[r].ntensors; i++) {
            const eng_tensor_t *t = &d[r].tensors[i];
            total += t->numel;
            if (strcmp(t->name, "wte.weight") == 0) {
                cr_expect_eq(t->split, ENG_SPLIT_VOCAB);
                cr_expect_eq(t->shape[0], 29);
                cr_expect_eq(t->lo[0], r * Vp / 2);
                cr_expect_eq(t->hi[0], (r + 1) * Vp / 2);
                cr_expect_eq(t->numel, (size_t)Vp / 2 * C);
            } else if (strcmp(t->name, "h.1.attn.c_attn.weight") == 0) {
                cr_expect_eq(t->split, ENG_SPLIT_COLUMN);
                cr_expect_eq(t->parts, 3);
                cr_expect_eq(t->lo[1], r * C / 2);
                cr_expect_eq(t->hi[1], (r + 1) * C / 2);
                cr_expect_eq(t->numel, (size_t)C * 3 * C / 2);
            } else if (strcmp(t->name, "h.0.mlp.c_fc.bias") == 0) {
                cr_expect_eq(t->split, ENG_SPLIT_COLUMN);
                cr_expect_eq(t->lo[0], r * 2 * C);
                cr_expect_eq(t->numel, (size_t)2 * C);
            } else if (strcmp(t->name, "h.0.mlp.c_proj.weight") == 0) {
                cr_expect_eq(t->split, ENG_SPLIT_ROW);
                cr_expect_eq(t->lo[0], r * 2 * C);
                cr_expect_eq(t->hi[0], (r + 1) * 2 * C);
                cr_expect_eq(t->lo[1], 0);
                cr_expect_eq(t->hi[1], C);
            } else if (strcmp(t->name, "h.0.attn.c_proj.bias") == 0 ||
                       strcmp(t->name, "ln_f.weight") == 0) {
                cr_expect_eq(t->split, ENG_SPLIT_NONE);
                cr_expect_eq(t->numel, C);
            }
        }
        cr_expect_eq(total, d[r].nparams);
        /* the logits buffer of a rank is its vocab slice: Vp/2 wide */
        cr_expect_eq(d[r].logits_n, (size_t)LB * LT * Vp / 2);
    }
    release(d, 2);
}
