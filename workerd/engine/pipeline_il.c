/* The interleaved 1F1B schedule (pipeline.h: eng_pipeline_init_interleaved). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "workerd/engine/pipeline.h"
#include "workerd/engine/pipeline_il.h"

/* A stage's program: its forwards and backwards of (chunk, micro-batch) in Megatron's order. */
typedef struct il_prog {
    uint32_t stages, stage, chunks, m, total, warm;
} il_prog_t;

static il_prog_t prog_of(uint32_t stages, uint32_t stage, uint32_t chunks, uint32_t m)
{
    il_prog_t g = {stages, stage, chunks, m, m * chunks, 0};
    uint32_t w = (stages - stage - 1) * 2 + (chunks - 1) * stages;
    g.warm = m == stages || w > g.total ? g.total : w;
    return g;
}

/* Op j (0 .. 2 * total) of g: *fwd whether a forward, of chunk *c and micro-batch *mb. The
 * k-th forward runs chunk (k / stages) % chunks, the k-th backward the chunks in reverse;
 * both micro-batch (k / (stages * chunks)) * stages + k % stages. */
static void prog_op(const il_prog_t *g, uint32_t j, int *fwd, uint32_t *c, uint32_t *mb)
{
    uint32_t T = g->total, W = g->warm, k;
    if (j < W) {
        *fwd = 1;
        k = j;
    } else if (j < W + 2 * (T - W)) {
        uint32_t d = j - W;
        *fwd = !(d & 1u);
        k = *fwd ? W + d / 2 : d / 2;
    } else {
        *fwd = 0;
        k = (T - W) + (j - W - 2 * (T - W));
    }
    *c = (k / g->stages) % g->chunks;
    if (!*fwd)
        *c = g->chunks - 1 - *c;
    *mb = (k / (g->stages * g->chunks)) * g->stages + k % g->stages;
}

/* Message ids, as the receiving stage names them: kind 0 the input of its chunk c for mb,
 * kind 1 the gradient of that chunk's output. */
static uint32_t msg_id(const il_prog_t *g, uint32_t kind, uint32_t c, uint32_t mb)
{
    return (kind * g->chunks + c) * g->m + mb;
}

/* What op (fwd, c, mb) of g's stage sends: 1 and *to, *id; 0 when it sends nothing (the
 * last chunk of the last stage's forward, chunk 0 of stage 0's backward). */
static int prog_send(const il_prog_t *g, int fwd, uint32_t c, uint32_t mb, uint32_t *to,
                     uint32_t *id)
{
    uint32_t S = g->stages, s = g->stage;
    if (fwd) {
        if (s == S - 1 && c == g->chunks - 1)
            return 0;
        *to = (s + 1) % S;
        *id = msg_id(g, 0, s == S - 1 ? c + 1 : c, mb);
    } else {
        if (s == 0 && c == 0)
            return 0;
        *to = (s + S - 1) % S;
        *id = msg_id(g, 1, s == 0 ? c - 1 : c, mb);
    }
    return 1;
}

static int peer_index(const eng_pipe_il_t *il, uint32_t peer)
{
    return il->npeers > 1 && il->peers[1] == peer ? 1 : 0;
}

/* The ids peer's program sends to `me`, in its order. */
static int expect_from(eng_pipe_il_t *il, uint32_t stages, uint32_t peer, uint32_t me)
{
    il_prog_t g = prog_of(stages, peer, il->chunks, il->m);
    int i = peer_index(il, peer);
    il->seq[i] = malloc(2 * (size_t)g.total * sizeof *il->seq[i]);
    if (!il->seq[i])
        return -ENOMEM;
    il->nseq[i] = 0;
    for (uint32_t j = 0; j < 2 * g.total; j++) {
        int fwd;
        uint32_t c, mb, to, id;
        prog_op(&g, j, &fwd, &c, &mb);
        if (prog_send(&g, fwd, c, mb, &to, &id) && to == me)
            il->seq[i][il->nseq[i]++] = id;
    }
    return 0;
}

static float *zalloc(const eng_backend_t *be, size_t n)
{
    void *buf = NULL;
    if (be->alloc(be, n * sizeof(float), &buf) < 0)
        return NULL;
    if (be->memset(be, buf, 0, n * sizeof(float)) < 0) {
        be->free(be, buf);
        return NULL;
    }
    return buf;
}

int eng_pipeline_init_interleaved(eng_pipeline_t *p, const eng_backend_t *be, wrk_coll_group_t *pp,
                                  uint32_t stages, uint32_t stage, uint32_t chunks, uint32_t m,
                                  size_t count)
{
    memset(p, 0, sizeof *p);
    if (stages < 2 || stage >= stages || chunks < 2 || m == 0 || m % stages != 0 || count == 0)
        return -EINVAL;
    eng_pipe_il_t *il = &p->il;
    p->be = be ? be : eng_backend_cpu();
    p->schedule = ENG_PIPE_INTERLEAVED;
    p->stage = stage;
    p->stages = stages;
    p->slots = m;
    p->count = count;
    uint32_t prev = (stage + stages - 1) % stages, next = (stage + 1) % stages;
    eng_p2p_init(&p->p2p, pp, (int32_t)prev, (int32_t)next);
    il->chunks = chunks;
    il->m = m;
    il->peers[0] = prev;
    il->peers[1] = next;
    il->npeers = prev == next ? 1 : 2;
    size_t ids = 2 * (size_t)chunks * m;
    il->arrived = calloc(ids, 1);
    il->reqs = calloc(ids, sizeof *il->reqs);
    il->in = zalloc(p->be, ids * count);
    il->dx = zalloc(p->be, ids / 2 * count);
    int rc = il->arrived && il->reqs && il->in && il->dx ? 0 : -ENOMEM;
    for (uint32_t i = 0; rc == 0 && i < il->npeers; i++)
        rc = expect_from(il, stages, il->peers[i], stage);
    if (rc < 0)
        eng_pipeline_il_fini(p);
    return rc;
}

void eng_pipeline_il_fini(eng_pipeline_t *p)
{
    eng_pipe_il_t *il = &p->il;
    for (size_t i = 0; il->reqs && i < 2 * (size_t)il->chunks * il->m; i++)
        eng_p2p_finish(&p->p2p, &il->reqs[i]);
    free(il->reqs);
    free(il->arrived);
    free(il->seq[0]);
    free(il->seq[1]);
    if (p->be) {
        p->be->free(p->be, il->in);
        p->be->free(p->be, il->dx);
    }
    memset(il, 0, sizeof *il);
}

/* Message id's buffer, received first: the messages from peer up to it, in the peer's order,
 * each into its own buffer. */
static int need(eng_pipeline_t *p, uint32_t peer, uint32_t id, float **buf)
{
    eng_pipe_il_t *il = &p->il;
    int i = peer_index(il, peer), rc = 0;
    while (rc == 0 && !il->arrived[id]) {
        if (il->cur[i] >= il->nseq[i])
            return CH_E_STATE; /* the programs disagree: never */
        uint32_t got = il->seq[i][il->cur[i]++];
        float *dst = il->in + (size_t)got * p->count;
        rc = peer == (uint32_t)p->p2p.prev ? eng_p2p_recv_prev(&p->p2p, dst, p->count)
                                           : eng_p2p_recv_next(&p->p2p, dst, p->count);
        il->arrived[got] = rc == 0;
    }
    *buf = il->in + (size_t)id * p->count;
    return rc;
}

static int il_send(eng_pipeline_t *p, const il_prog_t *g, int fwd, uint32_t c, uint32_t mb,
                   const float *buf)
{
    uint32_t to, id;
    if (!prog_send(g, fwd, c, mb, &to, &id))
        return 0;
    eng_p2p_req_t *r = &p->il.reqs[(fwd ? 0 : g->chunks * g->m) + c * g->m + mb];
    int rc = eng_p2p_finish(&p->p2p, r); /* the last step's, done by now */
    if (rc == 0)
        rc = to == (uint32_t)p->p2p.next ? eng_p2p_send_next(&p->p2p, buf, p->count, r)
                                         : eng_p2p_send_prev(&p->p2p, buf, p->count, r);
    return rc;
}

static int run_op(eng_pipeline_t *p, const eng_stage_ops_t *ops, const il_prog_t *g, uint32_t j)
{
    int fwd, rc = 0;
    uint32_t c, mb;
    prog_op(g, j, &fwd, &c, &mb);
    int first = g->stage == 0 && c == 0, last = g->stage == g->stages - 1 && c == g->chunks - 1;
    if (fwd) {
        float *x = NULL;
        const float *y = NULL;
        if (!first)
            rc = need(p, (uint32_t)p->p2p.prev, msg_id(g, 0, c, mb), &x);
        if (rc == 0)
            rc = ops->chunk_forward(ops->ctx, c, mb, mb, x, last ? NULL : &y);
        if (rc == 0 && !last && !y)
            rc = -EINVAL;
        return rc == 0 && !last ? il_send(p, g, 1, c, mb, y) : rc;
    }
    float *dy = NULL, *dx = first ? NULL : p->il.dx + ((size_t)c * g->m + mb) * p->count;
    if (!last)
        rc = need(p, (uint32_t)p->p2p.next, msg_id(g, 1, c, mb), &dy);
    if (rc == 0 && dx)
        rc = eng_p2p_finish(&p->p2p, &p->il.reqs[g->chunks * g->m + c * g->m + mb]);
    if (rc == 0)
        rc = ops->chunk_backward(ops->ctx, c, mb, mb, dy, dx);
    return rc == 0 && dx ? il_send(p, g, 0, c, mb, dx) : rc;
}

int eng_pipeline_il_run(eng_pipeline_t *p, const eng_stage_ops_t *ops, uint32_t m)
{
    eng_pipe_il_t *il = &p->il;
    if (m != il->m || !ops->chunk_forward || !ops->chunk_backward)
        return -EINVAL;
    il_prog_t g = prog_of(p->stages, p->stage, il->chunks, m);
    memset(il->arrived, 0, 2 * (size_t)il->chunks * m);
    il->cur[0] = il->cur[1] = 0;
    int rc = 0;
    for (uint32_t j = 0; rc == 0 && j < 2 * g.total; j++)
        rc = run_op(p, ops, &g, j);
    /* every send of the step is done before the step's gradients are used */
    for (size_t i = 0; rc == 0 && i < 2 * (size_t)il->chunks * m; i++)
        rc = eng_p2p_finish(&p->p2p, &il->reqs[i]);
    return rc;
}
