/* Optimizer (DESIGN §7): AdamW as torch.optim.AdamW computes it (β 0.9/0.95, eps 1e-8,
 * decoupled weight decay 0.1 on 2-D weights only, bias correction), global gradient-norm
 * clipping as torch.nn.utils.clip_grad_norm_, and the learning-rate schedule.
 *
 * Adam state m and v are slabs with the model's parameter layout, so tensor i's state
 * is m[offset .. offset + numel) like its parameters. The update runs the adamw kernel of
 * the model's backend (backend.h); m and v are that backend's memory (eng_optim_init_on),
 * host memory for the CPU backend. */
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
    float *m, *v;            /* n floats each, zero-initialised; owned, in be's memory */
    const eng_backend_t *be; /* where m and v live (borrowed); NULL: host memory */
    size_t n;
    uint64_t t; /* updates taken (torch's per-parameter "step") */
    double beta1, beta2, eps, weight_decay, max_grad_norm;
} eng_optim_t;

/* State for n parameters with the defaults above (max_grad_norm 1.0), in host memory. */
int eng_optim_init(eng_optim_t *o, size_t n);
/* The same in backend be's memory (be borrowed for o's life; NULL: host memory), for a
 * model on that backend. */
int eng_optim_init_on(eng_optim_t *o, const eng_backend_t *be, size_t n);
void eng_optim_fini(eng_optim_t *o);

/* Sum of squares of x[0..n) (backend memory) in double, on the host: the backend's sumsq
 * (kernels/adamw.h's fixed order on the CPU), or a host copy summed by kn_sumsq when the
 * backend lacks the entry. NAN when that copy fails. */
double eng_sumsq_on(const eng_backend_t *be, const float *x, size_t n);

/* Global L2 norm of grads[0..n) (host memory; sum of squares in double in fixed blocks,
 * over the kernels' threads: the same bits for any thread count, kernels/adamw.h). */
double eng_grad_norm(const float *grads, size_t n);
/* clip_grad_norm_'s coefficient for a global norm: max_norm / (norm + 1e-6) rounded to
 * float (torch multiplies by a float32 tensor) when below 1, else 1.0f (no-op). */
float eng_clip_coef(double norm, double max_norm);
/* clip_grad_norm_: grads *= eng_clip_coef(the norm, max_norm) when that is below 1.
 * Returns the norm before clipping. */
double eng_grad_clip(float *grads, size_t n, double max_norm);

/* One AdamW update of every tensor of the model at learning rate lr, using the
 * model's gradients (clip them first). Weight decay applies to tensors with decay set. */
int eng_optim_step(eng_optim_t *o, eng_model_t *m, double lr);

/* The fused step: clipping, AdamW and the gradient reset in one pass over parameters,
 * m, v and gradients (the backend's adamw_fused), spread over the kernels' threads.
 * Uses the gradients times grad_coef (eng_clip_coef of the global norm; 1.0f: unclipped),
 * and with zero_grads leaves them zero, so the next step needs no eng_model_zero_grad.
 * Bit-identical to eng_grad_clip (with the same norm), eng_optim_step, eng_model_zero_grad.
 * A training step is then: gradients, norm = eng_grad_norm (or its collective variant),
 * eng_optim_step_fused(o, m, lr, eng_clip_coef(norm, o->max_grad_norm), 1). */
int eng_optim_step_fused(eng_optim_t *o, eng_model_t *m, double lr, float grad_coef,
                         int zero_grads);

/* One piece of the fused update: AdamW (update o->t, o's betas and eps, weight decay wd)
 * of p[0..n) with m[0..n), v[0..n) on the gradients g[0..n) times coef, and g zeroed after
 * when zero is set (backend memory). The unit the steps below and ZeRO-3's shards use. */
void eng_adamw_piece(const eng_backend_t *be, const eng_optim_t *o, float *p, float *g, float *m,
                     float *v, size_t n, double lr, double wd, float coef, int zero);

/* The same on a flat range [lo, hi) of the model's slab held in separate buffers (a ZeRO-3
 * shard): p[0..hi-lo) and g[0..hi-lo) are that range's parameters and gradients (backend
 * memory), o holds hi - lo floats of state for it. Each piece of a tensor in the range is
 * updated with that tensor's weight decay. o->t advances by one. -EINVAL when o->n is not
 * hi - lo or the range is outside the slab. */
int eng_optim_step_range(eng_optim_t *o, const eng_model_t *m, size_t lo, size_t hi, float *p,
                         float *g, double lr, float grad_coef, int zero_grads);

#endif
