/* Linear layer in Hugging Face Conv1D layout: out[N,OC] = inp[N,C] @ weight[C,OC] + bias[OC].
 * N = rows (B*T). The fast version is OpenBLAS SGEMM and uses whatever thread count
 * OpenBLAS is set to (kn_blas_set_threads); the reference is a plain triple loop with
 * double accumulators, agreement within ~1e-5 relative. */
#ifndef KN_MATMUL_H
#define KN_MATMUL_H

/* bias may be NULL */
void kn_matmul_fwd(float *out, const float *inp, const float *weight, const float *bias, int N,
                   int C, int OC);
void kn_matmul_fwd_ref(float *out, const float *inp, const float *weight, const float *bias, int N,
                       int C, int OC);
/* dinp = dout @ weight^T (overwrites); dweight += inp^T @ dout; dbias += column sums of dout
 * (accumulate; dbias may be NULL). dinp NULL: the weight gradients alone (weight unread);
 * dweight and dbias NULL: dinp alone (a split backward's two passes, the same bits). */
void kn_matmul_bwd(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                   const float *weight, int N, int C, int OC);
void kn_matmul_bwd_ref(float *dinp, float *dweight, float *dbias, const float *dout,
                       const float *inp, const float *weight, int N, int C, int OC);

/* The kernels' thread count: OpenBLAS's and the pool's of the other fast kernels
 * (kernels/pool.h). The caller (training loop, bench) decides. */
void kn_blas_set_threads(int n);
int kn_blas_threads(void);

#endif
