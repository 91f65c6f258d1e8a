/* Backend-independent half of the collectives (coll.h): contexts, groups from the layout,
 * argument checks, requests, the wait loop with its timeout, and the abort state. The
 * backends (coll_ucx.c, coll_nccl.c) only move data. */
#include "workerd/coll/coll_impl.h"

#include <limits.h>
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chorus/config.h"
#include "common/err.h"
#include "common/log.h"
#include "common/util.h"
#include "kernels/bf16.h"

#define DEFAULT_TIMEOUT_MS 60000
/* Wait loop: progress calls in a row that moved nothing before the thread yields its core
 * (ranks may outnumber cores: tests, oversubscribed nodes). */
#define IDLE_SPINS_BEFORE_YIELD 64

static const wrk_coll_backend_t *backend_of(wrk_coll_backend_kind_t kind)
{
    switch (kind) {
    case WRK_COLL_UCX:
        return &wrk_coll_ucx_backend;
    case WRK_COLL_NCCL:
#if CHORUS_HAVE_CUDA
        return &wrk_coll_nccl_backend;
#else
        return NULL;
#endif
    }
    return NULL;
}

void wrk_coll_config_defaults(wrk_coll_config_t *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->backend = WRK_COLL_UCX;
    cfg->world_size = 1;
    cfg->timeout_ms = DEFAULT_TIMEOUT_MS;
}

int wrk_coll_backend_available(wrk_coll_backend_kind_t kind)
{
    const wrk_coll_backend_t *be = backend_of(kind);
    return be ? be->available() : 0;
}

const char *wrk_coll_backend_name(wrk_coll_backend_kind_t kind)
{
    return kind == WRK_COLL_NCCL ? "nccl" : kind == WRK_COLL_UCX ? "ucx" : "?";
}

const char *wrk_coll_dtype_name(wrk_coll_dtype_t dt)
{
    return dt == WRK_COLL_F32    ? "f32"
           : dt == WRK_COLL_U8   ? "u8"
           : dt == WRK_COLL_BF16 ? "bf16"
                                 : "?";
}

size_t wrk_coll_dtype_size(wrk_coll_dtype_t dt)
{
    return dt == WRK_COLL_F32 ? 4 : dt == WRK_COLL_BF16 ? 2 : dt == WRK_COLL_U8 ? 1 : 0;
}

const char *wrk_coll_op_name(wrk_coll_op_kind_t kind)
{
    static const char *const names[] = {
        [WRK_COLL_OP_SEND] = "send",           [WRK_COLL_OP_RECV] = "recv",
        [WRK_COLL_OP_ALLREDUCE] = "allreduce", [WRK_COLL_OP_REDUCE_SCATTER] = "reduce_scatter",
        [WRK_COLL_OP_ALLGATHER] = "allgather", [WRK_COLL_OP_BROADCAST] = "broadcast",
        [WRK_COLL_OP_BARRIER] = "barrier",     [WRK_COLL_OP_SENDRECV] = "sendrecv",
    };
    return (unsigned)kind < sizeof names / sizeof names[0] ? names[kind] : "?";
}

// ----------------------------------------------------------------------------
// context

int wrk_coll_create(const wrk_coll_config_t *cfg, wrk_coll_t **out)
{
    *out = NULL;
    const wrk_coll_backend_t *be = cfg->impl ? cfg->impl : backend_of(cfg->backend);
    if (!be) {
        CH_LOGE("coll", "backend %s not built in", wrk_coll_backend_name(cfg->backend));
        return -ENOTSUP;
    }
    if (cfg->world_size == 0 || cfg->rank >= cfg->world_size || !cfg->rdzv.set || !cfg->rdzv.get)
        return -EINVAL;
    if (cfg->stage && (cfg->backend != WRK_COLL_UCX || cfg->impl || !cfg->stage->copy ||
                       !cfg->stage->alloc || !cfg->stage->free))
        return -EINVAL;
    wrk_coll_t *c = calloc(1, sizeof *c);
    if (!c)
        return -ENOMEM;
    c->ops = be;
    c->rank = cfg->rank;
    c->world_size = cfg->world_size;
    c->rdzv = cfg->rdzv;
    c->timeout_ms = cfg->timeout_ms > 0 ? cfg->timeout_ms : DEFAULT_TIMEOUT_MS;
    if (cfg->stage)
        c->stage = *cfg->stage;
    atomic_init(&c->aborted, 0);
    int rc = be->init(c, cfg);
    if (rc < 0) {
        free(c);
        return rc;
    }
    *out = c;
    return 0;
}

void wrk_coll_destroy(wrk_coll_t *c)
{
    if (!c)
        return;
    if (c->ngroups || c->nreqs)
        CH_LOGW("coll", "destroying a context with %d groups and %d requests alive", c->ngroups,
                c->nreqs);
    c->ops->fini(c);
    free(c);
}

void wrk_coll_abort(wrk_coll_t *c)
{
    int expected = 0;
    atomic_compare_exchange_strong(&c->aborted, &expected, CH_E_ABORTED);
}

int wrk_coll_status(const wrk_coll_t *c)
{
    return atomic_load(&((wrk_coll_t *)c)->aborted);
}

uint32_t wrk_coll_rank(const wrk_coll_t *c)
{
    return c->rank;
}

uint32_t wrk_coll_world_size(const wrk_coll_t *c)
{
    return c->world_size;
}

/* Owning thread: notice an abort (from any thread) and let the backend react once. */
static int check_aborted(wrk_coll_t *c)
{
    int rc = atomic_load(&c->aborted);
    if (rc && !c->abort_handled) {
        c->abort_handled = 1;
        if (c->ops->abort)
            c->ops->abort(c);
    }
    return rc;
}

int wrk_coll_mem_alloc(wrk_coll_t *c, size_t bytes, void **out)
{
    if (c->stage.copy)
        return c->stage.alloc(c->stage.ud, bytes, out);
    return c->ops->mem_alloc(c, bytes, out);
}

void wrk_coll_mem_free(wrk_coll_t *c, void *p)
{
    if (p && c->stage.copy)
        c->stage.free(c->stage.ud, p);
    else if (p)
        c->ops->mem_free(c, p);
}

int wrk_coll_mem_copy(wrk_coll_t *c, void *dst, const void *src, size_t bytes, int to_backend)
{
    if (c->stage.copy)
        return c->stage.copy(c->stage.ud, dst, src, bytes, to_backend);
    return c->ops->mem_copy(c, dst, src, bytes, to_backend);
}

// ----------------------------------------------------------------------------
// groups

int wrk_coll_group_create(wrk_coll_t *c, const char *name, uint32_t id, const uint32_t *ranks,
                          uint32_t n, wrk_coll_group_t **out)
{
    *out = NULL;
    if (n == 0 || id > WRK_COLL_GROUP_ID_MAX || !name)
        return -EINVAL;
    int rc = check_aborted(c);
    if (rc)
        return rc;
    wrk_coll_group_t *g = calloc(1, sizeof *g);
    if (!g)
        return -ENOMEM;
    g->c = c;
    g->id = id;
    g->n = n;
    g->me = UINT32_MAX;
    snprintf(g->name, sizeof g->name, "%s", name);
    atomic_init(&g->failed, 0);
    g->ranks = malloc(n * sizeof *g->ranks);
    g->p2p_sent = calloc(n, sizeof *g->p2p_sent);
    g->p2p_recvd = calloc(n, sizeof *g->p2p_recvd);
    if (!g->ranks || !g->p2p_sent || !g->p2p_recvd) {
        rc = -ENOMEM;
        goto fail;
    }
    for (uint32_t i = 0; i < n; i++) {
        if (ranks[i] >= c->world_size) {
            rc = -EINVAL;
            goto fail;
        }
        for (uint32_t j = 0; j < i; j++)
            if (ranks[j] == ranks[i]) {
                rc = -EINVAL;
                goto fail;
            }
        g->ranks[i] = ranks[i];
        if (ranks[i] == c->rank)
            g->me = i;
    }
    if (g->me == UINT32_MAX) {
        rc = -EINVAL;
        goto fail;
    }
    rc = c->ops->group_init(g, c->timeout_ms);
    if (rc < 0)
        goto fail;
    c->ngroups++;
    *out = g;
    return 0;
fail:
    free(g->p2p_recvd);
    free(g->p2p_sent);
    free(g->ranks);
    free(g);
    return rc;
}

int wrk_coll_group_layout(wrk_coll_t *c, ch_layout_t l, wrk_coll_group_kind_t kind,
                          wrk_coll_group_t **out)
{
    *out = NULL;
    uint32_t world = ch_layout_world(l);
    if (world != c->world_size || l.tp == 0 || l.pp == 0 || l.dp == 0)
        return -EINVAL;
    uint32_t *ranks = malloc(world * sizeof *ranks);
    if (!ranks)
        return -ENOMEM;
    uint32_t n = 0;
    const char *name = NULL;
    switch (kind) {
    case WRK_COLL_GROUP_WORLD:
        for (n = 0; n < world; n++)
            ranks[n] = n;
        name = "world";
        break;
    case WRK_COLL_GROUP_TP:
        ch_layout_tp_group(l, c->rank, ranks);
        n = l.tp;
        name = "tp";
        break;
    case WRK_COLL_GROUP_DP:
        ch_layout_dp_group(l, c->rank, ranks);
        n = l.dp;
        name = "dp";
        break;
    case WRK_COLL_GROUP_PP:
        ch_layout_pp_group(l, c->rank, ranks);
        n = l.pp;
        name = "pp";
        break;
    case WRK_COLL_GROUP_EMB: {
        ch_layout_pp_group(l, c->rank, ranks);
        uint32_t stage = ch_layout_coord(l, c->rank).pp;
        if (stage != 0 && stage != l.pp - 1) {
            free(ranks);
            return 0;
        }
        ranks[1] = ranks[l.pp - 1];
        n = l.pp > 1 ? 2 : 1;
        name = "emb";
        break;
    }
    default:
        free(ranks);
        return -EINVAL;
    }
    int rc = wrk_coll_group_create(c, name, (uint32_t)kind, ranks, n, out);
    free(ranks);
    return rc;
}

void wrk_coll_group_destroy(wrk_coll_group_t *g)
{
    if (!g)
        return;
    g->c->ops->group_fini(g);
    g->c->ngroups--;
    free(g->p2p_recvd);
    free(g->p2p_sent);
    free(g->ranks);
    free(g);
}

uint32_t wrk_coll_group_size(const wrk_coll_group_t *g)
{
    return g->n;
}

uint32_t wrk_coll_group_index(const wrk_coll_group_t *g)
{
    return g->me;
}

uint32_t wrk_coll_group_rank(const wrk_coll_group_t *g, uint32_t index)
{
    return index < g->n ? g->ranks[index] : UINT32_MAX;
}

const char *wrk_coll_group_name(const wrk_coll_group_t *g)
{
    return g->name;
}

wrk_coll_t *wrk_coll_group_context(const wrk_coll_group_t *g)
{
    return g->c;
}

const char *wrk_coll_group_transport(const wrk_coll_group_t *g)
{
    return g->c->ops->transport ? g->c->ops->transport(g) : g->c->ops->name;
}

// ----------------------------------------------------------------------------
// requests

/* SENDRECV's checks on top of check_args's (the send half's): the receive half's. */
static int check_recv_half(const wrk_coll_group_t *g, const wrk_coll_args_t *a)
{
    if (a->rpeer >= g->n || a->rpeer == g->me)
        return -EINVAL;
    if (a->rcount > SIZE_MAX / wrk_coll_dtype_size(a->dt))
        return -EOVERFLOW;
    return a->rcount && !a->recvbuf ? -EINVAL : 0;
}

static int check_args(const wrk_coll_group_t *g, const wrk_coll_args_t *a)
{
    size_t esz = wrk_coll_dtype_size(a->dt);
    if (esz == 0)
        return -EINVAL;
    int reduces = a->kind == WRK_COLL_OP_ALLREDUCE || a->kind == WRK_COLL_OP_REDUCE_SCATTER;
    int reducible = a->dt == WRK_COLL_F32 || a->dt == WRK_COLL_BF16;
    if (reduces && (!reducible || (a->op != WRK_COLL_SUM && a->op != WRK_COLL_MAX)))
        return -EINVAL;
    size_t total = a->count;
    if (a->kind == WRK_COLL_OP_REDUCE_SCATTER || a->kind == WRK_COLL_OP_ALLGATHER) {
        if (a->count > SIZE_MAX / esz / g->n)
            return -EOVERFLOW;
        total = a->count * g->n;
    }
    if (total > SIZE_MAX / esz)
        return -EOVERFLOW;
    if (a->kind == WRK_COLL_OP_SENDRECV) {
        if (a->peer >= g->n || a->peer == g->me || (a->count && !a->sendbuf))
            return -EINVAL;
        return check_recv_half(g, a);
    }
    int p2p = a->kind == WRK_COLL_OP_SEND || a->kind == WRK_COLL_OP_RECV;
    if ((p2p || a->kind == WRK_COLL_OP_BROADCAST) && a->peer >= g->n)
        return -EINVAL;
    if (p2p && a->peer == g->me)
        return -EINVAL;
    int needs_send = a->kind != WRK_COLL_OP_RECV && a->kind != WRK_COLL_OP_BROADCAST &&
                     a->kind != WRK_COLL_OP_BARRIER;
    int needs_recv = a->kind != WRK_COLL_OP_SEND && a->kind != WRK_COLL_OP_BARRIER;
    if (a->count && ((needs_send && !a->sendbuf) || (needs_recv && !a->recvbuf)))
        return -EINVAL;
    return 0;
}

/* The message bytes of a (checked) operation: wrk_coll_group_bytes. */
static uint64_t message_bytes(const wrk_coll_group_t *g, const wrk_coll_args_t *a)
{
    size_t esz = wrk_coll_dtype_size(a->dt), n = a->count;
    if (a->kind == WRK_COLL_OP_REDUCE_SCATTER || a->kind == WRK_COLL_OP_ALLGATHER)
        n *= g->n;
    else if (a->kind == WRK_COLL_OP_SENDRECV)
        n += a->rcount;
    else if (a->kind == WRK_COLL_OP_BARRIER)
        n = 0;
    return (uint64_t)n * esz;
}

/* Start a request; with out == NULL run it to completion (blocking form). */
static int start(wrk_coll_group_t *g, const wrk_coll_args_t *a, wrk_coll_req_t **out)
{
    if (out)
        *out = NULL;
    wrk_coll_t *c = g->c;
    int rc = check_args(g, a);
    if (rc < 0)
        return rc;
    rc = check_aborted(c);
    if (rc)
        return rc;
    wrk_coll_req_t *r = calloc(1, sizeof *r);
    if (!r)
        return -ENOMEM;
    r->g = g;
    r->a = *a;
    r->rc = 1;
    if (a->kind != WRK_COLL_OP_SEND && a->kind != WRK_COLL_OP_RECV &&
        a->kind != WRK_COLL_OP_SENDRECV)
        g->entered++;
    g->bytes[a->kind] += message_bytes(g, a);
    rc = wrk_coll_front_start(r);
    if (rc < 0) {
        free(r);
        return rc;
    }
    c->nreqs++;
    if (out) {
        *out = r;
        return 0;
    }
    rc = wrk_coll_wait(r, -1);
    wrk_coll_req_free(r);
    return rc;
}

int wrk_coll_send(wrk_coll_group_t *g, const void *buf, size_t count, wrk_coll_dtype_t dt,
                  uint32_t peer, wrk_coll_req_t **req)
{
    wrk_coll_args_t a = {
        .kind = WRK_COLL_OP_SEND, .sendbuf = buf, .count = count, .dt = dt, .peer = peer};
    return start(g, &a, req);
}

int wrk_coll_recv(wrk_coll_group_t *g, void *buf, size_t count, wrk_coll_dtype_t dt, uint32_t peer,
                  wrk_coll_req_t **req)
{
    wrk_coll_args_t a = {
        .kind = WRK_COLL_OP_RECV, .recvbuf = buf, .count = count, .dt = dt, .peer = peer};
    return start(g, &a, req);
}

int wrk_coll_sendrecv(wrk_coll_group_t *g, const void *sendbuf, size_t scount, uint32_t speer,
                      void *recvbuf, size_t rcount, uint32_t rpeer, wrk_coll_dtype_t dt,
                      wrk_coll_req_t **req)
{
    wrk_coll_args_t a = {.kind = WRK_COLL_OP_SENDRECV,
                         .sendbuf = sendbuf,
                         .recvbuf = recvbuf,
                         .count = scount,
                         .dt = dt,
                         .peer = speer,
                         .rcount = rcount,
                         .rpeer = rpeer};
    return start(g, &a, req);
}

int wrk_coll_allreduce(wrk_coll_group_t *g, const void *sendbuf, void *recvbuf, size_t count,
                       wrk_coll_dtype_t dt, wrk_coll_redop_t op, wrk_coll_req_t **req)
{
    wrk_coll_args_t a = {.kind = WRK_COLL_OP_ALLREDUCE,
                         .sendbuf = sendbuf,
                         .recvbuf = recvbuf,
                         .count = count,
                         .dt = dt,
                         .op = op};
    return start(g, &a, req);
}

int wrk_coll_reduce_scatter(wrk_coll_group_t *g, const void *sendbuf, void *recvbuf,
                            size_t recvcount, wrk_coll_dtype_t dt, wrk_coll_redop_t op,
                            wrk_coll_req_t **req)
{
    wrk_coll_args_t a = {.kind = WRK_COLL_OP_REDUCE_SCATTER,
                         .sendbuf = sendbuf,
                         .recvbuf = recvbuf,
                         .count = recvcount,
                         .dt = dt,
                         .op = op};
    return start(g, &a, req);
}

int wrk_coll_allgather(wrk_coll_group_t *g, const void *sendbuf, void *recvbuf, size_t sendcount,
                       wrk_coll_dtype_t dt, wrk_coll_req_t **req)
{
    wrk_coll_args_t a = {.kind = WRK_COLL_OP_ALLGATHER,
                         .sendbuf = sendbuf,
                         .recvbuf = recvbuf,
                         .count = sendcount,
                         .dt = dt};
    return start(g, &a, req);
}

int wrk_coll_broadcast(wrk_coll_group_t *g, void *buf, size_t count, wrk_coll_dtype_t dt,
                       uint32_t root, wrk_coll_req_t **req)
{
    wrk_coll_args_t a = {.kind = WRK_COLL_OP_BROADCAST,
                         .sendbuf = buf,
                         .recvbuf = buf,
                         .count = count,
                         .dt = dt,
                         .peer = root};
    return start(g, &a, req);
}

// ----------------------------------------------------------------------------
// reductions (both backends' CPU paths): out = a op b, elementwise

static float max_f32(float a, float b)
{
    if (isnan(a) || isnan(b))
        return NAN;
    if (a == b) /* +0 and -0: the same answer whichever comes first */
        return signbit(a) ? b : a;
    return a > b ? a : b;
}

/* 8 floats at a time with GCC/Clang vector extensions: the build's -O2 does not vectorize
 * this loop by itself. Loads go through memcpy (unaligned is fine), and both operands are
 * loaded before the store, so out may be a or b. Elementwise, so the bits do not depend on
 * the vector width. */
typedef float v8f __attribute__((vector_size(32)));

static void reduce_sum(float *out, const float *a, const float *b, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        v8f x, y;
        memcpy(&x, a + i, sizeof x);
        memcpy(&y, b + i, sizeof y);
        x += y;
        memcpy(out + i, &x, sizeof x);
    }
    for (; i < n; i++)
        out[i] = a[i] + b[i];
}

/* bf16: both operands widen exactly, the fp32 sum or maximum rounds once to bf16 (RNE, NaN
 * quiet): out = round(a + b), what NCCL's ncclBfloat16 sum (__hadd) and PyTorch give. */
static void reduce_bf16(wrk_coll_redop_t op, kn_bf16_t *out, const kn_bf16_t *a, const kn_bf16_t *b,
                        size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float x = kn_f32_from_bf16(a[i]), y = kn_f32_from_bf16(b[i]);
        out[i] = kn_bf16_from_f32(op == WRK_COLL_MAX ? max_f32(x, y) : x + y);
    }
}

void wrk_coll_reduce(wrk_coll_redop_t op, wrk_coll_dtype_t dt, void *out, const void *a,
                     const void *b, size_t n)
{
    if (dt == WRK_COLL_BF16) {
        reduce_bf16(op, out, a, b, n);
    } else if (op == WRK_COLL_MAX) {
        float *o = out;
        const float *x = a, *y = b;
        for (size_t i = 0; i < n; i++)
            o[i] = max_f32(x[i], y[i]);
    } else {
        reduce_sum(out, a, b, n);
    }
}

int wrk_coll_barrier(wrk_coll_group_t *g, wrk_coll_req_t **req)
{
    wrk_coll_args_t a = {.kind = WRK_COLL_OP_BARRIER, .dt = WRK_COLL_U8};
    return start(g, &a, req);
}

/* One step of the wait loop: progress, then look at req. 0 done, 1 pending, < 0 failed.
 * *moved tells whether the backend did anything. */
static int poll_once(wrk_coll_req_t *r, int *moved)
{
    wrk_coll_t *c = r->g->c;
    *moved = 0;
    if (r->rc <= 0)
        return r->rc;
    int rc = check_aborted(c);
    if (rc) {
        r->rc = rc;
        return rc;
    }
    *moved = c->ops->progress(c) > 0;
    rc = wrk_coll_front_test(r);
    if (rc <= 0)
        r->rc = rc;
    if (rc < 0) {
        CH_LOGD("coll", "rank %u: %s %s failed: %s", c->rank, r->g->name,
                wrk_coll_op_name(r->a.kind), ch_strerror(rc));
        /* A member that failed a collective cannot take part in the next one. */
        wrk_coll_abort(c);
        check_aborted(c);
    }
    return rc;
}

int wrk_coll_test(wrk_coll_req_t *req, int *done)
{
    int moved;
    int rc = poll_once(req, &moved);
    *done = rc == 0;
    return rc < 0 ? rc : 0;
}

/* Remember the first timeout and whom it waited for: the peer of a send/recv, the root
 * of a broadcast, else the ring predecessor, whose data reaches this member first. */
static void note_timeout(const wrk_coll_req_t *req)
{
    wrk_coll_t *c = req->g->c;
    const wrk_coll_group_t *g = req->g;
    if (c->timeout_group[0])
        return;
    uint32_t idx = (g->me + g->n - 1) % g->n;
    if (req->a.kind == WRK_COLL_OP_SEND || req->a.kind == WRK_COLL_OP_RECV ||
        req->a.kind == WRK_COLL_OP_SENDRECV ||
        (req->a.kind == WRK_COLL_OP_BROADCAST && req->a.peer != g->me))
        idx = req->a.peer;
    snprintf(c->timeout_group, sizeof(c->timeout_group), "%s", g->name);
    c->timeout_peer = g->ranks[idx];
    c->timeout_seq = g->entered;
}

int wrk_coll_timed_out(const wrk_coll_t *c, const char **group, uint32_t *peer)
{
    if (!c || !c->timeout_group[0])
        return 0;
    *group = c->timeout_group;
    *peer = c->timeout_peer;
    return 1;
}

uint64_t wrk_coll_group_entered(const wrk_coll_group_t *g)
{
    return g ? g->entered : 0;
}

uint64_t wrk_coll_timeout_seq(const wrk_coll_t *c)
{
    return c ? c->timeout_seq : 0;
}

uint64_t wrk_coll_group_wait_ns(const wrk_coll_group_t *g)
{
    return g ? g->wait_ns : 0;
}

uint64_t wrk_coll_group_device_ns(const wrk_coll_group_t *g)
{
    return g ? g->device_ns : 0;
}

uint64_t wrk_coll_group_bytes(const wrk_coll_group_t *g, wrk_coll_op_kind_t kind)
{
    return g && (unsigned)kind < sizeof g->bytes / sizeof g->bytes[0] ? g->bytes[kind] : 0;
}

/* Poll req to completion on the host (wrk_coll_wait without the count). */
static int host_wait(wrk_coll_req_t *req, int timeout_ms)
{
    wrk_coll_t *c = req->g->c;
    if (timeout_ms < 0)
        timeout_ms = c->timeout_ms;
    uint64_t deadline = ch_now_ms() + (uint64_t)timeout_ms, t0 = ch_now_ns();
    int idle = 0;
    for (unsigned iter = 1;; iter++) {
        int moved;
        int rc = poll_once(req, &moved);
        if (rc <= 0) {
            req->g->wait_ns += ch_now_ns() - t0;
            return rc;
        }
        idle = moved ? 0 : idle + 1;
        if ((iter % 64 == 0 || idle >= IDLE_SPINS_BEFORE_YIELD) && ch_now_ms() >= deadline) {
            CH_LOGW("coll", "rank %u: %s %s timed out after %d ms; aborting", c->rank, req->g->name,
                    wrk_coll_op_name(req->a.kind), timeout_ms);
            note_timeout(req);
            wrk_coll_abort(c);
            check_aborted(c);
            req->rc = -ETIMEDOUT;
            req->g->wait_ns += ch_now_ns() - t0;
            return -ETIMEDOUT;
        }
        if (idle >= IDLE_SPINS_BEFORE_YIELD)
            sched_yield();
    }
}

int wrk_coll_wait(wrk_coll_req_t *req, int timeout_ms)
{
    req->g->c->host_waits++;
    return host_wait(req, timeout_ms);
}

int wrk_coll_wait_stream(wrk_coll_req_t *req, int timeout_ms)
{
    wrk_coll_t *c = req->g->c;
    int composed = req->part[0] != NULL || req->part[1] != NULL;
    if (req->rc <= 0 || composed || c->ops->wait_stream == NULL)
        return wrk_coll_wait(req, timeout_ms);
    int rc = check_aborted(c);
    if (rc) {
        req->rc = rc;
        return rc;
    }
    rc = c->ops->wait_stream(req);
    if (rc < 0) {
        req->rc = rc;
        wrk_coll_abort(c); /* as a failed test: the members cannot go on consistently */
        check_aborted(c);
        return rc;
    }
    c->stream_waits++;
    if (rc == 1) /* the fake's device is the host */
        return host_wait(req, timeout_ms);
    req->rc = 0; /* done as far as the host is concerned: the stream holds the order */
    return 0;
}

int wrk_coll_ordered(int started, wrk_coll_req_t **req)
{
    int rc = started;
    if (rc == 0 && *req)
        rc = wrk_coll_wait_stream(*req, -1);
    wrk_coll_req_free(*req);
    *req = NULL;
    return rc;
}

int wrk_coll_settle(wrk_coll_t *c, int timeout_ms)
{
    if (c == NULL || c->ops->settle == NULL)
        return 0;
    int rc = check_aborted(c);
    if (rc)
        return rc;
    if (timeout_ms < 0)
        timeout_ms = c->timeout_ms;
    uint64_t deadline = ch_now_ms() + (uint64_t)timeout_ms;
    for (int first = 1;; first = 0) {
        rc = c->ops->settle(c, first);
        if (rc <= 0)
            break;
        if (ch_now_ms() >= deadline) {
            CH_LOGW("coll", "rank %u: collectives not settled after %d ms; aborting", c->rank,
                    timeout_ms);
            rc = -ETIMEDOUT;
            break;
        }
        sched_yield();
    }
    if (rc < 0) { /* the members cannot go on consistently */
        wrk_coll_abort(c);
        check_aborted(c);
    }
    return rc;
}

void wrk_coll_wait_counts(const wrk_coll_t *c, uint64_t *host, uint64_t *stream)
{
    if (host)
        *host = c ? c->host_waits : 0;
    if (stream)
        *stream = c ? c->stream_waits : 0;
}

void wrk_coll_req_free(wrk_coll_req_t *req)
{
    if (!req)
        return;
    wrk_coll_t *c = req->g->c;
    if (req->rc > 0) {
        CH_LOGW("coll", "rank %u: freeing a pending %s request; aborting", c->rank, req->g->name);
        wrk_coll_abort(c);
        check_aborted(c);
    }
    wrk_coll_front_fini(req);
    c->nreqs--;
    free(req);
}
