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
    uint32_t tpr, dpr, rank;
    /* this rank's stage: blocks [first, last); the schedule, one acts per slot (which hold
     * the embedding's and the blocks' outputs too) and the [B,T,C] gradient scratch */
    uint32_t stage, stages, first, last;
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

#endif
