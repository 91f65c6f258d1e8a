/* In-memory peer checkpoints' buddy rule (workerd/rank/memckpt.h): every rank's copy lives
 * on another node, so that losing any one node loses no rank's state, and the copies spread
 * over the next node's ranks. The save and restore paths run in
 * tests/integration/test_chaos_memory.c. */
#include <criterion/criterion.h>
#include <stdint.h>

#include "workerd/rank/memckpt.h"

/* Losing any single node leaves every rank's state somewhere: its own node's copy, or its
 * buddy's on another node. */
static void check_no_node_loses_a_state(const uint64_t *nodes, uint32_t world, const int64_t *buddy)
{
    for (uint32_t k = 0; k < world; k++) {
        cr_assert(buddy[k] >= 0 && buddy[k] < world, "rank %u: buddy %lld", k, (long long)buddy[k]);
        cr_assert_neq(nodes[buddy[k]], nodes[k], "rank %u's copy is on its own node", k);
    }
}

Test(memckpt, two_nodes_of_four_pair_rank_i_with_rank_i_of_the_other)
{
    /* tp 2 x pp 2 x dp 2 placed a stage per node: ranks 0-3 on A, 4-7 on B */
    const uint64_t nodes[8] = {10, 10, 10, 10, 20, 20, 20, 20};
    int64_t buddy[8];
    cr_assert_eq(wrk_memckpt_buddies(nodes, 8, buddy), 0);
    for (int k = 0; k < 8; k++)
        cr_assert_eq(buddy[k], (k + 4) % 8, "rank %d: %lld", k, (long long)buddy[k]);
    check_no_node_loses_a_state(nodes, 8, buddy);
}

Test(memckpt, uneven_interleaved_nodes_each_copy_elsewhere_spread_over_the_next)
{
    /* 3 nodes in rank order 7, 5, 9 (node 7's lowest rank is 0, node 5's is 1, 9's is 3),
     * holding 3, 2 and 2 ranks */
    const uint64_t nodes[7] = {7, 5, 7, 9, 5, 9, 7};
    int64_t buddy[7];
    cr_assert_eq(wrk_memckpt_buddies(nodes, 7, buddy), 0);
    check_no_node_loses_a_state(nodes, 7, buddy);
    /* node 7 (ranks 0, 2, 6) -> node 5 (ranks 1, 4): 0->1, 2->4, 6->1 */
    cr_assert_eq(buddy[0], 1);
    cr_assert_eq(buddy[2], 4);
    cr_assert_eq(buddy[6], 1);
    /* node 5 (1, 4) -> node 9 (3, 5); node 9 (3, 5) -> node 7 (0, 2, 6) */
    cr_assert_eq(buddy[1], 3);
    cr_assert_eq(buddy[4], 5);
    cr_assert_eq(buddy[3], 0);
    cr_assert_eq(buddy[5], 2);
}

Test(memckpt, one_node_has_no_copy_elsewhere)
{
    const uint64_t nodes[4] = {3, 3, 3, 3};
    int64_t buddy[4];
    cr_assert_eq(wrk_memckpt_buddies(nodes, 4, buddy), 0);
    for (int k = 0; k < 4; k++)
        cr_assert_eq(buddy[k], -1);
}
