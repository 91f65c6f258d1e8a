/* coordinatord/straggler: the detector alone, fed step figures as the coordinator feeds it
 * (coord_straggler_step after each rank's report, rank 0's last), with noise that only adds
 * time, as a shared machine's does. Asserts on what it reports (coord_straggler_line). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coord.h"
#include "straggler.h"
#include "support.h"

#define MAXR 8

typedef struct rig {
    char dir[512];
    coord_t c;
    coord_job_t j;
    coord_node_t nodes[MAXR];
    coord_rank_t ranks[MAXR];
    uint64_t rng;
    double now_s; /* the coordinator's clock */
    /* batched_until_named: per rank the figures its node holds, steps so far */
    float held[MAXR][COORD_STRAGGLER_WINDOW];
    uint32_t n_held[MAXR];
    int steps;
} rig_t;

/* world ranks of a dp = world job, rank r alone on node n<r+1> that sends progress every
 * progress_ms (0: every report at once). */
static void rig_up(rig_t *g, uint32_t world, uint32_t progress_ms)
{
    memset(g, 0, sizeof *g);
    cr_assert_eq(ts_tmpdir("test_coord_straggler", g->dir, sizeof g->dir), 0);
    cr_assert_eq(coord_store_open(g->dir, &g->c.store), 0);
    ch_jobspec_defaults(&g->j.spec);
    g->j.spec.parallel.tp = g->j.spec.parallel.pp = 1;
    g->j.spec.parallel.dp = world;
    snprintf(g->j.id, sizeof g->j.id, "j1");
    g->j.generation = 1;
    g->j.state = COORD_JOB_RUNNING;
    g->j.world = world;
    g->j.ranks = g->ranks;
    for (uint32_t r = 0; r < world; r++) {
        snprintf(g->nodes[r].name, sizeof g->nodes[r].name, "n%u", r + 1);
        g->nodes[r].progress_ms = progress_ms;
        g->ranks[r].node = &g->nodes[r];
    }
    g->rng = 0x9e3779b97f4a7c15ull;
}

static void rig_down(rig_t *g)
{
    coord_straggler_free(&g->j);
    coord_store_close(g->c.store);
    cr_expect_eq(ts_rmrf(g->dir), 0);
}

static double uniform(rig_t *g)
{
    g->rng ^= g->rng << 13;
    g->rng ^= g->rng >> 7;
    g->rng ^= g->rng << 17;
    return (double)(g->rng >> 11) / 9007199254740992.0;
}

/* Noise as a shared machine adds it: on 20% of steps, 10% to 50% more. */
static double noisy(rig_t *g, double t)
{
    return uniform(g) < 0.2 ? t * (1.1 + 0.4 * uniform(g)) : t;
}

/* Rank r reports a step (the rig's g->steps) of compute t at the rig's clock. */
static void report(rig_t *g, uint32_t r, double t)
{
    g->ranks[r].step = (uint64_t)g->steps;
    g->ranks[r].time = (coord_step_time_t){.step_s = t + 0.01, .compute = t};
    g->ranks[r].progress_ms = (uint64_t)(g->now_s * 1000.0);
    coord_straggler_step(&g->c, &g->j, r);
}

/* One step: every rank reports its compute t[r], rank 0 last; the clock moves by the
 * slowest. The number of stragglers named now. */
static uint32_t step(rig_t *g, const double *t)
{
    double slowest = 0;
    uint32_t count;
    g->steps++;
    for (uint32_t k = 1; k <= g->j.world; k++) {
        uint32_t r = k % g->j.world;
        report(g, r, t[r]);
        slowest = t[r] > slowest ? t[r] : slowest;
    }
    g->now_s += slowest + 0.01;
    coord_straggler_line(&g->j, &count);
    return count;
}

/* Steps of base compute with noise on every rank, rank `slow` (-1 none) at `factor`:
 * the first step (counting from 1) at which anyone is named, or 0 when nobody is. */
static int steps_until_named(rig_t *g, double base, int slow, double factor, int steps)
{
    double t[MAXR];
    for (int s = 1; s <= steps; s++) {
        for (uint32_t r = 0; r < g->j.world; r++)
            t[r] = noisy(g, (int)r == slow ? base * factor : base);
        if (step(g, t))
            return s;
    }
    return 0;
}

Test(straggler, a_rank_at_1_5x_is_named_within_20_steps_through_noise)
{
    static const uint32_t worlds[] = {2, 4, 8};
    for (size_t w = 0; w < sizeof worlds / sizeof worlds[0]; w++) {
        rig_t g;
        uint32_t count;
        rig_up(&g, worlds[w], 0);
        int at = steps_until_named(&g, 0.2, -1, 1, 300);
        cr_expect_eq(at, 0, "world %u: a calm run named someone at step %d: %s", worlds[w], at,
                     coord_straggler_line(&g.j, &count));
        at = steps_until_named(&g, 0.2, 1, 1.5, 100);
        const char *line = coord_straggler_line(&g.j, &count);
        cr_expect(at > 0 && at <= 20, "world %u: the 1.5x rank named after %d steps", worlds[w],
                  at);
        cr_expect_eq(count, 1, "world %u: %s", worlds[w], line);
        cr_expect(strncmp(line, "rank 1 on node n2: compute ", 27) == 0, "world %u: %s", worlds[w],
                  line);
        rig_down(&g);
    }
}

Test(straggler, calm_ranks_with_long_noise_episodes_are_never_named)
{
    rig_t g;
    double t[2];
    uint32_t count;
    rig_up(&g, 2, 0);
    for (int s = 1; s <= 1000; s++) {
        for (uint32_t r = 0; r < 2; r++)
            t[r] = noisy(&g, 0.2);
        /* every 40 steps a noise episode of 6 steps in a row at 1.5x, on each rank in turn */
        if (s % 40 < 6)
            t[(s / 40) % 2] = 0.2 * 1.5;
        if (s % 10 == 0) /* rank 1 writes a checkpoint: one step at 3x */
            t[1] = 0.6;
        if (s % 97 == 0) /* a page-fault storm: one step at 10x on rank 0 */
            t[0] = 2.0;
        cr_assert_eq(step(&g, t), 0, "named at step %d: %s", s, coord_straggler_line(&g.j, &count));
    }
    rig_down(&g);
}

Test(straggler, a_straggler_that_recovers_is_cleared)
{
    rig_t g;
    uint32_t count;
    rig_up(&g, 4, 0);
    cr_assert_eq(steps_until_named(&g, 0.2, -1, 1, 50), 0);
    int at = steps_until_named(&g, 0.2, 2, 1.5, 100);
    cr_assert(at > 0, "never named");
    cr_assert(strncmp(coord_straggler_line(&g.j, &count), "rank 2 on node n3", 17) == 0, "%s",
              coord_straggler_line(&g.j, &count));
    /* it recovers: cleared once LOW of its figures are fast again, for PERSIST in a row */
    double t[4];
    int cleared = 0;
    for (int s = 1; s <= 20 && !cleared; s++) {
        for (uint32_t r = 0; r < 4; r++)
            t[r] = 0.2;
        if (step(&g, t) == 0)
            cleared = s;
    }
    cr_expect(cleared > 0 && cleared <= COORD_STRAGGLER_LOW + COORD_STRAGGLER_PERSIST,
              "cleared after %d steps", cleared);
    cr_expect_str_eq(coord_straggler_line(&g.j, &count), "");
    /* and stays clear */
    at = steps_until_named(&g, 0.2, -1, 1, 300);
    cr_expect_eq(at, 0, "named again at step %d: %s", at, coord_straggler_line(&g.j, &count));
    rig_down(&g);
}

/* Nodes that send progress once a second (workerd's default) with steps of 0.3 s: rank 0's
 * report comes every step, rank 1's latest every second. */
static int sampled_until_named(rig_t *g, double t0, double t1, int steps)
{
    double t[2], next = g->now_s + 1.0;
    for (int s = 1; s <= steps; s++) {
        g->steps++;
        t[0] = t0;
        t[1] = t1;
        if (g->now_s >= next) {
            report(g, 1, t[1]);
            next += 1.0;
        }
        report(g, 0, t[0]);
        g->now_s += (t0 > t1 ? t0 : t1) + 0.01;
        uint32_t count;
        coord_straggler_line(&g->j, &count);
        if (count)
            return s;
    }
    return 0;
}

Test(straggler, figures_sampled_once_a_second_compare_the_same_seconds)
{
    rig_t g;
    uint32_t count;
    rig_up(&g, 2, 1000);
    /* the machine gets quieter: rank 0's every step would show it long before rank 1's
     * one figure a second did, and rank 1 would look slow */
    cr_expect_eq(sampled_until_named(&g, 0.45, 0.45, 100), 0, "%s",
                 coord_straggler_line(&g.j, &count));
    int at = sampled_until_named(&g, 0.25, 0.25, 200);
    cr_expect_eq(at, 0, "named at step %d once quieter: %s", at,
                 coord_straggler_line(&g.j, &count));
    /* a straggler is named once WINDOW - LOW + 1 of its figures are slow, PERSIST in a row:
     * one figure a second, whatever the steps (0.46 s here) */
    at = sampled_until_named(&g, 0.3, 0.45, 100);
    double s = at * 0.46,
           most = COORD_STRAGGLER_WINDOW - COORD_STRAGGLER_LOW + COORD_STRAGGLER_PERSIST;
    cr_expect(at > 0 && s >= most - 1 && s <= most + 1, "named after %d steps (%.1f s)", at, s);
    cr_expect(strncmp(coord_straggler_line(&g.j, &count), "rank 1 on node n2", 17) == 0, "%s",
              coord_straggler_line(&g.j, &count));
    rig_down(&g);
}

/* Nodes that send progress every `every` steps (a 1 s interval over 0.15 s steps: 7) with
 * every step's figure since the last (RankSummary computes): rank 0's report comes each
 * step, the others' in batches, each rank's in its own phase; steps of base compute with
 * noise, rank `slow` (-1 none) at `factor`, every 40 steps a noise episode of 6 steps at
 * 1.5x on one rank in turn when `episodes`. The first step (from 1) at which anyone is
 * named, or 0. */
static int batched_until_named(rig_t *g, double base, int slow, double factor, int steps, int every,
                               int episodes)
{
    for (int s = 1; s <= steps; s++) {
        int at = ++g->steps;
        for (uint32_t k = 1; k <= g->j.world; k++) {
            uint32_t r = k % g->j.world;
            double t = noisy(g, (int)r == slow ? base * factor : base);
            if (episodes && at % 40 < 6 && r == (uint32_t)(at / 40) % g->j.world)
                t = base * 1.5;
            if (r == 0) {
                report(g, 0, t);
                continue;
            }
            uint32_t *n = &g->n_held[r];
            g->held[r][(*n)++] = (float)t;
            if ((at + (int)r) % every)
                continue;
            coord_straggler_figures(&g->j, r, (uint64_t)at, g->held[r], NULL, *n - 1);
            report(g, r, g->held[r][*n - 1]);
            *n = 0;
        }
        g->now_s += base * factor + 0.01;
        uint32_t count;
        coord_straggler_line(&g->j, &count);
        if (count)
            return s;
    }
    return 0;
}

Test(straggler, figures_sent_in_batches_name_a_1_5x_rank_within_20_steps)
{
    static const uint32_t worlds[] = {2, 4, 8};
    for (size_t w = 0; w < sizeof worlds / sizeof worlds[0]; w++) {
        rig_t g;
        uint32_t count;
        rig_up(&g, worlds[w], 1000);
        int at = batched_until_named(&g, 0.15, -1, 1, 1000, 7, 1);
        cr_expect_eq(at, 0, "world %u: 1,000 calm steps named someone at step %d: %s", worlds[w],
                     at, coord_straggler_line(&g.j, &count));
        at = batched_until_named(&g, 0.15, 1, 1.5, 100, 7, 0);
        const char *line = coord_straggler_line(&g.j, &count);
        cr_expect(at > 0 && at <= 20, "world %u: the 1.5x rank named after %d steps", worlds[w],
                  at);
        cr_expect(strncmp(line, "rank 1 on node n2: compute ", 27) == 0, "world %u: %s", worlds[w],
                  line);
        /* and it recovers: cleared within a batch of LOW + PERSIST fast steps */
        int cleared = 0;
        for (int s = 1; s <= 20 && !cleared; s++)
            if (batched_until_named(&g, 0.15, -1, 1, 1, 7, 0) == 0)
                cleared = s;
        cr_expect(cleared > 0 && cleared <= 7 + COORD_STRAGGLER_LOW + COORD_STRAGGLER_PERSIST,
                  "world %u: cleared after %d steps", worlds[w], cleared);
        rig_down(&g);
    }
}

Test(straggler, batched_figures_are_compared_at_the_same_steps)
{
    static const uint32_t worlds[] = {2, 4};
    for (size_t w = 0; w < sizeof worlds / sizeof worlds[0]; w++) {
        rig_t g;
        uint32_t count;
        rig_up(&g, worlds[w], 1000);
        /* the machine gets busier, then quieter: rank 0's every step shows it up to an
         * interval before its peers' batches do, and must not make it look slow (or them) */
        int at = batched_until_named(&g, 0.15, -1, 1, 100, 7, 0);
        at = at ? at : batched_until_named(&g, 0.3, -1, 1, 100, 7, 0);
        at = at ? at : batched_until_named(&g, 0.15, -1, 1, 100, 7, 0);
        cr_expect_eq(at, 0, "world %u: named at step %d: %s", worlds[w], g.steps,
                     coord_straggler_line(&g.j, &count));
        rig_down(&g);
    }
}
