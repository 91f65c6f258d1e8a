/* Training data for one rank (DESIGN §7): a token array (a token file, memory-mapped,
 * or the built-in arithmetic corpus) and the sampling rule that makes every layout and
 * every resumed run read the same sequences.
 *
 * Sample j of step s is the window tokens[o .. o + T] (T + 1 tokens: inputs are the
 * first T, targets the last T) at offset
 *     o = wrk_data_hash(seed, s, j) mod (ntokens - T)
 * The global batch of step s is samples j = 0 .. dp * microbatches * B - 1, and
 * micro-batch `micro` of dp rank d holds samples ((d * microbatches) + micro) * B + b,
 * b = 0 .. B - 1. Sampling is stateless: the data position of a run is its step. */
#ifndef WRK_DATA_H
#define WRK_DATA_H

#include <stddef.h>
#include <stdint.h>

/* SplitMix64's finaliser applied to z + golden ratio: a bijective 64-bit mixer. */
static inline uint64_t wrk_mix64(uint64_t z)
{
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* mix64(mix64(mix64(seed ^ "data") ^ step) ^ j); tests/reference re-implements it. */
uint64_t wrk_data_hash(uint64_t seed, uint64_t step, uint64_t j);

typedef struct wrk_data wrk_data_t;

/* source: "" or "builtin" (the generated corpus), else a token file (tokens.h) whose
 * tokens must all be < vocab. It must hold more than seq_len tokens.
 * *out is owned by the caller (wrk_data_close). */
int wrk_data_open(const char *source, uint32_t vocab, uint32_t seq_len, uint64_t seed,
                  wrk_data_t **out, char *err, size_t errlen);
void wrk_data_close(wrk_data_t *d);

int wrk_data_is_builtin(const wrk_data_t *d);
size_t wrk_data_ntokens(const wrk_data_t *d);
uint64_t wrk_data_seed(const wrk_data_t *d);
/* Token offset of sample j of step s. */
uint64_t wrk_data_offset(const wrk_data_t *d, uint64_t step, uint64_t j);
/* Sample j of step s: inputs[T], targets[T]. */
void wrk_data_sample(const wrk_data_t *d, uint64_t step, uint64_t j, int32_t *inputs,
                     int32_t *targets);
/* Micro-batch `micro` (of `microbatches`) of dp rank dp_rank for step s: B samples into
 * inputs[B, T] and targets[B, T]. */
void wrk_data_micro_batch(const wrk_data_t *d, uint64_t step, uint32_t dp_rank, uint32_t micro,
                          uint32_t microbatches, uint32_t B, int32_t *inputs, int32_t *targets);

#endif
