/* Rank process spawning and reaping (see proc.h). libuv does the fork/exec, the
 * setsid (UV_PROCESS_DETACHED: new session, so the rank leads its own process group)
 * and the SIGCHLD reaping; this module builds the environment and the descriptors. */
#include "workerd/proc.h"

#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/err.h"
#include "common/jobspec.h"
#include "common/log.h"
#include "common/util.h"

extern char **environ;

struct wrk_proc {
    uv_process_t handle; /* handle.data == this */
    wrk_proc_exit_cb cb;
    void *ud;
    int pid;
    int exited;
    int closing;
};

/* Variables workerd sets or must not pass on (systemd's notify/watchdog belong to
 * workerd alone). */
static const char *const own_vars[] = {
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "CHORUS_JOB",
    "CHORUS_GENERATION",
    "CHORUS_JOB_FILE",
    "CHORUS_RUN_DIR",
    "CHORUS_RESUME_STEP",
    "CHORUS_PARENT_PID",
    "CHORUS_DEVICE",
    "CHORUS_MEMORY_DIR",
    "CHORUS_NODE",
    "CHORUS_AGENT_SOCK",
    "OPENBLAS_NUM_THREADS",
    "OMP_NUM_THREADS",
    "NOTIFY_SOCKET",
    "WATCHDOG_USEC",
    "WATCHDOG_PID",
    "LISTEN_FDS",
    "LISTEN_PID",
    "LISTEN_FDNAMES",
};
#define N_OWN (sizeof own_vars / sizeof own_vars[0])

static int is_own(const char *kv)
{
    for (size_t i = 0; i < N_OWN; i++) {
        size_t n = strlen(own_vars[i]);
        if (strncmp(kv, own_vars[i], n) == 0 && kv[n] == '=')
            return 1;
    }
    return 0;
}

static void env_free(char **env)
{
    if (!env)
        return;
    for (char **e = env; *e; e++)
        free(*e);
    free(env);
}

static int env_add(char **env, size_t *n, const char *name, const char *value)
{
    size_t len = strlen(name) + strlen(value) + 2;
    char *s = malloc(len);
    if (!s)
        return -ENOMEM;
    snprintf(s, len, "%s=%s", name, value);
    env[(*n)++] = s;
    return 0;
}

static int env_add_u64(char **env, size_t *n, const char *name, uint64_t v)
{
    char buf[32];
    snprintf(buf, sizeof buf, "%" PRIu64, v);
    return env_add(env, n, name, buf);
}

/* environ without own_vars, plus the rank's variables. NULL-terminated, malloc'd. */
static int env_build(const wrk_proc_spec_t *s, char ***out)
{
    size_t ninherit = 0, n = 0;
    int rc = 0;
    for (char **e = environ; *e; e++)
        ninherit++;
    char **env = calloc(ninherit + N_OWN + 1, sizeof *env);
    if (!env)
        return -ENOMEM;
    for (char **e = environ; *e; e++) {
        if (is_own(*e))
            continue;
        if (!(env[n] = strdup(*e))) {
            rc = -ENOMEM;
            goto out;
        }
        n++;
    }
    CH_CHECK_GOTO(env_add_u64(env, &n, "RANK", s->rank), rc, out);
    CH_CHECK_GOTO(env_add_u64(env, &n, "WORLD_SIZE", s->world_size), rc, out);
    CH_CHECK_GOTO(env_add_u64(env, &n, "LOCAL_RANK", s->local_rank), rc, out);
    CH_CHECK_GOTO(env_add_u64(env, &n, "LOCAL_WORLD_SIZE", s->local_world), rc, out);
    CH_CHECK_GOTO(env_add(env, &n, "CHORUS_JOB", s->job_id ? s->job_id : ""), rc, out);
    CH_CHECK_GOTO(env_add_u64(env, &n, "CHORUS_GENERATION", s->generation), rc, out);
    CH_CHECK_GOTO(env_add(env, &n, "CHORUS_JOB_FILE", s->job_file ? s->job_file : ""), rc, out);
    CH_CHECK_GOTO(env_add(env, &n, "CHORUS_RUN_DIR", s->run_dir ? s->run_dir : ""), rc, out);
    CH_CHECK_GOTO(env_add_u64(env, &n, "CHORUS_RESUME_STEP", s->resume_step), rc, out);
    CH_CHECK_GOTO(env_add(env, &n, "CHORUS_DEVICE", ch_device_name(s->device)), rc, out);
    if (s->threads > 0)
        CH_CHECK_GOTO(env_add_u64(env, &n, "CHORUS_THREADS", s->threads), rc, out);
    if (s->memory_dir)
        CH_CHECK_GOTO(env_add(env, &n, "CHORUS_MEMORY_DIR", s->memory_dir), rc, out);
    if (s->node)
        CH_CHECK_GOTO(env_add(env, &n, "CHORUS_NODE", s->node), rc, out);
    /* A rank either dies with workerd (it checks CHORUS_PARENT_PID) or outlives it and
     * redials CHORUS_AGENT_SOCK (proc.h). */
    if (s->agent_sock)
        CH_CHECK_GOTO(env_add(env, &n, "CHORUS_AGENT_SOCK", s->agent_sock), rc, out);
    else
        CH_CHECK_GOTO(env_add_u64(env, &n, "CHORUS_PARENT_PID", (uint64_t)getpid()), rc, out);
    /* Each slot is one thread: the rank's BLAS and OpenMP must not fan out. */
    CH_CHECK_GOTO(env_add(env, &n, "OPENBLAS_NUM_THREADS", "1"), rc, out);
    CH_CHECK_GOTO(env_add(env, &n, "OMP_NUM_THREADS", "1"), rc, out);
out:
    if (rc < 0) {
        env_free(env);
        return rc;
    }
    *out = env;
    return 0;
}

static void free_proc(uv_handle_t *h)
{
    free(h->data);
}

static void on_child_exit(uv_process_t *h, int64_t exit_status, int term_signal)
{
    wrk_proc_t *p = h->data;
    p->exited = 1;
    /* Helpers the rank left behind in its group go with it. */
    if (p->pid > 0)
        kill(-p->pid, SIGKILL);
    if (p->closing) {
        uv_close((uv_handle_t *)h, free_proc);
        return;
    }
    if (p->cb)
        p->cb(p, term_signal ? 0 : (int)exit_status, term_signal, p->ud);
}

int wrk_proc_rank_exe(char *path, size_t n)
{
    char self[4096];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len < 0)
        return -errno;
    self[len] = 0;
    char *slash = strrchr(self, '/');
    if (slash)
        *slash = 0;
    int w = snprintf(path, n, "%s/%s", slash ? self : ".", WRK_RANK_EXE);
    if (w < 0 || (size_t)w >= n)
        return -ENAMETOOLONG;
    return access(path, X_OK) == 0 ? 0 : -errno;
}

/* Whom the rank runs as: the job file's run_uid/run_gid, -1 when unset (as workerd). */
static int run_identity(const char *job_file, int64_t *uid, int64_t *gid)
{
    char *text = NULL, err[256];
    size_t len = 0;
    ch_jobspec_t *spec = malloc(sizeof *spec);
    *uid = *gid = -1;
    if (!spec)
        return -ENOMEM;
    int rc = ch_file_read(job_file, 1u << 20, &text, &len);
    if (rc == 0)
        rc = ch_jobspec_parse(text, spec, err, sizeof err);
    if (rc == 0) {
        *uid = spec->run_as.uid;
        *gid = spec->run_as.gid;
    }
    free(text);
    free(spec);
    return rc;
}

int wrk_proc_give_dir(const char *job_file, const char *dir)
{
    int64_t uid = -1, gid = -1;
    if (chmod(dir, 0700) < 0 || chmod(job_file, 0600) < 0)
        return -errno;
    int rc = run_identity(job_file, &uid, &gid);
    if (rc < 0 || uid < 0 || gid < 0 || (uid_t)uid == geteuid() || geteuid() != 0)
        return rc;
    if (chown(dir, (uid_t)uid, (gid_t)gid) < 0 || chown(job_file, (uid_t)uid, (gid_t)gid) < 0)
        return -errno;
    return 0;
}

/* Switch the child to the job's user when it is not workerd's own; its run dir is made
 * here and given to it, since the job's directory belongs to workerd. */
static int set_identity(const wrk_proc_spec_t *spec, uv_process_options_t *o)
{
    int64_t uid = -1, gid = -1;
    if (!spec->job_file)
        return 0;
    int rc = run_identity(spec->job_file, &uid, &gid);
    if (rc == -ENOENT)
        return 0; /* no job file (tests): the program needs none */
    if (rc < 0 || uid < 0 || (uid_t)uid == geteuid())
        return rc;
    if (geteuid() != 0)
        return -EPERM;
    if (gid < 0)
        return -EINVAL;
    if (spec->run_dir) {
        if (mkdir(spec->run_dir, 0700) < 0 && errno != EEXIST)
            return -errno;
        if (chown(spec->run_dir, (uid_t)uid, (gid_t)gid) < 0)
            return -errno;
    }
    o->flags |= UV_PROCESS_SETUID | UV_PROCESS_SETGID; /* libuv drops supplementary groups */
    o->uid = (uv_uid_t)uid;
    o->gid = (uv_gid_t)gid;
    return 0;
}

int wrk_proc_spawn(uv_loop_t *loop, const wrk_proc_spec_t *spec, wrk_proc_exit_cb cb, void *ud,
                   wrk_proc_t **out, int *link_fd)
{
    int sv[2] = {-1, -1}, logfd = -1, rc;
    char **env = NULL;
    wrk_proc_t *p = NULL;
    const char *exe = spec->exe;
    char ident[128];
    /* The second word is only for ps/top: which rank this is. */
    char *default_argv[] = {WRK_RANK_EXE, ident, NULL};

    if (!spec->log_path || !exe)
        return -EINVAL;
    snprintf(ident, sizeof ident, "%s:g%" PRIu64 ":r%u", spec->job_id ? spec->job_id : "",
             spec->generation, spec->rank);
    if (!(p = calloc(1, sizeof *p)))
        return -ENOMEM;
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
        rc = -errno;
        goto out;
    }
    logfd = open(spec->log_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (logfd < 0) {
        rc = -errno;
        goto out;
    }
    CH_CHECK_GOTO(env_build(spec, &env), rc, out);

    uv_stdio_container_t stdio[4];
    stdio[0].flags = UV_IGNORE; /* /dev/null */
    stdio[1].flags = UV_INHERIT_FD;
    stdio[1].data.fd = logfd;
    stdio[2].flags = UV_INHERIT_FD;
    stdio[2].data.fd = logfd;
    stdio[3].flags = UV_INHERIT_FD;
    stdio[3].data.fd = sv[1];

    uv_process_options_t o;
    memset(&o, 0, sizeof o);
    o.exit_cb = on_child_exit;
    o.file = exe;
    o.args = spec->argv ? (char **)spec->argv : default_argv;
    o.env = env;
    o.flags = UV_PROCESS_DETACHED; /* setsid: own session and process group */
    o.stdio_count = 4;
    o.stdio = stdio;
    CH_CHECK_GOTO(set_identity(spec, &o), rc, out);
    /* The log is the rank's user's, and only theirs (0600). */
    if ((o.flags & UV_PROCESS_SETUID) && fchown(logfd, (uid_t)o.uid, (gid_t)o.gid) < 0) {
        rc = -errno;
        goto out;
    }

    p->handle.data = p;
    p->cb = cb;
    p->ud = ud;
    rc = uv_spawn(loop, &p->handle, &o);
    if (rc < 0) {
        rc = ch_err_from_uv(rc);
        /* libuv initialised the handle; it must be closed before its memory goes. */
        uv_close((uv_handle_t *)&p->handle, free_proc);
        p = NULL;
        goto out;
    }
    p->pid = p->handle.pid;
    *out = p;
    *link_fd = sv[0];
    sv[0] = -1;
    p = NULL;
out:
    env_free(env);
    if (logfd >= 0)
        close(logfd);
    if (sv[1] >= 0)
        close(sv[1]);
    if (sv[0] >= 0)
        close(sv[0]);
    free(p);
    return rc < 0 ? rc : 0;
}

int wrk_proc_pid(const wrk_proc_t *p)
{
    return p->pid;
}

int wrk_proc_exited(const wrk_proc_t *p)
{
    return p->exited;
}

int wrk_proc_kill(wrk_proc_t *p, int sig)
{
    if (p->exited || p->pid <= 0)
        return -ESRCH;
    if (kill(-p->pid, sig) == 0)
        return 0;
    /* Not a group leader yet (between fork and setsid): the process itself. */
    if (kill(p->pid, sig) == 0)
        return 0;
    return -errno;
}

void wrk_proc_close(wrk_proc_t *p)
{
    if (!p || p->closing)
        return;
    p->closing = 1;
    if (p->exited) {
        uv_close((uv_handle_t *)&p->handle, free_proc);
        return;
    }
    /* Keep the handle until the child is reaped, so no zombie is left. */
    wrk_proc_kill(p, SIGKILL);
}

void wrk_proc_release(wrk_proc_t *p)
{
    if (!p || p->closing)
        return;
    p->closing = 1;
    uv_close((uv_handle_t *)&p->handle, free_proc);
}
