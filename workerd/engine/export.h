/* Checkpoint export (DESIGN §8): consolidate the shards of one checkpoint step into a
 * single Hugging Face GPT-2 safetensors file — F32, names wte.weight [V, C] (unpadded),
 * wpe.weight, h.N.*, ln_f.*, no optimizer state — with metadata {"format": "pt"} (what
 * transformers expects) plus the model config and provenance. The file loads in GPT-2
 * tools and can start a job of any layout (train.init_from).
 *
 * The shards' metadata (layout, rank, per-tensor coverage) says how to join them; today
 * checkpoints whose shards are whole (tp = pp = 1: world size 1, or data-parallel
 * replicas, of which rank 0's is taken) are supported; tensor or pipeline sliced ones are
 * refused with a clear message until the parallel engine writes sliced shards. */
#ifndef ENG_EXPORT_H
#define ENG_EXPORT_H

#include <stddef.h>

/* ckpt_step_dir: DIR/JOB/step-XXXXXXXX. Writes out_file atomically. */
int eng_export(const char *ckpt_step_dir, const char *out_file, char *err, size_t errlen);

#endif
