/* Per-node progress: applying a NodeProgress; see progress.h. */
#include "progress.h"

#include "common/util.h"
#include "jobevent.h"
#include "node.h"
#include "straggler.h"

/* The RANK_PROGRESS event rank's summary s stands for: step, total, the step's time and
 * compute (the straggler input) and the step_ms metric (the heat map). The rest of its
 * breakdown (tp, pp wait, ZeRO, optimizer, idle, bubble) is what its last full report said:
 * a summary refreshes the step, it does not zero what only the detail carries. ev is the
 * message's event, its job fields set (progress_apply): each rank's fields are all
 * written here, so one initialised event serves the node's ranks. */
static void apply_summary(coord_t *c, coord_job_t *j, coord_node_t *from, Chorus__RankEvent *ev,
                          uint32_t rank, const Chorus__RankSummary *s)
{
    Chorus__Metric m = CHORUS__METRIC__INIT, *mp = &m;
    coord_step_time_t t = {0};
    ev->rank = rank;
    ev->step = s->step;
    ev->step_s = s->step_s;
    ev->t_compute = s->t_compute;
    if (j && j->ranks && j->generation == ev->generation && rank < j->world &&
        j->ranks[rank].node == from) {
        t = j->ranks[rank].time;
        /* every step's figure since the node's last report: the ones before the latest go
         * to the detector here, the latest with the event */
        int tps = s->n_tps == s->n_computes;
        if (s->n_computes && j->state != COORD_JOB_RECOVERING)
            coord_straggler_figures(j, rank, s->step, s->computes, tps ? s->tps : NULL,
                                    s->n_computes - 1);
        if (s->n_computes && tps)
            t.tp = s->tps[s->n_tps - 1];
    }
    ev->t_tp = t.tp;
    ev->t_pp_wait = t.pp_wait;
    ev->t_zero = t.zero;
    ev->t_optim = t.optim;
    ev->t_idle = t.idle;
    ev->bubble = t.bubble;
    ev->metrics = NULL;
    ev->n_metrics = 0;
    if (s->step_ms > 0) {
        m.name = "step_ms";
        m.value = s->step_ms;
        ev->metrics = &mp;
        ev->n_metrics = 1;
    }
    coord_job_rank_event_in(c, j, from, ev);
}

/* Full reports of one kind the node sent for its ranks, each as if it came alone: the node
 * speaks for its ranks, not for other jobs, so the envelope's job holds. */
static void apply_events(coord_t *c, coord_job_t *j, coord_node_t *from,
                         const Chorus__NodeProgress *np, Chorus__RankEvent *const *evs, size_t n,
                         Chorus__RankEventKind kind)
{
    for (size_t i = 0; i < n; i++) {
        Chorus__RankEvent ev = *evs[i];
        if (ev.kind != kind)
            continue;
        ev.job_id = np->job_id;
        ev.generation = np->generation;
        ev.launch_token = np->launch_token;
        coord_job_rank_event_in(c, j, from, &ev);
    }
}

void coord_progress_apply(coord_t *c, coord_node_t *from, const Chorus__NodeProgress *np)
{
    if (!np->job_id)
        return;
    coord_job_t *j = coord_job_find_id(c, np->job_id);
    Chorus__RankEvent ev = CHORUS__RANK_EVENT__INIT;
    ev.job_id = np->job_id;
    ev.generation = np->generation;
    ev.launch_token = np->launch_token;
    ev.kind = CHORUS__RANK_EVENT_KIND__RANK_PROGRESS;
    ev.total_steps = np->total_steps;
    if (np->common)
        for (size_t i = 0; i < np->n_ranks; i++)
            apply_summary(c, j, from, &ev, np->ranks[i], np->common);
    for (size_t i = 0; i < np->n_differ; i++)
        apply_summary(c, j, from, &ev, np->differ[i]->rank, np->differ[i]);
    apply_events(c, j, from, np, np->detail, np->n_detail, CHORUS__RANK_EVENT_KIND__RANK_PROGRESS);
    /* Checkpoint reports after the progress, as when each came alone after the flush of
     * what was held before it (workerd/progress.h). */
    apply_events(c, j, from, np, np->checkpoints, np->n_checkpoints,
                 CHORUS__RANK_EVENT_KIND__RANK_CHECKPOINT);
}

void coord_progress_want_detail(coord_t *c, coord_job_t *j)
{
    uint64_t now = ch_now_ms();
    if (!j->ranks || !coord_job_is_active(j) ||
        (j->detail_asked_ms && now - j->detail_asked_ms < COORD_PROGRESS_DETAIL_MS))
        return;
    j->detail_asked_ms = now;
    Chorus__ProgressDetail pd = CHORUS__PROGRESS_DETAIL__INIT;
    Chorus__Envelope env = CHORUS__ENVELOPE__INIT;
    pd.job_id = j->id;
    env.body_case = CHORUS__ENVELOPE__BODY_PROGRESS_DETAIL;
    env.progress_detail = &pd;
    /* Placement keeps a node's ranks together: one message a node, give or take. */
    const coord_node_t *last = NULL;
    for (uint32_t r = 0; r < j->world; r++) {
        coord_node_t *n = j->ranks[r].node;
        if (!n || n == last)
            continue;
        last = n;
        (void)coord_node_send(n, &env);
    }
    (void)c;
}
