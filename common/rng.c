/* Counter-based random numbers (common/rng.h). */
#include <math.h>

#include "common/rng.h"

static uint64_t fnv1a64(const char *s)
{
    uint64_t h = 0xCBF29CE484222325ULL;
    for (; *s != '\0'; s++) {
        h ^= (unsigned char)*s;
        h *= 0x100000001B3ULL;
    }
    return h;
}

uint64_t ch_rng_key(uint64_t seed, const char *name)
{
    return ch_mix64(seed ^ ch_mix64(fnv1a64(name)));
}

static uint64_t word(uint64_t key, uint64_t counter)
{
    return ch_mix64(key ^ ch_mix64(counter));
}

double ch_rng_uniform_key(uint64_t key, uint64_t index)
{
    return (double)(word(key, 2 * index + 1) >> 11) * 0x1.0p-53;
}

float ch_rng_normal_key(uint64_t key, uint64_t index)
{
    double u1 = (double)((word(key, 2 * index) >> 11) + 1) * 0x1.0p-53; /* (0, 1] */
    double u2 = ch_rng_uniform_key(key, index);
    return (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
}

float ch_rng_normal(uint64_t seed, const char *name, uint64_t index)
{
    return ch_rng_normal_key(ch_rng_key(seed, name), index);
}

void ch_rng_fill_normal(float *out, size_t n, uint64_t seed, const char *name, uint64_t first,
                        float std)
{
    uint64_t key = ch_rng_key(seed, name);
    for (size_t i = 0; i < n; i++) {
        out[i] = std * ch_rng_normal_key(key, first + i);
    }
}
