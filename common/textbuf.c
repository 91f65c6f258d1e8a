/* The growing text buffer; see textbuf.h. */
#include "common/textbuf.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Room for n more bytes and a NUL. */
static int reserve(ch_buf_t *b, size_t n)
{
    if (b->err)
        return b->err;
    if (b->cap - b->len > n)
        return 0;
    size_t cap = (b->cap + n + 1) * 2;
    char *p = realloc(b->p, cap);
    if (!p)
        return b->err = -ENOMEM;
    b->p = p;
    b->cap = cap;
    return 0;
}

void ch_buf_printf(ch_buf_t *b, const char *fmt, ...)
{
    va_list ap;
    for (int tries = 0; tries < 2 && !b->err; tries++) {
        va_start(ap, fmt);
        int n = vsnprintf(b->p ? b->p + b->len : NULL, b->cap - b->len, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->err = -EINVAL;
            return;
        }
        if ((size_t)n < b->cap - b->len) {
            b->len += (size_t)n;
            return;
        }
        if (reserve(b, (size_t)n) < 0)
            return;
    }
}

void ch_buf_puts(ch_buf_t *b, const char *s)
{
    ch_buf_put(b, s, strlen(s));
}

void ch_buf_put(ch_buf_t *b, const void *data, size_t n)
{
    if (reserve(b, n) < 0)
        return;
    memcpy(b->p + b->len, data, n);
    b->len += n;
    b->p[b->len] = '\0';
}

void ch_buf_label(ch_buf_t *b, const char *s)
{
    for (const char *run = s; *s; run = s) {
        s += strcspn(s, "\\\"\n");
        ch_buf_put(b, run, (size_t)(s - run));
        if (*s)
            ch_buf_puts(b, *s == '\n' ? "\\n" : *s == '"' ? "\\\"" : "\\\\");
        if (*s)
            s++;
    }
}

void ch_buf_fini(ch_buf_t *b)
{
    free(b->p);
    memset(b, 0, sizeof *b);
}
