/* chorusctl jobs | status | cancel | kill-rank, and the rendering of a job (JobInfo) as
 * a JSON status object or as text, shared with submit --wait and watch. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/msg.h"
#include "ctl.h"
#include "json.h"
#include "table.h"

// ----------------------------------------------------------------------------
// formatting helpers

int ctl_job_state_final(const char *state)
{
    return state && (strcmp(state, "completed") == 0 || strcmp(state, "failed") == 0 ||
                     strcmp(state, "cancelled") == 0);
}

int ctl_job_exit_status(const char *state)
{
    return state && strcmp(state, "completed") == 0 ? CTL_EXIT_OK : CTL_EXIT_FAILED;
}

void ctl_fmt_si(char *buf, size_t n, double v)
{
    static const char suffix[] = " kMGTP";
    int i = 0;
    if (!isfinite(v) || v < 0) {
        snprintf(buf, n, "-");
        return;
    }
    while (v >= 1000.0 && i < 5) {
        v /= 1000.0;
        i++;
    }
    if (i == 0)
        snprintf(buf, n, "%.1f", v);
    else
        snprintf(buf, n, "%.*f%c", v < 10.0 ? 2 : v < 100.0 ? 1 : 0, v, suffix[i]);
}

void ctl_fmt_duration(char *buf, size_t n, double seconds)
{
    if (!isfinite(seconds) || seconds < 0) {
        snprintf(buf, n, "-");
        return;
    }
    uint64_t s = (uint64_t)(seconds + 0.5);
    if (s >= 3600)
        snprintf(buf, n, "%" PRIu64 ":%02" PRIu64 ":%02" PRIu64, s / 3600, s / 60 % 60, s % 60);
    else if (s >= 60)
        snprintf(buf, n, "%" PRIu64 ":%02" PRIu64, s / 60, s % 60);
    else
        snprintf(buf, n, "%" PRIu64 "s", s);
}

static void fmt_wall(char *buf, size_t n, uint64_t wall_ms)
{
    struct tm tm;
    time_t t = (time_t)(wall_ms / 1000);
    if (wall_ms == 0 || !localtime_r(&t, &tm) || strftime(buf, n, "%Y-%m-%d %H:%M:%S", &tm) == 0)
        snprintf(buf, n, "-");
}

/* The loss is meaningful once a step has been reported (diag jobs have none). */
static int has_loss(const Chorus__JobInfo *ji)
{
    return ji->step > 0 && isfinite(ji->loss) && strcmp(ji->kind, "diag") != 0;
}

// ----------------------------------------------------------------------------
// JSON

static void rank_json(ctl_json_t *j, const Chorus__RankInfo *r)
{
    ctl_json_obj_begin(j);
    ctl_json_kuint(j, "rank", r->rank);
    ctl_json_kstr(j, "node", r->node);
    ctl_json_kstr(j, "state", r->state);
    ctl_json_kuint(j, "step", r->step);
    for (size_t m = 0; m < r->n_metrics; m++)
        ctl_json_kdouble(j, r->metrics[m]->name, r->metrics[m]->value);
    ctl_json_kint(j, "exit_code", r->exit_code);
    ctl_json_kint(j, "signal", r->signal);
    if (r->place) { /* train jobs: where the rank sits in the layout */
        const Chorus__RankPlace *p = r->place;
        ctl_json_key(j, "coord");
        ctl_json_obj_begin(j);
        ctl_json_kuint(j, "tp", p->tp);
        ctl_json_kuint(j, "pp", p->pp);
        ctl_json_kuint(j, "dp", p->dp);
        ctl_json_obj_end(j);
        ctl_json_key(j, "blocks");
        ctl_json_obj_begin(j);
        ctl_json_kuint(j, "first", p->first_block);
        ctl_json_kuint(j, "count", p->blocks);
        ctl_json_obj_end(j);
        ctl_json_key(j, "shard");
        ctl_json_obj_begin(j);
        ctl_json_kuint(j, "index", p->dp);
        ctl_json_kuint(j, "of", p->shards);
        ctl_json_kuint(j, "owned_params", p->owned_params);
        ctl_json_obj_end(j);
        ctl_json_key(j, "place_reported");
        ctl_json_bool(j, p->reported);
    }
    ctl_json_key(j, "time"); /* the last step's breakdown, seconds */
    if (r->time) {
        const Chorus__StepTime *t = r->time;
        ctl_json_obj_begin(j);
        ctl_json_kdouble(j, "step_s", t->step_s);
        ctl_json_kdouble(j, "compute", t->compute);
        ctl_json_kdouble(j, "tp", t->tp);
        ctl_json_kdouble(j, "pp_wait", t->pp_wait);
        ctl_json_kdouble(j, "zero", t->zero);
        ctl_json_kdouble(j, "optim", t->optim);
        ctl_json_kdouble(j, "idle", t->idle);
        ctl_json_kdouble(j, "bubble", t->bubble);
        ctl_json_obj_end(j);
    } else {
        ctl_json_null(j);
    }
    ctl_json_obj_end(j);
}

/* {tp, pp, dp, microbatches, micro_batch_size}, or null when absent. */
static void restart_layout_json(ctl_json_t *j, const char *key, const Chorus__RestartLayout *l)
{
    ctl_json_key(j, key);
    if (!l) {
        ctl_json_null(j);
        return;
    }
    ctl_json_obj_begin(j);
    ctl_json_kuint(j, "tp", l->tp);
    ctl_json_kuint(j, "pp", l->pp);
    ctl_json_kuint(j, "dp", l->dp);
    ctl_json_kuint(j, "microbatches", l->microbatches);
    ctl_json_kuint(j, "micro_batch_size", l->micro_batch_size);
    ctl_json_obj_end(j);
}

/* One restart: what failed, where, and what it cost (DESIGN §9); layout_from/layout_to:
 * the layout an elastic restart gave up and resumed in (null: unchanged). */
static void restart_json(ctl_json_t *j, const Chorus__RestartInfo *h)
{
    ctl_json_obj_begin(j);
    ctl_json_kuint(j, "time_ms", h->time_ms);
    ctl_json_kstr(j, "cause", h->cause);
    ctl_json_key(j, "rank");
    if (h->rank >= 0)
        ctl_json_int(j, h->rank);
    else
        ctl_json_null(j);
    ctl_json_kstr(j, "node", h->node);
    ctl_json_kstr(j, "reason", h->reason);
    ctl_json_kuint(j, "failed_generation", h->failed_generation);
    ctl_json_kuint(j, "failed_step", h->failed_step);
    ctl_json_key(j, "resumed_from");
    if (h->resumed_from >= 0)
        ctl_json_int(j, h->resumed_from);
    else
        ctl_json_null(j);
    ctl_json_kuint(j, "steps_lost", h->steps_lost);
    ctl_json_key(j, "recover_s");
    if (h->recover_s >= 0)
        ctl_json_double(j, h->recover_s);
    else
        ctl_json_null(j);
    restart_layout_json(j, "layout_from", h->layout_from);
    restart_layout_json(j, "layout_to", h->layout_to);
    ctl_json_obj_end(j);
}

void ctl_job_json(ctl_json_t *j, const Chorus__JobInfo *ji)
{
    ctl_json_obj_begin(j);
    ctl_json_kstr(j, "id", ji->id);
    ctl_json_kstr(j, "name", ji->name);
    ctl_json_kstr(j, "kind", ji->kind);
    ctl_json_kstr(j, "state", ji->state);
    ctl_json_kuint(j, "step", ji->step);
    ctl_json_kuint(j, "total_steps", ji->total_steps);
    ctl_json_key(j, "loss");
    if (has_loss(ji))
        ctl_json_double(j, ji->loss);
    else
        ctl_json_null(j);
    ctl_json_kuint(j, "generation", ji->generation);
    ctl_json_kuint(j, "restarts", ji->restarts);
    ctl_json_kuint(j, "world_size", ji->world_size);
    ctl_json_key(j, "layout");
    ctl_json_obj_begin(j);
    ctl_json_kuint(j, "tp", ji->tp);
    ctl_json_kuint(j, "pp", ji->pp);
    ctl_json_kuint(j, "dp", ji->dp);
    ctl_json_obj_end(j);
    ctl_json_key(j, "last_checkpoint_step");
    if (ji->last_checkpoint_step >= 0)
        ctl_json_int(j, ji->last_checkpoint_step);
    else
        ctl_json_null(j);
    ctl_json_kdouble(j, "tokens_per_s", ji->tokens_per_s);
    ctl_json_kdouble(j, "mfu", ji->mfu);
    ctl_json_kuint(j, "microbatches", ji->microbatches);
    ctl_json_key(j, "bubble"); /* measured: mean over ranks of pp_wait / step time */
    if (ji->bubble >= 0)
        ctl_json_double(j, ji->bubble);
    else
        ctl_json_null(j);
    ctl_json_kdouble(j, "bubble_theory", ji->bubble_theory);
    ctl_json_kstr(j, "reason", ji->reason);
    ctl_json_kuint(j, "submitted_ms", ji->submitted_ms);
    ctl_json_kuint(j, "started_ms", ji->started_ms);
    ctl_json_kuint(j, "finished_ms", ji->finished_ms);
    ctl_json_key(j, "rank_states"); /* ranks per state, e.g. {"running": 16384} */
    ctl_json_obj_begin(j);
    for (size_t i = 0; i < ji->n_rank_states; i++)
        ctl_json_kuint(j, ji->rank_states[i]->state, ji->rank_states[i]->count);
    ctl_json_obj_end(j);
    /* ranks: every rank of a job of <= 1,024; of a bigger one those asked for (--ranks,
     * --rank N, --first N --limit N), then ranks_partial is true */
    ctl_json_key(j, "ranks");
    ctl_json_arr_begin(j);
    for (size_t i = 0; i < ji->n_ranks; i++)
        rank_json(j, ji->ranks[i]);
    ctl_json_arr_end(j);
    ctl_json_key(j, "ranks_partial");
    ctl_json_bool(j, ji->ranks_partial);
    ctl_json_key(j, "history");
    ctl_json_arr_begin(j);
    for (size_t i = 0; i < ji->n_history; i++)
        restart_json(j, ji->history[i]);
    ctl_json_arr_end(j);
    ctl_json_obj_end(j);
}

// ----------------------------------------------------------------------------
// text

/* Metric names in order of first appearance across ranks (borrowed from ji). */
static size_t metric_names(const Chorus__JobInfo *ji, const char **names, size_t max)
{
    size_t n = 0;
    for (size_t r = 0; r < ji->n_ranks; r++) {
        for (size_t m = 0; m < ji->ranks[r]->n_metrics; m++) {
            const char *name = ji->ranks[r]->metrics[m]->name;
            size_t k = 0;
            while (k < n && strcmp(names[k], name) != 0)
                k++;
            if (k == n && n < max)
                names[n++] = name;
        }
    }
    return n;
}

static void print_ranks(const Chorus__JobInfo *ji)
{
    const char *names[16];
    size_t nm = metric_names(ji, names, 16);
    ctl_table_t t;

    ctl_table_init(&t, 5 + nm);
    ctl_table_cell(&t, "RANK");
    ctl_table_cell(&t, "NODE");
    ctl_table_cell(&t, "STATE");
    ctl_table_cell(&t, "STEP");
    for (size_t k = 0; k < nm; k++)
        ctl_table_cell(&t, "%s", names[k]);
    ctl_table_cell(&t, "EXIT");
    for (size_t i = 0; i < ji->n_ranks; i++) {
        const Chorus__RankInfo *r = ji->ranks[i];
        ctl_table_cell(&t, "%" PRIu32, r->rank);
        ctl_table_cell(&t, "%s", r->node);
        ctl_table_cell(&t, "%s", r->state);
        ctl_table_cell(&t, "%" PRIu64, r->step);
        for (size_t k = 0; k < nm; k++) {
            size_t m = 0;
            while (m < r->n_metrics && strcmp(r->metrics[m]->name, names[k]) != 0)
                m++;
            if (m < r->n_metrics)
                ctl_table_cell(&t, "%.4g", r->metrics[m]->value);
            else
                ctl_table_cell(&t, "-");
        }
        if (r->signal)
            ctl_table_cell(&t, "signal %" PRId32, r->signal);
        else
            ctl_table_cell(&t, "%" PRId32, r->exit_code);
    }
    ctl_table_print(&t, stdout);
    ctl_table_fini(&t);
}

/* Milliseconds of a part of the step, "-" before the engine measures the parts. */
static void ms_cell(ctl_table_t *t, double seconds, int measured)
{
    if (measured)
        ctl_table_cell(t, "%.2f", seconds * 1e3);
    else
        ctl_table_cell(t, "-");
}

/* Train jobs: each rank's place in the layout and where its last step went. */
static void print_layout(const Chorus__JobInfo *ji)
{
    static const char *const hdr[] = {"RANK",    "TP",    "PP",      "DP",      "BLOCKS",
                                      "SHARD",   "OWNED", "STEP_MS", "COMPUTE", "TP_COMM",
                                      "PP_WAIT", "ZERO",  "OPTIM",   "IDLE",    "BUBBLE"};
    const size_t nh = sizeof hdr / sizeof hdr[0];
    ctl_table_t t;
    ctl_table_init(&t, nh);
    for (size_t h = 0; h < nh; h++)
        ctl_table_cell(&t, "%s", hdr[h]);
    for (size_t i = 0; i < ji->n_ranks; i++) {
        const Chorus__RankInfo *r = ji->ranks[i];
        const Chorus__RankPlace *p = r->place;
        const Chorus__StepTime *st = r->time;
        char owned[32];
        if (!p)
            continue;
        ctl_fmt_si(owned, sizeof owned, (double)p->owned_params);
        ctl_table_cell(&t, "%" PRIu32, r->rank);
        ctl_table_cell(&t, "%" PRIu32, p->tp);
        ctl_table_cell(&t, "%" PRIu32, p->pp);
        ctl_table_cell(&t, "%" PRIu32, p->dp);
        if (p->blocks > 1)
            ctl_table_cell(&t, "%" PRIu32 "-%" PRIu32, p->first_block,
                           p->first_block + p->blocks - 1);
        else
            ctl_table_cell(&t, "%" PRIu32, p->first_block);
        ctl_table_cell(&t, "%" PRIu32 "/%" PRIu32, p->dp, p->shards);
        ctl_table_cell(&t, "%s", owned);
        if (!st) {
            for (size_t k = 7; k < nh; k++)
                ctl_table_cell(&t, "-");
            continue;
        }
        /* The parts are zero until the engine measures them: then only the step shows. */
        int parts = st->compute + st->tp + st->pp_wait + st->zero + st->optim + st->idle > 0;
        ctl_table_cell(&t, "%.2f", st->step_s * 1e3);
        ms_cell(&t, st->compute, parts);
        ms_cell(&t, st->tp, parts);
        ms_cell(&t, st->pp_wait, parts);
        ms_cell(&t, st->zero, parts);
        ms_cell(&t, st->optim, parts);
        ms_cell(&t, st->idle, parts);
        ctl_table_cell(&t, "%.1f%%", 100.0 * st->bubble);
    }
    ctl_table_print(&t, stdout);
    ctl_table_fini(&t);
}

void ctl_job_print(const Chorus__JobInfo *ji)
{
    char tps[32], sub[32], start[32], fin[32], run[32];

    ctl_fmt_si(tps, sizeof tps, ji->tokens_per_s > 0 ? ji->tokens_per_s : -1);
    fmt_wall(sub, sizeof sub, ji->submitted_ms);
    fmt_wall(start, sizeof start, ji->started_ms);
    fmt_wall(fin, sizeof fin, ji->finished_ms);
    ctl_fmt_duration(run, sizeof run,
                     ji->started_ms && ji->finished_ms >= ji->started_ms
                         ? (double)(ji->finished_ms - ji->started_ms) / 1000.0
                         : -1.0);
    printf("job          %s (%s)\n", ji->id, ji->name && *ji->name ? ji->name : "-");
    printf("kind         %s\n", ji->kind);
    printf("state        %s\n", ji->state);
    if (ji->reason && *ji->reason)
        printf("reason       %s\n", ji->reason);
    printf("step         %" PRIu64 "/%" PRIu64 "\n", ji->step, ji->total_steps);
    if (has_loss(ji))
        printf("loss         %.4f\n", ji->loss);
    printf("layout       tp=%" PRIu32 " pp=%" PRIu32 " dp=%" PRIu32 " (world %" PRIu32 ")\n",
           ji->tp, ji->pp, ji->dp, ji->world_size);
    printf("generation   %" PRIu64 " (restarts %" PRIu32 ")\n", ji->generation, ji->restarts);
    if (ji->last_checkpoint_step >= 0)
        printf("checkpoint   step %" PRId64 "\n", ji->last_checkpoint_step);
    else
        printf("checkpoint   none\n");
    printf("tokens/s     %s\n", tps);
    if (ji->mfu > 0 && isfinite(ji->mfu))
        printf("MFU          %.2f%%\n", 100.0 * ji->mfu);
    if (ji->pp > 1) {
        char measured[32] = "-";
        if (ji->bubble >= 0)
            snprintf(measured, sizeof measured, "%.1f%%", 100.0 * ji->bubble);
        printf("bubble       %s measured (mean over ranks of pp_wait / step), 1F1B %.1f%% = "
               "(pp-1)/(microbatches+pp-1) with microbatches %" PRIu32 "\n",
               measured, 100.0 * ji->bubble_theory, ji->microbatches);
    }
    printf("submitted    %s\nstarted      %s\nfinished     %s (ran %s)\n", sub, start, fin, run);
    for (size_t i = 0; i < ji->n_history; i++) {
        const Chorus__RestartInfo *h = ji->history[i];
        char when[32], took[32] = "-";
        fmt_wall(when, sizeof when, h->time_ms);
        if (h->recover_s >= 0)
            snprintf(took, sizeof took, "%.2f s", h->recover_s);
        printf("%s %s gen %" PRIu64 " step %" PRIu64 ": %s: %s",
               i ? "            " : "restarts    ", when, h->failed_generation, h->failed_step,
               h->cause, h->reason);
        if (h->resumed_from >= 0)
            printf(" -> resumed from %" PRId64 " (%" PRIu64 " steps lost, recovered in %s)",
                   h->resumed_from, h->steps_lost, took);
        if (h->layout_from && h->layout_to)
            printf(" in tp %u x pp %u x dp %u (was dp %u; microbatches %u -> %u, "
                   "micro_batch_size %u -> %u)",
                   h->layout_to->tp, h->layout_to->pp, h->layout_to->dp, h->layout_from->dp,
                   h->layout_from->microbatches, h->layout_to->microbatches,
                   h->layout_from->micro_batch_size, h->layout_to->micro_batch_size);
        printf("\n");
    }
    if (ji->n_rank_states > 0) {
        printf("ranks        %" PRIu32 ":", ji->world_size);
        for (size_t i = 0; i < ji->n_rank_states; i++)
            printf("%s %" PRIu32 " %s", i ? "," : "", ji->rank_states[i]->count,
                   ji->rank_states[i]->state);
        printf("\n");
    }
    if (ji->ranks_partial && ji->n_ranks > 0)
        printf("showing      ranks %" PRIu32 "..%" PRIu32 " of %" PRIu32 "\n", ji->ranks_first,
               ji->ranks_first + (uint32_t)ji->n_ranks - 1, ji->world_size);
    else if (ji->ranks_partial)
        printf("             (per-rank detail: --ranks, --rank N, or --first N --limit N)\n");
    if (ji->n_ranks > 0) {
        printf("\n");
        print_ranks(ji);
        if (ji->ranks[0]->place) {
            printf("\n");
            print_layout(ji);
        }
    }
}

// ----------------------------------------------------------------------------
// commands

int ctl_cmd_jobs(ctl_t *ctl, int argc, char **argv)
{
    Chorus__Envelope req = CHORUS__ENVELOPE__INIT, *resp = NULL;
    Chorus__ListJobs lj = CHORUS__LIST_JOBS__INIT;

    if (argc != 0) {
        ctl_errf("usage: chorusctl jobs [--json]");
        return CTL_EXIT_USAGE;
    }
    req.body_case = CHORUS__ENVELOPE__BODY_LIST_JOBS;
    req.list_jobs = &lj;
    int st = ctl_rpc(ctl, &req, CHORUS__ENVELOPE__BODY_JOB_LIST, NULL, &resp);
    if (st != CTL_EXIT_OK)
        return st;
    const Chorus__JobList *jl = resp->job_list;
    if (ctl->json) {
        ctl_json_t j;
        ctl_json_init(&j, stdout);
        ctl_json_arr_begin(&j);
        for (size_t i = 0; i < jl->n_jobs; i++)
            ctl_job_json(&j, jl->jobs[i]);
        ctl_json_arr_end(&j);
        ctl_json_finish(&j);
    } else {
        ctl_table_t t;
        ctl_table_init(&t, 9);
        const char *hdr[] = {"ID",   "NAME",     "KIND",     "STATE", "STEP",
                             "LOSS", "TPxPPxDP", "RESTARTS", "REASON"};
        for (size_t h = 0; h < 9; h++)
            ctl_table_cell(&t, "%s", hdr[h]);
        for (size_t i = 0; i < jl->n_jobs; i++) {
            const Chorus__JobInfo *ji = jl->jobs[i];
            ctl_table_cell(&t, "%s", ji->id);
            ctl_table_cell(&t, "%s", ji->name && *ji->name ? ji->name : "-");
            ctl_table_cell(&t, "%s", ji->kind);
            ctl_table_cell(&t, "%s", ji->state);
            ctl_table_cell(&t, "%" PRIu64 "/%" PRIu64, ji->step, ji->total_steps);
            if (has_loss(ji))
                ctl_table_cell(&t, "%.4f", ji->loss);
            else
                ctl_table_cell(&t, "-");
            ctl_table_cell(&t, "%" PRIu32 "x%" PRIu32 "x%" PRIu32, ji->tp, ji->pp, ji->dp);
            ctl_table_cell(&t, "%" PRIu32, ji->restarts);
            ctl_table_cell(&t, "%s", ji->reason && *ji->reason ? ji->reason : "");
        }
        ctl_table_print(&t, stdout);
        ctl_table_fini(&t);
    }
    ch_msg_free(resp);
    return CTL_EXIT_OK;
}

int ctl_cmd_status(ctl_t *ctl, int argc, char **argv)
{
    ch_client_t *cl = NULL;
    Chorus__Envelope env = CHORUS__ENVELOPE__INIT, *resp = NULL;
    Chorus__JobQuery q = CHORUS__JOB_QUERY__INIT;
    const char *job = NULL;

    /* A job of more than 1,024 ranks shows its ranks per state unless asked for more. */
    for (int i = 0; i < argc; i++) {
        long v = 0;
        int has_val = i + 1 < argc;
        if (strcmp(argv[i], "--ranks") == 0) {
            q.all_ranks = 1;
        } else if (strcmp(argv[i], "--metrics") == 0) {
            q.metrics = 1;
        } else if (strcmp(argv[i], "--rank") == 0 && has_val &&
                   ctl_parse_long(argv[i + 1], 0, UINT32_MAX, &v) == 0) {
            q.rank_first = (uint32_t)v;
            q.rank_limit = 1;
            i++;
        } else if (strcmp(argv[i], "--first") == 0 && has_val &&
                   ctl_parse_long(argv[i + 1], 0, UINT32_MAX, &v) == 0) {
            q.rank_first = (uint32_t)v;
            i++;
        } else if (strcmp(argv[i], "--limit") == 0 && has_val &&
                   ctl_parse_long(argv[i + 1], 1, UINT32_MAX, &v) == 0) {
            q.rank_limit = (uint32_t)v;
            i++;
        } else if (argv[i][0] != '-' && !job) {
            job = argv[i];
        } else {
            job = NULL;
            break;
        }
    }
    if (!job) {
        ctl_errf("usage: chorusctl status JOB [--ranks | --rank N | --first N [--limit N]] "
                 "[--metrics] [--json]");
        return CTL_EXIT_USAGE;
    }
    /* --first alone pages to the end */
    if (q.rank_first > 0 && q.rank_limit == 0)
        q.all_ranks = 1;
    int st = ctl_open(ctl, &cl);
    if (st != CTL_EXIT_OK)
        return st;
    q.job_id = (char *)job;
    env.body_case = CHORUS__ENVELOPE__BODY_JOB_QUERY;
    env.job_query = &q;
    st = ctl_call(ctl, cl, &env, CHORUS__ENVELOPE__BODY_JOB_INFO, job, &resp);
    ch_client_destroy(cl);
    if (st != CTL_EXIT_OK)
        return st;
    if (ctl->json) {
        ctl_json_t j;
        ctl_json_init(&j, stdout);
        ctl_job_json(&j, resp->job_info);
        ctl_json_finish(&j);
    } else {
        ctl_job_print(resp->job_info);
    }
    ch_msg_free(resp);
    return CTL_EXIT_OK;
}

/* Print the outcome of an Ok-returning job command. */
static void print_done(const ctl_t *ctl, const char *job, const char *what)
{
    if (ctl->json) {
        ctl_json_t j;
        ctl_json_init(&j, stdout);
        ctl_json_obj_begin(&j);
        ctl_json_kstr(&j, "id", job);
        ctl_json_key(&j, what);
        ctl_json_bool(&j, 1);
        ctl_json_obj_end(&j);
        ctl_json_finish(&j);
    } else {
        printf("%s: %s\n", job, what);
    }
}

int ctl_cmd_cancel(ctl_t *ctl, int argc, char **argv)
{
    Chorus__Envelope req = CHORUS__ENVELOPE__INIT, *resp = NULL;
    Chorus__Cancel c = CHORUS__CANCEL__INIT;

    if (argc != 1) {
        ctl_errf("usage: chorusctl cancel JOB");
        return CTL_EXIT_USAGE;
    }
    c.job_id = argv[0];
    req.body_case = CHORUS__ENVELOPE__BODY_CANCEL;
    req.cancel = &c;
    int st = ctl_rpc(ctl, &req, CHORUS__ENVELOPE__BODY_OK, argv[0], &resp);
    if (st != CTL_EXIT_OK)
        return st;
    ch_msg_free(resp);
    print_done(ctl, argv[0], "cancelled");
    return CTL_EXIT_OK;
}

int ctl_cmd_checkpoint(ctl_t *ctl, int argc, char **argv)
{
    Chorus__Envelope req = CHORUS__ENVELOPE__INIT, *resp = NULL;
    Chorus__Checkpoint c = CHORUS__CHECKPOINT__INIT;

    if (argc != 1) {
        ctl_errf("usage: chorusctl checkpoint JOB");
        return CTL_EXIT_USAGE;
    }
    c.job_id = argv[0];
    req.body_case = CHORUS__ENVELOPE__BODY_CHECKPOINT;
    req.checkpoint = &c;
    int st = ctl_rpc(ctl, &req, CHORUS__ENVELOPE__BODY_OK, argv[0], &resp);
    if (st != CTL_EXIT_OK)
        return st;
    ch_msg_free(resp);
    print_done(ctl, argv[0], "checkpoint_requested");
    return CTL_EXIT_OK;
}

int ctl_cmd_kill_rank(ctl_t *ctl, int argc, char **argv)
{
    Chorus__Envelope req = CHORUS__ENVELOPE__INIT, *resp = NULL;
    Chorus__KillRank k = CHORUS__KILL_RANK__INIT;
    long rank = 0;

    if (argc != 2 || ctl_parse_long(argv[1], 0, UINT32_MAX, &rank) < 0) {
        ctl_errf("usage: chorusctl kill-rank JOB RANK");
        return CTL_EXIT_USAGE;
    }
    k.job_id = argv[0];
    k.rank = (uint32_t)rank;
    req.body_case = CHORUS__ENVELOPE__BODY_KILL_RANK;
    req.kill_rank = &k;
    int st = ctl_rpc(ctl, &req, CHORUS__ENVELOPE__BODY_OK, argv[0], &resp);
    if (st != CTL_EXIT_OK)
        return st;
    ch_msg_free(resp);
    print_done(ctl, argv[0], "rank_killed");
    return CTL_EXIT_OK;
}
