/* The read-only HTTP server; see httpd.h. */
#include "common/httpd.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/err.h"
#include "common/log.h"
#include "common/util.h"

typedef struct conn {
    uv_tcp_t tcp;
    uv_timer_t timer; /* the connection's whole life: cfg.idle_ms */
    uv_write_t wr;
    uv_shutdown_t shut;
    struct conn *prev, *next; /* on ch_httpd.conns */
    ch_httpd_t *h;
    int handles; /* open libuv handles; freed when none is left */
    int closing, answered;
    char req[CH_HTTPD_HEAD_MAX];
    size_t len;
    char *resp;
} conn_t;

struct ch_httpd {
    uv_tcp_t tcp;
    ch_httpd_cfg_t cfg;
    int open;
    int waiting; /* a connection waits to be accepted (at the cap) */
    conn_t *conns;
    size_t n_conns;
    int live;                /* the listener and the connections not yet closed */
    uint64_t refused_log_ms; /* last "at the cap" log line */
    uint64_t limited, served;
};

static void accept_one(ch_httpd_t *h);

/* One handle of h's gone; the last frees h once it is stopped. */
static void unref(ch_httpd_t *h)
{
    if (--h->live == 0 && !h->open)
        free(h);
}

static void listener_closed(uv_handle_t *hd)
{
    unref(hd->data);
}

static void conn_handle_closed(uv_handle_t *hd)
{
    conn_t *x = hd->data;
    if (--x->handles > 0)
        return;
    ch_httpd_t *h = x->h;
    free(x->resp);
    free(x);
    h->n_conns--;
    if (h->waiting && h->open) {
        h->waiting = 0;
        accept_one(h);
    }
    unref(h);
}

static void conn_close(conn_t *x)
{
    ch_httpd_t *h = x->h;
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

static void plain(ch_http_reply_t *r, const char *status, const char *text)
{
    ch_buf_fini(&r->body);
    r->status = status;
    r->type = "text/plain; charset=utf-8";
    ch_buf_puts(&r->body, text);
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
static void route(ch_httpd_t *h, const char *head, int *head_only, ch_http_reply_t *r)
{
    char method[8], target[256];
    int n = 0;
    *head_only = 0;
    if (sscanf(head, "%7s %255s HTTP/%*d.%*d%n", method, target, &n) != 2 || n == 0) {
        plain(r, "400 Bad Request", "bad request line\n");
        return;
    }
    if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0) {
        plain(r, "405 Method Not Allowed", "read-only: GET or HEAD\n");
        return;
    }
    *head_only = strcmp(method, "HEAD") == 0;
    if (has_body(head)) {
        plain(r, "413 Payload Too Large", "requests carry no body here\n");
        return;
    }
    target[strcspn(target, "?#")] = '\0'; /* queries are ignored */
    int rc = h->cfg.route(h->cfg.ud, target, r);
    if (rc == CH_E_NOTFOUND)
        plain(r, "404 Not Found", h->cfg.not_found);
    else if (rc < 0 || r->body.err || !r->status)
        plain(r, "500 Internal Server Error", "could not render the page\n");
}

static void answer(conn_t *x, int too_big)
{
    ch_httpd_t *h = x->h;
    ch_http_reply_t r = {0};
    int head_only = 0;
    x->answered = 1;
    if (too_big)
        plain(&r, "413 Payload Too Large", "request head too large\n");
    else
        route(h, x->req, &head_only, &r);
    h->served++;
    if (strncmp(r.status, "4", 1) == 0)
        CH_LOGD(h->cfg.log_tag, "%s for %.60s", r.status, too_big ? "(oversized head)" : x->req);
    ch_buf_t out = {0};
    ch_buf_printf(&out,
                  "HTTP/1.0 %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n%sConnection: "
                  "close\r\n\r\n",
                  r.status, r.type, r.body.len, h->cfg.headers ? h->cfg.headers : "");
    if (!head_only && r.body.len)
        ch_buf_append(&out, r.body.p, r.body.len);
    ch_buf_fini(&r.body);
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

static void on_alloc(uv_handle_t *hd, size_t suggested, uv_buf_t *buf)
{
    conn_t *x = hd->data;
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

// ---------------------------------------------------------------------------------------
// the listener

/* Log a limit at most once per CH_HTTPD_LOG_MS. */
static void log_limit(ch_httpd_t *h, const char *what)
{
    uint64_t now = ch_now_ms();
    if (h->refused_log_ms && now - h->refused_log_ms < CH_HTTPD_LOG_MS)
        return;
    h->refused_log_ms = now;
    CH_LOGW(h->cfg.log_tag, "%s (limit hit %llu times so far)", what,
            (unsigned long long)h->limited);
}

static void accept_one(ch_httpd_t *h)
{
    conn_t *x = calloc(1, sizeof *x);
    if (!x) {
        h->waiting = 1; /* try again when a connection closes */
        return;
    }
    x->h = h;
    uv_tcp_init(h->tcp.loop, &x->tcp);
    uv_timer_init(h->tcp.loop, &x->timer);
    x->tcp.data = x->timer.data = x;
    x->handles = 2;
    h->n_conns++;
    h->live++;
    x->next = h->conns;
    if (x->next)
        x->next->prev = x;
    h->conns = x;
    if (uv_accept((uv_stream_t *)&h->tcp, (uv_stream_t *)&x->tcp) < 0 ||
        uv_read_start((uv_stream_t *)&x->tcp, on_alloc, on_read) < 0 ||
        uv_timer_start(&x->timer, on_timeout, h->cfg.idle_ms, 0) < 0)
        conn_close(x);
}

static void on_connection(uv_stream_t *server, int status)
{
    ch_httpd_t *h = server->data;
    char what[160];
    if (status < 0) {
        h->limited++;
        snprintf(what, sizeof what, "accept: %s", ch_strerror(ch_err_from_uv(status)));
        log_limit(h, what);
        return;
    }
    if (!h->open)
        return;
    if (h->n_conns >= h->cfg.max_conns) {
        /* Leave it: libuv stops polling the listener until accept_one takes it. */
        h->waiting = 1;
        h->limited++;
        snprintf(what, sizeof what,
                 "connection limit reached: %zu open, new connections wait in the backlog",
                 h->n_conns);
        log_limit(h, what);
        return;
    }
    accept_one(h);
}

int ch_httpd_start(uv_loop_t *loop, const struct sockaddr *addr, const ch_httpd_cfg_t *cfg,
                   ch_httpd_t **out)
{
    int rc;
    *out = NULL;
    if (!cfg->route || cfg->max_conns == 0)
        return -EINVAL;
    ch_httpd_t *h = calloc(1, sizeof *h);
    if (!h)
        return -ENOMEM;
    h->cfg = *cfg;
    if (!h->cfg.log_tag)
        h->cfg.log_tag = "http";
    if (!h->cfg.not_found)
        h->cfg.not_found = "not found\n";
    rc = ch_err_from_uv(uv_tcp_init(loop, &h->tcp));
    if (rc < 0) {
        free(h);
        return rc;
    }
    h->tcp.data = h;
    h->live = 1;
    rc = ch_err_from_uv(uv_tcp_bind(&h->tcp, addr, 0));
    if (rc == 0)
        rc = ch_err_from_uv(uv_listen((uv_stream_t *)&h->tcp, 64, on_connection));
    if (rc < 0) {
        uv_close((uv_handle_t *)&h->tcp, listener_closed); /* h->open is 0: frees h */
        return rc;
    }
    h->open = 1;
    *out = h;
    return 0;
}

const uv_tcp_t *ch_httpd_tcp(const ch_httpd_t *h)
{
    return &h->tcp;
}

uint64_t ch_httpd_limited(const ch_httpd_t *h)
{
    return h ? h->limited : 0;
}

uint64_t ch_httpd_served(const ch_httpd_t *h)
{
    return h ? h->served : 0;
}

void ch_httpd_stop(ch_httpd_t *h)
{
    if (!h || !h->open)
        return;
    h->open = 0;
    while (h->conns)
        conn_close(h->conns);
    uv_close((uv_handle_t *)&h->tcp, listener_closed);
}
