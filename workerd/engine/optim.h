/* Optimizer (DESIGN §7): AdamW as torch.optim.AdamW computes it (β 0.9/0.95, eps 1e-8,
 * decoupled weight decay 0.1 on 2-D weights only, bias correction), global gradient-norm
 * clipping as torch.nn.utils.clip_grad_norm_, and the learning-rate schedule.
 *
 * Adam state m and v are slabs with the model's parameter layout, so tensor i's state
 * is m[offset .. offset + numel) like its parameters. */
#ifndef WRK_OPTIM_H
#define WRK_OPTIM_H

#include <stddef.h>
#include <stdint.h>

#include "common/jobspec.h"
#include "workerd/engine/model.h"

// ----------------------------------------------------------------------------
// learning-rate schedule

typedef struct wrk_sched {
    double lr, lr_min; /* lr_min already resolved (not -1) */
    int64_t warmup, steps;
} wrk_sched_t;

wrk_sched_t wrk_sched_from_spec(const ch_jobspec_t *j);
/* Step s (0-based): lr * (s + 1) / warmup for s < warmup; then a cosine from lr at
 * s = warmup down to lr_min at s = steps - 1. */
double wrk_sched_lr(const wrk_sched_t *s, int64_t step);

// ----------------------------------------------------------------------------
// AdamW

typedef struct wrk_optim {
    float *m, *v; /* n floats each, zero-initialised; owned */
    size_t n;
    uint64_t t; /* updates taken (torch's per-parameter "step") */
    double beta1, beta2, eps, weight_decay, max_grad_norm;
} wrk_optim_t;

/* State for n parameters with the defaults above (max_grad_norm 1.0). */
int wrk_optim_init(wrk_optim_t *o, size_t n);
void wrk_optim_fini(wrk_optim_t *o);

/* Global L2 norm of grads[0..n) (accumulated in double). */
double wrk_grad_norm(const float *grads, size_t n);
/* clip_grad_norm_: with total = the norm, multiply grads by max_norm / (total + 1e-6)
 * when that is below 1. Returns the norm before clipping. */
double wrk_grad_clip(float *grads, size_t n, double max_norm);

/* One AdamW update of every tensor of the model at learning rate lr, using the
 * model's gradients (clip them first). Weight decay applies to tensors with decay set. */
int wrk_optim_step(wrk_optim_t *o, eng_model_t *m, double lr);

#endif
