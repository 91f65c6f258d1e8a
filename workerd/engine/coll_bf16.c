/* bf16 reductions through host packing (coll_bf16.h). */
#include "workerd/engine/coll_bf16.h"

#include <errno.h>
#include <stdlib.h>

static int reserve(eng_bf16_msg_t *m, size_t n)
{
    if (m->cap >= n)
        return 0;
    kn_bf16_t *pk = realloc(m->pk, (n ? n : 1) * sizeof *pk);
    if (!pk)
        return -ENOMEM;
    m->pk = pk;
    m->cap = n;
    return 0;
}

int eng_bf16_allreduce(wrk_coll_group_t *g, float *buf, size_t n, wrk_coll_redop_t op,
                       eng_bf16_msg_t *m)
{
    int rc = reserve(m, n);
    if (rc < 0)
        return rc;
    kn_bf16_pack(m->pk, buf, n);
    rc = wrk_coll_allreduce(g, m->pk, m->pk, n, WRK_COLL_BF16, op, NULL);
    if (rc == 0)
        kn_bf16_unpack(buf, m->pk, n);
    return rc;
}

int eng_bf16_reduce_scatter(wrk_coll_group_t *g, const float *full, float *part, size_t S,
                            eng_bf16_msg_t *m)
{
    size_t n = (size_t)wrk_coll_group_size(g) * S;
    kn_bf16_t *mine;
    int rc = reserve(m, n);
    if (rc < 0)
        return rc;
    kn_bf16_pack(m->pk, full, n);
    mine = m->pk + (size_t)wrk_coll_group_index(g) * S; /* in place: coll.h */
    rc = wrk_coll_reduce_scatter(g, m->pk, mine, S, WRK_COLL_BF16, WRK_COLL_SUM, NULL);
    if (rc == 0)
        kn_bf16_unpack(part, mine, S);
    return rc;
}

void eng_bf16_msg_free(eng_bf16_msg_t *m)
{
    free(m->pk);
    m->pk = NULL;
    m->cap = 0;
}
