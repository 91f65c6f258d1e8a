/* Incremental frame reader (frame.h).
 *
 * Bytes arrive in arbitrary pieces. The reader keeps them in one buffer,
 * buf[off .. len), and hands out whole frames in place. Every header is checked
 * against max before the buffer grows past it, so a peer announcing a huge frame
 * costs no more memory than the bytes it actually sent. */
#include "common/frame.h"

#include <stdlib.h>
#include <string.h>

#include "common/err.h"

/* A buffer this large is released once it drains, so an idle link does not keep a
 * 16 MiB buffer alive after one big message. */
#define READER_KEEP_MAX (256u << 10)

static uint32_t get_be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

void ch_frame_put_header(uint8_t hdr[CH_FRAME_HDR], uint32_t len)
{
    hdr[0] = (uint8_t)(len >> 24);
    hdr[1] = (uint8_t)(len >> 16);
    hdr[2] = (uint8_t)(len >> 8);
    hdr[3] = (uint8_t)len;
}

void ch_frame_reader_init(ch_frame_reader_t *r, uint32_t max)
{
    memset(r, 0, sizeof *r);
    r->max = max ? max : CH_FRAME_MAX_DEFAULT;
}

void ch_frame_reader_fini(ch_frame_reader_t *r)
{
    free(r->buf);
    memset(r, 0, sizeof *r);
}

/* Byte i of the virtual stream buf[off .. len) ++ data[0 .. n). */
static uint8_t vbyte(const ch_frame_reader_t *r, const uint8_t *data, size_t i)
{
    size_t have = r->len - r->off;
    return i < have ? r->buf[r->off + i] : data[i - have];
}

/* Walk every complete header in the buffered bytes plus the new ones. */
static int check_headers(const ch_frame_reader_t *r, const uint8_t *data, size_t n)
{
    size_t total = r->len - r->off + n;
    size_t pos = 0;
    while (total - pos >= CH_FRAME_HDR) {
        uint8_t h[CH_FRAME_HDR];
        for (size_t i = 0; i < CH_FRAME_HDR; i++)
            h[i] = vbyte(r, data, pos + i);
        uint32_t plen = get_be32(h);
        if (plen > r->max)
            return CH_E_TOOBIG;
        size_t flen = CH_FRAME_HDR + (size_t)plen + CH_FRAME_TAG;
        if (total - pos < flen)
            break;
        pos += flen;
    }
    return 0;
}

int ch_frame_reader_feed(ch_frame_reader_t *r, const void *data, size_t n)
{
    if (n == 0)
        return 0;
    if (!data)
        return -EINVAL;
    int rc = check_headers(r, data, n);
    if (rc < 0)
        return rc;

    size_t have = r->len - r->off;
    if (have == 0 && r->cap > READER_KEEP_MAX) {
        free(r->buf);
        r->buf = NULL;
        r->cap = 0;
    }
    if (r->off > 0) {
        if (have)
            memmove(r->buf, r->buf + r->off, have);
        r->off = 0;
        r->len = have;
    }
    if (have + n > r->cap) {
        size_t ncap = r->cap ? r->cap : 4096;
        while (ncap < have + n)
            ncap *= 2;
        uint8_t *nb = realloc(r->buf, ncap);
        if (!nb)
            return -ENOMEM;
        r->buf = nb;
        r->cap = ncap;
    }
    memcpy(r->buf + r->len, data, n);
    r->len += n;
    return 0;
}

/* The frame at p[0 .. have): 1 and its parts and length *flen, 0 when not all of it is
 * there, CH_E_TOOBIG for a header over max. */
static int whole_frame(const uint8_t *p, size_t have, uint32_t max, const uint8_t **payload,
                       size_t *len, const uint8_t **tag, size_t *flen)
{
    if (have < CH_FRAME_HDR)
        return 0;
    uint32_t plen = get_be32(p);
    if (plen > max)
        return CH_E_TOOBIG;
    *flen = CH_FRAME_HDR + (size_t)plen + CH_FRAME_TAG;
    if (have < *flen)
        return 0;
    *payload = p + CH_FRAME_HDR;
    *len = plen;
    *tag = p + CH_FRAME_HDR + plen;
    return 1;
}

int ch_frame_reader_next(ch_frame_reader_t *r, const uint8_t **payload, size_t *len,
                         const uint8_t **tag)
{
    size_t flen = 0;
    if (r->len - r->off < CH_FRAME_HDR) /* buf may be NULL then */
        return 0;
    int rc = whole_frame(r->buf + r->off, r->len - r->off, r->max, payload, len, tag, &flen);
    if (rc <= 0)
        return rc;
    r->off += flen;
    if (r->off == r->len)
        r->off = r->len = 0; /* bytes stay in place: the frame remains readable */
    return 1;
}

int ch_frame_split(const ch_frame_reader_t *r, const uint8_t *data, size_t n, size_t *off,
                   const uint8_t **payload, size_t *len, const uint8_t **tag)
{
    size_t flen = 0;
    if (r->len != r->off)
        return 0;
    int rc = whole_frame(data + *off, n - *off, r->max, payload, len, tag, &flen);
    if (rc > 0)
        *off += flen;
    return rc;
}
