/* chorusctl jobs | status | cancel | kill-rank, and the rendering of a job (JobInfo) as
 * a JSON status object or as text, shared with submit --wait and watch. */
#include <inttypes.h>
#include <math.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/escape.h"
#include "common/msg.h"
#include "common/util.h"
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
    ctl_json_key(j, "memory_copy_rank"); /* checkpoint.memory_every: who holds its copy */
    if (r->memory_copy_rank >= 0)
        ctl_json_int(j, r->memory_copy_rank);
    else
        ctl_json_null(j);
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
    ctl_json_key(j, "source");
    if (h->source && *h->source)
        ctl_json_str(j, h->source);
    else
        ctl_json_null(j);
    restart_layout_json(j, "layout_from", h->layout_from);
    restart_layout_json(j, "layout_to", h->layout_to);
    ctl_json_key(j, "phases"); /* seconds per phase of the restart, in order */
    ctl_json_obj_begin(j);
    for (size_t k = 0; k < h->n_phases; k++) {
        ctl_json_key(j, h->phases[k]->name);
        ctl_json_double(j, h->phases[k]->value);
    }
    ctl_json_obj_end(j);
    ctl_json_obj_end(j);
}

/* The submitter's login name, or the uid in decimal when this machine does not know it;
 * "-" when the coordinator did not say. */
static const char *job_user(const Chorus__JobInfo *ji, char *buf, size_t n)
{
    if (ji->owner_uid < 0)
        return "-";
    struct passwd *pw = getpwuid((uid_t)ji->owner_uid);
    if (pw)
        snprintf(buf, n, "%s", pw->pw_name);
    else
        snprintf(buf, n, "%" PRId64, ji->owner_uid);
    return buf;
}

/* Seconds the job has run: from its start to its end, or to now; -1 before it started. */
static int64_t job_elapsed_s(const Chorus__JobInfo *ji)
{
    if (!ji->started_ms)
        return -1;
    uint64_t end = ji->finished_ms ? ji->finished_ms : ch_wall_ms();
    return end > ji->started_ms ? (int64_t)((end - ji->started_ms) / 1000) : 0;
}

/* Slurm's elapsed form: M:SS, H:MM:SS, D-HH:MM:SS. */
static void fmt_elapsed(int64_t s, char *buf, size_t n)
{
    if (s < 0)
        snprintf(buf, n, "-");
    else if (s < 3600)
        snprintf(buf, n, "%d:%02d", (int)(s / 60), (int)(s % 60));
    else if (s < 86400)
        snprintf(buf, n, "%d:%02d:%02d", (int)(s / 3600), (int)(s / 60 % 60), (int)(s % 60));
    else
        snprintf(buf, n, "%d-%02d:%02d:%02d", (int)(s / 86400), (int)(s / 3600 % 24),
                 (int)(s / 60 % 60), (int)(s % 60));
}

void ctl_job_json(ctl_json_t *j, const Chorus__JobInfo *ji)
{
    char user[64];
    ctl_json_obj_begin(j);
    ctl_json_kstr(j, "id", ji->id);
    ctl_json_kstr(j, "name", ji->name);
    ctl_json_kstr(j, "kind", ji->kind);
    ctl_json_kstr(j, "state", ji->state);
    ctl_json_kuint(j, "queue_place", ji->queue_place); /* queued: 1 = next to start */
    ctl_json_key(j, "owner_uid");
    if (ji->owner_uid >= 0)
        ctl_json_int(j, ji->owner_uid);
    else
        ctl_json_null(j);
    ctl_json_kstr(j, "user", ji->owner_uid >= 0 ? job_user(ji, user, sizeof user) : NULL);
    ctl_json_kuint(j, "nodes", ji->nodes);
    ctl_json_key(j, "elapsed_s");
    if (job_elapsed_s(ji) >= 0)
        ctl_json_int(j, job_elapsed_s(ji));
    else
        ctl_json_null(j);
    ctl_json_kuint(j, "step", ji->step);
    ctl_json_kuint(j, "total_steps", ji->total_steps);
    ctl_json_key(j, "loss");
    if (has_loss(ji))
        ctl_json_double(j, ji->loss);
    else
        ctl_json_null(j);
    /* train.val_data's loss and the steps done when it was taken; null, 0 before one */
    ctl_json_key(j, "val_loss");
    if (ji->val_step > 0 && isfinite(ji->val_loss))
        ctl_json_double(j, ji->val_loss);
    else
        ctl_json_null(j);
    ctl_json_key(j, "val_step");
    ctl_json_uint(j, ji->val_step);
    ctl_json_kuint(j, "generation", ji->generation);
    ctl_json_kuint(j, "restarts", ji->restarts);
    ctl_json_kuint(j, "stragglers", ji->stragglers);
    ctl_json_kstr(j, "straggler", ji->straggler ? ji->straggler : "");
    ctl_json_kuint(j, "slow_nodes", ji->slow_nodes);
    ctl_json_kstr(j, "slow_node", ji->slow_node ? ji->slow_node : "");
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

/* Restarts status lists one by one unless asked for all (--history); a job that restarted
 * a thousand times gets a summary line instead of a thousand. */
#define HISTORY_SHOWN 3

/* "restarts    1000 in all since <time>: rank_exit 990, hang 10; the last 3 below
 * (--history for all)". */
static void history_summary(const Chorus__JobInfo *ji, size_t hidden)
{
    const char *causes[16];
    size_t counts[16], nc = 0;
    for (size_t i = 0; i < ji->n_history; i++) {
        const char *cause = ji->history[i]->cause ? ji->history[i]->cause : "?";
        size_t k = 0;
        while (k < nc && strcmp(causes[k], cause) != 0)
            k++;
        if (k == nc && nc == 16)
            continue;
        if (k == nc) {
            causes[nc] = cause;
            counts[nc++] = 0;
        }
        counts[k]++;
    }
    char since[32];
    fmt_wall(since, sizeof since, ji->history[0]->time_ms);
    printf("restarts    %zu in all since %s:", ji->n_history, since);
    for (size_t k = 0; k < nc; k++)
        printf("%s %s %zu", k ? "," : "", causes[k], counts[k]);
    printf("; the last %zu below (%zu earlier: --history)\n", ji->n_history - hidden, hidden);
}

void ctl_job_print(const Chorus__JobInfo *ji, int all_history)
{
    char tps[32], sub[32], start[32], fin[32], run[32];
    char name[4 * 64 + 1], reason[4 * 512 + 1]; /* peer text, escaped (common/escape.h) */

    ctl_fmt_si(tps, sizeof tps, ji->tokens_per_s > 0 ? ji->tokens_per_s : -1);
    fmt_wall(sub, sizeof sub, ji->submitted_ms);
    fmt_wall(start, sizeof start, ji->started_ms);
    fmt_wall(fin, sizeof fin, ji->finished_ms);
    ctl_fmt_duration(run, sizeof run,
                     ji->started_ms && ji->finished_ms >= ji->started_ms
                         ? (double)(ji->finished_ms - ji->started_ms) / 1000.0
                         : -1.0);
    printf("job          %s (%s)\n", ch_escape(name, sizeof name, ji->id),
           ji->name && *ji->name ? ch_escape(name, sizeof name, ji->name) : "-");
    printf("kind         %s\n", ch_escape(name, sizeof name, ji->kind));
    printf("state        %s", ch_escape(name, sizeof name, ji->state));
    if (ji->queue_place)
        printf(" (place %" PRIu32 " in the queue)", ji->queue_place);
    printf("\n");
    if (ji->reason && *ji->reason)
        printf("reason       %s\n", ch_escape(reason, sizeof reason, ji->reason));
    printf("step         %" PRIu64 "/%" PRIu64 "\n", ji->step, ji->total_steps);
    if (has_loss(ji))
        printf("loss         %.4f\n", ji->loss);
    if (ji->val_step > 0 && isfinite(ji->val_loss))
        printf("val loss     %.4f (after step %" PRIu64 ")\n", ji->val_loss, ji->val_step);
    printf("layout       tp=%" PRIu32 " pp=%" PRIu32 " dp=%" PRIu32 " (world %" PRIu32 ")\n",
           ji->tp, ji->pp, ji->dp, ji->world_size);
    printf("generation   %" PRIu64 " (restarts %" PRIu32 ")\n", ji->generation, ji->restarts);
    if (ji->stragglers > 0)
        printf("straggler    %s\n", ji->straggler);
    if (ji->slow_nodes > 0)
        printf("slow node    %s\n", ji->slow_node);
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
    size_t first =
        all_history || ji->n_history <= HISTORY_SHOWN ? 0 : ji->n_history - HISTORY_SHOWN;
    if (first > 0)
        history_summary(ji, first);
    for (size_t i = first; i < ji->n_history; i++) {
        const Chorus__RestartInfo *h = ji->history[i];
        char when[32], took[32] = "-";
        fmt_wall(when, sizeof when, h->time_ms);
        if (h->recover_s >= 0)
            snprintf(took, sizeof took, "%.2f s", h->recover_s);
        printf("%s %s gen %" PRIu64 " step %" PRIu64 ": %s: %s",
               i ? "            " : "restarts    ", when, h->failed_generation, h->failed_step,
               ch_escape(name, sizeof name, h->cause), ch_escape(reason, sizeof reason, h->reason));
        if (h->resumed_from >= 0)
            printf(" -> resumed from %" PRId64 "%s%s (%" PRIu64 " steps lost, recovered in %s)",
                   h->resumed_from, h->source && *h->source ? " in " : "",
                   h->source ? h->source : "", h->steps_lost, took);
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

/* jobs' filters: --state S[,S...] and --user NAME|UID (either as --opt=value too). */
typedef struct jobs_filter {
    const char *states; /* ",running,queued," or NULL */
    char states_buf[256];
    int64_t uid; /* -1: any */
} jobs_filter_t;

enum { OPT_STATE = 256, OPT_USER };

const ctl_opt_t ctl_opts_jobs[] = {
    {"state", OPT_STATE, "STATE[,STATE...]", "only jobs in these states"},
    {"user", OPT_USER, "USER", "only this user's jobs (a name or a uid)"},
    {NULL, 0, NULL, NULL},
};

/* --user's value: a user name on this machine or a uid. */
static int jobs_parse_user(const char *v, jobs_filter_t *f)
{
    long uid = 0;
    struct passwd *pw = getpwnam(v);
    if (pw)
        f->uid = pw->pw_uid;
    else if (ctl_parse_long(v, 0, INT32_MAX, &uid) == 0)
        f->uid = uid;
    else {
        ctl_errf("--user: no user '%s' on this machine", v);
        return CTL_EXIT_USAGE;
    }
    return CTL_EXIT_OK;
}

static int jobs_parse(int argc, char **argv, jobs_filter_t *f)
{
    ctl_args_t a;
    const char *v;
    int c;
    f->states = NULL;
    f->uid = -1;
    if (ctl_args_begin(&a, "jobs", ctl_opts_jobs, argc, argv) < 0)
        return CTL_EXIT_USAGE;
    while ((c = ctl_args_next(&a, &v)) > 0) {
        if (c == OPT_STATE) {
            snprintf(f->states_buf, sizeof f->states_buf, ",%s,", v);
            f->states = f->states_buf;
        } else if (jobs_parse_user(v, f) != CTL_EXIT_OK) {
            return CTL_EXIT_USAGE;
        }
    }
    if (c < 0)
        return CTL_EXIT_USAGE;
    if (a.npos != 0) {
        ctl_usage("jobs");
        return CTL_EXIT_USAGE;
    }
    return CTL_EXIT_OK;
}

static int jobs_match(const jobs_filter_t *f, const Chorus__JobInfo *ji)
{
    char key[80];
    snprintf(key, sizeof key, ",%s,", ji->state);
    if (f->states && !strstr(f->states, key))
        return 0;
    return f->uid < 0 || ji->owner_uid == f->uid;
}

static void jobs_table(const Chorus__JobList *jl, const jobs_filter_t *f)
{
    static const char *const hdr[] = {"ID",      "NAME",  "USER", "KIND",     "STATE",    "STEP",
                                      "ELAPSED", "NODES", "LOSS", "TPxPPxDP", "RESTARTS", "REASON"};
    const size_t ncols = sizeof hdr / sizeof hdr[0];
    ctl_table_t t;
    char user[64], elapsed[32];
    ctl_table_init(&t, ncols);
    for (size_t h = 0; h < ncols; h++)
        ctl_table_cell(&t, "%s", hdr[h]);
    for (size_t i = 0; i < jl->n_jobs; i++) {
        const Chorus__JobInfo *ji = jl->jobs[i];
        if (!jobs_match(f, ji))
            continue;
        fmt_elapsed(job_elapsed_s(ji), elapsed, sizeof elapsed);
        ctl_table_cell(&t, "%s", ji->id);
        ctl_table_cell(&t, "%s", ji->name && *ji->name ? ji->name : "-");
        ctl_table_cell(&t, "%s", job_user(ji, user, sizeof user));
        ctl_table_cell(&t, "%s", ji->kind);
        if (ji->queue_place) /* its place in the queue; REASON says why it waits */
            ctl_table_cell(&t, "%s #%" PRIu32, ji->state, ji->queue_place);
        else
            ctl_table_cell(&t, "%s", ji->state);
        ctl_table_cell(&t, "%" PRIu64 "/%" PRIu64, ji->step, ji->total_steps);
        ctl_table_cell(&t, "%s", elapsed);
        if (ji->nodes)
            ctl_table_cell(&t, "%" PRIu32, ji->nodes);
        else
            ctl_table_cell(&t, "-");
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

int ctl_cmd_jobs(ctl_t *ctl, int argc, char **argv)
{
    Chorus__Envelope req = CHORUS__ENVELOPE__INIT, *resp = NULL;
    Chorus__ListJobs lj = CHORUS__LIST_JOBS__INIT;
    jobs_filter_t f;

    int st = jobs_parse(argc, argv, &f);
    if (st != CTL_EXIT_OK)
        return st;
    req.body_case = CHORUS__ENVELOPE__BODY_LIST_JOBS;
    req.list_jobs = &lj;
    st = ctl_rpc(ctl, &req, CHORUS__ENVELOPE__BODY_JOB_LIST, NULL, &resp);
    if (st != CTL_EXIT_OK)
        return st;
    const Chorus__JobList *jl = resp->job_list;
    if (ctl->json) {
        ctl_json_t j;
        ctl_json_init(&j, stdout);
        ctl_json_arr_begin(&j);
        for (size_t i = 0; i < jl->n_jobs; i++)
            if (jobs_match(&f, jl->jobs[i]))
                ctl_job_json(&j, jl->jobs[i]);
        ctl_json_arr_end(&j);
        ctl_json_finish(&j);
    } else {
        jobs_table(jl, &f);
    }
    ch_msg_free(resp);
    return CTL_EXIT_OK;
}

enum { OPT_RANKS = 256, OPT_RANK, OPT_FIRST, OPT_LIMIT, OPT_METRICS, OPT_HISTORY };

const ctl_opt_t ctl_opts_status[] = {
    {"ranks", OPT_RANKS, NULL, "every rank"},
    {"rank", OPT_RANK, "N", "rank N only"},
    {"first", OPT_FIRST, "N", "ranks from N (to the end, or --limit of them)"},
    {"limit", OPT_LIMIT, "N", "at most N ranks"},
    {"metrics", OPT_METRICS, NULL, "each rank's metrics"},
    {"history", OPT_HISTORY, NULL, "every restart of the job's history, not the last few"},
    {NULL, 0, NULL, NULL},
};

int ctl_cmd_status(ctl_t *ctl, int argc, char **argv)
{
    ch_client_t *cl = NULL;
    Chorus__Envelope env = CHORUS__ENVELOPE__INIT, *resp = NULL;
    Chorus__JobQuery q = CHORUS__JOB_QUERY__INIT;
    const char *job = NULL;
    int all_history = 0;

    /* A job of more than 1,024 ranks shows its ranks per state unless asked for more. */
    ctl_args_t a;
    const char *val;
    int c;
    if (ctl_args_begin(&a, "status", ctl_opts_status, argc, argv) < 0)
        return CTL_EXIT_USAGE;
    while ((c = ctl_args_next(&a, &val)) > 0) {
        long v = 0;
        if (c == OPT_RANKS)
            q.all_ranks = 1;
        else if (c == OPT_METRICS)
            q.metrics = 1;
        else if (c == OPT_HISTORY)
            all_history = 1;
        else if (ctl_parse_long(val, c == OPT_LIMIT ? 1 : 0, UINT32_MAX, &v) < 0)
            break;
        else if (c == OPT_RANK) {
            q.rank_first = (uint32_t)v;
            q.rank_limit = 1;
        } else if (c == OPT_FIRST)
            q.rank_first = (uint32_t)v;
        else
            q.rank_limit = (uint32_t)v;
    }
    if (c < 0)
        return CTL_EXIT_USAGE;
    if (c > 0 || a.npos != 1) {
        if (c > 0)
            ctl_errf("status: bad number '%s'", val);
        ctl_usage("status");
        return CTL_EXIT_USAGE;
    }
    job = a.pos[0];
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
        ctl_job_print(resp->job_info, all_history);
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
        char esc[4 * 64 + 1];
        printf("%s: %s\n", ch_escape(esc, sizeof esc, job), what);
    }
}

int ctl_cmd_cancel(ctl_t *ctl, int argc, char **argv)
{
    Chorus__Envelope req = CHORUS__ENVELOPE__INIT, *resp = NULL;
    Chorus__Cancel c = CHORUS__CANCEL__INIT;

    int st = ctl_args_words("cancel", &argc, &argv);
    if (st != CTL_EXIT_OK)
        return st;
    if (argc != 1) {
        ctl_usage("cancel");
        return CTL_EXIT_USAGE;
    }
    c.job_id = argv[0];
    req.body_case = CHORUS__ENVELOPE__BODY_CANCEL;
    req.cancel = &c;
    st = ctl_rpc(ctl, &req, CHORUS__ENVELOPE__BODY_OK, argv[0], &resp);
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

    int st = ctl_args_words("checkpoint", &argc, &argv);
    if (st != CTL_EXIT_OK)
        return st;
    if (argc != 1) {
        ctl_usage("checkpoint");
        return CTL_EXIT_USAGE;
    }
    c.job_id = argv[0];
    req.body_case = CHORUS__ENVELOPE__BODY_CHECKPOINT;
    req.checkpoint = &c;
    st = ctl_rpc(ctl, &req, CHORUS__ENVELOPE__BODY_OK, argv[0], &resp);
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

    int st = ctl_args_words("kill-rank", &argc, &argv);
    if (st != CTL_EXIT_OK)
        return st;
    if (argc != 2 || ctl_parse_long(argv[1], 0, UINT32_MAX, &rank) < 0) {
        ctl_usage("kill-rank");
        return CTL_EXIT_USAGE;
    }
    k.job_id = argv[0];
    k.rank = (uint32_t)rank;
    req.body_case = CHORUS__ENVELOPE__BODY_KILL_RANK;
    req.kill_rank = &k;
    st = ctl_rpc(ctl, &req, CHORUS__ENVELOPE__BODY_OK, argv[0], &resp);
    if (st != CTL_EXIT_OK)
        return st;
    ch_msg_free(resp);
    print_done(ctl, argv[0], "rank_killed");
    return CTL_EXIT_OK;
}
