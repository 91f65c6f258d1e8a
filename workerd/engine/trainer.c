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
#include "common/safetensors.h"
#include "common/util.h"
#include "kernels/matmul.h"
#include "workerd/coll/coll.h"
#include "workerd/engine/ckpt.h"
#include "workerd/engine/pipeline.h"
#include "workerd/engine/tp.h"

struct eng_trainer {
    ch_jobspec_t spec;
    char job[64];
    eng_config_t cfg;
    eng_model_t *model;
    eng_optim_t optim;
    eng_data_t *data;
    eng_lr_t sched;
    int32_t *inputs, *targets; /* one micro-batch, [B, T] */
    uint64_t next_step;
    double peak_flops;
    const eng_groups_t *groups; /* borrowed; NULL for a world of one */
    wrk_coll_group_t *dp;       /* groups->dp: NULL when dp == 1 */
    float *dp_grads;            /* dp > 1: the model's gradients, in the collectives' memory */
    uint32_t dp_rank, rank;
    /* pipeline (pp > 1): this stage's blocks [first, last), the schedule, and one acts and
     * one [B,T,C] buffer per slot (the embedding's output on stage 0, the last block's on
     * the last stage) */
    uint32_t stage, stages, first, last;
    eng_pipeline_t pipe;
    eng_acts_t **acts;
    float *mid, *grad; /* slots * B*T*C; B*T*C scratch for the gradient inside the stage */
    uint64_t step_now;
    double loss_sum, grad_scale;
};

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

// ----------------------------------------------------------------------------
// pipeline parallel: the stage step the 1F1B schedule drives (pipeline.h)
//
// The model object holds every block (the stage-only model comes with the TP engineer's
// model options); this stage runs and updates only its range, plus the embedding on the
// first stage and ln_f and the tied head on the last. Parameter memory is therefore that
// of the whole model, not of the stage.

static void pipe_fini(eng_trainer_t *t)
{
    if (t->acts)
        for (uint32_t i = 0; i < t->pipe.slots; i++)
            eng_acts_destroy(t->acts[i]);
    free(t->acts);
    t->acts = NULL;
    eng_pipeline_fini(&t->pipe);
    free(t->mid);
    free(t->grad);
    t->mid = t->grad = NULL;
}

static int pipe_init(eng_trainer_t *t, uint32_t B, uint32_t T)
{
    const eng_groups_t *g = t->groups;
    uint32_t count = 0;
    ch_layout_stage_blocks(t->cfg.layers, t->stages, t->stage, &t->first, &count);
    t->last = t->first + count;
    if (count == 0)
        return CH_E_CONFIG;
    size_t n = (size_t)B * T * t->cfg.embd;
    uint32_t m = t->spec.parallel.microbatches;
    int rc = eng_pipeline_init(&t->pipe, g->pp, t->stages, t->stage, g->pp_prev, g->pp_next, m, n);
    if (rc < 0)
        return rc;
    uint32_t slots = t->pipe.slots;
    t->acts = calloc(slots, sizeof *t->acts);
    t->mid = calloc((size_t)slots * n, sizeof *t->mid);
    t->grad = calloc(n, sizeof *t->grad);
    if (!t->acts || !t->mid || !t->grad)
        return -ENOMEM;
    for (uint32_t i = 0; i < slots; i++)
        if ((rc = eng_acts_create(t->model, B, &t->acts[i])) < 0)
            return rc;
    return 0;
}

static int stage_forward(void *ctx, uint32_t mb, uint32_t slot, const float *x, float *y)
{
    eng_trainer_t *t = ctx;
    const ch_jobspec_t *s = &t->spec;
    uint32_t B = s->parallel.micro_batch_size, T = s->model.seq_len;
    size_t n = (size_t)B * T * t->cfg.embd;
    eng_acts_t *a = t->acts[slot];
    float *mid = t->mid + (size_t)slot * n;
    int first = t->stage == 0, last = t->stage + 1 == t->stages;
    int rc = 0;
    if (first || last)
        eng_data_micro_batch(t->data, t->step_now, t->dp_rank, mb, s->parallel.microbatches, B,
                             t->inputs, t->targets);
    if (first) {
        rc = eng_model_embed_forward(t->model, a, t->inputs, B, T, mid);
        x = mid;
    }
    if (rc == 0)
        rc = eng_model_blocks_forward(t->model, a, t->first, t->last, x, last ? mid : y, B, T);
    if (rc == 0 && last) {
        float loss = 0;
        rc = eng_model_head_forward(t->model, a, mid, t->targets, B, T, &loss);
        t->loss_sum += loss;
    }
    return rc;
}

static int stage_backward(void *ctx, uint32_t mb, uint32_t slot, const float *dy, float *dx)
{
    eng_trainer_t *t = ctx;
    (void)mb;
    eng_acts_t *a = t->acts[slot];
    int first = t->stage == 0, last = t->stage + 1 == t->stages;
    int rc = 0;
    if (last) {
        rc = eng_model_head_backward(t->model, a, (float)t->grad_scale, t->grad);
        dy = t->grad;
    }
    if (rc == 0)
        rc = eng_model_blocks_backward(t->model, a, t->first, t->last, dy, first ? t->grad : dx);
    if (rc == 0 && first)
        rc = eng_model_embed_backward(t->model, a, t->grad);
    return rc;
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
    if (spec->parallel.tp != 1 && spec->parallel.pp != 1)
        return ch_errf(err, errlen, CH_E_CONFIG,
                       "parallel: layout tp=%u pp=%u dp=%u: tensor and pipeline parallelism are "
                       "not combined yet; use tp = 1 or pp = 1 (dp may be larger)",
                       spec->parallel.tp, spec->parallel.pp, spec->parallel.dp);
    const eng_groups_t *groups = opts ? opts->groups : NULL;
    ch_layout_t l = ch_jobspec_layout(spec);
    if (groups &&
        (groups->layout.tp != l.tp || groups->layout.pp != l.pp || groups->layout.dp != l.dp))
        return ch_errf(err, errlen, CH_E_CONFIG,
                       "parallel: the rank's groups were built for tp=%u pp=%u dp=%u, the job "
                       "has tp=%u pp=%u dp=%u",
                       groups->layout.tp, groups->layout.pp, groups->layout.dp, l.tp, l.pp, l.dp);
    if (spec->parallel.tp > 1 && (!groups || !groups->tp))
        return ch_errf(err, errlen, CH_E_CONFIG,
                       "parallel.tp = %u: the rank has no tensor-parallel group of that size",
                       spec->parallel.tp);
    if (spec->parallel.dp > 1 && (!groups || !groups->dp))
        return ch_errf(err, errlen, CH_E_CONFIG,
                       "parallel.dp = %u: the rank has no data-parallel group of that size",
                       spec->parallel.dp);
    if (spec->parallel.pp > 1 && (!groups || !groups->pp))
        return ch_errf(err, errlen, CH_E_CONFIG,
                       "parallel.pp = %u: the rank has no pipeline group of that size",
                       spec->parallel.pp);
    t = calloc(1, sizeof *t);
    if (!t)
        return -ENOMEM;
    t->spec = *spec;
    t->stages = 1;
    if (groups) {
        t->groups = groups;
        t->dp = groups->dp;
        t->dp_rank = groups->coord.dp;
        t->rank = groups->rank;
        t->stage = groups->coord.pp;
        t->stages = spec->parallel.pp;
    }
    snprintf(t->job, sizeof t->job, "%s", opts && opts->job_id ? opts->job_id : spec->name);
    t->cfg.layers = spec->model.layers;
    t->cfg.heads = spec->model.heads;
    t->cfg.embd = spec->model.embd;
    t->cfg.vocab = spec->model.vocab;
    t->cfg.padded_vocab = ch_layout_padded_vocab(spec->model.vocab, spec->parallel.tp);
    t->cfg.seq_len = spec->model.seq_len;
    t->sched = eng_lr_from_spec(spec);

    uint32_t B = spec->parallel.micro_batch_size, T = spec->model.seq_len;
    rc = eng_data_open(spec->train.data, spec->model.vocab, T, spec->train.seed, &t->data, err,
                       errlen);
    if (rc < 0)
        goto out;
    eng_model_opts_t mopts = {0};
    if (groups && groups->tp) {
        mopts.tp = spec->parallel.tp;
        mopts.tp_rank = groups->coord.tp;
        mopts.tp_group = groups->tp;
    }
    rc = eng_model_create_opts(&t->cfg, &mopts, B, spec->train.seed, &t->model);
    if (rc < 0) {
        ch_errf(err, errlen, rc, "model: %s", ch_strerror(rc));
        goto out;
    }
    t->cfg = *eng_model_config(t->model);
    rc = eng_optim_init(&t->optim, eng_model_nparams(t->model));
    if (rc < 0)
        goto out;
    if (t->dp) {
        /* what same-host members of the DP group reduce in place (coll.h) */
        rc = wrk_coll_mem_alloc(wrk_coll_group_context(t->dp),
                                eng_model_nparams(t->model) * sizeof(float), (void **)&t->dp_grads);
        if (rc < 0)
            goto out;
        eng_model_lend_grads(t->model, t->dp_grads);
    }
    if (t->stages > 1) {
        rc = pipe_init(t, B, T);
        if (rc < 0)
            goto out;
    }
    t->inputs = malloc((size_t)B * T * sizeof *t->inputs);
    t->targets = malloc((size_t)B * T * sizeof *t->targets);
    if (!t->inputs || !t->targets) {
        rc = -ENOMEM;
        goto out;
    }
    t->peak_flops =
        opts && opts->peak_flops > 0 ? opts->peak_flops : eng_measure_peak_flops(256, 0.2);
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
    eng_optim_fini(&t->optim);
    eng_model_destroy(t->model);
    if (t->dp_grads)
        wrk_coll_mem_free(wrk_coll_group_context(t->dp), t->dp_grads);
    eng_data_close(t->data);
    free(t);
}

// ----------------------------------------------------------------------------
// init_from: a Hugging Face GPT-2 safetensors file

static void shape_str(char *out, size_t cap, uint32_t ndim, const uint64_t *dims)
{
    size_t n = (size_t)snprintf(out, cap, "[");
    for (uint32_t d = 0; d < ndim && n < cap; d++)
        n += (size_t)snprintf(out + n, cap - n, "%s%" PRIu64, d ? ", " : "", dims[d]);
    if (n < cap)
        snprintf(out + n, cap - n, "]");
}

static const ch_st_tensor_t *find_hf(const ch_st_file_t *f, const char *name)
{
    char prefixed[96];
    const ch_st_tensor_t *st = ch_st_find(f, name);
    if (st)
        return st;
    snprintf(prefixed, sizeof prefixed, "transformer.%s", name);
    return ch_st_find(f, prefixed);
}

int eng_trainer_init_from(eng_trainer_t *t, const char *path, char *err, size_t errlen)
{
    ch_st_file_t *f = NULL;
    int rc = ch_st_open(path, &f, err, errlen);
    if (rc < 0)
        return rc;
    float *params = eng_model_params(t->model);
    for (size_t i = 0; i < eng_model_ntensors(t->model); i++) {
        const eng_tensor_t *mt = eng_model_tensor(t->model, i);
        const ch_st_tensor_t *st = find_hf(f, mt->name);
        size_t full = (size_t)mt->shape[0] * (mt->ndim == 2 ? mt->shape[1] : 1);
        if (!st) {
            rc = ch_errf(err, errlen, CH_E_FORMAT, "%s: tensor \"%s\" missing", path, mt->name);
            goto out;
        }
        if (st->ndim != mt->ndim || st->shape[0] != mt->shape[0] ||
            (mt->ndim == 2 && st->shape[1] != mt->shape[1])) {
            char have[48], want[48];
            uint64_t wdims[2] = {mt->shape[0], mt->shape[1]};
            shape_str(have, sizeof have, st->ndim, st->shape);
            shape_str(want, sizeof want, mt->ndim, wdims);
            rc = ch_errf(err, errlen, CH_E_FORMAT,
                         "%s: tensor \"%s\" has shape %s but the job's model needs %s (check "
                         "[model] against the file)",
                         path, st->name, have, want);
            goto out;
        }
        if (mt->numel < full) {
            rc = ch_errf(err, errlen, -ENOTSUP, "%s: sharded tensors are not supported yet", path);
            goto out;
        }
        rc = ch_st_read_f32(f, st, params + mt->offset, err, errlen);
        if (rc < 0)
            goto out;
        memset(params + mt->offset + full, 0, (mt->numel - full) * sizeof(float));
    }
out:
    ch_st_close(f);
    return rc;
}

// ----------------------------------------------------------------------------
// checkpoints

static void fill_meta(const eng_trainer_t *t, eng_ckpt_meta_t *m)
{
    memset(m, 0, sizeof *m);
    snprintf(m->job, sizeof m->job, "%s", t->job);
    m->step = t->next_step;
    m->layout = ch_jobspec_layout(&t->spec);
    m->rank = t->rank;
    m->world = ch_layout_world(m->layout); /* every rank of the job, tp * pp * dp */
    m->cfg = t->cfg;
    m->seed = t->spec.train.seed;
    m->data_seed = eng_data_seed(t->data);
}

int eng_trainer_resume(eng_trainer_t *t, uint64_t step, char *err, size_t errlen)
{
    char sdir[CH_PATH_LEN];
    eng_ckpt_meta_t expect;
    uint64_t got = 0;
    if (!t->spec.checkpoint.dir[0])
        return ch_errf(err, errlen, CH_E_CONFIG, "checkpoint.dir: not set, nothing to resume from");
    int rc = eng_ckpt_step_dir(t->spec.checkpoint.dir, t->job, step, sdir, sizeof sdir);
    if (rc < 0)
        return ch_errf(err, errlen, rc, "checkpoint.dir: path too long");
    fill_meta(t, &expect);
    rc = eng_ckpt_restore(sdir, &expect, t->model, &t->optim, &got, err, errlen);
    if (rc < 0)
        return rc;
    if (got != step || got > (uint64_t)t->spec.train.steps)
        return ch_errf(err, errlen, CH_E_FORMAT, "%s: holds step %" PRIu64 ", expected %" PRIu64,
                       sdir, got, step);
    t->next_step = step;
    return 0;
}

int eng_trainer_checkpoint_due(const eng_trainer_t *t)
{
    const ch_jobspec_t *s = &t->spec;
    if (!s->checkpoint.dir[0] || t->next_step == 0)
        return 0;
    if (t->next_step == (uint64_t)s->train.steps)
        return 1;
    return s->checkpoint.every > 0 && t->next_step % (uint64_t)s->checkpoint.every == 0;
}

/* Every rank has written its shard: rank 0 writes the manifest naming all of them (world
 * size 1: its own) and prunes; the others wait until it has, so a checkpoint a rank
 * reports is committed. */
static int commit(eng_trainer_t *t, const eng_ckpt_meta_t *meta, const eng_ckpt_file_t *mine,
                  char *err, size_t errlen)
{
    uint32_t dp = t->spec.parallel.dp, n = dp * t->stages;
    wrk_coll_group_t *pp = t->stages > 1 ? t->groups->pp : NULL;
    eng_ckpt_file_t *files = calloc(n, sizeof *files);
    if (!files)
        return -ENOMEM;
    int rc = 0;
    eng_ckpt_file_t *row = files + (size_t)t->stage * dp; /* this stage's DP ranks */
    row[t->dp_rank] = *mine;
    if (t->dp && (rc = wrk_coll_allgather(t->dp, mine, row, sizeof *mine, WRK_COLL_U8, NULL)) < 0) {
        ch_errf(err, errlen, rc, "gathering the shards' checksums: %s", ch_strerror(rc));
        goto out;
    }
    if (pp && (rc = wrk_coll_allgather(pp, row, files, dp * sizeof *mine, WRK_COLL_U8, NULL)) < 0) {
        ch_errf(err, errlen, rc, "gathering the stages' checksums: %s", ch_strerror(rc));
        goto out;
    }
    if (t->dp_rank == 0 && t->stage == 0) {
        rc = eng_ckpt_write_manifest(t->spec.checkpoint.dir, meta, files, n, err, errlen);
        if (rc == 0 && eng_ckpt_prune(t->spec.checkpoint.dir, t->job, t->spec.checkpoint.keep) < 0)
            CH_LOGW("train", "job=%s pruning old checkpoints failed", t->job);
    }
    /* rank 0's outcome travels with the barrier: a failed commit fails every rank */
    float failed = rc < 0 ? 1.0f : 0.0f;
    int brc = 0;
    if (pp)
        brc = wrk_coll_allreduce(pp, &failed, &failed, 1, WRK_COLL_F32, WRK_COLL_MAX, NULL);
    if (t->dp && brc == 0)
        brc = wrk_coll_allreduce(t->dp, &failed, &failed, 1, WRK_COLL_F32, WRK_COLL_MAX, NULL);
    if (rc == 0 && brc < 0)
        rc = ch_errf(err, errlen, brc, "committing the checkpoint: %s", ch_strerror(brc));
    else if (rc == 0 && failed != 0.0f)
        rc = ch_errf(err, errlen, CH_E_STATE, "rank 0 could not commit the checkpoint");
out:
    free(files);
    return rc;
}

int eng_trainer_checkpoint(eng_trainer_t *t, uint64_t *bytes, uint64_t *checksum, char *err,
                           size_t errlen)
{
    eng_ckpt_meta_t meta;
    eng_ckpt_file_t file = {0, 0, 0};
    const char *dir = t->spec.checkpoint.dir;
    if (!dir[0])
        return ch_errf(err, errlen, CH_E_CONFIG, "checkpoint.dir: not set");
    fill_meta(t, &meta);
    file.rank = t->rank;
    int rc =
        eng_ckpt_save(dir, &meta, t->model, &t->optim, &file.bytes, &file.checksum, err, errlen);
    if (rc < 0)
        return rc;
    rc = commit(t, &meta, &file, err, errlen);
    if (rc < 0)
        return rc;
    if (bytes)
        *bytes = file.bytes;
    if (checksum)
        *checksum = file.checksum;
    return 0;
}

// ----------------------------------------------------------------------------
// one step

/* One step's micro-batches through the 1F1B schedule, then the gradients made whole: the
 * tied wte's two halves summed over the embedding group (first and last stage), every
 * gradient summed over the DP group, the global norm summed over the pipeline column (wte
 * counted once, on stage 0) and clipped. *loss_sum: the global batch's sum of micro-batch
 * mean losses, the same on every rank. */
static int pipe_step(eng_trainer_t *t, uint64_t step, double global_tokens, double *loss_sum,
                     double *norm, uint64_t *wait_ns)
{
    const eng_groups_t *g = t->groups;
    float *grads = eng_model_grads(t->model);
    size_t n = eng_model_nparams(t->model);
    const eng_tensor_t *wte = eng_model_find(t->model, "wte.weight");
    eng_stage_ops_t ops = {t, stage_forward, stage_backward};
    t->step_now = step;
    t->loss_sum = 0;
    t->grad_scale = 1.0 / global_tokens;
    int rc = eng_pipeline_run(&t->pipe, &ops, t->spec.parallel.microbatches, wait_ns);
    if (rc == 0 && g->emb)
        rc = wrk_coll_allreduce(g->emb, grads + wte->offset, grads + wte->offset, wte->numel,
                                WRK_COLL_F32, WRK_COLL_SUM, NULL);
    if (rc == 0 && t->dp)
        rc = wrk_coll_allreduce(t->dp, grads, grads, n, WRK_COLL_F32, WRK_COLL_SUM, NULL);
    /* the loss lives on the last stage: the others add zero */
    float l[2] = {t->stage + 1 == t->stages ? (float)t->loss_sum : 0.0f, 0.0f};
    if (rc == 0 && t->dp)
        rc = wrk_coll_allreduce(t->dp, l, l, 1, WRK_COLL_F32, WRK_COLL_SUM, NULL);
    /* Only this stage's tensors have gradients (the rest of the slab is zero); the last
     * stage leaves out its copy of wte, which stage 0 counts. */
    size_t skip = t->stage + 1 == t->stages ? wte->offset + wte->numel : 0;
    double sq = eng_grad_norm(grads + skip, n - skip);
    l[1] = (float)(sq * sq);
    if (rc == 0)
        rc = wrk_coll_allreduce(g->pp, l, l, 2, WRK_COLL_F32, WRK_COLL_SUM, NULL);
    if (rc < 0)
        return rc;
    *loss_sum = l[0];
    *norm = sqrt((double)l[1]);
    double coef = t->optim.max_grad_norm / (*norm + 1e-6);
    if (coef < 1.0) {
        float c = (float)coef; /* as eng_grad_clip */
        for (size_t i = 0; i < n; i++)
            grads[i] *= c;
    }
    return 0;
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

    eng_model_zero_grad(t->model);
    double loss_sum = 0, norm = 0;
    uint64_t wait_ns = 0;
    int rc = 0;
    if (t->stages > 1) {
        rc = pipe_step(t, step, global_tokens, &loss_sum, &norm, &wait_ns);
        if (rc < 0)
            return rc;
    } else {
        for (uint32_t k = 0; k < micro; k++) {
            float loss = 0;
            eng_data_micro_batch(t->data, step, t->dp_rank, k, micro, B, t->inputs, t->targets);
            rc = eng_model_forward(t->model, t->inputs, t->targets, B, T, &loss);
            if (rc < 0)
                return rc;
            rc = eng_model_backward(t->model, (float)(1.0 / global_tokens));
            if (rc < 0)
                return rc;
            loss_sum += loss;
        }
        if (t->dp) {
            /* Each rank's gradients carry 1/(global tokens): their sum is the global mean.
             * Every rank then clips and updates the same numbers in the same order. */
            float l = (float)loss_sum;
            rc = wrk_coll_allreduce(t->dp, eng_model_grads(t->model), eng_model_grads(t->model),
                                    eng_model_nparams(t->model), WRK_COLL_F32, WRK_COLL_SUM, NULL);
            if (rc == 0)
                rc = wrk_coll_allreduce(t->dp, &l, &l, 1, WRK_COLL_F32, WRK_COLL_SUM, NULL);
            if (rc < 0)
                return rc;
            loss_sum = l;
        }
        if (t->groups && t->groups->tp) {
            /* replicated tensors counted once across the TP group */
            rc = eng_tp_grad_clip(t->model, t->groups->tp, t->optim.max_grad_norm, &norm);
            if (rc < 0)
                return rc;
        } else {
            norm = eng_grad_clip(eng_model_grads(t->model), eng_model_nparams(t->model),
                                 t->optim.max_grad_norm);
        }
    }
    double lr = eng_lr_at(&t->sched, (int64_t)step);
    rc = eng_optim_step(&t->optim, t->model, lr);
    if (rc < 0)
        return rc;
    t->next_step = step + 1;

    double dt = (double)(ch_now_ns() - t0) * 1e-9;
    if (dt <= 0)
        dt = 1e-9;
    if (info) {
        info->step = step;
        info->loss = loss_sum / ((double)micro * s->parallel.dp);
        info->lr = lr;
        info->grad_norm = norm;
        info->seconds = dt;
        info->tokens_per_s = global_tokens / dt;
        /* this rank's share: its micro-batches, split over its TP group */
        double flops = ch_plan_flops(&t->cfg, B * micro) / s->parallel.tp;
        info->mfu = t->peak_flops > 0 ? flops / dt / t->peak_flops : 0;
        info->bubble = t->stages > 1 ? (double)wait_ns * 1e-9 / dt : 0;
    }
    return 0;
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

eng_optim_t *eng_trainer_optim(eng_trainer_t *t)
{
    return &t->optim;
}

const eng_data_t *eng_trainer_data(const eng_trainer_t *t)
{
    return t->data;
}
