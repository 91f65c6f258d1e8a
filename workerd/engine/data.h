/* Training data for one rank (DESIGN §7): a token array (a token file, memory-mapped,
 * or the built-in arithmetic corpus) and the sampling rule that makes every layout and
 * every resumed run read the same sequences.
 *
 * Sample j of step s is the window tokens[o .. o + T] (T + 1 tokens: inputs are the
 * first T, targets the last T) at offset
 *     o = eng_data_hash(seed, s, j) mod (ntokens - T)
 * The global batch of step s is samples j = 0 .. dp * microbatches * B - 1, and
 * micro-batch `micro` of dp rank d holds samples ((d * microbatches) + micro) * B + b,
 * b = 0 .. B - 1. Sampling is stateless: the data position of a run is its step. */
#ifndef ENG_DATA_H
#define ENG_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "common/rng.h" /* ch_mix64 */

/* mix64(mix64(mix64(seed ^ "data") ^ step) ^ j); tests/reference re-implements it. */
uint64_t eng_data_hash(uint64_t seed, uint64_t step, uint64_t j);

typedef struct eng_data eng_data_t;

/* source: "" or "builtin" (the generated corpus), else a token file (tokens.h) whose
 * tokens must all be < vocab. It must hold more than seq_len tokens.
 * *out is owned by the caller (eng_data_close). */
int eng_data_open(const char *source, uint32_t vocab, uint32_t seq_len, uint64_t seed,
                  eng_data_t **out, char *err, size_t errlen);
void eng_data_close(eng_data_t *d);

int eng_data_is_builtin(const eng_data_t *d);
size_t eng_data_ntokens(const eng_data_t *d);
uint64_t eng_data_seed(const eng_data_t *d);
/* Token offset of sample j of step s. */
uint64_t eng_data_offset(const eng_data_t *d, uint64_t step, uint64_t j);
/* Sample j of step s: inputs[T], targets[T]. */
void eng_data_sample(const eng_data_t *d, uint64_t step, uint64_t j, int32_t *inputs,
                     int32_t *targets);
/* Micro-batch `micro` (of `microbatches`) of dp rank dp_rank for step s: B samples into
 * inputs[B, T] and targets[B, T]. */
void eng_data_micro_batch(const eng_data_t *d, uint64_t step, uint32_t dp_rank, uint32_t micro,
                          uint32_t microbatches, uint32_t B, int32_t *inputs, int32_t *targets);

#endif
