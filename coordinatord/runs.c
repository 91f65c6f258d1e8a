/* Runs at the coordinator: the submit-time check as the job's user, run ids, checkpoint
 * requests (runs.h). */
#include "runs.h"

#include <errno.h>
#include <grp.h>
#include <inttypes.h>
#include <pwd.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/err.h"
#include "common/log.h"
#include "common/run.h"
#include "common/util.h"
#include "coord.h"

/* What the checking child sends back through its pipe. */
typedef struct verdict {
    int rc;
    char run_id[CH_RUN_ID_LEN];
    char err[480];
} verdict_t;

/* In the child: take the job's identity when ours is root and it is another. */
static int become(const ch_jobspec_t *s, char *err, size_t errlen)
{
    if (geteuid() != 0 || s->run_as.uid < 0 || (uid_t)s->run_as.uid == geteuid())
        return 0;
    uid_t uid = (uid_t)s->run_as.uid;
    gid_t gid = s->run_as.gid >= 0 ? (gid_t)s->run_as.gid : (gid_t)uid;
    struct passwd pw, *res = NULL;
    char buf[1024];
    int ok = getpwuid_r(uid, &pw, buf, sizeof buf, &res) == 0 && res
                 ? initgroups(res->pw_name, gid) == 0
                 : setgroups(0, NULL) == 0;
    if (!ok || setgid(gid) != 0 || setuid(uid) != 0)
        return ch_errf(err, errlen, -errno, "cannot take uid %u to check the job's files: %s",
                       (unsigned)uid, strerror(errno));
    return 0;
}

/* ch_run_check in a child process as the job's user; the verdict into *v. */
static int check_as_user(const ch_jobspec_t *s, verdict_t *v)
{
    int fds[2];
    memset(v, 0, sizeof *v);
    if (pipe(fds) != 0)
        return ch_errf(v->err, sizeof v->err, -errno, "pipe: %s", strerror(errno));
    pid_t pid = fork();
    if (pid < 0) {
        close(fds[0]);
        close(fds[1]);
        return ch_errf(v->err, sizeof v->err, -errno, "fork: %s", strerror(errno));
    }
    if (pid == 0) {
        verdict_t out;
        ch_run_resume_t res;
        memset(&out, 0, sizeof out);
        close(fds[0]);
        out.rc = become(s, out.err, sizeof out.err);
        if (out.rc == 0)
            out.rc = ch_run_check(s, 0, &res, out.err, sizeof out.err);
        if (out.rc == 0)
            snprintf(out.run_id, sizeof out.run_id, "%s", res.run_id);
        ssize_t w = write(fds[1], &out, sizeof out);
        _exit(w == (ssize_t)sizeof out ? 0 : 1);
    }
    close(fds[1]);
    size_t got = 0;
    (void)ch_read_full(fds[0], v, sizeof *v, &got); /* a short verdict is checked below */
    close(fds[0]);
    while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
        ;
    if (got != sizeof *v)
        return ch_errf(v->err, sizeof v->err, CH_E_STATE, "the file check ended without a verdict");
    v->err[sizeof v->err - 1] = '\0';
    v->run_id[sizeof v->run_id - 1] = '\0';
    return v->rc;
}

/* Another active job of this coordinator writing the same folder. */
static const coord_job_t *folder_taken(coord_t *c, const char *folder)
{
    char other[CH_PATH_LEN];
    for (size_t i = 0; i < c->jobs.n; i++) {
        const coord_job_t *j = c->jobs.v[i];
        if ((j->state == COORD_JOB_QUEUED || coord_job_is_active(j)) &&
            j->spec.kind == CH_JOB_TRAIN && j->spec.checkpoint.dir[0] &&
            ch_run_folder(&j->spec, other, sizeof other) == 0 && strcmp(other, folder) == 0)
            return j;
    }
    return NULL;
}

int coord_runs_stamp(coord_t *c, ch_jobspec_t *spec, char *err, size_t errlen)
{
    char folder[CH_PATH_LEN];
    verdict_t v;
    if (spec->kind != CH_JOB_TRAIN)
        return 0;
    if (spec->checkpoint.dir[0]) {
        if (ch_run_folder(spec, folder, sizeof folder) < 0)
            return ch_errf(err, errlen, CH_E_CONFIG, "checkpoint.dir: path too long");
        const coord_job_t *o = folder_taken(c, folder);
        if (o)
            return ch_errf(err, errlen, CH_E_CONFIG,
                           "checkpoint.dir: job %s (%s) writes %s; choose another job.name or "
                           "checkpoint.dir",
                           o->id, coord_job_state_name(o->state), folder);
    }
    int rc = check_as_user(spec, &v);
    if (rc < 0)
        return ch_errf(err, errlen, rc, "%s", v.err);
    if (spec->checkpoint.dir[0]) {
        if (!v.run_id[0])
            ch_run_new_id(v.run_id);
        snprintf(spec->checkpoint.run_id, sizeof spec->checkpoint.run_id, "%s", v.run_id);
    }
    return 0;
}

// ---------------------------------------------------------------------------------------
// checkpoint requests

int coord_runs_checkpoint(coord_t *c, coord_job_t *j, char *err, size_t errlen)
{
    if (j->spec.kind != CH_JOB_TRAIN || !j->spec.checkpoint.dir[0])
        return ch_errf(err, errlen, CH_E_STATE, "job %s writes no checkpoints (checkpoint.dir)",
                       j->id);
    if (j->state != COORD_JOB_RUNNING && j->state != COORD_JOB_STARTING)
        return ch_errf(err, errlen, CH_E_STATE, "job %s is %s, not running", j->id,
                       coord_job_state_name(j->state));
    Chorus__CheckpointRanks cr = CHORUS__CHECKPOINT_RANKS__INIT;
    Chorus__Envelope env = CHORUS__ENVELOPE__INIT;
    uint64_t stamp = ++c->stamp;
    size_t sent = 0;
    cr.job_id = j->id;
    cr.generation = j->generation;
    env.body_case = CHORUS__ENVELOPE__BODY_CHECKPOINT_RANKS;
    env.checkpoint_ranks = &cr;
    for (uint32_t r = 0; j->ranks && r < j->world; r++) {
        coord_node_t *n = j->ranks[r].node;
        if (!coord_rank_holds(j->ranks[r].state) || n->mark == stamp)
            continue;
        n->mark = stamp;
        if (coord_node_send(n, &env) == 0)
            sent++;
    }
    CH_LOGI("job", "job=%s gen=%" PRIu64 " checkpoint requested (%zu nodes told)", j->id,
            j->generation, sent);
    coord_event(c, j->id, j->generation, -1, NULL, "checkpoint requested");
    return sent ? 0 : ch_errf(err, errlen, CH_E_STATE, "job %s: no node of it is reachable", j->id);
}

void coord_runs_checkpoint_all(coord_t *c)
{
    char err[256];
    for (size_t i = 0; i < c->jobs.n; i++) {
        coord_job_t *j = c->jobs.v[i];
        if (j->spec.kind == CH_JOB_TRAIN && j->spec.checkpoint.dir[0] &&
            (j->state == COORD_JOB_RUNNING || j->state == COORD_JOB_STARTING) &&
            coord_runs_checkpoint(c, j, err, sizeof err) < 0)
            CH_LOGW("job", "job=%s checkpoint on signal: %s", j->id, err);
    }
}
