/* Checkpoint shards of a model: save and restore (ckpt.h). The file side (paths,
 * metadata, manifests) is ckpt_file.c. */
#include "workerd/engine/ckpt.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/log.h"
#include "common/util.h"

/* Elements of tensor t stored in a shard: its full Hugging Face shape (wte's padding
 * rows are zero by construction and not stored). */
static int stored_numel(const eng_tensor_t *t, size_t *n)
{
    size_t full = t->shape[0] * (t->ndim == 2 ? t->shape[1] : 1);
    if (t->numel < full)
        return -ENOTSUP; /* a slice: needs the parallel engine's slice metadata */
    *n = full;
    return 0;
}

// ----------------------------------------------------------------------------

// ----------------------------------------------------------------------------
// save

static int add_tensor(ch_st_writer_t *w, const char *prefix, const eng_tensor_t *t,
                      const float *slab)
{
    char name[96];
    size_t n;
    int rc = stored_numel(t, &n);
    if (rc < 0)
        return rc;
    snprintf(name, sizeof name, "%s%s", prefix, t->name);
    uint64_t shape[2] = {t->shape[0], t->ndim == 2 ? t->shape[1] : 0};
    return ch_st_writer_add(w, name, CH_ST_F32, t->ndim, shape, slab + t->offset);
}

int eng_ckpt_save(const char *dir, const eng_ckpt_meta_t *meta, eng_model_t *m,
                  const eng_optim_t *o, uint64_t *bytes, uint64_t *checksum, char *err,
                  size_t errlen)
{
    char sdir[CH_PATH_LEN], path[CH_PATH_LEN + 32];
    ch_st_writer_t *w = NULL;
    int rc;

    if (o->n != eng_model_nparams(m))
        return ch_errf(err, errlen, -EINVAL, "checkpoint: optimizer state does not match model");
    CH_CHECK_GOTO(eng_ckpt_step_dir(dir, meta->job, meta->step, sdir, sizeof sdir), rc, fail);
    CH_CHECK_GOTO(ch_mkdirs(sdir, 0755), rc, fail);
    CH_CHECK_GOTO(eng_ckpt_shard_path(sdir, meta->rank, path, sizeof path), rc, fail);
    CH_CHECK_GOTO(ch_st_writer_create(path, &w), rc, fail);
    CH_CHECK_GOTO(eng_ckpt_put_meta(w, meta, o->t), rc, fail);
    const char *prefixes[3] = {"", "optim.m.", "optim.v."};
    const float *slabs[3] = {eng_model_params(m), o->m, o->v};
    for (int k = 0; k < 3; k++)
        for (size_t i = 0; i < eng_model_ntensors(m); i++)
            CH_CHECK_GOTO(add_tensor(w, prefixes[k], eng_model_tensor(m, i), slabs[k]), rc, fail);
    /* finish destroys the writer and names the file in err on failure */
    return ch_st_writer_finish(w, bytes, checksum, err, errlen);
fail:
    ch_st_writer_destroy(w);
    return ch_errf(err, errlen, rc, "%s/%s/step-%08" PRIu64 ": checkpoint: %s", dir, meta->job,
                   meta->step, ch_strerror(rc));
}

static int load_tensor(const ch_st_file_t *f, const char *prefix, const eng_tensor_t *t,
                       float *slab, char *err, size_t errlen)
{
    char name[96];
    size_t n;
    snprintf(name, sizeof name, "%s%s", prefix, t->name);
    const ch_st_tensor_t *st = ch_st_find(f, name);
    int rc = stored_numel(t, &n);
    if (rc < 0)
        return ch_errf(err, errlen, rc, "%s: %s: sharded tensors are not supported yet",
                       ch_st_path(f), name);
    if (!st)
        return ch_errf(err, errlen, CH_E_FORMAT, "%s: tensor \"%s\" missing", ch_st_path(f), name);
    if (st->dtype != CH_ST_F32 || st->ndim != t->ndim || st->shape[0] != t->shape[0] ||
        (t->ndim == 2 && st->shape[1] != t->shape[1])) {
        char want[32];
        if (t->ndim == 2)
            snprintf(want, sizeof want, "[%u, %u]", t->shape[0], t->shape[1]);
        else
            snprintf(want, sizeof want, "[%u]", t->shape[0]);
        return ch_errf(err, errlen, CH_E_FORMAT,
                       "%s: tensor \"%s\" is %s with %u dims (first %" PRIu64
                       "), the model wants F32 %s",
                       ch_st_path(f), name, ch_st_dtype_name(st->dtype), st->ndim,
                       st->ndim ? st->shape[0] : 0, want);
    }
    float *dst = slab + t->offset;
    memcpy(dst, st->data, n * sizeof(float));
    memset(dst + n, 0, (t->numel - n) * sizeof(float)); /* wte padding rows */
    return 0;
}

int eng_ckpt_restore(const char *step_dir, const eng_ckpt_meta_t *expect, eng_model_t *m,
                     eng_optim_t *o, uint64_t *step, char *err, size_t errlen)
{
    char path[CH_PATH_LEN + 32];
    ch_st_file_t *f = NULL;
    eng_ckpt_meta_t got;
    int rc;

    if ((rc = eng_ckpt_shard_path(step_dir, expect->rank, path, sizeof path)) < 0)
        return ch_errf(err, errlen, rc, "%s: path too long", step_dir);
    CH_CHECK_GOTO(eng_ckpt_verify(step_dir, expect->rank, err, errlen), rc, out);
    CH_CHECK_GOTO(ch_st_open(path, &f, err, errlen), rc, out);
    CH_CHECK_GOTO(eng_ckpt_meta_of(f, &got, err, errlen), rc, out);
    if (got.layout.tp != expect->layout.tp || got.layout.pp != expect->layout.pp ||
        got.layout.dp != expect->layout.dp || got.world != expect->world ||
        got.rank != expect->rank) {
        rc = ch_errf(err, errlen, CH_E_CONFIG,
                     "%s: checkpoint of layout tp=%u pp=%u dp=%u (rank %u of %u) cannot resume "
                     "layout tp=%u pp=%u dp=%u (rank %u of %u); export it and start from the file",
                     path, got.layout.tp, got.layout.pp, got.layout.dp, got.rank, got.world,
                     expect->layout.tp, expect->layout.pp, expect->layout.dp, expect->rank,
                     expect->world);
        goto out;
    }
    const eng_config_t *a = &got.cfg, *b = &expect->cfg;
    if (a->layers != b->layers || a->heads != b->heads || a->embd != b->embd ||
        a->vocab != b->vocab || a->padded_vocab != b->padded_vocab || a->seq_len != b->seq_len) {
        rc =
            ch_errf(err, errlen, CH_E_CONFIG,
                    "%s: checkpoint model (layers %u heads %u embd %u vocab %u seq_len %u) differs "
                    "from the job's (layers %u heads %u embd %u vocab %u seq_len %u)",
                    path, a->layers, a->heads, a->embd, a->vocab, a->seq_len, b->layers, b->heads,
                    b->embd, b->vocab, b->seq_len);
        goto out;
    }
    uint64_t t;
    CH_CHECK_GOTO(eng_ckpt_meta_u64(f, "optim.t", &t, err, errlen), rc, out);
    const char *prefixes[3] = {"", "optim.m.", "optim.v."};
    float *slabs[3] = {eng_model_params(m), o->m, o->v};
    for (int k = 0; k < 3; k++)
        for (size_t i = 0; i < eng_model_ntensors(m); i++)
            CH_CHECK_GOTO(
                load_tensor(f, prefixes[k], eng_model_tensor(m, i), slabs[k], err, errlen), rc,
                out);
    o->t = t;
    *step = got.step;
out:
    ch_st_close(f);
    return rc;
}
