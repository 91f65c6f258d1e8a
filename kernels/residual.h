/* Residual connection: out = a + b elementwise (out may alias a or b). Its backward is
 * the identity on both inputs, done by accumulating into one gradient buffer. Fast and
 * reference agree bit for bit. */
#ifndef KN_RESIDUAL_H
#define KN_RESIDUAL_H

#include <stddef.h>

void kn_residual_fwd(float *out, const float *a, const float *b, size_t n);
void kn_residual_fwd_ref(float *out, const float *a, const float *b, size_t n);

#endif
