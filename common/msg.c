/* Envelope <-> frame (msg.h): the one place that packs and unpacks control-plane
 * protobufs, stamping sequence numbers and tags from the session. */
#include "common/msg.h"

#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/frame.h"

int ch_msg_encode(ch_session_t *s, Chorus__Envelope *env, uint8_t **out, size_t *len)
{
    *out = NULL;
    *len = 0;
    if (!env)
        return -EINVAL;
    if (s)
        env->seq = s->send_seq + 1;
    size_t plen = chorus__envelope__get_packed_size(env);
    if (plen > CH_FRAME_MAX_DEFAULT)
        return CH_E_TOOBIG;
    size_t flen = CH_FRAME_HDR + plen + CH_FRAME_TAG;
    uint8_t *f = malloc(flen);
    if (!f)
        return -ENOMEM;
    ch_frame_put_header(f, (uint32_t)plen);
    size_t packed = chorus__envelope__pack(env, f + CH_FRAME_HDR);
    if (packed != plen) {
        free(f);
        return CH_E_FRAME;
    }
    uint8_t *tag = f + CH_FRAME_HDR + plen;
    if (s) {
        ch_session_tag(s, env->seq, f + CH_FRAME_HDR, plen, tag);
        s->send_seq = env->seq;
    } else {
        memset(tag, 0, CH_FRAME_TAG);
    }
    *out = f;
    *len = flen;
    return 0;
}

int ch_msg_decode(ch_session_t *s, const uint8_t *payload, size_t len, const uint8_t *tag,
                  Chorus__Envelope **out)
{
    *out = NULL;
    Chorus__Envelope *env = chorus__envelope__unpack(NULL, len, payload);
    if (!env)
        return CH_E_FRAME;
    /* An envelope without a body carries nothing to act on (or a body this build does
     * not know): refuse it like any other undecodable frame. */
    if (env->body_case == CHORUS__ENVELOPE__BODY__NOT_SET) {
        chorus__envelope__free_unpacked(env, NULL);
        return CH_E_FRAME;
    }
    if (s) {
        int rc = ch_session_accept(s, env->seq, payload, len, tag);
        if (rc < 0) {
            chorus__envelope__free_unpacked(env, NULL);
            return rc;
        }
    }
    *out = env;
    return 0;
}

void ch_msg_free(Chorus__Envelope *env)
{
    if (env)
        chorus__envelope__free_unpacked(env, NULL);
}

const char *ch_msg_name(const Chorus__Envelope *env)
{
    if (!env)
        return "null";
    if (env->body_case == CHORUS__ENVELOPE__BODY__NOT_SET)
        return "empty";
    const ProtobufCFieldDescriptor *f = protobuf_c_message_descriptor_get_field(
        &chorus__envelope__descriptor, (unsigned)env->body_case);
    return f ? f->name : "unknown";
}

void ch_msg_place_to_event(const ch_place_t *p, Chorus__RankEvent *ev)
{
    ev->placed = 1;
    ev->coord_tp = p->coord.tp;
    ev->coord_pp = p->coord.pp;
    ev->coord_dp = p->coord.dp;
    ev->first_block = p->first_block;
    ev->blocks = p->blocks;
    ev->shards = p->shards;
    ev->owned_params = p->owned_params;
}

void ch_msg_place_from_event(const Chorus__RankEvent *ev, ch_place_t *p)
{
    *p = (ch_place_t){.coord = {.tp = ev->coord_tp, .dp = ev->coord_dp, .pp = ev->coord_pp},
                      .first_block = ev->first_block,
                      .blocks = ev->blocks,
                      .shards = ev->shards,
                      .owned_params = ev->owned_params};
}

void ch_msg_place_to_pb(const ch_place_t *p, Chorus__RankPlace *out)
{
    chorus__rank_place__init(out);
    out->tp = p->coord.tp;
    out->pp = p->coord.pp;
    out->dp = p->coord.dp;
    out->first_block = p->first_block;
    out->blocks = p->blocks;
    out->shards = p->shards;
    out->owned_params = p->owned_params;
}
