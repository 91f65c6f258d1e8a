/* The node's SGEMM peak, the reference of a rank's MFU (DESIGN §7), measured once per node
 * and thread count and cached, so that equal-speed jobs report equal MFU.
 *
 * The cache is a file in the node's run directory (workerd --run-dir, the ancestor of every
 * rank's run directory: <run-dir>/<job>/g<gen>/rank-<r>/), named sgemm-peak-t<threads>,
 * one line "flops=<FLOP/s> n=<matrix> seconds=<measured>". The first rank that finds no
 * cache measures under an exclusive lock on <file>.lock (the node's other ranks wait for it
 * and read the result instead of measuring at the same time) and writes it atomically.
 * A restart's rank measures briefly (1024^3) and a first generation measures again when
 * the cached figure came from a smaller matrix than it would use. Delete the file to
 * measure again (after a hardware or BLAS change). */
#ifndef WRK_PEAK_H
#define WRK_PEAK_H

#include "workerd/rank/rank.h"

#define WRK_PEAK_N       2048 /* n x n x n SGEMM, the size chorus-bench-engine uses */
#define WRK_PEAK_SECONDS 1.0  /* best of the runs within this long (at least 5) */
/* A job whose fault.step_timeout is under 8 x WRK_PEAK_SECONDS measures a 1024^3 SGEMM for
 * an eighth of it instead: the measurement happens before the first step, which the
 * timeout covers. */

/* FLOP/s of the best n^3 SGEMM (kn_matmul_fwd on the kernels' current thread count) of
 * the runs within `seconds` (at least 5 runs, but stopping after 4 x seconds on a loaded
 * node). 0 when out of memory. */
double wrk_peak_measure(int n, double seconds);

/* The node's peak at `threads` BLAS threads: the cached figure, else measured and cached.
 * When the cache cannot be read or written (a run directory the job's user may not write)
 * it measures anyway and logs why. 0 only when it could not measure. */
double wrk_peak_flops(const wrk_rank_t *r, int threads);

/* The cache file of a node run directory and thread count (for the diag job and tests). */
int wrk_peak_path(const char *node_dir, int threads, char *out, size_t len);

/* Read a cache file: *flops > 0, or a negative code (-ENOENT, CH_E_FORMAT). */
int wrk_peak_read(const char *path, double *flops);

#endif
