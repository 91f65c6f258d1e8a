/* Fuzz target: the JSON parser (jansson behind the limit scan), the document builder
 * and the string builder (common/json.h).
 *
 * An accepted document must give a well-formed tree: object members named and unique,
 * array elements unnamed, strings NUL-terminated at their length with no NUL inside,
 * numbers finite, integers exact (their text reads back as the same int64), depth and
 * node count within the limits, lookups by key finding each member, and ch_json_u64
 * accepting exactly the non-negative integers. The tree written back out, once with
 * ch_jw (by hand) and once with ch_jb (jansson's dump), must parse to an equal tree.
 * Parsing again under tight limits must either fail or agree. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/json.h"
#include "fuzz.h"

static void check_tree(const ch_json_t *j, size_t depth, size_t *nodes, const ch_json_limits_t *lim)
{
    (*nodes)++;
    switch (j->type) {
    case CH_JSON_NULL:
    case CH_JSON_BOOL:
        FUZZ_ASSERT(j->nkids == 0 && j->str == NULL);
        break;
    case CH_JSON_NUMBER: {
        FUZZ_ASSERT(j->str != NULL && j->len > 0 && j->str[j->len] == '\0');
        FUZZ_ASSERT(strlen(j->str) == j->len);
        FUZZ_ASSERT(j->number - j->number == 0); /* finite */
        uint64_t v = 0;
        int rc = ch_json_u64(j, &v);
        FUZZ_ASSERT((rc == 0) == (j->is_int && j->integer >= 0));
        if (j->is_int) {
            errno = 0;
            long long ref = strtoll(j->str, NULL, 10);
            FUZZ_ASSERT(errno == 0 && ref == j->integer);
        }
        if (rc == 0)
            FUZZ_ASSERT(v == (uint64_t)j->integer);
        break;
    }
    case CH_JSON_STRING:
        FUZZ_ASSERT(j->str != NULL && j->str[j->len] == '\0' && j->nkids == 0);
        FUZZ_ASSERT(strlen(j->str) == j->len); /* \u0000 is refused */
        break;
    case CH_JSON_ARRAY:
    case CH_JSON_OBJECT:
        FUZZ_ASSERT(depth < lim->max_depth);
        FUZZ_ASSERT(j->nkids == 0 || j->kids != NULL);
        for (size_t i = 0; i < j->nkids; i++) {
            const ch_json_t *k = j->kids[i];
            FUZZ_ASSERT((k->key != NULL) == (j->type == CH_JSON_OBJECT));
            if (k->key)
                FUZZ_ASSERT(ch_json_get(j, k->key) == k); /* unique as C strings */
            check_tree(k, depth + 1, nodes, lim);
        }
        break;
    default:
        FUZZ_ASSERT(!"bad node type");
    }
}

static void write_tree(ch_buf_t *w, const ch_json_t *j)
{
    switch (j->type) {
    case CH_JSON_NULL:
        ch_buf_puts(w, "null");
        return;
    case CH_JSON_BOOL:
        ch_buf_puts(w, j->boolean ? "true" : "false");
        return;
    case CH_JSON_NUMBER:
        /* A double whose %.17g looks like an integer stays a double. */
        ch_buf_printf(w, "%s%s", j->str, j->is_int || strpbrk(j->str, ".eE") ? "" : ".0");
        return;
    case CH_JSON_STRING:
        ch_jw_str(w, j->str);
        return;
    case CH_JSON_ARRAY:
    case CH_JSON_OBJECT:
        ch_buf_puts(w, j->type == CH_JSON_ARRAY ? "[" : "{");
        for (size_t i = 0; i < j->nkids; i++) {
            if (i)
                ch_buf_puts(w, ",");
            if (j->kids[i]->key) {
                ch_jw_str(w, j->kids[i]->key);
                ch_buf_puts(w, ":");
            }
            write_tree(w, j->kids[i]);
        }
        ch_buf_puts(w, j->type == CH_JSON_ARRAY ? "]" : "}");
        return;
    }
}

static void build_tree(ch_jb_t *b, const ch_json_t *j)
{
    switch (j->type) {
    case CH_JSON_NULL:
        ch_jb_null(b);
        return;
    case CH_JSON_BOOL:
        ch_jb_bool(b, j->boolean);
        return;
    case CH_JSON_NUMBER:
        if (j->is_int)
            ch_jb_int(b, j->integer);
        else
            ch_jb_double(b, j->number);
        return;
    case CH_JSON_STRING:
        ch_jb_str(b, j->str);
        return;
    case CH_JSON_ARRAY:
    case CH_JSON_OBJECT:
        if (j->type == CH_JSON_ARRAY)
            ch_jb_arr_begin(b);
        else
            ch_jb_obj_begin(b);
        for (size_t i = 0; i < j->nkids; i++) {
            if (j->kids[i]->key)
                ch_jb_key(b, j->kids[i]->key);
            build_tree(b, j->kids[i]);
        }
        if (j->type == CH_JSON_ARRAY)
            ch_jb_arr_end(b);
        else
            ch_jb_obj_end(b);
        return;
    }
}

/* Equal as data; keys compare as C strings (that is what lookups see). */
static int same(const ch_json_t *a, const ch_json_t *b)
{
    if (a->type != b->type || a->nkids != b->nkids)
        return 0;
    if ((a->key == NULL) != (b->key == NULL) || (a->key && strcmp(a->key, b->key) != 0))
        return 0;
    switch (a->type) {
    case CH_JSON_BOOL:
        return a->boolean == b->boolean;
    case CH_JSON_NUMBER:
        return strcmp(a->str, b->str) == 0 && a->number == b->number && a->is_int == b->is_int &&
               a->integer == b->integer;
    case CH_JSON_STRING:
        return a->len == b->len && memcmp(a->str, b->str, a->len) == 0;
    default:
        for (size_t i = 0; i < a->nkids; i++)
            if (!same(a->kids[i], b->kids[i]))
                return 0;
        return 1;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *text = (const char *)data;
    ch_json_limits_t lim = ch_json_default_limits();
    ch_json_t *root = NULL, *again = NULL, *tight = NULL;
    char err[256];
    int rc = ch_json_parse(text, size, &lim, &root, err, sizeof err);
    FUZZ_ASSERT(memchr(err, '\0', sizeof err) != NULL);
    if (rc < 0) {
        FUZZ_ASSERT(root == NULL && err[0] != '\0');
        FUZZ_ASSERT(rc == CH_E_FORMAT || rc == CH_E_TOOBIG || rc == -ENOMEM);
        return 0;
    }
    size_t nodes = 0;
    check_tree(root, 0, &nodes, &lim);
    FUZZ_ASSERT(nodes <= lim.max_nodes);

    ch_buf_t w;
    char *out = NULL;
    size_t outlen = 0;
    ch_buf_init(&w);
    write_tree(&w, root);
    FUZZ_ASSERT(ch_buf_finish(&w, &out, &outlen) == 0 && strlen(out) == outlen);
    if (ch_json_parse(out, outlen, &lim, &again, err, sizeof err) != 0)
        fuzz_fail(__FILE__, __LINE__, err);
    FUZZ_ASSERT(same(root, again));

    /* The same tree through the document builder (jansson's dump). */
    ch_jb_t *b = NULL;
    char *dumped = NULL;
    size_t dlen = 0;
    FUZZ_ASSERT(ch_jb_create(&b) == 0);
    build_tree(b, root);
    rc = ch_jb_finish(b, CH_JB_LINE, &dumped, &dlen);
    ch_jb_destroy(b);
    if (rc == 0) {
        ch_json_t *rebuilt = NULL;
        if (ch_json_parse(dumped, dlen, &lim, &rebuilt, err, sizeof err) != 0)
            fuzz_fail(__FILE__, __LINE__, err);
        FUZZ_ASSERT(same(root, rebuilt));
        ch_json_free(rebuilt);
        free(dumped);
    } else {
        FUZZ_ASSERT(rc == CH_E_TOOBIG); /* deeper than CH_JB_MAX_DEPTH */
    }

    ch_json_limits_t small = {size, 4, 32};
    rc = ch_json_parse(text, size, &small, &tight, err, sizeof err);
    if (rc == 0) {
        FUZZ_ASSERT(same(root, tight));
        size_t n2 = 0;
        check_tree(tight, 0, &n2, &small);
        FUZZ_ASSERT(n2 <= small.max_nodes);
    } else {
        FUZZ_ASSERT(tight == NULL && (rc == CH_E_FORMAT || rc == CH_E_TOOBIG));
    }
    ch_json_free(tight);
    ch_json_free(again);
    ch_json_free(root);
    free(out);
    return 0;
}
