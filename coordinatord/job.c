/* Jobs: submission, start, rank events, failure, cancel, re-adoption; see job.h. */
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

/* Progress is stored at most this often (the step is informational; state changes are
 * always stored at once). */
#define PROGRESS_STORE_MS 1000

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

static coord_job_t *find_id(coord_t *c, const char *id)
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
    coord_job_t *j = find_id(c, id_or_name);
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

void coord_job_kill_gen(coord_t *c, coord_job_t *j, const char *reason)
{
    Chorus__KillRanks kr = CHORUS__KILL_RANKS__INIT;
    Chorus__Envelope env = CHORUS__ENVELOPE__INIT;
    uint64_t stamp = ++c->stamp;

    kr.job_id = j->id;
    kr.generation = j->generation;
    kr.reason = (char *)reason;
    env.body_case = CHORUS__ENVELOPE__BODY_KILL_RANKS;
    env.kill_ranks = &kr;
    for (uint32_t r = 0; j->ranks && r < j->world; r++) {
        coord_node_t *n = j->ranks[r].node;
        if (!coord_rank_holds(j->ranks[r].state) || n->mark == stamp)
            continue;
        n->mark = stamp;
        int rc = coord_node_send(n, &env);
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
    Chorus__KillRanks kr = CHORUS__KILL_RANKS__INIT;
    Chorus__Envelope env = CHORUS__ENVELOPE__INIT;
    kr.job_id = j->id;
    kr.generation = j->generation;
    kr.reason = "kill-rank (fault drill)";
    kr.n_ranks = 1;
    kr.ranks = &rank;
    env.body_case = CHORUS__ENVELOPE__BODY_KILL_RANKS;
    env.kill_ranks = &kr;
    int rc = coord_node_send(r->node, &env);
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
    free(j->ranks);
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
    free(j->ranks); /* the old generation's, every one gone */
    j->ranks = NULL;
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

/* j's ranks on n, lowest first: by_node[*lo .. *hi), or with no index every rank
 * (*lo = 0, *hi = world; the caller checks the node). */
static void ranks_on(const coord_job_t *j, const coord_node_t *n, size_t *lo, size_t *hi)
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

/* The k-th rank of ranks_on's range. */
static uint32_t rank_at(const coord_job_t *j, size_t k)
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
    free(saved.ranks);
    j->ranks = ranks;
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
// Rank events

static void mark_started(coord_t *c, coord_job_t *j, uint32_t rank)
{
    coord_rank_t *r = &j->ranks[rank];
    if (r->state != COORD_RANK_PENDING && r->state != COORD_RANK_UNKNOWN)
        return;
    coord_rank_set_state(c, j, rank, COORD_RANK_RUNNING, NULL);
    if (j->n_started == j->world && j->grace_deadline) {
        CH_LOGI("job", "job=%s gen=%" PRIu64 " re-adopted all %u ranks", j->id, j->generation,
                j->world);
        j->grace_deadline = 0;
    }
    if (j->n_started == j->world && j->state == COORD_JOB_STARTING)
        coord_job_set_state(c, j, COORD_JOB_RUNNING, NULL);
}

static void copy_metrics(const coord_job_t *j, coord_rank_t *r, uint32_t rank,
                         const Chorus__RankEvent *ev)
{
    for (size_t i = 0; i < ev->n_metrics; i++) {
        const Chorus__Metric *m = ev->metrics[i];
        if (!m->name || !*m->name)
            continue;
        size_t k = 0;
        while (k < r->n_metrics && strcmp(r->metrics[k].name, m->name) != 0)
            k++;
        if (k == r->n_metrics) {
            if (k == COORD_RANK_METRICS) {
                CH_LOGW("job", "job=%s gen=%" PRIu64 " rank=%u metric %s dropped: a rank keeps %d",
                        j->id, j->generation, rank, m->name, COORD_RANK_METRICS);
                continue;
            }
            snprintf(r->metrics[k].name, sizeof(r->metrics[k].name), "%s", m->name);
            r->n_metrics++;
        }
        r->metrics[k].value = m->value;
    }
}

/* RANK_STARTED of a training rank: its place in the layout, as it computed it. */
static void on_started(coord_job_t *j, uint32_t rank, const Chorus__RankEvent *ev)
{
    if (!ev->placed)
        return;
    coord_rank_place_t *p = &j->ranks[rank].place;
    *p = (coord_rank_place_t){.tp = ev->coord_tp,
                              .pp = ev->coord_pp,
                              .dp = ev->coord_dp,
                              .first_block = ev->first_block,
                              .blocks = ev->blocks,
                              .shards = ev->shards,
                              .owned_params = ev->owned_params,
                              .reported = 1};
    p->reported = 0;
    coord_rank_place_t want = coord_job_rank_place(j, rank); /* from the layout */
    p->reported = 1;
    if (want.tp != p->tp || want.pp != p->pp || want.dp != p->dp ||
        want.first_block != p->first_block || want.blocks != p->blocks)
        CH_LOGW("job",
                "job=%s gen=%" PRIu64 " rank=%u reports tp %u pp %u dp %u blocks %u+%u, the "
                "layout says tp %u pp %u dp %u blocks %u+%u",
                j->id, j->generation, rank, p->tp, p->pp, p->dp, p->first_block, p->blocks, want.tp,
                want.pp, want.dp, want.first_block, want.blocks);
}

/* The latest step's time breakdown: one rank's figures replace its previous ones. */
static void store_step_time(coord_rank_t *r, const Chorus__RankEvent *ev)
{
    if (!(ev->step_s > 0))
        return;
    r->time = (coord_step_time_t){.step_s = ev->step_s,
                                  .compute = ev->t_compute,
                                  .tp = ev->t_tp,
                                  .pp_wait = ev->t_pp_wait,
                                  .zero = ev->t_zero,
                                  .optim = ev->t_optim,
                                  .idle = ev->t_idle,
                                  .bubble = ev->bubble};
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
    double sum = 0;
    uint32_t n = 0;
    for (uint32_t r = 0; j->ranks && r < j->world; r++) {
        const coord_step_time_t *t = &j->ranks[r].time;
        if (!(t->step_s > 0))
            continue;
        sum += t->pp_wait > 0 ? t->pp_wait / t->step_s : t->bubble;
        n++;
    }
    return n ? sum / n : -1.0;
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
    const ch_jobspec_t *s = &j->spec;
    ch_layout_t l = ch_jobspec_layout(s);
    coord_rank_place_t p = {0};
    if (r >= ch_layout_world(l))
        return p;
    ch_coord_t c = ch_layout_coord(l, r);
    p.tp = c.tp;
    p.pp = c.pp;
    p.dp = c.dp;
    p.shards = l.dp;
    ch_model_cfg_t m = ch_plan_model_of(s);
    ch_layout_stage_blocks(s->model.layers, l.pp, c.pp, ch_plan_head_blocks(&m), &p.first_block,
                           &p.blocks);
    ch_plan_t plan;
    if (s->kind == CH_JOB_TRAIN &&
        ch_plan_stage(&m, l, s->parallel.micro_batch_size, s->parallel.microbatches,
                      s->parallel.reshard, c.pp, &plan) == 0)
        p.owned_params = (uint64_t)plan.owned;
    return p;
}

static void on_progress(coord_t *c, coord_job_t *j, uint32_t rank, const Chorus__RankEvent *ev)
{
    coord_rank_t *r = &j->ranks[rank];
    if (j->state == COORD_JOB_RECOVERING)
        return; /* the failed generation's last words */
    r->step = ev->step;
    r->progress_ms = ch_now_ms();
    copy_metrics(j, r, rank, ev);
    store_step_time(r, ev);
    coord_straggler_step(c, j, rank);
    coord_series_progress(c, j, rank, ev);
    if (ev->step > j->step)
        j->step = ev->step;
    if (ev->total_steps)
        j->total_steps = ev->total_steps;
    if (rank == 0) { /* rank 0 reports the job-level figures */
        j->loss = ev->loss;
        j->tokens_per_s = ev->tokens_per_s;
        j->mfu = ev->mfu;
        uint64_t now = ch_now_ms();
        if (now - j->progress_stored_ms >= PROGRESS_STORE_MS) {
            j->progress_stored_ms = now;
            coord_job_store(c, j);
        }
    }
    CH_LOGD("job", "job=%s gen=%" PRIu64 " rank=%u step=%" PRIu64 " loss=%.4f", j->id,
            j->generation, rank, ev->step, ev->loss);
    coord_recovery_progress(c, j);
}

/* A rank reports checkpoint step s only after eng_trainer_checkpoint returned, and that
 * returns on every rank only once rank 0 has written manifest.json, which it writes after
 * gathering every rank's shard size and checksum (DESIGN §8). So one report proves the
 * whole step is on disk: the step is committed at the first report of it. Waiting for
 * every rank's report lost committed steps when a node died while the coordinator was
 * down (its queued reports died with it, and recovery went back a whole interval). */
static void on_checkpoint(coord_t *c, coord_job_t *j, coord_rank_t *r, const Chorus__RankEvent *ev)
{
    int64_t s = (int64_t)ev->step;
    r->progress_ms = ch_now_ms(); /* writing it was work too */
    if (s <= r->ckpt_step)
        return;
    r->ckpt_step = s;
    if (s > j->last_ckpt_step) {
        char what[96];
        j->last_ckpt_step = s;
        snprintf(what, sizeof(what), "checkpoint step %" PRId64 " committed", j->last_ckpt_step);
        CH_LOGI("job", "job=%s gen=%" PRIu64 " %s", j->id, j->generation, what);
        coord_job_store(c, j);
        coord_event(c, j->id, j->generation, -1, NULL, what);
    }
}

/* Every rank finished its work: completed, unless the loss it ended with is not a number
 * (fault.nonfinite = skip dropped the last updates): a job never completes so. */
static void job_finished(coord_t *c, coord_job_t *j)
{
    char why[160];
    if (j->spec.kind != CH_JOB_TRAIN || isfinite(j->loss)) {
        coord_job_set_state(c, j, COORD_JOB_COMPLETED, NULL);
        return;
    }
    snprintf(why, sizeof why, "ended with a non-finite loss (%g) at step %" PRIu64, j->loss,
             j->step);
    coord_job_fail(c, j, why);
}

static void on_exited(coord_t *c, coord_job_t *j, uint32_t rank, const Chorus__RankEvent *ev)
{
    coord_rank_t *r = &j->ranks[rank];
    char reason[256];
    if (!coord_rank_holds(r->state))
        return;
    r->exit_code = ev->exit_code;
    r->signal = ev->signal;
    int clean = ev->signal == 0 && ev->exit_code == 0;
    int done = r->state == COORD_RANK_DONE;
    coord_rank_set_state(c, j, rank, clean && done ? COORD_RANK_EXITED : COORD_RANK_FAILED,
                         "exited");
    CH_LOGI("job", "job=%s gen=%" PRIu64 " rank=%u node=%s exited (code %d, signal %d)", j->id,
            j->generation, rank, r->node->name, ev->exit_code, ev->signal);
    if (!coord_job_is_active(j))
        return;
    if (clean && done && j->state != COORD_JOB_RECOVERING) {
        if (++j->n_finished == j->world)
            job_finished(c, j);
        return;
    }
    if (ev->signal)
        snprintf(reason, sizeof(reason), "rank %u on node %s killed by signal %d", rank,
                 r->node->name, ev->signal);
    else if (ev->exit_code)
        snprintf(reason, sizeof(reason), "rank %u on node %s exited with code %d", rank,
                 r->node->name, ev->exit_code);
    else
        snprintf(reason, sizeof(reason), "rank %u on node %s exited before finishing its work",
                 rank, r->node->name);
    coord_recovery_failure(c, j, COORD_CAUSE_RANK_EXIT, rank, r->node->name, reason);
}

/* Tell the worker it may forget a rank's final report (it keeps it until then). */
static void ack_exit(coord_node_t *n, const char *job, uint64_t gen, uint32_t rank)
{
    Chorus__RankExitAck ack = CHORUS__RANK_EXIT_ACK__INIT;
    Chorus__Envelope env = CHORUS__ENVELOPE__INIT;
    ack.job_id = (char *)job;
    ack.generation = gen;
    ack.rank = rank;
    env.body_case = CHORUS__ENVELOPE__BODY_RANK_EXIT_ACK;
    env.rank_exit_ack = &ack;
    coord_node_send(n, &env);
}

/* A rank of an older generation spoke: it should not be alive. */
static void kill_stale(coord_node_t *n, const char *job, uint64_t gen, uint32_t rank)
{
    Chorus__KillRanks kr = CHORUS__KILL_RANKS__INIT;
    Chorus__Envelope env = CHORUS__ENVELOPE__INIT;
    kr.job_id = (char *)job;
    kr.generation = gen;
    kr.reason = "a rank of an older generation";
    kr.n_ranks = 1;
    kr.ranks = &rank;
    env.body_case = CHORUS__ENVELOPE__BODY_KILL_RANKS;
    env.kill_ranks = &kr;
    CH_LOGI("job", "job=%s gen=%" PRIu64 " rank=%u node=%s stale rank alive: killing it", job, gen,
            rank, n->name);
    coord_node_send(n, &env);
}

void coord_job_rank_event(coord_t *c, coord_node_t *from, const Chorus__RankEvent *ev)
{
    coord_job_t *j = find_id(c, ev->job_id);
    int exited = ev->kind == CHORUS__RANK_EVENT_KIND__RANK_EXITED;
    if (exited) /* acknowledged once seen, whatever becomes of it: it is never sent again */
        ack_exit(from, ev->job_id, ev->generation, ev->rank);
    if (!j || !j->ranks) {
        CH_LOGD("job", "job=%s node=%s event for an unknown job dropped", ev->job_id, from->name);
        return;
    }
    if (ev->generation != j->generation) { /* fencing */
        CH_LOGD("job",
                "job=%s gen=%" PRIu64 " rank=%u node=%s stale event dropped (current gen %" PRIu64
                ")",
                j->id, ev->generation, ev->rank, from->name, j->generation);
        if (ev->generation < j->generation && !exited)
            kill_stale(from, j->id, ev->generation, ev->rank);
        return;
    }
    if (ev->rank >= j->world || j->ranks[ev->rank].node != from) {
        CH_LOGW("job",
                "job=%s gen=%" PRIu64 " rank=%u node=%s event for a rank not placed there dropped",
                j->id, ev->generation, ev->rank, from->name);
        return;
    }
    coord_rank_t *r = &j->ranks[ev->rank];
    if (r->state == COORD_RANK_LOST)
        return;
    switch (ev->kind) {
    case CHORUS__RANK_EVENT_KIND__RANK_STARTED:
        CH_LOGD("job", "job=%s gen=%" PRIu64 " rank=%u node=%s started", j->id, j->generation,
                ev->rank, from->name);
        on_started(j, ev->rank, ev);
        mark_started(c, j, ev->rank);
        break;
    case CHORUS__RANK_EVENT_KIND__RANK_PROGRESS:
        mark_started(c, j, ev->rank);
        on_progress(c, j, ev->rank, ev);
        break;
    case CHORUS__RANK_EVENT_KIND__RANK_CHECKPOINT:
        on_checkpoint(c, j, r, ev);
        break;
    case CHORUS__RANK_EVENT_KIND__RANK_DONE:
        mark_started(c, j, ev->rank);
        if (r->state == COORD_RANK_RUNNING)
            coord_rank_set_state(c, j, ev->rank, COORD_RANK_DONE, NULL);
        if (ev->step)
            r->step = ev->step;
        copy_metrics(j, r, ev->rank, ev);
        CH_LOGD("job", "job=%s gen=%" PRIu64 " rank=%u node=%s done", j->id, j->generation,
                ev->rank, from->name);
        break;
    case CHORUS__RANK_EVENT_KIND__RANK_EXITED:
        on_exited(c, j, ev->rank, ev);
        break;
    case CHORUS__RANK_EVENT_KIND__RANK_FAILED: {
        char reason[400];
        if (coord_rank_holds(r->state))
            coord_rank_set_state(c, j, ev->rank, COORD_RANK_FAILING, "reported a failure");
        const char *msg = ev->message && *ev->message ? ev->message : "no reason given";
        coord_recovery_rank_failed(c, j, ev->rank, ev->cause_class, ev->before_first_step, msg);
        if (ev->timeout_group && *ev->timeout_group && ev->timeout_peer < j->world) {
            coord_recovery_timeout(c, j, ev->rank, ev);
            /* A collective timed out: the rank it waited for is the culprit. */
            const coord_rank_t *p = &j->ranks[ev->timeout_peer];
            snprintf(reason, sizeof(reason),
                     "collective timeout in group %s: rank %u on node %s waited for rank %u on "
                     "node %s (%s)",
                     ev->timeout_group, ev->rank, from->name, ev->timeout_peer, p->node->name, msg);
            coord_recovery_failure(c, j, COORD_CAUSE_COLLECTIVE, ev->timeout_peer, p->node->name,
                                   reason);
            break;
        }
        snprintf(reason, sizeof(reason), "rank %u on node %s failed: %s", ev->rank, from->name,
                 msg);
        coord_recovery_failure(c, j, COORD_CAUSE_RANK_FAILED, ev->rank, from->name, reason);
        break;
    }
    default:
        CH_LOGD("job", "job=%s rank=%u unknown event kind %d dropped", j->id, ev->rank, ev->kind);
        break;
    }
}

// ---------------------------------------------------------------------------------------
// Node events: death, re-registration, re-adoption deadline

void coord_job_node_dead(coord_t *c, coord_node_t *n, const char *why)
{
    char reason[256];
    snprintf(reason, sizeof(reason), "node %s dead: %s", n->name, why);
    for (size_t i = 0; i < c->jobs.n; i++) {
        coord_job_t *j = c->jobs.v[i];
        int64_t hit = -1;
        size_t lo, hi;
        ranks_on(j, n, &lo, &hi);
        for (size_t k = lo; k < hi; k++) {
            uint32_t r = rank_at(j, k);
            coord_rank_t *rk = &j->ranks[r];
            if (rk->node != n || !coord_rank_holds(rk->state))
                continue;
            coord_rank_set_state(c, j, r, COORD_RANK_LOST, reason);
            if (hit < 0)
                hit = r;
        }
        if (hit >= 0)
            coord_recovery_failure(c, j, COORD_CAUSE_NODE_LOST, hit, n->name, reason);
    }
}

static void kill_unknown(coord_node_t *n, const Chorus__RankRef *ref)
{
    Chorus__KillRanks kr = CHORUS__KILL_RANKS__INIT;
    Chorus__Envelope env = CHORUS__ENVELOPE__INIT;
    kr.job_id = ref->job_id;
    kr.generation = ref->generation;
    kr.reason = "not a current rank of the coordinator";
    env.body_case = CHORUS__ENVELOPE__BODY_KILL_RANKS;
    env.kill_ranks = &kr;
    CH_LOGI("job", "job=%s gen=%" PRIu64 " rank=%u node=%s not current: killing it", ref->job_id,
            ref->generation, ref->rank, n->name);
    coord_node_send(n, &env);
}

/* A rank n reported as running or finished at registration: 1 when it is a current rank
 * of an active job placed there (and still holding its slot). */
static coord_job_t *placed_here(coord_t *c, coord_node_t *n, const Chorus__RankRef *ref)
{
    coord_job_t *j = find_id(c, ref->job_id);
    if (j && j->ranks && ref->generation == j->generation && ref->rank < j->world &&
        j->ranks[ref->rank].node == n && coord_rank_holds(j->ranks[ref->rank].state) &&
        coord_job_is_active(j))
        return j;
    return NULL;
}

/* A rank that finished while we could not hear it (a coordinator restart, a lost link):
 * apply its final report as if it had arrived then. */
static void apply_finished(coord_t *c, coord_node_t *n, const Chorus__RankRef *ref)
{
    coord_job_t *j = placed_here(c, n, ref);
    ack_exit(n, ref->job_id, ref->generation, ref->rank);
    if (!j)
        return;
    Chorus__RankEvent ev = CHORUS__RANK_EVENT__INIT;
    ev.job_id = ref->job_id;
    ev.generation = ref->generation;
    ev.rank = ref->rank;
    CH_LOGI("job", "job=%s gen=%" PRIu64 " rank=%u node=%s final report resent (%s, code %d)",
            j->id, j->generation, ref->rank, n->name, ref->done ? "done" : "not done",
            ref->exit_code);
    if (ref->done) {
        mark_started(c, j, ref->rank);
        if (j->ranks[ref->rank].state == COORD_RANK_RUNNING)
            coord_rank_set_state(c, j, ref->rank, COORD_RANK_DONE, "final report resent");
    }
    ev.exit_code = ref->exit_code;
    ev.signal = ref->signal;
    on_exited(c, j, ref->rank, &ev);
}

void coord_job_node_registered(coord_t *c, coord_node_t *n, const Chorus__Register *reg)
{
    uint64_t stamp = ++c->stamp;
    size_t n_running = reg->n_running;
    Chorus__RankRef *const *running = reg->running;

    for (size_t i = 0; i < n_running; i++) {
        const Chorus__RankRef *ref = running[i];
        coord_job_t *j = placed_here(c, n, ref);
        if (j) {
            coord_rank_t *r = &j->ranks[ref->rank];
            r->seen = stamp;
            if (j->state == COORD_JOB_RECOVERING) {
                /* Its generation failed while this node was out of reach: it goes now,
                 * and holds its slot until its exit is reported. */
                kill_stale(n, j->id, j->generation, ref->rank);
                mark_started(c, j, ref->rank); /* known alive: not lost at the grace's end */
                continue;
            }
            if (r->state == COORD_RANK_UNKNOWN)
                CH_LOGI("job", "job=%s gen=%" PRIu64 " rank=%u node=%s re-adopted (pid %d)", j->id,
                        j->generation, ref->rank, n->name, ref->pid);
            mark_started(c, j, ref->rank);
            continue;
        }
        if (i == 0 || strcmp(ref->job_id, running[i - 1]->job_id) != 0 ||
            ref->generation != running[i - 1]->generation)
            kill_unknown(n, ref);
    }
    for (size_t i = 0; i < reg->n_finished; i++)
        apply_finished(c, n, reg->finished[i]);
    /* Ranks placed on n that it did not report are gone. */
    for (size_t i = 0; i < c->jobs.n; i++) {
        coord_job_t *j = c->jobs.v[i];
        int64_t lost = -1;
        size_t lo, hi;
        ranks_on(j, n, &lo, &hi);
        for (size_t k = lo; k < hi; k++) {
            uint32_t r = rank_at(j, k);
            coord_rank_t *rk = &j->ranks[r];
            if (rk->node != n || !coord_rank_holds(rk->state) || rk->seen == stamp)
                continue;
            coord_rank_set_state(c, j, r, COORD_RANK_LOST, "not re-reported by its node");
            if (lost < 0)
                lost = r;
        }
        if (lost >= 0 && coord_job_is_active(j)) {
            char reason[256];
            coord_cause_t cause = COORD_CAUSE_WORKER_RESTART;
            if (j->grace_deadline) {
                cause = COORD_CAUSE_COORD_RESTART;
                snprintf(reason, sizeof(reason),
                         "ranks lost while the coordinator was down (rank %" PRId64
                         " not re-reported by node %s)",
                         lost, n->name);
            } else {
                snprintf(reason, sizeof(reason),
                         "rank %" PRId64 " lost: node %s re-registered without it", lost, n->name);
            }
            coord_recovery_failure(c, j, cause, lost, n->name, reason);
        }
    }
}

void coord_job_check(coord_t *c, uint64_t now_ms)
{
    for (size_t i = 0; i < c->jobs.n; i++) {
        coord_job_t *j = c->jobs.v[i];
        if (j->grace_deadline && now_ms >= j->grace_deadline) {
            j->grace_deadline = 0;
            coord_changed(c); /* a recovering job may restart now */
            /* Nodes that did not come back within the grace: their ranks are gone. */
            int64_t lost = -1;
            for (uint32_t r = 0; j->ranks && r < j->world; r++) {
                if (j->ranks[r].state != COORD_RANK_UNKNOWN)
                    continue;
                coord_rank_set_state(c, j, r, COORD_RANK_LOST, "not re-reported within the grace");
                if (lost < 0)
                    lost = r;
            }
            if (lost >= 0 && coord_job_is_active(j)) {
                char reason[160];
                snprintf(reason, sizeof(reason),
                         "ranks lost while the coordinator was down (rank %" PRId64
                         " on node %s not re-reported)",
                         lost, j->ranks[lost].node->name);
                coord_recovery_failure(c, j, COORD_CAUSE_COORD_RESTART, lost,
                                       j->ranks[lost].node->name, reason);
            }
        }
        coord_recovery_check(c, j, now_ms);
    }
}

// ---------------------------------------------------------------------------------------
// Replies

static void restart_layout(Chorus__RestartLayout *out, const coord_layout_t *l)
{
    chorus__restart_layout__init(out);
    out->tp = l->tp;
    out->pp = l->pp;
    out->dp = l->dp;
    out->microbatches = l->microbatches;
    out->micro_batch_size = l->micro_batch_size;
}

coord_rank_view_t coord_job_view(const coord_job_t *j, const Chorus__JobQuery *q)
{
    coord_rank_view_t v = {.first = q->rank_first, .count = q->rank_limit, .metrics = q->metrics};
    int small = j->world <= COORD_STATUS_RANKS;
    if (q->all_ranks)
        v.count = UINT32_MAX;
    else if (q->rank_limit == 0)
        v.count = small ? UINT32_MAX : 0;
    v.metrics = v.metrics || small;
    return v;
}

/* Ranks per state (the states that have any), into ji. */
static int state_counts(const coord_job_t *j, Chorus__JobInfo *ji)
{
    uint32_t count[COORD_RANK_NSTATES] = {0};
    size_t n = 0;
    for (uint32_t r = 0; j->ranks && r < j->world; r++)
        count[j->ranks[r].state]++;
    for (int s = 0; s < COORD_RANK_NSTATES; s++)
        n += count[s] > 0;
    if (n == 0)
        return 0;
    /* One block: [RankStateCount* x n][RankStateCount x n]. */
    uint8_t *b = malloc(n * (sizeof(void *) + sizeof(Chorus__RankStateCount)));
    if (!b)
        return -ENOMEM;
    Chorus__RankStateCount **sp = (Chorus__RankStateCount **)b;
    Chorus__RankStateCount *sc = (Chorus__RankStateCount *)(sp + n);
    for (int s = 0, k = 0; s < COORD_RANK_NSTATES; s++) {
        if (count[s] == 0)
            continue;
        chorus__rank_state_count__init(&sc[k]);
        sc[k].state = (char *)coord_rank_state_name((coord_rank_state_t)s);
        sc[k].count = count[s];
        sp[k] = &sc[k];
        k++;
    }
    ji->n_rank_states = n;
    ji->rank_states = sp;
    return 0;
}

/* Distinct nodes of the placed generation: by_node is sorted by node. */
static uint32_t job_nodes(const coord_job_t *j)
{
    uint32_t n = 0;
    if (!j->ranks || !j->by_node)
        return 0;
    for (uint32_t i = 0; i < j->world; i++)
        n += i == 0 || j->by_node[i].node != j->by_node[i - 1].node;
    return n;
}

int coord_job_info(const coord_job_t *j, const coord_rank_view_t *view, Chorus__JobInfo *ji)
{
    chorus__job_info__init(ji);
    ji->id = (char *)j->id;
    ji->name = (char *)j->name;
    ji->kind = (char *)ch_job_kind_name(j->spec.kind);
    ji->state = (char *)coord_job_state_name(j->state);
    ji->step = j->step;
    ji->total_steps = j->total_steps;
    ji->loss = j->loss;
    ji->generation = j->generation;
    ji->restarts = j->restarts;
    ji->world_size = j->world;
    ji->tp = j->spec.parallel.tp;
    ji->pp = j->spec.parallel.pp;
    ji->dp = j->spec.parallel.dp;
    ji->last_checkpoint_step = j->last_ckpt_step;
    ji->tokens_per_s = j->tokens_per_s;
    ji->mfu = j->mfu;
    ji->reason = (char *)j->reason;
    ji->submitted_ms = j->submitted_ms;
    ji->started_ms = j->started_ms;
    ji->finished_ms = j->finished_ms;
    ji->microbatches = j->spec.parallel.microbatches;
    ji->bubble = coord_job_bubble(j);
    ji->bubble_theory = coord_job_bubble_theory(j);
    ji->val_loss = coord_job_rank_metric(j, 0, COORD_METRIC_VAL_LOSS);
    double vs = coord_job_rank_metric(j, 0, COORD_METRIC_VAL_STEP);
    ji->val_step = isfinite(vs) && vs > 0 ? (uint64_t)vs : 0;
    ji->straggler = (char *)coord_straggler_line(j, &ji->stragglers);
    ji->owner_uid = j->spec.owner.uid;
    ji->nodes = job_nodes(j);
    if (!view)
        return 0;
    ji->job_ini = j->ini;
    if (state_counts(j, ji) < 0)
        return -ENOMEM;
    if (j->n_history) {
        /* One block: [RestartInfo* x H][RestartInfo x H][RestartLayout x 2H]. */
        size_t h = j->n_history;
        uint8_t *hb = malloc(
            h * (sizeof(void *) + sizeof(Chorus__RestartInfo) + 2 * sizeof(Chorus__RestartLayout)));
        if (!hb) {
            coord_job_info_clear(ji);
            return -ENOMEM;
        }
        Chorus__RestartInfo **hp = (Chorus__RestartInfo **)hb;
        Chorus__RestartInfo *hi = (Chorus__RestartInfo *)(hp + h);
        Chorus__RestartLayout *hl = (Chorus__RestartLayout *)(hi + h);
        for (size_t i = 0; i < h; i++) {
            const coord_restart_t *e = &j->history[i];
            chorus__restart_info__init(&hi[i]);
            hi[i].time_ms = e->time_ms;
            hi[i].cause = (char *)coord_cause_name(e->cause);
            hi[i].rank = e->rank;
            hi[i].node = (char *)e->node;
            hi[i].reason = (char *)e->reason;
            hi[i].failed_generation = e->failed_gen;
            hi[i].failed_step = e->failed_step;
            hi[i].resumed_from = e->resumed_from;
            hi[i].steps_lost = e->steps_lost;
            hi[i].recover_s = e->recover_s;
            if (e->layout_to.dp) {
                restart_layout(&hl[2 * i], &e->layout_from);
                restart_layout(&hl[2 * i + 1], &e->layout_to);
                hi[i].layout_from = &hl[2 * i];
                hi[i].layout_to = &hl[2 * i + 1];
            }
            hp[i] = &hi[i];
        }
        ji->n_history = h;
        ji->history = hp;
    }
    if (!j->ranks)
        return 0;
    /* The ranks in view: [first, first + w). */
    size_t first = view->first < j->world ? view->first : j->world;
    size_t w = j->world - first, m = 0;
    if (view->count < w)
        w = view->count;
    ji->ranks_first = (uint32_t)first;
    ji->ranks_partial = w < j->world;
    if (w == 0)
        return 0;

    /* One block: [RankInfo* x W][RankInfo x W][RankPlace x W][StepTime x W]
     * [Metric* x M][Metric x M]. */
    for (size_t r = first; view->metrics && r < first + w; r++)
        m += j->ranks[r].n_metrics;
    uint8_t *block = malloc(w * (sizeof(void *) + sizeof(Chorus__RankInfo) +
                                 sizeof(Chorus__RankPlace) + sizeof(Chorus__StepTime)) +
                            m * (sizeof(void *) + sizeof(Chorus__Metric)));
    if (!block) {
        coord_job_info_clear(ji);
        return -ENOMEM;
    }
    Chorus__RankInfo **rp = (Chorus__RankInfo **)block;
    Chorus__RankInfo *ri = (Chorus__RankInfo *)(rp + w);
    Chorus__RankPlace *pi = (Chorus__RankPlace *)(ri + w);
    Chorus__StepTime *ti = (Chorus__StepTime *)(pi + w);
    Chorus__Metric **mp = (Chorus__Metric **)(ti + w);
    Chorus__Metric *mi = (Chorus__Metric *)(mp + m);
    int train = j->spec.kind == CH_JOB_TRAIN;
    for (size_t r = 0; r < w; r++) {
        const coord_rank_t *rk = &j->ranks[first + r];
        chorus__rank_info__init(&ri[r]);
        ri[r].rank = (uint32_t)(first + r);
        ri[r].node = (char *)rk->node->name;
        ri[r].state = (char *)coord_rank_state_name(rk->state);
        ri[r].step = rk->step;
        ri[r].exit_code = rk->exit_code;
        ri[r].signal = rk->signal;
        if (train) {
            coord_rank_place_t pl = coord_job_rank_place(j, (uint32_t)(first + r));
            chorus__rank_place__init(&pi[r]);
            pi[r].tp = pl.tp;
            pi[r].pp = pl.pp;
            pi[r].dp = pl.dp;
            pi[r].first_block = pl.first_block;
            pi[r].blocks = pl.blocks;
            pi[r].shards = pl.shards;
            pi[r].owned_params = pl.owned_params;
            pi[r].reported = pl.reported != 0;
            ri[r].place = &pi[r];
        }
        if (rk->time.step_s > 0) {
            const coord_step_time_t *t = &rk->time;
            chorus__step_time__init(&ti[r]);
            ti[r].step_s = t->step_s;
            ti[r].compute = t->compute;
            ti[r].tp = t->tp;
            ti[r].pp_wait = t->pp_wait;
            ti[r].zero = t->zero;
            ti[r].optim = t->optim;
            ti[r].idle = t->idle;
            ti[r].bubble = t->bubble;
            ri[r].time = &ti[r];
        }
        size_t nm = view->metrics ? rk->n_metrics : 0;
        ri[r].n_metrics = nm;
        ri[r].metrics = mp;
        for (size_t k = 0; k < nm; k++) {
            chorus__metric__init(mi);
            mi->name = (char *)rk->metrics[k].name;
            mi->value = rk->metrics[k].value;
            *mp++ = mi++;
        }
        rp[r] = &ri[r];
    }
    ji->n_ranks = w;
    ji->ranks = rp;
    return 0;
}

void coord_job_info_clear(Chorus__JobInfo *ji)
{
    free(ji->ranks); /* the whole block */
    ji->ranks = NULL;
    ji->n_ranks = 0;
    free(ji->history); /* its block */
    ji->history = NULL;
    ji->n_history = 0;
    free(ji->rank_states); /* its block */
    ji->rank_states = NULL;
    ji->n_rank_states = 0;
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
    j->placement = strdup(text);
    if (!j->ranks || !j->placement)
        return -ENOMEM;
    j->world = world;
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
