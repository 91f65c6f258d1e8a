/* workerd/diag: the GEMM self-check accepts a correct BLAS product and catches a
 * product with a single wrong element, wherever it is and whatever its size. */
#include <cblas.h>
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "diag.h"
#include "common/err.h"

typedef struct mats {
    size_t n;
    float *A, *B, *C;
} mats_t;

/* Seeded A, B and C = A*B from the BLAS, as a diag round makes them. */
static mats_t make(size_t n, uint64_t seed)
{
    mats_t m = {n, malloc(n * n * sizeof(float)), malloc(n * n * sizeof(float)),
                malloc(n * n * sizeof(float))};
    cr_assert(m.A && m.B && m.C);
    wrk_diag_fill(m.A, n * n, seed);
    wrk_diag_fill(m.B, n * n, seed + 1);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, (int)n, (int)n, 1.0f, m.A,
                (int)n, m.B, (int)n, 0.0f, m.C, (int)n);
    return m;
}

static void drop(mats_t *m)
{
    free(m->A);
    free(m->B);
    free(m->C);
}

Test(diag, fill_is_seeded_and_in_range)
{
    float a[1000], b[1000], c[1000];
    wrk_diag_fill(a, 1000, 7);
    wrk_diag_fill(b, 1000, 7);
    wrk_diag_fill(c, 1000, 8);
    cr_expect_eq(memcmp(a, b, sizeof a), 0, "same seed, same data");
    cr_expect_neq(memcmp(a, c, sizeof a), 0, "other seed, other data");
    double mean = 0;
    for (int i = 0; i < 1000; i++) {
        cr_assert(a[i] >= -1.0f && a[i] < 1.0f);
        mean += a[i] / 1000.0;
    }
    cr_expect_lt(fabs(mean), 0.1);
}

Test(diag, accepts_correct_products)
{
    size_t sizes[] = {1, 7, 64, 257};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        mats_t m = make(sizes[i], 100 + i);
        double err = -1;
        cr_expect_eq(wrk_diag_check(m.A, m.B, m.C, m.n, 5, 2, WRK_DIAG_TOL, &err), 0,
                     "n=%zu rejected (err %g)", m.n, err);
        /* fp32 rounding sits orders of magnitude below the tolerance. */
        cr_expect_lt(err, WRK_DIAG_TOL / 100, "n=%zu err %g", m.n, err);
        drop(&m);
    }
}

Test(diag, rejects_one_corrupted_element)
{
    mats_t m = make(128, 42);
    size_t where[] = {0, 128 * 128 - 1, 37 * 128 + 101, 64 * 128 + 3};
    for (size_t i = 0; i < sizeof where / sizeof where[0]; i++) {
        float keep = m.C[where[i]];
        /* An error of a tenth of a typical element (|C| ~ sqrt(128)/3 ~ 3.8). */
        m.C[where[i]] = keep + 0.4f;
        double err = 0;
        cr_expect_eq(wrk_diag_check(m.A, m.B, m.C, m.n, 9, 2, WRK_DIAG_TOL, &err), CH_E_NUMERIC,
                     "corruption at %zu not caught (err %g)", where[i], err);
        cr_expect_gt(err, WRK_DIAG_TOL);
        m.C[where[i]] = keep;
    }
    cr_expect_eq(wrk_diag_check(m.A, m.B, m.C, m.n, 9, 2, WRK_DIAG_TOL, NULL), 0,
                 "restored product accepted again");
    drop(&m);
}

Test(diag, rejects_nan_and_swapped_operands)
{
    mats_t m = make(48, 3);
    m.C[100] = NAN;
    cr_expect_eq(wrk_diag_check(m.A, m.B, m.C, m.n, 1, 2, WRK_DIAG_TOL, NULL), CH_E_NUMERIC);
    drop(&m);

    /* B*A is not A*B: a transposition bug in a GEMM call is caught. */
    m = make(48, 4);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, 48, 48, 48, 1.0f, m.B, 48, m.A, 48, 0.0f,
                m.C, 48);
    cr_expect_eq(wrk_diag_check(m.A, m.B, m.C, m.n, 1, 2, WRK_DIAG_TOL, NULL), CH_E_NUMERIC);
    drop(&m);
}
