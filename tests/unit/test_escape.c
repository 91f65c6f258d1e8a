/* Peer text made safe for a terminal and a log: what a hostile failure message would do
 * to a screen (clear it, move the cursor, print a fake row) shows as visible text. */
#include <criterion/criterion.h>
#include <string.h>

#include "common/escape.h"

static const char *esc(const char *in)
{
    static char out[256];
    return ch_escape(out, sizeof out, in);
}

Test(escape, terminal_controls_become_visible_text)
{
    cr_assert_str_eq(esc("\x1b[2J\x1b[1;1Hj9 completed"), "\\x1b[2J\\x1b[1;1Hj9 completed");
    cr_assert_str_eq(esc("a\tb\rc\nd\x7f"), "a\\x09b\\x0dc\\x0ad\\x7f");
    /* The 8-bit CSI, raw and as the UTF-8 C1 control U+009B. */
    cr_assert_str_eq(esc("x\x9b"
                         "2J"),
                     "x\\x9b2J");
    cr_assert_str_eq(esc("x\xc2\x9b"
                         "2J"),
                     "x\\xc2\\x9b2J");
}

Test(escape, a_backslash_cannot_fake_an_escape)
{
    cr_assert_str_eq(esc("\\x1b"), "\\\\x1b");
}

Test(escape, printable_text_and_utf8_pass_unchanged)
{
    const char *s = "loss 2.31 — step 5/10: naïve 日本 🙂";
    cr_assert_str_eq(esc(s), s);
    cr_assert_str_eq(esc(NULL), "");
    /* Overlong and truncated sequences are not UTF-8. */
    cr_assert_str_eq(esc("\xc0\xaf"), "\\xc0\\xaf");
    cr_assert_str_eq(esc("ab\xe6\x97"), "ab\\xe6\\x97");
}

Test(escape, a_full_buffer_stops_on_a_character_boundary)
{
    char out[8];
    size_t n = ch_escape_n(out, sizeof out, "ab\x1b\x1b", 4);
    cr_assert_eq(n, 6);
    cr_assert_str_eq(out, "ab\\x1b");
    n = ch_escape_n(out, 4, "日本", strlen("日本"));
    cr_assert_eq(n, 3);
    cr_assert_str_eq(out, "日");
}
