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
    memset(o, 0, sizeof *o);
    o->m = calloc(n ? n : 1, sizeof *o->m);
    o->v = calloc(n ? n : 1, sizeof *o->v);
    if (!o->m || !o->v) {
        eng_optim_fini(o);
        return -ENOMEM;
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
    free(o->m);
    free(o->v);
    memset(o, 0, sizeof *o);
}

double eng_grad_norm(const float *grads, size_t n)
{
    return sqrt(kn_sumsq(grads, n));
}

double eng_grad_clip(float *grads, size_t n, double max_norm)
{
    double norm = eng_grad_norm(grads, n);
    double coef = max_norm / (norm + 1e-6);
    if (coef < 1.0) {
        float c = (float)coef; /* torch multiplies by a float32 tensor */
        for (size_t i = 0; i < n; i++)
            grads[i] *= c;
    }
    return norm;
}

int eng_optim_step(eng_optim_t *o, eng_model_t *m, double lr)
{
    if (eng_model_nparams(m) != o->n)
        return -EINVAL;
    const eng_backend_t *be = eng_model_backend(m);
    float *p = eng_model_params(m);
    const float *g = eng_model_grads(m);
    o->t++;
    for (size_t i = 0; i < eng_model_ntensors(m); i++) {
        const eng_tensor_t *t = eng_model_tensor(m, i);
        size_t off = t->offset;
        be->adamw(be, p + off, g + off, o->m + off, o->v + off, t->numel, lr, o->beta1, o->beta2,
                  o->eps, t->decay ? o->weight_decay : 0.0, o->t);
    }
    return 0;
}
