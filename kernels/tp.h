/* Tensor parallelism's vocab-parallel embedding and cross-entropy (Megatron-LM's
 * VocabParallelEmbedding and VocabParallelCrossEntropy): the per-rank parts around the TP
 * group's all-reduces, on this rank's slice of the vocab only. The slice is the rows
 * [v0, v0+Vl) of the padded vocab; `valid` (0..Vl) of them are real tokens (the rest is
 * padding: never in the softmax, zero gradient). B = batch, T = time, C = channels,
 * N = rows (B*T positions, or a chunk of them). Tokens and targets lie in [0, V).
 *
 * One version each: these loops are the reference, and each element's arithmetic is fixed
 * (the sums in double, in column order), so every backend's bits can be stated against them.
 *
 * The loss over the group: max = all-reduce(max) of kn_tp_xent_max, then sum and tl =
 * all-reduce(sum) of kn_tp_xent_sums (the target's logit is on one rank, zero on the
 * others), then kn_tp_xent_finish: lse and the loss without gathering the logits. */
#ifndef KN_TP_H
#define KN_TP_H

#include <stdint.h>

/* out[b,t,:] (overwritten) = wte[inp[b,t] - v0,:] when the token is in the slice, else 0,
 * plus wpe[t,:] when wpe != NULL (the one rank that adds positions). wte [Vl,C] is the
 * slice, wpe [>=T,C]. Summed over the group: the embedding, bit for bit (adding zeros is
 * exact). */
void kn_tp_embed_fwd(float *out, const int32_t *inp, const float *wte, const float *wpe, int v0,
                     int Vl, int B, int T, int C);
/* Its backward, accumulating in position order: dwte[inp[b,t] - v0,:] += dout[b,t,:] for the
 * slice's tokens (dwte [Vl,C]), and dwpe[t,:] += dout[b,t,:] for every position (dwpe
 * [>=T,C]; replicated, dout being the same on every rank). */
void kn_tp_embed_bwd(float *dwte, float *dwpe, const float *dout, const int32_t *inp, int v0,
                     int Vl, int B, int T, int C);

/* mx[n] (overwritten) = max of logits[n, 0..valid) (-INFINITY when valid = 0); logits [N,Vl]. */
void kn_tp_xent_max(float *mx, const float *logits, int N, int Vl, int valid);
/* sum[n] (overwritten) = (float) of the double sum over j < valid, in order, of
 * exp((double)logits[n,j] - mx[n]) (mx: the group's max); tl[n] (overwritten) =
 * logits[n, targets[n] - v0] when the target is among this slice's valid columns, else 0. */
void kn_tp_xent_sums(float *sum, float *tl, const float *logits, const float *mx,
                     const int32_t *targets, int v0, int N, int Vl, int valid);
/* lse[n] = mx[n] + logf(sum[n]); losses[n] = lse[n] - tl[n] (both overwritten; the group's
 * mx, sum and tl). */
void kn_tp_xent_finish(float *lse, float *losses, const float *mx, const float *sum,
                       const float *tl, int N);
/* The backward of sum_n scale * losses[n] on this slice, in place: logits [N,Vl] become
 * dlogits, expf(logits - lse[n]) * scale on the valid columns (then minus scale on the
 * target's column when it is in the slice), 0 on the padded columns. */
void kn_tp_xent_bwd(float *logits, const float *lse, const int32_t *targets, float scale, int v0,
                    int N, int Vl, int valid);

#endif
