/* coord_placement: TP groups never split, slot counts respected, racks spread, errors,
 * determinism. */
#include <criterion/criterion.h>
#include <string.h>

#include "common/err.h"
#include "common/layout.h"
#include "placement.h"

#define MAXR 512

static ch_layout_t L(uint32_t tp, uint32_t pp, uint32_t dp)
{
    ch_layout_t l = {tp, pp, dp};
    return l;
}

/* Invariants every successful placement must hold. */
static void check_valid(ch_layout_t l, const coord_place_node_t *nodes, size_t n,
                        const coord_place_rank_t *pl)
{
    uint32_t world = ch_layout_world(l);
    uint32_t used[64] = {0};
    cr_assert(n <= 64);
    for (uint32_t r = 0; r < world; r++) {
        cr_assert_lt(pl[r].node, n, "rank %u on node %u", r, pl[r].node);
        used[pl[r].node]++;
        /* TP group members share rank r's node. */
        uint32_t group[64];
        ch_layout_tp_group(l, r, group);
        for (uint32_t t = 0; t < l.tp; t++)
            cr_assert_eq(pl[group[t]].node, pl[r].node, "TP group of rank %u split", r);
    }
    for (size_t i = 0; i < n; i++) {
        cr_assert_leq(used[i], nodes[i].free_slots, "node %zu over its slots", i);
        /* Local ranks on node i are 0..used-1, ascending with the global rank. */
        int64_t last = -1;
        uint32_t k = 0;
        for (uint32_t r = 0; r < world; r++) {
            if (pl[r].node != i)
                continue;
            cr_assert_eq(pl[r].local_rank, k, "rank %u local %u, want %u", r, pl[r].local_rank, k);
            cr_assert_gt((int64_t)r, last);
            last = r;
            k++;
        }
        cr_assert_eq(coord_placement_local_world(pl, world, (uint32_t)i), used[i]);
    }
}

Test(placement, two_by_two_by_two_on_four_nodes_of_two)
{
    coord_place_node_t nodes[4] = {{"n1", "", 2}, {"n2", "", 2}, {"n3", "", 2}, {"n4", "", 2}};
    coord_place_rank_t pl[8];
    ch_layout_t l = L(2, 2, 2);
    cr_assert_eq(coord_placement(l, nodes, 4, pl), 0);
    check_valid(l, nodes, 4, pl);
    /* Each node holds exactly one TP group: ranks (0,1) (2,3) (4,5) (6,7). */
    for (uint32_t g = 0; g < 4; g++) {
        cr_assert_eq(pl[2 * g].node, pl[2 * g + 1].node);
        cr_assert_eq(pl[2 * g].local_rank, 0);
        cr_assert_eq(pl[2 * g + 1].local_rank, 1);
    }
    int seen[4] = {0};
    for (uint32_t r = 0; r < 8; r++)
        seen[pl[r].node]++;
    for (int i = 0; i < 4; i++)
        cr_assert_eq(seen[i], 2);
}

Test(placement, tp_groups_never_split_over_many_shapes)
{
    static const uint32_t slots_sets[][5] = {
        {8, 8, 8, 8, 0}, {4, 4, 4, 4, 4}, {3, 5, 7, 2, 8}, {6, 6, 2, 2, 2}, {1, 1, 1, 1, 1}};
    coord_place_rank_t pl[MAXR];
    int placed = 0, refused = 0;
    for (size_t s = 0; s < sizeof(slots_sets) / sizeof(slots_sets[0]); s++) {
        coord_place_node_t nodes[5];
        const char *racks[] = {"a", "b", "a", "c", "b"};
        for (int i = 0; i < 5; i++) {
            nodes[i].name = "n";
            nodes[i].rack = racks[i];
            nodes[i].free_slots = slots_sets[s][i];
        }
        for (uint32_t tp = 1; tp <= 8; tp *= 2)
            for (uint32_t pp = 1; pp <= 4; pp++)
                for (uint32_t dp = 1; dp <= 4; dp++) {
                    ch_layout_t l = L(tp, pp, dp);
                    uint32_t groups = 0;
                    for (int i = 0; i < 5; i++)
                        groups += nodes[i].free_slots / tp;
                    int rc = coord_placement(l, nodes, 5, pl);
                    if (groups >= pp * dp) {
                        cr_assert_eq(rc, 0, "tp%u pp%u dp%u set %zu: %d", tp, pp, dp, s, rc);
                        check_valid(l, nodes, 5, pl);
                        placed++;
                    } else {
                        cr_assert_eq(rc, CH_E_CAPACITY, "tp%u pp%u dp%u set %zu", tp, pp, dp, s);
                        refused++;
                    }
                }
    }
    cr_assert_gt(placed, 100);
    cr_assert_gt(refused, 10);
}

Test(placement, tp_larger_than_any_node_is_refused)
{
    /* 16 free slots in total, but no node can hold a TP group of 4. */
    coord_place_node_t nodes[4] = {{"n1", "", 3}, {"n2", "", 3}, {"n3", "", 3}, {"n4", "", 3}};
    coord_place_rank_t pl[12];
    cr_assert_eq(coord_placement(L(4, 1, 1), nodes, 4, pl), CH_E_CAPACITY);
    cr_assert_eq(coord_placement(L(4, 2, 1), nodes, 4, pl), CH_E_CAPACITY);
    cr_assert_eq(coord_placement(L(3, 2, 2), nodes, 4, pl), 0);
}

Test(placement, not_enough_slots_and_bad_input)
{
    coord_place_node_t nodes[2] = {{"n1", "", 2}, {"n2", "", 2}};
    coord_place_rank_t pl[8];
    cr_assert_eq(coord_placement(L(1, 1, 5), nodes, 2, pl), CH_E_CAPACITY);
    cr_assert_eq(coord_placement(L(1, 1, 1), nodes, 0, pl), CH_E_CAPACITY);
    cr_assert_eq(coord_placement(L(0, 1, 1), nodes, 2, pl), -EINVAL);
    cr_assert_eq(coord_placement(L(1, 0, 1), nodes, 2, pl), -EINVAL);
    cr_assert_eq(coord_placement(L(1, 1, 4), nodes, 2, pl), 0);
}

Test(placement, pipeline_stages_spread_across_racks)
{
    /* Two racks of two 4-slot nodes, listed interleaved. */
    coord_place_node_t nodes[4] = {
        {"a1", "rackA", 4}, {"b1", "rackB", 4}, {"a2", "rackA", 4}, {"b2", "rackB", 4}};
    coord_place_rank_t pl[16];
    ch_layout_t l = L(2, 2, 2);
    cr_assert_eq(coord_placement(l, nodes, 4, pl), 0);
    check_valid(l, nodes, 4, pl);
    for (uint32_t r = 0; r < 8; r++) {
        ch_coord_t co = ch_layout_coord(l, r);
        const char *want = co.pp == 0 ? "rackA" : "rackB";
        cr_assert_str_eq(nodes[pl[r].node].rack, want, "rank %u (stage %u)", r, co.pp);
    }
    /* A stage's DP replicas pack together: stage 0 fits on one 4-slot node. */
    cr_assert_eq(pl[0].node, pl[2].node);

    /* Four stages on two racks alternate racks. */
    l = L(1, 4, 2);
    cr_assert_eq(coord_placement(l, nodes, 4, pl), 0);
    check_valid(l, nodes, 4, pl);
    for (uint32_t r = 0; r < 8; r++) {
        ch_coord_t co = ch_layout_coord(l, r);
        cr_assert_str_eq(nodes[pl[r].node].rack, co.pp % 2 ? "rackB" : "rackA");
    }
}

Test(placement, falls_back_to_other_racks_when_one_is_full)
{
    coord_place_node_t nodes[3] = {{"a1", "A", 2}, {"b1", "B", 2}, {"b2", "B", 2}};
    coord_place_rank_t pl[6];
    ch_layout_t l = L(1, 2, 3); /* stage 0 needs 3 slots, rack A has 2 */
    cr_assert_eq(coord_placement(l, nodes, 3, pl), 0);
    check_valid(l, nodes, 3, pl);
}

Test(placement, deterministic)
{
    coord_place_node_t nodes[5] = {
        {"n1", "x", 4}, {"n2", "y", 6}, {"n3", "x", 2}, {"n4", "z", 8}, {"n5", "y", 4}};
    coord_place_rank_t a[24], b[24];
    ch_layout_t l = L(2, 3, 4);
    cr_assert_eq(coord_placement(l, nodes, 5, a), 0);
    for (int i = 0; i < 5; i++) {
        memset(b, 0xab, sizeof(b));
        cr_assert_eq(coord_placement(l, nodes, 5, b), 0);
        cr_assert_eq(memcmp(a, b, sizeof(a)), 0);
    }
    check_valid(l, nodes, 5, a);
}
