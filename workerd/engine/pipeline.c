/* The 1F1B and ZB-H1 schedules (pipeline.h); the interleaved one is pipeline_il.c. */
#include "workerd/engine/pipeline.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/util.h"
#include "workerd/engine/pipeline_il.h"

int eng_pipeline_splits(eng_pipe_schedule_t sched, uint32_t stage)
{
    return sched == ENG_PIPE_ZBH1 && stage > 0;
}

uint32_t eng_pipeline_slots(eng_pipe_schedule_t sched, uint32_t stages, uint32_t stage, uint32_t m)
{
    uint32_t s = sched == ENG_PIPE_ZBH1 ? stages : stages - stage;
    return s < m ? s : m;
}

/* n floats of p->be's memory, zeroed */
static float *zalloc(const eng_pipeline_t *p, size_t n)
{
    void *buf = NULL;
    if (p->be->alloc(p->be, n * sizeof(float), &buf) < 0)
        return NULL;
    if (p->be->memset(p->be, buf, 0, n * sizeof(float)) < 0) {
        p->be->free(p->be, buf);
        return NULL;
    }
    return buf;
}

int eng_pipeline_init(eng_pipeline_t *p, eng_pipe_schedule_t sched, const eng_backend_t *be,
                      wrk_coll_group_t *pp, uint32_t stages, uint32_t stage, int32_t prev,
                      int32_t next, uint32_t m, size_t count)
{
    memset(p, 0, sizeof *p);
    if (stages == 0 || stage >= stages || m == 0 || count == 0 ||
        (sched != ENG_PIPE_1F1B && sched != ENG_PIPE_ZBH1))
        return -EINVAL;
    p->be = be ? be : eng_backend_cpu();
    p->schedule = sched;
    p->stage = stage;
    p->stages = stages;
    p->slots = eng_pipeline_slots(sched, stages, stage, m);
    p->count = count;
    eng_p2p_init(&p->p2p, pp, prev, next);
    size_t n = (size_t)p->slots * count;
    int first = stage == 0, last = stage + 1 == stages;
    p->ysend = calloc(p->slots, sizeof *p->ysend);
    p->dxsend = calloc(p->slots, sizeof *p->dxsend);
    if (!first) {
        p->x = zalloc(p, n);
        p->dx = zalloc(p, n);
    }
    if (!last)
        p->dy = zalloc(p, count);
    if (!p->ysend || !p->dxsend || (!first && (!p->x || !p->dx)) || (!last && !p->dy)) {
        eng_pipeline_fini(p);
        return -ENOMEM;
    }
    return 0;
}

void eng_pipeline_fini(eng_pipeline_t *p)
{
    if (p->schedule == ENG_PIPE_INTERLEAVED)
        eng_pipeline_il_fini(p);
    for (uint32_t i = 0; p->ysend && i < p->slots; i++) {
        eng_p2p_finish(&p->p2p, &p->ysend[i]);
        eng_p2p_req_release(&p->ysend[i]);
    }
    for (uint32_t i = 0; p->dxsend && i < p->slots; i++) {
        eng_p2p_finish(&p->p2p, &p->dxsend[i]);
        eng_p2p_req_release(&p->dxsend[i]);
    }
    eng_p2p_fini(&p->p2p);
    free(p->ysend);
    free(p->dxsend);
    if (p->be) {
        p->be->free(p->be, p->x);
        p->be->free(p->be, p->dx);
        p->be->free(p->be, p->dy);
    }
    memset(p, 0, sizeof *p);
}

/* mb's slot of base (x, y or dx; NULL where the stage has none) */
static float *slot_of(const eng_pipeline_t *p, float *base, uint32_t mb)
{
    return base ? base + (size_t)(mb % p->slots) * p->count : NULL;
}

/* mb's input from the previous stage on its own (stage 0 has none) */
static int recv_x(eng_pipeline_t *p, uint32_t mb)
{
    float *x = slot_of(p, p->x, mb);
    return x ? eng_p2p_recv_prev(&p->p2p, x, p->count) : 0;
}

/* mb's forward; *y (y NULL on the last stage) the stage's output to send (pipeline.h) */
static int fwd(eng_pipeline_t *p, const eng_stage_ops_t *ops, uint32_t mb, const float **y)
{
    uint32_t slot = mb % p->slots;
    int rc = y ? eng_p2p_finish(&p->p2p, &p->ysend[slot]) : 0; /* the slot's last send */
    uint64_t t0 = ch_now_ns();
    if (rc == 0)
        rc = ops->forward(ops->ctx, mb, slot, slot_of(p, p->x, mb), y);
    p->op_ns[ENG_PIPE_OP_FWD] += ch_now_ns() - t0;
    return rc == 0 && y && !*y ? -EINVAL : rc;
}

static int bwd(eng_pipeline_t *p, const eng_stage_ops_t *ops, uint32_t mb)
{
    uint32_t slot = mb % p->slots;
    float *dx = slot_of(p, p->dx, mb);
    int rc = dx ? eng_p2p_finish(&p->p2p, &p->dxsend[slot]) : 0;
    uint64_t t0 = ch_now_ns();
    if (rc == 0)
        rc = ops->backward(ops->ctx, mb, slot, p->dy, dx);
    p->op_ns[ENG_PIPE_OP_BWD] += ch_now_ns() - t0;
    return rc;
}

/* After mb's forward: its output to the next stage, with (steady state) the gradient the
 * next stage sends back in the same exchange; alone, a non-blocking send (the last stage
 * has neither). */
static int after_fwd(eng_pipeline_t *p, uint32_t mb, const float *y, int recv_dy)
{
    if (!y)
        return 0;
    if (recv_dy)
        return eng_p2p_exchange_next(&p->p2p, y, p->dy, p->count);
    return eng_p2p_send_next(&p->p2p, y, p->count, &p->ysend[mb % p->slots]);
}

/* After mb's backward: its input gradient to the previous stage, with (steady state) the
 * input of micro-batch `next` in the same exchange; alone, a non-blocking send (stage 0 has
 * neither). */
static int after_bwd(eng_pipeline_t *p, uint32_t mb, int recv_x_next, uint32_t next)
{
    float *dx = slot_of(p, p->dx, mb);
    if (!dx)
        return 0;
    if (recv_x_next)
        return eng_p2p_exchange_prev(&p->p2p, dx, slot_of(p, p->x, next), p->count);
    return eng_p2p_send_prev(&p->p2p, dx, p->count, &p->dxsend[mb % p->slots]);
}

/* ZB-H1: mb's weight pass */
static int weight(eng_pipeline_t *p, const eng_stage_ops_t *ops, uint32_t mb)
{
    uint64_t t0 = ch_now_ns();
    int rc = ops->weight(ops->ctx, mb, mb % p->slots);
    p->op_ns[ENG_PIPE_OP_WEIGHT] += ch_now_ns() - t0;
    return rc;
}

/* ZB-H1: the weight passes due once `done` backwards have run, keeping up to the stage's
 * index pending (pipeline.h); *w the next micro-batch whose W has not run. */
static int weights_due(eng_pipeline_t *p, const eng_stage_ops_t *ops, uint32_t done, uint32_t *w)
{
    int rc = 0, split = eng_pipeline_splits(p->schedule, p->stage);
    while (rc == 0 && split && *w + p->stage < done) {
        rc = weight(p, ops, *w);
        ++*w;
    }
    return rc;
}

/* The steady state: each forward's send pairs with the receive of the gradient the
 * backward that follows needs, and each backward's send with the receive of the next
 * forward's input (Megatron's send_forward_recv_backward and send_backward_recv_forward),
 * so neighbouring stages always exchange in matching pairs. ZB-H1 sends the input gradient
 * alone (non-blocking), runs the weight pass due, then receives the next input: the slot
 * it lands in was freed by that weight pass. */
static int steady(eng_pipeline_t *p, const eng_stage_ops_t *ops, uint32_t warm, uint32_t n,
                  uint32_t *w)
{
    int send = p->stage + 1 < p->stages, zb = eng_pipeline_splits(p->schedule, p->stage);
    int rc = n ? recv_x(p, warm) : 0;
    for (uint32_t i = 0; rc == 0 && i < n; i++) {
        const float *y = NULL;
        rc = fwd(p, ops, warm + i, send ? &y : NULL);
        if (rc == 0)
            rc = after_fwd(p, warm + i, y, 1);
        if (rc == 0)
            rc = bwd(p, ops, i);
        if (rc == 0)
            rc = after_bwd(p, i, !zb && i + 1 < n, warm + i + 1);
        if (rc == 0)
            rc = weights_due(p, ops, i + 1, w);
        if (rc == 0 && zb && i + 1 < n)
            rc = recv_x(p, warm + i + 1);
    }
    return rc;
}

int eng_pipeline_run(eng_pipeline_t *p, const eng_stage_ops_t *ops, uint32_t m, uint64_t *wait_ns)
{
    if (p->schedule == ENG_PIPE_INTERLEAVED) {
        uint64_t i0 = p->p2p.wait_ns;
        int rc = eng_pipeline_il_run(p, ops, m);
        if (wait_ns)
            *wait_ns = p->p2p.wait_ns - i0;
        return rc;
    }
    if (m == 0 || !p->slots || eng_pipeline_slots(p->schedule, p->stages, p->stage, m) > p->slots ||
        (eng_pipeline_splits(p->schedule, p->stage) && !ops->weight))
        return -EINVAL;
    uint64_t w0 = p->p2p.wait_ns;
    uint32_t warm = p->stages - p->stage - 1, w = 0;
    if (warm > m)
        warm = m;
    int rc = 0, send = p->stage + 1 < p->stages;
    for (uint32_t i = 0; rc == 0 && i < warm; i++) {
        rc = recv_x(p, i);
        const float *y = NULL;
        if (rc == 0)
            rc = fwd(p, ops, i, send ? &y : NULL);
        if (rc == 0)
            rc = after_fwd(p, i, y, 0);
    }
    if (rc == 0)
        rc = steady(p, ops, warm, m - warm, &w);
    for (uint32_t i = m - warm; rc == 0 && i < m; i++) {
        rc = p->dy ? eng_p2p_recv_next(&p->p2p, p->dy, p->count) : 0;
        if (rc == 0)
            rc = bwd(p, ops, i);
        if (rc == 0)
            rc = after_bwd(p, i, 0, 0);
        if (rc == 0)
            rc = weights_due(p, ops, i + 1, &w);
    }
    /* ZB-H1: the weight passes still pending fill the end of the step */
    for (; rc == 0 && eng_pipeline_splits(p->schedule, p->stage) && w < m; w++)
        rc = weight(p, ops, w);
    /* every send of the step is done before the step's gradients are used */
    for (uint32_t i = 0; rc == 0 && i < p->slots; i++) {
        rc = eng_p2p_finish(&p->p2p, &p->ysend[i]);
        if (rc == 0)
            rc = eng_p2p_finish(&p->p2p, &p->dxsend[i]);
    }
    if (wait_ns)
        *wait_ns = p->p2p.wait_ns - w0;
    return rc;
}
