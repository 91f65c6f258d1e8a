/* Tensor parallelism's f/g pair (tp.h). */
#include "workerd/engine/tp.h"

#include <math.h>

int eng_tp_allreduce(wrk_coll_group_t *tp, float *buf, size_t n, wrk_coll_redop_t op)
{
    if (tp == NULL || n == 0) {
        return 0;
    }
    /* req NULL: run to completion with the context's default timeout */
    return wrk_coll_allreduce(tp, buf, buf, n, WRK_COLL_F32, op, NULL);
}

int eng_tp_f_backward(wrk_coll_group_t *tp, float *dx, size_t n)
{
    return eng_tp_allreduce(tp, dx, n, WRK_COLL_SUM);
}

int eng_tp_g_forward(wrk_coll_group_t *tp, float *y, size_t n)
{
    return eng_tp_allreduce(tp, y, n, WRK_COLL_SUM);
}

int eng_tp_grad_clip(eng_model_t *m, wrk_coll_group_t *tp, double max_norm, double *norm)
{
    const float *g = eng_model_grads(m);
    double sq[2] = {0.0, 0.0}; /* split, replicated */
    for (size_t i = 0; i < eng_model_ntensors(m); i++) {
        const eng_tensor_t *t = eng_model_tensor(m, i);
        double acc = 0.0;
        for (size_t j = 0; j < t->numel; j++) {
            acc += (double)g[t->offset + j] * g[t->offset + j];
        }
        sq[t->split == ENG_SPLIT_NONE] += acc;
    }
    float split = (float)sq[0];
    int rc = eng_tp_allreduce(tp, &split, 1, WRK_COLL_SUM);
    if (rc < 0) {
        return rc;
    }
    *norm = sqrt((double)split + sq[1]);
    double coef = max_norm / (*norm + 1e-6);
    if (coef < 1.0) {
        float c = (float)coef; /* torch multiplies by a float32 tensor */
        float *gw = eng_model_grads(m);
        for (size_t i = 0; i < eng_model_nparams(m); i++) {
            gw[i] *= c;
        }
    }
    return 0;
}
