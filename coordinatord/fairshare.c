/* Per-user limits and fair share; see fairshare.h. */
#include "fairshare.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/util.h"
#include "coord.h"

#define MINUTE_MS 60000u

static uid_t owner_of(const coord_job_t *j)
{
    return j->spec.owner.uid >= 0 ? (uid_t)j->spec.owner.uid : (uid_t)-1;
}

static coord_usage_t *find(const coord_share_t *L, uid_t uid)
{
    for (size_t i = 0; i < L->n; i++)
        if (L->v[i].uid == uid)
            return &L->v[i];
    return NULL;
}

const coord_usage_t *coord_share_find(const coord_t *c, uid_t uid)
{
    return find(&c->share, uid);
}

/* uid's account, made when missing; NULL when out of memory. */
static coord_usage_t *account(coord_share_t *L, uid_t uid)
{
    coord_usage_t *u = find(L, uid);
    if (u)
        return u;
    if (L->n == L->cap) {
        size_t cap = L->cap ? 2 * L->cap : 16;
        coord_usage_t *v = realloc(L->v, cap * sizeof(*v));
        if (!v)
            return NULL;
        L->v = v;
        L->cap = cap;
    }
    u = &L->v[L->n++];
    *u = (coord_usage_t){.uid = uid, .exempt = -1};
    return u;
}

/* Whether a job owner is exempt: root, the daemon's user, admin-group. */
static int exempt_owner(const coord_t *c, const ch_jobspec_t *spec)
{
    if (spec->owner.uid < 0)
        return 1; /* a job from before owners were kept: the daemon's own */
    uid_t uid = (uid_t)spec->owner.uid;
    return uid == 0 || uid == c->users.self ||
           (c->users.have_admin &&
            coord_users_in_group(uid, (gid_t)spec->owner.gid, c->users.admin_gid));
}

/* Queued jobs of uid (and of gid as primary group) now. */
static void count_queued(const coord_t *c, uid_t uid, gid_t gid, size_t *by_user, size_t *by_group)
{
    *by_user = *by_group = 0;
    for (size_t i = 0; i < c->jobs.n; i++) {
        const coord_job_t *j = c->jobs.v[i];
        if (j->state != COORD_JOB_QUEUED)
            continue;
        *by_user += owner_of(j) == uid;
        *by_group += j->spec.owner.gid >= 0 && (gid_t)j->spec.owner.gid == gid;
    }
}

int coord_share_submit(coord_t *c, const coord_cred_t *who, const ch_jobspec_t *spec, char *err,
                       size_t errlen)
{
    const coord_cfg_t *cfg = &c->cfg;
    if (spec->priority != 0 && !who->admin)
        return ch_errf(err, errlen, -EPERM,
                       "job.priority: only root and members of coordinatord's admin-group may "
                       "set a priority (uid %lu asked for %lld)",
                       (unsigned long)who->uid, (long long)spec->priority);
    if (who->admin)
        return 0;
    size_t mine = 0, group = 0;
    count_queued(c, who->uid, who->gid, &mine, &group);
    if (cfg->max_queued_jobs > 0 && mine >= (size_t)cfg->max_queued_jobs)
        return ch_errf(err, errlen, -EDQUOT,
                       "limit max-queued-jobs: uid %lu has %zu jobs queued, at most %ld per user; "
                       "submit again when some have started",
                       (unsigned long)who->uid, mine, cfg->max_queued_jobs);
    if (cfg->group_max_queued_jobs > 0 && group >= (size_t)cfg->group_max_queued_jobs)
        return ch_errf(err, errlen, -EDQUOT,
                       "limit group-max-queued-jobs: group %lu has %zu jobs queued, at most %ld "
                       "per group",
                       (unsigned long)who->gid, group, cfg->group_max_queued_jobs);
    coord_usage_t *u = account(&c->share, who->uid);
    if (!u)
        return ch_errf(err, errlen, -ENOMEM, "out of memory");
    uint64_t now = ch_now_ms();
    if (now - u->win_start_ms >= MINUTE_MS) {
        u->win_start_ms = now;
        u->win_n = 0;
    }
    if (cfg->max_submits_per_minute > 0 && u->win_n >= (uint32_t)cfg->max_submits_per_minute)
        return ch_errf(err, errlen, -EDQUOT,
                       "limit max-submits-per-minute: uid %lu submitted %" PRIu32
                       " jobs in the last minute, at most %ld; try again in %" PRIu64 " s",
                       (unsigned long)who->uid, u->win_n, cfg->max_submits_per_minute,
                       (MINUTE_MS - (now - u->win_start_ms) + 999) / 1000);
    u->win_n++;
    return 0;
}

/* Ranks of j that hold slots now (what it takes from the cluster). */
static uint32_t held(const coord_job_t *j)
{
    if (j->state != COORD_JOB_STARTING && j->state != COORD_JOB_RUNNING &&
        j->state != COORD_JOB_RECOVERING)
        return 0;
    if (!j->ranks)
        return 0;
    return j->world;
}

void coord_share_tick(coord_t *c, uint64_t now_ms)
{
    coord_share_t *L = &c->share;
    double dt = L->tick_ms && now_ms > L->tick_ms ? (double)(now_ms - L->tick_ms) / 1000.0 : 0.0;
    double half = c->cfg.fairshare_halflife_s > 0 ? (double)c->cfg.fairshare_halflife_s : 3600.0;
    double decay = exp2(-dt / half);
    L->tick_ms = now_ms;
    /* What ran since the last tick ran with the counts of the last tick. */
    for (size_t i = 0; i < L->n; i++) {
        L->v[i].usage = L->v[i].usage * decay + (double)L->v[i].running * dt;
        L->v[i].running = 0;
    }
    for (size_t i = 0; i < c->jobs.n; i++) {
        uint32_t r = held(c->jobs.v[i]);
        if (r == 0)
            continue;
        coord_usage_t *u = account(L, owner_of(c->jobs.v[i]));
        if (u)
            u->running += r;
    }
}

void coord_share_started(coord_t *c, const coord_job_t *j)
{
    coord_usage_t *u = account(&c->share, owner_of(j));
    if (u)
        u->running += j->world;
}

/* The ordering key of a user: decayed usage plus a charge for what runs now. */
static double share_key(const coord_share_t *L, uid_t uid)
{
    const coord_usage_t *u = find(L, uid);
    return u ? u->usage + COORD_FAIRSHARE_RUNNING_CHARGE * u->running : 0.0;
}

typedef struct ord {
    coord_job_t *j;
    double key;
} ord_t;

static int cmp_ord(const void *a, const void *b)
{
    const ord_t *x = a, *y = b;
    if (x->j->spec.priority != y->j->spec.priority)
        return x->j->spec.priority > y->j->spec.priority ? -1 : 1;
    if (x->key != y->key)
        return x->key < y->key ? -1 : 1;
    return x->j->seq < y->j->seq ? -1 : x->j->seq > y->j->seq;
}

void coord_share_order(coord_t *c, coord_job_t **q, size_t n)
{
    ord_t *o = malloc((n ? n : 1) * sizeof(*o));
    if (!o)
        return; /* out of memory: submission order, as before */
    for (size_t i = 0; i < n; i++)
        o[i] = (ord_t){q[i], share_key(&c->share, owner_of(q[i]))};
    qsort(o, n, sizeof(*o), cmp_ord);
    for (size_t i = 0; i < n; i++)
        q[i] = o[i].j;
    free(o);
}

int coord_share_hold(coord_t *c, const coord_job_t *j, char *why, size_t len)
{
    long cap = c->cfg.max_running_ranks;
    if (cap <= 0)
        return 0;
    coord_usage_t *u = find(&c->share, owner_of(j));
    uint32_t running = u ? u->running : 0;
    if ((uint64_t)running + j->world <= (uint64_t)cap)
        return 0;
    if (u && u->exempt < 0)
        u->exempt = exempt_owner(c, &j->spec);
    if (u ? u->exempt : exempt_owner(c, &j->spec))
        return 0;
    snprintf(why, len,
             "waits: limit max-running-ranks: uid %lu runs %" PRIu32
             " ranks, this job needs %" PRIu32 ", at most %ld per user",
             (unsigned long)owner_of(j), running, j->world, cap);
    return 1;
}

void coord_share_fini(coord_t *c)
{
    free(c->share.v);
    c->share = (coord_share_t){0};
}
