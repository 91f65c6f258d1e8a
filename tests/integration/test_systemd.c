/* The daemons as systemd runs them (Type=notify): workerd is ready as soon as it has
 * started, saying what it waits for, so `systemctl enable --now chorus-workerd` returns while
 * the head node is down; a configuration error exits 78, which the units do not restart. */
#include <criterion/criterion.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/auth.h"
#include "common/procmetrics.h"
#include "common/util.h"
#include "harness.h"
#include "support.h"

static char dir[512], key[600];

static void setup(void)
{
    cr_assert_eq(ts_tmpdir("sd", dir, sizeof dir), 0);
    snprintf(key, sizeof key, "%s/cluster.key", dir);
    cr_assert_eq(ch_auth_global_init(), 0);
    cr_assert_eq(ch_key_generate(key), 0);
}

static void teardown(void)
{
    cr_expect_eq(ts_rmrf(dir), 0);
}

TestSuite(systemd, .init = setup, .fini = teardown, .timeout = 60);

/* Run workerd with these extra words and NOTIFY_SOCKET (when notify is not NULL). */
static pid_t start_workerd(const char *notify, const char *coordinator, const char *extra)
{
    char exe[PATH_MAX], run[600];
    h_bin("workerd", exe);
    snprintf(run, sizeof run, "%s/run", dir);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        if (notify)
            setenv("NOTIFY_SOCKET", notify, 1);
        execl(exe, "workerd", "--coordinator", coordinator, "--key", key, "--run-dir", run,
              "--name", "sd-node", "--slots", "1", "--device", "cpu",
              extra ? extra : "--log-level=info", (char *)NULL);
        _exit(127);
    }
    return pid;
}

static int exit_status(pid_t pid)
{
    int st = 0;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    cr_assert(WIFEXITED(st), "killed by signal %d", WIFSIGNALED(st) ? WTERMSIG(st) : 0);
    return WEXITSTATUS(st);
}

Test(systemd, workerd_is_ready_at_start_while_the_coordinator_is_down)
{
    char sock[600], got[4096] = "";
    snprintf(sock, sizeof sock, "%s/notify", dir);
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    cr_assert(fd >= 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    cr_assert_lt(strlen(sock), sizeof sa.sun_path, "socket path too long: %s", sock);
    memcpy(sa.sun_path, sock, strlen(sock) + 1);
    cr_assert_eq(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    /* Port 1 on loopback: nothing listens, so workerd keeps retrying. */
    pid_t pid = start_workerd(sock, "127.0.0.1:1", NULL);
    uint64_t deadline = ch_now_ms() + 10000;
    while (!strstr(got, "READY=1\n") && ch_now_ms() < deadline) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 100) <= 0)
            continue;
        char msg[512];
        ssize_t n = recv(fd, msg, sizeof msg - 1, 0);
        if (n > 0) {
            msg[n] = '\0';
            strncat(got, msg, sizeof got - strlen(got) - 2);
            strcat(got, "\n");
        }
    }
    kill(pid, SIGTERM);
    int code = exit_status(pid);
    close(fd);
    cr_expect(strstr(got, "STATUS=waiting for coordinator 127.0.0.1:1\n") != NULL, "%s", got);
    cr_expect(strstr(got, "READY=1\n") != NULL, "not ready while the coordinator is down: %s", got);
    cr_expect_eq(code, 0, "SIGTERM is a clean stop");
}

Test(systemd, configuration_errors_exit_78)
{
    cr_expect_eq(exit_status(start_workerd(NULL, "127.0.0.1:1", "--log-level=loud")), 78);
    cr_expect_eq(exit_status(start_workerd(NULL, "127.0.0.1:1", "--no-such-flag")), 78);
    cr_expect_eq(exit_status(start_workerd(NULL, "127.0.0.1:1", "--metrics-port=65536")), 78);
    cr_expect_eq(exit_status(start_workerd(NULL, "127.0.0.1:1", "--metrics-address=head")), 78,
                 "the metrics address is an IP address");
    char exe[PATH_MAX];
    h_bin("coordinatord", exe);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        execl(exe, "coordinatord", "--key", key, "--state-dir", dir, "--heartbeat-ms", "1",
              (char *)NULL);
        _exit(127);
    }
    cr_expect_eq(exit_status(pid), 78, "a heartbeat of 1 ms is refused");
}

static int record_forgets_j7(void *ud)
{
    return !h_file_has_since(ud, 0, " j7 ");
}

/* A sleep standing in for a rank: its own process group, its pid and start time. */
static pid_t sleeper(ch_proc_stat_t *st)
{
    pid_t p = fork();
    cr_assert(p >= 0);
    if (p == 0) {
        setpgid(0, 0);
        execl("/bin/sleep", "sleep", "60", (char *)NULL);
        _exit(127);
    }
    setpgid(p, p);
    cr_assert_eq(ch_proc_stat(p, st), 0);
    return p;
}

/* Reap p within 10 s (killing it if it is still there): its wait status, or -1. */
static int reaped(pid_t p)
{
    int status = 0;
    pid_t got = 0;
    for (uint64_t deadline = ch_now_ms() + 10000; got == 0 && ch_now_ms() < deadline;)
        if ((got = waitpid(p, &status, WNOHANG)) == 0)
            usleep(10000);
    if (got == p)
        return status;
    kill(-p, SIGKILL);
    waitpid(p, NULL, 0);
    return -1;
}

/* A workerd that starts finds, on the record the previous one kept (<run-dir>/ranks.state,
 * workerd/adopt.h), ranks still running. One that was to die with its workerd (keep 0, or a
 * record without the field) is killed at once with its process group; one started to
 * outlive it (keep 1) is re-adopted, but this one never redials agent.sock, so it is killed
 * after the grace (CHORUS_RELINK_GRACE_MS, which ranks inherit). A recorded pid whose start
 * time differs (reused) is left alone. test_readopt has real ranks that redial. */
Test(systemd, ranks_left_by_the_previous_workerd_are_killed_unless_they_redial)
{
    char run[600], state[700], text[256];
    snprintf(run, sizeof run, "%s/run", dir);
    snprintf(state, sizeof state, "%s/ranks.state", run);
    cr_assert_eq(ch_mkdirs(run, 0755), 0);
    ch_proc_stat_t st, st2, me;
    pid_t left = sleeper(&st), kept = sleeper(&st2);
    cr_assert_eq(ch_proc_stat(0, &me), 0);
    snprintf(text, sizeof text, "%d %llu j7 2 0 99\n%d %llu j7 2 1 99\n%d %llu j7 2 2 99 1\n",
             (int)left, (unsigned long long)st.start_ticks, (int)getpid(),
             (unsigned long long)me.start_ticks + 1000, (int)kept,
             (unsigned long long)st2.start_ticks);
    cr_assert_eq(h_write_file(state, text), 0);

    setenv("CHORUS_RELINK_GRACE_MS", "500", 1);
    pid_t w = start_workerd(NULL, "127.0.0.1:1", NULL);
    unsetenv("CHORUS_RELINK_GRACE_MS");
    int status = reaped(left), status2 = reaped(kept);
    h_wait_until(record_forgets_j7, state, 5000, 20);
    kill(w, SIGTERM);
    cr_expect_eq(exit_status(w), 0);
    cr_assert(status != -1, "the rank left running was not killed");
    cr_expect(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    cr_assert(status2 != -1, "the re-adopted rank that never redialled was not killed");
    cr_expect(WIFSIGNALED(status2) && WTERMSIG(status2) == SIGKILL);
    cr_expect(!h_file_has_since(state, 0, " j7 "), "the record still lists the old ranks");
}
