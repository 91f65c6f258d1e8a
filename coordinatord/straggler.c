/* Stragglers: per-rank windows of compute time and the persistent outliers among a
 * stage's ranks; see straggler.h. */
#include "straggler.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "coord.h"
#include "node.h"
#include "recovery.h"

/* One block per job generation: header, then per rank its window, its streak above the
 * ratio and whether it is a straggler now. */
typedef struct coord_straggler {
    uint64_t generation;
    uint32_t world, per_stage; /* ranks per pipeline stage: tp x dp, contiguous */
    float *win;                /* world x WINDOW, newest at n % WINDOW */
    uint32_t *n;               /* figures taken per rank */
    uint16_t *streak;
    uint8_t *slow;
    float *median, *sorted; /* scratch: per rank, per stage */
    double ratio_of_worst;
    int64_t worst; /* -1 none */
    uint32_t peers_of_worst, count;
    int64_t named;  /* a rank named a straggler by the last judgement; -1 none */
    char line[256]; /* coord_straggler_line */
    /* Nodes (judge_nodes): per rank its window of tensor-parallel time; per node, at the
     * index of its first entry in j->by_node, its value, streak and state. */
    float *tpwin, *nval;
    uint32_t *groups;
    uint16_t *nstreak;
    uint8_t *nslow;
    uint32_t node_count;
    char node_line[256]; /* coord_straggler_node_line */
} coord_straggler_t;

void coord_straggler_free(coord_job_t *j)
{
    free(j->strag);
    j->strag = NULL;
}

static size_t block_bytes(uint32_t world)
{
    return sizeof(coord_straggler_t) + 2 * (size_t)world * COORD_STRAGGLER_WINDOW * sizeof(float) +
           world * (2 * sizeof(uint32_t) + 2 * sizeof(uint16_t) + 2 * sizeof(uint8_t) +
                    3 * sizeof(float)) +
           16;
}

/* j's state for its current generation: new (zeroed) when the generation or world
 * changed. NULL when out of memory. */
static coord_straggler_t *state_of(coord_job_t *j)
{
    coord_straggler_t *s = j->strag;
    if (s && s->generation == j->generation && s->world == j->world)
        return s;
    coord_straggler_free(j);
    s = calloc(1, block_bytes(j->world));
    if (!s)
        return NULL;
    s->generation = j->generation;
    s->world = j->world;
    ch_layout_t l = ch_jobspec_layout(&j->spec);
    s->per_stage = l.tp * l.dp > 0 ? l.tp * l.dp : 1;
    s->win = (float *)(s + 1);
    s->median = s->win + (size_t)j->world * COORD_STRAGGLER_WINDOW;
    s->sorted = s->median + j->world;
    s->tpwin = s->sorted + j->world;
    s->nval = s->tpwin + (size_t)j->world * COORD_STRAGGLER_WINDOW;
    s->n = (uint32_t *)(s->nval + j->world);
    s->groups = s->n + j->world;
    s->streak = (uint16_t *)(s->groups + j->world);
    s->nstreak = s->streak + j->world;
    s->slow = (uint8_t *)(s->nstreak + j->world);
    s->nslow = s->slow + j->world;
    s->worst = -1;
    s->named = -1;
    j->strag = s;
    return s;
}

static int cmp_f(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

static float median_of(float *v, size_t n)
{
    qsort(v, n, sizeof *v, cmp_f);
    return v[(n - 1) / 2]; /* the lower median */
}

/* A rank's windowed median of win (s->win: compute, s->tpwin: tensor-parallel time); -1
 * while its window is not full. */
static float window_median(const coord_straggler_t *s, const float *win, uint32_t r)
{
    float v[COORD_STRAGGLER_WINDOW];
    if (s->n[r] < COORD_STRAGGLER_WINDOW)
        return -1;
    memcpy(v, win + (size_t)r * COORD_STRAGGLER_WINDOW, sizeof v);
    return median_of(v, COORD_STRAGGLER_WINDOW);
}

static float rank_median(const coord_straggler_t *s, uint32_t r)
{
    return window_median(s, s->win, r);
}

/* Rank r (median m) is slow now, or no longer: log and record the change once. */
static void mark(coord_t *c, coord_job_t *j, coord_straggler_t *s, uint32_t r, int slow, float m,
                 float ref, uint32_t peers)
{
    char what[256];
    if (s->slow[r] == slow)
        return;
    s->slow[r] = (uint8_t)slow;
    snprintf(what, sizeof what,
             "%s rank %u on node %s: compute %.3f s, %.2fx its %u peers' median %.3f s over %d "
             "steps (straggler above %.2fx for %d steps)",
             slow ? "straggler:" : "no longer a straggler:", r, j->ranks[r].node->name, m,
             ref > 0 ? m / ref : 0.0, peers, ref, COORD_STRAGGLER_WINDOW, COORD_STRAGGLER_RATIO,
             COORD_STRAGGLER_PERSIST);
    ch_log(slow ? CH_LOG_WARN : CH_LOG_INFO, "straggler", "job=%s gen=%" PRIu64 " %s", j->id,
           j->generation, what);
    coord_event(c, j->id, j->generation, r, j->ranks[r].node->name, what);
    if (slow && s->named < 0)
        s->named = r;
}

/* Judge the ranks of one pipeline stage [lo, lo + n). */
static void judge_stage(coord_t *c, coord_job_t *j, coord_straggler_t *s, uint32_t lo, uint32_t n)
{
    uint32_t k = 0;
    for (uint32_t r = lo; r < lo + n; r++)
        if ((s->median[r] = rank_median(s, r)) >= 0)
            s->sorted[k++] = s->median[r];
    if (k < 2)
        return;
    qsort(s->sorted, k, sizeof *s->sorted, cmp_f);
    for (uint32_t r = lo; r < lo + n; r++) {
        float m = s->median[r];
        if (m < 0)
            continue;
        /* the peers' lower median, this rank left out */
        uint32_t p = 0;
        while (p < k && s->sorted[p] != m)
            p++;
        uint32_t mid = (k - 2) / 2;
        float ref = s->sorted[mid < p ? mid : mid + 1];
        int above = ref > 0 && m > COORD_STRAGGLER_RATIO * ref && m - ref > COORD_STRAGGLER_MIN_S;
        s->streak[r] = above ? (uint16_t)(s->streak[r] + 1) : 0;
        if (above && s->streak[r] >= COORD_STRAGGLER_PERSIST)
            mark(c, j, s, r, 1, m, ref, k - 1);
        else if (!above)
            mark(c, j, s, r, 0, m, ref, k - 1);
        if (s->slow[r]) {
            s->count++;
            if (s->worst < 0 || m / ref > s->ratio_of_worst) {
                s->worst = r;
                s->ratio_of_worst = m / ref;
                s->peers_of_worst = k - 1;
            }
        }
    }
}

static void replace(coord_t *c, coord_job_t *j, uint32_t r);

/* Node g (its first entry in j->by_node) is slow now, or no longer: log it once. */
static void mark_node(coord_t *c, coord_job_t *j, coord_straggler_t *s, uint32_t g, int slow,
                      float ref, uint32_t peers)
{
    char what[320];
    if (s->nslow[g] == slow)
        return;
    s->nslow[g] = (uint8_t)slow;
    const char *node = j->by_node[g].node->name;
    snprintf(what, sizeof what,
             "%s node %s: tensor-parallel all-reduces %.3f s per step, %.2fx the median %.3f s "
             "of %u other nodes over %d steps (slow above %.2fx for %d steps)",
             slow ? "slow collectives:" : "collectives no longer slow:", node, s->nval[g],
             ref > 0 ? s->nval[g] / ref : 0.0, ref, peers, COORD_STRAGGLER_WINDOW,
             COORD_STRAGGLER_RATIO, COORD_STRAGGLER_PERSIST);
    ch_log(slow ? CH_LOG_WARN : CH_LOG_INFO, "straggler", "job=%s gen=%" PRIu64 " %s", j->id,
           j->generation, what);
    coord_event(c, j->id, j->generation, -1, node, what);
}

/* Nodes whose tensor-parallel all-reduces (inside the node, DESIGN §5) are persistently
 * slower than the other nodes': per node the lower median of its ranks' windowed TP times
 * against the lower median of the other nodes', the same ratio, floor and persistence as
 * ranks. A node running a compute straggler is not judged: its TP peers wait for it. */
static void judge_nodes(coord_t *c, coord_job_t *j, coord_straggler_t *s)
{
    uint32_t k = 0, v = 0;
    s->node_count = 0;
    s->node_line[0] = '\0';
    for (uint32_t i = 0; j->by_node && i < j->world;) {
        const coord_node_t *n = j->by_node[i].node;
        uint32_t g = i, m = 0;
        int strag = 0;
        for (; i < j->world && j->by_node[i].node == n; i++) {
            uint32_t r = j->by_node[i].rank;
            float x = window_median(s, s->tpwin, r);
            strag |= s->slow[r];
            if (x >= 0)
                s->sorted[m++] = x;
        }
        s->nval[g] = m && !strag ? median_of(s->sorted, m) : -1;
        s->groups[k++] = g;
    }
    for (uint32_t i = 0; i < k; i++)
        if (s->nval[s->groups[i]] >= 0)
            s->sorted[v++] = s->nval[s->groups[i]];
    if (v < 2)
        return;
    qsort(s->sorted, v, sizeof *s->sorted, cmp_f);
    double worst = 0;
    for (uint32_t i = 0; i < k; i++) {
        uint32_t g = s->groups[i], p = 0, mid = (v - 2) / 2;
        float x = s->nval[g];
        if (x < 0)
            continue;
        while (p < v && s->sorted[p] != x)
            p++;
        float ref = s->sorted[mid < p ? mid : mid + 1]; /* the others' lower median */
        int above = ref > 0 && x > COORD_STRAGGLER_RATIO * ref && x - ref > COORD_STRAGGLER_MIN_S;
        s->nstreak[g] = above ? (uint16_t)(s->nstreak[g] + 1) : 0;
        if (above && s->nstreak[g] >= COORD_STRAGGLER_PERSIST)
            mark_node(c, j, s, g, 1, ref, v - 1);
        else if (!above)
            mark_node(c, j, s, g, 0, ref, v - 1);
        if (s->nslow[g] && x / ref > worst) {
            worst = x / ref;
            s->node_count++;
            snprintf(s->node_line, sizeof s->node_line,
                     "node %s: tensor-parallel all-reduces %.3f s, %.2fx the other %u nodes' "
                     "median over %d steps",
                     j->by_node[g].node->name, x, worst, v - 1, COORD_STRAGGLER_WINDOW);
        } else if (s->nslow[g]) {
            s->node_count++;
        }
    }
}

void coord_straggler_step(coord_t *c, coord_job_t *j, uint32_t r)
{
    const coord_step_time_t *t = &j->ranks[r].time;
    double v = t->compute > 0 ? t->compute : t->step_s;
    coord_straggler_t *s;
    if (!(v > 0) || j->spec.kind != CH_JOB_TRAIN || !(s = state_of(j)))
        return;
    s->win[(size_t)r * COORD_STRAGGLER_WINDOW + s->n[r] % COORD_STRAGGLER_WINDOW] = (float)v;
    s->tpwin[(size_t)r * COORD_STRAGGLER_WINDOW + s->n[r] % COORD_STRAGGLER_WINDOW] =
        (float)(t->tp > 0 ? t->tp : 0);
    s->n[r]++;
    if (r != 0)
        return;
    s->count = 0;
    s->worst = -1;
    s->named = -1;
    for (uint32_t lo = 0; lo + s->per_stage <= s->world; lo += s->per_stage)
        judge_stage(c, j, s, lo, s->per_stage);
    judge_nodes(c, j, s);
    s->line[0] = '\0';
    if (s->worst >= 0) {
        uint32_t w = (uint32_t)s->worst;
        snprintf(s->line, sizeof s->line,
                 "rank %u on node %s: compute %.3f s, %.2fx its %u peers' median over %d steps%s",
                 w, j->ranks[w].node->name, s->median[w], s->ratio_of_worst, s->peers_of_worst,
                 COORD_STRAGGLER_WINDOW, s->count > 1 ? " (and others)" : "");
    }
    if (s->named >= 0 && j->spec.fault.straggler == CH_STRAGGLER_REPLACE &&
        j->state == COORD_JOB_RUNNING)
        replace(c, j, (uint32_t)s->named);
}

/* fault.straggler = replace: rank r was just named. With an idle spare (an alive node
 * running none of j's ranks, with free slots for every rank j has on r's node) the job
 * restarts with that node's ranks there; else the straggler stays reported only. */
static void replace(coord_t *c, coord_job_t *j, uint32_t r)
{
    coord_node_t *slow = j->ranks[r].node, *spare = NULL;
    uint32_t need = 0;
    uint64_t used = ++c->stamp;
    char why[512];
    for (uint32_t i = 0; i < j->world; i++) {
        j->ranks[i].node->mark = used;
        need += j->ranks[i].node == slow;
    }
    for (size_t i = 0; i < c->nodes.n && !spare; i++) {
        coord_node_t *n = c->nodes.v[i];
        if (n->state == COORD_NODE_ALIVE && n->mark != used && coord_node_free(n) >= need)
            spare = n;
    }
    if (!spare) {
        snprintf(why, sizeof why,
                 "fault.straggler = replace: no idle spare node with %u free slots for node %s's "
                 "ranks: rank %u stays, reported only",
                 need, slow->name, r);
        CH_LOGW("straggler", "job=%s gen=%" PRIu64 " %s", j->id, j->generation, why);
        coord_event(c, j->id, j->generation, r, slow->name, why);
        return;
    }
    snprintf(j->avoid_node, sizeof j->avoid_node, "%s", slow->name);
    snprintf(why, sizeof why,
             "fault.straggler = replace: rank %u on node %s is a straggler (%s); its node's %u "
             "ranks move to idle node %s",
             r, slow->name, j->strag->line, need, spare->name);
    coord_recovery_failure(c, j, COORD_CAUSE_STRAGGLER, r, slow->name, why);
}

size_t coord_straggler_avoid(const coord_job_t *j, coord_place_node_t *pn, coord_node_t **nodes,
                             size_t k)
{
    for (size_t i = 0; j->avoid_node[0] && i < k; i++) {
        if (strcmp(nodes[i]->name, j->avoid_node) != 0)
            continue;
        coord_place_node_t p = pn[i];
        coord_node_t *n = nodes[i];
        memmove(pn + i, pn + i + 1, (k - i - 1) * sizeof *pn);
        memmove(nodes + i, nodes + i + 1, (k - i - 1) * sizeof *nodes);
        pn[k - 1] = p;
        nodes[k - 1] = n;
        return k - 1;
    }
    return k;
}

const char *coord_straggler_node_line(const coord_job_t *j, uint32_t *count)
{
    const coord_straggler_t *s = j->strag;
    int now = s && s->generation == j->generation;
    *count = now ? s->node_count : 0;
    return now ? s->node_line : "";
}

const char *coord_straggler_line(const coord_job_t *j, uint32_t *count)
{
    const coord_straggler_t *s = j->strag;
    int now = s && s->generation == j->generation;
    *count = now ? s->count : 0;
    return now ? s->line : "";
}
