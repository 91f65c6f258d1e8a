/* INI reader: what it accepts, what it refuses, and that errors name the line. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "common/err.h"
#include "common/ini.h"

typedef struct seen {
    int n;
    char section[8][32], key[8][32], value[8][64];
    int line[8];
} seen_t;

static int collect(void *ud, const char *section, const char *key, const char *value, int line,
                   char *err, size_t errlen)
{
    seen_t *s = ud;
    cr_assert_lt(s->n, 8);
    snprintf(s->section[s->n], sizeof(s->section[0]), "%s", section);
    snprintf(s->key[s->n], sizeof(s->key[0]), "%s", key);
    snprintf(s->value[s->n], sizeof(s->value[0]), "%s", value);
    s->line[s->n] = line;
    s->n++;
    return 0;
}

Test(ini, sections_keys_comments_whitespace)
{
    const char *text = "# a comment\n"
                       "top = 1\n"
                       "\n"
                       "  [ model ]  \n"
                       "; another comment\n"
                       "\tlayers   =   12  \r\n"
                       "name=a b # not a comment\n"
                       "[train]\n"
                       "data =\n"
                       "lr = 3e-4";
    seen_t s = {0};
    char err[256];
    cr_assert_eq(ch_ini_parse(text, collect, &s, err, sizeof(err)), 0, "%s", err);
    cr_assert_eq(s.n, 5);
    cr_expect_str_eq(s.section[0], "");
    cr_expect_str_eq(s.key[0], "top");
    cr_expect_str_eq(s.value[0], "1");
    cr_expect_eq(s.line[0], 2);
    cr_expect_str_eq(s.section[1], "model");
    cr_expect_str_eq(s.key[1], "layers");
    cr_expect_str_eq(s.value[1], "12");
    cr_expect_eq(s.line[1], 6);
    cr_expect_str_eq(s.value[2], "a b # not a comment");
    cr_expect_str_eq(s.section[3], "train");
    cr_expect_str_eq(s.key[3], "data");
    cr_expect_str_eq(s.value[3], "");
    cr_expect_str_eq(s.value[4], "3e-4");
    cr_expect_eq(s.line[4], 10);
}

Test(ini, empty_text_is_fine)
{
    seen_t s = {0};
    char err[64];
    cr_assert_eq(ch_ini_parse("", collect, &s, err, sizeof(err)), 0);
    cr_assert_eq(ch_ini_parse("\n\n# only comments\n", collect, &s, err, sizeof(err)), 0);
    cr_assert_eq(s.n, 0);
}

static void expect_error(const char *text, const char *needle)
{
    seen_t s = {0};
    char err[256] = "";
    int rc = ch_ini_parse(text, collect, &s, err, sizeof(err));
    cr_expect_eq(rc, CH_E_CONFIG, "'%s' parsed", text);
    cr_expect(strstr(err, needle) != NULL, "error '%s' lacks '%s'", err, needle);
}

Test(ini, malformed_lines_name_their_line)
{
    expect_error("[a]\nx = 1\njust words\n", "line 3");
    expect_error("[a\n", "line 1");
    expect_error("a = 1\n[]\n", "line 2");
    expect_error("[a] trailing\n", "line 1");
    expect_error("\n\n = value\n", "line 3");
    expect_error("two words = 1\n", "line 1");
    expect_error("[with space]\n", "line 1");
}

static int refuse_b(void *ud, const char *section, const char *key, const char *value, int line,
                    char *err, size_t errlen)
{
    int *calls = ud;
    (*calls)++;
    if (strcmp(key, "b") == 0) {
        snprintf(err, errlen, "line %d: no b allowed", line);
        return CH_E_CONFIG;
    }
    return 0;
}

static int refuse_silently(void *ud, const char *section, const char *key, const char *value,
                           int line, char *err, size_t errlen)
{
    return -EINVAL;
}

Test(ini, callback_error_stops_the_parse)
{
    int calls = 0;
    char err[256];
    int rc = ch_ini_parse("a = 1\nb = 2\nc = 3\n", refuse_b, &calls, err, sizeof(err));
    cr_assert_eq(rc, CH_E_CONFIG);
    cr_expect_eq(calls, 2);
    cr_expect_str_eq(err, "line 2: no b allowed");

    rc = ch_ini_parse("[s]\nk = v\n", refuse_silently, NULL, err, sizeof(err));
    cr_assert_eq(rc, -EINVAL);
    cr_expect(strstr(err, "line 2") != NULL && strstr(err, "k") != NULL, "%s", err);
}
