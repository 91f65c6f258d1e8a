/* A job's run folders: run_dir/<job>/g<generation>/, one per generation started here. */
#ifndef WRK_RUNDIR_H
#define WRK_RUNDIR_H

#include <stddef.h>
#include <stdint.h>

/* 1 when job id s may name a folder (it cannot leave run_dir), else 0. */
int wrk_rundir_safe_name(const char *s);
/* run_dir/job/g<gen> into out; -ENAMETOOLONG when it does not fit. */
int wrk_rundir_gen(const char *run_dir, const char *job, uint64_t gen, char *out, size_t len);
/* Generation gen of job starts here: remove the run folders of its generations before it
 * but the newest few (their logs say why they failed). */
void wrk_rundir_prune(const char *run_dir, const char *job, uint64_t gen);

#endif
