/* Fuzz target: token files (common/tokens.h).
 *
 * The input is a whole file, written to a scratch path. Opened without a vocab, an
 * accepted file must account for every byte (llm.c: 1024-byte header + 2 * count; raw:
 * 2 * count) and hand out the tokens that are in the file. With a vocab, the file must be
 * accepted exactly when every token is below it (checked at max token + 1, the tightest
 * vocab that fits, and at max token, which must be refused). Writing the tokens back with
 * ch_tokens_write must give an llm.c file that opens to the same tokens. */
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/tokens.h"
#include "fuzz.h"

static void check_refused(const char *path, uint32_t vocab)
{
    ch_tokens_t *t = NULL;
    char err[512] = "";
    int rc = ch_tokens_open(path, vocab, &t, err, sizeof err);
    FUZZ_ASSERT(rc == CH_E_FORMAT && t == NULL && err[0] != '\0');
    FUZZ_ASSERT(memchr(err, '\0', sizeof err) != NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[600], path2[600], err[512] = "";
    fuzz_tmp_path(path, sizeof path, "in.bin");
    fuzz_tmp_path(path2, sizeof path2, "out.bin");
    fuzz_write_file(path, data, size);

    ch_tokens_t *t = NULL;
    int rc = ch_tokens_open(path, 0, &t, err, sizeof err);
    if (rc < 0) {
        FUZZ_ASSERT(rc == CH_E_FORMAT && t == NULL && err[0] != '\0');
        /* Refused without a vocab: refused with any vocab. */
        check_refused(path, 1u << 16);
        return 0;
    }
    size_t n = ch_tokens_count(t);
    const uint16_t *tok = ch_tokens_data(t);
    FUZZ_ASSERT(((uintptr_t)tok & 1) == 0);
    size_t off = ch_tokens_format(t) == CH_TOKENS_LLMC ? CH_TOKENS_HEADER : 0;
    FUZZ_ASSERT(size == off + 2 * n);
    FUZZ_ASSERT(memcmp(tok, data + off, 2 * n) == 0);
    if (off) {
        int32_t hdr[3];
        memcpy(hdr, data, sizeof hdr);
        FUZZ_ASSERT(hdr[0] == CH_TOKENS_MAGIC && hdr[1] == CH_TOKENS_VERSION && n > 0 &&
                    (size_t)hdr[2] == n);
    } else {
        int32_t magic;
        memcpy(&magic, data, sizeof magic);
        FUZZ_ASSERT(magic != CH_TOKENS_MAGIC && n >= 2);
    }
    uint16_t max = 0;
    for (size_t i = 0; i < n; i++)
        max = tok[i] > max ? tok[i] : max;

    /* The tightest vocab fits; one less does not. */
    ch_tokens_t *v = NULL;
    FUZZ_ASSERT(ch_tokens_open(path, (uint32_t)max + 1, &v, err, sizeof err) == 0);
    FUZZ_ASSERT(ch_tokens_count(v) == n);
    ch_tokens_close(v);
    if (max > 0)
        check_refused(path, max);

    /* Roundtrip through the writer. */
    FUZZ_ASSERT(ch_tokens_write(path2, tok, n) == 0);
    ch_tokens_t *w = NULL;
    FUZZ_ASSERT(ch_tokens_open(path2, (uint32_t)max + 1, &w, err, sizeof err) == 0);
    FUZZ_ASSERT(ch_tokens_format(w) == CH_TOKENS_LLMC && ch_tokens_count(w) == n);
    FUZZ_ASSERT(memcmp(ch_tokens_data(w), tok, 2 * n) == 0);
    ch_tokens_close(w);
    ch_tokens_close(t);
    return 0;
}
