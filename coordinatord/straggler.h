/* Stragglers (DESIGN §9): ranks whose compute time is persistently above their peers'.
 *
 * Theory of operation. Every training step each rank reports where its time went
 * (RankEvent t_compute; step_s when the engine does not split it). Per rank the last
 * COORD_STRAGGLER_WINDOW figures are kept; once per step (rank 0's report) each rank's
 * window median is compared with the median of its peers' — the other ranks of its
 * pipeline stage, which do the same work (tp and dp split it evenly) — excluding itself. A
 * rank whose ratio stays above COORD_STRAGGLER_RATIO for COORD_STRAGGLER_PERSIST steps in a
 * row (and COORD_STRAGGLER_MIN_S above it) is a straggler: logged once with its numbers, recorded
 * as a job event, shown in status and watch (JobInfo.straggler) and counted in
 * chorus_job_stragglers. Medians shrug off the odd slow step (a page fault, a checkpoint); the
 * persistence rule and the ratio keep a calm run quiet. A straggler that recovers is cleared the
 * same way. */
#ifndef COORD_STRAGGLER_H
#define COORD_STRAGGLER_H

#include <stdint.h>

#include "job.h"
#include "placement.h"

typedef struct coord coord_t;

#define COORD_STRAGGLER_WINDOW  10  /* steps per rank in the median */
#define COORD_STRAGGLER_RATIO   1.3 /* its median over its peers' median */
#define COORD_STRAGGLER_PERSIST 3   /* steps in a row above the ratio */
/* and at least this many seconds above: on steps of a few milliseconds the scheduler's
 * noise alone makes ratios of 1.4 between identical ranks */
#define COORD_STRAGGLER_MIN_S 0.02

/* Rank r of j reported a step (its coord_step_time_t is updated): take it in; on rank
 * 0's report, judge every rank. */
void coord_straggler_step(coord_t *c, coord_job_t *j, uint32_t r);
/* A line naming the worst straggler of j's current generation ("" none), borrowed from j
 * until its next step: "rank 3 on node n2: compute 0.152 s, 1.52x its 3 peers' median over
 * 10 steps"; *count: how many ranks are stragglers now. */
const char *coord_straggler_line(const coord_job_t *j, uint32_t *count);
/* Release j's state (with the job). */
void coord_straggler_free(coord_job_t *j);
/* A line naming the node of j's current generation whose tensor-parallel all-reduces are
 * persistently the slowest ("" none; judge_nodes in straggler.c states the rule), borrowed
 * from j; *count: how many nodes are slow now. */
const char *coord_straggler_node_line(const coord_job_t *j, uint32_t *count);
/* fault.straggler = replace: the k nodes usable for j's placement (pn and nodes side by
 * side) with the node a straggler was replaced away from moved last; how many come before
 * it (k when it is not among them). */
size_t coord_straggler_avoid(const coord_job_t *j, coord_place_node_t *pn, coord_node_t **nodes,
                             size_t k);

#endif
