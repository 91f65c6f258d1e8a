/* Causal multi-head self-attention, forward and backward (kernels/attention.h).
 *
 * Theory of operation (fast version). For one (b, head), with Q, K, V the [T,hs] slices
 * of qkv (row stride 3C) and scale = 1/sqrt(hs):
 *   forward   S = scale Q K^T (masked),  P = softmax_rows(S),  Y = P V
 *   backward  dP = dY V^T,  dV = P^T dY,  dS = P * (dP - rowsum(P * dP)) * scale,
 *             dQ = dS K,  dK = dS^T Q
 * Query rows are processed in blocks [r0, r1); a block only sees keys [0, r1), so every
 * SGEMM is restricted to those columns, which skips most of the masked upper triangle.
 * Within a block, masked entries (key > query) are set to zero so they add nothing.
 * The backward walks the blocks last to first: the last block touches every key row, so
 * it writes dK/dV (beta 0) and earlier blocks accumulate (beta 1).
 *
 * Without att (selective recomputation keeps no probabilities) the forward puts each
 * block's probabilities in scratch and uses them at once; the backward recomputes each
 * block's just before its backward, with the forward's SGEMM and softmax on the same
 * inputs (probs_block): the same bits as the kept ones, and no B*NH*T*T buffer. */
#include <cblas.h>
#include <math.h>
#include <string.h>

#include "kernels/attention.h"
#include "kernels/vmath.h"

// ----------------------------------------------------------------------------
// reference (llm.c style loops)

void kn_attention_fwd_ref(float *out, float *att, const float *qkv, int B, int T, int C, int NH)
{
    int C3 = C * 3;
    int hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            for (int h = 0; h < NH; h++) {
                const float *q = qkv + ((size_t)b * T + t) * C3 + h * hs;
                float *att_row = att + (((size_t)b * NH + h) * T + t) * T;

                // scores and max
                float maxval = -INFINITY;
                for (int t2 = 0; t2 <= t; t2++) {
                    const float *k = qkv + ((size_t)b * T + t2) * C3 + h * hs + C;
                    float val = 0.0f;
                    for (int i = 0; i < hs; i++) {
                        val += q[i] * k[i];
                    }
                    val *= scale;
                    maxval = val > maxval ? val : maxval;
                    att_row[t2] = val;
                }
                // exp and normalise; masked entries are zero
                float sum = 0.0f;
                for (int t2 = 0; t2 <= t; t2++) {
                    float e = expf(att_row[t2] - maxval);
                    att_row[t2] = e;
                    sum += e;
                }
                float inv = 1.0f / sum;
                for (int t2 = 0; t2 < T; t2++) {
                    att_row[t2] = t2 <= t ? att_row[t2] * inv : 0.0f;
                }
                // weighted sum of values
                float *o = out + ((size_t)b * T + t) * C + h * hs;
                for (int i = 0; i < hs; i++) {
                    o[i] = 0.0f;
                }
                for (int t2 = 0; t2 <= t; t2++) {
                    const float *v = qkv + ((size_t)b * T + t2) * C3 + h * hs + 2 * C;
                    for (int i = 0; i < hs; i++) {
                        o[i] += att_row[t2] * v[i];
                    }
                }
            }
        }
    }
}

static float dot(const float *a, const float *b, int n)
{
    float s = 0.0f;
    for (int i = 0; i < n; i++) {
        s += a[i] * b[i];
    }
    return s;
}

void kn_attention_bwd_ref(float *dqkv, const float *dout, const float *qkv, const float *att, int B,
                          int T, int C, int NH)
{
    int C3 = C * 3;
    int hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    memset(dqkv, 0, (size_t)B * T * C3 * sizeof(float));
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            for (int h = 0; h < NH; h++) {
                const float *att_row = att + (((size_t)b * NH + h) * T + t) * T;
                const float *dy = dout + ((size_t)b * T + t) * C + h * hs;
                const float *q = qkv + ((size_t)b * T + t) * C3 + h * hs;
                float *dq = dqkv + ((size_t)b * T + t) * C3 + h * hs;

                // datt[t2] = dy . v[t2]; softmax backward needs sum_k att[k] datt[k]
                float s = 0.0f;
                for (int t2 = 0; t2 <= t; t2++) {
                    const float *v = qkv + ((size_t)b * T + t2) * C3 + h * hs + 2 * C;
                    s += att_row[t2] * dot(dy, v, hs);
                }
                for (int t2 = 0; t2 <= t; t2++) {
                    size_t row2 = ((size_t)b * T + t2) * C3 + h * hs;
                    const float *k = qkv + row2 + C;
                    const float *v = qkv + row2 + 2 * C;
                    float *dk = dqkv + row2 + C;
                    float *dv = dqkv + row2 + 2 * C;
                    float datt = dot(dy, v, hs);
                    float dpre = att_row[t2] * (datt - s) * scale;
                    for (int i = 0; i < hs; i++) {
                        dv[i] += att_row[t2] * dy[i];
                        dq[i] += dpre * k[i];
                        dk[i] += dpre * q[i];
                    }
                }
            }
        }
    }
}

// ----------------------------------------------------------------------------
// fast

/* p[0..n) = softmax of p[0..n) in place; p[n..zero_to) = 0 */
static void softmax_row(float *p, int n, int zero_to)
{
    float maxval = kn_vmax(p, (size_t)n);
    float sum = kn_vexp_sum(p, p, maxval, (size_t)n);
    float inv = 1.0f / sum;
    for (int i = 0; i < n; i++) {
        p[i] *= inv;
    }
    for (int i = n; i < zero_to; i++) {
        p[i] = 0.0f;
    }
}

/* Rows [r0, r1) of one head's probabilities into pb [r1-r0, >= r1] (ld T): the forward's
 * SGEMM and softmax, so that a recomputation (att NULL) has the same bits. */
static void probs_block(float *pb, const float *q, const float *k, int r0, int r1, int T, int C3,
                        int hs, float scale)
{
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, r1 - r0, r1, hs, scale,
                q + (size_t)r0 * C3, C3, k, C3, 0.0f, pb, T);
    for (int t = r0; t < r1; t++) {
        softmax_row(pb + (size_t)(t - r0) * T, t + 1, r1);
    }
}

void kn_attention_fwd(float *out, float *att, float *scratch, const float *qkv, int B, int T, int C,
                      int NH)
{
    int C3 = C * 3;
    int hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            const float *q = qkv + (size_t)b * T * C3 + h * hs;
            const float *k = q + C;
            const float *v = q + 2 * C;
            float *p = att != NULL ? att + ((size_t)b * NH + h) * T * T : NULL;
            float *y = out + (size_t)b * T * C + h * hs;
            for (int r0 = 0; r0 < T; r0 += KN_ATTENTION_QBLOCK) {
                int r1 = r0 + KN_ATTENTION_QBLOCK < T ? r0 + KN_ATTENTION_QBLOCK : T;
                float *pb = p != NULL ? p + (size_t)r0 * T : scratch;
                probs_block(pb, q, k, r0, r1, T, C3, hs, scale);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, r1 - r0, hs, r1, 1.0f, pb, T,
                            v, C3, 0.0f, y + (size_t)r0 * C, C);
            }
        }
    }
}

/* ds[0..n) = p * (dp - sum(p * dp)) * scale, in place over dp; ds[n..zero_to) = 0 */
static void softmax_row_bwd(float *restrict dp, const float *restrict p, int n, int zero_to,
                            float scale)
{
    float s = kn_vdot(p, dp, (size_t)n);
    for (int i = 0; i < n; i++) {
        dp[i] = p[i] * (dp[i] - s) * scale;
    }
    for (int i = n; i < zero_to; i++) {
        dp[i] = 0.0f;
    }
}

void kn_attention_bwd(float *dqkv, float *scratch, const float *dout, const float *qkv,
                      const float *att, int B, int T, int C, int NH)
{
    int C3 = C * 3;
    int hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    int nblocks = (T + KN_ATTENTION_QBLOCK - 1) / KN_ATTENTION_QBLOCK;
    /* dP of one block of query rows; with att NULL, that block's probabilities after it */
    float *redo = scratch + (size_t)(T < KN_ATTENTION_QBLOCK ? T : KN_ATTENTION_QBLOCK) * T;
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            const float *q = qkv + (size_t)b * T * C3 + h * hs;
            const float *k = q + C;
            const float *v = q + 2 * C;
            float *dq = dqkv + (size_t)b * T * C3 + h * hs;
            float *dk = dq + C;
            float *dv = dq + 2 * C;
            const float *p = att != NULL ? att + ((size_t)b * NH + h) * T * T : NULL;
            const float *dy = dout + (size_t)b * T * C + h * hs;
            for (int blk = nblocks - 1; blk >= 0; blk--) {
                int r0 = blk * KN_ATTENTION_QBLOCK;
                int r1 = r0 + KN_ATTENTION_QBLOCK < T ? r0 + KN_ATTENTION_QBLOCK : T;
                int rb = r1 - r0;
                float beta = blk == nblocks - 1 ? 0.0f : 1.0f;
                const float *pb = p != NULL ? p + (size_t)r0 * T : redo;
                const float *dyb = dy + (size_t)r0 * C;
                if (p == NULL) { /* recompute this block's probabilities, cache-hot */
                    probs_block(redo, q, k, r0, r1, T, C3, hs, scale);
                }
                // dP = dY V^T over the visible keys, into scratch [rb, r1] (ld T)
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rb, r1, hs, 1.0f, dyb, C, v,
                            C3, 0.0f, scratch, T);
                // dV[0:r1] (+)= P^T dY
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, r1, hs, rb, 1.0f, pb, T, dyb,
                            C, beta, dv, C3);
                for (int t = r0; t < r1; t++) {
                    softmax_row_bwd(scratch + (size_t)(t - r0) * T, pb + (size_t)(t - r0) * T,
                                    t + 1, r1, scale);
                }
                // dQ = dS K;  dK[0:r1] (+)= dS^T Q
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rb, hs, r1, 1.0f, scratch, T,
                            k, C3, 0.0f, dq + (size_t)r0 * C3, C3);
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, r1, hs, rb, 1.0f, scratch, T,
                            q + (size_t)r0 * C3, C3, beta, dk, C3);
            }
        }
    }
}
