/* workerd's /metrics and /healthz; see metrics.h. */
#include "workerd/metrics.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/log.h"
#include "common/procmetrics.h"
#include "common/util.h"

// ----------------------------------------------------------------------------
// rendering

typedef struct tbuf {
    char *p;
    size_t len, cap;
    int err;
} tbuf_t;

static void tb_printf(tbuf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void tb_printf(tbuf_t *b, const char *fmt, ...)
{
    for (int tries = 0; tries < 2 && !b->err; tries++) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->p ? b->p + b->len : NULL, b->cap - b->len, fmt, ap);
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

/* A gauge or counter with its HELP and TYPE lines and one unlabelled sample. */
static void sample(tbuf_t *b, const char *name, const char *type, const char *help, double v)
{
    tb_printf(b, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", name, help, name, type, name, v);
}

/* MemTotal and MemAvailable of a meminfo file, in bytes; -1 when not there. */
static void meminfo(const char *path, double *total, double *avail)
{
    char *text = NULL;
    size_t n = 0;
    *total = *avail = -1;
    if (ch_file_read(path, 1 << 16, &text, &n) < 0)
        return;
    const char *t = strstr(text, "MemTotal:"), *a = strstr(text, "MemAvailable:");
    if (t)
        *total = strtod(t + 9, NULL) * 1024.0; /* the file counts kB (KiB) */
    if (a)
        *avail = strtod(a + 13, NULL) * 1024.0;
    free(text);
}

/* Label values here are node names and fixed words; quote and backslash are still escaped
 * so an odd name cannot break the exposition. */
static void label_value(tbuf_t *b, const char *s)
{
    for (; *s; s++) {
        if (*s == '\\' || *s == '"')
            tb_printf(b, "\\%c", *s);
        else if (*s == '\n')
            tb_printf(b, "\\n");
        else
            tb_printf(b, "%c", *s);
    }
}

int wrk_metrics_render(const wrk_metrics_src_t *src, char **out, size_t *len)
{
    tbuf_t b = {0};
    wrk_agent_stats_t st;
    double total, avail;
    char proc[2048];

    *out = NULL;
    wrk_agent_stats(src->agent, &st);
    tb_printf(&b,
              "# HELP chorus_build_info The daemon's version (value 1).\n"
              "# TYPE chorus_build_info gauge\nchorus_build_info{version=\"%s\"} 1\n",
              CHORUS_VERSION);
    tb_printf(&b, "# HELP chorus_workerd_info The node this workerd serves (value 1).\n"
                  "# TYPE chorus_workerd_info gauge\nchorus_workerd_info{node=\"");
    label_value(&b, src->node ? src->node : "");
    tb_printf(&b, "\",device=\"");
    label_value(&b, src->device ? src->device : "");
    tb_printf(&b, "\"} 1\n");
    if (ch_procmetrics_render(proc, sizeof proc) > 0)
        tb_printf(&b, "%s", proc);
    sample(&b, "chorus_workerd_ranks", "gauge", "Rank processes running now.", st.ranks_alive);
    sample(&b, "chorus_workerd_slots", "gauge", "Rank processes this node runs at once.", st.slots);
    sample(&b, "chorus_workerd_registered", "gauge",
           "1 while registered with the coordinator, else 0.", st.registered);
    sample(&b, "chorus_workerd_registrations_total", "counter",
           "Registrations with the coordinator (each link re-made counts one).",
           (double)st.registrations);
    sample(&b, "chorus_workerd_rank_starts_total", "counter", "Rank processes started.",
           (double)st.rank_starts);
    sample(&b, "chorus_workerd_rank_spawn_failures_total", "counter",
           "Ranks the coordinator asked for that could not be started.",
           (double)st.rank_spawn_fails);
    tb_printf(&b,
              "# HELP chorus_workerd_rank_exits_total Rank processes reaped, by whether "
              "they reported their work done.\n# TYPE chorus_workerd_rank_exits_total "
              "counter\nchorus_workerd_rank_exits_total{outcome=\"done\"} %llu\n"
              "chorus_workerd_rank_exits_total{outcome=\"other\"} %llu\n",
              (unsigned long long)st.rank_exits_done, (unsigned long long)st.rank_exits_other);
    sample(&b, "chorus_workerd_events_queued", "gauge",
           "Rank events held while the coordinator is away.", st.events_queued);
    sample(&b, "chorus_workerd_ranks_left_at_start", "gauge",
           "Ranks of a previous workerd found alive when this one started (adopt.h).",
           st.ranks_left_at_start);
    sample(&b, "chorus_node_gpus", "gauge", "GPUs visible to the ranks.", src->gpus);
    meminfo(src->meminfo ? src->meminfo : "/proc/meminfo", &total, &avail);
    if (total >= 0)
        sample(&b, "chorus_node_memory_total_bytes", "gauge", "Host memory (MemTotal).", total);
    if (avail >= 0)
        sample(&b, "chorus_node_memory_available_bytes", "gauge",
               "Host memory available without swapping (MemAvailable).", avail);
    if (b.err) {
        free(b.p);
        return b.err;
    }
    *out = b.p;
    *len = b.len;
    return 0;
}

// ----------------------------------------------------------------------------
// the server

typedef struct mconn {
    uv_tcp_t tcp;
    uv_timer_t timer; /* the connection's whole life */
    uv_write_t wr;
    struct mconn *prev, *next;
    wrk_metrics_t *m;
    int handles, closing, answered;
    char req[WRK_METRICS_HEAD_MAX];
    size_t len;
    char *resp;
} mconn_t;

struct wrk_metrics {
    uv_tcp_t tcp;
    wrk_metrics_src_t src;
    mconn_t *conns;
    size_t n_conns;
    int open, waiting, port;
};

static void accept_one(wrk_metrics_t *m);

static void m_closed(uv_handle_t *h)
{
    free(h->data);
}

static void conn_closed(uv_handle_t *h)
{
    mconn_t *x = h->data;
    if (--x->handles > 0)
        return;
    wrk_metrics_t *m = x->m;
    free(x->resp);
    free(x);
    m->n_conns--;
    if (m->waiting && m->open) {
        m->waiting = 0;
        accept_one(m);
    }
    if (!m->open && m->n_conns == 0)
        uv_close((uv_handle_t *)&m->tcp, m_closed);
}

static void conn_close(mconn_t *x)
{
    if (x->closing)
        return;
    x->closing = 1;
    if (x->prev)
        x->prev->next = x->next;
    else
        x->m->conns = x->next;
    if (x->next)
        x->next->prev = x->prev;
    uv_close((uv_handle_t *)&x->timer, conn_closed);
    uv_close((uv_handle_t *)&x->tcp, conn_closed);
}

static void on_timeout(uv_timer_t *t)
{
    conn_close(t->data);
}

static void on_written(uv_write_t *w, int status)
{
    (void)status; /* closed either way: one request per connection */
    conn_close(w->data);
}

static void answer(mconn_t *x, const char *status, const char *type, const char *body, size_t blen,
                   int head_only)
{
    tbuf_t b = {0};
    x->answered = 1;
    tb_printf(&b,
              "HTTP/1.0 %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
              "Connection: close\r\n\r\n",
              status, type, blen);
    if (!head_only && !b.err && blen) {
        if (b.cap - b.len < blen + 1) {
            char *p = realloc(b.p, b.len + blen + 1);
            if (!p)
                b.err = -ENOMEM;
            else
                b.p = p, b.cap = b.len + blen + 1;
        }
        if (!b.err) {
            memcpy(b.p + b.len, body, blen);
            b.len += blen;
        }
    }
    if (b.err) {
        free(b.p);
        conn_close(x);
        return;
    }
    x->resp = b.p;
    uv_buf_t buf = uv_buf_init(b.p, (unsigned)b.len);
    x->wr.data = x;
    if (uv_write(&x->wr, (uv_stream_t *)&x->tcp, &buf, 1, on_written) < 0)
        conn_close(x);
}

#define TEXT_PLAIN "text/plain; charset=utf-8"
#define PROM_TEXT  "text/plain; version=0.0.4; charset=utf-8"

static void route(mconn_t *x)
{
    char method[8] = "", target[256] = "";
    if (sscanf(x->req, "%7s %255s", method, target) != 2) {
        answer(x, "400 Bad Request", TEXT_PLAIN, "bad request\n", 12, 0);
        return;
    }
    int head = strcmp(method, "HEAD") == 0;
    if (!head && strcmp(method, "GET") != 0) {
        answer(x, "405 Method Not Allowed", TEXT_PLAIN, "GET or HEAD only\n", 17, 0);
        return;
    }
    if (strcmp(target, "/metrics") == 0) {
        char *text = NULL;
        size_t len = 0;
        if (wrk_metrics_render(&x->m->src, &text, &len) < 0) {
            answer(x, "500 Internal Server Error", TEXT_PLAIN, "render failed\n", 14, head);
            return;
        }
        answer(x, "200 OK", PROM_TEXT, text, len, head);
        free(text);
    } else if (strcmp(target, "/healthz") == 0) {
        answer(x, "200 OK", TEXT_PLAIN, "ok\n", 3, head);
    } else {
        const char *nf = "not found: try /metrics or /healthz\n";
        answer(x, "404 Not Found", TEXT_PLAIN, nf, strlen(nf), head);
    }
}

static void on_alloc(uv_handle_t *h, size_t hint, uv_buf_t *buf)
{
    mconn_t *x = h->data;
    (void)hint;
    *buf = uv_buf_init(x->req + x->len, (unsigned)(sizeof x->req - 1 - x->len));
}

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf)
{
    mconn_t *x = s->data;
    (void)buf;
    if (n < 0) {
        conn_close(x);
        return;
    }
    if (x->answered)
        return;
    x->len += (size_t)n;
    x->req[x->len] = 0;
    if (strstr(x->req, "\r\n\r\n") || strstr(x->req, "\n\n")) {
        uv_read_stop(s);
        route(x);
    } else if (x->len >= sizeof x->req - 1) {
        uv_read_stop(s);
        answer(x, "413 Request Entity Too Large", TEXT_PLAIN, "request head too large\n", 23, 0);
    }
}

static void accept_one(wrk_metrics_t *m)
{
    mconn_t *x = calloc(1, sizeof *x);
    if (!x)
        return;
    x->m = m;
    uv_tcp_init(m->tcp.loop, &x->tcp);
    uv_timer_init(m->tcp.loop, &x->timer);
    x->tcp.data = x->timer.data = x;
    x->handles = 2;
    m->n_conns++;
    x->next = m->conns;
    if (m->conns)
        m->conns->prev = x;
    m->conns = x;
    if (uv_accept((uv_stream_t *)&m->tcp, (uv_stream_t *)&x->tcp) < 0) {
        conn_close(x);
        return;
    }
    uv_timer_start(&x->timer, on_timeout, WRK_METRICS_IDLE_MS, 0);
    if (uv_read_start((uv_stream_t *)&x->tcp, on_alloc, on_read) < 0)
        conn_close(x);
}

static void on_connection(uv_stream_t *s, int status)
{
    wrk_metrics_t *m = s->data;
    if (status < 0 || !m->open)
        return;
    /* At the cap, not accepting leaves the connection with libuv, which stops polling
     * the listener until it is taken (conn_closed). */
    if (m->n_conns >= WRK_METRICS_MAX_CONNS) {
        m->waiting = 1;
        return;
    }
    accept_one(m);
}

int wrk_metrics_start(uv_loop_t *loop, const char *host, int port, const wrk_metrics_src_t *src,
                      wrk_metrics_t **out)
{
    struct sockaddr_storage ss;
    struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&ss;
    int rc;
    if (uv_ip4_addr(host, port, (struct sockaddr_in *)&ss) != 0 && uv_ip6_addr(host, port, s6) != 0)
        return -EINVAL;
    wrk_metrics_t *m = calloc(1, sizeof *m);
    if (!m)
        return -ENOMEM;
    m->src = *src;
    uv_tcp_init(loop, &m->tcp);
    m->tcp.data = m;
    rc = uv_tcp_bind(&m->tcp, (struct sockaddr *)&ss, 0);
    if (rc == 0)
        rc = uv_listen((uv_stream_t *)&m->tcp, 64, on_connection);
    if (rc < 0) {
        uv_close((uv_handle_t *)&m->tcp, m_closed);
        return ch_err_from_uv(rc);
    }
    struct sockaddr_storage bound;
    int blen = sizeof bound;
    if (uv_tcp_getsockname(&m->tcp, (struct sockaddr *)&bound, &blen) == 0)
        m->port = ntohs(bound.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&bound)->sin6_port
                                                    : ((struct sockaddr_in *)&bound)->sin_port);
    m->open = 1;
    *out = m;
    return 0;
}

int wrk_metrics_port(const wrk_metrics_t *m)
{
    return m->port;
}

void wrk_metrics_stop(wrk_metrics_t *m)
{
    if (!m || !m->open)
        return;
    m->open = 0;
    if (m->n_conns == 0) {
        uv_close((uv_handle_t *)&m->tcp, m_closed);
        return;
    }
    while (m->conns)
        conn_close(m->conns); /* the last one's close closes the listener */
}
