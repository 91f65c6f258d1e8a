/* Checkpoint pieces: what a rank holds of each tensor, saved into its shard file and
 * restored from any layout's (DESIGN §8). The file side, without the model: chorusctl links
 * it (chorus_engine_files); the pieces of a model come from its table (ckpt.h). */
#ifndef ENG_CKPT_PIECE_H
#define ENG_CKPT_PIECE_H

#include <stddef.h>
#include <stdint.h>

#include "workerd/engine/ckpt_file.h"
#include "workerd/engine/slice.h"

/* What a rank holds of one tensor: its TP slice of the full tensor and, within it, the
 * flat range [a, b) (the whole slice, or what a ZeRO-3 shard covers of it), with the
 * parameters and Adam state of those elements (host memory, b - a floats each). Pieces are
 * what a shard file stores: a reader joins the pieces of every rank of any layout into
 * full tensors and cuts out the pieces it needs (duplicates, such as replicated
 * LayerNorms, are the same numbers; any copy is taken). */
typedef struct eng_ckpt_piece {
    char name[64]; /* Hugging Face name, "h.3.attn.c_attn.weight" */
    eng_slice_t slice;
    size_t a, b;
    float *p, *m, *v; /* save reads them; restore writes them (m, v may be NULL: skipped) */
} eng_ckpt_piece_t;

/* Write this rank's pieces as its shard of step meta->step under dir (creating
 * directories), with optim_t (the updates taken) in the metadata. p, m and v are all
 * read; a piece with a == b stores nothing; at most one piece per name. -EINVAL naming
 * the tensor when a piece's geometry does not hold together. */
int eng_ckpt_save_pieces(const char *dir, const eng_ckpt_meta_t *meta,
                         const eng_ckpt_piece_t *pieces, size_t n, uint64_t optim_t,
                         uint64_t *bytes, uint64_t *checksum, char *err, size_t errlen);
/* Fill every piece from the committed checkpoint in step_dir, whatever layout wrote it
 * (resharding at load): refuses a step without manifest.json, verifies each shard file it
 * reads against the manifest's checksum, checks that the model config equals
 * expect->cfg, and that every element of every piece is covered by the checkpoint
 * (CH_E_FORMAT naming the tensor otherwise). *optim_t and *step: the checkpoint's. Errors
 * "FILE: reason". */
int eng_ckpt_restore_pieces(const char *step_dir, const eng_ckpt_meta_t *expect,
                            eng_ckpt_piece_t *pieces, size_t n, uint64_t *optim_t, uint64_t *step,
                            char *err, size_t errlen);
/* init_from: the parameters of every piece (m and v untouched) from a Hugging Face GPT-2
 * safetensors file (names with or without "transformer."; F32, F16 or BF16; extra tensors
 * ignored; a wpe with more rows than the model's is cropped to its first rows); a missing
 * tensor or a wrong shape is CH_E_FORMAT naming both shapes. */
int eng_ckpt_load_hf(const char *path, eng_ckpt_piece_t *pieces, size_t n, char *err,
                     size_t errlen);

#endif
