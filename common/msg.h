/* Envelope <-> frame, with the session's sequence numbers and tags. The one place
 * that calls protobuf-c's pack/unpack for the control plane. */
#ifndef CH_MSG_H
#define CH_MSG_H

#include "chorus.pb-c.h"
#include "common/auth.h"
#include "common/layout.h"

/* Pack env into a complete frame (header | payload | tag). Sets env->seq to the next
 * send sequence of s. *out is malloc'd; the caller frees it. */
int ch_msg_encode(ch_session_t *s, Chorus__Envelope *env, uint8_t **out, size_t *len);
/* Decode one frame's payload and check tag and seq (unless the session is still in its
 * untagged handshake: pass s == NULL). *out must be freed with ch_msg_free. */
int ch_msg_decode(ch_session_t *s, const uint8_t *payload, size_t len, const uint8_t *tag,
                  Chorus__Envelope **out);
void ch_msg_free(Chorus__Envelope *env);

/* ch_msg_decode into the process's decoding arena: one block reused for every message,
 * instead of a malloc and a free for each field and string (at 16,384 ranks the
 * coordinator's mallocs, frees and free_unpacked's walks were 7% of its steady state).
 * While the arena holds a message (one decoded in a callback of another, another thread's)
 * this is ch_msg_decode. *out must be freed with ch_msg_release, before the next one. */
int ch_msg_decode_fast(ch_session_t *s, const uint8_t *payload, size_t len, const uint8_t *tag,
                       Chorus__Envelope **out);
void ch_msg_release(Chorus__Envelope *env);
/* A rank's place (common/layout.h) on the wire: RankEvent's placed fields (the rank
 * reports; to_event sets placed) and RankPlace (status; `reported` is the caller's). The
 * one place that converts the layout between protobuf and C. */
void ch_msg_place_to_event(const ch_place_t *p, Chorus__RankEvent *ev);
void ch_msg_place_from_event(const Chorus__RankEvent *ev, ch_place_t *p);
void ch_msg_place_to_pb(const ch_place_t *p, Chorus__RankPlace *out);
/* Name of the envelope's body ("heartbeat"), for logs. */
const char *ch_msg_name(const Chorus__Envelope *env);

#endif
