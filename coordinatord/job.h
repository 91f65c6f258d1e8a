/* Jobs (DESIGN §4): the job table and its state machine.
 *
 *   queued -> starting -> running -> completed | failed | cancelled
 *   starting | running -> recovering -> starting (generation + 1): every failure enters
 *   recovery.h's coord_recovery_failure, which restarts the job or ends it (coord_job_fail).
 *
 * A rank holds a slot on its node from placement until it is reported exited, its node
 * is declared dead, or its node re-registers without it; so slots are reused only once
 * the processes are really gone. Rank events carry (job, generation): events of another
 * generation are dropped (fencing). Every state change is stored before it is acted on
 * and logged as "job=j1 gen=1 state running->failed: reason". */
#ifndef COORD_JOB_H
#define COORD_JOB_H

#include <stddef.h>
#include <stdint.h>

#include "common/jobspec.h"
#include "placement.h"

typedef struct coord coord_t;
typedef struct coord_node coord_node_t;

typedef enum {
    COORD_JOB_QUEUED = 0,
    COORD_JOB_STARTING,
    COORD_JOB_RUNNING,
    COORD_JOB_RECOVERING,
    COORD_JOB_COMPLETED,
    COORD_JOB_FAILED,
    COORD_JOB_CANCELLED,
    COORD_JOB_NSTATES,
} coord_job_state_t;

/* A rank's life at the coordinator, held once (coord_rank_t.state) and changed only by
 * coord_rank_set_state:
 *
 *   new -> pending (StartRanks sent) -> running -> done -> exited
 *   (reloaded) unknown -> running (re-adopted)        \-> failing -> failed
 *   any state holding a slot -> lost (node dead, or back without it)
 *
 * pending, unknown, running, done and failing hold a slot on the rank's node; exited,
 * failed and lost do not (the process is known to be gone). "started" means the rank
 * reached running once (done counts). */
typedef enum {
    COORD_RANK_NEW = 0, /* placed, nothing sent yet */
    COORD_RANK_PENDING, /* StartRanks sent */
    COORD_RANK_UNKNOWN, /* reloaded after a restart, not yet re-reported */
    COORD_RANK_RUNNING,
    COORD_RANK_DONE,    /* reported its work done; its exit follows */
    COORD_RANK_FAILING, /* reported a failure; its exit follows */
    COORD_RANK_EXITED,  /* exited cleanly after done */
    COORD_RANK_FAILED,  /* exited in any other way */
    COORD_RANK_LOST,    /* its node died, or came back without it */
    COORD_RANK_NSTATES,
} coord_rank_state_t;

/* Named figures kept per rank: a diag job of a 3-D layout reports gflops and algbw/busbw
 * of 4 collectives in 4 groups (34). A rank's slots are allocated when it first reports a
 * figure and grow as it names more (a training rank reports one, step_ms). */
#define COORD_RANK_METRICS 64

typedef struct coord_metric {
    char name[48];
    double value;
} coord_metric_t;

/* Why a generation ended (DESIGN §9); names as in status and metrics. */
typedef enum {
    COORD_CAUSE_RANK_EXIT = 0,  /* a rank exited or was killed */
    COORD_CAUSE_RANK_FAILED,    /* a rank reported an error */
    COORD_CAUSE_COLLECTIVE,     /* a rank's collective wait timed out (names the peer) */
    COORD_CAUSE_HANG,           /* no progress for fault.step_timeout */
    COORD_CAUSE_NODE_LOST,      /* its node stopped heartbeating */
    COORD_CAUSE_WORKER_RESTART, /* its workerd came back without it */
    COORD_CAUSE_COORD_RESTART,  /* not re-reported after a coordinator restart */
    COORD_CAUSE_STRAGGLER,      /* fault.straggler = replace: a straggler re-placed */
    COORD_CAUSE_NCAUSES,
} coord_cause_t;

/* The phases of a restart, in order; each ends when (coord_recovery_phase): */
typedef enum {
    COORD_PHASE_KILLED,  /* every rank of the failed generation is confirmed gone */
    COORD_PHASE_PLACED,  /* the next generation is placed and its StartRanks sent */
    COORD_PHASE_STARTED, /* every rank process of it is up (RANK_STARTED) */
    COORD_PHASE_COMM,    /* every rank has its communicators (rendezvous included) */
    COORD_PHASE_LOADED,  /* every rank has loaded its checkpoint */
    COORD_PHASE_STEP,    /* the first step completed */
    COORD_PHASE_PAST,    /* the step that failed completed again */
    COORD_PHASES,
} coord_phase_t;

typedef struct coord_restart {
    uint64_t time_ms; /* wall clock of the detection */
    coord_cause_t cause;
    int64_t rank; /* -1: none */
    char node[64];
    char reason[256];
    uint64_t failed_gen, failed_step;
    int64_t resumed_from; /* -1: not restarted (yet) */
    uint64_t steps_lost;
    double recover_s; /* -1: not yet */
    /* fault.elastic: the layout given up and the one resumed in (dp 0: unchanged); kept in
     * the store with the rest of the restart. */
    ch_layout_split_t layout_from, layout_to; /* dp 0: none */
    /* "memory" | "disk" as the resumed generation's rank 0 reported; "": not yet, or a fresh
     * start (no state saved). */
    char source[8];
    /* In memory only: what the failure looked like, to tell a job failing the same way
     * every generation (recovery.c): "" when not comparable (a node lost, a kill -9), and
     * whether its generation failed before completing a step. */
    char sig[200];
    int unstepped;
    /* In memory only: when each phase of the restart ended (wall ms; 0: not yet), and how
     * many ranks of the new generation reported the rank-level ones (recovery.h). */
    uint64_t phase_ms[COORD_PHASES];
    uint32_t phase_ranks[COORD_PHASES];
} coord_restart_t;

/* A training rank's place in the layout (DESIGN §5), as it reported at start
 * (RankEvent.placed); status derives it from the layout when reported is 0. */
typedef struct coord_rank_place {
    ch_place_t at;
    int reported;
} coord_rank_place_t;

/* Where the rank's last step went, in seconds (RankEvent's step fields): only the latest
 * is kept. step_s == 0: none reported. */
typedef struct coord_step_time {
    double step_s, compute, tp, pp_wait, zero, optim, idle, bubble;
} coord_step_time_t;

typedef struct coord_rank {
    coord_node_t *node;
    uint32_t local_rank;
    coord_rank_state_t state; /* coord_rank_set_state only */
    uint64_t step;
    int32_t exit_code, signal;
    int64_t ckpt_step;
    uint64_t seen;        /* stamp of the last Register that reported it */
    uint64_t progress_ms; /* monotonic: StartRanks, re-adoption or its last step */
    /* Its figures (RankEvent.metrics, the last value of each name): n_metrics of cap_metrics
     * allocated slots, NULL until it reports one; owned by the rank array and freed with it
     * (coord_ranks_free). Out of line: 64 slots inline made a rank 3.7 KB, and a step at
     * 16,384 ranks paid a cache and TLB miss per rank for them. */
    coord_metric_t *metrics;
    uint32_t n_metrics, cap_metrics;
    coord_rank_place_t place;
    coord_step_time_t time;
    /* It failed before its first step with a cause no restart changes (ch_err_lasting's
     * class; "" none): the coordinator ends the job when every node says the same. */
    char lasting[16];
    /* After a collective timeout, the collectives it had entered per group (tp, dp, pp,
     * emb: bit k of entered_known when reported). */
    uint64_t entered[4];
    uint8_t entered_known;
    uint8_t metric_hint; /* where copy_metrics looks first: the slot it last wrote */
} coord_rank_t;

/* Free a rank array of world entries and every rank's figures; NULL is a no-op. Every
 * path that drops a job's ranks (a new generation, relayout, reload, the job's end) goes
 * through here. */
void coord_ranks_free(coord_rank_t *ranks, uint32_t world);

/* One entry of a job's rank index by node (coord_job_t.by_node). */
typedef struct coord_rank_ref {
    const coord_node_t *node;
    uint32_t rank;
} coord_rank_ref_t;

typedef struct coord_job {
    int64_t seq;
    char id[24]; /* "j<seq>" */
    char name[64];
    char *ini; /* canonical job file */
    ch_jobspec_t spec;
    coord_job_state_t state;
    uint64_t generation;
    uint32_t restarts;
    uint64_t step, total_steps;
    double loss, tokens_per_s, mfu;
    int64_t last_ckpt_step;
    char reason[512];
    uint64_t submitted_ms, started_ms, finished_ms; /* wall clock */
    uint32_t world;
    coord_rank_t *ranks; /* world entries once placed, else NULL */
    char *placement;     /* stored form of ranks' nodes: "node:local_rank,..." */
    /* ranks sorted by (node, rank): a node's ranks in O(log world), so a node's death or
     * registration costs the ranks it holds, not every rank of every job. NULL when out of
     * memory at placement: then every rank is walked. */
    coord_rank_ref_t *by_node;
    uint64_t progress_stored_ms;
    uint64_t detail_asked_ms; /* monotonic: last ProgressDetail sent (progress.h) */
    /* monotonic: before this no rank can be past fault.step_timeout, so the step-timeout
     * scan (coord_recovery_check) may skip; 0: scan at the next check */
    uint64_t hang_scan_ms;
    /* Bumped whenever a rank's step time (coord_rank_t.time) or the ranks change; the
     * mean bubble over ranks is cached for one stamp (coord_job_bubble: status asks for it
     * every call, and a walk of every rank cost the start at 32,768 ranks 7%). */
    uint64_t time_stamp, bubble_stamp;
    double bubble_mean;
    uint32_t n_started, n_finished;
    uint64_t grace_deadline;  /* monotonic; 0: not waiting for re-adoption */
    coord_restart_t *history; /* restarts (and the failure that ended them), oldest first */
    uint32_t n_history;
    /* Recovery's bookkeeping (recovery.c), monotonic ms; 0: none. */
    uint64_t kill_due_ms;   /* a failure that may not heal: the generation's kill, postponed
                               until the other nodes had a moment to say the same */
    uint64_t kill_sent_ms;  /* the failed generation's kill went out */
    uint64_t restart_at_ms; /* backoff: the next generation starts no sooner */
    int gen_stepped;        /* the current generation completed a step */
    uint32_t unstepped_run; /* generations in a row that failed before their first step */
    char fail_sig[200];     /* the rank's own words for the failure being recorded */
    uint32_t queue_place;   /* queued: 1 + jobs ahead in the scheduler's order; else 0 */
    /* A collective timeout in a group of more than 2 ranks, whose culprit is named when the
     * kill is due (kill_due_ms): the group (0 tp, 1 dp, 2 pp; -1 none), the rank that first
     * reported it and the collective it waited in. */
    int timeout_kind;
    uint32_t timeout_rank;
    uint64_t timeout_seq;
    struct coord_straggler *strag; /* straggler.c's windows; NULL until a step came */
    /* fault.straggler = replace: the node a straggler was replaced away from, left out of
     * the job's placements while the others hold it (memory only); "" none */
    char avoid_node[64];
} coord_job_t;

typedef struct coord_jobs {
    coord_job_t **v; /* in submission order: the FIFO queue is its queued subset */
    size_t n, cap;
} coord_jobs_t;

const char *coord_job_state_name(coord_job_state_t s);
const char *coord_rank_state_name(coord_rank_state_t s);
/* Whether a rank in state s holds a slot on its node (its process may still run). */
int coord_rank_holds(coord_rank_state_t s);
/* The one place a rank changes state: keeps the node's used slots and the job's started
 * count in step, logs "job=j1 gen=2 rank=3 node=n1 state running->failed: why". */
void coord_rank_set_state(coord_t *c, coord_job_t *j, uint32_t rank, coord_rank_state_t to,
                          const char *why);
int coord_job_is_active(const coord_job_t *j); /* starting, running or recovering */
/* By id ("j3"), else the most recent job with that name. */
coord_job_t *coord_job_find(coord_t *c, const char *id_or_name);

/* Parse, validate, admit and store a job file; fills id. CH_E_CONFIG or CH_E_CAPACITY
 * with a message in err naming the field or the shortfall. */
int coord_job_submit(coord_t *c, const char *ini, char *id, size_t idlen, char *err, size_t errlen);
/* Start job with a placement over nodes (journals before sending StartRanks). */
int coord_job_start(coord_t *c, coord_job_t *j, const coord_place_rank_t *pl,
                    coord_node_t *const *nodes, size_t n_nodes);
/* Recovering job j, none of whose ranks holds a slot, resumes in spec's layout from now
 * on (fault.elastic): its job file, spec and world change and are stored; its old
 * placement is dropped. */
int coord_job_relayout(coord_t *c, coord_job_t *j, const ch_jobspec_t *spec);
/* CH_E_STATE (with err) when the job already ended. */
int coord_job_cancel(coord_t *c, coord_job_t *j, char *err, size_t errlen);
/* Fault drill: SIGKILL one running rank through its workerd. The rank's exit then takes
 * the ordinary failure path. */
int coord_job_kill_rank(coord_t *c, coord_job_t *j, uint32_t rank, char *err, size_t errlen);
/* The end of the failure path (recovery.h decides when): job failed with reason, its
 * ranks killed everywhere. */
void coord_job_fail(coord_t *c, coord_job_t *j, const char *reason);
/* The one place a job changes state after submission: log, store, event. */
void coord_job_set_state(coord_t *c, coord_job_t *j, coord_job_state_t to, const char *reason);
/* KillRanks (for j's current generation) to every node where a rank of j holds a slot. */
void coord_job_kill_gen(coord_t *c, coord_job_t *j, const char *reason);
/* Store j's row (state, progress, placement, ...). */
int coord_job_store(coord_t *c, coord_job_t *j);

/* Node declared dead: free its slots, fail the jobs that had ranks on it. */
void coord_job_node_dead(coord_t *c, coord_node_t *n, const char *why);
/* Periodic: re-adoption deadlines after a restart. */
void coord_job_check(coord_t *c, uint64_t now_ms);

/* The job's pipeline bubble: the mean over ranks of pp_wait / step time of their last
 * reported step (-1 when none reported one), and 1F1B's (pp - 1) / (microbatches + pp - 1). */
double coord_job_bubble(const coord_job_t *j);
/* A figure rank `rank` reported by name (RankEvent.metrics, the last value); NaN when it
 * did not or the job has no such rank. */
double coord_job_rank_metric(const coord_job_t *j, uint32_t rank, const char *name);
double coord_job_bubble_theory(const coord_job_t *j);
/* Rank r's place in j's layout: what it reported, else derived from the layout. */
coord_rank_place_t coord_job_rank_place(const coord_job_t *j, uint32_t r);

int coord_jobs_load(coord_t *c);
void coord_jobs_fini(coord_t *c);

/* Ended jobs (completed, failed, cancelled) kept in memory: the most recent ones. Older
 * ones are let go; their rows stay in the store, where status finds them. */
#define COORD_JOBS_KEEP_ENDED 1000
/* Free the oldest ended jobs beyond cfg.keep_ended_jobs (0: COORD_JOBS_KEEP_ENDED) whose
 * ranks hold no slot. No pointer to a job may be held across the call. */
void coord_jobs_trim(coord_t *c);
/* A job no longer in memory, read back from the store (by id, else the latest of that
 * name): no ranks, no history; free with coord_job_free. CH_E_NOTFOUND when none. */
int coord_job_load(coord_t *c, const char *id_or_name, coord_job_t **out);
void coord_job_free(coord_job_t *j);
void coord_jobs_count(const coord_t *c, size_t *counts); /* COORD_JOB_NSTATES entries */

/* Shared by job.c and jobevent.c. */
coord_job_t *coord_job_find_id(coord_t *c, const char *id); /* by id only */
/* j's ranks on n, lowest first: by_node[*lo .. *hi), or with no index every rank
 * (*lo = 0, *hi = world; the caller checks the node). */
void coord_job_ranks_on(const coord_job_t *j, const coord_node_t *n, size_t *lo, size_t *hi);
uint32_t coord_job_rank_at(const coord_job_t *j, size_t k); /* the k-th of ranks_on's range */
/* KillRanks to n: job's generation gen, only *rank when rank is not NULL, else all of them. */
int coord_job_send_kill(coord_node_t *n, const char *job, uint64_t gen, const uint32_t *rank,
                        const char *reason);

#endif
