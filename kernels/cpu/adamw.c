/* AdamW update and sum of squares (kernels/adamw.h). */
#include <math.h>
#if defined(__AVX__)
#include <immintrin.h>
#endif

#include "kernels/adamw.h"

// ----------------------------------------------------------------------------
// reference: textbook AdamW in double, rounded to float once per state variable

void kn_adamw_ref(float *p, const float *g, float *m, float *v, size_t n, double lr, double beta1,
                  double beta2, double eps, double wd, uint64_t t)
{
    double bc1 = 1.0 - pow(beta1, (double)t);
    double bc2 = 1.0 - pow(beta2, (double)t);
    for (size_t i = 0; i < n; i++) {
        double pi = p[i];
        pi -= lr * wd * pi;
        double mi = beta1 * m[i] + (1.0 - beta1) * g[i];
        double vi = beta2 * v[i] + (1.0 - beta2) * (double)g[i] * g[i];
        double mhat = mi / bc1;
        double vhat = vi / bc2;
        pi -= lr * mhat / (sqrt(vhat) + eps);
        p[i] = (float)pi;
        m[i] = (float)mi;
        v[i] = (float)vi;
    }
}

double kn_sumsq_ref(const float *x, size_t n)
{
    double s = 0.0;
    for (size_t i = 0; i < n; i++) {
        s += (double)x[i] * x[i];
    }
    return s;
}

// ----------------------------------------------------------------------------
// fast: torch's single-tensor sequence in fp32 (see the header).
// Without -fno-math-errno the compiler will not vectorise sqrtf (it keeps a path that
// sets errno), so the square roots of each block of 16 go through sqrt16, which uses
// the IEEE (correctly rounded, like sqrtf) vector instruction where there is one.

#define ABLOCK 16

static void sqrt16(float *restrict out, const float *restrict in)
{
#if defined(__AVX512F__)
    _mm512_storeu_ps(out, _mm512_sqrt_ps(_mm512_loadu_ps(in)));
#elif defined(__AVX__)
    _mm256_storeu_ps(out, _mm256_sqrt_ps(_mm256_loadu_ps(in)));
    _mm256_storeu_ps(out + 8, _mm256_sqrt_ps(_mm256_loadu_ps(in + 8)));
#else
    for (int j = 0; j < ABLOCK; j++) {
        out[j] = sqrtf(in[j]);
    }
#endif
}

typedef struct adamw_consts {
    float decay, b1, one_minus_b1, b2, one_minus_b2, bc2_sqrt, neg_step, eps;
} adamw_consts_t;

/* n <= ABLOCK elements */
static void adamw_block(float *restrict p, const float *restrict g, float *restrict m,
                        float *restrict v, int n, const adamw_consts_t *k)
{
    float root[ABLOCK], vv[ABLOCK] = {0};
    for (int j = 0; j < n; j++) {
        float gj = g[j];
        m[j] = m[j] * k->b1 + gj * k->one_minus_b1;
        vv[j] = v[j] * k->b2 + k->one_minus_b2 * gj * gj;
        v[j] = vv[j];
    }
    sqrt16(root, vv);
    for (int j = 0; j < n; j++) {
        float denom = root[j] / k->bc2_sqrt + k->eps;
        p[j] = p[j] * k->decay + k->neg_step * m[j] / denom;
    }
}

void kn_adamw(float *p, const float *g, float *m, float *v, size_t n, double lr, double beta1,
              double beta2, double eps, double wd, uint64_t t)
{
    const adamw_consts_t k = {
        .decay = (float)(1.0 - lr * wd),
        .b1 = (float)beta1,
        .one_minus_b1 = (float)(1.0 - beta1),
        .b2 = (float)beta2,
        .one_minus_b2 = (float)(1.0 - beta2),
        .bc2_sqrt = (float)sqrt(1.0 - pow(beta2, (double)t)),
        .neg_step = (float)(-(lr / (1.0 - pow(beta1, (double)t)))),
        .eps = (float)eps,
    };
    for (size_t i = 0; i < n; i += ABLOCK) {
        int nb = n - i < ABLOCK ? (int)(n - i) : ABLOCK;
        adamw_block(p + i, g + i, m + i, v + i, nb, &k);
    }
}

double kn_sumsq(const float *x, size_t n)
{
    double acc[8] = {0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        for (int j = 0; j < 8; j++) {
            acc[j] += (double)x[i + j] * x[i + j];
        }
    }
    double s = 0.0;
    for (int j = 0; j < 8; j++) {
        s += acc[j];
    }
    for (; i < n; i++) {
        s += (double)x[i] * x[i];
    }
    return s;
}
