/* UCX backend of the collectives (coll.h): host memory, UCP tag API. This file: context,
 * endpoints, messages, operations, same-host setup; the algorithms are in coll_ucx_algo.c.
 *
 * Theory of operation
 * - One ucp context + worker per rank, single-threaded. The worker address is published
 *   under "ucx/<rank>" behind a small header (host identity, pid); endpoints are created
 *   when a group needs them (all members of groups up to CH_UCX_PRECONNECT_MAX, else on first use).
 * - Peer failure. Endpoints to other hosts use UCP_ERR_HANDLING_MODE_PEER, so a dead peer
 *   turns into an endpoint error. UCX 1.13's shared-memory transports do not support that
 *   mode (asking for it silently falls back to TCP, ~20x slower), so endpoints to the same
 *   host use mode NONE and the waiting thread checks every CH_UCX_LIVENESS_MS that those peers'
 *   processes still exist. A failed peer fails every operation of every group holding it
 *   (CH_E_ABORTED); the wait timeout catches everything else (a hung peer, a peer thread).
 * - Nothing progresses in the background: the thread that tests or waits drives
 *   ucp_worker_progress and then advances every active operation, so waiting on one
 *   request moves all of them.
 * - A tag names one message: group id | sender's world rank | (collective sequence number,
 *   unit) or (p2p flag, per-pair count). Receives match all 64 bits, so messages of
 *   different groups, operations and steps never cross.
 * - Two message engines (coll_ucx_algo.c). "rounds": a short list of exchanges done one
 *   after another (recursive doubling allreduce, binomial broadcast, dissemination barrier,
 *   p2p): latency-optimal for small messages. "pipe": a ring (or, for broadcast, a chain)
 *   cut into segments with up to CH_UCX_WINDOW segments in flight each way, so copying, reducing
 *   and transfer overlap: bandwidth-optimal for large messages.
 * - Transports are UCX's choice (UCX_TLS etc. apply), with one exception: a job whose ranks
 *   all run on this host (LOCAL_WORLD_SIZE == WORLD_SIZE) and whose user left UCX_TLS unset
 *   gets shared memory without CMA (pick_transports). UCX would otherwise move large
 *   messages by process_vm_readv, which on the paravirtualised CI machines collapses when
 *   both ranks copy at once.
 * - Groups whose members all run on this host (up to WRK_SHM_MAX_MEMBERS) move the data of
 *   allreduce, reduce_scatter, allgather and broadcast through a shared segment instead
 *   (coll_shm.h): UCX's shared-memory transport copies every byte twice, into its FIFO and
 *   out, while the segment lets each member reduce its block straight from the others'
 *   staged pieces. Set up when the group is created (shm_setup); CHORUS_COLL_SHM=0 turns it
 *   off. p2p and barrier stay on UCX.
 * - Fixed reduction order: in the ring each block is accumulated along the ring starting
 *   at a fixed member, then copied to the others; in recursive doubling both partners add
 *   the same two values (IEEE addition is commutative). Same size + same group => the same
 *   bits on every member, every run. */
#include "workerd/coll/coll_ucx.h"

#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/err.h"
#include "common/log.h"
#include "common/util.h"

#define CH_UCX_PRECONNECT_MAX 64
#define CH_UCX_SCRATCH_POOL   8
#define CH_UCX_CLOSE_WAIT_MS  1000
#define CH_UCX_LIVENESS_MS    100
#define CH_UCX_ADDR_MAGIC     0x43485558u /* "CHUX" */
#define CH_UCX_HOST_ID_LEN    80
#define CH_UCX_LOCAL_TLS      "posix,sysv,self" /* see pick_transports */

#define CH_UCX_TAG_WORLD_BITS 20

typedef struct peer {
    ucx_ctx_t *u;
    uint32_t rank;
    ucp_ep_h ep;
    int failed;
    int local; /* same host and pid namespace: liveness by pid */
    int gone;  /* its process was found gone (check_liveness) */
    pid_t pid;
} peer_t;

/* What "ucx/<rank>" holds: this header, then the worker address. */
typedef struct addr_hdr {
    uint32_t magic;
    int32_t pid;
    char host[CH_UCX_HOST_ID_LEN]; /* boot id + pid namespace: equal <=> pids are comparable */
} addr_hdr_t;

typedef struct scratch {
    void *p;
    size_t cap;
} scratch_t;

/* Memory a failed operation may still receive into: freed after the worker is gone. */
typedef struct parked {
    struct parked *next;
    void *p;
} parked_t;

struct ucx_ctx {
    wrk_coll_t *c;
    ucp_context_h ctx;
    ucp_worker_h worker;
    peer_t *peers; /* world_size */
    ucx_op_t *active;
    wrk_coll_group_t **groups;
    size_t ngroups, groups_cap;
    scratch_t pool[CH_UCX_SCRATCH_POOL];
    parked_t *parked;
    char host[CH_UCX_HOST_ID_LEN];
    pid_t pid;
    uint64_t last_liveness_ms;
    int shm_enabled;    /* CHORUS_COLL_SHM is not "0" */
    wrk_shm_reg_t *reg; /* wrk_coll_mem_alloc's memory, for same-host zero-copy */
};

/* The one UCX -> Chorus error conversion. */
static int ucx_err(ucs_status_t st)
{
    switch (st) {
    case UCS_OK:
        return 0;
    case UCS_ERR_CANCELED: /* our abort */
    /* the peer is gone or unreachable (shared-memory peers report a vanished segment) */
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_ENDPOINT_TIMEOUT:
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_REJECTED:
    case UCS_ERR_NOT_CONNECTED:
    case UCS_ERR_SHMEM_SEGMENT:
    case UCS_ERR_IO_ERROR:
        return CH_E_ABORTED;
    case UCS_ERR_TIMED_OUT:
        return -ETIMEDOUT;
    case UCS_ERR_NO_MEMORY:
        return -ENOMEM;
    case UCS_ERR_MESSAGE_TRUNCATED:
        return -EMSGSIZE;
    case UCS_ERR_INVALID_PARAM:
        return -EINVAL;
    default:
        CH_LOGE("coll", "ucx: %s", ucs_status_string(st));
        return CH_E_UCX;
    }
}

// ----------------------------------------------------------------------------
// scratch buffers, reused so large operations do not fault in fresh pages every time

/* The smallest pooled buffer of at least len bytes, else a new one; *cap: its size. */
void *wrk_ucx_scratch_get(ucx_ctx_t *u, size_t len, size_t *cap)
{
    int best = -1;
    for (int i = 0; i < CH_UCX_SCRATCH_POOL; i++)
        if (u->pool[i].p && u->pool[i].cap >= len &&
            (best < 0 || u->pool[i].cap < u->pool[best].cap))
            best = i;
    if (best >= 0) {
        void *p = u->pool[best].p;
        *cap = u->pool[best].cap;
        u->pool[best].p = NULL;
        return p;
    }
    *cap = (len + 63) & ~(size_t)63;
    return aligned_alloc(64, *cap);
}

/* Back to the pool; when it is full the smallest buffer goes. */
static void scratch_put(ucx_ctx_t *u, void *p, size_t cap)
{
    if (!p)
        return;
    int slot = 0;
    for (int i = 0; i < CH_UCX_SCRATCH_POOL; i++) {
        if (!u->pool[i].p) {
            slot = i;
            break;
        }
        if (u->pool[i].cap < u->pool[slot].cap)
            slot = i;
    }
    if (u->pool[slot].p && u->pool[slot].cap >= cap) {
        free(p);
        return;
    }
    free(u->pool[slot].p);
    u->pool[slot].p = p;
    u->pool[slot].cap = cap;
}

static void park(ucx_ctx_t *u, void *p)
{
    if (!p)
        return;
    parked_t *k = malloc(sizeof *k);
    if (!k) {
        /* Cannot track it: leaking is safer than freeing memory UCX may write to. */
        CH_LOGW("coll", "rank %u: leaking a scratch buffer of a failed operation", u->c->rank);
        return;
    }
    k->p = p;
    k->next = u->parked;
    u->parked = k;
}

// ----------------------------------------------------------------------------
// endpoints and messages

static void on_peer_error(void *arg, ucp_ep_h ep, ucs_status_t st)
{
    peer_t *pe = arg;
    ucx_ctx_t *u = pe->u;
    if (!pe->failed)
        CH_LOGW("coll", "rank %u: peer %u failed: %s", u->c->rank, pe->rank, ucs_status_string(st));
    pe->failed = 1;
    for (size_t i = 0; i < u->ngroups; i++) {
        wrk_coll_group_t *g = u->groups[i];
        for (uint32_t j = 0; j < g->n; j++)
            if (g->ranks[j] == pe->rank)
                atomic_store(&g->failed, 1);
    }
}

static int get_ep(ucx_ctx_t *u, uint32_t rank, ucp_ep_h *out)
{
    peer_t *pe = &u->peers[rank];
    if (pe->failed)
        return CH_E_ABORTED;
    if (pe->ep) {
        *out = pe->ep;
        return 0;
    }
    char key[32];
    snprintf(key, sizeof key, "ucx/%u", rank);
    void *val = NULL;
    size_t len = 0;
    int rc = u->c->rdzv.get(u->c->rdzv.ud, key, u->c->timeout_ms, &val, &len);
    if (rc < 0) {
        CH_LOGE("coll", "rank %u: no address for rank %u: %s", u->c->rank, rank, ch_strerror(rc));
        return rc;
    }
    addr_hdr_t h;
    if (len <= sizeof h) {
        free(val);
        return CH_E_FORMAT;
    }
    memcpy(&h, val, sizeof h);
    if (h.magic != CH_UCX_ADDR_MAGIC || memchr(h.host, 0, sizeof h.host) == NULL) {
        free(val);
        return CH_E_FORMAT;
    }
    pe->local = strcmp(h.host, u->host) == 0;
    pe->pid = h.pid;
    ucp_ep_params_t ep = {
        .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER,
        .address = (const ucp_address_t *)((const char *)val + sizeof h),
        .err_mode = pe->local ? UCP_ERR_HANDLING_MODE_NONE : UCP_ERR_HANDLING_MODE_PEER,
        .err_handler = {.cb = on_peer_error, .arg = pe},
    };
    rc = ucx_err(ucp_ep_create(u->worker, &ep, &pe->ep));
    free(val);
    if (rc < 0)
        return rc;
    *out = pe->ep;
    return 0;
}

/* Identity of this host and pid namespace. */
static void host_id(char *out, size_t len)
{
    char boot[64] = "", ns[64] = "";
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        if (!fgets(boot, sizeof boot, f))
            boot[0] = 0;
        fclose(f);
        boot[strcspn(boot, "\n")] = 0;
    }
    if (!boot[0] && gethostname(boot, sizeof boot - 1) != 0)
        snprintf(boot, sizeof boot, "unknown");
    ssize_t n = readlink("/proc/self/ns/pid", ns, sizeof ns - 1);
    ns[n > 0 ? n : 0] = 0;
    snprintf(out, len, "%s/%s", boot, ns);
}

static uint64_t tag_of(const wrk_coll_group_t *g, uint32_t sender, uint32_t low)
{
    return ((uint64_t)g->id << (32 + CH_UCX_TAG_WORLD_BITS)) | ((uint64_t)sender << 32) | low;
}

uint32_t wrk_ucx_coll_low(uint32_t seq, uint32_t unit)
{
    return ((seq & 0xfffu) << CH_UCX_TAG_UNIT_BITS) | unit;
}

int wrk_ucx_post_send(ucx_op_t *o, uint32_t peer, const void *buf, size_t len, uint32_t low,
                      void **req)
{
    wrk_coll_group_t *g = o->r->g;
    ucx_ctx_t *u = g->c->be;
    ucp_ep_h ep;
    int rc = get_ep(u, g->ranks[peer], &ep);
    if (rc < 0)
        return rc;
    ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE,
                               .datatype = ucp_dt_make_contig(1)};
    ucs_status_ptr_t s = ucp_tag_send_nbx(ep, buf, len, tag_of(g, g->c->rank, low), &prm);
    if (UCS_PTR_IS_ERR(s))
        return ucx_err(UCS_PTR_STATUS(s));
    *req = s;
    return 0;
}

int wrk_ucx_post_recv(ucx_op_t *o, uint32_t peer, void *buf, size_t len, uint32_t low, void **req)
{
    wrk_coll_group_t *g = o->r->g;
    ucx_ctx_t *u = g->c->be;
    if (u->peers[g->ranks[peer]].failed)
        return CH_E_ABORTED;
    /* Always a request (no immediate completion): its length is checked in req_poll. */
    ucp_request_param_t prm = {.op_attr_mask =
                                   UCP_OP_ATTR_FIELD_DATATYPE | UCP_OP_ATTR_FLAG_NO_IMM_CMPL,
                               .datatype = ucp_dt_make_contig(1)};
    ucs_status_ptr_t s =
        ucp_tag_recv_nbx(u->worker, buf, len, tag_of(g, g->ranks[peer], low), ~0ull, &prm);
    if (UCS_PTR_IS_ERR(s))
        return ucx_err(UCS_PTR_STATUS(s));
    *req = s;
    return 0;
}

/* 0 finished (request released), 1 in flight, < 0 failed (released). */
int wrk_ucx_req_poll(void **req, size_t expect_len, int is_recv)
{
    if (!*req)
        return 0;
    ucs_status_t st = ucp_request_check_status(*req);
    if (st == UCS_INPROGRESS)
        return 1;
    int rc = ucx_err(st);
    if (rc == 0 && is_recv) {
        ucp_tag_recv_info_t info;
        if (ucp_tag_recv_request_test(*req, &info) == UCS_OK && info.length != expect_len)
            rc = -EPROTO;
    }
    ucp_request_free(*req);
    *req = NULL;
    return rc;
}

/* Give up on a request: a receive is cancelled (it may still complete if already
 * matched); a send is released to UCX, which finishes or fails it on its own. */
static void req_drop(ucx_ctx_t *u, void **req, int is_recv)
{
    if (!*req)
        return;
    if (is_recv && ucp_request_check_status(*req) == UCS_INPROGRESS)
        ucp_request_cancel(u->worker, *req);
    ucp_request_free(*req);
    *req = NULL;
}

// ----------------------------------------------------------------------------
// operations: the active list, liveness of same-host peers, start / progress / free

static void op_unlink(ucx_ctx_t *u, ucx_op_t *o)
{
    if (o->prev)
        o->prev->next = o->next;
    else if (u->active == o)
        u->active = o->next;
    if (o->next)
        o->next->prev = o->prev;
    o->prev = o->next = NULL;
}

/* 1 when the operation moved (finished, or copied through shared memory). */
static int op_advance(ucx_ctx_t *u, ucx_op_t *o)
{
    if (o->rc <= 0)
        return 0;
    int moved = 0;
    int rc = o->is_shm    ? wrk_shm_op_advance(o->r->g->be, &o->shm, &moved)
             : o->is_pipe ? wrk_ucx_pipe_advance(o)
                          : wrk_ucx_rounds_advance(o);
    if (rc > 0 && atomic_load(&o->r->g->failed))
        rc = CH_E_ABORTED;
    if (rc <= 0) {
        o->rc = rc;
        op_unlink(u, o);
        moved = 1;
    }
    return moved;
}

/* How many operations moved. */
static int advance_all(ucx_ctx_t *u)
{
    int moved = 0;
    for (ucx_op_t *o = u->active, *next; o; o = next) {
        next = o->next;
        moved += op_advance(u, o);
    }
    return moved;
}

/* A process that no longer runs: gone, or a zombie its parent has not reaped yet. */
static int proc_gone(pid_t pid)
{
    if (kill(pid, 0) < 0)
        return errno == ESRCH;
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *p = strrchr(buf, ')'); /* "pid (comm) S ...": comm may hold anything */
    return p && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X');
}

/* Same-host peers have no UCX failure detection (see the top): look at their processes.
 * A peer that exits right after its last message is not a failure of what that message
 * completes: whatever it sent before dying is drained and delivered first. */
static void check_liveness(ucx_ctx_t *u)
{
    uint64_t now = ch_now_ms();
    if (now - u->last_liveness_ms < CH_UCX_LIVENESS_MS)
        return;
    u->last_liveness_ms = now;
    int dead = 0;
    for (uint32_t i = 0; i < u->c->world_size; i++) {
        peer_t *pe = &u->peers[i];
        pe->gone = pe->ep && pe->local && !pe->failed && pe->pid != u->pid && proc_gone(pe->pid);
        dead |= pe->gone;
    }
    if (!dead)
        return;
    while (ucp_worker_progress(u->worker))
        ;
    advance_all(u);
    for (uint32_t i = 0; i < u->c->world_size; i++)
        if (u->peers[i].gone)
            on_peer_error(&u->peers[i], u->peers[i].ep, UCS_ERR_CONNECTION_RESET);
}

static int ucx_start(wrk_coll_req_t *r)
{
    wrk_coll_group_t *g = r->g;
    ucx_ctx_t *u = g->c->be;
    ucx_op_t *o = calloc(1, sizeof *o);
    if (!o)
        return -ENOMEM;
    o->r = r;
    o->rc = 1;
    r->be = o;
    int p2p = r->a.kind == WRK_COLL_OP_SEND || r->a.kind == WRK_COLL_OP_RECV;
    if (!p2p)
        o->seq = g->seq++;
    size_t e = wrk_coll_dtype_size(r->a.dt);
    int trivial = !p2p && (g->n == 1 || (r->a.count == 0 && r->a.kind != WRK_COLL_OP_BARRIER));
    if (trivial) {
        /* Alone, or nothing to move: only the local part of the result. */
        const wrk_coll_args_t *a = &r->a;
        size_t bytes = a->count * e;
        if (bytes == 0)
            ;
        else if (a->kind == WRK_COLL_OP_ALLGATHER)
            memmove((char *)a->recvbuf + (size_t)g->me * bytes, a->sendbuf, bytes);
        else if (a->kind != WRK_COLL_OP_BROADCAST && a->kind != WRK_COLL_OP_BARRIER)
            memmove(a->recvbuf,
                    (const char *)a->sendbuf +
                        (a->kind == WRK_COLL_OP_REDUCE_SCATTER ? (size_t)g->me * bytes : 0),
                    bytes);
        o->rc = 0;
        return 0;
    }
    int rc = wrk_ucx_build(u, o);
    if (rc < 0) {
        free(o->rounds);
        scratch_put(u, o->scratch, o->scratch_cap);
        free(o);
        r->be = NULL;
        return rc;
    }
    o->next = u->active;
    if (u->active)
        u->active->prev = o;
    u->active = o;
    op_advance(u, o); /* post the first messages now: they move while the caller computes */
    return 0;
}

static int ucx_progress(wrk_coll_t *c)
{
    ucx_ctx_t *u = c->be;
    int moved = 0;
    for (int i = 0; i < 8 && ucp_worker_progress(u->worker); i++)
        moved = 1;
    if (advance_all(u))
        moved = 1;
    if (u->active)
        check_liveness(u);
    return moved;
}

static int ucx_test(wrk_coll_req_t *r)
{
    ucx_op_t *o = r->be;
    return o->rc;
}

static void op_free(ucx_ctx_t *u, ucx_op_t *o)
{
    op_unlink(u, o);
    req_drop(u, &o->sreq, 0);
    req_drop(u, &o->rreq, 1);
    for (int i = 0; i < CH_UCX_WINDOW; i++) {
        req_drop(u, &o->p.sreq[i], 0);
        req_drop(u, &o->p.rreq[i], 1);
    }
    free(o->rounds);
    if (o->rc == 0)
        scratch_put(u, o->scratch, o->scratch_cap);
    else
        park(u, o->scratch); /* a cancelled receive may still land in it */
    o->r->be = NULL;
    free(o);
}

static void ucx_req_fini(wrk_coll_req_t *r)
{
    if (r->be)
        op_free(r->g->c->be, r->be);
}

// ----------------------------------------------------------------------------
// context and groups

/* 1 when the environment workerd gives a rank (rank.h) says every rank of the job runs on
 * this host: LOCAL_WORLD_SIZE == WORLD_SIZE == world_size. */
static int job_is_local(uint32_t world_size)
{
    const char *lw = getenv("LOCAL_WORLD_SIZE"), *w = getenv("WORLD_SIZE");
    char *end;
    if (!lw || !w || !*lw)
        return 0;
    unsigned long long n = strtoull(lw, &end, 10);
    return *end == 0 && n == world_size && strcmp(lw, w) == 0;
}

/* Transports: UCX's choice, except for a job that runs entirely on this host and whose user
 * did not pick (UCX_TLS unset): shared memory without CMA. UCX sends large messages between
 * processes of one host by process_vm_readv, which on paravirtualised machines collapses
 * when both sides copy at once (64 MiB allreduce, 2 ranks: ~1.4x the CPU time per call of
 * copying through the shared-memory FIFO, and up to 2x the wall time). Set on the config
 * object, not the environment, so it touches only this context. */
static int pick_transports(ucp_config_t *conf, uint32_t rank, uint32_t world_size)
{
    const char *tls = getenv("UCX_TLS");
    if (world_size < 2 || (tls && *tls) || !job_is_local(world_size))
        return 0;
    int rc = ucx_err(ucp_config_modify(conf, "TLS", CH_UCX_LOCAL_TLS));
    if (rc == 0 && rank == 0)
        CH_LOGI("coll", "all %u ranks on this host: UCX transports %s", world_size,
                CH_UCX_LOCAL_TLS);
    return rc;
}

static int ucx_init(wrk_coll_t *c, const wrk_coll_config_t *cfg)
{
    if (c->world_size >= CH_UCX_MAX_UNITS)
        return -E2BIG;
    int rc = 0;
    ucp_config_t *conf = NULL;
    ucp_address_t *addr = NULL;
    size_t alen = 0;
    char *val = NULL;
    ucx_ctx_t *u = calloc(1, sizeof *u);
    if (!u)
        return -ENOMEM;
    u->c = c;
    u->pid = getpid();
    const char *shm = getenv("CHORUS_COLL_SHM");
    u->shm_enabled = !shm || strcmp(shm, "0") != 0;
    host_id(u->host, sizeof u->host);
    u->peers = calloc(c->world_size, sizeof *u->peers);
    if (!u->peers) {
        rc = -ENOMEM;
        goto fail;
    }
    CH_CHECK_GOTO(wrk_shm_reg_create(&u->reg), rc, fail);
    for (uint32_t i = 0; i < c->world_size; i++)
        u->peers[i].u = u, u->peers[i].rank = i;
    CH_CHECK_GOTO(ucx_err(ucp_config_read(NULL, NULL, &conf)), rc, fail);
    CH_CHECK_GOTO(pick_transports(conf, c->rank, c->world_size), rc, fail);
    ucp_params_t prm = {
        .field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_ESTIMATED_NUM_EPS |
                      UCP_PARAM_FIELD_MT_WORKERS_SHARED,
        .features = UCP_FEATURE_TAG,
        .estimated_num_eps = c->world_size,
        .mt_workers_shared = 0,
    };
    CH_CHECK_GOTO(ucx_err(ucp_init(&prm, conf, &u->ctx)), rc, fail);
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                              .thread_mode = UCS_THREAD_MODE_SINGLE};
    CH_CHECK_GOTO(ucx_err(ucp_worker_create(u->ctx, &wp, &u->worker)), rc, fail);
    CH_CHECK_GOTO(ucx_err(ucp_worker_get_address(u->worker, &addr, &alen)), rc, fail);
    if (alen + sizeof(addr_hdr_t) > CH_RDZV_VALUE_MAX) {
        rc = CH_E_TOOBIG;
        goto fail;
    }
    addr_hdr_t h = {.magic = CH_UCX_ADDR_MAGIC, .pid = (int32_t)u->pid};
    memcpy(h.host, u->host, sizeof h.host);
    val = malloc(sizeof h + alen);
    if (!val) {
        rc = -ENOMEM;
        goto fail;
    }
    memcpy(val, &h, sizeof h);
    memcpy(val + sizeof h, addr, alen);
    char key[32];
    snprintf(key, sizeof key, "ucx/%u", c->rank);
    CH_CHECK_GOTO(c->rdzv.set(c->rdzv.ud, key, val, sizeof h + alen), rc, fail);
    free(val);
    ucp_worker_release_address(u->worker, addr);
    ucp_config_release(conf);
    c->be = u;
    return 0;
fail:
    free(val);
    if (addr)
        ucp_worker_release_address(u->worker, addr);
    if (u->worker)
        ucp_worker_destroy(u->worker);
    if (u->ctx)
        ucp_cleanup(u->ctx);
    if (conf)
        ucp_config_release(conf);
    wrk_shm_reg_destroy(u->reg);
    free(u->peers);
    free(u);
    return rc;
}

/* Close endpoints: flush when healthy; after an abort or a peer failure force-close the
 * ones with peer error handling (UCX allows forcing only those: the peer then sees an error
 * at once). Waits a bounded time for the closes, then lets the worker drop the rest.
 * only_forced: close just the endpoints that get forced (abort: local ones stay until
 * fini). */
static void close_eps(ucx_ctx_t *u, int force, int only_forced)
{
    uint32_t nw = u->c->world_size;
    void **reqs = calloc(nw, sizeof *reqs);
    for (uint32_t i = 0; i < nw; i++) {
        peer_t *pe = &u->peers[i];
        int forced = (force || pe->failed) && !pe->local;
        if (!pe->ep || (only_forced && !forced))
            continue;
        ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                                   .flags = forced ? UCP_EP_CLOSE_FLAG_FORCE : 0};
        ucs_status_ptr_t s = ucp_ep_close_nbx(pe->ep, &prm);
        pe->ep = NULL;
        if (force)
            pe->failed = 1;
        if (UCS_PTR_IS_PTR(s)) {
            if (reqs)
                reqs[i] = s;
            else
                ucp_request_free(s);
        }
    }
    if (!reqs)
        return;
    uint64_t deadline = ch_now_ms() + CH_UCX_CLOSE_WAIT_MS;
    for (int pending = 1; pending && ch_now_ms() < deadline;) {
        ucp_worker_progress(u->worker);
        pending = 0;
        for (uint32_t i = 0; i < nw; i++)
            if (reqs[i] && ucp_request_check_status(reqs[i]) == UCS_INPROGRESS)
                pending = 1;
    }
    for (uint32_t i = 0; i < nw; i++)
        if (reqs[i])
            ucp_request_free(reqs[i]);
    free(reqs);
}

static void ucx_fini(wrk_coll_t *c)
{
    ucx_ctx_t *u = c->be;
    if (!u)
        return;
    while (u->active) /* requests the caller did not free: a bug, logged by coll.c */
        op_free(u, u->active);
    close_eps(u, atomic_load(&c->aborted) != 0, 0);
    ucp_worker_destroy(u->worker);
    ucp_cleanup(u->ctx);
    for (int i = 0; i < CH_UCX_SCRATCH_POOL; i++)
        free(u->pool[i].p);
    while (u->parked) {
        parked_t *k = u->parked;
        u->parked = k->next;
        free(k->p);
        free(k);
    }
    wrk_shm_reg_destroy(u->reg); /* memory the caller did not free */
    free(u->groups);
    free(u->peers);
    free(u);
    c->be = NULL;
}

static void ucx_abort(wrk_coll_t *c)
{
    /* Force-closing tells remote peers at once (their endpoints to us fail) instead of
     * leaving them to their own timeouts; our in-flight sends to them complete as
     * cancelled. Same-host peers notice through the wait timeout. */
    ucx_ctx_t *u = c->be;
    close_eps(u, 1, 1);
    for (uint32_t i = 0; i < c->world_size; i++)
        u->peers[i].failed = 1;
}

static void ucx_group_fini(wrk_coll_group_t *g);

/* Run one operation of g to completion inside the backend (group setup). */
static int run_blocking(wrk_coll_group_t *g, const wrk_coll_args_t *a, int timeout_ms)
{
    wrk_coll_req_t r = {.g = g, .a = *a, .rc = 1};
    int rc = ucx_start(&r);
    if (rc < 0)
        return rc;
    uint64_t deadline = ch_now_ms() + (uint64_t)timeout_ms;
    while ((rc = ucx_test(&r)) > 0) {
        if (ch_now_ms() >= deadline) {
            rc = -ETIMEDOUT;
            break;
        }
        if (!ucx_progress(g->c))
            sched_yield();
    }
    ucx_req_fini(&r);
    return rc;
}

/* Same-host shared memory for a group whose members all run on this host (coll_shm.h):
 * member 0 creates the segment and broadcasts its reference, the others attach, and an
 * allreduce tells everyone whether all of them did; if not, the group keeps to UCX
 * messages. Every member of an all-local group takes part, whatever it can do, so the
 * group's collective numbering stays the same everywhere. */
static int shm_setup(wrk_coll_group_t *g, int timeout_ms)
{
    ucx_ctx_t *u = g->c->be;
    if (g->n < 2 || g->n > WRK_SHM_MAX_MEMBERS)
        return 0;
    for (uint32_t i = 0; i < g->n; i++)
        if (i != g->me && !u->peers[g->ranks[i]].local)
            return 0;
    char ref[WRK_SHM_REF_MAX] = "";
    wrk_shm_t *s = NULL;
    int rc = 0;
    if (g->me == 0 && u->shm_enabled && (rc = wrk_shm_create(g->n, u->reg, &s, ref)) < 0)
        CH_LOGW("coll", "rank %u: %s: no shared-memory segment: %s", g->c->rank, g->name,
                ch_strerror(rc));
    wrk_coll_args_t bc = {
        .kind = WRK_COLL_OP_BROADCAST, .recvbuf = ref, .count = sizeof ref, .dt = WRK_COLL_U8};
    CH_CHECK_GOTO(run_blocking(g, &bc, timeout_ms), rc, out);
    ref[sizeof ref - 1] = 0;
    if (g->me != 0 && u->shm_enabled && ref[0] &&
        (rc = wrk_shm_attach(ref, g->n, g->me, u->reg, &s)) < 0)
        CH_LOGW("coll", "rank %u: %s: cannot map %s: %s", g->c->rank, g->name, ref,
                ch_strerror(rc));
    float missing = s ? 0.0f : 1.0f;
    wrk_coll_args_t ar = {.kind = WRK_COLL_OP_ALLREDUCE,
                          .sendbuf = &missing,
                          .recvbuf = &missing,
                          .count = 1,
                          .dt = WRK_COLL_F32,
                          .op = WRK_COLL_MAX};
    CH_CHECK_GOTO(run_blocking(g, &ar, timeout_ms), rc, out);
    if (missing == 0.0f) {
        wrk_shm_seal(s);
        g->be = s;
        s = NULL;
        CH_LOGD("coll", "rank %u: %s: %u members through shared memory", g->c->rank, g->name, g->n);
    } else if (g->me == 0) {
        CH_LOGI("coll", "%s: all %u members on this host, but %s; collectives go through UCX",
                g->name, g->n,
                u->shm_enabled ? "not all could map shared memory" : "CHORUS_COLL_SHM=0");
    }
out:
    wrk_shm_destroy(s);
    return rc;
}

static int ucx_group_init(wrk_coll_group_t *g, int timeout_ms)
{
    ucx_ctx_t *u = g->c->be;
    if (u->ngroups == u->groups_cap) {
        size_t cap = u->groups_cap ? 2 * u->groups_cap : 8;
        wrk_coll_group_t **ng = realloc(u->groups, cap * sizeof *ng);
        if (!ng)
            return -ENOMEM;
        u->groups = ng;
        u->groups_cap = cap;
    }
    /* Connect up front so the first operation does not wait on the rendezvous store; large
     * groups connect on first use to the few peers their algorithms talk to. */
    if (g->n <= CH_UCX_PRECONNECT_MAX)
        for (uint32_t i = 0; i < g->n; i++) {
            ucp_ep_h ep;
            int rc = i == g->me ? 0 : get_ep(u, g->ranks[i], &ep);
            if (rc < 0)
                return rc;
        }
    u->groups[u->ngroups++] = g;
    int rc = shm_setup(g, timeout_ms);
    if (rc < 0)
        ucx_group_fini(g);
    return rc;
}

static void ucx_group_fini(wrk_coll_group_t *g)
{
    ucx_ctx_t *u = g->c->be;
    wrk_shm_destroy(g->be);
    g->be = NULL;
    for (size_t i = 0; i < u->ngroups; i++)
        if (u->groups[i] == g) {
            u->groups[i] = u->groups[--u->ngroups];
            break;
        }
}

static const char *ucx_transport(const wrk_coll_group_t *g)
{
    return g->be ? "shm" : "ucx";
}

/* Registered memory (coll_shm.h), which same-host groups read and write in place; plain
 * memory when a memfd cannot be had. */
static int ucx_mem_alloc(wrk_coll_t *c, size_t bytes, void **out)
{
    ucx_ctx_t *u = c->be;
    if (wrk_shm_mem_alloc(u->reg, bytes, out) == 0)
        return 0;
    *out = aligned_alloc(64, ((bytes ? bytes : 1) + 63) & ~(size_t)63);
    return *out ? 0 : -ENOMEM;
}

static void ucx_mem_free(wrk_coll_t *c, void *p)
{
    ucx_ctx_t *u = c->be;
    if (p && wrk_shm_mem_free(u->reg, p) < 0)
        free(p);
}

static int ucx_mem_copy(wrk_coll_t *c, void *dst, const void *src, size_t bytes, int to_backend)
{
    if (bytes)
        memcpy(dst, src, bytes);
    return 0;
}

static int ucx_available(void)
{
    return 1;
}

const wrk_coll_backend_t wrk_coll_ucx_backend = {
    .name = "ucx",
    .init = ucx_init,
    .fini = ucx_fini,
    .group_init = ucx_group_init,
    .group_fini = ucx_group_fini,
    .transport = ucx_transport,
    .start = ucx_start,
    .progress = ucx_progress,
    .test = ucx_test,
    .req_fini = ucx_req_fini,
    .abort = ucx_abort,
    .mem_alloc = ucx_mem_alloc,
    .mem_free = ucx_mem_free,
    .mem_copy = ucx_mem_copy,
    .available = ucx_available,
};
