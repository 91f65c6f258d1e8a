/* chorusctl submit.
 *
 * submit checks a job file completely on the client (parse, --set overrides, validate
 * with file checks) so that a bad file is refused with the field and the reason before
 * anything reaches the coordinator; relative file paths are made absolute, since the
 * daemons do not share our working directory; the canonical text is what is sent.
 * --wait then polls JobQuery on the same link until the job ends (watch.c shows it). */
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/err.h"
#include "common/escape.h"
#include "common/jobspec.h"
#include "common/msg.h"
#include "common/tokens.h"
#include "common/util.h"
#include "ctl.h"
#include "json.h"

#define POLL_WAIT_MS 200

/* Make a path in the job absolute (relative to our working directory); a data source's
 * "text:" prefix stays in front. */
static int absolutize(char path[CH_PATH_LEN], const char *field, const char *file)
{
    char cwd[PATH_MAX], tmp[CH_PATH_LEN];
    const char *text = CH_TOKENS_TEXT_PREFIX;
    size_t pre = strncmp(path, text, strlen(text)) == 0 ? strlen(text) : 0;
    if (!path[pre] || path[pre] == '/' || strcmp(path, "builtin") == 0)
        return 0;
    if (!getcwd(cwd, sizeof cwd) || snprintf(tmp, sizeof tmp, "%.*s%s/%s", (int)pre, path, cwd,
                                             path + pre) >= (int)sizeof tmp) {
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
        absolutize(spec.train.val_data, "train.val_data", file) < 0 ||
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
// waiting for a job

/* Poll the job until it ends. Returns an exit status; on success *final holds the last
 * JobInfo (free with ch_msg_free). */
static int wait_job(const ctl_t *ctl, ch_client_t *cl, const char *job, Chorus__Envelope **final)
{
    *final = NULL;
    for (;;) {
        Chorus__Envelope *resp = NULL;
        int st = ctl_query_job(ctl, cl, job, &resp);
        if (st != CTL_EXIT_OK)
            return st;
        if (ctl_job_state_final(resp->job_info->state)) {
            *final = resp;
            return CTL_EXIT_OK;
        }
        ch_msg_free(resp);
        ctl_pause_ms(POLL_WAIT_MS);
    }
}

// ----------------------------------------------------------------------------
// commands

enum { OPT_SET = 256, OPT_WAIT };

const ctl_opt_t ctl_opts_submit[] = {
    {"set", OPT_SET, "section.key=value", "override a job-file key (repeatable)"},
    {"wait", OPT_WAIT, NULL, "wait for the end; exit 1 if the job failed or was cancelled"},
    {NULL, 0, NULL, NULL},
};

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
    ctl_args_t a;
    const char *val;
    int c;
    if (ctl_args_begin(&a, "submit", ctl_opts_submit, argc, argv) < 0)
        goto usage;
    while ((c = ctl_args_next(&a, &val)) > 0) {
        if (c == OPT_WAIT)
            wait = 1;
        else
            sets[nsets++] = (char *)val;
    }
    if (c < 0)
        goto out;
    if (a.npos != 1)
        goto usage;
    file = a.pos[0];
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
        st = wait_job(ctl, cl, id, &final);
        if (st != CTL_EXIT_OK)
            goto out;
        const Chorus__JobInfo *ji = final->job_info;
        st = ctl_job_exit_status(ji->state);
        if (!ctl->json) {
            char esc[4 * 1024 + 1];
            printf("%s %s%s%s\n", id, ji->state, ji->reason && *ji->reason ? ": " : "",
                   ch_escape(esc, sizeof esc, ji->reason));
        }
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
    ctl_usage("submit");
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
