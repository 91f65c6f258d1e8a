/* The control plane at scale, scaled down for CI (issue 12, DESIGN §13): a real
 * coordinatord and 132 simulated nodes x 8 slots (+1 spare, chorus-simnode) on loopback;
 * a 1,056-rank job (tp 8 x pp 4 x dp 33) starts, every rank passes its rendezvous and
 * steps, `chorusctl status` sums its ranks per state (over 1,024 ranks) and pages them
 * on request, a node that stops heartbeating is declared dead, the job recovers onto the
 * spare from its last checkpoint and completes. Waits are bounded and generous; nothing
 * here asserts a duration. The full-size figures come from chorus-bench-scale. */
#include <criterion/criterion.h>
#include <string.h>

#include "harness.h"
#include "scale_util.h"
#include "support.h"

#define NODES 132
#define SLOTS 8
#define TP    8
#define PP    4
#define DP    33
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

/* `chorusctl status ID [FLAG [VALUE]] --json`: the ranks it details (first rank and
 * count) and the running count of its rank_states; partial: its ranks_partial. */
static void status_view(const char *id, const char *flag, const char *value, long *first,
                        size_t *count, double *running, int *partial)
{
    ch_json_t *js = !flag    ? h_ctl_json(&cl.h, "status", id, NULL)
                    : !value ? h_ctl_json(&cl.h, "status", id, flag, NULL)
                             : h_ctl_json(&cl.h, "status", id, flag, value, NULL);
    cr_assert(js, "status %s %s %s", id, flag ? flag : "", value ? value : "");
    const ch_json_t *ranks = ch_json_get(js, "ranks");
    const ch_json_t *states = ch_json_get(js, "rank_states");
    const ch_json_t *part = ch_json_get(js, "ranks_partial");
    cr_assert(ranks && ranks->type == CH_JSON_ARRAY && states && part);
    *count = ranks->nkids;
    *first = ranks->nkids ? (long)h_json_num(h_json_at(ranks, 0), "rank") : -1;
    *running = h_json_num(states, "running");
    *partial = part->boolean;
    cr_assert_eq(h_json_num(js, "world_size"), TP * PP * DP);
    ch_json_free(js);
}

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

    /* status of a job over 1,024 ranks: ranks per state; detail when asked */
    long first;
    size_t count;
    double n_run;
    int partial;
    status_view(id, NULL, NULL, &first, &count, &n_run, &partial);
    cr_assert_eq(count, 0, "no per-rank detail by default");
    cr_assert_eq(n_run, TP * PP * DP, "every rank counted as running");
    cr_assert(partial);
    status_view(id, "--rank", "7", &first, &count, &n_run, &partial);
    cr_assert(count == 1 && first == 7 && partial, "--rank 7");
    status_view(id, "--first", "1000", &first, &count, &n_run, &partial);
    cr_assert(count == TP * PP * DP - 1000 && first == 1000 && partial, "--first 1000");
    status_view(id, "--ranks", NULL, &first, &count, &n_run, &partial);
    cr_assert(count == TP * PP * DP && first == 0 && !partial, "--ranks: every rank");

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
