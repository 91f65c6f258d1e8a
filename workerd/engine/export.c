/* Checkpoint -> Hugging Face GPT-2 safetensors (export.h): every tensor of the model is
 * read whole through the checkpoint reader (ckpt_file.h), which joins the pieces of
 * whatever layout wrote the step, and written in the model's table order. */
#include "workerd/engine/export.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/log.h"
#include "common/safetensors.h"
#include "workerd/engine/ckpt_piece.h"
#include "workerd/engine/gpt2.h"

#define NBLOCK ENG_GPT2_BLOCK_TENSORS

static void whole(eng_ckpt_piece_t *pc, const char *name, uint32_t ndim, uint32_t d0, uint32_t d1)
{
    snprintf(pc->name, sizeof pc->name, "%s", name);
    pc->slice = eng_slice_whole(ndim, d0, d1);
    pc->a = 0;
    pc->b = eng_slice_full_numel(&pc->slice);
}

/* Every tensor of a GPT-2 of cfg, whole, in the model's order (wte, wpe, h.*, ln_f.*). */
static size_t gpt2_pieces(const ch_model_cfg_t *c, eng_ckpt_piece_t *out)
{
    char name[64];
    size_t n = 0;
    uint32_t C = c->embd;
    whole(&out[n++], "wte.weight", 2, c->vocab, C);
    whole(&out[n++], "wpe.weight", 2, c->seq_len, C);
    for (uint32_t l = 0; l < c->layers; l++) {
        for (size_t i = 0; i < NBLOCK; i++) {
            const eng_gpt2_tensor_t *t = &eng_gpt2_block[i];
            snprintf(name, sizeof name, "h.%u.%s", l, t->suffix);
            whole(&out[n++], name, t->cols ? 2 : 1, t->rows * C, t->cols * C);
        }
    }
    whole(&out[n++], "ln_f.weight", 1, C, 0);
    whole(&out[n++], "ln_f.bias", 1, C, 0);
    return n;
}

static int write_file(const char *out_file, const eng_ckpt_meta_t *meta,
                      const eng_ckpt_piece_t *pieces, size_t n, char *err, size_t errlen)
{
    ch_st_writer_t *w = NULL;
    char v[32];
    int rc = ch_st_writer_create(out_file, &w);
    for (size_t i = 0; i < n && rc == 0; i++) {
        const eng_slice_t *s = &pieces[i].slice;
        uint64_t shape[2] = {s->shape[0], s->shape[1]};
        rc = ch_st_writer_add(w, pieces[i].name, CH_ST_F32, s->ndim, shape, pieces[i].p);
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

int eng_export(const char *ckpt_step_dir, const char *out_file, char *err, size_t errlen)
{
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
    pieces = calloc((size_t)c->layers * NBLOCK + 4, sizeof *pieces);
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
    rc = write_file(out_file, meta, pieces, n, err, errlen);
out:
    for (size_t i = 0; pieces && i < n; i++)
        free(pieces[i].p);
    free(pieces);
    eng_ckpt_reader_close(r);
    return rc;
}
