/* Elementwise element functions for f32 (suffix f32) and f64 (f64): the per-element math of
 * codelets/elementwise.c's loops and codelets/elementwise.cu's kernels. The CUDA files are
 * compiled without multiply-add contraction (-fmad=false), as the CPU build, so both round
 * alike: the same bits. */
#ifndef TESSEL_CODELETS_ELEMENTWISE_MATH_H
#define TESSEL_CODELETS_ELEMENTWISE_MATH_H

#include "hd.h"

#define TSL_ELEMENTWISE_FUNCTIONS(T, SFX)                                                          \
    static inline TSL_HD T tsl_scale_##SFX(T x, T alpha)                                           \
    {                                                                                              \
        return x * alpha;                                                                          \
    }                                                                                              \
    static inline TSL_HD T tsl_axpy_##SFX(T y, T alpha, T x)                                       \
    {                                                                                              \
        return y + alpha * x;                                                                      \
    }                                                                                              \
    /* alpha a + b: 1 a + b is a + b exactly */                                                    \
    static inline TSL_HD T tsl_add_##SFX(T a, T b, T alpha)                                        \
    {                                                                                              \
        return alpha * a + b;                                                                      \
    }                                                                                              \
    static inline TSL_HD T tsl_mul_##SFX(T a, T b)                                                 \
    {                                                                                              \
        return a * b;                                                                              \
    }

TSL_ELEMENTWISE_FUNCTIONS(float, f32)
TSL_ELEMENTWISE_FUNCTIONS(double, f64)

/* Dropout of element x with its uniform draw u in [0, 1): x / (1 - p) (as x times the scale, in
 * double) where u >= p, else 0. The same in the forward (x) and the backward (dy). */
static inline TSL_HD float tsl_dropout_f32(float x, float u, double p)
{
    return (double)u >= p ? (float)((double)x * (1.0 / (1.0 - p))) : 0.0f;
}

#endif /* TESSEL_CODELETS_ELEMENTWISE_MATH_H */
