/* The paced device (paced.h). */
#include "paced.h"

#include <errno.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <time.h>

#include "common/util.h"

typedef struct paced {
    const eng_backend_t *inner;
    double ns_per_flop, ns_per_byte;
    int depth;                     /* timed intervals open (PASS and OPTIM may nest) */
    uint64_t start, owed;          /* the outermost open interval's start and charges */
    uint64_t at[ENG_TIMER_KINDS];  /* each kind's open interval's start */
    uint64_t sum[ENG_TIMER_KINDS]; /* its closed intervals since the last read, ns */
    int slack;                     /* this thread's timer slack set to 1 ns */
    paced_stats_t st;
    eng_backend_t be;
} paced_t;

#define S(be)  ((paced_t *)(be)->ud)
#define IN(be) (S(be)->inner)

/* Sleep until the monotonic clock reads `deadline` (ns); the time it then reads. */
static uint64_t sleep_until(paced_t *s, uint64_t deadline)
{
    uint64_t now = ch_now_ns();
    s->st.intervals++;
    if (now >= deadline) {
        s->st.late += now > deadline;
        s->st.late_ns += now - deadline;
        return now;
    }
    if (!s->slack) { /* the default 50 us would be a pass's error several times over */
        prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
        s->slack = 1;
    }
    struct timespec ts = {.tv_sec = (time_t)(deadline / 1000000000u),
                          .tv_nsec = (long)(deadline % 1000000000u)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
    }
    return ch_now_ns();
}

/* A kernel that started at t0 has returned: charge it, and pace it now when it is not inside
 * a timed interval. */
static void charge(paced_t *s, uint64_t t0, double flops, double bytes)
{
    uint64_t now = ch_now_ns();
    double f = flops * s->ns_per_flop, b = bytes * s->ns_per_byte;
    uint64_t ns = (uint64_t)(f > b ? f : b);
    s->st.busy_ns += now - t0;
    s->st.paced_ns += ns;
    s->st.flops += flops;
    if (s->depth > 0)
        s->owed += ns;
    else
        sleep_until(s, t0 + ns);
}

/* Run `call` on the inner backend and charge it. */
#define RUN(be, flops, bytes, call)                                                                \
    do {                                                                                           \
        paced_t *s_ = S(be);                                                                       \
        uint64_t t0_ = ch_now_ns();                                                                \
        call;                                                                                      \
        charge(s_, t0_, (double)(flops), (double)(bytes));                                         \
    } while (0)

static void p_timer_mark(const eng_backend_t *be, int kind, int begin)
{
    paced_t *s = S(be);
    uint64_t now = ch_now_ns();
    if (begin) {
        s->at[kind] = now;
        if (s->depth++ == 0) {
            s->start = now;
            s->owed = 0;
        }
        return;
    }
    if (s->depth == 0)
        return;
    uint64_t end = --s->depth == 0 ? sleep_until(s, s->start + s->owed) : now;
    s->sum[kind] += end - s->at[kind];
}

static void p_timer_read(const eng_backend_t *be, double *ms)
{
    paced_t *s = S(be);
    for (int k = 0; k < ENG_TIMER_KINDS; k++) {
        ms[k] = (double)s->sum[k] * 1e-6;
        s->sum[k] = 0;
    }
}

// ----------------------------------------------------------------------------
// memory: the inner backend's; copies and memsets charged by their bytes

static int p_alloc(const eng_backend_t *be, size_t bytes, void **out)
{
    return IN(be)->alloc(IN(be), bytes, out);
}

static void p_free(const eng_backend_t *be, void *p)
{
    if (IN(be)->free)
        IN(be)->free(IN(be), p);
}

static int p_copy(const eng_backend_t *be, void *dst, const void *src, size_t bytes,
                  eng_copy_dir_t dir)
{
    int rc = 0;
    RUN(be, 0, 2.0 * (double)bytes, rc = IN(be)->copy(IN(be), dst, src, bytes, dir));
    return rc;
}

static int p_memset(const eng_backend_t *be, void *p, int value, size_t bytes)
{
    int rc = 0;
    RUN(be, 0, bytes, rc = IN(be)->memset(IN(be), p, value, bytes));
    return rc;
}

// ----------------------------------------------------------------------------
// kernels: GEMMs and attention by their FLOPs, the rest by the floats they move

#define F4(x) (4.0 * (double)(x))

static void p_encoder_fwd(const eng_backend_t *be, float *out, const int32_t *inp, const float *wte,
                          const float *wpe, int B, int T, int C)
{
    RUN(be, 0, F4(3.0 * B * T * C), IN(be)->encoder_fwd(IN(be), out, inp, wte, wpe, B, T, C));
}

static void p_encoder_bwd(const eng_backend_t *be, float *dwte, float *dwpe, const float *dout,
                          const int32_t *inp, int B, int T, int C)
{
    RUN(be, 0, F4(5.0 * B * T * C), IN(be)->encoder_bwd(IN(be), dwte, dwpe, dout, inp, B, T, C));
}

static void p_layernorm_fwd(const eng_backend_t *be, float *out, float *mean, float *rstd,
                            const float *inp, const float *weight, const float *bias, int N, int C)
{
    RUN(be, 0, F4(2.0 * N * C),
        IN(be)->layernorm_fwd(IN(be), out, mean, rstd, inp, weight, bias, N, C));
}

static void p_layernorm_bwd(const eng_backend_t *be, float *dinp, float *dweight, float *dbias,
                            const float *dout, const float *inp, const float *weight,
                            const float *mean, const float *rstd, int N, int C)
{
    double reads = 2.0 + (dinp ? 1 : 0); /* dout and inp, dinp accumulated */
    RUN(be, 0, F4(reads * N * C),
        IN(be)->layernorm_bwd(IN(be), dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C));
}

static void p_matmul_fwd(const eng_backend_t *be, float *out, const float *inp, const float *weight,
                         const float *bias, int N, int C, int OC)
{
    RUN(be, 2.0 * N * C * OC, F4((double)N * C + (double)C * OC + (double)N * OC),
        IN(be)->matmul_fwd(IN(be), out, inp, weight, bias, N, C, OC));
}

static void p_matmul_bwd(const eng_backend_t *be, float *dinp, float *dweight, float *dbias,
                         const float *dout, const float *inp, const float *weight, int N, int C,
                         int OC)
{
    double k = (dinp ? 1 : 0) + (dweight ? 1 : 0);
    RUN(be, k * 2.0 * N * C * OC, F4((double)N * OC + k * ((double)N * C + (double)C * OC)),
        IN(be)->matmul_bwd(IN(be), dinp, dweight, dbias, dout, inp, weight, N, C, OC));
}

/* causal: QK^T and PV over half the T x T scores, 2 x (2 B T^2 C) / 2 */
static double att_flops(int B, int T, int C)
{
    return 2.0 * B * (double)T * T * C;
}

static void p_attention_fwd(const eng_backend_t *be, float *out, float *att, float *scratch,
                            const float *qkv, int B, int T, int C, int NH)
{
    double probs = att ? (double)B * NH * T * T : 0;
    RUN(be, att_flops(B, T, C), F4(4.0 * B * T * C + probs),
        IN(be)->attention_fwd(IN(be), out, att, scratch, qkv, B, T, C, NH));
}

static void p_attention_bwd(const eng_backend_t *be, float *dqkv, float *scratch, const float *dout,
                            const float *qkv, const float *att, int B, int T, int C, int NH)
{
    /* twice the forward's products, and the forward's again without kept probabilities */
    double flops = att_flops(B, T, C) * (att ? 2 : 3);
    RUN(be, flops, F4(8.0 * B * T * C + (double)B * NH * T * T),
        IN(be)->attention_bwd(IN(be), dqkv, scratch, dout, qkv, att, B, T, C, NH));
}

static void p_gelu_fwd(const eng_backend_t *be, float *out, const float *inp, size_t n)
{
    RUN(be, 0, F4(2.0 * (double)n), IN(be)->gelu_fwd(IN(be), out, inp, n));
}

static void p_gelu_bwd(const eng_backend_t *be, float *dinp, const float *inp, const float *dout,
                       size_t n)
{
    RUN(be, 0, F4(3.0 * (double)n), IN(be)->gelu_bwd(IN(be), dinp, inp, dout, n));
}

static void p_residual_fwd(const eng_backend_t *be, float *out, const float *a, const float *b,
                           size_t n)
{
    RUN(be, 0, F4(3.0 * (double)n), IN(be)->residual_fwd(IN(be), out, a, b, n));
}

static void p_lmhead_fwd(const eng_backend_t *be, float *logits, float *lse, float *losses,
                         const float *x, const float *wte, const int32_t *targets, int N, int C,
                         int V, int Vp)
{
    RUN(be, 2.0 * N * C * V, F4((double)N * C + (double)V * C + 2.0 * N * Vp),
        IN(be)->lmhead_fwd(IN(be), logits, lse, losses, x, wte, targets, N, C, V, Vp));
}

static void p_lmhead_bwd(const eng_backend_t *be, float *dx, float *dwte, float *logits,
                         const float *lse, const float *x, const float *wte, const int32_t *targets,
                         float scale, int N, int C, int V, int Vp)
{
    /* a split backward's halves (kernels/xent.h): dx (the softmax's gradient and dx's GEMM),
     * dwte (its GEMM) */
    double halves = (dx ? 1 : 0) + (dwte ? 1 : 0);
    RUN(be, halves * 2.0 * N * C * V,
        F4(halves * ((double)N * C + (double)V * C) + (dx ? 2.0 : 1.0) * N * Vp),
        IN(be)->lmhead_bwd(IN(be), dx, dwte, logits, lse, x, wte, targets, scale, N, C, V, Vp));
}

static void p_lmhead_fwdbwd(const eng_backend_t *be, float *dx, float *dwte, float *logits,
                            float *lse, float *losses, const float *x, const float *wte,
                            const int32_t *targets, int acc, int N, int C, int V, int Vp)
{
    RUN(be, 6.0 * N * C * V, F4(2.0 * N * C + 2.0 * V * C + 2.0 * N * Vp),
        IN(be)->lmhead_fwdbwd(IN(be), dx, dwte, logits, lse, losses, x, wte, targets, acc, N, C, V,
                              Vp));
}

static void p_axpy(const eng_backend_t *be, float *y, const float *x, size_t n, float a)
{
    RUN(be, 0, F4(3.0 * (double)n), IN(be)->axpy(IN(be), y, x, n, a));
}

static void p_adamw(const eng_backend_t *be, float *p, const float *g, float *m, float *v, size_t n,
                    double lr, double beta1, double beta2, double eps, double wd, uint64_t t)
{
    RUN(be, 0, F4(7.0 * (double)n),
        IN(be)->adamw(IN(be), p, g, m, v, n, lr, beta1, beta2, eps, wd, t));
}

static void p_adamw_fused(const eng_backend_t *be, float *p, float *g, float *m, float *v, size_t n,
                          double lr, double beta1, double beta2, double eps, double wd, uint64_t t,
                          float gscale, int zero_g)
{
    RUN(be, 0, F4((7.0 + (zero_g ? 1 : 0)) * (double)n),
        IN(be)->adamw_fused(IN(be), p, g, m, v, n, lr, beta1, beta2, eps, wd, t, gscale, zero_g));
}

static double p_sumsq(const eng_backend_t *be, const float *x, size_t n)
{
    double r = 0;
    RUN(be, 0, F4(n), r = IN(be)->sumsq(IN(be), x, n));
    return r;
}

static void p_scale(const eng_backend_t *be, float *x, size_t n, float c)
{
    RUN(be, 0, F4(2.0 * (double)n), IN(be)->scale(IN(be), x, n, c));
}

static int p_sync(const eng_backend_t *be)
{
    return IN(be)->sync(IN(be));
}

static void p_tp_embed_fwd(const eng_backend_t *be, float *out, const int32_t *inp,
                           const float *wte, const float *wpe, int v0, int Vl, int B, int T, int C)
{
    RUN(be, 0, F4(3.0 * B * T * C),
        IN(be)->tp_embed_fwd(IN(be), out, inp, wte, wpe, v0, Vl, B, T, C));
}

static void p_tp_embed_bwd(const eng_backend_t *be, float *dwte, float *dwpe, const float *dout,
                           const int32_t *inp, int v0, int Vl, int B, int T, int C)
{
    RUN(be, 0, F4(5.0 * B * T * C),
        IN(be)->tp_embed_bwd(IN(be), dwte, dwpe, dout, inp, v0, Vl, B, T, C));
}

static void p_tp_xent_max(const eng_backend_t *be, float *mx, const float *logits, int N, int Vl,
                          int valid)
{
    RUN(be, 0, F4((double)N * Vl), IN(be)->tp_xent_max(IN(be), mx, logits, N, Vl, valid));
}

static void p_tp_xent_sums(const eng_backend_t *be, float *sum, float *tl, const float *logits,
                           const float *mx, const int32_t *targets, int v0, int N, int Vl,
                           int valid)
{
    RUN(be, 0, F4((double)N * Vl),
        IN(be)->tp_xent_sums(IN(be), sum, tl, logits, mx, targets, v0, N, Vl, valid));
}

static void p_tp_xent_finish(const eng_backend_t *be, float *lse, float *losses, const float *mx,
                             const float *sum, const float *tl, int N)
{
    RUN(be, 0, F4(5.0 * N), IN(be)->tp_xent_finish(IN(be), lse, losses, mx, sum, tl, N));
}

static void p_tp_xent_bwd(const eng_backend_t *be, float *logits, const float *lse,
                          const int32_t *targets, float scale, int v0, int N, int Vl, int valid)
{
    RUN(be, 0, F4(2.0 * N * Vl),
        IN(be)->tp_xent_bwd(IN(be), logits, lse, targets, scale, v0, N, Vl, valid));
}

static int p_att_row(const eng_backend_t *be, int T, int hs)
{
    return IN(be)->att_row(IN(be), T, hs);
}

static void p_sumsq_to(const eng_backend_t *be, double *out, const float *x, size_t n)
{
    RUN(be, 0, F4(n), IN(be)->sumsq_to(IN(be), out, x, n));
}

static void p_loss_acc(const eng_backend_t *be, double *acc, const float *losses, size_t n)
{
    RUN(be, 0, F4(n), IN(be)->loss_acc(IN(be), acc, losses, n));
}

// ----------------------------------------------------------------------------

/* The inner backend's entry when it has one, the wrapper's in its place; NULL where the
 * inner's is NULL (its callers' fallbacks then run through the wrapped entries). */
#define WRAP(field, fn) be->field = in->field ? fn : NULL

int paced_create(const eng_backend_t *inner, double flop_rate, double byte_rate,
                 eng_backend_t **out)
{
    paced_t *s = calloc(1, sizeof *s);
    if (!s)
        return -ENOMEM;
    const eng_backend_t *in = inner;
    eng_backend_t *be = &s->be;
    s->inner = inner;
    s->ns_per_flop = 1e9 / flop_rate;
    s->ns_per_byte = 1e9 / byte_rate;
    be->name = "paced";
    be->host_memory = in->host_memory;
    be->ud = s;
    be->alloc = p_alloc;
    be->free = p_free;
    be->copy = p_copy;
    be->memset = p_memset;
    WRAP(encoder_fwd, p_encoder_fwd);
    WRAP(encoder_bwd, p_encoder_bwd);
    WRAP(layernorm_fwd, p_layernorm_fwd);
    WRAP(layernorm_bwd, p_layernorm_bwd);
    WRAP(matmul_fwd, p_matmul_fwd);
    WRAP(matmul_bwd, p_matmul_bwd);
    WRAP(attention_fwd, p_attention_fwd);
    WRAP(attention_bwd, p_attention_bwd);
    WRAP(gelu_fwd, p_gelu_fwd);
    WRAP(gelu_bwd, p_gelu_bwd);
    WRAP(residual_fwd, p_residual_fwd);
    WRAP(lmhead_fwd, p_lmhead_fwd);
    WRAP(lmhead_bwd, p_lmhead_bwd);
    WRAP(lmhead_fwdbwd, p_lmhead_fwdbwd);
    WRAP(axpy, p_axpy);
    WRAP(adamw, p_adamw);
    WRAP(adamw_fused, p_adamw_fused);
    WRAP(sumsq, p_sumsq);
    WRAP(scale, p_scale);
    WRAP(sync, p_sync);
    be->timer_mark = p_timer_mark;
    be->timer_read = p_timer_read;
    WRAP(tp_embed_fwd, p_tp_embed_fwd);
    WRAP(tp_embed_bwd, p_tp_embed_bwd);
    WRAP(tp_xent_max, p_tp_xent_max);
    WRAP(tp_xent_sums, p_tp_xent_sums);
    WRAP(tp_xent_finish, p_tp_xent_finish);
    WRAP(tp_xent_bwd, p_tp_xent_bwd);
    WRAP(att_row, p_att_row);
    WRAP(sumsq_to, p_sumsq_to);
    WRAP(loss_acc, p_loss_acc);
    /* fp32 only: no bf16 entries (the bf16 wrapper would round on the host) */
    *out = be;
    return 0;
}

void paced_destroy(eng_backend_t *be)
{
    if (be)
        free(S(be));
}

void paced_stats(const eng_backend_t *be, paced_stats_t *out)
{
    *out = S(be)->st;
}

void paced_reset(eng_backend_t *be)
{
    S(be)->st = (paced_stats_t){0};
}
