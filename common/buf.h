/* A growing text buffer: the one string builder of the renderers (the coordinator's
 * metrics and status pages, the JSON writer in json.h, run and checkpoint metadata).
 *
 * Zero-initialised is empty and ready (ch_buf_t b = {0}). Errors are sticky: after a
 * failed append (-ENOMEM, or -EINVAL from a bad format) further appends do nothing, and
 * ch_buf_finish returns the error. p is NUL-terminated whenever len > 0 and err == 0. */
#ifndef CH_BUF_H
#define CH_BUF_H

#include <stddef.h>

typedef struct ch_buf {
    char *p;
    size_t len, cap;
    int err;
} ch_buf_t;

void ch_buf_init(ch_buf_t *b);
/* n bytes of s (which need not be NUL-terminated). */
void ch_buf_append(ch_buf_t *b, const char *s, size_t n);
void ch_buf_puts(ch_buf_t *b, const char *s);
void ch_buf_printf(ch_buf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* s as a Prometheus label value: backslash, double quote and newline escaped. */
void ch_buf_label(ch_buf_t *b, const char *s);
/* s with & < > " ' as entities: safe in HTML text and quoted attributes. */
void ch_buf_html(ch_buf_t *b, const char *s);
/* 0 and *out (malloc'd, NUL-terminated even when empty, caller frees; *len its length
 * when len is not NULL), or the sticky error. Releases the buffer either way. */
int ch_buf_finish(ch_buf_t *b, char **out, size_t *len);
void ch_buf_fini(ch_buf_t *b);

#endif
