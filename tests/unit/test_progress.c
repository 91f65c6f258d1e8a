/* workerd/progress.c: a node's ranks' progress as one NodeProgress per interval (issue 26). */
#include <criterion/criterion.h>
#include <string.h>

#include "common/err.h"
#include "common/msg.h"
#include "workerd/progress.h"

/* The sender: keeps a packed-and-unpacked copy of each NodeProgress (what the coordinator
 * would decode), or refuses when told to. */
typedef struct sink {
    Chorus__Envelope *got[8];
    int n, refuse;
} sink_t;

static int sink_send(void *ud, Chorus__Envelope *env)
{
    sink_t *s = ud;
    if (s->refuse)
        return -ENOTCONN;
    cr_assert(s->n < 8);
    size_t len = chorus__envelope__get_packed_size(env);
    uint8_t *buf = malloc(len);
    chorus__envelope__pack(env, buf);
    s->got[s->n++] = chorus__envelope__unpack(NULL, len, buf);
    free(buf);
    return 0;
}

static void sink_free(sink_t *s)
{
    for (int i = 0; i < s->n; i++)
        chorus__envelope__free_unpacked(s->got[i], NULL);
    s->n = 0;
}

/* Rank r's report of step s: step_ms 100 and TP time 0.01 s for every rank but 3 (a slow
 * one). */
static void report(wrk_progress_t *p, uint32_t r, uint64_t s)
{
    Chorus__RankEvent ev = CHORUS__RANK_EVENT__INIT;
    Chorus__Metric m[2] = {CHORUS__METRIC__INIT, CHORUS__METRIC__INIT}, *mp[2] = {&m[0], &m[1]};
    m[0].name = "step_ms";
    m[0].value = r == 3 ? 180 : 100;
    m[1].name = "mem_peak_bytes";
    m[1].value = 1e9 + r;
    ev.job_id = "j1";
    ev.generation = 2;
    ev.launch_token = 77;
    ev.rank = r;
    ev.kind = CHORUS__RANK_EVENT_KIND__RANK_PROGRESS;
    ev.step = s;
    ev.total_steps = 50;
    ev.step_s = 0.1;
    ev.t_compute = 0.05;
    ev.t_tp = r == 3 ? 0.03 : 0.01;
    ev.metrics = mp;
    ev.n_metrics = 2;
    cr_assert_eq(wrk_progress_add(p, &ev), 0);
}

Test(progress, one_message_per_interval_grouping_equal_ranks)
{
    sink_t s = {0};
    wrk_progress_t *p = NULL;
    wrk_progress_cfg_t cfg = {.interval_ms = 1000, .detail_every = 0, .send = sink_send, .ud = &s};
    cr_assert_eq(wrk_progress_create(&cfg, &p), 0);
    wrk_progress_tick(p, 5000); /* nothing held: nothing sent */
    cr_assert_eq(s.n, 0);
    for (uint32_t r = 1; r <= 4; r++) /* a rank's first report goes in full */
        report(p, r, 1);
    wrk_progress_tick(p, 6000);
    cr_assert_eq(s.n, 1);
    cr_assert_eq(s.got[0]->node_progress->n_detail, 4);
    cr_assert_eq(s.got[0]->node_progress->n_ranks + s.got[0]->node_progress->n_differ, 0);
    sink_free(&s);
    for (uint64_t step = 2; step <= 4; step++) /* three steps in one interval */
        for (uint32_t r = 1; r <= 4; r++)
            report(p, r, step);
    wrk_progress_tick(p, 6999);
    cr_assert_eq(s.n, 0, "not before the interval ends");
    wrk_progress_tick(p, 7000);
    cr_assert_eq(s.n, 1, "one message for 12 reports");
    const Chorus__NodeProgress *np = s.got[0]->node_progress;
    cr_assert_eq(s.got[0]->body_case, CHORUS__ENVELOPE__BODY_NODE_PROGRESS);
    cr_assert_str_eq(np->job_id, "j1");
    cr_assert_eq(np->generation, 2);
    cr_assert_eq(np->launch_token, 77);
    cr_assert_eq(np->total_steps, 50);
    /* ranks 1, 2, 4 agree (the latest step, 4); rank 3's step time differs */
    cr_assert_not_null(np->common);
    cr_assert_eq(np->common->step, 4);
    cr_assert_float_eq(np->common->step_ms, 100, 1e-12);
    cr_assert_float_eq(np->common->t_compute, 0.05, 1e-12);
    /* and every step's figures since the last summary, for the straggler detector: step 1's
     * too, as the full report carried only its latest */
    cr_assert_eq(np->common->n_computes, 4);
    cr_assert_eq(np->common->n_tps, 4);
    for (int i = 0; i < 4; i++) {
        cr_assert_float_eq(np->common->computes[i], 0.05, 1e-6);
        cr_assert_float_eq(np->common->tps[i], 0.01, 1e-6);
    }
    cr_assert_eq(np->n_ranks, 3);
    cr_assert_eq(np->ranks[0] + np->ranks[1] + np->ranks[2], 1 + 2 + 4);
    cr_assert_eq(np->n_differ, 1);
    cr_assert_eq(np->differ[0]->rank, 3);
    cr_assert_eq(np->differ[0]->step, 4);
    cr_assert_float_eq(np->differ[0]->step_ms, 180, 1e-12);
    cr_assert_eq(np->differ[0]->n_tps, 4);
    cr_assert_float_eq(np->differ[0]->tps[3], 0.03, 1e-6);
    cr_assert_eq(np->n_detail, 0);
    sink_free(&s);
    report(p, 1, 5);
    wrk_progress_tick(p, 8000);
    cr_assert_eq(s.n, 1);
    cr_assert_eq(s.got[0]->node_progress->n_differ, 1, "a lone rank is a summary of its own");
    cr_assert_eq(s.got[0]->node_progress->differ[0]->step, 5);
    cr_assert_eq(s.got[0]->node_progress->differ[0]->n_computes, 1, "the last send's are gone");
    sink_free(&s);
    wrk_progress_stats_t st;
    wrk_progress_stats(p, &st);
    cr_assert_eq(st.reports, 17);
    cr_assert_eq(st.messages, 3);
    wrk_progress_destroy(p);
}

Test(progress, detail_every_n_intervals_and_when_asked)
{
    sink_t s = {0};
    wrk_progress_t *p = NULL;
    wrk_progress_cfg_t cfg = {.interval_ms = 100, .detail_every = 3, .send = sink_send, .ud = &s};
    cr_assert_eq(wrk_progress_create(&cfg, &p), 0);
    uint64_t now = 1000;
    int detail[5] = {0};
    for (int i = 0; i < 5; i++, now += 100) {
        if (i == 3)
            wrk_progress_want_detail(p, "j1"); /* asked: the next interval */
        for (uint32_t r = 1; r <= 2; r++)
            report(p, r, (uint64_t)i + 1);
        wrk_progress_tick(p, now);
        cr_assert_eq(s.n, 1);
        const Chorus__NodeProgress *np = s.got[0]->node_progress;
        detail[i] = (int)np->n_detail;
        if (np->n_detail) { /* full reports instead of summaries, metrics and all */
            cr_assert_eq(np->n_ranks + np->n_differ, 0);
            const Chorus__RankEvent *ev = np->detail[0];
            cr_assert_eq(ev->step, (uint64_t)i + 1);
            cr_assert_float_eq(ev->t_tp, ev->rank == 3 ? 0.03 : 0.01, 1e-12);
            cr_assert_eq(ev->n_metrics, 2);
            cr_assert_str_eq(ev->metrics[1]->name, "mem_peak_bytes");
        }
        sink_free(&s);
    }
    cr_assert_eq(detail[0], 2, "the ranks' first reports");
    cr_assert_eq(detail[1], 0);
    cr_assert_eq(detail[2], 2, "every 3rd interval");
    cr_assert_eq(detail[3], 2, "asked for");
    cr_assert_eq(detail[4], 0);
    wrk_progress_destroy(p);
}

Test(progress, flush_sends_at_once_and_a_refused_tick_keeps_the_reports)
{
    sink_t s = {0};
    wrk_progress_t *p = NULL;
    wrk_progress_cfg_t cfg = {.interval_ms = 10000, .send = sink_send, .ud = &s};
    cr_assert_eq(wrk_progress_create(&cfg, &p), 0);
    report(p, 1, 7);
    wrk_progress_flush(p, "j1", 1); /* another generation: nothing */
    cr_assert_eq(s.n, 0);
    wrk_progress_flush(p, "j1", 2); /* before a lifecycle event of that job: now, in full */
    cr_assert_eq(s.n, 1);
    cr_assert_eq(s.got[0]->node_progress->n_detail, 1);
    cr_assert_eq(s.got[0]->node_progress->detail[0]->step, 7);
    sink_free(&s);
    report(p, 1, 8); /* a flush sends in full even what was sent in full before */
    wrk_progress_flush(p, "j1", 2);
    cr_assert_eq(s.n, 1);
    cr_assert_eq(s.got[0]->node_progress->n_detail, 1);
    cr_assert_eq(s.got[0]->node_progress->detail[0]->n_metrics, 2);
    sink_free(&s);
    /* the link is down at the tick: kept, and sent (the latest step) once it is back */
    report(p, 1, 8);
    s.refuse = 1;
    wrk_progress_tick(p, 20000);
    report(p, 1, 9);
    s.refuse = 0;
    wrk_progress_tick(p, 20100);
    cr_assert_eq(s.n, 1);
    cr_assert_eq(s.got[0]->node_progress->differ[0]->step, 9);
    /* every step's since the last summary (full reports carry their latest only): 7, 8, 9 */
    cr_assert_eq(s.got[0]->node_progress->differ[0]->n_computes, 3);
    sink_free(&s);
    wrk_progress_destroy(p);
}

Test(progress, a_summary_carries_the_last_steps_figures_oldest_first)
{
    sink_t s = {0};
    wrk_progress_t *p = NULL;
    wrk_progress_cfg_t cfg = {.interval_ms = 1000, .send = sink_send, .ud = &s};
    cr_assert_eq(wrk_progress_create(&cfg, &p), 0);
    Chorus__RankEvent ev = CHORUS__RANK_EVENT__INIT;
    ev.job_id = "j1";
    ev.generation = 2;
    ev.rank = 1;
    ev.kind = CHORUS__RANK_EVENT_KIND__RANK_PROGRESS;
    ev.step = 1;
    cr_assert_eq(wrk_progress_add(p, &ev), 0); /* its first goes in full */
    wrk_progress_tick(p, 1000);
    sink_free(&s);
    for (int i = 0; i < WRK_PROGRESS_FIGURES + 3; i++) { /* more steps than it keeps */
        ev.step = 2 + (uint64_t)i;
        ev.step_s = 1 + i; /* no compute split: step_s is the figure */
        ev.t_tp = i % 2 ? 0.5 : 0;
        cr_assert_eq(wrk_progress_add(p, &ev), 0);
    }
    wrk_progress_tick(p, 2000);
    cr_assert_eq(s.n, 1);
    const Chorus__RankSummary *sum = s.got[0]->node_progress->differ[0];
    cr_assert_eq(sum->n_computes, WRK_PROGRESS_FIGURES);
    cr_assert_eq(sum->n_tps, WRK_PROGRESS_FIGURES);
    for (int i = 0; i < WRK_PROGRESS_FIGURES; i++) { /* the newest, oldest first */
        cr_assert_float_eq(sum->computes[i], 4 + i, 1e-6);
        cr_assert_float_eq(sum->tps[i], (3 + i) % 2 ? 0.5 : 0, 1e-6);
    }
    cr_assert_float_eq(sum->step_s, WRK_PROGRESS_FIGURES + 3, 1e-12);
    sink_free(&s);
    wrk_progress_destroy(p);
}

/* One report of rank 1 carrying one metric. */
static void report_metric(wrk_progress_t *p, uint64_t s, const char *name, double v)
{
    Chorus__RankEvent ev = CHORUS__RANK_EVENT__INIT;
    Chorus__Metric m = CHORUS__METRIC__INIT, *mp = &m;
    m.name = (char *)name;
    m.value = v;
    ev.job_id = "j1";
    ev.generation = 2;
    ev.rank = 1;
    ev.kind = CHORUS__RANK_EVENT_KIND__RANK_PROGRESS;
    ev.step = s;
    ev.metrics = &mp;
    ev.n_metrics = 1;
    cr_assert_eq(wrk_progress_add(p, &ev), 0);
}

/* A diag rank reports each group's bandwidth in its own report: merged in the interval,
 * and sent in full whenever its names are news. */
Test(progress, an_intervals_metrics_are_merged_and_new_names_go_in_full)
{
    sink_t s = {0};
    wrk_progress_t *p = NULL;
    wrk_progress_cfg_t cfg = {.interval_ms = 100, .send = sink_send, .ud = &s};
    cr_assert_eq(wrk_progress_create(&cfg, &p), 0);
    report_metric(p, 1, "busbw.world.allreduce", 1.0);
    report_metric(p, 2, "busbw.tp.allreduce", 2.0);
    report_metric(p, 3, "busbw.world.allreduce", 3.0);
    wrk_progress_tick(p, 1000);
    cr_assert_eq(s.n, 1);
    const Chorus__NodeProgress *np = s.got[0]->node_progress;
    cr_assert_eq(np->n_detail, 1);
    cr_assert_eq(np->detail[0]->step, 3);
    cr_assert_eq(np->detail[0]->n_metrics, 2, "both groups' figures");
    for (size_t i = 0; i < 2; i++) {
        const Chorus__Metric *m = np->detail[0]->metrics[i];
        double want = strcmp(m->name, "busbw.tp.allreduce") == 0 ? 2.0 : 3.0; /* the latest */
        cr_assert_float_eq(m->value, want, 1e-12, "%s", m->name);
    }
    sink_free(&s);
    report_metric(p, 4, "busbw.world.allreduce", 4.0); /* names seen before... */
    report_metric(p, 5, "busbw.tp.allreduce", 5.0);
    wrk_progress_tick(p, 1100);
    cr_assert_eq(s.n, 1);
    cr_assert_eq(s.got[0]->node_progress->n_detail, 0, "...a summary");
    cr_assert_eq(s.got[0]->node_progress->n_differ, 1);
    sink_free(&s);
    report_metric(p, 6, "busbw.dp.allreduce", 6.0); /* news */
    wrk_progress_tick(p, 1200);
    cr_assert_eq(s.n, 1);
    cr_assert_eq(s.got[0]->node_progress->n_detail, 1);
    sink_free(&s);
    wrk_progress_destroy(p);
}

/* A Heartbeat is skipped only when something went within the interval and dead-after
 * leaves room for two silent intervals and one more; an older coordinator (dead-after
 * unknown) gets every one. */
Test(progress, heartbeat_skipped_only_after_a_recent_message)
{
    cr_assert(wrk_heartbeat_due(10000, 0, 1000, 5000), "nothing sent yet");
    cr_assert_not(wrk_heartbeat_due(10000, 9500, 1000, 5000), "sent 500 ms ago");
    cr_assert(wrk_heartbeat_due(10000, 9000, 1000, 5000), "sent a whole interval ago");
    cr_assert(wrk_heartbeat_due(10000, 9500, 1000, 0), "dead-after unknown");
    cr_assert(wrk_heartbeat_due(10000, 9500, 1000, 2999), "dead-after under 3 intervals");
    cr_assert_not(wrk_heartbeat_due(10000, 9500, 1000, 3000));
}

/* A checkpoint held for rank r of job j1 generation 2 (node_ranks: the node's ranks). */
static int checkpoint(wrk_progress_t *p, uint32_t r, uint64_t s, uint32_t node_ranks)
{
    Chorus__RankEvent ev = CHORUS__RANK_EVENT__INIT;
    ev.job_id = "j1";
    ev.generation = 2;
    ev.launch_token = 77;
    ev.rank = r;
    ev.kind = CHORUS__RANK_EVENT_KIND__RANK_CHECKPOINT;
    ev.step = s;
    ev.bytes = 1000 + r;
    ev.checksum = 7 * r + s;
    return wrk_progress_checkpoint(p, &ev, node_ranks);
}

static void unsent_count(void *ud, const Chorus__RankEvent *ev)
{
    sink_t *s = ud;
    cr_assert_eq(ev->kind, CHORUS__RANK_EVENT_KIND__RANK_CHECKPOINT);
    s->refuse++; /* counts past 1: what the owner would have queued */
}

/* A checkpoint step's reports of the node's ranks travel in one NodeProgress, with the
 * progress held before them, in full, as soon as the last of the node's ranks reported. */
Test(progress, checkpoint_reports_of_a_step_go_together)
{
    sink_t s = {0};
    wrk_progress_t *p = NULL;
    wrk_progress_cfg_t cfg = {.interval_ms = 1000, .send = sink_send, .ud = &s};
    cr_assert_eq(wrk_progress_create(&cfg, &p), 0);
    for (uint32_t r = 1; r <= 4; r++) {
        report(p, r, 20);
        cr_assert_eq(checkpoint(p, r, 20, 4), 0);
        cr_assert_eq(s.n, r == 4 ? 1 : 0, "held until the node's 4th rank reported");
    }
    const Chorus__NodeProgress *np = s.got[0]->node_progress;
    cr_assert_eq(np->n_checkpoints, 4);
    cr_assert_eq(np->n_detail, 4, "the progress before them goes in full");
    cr_assert_str_eq(np->job_id, "j1");
    cr_assert_eq(np->generation, 2);
    cr_assert_eq(np->launch_token, 77);
    for (uint32_t r = 1; r <= 4; r++) {
        const Chorus__RankEvent *ck = np->checkpoints[r - 1];
        cr_assert_eq(ck->rank, r);
        cr_assert_eq(ck->step, 20);
        cr_assert_eq(ck->bytes, 1000 + r);
        cr_assert_eq(ck->checksum, 7 * r + 20);
    }
    wrk_progress_stats_t st;
    wrk_progress_stats(p, &st);
    cr_assert_eq(st.checkpoints, 4);
    sink_free(&s);
    wrk_progress_tick(p, 3000);
    cr_assert_eq(s.n, 0, "nothing left held");

    /* Fewer reports than the node's ranks: they go at the next tick, between intervals too. */
    cr_assert_eq(checkpoint(p, 2, 40, 4), 0);
    cr_assert_eq(s.n, 0);
    wrk_progress_tick(p, 3001);
    cr_assert_eq(s.n, 1);
    cr_assert_eq(s.got[0]->node_progress->n_checkpoints, 1);
    cr_assert_eq(s.got[0]->node_progress->checkpoints[0]->rank, 2);
    sink_free(&s);

    /* The link is down: a tick keeps them; a flush (before a failure) hands them back to the
     * owner, which queues them ahead of the failure; nothing is sent twice. */
    s.refuse = 1;
    cr_assert_eq(checkpoint(p, 1, 60, 2), 0);
    cr_assert_eq(checkpoint(p, 3, 60, 2), 0);
    wrk_progress_tick(p, 5000);
    cr_assert_eq(s.n, 0);
    wrk_progress_destroy(p);
    p = NULL;
    cfg.unsent = unsent_count;
    cr_assert_eq(wrk_progress_create(&cfg, &p), 0);
    cr_assert_eq(checkpoint(p, 1, 60, 2), 0);
    cr_assert_eq(checkpoint(p, 3, 60, 2), 0);
    wrk_progress_flush(p, "j1", 2);
    cr_assert_eq(s.refuse, 3, "both handed back");
    s.refuse = 0;
    wrk_progress_tick(p, 9000);
    cr_assert_eq(s.n, 0, "handed back: not sent again");
    wrk_progress_destroy(p);
}
