/* The HTTP address: routing; the server is common/httpd.c. See http.h. */
#include "http.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "common/err.h"
#include "common/log.h"
#include "common/util.h"
#include "coord.h"
#include "jobjson.h"
#include "metrics.h"
#include "statuspage.h"

// ---------------------------------------------------------------------------------------
// requests

/* /jobs/<id>.json, whose id is not empty */
static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n > k && strcmp(s + n - k, suffix) == 0;
}

static int route(void *ud, char *target, ch_http_reply_t *a)
{
    coord_t *c = ud;
    int rc = 0;
    if (strcmp(target, "/metrics") == 0) {
        char *text = NULL;
        size_t len = 0;
        rc = coord_metrics_render(c, &text, &len);
        if (rc == 0) {
            a->status = "200 OK";
            a->type = "text/plain; version=0.0.4; charset=utf-8";
            ch_buf_append(&a->body, text, len);
        }
        free(text);
    } else if (strcmp(target, "/healthz") == 0) {
        /* Answered from the event loop: a wedged loop answers nothing (a probe's timeout). */
        a->status = "200 OK";
        a->type = "text/plain; charset=utf-8";
        ch_buf_puts(&a->body, "ok\n");
    } else if (strcmp(target, "/") == 0) {
        a->status = "200 OK";
        a->type = "text/html; charset=utf-8";
        rc = coord_page_index(c, &a->body);
    } else if (strncmp(target, "/jobs/", 6) == 0 && ends_with(target + 6, ".json")) {
        a->status = "200 OK";
        a->type = "application/json";
        target[strlen(target) - 5] = '\0';
        rc = coord_page_job_json(c, target + 6, &a->body);
    } else if (strncmp(target, "/jobs/", 6) == 0 && target[6]) {
        a->status = "200 OK";
        a->type = "text/html; charset=utf-8";
        rc = coord_page_job(c, target + 6, &a->body);
    } else {
        rc = CH_E_NOTFOUND;
    }
    return rc;
}

/* COORD_HTTP_MAX_CONNS, or an eighth of the descriptor limit when that is smaller: the
 * control socket, node links, SQLite and rank logs keep the rest. */
static size_t conn_cap(void)
{
    struct rlimit rl;
    size_t cap = COORD_HTTP_MAX_CONNS;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur / 8 < cap)
        cap = rl.rlim_cur / 8 ? (size_t)(rl.rlim_cur / 8) : 1;
    return cap;
}

int coord_http_start(coord_t *c)
{
    struct sockaddr_storage ss;
    coord_http_t *h = &c->http;
    int rc;

    if (!c->cfg.metrics[0])
        return 0;
    if (coord_addr_parse(c->cfg.metrics, &ss) < 0) {
        CH_LOGE("http", "bad address \"%s\" (expected IP:PORT)", c->cfg.metrics);
        return CH_E_CONFIG;
    }
    ch_httpd_cfg_t hc = {
        .log_tag = "http",
        .max_conns = conn_cap(),
        .idle_ms = COORD_HTTP_IDLE_MS,
        .headers = "Cache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\n"
                   "Content-Security-Policy: default-src 'none'; style-src 'unsafe-inline'\r\n"
                   "Referrer-Policy: no-referrer\r\n",
        .not_found = "not found: try /, /metrics or /healthz\n",
        .route = route,
        .ud = c,
    };
    rc = ch_httpd_start(c->loop, (struct sockaddr *)&ss, &hc, &h->srv);
    if (rc < 0) {
        CH_LOGE("http", "listen on %s: %s", c->cfg.metrics, ch_strerror(rc));
        return rc;
    }
    h->open = 1;
    coord_addr_name(ch_httpd_tcp(h->srv), h->addr, sizeof(h->addr));
    CH_LOGI("http",
            "status page on http://%s/ and Prometheus metrics on http://%s/metrics "
            "(at most %zu connections)",
            h->addr, h->addr, hc.max_conns);
    return 0;
}

void coord_http_stop(coord_t *c)
{
    coord_http_t *h = &c->http;
    ch_httpd_stop(h->srv);
    h->srv = NULL;
    h->open = 0;
}
