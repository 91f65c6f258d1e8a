/* The 1F1B schedule (pipeline.h). */
#include "workerd/engine/pipeline.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"

uint32_t eng_pipeline_slots(uint32_t stages, uint32_t stage, uint32_t m)
{
    uint32_t s = stages - stage;
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

int eng_pipeline_init(eng_pipeline_t *p, const eng_backend_t *be, wrk_coll_group_t *pp,
                      uint32_t stages, uint32_t stage, int32_t prev, int32_t next, uint32_t m,
                      size_t count)
{
    memset(p, 0, sizeof *p);
    if (stages == 0 || stage >= stages || m == 0 || count == 0)
        return -EINVAL;
    p->be = be ? be : eng_backend_cpu();
    p->stage = stage;
    p->stages = stages;
    p->slots = eng_pipeline_slots(stages, stage, m);
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
    for (uint32_t i = 0; p->ysend && i < p->slots; i++)
        eng_p2p_finish(&p->p2p, &p->ysend[i]);
    for (uint32_t i = 0; p->dxsend && i < p->slots; i++)
        eng_p2p_finish(&p->p2p, &p->dxsend[i]);
    free(p->ysend);
    free(p->dxsend);
    if (p->be) {
        p->be->free(p->be, p->x);
        p->be->free(p->be, p->dx);
        p->be->free(p->be, p->dy);
    }
    memset(p, 0, sizeof *p);
}

static int fwd(eng_pipeline_t *p, const eng_stage_ops_t *ops, uint32_t mb)
{
    uint32_t slot = mb % p->slots;
    float *x = p->x ? p->x + (size_t)slot * p->count : NULL;
    int send = p->stage + 1 < p->stages;
    const float *y = NULL;
    int rc = 0;
    if (x)
        rc = eng_p2p_recv_prev(&p->p2p, x, p->count);
    if (rc == 0 && send)
        rc = eng_p2p_finish(&p->p2p, &p->ysend[slot]); /* the slot's last send is done */
    if (rc == 0)
        rc = ops->forward(ops->ctx, mb, slot, x, send ? &y : NULL);
    if (rc == 0 && send)
        rc = y ? eng_p2p_send_next(&p->p2p, y, p->count, &p->ysend[slot]) : -EINVAL;
    return rc;
}

static int bwd(eng_pipeline_t *p, const eng_stage_ops_t *ops, uint32_t mb)
{
    uint32_t slot = mb % p->slots;
    float *dx = p->dx ? p->dx + (size_t)slot * p->count : NULL;
    int rc = 0;
    if (p->dy)
        rc = eng_p2p_recv_next(&p->p2p, p->dy, p->count);
    if (rc == 0 && dx)
        rc = eng_p2p_finish(&p->p2p, &p->dxsend[slot]);
    if (rc == 0)
        rc = ops->backward(ops->ctx, mb, slot, p->dy, dx);
    if (rc == 0 && dx)
        rc = eng_p2p_send_prev(&p->p2p, dx, p->count, &p->dxsend[slot]);
    return rc;
}

int eng_pipeline_run(eng_pipeline_t *p, const eng_stage_ops_t *ops, uint32_t m, uint64_t *wait_ns)
{
    if (m == 0 || !p->slots || eng_pipeline_slots(p->stages, p->stage, m) > p->slots)
        return -EINVAL;
    uint64_t w0 = p->p2p.wait_ns;
    uint32_t warm = p->stages - p->stage - 1;
    if (warm > m)
        warm = m;
    int rc = 0;
    for (uint32_t i = 0; rc == 0 && i < warm; i++)
        rc = fwd(p, ops, i);
    for (uint32_t i = 0; rc == 0 && i < m - warm; i++) {
        rc = fwd(p, ops, warm + i);
        if (rc == 0)
            rc = bwd(p, ops, i);
    }
    for (uint32_t i = m - warm; rc == 0 && i < m; i++)
        rc = bwd(p, ops, i);
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
