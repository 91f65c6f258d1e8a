/* Causal multi-head self-attention. B = batch, T = time, C = channels, NH = heads,
 * hs = C/NH. qkv [B,T,3C] is the c_attn output laid out q | k | v along the last axis,
 * head h using channels [h*hs, (h+1)*hs) of each; out [B,T,C] has the same head layout.
 * att [B,NH,T,T] keeps the softmax probabilities (row t: columns <= t, zeros above).
 *
 * The fast version runs each (b, head) as SGEMMs over blocks of query rows, computing
 * only the key columns a block can see (causal), with a vectorised softmax; the
 * reference is llm.c-style loops. Agreement within ~1e-5 relative. */
#ifndef KN_ATTENTION_H
#define KN_ATTENTION_H

/* scale 1/sqrt(hs) */
void kn_attention_fwd(float *out, float *att, const float *qkv, int B, int T, int C, int NH);
void kn_attention_fwd_ref(float *out, float *att, const float *qkv, int B, int T, int C, int NH);
/* dqkv = gradient w.r.t. qkv (overwrites). scratch: T*T floats (fast version only). */
void kn_attention_bwd(float *dqkv, float *scratch, const float *dout, const float *qkv,
                      const float *att, int B, int T, int C, int NH);
void kn_attention_bwd_ref(float *dqkv, const float *dout, const float *qkv, const float *att, int B,
                          int T, int C, int NH);

#endif
