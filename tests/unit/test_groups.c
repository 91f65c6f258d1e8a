/* A rank's process groups (workerd/engine/groups.h), ranks as threads: the members of
 * every group of every rank on 2x1x2, 1x2x2 and 1x3x1 layouts (tp x pp x dp), the pipeline
 * neighbours, and groups of one rank as NULL. */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <string.h>

#include "common/err.h"
#include "support.h"
#include "workerd/coll/coll.h"
#include "workerd/engine/groups.h"

enum { MAXR = 4, NONE = -2 };

/* What one rank saw: each group's world ranks in group order (members[0] == NONE: NULL). */
typedef struct seen {
    int tp[MAXR], dp[MAXR], pp[MAXR], emb[MAXR];
    int32_t pp_prev, pp_next;
    ch_coord_t coord;
    float dp_sum; /* sum of the DP members' world ranks, by an all-reduce over the group */
} seen_t;

typedef struct rank_arg {
    ts_rdzv_table_t *table;
    ch_layout_t layout;
    uint32_t rank;
    seen_t seen;
    int rc;
} rank_arg_t;

static void members(const wrk_coll_group_t *g, int *out)
{
    for (int i = 0; i < MAXR; i++)
        out[i] = -1;
    if (!g) {
        out[0] = NONE;
        return;
    }
    for (uint32_t i = 0; i < wrk_coll_group_size(g) && i < MAXR; i++)
        out[i] = (int)wrk_coll_group_rank(g, i);
}

static void *rank_main(void *p)
{
    rank_arg_t *a = p;
    wrk_coll_t *c = NULL;
    eng_groups_t *g = NULL;
    a->rc = ts_coll_create(a->table, a->rank, ch_layout_world(a->layout), 30000, &c);
    if (a->rc == 0)
        a->rc = eng_groups_create(c, a->layout, a->rank, &g);
    if (a->rc == 0) {
        members(g->tp, a->seen.tp);
        members(g->dp, a->seen.dp);
        members(g->pp, a->seen.pp);
        members(g->emb, a->seen.emb);
        a->seen.pp_prev = g->pp_prev;
        a->seen.pp_next = g->pp_next;
        a->seen.coord = g->coord;
        a->seen.dp_sum = (float)a->rank;
        if (g->dp)
            a->rc = wrk_coll_allreduce(g->dp, &a->seen.dp_sum, &a->seen.dp_sum, 1, WRK_COLL_F32,
                                       WRK_COLL_SUM, NULL);
    }
    eng_groups_destroy(g);
    wrk_coll_destroy(c);
    return NULL;
}

static void run(ch_layout_t l, rank_arg_t *ranks)
{
    uint32_t n = ch_layout_world(l);
    cr_assert_leq(n, MAXR);
    ts_rdzv_table_t table;
    ts_rdzv_table_init(&table);
    pthread_t th[MAXR];
    for (uint32_t r = 0; r < n; r++) {
        ranks[r] = (rank_arg_t){.table = &table, .layout = l, .rank = r};
        cr_assert_eq(pthread_create(&th[r], NULL, rank_main, &ranks[r]), 0);
    }
    for (uint32_t r = 0; r < n; r++)
        pthread_join(th[r], NULL);
    ts_rdzv_table_fini(&table);
    for (uint32_t r = 0; r < n; r++)
        cr_assert_eq(ranks[r].rc, 0, "rank %u: %s", r, ch_strerror(ranks[r].rc));
}

static void expect_members(const int *got, const int *want, uint32_t rank, const char *what)
{
    for (int i = 0; i < MAXR; i++)
        cr_expect_eq(got[i], want[i], "rank %u %s member %d: %d, expected %d", rank, what, i,
                     got[i], want[i]);
}

/* tp = 2, pp = 1, dp = 2: rank = tp + 2*dp. */
Test(groups, tensor_and_data_parallel_2x1x2)
{
    rank_arg_t r[MAXR];
    run((ch_layout_t){.tp = 2, .pp = 1, .dp = 2}, r);
    static const int tp[MAXR][MAXR] = {
        {0, 1, -1, -1}, {0, 1, -1, -1}, {2, 3, -1, -1}, {2, 3, -1, -1}};
    static const int dp[MAXR][MAXR] = {
        {0, 2, -1, -1}, {1, 3, -1, -1}, {0, 2, -1, -1}, {1, 3, -1, -1}};
    static const int none[MAXR] = {NONE, -1, -1, -1};
    for (uint32_t i = 0; i < 4; i++) {
        expect_members(r[i].seen.tp, tp[i], i, "tp");
        expect_members(r[i].seen.dp, dp[i], i, "dp");
        expect_members(r[i].seen.pp, none, i, "pp");
        expect_members(r[i].seen.emb, none, i, "emb");
        cr_expect(r[i].seen.pp_prev == -1 && r[i].seen.pp_next == -1);
        cr_expect(r[i].seen.coord.tp == i % 2 && r[i].seen.coord.dp == i / 2 &&
                  r[i].seen.coord.pp == 0);
        cr_expect_eq(r[i].seen.dp_sum, (float)(dp[i][0] + dp[i][1]), "rank %u dp all-reduce", i);
    }
}

/* tp = 1, pp = 2, dp = 2: rank = dp + 2*pp; stage 0 is ranks 0-1, stage 1 ranks 2-3. */
Test(groups, pipeline_and_data_parallel_1x2x2)
{
    rank_arg_t r[MAXR];
    run((ch_layout_t){.tp = 1, .pp = 2, .dp = 2}, r);
    static const int dp[MAXR][MAXR] = {
        {0, 1, -1, -1}, {0, 1, -1, -1}, {2, 3, -1, -1}, {2, 3, -1, -1}};
    static const int pp[MAXR][MAXR] = {
        {0, 2, -1, -1}, {1, 3, -1, -1}, {0, 2, -1, -1}, {1, 3, -1, -1}};
    static const int none[MAXR] = {NONE, -1, -1, -1};
    for (uint32_t i = 0; i < 4; i++) {
        uint32_t stage = i / 2;
        expect_members(r[i].seen.tp, none, i, "tp");
        expect_members(r[i].seen.dp, dp[i], i, "dp");
        expect_members(r[i].seen.pp, pp[i], i, "pp");
        expect_members(r[i].seen.emb, pp[i], i, "emb"); /* two stages: both ends */
        cr_expect_eq(r[i].seen.pp_prev, stage == 0 ? -1 : 0, "rank %u pp_prev", i);
        cr_expect_eq(r[i].seen.pp_next, stage == 0 ? 1 : -1, "rank %u pp_next", i);
        cr_expect(r[i].seen.coord.pp == stage && r[i].seen.coord.dp == i % 2);
    }
}

/* A middle stage is in no embedding group. */
Test(groups, a_middle_stage_has_no_embedding_group_1x3x1)
{
    rank_arg_t r[MAXR];
    run((ch_layout_t){.tp = 1, .pp = 3, .dp = 1}, r);
    static const int col[MAXR] = {0, 1, 2, -1}, ends[MAXR] = {0, 2, -1, -1};
    static const int none[MAXR] = {NONE, -1, -1, -1};
    for (uint32_t i = 0; i < 3; i++) {
        expect_members(r[i].seen.pp, col, i, "pp");
        expect_members(r[i].seen.emb, i == 1 ? none : ends, i, "emb");
        expect_members(r[i].seen.dp, none, i, "dp");
        cr_expect_eq(r[i].seen.pp_prev, (int32_t)i - 1);
        cr_expect_eq(r[i].seen.pp_next, i == 2 ? -1 : (int32_t)i + 1);
    }
}

Test(groups, a_world_of_one_needs_no_collectives)
{
    eng_groups_t *g = NULL;
    cr_assert_eq(eng_groups_create(NULL, (ch_layout_t){1, 1, 1}, 0, &g), 0);
    cr_expect(g->tp == NULL && g->dp == NULL && g->pp == NULL && g->emb == NULL);
    cr_expect(g->world == 1 && g->rank == 0 && g->pp_prev == -1 && g->pp_next == -1);
    eng_groups_destroy(g);
    g = NULL;
    cr_expect_eq(eng_groups_create(NULL, (ch_layout_t){1, 1, 2}, 0, &g), -EINVAL);
    cr_expect_eq(eng_groups_create(NULL, (ch_layout_t){1, 1, 1}, 1, &g), -EINVAL);
    cr_expect_eq(eng_groups_create(NULL, (ch_layout_t){0, 1, 1}, 0, &g), -EINVAL);
    cr_expect_null(g);
}
