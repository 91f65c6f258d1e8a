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

/* Per rank its last RING figures, each with its step: its window ending at a step up to
 * RING - WINDOW of its figures back (a rank's figures may come that far ahead of its
 * peers': rank 0's at once, the others' with their node's report). */
#define RING (2 * COORD_STRAGGLER_WINDOW)

/* One block per job generation: header, then per rank its figures, its streak against its
 * state, whether it is a straggler now and how many figures it took since the last
 * judgement. */
typedef struct coord_straggler {
    uint64_t generation;
    uint32_t world, per_stage; /* ranks per pipeline stage: tp x dp, contiguous */
    float *win;                /* world x RING, newest at (n - 1) % RING */
    uint32_t *tag;             /* world x RING: the step of each figure */
    uint32_t *judged;          /* at a stage's first rank: the step its last judgement ended at */
    uint32_t *n;               /* figures taken per rank */
    uint32_t *taken_ms;        /* per rank: when its last figure was taken (the clock's low bits) */
    uint16_t *streak;          /* judgements in a row that disagreed with slow[] */
    uint8_t *slow, *fresh;
    float *low, *sorted; /* scratch: per rank its window's low figure, per stage */
    float *ref;          /* per rank: its peers' figure at its stage's last judgement */
    double ratio_of_worst;
    int64_t worst; /* -1 none */
    uint32_t peers_of_worst, count;
    int dirty;      /* a figure was taken since the last judgement */
    int per_step;   /* nodes send every step's figure (coord_straggler_figures): no sampling */
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
    return sizeof(coord_straggler_t) + 2 * (size_t)world * RING * sizeof(float) +
           world * ((4 + RING) * sizeof(uint32_t) + 2 * sizeof(uint16_t) + 3 * sizeof(uint8_t) +
                    4 * sizeof(float)) +
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
    s->low = s->win + (size_t)j->world * RING;
    s->sorted = s->low + j->world;
    s->ref = s->sorted + j->world;
    s->tpwin = s->ref + j->world;
    s->nval = s->tpwin + (size_t)j->world * RING;
    s->n = (uint32_t *)(s->nval + j->world);
    s->groups = s->n + j->world;
    s->taken_ms = s->groups + j->world;
    s->judged = s->taken_ms + j->world;
    s->tag = s->judged + j->world;
    s->streak = (uint16_t *)(s->tag + (size_t)j->world * RING);
    s->nstreak = s->streak + j->world;
    s->slow = (uint8_t *)(s->nstreak + j->world);
    s->nslow = s->slow + j->world;
    s->fresh = s->nslow + j->world;
    s->worst = -1;
    s->named = -1;
    j->strag = s;
    return s;
}

/* The k-th smallest (from 0) of v[0..n), k < n, in O(n) expected (Hoare's FIND): v is
 * reordered so that nothing before v[k] is larger and nothing after it smaller. */
static float select_kth(float *v, uint32_t n, uint32_t k)
{
    long lo = 0, hi = (long)n - 1;
    while (lo < hi) {
        float x = v[k], t;
        long i = lo, m = hi;
        do {
            while (v[i] < x)
                i++;
            while (x < v[m])
                m--;
            if (i <= m) {
                t = v[i];
                v[i++] = v[m];
                v[m--] = t;
            }
        } while (i <= m);
        if (m < (long)k)
            lo = i;
        if ((long)k < i)
            hi = m;
    }
    return v[k];
}

/* The two middle figures of v[0..n), n >= 2 (v is reordered): *a the ((n - 2) / 2)-th
 * smallest, *b the next. The lower median of the others of a member whose figure is x is
 * then x <= *a ? *b : *a, in O(1) per member. */
static void middle_pair(float *v, uint32_t n, float *a, float *b)
{
    uint32_t mid = (n - 2) / 2;
    *a = select_kth(v, n, mid);
    *b = v[mid + 1];
    for (uint32_t i = mid + 2; i < n; i++)
        if (v[i] < *b)
            *b = v[i];
}

/* The step of rank r's newest figure (it has one). */
static uint32_t newest(const coord_straggler_t *s, uint32_t r)
{
    return s->tag[(size_t)r * RING + (s->n[r] - 1) % RING];
}

/* A rank's low figure of win (s->win: compute, s->tpwin: tensor-parallel time): the
 * COORD_STRAGGLER_LOW-th smallest of its window, its last WINDOW figures of steps up to
 * `end`, O(RING + WINDOW x LOW); -1 while it has not that many. */
static float window_low(const coord_straggler_t *s, const float *win, uint32_t r, uint32_t end)
{
    const float *w = win + (size_t)r * RING;
    const uint32_t *tag = s->tag + (size_t)r * RING;
    float low[COORD_STRAGGLER_LOW]; /* low[0..m): the smallest seen, ascending */
    uint32_t m = 0, got = 0, have = s->n[r] < RING ? s->n[r] : RING;
    for (uint32_t i = 0; i < have && got < COORD_STRAGGLER_WINDOW; i++) {
        uint32_t at = (s->n[r] - 1 - i) % RING;
        if (tag[at] > end)
            continue;
        float x = w[at];
        got++;
        if (m == COORD_STRAGGLER_LOW && !(x < low[m - 1]))
            continue;
        uint32_t k = m < COORD_STRAGGLER_LOW ? m++ : m - 1;
        for (; k > 0 && low[k - 1] > x; k--)
            low[k] = low[k - 1];
        low[k] = x;
    }
    return got == COORD_STRAGGLER_WINDOW ? low[COORD_STRAGGLER_LOW - 1] : -1;
}

/* The words for the low figure: "3rd fastest of 8 steps". */
static const char *low_words(char *buf, size_t len)
{
    static const char *const nth[] = {"", "", "2nd ", "3rd ", "4th ", "5th "};
    _Static_assert(COORD_STRAGGLER_LOW < sizeof nth / sizeof nth[0], "name the quantile");
    snprintf(buf, len, "%sfastest of %d steps", nth[COORD_STRAGGLER_LOW], COORD_STRAGGLER_WINDOW);
    return buf;
}

/* One judgement of a rank or node in state `slow` with this verdict (above the ratio or
 * not): 1 when it is the PERSIST-th in a row to disagree with the state, which then flips
 * (the caller marks it). The same rule names and clears. */
static int flips(uint16_t *streak, uint8_t slow, int above)
{
    *streak = above != slow ? (uint16_t)(*streak + 1) : 0;
    if (*streak < COORD_STRAGGLER_PERSIST)
        return 0;
    *streak = 0;
    return 1;
}

static int is_above(float x, float ref)
{
    return ref > 0 && x > COORD_STRAGGLER_RATIO * ref && x - ref > COORD_STRAGGLER_MIN_S;
}

/* Rank r (low figure m) is slow now, or no longer: log and record the change. */
static void mark(coord_t *c, coord_job_t *j, coord_straggler_t *s, uint32_t r, int slow, float m,
                 float ref, uint32_t peers)
{
    char what[320], low[48];
    s->slow[r] = (uint8_t)slow;
    snprintf(what, sizeof what,
             "%s rank %u on node %s: compute %.3f s, %.2fx its %u peers' %.3f s (%s each; "
             "straggler above %.2fx for %d in a row)",
             slow ? "straggler:" : "no longer a straggler:", r, j->ranks[r].node->name, m,
             ref > 0 ? m / ref : 0.0, peers, ref, low_words(low, sizeof low), COORD_STRAGGLER_RATIO,
             COORD_STRAGGLER_PERSIST);
    ch_log(slow ? CH_LOG_WARN : CH_LOG_INFO, "straggler", "job=%s gen=%" PRIu64 " %s", j->id,
           j->generation, what);
    coord_event(c, j->id, j->generation, r, j->ranks[r].node->name, what);
    if (slow && s->named < 0)
        s->named = r;
}

/* Count the stragglers of the stage [lo, lo + n) and keep the worst, from their figures of
 * its last judgement (s->low, s->ref). */
static void count_slow(coord_straggler_t *s, uint32_t lo, uint32_t n)
{
    uint32_t k = 0;
    for (uint32_t r = lo; r < lo + n; r++)
        k += s->low[r] >= 0;
    for (uint32_t r = lo; r < lo + n && k >= 2; r++) {
        if (!s->slow[r] || !(s->low[r] > 0) || !(s->ref[r] > 0))
            continue;
        s->count++;
        if (s->worst < 0 || s->low[r] / s->ref[r] > s->ratio_of_worst) {
            s->worst = r;
            s->ratio_of_worst = s->low[r] / s->ref[r];
            s->peers_of_worst = k - 1;
        }
    }
}

/* The ranks of the stage [lo, lo + n) at their windows ending at step `end`: each rank's
 * low figure against the lower median of its peers' (itself left out); with figures per
 * step every rank's streak moves, else each's with a figure of its own since the last
 * judgement; with `tally` the stragglers are counted. */
static void judge_at(coord_t *c, coord_job_t *j, coord_straggler_t *s, uint32_t lo, uint32_t n,
                     uint32_t end, int tally)
{
    uint32_t k = 0;
    float a, b;
    for (uint32_t r = lo; r < lo + n; r++)
        if ((s->low[r] = window_low(s, s->win, r, end)) >= 0)
            s->sorted[k++] = s->low[r];
    if (k < 2)
        return;
    middle_pair(s->sorted, k, &a, &b);
    for (uint32_t r = lo; r < lo + n; r++) {
        float m = s->low[r], ref = m <= a ? b : a;
        if (m < 0)
            continue;
        int above = is_above(m, ref);
        if ((s->per_step || s->fresh[r]) && flips(&s->streak[r], s->slow[r], above))
            mark(c, j, s, r, above, m, ref, k - 1);
        if (!tally)
            continue;
        s->fresh[r] = 0;
        s->ref[r] = ref;
    }
    if (tally)
        count_slow(s, lo, n);
}

/* The newest step every rank of the stage [lo, lo + n) has reported; UINT32_MAX: none. */
static uint32_t stage_end(const coord_straggler_t *s, uint32_t lo, uint32_t n)
{
    uint32_t end = UINT32_MAX;
    for (uint32_t r = lo; r < lo + n && r < s->world; r++)
        if (s->n[r] && newest(s, r) < end)
            end = newest(s, r);
    return end;
}

/* Judge the ranks of one pipeline stage [lo, lo + n) at the same steps: their windows
 * ending at the newest step every one of them has reported (a rank's figures come up to
 * an interval after rank 0's; comparing its window with one of later steps made it look
 * slow whenever the machine got quieter). With figures per step, at each such step since
 * the last judgement (PERSIST at most): the streak counts steps. */
static void judge_stage(coord_t *c, coord_job_t *j, coord_straggler_t *s, uint32_t lo, uint32_t n)
{
    uint32_t end = stage_end(s, lo, n), back = 1;
    if (end == UINT32_MAX)
        return;
    if (s->per_step) {
        uint32_t since = end > s->judged[lo] ? end - s->judged[lo] : 0;
        back = since < COORD_STRAGGLER_PERSIST ? since : COORD_STRAGGLER_PERSIST;
        if (!back) { /* nothing new at the stage's common step: its last figures stand */
            count_slow(s, lo, n);
            return;
        }
        s->judged[lo] = end;
    }
    for (uint32_t d = back; d-- > 0;)
        judge_at(c, j, s, lo, n, end - d, d == 0);
}

static void replace(coord_t *c, coord_job_t *j, uint32_t r);

/* Node g (its first entry in j->by_node) is slow now, or no longer: log it. */
static void mark_node(coord_t *c, coord_job_t *j, coord_straggler_t *s, uint32_t g, int slow,
                      float ref, uint32_t peers)
{
    char what[360], low[48];
    s->nslow[g] = (uint8_t)slow;
    const char *node = j->by_node[g].node->name;
    snprintf(what, sizeof what,
             "%s node %s: tensor-parallel all-reduces %.3f s per step, %.2fx the median %.3f s "
             "of %u other nodes (%s each; slow above %.2fx for %d in a row)",
             slow ? "slow collectives:" : "collectives no longer slow:", node, s->nval[g],
             ref > 0 ? s->nval[g] / ref : 0.0, ref, peers, low_words(low, sizeof low),
             COORD_STRAGGLER_RATIO, COORD_STRAGGLER_PERSIST);
    ch_log(slow ? CH_LOG_WARN : CH_LOG_INFO, "straggler", "job=%s gen=%" PRIu64 " %s", j->id,
           j->generation, what);
    coord_event(c, j->id, j->generation, -1, node, what);
}

/* Per node (at its first entry in j->by_node, listed in s->groups) the median of its ranks'
 * low tensor-parallel figures; -1 for a node that runs a compute straggler (its TP peers
 * wait for it) or has none yet. How many nodes. */
static uint32_t node_values(const coord_job_t *j, coord_straggler_t *s)
{
    uint32_t k = 0;
    for (uint32_t i = 0; j->by_node && i < j->world;) {
        const coord_node_t *n = j->by_node[i].node;
        uint32_t g = i, m = 0;
        int strag = 0;
        for (; i < j->world && j->by_node[i].node == n; i++) {
            uint32_t r = j->by_node[i].rank;
            uint32_t lo = r - r % s->per_stage;
            float x = window_low(s, s->tpwin, r, stage_end(s, lo, s->per_stage));
            strag |= s->slow[r];
            if (x >= 0)
                s->sorted[m++] = x;
        }
        s->nval[g] = m && !strag ? select_kth(s->sorted, m, (m - 1) / 2) : -1;
        s->groups[k++] = g;
    }
    return k;
}

/* Nodes whose tensor-parallel all-reduces (inside the node, DESIGN §5) are persistently
 * slower than the other nodes': per node the median of its ranks' low TP figures (the
 * statistic of ranks, for the same reasons) against the lower median of the other nodes',
 * the same ratio, floor and persistence as ranks. */
static void judge_nodes(coord_t *c, coord_job_t *j, coord_straggler_t *s)
{
    uint32_t k = node_values(j, s), v = 0;
    float a, b;
    double worst = 0;
    char low[48];
    s->node_count = 0;
    s->node_line[0] = '\0';
    for (uint32_t i = 0; i < k; i++)
        if (s->nval[s->groups[i]] >= 0)
            s->sorted[v++] = s->nval[s->groups[i]];
    if (v < 2)
        return;
    middle_pair(s->sorted, v, &a, &b);
    for (uint32_t i = 0; i < k; i++) {
        uint32_t g = s->groups[i];
        float x = s->nval[g], ref = x <= a ? b : a; /* the others' lower median */
        if (x < 0)
            continue;
        int above = is_above(x, ref);
        if (flips(&s->nstreak[g], s->nslow[g], above))
            mark_node(c, j, s, g, above, ref, v - 1);
        if (!s->nslow[g])
            continue;
        s->node_count++;
        if (x / ref > worst) {
            worst = x / ref;
            snprintf(s->node_line, sizeof s->node_line,
                     "node %s: tensor-parallel all-reduces %.3f s, %.2fx the other %u nodes' "
                     "median (%s)",
                     j->by_node[g].node->name, x, worst, v - 1, low_words(low, sizeof low));
        }
    }
}

/* Rank r's figure v (compute) and tp (its tensor-parallel time) of step `step` go into its
 * windows. */
static void take(coord_straggler_t *s, const coord_rank_t *rk, uint32_t r, uint64_t step, double v,
                 double tp)
{
    size_t at = (size_t)r * RING + s->n[r] % RING;
    s->tag[at] = (uint32_t)step;
    s->win[at] = (float)v;
    s->tpwin[at] = (float)(tp > 0 ? tp : 0);
    s->taken_ms[r] = (uint32_t)rk->progress_ms;
    s->n[r]++;
    if (s->fresh[r] < UINT8_MAX)
        s->fresh[r]++;
    s->dirty = 1;
}

void coord_straggler_figures(coord_job_t *j, uint32_t r, uint64_t step, const float *computes,
                             const float *tps, size_t n)
{
    coord_straggler_t *s;
    if (r >= j->world || j->spec.kind != CH_JOB_TRAIN || !(s = state_of(j)) || step < n)
        return;
    s->per_step = 1;
    for (size_t i = 0; i < n; i++) /* steps it has (from a full report) are not taken again */
        if (computes[i] > 0 && (!s->n[r] || step - n + i > newest(s, r)))
            take(s, &j->ranks[r], r, step - n + i, computes[i], tps ? tps[i] : 0);
}

void coord_straggler_step(coord_t *c, coord_job_t *j, uint32_t r)
{
    const coord_rank_t *rk = &j->ranks[r];
    double v = rk->time.compute > 0 ? rk->time.compute : rk->time.step_s;
    coord_straggler_t *s;
    char low[48];
    if (!(v > 0) || j->spec.kind != CH_JOB_TRAIN || !(s = state_of(j)))
        return;
    /* one figure per progress interval of its node: see the theory in straggler.h */
    uint32_t held = rk->node ? rk->node->progress_ms : 0;
    if (!s->n[r] || !held || s->per_step ||
        (uint32_t)rk->progress_ms - s->taken_ms[r] >= held - held / 8)
        take(s, rk, r, rk->step, v, rk->time.tp);
    if (r != 0 || !s->dirty)
        return; /* rank 0's report judges the figures taken since the last judgement */
    s->dirty = 0;
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
                 "rank %u on node %s: compute %.3f s, %.2fx its %u peers' (%s)%s", w,
                 j->ranks[w].node->name, s->low[w], s->ratio_of_worst, s->peers_of_worst,
                 low_words(low, sizeof low), s->count > 1 ? " (and others)" : "");
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
