/* Per-node progress: what a node says for its ranks.
 *
 * A workerd sends one NodeProgress per job per progress-ms interval (workerd/progress.h)
 * instead of one RankEvent per rank per step. Applying it turns each rank's summary into the
 * RANK_PROGRESS event it stands for and hands it to coord_job_rank_event, so the rank's
 * step, its hang clock, its heat-map cell, its straggler window and its step_ms metric move
 * exactly as a relayed report would move them; fencing (generation, placement) is the same
 * code. Full reports (NodeProgress.detail) are applied as they are, and so are the checkpoint
 * reports of a step that the node's ranks made (NodeProgress.checkpoints), after them. */
#ifndef COORD_PROGRESS_H
#define COORD_PROGRESS_H

#include "chorus.pb-c.h"
#include "job.h"

/* Apply np from node `from` (already authenticated and its launch token checked). */
void coord_progress_apply(coord_t *c, coord_node_t *from, const Chorus__NodeProgress *np);
/* A client asked for every rank's detail (status --ranks, the page): ask j's nodes to send
 * full reports at their next interval; at most once per COORD_PROGRESS_DETAIL_MS a job. */
#define COORD_PROGRESS_DETAIL_MS 5000
void coord_progress_want_detail(coord_t *c, coord_job_t *j);

#endif
