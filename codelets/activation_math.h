/* Activation element functions, forward and backward, for f32 (suffix f32) and f64 (f64):
 * the per-element math of codelets/activation.c's loops and codelets/activation.cu's kernels.
 * Forward: y = f(x). Backward: dx = f'(in) * g, `in` being x (ReLU, LeakyReLU, GELU, SiLU) or y
 * (sigmoid, tanh). Sigmoid, tanh and SiLU, forward and backward, are computed in double with
 * hd_arith.h's operations and hd_exp.h's exp and tanh (then rounded once to the dtype), so CPU
 * and CUDA workers give the same bits; GELU uses the C library's (CUDA's) erfc and exp, which
 * may differ in the last place between the two. */
#ifndef TESSEL_CODELETS_ACTIVATION_MATH_H
#define TESSEL_CODELETS_ACTIVATION_MATH_H

#include <math.h>

#include "hd.h"
#include "hd_arith.h"
#include "hd_exp.h"

#define TSL_ACT_ELEMENT_FUNCTIONS(T, SFX, EXP, ERFC)                                               \
    static inline TSL_HD T tsl_relu_fwd_##SFX(T x)                                                 \
    {                                                                                              \
        return x > 0 ? x : (T)0;                                                                   \
    }                                                                                              \
    static inline TSL_HD T tsl_leaky_relu_fwd_##SFX(T x, T slope)                                  \
    {                                                                                              \
        return x > 0 ? x : slope * x;                                                              \
    }                                                                                              \
    static inline TSL_HD T tsl_sigmoid_fwd_##SFX(T x)                                              \
    {                                                                                              \
        return (T)tsl_hd_div(1.0, tsl_hd_add(1.0, tsl_hd_exp(-(double)x)));                        \
    }                                                                                              \
    static inline TSL_HD T tsl_tanh_fwd_##SFX(T x)                                                 \
    {                                                                                              \
        return (T)tsl_hd_tanh((double)x);                                                          \
    }                                                                                              \
    /* x sigmoid(x) = x / (1 + exp(-x)) */                                                         \
    static inline TSL_HD T tsl_silu_fwd_##SFX(T x)                                                 \
    {                                                                                              \
        return (T)tsl_hd_div((double)x, tsl_hd_add(1.0, tsl_hd_exp(-(double)x)));                  \
    }                                                                                              \
    /* x Phi(x); erfc keeps Phi accurate far into the left tail */                                 \
    static inline TSL_HD T tsl_gelu_fwd_##SFX(T x)                                                 \
    {                                                                                              \
        return (T)0.5 * x * ERFC(-x * (T)M_SQRT1_2);                                               \
    }                                                                                              \
    /* g taken unconditionally: a select the compiler vectorises */                                \
    static inline TSL_HD T tsl_relu_bwd_##SFX(T x, T g)                                            \
    {                                                                                              \
        return x > 0 ? g : (T)0;                                                                   \
    }                                                                                              \
    static inline TSL_HD T tsl_leaky_relu_bwd_##SFX(T x, T g, T slope)                             \
    {                                                                                              \
        return x > 0 ? g : slope * g;                                                              \
    }                                                                                              \
    static inline TSL_HD T tsl_sigmoid_bwd_##SFX(T y, T g)                                         \
    {                                                                                              \
        double yd = (double)y;                                                                     \
        return (T)tsl_hd_mul(tsl_hd_mul((double)g, yd), tsl_hd_sub(1.0, yd));                      \
    }                                                                                              \
    static inline TSL_HD T tsl_tanh_bwd_##SFX(T y, T g)                                            \
    {                                                                                              \
        double yd = (double)y;                                                                     \
        return (T)tsl_hd_mul((double)g, tsl_hd_sub(1.0, tsl_hd_mul(yd, yd)));                      \
    }                                                                                              \
    /* s (1 + x (1 - s)), s = sigmoid(x), from x */                                                \
    static inline TSL_HD T tsl_silu_bwd_##SFX(T x, T g)                                            \
    {                                                                                              \
        double xd = (double)x;                                                                     \
        double s = tsl_hd_div(1.0, tsl_hd_add(1.0, tsl_hd_exp(-xd)));                              \
        double d = tsl_hd_mul(s, tsl_hd_add(1.0, tsl_hd_mul(xd, tsl_hd_sub(1.0, s))));             \
        return (T)tsl_hd_mul((double)g, d);                                                        \
    }                                                                                              \
    /* Phi(x) + x phi(x), from x */                                                                \
    static inline TSL_HD T tsl_gelu_bwd_##SFX(T x, T g)                                            \
    {                                                                                              \
        T cdf = (T)0.5 * ERFC(-x * (T)M_SQRT1_2);                                                  \
        T pdf = (T)(0.5 * M_2_SQRTPI * M_SQRT1_2) * EXP((T)-0.5 * x * x);                          \
        return g * (cdf + x * pdf);                                                                \
    }

TSL_ACT_ELEMENT_FUNCTIONS(float, f32, expf, erfcf)
TSL_ACT_ELEMENT_FUNCTIONS(double, f64, exp, erfc)

#endif /* TESSEL_CODELETS_ACTIVATION_MATH_H */
