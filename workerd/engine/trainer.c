/* Training driver for one rank (trainer.h). */
#include "workerd/engine/trainer.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/layout.h"
#include "common/log.h"
#include "common/plan.h"
#include "common/skipsteps.h"
#include "common/util.h"
#include "kernels/matmul.h"
#include "workerd/coll/coll.h"
#include "workerd/engine/backend_bf16.h"
#include "workerd/engine/coll_bf16.h"
#include "workerd/engine/ckpt.h"
#include "workerd/engine/pipeline.h"
#include "workerd/engine/trainer_impl.h"
#include "workerd/engine/zero.h"

double eng_measure_peak_flops(int n, double seconds)
{
    float *a = calloc((size_t)n * n, sizeof *a), *b = calloc((size_t)n * n, sizeof *b);
    float *c = calloc((size_t)n * n, sizeof *c);
    double best = 0;
    if (!a || !b || !c)
        goto out;
    for (size_t i = 0; i < (size_t)n * n; i++) {
        a[i] = (float)(i % 7) * 0.1f;
        b[i] = (float)(i % 5) * 0.1f;
    }
    kn_matmul_fwd(c, a, b, NULL, n, n, n); /* warm up */
    uint64_t start = ch_now_ns(), budget = (uint64_t)(seconds * 1e9);
    do {
        uint64_t t0 = ch_now_ns();
        kn_matmul_fwd(c, a, b, NULL, n, n, n);
        double dt = (double)(ch_now_ns() - t0) * 1e-9;
        double f = 2.0 * n * n * (double)n / (dt > 0 ? dt : 1e-9);
        best = f > best ? f : best;
    } while (ch_now_ns() - start < budget);
out:
    free(a);
    free(b);
    free(c);
    return best;
}

double eng_measure_peak_flops_on(const eng_backend_t *be, int n, double seconds)
{
    if (!be || be->host_memory)
        return eng_measure_peak_flops(n, seconds);
    size_t nn = (size_t)n * n, bytes = nn * sizeof(float);
    float *host = malloc(bytes);
    void *a = NULL, *b = NULL, *c = NULL;
    double best = 0;
    if (!host || be->alloc(be, bytes, &a) < 0 || be->alloc(be, bytes, &b) < 0 ||
        be->alloc(be, bytes, &c) < 0)
        goto out;
    for (size_t i = 0; i < nn; i++)
        host[i] = (float)(i % 7) * 0.1f;
    if (be->copy(be, a, host, bytes, ENG_COPY_H2D) < 0 ||
        be->copy(be, b, host, bytes, ENG_COPY_H2D) < 0)
        goto out;
    be->matmul_fwd(be, c, a, b, NULL, n, n, n); /* warm up */
    if (be->sync && be->sync(be) < 0)
        goto out;
    uint64_t start = ch_now_ns(), budget = (uint64_t)(seconds * 1e9);
    do {
        uint64_t t0 = ch_now_ns();
        for (int k = 0; k < 4; k++) /* several launches: the GEMM, not one launch's latency */
            be->matmul_fwd(be, c, a, b, NULL, n, n, n);
        if (be->sync && be->sync(be) < 0) {
            best = 0;
            break;
        }
        double dt = (double)(ch_now_ns() - t0) * 1e-9;
        double f = 4 * 2.0 * n * n * (double)n / (dt > 0 ? dt : 1e-9);
        best = f > best ? f : best;
    } while (ch_now_ns() - start < budget);
out:
    if (be) {
        be->free(be, a);
        be->free(be, b);
        be->free(be, c);
    }
    free(host);
    return best;
}

// ----------------------------------------------------------------------------
// the stage step the 1F1B schedule drives (pipeline.h)
//
// Every layout runs through the schedule: a world without pipeline parallelism is one
// stage that is both first and last (no sends, one slot, forward then backward per
// micro-batch). The stage runs [embedding] -> its blocks -> [head].

/* The step's timers (backend.h's timer_*): recorded on the backend's stream where it has
 * them, so a pass's time is the device's and the host never waits for it (read once, after
 * the step's one sync); else host clocks around the calls (the CPU's work is done when they
 * return). */
static void timer_mark(eng_trainer_t *t, int kind, int begin)
{
    if (t->be->timer_mark) {
        t->be->timer_mark(t->be, kind, begin);
        return;
    }
    uint64_t now = ch_now_ns();
    if (begin)
        t->timer_at[kind] = now;
    else
        t->timer_ns[kind] += now - t->timer_at[kind];
}

/* ns[k]: nanoseconds of the kind-k intervals closed since the last read (after a sync). */
static void timer_read(eng_trainer_t *t, uint64_t *ns)
{
    double ms[ENG_TIMER_KINDS] = {0};
    if (t->be->timer_read)
        t->be->timer_read(t->be, ms);
    for (int k = 0; k < ENG_TIMER_KINDS; k++) {
        ns[k] = t->be->timer_read ? (uint64_t)(ms[k] * 1e6) : t->timer_ns[k];
        t->timer_ns[k] = 0;
    }
}

wrk_coll_t *eng_trainer_coll(const eng_trainer_t *t)
{
    wrk_coll_group_t *g = t->tp ? t->tp : t->dp ? t->dp : t->pp ? t->pp : t->emb;
    return g ? wrk_coll_group_context(g) : NULL;
}

/* A group's communication time so far: what the host waited on it, plus what its
 * operations ran on its stream where the collectives time them there (NCCL's events, counted
 * at the step's settles: on a GPU the host waits next to nothing). */
static uint64_t group_ns(const wrk_coll_group_t *g)
{
    return wrk_coll_group_wait_ns(g) + wrk_coll_group_device_ns(g);
}

/* The host's waits inside a pass (the device's times are counted after the passes) */
static uint64_t comm_ns(const eng_trainer_t *t)
{
    return wrk_coll_group_wait_ns(t->tp) + wrk_coll_group_wait_ns(t->dp);
}

static void pipe_fini(eng_trainer_t *t)
{
    if (t->acts)
        for (uint32_t i = 0; i < t->pipe.slots; i++)
            eng_acts_destroy(t->acts[i]);
    free(t->acts);
    t->acts = NULL;
    const eng_backend_t *be = t->be;
    eng_pipeline_fini(&t->pipe);
    be->free(be, t->grad);
    t->grad = NULL;
}

/* n floats of the backend's memory, zeroed */
static int alloc_floats(const eng_trainer_t *t, eng_mem_kind_t kind, size_t n, float **out)
{
    const eng_backend_t *be = eng_mem_view(t->be, kind);
    void *p = NULL;
    size_t bytes = (n ? n : 1) * sizeof(float);
    int rc = be->alloc(be, bytes, &p);
    *out = p;
    return rc == 0 ? be->memset(be, p, 0, bytes) : rc;
}

static int pipe_init(eng_trainer_t *t, uint32_t B, uint32_t T)
{
    size_t n = (size_t)B * T * t->cfg.embd;
    uint32_t m = t->spec.parallel.microbatches;
    eng_pipe_schedule_t sched =
        t->spec.parallel.schedule == CH_SCHEDULE_ZBH1 ? ENG_PIPE_ZBH1 : ENG_PIPE_1F1B;
    uint32_t v = t->part.chunks;
    const eng_backend_t *acts_be = eng_mem_view(t->be, ENG_MEM_ACTS);
    int rc = v > 1 ? eng_pipeline_init_interleaved(&t->pipe, acts_be, t->pp, t->stages, t->stage, v,
                                                   m, n)
                   : eng_pipeline_init(&t->pipe, sched, acts_be, t->pp, t->stages, t->stage,
                                       t->groups ? t->groups->pp_prev : -1,
                                       t->groups ? t->groups->pp_next : -1, m, n);
    /* bf16 stage boundaries (exact: bf16 activations), cast in the backend's memory; the
     * interleaved schedule's lone sends through its ring of requests, 1F1B's through each slot's */
    if (rc == 0 && t->pp && t->spec.train.precision == CH_PRECISION_BF16 &&
        eng_bf16_castable(acts_be)) {
        rc = eng_p2p_set_bf16(&t->pipe.p2p, n, acts_be);
        for (uint32_t i = 0; rc == 0 && v > 1 && i < ENG_PIPE_IL_LONE; i++) /* no step allocates */
            rc = eng_p2p_req_reserve(&t->pipe.p2p, &t->pipe.il.lone[i]);
        for (uint32_t i = 0; rc == 0 && v <= 1 && i < t->pipe.slots; i++)
            if ((rc = eng_p2p_req_reserve(&t->pipe.p2p, &t->pipe.ysend[i])) == 0)
                rc = eng_p2p_req_reserve(&t->pipe.p2p, &t->pipe.dxsend[i]);
    }
    if (rc < 0)
        return rc;
    /* interleaved: each slot one chunk-activation (its blocks, bound at each forward) */
    uint32_t slots = t->pipe.slots, span = v > 1 ? t->part.chunk_len : t->part.nblocks;
    t->acts = calloc(slots, sizeof *t->acts);
    if (!t->acts)
        return -ENOMEM;
    if ((rc = alloc_floats(t, ENG_MEM_SCRATCH, n, &t->grad)) < 0)
        return rc;
    for (uint32_t i = 0; i < slots; i++)
        if ((rc = eng_acts_create_span(t->model, B, span, &t->acts[i])) < 0)
            return rc;
    return 0;
}

/* Chunk c's blocks (part.h: [lo, lo + chunk_len)); the whole stage's with one chunk. */
static uint32_t chunk_lo(const eng_trainer_t *t, uint32_t c)
{
    return t->part.first + c * t->part.stride;
}

/* Chunk c's forward of mb: [embedding on chunk 0 of stage 0] -> its blocks -> [head on the
 * last chunk of the last stage] (pipeline.h's chunk_forward; one chunk: its forward). */
static int chunk_forward(void *ctx, uint32_t c, uint32_t mb, uint32_t slot, const float *x,
                         const float **y)
{
    eng_trainer_t *t = ctx;
    const ch_jobspec_t *s = &t->spec;
    uint32_t B = s->parallel.micro_batch_size, T = s->model.seq_len, v = t->part.chunks;
    eng_acts_t *a = t->acts[slot];
    int first = t->stage == 0 && c == 0, last = t->stage + 1 == t->stages && c + 1 == v;
    uint32_t lo = chunk_lo(t, c), hi = lo + t->part.chunk_len;
    int rc = 0;
    uint64_t t0 = ch_now_ns();
    if (first || last)
        eng_data_micro_batch(t->feed, t->step_now, t->dpr, mb, s->parallel.microbatches, B,
                             t->inputs, t->targets);
    uint64_t t1 = ch_now_ns(), c0 = comm_ns(t);
    timer_mark(t, ENG_TIMER_PASS, 1);
    /* the embedding's and the blocks' outputs are the slot's activations: sent from there */
    if (first) {
        x = eng_acts_embed_out(a);
        rc = eng_model_embed_forward(t->model, a, t->inputs, B, T, (float *)x);
    }
    /* the chunk's output is its last block's, sent from there (kept until its backward) */
    if (rc == 0 && v > 1)
        rc = eng_acts_bind(a, lo);
    float *out = eng_acts_blocks_out(a);
    if (y)
        *y = out;
    if (rc == 0)
        rc = eng_model_blocks_forward(t->model, a, lo, hi, x, out, B, T);
    if (rc == 0 && last) /* the loss stays on the device until the step's readback */
        rc = eng_trainer_loss_add(t, a, out, B, T);
    timer_mark(t, ENG_TIMER_PASS, 0); /* no sync: the pass's time is read at the step's end */
    t->data_ns += t1 - t0;
    t->pass_comm_ns += comm_ns(t) - c0;
    return rc;
}

static int stage_forward(void *ctx, uint32_t mb, uint32_t slot, const float *x, const float **y)
{
    return chunk_forward(ctx, 0, mb, slot, x, y);
}

static int chunk_backward(void *ctx, uint32_t c, uint32_t mb, uint32_t slot, const float *dy,
                          float *dx)
{
    eng_trainer_t *t = ctx;
    (void)mb;
    eng_acts_t *a = t->acts[slot];
    int first = t->stage == 0 && c == 0;
    int last = t->stage + 1 == t->stages && c + 1 == t->part.chunks;
    uint32_t lo = chunk_lo(t, c), hi = lo + t->part.chunk_len;
    int rc = 0;
    uint64_t c0 = comm_ns(t);
    timer_mark(t, ENG_TIMER_PASS, 1);
    if (last) {
        rc = eng_model_head_backward(t->model, a, (float)t->grad_scale, t->grad);
        dy = t->grad;
    }
    /* zb-h1: the blocks' input pass only; stage_weight runs the rest */
    int (*blocks)(eng_model_t *, eng_acts_t *, uint32_t, uint32_t, const float *, float *) =
        eng_pipeline_splits(t->pipe.schedule, t->stage) ? eng_model_blocks_backward_input
                                                        : eng_model_blocks_backward;
    if (rc == 0)
        rc = blocks(t->model, a, lo, hi, dy, first ? t->grad : dx);
    if (rc == 0 && first)
        rc = eng_model_embed_backward(t->model, a, t->grad);
    timer_mark(t, ENG_TIMER_PASS, 0);
    t->pass_comm_ns += comm_ns(t) - c0;
    return rc;
}

static int stage_backward(void *ctx, uint32_t mb, uint32_t slot, const float *dy, float *dx)
{
    return chunk_backward(ctx, 0, mb, slot, dy, dx);
}

/* zb-h1's weight pass of mb (pipeline.h): the blocks' parameter gradients. */
static int stage_weight(void *ctx, uint32_t mb, uint32_t slot)
{
    eng_trainer_t *t = ctx;
    (void)mb;
    uint64_t c0 = comm_ns(t);
    timer_mark(t, ENG_TIMER_PASS, 1);
    int rc = eng_model_blocks_backward_weight(t->model, t->acts[slot], t->first, t->last);
    if (rc == 0 && t->split_head) /* the head's wte gradient (no block gradient shares it) */
        rc = eng_model_head_backward_weight(t->model, t->acts[slot]);
    timer_mark(t, ENG_TIMER_PASS, 0);
    t->pass_comm_ns += comm_ns(t) - c0;
    return rc;
}

// ----------------------------------------------------------------------------
// create / destroy

static int check_groups(const ch_jobspec_t *spec, const eng_groups_t *groups, char *err,
                        size_t errlen)
{
    ch_layout_t l = ch_jobspec_layout(spec);
    if (groups &&
        (groups->layout.tp != l.tp || groups->layout.pp != l.pp || groups->layout.dp != l.dp))
        return ch_errf(err, errlen, CH_E_CONFIG,
                       "parallel: the rank's groups were built for tp=%u pp=%u dp=%u, the job "
                       "has tp=%u pp=%u dp=%u",
                       groups->layout.tp, groups->layout.pp, groups->layout.dp, l.tp, l.pp, l.dp);
    if (l.tp > 1 && (!groups || !groups->tp))
        return ch_errf(err, errlen, CH_E_CONFIG,
                       "parallel.tp = %u: the rank has no tensor-parallel group of that size",
                       l.tp);
    if (l.dp > 1 && (!groups || !groups->dp))
        return ch_errf(err, errlen, CH_E_CONFIG,
                       "parallel.dp = %u: the rank has no data-parallel group of that size", l.dp);
    if (l.pp > 1 && (!groups || !groups->pp))
        return ch_errf(err, errlen, CH_E_CONFIG,
                       "parallel.pp = %u: the rank has no pipeline group of that size", l.pp);
    return 0;
}

/* The training data and train.val_data, read at the job's global batch. */
static int open_data(eng_trainer_t *t, const ch_jobspec_t *spec, char *err, size_t errlen)
{
    uint32_t B = spec->parallel.micro_batch_size, T = spec->model.seq_len;
    int rc = eng_data_open(spec->train.data, spec->model.vocab, T, spec->train.seed, &t->data, err,
                           errlen);
    if (rc == 0 && spec->train.val_data[0])
        rc = eng_data_open_eval(spec->train.val_data, spec->model.vocab, T, &t->val, err, errlen);
    if (rc < 0)
        return rc;
    uint64_t global = (uint64_t)B * spec->parallel.microbatches * spec->parallel.dp;
    eng_data_set_global_batch(t->data, global);
    if (t->val)
        eng_data_set_global_batch(t->val, global);
    t->feed = t->data;
    return 0;
}

/* This rank's part of the model (its stage; its TP shard). */
static int create_model(eng_trainer_t *t, const ch_jobspec_t *spec, int zero, int unpacked,
                        char *err, size_t errlen)
{
    uint32_t B = spec->parallel.micro_batch_size;
    eng_model_opts_t mopts = {.backend = t->be,
                              .recompute = spec->parallel.recompute,
                              .split_backward = spec->parallel.schedule == CH_SCHEDULE_ZBH1 &&
                                                t->stage > 0, /* eng_pipeline_splits */
                              .pp = t->stages,
                              .stage = t->stage,
                              .virtual_stages = spec->parallel.virtual_stages,
                              .external_blocks = zero,
                              .bf16_acts = spec->train.precision == CH_PRECISION_BF16 && !unpacked};
    mopts.split_head = t->split_head =
        ch_plan_head_split(spec->parallel.schedule, ch_jobspec_layout(spec), t->stage, B,
                           spec->parallel.microbatches, spec->model.seq_len, t->cfg.padded_vocab);
    if (t->dp) {
        mopts.dp = spec->parallel.dp;
        mopts.dp_rank = t->dpr;
    }
    if (t->tp) {
        mopts.tp = spec->parallel.tp;
        mopts.tp_rank = t->tpr;
        mopts.tp_group = t->tp;
        mopts.tp_bf16 = spec->train.precision == CH_PRECISION_BF16;
    }
    int rc = eng_model_create_opts(&t->cfg, &mopts, B, spec->train.seed, &t->model);
    if (rc < 0) {
        ch_errf(err, errlen, rc, "model: %s", ch_strerror(rc));
        return rc;
    }
    t->cfg = *eng_model_config(t->model);
    eng_model_part_t part = eng_model_part(t->model);
    t->part = part;
    t->first = part.first;
    t->last = part.last;
    return 0;
}

/* AdamW over the slab, ZeRO-3's shards, and the gradients DP reduces. */
static int init_optim(eng_trainer_t *t, const ch_jobspec_t *spec, int zero, char *err,
                      size_t errlen)
{
    /* under ZeRO-3 every tensor's Adam state is in the shards (the table's stores) */
    int rc = eng_optim_init_on(&t->optim, eng_mem_view(t->be, ENG_MEM_OPTIM),
                               zero ? 0 : eng_model_nparams(t->model));
    if (rc < 0)
        return rc;
    t->optim.weight_decay = spec->optim.weight_decay;
    t->optim.beta1 = spec->optim.beta1;
    t->optim.beta2 = spec->optim.beta2;
    t->optim.eps = spec->optim.eps;
    /* grad_clip 0: no clipping (eng_clip_coef of an infinite bound is 1) */
    t->optim.max_grad_norm = spec->optim.grad_clip > 0 ? spec->optim.grad_clip : INFINITY;
    if (zero) {
        rc = eng_zero_create(t->model, t->dp, spec->parallel.reshard, &t->zero);
        if (rc < 0) {
            ch_errf(err, errlen, rc, "ZeRO-3: %s", ch_strerror(rc));
            return rc;
        }
        rc = eng_zero_set_bf16_reduce(t->zero, spec->optim.grad_reduce == CH_PRECISION_BF16);
        if (rc < 0) {
            ch_errf(err, errlen, rc, "ZeRO-3 bf16 gradient reduction: %s", ch_strerror(rc));
            return rc;
        }
        /* bf16 parameter gathers; a backend that cannot cast keeps fp32 ones */
        rc = eng_zero_set_bf16_gather(t->zero, spec->train.precision == CH_PRECISION_BF16);
        if (rc < 0 && rc != -ENOTSUP) {
            ch_errf(err, errlen, rc, "ZeRO-3 bf16 gathers: %s", ch_strerror(rc));
            return rc;
        }
    }
    if (t->dp) {
        /* what same-host members of the DP group reduce in place (coll.h) */
        rc = wrk_coll_mem_alloc(wrk_coll_group_context(t->dp),
                                eng_model_nparams(t->model) * sizeof(float),
                                (void **)&t->coll_grads);
        if (rc < 0)
            return rc;
        /* under ZeRO-3 the slab is the gathered copy (zero.h) */
        eng_mem_note(t->be, zero ? ENG_MEM_GATHERED : ENG_MEM_GRADS, t->coll_grads,
                     eng_model_nparams(t->model) * sizeof(float));
        eng_model_lend_grads(t->model, t->coll_grads);
    }
    if (t->dp && !zero && spec->optim.grad_reduce == CH_PRECISION_BF16 &&
        eng_bf16_castable(t->be)) { /* the bf16 gradient all-reduce's buffer, now */
        eng_bf16_msg_init(&t->grad16, t->be);
        rc = eng_bf16_msg_reserve(&t->grad16, t->dp, eng_model_nparams(t->model));
    }
    return rc;
}

/* precision = bf16 without ZeRO-3: the slab's packed working copy (weights_cast fills it
 * each step; under ZeRO-3 the gathers are the per-block casts). */
static int alloc_working_copy(eng_trainer_t *t, int zero)
{
    size_t n = eng_model_nparams(t->model);
    if (!t->bf16 || zero || n == 0 || !eng_bf16_castable(t->be))
        return 0;
    const eng_backend_t *pb = eng_mem_view(t->be, ENG_MEM_PARAMS);
    return pb->alloc(pb, n * sizeof(kn_bf16_t), (void **)&t->w16);
}

int eng_trainer_create(const ch_jobspec_t *spec, const eng_trainer_opts_t *opts,
                       eng_trainer_t **out, char *err, size_t errlen)
{
    int rc = 0;
    eng_trainer_t *t = NULL;
    *out = NULL;
    if (spec->kind != CH_JOB_TRAIN)
        return ch_errf(err, errlen, CH_E_CONFIG, "job.kind: %s is not a training job",
                       ch_job_kind_name(spec->kind));
    rc = ch_jobspec_validate(spec, 0, err, errlen);
    if (rc < 0)
        return rc;
    const eng_groups_t *groups = opts ? opts->groups : NULL;
    const eng_backend_t *be = opts && opts->backend ? opts->backend : eng_backend_cpu();
    const eng_backend_t *dev = be; /* the GEMM peak's: the job's backend, not its bf16 wrapper */
    if (spec->parallel.tp > 1 && !eng_model_tp_runs_on(be))
        return ch_errf(err, errlen, CH_E_CONFIG,
                       "parallel.tp = %u: backend %s has no vocab-parallel embedding and head "
                       "kernels and its memory is not the host's; use tp = 1 with it",
                       spec->parallel.tp, be->name);
    rc = check_groups(spec, groups, err, errlen);
    if (rc < 0)
        return rc;
    t = calloc(1, sizeof *t);
    if (!t)
        return -ENOMEM;
    t->spec = *spec;
    t->be = be;
    t->stages = 1;
    if (spec->train.precision == CH_PRECISION_BF16) { /* the model computes through it */
        if ((rc = eng_backend_bf16_create(be, &t->bf16)) < 0)
            goto out;
        be = t->bf16;
    }
    if ((rc = eng_mem_create(be, &t->mem)) < 0)
        goto out;
    t->be = eng_mem_backend(t->mem, ENG_MEM_SCRATCH);
    if (groups) {
        t->groups = groups;
        t->tp = groups->tp;
        t->dp = groups->dp;
        t->pp = groups->pp;
        t->emb = groups->emb;
        t->tpr = groups->coord.tp;
        t->dpr = groups->coord.dp;
        t->rank = groups->rank;
        t->stage = groups->coord.pp;
        t->stages = spec->parallel.pp;
    }
    int zero = t->dp != NULL && !(opts && opts->replicate_dp);
    snprintf(t->job, sizeof t->job, "%s", opts && opts->job_id ? opts->job_id : spec->name);
    t->cfg = ch_plan_model_of(spec);
    t->cfg.padded_vocab = ch_layout_padded_vocab(spec->model.vocab, spec->parallel.tp);
    t->sched = eng_lr_from_spec(spec);

    rc = open_data(t, spec, err, errlen);
    if (rc == 0)
        rc = create_model(t, spec, zero, opts && opts->bf16_unpacked, err, errlen);
    if (rc == 0)
        rc = init_optim(t, spec, zero, err, errlen);
    if (rc == 0 && !(opts && opts->bf16_unpacked))
        rc = alloc_working_copy(t, zero);
    if (rc < 0)
        goto out;
    uint32_t B = spec->parallel.micro_batch_size, T = spec->model.seq_len;
    if ((rc = alloc_floats(t, ENG_MEM_SCRATCH, SMALL_FLOATS, &t->small)) < 0)
        goto out;
    if ((rc = eng_trainer_rb_init(t)) < 0)
        goto out;
    rc = pipe_init(t, B, T);
    if (rc < 0)
        goto out;
    t->inputs = malloc((size_t)B * T * sizeof *t->inputs);
    t->targets = malloc((size_t)B * T * sizeof *t->targets);
    if (!t->inputs || !t->targets) {
        rc = -ENOMEM;
        goto out;
    }
    t->peak_flops =
        opts && opts->peak_flops > 0 ? opts->peak_flops : eng_measure_peak_flops_on(dev, 256, 0.2);
    *out = t;
    t = NULL;
out:
    if (rc < 0 && err && errlen && !err[0])
        ch_errf(err, errlen, rc, "trainer: %s", ch_strerror(rc));
    eng_trainer_destroy(t);
    return rc;
}

void eng_trainer_destroy(eng_trainer_t *t)
{
    if (!t)
        return;
    free(t->inputs);
    free(t->targets);
    pipe_fini(t);
    eng_zero_destroy(t->zero);
    eng_optim_fini(&t->optim);
    if (t->w16)
        t->be->free(t->be, t->w16);
    eng_model_destroy(t->model);
    if (t->coll_grads) {
        eng_mem_forget(t->be, t->coll_grads);
        wrk_coll_mem_free(wrk_coll_group_context(t->dp), t->coll_grads);
    }
    if (t->be)
        t->be->free(t->be, t->small);
    eng_trainer_rb_fini(t);
    eng_mem_destroy(t->mem);
    eng_backend_bf16_destroy(t->bf16);
    eng_bf16_msg_free(&t->grad16);
    eng_data_close(t->data);
    eng_data_close(t->val);
    free(t);
}

/* v[0..n) (host memory, n <= SMALL_FLOATS) reduced with op over each group of order[0..k)
 * in turn (NULL ones skipped), through t->small: the collectives read the backend's memory
 * (NCCL: the GPU's). */
int eng_trainer_reduce_small(eng_trainer_t *t, float *v, size_t n, wrk_coll_redop_t op,
                             wrk_coll_group_t *const *order, int k)
{
    const eng_backend_t *be = t->be;
    int rc = be->copy(be, t->small, v, n * sizeof *v, ENG_COPY_H2D);
    for (int i = 0; i < k && rc == 0; i++)
        if (order[i]) { /* in stream order: the copy back is where the host reads */
            wrk_coll_req_t *r = NULL;
            rc = wrk_coll_ordered(
                wrk_coll_allreduce(order[i], t->small, t->small, n, WRK_COLL_F32, op, &r), &r);
        }
    if (rc == 0)
        rc = be->copy(be, v, t->small, n * sizeof *v, ENG_COPY_D2H);
    return rc;
}

// ----------------------------------------------------------------------------
// one step

/* The update, fused with clipping (grad_coef) and the gradient reset: AdamW on each owned
 * range, wherever its store. o->t already advanced. */
static void state_adamw(eng_trainer_t *t, double lr, float grad_coef)
{
    const eng_optim_t *o = &t->optim;
    eng_store_t st[ENG_NSTORES];
    eng_trainer_stores(t, st);
    if (t->zero)
        eng_zero_end_step(t->zero); /* no gather may still read the shards */
    for (size_t i = 0; i < eng_model_ntensors(t->model); i++) {
        const eng_tensor_t *x = eng_model_tensor(t->model, i);
        const eng_store_t *s = &st[x->store];
        size_t at = x->own_at;
        if (s->p == NULL || x->own_lo == x->own_hi)
            continue;
        eng_adamw_piece(t->be, o, s->p + at, s->g + at, s->m + at, s->v + at, x->own_hi - x->own_lo,
                        lr, x->decay ? o->weight_decay : 0.0, grad_coef, 1);
    }
}

/* The slab's gradients summed over the DP group; with optim.grad_reduce = bf16 moved and
 * summed as bf16 (coll_bf16.h), or on a backend that cannot cast, the reduction's inputs and
 * output rounded to bf16 around an fp32 one. */
static int dp_allreduce_grads(eng_trainer_t *t, float *grads, size_t n)
{
    int bf16 = t->spec.optim.grad_reduce == CH_PRECISION_BF16;
    if (bf16 && eng_bf16_castable(t->be)) /* its buffer: reserved at create */
        return eng_bf16_allreduce(t->dp, grads, n, WRK_COLL_SUM, &t->grad16);
    if (bf16)
        eng_backend_bf16_round(t->be, grads, n);
    wrk_coll_req_t *r = NULL; /* the update's kernels wait on the device, not the host */
    int rc = wrk_coll_ordered(
        wrk_coll_allreduce(t->dp, grads, grads, n, WRK_COLL_F32, WRK_COLL_SUM, &r), &r);
    if (rc == 0 && bf16)
        eng_backend_bf16_round(t->be, grads, n);
    return rc;
}

/* After the schedule: the gradients made whole and their global norm. The tied wte's two halves are
 * summed over the embedding group (first and last stage), the slab's gradients over the DP
 * group (ZeRO-3's shards were reduce-scattered block by block), the loss and the squared
 * norm over TP, DP and the pipeline column. *loss_sum: the global batch's sum of
 * micro-batch mean losses. */
static int finish_grads(eng_trainer_t *t, double *loss_sum, double *norm)
{
    float *grads = eng_model_grads(t->model);
    size_t n = eng_model_nparams(t->model);
    int rc = 0;
    for (size_t i = 0; t->emb && rc == 0 && i < eng_model_ntensors(t->model); i++) {
        const eng_tensor_t *x = eng_model_tensor(t->model, i);
        if (x->tie != ENG_TIE_NONE) {
            wrk_coll_req_t *r = NULL;
            rc = wrk_coll_ordered(wrk_coll_allreduce(t->emb, grads + x->offset, grads + x->offset,
                                                     x->numel, WRK_COLL_F32, WRK_COLL_SUM, &r),
                                  &r);
        }
    }
    if (rc == 0 && t->zero)
        rc = eng_zero_reduce_rest(t->zero);
    else if (rc == 0 && t->dp && n)
        rc = dp_allreduce_grads(t, grads, n);
    if (rc < 0)
        return rc;
    /* the sums of squares and the losses: one download (trainer_read.c) */
    eng_trainer_sumsq_start(t);
    if ((rc = eng_trainer_readback(t, 1)) < 0)
        return rc;
    double sq = eng_trainer_sumsq(t);
    t->loss_sum = eng_trainer_loss_sum(t);
    int last = t->stage + 1 == t->stages;
    if (!t->tp && !t->dp && !t->pp) {
        *loss_sum = t->loss_sum;
        *norm = sqrt(sq);
        t->ckpt_now = t->ckpt_asked;
    } else {
        /* the loss lives on the last stage, the same on each of its TP ranks: counted
         * once per DP rank, by TP rank 0; l[2] counts the ranks asking for a checkpoint */
        float l[3] = {last && t->tpr == 0 ? (float)t->loss_sum : 0.0f, (float)sq,
                      t->ckpt_asked ? 1.0f : 0.0f};
        wrk_coll_group_t *order[3] = {t->tp, t->dp, t->pp};
        rc = eng_trainer_reduce_small(t, l, 3, WRK_COLL_SUM, order, 3);
        if (rc < 0)
            return rc;
        *loss_sum = l[0];
        *norm = sqrt((double)l[1]);
        t->ckpt_now = l[2] > 0;
    }
    return 0;
}

/* The bf16 working copy for the passes that follow: the slab cast once from the masters and
 * handed to the kernels (backend.h's bf16_weights). Dropped after the passes (weights_drop),
 * so that whatever changes the masters between them (the update, a checkpoint read, a
 * healing reload) can never leave the kernels a stale copy. */
static int weights_cast(eng_trainer_t *t)
{
    if (!t->w16)
        return 0;
    size_t n = eng_model_nparams(t->model);
    float *p = eng_model_params(t->model);
    int rc = eng_bf16_cast(t->be, t->w16, p, n, 1);
    if (rc == 0)
        t->be->bf16_weights(t->be, p, t->w16, n);
    return rc;
}

static void weights_drop(eng_trainer_t *t)
{
    if (t->w16)
        t->be->bf16_weights(t->be, NULL, NULL, 0);
}

/* Global batches one evaluation reads: eval_tokens over the global batch's tokens (at least
 * one), and no more than cover the validation set once. */
static uint64_t eval_batches(const eng_trainer_t *t)
{
    const ch_jobspec_t *s = &t->spec;
    uint64_t G = (uint64_t)s->parallel.micro_batch_size * s->parallel.microbatches * s->parallel.dp;
    uint64_t n = (uint64_t)s->train.eval_tokens / (G * s->model.seq_len);
    uint64_t all = (eng_data_windows(t->val) + G - 1) / G;
    if (n > all)
        n = all;
    return n ? n : 1;
}

int eng_trainer_evaluate(eng_trainer_t *t, double *val_loss)
{
    const ch_jobspec_t *s = &t->spec;
    if (!t->val)
        return CH_E_CONFIG;
    uint32_t micro = s->parallel.microbatches;
    uint64_t n = eval_batches(t);
    double sum = 0;
    int rc = 0;
    /* The live model's forward through the same schedule, with the loss's gradient scaled
     * by 0: every gradient stays exactly zero, so training continues unchanged, and every
     * layout's stages, TP slices and ZeRO-3 gathers work as in a step. */
    eng_stage_ops_t ops = {
        t, stage_forward, stage_backward, stage_weight, chunk_forward, chunk_backward};
    t->feed = t->val;
    rc = weights_cast(t);
    for (uint64_t e = 0; e < n && rc == 0; e++) {
        if (t->zero)
            eng_zero_begin_step(t->zero);
        t->step_now = e;
        t->grad_scale = 0;
        rc = eng_trainer_loss_begin(t);
        if (rc == 0)
            rc = eng_pipeline_run(&t->pipe, &ops, micro, NULL);
        if (rc == 0)
            rc = eng_trainer_readback(t, 0);
        sum += eng_trainer_loss_sum(t);
    }
    weights_drop(t);
    t->feed = t->data;
    if (rc < 0)
        return rc;
    int last = t->stage + 1 == t->stages;
    float l = last && t->tpr == 0 ? (float)sum : 0.0f;
    wrk_coll_group_t *order[3] = {t->tp, t->dp, t->pp};
    if ((t->tp || t->dp || t->pp) &&
        (rc = eng_trainer_reduce_small(t, &l, 1, WRK_COLL_SUM, order, 3)) < 0)
        return rc;
    *val_loss = (t->tp || t->dp || t->pp ? (double)l : sum) / ((double)micro * s->parallel.dp * n);
    return 0;
}

int eng_trainer_eval_due(const eng_trainer_t *t)
{
    const ch_jobspec_t *s = &t->spec;
    if (!t->val || t->next_step == 0)
        return 0;
    if (t->next_step == (uint64_t)s->train.steps)
        return 1;
    return s->train.eval_every > 0 && t->next_step % (uint64_t)s->train.eval_every == 0;
}

/* A skipped step's gradients, dropped: the slab's and ZeRO-3's shards are zero again, as
 * the fused update would have left them. */
static void drop_grads(eng_trainer_t *t)
{
    size_t n = eng_model_nparams(t->model);
    if (n)
        t->be->memset(t->be, eng_model_grads(t->model), 0, n * sizeof(float));
    if (t->zero)
        eng_zero_drop_grads(t->zero);
}

void eng_trainer_drill_nonfinite(eng_trainer_t *t, uint64_t batch)
{
    t->nan_batch = batch + 1;
}

/* The groups' communication times when a step starts: host waits plus device time
 * (group_ns), and the TP group's device time alone. */
typedef struct comm_mark {
    uint64_t tp, dp, pp, emb, d_tp;
} comm_mark_t;

/* A step's time split (info->time, bubble) from the marks at its start, its host time in
 * p2p calls, its backend timers tm and its seconds dt. */
static void step_times(const eng_trainer_t *t, const comm_mark_t *w, uint64_t p2p_ns,
                       const uint64_t *tm, double dt, eng_step_info_t *info)
{
    double tp_s = (double)(group_ns(t->tp) - w->tp) * 1e-9;
    double pp_all = (double)(group_ns(t->pp) - w->pp) * 1e-9;
    double p2p = (double)p2p_ns * 1e-9;
    /* The step's closing all-reduces over the pipeline column and the embedding group
     * (the loss and norm, the tied wte) wait for the other stages' flush: pipeline wait
     * too, and part of the bubble. */
    double pp_wait = pp_all + (double)(group_ns(t->emb) - w->emb) * 1e-9;
    info->time.tp = tp_s;
    info->time.pp_wait = pp_wait > p2p ? pp_wait : p2p;
    info->time.zero = (double)(group_ns(t->dp) - w->dp) * 1e-9;
    /* on a device the passes' time is the stream's, which waited for the TP group's
     * all-reduces (their device time; on the host, what it waited inside the passes) */
    uint64_t pass_comm = t->pass_comm_ns + wrk_coll_group_device_ns(t->tp) - w->d_tp;
    info->time.compute = t->pass_ns > pass_comm ? (double)(t->pass_ns - pass_comm) * 1e-9 : 0;
    info->time.optim = (double)tm[ENG_TIMER_OPTIM] * 1e-9;
    /* A GPU's collectives overlap its compute and each other (their device time includes
     * waiting for peers): the parts are made to sum to the step, the communication scaled
     * into what the update leaves, the compute into what remains. */
    double comm = info->time.tp + info->time.pp_wait + info->time.zero;
    double room = dt > info->time.optim ? dt - info->time.optim : 0;
    if (comm > room) {
        double k = room / comm;
        info->time.tp *= k;
        info->time.pp_wait *= k;
        info->time.zero *= k;
        comm = room;
    }
    if (info->time.compute > room - comm)
        info->time.compute = room - comm;
    info->bubble = t->stages > 1 ? info->time.pp_wait / dt : 0;
    double rest = dt - comm - info->time.compute - info->time.optim;
    info->time.idle = rest > 0 ? rest : 0;
}

int eng_trainer_step(eng_trainer_t *t, eng_step_info_t *info)
{
    const ch_jobspec_t *s = &t->spec;
    uint64_t step = t->next_step;
    if (step >= (uint64_t)s->train.steps)
        return CH_E_STATE;
    uint32_t B = s->parallel.micro_batch_size, T = s->model.seq_len;
    uint32_t micro = s->parallel.microbatches;
    double global_tokens = (double)B * T * micro * s->parallel.dp;
    uint64_t t0 = ch_now_ns();
    comm_mark_t w = {group_ns(t->tp), group_ns(t->dp), group_ns(t->pp), group_ns(t->emb),
                     wrk_coll_group_device_ns(t->tp)};

    eng_mem_mark(t->mem); /* the ledger's peaks: this step's */
    /* the slab's gradients are zero: left so by the previous step's fused update, or new */
    if (t->zero)
        eng_zero_begin_step(t->zero);
    t->step_now = ch_skip_batch_of(s->train.skip_steps, step);
    t->grad_scale = 1.0 / global_tokens;
    t->data_ns = t->pass_ns = t->pass_comm_ns = 0;
    uint64_t tm[ENG_TIMER_KINDS];
    timer_read(t, tm); /* what an evaluation or a checkpoint between steps marked: not ours */
    double loss_sum = 0, norm = 0;
    uint64_t p2p_ns = 0, op0[3];
    memcpy(op0, t->pipe.op_ns, sizeof op0);
    eng_stage_ops_t ops = {
        t, stage_forward, stage_backward, stage_weight, chunk_forward, chunk_backward};
    int rc = weights_cast(t);
    if (rc == 0)
        rc = eng_trainer_loss_begin(t);
    if (rc == 0)
        rc = eng_pipeline_run(&t->pipe, &ops, micro, &p2p_ns);
    weights_drop(t);
    if (rc == 0)
        rc = finish_grads(t, &loss_sum, &norm);
    if (rc < 0)
        return rc;
    if (t->nan_batch && t->nan_batch - 1 == t->step_now) /* every rank's drill: all agree */
        loss_sum = norm = NAN;
    int bad = !isfinite(loss_sum) || !isfinite(norm);
    if (bad && s->fault.nonfinite != CH_NONFINITE_SKIP) {
        if (info) {
            info->step = step;
            info->loss = loss_sum / ((double)micro * s->parallel.dp);
            info->grad_norm = norm;
        }
        return CH_E_NUMERIC;
    }
    timer_mark(t, ENG_TIMER_OPTIM, 1);
    double lr = eng_lr_at(&t->sched, (int64_t)step);
    if (bad) { /* skip: the update is dropped, as llm.c's outlier detector does */
        drop_grads(t);
    } else {
        float coef = eng_clip_coef(norm, t->optim.max_grad_norm);
        t->optim.t++;
        state_adamw(t, lr, coef);
    }
    timer_mark(t, ENG_TIMER_OPTIM, 0);
    /* the step's one host sync: the passes, the collectives the stream waited on and the
     * update are done, and the timers' events can be read. The collectives settle first,
     * polled with their timeout: a dead peer fails the step, it does not hang the sync. */
    if ((rc = wrk_coll_settle(eng_trainer_coll(t), -1)) < 0)
        return rc;
    if (t->be->sync && (rc = t->be->sync(t->be)) < 0)
        return rc; /* the update failed on the device: the step did not happen */
    timer_read(t, tm);
    t->pass_ns = tm[ENG_TIMER_PASS];
    /* ZeRO-3: the updated tensors outside blocks gathered for the next pass, and the
     * gathered blocks marked stale, so that a pass between steps (an evaluation) sees the
     * update too (ZeRO-3's time) */
    if (t->zero && (rc = eng_zero_gather_rest(t->zero)) < 0)
        return rc;
    if (t->zero)
        eng_zero_begin_step(t->zero);
    t->next_step = step + 1;

    uint64_t end = ch_now_ns();
    double dt = (double)(end - t0) * 1e-9;
    if (dt <= 0)
        dt = 1e-9;
    if (info) {
        info->step = step;
        info->loss = loss_sum / ((double)micro * s->parallel.dp);
        info->lr = lr;
        info->grad_norm = norm;
        info->seconds = dt;
        info->tokens_per_s = global_tokens / dt;
        /* this rank's share: its stage's part of its micro-batches, split over its TP group;
         * approximated as the model's FLOPs over pp */
        double flops = ch_plan_flops(&t->cfg, B * micro) / s->parallel.tp / t->stages;
        info->mfu = t->peak_flops > 0 ? flops / dt / t->peak_flops : 0;
        info->bubble = 0;
        info->skipped = bad;
        step_times(t, &w, p2p_ns, tm, dt, info);
        double per_mb = t->stages > 1 ? 1e-9 / micro : 0;
        info->pass.fwd = (double)(t->pipe.op_ns[ENG_PIPE_OP_FWD] - op0[0]) * per_mb;
        info->pass.bwd = (double)(t->pipe.op_ns[ENG_PIPE_OP_BWD] - op0[1]) * per_mb;
        info->pass.weight = (double)(t->pipe.op_ns[ENG_PIPE_OP_WEIGHT] - op0[2]) * per_mb;
        info->val_loss = NAN;
    }
    /* after the step's figures: an evaluation is not part of the step's time */
    if (eng_trainer_eval_due(t)) {
        double vl = NAN;
        if ((rc = eng_trainer_evaluate(t, &vl)) < 0)
            return rc;
        if (info)
            info->val_loss = vl;
    }
    return 0;
}

// ----------------------------------------------------------------------------
// accessors

void eng_trainer_memory(const eng_trainer_t *t, eng_trainer_memory_t *mem)
{
    size_t n = eng_model_nparams(t->model), zs = 0, zg = 0;
    if (t->zero)
        eng_zero_bytes(t->zero, &zs, &zg);
    /* the slab's parameters and gradients, Adam m and v (under ZeRO-3 the slab is the
     * gathered copy: eng_zero_bytes counts it) */
    mem->state_bytes = (t->zero ? 0 : 4 * n * sizeof(float)) + zs;
    mem->gathered_bytes = zg;
}

void eng_trainer_bf16_counts(const eng_trainer_t *t, eng_bf16_counts_t *out)
{
    if (t->bf16)
        eng_backend_bf16_counts(t->bf16, out);
    else
        *out = (eng_bf16_counts_t){0};
}

void eng_trainer_mem(const eng_trainer_t *t, eng_mem_stats_t *out)
{
    eng_mem_stats(t->mem, out);
}

uint64_t eng_trainer_next_step(const eng_trainer_t *t)
{
    return t->next_step;
}

uint64_t eng_trainer_total_steps(const eng_trainer_t *t)
{
    return (uint64_t)t->spec.train.steps;
}

const char *eng_trainer_job(const eng_trainer_t *t)
{
    return t->job;
}

double eng_trainer_peak_flops(const eng_trainer_t *t)
{
    return t->peak_flops;
}

eng_model_t *eng_trainer_model(eng_trainer_t *t)
{
    return t->model;
}

int eng_trainer_holds_whole_model(const eng_trainer_t *t)
{
    return !t->zero && t->stages == 1 && !t->tp;
}

eng_optim_t *eng_trainer_optim(eng_trainer_t *t)
{
    return &t->optim;
}

const eng_data_t *eng_trainer_data(const eng_trainer_t *t)
{
    return t->data;
}
