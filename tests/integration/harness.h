/* Integration-test harness: real coordinatord and workerd processes on 127.0.0.1, each
 * cluster in a fresh directory under $CHORUS_TEST_TMP, binaries from $CHORUS_BIN_DIR.
 *
 * A cluster is started with `chorusctl local up` (so the tests exercise it too) with
 * short timings (heartbeat 100 ms, dead after 1 s). The harness remembers the one
 * cluster a test started, and h_teardown() — the suite's Criterion .fini, which runs
 * even when an assertion failed — stops it. Every wait is bounded; h_wait_until polls
 * a condition until a deadline. Functions return 0 or a negative code unless stated. */
#ifndef H_HARNESS_H
#define H_HARNESS_H

#include <limits.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "chorus.pb-c.h"
#include "common/auth.h"
#include "common/json.h"

#define H_HEARTBEAT_MS   100
#define H_DEAD_AFTER_MS  1000
#define H_RUN_TIMEOUT_MS 60000
/* Room left in a PATH_MAX buffer for the names the harness appends to a cluster dir. */
#define H_DIR_MAX (PATH_MAX - 64)

/* Result of running a program: its exit status (128 + signal when killed) and what it
 * printed (NUL-terminated, owned; h_out_free). */
typedef struct h_out {
    int status;
    char *out, *err;
} h_out_t;

void h_out_free(h_out_t *o);

typedef struct h_cluster {
    char dir[H_DIR_MAX]; /* the local-up dir */
    char sock[PATH_MAX]; /* DIR/ctl.sock */
    char key[PATH_MAX];  /* DIR/cluster.key */
    char addr[64];       /* coordinator HOST:PORT */
    int nodes, slots;
    double up_seconds; /* time `local up` reported from start to all nodes alive */
} h_cluster_t;

/* Path of a binary in $CHORUS_BIN_DIR (static buffer per call site is not kept: out). */
void h_bin(const char *name, char out[PATH_MAX]);

/* Run argv (argv[0] a path) with a deadline; capture stdout and stderr.
 * -ETIMEDOUT (the child is killed) when it runs past timeout_ms. */
int h_run(h_out_t *o, int timeout_ms, char *const argv[]);
/* Run chorusctl --socket <cluster socket> args... (NULL-terminated); c may be NULL for
 * commands that need no cluster. */
int h_ctl(const h_cluster_t *c, h_out_t *o, ...) __attribute__((sentinel));
/* Run chorusctl ... --json, require exit status 0 and parse stdout; NULL on any failure
 * (reported on stderr). Free with ch_json_free. */
ch_json_t *h_ctl_json(const h_cluster_t *c, ...) __attribute__((sentinel));

/* chorusctl submit jobfile --wait: returns the exit status of chorusctl (negative when it
 * could not be run or ran past H_RUN_TIMEOUT_MS) and copies the job id it printed into id
 * ("" if none). o keeps what it printed (h_out_free). */
int h_submit_wait(const h_cluster_t *c, h_out_t *o, const char *jobfile, char *id, size_t n);

/* Start a cluster of nodes x slots with `chorusctl local up`; registers it for
 * h_teardown. */
int h_cluster_up(h_cluster_t *c, int nodes, int slots);
/* Stop it (`chorusctl local down`); idempotent. */
void h_cluster_down(h_cluster_t *c);
/* Criterion .fini: stop the cluster this test started, if any. */
void h_teardown(void);

/* Pid recorded by local up for "coordinatord" or "node<i>", or -1. */
pid_t h_pid(const h_cluster_t *c, const char *who);
/* 1 when the process has ended (a zombie counts as ended). */
int h_gone(pid_t pid);
/* Send sig and wait (bounded) until the process is gone. */
int h_kill_wait(pid_t pid, int sig, int timeout_ms);
/* Start coordinatord again on the same state dir, flags and port (after a crash); its
 * metrics address gets a new ephemeral port (h_metrics_addr). */
int h_coord_restart(h_cluster_t *c);
/* The coordinator's metrics and status-page address (HOST:PORT) as it published it. */
int h_metrics_addr(const h_cluster_t *c, char *addr, size_t n);
/* Start workerd node<i> again with local up's flags (after it was killed). */
int h_worker_restart(h_cluster_t *c, int i);
/* Start one more workerd for c's cluster as `local up` would, named name (its log, pid file
 * and run dir are DIR/name.*, so h_teardown stops it too), with --slots and --device as
 * given. 0 once it is started, not registered. */
int h_worker_spawn(h_cluster_t *c, const char *name, const char *slots, const char *device);
/* h_worker_spawn with one more flag (e.g. "--keep-ranks"); NULL: none. */
int h_worker_spawn_flag(h_cluster_t *c, const char *name, const char *slots, const char *device,
                        const char *flag);

/* Poll pred(ud) every interval_ms until it returns non-zero (returned) or timeout_ms
 * passes (0). A negative return from pred also ends the wait (returned). */
int h_wait_until(int (*pred)(void *ud), void *ud, int timeout_ms, int interval_ms);

/* Ask the coordinator directly (no chorusctl process, for latency measurements). */
int h_node_state(const h_cluster_t *c, const char *node, char *state, size_t n);
/* Number of nodes in state "alive". */
int h_alive_count(const h_cluster_t *c);
/* State of a job via the control socket; *info freed by the caller with ch_msg_free
 * (it is the reply envelope; info points into it). */
int h_job_query(const h_cluster_t *c, const char *job, Chorus__Envelope **reply);

/* Submit a job file's text straight to the coordinator, without chorusctl's checks of
 * the files it names (which a rank then meets as it is). The job id into id. */
int h_submit_raw(const h_cluster_t *c, const char *ini, char *id, size_t n);

/* Files. */
int h_write_file(const char *path, const char *text);
/* Size of a file now (0 if missing): remember it before provoking a log line. */
size_t h_file_size(const char *path);
/* 1 when the file's bytes after offset contain needle (case-insensitive). */
int h_file_has_since(const char *path, size_t offset, const char *needle);
/* 1 when text contains needle (case-insensitive). */
int h_has(const char *text, const char *needle);

/* JSON helpers over common/json.h. */
const ch_json_t *h_json_at(const ch_json_t *arr, size_t i);
double h_json_num(const ch_json_t *obj, const char *key);      /* NaN when absent */
const char *h_json_str(const ch_json_t *obj, const char *key); /* "" when absent */

/* ---- hand-made protocol peers, for the refusal tests ---- */

/* TCP connection to HOST:PORT; returns the fd or a negative code. */
int h_tcp_connect(const char *addr);
/* The local port of a connected socket (names the peer in the daemon's log). */
int h_local_port(int fd);
int h_send_all(int fd, const void *buf, size_t len);
/* Run the client side of the handshake (auth.h) with key over fd; s is the keyed
 * session afterwards. A wrong key gives CH_E_AUTH (checked on the server's proof), or
 * when send_bad_proof is set the client answers with a wrong proof instead. */
int h_raw_handshake(int fd, const ch_key_t *key, const char *role, int send_bad_proof,
                    ch_session_t *s);
/* Receive one frame and decode it with s (NULL: untagged). */
int h_raw_recv(int fd, ch_session_t *s, int timeout_ms, Chorus__Envelope **out);
/* 1 when the peer closed the connection within timeout_ms (EOF or reset), else 0. */
int h_peer_closed(int fd, int timeout_ms);

#endif
