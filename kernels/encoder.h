/* Token + position embedding (GPT-2's wte/wpe). B = batch, T = time, C = channels.
 * Each op has a plain reference (_ref) and a fast version; both are exact (no
 * reordering), so they agree bit for bit. */
#ifndef KN_ENCODER_H
#define KN_ENCODER_H

#include <stdint.h>

/* out[b,t,:] = wte[inp[b,t],:] + wpe[t,:]; inp [B,T], wte [V,C], wpe [>=T,C], out [B,T,C] */
void kn_encoder_fwd(float *out, const int32_t *inp, const float *wte, const float *wpe, int B,
                    int T, int C);
void kn_encoder_fwd_ref(float *out, const int32_t *inp, const float *wte, const float *wpe, int B,
                        int T, int C);
/* dwte[inp[b,t],:] += dout[b,t,:]; dwpe[t,:] += dout[b,t,:] (accumulate) */
void kn_encoder_bwd(float *dwte, float *dwpe, const float *dout, const int32_t *inp, int B, int T,
                    int C);
void kn_encoder_bwd_ref(float *dwte, float *dwpe, const float *dout, const int32_t *inp, int B,
                        int T, int C);

#endif
