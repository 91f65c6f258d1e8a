/* The accuracy of a committed checkpoint, measured in a child process while the rank
 * trains on (train.c, sliced layouts and GPU models on the built-in corpus).
 *
 * Theory of operation. After a checkpoint commits, rank 0 spawns its own executable
 * (/proc/self/exe) as `EXE --evaluate STEP_DIR STEP OUT PARENT_PID`, with the rank's
 * environment (its identity and CHORUS_JOB_FILE). The child (wrk_rank_eval_main) arms
 * PR_SET_PDEATHSIG, exports the step into a one-rank host model, evaluates it on the CPU
 * with one thread, logs the sampled answers and writes the accuracy to OUT. The rank polls
 * for it between steps (waitpid WNOHANG) and reports what it read as the `accuracy`
 * metric. One child at a time: a checkpoint committed while one runs is not evaluated. */
#ifndef WRK_EVALPROC_H
#define WRK_EVALPROC_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "workerd/engine/model.h"
#include "workerd/rank/rank.h"

#define WRK_EVAL_ARG "--evaluate" /* argv[1] of the child */

/* One evaluation in flight (pid > 0) or none (pid 0). Zero-initialised is "none". */
typedef struct wrk_evalproc {
    pid_t pid;
    uint64_t step;         /* the step it evaluates */
    char out[CH_PATH_LEN]; /* where it writes the accuracy */
} wrk_evalproc_t;

/* Spawn `exe --evaluate dir step out <our pid>` (fds above 2 closed in the child).
 * 0 and e->pid set; -EBUSY while the previous child runs; a negative errno when the spawn
 * failed. */
int wrk_evalproc_start(wrk_evalproc_t *e, const char *exe, const char *dir, uint64_t step,
                       const char *out);

/* Never waits. 0: none in flight, or it still runs; 1: it finished and *acc holds its
 * accuracy; a negative code: it failed (exited non-zero or killed, or OUT unreadable).
 * After 1 or a code, none is in flight. */
int wrk_evalproc_poll(wrk_evalproc_t *e, double *acc);

/* wrk_evalproc_poll until the child ends, at most timeout_ms; then kill it (SIGKILL) and
 * reap it: -ETIMEDOUT. 0 when none was in flight. */
int wrk_evalproc_wait(wrk_evalproc_t *e, int timeout_ms, double *acc);

/* Kill and reap the child in flight, if any (a rank that fails does not wait for it). */
void wrk_evalproc_kill(wrk_evalproc_t *e);

/* Sampled answers and accuracy of model on the arithmetic corpus, logged as
 * "job=... step=N accuracy=A  <samples>"; fills *acc. */
int wrk_eval_model(const wrk_rank_t *r, eng_model_t *model, uint64_t step, double *acc);

/* The child's work: export the checkpoint step dir into a one-rank CPU trainer (one
 * thread), evaluate it (wrk_eval_model) and write the accuracy to out (atomically). */
int wrk_eval_child(const wrk_rank_t *r, const char *dir, uint64_t step, const char *out, char *err,
                   size_t errlen);

#endif
