/* Durable coordinator state (DESIGN §4): SQLite in <state-dir>/state.db, WAL journal,
 * synchronous=FULL, so a row written before a reply or an action survives a crash at any
 * instant. Tables: nodes, jobs, events (an append-only log of state changes). This is
 * the only module that includes sqlite3.h; SQLite errors become Chorus codes in one
 * function here.
 *
 * Batching (DESIGN §13). Writes go into one transaction, opened by the first write and
 * committed (one fsync) by coord_store_commit, which the coordinator calls once per loop
 * turn before it sleeps: a storm of 2,000 registrations costs a few commits, not 4,000.
 * "Journal, then send" still holds: journal writes (jobs, restarts, forgetting a node)
 * mark the transaction, and coord_store_commit_journal, called before anything leaves
 * for a node and before a control reply that acknowledges a write, commits it first. The
 * other writes (node rows, the event log, status-page series) acknowledge nothing (a
 * restarted coordinator takes every node for dead until it registers again) and ride
 * along with the next commit, at the latest at the end of the loop turn.
 *
 * Records use plain strings for states so the database reads well in the sqlite3 shell.
 * The status page's series (series.h) are one opaque blob per job in table series. */
#ifndef COORD_STORE_H
#define COORD_STORE_H

#include <stddef.h>
#include <stdint.h>

typedef struct coord_store coord_store_t;

/* Since the store was opened: write statements, and commits (each one fsync). */
typedef struct coord_store_stats {
    uint64_t writes, commits;
} coord_store_stats_t;
void coord_store_stats(const coord_store_t *s, coord_store_stats_t *out);

typedef struct coord_node_rec {
    const char *name, *state, *rack, *device;
    uint32_t slots;
    uint64_t updated_ms; /* wall clock */
} coord_node_rec_t;

typedef struct coord_job_rec {
    int64_t seq; /* job id is "j<seq>"; assigned by coord_store_job_insert */
    const char *name, *kind, *ini, *state, *reason;
    const char *placement; /* "node:local_rank" per rank, comma separated; "" before start */
    uint64_t generation;
    uint32_t restarts;
    uint64_t step, total_steps;
    double loss;
    int64_t last_ckpt_step;                         /* -1: none */
    uint64_t submitted_ms, started_ms, finished_ms; /* wall clock; 0: not yet */
} coord_job_rec_t;

/* One restart of a job (its history, DESIGN §9): what failed and what the restart cost. */
typedef struct coord_restart_rec {
    int64_t job_seq;
    uint32_t idx;     /* 0, 1, ... per job */
    uint64_t time_ms; /* wall clock of the detection */
    const char *cause, *node, *reason;
    int64_t rank; /* the failed (or culprit) rank; -1: none */
    uint64_t failed_gen, failed_step;
    int64_t resumed_from; /* step the next generation resumed from; -1: not restarted (yet) */
    uint64_t steps_lost;
    double recover_s; /* detection -> first completed step of the next generation; -1: not yet */
    /* fault.elastic: the layouts given up and resumed in, "tp,pp,dp,microbatches,
     * micro_batch_size"; "" (or NULL when writing): unchanged */
    const char *layout_from, *layout_to;
    const char *source; /* "memory" | "disk" | "" (checkpoint.memory_every) */
} coord_restart_rec_t;

/* Open (creating dir/state.db and the schema when missing). */
int coord_store_open(const char *dir, coord_store_t **out);
/* Open a database file by path (":memory:" works); for tests and tools. */
int coord_store_open_path(const char *path, coord_store_t **out);
/* Commits what is pending first. */
void coord_store_close(coord_store_t *s);
/* Commit the open transaction, if any (a failure is logged and the writes rolled back). */
int coord_store_commit(coord_store_t *s);
/* Commit only if journal writes are pending: before sending, so nothing a message relies
 * on can be lost in a crash after it left. */
int coord_store_commit_journal(coord_store_t *s);

/* Insert or replace a node row by name. */
int coord_store_node_put(coord_store_t *s, const coord_node_rec_t *n);
/* Delete a node row (a forgotten node). */
int coord_store_node_delete(coord_store_t *s, const char *name);
/* Insert a new job; rec->seq is ignored and the new sequence number is returned in *seq.
 * Sequence numbers only increase, also across reopen (AUTOINCREMENT). */
int coord_store_job_insert(coord_store_t *s, const coord_job_rec_t *rec, int64_t *seq);
/* Update every field of the job rec->seq. CH_E_NOTFOUND when there is no such job. */
int coord_store_job_update(coord_store_t *s, const coord_job_rec_t *rec);
/* Append one event; any of job/node may be NULL, rank -1 for none. */
int coord_store_event(coord_store_t *s, const char *job, uint64_t gen, int64_t rank,
                      const char *node, const char *what);

/* Replay every row, in insertion order. A callback returning < 0 stops the walk and its
 * code is returned. Records and their strings are borrowed for the call only. */
typedef int (*coord_store_node_cb)(void *ud, const coord_node_rec_t *n);
typedef int (*coord_store_job_cb)(void *ud, const coord_job_rec_t *j);
int coord_store_load_nodes(coord_store_t *s, coord_store_node_cb cb, void *ud);
int coord_store_load_jobs(coord_store_t *s, coord_store_job_cb cb, void *ud);
/* The one job "j<seq>" names, else the most recent one named id_or_name, to cb;
 * CH_E_NOTFOUND when there is none. */
int coord_store_find_job(coord_store_t *s, const char *id_or_name, coord_store_job_cb cb, void *ud);
/* Insert or replace one restart by (job_seq, idx). */
int coord_store_restart_put(coord_store_t *s, const coord_restart_rec_t *r);
typedef int (*coord_store_restart_cb)(void *ud, const coord_restart_rec_t *r);
/* Every restart, ordered by job and index. */
int coord_store_load_restarts(coord_store_t *s, coord_store_restart_cb cb, void *ud);

/* ---- status-page series (series.h): one blob per job, replaced whole ---- */
int coord_store_series_put(coord_store_t *s, int64_t job_seq, const void *blob, size_t len);
/* 0 and *blob (malloc'd, caller frees) with *len; CH_E_NOTFOUND when the job has none. */
int coord_store_series_get(coord_store_t *s, int64_t job_seq, void **blob, size_t *len);

#endif
