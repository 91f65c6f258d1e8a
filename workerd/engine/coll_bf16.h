/* Messages of fp32-stored bf16 values moved as bf16 (2 bytes an element): a mixed-precision
 * run's TP activation all-reduces (train.precision = bf16) and gradient reductions
 * (optim.grad_reduce = bf16). The values are cast to bf16 (kernels/bf16.h, round to nearest
 * even) into a buffer of the collectives' memory, reduced as WRK_COLL_BF16 (each pairwise add
 * widens to fp32 and rounds to bf16, coll.h: two members give round(a + b)) and widened back
 * into the fp32 storage. The casts run where the memory is: the backend's bf16_cast entry
 * (backend.h: the CPU's, devsim's, the GPU's kernels), or on the host with host_memory. */
#ifndef ENG_COLL_BF16_H
#define ENG_COLL_BF16_H

#include <stddef.h>

#include "kernels/bf16.h"
#include "workerd/coll/coll.h"
#include "workerd/engine/backend.h"

/* 1 when be can cast bf16 messages in its memory (eng_bf16_cast). */
int eng_bf16_castable(const eng_backend_t *be);
/* be's bf16_cast (backend.h), or the host's with host_memory; -ENOTSUP when neither. */
int eng_bf16_cast(const eng_backend_t *be, void *dst, const void *src, size_t n, int to_bf16);

/* The packed message's buffer (the collectives' memory of the group it was first used
 * with), grown on demand; eng_bf16_msg_init before use. */
typedef struct eng_bf16_msg {
    const eng_backend_t *be; /* the casts' (borrowed) */
    wrk_coll_t *c;           /* whose memory pk is */
    kn_bf16_t *pk;
    size_t cap;
} eng_bf16_msg_t;

void eng_bf16_msg_init(eng_bf16_msg_t *m, const eng_backend_t *be);
/* Room for n elements in g's collectives memory now, so that no step allocates (a device
 * allocation waits for the device). 0 or the allocation's error. */
int eng_bf16_msg_reserve(eng_bf16_msg_t *m, wrk_coll_group_t *g, size_t n);
/* buf[0..n) all-reduced (op) in place as bf16 over g, waited for. 0, -ENOMEM, -ENOTSUP or
 * the collectives' error. */
int eng_bf16_allreduce(wrk_coll_group_t *g, float *buf, size_t n, wrk_coll_redop_t op,
                       eng_bf16_msg_t *m);
/* full[0..size*S) summed as bf16 over g: this member's block lands in part (S floats; may
 * be full + index * S), waited for. */
int eng_bf16_reduce_scatter(wrk_coll_group_t *g, const float *full, float *part, size_t S,
                            eng_bf16_msg_t *m);
void eng_bf16_msg_free(eng_bf16_msg_t *m);

#endif
