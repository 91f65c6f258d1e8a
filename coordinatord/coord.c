/* The coordinator's state object: setup, timers, teardown; see coord.h.
 *
 * One periodic cron (period about heartbeat_ms/4, at least every 250 ms and at most
 * every 10 ms) checks node liveness and re-adoption deadlines; one-shot timers follow
 * the earliest rendezvous deadline and the moment the node heard longest ago can pass
 * dead-after; a prepare hook runs the scheduler once per loop
 * iteration after anything changed (Redis's beforeSleep), so a burst of events costs
 * one scheduling pass, and then commits the loop turn's writes in one transaction and
 * writes what it sent each link in one system call. */
#include "coord.h"
#include "logs.h"

#include <grp.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/err.h"
#include "common/log.h"
#include "common/notify.h"
#include "common/util.h"
#include "launch.h"
#include "recovery.h"
#include "rpc.h"
#include "scheduler.h"

void coord_event(coord_t *c, const char *job, uint64_t gen, int64_t rank, const char *node,
                 const char *what)
{
    coord_store_event(c->store, job, gen, rank, node, what);
}

void coord_changed(coord_t *c)
{
    c->changed = 1;
}

/* systemd's STATUS= line, worked out at most once a second: counting the nodes is a walk
 * of every one (a cache miss each at 2,048), which four times a second was a share of the
 * coordinator's steady state of its own. */
static void update_status(coord_t *c)
{
    size_t nodes[COORD_NODE_NSTATES], jobs[COORD_JOB_NSTATES];
    char status[sizeof(c->status)];
    uint64_t now = ch_now_ms();
    if (c->status[0] && now - c->status_ms < 1000)
        return;
    c->status_ms = now;
    coord_nodes_count(c, nodes);
    coord_jobs_count(c, jobs);
    snprintf(status, sizeof(status), "STATUS=%zu nodes alive of %zu, %zu jobs running, %zu queued",
             nodes[COORD_NODE_ALIVE], c->nodes.n,
             jobs[COORD_JOB_RUNNING] + jobs[COORD_JOB_STARTING] + jobs[COORD_JOB_RECOVERING],
             jobs[COORD_JOB_QUEUED]);
    if (strcmp(status, c->status) != 0) {
        snprintf(c->status, sizeof(c->status), "%s", status);
        ch_notify(status);
    }
}

/* A turn that read a few of the workers' messages (fewer than twice COORD_COALESCE_MSGS)
 * naps before it polls, long enough for COORD_COALESCE_MSGS more at the rate of the last
 * second, at most COORD_COALESCE_MAX_US; none where the rate would bring fewer than 2 in
 * that time, and none for COORD_NO_NAP_MS after a connection, a control message or a
 * worker's message that waits for an answer (a registration, the rendezvous store: a job's
 * start and a restart go at their own pace). */
#define COORD_COALESCE_MSGS   8
#define COORD_COALESCE_MAX_US 4000
#define COORD_NO_NAP_MS       200

void coord_no_nap(coord_t *c)
{
    c->nap_after_ms = ch_now_ms() + COORD_NO_NAP_MS;
}

/* At 16,384 ranks the nodes' messages arrive spread out (2,000 a second), and a poll that
 * wakes for each pays a wake-up, an epoll_wait and a context switch per message: a third
 * of the steady state. A turn that read a few messages (what it sent is already written)
 * naps, so that the next poll finds the messages of the nap together: at 2,000 a second
 * 4 ms (8 of them; a 1 ms nap, as before, left a turn a millisecond and the turns' naps
 * and polls still 30% of the steady state). A turn that read many (a burst: the start) or
 * none (a timer) does not: bursts keep their pace, and an idle coordinator still sleeps in
 * its poll. Nor does a turn of a small cluster, whose messages are too sparse to gather (a
 * nap would only delay them). A worker's report waits at most 4 ms more; a question (a
 * control client's, a worker's rendezvous) none (coord_no_nap). */
static void coalesce(coord_t *c)
{
    uint32_t n = c->turn_msgs;
    c->turn_msgs = 0;
    uint64_t now = ch_now_ms();
    c->rate_msgs += n;
    if (now - c->rate_ms >= 1000) { /* the workers' messages a second, for the naps */
        c->msgs_per_s = now > c->rate_ms ? c->rate_msgs * 1000 / (now - c->rate_ms) : 0;
        c->rate_ms = now;
        c->rate_msgs = 0;
    }
    if (n == 0 || n >= 2 * COORD_COALESCE_MSGS || c->stopping || c->srv.n_unauth ||
        now < c->nap_after_ms || c->msgs_per_s * COORD_COALESCE_MAX_US < 2 * 1000000ull)
        return;
    uint64_t us = COORD_COALESCE_MSGS * 1000000ull / c->msgs_per_s;
    if (us > COORD_COALESCE_MAX_US)
        us = COORD_COALESCE_MAX_US;
    struct timespec ts = {.tv_sec = 0, .tv_nsec = (long)us * 1000L};
    (void)nanosleep(&ts, NULL); /* EINTR: poll sooner */
}

static void turn_clock(coord_t *c)
{
    if (!c->turn_ms) {
        c->turn_ms = ch_now_ms();
        c->turn_wall_ms = ch_wall_ms();
    }
}

uint64_t coord_turn_ms(coord_t *c)
{
    turn_clock(c);
    return c->turn_ms;
}

uint64_t coord_turn_wall_ms(coord_t *c)
{
    turn_clock(c);
    return c->turn_wall_ms;
}

static void on_before_sleep(uv_prepare_t *h)
{
    coord_t *c = h->data;
    /* A scheduling pass may change things again (a start): loop until quiet. */
    for (int i = 0; i < 8 && c->changed && !c->stopping; i++) {
        c->changed = 0;
        coord_sched_run(c);
    }
    /* One commit for everything this loop turn wrote (store.h). */
    coord_store_commit(c->store);
    /* Then what the turn sent, one write a link (server.h). */
    coord_server_flush(c);
    coalesce(c);
    c->polled_ms = ch_now_ms(); /* what is waiting now is read in the coming poll */
    c->turn_ms = 0;             /* what it reads happened after now */
}

static void on_cron(uv_timer_t *t)
{
    coord_t *c = t->data;
    uint64_t now = ch_now_ms();
    coord_node_check(c, now);
    coord_job_check(c, now);
    coord_logs_expire(c, now);
    coord_series_tick(c, now);
    update_status(c);
}

static void on_live_timer(uv_timer_t *t)
{
    coord_t *c = t->data;
    coord_node_check(c, ch_now_ms());
}

void coord_live_rearm(coord_t *c, uint64_t due_ms)
{
    if (c->stopping || !c->handles_open)
        return;
    uint64_t now = ch_now_ms();
    /* At least 1 ms: silence counts up to the last poll, so the check at due_ms may
     * need one more turn of the loop (a poll) to see it. */
    uv_timer_start(&c->live_timer, on_live_timer, due_ms > now ? due_ms - now : 1, 0);
}

static void on_kv_timer(uv_timer_t *t)
{
    coord_t *c = t->data;
    coord_kv_expire(c->kv, ch_now_ms());
    coord_kv_rearm(c);
}

void coord_kv_rearm(coord_t *c)
{
    uint64_t deadline, now = ch_now_ms();
    if (c->stopping || !c->handles_open)
        return;
    if (!coord_kv_next_deadline(c->kv, &deadline)) {
        uv_timer_stop(&c->kv_timer);
        return;
    }
    uv_timer_start(&c->kv_timer, on_kv_timer, deadline > now ? deadline - now : 0, 0);
}

/* Pings only while the loop runs this timer: a stuck loop stops the pings and systemd
 * restarts the daemon. */
static void on_watchdog(uv_timer_t *t)
{
    (void)t;
    ch_notify("WATCHDOG=1");
}

int coord_init(coord_t *c, uv_loop_t *loop, const coord_cfg_t *cfg, const ch_key_t *key)
{
    int rc;
    memset(c, 0, sizeof(*c));
    c->loop = loop;
    c->cfg = *cfg;
    if (key)
        c->key = *key;
    c->uid = getuid();
    if (cfg->ctl_group[0]) {
        struct group gr, *res = NULL;
        char buf[4096];
        if (getgrnam_r(cfg->ctl_group, &gr, buf, sizeof(buf), &res) != 0 || !res) {
            CH_LOGE("main", "ctl-group: no group named \"%s\"", cfg->ctl_group);
            return CH_E_CONFIG;
        }
        c->ctl_gid = res->gr_gid;
        c->have_ctl_gid = 1;
    }
    if (coord_users_init(&c->users, cfg->run_as_user, cfg->admin_group, cfg->allow_root_jobs) < 0) {
        CH_LOGE("main",
                "run-as-user \"%s\" or admin-group \"%s\": no such user or group (root's "
                "jobs run as run-as-user: deploy/install.sh creates chorus-jobs; or set "
                "run-as-user, or allow-root-jobs)",
                cfg->run_as_user, cfg->admin_group);
        return CH_E_CONFIG;
    }
    CH_CHECK_GOTO(coord_kv_create(coord_rpc_kv_reply, c, &c->kv), rc, fail);
    rc = coord_store_open(cfg->state_dir, &c->store);
    if (rc < 0) {
        CH_LOGE("main", "state store in %s: %s", cfg->state_dir, ch_strerror(rc));
        goto fail;
    }
    CH_CHECK_GOTO(coord_launch_init(c), rc, fail);
    CH_CHECK_GOTO(coord_nodes_load(c), rc, fail);
    CH_CHECK_GOTO(coord_jobs_load(c), rc, fail);
    CH_CHECK_GOTO(coord_recovery_load(c), rc, fail);
    return 0;
fail:
    coord_fini(c);
    return rc;
}

static int write_addr(coord_t *c, const char *file, const char *addr)
{
    char path[PATH_MAX], text[128];
    snprintf(path, sizeof(path), "%s/%s", c->cfg.state_dir, file);
    int n = snprintf(text, sizeof(text), "%s\n", addr);
    int rc = ch_file_write_atomic(path, text, (size_t)n, 0644);
    if (rc < 0)
        CH_LOGE("main", "write %s: %s", path, ch_strerror(rc));
    return rc;
}

int coord_start(coord_t *c)
{
    int rc;
    uv_timer_init(c->loop, &c->cron);
    uv_timer_init(c->loop, &c->kv_timer);
    uv_timer_init(c->loop, &c->watchdog);
    uv_timer_init(c->loop, &c->live_timer);
    uv_prepare_init(c->loop, &c->before_sleep);
    c->cron.data = c->kv_timer.data = c->watchdog.data = c->before_sleep.data = c;
    c->live_timer.data = c;
    c->handles_open = 1;

    CH_CHECK_GOTO(coord_server_start(c), rc, out);
    CH_CHECK_GOTO(coord_http_start(c), rc, out);
    CH_CHECK_GOTO(write_addr(c, "coordinatord.addr", c->srv.addr), rc, out);
    if (c->http.open)
        CH_CHECK_GOTO(write_addr(c, "coordinatord.metrics.addr", c->http.addr), rc, out);

    long period = c->cfg.heartbeat_ms / 4;
    period = period < 10 ? 10 : period > 250 ? 250 : period;
    uv_timer_start(&c->cron, on_cron, (uint64_t)period, (uint64_t)period);
    uv_prepare_start(&c->before_sleep, on_before_sleep);
    uint64_t usec = 0;
    if (ch_notify_watchdog_usec(&usec)) {
        uint64_t ms = usec / 2000 ? usec / 2000 : 1;
        uv_timer_start(&c->watchdog, on_watchdog, ms, ms);
        CH_LOGI("main", "systemd watchdog: pinging every %llu ms", (unsigned long long)ms);
    }
    coord_changed(c);
    CH_LOGI("main", "coordinator up: %s, state %s, heartbeat %ld ms, dead after %ld ms",
            c->srv.addr, c->cfg.state_dir, c->cfg.heartbeat_ms, c->cfg.dead_after_ms);
    ch_notify("READY=1");
    update_status(c);
out:
    return rc;
}

void coord_stop(coord_t *c)
{
    if (c->stopping)
        return;
    c->stopping = 1;
    ch_notify("STOPPING=1");
    coord_server_stop(c);
    coord_http_stop(c);
    if (c->handles_open) {
        uv_close((uv_handle_t *)&c->cron, NULL);
        uv_close((uv_handle_t *)&c->kv_timer, NULL);
        uv_close((uv_handle_t *)&c->watchdog, NULL);
        uv_close((uv_handle_t *)&c->live_timer, NULL);
        uv_close((uv_handle_t *)&c->before_sleep, NULL);
        c->handles_open = 0;
    }
}

void coord_fini(coord_t *c)
{
    coord_series_fini(c);
    coord_share_fini(c);
    coord_logs_fini(c);
    coord_jobs_fini(c);
    coord_nodes_fini(c);
    coord_kv_destroy(c->kv);
    c->kv = NULL;
    coord_store_close(c->store);
    c->store = NULL;
}
