/* A committed checkpoint's accuracy, evaluated by a child process (evalproc.h): the
 * spawn, poll and bounded wait in the rank, and the child's work. */
#include "workerd/rank/evalproc.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/err.h"
#include "common/log.h"
#include "common/util.h"
#include "kernels/matmul.h"
#include "workerd/engine/corpus.h"
#include "workerd/engine/export.h"
#include "workerd/engine/trainer.h"

#define EVAL_PROMPTS 64
#define EVAL_SHOWN   3
/* "eval": its own draw of sums, not the corpus's sequence of lines; with 90 x 90
 * possible sums the corpus holds them all, so this measures whether the model has
 * learned to answer them, not whether it generalises beyond them. */
#define EVAL_SEED    0x6576616cull
#define WAIT_POLL_MS 10
#define SCRATCH_EXT  ".safetensors" /* the child's export: OUT + this */

extern char **environ;

// ----------------------------------------------------------------------------
// the rank's side

int wrk_evalproc_start(wrk_evalproc_t *e, const char *exe, const char *dir, uint64_t step,
                       const char *out)
{
    char step_s[24], ppid_s[24];
    posix_spawn_file_actions_t fa;
    if (e->pid > 0)
        return -EBUSY;
    if (strlen(out) >= sizeof e->out)
        return -ENAMETOOLONG;
    snprintf(step_s, sizeof step_s, "%" PRIu64, step);
    snprintf(ppid_s, sizeof ppid_s, "%ld", (long)getpid());
    char *argv[] = {(char *)exe, WRK_EVAL_ARG, (char *)dir, step_s, (char *)out, ppid_s, NULL};
    unlink(out); /* a stale figure is never read as this step's */
    int rc = posix_spawn_file_actions_init(&fa);
    if (rc != 0)
        return -rc;
    /* the child holds none of the rank's links: a dead rank's peers see its sockets close */
    rc = posix_spawn_file_actions_addclosefrom_np(&fa, 3);
    pid_t pid = 0;
    if (rc == 0)
        rc = posix_spawn(&pid, exe, &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0)
        return -rc;
    e->pid = pid;
    e->step = step;
    memcpy(e->out, out, strlen(out) + 1);
    return 0;
}

/* The accuracy the child wrote to e->out. */
static int read_result(const wrk_evalproc_t *e, double *acc)
{
    char *text = NULL, *end = NULL;
    size_t len = 0;
    int rc = ch_file_read(e->out, 64, &text, &len);
    if (rc < 0)
        return rc;
    double v = strtod(text, &end);
    rc = end != text && isfinite(v) && v >= 0 && v <= 1 ? 1 : CH_E_FRAME;
    free(text);
    if (rc == 1)
        *acc = v;
    unlink(e->out);
    return rc;
}

/* The child ended with status st: its result or why there is none. */
static int reaped(wrk_evalproc_t *e, int st, double *acc)
{
    int rc;
    if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
        rc = read_result(e, acc);
    else if (WIFSIGNALED(st))
        rc = -ECANCELED; /* killed: no figure */
    else
        rc = CH_E_ABORTED; /* it logged why */
    e->pid = 0;
    return rc;
}

int wrk_evalproc_poll(wrk_evalproc_t *e, double *acc)
{
    int st = 0;
    if (e->pid <= 0)
        return 0;
    pid_t w = waitpid(e->pid, &st, WNOHANG);
    if (w == 0)
        return 0;
    if (w < 0) {
        int rc = -errno;
        if (rc == -EINTR)
            return 0;
        e->pid = 0; /* not our child any more: nothing to wait for */
        return rc;
    }
    return reaped(e, st, acc);
}

int wrk_evalproc_wait(wrk_evalproc_t *e, int timeout_ms, double *acc)
{
    uint64_t deadline = ch_now_ms() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 0);
    while (e->pid > 0) {
        int rc = wrk_evalproc_poll(e, acc);
        if (rc != 0 || e->pid <= 0)
            return rc;
        if (ch_now_ms() >= deadline) {
            wrk_evalproc_kill(e);
            return -ETIMEDOUT;
        }
        struct timespec ts = {0, WAIT_POLL_MS * 1000000L};
        nanosleep(&ts, NULL);
    }
    return 0;
}

void wrk_evalproc_kill(wrk_evalproc_t *e)
{
    char scratch[CH_PATH_LEN + 16];
    int st;
    if (e->pid <= 0)
        return;
    kill(e->pid, SIGKILL);
    while (waitpid(e->pid, &st, 0) < 0 && errno == EINTR)
        ;
    e->pid = 0;
    unlink(e->out); /* and what the killed child may have left (wrk_eval_child's names) */
    snprintf(scratch, sizeof scratch, "%s" SCRATCH_EXT, e->out);
    unlink(scratch);
}

// ----------------------------------------------------------------------------
// the evaluation (the rank's live model, or the child's copy of a checkpoint)

int wrk_eval_model(const wrk_rank_t *r, eng_model_t *model, uint64_t step, double *acc)
{
    eng_corpus_sample_t shown[EVAL_SHOWN];
    int rc = eng_corpus_eval(model, r->spec.parallel.micro_batch_size, EVAL_SEED, EVAL_PROMPTS, acc,
                             shown, EVAL_SHOWN);
    if (rc < 0)
        return rc;
    char line[256];
    size_t n = 0;
    for (int i = 0; i < EVAL_SHOWN && n < sizeof line; i++)
        n += (size_t)snprintf(line + n, sizeof line - n, "  %s %s", shown[i].text,
                              shown[i].correct ? "\u2713" : "\u2717");
    CH_LOGI("train", "job=%s gen=%" PRIu64 " rank=%u step=%" PRIu64 " accuracy=%.3f%s", r->job_id,
            r->generation, r->rank, step, *acc, line);
    return 0;
}

/* A sliced layout's forward pass is collective over groups the other ranks are not calling,
 * and a TP rank's logits are a vocab slice: the child exports the step (eng_export
 * consolidates any layout the checkpoint side supports) and evaluates a one-rank host copy. */
int wrk_eval_child(const wrk_rank_t *r, const char *dir, uint64_t step, const char *out, char *err,
                   size_t errlen)
{
    char file[CH_PATH_LEN], text[32];
    eng_trainer_t *t = NULL;
    double acc = NAN;
    kn_blas_set_threads(1); /* beside a rank that keeps its cores */
    int n = snprintf(file, sizeof file, "%s" SCRATCH_EXT, out);
    if (n < 0 || (size_t)n >= sizeof file)
        return ch_errf(err, errlen, -ENAMETOOLONG, "%s: path too long", out);
    int rc = eng_export(dir, file, err, errlen);
    if (rc < 0)
        return rc;
    ch_jobspec_t one = r->spec;
    one.parallel.tp = one.parallel.pp = one.parallel.dp = 1;
    one.parallel.microbatches = 1;
    one.train.device = CH_DEVICE_CPU; /* a host copy, whatever the job runs on */
    one.checkpoint.dir[0] = '\0';
    one.checkpoint.every = 0;
    one.train.resume[0] = '\0';
    memcpy(one.train.init_from, file, sizeof file);
    eng_trainer_opts_t opts = {.job_id = r->job_id, .peak_flops = 1};
    rc = eng_trainer_create(&one, &opts, &t, err, errlen);
    if (rc == 0)
        rc = eng_trainer_init_from(t, file, err, errlen);
    if (rc == 0 && (rc = wrk_eval_model(r, eng_trainer_model(t), step, &acc)) < 0)
        ch_errf(err, errlen, rc, "evaluation: %s", ch_strerror(rc));
    eng_trainer_destroy(t);
    unlink(file);
    if (rc < 0)
        return rc;
    n = snprintf(text, sizeof text, "%.17g\n", acc);
    if ((rc = ch_file_write_atomic(out, text, (size_t)n, 0644)) < 0)
        return ch_errf(err, errlen, rc, "%s: %s", out, ch_strerror(rc));
    return 0;
}
