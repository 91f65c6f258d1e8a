/* Recovery: failure causes, restart decisions, restart history, hang detection; see
 * recovery.h. job.c owns the job and rank state machines; this file decides what a
 * failure does to them and keeps the record of it. */
#include "recovery.h"

#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/log.h"
#include "common/skipsteps.h"
#include "common/util.h"
#include "coord.h"
#include "scheduler.h"

/* How long the kill of a generation waits, after a rank's report of a cause no restart
 * changes, for the other nodes' ranks to report theirs. They meet it within moments of
 * each other (a missing data file is opened right after the same rendezvous), and the
 * ranks that fail exit on their own, so the wait rarely runs out. */
#define LASTING_WAIT_MS 2000
/* The same wait serves a collective timeout: the other members that entered the
 * collective time out within moments of the first and report what they had entered. */

static const char *const CAUSES[COORD_CAUSE_NCAUSES] = {
    "rank_exit", "rank_failed",     "collective_timeout",  "hang",
    "node_lost", "workerd_restart", "coordinator_restart", "straggler"};

const char *coord_cause_name(coord_cause_t cause)
{
    return cause < COORD_CAUSE_NCAUSES ? CAUSES[cause] : "?";
}

static coord_cause_t cause_parse(const char *name)
{
    for (int k = 0; k < COORD_CAUSE_NCAUSES; k++)
        if (strcmp(name, CAUSES[k]) == 0)
            return (coord_cause_t)k;
    return COORD_CAUSE_RANK_FAILED;
}

// ---------------------------------------------------------------------------------------
// History

/* The store's text of a layout: "tp,pp,dp,microbatches,micro_batch_size"; "" for none. */
static void layout_store_text(const ch_layout_split_t *l, char *out, size_t len)
{
    if (!l->dp)
        out[0] = '\0';
    else
        snprintf(out, len, "%u,%u,%u,%u,%u", l->tp, l->pp, l->dp, l->microbatches,
                 l->micro_batch_size);
}

/* Its inverse; a text that is not one leaves *l none (dp 0). */
static void layout_store_parse(const char *s, ch_layout_split_t *l)
{
    ch_layout_split_t v = {0};
    memset(l, 0, sizeof *l);
    if (s &&
        sscanf(s, "%u,%u,%u,%u,%u", &v.tp, &v.pp, &v.dp, &v.microbatches, &v.micro_batch_size) == 5)
        *l = v;
}

static void store_restart(coord_t *c, const coord_job_t *j, uint32_t idx)
{
    const coord_restart_t *h = &j->history[idx];
    char from[64], to[64];
    layout_store_text(&h->layout_from, from, sizeof from);
    layout_store_text(&h->layout_to, to, sizeof to);
    coord_restart_rec_t rec = {
        .job_seq = j->seq,
        .idx = idx,
        .time_ms = h->time_ms,
        .cause = coord_cause_name(h->cause),
        .node = h->node,
        .reason = h->reason,
        .rank = h->rank,
        .failed_gen = h->failed_gen,
        .failed_step = h->failed_step,
        .resumed_from = h->resumed_from,
        .steps_lost = h->steps_lost,
        .recover_s = h->recover_s,
        .layout_from = from,
        .layout_to = to,
        .source = h->source,
    };
    coord_store_restart_put(c->store, &rec); /* a failure is logged by the store */
}

static coord_restart_t *history_add(coord_job_t *j)
{
    coord_restart_t *v = realloc(j->history, (j->n_history + 1) * sizeof(*v));
    if (!v)
        return NULL;
    j->history = v;
    coord_restart_t *h = &v[j->n_history++];
    memset(h, 0, sizeof(*h));
    h->rank = -1;
    h->resumed_from = -1;
    h->recover_s = -1;
    return h;
}

/* The entry of the restart under way: the last one, while its resume is pending or its
 * first step has not completed. */
static coord_restart_t *current(coord_job_t *j)
{
    return j->n_history ? &j->history[j->n_history - 1] : NULL;
}

/* "gave up after 2 restarts (fault.max_restarts = 2): rank_exit: ...; hang: ...". */
static void every_cause(const coord_job_t *j, char *out, size_t len)
{
    size_t n = (size_t)snprintf(out, len, "gave up after %u restarts (fault.max_restarts = %lld): ",
                                j->restarts, (long long)j->spec.fault.max_restarts);
    for (uint32_t i = 0; i < j->n_history && n < len; i++)
        n += (size_t)snprintf(out + n, len - n, "%s%s: %s", i ? "; " : "",
                              coord_cause_name(j->history[i].cause), j->history[i].reason);
}

// ---------------------------------------------------------------------------------------
// Failure

/* A rank's own failure is often the symptom: the survivors of a dead node see their
 * collectives abort before the node is declared dead. When the node's loss arrives while
 * the restart it caused is still pending, it is the cause on record. */
static void upgrade_cause(coord_t *c, coord_job_t *j, coord_cause_t cause, int64_t rank,
                          const char *node, const char *reason)
{
    coord_restart_t *h = current(j);
    int node_level = cause == COORD_CAUSE_NODE_LOST || cause == COORD_CAUSE_WORKER_RESTART;
    int rank_level =
        h && (h->cause == COORD_CAUSE_RANK_FAILED || h->cause == COORD_CAUSE_RANK_EXIT);
    if (!node_level || !rank_level || h->resumed_from >= 0 || h->failed_gen != j->generation) {
        CH_LOGD("recovery", "job=%s gen=%" PRIu64 " already recovering; also: %s", j->id,
                j->generation, reason);
        return;
    }
    char was[sizeof(h->reason)];
    snprintf(was, sizeof(was), "%s", h->reason);
    if (c->restarts_by_cause[h->cause] > 0 && j->restarts > 0) {
        c->restarts_by_cause[h->cause]--;
        c->restarts_by_cause[cause]++;
    }
    CH_LOGI("recovery", "job=%s gen=%" PRIu64 " cause %s -> %s: %s", j->id, j->generation,
            coord_cause_name(h->cause), coord_cause_name(cause), reason);
    h->cause = cause;
    h->rank = rank;
    snprintf(h->node, sizeof(h->node), "%s", node ? node : "");
    snprintf(h->reason, sizeof(h->reason), "%s (first seen: %.120s)", reason, was);
    store_restart(c, j, j->n_history - 1);
}

void coord_recovery_rank_failed(coord_t *c, coord_job_t *j, uint32_t rank, const char *lasting,
                                int before_first_step, const char *message)
{
    (void)c;
    if (!j->ranks || rank >= j->world)
        return;
    int is_lasting = lasting && *lasting;
    if (is_lasting && strcmp(lasting, "nonfinite") == 0 &&
        j->spec.fault.nonfinite == CH_NONFINITE_REWIND)
        is_lasting = 0; /* the rewind reads other data: coord_recovery_rewind */
    /* a non-finite global loss replays the same way after any restart: at any step */
    if (is_lasting && (before_first_step || strcmp(lasting, "nonfinite") == 0))
        snprintf(j->ranks[rank].lasting, sizeof j->ranks[rank].lasting, "%s", lasting);
    if (j->state != COORD_JOB_RECOVERING) /* the failure about to be recorded */
        snprintf(j->fail_sig, sizeof j->fail_sig, "%s", is_lasting && message ? message : "");
}

void coord_recovery_rewind(coord_t *c, coord_job_t *j, uint32_t rank, uint64_t batch)
{
    char was[sizeof j->spec.train.skip_steps], *ini = NULL, what[sizeof was + 256];
    if (!coord_job_is_active(j) || j->spec.fault.nonfinite != CH_NONFINITE_REWIND)
        return;
    snprintf(was, sizeof was, "%s", j->spec.train.skip_steps);
    int rc = ch_skip_add(j->spec.train.skip_steps, sizeof j->spec.train.skip_steps, batch);
    if (rc == 0 && strcmp(was, j->spec.train.skip_steps) == 0)
        return; /* another rank of the step said so first */
    if (rc == 0 && (rc = ch_jobspec_format(&j->spec, &ini)) < 0)
        memcpy(j->spec.train.skip_steps, was, sizeof was);
    if (rc < 0) {
        snprintf(what, sizeof what,
                 "fault.nonfinite = rewind: cannot skip data batch %" PRIu64
                 " (train.skip_steps = %s: at most %d batches): %s",
                 batch, was, CH_SKIP_MAX, ch_strerror(rc));
        coord_job_fail(c, j, what);
        return;
    }
    free(j->ini);
    j->ini = ini;
    coord_job_store(c, j); /* a failure is logged by the store; memory stays authoritative */
    snprintf(what, sizeof what,
             "fault.nonfinite = rewind: data batch %" PRIu64 " skipped from now on "
             "(train.skip_steps = %s); the restart resumes from the last committed checkpoint",
             batch, j->spec.train.skip_steps);
    CH_LOGW("recovery", "job=%s gen=%" PRIu64 " rank=%u %s", j->id, j->generation, rank, what);
    coord_event(c, j->id, j->generation, rank,
                j->ranks && rank < j->world ? j->ranks[rank].node->name : NULL, what);
}

static const char *const GROUPS[4] = {"tp", "dp", "pp", "emb"};

static int group_kind(const char *name)
{
    for (int k = 0; k < 4; k++)
        if (name && strcmp(name, GROUPS[k]) == 0)
            return k;
    return -1;
}

void coord_recovery_timeout(coord_t *c, coord_job_t *j, uint32_t rank, const Chorus__RankEvent *ev)
{
    (void)c;
    if (!j->ranks || rank >= j->world)
        return;
    coord_rank_t *rk = &j->ranks[rank];
    for (size_t i = 0; i < ev->n_group_entered; i++) {
        int k = group_kind(ev->group_entered[i]->name);
        if (k < 0 || !(ev->group_entered[i]->value >= 0))
            continue;
        rk->entered[k] = (uint64_t)ev->group_entered[i]->value;
        rk->entered_known |= (uint8_t)(1u << k);
    }
    if (j->state == COORD_JOB_RECOVERING)
        return; /* a later victim's report: its counts are all it brings */
    int k = group_kind(ev->timeout_group);
    ch_layout_t l = ch_jobspec_layout(&j->spec);
    uint32_t size = k == 0 ? l.tp : k == 1 ? l.dp : k == 2 ? l.pp : 0;
    j->timeout_kind = size > 2 && ev->timeout_seq > 0 ? k : -1;
    j->timeout_rank = rank;
    j->timeout_seq = ev->timeout_seq;
}

/* Group k (0 tp, 1 dp, 2 pp) of j's rank that reported the timeout: its members' world
 * ranks into m; the count (0 when over cap). */
static uint32_t group_members(const coord_job_t *j, int k, uint32_t *m, uint32_t cap)
{
    ch_layout_t l = ch_jobspec_layout(&j->spec);
    uint32_t size = k == 0 ? l.tp : k == 1 ? l.dp : l.pp;
    if (size > cap || j->timeout_rank >= ch_layout_world(l))
        return 0;
    if (k == 0)
        ch_layout_tp_group(l, j->timeout_rank, m);
    else if (k == 1)
        ch_layout_dp_group(l, j->timeout_rank, m);
    else
        ch_layout_pp_group(l, j->timeout_rank, m);
    return size;
}

/* The kill of a generation whose collective timed out in a group of more than 2 ranks is
 * due: the members that entered the collective waited in it and said so; the culprit is
 * the member whose count is behind, else one that never reported (stopped, or hung
 * outside any collective). It replaces the ring predecessor on the restart's record. */
static void name_laggard(coord_t *c, coord_job_t *j)
{
    coord_restart_t *h = current(j);
    uint32_t m[256], n = 0;
    int k = j->timeout_kind;
    j->timeout_kind = -1;
    if (k < 0 || !h || h->cause != COORD_CAUSE_COLLECTIVE || !j->ranks ||
        (n = group_members(j, k, m, 256)) == 0)
        return;
    int64_t behind = -1, silent = -1;
    uint32_t n_silent = 0;
    for (uint32_t i = 0; i < n && m[i] < j->world; i++) {
        const coord_rank_t *rk = &j->ranks[m[i]];
        if (!(rk->entered_known & (1u << k))) {
            n_silent++;
            if (silent < 0)
                silent = m[i];
        } else if (rk->entered[k] < j->timeout_seq &&
                   (behind < 0 || rk->entered[k] < j->ranks[behind].entered[k])) {
            behind = m[i];
        }
    }
    int64_t who = behind >= 0 ? behind : silent;
    if (who < 0)
        return;
    char why[sizeof(h->reason)];
    const coord_rank_t *rk = &j->ranks[who];
    if (behind >= 0)
        snprintf(why, sizeof why,
                 "collective timeout in group %s: rank %" PRId64 " on node %s had entered %" PRIu64
                 " collectives of the group, the others waited in collective %" PRIu64,
                 GROUPS[k], who, rk->node->name, rk->entered[k], j->timeout_seq);
    else
        snprintf(why, sizeof why,
                 "collective timeout in group %s: rank %" PRId64 " on node %s never arrived at "
                 "collective %" PRIu64 " (%u of %u members silent, the others waited in it)",
                 GROUPS[k], who, rk->node->name, j->timeout_seq, n_silent, n);
    CH_LOGW("recovery", "job=%s gen=%" PRIu64 " culprit: %s (was rank %" PRId64 ")", j->id,
            j->generation, why, h->rank);
    h->rank = who;
    snprintf(h->node, sizeof h->node, "%s", rk->node->name);
    snprintf(h->reason, sizeof h->reason, "%s", why);
    store_restart(c, j, j->n_history - 1);
    coord_event(c, j->id, j->generation, who, rk->node->name, why);
}

/* What the failure looked like, comparable across generations: a rank's own words for a
 * lasting cause, or how a rank died by itself (a kill -9 comes from outside: a drill, the
 * OOM killer). "" for anything else. Consumes j->fail_sig. */
static void failure_sig(coord_job_t *j, coord_cause_t cause, int64_t rank, char *out, size_t len)
{
    out[0] = '\0';
    if (cause == COORD_CAUSE_RANK_FAILED && j->fail_sig[0]) {
        snprintf(out, len, "%s", j->fail_sig);
    } else if (cause == COORD_CAUSE_RANK_EXIT && j->ranks && rank >= 0 && rank < j->world) {
        const coord_rank_t *rk = &j->ranks[rank];
        if (rk->signal && rk->signal != SIGKILL)
            snprintf(out, len, "killed by signal %d", rk->signal);
        else if (!rk->signal && rk->exit_code)
            snprintf(out, len, "exited with code %d", rk->exit_code);
    }
    j->fail_sig[0] = '\0';
}

/* The failure just recorded repeats the previous generation's: the same signature, both
 * before their first step or at the same step. */
static int same_way(const coord_job_t *j, char *why, size_t len)
{
    if (j->n_history < 2)
        return 0;
    const coord_restart_t *h = &j->history[j->n_history - 1], *p = &j->history[j->n_history - 2];
    if (!h->sig[0] || strcmp(h->sig, p->sig) != 0 || p->failed_gen + 1 != h->failed_gen)
        return 0;
    if (!(h->unstepped && p->unstepped) && h->failed_step != p->failed_step)
        return 0;
    snprintf(why, len,
             "failed the same way in generations %" PRIu64 " and %" PRIu64 " (%s), not retried: %s",
             p->failed_gen, h->failed_gen,
             h->unstepped ? "before their first step" : "at the same step", h->reason);
    return 1;
}

/* fault.crash_loop generations in a row failed before their first step: the causes of
 * the run, each with its count and latest reason. */
static int crash_loop(const coord_job_t *j, char *why, size_t len)
{
    int64_t limit = j->spec.fault.crash_loop;
    if (limit <= 0 || j->unstepped_run < (uint64_t)limit)
        return 0;
    size_t n = (size_t)snprintf(why, len,
                                "crash loop: %u generations in a row failed before their first "
                                "step (fault.crash_loop = %lld), stopped:",
                                j->unstepped_run, (long long)limit);
    uint32_t first = j->n_history - j->unstepped_run;
    for (int k = 0; k < COORD_CAUSE_NCAUSES && n < len; k++) {
        uint32_t count = 0, last = 0;
        for (uint32_t i = first; i < j->n_history; i++)
            if (j->history[i].cause == (coord_cause_t)k) {
                count++;
                last = i;
            }
        if (count)
            n += (size_t)snprintf(why + n, len - n, " %s x%u (last: %.160s);",
                                  coord_cause_name((coord_cause_t)k), count,
                                  j->history[last].reason);
    }
    if (n > 0 && n < len && why[n - 1] == ';')
        why[n - 1] = '\0';
    return 1;
}

/* The pause before the next generation: none for the first failure of a run, then
 * fault.backoff seconds doubling up to fault.backoff_max. */
static uint64_t backoff_ms(const coord_job_t *j)
{
    uint32_t k = j->unstepped_run;
    double base = j->spec.fault.backoff, cap = j->spec.fault.backoff_max;
    if (k < 2 || !(base > 0))
        return 0;
    double sec = base * ldexp(1.0, (int)(k - 2 < 30 ? k - 2 : 30));
    return (uint64_t)((sec < cap ? sec : cap) * 1000.0);
}

void coord_recovery_failure(coord_t *c, coord_job_t *j, coord_cause_t cause, int64_t rank,
                            const char *node, const char *reason)
{
    char why[sizeof(j->reason)];

    if (!coord_job_is_active(j))
        return;
    if (j->state == COORD_JOB_RECOVERING) {
        upgrade_cause(c, j, cause, rank, node, reason);
        return;
    }
    j->grace_deadline = 0;
    coord_restart_t *h = history_add(j);
    if (!h) {
        coord_job_fail(c, j, reason);
        return;
    }
    h->time_ms = ch_wall_ms();
    h->cause = cause;
    h->rank = rank;
    snprintf(h->node, sizeof(h->node), "%s", node ? node : "");
    snprintf(h->reason, sizeof(h->reason), "%s", reason);
    h->failed_gen = j->generation;
    h->failed_step = j->step;
    failure_sig(j, cause, rank, h->sig, sizeof h->sig);
    h->unstepped = !j->gen_stepped;
    j->unstepped_run = h->unstepped ? j->unstepped_run + 1 : 0;
    store_restart(c, j, j->n_history - 1);
    CH_LOGW("recovery", "job=%s gen=%" PRIu64 " rank=%" PRId64 " node=%s failure (%s): %s", j->id,
            j->generation, rank, node ? node : "-", coord_cause_name(cause), reason);

    if (cause == COORD_CAUSE_RANK_FAILED && j->ranks && rank >= 0 && rank < j->world &&
        strcmp(j->ranks[rank].lasting, "nonfinite") == 0) {
        coord_job_fail(c, j, reason); /* fault.nonfinite = fail */
        return;
    }
    if (same_way(j, why, sizeof why) || crash_loop(j, why, sizeof why)) {
        coord_job_fail(c, j, why);
        return;
    }
    if (j->spec.fault.max_restarts < 0 || j->restarts >= (uint64_t)j->spec.fault.max_restarts) {
        if (j->n_history == 1)
            snprintf(why, sizeof(why), "%s", reason);
        else
            every_cause(j, why, sizeof(why));
        coord_job_fail(c, j, why);
        return;
    }
    j->restarts++;
    c->recoveries_total++;
    c->restarts_by_cause[cause]++;
    snprintf(why, sizeof(why), "restart %u of %lld after %s: %s", j->restarts,
             (long long)j->spec.fault.max_restarts, coord_cause_name(cause), reason);
    /* Journal first, then kill: a coordinator that crashes in between finds the job
     * recovering and its ranks lost, and carries on the same way. */
    coord_job_set_state(c, j, COORD_JOB_RECOVERING, why);
    uint64_t now = ch_now_ms(), pause = backoff_ms(j);
    if (pause) {
        j->restart_at_ms = now + pause;
        CH_LOGW("recovery",
                "job=%s gen=%" PRIu64 " restart %u backs off %.1f s (%u generations in a row "
                "failed before their first step)",
                j->id, j->generation, j->restarts, (double)pause / 1000.0, j->unstepped_run);
    }
    int lasting = cause == COORD_CAUSE_RANK_FAILED && j->ranks && rank >= 0 && rank < j->world &&
                  j->ranks[rank].lasting[0];
    if (cause != COORD_CAUSE_COLLECTIVE)
        j->timeout_kind = -1;
    if (lasting || j->timeout_kind >= 0) {
        j->kill_due_ms = now + LASTING_WAIT_MS; /* the other nodes may say the same */
    } else {
        coord_job_kill_gen(c, j, why);
        j->kill_sent_ms = now;
    }
    coord_kv_drop_gen(c->kv, j->id, j->generation);
}

// ---------------------------------------------------------------------------------------
// Restart

void coord_recovery_waiting(coord_t *c, coord_job_t *j, const char *why)
{
    (void)c;
    if (strcmp(j->reason, why) == 0)
        return;
    /* Kept in memory only: a restarted coordinator works it out again. */
    snprintf(j->reason, sizeof(j->reason), "%s", why);
    ch_log(j->state == COORD_JOB_RECOVERING ? CH_LOG_INFO : CH_LOG_DEBUG, "recovery",
           "job=%s gen=%" PRIu64 " %s: %s", j->id, j->generation, coord_job_state_name(j->state),
           why);
}

static const char *lasting_text(const char *cls)
{
    if (strcmp(cls, "permission") == 0)
        return "permission denied";
    if (strcmp(cls, "missing") == 0)
        return "a file that does not exist";
    if (strcmp(cls, "does_not_fit") == 0)
        return "a model that does not fit";
    return "a file that does not parse";
}

/* Every node of j's failed generation had a rank fail before its first step with the
 * lasting cause of the restart under way: 1 and why (the job's reason); else 0. */
static int cannot_heal(coord_t *c, coord_job_t *j, char *why, size_t len)
{
    const coord_restart_t *h = current(j);
    if (!h || h->resumed_from >= 0 || h->failed_gen != j->generation || !j->ranks || h->rank < 0 ||
        h->rank >= j->world || !j->ranks[h->rank].lasting[0])
        return 0;
    const char *cls = j->ranks[h->rank].lasting;
    uint64_t agree = ++c->stamp, seen = ++c->stamp;
    for (uint32_t r = 0; r < j->world; r++) {
        coord_node_t *n = j->ranks[r].node;
        if (n->mark != agree)
            n->mark = strcmp(j->ranks[r].lasting, cls) == 0 ? agree : seen;
    }
    uint64_t counted = ++c->stamp;
    uint32_t nodes = 0, agreeing = 0;
    for (uint32_t r = 0; r < j->world; r++) {
        coord_node_t *n = j->ranks[r].node;
        if (n->mark == counted)
            continue;
        nodes++;
        agreeing += n->mark == agree;
        n->mark = counted;
    }
    if (agreeing < nodes) {
        CH_LOGI("recovery",
                "job=%s gen=%" PRIu64 " %s on %u of %u nodes only: restarting (the others may "
                "heal it)",
                j->id, j->generation, lasting_text(cls), agreeing, nodes);
        return 0;
    }
    snprintf(why, len, "cannot heal: %s on every node (%u) before the first step, not retried: %s",
             lasting_text(cls), nodes, h->reason);
    return 1;
}

/* The failed generation is gone: 1 when the next may start now. A failure no restart
 * heals ends the job instead, and does not count as a restart. */
static int restart_allowed(coord_t *c, coord_job_t *j)
{
    char why[sizeof(j->reason)];
    if (cannot_heal(c, j, why, sizeof why)) {
        const coord_restart_t *h = current(j);
        if (j->restarts > 0)
            j->restarts--;
        if (c->recoveries_total > 0)
            c->recoveries_total--;
        if (c->restarts_by_cause[h->cause] > 0)
            c->restarts_by_cause[h->cause]--;
        coord_job_fail(c, j, why);
        return 0;
    }
    if (j->restart_at_ms) {
        char wait[160];
        uint64_t now = ch_now_ms();
        snprintf(wait, sizeof wait, "restart %u backs off for %.1f s more", j->restarts,
                 j->restart_at_ms > now ? (double)(j->restart_at_ms - now) / 1000.0 : 0.0);
        coord_recovery_waiting(c, j, wait);
        return 0;
    }
    return 1;
}

int coord_recovery_ready(coord_t *c, coord_job_t *j)
{
    uint32_t left = 0;
    if (j->grace_deadline) {
        /* Reloaded after a coordinator restart: every node counts as dead until it
         * registers again, so the old ranks are not known gone before the grace ends. */
        coord_recovery_waiting(c, j,
                               "restart waits for the nodes to re-register after a "
                               "coordinator restart");
        return 0;
    }
    for (uint32_t r = 0; j->ranks && r < j->world; r++) {
        coord_rank_t *rk = &j->ranks[r];
        if (!coord_rank_holds(rk->state))
            continue;
        if (rk->node->state == COORD_NODE_DEAD)
            coord_rank_set_state(c, j, r, COORD_RANK_LOST, "its node is dead");
        else
            left++;
    }
    if (left == 0) {
        coord_recovery_phase(c, j, COORD_PHASE_KILLED);
        return restart_allowed(c, j);
    }
    char why[160];
    snprintf(why, sizeof(why), "restart %u: waiting for %u ranks of generation %" PRIu64 " to exit",
             j->restarts, left, j->generation);
    coord_recovery_waiting(c, j, why);
    return 0;
}

// ---------------------------------------------------------------------------------------
// Elastic restart

/* The dp the job was submitted with: the first elastic restart's layout_from, else the
 * current one. */
static uint32_t dp_submitted(const coord_job_t *j)
{
    for (uint32_t i = 0; i < j->n_history; i++)
        if (j->history[i].layout_from.dp)
            return j->history[i].layout_from.dp;
    return j->spec.parallel.dp;
}

/* spec with dp d and the same global batch dp x microbatches x micro_batch_size: more
 * micro-batches, else larger ones. 0, or -1 when neither keeps the batch exactly. */
static int same_batch(const ch_jobspec_t *spec, uint32_t d, ch_jobspec_t *out)
{
    uint64_t mb = spec->parallel.microbatches, mbs = spec->parallel.micro_batch_size;
    uint64_t global = spec->parallel.dp * mb * mbs;
    if (global % d)
        return -1;
    uint64_t per = global / d; /* sequences per dp rank */
    *out = *spec;
    out->parallel.dp = d;
    if (per % mbs == 0 && per / mbs <= UINT32_MAX) {
        out->parallel.microbatches = (uint32_t)(per / mbs);
        return 0;
    }
    if (per % mb == 0 && per / mb <= UINT32_MAX) {
        out->parallel.micro_batch_size = (uint32_t)(per / mb);
        return 0;
    }
    return -1;
}

static void layout_text(const ch_layout_split_t *l, char *out, size_t len)
{
    snprintf(out, len, "tp %u x pp %u x dp %u (microbatches %u x micro_batch_size %u)", l->tp,
             l->pp, l->dp, l->microbatches, l->micro_batch_size);
}

int coord_recovery_shrink(coord_t *c, coord_job_t *j)
{
    coord_restart_t *h = current(j);
    char err[256], why[400], from[96], to[96];
    ch_jobspec_t cand;

    if (!j->spec.fault.elastic || !h || h->resumed_from >= 0 || coord_sched_fits(c, &j->spec))
        return 0;
    uint32_t dp0 = dp_submitted(j);
    for (uint32_t d = j->spec.parallel.dp - 1; d >= 1; d--) {
        if (dp0 % d != 0 || same_batch(&j->spec, d, &cand) < 0)
            continue;
        if (ch_jobspec_validate(&cand, 0, err, sizeof err) < 0) {
            CH_LOGD("recovery", "job=%s dp %u refused: %s", j->id, d, err);
            continue;
        }
        if (!coord_sched_fits(c, &cand))
            continue;
        ch_layout_split_t was = ch_jobspec_split(&j->spec), now = ch_jobspec_split(&cand);
        int rc = coord_job_relayout(c, j, &cand);
        if (rc < 0) {
            CH_LOGE("recovery", "job=%s cannot change its layout: %s", j->id, ch_strerror(rc));
            return rc;
        }
        if (!h->layout_from.dp)
            h->layout_from = was;
        h->layout_to = now;
        layout_text(&was, from, sizeof from);
        layout_text(&now, to, sizeof to);
        snprintf(why, sizeof why,
                 "fault.elastic: restart %u resumes in %s, was %s (the alive nodes no longer "
                 "hold the old layout; global batch kept)",
                 j->restarts, to, from);
        CH_LOGW("recovery", "job=%s gen=%" PRIu64 " %s", j->id, j->generation, why);
        coord_event(c, j->id, j->generation, -1, NULL, why);
        snprintf(j->reason, sizeof j->reason, "%s", why);
        return 1;
    }
    return 0; /* the scheduler's reason says what is missing */
}

void coord_recovery_started(coord_t *c, coord_job_t *j)
{
    coord_restart_t *h = current(j);
    j->gen_stepped = 0;
    j->kill_due_ms = j->kill_sent_ms = j->restart_at_ms = 0;
    j->timeout_kind = -1;
    if (!h || h->resumed_from >= 0)
        return;
    h->resumed_from = j->last_ckpt_step > 0 ? j->last_ckpt_step : 0;
    h->steps_lost =
        h->failed_step > (uint64_t)h->resumed_from ? h->failed_step - (uint64_t)h->resumed_from : 0;
    j->step = (uint64_t)h->resumed_from;
    store_restart(c, j, j->n_history - 1);
    coord_recovery_phase(c, j, COORD_PHASE_PLACED);
    CH_LOGI("recovery",
            "job=%s gen=%" PRIu64 " restart %u: resuming from step %" PRId64 " (%" PRIu64
            " steps lost)",
            j->id, j->generation, j->restarts, h->resumed_from, h->steps_lost);
}

void coord_recovery_resumed(coord_t *c, coord_job_t *j, const char *source, uint64_t step)
{
    coord_restart_t *h = current(j);
    if (!h || h->resumed_from < 0 || h->source[0])
        return; /* a fresh start, or this restart's source already known */
    snprintf(h->source, sizeof h->source, "%s", strcmp(source, "memory") == 0 ? "memory" : "disk");
    if (step > (uint64_t)h->resumed_from) {
        h->resumed_from = (int64_t)step;
        h->steps_lost = h->failed_step > step ? h->failed_step - step : 0;
    }
    store_restart(c, j, j->n_history - 1);
    CH_LOGI("recovery",
            "job=%s gen=%" PRIu64 " restart %u: state of step %" PRId64 " read from %s (%" PRIu64
            " steps lost)",
            j->id, j->generation, j->restarts, h->resumed_from, h->source, h->steps_lost);
}

void coord_recovery_progress(coord_t *c, coord_job_t *j)
{
    coord_restart_t *h = current(j);
    j->gen_stepped = 1;
    coord_recovery_phase(c, j, COORD_PHASE_STEP);
    if (h && j->step > h->failed_step)
        coord_recovery_phase(c, j, COORD_PHASE_PAST);
    if (!h || h->resumed_from < 0 || h->recover_s >= 0)
        return;
    uint64_t now = ch_wall_ms();
    h->recover_s = now > h->time_ms ? (double)(now - h->time_ms) / 1000.0 : 0.0;
    store_restart(c, j, j->n_history - 1);
    c->recover_s_last = h->recover_s;
    CH_LOGI("recovery", "job=%s gen=%" PRIu64 " recovered: first step %.3f s after the failure",
            j->id, j->generation, h->recover_s);
}

// ---------------------------------------------------------------------------------------
// Hangs

/* A recovering job's timers: the postponed kill, the end of the backoff, and nodes
 * that did not confirm their ranks' exit within dead-after of the kill (declared dead, so
 * the restart does not wait for them forever). */
static void recovering_check(coord_t *c, coord_job_t *j, uint64_t now_ms)
{
    if (j->kill_due_ms && now_ms >= j->kill_due_ms) {
        j->kill_due_ms = 0;
        name_laggard(c, j);
        coord_job_kill_gen(c, j, j->reason);
        j->kill_sent_ms = now_ms;
    }
    if (j->restart_at_ms && now_ms >= j->restart_at_ms) {
        j->restart_at_ms = 0;
        coord_changed(c);
    }
    /* now_ms may predate a kill sent earlier in this very tick */
    if (!j->kill_sent_ms || j->grace_deadline || !j->ranks || now_ms <= j->kill_sent_ms ||
        now_ms - j->kill_sent_ms <= (uint64_t)c->cfg.dead_after_ms)
        return;
    j->kill_sent_ms = 0;
    for (uint32_t r = 0; r < j->world; r++) {
        coord_node_t *n = j->ranks[r].node;
        if (!coord_rank_holds(j->ranks[r].state) || n->state == COORD_NODE_DEAD)
            continue;
        char why[160];
        snprintf(why, sizeof why,
                 "did not confirm the exit of job %s rank %u within dead-after (%ld ms) of its "
                 "kill",
                 j->id, r, c->cfg.dead_after_ms);
        coord_node_declare_dead(c, n, why);
    }
}

/* The longest the step-timeout scan skips without a reason (coord_recovery_check). */
#define HANG_SCAN_MAX_MS 5000

void coord_recovery_check(coord_t *c, coord_job_t *j, uint64_t now_ms)
{
    if (j->state == COORD_JOB_RECOVERING) {
        recovering_check(c, j, now_ms);
        return;
    }
    if ((j->state != COORD_JOB_STARTING && j->state != COORD_JOB_RUNNING) || !j->ranks ||
        j->spec.fault.step_timeout_s <= 0)
        return;
    if (now_ms < j->hang_scan_ms)
        return;
    uint64_t limit = (uint64_t)j->spec.fault.step_timeout_s * 1000;
    /* A scan of every rank four times a second cost the steady state more than any other
     * single thing at 16,384 ranks (issue 26): scan again only once the earliest deadline
     * can have passed. A step only moves a deadline later; a rank that joins the watch
     * resets it (coord_rank_set_state); at most HANG_SCAN_MAX_MS apart whatever else moved
     * (a node's progress interval). */
    uint64_t next = now_ms + HANG_SCAN_MAX_MS;
    int64_t worst = -1;
    for (uint32_t r = 0; r < j->world; r++) {
        const coord_rank_t *rk = &j->ranks[r];
        if (rk->state != COORD_RANK_PENDING && rk->state != COORD_RANK_RUNNING)
            continue;
        /* plus what its node may hold a report back (NodeProgress, progress.h) */
        uint64_t held = rk->node && rk->node->progress_ms ? rk->node->progress_ms + 100 : 0;
        uint64_t due = rk->progress_ms + limit + held + 1;
        if (now_ms < rk->progress_ms || now_ms < due) {
            if (due < next)
                next = due;
            continue;
        }
        /* The culprit is the one furthest behind: the others wait for it. */
        if (worst < 0 || rk->step < j->ranks[worst].step ||
            (rk->step == j->ranks[worst].step && rk->progress_ms < j->ranks[worst].progress_ms))
            worst = r;
    }
    j->hang_scan_ms = worst < 0 ? next : 0;
    if (worst < 0)
        return;
    const coord_rank_t *rk = &j->ranks[worst];
    char reason[256];
    if (rk->state == COORD_RANK_PENDING || rk->step == 0)
        snprintf(reason, sizeof(reason),
                 "rank %" PRId64 " on node %s did not complete its first step within "
                 "fault.step_timeout = %lld s",
                 worst, rk->node->name, (long long)j->spec.fault.step_timeout_s);
    else
        snprintf(reason, sizeof(reason),
                 "rank %" PRId64 " on node %s made no progress after step %" PRIu64
                 " for fault.step_timeout = %lld s",
                 worst, rk->node->name, rk->step, (long long)j->spec.fault.step_timeout_s);
    coord_recovery_failure(c, j, COORD_CAUSE_HANG, worst, rk->node->name, reason);
}

// ---------------------------------------------------------------------------------------
// Reload

static int load_one(void *ud, const coord_restart_rec_t *rec)
{
    coord_t *c = ud;
    char id[32];
    snprintf(id, sizeof(id), "j%" PRId64, rec->job_seq);
    coord_job_t *j = coord_job_find(c, id);
    if (!j || strcmp(j->id, id) != 0)
        return 0; /* a job no longer known: nothing to attach it to */
    coord_restart_t *h = history_add(j);
    if (!h)
        return -ENOMEM;
    h->time_ms = rec->time_ms;
    h->cause = cause_parse(rec->cause);
    h->rank = rec->rank;
    snprintf(h->node, sizeof(h->node), "%s", rec->node);
    snprintf(h->reason, sizeof(h->reason), "%s", rec->reason);
    h->failed_gen = rec->failed_gen;
    h->failed_step = rec->failed_step;
    h->resumed_from = rec->resumed_from;
    h->steps_lost = rec->steps_lost;
    h->recover_s = rec->recover_s;
    layout_store_parse(rec->layout_from, &h->layout_from);
    layout_store_parse(rec->layout_to, &h->layout_to);
    snprintf(h->source, sizeof h->source, "%s", rec->source ? rec->source : "");
    return 0;
}

int coord_recovery_load(coord_t *c)
{
    return coord_store_load_restarts(c->store, load_one, c);
}
