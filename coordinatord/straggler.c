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
} coord_straggler_t;

void coord_straggler_free(coord_job_t *j)
{
    free(j->strag);
    j->strag = NULL;
}

static size_t block_bytes(uint32_t world)
{
    return sizeof(coord_straggler_t) + (size_t)world * COORD_STRAGGLER_WINDOW * sizeof(float) +
           world * (sizeof(uint32_t) + sizeof(uint16_t) + sizeof(uint8_t) + 2 * sizeof(float)) + 16;
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
    s->n = (uint32_t *)(s->sorted + j->world);
    s->streak = (uint16_t *)(s->n + j->world);
    s->slow = (uint8_t *)(s->streak + j->world);
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

/* A rank's windowed median; -1 while its window is not full. */
static float rank_median(const coord_straggler_t *s, uint32_t r)
{
    float v[COORD_STRAGGLER_WINDOW];
    if (s->n[r] < COORD_STRAGGLER_WINDOW)
        return -1;
    memcpy(v, s->win + (size_t)r * COORD_STRAGGLER_WINDOW, sizeof v);
    return median_of(v, COORD_STRAGGLER_WINDOW);
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

void coord_straggler_step(coord_t *c, coord_job_t *j, uint32_t r)
{
    const coord_step_time_t *t = &j->ranks[r].time;
    double v = t->compute > 0 ? t->compute : t->step_s;
    coord_straggler_t *s;
    if (!(v > 0) || j->spec.kind != CH_JOB_TRAIN || !(s = state_of(j)))
        return;
    s->win[(size_t)r * COORD_STRAGGLER_WINDOW + s->n[r] % COORD_STRAGGLER_WINDOW] = (float)v;
    s->n[r]++;
    if (r != 0)
        return;
    s->count = 0;
    s->worst = -1;
    s->named = -1;
    for (uint32_t lo = 0; lo + s->per_stage <= s->world; lo += s->per_stage)
        judge_stage(c, j, s, lo, s->per_stage);
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

const char *coord_straggler_line(const coord_job_t *j, uint32_t *count)
{
    const coord_straggler_t *s = j->strag;
    int now = s && s->generation == j->generation;
    *count = now ? s->count : 0;
    return now ? s->line : "";
}
