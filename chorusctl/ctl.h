/* chorusctl: the control CLI (DESIGN §10).
 *
 * Every command is a function `int ctl_cmd_<name>(ctl_t *ctl, int argc, char **argv)`
 * that gets the words after the command name (global options already removed) and
 * returns the process exit status. Helpers below the command layer that talk to the
 * coordinator also return exit statuses and print their own one-line diagnostic, so
 * each failure is reported once, where its context is known. */
#ifndef CTL_CTL_H
#define CTL_CTL_H

#include <getopt.h>
#include <stddef.h>
#include <stdint.h>

#include "chorus.pb-c.h"
#include "common/client.h"

/* Exit statuses (sysexits.h values where one fits). Scripts rely on them. */
enum {
    CTL_EXIT_OK = 0,
    CTL_EXIT_FAILED = 1,       /* a job that failed/was cancelled under --wait; other errors */
    CTL_EXIT_USAGE = 2,        /* bad command line */
    CTL_EXIT_UNREACHABLE = 69, /* coordinator unreachable (EX_UNAVAILABLE) */
    CTL_EXIT_CONFIG = 78,      /* bad job file, key or configuration (EX_CONFIG) */
};

#define CTL_DEFAULT_SOCKET     "/run/chorus/ctl.sock"
#define CTL_CONNECT_TIMEOUT_MS 5000
#define CTL_CALL_TIMEOUT_MS    15000

typedef struct ctl {
    const char *socket_path; /* Unix control socket; used unless coordinator is set */
    const char *coordinator; /* "HOST:PORT": TCP with the cluster key */
    const char *key_path;    /* key file for TCP */
    int json;                /* --json: print exactly one JSON document */
} ctl_t;

/* "chorusctl: <message>" on stderr. */
void ctl_errf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Parse a decimal integer in [min, max]; -EINVAL otherwise. */
int ctl_parse_long(const char *s, long min, long max, long *out);
/* Sleep ms milliseconds (resumed after signals). */
void ctl_pause_ms(unsigned ms);
/* What ctl talks to, for messages: the socket path or HOST:PORT. */
const char *ctl_target(const ctl_t *ctl);

/* ---- command-line options (args.c): getopt_long for every command ---- */

/* One option of a command. A command's table (ending with a NULL name) is what it parses
 * and what `help COMMAND` and bash completion show (main.c's command rows point at it). */
typedef struct ctl_opt {
    const char *name; /* long name without "--"; NULL ends the table */
    int key;          /* what ctl_args_next returns: a letter (also -LETTER) or >= 256 */
    const char *arg;  /* the value's name in help ("N"); NULL: a flag without a value */
    const char *help;
} ctl_opt_t;

#define CTL_OPTS_MAX 32

typedef struct ctl_args {
    const char *cmd; /* for messages and usage */
    int argc;
    char **argv; /* getopt's view: argv[-1] of the command, permuted while parsing */
    struct option lopts[CTL_OPTS_MAX + 1];
    char shorts[2 * CTL_OPTS_MAX + 2];
    int npos; /* the positional words, once ctl_args_next returned 0 */
    char **pos;
} ctl_args_t;

/* Parse a command's argc/argv (the words after its name; argv[-1] must be the name, as
 * main passes it) against opts. Returns 0, or -1 having said why. */
int ctl_args_begin(ctl_args_t *a, const char *cmd, const ctl_opt_t *opts, int argc, char **argv);
/* The next option: its key, *val its value (NULL for a flag); 0 at the end, the positional
 * words (options may come after them, `--` ends options) in a->pos; -1 for an unknown
 * option or a missing value, having printed the message and the command's usage. */
int ctl_args_next(ctl_args_t *a, const char **val);
/* A command without options: *argc and *argv become its positional words (`--` allowed).
 * Returns CTL_EXIT_OK, or CTL_EXIT_USAGE having printed why and the usage. */
int ctl_args_words(const char *cmd, int *argc, char ***argv);
/* Print a command's usage lines (its rows of the command table) on stderr (main.c). */
void ctl_usage(const char *cmd);

/* Option tables of the commands that have options (with their parsers). */
extern const ctl_opt_t ctl_opts_jobs[], ctl_opts_submit[], ctl_opts_status[], ctl_opts_logs[],
    ctl_opts_local[], ctl_opts_export[], ctl_opts_jobfile[], ctl_opts_plan[], ctl_opts_plan_auto[],
    ctl_opts_drain[];

/* ---- talking to the coordinator (rpc.c) ---- */

/* Connect. Returns an exit status; 0 and *out (free with ch_client_destroy) on success. */
int ctl_open(const ctl_t *ctl, ch_client_t **out);
/* Send req and wait for a reply whose body is want. what prefixes the message of an
 * Error reply ("chorusctl: <what>: <message>"; NULL: no prefix). Returns an exit status;
 * 0 and *resp (free with ch_msg_free) on success. */
int ctl_call(const ctl_t *ctl, ch_client_t *cl, Chorus__Envelope *req,
             Chorus__Envelope__BodyCase want, const char *what, Chorus__Envelope **resp);
/* ctl_open + ctl_call + close, for one-shot commands. */
int ctl_rpc(const ctl_t *ctl, Chorus__Envelope *req, Chorus__Envelope__BodyCase want,
            const char *what, Chorus__Envelope **resp);
/* Query one job (id or name) on an open link. Same contract as ctl_call. */
int ctl_query_job(const ctl_t *ctl, ch_client_t *cl, const char *job, Chorus__Envelope **resp);

/* ---- commands ---- */
int ctl_cmd_keygen(ctl_t *ctl, int argc, char **argv);
int ctl_cmd_nodes(ctl_t *ctl, int argc, char **argv);
int ctl_cmd_node(ctl_t *ctl, int argc, char **argv);
int ctl_cmd_drain(ctl_t *ctl, int argc, char **argv);
int ctl_cmd_resume(ctl_t *ctl, int argc, char **argv);
int ctl_cmd_jobs(ctl_t *ctl, int argc, char **argv);
int ctl_cmd_submit(ctl_t *ctl, int argc, char **argv);
int ctl_cmd_status(ctl_t *ctl, int argc, char **argv);
int ctl_cmd_watch(ctl_t *ctl, int argc, char **argv); /* watch.c */
int ctl_cmd_cancel(ctl_t *ctl, int argc, char **argv);
int ctl_cmd_checkpoint(ctl_t *ctl, int argc, char **argv);
int ctl_cmd_kill_rank(ctl_t *ctl, int argc, char **argv);
int ctl_cmd_logs(ctl_t *ctl, int argc, char **argv);
int ctl_cmd_local(ctl_t *ctl, int argc, char **argv);
int ctl_cmd_export(ctl_t *ctl, int argc, char **argv);
int ctl_cmd_plan(ctl_t *ctl, int argc, char **argv);
int ctl_cmd_jobfile(ctl_t *ctl, int argc, char **argv);

/* ---- job files, shared by submit and plan (jobfile.c) ---- */

struct ch_jobspec;
/* Read file, parse it over the defaults, apply the "section.key=value" overrides in
 * order, and validate with file checks. Returns an exit status: 0 with *spec filled,
 * or CTL_EXIT_CONFIG having printed "chorusctl: FILE: field: reason". */
int ctl_jobfile_load(const char *file, char *const *sets, int nsets, struct ch_jobspec *spec);

/* ---- job rendering shared by jobs/status/watch (jobs.c) ---- */

/* 1 when a job in this state will not change any more. */
int ctl_job_state_final(const char *state);
/* Exit status for a job that ended: 0 completed, 1 failed or cancelled. */
int ctl_job_exit_status(const char *state);
struct ctl_json;
/* One status object (DESIGN §10 plus mfu, reason, ranks). */
void ctl_job_json(struct ctl_json *j, const Chorus__JobInfo *ji);
/* Human-readable status: a key/value block and a table of ranks. */
void ctl_job_print(const Chorus__JobInfo *ji, int all_history);
/* "12.3k" style number with an SI suffix; "-" when v is not finite or negative. */
void ctl_fmt_si(char *buf, size_t n, double v);
/* "1:02:03" / "4:05" / "7s"; "-" when unknown (negative). */
void ctl_fmt_duration(char *buf, size_t n, double seconds);

#endif
