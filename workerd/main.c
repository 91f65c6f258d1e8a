/* workerd: the node agent (DESIGN §1, §10, §11). Reads its config table, loads the
 * cluster key, runs the agent (agent.h) on a libuv loop, and talks to systemd
 * (Type=notify: READY=1 after the first registration, WATCHDOG=1 from a loop timer).
 * Rank processes are the sibling binary chorus-rank (workerd/rank/); workerd itself links
 * no compute or transport library, so it outlives every rank crash.
 *
 * Exit codes: 0 clean stop (SIGTERM/SIGINT), 1 runtime failure, 78 configuration error
 * (bad flag or value, missing or loosely permitted key). */
#include <errno.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <uv.h>

#include "chorus/config.h"
#include "common/auth.h"
#include "common/config.h"
#include "common/err.h"
#include "common/gpus.h"
#include "common/log.h"
#include "common/notify.h"
#include "common/util.h"
#include "workerd/agent.h"
#include "workerd/metrics.h"
#include "workerd/proc.h"

#define EXIT_CONFIG       78
#define SHUTDOWN_GRACE_MS 5000

typedef struct wrkd_cfg {
    char coordinator[CH_OPT_STRLEN];
    char name[CH_OPT_STRLEN];
    char slots[CH_OPT_STRLEN];
    long memory_mib;
    long threads;
    long progress_ms, progress_detail_every;
    char rack[CH_OPT_STRLEN];
    char key[CH_OPT_STRLEN];
    char run_dir[CH_OPT_STRLEN];
    char memory_dir[CH_OPT_STRLEN];
    char device[CH_OPT_STRLEN];
    char log_level[CH_OPT_STRLEN];
    char metrics_address[CH_OPT_STRLEN];
    long metrics_port;
    int keep_ranks;
} wrkd_cfg_t;

static const ch_opt_t options[] = {
    {"coordinator", CH_OPT_STR, offsetof(wrkd_cfg_t, coordinator), NULL,
     "coordinatord address HOST:PORT (required)"},
    {"name", CH_OPT_STR, offsetof(wrkd_cfg_t, name), NULL, "node name (default: the hostname)"},
    {"slots", CH_OPT_STR, offsetof(wrkd_cfg_t, slots), "1",
     "rank processes this node runs: N, or auto (one per visible GPU on a cuda node, 1 on cpu)"},
    {"memory-mib", CH_OPT_INT, offsetof(wrkd_cfg_t, memory_mib), "0",
     "memory the node reports for admission, MiB; 0: MemTotal of /proc/meminfo"},
    {"threads", CH_OPT_INT, offsetof(wrkd_cfg_t, threads), "0",
     "compute threads per rank; 0: the node's cores shared by the job's ranks on it"},
    {"progress-ms", CH_OPT_INT, offsetof(wrkd_cfg_t, progress_ms), "1000",
     "the ranks' progress goes to the coordinator as one message per node this often (a "
     "report waits at most this + 100 ms; rank 0's, failures, exits, checkpoints go at once); "
     "0: each report at once"},
    {"progress-detail-every", CH_OPT_INT, offsetof(wrkd_cfg_t, progress_detail_every), "10",
     "every rank's full report (time breakdown, memory) every N progress intervals; 0: only "
     "when the coordinator asks (status --ranks, the status page)"},
    {"rack", CH_OPT_STR, offsetof(wrkd_cfg_t, rack), "default", "rack label for placement"},
    {"key", CH_OPT_STR, offsetof(wrkd_cfg_t, key), "/etc/chorus/cluster.key",
     "cluster key file (mode 0600 or 0400)"},
    {"run-dir", CH_OPT_STR, offsetof(wrkd_cfg_t, run_dir), "/var/lib/chorus/run",
     "job files, rank scratch dirs and rank logs"},
    {"memory-dir", CH_OPT_STR, offsetof(wrkd_cfg_t, memory_dir), "/dev/shm/chorus",
     "in-memory checkpoints (checkpoint.memory_every), per job and rank: survives a rank, "
     "not the node"},
    {"device", CH_OPT_STR, offsetof(wrkd_cfg_t, device), "cpu",
     "cpu | cuda | auto (cuda when the driver lists a visible GPU and this build has CUDA)"},
    {"log-level", CH_OPT_STR, offsetof(wrkd_cfg_t, log_level), "info",
     "error | warn | info | debug"},
    {"metrics-address", CH_OPT_STR, offsetof(wrkd_cfg_t, metrics_address), "127.0.0.1",
     "IP address of /metrics and /healthz (see metrics-port)"},
    {"metrics-port", CH_OPT_INT, offsetof(wrkd_cfg_t, metrics_port), "0",
     "TCP port of workerd's Prometheus /metrics and /healthz; 0: not served"},
    {"keep-ranks", CH_OPT_BOOL, offsetof(wrkd_cfg_t, keep_ranks), "no",
     "on SIGTERM (systemctl stop or restart) leave the ranks running for the next workerd on "
     "this run-dir, which re-adopts them; a rank no workerd takes back within 60 s exits. "
     "SIGINT always kills them"},
    {NULL, 0, 0, NULL, NULL},
};

typedef struct workerd {
    uv_loop_t loop;
    wrkd_cfg_t cfg;
    ch_key_t key;
    wrk_agent_t *agent;
    wrk_metrics_t *metrics; /* NULL when metrics-port is 0 */
    int gpus;               /* visible to the ranks, for /metrics */
    uv_signal_t sigterm, sigint;
    uv_timer_t watchdog, grace;
} workerd_t;

static void on_watchdog(uv_timer_t *t)
{
    (void)t;
    ch_notify("WATCHDOG=1");
}

static void on_registered(void *ud, int first)
{
    workerd_t *w = ud;
    char status[2 * CH_OPT_STRLEN + 64];
    (void)first;
    snprintf(status, sizeof status, "STATUS=registered with %s as %s", w->cfg.coordinator,
             w->cfg.name);
    ch_notify(status);
}

/* Ready once started, not once registered: a node whose head is down (or not yet up) must
 * not hold `systemctl enable --now` until the start times out; the status line says what
 * it waits for, and on_registered replaces it. */
static void notify_started(const workerd_t *w)
{
    char status[CH_OPT_STRLEN + 64];
    snprintf(status, sizeof status, "STATUS=waiting for coordinator %s", w->cfg.coordinator);
    ch_notify(status);
    ch_notify("READY=1");
}

// ----------------------------------------------------------------------------
// shutdown

static void on_grace(uv_timer_t *t)
{
    CH_LOGW("workerd", "shutdown: ranks not reaped after %d ms; leaving", SHUTDOWN_GRACE_MS);
    uv_stop(t->loop);
}

static void on_signal(uv_signal_t *s, int signum)
{
    workerd_t *w = s->data;
    int leave = signum == SIGTERM && w->cfg.keep_ranks;
    CH_LOGI("workerd", "node=%s: signal %d: stopping, %s %u ranks", w->cfg.name, signum,
            leave ? "leaving running (--keep-ranks)" : "killing", wrk_agent_ranks_alive(w->agent));
    ch_notify("STOPPING=1");
    if (leave)
        wrk_agent_detach(w->agent);
    else
        wrk_agent_stop(w->agent);
    wrk_metrics_stop(w->metrics);
    w->metrics = NULL;
    uv_close((uv_handle_t *)&w->sigterm, NULL);
    uv_close((uv_handle_t *)&w->sigint, NULL);
    uv_close((uv_handle_t *)&w->watchdog, NULL);
    /* A bound on waiting for the ranks; unref'd so it does not itself hold the loop. */
    uv_timer_start(&w->grace, on_grace, SHUTDOWN_GRACE_MS, 0);
    uv_unref((uv_handle_t *)&w->grace);
}

// ----------------------------------------------------------------------------
// configuration

/* device = cpu | cuda | auto and slots = N | auto, resolved against what the NVIDIA driver
 * lists (gpus.h) and what this build has (chorus/config.h), into *dev and *slots;
 * *visible: the GPUs visible to it. */
static int resolve_device(const wrkd_cfg_t *c, ch_device_t *dev, long *slots, int *visible)
{
    const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
    int gpus = ch_gpus_visible(ch_gpus_present(CH_GPUS_PROC_DIR), cvd);
    *visible = gpus;

    if (strcmp(c->device, "auto") == 0) {
        if (gpus > 0 && !CHORUS_HAVE_CUDA)
            CH_LOGW("workerd",
                    "--device auto: %d GPU(s) visible, but this workerd was built "
                    "without CUDA/NCCL: the node runs cpu ranks",
                    gpus);
        *dev = gpus > 0 && CHORUS_HAVE_CUDA ? CH_DEVICE_CUDA : CH_DEVICE_CPU;
        CH_LOGI("workerd", "--device auto: %s (%d GPU(s) visible)", ch_device_name(*dev), gpus);
    } else if (ch_device_parse(c->device, dev) < 0) {
        CH_LOGE("workerd", "--device: expected cpu, cuda or auto, got '%s'", c->device);
        return CH_E_CONFIG;
    }
    int cuda = *dev == CH_DEVICE_CUDA;
    if (!CHORUS_HAVE_CUDA && cuda) {
        CH_LOGE("workerd", "--device cuda: this workerd was built without CUDA/NCCL "
                           "(rebuild where the CUDA toolkit and NCCL are installed)");
        return CH_E_CONFIG;
    }
    if (strcmp(c->slots, "auto") == 0) {
        if (cuda && gpus == 0) {
            CH_LOGE("workerd", "--slots auto: no GPU visible (%s lists none%s%s); set --slots N",
                    CH_GPUS_PROC_DIR, cvd ? ", CUDA_VISIBLE_DEVICES=" : "", cvd ? cvd : "");
            return CH_E_CONFIG;
        }
        *slots = cuda ? gpus : 1;
        return 0;
    }
    char *end = NULL;
    errno = 0;
    *slots = strtol(c->slots, &end, 10);
    if (errno || end == c->slots || *end || *slots < 1 || *slots > 4096) {
        CH_LOGE("workerd", "--slots: expected 1..4096 or auto, got '%s'", c->slots);
        return CH_E_CONFIG;
    }
    if (cuda && gpus > 0 && *slots > gpus)
        CH_LOGW("workerd",
                "--slots %ld on a cuda node with %d visible GPU(s): ranks will share "
                "GPUs",
                *slots, gpus);
    return 0;
}

static int check_config(workerd_t *w, wrk_agent_cfg_t *ac)
{
    wrkd_cfg_t *c = &w->cfg;
    ch_log_level_t lvl;
    int rc;

    if (ch_log_level_parse(c->log_level, &lvl) < 0) {
        CH_LOGE("workerd", "--log-level: expected error|warn|info|debug, got '%s'", c->log_level);
        return CH_E_CONFIG;
    }
    ch_log_set_level(lvl);
    setenv("CHORUS_LOG_LEVEL", c->log_level, 1); /* the ranks log at the same level */
    char exe[CH_PATH_LEN];
    if ((rc = wrk_proc_rank_exe(exe, sizeof exe)) < 0) {
        CH_LOGE("workerd", "the rank binary %s: %s (install it next to workerd)", exe,
                ch_strerror(rc));
        return CH_E_CONFIG;
    }
    if (!c->coordinator[0]) {
        CH_LOGE("workerd", "--coordinator HOST:PORT is required");
        return CH_E_CONFIG;
    }
    if (ch_parse_hostport(c->coordinator, ac->host, sizeof ac->host, &ac->port) < 0) {
        CH_LOGE("workerd", "--coordinator: expected HOST:PORT, got '%s'", c->coordinator);
        return CH_E_CONFIG;
    }
    if (!c->name[0] && gethostname(c->name, sizeof c->name - 1) < 0) {
        CH_LOGE("workerd", "--name not given and gethostname failed");
        return CH_E_CONFIG;
    }
    if (c->threads < 0 || c->threads > 1024) {
        CH_LOGE("workerd", "--threads: expected 0..1024, got %ld", c->threads);
        return CH_E_CONFIG;
    }
    long slots = 0;
    if ((rc = resolve_device(c, &ac->device, &slots, &w->gpus)) < 0)
        return rc;
    if (c->metrics_port < 0 || c->metrics_port > 65535) {
        CH_LOGE("workerd", "--metrics-port: expected 0..65535, got %ld", c->metrics_port);
        return CH_E_CONFIG;
    }
    struct sockaddr_in6 sa;
    if (uv_ip4_addr(c->metrics_address, 0, (struct sockaddr_in *)&sa) != 0 &&
        uv_ip6_addr(c->metrics_address, 0, &sa) != 0) {
        CH_LOGE("workerd", "--metrics-address: expected an IP address, got '%s'",
                c->metrics_address);
        return CH_E_CONFIG;
    }
    rc = ch_key_load(c->key, &w->key);
    if (rc < 0) {
        CH_LOGE("workerd", "key %s: %s%s", c->key, ch_strerror(rc),
                rc == CH_E_KEYPERM ? " (chmod 600 it; owner: this user or root)" : "");
        return CH_E_CONFIG;
    }
    rc = ch_mkdirs(c->run_dir, 0755);
    if (rc < 0) {
        CH_LOGE("workerd", "--run-dir %s: %s", c->run_dir, ch_strerror(rc));
        return CH_E_CONFIG;
    }
    snprintf(ac->name, sizeof ac->name, "%s", c->name);
    snprintf(ac->rack, sizeof ac->rack, "%s", c->rack);
    snprintf(ac->run_dir, sizeof ac->run_dir, "%s", c->run_dir);
    snprintf(ac->memory_dir, sizeof ac->memory_dir, "%s", c->memory_dir);
    ac->keep_ranks = c->keep_ranks;
    /* ranks run as their job's user and make their job's folder here, as in /tmp */
    int mrc = ch_mkdirs(c->memory_dir, 0755);
    if (mrc < 0) {
        CH_LOGW("workerd", "--memory-dir %s: %s: in-memory checkpoints off", c->memory_dir,
                ch_strerror(mrc));
        ac->memory_dir[0] = '\0';
    } else if (chmod(c->memory_dir, 01777) < 0 && access(c->memory_dir, W_OK) < 0) {
        CH_LOGW("workerd", "--memory-dir %s: not writable for every job's user: %s", c->memory_dir,
                strerror(errno));
    }
    ac->slots = (uint32_t)slots;
    if (c->memory_mib < 0 || c->memory_mib > (1l << 40)) {
        CH_LOGE("workerd", "--memory-mib: expected 0..%ld, got %ld", 1l << 40, c->memory_mib);
        return CH_E_CONFIG;
    }
    ac->memory_bytes = (uint64_t)c->memory_mib << 20;
    ac->threads = (uint32_t)c->threads;
    if (c->progress_ms < 0 || c->progress_ms > 60000 || c->progress_detail_every < 0 ||
        c->progress_detail_every > 1000000) {
        CH_LOGE("workerd", "--progress-ms: expected 0..60000, --progress-detail-every 0..1000000");
        return CH_E_CONFIG;
    }
    ac->progress_ms = (uint32_t)c->progress_ms;
    ac->progress_detail_every = (uint32_t)c->progress_detail_every;
    ac->key = &w->key;
    ac->registered_cb = on_registered;
    ac->ud = w;
    return 0;
}

// ----------------------------------------------------------------------------

static int run(workerd_t *w, const wrk_agent_cfg_t *ac)
{
    int rc = uv_loop_init(&w->loop);
    if (rc < 0) {
        CH_LOGE("workerd", "event loop: %s", ch_strerror(ch_err_from_uv(rc)));
        return 1;
    }
    rc = wrk_agent_create(&w->loop, ac, &w->agent);
    if (rc < 0) {
        CH_LOGE("workerd", "agent: %s", ch_strerror(rc));
        uv_loop_close(&w->loop);
        return 1;
    }
    uv_signal_init(&w->loop, &w->sigterm);
    uv_signal_init(&w->loop, &w->sigint);
    uv_timer_init(&w->loop, &w->watchdog);
    uv_timer_init(&w->loop, &w->grace);
    w->sigterm.data = w->sigint.data = w;
    uv_signal_start(&w->sigterm, on_signal, SIGTERM);
    uv_signal_start(&w->sigint, on_signal, SIGINT);
    uint64_t wd = 0;
    (void)ch_notify_watchdog_usec(&wd);
    if (wd) {
        uint64_t period = wd / 2000 ? wd / 2000 : 1; /* half the timeout, in ms */
        uv_timer_start(&w->watchdog, on_watchdog, period, period);
    }
    CH_LOGI("workerd", "node=%s slots=%u rack=%s device=%s coordinator=%s run-dir=%s", ac->name,
            ac->slots, ac->rack, ch_device_name(ac->device), w->cfg.coordinator, ac->run_dir);
    if (w->cfg.metrics_port) {
        wrk_metrics_src_t src = {.agent = w->agent,
                                 .node = ac->name,
                                 .device = ch_device_name(ac->device),
                                 .gpus = w->gpus};
        rc = wrk_metrics_start(&w->loop, w->cfg.metrics_address, (int)w->cfg.metrics_port, &src,
                               &w->metrics);
        if (rc < 0) {
            /* A node that trains but is not watched beats one that does not train. */
            CH_LOGE("workerd", "metrics on %s:%ld: %s; not served", w->cfg.metrics_address,
                    w->cfg.metrics_port, ch_strerror(rc));
            w->metrics = NULL;
        } else {
            CH_LOGI("workerd", "Prometheus metrics on http://%s:%d/metrics", w->cfg.metrics_address,
                    wrk_metrics_port(w->metrics));
        }
    }
    wrk_agent_start(w->agent);
    notify_started(w);
    uv_run(&w->loop, UV_RUN_DEFAULT);

    uv_close((uv_handle_t *)&w->grace, NULL);
    uv_run(&w->loop, UV_RUN_NOWAIT);
    if (uv_loop_close(&w->loop) == 0)
        wrk_agent_destroy(w->agent); /* otherwise handles still point into it */
    CH_LOGI("workerd", "node=%s: stopped", ac->name);
    return 0;
}

int main(int argc, char **argv)
{
    static workerd_t w; /* one per process; static only to keep 4 KiB of config off the stack */
    wrk_agent_cfg_t ac;
    char err[512] = "";
    int rc;

    signal(SIGPIPE, SIG_IGN);
    ch_log_init("workerd");
    rc = ch_config_load(options, "workerd", &w.cfg, argc, argv, err, sizeof err);
    if (rc == 1) {
        ch_config_usage(stdout, "workerd", options);
        return 0;
    }
    if (rc == 2) {
        ch_config_version(stdout, "workerd");
        return 0;
    }
    if (rc < 0) {
        fprintf(stderr, "workerd: %s\n", err[0] ? err : ch_strerror(rc));
        return EXIT_CONFIG;
    }
    if (ch_auth_global_init() < 0) {
        CH_LOGE("workerd", "libsodium initialisation failed");
        return 1;
    }
    memset(&ac, 0, sizeof ac);
    if (check_config(&w, &ac) < 0)
        return EXIT_CONFIG;
    return run(&w, &ac);
}
