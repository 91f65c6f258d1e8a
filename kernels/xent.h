/* LM head fused with softmax cross-entropy. N = rows (a chunk of the B*T positions),
 * C = channels, V = real vocab, Vp = padded vocab (wte has Vp rows, the last Vp-V zero).
 *
 * logits [N,Vp] = x [N,C] @ wte[Vp,C]^T (the tied head). The softmax runs over the V real
 * columns only: padded columns never enter the loss and get zero gradient, so padded
 * wte rows receive nothing. The forward keeps per-row log-sum-exp; the backward turns
 * the logits into dlogits in place and hands them to two SGEMMs (dx, dwte), so nothing
 * larger than the [N,Vp] chunk is ever materialised. The caller picks N to bound memory.
 *
 * Fast: SGEMM + vectorised max/exp/sum (kn_vexpf), the per-row work spread over the kernels'
 * pool (kernels/pool.h; rows are independent: the same bits for any thread count).
 * Reference: loops, expf, double sums.
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
 * dlogits. dx [N,C] is overwritten; dwte [Vp,C] accumulates (rows >= V untouched).
 * Either half alone (a split backward, ZB-H1): dwte NULL, the input half (logits turned
 * into dlogits, dx; x unread); dx NULL, the weight half on logits that already hold the
 * input half's dlogits (lse, wte and targets unread, may be NULL). The two halves in turn
 * give the same bits as one call. */
void kn_lmhead_bwd(float *dx, float *dwte, float *logits, const float *lse, const float *x,
                   const float *wte, const int32_t *targets, float scale, int N, int C, int V,
                   int Vp);
void kn_lmhead_bwd_ref(float *dx, float *dwte, float *logits, const float *lse, const float *x,
                       const float *wte, const int32_t *targets, float scale, int N, int C, int V,
                       int Vp);

/* Forward and backward of one chunk of rows in one pass, for a loss scale not yet known:
 * logits [N,Vp] scratch (left holding G); lse, losses as kn_lmhead_fwd (targets required);
 * then with G = softmax - onehot(target) over the V real columns (the gradient of
 * sum_n losses[n], unscaled), dx [N,C] = G @ wte[:V] (overwritten) and dwte [V,C] += G^T @ x
 * (acc != 0) or = (acc == 0). The caller multiplies both by the loss scale when it knows it:
 * kn_lmhead_bwd's sums with the scale applied after them instead of before (equal to a few
 * ulp; exactly when the scale is a power of two). The logits are computed once: the caller
 * keeps dx and dwte instead of the logits, whose chunk stays small enough for the cache. */
void kn_lmhead_fwdbwd(float *dx, float *dwte, float *logits, float *lse, float *losses,
                      const float *x, const float *wte, const int32_t *targets, int acc, int N,
                      int C, int V, int Vp);
/* A micro-batch's loss from its n token losses: their sum in double, in index order, over
 * n, rounded to float. */
float kn_loss_mean(const float *losses, size_t n);

#endif
