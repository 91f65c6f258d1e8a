/* A small read-only HTTP server on a libuv loop, for the daemons' status and metrics
 * addresses (coordinatord/http.c, workerd/metrics.c): HTTP/1.0, GET and HEAD only, one
 * request per connection, then close. The daemon routes a path to a reply; everything
 * else is here.
 *
 * Nothing here may slow what shares the loop and the descriptor table (a daemon's control
 * socket and links): at most cfg.max_conns connections are open at once; past the cap new
 * connections stay in the kernel's backlog (libuv holds one accepted descriptor and stops
 * polling the listener) until one closes. A connection gets cfg.idle_ms in all to send its
 * request and take the answer. A request head over CH_HTTPD_HEAD_MAX bytes, or one
 * announcing a body, gets 413; a bad request line 400; another method 405; a path the
 * daemon does not know 404. Each limit that is hit is logged, at most once per
 * CH_HTTPD_LOG_MS. */
#ifndef CH_HTTPD_H
#define CH_HTTPD_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "common/buf.h"

#define CH_HTTPD_HEAD_MAX 8192
#define CH_HTTPD_LOG_MS   10000

typedef struct ch_httpd ch_httpd_t;

typedef struct ch_http_reply {
    const char *status; /* "200 OK" */
    const char *type;   /* Content-Type */
    ch_buf_t body;
} ch_http_reply_t;

/* Fill r for a GET or HEAD of target (the path, query and fragment cut off; writable).
 * 0; CH_E_NOTFOUND for a 404 (cfg.not_found is the body); another negative code, or a
 * body whose buffer failed, for a 500. */
typedef int (*ch_httpd_route_fn)(void *ud, char *target, ch_http_reply_t *r);

typedef struct ch_httpd_cfg {
    const char *log_tag;   /* "http" */
    size_t max_conns;      /* >= 1 */
    uint32_t idle_ms;      /* a connection's whole life */
    const char *headers;   /* more response header lines, each ending "\r\n"; NULL: none */
    const char *not_found; /* the 404 body */
    ch_httpd_route_fn route;
    void *ud;
} ch_httpd_cfg_t;

/* Listen on addr. cfg is copied (its strings are borrowed for the server's life). 0 or a
 * negative code; on error nothing is left open. */
int ch_httpd_start(uv_loop_t *loop, const struct sockaddr *addr, const ch_httpd_cfg_t *cfg,
                   ch_httpd_t **out);
/* The listening handle (for its address). */
const uv_tcp_t *ch_httpd_tcp(const ch_httpd_t *h);
/* Times the connection cap (or accept) failed a client; requests answered. */
uint64_t ch_httpd_limited(const ch_httpd_t *h);
uint64_t ch_httpd_served(const ch_httpd_t *h);
/* Close the listener and every connection; the memory goes once the loop has run the
 * closes. NULL is fine. */
void ch_httpd_stop(ch_httpd_t *h);

#endif
