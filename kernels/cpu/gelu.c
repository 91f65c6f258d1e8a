/* GELU (tanh approximation), forward and backward (kernels/gelu.h). */
#include <math.h>

#include "kernels/gelu.h"
#include "kernels/pool.h"
#include "kernels/vmath.h"

#define GELU_SCALING_FACTOR 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_CUBE           0.044715f

// ----------------------------------------------------------------------------
// reference

void kn_gelu_fwd_ref(float *out, const float *inp, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        float cube = GELU_CUBE * x * x * x;
        out[i] = 0.5f * x * (1.0f + tanhf(GELU_SCALING_FACTOR * (x + cube)));
    }
}

void kn_gelu_bwd_ref(float *dinp, const float *inp, const float *dout, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        float cube = GELU_CUBE * x * x * x;
        float tanh_arg = GELU_SCALING_FACTOR * (x + cube);
        float tanh_out = tanhf(tanh_arg);
        float coshf_out = coshf(tanh_arg);
        float sech_out = 1.0f / (coshf_out * coshf_out);
        float local_grad = 0.5f * (1.0f + tanh_out) + x * 0.5f * sech_out * GELU_SCALING_FACTOR *
                                                          (1.0f + 3.0f * GELU_CUBE * x * x);
        dinp[i] = local_grad * dout[i];
    }
}

// ----------------------------------------------------------------------------
// fast: with u = sqrt(2/pi) (x + 0.044715 x^3) and s = 1 / (1 + exp(-2u)),
//   0.5 (1 + tanh u) = s,  1 - tanh^2 u = 4 s (1 - s), so
//   gelu(x) = x s,  gelu'(x) = s + 2 x s (1 - s) du/dx.
// This form has no cancellation for large |x| and needs only one exp.

static void gelu_fwd_range(float *out, const float *inp, size_t lo, size_t hi)
{
    for (size_t i = lo; i < hi; i++) {
        float x = inp[i];
        float u = GELU_SCALING_FACTOR * (x + GELU_CUBE * x * x * x);
        float s = 1.0f / (1.0f + kn_vexpf(-2.0f * u));
        out[i] = x * s;
    }
}

static void gelu_bwd_range(float *dinp, const float *inp, const float *dout, size_t lo, size_t hi)
{
    for (size_t i = lo; i < hi; i++) {
        float x = inp[i];
        float u = GELU_SCALING_FACTOR * (x + GELU_CUBE * x * x * x);
        float du = GELU_SCALING_FACTOR * (1.0f + 3.0f * GELU_CUBE * x * x);
        float s = 1.0f / (1.0f + kn_vexpf(-2.0f * u));
        dinp[i] = (s + 2.0f * x * s * (1.0f - s) * du) * dout[i];
    }
}

/* elementwise: split over the pool anywhere, the same bits */
typedef struct gelu_job {
    float *out;
    const float *inp, *dout; /* dout NULL: forward */
    size_t n;
} gelu_job_t;

static void gelu_part(void *ctx, int part, int nparts)
{
    const gelu_job_t *j = ctx;
    size_t lo, hi;
    kn_part_range(j->n, 16, part, nparts, &lo, &hi);
    if (j->dout == NULL) {
        gelu_fwd_range(j->out, j->inp, lo, hi);
    } else {
        gelu_bwd_range(j->out, j->inp, j->dout, lo, hi);
    }
}

#define GELU_PAR_MIN ((size_t)1 << 14)

void kn_gelu_fwd(float *out, const float *inp, size_t n)
{
    gelu_job_t j = {out, inp, NULL, n};
    kn_parallel(gelu_part, &j, kn_pool_parts(n, GELU_PAR_MIN));
}

void kn_gelu_bwd(float *dinp, const float *inp, const float *dout, size_t n)
{
    gelu_job_t j = {dinp, inp, dout, n};
    kn_parallel(gelu_part, &j, kn_pool_parts(n, GELU_PAR_MIN));
}
