/* GEMM self-check (job kind "diag", DESIGN §10): each round multiplies two seeded
 * random n x n fp32 matrices with the BLAS and verifies the product independently
 * with Freivalds' test, reporting the round's GFLOP/s. wrk_diag_run is declared in
 * rank.h; this header exposes the checker so it can be tested on its own. */
#ifndef WRK_DIAG_H
#define WRK_DIAG_H

#include <stddef.h>
#include <stdint.h>

/* Default tolerance of wrk_diag_check: far above fp32 rounding of a correct product
 * (~1e-7 relative at n = 4096), far below a single wrong element of ordinary size. */
#define WRK_DIAG_TOL 1e-4

/* Check C == A*B for row-major n x n matrices (Freivalds). For each of `trials`
 * vectors x (entries of magnitude in [0.5, 1) with random signs, drawn from seed),
 * compares C*x with A*(B*x), both in double with plain loops, and measures
 *     err = max_i |(C*x)_i - (A*(B*x))_i| / rms(A*(B*x)).
 * Because |x_j| >= 0.5, an error d in any single element of C moves some component by
 * at least d/2, so it cannot hide. *rel_err (may be NULL) gets the worst err.
 * Returns 0 when err <= tol for every trial, CH_E_NUMERIC when not, -ENOMEM. */
int wrk_diag_check(const float *A, const float *B, const float *C, size_t n, uint64_t seed,
                   int trials, double tol, double *rel_err);

/* Fill m[0..count) with uniform values in [-1, 1) from a generator seeded by seed. */
void wrk_diag_fill(float *m, size_t count, uint64_t seed);

#endif
