/* The engine's backend (ENGINE.md): the kernels the model runs and the memory it runs them
 * on, as one table of function pointers chosen at run time. The model allocates its
 * parameters, gradients and activations and calls every kernel through the table it was
 * created with, so a CUDA backend is another table (kernels/cuda/ launchers with the stream
 * held in ud), never a second model.
 *
 * Memory from alloc is the backend's ("device" memory): ordinary host memory for the CPU
 * backend (host_memory = 1), GPU memory for CUDA. Whoever holds a pointer into it reads and
 * writes it on the host only when host_memory is set; otherwise through copy.
 *
 * Kernels take the table first (so a backend finds its stream or counters in ud, no
 * globals) and then exactly the arguments of the kn_* op of the same name: shapes, units
 * and accumulate-or-overwrite contracts are in kernels/<family>.h. B = batch, T = time,
 * C = channels, N = rows (B*T), OC = output channels, NH = heads, V = vocab, Vp = padded
 * vocab. Kernels cannot fail; a backend whose launches can reports the error at its next
 * copy.
 *
 * Entries added after the first table (lmhead_fwdbwd, axpy, adamw_fused, sumsq, scale, sync,
 * timer_*, sumsq_to, loss_acc)
 * may be NULL in a backend that predates them: their callers then fall back to the older
 * entries (the same results, more passes; sumsq and scale through a host copy when the
 * memory is not the host's; no sync: nothing is ever queued). The vocab-parallel entries
 * (tp_*) may be NULL too: the model then runs the CPU backend's on the backend's memory, so
 * tensor parallelism (tp > 1) needs host_memory there. */
#ifndef ENG_BACKEND_H
#define ENG_BACKEND_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
    ENG_COPY_H2D, /* host memory -> backend memory */
    ENG_COPY_D2H, /* backend memory -> host memory */
    ENG_COPY_D2D, /* within backend memory (regions must not overlap) */
} eng_copy_dir_t;

typedef struct eng_backend eng_backend_t;

/* What the trainer times in a step (timer_mark): its passes (forward, backward, weight), the
 * optimizer's update. */
enum { ENG_TIMER_PASS = 0, ENG_TIMER_OPTIM = 1, ENG_TIMER_KINDS = 2 };

struct eng_backend {
    const char *name; /* "cpu" */
    int host_memory;  /* 1: alloc's memory is host memory the caller may touch directly */
    void *ud;         /* the backend's own state (stream, counters); NULL for the CPU */

    // ------------------------------------------------------------------------
    // memory (bytes, not elements)

    /* *out: bytes of backend memory aligned to 64 bytes, contents undefined (bytes 0 gives
     * a valid, freeable pointer). 0 or -ENOMEM. The caller owns it: free. */
    int (*alloc)(const eng_backend_t *be, size_t bytes, void **out);
    void (*free)(const eng_backend_t *be, void *p); /* NULL is fine */
    int (*copy)(const eng_backend_t *be, void *dst, const void *src, size_t bytes,
                eng_copy_dir_t dir);
    /* every byte of p[0..bytes) = value (the CPU's: over its threads when large) */
    int (*memset)(const eng_backend_t *be, void *p, int value, size_t bytes);

    // ------------------------------------------------------------------------
    // kernels (kernels/<family>.h)

    void (*encoder_fwd)(const eng_backend_t *be, float *out, const int32_t *inp, const float *wte,
                        const float *wpe, int B, int T, int C);
    void (*encoder_bwd)(const eng_backend_t *be, float *dwte, float *dwpe, const float *dout,
                        const int32_t *inp, int B, int T, int C);
    void (*layernorm_fwd)(const eng_backend_t *be, float *out, float *mean, float *rstd,
                          const float *inp, const float *weight, const float *bias, int N, int C);
    /* the backwards: a split backward (ZB-H1) runs either half alone. NULL dweight and dbias:
     * the input gradient alone (matmul: inp unread); NULL dinp: the parameter gradients alone
     * (weight unread, NULL) */
    void (*layernorm_bwd)(const eng_backend_t *be, float *dinp, float *dweight, float *dbias,
                          const float *dout, const float *inp, const float *weight,
                          const float *mean, const float *rstd, int N, int C);
    void (*matmul_fwd)(const eng_backend_t *be, float *out, const float *inp, const float *weight,
                       const float *bias, int N, int C, int OC);
    void (*matmul_bwd)(const eng_backend_t *be, float *dinp, float *dweight, float *dbias,
                       const float *dout, const float *inp, const float *weight, int N, int C,
                       int OC);
    /* att NULL (parallel.recompute = selective): keep nothing; the backward then gets att
     * NULL too and recomputes what it needs with the forward's arithmetic (the same bits as
     * from a kept att). scratch: backend memory, with att NULL kernels/attention.h's
     * KN_ATTENTION_NOATT_SCRATCH(T) floats (a backend needing more keeps its own), else
     * unused (may be NULL). */
    void (*attention_fwd)(const eng_backend_t *be, float *out, float *att, float *scratch,
                          const float *qkv, int B, int T, int C, int NH);
    /* scratch: T*T floats of backend memory, with att NULL max(T*T, NOATT_SCRATCH(T)) */
    void (*attention_bwd)(const eng_backend_t *be, float *dqkv, float *scratch, const float *dout,
                          const float *qkv, const float *att, int B, int T, int C, int NH);
    void (*gelu_fwd)(const eng_backend_t *be, float *out, const float *inp, size_t n);
    void (*gelu_bwd)(const eng_backend_t *be, float *dinp, const float *inp, const float *dout,
                     size_t n);
    void (*residual_fwd)(const eng_backend_t *be, float *out, const float *a, const float *b,
                         size_t n);
    /* LM head + softmax cross-entropy (kernels/xent.h) */
    void (*lmhead_fwd)(const eng_backend_t *be, float *logits, float *lse, float *losses,
                       const float *x, const float *wte, const int32_t *targets, int N, int C,
                       int V, int Vp);
    void (*lmhead_bwd)(const eng_backend_t *be, float *dx, float *dwte, float *logits,
                       const float *lse, const float *x, const float *wte, const int32_t *targets,
                       float scale, int N, int C, int V, int Vp);
    /* Forward and unscaled backward of one chunk in one pass (kn_lmhead_fwdbwd): dx [N,C]
     * overwritten, dwte [V,C] accumulated (acc) or overwritten; the caller scales both. */
    void (*lmhead_fwdbwd)(const eng_backend_t *be, float *dx, float *dwte, float *logits,
                          float *lse, float *losses, const float *x, const float *wte,
                          const int32_t *targets, int acc, int N, int C, int V, int Vp);
    /* y[0..n) += a * x[0..n) (kernels/residual.h) */
    void (*axpy)(const eng_backend_t *be, float *y, const float *x, size_t n, float a);
    /* optimizer (kernels/adamw.h). Any range of the slabs works (a ZeRO-3 shard: p, g, m, v
     * at the same offset), each call spread over the backend's threads when n is large
     * (the CPU's: kernels/pool.h, as many as kn_blas_set_threads set) with the same bits
     * for any thread count; small ranges run on the caller. */
    void (*adamw)(const eng_backend_t *be, float *p, const float *g, float *m, float *v, size_t n,
                  double lr, double beta1, double beta2, double eps, double wd, uint64_t t);
    /* adamw on g[i] * gscale (the clipping coefficient, 1.0f when not clipping: exact), then
     * g[0..n) = 0 when zero_g: clip, update and the next step's zero_grad in one pass over
     * p, g, m, v, bit-identical to scaling g by gscale and calling adamw. */
    void (*adamw_fused)(const eng_backend_t *be, float *p, float *g, float *m, float *v, size_t n,
                        double lr, double beta1, double beta2, double eps, double wd, uint64_t t,
                        float gscale, int zero_g);
    /* sum of x[0..n)^2 in double, in a fixed order (blocks of 65536) that does not depend
     * on the thread count; the result is host memory. */
    double (*sumsq)(const eng_backend_t *be, const float *x, size_t n);
    /* x[0..n) *= c */
    void (*scale)(const eng_backend_t *be, float *x, size_t n, float c);
    /* Wait until every kernel, copy and memset enqueued so far has finished: a timer read
     * after it measures the work, not its launch. 0, or the pending launch failure. NULL:
     * the backend runs everything before returning (the CPU). */
    int (*sync)(const eng_backend_t *be);
    /* Step timers in stream order: mark the start (begin = 1) or the end (begin = 0) of an
     * interval of kind `kind` (< ENG_TIMER_KINDS) among the work enqueued so far (CUDA: an
     * event recorded on the stream, so the interval is the device's, not the launches');
     * timer_read, after a sync, puts into ms[k] the milliseconds of the kind-k intervals
     * closed since the last read and forgets them. Intervals of one kind do not nest. NULL
     * (the CPU, whose work is done when its call returns): the caller times on the host. */
    void (*timer_mark)(const eng_backend_t *be, int kind, int begin);
    void (*timer_read)(const eng_backend_t *be, double *ms);

    // ------------------------------------------------------------------------
    // tensor parallelism: the vocab-parallel embedding and cross-entropy (kernels/tp.h), the
    // per-rank parts around the TP group's all-reduces. This rank's slice of the padded vocab
    // is the rows [v0, v0+Vl) (wte, dwte: the slice's [Vl,C]); `valid` of its columns are
    // real tokens. Every pointer is backend memory.

    /* out [B,T,C] overwritten: the slice's rows of the tokens in it, 0 for the others, plus
     * wpe [>=T,C] when wpe != NULL (NULL: no positions, the ranks other than the first) */
    void (*tp_embed_fwd)(const eng_backend_t *be, float *out, const int32_t *inp, const float *wte,
                         const float *wpe, int v0, int Vl, int B, int T, int C);
    /* dwte [Vl,C] accumulates dout's rows of the slice's tokens, dwpe [>=T,C] every
     * position's; in position order (the CPU's bits) */
    void (*tp_embed_bwd)(const eng_backend_t *be, float *dwte, float *dwpe, const float *dout,
                         const int32_t *inp, int v0, int Vl, int B, int T, int C);
    /* mx [N] overwritten: each row's max over logits [N,Vl]'s first `valid` columns */
    void (*tp_xent_max)(const eng_backend_t *be, float *mx, const float *logits, int N, int Vl,
                        int valid);
    /* sum [N] overwritten: each row's sum of exp(logit - mx) over the valid columns (in
     * double, then float); tl [N] overwritten: the target's logit when this slice holds it,
     * else 0. mx: the group's max. */
    void (*tp_xent_sums)(const eng_backend_t *be, float *sum, float *tl, const float *logits,
                         const float *mx, const int32_t *targets, int v0, int N, int Vl, int valid);
    /* lse [N] = mx + logf(sum), losses [N] = lse - tl, both overwritten (the group's sums) */
    void (*tp_xent_finish)(const eng_backend_t *be, float *lse, float *losses, const float *mx,
                           const float *sum, const float *tl, int N);
    /* logits [N,Vl] overwritten in place with dlogits of sum_n scale * losses[n]:
     * expf(logit - lse) * scale on the valid columns, minus scale on the target's, 0 on the
     * padded ones */
    void (*tp_xent_bwd)(const eng_backend_t *be, float *logits, const float *lse,
                        const int32_t *targets, float scale, int v0, int N, int Vl, int valid);

    // ------------------------------------------------------------------------
    // attention's kept state

    /* Floats attention_fwd keeps in att per sequence, head and query row, for T tokens and
     * head size hs: T (the probabilities, B*NH*T*T floats: the CPU's, and what NULL means)
     * or 1 (a fused attention's log-sum-exp, B*NH*T floats: CUDA's by default). The model
     * sizes its att buffers by it; common/plan.h's ch_model_cfg_t.att_row says the same. */
    int (*att_row)(const eng_backend_t *be, int T, int hs);

    // bf16 mixed precision (backend_bf16.h)

    /* dst[0..n) = src[0..n) rounded to bf16 and widened back (kernels/bf16.h's
     * kn_bf16_round1; dst may be src), in the backend's memory. NULL: the bf16 wrapper
     * rounds on the host (directly with host_memory, else through copies). */
    void (*bf16_round)(const eng_backend_t *be, float *dst, const float *src, size_t n);
    /* The cast of a bf16 message, in the backend's memory: to_bf16 = 1, dst kn_bf16_t[n] =
     * src float[n] rounded to nearest even (kernels/bf16.h's kn_bf16_pack); 0, dst float[n]
     * = src kn_bf16_t[n] widened exactly (kn_bf16_unpack). dst and src do not overlap. NULL:
     * the engine packs on the host with host_memory, else moves fp32 (coll_bf16.h). */
    void (*bf16_cast)(const eng_backend_t *be, void *dst, const void *src, size_t n, int to_bf16);

    // the step's reads

    /* *out (one double of backend memory) = sumsq's sum of x[0..n)^2, the same bits,
     * enqueued: the host reads it with a copy, so a step's sums cost one download, not one
     * wait each. NULL: the caller calls sumsq. */
    void (*sumsq_to)(const eng_backend_t *be, double *out, const float *x, size_t n);
    /* *acc (one double of backend memory) += the micro-batch loss of its n token losses
     * (kernels/xent.h's kn_loss_mean; CUDA: the sum in another fixed order), enqueued: a
     * step's losses stay on the device until it reads them once. NULL: the caller copies
     * each micro-batch's losses back. */
    void (*loss_acc)(const eng_backend_t *be, double *acc, const float *losses, size_t n);

    // bf16 working copies

    /* train.precision = bf16: w16 (kn_bf16_t[n], the backend's memory) holds base[0..n)
     * cast to bf16 (bf16_cast), the parameters' working copy made once per step. Until the
     * next call, a bf16 GEMM operand that lies inside base[0..n) is read from w16 at the same
     * offset instead of being cast from base (the same bits: both are round to nearest
     * even); every other read of base stays base's. n = 0 (base, w16 NULL) drops the
     * copy. NULL: the GEMMs cast every operand (the bf16 wrapper then hands them a copy
     * widened from w16, backend_bf16.h). */
    void (*bf16_weights)(const eng_backend_t *be, const float *base, const void *w16, size_t n);
};

/* The CPU backend: kernels/cpu's fast kernels on host memory (posix_memalign). A static
 * table: never freed. */
const eng_backend_t *eng_backend_cpu(void);

/* The CUDA backend (backend_cuda.c; built with CHORUS_HAVE_CUDA only): kernels/cuda on one
 * stream of GPU `device` (an ordinal among the GPUs CUDA_VISIBLE_DEVICES leaves visible),
 * device memory (host_memory = 0), fp32 GEMMs. A launch failure is returned by the next
 * copy or memset. It makes `device` the calling thread's current device: drive it from that
 * thread. Caller owns *out: eng_backend_cuda_destroy after every user of it. 0,
 * -ENODEV (no such GPU), -ENOMEM, CH_E_CUDA. */
int eng_backend_cuda_create(int device, eng_backend_t **out);
void eng_backend_cuda_destroy(eng_backend_t *be);
/* GPUs visible to this process into *count (0 without a driver or a GPU); CH_E_CUDA when
 * the runtime itself fails. */
int eng_backend_cuda_devices(int *count);
/* Let the GEMMs use TF32 tensor cores (on) or not (off, the default). */
void eng_backend_cuda_set_tf32(eng_backend_t *be, int on);
/* The matmuls' GEMMs on bf16 operands with fp32 accumulation (on; train.precision = bf16,
 * under the bf16 wrapper of backend_bf16.h) or as set_tf32 says (off, the default). */
void eng_backend_cuda_set_bf16(eng_backend_t *be, int on);
/* Its cudaStream_t (the collectives' wrk_coll_config_t.stream); borrowed. */
void *eng_backend_cuda_stream(const eng_backend_t *be);
/* Wait for every kernel enqueued so far; the pending launch failure if any. */
int eng_backend_cuda_sync(const eng_backend_t *be);
/* Allocate now the launchers' scratch a step of B sequences of T tokens, C channels and NH
 * heads needs (the encoder's and layernorm's backward, the attention backward's NH*T*T), so
 * that no step grows it (a sync, a cudaFree and a cudaMalloc while collectives may be in
 * flight). 0 or -ENOMEM. */
int eng_backend_cuda_reserve(eng_backend_t *be, int B, int T, int C, int NH);

#endif
