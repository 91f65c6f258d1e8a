/* common/buf: the renderers' text buffer, HTML escaping of names and Prometheus escaping of
 * label values. */
#include <criterion/criterion.h>
#include <string.h>

#include <stdlib.h>

#include "common/buf.h"

Test(buf, html_escaping_leaves_no_markup)
{
    ch_buf_t b = {0};
    ch_buf_html(&b, "<script>alert('x')</script> & \"q\"");
    cr_assert_eq(b.err, 0);
    cr_expect_str_eq(b.p, "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &quot;q&quot;");
    ch_buf_fini(&b);
    ch_buf_html(&b, "");
    ch_buf_html(&b, "plain");
    cr_expect_str_eq(b.p, "plain");
    ch_buf_fini(&b);
}

Test(buf, buffer_grows_past_any_size)
{
    ch_buf_t b = {0};
    for (int i = 0; i < 10000; i++)
        ch_buf_printf(&b, "%05d,", i);
    cr_assert_eq(b.err, 0);
    cr_expect_eq(b.len, 60000);
    cr_expect_eq(strlen(b.p), b.len);
    cr_expect_eq(strncmp(b.p + 59994, "09999,", 6), 0);
    ch_buf_fini(&b);
}

Test(buf, finish_hands_over_a_terminated_string_even_when_empty)
{
    ch_buf_t b = {0};
    char *out = NULL;
    size_t len = 1;
    cr_assert_eq(ch_buf_finish(&b, &out, &len), 0);
    cr_expect_eq(len, 0);
    cr_expect_str_eq(out, "");
    cr_expect_null(b.p);
    free(out);
    ch_buf_append(&b, "ab\0cd", 5); /* bytes, not a C string */
    ch_buf_puts(&b, "e");
    cr_assert_eq(ch_buf_finish(&b, &out, &len), 0);
    cr_expect_eq(len, 6);
    cr_expect_eq(memcmp(out, "ab\0cde", 7), 0);
    free(out);
}

Test(buf, prometheus_label_values_escape_quote_backslash_and_newline)
{
    ch_buf_t b = {0};
    ch_buf_label(&b, "plain");
    ch_buf_puts(&b, "|");
    ch_buf_label(&b, "a\"b\\c\nd\"");
    ch_buf_puts(&b, "|");
    ch_buf_label(&b, "");
    cr_assert_eq(b.err, 0);
    cr_expect_str_eq(b.p, "plain|a\\\"b\\\\c\\nd\\\"|");
    ch_buf_fini(&b);
}
