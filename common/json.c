/* Strict JSON parser and string builder (json.h).
 *
 * Recursive descent over a bounded buffer. Depth is limited before recursing, so a
 * hostile "[[[[..." cannot exhaust the stack; the node count bounds memory. Strings
 * must be valid UTF-8 without raw control characters; \uXXXX escapes (with surrogate
 * pairs) are decoded to UTF-8. */
#include "common/json.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"

ch_json_limits_t ch_json_default_limits(void)
{
    ch_json_limits_t l = {100u << 20, 64, 4u << 20};
    return l;
}

// ----------------------------------------------------------------------------
// parser

typedef struct parser {
    const char *s;
    size_t len, pos;
    ch_json_limits_t lim;
    size_t nodes;
    char *err;
    size_t errlen;
    int rc;
} parser_t;

__attribute__((format(printf, 3, 4))) static int fail(parser_t *p, int rc, const char *fmt, ...)
{
    if (p->rc == 0) {
        p->rc = rc;
        if (p->err && p->errlen) {
            int n = snprintf(p->err, p->errlen, "offset %zu: ", p->pos);
            if (n >= 0 && (size_t)n < p->errlen) {
                va_list ap;
                va_start(ap, fmt);
                vsnprintf(p->err + n, p->errlen - (size_t)n, fmt, ap);
                va_end(ap);
            }
        }
    }
    return p->rc;
}

static void skip_ws(parser_t *p)
{
    while (p->pos < p->len) {
        char c = p->s[p->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r')
            break;
        p->pos++;
    }
}

static ch_json_t *new_node(parser_t *p, ch_json_type_t type)
{
    if (++p->nodes > p->lim.max_nodes) {
        fail(p, CH_E_TOOBIG, "more than %zu values", p->lim.max_nodes);
        return NULL;
    }
    ch_json_t *n = calloc(1, sizeof *n);
    if (!n) {
        fail(p, -ENOMEM, "out of memory");
        return NULL;
    }
    n->type = type;
    return n;
}

static int add_kid(parser_t *p, ch_json_t *parent, ch_json_t *kid, size_t *cap)
{
    if (parent->nkids == *cap) {
        size_t ncap = *cap ? *cap * 2 : 4;
        ch_json_t **k = realloc(parent->kids, ncap * sizeof *k);
        if (!k)
            return fail(p, -ENOMEM, "out of memory");
        parent->kids = k;
        *cap = ncap;
    }
    parent->kids[parent->nkids++] = kid;
    return 0;
}

static int hex4(parser_t *p, unsigned *out)
{
    if (p->len - p->pos < 4)
        return fail(p, CH_E_FORMAT, "truncated \\u escape");
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p->s[p->pos++];
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f')
            v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            v |= (unsigned)(c - 'A' + 10);
        else
            return fail(p, CH_E_FORMAT, "bad hex digit in \\u escape");
    }
    *out = v;
    return 0;
}

static size_t put_utf8(char *o, unsigned cp)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Length of the valid UTF-8 sequence at s (at most n bytes), 0 if invalid. */
static size_t utf8_len(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    size_t len;
    unsigned cp, min;
    if (c < 0x80)
        return 1;
    if ((c & 0xE0) == 0xC0) {
        len = 2, cp = c & 0x1F, min = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
        len = 3, cp = c & 0x0F, min = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
        len = 4, cp = c & 0x07, min = 0x10000;
    } else {
        return 0;
    }
    if (n < len)
        return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return 0;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
        return 0;
    return len;
}

/* Parses a string at p->pos (at the opening quote) into a malloc'd buffer. */
static int parse_string(parser_t *p, char **out, size_t *outlen)
{
    p->pos++; /* opening quote */
    /* Decoded output is never longer than the source. Find the end first to size it. */
    size_t start = p->pos, end = start;
    while (end < p->len && p->s[end] != '"') {
        if (p->s[end] == '\\')
            end++;
        end++;
    }
    if (end >= p->len)
        return fail(p, CH_E_FORMAT, "unterminated string");
    char *buf = malloc(end - start + 1);
    if (!buf)
        return fail(p, -ENOMEM, "out of memory");
    size_t n = 0;
    while (p->pos < end) {
        unsigned char c = (unsigned char)p->s[p->pos];
        if (c < 0x20) {
            free(buf);
            return fail(p, CH_E_FORMAT, "control character in string");
        }
        if (c != '\\') {
            size_t l = utf8_len((const unsigned char *)p->s + p->pos, end - p->pos);
            if (!l) {
                free(buf);
                return fail(p, CH_E_FORMAT, "invalid UTF-8 in string");
            }
            memcpy(buf + n, p->s + p->pos, l);
            n += l;
            p->pos += l;
            continue;
        }
        p->pos++;
        char e = p->s[p->pos++];
        switch (e) {
        case '"':
            buf[n++] = '"';
            break;
        case '\\':
            buf[n++] = '\\';
            break;
        case '/':
            buf[n++] = '/';
            break;
        case 'b':
            buf[n++] = '\b';
            break;
        case 'f':
            buf[n++] = '\f';
            break;
        case 'n':
            buf[n++] = '\n';
            break;
        case 'r':
            buf[n++] = '\r';
            break;
        case 't':
            buf[n++] = '\t';
            break;
        case 'u': {
            unsigned cp, lo;
            if (hex4(p, &cp) < 0) {
                free(buf);
                return p->rc;
            }
            if (cp >= 0xDC00 && cp <= 0xDFFF) {
                free(buf);
                return fail(p, CH_E_FORMAT, "lone low surrogate in \\u escape");
            }
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                if (p->pos + 2 > end || p->s[p->pos] != '\\' || p->s[p->pos + 1] != 'u') {
                    free(buf);
                    return fail(p, CH_E_FORMAT, "high surrogate without low surrogate");
                }
                p->pos += 2;
                if (hex4(p, &lo) < 0) {
                    free(buf);
                    return p->rc;
                }
                if (lo < 0xDC00 || lo > 0xDFFF) {
                    free(buf);
                    return fail(p, CH_E_FORMAT, "bad low surrogate in \\u escape");
                }
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            }
            /* A 6-byte escape yields at most 3 bytes, a 12-byte pair 4: fits. */
            n += put_utf8(buf + n, cp);
            break;
        }
        default:
            free(buf);
            return fail(p, CH_E_FORMAT, "bad escape '\\%c'", e >= 0x20 && e < 0x7f ? e : '?');
        }
    }
    if (p->pos != end) { /* an escape ran into the closing quote */
        free(buf);
        return fail(p, CH_E_FORMAT, "unterminated string");
    }
    p->pos = end + 1;
    buf[n] = '\0';
    *out = buf;
    *outlen = n;
    return 0;
}

static int parse_number(parser_t *p, ch_json_t *node)
{
    size_t start = p->pos;
    const char *s = p->s;
#define AT(i) ((i) < p->len ? s[i] : '\0')
    size_t i = start;
    if (AT(i) == '-')
        i++;
    if (AT(i) == '0') {
        i++;
    } else if (AT(i) >= '1' && AT(i) <= '9') {
        while (AT(i) >= '0' && AT(i) <= '9')
            i++;
    } else {
        return fail(p, CH_E_FORMAT, "bad number");
    }
    if (AT(i) == '.') {
        i++;
        if (!(AT(i) >= '0' && AT(i) <= '9'))
            return fail(p, CH_E_FORMAT, "bad number: digit expected after '.'");
        while (AT(i) >= '0' && AT(i) <= '9')
            i++;
    }
    if (AT(i) == 'e' || AT(i) == 'E') {
        i++;
        if (AT(i) == '+' || AT(i) == '-')
            i++;
        if (!(AT(i) >= '0' && AT(i) <= '9'))
            return fail(p, CH_E_FORMAT, "bad number: digit expected in exponent");
        while (AT(i) >= '0' && AT(i) <= '9')
            i++;
    }
#undef AT
    size_t n = i - start;
    node->str = malloc(n + 1);
    if (!node->str)
        return fail(p, -ENOMEM, "out of memory");
    memcpy(node->str, s + start, n);
    node->str[n] = '\0';
    node->len = n;
    node->number = strtod(node->str, NULL);
    if (!isfinite(node->number))
        return fail(p, CH_E_FORMAT, "number out of range");
    p->pos = i;
    return 0;
}

static int literal(parser_t *p, const char *word)
{
    size_t n = strlen(word);
    if (p->len - p->pos < n || memcmp(p->s + p->pos, word, n) != 0)
        return fail(p, CH_E_FORMAT, "unexpected character");
    p->pos += n;
    return 0;
}

/* Keys compare as C strings: a key with an embedded \u0000 clashes with its prefix,
 * which errs on the strict side. */
static int cmp_keys(const void *a, const void *b)
{
    const ch_json_t *x = *(const ch_json_t *const *)a, *y = *(const ch_json_t *const *)b;
    return strcmp(x->key, y->key);
}

/* O(n log n), so a header with many tensors stays cheap. */
static int check_duplicates(parser_t *p, ch_json_t *obj)
{
    if (obj->nkids < 2)
        return 0;
    ch_json_t **sorted = malloc(obj->nkids * sizeof *sorted);
    if (!sorted)
        return fail(p, -ENOMEM, "out of memory");
    memcpy(sorted, obj->kids, obj->nkids * sizeof *sorted);
    qsort(sorted, obj->nkids, sizeof *sorted, cmp_keys);
    int rc = 0;
    for (size_t i = 1; i < obj->nkids; i++) {
        if (cmp_keys(&sorted[i - 1], &sorted[i]) == 0) {
            rc = fail(p, CH_E_FORMAT, "duplicate key \"%.64s\"", sorted[i]->key);
            break;
        }
    }
    free(sorted);
    return rc;
}

static int parse_value(parser_t *p, size_t depth, ch_json_t **out);

static int parse_container(parser_t *p, size_t depth, ch_json_t *node)
{
    int is_obj = node->type == CH_JSON_OBJECT;
    char close = is_obj ? '}' : ']';
    size_t cap = 0;
    p->pos++;
    skip_ws(p);
    if (p->pos < p->len && p->s[p->pos] == close) {
        p->pos++;
        return 0;
    }
    for (;;) {
        char *key = NULL;
        size_t keylen;
        skip_ws(p);
        if (is_obj) {
            if (p->pos >= p->len || p->s[p->pos] != '"')
                return fail(p, CH_E_FORMAT, "object key (string) expected");
            if (parse_string(p, &key, &keylen) < 0)
                return p->rc;
            skip_ws(p);
            if (p->pos >= p->len || p->s[p->pos] != ':') {
                free(key);
                return fail(p, CH_E_FORMAT, "':' expected after object key");
            }
            p->pos++;
        }
        ch_json_t *kid = NULL;
        if (parse_value(p, depth + 1, &kid) < 0) {
            free(key);
            return p->rc;
        }
        kid->key = key;
        if (add_kid(p, node, kid, &cap) < 0) {
            ch_json_free(kid);
            return p->rc;
        }
        skip_ws(p);
        if (p->pos >= p->len)
            return fail(p, CH_E_FORMAT, "unexpected end of input in %s",
                        is_obj ? "object" : "array");
        char c = p->s[p->pos++];
        if (c == close)
            break;
        if (c != ',')
            return fail(p, CH_E_FORMAT, "',' or '%c' expected", close);
    }
    return 0;
}

static int parse_value(parser_t *p, size_t depth, ch_json_t **out)
{
    *out = NULL;
    skip_ws(p);
    if (p->pos >= p->len)
        return fail(p, CH_E_FORMAT, "unexpected end of input");
    char c = p->s[p->pos];
    ch_json_t *node = NULL;
    int rc = 0;
    switch (c) {
    case '{':
    case '[':
        if (depth >= p->lim.max_depth)
            return fail(p, CH_E_FORMAT, "nesting deeper than %zu", p->lim.max_depth);
        node = new_node(p, c == '{' ? CH_JSON_OBJECT : CH_JSON_ARRAY);
        if (!node)
            return p->rc;
        rc = parse_container(p, depth, node);
        if (rc == 0 && node->type == CH_JSON_OBJECT)
            rc = check_duplicates(p, node);
        break;
    case '"':
        node = new_node(p, CH_JSON_STRING);
        if (!node)
            return p->rc;
        rc = parse_string(p, &node->str, &node->len);
        break;
    case 't':
    case 'f':
        node = new_node(p, CH_JSON_BOOL);
        if (!node)
            return p->rc;
        node->boolean = c == 't';
        rc = literal(p, c == 't' ? "true" : "false");
        break;
    case 'n':
        node = new_node(p, CH_JSON_NULL);
        if (!node)
            return p->rc;
        rc = literal(p, "null");
        break;
    default:
        if (c == '-' || (c >= '0' && c <= '9')) {
            node = new_node(p, CH_JSON_NUMBER);
            if (!node)
                return p->rc;
            rc = parse_number(p, node);
        } else {
            return fail(p, CH_E_FORMAT, "unexpected character");
        }
    }
    if (rc < 0) {
        ch_json_free(node);
        return rc;
    }
    *out = node;
    return 0;
}

int ch_json_parse(const char *text, size_t len, const ch_json_limits_t *limits, ch_json_t **out,
                  char *err, size_t errlen)
{
    parser_t p = {.s = text, .len = len, .err = err, .errlen = errlen};
    p.lim = limits ? *limits : ch_json_default_limits();
    *out = NULL;
    if (err && errlen)
        err[0] = '\0';
    if (len > p.lim.max_bytes)
        return fail(&p, CH_E_TOOBIG, "document of %zu bytes is over the limit of %zu", len,
                    p.lim.max_bytes);
    ch_json_t *root = NULL;
    if (parse_value(&p, 0, &root) < 0)
        return p.rc;
    skip_ws(&p);
    if (p.pos != p.len) {
        ch_json_free(root);
        return fail(&p, CH_E_FORMAT, "trailing characters after the value");
    }
    *out = root;
    return 0;
}

void ch_json_free(ch_json_t *j)
{
    if (!j)
        return;
    for (size_t i = 0; i < j->nkids; i++)
        ch_json_free(j->kids[i]);
    free(j->kids);
    free(j->key);
    free(j->str);
    free(j);
}

const ch_json_t *ch_json_get(const ch_json_t *obj, const char *key)
{
    if (!obj || obj->type != CH_JSON_OBJECT)
        return NULL;
    for (size_t i = 0; i < obj->nkids; i++)
        if (strcmp(obj->kids[i]->key, key) == 0)
            return obj->kids[i];
    return NULL;
}

const char *ch_json_get_str(const ch_json_t *obj, const char *key)
{
    const ch_json_t *v = ch_json_get(obj, key);
    return v && v->type == CH_JSON_STRING ? v->str : NULL;
}

int ch_json_u64(const ch_json_t *num, uint64_t *out)
{
    if (!num || num->type != CH_JSON_NUMBER || num->len == 0)
        return CH_E_FORMAT;
    uint64_t v = 0;
    for (size_t i = 0; i < num->len; i++) {
        char c = num->str[i];
        if (c < '0' || c > '9')
            return CH_E_FORMAT;
        unsigned d = (unsigned)(c - '0');
        if (v > (UINT64_MAX - d) / 10)
            return CH_E_FORMAT;
        v = v * 10 + d;
    }
    *out = v;
    return 0;
}

// ----------------------------------------------------------------------------
// writer

void ch_jw_init(ch_jw_t *w)
{
    memset(w, 0, sizeof *w);
}

static int reserve(ch_jw_t *w, size_t extra)
{
    if (w->err)
        return w->err;
    if (extra > SIZE_MAX / 2 - w->len) {
        w->err = -ENOMEM;
        return w->err;
    }
    if (w->len + extra + 1 <= w->cap)
        return 0;
    size_t ncap = w->cap ? w->cap : 256;
    while (ncap < w->len + extra + 1)
        ncap *= 2;
    char *b = realloc(w->buf, ncap);
    if (!b) {
        w->err = -ENOMEM;
        return w->err;
    }
    w->buf = b;
    w->cap = ncap;
    return 0;
}

static void append(ch_jw_t *w, const char *s, size_t n)
{
    if (reserve(w, n) < 0)
        return;
    memcpy(w->buf + w->len, s, n);
    w->len += n;
    w->buf[w->len] = '\0';
}

void ch_jw_raw(ch_jw_t *w, const char *s)
{
    append(w, s, strlen(s));
}

void ch_jw_printf(ch_jw_t *w, const char *fmt, ...)
{
    if (w->err)
        return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0) {
        w->err = -EINVAL;
        return;
    }
    if (reserve(w, (size_t)n) < 0)
        return;
    va_start(ap, fmt);
    vsnprintf(w->buf + w->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    w->len += (size_t)n;
}

void ch_jw_str(ch_jw_t *w, const char *s)
{
    append(w, "\"", 1);
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        char esc[8];
        switch (*c) {
        case '"':
            append(w, "\\\"", 2);
            break;
        case '\\':
            append(w, "\\\\", 2);
            break;
        case '\n':
            append(w, "\\n", 2);
            break;
        case '\r':
            append(w, "\\r", 2);
            break;
        case '\t':
            append(w, "\\t", 2);
            break;
        default:
            if (*c < 0x20) {
                snprintf(esc, sizeof esc, "\\u%04x", *c);
                append(w, esc, 6);
            } else {
                append(w, (const char *)c, 1);
            }
        }
    }
    append(w, "\"", 1);
}

int ch_jw_finish(ch_jw_t *w, char **out, size_t *len)
{
    int rc = w->err;
    if (rc == 0 && reserve(w, 0) < 0)
        rc = w->err;
    if (rc < 0) {
        ch_jw_fini(w);
        return rc;
    }
    *out = w->buf;
    if (len)
        *len = w->len;
    w->buf = NULL;
    ch_jw_fini(w);
    return 0;
}

void ch_jw_fini(ch_jw_t *w)
{
    free(w->buf);
    memset(w, 0, sizeof *w);
}
