/* Point-to-point between neighbouring pipeline stages (p2p.h). */
#include "workerd/engine/p2p.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/util.h"

void eng_p2p_init(eng_p2p_t *p, wrk_coll_group_t *pp, int32_t prev, int32_t next)
{
    p->pp = pp;
    p->prev = prev;
    p->next = next;
    p->wait_ns = 0;
    p->bf16 = 0;
    p->cap = 0;
    p->rpk = p->spk = NULL;
    p->be = NULL;
}

/* n bf16 elements of the column's collectives memory (the backend's kind) */
static int pk_alloc(const eng_p2p_t *p, size_t n, kn_bf16_t **out)
{
    void *q = NULL;
    int rc = wrk_coll_mem_alloc(wrk_coll_group_context(p->pp), (n ? n : 1) * sizeof(kn_bf16_t), &q);
    *out = q;
    return rc;
}

static void pk_free(wrk_coll_t *c, kn_bf16_t *pk)
{
    if (c && pk)
        wrk_coll_mem_free(c, pk);
}

int eng_p2p_set_bf16(eng_p2p_t *p, size_t n, const eng_backend_t *be)
{
    eng_p2p_fini(p);
    if (!p->pp)
        return 0;
    int rc = pk_alloc(p, n, &p->rpk);
    if (rc == 0)
        rc = pk_alloc(p, n, &p->spk);
    if (rc < 0) {
        eng_p2p_fini(p);
        return rc;
    }
    p->be = be;
    p->cap = n;
    p->bf16 = 1;
    return 0;
}

void eng_p2p_fini(eng_p2p_t *p)
{
    wrk_coll_t *c = p->pp ? wrk_coll_group_context(p->pp) : NULL;
    pk_free(c, p->rpk);
    pk_free(c, p->spk);
    p->rpk = p->spk = NULL;
    p->cap = 0;
    p->bf16 = 0;
}

void eng_p2p_req_release(eng_p2p_req_t *r)
{
    pk_free(r->c, r->pk);
    r->pk = NULL;
    r->c = NULL;
    r->cap = 0;
}

int eng_p2p_req_reserve(eng_p2p_t *p, eng_p2p_req_t *r)
{
    if (!p->bf16 || r->cap >= p->cap)
        return 0;
    eng_p2p_req_release(r);
    int rc = pk_alloc(p, p->cap, &r->pk);
    if (rc < 0)
        return rc;
    r->c = wrk_coll_group_context(p->pp);
    r->cap = p->cap;
    return 0;
}

static int send_to(eng_p2p_t *p, int32_t peer, const float *buf, size_t n, eng_p2p_req_t *r)
{
    r->req = NULL;
    if (!p->pp || peer < 0)
        return CH_E_STATE;
    if (!p->bf16 || n > p->cap)
        return wrk_coll_send(p->pp, buf, n, WRK_COLL_F32, (uint32_t)peer, &r->req);
    int rc = eng_p2p_req_reserve(p, r); /* the first send of this slot, unless reserved */
    if (rc < 0)
        return rc;
    rc = eng_bf16_cast(p->be, r->pk, buf, n, 1);
    return rc < 0 ? rc : wrk_coll_send(p->pp, r->pk, n, WRK_COLL_BF16, (uint32_t)peer, &r->req);
}

static int recv_from(eng_p2p_t *p, int32_t peer, float *buf, size_t n)
{
    if (!p->pp || peer < 0)
        return CH_E_STATE;
    int bf16 = p->bf16 && n <= p->cap;
    uint64_t t0 = ch_now_ns();
    wrk_coll_req_t *r = NULL; /* the kernels reading buf (or the cast) wait on the device */
    int rc =
        bf16 ? wrk_coll_ordered(wrk_coll_recv(p->pp, p->rpk, n, WRK_COLL_BF16, (uint32_t)peer, &r),
                                &r)
             : wrk_coll_ordered(wrk_coll_recv(p->pp, buf, n, WRK_COLL_F32, (uint32_t)peer, &r), &r);
    p->wait_ns += ch_now_ns() - t0;
    if (rc == 0 && bf16)
        rc = eng_bf16_cast(p->be, buf, p->rpk, n, 0);
    return rc;
}

static int exchange(eng_p2p_t *p, int32_t speer, const float *send, int32_t rpeer, float *recv,
                    size_t n)
{
    if (!p->pp || speer < 0 || rpeer < 0)
        return CH_E_STATE;
    int bf16 = p->bf16 && n <= p->cap;
    int rc = bf16 ? eng_bf16_cast(p->be, p->spk, send, n, 1) : 0;
    if (rc < 0)
        return rc;
    uint64_t t0 = ch_now_ns();
    /* the kernels reading recv (or the cast from the packed copy) wait on the device */
    wrk_coll_req_t *r = NULL;
    rc = bf16 ? wrk_coll_ordered(wrk_coll_sendrecv(p->pp, p->spk, n, (uint32_t)speer, p->rpk, n,
                                                   (uint32_t)rpeer, WRK_COLL_BF16, &r),
                                 &r)
              : wrk_coll_ordered(wrk_coll_sendrecv(p->pp, send, n, (uint32_t)speer, recv, n,
                                                   (uint32_t)rpeer, WRK_COLL_F32, &r),
                                 &r);
    p->wait_ns += ch_now_ns() - t0;
    if (rc == 0 && bf16)
        rc = eng_bf16_cast(p->be, recv, p->rpk, n, 0);
    return rc;
}

int eng_p2p_exchange_next(eng_p2p_t *p, const float *send, float *recv, size_t n)
{
    return exchange(p, p->next, send, p->next, recv, n);
}

int eng_p2p_exchange_prev(eng_p2p_t *p, const float *send, float *recv, size_t n)
{
    return exchange(p, p->prev, send, p->prev, recv, n);
}

int eng_p2p_sendrecv(eng_p2p_t *p, int32_t speer, const float *send, int32_t rpeer, float *recv,
                     size_t n)
{
    return exchange(p, speer, send, rpeer, recv, n);
}

int eng_p2p_send_next(eng_p2p_t *p, const float *buf, size_t n, eng_p2p_req_t *r)
{
    return send_to(p, p->next, buf, n, r);
}

int eng_p2p_send_prev(eng_p2p_t *p, const float *buf, size_t n, eng_p2p_req_t *r)
{
    return send_to(p, p->prev, buf, n, r);
}

int eng_p2p_recv_prev(eng_p2p_t *p, float *buf, size_t n)
{
    return recv_from(p, p->prev, buf, n);
}

int eng_p2p_recv_next(eng_p2p_t *p, float *buf, size_t n)
{
    return recv_from(p, p->next, buf, n);
}

int eng_p2p_sends_progress(const eng_p2p_t *p)
{
    const char *t = p->pp ? wrk_coll_group_transport(p->pp) : "";
    return strcmp(t, "ucx") == 0 || strcmp(t, "shm") == 0;
}

int eng_p2p_reap(eng_p2p_t *p, eng_p2p_req_t *r)
{
    int done = 1;
    int rc = r->req ? wrk_coll_test(r->req, &done) : 0;
    if (rc == 0 && done)
        rc = eng_p2p_finish(p, r);
    return rc < 0 ? rc : done;
}

int eng_p2p_finish(eng_p2p_t *p, eng_p2p_req_t *r)
{
    if (!r->req)
        return 0;
    uint64_t t0 = ch_now_ns();
    /* the slot's buffer (or a bf16 send's packed copy, in the collectives' memory) is written
     * again by later kernels or casts: they wait on the device for the send (on host memory,
     * where there is no stream, the host waits) */
    int rc = wrk_coll_wait_stream(r->req, -1);
    p->wait_ns += ch_now_ns() - t0;
    wrk_coll_req_free(r->req);
    r->req = NULL;
    return rc;
}
