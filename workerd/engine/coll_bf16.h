/* Reductions of fp32-stored bf16 values moved as bf16 (2 bytes an element) over host memory:
 * a mixed-precision run's TP activation all-reduces (train.precision = bf16) and gradient
 * reductions (optim.grad_reduce = bf16). The values are rounded to bf16 (kernels/bf16.h) into
 * a host buffer, reduced as WRK_COLL_BF16 (each pairwise add widens to fp32 and rounds to
 * bf16, coll.h: two members give round(a + b)) and widened back into the fp32 storage.
 * Device memory has no host packing: its callers keep fp32 collectives there. */
#ifndef ENG_COLL_BF16_H
#define ENG_COLL_BF16_H

#include <stddef.h>

#include "kernels/bf16.h"
#include "workerd/coll/coll.h"

/* The packed message's host buffer, grown on demand; zero-initialised is empty. */
typedef struct eng_bf16_msg {
    kn_bf16_t *pk;
    size_t cap;
} eng_bf16_msg_t;

/* buf[0..n) all-reduced (op) in place as bf16 over g, waited for. 0, -ENOMEM or the
 * collectives' error. */
int eng_bf16_allreduce(wrk_coll_group_t *g, float *buf, size_t n, wrk_coll_redop_t op,
                       eng_bf16_msg_t *m);
/* full[0..size*S) summed as bf16 over g: this member's block lands in part (S floats; may
 * be full + index * S), waited for. */
int eng_bf16_reduce_scatter(wrk_coll_group_t *g, const float *full, float *part, size_t S,
                            eng_bf16_msg_t *m);
void eng_bf16_msg_free(eng_bf16_msg_t *m);

#endif
