/* llm.c and raw uint16 token files (tokens.h). */
#include "common/tokens.h"

#include <errno.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/util.h"

struct ch_tokens {
    void *map;
    size_t size;
    uint16_t *owned; /* a text file's bytes widened to tokens */
    const uint16_t *tok;
    size_t n;
    ch_tokens_format_t format;
};

int ch_tokens_open(const char *path, uint32_t vocab, ch_tokens_t **out, char *err, size_t errlen)
{
    int rc = 0;
    ch_tokens_t *t = NULL;

    *out = NULL;
    t = calloc(1, sizeof *t);
    if (!t) {
        rc = -ENOMEM;
        goto out;
    }
    rc = ch_file_map(path, &t->map, &t->size, err, errlen);
    if (rc < 0)
        goto out;
    if (t->size < 4) {
        rc = ch_errf(err, errlen, CH_E_FORMAT, "%s: %zu bytes is too short for a token file", path,
                     t->size);
        goto out;
    }
    int32_t magic;
    memcpy(&magic, t->map, 4);
    size_t data_off;
    if (magic == CH_TOKENS_MAGIC) {
        int32_t hdr[3] = {0, 0, 0};
        if (t->size < CH_TOKENS_HEADER) {
            rc =
                ch_errf(err, errlen, CH_E_FORMAT, "%s: truncated llm.c header (%zu bytes, need %d)",
                        path, t->size, CH_TOKENS_HEADER);
            goto out;
        }
        memcpy(hdr, t->map, sizeof hdr);
        if (hdr[1] != CH_TOKENS_VERSION) {
            rc = ch_errf(err, errlen, CH_E_FORMAT,
                         "%s: llm.c token file version is not supported (expected %d)", path,
                         CH_TOKENS_VERSION);
            goto out;
        }
        if (hdr[2] <= 0) {
            rc = ch_errf(err, errlen, CH_E_FORMAT, "%s: header token count is not positive", path);
            goto out;
        }
        size_t want = (size_t)hdr[2] * 2;
        size_t have = t->size - CH_TOKENS_HEADER;
        if (have < want) {
            rc = ch_errf(err, errlen, CH_E_FORMAT,
                         "%s: truncated: the header announces more tokens than the %zu bytes "
                         "that follow it",
                         path, have);
            goto out;
        }
        if (have > want) {
            rc = ch_errf(err, errlen, CH_E_FORMAT,
                         "%s: %zu trailing bytes after the tokens the header announces", path,
                         have - want);
            goto out;
        }
        t->format = CH_TOKENS_LLMC;
        t->n = (size_t)hdr[2];
        data_off = CH_TOKENS_HEADER;
    } else {
        if (t->size % 2) {
            rc = ch_errf(err, errlen, CH_E_FORMAT,
                         "%s: not an llm.c token file and its size %zu is odd, so not a raw "
                         "uint16 array either",
                         path, t->size);
            goto out;
        }
        t->format = CH_TOKENS_RAW;
        t->n = t->size / 2;
        data_off = 0;
    }
    t->tok = (const uint16_t *)((const char *)t->map + data_off);
    if (vocab > 0) {
        for (size_t i = 0; i < t->n; i++) {
            if (t->tok[i] >= vocab) {
                rc = ch_errf(err, errlen, CH_E_FORMAT,
                             "%s: the token at index %zu (byte offset %zu) is not below the "
                             "model vocab %u",
                             path, i, data_off + 2 * i, vocab);
                goto out;
            }
        }
    }
    *out = t;
    t = NULL;
out:
    ch_tokens_close(t);
    return rc;
}

void ch_tokens_close(ch_tokens_t *t)
{
    if (!t)
        return;
    ch_file_unmap(t->map, t->size);
    free(t->owned);
    free(t);
}

const uint16_t *ch_tokens_data(const ch_tokens_t *t)
{
    return t->tok;
}

size_t ch_tokens_count(const ch_tokens_t *t)
{
    return t->n;
}

ch_tokens_format_t ch_tokens_format(const ch_tokens_t *t)
{
    return t->format;
}

int ch_tokens_write(const char *path, const uint16_t *tokens, size_t n)
{
    if (n == 0 || n > INT32_MAX)
        return -EINVAL;
    size_t len = CH_TOKENS_HEADER + 2 * n;
    unsigned char *buf = calloc(1, len);
    if (!buf)
        return -ENOMEM;
    int32_t hdr[3] = {CH_TOKENS_MAGIC, CH_TOKENS_VERSION, (int32_t)n};
    memcpy(buf, hdr, sizeof hdr);
    memcpy(buf + CH_TOKENS_HEADER, tokens, 2 * n);
    int rc = ch_file_write_atomic(path, buf, len, 0644);
    free(buf);
    return rc;
}

int ch_tokens_open_text(const char *path, ch_tokens_t **out, char *err, size_t errlen)
{
    *out = NULL;
    ch_tokens_t *t = calloc(1, sizeof *t);
    if (!t)
        return -ENOMEM;
    int rc = ch_file_map(path, &t->map, &t->size, err, errlen);
    if (rc < 0)
        goto out;
    if (t->size == 0) {
        rc = ch_errf(err, errlen, CH_E_FORMAT, "%s: the text file is empty (0 bytes)", path);
        goto out;
    }
    t->owned = malloc(t->size * sizeof *t->owned);
    if (!t->owned) {
        rc = ch_errf(err, errlen, -ENOMEM, "%s: out of memory for %zu tokens", path, t->size);
        goto out;
    }
    const unsigned char *b = t->map;
    for (size_t i = 0; i < t->size; i++)
        t->owned[i] = b[i];
    /* the tokens are in memory now: the mapping is not needed */
    ch_file_unmap(t->map, t->size);
    t->map = NULL;
    t->tok = t->owned;
    t->n = t->size;
    t->size = 0;
    t->format = CH_TOKENS_RAW;
    *out = t;
    t = NULL;
out:
    ch_tokens_close(t);
    return rc;
}

ch_source_kind_t ch_tokens_source_kind(const char *source)
{
    if (!source[0] || strcmp(source, "builtin") == 0)
        return CH_SOURCE_BUILTIN;
    if (strncmp(source, CH_TOKENS_TEXT_PREFIX, strlen(CH_TOKENS_TEXT_PREFIX)) == 0)
        return CH_SOURCE_TEXT;
    return strpbrk(source, "*?[") ? CH_SOURCE_SHARDS : CH_SOURCE_FILE;
}

void ch_tokens_files_free(char **files, size_t n)
{
    for (size_t i = 0; files && i < n; i++)
        free(files[i]);
    free(files);
}

static int files_of_glob(const char *pattern, char ***files, size_t *n, char *err, size_t errlen)
{
    glob_t g;
    memset(&g, 0, sizeof g);
    int grc = glob(pattern, GLOB_ERR, NULL, &g); /* sorted by name (no GLOB_NOSORT) */
    int rc = 0;
    if (grc == GLOB_NOMATCH || (grc == 0 && g.gl_pathc == 0)) {
        rc = ch_errf(err, errlen, CH_E_CONFIG, "%s: the glob matches no file", pattern);
        goto out;
    }
    if (grc != 0) {
        rc = ch_errf(err, errlen, CH_E_CONFIG, "%s: cannot expand the glob (%s)", pattern,
                     grc == GLOB_ABORTED ? "a directory could not be read" : "out of memory");
        goto out;
    }
    *files = calloc(g.gl_pathc, sizeof **files);
    if (!*files) {
        rc = -ENOMEM;
        goto out;
    }
    for (size_t i = 0; i < g.gl_pathc; i++) {
        if (!((*files)[i] = strdup(g.gl_pathv[i]))) {
            ch_tokens_files_free(*files, i);
            *files = NULL;
            rc = -ENOMEM;
            goto out;
        }
    }
    *n = g.gl_pathc;
out:
    globfree(&g);
    return rc;
}

int ch_tokens_source_files(const char *source, char ***files, size_t *n, char *err, size_t errlen)
{
    *files = NULL;
    *n = 0;
    switch (ch_tokens_source_kind(source)) {
    case CH_SOURCE_BUILTIN:
        return 0;
    case CH_SOURCE_SHARDS:
        return files_of_glob(source, files, n, err, errlen);
    case CH_SOURCE_TEXT:
        source += strlen(CH_TOKENS_TEXT_PREFIX);
        break;
    case CH_SOURCE_FILE:
        break;
    }
    *files = calloc(1, sizeof **files);
    if (!*files || !((*files)[0] = strdup(source))) {
        free(*files);
        *files = NULL;
        return -ENOMEM;
    }
    *n = 1;
    return 0;
}

int ch_tokens_open_source(ch_source_kind_t kind, const char *file, uint32_t vocab,
                          ch_tokens_t **out, char *err, size_t errlen)
{
    if (kind == CH_SOURCE_TEXT)
        return ch_tokens_open_text(file, out, err, errlen);
    return ch_tokens_open(file, vocab, out, err, errlen);
}

int ch_tokens_source_check(const char *source, uint32_t vocab, uint32_t seq_len, char *err,
                           size_t errlen)
{
    ch_source_kind_t kind = ch_tokens_source_kind(source);
    char **files = NULL;
    size_t n = 0;
    if (kind == CH_SOURCE_TEXT && vocab < CH_TOKENS_TEXT_VOCAB)
        return ch_errf(err, errlen, CH_E_CONFIG,
                       "%s: a text file's tokens are its bytes, so model.vocab must be >= %d, got "
                       "%u",
                       source, CH_TOKENS_TEXT_VOCAB, vocab);
    int rc = ch_tokens_source_files(source, &files, &n, err, errlen);
    for (size_t i = 0; i < n && rc == 0; i++) {
        ch_tokens_t *t = NULL;
        rc = ch_tokens_open_source(kind, files[i], vocab, &t, err, errlen);
        if (rc == 0 && ch_tokens_count(t) <= seq_len)
            rc = ch_errf(err, errlen, CH_E_CONFIG,
                         "%s holds %zu tokens, fewer than seq_len + 1 = %u", files[i],
                         ch_tokens_count(t), seq_len + 1);
        ch_tokens_close(t);
        if (rc < 0)
            rc = CH_E_CONFIG;
    }
    ch_tokens_files_free(files, n);
    return rc;
}
