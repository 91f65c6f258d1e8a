/* workerd's record of its ranks (WRK_ADOPT_FILE in the run dir): one line per rank process
 * alive (pid, its start time, job, generation, rank, launch token), rewritten atomically
 * whenever a rank starts or is reaped. A workerd that starts reads what the previous one
 * left and tells which of those ranks are still running: pid AND start time (from
 * /proc/PID/stat) must match, so a pid the kernel has since given to another process is
 * never taken for the rank.
 *
 * A rank found alive at start that was started to outlive its workerd (keep) is
 * re-adopted (agent_adopt.c): the new workerd lists it in its
 * Register, takes its redial on the run dir's agent.sock when the peer's pid
 * (SO_PEERCRED) is the recorded one, and watches it by polling this check, since it is
 * not its child (so only its RANK_DONE tells success). A workerd that cannot listen
 * there kills such ranks instead (wrk_adopt_kill), as it does a rank that was to
 * die with its workerd and is still dying, and the coordinator restarts their job as for
 * any lost rank. */
#ifndef WRK_ADOPT_H
#define WRK_ADOPT_H

#include <stddef.h>
#include <stdint.h>

#define WRK_ADOPT_FILE "ranks.state"
#define WRK_ADOPT_LOCK "ranks.lock"
#define WRK_ADOPT_MAX  4096 /* lines read; the rest are ignored */

typedef struct wrk_adopt_rank {
    int pid;
    uint64_t start_ticks; /* field 22 of /proc/PID/stat when it was recorded */
    char job_id[64];
    uint64_t gen, token;
    uint32_t rank;
    int keep; /* it outlives its workerd and redials (workerd --keep-ranks): re-adoptable */
} wrk_adopt_rank_t;

/* Take the run dir's record for this workerd: an exclusive flock on WRK_ADOPT_LOCK in
 * run_dir, held by the returned descriptor (close-on-exec, so ranks do not hold it) until
 * it is closed or the process ends. -EBUSY when another live workerd holds it: two
 * workerds sharing a run dir must not take each other's ranks for leftovers. */
int wrk_adopt_lock(const char *run_dir);

/* Kill a rank a previous workerd left (its process group, else the pid), logging why. */
void wrk_adopt_kill(const wrk_adopt_rank_t *r);
/* Record v[0..n) as the ranks alive (atomically: the file is either the old or the new
 * list). 0 or a negative code. */
int wrk_adopt_save(const char *path, const wrk_adopt_rank_t *v, size_t n);
/* wrk_adopt_save to WRK_ADOPT_FILE in run_dir, logging a failure: the record helps the
 * next start; it does not stop this one. */
void wrk_adopt_record(const char *run_dir, const wrk_adopt_rank_t *v, size_t n);
/* Read what wrk_adopt_save wrote; a line that does not parse is skipped. *out is
 * malloc'd (NULL when n is 0). A missing file is 0 entries. 0 or a negative code. */
int wrk_adopt_load(const char *path, wrk_adopt_rank_t **out, size_t *n);
/* 1 when r's process is still the one recorded (same pid, same start time) and not a
 * zombie (an adopted rank is reaped by whoever inherited it), else 0. */
int wrk_adopt_alive(const wrk_adopt_rank_t *r);
/* At start: kill (SIGKILL, the whole process group) every recorded rank still alive, then
 * empty the record. *found: how many were alive. 0 or a negative code (the record could
 * not be read; nothing is killed). */
int wrk_adopt_reap(const char *path, unsigned *found);

/* What a workerd does at start with its run dir: take the record (wrk_adopt_lock) and
 * read which of its ranks are alive, logging what fails. The lock's descriptor (keep it
 * open while recording), or -1 when the record is not this workerd's to keep (another
 * holds it, or the run dir refuses). *alive (malloc'd, NULL when *n is 0): the ranks a
 * previous workerd left running. */
int wrk_adopt_start(const char *run_dir, wrk_adopt_rank_t **alive, size_t *n);

#endif
