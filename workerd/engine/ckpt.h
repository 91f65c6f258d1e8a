/* Checkpoint shards of a model: save and restore. Paths, metadata, manifests, pruning and
 * verification are the file side, ckpt_file.h (which this includes); DESIGN §8 and the
 * format are described there. */
#ifndef ENG_CKPT_H
#define ENG_CKPT_H

#include <stddef.h>
#include <stdint.h>

#include "workerd/engine/ckpt_file.h"
#include "workerd/engine/model.h"
#include "workerd/engine/optim.h"

/* Write this rank's shard of step meta->step under dir (creating directories).
 * meta->cfg must be the model's config. */
int eng_ckpt_save(const char *dir, const eng_ckpt_meta_t *meta, eng_model_t *m,
                  const eng_optim_t *o, uint64_t *bytes, uint64_t *checksum, char *err,
                  size_t errlen);
/* Load shard `expect->rank` of the checkpoint in step_dir into m and o, after checking
 * that its layout, world size and model config equal expect's and, when a manifest is
 * present, that the file's checksum matches it. *step is the checkpoint's step; o->t is
 * restored. CH_E_FORMAT / CH_E_CONFIG with "FILE: reason". */
int eng_ckpt_restore(const char *step_dir, const eng_ckpt_meta_t *expect, eng_model_t *m,
                     eng_optim_t *o, uint64_t *step, char *err, size_t errlen);

#endif
