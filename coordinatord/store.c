/* SQLite-backed coordinator state; see store.h.
 *
 * What is journaled, and why. The store's write rate at steady state is bounded
 * by what must survive a crash, not by the ranks' progress:
 *  - at once, committed before anything that relies on it leaves: an accepted job, every
 *    job and node state change, a committed checkpoint step (what a restart resumes from),
 *    each restart's record, a forgotten node;
 *  - along with the next commit: the event log (state changes only) and node rows (on a
 *    change of state, slots or rack; never per heartbeat);
 *  - progress: a job's step and loss ride along with those writes, and on their own at most
 *    once a minute (COORD_PROGRESS_STORE_MS, jobevent.c): they are informational, the run's
 *    durable position is its committed checkpoint. Per-rank progress is never written;
 *  - the status page's series: one blob per job at most every COORD_SERIES_SAVE_MS,
 *    whatever the number of ranks (series.h).
 * So 32,768 ranks reporting every step cost the store what 8 ranks do. coord_store_stats
 * counts statements and commits (the test of this rate reads them). */
#include "store.h"

#include <limits.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/log.h"
#include "common/util.h"

struct coord_store {
    sqlite3 *db;
    int in_txn; /* a transaction is open (writes since the last commit) */
    int urgent; /* it holds journal writes: commit before anything is sent */
    coord_store_stats_t st;
};

static const char SCHEMA[] =
    "CREATE TABLE IF NOT EXISTS nodes ("
    "  name TEXT PRIMARY KEY, state TEXT NOT NULL, rack TEXT NOT NULL, device TEXT NOT NULL,"
    "  slots INTEGER NOT NULL, updated_ms INTEGER NOT NULL);"
    "CREATE TABLE IF NOT EXISTS jobs ("
    "  seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT GENERATED ALWAYS AS ('j' || seq) VIRTUAL,"
    "  name TEXT NOT NULL, kind TEXT NOT NULL,"
    "  ini TEXT NOT NULL, state TEXT NOT NULL, generation INTEGER NOT NULL,"
    "  restarts INTEGER NOT NULL, step INTEGER NOT NULL, total_steps INTEGER NOT NULL,"
    "  loss REAL NOT NULL, last_ckpt_step INTEGER NOT NULL, reason TEXT NOT NULL,"
    "  placement TEXT NOT NULL, submitted_ms INTEGER NOT NULL, started_ms INTEGER NOT NULL,"
    "  finished_ms INTEGER NOT NULL);"
    "CREATE TABLE IF NOT EXISTS events ("
    "  id INTEGER PRIMARY KEY AUTOINCREMENT, t_ms INTEGER NOT NULL, job TEXT, gen INTEGER,"
    "  rank INTEGER, node TEXT, what TEXT NOT NULL);"
    "CREATE TABLE IF NOT EXISTS restarts ("
    "  job_seq INTEGER NOT NULL, idx INTEGER NOT NULL, time_ms INTEGER NOT NULL,"
    "  cause TEXT NOT NULL, rank INTEGER NOT NULL, node TEXT NOT NULL, reason TEXT NOT NULL,"
    "  failed_gen INTEGER NOT NULL, failed_step INTEGER NOT NULL,"
    "  resumed_from INTEGER NOT NULL, steps_lost INTEGER NOT NULL, recover_s REAL NOT NULL,"
    "  layout_from TEXT NOT NULL DEFAULT '', layout_to TEXT NOT NULL DEFAULT '',"
    "  source TEXT NOT NULL DEFAULT '',"
    "  PRIMARY KEY (job_seq, idx));";

/* A database written before the restarts kept their layouts: the two columns added (every
 * old restart then shows none, as before). */
static const char RESTARTS_LAYOUT_MIGRATION[] =
    "ALTER TABLE restarts ADD COLUMN layout_from TEXT NOT NULL DEFAULT '';"
    "ALTER TABLE restarts ADD COLUMN layout_to TEXT NOT NULL DEFAULT '';";
/* ... and before they kept where their state came from (checkpoint.memory_every). */
static const char RESTARTS_SOURCE_MIGRATION[] =
    "ALTER TABLE restarts ADD COLUMN source TEXT NOT NULL DEFAULT '';";

/* The status page's series (series.h), one blob per job. */
static const char SERIES_SCHEMA[] =
    "CREATE TABLE IF NOT EXISTS series ("
    "  job_seq INTEGER PRIMARY KEY, updated_ms INTEGER NOT NULL, data BLOB NOT NULL);";

/* The one place SQLite result codes become Chorus codes (with one log line naming what
 * failed and SQLite's message). */
static int sql_err(sqlite3 *db, int rc, const char *what)
{
    if (rc == SQLITE_OK || rc == SQLITE_DONE || rc == SQLITE_ROW)
        return 0;
    CH_LOGE("store", "%s: %s (sqlite %d)", what, db ? sqlite3_errmsg(db) : sqlite3_errstr(rc), rc);
    switch (rc & 0xff) {
    case SQLITE_NOMEM:
        return -ENOMEM;
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
        return -EBUSY;
    case SQLITE_FULL:
        return -ENOSPC;
    case SQLITE_CANTOPEN:
        return -EACCES;
    case SQLITE_READONLY:
        return -EROFS;
    case SQLITE_IOERR:
        return -EIO;
    default:
        return CH_E_SQLITE;
    }
}

static int exec(coord_store_t *s, const char *sql, const char *what)
{
    return sql_err(s->db, sqlite3_exec(s->db, sql, NULL, NULL, NULL), what);
}

/* Whether table restarts has column `name`: 1, 0, or an error. */
static int restarts_have(coord_store_t *s, const char *name)
{
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(
        s->db, "SELECT COUNT(*) FROM pragma_table_info('restarts') WHERE name = ?1", -1, &st, NULL);
    if (rc != SQLITE_OK)
        return sql_err(s->db, rc, "schema check");
    sqlite3_bind_text(st, 1, name, -1, SQLITE_STATIC);
    int have = sqlite3_step(st) == SQLITE_ROW && sqlite3_column_int(st, 0) > 0;
    sqlite3_finalize(st);
    return have;
}

/* Bring an older database's tables up to the schema: restarts' layout and source columns. */
static int migrate(coord_store_t *s)
{
    int have = restarts_have(s, "layout_from");
    if (have == 0)
        have = exec(s, RESTARTS_LAYOUT_MIGRATION, "schema migration (restarts' layouts)");
    if (have >= 0 && (have = restarts_have(s, "source")) == 0)
        have = exec(s, RESTARTS_SOURCE_MIGRATION, "schema migration (restarts' sources)");
    return have < 0 ? have : 0;
}

/* Writes go into one transaction per loop turn (see store.h): open it on the first. */
static int begin(coord_store_t *s, int urgent)
{
    s->st.writes++;
    if (!s->in_txn) {
        int rc = exec(s, "BEGIN", "begin");
        if (rc < 0)
            return rc;
        s->in_txn = 1;
    }
    s->urgent |= urgent;
    return 0;
}

int coord_store_commit(coord_store_t *s)
{
    if (!s || !s->in_txn)
        return 0;
    int rc = exec(s, "COMMIT", "commit");
    s->st.commits++;
    if (rc < 0)
        (void)sqlite3_exec(s->db, "ROLLBACK", NULL, NULL, NULL);
    s->in_txn = s->urgent = 0;
    return rc;
}

int coord_store_commit_journal(coord_store_t *s)
{
    return s && s->urgent ? coord_store_commit(s) : 0;
}

int coord_store_open_path(const char *path, coord_store_t **out)
{
    coord_store_t *s = calloc(1, sizeof(*s));
    int rc;

    *out = NULL;
    if (!s)
        return -ENOMEM;
    rc = sqlite3_open_v2(path, &s->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL);
    if (rc != SQLITE_OK) {
        rc = sql_err(s->db, rc, path);
        goto fail;
    }
    sqlite3_busy_timeout(s->db, 5000);
    CH_CHECK_GOTO(exec(s, "PRAGMA journal_mode=WAL", "journal_mode"), rc, fail);
    CH_CHECK_GOTO(exec(s, "PRAGMA synchronous=FULL", "synchronous"), rc, fail);
    CH_CHECK_GOTO(exec(s, SCHEMA, "schema"), rc, fail);
    CH_CHECK_GOTO(migrate(s), rc, fail);
    CH_CHECK_GOTO(exec(s, SERIES_SCHEMA, "series schema"), rc, fail);
    *out = s;
    return 0;
fail:
    coord_store_close(s);
    return rc;
}

int coord_store_open(const char *dir, coord_store_t **out)
{
    char path[PATH_MAX];
    *out = NULL;
    int rc = ch_mkdirs(dir, 0750);
    if (rc < 0)
        return rc;
    if (snprintf(path, sizeof(path), "%s/state.db", dir) >= (int)sizeof(path))
        return -ENAMETOOLONG;
    return coord_store_open_path(path, out);
}

void coord_store_close(coord_store_t *s)
{
    if (!s)
        return;
    coord_store_commit(s);
    if (s->db)
        sqlite3_close(s->db);
    free(s);
}

/* Prepare, let bind() fill the parameters, step once, finalize. */
static int run(coord_store_t *s, int urgent, const char *sql, const char *what,
               void (*bind)(sqlite3_stmt *st, const void *rec), const void *rec)
{
    sqlite3_stmt *st = NULL;
    int rc = begin(s, urgent);
    if (rc < 0)
        return rc;
    rc = sqlite3_prepare_v2(s->db, sql, -1, &st, NULL);
    if (rc != SQLITE_OK)
        return sql_err(s->db, rc, what);
    bind(st, rec);
    rc = sql_err(s->db, sqlite3_step(st), what);
    sqlite3_finalize(st);
    return rc;
}

static void text(sqlite3_stmt *st, int i, const char *v)
{
    sqlite3_bind_text(st, i, v ? v : "", -1, SQLITE_TRANSIENT);
}

static void bind_node(sqlite3_stmt *st, const void *p)
{
    const coord_node_rec_t *n = p;
    text(st, 1, n->name);
    text(st, 2, n->state);
    text(st, 3, n->rack);
    text(st, 4, n->device);
    sqlite3_bind_int64(st, 5, n->slots);
    sqlite3_bind_int64(st, 6, (sqlite3_int64)n->updated_ms);
}

static void bind_name(sqlite3_stmt *st, const void *p)
{
    text(st, 1, p);
}

int coord_store_node_delete(coord_store_t *s, const char *name)
{
    return run(s, 1, "DELETE FROM nodes WHERE name = ?1", "forget node", bind_name, name);
}

int coord_store_node_put(coord_store_t *s, const coord_node_rec_t *n)
{
    return run(s, 0,
               "INSERT OR REPLACE INTO nodes (name, state, rack, device, slots, updated_ms)"
               " VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
               "store node", bind_node, n);
}

/* Parameters 1..15 are the job's fields; 16 is seq (updates only). */
static void bind_job(sqlite3_stmt *st, const void *p)
{
    const coord_job_rec_t *j = p;
    text(st, 1, j->name);
    text(st, 2, j->kind);
    text(st, 3, j->ini);
    text(st, 4, j->state);
    sqlite3_bind_int64(st, 5, (sqlite3_int64)j->generation);
    sqlite3_bind_int64(st, 6, j->restarts);
    sqlite3_bind_int64(st, 7, (sqlite3_int64)j->step);
    sqlite3_bind_int64(st, 8, (sqlite3_int64)j->total_steps);
    sqlite3_bind_double(st, 9, j->loss);
    sqlite3_bind_int64(st, 10, j->last_ckpt_step);
    text(st, 11, j->reason);
    text(st, 12, j->placement);
    sqlite3_bind_int64(st, 13, (sqlite3_int64)j->submitted_ms);
    sqlite3_bind_int64(st, 14, (sqlite3_int64)j->started_ms);
    sqlite3_bind_int64(st, 15, (sqlite3_int64)j->finished_ms);
    if (sqlite3_bind_parameter_count(st) >= 16)
        sqlite3_bind_int64(st, 16, j->seq);
}

int coord_store_job_insert(coord_store_t *s, const coord_job_rec_t *rec, int64_t *seq)
{
    int rc = run(s, 1,
                 "INSERT INTO jobs (name, kind, ini, state, generation, restarts, step,"
                 " total_steps, loss, last_ckpt_step, reason, placement, submitted_ms,"
                 " started_ms, finished_ms)"
                 " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15)",
                 "store new job", bind_job, rec);
    if (rc == 0)
        *seq = sqlite3_last_insert_rowid(s->db);
    return rc;
}

int coord_store_job_update(coord_store_t *s, const coord_job_rec_t *rec)
{
    int rc = run(s, 1,
                 "UPDATE jobs SET name=?1, kind=?2, ini=?3, state=?4, generation=?5,"
                 " restarts=?6, step=?7, total_steps=?8, loss=?9, last_ckpt_step=?10,"
                 " reason=?11, placement=?12, submitted_ms=?13, started_ms=?14,"
                 " finished_ms=?15 WHERE seq=?16",
                 "store job", bind_job, rec);
    if (rc == 0 && sqlite3_changes(s->db) == 0)
        rc = CH_E_NOTFOUND;
    return rc;
}

typedef struct event_rec {
    const char *job, *node, *what;
    uint64_t gen;
    int64_t rank;
} event_rec_t;

static void bind_event(sqlite3_stmt *st, const void *p)
{
    const event_rec_t *e = p;
    sqlite3_bind_int64(st, 1, (sqlite3_int64)ch_wall_ms());
    if (e->job) {
        text(st, 2, e->job);
        sqlite3_bind_int64(st, 3, (sqlite3_int64)e->gen);
    }
    if (e->rank >= 0)
        sqlite3_bind_int64(st, 4, e->rank);
    if (e->node)
        text(st, 5, e->node);
    text(st, 6, e->what);
}

int coord_store_event(coord_store_t *s, const char *job, uint64_t gen, int64_t rank,
                      const char *node, const char *what)
{
    event_rec_t e = {.job = job, .node = node, .what = what, .gen = gen, .rank = rank};
    return run(s, 0,
               "INSERT INTO events (t_ms, job, gen, rank, node, what) VALUES (?1,?2,?3,?4,?5,?6)",
               "store event", bind_event, &e);
}

static const char *col(sqlite3_stmt *st, int i)
{
    const unsigned char *t = sqlite3_column_text(st, i);
    return t ? (const char *)t : "";
}

int coord_store_load_nodes(coord_store_t *s, coord_store_node_cb cb, void *ud)
{
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(
        s->db, "SELECT name, state, rack, device, slots, updated_ms FROM nodes ORDER BY rowid", -1,
        &st, NULL);
    if (rc != SQLITE_OK)
        return sql_err(s->db, rc, "load nodes");
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        coord_node_rec_t n = {
            .name = col(st, 0),
            .state = col(st, 1),
            .rack = col(st, 2),
            .device = col(st, 3),
            .slots = (uint32_t)sqlite3_column_int64(st, 4),
            .updated_ms = (uint64_t)sqlite3_column_int64(st, 5),
        };
        int crc = cb(ud, &n);
        if (crc < 0) {
            sqlite3_finalize(st);
            return crc;
        }
    }
    rc = sql_err(s->db, rc, "load nodes");
    sqlite3_finalize(st);
    return rc;
}

#define JOB_COLUMNS                                                                                \
    "SELECT seq, name, kind, ini, state, generation, restarts, step, total_steps, loss,"           \
    " last_ckpt_step, reason, placement, submitted_ms, started_ms, finished_ms FROM jobs "

/* Every row st yields to cb; finalizes st. */
static int walk_jobs(coord_store_t *s, sqlite3_stmt *st, coord_store_job_cb cb, void *ud,
                     size_t *rows)
{
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        coord_job_rec_t j = {
            .seq = sqlite3_column_int64(st, 0),
            .name = col(st, 1),
            .kind = col(st, 2),
            .ini = col(st, 3),
            .state = col(st, 4),
            .generation = (uint64_t)sqlite3_column_int64(st, 5),
            .restarts = (uint32_t)sqlite3_column_int64(st, 6),
            .step = (uint64_t)sqlite3_column_int64(st, 7),
            .total_steps = (uint64_t)sqlite3_column_int64(st, 8),
            .loss = sqlite3_column_double(st, 9),
            .last_ckpt_step = sqlite3_column_int64(st, 10),
            .reason = col(st, 11),
            .placement = col(st, 12),
            .submitted_ms = (uint64_t)sqlite3_column_int64(st, 13),
            .started_ms = (uint64_t)sqlite3_column_int64(st, 14),
            .finished_ms = (uint64_t)sqlite3_column_int64(st, 15),
        };
        int crc = cb(ud, &j);
        (*rows)++;
        if (crc < 0) {
            sqlite3_finalize(st);
            return crc;
        }
    }
    rc = sql_err(s->db, rc, "load jobs");
    sqlite3_finalize(st);
    return rc;
}

int coord_store_load_jobs(coord_store_t *s, coord_store_job_cb cb, void *ud)
{
    sqlite3_stmt *st = NULL;
    size_t rows = 0;
    int rc = sqlite3_prepare_v2(s->db, JOB_COLUMNS "ORDER BY seq", -1, &st, NULL);
    if (rc != SQLITE_OK)
        return sql_err(s->db, rc, "load jobs");
    return walk_jobs(s, st, cb, ud, &rows);
}

int coord_store_find_job(coord_store_t *s, const char *id_or_name, coord_store_job_cb cb, void *ud)
{
    static const char *const SQL[] = {JOB_COLUMNS "WHERE seq = ?1",
                                      JOB_COLUMNS "WHERE name = ?1 ORDER BY seq DESC LIMIT 1"};
    char *end = NULL;
    long long seq = -1;
    if (id_or_name[0] == 'j' && id_or_name[1] >= '0' && id_or_name[1] <= '9') {
        seq = strtoll(id_or_name + 1, &end, 10);
        seq = *end ? -1 : seq;
    }
    for (size_t i = seq < 0 ? 1 : 0; i < 2; i++) {
        sqlite3_stmt *st = NULL;
        size_t rows = 0;
        int rc = sqlite3_prepare_v2(s->db, SQL[i], -1, &st, NULL);
        if (rc != SQLITE_OK)
            return sql_err(s->db, rc, "find job");
        if (i == 0)
            sqlite3_bind_int64(st, 1, seq);
        else
            sqlite3_bind_text(st, 1, id_or_name, -1, SQLITE_TRANSIENT);
        rc = walk_jobs(s, st, cb, ud, &rows);
        if (rc < 0 || rows)
            return rc;
    }
    return CH_E_NOTFOUND;
}

static void bind_restart(sqlite3_stmt *st, const void *p)
{
    const coord_restart_rec_t *r = p;
    sqlite3_bind_int64(st, 1, r->job_seq);
    sqlite3_bind_int64(st, 2, r->idx);
    sqlite3_bind_int64(st, 3, (sqlite3_int64)r->time_ms);
    text(st, 4, r->cause);
    sqlite3_bind_int64(st, 5, r->rank);
    text(st, 6, r->node);
    text(st, 7, r->reason);
    sqlite3_bind_int64(st, 8, (sqlite3_int64)r->failed_gen);
    sqlite3_bind_int64(st, 9, (sqlite3_int64)r->failed_step);
    sqlite3_bind_int64(st, 10, r->resumed_from);
    sqlite3_bind_int64(st, 11, (sqlite3_int64)r->steps_lost);
    sqlite3_bind_double(st, 12, r->recover_s);
    text(st, 13, r->layout_from ? r->layout_from : "");
    text(st, 14, r->layout_to ? r->layout_to : "");
    text(st, 15, r->source ? r->source : "");
}

int coord_store_restart_put(coord_store_t *s, const coord_restart_rec_t *r)
{
    return run(s, 1,
               "INSERT OR REPLACE INTO restarts (job_seq, idx, time_ms, cause, rank, node, reason,"
               " failed_gen, failed_step, resumed_from, steps_lost, recover_s, layout_from,"
               " layout_to, source)"
               " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15)",
               "store restart", bind_restart, r);
}

int coord_store_load_restarts(coord_store_t *s, coord_store_restart_cb cb, void *ud)
{
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(s->db,
                                "SELECT job_seq, idx, time_ms, cause, rank, node, reason,"
                                " failed_gen, failed_step, resumed_from, steps_lost, recover_s,"
                                " layout_from, layout_to, source FROM restarts"
                                " ORDER BY job_seq, idx",
                                -1, &st, NULL);
    if (rc != SQLITE_OK)
        return sql_err(s->db, rc, "load restarts");
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        coord_restart_rec_t r = {
            .job_seq = sqlite3_column_int64(st, 0),
            .idx = (uint32_t)sqlite3_column_int64(st, 1),
            .time_ms = (uint64_t)sqlite3_column_int64(st, 2),
            .cause = col(st, 3),
            .rank = sqlite3_column_int64(st, 4),
            .node = col(st, 5),
            .reason = col(st, 6),
            .failed_gen = (uint64_t)sqlite3_column_int64(st, 7),
            .failed_step = (uint64_t)sqlite3_column_int64(st, 8),
            .resumed_from = sqlite3_column_int64(st, 9),
            .steps_lost = (uint64_t)sqlite3_column_int64(st, 10),
            .recover_s = sqlite3_column_double(st, 11),
            .layout_from = col(st, 12),
            .layout_to = col(st, 13),
            .source = col(st, 14),
        };
        int crc = cb(ud, &r);
        if (crc < 0) {
            sqlite3_finalize(st);
            return crc;
        }
    }
    rc = sql_err(s->db, rc, "load restarts");
    sqlite3_finalize(st);
    return rc;
}

// ---------------------------------------------------------------------------------------
// status-page series

int coord_store_series_put(coord_store_t *s, int64_t job_seq, const void *blob, size_t len)
{
    sqlite3_stmt *st = NULL;
    int rc = begin(s, 0);
    if (rc < 0)
        return rc;
    rc = sqlite3_prepare_v2(
        s->db, "INSERT OR REPLACE INTO series (job_seq, updated_ms, data) VALUES (?1, ?2, ?3)", -1,
        &st, NULL);
    if (rc != SQLITE_OK)
        return sql_err(s->db, rc, "store series");
    sqlite3_bind_int64(st, 1, job_seq);
    sqlite3_bind_int64(st, 2, (sqlite3_int64)ch_wall_ms());
    sqlite3_bind_blob64(st, 3, blob, len, SQLITE_STATIC);
    rc = sql_err(s->db, sqlite3_step(st), "store series");
    sqlite3_finalize(st);
    return rc;
}

int coord_store_series_get(coord_store_t *s, int64_t job_seq, void **blob, size_t *len)
{
    sqlite3_stmt *st = NULL;
    *blob = NULL;
    *len = 0;
    int rc = sqlite3_prepare_v2(s->db, "SELECT data FROM series WHERE job_seq = ?1", -1, &st, NULL);
    if (rc != SQLITE_OK)
        return sql_err(s->db, rc, "load series");
    sqlite3_bind_int64(st, 1, job_seq);
    rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        int n = sqlite3_column_bytes(st, 0);
        const void *p = sqlite3_column_blob(st, 0);
        if (n > 0 && p && (*blob = malloc((size_t)n))) {
            memcpy(*blob, p, (size_t)n);
            *len = (size_t)n;
            rc = 0;
        } else {
            rc = n > 0 ? -ENOMEM : CH_E_NOTFOUND;
        }
    } else {
        rc = rc == SQLITE_DONE ? CH_E_NOTFOUND : sql_err(s->db, rc, "load series");
    }
    sqlite3_finalize(st);
    return rc;
}

void coord_store_stats(const coord_store_t *s, coord_store_stats_t *out)
{
    *out = s ? s->st : (coord_store_stats_t){0};
}
