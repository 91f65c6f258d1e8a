/* Jobs: what the workers report (rank events, re-registration, node death) and the
 * re-adoption deadline; see jobevent.h. */
#include "jobevent.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/msg.h"
#include "common/log.h"
#include "common/util.h"
#include "coord.h"
#include "recovery.h"
#include "series.h"
#include "straggler.h"

/* A job's progress (step, loss) is stored on its own at most this often; it also rides
 * along with every state change and checkpoint commit, which are stored at once. The step
 * is informational: a restart resumes from the committed checkpoint (store.c says what is
 * journaled and why). */
#define COORD_PROGRESS_STORE_MS 60000

// ---------------------------------------------------------------------------------------
// Rank events

static void mark_started(coord_t *c, coord_job_t *j, uint32_t rank)
{
    coord_rank_t *r = &j->ranks[rank];
    if (r->state != COORD_RANK_PENDING && r->state != COORD_RANK_UNKNOWN)
        return;
    coord_rank_set_state(c, j, rank, COORD_RANK_RUNNING, NULL);
    if (j->n_started == j->world && j->grace_deadline) {
        CH_LOGI("job", "job=%s gen=%" PRIu64 " re-adopted all %u ranks", j->id, j->generation,
                j->world);
        j->grace_deadline = 0;
    }
    if (j->n_started == j->world && j->state == COORD_JOB_STARTING)
        coord_job_set_state(c, j, COORD_JOB_RUNNING, NULL);
    if (j->n_started == j->world)
        coord_recovery_phase(c, j, COORD_PHASE_STARTED);
}

/* Room for one more figure: slots double from 2 up to COORD_RANK_METRICS. */
static int metrics_grow(coord_rank_t *r)
{
    uint32_t cap = r->cap_metrics ? 2 * r->cap_metrics : 2;
    if (cap > COORD_RANK_METRICS)
        cap = COORD_RANK_METRICS;
    coord_metric_t *m = realloc(r->metrics, cap * sizeof(*m));
    if (!m)
        return -ENOMEM;
    r->metrics = m;
    r->cap_metrics = cap;
    return 0;
}

/* The slot of r's figure name, n_metrics if none. A node's summaries bring one figure
 * (step_ms), full reports theirs in the same order each time: the slot written last, then
 * the next, is where it usually is. */
static size_t metric_slot(const coord_rank_t *r, const char *name)
{
    size_t n = r->n_metrics, k = r->metric_hint < n ? r->metric_hint : 0;
    for (size_t tries = 0; tries < n; tries++, k = k + 1 < n ? k + 1 : 0)
        if (strcmp(r->metrics[k].name, name) == 0)
            return k;
    return n;
}

static void copy_metrics(const coord_job_t *j, coord_rank_t *r, uint32_t rank,
                         const Chorus__RankEvent *ev)
{
    for (size_t i = 0; i < ev->n_metrics; i++) {
        const Chorus__Metric *m = ev->metrics[i];
        if (!m->name || !*m->name)
            continue;
        size_t k = metric_slot(r, m->name);
        if (k == r->n_metrics) {
            if (k == COORD_RANK_METRICS) {
                CH_LOGW("job", "job=%s gen=%" PRIu64 " rank=%u metric %s dropped: a rank keeps %d",
                        j->id, j->generation, rank, m->name, COORD_RANK_METRICS);
                continue;
            }
            if (k == r->cap_metrics && metrics_grow(r) < 0) {
                CH_LOGW("job", "job=%s gen=%" PRIu64 " rank=%u metric %s dropped: out of memory",
                        j->id, j->generation, rank, m->name);
                continue;
            }
            snprintf(r->metrics[k].name, sizeof(r->metrics[k].name), "%s", m->name);
            r->n_metrics++;
        }
        r->metrics[k].value = m->value;
        r->metric_hint = (uint8_t)k;
    }
}

/* RANK_STARTED of a training rank: its place in the layout, as it computed it. */
static void on_started(coord_job_t *j, uint32_t rank, const Chorus__RankEvent *ev)
{
    if (!ev->placed)
        return;
    coord_rank_place_t *p = &j->ranks[rank].place;
    p->reported = 0;
    const ch_place_t want = coord_job_rank_place(j, rank).at; /* from the layout */
    ch_msg_place_from_event(ev, &p->at);
    p->reported = 1;
    const ch_place_t *got = &p->at;
    if (want.coord.tp != got->coord.tp || want.coord.pp != got->coord.pp ||
        want.coord.dp != got->coord.dp || want.first_block != got->first_block ||
        want.blocks != got->blocks)
        CH_LOGW("job",
                "job=%s gen=%" PRIu64 " rank=%u reports tp %u pp %u dp %u blocks %u+%u, the "
                "layout says tp %u pp %u dp %u blocks %u+%u",
                j->id, j->generation, rank, got->coord.tp, got->coord.pp, got->coord.dp,
                got->first_block, got->blocks, want.coord.tp, want.coord.pp, want.coord.dp,
                want.first_block, want.blocks);
}

/* The latest step's time breakdown: one rank's figures replace its previous ones. */
static void store_step_time(coord_job_t *j, coord_rank_t *r, const Chorus__RankEvent *ev)
{
    if (!(ev->step_s > 0))
        return;
    j->time_stamp++; /* the cached mean bubble is stale (coord_job_bubble) */
    r->time = (coord_step_time_t){.step_s = ev->step_s,
                                  .compute = ev->t_compute,
                                  .tp = ev->t_tp,
                                  .pp_wait = ev->t_pp_wait,
                                  .zero = ev->t_zero,
                                  .optim = ev->t_optim,
                                  .idle = ev->t_idle,
                                  .bubble = ev->bubble};
}

static void on_progress(coord_t *c, coord_job_t *j, uint32_t rank, const Chorus__RankEvent *ev)
{
    coord_rank_t *r = &j->ranks[rank];
    if (j->state == COORD_JOB_RECOVERING)
        return; /* the failed generation's last words */
    r->step = ev->step;
    r->progress_ms = coord_turn_ms(c);
    copy_metrics(j, r, rank, ev);
    store_step_time(j, r, ev);
    coord_straggler_step(c, j, rank);
    coord_series_progress(c, j, rank, ev);
    if (ev->step > j->step)
        j->step = ev->step;
    if (ev->total_steps)
        j->total_steps = ev->total_steps;
    if (rank == 0) { /* rank 0 reports the job-level figures */
        j->loss = ev->loss;
        j->tokens_per_s = ev->tokens_per_s;
        j->mfu = ev->mfu;
        uint64_t now = coord_turn_ms(c);
        if (now - j->progress_stored_ms >= COORD_PROGRESS_STORE_MS) {
            j->progress_stored_ms = now;
            coord_job_store(c, j);
        }
    }
    CH_LOGD("job", "job=%s gen=%" PRIu64 " rank=%u step=%" PRIu64 " loss=%.4f", j->id,
            j->generation, rank, ev->step, ev->loss);
    if (rank == 0 && ev->resume_source && *ev->resume_source)
        coord_recovery_resumed(c, j, ev->resume_source, ev->resumed_step);
    coord_recovery_progress(c, j);
}

/* A rank reports checkpoint step s only after eng_trainer_checkpoint returned, and that
 * returns on every rank only once rank 0 has written manifest.json, which it writes after
 * gathering every rank's shard size and checksum (DESIGN §8). So one report proves the
 * whole step is on disk: the step is committed at the first report of it. Waiting for
 * every rank's report lost committed steps when a node died while the coordinator was
 * down (its queued reports died with it, and recovery went back a whole interval). */
static void on_checkpoint(coord_t *c, coord_job_t *j, coord_rank_t *r, const Chorus__RankEvent *ev)
{
    int64_t s = (int64_t)ev->step;
    r->progress_ms = coord_turn_ms(c); /* writing it was work too */
    if (s <= r->ckpt_step)
        return;
    r->ckpt_step = s;
    if (s > j->last_ckpt_step) {
        char what[96];
        j->last_ckpt_step = s;
        snprintf(what, sizeof(what), "checkpoint step %" PRId64 " committed", j->last_ckpt_step);
        CH_LOGI("job", "job=%s gen=%" PRIu64 " %s", j->id, j->generation, what);
        coord_job_store(c, j);
        coord_event(c, j->id, j->generation, -1, NULL, what);
    }
}

/* Every rank finished its work: completed, unless the loss it ended with is not a number
 * (fault.nonfinite = skip dropped the last updates): a job never completes so. */
static void job_finished(coord_t *c, coord_job_t *j)
{
    char why[160];
    if (j->spec.kind != CH_JOB_TRAIN || isfinite(j->loss)) {
        coord_job_set_state(c, j, COORD_JOB_COMPLETED, NULL);
        return;
    }
    snprintf(why, sizeof why, "ended with a non-finite loss (%g) at step %" PRIu64, j->loss,
             j->step);
    coord_job_fail(c, j, why);
}

static void on_exited(coord_t *c, coord_job_t *j, uint32_t rank, const Chorus__RankEvent *ev)
{
    coord_rank_t *r = &j->ranks[rank];
    char reason[256];
    if (!coord_rank_holds(r->state))
        return;
    r->exit_code = ev->exit_code;
    r->signal = ev->signal;
    int clean = ev->signal == 0 && ev->exit_code == 0;
    int done = r->state == COORD_RANK_DONE;
    coord_rank_set_state(c, j, rank, clean && done ? COORD_RANK_EXITED : COORD_RANK_FAILED,
                         "exited");
    CH_LOGI("job", "job=%s gen=%" PRIu64 " rank=%u node=%s exited (code %d, signal %d)", j->id,
            j->generation, rank, r->node->name, ev->exit_code, ev->signal);
    if (!coord_job_is_active(j))
        return;
    if (clean && done && j->state != COORD_JOB_RECOVERING) {
        if (++j->n_finished == j->world)
            job_finished(c, j);
        return;
    }
    if (ev->signal)
        snprintf(reason, sizeof(reason), "rank %u on node %s killed by signal %d", rank,
                 r->node->name, ev->signal);
    else if (ev->exit_code)
        snprintf(reason, sizeof(reason), "rank %u on node %s exited with code %d", rank,
                 r->node->name, ev->exit_code);
    else
        snprintf(reason, sizeof(reason), "rank %u on node %s exited before finishing its work",
                 rank, r->node->name);
    coord_recovery_failure(c, j, COORD_CAUSE_RANK_EXIT, rank, r->node->name, reason);
}

/* Tell the worker it may forget a rank's final report (it keeps it until then). */
static void ack_exit(coord_node_t *n, const char *job, uint64_t gen, uint32_t rank)
{
    Chorus__RankExitAck ack = CHORUS__RANK_EXIT_ACK__INIT;
    Chorus__Envelope env = CHORUS__ENVELOPE__INIT;
    ack.job_id = (char *)job;
    ack.generation = gen;
    ack.rank = rank;
    env.body_case = CHORUS__ENVELOPE__BODY_RANK_EXIT_ACK;
    env.rank_exit_ack = &ack;
    coord_node_send(n, &env);
}

/* A rank of an older generation spoke: it should not be alive. */
static void kill_stale(coord_node_t *n, const char *job, uint64_t gen, uint32_t rank)
{
    CH_LOGI("job", "job=%s gen=%" PRIu64 " rank=%u node=%s stale rank alive: killing it", job, gen,
            rank, n->name);
    coord_job_send_kill(n, job, gen, &rank, "a rank of an older generation");
}

void coord_job_rank_event(coord_t *c, coord_node_t *from, const Chorus__RankEvent *ev)
{
    coord_job_rank_event_in(c, coord_job_find_id(c, ev->job_id), from, ev);
}

void coord_job_rank_event_in(coord_t *c, coord_job_t *j, coord_node_t *from,
                             const Chorus__RankEvent *ev)
{
    int exited = ev->kind == CHORUS__RANK_EVENT_KIND__RANK_EXITED;
    if (exited) /* acknowledged once seen, whatever becomes of it: it is never sent again */
        ack_exit(from, ev->job_id, ev->generation, ev->rank);
    if (!j || !j->ranks) {
        CH_LOGD("job", "job=%s node=%s event for an unknown job dropped", ev->job_id, from->name);
        return;
    }
    if (ev->generation != j->generation) { /* fencing */
        CH_LOGD("job",
                "job=%s gen=%" PRIu64 " rank=%u node=%s stale event dropped (current gen %" PRIu64
                ")",
                j->id, ev->generation, ev->rank, from->name, j->generation);
        if (ev->generation < j->generation && !exited)
            kill_stale(from, j->id, ev->generation, ev->rank);
        return;
    }
    if (ev->rank >= j->world || j->ranks[ev->rank].node != from) {
        CH_LOGW("job",
                "job=%s gen=%" PRIu64 " rank=%u node=%s event for a rank not placed there dropped",
                j->id, ev->generation, ev->rank, from->name);
        return;
    }
    coord_rank_t *r = &j->ranks[ev->rank];
    if (r->state == COORD_RANK_LOST)
        return;
    switch (ev->kind) {
    case CHORUS__RANK_EVENT_KIND__RANK_STARTED:
        CH_LOGD("job", "job=%s gen=%" PRIu64 " rank=%u node=%s started", j->id, j->generation,
                ev->rank, from->name);
        on_started(j, ev->rank, ev);
        mark_started(c, j, ev->rank);
        break;
    case CHORUS__RANK_EVENT_KIND__RANK_PROGRESS:
        mark_started(c, j, ev->rank);
        if (ev->phase == 1 || ev->phase == 2) /* before its first step: no progress yet */
            coord_recovery_phase(c, j, ev->phase == 1 ? COORD_PHASE_COMM : COORD_PHASE_LOADED);
        else
            on_progress(c, j, ev->rank, ev);
        break;
    case CHORUS__RANK_EVENT_KIND__RANK_CHECKPOINT:
        on_checkpoint(c, j, r, ev);
        break;
    case CHORUS__RANK_EVENT_KIND__RANK_DONE:
        mark_started(c, j, ev->rank);
        if (r->state == COORD_RANK_RUNNING)
            coord_rank_set_state(c, j, ev->rank, COORD_RANK_DONE, NULL);
        if (ev->step)
            r->step = ev->step;
        copy_metrics(j, r, ev->rank, ev);
        CH_LOGD("job", "job=%s gen=%" PRIu64 " rank=%u node=%s done", j->id, j->generation,
                ev->rank, from->name);
        break;
    case CHORUS__RANK_EVENT_KIND__RANK_EXITED:
        on_exited(c, j, ev->rank, ev);
        break;
    case CHORUS__RANK_EVENT_KIND__RANK_FAILED: {
        char reason[400];
        if (coord_rank_holds(r->state))
            coord_rank_set_state(c, j, ev->rank, COORD_RANK_FAILING, "reported a failure");
        const char *msg = ev->message && *ev->message ? ev->message : "no reason given";
        coord_recovery_rank_failed(c, j, ev->rank, ev->cause_class, ev->before_first_step, msg);
        if (ev->nonfinite_batch)
            coord_recovery_rewind(c, j, ev->rank, ev->nonfinite_batch - 1);
        if (ev->timeout_group && *ev->timeout_group && ev->timeout_peer < j->world) {
            coord_recovery_timeout(c, j, ev->rank, ev);
            /* A collective timed out: the rank it waited for is the culprit. */
            const coord_rank_t *p = &j->ranks[ev->timeout_peer];
            snprintf(reason, sizeof(reason),
                     "collective timeout in group %s: rank %u on node %s waited for rank %u on "
                     "node %s (%s)",
                     ev->timeout_group, ev->rank, from->name, ev->timeout_peer, p->node->name, msg);
            coord_recovery_failure(c, j, COORD_CAUSE_COLLECTIVE, ev->timeout_peer, p->node->name,
                                   reason);
            break;
        }
        snprintf(reason, sizeof(reason), "rank %u on node %s failed: %s", ev->rank, from->name,
                 msg);
        coord_recovery_failure(c, j, COORD_CAUSE_RANK_FAILED, ev->rank, from->name, reason);
        break;
    }
    default:
        CH_LOGD("job", "job=%s rank=%u unknown event kind %d dropped", j->id, ev->rank, ev->kind);
        break;
    }
}

// ---------------------------------------------------------------------------------------
// Node events: death, re-registration, re-adoption deadline

/* Mark lost every rank of j placed on n that still holds its slot, but those seen in
 * re-registration `stamp` (0: none is spared); the first such rank, or -1. */
static int64_t lose_ranks_on(coord_t *c, coord_job_t *j, const coord_node_t *n, uint64_t stamp,
                             const char *reason)
{
    int64_t first = -1;
    size_t lo, hi;
    coord_job_ranks_on(j, n, &lo, &hi);
    for (size_t k = lo; k < hi; k++) {
        uint32_t r = coord_job_rank_at(j, k);
        coord_rank_t *rk = &j->ranks[r];
        if (rk->node != n || !coord_rank_holds(rk->state) || (stamp && rk->seen == stamp))
            continue;
        coord_rank_set_state(c, j, r, COORD_RANK_LOST, reason);
        if (first < 0)
            first = r;
    }
    return first;
}

void coord_job_node_dead(coord_t *c, coord_node_t *n, const char *why)
{
    char reason[256];
    snprintf(reason, sizeof(reason), "node %s dead: %s", n->name, why);
    for (size_t i = 0; i < c->jobs.n; i++) {
        coord_job_t *j = c->jobs.v[i];
        int64_t hit = lose_ranks_on(c, j, n, 0, reason);
        if (hit >= 0)
            coord_recovery_failure(c, j, COORD_CAUSE_NODE_LOST, hit, n->name, reason);
    }
}

static void kill_unknown(coord_node_t *n, const Chorus__RankRef *ref)
{
    CH_LOGI("job", "job=%s gen=%" PRIu64 " rank=%u node=%s not current: killing it", ref->job_id,
            ref->generation, ref->rank, n->name);
    coord_job_send_kill(n, ref->job_id, ref->generation, NULL,
                        "not a current rank of the coordinator");
}

/* A rank n reported as running or finished at registration: 1 when it is a current rank
 * of an active job placed there (and still holding its slot). */
static coord_job_t *placed_here(coord_t *c, coord_node_t *n, const Chorus__RankRef *ref)
{
    coord_job_t *j = coord_job_find_id(c, ref->job_id);
    if (j && j->ranks && ref->generation == j->generation && ref->rank < j->world &&
        j->ranks[ref->rank].node == n && coord_rank_holds(j->ranks[ref->rank].state) &&
        coord_job_is_active(j))
        return j;
    return NULL;
}

/* A rank that finished while we could not hear it (a coordinator restart, a lost link):
 * apply its final report as if it had arrived then. */
static void apply_finished(coord_t *c, coord_node_t *n, const Chorus__RankRef *ref)
{
    coord_job_t *j = placed_here(c, n, ref);
    ack_exit(n, ref->job_id, ref->generation, ref->rank);
    if (!j)
        return;
    Chorus__RankEvent ev = CHORUS__RANK_EVENT__INIT;
    ev.job_id = ref->job_id;
    ev.generation = ref->generation;
    ev.rank = ref->rank;
    CH_LOGI("job", "job=%s gen=%" PRIu64 " rank=%u node=%s final report resent (%s, code %d)",
            j->id, j->generation, ref->rank, n->name, ref->done ? "done" : "not done",
            ref->exit_code);
    if (ref->done) {
        mark_started(c, j, ref->rank);
        if (j->ranks[ref->rank].state == COORD_RANK_RUNNING)
            coord_rank_set_state(c, j, ref->rank, COORD_RANK_DONE, "final report resent");
    }
    ev.exit_code = ref->exit_code;
    ev.signal = ref->signal;
    on_exited(c, j, ref->rank, &ev);
}

void coord_job_node_registered(coord_t *c, coord_node_t *n, const Chorus__Register *reg)
{
    uint64_t stamp = ++c->stamp;
    size_t n_running = reg->n_running;
    Chorus__RankRef *const *running = reg->running;

    for (size_t i = 0; i < n_running; i++) {
        const Chorus__RankRef *ref = running[i];
        coord_job_t *j = placed_here(c, n, ref);
        if (j) {
            coord_rank_t *r = &j->ranks[ref->rank];
            r->seen = stamp;
            if (j->state == COORD_JOB_RECOVERING) {
                /* Its generation failed while this node was out of reach: it goes now,
                 * and holds its slot until its exit is reported. */
                kill_stale(n, j->id, j->generation, ref->rank);
                mark_started(c, j, ref->rank); /* known alive: not lost at the grace's end */
                continue;
            }
            if (r->state == COORD_RANK_UNKNOWN)
                CH_LOGI("job", "job=%s gen=%" PRIu64 " rank=%u node=%s re-adopted (pid %d)", j->id,
                        j->generation, ref->rank, n->name, ref->pid);
            mark_started(c, j, ref->rank);
            continue;
        }
        if (i == 0 || strcmp(ref->job_id, running[i - 1]->job_id) != 0 ||
            ref->generation != running[i - 1]->generation)
            kill_unknown(n, ref);
    }
    for (size_t i = 0; i < reg->n_finished; i++)
        apply_finished(c, n, reg->finished[i]);
    /* Ranks placed on n that it did not report are gone. */
    for (size_t i = 0; i < c->jobs.n; i++) {
        coord_job_t *j = c->jobs.v[i];
        int64_t lost = lose_ranks_on(c, j, n, stamp, "not re-reported by its node");
        if (lost >= 0 && coord_job_is_active(j)) {
            char reason[256];
            coord_cause_t cause = COORD_CAUSE_WORKER_RESTART;
            if (j->grace_deadline) {
                cause = COORD_CAUSE_COORD_RESTART;
                snprintf(reason, sizeof(reason),
                         "ranks lost while the coordinator was down (rank %" PRId64
                         " not re-reported by node %s)",
                         lost, n->name);
            } else {
                snprintf(reason, sizeof(reason),
                         "rank %" PRId64 " lost: node %s re-registered without it", lost, n->name);
            }
            coord_recovery_failure(c, j, cause, lost, n->name, reason);
        }
    }
}

void coord_job_check(coord_t *c, uint64_t now_ms)
{
    for (size_t i = 0; i < c->jobs.n; i++) {
        coord_job_t *j = c->jobs.v[i];
        if (j->grace_deadline && now_ms >= j->grace_deadline) {
            j->grace_deadline = 0;
            coord_changed(c); /* a recovering job may restart now */
            /* Nodes that did not come back within the grace: their ranks are gone. */
            int64_t lost = -1;
            for (uint32_t r = 0; j->ranks && r < j->world; r++) {
                if (j->ranks[r].state != COORD_RANK_UNKNOWN)
                    continue;
                coord_rank_set_state(c, j, r, COORD_RANK_LOST, "not re-reported within the grace");
                if (lost < 0)
                    lost = r;
            }
            if (lost >= 0 && coord_job_is_active(j)) {
                char reason[160];
                snprintf(reason, sizeof(reason),
                         "ranks lost while the coordinator was down (rank %" PRId64
                         " on node %s not re-reported)",
                         lost, j->ranks[lost].node->name);
                coord_recovery_failure(c, j, COORD_CAUSE_COORD_RESTART, lost,
                                       j->ranks[lost].node->name, reason);
            }
        }
        coord_recovery_check(c, j, now_ms);
    }
}
