/* Residual add (kernels/residual.h). */
#include "kernels/pool.h"
#include "kernels/residual.h"

void kn_residual_fwd_ref(float *out, const float *a, const float *b, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        out[i] = a[i] + b[i];
    }
}

/* out may alias a or b, so no restrict; the loop still vectorises (gcc checks overlap at
 * run time and exact aliasing is harmless for an elementwise op). */
static void residual_range(float *out, const float *a, const float *b, size_t lo, size_t hi)
{
    size_t i = lo;
    for (; i + 16 <= hi; i += 16) {
        for (int j = 0; j < 16; j++) {
            out[i + j] = a[i + j] + b[i + j];
        }
    }
    for (; i < hi; i++) {
        out[i] = a[i] + b[i];
    }
}

typedef struct residual_job {
    float *out;
    const float *a, *b;
    size_t n;
} residual_job_t;

static void residual_part(void *ctx, int part, int nparts)
{
    const residual_job_t *j = ctx;
    size_t lo, hi;
    kn_part_range(j->n, 16, part, nparts, &lo, &hi);
    residual_range(j->out, j->a, j->b, lo, hi);
}

void kn_residual_fwd(float *out, const float *a, const float *b, size_t n)
{
    residual_job_t j = {out, a, b, n};
    kn_parallel(residual_part, &j, kn_pool_parts(n, (size_t)1 << 15));
}

typedef struct axpy_job {
    float *y;
    const float *x;
    size_t n;
    float a;
} axpy_job_t;

static void axpy_part(void *ctx, int part, int nparts)
{
    const axpy_job_t *j = ctx;
    size_t lo, hi;
    kn_part_range(j->n, 16, part, nparts, &lo, &hi);
    float *restrict y = j->y;
    const float *restrict x = j->x;
    float a = j->a;
    for (size_t i = lo; i < hi; i++) {
        y[i] += a * x[i];
    }
}

void kn_axpy(float *y, const float *x, size_t n, float a)
{
    axpy_job_t j = {y, x, n, a};
    kn_parallel(axpy_part, &j, kn_pool_parts(n, (size_t)1 << 15));
}
