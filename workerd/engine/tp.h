/* Tensor parallelism's communication (Megatron-LM's tensor_parallel/mappings.py), one named
 * forward/backward pair per region, so the model's passes read as math:
 *
 *   f  before a column-parallel layer: forward copy (identity), backward all-reduce of the
 *      input gradient (each rank holds only its columns' part of dX);
 *   g  after a row-parallel layer: forward all-reduce of the partial products, backward
 *      copy (identity).
 *
 * The vocab-parallel embedding's forward is a g too (a sum of partial lookups); the
 * cross-entropy uses eng_tp_allreduce directly (fp32 sums and maxima of per-row values). A NULL
 * group is a TP group of one: every call is a no-op. Buffers are the model backend's memory, which
 * the group's collectives read (host memory over UCX, the GPU's over NCCL); the reduction order is
 * fixed, so every member gets the same bits. */
#ifndef ENG_TP_H
#define ENG_TP_H

#include <stddef.h>

#include "workerd/coll/coll.h"
#include "workerd/engine/coll_bf16.h"

/* In-place all-reduce (op over the group) of n floats, waited for in stream order
 * (wrk_coll_wait_stream: on NCCL the compute stream waits, not the host). 0 or the
 * collectives' error. */
int eng_tp_allreduce(wrk_coll_group_t *tp, float *buf, size_t n, wrk_coll_redop_t op);

/* The activations' pair below takes bf: NULL, fp32 all-reduces; else (train.precision =
 * bf16, where the values are bf16 already) all-reduces moved and summed in bf16, the result
 * rounded to bf16 (coll_bf16.h), as Megatron's bf16 runs do. */

/* f: forward copy; its backward all-reduces dx [n] in place. */
static inline int eng_tp_f_forward(wrk_coll_group_t *tp, float *x, size_t n)
{
    (void)tp, (void)x, (void)n;
    return 0;
}
int eng_tp_f_backward(wrk_coll_group_t *tp, eng_bf16_msg_t *bf, float *dx, size_t n);

/* g: forward all-reduces the partial outputs y [n] in place; its backward is a copy. */
int eng_tp_g_forward(wrk_coll_group_t *tp, eng_bf16_msg_t *bf, float *y, size_t n);
static inline int eng_tp_g_backward(wrk_coll_group_t *tp, float *dy, size_t n)
{
    (void)tp, (void)dy, (void)n;
    return 0;
}

#endif
