/* kernels/bf16.h against hand-computed cases: round to nearest with ties to even (in the
 * normal range, across an exponent carry, to infinity), subnormals, infinities, NaNs (quiet,
 * sign kept), and the widening back being exact. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>

#include "kernels/bf16.h"

static kn_bf16_t h(uint32_t bits)
{
    return kn_bf16_from_f32(kn_f32_of_bits(bits));
}

Test(bf16, exact_values_are_kept)
{
    cr_expect_eq(kn_bf16_from_f32(1.0f), 0x3f80);
    cr_expect_eq(kn_bf16_from_f32(-2.0f), 0xc000);
    cr_expect_eq(kn_bf16_from_f32(0.0f), 0x0000);
    cr_expect_eq(kn_bf16_from_f32(-0.0f), 0x8000);
    cr_expect_eq(kn_bf16_from_f32(1.5f), 0x3fc0);
    /* 1 + 2^-7: the last mantissa bit bf16 holds */
    cr_expect_eq(kn_bf16_from_f32(1.0078125f), 0x3f81);
    for (uint32_t b = 0; b < 0x7f80; b += 0x35)
        cr_expect_eq(kn_bf16_from_f32(kn_f32_from_bf16((kn_bf16_t)b)), b, "bits %04x", b);
}

Test(bf16, rounds_to_nearest_ties_to_even)
{
    /* 1 + 2^-8 is half-way between 0x3f80 (even) and 0x3f81: down */
    cr_expect_eq(h(0x3f808000u), 0x3f80);
    /* 1 + 3 * 2^-8 is half-way between 0x3f81 (odd) and 0x3f82 (even): up */
    cr_expect_eq(h(0x3f818000u), 0x3f82);
    /* just above and below the half-way point */
    cr_expect_eq(h(0x3f808001u), 0x3f81);
    cr_expect_eq(h(0x3f807fffu), 0x3f80);
    /* negative values round by magnitude */
    cr_expect_eq(h(0xbf808000u), 0xbf80);
    cr_expect_eq(h(0xbf818000u), 0xbf82);
    /* 1.99999... rounds up into the next binade: 2.0 */
    cr_expect_eq(h(0x3fffc000u), 0x4000);
    cr_expect_eq(h(0x3fff8000u), 0x4000); /* tie, 0x3fff odd: up to 0x4000 */
    cr_expect_eq(h(0x3ffe8000u), 0x3ffe); /* tie, 0x3ffe even: kept */
    /* pi = 0x40490fdb -> 0x4049 (0x0fdb < 0x8000) */
    cr_expect_eq(kn_bf16_from_f32(3.14159265f), 0x4049);
    /* 0.1f = 0x3dcccccd -> 0x3dcd (0xcccd > 0x8000) */
    cr_expect_eq(kn_bf16_from_f32(0.1f), 0x3dcd);
    cr_expect_float_eq(kn_bf16_round1(0.1f), 0.10009765625f, 0.0f);
}

Test(bf16, subnormals_round_without_flushing)
{
    /* the smallest fp32 subnormal, 2^-149: far below half of bf16's smallest (2^-133): 0 */
    cr_expect_eq(h(0x00000001u), 0x0000);
    /* bf16's smallest subnormal 2^-133 = 0x0001, kept */
    cr_expect_eq(h(0x00010000u), 0x0001);
    /* half of it: a tie with 0 (even): 0; a bit more: up */
    cr_expect_eq(h(0x00008000u), 0x0000);
    cr_expect_eq(h(0x00008001u), 0x0001);
    /* 1.5 * 2^-133: tie between 0x0001 (odd) and 0x0002: up */
    cr_expect_eq(h(0x00018000u), 0x0002);
    /* the largest subnormal rounds up into the smallest normal 2^-126 */
    cr_expect_eq(h(0x007fffffu), 0x0080);
    cr_expect_eq(h(0x807fffffu), 0x8080);
    cr_expect_float_eq(kn_f32_from_bf16(0x0001), ldexpf(1.0f, -133), 0.0f);
}

Test(bf16, infinities_overflow_and_nans)
{
    cr_expect_eq(kn_bf16_from_f32(INFINITY), 0x7f80);
    cr_expect_eq(kn_bf16_from_f32(-INFINITY), 0xff80);
    /* FLT_MAX (0x7f7fffff) is past the half-way point to the next binade: infinity */
    cr_expect_eq(h(0x7f7fffffu), 0x7f80);
    /* the largest bf16, 0x7f7f, and just below the half-way point above it: kept */
    cr_expect_eq(h(0x7f7f0000u), 0x7f7f);
    cr_expect_eq(h(0x7f7f7fffu), 0x7f7f);
    /* the tie above 0x7f7f (odd) goes up: infinity */
    cr_expect_eq(h(0x7f7f8000u), 0x7f80);
    /* NaNs: quiet, sign kept, never infinity (a signalling NaN with only low payload bits
     * would round into 0x7f80 without the NaN check) */
    cr_expect_eq(h(0x7fc00000u), 0x7fc0);
    cr_expect_eq(h(0xffc00000u), 0xffc0);
    cr_expect_eq(h(0x7f800001u), 0x7fc0);
    cr_expect_eq(h(0xff800001u), 0xffc0);
    cr_expect_eq(h(0x7fffffffu), 0x7fff);
    cr_expect(isnan(kn_bf16_round1(NAN)));
}

Test(bf16, arrays_round_pack_and_unpack_alike)
{
    float x[5] = {1.0f, 0.1f, -3.14159265f, 1e-40f, 65504.0f}, y[5];
    kn_bf16_t p[5];
    kn_bf16_pack(p, x, 5);
    kn_bf16_unpack(y, p, 5);
    kn_bf16_round(x, 5);
    for (int i = 0; i < 5; i++) {
        cr_expect_eq(kn_f32_bits(x[i]), kn_f32_bits(y[i]), "element %d", i);
        cr_expect_eq(kn_f32_bits(x[i]) & 0xffffu, 0u, "element %d keeps low bits", i);
    }
    /* rounding twice is rounding once */
    kn_bf16_round(y, 5);
    for (int i = 0; i < 5; i++)
        cr_expect_eq(kn_f32_bits(x[i]), kn_f32_bits(y[i]));
}
