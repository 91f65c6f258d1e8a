/* Request handlers and their policy table; see rpc.h. Replies echo the request id. */
#include "rpc.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/jobspec.h"
#include "common/log.h"
#include "common/msg.h"
#include "common/util.h"
#include "coord.h"
#include "jobevent.h"
#include "jobinfo.h"
#include "launch.h"
#include "logs.h"
#include "progress.h"
#include "runs.h"

typedef void (*rpc_fn)(coord_t *c, coord_link_t *l, const Chorus__Envelope *req);

typedef struct rpc {
    Chorus__Envelope__BodyCase body;
    unsigned roles; /* COORD_ROLE_* allowed to send it */
    int need_node;  /* the sender must have registered */
    int admin;      /* control links: root, the daemon's user or admin-group only */
    rpc_fn fn;
} rpc_t;

/* A line the peer on l caused (a refusal, a rejected report): within the link's budget
 * (server.h), naming the peer and how many such lines were left out before it. */
static void __attribute__((format(printf, 4, 5)))
peer_log(coord_link_t *l, ch_log_level_t level, const char *subsys, const char *fmt, ...)
{
    char msg[768];
    uint32_t quiet = 0;
    if (!ch_log_enabled(level, subsys) || !coord_link_log_ok(l, &quiet))
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (quiet)
        ch_log(level, subsys, "peer %s: %s (%" PRIu32 " similar lines left out)",
               coord_link_peer(l), msg, quiet);
    else
        ch_log(level, subsys, "peer %s: %s", coord_link_peer(l), msg);
}

static void reply(coord_link_t *l, const Chorus__Envelope *req, Chorus__Envelope *resp)
{
    resp->request_id = req->request_id;
    coord_link_send(l, resp);
}

static void reply_ok(coord_link_t *l, const Chorus__Envelope *req)
{
    Chorus__Ok ok = CHORUS__OK__INIT;
    Chorus__Envelope env = CHORUS__ENVELOPE__INIT;
    env.body_case = CHORUS__ENVELOPE__BODY_OK;
    env.ok = &ok;
    reply(l, req, &env);
}

// ---------------------------------------------------------------------------------------
// Workers

static void h_register(coord_t *c, coord_link_t *l, const Chorus__Envelope *req)
{
    const Chorus__Register *reg = req->register_;
    char err[256];
    coord_node_t *n = NULL;
    int rc = coord_node_register(c, l, reg, &n, err, sizeof(err));
    if (rc < 0) {
        peer_log(l, CH_LOG_WARN, "node", "%s", err);
        coord_link_error(l, req->request_id, rc, "%s", err);
        if (rc == -EADDRINUSE)
            coord_link_close(l);
        return;
    }
    /* Only ranks launched on this node (their token) are re-adopted or reported. */
    Chorus__Register mine;
    size_t refused = 0;
    if (coord_launch_register(c, n, reg, &mine, &refused) < 0) {
        coord_link_error(l, req->request_id, -ENOMEM, "out of memory");
        coord_link_close(l);
        return;
    }
    if (refused)
        peer_log(l, CH_LOG_WARN, "node",
                 "node=%s: %zu ranks reported without their launch token: not adopted", n->name,
                 refused);
    Chorus__RegisterAck ack = CHORUS__REGISTER_ACK__INIT;
    Chorus__Envelope env = CHORUS__ENVELOPE__INIT;
    ack.heartbeat_ms = (uint32_t)c->cfg.heartbeat_ms;
    ack.dead_after_ms = (uint32_t)c->cfg.dead_after_ms;
    ack.node_checkpoints = 1; /* coord_progress_apply takes NodeProgress.checkpoints */
    env.body_case = CHORUS__ENVELOPE__BODY_REGISTER_ACK;
    env.register_ack = &ack;
    reply(l, req, &env);
    coord_job_node_registered(c, n, &mine);
    coord_launch_register_free(&mine);
}

static void h_heartbeat(coord_t *c, coord_link_t *l, const Chorus__Envelope *req)
{
    coord_node_heartbeat(c, l->node, req->heartbeat);
}

static void h_rank_event(coord_t *c, coord_link_t *l, const Chorus__Envelope *req)
{
    const Chorus__RankEvent *ev = req->rank_event;
    if (!coord_launch_ok(c, ev->job_id, ev->generation, l->node, ev->launch_token)) {
        peer_log(l, CH_LOG_WARN, "job",
                 "job=%.64s gen=%" PRIu64 " rank=%" PRIu32 " node=%s: event without the launch "
                 "token of that generation on this node: dropped",
                 ev->job_id, ev->generation, ev->rank, l->node->name);
        return;
    }
    coord_job_rank_event(c, l->node, ev);
}

static void h_node_progress(coord_t *c, coord_link_t *l, const Chorus__Envelope *req)
{
    const Chorus__NodeProgress *np = req->node_progress;
    if (!coord_launch_ok(c, np->job_id, np->generation, l->node, np->launch_token)) {
        peer_log(l, CH_LOG_WARN, "job",
                 "job=%.64s gen=%" PRIu64 " node=%s: progress without the launch token of that "
                 "generation on this node: dropped",
                 np->job_id, np->generation, l->node->name);
        return;
    }
    coord_progress_apply(c, l->node, np);
}

/* A generation's rendezvous keys belong to the nodes running its ranks, and hold at most
 * what its ranks need: a few keys each (UCX addresses, NCCL ids) of <= 64 KiB. Opened
 * from the placement on the generation's first request: O(world log world), once. */
static int kv_open(coord_t *c, const coord_job_t *j)
{
    size_t n = 0, w = j->ranks ? j->world : 0;
    void **nodes = malloc((w ? w : 1) * sizeof(*nodes));
    if (!nodes)
        return -ENOMEM;
    for (size_t i = 0; i < w; i++)
        if (j->ranks[i].node)
            nodes[n++] = j->ranks[i].node;
    int rc = coord_kv_open_gen(c->kv, j->id, j->generation, nodes, n, 16 * (size_t)w + 64,
                               ((size_t)w + 16) * CH_RDZV_VALUE_MAX, 64 * (size_t)w + 1024);
    free(nodes);
    return rc;
}

/* Rendezvous requests are valid only for the current generation of an active job, and
 * only from the nodes running its ranks. */
static int kv_check(coord_t *c, coord_link_t *l, const Chorus__Envelope *req, const char *job_id,
                    uint64_t gen)
{
    coord_job_t *j = coord_job_find(c, job_id);
    if (!j || strcmp(j->id, job_id) != 0) {
        coord_link_error(l, req->request_id, CH_E_NOTFOUND, "rendezvous: no job %s", job_id);
        return CH_E_NOTFOUND;
    }
    /* A recovering job's generation has ended: its store is gone and stays gone. */
    if (gen != j->generation || !coord_job_is_active(j) || j->state == COORD_JOB_RECOVERING) {
        coord_link_error(l, req->request_id, CH_E_STATE,
                         "rendezvous: job %s generation %" PRIu64 " is not current (%s, "
                         "generation %" PRIu64 ")",
                         job_id, gen, coord_job_state_name(j->state), j->generation);
        return CH_E_STATE;
    }
    if (!coord_kv_gen_is_open(c->kv, j->id, gen) && kv_open(c, j) < 0) {
        coord_link_error(l, req->request_id, -ENOMEM, "rendezvous: out of memory");
        return -ENOMEM;
    }
    if (!coord_kv_allowed(c->kv, j->id, gen, l->node)) {
        peer_log(l, CH_LOG_WARN, "kv",
                 "job=%s gen=%" PRIu64 " node=%s: rendezvous refused: it runs no rank of "
                 "the job",
                 j->id, gen, l->node->name);
        coord_link_error(l, req->request_id, -EPERM,
                         "rendezvous: node %s runs no rank of job %s generation %" PRIu64,
                         l->node->name, j->id, gen);
        return -EPERM;
    }
    return 0;
}

static void h_kv_set(coord_t *c, coord_link_t *l, const Chorus__Envelope *req)
{
    const Chorus__KvSet *s = req->kv_set;
    if (kv_check(c, l, req, s->job_id, s->generation) < 0)
        return;
    int rc = coord_kv_set(c->kv, s->job_id, s->generation, s->key, s->value.data, s->value.len);
    if (rc < 0) {
        coord_link_error(l, req->request_id, rc,
                         "rendezvous: set \"%.64s\" (%zu bytes): %s (keys <= %u bytes, values <= "
                         "%u bytes)",
                         s->key, s->value.len, ch_strerror(rc), CH_RDZV_KEY_MAX, CH_RDZV_VALUE_MAX);
        return;
    }
    Chorus__KvReply kr = CHORUS__KV_REPLY__INIT;
    Chorus__Envelope env = CHORUS__ENVELOPE__INIT;
    env.body_case = CHORUS__ENVELOPE__BODY_KV_REPLY;
    env.kv_reply = &kr;
    reply(l, req, &env);
}

static void h_kv_get(coord_t *c, coord_link_t *l, const Chorus__Envelope *req)
{
    const Chorus__KvGet *g = req->kv_get;
    if (kv_check(c, l, req, g->job_id, g->generation) < 0)
        return;
    int rc = coord_kv_get(c->kv, g->job_id, g->generation, g->key, g->timeout_ms, ch_now_ms(), l,
                          req->request_id);
    if (rc < 0) {
        coord_link_error(l, req->request_id, rc, "rendezvous: get \"%.64s\": %s", g->key,
                         ch_strerror(rc));
        return;
    }
    coord_kv_rearm(c);
}

void coord_rpc_kv_reply(void *ud, void *waiter, uint64_t request_id, int code, const uint8_t *val,
                        size_t len)
{
    coord_link_t *l = waiter;
    Chorus__KvReply kr = CHORUS__KV_REPLY__INIT;
    Chorus__Envelope env = CHORUS__ENVELOPE__INIT;
    (void)ud;
    kr.code = code;
    kr.value.data = (uint8_t *)val;
    kr.value.len = val ? len : 0;
    env.request_id = request_id;
    env.body_case = CHORUS__ENVELOPE__BODY_KV_REPLY;
    env.kv_reply = &kr;
    coord_link_send(l, &env);
}

// ---------------------------------------------------------------------------------------
// Control

static void h_list_nodes(coord_t *c, coord_link_t *l, const Chorus__Envelope *req)
{
    size_t n = c->nodes.n;
    Chorus__NodeInfo *ni = calloc(n ? n : 1, sizeof(*ni));
    Chorus__NodeInfo **np = calloc(n ? n : 1, sizeof(*np));
    if (!ni || !np) {
        coord_link_error(l, req->request_id, -ENOMEM, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        const coord_node_t *node = c->nodes.v[i];
        chorus__node_info__init(&ni[i]);
        ni[i].name = (char *)node->name;
        ni[i].state = (char *)coord_node_shown_state(node);
        ni[i].drained = node->drained;
        ni[i].drain_reason = (char *)node->drain_reason;
        ni[i].slots = node->slots;
        ni[i].free_slots = coord_node_free(node);
        ni[i].rack = (char *)node->rack;
        ni[i].last_heartbeat_ms = node->last_hb_wall;
        ni[i].memory_bytes = node->memory_bytes;
        ni[i].device = (char *)ch_device_name(node->device);
        np[i] = &ni[i];
    }
    Chorus__NodeList nl = CHORUS__NODE_LIST__INIT;
    Chorus__Envelope env = CHORUS__ENVELOPE__INIT;
    nl.n_nodes = n;
    nl.nodes = np;
    env.body_case = CHORUS__ENVELOPE__BODY_NODE_LIST;
    env.node_list = &nl;
    reply(l, req, &env);
out:
    free(np);
    free(ni);
}

/* The job text with its owner and run-as identity written in from the link's
 * credentials (whatever the client put there), within the submitter's limits
 * (fairshare.h); *out malloc'd. A text that does not parse
 * goes on unchanged, for coord_job_submit to refuse with its own message. */
static int stamp_owner(coord_t *c, const coord_link_t *l, const char *ini, char **out, char *err,
                       size_t errlen)
{
    ch_jobspec_t *spec = malloc(sizeof(*spec));
    int rc = spec ? 0 : -ENOMEM;
    *out = NULL;
    if (rc == 0 && ch_jobspec_parse(ini, spec, err, errlen) < 0) {
        *out = strdup(ini);
        rc = *out ? 0 : -ENOMEM;
        goto done;
    }
    if (rc == 0)
        rc = coord_users_stamp(&c->users, &l->cred, spec, err, errlen);
    /* the file check needs a valid spec: an invalid one goes on to be refused by name */
    if (rc == 0 && ch_jobspec_validate(spec, 0, err, errlen) == 0)
        rc = coord_runs_stamp(c, spec, err, errlen);
    if (rc == 0)
        rc = coord_share_submit(c, &l->cred, spec, err, errlen);
    if (rc == 0)
        rc = ch_jobspec_format(spec, out);
done:
    if (rc == -ENOMEM)
        snprintf(err, errlen, "out of memory");
    free(spec);
    return rc;
}

static void h_submit(coord_t *c, coord_link_t *l, const Chorus__Envelope *req)
{
    char id[32], err[512];
    char *stamped = NULL;
    const char *ini = req->submit->job_ini ? req->submit->job_ini : "";
    int rc = ch_jobspec_check_text(ini, strlen(ini), err, sizeof(err));
    if (rc == 0)
        rc = stamp_owner(c, l, ini, &stamped, err, sizeof(err));
    if (rc == 0)
        rc = coord_job_submit(c, stamped, id, sizeof(id), err, sizeof(err));
    free(stamped);
    if (rc < 0) {
        peer_log(l, CH_LOG_INFO, "job", "submit refused: %s", err);
        coord_link_error(l, req->request_id, rc, "%s", err);
        return;
    }
    Chorus__SubmitReply sr = CHORUS__SUBMIT_REPLY__INIT;
    Chorus__Envelope env = CHORUS__ENVELOPE__INIT;
    sr.job_id = id;
    env.body_case = CHORUS__ENVELOPE__BODY_SUBMIT_REPLY;
    env.submit_reply = &sr;
    reply(l, req, &env);
    coord_jobs_trim(c); /* one in, the oldest ended one beyond the bound out */
}

/* A job in memory, else the reply: "no job", or that it ended (one let go from memory). */
static coord_job_t *find_or_reply(coord_t *c, coord_link_t *l, const Chorus__Envelope *req,
                                  const char *id)
{
    coord_job_t *j = coord_job_find(c, id), *old = NULL;
    if (j)
        return j;
    if (coord_job_load(c, id, &old) == 0)
        coord_link_error(l, req->request_id, CH_E_STATE, "job %s already %s", old->id,
                         coord_job_state_name(old->state));
    else
        coord_link_error(l, req->request_id, CH_E_NOTFOUND, "no job \"%.64s\"", id);
    coord_job_free(old);
    return NULL;
}

/* What a JobInfo adds to coord_job_info for this asker: the job's place in the queue;
 * and for another user's job its row only. Its text (paths, data, owner), its reasons
 * and its restart history (which quote the job's files and errors) are its owner's and
 * admins'. */
static void for_asker(const coord_link_t *l, const coord_job_t *j, Chorus__JobInfo *ji)
{
    static char hidden[] = "(another user's job: details for its owner and admins only)";
    static char none[] = "";
    ji->queue_place = j->state == COORD_JOB_QUEUED ? j->queue_place : 0;
    if (coord_users_may_see(&l->cred, &j->spec))
        return;
    ji->job_ini = none;
    if (ji->reason && ji->reason[0])
        ji->reason = hidden;
    for (size_t i = 0; i < ji->n_history; i++)
        ji->history[i]->reason = hidden;
}

static void h_job_query(coord_t *c, coord_link_t *l, const Chorus__Envelope *req)
{
    const char *id = req->job_query->job_id;
    coord_job_t *j = coord_job_find(c, id), *old = NULL;
    Chorus__JobInfo ji;
    if (!j && coord_job_load(c, id, &old) == 0)
        j = old; /* an ended job let go from memory: its stored row */
    if (!j) {
        coord_link_error(l, req->request_id, CH_E_NOTFOUND, "no job \"%.64s\"", id);
        return;
    }
    coord_rank_view_t view = coord_job_view(j, req->job_query);
    if (!old && (req->job_query->all_ranks || req->job_query->rank_limit))
        coord_progress_want_detail(c, j); /* fresh per-rank detail for the next ask */
    if (coord_job_info(j, &view, &ji) < 0) {
        coord_link_error(l, req->request_id, -ENOMEM, "out of memory");
        coord_job_free(old);
        return;
    }
    for_asker(l, j, &ji);
    Chorus__Envelope env = CHORUS__ENVELOPE__INIT;
    env.body_case = CHORUS__ENVELOPE__BODY_JOB_INFO;
    env.job_info = &ji;
    reply(l, req, &env);
    coord_job_info_clear(&ji);
    coord_job_free(old);
}

static void h_list_jobs(coord_t *c, coord_link_t *l, const Chorus__Envelope *req)
{
    size_t n = c->jobs.n;
    Chorus__JobInfo *ji = calloc(n ? n : 1, sizeof(*ji));
    Chorus__JobInfo **jp = calloc(n ? n : 1, sizeof(*jp));
    if (!ji || !jp) {
        coord_link_error(l, req->request_id, -ENOMEM, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        coord_job_info(c->jobs.v[i], NULL, &ji[i]); /* no allocation without ranks */
        for_asker(l, c->jobs.v[i], &ji[i]);
        jp[i] = &ji[i];
    }
    Chorus__JobList jl = CHORUS__JOB_LIST__INIT;
    Chorus__Envelope env = CHORUS__ENVELOPE__INIT;
    jl.n_jobs = n;
    jl.jobs = jp;
    env.body_case = CHORUS__ENVELOPE__BODY_JOB_LIST;
    env.job_list = &jl;
    reply(l, req, &env);
out:
    free(jp);
    free(ji);
}

static void h_cancel(coord_t *c, coord_link_t *l, const Chorus__Envelope *req)
{
    char err[256];
    coord_job_t *j = find_or_reply(c, l, req, req->cancel->job_id);
    if (!j)
        return;
    int rc = coord_users_may_act(&l->cred, &j->spec, j->id, err, sizeof(err));
    if (rc == 0)
        rc = coord_job_cancel(c, j, err, sizeof(err));
    if (rc < 0)
        coord_link_error(l, req->request_id, rc, "%s", err);
    else
        reply_ok(l, req);
}

static void h_kill_rank(coord_t *c, coord_link_t *l, const Chorus__Envelope *req)
{
    char err[256];
    coord_job_t *j = find_or_reply(c, l, req, req->kill_rank->job_id);
    if (!j)
        return;
    int rc = coord_users_may_act(&l->cred, &j->spec, j->id, err, sizeof(err));
    if (rc == 0)
        rc = coord_job_kill_rank(c, j, req->kill_rank->rank, err, sizeof(err));
    if (rc < 0)
        coord_link_error(l, req->request_id, rc, "%s", err);
    else
        reply_ok(l, req);
}

static void h_checkpoint(coord_t *c, coord_link_t *l, const Chorus__Envelope *req)
{
    char err[256];
    coord_job_t *j = find_or_reply(c, l, req, req->checkpoint->job_id);
    if (!j)
        return;
    int rc = coord_users_may_act(&l->cred, &j->spec, j->id, err, sizeof(err));
    if (rc == 0)
        rc = coord_runs_checkpoint(c, j, err, sizeof(err));
    if (rc < 0)
        coord_link_error(l, req->request_id, rc, "%s", err);
    else
        reply_ok(l, req);
}

static void h_log_read(coord_t *c, coord_link_t *l, const Chorus__Envelope *req)
{
    coord_logs_read(c, l, req);
}

/* A worker's answer to a relayed read; any other Error from a worker is only logged. */
static void h_worker_reply(coord_t *c, coord_link_t *l, const Chorus__Envelope *req)
{
    if (coord_logs_reply(c, l, req))
        return;
    if (req->body_case == CHORUS__ENVELOPE__BODY_ERROR)
        CH_LOGD("net", "peer %s: error %d: %s", coord_link_peer(l), req->error->code,
                req->error->message);
}

static void h_forget_node(coord_t *c, coord_link_t *l, const Chorus__Envelope *req)
{
    char err[256];
    const char *name = req->forget_node->name ? req->forget_node->name : "";
    int rc = coord_node_forget(c, name, err, sizeof(err));
    if (rc < 0)
        coord_link_error(l, req->request_id, rc, "%s", err);
    else
        reply_ok(l, req);
}

/* Draining is an operator's act: root, the daemon's user, admin-group members and
 * cluster-key holders only. */
static void h_drain_node(coord_t *c, coord_link_t *l, const Chorus__Envelope *req)
{
    char err[256];
    const Chorus__DrainNode *d = req->drain_node;
    if (!l->cred.admin) {
        coord_link_error(l, req->request_id, -EACCES,
                         "permission denied: uid %lu may not drain or resume nodes (root and "
                         "admin-group only)",
                         (unsigned long)l->cred.uid);
        return;
    }
    int rc = coord_node_drain(c, d->name ? d->name : "", d->drain, d->reason, err, sizeof err);
    if (rc < 0)
        coord_link_error(l, req->request_id, rc, "%s", err);
    else
        reply_ok(l, req);
}

// ---------------------------------------------------------------------------------------
// The table

#define W COORD_ROLE_WORKER
#define C COORD_ROLE_CTL

static const rpc_t RPCS[] = {
    {CHORUS__ENVELOPE__BODY_REGISTER, W, 0, 0, h_register},
    {CHORUS__ENVELOPE__BODY_HEARTBEAT, W, 1, 0, h_heartbeat},
    {CHORUS__ENVELOPE__BODY_RANK_EVENT, W, 1, 0, h_rank_event},
    {CHORUS__ENVELOPE__BODY_NODE_PROGRESS, W, 1, 0, h_node_progress},
    {CHORUS__ENVELOPE__BODY_KV_SET, W, 1, 0, h_kv_set},
    {CHORUS__ENVELOPE__BODY_KV_GET, W, 1, 0, h_kv_get},
    {CHORUS__ENVELOPE__BODY_LIST_NODES, C, 0, 0, h_list_nodes},
    {CHORUS__ENVELOPE__BODY_SUBMIT, C, 0, 0, h_submit},
    {CHORUS__ENVELOPE__BODY_JOB_QUERY, C, 0, 0, h_job_query},
    {CHORUS__ENVELOPE__BODY_LIST_JOBS, C, 0, 0, h_list_jobs},
    {CHORUS__ENVELOPE__BODY_CANCEL, C, 0, 0, h_cancel},
    {CHORUS__ENVELOPE__BODY_KILL_RANK, C, 0, 0, h_kill_rank},
    {CHORUS__ENVELOPE__BODY_FORGET_NODE, C, 0, 1, h_forget_node},
    {CHORUS__ENVELOPE__BODY_DRAIN_NODE, C, 0, 1, h_drain_node},
    {CHORUS__ENVELOPE__BODY_CHECKPOINT, C, 0, 0, h_checkpoint},
    {CHORUS__ENVELOPE__BODY_LOG_READ, C, 0, 0, h_log_read},
    {CHORUS__ENVELOPE__BODY_LOG_CHUNK, W, 1, 0, h_worker_reply},
    {CHORUS__ENVELOPE__BODY_ERROR, W, 1, 0, h_worker_reply},
};

#undef W
#undef C

void coord_rpc_dispatch(coord_t *c, coord_link_t *l, Chorus__Envelope *env)
{
    const rpc_t *rpc = NULL;
    for (size_t i = 0; i < sizeof(RPCS) / sizeof(RPCS[0]) && !rpc; i++)
        if (RPCS[i].body == env->body_case)
            rpc = &RPCS[i];
    if (!rpc) {
        CH_LOGD("net", "peer %s: unexpected %s ignored", coord_link_peer(l), ch_msg_name(env));
        coord_link_error(l, env->request_id, -ENOTSUP, "unexpected message %s", ch_msg_name(env));
        return;
    }
    if (!(rpc->roles & l->role)) {
        peer_log(l, CH_LOG_WARN, "net", "%s not allowed for this role", ch_msg_name(env));
        coord_link_error(l, env->request_id, -EPERM, "%s is not allowed on a %s link",
                         ch_msg_name(env), l->role == COORD_ROLE_WORKER ? "worker" : "control");
        return;
    }
    if (rpc->admin && !l->cred.admin) {
        peer_log(l, CH_LOG_WARN, "net", "uid %lu: %s refused: not an admin",
                 (unsigned long)l->cred.uid, ch_msg_name(env));
        coord_link_error(l, env->request_id, -EACCES,
                         "permission denied: %s is for root and members of coordinatord's "
                         "admin-group",
                         ch_msg_name(env));
        return;
    }
    if (rpc->need_node && !l->node) {
        coord_link_error(l, env->request_id, CH_E_STATE, "%s before register", ch_msg_name(env));
        return;
    }
    /* Whatever a registered node sends proves it alive, as a Heartbeat does: a node busy
     * reporting progress may skip its Heartbeats (workerd/agent.c). */
    if (rpc->need_node && (l->role & COORD_ROLE_WORKER) &&
        env->body_case != CHORUS__ENVELOPE__BODY_HEARTBEAT)
        coord_node_heard(c, l->node);
    rpc->fn(c, l, env);
}
