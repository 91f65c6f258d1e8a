/* GELU (tanh approximation), the residual add and axpy (kernels/gelu.h, kernels/residual.h)
 * and the in-place scale of gradient clipping.
 * GELU uses the CPU fast version's form: with u = sqrt(2/pi) (x + 0.044715 x^3) and
 * s = 1 / (1 + exp(-2u)), gelu(x) = x s and gelu'(x) = s + 2 x s (1 - s) du/dx; one exp,
 * no cancellation for large |x|. */
#include "kernels/cuda/common.cuh"

#define GELU_SCALING_FACTOR 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_CUBE           0.044715f

static __global__ void gelu_fwd_kernel(float *out, const float *inp, size_t n)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float x = inp[i];
        float u = GELU_SCALING_FACTOR * (x + GELU_CUBE * x * x * x);
        float s = 1.0f / (1.0f + expf(-2.0f * u));
        out[i] = x * s;
    }
}

static __global__ void gelu_bwd_kernel(float *dinp, const float *inp, const float *dout, size_t n)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float x = inp[i];
        float u = GELU_SCALING_FACTOR * (x + GELU_CUBE * x * x * x);
        float du = GELU_SCALING_FACTOR * (1.0f + 3.0f * GELU_CUBE * x * x);
        float s = 1.0f / (1.0f + expf(-2.0f * u));
        dinp[i] = (s + 2.0f * x * s * (1.0f - s) * du) * dout[i];
    }
}

static __global__ void residual_kernel(float *out, const float *a, const float *b, size_t n)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        out[i] = a[i] + b[i];
    }
}

static __global__ void scale_kernel(float *x, float c, size_t n)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        x[i] = x[i] * c;
    }
}

/* y += a x as two rounded operations (no FMA): kn_axpy's bits */
static __global__ void axpy_kernel(float *y, const float *x, size_t n, float a)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        y[i] = __fadd_rn(y[i], __fmul_rn(a, x[i]));
    }
}

/* grid-stride launches: at most 65536 blocks of 256 */
static unsigned ew_blocks(size_t n)
{
    unsigned b = kn_cu_blocks(n, 256);
    return b > 65536u ? 65536u : b;
}

extern "C" int kn_cuda_gelu_fwd(float *out, const float *inp, size_t n, kn_stream_t stream)
{
    if (n == 0) {
        return 0;
    }
    gelu_fwd_kernel<<<ew_blocks(n), 256, 0, stream>>>(out, inp, n);
    return kn_cu_launched();
}

extern "C" int kn_cuda_gelu_bwd(float *dinp, const float *inp, const float *dout, size_t n,
                                kn_stream_t stream)
{
    if (n == 0) {
        return 0;
    }
    gelu_bwd_kernel<<<ew_blocks(n), 256, 0, stream>>>(dinp, inp, dout, n);
    return kn_cu_launched();
}

extern "C" int kn_cuda_residual_fwd(float *out, const float *a, const float *b, size_t n,
                                    kn_stream_t stream)
{
    if (n == 0) {
        return 0;
    }
    residual_kernel<<<ew_blocks(n), 256, 0, stream>>>(out, a, b, n);
    return kn_cu_launched();
}

extern "C" int kn_cuda_scale(float *x, float c, size_t n, kn_stream_t stream)
{
    if (n == 0) {
        return 0;
    }
    scale_kernel<<<ew_blocks(n), 256, 0, stream>>>(x, c, n);
    return kn_cu_launched();
}

extern "C" int kn_cuda_axpy(float *y, const float *x, size_t n, float a, kn_stream_t stream)
{
    if (n == 0) {
        return 0;
    }
    axpy_kernel<<<ew_blocks(n), 256, 0, stream>>>(y, x, n, a);
    return kn_cu_launched();
}
