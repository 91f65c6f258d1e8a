/* GPT-2's tensor list (gpt2.h). */
#include "workerd/engine/gpt2.h"

const eng_gpt2_tensor_t eng_gpt2_block[ENG_GPT2_BLOCK_TENSORS] = {
    {"ln_1.weight", 1, 0},      {"ln_1.bias", 1, 0},          {"attn.c_attn.weight", 1, 3},
    {"attn.c_attn.bias", 3, 0}, {"attn.c_proj.weight", 1, 1}, {"attn.c_proj.bias", 1, 0},
    {"ln_2.weight", 1, 0},      {"ln_2.bias", 1, 0},          {"mlp.c_fc.weight", 1, 4},
    {"mlp.c_fc.bias", 4, 0},    {"mlp.c_proj.weight", 4, 1},  {"mlp.c_proj.bias", 1, 0},
};
