/* Point-to-point between neighbouring pipeline stages (DESIGN §5): activations go to the
 * next stage, their gradients come back to the previous one, over the pipeline column
 * (groups.h: pp, pp_prev, pp_next). Sends are non-blocking so they overlap the next
 * compute; a receive blocks, and the time spent blocked is counted as pipeline wait (what
 * the bubble is measured from). An exchange (a send paired with a receive from the same
 * neighbour) is one grouped operation: neither half can wait on the other's peer.
 *
 * Ordering: messages between two stages match in the order they were started (coll.h);
 * under 1F1B each direction of a pair carries one kind only (activations down, gradients
 * up), so the 1F1B order of each stage is enough to match them. The interleaved schedule's
 * ring carries both kinds both ways: its receiver pulls them in the sender's order
 * (pipeline.h). */
#ifndef ENG_P2P_H
#define ENG_P2P_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/bf16.h"
#include "workerd/coll/coll.h"
#include "workerd/engine/coll_bf16.h"

typedef struct eng_p2p {
    wrk_coll_group_t *pp; /* the pipeline column; borrowed */
    int32_t prev, next;   /* neighbours' indices in pp, -1 at the ends */
    uint64_t wait_ns;     /* time blocked in receives and in waits for sends */
    /* eng_p2p_set_bf16: messages move bf16 (2 bytes an element), through these buffers of
     * the collectives' memory, cap elements (the receive's and the exchange's send half),
     * cast by be (coll_bf16.h); 0: fp32 */
    int bf16;
    size_t cap;
    kn_bf16_t *rpk, *spk;
    const eng_backend_t *be;
} eng_p2p_t;

/* A send in flight: its buffer is borrowed until eng_p2p_finish. */
typedef struct eng_p2p_req {
    wrk_coll_req_t *req;
    kn_bf16_t *pk; /* bf16: the packed message, kept for the next send (eng_p2p_req_release) */
    wrk_coll_t *c; /* whose memory pk is */
    size_t cap;
} eng_p2p_req_t;

void eng_p2p_init(eng_p2p_t *p, wrk_coll_group_t *pp, int32_t prev, int32_t next);
/* Start sending n floats of buf to the next (eng_p2p_send_next) or previous stage. */
int eng_p2p_send_next(eng_p2p_t *p, const float *buf, size_t n, eng_p2p_req_t *r);
int eng_p2p_send_prev(eng_p2p_t *p, const float *buf, size_t n, eng_p2p_req_t *r);
/* Receive n floats from the previous / next stage into buf (blocking; counted as wait). */
int eng_p2p_recv_prev(eng_p2p_t *p, float *buf, size_t n);
int eng_p2p_recv_next(eng_p2p_t *p, float *buf, size_t n);
/* One grouped exchange with the next (previous) stage: send n floats of `send` to it and
 * receive n floats from it into `recv` (wrk_coll_sendrecv), blocking until both are done;
 * counted as wait. */
int eng_p2p_exchange_next(eng_p2p_t *p, const float *send, float *recv, size_t n);
int eng_p2p_exchange_prev(eng_p2p_t *p, const float *send, float *recv, size_t n);
/* The same with any two members of the column (indices in pp): send n floats of `send` to
 * speer and receive n floats from rpeer into `recv` (the interleaved ring's neighbours). */
int eng_p2p_sendrecv(eng_p2p_t *p, int32_t speer, const float *send, int32_t rpeer, float *recv,
                     size_t n);
/* Whether a send may be left in flight beside a receive (1) rather than grouped with it: the
 * host transports (UCX, shm) progress a send whatever the host waits on, so the receive alone
 * gates the compute that follows; NCCL (and its fakes) holds the stream on a send until the
 * peer's stream reaches the receive, so two neighbours each queueing a send before their
 * receive would wait on each other for ever (0: group them). */
int eng_p2p_sends_progress(const eng_p2p_t *p);
/* A send's request finished if it is done (no-op on an empty request), without blocking: 1
 * done (the request then empty), 0 still in flight, or an error. */
int eng_p2p_reap(eng_p2p_t *p, eng_p2p_req_t *r);
/* Complete a send (no-op on an empty request), counted as wait; frees the request. */
int eng_p2p_finish(eng_p2p_t *p, eng_p2p_req_t *r);
/* bf16: a request's packed buffer (the set_bf16 cap) allocated now, so that no send
 * allocates (0 or -ENOMEM; no-op without bf16 or when it has one). */
int eng_p2p_req_reserve(eng_p2p_t *p, eng_p2p_req_t *r);
/* A finished request's packed buffer freed (bf16); the request is then empty. */
void eng_p2p_req_release(eng_p2p_req_t *r);

/* train.precision = bf16 on a backend that casts (coll_bf16.h's eng_bf16_castable; be, the
 * buffers' backend, borrowed): every message of at most n floats is cast to bf16 in the
 * collectives' memory, moved as WRK_COLL_BF16 and widened on arrival. Exact only because a
 * bf16 run stores every activation and activation gradient rounded to bf16 (backend_bf16.h),
 * the values crossing a stage boundary included: the same bits as fp32 messages. Both
 * neighbours must agree (the same job). 0 or -ENOMEM (then fp32). */
int eng_p2p_set_bf16(eng_p2p_t *p, size_t n, const eng_backend_t *be);
/* Release set_bf16's buffers (the pipeline's fini). */
void eng_p2p_fini(eng_p2p_t *p);

#endif
