/* Collectives (workerd/coll.h): ranks are threads of this process, each with its own UCX
 * context, meeting through an in-process rendezvous table (mutex + condvar). UCX picks its
 * transports (shared memory between the workers of this process; set UCX_TLS, e.g.
 * "self,sm,tcp", to force a choice). Rank threads never assert: they return 0 or a
 * message, and the test thread asserts on it. The NCCL backend is tested with one rank per
 * GPU and skips when there is none. */
#include <criterion/criterion.h>

#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/err.h"
#include "common/util.h"
#include "support.h"
#include "workerd/coll/coll.h"

// ----------------------------------------------------------------------------
// ranks as threads

typedef struct rank_ctx rank_ctx_t;
typedef int (*rank_fn)(rank_ctx_t *t);

struct rank_ctx {
    uint32_t rank, n;
    ts_rdzv_table_t *table;
    rank_fn fn;
    void *arg;
    int timeout_ms;
    wrk_coll_t *c;
    int rc;
    char msg[256];
};

#define fail(t, ...) ts_fail((t)->msg, sizeof(t)->msg, __VA_ARGS__)

static void *rank_main(void *arg)
{
    rank_ctx_t *t = arg;
    t->rc = ts_coll_create(t->table, t->rank, t->n, t->timeout_ms, &t->c);
    if (t->rc < 0) {
        snprintf(t->msg, sizeof t->msg, "create: %s", ch_strerror(t->rc));
        return NULL;
    }
    t->rc = t->fn(t);
    if (t->rc < 0 && !t->msg[0])
        snprintf(t->msg, sizeof t->msg, "%s", ch_strerror(t->rc));
    wrk_coll_destroy(t->c);
    return NULL;
}

/* Run fn on n rank threads; ranks[i] gets the outcome of rank i. */
static void run_ranks(uint32_t n, rank_fn fn, void *arg, int timeout_ms, rank_ctx_t *ranks)
{
    ts_rdzv_table_t table;
    ts_rdzv_table_init(&table);
    pthread_t th[16];
    cr_assert_leq(n, 16);
    for (uint32_t i = 0; i < n; i++) {
        ranks[i] = (rank_ctx_t){
            .rank = i, .n = n, .table = &table, .fn = fn, .arg = arg, .timeout_ms = timeout_ms};
        cr_assert_eq(pthread_create(&th[i], NULL, rank_main, &ranks[i]), 0);
    }
    for (uint32_t i = 0; i < n; i++)
        pthread_join(th[i], NULL);
    ts_rdzv_table_fini(&table);
}

static void expect_all_ok(uint32_t n, rank_fn fn, void *arg)
{
    rank_ctx_t ranks[16];
    run_ranks(n, fn, arg, 20000, ranks);
    for (uint32_t i = 0; i < n; i++)
        cr_expect_eq(ranks[i].rc, 0, "rank %u of %u: %s", i, n, ranks[i].msg);
}

// ----------------------------------------------------------------------------
// data: integer-valued floats, so every sum is exact whatever the order

static float ival(uint32_t rank, size_t i)
{
    return (float)((int)((rank * 131u + (uint32_t)(i % 100003u) * 7u) % 17u) - 8);
}

static float ref_sum(uint32_t n, size_t i)
{
    float s = 0;
    for (uint32_t r = 0; r < n; r++)
        s += ival(r, i);
    return s;
}

static float ref_max(uint32_t n, size_t i)
{
    float m = ival(0, i);
    for (uint32_t r = 1; r < n; r++)
        m = fmaxf(m, ival(r, i));
    return m;
}

static float *filled(uint32_t rank, size_t count, size_t first)
{
    float *b = malloc((count ? count : 1) * sizeof *b);
    for (size_t i = 0; i < count; i++)
        b[i] = ival(rank, first + i);
    return b;
}

static int check(rank_ctx_t *t, const char *what, size_t count, const float *got, size_t first,
                 float (*ref)(uint32_t, size_t), uint32_t n)
{
    for (size_t i = 0; i < count; i++) {
        float want = ref(n, first + i);
        if (got[i] != want)
            return fail(t, "%s n=%u count=%zu: [%zu] = %g, want %g", what, n, count, i,
                        (double)got[i], (double)want);
    }
    return 0;
}

/* Allgather result: block i holds member i's values at the same positions. */
static int check_gather(rank_ctx_t *t, const char *what, size_t block, const float *got)
{
    for (size_t i = 0; i < block * t->n; i++)
        if (got[i] != ival((uint32_t)(i / block), i))
            return fail(t, "%s n=%u block=%zu: [%zu] = %g, want %g", what, t->n, block, i,
                        (double)got[i], (double)ival((uint32_t)(i / block), i));
    return 0;
}

/* Every operation at one size (count: elements of the whole buffer for allreduce and
 * broadcast, of each member's block for reduce_scatter and allgather). */
static int all_ops_at(rank_ctx_t *t, wrk_coll_group_t *g, size_t count, size_t block)
{
    uint32_t n = t->n, me = t->rank;
    int rc;
    float *src = filled(me, count, 0), *dst = calloc(count ? count : 1, sizeof *dst);
    float *big = filled(me, block * n, 0), *out = calloc(block * n + 1, sizeof *out);

    /* allreduce: out of place (blocking form), in place (non-blocking), max */
    if ((rc = wrk_coll_allreduce(g, src, dst, count, WRK_COLL_F32, WRK_COLL_SUM, NULL)) < 0 ||
        (rc = check(t, "allreduce", count, dst, 0, ref_sum, n)) < 0)
        goto out;
    wrk_coll_req_t *req = NULL;
    memcpy(dst, src, count * sizeof *dst);
    if ((rc = wrk_coll_allreduce(g, dst, dst, count, WRK_COLL_F32, WRK_COLL_SUM, &req)) < 0)
        goto out;
    rc = wrk_coll_wait(req, -1);
    wrk_coll_req_free(req);
    if (rc < 0 || (rc = check(t, "allreduce in place", count, dst, 0, ref_sum, n)) < 0)
        goto out;
    memcpy(dst, src, count * sizeof *dst);
    if ((rc = wrk_coll_allreduce(g, dst, dst, count, WRK_COLL_F32, WRK_COLL_MAX, NULL)) < 0 ||
        (rc = check(t, "allreduce max", count, dst, 0, ref_max, n)) < 0)
        goto out;

    /* reduce_scatter: out of place, then in place (recv = send + me*block), max */
    if ((rc = wrk_coll_reduce_scatter(g, big, out, block, WRK_COLL_F32, WRK_COLL_SUM, NULL)) < 0 ||
        (rc = check(t, "reduce_scatter", block, out, me * block, ref_sum, n)) < 0)
        goto out;
    float *in_place = big + me * block;
    if ((rc = wrk_coll_reduce_scatter(g, big, in_place, block, WRK_COLL_F32, WRK_COLL_SUM, NULL)) <
            0 ||
        (rc = check(t, "reduce_scatter in place", block, in_place, me * block, ref_sum, n)) < 0)
        goto out;
    free(big);
    big = filled(me, block * n, 0);
    if ((rc = wrk_coll_reduce_scatter(g, big, out, block, WRK_COLL_F32, WRK_COLL_MAX, NULL)) < 0 ||
        (rc = check(t, "reduce_scatter max", block, out, me * block, ref_max, n)) < 0)
        goto out;

    /* allgather: block i is member i's values at [i*block, (i+1)*block) */
    float *mine = filled(me, block, me * block);
    rc = wrk_coll_allgather(g, mine, out, block, WRK_COLL_F32, NULL);
    free(mine);
    if (rc < 0 || (rc = check_gather(t, "allgather", block, out)) < 0)
        goto out;
    memset(out, 0, block * n * sizeof *out);
    for (size_t i = 0; i < block; i++)
        out[me * block + i] = ival(me, me * block + i);
    if ((rc = wrk_coll_allgather(g, out + me * block, out, block, WRK_COLL_F32, NULL)) < 0 ||
        (rc = check_gather(t, "allgather in place", block, out)) < 0)
        goto out;

    /* broadcast from the last member */
    memcpy(dst, src, count * sizeof *dst);
    if ((rc = wrk_coll_broadcast(g, dst, count, WRK_COLL_F32, n - 1, NULL)) < 0)
        goto out;
    for (size_t i = 0; i < count; i++)
        if (dst[i] != ival(n - 1, i)) {
            rc = fail(t, "broadcast n=%u count=%zu: [%zu] = %g", n, count, i, (double)dst[i]);
            goto out;
        }

    /* p2p around the ring, both started before either is waited */
    wrk_coll_req_t *rr = NULL, *sr = NULL;
    memset(dst, 0, count * sizeof *dst);
    if ((rc = wrk_coll_recv(g, dst, count, WRK_COLL_F32, (me + n - 1) % n, &rr)) < 0)
        goto out;
    if ((rc = wrk_coll_send(g, src, count, WRK_COLL_F32, (me + 1) % n, &sr)) < 0) {
        wrk_coll_req_free(rr);
        goto out;
    }
    rc = wrk_coll_wait(rr, -1);
    int rc2 = wrk_coll_wait(sr, -1);
    wrk_coll_req_free(rr);
    wrk_coll_req_free(sr);
    if (rc < 0 || (rc = rc2) < 0)
        goto out;
    for (size_t i = 0; i < count; i++)
        if (dst[i] != ival((me + n - 1) % n, i)) {
            rc = fail(t, "send/recv n=%u count=%zu: [%zu] = %g", n, count, i, (double)dst[i]);
            goto out;
        }
    /* the grouped exchange, blocking, every member at once: to the next, from the previous */
    memset(dst, 0, count * sizeof *dst);
    if ((rc = wrk_coll_sendrecv(g, src, count, (me + 1) % n, dst, count, (me + n - 1) % n,
                                WRK_COLL_F32, NULL)) < 0)
        goto out;
    for (size_t i = 0; i < count; i++)
        if (dst[i] != ival((me + n - 1) % n, i)) {
            rc = fail(t, "sendrecv n=%u count=%zu: [%zu] = %g", n, count, i, (double)dst[i]);
            goto out;
        }
    rc = wrk_coll_barrier(g, NULL);
out:
    if (rc < 0 && !t->msg[0])
        fail(t, "count=%zu: %s", count, ch_strerror(rc));
    free(out);
    free(big);
    free(dst);
    free(src);
    return rc;
}

static int all_ops(rank_ctx_t *t)
{
    static const size_t counts[] = {0, 1, 1023, 4u << 20};
    wrk_coll_group_t *g = NULL;
    int rc = wrk_coll_group_layout(t->c, (ch_layout_t){1, 1, t->n}, WRK_COLL_GROUP_WORLD, &g);
    if (rc < 0)
        return fail(t, "group: %s", ch_strerror(rc));
    for (size_t k = 0; k < sizeof counts / sizeof counts[0] && rc == 0; k++) {
        size_t block = counts[k] >= t->n ? counts[k] / t->n : counts[k];
        rc = all_ops_at(t, g, counts[k], block);
    }
    wrk_coll_group_destroy(g);
    return rc;
}

Test(coll, every_op_2_ranks, .timeout = 120)
{
    expect_all_ok(2, all_ops, NULL);
}

Test(coll, every_op_3_ranks, .timeout = 120)
{
    expect_all_ok(3, all_ops, NULL);
}

Test(coll, every_op_4_ranks, .timeout = 120)
{
    expect_all_ok(4, all_ops, NULL);
}

Test(coll, every_op_8_ranks, .timeout = 120)
{
    expect_all_ok(8, all_ops, NULL);
}

// ----------------------------------------------------------------------------
// same-host shared memory: used when every member runs here, and the UCX path when not

static int transport_is(rank_ctx_t *t)
{
    wrk_coll_group_t *g = NULL;
    int rc = wrk_coll_group_layout(t->c, (ch_layout_t){1, 1, t->n}, WRK_COLL_GROUP_WORLD, &g);
    if (rc < 0)
        return fail(t, "group: %s", ch_strerror(rc));
    if (strcmp(wrk_coll_group_transport(g), t->arg) != 0)
        rc = fail(t, "transport %s, want %s", wrk_coll_group_transport(g), (const char *)t->arg);
    wrk_coll_group_destroy(g);
    return rc;
}

Test(coll, one_host_groups_use_shared_memory)
{
    expect_all_ok(3, transport_is, "shm");
}

/* CHORUS_COLL_SHM=0 (each Criterion test is its own process): UCX messages, same results. */
Test(coll, every_op_3_ranks_ucx_messages, .timeout = 120)
{
    setenv("CHORUS_COLL_SHM", "0", 1);
    expect_all_ok(3, transport_is, "ucx");
    expect_all_ok(3, all_ops, NULL);
}

Test(coll, every_op_4_ranks_ucx_messages, .timeout = 120)
{
    setenv("CHORUS_COLL_SHM", "0", 1);
    expect_all_ok(4, all_ops, NULL);
}

/* Several operations of one group in flight at once, of sizes that take one and many
 * pipeline steps, waited in reverse order: each still gets its own result. */
static int outstanding_rank(rank_ctx_t *t)
{
    static const size_t counts[] = {1, 300007, 1023, 70001};
    enum { NC = sizeof counts / sizeof counts[0] };
    uint32_t n = t->n, me = t->rank;
    wrk_coll_group_t *g = NULL;
    wrk_coll_req_t *req[NC + 1] = {NULL};
    float *in[NC] = {NULL}, *out[NC] = {NULL};
    size_t block = 50000;
    float *mine = filled(me, block, me * block), *all = calloc(block * n, sizeof *all);
    int rc = wrk_coll_group_layout(t->c, (ch_layout_t){1, 1, n}, WRK_COLL_GROUP_WORLD, &g);
    for (int k = 0; k < NC && rc == 0; k++) {
        in[k] = filled(me, counts[k], 0);
        out[k] = calloc(counts[k], sizeof *out[k]);
        rc = wrk_coll_allreduce(g, in[k], out[k], counts[k], WRK_COLL_F32, WRK_COLL_SUM, &req[k]);
    }
    if (rc == 0)
        rc = wrk_coll_allgather(g, mine, all, block, WRK_COLL_F32, &req[NC]);
    for (int k = NC; k >= 0 && rc == 0; k--)
        rc = wrk_coll_wait(req[k], -1);
    for (int k = 0; k < NC && rc == 0; k++)
        rc = check(t, "outstanding allreduce", counts[k], out[k], 0, ref_sum, n);
    if (rc == 0)
        rc = check_gather(t, "outstanding allgather", block, all);
    for (int k = 0; k < NC; k++) {
        free(in[k]);
        free(out[k]);
    }
    for (int k = 0; k <= NC; k++)
        wrk_coll_req_free(req[k]);
    free(mine);
    free(all);
    wrk_coll_group_destroy(g);
    return rc;
}

Test(coll, outstanding_ops_of_one_group, .timeout = 60)
{
    expect_all_ok(2, outstanding_rank, NULL);
    expect_all_ok(3, outstanding_rank, NULL);
}

/* On a backend without streams (shm here) a stream-ordered wait is the host's: the result
 * is in place when wrk_coll_ordered returns, it counts as a host wait (not a stream one),
 * the request is freed and its pointer cleared, and settling has nothing left to do. */
static int stream_wait_rank(rank_ctx_t *t)
{
    uint32_t n = t->n, me = t->rank;
    size_t count = 1000;
    wrk_coll_group_t *g = NULL;
    wrk_coll_req_t *r = NULL;
    float *buf = filled(me, count, 0);
    uint64_t h0 = 0, s0 = 0, h1 = 0, s1 = 0;
    int rc = wrk_coll_group_layout(t->c, (ch_layout_t){1, 1, n}, WRK_COLL_GROUP_WORLD, &g);
    wrk_coll_wait_counts(t->c, &h0, &s0);
    if (rc == 0)
        rc = wrk_coll_ordered(
            wrk_coll_allreduce(g, buf, buf, count, WRK_COLL_F32, WRK_COLL_SUM, &r), &r);
    if (rc == 0 && r != NULL)
        rc = fail(t, "wrk_coll_ordered left the request");
    if (rc == 0)
        rc = check(t, "stream-ordered allreduce", count, buf, 0, ref_sum, n);
    if (rc == 0)
        rc = wrk_coll_settle(t->c, -1);
    wrk_coll_wait_counts(t->c, &h1, &s1);
    if (rc == 0 && (h1 - h0 != 1 || s1 != s0))
        rc = fail(t, "waits: %llu host, %llu stream; want 1 and 0", (unsigned long long)(h1 - h0),
                  (unsigned long long)(s1 - s0));
    free(buf);
    wrk_coll_group_destroy(g);
    return rc;
}

Test(coll, stream_ordered_wait_without_streams_is_the_hosts, .timeout = 60)
{
    expect_all_ok(2, stream_wait_rank, NULL);
}

/* Buffers from wrk_coll_mem_alloc: same-host members read and write each other's in place.
 * arg: a rank whose buffers are plain malloc (the group then stages), or -1. Every size is
 * above the zero-copy threshold; buffers are freed and allocated again between rounds, so a
 * member's cached mapping of a peer's old buffer must not be used. */
static int registered_rank(rank_ctx_t *t)
{
    uint32_t n = t->n, me = t->rank;
    int plain = (int)(intptr_t)t->arg == (int)me;
    size_t count = (1u << 20) + 7, block = count / n;
    wrk_coll_group_t *g = NULL;
    int rc = wrk_coll_group_layout(t->c, (ch_layout_t){1, 1, n}, WRK_COLL_GROUP_WORLD, &g);
    for (int round = 0; round < 2 && rc == 0; round++) {
        float *in = NULL, *out = NULL;
        size_t bytes = count * sizeof(float);
        if (plain) {
            in = malloc(bytes), out = malloc(bytes);
            rc = in && out ? 0 : -ENOMEM;
        } else if ((rc = wrk_coll_mem_alloc(t->c, bytes, (void **)&in)) == 0) {
            rc = wrk_coll_mem_alloc(t->c, bytes, (void **)&out);
        }
        float *src = filled(me, count, 0), *mine = filled(me, block, me * block);
        if (rc == 0) {
            memcpy(in, src, bytes);
            rc = wrk_coll_allreduce(g, in, out, count, WRK_COLL_F32, WRK_COLL_SUM, NULL);
        }
        if (rc == 0)
            rc = check(t, "registered allreduce", count, out, 0, ref_sum, n);
        if (rc == 0)
            rc = wrk_coll_allreduce(g, in, in, count, WRK_COLL_F32, WRK_COLL_MAX, NULL);
        if (rc == 0)
            rc = check(t, "registered allreduce max in place", count, in, 0, ref_max, n);
        if (rc == 0) {
            memcpy(in, src, bytes);
            rc = wrk_coll_reduce_scatter(g, in, in + me * block, block, WRK_COLL_F32, WRK_COLL_SUM,
                                         NULL);
        }
        if (rc == 0)
            rc = check(t, "registered reduce_scatter in place", block, in + me * block, me * block,
                       ref_sum, n);
        if (rc == 0) {
            memcpy(in, mine, block * sizeof(float));
            rc = wrk_coll_allgather(g, in, out, block, WRK_COLL_F32, NULL);
        }
        if (rc == 0)
            rc = check_gather(t, "registered allgather", block, out);
        free(mine);
        free(src);
        if (plain) {
            free(in);
            free(out);
        } else {
            wrk_coll_mem_free(t->c, in);
            wrk_coll_mem_free(t->c, out);
        }
    }
    wrk_coll_group_destroy(g);
    return rc;
}

Test(coll, registered_buffers_in_place_across_members, .timeout = 60)
{
    expect_all_ok(2, registered_rank, (void *)(intptr_t)-1);
    expect_all_ok(3, registered_rank, (void *)(intptr_t)-1);
}

Test(coll, registered_and_plain_buffers_mixed, .timeout = 60)
{
    expect_all_ok(3, registered_rank, (void *)(intptr_t)1);
}

// ----------------------------------------------------------------------------
// determinism: non-integer data, two independent runs, every member

typedef struct det_out {
    uint32_t n;
    float *ar_small[8], *ar_large[8], *rs[8];
} det_out_t;

enum { DET_SMALL = 1000, DET_LARGE = 300007, DET_BLOCK = 33331 };

static float fval(uint32_t rank, size_t i)
{
    uint64_t x = (rank + 1) * 0x9e3779b97f4a7c15ull ^ (i * 0xbf58476d1ce4e5b9ull);
    x ^= x >> 31;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 29;
    return ((float)(x & 0xffffff) / 16777216.0f - 0.5f) * (float)(1u << (rank % 5));
}

static int det_rank(rank_ctx_t *t)
{
    det_out_t *o = t->arg;
    uint32_t n = t->n, me = t->rank;
    wrk_coll_group_t *g = NULL;
    int rc = wrk_coll_group_layout(t->c, (ch_layout_t){1, 1, n}, WRK_COLL_GROUP_WORLD, &g);
    if (rc < 0)
        return rc;
    size_t big = (size_t)DET_BLOCK * n;
    float *in = malloc(big > DET_LARGE ? big * sizeof *in : DET_LARGE * sizeof *in);
    float *small = malloc(DET_SMALL * sizeof *small), *large = malloc(DET_LARGE * sizeof *large);
    float *rs = malloc(DET_BLOCK * sizeof *rs);
    for (size_t i = 0; i < (big > DET_LARGE ? big : DET_LARGE); i++)
        in[i] = fval(me, i);
    rc = wrk_coll_allreduce(g, in, small, DET_SMALL, WRK_COLL_F32, WRK_COLL_SUM, NULL);
    if (rc == 0)
        rc = wrk_coll_allreduce(g, in, large, DET_LARGE, WRK_COLL_F32, WRK_COLL_SUM, NULL);
    if (rc == 0)
        rc = wrk_coll_reduce_scatter(g, in, rs, DET_BLOCK, WRK_COLL_F32, WRK_COLL_SUM, NULL);
    /* the result is the sum, up to rounding */
    for (size_t i = 0; i < DET_LARGE && rc == 0; i++) {
        double want = 0;
        for (uint32_t r = 0; r < n; r++)
            want += fval(r, i);
        if (fabs(large[i] - want) > 1e-5 * (1 << 4) * n)
            rc = fail(t, "allreduce [%zu] = %.9g, want %.9g", i, (double)large[i], want);
    }
    o->ar_small[me] = small, o->ar_large[me] = large, o->rs[me] = rs;
    free(in);
    wrk_coll_group_destroy(g);
    return rc;
}

static void det_free(det_out_t *o)
{
    for (uint32_t r = 0; r < o->n; r++) {
        free(o->ar_small[r]);
        free(o->ar_large[r]);
        free(o->rs[r]);
    }
}

static void check_deterministic(uint32_t n)
{
    det_out_t a = {.n = n}, b = {.n = n};
    expect_all_ok(n, det_rank, &a);
    expect_all_ok(n, det_rank, &b);
    for (uint32_t r = 0; r < n; r++) {
        cr_assert(a.ar_small[r] && a.ar_large[r] && a.rs[r] && b.ar_small[r] && b.ar_large[r] &&
                  b.rs[r]);
        cr_expect_eq(memcmp(a.ar_small[r], b.ar_small[r], DET_SMALL * sizeof(float)), 0,
                     "small allreduce differs between runs on rank %u", r);
        cr_expect_eq(memcmp(a.ar_large[r], b.ar_large[r], DET_LARGE * sizeof(float)), 0,
                     "large allreduce differs between runs on rank %u", r);
        cr_expect_eq(memcmp(a.rs[r], b.rs[r], DET_BLOCK * sizeof(float)), 0,
                     "reduce_scatter differs between runs on rank %u", r);
        cr_expect_eq(memcmp(a.ar_small[r], a.ar_small[0], DET_SMALL * sizeof(float)), 0,
                     "small allreduce differs between rank %u and rank 0", r);
        cr_expect_eq(memcmp(a.ar_large[r], a.ar_large[0], DET_LARGE * sizeof(float)), 0,
                     "large allreduce differs between rank %u and rank 0", r);
    }
    det_free(&a);
    det_free(&b);
}

Test(coll, bit_identical_3_ranks, .timeout = 60)
{
    check_deterministic(3);
}

Test(coll, bit_identical_4_ranks, .timeout = 60)
{
    check_deterministic(4);
}

// ----------------------------------------------------------------------------
// failures: a rank that never joins, abort from another thread

#define FAIL_TIMEOUT_MS 2000

static int is_failure(int rc)
{
    return rc == -ETIMEDOUT || rc == CH_E_ABORTED;
}

/* The last rank leaves without joining; the others must get an error within the timeout,
 * and every later operation must fail at once. */
static int missing_rank(rank_ctx_t *t)
{
    wrk_coll_group_t *g = NULL;
    int rc = wrk_coll_group_layout(t->c, (ch_layout_t){1, 1, t->n}, WRK_COLL_GROUP_WORLD, &g);
    if (rc == 0)
        rc = wrk_coll_barrier(g, NULL); /* everyone connected and alive up to here */
    if (rc < 0 || t->rank == t->n - 1) {
        wrk_coll_group_destroy(g);
        return rc;
    }
    size_t count = 1u << 20;
    float *buf = calloc(count, sizeof *buf);
    uint64_t t0 = ch_now_ms();
    rc = wrk_coll_allreduce(g, buf, buf, count, WRK_COLL_F32, WRK_COLL_SUM, NULL);
    uint64_t took = ch_now_ms() - t0;
    if (!is_failure(rc))
        rc = fail(t, "allreduce without rank %u: %s", t->n - 1, ch_strerror(rc));
    else if (took > FAIL_TIMEOUT_MS + 1500)
        rc = fail(t, "failure took %llu ms", (unsigned long long)took);
    else {
        t0 = ch_now_ms();
        rc = wrk_coll_barrier(g, NULL);
        took = ch_now_ms() - t0;
        if (rc != CH_E_ABORTED || took > 100)
            rc = fail(t, "barrier after the failure: %s after %llu ms", ch_strerror(rc),
                      (unsigned long long)took);
        else
            rc = 0;
    }
    free(buf);
    wrk_coll_group_destroy(g);
    return rc;
}

Test(coll, missing_rank_times_out, .timeout = 60)
{
    rank_ctx_t ranks[4];
    run_ranks(4, missing_rank, NULL, FAIL_TIMEOUT_MS, ranks);
    for (uint32_t i = 0; i < 4; i++)
        cr_expect_eq(ranks[i].rc, 0, "rank %u: %s", i, ranks[i].msg);
}

typedef struct abort_sync {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done;
} abort_sync_t;

static void *abort_thread(void *arg)
{
    wrk_coll_abort(arg);
    return NULL;
}

/* Rank 0 starts an allreduce rank 1 never joins; another thread aborts the context. */
static int abort_rank(rank_ctx_t *t)
{
    abort_sync_t *s = t->arg;
    wrk_coll_group_t *g = NULL;
    int rc = wrk_coll_group_layout(t->c, (ch_layout_t){1, 1, t->n}, WRK_COLL_GROUP_WORLD, &g);
    if (rc < 0)
        return rc;
    if (t->rank == 1) {
        struct timespec dl;
        clock_gettime(CLOCK_REALTIME, &dl);
        dl.tv_sec += 20;
        pthread_mutex_lock(&s->mu);
        while (!s->done && rc == 0)
            rc = -pthread_cond_timedwait(&s->cv, &s->mu, &dl);
        pthread_mutex_unlock(&s->mu);
        wrk_coll_group_destroy(g);
        return rc;
    }
    float buf[64] = {0};
    wrk_coll_req_t *req = NULL;
    rc = wrk_coll_allreduce(g, buf, buf, 64, WRK_COLL_F32, WRK_COLL_SUM, &req);
    if (rc == 0) {
        pthread_t th;
        pthread_create(&th, NULL, abort_thread, t->c);
        pthread_join(th, NULL);
        uint64_t t0 = ch_now_ms();
        rc = wrk_coll_wait(req, 10000);
        uint64_t took = ch_now_ms() - t0;
        if (rc != CH_E_ABORTED || took > 500)
            rc = fail(t, "wait after abort: %s after %llu ms", ch_strerror(rc),
                      (unsigned long long)took);
        else if ((rc = wrk_coll_barrier(g, NULL)) != CH_E_ABORTED)
            rc = fail(t, "barrier after abort: %s", ch_strerror(rc));
        else if (wrk_coll_status(t->c) != CH_E_ABORTED)
            rc = fail(t, "status after abort: %s", ch_strerror(wrk_coll_status(t->c)));
        else
            rc = 0;
        wrk_coll_req_free(req);
    }
    pthread_mutex_lock(&s->mu);
    s->done = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    wrk_coll_group_destroy(g);
    return rc;
}

Test(coll, abort_fails_waits_fast, .timeout = 60)
{
    abort_sync_t s = {.done = 0};
    pthread_mutex_init(&s.mu, NULL);
    pthread_cond_init(&s.cv, NULL);
    expect_all_ok(2, abort_rank, &s);
    pthread_cond_destroy(&s.cv);
    pthread_mutex_destroy(&s.mu);
}

// ----------------------------------------------------------------------------
// groups from the layout, overlapping requests, pipeline p2p

static int same_group(ch_layout_t l, wrk_coll_group_kind_t kind, uint32_t a, uint32_t b)
{
    ch_coord_t x = ch_layout_coord(l, a), y = ch_layout_coord(l, b);
    switch (kind) {
    case WRK_COLL_GROUP_TP:
        return x.dp == y.dp && x.pp == y.pp;
    case WRK_COLL_GROUP_DP:
        return x.tp == y.tp && x.pp == y.pp;
    case WRK_COLL_GROUP_PP:
        return x.tp == y.tp && x.dp == y.dp;
    case WRK_COLL_GROUP_EMB:
        return x.tp == y.tp && x.dp == y.dp && (y.pp == 0 || y.pp == l.pp - 1);
    default:
        return 1;
    }
}

static int layout_rank(rank_ctx_t *t)
{
    const ch_layout_t *l = t->arg;
    static const wrk_coll_group_kind_t kinds[] = {WRK_COLL_GROUP_WORLD, WRK_COLL_GROUP_TP,
                                                  WRK_COLL_GROUP_DP, WRK_COLL_GROUP_PP,
                                                  WRK_COLL_GROUP_EMB};
    enum { NK = sizeof kinds / sizeof kinds[0] };
    wrk_coll_group_t *g[NK] = {NULL};
    wrk_coll_req_t *req[NK] = {NULL};
    float val[NK], want[NK];
    int rc = 0;
    uint32_t stage = ch_layout_coord(*l, t->rank).pp;
    for (int k = 0; k < NK && rc == 0; k++) {
        rc = wrk_coll_group_layout(t->c, *l, kinds[k], &g[k]);
        if (rc < 0)
            return fail(t, "group %d: %s", (int)kinds[k], ch_strerror(rc));
        int middle = kinds[k] == WRK_COLL_GROUP_EMB && stage != 0 && stage != l->pp - 1;
        if (middle != (g[k] == NULL))
            rc = fail(t, "embedding group on stage %u: %p", stage, (void *)g[k]);
        uint32_t members = 0;
        want[k] = 0;
        for (uint32_t r = 0; r < t->n; r++)
            if (same_group(*l, kinds[k], t->rank, r))
                members++, want[k] += (float)(r + 1);
        if (g[k] && wrk_coll_group_size(g[k]) != (middle ? 0 : members))
            rc = fail(t, "group %s has %u members, want %u", wrk_coll_group_name(g[k]),
                      wrk_coll_group_size(g[k]), members);
    }
    /* every group's allreduce in flight at once; waited in an order that differs by rank */
    for (int k = 0; k < NK && rc == 0; k++) {
        val[k] = (float)(t->rank + 1);
        if (g[k])
            rc = wrk_coll_allreduce(g[k], &val[k], &val[k], 1, WRK_COLL_F32, WRK_COLL_SUM, &req[k]);
    }
    for (int j = 0; j < NK && rc == 0; j++) {
        int k = t->rank % 2 ? NK - 1 - j : j;
        if (!req[k])
            continue;
        if ((rc = wrk_coll_wait(req[k], -1)) < 0)
            rc = fail(t, "%s allreduce: %s", wrk_coll_group_name(g[k]), ch_strerror(rc));
        else if (val[k] != want[k])
            rc = fail(t, "%s allreduce = %g, want %g", wrk_coll_group_name(g[k]), (double)val[k],
                      (double)want[k]);
    }
    /* activations down the pipeline: stage s sends its world rank to stage s+1 */
    wrk_coll_group_t *pp = g[3];
    uint32_t s = wrk_coll_group_index(pp), got = UINT32_MAX;
    if (rc == 0 && s > 0 &&
        (rc = wrk_coll_recv(pp, &got, sizeof got, WRK_COLL_U8, s - 1, NULL)) == 0 &&
        got != (uint32_t)ch_layout_pp_prev(*l, t->rank))
        rc = fail(t, "stage %u got %u from the previous stage", s, got);
    if (rc == 0 && s + 1 < wrk_coll_group_size(pp))
        rc = wrk_coll_send(pp, &t->rank, sizeof t->rank, WRK_COLL_U8, s + 1, NULL);
    for (int k = 0; k < NK; k++) {
        wrk_coll_req_free(req[k]);
        wrk_coll_group_destroy(g[k]);
    }
    return rc;
}

Test(coll, layout_groups_2x2x2, .timeout = 60)
{
    ch_layout_t l = {.tp = 2, .pp = 2, .dp = 2};
    expect_all_ok(8, layout_rank, &l);
}

Test(coll, layout_groups_tp1_dp2_pp3, .timeout = 60)
{
    ch_layout_t l = {.tp = 1, .pp = 3, .dp = 2};
    expect_all_ok(6, layout_rank, &l);
}

Test(coll, bad_arguments)
{
    ts_rdzv_table_t table;
    ts_rdzv_table_init(&table);
    wrk_coll_config_t cfg;
    wrk_coll_config_defaults(&cfg);
    cfg.rdzv = (ch_rdzv_t){.ud = &table, .set = ts_rdzv_table_set, .get = ts_rdzv_table_get};
    wrk_coll_t *c = NULL;
    cr_assert_eq(wrk_coll_create(&cfg, &c), 0);
    wrk_coll_group_t *g = NULL;
    uint32_t not_me = 1, me = 0;
    cr_expect_eq(wrk_coll_group_create(c, "x", WRK_COLL_GROUP_CUSTOM, &not_me, 1, &g), -EINVAL);
    cr_assert_eq(wrk_coll_group_create(c, "x", WRK_COLL_GROUP_CUSTOM, &me, 1, &g), 0);
    float f = 1;
    uint8_t b = 1;
    cr_expect_eq(wrk_coll_send(g, &f, 1, WRK_COLL_F32, 0, NULL), -EINVAL, "send to self");
    cr_expect_eq(wrk_coll_sendrecv(g, &f, 1, 0, &f, 1, 0, WRK_COLL_F32, NULL), -EINVAL,
                 "exchange with self");
    cr_expect_eq(wrk_coll_broadcast(g, &f, 1, WRK_COLL_F32, 1, NULL), -EINVAL, "bad root");
    cr_expect_eq(wrk_coll_allreduce(g, &b, &b, 1, WRK_COLL_U8, WRK_COLL_SUM, NULL), -EINVAL,
                 "u8 reduction");
    cr_expect_eq(wrk_coll_allreduce(g, &f, &f, 1, WRK_COLL_F32, WRK_COLL_MAX, NULL), 0);
    cr_expect_eq(f, 1.0f);
    /* the byte counters count what started, 2 bytes a bf16 (reductions: test_coll_bf16.c) */
    uint16_t h[3] = {0x3f80, 0x4000, 0xc040}, hg[3] = {0};
    cr_expect_eq(wrk_coll_allreduce(g, h, h, 3, WRK_COLL_BF16, WRK_COLL_SUM, NULL), 0);
    cr_expect_eq(wrk_coll_allgather(g, h, hg, 3, WRK_COLL_BF16, NULL), 0);
    cr_expect_arr_eq(hg, h, sizeof h);
    cr_expect_eq(wrk_coll_group_bytes(g, WRK_COLL_OP_ALLGATHER), 6);
    cr_expect_eq(wrk_coll_group_bytes(g, WRK_COLL_OP_ALLREDUCE), 4 + 6);
    cr_expect_eq(wrk_coll_group_bytes(NULL, WRK_COLL_OP_ALLGATHER), 0);
    cr_expect_str_eq(wrk_coll_dtype_name(WRK_COLL_BF16), "bf16");
    wrk_coll_group_destroy(g);
    wrk_coll_destroy(c);
    ts_rdzv_table_fini(&table);
}

// ----------------------------------------------------------------------------
// a rank process killed mid-collective (ranks as processes, rendezvous through files)

static int file_set(void *ud, const char *key, const void *val, size_t len)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", (const char *)ud, key + 4); /* "ucx/<r>" -> "<r>" */
    return ch_file_write_atomic(path, val, len, 0600);
}

static int file_get(void *ud, const char *key, int timeout_ms, void **val, size_t *len)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", (const char *)ud, key + 4);
    uint64_t deadline = ch_now_ms() + (uint64_t)timeout_ms;
    for (;;) {
        char *data = NULL;
        int rc = ch_file_read(path, CH_RDZV_VALUE_MAX, &data, len);
        if (rc != -ENOENT) {
            *val = data;
            return rc;
        }
        if (ch_now_ms() >= deadline)
            return -ETIMEDOUT;
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
}

enum { KILLED_RANK = 2, KILL_TIMEOUT_MS = 20000 };

/* Exit status: 0 the failure surfaced well before the timeout; 2 wrong code; 3 too slow.
 * reg: the buffer comes from wrk_coll_mem_alloc (peers reduce in it in place). */
static int killed_peer_child(uint32_t rank, uint32_t n, const char *dir, int reg)
{
    wrk_coll_config_t cfg;
    wrk_coll_config_defaults(&cfg);
    cfg.rank = rank;
    cfg.world_size = n;
    cfg.rdzv = (ch_rdzv_t){.ud = (void *)dir, .set = file_set, .get = file_get};
    cfg.timeout_ms = KILL_TIMEOUT_MS;
    wrk_coll_t *c = NULL;
    wrk_coll_group_t *g = NULL;
    if (wrk_coll_create(&cfg, &c) < 0 ||
        wrk_coll_group_layout(c, (ch_layout_t){1, 1, n}, WRK_COLL_GROUP_WORLD, &g) < 0)
        return 4;
    size_t count = 4u << 20;
    float *buf = NULL;
    if (reg && wrk_coll_mem_alloc(c, count * sizeof *buf, (void **)&buf) < 0)
        return 4;
    if (!reg && !(buf = calloc(count, sizeof *buf)))
        return 4;
    if (wrk_coll_allreduce(g, buf, buf, count, WRK_COLL_F32, WRK_COLL_SUM, NULL) < 0)
        return 5;
    /* In place, a member's share of a zero-copy allreduce is one pass it can finish alone
     * as soon as the others have announced their buffers: to die in the middle of the
     * others' collective it dies before starting it. */
    if (reg && rank == KILLED_RANK)
        raise(SIGKILL);
    wrk_coll_req_t *req = NULL;
    if (wrk_coll_allreduce(g, buf, buf, count, WRK_COLL_F32, WRK_COLL_SUM, &req) < 0)
        return 5;
    if (rank == KILLED_RANK) {
        int done = 0;
        for (int i = 0; i < 50 && !done; i++)
            wrk_coll_test(req, &done);
        raise(SIGKILL);
    }
    uint64_t t0 = ch_now_ms();
    int rc = wrk_coll_wait(req, -1);
    uint64_t took = ch_now_ms() - t0;
    fprintf(stderr, "rank %u: %s after %llu ms\n", rank, ch_strerror(rc), (unsigned long long)took);
    wrk_coll_req_free(req);
    wrk_coll_group_destroy(g);
    if (reg)
        wrk_coll_mem_free(c, buf);
    else
        free(buf);
    wrk_coll_destroy(c);
    return rc != CH_E_ABORTED ? 2 : took > KILL_TIMEOUT_MS / 4 ? 3 : 0;
}

static void killed_peer(int reg)
{
    char dir[512];
    cr_assert_eq(ts_tmpdir("chorus-test-coll", dir, sizeof dir), 0);
    enum { N = 3 };
    pid_t pids[N];
    for (uint32_t r = 0; r < N; r++) {
        pids[r] = fork();
        cr_assert_geq(pids[r], 0);
        if (pids[r] == 0)
            _exit(killed_peer_child(r, N, dir, reg));
    }
    for (uint32_t r = 0; r < N; r++) {
        int st = 0;
        cr_assert_eq(waitpid(pids[r], &st, 0), pids[r]);
        if (r == KILLED_RANK)
            cr_expect(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "rank %u: status %d", r, st);
        else
            cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "rank %u: status %d", r, st);
    }
    cr_expect_eq(ts_rmrf(dir), 0);
}

Test(coll, killed_peer_process_fails_fast, .timeout = 60)
{
    killed_peer(0);
}

/* Registered buffers, which the members map from each other: a member that dies while the
 * others are in a zero-copy allreduce fails them fast, and their mappings of its memory
 * do not fault. */
Test(coll, killed_peer_process_zero_copy_fails_fast, .timeout = 60)
{
    killed_peer(1);
}

// ----------------------------------------------------------------------------
// NCCL backend: one rank per GPU; with one GPU, a communicator of one (init, every op on
// device memory, abort). Skips without a GPU.

static int nccl_rank(rank_ctx_t *t)
{
    wrk_coll_group_t *g = NULL;
    int rc = wrk_coll_group_layout(t->c, (ch_layout_t){1, 1, t->n}, WRK_COLL_GROUP_WORLD, &g);
    if (rc < 0)
        return fail(t, "nccl group: %s", ch_strerror(rc));
    uint32_t n = t->n, me = t->rank;
    size_t count = 1u << 20, block = count / n;
    float *host = filled(me, count, 0);
    void *dev = NULL, *out = NULL;
    if ((rc = wrk_coll_mem_alloc(t->c, count * sizeof(float), &dev)) < 0 ||
        (rc = wrk_coll_mem_alloc(t->c, count * sizeof(float), &out)) < 0 ||
        (rc = wrk_coll_mem_copy(t->c, dev, host, count * sizeof(float), 1)) < 0)
        goto out;
    if ((rc = wrk_coll_allreduce(g, dev, out, count, WRK_COLL_F32, WRK_COLL_SUM, NULL)) < 0 ||
        (rc = wrk_coll_mem_copy(t->c, host, out, count * sizeof(float), 0)) < 0 ||
        (rc = check(t, "nccl allreduce", count, host, 0, ref_sum, n)) < 0)
        goto out;
    if ((rc = wrk_coll_reduce_scatter(g, dev, out, block, WRK_COLL_F32, WRK_COLL_SUM, NULL)) < 0 ||
        (rc = wrk_coll_mem_copy(t->c, host, out, block * sizeof(float), 0)) < 0 ||
        (rc = check(t, "nccl reduce_scatter", block, host, me * block, ref_sum, n)) < 0)
        goto out;
    free(host);
    host = filled(me, block, me * block);
    if ((rc = wrk_coll_mem_copy(t->c, dev, host, block * sizeof(float), 1)) < 0 ||
        (rc = wrk_coll_allgather(g, dev, out, block, WRK_COLL_F32, NULL)) < 0)
        goto out;
    free(host);
    host = calloc(count, sizeof *host);
    if ((rc = wrk_coll_mem_copy(t->c, host, out, block * n * sizeof(float), 0)) < 0 ||
        (rc = check_gather(t, "nccl allgather", block, host)) < 0 ||
        (rc = wrk_coll_broadcast(g, out, count, WRK_COLL_F32, 0, NULL)) < 0 ||
        (rc = wrk_coll_barrier(g, NULL)) < 0)
        goto out;
    /* abort: waits and new operations fail fast */
    wrk_coll_abort(t->c);
    if ((rc = wrk_coll_barrier(g, NULL)) != CH_E_ABORTED)
        rc = fail(t, "barrier after abort: %s", ch_strerror(rc));
    else
        rc = 0;
out:
    if (rc < 0 && !t->msg[0])
        fail(t, "nccl: %s", ch_strerror(rc));
    wrk_coll_mem_free(t->c, out);
    wrk_coll_mem_free(t->c, dev);
    free(host);
    wrk_coll_group_destroy(g);
    return rc;
}

static void *nccl_rank_main(void *arg)
{
    rank_ctx_t *t = arg;
    wrk_coll_config_t cfg;
    wrk_coll_config_defaults(&cfg);
    cfg.backend = WRK_COLL_NCCL;
    cfg.rank = t->rank;
    cfg.world_size = t->n;
    cfg.device = (int)t->rank;
    cfg.rdzv = (ch_rdzv_t){.ud = t->table, .set = ts_rdzv_table_set, .get = ts_rdzv_table_get};
    cfg.timeout_ms = 60000;
    t->rc = wrk_coll_create(&cfg, &t->c);
    if (t->rc < 0) {
        snprintf(t->msg, sizeof t->msg, "nccl create: %s", ch_strerror(t->rc));
        return NULL;
    }
    t->rc = nccl_rank(t);
    wrk_coll_destroy(t->c);
    return NULL;
}

Test(coll, nccl_one_rank_per_gpu, .timeout = 120)
{
    if (!wrk_coll_backend_available(WRK_COLL_NCCL))
        cr_skip("no GPU (or built without CUDA/NCCL)");
    ts_rdzv_table_t table;
    ts_rdzv_table_init(&table);
    rank_ctx_t t = {.rank = 0, .n = 1, .table = &table};
    nccl_rank_main(&t);
    cr_expect_eq(t.rc, 0, "%s", t.msg);
    ts_rdzv_table_fini(&table);
}
