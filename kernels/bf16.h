/* bfloat16: the top 16 bits of an IEEE-754 binary32 (1 sign, 8 exponent, 7 mantissa bits),
 * the storage type of a mixed-precision run's working copy of the parameters and of its
 * activations. The range is fp32's; the precision is 8 significant bits.
 *
 * fp32 -> bf16 rounds to nearest, ties to even, as CUDA's __float2bfloat16_rn and PyTorch's
 * .to(torch.bfloat16) do: subnormals round like any other value (no flush to zero), values
 * beyond the largest bf16 (0x7f7f, about 3.39e38) round to infinity once they reach the
 * half-way point, infinities stay, and a NaN stays a NaN of the same sign with its quiet bit
 * set (the rounding would otherwise carry a signalling NaN's low payload into infinity).
 * bf16 -> fp32 is exact (zero-extend the mantissa).
 *
 * Header-only and pure: the CPU emulation (kn_bf16_round), the CUDA casts' host-side tests and
 * the checkpoint export share one definition. */
#ifndef KN_BF16_H
#define KN_BF16_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef uint16_t kn_bf16_t;

static inline uint32_t kn_f32_bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static inline float kn_f32_of_bits(uint32_t u)
{
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* x rounded to the nearest bf16, ties to even; NaN -> quiet NaN of the same sign */
static inline kn_bf16_t kn_bf16_from_f32(float x)
{
    uint32_t u = kn_f32_bits(x);
    if ((u & 0x7fffffffu) > 0x7f800000u)         /* NaN: keep sign and top payload, */
        return (kn_bf16_t)((u >> 16) | 0x0040u); /* force the quiet bit */
    uint32_t bias = 0x7fffu + ((u >> 16) & 1u);  /* half an ulp, plus one on odd: ties */
    return (kn_bf16_t)((u + bias) >> 16);        /* carries into the exponent (and to inf) */
}

static inline float kn_f32_from_bf16(kn_bf16_t h)
{
    return kn_f32_of_bits((uint32_t)h << 16);
}

/* x rounded to bf16 and widened back: the value a bf16 store and load would give */
static inline float kn_bf16_round1(float x)
{
    return kn_f32_from_bf16(kn_bf16_from_f32(x));
}

/* x[0..n) = kn_bf16_round1(x[i]) in place (the CPU emulation's store of a bf16 tensor held in
 * fp32 memory). */
static inline void kn_bf16_round(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] = kn_bf16_round1(x[i]);
}

/* dst[0..n) = bf16 of src[0..n) (the cast a bf16 export or a 2-byte gather makes) */
static inline void kn_bf16_pack(kn_bf16_t *dst, const float *src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = kn_bf16_from_f32(src[i]);
}

static inline void kn_bf16_unpack(float *dst, const kn_bf16_t *src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = kn_f32_from_bf16(src[i]);
}

#endif
