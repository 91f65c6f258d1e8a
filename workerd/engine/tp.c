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

int eng_tp_f_backward(wrk_coll_group_t *tp, float *dx, size_t n)
{
    return eng_tp_allreduce(tp, dx, n, WRK_COLL_SUM);
}

int eng_tp_g_forward(wrk_coll_group_t *tp, float *y, size_t n)
{
    return eng_tp_allreduce(tp, y, n, WRK_COLL_SUM);
}
