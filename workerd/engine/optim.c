/* AdamW, gradient clipping and the learning-rate schedule (optim.h). The update and
 * the sum of squares are the kernels in kernels/adamw.h. */
#include "workerd/engine/optim.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/adamw.h"

eng_lr_t eng_lr_from_spec(const ch_jobspec_t *j)
{
    eng_lr_t s = {j->train.lr, ch_jobspec_lr_min(j), j->train.warmup, j->train.steps};
    return s;
}

double eng_lr_at(const eng_lr_t *s, int64_t step)
{
    if (step < s->warmup)
        return s->lr * (double)(step + 1) / (double)s->warmup;
    int64_t span = s->steps - 1 - s->warmup;
    if (span <= 0)
        return s->lr;
    double ratio = (double)(step - s->warmup) / (double)span;
    if (ratio > 1)
        ratio = 1;
    return s->lr_min + 0.5 * (1.0 + cos(M_PI * ratio)) * (s->lr - s->lr_min);
}

int eng_optim_init(eng_optim_t *o, size_t n)
{
    return eng_optim_init_on(o, NULL, n);
}

int eng_optim_init_on(eng_optim_t *o, const eng_backend_t *be, size_t n)
{
    memset(o, 0, sizeof *o);
    o->be = be;
    size_t bytes = (n ? n : 1) * sizeof(float);
    if (be) {
        void *m = NULL, *v = NULL;
        int rc = be->alloc(be, bytes, &m);
        o->m = m;
        if (rc == 0)
            rc = be->alloc(be, bytes, &v);
        o->v = v;
        if (rc == 0)
            rc = be->memset(be, o->m, 0, bytes);
        if (rc == 0)
            rc = be->memset(be, o->v, 0, bytes);
        if (rc < 0) {
            eng_optim_fini(o);
            return rc;
        }
    } else {
        o->m = calloc(n ? n : 1, sizeof *o->m);
        o->v = calloc(n ? n : 1, sizeof *o->v);
        if (!o->m || !o->v) {
            eng_optim_fini(o);
            return -ENOMEM;
        }
    }
    o->n = n;
    o->beta1 = 0.9;
    o->beta2 = 0.95;
    o->eps = 1e-8;
    o->weight_decay = 0.1;
    o->max_grad_norm = 1.0;
    return 0;
}

void eng_optim_fini(eng_optim_t *o)
{
    if (o->be) {
        o->be->free(o->be, o->m);
        o->be->free(o->be, o->v);
    } else {
        free(o->m);
        free(o->v);
    }
    memset(o, 0, sizeof *o);
}

double eng_grad_norm(const float *grads, size_t n)
{
    return sqrt(kn_sumsq(grads, n));
}

double eng_sumsq_on(const eng_backend_t *be, const float *x, size_t n)
{
    if (n == 0)
        return 0;
    if (be->sumsq)
        return be->sumsq(be, x, n);
    if (be->host_memory)
        return kn_sumsq(x, n);
    float *host = malloc(n * sizeof *host);
    double sq = NAN;
    if (host && be->copy(be, host, x, n * sizeof *host, ENG_COPY_D2H) == 0)
        sq = kn_sumsq(host, n);
    free(host);
    return sq;
}

float eng_clip_coef(double norm, double max_norm)
{
    double coef = max_norm / (norm + 1e-6);
    return coef < 1.0 ? (float)coef : 1.0f; /* torch multiplies by a float32 tensor */
}

double eng_grad_clip(float *grads, size_t n, double max_norm)
{
    double norm = eng_grad_norm(grads, n);
    float c = eng_clip_coef(norm, max_norm);
    if (c < 1.0f)
        kn_scale(grads, n, c);
    return norm;
}

/* adamw_fused when the backend has it; else the same bits from its older entries */
void eng_adamw_piece(const eng_backend_t *be, const eng_optim_t *o, float *p, float *g, float *m,
                     float *v, size_t n, double lr, double wd, float coef, int zero)
{
    if (be->adamw_fused != NULL) {
        be->adamw_fused(be, p, g, m, v, n, lr, o->beta1, o->beta2, o->eps, wd, o->t, coef, zero);
        return;
    }
    if (coef != 1.0f) {
        if (be->scale)
            be->scale(be, g, n, coef);
        else
            kn_scale(g, n, coef); /* a backend without scale or adamw_fused: host memory */
    }
    be->adamw(be, p, g, m, v, n, lr, o->beta1, o->beta2, o->eps, wd, o->t);
    if (zero)
        be->memset(be, g, 0, n * sizeof *g);
}

int eng_optim_step_range(eng_optim_t *o, const eng_model_t *m, size_t lo, size_t hi, float *p,
                         float *g, double lr, float grad_coef, int zero_grads)
{
    if (lo > hi || hi > eng_model_nparams(m) || o->n != hi - lo)
        return -EINVAL;
    const eng_backend_t *be = eng_model_backend(m);
    o->t++;
    for (size_t i = 0; i < eng_model_ntensors(m); i++) {
        const eng_tensor_t *t = eng_model_tensor(m, i);
        size_t a = t->offset > lo ? t->offset : lo;
        size_t b = t->offset + t->numel < hi ? t->offset + t->numel : hi;
        if (a >= b)
            continue;
        size_t k = a - lo;
        eng_adamw_piece(be, o, p + k, g + k, o->m + k, o->v + k, b - a, lr,
                        t->decay ? o->weight_decay : 0.0, grad_coef, zero_grads);
    }
    return 0;
}

int eng_optim_step_fused(eng_optim_t *o, eng_model_t *m, double lr, float grad_coef, int zero_grads)
{
    return eng_optim_step_range(o, m, 0, eng_model_nparams(m), eng_model_params(m),
                                eng_model_grads(m), lr, grad_coef, zero_grads);
}

int eng_optim_step(eng_optim_t *o, eng_model_t *m, double lr)
{
    return eng_optim_step_fused(o, m, lr, 1.0f, 0);
}
