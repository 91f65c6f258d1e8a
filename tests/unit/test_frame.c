/* Frame reader: partial feeds, batched frames, size limit checked before allocation. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/frame.h"

/* header | payload | tag, tag bytes = 0xA0 + i */
static size_t make_frame(uint8_t *out, const char *payload, size_t n)
{
    ch_frame_put_header(out, (uint32_t)n);
    memcpy(out + CH_FRAME_HDR, payload, n);
    for (int i = 0; i < CH_FRAME_TAG; i++)
        out[CH_FRAME_HDR + n + i] = (uint8_t)(0xA0 + i);
    return CH_FRAME_HDR + n + CH_FRAME_TAG;
}

static void expect_frame(ch_frame_reader_t *r, const char *want)
{
    const uint8_t *p = NULL, *tag = NULL;
    size_t n = 0;
    cr_assert_eq(ch_frame_reader_next(r, &p, &n, &tag), 1);
    cr_assert_eq(n, strlen(want));
    cr_assert(memcmp(p, want, n) == 0);
    for (int i = 0; i < CH_FRAME_TAG; i++)
        cr_assert_eq(tag[i], 0xA0 + i);
}

Test(frame, header_is_big_endian)
{
    uint8_t h[4];
    ch_frame_put_header(h, 0x01020304u);
    cr_assert(h[0] == 1 && h[1] == 2 && h[2] == 3 && h[3] == 4);
}

Test(frame, byte_by_byte_feed)
{
    uint8_t buf[128];
    size_t n = make_frame(buf, "hello world", 11);
    ch_frame_reader_t r;
    ch_frame_reader_init(&r, 1024);
    const uint8_t *p, *tag;
    size_t len;
    for (size_t i = 0; i < n; i++) {
        cr_assert_eq(ch_frame_reader_next(&r, &p, &len, &tag), 0, "frame early at byte %zu", i);
        cr_assert_eq(ch_frame_reader_feed(&r, buf + i, 1), 0);
    }
    expect_frame(&r, "hello world");
    cr_assert_eq(ch_frame_reader_next(&r, &p, &len, &tag), 0);
    ch_frame_reader_fini(&r);
}

/* "one", "two two" and "three" back to back: the bytes of the first two, *third those of
 * the third. */
static size_t three_frames(uint8_t *buf, size_t *third)
{
    size_t n = 0;
    n += make_frame(buf + n, "one", 3);
    n += make_frame(buf + n, "two two", 7);
    *third = make_frame(buf + n, "three", 5);
    return n;
}

Test(frame, several_frames_in_one_feed_and_split_tail)
{
    uint8_t buf[256];
    size_t third, n = three_frames(buf, &third);
    ch_frame_reader_t r;
    ch_frame_reader_init(&r, 1024);
    /* Two whole frames plus the first 6 bytes of the third. */
    cr_assert_eq(ch_frame_reader_feed(&r, buf, n + 6), 0);
    expect_frame(&r, "one");
    expect_frame(&r, "two two");
    const uint8_t *p, *tag;
    size_t len;
    cr_assert_eq(ch_frame_reader_next(&r, &p, &len, &tag), 0);
    cr_assert_eq(ch_frame_reader_feed(&r, buf + n + 6, third - 6), 0);
    expect_frame(&r, "three");
    cr_assert_eq(ch_frame_reader_next(&r, &p, &len, &tag), 0);
    ch_frame_reader_fini(&r);
}

Test(frame, zero_length_payload)
{
    uint8_t buf[64];
    size_t n = make_frame(buf, "", 0);
    cr_assert_eq(n, CH_FRAME_HDR + CH_FRAME_TAG);
    ch_frame_reader_t r;
    ch_frame_reader_init(&r, 1024);
    cr_assert_eq(ch_frame_reader_feed(&r, buf, n), 0);
    expect_frame(&r, "");
    ch_frame_reader_fini(&r);
}

Test(frame, oversized_header_rejected_before_allocation)
{
    ch_frame_reader_t r;
    ch_frame_reader_init(&r, 1024);
    uint8_t hdr[CH_FRAME_HDR];
    ch_frame_put_header(hdr, 0xFFFFFFF0u);
    /* Split header: the first bytes cannot be judged yet and are accepted. */
    cr_assert_eq(ch_frame_reader_feed(&r, hdr, 2), 0);
    cr_assert_eq(ch_frame_reader_feed(&r, hdr + 2, 2), CH_E_TOOBIG);
    /* The buffer never grew for the announced 4 GiB: it holds at most the 2 bytes
     * received so far in its initial small allocation. */
    cr_assert_leq(r.cap, 4096);
    cr_assert_leq(r.len - r.off, 2);
    ch_frame_reader_fini(&r);
}

Test(frame, oversized_frame_behind_a_good_one)
{
    uint8_t buf[128];
    size_t n = make_frame(buf, "ok", 2);
    ch_frame_put_header(buf + n, 1025);
    n += CH_FRAME_HDR;
    ch_frame_reader_t r;
    ch_frame_reader_init(&r, 1024);
    cr_assert_eq(ch_frame_reader_feed(&r, buf, n), CH_E_TOOBIG);
    ch_frame_reader_fini(&r);

    /* Exactly max is fine. */
    ch_frame_reader_init(&r, 1024);
    uint8_t *big = calloc(1, CH_FRAME_HDR + 1024 + CH_FRAME_TAG);
    cr_assert_not_null(big);
    ch_frame_put_header(big, 1024);
    cr_assert_eq(ch_frame_reader_feed(&r, big, CH_FRAME_HDR + 1024 + CH_FRAME_TAG), 0);
    const uint8_t *p, *tag;
    size_t len;
    cr_assert_eq(ch_frame_reader_next(&r, &p, &len, &tag), 1);
    cr_assert_eq(len, 1024);
    free(big);
    ch_frame_reader_fini(&r);
}

Test(frame, large_frame_in_pieces_then_buffer_reuse)
{
    size_t plen = 300000;
    size_t flen = CH_FRAME_HDR + plen + CH_FRAME_TAG;
    uint8_t *buf = malloc(flen * 2);
    cr_assert_not_null(buf);
    for (int k = 0; k < 2; k++) {
        uint8_t *f = buf + (size_t)k * flen;
        ch_frame_put_header(f, (uint32_t)plen);
        for (size_t i = 0; i < plen; i++)
            f[CH_FRAME_HDR + i] = (uint8_t)(i * 7 + (size_t)k);
        memset(f + CH_FRAME_HDR + plen, k, CH_FRAME_TAG);
    }
    ch_frame_reader_t r;
    ch_frame_reader_init(&r, 0); /* default max */
    cr_assert_eq(r.max, CH_FRAME_MAX_DEFAULT);
    size_t got = 0;
    const uint8_t *p, *tag;
    size_t len;
    for (size_t off = 0; off < flen * 2; off += 65536) {
        size_t chunk = flen * 2 - off < 65536 ? flen * 2 - off : 65536;
        cr_assert_eq(ch_frame_reader_feed(&r, buf + off, chunk), 0);
        while (ch_frame_reader_next(&r, &p, &len, &tag) == 1) {
            cr_assert_eq(len, plen);
            cr_assert(memcmp(p, buf + got * flen + CH_FRAME_HDR, plen) == 0);
            cr_assert_eq(tag[0], got);
            got++;
        }
    }
    cr_assert_eq(got, 2);
    free(buf);
    ch_frame_reader_fini(&r);
}

/* Whole frames are taken where they lie while the reader is empty; the partial tail goes to
 * the reader, and nothing is split out of a read while the reader holds bytes (order). */
Test(frame, split_in_place_then_tail_to_the_reader)
{
    uint8_t buf[256], big[8];
    size_t third, n = three_frames(buf, &third);
    ch_frame_reader_t r;
    ch_frame_reader_init(&r, 1024);
    const uint8_t *p, *tag;
    size_t len, off = 0;
    cr_assert_eq(ch_frame_split(&r, buf, n + 6, &off, &p, &len, &tag), 1);
    cr_assert(len == 3 && memcmp(p, "one", 3) == 0 && p == buf + CH_FRAME_HDR);
    cr_assert_eq(tag[0], 0xA0);
    cr_assert_eq(ch_frame_split(&r, buf, n + 6, &off, &p, &len, &tag), 1);
    cr_assert(len == 7 && memcmp(p, "two two", 7) == 0);
    cr_assert_eq(off, n);
    cr_assert_eq(ch_frame_split(&r, buf, n + 6, &off, &p, &len, &tag), 0); /* 6 of "three" */
    cr_assert_eq(ch_frame_reader_feed(&r, buf + off, 6), 0);
    /* the reader holds bytes: a later read's frames go through it, in order */
    size_t off2 = 0;
    cr_assert_eq(ch_frame_split(&r, buf + n + 6, third - 6, &off2, &p, &len, &tag), 0);
    cr_assert_eq(off2, 0);
    cr_assert_eq(ch_frame_reader_feed(&r, buf + n + 6, third - 6), 0);
    expect_frame(&r, "three");
    /* an oversized header is refused before its bytes are wanted */
    ch_frame_put_header(big, 2048);
    off = 0;
    cr_assert_eq(ch_frame_split(&r, big, sizeof big, &off, &p, &len, &tag), CH_E_TOOBIG);
    ch_frame_reader_fini(&r);
}
