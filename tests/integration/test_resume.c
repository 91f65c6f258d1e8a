/* A run that outlives its cluster: checkpoints keyed by job.name and run id
 * (common/run.h), train.resume = auto, a checkpoint on request, and rank logs served by
 * workerd.
 *
 *  - bit identity: a dp 2 run on two nodes is checkpointed on request (chorusctl
 *    checkpoint) mid-run, its whole cluster killed -9, and the same job file submitted to a
 *    new `local up` continues it to the end: its final weights equal, bit for bit, those of
 *    the same job run without interruption on a third cluster; its metrics.jsonl holds
 *    each step once;
 *  - another layout: a run checkpointed on SIGUSR1 to coordinatord (what sbatch
 *    --signal=B:USR1@T sends), killed, and continued in dp 1 ends within the layout
 *    tolerance of the uninterrupted dp 2 run;
 *  - refusals at submit, nothing queued: a fresh job into a folder holding another run, a
 *    resume path of another model, a checkpoint folder the user cannot write;
 *  - logs --follow on a 2-node cluster prints both nodes' ranks while the job runs. */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"
#include "recovery_util.h"

TestSuite(resume, .fini = h_teardown, .timeout = 300);

#define STEPS 600
/* Layouts sum in another order: their curves part slowly (test_elastic's tolerance holds
 * over tens of steps, not hundreds), so the layout change is checked on a shorter run. */
#define LAYOUT_STEPS 60

/* A folder outside every cluster's dir, shared by the clusters of one test. */
static void shared_dir(char *out, size_t n, const char *what)
{
    const char *tmp = getenv("CHORUS_TEST_TMP");
    snprintf(out, n, "%s/resume-%s-%d", tmp && *tmp ? tmp : "/tmp", what, (int)getpid());
    cr_assert_eq(ch_mkdirs(out, 0755), 0, "mkdir %s", out);
}

/* The job: a small model, dp x 1 x 1, checkpoints only at the end and on request. */
static void write_job(const char *path, const char *ckpt, int dp, int steps)
{
    char text[4096];
    snprintf(text, sizeof text,
             "[job]\nname = cont\nkind = train\n"
             "[model]\nlayers = 2\nheads = 2\nembd = 32\nseq_len = 16\n"
             "[parallel]\ndp = %d\nmicro_batch_size = %d\n"
             "[train]\nsteps = %d\nlr = 0.002\nwarmup = 10\nseed = 11\nresume = auto\n"
             "log_every = 50\n"
             "[checkpoint]\ndir = %s\nkeep = 2\n[fault]\nmax_restarts = 0\n",
             dp, 8 / dp, steps, ckpt);
    cr_assert_eq(h_write_file(path, text), 0);
}

static void export_last(const char *folder, int steps, const char *out)
{
    h_out_t o;
    char last[32];
    snprintf(last, sizeof last, "step-%08d", steps);
    cr_assert_eq(h_ctl(NULL, &o, "export", folder, "--out", out, NULL), 0);
    cr_assert_eq(o.status, 0, "export %s: %s", folder, o.err);
    cr_assert(h_has(o.out, last), "export of %s: %s", folder, o.out);
    h_out_free(&o);
}

/* The uninterrupted run on its own cluster, exported to out. */
static void reference(const char *ckpt_root, int steps, const char *out)
{
    h_cluster_t c;
    h_out_t o;
    char job[PATH_MAX + 16], folder[PATH_MAX + 16], id[64];
    cr_assert_eq(h_cluster_up(&c, 2, 1), 0);
    snprintf(job, sizeof job, "%s/ref.ini", c.dir);
    write_job(job, ckpt_root, 2, steps);
    cr_assert_eq(h_submit_wait(&c, &o, job, id, sizeof id), 0, "%s%s", o.out, o.err);
    h_out_free(&o);
    h_cluster_down(&c);
    snprintf(folder, sizeof folder, "%s/cont", ckpt_root);
    export_last(folder, steps, out);
}

/* Each step's loss from root/cont/metrics.jsonl into loss[1..steps]; 0 when every step
 * is there once. */
static int read_losses(const char *root, int steps, double *loss)
{
    char path[PATH_MAX + 32], *text = NULL;
    size_t len = 0;
    int n = 0;
    snprintf(path, sizeof path, "%s/cont/metrics.jsonl", root);
    if (ch_file_read(path, 1u << 26, &text, &len) < 0)
        return -1;
    for (char *p = text; (p = strstr(p, "{\"step\": ")); p++) {
        long s = strtol(p + 9, NULL, 10);
        char *l = strstr(p, "\"loss\": ");
        if (s < 1 || s > steps || !l || s != ++n)
            break;
        loss[s] = strtod(l + 8, NULL);
    }
    free(text);
    return n == steps ? 0 : -1;
}

/* The largest relative difference between two runs' losses, step by step; -1 when a
 * history is incomplete. */
static double worst_loss_rel(const char *root_a, const char *root_b, int steps)
{
    double a[LAYOUT_STEPS + 1], b[LAYOUT_STEPS + 1], worst = 0;
    if (steps > LAYOUT_STEPS || read_losses(root_a, steps, a) < 0 ||
        read_losses(root_b, steps, b) < 0)
        return -1;
    for (int s = 1; s <= steps; s++)
        worst = fmax(worst, fabs(a[s] - b[s]) / fabs(a[s]));
    return worst;
}

/* Submit the job, wait until it ran `at` steps, ask for a checkpoint and wait for its
 * commit, then kill -9 every process of the cluster: the committed step into *step. */
static void run_until_killed(h_cluster_t *c, const char *job, uint64_t at, int steps, int usr1,
                             int64_t *step)
{
    char id[64];
    rt_job_t w;
    h_out_t o;
    cr_assert_eq(h_ctl(c, &o, "submit", job, NULL), 0);
    cr_assert_eq(o.status, 0, "submit: %s", o.err);
    snprintf(id, sizeof id, "%.*s", (int)strcspn(o.out, "\n"), o.out);
    h_out_free(&o);
    cr_assert(rt_wait(&w, c, id, "running", at, 1, 60000), "%s: %s", w.state, w.reason);
    if (usr1) {
        cr_assert_eq(kill(h_pid(c, "coordinatord"), SIGUSR1), 0);
    } else {
        cr_assert_eq(h_ctl(c, &o, "checkpoint", id, NULL), 0);
        cr_assert_eq(o.status, 0, "checkpoint: %s", o.err);
        h_out_free(&o);
    }
    double last = -1;
    char state[32] = "";
    for (int i = 0; i < 1500 && !(last >= 1); i++) { /* null (NaN) until one */ /* bounded: 30 s */
        ch_json_t *js = h_ctl_json(c, "status", id, NULL);
        cr_assert_not_null(js);
        last = h_json_num(js, "last_checkpoint_step");
        snprintf(state, sizeof state, "%s", h_json_str(js, "state"));
        ch_json_free(js);
        if (!(last >= 1))
            usleep(20000);
    }
    cr_assert(last > 0 && last < steps,
              "the requested checkpoint came at step %g (of %d, state %s): the run was not "
              "interrupted",
              last, steps, state);
    *step = (int64_t)last;
    const char *who[] = {"coordinatord", "node1", "node2"};
    for (int i = 0; i < 3; i++) {
        pid_t p = h_pid(c, who[i]);
        if (p > 0)
            h_kill_wait(p, SIGKILL, 5000);
    }
    h_cluster_down(c); /* the ranks die with their workerd (PR_SET_PDEATHSIG) */
}

Test(resume, killed_cluster_continues_bit_identical_under_a_new_local_up)
{
    char root[PATH_MAX], ref_root[PATH_MAX], job[PATH_MAX + 16], folder[PATH_MAX + 16];
    char a[PATH_MAX + 32], b[PATH_MAX + 32], id[64], worst[256] = "", path[PATH_MAX + 64];
    h_cluster_t c1, c2;
    h_out_t o;
    int64_t step = 0;

    shared_dir(ref_root, sizeof ref_root, "ref");
    snprintf(a, sizeof a, "%s/ref.safetensors", ref_root);
    reference(ref_root, STEPS, a);

    shared_dir(root, sizeof root, "cont");
    cr_assert_eq(h_cluster_up(&c1, 2, 1), 0);
    snprintf(job, sizeof job, "%s/cont.ini", root);
    write_job(job, root, 2, STEPS);
    run_until_killed(&c1, job, 40, STEPS, 0, &step);

    /* The newest step committed on disk when the cluster died: the one status showed, or a
     * later commit that landed between that status and the kill. The new run must resume
     * from exactly it. */
    int64_t newest = 0;
    for (int64_t k = STEPS; k >= step && !newest; k--) {
        snprintf(path, sizeof path, "%s/cont/step-%08lld/manifest.json", root, (long long)k);
        if (access(path, F_OK) == 0)
            newest = k;
    }
    cr_assert(newest >= step, "no committed step at or after %lld in %s/cont", (long long)step,
              root);
    step = newest;

    cr_assert_eq(h_cluster_up(&c2, 2, 1), 0); /* a new coordinator: its first job is j1 again */
    cr_assert_eq(h_submit_wait(&c2, &o, job, id, sizeof id), 0, "%s%s", o.out, o.err);
    h_out_free(&o);
    cr_assert_eq(h_ctl(&c2, &o, "logs", id, "--rank", "0", NULL), 0);
    char want[96];
    snprintf(want, sizeof want, "resumed from step %lld", (long long)step);
    cr_assert(h_has(o.out, want), "rank 0 did not resume from step %lld:\n%s", (long long)step,
              o.out);
    h_out_free(&o);
    h_cluster_down(&c2);

    snprintf(folder, sizeof folder, "%s/cont", root);
    snprintf(b, sizeof b, "%s/cont.safetensors", root);
    export_last(folder, STEPS, b);
    double rel = rt_worst_rel_l2(a, b, worst, sizeof worst);
    fprintf(stderr, "resume: killed after step %lld, continued: relative L2 %.3g (%s)\n",
            (long long)step, rel, worst);
    cr_assert(rel == 0.0, "the continued run differs from the uninterrupted one: %s by %g", worst,
              rel);

    /* the history: every step once, in order, across both clusters */
    char *text = NULL;
    size_t len = 0;
    snprintf(path, sizeof path, "%s/metrics.jsonl", folder);
    cr_assert_eq(ch_file_read(path, 1u << 26, &text, &len), 0, "%s", path);
    long expect = 1, lines = 0;
    for (char *p = text; (p = strstr(p, "{\"step\": ")); p++, lines++, expect++)
        cr_assert_eq(strtol(p + 9, NULL, 10), expect, "%s: line %ld", path, lines + 1);
    cr_assert_eq(lines, STEPS, "%s holds %ld lines", path, lines);
    free(text);
}

Test(resume, continued_into_another_layout_within_tolerance)
{
    char root[PATH_MAX], job[PATH_MAX + 16], folder[PATH_MAX + 16], a[PATH_MAX + 32];
    char b[PATH_MAX + 32], id[64], worst[256] = "";
    h_cluster_t c1, c2;
    h_out_t o;
    int64_t step = 0;

    char ref_root[PATH_MAX];
    shared_dir(ref_root, sizeof ref_root, "layout-ref");
    snprintf(a, sizeof a, "%s/ref.safetensors", ref_root);
    reference(ref_root, LAYOUT_STEPS, a); /* the dp 2 run, uninterrupted */
    shared_dir(root, sizeof root, "layout");
    snprintf(folder, sizeof folder, "%s/cont", root);

    cr_assert_eq(h_cluster_up(&c1, 2, 1), 0);
    snprintf(job, sizeof job, "%s/cont.ini", root);
    write_job(job, root, 2, LAYOUT_STEPS);
    run_until_killed(&c1, job, 10, LAYOUT_STEPS, 1, &step);

    cr_assert_eq(h_cluster_up(&c2, 1, 1), 0); /* one node now: dp 1, same global batch */
    write_job(job, root, 1, LAYOUT_STEPS);
    cr_assert_eq(h_submit_wait(&c2, &o, job, id, sizeof id), 0, "%s%s", o.out, o.err);
    h_out_free(&o);
    h_cluster_down(&c2);
    snprintf(b, sizeof b, "%s/dp1.safetensors", root);
    export_last(folder, LAYOUT_STEPS, b);
    double rel = rt_worst_rel_l2(a, b, worst, sizeof worst);
    double loss_rel = worst_loss_rel(ref_root, root, LAYOUT_STEPS);
    fprintf(stderr,
            "resume: dp 2 until step %lld, then dp 1: losses within %.3g (relative) of the dp 2 "
            "run; final weights' relative L2 %.3g (%s)\n",
            (long long)step, loss_rel, rel, worst);
    cr_assert(loss_rel >= 0 && loss_rel <= 1e-4, "a step's loss differs by %g (relative)",
              loss_rel);
    cr_assert(rel >= 0 && rel <= 1e-3, "tensor %s differs by %g (relative L2)", worst, rel);
}

/* Submit expecting a refusal naming `needle`; and nothing queued. */
static void refused(const h_cluster_t *c, const char *job, const char *needle)
{
    h_out_t o;
    cr_assert_eq(h_ctl(c, &o, "submit", job, NULL), 0);
    cr_assert_neq(o.status, 0, "%s was accepted: %s", job, o.out);
    cr_assert(h_has(o.err, needle), "refusal of %s does not say '%s': %s", job, needle, o.err);
    h_out_free(&o);
    ch_json_t *js = h_ctl_json(c, "jobs", NULL);
    cr_assert_not_null(js);
    cr_assert_eq(js->nkids, 0, "a refused job was queued");
    ch_json_free(js);
}

Test(resume, bad_input_refused_at_submit)
{
    char root[PATH_MAX], job[PATH_MAX + 16], other[PATH_MAX + 200], ro[PATH_MAX + 16];
    char text[2 * PATH_MAX + 512], run[PATH_MAX + 64];
    h_cluster_t c;
    cr_assert_eq(h_cluster_up(&c, 1, 1), 0);
    shared_dir(root, sizeof root, "bad");

    /* a folder that holds another run's checkpoints: a fresh job may not write there */
    snprintf(run, sizeof run, "%s/cont", root);
    cr_assert_eq(ch_mkdirs(run, 0755), 0);
    snprintf(text, sizeof text,
             "{\"format\": \"chorus-run-1\", \"run_id\": \"r-0123456789abcdef\", \"name\": "
             "\"cont\", \"created_ms\": 1, \"model\": {\"layers\": 2, \"heads\": 2, \"embd\": "
             "32, \"vocab\": 32, \"seq_len\": 16}, \"resumed_from\": \"\"}\n");
    snprintf(other, sizeof other, "%s/run.json", run);
    cr_assert_eq(h_write_file(other, text), 0);
    snprintf(job, sizeof job, "%s/fresh.ini", root);
    snprintf(text, sizeof text,
             "[job]\nname = cont\n[model]\nlayers = 2\nheads = 2\nembd = 32\nseq_len = 16\n"
             "[train]\nsteps = 10\n[checkpoint]\ndir = %s\n",
             root);
    cr_assert_eq(h_write_file(job, text), 0);
    refused(&c, job, "holds run r-0123456789abcdef");

    /* a resume path of another model: a committed step of 2 layers, a job of 3 */
    h_out_t o;
    char id[64], small[PATH_MAX + 16];
    snprintf(small, sizeof small, "%s/small.ini", root);
    snprintf(text, sizeof text,
             "[job]\nname = small\n[model]\nlayers = 2\nheads = 2\nembd = 32\nseq_len = 16\n"
             "[train]\nsteps = 5\n[checkpoint]\ndir = %s\n",
             root);
    cr_assert_eq(h_write_file(small, text), 0);
    cr_assert_eq(h_submit_wait(&c, &o, small, id, sizeof id), 0, "%s%s", o.out, o.err);
    h_out_free(&o);
    snprintf(text, sizeof text,
             "[job]\nname = bigger\n[model]\nlayers = 3\nheads = 2\nembd = 32\nseq_len = 16\n"
             "[train]\nsteps = 10\nresume = %s/small\n[checkpoint]\ndir = %s\n",
             root, root);
    cr_assert_eq(h_write_file(job, text), 0);
    /* the small job is listed (completed): refused() counts jobs, so compare with one */
    cr_assert_eq(h_ctl(&c, &o, "submit", job, NULL), 0);
    cr_assert_neq(o.status, 0, "a resume of another model was accepted");
    cr_assert(h_has(o.err, "train.resume") && h_has(o.err, "another model"), "%s", o.err);
    h_out_free(&o);

    /* a checkpoint folder the job's user cannot write (not as root: root writes anything) */
    if (geteuid() == 0)
        return;
    snprintf(ro, sizeof ro, "%s/ro", root);
    cr_assert_eq(mkdir(ro, 0555), 0);
    snprintf(text, sizeof text,
             "[job]\nname = denied\n[model]\nlayers = 2\nheads = 2\nembd = 32\nseq_len = 16\n"
             "[train]\nsteps = 10\n[checkpoint]\ndir = %s/sub\n",
             ro);
    cr_assert_eq(h_write_file(job, text), 0);
    cr_assert_eq(h_ctl(&c, &o, "submit", job, NULL), 0);
    cr_assert_neq(o.status, 0, "a job into a read-only folder was accepted");
    cr_assert(h_has(o.err, "checkpoint.dir") && h_has(o.err, ro) && h_has(o.err, "uid"),
              "the refusal names neither the path nor the user: %s", o.err);
    h_out_free(&o);
}

Test(resume, logs_follow_shows_both_nodes_ranks)
{
    char job[PATH_MAX + 16], text[1024], sock[PATH_MAX + 16], bin[PATH_MAX];
    h_cluster_t c;
    h_out_t o;
    cr_assert_eq(h_cluster_up(&c, 2, 1), 0);
    snprintf(job, sizeof job, "%s/follow.ini", c.dir);
    snprintf(text, sizeof text,
             "[job]\nname = follow\n[model]\nlayers = 2\nheads = 2\nembd = 32\nseq_len = 16\n"
             "[parallel]\ndp = 2\nmicro_batch_size = 4\n[train]\nsteps = 200\nlog_every = 20\n");
    cr_assert_eq(h_write_file(job, text), 0);
    cr_assert_eq(h_ctl(&c, &o, "submit", job, NULL), 0);
    cr_assert_eq(o.status, 0, "%s", o.err);
    char id[64];
    snprintf(id, sizeof id, "%.*s", (int)strcspn(o.out, "\n"), o.out);
    h_out_free(&o);
    /* started at once: --follow waits for the ranks' logs, then ends with the job */
    h_bin("chorusctl", bin);
    snprintf(sock, sizeof sock, "%s", c.sock);
    char *argv[] = {bin, "--socket", sock, "logs", id, "--follow", NULL};
    cr_assert_eq(h_run(&o, 120000, argv), 0, "logs --follow did not end with the job");
    cr_assert_eq(o.status, 0, "logs --follow: %s", o.err);
    cr_assert(h_has(o.out, "[rank 0] ") && h_has(o.out, "[rank 1] "), "not both ranks' lines:\n%s",
              o.out);
    cr_assert(h_has(o.out, "node=node1") || h_has(o.out, "rank=0/2"), "%s", o.out);
    cr_assert(h_has(o.out, "step 200/200 loss="), "rank 0's last loss line is missing:\n%s", o.out);
    h_out_free(&o);
}
