/* The plan arithmetic (DESIGN §5, §7): what a model and a layout cost, as pure functions
 * that `chorusctl plan`, the planner, the trainer, ZeRO-3 and checkpoints share.
 * C = embd, T = seq_len, L = layers, V = vocab, Vp = padded vocab. */
#ifndef CH_PLAN_H
#define CH_PLAN_H

#include <stdint.h>

/* A GPT-2 model's shape. padded_vocab is vocab rounded up (ch_layout_padded_vocab). */
typedef struct ch_model_cfg {
    uint32_t layers, heads, embd, vocab, padded_vocab, seq_len;
} ch_model_cfg_t;

/* Model FLOPs of one training iteration over B sequences of seq_len tokens, without
 * recomputation: 72·B·s·l·h²·(1 + s/(6h) + Vp/(12·l·h)) (Narayanan et al. 2021). */
double ch_plan_flops(const ch_model_cfg_t *cfg, uint32_t B);

#endif
