/* Inside the collectives (coll.h): the backend table and the structs behind the public
 * handles, shared by coll.c (validation, groups, requests, the wait loop, the abort state)
 * and the backends that move data (coll_ucx.c, coll_nccl.c). Nothing outside
 * workerd/coll/ includes this header. */
#ifndef WRK_COLL_IMPL_H
#define WRK_COLL_IMPL_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "chorus/config.h"
#include "workerd/coll/coll.h"

typedef struct wrk_coll_args {
    wrk_coll_op_kind_t kind;
    const void *sendbuf;
    void *recvbuf; /* SEND: NULL; RECV, BROADCAST: the buffer */
    size_t count;  /* per-member block for REDUCE_SCATTER (recv) and ALLGATHER (send) */
    wrk_coll_dtype_t dt;
    wrk_coll_redop_t op;
    uint32_t peer;  /* SEND/RECV/SENDRECV's send: peer index; BROADCAST: root index */
    size_t rcount;  /* SENDRECV: elements received into recvbuf */
    uint32_t rpeer; /* SENDRECV: the member received from */
} wrk_coll_args_t;

typedef struct wrk_coll_backend {
    const char *name;
    int (*init)(wrk_coll_t *c, const wrk_coll_config_t *cfg); /* sets c->be */
    void (*fini)(wrk_coll_t *c);
    int (*group_init)(wrk_coll_group_t *g, int timeout_ms); /* sets g->be */
    void (*group_fini)(wrk_coll_group_t *g);
    const char *(*transport)(const wrk_coll_group_t *g); /* NULL: the backend's name */
    int (*start)(wrk_coll_req_t *r);                     /* r->g, r->a set; sets r->be */
    /* SENDRECV as one grouped operation; NULL: the front end starts a SEND and a RECV */
    int (*start_sendrecv)(wrk_coll_req_t *r);
    int (*progress)(wrk_coll_t *c); /* drive every active request; > 0: something moved */
    int (*test)(wrk_coll_req_t *r); /* 0 done, 1 pending, < 0 failed; does not progress */
    /* Order the caller's stream (config.stream) after r (wrk_coll_wait_stream): 0 the wait
     * is enqueued on the device and the host goes on; 1 the backend's "device" is the host
     * (a fake), so the front end completes r with a host wait; < 0 failed. NULL: no
     * streams, every wait is the host's. */
    int (*wait_stream)(wrk_coll_req_t *r);
    /* wrk_coll_settle's poll: first = 1 marks the end of every group's work enqueued so far
     * (NCCL: an event on each group stream), then 0 all of it done, 1 not yet, < 0 a failure
     * (the communicator's asynchronous error). NULL: nothing is ever left in flight. */
    int (*settle)(wrk_coll_t *c, int first);
    void (*req_fini)(wrk_coll_req_t *r); /* release r->be, cancelling what is in flight */
    void (*abort)(wrk_coll_t *c);        /* owning thread, once, after the context aborted */
    int (*mem_alloc)(wrk_coll_t *c, size_t bytes, void **out);
    void (*mem_free)(wrk_coll_t *c, void *p);
    int (*mem_copy)(wrk_coll_t *c, void *dst, const void *src, size_t bytes, int to_backend);
    int (*available)(void);
} wrk_coll_backend_t;

struct wrk_coll {
    const wrk_coll_backend_t *ops;
    void *be;
    uint32_t rank, world_size;
    ch_rdzv_t rdzv;
    int timeout_ms;
    atomic_int aborted;     /* 0 or the code every operation now fails with */
    int abort_handled;      /* ops->abort ran (owning thread) */
    int ngroups, nreqs;     /* live objects, checked at destroy */
    char timeout_group[32]; /* the first wait that timed out: its group ("" if none) */
    uint32_t timeout_peer;  /* and the world rank it waited for */
    uint64_t timeout_seq;   /* and its entered count (the number of the collective) */
    wrk_coll_stage_t stage; /* host staging of device buffers (copy NULL: none) */
    uint64_t host_waits;    /* waits that blocked the host (wrk_coll_wait, blocking forms) */
    uint64_t stream_waits;  /* waits ordered on the caller's stream (wrk_coll_wait_stream) */
};

struct wrk_coll_group {
    wrk_coll_t *c;
    char name[32];
    uint32_t id;
    uint32_t n, me;                 /* size and the caller's index */
    uint32_t *ranks;                /* n world ranks, owned */
    uint32_t seq;                   /* collectives started so far (tags) */
    uint64_t entered;               /* collectives (not p2p) this member entered, front end */
    uint32_t *p2p_sent, *p2p_recvd; /* per peer: p2p messages started (tags) */
    atomic_int failed;              /* a member failed (backend sets it) */
    uint64_t wait_ns;               /* time blocked in waits on this group's requests */
    uint64_t device_ns; /* time its operations ran on its stream (backend-timed; coll.h) */
    uint64_t bytes[8];  /* per op kind: message bytes started (coll.h) */
    void *be;
};

struct wrk_coll_req {
    wrk_coll_group_t *g;
    wrk_coll_args_t a;
    int rc; /* 1 pending, 0 done, < 0 failed */
    void *be;
    /* Requests the front end runs for this one (coll_front.c): a SENDRECV's two halves on a
     * backend without start_sendrecv, or the host-staged operation and its buffers. */
    struct wrk_coll_req *part[2];
    void *host_in, *host_out;
};

/* coll_front.c: start, test and release a request through the pairing and staging above
 * (they call the backend's entries); the context's memory under staging. */
int wrk_coll_front_start(wrk_coll_req_t *r);
int wrk_coll_front_test(wrk_coll_req_t *r);
void wrk_coll_front_fini(wrk_coll_req_t *r);

extern const wrk_coll_backend_t wrk_coll_ucx_backend;
#if CHORUS_HAVE_CUDA
extern const wrk_coll_backend_t wrk_coll_nccl_backend;
#endif

#endif
