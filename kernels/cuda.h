/* CUDA kernels: the device versions of every op family of kernels/ (<family>.h), llm.c launcher
 * style. Each launcher has its CPU twin's arguments plus, where the op needs them, a cuBLAS context
 * first, scratch memory, and the stream last; it only enqueues work on that stream and
 * returns. Every pointer is device memory unless stated. Shapes as in the CPU headers:
 * B = batch, T = time, C = channels, N = rows (B*T), NH = heads, V/Vp = real/padded vocab.
 *
 * Errors: launchers return 0, -EINVAL (a shape the kernel cannot take), -ENOMEM, or
 * KN_E_CUDA (a CUDA or cuBLAS failure). An asynchronous fault shows up at a later launch or
 * at the caller's stream synchronisation; kn_cuda_error_text names the last one.
 *
 * Determinism: no floating-point atomics anywhere, so one GPU model gives bit-identical
 * results run to run (cuBLAS is deterministic per architecture and SM count).
 * Tolerances against the CPU kernels are stated in tests/unit/test_kernels_cuda.c.
 *
 * This header is C and needs no CUDA header: a stream is CUDA's own `cudaStream_t`
 * (struct CUstream_st *), NULL meaning the legacy default stream. */
#ifndef KN_CUDA_H
#define KN_CUDA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct CUstream_st *kn_stream_t; /* == cudaStream_t */

/* == CH_E_CUDA (common/err.h); kernels include nothing of ours, the unit test checks both */
#define KN_E_CUDA (-10009)

/* The text of the last CUDA runtime error on this thread, clearing it (never NULL). */
const char *kn_cuda_error_text(void);

// ----------------------------------------------------------------------------
// context: cuBLAS and cuBLASLt handles, their workspace, the GEMM precision

typedef struct kn_cuda kn_cuda_t;

/* Created on the current device; owned by the caller, one per stream of work (cuBLAS handles
 * are not shared between threads). tf32 != 0: GEMMs may use TF32 tensor cores
 * (train.precision = tf32); 0: full fp32. */
int kn_cuda_create(kn_cuda_t **out, int tf32);
void kn_cuda_destroy(kn_cuda_t *ctx);
void kn_cuda_set_tf32(kn_cuda_t *ctx, int tf32);
/* bf16 != 0: the matmuls (kn_cuda_matmul_fwd/bwd) multiply bf16 operands with fp32
 * accumulation and an fp32 result (cuBLASLt, CUDA_R_16BF); their fp32 inputs are cast on
 * the way in (exact when they hold bf16 values, as train.precision = bf16's do). 0: as
 * tf32 says. The attention GEMMs are unaffected. */
void kn_cuda_set_bf16(kn_cuda_t *ctx, int bf16);
/* Under kn_cuda_set_bf16: w16 (bf16, n elements, device memory) holds w32[0..n) cast to bf16
 * (kn_cuda_bf16_pack: the parameters' working copy). Until the next call, a matmul operand
 * that lies wholly inside w32[0..n) is read from w16 at the same offset instead of being
 * cast, the same bits. n = 0 drops it. The caller keeps w16 alive and unchanged while GEMMs
 * enqueued on it may run. */
void kn_cuda_set_weights16(kn_cuda_t *ctx, const float *w32, const uint16_t *w16, size_t n);
/* dst[0..n) = src[0..n) rounded to bf16 (round to nearest even) and widened back: the
 * store of a bf16 tensor held in fp32 memory (kernels/bf16.h's kn_bf16_round1). dst may
 * be src. */
int kn_cuda_bf16_round(float *dst, const float *src, size_t n, kn_stream_t stream);
/* The casts of a bf16 message (kernels/bf16.h's kn_bf16_pack / kn_bf16_unpack) on the
 * device: dst[0..n) = src rounded to nearest even, or widened exactly. No overlap. */
int kn_cuda_bf16_pack(uint16_t *dst, const float *src, size_t n, kn_stream_t stream);
int kn_cuda_bf16_unpack(float *dst, const uint16_t *src, size_t n, kn_stream_t stream);
/* Allocate now what GEMMs over up to `rows` rows need (the column sums' vector of ones), so
 * that no launch grows it later (a wait for the device, a free and an allocation). */
int kn_cuda_reserve_rows(kn_cuda_t *ctx, size_t rows, kn_stream_t stream);
/* Under kn_cuda_set_bf16 (set first): allocate now the bf16 copies of the operands of every
 * matmul over up to `rows` rows of width C (its weights at most C x 4C, its activations at
 * most rows x 4C), so that no GEMM grows them during a step. Without bf16: nothing. */
int kn_cuda_reserve_bf16(kn_cuda_t *ctx, size_t rows, size_t C, kn_stream_t stream);
/* The last cuBLAS failure seen by this context ("" if none). */
const char *kn_cuda_ctx_error(const kn_cuda_t *ctx);

// ----------------------------------------------------------------------------
// encoder (kernels/encoder.h)

int kn_cuda_encoder_fwd(float *out, const int32_t *inp, const float *wte, const float *wpe, int B,
                        int T, int C, kn_stream_t stream);
/* dwte, dwpe accumulate, in the CPU reference's order (bit-identical to it): positions are
 * sorted by token (a stable radix sort) and each vocab row sums its positions in order.
 * scratch: kn_cuda_encoder_bwd_scratch_bytes(B, T) bytes. */
size_t kn_cuda_encoder_bwd_scratch_bytes(int B, int T);
int kn_cuda_encoder_bwd(float *dwte, float *dwpe, void *scratch, const float *dout,
                        const int32_t *inp, int B, int T, int C, kn_stream_t stream);

// ----------------------------------------------------------------------------
// layernorm (kernels/layernorm.h)

int kn_cuda_layernorm_fwd(float *out, float *mean, float *rstd, const float *inp,
                          const float *weight, const float *bias, int N, int C, kn_stream_t stream);
/* dinp, dweight, dbias accumulate. dweight/dbias are summed in KN_CUDA_LN_PARTIALS fixed
 * partial sums (no atomics). scratch: KN_CUDA_LN_BWD_SCRATCH(C) floats. dinp NULL: only the
 * parameter gradients, weight not read (may be NULL); dweight and dbias NULL: only dinp, no
 * partial sums (scratch may be NULL). Each half gives the whole backward's bits. */
#define KN_CUDA_LN_PARTIALS       512
#define KN_CUDA_LN_BWD_SCRATCH(C) ((size_t)KN_CUDA_LN_PARTIALS * 2 * (size_t)(C))
int kn_cuda_layernorm_bwd(float *dinp, float *dweight, float *dbias, float *scratch,
                          const float *dout, const float *inp, const float *weight,
                          const float *mean, const float *rstd, int N, int C, kn_stream_t stream);

// ----------------------------------------------------------------------------
// matmul, Hugging Face Conv1D layout (kernels/matmul.h)

/* out[N,OC] = inp[N,C] @ weight[C,OC] + bias[OC]; bias may be NULL (cuBLASLt, bias fused) */
int kn_cuda_matmul_fwd(kn_cuda_t *ctx, float *out, const float *inp, const float *weight,
                       const float *bias, int N, int C, int OC, kn_stream_t stream);
/* dinp = dout @ weight^T (overwrites); dweight += inp^T @ dout; dbias += column sums of dout.
 * Any of the three may be NULL, and its work is skipped: dinp NULL, weight is not read (it
 * may be NULL); dweight and dbias NULL, inp is not read (ZB-H1's split backward) */
int kn_cuda_matmul_bwd(kn_cuda_t *ctx, float *dinp, float *dweight, float *dbias, const float *dout,
                       const float *inp, const float *weight, int N, int C, int OC,
                       kn_stream_t stream);

// ----------------------------------------------------------------------------
// attention, causal (kernels/attention.h)

/* Materialised: the CPU contract. att [B,NH,T,T] keeps the probabilities (zeros above the
 * diagonal); cuBLAS batched GEMMs and a softmax kernel. */
int kn_cuda_attention_fwd(kn_cuda_t *ctx, float *out, float *att, const float *qkv, int B, int T,
                          int C, int NH, kn_stream_t stream);
/* The forward's first half: att [B,NH,T,T] = the probabilities alone, the same bits
 * (the backward's recomputation when nothing was kept). */
int kn_cuda_attention_probs(kn_cuda_t *ctx, float *att, const float *qkv, int B, int T, int C,
                            int NH, kn_stream_t stream);
/* dqkv overwritten. scratch: KN_CUDA_ATT_BWD_SCRATCH(T, NH) floats. */
#define KN_CUDA_ATT_BWD_SCRATCH(T, NH) ((size_t)(NH) * (size_t)(T) * (size_t)(T))
int kn_cuda_attention_bwd(kn_cuda_t *ctx, float *dqkv, float *scratch, const float *dout,
                          const float *qkv, const float *att, int B, int T, int C, int NH,
                          kn_stream_t stream);

/* Fused (flash-attention style, fp32): nothing of size T*T in global memory. The forward
 * keeps each row's log-sum-exp of the scaled scores, lse [B,NH,T]; the backward recomputes
 * the probabilities from it, one kernel for dK/dV per key tile and one for dQ per query tile
 * (no atomics). Head size hs = C/NH must be at most KN_CUDA_FLASH_MAX_HS.
 * scratch: KN_CUDA_FLASH_BWD_SCRATCH(B, T, NH) floats (rowsum(dout * out)). */
#define KN_CUDA_FLASH_MAX_HS                128
#define KN_CUDA_FLASH_BWD_SCRATCH(B, T, NH) ((size_t)(B) * (size_t)(NH) * (size_t)(T))
int kn_cuda_flash_attention_fwd(float *out, float *lse, const float *qkv, int B, int T, int C,
                                int NH, kn_stream_t stream);
int kn_cuda_flash_attention_bwd(float *dqkv, float *scratch, const float *dout, const float *qkv,
                                const float *out, const float *lse, int B, int T, int C, int NH,
                                kn_stream_t stream);

// ----------------------------------------------------------------------------
// gelu, residual (kernels/gelu.h, kernels/residual.h)

int kn_cuda_gelu_fwd(float *out, const float *inp, size_t n, kn_stream_t stream);
int kn_cuda_gelu_bwd(float *dinp, const float *inp, const float *dout, size_t n,
                     kn_stream_t stream);
int kn_cuda_residual_fwd(float *out, const float *a, const float *b, size_t n, kn_stream_t stream);
/* y[i] += a * x[i] (kn_axpy): a rounded multiply then a rounded add, no FMA, so the bits
 * are the CPU kernel's; x and y do not overlap */
int kn_cuda_axpy(float *y, const float *x, size_t n, float a, kn_stream_t stream);
/* x[i] *= c, one fp32 multiply each: gradient clipping's scale, bit-identical to the host's
 * loop (workerd/engine/optim.c) */
int kn_cuda_scale(float *x, float c, size_t n, kn_stream_t stream);

// ----------------------------------------------------------------------------
// LM head fused with cross-entropy over the real vocab (kernels/xent.h)

/* logits [N,Vp] = x @ wte^T; with lse != NULL also lse[n]; with targets and losses also
 * losses[n] = lse[n] - logits[n, targets[n]] (targets: device int32). */
int kn_cuda_lmhead_fwd(kn_cuda_t *ctx, float *logits, float *lse, float *losses, const float *x,
                       const float *wte, const int32_t *targets, int N, int C, int V, int Vp,
                       kn_stream_t stream);
/* Backward of sum_n scale * losses[n]: logits turn into dlogits in place; dx overwritten,
 * dwte [Vp,C] accumulates (rows >= V untouched). */
int kn_cuda_lmhead_bwd(kn_cuda_t *ctx, float *dx, float *dwte, float *logits, const float *lse,
                       const float *x, const float *wte, const int32_t *targets, float scale, int N,
                       int C, int V, int Vp, kn_stream_t stream);
/* llm.c's fused classifier: forward and backward in one pass for a training step whose loss
 * scale is known up front. logits = x @ wte^T, then one kernel per row computes lse and the
 * loss and overwrites the row with dlogits, then the two backward GEMMs. Same results as
 * kn_cuda_lmhead_fwd followed by kn_cuda_lmhead_bwd, without computing the logits twice. */
int kn_cuda_lmhead_fused(kn_cuda_t *ctx, float *dx, float *dwte, float *logits, float *lse,
                         float *losses, const float *x, const float *wte, const int32_t *targets,
                         float scale, int N, int C, int V, int Vp, kn_stream_t stream);
/* kn_lmhead_fwdbwd: the fused classifier at scale 1 (the unscaled gradient of sum_n
 * losses[n]; the caller scales dx and dwte when it knows the loss scale): logits left
 * holding G, lse and losses filled (targets required), dx [N,C] overwritten, dwte [V,C]
 * accumulated (acc != 0) or overwritten (acc == 0; rows >= V untouched either way). The
 * same kernels as kn_cuda_lmhead_fused, so with acc it gives that function's bits at
 * scale 1. */
int kn_cuda_lmhead_fwdbwd(kn_cuda_t *ctx, float *dx, float *dwte, float *logits, float *lse,
                          float *losses, const float *x, const float *wte, const int32_t *targets,
                          int acc, int N, int C, int V, int Vp, kn_stream_t stream);

// ----------------------------------------------------------------------------
// tensor parallelism: the vocab-parallel embedding and cross-entropy (kernels/tp.h); this
// rank's slice [v0, v0+Vl) of the padded vocab, `valid` of its columns real. Tolerances
// against the CPU loops: kernels/cuda/tp.cu.

/* out overwritten; wpe NULL: no positions. Bit-identical to kn_tp_embed_fwd. */
int kn_cuda_tp_embed_fwd(float *out, const int32_t *inp, const float *wte, const float *wpe, int v0,
                         int Vl, int B, int T, int C, kn_stream_t stream);
/* dwte [Vl,C] and dwpe accumulate, bit-identical to kn_tp_embed_bwd (kn_cuda_encoder_bwd's
 * sort, runs outside the slice skipped). scratch: kn_cuda_encoder_bwd_scratch_bytes(B, T). */
int kn_cuda_tp_embed_bwd(float *dwte, float *dwpe, void *scratch, const float *dout,
                         const int32_t *inp, int v0, int Vl, int B, int T, int C,
                         kn_stream_t stream);
int kn_cuda_tp_xent_max(float *mx, const float *logits, int N, int Vl, int valid,
                        kn_stream_t stream);
int kn_cuda_tp_xent_sums(float *sum, float *tl, const float *logits, const float *mx,
                         const int32_t *targets, int v0, int N, int Vl, int valid,
                         kn_stream_t stream);
int kn_cuda_tp_xent_finish(float *lse, float *losses, const float *mx, const float *sum,
                           const float *tl, int N, kn_stream_t stream);
int kn_cuda_tp_xent_bwd(float *logits, const float *lse, const int32_t *targets, float scale,
                        int v0, int N, int Vl, int valid, kn_stream_t stream);

// ----------------------------------------------------------------------------
// optimizer (kernels/adamw.h)

/* The CPU fast kernel's fp32 operation sequence, rounded op by op (no FMA contraction):
 * bit-identical to kn_adamw. */
int kn_cuda_adamw(float *p, const float *g, float *m, float *v, size_t n, double lr, double beta1,
                  double beta2, double eps, double wd, uint64_t t, kn_stream_t stream);
/* kn_adamw_fused: kn_cuda_adamw on g[i] * gscale (one rounded fp32 multiply; exact when
 * gscale is 1), then g[i] = 0 when zero_g, in one pass: bit-identical to kn_adamw_fused,
 * and to kn_cuda_scale(g, gscale) followed by kn_cuda_adamw. */
int kn_cuda_adamw_fused(float *p, float *g, float *m, float *v, size_t n, double lr, double beta1,
                        double beta2, double eps, double wd, uint64_t t, float gscale, int zero_g,
                        kn_stream_t stream);
/* *out (device double) = sum x^2 in double: KN_CUDA_SUMSQ_PARTIALS block sums in scratch
 * (doubles), then one fixed-order sum. With accumulate != 0, *out += instead. */
#define KN_CUDA_SUMSQ_PARTIALS 1024
int kn_cuda_sumsq(double *out, double *scratch, const float *x, size_t n, int accumulate,
                  kn_stream_t stream);
/* *acc (device double) += kn_loss_mean of losses[0..n) (device): the sum in double in one
 * block's fixed order (not the CPU's index order: equal to a few ulp), over n, as a float. */
int kn_cuda_loss_acc(double *acc, const float *losses, size_t n, kn_stream_t stream);

#ifdef __cplusplus
}
#endif

#endif
