/* workerd/data and workerd/corpus: deterministic sampling, layout independence of the
 * global batch, the built-in corpus and its tokenizer. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/err.h"
#include "common/tokens.h"
#include "support.h"
#include "workerd/engine/corpus.h"
#include "workerd/engine/data.h"

#define T 16

static eng_data_t *open_builtin(uint64_t seed)
{
    eng_data_t *d = NULL;
    char err[256];
    cr_assert_eq(eng_data_open("builtin", 32, T, seed, &d, err, sizeof err), 0, "%s", err);
    return d;
}

Test(data, hash_is_a_pure_function_of_seed_step_and_index)
{
    /* pinned values: tests/reference/gpt2_reference.py re-implements this hash */
    cr_expect_eq(eng_data_hash(1337, 0, 0), eng_data_hash(1337, 0, 0));
    cr_expect_neq(eng_data_hash(1337, 0, 0), eng_data_hash(1337, 0, 1));
    cr_expect_neq(eng_data_hash(1337, 0, 0), eng_data_hash(1337, 1, 0));
    cr_expect_neq(eng_data_hash(1337, 0, 0), eng_data_hash(1338, 0, 0));
    cr_expect_eq(ch_mix64(0), 0xe220a8397b1dcdafull); /* SplitMix64's first output of 0 */
}

Test(data, samples_are_windows_with_shifted_targets)
{
    eng_data_t *d = open_builtin(7);
    int32_t in[T], tg[T];
    eng_data_sample(d, 3, 5, in, tg);
    for (int t = 0; t + 1 < T; t++)
        cr_expect_eq(in[t + 1], tg[t]);
    int32_t in2[T], tg2[T];
    eng_data_sample(d, 3, 5, in2, tg2);
    cr_expect_eq(memcmp(in, in2, sizeof in), 0);
    eng_data_sample(d, 3, 6, in2, tg2);
    cr_expect_neq(memcmp(in, in2, sizeof in), 0);
    for (uint64_t j = 0; j < 1000; j++)
        cr_assert_lt(eng_data_offset(d, 9, j), eng_data_ntokens(d) - T);
    eng_data_close(d);
}

/* Concatenate the global batch of step s as dp ranks x microbatches x B would read it. */
static void global_batch(eng_data_t *d, uint64_t s, uint32_t dp, uint32_t mb, uint32_t B,
                         int32_t *out)
{
    int32_t tg[64 * T];
    for (uint32_t r = 0; r < dp; r++)
        for (uint32_t k = 0; k < mb; k++) {
            eng_data_micro_batch(d, s, r, k, mb, B, out, tg);
            out += (size_t)B * T;
        }
}

Test(data, every_layout_reads_the_same_global_batch)
{
    eng_data_t *d = open_builtin(42);
    /* 24 sequences per step: dp x microbatches x B */
    uint32_t layouts[][3] = {{1, 1, 24}, {2, 3, 4}, {4, 6, 1}, {3, 1, 8}, {24, 1, 1}};
    int32_t ref[24 * T], got[24 * T];
    for (uint64_t s = 0; s < 5; s++) {
        global_batch(d, s, layouts[0][0], layouts[0][1], layouts[0][2], ref);
        for (size_t l = 1; l < sizeof layouts / sizeof layouts[0]; l++) {
            global_batch(d, s, layouts[l][0], layouts[l][1], layouts[l][2], got);
            cr_expect_eq(memcmp(ref, got, sizeof ref), 0, "step %llu layout %zu",
                         (unsigned long long)s, l);
        }
    }
    eng_data_close(d);
}

Test(data, a_reopened_source_reads_what_the_first_did)
{
    /* what a resumed run relies on: nothing but (seed, step, j) decides a sample */
    eng_data_t *a = open_builtin(5), *b = open_builtin(5);
    int32_t x[8 * T], y[8 * T], tx[8 * T], ty[8 * T];
    eng_data_micro_batch(a, 123, 0, 1, 2, 8, x, tx);
    eng_data_micro_batch(b, 123, 0, 1, 2, 8, y, ty);
    cr_expect_eq(memcmp(x, y, sizeof x), 0);
    cr_expect_eq(memcmp(tx, ty, sizeof tx), 0);
    eng_data_close(a);
    eng_data_close(b);
}

Test(data, token_file_source_and_its_errors)
{
    char dir[512], path[600], err[512];
    cr_assert_eq(ts_tmpdir("data", dir, sizeof dir), 0);
    snprintf(path, sizeof path, "%s/t.bin", dir);
    uint16_t tok[100];
    for (int i = 0; i < 100; i++)
        tok[i] = (uint16_t)i;
    cr_assert_eq(ch_tokens_write(path, tok, 100), 0);
    eng_data_t *d = NULL;
    cr_assert_eq(eng_data_open(path, 100, T, 1, &d, err, sizeof err), 0, "%s", err);
    cr_expect_not(eng_data_is_builtin(d));
    int32_t in[T], tg[T];
    eng_data_sample(d, 0, 0, in, tg);
    for (int t = 0; t < T; t++) /* tokens are their own positions here */
        cr_expect_eq(in[t], (int32_t)eng_data_offset(d, 0, 0) + t);
    eng_data_close(d);
    cr_expect_eq(eng_data_open(path, 50, T, 1, &d, err, sizeof err), CH_E_FORMAT);
    cr_expect(strstr(err, "t.bin") != NULL, "%s", err);
    cr_expect_eq(eng_data_open(path, 100, 100, 1, &d, err, sizeof err), CH_E_FORMAT);
    cr_expect(strstr(err, "too few") != NULL, "%s", err);
    cr_expect_eq(eng_data_open("builtin", 8, T, 1, &d, err, sizeof err), CH_E_CONFIG);
    cr_expect_eq(ts_rmrf(dir), 0);
}

/* Shards: sorted by name, cut into windows of T + 1 starting every T tokens (none crossing a
 * file's end), read in order G windows per step, DP ranks taking consecutive samples, and
 * starting over after the last window. */
Test(data, shards_are_read_in_order_and_shared_over_dp)
{
    char dir[512], path[600], glob[600], err[512];
    cr_assert_eq(ts_tmpdir("data-shards", dir, sizeof dir), 0);
    /* shard b holds 3 windows (3T + 1 + 5 tokens), shard a 2 (2T + 1): token = file*1000 + i */
    uint16_t tok[100];
    const struct {
        const char *name;
        int file, n;
    } sh[] = {{"s_b.bin", 1, 3 * T + 6}, {"s_a.bin", 0, 2 * T + 1}};
    for (int k = 0; k < 2; k++) {
        for (int i = 0; i < sh[k].n; i++)
            tok[i] = (uint16_t)(sh[k].file * 1000 + i);
        snprintf(path, sizeof path, "%s/%s", dir, sh[k].name);
        cr_assert_eq(ch_tokens_write(path, tok, (size_t)sh[k].n), 0);
    }
    snprintf(glob, sizeof glob, "%s/s_*.bin", dir);
    eng_data_t *d = NULL;
    cr_assert_eq(eng_data_open(glob, 2000, T, 1, &d, err, sizeof err), 0, "%s", err);
    cr_expect_eq(eng_data_windows(d), 5);
    eng_data_set_global_batch(d, 2);
    int32_t in[2 * T], tg[2 * T];
    /* window w: file (w < 2 ? a : b), start (w mod) * T. Step s, sample j: w = 2s + j */
    const int first[] = {0, T, 1000, 1000 + T, 1000 + 2 * T, 0, T};
    for (uint64_t step = 0; step < 3; step++) {
        for (uint32_t dp = 0; dp < 2; dp++) { /* dp 2 x B 1 == dp 1 x B 2 */
            eng_data_micro_batch(d, step, dp, 0, 1, 1, in, tg);
            int w = (int)(2 * step + dp) % 5;
            cr_expect_eq(in[0], first[w], "step %lu dp %u", (unsigned long)step, dp);
            cr_expect_eq(tg[T - 1], first[w] + T, "targets are the inputs shifted by one");
        }
        eng_data_micro_batch(d, step, 0, 0, 1, 2, in, tg);
        cr_expect_eq(in[T], first[(2 * step + 1) % 5]);
    }
    size_t file;
    uint64_t off;
    eng_data_position(d, 1, &file, &off);
    cr_expect(file == 1 && off == 0, "step 1 starts shard b at 0: file %zu offset %lu", file,
              (unsigned long)off);
    eng_data_close(d);
    cr_expect_eq(ts_rmrf(dir), 0);
}

/* text:FILE: every byte a token, values up to 255. A validation set is read in order. */
Test(data, text_files_are_bytes_and_validation_reads_in_order)
{
    char dir[512], path[600], src[640], err[512];
    cr_assert_eq(ts_tmpdir("data-text", dir, sizeof dir), 0);
    snprintf(path, sizeof path, "%s/in.txt", dir);
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    for (int i = 0; i < 100; i++)
        fputc(i == 3 ? 0xE9 : 'a' + i % 26, f); /* one byte over 127 */
    fclose(f);
    snprintf(src, sizeof src, "text:%s", path);
    eng_data_t *d = NULL;
    cr_expect_eq(eng_data_open(src, 128, T, 1, &d, err, sizeof err), CH_E_CONFIG);
    cr_expect(strstr(err, "vocab must be >= 256") != NULL, "%s", err);
    cr_assert_eq(eng_data_open_eval(src, 256, T, &d, err, sizeof err), 0, "%s", err);
    cr_expect_eq(eng_data_ntokens(d), 100);
    cr_expect_eq(eng_data_windows(d), (100 - 1) / T);
    int32_t in[T], tg[T];
    eng_data_sample(d, 0, 0, in, tg);
    cr_expect_eq(in[0], 'a');
    cr_expect_eq(in[3], 0xE9);
    eng_data_sample(d, 0, 1, in, tg);
    cr_expect_eq(in[0], 'a' + T % 26, "the second window starts T bytes in");
    eng_data_close(d);
    f = fopen(path, "wb");
    fclose(f);
    cr_expect_eq(eng_data_open(src, 256, T, 1, &d, err, sizeof err), CH_E_FORMAT);
    cr_expect(strstr(err, "empty") != NULL, "%s", err);
    cr_expect_eq(ts_rmrf(dir), 0);
}

/* The number whose digits, least significant first, are s ("74" is 47). */
static int reversed_value(const char *s)
{
    int v = 0;
    for (size_t i = strlen(s); i > 0; i--)
        v = 10 * v + (s[i - 1] - '0');
    return v;
}

Test(corpus, lines_are_correct_sums_and_decode)
{
    uint16_t *tok = NULL;
    cr_assert_eq(eng_corpus_generate(ENG_CORPUS_SEED, 5000, &tok), 0);
    int32_t t32[5000];
    for (int i = 0; i < 5000; i++) {
        cr_assert_lt(tok[i], ENG_CORPUS_VOCAB);
        t32[i] = tok[i];
    }
    char text[5001];
    eng_corpus_decode(t32, 5000, text, sizeof text);
    free(tok);
    int lines = 0;
    char *l = text, *nl;
    while ((nl = strchr(l, '\n'))) { /* complete lines only: the last one may be cut */
        *nl = '\0';
        int a, b;
        char digits[8];
        cr_assert_eq(sscanf(l, "%d+%d=%7[0-9]", &a, &b, digits), 3, "line '%s'", l);
        cr_expect_eq(reversed_value(digits), a + b, "line '%s'", l);
        char want[8];
        snprintf(want, sizeof want, "%d", a + b); /* as many digits: no padding */
        cr_expect_eq(strlen(digits), strlen(want), "line '%s'", l);
        cr_expect_geq(a, ENG_CORPUS_MIN_ARG);
        cr_expect_geq(b, ENG_CORPUS_MIN_ARG);
        cr_expect_leq(a, ENG_CORPUS_MAX_ARG);
        cr_expect_leq(b, ENG_CORPUS_MAX_ARG);
        lines++;
        l = nl + 1;
    }
    cr_expect_gt(lines, 400);
    cr_expect_eq(reversed_value("74"), 47);
    /* the same seed makes the same corpus */
    uint16_t *again = NULL;
    cr_assert_eq(eng_corpus_generate(ENG_CORPUS_SEED, 5000, &again), 0);
    for (int i = 0; i < 5000; i++)
        cr_assert_eq(again[i], t32[i]);
    free(again);
}

Test(corpus, tokenizer_round_trip_and_rejects)
{
    int32_t out[32];
    size_t n = 0;
    cr_assert_eq(eng_corpus_encode("12+35=47\n", out, 32, &n), 0);
    cr_expect_eq(n, 9);
    cr_expect_eq(out[0], 1);
    cr_expect_eq(out[2], 10);
    cr_expect_eq(out[5], 11);
    cr_expect_eq(out[8], 12);
    char back[32];
    eng_corpus_decode(out, n, back, sizeof back);
    cr_expect_str_eq(back, "12+35=47\n");
    cr_expect_eq(eng_corpus_encode("1-2", out, 32, &n), -EINVAL);
    cr_expect_eq(eng_corpus_encode("123", out, 2, &n), -ENOSPC);
    int32_t odd[2] = {5, 31};
    eng_corpus_decode(odd, 2, back, sizeof back);
    cr_expect_str_eq(back, "5?");
}
