/* The built-in training corpus: character-level arithmetic, generated in memory from a
 * fixed seed so a job needs no download and a small model visibly learns (DESIGN §7).
 *
 * Text is lines "a+b=c\n" with a, b uniform in ENG_CORPUS_MIN_ARG..ENG_CORPUS_MAX_ARG and
 * the sum c written least significant digit first: "12+35=74\n" says 12 + 35 = 47. A
 * model then makes each answer digit from the operand digits of its own column and the
 * carry of the one it just wrote, which a small transformer learns in a minute of CPU
 * time; in reading order it would have to know the carry out of the low column before
 * writing the high one. Operands of two digits each keep those columns at fixed distances
 * from the '=' (mixing in one-digit operands leaves them as the last answers a short run
 * learns). eng_corpus_eval's samples show sums in reading order.
 *
 * The tokenizer maps '0'..'9' to 0..9, '+' to 10, '=' to 11 and '\n' to 12
 * (ENG_CORPUS_VOCAB tokens; a model's vocab must be at least that). The operands are
 * random, so the loss has a floor; the answers are learnable, and eng_corpus_eval
 * measures how many the model gets right. */
#ifndef ENG_CORPUS_H
#define ENG_CORPUS_H

#include <stddef.h>
#include <stdint.h>

#include "workerd/engine/model.h"

#define ENG_CORPUS_VOCAB   13
#define ENG_CORPUS_TOKENS  (1u << 20)        /* tokens generated for training */
#define ENG_CORPUS_SEED    0x63686f727573ull /* fixed: every job sees the same corpus */
#define ENG_CORPUS_MIN_ARG 10
#define ENG_CORPUS_MAX_ARG 99

/* Tokens of s into out[0..cap); -EINVAL on a character outside the alphabet, -ENOSPC
 * when cap is too small. */
int eng_corpus_encode(const char *s, int32_t *out, size_t cap, size_t *n);
/* Text of tokens into out (NUL-terminated, truncated to cap); tokens outside the
 * alphabet decode as '?'. */
void eng_corpus_decode(const int32_t *tok, size_t n, char *out, size_t cap);

/* ntokens tokens of corpus text from seed (whole lines, the last one cut at ntokens).
 * *out is malloc'd; the caller frees it. */
int eng_corpus_generate(uint64_t seed, size_t ntokens, uint16_t **out);

typedef struct eng_corpus_sample {
    char text[48]; /* "12+35=47" as the model completed it, in reading order */
    int correct;
} eng_corpus_sample_t;

/* Answer accuracy: for nprompts prompts "\na+b=" (drawn from seed like corpus lines),
 * the model's greedy completion up to the newline is compared with the digits of a+b,
 * least significant first. Runs forward passes of at most max_B sequences (the model's
 * micro-batch) and needs seq_len >= 10. The first nsamples completions go to samples
 * (may be NULL). */
int eng_corpus_eval(eng_model_t *m, uint32_t max_B, uint64_t seed, uint32_t nprompts,
                    double *accuracy, eng_corpus_sample_t *samples, size_t nsamples);

#endif
