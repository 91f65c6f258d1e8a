/* Residual connection: out = a + b elementwise (out may alias a or b). Its backward is
 * the identity on both inputs, done by accumulating into one gradient buffer. Fast and
 * reference agree bit for bit (the fast one over the kernels' pool when large). */
#ifndef KN_RESIDUAL_H
#define KN_RESIDUAL_H

#include <stddef.h>

void kn_residual_fwd(float *out, const float *a, const float *b, size_t n);
void kn_residual_fwd_ref(float *out, const float *a, const float *b, size_t n);

/* y[i] += a * x[i] (x, y do not overlap), over the kernels' pool when n is large: the same
 * bits for any thread count. a = 1 and y = 0 give x exactly. */
void kn_axpy(float *y, const float *x, size_t n, float a);

#endif
