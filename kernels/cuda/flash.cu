/* Causal attention, fused (flash-attention style, fp32, deterministic): nothing of size T*T
 * reaches global memory (kernels/cuda.h, kn_cuda_flash_attention_*).
 *
 * Theory of operation. For one (b, h), scores s = scale q_t . k_j for keys j <= t.
 * Forward: each query row keeps a running max m, sum l and output accumulator acc while it
 * walks the keys in order (online softmax; acc and l are rescaled when m grows); at the end
 * out_t = acc / l and lse_t = m + log l. Backward, with p = exp(s - lse_t) recomputed and
 * D_t = dout_t . out_t (= sum_j p dp, precomputed into scratch):
 *   dv_j = sum_t p dout_t,  dp = dout_t . v_j,  ds = p (dp - D_t) scale,
 *   dk_j = sum_t ds q_t,    dq_t = sum_j ds k_j.
 * One kernel owns a tile of key rows and walks the queries (dk, dv); another owns a tile of
 * query rows and walks the keys (dq). Every sum runs in a fixed order: no atomics.
 *
 * Threads. A row (query or key) belongs to G consecutive lanes; lane g of the group holds
 * dims g, g + G, g + 2G, ... (DPT of them, zero beyond hs), so the G lanes read adjacent
 * words of a shared-memory row (no bank conflicts) and join a dot product with log2(G) xor
 * shuffles. HSM (32, 64 or 128) is the padded head size, G = HSM / 32 lanes (1 below 64).
 * Every lane runs every loop iteration (masked entries have p = 0), so the full-warp
 * shuffles are always reached by all lanes. The other side of each product (keys in the
 * forward and dq, queries in dk/dv) is staged through shared memory in tiles of TILE rows. */
#include <math.h>

#include "kernels/cuda/common.cuh"

#define FA_THREADS 128
#define TILE       32

template <int HSM> struct fa_shape {
    static constexpr int G = HSM > 32 ? HSM / 32 : 1; /* lanes per row */
    static constexpr int DPT = HSM / G;               /* dims per lane */
    static constexpr int ROWS = FA_THREADS / G;       /* rows per block */
};

template <int G> __device__ __forceinline__ float group_sum(float v)
{
    for (int o = 1; o < G; o <<= 1) {
        v += __shfl_xor_sync(0xffffffffu, v, o);
    }
    return v;
}

/* x[d] = src[g + G d] for g + G d < hs, else 0 */
template <int HSM>
__device__ __forceinline__ void load_row(float *x, const float *src, int g, int hs)
{
    constexpr int G = fa_shape<HSM>::G, DPT = fa_shape<HSM>::DPT;
#pragma unroll
    for (int d = 0; d < DPT; d++) {
        int i = g + G * d;
        x[d] = i < hs ? src[i] : 0.0f;
    }
}

template <int HSM>
__device__ __forceinline__ void store_row(float *dst, const float *x, int g, int hs)
{
    constexpr int G = fa_shape<HSM>::G, DPT = fa_shape<HSM>::DPT;
#pragma unroll
    for (int d = 0; d < DPT; d++) {
        int i = g + G * d;
        if (i < hs) {
            dst[i] = x[d];
        }
    }
}

/* tile[r][i] = rows r0 + r of src (row stride ld), zero past hs or past T */
template <int HSM>
__device__ __forceinline__ void load_tile(float (*tile)[HSM], const float *src, size_t ld, int r0,
                                          int T, int hs)
{
    for (int idx = threadIdx.x; idx < TILE * HSM; idx += FA_THREADS) {
        int r = idx / HSM, i = idx % HSM;
        tile[r][i] = (i < hs && r0 + r < T) ? src[(size_t)(r0 + r) * ld + i] : 0.0f;
    }
}

template <int HSM>
__device__ __forceinline__ float dot_tile(const float *x, const float *row, int g)
{
    constexpr int G = fa_shape<HSM>::G, DPT = fa_shape<HSM>::DPT;
    float s = 0.0f;
#pragma unroll
    for (int d = 0; d < DPT; d++) {
        s += x[d] * row[g + G * d];
    }
    return group_sum<G>(s);
}

template <int HSM>
__device__ __forceinline__ void axpy_tile(float *acc, float a, const float *row, int g)
{
    constexpr int G = fa_shape<HSM>::G, DPT = fa_shape<HSM>::DPT;
#pragma unroll
    for (int d = 0; d < DPT; d++) {
        acc[d] += a * row[g + G * d];
    }
}

struct fa_args {
    const float *qkv;
    const float *out, *dout, *lse, *dsum; /* dsum: D_t */
    float *y, *lse_out, *dqkv;
    int T, C, NH, hs;
    float scale;
};

// ----------------------------------------------------------------------------
// forward: grid (query blocks of ROWS, B*NH)

template <int HSM> __global__ void __launch_bounds__(FA_THREADS) fa_fwd_kernel(fa_args a)
{
    constexpr int G = fa_shape<HSM>::G, DPT = fa_shape<HSM>::DPT, ROWS = fa_shape<HSM>::ROWS;
    __shared__ float kt[TILE][HSM], vt[TILE][HSM];
    int bh = blockIdx.y, b = bh / a.NH, h = bh % a.NH;
    int g = threadIdx.x % G;
    int t = blockIdx.x * ROWS + threadIdx.x / G;
    int tl = t < a.T ? t : a.T - 1; /* rows past T compute on a copy and write nothing */
    size_t C3 = 3 * (size_t)a.C;
    const float *base = a.qkv + (size_t)b * a.T * C3 + h * a.hs;

    float q[DPT], acc[DPT];
    load_row<HSM>(q, base + (size_t)tl * C3, g, a.hs);
#pragma unroll
    for (int d = 0; d < DPT; d++) {
        acc[d] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    int last = min(a.T, (int)(blockIdx.x + 1) * ROWS); /* keys this block can see */
    for (int k0 = 0; k0 < last; k0 += TILE) {
        __syncthreads();
        load_tile<HSM>(kt, base + a.C, C3, k0, a.T, a.hs);
        load_tile<HSM>(vt, base + 2 * a.C, C3, k0, a.T, a.hs);
        __syncthreads();
        for (int j = 0; j < TILE; j++) {
            float s = dot_tile<HSM>(q, kt[j], g) * a.scale;
            if (k0 + j > tl) {
                continue; /* masked (no shuffles below) */
            }
            if (s > m) {
                float corr = expf(m - s); /* 0 when m = -inf */
                l *= corr;
#pragma unroll
                for (int d = 0; d < DPT; d++) {
                    acc[d] *= corr;
                }
                m = s;
            }
            float p = expf(s - m);
            l += p;
            axpy_tile<HSM>(acc, p, vt[j], g);
        }
    }
    if (t < a.T) {
        float inv = 1.0f / l;
#pragma unroll
        for (int d = 0; d < DPT; d++) {
            acc[d] *= inv;
        }
        store_row<HSM>(a.y + ((size_t)b * a.T + t) * a.C + h * a.hs, acc, g, a.hs);
        if (g == 0) {
            a.lse_out[(size_t)bh * a.T + t] = m + logf(l);
        }
    }
}

// ----------------------------------------------------------------------------
// backward

/* D_t = dout_t . out_t, one thread per (b, h, t) */
static __global__ void fa_dsum_kernel(float *dsum, const float *dout, const float *out, int B,
                                      int T, int C, int NH)
{
    size_t r = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= (size_t)B * NH * T) {
        return;
    }
    int hs = C / NH;
    int t = (int)(r % T), bh = (int)(r / T), b = bh / NH, h = bh % NH;
    size_t off = ((size_t)b * T + t) * C + (size_t)h * hs;
    float s = 0.0f;
    for (int i = 0; i < hs; i++) {
        s += dout[off + i] * out[off + i];
    }
    dsum[r] = s;
}

/* grid (key blocks of ROWS, B*NH): dk, dv of the block's key rows */
template <int HSM> __global__ void __launch_bounds__(FA_THREADS) fa_dkdv_kernel(fa_args a)
{
    constexpr int G = fa_shape<HSM>::G, DPT = fa_shape<HSM>::DPT, ROWS = fa_shape<HSM>::ROWS;
    __shared__ float qt[TILE][HSM], dyt[TILE][HSM];
    __shared__ float lset[TILE], dst[TILE];
    int bh = blockIdx.y, b = bh / a.NH, h = bh % a.NH;
    int g = threadIdx.x % G;
    int j = blockIdx.x * ROWS + threadIdx.x / G;
    int jl = j < a.T ? j : a.T - 1;
    size_t C3 = 3 * (size_t)a.C;
    const float *base = a.qkv + (size_t)b * a.T * C3 + h * a.hs;
    const float *dybase = a.dout + (size_t)b * a.T * a.C + h * a.hs;

    float k[DPT], v[DPT], dk[DPT], dv[DPT];
    load_row<HSM>(k, base + a.C + (size_t)jl * C3, g, a.hs);
    load_row<HSM>(v, base + 2 * a.C + (size_t)jl * C3, g, a.hs);
#pragma unroll
    for (int d = 0; d < DPT; d++) {
        dk[d] = 0.0f;
        dv[d] = 0.0f;
    }
    int first = (int)(blockIdx.x * ROWS) / TILE * TILE; /* queries before it see no key here */
    for (int t0 = first; t0 < a.T; t0 += TILE) {
        __syncthreads();
        load_tile<HSM>(qt, base, C3, t0, a.T, a.hs);
        load_tile<HSM>(dyt, dybase, a.C, t0, a.T, a.hs);
        for (int i = threadIdx.x; i < TILE; i += FA_THREADS) {
            int t = t0 + i < a.T ? t0 + i : a.T - 1;
            lset[i] = a.lse[(size_t)bh * a.T + t];
            dst[i] = a.dsum[(size_t)bh * a.T + t];
        }
        __syncthreads();
        for (int i = 0; i < TILE; i++) {
            float s = dot_tile<HSM>(k, qt[i], g) * a.scale;
            float dp = dot_tile<HSM>(v, dyt[i], g);
            int t = t0 + i;
            if (t < jl || t >= a.T) {
                continue;
            }
            float p = expf(s - lset[i]);
            float ds = p * (dp - dst[i]) * a.scale;
            axpy_tile<HSM>(dv, p, dyt[i], g);
            axpy_tile<HSM>(dk, ds, qt[i], g);
        }
    }
    if (j < a.T) {
        float *drow = a.dqkv + ((size_t)b * a.T + j) * C3 + h * a.hs;
        store_row<HSM>(drow + a.C, dk, g, a.hs);
        store_row<HSM>(drow + 2 * a.C, dv, g, a.hs);
    }
}

/* grid (query blocks of ROWS, B*NH): dq of the block's query rows */
template <int HSM> __global__ void __launch_bounds__(FA_THREADS) fa_dq_kernel(fa_args a)
{
    constexpr int G = fa_shape<HSM>::G, DPT = fa_shape<HSM>::DPT, ROWS = fa_shape<HSM>::ROWS;
    __shared__ float kt[TILE][HSM], vt[TILE][HSM];
    int bh = blockIdx.y, b = bh / a.NH, h = bh % a.NH;
    int g = threadIdx.x % G;
    int t = blockIdx.x * ROWS + threadIdx.x / G;
    int tl = t < a.T ? t : a.T - 1;
    size_t C3 = 3 * (size_t)a.C;
    const float *base = a.qkv + (size_t)b * a.T * C3 + h * a.hs;

    float q[DPT], dy[DPT], dq[DPT];
    load_row<HSM>(q, base + (size_t)tl * C3, g, a.hs);
    load_row<HSM>(dy, a.dout + ((size_t)b * a.T + tl) * a.C + h * a.hs, g, a.hs);
#pragma unroll
    for (int d = 0; d < DPT; d++) {
        dq[d] = 0.0f;
    }
    float lse = a.lse[(size_t)bh * a.T + tl], D = a.dsum[(size_t)bh * a.T + tl];
    int last = min(a.T, (int)(blockIdx.x + 1) * ROWS);
    for (int k0 = 0; k0 < last; k0 += TILE) {
        __syncthreads();
        load_tile<HSM>(kt, base + a.C, C3, k0, a.T, a.hs);
        load_tile<HSM>(vt, base + 2 * a.C, C3, k0, a.T, a.hs);
        __syncthreads();
        for (int j = 0; j < TILE; j++) {
            float s = dot_tile<HSM>(q, kt[j], g) * a.scale;
            float dp = dot_tile<HSM>(dy, vt[j], g);
            if (k0 + j > tl) {
                continue;
            }
            float p = expf(s - lse);
            axpy_tile<HSM>(dq, p * (dp - D) * a.scale, kt[j], g);
        }
    }
    if (t < a.T) {
        store_row<HSM>(a.dqkv + ((size_t)b * a.T + t) * C3 + h * a.hs, dq, g, a.hs);
    }
}

// ----------------------------------------------------------------------------
// launchers

static int fa_args_init(fa_args *a, int B, int T, int C, int NH)
{
    if (B <= 0 || T <= 0 || C <= 0 || NH <= 0 || C % NH != 0 || C / NH > KN_CUDA_FLASH_MAX_HS) {
        return -EINVAL;
    }
    *a = fa_args{};
    a->T = T;
    a->C = C;
    a->NH = NH;
    a->hs = C / NH;
    a->scale = 1.0f / sqrtf((float)a->hs);
    return 0;
}

template <int HSM> static void fa_fwd_launch(const fa_args &a, int B, cudaStream_t stream)
{
    constexpr int ROWS = fa_shape<HSM>::ROWS;
    dim3 grid((unsigned)((a.T + ROWS - 1) / ROWS), (unsigned)(B * a.NH));
    fa_fwd_kernel<HSM><<<grid, FA_THREADS, 0, stream>>>(a);
}

template <int HSM> static void fa_bwd_launch(const fa_args &a, int B, cudaStream_t stream)
{
    constexpr int ROWS = fa_shape<HSM>::ROWS;
    dim3 grid((unsigned)((a.T + ROWS - 1) / ROWS), (unsigned)(B * a.NH));
    fa_dkdv_kernel<HSM><<<grid, FA_THREADS, 0, stream>>>(a);
    fa_dq_kernel<HSM><<<grid, FA_THREADS, 0, stream>>>(a);
}

extern "C" int kn_cuda_flash_attention_fwd(float *out, float *lse, const float *qkv, int B, int T,
                                           int C, int NH, kn_stream_t stream)
{
    fa_args a;
    int rc = fa_args_init(&a, B, T, C, NH);
    if (rc < 0) {
        return rc;
    }
    a.qkv = qkv;
    a.y = out;
    a.lse_out = lse;
    if (a.hs <= 32) {
        fa_fwd_launch<32>(a, B, stream);
    } else if (a.hs <= 64) {
        fa_fwd_launch<64>(a, B, stream);
    } else {
        fa_fwd_launch<128>(a, B, stream);
    }
    return kn_cu_launched();
}

extern "C" int kn_cuda_flash_attention_bwd(float *dqkv, float *scratch, const float *dout,
                                           const float *qkv, const float *out, const float *lse,
                                           int B, int T, int C, int NH, kn_stream_t stream)
{
    fa_args a;
    int rc = fa_args_init(&a, B, T, C, NH);
    if (rc < 0) {
        return rc;
    }
    size_t rows = (size_t)B * NH * T;
    fa_dsum_kernel<<<kn_cu_blocks(rows, 256), 256, 0, stream>>>(scratch, dout, out, B, T, C, NH);
    if ((rc = kn_cu_launched()) < 0) {
        return rc;
    }
    a.qkv = qkv;
    a.out = out;
    a.dout = dout;
    a.lse = lse;
    a.dsum = scratch;
    a.dqkv = dqkv;
    if (a.hs <= 32) {
        fa_bwd_launch<32>(a, B, stream);
    } else if (a.hs <= 64) {
        fa_bwd_launch<64>(a, B, stream);
    } else {
        fa_bwd_launch<128>(a, B, stream);
    }
    return kn_cu_launched();
}
