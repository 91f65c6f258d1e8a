/* Token + position embedding (kernels/encoder.h).
 *
 * The backward is deterministic and bit-identical to the CPU reference, which adds each
 * position's gradient into its rows in position order. dwpe: one thread per (t, c) sums over
 * b in order. dwte: positions are sorted by token with CUB's stable radix sort (values are
 * the positions, so each token's positions stay in increasing order); the first entry of
 * each token's run then walks the run for its channel, adding in that order. */
#include <climits>

#include <cub/device/device_radix_sort.cuh>

#include "kernels/cuda/common.cuh"

static __global__ void encoder_fwd_kernel(float *out, const int32_t *inp, const float *wte,
                                          const float *wpe, int T, int C, size_t total)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) {
        return;
    }
    size_t bt = i / C;
    int c = (int)(i % C);
    int t = (int)(bt % T);
    out[i] = wte[(size_t)inp[bt] * C + c] + wpe[(size_t)t * C + c];
}

extern "C" int kn_cuda_encoder_fwd(float *out, const int32_t *inp, const float *wte,
                                   const float *wpe, int B, int T, int C, kn_stream_t stream)
{
    if (B <= 0 || T <= 0 || C <= 0) {
        return -EINVAL;
    }
    size_t total = (size_t)B * T * C;
    encoder_fwd_kernel<<<kn_cu_blocks(total, 256), 256, 0, stream>>>(out, inp, wte, wpe, T, C,
                                                                     total);
    return kn_cu_launched();
}

// ----------------------------------------------------------------------------
// backward

static __global__ void dwpe_kernel(float *dwpe, const float *dout, int B, int T, int C)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)T * C) {
        return;
    }
    float acc = dwpe[i];
    for (int b = 0; b < B; b++) {
        acc += dout[(size_t)b * T * C + i];
    }
    dwpe[i] = acc;
}

static __global__ void iota_kernel(int32_t *x, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        x[i] = i;
    }
}

/* grid (runs of N sorted entries, channel blocks): the first entry of each token's run adds
 * the run's rows, in position order, into its dwte row. */
/* dwte rows [v0, v0 + Vl) of the vocab (the whole vocab: v0 0, Vl INT_MAX): each run of
 * equal sorted tokens summed in position order by the block of its first; tokens outside
 * the slice skipped */
static __global__ void dwte_kernel(float *dwte, const float *dout, const int32_t *tok,
                                   const int32_t *pos, int v0, int Vl, int N, int C)
{
    int i = blockIdx.x;
    int c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= C || (i > 0 && tok[i - 1] == tok[i])) {
        return;
    }
    int32_t v = tok[i];
    long row = (long)v - v0;
    if (row < 0 || row >= Vl) {
        return;
    }
    float acc = dwte[(size_t)row * C + c];
    for (int j = i; j < N && tok[j] == v; j++) {
        acc += dout[(size_t)pos[j] * C + c];
    }
    dwte[(size_t)row * C + c] = acc;
}

/* scratch layout: tok_sorted [N] | pos [N] | pos_sorted [N] | CUB temp; 256-byte aligned */
static size_t align256(size_t x)
{
    return (x + 255) & ~(size_t)255;
}

static size_t cub_temp_bytes(int N)
{
    size_t bytes = 0;
    cub::DeviceRadixSort::SortPairs(NULL, bytes, (const int32_t *)NULL, (int32_t *)NULL,
                                    (const int32_t *)NULL, (int32_t *)NULL, N);
    return bytes;
}

extern "C" size_t kn_cuda_encoder_bwd_scratch_bytes(int B, int T)
{
    int N = B * T;
    return 3 * align256((size_t)N * sizeof(int32_t)) + align256(cub_temp_bytes(N));
}

/* dwpe, then dwte's slice [v0, v0 + Vl) through the tokens sorted with their positions */
static int embed_bwd(float *dwte, float *dwpe, void *scratch, const float *dout, const int32_t *inp,
                     int v0, int Vl, int B, int T, int C, kn_stream_t stream)
{
    int N = B * T;
    size_t slot = align256((size_t)N * sizeof(int32_t));
    char *s = (char *)scratch;
    int32_t *tok_sorted = (int32_t *)s;
    int32_t *pos = (int32_t *)(s + slot);
    int32_t *pos_sorted = (int32_t *)(s + 2 * slot);
    void *temp = s + 3 * slot;
    size_t temp_bytes = align256(cub_temp_bytes(N));

    dwpe_kernel<<<kn_cu_blocks((size_t)T * C, 256), 256, 0, stream>>>(dwpe, dout, B, T, C);
    int rc = kn_cu_launched();
    if (rc < 0) {
        return rc;
    }
    iota_kernel<<<kn_cu_blocks((size_t)N, 256), 256, 0, stream>>>(pos, N);
    if ((rc = kn_cu_launched()) < 0) {
        return rc;
    }
    rc = kn_cu_err(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, inp, tok_sorted, pos,
                                                   pos_sorted, N, 0, 32, stream));
    if (rc < 0) {
        return rc;
    }
    dim3 grid((unsigned)N, (unsigned)((C + 127) / 128));
    dwte_kernel<<<grid, 128, 0, stream>>>(dwte, dout, tok_sorted, pos_sorted, v0, Vl, N, C);
    return kn_cu_launched();
}

extern "C" int kn_cuda_encoder_bwd(float *dwte, float *dwpe, void *scratch, const float *dout,
                                   const int32_t *inp, int B, int T, int C, kn_stream_t stream)
{
    if (B <= 0 || T <= 0 || C <= 0) {
        return -EINVAL;
    }
    return embed_bwd(dwte, dwpe, scratch, dout, inp, 0, INT_MAX, B, T, C, stream);
}

// ----------------------------------------------------------------------------
// vocab-parallel (kernels/tp.h): this rank's slice [v0, v0+Vl) of the vocab, bit-identical
// to the CPU loops as the whole-vocab kernels are (the same sums in the same order)

/* out = the slice's row of the token or 0, plus wpe's row when wpe != NULL */
static __global__ void tp_embed_fwd_kernel(float *out, const int32_t *inp, const float *wte,
                                           const float *wpe, int v0, int Vl, int T, int C,
                                           size_t total)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) {
        return;
    }
    size_t bt = i / C;
    int c = (int)(i % C);
    int t = (int)(bt % T);
    long v = (long)inp[bt] - v0;
    float e = v >= 0 && v < Vl ? wte[(size_t)v * C + c] : 0.0f;
    out[i] = wpe != NULL ? e + wpe[(size_t)t * C + c] : e;
}

extern "C" int kn_cuda_tp_embed_fwd(float *out, const int32_t *inp, const float *wte,
                                    const float *wpe, int v0, int Vl, int B, int T, int C,
                                    kn_stream_t stream)
{
    if (B <= 0 || T <= 0 || C <= 0 || v0 < 0 || Vl <= 0) {
        return -EINVAL;
    }
    size_t total = (size_t)B * T * C;
    tp_embed_fwd_kernel<<<kn_cu_blocks(total, 256), 256, 0, stream>>>(out, inp, wte, wpe, v0, Vl, T,
                                                                      C, total);
    return kn_cu_launched();
}

extern "C" int kn_cuda_tp_embed_bwd(float *dwte, float *dwpe, void *scratch, const float *dout,
                                    const int32_t *inp, int v0, int Vl, int B, int T, int C,
                                    kn_stream_t stream)
{
    if (B <= 0 || T <= 0 || C <= 0 || v0 < 0 || Vl <= 0) {
        return -EINVAL;
    }
    return embed_bwd(dwte, dwpe, scratch, dout, inp, v0, Vl, B, T, C, stream);
}
