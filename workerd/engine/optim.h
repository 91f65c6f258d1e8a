/* Optimizer (DESIGN §7): AdamW as torch.optim.AdamW computes it (β 0.9/0.95, eps 1e-8,
 * decoupled weight decay 0.1 on 2-D weights only, bias correction), global gradient-norm
 * clipping as torch.nn.utils.clip_grad_norm_, and the learning-rate schedule.
 *
 * Adam state m and v are slabs with the model's parameter layout, so tensor i's state
 * is m[offset .. offset + numel) like its parameters. The update runs the adamw kernel of
 * the model's backend (backend.h); m and v are host memory (the CPU backend's). */
#ifndef ENG_OPTIM_H
#define ENG_OPTIM_H

#include <stddef.h>
#include <stdint.h>

#include "common/jobspec.h"
#include "workerd/engine/model.h"

// ----------------------------------------------------------------------------
// learning-rate schedule

typedef struct eng_lr {
    double lr, lr_min; /* lr_min already resolved (not -1) */
    int64_t warmup, steps;
} eng_lr_t;

eng_lr_t eng_lr_from_spec(const ch_jobspec_t *j);
/* Step s (0-based): lr * (s + 1) / warmup for s < warmup; then a cosine from lr at
 * s = warmup down to lr_min at s = steps - 1. */
double eng_lr_at(const eng_lr_t *s, int64_t step);

// ----------------------------------------------------------------------------
// AdamW

typedef struct eng_optim {
    float *m, *v; /* n floats each, zero-initialised; owned */
    size_t n;
    uint64_t t; /* updates taken (torch's per-parameter "step") */
    double beta1, beta2, eps, weight_decay, max_grad_norm;
} eng_optim_t;

/* State for n parameters with the defaults above (max_grad_norm 1.0). */
int eng_optim_init(eng_optim_t *o, size_t n);
void eng_optim_fini(eng_optim_t *o);

/* Global L2 norm of grads[0..n) (accumulated in double). */
double eng_grad_norm(const float *grads, size_t n);
/* clip_grad_norm_: with total = the norm, multiply grads by max_norm / (total + 1e-6)
 * when that is below 1. Returns the norm before clipping. */
double eng_grad_clip(float *grads, size_t n, double max_norm);

/* One AdamW update of every tensor of the model at learning rate lr, using the
 * model's gradients (clip them first). Weight decay applies to tensors with decay set. */
int eng_optim_step(eng_optim_t *o, eng_model_t *m, double lr);

#endif
