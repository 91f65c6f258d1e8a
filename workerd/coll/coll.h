/* Collectives (DESIGN §6): one interface, two backends chosen at run time.
 *
 * A context (wrk_coll_t) is one rank's view of the job's data plane: the UCX backend
 * (host memory, CPU) or the NCCL backend (device memory, GPU). Groups are ordered lists of
 * world ranks, usually built from the layout (TP group, DP group, PP column, embedding
 * group, world). Every operation is non-blocking: it starts and hands back a request;
 * wrk_coll_test / wrk_coll_wait complete it, so communication overlaps compute.
 *
 * Contracts
 * - One thread drives a context (creates groups, starts, tests, waits, frees). Only
 *   wrk_coll_abort may be called from any other thread.
 * - Collectives of a group must be started in the same order by every member; p2p
 *   send/recv between two members match in the order they were started. Requests of
 *   different groups may be waited in any order: waiting on one request progresses all.
 * - Buffers are borrowed from start until wrk_coll_req_free returns (not just until the
 *   wait: after a failure the backend may still be releasing them).
 * - Every wait has a timeout. A wait that times out aborts the context: a collective that
 *   missed its deadline cannot be resumed consistently across ranks (some peers may have
 *   given up), and NCCL requires an abort after a timeout. After an abort (wrk_coll_abort,
 *   a timeout, or a failed peer) every pending and future operation fails fast with
 *   CH_E_ABORTED; the only useful thing left is wrk_coll_destroy.
 * - Reductions (sum, max) are on F32 or BF16 in a fixed order: for the same group size and
 *   count the result is bit-identical from run to run, and identical on every member. A bf16
 *   reduction adds pairwise, each add widening to fp32 and rounding the sum to bf16
 *   (wrk_coll_reduce), so a 2-member group gets round(a + b) on every backend; with more
 *   members the partial sums round too, in the backend's order (shm and ncclsim: group
 *   order, ((x0 + x1) + x2) + ...; UCX: recursive doubling or the ring's order; NCCL: its
 *   own), so bf16 results of 3+ members differ between backends, fp32 ones as well.
 * - Counts are in elements of dtype. In-place is allowed: allreduce send == recv;
 *   allgather send == recv + index*count*size; reduce_scatter recv == send + index*count*size.
 *
 * Passing req == NULL to a start function runs the operation to completion with the
 * context's default timeout (blocking form). */
#ifndef WRK_COLL_H
#define WRK_COLL_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "common/layout.h"
#include "common/rdzv.h"

typedef struct wrk_coll wrk_coll_t;
typedef struct wrk_coll_group wrk_coll_group_t;
typedef struct wrk_coll_req wrk_coll_req_t;

typedef enum { WRK_COLL_UCX = 0, WRK_COLL_NCCL = 1 } wrk_coll_backend_kind_t;
/* BF16: 2-byte elements (bf16 working copies, activations and gradients of a mixed-precision
 * run, kernels/bf16.h; NCCL's ncclBfloat16), moved and reduced (see Contracts). */
typedef enum { WRK_COLL_F32 = 0, WRK_COLL_U8 = 1, WRK_COLL_BF16 = 2 } wrk_coll_dtype_t;
typedef enum { WRK_COLL_SUM = 0, WRK_COLL_MAX = 1 } wrk_coll_redop_t;

/* Groups built from the layout. Fixed ids keep the tags of different groups apart (two
 * layout groups of the same kind never share a pair of ranks). Custom groups use ids
 * >= WRK_COLL_GROUP_CUSTOM. */
typedef enum {
    WRK_COLL_GROUP_WORLD = 0,
    WRK_COLL_GROUP_TP = 1,
    WRK_COLL_GROUP_DP = 2,
    WRK_COLL_GROUP_PP = 3,  /* the pipeline column of (tp, dp): index = stage */
    WRK_COLL_GROUP_EMB = 4, /* first and last stage of the column (Megatron's embedding group) */
    WRK_COLL_GROUP_CUSTOM = 16,
} wrk_coll_group_kind_t;
#define WRK_COLL_GROUP_ID_MAX 4095

struct wrk_coll_backend;

/* Host-staged collectives for device buffers: the context's operations take device memory
 * (alloc), copy it to host buffers (copy, to_device = 0; it must see every device write
 * enqueued before it), run on the host over the UCX/shm backend and copy the results back
 * (to_device = 1). For GPU ranks that NCCL cannot serve: several ranks on one GPU. */
typedef struct wrk_coll_stage {
    void *ud;
    int (*alloc)(void *ud, size_t bytes, void **out);
    void (*free)(void *ud, void *p);
    int (*copy)(void *ud, void *dst, const void *src, size_t bytes, int to_device);
} wrk_coll_stage_t;

typedef struct wrk_coll_config {
    wrk_coll_backend_kind_t backend;
    uint32_t rank, world_size;
    ch_rdzv_t rdzv; /* copied; its ud must outlive the context */
    int timeout_ms; /* default for blocking calls and for setup (address/id exchange) */
    int device;     /* NCCL: CUDA device ordinal (usually LOCAL_RANK) */
    void *stream;   /* NCCL: cudaStream_t the caller's buffers are produced on; NULL:
                     * the legacy default stream. Ops wait for it before they start. */
    const wrk_coll_stage_t *stage; /* UCX only: host-staged device buffers (copied); NULL none */
    /* A backend table of the caller's instead of the one `backend` names (tests: a fake
     * with NCCL's stream semantics, tests/unit/ncclsim.h), and its argument. */
    const struct wrk_coll_backend *impl;
    void *impl_ud;
} wrk_coll_config_t;

void wrk_coll_config_defaults(wrk_coll_config_t *cfg);
/* 1 when the backend can run on this machine (NCCL: built with CUDA and a GPU present). */
int wrk_coll_backend_available(wrk_coll_backend_kind_t kind);
const char *wrk_coll_backend_name(wrk_coll_backend_kind_t kind);
const char *wrk_coll_dtype_name(wrk_coll_dtype_t dt);
size_t wrk_coll_dtype_size(wrk_coll_dtype_t dt);

/* Create this rank's context: publishes its address in the rendezvous store. Caller owns
 * *out (wrk_coll_destroy). Groups and requests must be freed first. */
int wrk_coll_create(const wrk_coll_config_t *cfg, wrk_coll_t **out);
void wrk_coll_destroy(wrk_coll_t *c);
/* Any thread, any time, idempotent: fail every pending and future operation. */
void wrk_coll_abort(wrk_coll_t *c);
/* 0 while healthy, else the code operations fail with (CH_E_ABORTED). */
int wrk_coll_status(const wrk_coll_t *c);
uint32_t wrk_coll_rank(const wrk_coll_t *c);
uint32_t wrk_coll_world_size(const wrk_coll_t *c);

/* Memory the backend's operations take (host for UCX, device for NCCL). */
int wrk_coll_mem_alloc(wrk_coll_t *c, size_t bytes, void **out);
void wrk_coll_mem_free(wrk_coll_t *c, void *p);
/* Copy between backend memory and host memory (to_backend: host -> backend). */
int wrk_coll_mem_copy(wrk_coll_t *c, void *dst, const void *src, size_t bytes, int to_backend);

/* Create a group. Collective over its members (every member calls it with the same name,
 * id and ranks; NCCL builds a communicator). ranks[i] is the world rank of member i; the
 * caller must be a member. Caller owns *out (wrk_coll_group_destroy before the context). */
int wrk_coll_group_create(wrk_coll_t *c, const char *name, uint32_t id, const uint32_t *ranks,
                          uint32_t n, wrk_coll_group_t **out);
/* The caller's group of the given kind under layout l (world size must match). For
 * WRK_COLL_GROUP_EMB a rank on a middle stage is in no embedding group: *out = NULL and 0.
 * With pp == 1 the embedding group is the rank alone. */
int wrk_coll_group_layout(wrk_coll_t *c, ch_layout_t l, wrk_coll_group_kind_t kind,
                          wrk_coll_group_t **out);
void wrk_coll_group_destroy(wrk_coll_group_t *g);
uint32_t wrk_coll_group_size(const wrk_coll_group_t *g);
uint32_t wrk_coll_group_index(const wrk_coll_group_t *g);                /* the caller's index */
uint32_t wrk_coll_group_rank(const wrk_coll_group_t *g, uint32_t index); /* world rank */
const char *wrk_coll_group_name(const wrk_coll_group_t *g);
wrk_coll_t *wrk_coll_group_context(const wrk_coll_group_t *g);
/* How the group's collectives move data: "shm" (UCX backend, every member on this host,
 * through a shared segment), "ucx" (UCX messages) or "nccl". */
const char *wrk_coll_group_transport(const wrk_coll_group_t *g);

/* Operations. peer and root are indices in the group. A successful start hands back *req
 * (caller owns it: wrk_coll_req_free). */
int wrk_coll_send(wrk_coll_group_t *g, const void *buf, size_t count, wrk_coll_dtype_t dt,
                  uint32_t peer, wrk_coll_req_t **req);
int wrk_coll_recv(wrk_coll_group_t *g, void *buf, size_t count, wrk_coll_dtype_t dt, uint32_t peer,
                  wrk_coll_req_t **req);
/* Paired exchange as one grouped operation: send scount elements of sendbuf to member speer
 * and receive rcount into recvbuf from member rpeer (speer == rpeer is fine). Both halves
 * progress together (NCCL: one ncclGroupStart/End; UCX: the two non-blocking halves), so
 * two members that each send to the other before receiving from it cannot deadlock on a
 * backend whose send completes only when its receive is posted. Messages match the plain
 * send/recv of the same pair in the order they were started. */
int wrk_coll_sendrecv(wrk_coll_group_t *g, const void *sendbuf, size_t scount, uint32_t speer,
                      void *recvbuf, size_t rcount, uint32_t rpeer, wrk_coll_dtype_t dt,
                      wrk_coll_req_t **req);
int wrk_coll_allreduce(wrk_coll_group_t *g, const void *sendbuf, void *recvbuf, size_t count,
                       wrk_coll_dtype_t dt, wrk_coll_redop_t op, wrk_coll_req_t **req);
/* sendbuf holds size*recvcount elements; member i receives the reduced block i. */
int wrk_coll_reduce_scatter(wrk_coll_group_t *g, const void *sendbuf, void *recvbuf,
                            size_t recvcount, wrk_coll_dtype_t dt, wrk_coll_redop_t op,
                            wrk_coll_req_t **req);
/* recvbuf gets size*sendcount elements: block i is member i's sendbuf. */
int wrk_coll_allgather(wrk_coll_group_t *g, const void *sendbuf, void *recvbuf, size_t sendcount,
                       wrk_coll_dtype_t dt, wrk_coll_req_t **req);
int wrk_coll_broadcast(wrk_coll_group_t *g, void *buf, size_t count, wrk_coll_dtype_t dt,
                       uint32_t root, wrk_coll_req_t **req);
int wrk_coll_barrier(wrk_coll_group_t *g, wrk_coll_req_t **req);

/* Progress without blocking: *done = 1 when req finished successfully; an error when it
 * failed (the request stays owned by the caller). */
int wrk_coll_test(wrk_coll_req_t *req, int *done);
/* Block until req completes, fails, or timeout_ms elapses (-ETIMEDOUT; the context is then
 * aborted, see above). timeout_ms < 0: the context's default. */
int wrk_coll_wait(wrk_coll_req_t *req, int timeout_ms);
/* Wait in stream order: the work the caller enqueues after this call on the context's
 * stream (config.stream) runs after req, and the host does not block. For a device backend
 * with streams (NCCL) the caller's stream waits on the request's completion event
 * (cudaStreamWaitEvent) and this returns at once; req then counts as done (free it; its
 * buffers stay the device's until the stream passes the wait, so the caller keeps them
 * until its next host sync). Backends without streams (UCX, shm, host staging) wait on the
 * host as wrk_coll_wait. For a result the host itself reads, use wrk_coll_wait.
 * A failure of an operation waited this way surfaces at the caller's next host sync or at
 * the next host wait of the context, not here. */
int wrk_coll_wait_stream(wrk_coll_req_t *req, int timeout_ms);
/* The blocking form in stream order: `started` is what a start function returned for
 * *req; wait_stream *req when it started, free it either way (*req = NULL). A pointer,
 * not the request: wrk_coll_ordered(wrk_coll_allreduce(..., &r), &r) reads r only after
 * the start has set it (C leaves the order of a call's arguments open). 0 or the first
 * error. */
int wrk_coll_ordered(int started, wrk_coll_req_t **req);
/* Before the host sync that follows stream-ordered waits: poll on the host, with a wait's
 * timeout and failure checks, until every operation of c started so far has completed, so
 * a failed or missing peer fails the step (CH_E_ABORTED, or -ETIMEDOUT and the context
 * aborted) instead of hanging the sync in the driver. Not counted as a wait. 0 at once on a
 * backend without streams. timeout_ms < 0: the context's default. */
int wrk_coll_settle(wrk_coll_t *c, int timeout_ms);
/* Waits of c so far: *host those that blocked the host (wrk_coll_wait, the blocking forms,
 * a wrk_coll_wait_stream that fell back), *stream those ordered on the caller's stream
 * (wrk_coll_wait_stream on a backend with streams; a fake whose device is the host counts
 * them here too, though its host waits for them). Either pointer may be NULL. */
void wrk_coll_wait_counts(const wrk_coll_t *c, uint64_t *host, uint64_t *stream);
/* 1 when a wait of this context timed out: the group's name and the world rank waited for
 * (the peer of a send/recv, the root of a broadcast, else the ring predecessor: exact for
 * groups of two), both borrowed from c. */
int wrk_coll_timed_out(const wrk_coll_t *c, const char **group, uint32_t *peer);
/* Collectives (send and recv not counted) the caller has entered in g so far: members
 * of a group enter them in the same order, so after a timeout the member whose count is
 * behind the others' is the one that never arrived (the coordinator compares them). The
 * count the timed-out wait had entered: wrk_coll_timeout_seq. 0 for NULL. */
uint64_t wrk_coll_group_entered(const wrk_coll_group_t *g);
uint64_t wrk_coll_timeout_seq(const wrk_coll_t *c);
/* Nanoseconds the caller has spent blocked waiting on g's requests so far (the blocking
 * forms included; a request that completes without waiting costs nothing here): how the
 * engine splits a step into compute and communication. 0 for NULL. */
uint64_t wrk_coll_group_wait_ns(const wrk_coll_group_t *g);
/* Nanoseconds g's operations ran on its stream, where the backend has streams and times
 * them there (NCCL: CUDA events around each, added once they have completed, at a
 * wrk_coll_settle): a GPU's communication time, which the host, waiting in stream order,
 * never sees. Includes the time an operation waited for its peers. 0 for NULL and on
 * backends without streams (their time is the host's: wait_ns). */
uint64_t wrk_coll_group_device_ns(const wrk_coll_group_t *g);

/* Release req (NULL is fine). Freeing a request that has not completed aborts the context. */
void wrk_coll_req_free(wrk_coll_req_t *req);

/* ---- Operation kinds (metrics, logs). The backend table and the structs behind the
 * handles are private: coll_impl.h. */

typedef enum {
    WRK_COLL_OP_SEND,
    WRK_COLL_OP_RECV,
    WRK_COLL_OP_ALLREDUCE,
    WRK_COLL_OP_REDUCE_SCATTER,
    WRK_COLL_OP_ALLGATHER,
    WRK_COLL_OP_BROADCAST,
    WRK_COLL_OP_BARRIER,
    WRK_COLL_OP_SENDRECV,
} wrk_coll_op_kind_t;

/* out = a op b elementwise in dt (F32, or BF16: both widen to fp32, the result rounds to
 * the nearest bf16, ties to even, kernels/bf16.h), out may alias a or b. Elementwise and
 * commutative, so the bits depend only on the operands. */
void wrk_coll_reduce(wrk_coll_redop_t op, wrk_coll_dtype_t dt, void *out, const void *a,
                     const void *b, size_t n);

/* Bytes of the operations of this kind the caller has started in g so far: each one's
 * message size in NCCL's sense, count * the dtype's size over the whole buffer (an
 * all-gather's or reduce-scatter's group size * block, a sendrecv's both halves; a
 * sendrecv counts as SENDRECV, not as a SEND and a RECV): what precision changes in a
 * step's communication. 0 for NULL. */
uint64_t wrk_coll_group_bytes(const wrk_coll_group_t *g, wrk_coll_op_kind_t kind);

/* "allreduce", "reduce_scatter", ... (metric names, logs). */
const char *wrk_coll_op_name(wrk_coll_op_kind_t kind);

#endif
