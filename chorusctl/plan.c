/* chorusctl plan JOBFILE [--set section.key=value]... [--json]: what a job will be, before
 * it is launched. The file is checked exactly as submit checks it (ctl_jobfile_load), then
 * the plan is printed: world size and layout, each pipeline stage's blocks and what else it
 * holds, the padded vocab, parameter counts (whole model; per rank after the TP slice and
 * the ZeRO-3 shard), a memory estimate per rank, model FLOPs and tokens per step, and the
 * 1F1B pipeline bubble. Runs locally; talks to no coordinator.
 *
 * The arithmetic is common/plan.h's (ch_plan_stage); this file only prints it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/jobspec.h"
#include "common/layout.h"
#include "common/plan.h"
#include "ctl.h"
#include "json.h"
#include "table.h"

/* One plan per stage (every stage carries the whole-model figures too). */
typedef struct plan {
    const ch_jobspec_t *spec;
    ch_layout_t l;
    ch_plan_t *st; /* l.pp entries */
} plan_t;

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

static const char *stage_holds(const ch_plan_t *st)
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
    printf("pipeline    1F1B over %u stage%s: bubble %.1f%% = (pp-1)/(microbatches+pp-1) = "
           "%u/%u\n",
           p->l.pp, p->l.pp == 1 ? "" : "s", 100.0 * w->bubble, p->l.pp - 1,
           j->parallel.microbatches + p->l.pp - 1);
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
    plan_t p = {.st = NULL};

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

    p.spec = &spec;
    p.l = ch_jobspec_layout(&spec);
    p.st = calloc(p.l.pp, sizeof *p.st);
    if (!p.st) {
        ctl_errf("out of memory");
        st = CTL_EXIT_FAILED;
        goto out;
    }
    const ch_model_cfg_t m = ch_plan_model_of(&spec);
    double peak = 0;
    uint32_t peak_stage = 0;
    int rc = 0;
    for (uint32_t s = 0; s < p.l.pp && rc == 0; s++) {
        rc = ch_plan_stage(&m, p.l, spec.parallel.micro_batch_size, spec.parallel.microbatches,
                           spec.parallel.reshard, s, &p.st[s]);
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
