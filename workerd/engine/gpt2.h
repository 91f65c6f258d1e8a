/* GPT-2's tensors as Hugging Face names and lays them out: the one list the model's table
 * (model.c) and export (export.c, on the file side, without the model) share. */
#ifndef ENG_GPT2_H
#define ENG_GPT2_H

#include <stdint.h>

/* One of a block's tensors, "h.{l}." + suffix: its shape in units of C, [rows·C, cols·C]
 * (cols 0: 1-D [rows·C]). */
typedef struct eng_gpt2_tensor {
    const char *suffix;
    uint32_t rows, cols;
} eng_gpt2_tensor_t;

#define ENG_GPT2_BLOCK_TENSORS 12
/* A block's tensors in Hugging Face (and slab) order: ln_1, attn.c_attn, attn.c_proj, ln_2,
 * mlp.c_fc, mlp.c_proj, each weight then bias. */
extern const eng_gpt2_tensor_t eng_gpt2_block[ENG_GPT2_BLOCK_TENSORS];

#endif
