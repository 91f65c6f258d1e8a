/* Job files (DESIGN §10): INI with [job] [model] [parallel] [train] [checkpoint]
 * [fault] [diag]. Parsing refuses unknown sections and keys; validation names the
 * field and the reason ("parallel.tp: model.heads 12 is not divisible by tp 5"). The
 * canonical text (ch_jobspec_format) is what travels to the coordinator and workers. */
#ifndef CH_JOBSPEC_H
#define CH_JOBSPEC_H

#include <stddef.h>
#include <stdint.h>

#include "common/device.h"
#include "common/layout.h"

typedef enum { CH_JOB_TRAIN = 0, CH_JOB_DIAG = 1 } ch_job_kind_t;
typedef enum { CH_RESHARD_PER_USE = 0, CH_RESHARD_PER_STEP = 1 } ch_reshard_t;
/* parallel.stage_split: how pipeline stages share the blocks (common/layout.h); auto: the
 * plan picks even or balanced (ch_plan_model_of) */
typedef enum { CH_SPLIT_EVEN = 0, CH_SPLIT_BALANCED = 1, CH_SPLIT_AUTO = 2 } ch_stage_split_t;
/* "even", "balanced", "auto" */
const char *ch_stage_split_name(ch_stage_split_t s);
/* parallel.schedule: the pipeline schedule (workerd/engine/pipeline.h). zb-h1: each
 * backward split into an input-gradient and a weight-gradient pass, the weight passes
 * deferred into the cool-down (Qi et al. 2023). interleaved: Megatron's interleaved 1F1B over
 * virtual_stages chunks per rank (CPU only). */
typedef enum {
    CH_SCHEDULE_1F1B = 0,
    CH_SCHEDULE_INTERLEAVED = 1,
    CH_SCHEDULE_ZBH1 = 2
} ch_schedule_t;
/* "1f1b", "interleaved", "zb-h1" */
const char *ch_schedule_name(ch_schedule_t s);
/* parallel.recompute: activations a block's backward recomputes instead of keeping (none;
 * full: all but the block's input; selective: the attention probabilities) */
typedef enum {
    CH_RECOMPUTE_NONE = 0,
    CH_RECOMPUTE_FULL = 1,
    CH_RECOMPUTE_SELECTIVE = 2
} ch_recompute_t;
/* "none", "full", "selective" */
const char *ch_recompute_name(ch_recompute_t r);
/* train.precision: the GEMMs' arithmetic (fp32 parameters and optimizer state either way).
 * tf32: TF32 tensor cores on a GPU (train.device = cuda only). bf16: mixed precision (issue
 * 23): bf16 working copies of the parameters, bf16 GEMM inputs and activations, fp32
 * accumulation, reductions, gradients and master weights; on a GPU, or on the CPU only as
 * the slow emulation for tests (train.emulate = yes). optim.grad_reduce takes fp32 | bf16. */
typedef enum { CH_PRECISION_FP32 = 0, CH_PRECISION_TF32 = 1, CH_PRECISION_BF16 = 2 } ch_precision_t;
/* fault.nonfinite: what a step whose loss or gradient norm is NaN or infinite does. fail:
 * the job fails naming the step; skip: that step's update is dropped (the batch is
 * consumed), as llm.c's outlier detector does; rewind: the job restarts from its last
 * checkpoint with that step's batch added to train.skip_steps (Megatron's rerun). */
typedef enum {
    CH_NONFINITE_FAIL = 0,
    CH_NONFINITE_SKIP = 1,
    CH_NONFINITE_REWIND = 2
} ch_nonfinite_t;
/* fault.straggler: what a rank named as a straggler does. report: shown and logged;
 * replace: also treated as failed, its node's ranks re-placed on an idle spare node (when
 * none is idle: reported only). */
typedef enum { CH_STRAGGLER_REPORT = 0, CH_STRAGGLER_REPLACE = 1 } ch_straggler_t;

#define CH_PATH_LEN 1024

typedef struct ch_jobspec {
    char name[64];
    ch_job_kind_t kind;
    /* Who submitted the job and whom its ranks run as; -1: unset. The coordinator writes
     * these from the submitter's credentials, whatever the client sent (DESIGN §10). */
    struct {
        int64_t uid, gid;
    } owner, run_as;
    int64_t priority; /* [job] priority: higher starts first; only admins may set it */
    struct {
        uint32_t layers, heads, embd, vocab, seq_len;
    } model;
    struct {
        uint32_t tp, pp, dp, microbatches, micro_batch_size;
        ch_reshard_t reshard;
        ch_stage_split_t stage_split; /* even (default) | balanced (the LM head counted) | auto */
        /* sequences per step; 0: dp x microbatches x micro_batch_size. When set, microbatches
         * is derived from it (ch_jobspec_parse, ch_jobspec_set) */
        uint32_t global_batch_size;
        ch_recompute_t recompute; /* none (default) | selective | full */
        ch_schedule_t schedule;   /* 1f1b (default) | interleaved | zb-h1 */
        uint32_t virtual_stages;  /* model chunks per pipeline rank (interleaved); 1 */
    } parallel;
    struct {
        int64_t steps;
        double lr, lr_min; /* lr_min < 0: lr / 10 */
        int64_t warmup;
        uint64_t seed;
        char data[CH_PATH_LEN];      /* "" or "builtin": the built-in corpus */
        char init_from[CH_PATH_LEN]; /* "" or a GPT-2 safetensors file */
        ch_device_t device;          /* cpu (default) | cuda */
        ch_precision_t precision;    /* fp32 (default) | tf32 | bf16 */
        int emulate; /* bf16 on device = cpu: the CPU emulation of the rounding (tests; slow) */
        char val_data[CH_PATH_LEN]; /* "": no validation loss; forms as data (data.h) */
        int64_t eval_every;         /* steps between validation losses; 0: at the end only */
        int64_t eval_tokens;        /* tokens of val_data each evaluation reads */
        /* "" (a fresh run), "auto" (the newest committed step of this run, if any) or
         * PATH (a committed step dir, or a run folder's newest step): common/run.h */
        char resume[CH_PATH_LEN];
        int64_t log_every;    /* rank 0 logs a loss line every log_every steps; 0: never */
        char skip_steps[512]; /* batches no step reads (common/skipsteps.h); "": none */
    } train;
    /* AdamW and clipping (torch.optim.AdamW, clip_grad_norm_); grad_clip 0: no clipping */
    struct {
        double weight_decay, beta1, beta2, eps, grad_clip;
        /* the data-parallel gradient reduction's type: fp32 (default) | bf16 (rounded to
         * bf16 before and after it; train.precision = bf16 only) */
        ch_precision_t grad_reduce;
    } optim;
    struct {
        char dir[CH_PATH_LEN]; /* "" : no checkpoints */
        int64_t every, keep;
        int64_t memory_every; /* in-memory peer checkpoints every N steps; 0: off */
        char run_id[40];      /* stamped by the coordinator at submit (common/run.h) */
    } checkpoint;
    struct {
        int64_t max_restarts;
        int64_t step_timeout_s;
        int elastic; /* a restart that no longer fits resumes with a smaller dp */
        /* Restarts back off: none before the first of a run of failures, then backoff
         * seconds doubling up to backoff_max; the run ends when a generation completes a
         * step. crash_loop: that many generations in a row failing before their first
         * step stop the job (0: never). */
        double backoff, backoff_max;
        int64_t crash_loop;
        ch_nonfinite_t nonfinite;
        ch_straggler_t straggler;
    } fault;
    struct {
        int64_t rounds, gemm_size;
        int collectives;
        int64_t bytes;
    } diag;
} ch_jobspec_t;

/* Memory a rank may need (common/plan.h's estimate) before a model is refused. */
#define CH_JOBSPEC_RANK_BYTES_MAX (1024.0 * 1073741824.0) /* 1 TiB */

void ch_jobspec_defaults(ch_jobspec_t *j);
/* A job file's raw bytes before parsing: refuses a NUL byte, binary bytes (controls other
 * than tab, CR, LF) and text with no [section] (an empty file), naming the offset. */
int ch_jobspec_check_text(const char *text, size_t len, char *err, size_t errlen);
/* Parse text over the defaults. CH_E_CONFIG with "line N: [section] key: reason". */
int ch_jobspec_parse(const char *text, ch_jobspec_t *j, char *err, size_t errlen);
/* Apply one "section.key=value" override (chorusctl submit --set). */
int ch_jobspec_set(ch_jobspec_t *j, const char *assignment, char *err, size_t errlen);
/* Check values and their relations, and that the model fits a rank
 * (CH_JOBSPEC_RANK_BYTES_MAX, train jobs). check_files: also that train.data / init_from
 * exist and are readable. CH_E_CONFIG with "section.key: reason". */
int ch_jobspec_validate(const ch_jobspec_t *j, int check_files, char *err, size_t errlen);
/* Canonical INI text; malloc'd, caller frees. */
int ch_jobspec_format(const ch_jobspec_t *j, char **out);
/* Every key with its default, unit, range and meaning, from the parser's own table: as a
 * job file whose comments document each key (markdown 0: it parses to the defaults), or
 * as the Markdown reference docs/jobfile.md (markdown 1). malloc'd, caller frees. */
int ch_jobspec_template(int markdown, char **out);

static inline ch_layout_t ch_jobspec_layout(const ch_jobspec_t *j)
{
    ch_layout_t l = {j->parallel.tp, j->parallel.pp, j->parallel.dp};
    return l;
}
static inline ch_layout_split_t ch_jobspec_split(const ch_jobspec_t *j)
{
    ch_layout_split_t l = {j->parallel.tp, j->parallel.pp, j->parallel.dp, j->parallel.microbatches,
                           j->parallel.micro_batch_size};
    return l;
}
const char *ch_job_kind_name(ch_job_kind_t k);
const char *ch_precision_name(ch_precision_t p); /* "fp32" | "tf32" | "bf16" */
const char *ch_nonfinite_name(ch_nonfinite_t p); /* "fail" | "skip" | "rewind" */
const char *ch_straggler_name(ch_straggler_t p); /* "report" | "replace" */
/* The cosine schedule's floor: train.lr_min, or lr / 10 when lr_min is negative. */
double ch_jobspec_lr_min(const ch_jobspec_t *j);

#endif
