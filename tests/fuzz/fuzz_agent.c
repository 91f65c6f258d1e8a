/* Fuzz target: workerd's handling of what the coordinator sends after authentication
 * (agent.h, wrk_agent_coord_msg): RegisterAck, StartRanks, KillRanks, RankExitAck,
 * rendezvous replies, errors, anything else.
 *
 * Each input runs against a fresh agent (never started: no coordinator link, so what it
 * sends is queued as while disconnected) whose run directory is in the scratch
 * directory. Rank processes are not created: fork() is replaced below by one that fails
 * with EAGAIN, so a StartRanks runs everything up to the spawn (job id checks, directories,
 * the job file) and then takes the spawn-failure path (RANK_FAILED, RANK_EXITED). Input:
 * records as in fuzz.h (fuzz_next_msg); op is ignored but for op % 8 == 6, which runs
 * the loop once without waiting (the agent's timers). */
#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"
#include "fuzz.h"
#include "workerd/agent.h"

/* No rank processes from a fuzzer: libuv's uv_spawn forks through this. */
pid_t fork(void)
{
    errno = EAGAIN;
    return -1;
}

static uv_loop_t loop;
static ch_key_t key;
static char run_dir[512];

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    if (ftw->level > 0)
        remove(path);
    return 0;
}

static void run_dir_remove(void)
{
    nftw(run_dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
    rmdir(run_dir); /* before the scratch directory goes (atexit runs in reverse) */
}

static void setup_once(void)
{
    static int done;
    if (done)
        return;
    done = 1;
    ch_log_set_level(getenv("CHORUS_FUZZ_LOG") ? CH_LOG_DEBUG : CH_LOG_ERROR);
    FUZZ_ASSERT(uv_loop_init(&loop) == 0);
    fuzz_tmp_path(run_dir, sizeof run_dir, "run");
    FUZZ_ASSERT(ch_mkdirs(run_dir, 0755) == 0);
    atexit(run_dir_remove);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    setup_once();
    wrk_agent_cfg_t cfg;
    memset(&cfg, 0, sizeof cfg);
    snprintf(cfg.host, sizeof cfg.host, "127.0.0.1");
    cfg.port = 1;
    snprintf(cfg.name, sizeof cfg.name, "fuzz-node");
    cfg.slots = 2;
    snprintf(cfg.rack, sizeof cfg.rack, "r1");
    cfg.device = CH_DEVICE_CPU;
    cfg.key = &key;
    snprintf(cfg.run_dir, sizeof cfg.run_dir, "%s", run_dir);
    cfg.rank_exe = "/nonexistent/chorus-rank";
    wrk_agent_t *a = NULL;
    FUZZ_ASSERT(wrk_agent_create(&loop, &cfg, &a) == 0);

    uint8_t op;
    Chorus__Envelope *env;
    while (fuzz_next_msg(&data, &size, &op, &env)) {
        if (env)
            wrk_agent_coord_msg(a, env);
        if (op % 8 == 6)
            uv_run(&loop, UV_RUN_NOWAIT);
        if (env)
            chorus__envelope__free_unpacked(env, NULL);
        FUZZ_ASSERT(wrk_agent_ranks_alive(a) == 0);
    }
    wrk_agent_stop(a);
    uv_run(&loop, UV_RUN_DEFAULT); /* the timers' close callbacks */
    wrk_agent_destroy(a);
    nftw(run_dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
    return 0;
}
