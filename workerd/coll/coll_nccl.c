/* NCCL backend of the collectives (coll.h): device memory, one communicator per group.
 *
 * - Communicators are built with non-blocking init (config.blocking = 0): member 0 of the
 *   group makes the unique id and publishes it in the rendezvous store under
 *   "nccl/<name>/<id>/<first world rank>/<n-th time>"; every member then polls
 *   ncclCommGetAsyncError until the communicator is ready or the timeout passes
 *   (ncclCommAbort, -ETIMEDOUT).
 * - Each group has its own stream. An operation first waits (on the device) for the
 *   caller's stream, so buffers produced there are ready, then runs on the group stream
 *   and records an event; testing a request is cudaEventQuery plus the communicator's
 *   asynchronous error, so a failed peer surfaces instead of a hang. A stream-ordered wait
 *   (wrk_coll_wait_stream) is the caller's stream waiting on that event on the device: the
 *   host never blocks for a result only the device reads.
 * - Each operation is timed on its group stream: an event before it (after the wait for the
 *   caller's stream) and its completion event, both kept by the group until the operation
 *   has completed and its request is released; wrk_coll_settle adds the completed ones'
 *   elapsed times to the group's device_ns (coll.h), so a GPU's communication time is the
 *   device's, read without a wait.
 * - Abort (wrk_coll_abort, a timeout, a failure) calls ncclCommAbort on every
 *   communicator of the context; kernels waiting for dead peers are torn down with it.
 * - A paired exchange (wrk_coll_sendrecv) is one ncclGroupStart/End around its send and
 *   receive: ungrouped, two peers that each send first would both block their streams.
 * - NCCL and the CUDA runtime are loaded on first use (dlopen of their sonames, found as
 *   the dynamic loader finds any library: LD_LIBRARY_PATH, the cache), so chorus-rank links
 *   neither and a CPU rank never loads them; their headers give the types only. Every call
 *   goes through the table `lib`, filled once; a machine without them has no NCCL backend
 *   (available() says 0, init fails with CH_E_NCCL and the loader's reason logged).
 * The GPU makes progress on its own: progress() has nothing to drive. */
#include "workerd/coll/coll_impl.h"

#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>
#include <nccl.h>

#include "common/err.h"
#include "common/log.h"
#include "common/util.h"

typedef struct id_use {
    struct id_use *next;
    char key[96];
    unsigned count;
} id_use_t;

typedef struct nccl_ctx {
    int device;
    cudaStream_t user; /* borrowed: the caller's stream (NULL: legacy default) */
    wrk_coll_group_t **groups;
    size_t ngroups, cap;
    id_use_t *uses; /* how often each id key was used: a re-created group gets a fresh key */
} nccl_ctx_t;

/* One operation's events, owned by its group's list (oldest first) until it has been
 * timed and its request released. */
typedef struct nccl_op {
    cudaEvent_t start, done;
    int timed, released;
    int orphan; /* its group was released first: its request frees it */
    struct nccl_op *next;
} nccl_op_t;

typedef struct nccl_group {
    ncclComm_t comm;
    cudaStream_t stream;
    cudaEvent_t ready;
    cudaEvent_t settled;       /* wrk_coll_settle's mark on the group stream */
    float *one;                /* barrier scratch */
    nccl_op_t *ops, **ops_end; /* its operations not yet timed or released, in stream order */
} nccl_group_t;

// ----------------------------------------------------------------------------
// the libraries, loaded on first use

/* Every entry, once: X(library, name), library 0 the CUDA runtime, 1 NCCL. Each entry of
 * the table has the type its header declares and is looked up by its name. */
// clang-format off
#define LIB_ENTRIES(X) \
    X(0, cudaGetDeviceCount) X(0, cudaSetDevice) X(0, cudaGetErrorString)             \
    X(0, cudaStreamCreateWithFlags) X(0, cudaStreamDestroy) X(0, cudaStreamWaitEvent) \
    X(0, cudaEventCreateWithFlags) X(0, cudaEventDestroy) X(0, cudaEventRecord)       \
    X(0, cudaEventQuery) X(0, cudaEventElapsedTime) X(0, cudaMalloc) X(0, cudaFree)   \
    X(0, cudaMemcpy) X(0, cudaStreamSynchronize)                                      \
    X(1, ncclGetErrorString) X(1, ncclGetUniqueId)                                    \
    X(1, ncclCommInitRankConfig) X(1, ncclCommGetAsyncError) X(1, ncclCommFinalize)   \
    X(1, ncclCommDestroy) X(1, ncclCommAbort) X(1, ncclGroupStart)                    \
    X(1, ncclGroupEnd) X(1, ncclSend) X(1, ncclRecv)                                  \
    X(1, ncclAllReduce) X(1, ncclReduceScatter) X(1, ncclAllGather)                   \
    X(1, ncclBroadcast)
// clang-format on

#define FIELD(lib, name) __typeof__(&name) name;
typedef struct nccl_lib {
    LIB_ENTRIES(FIELD)
} nccl_lib_t;
#undef FIELD

#define ROW(lib, name) {lib, #name, offsetof(nccl_lib_t, name)},
static const struct {
    int from; /* 0: the CUDA runtime, 1: NCCL */
    const char *name;
    size_t off;
} syms[] = {LIB_ENTRIES(ROW)};
#undef ROW

static pthread_once_t lib_once = PTHREAD_ONCE_INIT;
static nccl_lib_t lib; /* filled once by lib_load(), never changed after */
static int lib_ok;     /* 1 when every entry of lib is set */
static char lib_why[256] = "not loaded";

/* The major version the headers were built for, as the libraries' sonames carry it: the
 * engine's CUDA module links the same libcudart.so.N, so both share one runtime. */
static void *lib_open(const char *base, int major)
{
    char name[64];
    snprintf(name, sizeof name, "%s.so.%d", base, major);
    void *h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        snprintf(lib_why, sizeof lib_why, "%s", dlerror());
    }
    return h;
}

static void lib_load(void)
{
    void *h[2] = {lib_open("libcudart", CUDART_VERSION / 1000), NULL};
    if (h[0] != NULL)
        h[1] = lib_open("libnccl", NCCL_MAJOR);
    if (h[0] == NULL || h[1] == NULL)
        return; /* a handle that did open stays open: nothing else would close it */
    nccl_lib_t l;
    for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
        void *p = dlsym(h[syms[i].from], syms[i].name);
        if (p == NULL) {
            snprintf(lib_why, sizeof lib_why, "no %s: %s", syms[i].name, dlerror());
            return;
        }
        memcpy((char *)&l + syms[i].off, &p, sizeof p); /* POSIX: a function's address */
    }
    lib = l;
    lib_ok = 1;
}

/* 1 once NCCL and the CUDA runtime are loaded (a probe: nothing logged). */
static int lib_loaded(void)
{
    pthread_once(&lib_once, lib_load);
    return lib_ok;
}

/* 0 once NCCL and the CUDA runtime are loaded, else CH_E_NCCL (the reason logged once). */
static int lib_get(void)
{
    if (lib_loaded())
        return 0;
    static atomic_int told;
    if (atomic_exchange(&told, 1) == 0)
        CH_LOGE("coll", "no NCCL backend: %s", lib_why);
    return CH_E_NCCL;
}

/* The one CUDA runtime -> Chorus conversion. */
static int cuda_err(cudaError_t e)
{
    if (e == cudaSuccess)
        return 0;
    if (e == cudaErrorMemoryAllocation)
        return -ENOMEM;
    CH_LOGE("coll", "cuda: %s", lib.cudaGetErrorString(e));
    return CH_E_CUDA;
}

/* The one NCCL -> Chorus conversion (ncclInProgress is handled by the callers). */
static int nccl_err(ncclResult_t r)
{
    switch (r) {
    case ncclSuccess:
        return 0;
    case ncclInvalidArgument:
    case ncclInvalidUsage:
        CH_LOGE("coll", "nccl: %s", lib.ncclGetErrorString(r));
        return -EINVAL;
    case ncclRemoteError:
        CH_LOGE("coll", "nccl: %s (a peer failed)", lib.ncclGetErrorString(r));
        return CH_E_ABORTED;
    default:
        CH_LOGE("coll", "nccl: %s", lib.ncclGetErrorString(r));
        return CH_E_NCCL;
    }
}

/* Wait for a non-blocking communicator to leave ncclInProgress. */
static int comm_settle(ncclComm_t comm, int timeout_ms)
{
    uint64_t deadline = ch_now_ms() + (uint64_t)timeout_ms;
    for (;;) {
        ncclResult_t st;
        ncclResult_t r = lib.ncclCommGetAsyncError(comm, &st);
        if (r != ncclSuccess)
            return nccl_err(r);
        if (st != ncclInProgress)
            return nccl_err(st);
        if (ch_now_ms() >= deadline)
            return -ETIMEDOUT;
        sched_yield();
    }
}

static int nccl_init(wrk_coll_t *c, const wrk_coll_config_t *cfg)
{
    int rc = lib_get();
    if (rc < 0)
        return rc;
    nccl_ctx_t *x = calloc(1, sizeof *x);
    if (!x)
        return -ENOMEM;
    x->device = cfg->device;
    x->user = (cudaStream_t)cfg->stream;
    rc = cuda_err(lib.cudaSetDevice(cfg->device));
    if (rc < 0) {
        free(x);
        return rc;
    }
    c->be = x;
    return 0;
}

static void nccl_fini(wrk_coll_t *c)
{
    nccl_ctx_t *x = c->be;
    if (!x)
        return;
    while (x->uses) {
        id_use_t *u = x->uses;
        x->uses = u->next;
        free(u);
    }
    free(x->groups);
    free(x);
    c->be = NULL;
}

static int id_key(nccl_ctx_t *x, const wrk_coll_group_t *g, char *key, size_t len)
{
    char base[96];
    snprintf(base, sizeof base, "nccl/%s/%u/%u", g->name, g->id, g->ranks[0]);
    id_use_t *u = x->uses;
    while (u && strcmp(u->key, base) != 0)
        u = u->next;
    if (!u) {
        if (!(u = calloc(1, sizeof *u)))
            return -ENOMEM;
        snprintf(u->key, sizeof u->key, "%s", base);
        u->next = x->uses;
        x->uses = u;
    }
    snprintf(key, len, "%s/%u", base, u->count++);
    return 0;
}

static int get_unique_id(wrk_coll_group_t *g, int timeout_ms, ncclUniqueId *id)
{
    wrk_coll_t *c = g->c;
    char key[128];
    int rc = id_key(c->be, g, key, sizeof key);
    if (rc < 0)
        return rc;
    if (g->me == 0) {
        if ((rc = nccl_err(lib.ncclGetUniqueId(id))) < 0)
            return rc;
        return c->rdzv.set(c->rdzv.ud, key, id, sizeof *id);
    }
    void *val = NULL;
    size_t len = 0;
    if ((rc = c->rdzv.get(c->rdzv.ud, key, timeout_ms, &val, &len)) < 0)
        return rc;
    if (len == sizeof *id)
        memcpy(id, val, sizeof *id);
    else
        rc = CH_E_FORMAT;
    free(val);
    return rc;
}

static void op_free(nccl_op_t *o)
{
    if (o->start)
        lib.cudaEventDestroy(o->start);
    if (o->done)
        lib.cudaEventDestroy(o->done); /* fine while pending: released once it completes */
    free(o);
}

/* The group's completed operations timed into g->device_ns, in stream order (the first not
 * completed ends it); those whose requests are released too are freed. */
static void ops_harvest(wrk_coll_group_t *g)
{
    nccl_group_t *ng = g->be;
    nccl_op_t **at = &ng->ops;
    int running = 0;
    while (*at) {
        nccl_op_t *o = *at;
        if (!o->timed && !running) {
            float ms = 0;
            if (lib.cudaEventQuery(o->done) != cudaSuccess)
                running = 1;
            else if (lib.cudaEventElapsedTime(&ms, o->start, o->done) == cudaSuccess)
                g->device_ns += (uint64_t)((double)ms * 1e6);
            o->timed = !running;
        }
        if (o->timed && o->released) {
            *at = o->next;
            op_free(o);
        } else {
            at = &o->next;
        }
    }
    ng->ops_end = at;
}

static void group_release(nccl_group_t *ng, int healthy, int timeout_ms)
{
    if (ng->comm) {
        /* Finalize flushes what is in flight; a broken communicator can only be aborted. */
        ncclResult_t fr = healthy ? lib.ncclCommFinalize(ng->comm) : ncclInternalError;
        if ((fr == ncclSuccess || fr == ncclInProgress) && comm_settle(ng->comm, timeout_ms) == 0)
            lib.ncclCommDestroy(ng->comm);
        else
            lib.ncclCommAbort(ng->comm);
    }
    if (ng->one)
        lib.cudaFree(ng->one);
    if (ng->ready)
        lib.cudaEventDestroy(ng->ready);
    if (ng->settled)
        lib.cudaEventDestroy(ng->settled);
    while (ng->ops) {
        nccl_op_t *o = ng->ops;
        ng->ops = o->next;
        if (o->released)
            op_free(o);
        else
            o->orphan = 1;
    }
    if (ng->stream)
        lib.cudaStreamDestroy(ng->stream);
    free(ng);
}

static int nccl_group_init(wrk_coll_group_t *g, int timeout_ms)
{
    nccl_ctx_t *x = g->c->be;
    int rc;
    if (x->ngroups == x->cap) {
        size_t cap = x->cap ? 2 * x->cap : 8;
        wrk_coll_group_t **gs = realloc(x->groups, cap * sizeof *gs);
        if (!gs)
            return -ENOMEM;
        x->groups = gs;
        x->cap = cap;
    }
    nccl_group_t *ng = calloc(1, sizeof *ng);
    if (!ng)
        return -ENOMEM;
    ng->ops_end = &ng->ops;
    ncclUniqueId id;
    CH_CHECK_GOTO(get_unique_id(g, timeout_ms, &id), rc, fail);
    CH_CHECK_GOTO(cuda_err(lib.cudaSetDevice(x->device)), rc, fail);
    CH_CHECK_GOTO(cuda_err(lib.cudaStreamCreateWithFlags(&ng->stream, cudaStreamNonBlocking)), rc,
                  fail);
    CH_CHECK_GOTO(cuda_err(lib.cudaEventCreateWithFlags(&ng->ready, cudaEventDisableTiming)), rc,
                  fail);
    CH_CHECK_GOTO(cuda_err(lib.cudaEventCreateWithFlags(&ng->settled, cudaEventDisableTiming)), rc,
                  fail);
    CH_CHECK_GOTO(cuda_err(lib.cudaMalloc((void **)&ng->one, sizeof(float))), rc, fail);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclResult_t r = lib.ncclCommInitRankConfig(&ng->comm, (int)g->n, id, (int)g->me, &cfg);
    if (r != ncclSuccess && r != ncclInProgress) {
        rc = nccl_err(r);
        goto fail;
    }
    if ((rc = comm_settle(ng->comm, timeout_ms)) < 0) {
        CH_LOGE("coll", "rank %u: nccl communicator for %s: %s", g->c->rank, g->name,
                ch_strerror(rc));
        goto fail;
    }
    g->be = ng;
    x->groups[x->ngroups++] = g;
    return 0;
fail:
    group_release(ng, 0, 0);
    return rc;
}

static void nccl_group_fini(wrk_coll_group_t *g)
{
    nccl_ctx_t *x = g->c->be;
    for (size_t i = 0; i < x->ngroups; i++)
        if (x->groups[i] == g) {
            x->groups[i] = x->groups[--x->ngroups];
            break;
        }
    if (g->be)
        group_release(g->be, atomic_load(&g->c->aborted) == 0, g->c->timeout_ms);
    g->be = NULL;
}

static ncclDataType_t nccl_dtype(wrk_coll_dtype_t dt)
{
    return dt == WRK_COLL_F32 ? ncclFloat32 : dt == WRK_COLL_BF16 ? ncclBfloat16 : ncclUint8;
}

/* The paired exchange as one NCCL group: the send and the receive are launched together, so
 * neither blocks the stream waiting for a peer that is itself blocked sending first (each
 * send of an ungrouped [send][recv] pair waits for the peer's receive once the message
 * exceeds NCCL's buffers: two neighbouring pipeline stages would deadlock). */
static ncclResult_t enqueue_sendrecv(const wrk_coll_args_t *a, nccl_group_t *ng)
{
    ncclDataType_t dt = nccl_dtype(a->dt);
    ncclResult_t r = lib.ncclGroupStart();
    if (r != ncclSuccess)
        return r;
    ncclResult_t rs = lib.ncclSend(a->sendbuf, a->count, dt, (int)a->peer, ng->comm, ng->stream);
    ncclResult_t rr = lib.ncclRecv(a->recvbuf, a->rcount, dt, (int)a->rpeer, ng->comm, ng->stream);
    r = lib.ncclGroupEnd(); /* always closes the group, whatever the two calls answered */
    if (rs != ncclSuccess && rs != ncclInProgress)
        return rs;
    if (rr != ncclSuccess && rr != ncclInProgress)
        return rr;
    return r;
}

static ncclResult_t enqueue(wrk_coll_req_t *r, nccl_group_t *ng)
{
    const wrk_coll_args_t *a = &r->a;
    ncclDataType_t dt = nccl_dtype(a->dt);
    ncclRedOp_t op = a->op == WRK_COLL_MAX ? ncclMax : ncclSum;
    switch (a->kind) {
    case WRK_COLL_OP_SEND:
        return lib.ncclSend(a->sendbuf, a->count, dt, (int)a->peer, ng->comm, ng->stream);
    case WRK_COLL_OP_RECV:
        return lib.ncclRecv(a->recvbuf, a->count, dt, (int)a->peer, ng->comm, ng->stream);
    case WRK_COLL_OP_ALLREDUCE:
        return lib.ncclAllReduce(a->sendbuf, a->recvbuf, a->count, dt, op, ng->comm, ng->stream);
    case WRK_COLL_OP_REDUCE_SCATTER:
        return lib.ncclReduceScatter(a->sendbuf, a->recvbuf, a->count, dt, op, ng->comm,
                                     ng->stream);
    case WRK_COLL_OP_ALLGATHER:
        return lib.ncclAllGather(a->sendbuf, a->recvbuf, a->count, dt, ng->comm, ng->stream);
    case WRK_COLL_OP_BROADCAST:
        return lib.ncclBroadcast(a->recvbuf, a->recvbuf, a->count, dt, (int)a->peer, ng->comm,
                                 ng->stream);
    case WRK_COLL_OP_BARRIER:
        return lib.ncclAllReduce(ng->one, ng->one, 1, ncclFloat32, ncclSum, ng->comm, ng->stream);
    case WRK_COLL_OP_SENDRECV:
        return enqueue_sendrecv(a, ng);
    }
    return ncclInvalidArgument;
}

static int nccl_start(wrk_coll_req_t *r)
{
    wrk_coll_group_t *g = r->g;
    nccl_ctx_t *x = g->c->be;
    nccl_group_t *ng = g->be;
    int rc;
    nccl_op_t *o = calloc(1, sizeof *o);
    if (!o)
        return -ENOMEM;
    CH_CHECK_GOTO(cuda_err(lib.cudaEventCreateWithFlags(&o->start, cudaEventDefault)), rc, fail);
    CH_CHECK_GOTO(cuda_err(lib.cudaEventCreateWithFlags(&o->done, cudaEventDefault)), rc, fail);
    CH_CHECK_GOTO(cuda_err(lib.cudaEventRecord(ng->ready, x->user)), rc, fail);
    CH_CHECK_GOTO(cuda_err(lib.cudaStreamWaitEvent(ng->stream, ng->ready, 0)), rc, fail);
    CH_CHECK_GOTO(cuda_err(lib.cudaEventRecord(o->start, ng->stream)), rc, fail);
    ncclResult_t nr = enqueue(r, ng);
    if (nr == ncclInProgress)
        rc = comm_settle(ng->comm, g->c->timeout_ms);
    else
        rc = nccl_err(nr);
    if (rc < 0)
        goto fail;
    CH_CHECK_GOTO(cuda_err(lib.cudaEventRecord(o->done, ng->stream)), rc, fail);
    *ng->ops_end = o; /* the group keeps the events until o is timed and released */
    ng->ops_end = &o->next;
    r->be = o;
    return 0;
fail:
    op_free(o);
    return rc;
}

static int nccl_progress(wrk_coll_t *c)
{
    return 0;
}

/* ev of group ng: 0 reached, 1 not yet, < 0 failed (the event, or the communicator's
 * asynchronous error: a failed peer surfaces instead of a hang). */
static int event_poll(nccl_group_t *ng, cudaEvent_t ev)
{
    cudaError_t e = lib.cudaEventQuery(ev);
    if (e == cudaSuccess)
        return 0;
    if (e != cudaErrorNotReady)
        return cuda_err(e);
    ncclResult_t st;
    ncclResult_t nr = lib.ncclCommGetAsyncError(ng->comm, &st);
    if (nr != ncclSuccess)
        return nccl_err(nr);
    if (st != ncclSuccess && st != ncclInProgress)
        return nccl_err(st);
    return 1;
}

static int nccl_test(wrk_coll_req_t *r)
{
    nccl_op_t *o = r->be;
    return event_poll(r->g->be, o->done);
}

/* The caller's stream waits on the device for r's event; the host goes on. The event may
 * be destroyed after this (the wait holds the work it recorded, CUDA's rule). */
static int nccl_wait_stream(wrk_coll_req_t *r)
{
    nccl_op_t *o = r->be;
    nccl_ctx_t *x = r->g->c->be;
    return cuda_err(lib.cudaStreamWaitEvent(x->user, o->done, 0));
}

/* Every group stream's work so far: an event recorded behind it (first), then polled with
 * the communicator's asynchronous error, as a test polls one request. */
static int nccl_settle(wrk_coll_t *c, int first)
{
    nccl_ctx_t *x = c->be;
    int pending = 0;
    for (size_t i = 0; i < x->ngroups; i++) {
        nccl_group_t *ng = x->groups[i]->be;
        if (!ng || !ng->comm)
            continue;
        int rc = first ? cuda_err(lib.cudaEventRecord(ng->settled, ng->stream)) : 0;
        if (rc == 0)
            rc = event_poll(ng, ng->settled);
        if (rc < 0)
            return rc;
        pending |= rc;
        if (rc == 0) /* everything enqueued on it so far has completed */
            ops_harvest(x->groups[i]);
    }
    return pending;
}

static void nccl_req_fini(wrk_coll_req_t *r)
{
    nccl_op_t *o = r->be;
    if (!o)
        return;
    if (o->orphan)
        op_free(o);
    else
        o->released = 1; /* its group frees it once timed (ops_harvest) */
    r->be = NULL;
}

static void nccl_abort(wrk_coll_t *c)
{
    nccl_ctx_t *x = c->be;
    for (size_t i = 0; i < x->ngroups; i++) {
        nccl_group_t *ng = x->groups[i]->be;
        if (ng && ng->comm) {
            lib.ncclCommAbort(ng->comm);
            ng->comm = NULL;
        }
    }
}

static int nccl_mem_alloc(wrk_coll_t *c, size_t bytes, void **out)
{
    *out = NULL;
    return cuda_err(lib.cudaMalloc(out, bytes ? bytes : 1));
}

static void nccl_mem_free(wrk_coll_t *c, void *p)
{
    lib.cudaFree(p);
}

/* Host to device, cudaMemcpy from pageable memory may return once the bytes are staged,
 * before the DMA lands; the group streams are non-blocking, so a send enqueued next would
 * not wait for the legacy stream's copy: that stream is synchronized first. */
static int nccl_mem_copy(wrk_coll_t *c, void *dst, const void *src, size_t bytes, int to_backend)
{
    int rc = cuda_err(lib.cudaMemcpy(dst, src, bytes,
                                     to_backend ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost));
    if (rc == 0 && to_backend)
        rc = cuda_err(lib.cudaStreamSynchronize(cudaStreamLegacy));
    return rc;
}

static int nccl_available(void)
{
    int n = 0;
    return lib_loaded() && lib.cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

const wrk_coll_backend_t wrk_coll_nccl_backend = {
    .name = "nccl",
    .init = nccl_init,
    .fini = nccl_fini,
    .group_init = nccl_group_init,
    .group_fini = nccl_group_fini,
    .start = nccl_start,
    .start_sendrecv = nccl_start,
    .progress = nccl_progress,
    .test = nccl_test,
    .wait_stream = nccl_wait_stream,
    .settle = nccl_settle,
    .req_fini = nccl_req_fini,
    .abort = nccl_abort,
    .mem_alloc = nccl_mem_alloc,
    .mem_free = nccl_mem_free,
    .mem_copy = nccl_mem_copy,
    .available = nccl_available,
};
