/* The bf16 emulation backend: a wrapper over any backend (backend.h) that rounds to
 * bf16 (kernels/bf16.h, round to nearest even) at exactly the points a mixed-precision GPU
 * run stores bf16, so the CPU proves the mixed-precision arithmetic without a GPU. It is the
 * reference of `train.precision = bf16` (selected on device = cpu with train.emulate = yes)
 * and is slow on purpose: every rounding is a pass over the tensor, through host copies when
 * the inner backend's memory is not the host's and it has no bf16_round entry. Over the
 * CUDA backend (bf16_round a cast kernel, eng_backend_cuda_set_bf16: the matmuls multiply
 * bf16 operands with cuBLASLt) the same wrapper is the GPU path's bookkeeping; its fp32
 * slots and extra passes make it a correct, not yet a fast, bf16 (the GPU goals are
 * unmeasured).
 *
 * What is bf16 (rounded) and what stays fp32:
 * - parameters as the kernels read them: bf16. Without ZeRO-3 the trainer casts the slab of
 *   fp32 master weights once per step into a packed bf16 working copy (2 bytes a parameter)
 *   and hands it over (backend.h's bf16_weights) for the step's passes: a GEMM operand in
 *   it goes to the inner's GEMM untouched when the inner reads the copy itself (CUDA: its
 *   bf16 GEMMs take the copy's bytes, no cast), and every other parameter operand (biases,
 *   LayerNorm, the embedding's rows, the LM head's fp32 GEMM) is widened from the copy.
 *   Under ZeRO-3 the cast is per gathered block: the owner casts its shard and the gather
 *   moves bf16 (zero.h); the kernels round those operands again, which changes no bit.
 *   A parameter operand outside any copy is rounded from the master values as it is read;
 *   rounding is deterministic, so both ways give the same bits;
 * - GEMM inputs (activations, their gradients, the weights): bf16; the products accumulate in
 *   fp32 (the inner kernel's arithmetic) and the GEMM's output is stored bf16;
 * - activations and activation gradients every kernel writes (encoder, layernorm, attention
 *   output, GELU, residual, dinp of every backward): stored bf16. A block's kept ones but
 *   its output (and the attention output where a fused backward reads it) are kept as their
 *   packed 2-byte casts and widened just before the backward reads each (model.h's
 *   bf16_acts); the others keep an fp32 slot holding bf16 values;
 * - fp32: LayerNorm statistics (mean, rstd), the softmax (attention probabilities), the LM
 *   head's logits and cross-entropy (lse, losses, dlogits), every parameter gradient (fp32,
 *   accumulated across micro-batches), the gradient norm, AdamW and its state, and the
 *   master weights the checkpoints hold.
 *
 * The entries that move or reduce fp32 state (alloc, free, copy, memset, axpy, adamw,
 * adamw_fused, sumsq, scale, sync) are the inner backend's. Kernels cannot fail: a scratch
 * allocation or staging copy that fails is reported by the next copy (and that kernel ran
 * on unrounded inputs). One thread drives a wrapper, like its inner backend. */
#ifndef ENG_BACKEND_BF16_H
#define ENG_BACKEND_BF16_H

#include <stdint.h>

#include "workerd/engine/backend.h"

/* A wrapper over inner (borrowed: it must outlive the wrapper), name "<inner>+bf16", the
 * inner's host_memory. Caller owns *out: eng_backend_bf16_destroy. 0 or -ENOMEM. */
int eng_backend_bf16_create(const eng_backend_t *inner, eng_backend_t **out);
/* Frees the wrapper and its scratch; NULL is fine. */
void eng_backend_bf16_destroy(eng_backend_t *be);
/* x[0..n) of be's memory rounded to bf16 in place (optim.grad_reduce = bf16's casts around
 * the reduction). be: a wrapper, or any view of a ledger over one (mem.h). */
void eng_backend_bf16_round(const eng_backend_t *be, float *x, size_t n);

/* Parameter elements the kernels read since the wrapper was made: rounded from the fp32
 * masters as they were read (outside any working copy), and taken from the working copy
 * (widened, or handed to the inner's GEMM). */
typedef struct eng_bf16_counts {
    uint64_t params_rounded, params_from_copy;
} eng_bf16_counts_t;
/* be: a wrapper, or any view of a ledger over one. */
void eng_backend_bf16_counts(const eng_backend_t *be, eng_bf16_counts_t *out);

#endif
