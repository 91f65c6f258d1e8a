/* Tensor parallelism's f/g pair (tp.h). */
#include "workerd/engine/tp.h"

int eng_tp_allreduce(wrk_coll_group_t *tp, float *buf, size_t n, wrk_coll_redop_t op)
{
    if (tp == NULL || n == 0) {
        return 0;
    }
    /* waited where its result is used: the next kernel on the compute stream, which waits
     * on the device (NCCL) while the host goes on enqueueing */
    wrk_coll_req_t *r = NULL;
    return wrk_coll_ordered(wrk_coll_allreduce(tp, buf, buf, n, WRK_COLL_F32, op, &r), &r);
}

static int activations_allreduce(wrk_coll_group_t *tp, eng_bf16_msg_t *bf, float *x, size_t n)
{
    if (bf == NULL || tp == NULL || n == 0)
        return eng_tp_allreduce(tp, x, n, WRK_COLL_SUM);
    return eng_bf16_allreduce(tp, x, n, WRK_COLL_SUM, bf);
}

int eng_tp_f_backward(wrk_coll_group_t *tp, eng_bf16_msg_t *bf, float *dx, size_t n)
{
    return activations_allreduce(tp, bf, dx, n);
}

int eng_tp_g_forward(wrk_coll_group_t *tp, eng_bf16_msg_t *bf, float *y, size_t n)
{
    return activations_allreduce(tp, bf, y, n);
}
