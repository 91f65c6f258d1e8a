/* Framing (DESIGN §3): u32 big-endian payload length | payload | 16-byte tag.
 * The payload is one packed chorus.Envelope. The length is checked against the
 * reader's maximum before any allocation; a bad frame is an error return, and the
 * connection owner closes the link with one log line. */
#ifndef CH_FRAME_H
#define CH_FRAME_H

#include <stddef.h>
#include <stdint.h>

#define CH_FRAME_MAX_DEFAULT (16u << 20)
#define CH_FRAME_HDR         4
#define CH_FRAME_TAG         16

/* Incremental reader: feed it whatever bytes arrived, then take whole frames. */
typedef struct ch_frame_reader {
    uint8_t *buf;
    size_t len, cap, off; /* buffered bytes are buf[off .. len) */
    uint32_t max;         /* largest accepted payload */
} ch_frame_reader_t;

void ch_frame_reader_init(ch_frame_reader_t *r, uint32_t max);
void ch_frame_reader_fini(ch_frame_reader_t *r);
/* Append bytes. Returns CH_E_TOOBIG as soon as a buffered header announces a payload
 * over max (before growing the buffer for it). */
int ch_frame_reader_feed(ch_frame_reader_t *r, const void *data, size_t n);
/* 1 and the frame's payload/tag (borrowed until the next feed/next call), 0 when no
 * whole frame is buffered, CH_E_TOOBIG for an oversized header. */
int ch_frame_reader_next(ch_frame_reader_t *r, const uint8_t **payload, size_t *len,
                         const uint8_t **tag);

/* Whole frames straight from freshly read bytes, without copying them into the reader:
 * while r holds nothing, 1 and the frame at data[*off ..) (payload/tag borrowed from data),
 * *off moved past it; 0 when the rest is not one whole frame or r holds bytes (feed
 * data + *off then); CH_E_TOOBIG for a header over r's max. */
int ch_frame_split(const ch_frame_reader_t *r, const uint8_t *data, size_t n, size_t *off,
                   const uint8_t **payload, size_t *len, const uint8_t **tag);

/* Write the 4-byte header for a payload of len bytes. */
void ch_frame_put_header(uint8_t hdr[CH_FRAME_HDR], uint32_t len);

#endif
