/* Runs at the coordinator (common/run.h): the submit-time check of a train job against
 * the filesystem, as the job's user, and the run id stamped into its job file; and
 * checkpoint requests (chorusctl checkpoint, SIGUSR1) relayed to a job's ranks. */
#ifndef COORD_RUNS_H
#define COORD_RUNS_H

#include <stddef.h>

#include "common/jobspec.h"

typedef struct coord coord_t;
typedef struct coord_job coord_job_t;

/* Check spec as its run-as user (a child process takes that uid and gid when the
 * coordinator runs as root; otherwise the check runs as the coordinator's own user), refuse
 * a checkpoint folder another active job of this coordinator writes, and stamp
 * checkpoint.run_id: the run continued, else a new one. CH_E_CONFIG or -EACCES with
 * "field: reason" in err. */
int coord_runs_stamp(coord_t *c, ch_jobspec_t *spec, char *err, size_t errlen);

/* Ask j's ranks of its current generation to commit a checkpoint at the step they run
 * next (CheckpointRanks to every node holding one). CH_E_STATE (err set) when j is not
 * running or has no checkpoint.dir. */
int coord_runs_checkpoint(coord_t *c, coord_job_t *j, char *err, size_t errlen);
/* SIGUSR1: a checkpoint of every running train job with checkpoint.dir. */
void coord_runs_checkpoint_all(coord_t *c);

#endif
