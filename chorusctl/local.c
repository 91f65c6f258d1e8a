/* chorusctl local up|down: a whole cluster on this machine, in one directory.
 *
 *   DIR/cluster.key         cluster key (made once, mode 0600)
 *   DIR/ctl.sock            coordinatord's control socket
 *   DIR/state/              coordinatord's state (SQLite; coordinatord.addr = HOST:PORT;
 *                           coordinatord.metrics.addr = the status page and /metrics)
 *   DIR/coordinatord.{log,pid}
 *   DIR/node<i>/            workerd node<i>'s run dir (job files, rank logs)
 *   DIR/node<i>.{log,pid}
 *
 * The daemons are the sibling binaries of this chorusctl, started in their own session
 * so they outlive it. A pid file is trusted only when that process's command line
 * still names DIR, so a reused pid is never signalled. */
#include <dirent.h>
#include <fcntl.h>
#include <inttypes.h>
#include <libgen.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/auth.h"
#include "common/device.h"
#include "common/err.h"
#include "common/msg.h"
#include "common/util.h"
#include "ctl.h"
#include "json.h"

#define START_TIMEOUT_MS 10000
#define STOP_TIMEOUT_MS  5000
#define POLL_MS          20
#define MAX_NODES        1024

typedef struct local {
    char dir[PATH_MAX];
    long nodes, slots, heartbeat_ms, dead_after_ms;
    const char *metrics; /* coordinatord --metrics: the status page and /metrics */
    ch_device_t device;  /* workerd --device: cpu, or cuda (each slot one GPU) */
} local_t;

static void pause_ms(unsigned ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {
    }
}

/* snprintf into a PATH_MAX buffer; -ENAMETOOLONG when it does not fit. */
static int pathf(char out[PATH_MAX], const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int pathf(char out[PATH_MAX], const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(out, PATH_MAX, fmt, ap);
    va_end(ap);
    return n < 0 || n >= PATH_MAX ? -ENAMETOOLONG : 0;
}

// ----------------------------------------------------------------------------
// processes and pid files

/* Running (a zombie counts as gone: nobody may reap our orphans soon). */
static int pid_alive(pid_t pid)
{
    char path[64], buf[512];
    if (pid <= 0 || kill(pid, 0) < 0)
        return 0;
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')'); /* comm may hold spaces; state follows ") " */
    return !(p && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X'));
}

/* 1 when pid's command line has an argument under dir/ (it is one of our daemons). */
static int pid_ours(pid_t pid, const char *dir)
{
    char path[64], prefix[PATH_MAX + 1], *buf = NULL;
    size_t len = 0;
    int ours = 0;

    snprintf(path, sizeof path, "/proc/%d/cmdline", (int)pid);
    snprintf(prefix, sizeof prefix, "%s/", dir);
    if (ch_file_read(path, 1 << 20, &buf, &len) < 0)
        return 0;
    for (size_t off = 0; off < len && !ours; off += strlen(buf + off) + 1)
        ours = strncmp(buf + off, prefix, strlen(prefix)) == 0;
    free(buf);
    return ours;
}

/* The live daemon recorded in a pid file, or 0. */
static pid_t pid_file_live(const char *pid_path, const char *dir)
{
    char *text = NULL;
    size_t len = 0;
    long pid = 0;

    if (ch_file_read(pid_path, 64, &text, &len) < 0)
        return 0;
    text[strcspn(text, "\n")] = '\0';
    int rc = ctl_parse_long(text, 1, INT32_MAX, &pid);
    free(text);
    if (rc < 0 || !pid_alive((pid_t)pid) || !pid_ours((pid_t)pid, dir))
        return 0;
    return (pid_t)pid;
}

/* Start argv[0] as a daemon: new session, stdin /dev/null, stdout+stderr appended to
 * log_path; its pid goes to pid_path. An exec failure is reported here, not in the log. */
static int spawn_daemon(char *const argv[], const char *log_path, const char *pid_path, pid_t *out)
{
    int pfd[2], err = 0;
    char pidtext[32];

    if (pipe2(pfd, O_CLOEXEC) < 0)
        return -errno;
    pid_t pid = fork();
    if (pid < 0) {
        err = -errno;
        close(pfd[0]);
        close(pfd[1]);
        return err;
    }
    if (pid == 0) {
        /* Keep only 0-2 and the error pipe: an inherited descriptor (a caller's pipe)
         * held open by a daemon would keep that caller waiting for EOF. */
        if (pfd[1] > 3)
            close_range(3, (unsigned)pfd[1] - 1, 0);
        close_range((unsigned)pfd[1] + 1, ~0U, 0);
        int in = open("/dev/null", O_RDONLY | O_CLOEXEC);
        int log = open(log_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (in < 0 || log < 0 || setsid() < 0 || dup2(in, 0) < 0 || dup2(log, 1) < 0 ||
            dup2(log, 2) < 0) {
            err = errno;
        } else {
            execv(argv[0], argv);
            err = errno;
        }
        if (write(pfd[1], &err, sizeof err) < 0) {
        }
        _exit(127);
    }
    close(pfd[1]);
    size_t n = 0;
    (void)ch_read_full(pfd[0], &err, sizeof err, &n); /* nothing to read: exec succeeded */
    close(pfd[0]);
    if (n > 0) {
        waitpid(pid, NULL, 0);
        return -(err ? err : EIO);
    }
    int len = snprintf(pidtext, sizeof pidtext, "%d\n", (int)pid);
    int rc = ch_file_write_atomic(pid_path, pidtext, (size_t)len, 0644);
    if (rc < 0) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        return rc;
    }
    *out = pid;
    return 0;
}

/* A child that ended (reaped here), so a wait can stop early. */
static int child_gone(pid_t pid)
{
    return waitpid(pid, NULL, WNOHANG) == pid || !pid_alive(pid);
}

/* Print the last lines of a daemon's log to stderr, to show why it stopped. */
static void log_tail(const char *log_path)
{
    char *text = NULL;
    size_t len = 0;
    if (ch_file_read(log_path, 64u << 20, &text, &len) < 0)
        return;
    size_t start = len, lines = 0;
    while (start > 0 && lines < 6)
        if (text[--start] == '\n' && start + 1 < len)
            lines++;
    fprintf(stderr, "--- %s (last lines) ---\n%s%s", log_path, text + start + (start > 0),
            len && text[len - 1] != '\n' ? "\n" : "");
    free(text);
}

// ----------------------------------------------------------------------------
// down

/* Stop every daemon with a pid file in dir: SIGTERM, a bounded wait, SIGKILL for the
 * rest; pid files removed. Returns how many were running. */
static int stop_all(const char *dir)
{
    struct daemon {
        pid_t pid;
        char pid_path[PATH_MAX];
    } *ds = NULL;
    size_t n = 0, cap = 0;
    int running = 0;
    DIR *d = opendir(dir);
    struct dirent *e;

    if (!d)
        return 0;
    while ((e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (len < 5 || strcmp(e->d_name + len - 4, ".pid") != 0)
            continue;
        if (n == cap) {
            size_t ncap = cap ? 2 * cap : 16;
            struct daemon *nds = realloc(ds, ncap * sizeof *nds);
            if (!nds)
                break;
            ds = nds;
            cap = ncap;
        }
        if (pathf(ds[n].pid_path, "%s/%s", dir, e->d_name) < 0)
            continue;
        ds[n].pid = pid_file_live(ds[n].pid_path, dir);
        if (ds[n].pid > 0 && kill(ds[n].pid, SIGTERM) == 0)
            running++;
        n++;
    }
    closedir(d);
    for (int sig = SIGTERM; sig != 0; sig = sig == SIGTERM ? SIGKILL : 0) {
        uint64_t deadline = ch_now_ms() + STOP_TIMEOUT_MS;
        size_t left;
        do {
            left = 0;
            for (size_t i = 0; i < n; i++) {
                if (ds[i].pid > 0 && child_gone(ds[i].pid))
                    ds[i].pid = 0;
                left += ds[i].pid > 0;
            }
            if (left)
                pause_ms(POLL_MS);
        } while (left && ch_now_ms() < deadline);
        if (!left || sig == SIGKILL)
            break;
        for (size_t i = 0; i < n; i++) {
            if (ds[i].pid > 0) {
                fprintf(stderr, "chorusctl: pid %d did not stop on SIGTERM; killing it\n",
                        (int)ds[i].pid);
                kill(ds[i].pid, SIGKILL);
            }
        }
    }
    for (size_t i = 0; i < n; i++)
        unlink(ds[i].pid_path);
    free(ds);
    return running;
}

static int local_down(const ctl_t *ctl, local_t *L)
{
    char real[PATH_MAX];
    struct stat st;
    if (stat(L->dir, &st) < 0 || !S_ISDIR(st.st_mode) || !realpath(L->dir, real)) {
        if (!ctl->json)
            printf("nothing running in %s\n", L->dir);
        return CTL_EXIT_OK;
    }
    snprintf(L->dir, sizeof L->dir, "%s", real);
    uint64_t t0 = ch_now_ms();
    int n = stop_all(L->dir);
    double secs = (double)(ch_now_ms() - t0) / 1000.0;
    if (ctl->json) {
        ctl_json_t j;
        ctl_json_init(&j, stdout);
        ctl_json_obj_begin(&j);
        ctl_json_kstr(&j, "dir", L->dir);
        ctl_json_kint(&j, "stopped", n);
        ctl_json_kdouble(&j, "seconds", secs);
        ctl_json_obj_end(&j);
        ctl_json_finish(&j);
    } else if (n == 0) {
        printf("nothing running in %s\n", L->dir);
    } else {
        printf("stopped %d processes in %s (%.2f s)\n", n, L->dir, secs);
    }
    return CTL_EXIT_OK;
}

// ----------------------------------------------------------------------------
// up

/* Path of a sibling binary of this chorusctl. */
static int sibling(const char *name, char out[PATH_MAX])
{
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n < 0)
        return -errno;
    self[n] = '\0';
    int rc = pathf(out, "%s/%s", dirname(self), name);
    if (rc == 0 && access(out, X_OK) < 0)
        rc = -errno;
    return rc;
}

/* Wait for coordinatord to publish its address ("HOST:PORT\n"). */
static int wait_addr(const char *addr_path, pid_t coord, char *addr, size_t n)
{
    uint64_t deadline = ch_now_ms() + START_TIMEOUT_MS;
    for (;;) {
        char *text = NULL;
        size_t len = 0;
        if (ch_file_read(addr_path, 512, &text, &len) == 0) {
            int whole = len > 0 && text[len - 1] == '\n';
            text[strcspn(text, "\n")] = '\0';
            if (whole && len < n) {
                snprintf(addr, n, "%s", text);
                free(text);
                return 0;
            }
            free(text);
        }
        if (child_gone(coord))
            return -ESRCH;
        if (ch_now_ms() >= deadline)
            return -ETIMEDOUT;
        pause_ms(POLL_MS);
    }
}

/* Alive nodes among node1..nodeN, or a negative code when the coordinator cannot be
 * asked yet. */
static int count_alive(const char *sock, long nodes)
{
    ch_client_t *cl = NULL;
    Chorus__Envelope req = CHORUS__ENVELOPE__INIT, *resp = NULL;
    Chorus__ListNodes ln = CHORUS__LIST_NODES__INIT;
    int rc = ch_client_connect_unix(sock, 1000, &cl);
    if (rc < 0)
        return rc;
    req.body_case = CHORUS__ENVELOPE__BODY_LIST_NODES;
    req.list_nodes = &ln;
    rc = ch_client_call(cl, &req, 2000, &resp);
    ch_client_destroy(cl);
    if (rc == 0 && resp->body_case != CHORUS__ENVELOPE__BODY_NODE_LIST)
        rc = CH_E_FORMAT;
    if (rc < 0) {
        if (resp)
            ch_msg_free(resp);
        return rc;
    }
    int alive = 0;
    for (size_t i = 0; i < resp->node_list->n_nodes; i++) {
        const Chorus__NodeInfo *ni = resp->node_list->nodes[i];
        long k = 0;
        if (strcmp(ni->state, "alive") == 0 && strncmp(ni->name, "node", 4) == 0 &&
            ctl_parse_long(ni->name + 4, 1, nodes, &k) == 0)
            alive++;
    }
    ch_msg_free(resp);
    return alive;
}

/* Is any daemon of dir running? Prints what it found. */
static int already_running(const local_t *L)
{
    char path[PATH_MAX];
    for (long i = 0; i <= MAX_NODES; i++) {
        if ((i == 0 ? pathf(path, "%s/coordinatord.pid", L->dir)
                    : pathf(path, "%s/node%ld.pid", L->dir, i)) < 0)
            continue;
        pid_t pid = pid_file_live(path, L->dir);
        if (pid > 0) {
            ctl_errf("a local cluster is already running in %s (%s pid %d); stop it with "
                     "'chorusctl local down --dir %s'",
                     L->dir, i == 0 ? "coordinatord" : "workerd", (int)pid, L->dir);
            return 1;
        }
    }
    return 0;
}

static int start_coordinator(const local_t *L, const char *exe, pid_t *pid)
{
    char listen[] = "127.0.0.1:0", sock[PATH_MAX], state[PATH_MAX], key[PATH_MAX], log[PATH_MAX],
         pidf[PATH_MAX], hb[32], dead[32];
    char *argv[20];
    int a = 0;

    if (pathf(sock, "%s/ctl.sock", L->dir) < 0 || pathf(state, "%s/state", L->dir) < 0 ||
        pathf(key, "%s/cluster.key", L->dir) < 0 || pathf(log, "%s/coordinatord.log", L->dir) < 0 ||
        pathf(pidf, "%s/coordinatord.pid", L->dir) < 0)
        return -ENAMETOOLONG;
    argv[a++] = (char *)exe;
    argv[a++] = "--listen";
    argv[a++] = listen;
    argv[a++] = "--ctl-socket";
    argv[a++] = sock;
    argv[a++] = "--state-dir";
    argv[a++] = state;
    argv[a++] = "--key";
    argv[a++] = key;
    argv[a++] = "--metrics";
    argv[a++] = (char *)L->metrics;
    /* A local cluster runs as you, whoever you are: root's jobs run as root here. */
    argv[a++] = "--allow-root-jobs";
    if (L->heartbeat_ms > 0) {
        snprintf(hb, sizeof hb, "%ld", L->heartbeat_ms);
        argv[a++] = "--heartbeat-ms";
        argv[a++] = hb;
    }
    if (L->dead_after_ms > 0) {
        snprintf(dead, sizeof dead, "%ld", L->dead_after_ms);
        argv[a++] = "--dead-after-ms";
        argv[a++] = dead;
    }
    argv[a] = NULL;
    return spawn_daemon(argv, log, pidf, pid);
}

static int start_worker(const local_t *L, const char *exe, const char *addr, long i, pid_t *pid)
{
    char name[32], slots[32], threads[32], run[PATH_MAX], key[PATH_MAX], log[PATH_MAX],
        pidf[PATH_MAX], mem[PATH_MAX];
    snprintf(name, sizeof name, "node%ld", i);
    snprintf(slots, sizeof slots, "%ld", L->slots);
    /* The nodes share this machine: each slot gets its share of the cores, at least one. */
    long cores = sysconf(_SC_NPROCESSORS_ONLN), share = cores / (L->nodes * L->slots);
    snprintf(threads, sizeof threads, "%ld", share > 0 ? share : 1);
    if (pathf(run, "%s/%s", L->dir, name) < 0 || pathf(key, "%s/cluster.key", L->dir) < 0 ||
        pathf(log, "%s/%s.log", L->dir, name) < 0 || pathf(pidf, "%s/%s.pid", L->dir, name) < 0 ||
        pathf(mem, "%s/%s-mem", L->dir, name) < 0) /* each node its own "host memory" */
        return -ENAMETOOLONG;
    char *argv[] = {(char *)exe,
                    "--coordinator",
                    (char *)addr,
                    "--name",
                    name,
                    "--slots",
                    slots,
                    "--threads",
                    threads,
                    "--run-dir",
                    run,
                    "--key",
                    key,
                    "--device",
                    (char *)ch_device_name(L->device),
                    "--memory-dir",
                    mem,
                    NULL};
    return spawn_daemon(argv, log, pidf, pid);
}

static void print_up(const ctl_t *ctl, const local_t *L, const char *addr, double secs)
{
    char page[128] = "", path[PATH_MAX + 64];
    FILE *f = NULL;
    snprintf(path, sizeof path, "%s/state/coordinatord.metrics.addr", L->dir);
    if ((f = fopen(path, "r"))) {
        if (!fgets(page, sizeof page, f))
            page[0] = '\0';
        page[strcspn(page, "\r\n")] = '\0';
        fclose(f);
    }
    if (ctl->json) {
        ctl_json_t j;
        char sock[PATH_MAX + 16];
        snprintf(sock, sizeof sock, "%s/ctl.sock", L->dir);
        ctl_json_init(&j, stdout);
        ctl_json_obj_begin(&j);
        ctl_json_kstr(&j, "dir", L->dir);
        ctl_json_kstr(&j, "socket", sock);
        ctl_json_kstr(&j, "coordinator", addr);
        ctl_json_kstr(&j, "status_page", page[0] ? page : NULL);
        ctl_json_kint(&j, "nodes", L->nodes);
        ctl_json_kint(&j, "slots", L->slots);
        ctl_json_kdouble(&j, "seconds", secs);
        ctl_json_obj_end(&j);
        ctl_json_finish(&j);
        return;
    }
    printf("local cluster up: %ld nodes x %ld slots alive in %.2f s\n", L->nodes, L->slots, secs);
    printf("coordinator %s, control socket %s/ctl.sock\n", addr, L->dir);
    if (page[0])
        printf("status page http://%s/\n", page);
    printf("  export CHORUS_SOCKET=%s/ctl.sock\n", L->dir);
}

static int local_up(const ctl_t *ctl, local_t *L)
{
    char coord_exe[PATH_MAX], worker_exe[PATH_MAX], path[PATH_MAX], addr[300], sock[PATH_MAX];
    pid_t coord = 0, workers[MAX_NODES + 1] = {0};
    uint64_t t0 = ch_now_ms();
    int rc;

    rc = ch_mkdirs(L->dir, 0700);
    if (rc < 0 || !realpath(L->dir, path)) {
        ctl_errf("%s: %s", L->dir, ch_strerror(rc < 0 ? rc : -errno));
        return CTL_EXIT_FAILED;
    }
    snprintf(L->dir, sizeof L->dir, "%s", path);
    if (already_running(L))
        return CTL_EXIT_FAILED;
    if ((rc = sibling("coordinatord", coord_exe)) < 0 ||
        (rc = sibling("workerd", worker_exe)) < 0) {
        ctl_errf("cannot find the daemons next to chorusctl: %s", ch_strerror(rc));
        return CTL_EXIT_FAILED;
    }
    if (pathf(path, "%s/cluster.key", L->dir) < 0 || pathf(sock, "%s/ctl.sock", L->dir) < 0)
        return CTL_EXIT_FAILED;
    rc = ch_auth_global_init();
    if (rc == 0) {
        rc = ch_key_generate(path);
        rc = rc == -EEXIST ? 0 : rc;
    }
    if (rc < 0) {
        ctl_errf("%s: %s", path, ch_strerror(rc));
        return CTL_EXIT_CONFIG;
    }
    /* A stale address from an earlier run must not be mistaken for this one's. */
    if (pathf(path, "%s/state", L->dir) < 0 || ch_mkdirs(path, 0700) < 0 ||
        pathf(path, "%s/state/coordinatord.metrics.addr", L->dir) < 0)
        return CTL_EXIT_FAILED;
    unlink(path);
    if (pathf(path, "%s/state/coordinatord.addr", L->dir) < 0)
        return CTL_EXIT_FAILED;
    unlink(path);

    rc = start_coordinator(L, coord_exe, &coord);
    if (rc < 0) {
        ctl_errf("cannot start %s: %s", coord_exe, ch_strerror(rc));
        goto fail;
    }
    rc = wait_addr(path, coord, addr, sizeof addr);
    if (rc < 0) {
        ctl_errf("coordinatord %s", rc == -ESRCH ? "exited during startup"
                                                 : "did not publish its address within 10 s");
        if (pathf(path, "%s/coordinatord.log", L->dir) == 0)
            log_tail(path);
        goto fail;
    }
    for (long i = 1; i <= L->nodes; i++) {
        rc = start_worker(L, worker_exe, addr, i, &workers[i]);
        if (rc < 0) {
            ctl_errf("cannot start %s as node%ld: %s", worker_exe, i, ch_strerror(rc));
            goto fail;
        }
    }
    uint64_t deadline = ch_now_ms() + START_TIMEOUT_MS;
    int alive = 0;
    while ((alive = count_alive(sock, L->nodes)) < L->nodes) {
        for (long i = 0; i <= L->nodes; i++) {
            pid_t p = i == 0 ? coord : workers[i];
            if (child_gone(p)) {
                char who[32] = "coordinatord";
                if (i > 0)
                    snprintf(who, sizeof who, "node%ld", i);
                ctl_errf("%s exited during startup", who);
                if (pathf(path, "%s/%s.log", L->dir, who) == 0)
                    log_tail(path);
                goto fail;
            }
        }
        if (ch_now_ms() >= deadline) {
            ctl_errf("only %d of %ld nodes alive after %d s (logs in %s)", alive < 0 ? 0 : alive,
                     L->nodes, START_TIMEOUT_MS / 1000, L->dir);
            goto fail;
        }
        pause_ms(POLL_MS);
    }
    print_up(ctl, L, addr, (double)(ch_now_ms() - t0) / 1000.0);
    return CTL_EXIT_OK;
fail:
    stop_all(L->dir);
    return CTL_EXIT_FAILED;
}

enum {
    OPT_DIR = 256,
    OPT_NODES,
    OPT_SLOTS,
    OPT_HEARTBEAT,
    OPT_DEAD_AFTER,
    OPT_METRICS,
    OPT_DEVICE
};

const ctl_opt_t ctl_opts_local[] = {
    {"dir", OPT_DIR, "DIR", "the cluster's directory (required)"},
    {"nodes", OPT_NODES, "N", "workerds to start (2)"},
    {"slots", OPT_SLOTS, "S", "slots per node (2)"},
    {"heartbeat-ms", OPT_HEARTBEAT, "N", "coordinatord's heartbeat-ms"},
    {"dead-after-ms", OPT_DEAD_AFTER, "N", "coordinatord's dead-after-ms"},
    {"metrics", OPT_METRICS, "HOST:PORT", "status page and metrics (127.0.0.1:0)"},
    {"device", OPT_DEVICE, "cpu|cuda", "where the ranks compute (cpu)"},
    {NULL, 0, NULL, NULL},
};

int ctl_cmd_local(ctl_t *ctl, int argc, char **argv)
{
    local_t L = {.nodes = 2, .slots = 2, .metrics = "127.0.0.1:0"};
    const char *dir = NULL;
    int up;

    ctl_args_t a;
    const char *v;
    int c;
    if (ctl_args_begin(&a, "local", ctl_opts_local, argc, argv) < 0)
        return CTL_EXIT_USAGE;
    while ((c = ctl_args_next(&a, &v)) > 0) {
        long *num = NULL, max = 1000000;
        if (c == OPT_DIR) {
            dir = v;
        } else if (c == OPT_NODES) {
            num = &L.nodes;
            max = MAX_NODES;
        } else if (c == OPT_SLOTS) {
            num = &L.slots;
            max = 4096;
        } else if (c == OPT_HEARTBEAT) {
            num = &L.heartbeat_ms;
        } else if (c == OPT_DEAD_AFTER) {
            num = &L.dead_after_ms;
        } else if (c == OPT_METRICS) {
            L.metrics = v;
        } else if (ch_device_parse(v, &L.device) < 0) {
            ctl_errf("local: --device: expected cpu or cuda, got '%s'", v);
            goto usage;
        }
        if (num && ctl_parse_long(v, 1, max, num) < 0) {
            ctl_errf("local: '%s' is not a number in [1, %ld]", v, max);
            goto usage;
        }
    }
    if (c < 0)
        return CTL_EXIT_USAGE;
    if (a.npos != 1 || (strcmp(a.pos[0], "up") != 0 && strcmp(a.pos[0], "down") != 0))
        goto usage;
    up = strcmp(a.pos[0], "up") == 0;
    if (!dir || !*dir)
        goto usage;
    if (snprintf(L.dir, sizeof L.dir, "%s", dir) >= (int)sizeof L.dir) {
        ctl_errf("local: --dir is too long");
        return CTL_EXIT_USAGE;
    }
    return up ? local_up(ctl, &L) : local_down(ctl, &L);
usage:
    ctl_usage("local");
    return CTL_EXIT_USAGE;
}
