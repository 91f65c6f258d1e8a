/* Prometheus metrics; see metrics.h. */
#include "metrics.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/log.h"
#include "common/procmetrics.h"
#include "common/util.h"
#include "coord.h"
#include "http.h"
#include "recovery.h"
#include "series.h"
#include "statuspage.h"
#include "straggler.h"

// ---------------------------------------------------------------------------------------
// Rendering

/* The slowest rank's last step time, in seconds: what a step costs the job. */
static double step_seconds(const coord_job_t *j)
{
    double worst = NAN;
    for (uint32_t r = 0; j->ranks && r < j->world; r++) {
        double ms = coord_job_rank_metric(j, r, COORD_METRIC_STEP_MS);
        if (isfinite(ms) && !(worst >= ms / 1e3))
            worst = ms / 1e3;
    }
    return worst;
}

typedef enum {
    G_STEP,
    G_LOSS,
    G_VAL_LOSS,
    G_TPS,
    G_MFU,
    G_STEP_S,
    G_BUBBLE,
    G_RESTARTS,
    G_GEN,
    G_STRAGGLERS,
    G_SLOW_NODES
} gauge_kind_t;

typedef struct job_gauge {
    const char *name, *help;
    gauge_kind_t kind;
} job_gauge_t;

static const job_gauge_t JOB_GAUGES[] = {
    {"chorus_job_step", "Last training step reported by the job.", G_STEP},
    {"chorus_job_loss", "Loss at the last reported step (rank 0).", G_LOSS},
    {"chorus_job_val_loss", "Validation loss last reported (train.val_data, rank 0).", G_VAL_LOSS},
    {"chorus_job_tokens_per_second", "Training throughput (rank 0).", G_TPS},
    {"chorus_job_mfu_ratio", "Model FLOPs utilisation, 0..1 (rank 0).", G_MFU},
    {"chorus_job_step_seconds", "Time of the last step on the slowest rank.", G_STEP_S},
    {"chorus_job_pipeline_bubble_ratio",
     "Idle fraction of the pipeline, 0..1 (rank 0, when reported).", G_BUBBLE},
    {"chorus_job_restarts", "Restarts of the job so far.", G_RESTARTS},
    {"chorus_job_generation", "Current generation of the job's ranks.", G_GEN},
    {"chorus_job_stragglers",
     "Ranks whose compute time is persistently above their stage's peers' (straggler.h).",
     G_STRAGGLERS},
    {"chorus_job_slow_collective_nodes",
     "Nodes whose tensor-parallel all-reduces are persistently slower than the other nodes' "
     "(straggler.c).",
     G_SLOW_NODES},
};

static double gauge_value(const coord_job_t *j, gauge_kind_t kind)
{
    switch (kind) {
    case G_STEP:
        return (double)j->step;
    case G_LOSS:
        return j->loss;
    case G_VAL_LOSS:
        return coord_job_rank_metric(j, 0, COORD_METRIC_VAL_LOSS);
    case G_TPS:
        return j->tokens_per_s;
    case G_MFU:
        return j->mfu;
    case G_STEP_S:
        return step_seconds(j);
    case G_BUBBLE:
        return coord_job_rank_metric(j, 0, COORD_METRIC_BUBBLE);
    case G_RESTARTS:
        return (double)j->restarts;
    case G_GEN:
        return (double)j->generation;
    case G_STRAGGLERS: {
        uint32_t n = 0;
        coord_straggler_line(j, &n);
        return (double)n;
    }
    case G_SLOW_NODES: {
        uint32_t n = 0;
        coord_straggler_node_line(j, &n);
        return (double)n;
    }
    }
    return NAN;
}

int coord_metrics_render(coord_t *c, char **out, size_t *len)
{
    ch_buf_t b = {0};
    size_t nodes[COORD_NODE_NSTATES], jobs[COORD_JOB_NSTATES];

    *out = NULL;
    coord_nodes_count(c, nodes);
    coord_jobs_count(c, jobs);
    ch_buf_printf(&b,
                  "# HELP chorus_build_info The coordinator's version (value 1).\n"
                  "# TYPE chorus_build_info gauge\nchorus_build_info{version=\"%s\"} 1\n",
                  CHORUS_VERSION);
    char proc[2048];
    if (ch_procmetrics_render(proc, sizeof proc) > 0)
        ch_buf_puts(&b, proc);
    ch_buf_puts(&b, "# HELP chorus_nodes Nodes by state.\n# TYPE chorus_nodes gauge\n");
    for (int s = 0; s < COORD_NODE_NSTATES; s++)
        ch_buf_printf(&b, "chorus_nodes{state=\"%s\"} %zu\n", coord_node_state_name(s), nodes[s]);
    ch_buf_puts(&b, "# HELP chorus_jobs Jobs by state.\n# TYPE chorus_jobs gauge\n");
    for (int s = 0; s < COORD_JOB_NSTATES; s++)
        ch_buf_printf(&b, "chorus_jobs{state=\"%s\"} %zu\n", coord_job_state_name(s), jobs[s]);
    ch_buf_printf(&b,
                  "# HELP chorus_heartbeats_total Heartbeats received from workers.\n"
                  "# TYPE chorus_heartbeats_total counter\nchorus_heartbeats_total %llu\n",
                  (unsigned long long)c->heartbeats_total);
    ch_buf_printf(&b,
                  "# HELP chorus_recoveries_total Job recoveries started.\n"
                  "# TYPE chorus_recoveries_total counter\nchorus_recoveries_total %llu\n",
                  (unsigned long long)c->recoveries_total);
    ch_buf_puts(&b, "# HELP chorus_restarts_total Job restarts by the cause of the failure.\n"
                    "# TYPE chorus_restarts_total counter\n");
    for (int k = 0; k < COORD_CAUSE_NCAUSES; k++)
        ch_buf_printf(&b, "chorus_restarts_total{cause=\"%s\"} %llu\n", coord_cause_name(k),
                      (unsigned long long)c->restarts_by_cause[k]);
    ch_buf_printf(&b,
                  "# HELP chorus_time_to_recover_seconds The last restart: failure to the first "
                  "completed step after it.\n# TYPE chorus_time_to_recover_seconds gauge\n"
                  "chorus_time_to_recover_seconds %.3f\n",
                  c->recover_s_last);
    ch_buf_printf(&b,
                  "# HELP chorus_kv_keys Rendezvous keys held.\n# TYPE chorus_kv_keys gauge\n"
                  "chorus_kv_keys %zu\n",
                  coord_kv_keys(c->kv));
    ch_buf_printf(&b,
                  "# HELP chorus_http_limited_total Times the HTTP address hit its connection "
                  "limit.\n# TYPE chorus_http_limited_total counter\n"
                  "chorus_http_limited_total %llu\n",
                  (unsigned long long)ch_httpd_limited(c->http.srv));
    for (size_t g = 0; g < sizeof(JOB_GAUGES) / sizeof(JOB_GAUGES[0]); g++) {
        ch_buf_printf(&b, "# HELP %s %s\n# TYPE %s gauge\n", JOB_GAUGES[g].name, JOB_GAUGES[g].help,
                      JOB_GAUGES[g].name);
        for (size_t i = 0; i < c->jobs.n; i++) {
            const coord_job_t *j = c->jobs.v[i];
            if (!j->started_ms)
                continue; /* never ran: nothing to show */
            double v = gauge_value(j, JOB_GAUGES[g].kind);
            if (!isfinite(v))
                continue; /* not reported: no sample rather than a made-up one */
            /* job_id, not job: Prometheus keeps `job` for the scrape job's name. */
            ch_buf_printf(&b, "%s{job_id=\"", JOB_GAUGES[g].name);
            ch_buf_label(&b, j->id);
            ch_buf_puts(&b, "\",name=\"");
            ch_buf_label(&b, j->name);
            ch_buf_printf(&b, "\"} %.17g\n", v);
        }
    }
    if (b.err) {
        int rc = b.err;
        ch_buf_fini(&b);
        return rc;
    }
    *out = b.p;
    *len = b.len;
    return 0;
}
