/* The UCX backend's algorithms (coll_ucx.h): the rounds engine (recursive doubling
 * allreduce, binomial broadcast, dissemination barrier, p2p) for small messages and the pipe
 * engine (ring reduce-scatter / allgather / allreduce, chain broadcast) for large ones, and
 * the choice between them. Fixed reduction order: in the ring each block is accumulated
 * along the ring starting at a fixed member, then copied to the others; in recursive
 * doubling both partners add the same two values. */
#include "workerd/coll/coll_ucx.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"

// ----------------------------------------------------------------------------
// rounds engine

int wrk_ucx_rounds_advance(ucx_op_t *o)
{
    wrk_coll_redop_t op = o->r->a.op;
    while (o->cur < o->nrounds) {
        round_t *rd = &o->rounds[o->cur];
        int rc;
        if (!o->posted) {
            o->posted = 1;
            if (rd->rpeer >= 0) {
                rc = wrk_ucx_post_recv(o, (uint32_t)rd->rpeer, rd->rbuf, rd->rbytes, rd->runit,
                                       &o->rreq);
                if (rc < 0)
                    return rc;
            }
            if (rd->speer >= 0) {
                rc = wrk_ucx_post_send(o, (uint32_t)rd->speer, rd->sbuf, rd->sbytes, rd->sunit,
                                       &o->sreq);
                if (rc < 0)
                    return rc;
            }
        }
        int rs = wrk_ucx_req_poll(&o->sreq, 0, 0);
        int rr = wrk_ucx_req_poll(&o->rreq, rd->rbytes, 1);
        if (rs < 0 || rr < 0)
            return rs < 0 ? rs : rr;
        if (rs || rr)
            return 1;
        if (rd->reduce)
            wrk_coll_reduce(op, o->r->a.dt, o->acc, rd->rbuf, o->acc,
                            rd->rbytes / wrk_coll_dtype_size(o->r->a.dt));
        o->cur++;
        o->posted = 0;
    }
    return 0;
}

static round_t *add_round(ucx_op_t *o)
{
    round_t *rd = &o->rounds[o->nrounds++];
    memset(rd, 0, sizeof *rd);
    rd->speer = rd->rpeer = -1;
    return rd;
}

static int log2_ceil(uint32_t n)
{
    int k = 0;
    while ((1u << k) < n)
        k++;
    return k;
}

/* Recursive doubling on acc (= recvbuf) with tmp of the same size. Groups that are not a
 * power of two first fold their first 2*rem members pairwise (even into odd) and unfold at
 * the end (odd back to even). */
static void build_rd_allreduce(ucx_op_t *o, float *acc, float *tmp, size_t bytes)
{
    uint32_t n = o->r->g->n, me = o->r->g->me;
    uint32_t p = 1;
    while (p * 2 <= n)
        p *= 2;
    uint32_t rem = n - p, s = o->seq;
    int64_t newidx;
    o->acc = acc;
    if (me < 2 * rem && me % 2 == 0) {
        round_t *rd = add_round(o);
        rd->speer = me + 1, rd->sbuf = acc, rd->sbytes = bytes, rd->sunit = wrk_ucx_coll_low(s, 0);
        newidx = -1;
    } else if (me < 2 * rem) {
        round_t *rd = add_round(o);
        rd->rpeer = me - 1, rd->rbuf = tmp, rd->rbytes = bytes, rd->runit = wrk_ucx_coll_low(s, 0);
        rd->reduce = 1;
        newidx = me / 2;
    } else {
        newidx = me - rem;
    }
    if (newidx >= 0) {
        for (uint32_t mask = 1, k = 1; mask < p; mask <<= 1, k++) {
            uint32_t pn = (uint32_t)newidx ^ mask;
            uint32_t partner = pn < rem ? pn * 2 + 1 : pn + rem;
            round_t *rd = add_round(o);
            rd->speer = rd->rpeer = partner;
            rd->sbuf = acc, rd->rbuf = tmp, rd->sbytes = rd->rbytes = bytes;
            rd->sunit = rd->runit = wrk_ucx_coll_low(s, k);
            rd->reduce = 1;
        }
    }
    if (me < 2 * rem) {
        round_t *rd = add_round(o);
        if (me % 2 == 0)
            rd->rpeer = me + 1, rd->rbuf = acc, rd->rbytes = bytes,
            rd->runit = wrk_ucx_coll_low(s, 64);
        else
            rd->speer = me - 1, rd->sbuf = acc, rd->sbytes = bytes,
            rd->sunit = wrk_ucx_coll_low(s, 64);
    }
}

/* Binomial tree from root; a message's unit is the receiver's position relative to root. */
static void build_binomial_bcast(ucx_op_t *o, void *buf, size_t bytes, uint32_t root)
{
    uint32_t n = o->r->g->n, me = o->r->g->me;
    uint32_t v = (me + n - root) % n, mask = 1;
    while (mask < n) {
        if (v & mask) {
            round_t *rd = add_round(o);
            rd->rpeer = (v - mask + root) % n, rd->rbuf = buf, rd->rbytes = bytes;
            rd->runit = wrk_ucx_coll_low(o->seq, v);
            break;
        }
        mask <<= 1;
    }
    for (mask >>= 1; mask > 0; mask >>= 1)
        if (v + mask < n) {
            round_t *rd = add_round(o);
            rd->speer = (v + mask + root) % n, rd->sbuf = buf, rd->sbytes = bytes;
            rd->sunit = wrk_ucx_coll_low(o->seq, v + mask);
        }
}

static void build_barrier(ucx_op_t *o)
{
    uint32_t n = o->r->g->n, me = o->r->g->me;
    for (uint32_t d = 1, k = 0; d < n; d <<= 1, k++) {
        round_t *rd = add_round(o);
        rd->speer = (me + d) % n, rd->rpeer = (me + n - d) % n;
        rd->sunit = rd->runit = wrk_ucx_coll_low(o->seq, k);
    }
}

// ----------------------------------------------------------------------------
// pipe engine: ring reduce-scatter / allgather / allreduce, chain broadcast
//
// Unit u = step * nseg + segment. Receives and sends are posted in unit order, at most
// CH_UCX_WINDOW ahead of the oldest unfinished one. A send of step s > 0 forwards what the
// previous step received, so it waits for that unit (lag = nseg; chain: lag = 0).

static size_t umod(int64_t x, uint32_t n)
{
    return (size_t)(((x % (int64_t)n) + n) % n);
}

/* Block b of the buffer, in elements. */
static void blk(const pipe_t *p, size_t b, size_t *off, size_t *len)
{
    if (p->kind == PIPE_ALLREDUCE) {
        size_t q = p->count / p->n, rem = p->count % p->n;
        *len = q + (b < rem);
        *off = b * q + (b < rem ? b : rem);
    } else if (p->kind == PIPE_BROADCAST) {
        *off = 0, *len = p->count;
    } else {
        *off = b * p->count, *len = p->count;
    }
}

/* Segment of unit u within a block of blen elements: [*soff, *soff + *slen). */
static void seg_of(const pipe_t *p, size_t u, size_t blen, size_t *soff, size_t *slen)
{
    size_t c = u % p->nseg, lo = c * p->seg;
    *soff = lo < blen ? lo : blen;
    *slen = (lo + p->seg < blen ? lo + p->seg : blen) - *soff;
}

static void unit_send(const pipe_t *p, size_t u, const char **src, size_t *len)
{
    int64_t s = (int64_t)(u / p->nseg), me = p->me;
    size_t b, off, blen, soff, e = p->esz;
    const char *base;
    switch (p->kind) {
    case PIPE_ALLREDUCE:
        b = s < (int64_t)p->n - 1 ? umod(me - s, p->n) : umod(me + 1 - (s - (p->n - 1)), p->n);
        base = s == 0 ? p->sbuf : p->rbuf;
        blk(p, b, &off, &blen);
        base += off * e;
        break;
    case PIPE_REDUCE_SCATTER:
        b = umod(me - s - 1, p->n);
        blk(p, b, &off, &blen);
        base = s == 0 ? p->sbuf + off * e : p->acc[(s - 1) % 2];
        break;
    case PIPE_ALLGATHER:
        b = umod(me - s, p->n);
        blk(p, b, &off, &blen);
        base = s == 0 ? p->sbuf : p->rbuf + off * e;
        break;
    default:
        blk(p, 0, &off, &blen);
        base = p->rbuf;
        break;
    }
    seg_of(p, u, blen, &soff, len);
    *src = base + soff * e;
    *len *= e;
}

/* Where unit u lands. staged: it is received into the stage slot and then reduced:
 * *out = stage op *own. */
static void unit_recv(const pipe_t *p, size_t u, char **dst, size_t *len, char **out,
                      const char **own)
{
    int64_t s = (int64_t)(u / p->nseg), me = p->me;
    size_t b, off, blen, soff, e = p->esz;
    char *stage = p->stage + (u % CH_UCX_WINDOW) * p->seg * e;
    *out = NULL, *own = NULL;
    switch (p->kind) {
    case PIPE_ALLREDUCE:
        if (s < (int64_t)p->n - 1) {
            b = umod(me - s - 1, p->n);
            blk(p, b, &off, &blen);
            seg_of(p, u, blen, &soff, len);
            *dst = stage;
            *out = p->rbuf + (off + soff) * e;
            *own = p->sbuf + (off + soff) * e;
        } else {
            b = umod(me - (s - (p->n - 1)), p->n);
            blk(p, b, &off, &blen);
            seg_of(p, u, blen, &soff, len);
            *dst = p->rbuf + (off + soff) * e;
        }
        break;
    case PIPE_REDUCE_SCATTER:
        b = umod(me - s - 2, p->n);
        blk(p, b, &off, &blen);
        seg_of(p, u, blen, &soff, len);
        *dst = stage;
        *out = (s == (int64_t)p->n - 2 ? p->rbuf : p->acc[s % 2]) + soff * e;
        *own = p->sbuf + (off + soff) * e;
        break;
    case PIPE_ALLGATHER:
        b = umod(me - s - 1, p->n);
        blk(p, b, &off, &blen);
        seg_of(p, u, blen, &soff, len);
        *dst = p->rbuf + (off + soff) * e;
        break;
    default:
        blk(p, 0, &off, &blen);
        seg_of(p, u, blen, &soff, len);
        *dst = p->rbuf + soff * e;
        break;
    }
    *len *= e;
}

int wrk_ucx_pipe_advance(ucx_op_t *o)
{
    pipe_t *p = &o->p;
    wrk_coll_redop_t op = o->r->a.op;
    for (int moved = 1; moved;) {
        moved = 0;
        while (p->rdone < p->rposted) {
            size_t u = p->rdone, len;
            char *dst, *out;
            const char *own;
            unit_recv(p, u, &dst, &len, &out, &own);
            /* reduce-scatter accumulates in two alternating blocks: the one this unit
             * overwrites must have been sent on (unit u - nseg) first. */
            if (p->kind == PIPE_REDUCE_SCATTER && out != NULL && u >= 2 * p->nseg &&
                (size_t)(u / p->nseg) < p->n - 2 && p->sdone <= u - p->nseg)
                break;
            int rc = wrk_ucx_req_poll(&p->rreq[u % CH_UCX_WINDOW], len, 1);
            if (rc < 0)
                return rc;
            if (rc)
                break;
            if (out)
                wrk_coll_reduce(op, o->r->a.dt, out, dst, own, len / p->esz);
            p->rdone++;
            moved = 1;
        }
        while (p->sdone < p->sposted) {
            int rc = wrk_ucx_req_poll(&p->sreq[p->sdone % CH_UCX_WINDOW], 0, 0);
            if (rc < 0)
                return rc;
            if (rc)
                break;
            p->sdone++;
            moved = 1;
        }
        while (p->has_recv && p->rposted < p->nunits && p->rposted - p->rdone < CH_UCX_WINDOW) {
            size_t u = p->rposted, len;
            char *dst, *out;
            const char *own;
            unit_recv(p, u, &dst, &len, &out, &own);
            int rc = wrk_ucx_post_recv(o, p->rpeer, dst, len, wrk_ucx_coll_low(o->seq, (uint32_t)u),
                                       &p->rreq[u % CH_UCX_WINDOW]);
            if (rc < 0)
                return rc;
            p->rposted++;
            moved = 1;
        }
        while (p->has_send && p->sposted < p->nunits && p->sposted - p->sdone < CH_UCX_WINDOW) {
            size_t u = p->sposted, len;
            if (p->has_recv && u >= p->lag && p->rdone <= u - p->lag)
                break;
            const char *src;
            unit_send(p, u, &src, &len);
            int rc = wrk_ucx_post_send(o, p->speer, src, len, wrk_ucx_coll_low(o->seq, (uint32_t)u),
                                       &p->sreq[u % CH_UCX_WINDOW]);
            if (rc < 0)
                return rc;
            p->sposted++;
            moved = 1;
        }
    }
    int done = (!p->has_recv || p->rdone == p->nunits) && (!p->has_send || p->sdone == p->nunits);
    return done ? 0 : 1;
}

/* Geometry of a pipe over blocks of at most maxblk elements and nsteps steps. */
static int pipe_setup(ucx_ctx_t *u, ucx_op_t *o, size_t maxblk, size_t nsteps, int staged, int accs)
{
    pipe_t *p = &o->p;
    size_t e = p->esz;
    if (nsteps >= CH_UCX_MAX_UNITS)
        return -E2BIG;
    p->nsteps = nsteps;
    p->seg = CH_UCX_SEG_BYTES / e;
    size_t max_seg = CH_UCX_MAX_UNITS / nsteps;
    if (maxblk / p->seg + 1 > max_seg)
        p->seg = maxblk / max_seg + 1;
    p->nseg = maxblk ? (maxblk + p->seg - 1) / p->seg : 1;
    p->nunits = p->nseg * nsteps;
    p->lag = p->kind == PIPE_BROADCAST ? 0 : p->nseg;
    size_t stage_len = staged ? CH_UCX_WINDOW * p->seg * e : 0;
    size_t len = stage_len + (size_t)accs * maxblk * e;
    if (len) {
        o->scratch = wrk_ucx_scratch_get(u, len, &o->scratch_cap);
        if (!o->scratch)
            return -ENOMEM;
        p->stage = o->scratch;
        for (int i = 0; i < accs; i++)
            p->acc[i] = (char *)o->scratch + stage_len + (size_t)i * maxblk * e;
    }
    return 0;
}

// ----------------------------------------------------------------------------
// starting an operation

static int start_rounds(ucx_op_t *o, size_t max_rounds)
{
    o->rounds = calloc(max_rounds, sizeof *o->rounds);
    return o->rounds ? 0 : -ENOMEM;
}

int wrk_ucx_build(ucx_ctx_t *u, ucx_op_t *o)
{
    const wrk_coll_args_t *a = &o->r->a;
    wrk_coll_group_t *g = o->r->g;
    uint32_t n = g->n, me = g->me;
    size_t e = wrk_coll_dtype_size(a->dt), bytes = a->count * e;
    pipe_t *p = &o->p;
    int rc;
    p->n = n, p->me = me, p->esz = e, p->count = a->count;
    p->sbuf = a->sendbuf, p->rbuf = a->recvbuf;
    p->speer = (me + 1) % n, p->rpeer = (me + n - 1) % n;
    p->has_send = p->has_recv = 1;
    if (g->be && wrk_shm_supports(a)) {
        o->is_shm = 1;
        wrk_shm_op_init(g->be, &o->shm, a);
        return 0;
    }

    switch (a->kind) {
    case WRK_COLL_OP_SEND:
    case WRK_COLL_OP_RECV: {
        if ((rc = start_rounds(o, 1)) < 0)
            return rc;
        round_t *rd = add_round(o);
        uint32_t peer = a->peer;
        if (a->kind == WRK_COLL_OP_SEND) {
            rd->speer = peer, rd->sbuf = a->sendbuf, rd->sbytes = bytes;
            rd->sunit = (uint32_t)(CH_UCX_TAG_P2P | (g->p2p_sent[peer]++ & 0x7fffffffu));
        } else {
            rd->rpeer = peer, rd->rbuf = a->recvbuf, rd->rbytes = bytes;
            rd->runit = (uint32_t)(CH_UCX_TAG_P2P | (g->p2p_recvd[peer]++ & 0x7fffffffu));
        }
        return 0;
    }
    case WRK_COLL_OP_BARRIER:
        if ((rc = start_rounds(o, (size_t)log2_ceil(n) + 1)) < 0)
            return rc;
        build_barrier(o);
        return 0;
    case WRK_COLL_OP_BROADCAST:
        if (bytes <= CH_UCX_BINOMIAL_MAX_BYTES) {
            if ((rc = start_rounds(o, (size_t)log2_ceil(n) + 1)) < 0)
                return rc;
            build_binomial_bcast(o, a->recvbuf, bytes, a->peer);
            return 0;
        }
        o->is_pipe = 1;
        p->kind = PIPE_BROADCAST;
        uint32_t v = (me + n - a->peer) % n;
        p->has_recv = v != 0, p->has_send = v != n - 1;
        p->esz = 1, p->count = bytes;
        return pipe_setup(u, o, bytes, 1, 0, 0);
    case WRK_COLL_OP_ALLREDUCE:
        if (bytes <= CH_UCX_RD_MAX_BYTES || a->count < n) {
            if (a->sendbuf != a->recvbuf)
                memcpy(a->recvbuf, a->sendbuf, bytes);
            if ((rc = start_rounds(o, (size_t)log2_ceil(n) + 2)) < 0)
                return rc;
            if (!(o->scratch = wrk_ucx_scratch_get(u, bytes, &o->scratch_cap)))
                return -ENOMEM;
            build_rd_allreduce(o, a->recvbuf, o->scratch, bytes);
            return 0;
        }
        o->is_pipe = 1;
        p->kind = PIPE_ALLREDUCE;
        return pipe_setup(u, o, (a->count + n - 1) / n, 2 * (size_t)(n - 1), 1, 0);
    case WRK_COLL_OP_REDUCE_SCATTER:
        o->is_pipe = 1;
        p->kind = PIPE_REDUCE_SCATTER;
        return pipe_setup(u, o, a->count, n - 1, 1, n > 3 ? 2 : n > 2 ? 1 : 0);
    case WRK_COLL_OP_ALLGATHER:
        if ((const char *)a->sendbuf != (char *)a->recvbuf + (size_t)me * bytes)
            memcpy((char *)a->recvbuf + (size_t)me * bytes, a->sendbuf, bytes);
        o->is_pipe = 1;
        p->kind = PIPE_ALLGATHER;
        return pipe_setup(u, o, a->count, n - 1, 0, 0);
    case WRK_COLL_OP_SENDRECV: /* the front end starts its two halves (coll_front.c) */
        break;
    }
    return -EINVAL;
}
