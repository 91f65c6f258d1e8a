/* Envelope <-> frame (msg.h): the one place that packs and unpacks control-plane
 * protobufs, stamping sequence numbers and tags from the session. */
#include "common/msg.h"

#include <stdatomic.h>
#include <stddef.h>
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

static int decode_with(ProtobufCAllocator *pa, ch_session_t *s, const uint8_t *payload, size_t len,
                       const uint8_t *tag, Chorus__Envelope **out)
{
    *out = NULL;
    Chorus__Envelope *env = chorus__envelope__unpack(pa, len, payload);
    if (!env)
        return CH_E_FRAME;
    /* An envelope without a body carries nothing to act on (or a body this build does
     * not know): refuse it like any other undecodable frame. */
    if (env->body_case == CHORUS__ENVELOPE__BODY__NOT_SET) {
        chorus__envelope__free_unpacked(env, pa);
        return CH_E_FRAME;
    }
    if (s) {
        int rc = ch_session_accept(s, env->seq, payload, len, tag);
        if (rc < 0) {
            chorus__envelope__free_unpacked(env, pa);
            return rc;
        }
    }
    *out = env;
    return 0;
}

int ch_msg_decode(ch_session_t *s, const uint8_t *payload, size_t len, const uint8_t *tag,
                  Chorus__Envelope **out)
{
    return decode_with(NULL, s, payload, len, tag, out);
}

void ch_msg_free(Chorus__Envelope *env)
{
    if (env)
        chorus__envelope__free_unpacked(env, NULL);
}

/* The decoding arena: a block that grows to what a message needed (up to ARENA_MAX), bumped
 * for each allocation; what does not fit is malloc'd, and all of it goes at the release. */
#define ARENA_MIN 16384u
#define ARENA_MAX 65536u

/* A block that did not fit in the arena; its data follows, aligned for any type. */
typedef union arena_big {
    union arena_big *next;
    max_align_t align;
} arena_big_t;

typedef struct arena {
    uint8_t *buf;
    size_t cap, used, need;
    arena_big_t *big;
} arena_t;

static arena_t g_arena;                             /* reachable: never a leak */
static atomic_flag g_arena_busy = ATOMIC_FLAG_INIT; /* taken by one message at a time */
/* The message decoded in it, until ch_msg_release (another thread's release looks too). */
static _Atomic(const Chorus__Envelope *) g_arena_env;

#define ARENA_ALIGN(n) (((n) + sizeof(max_align_t) - 1) & ~(sizeof(max_align_t) - 1))

static void *arena_alloc(void *ud, size_t n)
{
    arena_t *a = ud;
    size_t sz = ARENA_ALIGN(n ? n : 1);
    a->need += sz;
    if (a->buf && a->cap - a->used >= sz) {
        void *p = a->buf + a->used;
        a->used += sz;
        return p;
    }
    arena_big_t *b = malloc(sizeof *b + sz);
    if (!b)
        return NULL;
    b->next = a->big;
    a->big = b;
    return b + 1;
}

/* Everything goes at the release. */
static void arena_free(void *ud, void *p)
{
    (void)ud;
    (void)p;
}

static void arena_reset(arena_t *a)
{
    for (arena_big_t *b = a->big, *next; b; b = next) {
        next = b->next;
        free(b);
    }
    a->big = NULL;
    if (a->need > a->cap && a->cap < ARENA_MAX) { /* the next message may need as much */
        size_t cap = a->need < ARENA_MIN ? ARENA_MIN : ARENA_ALIGN(a->need);
        uint8_t *buf = malloc(cap < ARENA_MAX ? cap : ARENA_MAX);
        if (buf) {
            free(a->buf);
            a->buf = buf;
            a->cap = cap < ARENA_MAX ? cap : ARENA_MAX;
        }
    }
    a->used = a->need = 0;
}

int ch_msg_decode_fast(ch_session_t *s, const uint8_t *payload, size_t len, const uint8_t *tag,
                       Chorus__Envelope **out)
{
    if (atomic_flag_test_and_set(&g_arena_busy))
        return ch_msg_decode(s, payload, len, tag, out);
    arena_t *a = &g_arena;
    ProtobufCAllocator pa = {.alloc = arena_alloc, .free = arena_free, .allocator_data = a};
    int rc = decode_with(&pa, s, payload, len, tag, out);
    if (rc < 0) {
        arena_reset(a);
        atomic_flag_clear(&g_arena_busy);
        return rc;
    }
    atomic_store(&g_arena_env, *out);
    return 0;
}

void ch_msg_release(Chorus__Envelope *env)
{
    if (!env)
        return;
    if (env != atomic_load(&g_arena_env)) { /* decoded while the arena was taken */
        ch_msg_free(env);
        return;
    }
    atomic_store(&g_arena_env, NULL);
    arena_reset(&g_arena);
    atomic_flag_clear(&g_arena_busy);
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
