/* Placement (DESIGN §5): which node runs each rank of a job.
 *
 * A pure function: no globals, no I/O, same input -> same output. Rules, in order:
 *   1. a TP group (tp consecutive ranks) always sits inside one node;
 *   2. pipeline stage s prefers rack (s mod R) of the R racks (racks numbered in order of
 *      first appearance in the node array), so the stages of a pipeline land on different
 *      racks and each stage's DP replicas stay together, keeping the heavy DP traffic
 *      inside a rack and only the light PP point-to-point traffic across racks;
 *   3. within a rack, nodes fill in array order, so a stage's DP replicas pack onto as few
 *      nodes as possible.
 * Since every TP group needs the same tp slots on one node, the greedy fill succeeds
 * whenever the nodes hold pp*dp TP groups in total; otherwise CH_E_CAPACITY. */
#ifndef COORD_PLACEMENT_H
#define COORD_PLACEMENT_H

#include <stddef.h>
#include <stdint.h>

#include "common/layout.h"

typedef struct coord_place_node {
    const char *name;    /* borrowed; for the caller, not used by placement */
    const char *rack;    /* borrowed; "" is a rack label like any other */
    uint32_t free_slots; /* slots this job may use on the node */
} coord_place_node_t;

typedef struct coord_place_rank {
    uint32_t node;       /* index into the nodes array */
    uint32_t local_rank; /* 0.. (ranks of this job on that node) - 1, ascending with rank */
} coord_place_rank_t;

/* Assign every rank of layout l (world = tp*pp*dp entries in out, indexed by rank).
 * -EINVAL for an empty layout, CH_E_CAPACITY when the nodes cannot hold it,
 * -ENOMEM when scratch memory is unavailable. */
int coord_placement(ch_layout_t l, const coord_place_node_t *nodes, size_t n,
                    coord_place_rank_t *out);

/* Number of ranks placed on node i (its LOCAL_WORLD_SIZE). */
uint32_t coord_placement_local_world(const coord_place_rank_t *ranks, uint32_t world, uint32_t i);

#endif
