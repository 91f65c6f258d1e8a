/* The layout planner (`chorusctl plan --auto`): for one model, one global batch and one
 * cluster, which TP × PP × DP, micro-batch split and ZeRO-3 reshard policy to run, ranked
 * by predicted step time. Pure: no I/O, no globals; the caller owns every buffer.
 *
 * Theory of operation.
 *
 * Search. TP ranges over the powers of two that divide the heads and fit one node (a TP
 * group never leaves its node, DESIGN §5); PP over 1 .. min(layers, TP groups the cluster
 * holds); DP is the largest divisor of the global batch G that the cluster can still place
 * (pp·dp TP groups, each inside one node), so the job uses as much of the cluster as the
 * batch allows. For each (tp, pp, dp), G/dp sequences per DP rank are re-split into
 * microbatches × micro_batch_size over every divisor up to 65,536 (smallest first, until memory no
 * longer fits) and both reshard policies; the fastest split that fits represents the
 * triple. Triples are ranked by step time (ties: less memory, then smaller tp, pp, mbs,
 * per-use first), so the output is a pure function of the input.
 *
 * Memory per rank is common/plan.h's (ch_plan_stage: fp32 state 16Ψ/(tp·pp·dp) for the
 * blocks under ZeRO-3, gathered blocks, activations of the micro-batches 1F1B keeps in
 * flight, scratch). Only stage 0 and the last stage are evaluated: a middle stage holds no
 * more blocks, no more micro-batches in flight and no embeddings or head, so it never needs
 * more than stage 0 (the unit test checks this against ch_plan_peak). With
 * CH_RECOMPUTE_FULL (Megatron's full activation recomputation; the engine does not do it
 * yet) a stage keeps only each block's input per micro-batch in flight, N·C floats a block
 * (plus the head's N·C + 4N), and rebuilds one block's whole activations (plan.h's per
 * block figure, N·C·(4 + 12/tp) + 4N + B·(NH/tp)·T²) at a time in backward. A layout fits
 * when that peak is at most mem_per_slot × (1 − mem_reserve); the reserve stands for what
 * plan.h does not count (CUDA context, communication buffers, allocator slack).
 *
 * Step time, per micro-batch on stage s (b blocks, B = micro_batch_size, r = 1 with
 * recomputation), all on the critical path unless said:
 *   compute   B·(b·72·T·C²·(1 + T/(6C))·(1 + r/3) + head·6·T·C·Vp) / (tp · peak · mfu)
 *             (DESIGN §7's model FLOPs split by stage; recomputation adds one forward)
 *   TP        (b·(4 + 2r) + embeddings + head) all-reduces of B·T·C fp32 over tp:
 *             2(tp−1)/tp · 4BTC / tp_busbw each (Megatron: 2 forward, 2 backward a block)
 *   PP        one activation forward and one gradient backward, 4BTC bytes each, at the
 *             inter-node bandwidth (on one node: tp_busbw)
 *   DP        ZeRO-3 traffic of the stage's blocks (S = 4·b·block_tp bytes) over dp, each
 *             collective (dp−1)/dp · S / busbw: a reduce-scatter of gradients every
 *             micro-batch, all-gathers before forward and backward every micro-batch
 *             (per-use) or once a step (per-step). It overlaps compute (prefetch and
 *             asynchronous reduce-scatter), so a stage's slot is
 *             max(compute + TP + PP, DP traffic of the step / microbatches).
 *   step      (m + pp − 1) · max over stages of the slot (1F1B; the bubble is
 *             (pp−1)/(m+pp−1) of it) + what cannot overlap: the first block's all-gather
 *             and the last block's reduce-scatter, the all-reduce over dp of the
 *             embeddings' gradients (held whole by every dp rank) and, with pp > 1, the
 *             tied wte gradient between the first and last stage.
 * DP traffic uses tp_busbw when a DP group fits in one node (tp·dp ≤ slots per node),
 * dp_busbw otherwise. tokens/s = G·T / step; MFU = model FLOPs of the step (ch_plan_flops,
 * no recomputation) / (step · world · peak).
 * Not modelled: optimizer step, kernel efficiency that varies with GEMM size, overlap of
 * TP communication with compute, stragglers, network contention between groups. */
#ifndef CH_PLANNER_H
#define CH_PLANNER_H

#include <stddef.h>
#include <stdint.h>

#include "common/jobspec.h"
#include "common/plan.h"

/* ch_recompute_t: common/jobspec.h (parallel.recompute) */

/* GPU-cluster defaults (an A100 80 GB node of 8 GPUs with NVLink and 200 Gb/s InfiniBand
 * per GPU, as in Megatron-LM's 2021 runs). */
#define CH_PLANNER_MEM_PER_SLOT   (80.0 * 1073741824.0) /* bytes */
#define CH_PLANNER_FLOPS_PER_SLOT 312e12                /* bf16 dense peak, FLOP/s */
#define CH_PLANNER_MFU            0.5                   /* fraction of peak the kernels reach */
#define CH_PLANNER_TP_BUSBW       300e9                 /* bytes/s, NVLink all-reduce busbw */
#define CH_PLANNER_DP_BUSBW       25e9                  /* bytes/s per GPU, InfiniBand */
#define CH_PLANNER_MEM_RESERVE    0.05 /* of mem_per_slot, for what plan.h does not count */
/* Global batches above this (2^53 sequences) are refused: counts must stay exact. */
#define CH_PLANNER_BATCH_MAX CH_PLAN_EXACT_MAX

typedef struct ch_planner_cluster {
    uint32_t nodes;
    /* Slots of each node (nodes entries, borrowed), or NULL: every node has slots_per_node. */
    const uint32_t *node_slots;
    uint32_t slots_per_node; /* with node_slots: ignored (computed) */
    double mem_per_slot;     /* bytes */
    double flops_per_slot;   /* peak FLOP/s */
    double mfu;              /* fraction of the peak compute reaches, (0, 1] */
    double tp_busbw;         /* bytes/s of collectives inside a node */
    double dp_busbw;         /* bytes/s per slot of collectives across nodes */
} ch_planner_cluster_t;

typedef struct ch_planner_opts {
    uint64_t global_batch; /* sequences per step, kept */
    ch_recompute_t recompute;
    double mem_reserve; /* fraction of mem_per_slot kept free, [0, 1) */
} ch_planner_opts_t;

/* One layout: the split, its memory and its predicted step. */
typedef struct ch_planner_layout {
    ch_layout_split_t split;
    ch_reshard_t reshard;
    uint32_t world;
    /* the peak stage, one rank (bytes) */
    uint32_t peak_stage;
    double mem_bytes, state_bytes, gathered_bytes, act_bytes;
    /* seconds: one step, and per micro-batch on the slowest stage */
    double step_s, compute_s, tp_s, p2p_s, dp_s;
    double bubble; /* (pp−1)/(m+pp−1) */
    double tokens_per_s, mfu;
} ch_planner_layout_t;

/* A (tp, pp, dp) that was refused, with the smallest-memory split tried (mem_bytes 0 when
 * none could be evaluated) and why. */
typedef struct ch_planner_refusal {
    ch_planner_layout_t l;
    char reason[224];
} ch_planner_refusal_t;

typedef struct ch_planner_result {
    ch_planner_layout_t *layouts; /* fitting, fastest first; n_layouts entries */
    size_t n_layouts;
    ch_planner_refusal_t *refused; /* least memory first */
    size_t n_refused;
    double usable_bytes; /* mem_per_slot × (1 − mem_reserve) */
    uint64_t slots;      /* in the cluster */
} ch_planner_result_t;

/* Fill cluster with the GPU defaults above for nodes × slots_per_node. */
void ch_planner_cluster_defaults(ch_planner_cluster_t *c, uint32_t nodes, uint32_t slots_per_node);

/* Plan model m (padded_vocab ignored) on cluster c. 0 with *out filled (free with
 * ch_planner_result_free; n_layouts may be 0: nothing fits, refused says why); -EINVAL
 * with err naming the bad input (a zero dimension, no slots, a bandwidth or MFU out of
 * range, a global batch of 0 or over CH_PLANNER_BATCH_MAX); -ENOMEM. */
int ch_planner_run(const ch_model_cfg_t *m, const ch_planner_cluster_t *c,
                   const ch_planner_opts_t *o, ch_planner_result_t *out, char *err, size_t errlen);
void ch_planner_result_free(ch_planner_result_t *r);

/* One layout's figures, as ch_planner_run computes them (for a layout given by hand).
 * 0 and *out filled when it fits; CH_E_CAPACITY with *out filled and reason set when it
 * does not fit the memory; -EINVAL when the layout is invalid for the model or cluster
 * (reason says why). */
int ch_planner_eval(const ch_model_cfg_t *m, const ch_planner_cluster_t *c,
                    const ch_planner_opts_t *o, ch_layout_t l, uint32_t micro_batch_size,
                    ch_reshard_t reshard, ch_planner_layout_t *out, char *reason, size_t reasonlen);

#endif
