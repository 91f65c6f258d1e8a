/* Per-node progress aggregation; see progress.h. */
#include "workerd/progress.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/log.h"
#include "workerd/evqueue.h"

/* A group nothing was reported to for this many intervals is let go (a generation ended). */
#define GROUP_IDLE_MAX 60

/* One rank's latest report of the interval, and the figures of its steps since the last
 * send (RankSummary computes, tps: the straggler detector judges steps, not intervals). */
typedef struct held {
    uint32_t rank;
    int fresh;         /* a report came since the last send */
    uint32_t figs;     /* figures in computes/tps, oldest first, of consecutive steps */
    uint64_t fig_step; /* the step of the newest */
    float computes[WRK_PROGRESS_FIGURES], tps[WRK_PROGRESS_FIGURES];
    int sent_full;  /* a full report of it went (its first one always does) */
    uint64_t names; /* hash of the metric names of the last full report sent */
    Chorus__RankSummary sum;
    Chorus__RankEvent *full; /* owned copy of the latest report, freed once sent */
} held_t;

/* The ranks of one (job, generation) this node reports for. */
typedef struct pgroup {
    struct pgroup *next;
    char job_id[64];
    uint64_t gen, token, total;
    uint32_t idle; /* intervals with nothing fresh */
    held_t *v;
    size_t n, cap;
    Chorus__RankEvent **ckpt; /* held checkpoint reports (owned copies), in arrival order */
    size_t n_ckpt, cap_ckpt;
} pgroup_t;

struct wrk_progress {
    wrk_progress_cfg_t cfg;
    pgroup_t *groups;
    uint64_t last_send_ms;
    uint64_t intervals; /* sent so far: every detail_every-th carries detail */
    int want_all;       /* detail asked for every job */
    char want_job[64];  /* detail asked for this job ("" none) */
    wrk_progress_stats_t st;
};

int wrk_progress_create(const wrk_progress_cfg_t *cfg, wrk_progress_t **out)
{
    wrk_progress_t *p = calloc(1, sizeof *p);
    if (!p)
        return -ENOMEM;
    p->cfg = *cfg;
    *out = p;
    return 0;
}

static void ckpt_drop(pgroup_t *g)
{
    for (size_t i = 0; i < g->n_ckpt; i++)
        wrk_evq_free_event(g->ckpt[i]);
    g->n_ckpt = 0;
}

static void group_free(pgroup_t *g)
{
    for (size_t i = 0; i < g->n; i++)
        wrk_evq_free_event(g->v[i].full);
    ckpt_drop(g);
    free(g->ckpt);
    free(g->v);
    free(g);
}

void wrk_progress_destroy(wrk_progress_t *p)
{
    if (!p)
        return;
    while (p->groups) {
        pgroup_t *g = p->groups;
        p->groups = g->next;
        group_free(g);
    }
    free(p);
}

/* This interval carries full reports of job's ranks. */
static int detail_due(const wrk_progress_t *p, const char *job)
{
    if (p->want_all || (p->want_job[0] && strcmp(p->want_job, job) == 0))
        return 1;
    return p->cfg.detail_every && (p->intervals + 1) % p->cfg.detail_every == 0;
}

static pgroup_t *group_get(wrk_progress_t *p, const Chorus__RankEvent *ev)
{
    for (pgroup_t *g = p->groups; g; g = g->next)
        if (g->gen == ev->generation && strcmp(g->job_id, ev->job_id) == 0)
            return g;
    pgroup_t *g = calloc(1, sizeof *g);
    if (!g)
        return NULL;
    snprintf(g->job_id, sizeof g->job_id, "%s", ev->job_id);
    g->gen = ev->generation;
    g->next = p->groups;
    p->groups = g;
    return g;
}

static held_t *held_get(pgroup_t *g, uint32_t rank)
{
    for (size_t i = 0; i < g->n; i++)
        if (g->v[i].rank == rank)
            return &g->v[i];
    if (g->n == g->cap) {
        size_t cap = g->cap ? 2 * g->cap : 8;
        held_t *v = realloc(g->v, cap * sizeof *v);
        if (!v)
            return NULL;
        g->v = v;
        g->cap = cap;
    }
    held_t *h = &g->v[g->n++];
    *h = (held_t){.rank = rank};
    return h;
}

static double metric(const Chorus__RankEvent *ev, const char *name)
{
    for (size_t i = 0; i < ev->n_metrics; i++)
        if (ev->metrics[i]->name && strcmp(ev->metrics[i]->name, name) == 0)
            return ev->metrics[i]->value;
    return 0;
}

/* The coordinator keeps a rank's metrics by name (a diag rank reports each group's in its
 * own report): the interval's reports are one, each name with its latest value. Adds to dst
 * (the newer copy) the metrics of old it lacks. */
static int merge_metrics(Chorus__RankEvent *dst, const Chorus__RankEvent *old)
{
    for (size_t i = 0; i < old->n_metrics; i++) {
        const char *name = old->metrics[i]->name;
        size_t k = 0;
        while (k < dst->n_metrics && strcmp(dst->metrics[k]->name, name) != 0)
            k++;
        if (k < dst->n_metrics)
            continue;
        Chorus__Metric **v = realloc(dst->metrics, (dst->n_metrics + 1) * sizeof *v);
        if (!v)
            return -ENOMEM;
        dst->metrics = v;
        Chorus__Metric *m = malloc(sizeof *m);
        if (!m)
            return -ENOMEM;
        *m = *old->metrics[i];
        if (!(m->name = strdup(name))) {
            free(m);
            return -ENOMEM;
        }
        v[dst->n_metrics++] = m;
    }
    return 0;
}

/* Order-free hash of ev's metric names (FNV-1a of each, summed). */
static uint64_t names_hash(const Chorus__RankEvent *ev)
{
    uint64_t sum = 0;
    for (size_t i = 0; i < ev->n_metrics; i++) {
        uint64_t h = 1469598103934665603ull;
        for (const char *c = ev->metrics[i]->name; *c; c++)
            h = (h ^ (unsigned char)*c) * 1099511628211ull;
        sum += h;
    }
    return sum;
}

/* The step's compute and TP figures join h's, the oldest dropped beyond
 * WRK_PROGRESS_FIGURES (a shift of a few floats: no allocation per step). */
static void keep_figure(held_t *h, const Chorus__RankEvent *ev)
{
    double v = ev->t_compute > 0 ? ev->t_compute : ev->step_s;
    if (!(v > 0))
        return;
    if (h->figs && ev->step == h->fig_step)
        h->figs--; /* the same step again: its newer figure replaces it */
    else if (h->figs && ev->step != h->fig_step + 1)
        h->figs = 0; /* the coordinator counts the figures back from the latest step */
    h->fig_step = ev->step;
    if (h->figs == WRK_PROGRESS_FIGURES) {
        memmove(h->computes, h->computes + 1, (WRK_PROGRESS_FIGURES - 1) * sizeof(float));
        memmove(h->tps, h->tps + 1, (WRK_PROGRESS_FIGURES - 1) * sizeof(float));
        h->figs--;
    }
    h->computes[h->figs] = (float)v;
    h->tps[h->figs++] = (float)(ev->t_tp > 0 ? ev->t_tp : 0);
}

int wrk_progress_add(wrk_progress_t *p, const Chorus__RankEvent *ev)
{
    pgroup_t *g = group_get(p, ev);
    held_t *h = g ? held_get(g, ev->rank) : NULL;
    if (!h)
        return -ENOMEM;
    p->st.reports++;
    g->token = ev->launch_token;
    if (ev->total_steps)
        g->total = ev->total_steps;
    h->fresh = 1;
    g->idle = 0;
    chorus__rank_summary__init(&h->sum);
    h->sum.rank = ev->rank;
    h->sum.step = ev->step;
    h->sum.step_ms = metric(ev, "step_ms");
    h->sum.step_s = ev->step_s;
    h->sum.t_compute = ev->t_compute;
    keep_figure(h, ev);
    Chorus__RankEvent *full = wrk_evq_dup(ev); /* NULL when out of memory: a summary then */
    if (full && h->full && merge_metrics(full, h->full) < 0) {
        wrk_evq_free_event(full);
        full = NULL;
    }
    wrk_evq_free_event(h->full);
    h->full = full;
    return 0;
}

static int same(const Chorus__RankSummary *a, const Chorus__RankSummary *b)
{
    return a->step == b->step && a->step_ms == b->step_ms && a->step_s == b->step_s &&
           a->t_compute == b->t_compute && a->n_computes == b->n_computes && a->n_tps == b->n_tps &&
           !memcmp(a->computes, b->computes, a->n_computes * sizeof *a->computes) &&
           !memcmp(a->tps, b->tps, a->n_tps * sizeof *a->tps);
}

/* Whether h goes as a full report: its first, or all of them (a detail interval, a flush). */
static int goes_full(const held_t *h, int all)
{
    return h->full && (all || !h->sent_full || names_hash(h->full) != h->names);
}

static int goes_summary(const held_t *h, int all)
{
    return h->fresh && !goes_full(h, all);
}

/* The largest set of fresh summary ranks with equal figures: its first member, or -1 when
 * no two agree. O(n^2) over a node's slots. */
static long largest_equal(const pgroup_t *g, int all, size_t *count)
{
    long best = -1;
    *count = 0;
    for (size_t i = 0; i < g->n; i++) {
        if (!goes_summary(&g->v[i], all))
            continue;
        size_t k = 0;
        for (size_t j = 0; j < g->n; j++)
            k += goes_summary(&g->v[j], all) && same(&g->v[i].sum, &g->v[j].sum);
        if (k >= 2 && k > *count) {
            *count = k;
            best = (long)i;
        }
    }
    return best;
}

/* What was sent (or is dropped) no longer fresh. */
static void settle(pgroup_t *g, int all)
{
    for (size_t i = 0; i < g->n; i++) {
        held_t *h = &g->v[i];
        if (!h->fresh)
            continue;
        /* a full report carries its latest step's figures only: the others ride with the
         * next summary (the coordinator skips steps it has) */
        if (goes_full(h, all)) {
            h->sent_full = 1;
            h->names = names_hash(h->full);
        } else {
            h->figs = 0;
        }
        h->fresh = 0;
        wrk_evq_free_event(h->full);
        h->full = NULL;
    }
}

/* One NodeProgress for g's fresh ranks (all: every one in full) and its held checkpoint
 * reports (which go with everything in full, as the flush before each of them did); 0 when
 * sent or nothing was held. */
static int send_group(wrk_progress_t *p, pgroup_t *g, int all)
{
    Chorus__NodeProgress np = CHORUS__NODE_PROGRESS__INIT;
    Chorus__RankSummary common = CHORUS__RANK_SUMMARY__INIT;
    Chorus__Envelope env = CHORUS__ENVELOPE__INIT;
    uint32_t *ranks = malloc((g->n ? g->n : 1) * sizeof *ranks);
    Chorus__RankSummary **differ = malloc((g->n ? g->n : 1) * sizeof *differ);
    Chorus__RankEvent **detail = malloc((g->n ? g->n : 1) * sizeof *detail);
    int rc = -ENOMEM;
    if (!ranks || !differ || !detail)
        goto out;
    /* the figures' arrays live in g->v, which may have moved since the reports came */
    for (size_t i = 0; i < g->n; i++) {
        held_t *h = &g->v[i];
        h->sum.computes = h->computes;
        h->sum.tps = h->tps;
        h->sum.n_computes = h->sum.n_tps = h->figs;
    }
    size_t n_eq;
    all = all || g->n_ckpt;
    long eq = largest_equal(g, all, &n_eq);
    for (size_t i = 0; i < g->n; i++) {
        held_t *h = &g->v[i];
        if (!h->fresh)
            continue;
        if (goes_full(h, all))
            detail[np.n_detail++] = h->full;
        else if (eq >= 0 && same(&h->sum, &g->v[eq].sum))
            ranks[np.n_ranks++] = h->rank;
        else
            differ[np.n_differ++] = &h->sum;
    }
    rc = 0;
    if (!np.n_detail && !np.n_ranks && !np.n_differ && !g->n_ckpt)
        goto out;
    np.job_id = g->job_id;
    np.generation = g->gen;
    np.launch_token = g->token;
    np.total_steps = g->total;
    if (np.n_ranks) {
        common = g->v[eq].sum;
        common.rank = 0;
        np.common = &common;
        np.ranks = ranks;
    }
    np.differ = differ;
    np.detail = detail;
    np.checkpoints = g->ckpt;
    np.n_checkpoints = g->n_ckpt;
    env.body_case = CHORUS__ENVELOPE__BODY_NODE_PROGRESS;
    env.node_progress = &np;
    rc = p->cfg.send(p->cfg.ud, &env);
    if (rc == 0) {
        p->st.messages++;
        p->st.details += np.n_detail;
        p->st.checkpoints += np.n_checkpoints;
        settle(g, all);
        ckpt_drop(g);
    }
out:
    free(ranks);
    free(differ);
    free(detail);
    return rc;
}

/* Before a lifecycle event of the job (a rank done, failed, exited): what is held goes now
 * and in full, so a rank's last figures (a diag rank's gflops) precede its end. Held
 * checkpoint reports that cannot go are the owner's (cfg.unsent), to precede the event. */
void wrk_progress_flush(wrk_progress_t *p, const char *job, uint64_t gen)
{
    for (pgroup_t *g = p->groups; g; g = g->next) {
        if (g->gen != gen || strcmp(g->job_id, job) != 0)
            continue;
        if (send_group(p, g, 1) < 0) {
            CH_LOGD("progress", "job=%s gen=%llu held progress dropped (not sent)", job,
                    (unsigned long long)gen);
            settle(g, 0);
            for (size_t i = 0; i < g->n_ckpt && p->cfg.unsent; i++)
                p->cfg.unsent(p->cfg.ud, g->ckpt[i]);
            ckpt_drop(g);
        }
        return;
    }
}

static int has_fresh(const pgroup_t *g)
{
    for (size_t i = 0; i < g->n; i++)
        if (g->v[i].fresh)
            return 1;
    return 0;
}

int wrk_progress_checkpoint(wrk_progress_t *p, const Chorus__RankEvent *ev, uint32_t node_ranks)
{
    pgroup_t *g = group_get(p, ev);
    if (!g)
        return -ENOMEM;
    if (g->n_ckpt == g->cap_ckpt) {
        size_t cap = g->cap_ckpt ? 2 * g->cap_ckpt : 8;
        Chorus__RankEvent **v = realloc(g->ckpt, cap * sizeof *v);
        if (!v)
            return -ENOMEM;
        g->ckpt = v;
        g->cap_ckpt = cap;
    }
    Chorus__RankEvent *copy = wrk_evq_dup(ev);
    if (!copy)
        return -ENOMEM;
    g->token = ev->launch_token;
    g->idle = 0;
    g->ckpt[g->n_ckpt++] = copy;
    uint32_t k = 0;
    for (size_t i = 0; i < g->n_ckpt; i++)
        k += g->ckpt[i]->step == ev->step;
    if (k >= node_ranks)
        (void)send_group(p, g, 1); /* not sent: held for the next tick or flush */
    return 0;
}

void wrk_progress_tick(wrk_progress_t *p, uint64_t now_ms)
{
    if (!p->groups)
        return;
    if (now_ms + p->cfg.slack_ms - p->last_send_ms < p->cfg.interval_ms) {
        /* Between intervals only held checkpoint reports go (kept when not sent). */
        for (pgroup_t *g = p->groups; g; g = g->next)
            if (g->n_ckpt)
                (void)send_group(p, g, 1);
        return;
    }
    int failed = 0;
    for (pgroup_t **pp = &p->groups; *pp;) {
        pgroup_t *g = *pp;
        if (!has_fresh(g) && !g->n_ckpt && ++g->idle > GROUP_IDLE_MAX) {
            *pp = g->next;
            group_free(g);
            continue;
        }
        if (send_group(p, g, detail_due(p, g->job_id)) < 0)
            failed = 1; /* kept: tried again at the next tick */
        pp = &g->next;
    }
    if (failed)
        return;
    p->last_send_ms = now_ms;
    p->intervals++;
    p->want_all = 0;
    p->want_job[0] = '\0';
}

void wrk_progress_want_detail(wrk_progress_t *p, const char *job)
{
    if (!job || !*job)
        p->want_all = 1;
    else
        snprintf(p->want_job, sizeof p->want_job, "%s", job);
}

int wrk_heartbeat_due(uint64_t now_ms, uint64_t last_sent_ms, uint32_t heartbeat_ms,
                      uint32_t dead_after_ms)
{
    if ((uint64_t)dead_after_ms < 3 * (uint64_t)heartbeat_ms)
        return 1;
    return !last_sent_ms || now_ms < last_sent_ms || now_ms - last_sent_ms >= heartbeat_ms;
}

void wrk_progress_stats(const wrk_progress_t *p, wrk_progress_stats_t *out)
{
    *out = p->st;
}
