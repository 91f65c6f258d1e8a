/* Checkpoint -> Hugging Face GPT-2 safetensors (export.h): every tensor of the model is
 * read whole through the checkpoint reader (ckpt_file.h), which joins the pieces of
 * whatever layout wrote the step, and written in the model's table order. */
#include "workerd/engine/export.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/err.h"
#include "common/gpt2.h"
#include "common/log.h"
#include "common/util.h"
#include "common/safetensors.h"
#include "workerd/engine/ckpt_piece.h"

/* Every tensor of a GPT-2 of cfg, whole, in the model's order (common/gpt2.h). */
static size_t gpt2_pieces(const ch_model_cfg_t *c, eng_ckpt_piece_t *out)
{
    size_t n = ch_gpt2_count(c);
    for (size_t i = 0; i < n; i++) {
        ch_gpt2_tensor_t t;
        ch_gpt2_tensor(c, i, &t);
        snprintf(out[i].name, sizeof out[i].name, "%s", t.name);
        out[i].slice = eng_slice_whole(t.ndim, (uint32_t)t.shape[0], (uint32_t)t.shape[1]);
        out[i].a = 0;
        out[i].b = eng_slice_full_numel(&out[i].slice);
    }
    return n;
}

/* pieces[i].p converted in place to dtype (2-byte types use the first half of each buffer) */
static int write_file(const char *out_file, const eng_ckpt_meta_t *meta, eng_ckpt_piece_t *pieces,
                      size_t n, ch_st_dtype_t dtype, char *err, size_t errlen)
{
    ch_st_writer_t *w = NULL;
    char v[32];
    int rc = ch_st_writer_create(out_file, &w);
    for (size_t i = 0; i < n && rc == 0; i++) {
        const eng_slice_t *s = &pieces[i].slice;
        uint64_t shape[2] = {s->shape[0], s->shape[1]};
        /* front to back: element k's 2 bytes land before element k is read again */
        rc = ch_st_convert_f32(dtype, pieces[i].p, pieces[i].p, pieces[i].b);
        if (rc == 0)
            rc = ch_st_writer_add(w, pieces[i].name, dtype, s->ndim, shape, pieces[i].p);
    }
    const struct {
        const char *key;
        uint64_t val;
    } meta_u[] = {
        {"n_layer", meta->cfg.layers},      {"n_head", meta->cfg.heads},
        {"n_embd", meta->cfg.embd},         {"vocab_size", meta->cfg.vocab},
        {"n_positions", meta->cfg.seq_len}, {"chorus.step", meta->step},
    };
    if (rc == 0)
        rc = ch_st_writer_meta(w, "format", "pt");
    if (rc == 0)
        rc = ch_st_writer_meta(w, "chorus.job", meta->job);
    for (size_t i = 0; i < sizeof meta_u / sizeof meta_u[0] && rc == 0; i++) {
        snprintf(v, sizeof v, "%" PRIu64, meta_u[i].val);
        rc = ch_st_writer_meta(w, meta_u[i].key, v);
    }
    if (rc < 0) {
        ch_st_writer_destroy(w);
        return ch_errf(err, errlen, rc, "%s: %s", out_file, ch_strerror(rc));
    }
    /* finish destroys the writer and names the file in err on failure */
    return ch_st_writer_finish(w, NULL, NULL, err, errlen);
}

/* config.json as transformers' GPT2Config writes it, for GPT2LMHeadModel.from_pretrained:
 * GELU tanh ("gelu_new"), LayerNorm eps 1e-5, no dropout, the head tied to wte. */
static int write_config(const char *path, const ch_model_cfg_t *c, ch_st_dtype_t dtype, char *err,
                        size_t errlen)
{
    char buf[1024];
    const char *torch_dtype = dtype == CH_ST_F16    ? "float16"
                              : dtype == CH_ST_BF16 ? "bfloat16"
                                                    : "float32";
    int len = snprintf(buf, sizeof buf,
                       "{\n"
                       "  \"architectures\": [\"GPT2LMHeadModel\"],\n"
                       "  \"model_type\": \"gpt2\",\n"
                       "  \"vocab_size\": %u,\n"
                       "  \"n_positions\": %u,\n"
                       "  \"n_ctx\": %u,\n"
                       "  \"n_embd\": %u,\n"
                       "  \"n_layer\": %u,\n"
                       "  \"n_head\": %u,\n"
                       "  \"n_inner\": null,\n"
                       "  \"activation_function\": \"gelu_new\",\n"
                       "  \"layer_norm_epsilon\": 1e-05,\n"
                       "  \"resid_pdrop\": 0.0,\n"
                       "  \"embd_pdrop\": 0.0,\n"
                       "  \"attn_pdrop\": 0.0,\n"
                       "  \"initializer_range\": 0.02,\n"
                       "  \"bos_token_id\": %u,\n"
                       "  \"eos_token_id\": %u,\n"
                       "  \"tie_word_embeddings\": true,\n"
                       "  \"torch_dtype\": \"%s\"\n"
                       "}\n",
                       c->vocab, c->seq_len, c->seq_len, c->embd, c->layers, c->heads, c->vocab - 1,
                       c->vocab - 1, torch_dtype);
    int rc = ch_file_write_atomic(path, buf, (size_t)len, 0644);
    if (rc < 0)
        return ch_errf(err, errlen, rc, "%s: %s", path, ch_strerror(rc));
    return 0;
}

int eng_export(const char *ckpt_step_dir, const char *out_file, char *err, size_t errlen)
{
    return eng_export_as(ckpt_step_dir, out_file, CH_ST_F32, 0, err, errlen);
}

int eng_export_as(const char *ckpt_step_dir, const char *out, ch_st_dtype_t dtype, int hf_dir,
                  char *err, size_t errlen)
{
    char file[4096], config[4096];
    eng_ckpt_reader_t *r = NULL;
    eng_ckpt_piece_t *pieces = NULL;
    size_t n = 0;
    int rc;

    if (err && errlen)
        err[0] = '\0';
    CH_CHECK_GOTO(eng_ckpt_reader_open(ckpt_step_dir, 0, &r, err, errlen), rc, out);
    const eng_ckpt_meta_t *meta = eng_ckpt_reader_meta(r);
    const ch_model_cfg_t *c = &meta->cfg;
    if (c->layers == 0 || c->embd == 0 || c->vocab == 0 || c->seq_len == 0 ||
        c->layers > 1u << 16 || c->embd > 1u << 20) {
        rc = ch_errf(err, errlen, CH_E_FORMAT, "%s: implausible model in the shards' metadata",
                     ckpt_step_dir);
        goto out;
    }
    pieces = calloc(ch_gpt2_count(c), sizeof *pieces);
    if (!pieces) {
        rc = ch_errf(err, errlen, -ENOMEM, "%s: out of memory", ckpt_step_dir);
        goto out;
    }
    n = gpt2_pieces(c, pieces);
    for (size_t i = 0; i < n; i++) {
        if (!(pieces[i].p = malloc(pieces[i].b * sizeof(float)))) {
            rc = ch_errf(err, errlen, -ENOMEM, "%s: out of memory", ckpt_step_dir);
            goto out;
        }
    }
    CH_CHECK_GOTO(eng_ckpt_reader_fill(r, pieces, n, err, errlen), rc, out);
    snprintf(file, sizeof file, "%s", out);
    if (hf_dir) {
        if (mkdir(out, 0755) < 0 && errno != EEXIST) {
            rc = ch_errf(err, errlen, -errno, "%s: %s", out, strerror(errno));
            goto out;
        }
        snprintf(file, sizeof file, "%s/model.safetensors", out);
        snprintf(config, sizeof config, "%s/config.json", out);
    }
    rc = write_file(file, meta, pieces, n, dtype, err, errlen);
    if (rc == 0 && hf_dir)
        rc = write_config(config, c, dtype, err, errlen);
out:
    for (size_t i = 0; pieces && i < n; i++)
        free(pieces[i].p);
    free(pieces);
    eng_ckpt_reader_close(r);
    return rc;
}
