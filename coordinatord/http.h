/* The coordinator's HTTP address (cfg.metrics, "HOST:PORT"): Prometheus text on /metrics,
 * "ok" on /healthz and the read-only status page (statuspage.h) on / and /jobs/<id>. The
 * server and its limits are common/httpd.h's: at most COORD_HTTP_MAX_CONNS connections at
 * once (fewer when RLIMIT_NOFILE is small, keeping the rest of the descriptors for the
 * control socket and the node links), COORD_HTTP_IDLE_MS each. Rendering is bounded per
 * request (statuspage.h). */
#ifndef COORD_HTTP_H
#define COORD_HTTP_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "common/httpd.h"
#include "common/buf.h"

typedef struct coord coord_t;

#define COORD_HTTP_MAX_CONNS 64
#define COORD_HTTP_IDLE_MS   5000

typedef struct coord_http {
    ch_httpd_t *srv; /* NULL when not serving */
    int open;
    char addr[80]; /* actual address */
} coord_http_t;

int coord_http_start(coord_t *c);
void coord_http_stop(coord_t *c);

#endif
