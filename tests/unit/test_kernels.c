/* CPU kernels (the kernels/ headers): each fast version against its reference with a stated
 * tolerance, and each backward against central finite differences of a double-precision
 * forward written here (independent of the kernels), on small shapes.
 *
 * Gradient checks use the scalar loss L = sum(out * w) for a fixed random w, so the
 * kernel's backward is fed dout = w and must return dL/dinput. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "kernels/adamw.h"
#include "kernels/attention.h"
#include "kernels/encoder.h"
#include "kernels/gelu.h"
#include "kernels/layernorm.h"
#include "kernels/matmul.h"
#include "kernels/pool.h"
#include "kernels/residual.h"
#include "kernels/vmath.h"
#include "kernels/xent.h"

#define FD_H 1e-5

// ----------------------------------------------------------------------------
// helpers

static float *randn(size_t n, const char *name, float std)
{
    float *x = malloc((n ? n : 1) * sizeof *x);
    cr_assert_not_null(x);
    ch_rng_fill_normal(x, n, 1234, name, 0, std);
    return x;
}

static float *zeros(size_t n)
{
    float *x = calloc(n ? n : 1, sizeof *x);
    cr_assert_not_null(x);
    return x;
}

static double *to_double(const float *x, size_t n)
{
    double *d = malloc((n ? n : 1) * sizeof *d);
    cr_assert_not_null(d);
    for (size_t i = 0; i < n; i++) {
        d[i] = x[i];
    }
    return d;
}

/* |got - want| <= rtol * |want| + atol * max|want| for every element */
static void assert_close(const char *what, const float *got, const double *want, size_t n,
                         double rtol, double atol)
{
    double maxabs = 0.0;
    for (size_t i = 0; i < n; i++) {
        maxabs = fmax(maxabs, fabs(want[i]));
    }
    for (size_t i = 0; i < n; i++) {
        double err = fabs(got[i] - want[i]);
        cr_assert(err <= rtol * fabs(want[i]) + atol * maxabs + 1e-30,
                  "%s[%zu]: got %.9g want %.9g (max |want| %.3g)", what, i, got[i], want[i],
                  maxabs);
    }
}

static void assert_close_f(const char *what, const float *got, const float *want, size_t n,
                           double rtol, double atol)
{
    double *w = to_double(want, n);
    assert_close(what, got, w, n, rtol, atol);
    free(w);
}

/* Central differences of f with respect to x[0..n): grad[i] = (f(x+h) - f(x-h)) / 2h. */
typedef double (*loss_fn)(void *ctx);
static double *fd_grad(loss_fn f, void *ctx, double *x, size_t n)
{
    double *g = malloc((n ? n : 1) * sizeof *g);
    cr_assert_not_null(g);
    for (size_t i = 0; i < n; i++) {
        double x0 = x[i];
        x[i] = x0 + FD_H;
        double lp = f(ctx);
        x[i] = x0 - FD_H;
        double lm = f(ctx);
        x[i] = x0;
        g[i] = (lp - lm) / (2 * FD_H);
    }
    return g;
}

// ----------------------------------------------------------------------------
// vectorised math

Test(vmath, exp_matches_libm)
{
    double worst = 0.0;
    for (int i = 0; i <= 200000; i++) {
        float x = -87.0f + 175.0f * (float)i / 200000.0f;
        double want = exp((double)x);
        worst = fmax(worst, fabs(kn_vexpf(x) - want) / want);
    }
    cr_assert(worst < 4e-7, "kn_vexpf worst relative error %.3g", worst);
    cr_assert(kn_vexpf(-1000.0f) < 1e-37f && kn_vexpf(-1000.0f) >= 0.0f);
    cr_assert(isfinite(kn_vexpf(1000.0f)));
}

Test(vmath, reductions)
{
    float x[37];
    double s = 0.0, mx = -1e30;
    for (int i = 0; i < 37; i++) {
        x[i] = (float)((i * 7919) % 101) / 10.0f - 5.0f;
        s += x[i];
        mx = fmax(mx, x[i]);
    }
    cr_assert(fabs(kn_vsum(x, 37) - s) < 1e-4);
    cr_assert_eq(kn_vmax(x, 37), (float)mx);
    cr_assert(fabs(kn_vdot(x, x, 37) - kn_sumsq_ref(x, 37)) < 1e-3);
}

// ----------------------------------------------------------------------------
// encoder

Test(encoder, fast_matches_ref_and_grad_is_exact)
{
    int B = 2, T = 5, C = 19, V = 7;
    int32_t inp[10] = {1, 3, 3, 0, 6, 2, 2, 5, 1, 3};
    float *wte = randn((size_t)V * C, "wte", 1), *wpe = randn((size_t)T * C, "wpe", 1);
    float *o1 = zeros((size_t)B * T * C), *o2 = zeros((size_t)B * T * C);
    kn_encoder_fwd(o1, inp, wte, wpe, B, T, C);
    kn_encoder_fwd_ref(o2, inp, wte, wpe, B, T, C);
    cr_assert(memcmp(o1, o2, (size_t)B * T * C * sizeof(float)) == 0);

    float *dout = randn((size_t)B * T * C, "dout", 1);
    float *dwte1 = zeros((size_t)V * C), *dwpe1 = zeros((size_t)T * C);
    float *dwte2 = zeros((size_t)V * C), *dwpe2 = zeros((size_t)T * C);
    kn_encoder_bwd(dwte1, dwpe1, dout, inp, B, T, C);
    kn_encoder_bwd_ref(dwte2, dwpe2, dout, inp, B, T, C);
    cr_assert(memcmp(dwte1, dwte2, (size_t)V * C * sizeof(float)) == 0);
    cr_assert(memcmp(dwpe1, dwpe2, (size_t)T * C * sizeof(float)) == 0);
    // the op is linear: dL/dwte[v] = sum of dout rows with token v, in double
    for (int v = 0; v < V; v++) {
        for (int i = 0; i < C; i++) {
            double want = 0.0;
            for (int n = 0; n < B * T; n++) {
                want += inp[n] == v ? dout[(size_t)n * C + i] : 0.0;
            }
            cr_assert(fabs(dwte1[(size_t)v * C + i] - want) < 1e-5);
        }
    }
    free(wte), free(wpe), free(o1), free(o2), free(dout);
    free(dwte1), free(dwpe1), free(dwte2), free(dwpe2);
}

Test(residual, fast_matches_ref_with_aliasing)
{
    size_t n = 1037;
    float *a = randn(n, "a", 1), *b = randn(n, "b", 1), *o1 = zeros(n), *o2 = zeros(n);
    kn_residual_fwd(o1, a, b, n);
    kn_residual_fwd_ref(o2, a, b, n);
    cr_assert(memcmp(o1, o2, n * sizeof(float)) == 0);
    kn_residual_fwd(a, a, b, n); /* in place, as the model uses it */
    cr_assert(memcmp(a, o2, n * sizeof(float)) == 0);
    free(a), free(b), free(o1), free(o2);
}

// ----------------------------------------------------------------------------
// layernorm

typedef struct ln_ctx {
    double *x, *w, *b;
    const float *dout;
    int N, C;
} ln_ctx_t;

static double ln_loss(void *p)
{
    ln_ctx_t *c = p;
    double L = 0.0;
    for (int n = 0; n < c->N; n++) {
        const double *x = c->x + (size_t)n * c->C;
        double m = 0.0, v = 0.0;
        for (int i = 0; i < c->C; i++) {
            m += x[i];
        }
        m /= c->C;
        for (int i = 0; i < c->C; i++) {
            v += (x[i] - m) * (x[i] - m);
        }
        double s = 1.0 / sqrt(v / c->C + 1e-5);
        for (int i = 0; i < c->C; i++) {
            L += ((x[i] - m) * s * c->w[i] + c->b[i]) * c->dout[(size_t)n * c->C + i];
        }
    }
    return L;
}

Test(layernorm, fast_matches_ref_and_finite_differences)
{
    int N = 6, C = 37;
    size_t NC = (size_t)N * C;
    float *x = randn(NC, "x", 2), *w = randn(C, "w", 1), *b = randn(C, "b", 1);
    float *o1 = zeros(NC), *o2 = zeros(NC), *m1 = zeros(N), *m2 = zeros(N), *r1 = zeros(N),
          *r2 = zeros(N);
    kn_layernorm_fwd(o1, m1, r1, x, w, b, N, C);
    kn_layernorm_fwd_ref(o2, m2, r2, x, w, b, N, C);
    assert_close_f("ln out", o1, o2, NC, 1e-5, 1e-6);
    assert_close_f("ln rstd", r1, r2, N, 1e-5, 0);

    float *dout = randn(NC, "dout", 1);
    float *dx1 = zeros(NC), *dw1 = zeros(C), *db1 = zeros(C);
    float *dx2 = zeros(NC), *dw2 = zeros(C), *db2 = zeros(C);
    kn_layernorm_bwd(dx1, dw1, db1, dout, x, w, m1, r1, N, C);
    kn_layernorm_bwd_ref(dx2, dw2, db2, dout, x, w, m2, r2, N, C);
    assert_close_f("ln dx fast/ref", dx1, dx2, NC, 1e-4, 1e-6);
    assert_close_f("ln dw fast/ref", dw1, dw2, C, 1e-4, 1e-6);

    ln_ctx_t c = {to_double(x, NC), to_double(w, C), to_double(b, C), dout, N, C};
    double *gx = fd_grad(ln_loss, &c, c.x, NC), *gw = fd_grad(ln_loss, &c, c.w, C),
           *gb = fd_grad(ln_loss, &c, c.b, C);
    assert_close("ln dx", dx1, gx, NC, 1e-3, 1e-4);
    assert_close("ln dw", dw1, gw, C, 1e-3, 1e-4);
    assert_close("ln db", db1, gb, C, 1e-3, 1e-4);
    free(gx), free(gw), free(gb), free(c.x), free(c.w), free(c.b);
    free(x), free(w), free(b), free(o1), free(o2), free(m1), free(m2), free(r1), free(r2);
    free(dout), free(dx1), free(dw1), free(db1), free(dx2), free(dw2), free(db2);
}

/* A split backward (ZB-H1): the input pass and the weight pass, each alone, write the bits
 * of the whole call, accumulating onto what the buffers held. */
Test(layernorm, split_backward_is_bit_identical)
{
    int N = 5, C = 37; /* C not a multiple of KN_LANES: the tail loop too */
    size_t NC = (size_t)N * C;
    float *x = randn(NC, "x", 2), *w = randn(C, "w", 1), *b = randn(C, "b", 1);
    float *o = zeros(NC), *m = zeros(N), *r = zeros(N), *dout = randn(NC, "dout", 1);
    kn_layernorm_fwd(o, m, r, x, w, b, N, C);
    float *dx1 = randn(NC, "dx", 1), *dw1 = randn(C, "dw", 1), *db1 = randn(C, "db", 1);
    float *dx2 = zeros(NC), *dw2 = zeros(C), *db2 = zeros(C);
    memcpy(dx2, dx1, NC * sizeof *dx1);
    memcpy(dw2, dw1, C * sizeof *dw1);
    memcpy(db2, db1, C * sizeof *db1);
    kn_layernorm_bwd(dx1, dw1, db1, dout, x, w, m, r, N, C);
    kn_layernorm_bwd(dx2, NULL, NULL, dout, x, w, m, r, N, C);
    kn_layernorm_bwd(NULL, dw2, db2, dout, x, NULL, m, r, N, C);
    cr_expect_eq(memcmp(dx1, dx2, NC * sizeof *dx1), 0, "input pass");
    cr_expect_eq(memcmp(dw1, dw2, C * sizeof *dw1), 0, "weight pass: dweight");
    cr_expect_eq(memcmp(db1, db2, C * sizeof *db1), 0, "weight pass: dbias");
    free(x), free(w), free(b), free(o), free(m), free(r), free(dout);
    free(dx1), free(dw1), free(db1), free(dx2), free(dw2), free(db2);
}

// ----------------------------------------------------------------------------
// matmul

typedef struct mm_ctx {
    double *x, *w, *b;
    const float *dout;
    int N, C, OC;
} mm_ctx_t;

static double mm_loss(void *p)
{
    mm_ctx_t *c = p;
    double L = 0.0;
    for (int n = 0; n < c->N; n++) {
        for (int o = 0; o < c->OC; o++) {
            double v = c->b[o];
            for (int i = 0; i < c->C; i++) {
                v += c->x[(size_t)n * c->C + i] * c->w[(size_t)i * c->OC + o];
            }
            L += v * c->dout[(size_t)n * c->OC + o];
        }
    }
    return L;
}

/* A split backward (ZB-H1): dinp alone and the weight gradients alone, the whole call's
 * bits. */
Test(matmul, split_backward_is_bit_identical)
{
    int N = 7, C = 13, OC = 21;
    size_t NCi = (size_t)N * C, CO = (size_t)C * OC;
    float *x = randn(NCi, "x", 1), *w = randn(CO, "w", 1), *dout = randn((size_t)N * OC, "d", 1);
    float *dx1 = zeros(NCi), *dw1 = randn(CO, "dw", 1), *db1 = randn(OC, "db", 1);
    float *dx2 = zeros(NCi), *dw2 = zeros(CO), *db2 = zeros(OC);
    memcpy(dw2, dw1, CO * sizeof *dw1);
    memcpy(db2, db1, OC * sizeof *db1);
    kn_matmul_bwd(dx1, dw1, db1, dout, x, w, N, C, OC);
    kn_matmul_bwd(dx2, NULL, NULL, dout, x, w, N, C, OC);
    kn_matmul_bwd(NULL, dw2, db2, dout, x, NULL, N, C, OC);
    cr_expect_eq(memcmp(dx1, dx2, NCi * sizeof *dx1), 0, "input pass");
    cr_expect_eq(memcmp(dw1, dw2, CO * sizeof *dw1), 0, "weight pass: dweight");
    cr_expect_eq(memcmp(db1, db2, OC * sizeof *db1), 0, "weight pass: dbias");
    free(x), free(w), free(dout), free(dx1), free(dw1), free(db1), free(dx2), free(dw2), free(db2);
}

Test(matmul, fast_matches_ref_and_finite_differences)
{
    int N = 7, C = 13, OC = 21;
    float *x = randn((size_t)N * C, "x", 1), *w = randn((size_t)C * OC, "w", 1),
          *b = randn(OC, "b", 1);
    float *o1 = zeros((size_t)N * OC), *o2 = zeros((size_t)N * OC);
    kn_matmul_fwd(o1, x, w, b, N, C, OC);
    kn_matmul_fwd_ref(o2, x, w, b, N, C, OC);
    assert_close_f("mm out", o1, o2, (size_t)N * OC, 1e-5, 1e-6);
    kn_matmul_fwd(o1, x, w, NULL, N, C, OC);
    kn_matmul_fwd_ref(o2, x, w, NULL, N, C, OC);
    assert_close_f("mm out (no bias)", o1, o2, (size_t)N * OC, 1e-5, 1e-6);

    float *dout = randn((size_t)N * OC, "dout", 1);
    float *dx1 = zeros((size_t)N * C), *dw1 = zeros((size_t)C * OC), *db1 = zeros(OC);
    float *dx2 = zeros((size_t)N * C), *dw2 = zeros((size_t)C * OC), *db2 = zeros(OC);
    kn_matmul_bwd(dx1, dw1, db1, dout, x, w, N, C, OC);
    kn_matmul_bwd_ref(dx2, dw2, db2, dout, x, w, N, C, OC);
    assert_close_f("mm dx fast/ref", dx1, dx2, (size_t)N * C, 1e-5, 1e-6);
    assert_close_f("mm dw fast/ref", dw1, dw2, (size_t)C * OC, 1e-5, 1e-6);
    assert_close_f("mm db fast/ref", db1, db2, OC, 1e-5, 1e-6);

    mm_ctx_t c = {to_double(x, (size_t)N * C),
                  to_double(w, (size_t)C * OC),
                  to_double(b, OC),
                  dout,
                  N,
                  C,
                  OC};
    double *gx = fd_grad(mm_loss, &c, c.x, (size_t)N * C);
    double *gw = fd_grad(mm_loss, &c, c.w, (size_t)C * OC);
    double *gb = fd_grad(mm_loss, &c, c.b, OC);
    assert_close("mm dx", dx1, gx, (size_t)N * C, 1e-4, 1e-5);
    assert_close("mm dw", dw1, gw, (size_t)C * OC, 1e-4, 1e-5);
    assert_close("mm db", db1, gb, OC, 1e-4, 1e-5);
    // weight and bias gradients accumulate
    kn_matmul_bwd(dx1, dw1, db1, dout, x, w, N, C, OC);
    for (int o = 0; o < OC; o++) {
        cr_assert(fabs(db1[o] - 2 * gb[o]) < 1e-4 * (1 + fabs(gb[o])));
    }
    free(gx), free(gw), free(gb), free(c.x), free(c.w), free(c.b);
    free(x), free(w), free(b), free(o1), free(o2), free(dout);
    free(dx1), free(dw1), free(db1), free(dx2), free(dw2), free(db2);
}

// ----------------------------------------------------------------------------
// attention

typedef struct attn_ctx {
    double *qkv;
    const float *dout;
    int B, T, C, NH;
} attn_ctx_t;

static double attn_loss(void *p)
{
    attn_ctx_t *c = p;
    int hs = c->C / c->NH, C3 = 3 * c->C;
    double scale = 1.0 / sqrt((double)hs), L = 0.0;
    double *s = malloc((size_t)c->T * sizeof *s);
    cr_assert_not_null(s);
    for (int b = 0; b < c->B; b++) {
        for (int h = 0; h < c->NH; h++) {
            for (int t = 0; t < c->T; t++) {
                const double *q = c->qkv + ((size_t)b * c->T + t) * C3 + h * hs;
                double mx = -INFINITY, sum = 0.0;
                for (int t2 = 0; t2 <= t; t2++) {
                    const double *k = c->qkv + ((size_t)b * c->T + t2) * C3 + c->C + h * hs;
                    s[t2] = 0.0;
                    for (int i = 0; i < hs; i++) {
                        s[t2] += q[i] * k[i] * scale;
                    }
                    mx = fmax(mx, s[t2]);
                }
                for (int t2 = 0; t2 <= t; t2++) {
                    s[t2] = exp(s[t2] - mx);
                    sum += s[t2];
                }
                for (int i = 0; i < hs; i++) {
                    double y = 0.0;
                    for (int t2 = 0; t2 <= t; t2++) {
                        y += s[t2] / sum *
                             c->qkv[((size_t)b * c->T + t2) * C3 + 2 * c->C + h * hs + i];
                    }
                    L += y * c->dout[((size_t)b * c->T + t) * c->C + h * hs + i];
                }
            }
        }
    }
    free(s);
    return L;
}

/* fast vs reference, forward and backward, at a shape that spans several query blocks */
static void attn_compare(int B, int T, int C, int NH)
{
    size_t n3 = (size_t)B * T * 3 * C, n1 = (size_t)B * T * C, na = (size_t)B * NH * T * T;
    float *qkv = randn(n3, "qkv", 1), *dout = randn(n1, "dout", 1);
    float *y1 = zeros(n1), *y2 = zeros(n1), *a1 = zeros(na), *a2 = zeros(na);
    kn_attention_fwd(y1, a1, NULL, qkv, B, T, C, NH);
    kn_attention_fwd_ref(y2, a2, qkv, B, T, C, NH);
    assert_close_f("attn out", y1, y2, n1, 1e-4, 1e-5);
    for (size_t r = 0; r < (size_t)B * NH * T; r++) {
        size_t t = r % T;
        assert_close_f("attn probs", a1 + r * T, a2 + r * T, t + 1, 1e-4, 1e-6);
    }
    float *d1 = zeros(n3), *d2 = zeros(n3), *scratch = zeros((size_t)T * T);
    kn_attention_bwd(d1, scratch, dout, qkv, a1, B, T, C, NH);
    kn_attention_bwd_ref(d2, dout, qkv, a2, B, T, C, NH);
    assert_close_f("attn dqkv fast/ref", d1, d2, n3, 1e-3, 1e-5);
    free(qkv), free(dout), free(y1), free(y2), free(a1), free(a2), free(d1), free(d2),
        free(scratch);
}

Test(attention, fast_matches_ref_across_blocks)
{
    attn_compare(2, 7, 8, 2);
    attn_compare(1, 300, 32, 4); /* 3 query blocks, the last one ragged */
}

/* Without att (selective recomputation) the fast version's output and gradient are the
 * bits of the one that keeps the probabilities, in a scratch of KN_ATTENTION_NOATT_SCRATCH */
static void attn_noatt_same_bits(int B, int T, int C, int NH)
{
    size_t n3 = (size_t)B * T * 3 * C, n1 = (size_t)B * T * C, na = (size_t)B * NH * T * T;
    size_t ns = KN_ATTENTION_NOATT_SCRATCH(T);
    float *qkv = randn(n3, "qkv", 1), *dout = randn(n1, "dout", 1);
    float *y1 = zeros(n1), *y2 = zeros(n1), *att = zeros(na), *d1 = zeros(n3), *d2 = zeros(n3);
    float *s1 = zeros((size_t)T * T), *s2 = zeros(ns);
    kn_attention_fwd(y1, att, NULL, qkv, B, T, C, NH);
    kn_attention_bwd(d1, s1, dout, qkv, att, B, T, C, NH);
    kn_attention_fwd(y2, NULL, s2, qkv, B, T, C, NH);
    kn_attention_bwd(d2, s2, dout, qkv, NULL, B, T, C, NH);
    cr_assert(memcmp(y1, y2, n1 * sizeof(float)) == 0, "out differs without att (T %d)", T);
    cr_assert(memcmp(d1, d2, n3 * sizeof(float)) == 0, "dqkv differs without att (T %d)", T);
    free(qkv), free(dout), free(y1), free(y2), free(att), free(d1), free(d2), free(s1), free(s2);
}

Test(attention, no_att_recomputes_the_same_bits)
{
    attn_noatt_same_bits(2, 7, 8, 2);    /* one block, scratch 2*T*T > T*T */
    attn_noatt_same_bits(1, 300, 32, 4); /* 3 query blocks, the last one ragged */
}

Test(attention, finite_differences)
{
    int B = 2, T = 6, C = 8, NH = 2;
    size_t n3 = (size_t)B * T * 3 * C, n1 = (size_t)B * T * C;
    float *qkv = randn(n3, "qkv", 1), *dout = randn(n1, "dout", 1);
    float *y = zeros(n1), *att = zeros((size_t)B * NH * T * T), *dqkv = zeros(n3),
          *dref = zeros(n3), *scratch = zeros((size_t)T * T);
    kn_attention_fwd(y, att, NULL, qkv, B, T, C, NH);
    kn_attention_bwd(dqkv, scratch, dout, qkv, att, B, T, C, NH);
    kn_attention_bwd_ref(dref, dout, qkv, att, B, T, C, NH);
    attn_ctx_t c = {to_double(qkv, n3), dout, B, T, C, NH};
    double want_loss = attn_loss(&c);
    double got_loss = 0.0;
    for (size_t i = 0; i < n1; i++) {
        got_loss += (double)y[i] * dout[i];
    }
    cr_assert(fabs(got_loss - want_loss) < 1e-4 * (1 + fabs(want_loss)));
    double *g = fd_grad(attn_loss, &c, c.qkv, n3);
    assert_close("attn dqkv", dqkv, g, n3, 1e-3, 1e-4);
    assert_close("attn dqkv (ref)", dref, g, n3, 1e-3, 1e-4);
    free(g), free(c.qkv), free(qkv), free(dout), free(y), free(att), free(dqkv), free(dref),
        free(scratch);
}

// ----------------------------------------------------------------------------
// gelu

typedef struct gelu_ctx {
    double *x;
    const float *dout;
    size_t n;
} gelu_ctx_t;

static double gelu_loss(void *p)
{
    gelu_ctx_t *c = p;
    double L = 0.0;
    for (size_t i = 0; i < c->n; i++) {
        double x = c->x[i];
        double y = 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
        L += y * c->dout[i];
    }
    return L;
}

Test(gelu, fast_matches_ref_and_finite_differences)
{
    size_t n = 4001;
    float *x = zeros(n), *y1 = zeros(n), *y2 = zeros(n);
    for (size_t i = 0; i < n; i++) {
        x[i] = -12.0f + 24.0f * (float)i / (float)(n - 1);
    }
    kn_gelu_fwd(y1, x, n);
    kn_gelu_fwd_ref(y2, x, n);
    for (size_t i = 0; i < n; i++) {
        cr_assert(fabs(y1[i] - y2[i]) <= 1e-6 * fmax(1.0, fabs(x[i])), "gelu(%g): %.9g vs %.9g",
                  x[i], y1[i], y2[i]);
    }
    float *dout = randn(n, "dout", 1), *d1 = zeros(n), *d2 = zeros(n);
    kn_gelu_bwd(d1, x, dout, n);
    kn_gelu_bwd_ref(d2, x, dout, n);
    for (size_t i = 0; i < n; i++) {
        cr_assert(fabs(d1[i] - d2[i]) <= 2e-6 * fmax(1.0, fabs(dout[i] * x[i])),
                  "gelu'(%g): %.9g vs %.9g", x[i], d1[i], d2[i]);
    }
    gelu_ctx_t c = {to_double(x, n), dout, n};
    double *g = fd_grad(gelu_loss, &c, c.x, n);
    assert_close("gelu dx", d1, g, n, 1e-4, 1e-5);
    memcpy(d2, dout, n * sizeof(float));
    kn_gelu_bwd(d2, x, d2, n); /* in place, as the model uses it */
    cr_assert(memcmp(d1, d2, n * sizeof(float)) == 0);
    free(g), free(c.x), free(x), free(y1), free(y2), free(dout), free(d1), free(d2);
}

// ----------------------------------------------------------------------------
// LM head + cross-entropy

typedef struct xent_ctx {
    double *x, *wte;
    const int32_t *tgt;
    double scale;
    int N, C, V;
} xent_ctx_t;

static double xent_loss(void *p)
{
    xent_ctx_t *c = p;
    double L = 0.0;
    double *logit = malloc((size_t)c->V * sizeof *logit);
    cr_assert_not_null(logit);
    for (int n = 0; n < c->N; n++) {
        double mx = -INFINITY, sum = 0.0;
        for (int v = 0; v < c->V; v++) {
            logit[v] = 0.0;
            for (int i = 0; i < c->C; i++) {
                logit[v] += c->x[(size_t)n * c->C + i] * c->wte[(size_t)v * c->C + i];
            }
            mx = fmax(mx, logit[v]);
        }
        for (int v = 0; v < c->V; v++) {
            sum += exp(logit[v] - mx);
        }
        L += c->scale * (mx + log(sum) - logit[c->tgt[n]]);
    }
    free(logit);
    return L;
}

Test(xent, fast_matches_ref_and_finite_differences)
{
    int N = 5, C = 8, V = 37, Vp = 48;
    float scale = 0.25f;
    int32_t tgt[5] = {0, 36, 5, 5, 17};
    float *x = randn((size_t)N * C, "x", 1), *wte = randn((size_t)Vp * C, "wte", 1);
    memset(wte + (size_t)V * C, 0, (size_t)(Vp - V) * C * sizeof(float));
    float *l1 = zeros((size_t)N * Vp), *l2 = zeros((size_t)N * Vp);
    float lse1[5], lse2[5], loss1[5], loss2[5];
    kn_lmhead_fwd(l1, lse1, loss1, x, wte, tgt, N, C, V, Vp);
    kn_lmhead_fwd_ref(l2, lse2, loss2, x, wte, tgt, N, C, V, Vp);
    assert_close_f("logits", l1, l2, (size_t)N * Vp, 1e-5, 1e-6);
    assert_close_f("lse", lse1, lse2, N, 1e-5, 0);
    assert_close_f("losses", loss1, loss2, N, 1e-5, 1e-6);

    xent_ctx_t c = {
        to_double(x, (size_t)N * C), to_double(wte, (size_t)Vp * C), tgt, scale, N, C, V};
    double want = xent_loss(&c), got = 0.0;
    for (int n = 0; n < N; n++) {
        got += scale * loss1[n];
    }
    cr_assert(fabs(got - want) < 1e-5 * fabs(want), "loss %.9g want %.9g", got, want);

    float *dx1 = zeros((size_t)N * C), *dw1 = zeros((size_t)Vp * C);
    float *dx2 = zeros((size_t)N * C), *dw2 = zeros((size_t)Vp * C);
    kn_lmhead_bwd(dx1, dw1, l1, lse1, x, wte, tgt, scale, N, C, V, Vp);
    kn_lmhead_bwd_ref(dx2, dw2, l2, lse2, x, wte, tgt, scale, N, C, V, Vp);
    assert_close_f("xent dx fast/ref", dx1, dx2, (size_t)N * C, 1e-4, 1e-6);
    assert_close_f("xent dwte fast/ref", dw1, dw2, (size_t)Vp * C, 1e-4, 1e-6);
    double *gx = fd_grad(xent_loss, &c, c.x, (size_t)N * C);
    double *gw = fd_grad(xent_loss, &c, c.wte, (size_t)V * C);
    assert_close("xent dx", dx1, gx, (size_t)N * C, 1e-3, 1e-4);
    assert_close("xent dwte", dw1, gw, (size_t)V * C, 1e-3, 1e-4);
    for (size_t i = (size_t)V * C; i < (size_t)Vp * C; i++) {
        cr_assert_eq(dw1[i], 0.0f, "padded wte row got gradient");
    }
    free(gx), free(gw), free(c.x), free(c.wte), free(x), free(wte), free(l1), free(l2);
    free(dx1), free(dw1), free(dx2), free(dw2);
}

/* A split backward (ZB-H1's last stage): the input half (dwte NULL), then the weight half
 * (dx NULL) on the dlogits it left, give one call's bits, fast and reference, the input half
 * reading no x and the weight half neither lse, wte nor targets (NULL here). */
Test(xent, backward_halves_in_turn_are_one_call)
{
    int N = 6, C = 16, V = 45, Vp = 64;
    float scale = 0.125f;
    int32_t tgt[6] = {3, 44, 0, 9, 9, 21};
    float *x = randn((size_t)N * C, "hx", 1), *wte = randn((size_t)Vp * C, "hw", 1);
    memset(wte + (size_t)V * C, 0, (size_t)(Vp - V) * C * sizeof(float));
    for (int ref = 0; ref < 2; ref++) {
        void (*fwd)(float *, float *, float *, const float *, const float *, const int32_t *, int,
                    int, int, int) = ref ? kn_lmhead_fwd_ref : kn_lmhead_fwd;
        void (*bwd)(float *, float *, float *, const float *, const float *, const float *,
                    const int32_t *, float, int, int, int, int) =
            ref ? kn_lmhead_bwd_ref : kn_lmhead_bwd;
        float *l1 = zeros((size_t)N * Vp), *l2 = zeros((size_t)N * Vp);
        float lse[6], loss[6];
        fwd(l1, lse, loss, x, wte, tgt, N, C, V, Vp);
        memcpy(l2, l1, (size_t)N * Vp * sizeof(float));
        float *dx1 = zeros((size_t)N * C), *dw1 = randn((size_t)Vp * C, "acc", 1);
        float *dx2 = zeros((size_t)N * C), *dw2 = zeros((size_t)Vp * C);
        memcpy(dw2, dw1, (size_t)Vp * C * sizeof(float)); /* both accumulate onto the same */
        bwd(dx1, dw1, l1, lse, x, wte, tgt, scale, N, C, V, Vp);
        bwd(dx2, NULL, l2, lse, NULL, wte, tgt, scale, N, C, V, Vp);
        float *before = zeros((size_t)Vp * C);
        memcpy(before, dw2, (size_t)Vp * C * sizeof(float));
        cr_expect_eq(memcmp(l1, l2, (size_t)N * Vp * sizeof(float)), 0,
                     "%s: the input half's dlogits differ from one call's", ref ? "ref" : "fast");
        cr_expect_eq(memcmp(dx1, dx2, (size_t)N * C * sizeof(float)), 0,
                     "%s: the input half's dx differs from one call's", ref ? "ref" : "fast");
        bwd(NULL, dw2, l2, NULL, x, NULL, NULL, 0.0f, N, C, V, Vp);
        cr_expect_eq(memcmp(dw1, dw2, (size_t)Vp * C * sizeof(float)), 0,
                     "%s: the weight half's dwte differs from one call's", ref ? "ref" : "fast");
        cr_expect_neq(memcmp(before, dw2, (size_t)Vp * C * sizeof(float)), 0,
                      "%s: the weight half added nothing", ref ? "ref" : "fast");
        free(l1), free(l2), free(dx1), free(dw1), free(dx2), free(dw2), free(before);
    }
    free(x), free(wte);
}

// ----------------------------------------------------------------------------
// optimizer

Test(adamw, fast_matches_textbook_double)
{
    size_t n = 1000;
    float *p1 = randn(n, "p", 1), *p2 = randn(n, "p", 1);
    float *m1 = zeros(n), *v1 = zeros(n), *m2 = zeros(n), *v2 = zeros(n);
    for (uint64_t t = 1; t <= 20; t++) {
        float *g = randn(n, t % 2 ? "g1" : "g2", (float)t * 0.1f);
        kn_adamw(p1, g, m1, v1, n, 1e-2, 0.9, 0.95, 1e-8, 0.1, t);
        kn_adamw_ref(p2, g, m2, v2, n, 1e-2, 0.9, 0.95, 1e-8, 0.1, t);
        free(g);
    }
    assert_close_f("adamw p", p1, p2, n, 1e-6, 1e-7);
    assert_close_f("adamw m", m1, m2, n, 1e-5, 1e-6);
    assert_close_f("adamw v", v1, v2, n, 1e-5, 1e-6);
    free(p1), free(p2), free(m1), free(v1), free(m2), free(v2);
}

Test(adamw, first_step_by_hand)
{
    /* step 1 from m = v = 0: mhat = g, vhat = g^2, so p' = p (1 - lr wd) - lr g / (|g| + eps) */
    float p[3] = {1.0f, -2.0f, 0.5f}, g[3] = {0.5f, -0.25f, 0.0f}, m[3] = {0}, v[3] = {0};
    double lr = 0.1, wd = 0.1;
    kn_adamw(p, g, m, v, 3, lr, 0.9, 0.95, 1e-8, wd, 1);
    double want[3] = {1.0 * 0.99 - 0.1, -2.0 * 0.99 + 0.1, 0.5 * 0.99};
    for (int i = 0; i < 3; i++) {
        cr_assert(fabs(p[i] - want[i]) < 1e-6, "p[%d] = %.9g want %.9g", i, p[i], want[i]);
    }
    cr_assert(fabs(m[0] - 0.05) < 1e-8 && fabs(v[0] - 0.0125) < 1e-8);
    /* no decay: wd = 0 leaves the zero-gradient element alone */
    float q = 3.0f, gz = 0.0f, mz = 0.0f, vz = 0.0f;
    kn_adamw(&q, &gz, &mz, &vz, 1, lr, 0.9, 0.95, 1e-8, 0.0, 1);
    cr_assert_eq(q, 3.0f);
}

Test(adamw, sumsq)
{
    size_t n = 100003;
    float *x = randn(n, "x", 3);
    double a = kn_sumsq(x, n), b = kn_sumsq_ref(x, n);
    cr_assert(fabs(a - b) <= 1e-12 * b, "%.17g vs %.17g", a, b);
    cr_assert(fabs(b / n - 9.0) < 0.2, "variance of N(0, 9) samples: %g", b / n);
    free(x);
}

// ----------------------------------------------------------------------------
// the kernels' pool and the threaded kernels: the same bits for any thread count

typedef struct count_ctx {
    int hits[8];
} count_ctx_t;

static void count_part(void *ctx, int part, int nparts)
{
    count_ctx_t *c = ctx;
    cr_assert(nparts == 5 && part >= 0 && part < 5);
    __atomic_add_fetch(&c->hits[part], 1, __ATOMIC_RELAXED);
}

Test(pool, runs_each_part_once_for_any_thread_count)
{
    int saved = kn_pool_threads();
    for (int th = 1; th <= 4; th++) {
        kn_pool_set_threads(th);
        for (int rep = 0; rep < 50; rep++) {
            count_ctx_t c = {{0}};
            kn_parallel(count_part, &c, 5);
            for (int i = 0; i < 5; i++) {
                cr_assert_eq(c.hits[i], 1, "threads %d: part %d ran %d times", th, i, c.hits[i]);
            }
        }
    }
    size_t lo, hi, prev = 0;
    for (int p = 0; p < 3; p++) {
        kn_part_range(1000, 16, p, 3, &lo, &hi);
        cr_assert(lo == prev && lo % 16 == 0 && hi >= lo);
        prev = hi;
    }
    cr_assert_eq(prev, 1000);
    kn_pool_set_threads(saved);
}

/* kn_adamw_fused (clip coefficient, zeroing) equals kn_scale then kn_adamw bit for bit, at
 * 1 and 3 threads, on a size that crosses the pool's threshold and ends mid-block. */
Test(adamw, fused_equals_scale_then_update_for_any_threads)
{
    size_t n = 300007;
    float coef = 0.37f;
    float *p0 = randn(n, "p", 1), *g0 = randn(n, "g", 2), *m0 = randn(n, "m", 0.1f);
    float *v0 = randn(n, "v", 0.1f);
    for (size_t i = 0; i < n; i++) {
        v0[i] = v0[i] * v0[i];
    }
    float *pa = malloc(n * 4), *ga = malloc(n * 4), *ma = malloc(n * 4), *va = malloc(n * 4);
    float *pb = malloc(n * 4), *gb = malloc(n * 4), *mb = malloc(n * 4), *vb = malloc(n * 4);
    cr_assert(pa && ga && ma && va && pb && gb && mb && vb);
    int saved = kn_pool_threads();
    for (int th = 1; th <= 3; th += 2) {
        memcpy(pa, p0, n * 4), memcpy(ga, g0, n * 4), memcpy(ma, m0, n * 4), memcpy(va, v0, n * 4);
        memcpy(pb, p0, n * 4), memcpy(gb, g0, n * 4), memcpy(mb, m0, n * 4), memcpy(vb, v0, n * 4);
        kn_pool_set_threads(1);
        for (size_t i = 0; i < n; i++) {
            gb[i] *= coef; /* the clip as eng_grad_clip did it, one thread */
        }
        kn_adamw(pb, gb, mb, vb, n, 3e-4, 0.9, 0.95, 1e-8, 0.1, 7);
        kn_pool_set_threads(th);
        kn_adamw_fused(pa, ga, ma, va, n, 3e-4, 0.9, 0.95, 1e-8, 0.1, 7, coef, 1);
        cr_assert(memcmp(pa, pb, n * 4) == 0, "p differs at %d threads", th);
        cr_assert(memcmp(ma, mb, n * 4) == 0, "m differs at %d threads", th);
        cr_assert(memcmp(va, vb, n * 4) == 0, "v differs at %d threads", th);
        for (size_t i = 0; i < n; i++) {
            cr_assert_eq(ga[i], 0.0f, "g[%zu] not zeroed", i);
        }
        /* coefficient 1 and no zeroing: kn_adamw exactly, g untouched */
        memcpy(pa, p0, n * 4), memcpy(ga, g0, n * 4), memcpy(ma, m0, n * 4), memcpy(va, v0, n * 4);
        memcpy(pb, p0, n * 4), memcpy(mb, m0, n * 4), memcpy(vb, v0, n * 4);
        kn_adamw(pb, g0, mb, vb, n, 1e-3, 0.9, 0.95, 1e-8, 0.0, 2);
        kn_adamw_fused(pa, ga, ma, va, n, 1e-3, 0.9, 0.95, 1e-8, 0.0, 2, 1.0f, 0);
        cr_assert(memcmp(pa, pb, n * 4) == 0 && memcmp(ga, g0, n * 4) == 0);
    }
    kn_pool_set_threads(saved);
    free(p0), free(g0), free(m0), free(v0), free(pa), free(ga), free(ma), free(va);
    free(pb), free(gb), free(mb), free(vb);
}

Test(adamw, sumsq_same_bits_for_any_threads)
{
    size_t n = 1000003; /* 16 blocks of 65536 and a tail */
    float *x = randn(n, "x", 1);
    int saved = kn_pool_threads();
    kn_pool_set_threads(1);
    double one = kn_sumsq(x, n);
    for (int th = 2; th <= 4; th++) {
        kn_pool_set_threads(th);
        double got = kn_sumsq(x, n);
        cr_assert(memcmp(&got, &one, sizeof got) == 0, "%d threads: %.17g vs %.17g", th, got, one);
    }
    kn_pool_set_threads(saved);
    double ref = kn_sumsq_ref(x, n);
    cr_assert(fabs(one - ref) <= 1e-12 * ref, "%.17g vs %.17g", one, ref);
    /* scale and axpy: elementwise, so the same as a plain loop */
    float *y = randn(n, "y", 1), *z = malloc(n * 4);
    cr_assert_not_null(z);
    memcpy(z, y, n * 4);
    kn_pool_set_threads(3);
    kn_axpy(y, x, n, 0.5f);
    kn_scale(x, n, 0.25f);
    kn_pool_set_threads(saved);
    for (size_t i = 0; i < n; i++) {
        float want = z[i] + 0.5f * (x[i] / 0.25f);
        cr_assert_eq(y[i], want, "axpy at %zu", i);
    }
    free(x), free(y), free(z);
}

/* The fused head: one call gives the forward's lse and losses and the backward's gradients
 * (unscaled, then scaled by the caller) of kn_lmhead_fwd + kn_lmhead_bwd; dwte
 * accumulates over chunks; the bits do not depend on the thread count. */
Test(xent, fwdbwd_matches_forward_then_backward)
{
    int N = 24, C = 16, V = 301, Vp = 320, half = 11;
    float scale = 1.0f / 24;
    int32_t tgt[24];
    for (int i = 0; i < N; i++) {
        tgt[i] = (i * 37) % V;
    }
    float *x = randn((size_t)N * C, "x", 1), *wte = randn((size_t)Vp * C, "wte", 1);
    memset(wte + (size_t)V * C, 0, (size_t)(Vp - V) * C * sizeof(float));
    float *lg = zeros((size_t)N * Vp), lse1[24], loss1[24], lse2[24], loss2[24];
    float *dx1 = zeros((size_t)N * C), *dw1 = zeros((size_t)Vp * C);
    float *dx2 = zeros((size_t)N * C), *dw2 = zeros((size_t)V * C), *dw3 = zeros((size_t)V * C);
    kn_lmhead_fwd(lg, lse1, loss1, x, wte, tgt, N, C, V, Vp);
    kn_lmhead_bwd(dx1, dw1, lg, lse1, x, wte, tgt, scale, N, C, V, Vp);
    /* two chunks, as the model runs it */
    int saved = kn_pool_threads();
    kn_pool_set_threads(3);
    kn_lmhead_fwdbwd(dx2, dw2, lg, lse2, loss2, x, wte, tgt, 0, half, C, V, Vp);
    kn_lmhead_fwdbwd(dx2 + (size_t)half * C, dw2, lg, lse2 + half, loss2 + half,
                     x + (size_t)half * C, wte, tgt + half, 1, N - half, C, V, Vp);
    kn_pool_set_threads(1);
    float *dx3 = zeros((size_t)N * C), lse3[24], loss3[24];
    kn_lmhead_fwdbwd(dx3, dw3, lg, lse3, loss3, x, wte, tgt, 0, half, C, V, Vp);
    kn_lmhead_fwdbwd(dx3 + (size_t)half * C, dw3, lg, lse3 + half, loss3 + half,
                     x + (size_t)half * C, wte, tgt + half, 1, N - half, C, V, Vp);
    kn_pool_set_threads(saved);
    cr_assert(memcmp(dx2, dx3, (size_t)N * C * 4) == 0 && memcmp(dw2, dw3, (size_t)V * C * 4) == 0);
    /* the chunks' SGEMMs have other row counts than the plain forward's: rounding only */
    assert_close_f("fused lse", lse2, lse1, (size_t)N, 1e-6, 0);
    assert_close_f("fused losses", loss2, loss1, (size_t)N, 1e-5, 1e-6);
    kn_scale(dx2, (size_t)N * C, scale);
    kn_scale(dw2, (size_t)V * C, scale);
    assert_close_f("fused dx", dx2, dx1, (size_t)N * C, 1e-5, 1e-7);
    assert_close_f("fused dwte", dw2, dw1, (size_t)V * C, 1e-5, 1e-7);
    free(x), free(wte), free(lg), free(dx1), free(dw1), free(dx2), free(dw2), free(dw3), free(dx3);
}

/* The elementwise kernels split over the pool give the one-thread bits, in place too. */
Test(pool, elementwise_kernels_same_bits_for_any_threads)
{
    size_t n = 200003;
    float *x = randn(n, "x", 2), *d = randn(n, "d", 1);
    float *f1 = zeros(n), *f3 = zeros(n), *b1 = zeros(n), *b3 = randn(n, "d", 1);
    int saved = kn_pool_threads();
    kn_pool_set_threads(1);
    kn_gelu_fwd(f1, x, n);
    kn_gelu_bwd(b1, x, d, n);
    kn_pool_set_threads(3);
    kn_gelu_fwd(f3, x, n);
    kn_gelu_bwd(b3, x, b3, n); /* dinp aliasing dout, as the model calls it */
    cr_assert(memcmp(f1, f3, n * 4) == 0 && memcmp(b1, b3, n * 4) == 0);
    kn_residual_fwd(f3, f3, x, n);
    kn_pool_set_threads(saved);
    kn_residual_fwd_ref(f1, f1, x, n);
    cr_assert(memcmp(f1, f3, n * 4) == 0);
    free(x), free(d), free(f1), free(f3), free(b1), free(b3);
}
