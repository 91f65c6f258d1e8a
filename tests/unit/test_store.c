/* coordinatord store: jobs survive close/reopen in every state, ids keep increasing,
 * nodes are kept, events are appended. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sqlite3.h>

#include "common/err.h"
#include "store.h"
#include "support.h"

static char dir[512];

static void setup(void)
{
    cr_assert_eq(ts_tmpdir("test_store", dir, sizeof(dir)), 0);
}

static void teardown(void)
{
    cr_assert_eq(ts_rmrf(dir), 0);
}

TestSuite(store, .init = setup, .fini = teardown);

static const char *STATES[] = {"queued",    "starting", "running",  "recovering",
                               "completed", "failed",   "cancelled"};

typedef struct loaded {
    int n;
    int64_t seq[16];
    char state[16][16], name[16][32], placement[16][64], reason[16][64], ini[16][64];
    uint64_t generation[16], step[16], started[16];
    int64_t ckpt[16];
    double loss[16];
} loaded_t;

static int on_job(void *ud, const coord_job_rec_t *j)
{
    loaded_t *l = ud;
    cr_assert_lt(l->n, 16);
    int i = l->n++;
    l->seq[i] = j->seq;
    snprintf(l->state[i], sizeof(l->state[i]), "%s", j->state);
    snprintf(l->name[i], sizeof(l->name[i]), "%s", j->name);
    snprintf(l->placement[i], sizeof(l->placement[i]), "%s", j->placement);
    snprintf(l->reason[i], sizeof(l->reason[i]), "%s", j->reason);
    snprintf(l->ini[i], sizeof(l->ini[i]), "%s", j->ini);
    l->generation[i] = j->generation;
    l->step[i] = j->step;
    l->started[i] = j->started_ms;
    l->ckpt[i] = j->last_ckpt_step;
    l->loss[i] = j->loss;
    return 0;
}

Test(store, job_survives_reopen_in_every_state)
{
    coord_store_t *s = NULL;
    int64_t seqs[7];
    cr_assert_eq(coord_store_open(dir, &s), 0);
    for (int i = 0; i < 7; i++) {
        char name[32];
        snprintf(name, sizeof(name), "job-%s", STATES[i]);
        coord_job_rec_t rec = {.name = name,
                               .kind = "train",
                               .ini = "[job]\nname = x\n",
                               .state = "queued",
                               .reason = "",
                               .placement = "",
                               .last_ckpt_step = -1,
                               .submitted_ms = 1000 + (uint64_t)i};
        cr_assert_eq(coord_store_job_insert(s, &rec, &seqs[i]), 0);
        /* Move it to its state, as the job module would. */
        rec.seq = seqs[i];
        rec.state = STATES[i];
        rec.generation = (uint64_t)i;
        rec.step = 10u * (uint64_t)i;
        rec.loss = 0.5 * i;
        rec.last_ckpt_step = i ? 100 * i : -1;
        rec.placement = i ? "n1:0,n1:1,n2:0" : "";
        rec.reason = i == 5 ? "rank 3 on node n1 killed by signal 9" : "";
        rec.started_ms = i ? 2000 : 0;
        cr_assert_eq(coord_store_job_update(s, &rec), 0);
    }
    coord_store_close(s);

    loaded_t l;
    memset(&l, 0, sizeof(l));
    cr_assert_eq(coord_store_open(dir, &s), 0);
    cr_assert_eq(coord_store_load_jobs(s, on_job, &l), 0);
    cr_assert_eq(l.n, 7);
    for (int i = 0; i < 7; i++) {
        cr_assert_eq(l.seq[i], seqs[i]);
        cr_assert_str_eq(l.state[i], STATES[i]);
        cr_assert_eq(l.generation[i], (uint64_t)i);
        cr_assert_eq(l.step[i], 10u * (uint64_t)i);
        cr_assert_float_eq(l.loss[i], 0.5 * i, 1e-12);
        cr_assert_eq(l.ckpt[i], i ? 100 * i : -1);
        cr_assert_str_eq(l.placement[i], i ? "n1:0,n1:1,n2:0" : "");
        cr_assert_str_eq(l.ini[i], "[job]\nname = x\n");
        cr_assert_eq(l.started[i], i ? 2000u : 0u);
    }
    cr_assert_str_eq(l.reason[5], "rank 3 on node n1 killed by signal 9");
    coord_store_close(s);
}

Test(store, ids_keep_increasing_across_reopen)
{
    coord_store_t *s = NULL;
    int64_t a = 0, b = 0, c = 0;
    coord_job_rec_t rec = {.name = "x",
                           .kind = "train",
                           .ini = "",
                           .state = "queued",
                           .reason = "",
                           .placement = "",
                           .last_ckpt_step = -1};
    cr_assert_eq(coord_store_open(dir, &s), 0);
    cr_assert_eq(coord_store_job_insert(s, &rec, &a), 0);
    cr_assert_eq(coord_store_job_insert(s, &rec, &b), 0);
    cr_assert_gt(b, a);
    coord_store_close(s);
    cr_assert_eq(coord_store_open(dir, &s), 0);
    cr_assert_eq(coord_store_job_insert(s, &rec, &c), 0);
    cr_assert_gt(c, b);
    coord_store_close(s);
}

Test(store, update_of_unknown_job_is_not_found)
{
    coord_store_t *s = NULL;
    coord_job_rec_t rec = {.seq = 42,
                           .name = "x",
                           .kind = "train",
                           .ini = "",
                           .state = "queued",
                           .reason = "",
                           .placement = ""};
    cr_assert_eq(coord_store_open(dir, &s), 0);
    cr_assert_eq(coord_store_job_update(s, &rec), CH_E_NOTFOUND);
    coord_store_close(s);
}

static int on_node(void *ud, const coord_node_rec_t *n)
{
    char *out = ud;
    size_t len = strlen(out);
    snprintf(out + len, 256 - len, "%s/%s/%s/%s/%u;", n->name, n->state, n->rack, n->device,
             n->slots);
    return 0;
}

Test(store, nodes_are_kept_and_replaced_by_name)
{
    coord_store_t *s = NULL;
    char out[256] = "";
    cr_assert_eq(coord_store_open(dir, &s), 0);
    coord_node_rec_t n1 = {
        .name = "n1", .state = "alive", .rack = "r1", .device = "cpu", .slots = 2};
    coord_node_rec_t n2 = {
        .name = "n2", .state = "alive", .rack = "r2", .device = "cuda", .slots = 8};
    cr_assert_eq(coord_store_node_put(s, &n1), 0);
    cr_assert_eq(coord_store_node_put(s, &n2), 0);
    n1.state = "dead";
    cr_assert_eq(coord_store_node_put(s, &n1), 0);
    cr_assert_eq(coord_store_event(s, "j1", 1, 3, "n1", "state running->failed"), 0);
    cr_assert_eq(coord_store_event(s, NULL, 0, -1, "n1", "state alive->dead"), 0);
    coord_store_close(s);
    cr_assert_eq(coord_store_open(dir, &s), 0);
    cr_assert_eq(coord_store_load_nodes(s, on_node, out), 0);
    cr_assert(strstr(out, "n1/dead/r1/cpu/2;") != NULL, "%s", out);
    cr_assert(strstr(out, "n2/alive/r2/cuda/8;") != NULL, "%s", out);
    coord_store_close(s);
}

static int stop_early(void *ud, const coord_job_rec_t *j)
{
    (void)j;
    ++*(int *)ud;
    return -EINTR;
}

Test(store, callback_error_stops_the_walk)
{
    coord_store_t *s = NULL;
    int64_t seq;
    int calls = 0;
    coord_job_rec_t rec = {
        .name = "x", .kind = "train", .ini = "", .state = "queued", .reason = "", .placement = ""};
    cr_assert_eq(coord_store_open(dir, &s), 0);
    cr_assert_eq(coord_store_job_insert(s, &rec, &seq), 0);
    cr_assert_eq(coord_store_job_insert(s, &rec, &seq), 0);
    cr_assert_eq(coord_store_load_jobs(s, stop_early, &calls), -EINTR);
    cr_assert_eq(calls, 1);
    coord_store_close(s);
}

Test(store, open_fails_cleanly_on_a_bad_directory)
{
    coord_store_t *s = (coord_store_t *)1;
    char path[600];
    snprintf(path, sizeof(path), "%s/file", dir);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fclose(f);
    snprintf(path, sizeof(path), "%s/file/sub", dir); /* a file where a directory should be */
    cr_assert_lt(coord_store_open(path, &s), 0);
    cr_assert_null(s);
}

typedef struct restarts_seen {
    int n;
    char from[4][64], to[4][64], cause[4][32], source[4][16];
} restarts_seen_t;

static int on_restart(void *ud, const coord_restart_rec_t *r)
{
    restarts_seen_t *s = ud;
    cr_assert_lt(s->n, 4);
    snprintf(s->from[s->n], sizeof s->from[0], "%s", r->layout_from);
    snprintf(s->to[s->n], sizeof s->to[0], "%s", r->layout_to);
    snprintf(s->cause[s->n], sizeof s->cause[0], "%s", r->cause);
    snprintf(s->source[s->n], sizeof s->source[0], "%s", r->source);
    s->n++;
    return 0;
}

/* A database written before restarts kept their layouts and sources (no such columns)
 * opens, its old restart reads back without them, and a new one keeps its layouts and
 * source (checkpoint.memory_every: "memory") across reopen. */
Test(store, restarts_keep_their_layouts_and_old_databases_migrate)
{
    char path[600];
    snprintf(path, sizeof path, "%s/old.db", dir);
    sqlite3 *db = NULL;
    cr_assert_eq(sqlite3_open(path, &db), SQLITE_OK);
    cr_assert_eq(
        sqlite3_exec(db,
                     "CREATE TABLE restarts (job_seq INTEGER NOT NULL, idx INTEGER NOT NULL,"
                     " time_ms INTEGER NOT NULL, cause TEXT NOT NULL, rank INTEGER NOT NULL,"
                     " node TEXT NOT NULL, reason TEXT NOT NULL, failed_gen INTEGER NOT NULL,"
                     " failed_step INTEGER NOT NULL, resumed_from INTEGER NOT NULL,"
                     " steps_lost INTEGER NOT NULL, recover_s REAL NOT NULL,"
                     " PRIMARY KEY (job_seq, idx));"
                     "INSERT INTO restarts VALUES (1, 0, 5, 'node_lost', -1, 'n2', 'gone', 1, 7,"
                     " 5, 2, 1.5);",
                     NULL, NULL, NULL),
        SQLITE_OK, "%s", sqlite3_errmsg(db));
    sqlite3_close(db);

    coord_store_t *s = NULL;
    cr_assert_eq(coord_store_open_path(path, &s), 0);
    coord_restart_rec_t r = {.job_seq = 1,
                             .idx = 1,
                             .time_ms = 9,
                             .cause = "node_lost",
                             .node = "n2",
                             .reason = "gone again",
                             .rank = -1,
                             .failed_gen = 2,
                             .failed_step = 12,
                             .resumed_from = 10,
                             .steps_lost = 2,
                             .recover_s = 2.5,
                             .layout_from = "1,1,2,1,4",
                             .layout_to = "1,1,1,2,4",
                             .source = "memory"};
    cr_assert_eq(coord_store_restart_put(s, &r), 0);
    coord_store_close(s);

    cr_assert_eq(coord_store_open_path(path, &s), 0, "a migrated database opens again");
    restarts_seen_t seen = {0};
    cr_assert_eq(coord_store_load_restarts(s, on_restart, &seen), 0);
    coord_store_close(s);
    cr_assert_eq(seen.n, 2);
    cr_expect_str_eq(seen.cause[0], "node_lost");
    cr_expect_str_eq(seen.from[0], "");
    cr_expect_str_eq(seen.to[0], "");
    cr_expect_str_eq(seen.from[1], "1,1,2,1,4");
    cr_expect_str_eq(seen.to[1], "1,1,1,2,4");
    cr_expect_str_eq(seen.source[0], "");
    cr_expect_str_eq(seen.source[1], "memory");
}
