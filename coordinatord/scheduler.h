/* Scheduler: on every change (coord_changed), start queued jobs in fairshare.h's order
 * (priority, each user's fair share of recent use, then submission) while the next one
 * fits on the free slots of alive nodes; one that does not fit blocks those behind it
 * (no backfill, so a big job is never starved). Admission at submit checks
 * the job could ever fit the cluster. (Named scheduler.h: a sched.h in this include
 * directory would shadow the system <sched.h>.) */
#ifndef COORD_SCHEDULER_H
#define COORD_SCHEDULER_H

#include <stddef.h>

#include "common/jobspec.h"

typedef struct coord coord_t;

void coord_sched_run(coord_t *c);
/* CH_E_CONFIG when a train job's vocab padded for tp overflows 32 bits; CH_E_CAPACITY
 * with a message when the job's layout cannot fit the slots of the cluster's non-dead
 * nodes even when idle, counting for a train job only the nodes whose memory / slots
 * holds one rank (common/plan.h's peak stage; a node that did not report its memory
 * counts). The message names the field ("model: needs 3.2 GiB per rank ..."). */
int coord_sched_admit(coord_t *c, const ch_jobspec_t *spec, char *err, size_t errlen);
/* Whether spec's layout fits the alive nodes were they idle (TP groups on one node, each
 * slot holding a rank's memory): a queued job that does not must not hold up the queue
 * (its nodes died after admission); a recovering elastic job that does not shrinks. */
int coord_sched_fits(coord_t *c, const ch_jobspec_t *spec);

#endif
