/* workerd/engine/slice: a rank's TP slice and range of a tensor, read out of and written
 * back into the full tensor, for every split kind; the metadata text form. The reference
 * is model.c's fill_slice walk, written out here as plain loops. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "workerd/engine/slice.h"

/* The slice as model.c's add_tensor makes it for TP rank r of p: split 0 none, 1 column,
 * 2 row / vocab (rows0: the rows the split cuts, wte's padded vocab). */
static eng_slice_t tp_slice(uint32_t ndim, uint32_t d0, uint32_t d1, uint32_t rows0, int split,
                            uint32_t parts, uint32_t p, uint32_t r)
{
    eng_slice_t s;
    memset(&s, 0, sizeof s);
    s.ndim = ndim;
    s.shape[0] = d0;
    s.shape[1] = ndim == 2 ? d1 : 0;
    s.hi[0] = rows0;
    s.hi[1] = ndim == 2 ? d1 : 0;
    s.parts = 1;
    int last = ndim == 2 ? 1 : 0;
    if (split == 1) {
        uint32_t w = s.shape[last] / parts / p;
        s.parts = parts;
        s.lo[last] = r * w;
        s.hi[last] = (r + 1) * w;
    } else if (split == 2) {
        uint32_t w = rows0 / p;
        s.lo[0] = r * w;
        s.hi[0] = (r + 1) * w;
    }
    return s;
}

/* fill_slice's walk: the full index of each slice element, -1 for padding. */
static size_t reference(const eng_slice_t *s, long *idx)
{
    uint32_t cols = s->ndim == 2 ? s->shape[1] : 1;
    uint32_t rlo = s->ndim == 2 ? s->lo[0] : 0, rhi = s->ndim == 2 ? s->hi[0] : 1;
    uint32_t clo = s->lo[s->ndim - 1], chi = s->hi[s->ndim - 1];
    uint32_t part_w = (s->ndim == 2 ? s->shape[1] : s->shape[0]) / s->parts;
    size_t n = 0;
    for (uint32_t r = rlo; r < rhi; r++)
        for (uint32_t q = 0; q < s->parts; q++)
            for (uint32_t c = clo; c < chi; c++)
                idx[n++] =
                    s->ndim == 2 && r >= s->shape[0] ? -1 : (long)r * cols + (long)q * part_w + c;
    return n;
}

/* Every rank of p: the slice reads what the reference says, for the whole slice and for
 * every range; the ranks' pieces, each cut in three ranges, write the full tensor back
 * exactly, covering each element (and no padding). */
static void round_trip(uint32_t ndim, uint32_t d0, uint32_t d1, uint32_t rows0, int split,
                       uint32_t parts, uint32_t p)
{
    eng_slice_t whole0 = eng_slice_whole(ndim, d0, d1);
    size_t full_n = eng_slice_full_numel(&whole0);
    float *full = malloc(full_n * sizeof *full), *back = calloc(full_n, sizeof *back);
    uint8_t *cov = calloc((full_n + 7) / 8, 1);
    for (size_t i = 0; i < full_n; i++)
        full[i] = (float)i + 0.5f;
    for (uint32_t r = 0; r < p; r++) {
        eng_slice_t s = tp_slice(ndim, d0, d1, rows0, split, parts, p, r);
        cr_assert_eq(eng_slice_check(&s), 0);
        size_t n = eng_slice_numel(&s);
        long *idx = malloc(n * sizeof *idx);
        float *got = malloc(n * sizeof *got);
        cr_assert_eq(reference(&s, idx), n);
        eng_slice_read(&s, 0, n, full, got);
        for (size_t k = 0; k < n; k++)
            cr_assert_eq(got[k], idx[k] < 0 ? 0.0f : full[idx[k]], "rank %u element %zu", r, k);
        for (size_t a = 0; a <= n; a += 3)
            for (size_t b = a; b <= n; b += 5) {
                float *part = malloc((b - a + 1) * sizeof *part);
                eng_slice_read(&s, a, b, full, part);
                cr_assert_eq(memcmp(part, got + a, (b - a) * sizeof *part), 0, "[%zu, %zu)", a, b);
                free(part);
            }
        size_t cut[4] = {0, n / 3, 2 * n / 3 + 1, n};
        for (int k = 0; k < 3; k++)
            eng_slice_write(&s, cut[k], cut[k + 1], got + cut[k], back, cov);
        free(idx);
        free(got);
    }
    cr_expect_eq(memcmp(back, full, full_n * sizeof *full), 0);
    size_t bits = 0;
    for (size_t i = 0; i < (full_n + 7) / 8; i++)
        bits += (size_t)__builtin_popcount(cov[i]);
    cr_expect_eq(bits, full_n);
    free(full);
    free(back);
    free(cov);
}

Test(slice, none_round_trips)
{
    round_trip(2, 6, 4, 6, 0, 1, 1);
    round_trip(1, 8, 0, 8, 0, 1, 1);
}

Test(slice, column_with_three_parts_round_trips)
{
    round_trip(2, 4, 12, 4, 1, 3, 2);  /* c_attn.weight [C, 3C], C = 4, tp 2 */
    round_trip(1, 12, 0, 12, 1, 3, 2); /* c_attn.bias [3C] */
    round_trip(2, 4, 16, 4, 1, 1, 4);  /* c_fc.weight, tp 4 */
    round_trip(1, 16, 0, 16, 1, 1, 2); /* c_fc.bias */
}

Test(slice, row_round_trips)
{
    round_trip(2, 16, 4, 16, 2, 1, 2); /* mlp.c_proj.weight [4C, C] */
}

Test(slice, vocab_with_padding_rows_round_trips)
{
    round_trip(2, 13, 4, 16, 2, 1, 2); /* wte [13, C] padded to 16 rows */
    round_trip(2, 13, 4, 16, 2, 1, 4); /* the last rank holds padding only but row 12 */
    eng_slice_t s = tp_slice(2, 13, 4, 16, 2, 1, 2, 1);
    cr_expect_eq(eng_slice_numel(&s), 8 * 4);
    cr_expect_eq(eng_slice_full_numel(&s), 13 * 4);
    /* padding rows are never written */
    float src[32], full[52];
    for (int i = 0; i < 32; i++)
        src[i] = 7.0f;
    memset(full, 0, sizeof full);
    eng_slice_write(&s, 0, 32, src, full, NULL);
    for (int i = 0; i < 52; i++)
        cr_expect_eq(full[i], i >= 32 ? 7.0f : 0.0f, "%d", i);
}

Test(slice, whole_and_checks)
{
    eng_slice_t s = eng_slice_whole(2, 3, 5);
    cr_expect_eq(eng_slice_numel(&s), 15);
    cr_expect_eq(eng_slice_check(&s), 0);
    s = eng_slice_whole(1, 7, 0);
    cr_expect_eq(eng_slice_numel(&s), 7);
    cr_expect_eq(eng_slice_check(&s), 0);

    s = tp_slice(2, 4, 12, 4, 1, 3, 2, 1);
    s.hi[1] = 5; /* past the part's 4 columns */
    cr_expect_eq(eng_slice_check(&s), -EINVAL);
    s = tp_slice(2, 4, 12, 4, 1, 3, 2, 1);
    s.parts = 5; /* does not divide 12 */
    cr_expect_eq(eng_slice_check(&s), -EINVAL);
    s = eng_slice_whole(3, 2, 2);
    cr_expect_eq(eng_slice_check(&s), -EINVAL);
    s = eng_slice_whole(1, 8, 0);
    s.lo[0] = 5;
    s.hi[0] = 4;
    cr_expect_eq(eng_slice_check(&s), -EINVAL);
}

Test(slice, text_round_trips)
{
    char text[256];
    eng_slice_t s = tp_slice(2, 4, 12, 4, 1, 3, 2, 1), t;
    size_t a = 0, b = 0;
    cr_assert_eq(eng_slice_format(&s, 3, 20, text, sizeof text), 0);
    cr_expect_str_eq(text, "shape=[4,12] lo=[0,2] hi=[4,4] parts=3 range=[3,20)");
    cr_assert_eq(eng_slice_parse(text, &t, &a, &b), 0);
    cr_expect_eq(memcmp(&s, &t, sizeof s), 0);
    cr_expect_eq(a, 3);
    cr_expect_eq(b, 20);

    s = tp_slice(1, 12, 0, 12, 1, 3, 2, 0);
    cr_assert_eq(eng_slice_format(&s, 0, 6, text, sizeof text), 0);
    cr_expect_str_eq(text, "shape=[12] lo=[0] hi=[2] parts=3 range=[0,6)");
    cr_assert_eq(eng_slice_parse(text, &t, &a, &b), 0);
    cr_expect_eq(memcmp(&s, &t, sizeof s), 0);

    s = tp_slice(2, 13, 4, 16, 2, 1, 2, 1); /* rows into the padding */
    cr_assert_eq(eng_slice_format(&s, 0, 32, text, sizeof text), 0);
    cr_assert_eq(eng_slice_parse(text, &t, &a, &b), 0);
    cr_expect_eq(memcmp(&s, &t, sizeof s), 0);

    cr_expect_eq(eng_slice_format(&s, 0, 33, text, sizeof text), -EINVAL); /* past numel */
    cr_expect_eq(eng_slice_format(&s, 0, 32, text, 10), -ENOSPC);
}

Test(slice, bad_text_is_refused)
{
    static const char *const bad[] = {
        "",
        "garbage",
        "shape=[4,12] lo=[0,2] hi=[4,4] parts=3 range=[3,20) ",        /* trailing space */
        "shape=[4,12] lo=[0,2] hi=[4,4] parts=3 range=[3,20]",         /* wrong bracket */
        "shape=[04,12] lo=[0,2] hi=[4,4] parts=3 range=[3,20)",        /* not canonical */
        "shape=[4,12] lo=[0,2] hi=[4,5] parts=3 range=[0,4)",          /* past the part */
        "shape=[4,12] lo=[0,2] hi=[4,4] parts=5 range=[0,4)",          /* parts do not divide */
        "shape=[4,12] lo=[0,2] hi=[4,4] parts=3 range=[0,25)",         /* past numel */
        "shape=[4,12] lo=[0,2] hi=[4,4] parts=3 range=[9,4)",          /* a > b */
        "shape=[4,12] lo=[0] hi=[4,4] parts=3 range=[0,4)",            /* dims disagree */
        "shape=[12] lo=[0,0] hi=[2,0] parts=3 range=[0,4)",            /* 1-D with two */
        "shape=[4,12,3] lo=[0,2] hi=[4,4] parts=3 range=[0,4)",        /* 3-D */
        "shape=[-4,12] lo=[0,2] hi=[4,4] parts=3 range=[0,4)",         /* sign */
        "shape=[4294967296,12] lo=[0,2] hi=[4,4] parts=3 range=[0,4)", /* over 32 bits */
        "shape=[4,12] lo=[0,2] hi=[4,4] parts=0 range=[0,0)",          /* no parts */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        eng_slice_t s;
        size_t a, b;
        cr_expect_eq(eng_slice_parse(bad[i], &s, &a, &b), -EINVAL, "%s", bad[i]);
    }
}
