/* The coordinator's HTTP address (cfg.metrics, "HOST:PORT"): Prometheus text on /metrics
 * and the read-only status page (statuspage.h) on / and /jobs/<id>. HTTP/1.0, GET and
 * HEAD only, one request per connection, then close.
 *
 * Nothing here may slow the control socket or the node links, which share the loop and
 * the descriptor table: at most COORD_HTTP_MAX_CONNS connections are open at once (fewer
 * when RLIMIT_NOFILE is small, keeping the rest of the descriptors in reserve); past the
 * cap new connections stay in the kernel's backlog (libuv holds one accepted descriptor
 * and stops polling the listener) until one closes. A connection gets COORD_HTTP_IDLE_MS
 * in all to send its request and take the answer. A request head over
 * COORD_HTTP_HEAD_MAX bytes, or one announcing a body, gets 413; an unknown path 404;
 * another method 405. Rendering is bounded per request (statuspage.h). Each limit that
 * is hit is logged, at most once per COORD_HTTP_LOG_MS. */
#ifndef COORD_HTTP_H
#define COORD_HTTP_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

typedef struct coord coord_t;

#define COORD_HTTP_MAX_CONNS 64
#define COORD_HTTP_IDLE_MS   5000
#define COORD_HTTP_HEAD_MAX  8192
#define COORD_HTTP_LOG_MS    10000

struct coord_http_conn;

typedef struct coord_http {
    uv_tcp_t tcp;
    int open;
    struct coord_http_conn *conns; /* open connections, closed at stop */
    size_t n_conns, max_conns;
    int waiting;              /* a connection waits to be accepted (at the cap) */
    uint64_t refused_log_ms;  /* last "at the cap" log line */
    uint64_t limited, served; /* counters: times the cap was hit, requests answered */
    char addr[80];            /* actual address */
} coord_http_t;

int coord_http_start(coord_t *c);
void coord_http_stop(coord_t *c);

#endif
