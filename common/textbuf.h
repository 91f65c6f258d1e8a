/* A growing text buffer for renderers (the daemons' /metrics, the status page). Errors are
 * sticky in err: render everything, check once at the end. */
#ifndef CH_TEXTBUF_H
#define CH_TEXTBUF_H

#include <stddef.h>

typedef struct ch_buf {
    char *p; /* NUL-terminated once anything is written; owned */
    size_t len, cap;
    int err; /* 0, or the first failure (-ENOMEM, -EINVAL) */
} ch_buf_t;

void ch_buf_printf(ch_buf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void ch_buf_puts(ch_buf_t *b, const char *s);
/* Append n bytes as they are (a body that may hold any byte). */
void ch_buf_put(ch_buf_t *b, const void *data, size_t n);
/* s as a Prometheus label value: backslash, double quote and newline escaped. */
void ch_buf_label(ch_buf_t *b, const char *s);
void ch_buf_fini(ch_buf_t *b);

#endif
