/* The layout planner (common/planner.h) on the seed's figures: Megatron-LM's published
 * layouts for GPT 1T and GPT-3 175B on A100 clusters, GPT-2 124M on one node, a model that
 * fits nowhere, and the invariants every proposed layout keeps. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "common/err.h"
#include "common/plan.h"
#include "common/planner.h"

/* Narayanan et al. 2021, table 1: the 1T model and GPT-3 175B (vocab 51200, seq 2048). */
static const ch_model_cfg_t gpt_1t = {128, 160, 25600, 51200, 51200, 2048, 0, CH_SCHEDULE_1F1B,
                                      0,   0,   0};
static const ch_model_cfg_t gpt3_175b = {96, 96, 12288, 51200, 51200, 2048, 0, CH_SCHEDULE_1F1B,
                                         0,  0,  0};
static const ch_model_cfg_t gpt2_124m = {12, 12, 768, 50257, 50304, 1024, 0, CH_SCHEDULE_1F1B,
                                         0,  0,  0};
/* GPT-2 medium: 16 heads, so that tp 8 and 16 divide them. */
static const ch_model_cfg_t gpt2_350m = {24, 16, 1024, 50257, 50304, 1024, 0, CH_SCHEDULE_1F1B,
                                         0,  0,  0};

/* A100 80 GB nodes of 8 GPUs: the planner's defaults, spelled out so the test pins them. */
static ch_planner_cluster_t a100s(uint32_t nodes)
{
    ch_planner_cluster_t c;
    ch_planner_cluster_defaults(&c, nodes, 8);
    cr_assert_eq(c.mem_per_slot, 80.0 * 1073741824.0);
    cr_assert_eq(c.flops_per_slot, 312e12);
    cr_assert_eq(c.tp_busbw, 300e9);
    cr_assert_eq(c.dp_busbw, 25e9);
    return c;
}

static ch_planner_opts_t opts(uint64_t batch, ch_recompute_t rc)
{
    ch_planner_opts_t o = {batch, rc, CH_PLANNER_MEM_RESERVE};
    return o;
}

static ch_planner_result_t run(const ch_model_cfg_t *m, const ch_planner_cluster_t *c,
                               const ch_planner_opts_t *o)
{
    ch_planner_result_t r;
    char err[256] = "";
    int rc = ch_planner_run(m, c, o, &r, err, sizeof err);
    cr_assert_eq(rc, 0, "ch_planner_run: %d %s", rc, err);
    return r;
}

/* Rank (1-based) of the first proposed layout with this tp, pp, dp; 0 when absent. */
static size_t rank_of(const ch_planner_result_t *r, uint32_t tp, uint32_t pp, uint32_t dp)
{
    for (size_t i = 0; i < r->n_layouts; i++)
        if (r->layouts[i].split.tp == tp && r->layouts[i].split.pp == pp &&
            r->layouts[i].split.dp == dp)
            return i + 1;
    return 0;
}

/* What every proposed layout must keep. */
static void check_invariants(const ch_model_cfg_t *m, const ch_planner_cluster_t *c,
                             const ch_planner_opts_t *o, const ch_planner_result_t *r)
{
    for (size_t i = 0; i < r->n_layouts; i++) {
        const ch_planner_layout_t *l = &r->layouts[i];
        cr_assert_eq((uint64_t)l->split.dp * l->split.microbatches * l->split.micro_batch_size,
                     o->global_batch, "#%zu keeps the global batch", i);
        cr_assert_eq(l->world, l->split.tp * l->split.pp * l->split.dp);
        cr_assert_leq(l->world, r->slots);
        cr_assert_leq(l->split.tp, c->slots_per_node, "TP stays inside a node");
        cr_assert_eq(l->split.tp & (l->split.tp - 1), 0, "tp %u is a power of two", l->split.tp);
        cr_assert_eq(m->heads % l->split.tp, 0);
        cr_assert_leq(l->split.pp, m->layers);
        cr_assert_leq(l->mem_bytes, r->usable_bytes);
        cr_assert_float_eq(
            l->bubble, (l->split.pp - 1.0) / (l->split.microbatches + l->split.pp - 1.0), 1e-12);
        cr_assert_float_eq(l->tokens_per_s * l->step_s, (double)o->global_batch * m->seq_len,
                           1e-6 * o->global_batch * m->seq_len);
        if (i > 0)
            cr_assert_geq(l->step_s, r->layouts[i - 1].step_s, "ranked by step time");
    }
}

Test(planner, megatron_1t_on_3072_a100s)
{
    /* Megatron-LM ran it with activation recomputation: 384 nodes x 8, batch 3072. */
    ch_planner_cluster_t c = a100s(384);
    ch_planner_opts_t o = opts(3072, CH_RECOMPUTE_FULL);
    ch_planner_result_t r = run(&gpt_1t, &c, &o);
    check_invariants(&gpt_1t, &c, &o, &r);
    cr_assert_eq(r.slots, 3072);
    size_t at = rank_of(&r, 8, 64, 6);
    cr_assert(at >= 1 && at <= 3, "Megatron's TP=8 PP=64 DP=6 ranks %zu", at);
    const ch_planner_layout_t *l = &r.layouts[at - 1];
    cr_assert_eq(l->world, 3072);
    cr_assert_eq(l->split.microbatches * l->split.micro_batch_size, 512);
    /* The model's MFU lands where Megatron measured it (52% of peak counting recomputation,
     * i.e. about 39% in model FLOPs), not at some impossible figure. */
    cr_assert(l->mfu > 0.15 && l->mfu < 0.5, "mfu %.3f", l->mfu);
    ch_planner_result_free(&r);
}

Test(planner, model_that_fits_nowhere_is_refused_with_the_reason)
{
    /* Without recomputation 1F1B keeps a whole model's activations of one micro-batch on
     * stage 0 whatever pp is: about 180 GiB at tp 8, more than an 80 GB A100. */
    ch_planner_cluster_t c = a100s(384);
    ch_planner_opts_t o = opts(3072, CH_RECOMPUTE_NONE);
    ch_planner_result_t r = run(&gpt_1t, &c, &o);
    cr_assert_eq(r.n_layouts, 0);
    cr_assert_gt(r.n_refused, 0);
    const ch_planner_refusal_t *f = &r.refused[0];
    cr_assert_gt(f->l.mem_bytes, r.usable_bytes);
    cr_assert(strstr(f->reason, "does not fit") && strstr(f->reason, "activations") &&
                  strstr(f->reason, "usable"),
              "%s", f->reason);
    for (size_t i = 1; i < r.n_refused; i++)
        cr_assert_geq(r.refused[i].l.mem_bytes, f->l.mem_bytes, "closest miss first");
    ch_planner_result_free(&r);

    /* GPT-2 124M on slots of 256 MiB: its fp32 state alone is 1.9 GiB. */
    c = a100s(1);
    c.mem_per_slot = 256.0 * 1048576;
    o = opts(512, CH_RECOMPUTE_NONE);
    r = run(&gpt2_124m, &c, &o);
    cr_assert_eq(r.n_layouts, 0);
    cr_assert(strstr(r.refused[0].reason, "does not fit"), "%s", r.refused[0].reason);
    ch_planner_result_free(&r);
}

Test(planner, gpt3_175b_on_1024_a100s)
{
    /* Megatron-LM: TP=8 with PP=8 (DP=16) or PP=16 (DP=8), batch 1536. PP=16 misses the
     * usable 76 GiB by a hair (0.4%): ZeRO-3's second unsharded-gradient buffer (one block's
     * TP slice, 0.84 GiB, so that a block's reduce-scatter overlaps the next backward). */
    ch_planner_cluster_t c = a100s(128);
    ch_planner_opts_t o = opts(1536, CH_RECOMPUTE_NONE);
    ch_planner_result_t r = run(&gpt3_175b, &c, &o);
    check_invariants(&gpt3_175b, &c, &o, &r);
    size_t pp8 = rank_of(&r, 8, 8, 16), pp16 = rank_of(&r, 8, 16, 8);
    cr_assert(pp8 && pp8 <= 3, "pp8 #%zu", pp8);
    for (size_t i = 0; !pp16 && i < r.n_refused; i++) {
        const ch_planner_layout_t *l = &r.refused[i].l;
        if (l->split.tp == 8 && l->split.pp == 16 && l->split.dp == 8) {
            cr_assert(strstr(r.refused[i].reason, "does not fit"), "%s", r.refused[i].reason);
            cr_assert_leq(l->mem_bytes, 1.01 * r.usable_bytes, "%s", r.refused[i].reason);
            pp16 = SIZE_MAX;
        }
    }
    cr_assert(pp16, "pp16 neither proposed nor refused");
    ch_planner_result_free(&r);
}

Test(planner, gpt2_124m_on_one_node_is_pure_dp)
{
    ch_planner_cluster_t c = a100s(1);
    ch_planner_opts_t o = opts(512, CH_RECOMPUTE_NONE);
    ch_planner_result_t r = run(&gpt2_124m, &c, &o);
    check_invariants(&gpt2_124m, &c, &o, &r);
    cr_assert_gt(r.n_layouts, 1);
    const ch_planner_layout_t *l = &r.layouts[0];
    cr_assert(l->split.tp == 1 && l->split.pp == 1 && l->split.dp == 8, "best tp %u pp %u dp %u",
              l->split.tp, l->split.pp, l->split.dp);
    cr_assert_eq(l->bubble, 0.0);
    cr_assert_eq(l->p2p_s, 0.0);
    ch_planner_result_free(&r);
}

Test(planner, output_is_deterministic)
{
    ch_planner_cluster_t c = a100s(64);
    ch_planner_opts_t o = opts(1536, CH_RECOMPUTE_FULL);
    ch_planner_result_t a = run(&gpt3_175b, &c, &o), b = run(&gpt3_175b, &c, &o);
    cr_assert_eq(a.n_layouts, b.n_layouts);
    cr_assert_eq(a.n_refused, b.n_refused);
    cr_assert_gt(a.n_layouts, 0);
    cr_assert_eq(memcmp(a.layouts, b.layouts, a.n_layouts * sizeof *a.layouts), 0);
    if (a.n_refused) /* (memcmp may not be given NULL, even for 0 bytes) */
        cr_assert_eq(memcmp(a.refused, b.refused, a.n_refused * sizeof *a.refused), 0);
    ch_planner_result_free(&a);
    ch_planner_result_free(&b);
}

/* The planner evaluates stage 0 and the last stage only; the peak over every stage
 * (ch_plan_peak) must be the same. Uneven stages included (13 layers). */
Test(planner, memory_is_plan_peak)
{
    ch_model_cfg_t m = {13, 8, 512, 8000, 8000, 256, 0, CH_SCHEDULE_1F1B, 0, 0, 0};
    ch_planner_cluster_t c;
    ch_planner_cluster_defaults(&c, 64, 8);
    ch_planner_opts_t o = opts(96, CH_RECOMPUTE_NONE);
    for (uint32_t tp = 1; tp <= 8; tp *= 2)
        for (uint32_t pp = 1; pp <= 13; pp++)
            for (uint32_t mbs = 1; mbs <= 4; mbs++)
                for (int rs = 0; rs <= 1; rs++) {
                    ch_layout_t l = {tp, pp, 2};
                    ch_planner_layout_t got;
                    ch_plan_t want;
                    char why[256];
                    int rc = ch_planner_eval(&m, &c, &o, l, mbs, (ch_reshard_t)rs, &got, why,
                                             sizeof why);
                    if (96 / 2 % mbs) {
                        cr_assert_eq(rc, -EINVAL);
                        continue;
                    }
                    cr_assert_eq(rc, 0, "tp %u pp %u: %s", tp, pp, why);
                    cr_assert_eq(ch_plan_peak(&m, l, mbs, 48 / mbs, (ch_reshard_t)rs, &want), 0);
                    cr_assert_eq(got.mem_bytes, want.total_bytes, "tp %u pp %u mbs %u", tp, pp,
                                 mbs);
                    cr_assert_eq(got.peak_stage, want.stage);
                }
}

Test(planner, recomputation_keeps_block_inputs_only)
{
    /* GPT-2's blocks with a small vocab, so that stage 0 (not the logits) is the peak. */
    const ch_model_cfg_t m = {12, 12, 768, 512, 512, 1024, 0, CH_SCHEDULE_1F1B, 0, 0, 0};
    ch_planner_cluster_t c = a100s(1);
    ch_planner_opts_t none = opts(64, CH_RECOMPUTE_NONE), full = opts(64, CH_RECOMPUTE_FULL);
    ch_layout_t l = {2, 2, 2};
    ch_planner_layout_t a, b;
    char why[256];
    cr_assert_eq(ch_planner_eval(&m, &c, &none, l, 4, CH_RESHARD_PER_USE, &a, why, sizeof why), 0,
                 "%s", why);
    cr_assert_eq(ch_planner_eval(&m, &c, &full, l, 4, CH_RESHARD_PER_USE, &b, why, sizeof why), 0,
                 "%s", why);
    /* Same state and gathered blocks; less memory for activations; more compute (one
     * more forward of the blocks) and more TP all-reduces. */
    cr_assert_eq(a.state_bytes, b.state_bytes);
    cr_assert_eq(a.gathered_bytes, b.gathered_bytes);
    cr_assert_lt(b.act_bytes, a.act_bytes);
    cr_assert_gt(b.compute_s, a.compute_s);
    cr_assert_gt(b.tp_s, a.tp_s);
    /* Stage 0 at 8 micro-batches of 4 keeps 2 in flight: 6 block outputs each (N·C fp32,
     * N = 4·1024) and the stage's buffers (token ids N, the embedding's output N·C), plus
     * one block's activations but its output (recomputed) and plan.h's scratch once
     * (2·N·C + 4·N·C/tp + T·T, a gradient and a received gradient 2·N·C). */
    const double N = 4.0 * 1024, C = 768, T = 1024;
    const double per_block = N * C * (4 + 12.0 / 2) + 4 * N + 4 * (12.0 / 2) * T * T;
    const double stage = N + N * C, scratch = 4 * N * C + 4 * N * C / 2 + T * T;
    cr_assert_eq(b.peak_stage, 0);
    cr_assert_float_eq(b.act_bytes, 4 * (2 * (6 * N * C + stage) + per_block - N * C + scratch), 1);
}

Test(planner, invalid_layouts_say_why)
{
    ch_planner_cluster_t c = a100s(2);
    ch_planner_opts_t o = opts(64, CH_RECOMPUTE_NONE);
    ch_planner_layout_t l;
    char why[256];
    ch_layout_t tp5 = {5, 1, 1}, tp16 = {16, 1, 1}, pp13 = {1, 13, 1}, dp3 = {1, 1, 3},
                big = {8, 4, 1};
    cr_assert_eq(ch_planner_eval(&gpt2_124m, &c, &o, tp5, 1, 0, &l, why, sizeof why), -EINVAL);
    cr_assert(strstr(why, "tp 5 does not divide model.heads 12"), "%s", why);
    cr_assert_eq(ch_planner_eval(&gpt2_350m, &c, &o, tp16, 1, 0, &l, why, sizeof why), -EINVAL);
    cr_assert(strstr(why, "one node"), "%s", why);
    cr_assert_eq(ch_planner_eval(&gpt2_124m, &c, &o, pp13, 1, 0, &l, why, sizeof why), -EINVAL);
    cr_assert(strstr(why, "model.layers"), "%s", why);
    cr_assert_eq(ch_planner_eval(&gpt2_124m, &c, &o, dp3, 1, 0, &l, why, sizeof why), -EINVAL);
    cr_assert(strstr(why, "global batch"), "%s", why);
    cr_assert_eq(ch_planner_eval(&gpt2_350m, &c, &o, big, 1, 0, &l, why, sizeof why), -EINVAL);
    cr_assert(strstr(why, "groups"), "%s", why);

    /* 12 heads on 16-slot nodes: tp 8 and 16 do not divide them and are refused. */
    ch_planner_cluster_defaults(&c, 1, 16);
    ch_planner_result_t r = run(&gpt2_124m, &c, &o);
    size_t tp_refusals = 0;
    for (size_t i = 0; i < r.n_refused; i++)
        if (r.refused[i].l.split.pp == 0) {
            cr_assert(r.refused[i].l.split.tp == 8 || r.refused[i].l.split.tp == 16);
            cr_assert(strstr(r.refused[i].reason, "does not divide"), "%s", r.refused[i].reason);
            tp_refusals++;
        }
    cr_assert_eq(tp_refusals, 2);
    ch_planner_result_free(&r);

    /* Bad inputs. */
    char err[256];
    o.global_batch = 0;
    cr_assert_eq(ch_planner_run(&gpt2_124m, &c, &o, &r, err, sizeof err), -EINVAL);
    o.global_batch = 64;
    c.mfu = 1.5;
    cr_assert_eq(ch_planner_run(&gpt2_124m, &c, &o, &r, err, sizeof err), -EINVAL);
    cr_assert(strstr(err, "mfu"), "%s", err);
}

Test(planner, uneven_nodes_keep_tp_groups_inside_nodes)
{
    /* One node of 8 and three of 4: one group of tp 8 (on the 8-slot node), five of tp 4.
     * GPT-2 medium, so that tp 8 is valid. */
    const uint32_t slots[] = {8, 4, 4, 4};
    ch_planner_cluster_t c;
    ch_planner_cluster_defaults(&c, 4, 0);
    c.node_slots = slots;
    ch_planner_opts_t o = opts(64, CH_RECOMPUTE_NONE);
    ch_planner_result_t r = run(&gpt2_350m, &c, &o);
    cr_assert_eq(r.slots, 20);
    for (size_t i = 0; i < r.n_layouts; i++) {
        const ch_planner_layout_t *l = &r.layouts[i];
        if (l->split.tp == 8)
            cr_assert_eq(l->split.pp * l->split.dp, 1, "only one node holds a group of 8");
        if (l->split.tp == 4)
            cr_assert_leq(l->split.pp * l->split.dp, 5);
        cr_assert_eq(64 % l->split.dp, 0);
    }
    cr_assert(rank_of(&r, 8, 1, 1), "tp 8 on the big node is proposed");
    ch_planner_result_free(&r);
}
