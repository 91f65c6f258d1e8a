/* The HTTP address: limits, parsing and routing; see http.h. */
#include "http.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>

#include "common/buf.h"
#include "common/err.h"
#include "common/log.h"
#include "common/util.h"
#include "coord.h"
#include "metrics.h"
#include "jobjson.h"
#include "statuspage.h"

// ---------------------------------------------------------------------------------------
// connections

typedef struct coord_http_conn {
    uv_tcp_t tcp;
    uv_timer_t timer; /* the connection's whole life: COORD_HTTP_IDLE_MS */
    uv_write_t wr;
    uv_shutdown_t shut;
    struct coord_http_conn *prev, *next; /* on coord_http.conns */
    coord_t *c;
    int handles; /* open libuv handles; freed when none is left */
    int closing, answered;
    char req[COORD_HTTP_HEAD_MAX];
    size_t len;
    char *resp;
} conn_t;

static void accept_one(coord_t *c);

static void conn_handle_closed(uv_handle_t *h)
{
    conn_t *x = h->data;
    if (--x->handles > 0)
        return;
    coord_t *c = x->c;
    free(x->resp);
    free(x);
    c->http.n_conns--;
    if (c->http.waiting && c->http.open) {
        c->http.waiting = 0;
        accept_one(c);
    }
}

static void conn_close(conn_t *x)
{
    coord_http_t *h = &x->c->http;
    if (x->closing)
        return;
    x->closing = 1;
    if (x->prev)
        x->prev->next = x->next;
    else
        h->conns = x->next;
    if (x->next)
        x->next->prev = x->prev;
    uv_close((uv_handle_t *)&x->timer, conn_handle_closed);
    uv_close((uv_handle_t *)&x->tcp, conn_handle_closed);
}

static void on_timeout(uv_timer_t *t)
{
    conn_close(t->data);
}

static void on_shutdown(uv_shutdown_t *req, int status)
{
    if (status < 0)
        conn_close(req->data);
    /* else: wait for the client's EOF (or the timer), so unread bytes cause no reset */
}

static void on_written(uv_write_t *req, int status)
{
    conn_t *x = req->data;
    x->shut.data = x;
    if (status < 0 || x->closing || uv_shutdown(&x->shut, (uv_stream_t *)&x->tcp, on_shutdown) < 0)
        conn_close(x);
}

// ---------------------------------------------------------------------------------------
// requests

typedef struct answer {
    const char *status; /* "200 OK" */
    const char *type;
    ch_buf_t body;
} answer_t;

static void plain(answer_t *a, const char *status, const char *text)
{
    a->status = status;
    a->type = "text/plain; charset=utf-8";
    ch_buf_puts(&a->body, text);
}

/* 1 when the head announces a body (we take none). */
static int has_body(const char *head)
{
    for (const char *l = strchr(head, '\n'); l && l[1]; l = strchr(l + 1, '\n')) {
        const char *h = l + 1;
        if (strncasecmp(h, "Transfer-Encoding:", 18) == 0)
            return 1;
        if (strncasecmp(h, "Content-Length:", 15) == 0 && strtoull(h + 15, NULL, 10) > 0)
            return 1;
    }
    return 0;
}

/* Route one complete request head. */
/* /jobs/<id>.json, whose id is not empty */
static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n > k && strcmp(s + n - k, suffix) == 0;
}

static void route(coord_t *c, const char *head, int *head_only, answer_t *a)
{
    char method[8], target[256];
    int n = 0;
    *head_only = 0;
    if (sscanf(head, "%7s %255s HTTP/%*d.%*d%n", method, target, &n) != 2 || n == 0) {
        plain(a, "400 Bad Request", "bad request line\n");
        return;
    }
    if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0) {
        plain(a, "405 Method Not Allowed", "read-only: GET or HEAD\n");
        return;
    }
    *head_only = strcmp(method, "HEAD") == 0;
    if (has_body(head)) {
        plain(a, "413 Payload Too Large", "requests carry no body here\n");
        return;
    }
    target[strcspn(target, "?#")] = '\0'; /* queries are ignored */
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
        plain(a, "200 OK", "ok\n");
        return;
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
    if (rc == CH_E_NOTFOUND) {
        ch_buf_fini(&a->body);
        plain(a, "404 Not Found", "not found: try /, /metrics or /healthz\n");
    } else if (rc < 0 || a->body.err) {
        ch_buf_fini(&a->body);
        plain(a, "500 Internal Server Error", "could not render the page\n");
    }
}

static void answer(conn_t *x, int too_big)
{
    answer_t a = {0};
    int head_only = 0;
    x->answered = 1;
    if (too_big)
        plain(&a, "413 Payload Too Large", "request head too large\n");
    else
        route(x->c, x->req, &head_only, &a);
    x->c->http.served++;
    if (strncmp(a.status, "4", 1) == 0)
        CH_LOGD("http", "%s for %.60s", a.status, too_big ? "(oversized head)" : x->req);
    ch_buf_t out = {0};
    ch_buf_printf(&out,
                  "HTTP/1.0 %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
                  "Cache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\n"
                  "Content-Security-Policy: default-src 'none'; style-src 'unsafe-inline'\r\n"
                  "Referrer-Policy: no-referrer\r\nConnection: close\r\n\r\n",
                  a.status, a.type, a.body.len);
    if (!head_only && a.body.len)
        ch_buf_append(&out, a.body.p, a.body.len);
    ch_buf_fini(&a.body);
    if (out.err) {
        ch_buf_fini(&out);
        conn_close(x);
        return;
    }
    x->resp = out.p; /* freed with the connection */
    x->len = 0;      /* what arrives from now on is read and dropped */
    uv_buf_t buf = uv_buf_init(out.p, (unsigned)out.len);
    x->wr.data = x;
    if (uv_write(&x->wr, (uv_stream_t *)&x->tcp, &buf, 1, on_written) < 0)
        conn_close(x);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    conn_t *x = h->data;
    (void)suggested;
    if (x->answered)
        x->len = 0;
    buf->base = x->req + x->len;
    buf->len = sizeof x->req - 1 - x->len;
}

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf)
{
    conn_t *x = s->data;
    (void)buf;
    if (n < 0) {
        conn_close(x);
        return;
    }
    if (x->answered)
        return;
    x->len += (size_t)n;
    x->req[x->len] = '\0';
    if (strstr(x->req, "\r\n\r\n") || strstr(x->req, "\n\n"))
        answer(x, 0);
    else if (x->len >= sizeof x->req - 1)
        answer(x, 1);
}

/* Log a limit at most once per COORD_HTTP_LOG_MS. */
static void log_limit(coord_t *c, const char *what)
{
    uint64_t now = ch_now_ms();
    if (c->http.refused_log_ms && now - c->http.refused_log_ms < COORD_HTTP_LOG_MS)
        return;
    c->http.refused_log_ms = now;
    CH_LOGW("http", "%s (limit hit %llu times so far)", what, (unsigned long long)c->http.limited);
}

static void accept_one(coord_t *c)
{
    coord_http_t *h = &c->http;
    conn_t *x = calloc(1, sizeof *x);
    if (!x) {
        h->waiting = 1; /* try again when a connection closes */
        return;
    }
    x->c = c;
    uv_tcp_init(c->loop, &x->tcp);
    uv_timer_init(c->loop, &x->timer);
    x->tcp.data = x->timer.data = x;
    x->handles = 2;
    h->n_conns++;
    x->next = h->conns;
    if (x->next)
        x->next->prev = x;
    h->conns = x;
    if (uv_accept((uv_stream_t *)&h->tcp, (uv_stream_t *)&x->tcp) < 0 ||
        uv_read_start((uv_stream_t *)&x->tcp, on_alloc, on_read) < 0 ||
        uv_timer_start(&x->timer, on_timeout, COORD_HTTP_IDLE_MS, 0) < 0)
        conn_close(x);
}

static void on_connection(uv_stream_t *server, int status)
{
    coord_t *c = server->data;
    char what[160];
    if (status < 0) {
        c->http.limited++;
        snprintf(what, sizeof what, "accept: %s", ch_strerror(ch_err_from_uv(status)));
        log_limit(c, what);
        return;
    }
    if (c->http.n_conns >= c->http.max_conns) {
        /* Leave it: libuv stops polling the listener until accept_one takes it. */
        c->http.waiting = 1;
        c->http.limited++;
        snprintf(what, sizeof what,
                 "connection limit reached: %zu open, new connections wait in the backlog",
                 c->http.n_conns);
        log_limit(c, what);
        return;
    }
    accept_one(c);
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
    h->max_conns = conn_cap();
    CH_CHECK_GOTO(ch_err_from_uv(uv_tcp_init(c->loop, &h->tcp)), rc, out);
    h->tcp.data = c;
    h->open = 1;
    CH_CHECK_GOTO(ch_err_from_uv(uv_tcp_bind(&h->tcp, (struct sockaddr *)&ss, 0)), rc, out);
    CH_CHECK_GOTO(ch_err_from_uv(uv_listen((uv_stream_t *)&h->tcp, 64, on_connection)), rc, out);
    coord_addr_name(&h->tcp, h->addr, sizeof(h->addr));
    CH_LOGI("http",
            "status page on http://%s/ and Prometheus metrics on http://%s/metrics "
            "(at most %zu connections)",
            h->addr, h->addr, h->max_conns);
out:
    if (rc < 0)
        CH_LOGE("http", "listen on %s: %s", c->cfg.metrics, ch_strerror(rc));
    return rc;
}

void coord_http_stop(coord_t *c)
{
    coord_http_t *h = &c->http;
    if (h->open) {
        uv_close((uv_handle_t *)&h->tcp, NULL);
        h->open = 0;
    }
    while (h->conns)
        conn_close(h->conns);
}
