/* A coordinator with simulated nodes (chorus-simnode, DESIGN §13), shared by the scale
 * test and chorus-bench-scale. coordinatord runs as its own process (so its CPU and
 * memory can be read from /proc), chorus-simnode as another, driven through its control
 * interface on a pair of pipes. Every wait is bounded. Header-only, like recovery_util.h. */
#ifndef SCALE_UTIL_H
#define SCALE_UTIL_H

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/auth.h"
#include "common/client.h"
#include "common/err.h"
#include "common/msg.h"
#include "common/util.h"
#include "harness.h"

typedef struct sc_cluster {
    h_cluster_t h; /* dir, sock, key, addr: what the harness's helpers need */
    pid_t coord, sim;
    int sim_in, sim_out; /* our ends: commands to the simulator, its replies */
    char rbuf[4096];
    size_t rlen;
    int sim_progress_ms; /* chorus-simnode --progress-ms (0: each rank's report at once) */
} sc_cluster_t;

typedef struct sc_stats {
    unsigned long long nodes, registered, ranks, rdzv, done, min_step, max_step, events, kv_errors,
        starts, kills, heartbeats; /* heartbeats: 0 from an older simulator */
} sc_stats_t;

typedef struct sc_job {
    char state[32];
    uint64_t generation, step, restarts;
    int64_t last_ckpt;
} sc_job_t;

static inline double sc_now(void)
{
    return (double)ch_now_ns() / 1e9;
}

/* One socket per node in coordinatord and the simulator: raise our soft limit (children
 * inherit it). 0, or -EMFILE when the hard limit is too low for nodes. */
static inline int sc_raise_nofile(int nodes)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
        return -errno;
    rl.rlim_cur = rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &rl) < 0)
        return -errno;
    if (rl.rlim_cur < (rlim_t)nodes + 256) {
        fprintf(stderr, "scale: %d nodes need ulimit -n >= %d (hard limit %llu)\n", nodes,
                nodes + 256, (unsigned long long)rl.rlim_max);
        return -EMFILE;
    }
    return 0;
}

static inline pid_t sc_spawn(char *const argv[], const char *log, int in_fd, int out_fd,
                             int close_a, int close_b)
{
    pid_t pid = fork();
    if (pid < 0)
        return -errno;
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
            dup2(fd, 2);
            if (out_fd < 0)
                dup2(fd, 1);
        }
        if (in_fd >= 0)
            dup2(in_fd, 0);
        if (out_fd >= 0)
            dup2(out_fd, 1);
        if (close_a >= 0)
            close(close_a);
        if (close_b >= 0)
            close(close_b);
        execv(argv[0], argv);
        _exit(127);
    }
    return pid;
}

/* Start coordinatord in a fresh directory under $CHORUS_TEST_TMP. */
static inline int sc_coord_start(sc_cluster_t *c, const char *dir, long hb_ms, long dead_ms)
{
    char exe[PATH_MAX], state[PATH_MAX], log[PATH_MAX], addr_file[PATH_MAX], hb[24], dead[24];
    memset(c, 0, sizeof *c);
    c->coord = c->sim = -1;
    c->sim_in = c->sim_out = -1;
    if (strlen(dir) > 3000)
        return -ENAMETOOLONG;
    snprintf(c->h.dir, sizeof c->h.dir, "%.3000s", dir);
    snprintf(c->h.sock, sizeof c->h.sock, "%.3000s/ctl.sock", dir);
    snprintf(c->h.key, sizeof c->h.key, "%.3000s/cluster.key", dir);
    snprintf(state, sizeof state, "%.3000s/state", dir);
    snprintf(log, sizeof log, "%.3000s/coordinatord.log", dir);
    snprintf(addr_file, sizeof addr_file, "%.3000s/coordinatord.addr", state);
    snprintf(hb, sizeof hb, "%ld", hb_ms);
    snprintf(dead, sizeof dead, "%ld", dead_ms);
    int rc = ch_key_generate(c->h.key);
    if (rc < 0)
        return rc;
    h_bin("coordinatord", exe);
    char *argv[] = {exe,
                    "--listen",
                    "127.0.0.1:0",
                    "--ctl-socket",
                    c->h.sock,
                    "--state-dir",
                    state,
                    "--key",
                    c->h.key,
                    "--heartbeat-ms",
                    hb,
                    "--dead-after-ms",
                    dead,
                    "--allow-root-jobs",
                    NULL};
    c->coord = sc_spawn(argv, log, -1, -1, -1, -1);
    if (c->coord < 0)
        return (int)c->coord;
    for (int i = 0; i < 1000; i++) { /* up to 10 s for its address */
        FILE *f = fopen(addr_file, "r");
        if (f) {
            int ok = fgets(c->h.addr, sizeof c->h.addr, f) != NULL;
            fclose(f);
            if (ok) {
                c->h.addr[strcspn(c->h.addr, "\n")] = 0;
                return 0;
            }
        }
        if (h_gone(c->coord))
            return -ESRCH;
        usleep(10000);
    }
    return -ETIMEDOUT;
}

static inline int sc_sim_start(sc_cluster_t *c, int nodes, int slots, int racks, int step_ms)
{
    char exe[PATH_MAX], log[PATH_MAX], n[16], s[16], r[16], st[16], pm[16];
    int to[2], from[2];
    snprintf(log, sizeof log, "%.3000s/simnode.log", c->h.dir);
    snprintf(n, sizeof n, "%d", nodes);
    snprintf(s, sizeof s, "%d", slots);
    snprintf(r, sizeof r, "%d", racks);
    snprintf(st, sizeof st, "%d", step_ms);
    snprintf(pm, sizeof pm, "%d", c->sim_progress_ms);
    h_bin("chorus-simnode", exe);
    if (pipe(to) < 0)
        return -errno;
    if (pipe(from) < 0) {
        close(to[0]);
        close(to[1]);
        return -errno;
    }
    char *argv[] = {exe, "--coordinator", c->h.addr, "--key",   c->h.key, "--nodes",
                    n,   "--slots",       s,         "--racks", r,        "--step-ms",
                    st,  "--progress-ms", pm,        NULL};
    c->sim = sc_spawn(argv, log, to[0], from[1], to[1], from[0]);
    close(to[0]);
    close(from[1]);
    c->sim_in = to[1];
    c->sim_out = from[0];
    return c->sim < 0 ? (int)c->sim : 0;
}

/* Send one command line, read its one reply line (without the newline) into out. */
static inline int sc_sim_cmd(sc_cluster_t *c, const char *cmd, char *out, size_t n, int timeout_ms)
{
    char line[256];
    int len = snprintf(line, sizeof line, "%s\n", cmd);
    if (c->sim_in < 0 || write(c->sim_in, line, (size_t)len) != len)
        return -EPIPE;
    uint64_t deadline = ch_now_ms() + (uint64_t)timeout_ms;
    for (;;) {
        char *nl = memchr(c->rbuf, '\n', c->rlen);
        if (nl) {
            size_t k = (size_t)(nl - c->rbuf);
            snprintf(out, n, "%.*s", (int)k, c->rbuf);
            memmove(c->rbuf, nl + 1, c->rlen - k - 1);
            c->rlen -= k + 1;
            return strncmp(out, "error", 5) == 0 ? -EINVAL : 0;
        }
        uint64_t now = ch_now_ms();
        if (now >= deadline)
            return -ETIMEDOUT;
        struct pollfd p = {.fd = c->sim_out, .events = POLLIN};
        if (poll(&p, 1, (int)(deadline - now)) <= 0)
            continue;
        ssize_t r = read(c->sim_out, c->rbuf + c->rlen, sizeof c->rbuf - c->rlen - 1);
        if (r <= 0)
            return -EPIPE;
        c->rlen += (size_t)r;
    }
}

static inline unsigned long long sc_field(const char *line, const char *key)
{
    char pat[40];
    snprintf(pat, sizeof pat, " %s=", key);
    const char *p = strstr(line, pat);
    return p ? strtoull(p + strlen(pat), NULL, 10) : 0;
}

static inline int sc_sim_stats(sc_cluster_t *c, sc_stats_t *st)
{
    char line[512];
    int rc = sc_sim_cmd(c, "stats", line, sizeof line, 10000);
    if (rc < 0)
        return rc;
    st->nodes = sc_field(line, "nodes");
    st->registered = sc_field(line, "registered");
    st->ranks = sc_field(line, "ranks");
    st->rdzv = sc_field(line, "rdzv");
    st->done = sc_field(line, "done");
    st->min_step = sc_field(line, "min_step");
    st->max_step = sc_field(line, "max_step");
    st->events = sc_field(line, "events");
    st->kv_errors = sc_field(line, "kv_errors");
    st->starts = sc_field(line, "starts");
    st->kills = sc_field(line, "kills");
    st->heartbeats = sc_field(line, "heartbeats");
    return 0;
}

/* A job's state without its ranks (ListJobs), as chorusctl jobs asks it. */
static inline int sc_job(const sc_cluster_t *c, const char *id, sc_job_t *out)
{
    ch_client_t *cl = NULL;
    Chorus__Envelope req = CHORUS__ENVELOPE__INIT, *resp = NULL;
    Chorus__ListJobs lj = CHORUS__LIST_JOBS__INIT;
    int rc = ch_client_connect_unix(c->h.sock, 5000, &cl);
    if (rc < 0)
        return rc;
    req.body_case = CHORUS__ENVELOPE__BODY_LIST_JOBS;
    req.list_jobs = &lj;
    rc = ch_client_call(cl, &req, 30000, &resp);
    if (rc == 0 && resp->body_case != CHORUS__ENVELOPE__BODY_JOB_LIST)
        rc = CH_E_FORMAT;
    if (rc == 0) {
        rc = CH_E_NOTFOUND;
        for (size_t i = 0; i < resp->job_list->n_jobs; i++) {
            const Chorus__JobInfo *j = resp->job_list->jobs[i];
            if (strcmp(j->id, id) != 0)
                continue;
            snprintf(out->state, sizeof out->state, "%s", j->state);
            out->generation = j->generation;
            out->step = j->step;
            out->restarts = j->restarts;
            out->last_ckpt = j->last_checkpoint_step;
            rc = 0;
        }
    }
    if (resp)
        ch_msg_free(resp);
    ch_client_destroy(cl);
    return rc;
}

static inline void sc_stop(sc_cluster_t *c)
{
    char out[64];
    if (c->sim > 0) {
        if (sc_sim_cmd(c, "quit", out, sizeof out, 5000) < 0 || h_kill_wait(c->sim, 0, 10000) < 0)
            h_kill_wait(c->sim, SIGKILL, 5000);
        waitpid(c->sim, NULL, WNOHANG);
        c->sim = -1;
    }
    if (c->sim_in >= 0)
        close(c->sim_in);
    if (c->sim_out >= 0)
        close(c->sim_out);
    c->sim_in = c->sim_out = -1;
    if (c->coord > 0) {
        if (h_kill_wait(c->coord, SIGTERM, 15000) < 0)
            h_kill_wait(c->coord, SIGKILL, 5000);
        waitpid(c->coord, NULL, WNOHANG);
        c->coord = -1;
    }
}

/* CPU seconds (user + system) and resident memory (bytes) of a process, from /proc. */
static inline int sc_proc_usage(pid_t pid, double *cpu_s, double *rss_bytes)
{
    char path[64], buf[2048];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return -errno;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *p = strrchr(buf, ')'); /* the command name may hold spaces */
    unsigned long long ut = 0, st = 0;
    long rss_pages = 0;
    if (!p || sscanf(p + 2,
                     "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu %*d %*d %*d %*d %*d "
                     "%*d %*u %*u %ld",
                     &ut, &st, &rss_pages) != 3)
        return CH_E_FORMAT;
    *cpu_s = (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
    *rss_bytes = (double)rss_pages * (double)sysconf(_SC_PAGESIZE);
    return 0;
}

/* A 3-D training job file for the simulated nodes (their ranks only read the layout,
 * steps and checkpoint interval). */
static inline void sc_job_ini(char *out, size_t n, const char *dir, int tp, int pp, int dp,
                              int steps, int every, int max_restarts)
{
    snprintf(out, n,
             "[job]\nname = scale\nkind = train\n"
             "[model]\nlayers = %d\nheads = %d\nembd = %d\nvocab = 256\nseq_len = 16\n"
             "[parallel]\ntp = %d\npp = %d\ndp = %d\nmicrobatches = %d\nmicro_batch_size = 1\n"
             "[train]\nsteps = %d\n"
             "[checkpoint]\ndir = %s/ckpt\nevery = %d\n"
             "[fault]\nmax_restarts = %d\n",
             pp, tp, tp * 8, tp, pp, dp, pp, steps, dir, every, max_restarts);
}

#endif
