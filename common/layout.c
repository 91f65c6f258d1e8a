/* Parallel layout math (DESIGN §5). TP is the fastest-varying coordinate, then DP, then PP:
 *   rank = tp + TP * (dp + DP * pp)
 * so a TP group is a run of TP consecutive ranks (kept inside one node by placement), and a
 * pipeline stage is a block of TP*DP consecutive ranks. */
#include "common/layout.h"

void ch_layout_place(ch_layout_t l, uint32_t layers, double head, uint32_t rank, ch_place_t *out)
{
    *out = (ch_place_t){.coord = ch_layout_coord(l, rank), .shards = l.dp};
    ch_layout_stage_blocks(layers, l.pp, out->coord.pp, head, &out->first_block, &out->blocks);
}

ch_coord_t ch_layout_coord(ch_layout_t l, uint32_t rank)
{
    ch_coord_t c;
    c.tp = rank % l.tp;
    c.dp = (rank / l.tp) % l.dp;
    c.pp = rank / (l.tp * l.dp);
    return c;
}

uint32_t ch_layout_rank(ch_layout_t l, ch_coord_t c)
{
    return c.tp + l.tp * (c.dp + l.dp * c.pp);
}

void ch_layout_tp_group(ch_layout_t l, uint32_t rank, uint32_t *ranks)
{
    ch_coord_t c = ch_layout_coord(l, rank);
    for (uint32_t i = 0; i < l.tp; i++) {
        c.tp = i;
        ranks[i] = ch_layout_rank(l, c);
    }
}

void ch_layout_dp_group(ch_layout_t l, uint32_t rank, uint32_t *ranks)
{
    ch_coord_t c = ch_layout_coord(l, rank);
    for (uint32_t i = 0; i < l.dp; i++) {
        c.dp = i;
        ranks[i] = ch_layout_rank(l, c);
    }
}

void ch_layout_pp_group(ch_layout_t l, uint32_t rank, uint32_t *ranks)
{
    ch_coord_t c = ch_layout_coord(l, rank);
    for (uint32_t i = 0; i < l.pp; i++) {
        c.pp = i;
        ranks[i] = ch_layout_rank(l, c);
    }
}

int64_t ch_layout_pp_prev(ch_layout_t l, uint32_t rank)
{
    ch_coord_t c = ch_layout_coord(l, rank);
    if (c.pp == 0)
        return -1;
    c.pp--;
    return ch_layout_rank(l, c);
}

int64_t ch_layout_pp_next(ch_layout_t l, uint32_t rank)
{
    ch_coord_t c = ch_layout_coord(l, rank);
    if (c.pp + 1 >= l.pp)
        return -1;
    c.pp++;
    return ch_layout_rank(l, c);
}

double ch_layout_head_blocks(uint32_t embd, uint32_t vocab, uint32_t seq_len)
{
    double C = embd, V = vocab, T = seq_len;
    double block = 24.0 * C * C + 4.0 * T * C;
    return block > 0 ? 2.0 * C * V / block : 0.0;
}

/* The slowest stage's work when the last stage holds `last` blocks and the head. */
static double split_cost(uint32_t layers, uint32_t pp, uint32_t last, double head)
{
    uint32_t rest = layers - last, others = pp - 1;
    double other = (double)(rest / others + (rest % others != 0 ? 1 : 0));
    double tail = (double)last + head;
    return other > tail ? other : tail;
}

void ch_layout_stage_blocks(uint32_t layers, uint32_t pp, uint32_t stage, double head,
                            uint32_t *first, uint32_t *count)
{
    if (pp == 0 || stage >= pp) {
        *first = layers;
        *count = 0;
        return;
    }
    uint32_t last = layers / pp; /* the even split's last stage */
    if (head > 0 && pp > 1 && layers >= pp) {
        /* fewer blocks on the last stage while that makes the slowest stage faster (the
         * most blocks among the best) */
        double best = split_cost(layers, pp, last, head);
        for (uint32_t c = last; c >= 1; c--) {
            double cost = split_cost(layers, pp, c, head);
            if (cost < best - 1e-9) {
                best = cost;
                last = c;
            }
        }
    }
    if (pp > 1 && stage == pp - 1) {
        *first = layers - last;
        *count = last;
        return;
    }
    /* the first pp - 1 stages share the rest, remainder to the first (the even split
     * when `last` is its own) */
    uint32_t rest = pp > 1 ? layers - last : layers, others = pp > 1 ? pp - 1 : 1;
    uint32_t base = rest / others, rem = rest % others;
    *count = base + (stage < rem ? 1 : 0);
    *first = stage * base + (stage < rem ? stage : rem);
}

size_t ch_layout_shard_len(size_t n, uint32_t dp)
{
    if (dp <= 1)
        return n;
    return n / dp + (n % dp != 0 ? 1 : 0);
}

uint32_t ch_layout_padded_vocab(uint32_t vocab, uint32_t tp)
{
    uint32_t t = tp == 0 ? 1 : tp;
    uint32_t mult = (vocab >= 8192 ? 128u : 8u) * t;
    return (vocab + mult - 1) / mult * mult;
}
