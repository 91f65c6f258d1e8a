/* Collective self-check job kind (rank.h: wrk_diag_coll_run). For the job's layout it builds
 * the world, TP, DP and PP-column groups, runs every collective in each on known data,
 * checks the results exactly, times allreduce / reduce_scatter / allgather / broadcast on
 * diag.bytes, and reports "algbw.<group>.<op>" and "busbw.<group>.<op>" in GB/s.
 *
 * Data: member j's element i is val(j, i), small integers, so every sum is exact whatever
 * the order. Definitions are nccl-tests': bytes is the whole buffer (allreduce and broadcast:
 * the vector; reduce_scatter: the send buffer; allgather: the receive buffer),
 * algbw = bytes / time, busbw = algbw * 2(n-1)/n (allreduce), * (n-1)/n (reduce_scatter,
 * allgather), * 1 (broadcast); time is the slowest member's mean over diag.rounds. A rank on
 * a GPU (wrk_rank_on_gpu) runs them over NCCL on device buffers of its GPU. Each check
 * ends with the group agreeing on its outcome, so a wrong result fails every member with
 * CH_E_NUMERIC (the one that saw it names the element) instead of leaving the others to
 * time out in the next operation. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/log.h"
#include "common/util.h"
#include "workerd/coll/coll.h"
#include "workerd/rank/rank.h"

#define VAL_PERIOD         1009 /* val(j, i) depends on i only through i % VAL_PERIOD */
#define MAX_METRICS        16
#define DEFAULT_TIMEOUT_MS 60000
#define CHECK_MIN_COUNT    1023 /* with diag.bytes = 0: check at this size, time nothing */

static const wrk_coll_op_kind_t timed_ops[] = {WRK_COLL_OP_ALLREDUCE, WRK_COLL_OP_REDUCE_SCATTER,
                                               WRK_COLL_OP_ALLGATHER, WRK_COLL_OP_BROADCAST};
enum { NTIMED = sizeof timed_ops / sizeof timed_ops[0] };

typedef struct diag {
    wrk_rank_t *r;
    wrk_coll_t *c;
    size_t count; /* floats in the full buffer */
    int timed;    /* diag.bytes > 0 */
    int rounds;
    float *host;            /* count floats: staging for fills and checks */
    void *send, *recv;      /* backend memory, count floats each */
    void *scalar;           /* backend memory, 1 float: group max of times and flags */
    float sums[VAL_PERIOD]; /* sum over the group's members of val(j, i) by i % VAL_PERIOD */
    Chorus__Metric metrics[MAX_METRICS];
    Chorus__Metric *mptr[MAX_METRICS];
    char names[MAX_METRICS][64];
    size_t nmetrics;
} diag_t;

static float val(uint32_t member, size_t i)
{
    return (float)((int)((member * 3u + (uint32_t)(i % VAL_PERIOD)) % 11u) - 5);
}

/* Max of x over the group (in backend memory, so it works for NCCL too). */
static int group_max(diag_t *d, wrk_coll_group_t *g, float *x)
{
    int rc = wrk_coll_mem_copy(d->c, d->scalar, x, sizeof *x, 1);
    if (rc == 0)
        rc = wrk_coll_allreduce(g, d->scalar, d->scalar, 1, WRK_COLL_F32, WRK_COLL_MAX, NULL);
    if (rc == 0)
        rc = wrk_coll_mem_copy(d->c, x, d->scalar, sizeof *x, 0);
    return rc;
}

/* Elements per member block for reduce_scatter and allgather (count >= world size). */
static size_t block_of(const diag_t *d, uint32_t n)
{
    return d->count / n;
}

static int run(diag_t *d, wrk_coll_group_t *g, wrk_coll_op_kind_t kind)
{
    size_t block = block_of(d, wrk_coll_group_size(g));
    switch (kind) {
    case WRK_COLL_OP_ALLREDUCE:
        return wrk_coll_allreduce(g, d->send, d->recv, d->count, WRK_COLL_F32, WRK_COLL_SUM, NULL);
    case WRK_COLL_OP_REDUCE_SCATTER:
        return wrk_coll_reduce_scatter(g, d->send, d->recv, block, WRK_COLL_F32, WRK_COLL_SUM,
                                       NULL);
    case WRK_COLL_OP_ALLGATHER:
        return wrk_coll_allgather(g, d->send, d->recv, block, WRK_COLL_F32, NULL);
    case WRK_COLL_OP_BROADCAST:
        return wrk_coll_broadcast(g, d->recv, d->count, WRK_COLL_F32, wrk_coll_group_size(g) - 1,
                                  NULL);
    default:
        return wrk_coll_barrier(g, NULL);
    }
}

/* Fill the inputs of kind for this member: send (and, for broadcast, recv). */
static int fill(diag_t *d, wrk_coll_group_t *g, wrk_coll_op_kind_t kind)
{
    uint32_t n = wrk_coll_group_size(g), me = wrk_coll_group_index(g);
    size_t block = block_of(d, n), len = d->count;
    if (kind == WRK_COLL_OP_ALLGATHER) {
        len = block;
        for (size_t i = 0; i < block; i++)
            d->host[i] = val(me, me * block + i);
    } else if (kind == WRK_COLL_OP_BROADCAST) {
        for (size_t i = 0; i < len; i++)
            d->host[i] = me == n - 1 ? val(me, i) : -100.0f;
        return wrk_coll_mem_copy(d->c, d->recv, d->host, len * sizeof(float), 1);
    } else {
        len = kind == WRK_COLL_OP_REDUCE_SCATTER ? block * n : d->count;
        for (size_t i = 0; i < len; i++)
            d->host[i] = val(me, i);
    }
    return wrk_coll_mem_copy(d->c, d->send, d->host, len * sizeof(float), 1);
}

/* Compare the result with what it must be; 0 or the first bad index + 1 in *bad. */
static int verify(diag_t *d, wrk_coll_group_t *g, wrk_coll_op_kind_t kind, size_t *bad, float *want)
{
    uint32_t n = wrk_coll_group_size(g), me = wrk_coll_group_index(g);
    size_t block = block_of(d, n);
    size_t len = kind == WRK_COLL_OP_REDUCE_SCATTER ? block
                 : kind == WRK_COLL_OP_ALLGATHER    ? block * n
                                                    : d->count;
    int rc = wrk_coll_mem_copy(d->c, d->host, d->recv, len * sizeof(float), 0);
    *bad = 0;
    for (size_t i = 0; i < len && rc == 0; i++) {
        switch (kind) {
        case WRK_COLL_OP_ALLREDUCE:
            *want = d->sums[i % VAL_PERIOD];
            break;
        case WRK_COLL_OP_REDUCE_SCATTER:
            *want = d->sums[(me * block + i) % VAL_PERIOD];
            break;
        case WRK_COLL_OP_ALLGATHER:
            *want = val((uint32_t)(i / block), i);
            break;
        default:
            *want = val(n - 1, i);
            break;
        }
        if (d->host[i] != *want) {
            *bad = i + 1;
            break;
        }
    }
    return rc;
}

/* Run kind once on known data and check it; every member learns whether anyone failed. */
static int check(diag_t *d, wrk_coll_group_t *g, wrk_coll_op_kind_t kind)
{
    const char *gname = wrk_coll_group_name(g), *op = wrk_coll_op_name(kind);
    size_t bad = 0;
    float want = 0;
    int rc = kind == WRK_COLL_OP_BARRIER ? 0 : fill(d, g, kind);
    if (rc == 0)
        rc = run(d, g, kind);
    if (rc == 0 && kind != WRK_COLL_OP_BARRIER)
        rc = verify(d, g, kind, &bad, &want);
    if (rc < 0)
        return wrk_rank_fail(d->r, rc, "%s %s: %s", gname, op, ch_strerror(rc));
    float flag = bad ? 1.0f : 0.0f;
    if ((rc = group_max(d, g, &flag)) < 0)
        return wrk_rank_fail(d->r, rc, "%s %s: %s", gname, op, ch_strerror(rc));
    if (bad)
        return wrk_rank_fail(d->r, CH_E_NUMERIC, "%s %s: element %zu is %g, want %g", gname, op,
                             bad - 1, (double)d->host[bad - 1], (double)want);
    if (flag > 0)
        return wrk_rank_fail(d->r, CH_E_NUMERIC, "%s %s: wrong result on another member", gname,
                             op);
    return 0;
}

/* Stage s sends the buffer to stage s+1: activations down the pipeline column. */
static int check_pipeline(diag_t *d, wrk_coll_group_t *g)
{
    uint32_t n = wrk_coll_group_size(g), s = wrk_coll_group_index(g);
    int rc = 0;
    for (size_t i = 0; i < d->count; i++)
        d->host[i] = val(s, i);
    rc = wrk_coll_mem_copy(d->c, d->send, d->host, d->count * sizeof(float), 1);
    if (rc == 0 && s > 0)
        rc = wrk_coll_recv(g, d->recv, d->count, WRK_COLL_F32, s - 1, NULL);
    if (rc == 0 && s + 1 < n)
        rc = wrk_coll_send(g, d->send, d->count, WRK_COLL_F32, s + 1, NULL);
    if (rc < 0)
        return wrk_rank_fail(d->r, rc, "pp send/recv: %s", ch_strerror(rc));
    if (s == 0)
        return 0;
    if ((rc = wrk_coll_mem_copy(d->c, d->host, d->recv, d->count * sizeof(float), 0)) < 0)
        return rc;
    for (size_t i = 0; i < d->count; i++)
        if (d->host[i] != val(s - 1, i))
            return wrk_rank_fail(d->r, CH_E_NUMERIC, "pp send/recv: element %zu is %g, want %g", i,
                                 (double)d->host[i], (double)val(s - 1, i));
    return 0;
}

static void add_metric(diag_t *d, const char *kind, const char *group, const char *op, double v)
{
    if (d->nmetrics == MAX_METRICS)
        return;
    size_t i = d->nmetrics++;
    snprintf(d->names[i], sizeof d->names[i], "%s.%s.%s", kind, group, op);
    chorus__metric__init(&d->metrics[i]);
    d->metrics[i].name = d->names[i];
    d->metrics[i].value = v;
    d->mptr[i] = &d->metrics[i];
}

/* Mean time of kind over diag.rounds, the slowest member's; adds its two metrics. */
static int time_op(diag_t *d, wrk_coll_group_t *g, wrk_coll_op_kind_t kind)
{
    uint32_t n = wrk_coll_group_size(g);
    int rc = run(d, g, kind); /* warm-up */
    if (rc == 0)
        rc = wrk_coll_barrier(g, NULL);
    uint64_t t0 = ch_now_ns();
    for (int i = 0; i < d->rounds && rc == 0; i++)
        rc = run(d, g, kind);
    float secs = (float)((double)(ch_now_ns() - t0) / 1e9 / d->rounds);
    if (rc == 0)
        rc = group_max(d, g, &secs);
    if (rc < 0)
        return wrk_rank_fail(d->r, rc, "timing %s %s: %s", wrk_coll_group_name(g),
                             wrk_coll_op_name(kind), ch_strerror(rc));
    size_t block = block_of(d, n);
    double bytes =
        (double)(kind == WRK_COLL_OP_REDUCE_SCATTER || kind == WRK_COLL_OP_ALLGATHER ? block * n
                                                                                     : d->count) *
        sizeof(float);
    double alg = bytes / (secs > 0 ? secs : 1e-9) / 1e9;
    double factor = kind == WRK_COLL_OP_ALLREDUCE   ? 2.0 * (n - 1) / n
                    : kind == WRK_COLL_OP_BROADCAST ? 1.0
                                                    : (double)(n - 1) / n;
    add_metric(d, "algbw", wrk_coll_group_name(g), wrk_coll_op_name(kind), alg);
    add_metric(d, "busbw", wrk_coll_group_name(g), wrk_coll_op_name(kind), alg * factor);
    return 0;
}

static int diag_group(diag_t *d, wrk_coll_group_t *g)
{
    uint32_t n = wrk_coll_group_size(g);
    for (size_t p = 0; p < VAL_PERIOD; p++) {
        d->sums[p] = 0;
        for (uint32_t j = 0; j < n; j++)
            d->sums[p] += val(j, p);
    }
    int rc = 0;
    for (int k = 0; k < NTIMED && rc == 0; k++)
        rc = check(d, g, timed_ops[k]);
    if (rc == 0)
        rc = check(d, g, WRK_COLL_OP_BARRIER);
    if (rc == 0 && strcmp(wrk_coll_group_name(g), "pp") == 0)
        rc = check_pipeline(d, g);
    d->nmetrics = 0;
    for (int k = 0; k < NTIMED && rc == 0 && d->timed && n > 1; k++)
        rc = time_op(d, g, timed_ops[k]);
    return rc;
}

static int diag_setup(diag_t *d, wrk_rank_t *r)
{
    const ch_jobspec_t *s = &r->spec;
    wrk_coll_config_t cfg;
    wrk_coll_config_defaults(&cfg);
    cfg.backend = wrk_rank_on_gpu(r) ? WRK_COLL_NCCL : WRK_COLL_UCX;
    cfg.rank = r->rank;
    cfg.world_size = r->world_size;
    cfg.rdzv = r->rdzv;
    if (cfg.backend == WRK_COLL_NCCL) { /* busbw between GPUs: this rank's own */
        char err[256];
        int rc = wrk_rank_gpu(r, "device", &cfg.device, err, sizeof err);
        if (rc < 0)
            return wrk_rank_fail(r, rc, "diag collectives: %s", err);
    }
    cfg.timeout_ms =
        s->fault.step_timeout_s > 0 ? (int)(s->fault.step_timeout_s * 1000) : DEFAULT_TIMEOUT_MS;
    d->r = r;
    d->timed = s->diag.bytes > 0;
    d->count = d->timed ? (size_t)s->diag.bytes / sizeof(float) : CHECK_MIN_COUNT;
    if (d->count < r->world_size) /* at least one element per member */
        d->count = r->world_size;
    d->rounds = s->diag.rounds > 0 ? (int)s->diag.rounds : 1;
    int rc = wrk_coll_create(&cfg, &d->c);
    if (rc < 0)
        return wrk_rank_fail(r, rc, "%s collectives: %s", wrk_coll_backend_name(cfg.backend),
                             ch_strerror(rc));
    size_t bytes = d->count * sizeof(float);
    if (!(d->host = malloc(bytes)))
        return -ENOMEM;
    CH_CHECK_GOTO(wrk_coll_mem_alloc(d->c, bytes, &d->send), rc, out);
    CH_CHECK_GOTO(wrk_coll_mem_alloc(d->c, bytes, &d->recv), rc, out);
    CH_CHECK_GOTO(wrk_coll_mem_alloc(d->c, sizeof(float), &d->scalar), rc, out);
out:
    return rc;
}

int wrk_diag_coll_run(wrk_rank_t *r)
{
    static const wrk_coll_group_kind_t kinds[] = {WRK_COLL_GROUP_WORLD, WRK_COLL_GROUP_TP,
                                                  WRK_COLL_GROUP_DP, WRK_COLL_GROUP_PP};
    enum { NK = sizeof kinds / sizeof kinds[0] };
    ch_layout_t l = ch_jobspec_layout(&r->spec);
    if (ch_layout_world(l) != r->world_size)
        return wrk_rank_fail(r, CH_E_CONFIG, "layout %ux%ux%u does not match world size %u", l.tp,
                             l.pp, l.dp, r->world_size);
    diag_t *d = calloc(1, sizeof *d);
    if (!d)
        return -ENOMEM;
    wrk_coll_group_t *g[NK] = {NULL};
    int rc = diag_setup(d, r);
    for (int k = 0; k < NK && rc == 0; k++) {
        rc = wrk_coll_group_layout(d->c, l, kinds[k], &g[k]);
        if (rc < 0)
            rc = wrk_rank_fail(r, rc, "building group %d: %s", (int)kinds[k], ch_strerror(rc));
    }
    for (int k = 0; k < NK && rc == 0; k++) {
        if ((rc = diag_group(d, g[k])) < 0)
            break;
        CH_LOGI("diag", "rank %u: %s group (%u members, through %s) checked", r->rank,
                wrk_coll_group_name(g[k]), wrk_coll_group_size(g[k]),
                wrk_coll_group_transport(g[k]));
        rc = wrk_rank_progress(r, (uint64_t)k + 1, NK, 0, 0, 0, d->nmetrics ? d->mptr : NULL,
                               d->nmetrics);
    }
    /* Nobody leaves while a peer still finishes its last operation. */
    if (rc == 0 && (rc = wrk_coll_barrier(g[0], NULL)) < 0)
        rc = wrk_rank_fail(r, rc, "final barrier: %s", ch_strerror(rc));
    for (int k = 0; k < NK; k++)
        wrk_coll_group_destroy(g[k]);
    if (d->c) {
        wrk_coll_mem_free(d->c, d->scalar);
        wrk_coll_mem_free(d->c, d->recv);
        wrk_coll_mem_free(d->c, d->send);
        wrk_coll_destroy(d->c);
    }
    free(d->host);
    free(d);
    return rc;
}
