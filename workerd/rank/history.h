/* A training run's side of a rank: its folder (common/run.h) before the first step, and
 * its history, metrics.jsonl beside the checkpoints, kept by rank 0.
 *
 * metrics.jsonl holds one JSON object a step (step, loss, lr, grad_norm, tokens_per_s,
 * mfu, step_s and where the step went, generation, time_ms). It outlives restarts and
 * continues across resumed runs: a rank 0 resuming step s first drops the lines of steps
 * after s (steps the run lost, run again now), so each step appears once, as the run that
 * reached the end computed it. */
#ifndef WRK_HISTORY_H
#define WRK_HISTORY_H

#include <stdint.h>
#include <stdio.h>

#include "common/run.h"
#include "workerd/engine/trainer.h"
#include "workerd/rank/rank.h"

/* Check the job's files as this rank's user (ch_run_check: creates the checkpoint
 * folder) and, on rank 0, write run.json when the folder has none. *res: what to resume
 * from when the coordinator gave no step. Fails the rank (wrk_rank_fail) naming the path
 * and the user. */
int wrk_history_prepare(wrk_rank_t *r, ch_run_resume_t *res);

typedef struct wrk_history {
    FILE *f; /* NULL: no history (not rank 0, or no checkpoint.dir) */
} wrk_history_t;

/* Rank 0 with checkpoint.dir: open the run's metrics.jsonl for appending, after dropping
 * the lines of steps after `from` (the step the run continues from; 0: a fresh start).
 * Others: h->f stays NULL. A failure is logged, and the run goes on without history. */
void wrk_history_open(wrk_rank_t *r, uint64_t from, wrk_history_t *h);
/* One step's line (flushed, not fsynced: a crash loses at most the lines after the last
 * checkpoint, which the resumed run writes again). */
void wrk_history_step(wrk_history_t *h, const wrk_rank_t *r, const eng_step_info_t *info);
void wrk_history_close(wrk_history_t *h);

#endif
