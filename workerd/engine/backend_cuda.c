/* The CUDA backend (backend.h): device memory and the kernels of kernels/cuda on one stream
 * of one GPU, fp32 (TF32 GEMMs on request). Built into libchorus_engine_cuda.so with
 * kernels/cuda and loaded on demand (backend_cuda.h says why); it links nothing of ours.
 *
 * Theory of operation. Every kernel is enqueued on the backend's stream and returns at
 * once; work is ordered by the stream alone, so one scratch buffer serves every launcher
 * that needs one: reserved before the first step (eng_backend_cuda_reserve), else grown on
 * demand. Kernels cannot fail in the table's contract: the first
 * launch error is kept and returned by the next copy, memset or sync (the trainer downloads
 * the losses and sums of squares once a step, so an error surfaces within a step). Copies to the
 * host wait for the stream; copies from the host (pageable memory, staged by CUDA before the
 * call returns) do not, and their host buffers are free to reuse on return all the same;
 * device to device copies and memsets are asynchronous. sumsq is the one kernel entry that waits:
 * its double comes back to the host (0 after a failure, which stays kept for the next copy);
 * sumsq_to and loss_acc leave theirs on the device. The
 * attention is the fused one by default (kernels/cuda/flash.cu: no T*T in global memory, fp32
 * without tensor cores) wherever the head size allows it (att_row says which, and the model sizes
 * its att buffers by it: B*NH*T floats, each row's log-sum-exp); the backend remembers the output
 * each att buffer's forward wrote, which the fused backward needs and the table does not pass.
 * CHORUS_CUDA_ATTENTION=materialised opts out: the probabilities (B*NH*T*T floats) are kept, and
 * the backward's scratch (NH*T*T floats) is the backend's, not the model's T*T. Not yet measured
 * against each other on a GPU at TF32 (the device check runs both). */
#include <cuda_runtime_api.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/log.h"  /* CH_CHECK_GOTO only: the module logs through the engine's hook */
#include "common/plan.h" /* CH_PLAN_FLASH_MAX_HS: the plan sizes att as att_row does */
#include "kernels/cuda.h"
#include "workerd/engine/backend_cuda.h"

#define CU_TIMER_PAIRS 256

typedef struct cuda_state {
    eng_backend_t table; /* first: the table handed out is this struct */
    int device;
    cudaStream_t stream;
    kn_cuda_t *ctx;
    eng_cuda_log_fn log;
    void *scratch; /* stream-ordered scratch of the launchers, scratch_cap bytes */
    size_t scratch_cap;
    /* sumsq's device result (element 0) and its KN_CUDA_SUMSQ_PARTIALS partial sums; its
     * own, so a sum of squares never waits to grow the launchers' scratch */
    double *sumsq_dev;
    /* the fused kernels (unless CHORUS_CUDA_ATTENTION=materialised), the model's att buffer
     * holding each row's log-sum-exp; the forward's output of each att buffer, which the
     * fused backward needs and the table's attention_bwd is not given (host memory, one
     * entry per att buffer: layers x pipeline slots, grown as buffers are first seen) */
    int flash;
    int bf16; /* set_bf16: the bf16 wrapper (backend_bf16.h) stores every attention output */
    struct flash_out {
        const float *att;
        const float *out;
    } * flash_out;
    int nflash, flash_cap;
    int err;           /* first launch failure not yet reported */
    char errtext[160]; /* what it was */
    /* the step timers (timer_mark): per kind, events recorded in begin/end pairs on the
     * stream since the last read, created on first use and kept; marks past the pool's end
     * are dropped (a step marks a few per pass: far below it) */
    struct cu_timer {
        cudaEvent_t ev[2 * CU_TIMER_PAIRS];
        int n; /* events recorded since the last read */
    } timer[ENG_TIMER_KINDS];
} cuda_state_t;

static cuda_state_t *S(const eng_backend_t *be)
{
    return be->ud;
}

/* The one CUDA runtime -> Chorus conversion of this module. */
static int cu_err(cudaError_t e)
{
    if (e == cudaSuccess) {
        return 0;
    }
    return e == cudaErrorMemoryAllocation ? -ENOMEM : CH_E_CUDA;
}

/* Keep the first launch failure for the next copy or memset. */
static void note(const eng_backend_t *be, const char *what, int rc)
{
    cuda_state_t *s = S(be);
    if (rc == 0 || s->err != 0) {
        return;
    }
    s->err = rc;
    const char *why = rc == -EINVAL ? "bad shape" : kn_cuda_error_text();
    const char *blas = kn_cuda_ctx_error(s->ctx);
    snprintf(s->errtext, sizeof s->errtext, "device %d: %s: %s%s%s", s->device, what, why,
             blas[0] ? "; " : "", blas);
    s->log(s->errtext);
}

/* The kept launch failure, once. */
static int pending(const eng_backend_t *be)
{
    cuda_state_t *s = S(be);
    int rc = s->err;
    s->err = 0;
    return rc;
}

/* bytes of scratch on the stream; NULL (and the failure noted) when it cannot grow */
static void *scratch(const eng_backend_t *be, size_t bytes, const char *what)
{
    cuda_state_t *s = S(be);
    if (bytes <= s->scratch_cap) {
        return s->scratch;
    }
    /* the old buffer may still be read by queued work */
    int rc = cu_err(cudaStreamSynchronize(s->stream));
    if (rc == 0) {
        cudaFree(s->scratch);
        s->scratch = NULL;
        s->scratch_cap = 0;
        rc = cu_err(cudaMalloc(&s->scratch, bytes));
    }
    if (rc < 0) {
        s->scratch = NULL;
        note(be, what, rc);
        return NULL;
    }
    s->scratch_cap = bytes;
    return s->scratch;
}

// ----------------------------------------------------------------------------
// memory

static int cu_alloc(const eng_backend_t *be, size_t bytes, void **out)
{
    (void)be;
    *out = NULL;
    /* cudaMalloc aligns to 256 bytes */
    int rc = cu_err(cudaMalloc(out, bytes ? bytes : 4));
    if (rc < 0) {
        /* returned here, so not left as the thread's last error either: the next launch's
         * check reads that (kn_cu_launched), and a caller that survives the refusal (a
         * generation's logits too large, say) would see its next kernel fail with it */
        (void)cudaGetLastError();
        *out = NULL;
        return -ENOMEM;
    }
    return 0;
}

static void cu_free(const eng_backend_t *be, void *p)
{
    (void)be;
    if (p != NULL) {
        cudaFree(p);
    }
}

static int cu_copy(const eng_backend_t *be, void *dst, const void *src, size_t bytes,
                   eng_copy_dir_t dir)
{
    cuda_state_t *s = S(be);
    int rc = pending(be);
    if (rc < 0 || bytes == 0) {
        return rc;
    }
    enum cudaMemcpyKind kind = dir == ENG_COPY_H2D   ? cudaMemcpyHostToDevice
                               : dir == ENG_COPY_D2H ? cudaMemcpyDeviceToHost
                                                     : cudaMemcpyDeviceToDevice;
    rc = cu_err(cudaMemcpyAsync(dst, src, bytes, kind, s->stream));
    /* Host memory here is pageable (nothing of ours pins it): CUDA stages an upload before
     * the call returns, so the host buffer is free then and the host need not wait for the
     * stream; a download is the host reading the device, and waits. */
    if (rc == 0 && dir == ENG_COPY_D2H) {
        rc = cu_err(cudaStreamSynchronize(s->stream));
    }
    if (rc < 0) {
        snprintf(s->errtext, sizeof s->errtext, "device %d: copy of %zu bytes: %s", s->device,
                 bytes, kn_cuda_error_text());
        s->log(s->errtext);
    }
    return rc;
}

static int cu_memset(const eng_backend_t *be, void *p, int value, size_t bytes)
{
    int rc = pending(be);
    if (rc == 0 && bytes > 0) {
        rc = cu_err(cudaMemsetAsync(p, value, bytes, S(be)->stream));
    }
    return rc;
}

// ----------------------------------------------------------------------------
// kernels: the table's arguments, the launcher's, the failure noted

static void cu_encoder_fwd(const eng_backend_t *be, float *out, const int32_t *inp,
                           const float *wte, const float *wpe, int B, int T, int C)
{
    note(be, "encoder_fwd", kn_cuda_encoder_fwd(out, inp, wte, wpe, B, T, C, S(be)->stream));
}

static void cu_encoder_bwd(const eng_backend_t *be, float *dwte, float *dwpe, const float *dout,
                           const int32_t *inp, int B, int T, int C)
{
    void *tmp = scratch(be, kn_cuda_encoder_bwd_scratch_bytes(B, T), "encoder_bwd scratch");
    if (tmp != NULL) {
        note(be, "encoder_bwd",
             kn_cuda_encoder_bwd(dwte, dwpe, tmp, dout, inp, B, T, C, S(be)->stream));
    }
}

static void cu_layernorm_fwd(const eng_backend_t *be, float *out, float *mean, float *rstd,
                             const float *inp, const float *weight, const float *bias, int N, int C)
{
    note(be, "layernorm_fwd",
         kn_cuda_layernorm_fwd(out, mean, rstd, inp, weight, bias, N, C, S(be)->stream));
}

static void cu_layernorm_bwd(const eng_backend_t *be, float *dinp, float *dweight, float *dbias,
                             const float *dout, const float *inp, const float *weight,
                             const float *mean, const float *rstd, int N, int C)
{
    float *tmp = scratch(be, KN_CUDA_LN_BWD_SCRATCH(C) * sizeof(float), "layernorm_bwd scratch");
    if (tmp != NULL) {
        note(be, "layernorm_bwd",
             kn_cuda_layernorm_bwd(dinp, dweight, dbias, tmp, dout, inp, weight, mean, rstd, N, C,
                                   S(be)->stream));
    }
}

static void cu_matmul_fwd(const eng_backend_t *be, float *out, const float *inp,
                          const float *weight, const float *bias, int N, int C, int OC)
{
    note(be, "matmul_fwd",
         kn_cuda_matmul_fwd(S(be)->ctx, out, inp, weight, bias, N, C, OC, S(be)->stream));
}

static void cu_matmul_bwd(const eng_backend_t *be, float *dinp, float *dweight, float *dbias,
                          const float *dout, const float *inp, const float *weight, int N, int C,
                          int OC)
{
    note(be, "matmul_bwd",
         kn_cuda_matmul_bwd(S(be)->ctx, dinp, dweight, dbias, dout, inp, weight, N, C, OC,
                            S(be)->stream));
}

_Static_assert(KN_CUDA_FLASH_MAX_HS == CH_PLAN_FLASH_MAX_HS,
               "the plan's fused-attention head limit is the kernels'");

/* the fused kernels for this head size (not opted out, within their limit) */
static int use_flash(const eng_backend_t *be, int hs)
{
    return S(be)->flash && hs > 0 && hs <= KN_CUDA_FLASH_MAX_HS;
}

/* backend.h: what the model keeps per attention row, as the forward will use it */
static int cu_att_row(const eng_backend_t *be, int T, int hs)
{
    return use_flash(be, hs) ? 1 : T;
}

/* where the forward that wrote att's log-sum-exps put its output (NULL: none seen, or no
 * room for a new one: the failure noted) */
static const float **flash_slot(const eng_backend_t *be, const float *att, int add)
{
    cuda_state_t *s = S(be);
    for (int i = 0; i < s->nflash; i++) {
        if (s->flash_out[i].att == att) {
            return &s->flash_out[i].out;
        }
    }
    if (!add) {
        return NULL;
    }
    if (s->nflash == s->flash_cap) {
        int cap = s->flash_cap ? 2 * s->flash_cap : 64;
        struct flash_out *n = realloc(s->flash_out, (size_t)cap * sizeof *n);
        if (n == NULL) {
            note(be, "flash attention_fwd: its outputs' table", -ENOMEM);
            return NULL;
        }
        s->flash_out = n;
        s->flash_cap = cap;
    }
    s->flash_out[s->nflash].att = att;
    return &s->flash_out[s->nflash++].out;
}

/* Floats of the backend's scratch an attention without att needs (selective
 * recomputation): the fused one's output and log-sum-exps made again, and its backward's
 * scratch; the materialised one's probabilities of one sequence and their gradient. */
static size_t noatt_scratch(const eng_backend_t *be, int B, int T, int C, int NH)
{
    return use_flash(be, C / NH)
               ? (size_t)B * T * C + (size_t)B * NH * T + KN_CUDA_FLASH_BWD_SCRATCH(B, T, NH)
               : 2 * KN_CUDA_ATT_BWD_SCRATCH(T, NH);
}

/* The forward keeping nothing: its log-sum-exps (fused) or one sequence's probabilities
 * at a time (materialised: the same GEMMs, per b) in the backend's scratch. */
static void noatt_fwd(const eng_backend_t *be, float *out, const float *qkv, int B, int T, int C,
                      int NH)
{
    float *tmp = scratch(be, noatt_scratch(be, B, T, C, NH) * sizeof(float), "attention scratch");
    if (tmp == NULL) {
        return;
    }
    if (use_flash(be, C / NH)) {
        note(be, "flash attention_fwd",
             kn_cuda_flash_attention_fwd(out, tmp, qkv, B, T, C, NH, S(be)->stream));
        return;
    }
    for (int b = 0; b < B; b++) {
        note(be, "attention_fwd",
             kn_cuda_attention_fwd(S(be)->ctx, out + (size_t)b * T * C, tmp,
                                   qkv + (size_t)b * T * 3 * C, 1, T, C, NH, S(be)->stream));
    }
}

/* The backward recomputing what the forward did not keep, with the forward's kernels on
 * the same inputs (the same bits): the fused forward again into the scratch, then its
 * backward; or per sequence, its probabilities then the materialised backward. */
static void noatt_bwd(const eng_backend_t *be, float *dqkv, const float *dout, const float *qkv,
                      int B, int T, int C, int NH)
{
    float *tmp = scratch(be, noatt_scratch(be, B, T, C, NH) * sizeof(float), "attention scratch");
    if (tmp == NULL) {
        return;
    }
    cudaStream_t st = S(be)->stream;
    if (use_flash(be, C / NH)) {
        float *o = tmp, *lse = o + (size_t)B * T * C, *rest = lse + (size_t)B * NH * T;
        note(be, "flash attention_fwd (recompute)",
             kn_cuda_flash_attention_fwd(o, lse, qkv, B, T, C, NH, st));
        /* The backward reads the forward's output (D = dout . out). A kept att's backward
         * reads the one the bf16 wrapper stored, rounded in place by this backend's
         * bf16_round: round the recomputed one the same way, or selective recomputation
         * would not give the kept att's bits (backend.h) under train.precision = bf16. */
        if (S(be)->bf16) {
            note(be, "bf16_round (recompute)", kn_cuda_bf16_round(o, o, (size_t)B * T * C, st));
        }
        note(be, "flash attention_bwd",
             kn_cuda_flash_attention_bwd(dqkv, rest, dout, qkv, o, lse, B, T, C, NH, st));
        return;
    }
    float *p = tmp + KN_CUDA_ATT_BWD_SCRATCH(T, NH);
    for (int b = 0; b < B; b++) {
        size_t q = (size_t)b * T * 3 * C;
        note(be, "attention_probs (recompute)",
             kn_cuda_attention_probs(S(be)->ctx, p, qkv + q, 1, T, C, NH, st));
        note(be, "attention_bwd",
             kn_cuda_attention_bwd(S(be)->ctx, dqkv + q, tmp, dout + (size_t)b * T * C, qkv + q, p,
                                   1, T, C, NH, st));
    }
}

/* The model sized att by att_row: a fused forward never falls back to the materialised one
 * (whose T*T rows would not fit). The model's scratch is too small for these kernels: att
 * NULL uses the backend's own. */
static void cu_attention_fwd(const eng_backend_t *be, float *out, float *att, float *model_scratch,
                             const float *qkv, int B, int T, int C, int NH)
{
    (void)model_scratch;
    if (att == NULL) {
        noatt_fwd(be, out, qkv, B, T, C, NH);
        return;
    }
    if (use_flash(be, NH > 0 ? C / NH : 0)) {
        const float **slot = flash_slot(be, att, 1);
        if (slot == NULL) {
            return;
        }
        *slot = out;
        note(be, "flash attention_fwd",
             kn_cuda_flash_attention_fwd(out, att, qkv, B, T, C, NH, S(be)->stream));
        return;
    }
    note(be, "attention_fwd",
         kn_cuda_attention_fwd(S(be)->ctx, out, att, qkv, B, T, C, NH, S(be)->stream));
}

/* The fused backward from the log-sum-exps in att and the forward's output. */
static void flash_bwd(const eng_backend_t *be, float *dqkv, const float *dout, const float *qkv,
                      const float *att, int B, int T, int C, int NH)
{
    const float **slot = flash_slot(be, att, 0);
    if (slot == NULL) {
        note(be, "flash attention_bwd: no forward of this att buffer", -EINVAL);
        return;
    }
    float *tmp = scratch(be, KN_CUDA_FLASH_BWD_SCRATCH(B, T, NH) * sizeof(float),
                         "flash attention_bwd scratch");
    if (tmp != NULL) {
        note(be, "flash attention_bwd",
             kn_cuda_flash_attention_bwd(dqkv, tmp, dout, qkv, *slot, att, B, T, C, NH,
                                         S(be)->stream));
    }
}

/* the model's scratch (T*T floats) is too small for the batched backward: the backend's own */
static void cu_attention_bwd(const eng_backend_t *be, float *dqkv, float *model_scratch,
                             const float *dout, const float *qkv, const float *att, int B, int T,
                             int C, int NH)
{
    (void)model_scratch;
    if (att == NULL) {
        noatt_bwd(be, dqkv, dout, qkv, B, T, C, NH);
        return;
    }
    if (use_flash(be, NH > 0 ? C / NH : 0)) {
        flash_bwd(be, dqkv, dout, qkv, att, B, T, C, NH);
        return;
    }
    float *tmp =
        scratch(be, KN_CUDA_ATT_BWD_SCRATCH(T, NH) * sizeof(float), "attention_bwd scratch");
    if (tmp != NULL) {
        note(be, "attention_bwd",
             kn_cuda_attention_bwd(S(be)->ctx, dqkv, tmp, dout, qkv, att, B, T, C, NH,
                                   S(be)->stream));
    }
}

static void cu_gelu_fwd(const eng_backend_t *be, float *out, const float *inp, size_t n)
{
    note(be, "gelu_fwd", kn_cuda_gelu_fwd(out, inp, n, S(be)->stream));
}

static void cu_gelu_bwd(const eng_backend_t *be, float *dinp, const float *inp, const float *dout,
                        size_t n)
{
    note(be, "gelu_bwd", kn_cuda_gelu_bwd(dinp, inp, dout, n, S(be)->stream));
}

static void cu_residual_fwd(const eng_backend_t *be, float *out, const float *a, const float *b,
                            size_t n)
{
    note(be, "residual_fwd", kn_cuda_residual_fwd(out, a, b, n, S(be)->stream));
}

static void cu_lmhead_fwd(const eng_backend_t *be, float *logits, float *lse, float *losses,
                          const float *x, const float *wte, const int32_t *targets, int N, int C,
                          int V, int Vp)
{
    note(be, "lmhead_fwd",
         kn_cuda_lmhead_fwd(S(be)->ctx, logits, lse, losses, x, wte, targets, N, C, V, Vp,
                            S(be)->stream));
}

static void cu_lmhead_bwd(const eng_backend_t *be, float *dx, float *dwte, float *logits,
                          const float *lse, const float *x, const float *wte,
                          const int32_t *targets, float scale, int N, int C, int V, int Vp)
{
    note(be, "lmhead_bwd",
         kn_cuda_lmhead_bwd(S(be)->ctx, dx, dwte, logits, lse, x, wte, targets, scale, N, C, V, Vp,
                            S(be)->stream));
}

/* the unscaled fused head at scale 1; dwte overwritten (acc 0) by the GEMM's beta = 0 */
static void cu_lmhead_fwdbwd(const eng_backend_t *be, float *dx, float *dwte, float *logits,
                             float *lse, float *losses, const float *x, const float *wte,
                             const int32_t *targets, int acc, int N, int C, int V, int Vp)
{
    note(be, "lmhead_fwdbwd",
         kn_cuda_lmhead_fwdbwd(S(be)->ctx, dx, dwte, logits, lse, losses, x, wte, targets, acc, N,
                               C, V, Vp, S(be)->stream));
}

static void cu_axpy(const eng_backend_t *be, float *y, const float *x, size_t n, float a)
{
    note(be, "axpy", kn_cuda_axpy(y, x, n, a, S(be)->stream));
}

static void cu_bf16_round(const eng_backend_t *be, float *dst, const float *src, size_t n)
{
    note(be, "bf16_round", kn_cuda_bf16_round(dst, src, n, S(be)->stream));
}

static void cu_bf16_weights(const eng_backend_t *be, const float *base, const void *w16, size_t n)
{
    kn_cuda_set_weights16(S(be)->ctx, base, w16, n);
}

static void cu_bf16_cast(const eng_backend_t *be, void *dst, const void *src, size_t n, int to_bf16)
{
    note(be, "bf16_cast",
         to_bf16 ? kn_cuda_bf16_pack(dst, src, n, S(be)->stream)
                 : kn_cuda_bf16_unpack(dst, src, n, S(be)->stream));
}

static void cu_adamw(const eng_backend_t *be, float *p, const float *g, float *m, float *v,
                     size_t n, double lr, double beta1, double beta2, double eps, double wd,
                     uint64_t t)
{
    note(be, "adamw", kn_cuda_adamw(p, g, m, v, n, lr, beta1, beta2, eps, wd, t, S(be)->stream));
}

static void cu_adamw_fused(const eng_backend_t *be, float *p, float *g, float *m, float *v,
                           size_t n, double lr, double beta1, double beta2, double eps, double wd,
                           uint64_t t, float gscale, int zero_g)
{
    note(be, "adamw_fused",
         kn_cuda_adamw_fused(p, g, m, v, n, lr, beta1, beta2, eps, wd, t, gscale, zero_g,
                             S(be)->stream));
}

/* The one entry whose result is host memory: the two reduction kernels, then the double
 * copied back (which waits for the stream). A failure, or one still pending, gives 0, not a
 * NaN that would poison the clip coefficient; it is noted for the next copy, memset or
 * sync to return. */
static double cu_sumsq(const eng_backend_t *be, const float *x, size_t n)
{
    cuda_state_t *s = S(be);
    if (s->err != 0) {
        return 0.0;
    }
    double out = 0.0;
    int rc = kn_cuda_sumsq(s->sumsq_dev, s->sumsq_dev + 1, x, n, 0, s->stream);
    if (rc == 0) {
        rc = cu_err(
            cudaMemcpyAsync(&out, s->sumsq_dev, sizeof out, cudaMemcpyDeviceToHost, s->stream));
    }
    if (rc == 0) {
        rc = cu_err(cudaStreamSynchronize(s->stream));
    }
    note(be, "sumsq", rc);
    return rc == 0 ? out : 0.0;
}

/* sumsq's kernels into out, enqueued (its partials in the shared scratch: stream order
 * keeps two calls apart). */
static void cu_sumsq_to(const eng_backend_t *be, double *out, const float *x, size_t n)
{
    cuda_state_t *s = S(be);
    note(be, "sumsq_to", kn_cuda_sumsq(out, s->sumsq_dev + 1, x, n, 0, s->stream));
}

static void cu_loss_acc(const eng_backend_t *be, double *acc, const float *losses, size_t n)
{
    note(be, "loss_acc", kn_cuda_loss_acc(acc, losses, n, S(be)->stream));
}

static void cu_scale(const eng_backend_t *be, float *x, size_t n, float c)
{
    note(be, "scale", kn_cuda_scale(x, c, n, S(be)->stream));
}

static void cu_tp_embed_fwd(const eng_backend_t *be, float *out, const int32_t *inp,
                            const float *wte, const float *wpe, int v0, int Vl, int B, int T, int C)
{
    note(be, "tp_embed_fwd",
         kn_cuda_tp_embed_fwd(out, inp, wte, wpe, v0, Vl, B, T, C, S(be)->stream));
}

static void cu_tp_embed_bwd(const eng_backend_t *be, float *dwte, float *dwpe, const float *dout,
                            const int32_t *inp, int v0, int Vl, int B, int T, int C)
{
    void *tmp = scratch(be, kn_cuda_encoder_bwd_scratch_bytes(B, T), "tp_embed_bwd scratch");
    if (tmp != NULL) {
        note(be, "tp_embed_bwd",
             kn_cuda_tp_embed_bwd(dwte, dwpe, tmp, dout, inp, v0, Vl, B, T, C, S(be)->stream));
    }
}

static void cu_tp_xent_max(const eng_backend_t *be, float *mx, const float *logits, int N, int Vl,
                           int valid)
{
    note(be, "tp_xent_max", kn_cuda_tp_xent_max(mx, logits, N, Vl, valid, S(be)->stream));
}

static void cu_tp_xent_sums(const eng_backend_t *be, float *sum, float *tl, const float *logits,
                            const float *mx, const int32_t *targets, int v0, int N, int Vl,
                            int valid)
{
    note(be, "tp_xent_sums",
         kn_cuda_tp_xent_sums(sum, tl, logits, mx, targets, v0, N, Vl, valid, S(be)->stream));
}

static void cu_tp_xent_finish(const eng_backend_t *be, float *lse, float *losses, const float *mx,
                              const float *sum, const float *tl, int N)
{
    note(be, "tp_xent_finish", kn_cuda_tp_xent_finish(lse, losses, mx, sum, tl, N, S(be)->stream));
}

static void cu_tp_xent_bwd(const eng_backend_t *be, float *logits, const float *lse,
                           const int32_t *targets, float scale, int v0, int N, int Vl, int valid)
{
    note(be, "tp_xent_bwd",
         kn_cuda_tp_xent_bwd(logits, lse, targets, scale, v0, N, Vl, valid, S(be)->stream));
}

/* the table's sync and eng_backend_cuda_sync: the kept failure, else the stream's */
static int cu_sync(const eng_backend_t *be)
{
    int rc = pending(be);
    if (rc == 0) {
        rc = cu_err(cudaStreamSynchronize(S(be)->stream));
    }
    return rc;
}

/* An event recorded on the stream: the interval between two is the device's time
 * (cudaEventElapsedTime), read once per step after its sync. */
static void cu_timer_mark(const eng_backend_t *be, int kind, int begin)
{
    struct cu_timer *t = &S(be)->timer[kind];
    if (t->n >= 2 * CU_TIMER_PAIRS || (t->n % 2 == 0) != (begin != 0)) {
        return; /* full, or a mark out of turn: nothing to pair it with */
    }
    int rc = t->ev[t->n] ? 0 : cu_err(cudaEventCreate(&t->ev[t->n]));
    if (rc == 0) {
        rc = cu_err(cudaEventRecord(t->ev[t->n], S(be)->stream));
    }
    if (rc == 0) {
        t->n++;
    }
    note(be, "timer", rc);
}

static void cu_timer_read(const eng_backend_t *be, double *ms)
{
    for (int k = 0; k < ENG_TIMER_KINDS; k++) {
        struct cu_timer *t = &S(be)->timer[k];
        double sum = 0;
        for (int i = 0; i + 1 < t->n; i += 2) {
            float e = 0;
            if (cudaEventElapsedTime(&e, t->ev[i], t->ev[i + 1]) == cudaSuccess) {
                sum += e;
            } else {
                (void)cudaGetLastError(); /* ignored here: not the next launch's failure */
            }
        }
        ms[k] = sum;
        t->n = 0;
    }
}

static const eng_backend_t cuda_table = {
    .name = "cuda",
    .host_memory = 0,
    .alloc = cu_alloc,
    .free = cu_free,
    .copy = cu_copy,
    .memset = cu_memset,
    .encoder_fwd = cu_encoder_fwd,
    .encoder_bwd = cu_encoder_bwd,
    .layernorm_fwd = cu_layernorm_fwd,
    .layernorm_bwd = cu_layernorm_bwd,
    .matmul_fwd = cu_matmul_fwd,
    .matmul_bwd = cu_matmul_bwd,
    .attention_fwd = cu_attention_fwd,
    .attention_bwd = cu_attention_bwd,
    .gelu_fwd = cu_gelu_fwd,
    .gelu_bwd = cu_gelu_bwd,
    .residual_fwd = cu_residual_fwd,
    .lmhead_fwd = cu_lmhead_fwd,
    .lmhead_bwd = cu_lmhead_bwd,
    .lmhead_fwdbwd = cu_lmhead_fwdbwd,
    .axpy = cu_axpy,
    .adamw = cu_adamw,
    .adamw_fused = cu_adamw_fused,
    .sumsq = cu_sumsq,
    .sumsq_to = cu_sumsq_to,
    .loss_acc = cu_loss_acc,
    .scale = cu_scale,
    .sync = cu_sync,
    .timer_mark = cu_timer_mark,
    .timer_read = cu_timer_read,
    .tp_embed_fwd = cu_tp_embed_fwd,
    .tp_embed_bwd = cu_tp_embed_bwd,
    .tp_xent_max = cu_tp_xent_max,
    .tp_xent_sums = cu_tp_xent_sums,
    .tp_xent_finish = cu_tp_xent_finish,
    .tp_xent_bwd = cu_tp_xent_bwd,
    .att_row = cu_att_row,
    .bf16_round = cu_bf16_round,
    .bf16_cast = cu_bf16_cast,
    .bf16_weights = cu_bf16_weights,
};

// ----------------------------------------------------------------------------
// create / destroy

static int cu_devices(int *count)
{
    *count = 0;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        cudaGetLastError(); /* no driver or no device: not sticky */
        return e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver ? 0 : CH_E_CUDA;
    }
    *count = n;
    return 0;
}

static void cu_destroy(eng_backend_t *be);

static int cu_create(int device, eng_cuda_log_fn logfn, eng_backend_t **out)
{
    *out = NULL;
    int n = 0, rc = cu_devices(&n);
    if (rc < 0) {
        return rc;
    }
    if (device < 0 || device >= n) {
        return -ENODEV;
    }
    cuda_state_t *s = calloc(1, sizeof *s);
    if (s == NULL) {
        return -ENOMEM;
    }
    s->table = cuda_table;
    s->table.ud = s;
    s->device = device;
    const char *att = getenv("CHORUS_CUDA_ATTENTION");
    s->flash = att == NULL || strcmp(att, "materialised") != 0;
    s->log = logfn;
    /* the context and the stream belong to the device current when they are made */
    CH_CHECK_GOTO(cu_err(cudaSetDevice(device)), rc, fail);
    CH_CHECK_GOTO(cu_err(cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking)), rc, fail);
    CH_CHECK_GOTO(kn_cuda_create(&s->ctx, 0), rc, fail);
    CH_CHECK_GOTO(cu_err(cudaMalloc((void **)&s->sumsq_dev,
                                    (1 + KN_CUDA_SUMSQ_PARTIALS) * sizeof *s->sumsq_dev)),
                  rc, fail);
    *out = &s->table;
    return 0;
fail:
    snprintf(s->errtext, sizeof s->errtext, "device %d: backend setup: %s", device,
             kn_cuda_error_text());
    logfn(s->errtext);
    cu_destroy(&s->table);
    return rc;
}

static void cu_destroy(eng_backend_t *be)
{
    if (be == NULL) {
        return;
    }
    cuda_state_t *s = S(be);
    if (s->stream != NULL) {
        cudaStreamSynchronize(s->stream);
    }
    kn_cuda_destroy(s->ctx);
    cudaFree(s->sumsq_dev);
    cudaFree(s->scratch);
    if (s->stream != NULL) {
        cudaStreamDestroy(s->stream);
    }
    for (int k = 0; k < ENG_TIMER_KINDS; k++) {
        for (int i = 0; i < 2 * CU_TIMER_PAIRS && s->timer[k].ev[i] != NULL; i++) {
            cudaEventDestroy(s->timer[k].ev[i]);
        }
    }
    free(s->flash_out);
    free(s);
}

static void cu_set_tf32(eng_backend_t *be, int on)
{
    kn_cuda_set_tf32(S(be)->ctx, on);
}

static void cu_set_bf16(eng_backend_t *be, int on)
{
    kn_cuda_set_bf16(S(be)->ctx, on);
    S(be)->bf16 = on != 0;
}

static void *cu_stream(const eng_backend_t *be)
{
    return S(be)->stream;
}

static size_t max_size(size_t a, size_t b)
{
    return a > b ? a : b;
}

/* The largest scratch any launcher asks for at this shape, allocated now. */
static int cu_reserve(eng_backend_t *be, int B, int T, int C, int NH)
{
    if (B <= 0 || T <= 0 || C <= 0 || NH <= 0) {
        return -EINVAL;
    }
    /* the attention backward's: the fused one's, or the materialised one's NH*T*T; or,
     * larger, what attention without att needs (selective recomputation) */
    size_t att = use_flash(be, C / NH) ? KN_CUDA_FLASH_BWD_SCRATCH(B, T, NH)
                                       : KN_CUDA_ATT_BWD_SCRATCH(T, NH);
    att = max_size(att, noatt_scratch(be, B, T, C, NH));
    size_t bytes = max_size(kn_cuda_encoder_bwd_scratch_bytes(B, T),
                            max_size(KN_CUDA_LN_BWD_SCRATCH(C), att) * sizeof(float));
    if (scratch(be, bytes, "reserved scratch") == NULL) {
        return -ENOMEM;
    }
    int rc = kn_cuda_reserve_rows(S(be)->ctx, (size_t)B * (size_t)T, S(be)->stream);
    if (rc == 0) {
        rc = kn_cuda_reserve_bf16(S(be)->ctx, (size_t)B * (size_t)T, (size_t)C, S(be)->stream);
    }
    return rc;
}

/* The module's one export (backend_cuda.h). */
__attribute__((visibility("default"))) const eng_cuda_module_t eng_cuda_module = {
    .abi = ENG_CUDA_MODULE_ABI,
    .devices = cu_devices,
    .create = cu_create,
    .destroy = cu_destroy,
    .set_tf32 = cu_set_tf32,
    .set_bf16 = cu_set_bf16,
    .stream = cu_stream,
    .sync = cu_sync,
    .reserve = cu_reserve,
};
