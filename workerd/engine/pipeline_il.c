/* The interleaved 1F1B schedule (pipeline.h: eng_pipeline_init_interleaved); its program and
 * the buffers each op uses are common/pipe_il.h's layout. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
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
    il->arrived = calloc(2 * (size_t)chunks * m, 1);
    il->ysend = calloc(l->slots, sizeof *il->ysend);
    il->dxsend = calloc(l->sends ? l->sends : 1, sizeof *il->dxsend);
    il->in = l->recvs ? zalloc(p->be, (size_t)l->recvs * count) : NULL;
    il->dx = l->sends ? zalloc(p->be, (size_t)l->sends * count) : NULL;
    rc = il->arrived && il->ysend && il->dxsend && (il->in || !l->recvs) && (il->dx || !l->sends)
             ? 0
             : -ENOMEM;
    if (rc < 0)
        eng_pipeline_il_fini(p);
    return rc;
}

/* Complete every send of the step (or of the schedule, at fini). */
static int finish_all(eng_pipeline_t *p)
{
    eng_pipe_il_t *il = &p->il;
    int rc = 0;
    for (uint32_t i = 0; il->ysend && i < il->lay.slots; i++) {
        int r = eng_p2p_finish(&p->p2p, &il->ysend[i]);
        rc = rc ? rc : r;
    }
    for (uint32_t i = 0; il->dxsend && i < il->lay.sends; i++) {
        int r = eng_p2p_finish(&p->p2p, &il->dxsend[i]);
        rc = rc ? rc : r;
    }
    return rc;
}

void eng_pipeline_il_fini(eng_pipeline_t *p)
{
    eng_pipe_il_t *il = &p->il;
    finish_all(p);
    for (uint32_t i = 0; il->ysend && i < il->lay.slots; i++)
        eng_p2p_req_release(&il->ysend[i]);
    for (uint32_t i = 0; il->dxsend && i < il->lay.sends; i++)
        eng_p2p_req_release(&il->dxsend[i]);
    free(il->ysend);
    free(il->dxsend);
    free(il->arrived);
    if (p->be) {
        p->be->free(p->be, il->in);
        p->be->free(p->be, il->dx);
    }
    ch_il_layout_free(&il->lay);
    memset(il, 0, sizeof *il);
}

/* Message id's buffer, received first: the messages from peer up to it, in the peer's order,
 * each into the buffer the layout gave it. */
static int need(eng_pipeline_t *p, uint32_t peer, uint32_t id, float **buf)
{
    eng_pipe_il_t *il = &p->il;
    const ch_il_layout_t *l = &il->lay;
    uint32_t i = ch_il_peer_index(l, peer);
    int rc = 0;
    while (rc == 0 && !il->arrived[id]) {
        if (il->cur[i] >= l->nseq[i])
            return CH_E_STATE; /* the programs disagree: never */
        uint32_t got = l->seq[i][il->cur[i]++];
        float *dst = il->in + (size_t)l->recv[got] * p->count;
        rc = peer == (uint32_t)p->p2p.prev ? eng_p2p_recv_prev(&p->p2p, dst, p->count)
                                           : eng_p2p_recv_next(&p->p2p, dst, p->count);
        il->arrived[got] = rc == 0;
    }
    *buf = il->in + (size_t)l->recv[id] * p->count;
    return rc;
}

/* Send buf, what op (fwd, c, mb) sends, with request r (finished before: the layout proved
 * its last send received, so this never waits on a peer). */
static int il_send(eng_pipeline_t *p, int fwd, uint32_t c, uint32_t mb, const float *buf,
                   eng_p2p_req_t *r)
{
    uint32_t to, id;
    if (!ch_il_send(&p->il.lay.g, fwd, c, mb, &to, &id))
        return 0;
    return to == (uint32_t)p->p2p.next ? eng_p2p_send_next(&p->p2p, buf, p->count, r)
                                       : eng_p2p_send_prev(&p->p2p, buf, p->count, r);
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
            rc = need(p, (uint32_t)p->p2p.prev, ch_il_msg(g, 0, c, mb), &x);
        if (rc == 0) /* the slot's last output: received, its gradient came back */
            rc = eng_p2p_finish(&p->p2p, &il->ysend[slot]);
        if (rc == 0)
            rc = ops->chunk_forward(ops->ctx, c, mb, slot, x, last ? NULL : &y);
        if (rc == 0 && !last && !y)
            rc = -EINVAL;
        return rc == 0 && !last ? il_send(p, 1, c, mb, y, &il->ysend[slot]) : rc;
    }
    float *dy = NULL, *dx = NULL;
    eng_p2p_req_t *r = NULL;
    if (!last)
        rc = need(p, (uint32_t)p->p2p.next, ch_il_msg(g, 1, c, mb), &dy);
    if (!first) {
        dx = il->dx + (size_t)l->send[at] * p->count;
        r = &il->dxsend[l->send[at]];
        if (rc == 0)
            rc = eng_p2p_finish(&p->p2p, r);
    }
    if (rc == 0)
        rc = ops->chunk_backward(ops->ctx, c, mb, slot, dy, dx);
    return rc == 0 && dx ? il_send(p, 0, c, mb, dx, r) : rc;
}

int eng_pipeline_il_run(eng_pipeline_t *p, const eng_stage_ops_t *ops, uint32_t m)
{
    eng_pipe_il_t *il = &p->il;
    if (m != il->lay.g.m || !ops->chunk_forward || !ops->chunk_backward)
        return -EINVAL;
    memset(il->arrived, 0, 2 * (size_t)il->lay.g.chunks * m);
    il->cur[0] = il->cur[1] = 0;
    int rc = 0;
    for (uint32_t j = 0; rc == 0 && j < 2 * il->lay.g.total; j++)
        rc = run_op(p, ops, j);
    /* every send of the step is done before the step's gradients are used */
    return rc == 0 ? finish_all(p) : rc;
}
