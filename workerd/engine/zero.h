/* ZeRO-3 sharded data parallelism for one rank's stage (DESIGN §5; Rajbhandari et al.
 * 2020, stage 3).
 *
 * Theory of operation. Within each (tp, stage) slice, each block's parameters (its TP
 * slice: the model's block range, eng_model_block_params' layout) are one flat buffer of
 * `count` floats, padded to dp * S (S = ch_layout_shard_len(count, dp)) and split into dp
 * contiguous shards; DP rank d owns elements [d*S, (d+1)*S): the fp32 master weights, Adam
 * m and v, and the reduced gradients. Nothing else of a block is resident.
 *
 * The model (created with external_blocks) calls the block hook around each block:
 *   forward / backward of block l   the full parameters are all-gathered from the shards
 *                                   into a gathered buffer (unless still there), and the
 *                                   next block of the pass is prefetched (non-blocking
 *                                   all-gather) while this one computes;
 *   backward of block l             its gradient accumulates into an unsharded buffer,
 *                                   zeroed first (two, used alternately, with a group);
 *   after the backward of block l   that buffer's reduce-scatter (sum) over the DP group is
 *                                   started, not waited: it runs while the next block's
 *                                   backward writes the other buffer, and is waited (in
 *                                   stream order) and this rank's shard added to its reduced
 *                                   gradient after that backward (or before the reduced
 *                                   gradients are read: reduce_rest, end_step, drop_grads).
 *                                   The adds keep the backwards' order: the same bits.
 * The tensors outside blocks (wte, wpe, ln_f) are sharded the same way, each tensor a unit
 * of its own (so the last stage's tied copy of wte is sharded exactly as stage 0's, and
 * the two stay the same bits): gathered into the model's slab once per step, after the
 * update, and kept whole for the step (they are used at both ends of every micro-batch);
 * their gradients accumulate unsharded in the slab and are reduce-scattered once, after
 * the tied copies' sum over the embedding group (eng_zero_gather_rest / reduce_rest).
 * Policies: reshard = per-use keeps two gathered buffers (the block in use and the next)
 * and gathers a block again at each use (a buffer that still holds the block from its last
 * use this step is reused); per-step keeps every block of the stage gathered from its first
 * use until the end of the step (one gather per block per step, the stage's full
 * parameters in memory).
 *
 * Clipping, AdamW and checkpoints run on the shards through the model's table
 * (eng_zero_store), so the cost per rank falls with dp. A DP group of one (dp == 1) is
 * valid: the shard is the whole block. */
#ifndef ENG_ZERO_H
#define ENG_ZERO_H

#include <stddef.h>
#include <stdint.h>

#include "common/jobspec.h"
#include "workerd/coll/coll.h"
#include "workerd/engine/model.h"
#include "workerd/engine/optim.h"

typedef struct eng_zero eng_zero_t;

/* Shard m's blocks over dp (NULL: a group of one) under policy, initialise the owned shards
 * from the model's initial parameters (eng_model_init_block) and install the block hook.
 * m must have been created with external_blocks and dp, dp_rank of this group (its table
 * then names the owned ranges this object holds: -EINVAL otherwise); its backend's memory is the
 * shards' and the gathered buffers' (through dp's collectives' memory, which must be the same kind:
 * host for UCX, the GPU's for NCCL), and off the host the backend needs axpy (-ENOTSUP).
 * m and dp are borrowed for the object's life. Caller owns *out (eng_zero_destroy, before
 * m). */
int eng_zero_create(eng_model_t *m, wrk_coll_group_t *dp, ch_reshard_t policy, eng_zero_t **out);
void eng_zero_destroy(eng_zero_t *z);

/* Before a step's first pass, and after an update: gathered blocks marked stale (the
 * parameters changed), so the next use gathers them again. The reduced gradients are zero
 * already: new, or reset by the previous update (the shards' padding is never written but
 * with zeros). */
void eng_zero_begin_step(eng_zero_t *z);
/* The tensors outside blocks (wte, wpe, ln_f: model.h's slab under external_blocks), each a
 * unit of its own: gather_rest all-gathers them from the owned shards into the model's
 * slab (after the update, and after the shards were restored); reduce_rest reduce-scatters
 * their gradients, accumulated unsharded in the slab over the step's micro-batches, adds
 * this rank's shard to its reduced gradients and zeroes the slab's. Collective over the
 * DP group. */
int eng_zero_gather_rest(eng_zero_t *z);
int eng_zero_reduce_rest(eng_zero_t *z);
/* Before the update: no gather in flight may still read the shards (waits for any). */
void eng_zero_end_step(eng_zero_t *z);
/* The owned shards as the table's ENG_STORE_SHARDS (model.h): master parameters, reduced
 * gradients, Adam m and v, laid out as the table says (shard_base). Clipping, AdamW
 * and checkpoint pieces reach them through the table's own_lo, own_hi and own_at, with the
 * same per-element arithmetic as the unsharded optimizer; an update must leave the
 * gradients zero (the next step accumulates into them). */
eng_store_t eng_zero_store(const eng_zero_t *z);

/* Drop the step's reduced gradients (zero them) without an update: a step whose loss or
 * norm is not finite under fault.nonfinite = skip. */
void eng_zero_drop_grads(eng_zero_t *z);

/* Bytes this rank holds for ZeRO-3: state = owned parameters, gradients, m and v; gathered
 * = the blocks' gathered buffers and their unsharded gradient buffers (reduce-scattered in
 * place; two with a group, one without), and the model's slab: the tensors outside blocks gathered,
 * with their gradients. */
void eng_zero_bytes(const eng_zero_t *z, size_t *state, size_t *gathered);
/* optim.grad_reduce = bf16 (on): the gradient reduce-scatters emulate a bf16 reduction, their
 * inputs and output rounded to bf16 (the model's backend must be a bf16 wrapper's,
 * backend_bf16.h). Off by default. */
int eng_zero_set_bf16_reduce(eng_zero_t *z, int on);
/* train.precision = bf16 (on): the parameter all-gathers (blocks and the tensors outside
 * them) move 2 bytes an element: each rank packs its fp32 master shard to bf16, the group
 * all-gathers bf16 (WRK_COLL_BF16) and the result is widened into the fp32 slots the model
 * reads. The same bits reach the kernels as with fp32 gathers: a bf16 run's kernels read
 * every parameter rounded to bf16 (backend_bf16.h). The casts run in the backend's memory
 * (coll_bf16.h's eng_bf16_cast); a backend without them: -ENOTSUP, the gathers stay fp32. A group
 * of one moves nothing: no-op. Call between steps, before the first; off is a no-op (fp32 is the
 * default). */
int eng_zero_set_bf16_gather(eng_zero_t *z, int on);
/* Floats per shard of block l (S), and the block's unpadded count. */
size_t eng_zero_shard_len(const eng_zero_t *z);

#endif
