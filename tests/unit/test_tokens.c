/* common/tokens: llm.c and raw formats, and the checks that run before training. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/tokens.h"
#include "support.h"

static char dir[512];

static void setup(void)
{
    cr_assert_eq(ts_tmpdir("tok", dir, sizeof dir), 0);
}

static void teardown(void)
{
    cr_expect_eq(ts_rmrf(dir), 0);
}

TestSuite(tokens, .init = setup, .fini = teardown);

/* An llm.c file with the given header fields and n tokens 0, 1, 2, ... (mod 50). */
static void write_llmc(const char *path, int32_t magic, int32_t version, int32_t count, size_t n)
{
    int32_t hdr[256] = {0};
    hdr[0] = magic;
    hdr[1] = version;
    hdr[2] = count;
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    fwrite(hdr, sizeof hdr, 1, f);
    for (size_t i = 0; i < n; i++) {
        uint16_t t = (uint16_t)(i % 50);
        fwrite(&t, 2, 1, f);
    }
    fclose(f);
}

Test(tokens, llmc_file_round_trip)
{
    char path[600], err[512];
    snprintf(path, sizeof path, "%s/a.bin", dir);
    uint16_t tok[1000];
    for (int i = 0; i < 1000; i++)
        tok[i] = (uint16_t)(i * 7 % 50257);
    cr_assert_eq(ch_tokens_write(path, tok, 1000), 0);
    ch_tokens_t *t = NULL;
    cr_assert_eq(ch_tokens_open(path, 50257, &t, err, sizeof err), 0, "%s", err);
    cr_expect_eq(ch_tokens_format(t), CH_TOKENS_LLMC);
    cr_expect_eq(ch_tokens_count(t), 1000);
    cr_expect_eq(memcmp(ch_tokens_data(t), tok, sizeof tok), 0);
    ch_tokens_close(t);
}

Test(tokens, raw_uint16_array_is_detected)
{
    char path[600], err[512];
    snprintf(path, sizeof path, "%s/train.bin", dir);
    uint16_t tok[333];
    for (int i = 0; i < 333; i++)
        tok[i] = (uint16_t)(i % 31);
    FILE *f = fopen(path, "wb");
    fwrite(tok, 2, 333, f);
    fclose(f);
    ch_tokens_t *t = NULL;
    cr_assert_eq(ch_tokens_open(path, 32, &t, err, sizeof err), 0, "%s", err);
    cr_expect_eq(ch_tokens_format(t), CH_TOKENS_RAW);
    cr_expect_eq(ch_tokens_count(t), 333);
    cr_expect_eq(ch_tokens_data(t)[100], 100 % 31);
    ch_tokens_close(t);
    /* an odd size cannot be a uint16 array */
    f = fopen(path, "ab");
    fputc(0, f);
    fclose(f);
    cr_expect_eq(ch_tokens_open(path, 32, &t, err, sizeof err), CH_E_FORMAT);
    cr_expect(strstr(err, "odd") != NULL, "%s", err);
}

Test(tokens, wrong_version_is_refused)
{
    char path[600], err[512];
    snprintf(path, sizeof path, "%s/v2.bin", dir);
    write_llmc(path, CH_TOKENS_MAGIC, 2, 100, 100);
    ch_tokens_t *t = NULL;
    cr_expect_eq(ch_tokens_open(path, 0, &t, err, sizeof err), CH_E_FORMAT);
    cr_expect(strstr(err, "version") != NULL, "%s", err);
    cr_expect(strstr(err, "version 2") == NULL, "the file's own bytes are not quoted: %s", err);
    cr_expect(strstr(err, "v2.bin") != NULL, "%s", err);
    cr_expect_null(t);
}

Test(tokens, wrong_magic_means_raw_and_is_still_range_checked)
{
    char path[600], err[512];
    snprintf(path, sizeof path, "%s/m.bin", dir);
    write_llmc(path, 20240519, 1, 100, 100); /* header read as tokens: 20240519 -> 0xd647 */
    ch_tokens_t *t = NULL;
    cr_expect_eq(ch_tokens_open(path, 50257, &t, err, sizeof err), CH_E_FORMAT);
    cr_expect(strstr(err, "byte offset 0") != NULL, "%s", err);
    cr_assert_eq(ch_tokens_open(path, 0, &t, err, sizeof err), 0, "%s", err);
    cr_expect_eq(ch_tokens_format(t), CH_TOKENS_RAW);
    cr_expect_eq(ch_tokens_count(t), 512 + 100);
    ch_tokens_close(t);
}

Test(tokens, truncated_and_trailing_data)
{
    char path[600], err[512];
    ch_tokens_t *t = NULL;
    snprintf(path, sizeof path, "%s/short.bin", dir);
    write_llmc(path, CH_TOKENS_MAGIC, 1, 1000, 999);
    cr_expect_eq(ch_tokens_open(path, 0, &t, err, sizeof err), CH_E_FORMAT);
    cr_expect(strstr(err, "truncated") != NULL, "%s", err);
    write_llmc(path, CH_TOKENS_MAGIC, 1, 1000, 1001);
    cr_expect_eq(ch_tokens_open(path, 0, &t, err, sizeof err), CH_E_FORMAT);
    cr_expect(strstr(err, "trailing") != NULL, "%s", err);
    write_llmc(path, CH_TOKENS_MAGIC, 1, -5, 0);
    cr_expect_eq(ch_tokens_open(path, 0, &t, err, sizeof err), CH_E_FORMAT);
    /* header itself cut short */
    FILE *f = fopen(path, "wb");
    int32_t hdr[3] = {CH_TOKENS_MAGIC, 1, 10};
    fwrite(hdr, sizeof hdr, 1, f);
    fclose(f);
    cr_expect_eq(ch_tokens_open(path, 0, &t, err, sizeof err), CH_E_FORMAT);
    cr_expect(strstr(err, "header") != NULL, "%s", err);
    snprintf(path, sizeof path, "%s/nope.bin", dir);
    cr_expect_eq(ch_tokens_open(path, 0, &t, err, sizeof err), -ENOENT);
    cr_expect(strstr(err, "nope.bin") != NULL);
}

Test(tokens, token_beyond_vocab_names_file_and_offset)
{
    char path[600], err[512];
    snprintf(path, sizeof path, "%s/big.bin", dir);
    uint16_t tok[100] = {0};
    tok[37] = 40;
    cr_assert_eq(ch_tokens_write(path, tok, 100), 0);
    ch_tokens_t *t = NULL;
    cr_expect_eq(ch_tokens_open(path, 32, &t, err, sizeof err), CH_E_FORMAT);
    cr_expect(strstr(err, "big.bin") != NULL, "%s", err);
    cr_expect(strstr(err, "token at index 37") != NULL, "%s", err);
    cr_expect(strstr(err, "byte offset 1098") != NULL, "%s", err); /* 1024 + 2 * 37 */
    cr_assert_eq(ch_tokens_open(path, 41, &t, err, sizeof err), 0);
    ch_tokens_close(t);
}

/* Issue 11 class 5: a refusal never quotes the file's bytes, so a job cannot read a file
 * through its failure reason (the first bytes of /etc/passwd as a "magic", a secret's
 * bytes as "tokens"). */
Test(tokens, refusals_do_not_quote_contents)
{
    char path[600], err[512];
    ch_tokens_t *t = NULL;
    snprintf(path, sizeof path, "%s/passwd", dir);
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    fputs("root:x:0:0\n", f); /* 11 bytes: odd, not llm.c */
    fclose(f);
    cr_expect_eq(ch_tokens_open(path, 32, &t, err, sizeof err), CH_E_FORMAT);
    cr_expect(strstr(err, "1953460082") == NULL, "magic quoted: %s", err); /* "root" */
    snprintf(path, sizeof path, "%s/secret", dir);
    f = fopen(path, "wb");
    cr_assert_not_null(f);
    fputs("SECRET!!", f);
    fclose(f);
    cr_expect_eq(ch_tokens_open(path, 32, &t, err, sizeof err), CH_E_FORMAT);
    cr_expect(strstr(err, "index 0") != NULL, "%s", err);
    cr_expect(strstr(err, "17747") == NULL, "token quoted: %s", err); /* "SE" */
    cr_expect_null(t);
}
