/* workerd's /metrics and /healthz; see metrics.h. */
#include "workerd/metrics.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/httpd.h"
#include "common/log.h"
#include "common/procmetrics.h"
#include "common/buf.h"
#include "common/util.h"

// ----------------------------------------------------------------------------
// rendering

/* A gauge or counter with its HELP and TYPE lines and one unlabelled sample. */
static void sample(ch_buf_t *b, const char *name, const char *type, const char *help, double v)
{
    ch_buf_printf(b, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", name, help, name, type, name, v);
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

int wrk_metrics_render(const wrk_metrics_src_t *src, char **out, size_t *len)
{
    ch_buf_t b = {0};
    wrk_agent_stats_t st;
    double total, avail;
    char proc[2048];

    *out = NULL;
    wrk_agent_stats(src->agent, &st);
    ch_buf_printf(&b,
                  "# HELP chorus_build_info The daemon's version (value 1).\n"
                  "# TYPE chorus_build_info gauge\nchorus_build_info{version=\"%s\"} 1\n",
                  CHORUS_VERSION);
    ch_buf_printf(&b, "# HELP chorus_workerd_info The node this workerd serves (value 1).\n"
                      "# TYPE chorus_workerd_info gauge\nchorus_workerd_info{node=\"");
    ch_buf_label(&b, src->node ? src->node : "");
    ch_buf_printf(&b, "\",device=\"");
    ch_buf_label(&b, src->device ? src->device : "");
    ch_buf_printf(&b, "\"} 1\n");
    if (ch_procmetrics_render(proc, sizeof proc) > 0)
        ch_buf_printf(&b, "%s", proc);
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
    ch_buf_printf(&b,
                  "# HELP chorus_workerd_rank_exits_total Rank processes reaped, by whether "
                  "they reported their work done.\n# TYPE chorus_workerd_rank_exits_total "
                  "counter\nchorus_workerd_rank_exits_total{outcome=\"done\"} %llu\n"
                  "chorus_workerd_rank_exits_total{outcome=\"other\"} %llu\n",
                  (unsigned long long)st.rank_exits_done, (unsigned long long)st.rank_exits_other);
    sample(&b, "chorus_workerd_events_queued", "gauge",
           "Rank events held while the coordinator is away.", st.events_queued);
    sample(&b, "chorus_workerd_ranks_left_at_start", "gauge",
           "Ranks of a previous workerd found alive, and re-adopted, when this one started.",
           st.ranks_left_at_start);
    sample(&b, "chorus_node_gpus", "gauge", "GPUs visible to the ranks.", src->gpus);
    meminfo(src->meminfo ? src->meminfo : "/proc/meminfo", &total, &avail);
    if (total >= 0)
        sample(&b, "chorus_node_memory_total_bytes", "gauge", "Host memory (MemTotal).", total);
    if (avail >= 0)
        sample(&b, "chorus_node_memory_available_bytes", "gauge",
               "Host memory available without swapping (MemAvailable).", avail);
    if (b.err) {
        int rc = b.err;
        ch_buf_fini(&b);
        return rc;
    }
    *out = b.p;
    *len = b.len;
    return 0;
}

// ----------------------------------------------------------------------------
// the server (common/httpd.h)

struct wrk_metrics {
    ch_httpd_t *srv;
    wrk_metrics_src_t src;
    int port;
};

static int route(void *ud, char *target, ch_http_reply_t *r)
{
    wrk_metrics_t *m = ud;
    if (strcmp(target, "/metrics") == 0) {
        char *text = NULL;
        size_t len = 0;
        int rc = wrk_metrics_render(&m->src, &text, &len);
        if (rc < 0)
            return rc;
        r->status = "200 OK";
        r->type = "text/plain; version=0.0.4; charset=utf-8";
        ch_buf_append(&r->body, text, len);
        free(text);
        return 0;
    }
    if (strcmp(target, "/healthz") == 0) {
        /* Answered from the loop the agent runs on: a wedged loop answers nothing. */
        r->status = "200 OK";
        r->type = "text/plain; charset=utf-8";
        ch_buf_puts(&r->body, "ok\n");
        return 0;
    }
    return CH_E_NOTFOUND;
}

int wrk_metrics_start(uv_loop_t *loop, const char *host, int port, const wrk_metrics_src_t *src,
                      wrk_metrics_t **out)
{
    struct sockaddr_storage ss;
    int rc;
    *out = NULL;
    if (uv_ip4_addr(host, port, (struct sockaddr_in *)&ss) != 0 &&
        uv_ip6_addr(host, port, (struct sockaddr_in6 *)&ss) != 0)
        return -EINVAL;
    wrk_metrics_t *m = calloc(1, sizeof *m);
    if (!m)
        return -ENOMEM;
    m->src = *src;
    ch_httpd_cfg_t hc = {
        .log_tag = "metrics",
        .max_conns = WRK_METRICS_MAX_CONNS,
        .idle_ms = WRK_METRICS_IDLE_MS,
        .headers = "Cache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\n",
        .not_found = "not found: try /metrics or /healthz\n",
        .route = route,
        .ud = m,
    };
    rc = ch_httpd_start(loop, (struct sockaddr *)&ss, &hc, &m->srv);
    if (rc < 0) {
        free(m);
        return rc;
    }
    struct sockaddr_storage bound;
    int blen = sizeof bound;
    if (uv_tcp_getsockname(ch_httpd_tcp(m->srv), (struct sockaddr *)&bound, &blen) == 0)
        m->port = ntohs(bound.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&bound)->sin6_port
                                                    : ((struct sockaddr_in *)&bound)->sin_port);
    *out = m;
    return 0;
}

int wrk_metrics_port(const wrk_metrics_t *m)
{
    return m->port;
}

void wrk_metrics_stop(wrk_metrics_t *m)
{
    if (!m)
        return;
    ch_httpd_stop(m->srv); /* no callback of the server runs after this: m can go */
    free(m);
}
