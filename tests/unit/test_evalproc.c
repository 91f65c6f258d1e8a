/* A checkpoint's evaluation runs in a child process (workerd/rank/evalproc.h): the rank's
 * polls never wait for it, one runs at a time, its figure is read when it ends, a failed
 * or overdue one gives none (and the overdue one is killed), and it holds none of the
 * rank's file descriptors. The child here is a shell script standing in for
 * `chorus-rank --evaluate`, so each case decides when it ends; the last case runs the real
 * chorus-rank child and kills the rank that spawned it. */
#include <criterion/criterion.h>
#include <libgen.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/err.h"
#include "common/util.h"
#include "support.h"
#include "workerd/rank/evalproc.h"

/* argv: EXE --evaluate DIR STEP OUT PARENT_PID. It notes who it is, fails for step 13,
 * and writes its figure only once DIR/go exists. */
static const char *const SCRIPT = "#!/bin/sh\n"
                                  "[ \"$1\" = --evaluate ] || exit 2\n"
                                  "echo \"$$ $5 $3\" > \"$2/pids.tmp\"\n"
                                  "mv \"$2/pids.tmp\" \"$2/pids\"\n"
                                  "[ \"$3\" = 13 ] && exit 1\n"
                                  "while [ ! -e \"$2/go\" ]; do sleep 0.01; done\n"
                                  "echo 0.75 > \"$4\"\n";

typedef struct fixture {
    char dir[512], exe[600], out[600];
} fixture_t;

static void setup(fixture_t *f)
{
    cr_assert_eq(ts_tmpdir("evalproc", f->dir, sizeof f->dir), 0);
    snprintf(f->exe, sizeof f->exe, "%s/child.sh", f->dir);
    snprintf(f->out, sizeof f->out, "%s/accuracy", f->dir);
    cr_assert_eq(ch_file_write_atomic(f->exe, SCRIPT, strlen(SCRIPT), 0755), 0);
}

/* Wait (at most 10 s) for the child to have written DIR/pids; its pid and the parent pid
 * it was given. */
static void child_pids(const fixture_t *f, long *child, long *parent)
{
    char path[700], *text = NULL;
    size_t len;
    snprintf(path, sizeof path, "%s/pids", f->dir);
    uint64_t deadline = ch_now_ms() + 10000;
    while (access(path, F_OK) != 0 && ch_now_ms() < deadline) {
        struct timespec ts = {0, 5000000L};
        nanosleep(&ts, NULL);
    }
    cr_assert_eq(ch_file_read(path, 256, &text, &len), 0, "the child never started");
    cr_assert_eq(sscanf(text, "%ld %ld", child, parent), 2, "pids: %s", text);
    free(text);
}

static void go(const fixture_t *f)
{
    char path[700];
    snprintf(path, sizeof path, "%s/go", f->dir);
    cr_assert_eq(ch_file_write_atomic(path, "", 0, 0644), 0);
}

Test(evalproc, polls_never_wait_and_the_figure_comes_when_the_child_ends)
{
    fixture_t f;
    wrk_evalproc_t e = {0};
    double acc = NAN;
    long child = 0, parent = 0;
    int pfd[2];
    setup(&f);
    cr_assert_eq(pipe(pfd), 0); /* a rank's link, say: the child must not hold it */
    cr_assert_eq(wrk_evalproc_start(&e, f.exe, f.dir, 10, f.out), 0);
    close(pfd[1]);
    cr_assert_gt(e.pid, 0);
    child_pids(&f, &child, &parent);
    cr_expect_eq(child, (long)e.pid);
    cr_expect_neq(child, (long)getpid(), "the evaluation runs in this process");
    cr_expect_eq(parent, (long)getpid(), "the child was not told its parent");

    /* it waits for `go`: every poll answers at once that it still runs */
    for (int i = 0; i < 5; i++)
        cr_assert_eq(wrk_evalproc_poll(&e, &acc), 0);
    cr_assert(isnan(acc));
    cr_assert_eq(kill(e.pid, 0), 0, "the child should still run");
    /* one at a time */
    cr_expect_eq(wrk_evalproc_start(&e, f.exe, f.dir, 20, f.out), -EBUSY);
    cr_expect_eq(e.step, 10u);
    /* the pipe's write end lives only here (closed): read sees EOF, not "writers left" */
    char b;
    fcntl(pfd[0], F_SETFL, O_NONBLOCK);
    cr_expect_eq(read(pfd[0], &b, 1), 0, "the child holds the rank's descriptors");
    close(pfd[0]);

    go(&f);
    cr_assert_eq(wrk_evalproc_wait(&e, 10000, &acc), 1);
    cr_expect_float_eq(acc, 0.75, 1e-12);
    cr_expect_eq(e.pid, 0);
    cr_expect_neq(access(f.out, F_OK), 0, "the figure file is read once and removed");
    cr_expect_eq(wrk_evalproc_poll(&e, &acc), 0, "none in flight");
    ts_rmrf(f.dir);
}

Test(evalproc, a_failed_child_gives_no_figure)
{
    fixture_t f;
    wrk_evalproc_t e = {0};
    double acc = NAN;
    setup(&f);
    cr_assert_eq(wrk_evalproc_start(&e, f.exe, f.dir, 13, f.out), 0);
    int rc = wrk_evalproc_wait(&e, 10000, &acc);
    cr_expect_eq(rc, CH_E_ABORTED, "wait: %s", ch_strerror(rc));
    cr_expect(isnan(acc));
    cr_expect_eq(e.pid, 0);
    /* and the next may start */
    go(&f);
    cr_assert_eq(wrk_evalproc_start(&e, f.exe, f.dir, 20, f.out), 0);
    cr_expect_eq(wrk_evalproc_wait(&e, 10000, &acc), 1);
    cr_expect_float_eq(acc, 0.75, 1e-12);
    ts_rmrf(f.dir);
}

Test(evalproc, an_overdue_child_is_killed)
{
    fixture_t f;
    wrk_evalproc_t e = {0};
    double acc = NAN;
    long child = 0, parent = 0;
    setup(&f);
    cr_assert_eq(wrk_evalproc_start(&e, f.exe, f.dir, 30, f.out), 0);
    child_pids(&f, &child, &parent); /* never told to go */
    cr_expect_eq(wrk_evalproc_wait(&e, 200, &acc), -ETIMEDOUT);
    cr_expect(isnan(acc));
    cr_expect_eq(e.pid, 0);
    cr_expect_eq(kill((pid_t)child, 0), -1, "the overdue child still runs");
    cr_expect_eq(errno, ESRCH);
    ts_rmrf(f.dir);
}

/* The real child (chorus-rank --evaluate), blocked reading its job file (a FIFO), dies by
 * SIGKILL when the process that spawned it is killed: it never outlives its rank. */
Test(evalproc, the_real_child_dies_with_its_rank)
{
    fixture_t f;
    char bin[600], fifo[700], mod[600];
    const char *m = getenv("CHORUS_CUDA_MODULE"); /* ctest names build/bin through it */
    if (!m || !*m)
        cr_skip_test("CHORUS_CUDA_MODULE unset: chorus-rank not located");
    snprintf(mod, sizeof mod, "%s", m);
    snprintf(bin, sizeof bin, "%s/chorus-rank", dirname(mod));
    if (access(bin, X_OK) != 0)
        cr_skip_test("%s not built", bin);
    setup(&f);
    snprintf(fifo, sizeof fifo, "%s/job.fifo", f.dir);
    cr_assert_eq(mkfifo(fifo, 0600), 0);
    const char *env[][2] = {{"RANK", "0"},
                            {"WORLD_SIZE", "1"},
                            {"LOCAL_RANK", "0"},
                            {"LOCAL_WORLD_SIZE", "1"},
                            {"CHORUS_JOB", "j1"},
                            {"CHORUS_GENERATION", "1"},
                            {"CHORUS_RESUME_STEP", "0"},
                            {"CHORUS_RUN_DIR", f.dir},
                            {"CHORUS_JOB_FILE", fifo}};
    for (size_t i = 0; i < sizeof env / sizeof env[0]; i++)
        cr_assert_eq(setenv(env[i][0], env[i][1], 1), 0);
    cr_assert_eq(prctl(PR_SET_CHILD_SUBREAPER, 1), 0); /* the orphan is reaped here */

    int p[2];
    cr_assert_eq(pipe(p), 0);
    pid_t rank = fork();
    cr_assert_geq(rank, 0);
    if (rank == 0) { /* the rank: spawn, say who, and wait to be killed */
        wrk_evalproc_t e = {0};
        if (wrk_evalproc_start(&e, bin, f.dir, 10, f.out) < 0)
            _exit(1);
        long pid = (long)e.pid;
        if (write(p[1], &pid, sizeof pid) != (ssize_t)sizeof pid)
            _exit(1);
        for (;;)
            pause();
    }
    close(p[1]);
    long child = 0;
    cr_assert_eq(read(p[0], &child, sizeof child), (ssize_t)sizeof child, "no child spawned");
    close(p[0]);

    /* the child opened its job file for reading: past its PR_SET_PDEATHSIG, now blocked */
    int w = -1;
    uint64_t deadline = ch_now_ms() + 10000;
    while ((w = open(fifo, O_WRONLY | O_NONBLOCK)) < 0 && errno == ENXIO &&
           ch_now_ms() < deadline) {
        struct timespec ts = {0, 5000000L};
        nanosleep(&ts, NULL);
    }
    cr_assert_geq(w, 0, "the child never read its job file");

    int st = 0;
    cr_assert_eq(kill(rank, SIGKILL), 0);
    cr_assert_eq(waitpid(rank, &st, 0), rank);
    pid_t got = 0;
    deadline = ch_now_ms() + 10000;
    while ((got = waitpid((pid_t)child, &st, WNOHANG)) == 0 && ch_now_ms() < deadline) {
        struct timespec ts = {0, 5000000L};
        nanosleep(&ts, NULL);
    }
    close(w);
    cr_assert_eq(got, (pid_t)child, "the child outlived its rank");
    cr_expect(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "the child ended otherwise (status %#x)",
              st);
    ts_rmrf(f.dir);
}
