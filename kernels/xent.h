/* LM head fused with softmax cross-entropy. N = rows (a chunk of the B*T positions),
 * C = channels, V = real vocab, Vp = padded vocab (wte has Vp rows, the last Vp-V zero).
 *
 * logits [N,Vp] = x [N,C] @ wte[Vp,C]^T (the tied head). The softmax runs over the V real
 * columns only: padded columns never enter the loss and get zero gradient, so padded
 * wte rows receive nothing. The forward keeps per-row log-sum-exp; the backward turns
 * the logits into dlogits in place and hands them to two SGEMMs (dx, dwte), so nothing
 * larger than the [N,Vp] chunk is ever materialised. The caller picks N to bound memory.
 *
 * Fast: SGEMM + vectorised max/exp/sum (kn_vexpf). Reference: loops, expf, double sums.
 * Agreement: loss within ~1e-5 relative, gradients within ~1e-5 relative. */
#ifndef KN_XENT_H
#define KN_XENT_H

#include <stdint.h>

/* logits = x @ wte^T. With lse != NULL also lse[n] = log sum_{v<V} exp(logits[n,v]); with
 * targets and losses != NULL also losses[n] = lse[n] - logits[n, targets[n]]. */
void kn_lmhead_fwd(float *logits, float *lse, float *losses, const float *x, const float *wte,
                   const int32_t *targets, int N, int C, int V, int Vp);
void kn_lmhead_fwd_ref(float *logits, float *lse, float *losses, const float *x, const float *wte,
                       const int32_t *targets, int N, int C, int V, int Vp);
/* Backward of sum_n scale * losses[n]. logits: the forward's logits, overwritten with
 * dlogits. dx [N,C] is overwritten; dwte [Vp,C] accumulates (rows >= V untouched). */
void kn_lmhead_bwd(float *dx, float *dwte, float *logits, const float *lse, const float *x,
                   const float *wte, const int32_t *targets, float scale, int N, int C, int V,
                   int Vp);
void kn_lmhead_bwd_ref(float *dx, float *dwte, float *logits, const float *lse, const float *x,
                       const float *wte, const int32_t *targets, float scale, int N, int C, int V,
                       int Vp);

#endif
