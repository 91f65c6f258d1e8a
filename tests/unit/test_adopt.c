/* workerd/adopt: the record of a workerd's ranks survives a round trip, tells a live rank
 * from a pid the kernel gave to another process (start time), and at start kills the
 * process group of each recorded rank still alive, leaving every other process alone. */
#include <criterion/criterion.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/procmetrics.h"
#include "common/util.h"
#include "support.h"
#include "workerd/adopt.h"

static char dir[512], path[600];

static void setup(void)
{
    cr_assert_eq(ts_tmpdir("adopt", dir, sizeof dir), 0);
    snprintf(path, sizeof path, "%s/%s", dir, WRK_ADOPT_FILE);
}

static void teardown(void)
{
    cr_expect_eq(ts_rmrf(dir), 0);
}

TestSuite(adopt, .init = setup, .fini = teardown, .timeout = 30);

/* A child that sleeps in its own process group, with a grandchild in the same group: a
 * rank and a helper it started. */
static pid_t sleeper(void)
{
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        setpgid(0, 0);
        if (fork() == 0)
            execl("/bin/sleep", "sleep", "60", (char *)NULL);
        execl("/bin/sleep", "sleep", "60", (char *)NULL);
        _exit(127);
    }
    setpgid(pid, pid); /* either side may win the race; both ask for the same */
    return pid;
}

static wrk_adopt_rank_t record_of(pid_t pid, const char *job, uint32_t rank)
{
    wrk_adopt_rank_t r = {.pid = pid, .gen = 3, .token = 0xfeedfacecafeULL, .rank = rank};
    ch_proc_stat_t st;
    cr_assert_eq(ch_proc_stat(pid, &st), 0);
    r.start_ticks = st.start_ticks;
    snprintf(r.job_id, sizeof r.job_id, "%s", job);
    return r;
}

Test(adopt, the_record_round_trips_and_a_missing_one_is_empty)
{
    wrk_adopt_rank_t *got = NULL;
    size_t n = 99;
    cr_expect_eq(wrk_adopt_load(path, &got, &n), 0);
    cr_expect_eq(n, 0);
    cr_expect_null(got);

    wrk_adopt_rank_t v[2] = {
        {.pid = 4242, .start_ticks = 123456789012ULL, .gen = 7, .token = UINT64_MAX, .rank = 5},
        {.pid = 77, .start_ticks = 1, .gen = 1, .token = 2, .rank = 0, .keep = 1}};
    snprintf(v[0].job_id, sizeof v[0].job_id, "j17");
    snprintf(v[1].job_id, sizeof v[1].job_id, "j18");
    cr_assert_eq(wrk_adopt_save(path, v, 2), 0);
    cr_assert_eq(wrk_adopt_load(path, &got, &n), 0);
    cr_assert_eq(n, 2);
    cr_expect_eq(memcmp(got, v, sizeof v), 0, "the record differs from what was saved");
    free(got);

    /* A damaged line is skipped, the rest read. */
    const char *text = "# c\n12 34 j1 1 0 9\ngarbage\n1 2 j2 3 4 5\n13 35 j3 1 1 9\n";
    cr_assert_eq(ch_file_write_atomic(path, text, strlen(text), 0600), 0);
    cr_assert_eq(wrk_adopt_load(path, &got, &n), 0);
    cr_assert_eq(n, 2, "pid 1 and the garbage line are not ranks");
    cr_expect_str_eq(got[0].job_id, "j1");
    cr_expect_str_eq(got[1].job_id, "j3");
    cr_expect_eq(got[0].keep, 0, "an older record (6 fields) is of ranks that die with workerd");
    free(got);
}

Test(adopt, a_live_rank_is_told_from_a_reused_pid)
{
    pid_t pid = sleeper();
    wrk_adopt_rank_t r = record_of(pid, "j1", 0);
    cr_expect_eq(wrk_adopt_alive(&r), 1);
    r.start_ticks++; /* the same pid, started at another time: another process */
    cr_expect_eq(wrk_adopt_alive(&r), 0);
    kill(-pid, SIGKILL);
    waitpid(pid, NULL, 0);
    r.start_ticks--;
    cr_expect_eq(wrk_adopt_alive(&r), 0, "a reaped rank is not alive");
}

Test(adopt, reap_kills_the_live_ranks_groups_and_nothing_else)
{
    pid_t live = sleeper(), other = sleeper();
    wrk_adopt_rank_t v[3] = {record_of(live, "j1", 0), record_of(other, "j1", 1),
                             record_of(getpid(), "j2", 0)};
    v[1].start_ticks += 1000; /* other's pid, recorded for a process long gone */
    v[2].start_ticks += 1000; /* and ours */
    cr_assert_eq(wrk_adopt_save(path, v, 3), 0);
    unsigned found = 0;
    cr_assert_eq(wrk_adopt_reap(path, &found), 0);
    cr_expect_eq(found, 1);

    int st = 0;
    cr_assert_eq(waitpid(live, &st, 0), live);
    cr_expect(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "the live rank was not killed");
    /* Its helper went with it: the group is empty. */
    uint64_t deadline = ch_now_ms() + 5000;
    while (kill(-live, 0) == 0 && ch_now_ms() < deadline)
        usleep(10000);
    cr_expect_neq(kill(-live, 0), 0, "the rank's helper outlived it");
    cr_expect_eq(waitpid(other, &st, WNOHANG), 0, "a process whose start time differs was hit");
    cr_expect_eq(kill(other, 0), 0);

    wrk_adopt_rank_t *got = NULL;
    size_t n = 9;
    cr_assert_eq(wrk_adopt_load(path, &got, &n), 0);
    cr_expect_eq(n, 0, "the record is emptied once checked");
    free(got);
    kill(-other, SIGKILL);
    waitpid(other, NULL, 0);
}

Test(adopt, one_workerd_at_a_time_holds_a_run_dirs_record)
{
    int fd = wrk_adopt_lock(dir);
    cr_assert_geq(fd, 0, "%s", strerror(-fd));
    cr_expect_eq(wrk_adopt_lock(dir), -EBUSY, "a second workerd on the same run dir");
    close(fd);
    int again = wrk_adopt_lock(dir);
    cr_expect_geq(again, 0, "the lock is free once its holder is gone");
    if (again >= 0)
        close(again);
}
