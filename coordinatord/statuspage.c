/* The status page: HTML and inline SVG drawn here; see statuspage.h. */
#include "statuspage.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/err.h"
#include "common/layout.h"
#include "common/util.h"
#include "coord.h"
#include "progress.h"
#include "recovery.h"
#include "series.h"
#include "straggler.h"

size_t coord_job_restart_history(const coord_job_t *j, coord_restart_view_t *out, size_t max)
{
    /* job.c's record (recovery.c fills it): the failures that caused restarts and, last,
     * the one that ended the job, if any; the newest max of them. */
    size_t n = j->n_history, first = n > max ? n - max : 0;
    for (size_t i = first; i < n; i++) {
        const coord_restart_t *r = &j->history[i];
        out[i - first] = (coord_restart_view_t){
            .generation = r->failed_gen + 1,
            .at_ms = r->time_ms,
            .from_step = r->resumed_from,
            .cause = r->reason[0] ? r->reason : coord_cause_name(r->cause),
        };
    }
    return n - first;
}

// ---------------------------------------------------------------------------------------
// pieces

static const char STYLE[] =
    "body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222;background:#fafafa}"
    "h1{font-size:1.4em;margin:0 0 .2em}h2{font-size:1.1em;margin:1.4em 0 .4em}"
    "table{border-collapse:collapse;background:#fff}"
    "th,td{border:1px solid #ddd;padding:3px 8px;text-align:left;vertical-align:top}"
    "th{background:#f0f0f0}.num{text-align:right;font-variant-numeric:tabular-nums}"
    ".alive,.running,.completed,.done,.exited{color:#17803d}.suspect,.starting,.queued,"
    ".recovering,.new,.pending,.unknown,.failing{color:#a86b00}"
    ".dead,.failed,.cancelled,.lost{color:#c0262d}"
    ".bar{width:320px;height:14px;background:#e4e4e4;display:inline-block;vertical-align:middle}"
    ".bar>span{display:block;height:100%;background:#3b82f6}"
    ".grid{display:inline-block;margin:0 1em 1em 0}.grid td.rank{text-align:center;min-width:4em}"
    ".muted{color:#777}svg{background:#fff;border:1px solid #ddd}"
    "svg text{font:11px system-ui,sans-serif;fill:#555}";

static void head(ch_buf_t *b, const char *title, int refresh)
{
    ch_buf_puts(b, "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">");
    if (refresh)
        ch_buf_puts(b, "<meta http-equiv=\"refresh\" content=\"5\">");
    ch_buf_puts(b, "<title>");
    ch_buf_html(b, title);
    ch_buf_printf(b, " - Chorus</title><style>%s</style></head><body>\n", STYLE);
}

static void fmt_wall(char *buf, size_t n, uint64_t ms)
{
    struct tm tm;
    time_t t = (time_t)(ms / 1000);
    if (!ms || !gmtime_r(&t, &tm) || !strftime(buf, n, "%Y-%m-%d %H:%M:%S UTC", &tm))
        snprintf(buf, n, "-");
}

static void fmt_si(char *buf, size_t n, double v)
{
    static const char suffix[] = " kMGTP";
    int i = 0;
    if (!isfinite(v) || v <= 0) {
        snprintf(buf, n, "-");
        return;
    }
    while (v >= 1000.0 && i < 5)
        v /= 1000.0, i++;
    snprintf(buf, n, i ? "%.3g%c" : "%.3g", v, suffix[i]);
}

static int has_loss(const coord_job_t *j)
{
    return j->spec.kind == CH_JOB_TRAIN && j->step > 0 && isfinite(j->loss);
}

static double progress(const coord_job_t *j)
{
    if (j->state == COORD_JOB_COMPLETED)
        return 1.0;
    return j->total_steps ? fmin(1.0, (double)j->step / (double)j->total_steps) : 0.0;
}

static void bar(ch_buf_t *b, double frac)
{
    ch_buf_printf(b, "<span class=\"bar\"><span style=\"width:%.1f%%\"></span></span> %.0f%%",
                  100.0 * frac, 100.0 * frac);
}

// ---------------------------------------------------------------------------------------
// index

static void nodes_table(coord_t *c, ch_buf_t *b)
{
    uint64_t now = ch_now_ms();
    ch_buf_printf(b,
                  "<h2>Nodes (%zu)</h2>\n<table id=\"nodes\"><tr><th>node<th>state"
                  "<th>slots used/total<th>rack<th>device<th>last heartbeat</tr>\n",
                  c->nodes.n);
    for (size_t i = 0; i < c->nodes.n && i < COORD_PAGE_MAX_NODES; i++) {
        const coord_node_t *n = c->nodes.v[i];
        const char *st = coord_node_state_name(n->state);
        ch_buf_puts(b, "<tr class=\"node\"><td>");
        ch_buf_html(b, n->name);
        ch_buf_printf(b, "<td class=\"%s\">%s<td class=\"num\">%u/%u<td>", st, st, n->used,
                      n->slots);
        ch_buf_html(b, n->rack[0] ? n->rack : "-");
        ch_buf_puts(b, "<td>");
        ch_buf_html(b, ch_device_name(n->device));
        if (n->last_hb_ms && n->last_hb_ms <= now) {
            ch_buf_printf(b, "<td class=\"num\">%.1f s ago</tr>\n",
                          (double)(now - n->last_hb_ms) / 1e3);
        } else {
            char when[48];
            fmt_wall(when, sizeof when, n->last_hb_wall);
            ch_buf_printf(b, "<td>%s</tr>\n", when);
        }
    }
    ch_buf_puts(b, "</table>\n");
    if (c->nodes.n > COORD_PAGE_MAX_NODES)
        ch_buf_printf(b, "<p class=\"muted\">first %d of %zu nodes</p>\n", COORD_PAGE_MAX_NODES,
                      c->nodes.n);
}

static void jobs_table(coord_t *c, ch_buf_t *b)
{
    size_t first = c->jobs.n > COORD_PAGE_MAX_JOBS ? c->jobs.n - COORD_PAGE_MAX_JOBS : 0;
    ch_buf_printf(b,
                  "<h2>Jobs (%zu)</h2>\n<table id=\"jobs\"><tr><th>job<th>name<th>kind"
                  "<th>state<th>progress<th>step<th>loss<th>tokens/s<th>TP&times;PP&times;DP"
                  "<th>restarts<th>reason</tr>\n",
                  c->jobs.n);
    for (size_t i = c->jobs.n; i-- > first;) { /* newest first */
        const coord_job_t *j = c->jobs.v[i];
        const char *st = coord_job_state_name(j->state);
        char tps[32];
        fmt_si(tps, sizeof tps, j->tokens_per_s);
        ch_buf_printf(b, "<tr class=\"job\"><td><a href=\"/jobs/%s\">%s</a><td>", j->id, j->id);
        ch_buf_html(b, j->name[0] ? j->name : "-");
        ch_buf_printf(b, "<td>%s<td class=\"%s\">%s<td>", ch_job_kind_name(j->spec.kind), st, st);
        bar(b, progress(j));
        ch_buf_printf(b, "<td class=\"num\">%" PRIu64 "/%" PRIu64, j->step, j->total_steps);
        if (has_loss(j))
            ch_buf_printf(b, "<td class=\"num\">%.4f", j->loss);
        else
            ch_buf_puts(b, "<td class=\"num\">-");
        ch_buf_printf(b, "<td class=\"num\">%s<td>%u&times;%u&times;%u<td class=\"num\">%u<td>",
                      tps, j->spec.parallel.tp, j->spec.parallel.pp, j->spec.parallel.dp,
                      j->restarts);
        ch_buf_html(b, j->reason);
        ch_buf_puts(b, "</tr>\n");
    }
    ch_buf_puts(b, "</table>\n");
    if (first)
        ch_buf_printf(b, "<p class=\"muted\">the latest %d of %zu jobs</p>\n", COORD_PAGE_MAX_JOBS,
                      c->jobs.n);
}

int coord_page_index(coord_t *c, ch_buf_t *b)
{
    char now[48];
    fmt_wall(now, sizeof now, ch_wall_ms());
    head(b, "cluster", 1);
    ch_buf_printf(b,
                  "<h1>Chorus</h1><p class=\"muted\">%s &middot; "
                  "<a href=\"/metrics\">Prometheus metrics</a> &middot; refreshes every 5 s</p>\n",
                  now);
    nodes_table(c, b);
    jobs_table(c, b);
    ch_buf_puts(b, "</body></html>\n");
    return 0;
}

// ---------------------------------------------------------------------------------------
// job: curves

#define CH_W 640
#define CH_H 200
#define CH_L 64 /* left margin: value labels */
#define CH_B 24 /* bottom margin: step labels */
#define CH_T 10
#define CH_R 12

enum { F_LOSS, F_TPS };

static double field(const coord_point_t *p, int f)
{
    return f == F_LOSS ? (double)p->loss : (double)p->tokens_per_s;
}

/* A line chart of field f over steps: one path vertex per point with a finite value. */
static void chart(ch_buf_t *b, const coord_job_t *j, const char *id, const char *title,
                  const coord_point_t *pts, size_t n, int f)
{
    double vmin = INFINITY, vmax = -INFINITY;
    uint64_t smin = UINT64_MAX, smax = 0;
    size_t good = 0;
    for (size_t i = 0; i < n; i++) {
        double v = field(&pts[i], f);
        if (!isfinite(v))
            continue;
        good++;
        vmin = fmin(vmin, v), vmax = fmax(vmax, v);
        smin = pts[i].step < smin ? pts[i].step : smin;
        smax = pts[i].step > smax ? pts[i].step : smax;
    }
    ch_buf_printf(b, "<h2>");
    ch_buf_html(b, title);
    ch_buf_printf(b,
                  "</h2>\n<svg id=\"%s-chart\" class=\"chart\" width=\"%d\" height=\"%d\" "
                  "viewBox=\"0 0 %d %d\" role=\"img\" xmlns=\"http://www.w3.org/2000/svg\">",
                  id, CH_W, CH_H, CH_W, CH_H);
    ch_buf_printf(b, "<title>%s over steps</title>", title);
    if (!good) {
        ch_buf_printf(b, "<text x=\"%d\" y=\"%d\">no steps reported yet</text></svg>\n",
                      CH_W / 2 - 60, CH_H / 2);
        return;
    }
    if (vmax - vmin < 1e-12 * fmax(1.0, fabs(vmax)))
        vmin -= 0.5, vmax += 0.5; /* a flat line in the middle */
    double pw = CH_W - CH_L - CH_R, ph = CH_H - CH_T - CH_B;
    double sspan = smax > smin ? (double)(smax - smin) : 1.0;
    /* Axes and labels. */
    ch_buf_printf(b,
                  "<path d=\"M%d %d V%d H%d\" fill=\"none\" stroke=\"#999\"/>"
                  "<text x=\"%d\" y=\"%d\" text-anchor=\"end\">%.4g</text>"
                  "<text x=\"%d\" y=\"%d\" text-anchor=\"end\">%.4g</text>"
                  "<text x=\"%d\" y=\"%d\">step %" PRIu64 "</text>"
                  "<text x=\"%d\" y=\"%d\" text-anchor=\"end\">step %" PRIu64 "</text>",
                  CH_L, CH_T, CH_H - CH_B, CH_W - CH_R, CH_L - 4, CH_T + 8, vmax, CH_L - 4,
                  CH_H - CH_B, vmin, CH_L, CH_H - 6, smin, CH_W - CH_R, CH_H - 6, smax);
    ch_buf_printf(b,
                  "<path id=\"%s-path\" class=\"line\" data-points=\"%zu\" fill=\"none\" "
                  "stroke=\"%s\" stroke-width=\"1.5\" d=\"",
                  id, good, f == F_LOSS ? "#c0262d" : "#3b82f6");
    int pen = 0;
    for (size_t i = 0; i < n; i++) {
        double v = field(&pts[i], f);
        if (!isfinite(v)) {
            pen = 0; /* a gap: the next point starts a new run */
            continue;
        }
        double x = CH_L + pw * (double)(pts[i].step - smin) / sspan;
        double y = CH_T + ph * (vmax - v) / (vmax - vmin);
        ch_buf_printf(b, "%s%.1f %.1f", pen ? " L" : (i ? " M" : "M"), x, y);
        pen = 1;
    }
    ch_buf_puts(b, "\"/>");
    /* A dashed line where each restart resumed: the curve after it is the new run's. */
    coord_restart_view_t hist[16];
    size_t nh = coord_job_restart_history(j, hist, 16);
    for (size_t k = 0; k < nh; k++) {
        if (hist[k].from_step < 0 || (uint64_t)hist[k].from_step < smin ||
            (uint64_t)hist[k].from_step > smax)
            continue;
        double x = CH_L + pw * (double)((uint64_t)hist[k].from_step - smin) / sspan;
        ch_buf_printf(b,
                      "<path class=\"restart\" d=\"M%.1f %d V%d\" stroke=\"#a86b00\" "
                      "stroke-dasharray=\"4 3\"><title>generation %" PRIu64
                      " resumed from step %" PRId64 "</title></path>",
                      x, CH_T, CH_H - CH_B, hist[k].generation, hist[k].from_step);
    }
    ch_buf_puts(b, "</svg>\n");
}

// ---------------------------------------------------------------------------------------
// job: layout grid and heat map

/* One table per data-parallel replica: pipeline stages down, tensor-parallel ranks
 * across; each cell names the rank and its node. */
static void layout_grid(const coord_job_t *j, ch_buf_t *b)
{
    ch_layout_t l = {j->spec.parallel.tp, j->spec.parallel.pp, j->spec.parallel.dp};
    uint32_t world = ch_layout_world(l);
    ch_buf_printf(b,
                  "<h2>Layout: TP %u &times; PP %u &times; DP %u (world %u)</h2>\n"
                  "<div id=\"layout\" data-world=\"%u\">",
                  l.tp, l.pp, l.dp, world, world);
    if (world > COORD_PAGE_MAX_CELLS || world != j->world) {
        ch_buf_printf(b, "<p class=\"muted\">%u ranks: too many to draw</p></div>\n", world);
        return;
    }
    for (uint32_t d = 0; d < l.dp; d++) {
        ch_buf_printf(b, "<table class=\"grid\" data-dp=\"%u\"><tr><th>DP %u", d, d);
        for (uint32_t t = 0; t < l.tp; t++)
            ch_buf_printf(b, "<th>TP %u", t);
        ch_buf_puts(b, "</tr>");
        for (uint32_t p = 0; p < l.pp; p++) {
            ch_buf_printf(b, "<tr><th>PP %u", p);
            for (uint32_t t = 0; t < l.tp; t++) {
                ch_coord_t at = {.tp = t, .dp = d, .pp = p};
                uint32_t r = ch_layout_rank(l, at);
                const coord_rank_t *rk = j->ranks ? &j->ranks[r] : NULL;
                const char *st = rk ? coord_rank_state_name(rk->state) : "unplaced";
                ch_buf_printf(b, "<td class=\"rank %s\" data-rank=\"%u\">rank %u<br>", st, r, r);
                ch_buf_html(b, rk && rk->node ? rk->node->name : "-");
                ch_buf_printf(b, "<br><small>%s</small>", st);
            }
            ch_buf_puts(b, "</tr>");
        }
        ch_buf_puts(b, "</table>");
    }
    ch_buf_puts(b, "</div>\n");
}

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

/* Columns: the last steps; rows: ranks; colour: the rank's step time against the
 * step's median (green at or under it, red at 1.5 times or more): a straggler is a red
 * row, a slow step a column. */
static void heat_map(const coord_series_t *s, ch_buf_t *b)
{
    uint64_t steps[COORD_SERIES_HEAT_STEPS];
    float median[COORD_SERIES_HEAT_STEPS], col[COORD_PAGE_HEAT_RANKS];
    size_t cols = s ? coord_series_heat_rows(s, steps, COORD_SERIES_HEAT_STEPS) : 0;
    ch_buf_puts(b, "<h2>Per-rank step time, last steps</h2>\n");
    if (!cols || !s->heat_ranks) {
        ch_buf_puts(b, "<p id=\"heatmap\" class=\"muted\">no per-rank step times reported "
                       "yet</p>\n");
        return;
    }
    uint32_t ranks = s->heat_ranks < COORD_PAGE_HEAT_RANKS ? s->heat_ranks : COORD_PAGE_HEAT_RANKS;
    int cw = 16, rh = ranks <= 32 ? 14 : ranks <= 128 ? 4 : 2, left = 64, top = 6;
    int w = left + cw * (int)cols + 10, h = top + rh * (int)ranks + 20;
    for (size_t i = 0; i < cols; i++) {
        size_t n = 0;
        for (uint32_t r = 0; r < ranks; r++) {
            float ms = coord_series_heat_at(s, steps[i], r);
            if (isfinite(ms))
                col[n++] = ms;
        }
        qsort(col, n, sizeof col[0], cmp_float);
        median[i] = n ? col[(n - 1) / 2] : NAN; /* the lower median: of two, the faster */
    }
    ch_buf_printf(b,
                  "<svg id=\"heatmap\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
                  "data-steps=\"%zu\" data-ranks=\"%u\" xmlns=\"http://www.w3.org/2000/svg\">"
                  "<title>step time per rank</title>"
                  "<text x=\"%d\" y=\"%d\" text-anchor=\"end\">rank 0</text>"
                  "<text x=\"%d\" y=\"%d\" text-anchor=\"end\">rank %u</text>"
                  "<text x=\"%d\" y=\"%d\">step %" PRIu64 "</text>"
                  "<text x=\"%d\" y=\"%d\" text-anchor=\"end\">step %" PRIu64 "</text>",
                  w, h, w, h, cols, ranks, left - 4, top + 10, left - 4, top + rh * (int)ranks,
                  ranks - 1, left, h - 6, steps[0], left + cw * (int)cols, h - 6, steps[cols - 1]);
    for (uint32_t r = 0; r < ranks; r++) {
        for (size_t i = 0; i < cols; i++) {
            float ms = coord_series_heat_at(s, steps[i], r);
            char fill[32] = "#ddd";
            if (isfinite(ms) && median[i] > 0) {
                double hue = 120.0 - fmin(120.0, fmax(0.0, (ms / median[i] - 1.0) * 240.0));
                snprintf(fill, sizeof fill, "hsl(%.0f,70%%,45%%)", hue);
            }
            ch_buf_printf(b,
                          "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"%s\">"
                          "<title>rank %u step %" PRIu64 ": ",
                          left + cw * (int)i, top + rh * (int)r, cw - 1, rh - (rh > 2), fill, r,
                          steps[i]);
            if (isfinite(ms))
                ch_buf_printf(b, "%.1f ms</title></rect>", ms);
            else
                ch_buf_puts(b, "not reported</title></rect>");
        }
    }
    ch_buf_puts(b, "</svg>\n<p class=\"muted\">colour: a rank's step time against the "
                   "step's median, green at or under it, red at 1.5&times; or more");
    if (s->world > ranks)
        ch_buf_printf(b, "; the first %u of %u ranks", ranks, s->world);
    ch_buf_puts(b, "</p>\n");
}

/* Under the heat map: the straggler and the slow-collective node named now, if any
 * (straggler.h), so that a red row or a node's rows come with the numbers. */
static void heat_named(const coord_job_t *j, ch_buf_t *b)
{
    uint32_t ranks = 0, nodes = 0;
    const char *rank_line = coord_straggler_line(j, &ranks);
    const char *node_line = coord_straggler_node_line(j, &nodes);
    if (!ranks && !nodes)
        return;
    ch_buf_puts(b, "<p id=\"slow\">");
    if (ranks) {
        ch_buf_puts(b, "straggler: ");
        ch_buf_html(b, rank_line);
    }
    if (nodes) {
        ch_buf_puts(b, ranks ? "<br>slow collectives: " : "slow collectives: ");
        ch_buf_html(b, node_line);
    }
    ch_buf_puts(b, "</p>\n");
}

static void restarts(const coord_job_t *j, ch_buf_t *b)
{
    coord_restart_view_t hist[64];
    size_t n = coord_job_restart_history(j, hist, 64);
    ch_buf_printf(b, "<h2>Restarts (%u)</h2>\n", j->restarts);
    if (!n) {
        ch_buf_printf(b, "<p id=\"restarts\" class=\"muted\">%s</p>\n",
                      j->restarts ? "no history recorded" : "no restarts");
        return;
    }
    ch_buf_puts(b, "<table id=\"restarts\"><tr><th>generation<th>when<th>resumed from"
                   "<th>cause</tr>\n");
    for (size_t i = 0; i < n; i++) {
        char when[48];
        fmt_wall(when, sizeof when, hist[i].at_ms);
        ch_buf_printf(b, "<tr><td class=\"num\">%" PRIu64 "<td>%s<td>", hist[i].generation, when);
        if (hist[i].from_step >= 0)
            ch_buf_printf(b, "step %" PRId64, hist[i].from_step);
        else
            ch_buf_puts(b, "scratch");
        ch_buf_puts(b, "<td>");
        ch_buf_html(b, hist[i].cause ? hist[i].cause : "");
        ch_buf_puts(b, "</tr>\n");
    }
    ch_buf_puts(b, "</table>\n");
}

// ---------------------------------------------------------------------------------------
// job

static void summary(const coord_job_t *j, const coord_point_t *last, ch_buf_t *b)
{
    const char *st = coord_job_state_name(j->state);
    char tps[32], sub[48], start[48], fin[48];
    /* After a coordinator restart the job's figures are zero; the series kept them. */
    double tokens = j->tokens_per_s > 0 || !last ? j->tokens_per_s : last->tokens_per_s;
    double mfu = j->mfu > 0 || !last ? j->mfu : last->mfu;
    fmt_si(tps, sizeof tps, tokens);
    fmt_wall(sub, sizeof sub, j->submitted_ms);
    fmt_wall(start, sizeof start, j->started_ms);
    fmt_wall(fin, sizeof fin, j->finished_ms);
    ch_buf_printf(b, "<table id=\"summary\"><tr><th>state<td class=\"%s\">%s", st, st);
    if (j->reason[0]) {
        ch_buf_puts(b, ": ");
        ch_buf_html(b, j->reason);
    }
    ch_buf_puts(b, "</tr><tr><th>progress<td>");
    bar(b, progress(j));
    ch_buf_printf(b, " &nbsp; step %" PRIu64 " of %" PRIu64 "</tr>", j->step, j->total_steps);
    if (has_loss(j))
        ch_buf_printf(b, "<tr><th>loss<td>%.4f</tr>", j->loss);
    double val = coord_job_rank_metric(j, 0, COORD_METRIC_VAL_LOSS);
    double val_step = coord_job_rank_metric(j, 0, COORD_METRIC_VAL_STEP);
    if (isfinite(val) && isfinite(val_step)) /* train.val_data's, when one was taken */
        ch_buf_printf(b, "<tr><th>validation loss<td>%.4f (after step %.0f)</tr>", val, val_step);
    ch_buf_printf(b, "<tr><th>tokens/s<td>%s</tr>", tps);
    if (mfu > 0 && isfinite(mfu))
        ch_buf_printf(b, "<tr><th>MFU<td>%.2f%%</tr>", 100.0 * mfu);
    if (last && isfinite(last->step_ms))
        ch_buf_printf(b, "<tr><th>step time (rank 0)<td>%.1f ms</tr>", last->step_ms);
    double measured = coord_job_bubble(j); /* mean over ranks; rank 0's when reloaded */
    if (measured < 0 && last && isfinite(last->bubble))
        measured = last->bubble;
    if (j->spec.parallel.pp > 1 && measured >= 0)
        ch_buf_printf(b,
                      "<tr><th>pipeline bubble<td>%.1f%% measured, %.1f%% 1F1B "
                      "(pp&minus;1)/(microbatches+pp&minus;1)</tr>",
                      100.0 * measured, 100.0 * coord_job_bubble_theory(j));
    ch_buf_printf(b, "<tr><th>generation<td>%" PRIu64 " (restarts %u)</tr>", j->generation,
                  j->restarts);
    if (j->last_ckpt_step >= 0)
        ch_buf_printf(b, "<tr><th>last checkpoint<td>step %" PRId64 "</tr>", j->last_ckpt_step);
    ch_buf_printf(b,
                  "<tr><th>submitted<td>%s</tr><tr><th>started<td>%s</tr>"
                  "<tr><th>finished<td>%s</tr></table>\n",
                  sub, start, fin);
}

int coord_page_job(coord_t *c, const char *id, ch_buf_t *b)
{
    coord_job_t *j = coord_job_find(c, id);
    if (!j)
        return CH_E_NOTFOUND;
    coord_progress_want_detail(c, j); /* the ranks' breakdown, fresh for the next view */
    const coord_series_t *s = coord_series_get(c, j);
    enum { MAXP = COORD_SERIES_RECENT + COORD_SERIES_HISTORY };
    coord_point_t *pts = malloc(sizeof *pts * MAXP);
    if (!pts)
        return -ENOMEM;
    size_t n = s ? coord_series_points(s, pts, MAXP) : 0;

    char title[96];
    snprintf(title, sizeof title, "%s %s", j->id, j->name);
    head(b, title, coord_job_is_active(j) || j->state == COORD_JOB_QUEUED);
    ch_buf_printf(b, "<p><a href=\"/\">&larr; cluster</a></p><h1>Job %s: ", j->id);
    ch_buf_html(b, j->name[0] ? j->name : "-");
    ch_buf_printf(b, " <small class=\"muted\">(%s)</small></h1>\n", ch_job_kind_name(j->spec.kind));
    summary(j, n ? &pts[n - 1] : NULL, b);
    if (j->spec.kind == CH_JOB_TRAIN) {
        chart(b, j, "loss", "Loss", pts, n, F_LOSS);
        chart(b, j, "tps", "Tokens/s", pts, n, F_TPS);
    }
    layout_grid(j, b);
    heat_map(s, b);
    heat_named(j, b);
    restarts(j, b);
    ch_buf_puts(b, "</body></html>\n");
    free(pts);
    return 0;
}
