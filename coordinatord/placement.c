/* Placement of a job's ranks onto nodes; see placement.h for the rules. */
#include "placement.h"

#include <stdlib.h>
#include <string.h>

#include "common/err.h"

/* FNV-1a of a rack label, for the rack table. */
static uint64_t hash_str(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return h;
}

/* Rack index of every node (0..R-1 in order of first appearance); returns R, or 0 when
 * out of memory. An open-addressing table over the labels: O(n) expected. */
static uint32_t rack_ids(const coord_place_node_t *nodes, size_t n, uint32_t *rack)
{
    size_t cap = 16;
    while (cap < 2 * n)
        cap *= 2;
    int64_t *slot = malloc(cap * sizeof(*slot)); /* node index of the label's first node */
    if (!slot)
        return 0;
    for (size_t k = 0; k < cap; k++)
        slot[k] = -1;
    uint32_t r = 0;
    for (size_t i = 0; i < n; i++) {
        const char *label = nodes[i].rack ? nodes[i].rack : "";
        size_t k = hash_str(label) & (cap - 1);
        while (slot[k] >= 0) {
            const char *other = nodes[slot[k]].rack ? nodes[slot[k]].rack : "";
            if (strcmp(label, other) == 0)
                break;
            k = (k + 1) & (cap - 1);
        }
        if (slot[k] < 0) {
            slot[k] = (int64_t)i;
            rack[i] = r++;
        } else {
            rack[i] = rack[slot[k]];
        }
    }
    free(slot);
    return r;
}

int coord_placement(ch_layout_t l, const coord_place_node_t *nodes, size_t n,
                    coord_place_rank_t *out)
{
    uint32_t world = ch_layout_world(l);
    uint32_t *rack = NULL, *cap = NULL, *local = NULL, *order = NULL, *first = NULL, *cur = NULL;
    uint32_t any = 0; /* cursor over all nodes, for when every preferred rack is full */
    uint64_t total = 0;
    int rc = 0;

    if (l.tp == 0 || l.pp == 0 || l.dp == 0 || !out)
        return -EINVAL;
    if (n == 0)
        return CH_E_CAPACITY;
    rack = calloc(n, sizeof(*rack));
    cap = calloc(n, sizeof(*cap));
    local = calloc(n, sizeof(*local));
    order = calloc(n, sizeof(*order));
    if (!rack || !cap || !local || !order) {
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
    first = calloc((size_t)nracks + 1, sizeof(*first));
    cur = calloc((size_t)nracks + 1, sizeof(*cur));
    if (nracks == 0 || !first || !cur) {
        rc = -ENOMEM;
        goto out;
    }
    /* Nodes grouped by rack, in array order within a rack (counting sort); cur[r] is the
     * first node of rack r that may still have room, so each node is passed over once. */
    for (size_t i = 0; i < n; i++)
        first[rack[i] + 1]++;
    for (uint32_t r = 0; r < nracks; r++)
        first[r + 1] += first[r];
    memcpy(cur, first, (size_t)nracks * sizeof(*cur));
    for (size_t i = 0; i < n; i++)
        order[cur[rack[i]]++] = (uint32_t)i;
    memcpy(cur, first, (size_t)nracks * sizeof(*cur));

    for (uint32_t s = 0; s < l.pp; s++) {
        for (uint32_t d = 0; d < l.dp; d++) {
            int64_t node = -1;
            /* Racks that are full are skipped in O(1) each: at most R per group, and
             * R <= n; in practice the preferred rack or the next has room. */
            for (uint32_t k = 0; k < nracks && node < 0; k++) {
                uint32_t r = (s + k) % nracks;
                while (cur[r] < first[r + 1] && cap[order[cur[r]]] == 0)
                    cur[r]++;
                if (cur[r] < first[r + 1])
                    node = order[cur[r]];
            }
            while (node < 0 && any < n) { /* unreachable with racks, kept for safety */
                if (cap[any] > 0)
                    node = any;
                else
                    any++;
            }
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
    free(cur);
    free(first);
    free(order);
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
