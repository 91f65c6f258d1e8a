/* Inside the UCX backend (coll.h): what coll_ucx.c (context, endpoints, messages,
 * operations, same-host setup) and coll_ucx_algo.c (the algorithms) share. Nothing else
 * includes this header.
 *
 * An operation (ucx_op_t) runs one of three engines: "rounds", a short list of exchanges
 * done one after another; "pipe", a ring or chain cut into segments with up to CH_UCX_WINDOW in
 * flight each way; or the same-host shared segment (coll_shm.h). wrk_ucx_build picks and
 * sets up the first two; the advance functions move them as far as the messages allow. */
#ifndef WRK_COLL_UCX_H
#define WRK_COLL_UCX_H

#include <stddef.h>
#include <stdint.h>

#include <ucp/api/ucp.h>

#include "workerd/coll/coll_impl.h"
#include "workerd/coll/coll_shm.h"

#define CH_UCX_WINDOW             4            /* segments in flight per direction */
#define CH_UCX_SEG_BYTES          (512u << 10) /* pipe segment */
#define CH_UCX_RD_MAX_BYTES       (64u << 10)  /* allreduce: recursive doubling up to this size */
#define CH_UCX_BINOMIAL_MAX_BYTES (64u << 10)  /* broadcast: binomial tree up to this size */

/* Tags: group id | sender's world rank | low 32 bits, which are (collective sequence number,
 * unit) or (CH_UCX_TAG_P2P, per-pair count). */
#define CH_UCX_TAG_UNIT_BITS 19
#define CH_UCX_TAG_P2P       (1ull << 31)
#define CH_UCX_MAX_UNITS     (1u << CH_UCX_TAG_UNIT_BITS)

typedef struct ucx_ctx ucx_ctx_t;

typedef struct round {
    int64_t speer, rpeer; /* group indices, -1: none */
    uint32_t sunit, runit;
    const void *sbuf;
    void *rbuf;
    size_t sbytes, rbytes;
    int reduce; /* acc = acc op rbuf */
} round_t;

typedef enum { PIPE_ALLREDUCE, PIPE_REDUCE_SCATTER, PIPE_ALLGATHER, PIPE_BROADCAST } pipe_kind_t;

typedef struct pipe {
    pipe_kind_t kind;
    uint32_t n, me, speer, rpeer;
    int has_send, has_recv;
    size_t esz, count, seg, nseg, nsteps, nunits, lag;
    const char *sbuf;
    char *rbuf, *stage, *acc[2];
    size_t rposted, rdone, sposted, sdone;
    void *rreq[CH_UCX_WINDOW], *sreq[CH_UCX_WINDOW];
} pipe_t;

typedef struct ucx_op {
    wrk_coll_req_t *r;
    struct ucx_op *prev, *next; /* active list */
    int rc;                     /* 1 pending, 0 done, < 0 failed */
    int is_pipe, is_shm;
    uint32_t seq;
    /* rounds */
    round_t *rounds;
    size_t nrounds, cur;
    int posted;
    void *sreq, *rreq;
    float *acc;
    /* pipe */
    pipe_t p;
    /* same-host shared memory (coll_shm.h) */
    wrk_shm_op_t shm;
    void *scratch;
    size_t scratch_cap;
} ucx_op_t;

/* coll_ucx.c: messages of operation o to and from group member `peer`, tagged low. */
int wrk_ucx_post_send(ucx_op_t *o, uint32_t peer, const void *buf, size_t len, uint32_t low,
                      void **req);
int wrk_ucx_post_recv(ucx_op_t *o, uint32_t peer, void *buf, size_t len, uint32_t low, void **req);
/* 0 finished (request released), 1 in flight, < 0 failed (released). */
int wrk_ucx_req_poll(void **req, size_t expect_len, int is_recv);
/* The low tag bits of unit `unit` of collective number seq. */
uint32_t wrk_ucx_coll_low(uint32_t seq, uint32_t unit);
/* A pooled buffer of at least len bytes; *cap: its size (back with the operation). */
void *wrk_ucx_scratch_get(ucx_ctx_t *u, size_t len, size_t *cap);

/* coll_ucx_algo.c: set up the rounds or pipe engine for o (o->r->g, o->r->a given). */
int wrk_ucx_build(ucx_ctx_t *u, ucx_op_t *o);
/* Advance as far as the messages allow: 0 done, 1 pending, < 0 failed. */
int wrk_ucx_rounds_advance(ucx_op_t *o);
int wrk_ucx_pipe_advance(ucx_op_t *o);

#endif
