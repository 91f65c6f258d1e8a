/* AdamW update and sum of squares (kernels/adamw.h). */
#include <math.h>
#include <stdlib.h>
#if defined(__AVX__)
#include <immintrin.h>
#endif

#include "kernels/adamw.h"
#include "kernels/pool.h"

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

/* n <= ABLOCK elements. The gradient is read once into gl (times gscale: exact when 1) and
 * zeroed after that when zero_g, so g may not be restrict. */
static void adamw_block(float *restrict p, float *g, float *restrict m, float *restrict v, int n,
                        const adamw_consts_t *k, float gscale, int zero_g)
{
    float root[ABLOCK], vv[ABLOCK] = {0}, gl[ABLOCK];
    for (int j = 0; j < n; j++) {
        gl[j] = g[j] * gscale;
    }
    if (zero_g) {
        for (int j = 0; j < n; j++) {
            g[j] = 0.0f;
        }
    }
    for (int j = 0; j < n; j++) {
        float gj = gl[j];
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

typedef struct adamw_job {
    float *p, *g, *m, *v;
    size_t n;
    adamw_consts_t k;
    float gscale;
    int zero_g;
} adamw_job_t;

static void adamw_part(void *ctx, int part, int nparts)
{
    const adamw_job_t *j = ctx;
    size_t lo, hi;
    kn_part_range(j->n, ABLOCK, part, nparts, &lo, &hi);
    for (size_t i = lo; i < hi; i += ABLOCK) {
        int nb = hi - i < ABLOCK ? (int)(hi - i) : ABLOCK;
        adamw_block(j->p + i, j->g + i, j->m + i, j->v + i, nb, &j->k, j->gscale, j->zero_g);
    }
}

/* below this many elements per thread the pool's hand-off costs more than it saves */
#define PAR_MIN ((size_t)1 << 15)

static void adamw_run(float *p, float *g, float *m, float *v, size_t n, double lr, double beta1,
                      double beta2, double eps, double wd, uint64_t t, float gscale, int zero_g)
{
    adamw_job_t j = {
        .p = p,
        .g = g,
        .m = m,
        .v = v,
        .n = n,
        .k =
            {
                .decay = (float)(1.0 - lr * wd),
                .b1 = (float)beta1,
                .one_minus_b1 = (float)(1.0 - beta1),
                .b2 = (float)beta2,
                .one_minus_b2 = (float)(1.0 - beta2),
                .bc2_sqrt = (float)sqrt(1.0 - pow(beta2, (double)t)),
                .neg_step = (float)(-(lr / (1.0 - pow(beta1, (double)t)))),
                .eps = (float)eps,
            },
        .gscale = gscale,
        .zero_g = zero_g,
    };
    kn_parallel(adamw_part, &j, kn_pool_parts(n, PAR_MIN));
}

void kn_adamw(float *p, const float *g, float *m, float *v, size_t n, double lr, double beta1,
              double beta2, double eps, double wd, uint64_t t)
{
    /* zero_g = 0: g is only read */
    adamw_run(p, (float *)g, m, v, n, lr, beta1, beta2, eps, wd, t, 1.0f, 0);
}

void kn_adamw_fused(float *p, float *g, float *m, float *v, size_t n, double lr, double beta1,
                    double beta2, double eps, double wd, uint64_t t, float gscale, int zero_g)
{
    adamw_run(p, g, m, v, n, lr, beta1, beta2, eps, wd, t, gscale, zero_g);
}

// ----------------------------------------------------------------------------
// sum of squares: fixed blocks, each summed in 8 double lanes, block sums added in order

#define SUMSQ_BLOCK ((size_t)1 << 16)

static double sumsq_lanes(const float *x, size_t n)
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

typedef struct sumsq_job {
    const float *x;
    size_t n, nblocks;
    double *block_sum;
} sumsq_job_t;

static void sumsq_part(void *ctx, int part, int nparts)
{
    const sumsq_job_t *j = ctx;
    size_t lo, hi;
    kn_part_range(j->nblocks, 1, part, nparts, &lo, &hi);
    for (size_t b = lo; b < hi; b++) {
        size_t off = b * SUMSQ_BLOCK, len = j->n - off < SUMSQ_BLOCK ? j->n - off : SUMSQ_BLOCK;
        j->block_sum[b] = sumsq_lanes(j->x + off, len);
    }
}

double kn_sumsq(const float *x, size_t n)
{
    size_t nblocks = (n + SUMSQ_BLOCK - 1) / SUMSQ_BLOCK;
    if (nblocks <= 1) {
        return sumsq_lanes(x, n);
    }
    double local[512], *sums = nblocks <= 512 ? local : malloc(nblocks * sizeof *sums);
    double s = 0.0;
    if (sums == NULL) { /* the same blocks in the same order, on this thread */
        for (size_t b = 0; b < nblocks; b++) {
            size_t off = b * SUMSQ_BLOCK;
            s += sumsq_lanes(x + off, n - off < SUMSQ_BLOCK ? n - off : SUMSQ_BLOCK);
        }
        return s;
    }
    sumsq_job_t j = {x, n, nblocks, sums};
    kn_parallel(sumsq_part, &j, kn_pool_parts(n, PAR_MIN));
    for (size_t b = 0; b < nblocks; b++) {
        s += sums[b];
    }
    if (sums != local) {
        free(sums);
    }
    return s;
}

// ----------------------------------------------------------------------------
// scaling

typedef struct scale_job {
    float *x;
    size_t n;
    float c;
} scale_job_t;

static void scale_part(void *ctx, int part, int nparts)
{
    const scale_job_t *j = ctx;
    size_t lo, hi;
    kn_part_range(j->n, ABLOCK, part, nparts, &lo, &hi);
    float *restrict x = j->x;
    float c = j->c;
    for (size_t i = lo; i < hi; i++) {
        x[i] *= c;
    }
}

void kn_scale(float *x, size_t n, float c)
{
    scale_job_t j = {x, n, c};
    kn_parallel(scale_part, &j, kn_pool_parts(n, PAR_MIN));
}
