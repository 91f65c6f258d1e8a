/* bf16 messages: casts and reductions (coll_bf16.h). */
#include "workerd/engine/coll_bf16.h"

#include <errno.h>
#include <stdlib.h>

int eng_bf16_castable(const eng_backend_t *be)
{
    return be->bf16_cast != NULL || be->host_memory;
}

int eng_bf16_cast(const eng_backend_t *be, void *dst, const void *src, size_t n, int to_bf16)
{
    if (be->bf16_cast)
        be->bf16_cast(be, dst, src, n, to_bf16);
    else if (!be->host_memory)
        return -ENOTSUP;
    else if (to_bf16)
        kn_bf16_pack(dst, src, n);
    else
        kn_bf16_unpack(dst, src, n);
    return 0;
}

void eng_bf16_msg_init(eng_bf16_msg_t *m, const eng_backend_t *be)
{
    m->be = be;
    m->c = NULL;
    m->pk = NULL;
    m->cap = 0;
}

int eng_bf16_msg_reserve(eng_bf16_msg_t *m, wrk_coll_group_t *g, size_t n)
{
    if (m->cap >= n && m->c == wrk_coll_group_context(g))
        return 0;
    eng_bf16_msg_free(m);
    void *p = NULL;
    int rc = wrk_coll_mem_alloc(wrk_coll_group_context(g), (n ? n : 1) * sizeof(kn_bf16_t), &p);
    if (rc < 0)
        return rc;
    m->c = wrk_coll_group_context(g);
    m->pk = p;
    m->cap = n;
    return 0;
}

int eng_bf16_allreduce(wrk_coll_group_t *g, float *buf, size_t n, wrk_coll_redop_t op,
                       eng_bf16_msg_t *m)
{
    wrk_coll_req_t *r = NULL; /* the cast back waits on the device (coll.h) */
    int rc = eng_bf16_msg_reserve(m, g, n);
    if (rc == 0)
        rc = eng_bf16_cast(m->be, m->pk, buf, n, 1);
    if (rc == 0)
        rc = wrk_coll_ordered(wrk_coll_allreduce(g, m->pk, m->pk, n, WRK_COLL_BF16, op, &r), &r);
    if (rc == 0)
        rc = eng_bf16_cast(m->be, buf, m->pk, n, 0);
    return rc;
}

int eng_bf16_reduce_scatter(wrk_coll_group_t *g, const float *full, float *part, size_t S,
                            eng_bf16_msg_t *m)
{
    size_t n = (size_t)wrk_coll_group_size(g) * S;
    int rc = eng_bf16_msg_reserve(m, g, n);
    if (rc < 0)
        return rc;
    kn_bf16_t *mine = m->pk + (size_t)wrk_coll_group_index(g) * S; /* in place: coll.h */
    wrk_coll_req_t *r = NULL; /* the cast back waits on the device (coll.h) */
    rc = eng_bf16_cast(m->be, m->pk, full, n, 1);
    if (rc == 0)
        rc = wrk_coll_ordered(
            wrk_coll_reduce_scatter(g, m->pk, mine, S, WRK_COLL_BF16, WRK_COLL_SUM, &r), &r);
    if (rc == 0)
        rc = eng_bf16_cast(m->be, part, mine, S, 0);
    return rc;
}

void eng_bf16_msg_free(eng_bf16_msg_t *m)
{
    if (m->c && m->pk)
        wrk_coll_mem_free(m->c, m->pk);
    m->c = NULL;
    m->pk = NULL;
    m->cap = 0;
}
