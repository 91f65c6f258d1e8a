/* The training driver for one rank, independent of the daemons so tests can run it:
 * model + data + AdamW + schedule + checkpoints (DESIGN §5, §7, §8).
 *
 * Step s: for each micro-batch, forward and backward with grad_scale = 1 / (tokens in the
 * global batch); the gradients made whole; the global gradient norm clipped to 1; AdamW at
 * lr(s). The loss reported for step s is the mean over the global batch, computed before
 * the update.
 *
 * Any layout tp x pp x dp runs the same way. The rank's process groups (groups.h) come in
 * built, once, from the layout; rank r = tp + TP * (dp + DP * pp).
 *   Pipeline (pp): stage coord.pp holds its blocks (ch_layout_stage_blocks), the embedding
 *     on stage 0 and ln_f + the tied LM head on the last, and runs the 1F1B schedule over
 *     parallel.microbatches (pipeline.h); a world without pipeline parallelism is one stage
 *     that is both first and last. The tied wte gradient is summed over the embedding
 *     group (first and last stage).
 *   Tensor (tp): each rank holds its TP slice of its stage (model.h, Megatron-LM); all TP
 *     ranks of a DP slice read the same data.
 *   Data (dp): DP rank coord.dp reads its share of the global batch. With dp > 1 every
 *     tensor is ZeRO-3 sharded over the DP group (zero.h, parallel.reshard): the blocks
 *     gathered before use and their gradients reduce-scattered after it; wte, wpe and
 *     ln_f gathered after each update and their gradients reduce-scattered once a step
 *     (after the tied wte's sum); AdamW on the shards. (A benchmark may ask for
 *     replicated data parallelism instead: opts.replicate_dp.)
 * The global gradient norm sums each element of the model once over the world (replicas
 * counted once), so every layout clips the same gradient. Same seed and global batch:
 * every layout trains the same model within float tolerance; the same layout twice, or
 * with a resume in between, bit for bit.
 *
 * Checkpoints: each rank writes one file with the pieces it holds (ckpt.h; replicas
 * written once); rank 0 commits the step once every rank's file is there. A resume reads
 * the pieces back whatever layout wrote them, so a job resumes into another layout (dp 4
 * -> 2, tp 2 -> 1) by resharding at load. */
#ifndef ENG_TRAINER_H
#define ENG_TRAINER_H

#include <stddef.h>
#include <stdint.h>

#include "common/jobspec.h"
#include "workerd/coll/coll.h"
#include "workerd/engine/backend_bf16.h"
#include "workerd/engine/data.h"
#include "workerd/engine/groups.h"
#include "workerd/engine/mem.h"
#include "workerd/engine/model.h"
#include "workerd/engine/optim.h"

typedef struct eng_trainer_opts {
    const char *job_id; /* checkpoint directory name under checkpoint.dir; NULL: job name */
    double peak_flops;  /* FLOP/s that MFU is relative to; 0: measure an SGEMM briefly */
    /* this rank's groups under the job's layout, borrowed for the trainer's life; NULL: a
     * world of one rank */
    const eng_groups_t *groups;
    /* dp > 1: replicate the model and Adam state on every DP rank and all-reduce the
     * gradients (plain data parallelism), instead of ZeRO-3. The baseline benchmarks
     * compare ZeRO-3 against; not a job option. */
    int replicate_dp;
    /* kernels and memory of the model, its optimizer state, ZeRO-3's shards and the
     * schedule's buffers (backend.h), borrowed for the trainer's life; NULL: the CPU
     * backend. With a backend whose memory is not the host's (CUDA) the groups' collectives
     * must read that memory (NCCL); checkpoints, init_from and the step's loss and norm go
     * through host copies, so files are the same whatever the backend. parallel.tp > 1
     * needs host memory (CH_E_CONFIG otherwise). */
    const eng_backend_t *backend;
    /* train.precision = bf16 without its packed storage: no working copy of the parameters
     * (each kernel rounds its parameter operands from the masters as it reads them) and
     * every activation in an fp32 slot. The same bits (tests compare the two); not a job
     * option. */
    int bf16_unpacked;
} eng_trainer_opts_t;

typedef struct eng_step_info {
    uint64_t step;        /* the step just run (0-based) */
    double loss;          /* mean over the global batch, before the update */
    double lr, grad_norm; /* norm before clipping */
    double seconds, tokens_per_s, mfu;
    double bubble; /* pp > 1: time.pp_wait over the step time; else 0 */
    /* the validation loss after this step's update when an evaluation was due
     * (eng_trainer_eval_due), else NAN; its time is not in `seconds` */
    double val_loss;
    int skipped; /* loss or norm not finite, fault.nonfinite = skip: no update was made */
    /* Where this rank's step went, in seconds; the parts sum to `seconds`. compute: the
     * model's kernels; tp: tensor-parallel all-reduces; pp_wait: blocked on pipeline
     * send/recv and in the step's closing all-reduces over the pipeline column and the
     * embedding group (they wait for the other stages' flush); zero: ZeRO-3 gathers and
     * reduce-scatters and the data-parallel gradient reduction; optim: clipping and AdamW; idle:
     * the rest (data, bookkeeping). The communication parts are the host's waits plus the
     * groups' device time where the collectives time them on their streams (NCCL); as those
     * overlap the compute, they are scaled to fit the step less optim, and compute into the
     * rest. */
    struct {
        double compute, tp, pp_wait, zero, optim, idle;
    } time;
    /* pp > 1: this stage's pass times per micro-batch, in seconds (the step's forwards,
     * backwards and zb-h1 weight passes over m; interleaved: all chunks'), the T_F, T_B,
     * T_W the bubble's formulas are written in; host time (on a device: launch time) */
    struct {
        double fwd, bwd, weight;
    } pass;
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
/* The same from any committed step dir (train.resume = PATH: another run's folder),
 * whatever layout wrote it; the next step run is the one stored there. */
int eng_trainer_resume_dir(eng_trainer_t *t, const char *step_dir, char *err, size_t errlen);
/* Ask for a checkpoint after the next step (chorusctl checkpoint, SIGUSR1): any rank's
 * request travels in the step's closing all-reduce, so every rank of the job commits
 * the same step whichever of them heard it first. */
void eng_trainer_request_checkpoint(eng_trainer_t *t);
/* Fault drill: the step that reads data batch `batch` gets a NaN loss and gradient norm
 * (every rank of the job must be told the same; chorus-rank reads it from
 * CHORUS_DRILL_NONFINITE_BATCH), so that fault.nonfinite can be tested end to end. */
void eng_trainer_drill_nonfinite(eng_trainer_t *t, uint64_t batch);

/* Run the next step; 0, or a negative code. Past the last step: CH_E_STATE. */
int eng_trainer_step(eng_trainer_t *t, eng_step_info_t *info);
/* The mean loss of the current model over train.val_data's first eval_tokens tokens (whole
 * global batches, read in order): the same tokens and, within float tolerance, the same
 * value on every layout. Collective over the job's groups, like a step; gradients and
 * optimizer state untouched. CH_E_CONFIG without val_data. */
int eng_trainer_evaluate(eng_trainer_t *t, double *val_loss);
/* Whether an evaluation is due after the steps run so far: every train.eval_every steps
 * and after the last step (when val_data is set). eng_trainer_step runs it. */
int eng_trainer_eval_due(const eng_trainer_t *t);
/* (eng_trainer_step) A step whose global loss or gradient norm is NaN or infinite makes
 * no update: with fault.nonfinite = fail it returns CH_E_NUMERIC with info's step, loss
 * and grad_norm set (the step is not counted done); with skip its gradients are dropped,
 * the step counts as done and info->skipped is set. Every rank holds the same reduced
 * loss and norm, so all of them take the same branch. */
/* Whether a checkpoint is due after the steps run so far: every checkpoint.every steps,
 * after the last step, and after a step some rank asked for one (when checkpoint.dir is
 * set). */
int eng_trainer_checkpoint_due(const eng_trainer_t *t);
/* Write this rank's shard for the current step and commit the step (manifest.json,
 * written by DP rank 0 once every rank's shard is there; collective over the DP group),
 * then prune to checkpoint.keep. */
int eng_trainer_checkpoint(eng_trainer_t *t, uint64_t *bytes, uint64_t *checksum, char *err,
                           size_t errlen);
/* A step of this rank alone, not collective: every piece it holds (replicated ones too, so
 * the shard restores this rank by itself) as a one-shard committed step under
 * dir/<job>/step-<next_step>/ (its manifest names this shard only), then prune dir/<job> to
 * the newest `keep` steps. The in-memory peer checkpoints (workerd/rank/memckpt.h). */
int eng_trainer_save_own(eng_trainer_t *t, const char *dir, int64_t keep, char *err, size_t errlen);

uint64_t eng_trainer_next_step(const eng_trainer_t *t);
uint64_t eng_trainer_total_steps(const eng_trainer_t *t);
const char *eng_trainer_job(const eng_trainer_t *t);
double eng_trainer_peak_flops(const eng_trainer_t *t);
/* The model object: this rank's part (its stage, its TP slice; under ZeRO-3 the blocks'
 * parameters are not in it, see eng_trainer_holds_whole_model). */
eng_model_t *eng_trainer_model(eng_trainer_t *t);
/* Whether eng_trainer_model holds the whole model with its parameters in its slab: no
 * tensor or pipeline parallelism and no ZeRO-3 shards. */
int eng_trainer_holds_whole_model(const eng_trainer_t *t);

/* What this rank holds, in bytes, as allocated: state = parameters, gradients, Adam m and
 * v (the slab, or under ZeRO-3 the owned shards); gathered = ZeRO-3's gathered blocks, the
 * unsharded gradient of the block in its backward, and the slab: wte, wpe and ln_f
 * gathered, with their unsharded gradients.
 * Activations are not counted. */
typedef struct eng_trainer_memory {
    size_t state_bytes, gathered_bytes;
} eng_trainer_memory_t;
void eng_trainer_memory(const eng_trainer_t *t, eng_trainer_memory_t *mem);
/* What this rank's engine holds in backend memory, measured (mem.h): every allocation of
 * the model, its activations, the optimizer, ZeRO-3 and the schedule, by kind, now and at
 * its high-water mark during the last step run (eng_mem_stats_t's peaks; total_max: since
 * the trainer was created). Not counted: the collectives' own buffers, the peak-FLOPs
 * probe. */
void eng_trainer_mem(const eng_trainer_t *t, eng_mem_stats_t *out);
/* train.precision = bf16: the parameter elements its kernels read rounded from the masters
 * and from the working copy since it was created (backend_bf16.h); zeros otherwise. */
void eng_trainer_bf16_counts(const eng_trainer_t *t, eng_bf16_counts_t *out);
eng_optim_t *eng_trainer_optim(eng_trainer_t *t);
const eng_data_t *eng_trainer_data(const eng_trainer_t *t);

/* FLOP/s of an SGEMM of size n on this thread configuration, measured for about
 * `seconds`. */
double eng_measure_peak_flops(int n, double seconds);
/* The same through backend be's matmul_fwd on its memory, synchronised (a GPU's fp32 or
 * TF32 cuBLAS GEMM, as the backend is set); be NULL or of host memory: the CPU's. 0 when
 * the backend cannot allocate the matrices. */
double eng_measure_peak_flops_on(const eng_backend_t *be, int n, double seconds);

#endif
