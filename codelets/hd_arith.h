/* Double arithmetic with the same rounding on the CPU and the GPU, for TSL_HD bodies that
 * must give the CPU's bits on both: plain operators on the CPU (which never contracts them:
 * tessel builds for baseline x86-64, without FMA), round-to-nearest intrinsics on the GPU,
 * which nvcc never fuses into multiply-adds (a plain a * b + c may become one fma there). */
#ifndef TESSEL_CODELETS_HD_ARITH_H
#define TESSEL_CODELETS_HD_ARITH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "hd.h"

/* Inlined into the CPU's loops (which must vectorise) and the GPU's kernels. */
#ifdef __CUDACC__
#define TSL_HD_INLINE static __forceinline__ __host__ __device__
#else
#define TSL_HD_INLINE static inline __attribute__((always_inline))
#endif

TSL_HD_INLINE double tsl_hd_mul(double a, double b)
{
#ifdef __CUDA_ARCH__
    return __dmul_rn(a, b);
#else
    return a * b;
#endif
}

TSL_HD_INLINE double tsl_hd_add(double a, double b)
{
#ifdef __CUDA_ARCH__
    return __dadd_rn(a, b);
#else
    return a + b;
#endif
}

TSL_HD_INLINE double tsl_hd_sub(double a, double b)
{
#ifdef __CUDA_ARCH__
    return __dsub_rn(a, b);
#else
    return a - b;
#endif
}

TSL_HD_INLINE double tsl_hd_div(double a, double b)
{
#ifdef __CUDA_ARCH__
    return __ddiv_rn(a, b);
#else
    return a / b;
#endif
}

/* 1 / sqrt(v), both correctly rounded. */
TSL_HD_INLINE double tsl_hd_invstd(double v)
{
#ifdef __CUDA_ARCH__
    return __ddiv_rn(1.0, __dsqrt_rn(v));
#else
    return 1.0 / sqrt(v);
#endif
}

/* A double's bits, and the double of given bits (exact on both sides). */
TSL_HD_INLINE uint64_t tsl_double_bits(double v)
{
#ifdef __CUDA_ARCH__
    return (uint64_t)__double_as_longlong(v);
#else
    uint64_t bits;
    memcpy(&bits, &v, sizeof bits);
    return bits;
#endif
}

TSL_HD_INLINE double tsl_double_from_bits(uint64_t bits)
{
#ifdef __CUDA_ARCH__
    return __longlong_as_double((long long)bits);
#else
    double v;
    memcpy(&v, &bits, sizeof v);
    return v;
#endif
}

#endif /* TESSEL_CODELETS_HD_ARITH_H */
