/* Jobs on the wire: the JobInfo of a status or list reply; see jobinfo.h. */
#include "jobinfo.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/msg.h"
#include "common/plan.h"
#include "common/util.h"
#include "coord.h"
#include "node.h"
#include "recovery.h"
#include "series.h"
#include "straggler.h"

// ---------------------------------------------------------------------------------------
// Replies

static void restart_layout(Chorus__RestartLayout *out, const ch_layout_split_t *l)
{
    chorus__restart_layout__init(out);
    out->tp = l->tp;
    out->pp = l->pp;
    out->dp = l->dp;
    out->microbatches = l->microbatches;
    out->micro_batch_size = l->micro_batch_size;
}

coord_rank_view_t coord_job_view(const coord_job_t *j, const Chorus__JobQuery *q)
{
    coord_rank_view_t v = {.first = q->rank_first, .count = q->rank_limit, .metrics = q->metrics};
    int small = j->world <= COORD_STATUS_RANKS;
    if (q->all_ranks)
        v.count = UINT32_MAX;
    else if (q->rank_limit == 0)
        v.count = small ? UINT32_MAX : 0;
    v.metrics = v.metrics || small;
    return v;
}

/* Ranks per state (the states that have any), into ji. */
static int state_counts(const coord_job_t *j, Chorus__JobInfo *ji)
{
    uint32_t count[COORD_RANK_NSTATES] = {0};
    size_t n = 0;
    for (uint32_t r = 0; j->ranks && r < j->world; r++)
        count[j->ranks[r].state]++;
    for (int s = 0; s < COORD_RANK_NSTATES; s++)
        n += count[s] > 0;
    if (n == 0)
        return 0;
    /* One block: [RankStateCount* x n][RankStateCount x n]. */
    uint8_t *b = malloc(n * (sizeof(void *) + sizeof(Chorus__RankStateCount)));
    if (!b)
        return -ENOMEM;
    Chorus__RankStateCount **sp = (Chorus__RankStateCount **)b;
    Chorus__RankStateCount *sc = (Chorus__RankStateCount *)(sp + n);
    for (int s = 0, k = 0; s < COORD_RANK_NSTATES; s++) {
        if (count[s] == 0)
            continue;
        chorus__rank_state_count__init(&sc[k]);
        sc[k].state = (char *)coord_rank_state_name((coord_rank_state_t)s);
        sc[k].count = count[s];
        sp[k] = &sc[k];
        k++;
    }
    ji->n_rank_states = n;
    ji->rank_states = sp;
    return 0;
}

/* Distinct nodes of the placed generation: by_node is sorted by node. */
static uint32_t job_nodes(const coord_job_t *j)
{
    uint32_t n = 0;
    if (!j->ranks || !j->by_node)
        return 0;
    for (uint32_t i = 0; i < j->world; i++)
        n += i == 0 || j->by_node[i].node != j->by_node[i - 1].node;
    return n;
}

/* The job's row: what ListJobs shows of every job. */
static void job_row(const coord_job_t *j, Chorus__JobInfo *ji)
{
    ji->id = (char *)j->id;
    ji->name = (char *)j->name;
    ji->kind = (char *)ch_job_kind_name(j->spec.kind);
    ji->state = (char *)coord_job_state_name(j->state);
    ji->step = j->step;
    ji->total_steps = j->total_steps;
    ji->loss = j->loss;
    ji->generation = j->generation;
    ji->restarts = j->restarts;
    ji->world_size = j->world;
    ji->tp = j->spec.parallel.tp;
    ji->pp = j->spec.parallel.pp;
    ji->dp = j->spec.parallel.dp;
    ji->last_checkpoint_step = j->last_ckpt_step;
    ji->tokens_per_s = j->tokens_per_s;
    ji->mfu = j->mfu;
    ji->reason = (char *)j->reason;
    ji->submitted_ms = j->submitted_ms;
    ji->started_ms = j->started_ms;
    ji->finished_ms = j->finished_ms;
    ji->microbatches = j->spec.parallel.microbatches;
    ji->bubble = coord_job_bubble(j);
    ji->bubble_theory = coord_job_bubble_theory(j);
    ji->val_loss = coord_job_rank_metric(j, 0, COORD_METRIC_VAL_LOSS);
    double vs = coord_job_rank_metric(j, 0, COORD_METRIC_VAL_STEP);
    ji->val_step = isfinite(vs) && vs > 0 ? (uint64_t)vs : 0;
    ji->straggler = (char *)coord_straggler_line(j, &ji->stragglers);
    ji->slow_node = (char *)coord_straggler_node_line(j, &ji->slow_nodes);
    ji->owner_uid = j->spec.owner.uid;
    ji->nodes = job_nodes(j);
}

/* The restart history. One block: [RestartInfo* x H][RestartInfo x H][RestartLayout x 2H]. */
static int history_info(const coord_job_t *j, Chorus__JobInfo *ji)
{
    if (!j->n_history)
        return 0;
    size_t h = j->n_history;
    uint8_t *hb = malloc(h * (sizeof(void *) + sizeof(Chorus__RestartInfo) +
                              2 * sizeof(Chorus__RestartLayout) +
                              COORD_PHASES * (sizeof(Chorus__Metric) + sizeof(void *))));
    if (!hb)
        return -ENOMEM;
    Chorus__RestartInfo **hp = (Chorus__RestartInfo **)hb;
    Chorus__RestartInfo *hi = (Chorus__RestartInfo *)(hp + h);
    Chorus__RestartLayout *hl = (Chorus__RestartLayout *)(hi + h);
    Chorus__Metric *pm = (Chorus__Metric *)(hl + 2 * h);
    Chorus__Metric **pp = (Chorus__Metric **)(pm + h * COORD_PHASES);
    for (size_t i = 0; i < h; i++) {
        const coord_restart_t *e = &j->history[i];
        chorus__restart_info__init(&hi[i]);
        hi[i].time_ms = e->time_ms;
        hi[i].cause = (char *)coord_cause_name(e->cause);
        hi[i].rank = e->rank;
        hi[i].node = (char *)e->node;
        hi[i].reason = (char *)e->reason;
        hi[i].failed_generation = e->failed_gen;
        hi[i].failed_step = e->failed_step;
        hi[i].resumed_from = e->resumed_from;
        hi[i].steps_lost = e->steps_lost;
        hi[i].recover_s = e->recover_s;
        hi[i].source = (char *)e->source;
        hi[i].phases = pp + i * COORD_PHASES;
        for (int k = 0; k < COORD_PHASES; k++) {
            double s = coord_phase_s(e, (coord_phase_t)k);
            if (s < 0)
                continue;
            Chorus__Metric *m = &pm[i * COORD_PHASES + hi[i].n_phases];
            chorus__metric__init(m);
            m->name = (char *)coord_phase_name((coord_phase_t)k);
            m->value = s;
            hi[i].phases[hi[i].n_phases++] = m;
        }
        if (e->layout_to.dp) {
            restart_layout(&hl[2 * i], &e->layout_from);
            restart_layout(&hl[2 * i + 1], &e->layout_to);
            hi[i].layout_from = &hl[2 * i];
            hi[i].layout_to = &hl[2 * i + 1];
        }
        hp[i] = &hi[i];
    }
    ji->n_history = h;
    ji->history = hp;
    return 0;
}

/* Rank r's place in the layout, as a RankPlace. */
static void rank_place(const coord_job_t *j, uint32_t r, Chorus__RankPlace *out)
{
    coord_rank_place_t pl = coord_job_rank_place(j, r);
    ch_msg_place_to_pb(&pl.at, out);
    out->reported = pl.reported != 0;
}

/* A rank's last step's time breakdown, as a StepTime. */
static void step_time(const coord_step_time_t *t, Chorus__StepTime *out)
{
    chorus__step_time__init(out);
    out->step_s = t->step_s;
    out->compute = t->compute;
    out->tp = t->tp;
    out->pp_wait = t->pp_wait;
    out->zero = t->zero;
    out->optim = t->optim;
    out->idle = t->idle;
    out->bubble = t->bubble;
}

/* The ranks in view, with their places, step times and (view->metrics) figures. */
/* checkpoint.memory_every: which rank holds each rank's in-memory copy (the rule the ranks
 * apply, over their nodes), into copy[world]; all -1 when off. */
static int memory_copies(const coord_job_t *j, int64_t *copy)
{
    int rc = 0;
    if (j->spec.kind != CH_JOB_TRAIN || j->spec.checkpoint.memory_every <= 0) {
        for (uint32_t k = 0; k < j->world; k++)
            copy[k] = -1;
        return 0;
    }
    uint64_t *nodes = calloc(j->world ? j->world : 1, sizeof *nodes);
    if (!nodes)
        return -ENOMEM;
    for (uint32_t k = 0; k < j->world; k++)
        nodes[k] = (uint64_t)(uintptr_t)j->ranks[k].node; /* one node, one value */
    rc = ch_plan_memckpt_buddies(nodes, j->world, copy);
    free(nodes);
    return rc;
}

static int ranks_info(const coord_job_t *j, const coord_rank_view_t *view, Chorus__JobInfo *ji)
{
    if (!j->ranks)
        return 0;
    /* The ranks in view: [first, first + w). */
    size_t first = view->first < j->world ? view->first : j->world;
    size_t w = j->world - first, m = 0;
    if (view->count < w)
        w = view->count;
    ji->ranks_first = (uint32_t)first;
    ji->ranks_partial = w < j->world;
    if (w == 0)
        return 0;

    /* One block: [RankInfo* x W][RankInfo x W][RankPlace x W][StepTime x W]
     * [Metric* x M][Metric x M]. */
    for (size_t r = first; view->metrics && r < first + w; r++)
        m += j->ranks[r].n_metrics;
    uint8_t *block = malloc(w * (sizeof(void *) + sizeof(Chorus__RankInfo) +
                                 sizeof(Chorus__RankPlace) + sizeof(Chorus__StepTime)) +
                            m * (sizeof(void *) + sizeof(Chorus__Metric)));
    if (!block)
        return -ENOMEM;
    int64_t *copy = calloc(j->world, sizeof *copy);
    if (!copy || memory_copies(j, copy) < 0) {
        free(copy);
        free(block);
        return -ENOMEM;
    }
    Chorus__RankInfo **rp = (Chorus__RankInfo **)block;
    Chorus__RankInfo *ri = (Chorus__RankInfo *)(rp + w);
    Chorus__RankPlace *pi = (Chorus__RankPlace *)(ri + w);
    Chorus__StepTime *ti = (Chorus__StepTime *)(pi + w);
    Chorus__Metric **mp = (Chorus__Metric **)(ti + w);
    Chorus__Metric *mi = (Chorus__Metric *)(mp + m);
    int train = j->spec.kind == CH_JOB_TRAIN;
    for (size_t r = 0; r < w; r++) {
        const coord_rank_t *rk = &j->ranks[first + r];
        chorus__rank_info__init(&ri[r]);
        ri[r].rank = (uint32_t)(first + r);
        ri[r].node = (char *)rk->node->name;
        ri[r].state = (char *)coord_rank_state_name(rk->state);
        ri[r].step = rk->step;
        ri[r].exit_code = rk->exit_code;
        ri[r].signal = rk->signal;
        ri[r].memory_copy_rank = copy[first + r];
        if (train) {
            rank_place(j, (uint32_t)(first + r), &pi[r]);
            ri[r].place = &pi[r];
        }
        if (rk->time.step_s > 0) {
            step_time(&rk->time, &ti[r]);
            ri[r].time = &ti[r];
        }
        size_t nm = view->metrics ? rk->n_metrics : 0;
        ri[r].n_metrics = nm;
        ri[r].metrics = mp;
        for (size_t k = 0; k < nm; k++) {
            chorus__metric__init(mi);
            mi->name = (char *)rk->metrics[k].name;
            mi->value = rk->metrics[k].value;
            *mp++ = mi++;
        }
        rp[r] = &ri[r];
    }
    free(copy);
    ji->n_ranks = w;
    ji->ranks = rp;
    return 0;
}

int coord_job_info(const coord_job_t *j, const coord_rank_view_t *view, Chorus__JobInfo *ji)
{
    chorus__job_info__init(ji);
    job_row(j, ji);
    if (!view)
        return 0;
    ji->job_ini = j->ini;
    if (state_counts(j, ji) < 0 || history_info(j, ji) < 0 || ranks_info(j, view, ji) < 0) {
        coord_job_info_clear(ji);
        return -ENOMEM;
    }
    return 0;
}

void coord_job_info_clear(Chorus__JobInfo *ji)
{
    free(ji->ranks); /* the whole block */
    ji->ranks = NULL;
    ji->n_ranks = 0;
    free(ji->history); /* its block */
    ji->history = NULL;
    ji->n_history = 0;
    free(ji->rank_states); /* its block */
    ji->rank_states = NULL;
    ji->n_rank_states = 0;
}
