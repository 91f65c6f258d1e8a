/* Jobs: submission, start, failure, cancel, reload; see job.h (rank events: jobevent.c; replies:
 * jobinfo.c). */
#include "job.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/log.h"
#include "common/plan.h"
#include "common/util.h"
#include "coord.h"
#include "launch.h"
#include "recovery.h"
#include "scheduler.h"
#include "straggler.h"

static const char *const JOB_STATES[COORD_JOB_NSTATES] = {
    "queued", "starting", "running", "recovering", "completed", "failed", "cancelled"};
/* failing shows as failed: the rank has failed, only its exit is still to come. */
static const char *const RANK_STATES[COORD_RANK_NSTATES] = {
    "new", "pending", "unknown", "running", "done", "failed", "exited", "failed", "lost"};

const char *coord_job_state_name(coord_job_state_t s)
{
    return s < COORD_JOB_NSTATES ? JOB_STATES[s] : "?";
}

static int state_parse(const char *name, coord_job_state_t *out)
{
    for (int s = 0; s < COORD_JOB_NSTATES; s++) {
        if (strcmp(name, JOB_STATES[s]) == 0) {
            *out = (coord_job_state_t)s;
            return 0;
        }
    }
    return CH_E_FORMAT;
}

const char *coord_rank_state_name(coord_rank_state_t s)
{
    return s < COORD_RANK_NSTATES ? RANK_STATES[s] : "?";
}

int coord_rank_holds(coord_rank_state_t s)
{
    return s >= COORD_RANK_PENDING && s <= COORD_RANK_FAILING;
}

static int rank_started(coord_rank_state_t s)
{
    return s == COORD_RANK_RUNNING || s == COORD_RANK_DONE;
}

void coord_rank_set_state(coord_t *c, coord_job_t *j, uint32_t rank, coord_rank_state_t to,
                          const char *why)
{
    coord_rank_t *r = &j->ranks[rank];
    coord_rank_state_t from = r->state;
    if (from == to)
        return;
    r->state = to;
    j->hang_scan_ms = 0; /* a rank joined or left the step-timeout watch: scan again */
    int held = coord_rank_holds(from), holds = coord_rank_holds(to);
    if (holds && !held) {
        r->node->used++;
    } else if (held && !holds) {
        if (r->node->used > 0)
            r->node->used--;
        coord_changed(c); /* a slot came free */
    }
    if (rank_started(to) &&
        (from == COORD_RANK_NEW || from == COORD_RANK_PENDING || from == COORD_RANK_UNKNOWN))
        j->n_started++;
    if (to == COORD_RANK_PENDING || from == COORD_RANK_UNKNOWN)
        r->progress_ms = ch_now_ms(); /* step_timeout counts from here */
    ch_log(to == COORD_RANK_FAILED || to == COORD_RANK_LOST || to == COORD_RANK_FAILING
               ? CH_LOG_INFO
               : CH_LOG_DEBUG,
           "job", "job=%s gen=%" PRIu64 " rank=%u node=%s state %s->%s%s%s", j->id, j->generation,
           rank, r->node->name, coord_rank_state_name(from), coord_rank_state_name(to),
           why ? ": " : "", why ? why : "");
}

int coord_job_is_active(const coord_job_t *j)
{
    return j->state == COORD_JOB_STARTING || j->state == COORD_JOB_RUNNING ||
           j->state == COORD_JOB_RECOVERING;
}

coord_job_t *coord_job_find_id(coord_t *c, const char *id)
{
    /* Ids are "j<seq>" and jobs are appended in seq order: binary search. */
    char *end = NULL;
    if (!id || id[0] != 'j' || id[1] == 0)
        return NULL;
    long long seq = strtoll(id + 1, &end, 10);
    if (*end != 0)
        return NULL;
    size_t lo = 0, hi = c->jobs.n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (c->jobs.v[mid]->seq < seq)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < c->jobs.n && c->jobs.v[lo]->seq == seq ? c->jobs.v[lo] : NULL;
}

coord_job_t *coord_job_find(coord_t *c, const char *id_or_name)
{
    coord_job_t *j = coord_job_find_id(c, id_or_name);
    if (j)
        return j;
    for (size_t i = c->jobs.n; i-- > 0;)
        if (strcmp(c->jobs.v[i]->name, id_or_name) == 0)
            return c->jobs.v[i];
    return NULL;
}

// ---------------------------------------------------------------------------------------
// Storing and state changes

int coord_job_store(coord_t *c, coord_job_t *j)
{
    coord_job_rec_t rec = {
        .seq = j->seq,
        .name = j->name,
        .kind = ch_job_kind_name(j->spec.kind),
        .ini = j->ini,
        .state = coord_job_state_name(j->state),
        .reason = j->reason,
        .placement = j->placement ? j->placement : "",
        .generation = j->generation,
        .restarts = j->restarts,
        .step = j->step,
        .total_steps = j->total_steps,
        .loss = j->loss,
        .last_ckpt_step = j->last_ckpt_step,
        .submitted_ms = j->submitted_ms,
        .started_ms = j->started_ms,
        .finished_ms = j->finished_ms,
    };
    return coord_store_job_update(c->store, &rec);
}

void coord_job_set_state(coord_t *c, coord_job_t *j, coord_job_state_t to, const char *reason)
{
    char what[640];
    coord_job_state_t from = j->state;
    j->state = to;
    if (reason)
        snprintf(j->reason, sizeof(j->reason), "%s", reason);
    if (to >= COORD_JOB_COMPLETED)
        j->finished_ms = ch_wall_ms();
    snprintf(what, sizeof(what), "state %s->%s%s%s", coord_job_state_name(from),
             coord_job_state_name(to), reason ? ": " : "", reason ? reason : "");
    ch_log(to == COORD_JOB_FAILED ? CH_LOG_WARN : CH_LOG_INFO, "job", "job=%s gen=%" PRIu64 " %s",
           j->id, j->generation, what);
    coord_job_store(c, j); /* a failure is logged by the store; memory stays authoritative */
    coord_event(c, j->id, j->generation, -1, NULL, what);
    coord_changed(c);
}

int coord_job_send_kill(coord_node_t *n, const char *job, uint64_t gen, const uint32_t *rank,
                        const char *reason)
{
    Chorus__KillRanks kr = CHORUS__KILL_RANKS__INIT;
    Chorus__Envelope env = CHORUS__ENVELOPE__INIT;
    kr.job_id = (char *)job;
    kr.generation = gen;
    kr.reason = (char *)reason;
    kr.n_ranks = rank ? 1 : 0;
    kr.ranks = (uint32_t *)rank;
    env.body_case = CHORUS__ENVELOPE__BODY_KILL_RANKS;
    env.kill_ranks = &kr;
    return coord_node_send(n, &env);
}

void coord_job_kill_gen(coord_t *c, coord_job_t *j, const char *reason)
{
    uint64_t stamp = ++c->stamp;

    for (uint32_t r = 0; j->ranks && r < j->world; r++) {
        coord_node_t *n = j->ranks[r].node;
        if (!coord_rank_holds(j->ranks[r].state) || n->mark == stamp)
            continue;
        n->mark = stamp;
        int rc = coord_job_send_kill(n, j->id, j->generation, NULL, reason);
        CH_LOGD("job", "job=%s gen=%" PRIu64 " node=%s kill ranks: %s", j->id, j->generation,
                n->name, rc < 0 ? ch_strerror(rc) : "sent");
    }
}

/* The generation ended: its rendezvous keys go. */
static void end_generation(coord_t *c, coord_job_t *j)
{
    if (j->generation > 0)
        coord_kv_drop_gen(c->kv, j->id, j->generation);
}

void coord_job_fail(coord_t *c, coord_job_t *j, const char *reason)
{
    if (!coord_job_is_active(j))
        return;
    j->grace_deadline = 0;
    coord_job_kill_gen(c, j, reason);
    end_generation(c, j);
    coord_job_set_state(c, j, COORD_JOB_FAILED, reason);
}

int coord_job_cancel(coord_t *c, coord_job_t *j, char *err, size_t errlen)
{
    if (j->state >= COORD_JOB_COMPLETED) {
        snprintf(err, errlen, "job %s already %s", j->id, coord_job_state_name(j->state));
        return CH_E_STATE;
    }
    if (coord_job_is_active(j)) {
        coord_job_kill_gen(c, j, "cancelled");
        end_generation(c, j);
    }
    j->grace_deadline = 0;
    coord_job_set_state(c, j, COORD_JOB_CANCELLED, "cancelled by user");
    coord_store_commit(c->store); /* before the reply; a failure is logged by the store */
    return 0;
}

int coord_job_kill_rank(coord_t *c, coord_job_t *j, uint32_t rank, char *err, size_t errlen)
{
    if (!coord_job_is_active(j) || !j->ranks) {
        snprintf(err, errlen, "job %s is %s: no rank process to kill", j->id,
                 coord_job_state_name(j->state));
        return CH_E_STATE;
    }
    if (rank >= j->world) {
        snprintf(err, errlen, "job %s has ranks 0..%u, not %u", j->id, j->world - 1, rank);
        return -EINVAL;
    }
    coord_rank_t *r = &j->ranks[rank];
    if (!coord_rank_holds(r->state)) {
        snprintf(err, errlen, "job %s rank %u is not running", j->id, rank);
        return CH_E_STATE;
    }
    int rc = coord_job_send_kill(r->node, j->id, j->generation, &rank, "kill-rank (fault drill)");
    if (rc < 0) {
        snprintf(err, errlen, "node %s: %s", r->node->name, ch_strerror(rc));
        return rc;
    }
    CH_LOGI("job", "job=%s gen=%" PRIu64 " rank=%u node=%s kill-rank sent", j->id, j->generation,
            rank, r->node->name);
    return 0;
}

// ---------------------------------------------------------------------------------------
// Submission and start

static int jobs_reserve(coord_t *c)
{
    if (c->jobs.n < c->jobs.cap)
        return 0;
    size_t cap = c->jobs.cap ? c->jobs.cap * 2 : 16;
    coord_job_t **v = realloc(c->jobs.v, cap * sizeof(*v));
    if (!v)
        return -ENOMEM;
    c->jobs.v = v;
    c->jobs.cap = cap;
    return 0;
}

static void job_free(coord_job_t *j)
{
    if (!j)
        return;
    coord_straggler_free(j);
    free(j->history);
    coord_ranks_free(j->ranks, j->world);
    free(j->by_node);
    free(j->placement);
    free(j->ini);
    free(j);
}

int coord_job_submit(coord_t *c, const char *ini, char *id, size_t idlen, char *err, size_t errlen)
{
    coord_job_t *j = NULL;
    int64_t seq = 0;
    int rc;

    j = calloc(1, sizeof(*j));
    if (!j || jobs_reserve(c) < 0) {
        snprintf(err, errlen, "out of memory");
        rc = -ENOMEM;
        goto fail;
    }
    ch_jobspec_defaults(&j->spec);
    CH_CHECK_GOTO(ch_jobspec_parse(ini, &j->spec, err, errlen), rc, fail);
    CH_CHECK_GOTO(ch_jobspec_validate(&j->spec, 0, err, errlen), rc, fail);
    CH_CHECK_GOTO(coord_sched_admit(c, &j->spec, err, errlen), rc, fail);
    rc = ch_jobspec_format(&j->spec, &j->ini);
    if (rc < 0) {
        snprintf(err, errlen, "cannot format the job file: %s", ch_strerror(rc));
        goto fail;
    }
    j->world = ch_layout_world(ch_jobspec_layout(&j->spec));
    j->state = COORD_JOB_QUEUED;
    j->last_ckpt_step = -1;
    j->total_steps = j->spec.train.steps > 0 ? (uint64_t)j->spec.train.steps : 0;
    j->submitted_ms = ch_wall_ms();
    snprintf(j->name, sizeof(j->name), "%s", j->spec.name);

    coord_job_rec_t rec = {
        .name = j->name,
        .kind = ch_job_kind_name(j->spec.kind),
        .ini = j->ini,
        .state = coord_job_state_name(j->state),
        .reason = "",
        .placement = "",
        .total_steps = j->total_steps,
        .last_ckpt_step = -1,
        .submitted_ms = j->submitted_ms,
    };
    rc = coord_store_job_insert(c->store, &rec, &seq);
    if (rc == 0) /* the job id goes back in the reply: it must be on disk first */
        rc = coord_store_commit(c->store);
    if (rc < 0) {
        snprintf(err, errlen, "cannot store the job: %s", ch_strerror(rc));
        goto fail;
    }
    j->seq = seq;
    snprintf(j->id, sizeof(j->id), "j%" PRId64, seq);
    if (j->name[0] == 0)
        snprintf(j->name, sizeof(j->name), "%s", j->id);
    c->jobs.v[c->jobs.n++] = j;
    snprintf(id, idlen, "%s", j->id);
    CH_LOGI("job", "job=%s name=%s submitted: %s, world %u (tp %u x pp %u x dp %u)", j->id, j->name,
            ch_job_kind_name(j->spec.kind), j->world, j->spec.parallel.tp, j->spec.parallel.pp,
            j->spec.parallel.dp);
    coord_event(c, j->id, 0, -1, NULL, "submitted");
    coord_changed(c);
    return 0;
fail:
    job_free(j);
    return rc;
}

int coord_job_relayout(coord_t *c, coord_job_t *j, const ch_jobspec_t *spec)
{
    char *ini = NULL;
    for (uint32_t r = 0; j->ranks && r < j->world; r++)
        if (coord_rank_holds(j->ranks[r].state))
            return CH_E_STATE;
    int rc = ch_jobspec_format(spec, &ini);
    if (rc < 0)
        return rc;
    free(j->ini);
    j->ini = ini;
    j->spec = *spec;
    coord_ranks_free(j->ranks, j->world); /* the old generation's, every one gone */
    j->ranks = NULL;
    j->time_stamp++;
    free(j->by_node);
    j->by_node = NULL;
    free(j->placement);
    j->placement = NULL;
    j->world = ch_layout_world(ch_jobspec_layout(spec));
    coord_job_store(c, j); /* a failure is logged by the store; memory stays authoritative */
    coord_changed(c);
    return 0;
}

// ---------------------------------------------------------------------------------------
// Ranks by node

static int ref_cmp(const void *a, const void *b)
{
    const coord_rank_ref_t *x = a, *y = b;
    uintptr_t nx = (uintptr_t)x->node, ny = (uintptr_t)y->node;
    if (nx != ny)
        return nx < ny ? -1 : 1;
    return (x->rank > y->rank) - (x->rank < y->rank);
}

/* (Re)build j->by_node from j->ranks: O(world log world), once per placement. */
static void index_ranks(coord_job_t *j)
{
    free(j->by_node);
    j->by_node = j->ranks ? malloc((j->world ? j->world : 1) * sizeof(*j->by_node)) : NULL;
    if (!j->by_node)
        return; /* every rank is walked instead */
    for (uint32_t r = 0; r < j->world; r++)
        j->by_node[r] = (coord_rank_ref_t){j->ranks[r].node, r};
    qsort(j->by_node, j->world, sizeof(*j->by_node), ref_cmp);
}

void coord_job_ranks_on(const coord_job_t *j, const coord_node_t *n, size_t *lo, size_t *hi)
{
    *lo = 0;
    *hi = j->ranks ? j->world : 0;
    if (!j->by_node || !j->ranks)
        return;
    coord_rank_ref_t key = {n, 0};
    size_t a = 0, b = j->world;
    while (a < b) { /* first entry >= (n, 0) */
        size_t m = a + (b - a) / 2;
        if (ref_cmp(&j->by_node[m], &key) < 0)
            a = m + 1;
        else
            b = m;
    }
    *lo = a;
    while (b < j->world && j->by_node[b].node == n)
        b++;
    *hi = b;
}

uint32_t coord_job_rank_at(const coord_job_t *j, size_t k)
{
    return j->by_node ? j->by_node[k].rank : (uint32_t)k;
}

/* "node:local_rank,..." for the store. */
static char *placement_text(const coord_rank_t *ranks, uint32_t world)
{
    size_t cap = 1;
    for (uint32_t r = 0; r < world; r++)
        cap += strlen(ranks[r].node->name) + 12;
    char *s = malloc(cap), *p = s;
    if (!s)
        return NULL;
    *p = 0;
    for (uint32_t r = 0; r < world; r++)
        p += snprintf(p, cap - (size_t)(p - s), "%s%s:%u", r ? "," : "", ranks[r].node->name,
                      ranks[r].local_rank);
    return s;
}

/* StartRanks to every node of the placement (counting sort of ranks by node). */
static void send_start(coord_t *c, coord_job_t *j, const coord_place_rank_t *pl,
                       coord_node_t *const *nodes, size_t n_nodes)
{
    uint32_t *start = calloc(n_nodes + 1, sizeof(*start));
    uint32_t *order = malloc(j->world * sizeof(*order));
    Chorus__RankAssign *ra = malloc(j->world * sizeof(*ra));
    Chorus__RankAssign **rp = malloc(j->world * sizeof(*rp));
    if (!start || !order || !ra || !rp) {
        coord_job_fail(c, j, "out of memory sending StartRanks");
        goto out;
    }
    for (uint32_t r = 0; r < j->world; r++)
        start[pl[r].node + 1]++;
    for (size_t i = 0; i < n_nodes; i++)
        start[i + 1] += start[i];
    for (uint32_t r = 0, *fill = start; r < j->world; r++)
        order[fill[pl[r].node]++] = r; /* start[i] now ends node i's run */
    for (size_t i = 0, begin = 0; i < n_nodes; begin = start[i++]) {
        uint32_t count = start[i] - (uint32_t)begin;
        if (count == 0)
            continue;
        for (uint32_t k = 0; k < count; k++) {
            uint32_t r = order[begin + k];
            chorus__rank_assign__init(&ra[begin + k]);
            ra[begin + k].rank = r;
            ra[begin + k].local_rank = pl[r].local_rank;
            rp[begin + k] = &ra[begin + k];
        }
        Chorus__StartRanks sr = CHORUS__START_RANKS__INIT;
        Chorus__Envelope env = CHORUS__ENVELOPE__INIT;
        sr.job_id = j->id;
        sr.generation = j->generation;
        sr.job_ini = j->ini;
        sr.world_size = j->world;
        sr.n_ranks = count;
        sr.ranks = &rp[begin];
        sr.local_world_size = count;
        sr.resume_step = j->last_ckpt_step > 0 ? (uint64_t)j->last_ckpt_step : 0;
        sr.launch_token = coord_launch_token(c, j->id, j->generation, nodes[i]->name);
        env.body_case = CHORUS__ENVELOPE__BODY_START_RANKS;
        env.start_ranks = &sr;
        int rc = coord_node_send(nodes[i], &env);
        CH_LOGI("job", "job=%s gen=%" PRIu64 " node=%s start %u ranks (first rank=%u)%s%s", j->id,
                j->generation, nodes[i]->name, count, order[begin], rc < 0 ? ": " : "",
                rc < 0 ? ch_strerror(rc) : "");
    }
out:
    free(rp);
    free(ra);
    free(order);
    free(start);
}

int coord_job_start(coord_t *c, coord_job_t *j, const coord_place_rank_t *pl,
                    coord_node_t *const *nodes, size_t n_nodes)
{
    coord_rank_t *ranks = calloc(j->world, sizeof(*ranks));
    char *text = NULL;
    if (!ranks)
        return -ENOMEM;
    for (uint32_t r = 0; r < j->world; r++) {
        ranks[r].node = nodes[pl[r].node];
        ranks[r].local_rank = pl[r].local_rank;
        ranks[r].state = COORD_RANK_NEW;
        ranks[r].ckpt_step = -1;
    }
    text = placement_text(ranks, j->world);
    if (!text) {
        free(ranks);
        return -ENOMEM;
    }

    /* Journal first: the new generation, its placement and "starting" reach the disk
     * before any StartRanks leaves, so a restarted coordinator knows what may run. */
    coord_job_t saved = *j;
    j->generation++;
    j->state = COORD_JOB_STARTING;
    j->reason[0] = 0;
    j->placement = text;
    if (!j->started_ms)
        j->started_ms = ch_wall_ms();
    int rc = coord_job_store(c, j);
    if (rc < 0) {
        *j = saved;
        free(text);
        free(ranks);
        return rc;
    }
    free(saved.placement);
    coord_ranks_free(saved.ranks, saved.world);
    j->ranks = ranks;
    j->time_stamp++;
    j->by_node = NULL;
    free(saved.by_node);
    index_ranks(j);
    j->n_started = j->n_finished = 0;
    for (uint32_t r = 0; r < j->world; r++)
        coord_rank_set_state(c, j, r, COORD_RANK_PENDING, NULL);
    char what[96];
    snprintf(what, sizeof(what), "state %s->starting (world %u on %zu nodes)",
             coord_job_state_name(saved.state), j->world, n_nodes);
    CH_LOGI("job", "job=%s gen=%" PRIu64 " %s", j->id, j->generation, what);
    coord_event(c, j->id, j->generation, -1, NULL, what);
    if (saved.state == COORD_JOB_RECOVERING)
        coord_recovery_started(c, j);
    send_start(c, j, pl, nodes, n_nodes);
    coord_changed(c);
    return 0;
}

// ---------------------------------------------------------------------------------------
// Figures

void coord_ranks_free(coord_rank_t *ranks, uint32_t world)
{
    for (uint32_t r = 0; ranks && r < world; r++)
        free(ranks[r].metrics);
    free(ranks);
}

double coord_job_rank_metric(const coord_job_t *j, uint32_t rank, const char *name)
{
    if (!j->ranks || rank >= j->world)
        return NAN;
    const coord_rank_t *r = &j->ranks[rank];
    for (size_t k = 0; k < r->n_metrics; k++)
        if (strcmp(r->metrics[k].name, name) == 0)
            return r->metrics[k].value;
    return NAN;
}

double coord_job_bubble(const coord_job_t *j)
{
    coord_job_t *cache = (coord_job_t *)j; /* only the cached mean is written */
    if (j->bubble_stamp && j->bubble_stamp == j->time_stamp)
        return j->bubble_mean;
    double sum = 0;
    uint32_t n = 0;
    for (uint32_t r = 0; j->ranks && r < j->world; r++) {
        const coord_step_time_t *t = &j->ranks[r].time;
        if (!(t->step_s > 0))
            continue;
        sum += t->pp_wait > 0 ? t->pp_wait / t->step_s : t->bubble;
        n++;
    }
    cache->bubble_stamp = ++cache->time_stamp; /* never 0: 0 is "none cached" */
    cache->bubble_mean = n ? sum / n : -1.0;
    return cache->bubble_mean;
}

double coord_job_bubble_theory(const coord_job_t *j)
{
    double p = j->spec.parallel.pp, m = j->spec.parallel.microbatches;
    return p > 1 && m > 0 ? (p - 1) / (m + p - 1) : 0.0;
}

coord_rank_place_t coord_job_rank_place(const coord_job_t *j, uint32_t r)
{
    if (j->ranks && r < j->world && j->ranks[r].place.reported)
        return j->ranks[r].place;
    coord_rank_place_t p = {0};
    (void)ch_plan_place(&j->spec, r, &p.at); /* outside the layout: all zero */
    return p;
}

// ---------------------------------------------------------------------------------------
// Reload

/* Rebuild ranks from "node:local,..."; active jobs hold their slots again. */
static int load_placement(coord_t *c, coord_job_t *j, const char *text)
{
    uint32_t world = 1;
    for (const char *p = text; *p; p++)
        world += *p == ',';
    j->ranks = calloc(world, sizeof(*j->ranks));
    j->time_stamp++;
    if (!j->ranks)
        return -ENOMEM;
    j->world = world; /* at once: the job's end frees world ranks (coord_ranks_free) */
    j->placement = strdup(text);
    if (!j->placement)
        return -ENOMEM;
    const char *p = text;
    for (uint32_t r = 0; r < world; r++) {
        char name[64];
        const char *colon = strchr(p, ':');
        size_t len = colon ? (size_t)(colon - p) : 0;
        if (!colon || len == 0 || len >= sizeof(name))
            return CH_E_FORMAT;
        memcpy(name, p, len);
        name[len] = 0;
        coord_rank_t *rk = &j->ranks[r];
        rk->node = coord_node_get(c, name);
        if (!rk->node)
            return -ENOMEM;
        rk->local_rank = (uint32_t)strtoul(colon + 1, (char **)&p, 10);
        if (*p == ',')
            p++;
        rk->ckpt_step = -1;
        /* calloc: new. An ended job's ranks are gone; an active job's may still run. */
        coord_rank_set_state(
            c, j, r, coord_job_is_active(j) ? COORD_RANK_UNKNOWN : COORD_RANK_EXITED, "reloaded");
    }
    index_ranks(j);
    return 0;
}

/* A new job from its stored row: identity, state, job file and counters (no ranks, no
 * placement). NULL when out of memory. An unknown state is taken as failed and a job file
 * that no longer parses keeps the defaults, both logged at `level`. */
static coord_job_t *job_from_record(const coord_job_rec_t *rec, ch_log_level_t level)
{
    char err[256];
    coord_job_t *j = calloc(1, sizeof(*j));
    if (!j || !(j->ini = strdup(rec->ini))) {
        free(j);
        return NULL;
    }
    j->seq = rec->seq;
    snprintf(j->id, sizeof(j->id), "j%" PRId64, rec->seq);
    snprintf(j->name, sizeof(j->name), "%s", rec->name);
    snprintf(j->reason, sizeof(j->reason), "%s", rec->reason);
    if (state_parse(rec->state, &j->state) < 0) {
        ch_log(level, "job", "job=%s stored with unknown state \"%s\": marking it failed", j->id,
               rec->state);
        j->state = COORD_JOB_FAILED;
    }
    ch_jobspec_defaults(&j->spec);
    if (ch_jobspec_parse(j->ini, &j->spec, err, sizeof(err)) < 0)
        ch_log(level, "job", "job=%s stored job file no longer parses: %s", j->id, err);
    j->world = ch_layout_world(ch_jobspec_layout(&j->spec));
    j->generation = rec->generation;
    j->restarts = rec->restarts;
    j->step = rec->step;
    j->total_steps = rec->total_steps;
    j->loss = rec->loss;
    j->last_ckpt_step = rec->last_ckpt_step;
    j->submitted_ms = rec->submitted_ms;
    j->started_ms = rec->started_ms;
    j->finished_ms = rec->finished_ms;
    return j;
}

static int load_one(void *ud, const coord_job_rec_t *rec)
{
    coord_t *c = ud;
    coord_job_t *j = NULL;
    int rc;

    if (jobs_reserve(c) < 0 || !(j = job_from_record(rec, CH_LOG_ERROR)))
        return -ENOMEM;
    if (rec->placement[0] && (rc = load_placement(c, j, rec->placement)) < 0) {
        CH_LOGE("job", "job=%s bad stored placement: %s", j->id, ch_strerror(rc));
        job_free(j);
        return rc;
    }
    if (coord_job_is_active(j))
        j->grace_deadline = ch_now_ms() + (uint64_t)c->cfg.grace_ms;
    c->jobs.v[c->jobs.n++] = j;
    return 0;
}

int coord_jobs_load(coord_t *c)
{
    int rc = coord_store_load_jobs(c->store, load_one, c);
    coord_jobs_trim(c);
    size_t waiting = 0;
    for (size_t i = 0; i < c->jobs.n; i++)
        waiting += c->jobs.v[i]->grace_deadline != 0;
    if (rc == 0 && c->jobs.n)
        CH_LOGI("job", "reloaded %zu jobs; %zu to re-adopt within %ld ms", c->jobs.n, waiting,
                c->cfg.grace_ms);
    return rc;
}

void coord_jobs_fini(coord_t *c)
{
    for (size_t i = 0; i < c->jobs.n; i++)
        job_free(c->jobs.v[i]);
    free(c->jobs.v);
    memset(&c->jobs, 0, sizeof(c->jobs));
}

void coord_jobs_count(const coord_t *c, size_t *counts)
{
    for (int s = 0; s < COORD_JOB_NSTATES; s++)
        counts[s] = 0;
    for (size_t i = 0; i < c->jobs.n; i++)
        counts[c->jobs.v[i]->state]++;
}

// ---------------------------------------------------------------------------------------
// Letting ended jobs go

static int job_ended(const coord_job_t *j)
{
    return j->state == COORD_JOB_COMPLETED || j->state == COORD_JOB_FAILED ||
           j->state == COORD_JOB_CANCELLED;
}

/* Ended, and no rank still holds a slot (a failed job's ranks may not have exited yet). */
static int job_releasable(const coord_job_t *j)
{
    if (!job_ended(j))
        return 0;
    for (uint32_t r = 0; j->ranks && r < j->world; r++)
        if (coord_rank_holds(j->ranks[r].state))
            return 0;
    return 1;
}

void coord_jobs_trim(coord_t *c)
{
    size_t keep =
        c->cfg.keep_ended_jobs > 0 ? (size_t)c->cfg.keep_ended_jobs : COORD_JOBS_KEEP_ENDED;
    size_t ended = 0, out = 0;
    for (size_t i = 0; i < c->jobs.n; i++)
        ended += job_ended(c->jobs.v[i]);
    if (ended <= keep)
        return;
    size_t drop = ended - keep;
    for (size_t i = 0; i < c->jobs.n; i++) { /* oldest first; the order stays */
        coord_job_t *j = c->jobs.v[i];
        if (drop > 0 && job_releasable(j)) {
            drop--;
            job_free(j);
            continue;
        }
        c->jobs.v[out++] = j;
    }
    CH_LOGD("job", "let %zu ended jobs go (kept in the store); %zu in memory", c->jobs.n - out,
            out);
    c->jobs.n = out;
}

void coord_job_free(coord_job_t *j)
{
    job_free(j);
}

static int load_detached(void *ud, const coord_job_rec_t *rec)
{
    coord_job_t **out = ud;
    coord_job_t *j = job_from_record(rec, CH_LOG_DEBUG);
    if (!j)
        return -ENOMEM;
    *out = j;
    return 0;
}

int coord_job_load(coord_t *c, const char *id_or_name, coord_job_t **out)
{
    *out = NULL;
    return coord_store_find_job(c->store, id_or_name, load_detached, out);
}
