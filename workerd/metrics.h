/* workerd's own HTTP address (metrics-address:metrics-port in workerd.conf; off unless a
 * port is set): Prometheus text on /metrics (the node's ranks, their starts and exits, the
 * coordinator registrations, host memory, GPUs, chorus_build_info and process_*) and
 * "ok" on /healthz. The server is common/httpd.h (HTTP/1.0, GET and HEAD, one request per
 * connection), with at most WRK_METRICS_MAX_CONNS connections at once, each given
 * WRK_METRICS_IDLE_MS in all. It shares the loop with the rank links, so it does no more
 * than render a page of text per request. */
#ifndef WRK_METRICS_H
#define WRK_METRICS_H

#include <stddef.h>
#include <uv.h>

#include "workerd/agent.h"

#define WRK_METRICS_MAX_CONNS 16
#define WRK_METRICS_IDLE_MS   5000

typedef struct wrk_metrics wrk_metrics_t;

typedef struct wrk_metrics_src {
    const wrk_agent_t *agent;
    const char *node;    /* node name, a label on chorus_workerd_info */
    const char *device;  /* "cpu" | "cuda" */
    int gpus;            /* GPUs visible to the ranks */
    const char *meminfo; /* NULL: /proc/meminfo */
} wrk_metrics_src_t;

/* The exposition for src; *out is malloc'd. 0 or a negative code. */
int wrk_metrics_render(const wrk_metrics_src_t *src, char **out, size_t *len);

/* Listen on host:port (port 0: the kernel picks; wrk_metrics_port says which). src is
 * copied; its agent must outlive the server. 0 or a negative code. */
int wrk_metrics_start(uv_loop_t *loop, const char *host, int port, const wrk_metrics_src_t *src,
                      wrk_metrics_t **out);
int wrk_metrics_port(const wrk_metrics_t *m);
/* Close the listener and every connection (their memory goes once the loop runs the
 * closes). NULL is fine. */
void wrk_metrics_stop(wrk_metrics_t *m);

#endif
