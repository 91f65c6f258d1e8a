/* The agent's queue of rank events while the coordinator link is down; see evqueue.h. */
#include "workerd/evqueue.h"

#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/log.h"

void wrk_evq_free_event(Chorus__RankEvent *e)
{
    if (e)
        chorus__rank_event__free_unpacked(e, NULL);
}

/* A deep copy through the wire form: every field, strings, repeated metrics and nested
 * messages alike, including fields added after this was written (a field-by-field copy
 * once left new pointer fields shared with the original). */
Chorus__RankEvent *wrk_evq_dup(const Chorus__RankEvent *src)
{
    size_t n = chorus__rank_event__get_packed_size(src);
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf)
        return NULL;
    chorus__rank_event__pack(src, buf);
    Chorus__RankEvent *e = chorus__rank_event__unpack(NULL, n, buf);
    free(buf);
    return e;
}

static Chorus__RankEvent **q_at(wrk_evq_t *q, size_t i)
{
    return &q->v[(q->head + i) % WRK_EVQ_MAX];
}

/* Full queue: drop the oldest progress report (a later one supersedes it), else the
 * oldest event. Lifecycle events are what the coordinator cannot do without. */
static void q_make_room(wrk_evq_t *q)
{
    size_t victim = 0;
    for (size_t i = 0; i < q->len; i++) {
        if ((*q_at(q, i))->kind == CHORUS__RANK_EVENT_KIND__RANK_PROGRESS) {
            victim = i;
            break;
        }
    }
    wrk_evq_free_event(*q_at(q, victim));
    for (size_t i = victim; i > 0; i--)
        *q_at(q, i) = *q_at(q, i - 1);
    q->head = (q->head + 1) % WRK_EVQ_MAX;
    q->len--;
    CH_LOGW("agent", "event queue full: dropped one event");
}

void wrk_evq_push(wrk_evq_t *q, const Chorus__RankEvent *ev)
{
    Chorus__RankEvent *copy = wrk_evq_dup(ev);
    if (!copy) {
        CH_LOGE("agent", "out of memory: dropped a rank event");
        return;
    }
    if (q->len == WRK_EVQ_MAX)
        q_make_room(q);
    *q_at(q, q->len) = copy;
    q->len++;
}

int wrk_evq_init(wrk_evq_t *q)
{
    *q = (wrk_evq_t){0};
    q->v = calloc(WRK_EVQ_MAX, sizeof *q->v);
    return q->v ? 0 : -ENOMEM;
}

Chorus__RankEvent *wrk_evq_front(wrk_evq_t *q)
{
    return q->len ? *q_at(q, 0) : NULL;
}

void wrk_evq_pop(wrk_evq_t *q)
{
    if (!q->len)
        return;
    wrk_evq_free_event(*q_at(q, 0));
    q->head = (q->head + 1) % WRK_EVQ_MAX;
    q->len--;
}

void wrk_evq_fini(wrk_evq_t *q)
{
    while (q->len)
        wrk_evq_pop(q);
    free(q->v);
    q->v = NULL;
}
