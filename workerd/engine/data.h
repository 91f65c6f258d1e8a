/* Training data for one rank (DESIGN §7): tokens (a token file, memory-mapped; a text
 * file's bytes; llm.c shards; or the built-in arithmetic corpus) and the sampling rule that
 * makes every layout and every resumed run read the same sequences.
 *
 * Random windows (builtin, text:FILE, one token file): sample j of step s is the window
 * tokens[o .. o + T] (T + 1 tokens: inputs are the first T, targets the last T) at offset
 *     o = eng_data_hash(seed, s, j) mod (ntokens - T)
 * In order (a glob of shards, sorted by name; and every validation set): the files are
 * cut into windows of T + 1 tokens starting every T tokens (a window never crosses a
 * file's end, as llm.c's loader), numbered through the files in order, and sample j of
 * step s is window (s * G + j) mod W, G the global batch in sequences, W the windows:
 * each step reads the next G windows, and the run starts over after the last (an epoch).
 * Either way the global batch of step s is samples j = 0 .. G - 1, and micro-batch `micro`
 * of dp rank d holds samples ((d * microbatches) + micro) * B + b, b = 0 .. B - 1: DP
 * ranks share each step deterministically, and every layout of the same global batch
 * reads the same sequences. Sampling is stateless: the data position of a run is its step
 * (eng_data_position names the file and offset). */
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
/* A validation set: source as above but always read in order from its first window. */
int eng_data_open_eval(const char *source, uint32_t vocab, uint32_t seq_len, eng_data_t **out,
                       char *err, size_t errlen);
/* Sequences per step (G = dp x microbatches x B): in-order sources advance by it; random
 * ones ignore it. Default 1. */
void eng_data_set_global_batch(eng_data_t *d, uint64_t global_batch);
/* Windows of an in-order source (W); 0 for random windows. */
uint64_t eng_data_windows(const eng_data_t *d);
/* Where step s's first sample starts: file index (in sorted order) and token offset. */
void eng_data_position(const eng_data_t *d, uint64_t step, size_t *file, uint64_t *offset);

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
