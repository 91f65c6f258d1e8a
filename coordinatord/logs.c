/* Rank logs relayed from workerd to chorusctl (logs.h). */
#include "logs.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/log.h"
#include "common/util.h"
#include "coord.h"

typedef struct pending {
    struct pending *next;
    uint64_t id;          /* request id toward the worker */
    coord_link_t *asker;  /* control link */
    uint64_t asker_rid;   /* its request id */
    coord_link_t *worker; /* the node's link the read went to */
    uint64_t deadline_ms;
    uint32_t world;
    int active; /* the job may still write */
} pending_t;

struct coord_logs {
    pending_t *head;
    size_t n;
    uint64_t next_id;
};

static struct coord_logs *logs_of(coord_t *c)
{
    if (!c->logs)
        c->logs = calloc(1, sizeof *c->logs);
    return c->logs;
}

static size_t pending_of(const struct coord_logs *g, const coord_link_t *l)
{
    size_t n = 0;
    for (const pending_t *p = g->head; p; p = p->next)
        n += p->asker == l;
    return n;
}

/* The node that runs (or ran) rank r in j's current placement, with a live link. */
static int pick_node(coord_job_t *j, const Chorus__LogRead *lr, uint64_t gen, coord_node_t **out,
                     char *err, size_t errlen)
{
    if (!j->ranks || lr->rank >= j->world)
        return ch_errf(err, errlen, -EINVAL, "job %s has no rank %u (world %u)", j->id, lr->rank,
                       j->world);
    if (gen == 0 || gen > j->generation)
        return ch_errf(err, errlen, -EINVAL,
                       "job %s has no generation %" PRIu64 " (now %" PRIu64 ")", j->id, gen,
                       j->generation);
    coord_node_t *n = j->ranks[lr->rank].node;
    if (!n || !n->link)
        return ch_errf(err, errlen, -ENOTCONN, "node %s of rank %u is not connected",
                       n ? n->name : "?", lr->rank);
    *out = n;
    return 0;
}

void coord_logs_read(coord_t *c, coord_link_t *l, const Chorus__Envelope *req)
{
    char err[256];
    const Chorus__LogRead *lr = req->log_read;
    struct coord_logs *g = logs_of(c);
    coord_job_t *j = coord_job_find(c, lr->job_id ? lr->job_id : "");
    coord_node_t *n = NULL;
    int rc = g ? 0 : -ENOMEM;
    if (rc == 0 && !j)
        rc = ch_errf(err, sizeof err, CH_E_NOTFOUND, "no job \"%.64s\" in memory", lr->job_id);
    if (rc == 0)
        rc = coord_users_may_act(&l->cred, &j->spec, j->id, err, sizeof err);
    uint64_t gen = rc == 0 && lr->generation ? lr->generation : j ? j->generation : 0;
    if (rc == 0)
        rc = pick_node(j, lr, gen, &n, err, sizeof err);
    if (rc == 0 && (g->n >= COORD_LOGS_MAX || pending_of(g, l) >= COORD_LOGS_PER_LINK))
        rc = ch_errf(err, sizeof err, CH_E_CAPACITY, "too many log reads waiting");
    pending_t *p = rc == 0 ? calloc(1, sizeof *p) : NULL;
    if (rc == 0 && !p)
        rc = ch_errf(err, sizeof err, -ENOMEM, "out of memory");
    if (rc < 0) {
        coord_link_error(l, req->request_id, rc, "%s", rc == -ENOMEM && !g ? "out of memory" : err);
        return;
    }
    p->id = ++g->next_id;
    p->asker = l;
    p->asker_rid = req->request_id;
    p->worker = n->link;
    p->deadline_ms = ch_now_ms() + COORD_LOGS_TIMEOUT_MS;
    p->world = j->world;
    p->active = coord_job_is_active(j) || j->state == COORD_JOB_QUEUED;
    Chorus__LogRead fwd = *lr;
    Chorus__Envelope env = CHORUS__ENVELOPE__INIT;
    fwd.job_id = j->id;
    fwd.generation = gen;
    env.request_id = p->id;
    env.body_case = CHORUS__ENVELOPE__BODY_LOG_READ;
    env.log_read = &fwd;
    if (coord_node_send(n, &env) < 0) {
        free(p);
        coord_link_error(l, req->request_id, -ENOTCONN, "node %s: cannot send", n->name);
        return;
    }
    p->next = g->head;
    g->head = p;
    g->n++;
}

static pending_t *take(struct coord_logs *g, int (*match)(const pending_t *, const void *),
                       const void *arg)
{
    for (pending_t **pp = g ? &g->head : NULL; pp && *pp; pp = &(*pp)->next) {
        if (match(*pp, arg)) {
            pending_t *p = *pp;
            *pp = p->next;
            g->n--;
            return p;
        }
    }
    return NULL;
}

typedef struct by_id {
    uint64_t id;
    const coord_link_t *worker;
} by_id_t;

static int match_id(const pending_t *p, const void *arg)
{
    const by_id_t *k = arg;
    return p->id == k->id && p->worker == k->worker;
}

int coord_logs_reply(coord_t *c, coord_link_t *from, const Chorus__Envelope *env)
{
    by_id_t k = {env->request_id, from};
    pending_t *p = take(c->logs, match_id, &k);
    if (!p)
        return 0;
    Chorus__Envelope out = *env;
    Chorus__LogChunk lc;
    out.seq = 0;
    out.request_id = p->asker_rid;
    if (env->body_case == CHORUS__ENVELOPE__BODY_LOG_CHUNK) {
        lc = *env->log_chunk;
        lc.world_size = p->world;
        lc.job_active = p->active;
        out.log_chunk = &lc;
    }
    coord_link_send(p->asker, &out);
    free(p);
    return 1;
}

static int match_link(const pending_t *p, const void *arg)
{
    return p->asker == arg || p->worker == arg;
}

void coord_logs_link_gone(coord_t *c, coord_link_t *l)
{
    pending_t *p;
    while ((p = take(c->logs, match_link, l))) {
        if (p->asker != l)
            coord_link_error(p->asker, p->asker_rid, -ENOTCONN, "the node's link closed");
        free(p);
    }
}

static int match_late(const pending_t *p, const void *arg)
{
    return p->deadline_ms <= *(const uint64_t *)arg;
}

void coord_logs_expire(coord_t *c, uint64_t now_ms)
{
    pending_t *p;
    while ((p = take(c->logs, match_late, &now_ms))) {
        coord_link_error(p->asker, p->asker_rid, -ETIMEDOUT, "the node did not answer");
        free(p);
    }
}

void coord_logs_fini(coord_t *c)
{
    pending_t *p;
    static const uint64_t all = UINT64_MAX;
    while ((p = take(c->logs, match_late, &all)))
        free(p);
    free(c->logs);
    c->logs = NULL;
}
