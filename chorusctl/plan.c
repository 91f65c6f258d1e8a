/* chorusctl plan JOBFILE [--set section.key=value]... [--json]: what a job will be, before
 * it is launched. The file is checked exactly as submit checks it (ctl_jobfile_load), then
 * the plan is printed: world size and layout, each pipeline stage's blocks and what else it
 * holds, the padded vocab, parameter counts (whole model; per rank after the TP slice and
 * the ZeRO-3 shard), a memory estimate per rank, model FLOPs and tokens per step, and the
 * 1F1B pipeline bubble. Runs locally; talks to no coordinator.
 *
 * Theory of operation: a rank's share of the model (DESIGN §5, §7). C = embd,
 * T = seq_len, B = micro_batch_size, N = B*T, NH = heads, V = vocab, Vp = padded vocab.
 *   One block, whole:   12C² + 13C (ln_1 2C; c_attn C·3C + 3C; attn.c_proj C·C + C;
 *                       ln_2 2C; c_fc C·4C + 4C; mlp.c_proj 4C·C + C).
 *   One block, TP rank: column-parallel c_attn and c_fc (weights and biases) and the
 *                       row-parallel c_proj weights are split 1/tp; LayerNorms and the
 *                       row-parallel biases are replicated: 12C²/tp + 7C/tp + 6C.
 *   Outside blocks:     wte split over tp along the padded vocab (Vp·C/tp) on stage 0 and
 *                       again on the last stage for the tied LM head (one copy when
 *                       pp = 1); wpe (T·C) on stage 0 and ln_f (2C) on the last stage,
 *                       replicated over tp.
 *   ZeRO-3:             each block's TP slice is one flat buffer split into dp padded
 *                       shards (ch_layout_shard_len); tensors outside blocks are held
 *                       whole by every dp rank of their stage.
 * The whole-model count is Hugging Face's (V rows of wte, no separate LM head):
 * 124,439,808 for GPT-2 124M. Per-rank counts are what a rank stores, so they include
 * its padded wte rows.
 *
 * Memory per rank, fp32 (4 bytes a float):
 *   state       owned parameters × 4 floats: master weights, Adam m and v, gradients
 *   gathered    per-use: 2 blocks (the one in use and the next, prefetched); per-step:
 *               every block of the stage; either way plus one block's unsharded gradient
 *               waiting for its reduce-scatter
 *   activations what workerd/model.c keeps for backward, per micro-batch:
 *                 per block   N·C·(4 + 12/tp) + 4N + B·(NH/tp)·T·T
 *                             (ln1, res2, ln2, res3 replicated; qkv 3, atty 1, fch 4 and
 *                             fch_gelu 4 split over tp; LayerNorm mean and rstd; attention
 *                             probabilities of this rank's heads)
 *                 stage 0     + N·C (embedding output)
 *                 last stage  + N·C + 4N (ln_f output, mean, rstd; log-sum-exp, losses)
 *               times the micro-batches 1F1B keeps in flight on stage s,
 *               min(pp - s, microbatches); plus backward scratch used once,
 *               2·N·C + 4·N·C/tp + T·T, and on the last stage the logits buffer,
 *               min(N·Vp/tp, 64 Mi floats) (the model's chunking budget).
 * Not counted: communication buffers, the CUDA context, allocator slack. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/jobspec.h"
#include "common/layout.h"
#include "common/plan.h"
#include "ctl.h"
#include "json.h"
#include "table.h"

#define LOGITS_FLOATS ((double)(64u << 20)) /* workerd/model.c's LOGITS_BUDGET */
#define EXACT_MAX     9007199254740992.0    /* 2^53: counts below it are exact in a double */
#define F32           4.0                   /* bytes */

/* Counts are doubles: no overflow for any valid file, exact below EXACT_MAX. */
typedef struct plan {
    const ch_jobspec_t *spec;
    ch_layout_t l;
    uint32_t world, Vp;
    double params_total;  /* Hugging Face count: V rows of wte */
    double params_padded; /* with the padded wte rows */
    double block;         /* one block, whole */
    double block_tp;      /* one block, one TP rank */
    double block_shard;   /* one block, one TP rank, one ZeRO-3 shard */
    double sequences, tokens, flops, bubble;
} plan_t;

typedef struct stage {
    uint32_t index, first, count; /* blocks [first, first + count) */
    int embeddings, head;         /* holds wte + wpe / ln_f + the tied LM head */
    double params;                /* one rank's TP slice of the stage */
    double owned;                 /* after ZeRO-3 */
    double state_bytes, gathered_bytes;
    double act_mb_bytes;  /* kept for backward, one micro-batch */
    double scratch_bytes; /* backward scratch and logits, once */
    uint32_t in_flight;   /* micro-batches 1F1B keeps */
    double act_bytes, total_bytes;
} stage_t;

static void plan_model(plan_t *p, const ch_jobspec_t *j)
{
    const double C = j->model.embd, T = j->model.seq_len, L = j->model.layers;
    const double tp = j->parallel.tp, pp = j->parallel.pp, m = j->parallel.microbatches;

    p->spec = j;
    p->l = ch_jobspec_layout(j);
    p->world = ch_layout_world(p->l);
    p->Vp = ch_layout_padded_vocab(j->model.vocab, j->parallel.tp);
    p->block = 12 * C * C + 13 * C;
    p->block_tp = 12 * C * C / tp + 7 * C / tp + 6 * C;
    p->block_shard = p->block_tp < EXACT_MAX
                         ? (double)ch_layout_shard_len((size_t)p->block_tp, j->parallel.dp)
                         : ceil(p->block_tp / j->parallel.dp);
    p->params_total = L * p->block + (double)j->model.vocab * C + T * C + 2 * C;
    p->params_padded = L * p->block + (double)p->Vp * C + T * C + 2 * C;
    p->sequences = (double)j->parallel.dp * m * j->parallel.micro_batch_size;
    p->tokens = p->sequences * T;
    /* Model FLOPs are linear in the batch; the global batch may not fit a uint32. */
    ch_model_cfg_t cfg = {j->model.layers, j->model.heads, j->model.embd,
                          j->model.vocab,  p->Vp,          j->model.seq_len};
    p->flops = ch_plan_flops(&cfg, 1) * p->sequences;
    p->bubble = (pp - 1) / (m + pp - 1);
}

static void plan_stage(const plan_t *p, uint32_t s, stage_t *st)
{
    const ch_jobspec_t *j = p->spec;
    const double C = j->model.embd, T = j->model.seq_len, B = j->parallel.micro_batch_size;
    const double N = B * T, NH = j->model.heads, tp = p->l.tp;
    const double wte = (double)p->Vp * C / tp;
    const uint32_t pp = p->l.pp, m = j->parallel.microbatches;

    memset(st, 0, sizeof *st);
    st->index = s;
    ch_layout_stage_blocks(j->model.layers, pp, s, &st->first, &st->count);
    st->embeddings = s == 0;
    st->head = s == pp - 1;
    const double nb = st->count;
    double outside = 0;
    if (st->embeddings)
        outside += wte + T * C;
    if (st->head)
        outside += 2 * C + (st->embeddings ? 0 : wte);
    st->params = nb * p->block_tp + outside;
    st->owned = nb * p->block_shard + outside;

    st->state_bytes = 4 * F32 * st->owned;
    double gathered = j->parallel.reshard == CH_RESHARD_PER_STEP ? nb : fmin(nb, 2);
    st->gathered_bytes = F32 * (gathered + 1) * p->block_tp;

    double per_block = N * C * (4 + 12 / tp) + 4 * N + B * (NH / tp) * T * T;
    double kept = nb * per_block;
    if (st->embeddings)
        kept += N * C;
    if (st->head)
        kept += N * C + 4 * N;
    double scratch = 2 * N * C + 4 * N * C / tp + T * T;
    if (st->head)
        scratch += fmin(N * p->Vp / tp, LOGITS_FLOATS);
    st->in_flight = pp - s < m ? pp - s : m;
    st->act_mb_bytes = F32 * kept;
    st->scratch_bytes = F32 * scratch;
    st->act_bytes = st->act_mb_bytes * st->in_flight + st->scratch_bytes;
    st->total_bytes = st->state_bytes + st->gathered_bytes + st->act_bytes;
}

// ----------------------------------------------------------------------------
// output

static const char *reshard_name(ch_reshard_t r)
{
    return r == CH_RESHARD_PER_STEP ? "per-step" : "per-use";
}

/* 124439808 -> "124,439,808". */
static void fmt_count(char *buf, size_t n, double v)
{
    char digits[32];
    size_t len = (size_t)snprintf(digits, sizeof digits, "%.0f", v), o = 0;
    for (size_t i = 0; i < len && o + 2 < n; i++) {
        if (i > 0 && (len - i) % 3 == 0)
            buf[o++] = ',';
        buf[o++] = digits[i];
    }
    buf[o] = '\0';
}

static void fmt_bytes(char *buf, size_t n, double v)
{
    static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    int i = 0;
    while (v >= 1024.0 && i < 5) {
        v /= 1024.0;
        i++;
    }
    snprintf(buf, n, i == 0 ? "%.0f %s" : "%.2f %s", v, unit[i]);
}

static void fmt_range(char *buf, size_t n, uint32_t first, uint32_t count)
{
    if (count == 1)
        snprintf(buf, n, "%u", first);
    else
        snprintf(buf, n, "%u-%u", first, first + count - 1);
}

static const char *stage_holds(const stage_t *st)
{
    if (st->embeddings && st->head)
        return "embeddings, ln_f + LM head";
    if (st->embeddings)
        return "embeddings";
    return st->head ? "ln_f + LM head (wte copy)" : "-";
}

static void print_text(const plan_t *p, const char *file, double peak, uint32_t peak_stage,
                       const char *warning)
{
    const ch_jobspec_t *j = p->spec;
    const uint32_t per_stage = p->l.tp * p->l.dp;
    char a[48], b[48], c[48], d[48];
    ctl_table_t t;

    printf("plan for job '%s' (%s), kind %s\n", j->name, file, ch_job_kind_name(j->kind));
    printf("model       %u layers, %u heads, embd %u, vocab %u (padded to %u for tp %u), "
           "seq_len %u\n",
           j->model.layers, j->model.heads, j->model.embd, j->model.vocab, p->Vp, p->l.tp,
           j->model.seq_len);
    printf("layout      world size %u = tp %u x pp %u x dp %u; reshard %s\n", p->world, p->l.tp,
           p->l.pp, p->l.dp, reshard_name(j->parallel.reshard));
    fmt_count(a, sizeof a, p->sequences);
    fmt_count(b, sizeof b, p->tokens);
    printf("batch       %s sequences/step = dp %u x microbatches %u x micro_batch_size %u; %s "
           "tokens/step\n",
           a, p->l.dp, j->parallel.microbatches, j->parallel.micro_batch_size, b);
    fmt_count(a, sizeof a, p->params_total);
    fmt_count(b, sizeof b, p->params_padded);
    printf("parameters  %s (LM head tied to wte; %s with padded vocab rows)\n", a, b);
    ctl_fmt_si(a, sizeof a, p->flops);
    ctl_fmt_si(b, sizeof b, p->flops / p->tokens);
    printf("compute     %s model FLOPs per step, %s per token\n", a, b);
    printf("pipeline    1F1B over %u stage%s: bubble %.1f%% = (pp-1)/(microbatches+pp-1) = "
           "%u/%u\n",
           p->l.pp, p->l.pp == 1 ? "" : "s", 100.0 * p->bubble, p->l.pp - 1,
           j->parallel.microbatches + p->l.pp - 1);
    printf("\n");

    ctl_table_init(&t, 10);
    const char *head[] = {"STAGE",      "RANKS", "BLOCKS",   "HOLDS",       "PARAMS/RANK",
                          "OWNED/RANK", "STATE", "GATHERED", "ACTIVATIONS", "TOTAL/RANK"};
    for (size_t i = 0; i < 10; i++)
        ctl_table_cell(&t, "%s", head[i]);
    for (uint32_t s = 0; s < p->l.pp; s++) {
        stage_t st;
        plan_stage(p, s, &st);
        ctl_table_cell(&t, "%u", s);
        fmt_range(a, sizeof a, s * per_stage, per_stage);
        ctl_table_cell(&t, "%s", a);
        fmt_range(a, sizeof a, st.first, st.count);
        ctl_table_cell(&t, "%s", a);
        ctl_table_cell(&t, "%s", stage_holds(&st));
        fmt_count(a, sizeof a, st.params);
        fmt_count(b, sizeof b, st.owned);
        ctl_table_cell(&t, "%s", a);
        ctl_table_cell(&t, "%s", b);
        fmt_bytes(a, sizeof a, st.state_bytes);
        fmt_bytes(b, sizeof b, st.gathered_bytes);
        fmt_bytes(c, sizeof c, st.act_bytes);
        fmt_bytes(d, sizeof d, st.total_bytes);
        ctl_table_cell(&t, "%s", a);
        ctl_table_cell(&t, "%s", b);
        ctl_table_cell(&t, "%s (%ux)", c, st.in_flight);
        ctl_table_cell(&t, "%s", d);
    }
    ctl_table_print(&t, stdout);
    ctl_table_fini(&t);
    fmt_bytes(a, sizeof a, peak);
    printf("\npeak memory per rank: %s (stage %u)\n", a, peak_stage);
    printf("memory: state = fp32 master + Adam m, v + gradients of the rank's ZeRO-3 shard; "
           "gathered = %s; activations = micro-batches in flight (Nx) + backward scratch\n",
           j->parallel.reshard == CH_RESHARD_PER_STEP
               ? "the stage's blocks + one block's gradient (per-step)"
               : "2 blocks (in use + prefetch) + one block's gradient (per-use)");
    if (warning)
        printf("warning: %s\n", warning);
}

static void print_json(const plan_t *p, const char *file, double peak, const char *warning)
{
    const ch_jobspec_t *j = p->spec;
    const uint32_t per_stage = p->l.tp * p->l.dp;
    ctl_json_t js;

    ctl_json_init(&js, stdout);
    ctl_json_obj_begin(&js);
    ctl_json_kstr(&js, "file", file);
    ctl_json_kstr(&js, "name", j->name);
    ctl_json_kstr(&js, "kind", ch_job_kind_name(j->kind));
    ctl_json_key(&js, "model");
    ctl_json_obj_begin(&js);
    ctl_json_kuint(&js, "layers", j->model.layers);
    ctl_json_kuint(&js, "heads", j->model.heads);
    ctl_json_kuint(&js, "embd", j->model.embd);
    ctl_json_kuint(&js, "vocab", j->model.vocab);
    ctl_json_kuint(&js, "padded_vocab", p->Vp);
    ctl_json_kuint(&js, "seq_len", j->model.seq_len);
    ctl_json_obj_end(&js);
    ctl_json_kuint(&js, "world_size", p->world);
    ctl_json_key(&js, "layout");
    ctl_json_obj_begin(&js);
    ctl_json_kuint(&js, "tp", p->l.tp);
    ctl_json_kuint(&js, "pp", p->l.pp);
    ctl_json_kuint(&js, "dp", p->l.dp);
    ctl_json_obj_end(&js);
    ctl_json_kstr(&js, "reshard", reshard_name(j->parallel.reshard));
    ctl_json_kuint(&js, "microbatches", j->parallel.microbatches);
    ctl_json_kuint(&js, "micro_batch_size", j->parallel.micro_batch_size);
    ctl_json_kuint(&js, "sequences_per_step", (uint64_t)p->sequences);
    ctl_json_kuint(&js, "tokens_per_step", (uint64_t)p->tokens);
    ctl_json_kdouble(&js, "flops_per_step", p->flops);
    ctl_json_kuint(&js, "params_total", (uint64_t)p->params_total);
    ctl_json_kuint(&js, "params_total_padded", (uint64_t)p->params_padded);
    ctl_json_kuint(&js, "params_per_block", (uint64_t)p->block);
    ctl_json_kuint(&js, "params_per_block_rank", (uint64_t)p->block_tp);
    ctl_json_kuint(&js, "params_per_block_shard", (uint64_t)p->block_shard);
    ctl_json_kdouble(&js, "bubble_fraction", p->bubble);
    ctl_json_key(&js, "stages");
    ctl_json_arr_begin(&js);
    for (uint32_t s = 0; s < p->l.pp; s++) {
        stage_t st;
        plan_stage(p, s, &st);
        ctl_json_obj_begin(&js);
        ctl_json_kuint(&js, "stage", s);
        ctl_json_kuint(&js, "first_rank", (uint64_t)s * per_stage);
        ctl_json_kuint(&js, "last_rank", (uint64_t)s * per_stage + per_stage - 1);
        ctl_json_kuint(&js, "first_block", st.first);
        ctl_json_kuint(&js, "last_block", st.first + st.count - 1);
        ctl_json_kuint(&js, "blocks", st.count);
        ctl_json_key(&js, "embeddings");
        ctl_json_bool(&js, st.embeddings);
        ctl_json_key(&js, "lm_head");
        ctl_json_bool(&js, st.head);
        ctl_json_kuint(&js, "params_per_rank", (uint64_t)st.params);
        ctl_json_kuint(&js, "params_owned_per_rank", (uint64_t)st.owned);
        ctl_json_key(&js, "memory");
        ctl_json_obj_begin(&js);
        ctl_json_kuint(&js, "state_bytes", (uint64_t)st.state_bytes);
        ctl_json_kuint(&js, "gathered_bytes", (uint64_t)st.gathered_bytes);
        ctl_json_kuint(&js, "activation_bytes_per_microbatch", (uint64_t)st.act_mb_bytes);
        ctl_json_kuint(&js, "in_flight_microbatches", st.in_flight);
        ctl_json_kuint(&js, "scratch_bytes", (uint64_t)st.scratch_bytes);
        ctl_json_kuint(&js, "activation_bytes", (uint64_t)st.act_bytes);
        ctl_json_kuint(&js, "total_bytes", (uint64_t)st.total_bytes);
        ctl_json_obj_end(&js);
        ctl_json_obj_end(&js);
    }
    ctl_json_arr_end(&js);
    ctl_json_kuint(&js, "memory_peak_bytes", (uint64_t)peak);
    ctl_json_key(&js, "warnings");
    ctl_json_arr_begin(&js);
    if (warning)
        ctl_json_str(&js, warning);
    ctl_json_arr_end(&js);
    ctl_json_obj_end(&js);
    ctl_json_finish(&js);
}

// ----------------------------------------------------------------------------
// command

int ctl_cmd_plan(ctl_t *ctl, int argc, char **argv)
{
    const char *file = NULL;
    char **sets = calloc((size_t)argc + 1, sizeof *sets);
    char warning[192];
    int nsets = 0, st = CTL_EXIT_USAGE;
    ch_jobspec_t spec;
    plan_t p;

    if (!sets) {
        ctl_errf("out of memory");
        return CTL_EXIT_FAILED;
    }
    for (int i = 0; i < argc; i++) {
        if (ctl_arg_set(argc, argv, &i, &sets[nsets])) {
            nsets++;
        } else if (argv[i][0] == '-' || file) {
            ctl_errf("plan: unexpected '%s'", argv[i]);
            file = NULL;
            break;
        } else {
            file = argv[i];
        }
    }
    if (!file) {
        ctl_errf("usage: chorusctl plan JOBFILE [--set section.key=value]... [--json]");
        goto out;
    }
    st = ctl_jobfile_load(file, sets, nsets, &spec);
    if (st != CTL_EXIT_OK)
        goto out;

    plan_model(&p, &spec);
    double peak = 0;
    uint32_t peak_stage = 0;
    for (uint32_t s = 0; s < p.l.pp; s++) {
        stage_t sp;
        plan_stage(&p, s, &sp);
        if (sp.total_bytes > peak) {
            peak = sp.total_bytes;
            peak_stage = s;
        }
    }
    if (p.params_padded >= EXACT_MAX || peak >= EXACT_MAX) {
        ctl_errf("%s: model: too large to plan (over 2^53 parameters or bytes per rank)", file);
        st = CTL_EXIT_CONFIG;
        goto out;
    }
    const char *warn = NULL;
    if (spec.parallel.microbatches < spec.parallel.pp) {
        snprintf(warning, sizeof warning,
                 "parallel.microbatches %u < pp %u: the pipeline is never full (bubble %.0f%%); "
                 "use at least pp micro-batches, ideally several times pp",
                 spec.parallel.microbatches, spec.parallel.pp, 100.0 * p.bubble);
        warn = warning;
    }
    if (ctl->json)
        print_json(&p, file, peak, warn);
    else
        print_text(&p, file, peak, peak_stage, warn);
    st = CTL_EXIT_OK;
out:
    free(sets);
    return st;
}
