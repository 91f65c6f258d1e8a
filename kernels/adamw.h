/* Optimizer kernels: AdamW update and the sum of squares for global gradient norms.
 *
 * kn_adamw follows torch.optim.AdamW's single-tensor path (foreach=False), op for op in
 * fp32 with the Python-float scalars computed in double and rounded once to float:
 *   p = p * (1 - lr*wd)                      (param.mul_(1 - lr*weight_decay))
 *   m = b1*m + (1-b1)*g                      (exp_avg.mul_(b1).add_(g, alpha=1-b1))
 *   v = b2*v + ((1-b2)*g)*g                  (exp_avg_sq.mul_(b2).addcmul_(g, g, value=1-b2))
 *   denom = sqrt(v) / sqrt(1-b2^t) + eps
 *   p = p + (-(lr/(1-b1^t)) * m) / denom     (param.addcdiv_(m, denom, value=-step_size))
 * t is the 1-based step. wd = 0 for tensors without decay. (torch's vectorised CPU
 * kernels may fuse some of these into FMAs; bit equality with torch is not promised,
 * equality to ~1 ulp per op is.) The reference computes the textbook formula in double:
 *   p -= lr*wd*p; m, v as above; p -= lr * mhat / (sqrt(vhat) + eps).
 *
 * kn_sumsq returns sum x^2 accumulated in double. Fast: blocks of 65536 elements, each
 * summed in 8 lanes, the block sums added in order; the bits do not depend on the thread
 * count (ranks with different counts agree), and for n <= 65536 they are one block's.
 * Reference: sequential.
 *
 * The fast kernels here run on the kernels' pool (kernels/pool.h) when n is large, split
 * elementwise (adamw, scale) or by those blocks (sumsq): the same bits for any thread count. */
#ifndef KN_ADAMW_H
#define KN_ADAMW_H

#include <stddef.h>
#include <stdint.h>

void kn_adamw(float *p, const float *g, float *m, float *v, size_t n, double lr, double beta1,
              double beta2, double eps, double wd, uint64_t t);
void kn_adamw_ref(float *p, const float *g, float *m, float *v, size_t n, double lr, double beta1,
                  double beta2, double eps, double wd, uint64_t t);

/* kn_adamw on the gradient g[i] * gscale (clip_grad_norm_'s coefficient, or 1: exact), with
 * g[0..n) set to zero afterwards when zero_g: one pass where clipping, the update and the
 * next step's zero_grad took three. The same bits as kn_scale(g, n, gscale) then kn_adamw. */
void kn_adamw_fused(float *p, float *g, float *m, float *v, size_t n, double lr, double beta1,
                    double beta2, double eps, double wd, uint64_t t, float gscale, int zero_g);

/* x[i] *= c */
void kn_scale(float *x, size_t n, float c);

double kn_sumsq(const float *x, size_t n);
double kn_sumsq_ref(const float *x, size_t n);

#endif
