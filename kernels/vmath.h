/* Vectorisable math helpers shared by the fast CPU kernels (the files in kernels/cpu only).
 *
 * The kernels are built with -O3 -march=native -ffp-contract=off and without -ffast-math,
 * so the compiler will not vectorise calls to expf/tanhf nor reorder float reductions.
 * These helpers are written so that a loop calling them vectorises anyway:
 * - kn_vexpf: exp(x) by Cody-Waite range reduction (x = n*ln2 + r, |r| <= ln2/2) and a
 *   degree-7 Taylor polynomial; relative error ~2e-7 (a few ulp) for x in [-87, 88],
 *   inputs are clamped to that range (exp(-87.3) ~ 1e-38 stands in for 0).
 * - lane reductions: KN_LANES independent partial sums, combined at the end, which the
 *   compiler maps onto one or two vector registers. Their order is fixed, so results are
 *   deterministic, but they differ from a sequential sum by rounding. */
#ifndef KN_VMATH_H
#define KN_VMATH_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define KN_LANES 16

static inline float kn_vexpf(float x)
{
    const float magic = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
    x = x < -87.3f ? -87.3f : x;
    x = x > 88.3f ? 88.3f : x; /* keeps 2^n finite */
    float t = x * 1.44269504088896341f + magic;
    float n = t - magic;
    float r = x - n * 0.693359375f; /* ln2 split: hi part exact in float */
    r = r - n * -2.12194440e-4f;
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    int32_t ti, mi;
    memcpy(&ti, &t, sizeof ti);
    memcpy(&mi, &magic, sizeof mi);
    int32_t bits = (ti - mi + 127) << 23; /* 2^n */
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

/* sum of x[0..n) */
static inline float kn_vsum(const float *x, size_t n)
{
    float acc[KN_LANES] = {0};
    size_t i = 0;
    for (; i + KN_LANES <= n; i += KN_LANES) {
        for (int j = 0; j < KN_LANES; j++) {
            acc[j] += x[i + j];
        }
    }
    float s = 0.0f;
    for (int j = 0; j < KN_LANES; j++) {
        s += acc[j];
    }
    for (; i < n; i++) {
        s += x[i];
    }
    return s;
}

/* sum of x[i]*y[i] */
static inline float kn_vdot(const float *x, const float *y, size_t n)
{
    float acc[KN_LANES] = {0};
    size_t i = 0;
    for (; i + KN_LANES <= n; i += KN_LANES) {
        for (int j = 0; j < KN_LANES; j++) {
            acc[j] += x[i + j] * y[i + j];
        }
    }
    float s = 0.0f;
    for (int j = 0; j < KN_LANES; j++) {
        s += acc[j];
    }
    for (; i < n; i++) {
        s += x[i] * y[i];
    }
    return s;
}

/* max of x[0..n), n >= 1 */
static inline float kn_vmax(const float *x, size_t n)
{
    float acc[KN_LANES];
    for (int j = 0; j < KN_LANES; j++) {
        acc[j] = x[0];
    }
    size_t i = 0;
    for (; i + KN_LANES <= n; i += KN_LANES) {
        for (int j = 0; j < KN_LANES; j++) {
            acc[j] = x[i + j] > acc[j] ? x[i + j] : acc[j];
        }
    }
    float m = acc[0];
    for (int j = 1; j < KN_LANES; j++) {
        m = acc[j] > m ? acc[j] : m;
    }
    for (; i < n; i++) {
        m = x[i] > m ? x[i] : m;
    }
    return m;
}

/* out[i] = exp(x[i] - shift) (out may alias x); returns the sum of out */
static inline float kn_vexp_sum(float *out, const float *x, float shift, size_t n)
{
    float acc[KN_LANES] = {0};
    size_t i = 0;
    for (; i + KN_LANES <= n; i += KN_LANES) {
        for (int j = 0; j < KN_LANES; j++) {
            float e = kn_vexpf(x[i + j] - shift);
            out[i + j] = e;
            acc[j] += e;
        }
    }
    float s = 0.0f;
    for (int j = 0; j < KN_LANES; j++) {
        s += acc[j];
    }
    for (; i < n; i++) {
        float e = kn_vexpf(x[i] - shift);
        out[i] = e;
        s += e;
    }
    return s;
}

#endif
