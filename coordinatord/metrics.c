/* Prometheus metrics; see metrics.h. */
#include "metrics.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/log.h"
#include "coord.h"
#include "recovery.h"

// ---------------------------------------------------------------------------------------
// Rendering

typedef struct sbuf {
    char *p;
    size_t len, cap;
    int err;
} sbuf_t;

static void put(sbuf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(sbuf_t *b, const char *fmt, ...)
{
    va_list ap;
    for (int tries = 0; tries < 2 && !b->err; tries++) {
        va_start(ap, fmt);
        int n = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->err = -EINVAL;
            return;
        }
        if ((size_t)n < b->cap - b->len) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = (b->cap + (size_t)n + 1) * 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->err = -ENOMEM;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
}

/* Label values escape backslash, double quote and newline. */
static const char *label(const char *s, char *buf, size_t cap)
{
    size_t k = 0;
    for (; *s && k + 2 < cap; s++) {
        if (*s == '\\' || *s == '"') {
            buf[k++] = '\\';
            buf[k++] = *s;
        } else if (*s == '\n') {
            buf[k++] = '\\';
            buf[k++] = 'n';
        } else {
            buf[k++] = *s;
        }
    }
    buf[k] = 0;
    return buf;
}

typedef struct job_gauge {
    const char *name, *help;
    int kind; /* 0 step, 1 loss, 2 tokens/s, 3 mfu */
} job_gauge_t;

static const job_gauge_t JOB_GAUGES[] = {
    {"chorus_job_step", "Last training step reported by the job.", 0},
    {"chorus_job_loss", "Loss at the last reported step (rank 0).", 1},
    {"chorus_job_tokens_per_second", "Training throughput (rank 0).", 2},
    {"chorus_job_mfu", "Model FLOPs utilisation, 0..1 (rank 0).", 3},
};

int coord_metrics_render(coord_t *c, char **out, size_t *len)
{
    sbuf_t b = {.p = malloc(4096), .cap = 4096};
    size_t nodes[COORD_NODE_NSTATES], jobs[COORD_JOB_NSTATES];
    char l1[160], l2[160];

    *out = NULL;
    if (!b.p)
        return -ENOMEM;
    b.p[0] = 0;
    coord_nodes_count(c, nodes);
    coord_jobs_count(c, jobs);
    put(&b, "# HELP chorus_nodes Nodes by state.\n# TYPE chorus_nodes gauge\n");
    for (int s = 0; s < COORD_NODE_NSTATES; s++)
        put(&b, "chorus_nodes{state=\"%s\"} %zu\n", coord_node_state_name(s), nodes[s]);
    put(&b, "# HELP chorus_jobs Jobs by state.\n# TYPE chorus_jobs gauge\n");
    for (int s = 0; s < COORD_JOB_NSTATES; s++)
        put(&b, "chorus_jobs{state=\"%s\"} %zu\n", coord_job_state_name(s), jobs[s]);
    put(&b,
        "# HELP chorus_heartbeats_total Heartbeats received from workers.\n"
        "# TYPE chorus_heartbeats_total counter\nchorus_heartbeats_total %llu\n",
        (unsigned long long)c->heartbeats_total);
    put(&b,
        "# HELP chorus_recoveries_total Job recoveries started.\n"
        "# TYPE chorus_recoveries_total counter\nchorus_recoveries_total %llu\n",
        (unsigned long long)c->recoveries_total);
    put(&b, "# HELP chorus_restarts_total Job restarts by the cause of the failure.\n"
            "# TYPE chorus_restarts_total counter\n");
    for (int k = 0; k < COORD_CAUSE_NCAUSES; k++)
        put(&b, "chorus_restarts_total{cause=\"%s\"} %llu\n", coord_cause_name(k),
            (unsigned long long)c->restarts_by_cause[k]);
    put(&b,
        "# HELP chorus_time_to_recover_seconds The last restart: failure to the first completed "
        "step after it.\n# TYPE chorus_time_to_recover_seconds gauge\n"
        "chorus_time_to_recover_seconds %.3f\n",
        c->recover_s_last);
    put(&b,
        "# HELP chorus_kv_keys Rendezvous keys held.\n# TYPE chorus_kv_keys gauge\n"
        "chorus_kv_keys %zu\n",
        coord_kv_keys(c->kv));
    for (size_t g = 0; g < sizeof(JOB_GAUGES) / sizeof(JOB_GAUGES[0]); g++) {
        put(&b, "# HELP %s %s\n# TYPE %s gauge\n", JOB_GAUGES[g].name, JOB_GAUGES[g].help,
            JOB_GAUGES[g].name);
        for (size_t i = 0; i < c->jobs.n; i++) {
            const coord_job_t *j = c->jobs.v[i];
            if (!j->started_ms)
                continue; /* never ran: nothing to show */
            double v = JOB_GAUGES[g].kind == 0   ? (double)j->step
                       : JOB_GAUGES[g].kind == 1 ? j->loss
                       : JOB_GAUGES[g].kind == 2 ? j->tokens_per_s
                                                 : j->mfu;
            put(&b, "%s{job=\"%s\",name=\"%s\"} %.17g\n", JOB_GAUGES[g].name,
                label(j->id, l1, sizeof(l1)), label(j->name, l2, sizeof(l2)), v);
        }
    }
    if (b.err) {
        free(b.p);
        return b.err;
    }
    *out = b.p;
    *len = b.len;
    return 0;
}

// ---------------------------------------------------------------------------------------
// HTTP: read until the end of the request head, answer, close.

#define REQ_MAX 8192

typedef struct coord_http {
    uv_tcp_t tcp;
    struct coord_http *prev, *next; /* on coord_metrics.conns */
    uv_write_t wr;
    coord_t *c;
    char req[REQ_MAX];
    size_t len;
    char *resp;
    int answered;
} http_t;

static void http_closed(uv_handle_t *h)
{
    http_t *x = h->data;
    coord_metrics_t *m = &x->c->metrics;
    if (x->prev)
        x->prev->next = x->next;
    else
        m->conns = x->next;
    if (x->next)
        x->next->prev = x->prev;
    free(x->resp);
    free(x);
}

static void http_close(http_t *x)
{
    if (!uv_is_closing((uv_handle_t *)&x->tcp))
        uv_close((uv_handle_t *)&x->tcp, http_closed);
}

static void http_written(uv_write_t *req, int status)
{
    (void)status;
    http_close(req->data);
}

static void http_answer(http_t *x)
{
    char *body = NULL;
    size_t blen = 0;
    const char *status = "200 OK";
    int is_metrics =
        strncmp(x->req, "GET /metrics ", 13) == 0 || strncmp(x->req, "GET /metrics?", 13) == 0;
    x->answered = 1;
    uv_read_stop((uv_stream_t *)&x->tcp);
    if (!is_metrics) {
        status = "404 Not Found";
    } else if (coord_metrics_render(x->c, &body, &blen) < 0) {
        status = "500 Internal Server Error";
    }
    const char *text = body ? body : "not found: try GET /metrics\n";
    size_t tlen = body ? blen : strlen(text);
    size_t cap = tlen + 256;
    x->resp = malloc(cap);
    if (!x->resp) {
        free(body);
        http_close(x);
        return;
    }
    int n = snprintf(x->resp, cap,
                     "HTTP/1.0 %s\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
                     "Content-Length: %zu\r\nConnection: close\r\n\r\n",
                     status, tlen);
    memcpy(x->resp + n, text, tlen);
    free(body);
    uv_buf_t buf = uv_buf_init(x->resp, (unsigned)((size_t)n + tlen));
    x->wr.data = x;
    if (uv_write(&x->wr, (uv_stream_t *)&x->tcp, &buf, 1, http_written) < 0)
        http_close(x);
}

static void http_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    http_t *x = h->data;
    (void)suggested;
    buf->base = x->req + x->len;
    buf->len = REQ_MAX - 1 - x->len;
}

static void http_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf)
{
    http_t *x = s->data;
    (void)buf;
    if (n < 0) {
        http_close(x);
        return;
    }
    x->len += (size_t)n;
    x->req[x->len] = 0;
    if (x->answered)
        return;
    if (strstr(x->req, "\r\n\r\n") || strstr(x->req, "\n\n"))
        http_answer(x);
    else if (x->len >= REQ_MAX - 1)
        http_close(x); /* request head too large */
}

static void on_http(uv_stream_t *server, int status)
{
    coord_t *c = server->data;
    if (status < 0)
        return;
    http_t *x = calloc(1, sizeof(*x));
    if (!x)
        return;
    x->c = c;
    uv_tcp_init(c->loop, &x->tcp);
    x->tcp.data = x;
    x->next = c->metrics.conns;
    if (x->next)
        x->next->prev = x;
    c->metrics.conns = x;
    if (uv_accept(server, (uv_stream_t *)&x->tcp) < 0 ||
        uv_read_start((uv_stream_t *)&x->tcp, http_alloc, http_read) < 0)
        http_close(x);
}

int coord_metrics_start(coord_t *c)
{
    struct sockaddr_storage ss;
    coord_metrics_t *m = &c->metrics;
    int rc;

    if (!c->cfg.metrics[0])
        return 0;
    if (coord_addr_parse(c->cfg.metrics, &ss) < 0) {
        CH_LOGE("metrics", "bad address \"%s\" (expected IP:PORT)", c->cfg.metrics);
        return CH_E_CONFIG;
    }
    CH_CHECK_GOTO(ch_err_from_uv(uv_tcp_init(c->loop, &m->tcp)), rc, out);
    m->tcp.data = c;
    m->open = 1;
    CH_CHECK_GOTO(ch_err_from_uv(uv_tcp_bind(&m->tcp, (struct sockaddr *)&ss, 0)), rc, out);
    CH_CHECK_GOTO(ch_err_from_uv(uv_listen((uv_stream_t *)&m->tcp, 64, on_http)), rc, out);
    coord_addr_name(&m->tcp, m->addr, sizeof(m->addr));
    CH_LOGI("metrics", "Prometheus metrics on http://%s/metrics", m->addr);
out:
    if (rc < 0)
        CH_LOGE("metrics", "listen on %s: %s", c->cfg.metrics, ch_strerror(rc));
    return rc;
}

void coord_metrics_stop(coord_t *c)
{
    if (c->metrics.open) {
        uv_close((uv_handle_t *)&c->metrics.tcp, NULL);
        c->metrics.open = 0;
    }
    for (http_t *x = c->metrics.conns; x; x = x->next)
        http_close(x);
}
