/* Jobs on the wire: a job as the JobInfo of a status or list reply. The one place the
 * coordinator's job is turned into protobuf for a client. */
#ifndef COORD_JOBINFO_H
#define COORD_JOBINFO_H

#include <stdint.h>

#include "chorus.pb-c.h"
#include "job.h"

/* A job this big or smaller is detailed rank by rank (with metrics) by default; a bigger
 * one is summed up (ranks per state), its ranks paged on request (DESIGN §10). */
#define COORD_STATUS_RANKS 1024

/* Which ranks a JobInfo details: [first, first + count) clipped to the world, with their
 * metrics or without. */
typedef struct coord_rank_view {
    uint32_t first, count;
    int metrics;
} coord_rank_view_t;

/* The view a JobQuery asks for (its defaults above). */
coord_rank_view_t coord_job_view(const coord_job_t *j, const Chorus__JobQuery *q);
/* JobInfo for a reply; strings are borrowed from j. view NULL: the job's row only (no
 * ranks, history or job file, as in ListJobs); else those plus the ranks per state and
 * the ranks in view. Free with coord_job_info_clear. */
int coord_job_info(const coord_job_t *j, const coord_rank_view_t *view, Chorus__JobInfo *out);
void coord_job_info_clear(Chorus__JobInfo *ji);

#endif
