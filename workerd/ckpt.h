/* Checkpoints (DESIGN §8).
 *
 * Step s of job J lives in DIR/J/step-<s, 8 digits>/; each rank writes its shard
 * rank-<r, 5 digits>.safetensors there: parameters under their Hugging Face names (this
 * rank's piece; wte without its padding rows), Adam state as "optim.m.<name>" and
 * "optim.v.<name>", and metadata describing the layout, the step, the rank, the model
 * and the data position (see ckpt.c for the keys), so shards of any layout can later be
 * joined. Files are written atomically and reported as (bytes, ch_hash64 checksum).
 *
 * "step s" means s updates done: restoring it and running step s next reproduces the
 * uninterrupted run bit for bit. A step is committed once manifest.json exists in its
 * directory: rank 0 writes it once every rank's shard is written (the trainer gathers
 * their sizes and checksums over the data-parallel group). Only committed steps are resumed from;
 * the last `keep` committed steps are kept. */
#ifndef WRK_CKPT_H
#define WRK_CKPT_H

#include <stddef.h>
#include <stdint.h>

#include "common/layout.h"
#include "model.h"
#include "optim.h"
#include "common/safetensors.h"

#define WRK_CKPT_FORMAT "chorus-ckpt-1"

typedef struct wrk_ckpt_meta {
    char job[64];
    uint64_t step;
    ch_layout_t layout;
    uint32_t rank, world;
    eng_config_t cfg;
    uint64_t seed;      /* the job's seed (model init) */
    uint64_t data_seed; /* sampling seed; the data position is `step` */
} wrk_ckpt_meta_t;

typedef struct wrk_ckpt_file {
    uint32_t rank;
    uint64_t bytes, checksum;
} wrk_ckpt_file_t;

/* "DIR/JOB/step-00000020" into out. -ENAMETOOLONG when it does not fit. */
int wrk_ckpt_step_dir(const char *dir, const char *job, uint64_t step, char *out, size_t outlen);

/* Write this rank's shard of step meta->step under dir (creating directories).
 * meta->cfg must be the model's config. */
int wrk_ckpt_save(const char *dir, const wrk_ckpt_meta_t *meta, eng_model_t *m,
                  const wrk_optim_t *o, uint64_t *bytes, uint64_t *checksum, char *err,
                  size_t errlen);
/* Commit: manifest.json (job, step, layout, world, files with bytes and checksums). */
int wrk_ckpt_write_manifest(const char *dir, const wrk_ckpt_meta_t *meta,
                            const wrk_ckpt_file_t *files, size_t nfiles, char *err, size_t errlen);
/* Keep the newest `keep` committed steps of job (keep <= 0: keep all): remove every
 * step directory older than the oldest kept, committed or not. */
int wrk_ckpt_prune(const char *dir, const char *job, int64_t keep);
/* Newest committed step of job: 0 and *step, or CH_E_NOTFOUND. */
int wrk_ckpt_latest(const char *dir, const char *job, uint64_t *step);

/* Load shard `expect->rank` of the checkpoint in step_dir into m and o, after checking
 * that its layout, world size and model config equal expect's and, when a manifest is
 * present, that the file's checksum matches it. *step is the checkpoint's step; o->t is
 * restored. CH_E_FORMAT / CH_E_CONFIG with "FILE: reason". */
int wrk_ckpt_restore(const char *step_dir, const wrk_ckpt_meta_t *expect, eng_model_t *m,
                     wrk_optim_t *o, uint64_t *step, char *err, size_t errlen);

/* When step_dir holds a manifest, check that rank's shard has the checksum it lists
 * (CH_E_FORMAT naming the file otherwise). 0 without a manifest. */
int wrk_ckpt_verify(const char *step_dir, uint32_t rank, char *err, size_t errlen);

/* A shard's metadata (restore, export). CH_E_FORMAT when missing or malformed. */
int wrk_ckpt_meta_of(const ch_st_file_t *f, wrk_ckpt_meta_t *meta, char *err, size_t errlen);

#endif
