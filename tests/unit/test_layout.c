/* Layout math: rank <-> coordinate, groups, pipeline neighbours, stage blocks, shards, vocab. */
#include <criterion/criterion.h>
#include <stdlib.h>

#include "common/layout.h"

static const ch_layout_t shapes[] = {
    {1, 1, 1}, {2, 1, 1}, {1, 2, 1}, {1, 1, 2},  {2, 2, 2}, {4, 2, 3},
    {3, 5, 2}, {8, 4, 1}, {1, 7, 5}, {2, 3, 16}, {8, 8, 8},
};
#define NSHAPES (sizeof(shapes) / sizeof(shapes[0]))

Test(layout, rank_coord_bijection)
{
    for (size_t s = 0; s < NSHAPES; s++) {
        ch_layout_t l = shapes[s];
        uint32_t world = ch_layout_world(l);
        cr_assert_eq(world, l.tp * l.pp * l.dp);
        for (uint32_t r = 0; r < world; r++) {
            ch_coord_t c = ch_layout_coord(l, r);
            cr_assert_lt(c.tp, l.tp);
            cr_assert_lt(c.dp, l.dp);
            cr_assert_lt(c.pp, l.pp);
            cr_assert_eq(c.tp + l.tp * (c.dp + l.dp * c.pp), r, "formula of DESIGN §5");
            cr_assert_eq(ch_layout_rank(l, c), r);
        }
    }
}

Test(layout, tp_is_fastest_then_dp_then_pp)
{
    ch_layout_t l = {2, 3, 4}; /* tp 2, pp 3, dp 4 */
    ch_coord_t c = ch_layout_coord(l, 1);
    cr_expect(c.tp == 1 && c.dp == 0 && c.pp == 0);
    c = ch_layout_coord(l, 2);
    cr_expect(c.tp == 0 && c.dp == 1 && c.pp == 0);
    c = ch_layout_coord(l, 8);
    cr_expect(c.tp == 0 && c.dp == 0 && c.pp == 1);
    c = ch_layout_coord(l, 23);
    cr_expect(c.tp == 1 && c.dp == 3 && c.pp == 2);
}

/* Each group contains rank itself, differs only in its own coordinate, in order. */
Test(layout, groups)
{
    for (size_t s = 0; s < NSHAPES; s++) {
        ch_layout_t l = shapes[s];
        uint32_t *g = calloc(64, sizeof(uint32_t));
        for (uint32_t r = 0; r < ch_layout_world(l); r++) {
            ch_coord_t me = ch_layout_coord(l, r);

            ch_layout_tp_group(l, r, g);
            for (uint32_t i = 0; i < l.tp; i++) {
                ch_coord_t c = ch_layout_coord(l, g[i]);
                cr_assert(c.tp == i && c.dp == me.dp && c.pp == me.pp);
            }
            cr_assert_eq(g[me.tp], r);
            cr_assert_eq(g[l.tp - 1] - g[0], l.tp - 1, "TP group is consecutive ranks");

            ch_layout_dp_group(l, r, g);
            for (uint32_t i = 0; i < l.dp; i++) {
                ch_coord_t c = ch_layout_coord(l, g[i]);
                cr_assert(c.dp == i && c.tp == me.tp && c.pp == me.pp);
            }
            cr_assert_eq(g[me.dp], r);

            ch_layout_pp_group(l, r, g);
            for (uint32_t i = 0; i < l.pp; i++) {
                ch_coord_t c = ch_layout_coord(l, g[i]);
                cr_assert(c.pp == i && c.tp == me.tp && c.dp == me.dp);
            }
            cr_assert_eq(g[me.pp], r);

            int64_t prev = ch_layout_pp_prev(l, r), next = ch_layout_pp_next(l, r);
            cr_assert_eq(prev, me.pp == 0 ? -1 : (int64_t)g[me.pp - 1]);
            cr_assert_eq(next, me.pp + 1 == l.pp ? -1 : (int64_t)g[me.pp + 1]);
        }
        free(g);
    }
}

Test(layout, stage_blocks_cover_layers_balanced)
{
    for (uint32_t layers = 1; layers <= 40; layers++) {
        for (uint32_t pp = 1; pp <= layers; pp++) {
            uint32_t next = 0, minc = UINT32_MAX, maxc = 0, prevc = UINT32_MAX;
            for (uint32_t s = 0; s < pp; s++) {
                uint32_t first = 99, count = 99;
                ch_layout_stage_blocks(layers, pp, s, 0.0, &first, &count);
                cr_assert_eq(first, next, "contiguous: layers %u pp %u stage %u", layers, pp, s);
                cr_assert_geq(count, 1);
                cr_assert_leq(count, prevc, "remainder goes to the first stages");
                next += count;
                prevc = count;
                minc = count < minc ? count : minc;
                maxc = count > maxc ? count : maxc;
            }
            cr_assert_eq(next, layers, "stages sum to the layers");
            cr_assert_leq(maxc - minc, 1, "balanced");
        }
    }
    uint32_t first, count;
    ch_layout_stage_blocks(10, 4, 0, 0.0, &first, &count);
    cr_expect(first == 0 && count == 3);
    ch_layout_stage_blocks(10, 4, 1, 0.0, &first, &count);
    cr_expect(first == 3 && count == 3);
    ch_layout_stage_blocks(10, 4, 2, 0.0, &first, &count);
    cr_expect(first == 6 && count == 2);
    ch_layout_stage_blocks(10, 4, 3, 0.0, &first, &count);
    cr_expect(first == 8 && count == 2);
}

/* The stages' split for layout pp, as counts. */
static void split(uint32_t layers, uint32_t pp, double head, uint32_t *counts)
{
    uint32_t next = 0;
    for (uint32_t s = 0; s < pp; s++) {
        uint32_t first = 0;
        ch_layout_stage_blocks(layers, pp, s, head, &first, &counts[s]);
        cr_assert_eq(first, next, "contiguous");
        cr_assert_geq(counts[s], 1, "a block a stage");
        next += counts[s];
    }
    cr_assert_eq(next, layers);
}

/* parallel.stage_split = balanced: a heavy LM head (GPT-2's vocab) takes blocks off the
 * last stage so that the slowest stage does least work; a light one leaves the even
 * split, and head 0 is the even split itself. */
Test(layout, balanced_stage_blocks_count_the_lm_head)
{
    double h = ch_layout_head_blocks(768, 50257, 1024); /* GPT-2 124M */
    cr_assert_float_eq(h, 2.0 * 768 * 50257 / (24.0 * 768 * 768 + 4.0 * 1024 * 768), 1e-12);
    cr_assert(h > 4.4 && h < 4.5, "%g", h);
    uint32_t c[8];
    split(12, 4, h, c); /* even: 3 3 3 3+4.46 = 7.46; balanced: 4 4 3 1+4.46 = 5.46 */
    cr_expect(c[0] == 4 && c[1] == 4 && c[2] == 3 && c[3] == 1, "%u %u %u %u", c[0], c[1], c[2],
              c[3]);
    split(12, 2, h, c); /* 6 6+4.46 -> 8 4+4.46: slowest 8.46 instead of 10.46 */
    cr_expect(c[0] == 8 && c[1] == 4, "%u %u", c[0], c[1]);
    split(48, 8, ch_layout_head_blocks(1600, 50257, 1024), c); /* GPT-2 XL: head 2.37 */
    cr_expect(c[7] == 4, "the last stage of 8 takes 4 blocks: %u", c[7]);
    /* the demo's model: a head far under a block keeps the even split */
    split(2, 2, ch_layout_head_blocks(64, 32, 16), c);
    cr_expect(c[0] == 1 && c[1] == 1);
    split(8, 2, ch_layout_head_blocks(256, 512, 128), c); /* chorus-bench-parallel's */
    cr_expect(c[0] == 4 && c[1] == 4);
    /* any head: the layers covered, a block a stage; head 0: the even split */
    uint32_t all[24], even[24];
    for (uint32_t layers = 1; layers <= 24; layers++)
        for (uint32_t pp = 1; pp <= layers; pp++) {
            for (double hh = 0; hh < 30; hh += 2.5)
                split(layers, pp, hh, all);
            split(layers, pp, 0.0, all);
            for (uint32_t s = 0; s < pp; s++)
                even[s] = layers / pp + (s < layers % pp ? 1 : 0);
            for (uint32_t s = 0; s < pp; s++)
                cr_assert_eq(all[s], even[s], "head 0 is the even split");
        }
}

Test(layout, shard_len)
{
    cr_expect_eq(ch_layout_shard_len(100, 1), 100);
    cr_expect_eq(ch_layout_shard_len(100, 4), 25);
    cr_expect_eq(ch_layout_shard_len(101, 4), 26);
    cr_expect_eq(ch_layout_shard_len(3, 8), 1);
    cr_expect_eq(ch_layout_shard_len(0, 4), 0);
    for (size_t n = 1; n < 200; n++)
        for (uint32_t dp = 1; dp <= 9; dp++) {
            size_t len = ch_layout_shard_len(n, dp);
            cr_assert_geq(len * dp, n, "shards cover the buffer");
            cr_assert_lt(len * dp - n, dp, "padding is less than one element per shard");
        }
}

Test(layout, padded_vocab)
{
    cr_expect_eq(ch_layout_padded_vocab(50257, 1), 50304);
    cr_expect_eq(ch_layout_padded_vocab(50257, 2), 50432);
    cr_expect_eq(ch_layout_padded_vocab(50257, 8), 51200);
    cr_expect_eq(ch_layout_padded_vocab(50304, 1), 50304);
    cr_expect_eq(ch_layout_padded_vocab(32, 1), 32);
    cr_expect_eq(ch_layout_padded_vocab(65, 1), 72);
    cr_expect_eq(ch_layout_padded_vocab(65, 4), 96);
    for (uint32_t tp = 1; tp <= 8; tp++)
        for (uint32_t v = 2; v < 20000; v += 97) {
            uint32_t p = ch_layout_padded_vocab(v, tp);
            uint32_t mult = (v >= 8192 ? 128 : 8) * tp;
            cr_assert_geq(p, v);
            cr_assert_eq(p % mult, 0);
            cr_assert_lt(p - v, mult);
            cr_assert_eq((p / tp) % (v >= 8192 ? 128 : 8), 0, "each TP slice aligned");
        }
}
