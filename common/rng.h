/* Counter-based random numbers: a value is a pure function of (seed, name, index), so
 * any process can draw exactly the elements it owns, in any order, and get the same
 * numbers as everyone else (DESIGN §7: model init identical for every layout).
 *
 * Construction: key = mix(seed ^ mix(FNV-1a-64(name))), where mix is SplitMix64's
 * finaliser (a bijection on 64-bit words). Element i draws two 64-bit words
 *   w1 = mix(key ^ mix(2i)),  w2 = mix(key ^ mix(2i + 1))
 * and turns them into uniforms u1 in (0, 1] and u2 in [0, 1) with 53-bit resolution.
 * The normal is Box-Muller's first output, sqrt(-2 ln u1) cos(2 pi u2), computed in
 * double and rounded to float; the second output is not used, which keeps each element
 * independent of its neighbours. */
#ifndef CH_RNG_H
#define CH_RNG_H

#include <stddef.h>
#include <stdint.h>

/* SplitMix64, the project's one 64-bit mixer: its finaliser applied to z + the golden
 * gamma, a bijection on 64-bit words. ch_mix64(0) is SplitMix64's first output of 0. */
static inline uint64_t ch_mix64(uint64_t z)
{
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* The SplitMix64 generator: the next output of state *s (then advanced). */
static inline uint64_t ch_mix64_next(uint64_t *s)
{
    uint64_t z = ch_mix64(*s);
    *s += 0x9E3779B97F4A7C15ull;
    return z;
}

/* The stream key for (seed, name); name is a NUL-terminated string. */
uint64_t ch_rng_key(uint64_t seed, const char *name);
/* Element `index` of stream `key`: N(0, 1) and U[0, 1). The uniform is the u2 the
 * normal of the same (key, index) uses: draw the two from different keys when both are
 * needed. */
float ch_rng_normal_key(uint64_t key, uint64_t index);
double ch_rng_uniform_key(uint64_t key, uint64_t index);
/* ch_rng_normal_key(ch_rng_key(seed, name), index) */
float ch_rng_normal(uint64_t seed, const char *name, uint64_t index);
/* out[i] = std * ch_rng_normal(seed, name, first + i) for i < n */
void ch_rng_fill_normal(float *out, size_t n, uint64_t seed, const char *name, uint64_t first,
                        float std);

#endif
