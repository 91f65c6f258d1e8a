/* The growing text buffer; see buf.h. */
#include "common/buf.h"

#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void ch_buf_init(ch_buf_t *b)
{
    memset(b, 0, sizeof *b);
}

/* Room for extra more bytes and the NUL; doubles, so appends are amortised O(1). */
static int reserve(ch_buf_t *b, size_t extra)
{
    if (b->err)
        return b->err;
    if (extra > SIZE_MAX / 2 - b->len) {
        b->err = -ENOMEM;
        return b->err;
    }
    if (b->len + extra + 1 <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + extra + 1)
        cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) {
        b->err = -ENOMEM;
        return b->err;
    }
    b->p = p;
    b->cap = cap;
    return 0;
}

void ch_buf_append(ch_buf_t *b, const char *s, size_t n)
{
    if (reserve(b, n) < 0)
        return;
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

void ch_buf_puts(ch_buf_t *b, const char *s)
{
    ch_buf_append(b, s, strlen(s));
}

void ch_buf_label(ch_buf_t *b, const char *s)
{
    for (const char *run = s; *s; run = s) {
        s += strcspn(s, "\\\"\n");
        ch_buf_append(b, run, (size_t)(s - run));
        if (*s)
            ch_buf_puts(b, *s == '\n' ? "\\n" : *s == '"' ? "\\\"" : "\\\\");
        if (*s)
            s++;
    }
}

void ch_buf_printf(ch_buf_t *b, const char *fmt, ...)
{
    if (b->err)
        return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0) {
        b->err = -EINVAL;
        return;
    }
    if (reserve(b, (size_t)n) < 0)
        return;
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

void ch_buf_html(ch_buf_t *b, const char *s)
{
    for (const char *run = s; *s; run = s) {
        while (*s && !strchr("&<>\"'", *s))
            s++;
        ch_buf_append(b, run, (size_t)(s - run));
        if (!*s)
            break;
        switch (*s++) {
        case '&':
            ch_buf_puts(b, "&amp;");
            break;
        case '<':
            ch_buf_puts(b, "&lt;");
            break;
        case '>':
            ch_buf_puts(b, "&gt;");
            break;
        case '"':
            ch_buf_puts(b, "&quot;");
            break;
        default:
            ch_buf_puts(b, "&#39;");
        }
    }
}

int ch_buf_finish(ch_buf_t *b, char **out, size_t *len)
{
    int rc = reserve(b, 0);
    if (rc < 0) {
        ch_buf_fini(b);
        return rc;
    }
    b->p[b->len] = '\0';
    *out = b->p;
    if (len)
        *len = b->len;
    b->p = NULL;
    ch_buf_fini(b);
    return 0;
}

void ch_buf_fini(ch_buf_t *b)
{
    free(b->p);
    memset(b, 0, sizeof *b);
}
