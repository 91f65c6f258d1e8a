/* The agent's rank events while the coordinator link is down: a bounded ring of owned
 * deep copies, flushed in order after the next RegisterAck. When full, the oldest
 * progress report goes first (a later one supersedes it), else the oldest event:
 * lifecycle events are what the coordinator cannot do without. */
#ifndef WRK_EVQUEUE_H
#define WRK_EVQUEUE_H

#include <stddef.h>

#include "chorus.pb-c.h"

#define WRK_EVQ_MAX 4096

typedef struct wrk_evq {
    Chorus__RankEvent **v; /* ring of owned copies */
    size_t head, len;
} wrk_evq_t;

int wrk_evq_init(wrk_evq_t *q);
void wrk_evq_fini(wrk_evq_t *q);
/* Queue a deep copy of ev (dropped, logged, when out of memory). */
void wrk_evq_push(wrk_evq_t *q, const Chorus__RankEvent *ev);
/* The oldest event (owned by the queue), NULL when empty; pop frees it. */
Chorus__RankEvent *wrk_evq_front(wrk_evq_t *q);
void wrk_evq_pop(wrk_evq_t *q);

/* A deep copy of ev (all of its memory its own, through the wire form; NULL when out of
 * memory), and
 * its release (also of the progress aggregator's copies, progress.h). */
Chorus__RankEvent *wrk_evq_dup(const Chorus__RankEvent *ev);
void wrk_evq_free_event(Chorus__RankEvent *e);

#endif
