/* Training driver for one rank (trainer.h). */
#include "workerd/engine/trainer.h"

#include <errno.h>
#include <inttypes.h>
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
    if (spec->parallel.pp != 1)
        return ch_errf(err, errlen, CH_E_CONFIG,
                       "parallel: layout tp=%u pp=%u dp=%u: pipeline parallel training needs the "
                       "3D engine (coming); use pp = 1 (tp and dp may be larger)",
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
    t = calloc(1, sizeof *t);
    if (!t)
        return -ENOMEM;
    t->spec = *spec;
    if (groups) {
        t->groups = groups;
        t->dp = groups->dp;
        t->dp_rank = groups->coord.dp;
        t->rank = groups->rank;
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
    uint32_t n = t->spec.parallel.dp;
    eng_ckpt_file_t *files = calloc(n, sizeof *files);
    if (!files)
        return -ENOMEM;
    int rc = 0;
    files[t->dp_rank] = *mine;
    if (t->dp &&
        (rc = wrk_coll_allgather(t->dp, mine, files, sizeof *mine, WRK_COLL_U8, NULL)) < 0) {
        ch_errf(err, errlen, rc, "gathering the shards' checksums: %s", ch_strerror(rc));
        goto out;
    }
    if (t->dp_rank == 0) {
        rc = eng_ckpt_write_manifest(t->spec.checkpoint.dir, meta, files, n, err, errlen);
        if (rc == 0 && eng_ckpt_prune(t->spec.checkpoint.dir, t->job, t->spec.checkpoint.keep) < 0)
            CH_LOGW("train", "job=%s pruning old checkpoints failed", t->job);
    }
    if (t->dp) {
        /* rank 0's outcome travels with the barrier: a failed commit fails every rank */
        float failed = rc < 0 ? 1.0f : 0.0f;
        int brc = wrk_coll_allreduce(t->dp, &failed, &failed, 1, WRK_COLL_F32, WRK_COLL_MAX, NULL);
        if (rc == 0 && brc < 0)
            rc = ch_errf(err, errlen, brc, "committing the checkpoint: %s", ch_strerror(brc));
        else if (rc == 0 && failed != 0.0f)
            rc = ch_errf(err, errlen, CH_E_STATE, "rank 0 could not commit the checkpoint");
    }
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
    double loss_sum = 0;
    for (uint32_t k = 0; k < micro; k++) {
        float loss = 0;
        eng_data_micro_batch(t->data, step, t->dp_rank, k, micro, B, t->inputs, t->targets);
        int rc = eng_model_forward(t->model, t->inputs, t->targets, B, T, &loss);
        if (rc < 0)
            return rc;
        rc = eng_model_backward(t->model, (float)(1.0 / global_tokens));
        if (rc < 0)
            return rc;
        loss_sum += loss;
    }
    if (t->dp) {
        /* Each rank's gradients carry 1/(global tokens): their sum is the global mean. Every
         * rank then clips and updates the same numbers in the same order. */
        float l = (float)loss_sum;
        int rc = wrk_coll_allreduce(t->dp, eng_model_grads(t->model), eng_model_grads(t->model),
                                    eng_model_nparams(t->model), WRK_COLL_F32, WRK_COLL_SUM, NULL);
        if (rc == 0)
            rc = wrk_coll_allreduce(t->dp, &l, &l, 1, WRK_COLL_F32, WRK_COLL_SUM, NULL);
        if (rc < 0)
            return rc;
        loss_sum = l;
    }
    double norm = 0;
    if (t->groups && t->groups->tp) {
        /* replicated tensors counted once across the TP group */
        int rc = eng_tp_grad_clip(t->model, t->groups->tp, t->optim.max_grad_norm, &norm);
        if (rc < 0)
            return rc;
    } else {
        norm = eng_grad_clip(eng_model_grads(t->model), eng_model_nparams(t->model),
                             t->optim.max_grad_norm);
    }
    double lr = eng_lr_at(&t->sched, (int64_t)step);
    int rc = eng_optim_step(&t->optim, t->model, lr);
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
