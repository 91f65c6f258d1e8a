/* coordinatord/http: the renderers' text buffer (common/textbuf), HTML escaping of names and
 * Prometheus escaping of label values. */
#include <criterion/criterion.h>
#include <string.h>

#include "http.h"

Test(http, html_escaping_leaves_no_markup)
{
    coord_buf_t b = {0};
    coord_buf_html(&b, "<script>alert('x')</script> & \"q\"");
    cr_assert_eq(b.err, 0);
    cr_expect_str_eq(b.p, "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &quot;q&quot;");
    coord_buf_fini(&b);
    coord_buf_html(&b, "");
    coord_buf_html(&b, "plain");
    cr_expect_str_eq(b.p, "plain");
    coord_buf_fini(&b);
}

Test(http, buffer_grows_past_any_size)
{
    coord_buf_t b = {0};
    for (int i = 0; i < 10000; i++)
        coord_buf_printf(&b, "%05d,", i);
    cr_assert_eq(b.err, 0);
    cr_expect_eq(b.len, 60000);
    cr_expect_eq(strlen(b.p), b.len);
    cr_expect_eq(strncmp(b.p + 59994, "09999,", 6), 0);
    coord_buf_fini(&b);
}

Test(http, prometheus_label_values_escape_quote_backslash_and_newline)
{
    coord_buf_t b = {0};
    ch_buf_label(&b, "plain");
    ch_buf_puts(&b, "|");
    ch_buf_label(&b, "a\"b\\c\nd\"");
    ch_buf_puts(&b, "|");
    ch_buf_label(&b, "");
    cr_assert_eq(b.err, 0);
    cr_expect_str_eq(b.p, "plain|a\\\"b\\\\c\\nd\\\"|");
    coord_buf_fini(&b);
}
