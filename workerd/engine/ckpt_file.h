/* Checkpoints (DESIGN §8).
 *
 * Step s of job J lives in DIR/J/step-<s, 8 digits>/; each rank writes its shard
 * rank-<r, 5 digits>.safetensors there: the pieces it holds (ckpt_piece.h's eng_ckpt_piece_t),
 * parameters under their Hugging Face names, Adam state as "optim.m.<name>" and
 * "optim.v.<name>" (a whole tensor in its Hugging Face shape, wte without its padding
 * rows; any other piece 1-D with metadata "slice.<name>" saying where it sits), and
 * metadata describing the layout, the step, the rank, the model and the data position
 * (see ckpt_file.c for the keys), so the shards of any layout can be joined and cut again
 * for another (the reader below). Files are written atomically and reported as (bytes,
 * ch_hash64 checksum).
 *
 * "step s" means s updates done: restoring it and running step s next reproduces the
 * uninterrupted run bit for bit. A step is committed once manifest.json exists in its
 * directory: rank 0 writes it once every rank's shard is written (the trainer gathers
 * their sizes and checksums over the data-parallel group). Only committed steps are resumed from;
 * the last `keep` committed steps are kept. */
#ifndef ENG_CKPT_FILE_H
#define ENG_CKPT_FILE_H

#include <stddef.h>
#include <stdint.h>

#include "common/layout.h"
#include "common/plan.h"
#include "common/safetensors.h"
#include "workerd/engine/slice.h"

#define ENG_CKPT_FORMAT "chorus-ckpt-1"

typedef struct eng_ckpt_meta {
    char job[64];
    uint64_t step;
    ch_layout_t layout;
    uint32_t rank, world;
    ch_model_cfg_t cfg;
    uint64_t seed;      /* the job's seed (model init) */
    uint64_t data_seed; /* sampling seed; the data position is `step` */
} eng_ckpt_meta_t;

typedef struct eng_ckpt_file {
    uint32_t rank;
    uint64_t bytes, checksum;
} eng_ckpt_file_t;

/* "DIR/JOB/step-00000020" into out. -ENAMETOOLONG when it does not fit. */
int eng_ckpt_step_dir(const char *dir, const char *job, uint64_t step, char *out, size_t outlen);

/* Commit: manifest.json (job, step, layout, world, files with bytes and checksums). */
int eng_ckpt_write_manifest(const char *dir, const eng_ckpt_meta_t *meta,
                            const eng_ckpt_file_t *files, size_t nfiles, char *err, size_t errlen);
/* Keep the newest `keep` committed steps of job (keep <= 0: keep all): remove every
 * step directory older than the oldest kept, committed or not. */
int eng_ckpt_prune(const char *dir, const char *job, int64_t keep);
/* Newest committed step of job: 0 and *step, or CH_E_NOTFOUND. */
int eng_ckpt_latest(const char *dir, const char *job, uint64_t *step);

/* The files step_dir's manifest lists (*files malloc'd, the caller frees it). -ENOENT
 * ("not committed") without a manifest, CH_E_FORMAT when it is malformed or lists none. */
int eng_ckpt_read_manifest(const char *step_dir, eng_ckpt_file_t **files, size_t *nfiles, char *err,
                           size_t errlen);
/* Check that the file at path has want's size and checksum (CH_E_FORMAT naming it). */
int eng_ckpt_check_file(const char *path, const eng_ckpt_file_t *want, char *err, size_t errlen);
/* Check that rank's shard in step_dir has the checksum the manifest lists (CH_E_FORMAT
 * naming the file otherwise); -ENOENT when the step has no manifest (not committed: its
 * shards are never loaded unverified). */
int eng_ckpt_verify(const char *step_dir, uint32_t rank, char *err, size_t errlen);

/* A shard's metadata (restore, export). CH_E_FORMAT when missing or malformed. */
int eng_ckpt_meta_of(const ch_st_file_t *f, eng_ckpt_meta_t *meta, char *err, size_t errlen);

/* Metadata key of f as an unsigned number: CH_E_FORMAT naming the key when missing or not
 * a number. */
int eng_ckpt_meta_u64(const ch_st_file_t *f, const char *key, uint64_t *out, char *err,
                      size_t errlen);
// ----------------------------------------------------------------------------
// reading a committed step, whatever layout wrote it (ckpt_piece.c)

struct eng_ckpt_piece; /* ckpt_piece.h */
typedef struct eng_ckpt_reader eng_ckpt_reader_t;

/* Open the committed step in step_dir: its manifest (-ENOENT without one) and every shard
 * it lists, indexed by tensor name (headers and metadata only; a shard's checksum is
 * checked against the manifest the first time its data is used). The shards must agree on
 * step, model and optimizer step count. prefer: the rank whose shard is read first when
 * several hold the same piece, so a rank resuming its own layout reads its own file only.
 * *out is the caller's (eng_ckpt_reader_close). */
int eng_ckpt_reader_open(const char *step_dir, uint32_t prefer, eng_ckpt_reader_t **out, char *err,
                         size_t errlen);
void eng_ckpt_reader_close(eng_ckpt_reader_t *r);
/* The first listed shard's metadata (step, model, seeds; rank and layout are that
 * shard's) and the optimizer's step count. */
const eng_ckpt_meta_t *eng_ckpt_reader_meta(const eng_ckpt_reader_t *r);
uint64_t eng_ckpt_reader_optim_t(const eng_ckpt_reader_t *r);
/* Fill each piece's p (and m, v unless NULL) from the step: a stored piece of exactly the
 * same geometry and range is copied; otherwise the stored pieces of the tensor are joined
 * into the full tensor (one at a time: about three full tensors of memory) and the piece
 * is cut from it. CH_E_FORMAT "STEP_DIR: tensor NAME: ..." when an element is not covered
 * or the shapes differ; -EINVAL for a piece whose geometry is inconsistent. */
int eng_ckpt_reader_fill(eng_ckpt_reader_t *r, struct eng_ckpt_piece *pieces, size_t n, char *err,
                         size_t errlen);

/* DIR/rank-<r, 5 digits>.safetensors into out. -ENAMETOOLONG when it does not fit. */
int eng_ckpt_shard_path(const char *step_dir, uint32_t rank, char *out, size_t outlen);
/* The shard metadata keys of meta, the optimizer's step count and shard ("full": every
 * tensor whole; "pieces") into w. */
int eng_ckpt_put_meta(ch_st_writer_t *w, const eng_ckpt_meta_t *meta, uint64_t optim_t,
                      const char *shard);

#endif
