/* In-memory peer checkpoints (checkpoint.memory_every; DESIGN §8, §9): each rank keeps its
 * latest state in its node's memory and a copy on a rank of another node, and a restart
 * resumes from the newest step complete across the ranks' nodes before it reads the disk.
 * See memckpt.c for the theory of operation. */
#ifndef WRK_MEMCKPT_H
#define WRK_MEMCKPT_H

#include <stddef.h>
#include <stdint.h>

#include "common/plan.h"
#include "workerd/coll/coll.h"
#include "workerd/engine/trainer.h"
#include "workerd/rank/rank.h"

/* Steps each path keeps (the newest whole one survives a rank killed while it writes the
 * next). Host memory per rank: this many copies of its own state and of its buddy's. */
#define WRK_MEMCKPT_KEEP CH_PLAN_MEMCKPT_KEEP

typedef struct wrk_memckpt wrk_memckpt_t;

/* The in-memory checkpoints of rank r, or *out = NULL (and 0) when they are off
 * (checkpoint.memory_every = 0, or workerd gave no memory dir). c: the job's collectives
 * context (NULL only for a world of one rank). Collective over the world when c is not NULL:
 * every rank calls it at the same point (it creates a world group and gathers the ranks'
 * nodes to pick this rank's buddy). Caller owns *out (wrk_memckpt_destroy, before c's
 * destroy). r is borrowed for the object's life. */
int wrk_memckpt_create(wrk_rank_t *r, wrk_coll_t *c, wrk_memckpt_t **out);
void wrk_memckpt_destroy(wrk_memckpt_t *m);

/* 1 when a memory checkpoint is due after `done` steps (m may be NULL: 0). */
int wrk_memckpt_due(const wrk_memckpt_t *m, uint64_t done);

/* Save this rank's state at t's current step into its node's memory and exchange the
 * copies with the buddies. Collective over the world. err names what failed. */
int wrk_memckpt_save(wrk_memckpt_t *m, eng_trainer_t *t, char *err, size_t errlen);

/* Restore t from the newest step complete in memory across the ranks' nodes, when that
 * step is at least min_step (the coordinator's committed disk step; 0: none): states
 * missing on a rank's node come from the rank of the lowest number whose node holds them.
 * *step: the step restored, or 0 when memory has none new enough (t untouched; the caller
 * reads the disk). Collective over the world. An error after t was partly filled is
 * reported as such (the caller must not carry on with t). */
int wrk_memckpt_restore(wrk_memckpt_t *m, eng_trainer_t *t, uint64_t min_step, uint64_t *step,
                        char *err, size_t errlen);

#endif
