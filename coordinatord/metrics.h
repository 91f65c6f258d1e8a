/* Prometheus text exposition (DESIGN §11), served on /metrics by http.c: nodes and jobs
 * by state, heartbeats, recoveries, restarts by cause, and per job its step, loss,
 * tokens/s, MFU, step time (slowest rank), pipeline bubble, restarts and generation. A
 * job figure that was never reported has no sample. */
#ifndef COORD_METRICS_H
#define COORD_METRICS_H

#include <stddef.h>

typedef struct coord coord_t;

/* Render the current metrics; *out is malloc'd, the caller frees it. */
int coord_metrics_render(coord_t *c, char **out, size_t *len);

#endif
