/* GELU, tanh approximation (GPT-2): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
 * The fast version uses the identity 0.5 (1 + tanh(u)) = 1 / (1 + exp(-2u)) with the
 * vectorisable kn_vexpf; the reference calls tanhf. Agreement within ~1e-6 absolute
 * (relative to max(1, |x|)). The fast versions split large arrays over the kernels' pool
 * (kernels/pool.h): elementwise, so the same bits for any thread count. */
#ifndef KN_GELU_H
#define KN_GELU_H

#include <stddef.h>

/* out may alias inp */
void kn_gelu_fwd(float *out, const float *inp, size_t n);
void kn_gelu_fwd_ref(float *out, const float *inp, size_t n);
/* dinp = gelu'(inp) * dout (overwrites; dinp may alias dout) */
void kn_gelu_bwd(float *dinp, const float *inp, const float *dout, size_t n);
void kn_gelu_bwd_ref(float *dinp, const float *inp, const float *dout, size_t n);

#endif
