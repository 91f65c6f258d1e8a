/* The control plane at scale, scaled down for CI (issue 12, DESIGN §13): a real
 * coordinatord and 128 simulated nodes x 8 slots (+1 spare, chorus-simnode) on loopback;
 * a 1,024-rank job (tp 8 x pp 4 x dp 32) starts, every rank passes its rendezvous and
 * steps, a node that stops heartbeating is declared dead, the job recovers onto the
 * spare from its last checkpoint and completes. Waits are bounded and generous; nothing
 * here asserts a duration. The full-size figures come from chorus-bench-scale. */
#include <criterion/criterion.h>
#include <string.h>

#include "harness.h"
#include "scale_util.h"
#include "support.h"

#define NODES 128
#define SLOTS 8
#define TP    8
#define PP    4
#define DP    32
#define STEPS 60
#define EVERY 10

static sc_cluster_t cl;
static char dir[PATH_MAX];

static void fini(void)
{
    sc_stop(&cl);
}

static int all_alive(void *ud)
{
    return h_alive_count(ud) >= NODES + 1;
}

typedef struct want {
    const char *id, *state;
    uint64_t gen, step;
} want_t;

static int job_is(void *ud)
{
    want_t *w = ud;
    sc_job_t j;
    return sc_job(&cl, w->id, &j) == 0 && strcmp(j.state, w->state) == 0 &&
           j.generation >= w->gen && j.step >= w->step;
}

typedef struct ranks_want {
    unsigned long long world, min_step;
} ranks_want_t;

static int ranks_are(void *ud)
{
    ranks_want_t *w = ud;
    sc_stats_t st;
    return sc_sim_stats(&cl, &st) == 0 && st.ranks == w->world && st.rdzv == w->world &&
           st.min_step >= w->min_step;
}

Test(scale, simulated_cluster_runs_recovers_and_completes, .fini = fini, .timeout = 600)
{
    char ini[1024], id[32], victim[64], line[128], state[32];
    sc_job_t j;
    sc_stats_t st;

    cr_assert_eq(sc_raise_nofile(NODES + 1), 0);
    cr_assert_eq(ts_tmpdir("scale", dir, sizeof dir), 0);
    cr_assert_eq(sc_coord_start(&cl, dir, H_HEARTBEAT_MS, H_DEAD_AFTER_MS), 0, "coordinatord");
    cr_assert_eq(sc_sim_start(&cl, NODES + 1, SLOTS, 8, 100), 0, "chorus-simnode");
    cr_assert(h_wait_until(all_alive, &cl.h, 60000, 100), "all %d nodes alive", NODES + 1);
    cr_assert_eq(sc_sim_stats(&cl, &st), 0);
    cr_assert_eq(st.registered, NODES + 1);

    sc_job_ini(ini, sizeof ini, dir, TP, PP, DP, STEPS, EVERY, 3);
    cr_assert_eq(h_submit_raw(&cl.h, ini, id, sizeof id), 0);
    want_t running = {.id = id, .state = "running", .gen = 1};
    cr_assert(h_wait_until(job_is, &running, 60000, 50), "job %s running", id);
    ranks_want_t past = {.world = TP * PP * DP, .min_step = 0};
    cr_assert(h_wait_until(ranks_are, &past, 60000, 50), "every rank past rendezvous");
    cr_assert_eq(sc_sim_stats(&cl, &st), 0);
    cr_assert_eq(st.kv_errors, 0);
    /* StartRanks once per node, not per rank */
    cr_assert_eq(st.starts, (unsigned long long)TP * PP * DP / SLOTS);

    /* a checkpoint committed, then a node holding rank 0 stops heartbeating */
    want_t ckpt = {.id = id, .state = "running", .gen = 1, .step = EVERY + 2};
    cr_assert(h_wait_until(job_is, &ckpt, 60000, 50), "job past its first checkpoint");
    cr_assert_eq(sc_sim_cmd(&cl, "rank-node j1 0", victim, sizeof victim, 5000), 0);
    snprintf(line, sizeof line, "hang %s", victim);
    cr_assert_eq(sc_sim_cmd(&cl, line, line, sizeof line, 5000), 0);

    want_t again = {.id = id, .state = "running", .gen = 2};
    cr_assert(h_wait_until(job_is, &again, 60000, 50), "job running again at generation 2");
    cr_assert_eq(h_node_state(&cl.h, victim, state, sizeof state), 0);
    cr_assert_str_eq(state, "dead", "node %s declared dead", victim);
    cr_assert_eq(sc_job(&cl, id, &j), 0);
    cr_assert_eq(j.restarts, 1);
    cr_assert_geq(j.last_ckpt, EVERY, "resumed from a committed checkpoint");
    cr_assert(h_wait_until(ranks_are, &past, 60000, 50), "the new generation past rendezvous");

    want_t done = {.id = id, .state = "completed", .gen = 2, .step = STEPS};
    cr_assert(h_wait_until(job_is, &done, 120000, 100), "job completed");
    cr_assert_eq(sc_job(&cl, id, &j), 0);
    cr_assert_eq(j.generation, 2);
    cr_assert_eq(j.step, STEPS);
    sc_stop(&cl);
    ts_rmrf(dir);
}
