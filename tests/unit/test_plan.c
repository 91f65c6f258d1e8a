/* The plan arithmetic (common/plan.h): parameter counts, memory per rank, bubble, tokens
 * and FLOPs. The per-rank figures are the ones `chorusctl plan` printed before the
 * arithmetic moved here, so the move changed no number. */
#include <criterion/criterion.h>
#include <math.h>

#include "common/err.h"
#include "common/jobspec.h"
#include "common/plan.h"

/* GPT-2 124M (Hugging Face's "gpt2"). */
static ch_model_cfg_t gpt2(uint32_t seq_len)
{
    ch_model_cfg_t m = {12, 12, 768, 50257, 50304, seq_len, 0, CH_SCHEDULE_1F1B, 0, 0, 0};
    return m;
}

static ch_layout_t lay(uint32_t tp, uint32_t pp, uint32_t dp)
{
    ch_layout_t l = {tp, pp, dp};
    return l;
}

/* Expected figures of one stage: blocks, params, owned, state, gathered, activations per
 * micro-batch, in flight, scratch, total (bytes). */
typedef struct want {
    uint32_t first, blocks;
    double params, owned, state, gathered, act_mb;
    uint32_t in_flight;
    double scratch, total;
} want_t;

static void check_stage(const ch_plan_t *p, const want_t *w)
{
    cr_assert_eq(p->first_block, w->first);
    cr_assert_eq(p->blocks, w->blocks);
    cr_assert_eq(p->params, w->params, "stage %u params %.0f", p->stage, p->params);
    cr_assert_eq(p->owned, w->owned, "stage %u owned %.0f", p->stage, p->owned);
    cr_assert_eq(p->state_bytes, w->state);
    cr_assert_eq(p->gathered_bytes, w->gathered);
    cr_assert_eq(p->act_mb_bytes, w->act_mb);
    cr_assert_eq(p->in_flight, w->in_flight);
    cr_assert_eq(p->scratch_bytes, w->scratch);
    cr_assert_eq(floor(p->total_bytes), w->total, "stage %u total %.0f", p->stage, p->total_bytes);
    cr_assert_eq(p->total_bytes,
                 p->state_bytes + p->gathered_bytes + p->working_bytes + p->act_bytes);
}

Test(plan, gpt2_124m_on_one_rank)
{
    ch_model_cfg_t m = gpt2(1024);
    ch_plan_t p;
    cr_assert_eq(ch_plan_stage(&m, lay(1, 1, 1), 8, 1, CH_RESHARD_PER_USE, 0, &p), 0);
    cr_assert_eq(p.params_total, 124439808.0);
    cr_assert_eq(p.padded_vocab, 50304.0);
    cr_assert_eq(p.params_padded, 124475904.0);
    cr_assert_eq(p.block, 12.0 * 768 * 768 + 13 * 768);
    cr_assert_eq(p.world, 1);
    cr_assert_eq(p.tokens, 8.0 * 1024);
    cr_assert_eq(p.bubble, 0.0);
    cr_assert(p.embeddings && p.head);
    /* One rank holds and owns everything, padded wte rows included. */
    cr_assert_eq(p.params, 124475904.0);
    cr_assert_eq(p.owned, 124475904.0);
    cr_assert_eq(p.state_bytes, 16.0 * 124475904);
    double B = 8, s = 1024, l = 12, h = 768, V = 50304;
    double flops = 72 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h));
    cr_assert_float_eq(p.flops, flops, flops * 1e-12);
    cr_assert_float_eq(ch_plan_flops(&m, 8), flops, flops * 1e-12);
}

Test(plan, tp2_pp2_dp2_per_use)
{
    ch_model_cfg_t m = gpt2(1024);
    const want_t w[2] = {
        {0, 6, 41429760, 20714880, 331438080, 217958400, 2743894016, 1, 155189248, 3448479744},
        {6, 6, 40644864, 20322432, 325158912, 211679232, 2794356736, 1, 666926268, 3998121148},
    };
    for (uint32_t s = 0; s < 2; s++) {
        ch_plan_t p;
        cr_assert_eq(ch_plan_stage(&m, lay(2, 2, 2), 8, 1, CH_RESHARD_PER_USE, s, &p), 0);
        cr_assert_eq(p.padded_vocab, 50432.0);
        cr_assert_eq(p.bubble, 0.5);
        cr_assert_eq(p.world, 8);
        cr_assert_float_eq(p.flops, 14012330803200.0, 1e3);
        check_stage(&p, &w[s]);
    }
    ch_plan_t peak;
    cr_assert_eq(ch_plan_peak(&m, lay(2, 2, 2), 8, 1, CH_RESHARD_PER_USE, &peak), 0);
    cr_assert_eq(peak.stage, 1);
    cr_assert_eq(peak.total_bytes, 3998121148.0);
}

Test(plan, tp4_pp3_dp8_in_flight)
{
    ch_model_cfg_t m = gpt2(1024);
    const want_t w[3] = {
        {0, 4, 17620224, 2202528, 35240448, 112555008, 283254784, 3, 35651584, 1033211392},
        {4, 4, 7101696, 887712, 14203392, 28406784, 289538048, 2, 35651584, 657337856},
        {8, 4, 16835328, 2104416, 33670656, 106275840, 295870464, 1, 237002752, 672819712},
    };
    for (uint32_t s = 0; s < 3; s++) {
        ch_plan_t p;
        cr_assert_eq(ch_plan_stage(&m, lay(4, 3, 8), 2, 6, CH_RESHARD_PER_USE, s, &p), 0);
        cr_assert_eq(p.sequences, 96.0);
        cr_assert_eq(p.tokens, 98304.0);
        cr_assert_eq(p.bubble, 0.25); /* (3 - 1) / (6 + 3 - 1) */
        cr_assert_eq(p.flops, 84189948936192.0);
        check_stage(&p, &w[s]);
    }
}

Test(plan, tp3_pp12_dp7_first_middle_last)
{
    ch_model_cfg_t m = gpt2(512);
    const want_t w0 = {0,         1,         15636736, 2233821,  35741136,
                       134556772, 146882560, 12,       68157440, 2001046068};
    const want_t w5 = {5,        1,         2365696, 337957,   5407312,
                       28388388, 159449088, 7,       68157440, 1218096756};
    const want_t w11 = {11,        1,         15245056, 2177867,   34845872,
                        131423348, 172113920, 1,        592493464, 930876604};
    ch_plan_t p;
    cr_assert_eq(ch_plan_stage(&m, lay(3, 12, 7), 8, 16, CH_RESHARD_PER_USE, 0, &p), 0);
    check_stage(&p, &w0);
    cr_assert_float_eq(p.bubble, 11.0 / 27, 1e-15);
    cr_assert_eq(ch_plan_stage(&m, lay(3, 12, 7), 8, 16, CH_RESHARD_PER_USE, 5, &p), 0);
    check_stage(&p, &w5);
    cr_assert_eq(ch_plan_stage(&m, lay(3, 12, 7), 8, 16, CH_RESHARD_PER_USE, 11, &p), 0);
    check_stage(&p, &w11);
}

Test(plan, per_step_keeps_the_stage_gathered)
{
    ch_model_cfg_t m = gpt2(1024);
    ch_plan_t use, step;
    cr_assert_eq(ch_plan_stage(&m, lay(2, 2, 2), 8, 1, CH_RESHARD_PER_USE, 0, &use), 0);
    cr_assert_eq(ch_plan_stage(&m, lay(2, 2, 2), 8, 1, CH_RESHARD_PER_STEP, 0, &step), 0);
    /* 6 blocks + two gradients instead of 2 + two, each padded to 2 shards of 1,773,120;
     * either way wte's slice (19,365,888) and wpe (786,432), gathered, and their gradients */
    double outside = 2.0 * (19365888 + 786432);
    cr_assert_eq(use.block_shard, 1773120.0);
    cr_assert_eq(step.gathered_bytes, 4.0 * (8 * 2 * use.block_shard + outside));
    cr_assert_eq(use.gathered_bytes, 4.0 * (4 * 2 * use.block_shard + outside));
    cr_assert_eq(step.state_bytes, use.state_bytes);
}

Test(plan, absurd_models_do_not_overflow)
{
    ch_plan_t p;
    /* vocab 2^32 - 1 pads past 2^32: no wrap. */
    ch_model_cfg_t v = {4, 4, 64, UINT32_MAX, 0, 64, 0, CH_SCHEDULE_1F1B, 0, 0, 0};
    cr_assert_eq(ch_plan_stage(&v, lay(1, 1, 1), 1, 1, CH_RESHARD_PER_USE, 0, &p), 0);
    cr_assert_eq(p.padded_vocab, 4294967296.0);
    cr_assert_gt(p.total_bytes, 4294967296.0 * 64 * 16);
    /* A billion layers of embd 2^20: over 2^53 parameters, refused, no wrap. */
    ch_model_cfg_t l = {1000000000, 16, 1u << 20, 50257, 0, 1024, 0, CH_SCHEDULE_1F1B, 0, 0, 0};
    cr_assert_eq(ch_plan_stage(&l, lay(1, 1, 1), 1, 1, CH_RESHARD_PER_USE, 0, &p), CH_E_TOOBIG);
    cr_assert_gt(p.params_padded, CH_PLAN_EXACT_MAX);
    cr_assert_eq(ch_plan_peak(&l, lay(1, 1, 1), 1, 1, CH_RESHARD_PER_USE, &p), CH_E_TOOBIG);
}

Test(plan, bad_input)
{
    ch_model_cfg_t m = gpt2(1024);
    ch_plan_t p;
    cr_assert_eq(ch_plan_stage(&m, lay(1, 2, 1), 8, 1, CH_RESHARD_PER_USE, 2, &p), -EINVAL);
    cr_assert_eq(ch_plan_stage(&m, lay(0, 1, 1), 8, 1, CH_RESHARD_PER_USE, 0, &p), -EINVAL);
    cr_assert_eq(ch_plan_stage(&m, lay(1, 1, 1), 0, 1, CH_RESHARD_PER_USE, 0, &p), -EINVAL);
    m.layers = 0;
    cr_assert_eq(ch_plan_stage(&m, lay(1, 1, 1), 8, 1, CH_RESHARD_PER_USE, 0, &p), -EINVAL);
}

/* parallel.stage_split = balanced: GPT-2's LM head (4.46 blocks' worth at seq 1024) moves
 * two blocks off the last of 2 stages; the stages still hold the whole model between
 * them, and the memory follows the blocks to stage 0 (the price: it holds the most
 * micro-batches in flight too). */
Test(plan, balanced_stages_weigh_the_lm_head)
{
    ch_model_cfg_t even = gpt2(1024), bal = gpt2(1024);
    bal.balanced_stages = 1;
    cr_assert_eq(ch_plan_head_blocks(&even), 0.0);
    cr_assert_float_eq(ch_plan_head_blocks(&bal), 2.0 * 50257 / (24.0 * 768 + 4.0 * 1024), 1e-12);
    ch_plan_t e[2], b[2];
    for (uint32_t s = 0; s < 2; s++) {
        cr_assert_eq(ch_plan_stage(&even, lay(2, 2, 2), 8, 1, CH_RESHARD_PER_USE, s, &e[s]), 0);
        cr_assert_eq(ch_plan_stage(&bal, lay(2, 2, 2), 8, 1, CH_RESHARD_PER_USE, s, &b[s]), 0);
    }
    cr_expect(e[0].blocks == 6 && e[1].blocks == 6);
    cr_expect(b[0].first_block == 0 && b[0].blocks == 8 && b[1].first_block == 8 &&
              b[1].blocks == 4);
    /* the same model between the stages: parameters and activations move, not change */
    cr_expect_eq(b[0].params + b[1].params, e[0].params + e[1].params);
    cr_expect_eq(b[0].params - e[0].params, 2 * e[0].block_tp);
    cr_expect_eq(b[0].act_mb_bytes + b[1].act_mb_bytes, e[0].act_mb_bytes + e[1].act_mb_bytes);
    cr_expect_eq(b[0].flops, e[0].flops);
    ch_plan_t pe, pb;
    cr_assert_eq(ch_plan_peak(&even, lay(2, 2, 2), 8, 1, CH_RESHARD_PER_USE, &pe), 0);
    cr_assert_eq(ch_plan_peak(&bal, lay(2, 2, 2), 8, 1, CH_RESHARD_PER_USE, &pb), 0);
    cr_expect_eq(pe.stage, 1);
    cr_expect_eq(pb.stage, 0);
    cr_expect_gt(pb.total_bytes, pe.total_bytes, "balancing time costs stage 0 memory");
}

/* GPT-2 124M laid out tp 1 x pp 2 x dp 1 with mbs sequences a micro-batch, 4 of them. */
static ch_jobspec_t gpt2_job(uint32_t mbs, ch_stage_split_t split, ch_schedule_t sched)
{
    ch_jobspec_t j;
    ch_jobspec_defaults(&j);
    j.model.layers = 12;
    j.model.heads = 12;
    j.model.embd = 768;
    j.model.vocab = 50257;
    j.model.seq_len = 1024;
    j.parallel.pp = 2;
    j.parallel.microbatches = 4;
    j.parallel.micro_batch_size = mbs;
    j.parallel.stage_split = split;
    j.parallel.schedule = sched;
    return j;
}

/* parallel.stage_split = auto: balanced (the LM head's stage gets fewer blocks) while its
 * busiest stage fits the budget; even once balanced's stage 0 would not (a batch of 256
 * sequences puts it past 76 GiB), whatever the even split's own need. */
Test(plan, auto_split_picks_balanced_within_the_budget)
{
    ch_jobspec_t bal = gpt2_job(8, CH_SPLIT_BALANCED, CH_SCHEDULE_1F1B);
    ch_jobspec_t fits = gpt2_job(8, CH_SPLIT_AUTO, CH_SCHEDULE_1F1B);
    ch_jobspec_t big = gpt2_job(256, CH_SPLIT_AUTO, CH_SCHEDULE_1F1B);
    cr_expect_eq(ch_plan_model_of(&bal).balanced_stages, 1);
    cr_expect_eq(ch_plan_model_of(&fits).balanced_stages, 1, "auto: balanced fits at mbs 8");
    ch_model_cfg_t b = ch_plan_model_of(&big);
    cr_expect_eq(b.balanced_stages, 0, "auto: even when balanced's peak is over the budget");
    b.balanced_stages = 1;
    ch_plan_t p;
    cr_assert_eq(ch_plan_stage(&b, lay(1, 2, 1), 256, 4, CH_RESHARD_PER_USE, 0, &p), 0);
    cr_expect_gt(p.total_bytes, CH_PLAN_AUTO_BUDGET);
    /* one stage has nothing to balance */
    ch_jobspec_t one = gpt2_job(8, CH_SPLIT_AUTO, CH_SCHEDULE_1F1B);
    one.parallel.pp = 1;
    cr_expect_eq(ch_plan_model_of(&one).balanced_stages, 0);
}

/* parallel.schedule = zb-h1: the paper's bubble with T_F = T_B = T_W, (p - 1)/(3m + p - 1);
 * every stage keeps min(pp, m) micro-batches, past stage 0 with the blocks' output
 * gradients for the weight pass, N(4C + 7C/tp) floats a block. */
Test(plan, zbh1_bubble_and_memory)
{
    ch_jobspec_t f = gpt2_job(1, CH_SPLIT_EVEN, CH_SCHEDULE_1F1B);
    ch_jobspec_t z = gpt2_job(1, CH_SPLIT_EVEN, CH_SCHEDULE_ZBH1);
    ch_model_cfg_t mf = ch_plan_model_of(&f), mz = ch_plan_model_of(&z);
    ch_plan_t pf[2], pz[2];
    for (uint32_t s = 0; s < 2; s++) {
        cr_assert_eq(ch_plan_stage(&mf, lay(1, 2, 1), 1, 4, CH_RESHARD_PER_USE, s, &pf[s]), 0);
        cr_assert_eq(ch_plan_stage(&mz, lay(1, 2, 1), 1, 4, CH_RESHARD_PER_USE, s, &pz[s]), 0);
    }
    cr_expect_float_eq(pf[0].bubble, 1.0 / 5, 1e-12);
    cr_expect_float_eq(pz[0].bubble, 1.0 / 13, 1e-12);
    cr_expect_eq(pf[1].in_flight, 1);
    cr_expect_eq(pz[1].in_flight, 2);
    cr_expect_eq(pz[0].in_flight, 2);
    cr_expect_eq(pz[0].act_mb_bytes, pf[0].act_mb_bytes, "stage 0's backward stays whole");
    double N = 1024, C = 768;
    cr_expect_eq(pz[1].act_mb_bytes - pf[1].act_mb_bytes, 6 * N * (4 * C + 7 * C) * 4.0);
}

// ----------------------------------------------------------------------------
// in-memory checkpoints' buddies: every copy on another node, spread over the next one's ranks

/* Losing any single node leaves every rank's state somewhere: its own node's copy, or its
 * buddy's on another node. */
static void check_no_node_loses_a_state(const uint64_t *nodes, uint32_t world, const int64_t *buddy)
{
    for (uint32_t k = 0; k < world; k++) {
        cr_assert(buddy[k] >= 0 && buddy[k] < world, "rank %u: buddy %lld", k, (long long)buddy[k]);
        cr_assert_neq(nodes[buddy[k]], nodes[k], "rank %u's copy is on its own node", k);
    }
}

Test(plan, memckpt_two_nodes_of_four_pair_rank_i_with_rank_i_of_the_other)
{
    /* tp 2 x pp 2 x dp 2 placed a stage per node: ranks 0-3 on A, 4-7 on B */
    const uint64_t nodes[8] = {10, 10, 10, 10, 20, 20, 20, 20};
    int64_t buddy[8];
    cr_assert_eq(ch_plan_memckpt_buddies(nodes, 8, buddy), 0);
    for (int k = 0; k < 8; k++)
        cr_assert_eq(buddy[k], (k + 4) % 8, "rank %d: %lld", k, (long long)buddy[k]);
    check_no_node_loses_a_state(nodes, 8, buddy);
}

Test(plan, memckpt_uneven_interleaved_nodes_each_copy_elsewhere_spread_over_the_next)
{
    /* 3 nodes in rank order 7, 5, 9 (node 7's lowest rank is 0, node 5's is 1, 9's is 3),
     * holding 3, 2 and 2 ranks */
    const uint64_t nodes[7] = {7, 5, 7, 9, 5, 9, 7};
    int64_t buddy[7];
    cr_assert_eq(ch_plan_memckpt_buddies(nodes, 7, buddy), 0);
    check_no_node_loses_a_state(nodes, 7, buddy);
    /* node 7 (ranks 0, 2, 6) -> node 5 (ranks 1, 4): 0->1, 2->4, 6->1 */
    cr_assert_eq(buddy[0], 1);
    cr_assert_eq(buddy[2], 4);
    cr_assert_eq(buddy[6], 1);
    /* node 5 (1, 4) -> node 9 (3, 5); node 9 (3, 5) -> node 7 (0, 2, 6) */
    cr_assert_eq(buddy[1], 3);
    cr_assert_eq(buddy[4], 5);
    cr_assert_eq(buddy[3], 0);
    cr_assert_eq(buddy[5], 2);
}

Test(plan, memckpt_one_node_has_no_copy_elsewhere)
{
    const uint64_t nodes[4] = {3, 3, 3, 3};
    int64_t buddy[4];
    cr_assert_eq(ch_plan_memckpt_buddies(nodes, 4, buddy), 0);
    for (int k = 0; k < 4; k++)
        cr_assert_eq(buddy[k], -1);
}

/* train.device = cuda: the fused attention keeps one log-sum-exp a row, so the plan keeps
 * no B·NH·T·T per block; CPU jobs and heads wider than the fused kernels keep it. */
Test(plan, cuda_keeps_no_attention_probabilities)
{
    ch_jobspec_t j;
    ch_jobspec_defaults(&j);
    j.model.layers = 12, j.model.heads = 12, j.model.embd = 768, j.model.vocab = 50257;
    j.model.seq_len = 1024;
    ch_model_cfg_t cpu = ch_plan_model_of(&j);
    j.train.device = CH_DEVICE_CUDA;
    ch_model_cfg_t cuda = ch_plan_model_of(&j);
    cr_assert_eq(cpu.att_row, 0);
    cr_assert_eq(cuda.att_row, 1);
    ch_plan_t pc, pg;
    cr_assert_eq(ch_plan_stage(&cpu, lay(1, 1, 1), 16, 1, CH_RESHARD_PER_USE, 0, &pc), 0);
    cr_assert_eq(ch_plan_stage(&cuda, lay(1, 1, 1), 16, 1, CH_RESHARD_PER_USE, 0, &pg), 0);
    /* 12 blocks x B 16 x NH 12 x T 1024 x (T - 1) floats fewer: 9.7 GB at GPT-2 B16 T1024 */
    double att = 4.0 * 12 * 16 * 12 * 1024 * 1023;
    cr_expect_eq(pc.act_mb_bytes - pg.act_mb_bytes, att, "%.0f", pc.act_mb_bytes - pg.act_mb_bytes);
    cr_expect_eq(pc.state_bytes, pg.state_bytes);
    /* head size 192 > CH_PLAN_FLASH_MAX_HS: the materialised attention, on CUDA too */
    j.model.heads = 4;
    cr_expect_eq(ch_plan_model_of(&j).att_row, 0);
}

/* Mixed precision plans what the engine allocates: the same fp32 state; a block's kept
 * activations but its output (15·N·C at tp 1) as 2-byte packed casts, and [N,4C], [N,4C]
 * and [N,C] of fp32 scratch they are written in and widened to; without ZeRO-3 a
 * packed working copy, 2 bytes a parameter; under ZeRO-3 no working copy but the gathers'
 * packed 2-byte buffers (two gathered blocks and the widest tensor outside blocks, wte).
 * GPT-2 124M, B 8, T 1024. */
Test(plan, bf16_plans_what_the_engine_allocates)
{
    ch_model_cfg_t m = gpt2(1024), f = gpt2(1024);
    m.bf16 = 1;
    ch_plan_t p, q;
    cr_assert_eq(ch_plan_stage(&m, lay(1, 1, 1), 8, 1, CH_RESHARD_PER_USE, 0, &p), 0);
    cr_assert_eq(ch_plan_stage(&f, lay(1, 1, 1), 8, 1, CH_RESHARD_PER_USE, 0, &q), 0);
    cr_assert_eq(p.state_bytes, 16.0 * 124475904);
    const double NC = 8.0 * 1024 * 768, packed = 12 * 2.0 * 15 * NC, wide = 4.0 * 9 * NC;
    cr_assert_eq(p.working_bytes, 2.0 * 124475904);
    cr_assert_eq(q.working_bytes, 0.0);
    cr_assert_eq(p.act_mb_bytes, q.act_mb_bytes - packed);
    cr_assert_eq(p.scratch_bytes, q.scratch_bytes + wide);
    cr_assert_eq(p.total_bytes, 12156182528.0 + 2.0 * 124475904 - packed + wide, "bf16 %.0f",
                 p.total_bytes);
    cr_assert_eq(q.total_bytes, 12156182528.0, "fp32 %.0f", q.total_bytes);
    cr_assert_eq(ch_plan_stage(&m, lay(1, 1, 2), 8, 1, CH_RESHARD_PER_USE, 0, &p), 0);
    cr_assert_eq(ch_plan_stage(&f, lay(1, 1, 2), 8, 1, CH_RESHARD_PER_USE, 0, &q), 0);
    cr_assert_eq(p.working_bytes, 0.0);
    cr_assert_eq(p.state_bytes, q.state_bytes);
    cr_assert_eq(p.act_bytes, q.act_bytes - packed + wide);
    double bs = p.block_shard * 2, wte = 50304.0 * 768;
    cr_assert_eq(p.gathered_bytes, q.gathered_bytes + 2.0 * (2 * bs + wte));
    ch_jobspec_t j;
    ch_jobspec_defaults(&j);
    cr_expect_eq(ch_plan_model_of(&j).bf16, 0);
    j.train.precision = CH_PRECISION_BF16;
    cr_expect_eq(ch_plan_model_of(&j).bf16, 1);
    j.train.emulate = 1; /* the CPU emulation allocates the same */
    cr_expect_eq(ch_plan_model_of(&j).bf16, 1);
}
