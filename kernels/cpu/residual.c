/* Residual add (kernels/residual.h). */
#include "kernels/residual.h"

void kn_residual_fwd_ref(float *out, const float *a, const float *b, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        out[i] = a[i] + b[i];
    }
}

/* out may alias a or b, so no restrict; the loop still vectorises (gcc checks overlap at
 * run time and exact aliasing is harmless for an elementwise op). */
void kn_residual_fwd(float *out, const float *a, const float *b, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        for (int j = 0; j < 16; j++) {
            out[i + j] = a[i + j] + b[i + j];
        }
    }
    for (; i < n; i++) {
        out[i] = a[i] + b[i];
    }
}
