/* The plan arithmetic (DESIGN §5, §7): what a model and a layout cost, as pure functions
 * that `chorusctl plan`, the planner, the trainer, ZeRO-3, checkpoints and admission at
 * the coordinator share. C = embd, T = seq_len, L = layers, V = vocab, Vp = padded vocab,
 * B = micro_batch_size, N = B*T, NH = heads.
 *
 * Theory of operation: a rank's share of the model.
 *   One block, whole:   12C² + 13C (ln_1 2C; c_attn C·3C + 3C; attn.c_proj C·C + C;
 *                       ln_2 2C; c_fc C·4C + 4C; mlp.c_proj 4C·C + C).
 *   One block, TP rank: column-parallel c_attn and c_fc (weights and biases) and the
 *                       row-parallel c_proj weights are split 1/tp; LayerNorms and the
 *                       row-parallel biases are replicated: 12C²/tp + 7C/tp + 6C.
 *   Outside blocks:     wte split over tp along the padded vocab (Vp·C/tp) on stage 0 and
 *                       again on the last stage for the tied LM head (one copy when
 *                       pp = 1); wpe (T·C) on stage 0 and ln_f (2C) on the last stage,
 *                       replicated over tp.
 *   ZeRO-3:             each block's TP slice is one flat buffer split into dp padded
 *                       shards (ch_layout_shard_len), and so is each tensor outside
 *                       blocks (wte's TP slice, wpe, ln_f's weight, its bias), each on
 *                       its own.
 * The whole-model count is Hugging Face's (V rows of wte, no separate LM head):
 * 124,439,808 for GPT-2 124M. Per-rank counts are what a rank stores, so they include
 * its padded wte rows.
 *
 * Memory per rank, fp32 (4 bytes a float):
 *   state       owned parameters × 4 floats: master weights, Adam m and v, gradients
 *   gathered    dp > 1 only (ZeRO-3), padded to dp shards: per-use 2 blocks (the one in
 *               use and the next, prefetched); per-step every block of the stage; either
 *               way plus two blocks' unsharded gradients (one written by its backward
 *               while the previous block's reduce-scatter reads the other);
 *               and the tensors outside blocks, gathered for the whole step, with their
 *               unsharded gradients (reduce-scattered once a step)
 *   activations what the engine allocates for micro-batches, per micro-batch in flight:
 *                 per block   N·C·(4 + 12/tp) + 4N + B·(NH/tp)·T·R
 *                             (ln1, res2, ln2, res3 replicated; qkv 3, atty 1, fch 4 and
 *                             fch_gelu 4 split over tp; LayerNorm mean and rstd; attention
 *                             probabilities of this rank's heads, R = T, or on CUDA the
 *                             fused attention's log-sum-exps, R = 1: ch_model_cfg_t.att_row)
 *                 stage 0     + N + N·C (token ids, the embedding's output)
 *                 last stage  + N·C + 5N (ln_f output, mean, rstd; targets, log-sum-exp,
 *                             losses)
 *                 pipeline    + 2·N·C received and its gradient (s > 0); what a stage sends
 *                             is its last block's output, already counted
 *                 recompute   selective: a block keeps all but its attention
 *                             probabilities (B·(NH/tp)·T·R), which its backward makes
 *                             again a block of query rows at a time (the backward's T·T
 *                             scratch becomes T·max(T, 2·min(T, CH_PLAN_ATT_QBLOCK)));
 *                             full: only its output N·C (its forward is run again); what
 *                             is recomputed lives once, in the scratch
 *                 zb-h1       + N·(4C + 7C/tp) per block (s > 0: the output gradients
 *                             of its two LayerNorms and four GEMMs, kept for the weight
 *                             pass; stage 0's backward stays whole); on the last stage
 *                             + N·Vp when the head splits too (ch_plan_head_split: its
 *                             logits, then dlogits, kept for the weight pass)
 *               times the micro-batches 1F1B keeps in flight on stage s,
 *               min(pp - s, microbatches) (zb-h1: min(pp, microbatches), those whose
 *               weight pass is pending included); plus scratch used once: the backward's
 *               2·N·C + 4·N·C/tp + T·T, one gradient N·C (and one received, s < pp - 1),
 *               and on the
 *               last stage the logits buffer, min(N·Vp/tp, CH_PLAN_LOGITS_FLOATS) (the
 *               model's chunking budget), with tp > 1 as much again for the vocab-parallel
 *               backward and 3 floats a row.
 * That is every allocation of the engine (tests/unit/test_layouts.c measures it: the
 * ledger of workerd/engine/mem.h); on CUDA it is device memory, all of it allocated before the
 * first step.
 *
 * Mixed precision (bf16; m->bf16), what the engine allocates on the GPU path and in the
 * CPU emulation alike (workerd/engine/backend_bf16.h): state unchanged (fp32 masters,
 * gradients, Adam m and v: 16 bytes an owned parameter); a block's kept activations as
 * 2-byte packed casts (ln_1's output, res2 and ln_2's output N·C each, qkv 3N·C/tp, the
 * MLP's and the GELU's 4N·C/tp each, and the attention's N·C/tp unless a fused attention's
 * backward reads it, att_row < seq_len), with fp32 scratch they are written in and widened
 * to ([N, max(C, 4C/tp)], [N, 4C/tp] and [N,C]: scratch_bytes); the block outputs, the
 * statistics and att, and the gradients, bf16 values in fp32 slots, 4 bytes each as above; without
 * ZeRO-3 (dp 1) a packed bf16 working copy of the rank's parameters, cast from the masters once a
 * step (working_bytes, 2 bytes a parameter); under ZeRO-3 none (working_bytes 0): the gathers
 * arrive as 2-byte messages into packed buffers beside the fp32 gathered ones (2 bytes a gathered
 * block parameter, and the widest tensor outside blocks), the per-block casts. Not counted: the
 * collectives' own buffers (the bf16 messages of the TP all-reduces, the stages' sends and the
 * gradient reductions among them), the CUDA context, cuBLAS's workspace, the CUDA backend's
 * launcher scratch (bf16 GEMM operands included; the rank reports what it reserved), the bf16
 * wrapper's rounded copies of a kernel's inputs, allocator slack, 64-byte alignment.
 *
 * Counts and bytes are doubles: no overflow whatever the input (layers 1e9, vocab
 * 2^32 - 1), exact below 2^53; ch_plan_stage refuses a plan whose figures reach 2^53. */
#ifndef CH_PLAN_H
#define CH_PLAN_H

#include <stdint.h>

#include "common/jobspec.h"
#include "common/layout.h"

/* A GPT-2 model's shape. padded_vocab is vocab rounded up (ch_layout_padded_vocab). */
typedef struct ch_model_cfg {
    uint32_t layers, heads, embd, vocab, padded_vocab, seq_len;
    /* parallel.stage_split = balanced: pipeline stages weigh the LM head (common/layout.h);
     * 0: the even split. Not part of the model's identity (checkpoints ignore it). */
    uint32_t balanced_stages;
    /* parallel.schedule: zb-h1 keeps min(pp, microbatches) micro-batches on every stage,
     * each with its blocks' output gradients for the weight pass. Not part of the model's
     * identity either. */
    ch_schedule_t schedule;
    /* Floats the attention keeps per sequence, head and query row (backend.h's att_row):
     * 0 means seq_len, the probabilities (the CPU's); 1, a fused attention's log-sum-exp
     * (train.device = cuda, head size <= CH_PLAN_FLASH_MAX_HS: CUDA's default). Not part
     * of the model's identity either. */
    uint32_t att_row;
    /* train.precision = bf16 (emulated or not): ZeRO-3's packed gathers (below). Not part
     * of the model's identity either. */
    uint32_t bf16;
    /* parallel.virtual_stages under interleaved (0 or 1: one chunk): each stage keeps its
     * warm-up depth of chunk-activations (in_flight, act_mb_bytes one chunk's) and the
     * schedule's receive and send buffers, as common/pipe_il.h lays the step out. Not part of
     * the model's identity either. */
    uint32_t virtual_stages;
} ch_model_cfg_t;

/* The largest head size CUDA's fused attention takes (kernels/cuda.h's KN_CUDA_FLASH_MAX_HS;
 * the CUDA backend asserts they agree). */
#define CH_PLAN_FLASH_MAX_HS 128

/* Query rows per block of the CPU attention (kernels/attention.h's KN_ATTENTION_QBLOCK; the
 * model asserts they agree): selective recomputation's attention scratch is
 * 2·min(T, this)·T floats. */
#define CH_PLAN_ATT_QBLOCK 128

/* Floats the model holds for logits at once (workerd/engine/model.c's LOGITS_BUDGET). */
#define CH_PLAN_LOGITS_FLOATS ((double)(64u << 20))
/* Whether ZB-H1's last stage splits the LM head's backward as it does its blocks': the
 * input pass computes dlogits and dx, the weight pass later wte's gradient from the same
 * dlogits, so each micro-batch in flight keeps its [N,Vp] logits until then. Only where
 * that costs little: the schedule is zb-h1, the stage is the last of pp >= 2, the head is
 * not vocab-parallel (tp = 1), and the logits of min(pp, microbatches) micro-batches of
 * N = micro_batch·seq_len rows fit CH_PLAN_LOGITS_FLOATS. Otherwise the head's backward
 * stays whole in the input pass (its wte gradient on the backward's critical path). The
 * trainer asks this; the plan counts what it keeps. */
int ch_plan_head_split(ch_schedule_t schedule, ch_layout_t l, uint32_t stage, uint32_t micro_batch,
                       uint32_t microbatches, uint32_t seq_len, double padded_vocab);
/* parallel.stage_split = auto picks balanced only when every stage's plan is at most this
 * (bytes): the planner's default usable memory per slot, 80 GiB less its 5% reserve. */
#define CH_PLAN_AUTO_BUDGET (0.95 * 80.0 * 1073741824.0)
/* Counts below this are exact in a double. */
#define CH_PLAN_EXACT_MAX 9007199254740992.0

/* What one pipeline stage of a layout costs each of its ranks, with the whole-model
 * figures alongside. Every count is a number of parameters (floats); bytes are fp32. */
typedef struct ch_plan {
    /* the whole model and step */
    uint32_t world;
    double padded_vocab;  /* vocab rounded up for tp (64-bit safe) */
    double params_total;  /* Hugging Face count: V rows of wte */
    double params_padded; /* with the padded wte rows */
    double block;         /* one block, whole */
    double block_tp;      /* one block, one TP rank */
    double block_shard;   /* one block, one TP rank, one ZeRO-3 shard */
    double sequences;     /* per step: dp × microbatches × micro_batch_size */
    double tokens;        /* per step */
    double flops;         /* model FLOPs per step (ch_plan_flops over the global batch) */
    double bubble;        /* 1F1B: (pp - 1) / (microbatches + pp - 1); zb-h1 (T_F = T_B =
                           * T_W): (pp - 1) / (3 microbatches + pp - 1) */
    /* stage `stage`, one of its ranks */
    uint32_t stage, first_block, blocks; /* blocks [first_block, first_block + blocks) */
    int embeddings, head;                /* holds wte + wpe / ln_f + the tied LM head */
    double params;                       /* the rank's TP slice of the stage */
    double owned;                        /* after the ZeRO-3 shard */
    double state_bytes, gathered_bytes;
    double working_bytes; /* bf16 at dp 1: the packed working copy (above); else 0 */
    double act_mb_bytes;  /* kept for backward, one micro-batch (interleaved: one chunk's) */
    uint32_t in_flight;   /* micro-batches kept: min(pp - s, microbatches); zb-h1 min(pp, m);
                             interleaved chunk-activations: the warm-up depth + 1 */
    double scratch_bytes; /* backward scratch and logits, once */
    double act_bytes;     /* act_mb_bytes × in_flight + scratch_bytes (interleaved: + its
                             receive and send buffers) */
    double total_bytes;   /* state + gathered + working + activations */
} ch_plan_t;

/* Model FLOPs of one training iteration over B sequences of seq_len tokens, without
 * recomputation: 72·B·s·l·h²·(1 + s/(6h) + Vp/(12·l·h)) (Narayanan et al. 2021). */
double ch_plan_flops(const ch_model_cfg_t *cfg, uint32_t B);

/* Fill out for stage `stage` of model m (m->padded_vocab is ignored: it is computed for
 * l.tp without overflow) laid out as l, with micro_batch sequences per micro-batch and
 * microbatches per step. -EINVAL for a zero dimension or stage >= l.pp; CH_E_TOOBIG
 * (out still filled) when a count or byte figure reaches CH_PLAN_EXACT_MAX. */
int ch_plan_stage(const ch_model_cfg_t *m, ch_layout_t l, uint32_t micro_batch,
                  uint32_t microbatches, ch_reshard_t reshard, uint32_t stage, ch_plan_t *out);
/* The same with activation recomputation (parallel.recompute; ch_plan_stage: none). */
int ch_plan_stage_rc(const ch_model_cfg_t *m, ch_layout_t l, uint32_t micro_batch,
                     uint32_t microbatches, ch_reshard_t reshard, ch_recompute_t recompute,
                     uint32_t stage, ch_plan_t *out);
/* The stage whose ranks need the most memory: its plan in out (first such stage on a
 * tie). Errors as ch_plan_stage. */
int ch_plan_peak(const ch_model_cfg_t *m, ch_layout_t l, uint32_t micro_batch,
                 uint32_t microbatches, ch_reshard_t reshard, ch_plan_t *out);
/* rank's place in the job's layout (ch_layout_place, the stages split as the job says) with,
 * for a training job, the parameters it owns (ch_plan_stage's `owned`; 0 when the plan is
 * refused). The one function the coordinator, the rank, the planner and the simulator
 * call. 0, or -EINVAL when rank is outside the layout's world. */
int ch_plan_place(const ch_jobspec_t *s, uint32_t rank, ch_place_t *out);
/* The model and parallel sections of a job file; stage_split = auto resolved here (every
 * component asks this function, so they agree). */
ch_model_cfg_t ch_plan_model_of(const ch_jobspec_t *j);
/* In-memory peer checkpoints (checkpoint.memory_every, workerd/rank/memckpt.h): steps kept
 * of each state. */
#define CH_PLAN_MEMCKPT_KEEP 2
/* Host memory (the node's memory dir, a tmpfs) one rank of layout l takes for in-memory
 * checkpoints: CH_PLAN_MEMCKPT_KEEP steps of its own state and of one peer's (a rank of
 * another node, maybe of another stage: the largest stage's is counted), each state being
 * the parameters and Adam m and v of what the rank owns (3 floats an owned parameter).
 * 0 for a plan that cannot be made. */
double ch_plan_memckpt_bytes(const ch_model_cfg_t *m, ch_layout_t l);
/* Every rank's buddy (the rank holding its copy) from its node (nodes[k]: any value naming
 * rank k's node, equal for ranks of one node) into buddy[world]: nodes in the order of their
 * lowest rank, the i-th rank of node n has its copy on the (i mod count)-th rank of node
 * n + 1 (mod nodes), so a lost node's every rank has a copy elsewhere; -1 for all when there
 * is one node. Pure; 0 or -ENOMEM. */
int ch_plan_memckpt_buddies(const uint64_t *nodes, uint32_t world, int64_t *buddy);

/* ch_layout_stage_blocks' `head` for m: the LM head's blocks' worth when its stages are
 * balanced, else 0 (the even split). */
double ch_plan_head_blocks(const ch_model_cfg_t *m);

#endif
