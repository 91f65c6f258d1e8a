/* chorus-bench-scale: the control plane at 16,384 ranks, by simulation (issues 12 and 26,
 * DESIGN §12, §13).
 *
 * A real coordinatord (its own process: real protocol, authentication, SQLite) and
 * chorus-simnode running 2,048 nodes x 8 slots (+1 spare) on loopback, production
 * timings (heartbeat 1 s, dead after 5 s), one job of TP=8 x PP=16 x DP=128 whose ranks
 * step once a second and checkpoint every 20 steps. Measured, each as a RESULT line
 * against the goal:
 *
 *   nodes_alive          simulator start -> every node alive at the coordinator (< 3 s)
 *   start_running        submit -> every rank reported started, job running (< 2 s)
 *   start_rendezvous     submit -> every rank past its rendezvous (KvSet + 3 KvGets)
 *   coord_cpu, coord_rss coordinator at steady state: a heartbeat per node per second
 *                        where it sent nothing else in it (any message counts as one),
 *                        and every rank's progress each step, one NodeProgress per node
 *                        per --progress-ms (default 1000, workerd's; 0: one message per
 *                        rank per step, as before issue 26) (issue 26: <= 5% of a core,
 *                        < 200 MB)
 *   sim_cpu              the simulator's own CPU over the same window (one loop thread:
 *                        near 1 core it, not the coordinator, is the limit)
 *   status_ms, nodes_ms  `chorusctl status JOB` and `chorusctl nodes`, whole command,
 *                        median of 5 under that load (< 50 ms); status_ranks_ms: the
 *                        same with every rank's detail (`status JOB --ranks`); the
 *                        *_rpc_ms the same questions without chorusctl (issue 26: < 20 ms)
 *   detect_ms            a node's last heartbeat -> the job leaves running (<= dead
 *                        after + 500 ms); detect_cmd_ms: from the hang command instead
 *   recover_*            detection -> the next generation running, past rendezvous, and
 *                        its first step (the spare node takes the lost one's place)
 *
 * Flags scale it down: --nodes N --slots S --tp T --pp P --dp D --spares K --racks R
 * --heartbeat-ms MS --dead-after-ms MS --step-ms MS --steady-s S --progress-ms MS; 32,768
 * ranks: --nodes 4096 --dp 256. --keep keeps the
 * directory (coordinatord.log, simnode.log, the state) after a good run. Needs ulimit -n above
 * nodes + 256 (raised to the hard limit here; coordinatord inherits it). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "scale_util.h"
#include "support.h"

#define POLL_MS 20

typedef struct opts {
    int nodes, slots, tp, pp, dp, spares, racks, steady_s, keep;
    long hb_ms, dead_ms, step_ms, progress_ms;
} opts_t;

static void result(const char *name, double v, const char *unit, const char *ref, double ref_v)
{
    printf("RESULT name=scale.%s value=%.3f unit=%s ref=%s ref_value=%.3f ratio=%.3f\n", name, v,
           unit, ref, ref_v, ref_v ? v / ref_v : 0.0);
    fflush(stdout);
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static int usage(void)
{
    fprintf(stderr, "usage: chorus-bench-scale [--nodes N] [--slots S] [--tp T] [--pp P] [--dp D] "
                    "[--spares K] [--racks R] [--heartbeat-ms MS] [--dead-after-ms MS] "
                    "[--step-ms MS] [--steady-s S] [--progress-ms MS] [--keep]\n");
    return 2;
}

static int parse(int argc, char **argv, opts_t *o)
{
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--keep") == 0) {
            o->keep = 1;
            continue;
        }
        if (i + 1 >= argc)
            return -1;
        long v = strtol(argv[i + 1], NULL, 10);
        const char *f = argv[i++];
        if (strcmp(f, "--nodes") == 0)
            o->nodes = (int)v;
        else if (strcmp(f, "--slots") == 0)
            o->slots = (int)v;
        else if (strcmp(f, "--tp") == 0)
            o->tp = (int)v;
        else if (strcmp(f, "--pp") == 0)
            o->pp = (int)v;
        else if (strcmp(f, "--dp") == 0)
            o->dp = (int)v;
        else if (strcmp(f, "--spares") == 0)
            o->spares = (int)v;
        else if (strcmp(f, "--racks") == 0)
            o->racks = (int)v;
        else if (strcmp(f, "--heartbeat-ms") == 0)
            o->hb_ms = v;
        else if (strcmp(f, "--dead-after-ms") == 0)
            o->dead_ms = v;
        else if (strcmp(f, "--step-ms") == 0)
            o->step_ms = v;
        else if (strcmp(f, "--steady-s") == 0)
            o->steady_s = (int)v;
        else if (strcmp(f, "--progress-ms") == 0)
            o->progress_ms = v;
        else
            return -1;
    }
    if (o->nodes < 1 || o->slots < 1 || o->tp < 1 || o->pp < 1 || o->dp < 1 || o->spares < 0 ||
        o->racks < 1 || o->steady_s < 1 || o->step_ms < 1 || o->progress_ms < 0 ||
        (long)o->tp * o->pp * o->dp > (long)o->nodes * o->slots)
        return -1;
    return 0;
}

static int wait_alive(sc_cluster_t *c, int want, double timeout_s)
{
    double end = sc_now() + timeout_s;
    while (sc_now() < end) {
        if (h_alive_count(&c->h) >= want)
            return 0;
        usleep(POLL_MS * 1000);
    }
    return -ETIMEDOUT;
}

/* Until the job is in state (and at generation >= gen). */
static int wait_job(sc_cluster_t *c, const char *id, const char *state, uint64_t gen,
                    double timeout_s, sc_job_t *j)
{
    double end = sc_now() + timeout_s;
    while (sc_now() < end) {
        if (sc_job(c, id, j) == 0 && strcmp(j->state, state) == 0 && j->generation >= gen)
            return 0;
        usleep(POLL_MS * 1000);
    }
    return -ETIMEDOUT;
}

/* Until the simulator's ranks number world, all past rendezvous, at a step > min_step. */
static int wait_ranks(sc_cluster_t *c, unsigned long long world, unsigned long long min_step,
                      double timeout_s)
{
    double end = sc_now() + timeout_s;
    sc_stats_t st;
    while (sc_now() < end) {
        if (sc_sim_stats(c, &st) == 0 && st.ranks == world && st.rdzv == world &&
            (min_step == 0 || st.min_step > min_step))
            return 0;
        usleep(POLL_MS * 1000);
    }
    return -ETIMEDOUT;
}

static double ctl_ms(sc_cluster_t *c, const char *cmd, const char *arg, const char *flag)
{
    h_out_t o = {0};
    double t0 = sc_now();
    int rc = !arg    ? h_ctl(&c->h, &o, cmd, "--json", NULL)
             : !flag ? h_ctl(&c->h, &o, cmd, arg, "--json", NULL)
                     : h_ctl(&c->h, &o, cmd, arg, flag, "--json", NULL);
    double ms = (sc_now() - t0) * 1e3;
    if (rc < 0 || o.status != 0)
        ms = NAN;
    h_out_free(&o);
    return ms;
}

int main(int argc, char **argv)
{
    opts_t o = {.nodes = 2048,
                .slots = 8,
                .tp = 8,
                .pp = 16,
                .dp = 128,
                .spares = 1,
                .racks = 0,
                .steady_s = 10,
                .hb_ms = 1000,
                .dead_ms = 5000,
                .step_ms = 1000,
                .progress_ms = 1000};
    sc_cluster_t c;
    char dir[PATH_MAX], ini[1024], id[32], line[256];
    sc_job_t job;
    sc_stats_t st;
    int rc;

    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--racks") == 0 && i + 1 < argc)
            o.racks = atoi(argv[i + 1]);
    if (o.racks == 0) {
        /* 32 nodes a rack unless given */
        for (int i = 1; i + 1 < argc; i++)
            if (strcmp(argv[i], "--nodes") == 0)
                o.nodes = atoi(argv[i + 1]);
        o.racks = o.nodes >= 32 ? o.nodes / 32 : 1;
    }
    if (parse(argc, argv, &o) < 0)
        return usage();
    int total = o.nodes + o.spares;
    unsigned world = (unsigned)(o.tp * o.pp * o.dp);
    if (sc_raise_nofile(total) < 0 || ts_tmpdir("bench-scale", dir, sizeof dir) < 0)
        return 1;
    printf("scale: %d nodes x %d slots (+%d spare) in %d racks, job tp %d x pp %d x dp %d = %u "
           "ranks, heartbeat %ld ms, dead after %ld ms, step %ld ms, progress per node every %ld "
           "ms; in %s\n",
           o.nodes, o.slots, o.spares, o.racks, o.tp, o.pp, o.dp, world, o.hb_ms, o.dead_ms,
           o.step_ms, o.progress_ms, dir);
    fflush(stdout);
    if ((rc = sc_coord_start(&c, dir, o.hb_ms, o.dead_ms)) < 0) {
        fprintf(stderr, "coordinatord: %s\n", ch_strerror(rc));
        return 1;
    }
    c.sim_progress_ms = (int)o.progress_ms;

    /* 1. every node alive */
    double t0 = sc_now();
    if ((rc = sc_sim_start(&c, total, o.slots, o.racks, (int)o.step_ms)) < 0 ||
        (rc = wait_alive(&c, total, 300)) < 0) {
        fprintf(stderr, "nodes did not all come alive: %s\n", ch_strerror(rc));
        goto fail;
    }
    result("nodes_alive", sc_now() - t0, "s", "goal", 3.0);

    /* 2. the job: submit -> running -> past rendezvous */
    sc_job_ini(ini, sizeof ini, dir, o.tp, o.pp, o.dp, 100000, 20, 5);
    /* where the start's time goes: the coordinator's CPU, the simulator's, the rest waiting */
    double st_c0 = 0, st_c1 = 0, st_s0 = 0, st_s1 = 0, st_rss;
    (void)sc_proc_usage(c.coord, &st_c0, &st_rss);
    (void)sc_proc_usage(c.sim, &st_s0, &st_rss);
    double ts = sc_now();
    if ((rc = h_submit_raw(&c.h, ini, id, sizeof id)) < 0) {
        fprintf(stderr, "submit: %s\n", ch_strerror(rc));
        goto fail;
    }
    double t_submit = sc_now() - ts;
    if ((rc = wait_job(&c, id, "running", 1, 300, &job)) < 0) {
        fprintf(stderr, "job %s not running: %s\n", id, ch_strerror(rc));
        goto fail;
    }
    double t_run = sc_now() - ts;
    (void)sc_proc_usage(c.coord, &st_c1, &st_rss);
    (void)sc_proc_usage(c.sim, &st_s1, &st_rss);
    if ((rc = wait_ranks(&c, world, 0, 300)) < 0) {
        fprintf(stderr, "ranks not past rendezvous: %s\n", ch_strerror(rc));
        goto fail;
    }
    double t_rdzv = sc_now() - ts;
    printf("scale: submit answered in %.1f ms\n", t_submit * 1e3);
    printf("scale: submit -> running %.2f s: coordinator %.2f s of CPU, simulator %.2f s (of "
           "%.2f s of CPU on %ld cores)\n",
           t_run, st_c1 - st_c0, st_s1 - st_s0, t_run * (double)sysconf(_SC_NPROCESSORS_ONLN),
           sysconf(_SC_NPROCESSORS_ONLN));
    result("start_running", t_run, "s", "goal", 2.0);
    result("start_rendezvous", t_rdzv, "s", "goal", 2.0);

    /* 3. steady state: every rank stepping; then a window of steady_s seconds */
    if ((rc = wait_ranks(&c, world, 2, 60)) < 0) {
        fprintf(stderr, "ranks not stepping: %s\n", ch_strerror(rc));
        goto fail;
    }
    sleep(2);
    double cpu0, cpu1, rss, sim0, sim1, sim_rss, w0 = sc_now();
    sc_stats_t s0, s1;
    if (sc_proc_usage(c.coord, &cpu0, &rss) < 0 || sc_proc_usage(c.sim, &sim0, &sim_rss) < 0 ||
        sc_sim_stats(&c, &s0) < 0)
        goto fail;
    sleep((unsigned)o.steady_s);
    if (sc_proc_usage(c.coord, &cpu1, &rss) < 0 || sc_proc_usage(c.sim, &sim1, &sim_rss) < 0 ||
        sc_sim_stats(&c, &s1) < 0)
        goto fail;
    double dt = sc_now() - w0;
    /* What the messages stand for: the ranks' steps (a loaded simulator steps slower than
     * --step-ms, and then reports less than its ranks would) */
    double steps_s = (double)(s1.max_step - s0.max_step) / dt;
    printf("scale: steady state %.1f s: %.0f messages/s to the coordinator (rank events and node "
           "progress; plus %.0f heartbeats/s, at most %.0f) for %.0f rank steps/s (ranks at "
           "%.2f steps/s, steps %llu..%llu); coordinator %.1f us of CPU per rank step, %.1f us "
           "per message\n",
           dt, (double)(s1.events - s0.events) / dt, (double)(s1.heartbeats - s0.heartbeats) / dt,
           total * 1000.0 / (double)o.hb_ms, steps_s * world, steps_s, s1.min_step, s1.max_step,
           steps_s > 0 ? (cpu1 - cpu0) / dt / (steps_s * world) * 1e6 : 0.0,
           s1.events + s1.heartbeats > s0.events + s0.heartbeats
               ? (cpu1 - cpu0) / (double)(s1.events + s1.heartbeats - s0.events - s0.heartbeats) *
                     1e6
               : 0.0);
    result("coord_cpu", (cpu1 - cpu0) / dt, "core", "goal", 0.05);
    result("coord_rss", rss / 1e6, "MB", "goal", 200.0);
    result("sim_cpu", (sim1 - sim0) / dt, "core", "limit(one loop)", 1.0);

    /* 4. chorusctl under that load */
    double sv[5], nv[5], rv[5];
    for (int i = 0; i < 5; i++) {
        sv[i] = ctl_ms(&c, "status", id, NULL);
        nv[i] = ctl_ms(&c, "nodes", NULL, NULL);
        rv[i] = ctl_ms(&c, "status", id, "--ranks");
    }
    result("status_ms", median(sv, 5), "ms", "goal", 50.0);
    result("nodes_ms", median(nv, 5), "ms", "goal", 50.0);
    result("status_ranks_ms", median(rv, 5), "ms", "goal", 50.0);
    /* the same questions without chorusctl's process start: the coordinator's share */
    for (int i = 0; i < 5; i++) {
        Chorus__Envelope *r = NULL;
        double t1 = sc_now();
        sv[i] = h_job_query(&c.h, id, &r) == 0 ? (sc_now() - t1) * 1e3 : NAN;
        if (r)
            ch_msg_free(r);
        t1 = sc_now();
        nv[i] = h_alive_count(&c.h) >= 0 ? (sc_now() - t1) * 1e3 : NAN;
    }
    result("status_rpc_ms", median(sv, 5), "ms", "goal", 20.0);
    result("nodes_rpc_ms", median(nv, 5), "ms", "goal", 50.0);

    /* 5. a node stops heartbeating (it holds ranks of the job) */
    char victim[64];
    if (sc_sim_cmd(&c, "rank-node j1 0", victim, sizeof victim, 5000) < 0) {
        fprintf(stderr, "no node runs rank 0\n");
        goto fail;
    }
    snprintf(line, sizeof line, "hang %s", victim);
    double th = sc_now();
    if (sc_sim_cmd(&c, line, line, sizeof line, 5000) < 0)
        goto fail;
    /* "ok last_heartbeat_ms=T": silence counts from T (the same monotonic clock); an
     * older simulator says only "ok" */
    double t_hb = th;
    unsigned long long last_hb = sc_field(line, "last_heartbeat_ms");
    if (last_hb > 0 && (double)last_hb / 1e3 <= th + 5)
        t_hb = (double)last_hb / 1e3;
    double end = th + (double)o.dead_ms / 1e3 + 60;
    double t_det = NAN;
    while (sc_now() < end) {
        if (sc_job(&c, id, &job) == 0 && strcmp(job.state, "running") != 0) {
            t_det = sc_now();
            break;
        }
        usleep(5000);
    }
    if (isnan(t_det)) {
        fprintf(stderr, "node death not detected\n");
        goto fail;
    }
    result("detect_ms", (t_det - t_hb) * 1e3, "ms", "goal(dead_after+500)",
           (double)o.dead_ms + 500);
    result("detect_cmd_ms", (t_det - th) * 1e3, "ms", "goal(dead_after+500)",
           (double)o.dead_ms + 500);

    /* 6. recovery onto the spare */
    if (o.spares > 0) {
        if ((rc = wait_job(&c, id, "running", 2, 300, &job)) < 0) {
            fprintf(stderr, "job not running again: %s\n", ch_strerror(rc));
            goto fail;
        }
        double t_r = sc_now() - t_det;
        uint64_t resume = job.last_ckpt > 0 ? (uint64_t)job.last_ckpt : 0;
        if ((rc = wait_ranks(&c, world, 0, 300)) < 0)
            goto fail;
        double t_rz = sc_now() - t_det;
        if ((rc = wait_ranks(&c, world, resume, 300)) < 0)
            goto fail;
        double t_step = sc_now() - t_det;
        printf("scale: recovered from step %llu (generation %llu)\n", (unsigned long long)resume,
               (unsigned long long)job.generation);
        result("recover_running", t_r, "s", "goal", 2.0);
        result("recover_rendezvous", t_rz, "s", "goal", 2.0);
        result("recover_first_step", t_step, "s", "goal(issue10)", 3.0);
    }
    if (sc_sim_stats(&c, &st) == 0)
        printf("scale: simulator sent %llu rank events, %llu rendezvous errors\n", st.events,
               st.kv_errors);
    h_out_t co = {0};
    h_ctl(&c.h, &co, "cancel", id, NULL);
    h_out_free(&co);
    sc_stop(&c);
    if (o.keep)
        printf("scale: logs kept in %s\n", dir);
    else
        ts_rmrf(dir);
    return 0;
fail:
    fprintf(stderr, "logs kept in %s\n", dir);
    sc_stop(&c);
    return 1;
}
