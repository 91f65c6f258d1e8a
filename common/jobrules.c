/* The rules of a job file that relate two or more fields (heads % tp, warmup <= steps, a
 * schedule's conditions, precision and device, ...), after each field was checked alone
 * against its row of jobspec.c's table. */
#include "common/jobrules.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/err.h"
#include "common/jobcheck.h"

#define WORLD_MAX (1u << 20)
/* Seconds: the longest pause fault.backoff may put between two restarts. */
#define BACKOFF_MAX 3600

static int valid_name(const char *s)
{
    size_t n = strlen(s);
    if (n < 1 || n > 63)
        return 0;
    for (; *s; s++) {
        char c = *s;
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-'))
            return 0;
    }
    return 1;
}

static int validate_batch_and_eval(const ch_jobspec_t *j, char *err, size_t errlen)
{
    uint64_t g = (uint64_t)j->parallel.dp * j->parallel.microbatches * j->parallel.micro_batch_size;
    if (j->parallel.global_batch_size != 0 && g != j->parallel.global_batch_size)
        return ch_errf(err, errlen, CH_E_CONFIG,
                       "parallel.global_batch_size: %" PRIu32 " sequences, but dp %" PRIu32
                       " x microbatches %" PRIu32 " x micro_batch_size %" PRIu32 " = %" PRIu64
                       " (leave microbatches out: it is derived)",
                       j->parallel.global_batch_size, j->parallel.dp, j->parallel.microbatches,
                       j->parallel.micro_batch_size, g);
    if (j->train.eval_every > 0 && j->train.val_data[0] == '\0')
        return ch_errf(err, errlen, CH_E_CONFIG,
                       "train.eval_every: %" PRId64 " needs train.val_data (what to evaluate on)",
                       j->train.eval_every);
    if (j->train.val_data[0] && strcmp(j->train.val_data, "builtin") == 0)
        return ch_errf(err, errlen, CH_E_CONFIG,
                       "train.val_data: builtin is not a validation set; name a file");
    return 0;
}

static int validate_optim(const ch_jobspec_t *j, char *err, size_t errlen)
{
    const struct {
        const char *key;
        double v, lo, hi;
        int lo_open, hi_open;
    } r[] = {
        {"weight_decay", j->optim.weight_decay, 0, 1e9, 0, 0},
        {"beta1", j->optim.beta1, 0, 1, 0, 1},
        {"beta2", j->optim.beta2, 0, 1, 0, 1},
        {"eps", j->optim.eps, 0, 1, 1, 0},
        {"grad_clip", j->optim.grad_clip, 0, 1e9, 0, 0},
    };
    for (size_t i = 0; i < sizeof r / sizeof r[0]; i++) {
        double v = r[i].v;
        int ok = isfinite(v) && (r[i].lo_open ? v > r[i].lo : v >= r[i].lo) &&
                 (r[i].hi_open ? v < r[i].hi : v <= r[i].hi);
        if (!ok)
            return ch_errf(err, errlen, CH_E_CONFIG, "optim.%s: must be %s %g and %s %g, got %g",
                           r[i].key, r[i].lo_open ? ">" : ">=", r[i].lo,
                           r[i].hi_open ? "<" : "<=", r[i].hi, v);
    }
    return 0;
}

/* parallel.schedule and virtual_stages: Megatron's rules for the interleaved schedule
 * (each rank holds virtual_stages chunks of layers / (pp x virtual_stages) blocks; the
 * micro-batches go round the ranks in groups of pp); ZB-H1's weight passes read the
 * layer inputs the forward kept, which full recomputation does not keep (selective drops
 * only the attention probabilities, which no weight pass reads). */
static int validate_schedule(const ch_jobspec_t *j, char *err, size_t errlen)
{
    const uint32_t pp = j->parallel.pp, v = j->parallel.virtual_stages;
    const char *name = ch_schedule_name(j->parallel.schedule);
    if (v > 1 && j->parallel.schedule != CH_SCHEDULE_INTERLEAVED) {
        snprintf(err, errlen,
                 "parallel.virtual_stages: %" PRIu32 " chunks per rank need parallel.schedule = "
                 "interleaved, not %s",
                 v, name);
        return CH_E_CONFIG;
    }
    if (j->parallel.schedule == CH_SCHEDULE_ZBH1 && j->parallel.recompute == CH_RECOMPUTE_FULL) {
        snprintf(err, errlen,
                 "parallel.recompute: full cannot combine with parallel.schedule = zb-h1 (a "
                 "block's weight pass reads its layer inputs, which full recomputation makes "
                 "again in one shared set the next block's input pass overwrites; keeping them "
                 "until the weight pass would keep most of what full saves); use selective or "
                 "none");
        return CH_E_CONFIG;
    }
    /* interleaved runs on NCCL too: its transfers go in the step's one global order
     * (common/pipe_il.h), so no two ring neighbours wait on each other's send */
    if (j->parallel.schedule != CH_SCHEDULE_INTERLEAVED)
        return 0;
    if (pp < 2 || v < 2) {
        snprintf(err, errlen,
                 "parallel.virtual_stages: interleaved needs pp >= 2 and virtual_stages >= 2, "
                 "got pp %" PRIu32 ", virtual_stages %" PRIu32,
                 pp, v);
        return CH_E_CONFIG;
    }
    if (j->parallel.microbatches % pp != 0) {
        snprintf(err, errlen,
                 "parallel.microbatches: %" PRIu32 " is not a multiple of pp %" PRIu32
                 " (the interleaved schedule)",
                 j->parallel.microbatches, pp);
        return CH_E_CONFIG;
    }
    if (j->model.layers % ((uint64_t)pp * v) != 0) {
        snprintf(err, errlen,
                 "parallel.virtual_stages: model.layers %" PRIu32
                 " is not divisible by pp x virtual_stages = %" PRIu64,
                 j->model.layers, (uint64_t)pp * v);
        return CH_E_CONFIG;
    }
    return 0;
}

/* train.precision, train.emulate and optim.grad_reduce together: bf16 computes on
 * a GPU; the CPU emulates its rounding only when a test asks for it by name. */
static int validate_precision(const ch_jobspec_t *j, char *err, size_t errlen)
{
    int cuda = j->train.device == CH_DEVICE_CUDA;
    if (j->train.precision == CH_PRECISION_TF32 && !cuda) {
        snprintf(err, errlen,
                 "train.precision: tf32 is a GPU's tensor-core arithmetic; set train.device = "
                 "cuda or precision = fp32");
        return CH_E_CONFIG;
    }
    if (j->train.precision == CH_PRECISION_BF16 && !cuda && !j->train.emulate) {
        snprintf(err, errlen,
                 "train.precision: bf16 computes on a GPU; set train.device = cuda, precision = "
                 "fp32, or (tests only, slow) train.emulate = yes for the CPU emulation");
        return CH_E_CONFIG;
    }
    if (j->train.emulate && (cuda || j->train.precision != CH_PRECISION_BF16)) {
        snprintf(err, errlen,
                 "train.emulate: emulates bf16 on the CPU; it needs precision = bf16 and "
                 "device = cpu");
        return CH_E_CONFIG;
    }
    if (j->optim.grad_reduce == CH_PRECISION_BF16 && j->train.precision != CH_PRECISION_BF16) {
        snprintf(err, errlen, "optim.grad_reduce: bf16 reductions need train.precision = bf16");
        return CH_E_CONFIG;
    }
    return 0;
}

/* Rules that relate fields, or that the table cannot express. */
int ch_jobrules_check(const ch_jobspec_t *j, char *err, size_t errlen)
{
    const double lr = j->train.lr, lr_min = j->train.lr_min;
    if (!valid_name(j->name)) {
        snprintf(err, errlen, "job.name: must be 1 to 63 characters of A-Z a-z 0-9 . _ -, got '%s'",
                 j->name);
        return CH_E_CONFIG;
    }
    if (j->model.embd % j->model.heads != 0) {
        snprintf(err, errlen, "model.embd: %" PRIu32 " is not divisible by model.heads %" PRIu32,
                 j->model.embd, j->model.heads);
        return CH_E_CONFIG;
    }
    if (j->model.heads % j->parallel.tp != 0) {
        snprintf(err, errlen,
                 "parallel.tp: model.heads %" PRIu32 " is not divisible by tp %" PRIu32,
                 j->model.heads, j->parallel.tp);
        return CH_E_CONFIG;
    }
    if (j->model.layers < j->parallel.pp) {
        snprintf(err, errlen,
                 "parallel.pp: model.layers %" PRIu32 " is less than pp %" PRIu32
                 " (every stage needs a block)",
                 j->model.layers, j->parallel.pp);
        return CH_E_CONFIG;
    }
    if ((double)j->parallel.tp * j->parallel.pp * j->parallel.dp > WORLD_MAX) {
        snprintf(err, errlen, "parallel.dp: world size tp x pp x dp is over %u ranks", WORLD_MAX);
        return CH_E_CONFIG;
    }
    int prc = validate_precision(j, err, errlen);
    if (prc < 0)
        return prc;
    if (!(lr > 0) || !isfinite(lr)) {
        snprintf(err, errlen, "train.lr: must be > 0, got %g", lr);
        return CH_E_CONFIG;
    }
    if (lr_min != -1 && !(lr_min >= 0 && lr_min <= lr)) {
        snprintf(err, errlen,
                 "train.lr_min: must be -1 (lr / 10) or between 0 and train.lr %g, got %g", lr,
                 lr_min);
        return CH_E_CONFIG;
    }
    if (j->train.warmup > j->train.steps) {
        snprintf(err, errlen,
                 "train.warmup: must be between 0 and train.steps %" PRId64 ", got %" PRId64,
                 j->train.steps, j->train.warmup);
        return CH_E_CONFIG;
    }
    if (!(j->fault.backoff >= 0 && j->fault.backoff <= BACKOFF_MAX)) {
        snprintf(err, errlen, "fault.backoff: must be between 0 and %d seconds, got %g",
                 BACKOFF_MAX, j->fault.backoff);
        return CH_E_CONFIG;
    }
    if (!(j->fault.backoff_max >= j->fault.backoff && j->fault.backoff_max <= BACKOFF_MAX)) {
        snprintf(err, errlen,
                 "fault.backoff_max: must be between fault.backoff %g and %d seconds, got %g",
                 j->fault.backoff, BACKOFF_MAX, j->fault.backoff_max);
        return CH_E_CONFIG;
    }
    int rc = validate_batch_and_eval(j, err, errlen);
    if (rc == 0)
        rc = validate_optim(j, err, errlen);
    if (rc == 0)
        rc = validate_schedule(j, err, errlen);
    if (rc < 0)
        return rc;
    if (strcmp(j->name, ".") == 0 || strcmp(j->name, "..") == 0) {
        snprintf(err, errlen, "job.name: '%s' cannot name a checkpoint folder", j->name);
        return CH_E_CONFIG;
    }
    if (strcmp(j->train.resume, "auto") == 0 && j->checkpoint.dir[0] == '\0') {
        snprintf(err, errlen,
                 "train.resume: auto continues this run's checkpoints: set "
                 "checkpoint.dir");
        return CH_E_CONFIG;
    }
    if (j->checkpoint.every > 0 && j->checkpoint.dir[0] == '\0') {
        snprintf(err, errlen, "checkpoint.dir: required when checkpoint.every is %" PRId64,
                 j->checkpoint.every);
        return CH_E_CONFIG;
    }
    return ch_jobcheck_memory(j, err, errlen);
}
