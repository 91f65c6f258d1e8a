/* workerd/proc: rank processes get the rank environment, fd 3, a log file, their own
 * process group, and their exit is reported with its code or signal. The tests spawn
 * /bin/sh through the exe/argv override instead of workerd --rank. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <uv.h>

#include "common/util.h"
#include "support.h"
#include "workerd/proc.h"

typedef struct outcome {
    int done, code, sig;
} outcome_t;

static void on_exit_cb(wrk_proc_t *p, int code, int sig, void *ud)
{
    outcome_t *o = ud;
    (void)p;
    o->done = 1;
    o->code = code;
    o->sig = sig;
}

static void tick(uv_timer_t *t)
{
    (void)t;
}

/* Run the loop until *flag is set or ms pass. */
static void run_until(uv_loop_t *loop, const int *flag, int ms)
{
    uv_timer_t t;
    uv_timer_init(loop, &t);
    uv_timer_start(&t, tick, 10, 10);
    uint64_t deadline = ch_now_ms() + (uint64_t)ms;
    while (!*flag && ch_now_ms() < deadline)
        uv_run(loop, UV_RUN_ONCE);
    uv_close((uv_handle_t *)&t, NULL);
    uv_run(loop, UV_RUN_NOWAIT);
}

static char tmpdir[512];

static void setup(void)
{
    cr_assert_eq(ts_tmpdir("test_proc", tmpdir, sizeof tmpdir), 0);
}

static void teardown(void)
{
    cr_expect_eq(ts_rmrf(tmpdir), 0);
}

TestSuite(proc, .init = setup, .fini = teardown, .timeout = 30);

static wrk_proc_spec_t sh_spec(char *const *argv, const char *log)
{
    wrk_proc_spec_t s = {
        .exe = "/bin/sh",
        .argv = argv,
        .job_id = "job-42",
        .generation = 3,
        .rank = 5,
        .world_size = 8,
        .local_rank = 1,
        .local_world = 4,
        .resume_step = 200,
        .device = CH_DEVICE_CUDA,
        .threads = 3,
        .job_file = "/x/job.ini",
        .run_dir = "/x/rank-5/",
        .log_path = log,
    };
    return s;
}

/* Spawn s, wait for the exit, release; returns the outcome. */
static outcome_t spawn_spec_and_wait(const wrk_proc_spec_t *s)
{
    uv_loop_t loop;
    outcome_t o = {0, -1, -1};
    wrk_proc_t *p = NULL;
    int fd = -1;
    cr_assert_eq(uv_loop_init(&loop), 0);
    cr_assert_eq(wrk_proc_spawn(&loop, s, on_exit_cb, &o, &p, &fd), 0);
    cr_assert_gt(wrk_proc_pid(p), 0);
    run_until(&loop, &o.done, 10000);
    cr_assert(o.done, "child did not exit in time");
    cr_assert(wrk_proc_exited(p));
    wrk_proc_close(p);
    close(fd);
    uv_run(&loop, UV_RUN_DEFAULT);
    cr_assert_eq(uv_loop_close(&loop), 0, "handles left open");
    return o;
}

static outcome_t spawn_and_wait(char *const *argv, const char *log)
{
    wrk_proc_spec_t s = sh_spec(argv, log);
    return spawn_spec_and_wait(&s);
}

Test(proc, rank_environment_and_log)
{
    char log[600], expect[256];
    snprintf(log, sizeof log, "%s/rank-5.log", tmpdir);
    setenv("NOTIFY_SOCKET", "/run/systemd/notify", 1);
    setenv("CHORUS_TEST_INHERITED", "yes", 1);
    char *argv[] = {
        "sh", "-c",
        "echo \"$RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $CHORUS_JOB "
        "$CHORUS_GENERATION $CHORUS_RESUME_STEP $CHORUS_JOB_FILE $CHORUS_RUN_DIR "
        "$OPENBLAS_NUM_THREADS $OMP_NUM_THREADS $CHORUS_PARENT_PID "
        "${NOTIFY_SOCKET-unset} $CHORUS_TEST_INHERITED $CHORUS_DEVICE $CHORUS_THREADS\"; "
        "echo on-stderr >&2",
        NULL};
    outcome_t o = spawn_and_wait(argv, log);
    unsetenv("NOTIFY_SOCKET");
    cr_expect_eq(o.code, 0);
    cr_expect_eq(o.sig, 0);

    char *text = NULL;
    size_t len = 0;
    cr_assert_eq(ch_file_read(log, 4096, &text, &len), 0);
    snprintf(expect, sizeof expect,
             "5 8 1 4 job-42 3 200 /x/job.ini /x/rank-5/ 1 1 %d unset yes cuda 3\non-stderr\n",
             (int)getpid());
    cr_expect_str_eq(text, expect);
    free(text);
}

/* In-memory checkpoints: the node's memory dir and name reach the rank; without them, what
 * workerd's own environment holds under those names does not. */
Test(proc, memory_dir_and_node_reach_the_rank_only_when_given)
{
    char log[600];
    char *argv[] = {"sh", "-c", "echo \"${CHORUS_MEMORY_DIR-unset} ${CHORUS_NODE-unset}\"", NULL};
    setenv("CHORUS_MEMORY_DIR", "/inherited", 1);
    setenv("CHORUS_NODE", "inherited", 1);
    for (int given = 0; given < 2; given++) {
        snprintf(log, sizeof log, "%s/mem-%d.log", tmpdir, given);
        wrk_proc_spec_t s = sh_spec(argv, log);
        if (given) {
            s.memory_dir = "/dev/shm/chorus";
            s.node = "n7";
        }
        outcome_t o = spawn_spec_and_wait(&s);
        cr_expect_eq(o.code, 0);
        char *text = NULL;
        size_t len = 0;
        cr_assert_eq(ch_file_read(log, 4096, &text, &len), 0);
        cr_expect_str_eq(text, given ? "/dev/shm/chorus n7\n" : "unset unset\n");
        free(text);
    }
    unsetenv("CHORUS_MEMORY_DIR");
    unsetenv("CHORUS_NODE");
}

Test(proc, exit_code_reported)
{
    char log[600];
    snprintf(log, sizeof log, "%s/exit.log", tmpdir);
    char *argv[] = {"sh", "-c", "exit 7", NULL};
    outcome_t o = spawn_and_wait(argv, log);
    cr_expect_eq(o.code, 7);
    cr_expect_eq(o.sig, 0);
}

Test(proc, signal_reported)
{
    char log[600];
    snprintf(log, sizeof log, "%s/sig.log", tmpdir);
    char *argv[] = {"sh", "-c", "kill -SEGV $$", NULL};
    outcome_t o = spawn_and_wait(argv, log);
    cr_expect_eq(o.sig, SIGSEGV);
    cr_expect_eq(o.code, 0);
}

/* 1 when pid is gone or a zombie (a zombie left to a non-reaping init still counts). */
static int dead(int pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *rp = strrchr(buf, ')');
    return rp && rp[1] == ' ' && (rp[2] == 'Z' || rp[2] == 'X');
}

Test(proc, kill_takes_the_group_and_fd3_is_the_link)
{
    uv_loop_t loop;
    outcome_t o = {0, -1, -1};
    wrk_proc_t *p = NULL;
    int fd = -1;
    char log[600], buf[64] = "";
    snprintf(log, sizeof log, "%s/group.log", tmpdir);
    /* The rank starts a helper and tells us its pid over fd 3. */
    char *argv[] = {"sh", "-c", "sleep 60 & echo $! >&3; wait", NULL};
    cr_assert_eq(uv_loop_init(&loop), 0);
    wrk_proc_spec_t s = sh_spec(argv, log);
    cr_assert_eq(wrk_proc_spawn(&loop, &s, on_exit_cb, &o, &p, &fd), 0);

    ssize_t n = 0;
    for (int tries = 0; tries < 500 && !strchr(buf, '\n'); tries++) {
        ssize_t k = read(fd, buf + n, sizeof buf - 1 - (size_t)n);
        cr_assert_gt(k, 0, "no pid on fd 3");
        n += k;
        buf[n] = '\0';
    }
    int helper = atoi(buf);
    cr_assert_gt(helper, 0);
    cr_expect_eq(getpgid(wrk_proc_pid(p)), wrk_proc_pid(p), "rank leads its own group");
    cr_expect_eq(getpgid(helper), wrk_proc_pid(p), "helper in the rank's group");

    cr_assert_eq(wrk_proc_kill(p, SIGKILL), 0);
    run_until(&loop, &o.done, 10000);
    cr_assert(o.done);
    cr_expect_eq(o.sig, SIGKILL);
    cr_expect_eq(wrk_proc_kill(p, SIGKILL), -ESRCH);
    for (int i = 0; i < 200 && !dead(helper); i++)
        usleep(10000);
    cr_expect(dead(helper), "helper %d survived the group kill", helper);

    wrk_proc_close(p);
    close(fd);
    uv_run(&loop, UV_RUN_DEFAULT);
    cr_assert_eq(uv_loop_close(&loop), 0);
}

Test(proc, close_while_running_kills_and_reaps)
{
    uv_loop_t loop;
    outcome_t o = {0, -1, -1};
    wrk_proc_t *p = NULL;
    int fd = -1;
    char log[600];
    snprintf(log, sizeof log, "%s/close.log", tmpdir);
    char *argv[] = {"sh", "-c", "exec sleep 60", NULL};
    cr_assert_eq(uv_loop_init(&loop), 0);
    wrk_proc_spec_t s = sh_spec(argv, log);
    cr_assert_eq(wrk_proc_spawn(&loop, &s, on_exit_cb, &o, &p, &fd), 0);
    int pid = wrk_proc_pid(p);
    wrk_proc_close(p);
    /* The loop ends only once the child is reaped and the handle closed. */
    uv_run(&loop, UV_RUN_DEFAULT);
    cr_expect_not(o.done, "no exit callback after close");
    cr_expect(dead(pid));
    close(fd);
    cr_assert_eq(uv_loop_close(&loop), 0);
}

Test(proc, spawn_failure_leaves_nothing)
{
    uv_loop_t loop;
    outcome_t o = {0, -1, -1};
    wrk_proc_t *p = NULL;
    int fd = -1;
    char log[600];
    snprintf(log, sizeof log, "%s/none.log", tmpdir);
    cr_assert_eq(uv_loop_init(&loop), 0);
    wrk_proc_spec_t s = sh_spec(NULL, log);
    s.exe = "/nonexistent/chorus-rank";
    cr_expect_lt(wrk_proc_spawn(&loop, &s, on_exit_cb, &o, &p, &fd), 0);
    cr_expect_eq(fd, -1);
    s.exe = "/bin/sh";
    s.log_path = "/nonexistent/dir/rank.log";
    cr_expect_eq(wrk_proc_spawn(&loop, &s, on_exit_cb, &o, &p, &fd), -ENOENT);
    uv_run(&loop, UV_RUN_DEFAULT);
    cr_assert_eq(uv_loop_close(&loop), 0);
}

/* Issue 11 class 5: a rank runs as its job's user ([job] run_uid / run_gid), in a run
 * dir it owns, with no supplementary groups of workerd's. */
Test(proc, rank_runs_as_the_jobs_user)
{
    if (geteuid() != 0)
        cr_skip_test("needs root to switch users");
    if (ts_tmp_reachable_by(65534, 65534) < 0)
        cr_skip_test("uid 65534 can reach neither $CHORUS_TEST_TMP nor /tmp");
    teardown(); /* start again where uid 65534 can reach the run dir */
    setup();
    char log[600], job[600], rdir[600];
    snprintf(log, sizeof log, "%s/rank-7.log", tmpdir);
    snprintf(job, sizeof job, "%s/job.ini", tmpdir);
    snprintf(rdir, sizeof rdir, "%s/rank-7", tmpdir);
    cr_assert_eq(chmod(tmpdir, 0755), 0); /* as workerd's run dir: others may traverse it */
    cr_assert_eq(ch_file_write_atomic(job, "[job]\nrun_uid = 65534\nrun_gid = 65534\n", 37, 0644),
                 0);
    char *argv[] = {"sh", "-c", "echo id=$(id -u):$(id -g):$(id -G); touch \"$CHORUS_RUN_DIR/ok\"",
                    NULL};
    uv_loop_t loop;
    outcome_t o = {0, -1, -1};
    wrk_proc_t *p = NULL;
    int fd = -1;
    cr_assert_eq(uv_loop_init(&loop), 0);
    wrk_proc_spec_t s = sh_spec(argv, log);
    s.job_file = job;
    s.run_dir = rdir;
    cr_assert_eq(wrk_proc_spawn(&loop, &s, on_exit_cb, &o, &p, &fd), 0);
    run_until(&loop, &o.done, 10000);
    cr_assert(o.done);
    wrk_proc_close(p);
    close(fd);
    uv_run(&loop, UV_RUN_DEFAULT);
    cr_assert_eq(uv_loop_close(&loop), 0);
    cr_assert_eq(o.code, 0, "the rank could not write its run dir");
    char *text = NULL;
    size_t len = 0;
    cr_assert_eq(ch_file_read(log, 1 << 16, &text, &len), 0);
    cr_assert(strstr(text, "id=65534:65534:65534\n"), "%s", text);
    free(text);
}

/* Open path as uid (group 65534, no others) in a child: 0 or the errno it met. */
static int open_as(uid_t uid, const char *path)
{
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        if (setgroups(0, NULL) < 0 || setgid(65534) < 0 || setuid(uid) < 0)
            _exit(120);
        int fd = open(path, O_RDONLY);
        _exit(fd >= 0 ? 0 : errno);
    }
    int st = 0;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) != 120);
    return WEXITSTATUS(st);
}

/* A generation's folder, job file and rank log are the job's user's alone (0700, 0600,
 * owned by it): another user reads neither the job's text nor its log, while workerd
 * (root) still manages them. Set up in a scratch folder under /tmp that the other users
 * can traverse, whatever the build tree's permissions. */
Test(proc, job_folder_and_log_are_the_jobs_users_alone)
{
    if (geteuid() != 0)
        cr_skip_test("needs root to switch users");
    char base[] = "/tmp/chorus-proc.XXXXXX", gdir[64], job[96], log[96];
    cr_assert_not_null(mkdtemp(base));
    cr_assert_eq(chmod(base, 0755), 0);
    snprintf(gdir, sizeof gdir, "%s/g1", base);
    snprintf(job, sizeof job, "%s/job.ini", gdir);
    snprintf(log, sizeof log, "%s/rank-0.log", gdir);
    cr_assert_eq(mkdir(gdir, 0755), 0);
    const char ini[] = "[job]\nrun_uid = 60001\nrun_gid = 65534\n";
    cr_assert_eq(ch_file_write_atomic(job, ini, sizeof ini - 1, 0644), 0);
    cr_assert_eq(wrk_proc_give_dir(job, gdir), 0);

    char *argv[] = {"sh", "-c", "echo secret", NULL};
    wrk_proc_spec_t s = sh_spec(argv, log);
    s.job_file = job;
    s.run_dir = NULL;
    cr_assert_eq(spawn_spec_and_wait(&s).code, 0);

    struct stat st;
    cr_assert_eq(stat(gdir, &st), 0);
    cr_assert_eq(st.st_mode & 0777, 0700);
    cr_assert_eq(st.st_uid, 60001);
    const char *files[] = {job, log};
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(stat(files[i], &st), 0);
        cr_assert_eq(st.st_mode & 0777, 0600, "%s: mode %o", files[i], st.st_mode & 0777);
        cr_assert_eq(st.st_uid, 60001, "%s: owner %u", files[i], (unsigned)st.st_uid);
        cr_assert_eq(open_as(60002, files[i]), EACCES, "another user opened %s", files[i]);
        cr_assert_eq(open_as(60001, files[i]), 0, "the job's user cannot open %s", files[i]);
    }
    cr_assert_eq(ts_rmrf(base), 0);
}
