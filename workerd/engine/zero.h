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
 *   backward of block l             its gradient accumulates into one unsharded buffer,
 *                                   zeroed first;
 *   after the backward of block l   that buffer is reduce-scattered (sum) over the DP group
 *                                   and each rank adds its shard to its reduced gradient.
 * Policies: reshard = per-use keeps two gathered buffers (the block in use and the next)
 * and gathers a block again at each use (a buffer that still holds the block from its last
 * use this step is reused); per-step keeps every block of the stage gathered from its first
 * use until the end of the step (one gather per block per step, the stage's full
 * parameters in memory). The tensors outside blocks (wte, wpe, ln_f) stay whole in the
 * model's slab on every DP rank; the trainer all-reduces their gradients.
 *
 * Clipping and AdamW run on the shards (eng_zero_sumsq, eng_zero_adamw),
 * with the same per-element arithmetic as the unsharded optimizer, so the cost per rank
 * falls with dp. A DP group of one (dp == 1) is valid: the shard is the whole block. */
#ifndef ENG_ZERO_H
#define ENG_ZERO_H

#include <stddef.h>
#include <stdint.h>

#include "common/jobspec.h"
#include "workerd/coll/coll.h"
#include "workerd/engine/ckpt.h"
#include "workerd/engine/model.h"
#include "workerd/engine/optim.h"

typedef struct eng_zero eng_zero_t;

/* Shard m's blocks over dp (NULL: a group of one) under policy, initialise the owned shards
 * from the model's initial parameters (eng_model_init_block) and install the block hook.
 * m must have been created with external_blocks; its backend's memory is the shards' and
 * the gathered buffers' (through dp's collectives' memory, which must be the same kind:
 * host for UCX, the GPU's for NCCL), and off the host the backend needs axpy (-ENOTSUP).
 * m and dp are borrowed for the object's life. Caller owns *out (eng_zero_destroy, before
 * m). */
int eng_zero_create(eng_model_t *m, wrk_coll_group_t *dp, ch_reshard_t policy, eng_zero_t **out);
void eng_zero_destroy(eng_zero_t *z);

/* Before a step's first pass: gathered buffers marked stale (the parameters changed). The
 * reduced gradients are zero already: new, or reset by the previous eng_zero_adamw (the
 * shards' padding is never written but with zeros). */
void eng_zero_begin_step(eng_zero_t *z);
/* Sum of squares of the owned reduced gradients (in double), counting tensors that tensor
 * parallelism replicates (eng_split_t NONE) only when count_replicated is set (so that a
 * sum over the TP group counts them once). */
double eng_zero_sumsq(const eng_zero_t *z, int count_replicated);
/* One AdamW update of the owned shards at lr with o's hyper-parameters, on the gradients
 * times grad_coef (clipping, fused), leaving the gradients zero; update number o->t (the
 * caller advances it first). */
void eng_zero_adamw(eng_zero_t *z, const eng_optim_t *o, double lr, float grad_coef);

/* Drop the step's reduced gradients (zero them) without an update: a step whose loss or
 * norm is not finite under fault.nonfinite = skip. */
void eng_zero_drop_grads(eng_zero_t *z);

/* The checkpoint pieces of the owned shards (ckpt.h): for each block and each of its
 * tensors that the shard covers, the covered range of the tensor's TP slice with pointers
 * into the shards. *out is malloc'd (caller frees); *n pieces. */
int eng_zero_pieces(const eng_zero_t *z, eng_ckpt_piece_t **out, size_t *n);

/* Bytes this object holds: state = owned parameters, gradients, m and v; gathered = the
 * gathered buffers and the unsharded gradient buffer (reduce-scattered in place). */
void eng_zero_bytes(const eng_zero_t *z, size_t *state, size_t *gathered);
/* Floats per shard of block l (S), and the block's unpadded count. */
size_t eng_zero_shard_len(const eng_zero_t *z);

#endif
