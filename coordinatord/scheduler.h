/* FIFO scheduler: on every change (coord_changed), start queued jobs in submission order
 * while the head fits on the free slots of alive nodes; a head that does not fit blocks
 * the queue (no backfill, so a big job is never starved). Admission at submit checks
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
 * nodes even when idle. The message names the field. */
int coord_sched_admit(coord_t *c, const ch_jobspec_t *spec, char *err, size_t errlen);

#endif
