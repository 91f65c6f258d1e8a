/* Causal multi-head self-attention. B = batch, T = time, C = channels, NH = heads,
 * hs = C/NH. qkv [B,T,3C] is the c_attn output laid out q | k | v along the last axis,
 * head h using channels [h*hs, (h+1)*hs) of each; out [B,T,C] has the same head layout.
 * att [B,NH,T,T] keeps the softmax probabilities (row t: columns <= t, zeros above).
 *
 * The fast version runs each (b, head) as SGEMMs over blocks of query rows, computing
 * only the key columns a block can see (causal), with a vectorised softmax; the
 * reference is llm.c-style loops. Agreement within ~1e-5 relative.
 *
 * att NULL (the fast version only): keep no probabilities. The forward then holds one
 * block of query rows' probabilities in scratch; the backward recomputes them, block by
 * block, with the forward's arithmetic: the same bits as with att kept
 * (parallel.recompute = selective). */
#ifndef KN_ATTENTION_H
#define KN_ATTENTION_H

#include <stddef.h>

/* Query rows per block of the fast version. common/plan.h's CH_PLAN_ATT_QBLOCK says the
 * same (the model's scratch without att). */
#define KN_ATTENTION_QBLOCK 128
/* Floats of scratch the fast version needs without att: a block's probabilities (and in
 * the backward their gradient): 2 * min(T, QBLOCK) * T. */
#define KN_ATTENTION_NOATT_SCRATCH(T)                                                              \
    (2 * (size_t)((T) < KN_ATTENTION_QBLOCK ? (T) : KN_ATTENTION_QBLOCK) * (size_t)(T))

/* scale 1/sqrt(hs). scratch: with att NULL, KN_ATTENTION_NOATT_SCRATCH(T) floats; else
 * unused (may be NULL). */
void kn_attention_fwd(float *out, float *att, float *scratch, const float *qkv, int B, int T, int C,
                      int NH);
void kn_attention_fwd_ref(float *out, float *att, const float *qkv, int B, int T, int C, int NH);
/* dqkv = gradient w.r.t. qkv (overwrites). scratch (fast version only): T*T floats, or
 * with att NULL (the probabilities recomputed) KN_ATTENTION_NOATT_SCRATCH(T). */
void kn_attention_bwd(float *dqkv, float *scratch, const float *dout, const float *qkv,
                      const float *att, int B, int T, int C, int NH);
void kn_attention_bwd_ref(float *dqkv, const float *dout, const float *qkv, const float *att, int B,
                          int T, int C, int NH);

#endif
