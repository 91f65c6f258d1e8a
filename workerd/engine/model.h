/* GPT-2 model for one rank (DESIGN §7): parameters in one slab with named views,
 * forward and backward. B = batch (sequences), T = time (tokens), C = channels,
 * V = vocab, Vp = padded vocab, L = layers, NH = heads, N = B*T.
 *
 * Tensor names, shapes and layouts are Hugging Face GPT-2's (wte.weight [V,C],
 * h.{i}.attn.c_attn.weight [C,3C] used as x @ W, ...). Padded vocab rows of wte are
 * zero and never receive gradient; their logits are excluded from the loss.
 * Initialisation is counter-based, keyed by (seed, tensor name, element index), so any
 * rank can create exactly its slice and the model is identical for every layout.
 *
 * The seams the 3D engine builds on (ENGINE.md):
 * - a backend (backend.h) through which the model allocates and runs every kernel;
 * - a model object may hold one pipeline stage (DESIGN §5): a contiguous range of blocks,
 *   plus the embedding on the first stage and ln_f + the tied LM head on the last;
 * - activations live in an eng_acts_t per micro-batch, several of which may be in flight;
 * - each block's parameters (and gradients) are one contiguous range with a base pointer
 *   that can be pointed at another buffer (ZeRO-3's gathered block);
 * - the stage API runs the embedding, a range of blocks, or the head on explicit [B,T,C]
 *   input, output and gradient buffers, which is what a pipeline stage sends and receives;
 * - every tensor carries its tensor-parallel split kind.
 *
 * Memory: parameters, gradients, logits, activations, and the [B,T,C] buffers of the stage
 * API are the backend's memory (host memory for the CPU backend); token ids, targets and
 * losses handed in or out are host memory. One thread drives a model and its acts. */
#ifndef ENG_MODEL_H
#define ENG_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "common/plan.h"
#include "workerd/coll/coll.h"
#include "workerd/engine/backend.h"
#include "workerd/engine/slice.h"

/* The model's shape (common/plan.h: the arithmetic over it lives there). */
typedef ch_model_cfg_t eng_config_t;

/* How tensor parallelism splits a tensor over the TP group of p ranks (Megatron-LM's
 * ColumnParallelLinear / RowParallelLinear / VocabParallelEmbedding). Linear weights are in
 * Hugging Face Conv1D layout, A [in, out], used as Y = XA + b. */
typedef enum eng_split {
    /* Replicated: every rank of the TP group holds it whole (LayerNorms, wpe, the biases
     * of row-parallel layers). */
    ENG_SPLIT_NONE = 0,
    /* Column parallel: A is split along its second dimension as A = [A_1, ..., A_p], and
     * the bias the same way; rank i computes Y_i = X A_i + b_i from the whole X (forward:
     * copy, backward: all-reduce). c_attn is split per head: rank i holds columns
     * [i*C/p, (i+1)*C/p) of each of its q, k and v parts, i.e. heads [i*NH/p, (i+1)*NH/p). */
    ENG_SPLIT_COLUMN,
    /* Row parallel: A is split along its first dimension as A = [A_1; ...; A_p] and X along
     * its second, X = [X_1, ..., X_p]; rank i computes X_i A_i and the partial products are
     * all-reduced (forward: all-reduce, backward: copy) before the bias is added once (the
     * bias itself is ENG_SPLIT_NONE). */
    ENG_SPLIT_ROW,
    /* Vocab parallel: wte [Vp, C] is split along its rows, rank i holding tokens
     * [i*Vp/p, (i+1)*Vp/p); the embedding is all-reduced and the tied LM head and its
     * cross-entropy run vocab-parallel, so no rank ever holds the full logits. */
    ENG_SPLIT_VOCAB,
} eng_split_t;

/* Tied tensors: the LM head uses wte. With pp > 1 stage 0 holds wte (the original) and the last
 * stage a copy, whose gradient the two sum over the embedding group. */
typedef enum eng_tie {
    ENG_TIE_NONE = 0,
    ENG_TIE_ORIGINAL, /* stage 0's wte */
    ENG_TIE_COPY,     /* the last stage's: neither counted in the norm nor written */
} eng_tie_t;

/* Where a tensor's owned state lives: the model's slab (parameters, gradients and the
 * optimizer's m and v in the same layout), or ZeRO-3's shards (zero.h). */
typedef enum eng_store_id {
    ENG_STORE_SLAB = 0,
    ENG_STORE_SHARDS,
    ENG_NSTORES,
} eng_store_id_t;

/* One store's arrays (backend memory): element own_at of each is a tensor's owned range. */
typedef struct eng_store {
    float *p, *g, *m, *v;
} eng_store_t;

typedef struct eng_tensor {
    char name[64];     /* "h.3.attn.c_attn.weight" */
    uint32_t ndim;     /* 1 or 2 */
    uint32_t shape[2]; /* full Hugging Face shape (wte: [vocab, C], unpadded) */
    size_t offset;     /* element offset of this rank's piece in the slab */
    size_t numel;      /* elements this rank holds (wte: padded_vocab * C) */
    int decay;         /* 2-D weights: AdamW weight decay applies */
    int block;         /* transformer block index, -1 outside blocks */
    eng_split_t split; /* how tensor parallelism splits it */
    /* The slice this rank holds: rows [lo[0], hi[0]) of dim 0 and, for 2-D tensors, columns
     * [lo[1], hi[1]) of dim 1, of the full tensor (wte: rows of the padded vocab). With
     * parts = 3 (c_attn) the split dimension (the last) is q | k | v and the range applies
     * within each part: the rank holds columns part*(shape/3) + [lo, hi) of each, stored
     * q, k, v side by side. Unsplit: the whole range, parts 1. */
    uint32_t lo[2], hi[2];
    uint32_t parts;
    /* Who holds which copy (Megatron keeps these as attributes on each parameter). The
     * trainer, ZeRO-3, clipping, checkpoints and init_from ask these instead of a name. */
    /* TP replicates it (split NONE with tp > 1): every rank of the TP group holds the same
     * numbers; TP rank tp_counter counts it in the gradient norm. */
    int tp_replicated;
    uint32_t tp_counter;
    eng_tie_t tie; /* a tensor with a copy on another stage (wte with pp > 1) */
    /* Data parallelism: with dp_sharded (ZeRO-3) this DP rank owns the flat range
     * [own_lo, own_hi) of its slice; otherwise it owns the whole slice [0, numel), the same
     * numbers as every DP rank. The owned range's parameters, gradient, Adam m and v are in
     * store `store` (eng_store_id_t) at element own_at. */
    int dp_sharded;
    size_t own_lo, own_hi;
    eng_store_id_t store;
    size_t own_at;
    /* ZeRO-3's unit of this tensor (its block's range, or the tensor itself outside
     * blocks): S = shard_len floats per DP rank, this rank's shard of it at shard_base in
     * ENG_STORE_SHARDS (element own_at is then shard_base + where the owned range starts
     * in the shard). 0 and 0 when not dp_sharded. */
    size_t shard_base, shard_len;
    /* Derived, once over the world: whether this rank writes its owned range into its
     * checkpoint file (not a tied copy; under DP replication only DP rank 0) and whether it
     * counts it in the global gradient norm (written, and under TP replication only
     * tp_counter). Each element of the model is then counted once over the world and written
     * once per TP slice (TP-replicated tensors by every TP rank: any copy is taken). */
    int written, counted;
} eng_tensor_t;

/* The slice (slice.h) a tensor's lo/hi/parts describe. */
eng_slice_t eng_tensor_slice(const eng_tensor_t *t);

typedef struct eng_model eng_model_t;
typedef struct eng_acts eng_acts_t;

typedef struct eng_model_opts {
    /* Kernels and memory (borrowed for the model's life): every kernel the model runs and
     * every buffer of parameters, gradients and activations go through it. NULL: the CPU
     * backend. */
    const eng_backend_t *backend;
    /* Hold only pipeline stage `stage` of `pp` (DESIGN §5): its blocks
     * (ch_layout_stage_blocks), the embedding (wte, wpe) on stage 0, ln_f and the LM head
     * (tied: a copy of wte) on stage pp - 1. pp 0 or 1: the whole model. */
    uint32_t pp, stage;
    /* Tensor parallelism (DESIGN §5; Megatron-LM): be rank tp_rank of tp (0 or 1: none) in
     * the TP group tp_group (borrowed for the model's life; NULL when tp <= 1). The model
     * then holds its slice of every split tensor (eng_split_t), and its forward and backward
     * are collectives over tp_group that every member must call in step. heads, 4*embd and
     * padded_vocab must divide by tp; needs eng_model_tp_runs_on(backend) (-ENOTSUP). */
    uint32_t tp, tp_rank;
    wrk_coll_group_t *tp_group;
    /* train.precision = bf16: the activations' TP all-reduces (tp.h's f and g) move and sum
     * bf16 (coll_bf16.h); ignored on a backend that cannot cast (eng_bf16_castable). */
    int tp_bf16;
    /* train.precision = bf16: a block's kept activations (ln_1's output, qkv, res2, ln_2's
     * output, the MLP's and the GELU's outputs, and the attention output unless the
     * backend's attention keeps a row summary whose backward reads it: backend.h's att_row)
     * are kept as their packed bf16 casts, 2 bytes an element, and widened just before the
     * backward kernel that reads each: the same bits (they hold bf16 values), half their
     * memory. The block outputs (the residual stream), the LayerNorm statistics and att
     * stay fp32. Ignored on a backend that cannot cast. */
    int bf16_acts;
    /* Data parallelism: be rank dp_rank of dp (0 or 1: none). The model does not
     * communicate over DP; the table records who owns which copy (eng_tensor_t). */
    uint32_t dp, dp_rank;
    /* ZeRO-3 (DESIGN §5): every tensor is sharded over the DP group (dp, dp_rank), and the
     * blocks' parameters and gradients live outside the model. The slab
     * (eng_model_params / eng_model_grads, eng_model_nparams) then holds only the tensors
     * outside blocks (wte, wpe, ln_f), in table order, each padded to dp * S (S =
     * ch_layout_shard_len(numel, dp)): the gathered copy ZeRO-3 fills before use. A block
     * tensor's `offset` is its offset within its block's range; no block has a base until
     * the caller sets one (eng_model_set_block_params / grads: NULL leaves it without),
     * typically from the block hook; eng_model_init_block makes a block's initial
     * parameters. ZeRO-3's units are each tensor outside blocks and each block's range,
     * padded to dp * S; DP rank d owns [d*S, (d+1)*S) of each. Every tensor is then
     * dp_sharded in ENG_STORE_SHARDS, whose layout is this rank's shards of the units in
     * table order: the tensors outside blocks (wte, wpe on stage 0; wte, ln_f on the last),
     * then the blocks (eng_tensor_t's shard_base and shard_len). */
    int external_blocks;
    /* Activation recomputation (parallel.recompute): what each block keeps per
     * micro-batch. none: everything its backward reads; selective: all but the attention
     * probabilities [B,NH/tp,T,T], which the attention backward recomputes from q, k, v
     * a block of query rows at a time (held nowhere else); full: only its output (the next
     * block's input), its backward recomputing its forward first. Exact: the same kernels
     * on the same inputs, the same bits as none. Full's recomputed activations live in one
     * set for the model. */
    ch_recompute_t recompute;
    /* parallel.schedule = zb-h1: each block's backward runs as two passes
     * (eng_model_blocks_backward_input, then eng_model_blocks_backward_weight), each
     * micro-batch's acts keeping the output gradients the weight pass reads, N·(4C + 7C/tp)
     * floats a block. Needs recompute none (-EINVAL otherwise). */
    int split_backward;
    /* With split_backward, on the part holding the head: the head's backward splits too
     * (eng_model_head_backward, then eng_model_head_backward_weight), each micro-batch's
     * acts keeping its logits [N,Vp] (dlogits after the input pass) for the weight pass.
     * Whoever sets it has weighed that memory (common/plan.h's ch_plan_head_split). -EINVAL
     * without split_backward or the head, or with a vocab-parallel head (tp > 1). */
    int split_head;
    /* parallel.virtual_stages (0 or 1: one chunk): stage `stage` holds v chunks of
     * layers / (pp * v) blocks, chunk c the blocks of virtual stage c * pp + stage
     * (Megatron's interleaved layout); -EINVAL unless layers divides by pp * v. */
    uint32_t virtual_stages;
} eng_model_opts_t;

/* What a model object holds: `chunks` runs of chunk_len blocks, run c starting at block
 * first + c * stride (one run, [first, last), unless virtual_stages > 1: the interleaved
 * schedule's chunks, not adjacent), nblocks in all, held in that order (a block's
 * position: eng_model_block_pos); last is one past the last run's end. The embedding, the
 * head. */
typedef struct eng_model_part {
    uint32_t first, last;
    uint32_t nblocks, chunks, chunk_len, stride;
    int embedding, head;
} eng_model_part_t;

/* Block l's position among the blocks p holds (0 .. nblocks - 1), -1 when p holds no l. */
static inline int64_t eng_part_pos(const eng_model_part_t *p, uint32_t l)
{
    if (l < p->first || p->chunk_len == 0)
        return -1;
    uint32_t d = l - p->first, c = d / p->stride, r = d % p->stride;
    return c < p->chunks && r < p->chunk_len ? (int64_t)c * p->chunk_len + r : -1;
}

/* The block at position i of those p holds (i < nblocks). */
static inline uint32_t eng_part_block(const eng_model_part_t *p, uint32_t i)
{
    return p->first + (i / p->chunk_len) * p->stride + i % p->chunk_len;
}

/* Allocate parameters and gradients for micro-batches of up to max_B sequences of
 * cfg->seq_len tokens and initialise the parameters from seed, on the CPU backend, the
 * whole model. Caller owns *out (eng_model_destroy). 0, -EINVAL (config), -ENOMEM. */
int eng_model_create(const eng_config_t *cfg, uint32_t max_B, uint64_t seed, eng_model_t **out);
/* The same with options (opts NULL: as eng_model_create). A stage's tensors are
 * initialised exactly as the whole model's tensors of the same names. */
int eng_model_create_opts(const eng_config_t *cfg, const eng_model_opts_t *opts, uint32_t max_B,
                          uint64_t seed, eng_model_t **out);
/* Destroy the acts created for m first. */
void eng_model_destroy(eng_model_t *m);
/* Whether a model on be can run tensor parallelism (tp > 1): be has the vocab-parallel
 * entries (backend.h's tp_*) or its memory is the host's (the CPU's entries then run on it). */
int eng_model_tp_runs_on(const eng_backend_t *be);

const eng_config_t *eng_model_config(const eng_model_t *m);
const eng_backend_t *eng_model_backend(const eng_model_t *m);
eng_model_part_t eng_model_part(const eng_model_t *m);
size_t eng_model_nparams(const eng_model_t *m);
float *eng_model_params(eng_model_t *m); /* the slab, nparams floats */
float *eng_model_grads(eng_model_t *m);  /* same layout as params */
/* Keep the gradients in buf (nparams floats, borrowed until the model is destroyed) from
 * now on, e.g. memory the collectives reduce in place; the current ones are copied. Blocks
 * whose gradient base was in the old slab move with it. */
void eng_model_lend_grads(eng_model_t *m, float *buf);
/* The table: the tensors this object holds, in slab order (wte, wpe, h.{first}.* ...
 * h.{last-1}.*, ln_f.*). */
size_t eng_model_ntensors(const eng_model_t *m);
const eng_tensor_t *eng_model_tensor(const eng_model_t *m, size_t i);
const eng_tensor_t *eng_model_find(const eng_model_t *m, const char *name); /* NULL if none */

// ----------------------------------------------------------------------------
// a parameter base per block (ZeRO-3)

/* Block l's parameters are *count contiguous floats at *ptr, its twelve tensors in table
 * order (ln_1.weight first; tensor t at *ptr + t->offset - (offset of h.l.ln_1.weight)).
 * By default *ptr is the block's range of the slab. -EINVAL when m does not hold block l. */
int eng_model_block_params(eng_model_t *m, uint32_t l, float **ptr, size_t *count);
/* From now on block l reads its parameters from params (count floats, same layout,
 * borrowed until set again or the model is destroyed); NULL: back to its slab range. The
 * slab's range is then neither read nor written by the model. */
int eng_model_set_block_params(eng_model_t *m, uint32_t l, float *params);
/* The same for block l's gradients: backward accumulates them at the base. */
int eng_model_block_grads(eng_model_t *m, uint32_t l, float **ptr, size_t *count);
int eng_model_set_block_grads(eng_model_t *m, uint32_t l, float *grads);

/* Fill dst (the block's *count floats, eng_model_block_params' layout; host memory,
 * whatever the model's backend) with block l's initial parameters, exactly as the model
 * initialises them in its slab. */
int eng_model_init_block(const eng_model_t *m, uint32_t l, float *dst);

/* Called by the passes around each block (ZeRO-3 gathers a block's parameters before it
 * runs and reduce-scatters its gradients after its backward): ENG_BLOCK_FORWARD before
 * block l's forward, ENG_BLOCK_BACKWARD before its backward, ENG_BLOCK_BACKWARD_DONE once
 * its backward has accumulated its gradients. A split backward (opts->split_backward)
 * raises ENG_BLOCK_BACKWARD_INPUT before the input pass (it reads the parameters, writes
 * no gradient) and ENG_BLOCK_BACKWARD_WEIGHT before the weight pass (it reads no
 * parameter, accumulates the gradients), then ENG_BLOCK_BACKWARD_DONE. A negative return
 * aborts the pass with that code. Bases may be changed inside the hook. */
typedef enum eng_block_event {
    ENG_BLOCK_FORWARD,
    ENG_BLOCK_BACKWARD,
    ENG_BLOCK_BACKWARD_DONE,
    ENG_BLOCK_BACKWARD_INPUT,
    ENG_BLOCK_BACKWARD_WEIGHT,
} eng_block_event_t;
typedef int (*eng_block_hook_t)(void *ctx, uint32_t l, eng_block_event_t ev);
/* Install hook (NULL: none); ctx is borrowed. */
void eng_model_set_block_hook(eng_model_t *m, eng_block_hook_t hook, void *ctx);

// ----------------------------------------------------------------------------
// activations per micro-batch

/* Activations for one micro-batch of up to B (<= the model's max_B) sequences on the
 * part m holds: what a forward saves for its backward. Borrows m (destroy the acts
 * first). Any number may be alive and in flight at once (1F1B keeps up to
 * min(pp - s, m) on stage s): a forward fills one, its backward consumes it. */
int eng_acts_create(eng_model_t *m, uint32_t B, eng_acts_t **out);
/* The same for `span` consecutive held blocks only (the interleaved schedule's chunk-activation:
 * one chunk's blocks, with the embedding's and head's buffers where m holds them), serving the
 * run eng_acts_bind names; span = the part's blocks is eng_acts_create. */
int eng_acts_create_span(eng_model_t *m, uint32_t B, uint32_t span, eng_acts_t **out);
/* Let a span's acts serve blocks [first, first + span) (held, consecutive in the part) from
 * its next forward: -EINVAL if they are not, CH_E_STATE while a forward is in flight in a. */
int eng_acts_bind(eng_acts_t *a, uint32_t first);
void eng_acts_destroy(eng_acts_t *a);
/* Forget a forward in flight (e.g. one run for evaluation only). */
void eng_acts_reset(eng_acts_t *a);
/* [B,T,C] buffers of a that the stage API may write its outputs into, so that no second
 * copy is kept: the embedding's output (NULL when the model holds no embedding) and the
 * output of the last block the model holds (a span's acts: of its span's last block; NULL
 * without blocks). Each is overwritten by
 * the next forward on a that writes it. */
float *eng_acts_embed_out(eng_acts_t *a);
float *eng_acts_blocks_out(eng_acts_t *a);
/* The last head forward's token losses [B*T] in backend memory (NULL on a model without the
 * head); overwritten by the next head forward on a. */
const float *eng_acts_losses(const eng_acts_t *a);

// ----------------------------------------------------------------------------
// the whole model (m holds every part)

/* Forward pass over inputs [B,T] (token ids < vocab) into acts a. With targets [B,T],
 * *loss is the mean cross-entropy over the B*T tokens; with targets NULL, only logits are
 * made (eng_model_logits). T <= seq_len, B <= the acts' B. */
int eng_model_forward_acts(eng_model_t *m, eng_acts_t *a, const int32_t *inputs,
                           const int32_t *targets, uint32_t B, uint32_t T, float *loss);
/* Backward of a's forward (which had targets): ADDS into the gradients the gradient of
 * (sum of the B*T token losses) * grad_scale. For a global batch of N tokens split into
 * micro-batches, pass grad_scale = 1/N. CH_E_STATE when a holds no such forward. */
int eng_model_backward_acts(eng_model_t *m, eng_acts_t *a, float grad_scale);
/* The same on the model's own acts (for max_B, made on first use). */
int eng_model_forward(eng_model_t *m, const int32_t *inputs, const int32_t *targets, uint32_t B,
                      uint32_t T, float *loss);
int eng_model_backward(eng_model_t *m, float grad_scale);
void eng_model_zero_grad(eng_model_t *m);
/* Logits [B,T,padded_vocab/tp] (this rank's vocab slice) of the last head forward when all its rows
 * are held (always without targets; with targets when B*T fits the logits budget), until the next
 * head forward or backward; else NULL. */
const float *eng_model_logits(const eng_model_t *m);

// ----------------------------------------------------------------------------
// the stage API: one part at a time on explicit buffers (model_stage.c)
//
// A pipeline stage runs [embedding] -> blocks [first, last) -> [head] on micro-batch a,
// receiving its input x from the previous stage and sending y; backward receives dy and
// sends dx. x, y, dx, dy, out, dout are [B,T,C] floats of backend memory. The forward
// calls of one micro-batch must agree on B and T; each backward needs its forward on
// the same acts (CH_E_STATE otherwise) and consumes it.

/* out = wte[inputs] + wpe[0..T) (stage 0). inputs [B,T] (host) are kept in a. */
int eng_model_embed_forward(eng_model_t *m, eng_acts_t *a, const int32_t *inputs, uint32_t B,
                            uint32_t T, float *out);
/* dout: gradient of out; ACCUMULATES into the wte and wpe gradients. */
int eng_model_embed_backward(eng_model_t *m, eng_acts_t *a, const float *dout);
/* Blocks [first, last) (held by m, first < last) on x, output into y. x is borrowed until
 * the backward of block `first` on a returns (it is that block's saved input); y must not
 * overlap x and is free once written (send it, or pass it as x of the next range). */
int eng_model_blocks_forward(eng_model_t *m, eng_acts_t *a, uint32_t first, uint32_t last,
                             const float *x, float *y, uint32_t B, uint32_t T);
/* dy: gradient of the blocks' output y; dx: written with the gradient of x (dx may equal
 * dy, else they must not overlap; neither may overlap x, which this still reads).
 * ACCUMULATES the blocks' parameter gradients. */
int eng_model_blocks_backward(eng_model_t *m, eng_acts_t *a, uint32_t first, uint32_t last,
                              const float *dy, float *dx);
/* A split backward (opts->split_backward; ZB-H1): the input pass writes dx as
 * eng_model_blocks_backward does (same arguments) and keeps in a what the weight pass
 * reads; no gradient is touched. The weight pass, later, accumulates the blocks'
 * parameter gradients with the same kernels on the same operands: run in micro-batch
 * order, the same bits as eng_model_blocks_backward. x stays borrowed until it returns.
 * CH_E_STATE out of order; -EINVAL when the model is not split. */
int eng_model_blocks_backward_input(eng_model_t *m, eng_acts_t *a, uint32_t first, uint32_t last,
                                    const float *dy, float *dx);
int eng_model_blocks_backward_weight(eng_model_t *m, eng_acts_t *a, uint32_t first, uint32_t last);
/* ln_f, the LM head tied to wte and the cross-entropy on x (last stage). targets [B,T]
 * (host) give *loss (mean over B*T: the token losses copied back, a wait on a device), or
 * with loss NULL leave the token losses in a's backend memory (eng_acts_losses) without
 * waiting; targets NULL only make logits (eng_model_logits). x is borrowed until
 * eng_model_head_backward on a returns. */
int eng_model_head_forward(eng_model_t *m, eng_acts_t *a, const float *x, const int32_t *targets,
                           uint32_t B, uint32_t T, float *loss);
/* dx: written with the gradient of (sum of the token losses) * grad_scale w.r.t. x;
 * ACCUMULATES the ln_f and wte gradients. With opts->split_head, wte's gradient is left
 * to eng_model_head_backward_weight on the same acts, later (ZB-H1's weight pass): the same
 * kernels on the same dlogits, so in micro-batch order the same bits as the whole backward.
 * CH_E_STATE on acts whose weight pass is still pending. */
int eng_model_head_backward(eng_model_t *m, eng_acts_t *a, float grad_scale, float *dx);
int eng_model_head_backward_weight(eng_model_t *m, eng_acts_t *a);

#endif
