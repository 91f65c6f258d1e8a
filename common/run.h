/* A training run's folder (DESIGN §8): what makes a run outlive its coordinator.
 *
 * A job's checkpoints live in DIR/NAME/ (checkpoint.dir, job.name), never under a
 * per-coordinator job id: step s in DIR/NAME/step-<s, 8 digits>/, and beside the steps
 * run.json, which names the run ({"format", "run_id", "name", "created_ms", "model",
 * "resumed_from"}), and metrics.jsonl, the run's history (one JSON object a step).
 *
 * The coordinator stamps every train job with a run id at submit (checkpoint.run_id):
 * the id in DIR/NAME/run.json when the job continues that run (train.resume = auto, or a
 * PATH inside that folder), else a new one. Rank 0 writes run.json before the first step
 * when the folder has none; every rank refuses a folder whose run.json names another run.
 * So two runs never mix their checkpoints, under one coordinator or several.
 *
 * ch_run_check is the one check of a job against the filesystem, run as the job's user:
 * at submit (the coordinator forks a child that takes the job's uid and gid) and by each
 * rank before its first step. Failures are CH_E_CONFIG or -EACCES with "field: reason"
 * naming the path and, for permissions, the user. */
#ifndef CH_RUN_H
#define CH_RUN_H

#include <stddef.h>
#include <stdint.h>

#include "common/jobspec.h"

#define CH_RUN_FORMAT  "chorus-run-1"
#define CH_RUN_FILE    "run.json"
#define CH_RUN_METRICS "metrics.jsonl"
#define CH_RUN_ID_LEN  40

typedef struct ch_run {
    char id[CH_RUN_ID_LEN]; /* "r-" and 16 hex digits */
    char name[64];
    uint64_t created_ms;
    uint32_t layers, heads, embd, vocab, seq_len;
    char resumed_from[CH_PATH_LEN]; /* the step dir the run started from, or "" */
} ch_run_t;

/* DIR/NAME of spec (checkpoint.dir must be set). -ENAMETOOLONG; CH_E_CONFIG for a name
 * that is not one path component. */
int ch_run_folder(const ch_jobspec_t *spec, char *out, size_t outlen);
/* A fresh run id into id (CH_RUN_ID_LEN bytes). */
void ch_run_new_id(char *id);
/* folder/run.json: 0 and *run; -ENOENT without one; CH_E_FORMAT naming the file. */
int ch_run_read(const char *folder, ch_run_t *run, char *err, size_t errlen);
/* Write folder/run.json atomically (the folder exists). */
int ch_run_write(const char *folder, const ch_run_t *run, char *err, size_t errlen);
/* Newest committed step (step-N with manifest.json) in folder: 0 and *step, or
 * CH_E_NOTFOUND. */
int ch_run_latest(const char *folder, uint64_t *step);

/* Where a job resumes from: "" (a fresh start) or a committed step dir, and that step. */
typedef struct ch_run_resume {
    char step_dir[CH_PATH_LEN];
    uint64_t step;
    char run_id[CH_RUN_ID_LEN]; /* the run the job belongs to: continued, or "" (new) */
} ch_run_resume_t;

/* The filesystem side of a train job, as the calling process's user:
 *  - checkpoint.dir/NAME can be created and written (ranks: created, and a file written
 *    in it); train.data and train.init_from can be read;
 *  - train.resume = auto: the newest committed step of DIR/NAME if any (a fresh start
 *    otherwise); PATH: a committed step dir, or a run folder's newest committed step;
 *    the step's model must be the job's ([model]), checked on its rank 0 shard;
 *  - DIR/NAME's run.json, when there is one, names the run this job continues: a job
 *    that is not resuming it (no train.resume, or a PATH of another run), or whose
 *    checkpoint.run_id is another run, is refused.
 * ranks: 1 for a rank before its first step (creates the folder), 0 at submit.
 * *out (may be NULL): what the job resumes from. Diag jobs and jobs without
 * checkpoint.dir check only what they read. */
int ch_run_check(const ch_jobspec_t *spec, int ranks, ch_run_resume_t *out, char *err,
                 size_t errlen);

#endif
