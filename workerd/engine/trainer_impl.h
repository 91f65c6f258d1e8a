/* The trainer's insides, shared by trainer.c (create, step, evaluation) and trainer_ckpt.c
 * (pieces, init_from, resume, checkpoints). Private to workerd/engine/trainer*.c. */
#ifndef ENG_TRAINER_IMPL_H
#define ENG_TRAINER_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "workerd/coll/coll.h"
#include "workerd/engine/coll_bf16.h"
#include "workerd/engine/model.h"
#include "workerd/engine/optim.h"
#include "workerd/engine/pipeline.h"
#include "workerd/engine/trainer.h"
#include "workerd/engine/zero.h"

/* Floats of t->small: the few host values a step reduces over its groups. */
#define SMALL_FLOATS 4

struct eng_trainer {
    ch_jobspec_t spec;
    char job[64];
    eng_config_t cfg;
    /* the model's, its optimizer state's and the schedule's memory: a view of the ledger
     * `mem` (mem.h) over the job's backend, which counts what the rank holds by kind */
    const eng_backend_t *be;
    eng_mem_t *mem;
    eng_backend_t *bf16;   /* precision = bf16: the rounding wrapper over the job's backend
                              (backend_bf16.h) the ledger counts; NULL otherwise */
    eng_bf16_msg_t grad16; /* optim.grad_reduce = bf16: the packed DP all-reduce (host) */
    /* precision = bf16 without ZeRO-3: the slab's bf16 working copy, cast from the masters
     * at the start of each step and evaluation (backend.h's bf16_weights); NULL: none */
    kn_bf16_t *w16;
    eng_model_t *model;
    eng_optim_t optim; /* the model's slab: every tensor, or (ZeRO-3) those outside blocks */
    eng_zero_t *zero;  /* ZeRO-3: the blocks' shards; NULL without data parallelism */
    eng_data_t *data;
    eng_data_t *val;  /* train.val_data, read in order; NULL: none */
    eng_data_t *feed; /* what stage_forward reads: data, or val during an evaluation */
    eng_lr_t sched;
    int32_t *inputs, *targets; /* one micro-batch, [B, T] */
    uint64_t next_step;
    double peak_flops;
    const eng_groups_t *groups; /* borrowed; NULL for a world of one */
    wrk_coll_group_t *tp, *dp, *pp, *emb;
    float *coll_grads; /* dp > 1: the slab's gradients, in the collectives' memory */
    float *small;      /* SMALL_FLOATS of backend memory: the step's loss and norm reductions */
    /* What the host reads of a step's passes, downloaded once after them (readback): rb
     * (backend memory) holds sq_max doubles, the gradients' sums of squares, one per run
     * (backend.h's sumsq_to; without it they are summed into rb_host at once), then on the
     * last stage the sum of the micro-batch losses (loss_acc; without it: loss_sum). sq_n
     * runs this step, store s's are [s ? sq_end[s-1] : 0, sq_end[s]). */
    void *rb, *rb_host;
    size_t sq_max, sq_n, sq_end[ENG_NSTORES];
    uint32_t tpr, dpr, rank;
    /* this rank's stage: blocks [first, last); the schedule, one acts per slot (which hold
     * the embedding's and the blocks' outputs too) and the [B,T,C] gradient scratch */
    uint32_t stage, stages, first, last;
    int split_head;        /* zb-h1's weight pass takes the head's wte gradient too (model.h) */
    eng_model_part_t part; /* the blocks held: one chunk, or the interleaved schedule's v */
    eng_pipeline_t pipe;
    eng_acts_t **acts;
    float *grad;
    uint64_t step_now;  /* the batch the pass reads: a step's (train.skip_steps), an eval's */
    uint64_t nan_batch; /* fault drill: 1 + the batch whose step's loss reads NaN; 0: none */
    double loss_sum, grad_scale;
    int ckpt_asked; /* this rank heard a checkpoint request (eng_trainer_request_checkpoint) */
    int ckpt_now;   /* some rank had, by the last step's closing all-reduce */
    uint64_t data_ns, pass_ns, pass_comm_ns; /* this step: data loading, passes, comm inside */
    /* the step timers on host clocks, for a backend without timer_* (the CPU): the open
     * interval's start and the closed ones' sum, per ENG_TIMER_* kind */
    uint64_t timer_at[ENG_TIMER_KINDS], timer_ns[ENG_TIMER_KINDS];
};

/* The stores of the table's owned ranges (model.h): the slab with the optimizer's state in
 * its layout, and ZeRO-3's shards. */
void eng_trainer_stores(const eng_trainer_t *t, eng_store_t st[ENG_NSTORES]);
/* v[0..n) (host memory, n <= SMALL_FLOATS) reduced with op over each group of order[0..k)
 * in turn (NULL ones skipped), through t->small. */
int eng_trainer_reduce_small(eng_trainer_t *t, float *v, size_t n, wrk_coll_redop_t op,
                             wrk_coll_group_t *const *order, int k);

/* The collectives' context of t's groups (NULL: a world of one). */
wrk_coll_t *eng_trainer_coll(const eng_trainer_t *t);

// the step's reads (trainer_read.c)

/* rb and rb_host (after the model and the stage are set). 0 or -ENOMEM. fini: once. */
int eng_trainer_rb_init(eng_trainer_t *t);
void eng_trainer_rb_fini(eng_trainer_t *t);
/* Before a batch's passes: its loss sum is zero. */
int eng_trainer_loss_begin(eng_trainer_t *t);
/* The head's forward of one micro-batch on x (t->targets, [B,T]), its loss added to the
 * batch's sum: on the device (loss_acc, no wait), else copied back now. */
int eng_trainer_loss_add(eng_trainer_t *t, eng_acts_t *a, const float *x, uint32_t B, uint32_t T);
/* The sums of squares of the gradients this rank counts towards the global norm (the
 * table's `counted`: each element of the model once over the world), one per run of owned
 * ranges that follow each other in a store (one backend call each; a world of one: the
 * whole slab at once, as eng_grad_clip): enqueued into rb (sumsq_to), else read at once. */
void eng_trainer_sumsq_start(eng_trainer_t *t);
/* The one download (a wait for the stream): the losses, and the sums when sums != 0, into
 * rb_host, after the collectives have settled. 0 or an error. */
int eng_trainer_readback(eng_trainer_t *t, int sums);
/* After readback(t, 1): the sum of the runs' sums of squares (per store, then over them). */
double eng_trainer_sumsq(const eng_trainer_t *t);
/* After readback: the batch's sum over its micro-batches of their mean token loss (last
 * stage; 0 elsewhere). */
double eng_trainer_loss_sum(const eng_trainer_t *t);

#endif
