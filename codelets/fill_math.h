/* Fill element functions: the value of element `index` of a seeded fill, from (seed, index)
 * only, and its store in the tile's dtype; codelets/fill.c's loops and codelets/fill.cu's
 * kernels share them. The generator is counter-based (SplitMix64's finaliser on the index), so
 * a CUDA thread computes any element alone and gets the CPU's bits (constant and uniform
 * fills: additions and products in double, the CUDA files compiled without multiply-add
 * contraction; normal fills call log and cos, whose last bits differ between the C library
 * and CUDA, so they stay on CPU workers: fill.c). */
#ifndef TESSEL_CODELETS_FILL_MATH_H
#define TESSEL_CODELETS_FILL_MATH_H

#include <math.h>
#include <stdint.h>

#include "fill.h"
#include "hd.h"

/* SplitMix64 finaliser: a bijective 64-bit mix with full avalanche. */
static inline TSL_HD uint64_t tsl_fill_mix64(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* Uniform in [0, 1) with 53 random bits. */
static inline TSL_HD double tsl_fill_unit(uint64_t h)
{
    return (double)(h >> 11) * 0x1.0p-53;
}

/* Element `index` of a fill of `mode` (tsl_fill_mode) with parameters a, b (tsl_fill_args). */
static inline TSL_HD double tsl_fill_element(int32_t mode, uint64_t seed, double a, double b,
                                             uint64_t index)
{
    if (mode == TSL_FILL_CONSTANT)
        return a;
    /* two independent 64-bit words for (seed, index) */
    uint64_t key = tsl_fill_mix64(seed);
    uint64_t h1 = tsl_fill_mix64(key ^ tsl_fill_mix64(2 * index));
    if (mode == TSL_FILL_UNIFORM)
        return a + (b - a) * tsl_fill_unit(h1);
    uint64_t h2 = tsl_fill_mix64(key ^ tsl_fill_mix64(2 * index + 1));
    /* Box-Muller: u1 in (0, 1] keeps the logarithm finite. */
    double u1 = (double)((h1 >> 11) + 1) * 0x1.0p-53;
    double u2 = tsl_fill_unit(h2);
    const double two_pi = 6.283185307179586476925286766559;
    return a + b * sqrt(-2.0 * log(u1)) * cos(two_pi * u2);
}

/* Store v as element i of a tile of `dtype`: a uniform fill keeps values below `high` even
 * after rounding to float; integers take the floor. Returns 0 for an unknown dtype. */
static inline TSL_HD int tsl_fill_store(int32_t dtype, int32_t mode, double low, double high,
                                        void *tile, int64_t i, double v)
{
    switch (dtype) {
    case TSL_F32: {
        float f = (float)v;
        if (mode == TSL_FILL_UNIFORM && (double)f >= high && high > low)
            f = nextafterf((float)high, -INFINITY);
        ((float *)tile)[i] = f;
        return 1;
    }
    case TSL_F64:
        ((double *)tile)[i] = v;
        return 1;
    case TSL_I32:
        ((int32_t *)tile)[i] = (int32_t)floor(v);
        return 1;
    case TSL_I64:
        ((int64_t *)tile)[i] = (int64_t)floor(v);
        return 1;
    case TSL_U8:
        ((uint8_t *)tile)[i] = (uint8_t)floor(v);
        return 1;
    }
    return 0;
}

#endif /* TESSEL_CODELETS_FILL_MATH_H */
