/* Fuzz target: coordinatord's message handlers after authentication (rpc.c's table and
 * everything behind it: registration, heartbeats, rank events, rendezvous, submit,
 * cancel, queries, forgetting nodes, the scheduler, the store).
 *
 * Each input runs against a fresh coordinator (coord_init on an empty store in the
 * scratch directory; no listener, no sockets): links are coord_link_t's without a
 * connection, so replies and commands are built and then dropped, exactly as on a link
 * whose peer went away. The input is a sequence of records (fuzz.h, fuzz_next_msg); the
 * record's op picks what happens:
 *
 *   op % 8 = 0, 1  the Envelope arrives on worker link 0 or 1 (role worker, as after
 *                  the handshake with the cluster key)
 *            2     on a control link from root over the Unix socket
 *            3     on a control link from uid/gid 65534 over the Unix socket
 *            4     on a control link from a key holder over TCP
 *            5     link (op / 8) % 5 closes (what its close callback does), and a new
 *                  connection takes its place
 *            6     time passes: (op / 8) * 250 ms more on the cron's clock, then the
 *                  cron's node, job and rendezvous checks
 *            7     as 0..4 with link (op / 8) % 5
 *
 * After every record the scheduler runs as the loop's before-sleep hook would, links the
 * coordinator closed are closed, and the slot accounting must hold: every node's used
 * slots equal the ranks placed on it whose state holds a slot (job.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"
#include "coord.h"
#include "fuzz.h"
#include "rpc.h"
#include "scheduler.h"

#define NLINKS 5

static coord_t C;
static coord_link_t L[NLINKS];
static uv_loop_t loop;
static coord_cfg_t cfg;
static uint64_t skew; /* the cron's clock runs this far ahead */

static void link_reset(int i)
{
    coord_link_t *l = &L[i];
    memset(l, 0, sizeof(*l));
    l->c = &C;
    switch (i) {
    case 0:
    case 1:
        l->role = COORD_ROLE_WORKER;
        break;
    case 2:
        l->is_unix = 1;
        l->role = COORD_ROLE_CTL;
        l->cred = coord_users_cred(&C.users, 1, 0, 0);
        break;
    case 3:
        l->is_unix = 1;
        l->role = COORD_ROLE_CTL;
        l->cred = coord_users_cred(&C.users, 1, 65534, 65534);
        break;
    default:
        l->role = COORD_ROLE_CTL;
        l->cred = coord_users_cred(&C.users, 0, 0, 0);
        break;
    }
}

static void state_remove(void)
{
    static const char *const files[] = {"state.db", "state.db-wal", "state.db-shm",
                                        "state.db-journal"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char path[600];
        snprintf(path, sizeof path, "%s/%s", cfg.state_dir, files[i]);
        unlink(path);
    }
}

static void setup_once(void)
{
    static int done;
    if (done)
        return;
    done = 1;
    /* Refusals are the expected case: errors only, unless asked (CHORUS_FUZZ_LOG=1). */
    ch_log_set_level(getenv("CHORUS_FUZZ_LOG") ? CH_LOG_DEBUG : CH_LOG_ERROR);
    FUZZ_ASSERT(uv_loop_init(&loop) == 0);
    fuzz_tmp_path(cfg.state_dir, sizeof cfg.state_dir, "");
    cfg.state_dir[strlen(cfg.state_dir) - 1] = '\0'; /* the scratch directory itself */
    snprintf(cfg.listen, sizeof cfg.listen, "127.0.0.1:0");
    cfg.heartbeat_ms = 100;
    cfg.dead_after_ms = 1000;
    cfg.grace_ms = 400;
    cfg.forget_dead_after_ms = 5000;
    cfg.allow_root_jobs = 1; /* no service user to look up: root's jobs run as root */
    cfg.keep_ended_jobs = 4;
}

/* Every node's used slots are the ranks placed on it that hold one. */
static void check_slots(void)
{
    coord_node_t *all[2][256];
    size_t n[2] = {0, 0};
    for (size_t i = 0; i < C.nodes.n && n[0] < 256; i++)
        all[0][n[0]++] = C.nodes.v[i];
    for (size_t i = 0; i < C.nodes.n_gone && n[1] < 256; i++)
        all[1][n[1]++] = C.nodes.gone[i];
    for (int g = 0; g < 2; g++) {
        for (size_t k = 0; k < n[g]; k++) {
            const coord_node_t *node = all[g][k];
            uint32_t held = 0;
            for (size_t i = 0; i < C.jobs.n; i++) {
                const coord_job_t *j = C.jobs.v[i];
                for (uint32_t r = 0; j->ranks && r < j->world; r++)
                    held += j->ranks[r].node == node && coord_rank_holds(j->ranks[r].state);
            }
            if (held != node->used)
                fprintf(stderr, "node %s: used %u, ranks holding a slot %u\n", node->name,
                        node->used, held);
            FUZZ_ASSERT(held == node->used);
        }
    }
}

static void settle(void)
{
    for (int i = 0; i < 8 && C.changed; i++) { /* coord.c's before-sleep hook */
        C.changed = 0;
        coord_sched_run(&C);
    }
    for (int i = 0; i < NLINKS; i++) {
        if (L[i].closing) {
            coord_link_gone(&C, &L[i], 0);
            link_reset(i);
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    setup_once();
    state_remove();
    skew = 0;
    FUZZ_ASSERT(coord_init(&C, &loop, &cfg, NULL) == 0);
    for (int i = 0; i < NLINKS; i++)
        link_reset(i);

    uint8_t op;
    Chorus__Envelope *env;
    while (fuzz_next_msg(&data, &size, &op, &env)) {
        int kind = op % 8, arg = op / 8;
        if (kind == 5) {
            coord_link_gone(&C, &L[arg % NLINKS], 0);
            link_reset(arg % NLINKS);
        } else if (kind == 6) {
            skew += (uint64_t)arg * 250;
            uint64_t now = ch_now_ms() + skew;
            coord_node_check(&C, now);
            coord_job_check(&C, now);
            coord_kv_expire(C.kv, now);
        } else if (env) {
            coord_link_t *l = &L[kind == 7 ? arg % NLINKS : kind];
            if (!l->closing)
                coord_rpc_dispatch(&C, l, env);
        }
        if (env)
            chorus__envelope__free_unpacked(env, NULL);
        settle();
        check_slots();
    }
    C.stopping = 1; /* as coord_stop: links going now leave their nodes alone */
    for (int i = 0; i < NLINKS; i++)
        coord_link_gone(&C, &L[i], 0);
    coord_fini(&C);
    return 0;
}
