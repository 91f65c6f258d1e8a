/* Rank process supervision: spawn one rank process (chorus-rank, the binary next to
 * workerd, or any program, for tests) in its own process group and session, with the
 * torchrun-compatible environment, one end of a socketpair as fd 3 and stdout+stderr
 * appended to a log file; report its exit (code or signal) on the loop.
 *
 * By default the rank dies with workerd: it sets PR_SET_PDEATHSIG itself (rank.c) and
 * checks CHORUS_PARENT_PID against getppid() to close the race with a parent that died
 * before the prctl. With agent_sock set (workerd --keep-ranks) it outlives its workerd
 * instead: when the fd 3 link closes it redials that Unix socket for a grace, where the
 * next workerd re-adopts it (adopt.h), and exits when none answers. A kill goes to the whole
 * process group, so helpers a rank started die with it.
 *
 * A rank runs as its job's user: [job] run_uid / run_gid of job_file (the coordinator
 * writes them from the submitter's credentials). workerd as root switches to them (and
 * drops supplementary groups) and hands the rank its run_dir; a workerd that is not root
 * runs only ranks of its own uid (-EPERM otherwise). */
#ifndef WRK_PROC_H
#define WRK_PROC_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "common/device.h"

typedef struct wrk_proc wrk_proc_t;

#define WRK_RANK_EXE "chorus-rank"

/* The rank binary: WRK_RANK_EXE in the directory of the running executable. 0, or
 * -ENOENT / -EACCES when it is missing or not executable (path is filled either way),
 * -ENAMETOOLONG. */
int wrk_proc_rank_exe(char *path, size_t n);

/* A generation's folder and job file private to the job's user (its run_uid / run_gid):
 * dir 0700 and job_file 0600, given to that user when workerd is root and the job runs as
 * someone else, so other users read neither the job's text nor its logs while workerd,
 * as root, still manages them. 0 or a negative code. */
int wrk_proc_give_dir(const char *job_file, const char *dir);

typedef struct wrk_proc_spec {
    const char *exe;      /* the program (required): wrk_proc_rank_exe for a rank */
    char *const *argv;    /* NULL: {"chorus-rank", "JOB:gGEN:rRANK", NULL} */
    const char *job_id;   /* CHORUS_JOB */
    uint64_t generation;  /* CHORUS_GENERATION */
    uint32_t rank;        /* RANK */
    uint32_t world_size;  /* WORLD_SIZE */
    uint32_t local_rank;  /* LOCAL_RANK */
    uint32_t local_world; /* LOCAL_WORLD_SIZE */
    uint64_t resume_step;
    ch_device_t device; /* CHORUS_DEVICE */ /* CHORUS_RESUME_STEP */
    const char *job_file;                   /* CHORUS_JOB_FILE */
    uint32_t threads;                       /* CHORUS_THREADS when > 0 */
    const char *run_dir;    /* CHORUS_RUN_DIR: the rank's scratch dir (the rank makes it) */
    const char *log_path;   /* stdout+stderr, opened O_APPEND|O_CREAT, mode 0644 */
    const char *memory_dir; /* CHORUS_MEMORY_DIR: in-memory checkpoints; NULL: not set */
    const char *node;       /* CHORUS_NODE: the node's name; NULL: not set */
    const char *agent_sock; /* CHORUS_AGENT_SOCK: where to redial workerd; NULL: the rank
                             * dies with workerd (CHORUS_PARENT_PID) */
} wrk_proc_spec_t;

/* The process ended: exit_code when it exited, term_signal (> 0) when a signal killed
 * it. Runs once; the proc stays valid until wrk_proc_close. */
typedef void (*wrk_proc_exit_cb)(wrk_proc_t *p, int exit_code, int term_signal, void *ud);

/* Spawn. *link_fd receives workerd's end of the socketpair (the child has the other
 * as fd 3); the caller owns it (e.g. hands it to ch_conn_open_fd). On error nothing is
 * left behind. */
int wrk_proc_spawn(uv_loop_t *loop, const wrk_proc_spec_t *spec, wrk_proc_exit_cb cb, void *ud,
                   wrk_proc_t **out, int *link_fd);

int wrk_proc_pid(const wrk_proc_t *p);
int wrk_proc_exited(const wrk_proc_t *p);
/* Send sig to the process group (the rank and everything it started). 0, or -ESRCH
 * once it is gone. */
int wrk_proc_kill(wrk_proc_t *p, int sig);
/* Release. A process still running is killed (SIGKILL to its group) and reaped later;
 * the exit callback is not called after this. Memory goes in libuv's close callback. */
void wrk_proc_close(wrk_proc_t *p);
/* Release without killing: the process keeps running (a workerd that leaves its ranks to
 * the next one); nothing reaps it here and the exit callback is not called. */
void wrk_proc_release(wrk_proc_t *p);

#endif
