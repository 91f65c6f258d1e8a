/* Token sources and deterministic sampling (data.h). */
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
    ch_tokens_t **files; /* token files (or text) in order; NULL for the built-in corpus */
    size_t nfiles;
    uint16_t *owned;     /* the generated corpus */
    const uint16_t *tok; /* random windows: the one token array */
    size_t n;            /* tokens in all files */
    uint32_t seq_len;
    uint64_t seed;
    int in_order;
    uint64_t *wcum; /* in order: windows before file k (nfiles + 1 entries) */
    uint64_t global_batch;
};

uint64_t eng_data_hash(uint64_t seed, uint64_t step, uint64_t j)
{
    return ch_mix64(ch_mix64(ch_mix64(seed ^ DATA_DOMAIN) ^ step) ^ j);
}

static int open_builtin(eng_data_t *d, uint32_t vocab, char *err, size_t errlen)
{
    if (vocab < ENG_CORPUS_VOCAB)
        return ch_errf(err, errlen, CH_E_CONFIG,
                       "train.data builtin: the arithmetic corpus needs model.vocab >= %d, got %u",
                       ENG_CORPUS_VOCAB, vocab);
    int rc = eng_corpus_generate(ENG_CORPUS_SEED, ENG_CORPUS_TOKENS, &d->owned);
    if (rc < 0)
        return rc;
    d->tok = d->owned;
    d->n = ENG_CORPUS_TOKENS;
    return 0;
}

/* Every file of the source, each holding more than seq_len tokens; the window index. */
static int open_files(eng_data_t *d, const char *source, uint32_t vocab, char *err, size_t errlen)
{
    ch_source_kind_t kind = ch_tokens_source_kind(source);
    char **names = NULL;
    size_t n = 0;
    if (kind == CH_SOURCE_TEXT && vocab < CH_TOKENS_TEXT_VOCAB)
        return ch_errf(err, errlen, CH_E_CONFIG,
                       "%s: a text file's tokens are its bytes, so model.vocab must be >= %d",
                       source, CH_TOKENS_TEXT_VOCAB);
    int rc = ch_tokens_source_files(source, &names, &n, err, errlen);
    if (rc == 0 &&
        (!(d->files = calloc(n, sizeof *d->files)) || !(d->wcum = calloc(n + 1, sizeof *d->wcum))))
        rc = -ENOMEM;
    for (size_t i = 0; i < n && rc == 0; i++) {
        rc = ch_tokens_open_source(kind, names[i], vocab, &d->files[i], err, errlen);
        if (rc < 0)
            break;
        d->nfiles++;
        size_t c = ch_tokens_count(d->files[i]);
        if (c <= d->seq_len)
            rc = ch_errf(err, errlen, CH_E_FORMAT,
                         "%s: %zu tokens are too few for sequences of %u (+1) tokens", names[i], c,
                         d->seq_len);
        d->n += c;
        d->wcum[i + 1] = d->wcum[i] + (c - 1) / d->seq_len;
    }
    if (rc == 0 && d->nfiles == 1) {
        d->tok = ch_tokens_data(d->files[0]);
    }
    ch_tokens_files_free(names, n);
    return rc;
}

static int open_source(const char *source, uint32_t vocab, uint32_t seq_len, uint64_t seed,
                       int in_order, eng_data_t **out, char *err, size_t errlen)
{
    *out = NULL;
    eng_data_t *d = calloc(1, sizeof *d);
    if (!d)
        return -ENOMEM;
    d->seq_len = seq_len;
    d->seed = seed;
    d->global_batch = 1;
    ch_source_kind_t kind = ch_tokens_source_kind(source);
    d->in_order = in_order || kind == CH_SOURCE_SHARDS;
    int rc = 0;
    if (kind == CH_SOURCE_BUILTIN) {
        rc = open_builtin(d, vocab, err, errlen);
        if (rc == 0 && d->n <= seq_len)
            rc = ch_errf(err, errlen, CH_E_FORMAT,
                         "builtin: %zu tokens are too few for sequences of %u (+1) tokens", d->n,
                         seq_len);
        d->in_order = 0;
    } else {
        rc = open_files(d, source, vocab, err, errlen);
    }
    if (rc < 0) {
        eng_data_close(d);
        return rc;
    }
    *out = d;
    return 0;
}

int eng_data_open(const char *source, uint32_t vocab, uint32_t seq_len, uint64_t seed,
                  eng_data_t **out, char *err, size_t errlen)
{
    return open_source(source, vocab, seq_len, seed, 0, out, err, errlen);
}

int eng_data_open_eval(const char *source, uint32_t vocab, uint32_t seq_len, eng_data_t **out,
                       char *err, size_t errlen)
{
    if (ch_tokens_source_kind(source) == CH_SOURCE_BUILTIN)
        return ch_errf(err, errlen, CH_E_CONFIG, "train.val_data: name a file, not builtin");
    return open_source(source, vocab, seq_len, 0, 1, out, err, errlen);
}

void eng_data_close(eng_data_t *d)
{
    if (!d)
        return;
    for (size_t i = 0; i < d->nfiles; i++)
        ch_tokens_close(d->files[i]);
    free(d->files);
    free(d->wcum);
    free(d->owned);
    free(d);
}

void eng_data_set_global_batch(eng_data_t *d, uint64_t global_batch)
{
    d->global_batch = global_batch ? global_batch : 1;
}

int eng_data_is_builtin(const eng_data_t *d)
{
    return d->files == NULL;
}

size_t eng_data_ntokens(const eng_data_t *d)
{
    return d->n;
}

uint64_t eng_data_seed(const eng_data_t *d)
{
    return d->seed;
}

uint64_t eng_data_windows(const eng_data_t *d)
{
    return d->in_order ? d->wcum[d->nfiles] : 0;
}

/* In order: window w's file and token offset in it. */
static void window_at(const eng_data_t *d, uint64_t w, size_t *file, uint64_t *offset)
{
    size_t lo = 0, hi = d->nfiles; /* the file k with wcum[k] <= w < wcum[k + 1] */
    while (hi - lo > 1) {
        size_t mid = (lo + hi) / 2;
        if (d->wcum[mid] <= w)
            lo = mid;
        else
            hi = mid;
    }
    *file = lo;
    *offset = (w - d->wcum[lo]) * d->seq_len;
}

static const uint16_t *window(const eng_data_t *d, uint64_t step, uint64_t j)
{
    if (!d->in_order)
        return d->tok + eng_data_offset(d, step, j);
    size_t file;
    uint64_t off;
    uint64_t w = (step * d->global_batch + j) % d->wcum[d->nfiles];
    window_at(d, w, &file, &off);
    return ch_tokens_data(d->files[file]) + off;
}

uint64_t eng_data_offset(const eng_data_t *d, uint64_t step, uint64_t j)
{
    if (d->in_order) {
        size_t file;
        uint64_t off;
        window_at(d, (step * d->global_batch + j) % d->wcum[d->nfiles], &file, &off);
        return off;
    }
    return eng_data_hash(d->seed, step, j) % (uint64_t)(d->n - d->seq_len);
}

void eng_data_position(const eng_data_t *d, uint64_t step, size_t *file, uint64_t *offset)
{
    *file = 0;
    *offset = eng_data_offset(d, step, 0);
    if (d->in_order)
        window_at(d, (step * d->global_batch) % d->wcum[d->nfiles], file, offset);
}

void eng_data_sample(const eng_data_t *d, uint64_t step, uint64_t j, int32_t *inputs,
                     int32_t *targets)
{
    const uint16_t *w = window(d, step, j);
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
