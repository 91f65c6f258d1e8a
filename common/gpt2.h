/* GPT-2's tensors as Hugging Face names and lays them out (DESIGN §7): wte [V, C], wpe
 * [T, C], h.{i}.* (Conv1D weights [in, out]), ln_f.*. One table that export, init_from's
 * submit-time check and the tests share. */
#ifndef CH_GPT2_H
#define CH_GPT2_H

#include <stddef.h>
#include <stdint.h>

#include "common/plan.h"

/* One of a block's tensors, "h.{l}." + suffix: its shape in units of C, [rows·C, cols·C]
 * (cols 0: 1-D [rows·C]). */
typedef struct ch_gpt2_block_tensor {
    const char *suffix;
    uint32_t rows, cols;
} ch_gpt2_block_tensor_t;

#define CH_GPT2_BLOCK_TENSORS 12
/* A block's tensors in Hugging Face (and the engine's slab) order: ln_1, attn.c_attn,
 * attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj, each weight then bias. The one list the table
 * below, the engine's model (workerd/engine/model.c) and export share. */
extern const ch_gpt2_block_tensor_t ch_gpt2_block[CH_GPT2_BLOCK_TENSORS];

typedef struct ch_gpt2_tensor {
    char name[64];
    uint32_t ndim;
    uint64_t shape[2];
} ch_gpt2_tensor_t;

/* Tensors of a GPT-2 of c: 2 + 12 x layers + 2, in the model's order (wte, wpe, h.0.*, ...,
 * ln_f.*). */
size_t ch_gpt2_count(const ch_model_cfg_t *c);
/* Tensor i (< ch_gpt2_count) of c. */
void ch_gpt2_tensor(const ch_model_cfg_t *c, size_t i, ch_gpt2_tensor_t *out);
/* Whether a safetensors file can initialise a model of c: every tensor present (with or
 * without a "transformer." prefix), F32, F16 or BF16, of its shape; wpe may hold more
 * positions than c->seq_len (the first seq_len are used). CH_E_FORMAT / CH_E_CONFIG with
 * "FILE: tensor NAME has shape [..] but [model] needs [..]". */
int ch_gpt2_check_file(const char *path, const ch_model_cfg_t *c, char *err, size_t errlen);

#endif
