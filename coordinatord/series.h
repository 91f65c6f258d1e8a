/* Per-job series for the status page (DESIGN §11): the loss curve, tokens/s, MFU and
 * step time over steps, and the per-rank step times of the last steps (the straggler
 * heat map).
 *
 * Theory of operation. job.c hands every progress event to coord_series_progress (its
 * one hook). Rank 0's event adds a point (step, loss, tokens/s, MFU, its step time, the
 * pipeline bubble when reported); every rank's event fills its cell of the heat-map row
 * of that step. Memory is bounded per job: the last COORD_SERIES_RECENT points at full
 * resolution, and older points decimated into COORD_SERIES_HISTORY slots (a point is kept
 * when its step is a multiple of the stride; the stride doubles, dropping every other
 * kept point, when the slots fill), and COORD_SERIES_HEAT_STEPS rows of at most
 * COORD_SERIES_HEAT_RANKS ranks. When a job resumes from a checkpoint its steps go back:
 * points at or after the resumed step are dropped, so the curve shows the run that
 * counts. Memory is bounded across jobs too: at most COORD_SERIES_CACHE series are
 * held; the least recently used one that is saved is let go and read back from SQLite
 * when asked for again. Dirty series are saved (one blob per job, store.h) by
 * coord_series_tick every COORD_SERIES_SAVE_MS and at shutdown, so the page survives a
 * coordinator restart. */
#ifndef COORD_SERIES_H
#define COORD_SERIES_H

#include <stddef.h>
#include <stdint.h>

#include "chorus.pb-c.h"

typedef struct coord coord_t;
typedef struct coord_job coord_job_t;

#define COORD_SERIES_RECENT     256
#define COORD_SERIES_HISTORY    256
#define COORD_SERIES_HEAT_STEPS 32
#define COORD_SERIES_HEAT_RANKS 1024
#define COORD_SERIES_CACHE      64
#define COORD_SERIES_SAVE_MS    2000

/* The rank metrics the series reads (RankEvent.metrics): this rank's time for the step,
 * and the pipeline's idle fraction once the engine reports it. */
#define COORD_METRIC_STEP_MS "step_ms"
#define COORD_METRIC_BUBBLE  "bubble"
/* rank 0's validation loss (train.val_data) and the steps done when it was taken */
#define COORD_METRIC_VAL_LOSS "val_loss"
#define COORD_METRIC_VAL_STEP "val_step"

/* One reported step; NaN where a figure was not reported. */
typedef struct coord_point {
    uint64_t step;
    float loss, tokens_per_s, mfu, step_ms, bubble;
} coord_point_t;

typedef struct coord_series {
    int64_t seq; /* the job's sequence number ("j<seq>") */
    uint32_t world, heat_ranks;
    coord_point_t history[COORD_SERIES_HISTORY];
    size_t n_history;
    uint64_t stride;                           /* history keeps steps that are multiples */
    coord_point_t recent[COORD_SERIES_RECENT]; /* ring: oldest at recent_head */
    size_t recent_head, n_recent;
    uint64_t heat_step[COORD_SERIES_HEAT_STEPS]; /* row r holds this step; 0: empty */
    float *heat;                                 /* HEAT_STEPS x heat_ranks ms, NaN unknown */
    int dirty;
    uint64_t used; /* last use, for letting the least recently used go */
} coord_series_t;

typedef struct coord_series_set {
    coord_series_t *v[COORD_SERIES_CACHE];
    size_t n;
    uint64_t clock, last_save_ms;
} coord_series_set_t;

/* The hook for job.c: one progress event of rank of j (already fenced and validated). */
void coord_series_progress(coord_t *c, const coord_job_t *j, uint32_t rank,
                           const Chorus__RankEvent *ev);
/* Periodic: save what changed (at most every COORD_SERIES_SAVE_MS). */
void coord_series_tick(coord_t *c, uint64_t now_ms);
/* Save everything that changed and free the set (at shutdown). */
void coord_series_fini(coord_t *c);

/* The series of job j, from memory or from the store; NULL when it has none (never
 * reported a step) or on error. Borrowed until the next call into this module. */
const coord_series_t *coord_series_get(coord_t *c, const coord_job_t *j);
/* Points in step order (history, then recent): fills up to max, returns the count. */
size_t coord_series_points(const coord_series_t *s, coord_point_t *out, size_t max);
/* Heat-map rows in step order: up to max steps in steps[], returns the count; cell
 * (i, rank) via coord_series_heat_at. */
size_t coord_series_heat_rows(const coord_series_t *s, uint64_t *steps, size_t max);
float coord_series_heat_at(const coord_series_t *s, uint64_t step, uint32_t rank);

/* The saved form (one blob per job); exported for tests. *out is malloc'd. */
int coord_series_encode(const coord_series_t *s, void **out, size_t *len);
/* Takes a blob from coord_series_encode (or from a hostile file: every size is checked).
 * *out is freed with coord_series_free. */
int coord_series_decode(int64_t seq, const void *blob, size_t len, coord_series_t **out);
int coord_series_create(int64_t seq, uint32_t world, coord_series_t **out);
void coord_series_free(coord_series_t *s);
/* Record one point / one heat cell (what coord_series_progress does). */
void coord_series_add_point(coord_series_t *s, const coord_point_t *p);
void coord_series_add_heat(coord_series_t *s, uint64_t step, uint32_t rank, float ms);

#endif
