/* Chaos (issue 10): one data-parallel job on two nodes, with a spare node idle, survives
 * at random moments one after another: kill -9 of a rank, kill -9 of a workerd (restarted
 * at once, as systemd would), kill -9 of the coordinatord (restarted), and kill -9 of a
 * node's workerd for good. The job completes by itself, and the model it exports is
 * bit-identical to the same job's run without failures. The seed of the moments is
 * printed; CHORUS_CHAOS_SEED replays one. */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/json.h"
#include "harness.h"
#include "chaos_util.h"
#include "recovery_util.h"

TestSuite(chaos, .fini = h_teardown, .timeout = 240);

#define STEPS 300
#define EVERY 10

static uint64_t rng;

/* A number in [lo, hi]. */
static int pick(int lo, int hi)
{
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return lo + (int)((rng >> 33) % (uint64_t)(hi - lo + 1));
}

/* Run the job to completion and export its last checkpoint to DIR/<name>.safetensors. */
static void export_job(const h_cluster_t *c, const char *id, const char *name, char *out, size_t n)
{
    h_out_t o;
    char dir[PATH_MAX + 64];
    snprintf(dir, sizeof dir, "%s/ckpt/%s", c->dir, name); /* the run folder: job.name */
    snprintf(out, n, "%s/%s.safetensors", c->dir, name);
    cr_assert_eq(h_ctl(NULL, &o, "export", dir, "--out", out, NULL), 0);
    cr_assert_eq(o.status, 0, "export %s: %s", id, o.err);
    cr_assert(h_has(o.out, "step-00000300"), "export of %s: %s", id, o.out);
    h_out_free(&o);
}

Test(chaos, four_failures_end_bit_identical_to_the_calm_run)
{
    h_cluster_t c;
    char calm[64], chaos[64], text[2048], a[PATH_MAX + 64], b[PATH_MAX + 64];
    rt_job_t w;
    const char *env = getenv("CHORUS_CHAOS_SEED");
    rng = env && *env ? strtoull(env, NULL, 10) : ch_now_ns();
    fprintf(stderr, "chaos seed %llu (CHORUS_CHAOS_SEED replays it)\n", (unsigned long long)rng);

    cr_assert_eq(h_cluster_up(&c, 3, 1), 0);
    cr_assert_eq(rt_job_text(&c, text, sizeof text, "calm", 2, STEPS, EVERY, "max_restarts = 10\n"),
                 0);
    cr_assert_eq(rt_submit(&c, "calm.ini", text, calm, sizeof calm), 0);
    cr_assert(rt_wait(&w, &c, calm, NULL, 0, 0, 90000), "calm job still %s", w.state);
    cr_assert_str_eq(w.state, "completed", "calm: %s", w.reason);
    export_job(&c, calm, "calm", a, sizeof a);

    cr_assert_eq(
        rt_job_text(&c, text, sizeof text, "chaos", 2, STEPS, EVERY, "max_restarts = 10\n"), 0);
    cr_assert_eq(rt_submit(&c, "chaos.ini", text, chaos, sizeof chaos), 0);

    /* 1. kill -9 a rank process. */
    chaos_wait_running(&c, chaos, 1, 0, pick(5, 40), &w);
    int r = pick(0, 1), node = chaos_node_of(&c, chaos, r, 2);
    pid_t pid = rt_rank_pid(&c, node, chaos, w.gen, (uint32_t)r);
    cr_assert(pid > 0);
    fprintf(stderr, "chaos: step %llu: kill -9 rank %d (pid %d on node%d)\n",
            (unsigned long long)w.step, r, pid, node);
    cr_assert_eq(kill(pid, SIGKILL), 0);

    /* 2. kill -9 a workerd running a rank; restart it at once. */
    chaos_wait_running(&c, chaos, 2, 0, 0, &w);
    chaos_wait_running(&c, chaos, 2, w.step, pick(3, 20), &w);
    node = chaos_node_of(&c, chaos, pick(0, 1), 2);
    char name[32];
    snprintf(name, sizeof name, "node%d", node);
    fprintf(stderr, "chaos: step %llu: kill -9 workerd %s, restarted\n", (unsigned long long)w.step,
            name);
    cr_assert_eq(h_kill_wait(h_pid(&c, name), SIGKILL, 2000), 0);
    cr_assert_eq(h_worker_restart(&c, node), 0);

    /* 3. kill -9 the coordinator; restart it. */
    chaos_wait_running(&c, chaos, 3, 0, 0, &w);
    chaos_wait_running(&c, chaos, 3, w.step, pick(3, 20), &w);
    uint64_t gen = w.gen;
    fprintf(stderr, "chaos: step %llu: kill -9 coordinatord, restarted\n",
            (unsigned long long)w.step);
    cr_assert_eq(h_kill_wait(h_pid(&c, "coordinatord"), SIGKILL, 2000), 0);
    cr_assert_eq(h_coord_restart(&c), 0);

    /* 4. kill -9 a node's workerd for good: the spare takes its rank. */
    chaos_wait_running(&c, chaos, gen, 0, 0, &w);
    chaos_wait_running(&c, chaos, gen, w.step, pick(3, 20), &w);
    node = chaos_node_of(&c, chaos, pick(0, 1), 2);
    snprintf(name, sizeof name, "node%d", node);
    fprintf(stderr, "chaos: step %llu: kill -9 workerd %s for good\n", (unsigned long long)w.step,
            name);
    cr_assert_eq(h_kill_wait(h_pid(&c, name), SIGKILL, 2000), 0);

    cr_assert(rt_wait(&w, &c, chaos, NULL, 0, 0, 120000), "chaos job still %s", w.state);
    cr_assert_str_eq(w.state, "completed", "chaos: %s", w.reason);
    ch_json_t *js = h_ctl_json(&c, "status", chaos, NULL);
    cr_assert_not_null(js);
    const ch_json_t *hist = ch_json_get(js, "history");
    for (size_t i = 0; hist && i < hist->nkids; i++) {
        const ch_json_t *h = h_json_at(hist, i);
        fprintf(stderr, "chaos: restart %zu: %s: %s; resumed from %g, %g steps lost, %.2f s\n",
                i + 1, h_json_str(h, "cause"), h_json_str(h, "reason"),
                h_json_num(h, "resumed_from"), h_json_num(h, "steps_lost"),
                h_json_num(h, "recover_s"));
        cr_assert(h_json_num(h, "steps_lost") <= EVERY);
    }
    cr_assert(h_json_num(js, "restarts") >= 3, "restarts %g", h_json_num(js, "restarts"));
    ch_json_free(js);
    export_job(&c, chaos, "chaos", b, sizeof b);
    char why[256] = "";
    cr_assert(rt_same_weights(a, b, why, sizeof why),
              "the chaos run's weights differ from the calm run's: %s", why);
}
