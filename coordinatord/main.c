/* coordinatord: the Chorus cluster coordinator (DESIGN §1, §4).
 *
 *   coordinatord [--config FILE] [--listen HOST:PORT] [--ctl-socket PATH] [--state-dir DIR]
 *                [--key FILE] [--metrics HOST:PORT] [--heartbeat-ms N] [--dead-after-ms N]
 *                [--ctl-group GROUP] [--grace-ms N] [--log-level LEVEL]
 *
 * Exit codes: 0 after SIGTERM/SIGINT, 78 for a configuration problem (bad option, key
 * file missing or readable by others), 1 when the daemon cannot start (port in use...). */
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "common/err.h"
#include "common/log.h"
#include "coord.h"
#include "runs.h"

#define EXIT_CONFIG 78

#define OPT(name, type, field, def, help)                                                          \
    {                                                                                              \
        name, type, offsetof(coord_cfg_t, field), def, help                                        \
    }

static const ch_opt_t OPTIONS[] = {
    OPT("listen", CH_OPT_STR, listen, "0.0.0.0:7070",
        "TCP address for workers and remote chorusctl (port 0: ephemeral)"),
    OPT("ctl-socket", CH_OPT_STR, ctl_socket, "/run/chorus/ctl.sock",
        "Unix control socket for chorusctl (\"\" disables)"),
    OPT("state-dir", CH_OPT_STR, state_dir, "/var/lib/chorus",
        "state directory: state.db, coordinatord.addr"),
    OPT("key", CH_OPT_STR, key, "/etc/chorus/cluster.key",
        "cluster key file (mode 0600 or 0400; chorusctl keygen)"),
    OPT("metrics", CH_OPT_STR, metrics, NULL,
        "HOST:PORT serving the read-only status page (/, /jobs/ID) and Prometheus text "
        "(/metrics) (\"\" disables)"),
    OPT("heartbeat-ms", CH_OPT_INT, heartbeat_ms, "1000", "heartbeat interval asked of workers"),
    OPT("dead-after-ms", CH_OPT_INT, dead_after_ms, "5000",
        "a node without heartbeat for this long is dead"),
    OPT("forget-dead-after-ms", CH_OPT_INT, forget_dead_after_ms, "86400000",
        "a node dead this long, with no ranks of an active job, is forgotten (0: never)"),
    OPT("run-as-user", CH_OPT_STR, run_as_user, "chorus-jobs",
        "user whom root's jobs run as: a system user of their own (deploy/install.sh makes "
        "chorus-jobs); the daemon refuses to start when it does not exist (\"\": refuse "
        "root's jobs unless allow-root-jobs)"),
    OPT("allow-root-jobs", CH_OPT_BOOL, allow_root_jobs, "no",
        "let jobs submitted by root run as root"),
    OPT("admin-group", CH_OPT_STR, admin_group, NULL,
        "group whose members may cancel any job (root and the daemon's user always may)"),
    OPT("ctl-group", CH_OPT_STR, ctl_group, NULL,
        "group whose members may use the control socket (besides root and the daemon's user)"),
    OPT("grace-ms", CH_OPT_INT, grace_ms, "3000",
        "after a restart, how long running jobs wait for their ranks to be re-reported"),
    OPT("max-queued-jobs", CH_OPT_INT, max_queued_jobs, "1000",
        "jobs one user may have queued (0: no limit; root and admin-group are exempt)"),
    OPT("group-max-queued-jobs", CH_OPT_INT, group_max_queued_jobs, "0",
        "jobs the users of one primary group may have queued together (0: no limit)"),
    OPT("max-running-ranks", CH_OPT_INT, max_running_ranks, "0",
        "ranks one user's jobs may run at once; more wait (0: no limit)"),
    OPT("max-submits-per-minute", CH_OPT_INT, max_submits_per_minute, "120",
        "submissions one user may make per minute (0: no limit)"),
    OPT("fairshare-halflife-s", CH_OPT_INT, fairshare_halflife_s, "3600",
        "half-life of the usage (rank-seconds) that orders users' queued jobs"),
    OPT("launch-tokens", CH_OPT_BOOL, launch_tokens, "yes",
        "rank reports and re-adoption must present the token their StartRanks carried "
        "(\"no\" only for workerds that predate tokens)"),
    OPT("log-level", CH_OPT_STR, log_level, "info", "error, warn, info or debug"),
    {0},
};

typedef struct daemon {
    coord_t c;
    uv_signal_t sig[3]; /* SIGTERM, SIGINT, SIGUSR1 */
    int sig_open;
} daemon_t;

static void close_signals(daemon_t *d)
{
    if (!d->sig_open)
        return;
    d->sig_open = 0;
    uv_close((uv_handle_t *)&d->sig[0], NULL);
    uv_close((uv_handle_t *)&d->sig[1], NULL);
    uv_close((uv_handle_t *)&d->sig[2], NULL);
}

/* SIGUSR1 (what sbatch --signal=B:USR1@T sends before a walltime ends): every running
 * train job commits a checkpoint at its next step. */
static void on_usr1(uv_signal_t *h, int signum)
{
    daemon_t *d = h->data;
    (void)signum;
    CH_LOGI("main", "SIGUSR1: a checkpoint of every running job at its next step");
    coord_runs_checkpoint_all(&d->c);
}

static void on_signal(uv_signal_t *h, int signum)
{
    daemon_t *d = h->data;
    CH_LOGI("main", "%s: shutting down", signum == SIGTERM ? "SIGTERM" : "SIGINT");
    close_signals(d);
    coord_stop(&d->c);
}

static int check_cfg(const coord_cfg_t *cfg, char *err, size_t errlen)
{
    if (cfg->heartbeat_ms < 10 || cfg->heartbeat_ms > 600000) {
        snprintf(err, errlen, "heartbeat-ms: %ld out of range 10..600000", cfg->heartbeat_ms);
        return CH_E_CONFIG;
    }
    if (cfg->dead_after_ms <= cfg->heartbeat_ms) {
        snprintf(err, errlen, "dead-after-ms: %ld must exceed heartbeat-ms %ld", cfg->dead_after_ms,
                 cfg->heartbeat_ms);
        return CH_E_CONFIG;
    }
    if (cfg->forget_dead_after_ms < 0) {
        snprintf(err, errlen, "forget-dead-after-ms: %ld must not be negative",
                 cfg->forget_dead_after_ms);
        return CH_E_CONFIG;
    }
    if (cfg->grace_ms < 0) {
        snprintf(err, errlen, "grace-ms: %ld must not be negative", cfg->grace_ms);
        return CH_E_CONFIG;
    }
    if (cfg->max_queued_jobs < 0 || cfg->group_max_queued_jobs < 0 || cfg->max_running_ranks < 0 ||
        cfg->max_submits_per_minute < 0 || cfg->fairshare_halflife_s < 1) {
        snprintf(err, errlen,
                 "max-queued-jobs, group-max-queued-jobs, max-running-ranks, "
                 "max-submits-per-minute: 0 or more; fairshare-halflife-s: 1 or more");
        return CH_E_CONFIG;
    }
    if (!cfg->state_dir[0]) {
        snprintf(err, errlen, "state-dir: must not be empty");
        return CH_E_CONFIG;
    }
    return 0;
}

int main(int argc, char **argv)
{
    static coord_cfg_t cfg; /* large: keep it off the stack */
    static daemon_t d;
    char err[512] = "";
    ch_key_t key;
    ch_log_level_t level = CH_LOG_INFO;
    uv_loop_t loop;

    ch_log_init("coordinatord");
    int rc = ch_config_load(OPTIONS, "coordinatord", &cfg, argc, argv, err, sizeof(err));
    if (rc == 1) {
        ch_config_usage(stdout, "coordinatord", OPTIONS);
        return 0;
    }
    if (rc == 2) {
        ch_config_version(stdout, "coordinatord");
        return 0;
    }
    if (rc == 0)
        rc = check_cfg(&cfg, err, sizeof(err));
    if (rc == 0 && ch_log_level_parse(cfg.log_level, &level) < 0) {
        snprintf(err, sizeof(err), "log-level: unknown level \"%s\"", cfg.log_level);
        rc = CH_E_CONFIG;
    }
    if (rc < 0) {
        fprintf(stderr, "coordinatord: %s\n", err);
        return EXIT_CONFIG;
    }
    ch_log_set_level(level);
    if (ch_auth_global_init() < 0) {
        CH_LOGE("main", "libsodium initialisation failed");
        return 1;
    }
    rc = ch_key_load(cfg.key, &key);
    if (rc < 0) {
        CH_LOGE("main", "key file %s: %s%s", cfg.key, ch_strerror(rc),
                rc == CH_E_KEYPERM ? " (chmod 600 it; owner: this user or root)"
                : rc == -ENOENT    ? " (create one with: chorusctl keygen FILE)"
                                   : "");
        return EXIT_CONFIG;
    }
    signal(SIGPIPE, SIG_IGN);
    uv_loop_init(&loop);
    rc = coord_init(&d.c, &loop, &cfg, &key);
    explicit_bzero(&key, sizeof(key));
    if (rc < 0) {
        uv_loop_close(&loop);
        return rc == CH_E_CONFIG ? EXIT_CONFIG : 1;
    }
    for (int i = 0; i < 2; i++) {
        uv_signal_init(&loop, &d.sig[i]);
        d.sig[i].data = &d;
        uv_signal_start(&d.sig[i], on_signal, i == 0 ? SIGTERM : SIGINT);
    }
    uv_signal_init(&loop, &d.sig[2]);
    d.sig[2].data = &d;
    uv_signal_start(&d.sig[2], on_usr1, SIGUSR1);
    d.sig_open = 1;
    rc = coord_start(&d.c);
    if (rc < 0) {
        close_signals(&d);
        coord_stop(&d.c);
    }
    uv_run(&loop, UV_RUN_DEFAULT); /* until coord_stop closed every handle */
    coord_fini(&d.c);
    if (uv_loop_close(&loop) != 0)
        CH_LOGW("main", "event loop closed with handles still open");
    if (rc < 0) {
        CH_LOGE("main", "cannot start: %s", ch_strerror(rc));
        return rc == CH_E_CONFIG ? EXIT_CONFIG : 1;
    }
    CH_LOGI("main", "stopped");
    return 0;
}
