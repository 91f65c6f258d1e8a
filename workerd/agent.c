/* The node agent (agent.h).
 *
 * Theory of operation.
 *  - Coordinator link: ch_conn_connect_tcp with the cluster key (role "worker"). On
 *    ready we send Register, listing the ranks still alive so a restarted coordinator
 *    re-adopts them. RegisterAck starts the heartbeat. When the link goes, we retry
 *    with jittered exponential backoff (100 ms doubling to 1 s), so a restarted
 *    coordinator sees this node again within about a second of listening.
 *  - Ranks: one entry per rank process, holding its proc (proc.h) and its plain link
 *    (socketpair, fd 3 in the rank). An entry is finished, and RANK_EXITED reported,
 *    once the process is reaped AND its link has reached EOF, so every event the rank
 *    wrote before exiting (RANK_DONE, RANK_FAILED) is relayed before RANK_EXITED. If
 *    something the rank left holds the socket open, the link is closed after a grace.
 *  - Events: forwarded while registered; otherwise queued (bounded, oldest progress
 *    reports dropped first) and flushed after the next RegisterAck. Progress reports of
 *    ranks other than 0 are aggregated per node (progress.h: one NodeProgress per
 *    progress-ms); any other event of a job first sends what is held of it.
 *  - Final reports: a rank's exit (with whether it reported RANK_DONE) is kept until the
 *    coordinator acknowledges it (RankExitAck) and listed in every Register until then,
 *    so a rank that finished just before a coordinator crash is not taken for lost.
 *  - Rendezvous: a rank's KvSet/KvGet goes to the coordinator under a fresh request id;
 *    the reply is routed back under the rank's own id. Without a coordinator link the
 *    rank gets -ENOTCONN at once and retries (rank.c). job_id and generation are forced
 *    to the rank's own, so a rank cannot touch another job's store.
 *  - A 100 ms cron expires relays the coordinator never answered and closes stale links. */
#include "workerd/agent.h"
#include "workerd/agent_impl.h"

#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/conn.h"
#include "common/err.h"
#include "common/log.h"
#include "common/msg.h"
#include "common/procmetrics.h"
#include "common/rdzv.h"
#include "common/rng.h"
#include "common/util.h"
#include "workerd/adopt.h"
#include "workerd/evqueue.h"
#include "workerd/logs.h"
#include "workerd/proc.h"
#include "workerd/progress.h"
#include "workerd/rundir.h"

static void on_reconnect_timer(uv_timer_t *t);

// ----------------------------------------------------------------------------
// small helpers

int wrk_agent_coord_send(wrk_agent_t *a, Chorus__Envelope *env)
{
    if (!a->coord || !ch_conn_is_ready(a->coord))
        return -ENOTCONN;
    if (a->corked != a->coord) {
        ch_conn_cork(a->coord);
        a->corked = a->coord;
    }
    int rc = ch_conn_send(a->coord, env);
    if (rc == 0)
        a->last_sent_ms = ch_now_ms();
    return rc;
}

/* Before the loop sleeps: the turn's messages to the coordinator, in one write. */
static void on_flush(uv_prepare_t *h)
{
    wrk_agent_t *a = h->data;
    ch_conn_t *c = a->corked;
    a->corked = NULL;
    if (c && c == a->coord)
        (void)ch_conn_uncork(c); /* a failed write closes the link */
}

// ----------------------------------------------------------------------------
// event queue (coordinator link down)

static void q_flush(wrk_agent_t *a)
{
    while (a->queue.len && a->registered) {
        Chorus__Envelope env = CHORUS__ENVELOPE__INIT;
        env.body_case = CHORUS__ENVELOPE__BODY_RANK_EVENT;
        env.rank_event = wrk_evq_front(&a->queue);
        if (wrk_agent_coord_send(a, &env) < 0)
            return;
        wrk_evq_pop(&a->queue);
    }
}

/* The aggregator's sender: only while events flow straight (nothing queued before it). */
static int progress_send(void *ud, Chorus__Envelope *env)
{
    wrk_agent_t *a = ud;
    if (!a->registered || a->queue.len)
        return -ENOTCONN;
    return wrk_agent_coord_send(a, env);
}

/* A held checkpoint report a flush could not send: queued ahead of what follows. */
static void progress_unsent(void *ud, const Chorus__RankEvent *ev)
{
    wrk_agent_t *a = ud;
    wrk_evq_push(&a->queue, ev);
}

/* This node's ranks of (job, gen) still running: a checkpoint step's reports of all of them
 * go in one NodeProgress (progress.h). */
static uint32_t ranks_of(const wrk_agent_t *a, const char *job, uint64_t gen)
{
    uint32_t n = 0;
    for (const rank_ent_t *e = a->ranks; e; e = e->next)
        n += !e->exited && e->gen == gen && strcmp(e->job_id, job) == 0;
    return n;
}

static void send_event(wrk_agent_t *a, const Chorus__RankEvent *ev)
{
    if (a->stopping)
        return;
    if (a->progress && a->coord_checkpoints &&
        ev->kind == CHORUS__RANK_EVENT_KIND__RANK_CHECKPOINT && a->registered &&
        a->queue.len == 0 &&
        wrk_progress_checkpoint(a->progress, ev, ranks_of(a, ev->job_id, ev->generation)) == 0)
        return;
    /* A rank's restart phase reports (RankEvent.phase: once each per generation, timed by
     * the coordinator) go at once like rank 0's; only per-step progress is held. */
    if (a->progress && ev->kind == CHORUS__RANK_EVENT_KIND__RANK_PROGRESS && ev->rank != 0 &&
        ev->phase == 0 && a->registered && a->queue.len == 0 &&
        wrk_progress_add(a->progress, ev) == 0)
        return;
    if (a->progress && ev->kind != CHORUS__RANK_EVENT_KIND__RANK_PROGRESS)
        wrk_progress_flush(a->progress, ev->job_id, ev->generation);
    if (a->registered && a->queue.len == 0) {
        Chorus__Envelope env = CHORUS__ENVELOPE__INIT;
        env.body_case = CHORUS__ENVELOPE__BODY_RANK_EVENT;
        env.rank_event = (Chorus__RankEvent *)ev;
        if (wrk_agent_coord_send(a, &env) == 0)
            return;
    }
    wrk_evq_push(&a->queue, ev);
    q_flush(a);
}

/* An event about ent that workerd itself originates (spawn failure, exit). */
static void send_rank_event(wrk_agent_t *a, const char *job, uint64_t gen, uint64_t token,
                            uint32_t rank, Chorus__RankEventKind kind, int code, int sig,
                            const char *msg)
{
    Chorus__RankEvent ev = CHORUS__RANK_EVENT__INIT;
    ev.job_id = (char *)job;
    ev.generation = gen;
    ev.launch_token = token;
    ev.rank = rank;
    ev.kind = kind;
    ev.exit_code = code;
    ev.signal = sig;
    if (msg)
        ev.message = (char *)msg;
    send_event(a, &ev);
}

// ----------------------------------------------------------------------------
// rank entries

static uint32_t alive_count(const wrk_agent_t *a)
{
    uint32_t n = 0;
    for (const rank_ent_t *e = a->ranks; e; e = e->next)
        n += !e->exited;
    return n;
}

static rank_ent_t *find_rank(wrk_agent_t *a, const char *job, uint64_t gen, uint32_t rank)
{
    for (rank_ent_t *e = a->ranks; e; e = e->next)
        if (e->gen == gen && e->rank == rank && strcmp(e->job_id, job) == 0)
            return e;
    return NULL;
}

/* Rewrite WRK_ADOPT_FILE with the ranks whose process is not yet reaped, so the next
 * workerd can tell whether any outlived this one (adopt.h). A failure is logged only:
 * the record helps the next start; it does not stop this one. */
void wrk_agent_ranks_record(wrk_agent_t *a)
{
    size_t n = 0;
    if (a->record_fd < 0)
        return;
    for (const rank_ent_t *e = a->ranks; e; e = e->next)
        n += wrk_agent_ent_running(e);
    wrk_adopt_rank_t *v = calloc(n + 1, sizeof *v);
    if (!v)
        return;
    n = 0;
    for (const rank_ent_t *e = a->ranks; e; e = e->next) {
        if (!wrk_agent_ent_running(e))
            continue;
        v[n] = (wrk_adopt_rank_t){.pid = e->pid,
                                  .start_ticks = e->start_ticks,
                                  .gen = e->gen,
                                  .token = e->token,
                                  .rank = e->rank,
                                  .keep = e->keep};
        snprintf(v[n++].job_id, sizeof v->job_id, "%s", e->job_id);
    }
    wrk_adopt_record(a->cfg.run_dir, v, n);
    free(v);
}

/* Keep ent's final report until the coordinator acknowledges it. */
static void fin_keep(wrk_agent_t *a, const rank_ent_t *ent)
{
    fin_ent_t *f = calloc(1, sizeof *f);
    if (!f) {
        CH_LOGE("agent", "out of memory: final report of rank %u not kept", ent->rank);
        return;
    }
    snprintf(f->job_id, sizeof f->job_id, "%s", ent->job_id);
    f->gen = ent->gen;
    f->token = ent->token;
    f->rank = ent->rank;
    f->done = ent->done;
    f->exit_code = ent->exit_code;
    f->signal = ent->signal;
    f->next = a->finished;
    a->finished = f;
    if (++a->n_finished > FINISHED_MAX) { /* drop the oldest */
        fin_ent_t **pp = &a->finished;
        while ((*pp)->next)
            pp = &(*pp)->next;
        CH_LOGW("agent", "job=%s rank=%u: final report dropped unacknowledged", (*pp)->job_id,
                (*pp)->rank);
        free(*pp);
        *pp = NULL;
        a->n_finished--;
    }
}

static void fin_ack(wrk_agent_t *a, const Chorus__RankExitAck *ack)
{
    for (fin_ent_t **pp = &a->finished; *pp; pp = &(*pp)->next) {
        fin_ent_t *f = *pp;
        if (f->gen == ack->generation && f->rank == ack->rank &&
            strcmp(f->job_id, ack->job_id ? ack->job_id : "") == 0) {
            *pp = f->next;
            free(f);
            a->n_finished--;
            return;
        }
    }
}

/* A job whose ranks here all finished their last step (RANK_DONE, exit 0) needs no
 * in-memory checkpoint any more (the disk has its last step): its folder under
 * --memory-dir goes, buddies' copies included, so the tmpfs does not fill up. A job that
 * failed or was cancelled keeps its folder (the coordinator does not tell workerd a job
 * ended). */
static void memory_release(wrk_agent_t *a, const rank_ent_t *ent)
{
    char dir[CH_PATH_LEN + 80];
    if (!a->cfg.memory_dir[0] || !ent->done || ent->exit_code != 0 ||
        !wrk_rundir_safe_name(ent->job_id))
        return;
    for (const rank_ent_t *o = a->ranks; o; o = o->next)
        if (o != ent && strcmp(o->job_id, ent->job_id) == 0)
            return; /* another rank of the job still runs here */
    int n = snprintf(dir, sizeof dir, "%s/%s", a->cfg.memory_dir, ent->job_id);
    if (n > 0 && (size_t)n < sizeof dir && ch_rmtree(dir) < 0)
        CH_LOGW("agent", "job=%s: removing %s failed", ent->job_id, dir);
}

/* Both the process and its link are gone: report the exit and forget the rank. */
void wrk_agent_ent_finish(rank_ent_t *ent)
{
    wrk_agent_t *a = ent->a;
    if (ent->proc || ent->link || a->detached)
        return; /* detached: the rank is not gone, only left to the next workerd */
    fin_keep(a, ent);
    if (ent->done)
        a->stats.rank_exits_done++;
    else
        a->stats.rank_exits_other++;
    CH_LOGI("agent", "job=%s gen=%" PRIu64 " rank=%u pid=%d exited code=%d signal=%d", ent->job_id,
            ent->gen, ent->rank, ent->pid, ent->exit_code, ent->signal);
    send_rank_event(a, ent->job_id, ent->gen, ent->token, ent->rank,
                    CHORUS__RANK_EVENT_KIND__RANK_EXITED, ent->exit_code, ent->signal, NULL);
    wrk_agent_relays_fail(a, ent, 0);
    memory_release(a, ent);
    for (rank_ent_t **pp = &a->ranks; *pp; pp = &(*pp)->next) {
        if (*pp == ent) {
            *pp = ent->next;
            break;
        }
    }
    free(ent);
}

static void on_rank_exit(wrk_proc_t *p, int exit_code, int term_signal, void *ud)
{
    rank_ent_t *ent = ud;
    ent->exited = 1;
    ent->exit_code = exit_code;
    ent->signal = term_signal;
    ent->exited_ms = ch_now_ms();
    ent->proc = NULL;
    wrk_proc_close(p);
    wrk_agent_ranks_record(ent->a);
    wrk_agent_ent_finish(ent);
}

void wrk_agent_rank_msg(ch_conn_t *c, Chorus__Envelope *env, void *ud)
{
    rank_ent_t *ent = ud;
    if (!ent)
        return; /* a dial not yet matched to a rank (on_rank_dial) */
    wrk_agent_t *a = ent->a;
    switch (env->body_case) {
    case CHORUS__ENVELOPE__BODY_RANK_EVENT: {
        Chorus__RankEvent *ev = env->rank_event;
        /* The rank speaks only for itself. The string belongs to the decoded message:
         * borrow ours for the send and put it back before the message is freed. */
        char *their_job = ev->job_id;
        ev->job_id = ent->job_id;
        ev->generation = ent->gen;
        ev->rank = ent->rank;
        ev->launch_token = ent->token;
        if (ev->kind == CHORUS__RANK_EVENT_KIND__RANK_DONE)
            ent->done = 1;
        if (ev->kind == CHORUS__RANK_EVENT_KIND__RANK_FAILED)
            CH_LOGW("agent", "job=%s gen=%" PRIu64 " rank=%u failed: %s", ent->job_id, ent->gen,
                    ent->rank, ev->message);
        send_event(a, ev);
        ev->job_id = their_job;
        break;
    }
    case CHORUS__ENVELOPE__BODY_KV_SET:
    case CHORUS__ENVELOPE__BODY_KV_GET:
        wrk_agent_relay_kv(a, ent, env);
        break;
    default:
        CH_LOGW("agent", "job=%s rank=%u: unexpected %s from rank", ent->job_id, ent->rank,
                ch_msg_name(env));
        break;
    }
    (void)c;
}

void wrk_agent_rank_close(ch_conn_t *c, int reason, void *ud)
{
    rank_ent_t *ent = ud;
    if (!ent)
        return; /* a refused dial */
    ent->link = NULL;
    ent->link_closed_ms = ch_now_ms();
    wrk_agent_relays_fail(ent->a, ent, 0);
    /* Usually the rank is exiting and its reaping is a moment away; the cron kills it
     * if it is still there after the grace (a rank that cannot report is of no use). */
    CH_LOGD("agent", "job=%s rank=%u: link closed (%s)", ent->job_id, ent->rank,
            reason ? ch_strerror(reason) : "local");
    wrk_agent_ent_finish(ent);
    (void)c;
}

static int rank_listed(uint32_t rank, const uint32_t *ranks, size_t n)
{
    if (n == 0)
        return 1; /* no list: every rank */
    for (size_t i = 0; i < n; i++)
        if (ranks[i] == rank)
            return 1;
    return 0;
}

/* SIGKILL ranks of job (NULL: every job) with generation <= max_gen; with a rank list,
 * only those ranks. */
static void kill_matching(wrk_agent_t *a, const char *job, uint64_t max_gen, const uint32_t *ranks,
                          size_t nranks)
{
    for (rank_ent_t *e = a->ranks; e; e = e->next) {
        if (wrk_agent_ent_running(e) &&
            (!job || (strcmp(e->job_id, job) == 0 && e->gen <= max_gen &&
                      rank_listed(e->rank, ranks, nranks)))) {
            CH_LOGI("agent", "job=%s gen=%" PRIu64 " rank=%u: SIGKILL", e->job_id, e->gen, e->rank);
            wrk_agent_ent_kill(e, SIGKILL);
        }
    }
}

// ----------------------------------------------------------------------------
// StartRanks / KillRanks

static int spawn_rank(wrk_agent_t *a, const Chorus__StartRanks *s, const Chorus__RankAssign *ra,
                      const char *gdir, const char *job_file)
{
    char rdir[CH_PATH_LEN], logp[CH_PATH_LEN];
    int fd = -1, rc;
    rank_ent_t *ent = calloc(1, sizeof *ent);
    if (!ent)
        return -ENOMEM;
    int n1 = snprintf(rdir, sizeof rdir, "%s/rank-%u/", gdir, ra->rank);
    int n2 = snprintf(logp, sizeof logp, "%s/rank-%u.log", gdir, ra->rank);
    if (n1 < 0 || (size_t)n1 >= sizeof rdir || n2 < 0 || (size_t)n2 >= sizeof logp) {
        free(ent);
        return -ENAMETOOLONG;
    }
    ent->a = a;
    snprintf(ent->job_id, sizeof ent->job_id, "%s", s->job_id);
    ent->gen = s->generation;
    ent->token = s->launch_token;
    ent->rank = ra->rank;

    wrk_proc_spec_t ps = {
        .exe = a->cfg.rank_exe,
        .job_id = s->job_id,
        .generation = s->generation,
        .rank = ra->rank,
        .world_size = s->world_size,
        .local_rank = ra->local_rank,
        .local_world = s->local_world_size ? s->local_world_size : (uint32_t)s->n_ranks,
        .resume_step = s->resume_step,
        .device = a->cfg.device,
        .threads = a->cfg.threads,
        .job_file = job_file,
        .run_dir = rdir,
        .log_path = logp,
        .memory_dir = a->cfg.memory_dir[0] ? a->cfg.memory_dir : NULL,
        .node = a->cfg.name,
        .agent_sock = a->cfg.keep_ranks && a->listening ? a->agent_sock : NULL,
    };
    ent->keep = ps.agent_sock != NULL;
    rc = wrk_proc_spawn(a->loop, &ps, on_rank_exit, ent, &ent->proc, &fd);
    if (rc < 0) {
        free(ent);
        return rc;
    }
    ent->pid = wrk_proc_pid(ent->proc);
    ch_proc_stat_t st;
    if (ch_proc_stat(ent->pid, &st) == 0)
        ent->start_ticks = st.start_ticks;
    ch_conn_opts_t o = {.key = NULL, .is_server = 1};
    ch_conn_cbs_t cbs = {NULL, wrk_agent_rank_msg, wrk_agent_rank_close};
    rc = ch_conn_open_fd(a->loop, fd, &o, &cbs, ent, &ent->link);
    if (rc < 0) {
        /* The rank cannot talk to us: kill it; its exit is reported as usual. */
        ent->link = NULL;
        ent->orphan_killed = 1;
        wrk_proc_kill(ent->proc, SIGKILL);
    }
    ent->next = a->ranks;
    a->ranks = ent;
    a->stats.rank_starts++;
    wrk_agent_ranks_record(a);
    CH_LOGI("agent", "job=%s gen=%" PRIu64 " rank=%u local=%u pid=%d started, log %s", ent->job_id,
            ent->gen, ent->rank, ra->local_rank, ent->pid, logp);
    return 0;
}

/* A rank that could not be started: RANK_FAILED, tagged with the class of a cause no
 * restart changes (ch_err_lasting: the run dir not writable, the rank binary missing), then
 * RANK_EXITED as if it had run. */
static void send_spawn_failure(wrk_agent_t *a, const Chorus__StartRanks *s, uint32_t rank, int rc,
                               const char *why)
{
    Chorus__RankEvent ev = CHORUS__RANK_EVENT__INIT;
    const char *cls = ch_err_lasting(rc);
    ev.job_id = s->job_id;
    ev.generation = s->generation;
    ev.rank = rank;
    ev.kind = CHORUS__RANK_EVENT_KIND__RANK_FAILED;
    ev.message = (char *)why;
    ev.cause_class = cls ? (char *)cls : "";
    ev.before_first_step = 1;
    ev.launch_token = s->launch_token;
    send_event(a, &ev);
    send_rank_event(a, s->job_id, s->generation, s->launch_token, rank,
                    CHORUS__RANK_EVENT_KIND__RANK_EXITED, 127, 0, why);
}

static void on_start_ranks(wrk_agent_t *a, const Chorus__StartRanks *s)
{
    char gdir[CH_PATH_LEN], job_file[CH_PATH_LEN];
    char why[CH_PATH_LEN + 128] = "";
    int rc = 0;

    if (!wrk_rundir_safe_name(s->job_id)) {
        CH_LOGE("agent", "StartRanks: refusing job id '%s'", s->job_id);
        return;
    }
    for (rank_ent_t *e = a->ranks; e; e = e->next) {
        if (strcmp(e->job_id, s->job_id) == 0 && e->gen > s->generation) {
            CH_LOGW("agent", "job=%s: stale StartRanks gen=%" PRIu64 " (running gen %" PRIu64 ")",
                    s->job_id, s->generation, e->gen);
            return;
        }
    }
    /* A newer generation supersedes: whatever is left of older ones must not linger. */
    if (s->generation > 0)
        kill_matching(a, s->job_id, s->generation - 1, NULL, 0);
    if (alive_count(a) + s->n_ranks > a->cfg.slots)
        CH_LOGW("agent", "job=%s gen=%" PRIu64 ": %zu ranks asked, %u slots, %u in use", s->job_id,
                s->generation, s->n_ranks, a->cfg.slots, alive_count(a));
    wrk_rundir_prune(a->cfg.run_dir, s->job_id, s->generation);
    rc = wrk_rundir_gen(a->cfg.run_dir, s->job_id, s->generation, gdir, sizeof gdir);
    /* The job's folder only lets through (0711); its generation folder, job file and logs
     * are the job user's alone (wrk_proc_give_dir). */
    if (rc == 0)
        rc = ch_mkdirs(gdir, 0711);
    if (rc == 0 &&
        (size_t)snprintf(job_file, sizeof job_file, "%s/job.ini", gdir) >= sizeof job_file)
        rc = -ENAMETOOLONG;
    if (rc == 0)
        rc = ch_file_write_atomic(job_file, s->job_ini, strlen(s->job_ini), 0600);
    if (rc == 0)
        rc = wrk_proc_give_dir(job_file, gdir);
    if (rc < 0)
        snprintf(why, sizeof why, "workerd: job dir %s: %s", gdir, ch_strerror(rc));

    for (size_t i = 0; i < s->n_ranks; i++) {
        const Chorus__RankAssign *ra = s->ranks[i];
        if (find_rank(a, s->job_id, s->generation, ra->rank))
            continue; /* a repeated command: already running */
        int src = rc;
        if (src == 0 && (src = spawn_rank(a, s, ra, gdir, job_file)) < 0)
            snprintf(why, sizeof why, "workerd: spawn rank %u: %s", ra->rank, ch_strerror(src));
        if (src < 0) {
            CH_LOGE("agent", "job=%s gen=%" PRIu64 " rank=%u: %s", s->job_id, s->generation,
                    ra->rank, why);
            send_spawn_failure(a, s, ra->rank, src, why);
            a->stats.rank_spawn_fails++;
        }
    }
}

// ----------------------------------------------------------------------------
// coordinator link

static void send_heartbeat(wrk_agent_t *a)
{
    Chorus__Heartbeat hb = CHORUS__HEARTBEAT__INIT;
    Chorus__Envelope env = CHORUS__ENVELOPE__INIT;
    uint32_t alive = alive_count(a);
    hb.time_ms = ch_wall_ms();
    hb.free_slots = alive >= a->cfg.slots ? 0 : a->cfg.slots - alive;
    env.body_case = CHORUS__ENVELOPE__BODY_HEARTBEAT;
    env.heartbeat = &hb;
    wrk_agent_coord_send(a, &env);
}

/* Any message counts as the node's heartbeat at the coordinator: one sent within the
 * interval (a NodeProgress, an event) stands in for this Heartbeat. */
static void on_heartbeat_timer(uv_timer_t *t)
{
    wrk_agent_t *a = t->data;
    if (wrk_heartbeat_due(ch_now_ms(), a->last_sent_ms, a->heartbeat_ms, a->dead_after_ms))
        send_heartbeat(a);
}

/* MemTotal of /proc/meminfo in bytes; 0 when it cannot be read (the coordinator then
 * admits jobs without a memory check on this node). */
static uint64_t mem_total(void)
{
    FILE *f = fopen("/proc/meminfo", "re");
    char line[128];
    unsigned long long kib = 0;
    if (!f)
        return 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemTotal: %llu kB", &kib) == 1)
            break;
    fclose(f);
    return (uint64_t)kib * 1024;
}

static void send_register(wrk_agent_t *a)
{
    Chorus__Register reg = CHORUS__REGISTER__INIT;
    Chorus__Envelope env = CHORUS__ENVELOPE__INIT;
    uint32_t n = alive_count(a), i = 0;
    size_t nf = a->n_finished, k = 0;
    Chorus__RankRef *refs = calloc(n ? n : 1, sizeof *refs);
    Chorus__RankRef **pr = calloc(n ? n : 1, sizeof *pr);
    Chorus__RankRef *frefs = calloc(nf ? nf : 1, sizeof *frefs);
    Chorus__RankRef **fpr = calloc(nf ? nf : 1, sizeof *fpr);
    if (!refs || !pr || !frefs || !fpr) {
        CH_LOGE("agent", "out of memory building Register");
        goto out;
    }
    for (const fin_ent_t *f = a->finished; f && k < nf; f = f->next, k++) {
        Chorus__RankRef init = CHORUS__RANK_REF__INIT;
        frefs[k] = init;
        frefs[k].job_id = (char *)f->job_id;
        frefs[k].generation = f->gen;
        frefs[k].launch_token = f->token;
        frefs[k].rank = f->rank;
        frefs[k].done = f->done;
        frefs[k].exit_code = f->exit_code;
        frefs[k].signal = f->signal;
        fpr[k] = &frefs[k];
    }
    reg.n_finished = k;
    reg.finished = fpr;
    for (rank_ent_t *e = a->ranks; e && i < n; e = e->next) {
        if (e->exited)
            continue;
        Chorus__RankRef init = CHORUS__RANK_REF__INIT;
        refs[i] = init;
        refs[i].job_id = e->job_id;
        refs[i].generation = e->gen;
        refs[i].launch_token = e->token;
        refs[i].rank = e->rank;
        refs[i].pid = e->pid;
        pr[i] = &refs[i];
        i++;
    }
    reg.name = a->cfg.name;
    reg.slots = a->cfg.slots;
    reg.rack = a->cfg.rack;
    reg.device = (char *)ch_device_name(a->cfg.device);
    reg.memory_bytes = a->cfg.memory_bytes ? a->cfg.memory_bytes : mem_total();
    reg.progress_ms = a->cfg.progress_ms;
    reg.n_running = i;
    reg.running = pr;
    env.body_case = CHORUS__ENVELOPE__BODY_REGISTER;
    env.register_ = &reg;
    if (wrk_agent_coord_send(a, &env) == 0)
        CH_LOGI("agent", "node=%s: registering with %s:%d (%u slots, rack %s, %u ranks running)",
                a->cfg.name, a->cfg.host, a->cfg.port, a->cfg.slots, a->cfg.rack, i);
out:
    free(fpr);
    free(frefs);
    free(pr);
    free(refs);
}

static void on_registered(wrk_agent_t *a, const Chorus__RegisterAck *ack)
{
    int first = !a->ever_registered;
    a->heartbeat_ms = ack->heartbeat_ms ? ack->heartbeat_ms : HEARTBEAT_DEFAULT_MS;
    a->dead_after_ms = ack->dead_after_ms;
    a->coord_checkpoints = ack->node_checkpoints;
    a->registered = 1;
    a->ever_registered = 1;
    a->stats.registrations++;
    a->backoff_ms = BACKOFF_MIN_MS;
    CH_LOGI("agent", "node=%s: registered (heartbeat %u ms)", a->cfg.name, a->heartbeat_ms);
    uv_timer_start(&a->heartbeat, on_heartbeat_timer, a->heartbeat_ms, a->heartbeat_ms);
    send_heartbeat(a);
    q_flush(a);
    if (a->cfg.registered_cb)
        a->cfg.registered_cb(a->cfg.ud, first);
}

static void on_coord_ready(ch_conn_t *c, void *ud)
{
    wrk_agent_t *a = ud;
    (void)c;
    send_register(a);
}

/* CheckpointRanks to each rank of that job and generation here (each polls its link
 * once a step). */
static void forward_checkpoint(wrk_agent_t *a, const Chorus__CheckpointRanks *cr)
{
    Chorus__Envelope env = CHORUS__ENVELOPE__INIT;
    env.body_case = CHORUS__ENVELOPE__BODY_CHECKPOINT_RANKS;
    env.checkpoint_ranks = (Chorus__CheckpointRanks *)cr;
    for (rank_ent_t *e = a->ranks; e; e = e->next)
        if (e->link && !e->exited && e->gen == cr->generation && strcmp(e->job_id, cr->job_id) == 0)
            ch_conn_send(e->link, &env);
    CH_LOGI("agent", "job=%s gen=%" PRIu64 ": checkpoint requested", cr->job_id, cr->generation);
}

/* LogRead: a chunk of a rank's log under run_dir (wrk_logs_read), or an Error. */
static void serve_log(wrk_agent_t *a, const Chorus__Envelope *req)
{
    Chorus__LogChunk lc = CHORUS__LOG_CHUNK__INIT;
    Chorus__Envelope env = CHORUS__ENVELOPE__INIT;
    char path[CH_PATH_LEN], err[CH_PATH_LEN + 64];
    const Chorus__LogRead *lr = req->log_read;
    int rc = wrk_rundir_safe_name(lr->job_id)
                 ? wrk_logs_read(a->cfg.run_dir, lr, &lc, path, sizeof path, err, sizeof err)
                 : ch_errf(err, sizeof err, -EINVAL, "bad job id");
    if (rc < 0) {
        Chorus__Error e = CHORUS__ERROR__INIT;
        e.code = rc;
        e.message = err;
        env.body_case = CHORUS__ENVELOPE__BODY_ERROR;
        env.error = &e;
        env.request_id = req->request_id;
        wrk_agent_coord_send(a, &env);
        return;
    }
    lc.node = a->cfg.name;
    lc.path = path;
    env.body_case = CHORUS__ENVELOPE__BODY_LOG_CHUNK;
    env.log_chunk = &lc;
    env.request_id = req->request_id;
    wrk_agent_coord_send(a, &env);
    free(lc.data.data);
}

void wrk_agent_coord_msg(wrk_agent_t *a, Chorus__Envelope *env)
{
    switch (env->body_case) {
    case CHORUS__ENVELOPE__BODY_REGISTER_ACK:
        on_registered(a, env->register_ack);
        return;
    case CHORUS__ENVELOPE__BODY_START_RANKS:
        on_start_ranks(a, env->start_ranks);
        return;
    case CHORUS__ENVELOPE__BODY_RANK_EXIT_ACK:
        fin_ack(a, env->rank_exit_ack);
        return;
    case CHORUS__ENVELOPE__BODY_CHECKPOINT_RANKS:
        forward_checkpoint(a, env->checkpoint_ranks);
        return;
    case CHORUS__ENVELOPE__BODY_LOG_READ:
        serve_log(a, env);
        return;
    case CHORUS__ENVELOPE__BODY_PROGRESS_DETAIL:
        if (a->progress)
            wrk_progress_want_detail(a->progress, env->progress_detail->job_id);
        return;
    case CHORUS__ENVELOPE__BODY_KILL_RANKS:
        CH_LOGI("agent", "job=%s: kill ranks of gen <= %" PRIu64 " (%s)", env->kill_ranks->job_id,
                env->kill_ranks->generation, env->kill_ranks->reason);
        kill_matching(a, env->kill_ranks->job_id, env->kill_ranks->generation,
                      env->kill_ranks->ranks, env->kill_ranks->n_ranks);
        return;
    default:
        break;
    }
    if (wrk_agent_route_reply(a, env))
        return;
    if (env->body_case == CHORUS__ENVELOPE__BODY_ERROR)
        CH_LOGW("agent", "coordinator: error %d: %s", env->error->code, env->error->message);
    else
        CH_LOGD("agent", "coordinator: ignoring %s", ch_msg_name(env));
}

static void on_coord_msg(ch_conn_t *c, Chorus__Envelope *env, void *ud)
{
    (void)c;
    wrk_agent_coord_msg(ud, env);
}

static void schedule_reconnect(wrk_agent_t *a)
{
    if (a->stopping)
        return;
    /* Jitter in [d/2, d]: nodes restarted together do not reconnect in lockstep. */
    uint32_t d = a->backoff_ms;
    uint32_t delay = d / 2 + (uint32_t)(ch_mix64_next(&a->rng) % (d / 2 + 1));
    a->backoff_ms = d * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : d * 2;
    uv_timer_start(&a->reconnect, on_reconnect_timer, delay, 0);
}

static void on_coord_close(ch_conn_t *c, int reason, void *ud)
{
    wrk_agent_t *a = ud;
    (void)c;
    if (a->registered)
        CH_LOGW("agent", "node=%s: lost coordinator %s:%d (%s); reconnecting", a->cfg.name,
                a->cfg.host, a->cfg.port, reason ? ch_strerror(reason) : "closed");
    else
        CH_LOGD("agent", "coordinator %s:%d: %s", a->cfg.host, a->cfg.port,
                reason ? ch_strerror(reason) : "closed");
    a->coord = NULL;
    a->corked = NULL; /* the close wrote what was gathered */
    a->registered = 0;
    uv_timer_stop(&a->heartbeat);
    wrk_agent_relays_fail(a, NULL, -ENOTCONN);
    schedule_reconnect(a);
}

static void connect_now(wrk_agent_t *a)
{
    ch_conn_opts_t o = {.key = a->cfg.key, .is_server = 0, .role = "worker"};
    ch_conn_cbs_t cbs = {on_coord_ready, on_coord_msg, on_coord_close};
    if (a->stopping || a->coord)
        return;
    int rc = ch_conn_connect_tcp(a->loop, a->cfg.host, a->cfg.port, &o, &cbs, a, &a->coord);
    if (rc < 0) {
        a->coord = NULL;
        CH_LOGD("agent", "connect %s:%d: %s", a->cfg.host, a->cfg.port, ch_strerror(rc));
        schedule_reconnect(a);
    }
}

static void on_reconnect_timer(uv_timer_t *t)
{
    connect_now(t->data);
}

static void on_cron(uv_timer_t *t)
{
    wrk_agent_t *a = t->data;
    uint64_t now = ch_now_ms();
    for (kv_relay_t **pp = &a->relays; *pp;) {
        if ((*pp)->expire_ms <= now) {
            wrk_agent_reply_rank_code((*pp)->ent, (*pp)->rank_id, -ETIMEDOUT);
            wrk_agent_relay_remove(a, pp);
        } else {
            pp = &(*pp)->next;
        }
    }
    for (rank_ent_t *e = a->ranks, *next; e; e = next) {
        next = e->next; /* adopted_check may finish e */
        if (e->adopted && wrk_agent_adopted_check(a, e, now))
            continue;
        if (e->exited && e->link && now - e->exited_ms >= LINK_GRACE_MS)
            ch_conn_close(e->link); /* on_rank_close finishes the entry later */
        if (e->proc && !e->link && !e->orphan_killed && now - e->link_closed_ms >= LINK_GRACE_MS) {
            CH_LOGW("agent", "job=%s gen=%" PRIu64 " rank=%u: lost its link to workerd; killing it",
                    e->job_id, e->gen, e->rank);
            e->orphan_killed = 1;
            wrk_proc_kill(e->proc, SIGKILL);
        }
    }
    if (a->progress)
        wrk_progress_tick(a->progress, now);
}

// ----------------------------------------------------------------------------
// lifecycle

int wrk_agent_create(uv_loop_t *loop, const wrk_agent_cfg_t *cfg, wrk_agent_t **out)
{
    wrk_agent_t *a = calloc(1, sizeof *a);
    if (!a)
        return -ENOMEM;
    if (wrk_evq_init(&a->queue) < 0) {
        free(a);
        return -ENOMEM;
    }
    a->loop = loop;
    a->cfg = *cfg;
    if (a->cfg.slots == 0)
        a->cfg.slots = 1;
    if (a->cfg.rank_exe)
        snprintf(a->rank_exe, sizeof a->rank_exe, "%s", a->cfg.rank_exe);
    else
        (void)wrk_proc_rank_exe(a->rank_exe, sizeof a->rank_exe); /* a spawn names it if missing */
    a->cfg.rank_exe = a->rank_exe;
    if (a->cfg.progress_ms) {
        wrk_progress_cfg_t pc = {.interval_ms = a->cfg.progress_ms,
                                 .detail_every = a->cfg.progress_detail_every,
                                 .send = progress_send,
                                 .unsent = progress_unsent,
                                 .ud = a};
        if (wrk_progress_create(&pc, &a->progress) < 0) {
            wrk_evq_fini(&a->queue);
            free(a);
            return -ENOMEM;
        }
    }
    a->backoff_ms = BACKOFF_MIN_MS;
    a->record_fd = -1;
    a->relink_grace_ms = wrk_agent_relink_grace_ms();
    a->rng = ch_now_ns() ^ ((uint64_t)(uintptr_t)a << 16);
    uv_timer_init(loop, &a->reconnect);
    uv_timer_init(loop, &a->heartbeat);
    uv_timer_init(loop, &a->cron);
    uv_prepare_init(loop, &a->flush);
    a->reconnect.data = a->heartbeat.data = a->cron.data = a->flush.data = a;
    *out = a;
    return 0;
}

int wrk_agent_start(wrk_agent_t *a)
{
    wrk_adopt_rank_t *left = NULL;
    size_t nleft = 0;
    a->record_fd = a->cfg.run_dir[0] ? wrk_adopt_start(a->cfg.run_dir, &left, &nleft) : -1;
    if (a->record_fd >= 0) {
        int rc = wrk_agent_listen_ranks(a);
        if (rc < 0)
            CH_LOGW("agent", "%s/%s: %s; ranks die with this workerd", a->cfg.run_dir, AGENT_SOCK,
                    ch_strerror(rc));
    }
    for (size_t i = 0; i < nleft; i++)
        wrk_agent_adopt_one(a, &left[i]);
    a->stats.ranks_left_at_start = (uint32_t)nleft;
    free(left);
    if (nleft)
        wrk_agent_ranks_record(a);
    uv_timer_start(&a->cron, on_cron, CRON_MS, CRON_MS);
    uv_prepare_start(&a->flush, on_flush);
    /* Through the timer so the first connect runs on the loop like every retry. */
    uv_timer_start(&a->reconnect, on_reconnect_timer, 0, 0);
    return 0;
}

/* Stop everything; kill: the ranks too, else leave them to the next workerd. */
static void stop(wrk_agent_t *a, int kill_ranks)
{
    if (a->stopping)
        return;
    a->stopping = 1;
    a->registered = 0;
    if (kill_ranks) {
        kill_matching(a, NULL, 0, NULL, 0);
    } else {
        a->detached = 1;
        for (rank_ent_t *e = a->ranks; e; e = e->next) {
            wrk_proc_release(e->proc);
            e->proc = NULL;
        }
    }
    if (a->listening)
        uv_close((uv_handle_t *)&a->listener, NULL);
    a->listening = 0;
    for (rank_ent_t *e = a->ranks; e; e = e->next)
        if (e->link)
            ch_conn_close(e->link);
    wrk_agent_relays_fail(a, NULL, 0);
    if (a->coord)
        ch_conn_close(a->coord); /* it writes what was gathered first */
    a->corked = NULL;
    uv_close((uv_handle_t *)&a->flush, NULL);
    uv_close((uv_handle_t *)&a->reconnect, NULL);
    uv_close((uv_handle_t *)&a->heartbeat, NULL);
    uv_close((uv_handle_t *)&a->cron, NULL);
}

void wrk_agent_stop(wrk_agent_t *a)
{
    stop(a, 1);
}

void wrk_agent_detach(wrk_agent_t *a)
{
    stop(a, 0);
}

void wrk_agent_destroy(wrk_agent_t *a)
{
    if (!a)
        return;
    while (a->ranks) {
        rank_ent_t *e = a->ranks;
        a->ranks = e->next;
        free(e);
    }
    while (a->finished) {
        fin_ent_t *f = a->finished;
        a->finished = f->next;
        free(f);
    }
    wrk_agent_relays_fail(a, NULL, 0);
    wrk_evq_fini(&a->queue);
    wrk_progress_destroy(a->progress);
    if (a->record_fd >= 0)
        close(a->record_fd);
    free(a);
}

uint32_t wrk_agent_ranks_alive(const wrk_agent_t *a)
{
    return alive_count(a);
}

int wrk_agent_registered(const wrk_agent_t *a)
{
    return a->registered;
}

void wrk_agent_stats(const wrk_agent_t *a, wrk_agent_stats_t *out)
{
    *out = a->stats;
    out->ranks_alive = alive_count(a);
    out->slots = a->cfg.slots;
    out->registered = a->registered;
    out->events_queued = (uint32_t)a->queue.len;
}
