/* GPT-2's tensor table and the init_from check (gpt2.h). */
#include "common/gpt2.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "common/err.h"
#include "common/safetensors.h"

const ch_gpt2_block_tensor_t ch_gpt2_block[CH_GPT2_BLOCK_TENSORS] = {
    {"ln_1.weight", 1, 0},      {"ln_1.bias", 1, 0},          {"attn.c_attn.weight", 1, 3},
    {"attn.c_attn.bias", 3, 0}, {"attn.c_proj.weight", 1, 1}, {"attn.c_proj.bias", 1, 0},
    {"ln_2.weight", 1, 0},      {"ln_2.bias", 1, 0},          {"mlp.c_fc.weight", 1, 4},
    {"mlp.c_fc.bias", 4, 0},    {"mlp.c_proj.weight", 4, 1},  {"mlp.c_proj.bias", 1, 0},
};
#define NBLOCK CH_GPT2_BLOCK_TENSORS

size_t ch_gpt2_count(const ch_model_cfg_t *c)
{
    return 4 + (size_t)c->layers * NBLOCK;
}

static void set(ch_gpt2_tensor_t *t, const char *name, uint32_t ndim, uint64_t d0, uint64_t d1)
{
    snprintf(t->name, sizeof t->name, "%s", name);
    t->ndim = ndim;
    t->shape[0] = d0;
    t->shape[1] = ndim > 1 ? d1 : 0;
}

void ch_gpt2_tensor(const ch_model_cfg_t *c, size_t i, ch_gpt2_tensor_t *out)
{
    uint64_t C = c->embd;
    size_t nb = (size_t)c->layers * NBLOCK;
    char name[64];
    if (i == 0)
        return set(out, "wte.weight", 2, c->vocab, C);
    if (i == 1)
        return set(out, "wpe.weight", 2, c->seq_len, C);
    if (i >= 2 + nb)
        return set(out, i == 2 + nb ? "ln_f.weight" : "ln_f.bias", 1, C, 0);
    size_t l = (i - 2) / NBLOCK, k = (i - 2) % NBLOCK;
    snprintf(name, sizeof name, "h.%zu.%s", l, ch_gpt2_block[k].suffix);
    set(out, name, ch_gpt2_block[k].cols ? 2 : 1, ch_gpt2_block[k].rows * C,
        ch_gpt2_block[k].cols * C);
}

static void shape_text(uint32_t ndim, const uint64_t *shape, char *buf, size_t len)
{
    size_t at = (size_t)snprintf(buf, len, "[");
    for (uint32_t d = 0; d < ndim && at < len; d++)
        at += (size_t)snprintf(buf + at, len - at, "%s%" PRIu64, d ? ", " : "", shape[d]);
    if (at < len)
        snprintf(buf + at, len - at, "]");
}

static int fits(const ch_gpt2_tensor_t *want, const ch_st_tensor_t *st)
{
    if (st->ndim != want->ndim || st->shape[want->ndim - 1] != want->shape[want->ndim - 1])
        return 0;
    if (strcmp(want->name, "wpe.weight") == 0) /* cropped to seq_len, as nanoGPT does */
        return st->shape[0] >= want->shape[0];
    return st->shape[0] == want->shape[0];
}

int ch_gpt2_check_file(const char *path, const ch_model_cfg_t *c, char *err, size_t errlen)
{
    ch_st_file_t *f = NULL;
    char have[64], need[64], prefixed[96];
    int rc = ch_st_open(path, &f, err, errlen);
    for (size_t i = 0; rc == 0 && i < ch_gpt2_count(c); i++) {
        ch_gpt2_tensor_t want;
        ch_gpt2_tensor(c, i, &want);
        snprintf(prefixed, sizeof prefixed, "transformer.%s", want.name);
        const ch_st_tensor_t *st = ch_st_find(f, want.name);
        if (!st)
            st = ch_st_find(f, prefixed);
        if (!st) {
            rc = ch_errf(err, errlen, CH_E_CONFIG, "%s: tensor %s is missing", path, want.name);
            break;
        }
        if (st->dtype != CH_ST_F32 && st->dtype != CH_ST_F16 && st->dtype != CH_ST_BF16) {
            rc = ch_errf(err, errlen, CH_E_CONFIG, "%s: tensor %s is %s; F32, F16 or BF16 expected",
                         path, st->name, ch_st_dtype_name(st->dtype));
            break;
        }
        if (!fits(&want, st)) {
            shape_text(st->ndim, st->shape, have, sizeof have);
            shape_text(want.ndim, want.shape, need, sizeof need);
            rc = ch_errf(err, errlen, CH_E_CONFIG,
                         "%s: tensor %s has shape %s but [model] (layers %u heads %u embd %u "
                         "vocab %u seq_len %u) needs %s%s",
                         path, st->name, have, c->layers, c->heads, c->embd, c->vocab, c->seq_len,
                         need, strcmp(want.name, "wpe.weight") == 0 ? " or more rows" : "");
            break;
        }
    }
    if (rc == 0) { /* a deeper file than [model]: name the first block [model] lacks */
        char next[64];
        snprintf(next, sizeof next, "h.%u.ln_1.weight", c->layers);
        snprintf(prefixed, sizeof prefixed, "transformer.%s", next);
        if (ch_st_find(f, next) || ch_st_find(f, prefixed))
            rc = ch_errf(err, errlen, CH_E_CONFIG,
                         "%s: holds tensor %s, more blocks than [model] layers = %u", path, next,
                         c->layers);
    }
    ch_st_close(f);
    return rc;
}
