/* Checkpoint -> Hugging Face GPT-2 safetensors (export.h). */
#include "workerd/engine/export.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/safetensors.h"
#include "workerd/engine/ckpt_file.h"

static int is_model_tensor(const char *name)
{
    return strncmp(name, "optim.", 6) != 0;
}

/* Names and shapes every GPT-2 of cfg has; a shard missing one is incomplete. */
static int check_complete(const ch_st_file_t *f, const ch_model_cfg_t *cfg, char *err,
                          size_t errlen)
{
    static const char *const block[] = {
        "ln_1.weight",        "ln_1.bias",        "attn.c_attn.weight", "attn.c_attn.bias",
        "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight",        "ln_2.bias",
        "mlp.c_fc.weight",    "mlp.c_fc.bias",    "mlp.c_proj.weight",  "mlp.c_proj.bias",
    };
    char name[96];
    const ch_st_tensor_t *wte = ch_st_find(f, "wte.weight");
    if (!wte || wte->ndim != 2 || wte->shape[0] != cfg->vocab || wte->shape[1] != cfg->embd)
        return ch_errf(err, errlen, CH_E_FORMAT, "%s: wte.weight missing or not [%u, %u]",
                       ch_st_path(f), cfg->vocab, cfg->embd);
    const char *top[] = {"wpe.weight", "ln_f.weight", "ln_f.bias"};
    for (size_t i = 0; i < 3; i++)
        if (!ch_st_find(f, top[i]))
            return ch_errf(err, errlen, CH_E_FORMAT, "%s: tensor \"%s\" missing", ch_st_path(f),
                           top[i]);
    for (uint32_t l = 0; l < cfg->layers; l++) {
        for (size_t i = 0; i < sizeof block / sizeof block[0]; i++) {
            snprintf(name, sizeof name, "h.%u.%s", l, block[i]);
            if (!ch_st_find(f, name))
                return ch_errf(err, errlen, CH_E_FORMAT, "%s: tensor \"%s\" missing", ch_st_path(f),
                               name);
        }
    }
    return 0;
}

int eng_export(const char *ckpt_step_dir, const char *out_file, char *err, size_t errlen)
{
    char path[4096], v[32];
    ch_st_file_t *f = NULL;
    ch_st_writer_t *w = NULL;
    eng_ckpt_meta_t meta;
    int rc;

    if (err && errlen)
        err[0] = '\0';
    if ((size_t)snprintf(path, sizeof path, "%s/rank-00000.safetensors", ckpt_step_dir) >=
        sizeof path)
        return ch_errf(err, errlen, -ENAMETOOLONG, "%s: path too long", ckpt_step_dir);
    rc = eng_ckpt_verify(ckpt_step_dir, 0, err, errlen);
    if (rc < 0)
        goto out;
    rc = ch_st_open(path, &f, err, errlen);
    if (rc < 0)
        goto out;
    rc = eng_ckpt_meta_of(f, &meta, err, errlen);
    if (rc < 0)
        goto out;
    const char *shard = ch_st_meta(f, "shard");
    /* Data-parallel ranks hold whole replicas: rank 0's shard is the model. */
    if (meta.layout.tp != 1 || meta.layout.pp != 1 || !shard || strcmp(shard, "full") != 0) {
        rc = ch_errf(err, errlen, CH_E_CONFIG,
                     "%s: a checkpoint of world size %u (tp=%u pp=%u dp=%u) has sliced shards; "
                     "joining them needs the parallel engine's export (coming)",
                     ckpt_step_dir, meta.world, meta.layout.tp, meta.layout.pp, meta.layout.dp);
        goto out;
    }
    rc = check_complete(f, &meta.cfg, err, errlen);
    if (rc < 0)
        goto out;
    rc = ch_st_writer_create(out_file, &w);
    if (rc < 0)
        goto out;
    for (size_t i = 0; i < ch_st_count(f) && rc == 0; i++) {
        const ch_st_tensor_t *t = ch_st_at(f, i);
        if (!is_model_tensor(t->name))
            continue;
        if (t->dtype != CH_ST_F32) {
            rc = ch_errf(err, errlen, CH_E_FORMAT, "%s: tensor \"%s\" is %s, expected F32", path,
                         t->name, ch_st_dtype_name(t->dtype));
            break;
        }
        rc = ch_st_writer_add(w, t->name, CH_ST_F32, t->ndim, t->shape, t->data);
    }
    const struct {
        const char *key;
        uint64_t val;
    } meta_u[] = {
        {"n_layer", meta.cfg.layers},      {"n_head", meta.cfg.heads},
        {"n_embd", meta.cfg.embd},         {"vocab_size", meta.cfg.vocab},
        {"n_positions", meta.cfg.seq_len}, {"chorus.step", meta.step},
    };
    if (rc == 0)
        rc = ch_st_writer_meta(w, "format", "pt");
    if (rc == 0)
        rc = ch_st_writer_meta(w, "chorus.job", meta.job);
    for (size_t i = 0; i < sizeof meta_u / sizeof meta_u[0] && rc == 0; i++) {
        snprintf(v, sizeof v, "%" PRIu64, meta_u[i].val);
        rc = ch_st_writer_meta(w, meta_u[i].key, v);
    }
    if (rc < 0) {
        if (err && errlen && !err[0])
            ch_errf(err, errlen, rc, "%s: %s", out_file, ch_strerror(rc));
        goto out;
    }
    /* data is borrowed from f's mapping, which stays open until after the write */
    rc = ch_st_writer_finish(w, NULL, NULL, err, errlen);
    w = NULL;
out:
    ch_st_writer_destroy(w);
    ch_st_close(f);
    return rc;
}
