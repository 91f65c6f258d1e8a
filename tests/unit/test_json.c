/* common/json: strict parsing through jansson, limits, hostile input, the document
 * builder, string escaping. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/json.h"

static int parse(const char *s, ch_json_t **out)
{
    char err[160];
    return ch_json_parse(s, strlen(s), NULL, out, err, sizeof err);
}

static void expect_bad(const char *s)
{
    ch_json_t *j = NULL;
    char err[160] = "";
    int rc = ch_json_parse(s, strlen(s), NULL, &j, err, sizeof err);
    cr_expect(rc < 0, "accepted: %s", s);
    cr_expect(j == NULL);
    cr_expect(strncmp(err, "offset ", 7) == 0, "message '%s' for %s", err, s);
}

Test(json, parses_a_document_into_a_tree)
{
    ch_json_t *j = NULL;
    cr_assert_eq(
        parse(" {\"a\": [1, -2.5e3, true, false, null], \"s\": \"x\\ty\\u00e9\\ud83d\\ude00\","
              " \"big\": 9223372036854775807, \"o\": {}} ",
              &j),
        0);
    cr_assert_eq(j->type, CH_JSON_OBJECT);
    cr_assert_eq(j->nkids, 4);
    const ch_json_t *a = ch_json_get(j, "a");
    cr_assert(a && a->type == CH_JSON_ARRAY && a->nkids == 5);
    cr_expect_eq(a->kids[0]->number, 1.0);
    cr_expect_eq(a->kids[1]->number, -2500.0);
    cr_expect_eq(a->kids[2]->type, CH_JSON_BOOL);
    cr_expect_eq(a->kids[2]->boolean, 1);
    cr_expect_eq(a->kids[3]->boolean, 0);
    cr_expect_eq(a->kids[4]->type, CH_JSON_NULL);
    cr_expect_str_eq(ch_json_get_str(j, "s"), "x\ty\xc3\xa9\xf0\x9f\x98\x80");
    uint64_t big = 0;
    cr_expect_eq(ch_json_u64(ch_json_get(j, "big"), &big), 0);
    cr_expect_eq(big, (uint64_t)INT64_MAX); /* exact, not rounded through a double */
    cr_expect(ch_json_get(j, "big")->is_int);
    cr_expect_not(a->kids[1]->is_int);
    cr_expect_eq(ch_json_u64(a->kids[1], &big), CH_E_FORMAT); /* not a non-negative integer */
    cr_expect_null(ch_json_get(j, "missing"));
    cr_expect_eq(ch_json_get(j, "o")->nkids, 0);
    ch_json_free(j);
}

Test(json, integers_outside_int64_are_refused_not_rounded)
{
    ch_json_t *j = NULL;
    uint64_t v;
    expect_bad("9223372036854775808");
    expect_bad("[18446744073709551616]");
    cr_assert_eq(parse("-9223372036854775808", &j), 0);
    cr_expect(j->is_int && j->integer == INT64_MIN);
    cr_expect_eq(ch_json_u64(j, &v), CH_E_FORMAT); /* negative */
    ch_json_free(j);
    cr_assert_eq(parse("1e3", &j), 0);
    cr_expect_eq(ch_json_u64(j, &v), CH_E_FORMAT); /* written with an exponent */
    ch_json_free(j);
}

Test(json, errors_name_the_offset_of_the_fault)
{
    ch_json_t *j = NULL;
    char err[160];
    const char *dup = "{\"a\":1,\n \"a\":2}";
    cr_assert_eq(ch_json_parse(dup, strlen(dup), NULL, &j, err, sizeof err), CH_E_FORMAT);
    cr_expect(strstr(err, "duplicate") != NULL, "%s", err);
    unsigned long off = 0;
    cr_assert_eq(sscanf(err, "offset %lu", &off), 1, "%s", err);
    cr_expect(off >= 8 && off <= strlen(dup), "offset %lu for %s", off, err);
}

Test(json, rejects_malformed_input)
{
    const char *bad[] = {
        "",
        "   ",
        "{",
        "[1,2",
        "{\"a\":}",
        "{\"a\" 1}",
        "[1,]",
        "{,}",
        "{\"a\":1,}",
        "01",
        "1.",
        ".5",
        "-",
        "1e",
        "+1",
        "tru",
        "nul",
        "\"abc",
        "\"\\x\"",
        "\"\\u12\"",
        "\"\\ud800\"",
        "\"\\udc00\"",
        "\"a\nb\"",
        "[1] 2",
        "{'a':1}",
        "\"\xff\"",
        "\"\xc0\xaf\"",
        "{\"a\":1,\"a\":2}",
        "[1e999]",
        "NaN",
        "\"a\\u0000b\"",
        "{\"a\":1,\"b\":{\"c\":2,\"c\":3}}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        expect_bad(bad[i]);
}

Test(json, every_truncation_of_a_valid_document_fails_cleanly)
{
    const char *doc = "{\"k\": [1, 2.5, \"s\\n\\u0041\", {\"x\": null, \"y\": [true, false]}]}";
    ch_json_t *j = NULL;
    cr_assert_eq(parse(doc, &j), 0);
    ch_json_free(j);
    size_t n = strlen(doc);
    for (size_t len = 0; len < n; len++) {
        char err[160];
        j = NULL;
        int rc = ch_json_parse(doc, len, NULL, &j, err, sizeof err);
        cr_expect(rc < 0, "prefix of %zu bytes accepted", len);
        cr_expect_null(j);
    }
}

Test(json, deep_nesting_is_an_error_not_a_crash)
{
    size_t depth = 100000;
    char *s = malloc(2 * depth + 1);
    memset(s, '[', depth);
    memset(s + depth, ']', depth);
    s[2 * depth] = '\0';
    ch_json_t *j = NULL;
    char err[160];
    cr_expect_eq(ch_json_parse(s, 2 * depth, NULL, &j, err, sizeof err), CH_E_FORMAT);
    cr_expect(strstr(err, "nesting") != NULL, "%s", err);
    /* at the limit it parses */
    ch_json_limits_t lim = ch_json_default_limits();
    memset(s, '[', lim.max_depth);
    memset(s + lim.max_depth, ']', lim.max_depth);
    cr_expect_eq(ch_json_parse(s, 2 * lim.max_depth, NULL, &j, err, sizeof err), 0);
    ch_json_free(j);
    free(s);
}

Test(json, size_and_node_limits)
{
    ch_json_limits_t lim = {16, 8, 4};
    ch_json_t *j = NULL;
    char err[160];
    const char *big = "[1,2,3,4,5,6,7,8,9]";
    cr_expect_eq(ch_json_parse(big, strlen(big), &lim, &j, err, sizeof err), CH_E_TOOBIG);
    lim.max_bytes = 100;
    cr_expect_eq(ch_json_parse(big, strlen(big), &lim, &j, err, sizeof err), CH_E_TOOBIG);
    lim.max_nodes = 10;
    cr_expect_eq(ch_json_parse(big, strlen(big), &lim, &j, err, sizeof err), 0);
    ch_json_free(j);
}

Test(json, garbage_bytes_never_crash)
{
    /* deterministic pseudo-random byte soup drawn from JSON's own alphabet */
    const char alphabet[] = "{}[]\":,0123456789.-+eE \\utrfalsn\x01\xc3\xa9";
    uint64_t x = 0x1234567;
    char buf[64];
    for (int iter = 0; iter < 20000; iter++) {
        size_t len = (size_t)(iter % 63) + 1;
        for (size_t i = 0; i < len; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            buf[i] = alphabet[x % (sizeof alphabet - 1)];
        }
        ch_json_t *j = NULL;
        char err[160];
        int rc = ch_json_parse(buf, len, NULL, &j, err, sizeof err);
        cr_assert(rc == 0 ? j != NULL : j == NULL);
        ch_json_free(j);
    }
}

Test(json, writer_escapes_and_round_trips)
{
    ch_buf_t w;
    ch_buf_init(&w);
    const char *nasty = "q\"b\\s\n\t\x01/\xc3\xa9";
    ch_buf_puts(&w, "{\"k\":");
    ch_jw_str(&w, nasty);
    ch_buf_printf(&w, ",\"n\":%d}", 42);
    char *text = NULL;
    size_t len = 0;
    cr_assert_eq(ch_buf_finish(&w, &text, &len), 0);
    cr_expect_eq(strlen(text), len);
    cr_expect(strstr(text, "\\u0001") != NULL);
    ch_json_t *j = NULL;
    cr_assert_eq(parse(text, &j), 0, "%s", text);
    cr_expect_str_eq(ch_json_get_str(j, "k"), nasty);
    cr_expect_eq(ch_json_get(j, "n")->number, 42.0);
    ch_json_free(j);
    free(text);
}

Test(json, builder_writes_what_the_parser_reads_back)
{
    ch_jb_t *b = NULL;
    cr_assert_eq(ch_jb_create(&b), 0);
    ch_jb_obj_begin(b);
    ch_jb_key(b, "s");
    ch_jb_str(b, "q\"\\\n\x01\xc3\xa9");
    ch_jb_key(b, "i");
    ch_jb_int(b, INT64_MIN);
    ch_jb_key(b, "u");
    ch_jb_uint(b, (uint64_t)INT64_MAX);
    ch_jb_key(b, "d");
    ch_jb_double(b, 0.1);
    ch_jb_key(b, "nan");
    ch_jb_double(b, NAN);
    ch_jb_key(b, "a");
    ch_jb_arr_begin(b);
    ch_jb_bool(b, 1);
    ch_jb_null(b);
    ch_jb_str(b, NULL);
    ch_jb_arr_end(b);
    ch_jb_key(b, "empty");
    ch_jb_obj_begin(b);
    ch_jb_obj_end(b);
    ch_jb_obj_end(b);

    char *pretty = NULL, *line = NULL;
    size_t len = 0;
    cr_assert_eq(ch_jb_finish(b, CH_JB_PRETTY, &pretty, &len), 0);
    cr_expect_eq(strlen(pretty), len);
    cr_expect(strstr(pretty, "\n  \"s\": ") != NULL, "two-space indent:\n%s", pretty);
    cr_expect(strstr(pretty, "\"empty\": {}") != NULL, "%s", pretty);
    cr_assert_eq(ch_jb_finish(b, CH_JB_LINE, &line, NULL), 0);
    cr_expect_null(strchr(line, '\n'), "one line: %s", line);
    ch_jb_destroy(b);

    ch_json_t *j = NULL;
    cr_assert_eq(parse(pretty, &j), 0, "%s", pretty);
    cr_expect_eq(j->kids[0]->key[0], 's', "members keep their order");
    cr_expect_str_eq(ch_json_get_str(j, "s"), "q\"\\\n\x01\xc3\xa9");
    cr_expect_eq(ch_json_get(j, "i")->integer, INT64_MIN);
    cr_expect_eq(ch_json_get(j, "u")->integer, INT64_MAX);
    cr_expect_eq(ch_json_get(j, "d")->number, 0.1, "doubles read back exactly");
    cr_expect_eq(ch_json_get(j, "nan")->type, CH_JSON_NULL);
    cr_expect_eq(ch_json_get(j, "a")->nkids, 3);
    ch_json_free(j);
    free(pretty);
    free(line);
}

Test(json, builder_refuses_a_malformed_document)
{
    ch_jb_t *b = NULL;
    char *out = NULL;
    cr_assert_eq(ch_jb_create(&b), 0);
    ch_jb_obj_begin(b);
    ch_jb_int(b, 1); /* member without a key */
    ch_jb_obj_end(b);
    cr_expect_lt(ch_jb_finish(b, CH_JB_LINE, &out, NULL), 0);
    cr_expect_null(out);
    ch_jb_destroy(b);

    cr_assert_eq(ch_jb_create(&b), 0);
    ch_jb_arr_begin(b); /* never closed */
    cr_expect_lt(ch_jb_finish(b, CH_JB_LINE, &out, NULL), 0);
    ch_jb_destroy(b);

    cr_assert_eq(ch_jb_create(&b), 0);
    ch_jb_str(b, "\xff"); /* not UTF-8 */
    cr_expect_eq(ch_jb_finish(b, CH_JB_LINE, &out, NULL), CH_E_FORMAT);
    ch_jb_destroy(b);

    cr_assert_eq(ch_jb_create(&b), 0);
    ch_jb_uint(b, UINT64_MAX); /* json_int_t cannot: a double */
    cr_assert_eq(ch_jb_finish(b, CH_JB_LINE, &out, NULL), 0);
    cr_expect(strchr(out, 'e') != NULL || strchr(out, '.') != NULL, "%s", out);
    free(out);
    ch_jb_destroy(b);
}
