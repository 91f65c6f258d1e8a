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
