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
