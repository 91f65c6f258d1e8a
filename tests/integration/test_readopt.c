/* A workerd restart under a running job (workerd --keep-ranks, what the systemd unit runs):
 *
 *  - SIGTERM to workerd leaves its ranks running; a new workerd on the same run dir
 *    re-adopts them (they redial its agent.sock) and lists them in its Register, so the
 *    job completes with no restart in its history and final weights bit-identical to the
 *    same job run on a calm cluster;
 *  - a workerd gone for good: its ranks outlive it for CHORUS_RELINK_GRACE_MS, then exit. */
#include <criterion/criterion.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "harness.h"
#include "recovery_util.h"

TestSuite(readopt, .fini = h_teardown, .timeout = 300);

#define STEPS 400

static void write_job(const char *path, const char *ckpt, int steps)
{
    char text[4096];
    snprintf(text, sizeof text,
             "[job]\nname = adopt\nkind = train\n"
             "[model]\nlayers = 2\nheads = 2\nembd = 32\nseq_len = 16\n"
             "[parallel]\ndp = 2\nmicro_batch_size = 4\n"
             "[train]\nsteps = %d\nlr = 0.002\nwarmup = 10\nseed = 7\nlog_every = 50\n"
             "[checkpoint]\ndir = %s\nkeep = 1\n[fault]\nmax_restarts = 0\n",
             steps, ckpt);
    cr_assert_eq(h_write_file(path, text), 0);
}

/* A cluster of one node with two slots whose workerd runs with --keep-ranks. */
static void keep_cluster(h_cluster_t *c)
{
    cr_assert_eq(h_cluster_up(c, 1, 2), 0);
    cr_assert_eq(h_kill_wait(h_pid(c, "node1"), SIGINT, 10000), 0);
    cr_assert_eq(h_worker_spawn_flag(c, "node1", "2", "cpu", "--keep-ranks"), 0);
}

static int one_alive(void *ud)
{
    return h_alive_count(ud) == 1;
}

static int pid_gone(void *ud)
{
    return h_gone(*(pid_t *)ud);
}

/* A process that is not a recorded rank (this test) dials agent.sock: the new workerd
 * closes the link (its SO_PEERCRED pid is no rank's). */
static void stranger_refused(const h_cluster_t *c)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    int fd = socket(AF_UNIX, SOCK_STREAM, 0), ok = 0;
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/node1/agent.sock", c->dir);
    cr_assert_lt(strlen(path), sizeof sa.sun_path, "%s: too long for a socket", path);
    memcpy(sa.sun_path, path, strlen(path) + 1);
    for (int i = 0; i < 200 && !ok; i++) { /* until the new workerd listens: bounded, 10 s */
        ok = connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0;
        if (!ok)
            usleep(50000);
    }
    cr_assert(ok, "%s: nobody listens", sa.sun_path);
    cr_assert(h_peer_closed(fd, 5000), "workerd kept a link from a process that is no rank");
    close(fd);
}

static void export_last(const char *folder, const char *out)
{
    h_out_t o;
    cr_assert_eq(h_ctl(NULL, &o, "export", folder, "--out", out, NULL), 0);
    cr_assert_eq(o.status, 0, "export %s: %s", folder, o.err);
    h_out_free(&o);
}

/* The rank pids workerd recorded in DIR/node1/ranks.state (adopt.h); how many. */
static int recorded_pids(const h_cluster_t *c, pid_t *pids, int max)
{
    char path[PATH_MAX + 32], *text = NULL, *save = NULL;
    size_t len = 0;
    int n = 0;
    snprintf(path, sizeof path, "%s/node1/ranks.state", c->dir);
    if (ch_file_read(path, 1u << 20, &text, &len) < 0)
        return 0;
    for (char *l = strtok_r(text, "\n", &save); l && n < max; l = strtok_r(NULL, "\n", &save))
        if (l[0] != '#')
            pids[n++] = (pid_t)atoi(l);
    free(text);
    return n;
}

/* SIGTERM to node1's workerd, whose two ranks (pids[0..2), from its record) outlive it. */
static void sigterm_workerd(const h_cluster_t *c, pid_t *pids)
{
    pid_t got[4];
    int n = recorded_pids(c, got, 4);
    cr_assert_eq(n, 2, "ranks.state lists %d ranks", n);
    cr_assert_eq(h_kill_wait(h_pid(c, "node1"), SIGTERM, 10000), 0);
    for (int i = 0; i < n; i++) {
        pids[i] = got[i];
        cr_assert(!h_gone(pids[i]), "rank pid %d did not outlive its workerd", pids[i]);
    }
}

Test(readopt, restarted_workerd_keeps_the_job_bit_identical)
{
    char ref[PATH_MAX + 16], run[PATH_MAX + 16], job[PATH_MAX + 16], a[PATH_MAX + 32];
    char b[PATH_MAX + 32], id[64], worst[256] = "", log[PATH_MAX + 16];
    h_cluster_t c;
    h_out_t o;
    rt_job_t w;

    /* the calm run */
    cr_assert_eq(h_cluster_up(&c, 1, 2), 0);
    snprintf(ref, sizeof ref, "%s/ref", c.dir);
    snprintf(job, sizeof job, "%s/ref.ini", c.dir);
    write_job(job, ref, STEPS);
    cr_assert_eq(h_submit_wait(&c, &o, job, id, sizeof id), 0, "%s%s", o.out, o.err);
    h_out_free(&o);
    snprintf(a, sizeof a, "%s/ref.safetensors", c.dir);
    snprintf(ref + strlen(ref), sizeof ref - strlen(ref), "/adopt");
    export_last(ref, a);
    h_cluster_down(&c);

    /* the same job with a workerd restart in the middle */
    keep_cluster(&c);
    cr_assert(h_wait_until(one_alive, &c, 10000, 20) > 0, "the --keep-ranks workerd registers");
    snprintf(run, sizeof run, "%s/run", c.dir);
    snprintf(job, sizeof job, "%s/run.ini", c.dir);
    write_job(job, run, STEPS);
    cr_assert_eq(h_ctl(&c, &o, "submit", job, NULL), 0);
    cr_assert_eq(o.status, 0, "submit: %s", o.err);
    snprintf(id, sizeof id, "%.*s", (int)strcspn(o.out, "\n"), o.out);
    h_out_free(&o);
    cr_assert(rt_wait(&w, &c, id, "running", 40, 1, 60000), "%s: %s", w.state, w.reason);
    cr_assert(w.step < STEPS - 50, "the job ran to step %llu before the restart",
              (unsigned long long)w.step);
    uint64_t at = w.step;
    pid_t pids[2];
    sigterm_workerd(&c, pids);
    cr_assert_eq(h_worker_spawn_flag(&c, "node1", "2", "cpu", "--keep-ranks"), 0);
    stranger_refused(&c);

    cr_assert(rt_wait(&w, &c, id, NULL, 0, 0, 120000), "%s: %s", w.state, w.reason);
    cr_assert_str_eq(w.state, "completed", "%s", w.reason);
    cr_assert_eq(w.restarts, 0, "the job was restarted %u times", w.restarts);
    cr_assert_eq(w.gen, 1, "the job ended in generation %llu", (unsigned long long)w.gen);
    snprintf(log, sizeof log, "%s/node1.log", c.dir);
    cr_assert(h_file_has_since(log, 0, "redialled; re-adopted"), "no rank redialled");

    snprintf(run + strlen(run), sizeof run - strlen(run), "/adopt");
    snprintf(b, sizeof b, "%s/run.safetensors", c.dir);
    export_last(run, b);
    double rel = rt_worst_rel_l2(a, b, worst, sizeof worst);
    fprintf(stderr, "readopt: workerd restarted at step %llu; final weights' relative L2 %.3g\n",
            (unsigned long long)at, rel);
    cr_assert(rel == 0.0, "the run with a restart differs from the calm one: %s by %g", worst, rel);
}

Test(readopt, ranks_exit_after_the_grace_without_a_workerd)
{
    char ckpt[PATH_MAX + 16], job[PATH_MAX + 16];
    h_cluster_t c;
    h_out_t o;
    rt_job_t w;
    char id[64];

    setenv("CHORUS_RELINK_GRACE_MS", "2000", 1); /* passed on by workerd to its ranks */
    keep_cluster(&c);
    cr_assert(h_wait_until(one_alive, &c, 10000, 20) > 0, "the --keep-ranks workerd registers");
    snprintf(ckpt, sizeof ckpt, "%s/ckpt", c.dir);
    snprintf(job, sizeof job, "%s/long.ini", c.dir);
    write_job(job, ckpt, 1000000);
    cr_assert_eq(h_ctl(&c, &o, "submit", job, NULL), 0);
    cr_assert_eq(o.status, 0, "submit: %s", o.err);
    snprintf(id, sizeof id, "%.*s", (int)strcspn(o.out, "\n"), o.out);
    h_out_free(&o);
    cr_assert(rt_wait(&w, &c, id, "running", 5, 1, 60000), "%s: %s", w.state, w.reason);
    pid_t pids[2];
    sigterm_workerd(&c, pids);
    for (int i = 0; i < 2; i++)
        cr_assert(h_wait_until(pid_gone, &pids[i], 30000, 50) > 0,
                  "rank pid %d still runs 30 s after its workerd went", pids[i]);
    unsetenv("CHORUS_RELINK_GRACE_MS");
}
