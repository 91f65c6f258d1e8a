/* What the host reads of a step (trainer_impl.h's rb): the gradients' sums of squares and
 * the last stage's loss stay in the backend's memory while the passes run and come back in
 * one download after them, so a device rank waits for its stream once for them, not once
 * per micro-batch and once per run of gradients. The micro-batch losses are summed on the
 * device as the host summed them (backend.h's loss_acc), the runs' sums on the host in the
 * order it always has (the runs of a store, then the stores): the same bits as reading each
 * at once. */
#include <errno.h>
#include <stdlib.h>

#include "workerd/engine/mem.h"
#include "workerd/engine/optim.h"
#include "workerd/engine/trainer_impl.h"

int eng_trainer_rb_init(eng_trainer_t *t)
{
    const eng_backend_t *be = eng_mem_view(t->be, ENG_MEM_SCRATCH);
    /* a store's runs each start at a counted tensor; then the loss */
    t->sq_max = eng_model_ntensors(t->model) + ENG_NSTORES;
    size_t bytes = (t->sq_max + 1) * sizeof(double);
    t->rb_host = calloc(1, bytes);
    if (t->rb_host == NULL)
        return -ENOMEM;
    int rc = be->alloc(be, bytes, &t->rb);
    return rc == 0 ? be->memset(be, t->rb, 0, bytes) : rc;
}

void eng_trainer_rb_fini(eng_trainer_t *t)
{
    if (t->be)
        t->be->free(t->be, t->rb);
    free(t->rb_host);
}

int eng_trainer_loss_begin(eng_trainer_t *t)
{
    t->loss_sum = 0;
    return t->be->loss_acc ? t->be->memset(t->be, (double *)t->rb + t->sq_max, 0, sizeof(double))
                           : 0;
}

int eng_trainer_loss_add(eng_trainer_t *t, eng_acts_t *a, const float *x, uint32_t B, uint32_t T)
{
    const eng_backend_t *be = t->be;
    if (!be->loss_acc) { /* the losses copied back now (a wait) and summed on the host */
        float loss = 0;
        int rc = eng_model_head_forward(t->model, a, x, t->targets, B, T, &loss);
        t->loss_sum += loss;
        return rc;
    }
    int rc = eng_model_head_forward(t->model, a, x, t->targets, B, T, NULL);
    if (rc == 0)
        be->loss_acc(be, (double *)t->rb + t->sq_max, eng_acts_losses(a), (size_t)B * T);
    return rc;
}

/* One run's sum of squares into the next slot: enqueued (sumsq_to), else read now. */
static void sumsq_run(eng_trainer_t *t, const float *g, size_t n)
{
    if (n == 0) /* adds +0.0 to a sum of squares: nothing */
        return;
    if (t->be->sumsq_to)
        t->be->sumsq_to(t->be, (double *)t->rb + t->sq_n, g, n);
    else
        ((double *)t->rb_host)[t->sq_n] = eng_sumsq_on(t->be, g, n);
    t->sq_n++;
}

void eng_trainer_sumsq_start(eng_trainer_t *t)
{
    eng_store_t st[ENG_NSTORES];
    eng_trainer_stores(t, st);
    t->sq_n = 0;
    for (int s = 0; s < ENG_NSTORES; s++) {
        const float *g = st[s].g;
        size_t run_lo = 0, run_hi = 0;
        for (size_t i = 0; g && i < eng_model_ntensors(t->model); i++) {
            const eng_tensor_t *x = eng_model_tensor(t->model, i);
            if (x->store != (eng_store_id_t)s || !x->counted || x->own_lo == x->own_hi)
                continue;
            if (x->own_at != run_hi) {
                sumsq_run(t, g + run_lo, run_hi - run_lo);
                run_lo = x->own_at;
            }
            run_hi = x->own_at + (x->own_hi - x->own_lo);
        }
        if (g)
            sumsq_run(t, g + run_lo, run_hi - run_lo);
        t->sq_end[s] = t->sq_n;
    }
}

int eng_trainer_readback(eng_trainer_t *t, int sums)
{
    const eng_backend_t *be = t->be;
    int last = t->stage + 1 == t->stages;
    size_t lo = sums && be->sumsq_to ? 0 : t->sq_max * sizeof(double);
    size_t hi = (t->sq_max + (last && be->loss_acc)) * sizeof(double);
    if (hi == lo)
        return 0;
    /* the copy waits for the stream, which may wait on collectives: settle them first, so
     * a dead peer fails the step instead of hanging the copy */
    int rc = wrk_coll_settle(eng_trainer_coll(t), -1);
    if (rc == 0)
        rc = be->copy(be, (char *)t->rb_host + lo, (const char *)t->rb + lo, hi - lo, ENG_COPY_D2H);
    return rc;
}

double eng_trainer_sumsq(const eng_trainer_t *t)
{
    const double *v = t->rb_host;
    double sq = 0;
    size_t k = 0;
    for (int s = 0; s < ENG_NSTORES; s++) {
        double part = 0;
        for (; k < t->sq_end[s]; k++)
            part += v[k];
        sq += part;
    }
    return sq;
}

double eng_trainer_loss_sum(const eng_trainer_t *t)
{
    int last = t->stage + 1 == t->stages;
    if (!last || !t->be->loss_acc)
        return t->loss_sum;
    return ((const double *)t->rb_host)[t->sq_max];
}
