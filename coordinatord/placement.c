/* Placement of a job's ranks onto nodes; see placement.h for the rules. */
#include "placement.h"

#include <stdlib.h>
#include <string.h>

#include "common/err.h"

/* Rack index of every node (0..R-1 in order of first appearance); returns R. */
static uint32_t rack_ids(const coord_place_node_t *nodes, size_t n, uint32_t *rack)
{
    uint32_t r = 0;
    for (size_t i = 0; i < n; i++) {
        rack[i] = r;
        for (size_t j = 0; j < i; j++) {
            if (strcmp(nodes[i].rack ? nodes[i].rack : "", nodes[j].rack ? nodes[j].rack : "") ==
                0) {
                rack[i] = rack[j];
                break;
            }
        }
        if (rack[i] == r)
            r++;
    }
    return r;
}

/* First node of rack r (or of any rack when r == UINT32_MAX) with a free TP-group slot. */
static int64_t pick(const uint32_t *rack, const uint32_t *cap, size_t n, uint32_t r)
{
    for (size_t i = 0; i < n; i++)
        if (cap[i] > 0 && (r == UINT32_MAX || rack[i] == r))
            return (int64_t)i;
    return -1;
}

int coord_placement(ch_layout_t l, const coord_place_node_t *nodes, size_t n,
                    coord_place_rank_t *out)
{
    uint32_t world = ch_layout_world(l);
    uint32_t *rack = NULL, *cap = NULL, *local = NULL;
    uint64_t total = 0;
    int rc = 0;

    if (l.tp == 0 || l.pp == 0 || l.dp == 0 || !out)
        return -EINVAL;
    if (n == 0)
        return CH_E_CAPACITY;
    rack = calloc(n, sizeof(*rack));
    cap = calloc(n, sizeof(*cap));
    local = calloc(n, sizeof(*local));
    if (!rack || !cap || !local) {
        rc = -ENOMEM;
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        cap[i] = nodes[i].free_slots / l.tp; /* TP groups the node can hold */
        total += cap[i];
    }
    if (total < (uint64_t)l.pp * l.dp) {
        rc = CH_E_CAPACITY;
        goto out;
    }
    uint32_t nracks = rack_ids(nodes, n, rack);

    for (uint32_t s = 0; s < l.pp; s++) {
        for (uint32_t d = 0; d < l.dp; d++) {
            int64_t node = -1;
            for (uint32_t k = 0; k < nracks && node < 0; k++)
                node = pick(rack, cap, n, (s + k) % nracks);
            if (node < 0)
                node = pick(rack, cap, n, UINT32_MAX);
            if (node < 0) { /* unreachable: total capacity was checked */
                rc = CH_E_CAPACITY;
                goto out;
            }
            cap[node]--;
            for (uint32_t t = 0; t < l.tp; t++) {
                ch_coord_t c = {.tp = t, .dp = d, .pp = s};
                out[ch_layout_rank(l, c)].node = (uint32_t)node;
            }
        }
    }
    /* Local ranks ascend with the global rank on each node. */
    for (uint32_t r = 0; r < world; r++)
        out[r].local_rank = local[out[r].node]++;
out:
    free(local);
    free(cap);
    free(rack);
    return rc;
}

uint32_t coord_placement_local_world(const coord_place_rank_t *ranks, uint32_t world, uint32_t i)
{
    uint32_t k = 0;
    for (uint32_t r = 0; r < world; r++)
        k += ranks[r].node == i;
    return k;
}
