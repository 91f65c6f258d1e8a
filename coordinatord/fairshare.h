/* Per-user limits and fair share, as Slurm's association limits and fair-share factor.
 *
 * Limits (coordinatord's configuration; 0: none) are checked at submit, each refusal
 * naming the limit: queued jobs per user (max-queued-jobs) and per primary group
 * (group-max-queued-jobs), submissions per user per minute (max-submits-per-minute);
 * running ranks per user (max-running-ranks) are checked by the scheduler, whose job
 * then waits saying so. Root, the daemon's user and admin-group are exempt.
 *
 * Fair share: each user's usage is the rank-seconds of their active jobs, decayed with a
 * half-life (fairshare-halflife-s), accrued on every scheduling pass. Queued jobs start
 * in the order: [job] priority (higher first; only admins may set it), then their
 * owner's usage plus what they run now (lower first), then submission (FIFO within a
 * user). As before the first job in that order that does not fit blocks those behind it
 * (no backfill, so a big job is never starved). Users are few (SO_PEERCRED identities):
 * a small array, searched linearly. */
#ifndef COORD_FAIRSHARE_H
#define COORD_FAIRSHARE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/jobspec.h"

typedef struct coord coord_t;
typedef struct coord_job coord_job_t;
typedef struct coord_cred coord_cred_t;

/* One user's account. */
typedef struct coord_usage {
    uid_t uid;
    double usage;          /* decayed rank-seconds */
    uint32_t running;      /* ranks of their active jobs, as of the last pass */
    uint64_t win_start_ms; /* submissions: the current minute and its count */
    uint32_t win_n;
    /* root, the daemon's user or admin-group: looked up once (group files are slow to
     * read on every scheduling pass); -1: not yet */
    int exempt;
} coord_usage_t;

typedef struct coord_share {
    coord_usage_t *v;
    size_t n, cap;
    uint64_t tick_ms; /* monotonic: usage accrued up to here */
} coord_share_t;

/* A running rank counts as this many rank-seconds already used when ordering: so, at
 * equal usage, the user running less goes first, and two starts in one pass alternate. */
#define COORD_FAIRSHARE_RUNNING_CHARGE 1.0

/* Whether who may submit spec now: -EDQUOT naming the limit (or -EPERM for a priority
 * set by a non-admin), with err set; counts the submission when it may. */
int coord_share_submit(coord_t *c, const coord_cred_t *who, const ch_jobspec_t *spec, char *err,
                       size_t errlen);
/* Accrue and decay usage up to now_ms; recount each user's running ranks. */
void coord_share_tick(coord_t *c, uint64_t now_ms);
/* Sort the n queued jobs q into starting order (above). */
void coord_share_order(coord_t *c, coord_job_t **q, size_t n);
/* 0 when j's owner may start j's ranks now; else 1 with why set (max-running-ranks). */
int coord_share_hold(coord_t *c, const coord_job_t *j, char *why, size_t len);
/* j started in this pass: charge its ranks to its owner for the rest of the pass. */
void coord_share_started(coord_t *c, const coord_job_t *j);
/* The account of uid (NULL when it has none). */
const coord_usage_t *coord_share_find(const coord_t *c, uid_t uid);
void coord_share_fini(coord_t *c);

#endif
