/* ncclsim (ncclsim.h): NCCL's stream order and rendezvous sends, on the host.
 *
 * Theory of operation: every group of the world is one shared record (sgroup_t), found by
 * each member through its name, id, size and first rank. It holds one queue of launches per member:
 * that member's stream. A start appends a launch; progress, under the world's one mutex, looks at
 * the head launch of every stream and completes what can complete there: a send when the head of
 * its peer's stream holds the matching receive (same pair, same sequence number), a collective when
 * the head of every member's stream holds it (same sequence number). A head whose operations are
 * all done leaves its queue; the next launch becomes the head.
 *
 * Outputs, as a GPU writes them: asynchronously. From its start until a test of its request
 * has seen it done (the caller's wait, the event NCCL's users must honour), an operation's
 * output buffer holds all-ones bytes (NaN as f32) wherever it is not also an input, and the
 * result reaches it only at that test: code that reads an output it has not waited for reads
 * NaN, never a result that happens to be there already.
 *
 * Deadlock: a rank that calls progress and finds nothing to do is marked stuck at the
 * world's current count of completed operations; starting an operation or seeing one of
 * its requests done clears the mark. When every rank of the world is marked at the current
 * count for a second, nothing can ever move again: the world fails. */
#include "ncclsim.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/util.h"
#include "workerd/coll/coll_impl.h"

#define DEADLOCK_HOLD_MS 1000
#define GONE             UINT64_MAX

typedef struct sim_op {
    wrk_coll_op_kind_t kind; /* SEND, RECV or a collective */
    const void *sbuf;
    void *rbuf;
    size_t count;
    uint32_t peer; /* SEND/RECV: peer; BROADCAST: root */
    uint64_t seq;  /* per pair and direction (p2p), per member (collectives) */
    int done;
    void *held; /* the result, written to rbuf only when a test of its request sees it done */
    size_t held_bytes;
} sim_op_t;

typedef struct sgroup sgroup_t;

typedef struct launch {
    struct launch *next;
    sgroup_t *g;
    uint32_t member;
    wrk_coll_dtype_t dt;
    wrk_coll_redop_t op;
    sim_op_t ops[2];
    int nops;
    int queued; /* still in its stream */
    int open;   /* a reduce-scatter its waiter has not yet seen done (ncclsim_open_scatters) */
    /* its "device time" (coll.h's device_ns, as NCCL's events give it): from its start
     * until a test first sees it done, counted once */
    uint64_t t0;
    int timed;
} launch_t;

struct sgroup {
    sgroup_t *next;
    char key[128];
    uint32_t n, attached;
    uint8_t *joined; /* per member: attached (a group built again gets a new record) */
    launch_t **head; /* per member: its stream */
    uint64_t *coll;  /* per member: collectives started */
    uint64_t *sent;  /* [from * n + to]: sends started */
    uint64_t *recvd; /* [at * n + from]: receives started */
};

struct ncclsim {
    pthread_mutex_t mu;
    sgroup_t *groups;
    uint32_t world;
    uint64_t moves;    /* operations completed so far */
    uint64_t *stuck;   /* per rank: moves + 1 when it last found nothing to do; 0 not stuck;
                        * GONE once its context is destroyed (it will never move again) */
    uint64_t stuck_ms; /* when every rank was first seen stuck at this count (0: not) */
    int failed;        /* 0, or what every operation fails with */
    uint32_t *open;    /* per rank: reduce-scatters started and not yet seen done */
};

typedef struct simctx {
    ncclsim_t *s;
    uint32_t rank;
} simctx_t;

int ncclsim_create(uint32_t world, ncclsim_t **out)
{
    *out = NULL;
    ncclsim_t *s = calloc(1, sizeof *s);
    if (!s || !(s->stuck = calloc(world, sizeof *s->stuck)) ||
        !(s->open = calloc(world, sizeof *s->open))) {
        free(s ? s->stuck : NULL);
        free(s);
        return -ENOMEM;
    }
    pthread_mutex_init(&s->mu, NULL);
    s->world = world;
    *out = s;
    return 0;
}

void ncclsim_destroy(ncclsim_t *s)
{
    if (!s)
        return;
    pthread_mutex_destroy(&s->mu);
    free(s->stuck);
    free(s->open);
    free(s);
}

uint32_t ncclsim_open_scatters(ncclsim_t *s, uint32_t rank)
{
    pthread_mutex_lock(&s->mu);
    uint32_t n = s->open[rank];
    pthread_mutex_unlock(&s->mu);
    return n;
}

/* l's reduce-scatter seen done by its waiter, or dropped (callers hold mu) */
static void close_open(ncclsim_t *s, uint32_t rank, launch_t *l)
{
    if (l->open)
        s->open[rank]--;
    l->open = 0;
}

int ncclsim_deadlocked(ncclsim_t *s)
{
    pthread_mutex_lock(&s->mu);
    int d = s->failed == -EDEADLK;
    pthread_mutex_unlock(&s->mu);
    return d;
}

// ----------------------------------------------------------------------------
// context and groups

static int sim_init(wrk_coll_t *c, const wrk_coll_config_t *cfg)
{
    simctx_t *x = calloc(1, sizeof *x);
    if (!x)
        return -ENOMEM;
    x->s = cfg->impl_ud;
    x->rank = cfg->rank;
    c->be = x;
    return 0;
}

static void sim_fini(wrk_coll_t *c)
{
    simctx_t *x = c->be;
    pthread_mutex_lock(&x->s->mu);
    x->s->stuck[x->rank] = GONE;
    pthread_mutex_unlock(&x->s->mu);
    free(x);
}

static sgroup_t *sgroup_new(const char *key, uint32_t n)
{
    sgroup_t *g = calloc(1, sizeof *g);
    if (!g)
        return NULL;
    snprintf(g->key, sizeof g->key, "%s", key);
    g->n = n;
    g->joined = calloc(n, 1);
    g->head = calloc(n, sizeof *g->head);
    g->coll = calloc(n, sizeof *g->coll);
    g->sent = calloc((size_t)n * n, sizeof *g->sent);
    g->recvd = calloc((size_t)n * n, sizeof *g->recvd);
    if (!g->joined || !g->head || !g->coll || !g->sent || !g->recvd) {
        free(g->joined);
        free(g->head);
        free(g->coll);
        free(g->sent);
        free(g->recvd);
        free(g);
        return NULL;
    }
    return g;
}

/* Members find each other by name, id, size and first rank: the first record of that key
 * this member has not joined yet (members build their groups in the same order). */
static int sim_group_init(wrk_coll_group_t *g, int timeout_ms)
{
    (void)timeout_ms;
    ncclsim_t *s = ((simctx_t *)g->c->be)->s;
    char key[128];
    snprintf(key, sizeof key, "%s/%u/%u/%u", g->name, g->id, g->ranks[0], g->n);
    pthread_mutex_lock(&s->mu);
    sgroup_t *sg = s->groups, *found = NULL;
    for (; sg; sg = sg->next)
        if (strcmp(sg->key, key) == 0 && !sg->joined[g->me])
            found = sg; /* the list is newest first: keep the oldest */
    if (!found && (found = sgroup_new(key, g->n)) != NULL) {
        found->next = s->groups;
        s->groups = found;
    }
    if (found) {
        found->attached++;
        found->joined[g->me] = 1;
    }
    pthread_mutex_unlock(&s->mu);
    g->be = found;
    return found ? 0 : -ENOMEM;
}

static void sim_group_fini(wrk_coll_group_t *g)
{
    ncclsim_t *s = ((simctx_t *)g->c->be)->s;
    sgroup_t *sg = g->be;
    if (!sg)
        return;
    pthread_mutex_lock(&s->mu);
    if (--sg->attached == 0) {
        sgroup_t **p = &s->groups;
        while (*p != sg)
            p = &(*p)->next;
        *p = sg->next;
        free(sg->joined);
        free(sg->head);
        free(sg->coll);
        free(sg->sent);
        free(sg->recvd);
        free(sg);
    }
    pthread_mutex_unlock(&s->mu);
    g->be = NULL;
}

// ----------------------------------------------------------------------------
// starting: a launch at the tail of the member's stream

static void op_of(sgroup_t *g, uint32_t me, const wrk_coll_args_t *a, wrk_coll_op_kind_t kind,
                  sim_op_t *o)
{
    memset(o, 0, sizeof *o);
    o->kind = kind;
    if (kind == WRK_COLL_OP_SEND) {
        o->sbuf = a->sendbuf;
        o->count = a->count;
        o->peer = a->peer;
        o->seq = g->sent[me * g->n + a->peer]++;
    } else if (kind == WRK_COLL_OP_RECV) {
        int half = a->kind == WRK_COLL_OP_SENDRECV;
        o->rbuf = a->recvbuf;
        o->count = half ? a->rcount : a->count;
        o->peer = half ? a->rpeer : a->peer;
        o->seq = g->recvd[me * g->n + o->peer]++;
    } else {
        o->sbuf = a->sendbuf;
        o->rbuf = a->recvbuf;
        o->count = a->count;
        o->peer = a->peer;
        o->seq = g->coll[me]++;
    }
}

/* bytes o reads from sbuf and writes to rbuf (0: none), for a group of n */
static void op_bytes(const sim_op_t *o, uint32_t n, size_t esz, size_t *in, size_t *out)
{
    size_t c = o->count * esz;
    *in = *out = 0;
    switch (o->kind) {
    case WRK_COLL_OP_SEND:
        *in = c;
        break;
    case WRK_COLL_OP_RECV:
        *out = c;
        break;
    case WRK_COLL_OP_ALLREDUCE:
        *in = *out = c;
        break;
    case WRK_COLL_OP_REDUCE_SCATTER:
        *in = n * c, *out = c;
        break;
    case WRK_COLL_OP_ALLGATHER:
        *in = c, *out = n * c;
        break;
    default: /* broadcast reads its root's rbuf; a barrier moves nothing */
        break;
    }
}

/* Not yet written by the "device": all-ones bytes where the output is not also an input. */
static void poison_output(const sim_op_t *o, uint32_t n, size_t esz)
{
    size_t in, out;
    op_bytes(o, n, esz, &in, &out);
    const char *s0 = o->sbuf, *r0 = o->rbuf;
    if (out == 0 || (in > 0 && s0 < r0 + out && r0 < s0 + in))
        return;
    memset(o->rbuf, 0xff, out);
}

/* The result of o, held until a test of its request sees it (sim_test). */
static int deliver(ncclsim_t *s, sim_op_t *o, const void *src, size_t bytes)
{
    o->held = malloc(bytes ? bytes : 1);
    if (!o->held) {
        s->failed = -ENOMEM;
        return 0;
    }
    memcpy(o->held, src, bytes);
    o->held_bytes = bytes;
    return 1;
}

static int sim_start(wrk_coll_req_t *r)
{
    ncclsim_t *s = ((simctx_t *)r->g->c->be)->s;
    sgroup_t *g = r->g->be;
    uint32_t me = r->g->me;
    launch_t *l = calloc(1, sizeof *l);
    if (!l)
        return -ENOMEM;
    l->g = g;
    l->member = me;
    l->dt = r->a.dt;
    l->op = r->a.op;
    l->t0 = ch_now_ns();
    pthread_mutex_lock(&s->mu);
    if (r->a.kind == WRK_COLL_OP_SENDRECV) {
        op_of(g, me, &r->a, WRK_COLL_OP_SEND, &l->ops[0]);
        op_of(g, me, &r->a, WRK_COLL_OP_RECV, &l->ops[1]);
        l->nops = 2;
    } else {
        op_of(g, me, &r->a, r->a.kind, &l->ops[0]);
        l->nops = 1;
    }
    for (int i = 0; i < l->nops; i++)
        poison_output(&l->ops[i], g->n, wrk_coll_dtype_size(l->dt));
    launch_t **tail = &g->head[me];
    while (*tail)
        tail = &(*tail)->next;
    *tail = l;
    l->queued = 1;
    l->open = r->a.kind == WRK_COLL_OP_REDUCE_SCATTER;
    s->open[((simctx_t *)r->g->c->be)->rank] += (uint32_t)l->open;
    s->stuck[((simctx_t *)r->g->c->be)->rank] = 0;
    pthread_mutex_unlock(&s->mu);
    r->be = l;
    return 0;
}

// ----------------------------------------------------------------------------
// progress (callers hold mu)

static size_t esz_of(const launch_t *l)
{
    return wrk_coll_dtype_size(l->dt);
}

/* the not-done operation of member m's head launch of the given kind, peer and seq */
static sim_op_t *head_op(sgroup_t *g, uint32_t m, wrk_coll_op_kind_t kind, uint32_t peer,
                         uint64_t seq)
{
    launch_t *h = g->head[m];
    for (int i = 0; h && i < h->nops; i++) {
        sim_op_t *o = &h->ops[i];
        int p2p = kind == WRK_COLL_OP_SEND || kind == WRK_COLL_OP_RECV;
        if (!o->done && o->kind == kind && o->seq == seq && (!p2p || o->peer == peer))
            return o;
    }
    return NULL;
}

static int match_send(ncclsim_t *s, sgroup_t *g, uint32_t m, sim_op_t *o)
{
    sim_op_t *r = head_op(g, o->peer, WRK_COLL_OP_RECV, m, o->seq);
    if (!r)
        return 0;
    if (r->count != o->count) {
        fprintf(stderr, "ncclsim: %s: member %u sends %zu elements, member %u receives %zu\n",
                g->key, m, o->count, o->peer, r->count);
        s->failed = -EINVAL;
        return 0;
    }
    if (!deliver(s, r, o->sbuf, o->count * esz_of(g->head[m])))
        return 0;
    o->done = r->done = 1;
    return 1;
}

/* Run a collective every member's head holds: o[i] is member i's operation. */
static int run_collective(ncclsim_t *s, sgroup_t *g, sim_op_t **o, const launch_t *l)
{
    size_t n = g->n, c = o[0]->count, esz = esz_of(l);
    wrk_coll_op_kind_t k = o[0]->kind;
    size_t total = k == WRK_COLL_OP_REDUCE_SCATTER || k == WRK_COLL_OP_ALLGATHER ? n * c : c;
    char *tmp = malloc(total * esz + 1);
    if (!tmp)
        return -ENOMEM;
    if (k == WRK_COLL_OP_ALLREDUCE || k == WRK_COLL_OP_REDUCE_SCATTER) {
        memcpy(tmp, o[0]->sbuf, total * esz);
        for (size_t i = 1; i < n; i++)
            wrk_coll_reduce(l->op, l->dt, tmp, tmp, o[i]->sbuf, total);
    } else if (k == WRK_COLL_OP_ALLGATHER) {
        for (size_t i = 0; i < n; i++)
            memcpy(tmp + i * c * esz, o[i]->sbuf, c * esz);
    } else if (k == WRK_COLL_OP_BROADCAST) {
        memcpy(tmp, o[o[0]->peer]->rbuf, c * esz);
    }
    for (size_t i = 0; i < n && k != WRK_COLL_OP_BARRIER; i++) {
        const char *src = k == WRK_COLL_OP_REDUCE_SCATTER ? tmp + i * c * esz : tmp;
        size_t bytes = k == WRK_COLL_OP_REDUCE_SCATTER ? c * esz : total * esz;
        if (!deliver(s, o[i], src, bytes)) {
            free(tmp);
            return s->failed;
        }
    }
    for (size_t i = 0; i < n; i++)
        o[i]->done = 1;
    free(tmp);
    return 1;
}

static int match_collective(ncclsim_t *s, sgroup_t *g, sim_op_t *o)
{
    sim_op_t *all[64];
    if (g->n > 64)
        return 0;
    for (uint32_t i = 0; i < g->n; i++)
        if (!(all[i] = head_op(g, i, o->kind, 0, o->seq)))
            return 0;
    int rc = run_collective(s, g, all, g->head[0]);
    if (rc < 0)
        s->failed = rc;
    return rc > 0;
}

/* Complete what member m's head can; pop it when done. Operations completed. */
static int advance(ncclsim_t *s, sgroup_t *g, uint32_t m)
{
    launch_t *h = g->head[m];
    if (!h)
        return 0;
    int moved = 0, left = 0;
    for (int i = 0; i < h->nops; i++) {
        sim_op_t *o = &h->ops[i];
        if (!o->done && o->kind == WRK_COLL_OP_SEND)
            moved += match_send(s, g, m, o);
        else if (!o->done && o->kind != WRK_COLL_OP_RECV)
            moved += match_collective(s, g, o);
        left += !o->done;
    }
    if (!left) {
        g->head[m] = h->next;
        h->queued = 0;
        moved++;
    }
    return moved;
}

static void print_heads(ncclsim_t *s)
{
    for (sgroup_t *g = s->groups; g; g = g->next)
        for (uint32_t m = 0; m < g->n; m++)
            for (int i = 0; g->head[m] && i < g->head[m]->nops; i++) {
                const sim_op_t *o = &g->head[m]->ops[i];
                fprintf(stderr, "ncclsim: %s member %u waits in %s (peer %u, #%llu)%s\n", g->key, m,
                        wrk_coll_op_name(o->kind), o->peer, (unsigned long long)o->seq,
                        o->done ? " [done]" : "");
            }
}

/* Every rank stuck at the current count for DEADLOCK_HOLD_MS: fail the world. */
static void check_deadlock(ncclsim_t *s)
{
    for (uint32_t r = 0; r < s->world; r++)
        if (s->stuck[r] != s->moves + 1 && s->stuck[r] != GONE) {
            s->stuck_ms = 0;
            return;
        }
    uint64_t now = ch_now_ms();
    if (s->stuck_ms == 0)
        s->stuck_ms = now;
    if (now - s->stuck_ms < DEADLOCK_HOLD_MS)
        return;
    fprintf(stderr, "ncclsim: deadlock: every rank waits and no stream can move\n");
    print_heads(s);
    s->failed = -EDEADLK;
}

static int sim_progress(wrk_coll_t *c)
{
    simctx_t *x = c->be;
    ncclsim_t *s = x->s;
    int total = 0, moved;
    pthread_mutex_lock(&s->mu);
    do {
        moved = 0;
        for (sgroup_t *g = s->groups; g && !s->failed; g = g->next)
            for (uint32_t m = 0; m < g->n; m++)
                moved += advance(s, g, m);
        total += moved;
    } while (moved && !s->failed);
    s->moves += (uint64_t)total;
    if (total)
        s->stuck[x->rank] = 0;
    else if (!s->failed) {
        s->stuck[x->rank] = s->moves + 1;
        check_deadlock(s);
    }
    pthread_mutex_unlock(&s->mu);
    return total > 0;
}

/* o's held result: into its output (seen by its waiter) or dropped */
static void release(sim_op_t *o, int write)
{
    if (o->held && write)
        memcpy(o->rbuf, o->held, o->held_bytes);
    free(o->held);
    o->held = NULL;
}

static int sim_test(wrk_coll_req_t *r)
{
    simctx_t *x = r->g->c->be;
    ncclsim_t *s = x->s;
    launch_t *l = r->be;
    pthread_mutex_lock(&s->mu);
    int rc = s->failed ? s->failed : l->queued ? 1 : 0;
    if (rc == 0) {
        s->stuck[x->rank] = 0;
        close_open(s, x->rank, l);
    }
    for (int i = 0; rc == 0 && i < l->nops; i++)
        release(&l->ops[i], 1);
    pthread_mutex_unlock(&s->mu);
    if (rc == 0 && !l->timed) {
        r->g->device_ns += ch_now_ns() - l->t0;
        l->timed = 1;
    }
    return rc;
}

/* A stream-ordered wait: the caller's "stream" is devsim's, whose kernels run on the host
 * at once, so the wait must complete on the host before the next kernel; the front end
 * does that and counts it as a stream wait (what NCCL would enqueue). */
static int sim_wait_stream(wrk_coll_req_t *r)
{
    (void)r;
    return 1;
}

static void sim_req_fini(wrk_coll_req_t *r)
{
    simctx_t *x = r->g->c->be;
    ncclsim_t *s = x->s;
    launch_t *l = r->be;
    if (!l)
        return;
    pthread_mutex_lock(&s->mu);
    close_open(s, x->rank, l);
    if (l->queued) {
        launch_t **p = &l->g->head[l->member];
        while (*p != l)
            p = &(*p)->next;
        *p = l->next;
    }
    pthread_mutex_unlock(&s->mu);
    for (int i = 0; i < l->nops; i++)
        release(&l->ops[i], 0);
    free(l);
    r->be = NULL;
}

/* NCCL tears the communicators down: the peers' operations fail too. */
static void sim_abort(wrk_coll_t *c)
{
    ncclsim_t *s = ((simctx_t *)c->be)->s;
    pthread_mutex_lock(&s->mu);
    if (!s->failed)
        s->failed = CH_E_ABORTED;
    pthread_mutex_unlock(&s->mu);
}

static int sim_mem_alloc(wrk_coll_t *c, size_t bytes, void **out)
{
    (void)c;
    *out = NULL;
    return posix_memalign(out, 64, bytes ? bytes : 1) == 0 ? 0 : -ENOMEM;
}

static void sim_mem_free(wrk_coll_t *c, void *p)
{
    (void)c;
    free(p);
}

static int sim_mem_copy(wrk_coll_t *c, void *dst, const void *src, size_t bytes, int to_backend)
{
    (void)c;
    (void)to_backend;
    memcpy(dst, src, bytes);
    return 0;
}

static int sim_available(void)
{
    return 1;
}

static const wrk_coll_backend_t sim_backend = {
    .name = "ncclsim",
    .init = sim_init,
    .fini = sim_fini,
    .group_init = sim_group_init,
    .group_fini = sim_group_fini,
    .start = sim_start,
    .start_sendrecv = sim_start,
    .progress = sim_progress,
    .test = sim_test,
    .wait_stream = sim_wait_stream,
    .req_fini = sim_req_fini,
    .abort = sim_abort,
    .mem_alloc = sim_mem_alloc,
    .mem_free = sim_mem_free,
    .mem_copy = sim_mem_copy,
    .available = sim_available,
};

void ncclsim_config(ncclsim_t *s, wrk_coll_config_t *cfg)
{
    cfg->backend = WRK_COLL_NCCL;
    cfg->impl = &sim_backend;
    cfg->impl_ud = s;
}
