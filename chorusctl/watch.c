/* chorusctl watch JOB: follow a job until it ends, then exit with its exit status
 * (0 completed, 1 failed or cancelled).
 *
 * Three ways to show it, chosen once:
 *   - a terminal: one progress bar redrawn in place every poll ("\r" and erase-line),
 *     cut to the terminal's width, ended with a newline when the job ends;
 *   - not a terminal (a pipe, a file): one plain line whenever the state, step,
 *     generation or restarts change;
 *   - --json: one JSON object per line on the same changes (a stream for scripts), the
 *     last one the job's final state.
 * The figures: percent, step/total, loss, tokens/s, MFU, the pipeline bubble (measured:
 * the mean over ranks of pp_wait / step; with 1F1B's (p-1)/(m+p-1) beside it), restarts and an ETA
 * from the pace since the current run of steps began. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "common/escape.h"
#include "common/msg.h"
#include "common/util.h"
#include "ctl.h"
#include "json.h"

#define POLL_WATCH_MS 250
#define BAR_WIDTH     24

typedef enum { SHOW_BAR, SHOW_LINES, SHOW_JSON } show_t;

typedef struct watch {
    show_t show;
    char last_key[128];    /* what a "change" is: state, step, generation, restarts */
    uint64_t t0_ms, step0; /* ETA: first sample of the current run of steps */
    uint64_t eta_gen;
    int drawn; /* a bar is on the screen */
} watch_t;

/* Figures of one update, derived from a JobInfo; NaN / -1 when not known. */
typedef struct figures {
    double percent, loss, tokens_per_s, mfu, bubble, eta_s;
} figures_t;

static double eta_seconds(watch_t *w, const Chorus__JobInfo *ji)
{
    uint64_t now = ch_now_ms();
    if (w->t0_ms == 0 || ji->generation != w->eta_gen || ji->step < w->step0) {
        w->t0_ms = now;
        w->step0 = ji->step;
        w->eta_gen = ji->generation;
    }
    if (ji->total_steps && ji->step >= ji->total_steps)
        return 0.0;
    if (ji->step <= w->step0 || now <= w->t0_ms)
        return -1.0;
    double per_step = (double)(now - w->t0_ms) / 1000.0 / (double)(ji->step - w->step0);
    return per_step * (double)(ji->total_steps - ji->step);
}

/* The job's measured pipeline bubble (the mean over ranks), else rank 0's reported
 * "bubble" (a coordinator without the field), NaN when absent. */
static double bubble(const Chorus__JobInfo *ji)
{
    if (ji->pp > 1 && ji->bubble >= 0)
        return ji->bubble;
    for (size_t r = 0; r < ji->n_ranks; r++) {
        if (ji->ranks[r]->rank != 0)
            continue;
        for (size_t m = 0; m < ji->ranks[r]->n_metrics; m++)
            if (strcmp(ji->ranks[r]->metrics[m]->name, "bubble") == 0)
                return ji->ranks[r]->metrics[m]->value;
    }
    return NAN;
}

static figures_t figures(watch_t *w, const Chorus__JobInfo *ji)
{
    figures_t f = {NAN, NAN, NAN, NAN, NAN, -1.0};
    int train = strcmp(ji->kind, "diag") != 0;
    if (strcmp(ji->state, "completed") == 0)
        f.percent = 100.0;
    else if (ji->total_steps)
        f.percent = fmin(100.0, 100.0 * (double)ji->step / (double)ji->total_steps);
    if (train && ji->step > 0 && isfinite(ji->loss))
        f.loss = ji->loss;
    if (ji->tokens_per_s > 0)
        f.tokens_per_s = ji->tokens_per_s;
    if (ji->mfu > 0)
        f.mfu = ji->mfu;
    f.bubble = bubble(ji);
    f.eta_s = ctl_job_state_final(ji->state) ? 0.0 : eta_seconds(w, ji);
    return f;
}

/* The figures after the state and step, as "  loss 2.7710  tok/s 63.2k ...". */
static void tail(char *buf, size_t n, const Chorus__JobInfo *ji, const figures_t *f)
{
    char tps[32], eta[32], loss[32] = "-", mfu[32] = "-", bub[48] = "", val[32] = "";
    ctl_fmt_si(tps, sizeof tps, isfinite(f->tokens_per_s) ? f->tokens_per_s : -1);
    ctl_fmt_duration(eta, sizeof eta, f->eta_s);
    if (isfinite(f->loss))
        snprintf(loss, sizeof loss, "%.4f", f->loss);
    if (isfinite(f->mfu))
        snprintf(mfu, sizeof mfu, "%.2f%%", 100.0 * f->mfu);
    if (isfinite(f->bubble))
        snprintf(bub, sizeof bub, "  bubble %.1f%% (1F1B %.1f%%)", 100.0 * f->bubble,
                 100.0 * ji->bubble_theory);
    if (ji->val_step > 0 && isfinite(ji->val_loss)) /* train.val_data's, when taken */
        snprintf(val, sizeof val, "  val %.4f", ji->val_loss);
    snprintf(buf, n, "  loss %s%s  tok/s %s  MFU %s%s  restarts %" PRIu32 "  ETA %s%s%s%s%s%s%s",
             loss, val, tps, mfu, bub, ji->restarts, eta, ji->stragglers ? "  straggler: " : "",
             ji->stragglers ? ji->straggler : "", ji->slow_nodes ? "  slow node: " : "",
             ji->slow_nodes ? ji->slow_node : "", ji->reason && *ji->reason ? "  reason: " : "",
             ji->reason ? ji->reason : "");
}

static int term_width(void)
{
    struct winsize ws;
    if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col >= 20)
        return ws.ws_col;
    return 80;
}

/* "\r", erase the line, the bar: j1 running [=========>      ]  45%  step 18/40  ... */
static void show_bar(watch_t *w, const Chorus__JobInfo *ji, const figures_t *f)
{
    char bar[BAR_WIDTH + 1], rest[768], line[1024], esc[4 * sizeof line];
    double pc = isfinite(f->percent) ? f->percent : 0.0;
    int fill = (int)(pc / 100.0 * BAR_WIDTH + 0.5);
    for (int i = 0; i < BAR_WIDTH; i++)
        bar[i] = i < fill ? '=' : i == fill ? '>' : ' ';
    bar[BAR_WIDTH] = '\0';
    tail(rest, sizeof rest, ji, f);
    int len = snprintf(line, sizeof line, "%s %-9s [%s] %3.0f%%  step %" PRIu64 "/%" PRIu64 "%s",
                       ji->id, ji->state, bar, pc, ji->step, ji->total_steps, rest);
    /* The line quotes the coordinator (state, reason): escaped before our own controls. */
    len = len < 0 ? 0 : (int)ch_escape_n(esc, sizeof esc, line, strlen(line));
    int width = term_width() - 1; /* never wrap: a wrapped line cannot be redrawn */
    if (len > width)
        len = width;
    printf("\r\033[2K%.*s", len, esc);
    fflush(stdout);
    w->drawn = 1;
}

static void show_line(const Chorus__JobInfo *ji, const figures_t *f)
{
    char rest[768], line[1024], esc[4 * sizeof line];
    tail(rest, sizeof rest, ji, f);
    snprintf(line, sizeof line, "%s %-10s step %" PRIu64 "/%" PRIu64 "%s", ji->id, ji->state,
             ji->step, ji->total_steps, rest);
    printf("%s\n", ch_escape(esc, sizeof esc, line));
    fflush(stdout);
}

static void show_json(const Chorus__JobInfo *ji, const figures_t *f)
{
    ctl_json_t j;
    ctl_json_init_line(&j, stdout);
    ctl_json_obj_begin(&j);
    ctl_json_kstr(&j, "id", ji->id);
    ctl_json_kstr(&j, "name", ji->name);
    ctl_json_kstr(&j, "state", ji->state);
    ctl_json_kuint(&j, "step", ji->step);
    ctl_json_kuint(&j, "total_steps", ji->total_steps);
    ctl_json_kdouble(&j, "percent", f->percent); /* NaN: null */
    ctl_json_kdouble(&j, "loss", f->loss);
    ctl_json_kdouble(&j, "tokens_per_s", f->tokens_per_s);
    ctl_json_kdouble(&j, "mfu", f->mfu);
    ctl_json_kdouble(&j, "bubble", f->bubble);
    ctl_json_kdouble(&j, "bubble_theory", ji->pp > 1 ? ji->bubble_theory : NAN);
    ctl_json_kuint(&j, "generation", ji->generation);
    ctl_json_kuint(&j, "restarts", ji->restarts);
    ctl_json_kdouble(&j, "eta_s", f->eta_s >= 0 ? f->eta_s : NAN);
    ctl_json_kstr(&j, "reason", ji->reason);
    ctl_json_kstr(&j, "straggler", ji->stragglers ? ji->straggler : "");
    ctl_json_kstr(&j, "slow_node", ji->slow_nodes ? ji->slow_node : "");
    ctl_json_obj_end(&j);
    ctl_json_finish(&j);
}

static void show(watch_t *w, const Chorus__JobInfo *ji)
{
    char key[128];
    figures_t f = figures(w, ji);
    if (w->show == SHOW_BAR) {
        show_bar(w, ji, &f);
        return;
    }
    snprintf(key, sizeof key, "%s/%" PRIu64 "/%" PRIu64 "/%" PRIu32, ji->state, ji->step,
             ji->generation, ji->restarts);
    if (strcmp(key, w->last_key) == 0)
        return;
    snprintf(w->last_key, sizeof w->last_key, "%s", key);
    if (w->show == SHOW_JSON)
        show_json(ji, &f);
    else
        show_line(ji, &f);
}

int ctl_cmd_watch(ctl_t *ctl, int argc, char **argv)
{
    ch_client_t *cl = NULL;
    watch_t w = {.show = ctl->json ? SHOW_JSON : isatty(STDOUT_FILENO) ? SHOW_BAR : SHOW_LINES};

    int st = ctl_args_words("watch", &argc, &argv);
    if (st != CTL_EXIT_OK)
        return st;
    if (argc != 1) {
        ctl_usage("watch");
        return CTL_EXIT_USAGE;
    }
    st = ctl_open(ctl, &cl);
    if (st != CTL_EXIT_OK)
        return st;
    for (;;) {
        Chorus__Envelope *resp = NULL;
        st = ctl_query_job(ctl, cl, argv[0], &resp);
        if (st != CTL_EXIT_OK)
            break;
        show(&w, resp->job_info);
        int done = ctl_job_state_final(resp->job_info->state);
        if (done)
            st = ctl_job_exit_status(resp->job_info->state);
        ch_msg_free(resp);
        if (done)
            break;
        ctl_pause_ms(POLL_WATCH_MS);
    }
    if (w.drawn)
        printf("\n");
    ch_client_destroy(cl);
    return st;
}
