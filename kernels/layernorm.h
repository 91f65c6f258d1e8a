/* LayerNorm over the last dimension, eps 1e-5 (GPT-2). N = rows (B*T), C = channels.
 * The forward saves each row's mean and 1/std for the backward.
 * Fast vs reference: the fast version sums in KN_LANES partial sums; agreement is
 * within ~1e-5 relative (tests/unit/test_kernels.c). */
#ifndef KN_LAYERNORM_H
#define KN_LAYERNORM_H

#define KN_LN_EPS 1e-5f

/* out = (inp - mean) * rstd * weight + bias; inp/out [N,C], mean/rstd [N] */
void kn_layernorm_fwd(float *out, float *mean, float *rstd, const float *inp, const float *weight,
                      const float *bias, int N, int C);
void kn_layernorm_fwd_ref(float *out, float *mean, float *rstd, const float *inp,
                          const float *weight, const float *bias, int N, int C);
/* dinp += d(out)/d(inp) dout, dweight += ..., dbias += ... (all accumulate). dinp NULL:
 * only dweight and dbias; dweight and dbias NULL: only dinp (a split backward's two
 * passes, each the bits of the whole call; weight unread when dinp is NULL). */
void kn_layernorm_bwd(float *dinp, float *dweight, float *dbias, const float *dout,
                      const float *inp, const float *weight, const float *mean, const float *rstd,
                      int N, int C);
void kn_layernorm_bwd_ref(float *dinp, float *dweight, float *dbias, const float *dout,
                          const float *inp, const float *weight, const float *mean,
                          const float *rstd, int N, int C);

#endif
