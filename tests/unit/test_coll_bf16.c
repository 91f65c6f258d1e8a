/* bf16 reductions of the collectives (coll.h): every pairwise add widens to fp32 and rounds
 * the sum to bf16 (kernels/bf16.h, ties to even), so two members get round(a + b) on every
 * backend. Hand-computed cases (ties, overflow to infinity, NaN, signed zero, subnormals) for
 * all-reduce and reduce-scatter, small (UCX recursive doubling, shm steps) and large (UCX
 * ring, shm zero copy on registered memory), over shared memory, UCX messages and ncclsim;
 * integer data for 3 and 4 members (exact in any order) and one case where the order of the
 * roundings shows (group order: shm, ncclsim, UCX recursive doubling of 3). Ranks are threads
 * (test_coll.c's scheme). */
#include <criterion/criterion.h>

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "kernels/bf16.h"
#include "ncclsim.h"
#include "support.h"
#include "workerd/coll/coll.h"

#define NAN16 0xffffu /* in a case's want: any NaN */

typedef struct {
    uint16_t a, b, want;
} bcase_t;

/* member 0 holds a, member 1 holds b; want = round(a + b) */
static const bcase_t sums[] = {
    {0x3f80, 0x3b80, 0x3f80}, /* 1 + 2^-8: the tie rounds to even, down */
    {0x3f81, 0x3b80, 0x3f82}, /* (1 + 2^-7) + 2^-8: the tie rounds to even, up */
    {0x3f80, 0x3b81, 0x3f81}, /* just above the tie: up */
    {0x4380, 0x3f80, 0x4380}, /* 256 + 1: the tie, to even */
    {0x4380, 0xbf80, 0x437f}, /* 256 - 1 = 255: exact */
    {0x7f7f, 0x7b00, 0x7f80}, /* largest + half an ulp: to +inf */
    {0x7f7f, 0x7a80, 0x7f7f}, /* largest + a quarter ulp: stays */
    {0xff7f, 0xff7f, 0xff80}, /* -largest twice: -inf */
    {0x3f80, 0xbf80, 0x0000}, /* 1 - 1 = +0 */
    {0x8000, 0x8000, 0x8000}, /* -0 + -0 = -0 */
    {0x0001, 0x0001, 0x0002}, /* subnormals add exactly */
    {0x7f80, 0x3f80, 0x7f80}, /* inf + 1 */
    {0x7f80, 0xff80, NAN16},  /* inf - inf */
    {0x7fc0, 0x3f80, NAN16},  /* NaN + 1 */
    {0x3f80, 0xffc0, NAN16},  /* 1 + -NaN */
};
#define NSUMS (sizeof sums / sizeof sums[0])

static const bcase_t maxes[] = {
    {0x3f81, 0x3f80, 0x3f81}, {0xbf80, 0x3f80, 0x3f80}, {0x8000, 0x0000, 0x0000},
    {0x0000, 0x8000, 0x0000}, {0x7fc0, 0x3f80, NAN16},  {0xff80, 0x0001, 0x0001},
};
#define NMAXES (sizeof maxes / sizeof maxes[0])

typedef struct rank_ctx {
    uint32_t rank, n;
    ts_rdzv_table_t *table;
    ncclsim_t *sim; /* NULL: UCX (shm or messages, CHORUS_COLL_SHM) */
    int (*fn)(struct rank_ctx *t, wrk_coll_group_t *g);
    wrk_coll_t *c;
    int rc;
    char msg[256];
} rank_ctx_t;

#define fail(t, ...) ts_fail((t)->msg, sizeof(t)->msg, __VA_ARGS__)

static int is_nan16(uint16_t h)
{
    return (h & 0x7f80u) == 0x7f80u && (h & 0x7fu) != 0;
}

static int same16(uint16_t got, uint16_t want)
{
    return want == NAN16 ? is_nan16(got) : got == want;
}

static void *rank_main(void *arg)
{
    rank_ctx_t *t = arg;
    wrk_coll_config_t cfg;
    ts_coll_config(t->table, t->rank, t->n, 20000, &cfg);
    if (t->sim)
        ncclsim_config(t->sim, &cfg);
    t->rc = wrk_coll_create(&cfg, &t->c);
    if (t->rc < 0) {
        snprintf(t->msg, sizeof t->msg, "create: %s", ch_strerror(t->rc));
        return NULL;
    }
    wrk_coll_group_t *g = NULL;
    t->rc = wrk_coll_group_layout(t->c, (ch_layout_t){1, 1, t->n}, WRK_COLL_GROUP_WORLD, &g);
    if (t->rc == 0)
        t->rc = t->fn(t, g);
    if (t->rc < 0 && !t->msg[0])
        snprintf(t->msg, sizeof t->msg, "%s", ch_strerror(t->rc));
    wrk_coll_group_destroy(g);
    wrk_coll_destroy(t->c);
    return NULL;
}

static void run(uint32_t n, int sim, int (*fn)(rank_ctx_t *, wrk_coll_group_t *))
{
    ts_rdzv_table_t table;
    ts_rdzv_table_init(&table);
    ncclsim_t *s = NULL;
    if (sim)
        cr_assert_eq(ncclsim_create(n, &s), 0);
    rank_ctx_t r[4];
    pthread_t th[4];
    cr_assert_leq(n, 4);
    for (uint32_t i = 0; i < n; i++) {
        r[i] = (rank_ctx_t){.rank = i, .n = n, .table = &table, .sim = s, .fn = fn};
        cr_assert_eq(pthread_create(&th[i], NULL, rank_main, &r[i]), 0);
    }
    for (uint32_t i = 0; i < n; i++)
        pthread_join(th[i], NULL);
    for (uint32_t i = 0; i < n; i++)
        cr_expect_eq(r[i].rc, 0, "%s, rank %u of %u: %s", sim ? "ncclsim" : "ucx", i, n, r[i].msg);
    ncclsim_destroy(s);
    ts_rdzv_table_fini(&table);
}

/* Buffers of count elements from backend memory (registered: shm's zero copy) */
static int alloc2(rank_ctx_t *t, size_t count, uint16_t **x, uint16_t **y)
{
    *x = *y = NULL;
    int rc = wrk_coll_mem_alloc(t->c, count * 2, (void **)x);
    if (rc == 0 && (rc = wrk_coll_mem_alloc(t->c, count * 2, (void **)y)) < 0) {
        wrk_coll_mem_free(t->c, *x);
        *x = NULL;
    }
    return rc;
}

static void free2(rank_ctx_t *t, uint16_t *x, uint16_t *y)
{
    wrk_coll_mem_free(t->c, x);
    wrk_coll_mem_free(t->c, y);
}

/* The cases of tab (repeated to count elements): allreduce into y, in place on x, and a
 * reduce-scatter of two such vectors (member i gets block i). */
static int two_member_cases(rank_ctx_t *t, wrk_coll_group_t *g, const bcase_t *tab, size_t nt,
                            wrk_coll_redop_t op, size_t count)
{
    uint16_t *x, *y;
    int rc = alloc2(t, 2 * count, &x, &y);
    for (int pass = 0; pass < 3 && rc == 0; pass++) {
        for (size_t i = 0; i < 2 * count; i++)
            x[i] = t->rank ? tab[i % count % nt].b : tab[i % count % nt].a;
        uint16_t *out = pass == 1 ? x : y;
        if (pass < 2)
            rc = wrk_coll_allreduce(g, x, out, count, WRK_COLL_BF16, op, NULL);
        else
            rc = wrk_coll_reduce_scatter(g, x, y, count, WRK_COLL_BF16, op, NULL);
        for (size_t i = 0; rc == 0 && i < count; i++)
            if (!same16(out[i], tab[i % nt].want))
                rc = fail(t, "%s pass %d count %zu: [%zu] %04x + %04x = %04x, want %04x",
                          op == WRK_COLL_MAX ? "max" : "sum", pass, count, i, tab[i % nt].a,
                          tab[i % nt].b, out[i], tab[i % nt].want);
    }
    free2(t, x, y);
    return rc;
}

enum { BIG = (1u << 19) + 13 }; /* 1 MiB and more: UCX ring, shm zero copy */

static int cases_rank(rank_ctx_t *t, wrk_coll_group_t *g)
{
    int rc = two_member_cases(t, g, sums, NSUMS, WRK_COLL_SUM, NSUMS);
    if (rc == 0)
        rc = two_member_cases(t, g, maxes, NMAXES, WRK_COLL_MAX, NMAXES);
    if (rc == 0)
        rc = two_member_cases(t, g, sums, NSUMS, WRK_COLL_SUM, BIG);
    if (rc == 0 && wrk_coll_group_bytes(g, WRK_COLL_OP_ALLREDUCE) != 2 * 2 * (NSUMS + NMAXES + BIG))
        rc = fail(t, "allreduce bytes %llu: 2 a bf16",
                  (unsigned long long)wrk_coll_group_bytes(g, WRK_COLL_OP_ALLREDUCE));
    return rc;
}

/* x[i] small integers: every sum is exact in bf16 (|sum| <= 32), whatever the order */
static uint16_t ival(uint32_t rank, size_t i)
{
    return kn_bf16_from_f32((float)((int)((rank * 131u + (uint32_t)(i % 100003u) * 7u) % 17u) - 8));
}

static int integer_rank(rank_ctx_t *t, wrk_coll_group_t *g)
{
    uint16_t *x, *y;
    size_t sizes[2] = {1001, BIG}, n = t->n;
    int rc = 0;
    for (int s = 0; s < 2 && rc == 0; s++) {
        size_t count = sizes[s];
        if ((rc = alloc2(t, n * count, &x, &y)) < 0)
            break;
        for (int rs = 0; rs < 2 && rc == 0; rs++) {
            for (size_t i = 0; i < n * count; i++)
                x[i] = ival(t->rank, i);
            rc = rs ? wrk_coll_reduce_scatter(g, x, y, count, WRK_COLL_BF16, WRK_COLL_SUM, NULL)
                    : wrk_coll_allreduce(g, x, y, count, WRK_COLL_BF16, WRK_COLL_SUM, NULL);
            size_t first = rs ? t->rank * count : 0;
            for (size_t i = 0; rc == 0 && i < count; i++) {
                float want = 0;
                for (uint32_t r = 0; r < n; r++)
                    want += kn_f32_from_bf16(ival(r, first + i));
                if (kn_f32_from_bf16(y[i]) != want)
                    rc = fail(t, "%s n=%zu count=%zu [%zu] = %g, want %g", rs ? "rs" : "ar", n,
                              count, i, (double)kn_f32_from_bf16(y[i]), (double)want);
            }
        }
        free2(t, x, y);
    }
    return rc;
}

/* 1 + 2^-8 + 2^-8 in group order: (1 + 2^-8) rounds to 1 (tie, even), then again: 1, where
 * the exact sum 1 + 2^-7 is a bf16. Shows that each partial sum rounds. */
static int order_rank(rank_ctx_t *t, wrk_coll_group_t *g)
{
    uint16_t x[3] = {t->rank ? 0x3b80 : 0x3f80, 0x3f80, 0x3f80}, y[3];
    int rc = wrk_coll_allreduce(g, x, y, 1, WRK_COLL_BF16, WRK_COLL_SUM, NULL);
    if (rc == 0 && y[0] != 0x3f80)
        rc = fail(t, "((1 + 2^-8) + 2^-8) = %04x, want 3f80", y[0]);
    return rc;
}

Test(coll_bf16, two_members_shm, .timeout = 60)
{
    run(2, 0, cases_rank);
}

Test(coll_bf16, two_members_ucx_messages, .timeout = 60)
{
    setenv("CHORUS_COLL_SHM", "0", 1);
    run(2, 0, cases_rank);
}

Test(coll_bf16, two_members_ncclsim, .timeout = 60)
{
    run(2, 1, cases_rank);
}

Test(coll_bf16, three_and_four_members_exact, .timeout = 120)
{
    run(3, 0, integer_rank);
    run(4, 0, integer_rank);
    run(3, 1, integer_rank);
    run(3, 0, order_rank);
    run(3, 1, order_rank);
}

Test(coll_bf16, three_and_four_members_ucx_messages, .timeout = 120)
{
    setenv("CHORUS_COLL_SHM", "0", 1);
    run(3, 0, integer_rank);
    run(4, 0, integer_rank);
    run(3, 0, order_rank);
}
