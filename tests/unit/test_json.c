/* common/json: strict parsing, limits, hostile input, string escaping. */
#include <criterion/criterion.h>
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
              " \"big\": 18446744073709551615, \"o\": {}} ",
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
    cr_expect_eq(big, UINT64_MAX);
    cr_expect_eq(ch_json_u64(a->kids[1], &big), CH_E_FORMAT); /* not a non-negative integer */
    cr_expect_null(ch_json_get(j, "missing"));
    cr_expect_eq(ch_json_get(j, "o")->nkids, 0);
    ch_json_free(j);
}

Test(json, u64_overflow_is_refused)
{
    ch_json_t *j = NULL;
    uint64_t v;
    cr_assert_eq(parse("18446744073709551616", &j), 0);
    cr_expect_eq(ch_json_u64(j, &v), CH_E_FORMAT);
    ch_json_free(j);
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
    ch_jw_t w;
    ch_jw_init(&w);
    const char *nasty = "q\"b\\s\n\t\x01/\xc3\xa9";
    ch_jw_raw(&w, "{\"k\":");
    ch_jw_str(&w, nasty);
    ch_jw_printf(&w, ",\"n\":%d}", 42);
    char *text = NULL;
    size_t len = 0;
    cr_assert_eq(ch_jw_finish(&w, &text, &len), 0);
    cr_expect_eq(strlen(text), len);
    cr_expect(strstr(text, "\\u0001") != NULL);
    ch_json_t *j = NULL;
    cr_assert_eq(parse(text, &j), 0, "%s", text);
    cr_expect_str_eq(ch_json_get_str(j, "k"), nasty);
    cr_expect_eq(ch_json_get(j, "n")->number, 42.0);
    ch_json_free(j);
    free(text);
}
