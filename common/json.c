/* JSON through jansson (json.h).
 *
 * Theory of operation: ch_json_parse checks the size, then pre-scans the text once
 * (scan_limits) to refuse over-deep nesting and too many values with the offset where
 * the limit is crossed, before jansson parses it recursively; jansson then does the
 * grammar, UTF-8, escapes, duplicate keys and integer range, and its error position
 * becomes our offset. The jansson tree is copied into ch_json_t nodes (the tree the
 * readers of this header walk) and released. The document builder keeps a stack of
 * open jansson containers and dumps the root at the end. */
#include "common/json.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"

/* json_int_t must be 64 bits for "integers exact" to hold. */
_Static_assert(sizeof(json_int_t) == sizeof(int64_t), "jansson without 64-bit json_int_t");

ch_json_limits_t ch_json_default_limits(void)
{
    ch_json_limits_t l = {100u << 20, 64, 4u << 20};
    return l;
}

// ----------------------------------------------------------------------------
// parser

__attribute__((format(printf, 4, 5))) static int fail(char *err, size_t errlen, int rc,
                                                      const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return rc;
}

/* jansson recurses once per level and stops at its own JSON_PARSER_MAX_DEPTH (2048);
 * the scan keeps one bit per level up to there. */
#define SCAN_DEPTH 2048

/* One pass over text: nesting depth and the number of values (keys are not values).
 * Exact for well-formed text; for malformed text it only has to stay in bounds, since
 * jansson refuses it next. */
static int scan_limits(const char *s, size_t len, const ch_json_limits_t *lim, char *err,
                       size_t errlen)
{
    unsigned char is_obj[SCAN_DEPTH / 8] = {0};
    size_t depth = 0, nodes = 0, max_depth = lim->max_depth;
    int expect_key = 0; /* just after '{' or ',' inside an object */

    if (max_depth > SCAN_DEPTH - 1)
        max_depth = SCAN_DEPTH - 1;
    for (size_t i = 0; i < len; i++) {
        char c = s[i];
        int value = 0;
        switch (c) {
        case '{':
        case '[':
            if (depth >= max_depth)
                return fail(err, errlen, CH_E_FORMAT, "offset %zu: nesting deeper than %zu", i,
                            max_depth);
            depth++;
            if (c == '{')
                is_obj[depth / 8] |= (unsigned char)(1u << (depth % 8));
            else
                is_obj[depth / 8] &= (unsigned char)~(1u << (depth % 8));
            expect_key = c == '{';
            value = 1;
            break;
        case '}':
        case ']':
            if (depth)
                depth--;
            expect_key = 0;
            break;
        case ',':
            expect_key = depth && (is_obj[depth / 8] >> (depth % 8) & 1);
            break;
        case '"':
            value = !expect_key;
            expect_key = 0;
            for (i++; i < len && s[i] != '"'; i++)
                if (s[i] == '\\')
                    i++;
            break;
        default:
            if (c == '-' || (c >= '0' && c <= '9') || c == 't' || c == 'f' || c == 'n') {
                value = 1;
                while (i + 1 < len && s[i + 1] && strchr("0123456789+-.eEtrufalsn", s[i + 1]))
                    i++;
            }
        }
        if (value && ++nodes > lim->max_nodes)
            return fail(err, errlen, CH_E_TOOBIG, "offset %zu: more than %zu values", i,
                        lim->max_nodes);
    }
    return 0;
}

static ch_json_t *convert(const json_t *v);

static int convert_kids(const json_t *v, ch_json_t *n)
{
    size_t count = json_is_object(v) ? json_object_size(v) : json_array_size(v);
    if (count == 0)
        return 0;
    if (!(n->kids = calloc(count, sizeof *n->kids)))
        return -ENOMEM;
    if (json_is_array(v)) {
        for (size_t i = 0; i < count; i++) {
            if (!(n->kids[i] = convert(json_array_get(v, i))))
                return -ENOMEM;
            n->nkids++;
        }
        return 0;
    }
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)v, key, val)
    {
        ch_json_t *k = convert(val);
        if (!k)
            return -ENOMEM;
        n->kids[n->nkids++] = k;
        if (!(k->key = strdup(key)))
            return -ENOMEM;
    }
    return 0;
}

/* A copy of v as ch_json_t; NULL when out of memory. Depth was bounded by the scan. */
static ch_json_t *convert(const json_t *v)
{
    ch_json_t *n = calloc(1, sizeof *n);
    char num[32];
    int rc = 0;
    if (!n)
        return NULL;
    switch (json_typeof(v)) {
    case JSON_OBJECT:
    case JSON_ARRAY:
        n->type = json_is_object(v) ? CH_JSON_OBJECT : CH_JSON_ARRAY;
        rc = convert_kids(v, n);
        break;
    case JSON_STRING:
        n->type = CH_JSON_STRING;
        n->len = json_string_length(v);
        if ((n->str = malloc(n->len + 1))) {
            memcpy(n->str, json_string_value(v), n->len);
            n->str[n->len] = '\0';
        } else {
            rc = -ENOMEM;
        }
        break;
    case JSON_INTEGER:
        n->type = CH_JSON_NUMBER;
        n->is_int = 1;
        n->integer = json_integer_value(v);
        n->number = (double)n->integer;
        snprintf(num, sizeof num, "%" PRId64, n->integer);
        rc = (n->str = strdup(num)) ? 0 : -ENOMEM;
        break;
    case JSON_REAL:
        n->type = CH_JSON_NUMBER;
        n->number = json_real_value(v);
        snprintf(num, sizeof num, "%.17g", n->number);
        rc = (n->str = strdup(num)) ? 0 : -ENOMEM;
        break;
    case JSON_TRUE:
    case JSON_FALSE:
        n->type = CH_JSON_BOOL;
        n->boolean = json_is_true(v);
        break;
    case JSON_NULL:
        n->type = CH_JSON_NULL;
        break;
    }
    if (n->str)
        n->len = n->type == CH_JSON_NUMBER ? strlen(n->str) : n->len;
    if (rc < 0) {
        ch_json_free(n);
        return NULL;
    }
    return n;
}

int ch_json_parse(const char *text, size_t len, const ch_json_limits_t *limits, ch_json_t **out,
                  char *err, size_t errlen)
{
    ch_json_limits_t lim = limits ? *limits : ch_json_default_limits();
    json_error_t jerr;

    *out = NULL;
    if (err && errlen)
        err[0] = '\0';
    if (len > lim.max_bytes)
        return fail(err, errlen, CH_E_TOOBIG,
                    "offset %zu: document of %zu bytes is over the limit of %zu", lim.max_bytes,
                    len, lim.max_bytes);
    int rc = scan_limits(text, len, &lim, err, errlen);
    if (rc < 0)
        return rc;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &jerr);
    if (!root) {
        if (json_error_code(&jerr) == json_error_out_of_memory)
            return fail(err, errlen, -ENOMEM, "offset %d: out of memory", jerr.position);
        return fail(err, errlen, CH_E_FORMAT, "offset %d: %s", jerr.position, jerr.text);
    }
    *out = convert(root);
    json_decref(root);
    if (!*out)
        return fail(err, errlen, -ENOMEM, "offset 0: out of memory");
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
    if (!num || num->type != CH_JSON_NUMBER || !num->is_int || num->integer < 0)
        return CH_E_FORMAT;
    *out = (uint64_t)num->integer;
    return 0;
}

// ----------------------------------------------------------------------------
// document builder

struct ch_jb {
    json_t *root;
    json_t *stack[CH_JB_MAX_DEPTH]; /* open containers, borrowed from root */
    int depth;
    char *key; /* pending object key */
    int err;
};

int ch_jb_create(ch_jb_t **out)
{
    *out = calloc(1, sizeof **out);
    return *out ? 0 : -ENOMEM;
}

void ch_jb_destroy(ch_jb_t *b)
{
    if (!b)
        return;
    json_decref(b->root);
    free(b->key);
    free(b);
}

/* Place v (a new reference, may be NULL after a failed allocation) where the document
 * is: the root, the next array element, or the member under the pending key. */
static json_t *place(ch_jb_t *b, json_t *v)
{
    if (!v) {
        b->err = b->err ? b->err : -ENOMEM;
        return NULL;
    }
    if (b->err) {
        json_decref(v);
        return NULL;
    }
    json_t *top = b->depth ? b->stack[b->depth - 1] : NULL;
    int rc = 0;
    if (!top) {
        if (b->root)
            rc = -EINVAL; /* a second root */
        else
            b->root = json_incref(v);
    } else if (json_is_array(top)) {
        rc = json_array_append(top, v) ? -ENOMEM : 0;
    } else if (!b->key) {
        rc = -EINVAL; /* an object member without a key */
    } else {
        rc = json_object_set(top, b->key, v) ? -ENOMEM : 0;
        free(b->key);
        b->key = NULL;
    }
    json_decref(v); /* the document holds it now (or nobody does) */
    if (rc < 0) {
        b->err = rc;
        return NULL;
    }
    return v;
}

static void open_level(ch_jb_t *b, json_t *v)
{
    if (b->depth == CH_JB_MAX_DEPTH) {
        json_decref(v);
        b->err = b->err ? b->err : CH_E_TOOBIG;
        return;
    }
    if (place(b, v))
        b->stack[b->depth++] = v;
}

static void close_level(ch_jb_t *b, int object)
{
    if (b->err)
        return;
    if (!b->depth || json_is_object(b->stack[b->depth - 1]) != object || b->key)
        b->err = -EINVAL;
    else
        b->depth--;
}

void ch_jb_obj_begin(ch_jb_t *b)
{
    open_level(b, json_object());
}

void ch_jb_obj_end(ch_jb_t *b)
{
    close_level(b, 1);
}

void ch_jb_arr_begin(ch_jb_t *b)
{
    open_level(b, json_array());
}

void ch_jb_arr_end(ch_jb_t *b)
{
    close_level(b, 0);
}

void ch_jb_key(ch_jb_t *b, const char *key)
{
    if (b->err)
        return;
    free(b->key);
    if (!(b->key = strdup(key)))
        b->err = -ENOMEM;
}

void ch_jb_str(ch_jb_t *b, const char *s)
{
    if (!s) {
        ch_jb_null(b);
        return;
    }
    json_t *v = json_string(s);
    if (!v && !b->err)
        b->err = CH_E_FORMAT; /* json_string refuses invalid UTF-8 */
    place(b, v);
}

void ch_jb_int(ch_jb_t *b, int64_t v)
{
    place(b, json_integer((json_int_t)v));
}

void ch_jb_uint(ch_jb_t *b, uint64_t v)
{
    place(b, v <= INT64_MAX ? json_integer((json_int_t)v) : json_real((double)v));
}

void ch_jb_double(ch_jb_t *b, double v)
{
    place(b, isfinite(v) ? json_real(v) : json_null());
}

void ch_jb_bool(ch_jb_t *b, int v)
{
    place(b, json_boolean(v));
}

void ch_jb_null(ch_jb_t *b)
{
    place(b, json_null());
}

int ch_jb_finish(ch_jb_t *b, int style, char **out, size_t *len)
{
    *out = NULL;
    if (b->err)
        return b->err;
    if (!b->root || b->depth || b->key)
        return -EINVAL;
    size_t flags = JSON_ENCODE_ANY | JSON_REAL_PRECISION(17) |
                   (style == CH_JB_LINE ? JSON_COMPACT : JSON_INDENT(2));
    char *text = json_dumps(b->root, flags);
    if (!text)
        return -ENOMEM;
    *out = text;
    if (len)
        *len = strlen(text);
    return 0;
}

// ----------------------------------------------------------------------------
// writer

void ch_jw_str(ch_buf_t *w, const char *s)
{
    ch_buf_append(w, "\"", 1);
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        char esc[8];
        switch (*c) {
        case '"':
            ch_buf_append(w, "\\\"", 2);
            break;
        case '\\':
            ch_buf_append(w, "\\\\", 2);
            break;
        case '\n':
            ch_buf_append(w, "\\n", 2);
            break;
        case '\r':
            ch_buf_append(w, "\\r", 2);
            break;
        case '\t':
            ch_buf_append(w, "\\t", 2);
            break;
        default:
            if (*c < 0x20) {
                snprintf(esc, sizeof esc, "\\u%04x", *c);
                ch_buf_append(w, esc, 6);
            } else {
                ch_buf_append(w, (const char *)c, 1);
            }
        }
    }
    ch_buf_append(w, "\"", 1);
}
