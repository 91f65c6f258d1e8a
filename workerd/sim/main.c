/* chorus-simnode: N simulated workerd nodes in one process (sim.h, DESIGN §13), for
 * measuring coordinatord at scale (chorus-bench-scale, the scale test).
 *
 *   chorus-simnode --coordinator HOST:PORT --key FILE --nodes N [--slots S] [--racks R]
 *                  [--prefix P] [--step-ms MS] [--connect-ms MS] [--log-level L]
 *
 * Control interface: one command per line on stdin, one reply line on stdout ("ok",
 * "error <why>", or the answer), so a benchmark or test drives failures while it runs:
 *
 *   stats                 -> stats nodes=N registered=N ranks=N rdzv=N done=N min_step=N
 *                            max_step=N events=N kv_errors=N starts=N kills=N
 *                            heartbeats=N
 *   hang NODE             the node stops heartbeating and its ranks stop (link stays open);
 *                         replies "ok last_heartbeat_ms=T" (monotonic ms of its last message: each
 *                         counts as a heartbeat)
 *   crash NODE            the node's link closes for good, its ranks vanish
 *   disconnect NODE       the link closes; the node reconnects and re-registers its ranks
 *   revive NODE           a hung or crashed node comes back, freshly booted (no ranks)
 *   exit-rank JOB RANK CODE   that rank exits with CODE
 *   rank-node JOB RANK    -> the node running that rank
 *   node I                -> the name of node I
 *   quit                  stop (also on EOF of stdin, SIGTERM, SIGINT)
 *
 * 2,048 nodes need 2,048 sockets here and in coordinatord: the soft RLIMIT_NOFILE is
 * raised to the hard one at start, and the run refused when that is still too few.
 * Exit codes: 0 clean stop, 1 runtime failure, 78 configuration error. */
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <uv.h>

#include "common/auth.h"
#include "common/config.h"
#include "common/err.h"
#include "common/log.h"
#include "common/util.h"
#include "workerd/sim/sim.h"

#define EXIT_CONFIG 78
#define FD_SPARE    64 /* beyond one per node: stdio, the loop, libuv's own */
#define LINE_MAX_   512

typedef struct simd_cfg {
    char coordinator[CH_OPT_STRLEN];
    char key[CH_OPT_STRLEN];
    char prefix[CH_OPT_STRLEN];
    char log_level[CH_OPT_STRLEN];
    long nodes, slots, racks, step_ms, connect_ms, progress_ms, progress_detail_every;
} simd_cfg_t;

static const ch_opt_t options[] = {
    {"coordinator", CH_OPT_STR, offsetof(simd_cfg_t, coordinator), NULL,
     "coordinatord address HOST:PORT (required)"},
    {"key", CH_OPT_STR, offsetof(simd_cfg_t, key), "/etc/chorus/cluster.key",
     "cluster key file (mode 0600 or 0400)"},
    {"nodes", CH_OPT_INT, offsetof(simd_cfg_t, nodes), "16", "simulated nodes"},
    {"slots", CH_OPT_INT, offsetof(simd_cfg_t, slots), "8", "slots per node"},
    {"racks", CH_OPT_INT, offsetof(simd_cfg_t, racks), "1", "racks the nodes are split into"},
    {"prefix", CH_OPT_STR, offsetof(simd_cfg_t, prefix), "sim", "node names: PREFIX-00000..."},
    {"step-ms", CH_OPT_INT, offsetof(simd_cfg_t, step_ms), "1000", "simulated step time"},
    {"progress-ms", CH_OPT_INT, offsetof(simd_cfg_t, progress_ms), "0",
     "as workerd's progress-ms: one NodeProgress per node this often; 0: every report at once"},
    {"progress-detail-every", CH_OPT_INT, offsetof(simd_cfg_t, progress_detail_every), "10",
     "as workerd's: full per-rank reports every N intervals"},
    {"connect-ms", CH_OPT_INT, offsetof(simd_cfg_t, connect_ms), "0",
     "spread the first connects over this long"},
    {"log-level", CH_OPT_STR, offsetof(simd_cfg_t, log_level), "warn",
     "error | warn | info | debug"},
    {NULL, 0, 0, NULL, NULL},
};

typedef struct simd {
    uv_loop_t loop;
    wrk_sim_t *sim;
    uv_pipe_t in;
    uv_signal_t sigterm, sigint;
    char line[LINE_MAX_];
    size_t len;
    int stopping;
} simd_t;

static void stop(simd_t *d)
{
    if (d->stopping)
        return;
    d->stopping = 1;
    wrk_sim_stop(d->sim);
    uv_close((uv_handle_t *)&d->in, NULL);
    uv_close((uv_handle_t *)&d->sigterm, NULL);
    uv_close((uv_handle_t *)&d->sigint, NULL);
}

static void reply_rc(int rc)
{
    if (rc < 0)
        printf("error %s\n", ch_strerror(rc));
    else
        printf("ok\n");
}

static void command(simd_t *d, char *line)
{
    char verb[32] = "", a[128] = "", b[32] = "", c[32] = "";
    int n = sscanf(line, "%31s %127s %31s %31s", verb, a, b, c);
    if (n <= 0)
        return;
    if (strcmp(verb, "stats") == 0) {
        wrk_sim_stats_t st;
        wrk_sim_stats(d->sim, &st);
        printf("stats nodes=%u registered=%u ranks=%u rdzv=%u done=%u min_step=%llu "
               "max_step=%llu events=%llu kv_errors=%llu starts=%llu kills=%llu heartbeats=%llu\n",
               st.nodes, st.registered, st.ranks, st.rdzv_done, st.done,
               (unsigned long long)st.min_step, (unsigned long long)st.max_step,
               (unsigned long long)st.events_sent, (unsigned long long)st.kv_errors,
               (unsigned long long)st.start_msgs, (unsigned long long)st.kill_msgs,
               (unsigned long long)st.heartbeats_sent);
    } else if (strcmp(verb, "hang") == 0 && n >= 2) {
        uint64_t last = 0;
        int rc = wrk_sim_hang(d->sim, a, &last);
        if (rc == 0)
            printf("ok last_heartbeat_ms=%llu\n", (unsigned long long)last);
        else
            reply_rc(rc);
    } else if (strcmp(verb, "crash") == 0 && n >= 2) {
        reply_rc(wrk_sim_crash(d->sim, a));
    } else if (strcmp(verb, "disconnect") == 0 && n >= 2) {
        reply_rc(wrk_sim_disconnect(d->sim, a));
    } else if (strcmp(verb, "revive") == 0 && n >= 2) {
        reply_rc(wrk_sim_revive(d->sim, a));
    } else if (strcmp(verb, "exit-rank") == 0 && n >= 4) {
        reply_rc(wrk_sim_exit_rank(d->sim, a, (uint32_t)strtoul(b, NULL, 10), atoi(c)));
    } else if (strcmp(verb, "rank-node") == 0 && n >= 3) {
        const char *node = wrk_sim_rank_node(d->sim, a, (uint32_t)strtoul(b, NULL, 10));
        if (node)
            printf("%s\n", node);
        else
            reply_rc(CH_E_NOTFOUND);
    } else if (strcmp(verb, "node") == 0 && n >= 2) {
        const char *name = wrk_sim_node_name(d->sim, (uint32_t)strtoul(a, NULL, 10));
        if (*name)
            printf("%s\n", name);
        else
            reply_rc(CH_E_NOTFOUND);
    } else if (strcmp(verb, "quit") == 0) {
        printf("ok\n");
        stop(d);
    } else {
        printf("error unknown command \"%s\" (stats, hang, crash, disconnect, revive, "
               "exit-rank, rank-node, node, quit)\n",
               verb);
    }
    fflush(stdout);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    static char chunk[4096];
    (void)h;
    (void)suggested;
    *buf = uv_buf_init(chunk, sizeof chunk);
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    simd_t *d = s->data;
    if (nread < 0) { /* EOF: whoever drove us is gone */
        stop(d);
        return;
    }
    for (ssize_t i = 0; i < nread && !d->stopping; i++) {
        char ch = buf->base[i];
        if (ch == '\n') {
            d->line[d->len] = 0;
            d->len = 0;
            command(d, d->line);
        } else if (d->len + 1 < sizeof d->line) {
            d->line[d->len++] = ch;
        }
    }
}

static void on_signal(uv_signal_t *s, int signum)
{
    (void)signum;
    stop(s->data);
}

/* One socket per node: raise the soft limit to the hard one; refuse when too low. */
static int raise_nofile(long nodes)
{
    struct rlimit rl;
    rlim_t need = (rlim_t)nodes + FD_SPARE;
    if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
        return -errno;
    if (rl.rlim_cur < need && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &rl) < 0)
            return -errno;
    }
    if (rl.rlim_cur < need) {
        CH_LOGE("sim", "--nodes %ld needs %llu open files; the limit is %llu (raise ulimit -n)",
                nodes, (unsigned long long)need, (unsigned long long)rl.rlim_cur);
        return -EMFILE;
    }
    return 0;
}

int main(int argc, char **argv)
{
    static simd_t d;
    simd_cfg_t cfg;
    wrk_sim_cfg_t sc;
    ch_key_t key;
    ch_log_level_t lvl;
    char err[512] = "";
    int rc;

    signal(SIGPIPE, SIG_IGN);
    ch_log_init("chorus-simnode");
    memset(&cfg, 0, sizeof cfg);
    rc = ch_config_load(options, "simnode", &cfg, argc, argv, err, sizeof err);
    if (rc == 1) {
        ch_config_usage(stdout, "chorus-simnode", options);
        return 0;
    }
    if (rc < 0) {
        fprintf(stderr, "chorus-simnode: %s\n", err[0] ? err : ch_strerror(rc));
        return EXIT_CONFIG;
    }
    if (ch_log_level_parse(cfg.log_level, &lvl) < 0) {
        CH_LOGE("sim", "--log-level: expected error|warn|info|debug, got '%s'", cfg.log_level);
        return EXIT_CONFIG;
    }
    ch_log_set_level(lvl);
    memset(&sc, 0, sizeof sc);
    if (ch_parse_hostport(cfg.coordinator, sc.host, sizeof sc.host, &sc.port) < 0) {
        CH_LOGE("sim", "--coordinator: expected HOST:PORT, got '%s'", cfg.coordinator);
        return EXIT_CONFIG;
    }
    if (cfg.nodes < 1 || cfg.nodes > 100000 || cfg.slots < 1 || cfg.slots > 4096 || cfg.racks < 1 ||
        cfg.racks > cfg.nodes || cfg.step_ms < 1 || cfg.connect_ms < 0 ||
        strlen(cfg.prefix) + 7 > sizeof sc.prefix) {
        CH_LOGE("sim", "--nodes 1..100000, --slots 1..4096, --racks 1..nodes, --step-ms >= 1, "
                       "--prefix up to 24 characters");
        return EXIT_CONFIG;
    }
    if (ch_auth_global_init() < 0) {
        CH_LOGE("sim", "libsodium initialisation failed");
        return 1;
    }
    if ((rc = ch_key_load(cfg.key, &key)) < 0) {
        CH_LOGE("sim", "key %s: %s", cfg.key, ch_strerror(rc));
        return EXIT_CONFIG;
    }
    if (raise_nofile(cfg.nodes) < 0)
        return EXIT_CONFIG;
    sc.key = &key;
    sc.nodes = (uint32_t)cfg.nodes;
    sc.slots = (uint32_t)cfg.slots;
    sc.racks = (uint32_t)cfg.racks;
    sc.step_ms = (uint32_t)cfg.step_ms;
    sc.connect_ms = (uint32_t)cfg.connect_ms;
    sc.progress_ms = cfg.progress_ms > 0 ? (uint32_t)cfg.progress_ms : 0;
    sc.progress_detail_every =
        cfg.progress_detail_every > 0 ? (uint32_t)cfg.progress_detail_every : 0;
    snprintf(sc.prefix, sizeof sc.prefix, "%s", cfg.prefix);

    if (uv_loop_init(&d.loop) < 0 || wrk_sim_create(&d.loop, &sc, &d.sim) < 0) {
        CH_LOGE("sim", "cannot set up %ld nodes", cfg.nodes);
        return 1;
    }
    uv_pipe_init(&d.loop, &d.in, 0);
    uv_signal_init(&d.loop, &d.sigterm);
    uv_signal_init(&d.loop, &d.sigint);
    d.in.data = d.sigterm.data = d.sigint.data = &d;
    if ((rc = uv_pipe_open(&d.in, 0)) < 0 ||
        (rc = uv_read_start((uv_stream_t *)&d.in, on_alloc, on_read)) < 0) {
        CH_LOGE("sim", "stdin (the control interface): %s", uv_strerror(rc));
        return 1;
    }
    uv_signal_start(&d.sigterm, on_signal, SIGTERM);
    uv_signal_start(&d.sigint, on_signal, SIGINT);
    CH_LOGI("sim", "%ld nodes x %ld slots in %ld racks -> %s, step %ld ms", cfg.nodes, cfg.slots,
            cfg.racks, cfg.coordinator, cfg.step_ms);
    wrk_sim_start(d.sim);
    uv_run(&d.loop, UV_RUN_DEFAULT);
    if (uv_loop_close(&d.loop) == 0)
        wrk_sim_destroy(d.sim);
    return 0;
}
