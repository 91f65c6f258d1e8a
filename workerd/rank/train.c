/* The training job kind (rank.h: wrk_train_run): drives a eng_trainer and reports to
 * workerd: RANK_PROGRESS every step (with where the step's time went and the pipeline
 * bubble), RANK_CHECKPOINT after every checkpoint, and on the built-in corpus a few
 * sampled answers and their accuracy: every EVAL_EVERY steps when the rank holds the
 * whole model on the host, at every committed checkpoint for a sliced layout (tp or pp > 1,
 * or dp > 1 with ZeRO-3 shards) or a model on the GPU: that one in a child process while
 * the rank trains on (evalproc.h), its figure reported with the first step after it ended.
 *
 * train.device = cuda: the rank computes on one GPU (wrk_rank_gpu: LOCAL_RANK among the
 * visible ones) through the engine's CUDA backend, handed to the trainer in
 * eng_trainer_opts_t.backend, and its collectives use NCCL on that GPU, waiting for the
 * backend's stream. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/err.h"
#include "common/layout.h"
#include "common/log.h"
#include "common/plan.h"
#include "common/skipsteps.h"
#include "common/util.h"
#include "kernels/matmul.h"
#include "workerd/coll/coll.h"
#include "workerd/engine/ckpt.h"
#include "workerd/engine/corpus.h"
#include "workerd/engine/device.h"
#include "workerd/engine/groups.h"
#include "workerd/engine/trainer.h"
#include "workerd/rank/evalproc.h"
#include "workerd/rank/history.h"
#include "workerd/rank/memckpt.h"
#include "workerd/rank/peak.h"
#include "workerd/rank/rank.h"

#define EVAL_EVERY      50
#define EVAL_FINAL_MS   60000            /* the run's end waits this long for the last figure */
#define COLL_TIMEOUT_MS (10 * 60 * 1000) /* without fault.step_timeout_s */

/* The step's pipeline bubble: time blocked on pipeline send/recv over the step time,
 * from the breakdown when the engine measured it, else the engine's own figure. */
static double step_bubble(const eng_step_info_t *info)
{
    if (info->time.pp_wait > 0 && info->seconds > 0)
        return info->time.pp_wait / info->seconds;
    return info->bubble;
}

static int report_checkpoint(wrk_rank_t *r, uint64_t step, uint64_t bytes, uint64_t checksum)
{
    Chorus__RankEvent ev = CHORUS__RANK_EVENT__INIT;
    ev.kind = CHORUS__RANK_EVENT_KIND__RANK_CHECKPOINT;
    ev.step = step;
    ev.bytes = bytes;
    ev.checksum = checksum;
    return wrk_rank_report(r, &ev);
}

/* The engine's memory as its allocator counted it (eng_trainer_mem): the step's
 * high-water mark, the state held (parameters, gradients, optimizer), the step's peak of
 * activations; bytes. Appended to m at n; returns the new count. */
static size_t mem_metrics(const eng_trainer_t *t, Chorus__Metric *m, size_t n)
{
    eng_mem_stats_t st;
    eng_trainer_mem(t, &st);
    m[n].name = "mem_peak_bytes";
    m[n++].value = (double)st.total_peak;
    m[n].name = "mem_state_bytes";
    m[n++].value = (double)(st.cur[ENG_MEM_PARAMS] + st.cur[ENG_MEM_GRADS] + st.cur[ENG_MEM_OPTIM]);
    m[n].name = "mem_acts_peak_bytes";
    m[n++].value = (double)st.peak[ENG_MEM_ACTS];
    return n;
}

/* What the engine reserved before its first step (on CUDA: GPU memory, all of it: no step
 * allocates), beside the plan's figure for this rank's stage (`chorusctl plan`). */
static void log_memory_at_start(const wrk_rank_t *r, const eng_trainer_t *t)
{
    const ch_jobspec_t *s = &r->spec;
    eng_mem_stats_t ms;
    eng_trainer_mem(t, &ms);
    ch_model_cfg_t m = ch_plan_model_of(s);
    ch_layout_t l = ch_jobspec_layout(s);
    ch_plan_t p;
    double plan = NAN;
    if (ch_plan_stage_rc(&m, l, s->parallel.micro_batch_size, s->parallel.microbatches,
                         s->parallel.reshard, s->parallel.recompute, ch_layout_coord(l, r->rank).pp,
                         &p) == 0)
        plan = p.total_bytes;
    CH_LOGI("train",
            "job=%s rank=%u: %s memory reserved at start %zu bytes, plan %.0f (%+.2f%%) (params "
            "%zu, grads %zu, optim %zu, gathered %zu, acts %zu, scratch %zu)",
            r->job_id, r->rank, s->train.device == CH_DEVICE_CUDA ? "GPU" : "engine", ms.total,
            plan, 100.0 * ((double)ms.total - plan) / plan, ms.cur[ENG_MEM_PARAMS],
            ms.cur[ENG_MEM_GRADS], ms.cur[ENG_MEM_OPTIM], ms.cur[ENG_MEM_GATHERED],
            ms.cur[ENG_MEM_ACTS], ms.cur[ENG_MEM_SCRATCH]);
}

/* RANK_PROGRESS of a step: the figures, the named metrics and where the step's time
 * went (eng_step_info_t.time), with this rank's pipeline bubble. */
static int report_step(wrk_rank_t *r, const eng_step_info_t *info, uint64_t total,
                       Chorus__Metric **metrics, size_t n)
{
    Chorus__RankEvent ev = CHORUS__RANK_EVENT__INIT;
    ev.kind = CHORUS__RANK_EVENT_KIND__RANK_PROGRESS;
    ev.step = info->step + 1;
    ev.total_steps = total;
    ev.loss = info->loss;
    ev.tokens_per_s = info->tokens_per_s;
    ev.mfu = info->mfu;
    ev.n_metrics = n;
    ev.metrics = metrics;
    ev.step_s = info->seconds;
    ev.t_compute = info->time.compute;
    ev.t_tp = info->time.tp;
    ev.t_pp_wait = info->time.pp_wait;
    ev.t_zero = info->time.zero;
    ev.t_optim = info->time.optim;
    ev.t_idle = info->time.idle;
    ev.bubble = step_bubble(info);
    if (r->resume_source) { /* the first report of a resumed generation says from where */
        ev.resume_source = (char *)r->resume_source;
        ev.resumed_step = info->step;
    }
    int rc = wrk_rank_report(r, &ev);
    if (rc == 0)
        r->resume_source = NULL;
    return rc;
}

/* A restart with in-memory checkpoints: the newest step whole in the nodes' memory when it
 * is no older than the coordinator's committed one. *done: 1 when t was restored. A failure
 * after the disk step exists falls back to it (every rank together: memckpt.c agrees). */
static int resume_memory(wrk_rank_t *r, eng_trainer_t *t, wrk_memckpt_t *mem, int *done)
{
    char err[512] = "";
    uint64_t step = 0;
    *done = 0;
    if (!mem || r->generation <= 1) /* generations count from 1: this is no restart */
        return 0;
    int rc = wrk_memckpt_restore(mem, t, r->resume_step, &step, err, sizeof err);
    if (rc < 0 && r->resume_step == 0)
        return wrk_rank_fail(r, rc, "resume from memory: %s", err);
    if (rc < 0) {
        CH_LOGW("train",
                "job=%s gen=%" PRIu64 " rank=%u: resume from memory: %s; reading step %" PRIu64
                " from the disk",
                r->job_id, r->generation, r->rank, err, r->resume_step);
        return 0;
    }
    if (step > 0) {
        r->resume_source = "memory";
        *done = 1;
        CH_LOGI("train",
                "job=%s gen=%" PRIu64 " rank=%u: resumed from step %" PRIu64
                " (memory; disk has %" PRIu64 ")",
                r->job_id, r->generation, r->rank, step, r->resume_step);
    }
    return 0;
}

/* Continue the run: the newest step in memory (resume_memory), the coordinator's committed
 * step (a restart of this job), else train.resume's (ch_run_check resolved it: this run's
 * newest step, or PATH). */
static int resume(wrk_rank_t *r, eng_trainer_t *t, wrk_memckpt_t *mem, const ch_run_resume_t *res)
{
    char err[512] = "";
    int done = 0;
    int rc = resume_memory(r, t, mem, &done);
    if (rc < 0 || done)
        return rc;
    if (r->resume_step > 0)
        rc = eng_trainer_resume(t, r->resume_step, err, sizeof err);
    else if (res->step_dir[0])
        rc = eng_trainer_resume_dir(t, res->step_dir, err, sizeof err);
    else
        return 0;
    if (rc < 0)
        return wrk_rank_fail(r, rc, "resume from %s: %s",
                             r->resume_step > 0 ? "the last committed step" : res->step_dir, err);
    r->resume_source = "disk";
    CH_LOGI("train", "job=%s gen=%" PRIu64 " rank=%u: resumed from step %" PRIu64 " (%s)",
            r->job_id, r->generation, r->rank, eng_trainer_next_step(t),
            r->resume_step > 0 ? "this job's last commit" : res->step_dir);
    return 0;
}

/* Rank 0's loss line every train.log_every steps (and at the last step). */
static void log_step(const wrk_rank_t *r, const eng_step_info_t *info, uint64_t total)
{
    uint64_t done = info->step + 1;
    int64_t every = r->spec.train.log_every;
    if (r->rank != 0 || every <= 0 || (done % (uint64_t)every != 0 && done != total))
        return;
    CH_LOGI("train",
            "job=%s gen=%" PRIu64 " step %" PRIu64 "/%" PRIu64 " loss=%.6f lr=%.3e grad_norm=%.4f "
            "tokens/s=%.0f mfu=%.3f step_ms=%.1f",
            r->job_id, r->generation, done, total, info->loss, info->lr, info->grad_norm,
            info->tokens_per_s, info->mfu, info->seconds * 1e3);
}

/* workerd --threads when given (a local cluster's nodes share one machine), else this
 * rank's share of the node's cores. */
static void set_threads(const wrk_rank_t *r)
{
    if (r->threads > 0) {
        kn_blas_set_threads((int)r->threads);
        return;
    }
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    long per = cores / (long)(r->local_world_size ? r->local_world_size : 1);
    kn_blas_set_threads(per > 0 ? (int)per : 1); /* this rank's share of the node */
}

/* The device this rank computes on (engine/device.h): on train.device = cuda, its GPU
 * (wrk_rank_gpu: LOCAL_RANK among the visible ones) and the CUDA backend on it. */
static int device_setup(wrk_rank_t *r, eng_device_t **out)
{
    const ch_jobspec_t *s = &r->spec;
    eng_device_opts_t o = {.gpu = -1,
                           .tf32 = s->train.precision == CH_PRECISION_TF32,
                           .bf16 = s->train.precision == CH_PRECISION_BF16,
                           .B = (int)s->parallel.micro_batch_size,
                           .T = (int)s->model.seq_len,
                           .C = (int)s->model.embd,
                           .NH = (int)s->model.heads};
    char err[256];
    int rc;
    if (s->train.device == CH_DEVICE_CUDA &&
        (rc = wrk_rank_gpu(r, "train.device", &o.gpu, err, sizeof err)) < 0)
        return wrk_rank_fail(r, rc, "%s", err);
    rc = eng_device_open(s->train.device, &o, out, err, sizeof err);
    if (rc < 0)
        return wrk_rank_fail(r, rc, "train.device: %s: %s", ch_device_name(s->train.device), err);
    if (s->train.device == CH_DEVICE_CUDA)
        CH_LOGI("train", "job=%s gen=%" PRIu64 " rank=%u: computing on GPU %d (local rank %u), %s",
                r->job_id, r->generation, r->rank, o.gpu, r->local_rank,
                ch_precision_name(s->train.precision));
    return 0;
}

/* More than one rank: the collectives context and this rank's groups under the job's
 * layout, over the memory the device computes in (eng_device_coll_config). stage: the
 * host-staged table's storage, which outlives the context. */
static int groups_setup(wrk_rank_t *r, const eng_device_t *dev, wrk_coll_stage_t *stage,
                        wrk_coll_t **c, eng_groups_t **g)
{
    const ch_jobspec_t *s = &r->spec;
    wrk_coll_config_t cfg;
    wrk_coll_config_defaults(&cfg);
    if (eng_device_coll_config(dev, wrk_rank_gpu_shared(r), &cfg, stage))
        CH_LOGI("train", "rank %u: collectives host-staged (ranks share GPU %d)", r->rank,
                eng_device_gpu(dev));
    cfg.rank = r->rank;
    cfg.world_size = r->world_size;
    cfg.rdzv = r->rdzv;
    /* half the step timeout: a wait that long is a hang the collective names exactly (who
     * never arrived), before the coordinator's coarser no-progress check fires */
    cfg.timeout_ms =
        s->fault.step_timeout_s > 0 ? (int)(s->fault.step_timeout_s * 500) : COLL_TIMEOUT_MS;
    uint64_t t0 = ch_now_ns();
    int rc = wrk_coll_create(&cfg, c);
    if (rc < 0)
        return wrk_rank_fail(r, rc, "%s collectives: %s", wrk_coll_backend_name(cfg.backend),
                             ch_strerror(rc));
    uint64_t t1 = ch_now_ns();
    rc = eng_groups_create(*c, ch_jobspec_layout(s), r->rank, g);
    if (rc < 0)
        return wrk_rank_fail(r, rc, "process groups: %s", ch_strerror(rc));
    /* where a restart's comm_setup phase goes (docs/healing.md) */
    CH_LOGI("train", "rank %u: communicators: context %.1f ms, groups %.1f ms", r->rank,
            (double)(t1 - t0) / 1e6, (double)(ch_now_ns() - t1) / 1e6);
    return 0;
}

/* checkpoint.dir must take this job's checkpoints: found now, before the first step,
 * rather than at the first checkpoint after steps that a restart would only redo. */
static int ckpt_dir_check(wrk_rank_t *r)
{
    const ch_jobspec_t *s = &r->spec;
    char dir[CH_PATH_LEN];
    if (!s->checkpoint.dir[0])
        return 0;
    int n = snprintf(dir, sizeof dir, "%s/%s", s->checkpoint.dir, r->job_id);
    if (n < 0 || (size_t)n >= sizeof dir)
        return wrk_rank_fail(r, -ENAMETOOLONG, "checkpoint.dir: path too long");
    int rc = ch_mkdirs(dir, 0755);
    if (rc == 0 && access(dir, W_OK | X_OK) < 0)
        rc = -errno;
    if (rc < 0)
        return wrk_rank_fail(r, rc, "checkpoint.dir: %s: %s", dir, ch_strerror(rc));
    return 0;
}

/* After a collective timeout: the collective it waited in and how many this rank had
 * entered in each of its groups, for the coordinator to find who never arrived. */
static void note_entered(wrk_rank_t *r, const wrk_coll_t *c, const eng_groups_t *gs)
{
    const wrk_coll_group_t *g[4] = {gs->tp, gs->dp, gs->pp, gs->emb};
    const char *names[4] = {"tp", "dp", "pp", "emb"};
    r->timeout_seq = wrk_coll_timeout_seq(c);
    r->n_entered = 0;
    for (int i = 0; i < 4; i++) {
        if (!g[i])
            continue;
        r->entered[r->n_entered].group = names[i];
        r->entered[r->n_entered++].entered = wrk_coll_group_entered(g[i]);
    }
}

/* A phase before the first step ended (RankEvent.phase: 1 communicators, 2 checkpoint
 * loaded): the coordinator times its restarts' phases with them. */
static void report_phase(wrk_rank_t *r, uint32_t phase)
{
    Chorus__RankEvent ev = CHORUS__RANK_EVENT__INIT;
    ev.kind = CHORUS__RANK_EVENT_KIND__RANK_PROGRESS;
    ev.phase = phase;
    wrk_rank_report(r, &ev); /* a lost report costs a figure, not the run */
}

// ----------------------------------------------------------------------------
// the run, in named steps

/* One training run's state, set up by run_setup and torn down by run_fini. */
typedef struct run {
    wrk_rank_t *r;
    eng_device_t *dev;
    wrk_coll_stage_t stage; /* host-staged collectives' table (groups_setup) */
    wrk_coll_t *c;
    eng_groups_t *groups;
    eng_trainer_t *t;
    wrk_memckpt_t *mem; /* checkpoint.memory_every's copies; NULL: off */
    wrk_history_t hist;
    int builtin;          /* rank 0 on the built-in corpus: it reports accuracy */
    int sliced;           /* ... from each committed checkpoint, in a child (evalproc.h) */
    wrk_evalproc_t eval;  /* that child, while it runs */
    eng_step_info_t last; /* the last step's figures: the run's end reports them again */
    uint64_t total;       /* the run's last step */
    uint64_t skipped;     /* steps whose update fault.nonfinite = skip dropped */
    double acc;           /* an accuracy not reported yet, else NAN */
    char err[512];
} run_t;

/* The device, the groups and the trainer, at the step this run starts from. */
static int run_setup(run_t *x)
{
    wrk_rank_t *r = x->r;
    const ch_jobspec_t *s = &r->spec;
    /* checkpoints go to the run's folder, checkpoint.dir/<job.name> (common/run.h) */
    eng_trainer_opts_t opts = {.job_id = s->name, .peak_flops = 0};
    ch_run_resume_t res;
    int rc;

    if ((rc = wrk_history_prepare(r, &res)) < 0)
        return rc;
    set_threads(r);
    if ((rc = device_setup(r, &x->dev)) < 0)
        return rc;
    eng_backend_t *be = eng_device_backend(x->dev);
    opts.backend = be;
    /* MFU against a GPU's GEMM at the job's precision (cuBLAS, about 0.3 s), or the node's
     * (cached) */
    opts.peak_flops =
        be ? eng_measure_peak_flops_on(be, 4096, 0.3) : wrk_peak_flops(r, kn_blas_threads());
    if (ch_layout_world(ch_jobspec_layout(s)) > 1) {
        if ((rc = groups_setup(r, x->dev, &x->stage, &x->c, &x->groups)) < 0)
            return rc;
        opts.groups = x->groups;
    }
    if ((rc = wrk_memckpt_create(r, x->c, &x->mem)) < 0)
        return wrk_rank_fail(r, rc, "checkpoint.memory_every: %s", ch_strerror(rc));
    report_phase(r, 1);
    if ((rc = eng_trainer_create(s, &opts, &x->t, x->err, sizeof x->err)) < 0)
        return wrk_rank_fail(r, rc, "%s", x->err);
    /* never a silent CPU run with NCCL on device buffers */
    if (be != NULL && eng_model_backend(eng_trainer_model(x->t)) != be)
        return wrk_rank_fail(r, -ENOTSUP,
                             "train.device: cuda: this trainer does not run its "
                             "model on the CUDA backend it was given");
    if ((rc = resume(r, x->t, x->mem, &res)) < 0)
        return rc;
    if (eng_trainer_next_step(x->t) == 0 && s->train.init_from[0] &&
        (rc = eng_trainer_init_from(x->t, s->train.init_from, x->err, sizeof x->err)) < 0)
        return wrk_rank_fail(r, rc, "train.init_from: %s", x->err);
    if ((rc = ckpt_dir_check(r)) < 0)
        return rc;
    report_phase(r, 2);
    const char *drill = getenv("CHORUS_DRILL_NONFINITE_BATCH"); /* tests and benches */
    if (drill && *drill)
        eng_trainer_drill_nonfinite(x->t, strtoull(drill, NULL, 10));
    return 0;
}

/* Who evaluates, how, and the run's opening log lines. Data-parallel ranks hold the same
 * model: one of them evaluates, every EVAL_EVERY steps. The evaluation reads logits on the
 * host: a GPU model, or one sliced over tp, pp or ZeRO-3 shards, evaluates what it
 * commits, in a child process (eval_spawn). */
static void run_start(run_t *x)
{
    wrk_rank_t *r = x->r;
    const ch_jobspec_t *s = &r->spec;
    eng_trainer_t *t = x->t;
    x->builtin = eng_data_is_builtin(eng_trainer_data(t)) && r->rank == 0;
    x->sliced = !eng_trainer_holds_whole_model(t) || eng_device_backend(x->dev) != NULL;
    if (x->builtin && x->sliced && !s->checkpoint.dir[0]) {
        CH_LOGI("train",
                "job=%s gen=%" PRIu64 " rank=%u: accuracy not evaluated: tp %u x pp %u on %s; "
                "set checkpoint.dir to evaluate each committed checkpoint",
                r->job_id, r->generation, r->rank, s->parallel.tp, s->parallel.pp,
                ch_device_name(s->train.device));
        x->builtin = 0;
    }
    x->total = eng_trainer_total_steps(t);
    x->acc = NAN;
    CH_LOGI("train",
            "job=%s gen=%" PRIu64 " rank=%u: %" PRIu64 " parameters, steps %" PRIu64 "..%" PRIu64
            ", peak %.1f GFLOP/s",
            r->job_id, r->generation, r->rank, (uint64_t)eng_model_nparams(eng_trainer_model(t)),
            eng_trainer_next_step(t), x->total, eng_trainer_peak_flops(t) * 1e-9);
    log_memory_at_start(r, t);
    wrk_history_open(r, eng_trainer_next_step(t), &x->hist);
}

/* A step that failed (rc < 0): the rank's failure, named as precisely as it can be. */
static int step_failed(run_t *x, int rc, const eng_step_info_t *info)
{
    wrk_rank_t *r = x->r;
    const char *g;
    uint32_t peer;
    if (wrk_coll_timed_out(x->c, &g, &peer)) {
        snprintf(r->timeout_group, sizeof r->timeout_group, "%s", g);
        r->timeout_peer = peer;
        note_entered(r, x->c, x->groups);
        return wrk_rank_fail(r, rc, "step %" PRIu64 ": %s collective waited for rank %u",
                             eng_trainer_next_step(x->t), g, peer);
    }
    if (rc == CH_E_NUMERIC && (!isfinite(info->loss) || !isfinite(info->grad_norm))) {
        /* the loss is global: a restart would replay the same step to the same end */
        r->cause_class = "nonfinite";
        r->nonfinite_batch = ch_skip_batch_of(x->r->spec.train.skip_steps, info->step) + 1;
        return wrk_rank_fail(r, rc,
                             "step %" PRIu64 ": loss %g, gradient norm %g: not finite "
                             "(fault.nonfinite = %s, data batch %" PRIu64 ")",
                             info->step + 1, info->loss, info->grad_norm,
                             ch_nonfinite_name(x->r->spec.fault.nonfinite), r->nonfinite_batch - 1);
    }
    return wrk_rank_fail(r, rc, "step %" PRIu64, eng_trainer_next_step(x->t));
}

/* A sliced layout's evaluation failed: said once, and not tried again. */
static void eval_failed(run_t *x, uint64_t step, const char *why)
{
    wrk_rank_t *r = x->r;
    CH_LOGW("train",
            "job=%s gen=%" PRIu64 " rank=%u step=%" PRIu64
            ": accuracy not evaluated, and not tried again: %s",
            r->job_id, r->generation, r->rank, step, why);
    x->builtin = 0;
}

/* The child's figure into x->acc once it ended; wait_ms > 0: wait for it that long (the
 * run's end), then kill it. */
static void eval_collect(run_t *x, int wait_ms)
{
    uint64_t step = x->eval.step;
    double acc = NAN;
    int rc = wait_ms > 0 ? wrk_evalproc_wait(&x->eval, wait_ms, &acc)
                         : wrk_evalproc_poll(&x->eval, &acc);
    if (rc == 1)
        x->acc = acc;
    else if (rc < 0)
        eval_failed(x, step,
                    rc == -ETIMEDOUT ? "the evaluation took too long: killed" : ch_strerror(rc));
}

/* After the checkpoint of step `done` committed: its evaluation in a child process
 * (evalproc.h), unless the previous one still runs. */
static void eval_spawn(run_t *x, uint64_t done)
{
    wrk_rank_t *r = x->r;
    char dir[CH_PATH_LEN], out[CH_PATH_LEN];
    if (x->eval.pid > 0) {
        CH_LOGD("train",
                "job=%s gen=%" PRIu64 " rank=%u step=%" PRIu64 ": not evaluated: step %" PRIu64
                "'s evaluation (pid %ld) still runs",
                r->job_id, r->generation, r->rank, done, x->eval.step, (long)x->eval.pid);
        return;
    }
    int rc = eng_ckpt_step_dir(r->spec.checkpoint.dir, r->spec.name, done, dir, sizeof dir);
    int n = snprintf(out, sizeof out, "%s/eval-accuracy", r->run_dir);
    if (rc < 0 || n < 0 || (size_t)n >= sizeof out) {
        eval_failed(x, done, "path too long");
        return;
    }
    if ((rc = wrk_evalproc_start(&x->eval, "/proc/self/exe", dir, done, out)) < 0) {
        eval_failed(x, done, ch_strerror(rc));
        return;
    }
    CH_LOGI("train",
            "job=%s gen=%" PRIu64 " rank=%u (pid %ld) step=%" PRIu64
            ": evaluating the checkpoint in pid %ld",
            r->job_id, r->generation, r->rank, (long)getpid(), done, (long)x->eval.pid);
}

/* The step's named metrics into m (room for RUN_METRICS), evaluating on the live model when
 * due; returns their count. */
#define RUN_METRICS 12
static size_t step_metrics(run_t *x, const eng_step_info_t *info, Chorus__Metric *m)
{
    size_t nm = mem_metrics(x->t, m, 0);
    uint64_t done = info->step + 1;
    m[nm].name = "lr";
    m[nm++].value = info->lr;
    m[nm].name = "grad_norm";
    m[nm++].value = info->grad_norm;
    if (x->skipped) { /* fault.nonfinite = skip: updates dropped by this generation */
        m[nm].name = "skipped_steps";
        m[nm++].value = (double)x->skipped;
    }
    m[nm].name = "step_ms"; /* this rank's time for the step: the status page's heat map */
    m[nm++].value = info->seconds * 1e3;
    if (x->r->spec.parallel.pp > 1) { /* the status page's and Prometheus' bubble (rank 0's) */
        m[nm].name = "bubble";
        m[nm++].value = step_bubble(info);
    }
    if (x->builtin && !x->sliced && (done % EVAL_EVERY == 0 || done == x->total) &&
        wrk_eval_model(x->r, eng_trainer_model(x->t), done, &x->acc) < 0)
        x->acc = NAN;
    eval_collect(x, 0);
    if (isfinite(x->acc)) { /* a sliced layout's comes with the step after its checkpoint */
        m[nm].name = "accuracy";
        m[nm++].value = x->acc;
        x->acc = NAN;
    }
    if (!isnan(info->val_loss)) { /* train.val_data's loss, when one was due */
        m[nm].name = "val_loss";
        m[nm++].value = info->val_loss;
        m[nm].name = "val_step";
        m[nm++].value = (double)done;
    }
    return nm;
}

/* RANK_PROGRESS of the step with its named metrics (step_metrics). */
static int step_report(run_t *x, const eng_step_info_t *info)
{
    Chorus__Metric m[RUN_METRICS], *mp[RUN_METRICS];
    for (size_t i = 0; i < RUN_METRICS; i++) {
        chorus__metric__init(&m[i]);
        mp[i] = &m[i];
    }
    size_t nm = step_metrics(x, info, m);
    int rc = report_step(x->r, info, x->total, mp, nm);
    if (rc < 0)
        return wrk_rank_fail(x->r, rc, "reporting progress to workerd");
    return 0;
}

/* The checkpoint due after step `done`, its report, and a sliced layout's evaluation. */
static int step_checkpoint(run_t *x, uint64_t done)
{
    wrk_rank_t *r = x->r;
    uint64_t bytes = 0, sum = 0;
    int rc = eng_trainer_checkpoint(x->t, &bytes, &sum, x->err, sizeof x->err);
    if (rc < 0)
        return wrk_rank_fail(r, rc, "checkpoint at step %" PRIu64 ": %s", done, x->err);
    if ((rc = report_checkpoint(r, done, bytes, sum)) < 0)
        return wrk_rank_fail(r, rc, "reporting checkpoint to workerd");
    if (x->builtin && x->sliced)
        eval_spawn(x, done);
    return 0;
}

/* One step: train, report, checkpoint when due. */
static int run_step(run_t *x)
{
    wrk_rank_t *r = x->r;
    eng_step_info_t info = {0}; /* parts the engine does not measure stay zero */
    if (wrk_rank_poll_checkpoint(r))
        eng_trainer_request_checkpoint(x->t);
    int rc = eng_trainer_step(x->t, &info);
    if (rc < 0)
        return step_failed(x, rc, &info);
    r->stepped = 1;
    if (info.skipped) {
        x->skipped++;
        CH_LOGW("train",
                "job=%s gen=%" PRIu64 " rank=%u step=%" PRIu64
                ": loss %g, gradient norm %g not finite: update skipped (fault.nonfinite = "
                "skip; %" PRIu64 " so far)",
                r->job_id, r->generation, r->rank, info.step + 1, info.loss, info.grad_norm,
                x->skipped);
    }
    x->last = info;
    log_step(r, &info, x->total);
    wrk_history_step(&x->hist, r, &info);
    if ((rc = step_report(x, &info)) < 0)
        return rc;
    uint64_t done = info.step + 1;
    if (eng_trainer_checkpoint_due(x->t) && (rc = step_checkpoint(x, done)) < 0)
        return rc;
    if (wrk_memckpt_due(x->mem, done) && done < x->total &&
        (rc = wrk_memckpt_save(x->mem, x->t, x->err, sizeof x->err)) < 0)
        return wrk_rank_fail(r, rc, "step %" PRIu64 ": %s", done, x->err);
    return 0;
}

/* The run's end: the evaluation of its last checkpoint, waited for (EVAL_FINAL_MS), and its
 * figure reported with the last step's again, before the rank reports RANK_DONE. */
static int run_end(run_t *x)
{
    if (x->eval.pid <= 0)
        return 0;
    eval_collect(x, EVAL_FINAL_MS);
    return isfinite(x->acc) ? step_report(x, &x->last) : 0;
}

static void run_fini(run_t *x)
{
    wrk_evalproc_kill(&x->eval); /* a failed run does not wait for it */
    wrk_history_close(&x->hist);
    eng_trainer_destroy(x->t);
    wrk_memckpt_destroy(x->mem);
    eng_groups_destroy(x->groups);
    wrk_coll_destroy(x->c);
    eng_device_close(x->dev); /* after every user of its backend */
}

int wrk_train_run(wrk_rank_t *r)
{
    run_t x = {.r = r, .hist = {NULL}, .acc = NAN};
    int rc = run_setup(&x);
    if (rc == 0) {
        run_start(&x);
        while (rc == 0 && eng_trainer_next_step(x.t) < x.total)
            rc = run_step(&x);
        if (rc == 0)
            rc = run_end(&x);
    }
    run_fini(&x);
    return rc;
}
