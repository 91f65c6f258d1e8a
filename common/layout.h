/* Parallel layout math (DESIGN §5): world = TP x PP x DP, rank r = tp + TP*(dp + DP*pp).
 * Pure functions, no allocation. */
#ifndef CH_LAYOUT_H
#define CH_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

typedef struct ch_layout {
    uint32_t tp, pp, dp;
} ch_layout_t;

/* A layout and its split of the global batch ([parallel] in a job file): what an elastic
 * restart (fault.elastic) changes and what the planner proposes. */
typedef struct ch_layout_split {
    uint32_t tp, pp, dp, microbatches, micro_batch_size;
} ch_layout_split_t;

typedef struct ch_coord {
    uint32_t tp, dp, pp;
} ch_coord_t;

static inline uint32_t ch_layout_world(ch_layout_t l)
{
    return l.tp * l.pp * l.dp;
}
ch_coord_t ch_layout_coord(ch_layout_t l, uint32_t rank);
uint32_t ch_layout_rank(ch_layout_t l, ch_coord_t c);

/* Members of rank's groups, in group order (index i of the group is member i).
 * ranks must hold l.tp (TP), l.dp (DP) or l.pp (PP column) entries. */
void ch_layout_tp_group(ch_layout_t l, uint32_t rank, uint32_t *ranks);
void ch_layout_dp_group(ch_layout_t l, uint32_t rank, uint32_t *ranks);
void ch_layout_pp_group(ch_layout_t l, uint32_t rank, uint32_t *ranks);
/* Pipeline neighbours; -1 at the ends. */
int64_t ch_layout_pp_prev(ch_layout_t l, uint32_t rank);
int64_t ch_layout_pp_next(ch_layout_t l, uint32_t rank);

/* The LM head's work in blocks' worth (ch_layout_stage_blocks' `head`): its GEMM per token,
 * 2·embd·vocab, over a block's, 24·embd² + 4·seq_len·embd (forward FLOPs per token; the
 * backward is about twice either). GPT-2 124M at seq 1024: 4.46 blocks. */
double ch_layout_head_blocks(uint32_t embd, uint32_t vocab, uint32_t seq_len);
/* Blocks of stage s of pp, contiguous, at least one each. head 0 (parallel.stage_split =
 * even): equal counts, remainder to the first stages. head > 0 (balanced: the LM head on
 * the last stage counted as `head` blocks, ch_layout_head_blocks): the split whose slowest
 * stage does least work — the last stage gets fewer blocks when the head is heavy, the
 * others share the rest evenly, remainder to the first; the even split when it is as
 * good. Every component computes stages with this function from the job (ch_plan's
 * ch_plan_head_blocks), so they agree. */
void ch_layout_stage_blocks(uint32_t layers, uint32_t pp, uint32_t stage, double head,
                            uint32_t *first, uint32_t *count);
/* A rank's place in a layout: its coordinates, its pipeline stage's blocks and its ZeRO-3
 * shard. The one spelling of it in C: the rank reports it (RankEvent's placed fields), the
 * coordinator derives and shows it (RankPlace); common/msg.h converts both ways. */
typedef struct ch_place {
    ch_coord_t coord;             /* tp, dp, pp ranks */
    uint32_t first_block, blocks; /* its stage holds blocks [first_block, first_block+blocks) */
    uint32_t shards;              /* ZeRO-3: it owns shard coord.dp of `shards` (= dp) */
    uint64_t owned_params;        /* parameters it owns after the shard (ch_plan_place) */
} ch_place_t;
/* rank's place in l for a model of `layers` blocks, stages split as ch_layout_stage_blocks
 * with `head`; owned_params 0 (ch_plan_place fills it). rank < ch_layout_world(l). */
void ch_layout_place(ch_layout_t l, uint32_t layers, double head, uint32_t rank, ch_place_t *out);
/* ZeRO-3 shard of a flat buffer of n elements split into dp equal padded shards:
 * shard length is ceil(n/dp); shard d covers [d*len, d*len+len) of the padded buffer. */
size_t ch_layout_shard_len(size_t n, uint32_t dp);
/* Vocab padded so each TP slice is aligned: to a multiple of 128*tp for vocab >= 8192
 * (Megatron; GPT-2 50257 -> 50304 at tp 1), else of 8*tp. */
uint32_t ch_layout_padded_vocab(uint32_t vocab, uint32_t tp);

#endif
