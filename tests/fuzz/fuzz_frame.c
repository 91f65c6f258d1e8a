/* Fuzz target: control-plane frames (common/frame.h) and envelopes (common/msg.h).
 *
 * The input is the byte stream a peer sends. It is fed to a frame reader in pieces
 * whose sizes derive from the input, and checked against a one-pass reference walk of
 * the same stream: the reader must yield exactly the frames wholly inside what has been
 * fed, with the same bytes, and refuse the stream (CH_E_TOOBIG) exactly when a complete
 * header announces more than the maximum. Each frame's payload is then decoded
 *  - untagged (handshake): on success, encode -> decode -> encode is stable;
 *  - by a plain session: accepted only with a zero tag and an increasing seq;
 *  - by a keyed session, with the frame's own tag (seeds carry valid ones) and again with
 *    the correct tag computed here, so the seq/replay logic is reached past the HMAC:
 *    the verdict must be exactly what the tag and seq rules say, and a refused frame
 *    must leave the session's state alone. */
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/frame.h"
#include "common/msg.h"
#include "fuzz.h"

typedef struct ref {
    size_t *off, *plen; /* frame i: header at off[i], payload of plen[i] bytes */
    size_t n;
    size_t bad_end; /* end of the first oversized header, or SIZE_MAX */
} ref_t;

static uint32_t be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

static void ref_walk(const uint8_t *s, size_t len, uint32_t max, ref_t *r)
{
    size_t pos = 0, cap = len / (CH_FRAME_HDR + CH_FRAME_TAG) + 1;
    r->off = malloc(cap * sizeof *r->off);
    r->plen = malloc(cap * sizeof *r->plen);
    FUZZ_ASSERT(r->off && r->plen);
    r->n = 0;
    r->bad_end = SIZE_MAX;
    while (len - pos >= CH_FRAME_HDR) {
        uint32_t plen = be32(s + pos);
        if (plen > max) {
            r->bad_end = pos + CH_FRAME_HDR;
            return;
        }
        size_t flen = CH_FRAME_HDR + (size_t)plen + CH_FRAME_TAG;
        if (len - pos < flen)
            return;
        r->off[r->n] = pos;
        r->plen[r->n] = plen;
        r->n++;
        pos += flen;
    }
}

static uint64_t mix(uint64_t h, uint64_t v)
{
    h ^= v;
    h *= 0x100000001B3ull;
    return h ^ (h >> 29);
}

typedef struct sessions {
    ch_session_t plain, keyed, retagged, client;
} sessions_t;

/* What ch_session_accept must answer for this seq and tag. */
static int expected_verdict(const ch_session_t *s, uint64_t seq, const uint8_t *tag,
                            const uint8_t *want)
{
    if (memcmp(tag, want, CH_FRAME_TAG) != 0)
        return CH_E_AUTH;
    return seq <= s->recv_seq ? CH_E_REPLAY : 0;
}

static void check_session(ch_session_t *s, const uint8_t *p, size_t len, const uint8_t *tag,
                          const uint8_t *want, const Chorus__Envelope *plain_env)
{
    ch_session_t before = *s;
    Chorus__Envelope *env = NULL;
    int rc = ch_msg_decode(s, p, len, tag, &env);
    if (!plain_env) { /* the payload itself does not decode */
        FUZZ_ASSERT(rc == CH_E_FRAME && env == NULL);
        FUZZ_ASSERT(memcmp(&before, s, sizeof before) == 0);
        return;
    }
    int want_rc = expected_verdict(&before, plain_env->seq, tag, want);
    FUZZ_ASSERT(rc == want_rc);
    if (rc < 0) {
        FUZZ_ASSERT(env == NULL);
        FUZZ_ASSERT(memcmp(&before, s, sizeof before) == 0);
        return;
    }
    FUZZ_ASSERT(env != NULL && env->seq == plain_env->seq);
    FUZZ_ASSERT(s->recv_seq == env->seq && s->send_seq == before.send_seq);
    ch_msg_free(env);
}

/* protobuf-c 1.4.1 rejects a tag byte 0x00 (field number 0) but accepts the same tag in a
 * longer varint (0x80 0x00), keeping it as an unknown field that it then packs as 0x00 and
 * cannot read back. Chorus only ignores unknown fields, so this is harmless to it; the
 * re-encode check below allows exactly this case. */
static int has_field_zero(const ProtobufCMessage *m)
{
    for (unsigned i = 0; i < m->n_unknown_fields; i++)
        if (m->unknown_fields[i].tag == 0)
            return 1;
    const ProtobufCMessageDescriptor *d = m->descriptor;
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        const char *base = (const char *)m;
        if (f->type != PROTOBUF_C_TYPE_MESSAGE)
            continue;
        if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            size_t n = *(const size_t *)(base + f->quantifier_offset);
            ProtobufCMessage *const *kids = *(ProtobufCMessage *const *const *)(base + f->offset);
            for (size_t k = 0; k < n; k++)
                if (has_field_zero(kids[k]))
                    return 1;
            continue;
        }
        if ((f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) &&
            *(const uint32_t *)(base + f->quantifier_offset) != f->id)
            continue;
        const ProtobufCMessage *sub = *(const ProtobufCMessage *const *)(base + f->offset);
        if (sub && has_field_zero(sub))
            return 1;
    }
    return 0;
}

/* encode(env) -> frame -> reader -> decode -> encode gives the same frame. */
static void check_reencode(Chorus__Envelope *env)
{
    uint8_t *f1 = NULL, *f2 = NULL;
    size_t n1 = 0, n2 = 0;
    int rc = ch_msg_encode(NULL, env, &f1, &n1);
    if (rc == CH_E_TOOBIG)
        return;
    FUZZ_ASSERT(rc == 0 && n1 >= CH_FRAME_HDR + CH_FRAME_TAG);

    ch_frame_reader_t r;
    ch_frame_reader_init(&r, CH_FRAME_MAX_DEFAULT);
    FUZZ_ASSERT(ch_frame_reader_feed(&r, f1, n1) == 0);
    const uint8_t *p = NULL, *tag = NULL;
    size_t plen = 0;
    FUZZ_ASSERT(ch_frame_reader_next(&r, &p, &plen, &tag) == 1);
    FUZZ_ASSERT(plen == n1 - CH_FRAME_HDR - CH_FRAME_TAG);
    Chorus__Envelope *again = NULL;
    rc = ch_msg_decode(NULL, p, plen, tag, &again);
    if (rc != 0) {
        FUZZ_ASSERT(rc == CH_E_FRAME && has_field_zero(&env->base));
        ch_frame_reader_fini(&r);
        free(f1);
        return;
    }
    FUZZ_ASSERT(again->body_case == env->body_case && again->seq == env->seq &&
                again->request_id == env->request_id);
    FUZZ_ASSERT(strcmp(ch_msg_name(again), ch_msg_name(env)) == 0);
    FUZZ_ASSERT(ch_msg_encode(NULL, again, &f2, &n2) == 0);
    FUZZ_ASSERT(n1 == n2 && memcmp(f1, f2, n1) == 0);
    ch_msg_free(again);
    ch_frame_reader_fini(&r);
    free(f1);
    free(f2);
}

static void check_frame(sessions_t *ss, const uint8_t *p, size_t len, const uint8_t *tag)
{
    Chorus__Envelope *env = NULL;
    int rc = ch_msg_decode(NULL, p, len, tag, &env);
    FUZZ_ASSERT(rc == 0 || rc == CH_E_FRAME);
    FUZZ_ASSERT((rc == 0) == (env != NULL));
    if (env) {
        FUZZ_ASSERT(env->body_case != CHORUS__ENVELOPE__BODY__NOT_SET);
        FUZZ_ASSERT(ch_msg_name(env) != NULL);
    }

    static const uint8_t zero[CH_FRAME_TAG];
    uint8_t want[CH_FRAME_TAG] = {0};
    if (env)
        ch_session_tag(&ss->client, env->seq, p, len, want);
    check_session(&ss->plain, p, len, tag, zero, env);
    check_session(&ss->keyed, p, len, tag, want, env);
    check_session(&ss->retagged, p, len, want, want, env);

    if (env) {
        check_reencode(env);
        ch_msg_free(env);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ref_t ref;
    sessions_t ss;
    ch_session_init_plain(&ss.plain, 1);
    fuzz_keyed_pair(&ss.client, &ss.keyed);
    ss.retagged = ss.keyed;

    /* The reader's limit and the feed sizes are functions of the input. */
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < size && i < 64; i++)
        h = mix(h, data[i]);
    h = mix(h, size);
    uint32_t max = (h & 1) ? 64u << 10 : 300;
    ref_walk(data, size, max, &ref);

    ch_frame_reader_t r;
    ch_frame_reader_init(&r, max);
    size_t fed = 0, got = 0;
    int refused = 0;
    while (fed < size && !refused) {
        h = mix(h, fed);
        size_t piece = (h >> 8) % 4 == 0 ? 1 + (h >> 16) % 7 : 1 + (h >> 16) % 512;
        if (piece > size - fed)
            piece = size - fed;
        int rc = ch_frame_reader_feed(&r, data + fed, piece);
        fed += piece;
        if (ref.bad_end <= fed) {
            FUZZ_ASSERT(rc == CH_E_TOOBIG);
            refused = 1;
        } else {
            FUZZ_ASSERT(rc == 0);
        }
        /* Drain: a refused reader still hands out the frames it had whole before. */
        for (;;) {
            const uint8_t *p = NULL, *tag = NULL;
            size_t plen = 0;
            rc = ch_frame_reader_next(&r, &p, &plen, &tag);
            if (rc == 0) {
                FUZZ_ASSERT(got == ref.n ||
                            ref.off[got] + CH_FRAME_HDR + ref.plen[got] + CH_FRAME_TAG >
                                fed - (refused ? piece : 0));
                break;
            }
            FUZZ_ASSERT(rc != CH_E_TOOBIG); /* feed refuses such a header first */
            FUZZ_ASSERT(rc == 1 && got < ref.n);
            FUZZ_ASSERT(plen == ref.plen[got]);
            FUZZ_ASSERT(memcmp(p, data + ref.off[got] + CH_FRAME_HDR, plen) == 0);
            FUZZ_ASSERT(tag == p + plen);
            FUZZ_ASSERT(memcmp(tag, data + ref.off[got] + CH_FRAME_HDR + plen, CH_FRAME_TAG) == 0);
            check_frame(&ss, p, plen, tag);
            got++;
        }
    }
    if (!refused && ref.bad_end == SIZE_MAX)
        FUZZ_ASSERT(got == ref.n);
    ch_frame_reader_fini(&r);
    free(ref.off);
    free(ref.plen);
    return 0;
}
