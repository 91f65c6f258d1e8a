/* The plan arithmetic (plan.h has the theory of operation). */
#include "common/plan.h"

#include <math.h>
#include <string.h>

#include "common/err.h"

#define F32 4.0 /* bytes */

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
    return m;
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
    p->bubble = (pp - 1) / (mb + pp - 1);
}

static void plan_stage(const ch_model_cfg_t *m, ch_layout_t l, uint32_t micro_batch,
                       uint32_t microbatches, ch_reshard_t reshard, ch_recompute_t recompute,
                       uint32_t s, ch_plan_t *p)
{
    const double C = m->embd, T = m->seq_len, B = micro_batch;
    const double N = B * T, NH = m->heads, tp = l.tp;
    const double wte = p->padded_vocab * C / tp;

    p->stage = s;
    ch_layout_stage_blocks(m->layers, l.pp, s, ch_plan_head_blocks(m), &p->first_block, &p->blocks);
    p->embeddings = s == 0;
    p->head = s == l.pp - 1;
    const double nb = p->blocks;
    /* the tensors outside blocks: wte (once when pp = 1), wpe; ln_f's weight and bias */
    double outside[4] = {0, 0, 0, 0}, whole = 0, owned = 0, padded = 0;
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
    }
    p->params = nb * p->block_tp + whole;
    p->owned = nb * p->block_shard + owned;

    p->state_bytes = 4 * F32 * p->owned;
    /* ZeRO-3 runs only with data parallelism (a DP group of one holds its blocks whole):
     * the blocks' gathered buffers and one block's unsharded gradient; the tensors outside
     * blocks gathered (padded) and their unsharded gradients */
    double gathered = reshard == CH_RESHARD_PER_STEP ? nb : fmin(nb, 2);
    p->gathered_bytes = l.dp > 1 ? F32 * ((gathered + 1) * p->block_shard * l.dp + 2 * padded) : 0;

    double per_block = N * C * (4 + 12 / tp) + 4 * N + B * (NH / tp) * T * T;
    /* what a block keeps per micro-batch, and what is recomputed (once, in the scratch) */
    double att = B * (NH / tp) * T * T, redo = 0;
    if (recompute == CH_RECOMPUTE_SELECTIVE)
        redo = att;
    else if (recompute == CH_RECOMPUTE_FULL)
        redo = per_block - N * C;
    double kept = nb * (per_block - redo);
    const int first = s == 0, last = s + 1 == l.pp;
    if (first)
        kept += N + N * C;
    if (last)
        kept += N * C + 5 * N;
    if (!first)
        kept += 2 * N * C;
    double scratch = 3 * N * C + 4 * N * C / tp + T * T + (last ? 0 : N * C) + (nb > 0 ? redo : 0);
    if (p->head) {
        double Vl = p->padded_vocab / tp, logits = fmin(N * Vl, CH_PLAN_LOGITS_FLOATS);
        double rows = fmax(1, fmin(N, floor(CH_PLAN_LOGITS_FLOATS / Vl)));
        scratch += logits + (tp > 1 ? logits + 3 * rows : 0);
    }
    p->in_flight = l.pp - s < microbatches ? l.pp - s : microbatches;
    p->act_mb_bytes = F32 * kept;
    p->scratch_bytes = F32 * scratch;
    p->act_bytes = p->act_mb_bytes * p->in_flight + p->scratch_bytes;
    p->total_bytes = p->state_bytes + p->gathered_bytes + p->act_bytes;
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
    plan_model(m, l, micro_batch, microbatches, out);
    plan_stage(m, l, micro_batch, microbatches, reshard, recompute, stage, out);
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
