/* The agent's queue of rank events while the coordinator link is down; see evqueue.h. */
#include "workerd/evqueue.h"

#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/log.h"

static void ev_free(Chorus__RankEvent *e)
{
    if (!e)
        return;
    free(e->job_id);
    free(e->message);
    free(e->timeout_group);
    free(e->resume_source);
    for (size_t i = 0; i < e->n_metrics; i++) {
        if (e->metrics[i])
            free(e->metrics[i]->name);
        free(e->metrics[i]);
    }
    free(e->metrics);
    free(e);
}

/* Deep copy: every string and metric owned by the copy. */
static Chorus__RankEvent *ev_dup(const Chorus__RankEvent *src)
{
    Chorus__RankEvent *e = malloc(sizeof *e);
    if (!e)
        return NULL;
    *e = *src;
    /* nothing of src's may be freed with a partial copy */
    e->job_id = e->message = e->timeout_group = e->resume_source = NULL;
    e->n_metrics = 0;
    e->metrics = NULL;
    e->job_id = strdup(src->job_id ? src->job_id : "");
    e->message = strdup(src->message ? src->message : "");
    e->timeout_group = strdup(src->timeout_group ? src->timeout_group : "");
    e->resume_source = strdup(src->resume_source ? src->resume_source : "");
    e->n_metrics = 0;
    e->metrics = NULL;
    if (!e->job_id || !e->message || !e->timeout_group || !e->resume_source)
        goto fail;
    if (src->n_metrics) {
        if (!(e->metrics = calloc(src->n_metrics, sizeof *e->metrics)))
            goto fail;
        for (size_t i = 0; i < src->n_metrics; i++) {
            Chorus__Metric *m = malloc(sizeof *m);
            if (!m)
                goto fail;
            *m = *src->metrics[i];
            e->metrics[i] = m;
            e->n_metrics = i + 1;
            if (!(m->name = strdup(src->metrics[i]->name ? src->metrics[i]->name : "")))
                goto fail;
        }
    }
    return e;
fail:
    ev_free(e);
    return NULL;
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
    ev_free(*q_at(q, victim));
    for (size_t i = victim; i > 0; i--)
        *q_at(q, i) = *q_at(q, i - 1);
    q->head = (q->head + 1) % WRK_EVQ_MAX;
    q->len--;
    CH_LOGW("agent", "event queue full: dropped one event");
}

void wrk_evq_push(wrk_evq_t *q, const Chorus__RankEvent *ev)
{
    Chorus__RankEvent *copy = ev_dup(ev);
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
    ev_free(*q_at(q, 0));
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
