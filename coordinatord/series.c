/* Per-job series for the status page; see series.h for the theory of operation. */
#include "series.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/log.h"
#include "coord.h"

// ----------------------------------------------------------------------------
// one series

static void heat_clear_row(coord_series_t *s, size_t row)
{
    s->heat_step[row] = 0;
    for (uint32_t r = 0; r < s->heat_ranks; r++)
        s->heat[row * s->heat_ranks + r] = NAN;
}

int coord_series_create(int64_t seq, uint32_t world, coord_series_t **out)
{
    coord_series_t *s = calloc(1, sizeof *s);
    *out = NULL;
    if (!s)
        return -ENOMEM;
    s->seq = seq;
    s->world = world;
    s->heat_ranks = world < COORD_SERIES_HEAT_RANKS ? world : COORD_SERIES_HEAT_RANKS;
    s->stride = 1;
    if (s->heat_ranks &&
        !(s->heat = malloc(sizeof(float) * COORD_SERIES_HEAT_STEPS * s->heat_ranks))) {
        free(s);
        return -ENOMEM;
    }
    for (size_t row = 0; row < COORD_SERIES_HEAT_STEPS; row++)
        heat_clear_row(s, row);
    *out = s;
    return 0;
}

void coord_series_free(coord_series_t *s)
{
    if (!s)
        return;
    free(s->heat);
    free(s);
}

static coord_point_t *recent_at(coord_series_t *s, size_t i)
{
    return &s->recent[(s->recent_head + i) % COORD_SERIES_RECENT];
}

/* An old point leaves the full-resolution ring: keep it if its step is on the stride,
 * doubling the stride (and thinning the history) until there is room. */
static void to_history(coord_series_t *s, const coord_point_t *p)
{
    while (s->n_history == COORD_SERIES_HISTORY && s->stride < (UINT64_C(1) << 62)) {
        size_t k = 0;
        s->stride *= 2;
        for (size_t i = 0; i < s->n_history; i++)
            if (s->history[i].step % s->stride == 0)
                s->history[k++] = s->history[i];
        s->n_history = k;
    }
    if (p->step % s->stride == 0 && s->n_history < COORD_SERIES_HISTORY)
        s->history[s->n_history++] = *p;
}

/* The job went back to an earlier step (resumed from a checkpoint): forget what was
 * recorded from that step on. */
static void rewind_to(coord_series_t *s, uint64_t step)
{
    while (s->n_recent && recent_at(s, s->n_recent - 1)->step >= step)
        s->n_recent--;
    while (s->n_history && s->history[s->n_history - 1].step >= step)
        s->n_history--;
    for (size_t row = 0; row < COORD_SERIES_HEAT_STEPS; row++)
        if (s->heat_step[row] >= step)
            heat_clear_row(s, row);
}

void coord_series_add_point(coord_series_t *s, const coord_point_t *p)
{
    uint64_t last = s->n_recent    ? recent_at(s, s->n_recent - 1)->step
                    : s->n_history ? s->history[s->n_history - 1].step
                                   : 0;
    if ((s->n_recent || s->n_history) && p->step <= last)
        rewind_to(s, p->step);
    if (s->n_recent == COORD_SERIES_RECENT) {
        to_history(s, recent_at(s, 0));
        s->recent_head = (s->recent_head + 1) % COORD_SERIES_RECENT;
        s->n_recent--;
    }
    *recent_at(s, s->n_recent++) = *p;
    s->dirty = 1;
}

void coord_series_add_heat(coord_series_t *s, uint64_t step, uint32_t rank, float ms)
{
    size_t row = step % COORD_SERIES_HEAT_STEPS;
    if (rank >= s->heat_ranks || step == 0)
        return;
    if (s->heat_step[row] != step) {
        if (s->heat_step[row] > step)
            return; /* older than the row it would replace */
        heat_clear_row(s, row);
        s->heat_step[row] = step;
    }
    s->heat[row * s->heat_ranks + rank] = ms;
    s->dirty = 1;
}

size_t coord_series_points(const coord_series_t *s, coord_point_t *out, size_t max)
{
    size_t n = 0;
    for (size_t i = 0; i < s->n_history && n < max; i++)
        out[n++] = s->history[i];
    for (size_t i = 0; i < s->n_recent && n < max; i++)
        out[n++] = s->recent[(s->recent_head + i) % COORD_SERIES_RECENT];
    return n;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

size_t coord_series_heat_rows(const coord_series_t *s, uint64_t *steps, size_t max)
{
    uint64_t all[COORD_SERIES_HEAT_STEPS];
    size_t n = 0;
    for (size_t row = 0; row < COORD_SERIES_HEAT_STEPS; row++)
        if (s->heat_step[row])
            all[n++] = s->heat_step[row];
    qsort(all, n, sizeof all[0], cmp_u64);
    size_t skip = n > max ? n - max : 0; /* the newest max rows */
    for (size_t i = skip; i < n; i++)
        steps[i - skip] = all[i];
    return n - skip;
}

float coord_series_heat_at(const coord_series_t *s, uint64_t step, uint32_t rank)
{
    size_t row = step % COORD_SERIES_HEAT_STEPS;
    if (rank >= s->heat_ranks || s->heat_step[row] != step)
        return NAN;
    return s->heat[row * s->heat_ranks + rank];
}

// ----------------------------------------------------------------------------
// saved form: a header, the points (history then recent), the heat rows. Host byte
// order; the magic number tells a foreign or older blob, which then reads as no series.

#define BLOB_MAGIC     0x31534843u /* "CHS1" */
#define BLOB_MAX_WORLD (1u << 20)
#define POINT_BYTES    (8 + 5 * 4)

typedef struct blob_head {
    uint32_t magic, world, heat_ranks, n_history, n_recent, n_heat;
    uint64_t stride;
} blob_head_t;

static size_t blob_size(const blob_head_t *h)
{
    return sizeof *h + POINT_BYTES * ((size_t)h->n_history + h->n_recent) +
           (size_t)h->n_heat * (8 + 4 * (size_t)h->heat_ranks);
}

static unsigned char *put_point(unsigned char *o, const coord_point_t *p)
{
    float f[5] = {p->loss, p->tokens_per_s, p->mfu, p->step_ms, p->bubble};
    memcpy(o, &p->step, 8);
    memcpy(o + 8, f, sizeof f);
    return o + POINT_BYTES;
}

static const unsigned char *get_point(const unsigned char *i, coord_point_t *p)
{
    float f[5];
    memcpy(&p->step, i, 8);
    memcpy(f, i + 8, sizeof f);
    p->loss = f[0], p->tokens_per_s = f[1], p->mfu = f[2], p->step_ms = f[3], p->bubble = f[4];
    return i + POINT_BYTES;
}

int coord_series_encode(const coord_series_t *s, void **out, size_t *len)
{
    blob_head_t h = {
        BLOB_MAGIC, s->world, s->heat_ranks, (uint32_t)s->n_history, (uint32_t)s->n_recent,
        0,          s->stride};
    for (size_t row = 0; row < COORD_SERIES_HEAT_STEPS; row++)
        h.n_heat += s->heat_step[row] != 0;
    size_t n = blob_size(&h);
    unsigned char *b = malloc(n), *o = b;
    *out = NULL;
    if (!b)
        return -ENOMEM;
    memcpy(o, &h, sizeof h);
    o += sizeof h;
    for (size_t i = 0; i < s->n_history; i++)
        o = put_point(o, &s->history[i]);
    for (size_t i = 0; i < s->n_recent; i++)
        o = put_point(o, &s->recent[(s->recent_head + i) % COORD_SERIES_RECENT]);
    for (size_t row = 0; row < COORD_SERIES_HEAT_STEPS; row++) {
        if (!s->heat_step[row])
            continue;
        memcpy(o, &s->heat_step[row], 8);
        memcpy(o + 8, &s->heat[row * s->heat_ranks], 4 * (size_t)s->heat_ranks);
        o += 8 + 4 * (size_t)s->heat_ranks;
    }
    *out = b;
    *len = n;
    return 0;
}

int coord_series_decode(int64_t seq, const void *blob, size_t len, coord_series_t **out)
{
    blob_head_t h;
    coord_series_t *s = NULL;
    const unsigned char *i = blob;

    *out = NULL;
    if (len < sizeof h)
        return CH_E_FORMAT;
    memcpy(&h, blob, sizeof h);
    if (h.magic != BLOB_MAGIC || h.world > BLOB_MAX_WORLD ||
        h.heat_ranks != (h.world < COORD_SERIES_HEAT_RANKS ? h.world : COORD_SERIES_HEAT_RANKS) ||
        h.n_history > COORD_SERIES_HISTORY || h.n_recent > COORD_SERIES_RECENT ||
        h.n_heat > (h.heat_ranks ? COORD_SERIES_HEAT_STEPS : 0) || h.stride == 0 ||
        blob_size(&h) != len)
        return CH_E_FORMAT;
    int rc = coord_series_create(seq, h.world, &s);
    if (rc < 0)
        return rc;
    s->stride = h.stride;
    i += sizeof h;
    for (uint32_t k = 0; k < h.n_history; k++)
        i = get_point(i, &s->history[s->n_history++]);
    for (uint32_t k = 0; k < h.n_recent; k++)
        i = get_point(i, &s->recent[s->n_recent++]);
    for (uint32_t k = 0; k < h.n_heat; k++) {
        uint64_t step;
        memcpy(&step, i, 8);
        size_t row = step % COORD_SERIES_HEAT_STEPS;
        if (step && s->heat_step[row] == 0) {
            s->heat_step[row] = step;
            memcpy(&s->heat[row * s->heat_ranks], i + 8, 4 * (size_t)h.heat_ranks);
        }
        i += 8 + 4 * (size_t)h.heat_ranks;
    }
    *out = s;
    return 0;
}

// ----------------------------------------------------------------------------
// the set of series held in memory

static int save(coord_t *c, coord_series_t *s)
{
    void *blob = NULL;
    size_t len = 0;
    int rc = coord_series_encode(s, &blob, &len);
    if (rc == 0)
        rc = coord_store_series_put(c->store, s->seq, blob, len);
    free(blob);
    if (rc == 0)
        s->dirty = 0;
    else
        CH_LOGW("series", "job=j%lld saving the status-page series: %s", (long long)s->seq,
                ch_strerror(rc));
    return rc;
}

static coord_series_t *find(coord_series_set_t *set, int64_t seq)
{
    for (size_t i = 0; i < set->n; i++)
        if (set->v[i]->seq == seq)
            return set->v[i];
    return NULL;
}

/* Make room for one more: let the least recently used series go (saved first). */
static void make_room(coord_t *c, coord_series_set_t *set)
{
    if (set->n < COORD_SERIES_CACHE)
        return;
    size_t lru = 0;
    for (size_t i = 1; i < set->n; i++)
        if (set->v[i]->used < set->v[lru]->used)
            lru = i;
    if (set->v[lru]->dirty)
        save(c, set->v[lru]);
    coord_series_free(set->v[lru]);
    set->v[lru] = set->v[--set->n];
}

/* The series of job seq: held, else loaded, else (create) made empty. */
static coord_series_t *lookup(coord_t *c, int64_t seq, uint32_t world, int create)
{
    coord_series_set_t *set = &c->series;
    coord_series_t *s = find(set, seq);
    void *blob = NULL;
    size_t len = 0;

    if (!s) {
        int rc = coord_store_series_get(c->store, seq, &blob, &len);
        if (rc == 0 && coord_series_decode(seq, blob, len, &s) < 0)
            CH_LOGW("series", "job=j%lld stored series unreadable: starting afresh",
                    (long long)seq);
        free(blob);
        if (!s && (!create || coord_series_create(seq, world, &s) < 0))
            return NULL;
        make_room(c, set);
        set->v[set->n++] = s;
    }
    s->used = ++set->clock;
    return s;
}

static float metric(const Chorus__RankEvent *ev, const char *name)
{
    for (size_t i = 0; i < ev->n_metrics; i++)
        if (ev->metrics[i]->name && strcmp(ev->metrics[i]->name, name) == 0)
            return (float)ev->metrics[i]->value;
    return NAN;
}

void coord_series_progress(coord_t *c, const coord_job_t *j, uint32_t rank,
                           const Chorus__RankEvent *ev)
{
    coord_series_t *s = lookup(c, j->seq, j->world, 1);
    if (!s || ev->step == 0)
        return;
    if (s->world != j->world) { /* a new layout: the old heat map no longer applies */
        coord_series_t *fresh = NULL;
        if (coord_series_create(j->seq, j->world, &fresh) < 0)
            return;
        free(s->heat);
        s->heat = fresh->heat;
        s->world = fresh->world;
        s->heat_ranks = fresh->heat_ranks;
        memset(s->heat_step, 0, sizeof s->heat_step);
        fresh->heat = NULL;
        coord_series_free(fresh);
    }
    float step_ms = metric(ev, COORD_METRIC_STEP_MS);
    coord_series_add_heat(s, ev->step, rank, step_ms);
    if (rank == 0) {
        int train = j->spec.kind == CH_JOB_TRAIN;
        coord_point_t p = {
            .step = ev->step,
            .loss = train ? (float)ev->loss : NAN,
            .tokens_per_s = train ? (float)ev->tokens_per_s : NAN,
            .mfu = train ? (float)ev->mfu : NAN,
            .step_ms = step_ms,
            .bubble = metric(ev, COORD_METRIC_BUBBLE),
        };
        coord_series_add_point(s, &p);
    }
}

const coord_series_t *coord_series_get(coord_t *c, const coord_job_t *j)
{
    return lookup(c, j->seq, j->world, 0);
}

void coord_series_tick(coord_t *c, uint64_t now_ms)
{
    coord_series_set_t *set = &c->series;
    if (now_ms - set->last_save_ms < COORD_SERIES_SAVE_MS)
        return;
    set->last_save_ms = now_ms;
    for (size_t i = 0; i < set->n; i++)
        if (set->v[i]->dirty)
            save(c, set->v[i]);
}

void coord_series_fini(coord_t *c)
{
    coord_series_set_t *set = &c->series;
    for (size_t i = 0; i < set->n; i++) {
        if (set->v[i]->dirty && c->store)
            save(c, set->v[i]);
        coord_series_free(set->v[i]);
    }
    set->n = 0;
}
