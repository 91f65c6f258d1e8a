/* Built-in arithmetic corpus: generation, tokenizer and answer accuracy (corpus.h). */
#include "workerd/engine/corpus.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"

#define TOK_PLUS   10
#define TOK_EQ     11
#define TOK_NL     12
#define MAX_ANSWER 4 /* "891\n" */
#define PROMPT_MAX 7 /* "\n99+99=" */

static int tok_of(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c == '+')
        return TOK_PLUS;
    if (c == '=')
        return TOK_EQ;
    if (c == '\n')
        return TOK_NL;
    return -1;
}

static char char_of(int32_t t)
{
    static const char alphabet[] = "0123456789+=\n";
    return t >= 0 && t < ENG_CORPUS_VOCAB ? alphabet[t] : '?';
}

int eng_corpus_encode(const char *s, int32_t *out, size_t cap, size_t *n)
{
    size_t len = strlen(s);
    if (len > cap)
        return -ENOSPC;
    for (size_t i = 0; i < len; i++) {
        int t = tok_of(s[i]);
        if (t < 0)
            return -EINVAL;
        out[i] = t;
    }
    *n = len;
    return 0;
}

void eng_corpus_decode(const int32_t *tok, size_t n, char *out, size_t cap)
{
    if (cap == 0)
        return;
    size_t i = 0;
    for (; i < n && i + 1 < cap; i++)
        out[i] = char_of(tok[i]);
    out[i] = '\0';
}

/* The digits of v least significant first into out ("74" for 47); returns their count. */
static int put_reversed(int v, char *out)
{
    int n = 0;
    do {
        out[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v > 0);
    out[n] = '\0';
    return n;
}

/* One line "a+b=" + reversed(a+b) + "\n" from the random word x. */
static int make_line(uint64_t x, char *buf, size_t cap, int *a, int *b)
{
    const uint64_t span = ENG_CORPUS_MAX_ARG - ENG_CORPUS_MIN_ARG + 1;
    char sum[16];
    *a = ENG_CORPUS_MIN_ARG + (int)(x % span);
    *b = ENG_CORPUS_MIN_ARG + (int)((x >> 32) % span);
    put_reversed(*a + *b, sum);
    return snprintf(buf, cap, "%d+%d=%s\n", *a, *b, sum);
}

int eng_corpus_generate(uint64_t seed, size_t ntokens, uint16_t **out)
{
    uint16_t *tok = malloc((ntokens ? ntokens : 1) * sizeof *tok);
    if (!tok)
        return -ENOMEM;
    size_t n = 0;
    for (uint64_t line = 0; n < ntokens; line++) {
        char buf[32];
        int a, b;
        int len = make_line(ch_mix64(seed ^ ch_mix64(line)), buf, sizeof buf, &a, &b);
        for (int i = 0; i < len && n < ntokens; i++)
            tok[n++] = (uint16_t)tok_of(buf[i]);
    }
    *out = tok;
    return 0;
}

// ----------------------------------------------------------------------------
// answer accuracy

typedef struct prompt {
    int32_t tok[PROMPT_MAX + MAX_ANSWER]; /* prompt, then the completion */
    size_t len;                           /* tokens so far */
    size_t qstart;                        /* where "a+b=" starts */
    int answer;
    int ngen, done, newline;
} prompt_t;

/* "\n" and the question "a+b=": a training window sees each line after the newline
 * that ends the one before, so the prompt starts the same way. No solved examples come
 * first: they would not fit the short windows the demo trains on, and every line is a
 * problem of its own. */
static void make_prompt(uint64_t seed, uint64_t idx, prompt_t *p)
{
    char text[32], line[32];
    int a, b;
    memset(p, 0, sizeof *p);
    make_line(ch_mix64(seed ^ ch_mix64(idx)), line, sizeof line, &a, &b);
    snprintf(text, sizeof text, "\n%d+%d=", a, b);
    p->qstart = 1;
    p->answer = a + b;
    size_t n = 0;
    eng_corpus_encode(text, p->tok, sizeof p->tok / sizeof p->tok[0], &n);
    p->len = n;
}

static int32_t argmax(const float *logits, uint32_t V)
{
    int32_t best = 0;
    for (uint32_t v = 1; v < V; v++)
        if (logits[v] > logits[best])
            best = (int32_t)v;
    return best;
}

/* Extend every unfinished prompt of ps[0..nb) by one greedy token. */
static int generate_one(eng_model_t *m, prompt_t *ps, uint32_t nb, int32_t *inputs)
{
    const eng_config_t *cfg = eng_model_config(m);
    uint32_t T = 0;
    for (uint32_t b = 0; b < nb; b++)
        if (ps[b].len > T)
            T = (uint32_t)ps[b].len;
    /* Rows are left-aligned and padded: causal attention keeps the padding out of the
     * positions we read. */
    for (uint32_t b = 0; b < nb; b++)
        for (uint32_t t = 0; t < T; t++)
            inputs[b * T + t] = t < ps[b].len ? ps[b].tok[t] : TOK_NL;
    int rc = eng_model_forward(m, inputs, NULL, nb, T, NULL);
    if (rc < 0)
        return rc;
    const float *logits = eng_model_logits(m);
    for (uint32_t b = 0; b < nb; b++) {
        prompt_t *p = &ps[b];
        if (p->done)
            continue;
        int32_t next =
            argmax(logits + ((size_t)b * T + p->len - 1) * cfg->padded_vocab, cfg->vocab);
        p->tok[p->len++] = next;
        p->ngen++;
        if (next == TOK_NL) {
            p->newline = 1;
            p->done = 1;
        } else if (p->ngen == MAX_ANSWER || next >= 10) {
            p->done = 1;
        }
    }
    return 0;
}

/* Right when the completion is the digits of the answer, least significant first, and
 * then a newline. The sample shows the question and the completion's digits in reading
 * order ("12+35=47"), then whatever non-digit stopped it short of a newline. */
static int judge(const prompt_t *p, eng_corpus_sample_t *s)
{
    char want[16], got[16];
    put_reversed(p->answer, want);
    const int32_t *ans = p->tok + p->len - p->ngen;
    int last_digit = ans[p->ngen - 1] < 10;
    size_t nd = (size_t)p->ngen - !last_digit;
    eng_corpus_decode(ans, nd, got, sizeof got);
    int ok = p->newline && strcmp(want, got) == 0;
    if (s) {
        char q[32];
        eng_corpus_decode(p->tok + p->qstart, p->len - p->qstart - (size_t)p->ngen, q, sizeof q);
        size_t n = (size_t)snprintf(s->text, sizeof s->text, "%s", q);
        for (size_t i = nd; i > 0 && n + 1 < sizeof s->text; i--)
            s->text[n++] = got[i - 1];
        if (!last_digit && !p->newline && n + 1 < sizeof s->text)
            s->text[n++] = char_of(ans[p->ngen - 1]);
        s->text[n] = '\0';
        s->correct = ok;
    }
    return ok;
}

int eng_corpus_eval(eng_model_t *m, uint32_t max_B, uint64_t seed, uint32_t nprompts,
                    double *accuracy, eng_corpus_sample_t *samples, size_t nsamples)
{
    const eng_config_t *cfg = eng_model_config(m);
    /* longest prompt: "\n99+99=", then up to 3 fed tokens */
    if (cfg->seq_len < PROMPT_MAX + MAX_ANSWER - 1 || cfg->vocab < ENG_CORPUS_VOCAB || max_B == 0 ||
        nprompts == 0)
        return -EINVAL;
    int rc = 0;
    prompt_t *ps = calloc(max_B, sizeof *ps);
    int32_t *inputs = calloc((size_t)max_B * cfg->seq_len, sizeof *inputs);
    uint32_t right = 0;
    if (!ps || !inputs) {
        rc = -ENOMEM;
        goto out;
    }
    for (uint32_t base = 0; base < nprompts; base += max_B) {
        uint32_t nb = nprompts - base < max_B ? nprompts - base : max_B;
        for (uint32_t b = 0; b < nb; b++)
            make_prompt(seed, base + b, &ps[b]);
        for (int g = 0; g < MAX_ANSWER; g++) {
            rc = generate_one(m, ps, nb, inputs);
            if (rc < 0)
                goto out;
        }
        for (uint32_t b = 0; b < nb; b++)
            right += (uint32_t)judge(&ps[b], base + b < nsamples ? &samples[base + b] : NULL);
    }
    *accuracy = (double)right / nprompts;
out:
    free(inputs);
    free(ps);
    return rc;
}
