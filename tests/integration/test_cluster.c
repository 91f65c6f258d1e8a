/* A local cluster comes up, reports its nodes, and runs a diag job to completion. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "chorus/config.h"
#include "common/gpus.h"
#include "common/util.h"
#include "harness.h"

TestSuite(cluster, .fini = h_teardown, .timeout = 120);

Test(cluster, local_up_lists_alive_nodes)
{
    h_cluster_t c;
    h_out_t o;

    cr_assert_eq(h_cluster_up(&c, 3, 2), 0, "local up failed");
    printf("RESULT name=local_up_3x2 value=%.3f unit=s\n", c.up_seconds);
    cr_assert(c.up_seconds > 0 && c.up_seconds < 10.0, "local up took %.3f s", c.up_seconds);

    ch_json_t *nodes = h_ctl_json(&c, "nodes", NULL);
    cr_assert_not_null(nodes);
    cr_assert_eq(nodes->type, CH_JSON_ARRAY);
    cr_assert_eq(nodes->nkids, 3, "expected 3 nodes, got %zu", nodes->nkids);
    int seen[4] = {0};
    for (size_t i = 0; i < nodes->nkids; i++) {
        const ch_json_t *n = h_json_at(nodes, i);
        const char *name = h_json_str(n, "name");
        cr_assert_str_eq(h_json_str(n, "state"), "alive", "%s is %s", name, h_json_str(n, "state"));
        cr_assert_eq(h_json_num(n, "slots"), 2.0, "%s slots", name);
        cr_assert_eq(h_json_num(n, "free_slots"), 2.0, "%s free_slots", name);
        cr_assert_not_null(ch_json_get(n, "rack"), "%s has no rack field", name);
        int k = 0;
        cr_assert(sscanf(name, "node%d", &k) == 1 && k >= 1 && k <= 3, "odd name %s", name);
        seen[k]++;
    }
    cr_assert(seen[1] == 1 && seen[2] == 1 && seen[3] == 1, "node names are not node1..node3");
    ch_json_free(nodes);

    /* Human output: an aligned table with a header and one line per node. */
    cr_assert_eq(h_ctl(&c, &o, "nodes", NULL), 0);
    cr_assert_eq(o.status, 0);
    cr_assert(strncmp(o.out, "NAME", 4) == 0 && strstr(o.out, "node3"), "table:\n%s", o.out);
    h_out_free(&o);

    /* A second up on a running dir refuses and says so. */
    cr_assert_eq(h_ctl(NULL, &o, "local", "up", "--dir", c.dir, "--nodes", "1", NULL), 0);
    cr_assert_eq(o.status, 1, "second up: exit %d", o.status);
    cr_assert(h_has(o.err, "already running"), "second up said: %s", o.err);
    h_out_free(&o);

    /* down stops everything; a second down is harmless. */
    pid_t coord = h_pid(&c, "coordinatord");
    h_cluster_down(&c);
    cr_assert(coord > 0 && h_gone(coord), "coordinatord %d still runs after down", (int)coord);
    cr_assert_eq(h_ctl(NULL, &o, "local", "down", "--dir", c.dir, NULL), 0);
    cr_assert_eq(o.status, 0);
    cr_assert(h_has(o.out, "nothing running"), "second down said: %s", o.out);
    h_out_free(&o);
    cr_assert_eq(h_ctl(&c, &o, "nodes", NULL), 0);
    cr_assert_eq(o.status, 69, "nodes after down: exit %d (%s)", o.status, o.err);
    cr_assert(h_has(o.err, "cannot reach coordinator"), "%s", o.err);
    h_out_free(&o);
}

static const char diag_job[] = "[job]\n"
                               "name = diag-smoke\n"
                               "kind = diag\n"
                               "[model]\n"
                               "heads = 4\n"
                               "embd = 64\n"
                               "[parallel]\n"
                               "tp = 2\n"
                               "dp = 3\n"
                               "[diag]\n"
                               "rounds = 3\n"
                               "gemm_size = 128\n";

Test(cluster, diag_job_completes_on_every_rank)
{
    h_cluster_t c;
    h_out_t o;
    char job[PATH_MAX + 16], id[64] = "";

    cr_assert_eq(h_cluster_up(&c, 3, 2), 0, "local up failed");
    snprintf(job, sizeof job, "%s/diag.ini", c.dir);
    cr_assert_eq(h_write_file(job, diag_job), 0);

    cr_assert_eq(h_ctl(&c, &o, "submit", job, "--wait", NULL), 0);
    cr_assert_eq(o.status, 0, "submit --wait: exit %d\n%s%s", o.status, o.out, o.err);
    cr_assert(sscanf(o.out, "%63s", id) == 1 && id[0] == 'j', "no job id in: %s", o.out);
    h_out_free(&o);

    ch_json_t *st = h_ctl_json(&c, "status", id, NULL);
    cr_assert_not_null(st);
    cr_assert_str_eq(h_json_str(st, "id"), id);
    cr_assert_str_eq(h_json_str(st, "name"), "diag-smoke");
    cr_assert_str_eq(h_json_str(st, "state"), "completed", "reason: %s", h_json_str(st, "reason"));
    cr_assert_eq(h_json_num(st, "world_size"), 6.0);
    const ch_json_t *layout = ch_json_get(st, "layout");
    cr_assert(h_json_num(layout, "tp") == 2 && h_json_num(layout, "pp") == 1 &&
              h_json_num(layout, "dp") == 3);
    for (const char *k = "generation\0restarts\0last_checkpoint_step\0tokens_per_s\0mfu\0loss\0"
                         "step\0total_steps\0";
         *k; k += strlen(k) + 1)
        cr_assert_not_null(ch_json_get(st, k), "status has no %s", k);
    const ch_json_t *ranks = ch_json_get(st, "ranks");
    cr_assert(ranks && ranks->type == CH_JSON_ARRAY && ranks->nkids == 6, "want 6 ranks");
    int seen[6] = {0};
    char nodes[6][64];
    size_t nnodes = 0;
    for (size_t i = 0; i < ranks->nkids; i++) {
        const ch_json_t *r = h_json_at(ranks, i);
        double rank = h_json_num(r, "rank"), gflops = h_json_num(r, "gflops");
        cr_assert(rank >= 0 && rank < 6, "rank %g", rank);
        seen[(int)rank]++;
        cr_assert(gflops > 0, "rank %g has gflops %g", rank, gflops);
        cr_assert_eq(h_json_num(r, "exit_code"), 0.0, "rank %g exit code", rank);
        const char *node = h_json_str(r, "node");
        size_t k = 0;
        while (k < nnodes && strcmp(nodes[k], node) != 0)
            k++;
        if (k == nnodes)
            snprintf(nodes[nnodes++], sizeof nodes[0], "%s", node);
    }
    for (int r = 0; r < 6; r++)
        cr_assert_eq(seen[r], 1, "rank %d listed %d times", r, seen[r]);
    cr_assert_eq(nnodes, 3, "6 ranks on 3 nodes of 2 slots must use all 3, used %zu", nnodes);
    ch_json_free(st);

    /* The finished job is listed, and watching it ends at once with its exit status. */
    ch_json_t *jobs = h_ctl_json(&c, "jobs", NULL);
    cr_assert(jobs && jobs->nkids == 1);
    cr_assert_str_eq(h_json_str(h_json_at(jobs, 0), "id"), id);
    ch_json_free(jobs);
    cr_assert_eq(h_ctl(&c, &o, "watch", "diag-smoke", NULL), 0);
    cr_assert_eq(o.status, 0, "watch: exit %d: %s", o.status, o.err);
    cr_assert(h_has(o.out, "completed"), "watch printed: %s", o.out);
    h_out_free(&o);

    /* Each rank wrote a log in its node's run dir. */
    cr_assert_eq(h_ctl(&c, &o, "logs", id, "--rank", "5", NULL), 0);
    cr_assert_eq(o.status, 0, "logs: exit %d: %s", o.status, o.err);
    h_out_free(&o);
}

/* The node named name in `chorusctl nodes --json`, alive: its device and slots. */
typedef struct node_probe {
    const h_cluster_t *c;
    const char *name;
    char device[16];
    double slots;
} node_probe_t;

static int node_alive(void *ud)
{
    node_probe_t *p = ud;
    ch_json_t *nodes = h_ctl_json(p->c, "nodes", NULL);
    int found = 0;
    for (size_t i = 0; nodes && i < nodes->nkids; i++) {
        const ch_json_t *n = h_json_at(nodes, i);
        if (strcmp(h_json_str(n, "name"), p->name) == 0 &&
            strcmp(h_json_str(n, "state"), "alive") == 0) {
            snprintf(p->device, sizeof p->device, "%s", h_json_str(n, "device"));
            p->slots = h_json_num(n, "slots");
            found = 1;
        }
    }
    ch_json_free(nodes);
    return found;
}

/* A GPU node's daemon must start wherever the build has CUDA: registering needs no GPU. A
 * build without CUDA refuses --device cuda at start (exit 78, configuration) and says why. */
Test(cluster, workerd_device_cuda_follows_the_build)
{
    h_cluster_t c;
    cr_assert_eq(h_cluster_up(&c, 1, 1), 0, "local up failed");
    cr_assert_eq(h_worker_spawn(&c, "gpu1", "2", "cuda"), 0);
    node_probe_t p = {.c = &c, .name = "gpu1"};
    if (CHORUS_HAVE_CUDA) {
        cr_assert(h_wait_until(node_alive, &p, 10000, 20) > 0,
                  "a CUDA build's workerd --device cuda did not register");
        cr_expect_str_eq(p.device, "cuda");
        cr_expect_eq(p.slots, 2.0);
    } else {
        pid_t pid = h_pid(&c, "gpu1");
        int st = 0;
        uint64_t deadline = ch_now_ms() + 10000;
        while (waitpid(pid, &st, WNOHANG) == 0 && ch_now_ms() < deadline)
            usleep(10000);
        cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 78,
                  "workerd --device cuda without CUDA: "
                  "status %#x, want exit 78",
                  st);
        char log[PATH_MAX + 16];
        snprintf(log, sizeof log, "%s/gpu1.log", c.dir);
        cr_assert(h_file_has_since(log, 0, "built without CUDA"), "no reason in %s", log);
    }

    /* auto: what the driver lists and CUDA_VISIBLE_DEVICES leaves (none on a CPU machine:
     * then a cpu node of one slot, never the 8 GPUs an example config once claimed). */
    int gpus = ch_gpus_visible(ch_gpus_present(CH_GPUS_PROC_DIR), getenv("CUDA_VISIBLE_DEVICES"));
    int cuda = gpus > 0 && CHORUS_HAVE_CUDA;
    cr_assert_eq(h_worker_spawn(&c, "auto1", "auto", "auto"), 0);
    node_probe_t a = {.c = &c, .name = "auto1"};
    cr_assert(h_wait_until(node_alive, &a, 10000, 20) > 0,
              "workerd --device auto did not register");
    cr_expect_str_eq(a.device, cuda ? "cuda" : "cpu");
    cr_expect_eq(a.slots, cuda ? (double)gpus : 1.0);
}
