/* A rank's process groups (groups.h), from the layout arithmetic of common/layout.h and
 * the collectives' layout groups. */
#include "workerd/engine/groups.h"

#include <errno.h>
#include <stdlib.h>

#include "common/log.h"

/* The rank's group of kind when it has more than one member. */
static int make(wrk_coll_t *coll, ch_layout_t l, uint32_t size, wrk_coll_group_kind_t kind,
                wrk_coll_group_t **out)
{
    *out = NULL;
    return size > 1 ? wrk_coll_group_layout(coll, l, kind, out) : 0;
}

int eng_groups_create(wrk_coll_t *coll, ch_layout_t layout, uint32_t rank, eng_groups_t **out)
{
    *out = NULL;
    uint32_t world = layout.tp * layout.pp * layout.dp;
    if (layout.tp == 0 || layout.pp == 0 || layout.dp == 0 || rank >= world ||
        (world > 1 &&
         (coll == NULL || wrk_coll_rank(coll) != rank || wrk_coll_world_size(coll) != world))) {
        return -EINVAL;
    }
    eng_groups_t *g = calloc(1, sizeof *g);
    if (g == NULL) {
        return -ENOMEM;
    }
    g->layout = layout;
    g->rank = rank;
    g->world = world;
    g->coord = ch_layout_coord(layout, rank);
    g->pp_prev = g->coord.pp > 0 ? (int32_t)g->coord.pp - 1 : -1;
    g->pp_next = g->coord.pp + 1 < layout.pp ? (int32_t)g->coord.pp + 1 : -1;
    int rc = 0;
    CH_CHECK_GOTO(make(coll, layout, layout.tp, WRK_COLL_GROUP_TP, &g->tp), rc, fail);
    CH_CHECK_GOTO(make(coll, layout, layout.dp, WRK_COLL_GROUP_DP, &g->dp), rc, fail);
    CH_CHECK_GOTO(make(coll, layout, layout.pp, WRK_COLL_GROUP_PP, &g->pp), rc, fail);
    /* NULL on a middle stage (wrk_coll_group_layout) */
    CH_CHECK_GOTO(make(coll, layout, layout.pp, WRK_COLL_GROUP_EMB, &g->emb), rc, fail);
    *out = g;
    return 0;
fail:
    eng_groups_destroy(g);
    return rc;
}

void eng_groups_destroy(eng_groups_t *g)
{
    if (g == NULL) {
        return;
    }
    wrk_coll_group_destroy(g->emb);
    wrk_coll_group_destroy(g->pp);
    wrk_coll_group_destroy(g->dp);
    wrk_coll_group_destroy(g->tp);
    free(g);
}
