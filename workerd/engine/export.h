/* Checkpoint export (DESIGN §8): consolidate the shards of one checkpoint step into a
 * single Hugging Face GPT-2 safetensors file — F32, names wte.weight [V, C] (unpadded),
 * wpe.weight, h.N.*, ln_f.*, no optimizer state — with metadata {"format": "pt"} (what
 * transformers expects) plus the model config and provenance. The file loads in GPT-2
 * tools and can start a job of any layout (train.init_from).
 *
 * Any layout: the pieces of every shard the manifest lists (tensor-parallel slices,
 * pipeline stages, ZeRO-3 ranges, data-parallel replicas) are joined into whole tensors
 * (ckpt_file.h's reader), each shard checked against the manifest's checksum; a step
 * without manifest, an element no shard holds, or a corrupt shard is an error naming it.
 * Memory: the whole model's parameters once, plus the reader's one tensor at a time. */
#ifndef ENG_EXPORT_H
#define ENG_EXPORT_H

#include <stddef.h>

#include "common/safetensors.h"

/* ckpt_step_dir: DIR/JOB/step-XXXXXXXX. Writes out_file (F32) atomically. */
int eng_export(const char *ckpt_step_dir, const char *out_file, char *err, size_t errlen);
/* The same in dtype (F32, F16 or BF16, rounded to nearest even). hf_dir: out is a folder
 * (created if missing) that gets model.safetensors and the config.json of a GPT-2 that
 * transformers' from_pretrained(out) loads. */
int eng_export_as(const char *ckpt_step_dir, const char *out, ch_st_dtype_t dtype, int hf_dir,
                  char *err, size_t errlen);

#endif
