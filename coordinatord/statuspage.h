/* The status page (DESIGN §11), served by http.c on the metrics address: HTML with
 * server-drawn SVG, no script and nothing fetched from anywhere else.
 *
 *   /           nodes (state, slots, rack, device, last heartbeat) and the latest jobs
 *   /jobs/<id>  one job (id or name): progress, the loss and tokens/s curves over steps,
 *               the layout as a TP x PP x DP grid naming each rank's node, a heat map of
 *               per-rank step time over the last steps, and the restart history
 *
 * Read-only; shows no job file, key or path, only names, states and figures; every name
 * is HTML-escaped. Work per request is bounded: at most COORD_PAGE_MAX_JOBS jobs and
 * COORD_PAGE_MAX_NODES nodes listed, the series' bounded points (series.h), at most
 * COORD_PAGE_MAX_CELLS grid cells and COORD_PAGE_HEAT_RANKS heat-map columns. Stable
 * ids and classes (loss-path with data-points, layout with data-world, cells of class
 * rank) let tests check the structure. */
#ifndef COORD_STATUSPAGE_H
#define COORD_STATUSPAGE_H

#include <stddef.h>
#include <stdint.h>

#include "common/buf.h"

typedef struct coord coord_t;
typedef struct coord_job coord_job_t;

#define COORD_PAGE_MAX_JOBS   100
#define COORD_PAGE_MAX_NODES  2000
#define COORD_PAGE_MAX_CELLS  4096
#define COORD_PAGE_HEAT_RANKS 256

/* Append the page to b. 0, or CH_E_NOTFOUND for an unknown job. */
int coord_page_index(coord_t *c, ch_buf_t *b);
int coord_page_job(coord_t *c, const char *id, ch_buf_t *b);

/* One restart of a job, as the page and the metrics show it. */
typedef struct coord_restart_view {
    uint64_t generation; /* the generation the restart started */
    uint64_t at_ms;      /* wall clock; 0: unknown */
    int64_t from_step;   /* the checkpoint step it resumed from; -1: from scratch */
    const char *cause;   /* why (borrowed from the job) */
} coord_restart_view_t;

/* The restart history of j, oldest first: the newest max entries, returns how many. The
 * one place the page reads job.c's record of restarts. */
size_t coord_job_restart_history(const coord_job_t *j, coord_restart_view_t *out, size_t max);

#endif
