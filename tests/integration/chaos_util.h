/* Helpers of the chaos tests (test_chaos.c, test_chaos_memory.c), which assert as they
 * wait: Criterion programs only (recovery_util.h is the part the benchmark shares). */
#ifndef CHAOS_UTIL_H
#define CHAOS_UTIL_H

#include <criterion/criterion.h>

#include "recovery_util.h"

/* The node (1-based index) that runs rank r of job id (world ranks) now. */
static inline int chaos_node_of(const h_cluster_t *c, const char *id, int r, size_t world)
{
    int node = rt_node_of(c, id, (uint32_t)r, world);
    cr_assert(node > 0, "job %s: no node for rank %d", id, r);
    return node;
}

/* Wait until the job runs generation >= gen and has gone `ahead` steps past from. */
static inline void chaos_wait_running(const h_cluster_t *c, const char *id, uint64_t gen,
                                      uint64_t from, int ahead, rt_job_t *w)
{
    cr_assert(rt_wait(w, c, id, "running", from + (uint64_t)ahead, gen, 60000),
              "job %s: %s gen %llu step %llu: %s", id, w->state, (unsigned long long)w->gen,
              (unsigned long long)w->step, w->reason);
}

#endif
