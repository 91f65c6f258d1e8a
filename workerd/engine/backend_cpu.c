/* The CPU backend (backend.h): host memory and the fast kernels of kernels/cpu. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/adamw.h"
#include "kernels/attention.h"
#include "kernels/bf16.h"
#include "kernels/encoder.h"
#include "kernels/gelu.h"
#include "kernels/layernorm.h"
#include "kernels/matmul.h"
#include "kernels/pool.h"
#include "kernels/residual.h"
#include "kernels/tp.h"
#include "kernels/xent.h"
#include "workerd/engine/backend.h"

// ----------------------------------------------------------------------------
// memory

static int cpu_alloc(const eng_backend_t *be, size_t bytes, void **out)
{
    (void)be;
    *out = NULL;
    return posix_memalign(out, 64, bytes ? bytes : 1) == 0 ? 0 : -ENOMEM;
}

static void cpu_free(const eng_backend_t *be, void *p)
{
    (void)be;
    free(p);
}

static int cpu_copy(const eng_backend_t *be, void *dst, const void *src, size_t bytes,
                    eng_copy_dir_t dir)
{
    (void)be, (void)dir;
    memcpy(dst, src, bytes);
    return 0;
}

static int cpu_memset(const eng_backend_t *be, void *p, int value, size_t bytes)
{
    (void)be;
    kn_memset(p, value, bytes);
    return 0;
}

// ----------------------------------------------------------------------------
// kernels: the table's argument first, then kn_*'s

static void cpu_encoder_fwd(const eng_backend_t *be, float *out, const int32_t *inp,
                            const float *wte, const float *wpe, int B, int T, int C)
{
    (void)be;
    kn_encoder_fwd(out, inp, wte, wpe, B, T, C);
}

static void cpu_encoder_bwd(const eng_backend_t *be, float *dwte, float *dwpe, const float *dout,
                            const int32_t *inp, int B, int T, int C)
{
    (void)be;
    kn_encoder_bwd(dwte, dwpe, dout, inp, B, T, C);
}

static void cpu_layernorm_fwd(const eng_backend_t *be, float *out, float *mean, float *rstd,
                              const float *inp, const float *weight, const float *bias, int N,
                              int C)
{
    (void)be;
    kn_layernorm_fwd(out, mean, rstd, inp, weight, bias, N, C);
}

static void cpu_layernorm_bwd(const eng_backend_t *be, float *dinp, float *dweight, float *dbias,
                              const float *dout, const float *inp, const float *weight,
                              const float *mean, const float *rstd, int N, int C)
{
    (void)be;
    kn_layernorm_bwd(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
}

static void cpu_matmul_fwd(const eng_backend_t *be, float *out, const float *inp,
                           const float *weight, const float *bias, int N, int C, int OC)
{
    (void)be;
    kn_matmul_fwd(out, inp, weight, bias, N, C, OC);
}

static void cpu_matmul_bwd(const eng_backend_t *be, float *dinp, float *dweight, float *dbias,
                           const float *dout, const float *inp, const float *weight, int N, int C,
                           int OC)
{
    (void)be;
    kn_matmul_bwd(dinp, dweight, dbias, dout, inp, weight, N, C, OC);
}

static void cpu_attention_fwd(const eng_backend_t *be, float *out, float *att, float *scratch,
                              const float *qkv, int B, int T, int C, int NH)
{
    (void)be;
    kn_attention_fwd(out, att, scratch, qkv, B, T, C, NH);
}

static void cpu_attention_bwd(const eng_backend_t *be, float *dqkv, float *scratch,
                              const float *dout, const float *qkv, const float *att, int B, int T,
                              int C, int NH)
{
    (void)be;
    kn_attention_bwd(dqkv, scratch, dout, qkv, att, B, T, C, NH);
}

static void cpu_gelu_fwd(const eng_backend_t *be, float *out, const float *inp, size_t n)
{
    (void)be;
    kn_gelu_fwd(out, inp, n);
}

static void cpu_gelu_bwd(const eng_backend_t *be, float *dinp, const float *inp, const float *dout,
                         size_t n)
{
    (void)be;
    kn_gelu_bwd(dinp, inp, dout, n);
}

static void cpu_residual_fwd(const eng_backend_t *be, float *out, const float *a, const float *b,
                             size_t n)
{
    (void)be;
    kn_residual_fwd(out, a, b, n);
}

static void cpu_lmhead_fwd(const eng_backend_t *be, float *logits, float *lse, float *losses,
                           const float *x, const float *wte, const int32_t *targets, int N, int C,
                           int V, int Vp)
{
    (void)be;
    kn_lmhead_fwd(logits, lse, losses, x, wte, targets, N, C, V, Vp);
}

static void cpu_lmhead_bwd(const eng_backend_t *be, float *dx, float *dwte, float *logits,
                           const float *lse, const float *x, const float *wte,
                           const int32_t *targets, float scale, int N, int C, int V, int Vp)
{
    (void)be;
    kn_lmhead_bwd(dx, dwte, logits, lse, x, wte, targets, scale, N, C, V, Vp);
}

static void cpu_adamw(const eng_backend_t *be, float *p, const float *g, float *m, float *v,
                      size_t n, double lr, double beta1, double beta2, double eps, double wd,
                      uint64_t t)
{
    (void)be;
    kn_adamw(p, g, m, v, n, lr, beta1, beta2, eps, wd, t);
}

static void cpu_lmhead_fwdbwd(const eng_backend_t *be, float *dx, float *dwte, float *logits,
                              float *lse, float *losses, const float *x, const float *wte,
                              const int32_t *targets, int acc, int N, int C, int V, int Vp)
{
    (void)be;
    kn_lmhead_fwdbwd(dx, dwte, logits, lse, losses, x, wte, targets, acc, N, C, V, Vp);
}

static void cpu_axpy(const eng_backend_t *be, float *y, const float *x, size_t n, float a)
{
    (void)be;
    kn_axpy(y, x, n, a);
}

static void cpu_adamw_fused(const eng_backend_t *be, float *p, float *g, float *m, float *v,
                            size_t n, double lr, double beta1, double beta2, double eps, double wd,
                            uint64_t t, float gscale, int zero_g)
{
    (void)be;
    kn_adamw_fused(p, g, m, v, n, lr, beta1, beta2, eps, wd, t, gscale, zero_g);
}

static double cpu_sumsq(const eng_backend_t *be, const float *x, size_t n)
{
    (void)be;
    return kn_sumsq(x, n);
}

static void cpu_loss_acc(const eng_backend_t *be, double *acc, const float *losses, size_t n)
{
    (void)be;
    *acc += kn_loss_mean(losses, n);
}

static void cpu_sumsq_to(const eng_backend_t *be, double *out, const float *x, size_t n)
{
    (void)be;
    *out = kn_sumsq(x, n);
}

static void cpu_scale(const eng_backend_t *be, float *x, size_t n, float c)
{
    (void)be;
    kn_scale(x, n, c);
}

static void cpu_tp_embed_fwd(const eng_backend_t *be, float *out, const int32_t *inp,
                             const float *wte, const float *wpe, int v0, int Vl, int B, int T,
                             int C)
{
    (void)be;
    kn_tp_embed_fwd(out, inp, wte, wpe, v0, Vl, B, T, C);
}

static void cpu_tp_embed_bwd(const eng_backend_t *be, float *dwte, float *dwpe, const float *dout,
                             const int32_t *inp, int v0, int Vl, int B, int T, int C)
{
    (void)be;
    kn_tp_embed_bwd(dwte, dwpe, dout, inp, v0, Vl, B, T, C);
}

static void cpu_tp_xent_max(const eng_backend_t *be, float *mx, const float *logits, int N, int Vl,
                            int valid)
{
    (void)be;
    kn_tp_xent_max(mx, logits, N, Vl, valid);
}

static void cpu_tp_xent_sums(const eng_backend_t *be, float *sum, float *tl, const float *logits,
                             const float *mx, const int32_t *targets, int v0, int N, int Vl,
                             int valid)
{
    (void)be;
    kn_tp_xent_sums(sum, tl, logits, mx, targets, v0, N, Vl, valid);
}

static void cpu_tp_xent_finish(const eng_backend_t *be, float *lse, float *losses, const float *mx,
                               const float *sum, const float *tl, int N)
{
    (void)be;
    kn_tp_xent_finish(lse, losses, mx, sum, tl, N);
}

static void cpu_tp_xent_bwd(const eng_backend_t *be, float *logits, const float *lse,
                            const int32_t *targets, float scale, int v0, int N, int Vl, int valid)
{
    (void)be;
    kn_tp_xent_bwd(logits, lse, targets, scale, v0, N, Vl, valid);
}

static void cpu_bf16_cast(const eng_backend_t *be, void *dst, const void *src, size_t n,
                          int to_bf16)
{
    (void)be;
    if (to_bf16)
        kn_bf16_pack(dst, src, n);
    else
        kn_bf16_unpack(dst, src, n);
}

static const eng_backend_t cpu_backend = {
    .name = "cpu",
    .host_memory = 1,
    .ud = NULL,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .copy = cpu_copy,
    .memset = cpu_memset,
    .encoder_fwd = cpu_encoder_fwd,
    .encoder_bwd = cpu_encoder_bwd,
    .layernorm_fwd = cpu_layernorm_fwd,
    .layernorm_bwd = cpu_layernorm_bwd,
    .matmul_fwd = cpu_matmul_fwd,
    .matmul_bwd = cpu_matmul_bwd,
    .attention_fwd = cpu_attention_fwd,
    .attention_bwd = cpu_attention_bwd,
    .gelu_fwd = cpu_gelu_fwd,
    .gelu_bwd = cpu_gelu_bwd,
    .residual_fwd = cpu_residual_fwd,
    .lmhead_fwd = cpu_lmhead_fwd,
    .lmhead_bwd = cpu_lmhead_bwd,
    .lmhead_fwdbwd = cpu_lmhead_fwdbwd,
    .axpy = cpu_axpy,
    .adamw = cpu_adamw,
    .adamw_fused = cpu_adamw_fused,
    .sumsq = cpu_sumsq,
    .sumsq_to = cpu_sumsq_to,
    .loss_acc = cpu_loss_acc,
    .scale = cpu_scale,
    .tp_embed_fwd = cpu_tp_embed_fwd,
    .tp_embed_bwd = cpu_tp_embed_bwd,
    .tp_xent_max = cpu_tp_xent_max,
    .tp_xent_sums = cpu_tp_xent_sums,
    .tp_xent_finish = cpu_tp_xent_finish,
    .tp_xent_bwd = cpu_tp_xent_bwd,
    .bf16_cast = cpu_bf16_cast,
};

const eng_backend_t *eng_backend_cpu(void)
{
    return &cpu_backend;
}
