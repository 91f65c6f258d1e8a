/* The bf16 emulation backend (backend_bf16.h): the inner backend's kernels on bf16-rounded
 * inputs, their stored outputs rounded to bf16. */
#include "workerd/engine/backend_bf16.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/bf16.h"

/* Const inputs a kernel rounds at once: at most three (matmul_bwd: dout, inp, weight). */
enum { SLOTS = 4 };

typedef struct bf16_state {
    const eng_backend_t *inner;
    float *slot[SLOTS]; /* inner memory: rounded copies of a kernel's const inputs */
    size_t cap[SLOTS];  /* floats */
    float *host;        /* staging for rounding inner memory that is not the host's */
    size_t host_cap;    /* floats */
    int32_t *tok;       /* the encoder's tokens on the host */
    size_t tok_cap;
    int err; /* the first scratch or staging failure, returned by the next copy */
    /* the parameters' working copy (bf16_weights): w16[0..wn) is base[0..wn) in bf16 */
    const float *wbase;
    const kn_bf16_t *w16;
    size_t wn;
    eng_bf16_counts_t counts;
    char name[48];
} bf16_state_t;

#define S(be)  ((bf16_state_t *)(be)->ud)
#define IN(be) (S(be)->inner)

static int grow(void **p, size_t *cap, size_t n, size_t elem)
{
    if (n <= *cap)
        return 0;
    void *q = realloc(*p, n * elem);
    if (!q)
        return -ENOMEM;
    *p = q;
    *cap = n;
    return 0;
}

static void fail(bf16_state_t *s, int rc)
{
    if (s->err == 0 && rc < 0)
        s->err = rc;
}

/* dst[0..n) = bf16 of src[0..n), both inner memory (they may be the same) */
static void round_to(bf16_state_t *s, float *dst, const float *src, size_t n)
{
    const eng_backend_t *in = s->inner;
    if (in->bf16_round) { /* on the device (the GPU's cast kernel) */
        in->bf16_round(in, dst, src, n);
        return;
    }
    if (in->host_memory) {
        for (size_t i = 0; i < n; i++)
            dst[i] = kn_bf16_round1(src[i]);
        return;
    }
    int rc = grow((void **)&s->host, &s->host_cap, n, sizeof(float));
    if (rc == 0)
        rc = in->copy(in, s->host, src, n * sizeof(float), ENG_COPY_D2H);
    if (rc == 0) {
        kn_bf16_round(s->host, n);
        rc = in->copy(in, dst, s->host, n * sizeof(float), ENG_COPY_H2D);
    }
    fail(s, rc);
}

static void b_bf16_round(const eng_backend_t *be, float *dst, const float *src, size_t n)
{
    if (n > 0)
        round_to(S(be), dst, src, n);
}

/* x[0..n) of inner memory rounded in place: a tensor's bf16 store */
static void store(const eng_backend_t *be, float *x, size_t n)
{
    if (x != NULL && n > 0)
        round_to(S(be), x, x, n);
}

/* A bf16 copy of the const input src[0..n) in scratch slot k (src itself, unrounded, when
 * the slot cannot grow: reported by the next copy); NULL for NULL. */
/* Scratch slot k grown to n floats; NULL when it cannot grow (reported by the next copy). */
static float *slot(bf16_state_t *s, int k, size_t n)
{
    if (n > s->cap[k]) {
        void *p = NULL;
        int rc = s->inner->alloc(s->inner, n * sizeof(float), &p);
        if (rc < 0) {
            fail(s, rc);
            return NULL;
        }
        s->inner->free(s->inner, s->slot[k]);
        s->slot[k] = p;
        s->cap[k] = n;
    }
    return s->slot[k];
}

static const float *in_bf16(const eng_backend_t *be, int k, const float *src, size_t n)
{
    bf16_state_t *s = S(be);
    float *dst = src != NULL && n > 0 ? slot(s, k, n) : NULL;
    if (dst == NULL)
        return src;
    round_to(s, dst, src, n);
    return dst;
}

/* 1 when src[0..n) lies inside the working copy's base range */
static int in_copy(const bf16_state_t *s, const float *src, size_t n)
{
    uintptr_t p = (uintptr_t)src, b = (uintptr_t)s->wbase;
    return s->wn > 0 && p >= b && (p - b) / sizeof(float) + n <= s->wn;
}

/* A parameter operand src[0..n) as a kernel reads it: from the working copy when it lies in
 * one (gemm: an operand the inner's bf16 GEMM reads, handed on as it is when the inner reads
 * the copy itself; else widened from the copy into scratch slot k), else rounded from the
 * master values like any input (in_bf16). */
static const float *in_param(const eng_backend_t *be, int k, const float *src, size_t n, int gemm)
{
    bf16_state_t *s = S(be);
    const eng_backend_t *in = s->inner;
    if (src == NULL || n == 0)
        return src;
    if (!in_copy(s, src, n) || (!in->bf16_cast && !in->host_memory)) {
        s->counts.params_rounded += n;
        return in_bf16(be, k, src, n);
    }
    if (gemm && in->bf16_weights) {
        s->counts.params_from_copy += n;
        return src;
    }
    float *dst = slot(s, k, n);
    if (dst == NULL)
        return src;
    const kn_bf16_t *w = s->w16 + (src - s->wbase);
    if (in->bf16_cast)
        in->bf16_cast(in, dst, w, n, 0);
    else
        kn_bf16_unpack(dst, w, n);
    s->counts.params_from_copy += n;
    return dst;
}

// ----------------------------------------------------------------------------
// memory: the inner's, the copy reporting a pending failure first

static int b_alloc(const eng_backend_t *be, size_t bytes, void **out)
{
    return IN(be)->alloc(IN(be), bytes, out);
}

static void b_free(const eng_backend_t *be, void *p)
{
    IN(be)->free(IN(be), p);
}

static int b_copy(const eng_backend_t *be, void *dst, const void *src, size_t bytes,
                  eng_copy_dir_t dir)
{
    int rc = S(be)->err;
    S(be)->err = 0;
    return rc < 0 ? rc : IN(be)->copy(IN(be), dst, src, bytes, dir);
}

static int b_memset(const eng_backend_t *be, void *p, int value, size_t bytes)
{
    return IN(be)->memset(IN(be), p, value, bytes);
}

// ----------------------------------------------------------------------------
// kernels

/* Rows of wte the tokens inp[0..n) read: the largest token + 1 (tokens on the host). */
static size_t token_rows(const eng_backend_t *be, const int32_t *inp, size_t n)
{
    bf16_state_t *s = S(be);
    const int32_t *t = inp;
    if (!s->inner->host_memory) {
        int rc = grow((void **)&s->tok, &s->tok_cap, n, sizeof *s->tok);
        if (rc == 0)
            rc = s->inner->copy(s->inner, s->tok, inp, n * sizeof *inp, ENG_COPY_D2H);
        if (rc < 0) {
            fail(s, rc);
            return 0;
        }
        t = s->tok;
    }
    int32_t mx = -1;
    for (size_t i = 0; i < n; i++)
        mx = t[i] > mx ? t[i] : mx;
    return (size_t)mx + 1;
}

static void b_encoder_fwd(const eng_backend_t *be, float *out, const int32_t *inp, const float *wte,
                          const float *wpe, int B, int T, int C)
{
    size_t rows = token_rows(be, inp, (size_t)B * T);
    const float *w = in_param(be, 0, wte, rows * C, 0), *p = in_param(be, 1, wpe, (size_t)T * C, 0);
    IN(be)->encoder_fwd(IN(be), out, inp, w, p, B, T, C);
    store(be, out, (size_t)B * T * C);
}

static void b_encoder_bwd(const eng_backend_t *be, float *dwte, float *dwpe, const float *dout,
                          const int32_t *inp, int B, int T, int C)
{
    const float *d = in_bf16(be, 0, dout, (size_t)B * T * C);
    IN(be)->encoder_bwd(IN(be), dwte, dwpe, d, inp, B, T, C);
}

static void b_layernorm_fwd(const eng_backend_t *be, float *out, float *mean, float *rstd,
                            const float *inp, const float *weight, const float *bias, int N, int C)
{
    const float *x = in_bf16(be, 0, inp, (size_t)N * C), *w = in_param(be, 1, weight, (size_t)C, 0),
                *b = in_param(be, 2, bias, (size_t)C, 0);
    IN(be)->layernorm_fwd(IN(be), out, mean, rstd, x, w, b, N, C); /* stats in fp32 */
    store(be, out, (size_t)N * C);
}

static void b_layernorm_bwd(const eng_backend_t *be, float *dinp, float *dweight, float *dbias,
                            const float *dout, const float *inp, const float *weight,
                            const float *mean, const float *rstd, int N, int C)
{
    /* the weight pass (dinp NULL) reads no weight */
    const float *d = in_bf16(be, 0, dout, (size_t)N * C), *x = in_bf16(be, 1, inp, (size_t)N * C),
                *w = dinp != NULL ? in_param(be, 2, weight, (size_t)C, 0) : weight;
    IN(be)->layernorm_bwd(IN(be), dinp, dweight, dbias, d, x, w, mean, rstd, N, C);
    store(be, dinp, (size_t)N * C); /* accumulated, then stored bf16 */
}

static void b_matmul_fwd(const eng_backend_t *be, float *out, const float *inp, const float *weight,
                         const float *bias, int N, int C, int OC)
{
    const float *x = in_bf16(be, 0, inp, (size_t)N * C),
                *w = in_param(be, 1, weight, (size_t)C * OC, 1),
                *b = in_param(be, 2, bias, (size_t)OC, 0);
    IN(be)->matmul_fwd(IN(be), out, x, w, b, N, C, OC); /* fp32 accumulate */
    store(be, out, (size_t)N * OC);
}

static void b_matmul_bwd(const eng_backend_t *be, float *dinp, float *dweight, float *dbias,
                         const float *dout, const float *inp, const float *weight, int N, int C,
                         int OC)
{
    /* a split backward's half (ZB-H1) reads one of inp and weight: the other is not rounded
     * (backend.h: unread, possibly NULL) */
    const float *d = in_bf16(be, 0, dout, (size_t)N * OC),
                *x = dweight != NULL ? in_bf16(be, 1, inp, (size_t)N * C) : inp,
                *w = dinp != NULL ? in_param(be, 2, weight, (size_t)C * OC, 1) : weight;
    IN(be)->matmul_bwd(IN(be), dinp, dweight, dbias, d, x, w, N, C, OC); /* fp32 grads */
    store(be, dinp, (size_t)N * C);
}

/* att NULL: the backward recomputes from the same rounded qkv (in_bf16 of the kept one),
 * so its probabilities are the forward's bits */
static void b_attention_fwd(const eng_backend_t *be, float *out, float *att, float *scratch,
                            const float *qkv, int B, int T, int C, int NH)
{
    const float *q = in_bf16(be, 0, qkv, (size_t)B * T * 3 * C);
    IN(be)->attention_fwd(IN(be), out, att, scratch, q, B, T, C, NH); /* softmax in fp32 */
    store(be, out, (size_t)B * T * C);
}

static void b_attention_bwd(const eng_backend_t *be, float *dqkv, float *scratch, const float *dout,
                            const float *qkv, const float *att, int B, int T, int C, int NH)
{
    const float *d = in_bf16(be, 0, dout, (size_t)B * T * C),
                *q = in_bf16(be, 1, qkv, (size_t)B * T * 3 * C);
    IN(be)->attention_bwd(IN(be), dqkv, scratch, d, q, att, B, T, C, NH);
    store(be, dqkv, (size_t)B * T * 3 * C);
}

static void b_gelu_fwd(const eng_backend_t *be, float *out, const float *inp, size_t n)
{
    IN(be)->gelu_fwd(IN(be), out, in_bf16(be, 0, inp, n), n);
    store(be, out, n);
}

static void b_gelu_bwd(const eng_backend_t *be, float *dinp, const float *inp, const float *dout,
                       size_t n)
{
    /* dinp may alias dout: its bf16 copy is read, dinp written */
    const float *x = in_bf16(be, 0, inp, n), *d = in_bf16(be, 1, dout, n);
    IN(be)->gelu_bwd(IN(be), dinp, x, d, n);
    store(be, dinp, n);
}

static void b_residual_fwd(const eng_backend_t *be, float *out, const float *a, const float *b,
                           size_t n)
{
    IN(be)->residual_fwd(IN(be), out, in_bf16(be, 0, a, n), in_bf16(be, 1, b, n), n);
    store(be, out, n);
}

/* The LM head: bf16 x and wte into the GEMM, fp32 logits, cross-entropy and dlogits. */
static void b_lmhead_fwd(const eng_backend_t *be, float *logits, float *lse, float *losses,
                         const float *x, const float *wte, const int32_t *targets, int N, int C,
                         int V, int Vp)
{
    const float *xx = in_bf16(be, 0, x, (size_t)N * C),
                *w = in_param(be, 1, wte, (size_t)Vp * C, 0);
    IN(be)->lmhead_fwd(IN(be), logits, lse, losses, xx, w, targets, N, C, V, Vp);
}

static void b_lmhead_bwd(const eng_backend_t *be, float *dx, float *dwte, float *logits,
                         const float *lse, const float *x, const float *wte, const int32_t *targets,
                         float scale, int N, int C, int V, int Vp)
{
    /* a split backward's halves: the input half (dwte NULL) reads no x, the weight half (dx
     * NULL) no wte */
    const float *xx = dwte ? in_bf16(be, 0, x, (size_t)N * C) : NULL,
                *w = dx ? in_param(be, 1, wte, (size_t)Vp * C, 0) : NULL;
    IN(be)->lmhead_bwd(IN(be), dx, dwte, logits, lse, xx, w, targets, scale, N, C, V, Vp);
    if (dx)
        store(be, dx, (size_t)N * C);
}

static void b_lmhead_fwdbwd(const eng_backend_t *be, float *dx, float *dwte, float *logits,
                            float *lse, float *losses, const float *x, const float *wte,
                            const int32_t *targets, int acc, int N, int C, int V, int Vp)
{
    const float *xx = in_bf16(be, 0, x, (size_t)N * C),
                *w = in_param(be, 1, wte, (size_t)Vp * C, 0);
    IN(be)->lmhead_fwdbwd(IN(be), dx, dwte, logits, lse, losses, xx, w, targets, acc, N, C, V, Vp);
    /* dx unscaled here; the caller's scaling makes it a GEMM input again, rounded there */
}

static void b_tp_embed_fwd(const eng_backend_t *be, float *out, const int32_t *inp,
                           const float *wte, const float *wpe, int v0, int Vl, int B, int T, int C)
{
    const float *w = in_param(be, 0, wte, (size_t)Vl * C, 0),
                *p = in_param(be, 1, wpe, (size_t)T * C, 0);
    IN(be)->tp_embed_fwd(IN(be), out, inp, w, p, v0, Vl, B, T, C);
    store(be, out, (size_t)B * T * C);
}

static void b_tp_embed_bwd(const eng_backend_t *be, float *dwte, float *dwpe, const float *dout,
                           const int32_t *inp, int v0, int Vl, int B, int T, int C)
{
    const float *d = in_bf16(be, 0, dout, (size_t)B * T * C);
    IN(be)->tp_embed_bwd(IN(be), dwte, dwpe, d, inp, v0, Vl, B, T, C);
}

// ----------------------------------------------------------------------------
// the fp32 entries: the inner's as they are

static void b_axpy(const eng_backend_t *be, float *y, const float *x, size_t n, float a)
{
    IN(be)->axpy(IN(be), y, x, n, a);
}

static void b_adamw(const eng_backend_t *be, float *p, const float *g, float *m, float *v, size_t n,
                    double lr, double beta1, double beta2, double eps, double wd, uint64_t t)
{
    IN(be)->adamw(IN(be), p, g, m, v, n, lr, beta1, beta2, eps, wd, t);
}

static void b_adamw_fused(const eng_backend_t *be, float *p, float *g, float *m, float *v, size_t n,
                          double lr, double beta1, double beta2, double eps, double wd, uint64_t t,
                          float gscale, int zero_g)
{
    IN(be)->adamw_fused(IN(be), p, g, m, v, n, lr, beta1, beta2, eps, wd, t, gscale, zero_g);
}

static double b_sumsq(const eng_backend_t *be, const float *x, size_t n)
{
    return IN(be)->sumsq(IN(be), x, n);
}

static void b_sumsq_to(const eng_backend_t *be, double *out, const float *x, size_t n)
{
    IN(be)->sumsq_to(IN(be), out, x, n);
}

static void b_loss_acc(const eng_backend_t *be, double *acc, const float *losses, size_t n)
{
    IN(be)->loss_acc(IN(be), acc, losses, n);
}

static void b_scale(const eng_backend_t *be, float *x, size_t n, float c)
{
    IN(be)->scale(IN(be), x, n, c);
}

static int b_sync(const eng_backend_t *be)
{
    int rc = S(be)->err;
    S(be)->err = 0;
    return rc < 0 ? rc : IN(be)->sync(IN(be));
}

static void b_timer_mark(const eng_backend_t *be, int kind, int begin)
{
    IN(be)->timer_mark(IN(be), kind, begin);
}

static void b_timer_read(const eng_backend_t *be, double *ms)
{
    IN(be)->timer_read(IN(be), ms);
}

static void b_tp_xent_max(const eng_backend_t *be, float *mx, const float *logits, int N, int Vl,
                          int valid)
{
    IN(be)->tp_xent_max(IN(be), mx, logits, N, Vl, valid);
}

static void b_tp_xent_sums(const eng_backend_t *be, float *sum, float *tl, const float *logits,
                           const float *mx, const int32_t *targets, int v0, int N, int Vl,
                           int valid)
{
    IN(be)->tp_xent_sums(IN(be), sum, tl, logits, mx, targets, v0, N, Vl, valid);
}

static void b_tp_xent_finish(const eng_backend_t *be, float *lse, float *losses, const float *mx,
                             const float *sum, const float *tl, int N)
{
    IN(be)->tp_xent_finish(IN(be), lse, losses, mx, sum, tl, N);
}

static void b_tp_xent_bwd(const eng_backend_t *be, float *logits, const float *lse,
                          const int32_t *targets, float scale, int v0, int N, int Vl, int valid)
{
    IN(be)->tp_xent_bwd(IN(be), logits, lse, targets, scale, v0, N, Vl, valid);
}

/* what the inner's attention keeps per row: the model sizes its att buffers by it */
static int b_att_row(const eng_backend_t *be, int T, int hs)
{
    return IN(be)->att_row(IN(be), T, hs);
}

static void b_bf16_cast(const eng_backend_t *be, void *dst, const void *src, size_t n, int to_bf16)
{
    IN(be)->bf16_cast(IN(be), dst, src, n, to_bf16);
}

/* the working copy: kept for in_param, and handed to the inner's GEMMs when they read one */
static void b_bf16_weights(const eng_backend_t *be, const float *base, const void *w16, size_t n)
{
    bf16_state_t *s = S(be);
    s->wbase = n ? base : NULL;
    s->w16 = n ? w16 : NULL;
    s->wn = n;
    if (s->inner->bf16_weights)
        s->inner->bf16_weights(s->inner, s->wbase, s->w16, n);
}

// ----------------------------------------------------------------------------

/* The optional entries exist in the wrapper exactly when the inner has them (backend.h's
 * fallbacks then apply to the wrapper as to the inner). */
static void set_optional(eng_backend_t *be, const eng_backend_t *in)
{
    be->lmhead_fwdbwd = in->lmhead_fwdbwd ? b_lmhead_fwdbwd : NULL;
    be->axpy = in->axpy ? b_axpy : NULL;
    be->adamw_fused = in->adamw_fused ? b_adamw_fused : NULL;
    be->sumsq = in->sumsq ? b_sumsq : NULL;
    be->sumsq_to = in->sumsq_to ? b_sumsq_to : NULL;
    be->loss_acc = in->loss_acc ? b_loss_acc : NULL;
    be->scale = in->scale ? b_scale : NULL;
    be->sync = in->sync ? b_sync : NULL;
    int timers = in->timer_mark && in->timer_read;
    be->timer_mark = timers ? b_timer_mark : NULL;
    be->timer_read = timers ? b_timer_read : NULL;
    be->bf16_cast = in->bf16_cast ? b_bf16_cast : NULL;
    be->att_row = in->att_row ? b_att_row : NULL;
    int tp = in->tp_embed_fwd && in->tp_embed_bwd && in->tp_xent_max && in->tp_xent_sums &&
             in->tp_xent_finish && in->tp_xent_bwd;
    be->tp_embed_fwd = tp ? b_tp_embed_fwd : NULL;
    be->tp_embed_bwd = tp ? b_tp_embed_bwd : NULL;
    be->tp_xent_max = tp ? b_tp_xent_max : NULL;
    be->tp_xent_sums = tp ? b_tp_xent_sums : NULL;
    be->tp_xent_finish = tp ? b_tp_xent_finish : NULL;
    be->tp_xent_bwd = tp ? b_tp_xent_bwd : NULL;
}

int eng_backend_bf16_create(const eng_backend_t *inner, eng_backend_t **out)
{
    *out = NULL;
    eng_backend_t *be = calloc(1, sizeof *be);
    bf16_state_t *s = calloc(1, sizeof *s);
    if (!be || !s) {
        free(be);
        free(s);
        return -ENOMEM;
    }
    s->inner = inner;
    snprintf(s->name, sizeof s->name, "%s+bf16", inner->name);
    *be = (eng_backend_t){
        .name = s->name,
        .host_memory = inner->host_memory,
        .ud = s,
        .alloc = b_alloc,
        .free = b_free,
        .copy = b_copy,
        .memset = b_memset,
        .encoder_fwd = b_encoder_fwd,
        .encoder_bwd = b_encoder_bwd,
        .layernorm_fwd = b_layernorm_fwd,
        .layernorm_bwd = b_layernorm_bwd,
        .matmul_fwd = b_matmul_fwd,
        .matmul_bwd = b_matmul_bwd,
        .attention_fwd = b_attention_fwd,
        .attention_bwd = b_attention_bwd,
        .gelu_fwd = b_gelu_fwd,
        .gelu_bwd = b_gelu_bwd,
        .residual_fwd = b_residual_fwd,
        .lmhead_fwd = b_lmhead_fwd,
        .lmhead_bwd = b_lmhead_bwd,
        .adamw = b_adamw,
        .bf16_round = b_bf16_round,
        .bf16_weights = b_bf16_weights,
    };
    set_optional(be, inner);
    *out = be;
    return 0;
}

void eng_backend_bf16_destroy(eng_backend_t *be)
{
    if (!be)
        return;
    bf16_state_t *s = S(be);
    for (int k = 0; k < SLOTS; k++)
        s->inner->free(s->inner, s->slot[k]);
    free(s->host);
    free(s->tok);
    free(s);
    free(be);
}

void eng_backend_bf16_round(const eng_backend_t *be, float *x, size_t n)
{
    store(be, x, n);
}

void eng_backend_bf16_counts(const eng_backend_t *be, eng_bf16_counts_t *out)
{
    *out = S(be)->counts;
}
