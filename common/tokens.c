/* llm.c and raw uint16 token files (tokens.h). */
#include "common/tokens.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/util.h"

struct ch_tokens {
    void *map;
    size_t size;
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
