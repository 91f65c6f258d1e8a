/* Chaos with in-memory peer checkpoints (issue 27 item 2): a tp 2 x pp 2 x dp 2 job with
 * checkpoint.memory_every = 1 on 3 nodes x 4 slots loses, in turn, a rank (kill -9), a node
 * (its workerd killed -9 for good: its ranks die with it) and the coordinator (kill -9,
 * restarted). It completes by itself with weights bit-identical to a calm run of the same
 * job, and the two restarts read their state from memory (history[].source), losing at most
 * the step in flight, although the disk holds only every 20th step. */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/json.h"
#include "harness.h"
#include "chaos_util.h"
#include "recovery_util.h"

TestSuite(chaos_memory, .fini = h_teardown, .timeout = 240);

#define STEPS 60
#define EVERY 20 /* disk: a restart from it would lose up to 19 steps */
#define WORLD 8

static void job_text(const h_cluster_t *c, const char *name, char *out, size_t n)
{
    int k = snprintf(out, n,
                     "[job]\nname = %s\nkind = train\n"
                     "[model]\nlayers = 2\nheads = 4\nembd = 32\nseq_len = 16\n"
                     "[parallel]\ntp = 2\npp = 2\ndp = 2\nmicrobatches = 2\n"
                     "micro_batch_size = 2\n"
                     "[train]\nsteps = %d\nlr = 0.002\nwarmup = 5\nseed = 1337\n"
                     "[checkpoint]\ndir = %s/ckpt\nevery = %d\nkeep = 2\nmemory_every = 1\n"
                     "[fault]\nmax_restarts = 10\n",
                     name, STEPS, c->dir, EVERY);
    cr_assert(k > 0 && (size_t)k < n);
}

static void export_job(const h_cluster_t *c, const char *name, char *out, size_t n)
{
    h_out_t o;
    char dir[PATH_MAX + 64];
    snprintf(dir, sizeof dir, "%s/ckpt/%s", c->dir, name);
    snprintf(out, n, "%s/%s.safetensors", c->dir, name);
    cr_assert_eq(h_ctl(NULL, &o, "export", dir, "--out", out, NULL), 0);
    cr_assert_eq(o.status, 0, "export %s: %s", name, o.err);
    h_out_free(&o);
}

typedef struct gone_wait {
    const h_cluster_t *c;
    const char *id;
} gone_wait_t;

/* 1 once no node's memory dir holds job id's in-memory checkpoints. */
static int memory_released(void *ud)
{
    const gone_wait_t *g = ud;
    char path[PATH_MAX + 128];
    struct stat st;
    for (int i = 1; i <= 3; i++) {
        snprintf(path, sizeof path, "%s/node%d-mem/%s", g->c->dir, i, g->id);
        if (stat(path, &st) == 0)
            return 0;
    }
    return 1;
}

/* status names, for every rank, the rank holding its in-memory copy: on another node. */
static void check_copies_elsewhere(const h_cluster_t *c, const char *id)
{
    ch_json_t *js = h_ctl_json(c, "status", id, NULL);
    cr_assert_not_null(js);
    const ch_json_t *ranks = ch_json_get(js, "ranks");
    cr_assert(ranks && ranks->nkids == WORLD);
    for (size_t k = 0; k < WORLD; k++) {
        const ch_json_t *r = h_json_at(ranks, k);
        double b = h_json_num(r, "memory_copy_rank");
        cr_assert(b >= 0 && b < WORLD, "rank %zu: copy on %g", k, b);
        const ch_json_t *rb = h_json_at(ranks, (size_t)b);
        cr_assert_str_neq(h_json_str(r, "node"), h_json_str(rb, "node"),
                          "rank %zu's copy is on its own node", k);
    }
    ch_json_free(js);
}

typedef struct src_wait {
    const h_cluster_t *c;
    const char *id;
    size_t idx;
} src_wait_t;

/* 1 once restart idx (0-based) of the job says where its state came from. */
static int source_known(void *ud)
{
    const src_wait_t *s = ud;
    ch_json_t *js = h_ctl_json(s->c, "status", s->id, NULL);
    if (!js)
        return 0;
    const ch_json_t *hist = ch_json_get(js, "history");
    int known = hist && hist->nkids > s->idx && *h_json_str(h_json_at(hist, s->idx), "source");
    ch_json_free(js);
    return known;
}

/* Wait until the restarted generation completed a step (its rank 0 then reports where it
 * resumed from). */
static void wait_resumed(const h_cluster_t *c, const char *id, size_t idx)
{
    src_wait_t s = {c, id, idx};
    cr_assert(h_wait_until(source_known, &s, 60000, 50), "restart %zu never resumed", idx + 1);
}

/* The first `want` restarts each read their state from memory and lost at most the step in
 * flight (the disk holds every 20th step only). */
static void check_history(const h_cluster_t *c, const char *id, size_t want)
{
    ch_json_t *js = h_ctl_json(c, "status", id, NULL);
    cr_assert_not_null(js);
    const ch_json_t *hist = ch_json_get(js, "history");
    cr_assert(hist && hist->nkids >= want, "%zu restarts", hist ? hist->nkids : 0);
    for (size_t i = 0; i < want; i++) {
        const ch_json_t *h = h_json_at(hist, i);
        fprintf(stderr, "chaos_memory: restart %zu: %s: %s; resumed from %g (%s), %g lost\n", i + 1,
                h_json_str(h, "cause"), h_json_str(h, "reason"), h_json_num(h, "resumed_from"),
                h_json_str(h, "source"), h_json_num(h, "steps_lost"));
        cr_assert_str_eq(h_json_str(h, "source"), "memory", "restart %zu", i + 1);
        cr_assert(h_json_num(h, "steps_lost") <= 1, "restart %zu lost %g steps", i + 1,
                  h_json_num(h, "steps_lost"));
    }
    ch_json_free(js);
}

Test(chaos_memory, rank_node_and_coordinator_lost_resume_from_memory_bit_identical)
{
    h_cluster_t c;
    char calm[64], chaos[64], text[2048], a[PATH_MAX + 64], b[PATH_MAX + 64], name[32];
    rt_job_t w;

    cr_assert_eq(h_cluster_up(&c, 3, 4), 0);
    job_text(&c, "calm", text, sizeof text);
    cr_assert_eq(rt_submit(&c, "calm.ini", text, calm, sizeof calm), 0);
    cr_assert(rt_wait(&w, &c, calm, NULL, 0, 0, 60000), "calm job still %s", w.state);
    cr_assert_str_eq(w.state, "completed", "calm: %s", w.reason);
    export_job(&c, "calm", a, sizeof a);
    /* a completed job's copies leave the nodes' memory */
    gone_wait_t gw = {&c, calm};
    cr_assert(h_wait_until(memory_released, &gw, 10000, 50), "calm's memory checkpoints stayed");

    job_text(&c, "chaos", text, sizeof text);
    cr_assert_eq(rt_submit(&c, "chaos.ini", text, chaos, sizeof chaos), 0);

    /* 1. kill -9 a rank, between two disk checkpoints */
    chaos_wait_running(&c, chaos, 1, 0, 7, &w);
    check_copies_elsewhere(&c, chaos);
    int r = 5, node = chaos_node_of(&c, chaos, r, WORLD);
    pid_t pid = rt_rank_pid(&c, node, chaos, w.gen, (uint32_t)r);
    cr_assert(pid > 0);
    fprintf(stderr, "chaos_memory: step %llu: kill -9 rank %d (node%d)\n",
            (unsigned long long)w.step, r, node);
    cr_assert_eq(kill(pid, SIGKILL), 0);

    /* 2. lose the node of rank 0 for good: its ranks' states live on on other nodes */
    wait_resumed(&c, chaos, 0);
    chaos_wait_running(&c, chaos, 2, 0, 0, &w);
    chaos_wait_running(&c, chaos, 2, w.step, 3, &w);
    node = chaos_node_of(&c, chaos, 0, WORLD);
    snprintf(name, sizeof name, "node%d", node);
    fprintf(stderr, "chaos_memory: step %llu: kill -9 workerd %s for good\n",
            (unsigned long long)w.step, name);
    cr_assert_eq(h_kill_wait(h_pid(&c, name), SIGKILL, 2000), 0);

    /* 3. kill -9 the coordinator and restart it: the running ranks are re-adopted */
    wait_resumed(&c, chaos, 1);
    chaos_wait_running(&c, chaos, 3, 0, 0, &w);
    chaos_wait_running(&c, chaos, 3, w.step, 3, &w);
    check_history(&c, chaos, 2);
    fprintf(stderr, "chaos_memory: step %llu: kill -9 coordinatord, restarted\n",
            (unsigned long long)w.step);
    cr_assert_eq(h_kill_wait(h_pid(&c, "coordinatord"), SIGKILL, 2000), 0);
    cr_assert_eq(h_coord_restart(&c), 0);

    cr_assert(rt_wait(&w, &c, chaos, NULL, 0, 0, 90000), "chaos job still %s", w.state);
    cr_assert_str_eq(w.state, "completed", "chaos: %s", w.reason);
    /* the restarted coordinator still knows where those restarts read from (its store) */
    check_history(&c, chaos, 2);
    export_job(&c, "chaos", b, sizeof b);
    char why[256] = "";
    cr_assert(rt_same_weights(a, b, why, sizeof why),
              "the chaos run's weights differ from the calm run's: %s", why);
}
