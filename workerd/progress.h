/* Per-node progress aggregation: the node speaks for its ranks.
 *
 * Theory of operation. Every rank reports each step (RANK_PROGRESS). Instead of relaying
 * each report, the agent hands them here: per (job, generation) we keep each rank's latest
 * step and its figures (step_ms, step_s, compute), and every interval_ms one NodeProgress
 * per (job, generation) carries them: ranks whose figures agree as one group (`ranks` +
 * `common`), the others one RankSummary each. A report waits at most interval_ms plus the
 * owner's tick period (the agent ticks every 100 ms), and only the latest step of each rank
 * in an interval reaches the coordinator (a progress report supersedes the one before),
 * except its compute and tensor-parallel times: those of every step since the last send
 * (at most WRK_PROGRESS_FIGURES) ride along in the summary, so the straggler detector
 * judges steps, not intervals. A rank that goes in full (below) sends its latest step's
 * figures only; all of them go again with its next summary.
 *
 * A rank's reports of one interval are merged into one (its metrics by name, each with
 * its latest value, as the coordinator keeps them). It goes in full instead of a summary
 * (NodeProgress.detail: time breakdown, metrics such as memory, gflops and busbw) when it is
 * the rank's first of a generation, when its metric names differ from those of the last
 * full one sent (news, such as a diag rank's next group), every detail_every intervals
 * (and at the next interval after wrk_progress_want_detail), and when the owner flushes
 * before a lifecycle event.
 *
 * Checkpoint reports (RANK_CHECKPOINT) are held too when the coordinator takes them in a
 * NodeProgress (RegisterAck.node_checkpoints): a step's reports of the node's ranks go
 * together, in full with what is held of the job's progress, as soon as all of the node's
 * ranks of it have reported the step, else at the next tick. At 16,384 ranks that turns a
 * checkpoint step's 16 messages a node (a flush and a report per rank) into one.
 *
 * What is not held here is the owner's business: rank 0's reports (the job's loss, every
 * step), a rank's restart phase reports, failures, exits and hangs go at
 * once. Before such an event of a job
 * the owner calls wrk_progress_flush for it, so the coordinator sees a rank's progress
 * before its exit, as before. */
#ifndef WRK_PROGRESS_H
#define WRK_PROGRESS_H

#include <stdint.h>

#include "chorus.pb-c.h"

typedef struct wrk_progress wrk_progress_t;

/* Per rank the compute and tensor-parallel figures of at most this many steps go in one
 * report (RankSummary computes, tps), older ones are dropped: the coordinator's straggler
 * window (COORD_STRAGGLER_WINDOW) holds no more. */
#define WRK_PROGRESS_FIGURES 12

/* Send env (borrowed for the call); 0, or a negative code when it could not be sent (the
 * reports are then kept for the next tick). */
typedef int (*wrk_progress_send_fn)(void *ud, Chorus__Envelope *env);

typedef struct wrk_progress_cfg {
    uint32_t interval_ms;  /* workerd.conf progress-ms */
    uint32_t detail_every; /* workerd.conf progress-detail-every; 0: only when asked */
    uint32_t slack_ms;     /* a tick this close to the interval's end sends already (for an
                            * owner whose ticks are as long as the interval) */
    wrk_progress_send_fn send;
    void *ud;
    /* A held checkpoint report that a flush could not send (borrowed for the call): the
     * owner queues it ahead of the event it flushed for. NULL: dropped. */
    void (*unsent)(void *ud, const Chorus__RankEvent *ev);
} wrk_progress_cfg_t;

int wrk_progress_create(const wrk_progress_cfg_t *cfg, wrk_progress_t **out);
void wrk_progress_destroy(wrk_progress_t *p);

/* Take one RANK_PROGRESS report (borrowed: what is needed is copied). job_id, generation,
 * rank and launch_token must already be the rank's own. */
int wrk_progress_add(wrk_progress_t *p, const Chorus__RankEvent *ev);
/* Hold one RANK_CHECKPOINT report (borrowed: copied) for the next NodeProgress of its job;
 * node_ranks: the node's ranks of (job, generation), whose reports of the step send it at
 * once. 0 when held (or sent), a negative code when the owner must send it itself. */
int wrk_progress_checkpoint(wrk_progress_t *p, const Chorus__RankEvent *ev, uint32_t node_ranks);
/* Send what is held for (job, gen) now, in full; on failure it is dropped (the lifecycle
 * event the caller sends next supersedes it). */
void wrk_progress_flush(wrk_progress_t *p, const char *job, uint64_t gen);
/* Periodic: once interval_ms has passed since the last send, send what is held; held
 * checkpoint reports go at every tick. */
void wrk_progress_tick(wrk_progress_t *p, uint64_t now_ms);
/* Full reports of job's ranks at the next interval (ProgressDetail; NULL or "": every
 * job). */
void wrk_progress_want_detail(wrk_progress_t *p, const char *job);

/* Whether a heartbeat tick at now_ms must send a Heartbeat, given the node's last message
 * to the coordinator (any: the coordinator counts each as its heartbeat) at last_sent_ms.
 * A tick is skipped when something went within heartbeat_ms, so the node is silent at
 * most two intervals; only where dead_after_ms (RegisterAck; 0: unknown, an older
 * coordinator) leaves at least one more interval of slack beyond that. */
int wrk_heartbeat_due(uint64_t now_ms, uint64_t last_sent_ms, uint32_t heartbeat_ms,
                      uint32_t dead_after_ms);

/* Counters, for tests and the simulator. */
typedef struct wrk_progress_stats {
    uint64_t reports;     /* taken by wrk_progress_add */
    uint64_t messages;    /* NodeProgress sent */
    uint64_t details;     /* full reports sent in them */
    uint64_t checkpoints; /* checkpoint reports sent in them */
} wrk_progress_stats_t;
void wrk_progress_stats(const wrk_progress_t *p, wrk_progress_stats_t *out);

#endif
