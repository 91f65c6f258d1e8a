/* Recovery (DESIGN §9): what happens to a job when one of its ranks fails.
 *
 * Every failure of an active job enters through coord_recovery_failure, with its cause:
 *
 *   running|starting --failure--> recovering --old ranks gone, slots found--> starting (gen+1)
 *                        \--restarts == fault.max_restarts--> failed (naming every cause)
 *
 * While recovering, the failed generation's ranks are killed on every node and the job
 * waits until each is confirmed gone (its exit reported, its node declared dead, or its
 * node re-registered without it); then the scheduler places generation + 1 on alive nodes
 * with free slots (idle nodes serve as spares, a node that came back is used again) and
 * the ranks resume from the last committed checkpoint (step 0 when there is none). When
 * slots are missing the job stays recovering with the reason, unless fault.elastic lets
 * it resume with a smaller dp (coord_recovery_shrink). Each restart is one entry
 * of the job's history (stored): time, cause, rank and node, the step resumed from, the
 * steps lost, and the seconds from detection to the first completed step after it.
 *
 * Only what can heal is retried. The job fails at once, with the reason, when
 *   - every node of the failed generation had a rank fail before its first step with the
 *     same lasting cause (permission denied, a file missing, a model that does not fit, a
 *     file that does not parse: common/err.h ch_err_lasting). The kill of the generation
 *     waits a moment (LASTING_WAIT_MS) after the first such report so the other nodes can
 *     say the same;
 *   - two generations in a row failed the same way (the same rank message, exit code or
 *     signal) before their first step;
 *   - fault.crash_loop generations in a row failed before their first step (the causes
 *     are listed).
 * Restarts back off: the first of a run of failures restarts at once, each next one after
 * fault.backoff seconds doubling up to fault.backoff_max; a generation that completes a
 * step ends the run. A node that does not confirm its ranks' exit within dead-after of
 * the kill is declared dead, so recovering always ends. */
#ifndef COORD_RECOVERY_H
#define COORD_RECOVERY_H

#include <stdint.h>

#include "chorus.pb-c.h"
#include "job.h"

typedef struct coord coord_t;

const char *coord_cause_name(coord_cause_t cause);

/* A rank of j's current generation reported its failure (RANK_FAILED), before the
 * failure itself enters coord_recovery_failure: the class of a cause no restart changes
 * (ch_err_lasting's; "" or NULL: none), whether the rank had completed a step, and its own
 * message (without who it is), which says whether generations fail the same way. */
void coord_recovery_rank_failed(coord_t *c, coord_job_t *j, uint32_t rank, const char *lasting,
                                int before_first_step, const char *message);

/* fault.nonfinite = rewind: a rank of j's current generation read data batch `batch` in
 * a step whose loss was not finite. The batch joins j's train.skip_steps (journaled with
 * the job file), so the restart that follows resumes from the last committed checkpoint
 * and reads past it; a list already full fails the job. */
void coord_recovery_rewind(coord_t *c, coord_job_t *j, uint32_t rank, uint64_t batch);

/* Phase p of the restart under way ended for one rank of j's new generation (the phase
 * ends when all have), or, for the job-level phases, ended. Nothing when no restart is
 * under way or p already ended. */
void coord_recovery_phase(coord_t *c, coord_job_t *j, coord_phase_t p);
/* Phase p's name ("kill_confirm", ...), and its duration in seconds in h (from the end of
 * the phase before, the first from the detection); -1 when not reached. */
const char *coord_phase_name(coord_phase_t p);
double coord_phase_s(const coord_restart_t *h, coord_phase_t p);

/* A rank of j's current generation reported a collective timeout (ev: timeout_group,
 * timeout_seq, group_entered), before the failure enters coord_recovery_failure: the
 * collectives it had entered per group are kept, so that in a group of more than 2 ranks
 * the one behind, or the one that never reported, is named the culprit, not the waiting
 * rank's ring predecessor (the kill of the generation waits a moment for the others'
 * reports). */
void coord_recovery_timeout(coord_t *c, coord_job_t *j, uint32_t rank, const Chorus__RankEvent *ev);

/* The one job-failure entry point. rank: the failed or culprit rank (-1: none); node may
 * be NULL. A failure while the job already recovers (its old ranks dying) is ignored. */
void coord_recovery_failure(coord_t *c, coord_job_t *j, coord_cause_t cause, int64_t rank,
                            const char *node, const char *reason);
/* For the scheduler: 1 when recovering job j may start its next generation (every rank
 * of the failed one is gone). Ranks left on nodes that are dead are declared lost here. */
int coord_recovery_ready(coord_t *c, coord_job_t *j);
/* j (queued or recovering) cannot start now: record why it waits (its reason). */
void coord_recovery_waiting(coord_t *c, coord_job_t *j, const char *why);
/* For the scheduler, before placing recovering job j: with fault.elastic, when j's layout
 * no longer fits the alive nodes (even idle), change it to the largest dp dividing the
 * submitted dp that fits, keeping the global batch dp x microbatches x micro_batch_size
 * (more micro-batches, else larger ones; a dp that cannot keep it exactly is skipped).
 * The change is recorded in the restart's history entry, the job's event log and its
 * reason; the ranks resume from the last committed checkpoint, resharded at load.
 * 1 when the layout changed, 0 when not (none fits: the reason says so), < 0 on error. */
int coord_recovery_shrink(coord_t *c, coord_job_t *j);
/* j's next generation was started (coord_job_start): the restart's resume step. */
void coord_recovery_started(coord_t *c, coord_job_t *j);
/* A step of j's current generation completed: the restart's recovery time. */
void coord_recovery_progress(coord_t *c, coord_job_t *j);
/* The resumed generation's rank 0 said where its state came from (source "memory" or
 * "disk") and at which step: the current restart's source, and its resumed_from and steps
 * lost when memory held a newer step than the disk. */
void coord_recovery_resumed(coord_t *c, coord_job_t *j, const char *source, uint64_t step);
/* Periodic: ranks without progress for fault.step_timeout (the time before the first
 * step included) are a hang. */
void coord_recovery_check(coord_t *c, coord_job_t *j, uint64_t now_ms);

/* Reload the stored histories into the loaded jobs. */
int coord_recovery_load(coord_t *c);

#endif
