/* Token source and deterministic sampling (data.h). */
#include "workerd/engine/data.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/tokens.h"
#include "workerd/engine/corpus.h"

#define DATA_DOMAIN 0x64617461ull /* "data": keeps offsets apart from other uses of seed */

struct eng_data {
    ch_tokens_t *file; /* token file, or NULL for the built-in corpus */
    uint16_t *owned;   /* the generated corpus */
    const uint16_t *tok;
    size_t n;
    uint32_t seq_len;
    uint64_t seed;
};

uint64_t eng_data_hash(uint64_t seed, uint64_t step, uint64_t j)
{
    return ch_mix64(ch_mix64(ch_mix64(seed ^ DATA_DOMAIN) ^ step) ^ j);
}

int eng_data_open(const char *source, uint32_t vocab, uint32_t seq_len, uint64_t seed,
                  eng_data_t **out, char *err, size_t errlen)
{
    int rc = 0;
    *out = NULL;
    eng_data_t *d = calloc(1, sizeof *d);
    if (!d)
        return -ENOMEM;
    d->seq_len = seq_len;
    d->seed = seed;
    if (!source[0] || strcmp(source, "builtin") == 0) {
        if (vocab < ENG_CORPUS_VOCAB) {
            snprintf(err, errlen,
                     "train.data builtin: the arithmetic corpus needs model.vocab >= %d, got %u",
                     ENG_CORPUS_VOCAB, vocab);
            rc = CH_E_CONFIG;
            goto out;
        }
        rc = eng_corpus_generate(ENG_CORPUS_SEED, ENG_CORPUS_TOKENS, &d->owned);
        if (rc < 0)
            goto out;
        d->tok = d->owned;
        d->n = ENG_CORPUS_TOKENS;
    } else {
        rc = ch_tokens_open(source, vocab, &d->file, err, errlen);
        if (rc < 0)
            goto out;
        d->tok = ch_tokens_data(d->file);
        d->n = ch_tokens_count(d->file);
    }
    if (d->n <= seq_len) {
        snprintf(err, errlen, "%s: %zu tokens are too few for sequences of %u (+1) tokens",
                 d->file ? source : "builtin", d->n, seq_len);
        rc = CH_E_FORMAT;
        goto out;
    }
    *out = d;
    d = NULL;
out:
    eng_data_close(d);
    return rc;
}

void eng_data_close(eng_data_t *d)
{
    if (!d)
        return;
    ch_tokens_close(d->file);
    free(d->owned);
    free(d);
}

int eng_data_is_builtin(const eng_data_t *d)
{
    return d->file == NULL;
}

size_t eng_data_ntokens(const eng_data_t *d)
{
    return d->n;
}

uint64_t eng_data_seed(const eng_data_t *d)
{
    return d->seed;
}

uint64_t eng_data_offset(const eng_data_t *d, uint64_t step, uint64_t j)
{
    return eng_data_hash(d->seed, step, j) % (uint64_t)(d->n - d->seq_len);
}

void eng_data_sample(const eng_data_t *d, uint64_t step, uint64_t j, int32_t *inputs,
                     int32_t *targets)
{
    const uint16_t *w = d->tok + eng_data_offset(d, step, j);
    for (uint32_t t = 0; t < d->seq_len; t++) {
        inputs[t] = w[t];
        targets[t] = w[t + 1];
    }
}

void eng_data_micro_batch(const eng_data_t *d, uint64_t step, uint32_t dp_rank, uint32_t micro,
                          uint32_t microbatches, uint32_t B, int32_t *inputs, int32_t *targets)
{
    uint64_t first = ((uint64_t)dp_rank * microbatches + micro) * B;
    for (uint32_t b = 0; b < B; b++)
        eng_data_sample(d, step, first + b, inputs + (size_t)b * d->seq_len,
                        targets + (size_t)b * d->seq_len);
}
