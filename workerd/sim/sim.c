/* Simulated nodes; see sim.h.
 *
 * Theory of operation.
 *  - A node is a link (conn.h, the same handshake and frames as workerd's agent), three
 *    timers (reconnect, heartbeat, step) and the groups of ranks it runs: one group per
 *    StartRanks, freed when its last rank exited.
 *  - A rank's rendezvous is one KvSet and up to three KvGets sent at once; replies come
 *    back under request ids the node hands out, matched in a small per-node table (a
 *    node has at most slots x 4 requests outstanding).
 *  - One step timer per node (its phase spread over step_ms) advances every rank of the
 *    node that is past rendezvous, so the coordinator sees progress spread evenly over
 *    each step, as from real nodes that do not start in lockstep.
 *  - While a node is not registered its ranks pause: nothing is queued, so nothing of a
 *    rank's life is sent twice or out of order.
 *  - With cfg.progress_ms a node speaks for its ranks as workerd does, through the same
 *    aggregator (workerd/progress.h): rank 0's reports and every other event at once, the
 *    other ranks' progress as one NodeProgress per interval. */
#include "workerd/sim/sim.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/conn.h"
#include "common/err.h"
#include "common/jobspec.h"
#include "common/log.h"
#include "common/msg.h"
#include "common/plan.h"
#include "common/rng.h"
#include "common/util.h"
#include "workerd/progress.h"

#define BACKOFF_MIN_MS 100
#define BACKOFF_MAX_MS 1000
/* Links opened but not yet registered, at most: half the coordinator's cap on
 * unauthenticated connections (512), which closes the oldest beyond it, so a start of
 * thousands of nodes queues here instead of being cut and retried with back-off. */
#define CONNECTING_MAX       256
#define HEARTBEAT_DEFAULT_MS 1000
#define ADDR_BYTES           256   /* a UCX worker address is a few hundred bytes */
#define KV_GET_TIMEOUT_MS    60000 /* a real rank's collective timeout is of this order */
#define SIGKILL_NUM          9

typedef struct sim_rank {
    uint32_t rank;
    int alive;   /* started, not exited */
    int waiting; /* rendezvous requests outstanding */
    int rdzv;    /* past rendezvous */
    uint64_t step;
} sim_rank_t;

typedef struct sim_group {
    struct sim_group *next;
    char job_id[64];
    uint64_t gen;
    uint64_t token; /* StartRanks.launch_token: every report presents it */
    ch_layout_t layout;
    uint64_t total, every;
    uint32_t n, n_alive;
    sim_rank_t *ranks;
} sim_group_t;

typedef struct sim_req {
    uint64_t id;
    sim_group_t *g;
    uint32_t idx; /* into g->ranks */
} sim_req_t;

typedef struct sim_node {
    wrk_sim_t *s;
    uint32_t idx;
    char name[64], rack[64];
    ch_conn_t *conn;
    int registered, hung, crashed;
    int connecting, queued; /* counted in wrk_sim.connecting; in its wait queue */
    uint32_t hb_ms, dead_after_ms, backoff_ms; /* RegisterAck */
    int coord_checkpoints;                     /* RegisterAck.node_checkpoints */
    uint64_t last_hb_ms; /* monotonic: the last message sent (each counts as a heartbeat) */
    uv_timer_t reconnect, heartbeat, step;
    uint64_t step_due; /* loop time the step timer is due (a fixed rate, not re-armed late) */
    sim_group_t *groups;
    sim_req_t *reqs;
    size_t n_reqs, cap_reqs;
    uint64_t next_id;
    wrk_progress_t *progress; /* NULL: cfg.progress_ms 0, every report sent at once */
} sim_node_t;

struct wrk_sim {
    uv_loop_t *loop;
    wrk_sim_cfg_t cfg;
    sim_node_t *nodes;
    int stopping;
    uint64_t rng;
    uint64_t events_sent, kv_errors, start_msgs, kill_msgs, heartbeats_sent;
    uint32_t connecting;               /* links not yet registered (<= CONNECTING_MAX) */
    uint32_t *wait, wait_head, n_wait; /* nodes waiting to connect: a ring of cfg.nodes */
};

static void connect_node(sim_node_t *n);

static int send_env(sim_node_t *n, Chorus__Envelope *env)
{
    if (!n->conn || !ch_conn_is_ready(n->conn))
        return -ENOTCONN;
    int rc = ch_conn_send(n->conn, env);
    if (rc == 0)
        n->last_hb_ms = ch_now_ms();
    return rc;
}

static int send_progress(void *ud, Chorus__Envelope *env)
{
    sim_node_t *n = ud;
    int rc = send_env(n, env);
    if (rc == 0)
        n->s->events_sent++;
    return rc;
}

static void send_event(sim_node_t *n, const sim_group_t *g, uint32_t rank, Chorus__RankEvent *ev)
{
    Chorus__Envelope env = CHORUS__ENVELOPE__INIT;
    ev->job_id = (char *)g->job_id;
    ev->generation = g->gen;
    ev->rank = rank;
    ev->launch_token = g->token;
    if (n->progress) { /* what workerd's agent does (agent.c send_event) */
        if (ev->kind == CHORUS__RANK_EVENT_KIND__RANK_CHECKPOINT && n->coord_checkpoints &&
            wrk_progress_checkpoint(n->progress, ev, g->n_alive) == 0)
            return;
        if (ev->kind == CHORUS__RANK_EVENT_KIND__RANK_PROGRESS && rank != 0 &&
            wrk_progress_add(n->progress, ev) == 0)
            return;
        if (ev->kind != CHORUS__RANK_EVENT_KIND__RANK_PROGRESS)
            wrk_progress_flush(n->progress, g->job_id, g->gen);
    }
    env.body_case = CHORUS__ENVELOPE__BODY_RANK_EVENT;
    env.rank_event = ev;
    if (send_env(n, &env) == 0)
        n->s->events_sent++;
}

static void send_kind(sim_node_t *n, const sim_group_t *g, uint32_t rank, Chorus__RankEventKind k,
                      int code, int sig, const char *msg)
{
    Chorus__RankEvent ev = CHORUS__RANK_EVENT__INIT;
    ev.kind = k;
    ev.exit_code = code;
    ev.signal = sig;
    if (msg)
        ev.message = (char *)msg;
    send_event(n, g, rank, &ev);
}

// ----------------------------------------------------------------------------
// groups and ranks

static void group_free(sim_node_t *n, sim_group_t *g)
{
    for (size_t i = 0; i < n->n_reqs;) { /* its requests' replies are dropped */
        if (n->reqs[i].g == g)
            n->reqs[i] = n->reqs[--n->n_reqs];
        else
            i++;
    }
    for (sim_group_t **pp = &n->groups; *pp; pp = &(*pp)->next) {
        if (*pp == g) {
            *pp = g->next;
            break;
        }
    }
    free(g->ranks);
    free(g);
}

static void groups_free(sim_node_t *n)
{
    while (n->groups)
        group_free(n, n->groups);
    n->n_reqs = 0;
}

/* The rank's process is gone: report its exit; free the group after its last rank. */
static void rank_exit(sim_node_t *n, sim_group_t *g, uint32_t i, int code, int sig)
{
    sim_rank_t *r = &g->ranks[i];
    if (!r->alive)
        return;
    r->alive = 0;
    g->n_alive--;
    send_kind(n, g, r->rank, CHORUS__RANK_EVENT_KIND__RANK_EXITED, code, sig, NULL);
    if (g->n_alive == 0)
        group_free(n, g);
}

static uint32_t ranks_alive(const sim_node_t *n)
{
    uint32_t k = 0;
    for (const sim_group_t *g = n->groups; g; g = g->next)
        k += g->n_alive;
    return k;
}

static int req_add(sim_node_t *n, sim_group_t *g, uint32_t idx, uint64_t *id)
{
    if (n->n_reqs == n->cap_reqs) {
        size_t cap = n->cap_reqs ? n->cap_reqs * 2 : 16;
        sim_req_t *v = realloc(n->reqs, cap * sizeof *v);
        if (!v)
            return -ENOMEM;
        n->reqs = v;
        n->cap_reqs = cap;
    }
    *id = ++n->next_id;
    n->reqs[n->n_reqs++] = (sim_req_t){.id = *id, .g = g, .idx = idx};
    return 0;
}

static void kv_send(sim_node_t *n, sim_group_t *g, uint32_t idx, const char *key, int set)
{
    Chorus__Envelope env = CHORUS__ENVELOPE__INIT;
    Chorus__KvSet ks = CHORUS__KV_SET__INIT;
    Chorus__KvGet kg = CHORUS__KV_GET__INIT;
    uint8_t addr[ADDR_BYTES];
    uint64_t id;
    if (req_add(n, g, idx, &id) < 0) {
        n->s->kv_errors++;
        return;
    }
    env.request_id = id;
    if (set) {
        for (size_t i = 0; i < sizeof addr; i++)
            addr[i] = (uint8_t)(g->ranks[idx].rank * 31 + i);
        ks.job_id = g->job_id;
        ks.generation = g->gen;
        ks.key = (char *)key;
        ks.value.data = addr;
        ks.value.len = sizeof addr;
        env.body_case = CHORUS__ENVELOPE__BODY_KV_SET;
        env.kv_set = &ks;
    } else {
        kg.job_id = g->job_id;
        kg.generation = g->gen;
        kg.key = (char *)key;
        kg.timeout_ms = KV_GET_TIMEOUT_MS;
        env.body_case = CHORUS__ENVELOPE__BODY_KV_GET;
        env.kv_get = &kg;
    }
    if (send_env(n, &env) < 0) {
        n->n_reqs--; /* the entry just added */
        n->s->kv_errors++;
        return;
    }
    g->ranks[idx].waiting++;
}

/* The rendezvous of one rank, as a 3-D layout's first collectives do it: publish its
 * address, then fetch its TP ring successor, DP ring successor and next stage. */
static void rank_rendezvous(sim_node_t *n, sim_group_t *g, uint32_t idx)
{
    ch_layout_t l = g->layout;
    uint32_t r = g->ranks[idx].rank;
    ch_coord_t c = ch_layout_coord(l, r), succ;
    uint32_t peers[3], np = 0;
    char key[32];
    snprintf(key, sizeof key, "ucx/%u", r);
    kv_send(n, g, idx, key, 1);
    if (l.tp > 1) {
        succ = c;
        succ.tp = (c.tp + 1) % l.tp;
        peers[np++] = ch_layout_rank(l, succ);
    }
    if (l.dp > 1) {
        succ = c;
        succ.dp = (c.dp + 1) % l.dp;
        peers[np++] = ch_layout_rank(l, succ);
    }
    int64_t next = ch_layout_pp_next(l, r);
    if (next >= 0)
        peers[np++] = (uint32_t)next;
    for (uint32_t i = 0; i < np; i++) {
        snprintf(key, sizeof key, "ucx/%u", peers[i]);
        kv_send(n, g, idx, key, 0);
    }
}

static void on_kv_reply(sim_node_t *n, const Chorus__Envelope *env)
{
    int code = env->body_case == CHORUS__ENVELOPE__BODY_KV_REPLY ? env->kv_reply->code
               : env->body_case == CHORUS__ENVELOPE__BODY_ERROR  ? env->error->code
                                                                 : CH_E_FORMAT;
    for (size_t i = 0; i < n->n_reqs; i++) {
        if (n->reqs[i].id != env->request_id)
            continue;
        sim_req_t q = n->reqs[i];
        n->reqs[i] = n->reqs[--n->n_reqs];
        sim_rank_t *r = &q.g->ranks[q.idx];
        if (!r->alive)
            return;
        r->waiting--;
        if (code < 0) {
            /* A real rank whose rendezvous fails reports why and exits non-zero. */
            char msg[128];
            n->s->kv_errors++;
            snprintf(msg, sizeof msg, "rendezvous: %s", ch_strerror(code));
            send_kind(n, q.g, r->rank, CHORUS__RANK_EVENT_KIND__RANK_FAILED, 0, 0, msg);
            rank_exit(n, q.g, q.idx, 1, 0);
            return;
        }
        if (r->waiting == 0)
            r->rdzv = 1;
        return;
    }
}

static void on_start_ranks(sim_node_t *n, const Chorus__StartRanks *sr)
{
    char err[256];
    ch_jobspec_t spec;
    n->s->start_msgs++;
    for (sim_group_t *g = n->groups; g; g = g->next) {
        if (strcmp(g->job_id, sr->job_id) == 0 && g->gen >= sr->generation) {
            CH_LOGW("sim", "node=%s job=%s: stale StartRanks gen=%" PRIu64, n->name, sr->job_id,
                    sr->generation);
            return;
        }
    }
    /* A newer generation supersedes whatever is left of older ones. */
    for (sim_group_t *g = n->groups, *next; g; g = next) {
        next = g->next;
        if (strcmp(g->job_id, sr->job_id) != 0)
            continue;
        /* left first: the last exit frees g */
        for (uint32_t i = 0, left = g->n_alive; left && i < g->n; i++) {
            if (g->ranks[i].alive) {
                left--;
                rank_exit(n, g, i, 0, SIGKILL_NUM);
            }
        }
    }
    ch_jobspec_defaults(&spec);
    sim_group_t *g = calloc(1, sizeof *g);
    if (g)
        g->ranks = calloc(sr->n_ranks ? sr->n_ranks : 1, sizeof *g->ranks);
    if (!g || !g->ranks || ch_jobspec_parse(sr->job_ini, &spec, err, sizeof err) < 0) {
        CH_LOGE("sim", "node=%s job=%s: cannot run StartRanks: %s", n->name, sr->job_id,
                g && g->ranks ? err : "out of memory");
        if (g)
            free(g->ranks);
        free(g);
        return;
    }
    snprintf(g->job_id, sizeof g->job_id, "%s", sr->job_id);
    g->gen = sr->generation;
    g->token = sr->launch_token;
    g->layout = ch_jobspec_layout(&spec);
    g->total = spec.train.steps > 0 ? (uint64_t)spec.train.steps : 1;
    g->every =
        spec.checkpoint.dir[0] && spec.checkpoint.every > 0 ? (uint64_t)spec.checkpoint.every : 0;
    g->n = g->n_alive = (uint32_t)sr->n_ranks;
    g->next = n->groups;
    n->groups = g;
    for (uint32_t i = 0; i < g->n; i++) {
        g->ranks[i].rank = sr->ranks[i]->rank;
        g->ranks[i].alive = 1;
        g->ranks[i].step = sr->resume_step;
    }
    /* The ranks' starts and rendezvous requests go in one write, as a node whose loop
     * turn sends them together does (one syscall, not five a rank). */
    ch_conn_cork(n->conn);
    for (uint32_t i = 0; i < g->n; i++) {
        Chorus__RankEvent ev = CHORUS__RANK_EVENT__INIT;
        ev.kind = CHORUS__RANK_EVENT_KIND__RANK_STARTED;
        ch_place_t place;
        if (spec.kind == CH_JOB_TRAIN && ch_plan_place(&spec, g->ranks[i].rank, &place) == 0)
            ch_msg_place_to_event(&place, &ev); /* as a real rank reports it */
        send_event(n, g, g->ranks[i].rank, &ev);
        rank_rendezvous(n, g, i);
    }
    (void)ch_conn_uncork(n->conn); /* a failed write closes the link */
}

static int listed(uint32_t rank, const uint32_t *ranks, size_t n)
{
    if (n == 0)
        return 1;
    for (size_t i = 0; i < n; i++)
        if (ranks[i] == rank)
            return 1;
    return 0;
}

static void on_kill_ranks(sim_node_t *n, const Chorus__KillRanks *kr)
{
    n->s->kill_msgs++;
    for (sim_group_t *g = n->groups, *next; g; g = next) {
        next = g->next;
        if (strcmp(g->job_id, kr->job_id) != 0 || g->gen > kr->generation)
            continue;
        /* left first: the last exit frees g */
        for (uint32_t i = 0, left = g->n_alive; left && i < g->n; i++) {
            if (!g->ranks[i].alive)
                continue;
            left--;
            if (listed(g->ranks[i].rank, kr->ranks, kr->n_ranks))
                rank_exit(n, g, i, 0, SIGKILL_NUM);
        }
    }
}

/* One step of every rank of n that is past rendezvous. */
/* The next step at a fixed rate: a repeating timer is re-armed from when it ran, so every
 * late turn of the loop slowed the ranks (0.89 steps/s for 1 at 16,384 ranks). A step
 * more than one late is skipped, not made up in a burst. */
static void on_step(uv_timer_t *t);

static void step_rearm(sim_node_t *n)
{
    uint64_t now = uv_now(n->s->loop), every = n->s->cfg.step_ms;
    n->step_due += every;
    if (n->step_due + every <= now)
        n->step_due = now;
    uv_timer_start(&n->step, on_step, n->step_due > now ? n->step_due - now : 0, 0);
}

static void on_step(uv_timer_t *t)
{
    sim_node_t *n = t->data;
    step_rearm(n);
    if (!n->registered || n->hung)
        return;
    for (sim_group_t *g = n->groups, *next; g; g = next) {
        next = g->next;
        for (uint32_t i = 0; i < g->n; i++) {
            sim_rank_t *r = &g->ranks[i];
            if (!r->alive || !r->rdzv || r->step >= g->total)
                continue;
            r->step++;
            Chorus__Metric m = CHORUS__METRIC__INIT, *mp = &m;
            Chorus__RankEvent ev = CHORUS__RANK_EVENT__INIT;
            m.name = "step_ms";
            m.value = n->s->cfg.step_ms;
            ev.kind = CHORUS__RANK_EVENT_KIND__RANK_PROGRESS;
            ev.step = r->step;
            ev.total_steps = g->total;
            ev.loss = 10.0 / (double)(r->step + 1);
            ev.tokens_per_s = 1000.0;
            ev.n_metrics = 1;
            ev.metrics = &mp;
            send_event(n, g, r->rank, &ev);
            if (g->every && r->step % g->every == 0) {
                Chorus__RankEvent ck = CHORUS__RANK_EVENT__INIT;
                ck.kind = CHORUS__RANK_EVENT_KIND__RANK_CHECKPOINT;
                ck.step = r->step;
                ck.bytes = 1 << 20;
                ck.checksum = r->step * 1000003u + r->rank;
                send_event(n, g, r->rank, &ck);
            }
        }
        /* Finishing after the loop: the last exit frees g (its held progress goes first). */
        for (uint32_t i = 0; i < g->n; i++) {
            sim_rank_t *r = &g->ranks[i];
            if (r->alive && r->rdzv && r->step >= g->total) {
                send_kind(n, g, r->rank, CHORUS__RANK_EVENT_KIND__RANK_DONE, 0, 0, NULL);
                if (g->n_alive == 1) {
                    rank_exit(n, g, i, 0, 0);
                    break;
                }
                rank_exit(n, g, i, 0, 0);
            }
        }
    }
    if (n->progress)
        wrk_progress_tick(n->progress, ch_now_ms());
}

// ----------------------------------------------------------------------------
// coordinator link

static void send_heartbeat(sim_node_t *n)
{
    Chorus__Heartbeat hb = CHORUS__HEARTBEAT__INIT;
    Chorus__Envelope env = CHORUS__ENVELOPE__INIT;
    uint32_t alive = ranks_alive(n);
    hb.time_ms = ch_wall_ms();
    hb.free_slots = alive >= n->s->cfg.slots ? 0 : n->s->cfg.slots - alive;
    env.body_case = CHORUS__ENVELOPE__BODY_HEARTBEAT;
    env.heartbeat = &hb;
    if (send_env(n, &env) == 0)
        n->s->heartbeats_sent++;
}

/* As workerd: a message sent within the interval stands in for the Heartbeat. */
static void on_heartbeat(uv_timer_t *t)
{
    sim_node_t *n = t->data;
    if (!n->hung && wrk_heartbeat_due(ch_now_ms(), n->last_hb_ms, n->hb_ms, n->dead_after_ms))
        send_heartbeat(n);
}

static void send_register(sim_node_t *n)
{
    Chorus__Register reg = CHORUS__REGISTER__INIT;
    Chorus__Envelope env = CHORUS__ENVELOPE__INIT;
    uint32_t k = ranks_alive(n), i = 0;
    Chorus__RankRef *refs = calloc(k ? k : 1, sizeof *refs);
    Chorus__RankRef **pr = calloc(k ? k : 1, sizeof *pr);
    reg.progress_ms = n->s->cfg.progress_ms;
    if (!refs || !pr) {
        CH_LOGE("sim", "node=%s: out of memory building Register", n->name);
        goto out;
    }
    for (const sim_group_t *g = n->groups; g; g = g->next) {
        for (uint32_t r = 0; r < g->n && i < k; r++) {
            if (!g->ranks[r].alive)
                continue;
            chorus__rank_ref__init(&refs[i]);
            refs[i].job_id = (char *)g->job_id;
            refs[i].generation = g->gen;
            refs[i].launch_token = g->token;
            refs[i].rank = g->ranks[r].rank;
            refs[i].pid = (int32_t)(100000 + n->idx * 64 + r);
            pr[i] = &refs[i];
            i++;
        }
    }
    reg.name = n->name;
    reg.slots = n->s->cfg.slots;
    reg.rack = n->rack;
    reg.device = (char *)ch_device_name(CH_DEVICE_CPU);
    reg.n_running = i;
    reg.running = pr;
    env.body_case = CHORUS__ENVELOPE__BODY_REGISTER;
    env.register_ = &reg;
    send_env(n, &env);
out:
    free(pr);
    free(refs);
}

static void on_ready(ch_conn_t *c, void *ud)
{
    (void)c;
    send_register(ud);
}

static void connect_node(sim_node_t *n);

/* n's link registered or closed: a connect slot comes free for the next waiting node. */
static void connect_done(sim_node_t *n)
{
    wrk_sim_t *s = n->s;
    if (!n->connecting)
        return;
    n->connecting = 0;
    s->connecting--;
    while (s->n_wait > 0 && s->connecting < CONNECTING_MAX) {
        sim_node_t *next = &s->nodes[s->wait[s->wait_head]];
        s->wait_head = (s->wait_head + 1) % s->cfg.nodes;
        s->n_wait--;
        next->queued = 0;
        connect_node(next);
    }
}

static void on_msg(ch_conn_t *c, Chorus__Envelope *env, void *ud)
{
    sim_node_t *n = ud;
    (void)c;
    if (n->hung)
        return; /* a hung machine reads nothing */
    switch (env->body_case) {
    case CHORUS__ENVELOPE__BODY_REGISTER_ACK:
        connect_done(n);
        n->registered = 1;
        n->backoff_ms = BACKOFF_MIN_MS;
        n->hb_ms = env->register_ack->heartbeat_ms ? env->register_ack->heartbeat_ms
                                                   : HEARTBEAT_DEFAULT_MS;
        n->dead_after_ms = env->register_ack->dead_after_ms;
        n->coord_checkpoints = env->register_ack->node_checkpoints;
        uv_timer_start(&n->heartbeat, on_heartbeat, n->hb_ms, n->hb_ms);
        send_heartbeat(n);
        if (!uv_is_active((uv_handle_t *)&n->step)) {
            uint64_t phase =
                ch_mix64_next(&n->s->rng) % (n->s->cfg.step_ms ? n->s->cfg.step_ms : 1);
            n->step_due = uv_now(n->s->loop) + phase;
            uv_timer_start(&n->step, on_step, phase, 0);
        }
        return;
    case CHORUS__ENVELOPE__BODY_START_RANKS:
        on_start_ranks(n, env->start_ranks);
        return;
    case CHORUS__ENVELOPE__BODY_KILL_RANKS:
        on_kill_ranks(n, env->kill_ranks);
        return;
    case CHORUS__ENVELOPE__BODY_RANK_EXIT_ACK:
        return; /* final reports are not kept: nothing to forget */
    case CHORUS__ENVELOPE__BODY_KV_REPLY:
        on_kv_reply(n, env);
        return;
    case CHORUS__ENVELOPE__BODY_ERROR:
        if (env->request_id) {
            on_kv_reply(n, env);
            return;
        }
        CH_LOGW("sim", "node=%s: coordinator: error %d: %s", n->name, env->error->code,
                env->error->message);
        return;
    default:
        return;
    }
}

static void on_reconnect(uv_timer_t *t)
{
    connect_node(t->data);
}

static void schedule_reconnect(sim_node_t *n)
{
    uint32_t d = n->backoff_ms;
    uint32_t delay = d / 2 + (uint32_t)(ch_mix64_next(&n->s->rng) % (d / 2 + 1));
    n->backoff_ms = d * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : d * 2;
    uv_timer_start(&n->reconnect, on_reconnect, delay, 0);
}

static void on_close(ch_conn_t *c, int reason, void *ud)
{
    sim_node_t *n = ud;
    (void)c;
    (void)reason;
    n->conn = NULL;
    n->registered = 0;
    connect_done(n);
    uv_timer_stop(&n->heartbeat);
    if (n->hung) /* the coordinator cut a hung node: it stays down until revived */
        n->crashed = 1;
    if (n->crashed || n->s->stopping)
        return;
    schedule_reconnect(n);
}

static void connect_node(sim_node_t *n)
{
    wrk_sim_t *s = n->s;
    ch_conn_opts_t o = {.key = s->cfg.key, .is_server = 0, .role = "worker"};
    ch_conn_cbs_t cbs = {on_ready, on_msg, on_close};
    if (s->stopping || n->conn || n->crashed || n->queued)
        return;
    if (s->connecting >= CONNECTING_MAX) { /* its turn comes in connect_done */
        s->wait[(s->wait_head + s->n_wait++) % s->cfg.nodes] = n->idx;
        n->queued = 1;
        return;
    }
    int rc = ch_conn_connect_tcp(s->loop, s->cfg.host, s->cfg.port, &o, &cbs, n, &n->conn);
    if (rc == 0) {
        n->connecting = 1;
        s->connecting++;
    } else {
        n->conn = NULL;
        CH_LOGD("sim", "node=%s: connect: %s", n->name, ch_strerror(rc));
        schedule_reconnect(n);
    }
}

// ----------------------------------------------------------------------------
// lifecycle

int wrk_sim_create(uv_loop_t *loop, const wrk_sim_cfg_t *cfg, wrk_sim_t **out)
{
    if (cfg->nodes == 0 || cfg->slots == 0 || !cfg->key)
        return -EINVAL;
    wrk_sim_t *s = calloc(1, sizeof *s);
    if (!s)
        return -ENOMEM;
    s->nodes = calloc(cfg->nodes, sizeof *s->nodes);
    s->wait = calloc(cfg->nodes, sizeof *s->wait);
    if (!s->nodes || !s->wait) {
        free(s->nodes);
        free(s->wait);
        free(s);
        return -ENOMEM;
    }
    s->loop = loop;
    s->cfg = *cfg;
    if (s->cfg.racks == 0)
        s->cfg.racks = 1;
    if (s->cfg.step_ms == 0)
        s->cfg.step_ms = 1000;
    if (!s->cfg.prefix[0])
        snprintf(s->cfg.prefix, sizeof s->cfg.prefix, "sim");
    s->rng = ch_now_ns();
    uint32_t per_rack = (cfg->nodes + s->cfg.racks - 1) / s->cfg.racks;
    for (uint32_t i = 0; i < cfg->nodes; i++) {
        sim_node_t *n = &s->nodes[i];
        n->s = s;
        n->idx = i;
        n->backoff_ms = BACKOFF_MIN_MS;
        snprintf(n->name, sizeof n->name, "%s-%05u", s->cfg.prefix, i);
        snprintf(n->rack, sizeof n->rack, "rack%03u", i / per_rack);
        uv_timer_init(loop, &n->reconnect);
        uv_timer_init(loop, &n->heartbeat);
        uv_timer_init(loop, &n->step);
        n->reconnect.data = n->heartbeat.data = n->step.data = n;
        wrk_progress_cfg_t pc = {.interval_ms = cfg->progress_ms,
                                 .detail_every = cfg->progress_detail_every,
                                 .send = send_progress,
                                 .ud = n,
                                 /* ticked by the step timer: a timer firing a millisecond
                                  * early must not push an interval equal to the step to
                                  * the next step */
                                 .slack_ms = s->cfg.step_ms / 4};
        if (cfg->progress_ms && wrk_progress_create(&pc, &n->progress) < 0)
            CH_LOGW("sim", "node=%s: out of memory: it reports per rank", n->name);
    }
    *out = s;
    return 0;
}

int wrk_sim_start(wrk_sim_t *s)
{
    for (uint32_t i = 0; i < s->cfg.nodes; i++) {
        uint64_t at = s->cfg.connect_ms ? (uint64_t)s->cfg.connect_ms * i / s->cfg.nodes : 0;
        uv_timer_start(&s->nodes[i].reconnect, on_reconnect, at, 0);
    }
    return 0;
}

void wrk_sim_stop(wrk_sim_t *s)
{
    if (s->stopping)
        return;
    s->stopping = 1;
    for (uint32_t i = 0; i < s->cfg.nodes; i++) {
        sim_node_t *n = &s->nodes[i];
        if (n->conn)
            ch_conn_close(n->conn);
        uv_close((uv_handle_t *)&n->reconnect, NULL);
        uv_close((uv_handle_t *)&n->heartbeat, NULL);
        uv_close((uv_handle_t *)&n->step, NULL);
    }
}

void wrk_sim_destroy(wrk_sim_t *s)
{
    if (!s)
        return;
    for (uint32_t i = 0; i < s->cfg.nodes; i++) {
        groups_free(&s->nodes[i]);
        free(s->nodes[i].reqs);
        wrk_progress_destroy(s->nodes[i].progress);
    }
    free(s->nodes);
    free(s->wait);
    free(s);
}

void wrk_sim_stats(const wrk_sim_t *s, wrk_sim_stats_t *o)
{
    memset(o, 0, sizeof *o);
    o->nodes = s->cfg.nodes;
    o->events_sent = s->events_sent;
    o->kv_errors = s->kv_errors;
    o->start_msgs = s->start_msgs;
    o->kill_msgs = s->kill_msgs;
    o->heartbeats_sent = s->heartbeats_sent;
    int first = 1;
    for (uint32_t i = 0; i < s->cfg.nodes; i++) {
        const sim_node_t *n = &s->nodes[i];
        o->registered += n->registered;
        if (n->hung || n->crashed)
            continue; /* its ranks are gone with it, whatever the coordinator knows */
        for (const sim_group_t *g = n->groups; g; g = g->next) {
            for (uint32_t k = 0; k < g->n; k++) {
                const sim_rank_t *r = &g->ranks[k];
                if (!r->alive)
                    continue;
                o->ranks++;
                o->done += r->step >= g->total;
                if (!r->rdzv)
                    continue;
                o->rdzv_done++;
                if (first || r->step < o->min_step)
                    o->min_step = r->step;
                if (first || r->step > o->max_step)
                    o->max_step = r->step;
                first = 0;
            }
        }
    }
}

// ----------------------------------------------------------------------------
// failure injection

static sim_node_t *find_node(wrk_sim_t *s, const char *name)
{
    size_t plen = strlen(s->cfg.prefix);
    char *end = NULL;
    /* Names are <prefix>-<index>: O(1). */
    if (strncmp(name, s->cfg.prefix, plen) != 0 || name[plen] != '-')
        return NULL;
    unsigned long i = strtoul(name + plen + 1, &end, 10);
    if (*end || i >= s->cfg.nodes)
        return NULL;
    return &s->nodes[i];
}

const char *wrk_sim_node_name(const wrk_sim_t *s, uint32_t i)
{
    return i < s->cfg.nodes ? s->nodes[i].name : "";
}

int wrk_sim_hang(wrk_sim_t *s, const char *node, uint64_t *last_hb_ms)
{
    sim_node_t *n = find_node(s, node);
    if (!n)
        return CH_E_NOTFOUND;
    *last_hb_ms = n->last_hb_ms;
    n->hung = 1;
    uv_timer_stop(&n->heartbeat);
    uv_timer_stop(&n->step);
    CH_LOGI("sim", "node=%s: hung (no heartbeats, no rank events)", n->name);
    return 0;
}

int wrk_sim_crash(wrk_sim_t *s, const char *node)
{
    sim_node_t *n = find_node(s, node);
    if (!n)
        return CH_E_NOTFOUND;
    n->crashed = 1;
    n->registered = 0;
    uv_timer_stop(&n->heartbeat);
    uv_timer_stop(&n->step);
    uv_timer_stop(&n->reconnect);
    groups_free(n);
    if (n->conn)
        ch_conn_close(n->conn);
    CH_LOGI("sim", "node=%s: crashed (link closed, ranks gone)", n->name);
    return 0;
}

int wrk_sim_disconnect(wrk_sim_t *s, const char *node)
{
    sim_node_t *n = find_node(s, node);
    if (!n)
        return CH_E_NOTFOUND;
    if (n->conn)
        ch_conn_close(n->conn); /* on_close reconnects */
    CH_LOGI("sim", "node=%s: disconnected", n->name);
    return 0;
}

int wrk_sim_revive(wrk_sim_t *s, const char *node)
{
    sim_node_t *n = find_node(s, node);
    if (!n)
        return CH_E_NOTFOUND;
    if (n->conn) { /* still linked while hung: a reboot closes it first */
        n->crashed = 1;
        ch_conn_close(n->conn);
        n->conn = NULL;
    }
    groups_free(n);
    n->hung = n->crashed = 0;
    n->backoff_ms = BACKOFF_MIN_MS;
    CH_LOGI("sim", "node=%s: revived (no ranks)", n->name);
    uv_timer_start(&n->reconnect, on_reconnect, 0, 0);
    return 0;
}

int wrk_sim_exit_rank(wrk_sim_t *s, const char *job, uint32_t rank, int code)
{
    for (uint32_t i = 0; i < s->cfg.nodes; i++) {
        sim_node_t *n = &s->nodes[i];
        for (sim_group_t *g = n->groups; g; g = g->next) {
            if (strcmp(g->job_id, job) != 0)
                continue;
            for (uint32_t k = 0; k < g->n; k++) {
                if (g->ranks[k].rank == rank && g->ranks[k].alive) {
                    CH_LOGI("sim", "node=%s job=%s rank=%u: exits with code %d", n->name, job, rank,
                            code);
                    rank_exit(n, g, k, code, 0);
                    return 0;
                }
            }
        }
    }
    return CH_E_NOTFOUND;
}

const char *wrk_sim_rank_node(const wrk_sim_t *s, const char *job, uint32_t rank)
{
    for (uint32_t i = 0; i < s->cfg.nodes; i++) {
        const sim_node_t *n = &s->nodes[i];
        for (const sim_group_t *g = n->groups; g; g = g->next)
            if (strcmp(g->job_id, job) == 0)
                for (uint32_t k = 0; k < g->n; k++)
                    if (g->ranks[k].rank == rank && g->ranks[k].alive)
                        return n->name;
    }
    return NULL;
}
