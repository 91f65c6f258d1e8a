/* Stragglers (DESIGN §9): ranks whose compute time is persistently above their peers'.
 *
 * Theory of operation. Every training step each rank reports where its time went
 * (RankEvent t_compute; step_s when the engine does not split it). Per rank the coordinator
 * keeps its last COORD_STRAGGLER_WINDOW figures and, at rank 0's report when figures came
 * in since the last judgement, compares each rank's LOW figure (the COORD_STRAGGLER_LOW-th smallest
 * of its window) with the lower median of its peers' low figures: the other ranks of its pipeline
 * stage, which do the same work (tp and dp split it evenly), itself left out. A rank above
 * COORD_STRAGGLER_RATIO times that and COORD_STRAGGLER_MIN_S above it for
 * COORD_STRAGGLER_PERSIST of its own figures in a row is a straggler: logged once with its
 * numbers, recorded as a job event, shown in status and watch (JobInfo.straggler) and
 * counted in chorus_job_stragglers.
 *
 * Why a low quantile. Noise (other processes on the cores, a page fault, the checkpoint
 * written at a step, a collective that waited inside the compute) only ever ADDS time to a
 * step, and comes in episodes; a straggler (a slow chip, a throttled clock) is slow on
 * EVERY step. The fast end of a window is the rank's own speed with the noise left out:
 * a slow step (a checkpoint, a page fault) moves nothing, and a noise episode must cover
 * WINDOW - LOW + 1 figures (10 of 12) for PERSIST figures in a row before the rank is
 * named, where a median moved after half. A truly slowed rank crosses once that many of
 * its figures are slowed: named at its 11th slowed figure. A median also lags a machine
 * that just got quieter by half a window; the low figure follows it after LOW figures, on
 * every rank alike.
 *
 * Figures per step. A workerd sends its ranks' progress once per progress-ms (1 s by
 * default; coord_node_t.progress_ms), with each rank's compute and TP figure of every step
 * since its last report (RankSummary computes, tps: coord_straggler_figures), and rank 0's
 * every step at once. Every figure keeps its step, and a stage's ranks are judged at the
 * same steps: each rank's window is its last WINDOW figures up to the newest step every
 * rank of the stage has reported (rank 0's figures come up to an interval before the
 * others'; its window of later steps against theirs made one side look slow whenever the
 * machine got busier or quieter: 4 false reports in 1,000 calm steps under load). A
 * judgement (rank 0's report) moves the streaks at each such step reached since the last
 * one (PERSIST at most), every rank's window ending there against its peers': PERSIST
 * counts steps whether they came one by one or in a batch of 7. So a straggler is named
 * at its 11th slowed step plus the wait for its node's report (at most one interval: 11
 * to 18 steps of 0.15 s at 1 s). A rank more than RING - WINDOW figures ahead of its
 * stage's slowest (steps much shorter than the interval: rank 0) is left out until the
 * others catch up.
 *
 * An older workerd sends only each rank's latest step: then every rank takes at most one
 * figure per 7/8 of its node's interval, rank 0 too, so that every window spans about the
 * same seconds (rank 0's last steps against rank 1's figures of the last 10 seconds made
 * rank 1 look slow whenever the machine got quieter); PERSIST 2 covers the figure by
 * which one rank's window may still lag another's. A straggler is then named after 11 of
 * its figures: about 11 s at the default 1 s, however many steps that is.
 *
 * Clearing. A straggler that recovers is cleared by the same statistic and the same
 * persistence the other way: once LOW of its figures are fast again, for PERSIST in a row.
 *
 * Nodes (judge_nodes): the same statistic over the ranks' tensor-parallel all-reduce time
 * (a TP group sits inside one node): per node the median of its ranks' low figures against
 * the other nodes', the same ratio, floor and persistence.
 *
 * Cost: a stage is judged only when its common step moved (with figures per step), then
 * O(its ranks x (RING + WINDOW x LOW) x PERSIST) plus O(its ranks) expected for the peers'
 * medians (a selection, no sort), with no allocation; a figure taken O(1); per rank 2 x
 * WINDOW figures with their steps (compute, TP: 3 x 24 x 4 bytes) and 39 bytes more: 5.4
 * MB at 16,384 ranks. */
#ifndef COORD_STRAGGLER_H
#define COORD_STRAGGLER_H

#include <stdint.h>

#include "job.h"
#include "placement.h"

typedef struct coord coord_t;

#define COORD_STRAGGLER_WINDOW  12  /* figures per rank */
#define COORD_STRAGGLER_LOW     3   /* its low figure: the 3rd smallest of its window */
#define COORD_STRAGGLER_RATIO   1.3 /* its low figure over its peers' (their lower median) */
#define COORD_STRAGGLER_PERSIST 2   /* of its own figures in a row above the ratio */
/* and at least this many seconds above: on steps of a few milliseconds the scheduler's
 * noise alone makes ratios of 1.4 between identical ranks */
#define COORD_STRAGGLER_MIN_S 0.02

/* Rank r of j reported a step (its coord_step_time_t is updated): take it in (unless
 * sampled: an older workerd, see above); on rank 0's report, judge every rank. */
void coord_straggler_step(coord_t *c, coord_job_t *j, uint32_t r);
/* A node's report of rank r of j at step `step` carried the figures of its steps since its
 * last report (RankSummary computes, tps; tps NULL: none): take the n before the latest
 * (steps step - n .. step - 1, oldest first; the latest comes with the report's
 * coord_straggler_step), those of steps it has not taken yet. From then on every figure of
 * j is taken, none sampled. */
void coord_straggler_figures(coord_job_t *j, uint32_t r, uint64_t step, const float *computes,
                             const float *tps, size_t n);
/* A line naming the worst straggler of j's current generation ("" none), borrowed from j
 * until its next step: "rank 3 on node n2: compute 0.152 s, 1.52x its 3 peers' (3rd
 * fastest of 8 steps)"; *count: how many ranks are stragglers now. */
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
