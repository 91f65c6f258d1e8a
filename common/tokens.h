/* Token files (DESIGN §7), memory-mapped and validated before training starts.
 *
 * Two formats:
 *  - llm.c: a 256 x int32 little-endian header (header[0] = magic 20240520,
 *    header[1] = version 1, header[2] = token count), then count uint16 tokens;
 *  - raw: a bare array of uint16 tokens (nanoGPT's train.bin), recognised by the
 *    magic not matching.
 * Opening checks the version, that the size matches the count (truncated or trailing
 * bytes), and with vocab > 0 that every token is < vocab: CH_E_FORMAT with
 * "FILE: reason" naming the byte offset of the first bad token. */
#ifndef CH_TOKENS_H
#define CH_TOKENS_H

#include <stddef.h>
#include <stdint.h>

#define CH_TOKENS_MAGIC   20240520
#define CH_TOKENS_VERSION 1
#define CH_TOKENS_HEADER  1024 /* bytes: 256 x int32 */

typedef enum { CH_TOKENS_LLMC = 0, CH_TOKENS_RAW = 1 } ch_tokens_format_t;

typedef struct ch_tokens ch_tokens_t;

/* vocab 0 skips the range check. *out is owned by the caller (ch_tokens_close). */
int ch_tokens_open(const char *path, uint32_t vocab, ch_tokens_t **out, char *err, size_t errlen);
void ch_tokens_close(ch_tokens_t *t);

const uint16_t *ch_tokens_data(const ch_tokens_t *t); /* borrowed until close; 2-byte aligned */
size_t ch_tokens_count(const ch_tokens_t *t);
ch_tokens_format_t ch_tokens_format(const ch_tokens_t *t);

/* Write tokens as an llm.c file (atomic). For tests, tools and the reference check. */
int ch_tokens_write(const char *path, const uint16_t *tokens, size_t n);

#endif
