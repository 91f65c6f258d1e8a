/* Where one rank's piece of a tensor sits in the full Hugging Face tensor (DESIGN §5, §8):
 * the geometry tensor parallelism cuts (model.h's eng_tensor_t lo/hi/parts) and, inside
 * that TP slice, the flat range a ZeRO-3 shard holds. Checkpoints store it per piece, so
 * pieces written by any layout can be joined into full tensors and cut again for another
 * (resharding at load, export, init_from). Pure arithmetic: no model, no kernels.
 *
 * The slice's own layout, which its flat indices [0, numel) walk in order: for each row r
 * in [lo[0], hi[0]), for each part q in [0, parts), the columns [lo[1], hi[1]) of that
 * part. Element (r, q, c) is element r * cols + q * (cols / parts) + c of the full tensor,
 * cols = shape[1]. A 1-D tensor [n] is one row of n columns: its range is lo[0] .. hi[0]
 * taken as the column range, exactly as model.c's fill_slice walks it (rows 0..1,
 * columns lo[0]..hi[0] within each of `parts` parts of n / parts). Rows at or past
 * shape[0] (wte's padded vocab rows) hold zeros: read as 0, never written to the full
 * tensor. */
#ifndef ENG_SLICE_H
#define ENG_SLICE_H

#include <stddef.h>
#include <stdint.h>

typedef struct eng_slice {
    uint32_t ndim;     /* 1 or 2 */
    uint32_t shape[2]; /* the full tensor's shape (wte: [vocab, C], unpadded); shape[1] 0 for 1-D */
    uint32_t lo[2], hi[2]; /* as eng_tensor_t: 2-D rows lo[0]..hi[0], columns lo[1]..hi[1];
                              1-D columns lo[0]..hi[0] */
    uint32_t parts;        /* 1, or 3 for c_attn (q | k | v along the last dimension) */
} eng_slice_t;

/* The whole tensor of shape [d0, d1] (1-D: d1 = 0), unsplit. */
eng_slice_t eng_slice_whole(uint32_t ndim, uint32_t d0, uint32_t d1);
/* Elements in the slice (padding rows included) / in the full tensor. */
size_t eng_slice_numel(const eng_slice_t *s);
size_t eng_slice_full_numel(const eng_slice_t *s);
/* 0 when the geometry is consistent (ndim 1 or 2, ranges inside the shape, or for rows
 * of a 2-D tensor inside any padding, parts dividing the last dimension); else -EINVAL. */
int eng_slice_check(const eng_slice_t *s);
/* dst[0 .. b - a) = elements [a, b) of the slice, read from full (the whole tensor);
 * padding rows give 0. a <= b <= numel. */
void eng_slice_read(const eng_slice_t *s, size_t a, size_t b, const float *full, float *dst);
/* The reverse: elements [a, b) of the slice from src into full; padding rows skipped.
 * covered (may be NULL): a bitmap of eng_slice_full_numel bits, bit i set for every full
 * element written. */
void eng_slice_write(const eng_slice_t *s, size_t a, size_t b, const float *src, float *full,
                     uint8_t *covered);
/* Text form for checkpoint metadata and its parser (round-trips exactly). 0, or -EINVAL /
 * -ENOSPC. */
int eng_slice_format(const eng_slice_t *s, size_t a, size_t b, char *out, size_t cap);
int eng_slice_parse(const char *text, eng_slice_t *s, size_t *a, size_t *b);

#endif
