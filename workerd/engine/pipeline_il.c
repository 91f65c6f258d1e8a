/* The interleaved 1F1B schedule (pipeline.h: eng_pipeline_init_interleaved); its program and
 * the buffers each op uses are common/pipe_il.h's layout. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/util.h"
#include "workerd/engine/pipeline.h"
#include "workerd/engine/pipeline_il.h"

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
    p->count = count;
    int rc = ch_il_layout(&il->lay, stages, stage, chunks, m);
    if (rc < 0)
        return rc;
    const ch_il_layout_t *l = &il->lay;
    p->slots = l->slots;
    eng_p2p_init(&p->p2p, pp, (int32_t)l->peers[0], (int32_t)l->peers[1]);
    il->apart = eng_p2p_sends_progress(&p->p2p);
    il->arrived = calloc(2 * (size_t)chunks * m, 1);
    il->sendx = malloc(2 * (size_t)l->g.total * sizeof *il->sendx);
    il->out = calloc(2 * (size_t)l->g.total, 1);
    for (uint32_t j = 0; il->sendx && j < 2 * l->g.total; j++)
        il->sendx[j] = UINT32_MAX;
    for (uint32_t k = 0; il->sendx && k < l->nxfer; k++)
        if (l->xfer[k].send)
            il->sendx[l->xfer[k].op] = k;
    il->y = calloc(l->slots, sizeof *il->y);
    il->in = l->recvs ? zalloc(p->be, (size_t)l->recvs * count) : NULL;
    il->dx = l->sends ? zalloc(p->be, (size_t)l->sends * count) : NULL;
    rc = il->arrived && il->y && il->sendx && il->out && (il->in || !l->recvs) &&
                 (il->dx || !l->sends)
             ? 0
             : -ENOMEM;
    if (rc < 0)
        eng_pipeline_il_fini(p);
    return rc;
}

void eng_pipeline_il_fini(eng_pipeline_t *p)
{
    eng_pipe_il_t *il = &p->il;
    for (uint32_t i = 0; i < ENG_PIPE_IL_LONE; i++) {
        eng_p2p_finish(&p->p2p, &il->lone[i]); /* done already: the step waits for them */
        eng_p2p_req_release(&il->lone[i]);
    }
    free(il->y);
    free(il->arrived);
    free(il->sendx);
    free(il->out);
    if (p->be) {
        p->be->free(p->be, il->in);
        p->be->free(p->be, il->dx);
    }
    ch_il_layout_free(&il->lay);
    memset(il, 0, sizeof *il);
}

/* Where a transfer's data is: the receive buffer of its message, or what its op sends (the
 * forward's output in its slot, the backward's input gradient in its send buffer). */
static float *xfer_buf(eng_pipeline_t *p, const ch_il_xfer_t *x)
{
    eng_pipe_il_t *il = &p->il;
    const ch_il_layout_t *l = &il->lay;
    if (!x->send)
        return il->in + (size_t)l->recv[x->id] * p->count;
    int fwd;
    uint32_t c, mb;
    ch_il_op(&l->g, x->op, &fwd, &c, &mb);
    uint32_t at = c * l->g.m + mb;
    return fwd ? (float *)il->y[l->slot[at]] : il->dx + (size_t)l->send[at] * p->count;
}

/* A send started and left in flight (alone, or on the host beside a receive): the buffer it
 * reads is not written again until its receiver provably has it (pipe_il.h), and the request
 * ring's slot is finished before it is reused. On NCCL the stream keeps the step's order
 * whether or not the host waits; on the host, waiting here would hold the sender until the
 * receiver gets to its receive. */
static int lone_send(eng_pipeline_t *p, uint32_t peer, const float *buf)
{
    eng_pipe_il_t *il = &p->il;
    eng_p2p_t *q = &p->p2p;
    eng_p2p_req_t *r = &il->lone[il->nlone++ % ENG_PIPE_IL_LONE];
    int rc = eng_p2p_finish(q, r);
    if (rc == 0)
        rc = peer == (uint32_t)q->next ? eng_p2p_send_next(q, buf, p->count, r)
                                       : eng_p2p_send_prev(q, buf, p->count, r);
    return rc;
}

/* Host transports (il->apart): a ring slot for a send, the step's transfers done up to
 * il->next: an empty or finished one; else, unless early, the one holding the earliest send
 * of the step's order before transfer k, which the host may block on (pipe_il.h: its
 * receiver gets to it before anything this stage does from k on). An early send takes a
 * slot only while at most ENG_PIPE_IL_LONE - 1 hold sends not yet due (at or after il->next),
 * so a send at its place always finds one. *slot UINT32_MAX: none without blocking. */
static int ring_slot(eng_pipeline_t *p, uint32_t k, int early, uint32_t *slot)
{
    eng_pipe_il_t *il = &p->il;
    uint32_t free_at = UINT32_MAX, old = UINT32_MAX, ahead = 0;
    for (uint32_t i = 0; i < ENG_PIPE_IL_LONE; i++) {
        int rc = eng_p2p_reap(&p->p2p, &il->lone[i]);
        if (rc < 0)
            return rc;
        if (rc == 1)
            free_at = free_at == UINT32_MAX ? i : free_at;
        else if (il->lat[i] >= il->next)
            ahead++;
        else if (il->lat[i] < k && (old == UINT32_MAX || il->lat[i] < il->lat[old]))
            old = i;
    }
    *slot = free_at;
    if (early)
        *slot = ahead + 1 < ENG_PIPE_IL_LONE ? free_at : UINT32_MAX;
    else if (free_at == UINT32_MAX)
        *slot = old;
    return early || *slot != UINT32_MAX ? 0 : CH_E_STATE; /* never: one is due */
}

/* Host transports: start transfer k (a send) in flight, at its place in the step's order
 * (early 0: finishing an older send if it must) or as soon as its op has made the data
 * (early 1, after the op: the receiver then need not wait for the point the order placed
 * it at, which the order's simulated pass times put later than measured ones may need);
 * *started 0 when early found no slot free. The per-pair order holds: each neighbour's
 * sends start in program order (early ones by il->early, due ones in the step's order). */
static int send_apart(eng_pipeline_t *p, uint32_t k, int early, int *started)
{
    eng_pipe_il_t *il = &p->il;
    eng_p2p_t *q = &p->p2p;
    const ch_il_xfer_t *x = &il->lay.xfer[k];
    uint32_t slot;
    int rc = ring_slot(p, k, early, &slot);
    *started = rc == 0 && slot != UINT32_MAX;
    if (!*started)
        return rc;
    const float *buf = xfer_buf(p, x);
    eng_p2p_req_t *r = &il->lone[slot];
    if (!buf)
        return CH_E_STATE;     /* a forward output not made: never */
    rc = eng_p2p_finish(q, r); /* done already (ring_slot) unless it was due */
    if (rc == 0)
        rc = x->peer == (uint32_t)q->next ? eng_p2p_send_next(q, buf, p->count, r)
                                          : eng_p2p_send_prev(q, buf, p->count, r);
    il->lat[slot] = k;
    il->out[x->op] = 1;
    return rc;
}

/* Host transports, after op j: the sends of ops up to j started in program order, while
 * the ring has a slot free for them (send_apart). */
static int send_early(eng_pipeline_t *p, uint32_t j)
{
    eng_pipe_il_t *il = &p->il;
    int rc = 0, started = 1;
    for (; rc == 0 && started && il->early <= j; il->early += started) {
        uint32_t k = il->sendx[il->early];
        if (k != UINT32_MAX && !il->out[il->early])
            rc = send_apart(p, k, 1, &started);
    }
    return rc;
}

/* The transfers at program point j, in the step's order (pipe_il.h), each receive done
 * before the next transfer. A send alone is left in flight (lone_send). A send and a receive
 * next to each other go as one grouped exchange on NCCL, whose host waits for both; on the
 * host transports (il->apart) the send is left in flight too (unless send_early started it
 * already) and only the receive is waited: a grouped exchange there held the sender until its
 * peer reached the matching receive, and at p 2, m 8 the slower stage 1 lost 7-15 ms so at 7
 * of its 23 exchanges (its peer still computing), time stage 0 then waited for in turn. No deadlock
 * either way: a host blocks only on transfers at or before its place in the step's order (the ring
 * finishes older sends), and the transport progresses every send while the host waits on anything.
 */
static int xfers_at(eng_pipeline_t *p, uint32_t j)
{
    eng_pipe_il_t *il = &p->il;
    const ch_il_layout_t *l = &il->lay;
    eng_p2p_t *q = &p->p2p;
    int rc = 0;
    while (rc == 0 && il->next < l->nxfer && l->xfer[il->next].at == j) {
        uint32_t n = ch_il_launch(l, il->next);
        const ch_il_xfer_t *a = &l->xfer[il->next], *b = n == 2 ? a + 1 : NULL;
        il->next += n;
        const ch_il_xfer_t *s = a->send ? a : b, *r = a->send ? b : a;
        float *sb = s ? xfer_buf(p, s) : NULL, *rb = r ? xfer_buf(p, r) : NULL;
        if (s && !sb)
            return CH_E_STATE; /* a forward output not made: never */
        if (s && r && !il->apart) {
            rc = eng_p2p_sendrecv(q, (int32_t)s->peer, sb, (int32_t)r->peer, rb, p->count);
        } else {
            int started;
            if (s && !il->apart)
                rc = lone_send(p, s->peer, sb);
            else if (s && !il->out[s->op])
                rc = send_apart(p, (uint32_t)(s - l->xfer), 0, &started);
            if (rc == 0 && r)
                rc = r->peer == (uint32_t)q->prev ? eng_p2p_recv_prev(q, rb, p->count)
                                                  : eng_p2p_recv_next(q, rb, p->count);
        }
        if (rc == 0 && r)
            il->arrived[r->id] = 1;
    }
    return rc;
}

/* Message id's buffer, received by the transfers before this op. */
static int need(eng_pipeline_t *p, uint32_t id, float **buf)
{
    eng_pipe_il_t *il = &p->il;
    *buf = il->in + (size_t)il->lay.recv[id] * p->count;
    return il->arrived[id] ? 0 : CH_E_STATE; /* the order lost it: never */
}

static int run_op(eng_pipeline_t *p, const eng_stage_ops_t *ops, uint32_t j)
{
    eng_pipe_il_t *il = &p->il;
    const ch_il_layout_t *l = &il->lay;
    const ch_il_prog_t *g = &l->g;
    int fwd, rc = 0;
    uint32_t c, mb;
    ch_il_op(g, j, &fwd, &c, &mb);
    uint32_t at = c * g->m + mb, slot = l->slot[at];
    int first = g->stage == 0 && c == 0, last = g->stage == g->stages - 1 && c == g->chunks - 1;
    if (fwd) {
        float *x = NULL;
        const float *y = NULL;
        if (!first)
            rc = need(p, ch_il_msg(g, 0, c, mb), &x);
        uint64_t t0 = ch_now_ns();
        if (rc == 0)
            rc = ops->chunk_forward(ops->ctx, c, mb, slot, x, last ? NULL : &y);
        p->op_ns[ENG_PIPE_OP_FWD] += ch_now_ns() - t0;
        if (rc == 0 && !last && !y)
            rc = -EINVAL;
        il->y[slot] = y;
        return rc;
    }
    float *dy = NULL, *dx = NULL;
    if (!last)
        rc = need(p, ch_il_msg(g, 1, c, mb), &dy);
    if (!first)
        dx = il->dx + (size_t)l->send[at] * p->count;
    uint64_t t0 = ch_now_ns();
    if (rc == 0)
        rc = ops->chunk_backward(ops->ctx, c, mb, slot, dy, dx);
    p->op_ns[ENG_PIPE_OP_BWD] += ch_now_ns() - t0;
    return rc;
}

int eng_pipeline_il_run(eng_pipeline_t *p, const eng_stage_ops_t *ops, uint32_t m)
{
    eng_pipe_il_t *il = &p->il;
    if (m != il->lay.g.m || !ops->chunk_forward || !ops->chunk_backward)
        return -EINVAL;
    memset(il->arrived, 0, 2 * (size_t)il->lay.g.chunks * m);
    memset(il->out, 0, 2 * (size_t)il->lay.g.total);
    il->next = 0;
    il->nlone = 0;
    il->early = 0;
    int rc = 0;
    for (uint32_t j = 0; rc == 0 && j < 2 * il->lay.g.total; j++) {
        rc = xfers_at(p, j);
        if (rc == 0)
            rc = run_op(p, ops, j);
        if (rc == 0 && il->apart)
            rc = send_early(p, j);
    }
    /* the sends the receivers pull after this stage's last op; then every send of the step
     * done before the step's gradients are used */
    if (rc == 0)
        rc = xfers_at(p, 2 * il->lay.g.total);
    for (uint32_t i = 0; rc == 0 && i < ENG_PIPE_IL_LONE; i++)
        rc = eng_p2p_finish(&p->p2p, &il->lone[i]);
    return rc;
}
