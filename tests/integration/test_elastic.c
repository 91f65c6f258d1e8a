/* Elastic recovery (issue 9, fault.elastic): a dp = 2 job on two 1-slot nodes loses one
 * node for good. The restart no longer fits, so it resumes from the last committed
 * checkpoint in dp = 1 with twice the micro-batches (the global batch kept), the engine
 * resharding the checkpoint at load; the job completes, its status shows the layout
 * change, and its exported weights match an uninterrupted dp = 1 run of the same job
 * within 1e-4 (relative L2 per tensor). */
#include <criterion/criterion.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/json.h"
#include "harness.h"
#include "recovery_util.h"

TestSuite(elastic, .fini = h_teardown, .timeout = 240);

#define STEPS 30
#define EVERY 5

/* Export job id's last checkpoint (step STEPS) to DIR/<name>.safetensors. */
static void export_job(const h_cluster_t *c, const char *id, const char *name, char *out, size_t n)
{
    h_out_t o;
    char dir[PATH_MAX + 64], step[32];
    snprintf(dir, sizeof dir, "%s/ckpt/%s", c->dir, name); /* the run folder: job.name */
    snprintf(out, n, "%s/%s.safetensors", c->dir, name);
    snprintf(step, sizeof step, "step-%08d", STEPS);
    cr_assert_eq(h_ctl(NULL, &o, "export", dir, "--out", out, NULL), 0);
    cr_assert_eq(o.status, 0, "export %s: %s", id, o.err);
    cr_assert(h_has(o.out, step), "export of %s: %s", id, o.out);
    h_out_free(&o);
}

Test(elastic, node_lost_for_good_resumes_in_dp_1_and_matches_the_dp_1_run)
{
    h_cluster_t c;
    char ref[64], id[64], text[2048], a[PATH_MAX + 64], b[PATH_MAX + 64], worst[128] = "";
    rt_job_t w;
    cr_assert_eq(h_cluster_up(&c, 2, 1), 0);

    /* The reference: the same job at dp = 1 (64 sequences a step), uninterrupted. */
    cr_assert_eq(rt_job_text(&c, text, sizeof text, "ref", 1, STEPS, EVERY, NULL), 0);
    cr_assert_eq(rt_submit(&c, "ref.ini", text, ref, sizeof ref), 0);
    cr_assert(rt_wait(&w, &c, ref, NULL, 0, 0, 90000), "reference job still %s", w.state);
    cr_assert_str_eq(w.state, "completed", "reference: %s", w.reason);
    export_job(&c, ref, "ref", a, sizeof a);

    /* dp = 2 (32 sequences a rank), elastic, on both nodes. */
    cr_assert_eq(rt_job_text(&c, text, sizeof text, "elastic", 2, STEPS, EVERY,
                             "max_restarts = 3\nelastic = yes\n"),
                 0);
    cr_assert_eq(rt_submit(&c, "elastic.ini", text, id, sizeof id), 0);
    cr_assert(rt_wait(&w, &c, id, "running", 12, 1, 60000), "%s: %s", w.state, w.reason);
    ch_json_t *js = h_ctl_json(&c, "status", id, NULL);
    cr_assert_not_null(js);
    const ch_json_t *ranks = ch_json_get(js, "ranks");
    cr_assert(ranks && ranks->nkids == 2);
    char victim[32];
    snprintf(victim, sizeof victim, "%s", h_json_str(h_json_at(ranks, 1), "node"));
    ch_json_free(js);
    fprintf(stderr, "elastic: step %llu: kill -9 workerd %s for good\n", (unsigned long long)w.step,
            victim);
    cr_assert_eq(h_kill_wait(h_pid(&c, victim), SIGKILL, 2000), 0);

    cr_assert(rt_wait(&w, &c, id, NULL, 0, 0, 120000), "elastic job still %s: %s", w.state,
              w.reason);
    cr_assert_str_eq(w.state, "completed", "elastic: %s", w.reason);
    js = h_ctl_json(&c, "status", id, NULL);
    cr_assert_not_null(js);
    cr_assert_eq(h_json_num(js, "world_size"), 1);
    const ch_json_t *layout = ch_json_get(js, "layout");
    cr_assert_eq(h_json_num(layout, "dp"), 1);
    cr_assert_eq(h_json_num(js, "microbatches"), 2);
    const ch_json_t *hist = ch_json_get(js, "history");
    cr_assert(hist && hist->nkids >= 1);
    const ch_json_t *h = h_json_at(hist, hist->nkids - 1);
    const ch_json_t *from = ch_json_get(h, "layout_from"), *to = ch_json_get(h, "layout_to");
    cr_assert(from && to, "no layout change in the history");
    cr_assert_eq(h_json_num(from, "dp"), 2);
    cr_assert_eq(h_json_num(from, "microbatches"), 1);
    cr_assert_eq(h_json_num(from, "micro_batch_size"), 32);
    cr_assert_eq(h_json_num(to, "dp"), 1);
    cr_assert_eq(h_json_num(to, "microbatches"), 2);
    cr_assert_eq(h_json_num(to, "micro_batch_size"), 32);
    double resumed = h_json_num(h, "resumed_from");
    cr_assert(resumed > 0 && (long)resumed % EVERY == 0, "resumed from %g", resumed);
    fprintf(stderr, "elastic: %s (%s) resumed from %g in dp 1\n", h_json_str(h, "cause"),
            h_json_str(h, "reason"), resumed);
    ch_json_free(js);

    /* The layout change is in the coordinator's log (and the job's stored events). */
    char path[PATH_MAX + 32], *log = NULL;
    size_t len = 0;
    snprintf(path, sizeof path, "%s/coordinatord.log", c.dir);
    cr_assert_eq(ch_file_read(path, 64u << 20, &log, &len), 0);
    cr_assert(h_has(log, "fault.elastic: restart 1 resumes in tp 1 x pp 1 x dp 1 (microbatches 2 "
                         "x micro_batch_size 32), was tp 1 x pp 1 x dp 2"),
              "no layout change in %s", path);
    free(log);

    export_job(&c, id, "elastic", b, sizeof b);
    double rel = rt_worst_rel_l2(a, b, worst, sizeof worst);
    fprintf(stderr, "elastic: worst relative L2 against the dp 1 run: %.3g (%s)\n", rel, worst);
    cr_assert(rel >= 0 && rel <= 1e-4, "tensor %s differs by %g (relative L2)", worst, rel);
}
