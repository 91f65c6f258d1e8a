/* Integration-test harness (see harness.h). */
#include "harness.h"
#include "support.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/client.h"
#include "common/err.h"
#include "common/frame.h"
#include "common/log.h"
#include "common/msg.h"
#include "common/util.h"

/* The cluster the running test started: kept here, not in the test's stack frame,
 * because .fini runs after a failed assertion has left that frame. */
static char live_dir[H_DIR_MAX];

static void pause_ms(unsigned ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {
    }
}

void h_out_free(h_out_t *o)
{
    free(o->out);
    free(o->err);
    o->out = o->err = NULL;
}

void h_bin(const char *name, char out[PATH_MAX])
{
    const char *dir = getenv("CHORUS_BIN_DIR");
    snprintf(out, PATH_MAX, "%s/%s", dir && *dir ? dir : "build/bin", name);
}

// ----------------------------------------------------------------------------
// running programs

typedef struct sink {
    char *buf;
    size_t len, cap;
} sink_t;

static int sink_read(sink_t *s, int fd)
{
    if (s->cap - s->len < 4096) {
        size_t cap = s->cap ? 2 * s->cap : 8192;
        char *b = realloc(s->buf, cap);
        if (!b)
            return -ENOMEM;
        s->buf = b;
        s->cap = cap;
    }
    ssize_t n = read(fd, s->buf + s->len, s->cap - s->len - 1);
    if (n < 0)
        return errno == EINTR || errno == EAGAIN ? 1 : -errno;
    s->len += (size_t)n;
    s->buf[s->len] = '\0';
    return n > 0;
}

/* Child side of a fork: only fds 0-2 survive into the program. */
static void child_exec(char *const argv[])
{
    close_range(3, ~0U, 0);
    execv(argv[0], argv);
    fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
    _exit(127);
}

int h_run(h_out_t *o, int timeout_ms, char *const argv[])
{
    int po[2] = {-1, -1}, pe[2] = {-1, -1}, rc = 0, st = 0;
    sink_t so = {0}, se = {0};
    uint64_t deadline = ch_now_ms() + (uint64_t)timeout_ms;

    memset(o, 0, sizeof *o);
    o->status = -1;
    if (pipe2(po, O_CLOEXEC) < 0 || pipe2(pe, O_CLOEXEC) < 0) {
        rc = -errno;
        goto out;
    }
    pid_t pid = fork();
    if (pid < 0) {
        rc = -errno;
        goto out;
    }
    if (pid == 0) {
        int in = open("/dev/null", O_RDONLY);
        dup2(in, 0);
        dup2(po[1], 1);
        dup2(pe[1], 2);
        child_exec(argv);
    }
    close(po[1]);
    close(pe[1]);
    po[1] = pe[1] = -1;
    int fds[2] = {po[0], pe[0]};
    sink_t *sinks[2] = {&so, &se};
    po[0] = pe[0] = -1; /* owned by fds[] now */
    while (fds[0] >= 0 || fds[1] >= 0) {
        struct pollfd p[2] = {{fds[0], POLLIN, 0}, {fds[1], POLLIN, 0}}; /* -1: ignored */
        uint64_t now = ch_now_ms();
        if (now >= deadline) {
            kill(pid, SIGKILL);
            rc = -ETIMEDOUT;
            break;
        }
        if (poll(p, 2, (int)(deadline - now)) < 0 && errno != EINTR) {
            rc = -errno;
            kill(pid, SIGKILL);
            break;
        }
        for (int i = 0; i < 2; i++) {
            if (fds[i] >= 0 && (p[i].revents & (POLLIN | POLLHUP | POLLERR)) &&
                sink_read(sinks[i], fds[i]) <= 0) {
                close(fds[i]);
                fds[i] = -1;
            }
        }
    }
    for (int i = 0; i < 2; i++)
        if (fds[i] >= 0)
            close(fds[i]);
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    o->status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
out:
    for (int i = 0; i < 2; i++) {
        if (po[i] >= 0)
            close(po[i]);
        if (pe[i] >= 0)
            close(pe[i]);
    }
    o->out = so.buf ? so.buf : strdup("");
    o->err = se.buf ? se.buf : strdup("");
    return rc;
}

/* argv for chorusctl [--socket SOCK] args... from a va_list; malloc'd. */
static char **ctl_argv(const h_cluster_t *c, char *exe, va_list ap)
{
    va_list aq;
    size_t n = 0;
    va_copy(aq, ap);
    while (va_arg(aq, const char *))
        n++;
    va_end(aq);
    char **argv = calloc(n + 5, sizeof *argv);
    if (!argv)
        return NULL;
    size_t a = 0;
    argv[a++] = exe;
    if (c) {
        argv[a++] = "--socket";
        argv[a++] = (char *)c->sock;
    }
    for (const char *s; (s = va_arg(ap, const char *));)
        argv[a++] = (char *)s;
    return argv;
}

int h_ctl(const h_cluster_t *c, h_out_t *o, ...)
{
    char exe[PATH_MAX];
    va_list ap;
    h_bin("chorusctl", exe);
    va_start(ap, o);
    char **argv = ctl_argv(c, exe, ap);
    va_end(ap);
    if (!argv)
        return -ENOMEM;
    int rc = h_run(o, H_RUN_TIMEOUT_MS, argv);
    free(argv);
    return rc;
}

ch_json_t *h_ctl_json(const h_cluster_t *c, ...)
{
    char exe[PATH_MAX], err[256];
    va_list ap;
    h_out_t o;
    ch_json_t *j = NULL;

    h_bin("chorusctl", exe);
    va_start(ap, c);
    char **argv = ctl_argv(c, exe, ap);
    va_end(ap);
    if (!argv)
        return NULL;
    size_t n = 0;
    while (argv[n])
        n++;
    argv[n] = "--json";
    int rc = h_run(&o, H_RUN_TIMEOUT_MS, argv);
    if (rc < 0 || o.status != 0)
        fprintf(stderr, "harness: chorusctl %s: rc %d, exit %d\nstdout: %s\nstderr: %s\n",
                argv[c ? 3 : 1], rc, o.status, o.out, o.err);
    else if (ch_json_parse(o.out, strlen(o.out), NULL, &j, err, sizeof err) < 0)
        fprintf(stderr, "harness: chorusctl %s --json printed bad JSON (%s):\n%s\n",
                argv[c ? 3 : 1], err, o.out);
    free(argv);
    h_out_free(&o);
    return j;
}

int h_submit_wait(const h_cluster_t *c, h_out_t *o, const char *jobfile, char *id, size_t n)
{
    memset(o, 0, sizeof *o);
    id[0] = '\0';
    int rc = h_ctl(c, o, "submit", jobfile, "--wait", NULL);
    if (o->out)
        snprintf(id, n, "%.*s", (int)strcspn(o->out, " \t\n"), o->out);
    return rc < 0 ? rc : o->status;
}

// ----------------------------------------------------------------------------
// clusters

int h_cluster_up(h_cluster_t *c, int nodes, int slots)
{
    char n[16], s[16], hb[16], dead[16], err[256];
    h_out_t o;
    ch_json_t *j = NULL;

    memset(c, 0, sizeof *c);
    int rc = ts_tmpdir("cl", c->dir, sizeof c->dir);
    if (rc < 0)
        return rc;
    snprintf(c->sock, sizeof c->sock, "%s/ctl.sock", c->dir);
    snprintf(c->key, sizeof c->key, "%s/cluster.key", c->dir);
    snprintf(live_dir, sizeof live_dir, "%s", c->dir);
    c->nodes = nodes;
    c->slots = slots;
    snprintf(n, sizeof n, "%d", nodes);
    snprintf(s, sizeof s, "%d", slots);
    snprintf(hb, sizeof hb, "%d", H_HEARTBEAT_MS);
    snprintf(dead, sizeof dead, "%d", H_DEAD_AFTER_MS);
    rc = h_ctl(NULL, &o, "local", "up", "--dir", c->dir, "--nodes", n, "--slots", s,
               "--heartbeat-ms", hb, "--dead-after-ms", dead, "--json", NULL);
    if (rc == 0 && o.status != 0)
        rc = -ECHILD;
    if (rc == 0 && ch_json_parse(o.out, strlen(o.out), NULL, &j, err, sizeof err) < 0)
        rc = CH_E_FORMAT;
    if (rc < 0) {
        fprintf(stderr, "harness: local up failed (rc %d, exit %d)\nstdout: %s\nstderr: %s\n", rc,
                o.status, o.out, o.err);
    } else {
        fprintf(stderr, "harness: cluster of %d x %d in %s\n", nodes, slots, c->dir);
        c->up_seconds = h_json_num(j, "seconds");
        snprintf(c->addr, sizeof c->addr, "%s", h_json_str(j, "coordinator"));
    }
    ch_json_free(j);
    h_out_free(&o);
    return rc;
}

static void down_dir(const char *dir)
{
    h_out_t o;
    if (h_ctl(NULL, &o, "local", "down", "--dir", dir, NULL) < 0 || o.status != 0)
        fprintf(stderr, "harness: local down %s: exit %d: %s", dir, o.status, o.err);
    h_out_free(&o);
    /* Reap daemons this process restarted itself. */
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

void h_cluster_down(h_cluster_t *c)
{
    if (!c->dir[0])
        return;
    down_dir(c->dir);
    if (strcmp(live_dir, c->dir) == 0)
        live_dir[0] = '\0';
}

void h_teardown(void)
{
    if (live_dir[0])
        down_dir(live_dir);
    live_dir[0] = '\0';
}

pid_t h_pid(const h_cluster_t *c, const char *who)
{
    char path[PATH_MAX], *text = NULL;
    size_t len = 0;
    snprintf(path, sizeof path, "%s/%s.pid", c->dir, who);
    if (ch_file_read(path, 64, &text, &len) < 0)
        return -1;
    long pid = strtol(text, NULL, 10);
    free(text);
    return pid > 0 ? (pid_t)pid : -1;
}

int h_gone(pid_t pid)
{
    char path[64], buf[512];
    if (waitpid(pid, NULL, WNOHANG) == pid || kill(pid, 0) < 0)
        return 1;
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')');
    return p && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X');
}

int h_kill_wait(pid_t pid, int sig, int timeout_ms)
{
    if (pid <= 0)
        return -EINVAL;
    if (kill(pid, sig) < 0)
        return -errno;
    uint64_t deadline = ch_now_ms() + (uint64_t)timeout_ms;
    while (!h_gone(pid)) {
        if (ch_now_ms() >= deadline)
            return -ETIMEDOUT;
        pause_ms(5);
    }
    return 0;
}

/* Start a daemon like `local up` does: own session, output appended to log, pid file. */
static int spawn(char *const argv[], const char *log, const char *pidf)
{
    char text[32];
    pid_t pid = fork();
    if (pid < 0)
        return -errno;
    if (pid == 0) {
        int in = open("/dev/null", O_RDONLY);
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        setsid();
        dup2(in, 0);
        dup2(fd, 1);
        dup2(fd, 2);
        child_exec(argv);
    }
    int n = snprintf(text, sizeof text, "%d\n", (int)pid);
    return ch_file_write_atomic(pidf, text, (size_t)n, 0644);
}

static int coord_answers(void *ud)
{
    return h_alive_count(ud) >= 0;
}

int h_coord_restart(h_cluster_t *c)
{
    char exe[PATH_MAX], state[PATH_MAX + 8], log[PATH_MAX + 32], pidf[PATH_MAX + 32], hb[16],
        dead[16];
    h_bin("coordinatord", exe);
    snprintf(state, sizeof state, "%s/state", c->dir);
    snprintf(log, sizeof log, "%s/coordinatord.log", c->dir);
    snprintf(pidf, sizeof pidf, "%s/coordinatord.pid", c->dir);
    snprintf(hb, sizeof hb, "%d", H_HEARTBEAT_MS);
    snprintf(dead, sizeof dead, "%d", H_DEAD_AFTER_MS);
    char metrics[] = "127.0.0.1:0";
    char *argv[] = {exe,   "--listen",  c->addr, "--ctl-socket",      c->sock, "--state-dir",
                    state, "--key",     c->key,  "--heartbeat-ms",    hb,      "--dead-after-ms",
                    dead,  "--metrics", metrics, "--allow-root-jobs", NULL};
    int rc = spawn(argv, log, pidf);
    if (rc < 0)
        return rc;
    return h_wait_until(coord_answers, c, 10000, 20) > 0 ? 0 : -ETIMEDOUT;
}

int h_metrics_addr(const h_cluster_t *c, char *addr, size_t n)
{
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/state/coordinatord.metrics.addr", c->dir);
    FILE *f = fopen(path, "r");
    if (!f)
        return -errno;
    int ok = fgets(addr, (int)n, f) != NULL;
    fclose(f);
    if (!ok)
        return -ENOENT;
    addr[strcspn(addr, "\r\n")] = '\0';
    return 0;
}

int h_worker_spawn(h_cluster_t *c, const char *name, const char *slots, const char *device)
{
    return h_worker_spawn_flag(c, name, slots, device, NULL);
}

int h_worker_spawn_flag(h_cluster_t *c, const char *name, const char *slots, const char *device,
                        const char *flag)
{
    char exe[PATH_MAX], run[PATH_MAX], log[PATH_MAX], pidf[PATH_MAX], mem[PATH_MAX];
    h_bin("workerd", exe);
    snprintf(run, sizeof run, "%s/%s", c->dir, name);
    /* each node's own "host memory", kept across its workerd's restarts as /dev/shm is */
    snprintf(mem, sizeof mem, "%s/%s-mem", c->dir, name);
    snprintf(log, sizeof log, "%s/%s.log", c->dir, name);
    snprintf(pidf, sizeof pidf, "%s/%s.pid", c->dir, name);
    /* The share of cores local up gives each slot: a restarted node computes as before. */
    char threads[24];
    long cores = sysconf(_SC_NPROCESSORS_ONLN), share = cores / (c->nodes * c->slots);
    snprintf(threads, sizeof threads, "%ld", share > 0 ? share : 1);
    char *argv[] = {exe,        "--coordinator", c->addr,      "--name",    (char *)name,
                    "--slots",  (char *)slots,   "--run-dir",  run,         "--memory-dir",
                    mem,        "--key",         c->key,       "--threads", threads,
                    "--device", (char *)device,  (char *)flag, NULL};
    return spawn(argv, log, pidf);
}

int h_worker_restart(h_cluster_t *c, int i)
{
    char name[32], slots[16];
    snprintf(name, sizeof name, "node%d", i);
    snprintf(slots, sizeof slots, "%d", c->slots);
    return h_worker_spawn(c, name, slots, "cpu");
}

int h_wait_until(int (*pred)(void *ud), void *ud, int timeout_ms, int interval_ms)
{
    uint64_t deadline = ch_now_ms() + (uint64_t)timeout_ms;
    for (;;) {
        int r = pred(ud);
        if (r != 0)
            return r;
        if (ch_now_ms() >= deadline)
            return 0;
        pause_ms((unsigned)interval_ms);
    }
}

// ----------------------------------------------------------------------------
// asking the coordinator directly

static int call_unix(const h_cluster_t *c, Chorus__Envelope *req, Chorus__Envelope **resp)
{
    ch_client_t *cl = NULL;
    *resp = NULL;
    int rc = ch_client_connect_unix(c->sock, 1000, &cl);
    if (rc < 0)
        return rc;
    rc = ch_client_call(cl, req, 3000, resp);
    ch_client_destroy(cl);
    return rc;
}

static int list_nodes(const h_cluster_t *c, Chorus__Envelope **resp)
{
    Chorus__Envelope req = CHORUS__ENVELOPE__INIT;
    Chorus__ListNodes ln = CHORUS__LIST_NODES__INIT;
    req.body_case = CHORUS__ENVELOPE__BODY_LIST_NODES;
    req.list_nodes = &ln;
    int rc = call_unix(c, &req, resp);
    if (rc == 0 && (*resp)->body_case != CHORUS__ENVELOPE__BODY_NODE_LIST)
        rc = CH_E_FORMAT;
    if (rc < 0 && *resp) {
        ch_msg_free(*resp);
        *resp = NULL;
    }
    return rc;
}

int h_node_state(const h_cluster_t *c, const char *node, char *state, size_t n)
{
    Chorus__Envelope *resp = NULL;
    int rc = list_nodes(c, &resp);
    if (rc < 0)
        return rc;
    rc = CH_E_NOTFOUND;
    for (size_t i = 0; i < resp->node_list->n_nodes; i++) {
        if (strcmp(resp->node_list->nodes[i]->name, node) == 0) {
            snprintf(state, n, "%s", resp->node_list->nodes[i]->state);
            rc = 0;
        }
    }
    ch_msg_free(resp);
    return rc;
}

int h_alive_count(const h_cluster_t *c)
{
    Chorus__Envelope *resp = NULL;
    int rc = list_nodes(c, &resp);
    if (rc < 0)
        return rc;
    int alive = 0;
    for (size_t i = 0; i < resp->node_list->n_nodes; i++)
        alive += strcmp(resp->node_list->nodes[i]->state, "alive") == 0;
    ch_msg_free(resp);
    return alive;
}

int h_job_query(const h_cluster_t *c, const char *job, Chorus__Envelope **reply)
{
    Chorus__Envelope req = CHORUS__ENVELOPE__INIT;
    Chorus__JobQuery q = CHORUS__JOB_QUERY__INIT;
    q.job_id = (char *)job;
    req.body_case = CHORUS__ENVELOPE__BODY_JOB_QUERY;
    req.job_query = &q;
    int rc = call_unix(c, &req, reply);
    if (rc == 0 && (*reply)->body_case != CHORUS__ENVELOPE__BODY_JOB_INFO)
        rc = CH_E_FORMAT;
    if (rc < 0 && *reply) {
        ch_msg_free(*reply);
        *reply = NULL;
    }
    return rc;
}

int h_submit_raw(const h_cluster_t *c, const char *ini, char *id, size_t n)
{
    Chorus__Envelope req = CHORUS__ENVELOPE__INIT, *reply = NULL;
    Chorus__Submit s = CHORUS__SUBMIT__INIT;
    s.job_ini = (char *)ini;
    req.body_case = CHORUS__ENVELOPE__BODY_SUBMIT;
    req.submit = &s;
    int rc = call_unix(c, &req, &reply);
    if (rc == 0 && reply->body_case != CHORUS__ENVELOPE__BODY_SUBMIT_REPLY)
        rc = CH_E_FORMAT;
    if (rc == 0)
        snprintf(id, n, "%s", reply->submit_reply->job_id);
    if (reply)
        ch_msg_free(reply);
    return rc;
}

// ----------------------------------------------------------------------------
// files and JSON

int h_write_file(const char *path, const char *text)
{
    return ch_file_write_atomic(path, text, strlen(text), 0644);
}

size_t h_file_size(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (size_t)st.st_size : 0;
}

int h_has(const char *text, const char *needle)
{
    return text && strcasestr(text, needle) != NULL;
}

int h_file_has_since(const char *path, size_t offset, const char *needle)
{
    char *text = NULL;
    size_t len = 0;
    if (ch_file_read(path, 256u << 20, &text, &len) < 0)
        return 0;
    int found = offset <= len && h_has(text + offset, needle);
    free(text);
    return found;
}

const ch_json_t *h_json_at(const ch_json_t *arr, size_t i)
{
    return arr && arr->type == CH_JSON_ARRAY && i < arr->nkids ? arr->kids[i] : NULL;
}

double h_json_num(const ch_json_t *obj, const char *key)
{
    const ch_json_t *v = obj ? ch_json_get(obj, key) : NULL;
    return v && v->type == CH_JSON_NUMBER ? v->number : NAN;
}

const char *h_json_str(const ch_json_t *obj, const char *key)
{
    const char *s = obj ? ch_json_get_str(obj, key) : NULL;
    return s ? s : "";
}

// ----------------------------------------------------------------------------
// hand-made protocol peers

int h_tcp_connect(const char *addr)
{
    char host[256];
    int port = 0;
    struct sockaddr_in sa = {.sin_family = AF_INET};
    int rc = ch_parse_hostport(addr, host, sizeof host, &port);
    if (rc < 0)
        return rc;
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1)
        return -EINVAL;
    sa.sin_port = htons((uint16_t)port);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
        rc = -errno;
        close(fd);
        return rc;
    }
    return fd;
}

int h_local_port(int fd)
{
    struct sockaddr_in sa;
    socklen_t len = sizeof sa;
    if (getsockname(fd, (struct sockaddr *)&sa, &len) < 0)
        return -errno;
    return ntohs(sa.sin_port);
}

int h_send_all(int fd, const void *buf, size_t len)
{
    const uint8_t *p = buf;
    while (len > 0) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -errno;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

/* Read exactly len bytes before the deadline. */
static int recv_exact(int fd, void *buf, size_t len, uint64_t deadline)
{
    uint8_t *p = buf;
    while (len > 0) {
        uint64_t now = ch_now_ms();
        if (now >= deadline)
            return -ETIMEDOUT;
        struct pollfd q = {fd, POLLIN, 0};
        int r = poll(&q, 1, (int)(deadline - now));
        if (r < 0 && errno != EINTR)
            return -errno;
        if (r <= 0)
            continue;
        ssize_t n = recv(fd, p, len, 0);
        if (n == 0)
            return -EPIPE;
        if (n < 0) {
            if (errno == EINTR || errno == EAGAIN)
                continue;
            return -errno;
        }
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

int h_raw_recv(int fd, ch_session_t *s, int timeout_ms, Chorus__Envelope **out)
{
    uint8_t hdr[CH_FRAME_HDR], tag[CH_FRAME_TAG];
    uint64_t deadline = ch_now_ms() + (uint64_t)timeout_ms;
    *out = NULL;
    int rc = recv_exact(fd, hdr, sizeof hdr, deadline);
    if (rc < 0)
        return rc;
    uint32_t len = (uint32_t)hdr[0] << 24 | (uint32_t)hdr[1] << 16 | (uint32_t)hdr[2] << 8 | hdr[3];
    if (len > CH_FRAME_MAX_DEFAULT)
        return CH_E_TOOBIG;
    uint8_t *payload = malloc(len ? len : 1);
    if (!payload)
        return -ENOMEM;
    rc = recv_exact(fd, payload, len, deadline);
    if (rc == 0)
        rc = recv_exact(fd, tag, sizeof tag, deadline);
    if (rc == 0)
        rc = ch_msg_decode(s, payload, len, tag, out);
    free(payload);
    return rc;
}

static int send_env(int fd, ch_session_t *s, Chorus__Envelope *env)
{
    uint8_t *frame = NULL;
    size_t len = 0;
    int rc = ch_msg_encode(s, env, &frame, &len);
    if (rc == 0)
        rc = h_send_all(fd, frame, len);
    free(frame);
    return rc;
}

int h_raw_handshake(int fd, const ch_key_t *key, const char *role, int send_bad_proof,
                    ch_session_t *s)
{
    uint8_t nc[CH_NONCE_LEN], ns[CH_NONCE_LEN], proof[CH_PROOF_LEN];
    Chorus__Envelope env = CHORUS__ENVELOPE__INIT, *resp = NULL;
    Chorus__AuthHello hello = CHORUS__AUTH_HELLO__INIT;
    Chorus__AuthProof ap = CHORUS__AUTH_PROOF__INIT;
    int rc;

    ch_auth_nonce(nc);
    hello.nonce.data = nc;
    hello.nonce.len = sizeof nc;
    hello.role = (char *)role;
    env.body_case = CHORUS__ENVELOPE__BODY_AUTH_HELLO;
    env.auth_hello = &hello;
    CH_CHECK_GOTO(send_env(fd, NULL, &env), rc, out);
    CH_CHECK_GOTO(h_raw_recv(fd, NULL, 3000, &resp), rc, out);
    if (resp->body_case != CHORUS__ENVELOPE__BODY_AUTH_CHALLENGE ||
        resp->auth_challenge->nonce.len != CH_NONCE_LEN) {
        rc = CH_E_FRAME;
        goto out;
    }
    memcpy(ns, resp->auth_challenge->nonce.data, CH_NONCE_LEN);
    if (!send_bad_proof)
        CH_CHECK_GOTO(ch_auth_check_proof(key, "chorus-s", nc, ns, resp->auth_challenge->proof.data,
                                          resp->auth_challenge->proof.len),
                      rc, out);
    ch_msg_free(resp);
    resp = NULL;
    ch_auth_proof(key, "chorus-c", nc, ns, proof);
    if (send_bad_proof)
        proof[0] ^= 0x5a;
    ap.proof.data = proof;
    ap.proof.len = sizeof proof;
    env.body_case = CHORUS__ENVELOPE__BODY_AUTH_PROOF;
    env.auth_proof = &ap;
    CH_CHECK_GOTO(send_env(fd, NULL, &env), rc, out);
    /* an older client: it offers no tag but HMAC-SHA256 */
    ch_session_init_keyed(s, 0, key, nc, ns, CH_MAC_HMAC_SHA256);
    CH_CHECK_GOTO(h_raw_recv(fd, s, 3000, &resp), rc, out);
    if (resp->body_case != CHORUS__ENVELOPE__BODY_AUTH_RESULT || !resp->auth_result->ok)
        rc = CH_E_AUTH;
out:
    ch_msg_free(resp);
    return rc;
}

int h_peer_closed(int fd, int timeout_ms)
{
    uint64_t deadline = ch_now_ms() + (uint64_t)timeout_ms;
    uint8_t buf[4096];
    for (;;) {
        uint64_t now = ch_now_ms();
        if (now >= deadline)
            return 0;
        struct pollfd q = {fd, POLLIN, 0};
        int r = poll(&q, 1, (int)(deadline - now));
        if (r <= 0)
            continue;
        ssize_t n = recv(fd, buf, sizeof buf, 0);
        if (n == 0 || (n < 0 && errno == ECONNRESET))
            return 1;
    }
}
