/* Point-to-point between neighbouring pipeline stages (p2p.h). */
#include "workerd/engine/p2p.h"

#include <errno.h>
#include <stdlib.h>

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
}

int eng_p2p_set_bf16(eng_p2p_t *p, size_t n)
{
    eng_p2p_fini(p);
    p->rpk = malloc((n ? n : 1) * sizeof *p->rpk);
    p->spk = malloc((n ? n : 1) * sizeof *p->spk);
    if (!p->rpk || !p->spk) {
        eng_p2p_fini(p);
        return -ENOMEM;
    }
    p->cap = n;
    p->bf16 = 1;
    return 0;
}

void eng_p2p_fini(eng_p2p_t *p)
{
    free(p->rpk);
    free(p->spk);
    p->rpk = p->spk = NULL;
    p->cap = 0;
    p->bf16 = 0;
}

void eng_p2p_req_release(eng_p2p_req_t *r)
{
    free(r->pk);
    r->pk = NULL;
    r->cap = 0;
}

static int send_to(eng_p2p_t *p, int32_t peer, const float *buf, size_t n, eng_p2p_req_t *r)
{
    r->req = NULL;
    if (!p->pp || peer < 0)
        return CH_E_STATE;
    if (!p->bf16 || n > p->cap)
        return wrk_coll_send(p->pp, buf, n, WRK_COLL_F32, (uint32_t)peer, &r->req);
    if (r->cap < n) { /* the first send of this slot */
        kn_bf16_t *pk = realloc(r->pk, n * sizeof *pk);
        if (!pk)
            return -ENOMEM;
        r->pk = pk;
        r->cap = n;
    }
    kn_bf16_pack(r->pk, buf, n);
    return wrk_coll_send(p->pp, r->pk, n, WRK_COLL_BF16, (uint32_t)peer, &r->req);
}

static int recv_from(eng_p2p_t *p, int32_t peer, float *buf, size_t n)
{
    if (!p->pp || peer < 0)
        return CH_E_STATE;
    int bf16 = p->bf16 && n <= p->cap;
    uint64_t t0 = ch_now_ns();
    int rc = bf16 ? wrk_coll_recv(p->pp, p->rpk, n, WRK_COLL_BF16, (uint32_t)peer, NULL)
                  : wrk_coll_recv(p->pp, buf, n, WRK_COLL_F32, (uint32_t)peer, NULL);
    p->wait_ns += ch_now_ns() - t0;
    if (rc == 0 && bf16)
        kn_bf16_unpack(buf, p->rpk, n);
    return rc;
}

static int exchange(eng_p2p_t *p, int32_t speer, const float *send, int32_t rpeer, float *recv,
                    size_t n)
{
    if (!p->pp || speer < 0 || rpeer < 0)
        return CH_E_STATE;
    int bf16 = p->bf16 && n <= p->cap;
    if (bf16)
        kn_bf16_pack(p->spk, send, n);
    uint64_t t0 = ch_now_ns();
    int rc = bf16 ? wrk_coll_sendrecv(p->pp, p->spk, n, (uint32_t)speer, p->rpk, n, (uint32_t)rpeer,
                                      WRK_COLL_BF16, NULL)
                  : wrk_coll_sendrecv(p->pp, send, n, (uint32_t)speer, recv, n, (uint32_t)rpeer,
                                      WRK_COLL_F32, NULL);
    p->wait_ns += ch_now_ns() - t0;
    if (rc == 0 && bf16)
        kn_bf16_unpack(recv, p->rpk, n);
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

int eng_p2p_finish(eng_p2p_t *p, eng_p2p_req_t *r)
{
    if (!r->req)
        return 0;
    uint64_t t0 = ch_now_ns();
    int rc = wrk_coll_wait(r->req, -1);
    p->wait_ns += ch_now_ns() - t0;
    wrk_coll_req_free(r->req);
    r->req = NULL;
    return rc;
}
