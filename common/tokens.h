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

/* A text file as tokens: each byte one token (vocab 256, nanoGPT's shakespeare_char
 * without its character table). Refuses an empty file. */
int ch_tokens_open_text(const char *path, ch_tokens_t **out, char *err, size_t errlen);

// ----------------------------------------------------------------------------
// sources: what train.data and train.val_data name

#define CH_TOKENS_TEXT_PREFIX "text:"
#define CH_TOKENS_TEXT_VOCAB  256

typedef enum {
    CH_SOURCE_BUILTIN = 0, /* "" or "builtin": the generated corpus */
    CH_SOURCE_TEXT,        /* "text:FILE" */
    CH_SOURCE_FILE,        /* one token file */
    CH_SOURCE_SHARDS       /* a glob (* ? [): token files, sorted by name, read in order */
} ch_source_kind_t;

ch_source_kind_t ch_tokens_source_kind(const char *source);
/* The files a source names: the text file, the token file, or the glob's matches in
 * sorted order (CH_E_CONFIG "glob matches no file" when none). *files and its strings
 * malloc'd: ch_tokens_files_free. A builtin source has none. */
int ch_tokens_source_files(const char *source, char ***files, size_t *n, char *err, size_t errlen);
void ch_tokens_files_free(char **files, size_t n);
/* Open file i of a source of that kind (text: bytes; else a token file checked < vocab). */
int ch_tokens_open_source(ch_source_kind_t kind, const char *file, uint32_t vocab,
                          ch_tokens_t **out, char *err, size_t errlen);
/* Check a whole source as a job will read it: every file opens, is not empty, holds more
 * than seq_len tokens and every token is < vocab (a text source needs vocab >= 256).
 * CH_E_CONFIG with the reason (the caller prefixes the field). */
int ch_tokens_source_check(const char *source, uint32_t vocab, uint32_t seq_len, char *err,
                           size_t errlen);

/* Write tokens as an llm.c file (atomic). For tests, tools and the reference check. */
int ch_tokens_write(const char *path, const uint16_t *tokens, size_t n);

#endif
