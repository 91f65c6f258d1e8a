/* Prometheus text exposition (DESIGN §11) on cfg.metrics ("HOST:PORT"): a plain libuv
 * HTTP/1.0 responder answering GET /metrics and closing; anything else gets 404. */
#ifndef COORD_METRICS_H
#define COORD_METRICS_H

#include <stddef.h>
#include <uv.h>

typedef struct coord coord_t;

struct coord_http;

typedef struct coord_metrics {
    uv_tcp_t tcp;
    int open;
    struct coord_http *conns; /* open HTTP connections, closed at stop */
    char addr[80];            /* actual address */
} coord_metrics_t;

/* Render the current metrics; *out is malloc'd, the caller frees it. */
int coord_metrics_render(coord_t *c, char **out, size_t *len);
int coord_metrics_start(coord_t *c);
void coord_metrics_stop(coord_t *c);

#endif
