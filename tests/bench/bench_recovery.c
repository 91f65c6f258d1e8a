/* chorus-bench-recovery: what a failure costs a training job (issue 10, DESIGN §9, §12).
 *
 * A local cluster (the integration harness: heartbeat 100 ms, dead after 1 s) runs one
 * long data-parallel job of the demo model (dp = 2 on two nodes, a third node idle as a
 * spare, checkpoint every 10 steps) per failure kind, and injects TRIALS failures into it
 * one after another, each once the job runs again and has gone a few steps further:
 *
 *   rank_kill        kill -9 of a rank process
 *   workerd_restart  kill -9 of a workerd, restarted at once (as systemd would)
 *   node_lost        kill -9 of a workerd, left dead (restarted once declared dead, so
 *                    the next trial has a spare again)
 *   hang             SIGSTOP of a rank, caught by fault.step_timeout = 2 s
 *   coordinator      kill -9 of coordinatord, restarted (the job is re-adopted, no restart)
 *
 * Per kind: detection latency (kill -> the coordinator records the failure; for node_lost
 * -> the node is declared dead), kill -> first completed step of the next generation, and
 * steps lost; median and max over the trials, as RESULT lines against the goals of issue
 * 10 (rank death < 100 ms; node death < dead-after + 200 ms; hang < step_timeout + 1 s;
 * next step < 3 s; steps lost <= checkpoint.every).
 *
 * Where a 3D restart's time goes (issue 27), kill -9 of a rank of a tp x pp x dp job:
 *
 *   rank_kill_3d     tp 2 x pp 2 x dp 2 on 2 nodes x 4 slots (no spare: the same nodes)
 *   rank_kill_16     tp 2 x pp 2 x dp 4 on 2 nodes x 8 slots: world 16 on real ranks
 *   rank_kill_3d_mem rank_kill_3d with checkpoint.memory_every = 1
 *   node_loss_3d_mem the same job on 3 nodes x 4 slots: a whole node lost (its workerd and
 *                    ranks killed -9, its memory dir removed), brought back empty as the
 *                    next trial's spare; the coordinator's dead-after is printed
 *
 * With memory checkpoints each restart also says where its state came from (memory |
 * disk), and the case fails when one read the disk (every piece had a live copy); goals:
 * kill -> past the killed step < 3 s (a node: < dead-after + 3 s), steps redone <= 1.
 *
 * Per trial the coordinator's phases of the restart (status history[].phases: kill and
 * confirm, placement, rank start, rendezvous and communicator setup, checkpoint load,
 * first step, steps redone until past the killed step) and the detection; median and max
 * of the trials, each as a ratio to the calm step time measured before the kill.
 *
 * And a straggler (issue 27's goal), case `straggler`: a dp = 2 job on 2 nodes runs
 * --calm-steps steps (1,000) with nobody slowed, counting every straggler named (a false
 * report; the run goes on to the end); then, TRIALS times, rank 1 is slowed by --slow F (1.5:
 * stopped a third of every 60 ms, so it computes at 1/F of its speed) until the coordinator names
 * it (steps from the slowing to the naming; goal 20), and left alone until it is cleared.
 * The workerd reports every step's figure once per progress interval (1 s by default: on a
 * quiet machine 7 of these steps), so naming waits up to an interval more than the 11
 * slowed steps; --progress-ms MS sets the workerds' interval. Each rank computes on one
 * thread (CHORUS_THREADS=1 unless set), as on two nodes with a core each.
 *
 * chorus-bench-recovery [--trials N] [--slow F] [--calm-steps N] [--progress-ms MS]
 * [CASE...]: the named cases only (all by default); a few minutes with no arguments on a
 * quiet machine. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <sys/wait.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/json.h"
#include "harness.h"
#include "recovery_util.h"

#define TRIALS       5 /* the most; --trials N asks for fewer */
#define EVERY        10
#define STEP_TIMEOUT 2 /* s, the hang trials */

typedef struct figures {
    double detect[TRIALS], next_step[TRIALS], lost[TRIALS];
    int n;
} figures_t;

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void result(const char *kind, const char *what, const char *unit, double *v, int n,
                   const char *ref, double ref_value)
{
    if (n == 0)
        return;
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    double median = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2, max = v[n - 1];
    printf("RESULT name=recovery.%s.%s.median value=%.1f unit=%s ref=%s ref_value=%.1f "
           "ratio=%.3f\n",
           kind, what, median, unit, ref, ref_value, ref_value ? median / ref_value : 0.0);
    printf("RESULT name=recovery.%s.%s.max value=%.1f unit=%s ref=%s ref_value=%.1f ratio=%.3f\n",
           kind, what, max, unit, ref, ref_value, ref_value ? max / ref_value : 0.0);
    fflush(stdout);
}

/* Job id's status (the caller frees it, NULL when unreachable) and in *h its restart
 * `want` (1-based; NULL while there is none). */
static ch_json_t *restart_at(const h_cluster_t *c, const char *id, size_t want, const ch_json_t **h)
{
    ch_json_t *js = h_ctl_json(c, "status", id, NULL);
    const ch_json_t *hist = js ? ch_json_get(js, "history") : NULL;
    *h = hist && hist->nkids >= want ? h_json_at(hist, want - 1) : NULL;
    return js;
}

/* The last restart of job id: detection time, recovery time, steps lost. 0 or -1. */
static int last_restart(const h_cluster_t *c, const char *id, size_t want, double *time_ms,
                        double *recover_s, double *lost)
{
    const ch_json_t *h;
    ch_json_t *js = restart_at(c, id, want, &h);
    int rc = -1;
    if (h) {
        *time_ms = h_json_num(h, "time_ms");
        *recover_s = h_json_num(h, "recover_s");
        *lost = h_json_num(h, "steps_lost");
        rc = *recover_s >= 0 ? 0 : -1;
    }
    ch_json_free(js);
    return rc;
}

/* The node (1-based) running rank r of job id. */
static int node_of(const h_cluster_t *c, const char *id, int r)
{
    ch_json_t *js = h_ctl_json(c, "status", id, NULL);
    if (!js)
        return -1;
    const ch_json_t *ranks = ch_json_get(js, "ranks");
    int node = ranks && ranks->nkids > (size_t)r
                   ? atoi(h_json_str(h_json_at(ranks, (size_t)r), "node") + strlen("node"))
                   : -1;
    ch_json_free(js);
    return node;
}

typedef struct node_dead {
    const h_cluster_t *c;
    const char *name;
    const char *want;
} node_dead_t;

static int node_is(void *ud)
{
    node_dead_t *d = ud;
    char st[32];
    return h_node_state(d->c, d->name, st, sizeof st) == 0 && strcmp(st, d->want) == 0;
}

/* One kind: a cluster, one long job, TRIALS failures. */
static int run_kind(const char *kind, int trials, figures_t *f)
{
    h_cluster_t c;
    char id[64], text[2048], name[32];
    rt_job_t w;
    int rc = -1;
    int hang = strcmp(kind, "hang") == 0, coord = strcmp(kind, "coordinator") == 0;

    memset(f, 0, sizeof *f);
    if (h_cluster_up(&c, 3, 1) < 0) {
        fprintf(stderr, "%s: local up failed\n", kind);
        return -1;
    }
    char fault[64];
    snprintf(fault, sizeof fault, "max_restarts = %d\nstep_timeout = %d\n", 2 * TRIALS,
             hang ? STEP_TIMEOUT : 60);
    if (rt_job_text(&c, text, sizeof text, kind, 2, 100000, EVERY, fault) < 0 ||
        rt_submit(&c, "bench.ini", text, id, sizeof id) < 0)
        goto out;
    for (int t = 0; t < trials; t++) {
        uint64_t gen = (uint64_t)t + 1 - (coord ? (uint64_t)t : 0);
        if (!rt_wait(&w, &c, id, "running", 0, gen, 60000) ||
            !rt_wait(&w, &c, id, "running", w.step + 15, gen, 60000)) {
            fprintf(stderr, "%s trial %d: job %s (%s)\n", kind, t, w.state, w.reason);
            goto out;
        }
        uint64_t step0 = w.step;
        int r = t % 2, node = node_of(&c, id, r);
        snprintf(name, sizeof name, "node%d", node);
        double t0 = (double)ch_wall_ms();
        uint64_t m0 = ch_now_ms();
        if (strcmp(kind, "rank_kill") == 0 || hang) {
            pid_t pid = rt_rank_pid(&c, node, id, w.gen, (uint32_t)r);
            if (pid <= 0 || kill(pid, hang ? SIGSTOP : SIGKILL) < 0)
                goto out;
        } else if (coord) {
            if (h_kill_wait(h_pid(&c, "coordinatord"), SIGKILL, 2000) < 0 ||
                h_coord_restart(&c) < 0)
                goto out;
            /* No failure: the ranks go on and are re-adopted. Time to the next step seen. */
            if (!rt_wait(&w, &c, id, "running", step0 + 1, gen, 30000))
                goto out;
            f->detect[f->n] = -1;
            f->next_step[f->n] = (double)(ch_now_ms() - m0);
            f->lost[f->n++] = 0;
            continue;
        } else {
            if (h_kill_wait(h_pid(&c, name), SIGKILL, 2000) < 0)
                goto out;
            if (strcmp(kind, "workerd_restart") == 0 && h_worker_restart(&c, node) < 0)
                goto out;
        }
        double node_ms = -1;
        if (strcmp(kind, "node_lost") == 0) {
            node_dead_t d = {&c, name, "dead"};
            if (h_wait_until(node_is, &d, 10000, 2) <= 0)
                goto out;
            node_ms = (double)(ch_now_ms() - m0);
        }
        double when = 0, took = 0, lost = 0;
        uint64_t end = ch_now_ms() + 60000;
        while (last_restart(&c, id, (size_t)t + 1, &when, &took, &lost) < 0) {
            if (ch_now_ms() > end)
                goto out;
            usleep(20000);
        }
        f->detect[f->n] = node_ms >= 0 ? node_ms : when - t0;
        f->next_step[f->n] = when + took * 1000 - t0;
        f->lost[f->n++] = lost;
        fprintf(stderr, "%s trial %d: detect %.0f ms, next step %.0f ms, %g steps lost\n", kind, t,
                f->detect[f->n - 1], f->next_step[f->n - 1], lost);
        if (strcmp(kind, "node_lost") == 0) {
            /* Bring it back as the next trial's spare. */
            node_dead_t d = {&c, name, "alive"};
            if (h_worker_restart(&c, node) < 0 || h_wait_until(node_is, &d, 10000, 10) <= 0)
                goto out;
        }
    }
    rc = 0;
out:
    if (rc < 0)
        fprintf(stderr, "%s: stopped after %d trials (cluster in %s)\n", kind, f->n, c.dir);
    h_cluster_down(&c);
    return rc;
}

/* The case is among those named on the command line (argv[first..]), or none are. */
static int wanted(const char *name, int argc, char **argv, int first)
{
    for (int i = first; i < argc; i++)
        if (strcmp(argv[i], name) == 0)
            return 1;
    return first >= argc;
}

// ---------------------------------------------------------------------------------------
// 3D jobs: where the restart's time goes

/* One 3D case: its cluster, layout, checkpoint.memory_every (0: off) and what fails. */
typedef struct case3d {
    const char *name;
    int nodes, slots, tp, pp, dp;
    int mem;       /* checkpoint.memory_every */
    int node_loss; /* a whole node (workerd and ranks) killed -9, else one rank */
} case3d_t;

/* The phases status reports (recovery_phase.c), in order. */
#define NPH 7
static const char *const PHASE[NPH] = {"kill_confirm", "placement",  "rank_start", "comm_setup",
                                       "ckpt_load",    "first_step", "redo"};

typedef struct figures3d {
    double detect[TRIALS], phase[NPH][TRIALS], total[TRIALS], redone[TRIALS], step_ms[TRIALS];
    int n, from_memory; /* restarts whose state came from the nodes' memory */
} figures3d_t;

static int job_text_3d(const h_cluster_t *c, const case3d_t *k, char *out, size_t n)
{
    int w = snprintf(out, n,
                     "[job]\nname = %s\nkind = train\n"
                     "[model]\nlayers = 2\nheads = 4\nembd = 64\nseq_len = 16\n"
                     "[parallel]\ntp = %d\npp = %d\ndp = %d\nmicrobatches = 2\n"
                     "micro_batch_size = 4\n"
                     "[train]\nsteps = 100000\nlr = 0.002\nwarmup = 20\nseed = 1337\n"
                     "[checkpoint]\ndir = %s/ckpt\nevery = %d\nkeep = 3\nmemory_every = %d\n"
                     "[fault]\nmax_restarts = %d\nstep_timeout = 120\n",
                     k->name, k->tp, k->pp, k->dp, c->dir, EVERY, k->mem, 2 * TRIALS);
    return w < 0 || (size_t)w >= n ? -1 : 0;
}

/* Restart `want` (1-based) of job id once it is past the killed step: its detection wall
 * time, phases (s), steps redone, where its state came from (memory | disk); 0, or -1
 * while not there yet. */
static int restart_phases(const h_cluster_t *c, const char *id, size_t want, double *time_ms,
                          double *ph, double *redone, char *source, size_t n)
{
    const ch_json_t *h;
    ch_json_t *js = restart_at(c, id, want, &h);
    int rc = -1;
    if (h) {
        const ch_json_t *p = ch_json_get(h, "phases");
        if (p && ch_json_get(p, "redo")) {
            *time_ms = h_json_num(h, "time_ms");
            *redone = h_json_num(h, "steps_lost");
            snprintf(source, n, "%s", *h_json_str(h, "source") ? h_json_str(h, "source") : "?");
            for (int k = 0; k < NPH; k++)
                ph[k] = h_json_num(p, PHASE[k]);
            rc = 0;
        }
    }
    ch_json_free(js);
    return rc;
}

/* Rank 0's last step time, ms (NaN when not reported). */
static double step_ms(const h_cluster_t *c, const char *id)
{
    ch_json_t *js = h_ctl_json(c, "status", id, NULL);
    if (!js)
        return NAN;
    const ch_json_t *ranks = ch_json_get(js, "ranks");
    const ch_json_t *t = ranks && ranks->nkids ? ch_json_get(h_json_at(ranks, 0), "time") : NULL;
    double v = t ? h_json_num(t, "step_s") * 1e3 : NAN;
    ch_json_free(js);
    return v;
}

/* What a 3D trial kills: one rank, or a whole node (its workerd and its ranks). */
typedef struct victim {
    pid_t pids[64]; /* the ranks */
    int n;
    pid_t workerd; /* a node's, else 0 */
    int node;
    char what[64];
} victim_t;

/* Find, before the clock starts, what case k fails in trial t of job id (seen as w): rank
 * (3t + 1) mod world, or every rank of its node and that node's workerd. 0 or -1. */
static int victim_find(const case3d_t *k, const h_cluster_t *c, const char *id, const rt_job_t *w,
                       int t, victim_t *v)
{
    uint32_t world = (uint32_t)(k->tp * k->pp * k->dp), r = (uint32_t)(t * 3 + 1) % world;
    ch_json_t *js = h_ctl_json(c, "status", id, NULL);
    const ch_json_t *ranks = js ? ch_json_get(js, "ranks") : NULL;
    int node_of_r[64] = {0};
    memset(v, 0, sizeof *v);
    for (uint32_t i = 0; ranks && i < world && i < 64 && ranks->nkids == world; i++)
        node_of_r[i] = atoi(h_json_str(h_json_at(ranks, i), "node") + strlen("node"));
    ch_json_free(js);
    v->node = node_of_r[r];
    if (v->node <= 0)
        return -1;
    for (uint32_t i = 0; i < world && i < 64; i++)
        if (i == r || (k->node_loss && node_of_r[i] == v->node))
            if ((v->pids[v->n++] = rt_rank_pid(c, v->node, id, w->gen, i)) <= 0)
                return -1;
    if (k->node_loss) {
        char name[32];
        snprintf(name, sizeof name, "node%d", v->node);
        if ((v->workerd = h_pid(c, name)) <= 0)
            return -1;
        snprintf(v->what, sizeof v->what, "node%d (rank %u's)", v->node, r);
    } else {
        snprintf(v->what, sizeof v->what, "rank %u", r);
    }
    return 0;
}

/* Kill -9 the victim, all at once; a lost node also loses its memory dir (its RAM). */
static int victim_kill(const h_cluster_t *c, const victim_t *v)
{
    if (v->workerd > 0 && kill(v->workerd, SIGKILL) < 0)
        return -1;
    for (int i = 0; i < v->n; i++)
        if (kill(v->pids[i], SIGKILL) < 0 && !v->workerd)
            return -1;
    if (!v->workerd)
        return 0;
    char mem[PATH_MAX];
    snprintf(mem, sizeof mem, "%s/node%d-mem", c->dir, v->node);
    int rc = h_kill_wait(v->workerd, SIGKILL, 2000) < 0 ? -1 : ch_rmtree(mem);
    return rc < 0 && rc != -ENOENT ? -1 : 0;
}

static int run_3d(const case3d_t *k, int trials, figures3d_t *f)
{
    h_cluster_t c;
    char id[64], text[2048];
    rt_job_t w;
    int rc = -1;

    memset(f, 0, sizeof *f);
    if (k->node_loss)
        printf("%s: coordinator dead-after %d ms (heartbeat %d ms)\n", k->name, H_DEAD_AFTER_MS,
               H_HEARTBEAT_MS);
    if (h_cluster_up(&c, k->nodes, k->slots) < 0) {
        fprintf(stderr, "%s: local up failed\n", k->name);
        return -1;
    }
    if (job_text_3d(&c, k, text, sizeof text) < 0 ||
        rt_submit(&c, "bench3d.ini", text, id, sizeof id) < 0)
        goto out;
    for (int t = 0; t < trials; t++) {
        uint64_t gen = (uint64_t)t + 1;
        /* past a checkpoint and a few steps into the next interval, as a failure would */
        if (!rt_wait(&w, &c, id, "running", 0, gen, 120000) ||
            !rt_wait(&w, &c, id, "running", w.step + EVERY + 3, gen, 300000)) {
            fprintf(stderr, "%s trial %d: job %s (%s)\n", k->name, t, w.state, w.reason);
            goto out;
        }
        double calm = step_ms(&c, id);
        char source[16];
        victim_t v;
        if (victim_find(k, &c, id, &w, t, &v) < 0)
            goto out;
        double t0 = (double)ch_wall_ms();
        if (victim_kill(&c, &v) < 0)
            goto out;
        double when = 0, ph[NPH], redone = 0;
        uint64_t end = ch_now_ms() + 300000;
        while (restart_phases(&c, id, (size_t)t + 1, &when, ph, &redone, source, sizeof source) <
               0) {
            if (ch_now_ms() > end)
                goto out;
            usleep(50000);
        }
        int i = f->n++;
        f->detect[i] = when - t0;
        f->total[i] = f->detect[i];
        printf("%s trial %d: %s killed at step %" PRIu64 ", calm step %.0f ms: detect %.0f ms",
               k->name, t, v.what, w.step, calm, f->detect[i]);
        for (int p = 0; p < NPH; p++) {
            f->phase[p][i] = ph[p] * 1e3;
            f->total[i] += f->phase[p][i];
            printf(", %s %.0f", PHASE[p], f->phase[p][i]);
        }
        f->redone[i] = redone;
        f->step_ms[i] = calm;
        f->from_memory += strcmp(source, "memory") == 0;
        printf(" ms; kill -> past the killed step %.0f ms (%.1f steps), %g steps redone, "
               "state from %s\n",
               f->total[i], calm > 0 ? f->total[i] / calm : 0.0, redone, source);
        fflush(stdout);
        if (k->node_loss) {
            /* back, with empty memory, as the next trial's spare */
            char name[32];
            snprintf(name, sizeof name, "node%d", v.node);
            node_dead_t d = {&c, name, "alive"};
            if (h_worker_restart(&c, v.node) < 0 || h_wait_until(node_is, &d, 10000, 10) <= 0)
                goto out;
        }
    }
    rc = 0;
out:
    if (rc < 0)
        fprintf(stderr, "%s: stopped after %d trials (cluster in %s)\n", k->name, f->n, c.dir);
    h_cluster_down(&c);
    return rc;
}

static double median_of(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* Each phase's median and max, as ratios to the median calm step; with memory
 * checkpoints the goals of issue 27 (kill -> past the killed step < 3 s, or < dead-after
 * + 3 s for a node; at most 1 step redone; every restart from memory). 0, or 1 when a
 * restart read the disk although every piece had a live copy. */
static int result_3d(const case3d_t *k, figures3d_t *f)
{
    const char *name = k->name;
    if (f->n == 0)
        return 0;
    int n = f->n, from_memory = f->from_memory;
    if (k->mem) {
        printf("%s: %d of %d restarts read their state from memory, %d from disk\n", name,
               from_memory, n, n - from_memory);
        printf("RESULT name=recovery.%s.restarts_from_disk value=%d unit=restarts ref=goal "
               "ref_value=0 ratio=0\n",
               name, n - from_memory);
        if (k->node_loss)
            result(name, "kill_to_past", "ms", f->total, n, "dead_after_plus_3s",
                   H_DEAD_AFTER_MS + 3000);
        else
            result(name, "kill_to_past", "ms", f->total, n, "goal", 3000);
    }
    double step = median_of(f->step_ms, f->n);
    char what[96];
    for (int p = 0; p <= NPH + 1; p++) {
        double *v = p < NPH ? f->phase[p] : p == NPH ? f->detect : f->total;
        snprintf(what, sizeof what, "phase.%s", p < NPH ? PHASE[p] : p == NPH ? "detect" : "total");
        result(name, what, "ms", v, f->n, "step_time", step);
    }
    if (k->mem)
        result(name, "steps_redone", "steps", f->redone, n, "goal", 1);
    else
        result(name, "steps_redone", "steps", f->redone, n, "checkpoint_every", EVERY);
    return k->mem && from_memory < n;
}

// ---------------------------------------------------------------------------------------
// A straggler: named within how many steps, and never in a calm run

typedef struct slow_opts {
    double factor;    /* --slow */
    long calm_steps;  /* --calm-steps */
    long progress_ms; /* --progress-ms: the workerds'; 0 their default (1 s) */
} slow_opts_t;

/* A child that slows pid to 1/factor of its speed (SIGSTOP for that share of every
 * 60 ms) until killed. Its pid, or -1. */
static pid_t slow_down(pid_t pid, double factor)
{
    pid_t child = fork();
    if (child != 0)
        return child;
    useconds_t period = 60000, stop = (useconds_t)(period * (1.0 - 1.0 / factor));
    for (;;) {
        kill(pid, SIGSTOP);
        usleep(stop);
        kill(pid, SIGCONT);
        usleep(period - stop);
    }
}

static void slow_stop(pid_t child, pid_t pid)
{
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    kill(pid, SIGCONT);
}

/* The job's step and straggler count now. 0 or -1. */
static int strag_now(const h_cluster_t *c, const char *id, uint64_t *step, uint32_t *count)
{
    Chorus__Envelope *r = NULL;
    if (h_job_query(c, id, &r) < 0)
        return -1;
    *step = r->job_info->step;
    *count = r->job_info->stragglers;
    ch_msg_free(r);
    return 0;
}

/* Poll until the count is (named) or is not (!named) above 0, or the job is past
 * `until` steps (0: no limit) or an hour passed. The step it happened at, or 0; *last:
 * the last step seen. */
static uint64_t strag_wait(const h_cluster_t *c, const char *id, int named, uint64_t until,
                           uint32_t *seen, uint64_t *last)
{
    uint64_t end = ch_now_ms() + 3600000, step = 0;
    uint32_t count = 0;
    *seen = 0;
    while (ch_now_ms() < end) {
        if (strag_now(c, id, &step, &count) == 0) {
            if (last)
                *last = step;
            if (count > *seen)
                *seen = count;
            if ((count > 0) == named)
                return step;
            if (until && step >= until)
                return 0;
        }
        usleep(20000);
    }
    return 0;
}

/* The calm run: poll until job id is past step `until` or an hour passed, counting each
 * time a straggler is named (a false report: nobody is slowed); *last: the last step seen. */
static uint32_t calm_reports(const h_cluster_t *c, const char *id, uint64_t until, uint64_t *last)
{
    uint64_t end = ch_now_ms() + 3600000, step = 0;
    uint32_t count = 0, before = 0, reports = 0;
    while (ch_now_ms() < end && *last < until) {
        if (strag_now(c, id, &step, &count) == 0) {
            *last = step;
            if (count > before) {
                reports += count - before;
                printf("straggler calm: false report at step %" PRIu64 "\n", step);
                fflush(stdout);
            }
            before = count;
        }
        usleep(20000);
    }
    return reports;
}

static int run_straggler(const slow_opts_t *o, int trials, figures_t *f)
{
    h_cluster_t c;
    char id[64], text[1024];
    rt_job_t w;
    int rc = -1;
    memset(f, 0, sizeof *f);
    if (o->progress_ms > 0) { /* workerd's progress-ms, as every option, from the environment */
        snprintf(text, sizeof text, "%ld", o->progress_ms);
        setenv("CHORUS_PROGRESS_MS", text, 1);
    }
    /* each node's rank computes on one thread, as two nodes with a core each: with the
     * workerds' default (the machine's cores shared by a node's ranks) the two ranks' four
     * threads take turns on the 2 cores, a noise no cluster of separate nodes has */
    const int threads_set = getenv("CHORUS_THREADS") != NULL;
    if (!threads_set)
        setenv("CHORUS_THREADS", "1", 1);
    int up = h_cluster_up(&c, 2, 1);
    unsetenv("CHORUS_PROGRESS_MS");
    if (!threads_set)
        unsetenv("CHORUS_THREADS");
    if (up < 0)
        return -1;
    /* steps of a few tens of milliseconds on a quiet machine */
    snprintf(text, sizeof text,
             "[job]\nname = slow\n[model]\nlayers = 4\nheads = 4\nembd = 192\nseq_len = 64\n"
             "[parallel]\ndp = 2\nmicro_batch_size = 8\n[train]\nsteps = 1000000\n");
    if (rt_submit(&c, "slow.ini", text, id, sizeof id) < 0 ||
        !rt_wait(&w, &c, id, "running", 1, 1, 60000))
        goto out;
    uint64_t t0 = ch_now_ms(), from = w.step, last = from;
    uint32_t seen = calm_reports(&c, id, from + (uint64_t)o->calm_steps, &last);
    double calm_s = (double)(ch_now_ms() - t0) / 1000.0;
    printf("straggler calm: steps %" PRIu64 "..%" PRIu64 " in %.0f s, %u false reports\n", from,
           last, calm_s, seen);
    printf("RESULT name=recovery.straggler.false_reports value=%u unit=ranks ref=goal "
           "ref_value=0 ratio=0\n",
           seen);
    fflush(stdout);
    if (last < from + (uint64_t)o->calm_steps) {
        fprintf(stderr, "straggler calm: cut at step %" PRIu64 " of %" PRIu64 " (the hour's cap)\n",
                last, from + (uint64_t)o->calm_steps);
        goto out;
    }
    pid_t pid = -1;
    for (int i = 0; i <= c.nodes && pid <= 0; i++)
        pid = rt_rank_pid(&c, i, id, 1, 1);
    if (pid <= 0)
        goto out;
    for (int t = 0; t < trials; t++) {
        uint64_t step0 = 0;
        uint32_t n = 0;
        /* nobody named (a false report of the calm run cleared) before the slowing */
        if (!strag_wait(&c, id, 0, 0, &n, NULL) || strag_now(&c, id, &step0, &n) < 0)
            goto out;
        pid_t child = slow_down(pid, o->factor);
        if (child < 0)
            goto out;
        uint64_t named = strag_wait(&c, id, 1, 0, &n, NULL);
        slow_stop(child, pid);
        if (!named)
            goto out;
        f->next_step[f->n++] = (double)(named - step0);
        printf("straggler trial %d: slowed %.2fx at step %" PRIu64 ", named at step %" PRIu64
               " (%" PRIu64 " steps)\n",
               t, o->factor, step0, named, named - step0);
        fflush(stdout);
    }
    rc = 0;
out:
    if (rc < 0)
        fprintf(stderr, "straggler: stopped after %d trials (cluster in %s)\n", f->n, c.dir);
    h_cluster_down(&c);
    return rc;
}

int main(int argc, char **argv)
{
    char exe[PATH_MAX], dir[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = 0;
        snprintf(dir, sizeof dir, "%s", exe);
        char *slash = strrchr(dir, '/');
        if (slash)
            *slash = 0;
        setenv("CHORUS_BIN_DIR", dir, 0);
    }
    signal(SIGPIPE, SIG_IGN);
    int trials = TRIALS, first = 1;
    slow_opts_t so = {1.5, 1000, 0};
    for (; first + 1 < argc && strncmp(argv[first], "--", 2) == 0; first += 2) {
        if (strcmp(argv[first], "--trials") == 0)
            trials = atoi(argv[first + 1]);
        else if (strcmp(argv[first], "--slow") == 0)
            so.factor = atof(argv[first + 1]);
        else if (strcmp(argv[first], "--calm-steps") == 0)
            so.calm_steps = atol(argv[first + 1]);
        else if (strcmp(argv[first], "--progress-ms") == 0)
            so.progress_ms = atol(argv[first + 1]);
        else
            break;
    }
    if (trials < 1 || trials > TRIALS || !(so.factor > 1 && so.factor <= 10) || so.calm_steps < 1 ||
        so.progress_ms < 0 || so.progress_ms > 60000) {
        fprintf(stderr,
                "usage: chorus-bench-recovery [--trials 1..%d] [--slow F (1..10)] "
                "[--calm-steps N] [--progress-ms MS] [CASE...]\n",
                TRIALS);
        return 2;
    }
    static const struct {
        const char *kind;
        const char *detect_ref;
        double detect_goal;
    } kinds[] = {
        {"rank_kill", "goal", 100},
        {"workerd_restart", "dead_after", H_DEAD_AFTER_MS},
        {"node_lost", "dead_after_plus_200ms", H_DEAD_AFTER_MS + 200},
        {"hang", "step_timeout_plus_1s", STEP_TIMEOUT * 1000 + 1000},
        {"coordinator", "none", 0},
    };
    static const case3d_t cases[] = {
        {"rank_kill_3d", 2, 4, 2, 2, 2, 0, 0},
        {"rank_kill_16", 2, 8, 2, 2, 4, 0, 0},
        {"rank_kill_3d_mem", 2, 4, 2, 2, 2, 1, 0},
        /* a spare node: the lost node's 4 ranks go there */
        {"node_loss_3d_mem", 3, 4, 2, 2, 2, 1, 1},
    };
    int failed = 0;
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        if (!wanted(kinds[k].kind, argc, argv, first))
            continue;
        figures_t f;
        if (run_kind(kinds[k].kind, trials, &f) < 0)
            failed = 1;
        if (kinds[k].detect_goal > 0)
            result(kinds[k].kind, "detect", "ms", f.detect, f.n, kinds[k].detect_ref,
                   kinds[k].detect_goal);
        result(kinds[k].kind, "kill_to_next_step", "ms", f.next_step, f.n, "goal", 3000);
        result(kinds[k].kind, "steps_lost", "steps", f.lost, f.n, "checkpoint_every", EVERY);
    }
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        if (!wanted(cases[k].name, argc, argv, first))
            continue;
        static figures3d_t f3;
        if (run_3d(&cases[k], trials, &f3) < 0 || result_3d(&cases[k], &f3))
            failed = 1;
    }
    if (wanted("straggler", argc, argv, first)) {
        figures_t f;
        if (run_straggler(&so, trials, &f) < 0)
            failed = 1;
        result("straggler", "steps_to_name", "steps", f.next_step, f.n, "goal", 20);
    }
    return failed;
}
