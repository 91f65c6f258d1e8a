/* chorusctl submit | watch.
 *
 * submit checks a job file completely on the client (parse, --set overrides, validate
 * with file checks) so that a bad file is refused with the field and the reason before
 * anything reaches the coordinator; relative file paths are made absolute, since the
 * daemons do not share our working directory; the canonical text is what is sent.
 * --wait and watch then poll JobQuery on the same link until the job ends. */
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/err.h"
#include "common/jobspec.h"
#include "common/msg.h"
#include "common/util.h"
#include "ctl.h"
#include "json.h"

#define POLL_WAIT_MS  200
#define POLL_WATCH_MS 250

static void pause_ms(unsigned ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {
    }
}

/* Make a path in the job absolute (relative to our working directory). */
static int absolutize(char path[CH_PATH_LEN], const char *field, const char *file)
{
    char cwd[PATH_MAX], tmp[CH_PATH_LEN];
    if (!path[0] || path[0] == '/' || strcmp(path, "builtin") == 0)
        return 0;
    if (!getcwd(cwd, sizeof cwd) ||
        snprintf(tmp, sizeof tmp, "%s/%s", cwd, path) >= (int)sizeof tmp) {
        ctl_errf("%s: %s: path too long", file, field);
        return -ENAMETOOLONG;
    }
    memcpy(path, tmp, sizeof tmp);
    return 0;
}

/* Load a job file (ctl_jobfile_load) and make its canonical text; *ini is malloc'd
 * (caller frees). Returns an exit status, having printed "chorusctl: FILE: reason". */
static int load_job(const char *file, char **sets, int nsets, char **ini)
{
    ch_jobspec_t spec;

    *ini = NULL;
    int st = ctl_jobfile_load(file, sets, nsets, &spec);
    if (st != CTL_EXIT_OK)
        return st;
    if (absolutize(spec.train.data, "train.data", file) < 0 ||
        absolutize(spec.train.init_from, "train.init_from", file) < 0 ||
        absolutize(spec.checkpoint.dir, "checkpoint.dir", file) < 0)
        return CTL_EXIT_CONFIG;
    int rc = ch_jobspec_format(&spec, ini);
    if (rc < 0) {
        ctl_errf("%s: %s", file, ch_strerror(rc));
        return CTL_EXIT_FAILED;
    }
    return CTL_EXIT_OK;
}

// ----------------------------------------------------------------------------
// following a job

typedef struct follow {
    int tty;               /* redraw one line with \r */
    int quiet;             /* print nothing while following (--json, submit --wait) */
    char last_key[128];    /* what a "change" is: state, step, generation, restarts */
    size_t last_len;       /* length of the line drawn last (tty) */
    uint64_t t0_ms, step0; /* ETA: first sample of the current run of steps */
    uint64_t eta_gen;
} follow_t;

static double eta_seconds(follow_t *f, const Chorus__JobInfo *ji)
{
    uint64_t now = ch_now_ms();
    if (f->t0_ms == 0 || ji->generation != f->eta_gen || ji->step < f->step0) {
        f->t0_ms = now;
        f->step0 = ji->step;
        f->eta_gen = ji->generation;
    }
    if (ji->step <= f->step0 || ji->total_steps <= ji->step || now <= f->t0_ms)
        return ji->total_steps && ji->step >= ji->total_steps ? 0.0 : -1.0;
    double per_step = (double)(now - f->t0_ms) / 1000.0 / (double)(ji->step - f->step0);
    return per_step * (double)(ji->total_steps - ji->step);
}

static void watch_line(follow_t *f, const Chorus__JobInfo *ji, char *buf, size_t n)
{
    char tps[32], eta[32], loss[32], mfu[32];
    ctl_fmt_si(tps, sizeof tps, ji->tokens_per_s > 0 ? ji->tokens_per_s : -1);
    ctl_fmt_duration(eta, sizeof eta, eta_seconds(f, ji));
    if (ji->step > 0 && isfinite(ji->loss) && strcmp(ji->kind, "diag") != 0)
        snprintf(loss, sizeof loss, "%.4f", ji->loss);
    else
        snprintf(loss, sizeof loss, "-");
    if (ji->mfu > 0 && isfinite(ji->mfu))
        snprintf(mfu, sizeof mfu, "%.2f%%", 100.0 * ji->mfu);
    else
        snprintf(mfu, sizeof mfu, "-");
    snprintf(buf, n,
             "%s %-10s step %" PRIu64 "/%" PRIu64 "  loss %s  tok/s %s  MFU %s  ETA %s  "
             "restarts %" PRIu32 "%s%s",
             ji->id, ji->state, ji->step, ji->total_steps, loss, tps, mfu, eta, ji->restarts,
             ji->reason && *ji->reason ? "  reason: " : "", ji->reason ? ji->reason : "");
}

static void follow_show(follow_t *f, const Chorus__JobInfo *ji)
{
    char line[1024], key[128];
    if (f->quiet)
        return;
    watch_line(f, ji, line, sizeof line);
    if (f->tty) {
        size_t len = strlen(line);
        /* Pad over the previous, longer line instead of relying on terminal escapes. */
        printf("\r%s%*s", line, len < f->last_len ? (int)(f->last_len - len) : 0, "");
        f->last_len = len;
        fflush(stdout);
        return;
    }
    snprintf(key, sizeof key, "%s/%" PRIu64 "/%" PRIu64 "/%" PRIu32, ji->state, ji->step,
             ji->generation, ji->restarts);
    if (strcmp(key, f->last_key) != 0) {
        printf("%s\n", line);
        fflush(stdout);
        snprintf(f->last_key, sizeof f->last_key, "%s", key);
    }
}

/* Poll the job until it ends. Returns an exit status; on success *final holds the last
 * JobInfo (free with ch_msg_free). */
static int follow_job(const ctl_t *ctl, ch_client_t *cl, const char *job, follow_t *f,
                      unsigned interval_ms, Chorus__Envelope **final)
{
    *final = NULL;
    for (;;) {
        Chorus__Envelope *resp = NULL;
        int st = ctl_query_job(ctl, cl, job, &resp);
        if (st != CTL_EXIT_OK)
            return st;
        follow_show(f, resp->job_info);
        if (ctl_job_state_final(resp->job_info->state)) {
            if (f->tty && !f->quiet)
                printf("\n");
            *final = resp;
            return CTL_EXIT_OK;
        }
        ch_msg_free(resp);
        pause_ms(interval_ms);
    }
}

// ----------------------------------------------------------------------------
// commands

int ctl_cmd_submit(ctl_t *ctl, int argc, char **argv)
{
    const char *file = NULL;
    char **sets = calloc((size_t)argc + 1, sizeof *sets);
    char *ini = NULL;
    int nsets = 0, wait = 0, st = CTL_EXIT_USAGE;
    ch_client_t *cl = NULL;
    Chorus__Envelope req = CHORUS__ENVELOPE__INIT, *resp = NULL, *final = NULL;
    Chorus__Submit sub = CHORUS__SUBMIT__INIT;

    if (!sets) {
        st = CTL_EXIT_FAILED;
        goto out;
    }
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--wait") == 0) {
            wait = 1;
        } else if (ctl_arg_set(argc, argv, &i, &sets[nsets])) {
            nsets++;
        } else if (argv[i][0] == '-' || file) {
            ctl_errf("submit: unexpected '%s'", argv[i]);
            goto usage;
        } else {
            file = argv[i];
        }
    }
    if (!file)
        goto usage;
    st = load_job(file, sets, nsets, &ini);
    if (st != CTL_EXIT_OK)
        goto out;
    st = ctl_open(ctl, &cl);
    if (st != CTL_EXIT_OK)
        goto out;
    sub.job_ini = ini;
    req.body_case = CHORUS__ENVELOPE__BODY_SUBMIT;
    req.submit = &sub;
    st = ctl_call(ctl, cl, &req, CHORUS__ENVELOPE__BODY_SUBMIT_REPLY, file, &resp);
    if (st != CTL_EXIT_OK)
        goto out;
    const char *id = resp->submit_reply->job_id;
    if (!ctl->json) {
        printf("%s\n", id);
        fflush(stdout);
    }
    if (wait) {
        follow_t f = {.quiet = 1};
        st = follow_job(ctl, cl, id, &f, POLL_WAIT_MS, &final);
        if (st != CTL_EXIT_OK)
            goto out;
        const Chorus__JobInfo *ji = final->job_info;
        st = ctl_job_exit_status(ji->state);
        if (!ctl->json)
            printf("%s %s%s%s\n", id, ji->state, ji->reason && *ji->reason ? ": " : "", ji->reason);
    }
    if (ctl->json) {
        ctl_json_t j;
        ctl_json_init(&j, stdout);
        ctl_json_obj_begin(&j);
        ctl_json_kstr(&j, "id", id);
        if (final) {
            ctl_json_kstr(&j, "state", final->job_info->state);
            ctl_json_kstr(&j, "reason", final->job_info->reason);
        }
        ctl_json_obj_end(&j);
        ctl_json_finish(&j);
    }
    goto out;
usage:
    ctl_errf("usage: chorusctl submit JOBFILE [--set section.key=value]... [--wait] [--json]");
    st = CTL_EXIT_USAGE;
out:
    if (final)
        ch_msg_free(final);
    if (resp)
        ch_msg_free(resp);
    if (cl)
        ch_client_destroy(cl);
    free(ini);
    free(sets);
    return st;
}

int ctl_cmd_watch(ctl_t *ctl, int argc, char **argv)
{
    ch_client_t *cl = NULL;
    Chorus__Envelope *final = NULL;
    follow_t f = {0};

    if (argc != 1) {
        ctl_errf("usage: chorusctl watch JOB [--json]");
        return CTL_EXIT_USAGE;
    }
    f.tty = isatty(STDOUT_FILENO);
    f.quiet = ctl->json;
    int st = ctl_open(ctl, &cl);
    if (st != CTL_EXIT_OK)
        return st;
    st = follow_job(ctl, cl, argv[0], &f, POLL_WATCH_MS, &final);
    ch_client_destroy(cl);
    if (st != CTL_EXIT_OK)
        return st;
    if (ctl->json) {
        ctl_json_t j;
        ctl_json_init(&j, stdout);
        ctl_job_json(&j, final->job_info);
        ctl_json_finish(&j);
    }
    st = ctl_job_exit_status(final->job_info->state);
    ch_msg_free(final);
    return st;
}
