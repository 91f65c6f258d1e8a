/* chorusctl plan JOBFILE [--set section.key=value]... [--json]: what a job will be, before
 * it is launched. With --auto, which layout to launch it with (see "auto" below). The file is
 * checked exactly as submit checks it (ctl_jobfile_load), then the plan is printed: world size and
 * layout, each pipeline stage's blocks and what else it holds, the padded vocab, parameter counts
 * (whole model; per rank after the TP slice and the ZeRO-3 shard), a memory estimate per rank,
 * model FLOPs and tokens per step, and the 1F1B pipeline bubble. Runs locally; talks to no
 * coordinator.
 *
 * The arithmetic is common/plan.h's (ch_plan_stage); this file only prints it. */
#include <math.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/jobspec.h"
#include "common/layout.h"
#include "common/msg.h"
#include "common/plan.h"
#include "common/planner.h"
#include "common/util.h"
#include "ctl.h"
#include "json.h"
#include "table.h"

/* One plan per stage (every stage carries the whole-model figures too). */
typedef struct plan {
    const ch_jobspec_t *spec;
    ch_layout_t l;
    ch_model_cfg_t cfg;       /* ch_plan_model_of: stage_split = auto resolved */
    ch_plan_t *st;            /* l.pp entries */
    ch_precision_t precision; /* the plan's: the job's, or --precision */
    int bf16;                 /* its figures are bf16's (ZeRO-3's packed gathers) */
} plan_t;

// ----------------------------------------------------------------------------
// output

static const char *reshard_name(ch_reshard_t r)
{
    return r == CH_RESHARD_PER_STEP ? "per-step" : "per-use";
}

/* 124439808 -> "124,439,808". */
/* The attention the job's ranks run (ch_model_cfg_t.att_row). */
static const char *attention_name(const ch_jobspec_t *j)
{
    return ch_plan_model_of(j).att_row == 1
               ? "fused (B*NH*T log-sum-exps kept, no T*T probabilities)"
               : "materialised (B*NH*T*T probabilities kept)";
}

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

static const char *stage_holds(const ch_plan_t *st)
{
    if (st->embeddings && st->head)
        return "embeddings, ln_f + LM head";
    if (st->embeddings)
        return "embeddings";
    return st->head ? "ln_f + LM head (wte copy)" : "-";
}

/* checkpoint.memory_every's host memory per rank (common/plan.h); 0 when off. */
static double memckpt_bytes(const ch_jobspec_t *j)
{
    if (j->checkpoint.memory_every <= 0 || j->kind != CH_JOB_TRAIN)
        return 0;
    ch_model_cfg_t m = ch_plan_model_of(j);
    return ch_plan_memckpt_bytes(&m, ch_jobspec_layout(j));
}

/* Where in-memory checkpoints live and what they take (memckpt.c's buddy rule). */
static void print_memckpt(const ch_jobspec_t *j)
{
    char a[48];
    if (j->checkpoint.memory_every <= 0 || j->kind != CH_JOB_TRAIN)
        return;
    fmt_bytes(a, sizeof a, memckpt_bytes(j));
    printf("in-memory checkpoints every %" PRId64 " steps: %s of host memory per rank (workerd "
           "--memory-dir), %d steps of its own state and of one peer's (params + Adam m, v)\n"
           "  copies: the i-th rank of each node copies to the i-th rank (mod its ranks) of the "
           "next node (nodes in the order of their lowest rank; each rank logs its peer); one "
           "node: no copy elsewhere\n",
           j->checkpoint.memory_every, a, CH_PLAN_MEMCKPT_KEEP);
}

static void print_text(const plan_t *p, const char *file, double peak, uint32_t peak_stage,
                       const char *warning)
{
    const ch_jobspec_t *j = p->spec;
    const uint32_t per_stage = p->l.tp * p->l.dp;
    const ch_plan_t *w = &p->st[0]; /* the whole-model figures */
    char a[48], b[48], c[48], d[48];
    ctl_table_t t;

    printf("plan for job '%s' (%s), kind %s\n", j->name, file, ch_job_kind_name(j->kind));
    printf("model       %u layers, %u heads, embd %u, vocab %u (padded to %.0f for tp %u), "
           "seq_len %u\n",
           j->model.layers, j->model.heads, j->model.embd, j->model.vocab, w->padded_vocab, p->l.tp,
           j->model.seq_len);
    printf("layout      world size %u = tp %u x pp %u x dp %u; reshard %s\n", w->world, p->l.tp,
           p->l.pp, p->l.dp, reshard_name(j->parallel.reshard));
    if (j->train.device == CH_DEVICE_CUDA)
        printf("device      cuda: the memory below is GPU memory per rank, all allocated before "
               "the first step; attention %s\n",
               attention_name(j));
    printf("precision   %s%s\n", ch_precision_name(p->precision),
           p->bf16
               ? ": fp32 master, gradients and Adam state; activations bf16 values in 4-byte slots"
               : "");
    fmt_count(a, sizeof a, w->sequences);
    fmt_count(b, sizeof b, w->tokens);
    printf("batch       %s sequences/step = dp %u x microbatches %u x micro_batch_size %u; %s "
           "tokens/step\n",
           a, p->l.dp, j->parallel.microbatches, j->parallel.micro_batch_size, b);
    fmt_count(a, sizeof a, w->params_total);
    fmt_count(b, sizeof b, w->params_padded);
    printf("parameters  %s (LM head tied to wte; %s with padded vocab rows)\n", a, b);
    ctl_fmt_si(a, sizeof a, w->flops);
    ctl_fmt_si(b, sizeof b, w->flops / w->tokens);
    printf("compute     %s model FLOPs per step, %s per token\n", a, b);
    int zb = j->parallel.schedule == CH_SCHEDULE_ZBH1;
    uint32_t k = zb ? 3 : p->cfg.virtual_stages > 1 ? p->cfg.virtual_stages : 1;
    printf("pipeline    %s over %u stage%s, stage_split %s%s: bubble %.1f%% = %s = %u/%u\n",
           ch_schedule_name(j->parallel.schedule), p->l.pp, p->l.pp == 1 ? "" : "s",
           p->cfg.balanced_stages ? "balanced" : "even",
           j->parallel.stage_split == CH_SPLIT_AUTO ? " (auto)" : "", 100.0 * w->bubble,
           zb      ? "(pp-1)/(3 x microbatches+pp-1) (T_F = T_B = T_W)"
           : k > 1 ? "(pp-1)/(virtual_stages x microbatches+pp-1)"
                   : "(pp-1)/(microbatches+pp-1)",
           p->l.pp - 1, k * j->parallel.microbatches + p->l.pp - 1);
    printf("\n");

    ctl_table_init(&t, 10);
    const char *head[] = {"STAGE",      "RANKS", "BLOCKS",   "HOLDS",       "PARAMS/RANK",
                          "OWNED/RANK", "STATE", "GATHERED", "ACTIVATIONS", "TOTAL/RANK"};
    for (size_t i = 0; i < 10; i++)
        ctl_table_cell(&t, "%s", head[i]);
    for (uint32_t s = 0; s < p->l.pp; s++) {
        const ch_plan_t st = p->st[s];
        ctl_table_cell(&t, "%u", s);
        fmt_range(a, sizeof a, s * per_stage, per_stage);
        ctl_table_cell(&t, "%s", a);
        fmt_range(a, sizeof a, st.first_block, st.blocks);
        ctl_table_cell(&t, "%s", a);
        ctl_table_cell(&t, "%s", stage_holds(&st));
        fmt_count(a, sizeof a, st.params);
        fmt_count(b, sizeof b, st.owned);
        ctl_table_cell(&t, "%s", a);
        ctl_table_cell(&t, "%s", b);
        fmt_bytes(a, sizeof a, st.state_bytes);
        fmt_bytes(b, sizeof b, st.gathered_bytes + st.working_bytes);
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
               ? "the stage's blocks + one block's gradient (per-step), + wte, wpe, ln_f "
                 "and their gradients"
               : "2 blocks (in use + prefetch) + one block's gradient (per-use), + wte, wpe, "
                 "ln_f and their gradients");
    print_memckpt(j);
    if (p->bf16)
        printf("bf16: %s\n", j->parallel.dp > 1
                                 ? "ZeRO-3's gathers also keep 2-byte packed copies, the per-block "
                                   "casts (in GATHERED)"
                                 : "a packed working copy of the parameters, cast once a step, "
                                   "2 bytes a parameter (in GATHERED)");
    if (warning)
        printf("warning: %s\n", warning);
}

static void print_json(const plan_t *p, const char *file, double peak, const char *warning)
{
    const ch_jobspec_t *j = p->spec;
    const uint32_t per_stage = p->l.tp * p->l.dp;
    const ch_plan_t *w = &p->st[0]; /* the whole-model figures */
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
    ctl_json_kuint(&js, "padded_vocab", (uint64_t)w->padded_vocab);
    ctl_json_kuint(&js, "seq_len", j->model.seq_len);
    ctl_json_obj_end(&js);
    ctl_json_kuint(&js, "world_size", w->world);
    ctl_json_key(&js, "layout");
    ctl_json_obj_begin(&js);
    ctl_json_kuint(&js, "tp", p->l.tp);
    ctl_json_kuint(&js, "pp", p->l.pp);
    ctl_json_kuint(&js, "dp", p->l.dp);
    ctl_json_obj_end(&js);
    ctl_json_kstr(&js, "reshard", reshard_name(j->parallel.reshard));
    ctl_json_kstr(&js, "device", ch_device_name(j->train.device));
    ctl_json_kstr(&js, "memory_on", j->train.device == CH_DEVICE_CUDA ? "gpu" : "host");
    ctl_json_kstr(&js, "attention", ch_plan_model_of(j).att_row == 1 ? "fused" : "materialised");
    ctl_json_kstr(&js, "precision", ch_precision_name(p->precision));
    ctl_json_kuint(&js, "microbatches", j->parallel.microbatches);
    ctl_json_kuint(&js, "micro_batch_size", j->parallel.micro_batch_size);
    ctl_json_kuint(&js, "sequences_per_step", (uint64_t)w->sequences);
    ctl_json_kuint(&js, "tokens_per_step", (uint64_t)w->tokens);
    ctl_json_kdouble(&js, "flops_per_step", w->flops);
    ctl_json_kuint(&js, "params_total", (uint64_t)w->params_total);
    ctl_json_kuint(&js, "params_total_padded", (uint64_t)w->params_padded);
    ctl_json_kuint(&js, "params_per_block", (uint64_t)w->block);
    ctl_json_kuint(&js, "params_per_block_rank", (uint64_t)w->block_tp);
    ctl_json_kuint(&js, "params_per_block_shard", (uint64_t)w->block_shard);
    ctl_json_kdouble(&js, "bubble_fraction", w->bubble);
    ctl_json_kstr(&js, "schedule", ch_schedule_name(j->parallel.schedule));
    ctl_json_kstr(&js, "stage_split", p->cfg.balanced_stages ? "balanced" : "even");
    ctl_json_key(&js, "stages");
    ctl_json_arr_begin(&js);
    for (uint32_t s = 0; s < p->l.pp; s++) {
        const ch_plan_t st = p->st[s];
        ctl_json_obj_begin(&js);
        ctl_json_kuint(&js, "stage", s);
        ctl_json_kuint(&js, "first_rank", (uint64_t)s * per_stage);
        ctl_json_kuint(&js, "last_rank", (uint64_t)s * per_stage + per_stage - 1);
        ctl_json_kuint(&js, "first_block", st.first_block);
        ctl_json_kuint(&js, "last_block", st.first_block + st.blocks - 1);
        ctl_json_kuint(&js, "blocks", st.blocks);
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
        ctl_json_kuint(&js, "working_bytes", (uint64_t)st.working_bytes);
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
    ctl_json_kuint(&js, "memory_checkpoint_bytes_per_rank", (uint64_t)memckpt_bytes(j));
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

static int plan_auto(ctl_t *ctl, int argc, char **argv);

/* --precision: fp32, tf32 or bf16 into *out; -EINVAL (said) otherwise. */
static int parse_precision(const char *v, ch_precision_t *out)
{
    for (int k = CH_PRECISION_FP32; k <= CH_PRECISION_BF16; k++)
        if (strcmp(v, ch_precision_name((ch_precision_t)k)) == 0) {
            *out = (ch_precision_t)k;
            return 0;
        }
    ctl_errf("plan: --precision: expected fp32, tf32 or bf16, got '%s'", v);
    return -EINVAL;
}

enum {
    OPT_SET = 256,
    OPT_AUTO,
    OPT_NODES,
    OPT_SLOTS_PER_NODE,
    OPT_MEM_PER_SLOT,
    OPT_FLOPS_PER_SLOT,
    OPT_MFU,
    OPT_TP_BUSBW,
    OPT_DP_BUSBW,
    OPT_MEM_RESERVE,
    OPT_RECOMPUTE,
    OPT_TOP,
    OPT_VERBOSE,
    OPT_PRECISION,
};

const ctl_opt_t ctl_opts_plan[] = {
    {"set", OPT_SET, "section.key=value", "override a job-file key (repeatable)"},
    {"precision", OPT_PRECISION, "fp32|tf32|bf16", "plan at this precision (the job's)"},
    {NULL, 0, NULL, NULL},
};

const ctl_opt_t ctl_opts_plan_auto[] = {
    {"auto", OPT_AUTO, NULL, "propose layouts"},
    {"set", OPT_SET, "section.key=value", "override a job-file key (repeatable)"},
    {"nodes", OPT_NODES, "N", "plan for N nodes (with --slots-per-node)"},
    {"slots-per-node", OPT_SLOTS_PER_NODE, "G", "of G slots each"},
    {"mem-per-slot", OPT_MEM_PER_SLOT, "BYTES", "memory per slot (80GiB)"},
    {"flops-per-slot", OPT_FLOPS_PER_SLOT, "F", "peak FLOP/s per slot (312T)"},
    {"mfu", OPT_MFU, "X", "model FLOPs utilisation in (0, 1] (0.5)"},
    {"tp-busbw", OPT_TP_BUSBW, "B", "tensor-parallel bus bandwidth per second (300GB)"},
    {"dp-busbw", OPT_DP_BUSBW, "B", "data-parallel bus bandwidth per second (25GB)"},
    {"mem-reserve", OPT_MEM_RESERVE, "F", "fraction of memory kept free (0.05)"},
    {"recompute", OPT_RECOMPUTE, "none|selective|full", "activation recompute (none)"},
    {"top", OPT_TOP, "K", "show K layouts (5)"},
    {"verbose", OPT_VERBOSE, NULL, "say why layouts were refused"},
    {NULL, 0, NULL, NULL},
};

int ctl_cmd_plan(ctl_t *ctl, int argc, char **argv)
{
    /* --auto (spelled out) switches to plan --auto's options */
    for (int i = 0; i < argc && strcmp(argv[i], "--") != 0; i++)
        if (strcmp(argv[i], "--auto") == 0)
            return plan_auto(ctl, argc, argv);
    const char *file = NULL, *val;
    char **sets = calloc((size_t)argc + 1, sizeof *sets);
    char warning[192];
    int nsets = 0, st = CTL_EXIT_USAGE, c;
    ch_jobspec_t spec;
    plan_t p = {.st = NULL};
    ctl_args_t a;

    if (!sets) {
        ctl_errf("out of memory");
        return CTL_EXIT_FAILED;
    }
    if (ctl_args_begin(&a, "plan", ctl_opts_plan, argc, argv) < 0)
        goto out;
    p.precision = (ch_precision_t)-1;
    while ((c = ctl_args_next(&a, &val)) == OPT_SET || c == OPT_PRECISION) {
        if (c == OPT_SET)
            sets[nsets++] = (char *)val;
        else if (parse_precision(val, &p.precision) < 0)
            goto out;
    }
    if (c < 0)
        goto out;
    if (a.npos != 1) {
        ctl_usage("plan");
        goto out;
    }
    file = a.pos[0];
    st = ctl_jobfile_load(file, sets, nsets, &spec);
    if (st != CTL_EXIT_OK)
        goto out;

    p.spec = &spec;
    p.l = ch_jobspec_layout(&spec);
    p.st = calloc(p.l.pp, sizeof *p.st);
    if (!p.st) {
        ctl_errf("out of memory");
        st = CTL_EXIT_FAILED;
        goto out;
    }
    ch_model_cfg_t m = ch_plan_model_of(&spec); /* emulated or not */
    if ((int)p.precision < 0)
        p.precision = spec.train.precision;
    else
        m.bf16 = p.precision == CH_PRECISION_BF16;
    p.bf16 = m.bf16;
    p.cfg = m;
    double peak = 0;
    uint32_t peak_stage = 0;
    int rc = 0;
    for (uint32_t s = 0; s < p.l.pp && rc == 0; s++) {
        rc = ch_plan_stage_rc(&m, p.l, spec.parallel.micro_batch_size, spec.parallel.microbatches,
                              spec.parallel.reshard, spec.parallel.recompute, s, &p.st[s]);
        if (p.st[s].total_bytes > peak) {
            peak = p.st[s].total_bytes;
            peak_stage = s;
        }
    }
    if (rc < 0) {
        ctl_errf("%s: model: too large to plan (over 2^53 parameters or bytes per rank)", file);
        st = CTL_EXIT_CONFIG;
        goto out;
    }
    const char *warn = NULL;
    if (spec.parallel.microbatches < spec.parallel.pp) {
        snprintf(warning, sizeof warning,
                 "parallel.microbatches %u < pp %u: the pipeline is never full (bubble %.0f%%); "
                 "use at least pp micro-batches, ideally several times pp",
                 spec.parallel.microbatches, spec.parallel.pp, 100.0 * p.st[0].bubble);
        warn = warning;
    }
    if (ctl->json)
        print_json(&p, file, peak, warn);
    else
        print_text(&p, file, peak, peak_stage, warn);
    st = CTL_EXIT_OK;
out:
    free(p.st);
    free(sets);
    return st;
}

// ----------------------------------------------------------------------------
// auto: chorusctl plan --auto JOBFILE [--set ...] [cluster options] [--top K] [--verbose]
//
// The job file gives the model and the global batch (dp × microbatches × micro_batch_size
// of its [parallel] section); its layout is ignored. The cluster is the coordinator's
// (alive nodes and their slots, `nodes` RPC) unless --nodes gives one; memory, FLOP/s, MFU
// and bandwidths come from the flags or the planner's GPU defaults (common/planner.h), as
// the coordinator does not know them. The arithmetic is common/planner.h's.

#define JOBFILE_MAX (1u << 20)
#define TOP_DEFAULT 5

typedef struct auto_args {
    const char *file;
    char **sets;
    int nsets;
    uint32_t nodes, slots_per_node, top;
    int verbose;
    ch_planner_cluster_t cluster;
    ch_planner_opts_t opts;
} auto_args_t;

/* "80GiB", "25GB", "312T", "1.5e12": a number with an optional SI (k M G T P, powers of
 * 1000) or binary (Ki Mi Gi Ti Pi) multiplier, then an optional "B" and "/s". */
static int parse_quantity(const char *s, double *out)
{
    static const char si[] = "kMGTP";
    char *end;
    double v = strtod(s, &end);
    if (end == s || !isfinite(v) || v <= 0)
        return -EINVAL;
    const char *m = *end ? strchr(si, *end == 'K' ? 'k' : *end) : NULL;
    if (m) {
        int bin = end[1] == 'i';
        v *= pow(bin ? 1024.0 : 1000.0, (double)(m - si + 1));
        end += 1 + bin;
    }
    if (*end == 'B')
        end++;
    if (strcmp(end, "/s") == 0)
        end += 2;
    if (*end)
        return -EINVAL;
    *out = v;
    return 0;
}

/* One option of plan --auto into a; -EINVAL for a bad value (said). */
static int auto_opt(auto_args_t *a, int key, const char *v)
{
    static const struct {
        int key;
        size_t off;
    } quantities[] = {
        {OPT_MEM_PER_SLOT, offsetof(ch_planner_cluster_t, mem_per_slot)},
        {OPT_FLOPS_PER_SLOT, offsetof(ch_planner_cluster_t, flops_per_slot)},
        {OPT_TP_BUSBW, offsetof(ch_planner_cluster_t, tp_busbw)},
        {OPT_DP_BUSBW, offsetof(ch_planner_cluster_t, dp_busbw)},
    };
    const ctl_opt_t *o = ctl_opts_plan_auto;
    char *end = NULL;
    long n;

    while (o->name && o->key != key)
        o++;
    for (size_t q = 0; q < sizeof quantities / sizeof quantities[0]; q++) {
        if (quantities[q].key != key)
            continue;
        if (parse_quantity(v, (double *)((char *)&a->cluster + quantities[q].off)) == 0)
            return 0;
        ctl_errf("plan: --%s: '%s' is not a positive quantity (e.g. 80GiB, 25GB, 312T)", o->name,
                 v);
        return -EINVAL;
    }
    switch (key) {
    case OPT_AUTO:
        return 0;
    case OPT_VERBOSE:
        a->verbose = 1;
        return 0;
    case OPT_SET:
        a->sets[a->nsets++] = (char *)v;
        return 0;
    case OPT_NODES:
    case OPT_SLOTS_PER_NODE:
    case OPT_TOP:
        if (ctl_parse_long(v, 1, UINT32_MAX, &n) < 0)
            break;
        if (key == OPT_NODES)
            a->nodes = (uint32_t)n;
        else if (key == OPT_SLOTS_PER_NODE)
            a->slots_per_node = (uint32_t)n;
        else
            a->top = (uint32_t)n;
        return 0;
    case OPT_MFU:
        a->cluster.mfu = strtod(v, &end);
        if (end == v || *end || !(a->cluster.mfu > 0 && a->cluster.mfu <= 1))
            break;
        return 0;
    case OPT_MEM_RESERVE:
        a->opts.mem_reserve = strtod(v, &end);
        if (end == v || *end || !(a->opts.mem_reserve >= 0 && a->opts.mem_reserve < 1))
            break;
        return 0;
    case OPT_RECOMPUTE:
        if (strcmp(v, "none") == 0)
            a->opts.recompute = CH_RECOMPUTE_NONE;
        else if (strcmp(v, "full") == 0)
            a->opts.recompute = CH_RECOMPUTE_FULL;
        else if (strcmp(v, "selective") == 0)
            a->opts.recompute = CH_RECOMPUTE_SELECTIVE;
        else
            break;
        return 0;
    }
    ctl_errf("plan: --%s: bad value '%s'", o->name ? o->name : "?", v);
    return -EINVAL;
}

static int auto_parse(int argc, char **argv, auto_args_t *a)
{
    ctl_args_t args;
    const char *v;
    int c;

    if (ctl_args_begin(&args, "plan", ctl_opts_plan_auto, argc, argv) < 0)
        return -EINVAL;
    while ((c = ctl_args_next(&args, &v)) > 0)
        if (auto_opt(a, c, v) < 0)
            return -EINVAL;
    if (c < 0)
        return -EINVAL;
    if (args.npos > 1)
        ctl_errf("plan: unexpected '%s'", args.pos[1]);
    a->file = args.npos == 1 ? args.pos[0] : NULL;
    if (args.npos != 1) {
        ctl_usage("plan");
        return -EINVAL;
    }
    if ((a->nodes == 0) != (a->slots_per_node == 0)) {
        ctl_errf("plan: --nodes and --slots-per-node go together (without both, the "
                 "coordinator's nodes are planned for)");
        return -EINVAL;
    }
    return 0;
}

/* The job file as submit reads it, except that its layout is the planner's to choose: the
 * other sections are validated against a one-rank layout with the memory check (which
 * judges one layout) left to the planner; train.data must exist. */
static int auto_load(const auto_args_t *a, ch_jobspec_t *spec)
{
    char err[512] = "", *text = NULL;
    size_t len = 0;
    ch_jobspec_t chk;

    int rc = ch_file_read(a->file, JOBFILE_MAX, &text, &len);
    if (rc < 0) {
        ctl_errf("%s: %s", a->file, ch_strerror(rc));
        return CTL_EXIT_CONFIG;
    }
    ch_jobspec_defaults(spec);
    rc = ch_jobspec_check_text(text, len, err, sizeof err);
    if (rc == 0)
        rc = ch_jobspec_parse(text, spec, err, sizeof err);
    free(text);
    for (int i = 0; rc == 0 && i < a->nsets; i++)
        rc = ch_jobspec_set(spec, a->sets[i], err, sizeof err);
    if (rc == 0 && spec->kind != CH_JOB_TRAIN)
        rc = ch_errf(err, sizeof err, CH_E_CONFIG,
                     "job.kind: --auto plans train jobs (this one is %s)",
                     ch_job_kind_name(spec->kind));
    if (rc == 0) {
        chk = *spec;
        chk.kind = CH_JOB_DIAG; /* no memory check: that is the planner's */
        chk.parallel.tp = chk.parallel.pp = chk.parallel.dp = 1;
        chk.parallel.microbatches = chk.parallel.micro_batch_size = 1;
        rc = ch_jobspec_validate(&chk, 1, err, sizeof err);
    }
    if (rc < 0) {
        ctl_errf("%s: %s", a->file, err[0] ? err : ch_strerror(rc));
        return CTL_EXIT_CONFIG;
    }
    return CTL_EXIT_OK;
}

/* The coordinator's alive nodes: their slots (malloc'd into *slots) and racks. */
static int auto_cluster_rpc(const ctl_t *ctl, uint32_t **slots, uint32_t *nodes, uint32_t *racks)
{
    Chorus__Envelope req = CHORUS__ENVELOPE__INIT, *resp = NULL;
    Chorus__ListNodes ln = CHORUS__LIST_NODES__INIT;

    req.body_case = CHORUS__ENVELOPE__BODY_LIST_NODES;
    req.list_nodes = &ln;
    int st = ctl_rpc(ctl, &req, CHORUS__ENVELOPE__BODY_NODE_LIST, NULL, &resp);
    if (st != CTL_EXIT_OK) {
        ctl_errf("plan: or give the cluster with --nodes N --slots-per-node G");
        return st;
    }
    const Chorus__NodeList *nl = resp->node_list;
    *slots = calloc(nl->n_nodes + 1, sizeof **slots);
    *nodes = *racks = 0;
    if (!*slots) {
        ch_msg_free(resp);
        ctl_errf("out of memory");
        return CTL_EXIT_FAILED;
    }
    for (size_t i = 0; i < nl->n_nodes; i++) {
        const Chorus__NodeInfo *n = nl->nodes[i];
        if (!n->state || strcmp(n->state, "alive") != 0 || n->slots == 0)
            continue;
        (*slots)[(*nodes)++] = n->slots;
        /* Racks are few: count the distinct labels among the alive nodes seen so far. */
        int seen = 0;
        for (size_t k = 0; k < i && !seen; k++)
            seen =
                nl->nodes[k]->state && strcmp(nl->nodes[k]->state, "alive") == 0 &&
                nl->nodes[k]->slots &&
                strcmp(nl->nodes[k]->rack ? nl->nodes[k]->rack : "", n->rack ? n->rack : "") == 0;
        *racks += !seen;
    }
    ch_msg_free(resp);
    if (*nodes == 0) {
        ctl_errf("plan: the coordinator (%s) has no alive node with slots; give the cluster "
                 "with --nodes N --slots-per-node G",
                 ctl_target(ctl));
        return CTL_EXIT_FAILED;
    }
    return CTL_EXIT_OK;
}

static void fmt_seconds(char *buf, size_t n, double s)
{
    if (s >= 1)
        snprintf(buf, n, "%.2f s", s);
    else
        snprintf(buf, n, "%.1f ms", s * 1e3);
}

/* The --set words that turn the job file into layout l. */
static void fmt_sets(char *buf, size_t n, const ch_planner_layout_t *l)
{
    snprintf(buf, n,
             "--set parallel.tp=%u --set parallel.pp=%u --set parallel.dp=%u --set "
             "parallel.microbatches=%u --set parallel.micro_batch_size=%u --set "
             "parallel.reshard=%s",
             l->split.tp, l->split.pp, l->split.dp, l->split.microbatches,
             l->split.micro_batch_size, reshard_name(l->reshard));
}

typedef struct auto_view {
    const auto_args_t *a;
    const ch_jobspec_t *spec;
    const ch_planner_result_t *r;
    const char *source; /* "coordinator ..." or "flags" */
    uint32_t nodes, racks;
    double params;
} auto_view_t;

static void auto_print_text(const auto_view_t *v)
{
    const ch_jobspec_t *j = v->spec;
    const ch_planner_cluster_t *c = &v->a->cluster;
    const ch_planner_result_t *r = v->r;
    char a[48], b[48], d[48], e[48], line[512];
    size_t shown = r->n_layouts < v->a->top ? r->n_layouts : v->a->top;

    fmt_count(a, sizeof a, v->params);
    printf("auto plan for job '%s' (%s): %s parameters; %u layers, %u heads, embd %u, vocab "
           "%u, seq_len %u\n",
           j->name, v->a->file, a, j->model.layers, j->model.heads, j->model.embd, j->model.vocab,
           j->model.seq_len);
    fmt_bytes(a, sizeof a, c->mem_per_slot);
    fmt_bytes(b, sizeof b, r->usable_bytes);
    ctl_fmt_si(d, sizeof d, c->flops_per_slot);
    printf("cluster     %u nodes, %llu slots (%s); per slot %s (%s usable), %s FLOP/s peak at "
           "MFU %.2f\n",
           v->nodes, (unsigned long long)r->slots, v->source, a, b, d, c->mfu);
    ctl_fmt_si(a, sizeof a, c->tp_busbw);
    ctl_fmt_si(b, sizeof b, c->dp_busbw);
    printf("network     busbw %sB/s inside a node (TP), %sB/s per slot across nodes (DP, PP)\n", a,
           b);
    fmt_count(a, sizeof a, (double)v->a->opts.global_batch);
    printf("batch       %s sequences/step, kept (the job file splits it dp %u x microbatches %u "
           "x micro_batch_size %u; the planner re-splits it)\n",
           a, j->parallel.dp, j->parallel.microbatches, j->parallel.micro_batch_size);
    printf("recompute   %s%s\n", ch_recompute_name(v->a->opts.recompute),
           v->a->opts.recompute == CH_RECOMPUTE_NONE
               ? " (activations kept for backward)"
               : " (parallel.recompute: the engine recomputes them, same bits)");
    printf("\n");
    if (shown > 0) {
        ctl_table_t t;
        const char *head[] = {"#",     "TP",      "PP",       "DP",   "WORLD",    "MICROBATCHES",
                              "MBS",   "RESHARD", "MEM/RANK", "STEP", "TOKENS/S", "MFU",
                              "BUBBLE"};
        ctl_table_init(&t, 13);
        for (size_t i = 0; i < 13; i++)
            ctl_table_cell(&t, "%s", head[i]);
        for (size_t i = 0; i < shown; i++) {
            const ch_planner_layout_t *l = &r->layouts[i];
            ctl_table_cell(&t, "%zu", i + 1);
            ctl_table_cell(&t, "%u", l->split.tp);
            ctl_table_cell(&t, "%u", l->split.pp);
            ctl_table_cell(&t, "%u", l->split.dp);
            ctl_table_cell(&t, "%u", l->world);
            ctl_table_cell(&t, "%u", l->split.microbatches);
            ctl_table_cell(&t, "%u", l->split.micro_batch_size);
            ctl_table_cell(&t, "%s", reshard_name(l->reshard));
            fmt_bytes(a, sizeof a, l->mem_bytes);
            ctl_table_cell(&t, "%s", a);
            fmt_seconds(a, sizeof a, l->step_s);
            ctl_table_cell(&t, "%s", a);
            ctl_fmt_si(a, sizeof a, l->tokens_per_s);
            ctl_table_cell(&t, "%s", a);
            ctl_table_cell(&t, "%.1f%%", 100 * l->mfu);
            ctl_table_cell(&t, "%.1f%%", 100 * l->bubble);
        }
        ctl_table_print(&t, stdout);
        ctl_table_fini(&t);
        printf("\n");
    }
    if (v->a->verbose) {
        for (size_t i = 0; i < shown; i++) {
            const ch_planner_layout_t *l = &r->layouts[i];
            fmt_bytes(a, sizeof a, l->state_bytes);
            fmt_bytes(b, sizeof b, l->gathered_bytes);
            fmt_bytes(d, sizeof d, l->act_bytes);
            printf("#%zu memory on stage %u: state %s, gathered %s, activations %s\n", i + 1,
                   l->peak_stage, a, b, d);
            fmt_seconds(a, sizeof a, l->compute_s);
            fmt_seconds(b, sizeof b, l->tp_s);
            fmt_seconds(d, sizeof d, l->p2p_s);
            fmt_seconds(e, sizeof e, l->dp_s);
            printf("#%zu per micro-batch on the slowest stage: compute %s, TP %s, PP %s, DP %s "
                   "(overlapped)\n",
                   i + 1, a, b, d, e);
        }
        for (size_t i = 0; i < r->n_refused; i++) {
            const ch_planner_refusal_t *f = &r->refused[i];
            if (f->l.split.pp)
                printf("refused tp %u pp %u dp %u: %s\n", f->l.split.tp, f->l.split.pp,
                       f->l.split.dp, f->reason);
            else
                printf("refused tp %u: %s\n", f->l.split.tp, f->reason);
        }
        if (shown || r->n_refused)
            printf("\n");
    }
    printf("%zu layouts fit, %zu refused%s\n", r->n_layouts, r->n_refused,
           v->a->verbose || !r->n_refused ? "" : " (--verbose says why)");
    if (r->n_layouts) {
        fmt_sets(line, sizeof line, &r->layouts[0]);
        printf("submit the best: chorusctl submit %s %s\n", v->a->file, line);
    }
}

static void auto_json_layout(ctl_json_t *js, const ch_planner_layout_t *l)
{
    ctl_json_kuint(js, "tp", l->split.tp);
    ctl_json_kuint(js, "pp", l->split.pp);
    ctl_json_kuint(js, "dp", l->split.dp);
    ctl_json_kuint(js, "world_size", l->world);
    ctl_json_kuint(js, "microbatches", l->split.microbatches);
    ctl_json_kuint(js, "micro_batch_size", l->split.micro_batch_size);
    ctl_json_kstr(js, "reshard", reshard_name(l->reshard));
    ctl_json_kuint(js, "peak_stage", l->peak_stage);
    ctl_json_kuint(js, "memory_bytes", (uint64_t)l->mem_bytes);
    ctl_json_kuint(js, "state_bytes", (uint64_t)l->state_bytes);
    ctl_json_kuint(js, "gathered_bytes", (uint64_t)l->gathered_bytes);
    ctl_json_kuint(js, "activation_bytes", (uint64_t)l->act_bytes);
    ctl_json_kdouble(js, "step_s", l->step_s);
    ctl_json_kdouble(js, "compute_s", l->compute_s);
    ctl_json_kdouble(js, "tp_comm_s", l->tp_s);
    ctl_json_kdouble(js, "pp_comm_s", l->p2p_s);
    ctl_json_kdouble(js, "dp_comm_s", l->dp_s);
    ctl_json_kdouble(js, "bubble_fraction", l->bubble);
    ctl_json_kdouble(js, "tokens_per_s", l->tokens_per_s);
    ctl_json_kdouble(js, "mfu", l->mfu);
}

static void auto_print_json(const auto_view_t *v)
{
    const ch_planner_cluster_t *c = &v->a->cluster;
    const ch_planner_result_t *r = v->r;
    const ch_jobspec_t *j = v->spec;
    size_t shown = r->n_layouts < v->a->top ? r->n_layouts : v->a->top;
    ctl_json_t js;

    ctl_json_init(&js, stdout);
    ctl_json_obj_begin(&js);
    ctl_json_kstr(&js, "file", v->a->file);
    ctl_json_kstr(&js, "name", j->name);
    ctl_json_kuint(&js, "params_total", (uint64_t)v->params);
    ctl_json_key(&js, "cluster");
    ctl_json_obj_begin(&js);
    ctl_json_kstr(&js, "source", v->source);
    ctl_json_kuint(&js, "nodes", v->nodes);
    ctl_json_kuint(&js, "racks", v->racks);
    ctl_json_kuint(&js, "slots", r->slots);
    ctl_json_kdouble(&js, "mem_per_slot", c->mem_per_slot);
    ctl_json_kdouble(&js, "usable_per_slot", r->usable_bytes);
    ctl_json_kdouble(&js, "flops_per_slot", c->flops_per_slot);
    ctl_json_kdouble(&js, "mfu", c->mfu);
    ctl_json_kdouble(&js, "tp_busbw", c->tp_busbw);
    ctl_json_kdouble(&js, "dp_busbw", c->dp_busbw);
    ctl_json_obj_end(&js);
    ctl_json_kuint(&js, "global_batch", v->a->opts.global_batch);
    ctl_json_kstr(&js, "recompute", ch_recompute_name(v->a->opts.recompute));
    ctl_json_kuint(&js, "fitting", r->n_layouts);
    ctl_json_key(&js, "layouts");
    ctl_json_arr_begin(&js);
    for (size_t i = 0; i < shown; i++) {
        ctl_json_obj_begin(&js);
        ctl_json_kuint(&js, "rank", i + 1);
        auto_json_layout(&js, &r->layouts[i]);
        ctl_json_obj_end(&js);
    }
    ctl_json_arr_end(&js);
    ctl_json_key(&js, "refused");
    ctl_json_arr_begin(&js);
    for (size_t i = 0; i < r->n_refused; i++) {
        ctl_json_obj_begin(&js);
        auto_json_layout(&js, &r->refused[i].l);
        ctl_json_kstr(&js, "reason", r->refused[i].reason);
        ctl_json_obj_end(&js);
    }
    ctl_json_arr_end(&js);
    ctl_json_obj_end(&js);
    ctl_json_finish(&js);
}

static int plan_auto(ctl_t *ctl, int argc, char **argv)
{
    auto_args_t a = {.top = TOP_DEFAULT};
    ch_planner_result_t r = {0};
    uint32_t *slots = NULL;
    char err[256], source[160];
    ch_jobspec_t spec;
    auto_view_t v = {.a = &a, .spec = &spec, .r = &r, .source = source};
    int st = CTL_EXIT_USAGE;

    ch_planner_cluster_defaults(&a.cluster, 0, 0);
    a.opts.mem_reserve = CH_PLANNER_MEM_RESERVE;
    a.sets = calloc((size_t)argc + 1, sizeof *a.sets);
    if (!a.sets) {
        ctl_errf("out of memory");
        return CTL_EXIT_FAILED;
    }
    if (auto_parse(argc, argv, &a) < 0)
        goto out;
    st = auto_load(&a, &spec);
    if (st != CTL_EXIT_OK)
        goto out;
    double batch =
        (double)spec.parallel.dp * spec.parallel.microbatches * spec.parallel.micro_batch_size;
    if (batch > CH_PLANNER_BATCH_MAX) {
        ctl_errf("%s: parallel: the global batch dp x microbatches x micro_batch_size is over "
                 "2^53 sequences",
                 a.file);
        st = CTL_EXIT_CONFIG;
        goto out;
    }
    a.opts.global_batch = (uint64_t)batch;
    if (a.nodes) {
        a.cluster.nodes = v.nodes = a.nodes;
        a.cluster.slots_per_node = a.slots_per_node;
        snprintf(source, sizeof source, "%u x %u slots, from flags", a.nodes, a.slots_per_node);
    } else {
        st = auto_cluster_rpc(ctl, &slots, &v.nodes, &v.racks);
        if (st != CTL_EXIT_OK)
            goto out;
        a.cluster.nodes = v.nodes;
        a.cluster.node_slots = slots;
        snprintf(source, sizeof source, "alive nodes of the coordinator at %s, %u rack%s",
                 ctl_target(ctl), v.racks, v.racks == 1 ? "" : "s");
    }
    const ch_model_cfg_t m = ch_plan_model_of(&spec);
    ch_plan_t whole;
    ch_layout_t one = {1, 1, 1};
    ch_plan_stage(&m, one, 1, 1, CH_RESHARD_PER_USE, 0, &whole);
    v.params = whole.params_total;
    int rc = ch_planner_run(&m, &a.cluster, &a.opts, &r, err, sizeof err);
    if (rc < 0) {
        ctl_errf("%s: %s", a.file, err);
        st = rc == -ENOMEM ? CTL_EXIT_FAILED : CTL_EXIT_CONFIG;
        goto out;
    }
    if (ctl->json)
        auto_print_json(&v);
    else
        auto_print_text(&v);
    st = CTL_EXIT_OK;
    if (r.n_layouts == 0) {
        /* Refusals come least memory first: the first is the closest miss. */
        const ch_planner_refusal_t *f = r.n_refused ? &r.refused[0] : NULL;
        if (f)
            ctl_errf("%s: no layout fits this cluster; closest: tp %u pp %u dp %u: %s", a.file,
                     f->l.split.tp, f->l.split.pp, f->l.split.dp, f->reason);
        else
            ctl_errf("%s: no layout fits this cluster", a.file);
        st = CTL_EXIT_FAILED;
    }
out:
    ch_planner_result_free(&r);
    free(slots);
    free(a.sets);
    return st;
}
