/* The training driver for one rank, independent of the daemons so tests can run it:
 * model + data + AdamW + schedule + checkpoints (DESIGN §7, §8).
 *
 * Step s: zero the gradients; for each micro-batch, forward and backward with
 * grad_scale = 1 / (tokens in the global batch); clip the global gradient norm to 1;
 * AdamW at lr(s). The loss reported for step s is the mean over the global batch,
 * computed before the update.
 *
 * The rank's process groups (groups.h) come in built, once, from the layout. Data parallel
 * (dp > 1, tp = pp = 1): each rank runs its share of the global batch (data position
 * coord.dp), the gradients are summed over the DP group (they already carry the global
 * scale) and every rank applies the same update, so all hold the same parameters.
 * Pipeline parallel (pp > 1): stage coord.pp runs its blocks (ch_layout_stage_blocks), the
 * embedding on stage 0 and ln_f + the tied LM head on the last, in the 1F1B schedule over
 * parallel.microbatches (pipeline.h); stage 0 and the last stage read the same micro-batches
 * as one rank; the tied wte gradient is summed over the embedding group, the gradient norm
 * over the pipeline column, and the loss (computed on the last stage) reaches every rank.
 * dp > 1 composes with it (replicated gradients summed over each stage's DP group). The
 * model object still holds every block (not minimal memory until the stage-only model).
 * Tensor parallelism (tp > 1, groups->tp, pp = 1): each rank holds its TP slice of the
 * model (model.h), all TP ranks of a DP slice read the same data, and clipping counts
 * replicated tensors once (eng_tp_grad_clip). tp and pp both above 1 are refused with
 * CH_E_CONFIG (not combined yet), and so is checkpointing a tp > 1 job (slices are not
 * written yet). Checkpoints: each rank writes its shard (its metadata's world is
 * tp * pp * dp), rank 0 commits them all. */
#ifndef ENG_TRAINER_H
#define ENG_TRAINER_H

#include <stddef.h>
#include <stdint.h>

#include "common/jobspec.h"
#include "workerd/coll/coll.h"
#include "workerd/engine/data.h"
#include "workerd/engine/groups.h"
#include "workerd/engine/model.h"
#include "workerd/engine/optim.h"

typedef struct eng_trainer_opts {
    const char *job_id; /* checkpoint directory name under checkpoint.dir; NULL: job name */
    double peak_flops;  /* FLOP/s that MFU is relative to; 0: measure an SGEMM briefly */
    /* this rank's groups under the job's layout, borrowed for the trainer's life; NULL: a
     * world of one rank */
    const eng_groups_t *groups;
    /* kernels and memory of the model and its optimizer state (backend.h), borrowed for the
     * trainer's life; NULL: the CPU backend. Checkpoints go through host copies. */
    const eng_backend_t *backend;
} eng_trainer_opts_t;

typedef struct eng_step_info {
    uint64_t step;        /* the step just run (0-based) */
    double loss;          /* mean over the global batch, before the update */
    double lr, grad_norm; /* norm before clipping */
    double seconds, tokens_per_s, mfu;
    double bubble; /* pp > 1: time blocked on pipeline send/recv over the step time; else 0 */
    /* Where this rank's step went, in seconds; the parts sum to `seconds`. compute: the
     * model's kernels; tp: tensor-parallel all-reduces; pp_wait: blocked on pipeline
     * send/recv; zero: ZeRO-3 gathers and reduce-scatters and the data-parallel gradient
     * reduction; optim: clipping and AdamW; idle: the rest (data, bookkeeping). */
    struct {
        double compute, tp, pp_wait, zero, optim, idle;
    } time;
} eng_step_info_t;

typedef struct eng_trainer eng_trainer_t;

/* Build model (initialised from spec->train.seed), data and optimizer. Does not load
 * init_from or resume: call those next. spec is copied. */
int eng_trainer_create(const ch_jobspec_t *spec, const eng_trainer_opts_t *opts,
                       eng_trainer_t **out, char *err, size_t errlen);
void eng_trainer_destroy(eng_trainer_t *t);

/* Load the weights of a Hugging Face GPT-2 safetensors file (names with or without a
 * "transformer." prefix; F32, F16 or BF16; extra tensors such as attn.bias or
 * lm_head.weight are ignored). Every model tensor must be present with its shape. */
int eng_trainer_init_from(eng_trainer_t *t, const char *path, char *err, size_t errlen);
/* Restore the committed checkpoint of `step` from checkpoint.dir/<job>/; the next
 * step run is `step`. */
int eng_trainer_resume(eng_trainer_t *t, uint64_t step, char *err, size_t errlen);

/* Run the next step; 0, or a negative code. Past the last step: CH_E_STATE. */
int eng_trainer_step(eng_trainer_t *t, eng_step_info_t *info);
/* Whether a checkpoint is due after the steps run so far: every checkpoint.every steps
 * and after the last step (when checkpoint.dir is set). */
int eng_trainer_checkpoint_due(const eng_trainer_t *t);
/* Write this rank's shard for the current step and commit the step (manifest.json,
 * written by DP rank 0 once every rank's shard is there; collective over the DP group),
 * then prune to checkpoint.keep. */
int eng_trainer_checkpoint(eng_trainer_t *t, uint64_t *bytes, uint64_t *checksum, char *err,
                           size_t errlen);

uint64_t eng_trainer_next_step(const eng_trainer_t *t);
uint64_t eng_trainer_total_steps(const eng_trainer_t *t);
const char *eng_trainer_job(const eng_trainer_t *t);
double eng_trainer_peak_flops(const eng_trainer_t *t);
eng_model_t *eng_trainer_model(eng_trainer_t *t);
eng_optim_t *eng_trainer_optim(eng_trainer_t *t);
const eng_data_t *eng_trainer_data(const eng_trainer_t *t);

/* FLOP/s of an SGEMM of size n on this thread configuration, measured for about
 * `seconds`. */
double eng_measure_peak_flops(int n, double seconds);

#endif
