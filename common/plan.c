/* The plan arithmetic (plan.h has the theory of operation). */
#include "common/plan.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/pipe_il.h"

#define F32  4.0 /* bytes */
#define BF16 2.0

/* ch_layout_padded_vocab without its uint32 wrap: vocab 2^32 - 1 pads past 2^32. */
static double padded_vocab(uint32_t vocab, uint32_t tp)
{
    double align = (vocab >= 8192 ? 128.0 : 8.0) * tp;
    return ceil(vocab / align) * align;
}

/* ch_layout_shard_len in doubles (exact below CH_PLAN_EXACT_MAX). */
static double shard_of(double n, uint32_t dp)
{
    return n < CH_PLAN_EXACT_MAX ? (double)ch_layout_shard_len((size_t)n, dp) : ceil(n / dp);
}

static double flops_per_seq(double s, double l, double h, double V)
{
    return 72.0 * s * l * h * h * (1.0 + s / (6.0 * h) + V / (12.0 * l * h));
}

double ch_plan_flops(const ch_model_cfg_t *cfg, uint32_t B)
{
    return (double)B * flops_per_seq(cfg->seq_len, cfg->layers, cfg->embd, cfg->padded_vocab);
}

/* parallel.stage_split = auto: balanced when it moves blocks off the slowest stage (the
 * LM head's, ch_layout_stage_blocks) and its peak stage fits CH_PLAN_AUTO_BUDGET; else even,
 * whose first stages hold fewer blocks. */
static uint32_t auto_balanced(const ch_jobspec_t *j, ch_model_cfg_t m)
{
    const uint32_t pp = j->parallel.pp;
    ch_layout_t l = {j->parallel.tp, pp, j->parallel.dp};
    if (pp < 2 || l.tp == 0 || l.dp == 0 || j->parallel.micro_batch_size == 0 ||
        j->parallel.microbatches == 0 || pp > m.layers)
        return 0;
    m.balanced_stages = 1;
    uint32_t f = 0, even = 0, bal = 0;
    ch_layout_stage_blocks(m.layers, pp, pp - 1, 0.0, &f, &even);
    ch_layout_stage_blocks(m.layers, pp, pp - 1, ch_plan_head_blocks(&m), &f, &bal);
    if (bal == even)
        return 0;
    for (uint32_t s = 0; s < pp; s++) {
        ch_plan_t p;
        if (ch_plan_stage_rc(&m, l, j->parallel.micro_batch_size, j->parallel.microbatches,
                             j->parallel.reshard, j->parallel.recompute, s, &p) < 0 ||
            p.total_bytes > CH_PLAN_AUTO_BUDGET)
            return 0;
    }
    return 1;
}

ch_model_cfg_t ch_plan_model_of(const ch_jobspec_t *j)
{
    ch_model_cfg_t m = {.layers = j->model.layers,
                        .heads = j->model.heads,
                        .embd = j->model.embd,
                        .vocab = j->model.vocab,
                        .padded_vocab = j->model.vocab,
                        .seq_len = j->model.seq_len};
    if (j->parallel.tp > 0 && padded_vocab(j->model.vocab, j->parallel.tp) < 4294967296.0)
        m.padded_vocab = ch_layout_padded_vocab(j->model.vocab, j->parallel.tp);
    m.balanced_stages = j->parallel.stage_split == CH_SPLIT_BALANCED;
    m.schedule = j->parallel.schedule;
    m.virtual_stages =
        j->parallel.schedule == CH_SCHEDULE_INTERLEAVED ? j->parallel.virtual_stages : 1;
    if (j->parallel.stage_split == CH_SPLIT_AUTO)
        m.balanced_stages = auto_balanced(j, m);
    if (j->train.device == CH_DEVICE_CUDA && m.heads > 0 &&
        m.embd / m.heads <= CH_PLAN_FLASH_MAX_HS)
        m.att_row = 1; /* the fused attention, CUDA's default */
    /* the CPU emulation allocates what the GPU path does (plan.h) */
    m.bf16 = j->train.precision == CH_PRECISION_BF16;
    return m;
}

double ch_plan_memckpt_bytes(const ch_model_cfg_t *m, ch_layout_t l)
{
    double owned = 0;
    for (uint32_t s = 0; s < l.pp; s++) {
        ch_plan_t p;
        if (ch_plan_stage(m, l, 1, 1, CH_RESHARD_PER_USE, s, &p) < 0)
            return 0;
        owned = fmax(owned, p.owned);
    }
    return 2.0 * CH_PLAN_MEMCKPT_KEEP * 3.0 * 4.0 * owned;
}

int ch_plan_memckpt_buddies(const uint64_t *nodes, uint32_t world, int64_t *buddy)
{
    /* per rank: its node's index (nodes in the order of their lowest rank) and its index
     * among that node's ranks; per node: its count and where its ranks start in `members` */
    uint32_t *node = calloc(world, sizeof *node), *idx = calloc(world, sizeof *idx);
    uint32_t *count = calloc(world, sizeof *count), *start = calloc(world + 1, sizeof *start);
    uint32_t *members = calloc(world, sizeof *members), *first = calloc(world, sizeof *first);
    uint32_t nn = 0;
    int rc = node && idx && count && start && members && first ? 0 : -ENOMEM;
    for (uint32_t k = 0; rc == 0 && k < world; k++) {
        uint32_t n = 0;
        while (n < nn && nodes[first[n]] != nodes[k])
            n++;
        if (n == nn)
            first[nn++] = k;
        node[k] = n;
        idx[k] = count[n]++;
    }
    for (uint32_t n = 0; rc == 0 && n < nn; n++)
        start[n + 1] = start[n] + count[n];
    for (uint32_t k = 0; rc == 0 && k < world; k++)
        members[start[node[k]] + idx[k]] = k;
    for (uint32_t k = 0; rc == 0 && k < world; k++) {
        uint32_t next = (node[k] + 1) % nn;
        buddy[k] = nn < 2 ? -1 : (int64_t)members[start[next] + idx[k] % count[next]];
    }
    free(node);
    free(idx);
    free(count);
    free(start);
    free(members);
    free(first);
    return rc;
}

double ch_plan_head_blocks(const ch_model_cfg_t *m)
{
    return m->balanced_stages ? ch_layout_head_blocks(m->embd, m->vocab, m->seq_len) : 0.0;
}

int ch_plan_place(const ch_jobspec_t *s, uint32_t rank, ch_place_t *out)
{
    ch_layout_t l = ch_jobspec_layout(s);
    *out = (ch_place_t){0};
    if (l.tp == 0 || l.pp == 0 || l.dp == 0 || rank >= ch_layout_world(l))
        return -EINVAL;
    ch_model_cfg_t m = ch_plan_model_of(s);
    ch_layout_place(l, s->model.layers, ch_plan_head_blocks(&m), rank, out);
    ch_plan_t p;
    if (s->kind == CH_JOB_TRAIN &&
        ch_plan_stage(&m, l, s->parallel.micro_batch_size, s->parallel.microbatches,
                      s->parallel.reshard, out->coord.pp, &p) == 0)
        out->owned_params = (uint64_t)p.owned;
    return 0;
}

/* The whole-model figures: they do not depend on the stage. */
static void plan_model(const ch_model_cfg_t *m, ch_layout_t l, uint32_t micro_batch,
                       uint32_t microbatches, ch_plan_t *p)
{
    const double C = m->embd, T = m->seq_len, L = m->layers;
    const double tp = l.tp, pp = l.pp, mb = microbatches;

    p->world = l.tp * l.pp * l.dp;
    p->padded_vocab = padded_vocab(m->vocab, l.tp);
    p->block = 12 * C * C + 13 * C;
    p->block_tp = 12 * C * C / tp + 7 * C / tp + 6 * C;
    p->block_shard = shard_of(p->block_tp, l.dp);
    p->params_total = L * p->block + (double)m->vocab * C + T * C + 2 * C;
    p->params_padded = L * p->block + p->padded_vocab * C + T * C + 2 * C;
    p->sequences = (double)l.dp * mb * micro_batch;
    p->tokens = p->sequences * T;
    /* Linear in the batch; the global batch may not fit a uint32. */
    p->flops = flops_per_seq(T, L, C, p->padded_vocab) * p->sequences;
    /* ZB-H1: (p - 1)(T_F + T_B - T_W) idle against m(T_F + T_B + T_W) busy, with the
     * paper's T_F = T_B = T_W */
    const double v = m->virtual_stages > 1 ? m->virtual_stages : 1; /* interleaved: v * m */
    p->bubble = m->schedule == CH_SCHEDULE_ZBH1 ? (pp - 1) / (3 * mb + pp - 1)
                                                : (pp - 1) / (v * mb + pp - 1);
}

/* il: the interleaved schedule's step layout of the stage (common/pipe_il.h), NULL for one
 * chunk. */
static void plan_stage(const ch_model_cfg_t *m, ch_layout_t l, uint32_t micro_batch,
                       uint32_t microbatches, ch_reshard_t reshard, ch_recompute_t recompute,
                       uint32_t s, const ch_il_layout_t *il, ch_plan_t *p)
{
    const double C = m->embd, T = m->seq_len, B = micro_batch;
    const double N = B * T, NH = m->heads, tp = l.tp;
    const double wte = p->padded_vocab * C / tp;

    p->stage = s;
    const uint32_t v = m->virtual_stages > 1 ? m->virtual_stages : 1;
    if (v > 1) { /* v chunks of layers / (pp v), the first at block s * layers / (pp v) */
        p->blocks = m->layers / l.pp;
        p->first_block = s * (m->layers / (l.pp * v));
    } else {
        ch_layout_stage_blocks(m->layers, l.pp, s, ch_plan_head_blocks(m), &p->first_block,
                               &p->blocks);
    }
    p->embeddings = s == 0;
    p->head = s == l.pp - 1;
    const double nb = p->blocks;
    /* the tensors outside blocks: wte (once when pp = 1), wpe; ln_f's weight and bias */
    double outside[4] = {0, 0, 0, 0}, whole = 0, owned = 0, padded = 0, widest = 0;
    if (p->embeddings || p->head)
        outside[0] = wte;
    if (p->embeddings)
        outside[1] = T * C;
    if (p->head)
        outside[2] = outside[3] = C;
    for (int i = 0; i < 4; i++) {
        double shard = shard_of(outside[i], l.dp);
        whole += outside[i];
        owned += l.dp > 1 ? shard : outside[i];
        padded += shard * l.dp;
        widest = fmax(widest, shard * l.dp);
    }
    p->params = nb * p->block_tp + whole;
    p->owned = nb * p->block_shard + owned;

    p->state_bytes = 4 * F32 * p->owned;
    /* ZeRO-3 runs only with data parallelism (a DP group of one holds its blocks whole):
     * the blocks' gathered buffers and two blocks' unsharded gradients (one written by a
     * backward while the other's reduce-scatter runs); the tensors outside
     * blocks gathered (padded) and their unsharded gradients. In bf16 the gathers arrive
     * as 2-byte messages, each into a packed buffer of its own beside the fp32 one: one per
     * gathered block, one for the widest tensor outside blocks. */
    double gathered = reshard == CH_RESHARD_PER_STEP ? nb : fmin(nb, 2);
    double packed = m->bf16 ? BF16 * (gathered * p->block_shard * l.dp + widest) : 0;
    p->gathered_bytes = l.dp > 1 ? F32 * gathered * p->block_shard * l.dp +
                                       2 * F32 * p->block_shard * l.dp + 2 * F32 * padded + packed
                                 : 0;
    /* bf16 without ZeRO-3: the parameters' packed working copy, cast once a step (under
     * ZeRO-3 the packed gather buffers above are the working copies) */
    p->working_bytes = m->bf16 && l.dp == 1 ? BF16 * p->params : 0;

    const double row = m->att_row ? m->att_row : T; /* attention floats per query row */
    /* activations: fp32 slots; under bf16 a block's kept [N,*] activations as packed casts
     * (ln_1, res2, ln_2 [N,C]; qkv, the MLP's and the GELU's [N,11C/tp]; the attention's
     * [N,C/tp] unless a fused attention's backward reads it: row < T), its output, the
     * statistics and att in fp32 (plan.h) */
    double att = B * (NH / tp) * T * row;
    double kept16 = m->bf16 ? N * C * (3 + (row < T ? 11 : 12) / tp) : 0;
    double per_block = F32 * (N * C * (4 + 12 / tp) + 4 * N + att) - (F32 - BF16) * kept16;
    /* what a block keeps per micro-batch, and what is recomputed (once, in the scratch);
     * selective keeps no probabilities anywhere: the attention backward recomputes them a
     * block of query rows at a time in the attention scratch, at least 2·min(T, QBLOCK)·T */
    double redo = 0, drop = 0, att_scratch = T * T;
    if (recompute == CH_RECOMPUTE_SELECTIVE) {
        drop = F32 * att;
        att_scratch = fmax(att_scratch, 2 * fmin(T, CH_PLAN_ATT_QBLOCK) * T);
    } else if (recompute == CH_RECOMPUTE_FULL)
        drop = redo = per_block - F32 * N * C;
    /* interleaved: a slot is one chunk-activation, nb / v blocks */
    double kept = (v > 1 ? nb / v : nb) * (per_block - drop);
    if (m->schedule == CH_SCHEDULE_ZBH1 && s > 0) /* stage 0's backward stays whole */
        kept += F32 * nb * N * (4 * C + 7 * C / tp);
    const int first = s == 0, last = s + 1 == l.pp;
    if (first)
        kept += F32 * (N + N * C);
    if (last)
        kept += F32 * (N * C + 5 * N);
    if (ch_plan_head_split(m->schedule, l, s, micro_batch, microbatches, m->seq_len,
                           p->padded_vocab))
        kept += F32 * N * p->padded_vocab;
    if (v == 1 && !first)
        kept += F32 * 2 * N * C;
    double scratch =
        F32 * (3 * N * C + 4 * N * C / tp + (last || v > 1 ? 0 : N * C) + att_scratch) +
        (nb > 0 ? redo : 0);
    if (m->bf16 && nb > 0) /* where the packed ones are written and widened again */
        scratch += F32 * N * (fmax(C, 4 * C / tp) + 4 * C / tp + C);
    if (p->head) {
        double Vl = p->padded_vocab / tp, logits = fmin(N * Vl, CH_PLAN_LOGITS_FLOATS);
        double rows = fmax(1, fmin(N, floor(CH_PLAN_LOGITS_FLOATS / Vl)));
        scratch += F32 * (logits + (tp > 1 ? logits + 3 * rows : 0));
    }
    uint32_t held = m->schedule == CH_SCHEDULE_ZBH1 ? l.pp : l.pp - s;
    p->in_flight = il ? il->slots : held < microbatches ? held : microbatches;
    p->act_mb_bytes = kept;
    p->scratch_bytes = scratch;
    /* interleaved: the received inputs and output gradients, the input gradients being sent */
    double pipe = il ? F32 * (double)(il->recvs + il->sends) * N * C : 0;
    p->act_bytes = p->act_mb_bytes * p->in_flight + pipe + p->scratch_bytes;
    p->total_bytes = p->state_bytes + p->gathered_bytes + p->working_bytes + p->act_bytes;
}

int ch_plan_head_split(ch_schedule_t schedule, ch_layout_t l, uint32_t stage, uint32_t micro_batch,
                       uint32_t microbatches, uint32_t seq_len, double padded_vocab)
{
    if (schedule != CH_SCHEDULE_ZBH1 || l.pp < 2 || stage + 1 != l.pp || l.tp > 1)
        return 0;
    double slots = l.pp < microbatches ? l.pp : microbatches;
    return slots * micro_batch * seq_len * padded_vocab <= CH_PLAN_LOGITS_FLOATS;
}

int ch_plan_stage(const ch_model_cfg_t *m, ch_layout_t l, uint32_t micro_batch,
                  uint32_t microbatches, ch_reshard_t reshard, uint32_t stage, ch_plan_t *out)
{
    return ch_plan_stage_rc(m, l, micro_batch, microbatches, reshard, CH_RECOMPUTE_NONE, stage,
                            out);
}

int ch_plan_stage_rc(const ch_model_cfg_t *m, ch_layout_t l, uint32_t micro_batch,
                     uint32_t microbatches, ch_reshard_t reshard, ch_recompute_t recompute,
                     uint32_t stage, ch_plan_t *out)
{
    memset(out, 0, sizeof *out);
    if (!m || !m->layers || !m->heads || !m->embd || !m->vocab || !m->seq_len || !l.tp || !l.pp ||
        !l.dp || !micro_batch || !microbatches || stage >= l.pp)
        return -EINVAL;
    ch_il_layout_t il;
    int v = m->virtual_stages > 1;
    int rc = v ? ch_il_layout(&il, l.pp, stage, m->virtual_stages, microbatches) : 0;
    if (rc < 0)
        return rc;
    plan_model(m, l, micro_batch, microbatches, out);
    plan_stage(m, l, micro_batch, microbatches, reshard, recompute, stage, v ? &il : NULL, out);
    if (v)
        ch_il_layout_free(&il);
    if (out->params_padded >= CH_PLAN_EXACT_MAX || out->total_bytes >= CH_PLAN_EXACT_MAX)
        return CH_E_TOOBIG;
    return 0;
}

int ch_plan_peak(const ch_model_cfg_t *m, ch_layout_t l, uint32_t micro_batch,
                 uint32_t microbatches, ch_reshard_t reshard, ch_plan_t *out)
{
    int rc = ch_plan_stage(m, l, micro_batch, microbatches, reshard, 0, out);
    for (uint32_t s = 1; s < l.pp && rc != -EINVAL; s++) {
        ch_plan_t p;
        int r = ch_plan_stage(m, l, micro_batch, microbatches, reshard, s, &p);
        if (p.total_bytes > out->total_bytes) {
            *out = p;
            rc = r;
        }
    }
    return rc;
}
