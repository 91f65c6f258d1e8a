/* chorusctl's link to coordinatord: the Unix control socket (the coordinator checks the
 * peer's uid with SO_PEERCRED) or TCP with the cluster key, role "ctl". Converts every
 * failure into one diagnostic line and an exit status. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/auth.h"
#include "common/err.h"
#include "common/escape.h"
#include "common/msg.h"
#include "ctl.h"

void ctl_errf(const char *fmt, ...)
{
    char line[2048], esc[4 * sizeof line];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    /* Diagnostics quote the coordinator's refusals and the user's arguments. */
    fprintf(stderr, "chorusctl: %s\n", ch_escape(esc, sizeof esc, line));
}

int ctl_parse_long(const char *s, long min, long max, long *out)
{
    char *end = NULL;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < min || v > max)
        return -EINVAL;
    *out = v;
    return 0;
}

void ctl_pause_ms(unsigned ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {
    }
}

const char *ctl_target(const ctl_t *ctl)
{
    return ctl->coordinator ? ctl->coordinator : ctl->socket_path;
}

int ctl_open(const ctl_t *ctl, ch_client_t **out)
{
    ch_key_t key;
    int rc;

    *out = NULL;
    if (!ctl->coordinator) {
        rc = ch_client_connect_unix(ctl->socket_path, CTL_CONNECT_TIMEOUT_MS, out);
        if (rc < 0) {
            ctl_errf("cannot reach coordinator at %s: %s", ctl->socket_path, ch_strerror(rc));
            return CTL_EXIT_UNREACHABLE;
        }
        return CTL_EXIT_OK;
    }
    if (!ctl->key_path || !*ctl->key_path) {
        ctl_errf("--coordinator %s needs --key FILE (or CHORUS_KEY)", ctl->coordinator);
        return CTL_EXIT_USAGE;
    }
    rc = ch_auth_global_init();
    if (rc == 0)
        rc = ch_key_load(ctl->key_path, &key);
    if (rc < 0) {
        ctl_errf("%s: %s", ctl->key_path, ch_strerror(rc));
        return CTL_EXIT_CONFIG;
    }
    rc = ch_client_connect_tcp(ctl->coordinator, &key, "ctl", CTL_CONNECT_TIMEOUT_MS, out);
    memset(&key, 0, sizeof key);
    if (rc == CH_E_AUTH) {
        ctl_errf("cannot authenticate to coordinator at %s with key %s: %s", ctl->coordinator,
                 ctl->key_path, ch_strerror(rc));
        return CTL_EXIT_CONFIG;
    }
    if (rc < 0) {
        ctl_errf("cannot reach coordinator at %s: %s", ctl->coordinator, ch_strerror(rc));
        return CTL_EXIT_UNREACHABLE;
    }
    return CTL_EXIT_OK;
}

/* Exit status for an Error reply's code. */
static int exit_for_error(int code)
{
    if (code == CH_E_CONFIG || code == CH_E_CAPACITY || code == CH_E_KEYPERM)
        return CTL_EXIT_CONFIG;
    return CTL_EXIT_FAILED;
}

int ctl_call(const ctl_t *ctl, ch_client_t *cl, Chorus__Envelope *req,
             Chorus__Envelope__BodyCase want, const char *what, Chorus__Envelope **resp)
{
    Chorus__Envelope *r = NULL;
    int rc = ch_client_call(cl, req, CTL_CALL_TIMEOUT_MS, &r);

    *resp = NULL;
    if (r && r->body_case == CHORUS__ENVELOPE__BODY_ERROR) {
        const Chorus__Error *e = r->error;
        int code = e->code < 0 ? e->code : (rc < 0 ? rc : CH_E_FORMAT);
        const char *msg = e->message && *e->message ? e->message : ch_strerror(code);
        if (what)
            ctl_errf("%s: %s", what, msg);
        else
            ctl_errf("%s", msg);
        ch_msg_free(r);
        return exit_for_error(code);
    }
    if (rc < 0) {
        ctl_errf("coordinator at %s: %s", ctl_target(ctl), ch_strerror(rc));
        if (r)
            ch_msg_free(r);
        return CTL_EXIT_UNREACHABLE;
    }
    if (!r || r->body_case != want) {
        ctl_errf("coordinator at %s sent an unexpected reply (%s)", ctl_target(ctl),
                 r ? ch_msg_name(r) : "none");
        if (r)
            ch_msg_free(r);
        return CTL_EXIT_FAILED;
    }
    *resp = r;
    return CTL_EXIT_OK;
}

int ctl_rpc(const ctl_t *ctl, Chorus__Envelope *req, Chorus__Envelope__BodyCase want,
            const char *what, Chorus__Envelope **resp)
{
    ch_client_t *cl = NULL;
    int st = ctl_open(ctl, &cl);
    if (st == CTL_EXIT_OK)
        st = ctl_call(ctl, cl, req, want, what, resp);
    if (cl)
        ch_client_destroy(cl);
    return st;
}

int ctl_query_job(const ctl_t *ctl, ch_client_t *cl, const char *job, Chorus__Envelope **resp)
{
    Chorus__Envelope env = CHORUS__ENVELOPE__INIT;
    Chorus__JobQuery q = CHORUS__JOB_QUERY__INIT;
    q.job_id = (char *)job;
    env.body_case = CHORUS__ENVELOPE__BODY_JOB_QUERY;
    env.job_query = &q;
    return ctl_call(ctl, cl, &env, CHORUS__ENVELOPE__BODY_JOB_INFO, job, resp);
}
