/* The process groups of one rank (DESIGN §5, §6): {tp, dp, pipeline column and neighbours,
 * embedding}, built once from the layout and the rank and passed explicitly to whatever
 * communicates (Megatron's ProcessGroupCollection; no globals).
 *
 * A group of one rank is NULL: `g->dp == NULL` means there is no data-parallel traffic, and
 * a world of one rank needs no collectives context at all. Each group's index of this rank
 * is its coordinate: wrk_coll_group_index(g->tp) == g->coord.tp, and likewise for dp and
 * for pp (the stage). */
#ifndef ENG_GROUPS_H
#define ENG_GROUPS_H

#include <stdint.h>

#include "common/layout.h"
#include "workerd/coll/coll.h"

typedef struct eng_groups {
    ch_layout_t layout;
    uint32_t rank;  /* world rank, tp + TP * (dp + DP * pp) */
    uint32_t world; /* tp * pp * dp */
    ch_coord_t coord;
    wrk_coll_group_t *tp; /* the TP group (same host), NULL when tp == 1 */
    wrk_coll_group_t *dp; /* the DP group of this (tp, stage), NULL when dp == 1 */
    wrk_coll_group_t *pp; /* the pipeline column of (tp, dp), index = stage; NULL when pp == 1 */
    int32_t pp_prev, pp_next; /* index in pp of the previous / next stage; -1 at the ends */
    /* first and last stage of the column, which all-reduce the tied wte gradient; NULL when
     * pp == 1 and on middle stages */
    wrk_coll_group_t *emb;
} eng_groups_t;

/* Build rank's groups under layout. Collective: every rank of the world calls it with the
 * same layout (groups are created in the order tp, dp, pp, emb). coll may be NULL only
 * when the world is one rank; otherwise its rank and world size must be rank and the
 * layout's. Caller owns *out (eng_groups_destroy, before coll's destroy). 0, -EINVAL, or
 * the collectives' error. */
int eng_groups_create(wrk_coll_t *coll, ch_layout_t layout, uint32_t rank, eng_groups_t **out);
void eng_groups_destroy(eng_groups_t *g);

#endif
