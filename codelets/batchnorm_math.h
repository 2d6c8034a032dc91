/* Batch normalization's per-element and per-channel arithmetic, shared by the CPU kernels
 * (codelets/batchnorm_stats.c, batchnorm_normalize.c) and the CUDA kernels
 * (codelets/batchnorm.cu), so the CPU tests check the GPU's bits.
 *
 * Every operation goes through hd_arith.h's functions, which nvcc never fuses into
 * multiply-adds: with the same rounding of every step, the GPU computes the CPU's bits, the
 * normalisation, the backward and the fused ReLU's mask (which must agree with the forward
 * bit for bit) included. */
#ifndef TESSEL_CODELETS_BATCHNORM_MATH_H
#define TESSEL_CODELETS_BATCHNORM_MATH_H

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "hd.h"
#include "hd_arith.h"
#include "reduce_hd.h"
#include "tessel/tensor.h"

/* y before the ReLU: (x - mean) * scale + shift, rounded to the dtype. The fused backward
 * recomputes it with these same functions, so it finds y > 0 exactly where the forward did. */
TSL_HD_INLINE float tsl_bn_affine_f32(float x, double mean, double scale, double shift)
{
    return (float)tsl_hd_add(tsl_hd_mul(tsl_hd_sub((double)x, mean), scale), shift);
}

TSL_HD_INLINE double tsl_bn_affine_f64(double x, double mean, double scale, double shift)
{
    return tsl_hd_add(tsl_hd_mul(tsl_hd_sub(x, mean), scale), shift);
}

/* The backward's dx = scale * ((g - mean_dy) - (x - mean) * slope), g the (masked) dy. */
TSL_HD_INLINE float tsl_bn_backward_f32(float g, float x, double scale, double mean, double mean_dy,
                                        double slope)
{
    return (float)tsl_hd_mul(scale, tsl_hd_sub(tsl_hd_sub((double)g, mean_dy),
                                               tsl_hd_mul(tsl_hd_sub((double)x, mean), slope)));
}

TSL_HD_INLINE double tsl_bn_backward_f64(double g, double x, double scale, double mean,
                                         double mean_dy, double slope)
{
    return tsl_hd_mul(scale,
                      tsl_hd_sub(tsl_hd_sub(g, mean_dy), tsl_hd_mul(tsl_hd_sub(x, mean), slope)));
}

/* g, or +0 when !keep: a bit mask rather than a branch, so the loops vectorise. */
TSL_HD_INLINE float tsl_bn_keep_f32(float g, int keep)
{
#ifdef __CUDA_ARCH__
    return __uint_as_float(__float_as_uint(g) & (0u - (uint32_t)keep));
#else
    uint32_t bits;
    memcpy(&bits, &g, sizeof bits);
    bits &= -(uint32_t)keep;
    memcpy(&g, &bits, sizeof g);
    return g;
#endif
}

/* A channel's normalization: y = (x - mean) * scale + shift. */
typedef struct tsl_bn_affine {
    double mean, scale, shift;
} tsl_bn_affine;

/* Training mode: scale = invstd * gamma, shift = beta. */
TSL_HD_INLINE tsl_bn_affine tsl_bn_train_affine(double mean, double invstd, double gamma,
                                                double beta)
{
    tsl_bn_affine f = {mean, tsl_hd_mul(invstd, gamma), beta};
    return f;
}

/* Inference: scale = gamma / sqrt(running_var + eps). */
TSL_HD_INLINE tsl_bn_affine tsl_bn_infer_affine(double running_mean, double running_var,
                                                double gamma, double beta, double eps)
{
    tsl_bn_affine f = {running_mean, tsl_hd_mul(tsl_hd_invstd(tsl_hd_add(running_var, eps)), gamma),
                       beta};
    return f;
}

/* ---- the fused ReLU's mask in the backward ----
 * The backward needs y > 0 for y = affine(x) as the forward computed it. Each step of affine
 * (minus mean, times scale, plus shift, each rounded, then rounded to the dtype) is monotone
 * in x, non-decreasing for scale > 0 and non-increasing for scale < 0, so y > 0 exactly on an
 * interval of x that reaches +inf or -inf; a bisection over the order of the dtype's values
 * finds its inner end with affine itself. Non-finite statistics or parameters keep that shape:
 * NaN results (not > 0, as in the forward's ReLU) come for every x, for none, or only on the
 * side where y > 0 fails. With scale == 0, y is the same for every finite x (and NaN for the
 * infinities). The mask is then two comparisons per element and matches the forward bit for
 * bit (the boundary test in tests/unit/test_batchnorm_kernels.cpp checks it). */
typedef struct tsl_bn_relu_mask {
    double lo, hi; /* y > 0 exactly where lo <= x <= hi: values of the dtype or +-inf */
} tsl_bn_relu_mask;

/* dy where a fused ReLU's y > 0 (x in [m.lo, m.hi]), +0 elsewhere (NaN x: +0). */
TSL_HD_INLINE float tsl_bn_relu_keep_f32(float g, float x, tsl_bn_relu_mask m)
{
    return tsl_bn_keep_f32(g, (x >= (float)m.lo) & (x <= (float)m.hi));
}

TSL_HD_INLINE double tsl_bn_relu_keep_f64(double g, double x, tsl_bn_relu_mask m)
{
    return (x >= m.lo) & (x <= m.hi) ? g : 0.0;
}

/* Unsigned keys that order the dtype's values as numbers (NaNs aside; -0 just below +0). */
static inline TSL_HD uint64_t tsl_bn_order_key(int dtype, double v)
{
    if (dtype == TSL_F32) {
        float f = (float)v;
        uint32_t bits;
#ifdef __CUDA_ARCH__
        bits = __float_as_uint(f);
#else
        memcpy(&bits, &f, sizeof bits);
#endif
        return bits >> 31 ? (uint32_t)~bits : bits | 0x80000000u;
    }
    uint64_t bits = tsl_double_bits(v);
    return bits >> 63 ? ~bits : bits | ((uint64_t)1 << 63);
}

static inline TSL_HD double tsl_bn_value_of_key(int dtype, uint64_t key)
{
    if (dtype == TSL_F32) {
        uint32_t k = (uint32_t)key, bits = k >> 31 ? k & 0x7fffffffu : ~k;
#ifdef __CUDA_ARCH__
        return __uint_as_float(bits);
#else
        float f;
        memcpy(&f, &bits, sizeof f);
        return f;
#endif
    }
    return tsl_double_from_bits(key >> 63 ? key & ~((uint64_t)1 << 63) : ~key);
}

/* Whether the forward's y = affine(x) is positive. */
static inline TSL_HD int tsl_bn_relu_passes(int dtype, double x, tsl_bn_affine f)
{
    return dtype == TSL_F32 ? tsl_bn_affine_f32((float)x, f.mean, f.scale, f.shift) > 0
                            : tsl_bn_affine_f64(x, f.mean, f.scale, f.shift) > 0;
}

static inline TSL_HD tsl_bn_relu_mask tsl_bn_relu_mask_for(int dtype, tsl_bn_affine f)
{
    tsl_bn_relu_mask m = {1, 0}; /* empty */
    const double largest = dtype == TSL_F32 ? FLT_MAX : DBL_MAX;
    if (f.scale == 0) {
        if (tsl_bn_relu_passes(dtype, 0, f)) {
            m.lo = -largest;
            m.hi = largest;
        }
        return m;
    }
    const int rising = f.scale > 0;
    if (!tsl_bn_relu_passes(dtype, rising ? INFINITY : -INFINITY, f))
        return m;
    /* rising: the first key that passes; falling: the last */
    uint64_t lo = tsl_bn_order_key(dtype, -INFINITY), hi = tsl_bn_order_key(dtype, INFINITY);
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo + !rising) / 2;
        int pass = tsl_bn_relu_passes(dtype, tsl_bn_value_of_key(dtype, mid), f);
        if (rising && pass)
            hi = mid;
        else if (rising)
            lo = mid + 1;
        else if (pass)
            lo = mid;
        else
            hi = mid - 1;
    }
    m.lo = rising ? tsl_bn_value_of_key(dtype, lo) : -INFINITY;
    m.hi = rising ? INFINITY : tsl_bn_value_of_key(dtype, lo);
    return m;
}

/* ---- per-channel results from the exact totals (acc: the channel's two accumulators) ---- */

/* Batch mean and biased variance from sum x and sum x^2 over m elements. */
static inline TSL_HD void tsl_bn_moments(double m, const tsl_acc *acc, tsl_acc *scratch,
                                         double *mean, double *var)
{
    *mean = tsl_hd_div(tsl_acc_round_into(&acc[0], scratch), m);
    *var =
        tsl_hd_sub(tsl_hd_div(tsl_acc_round_into(&acc[1], scratch), m), tsl_hd_mul(*mean, *mean));
    if (*var < 0)
        *var = 0;
}

/* The running statistic's new value: `which` 0 the mean, 1 the variance (the unbiased batch
 * variance, as PyTorch). */
static inline TSL_HD double tsl_bn_running_value(double m, int which, double momentum,
                                                 double running, double mean, double var)
{
    double batch = which == 0 ? mean
                   : m > 1    ? tsl_hd_div(tsl_hd_mul(var, m), tsl_hd_sub(m, 1))
                              : var;
    return tsl_hd_add(tsl_hd_mul(tsl_hd_sub(1, momentum), running), tsl_hd_mul(momentum, batch));
}

/* sum(dy * xhat) = invstd * (sum(dy x) - mean sum(dy)), from the exact sums rounded once each
 * (and one fused multiply-add). */
static inline TSL_HD double tsl_bn_sum_dy_xhat(const tsl_acc *acc, tsl_acc *scratch, double mean,
                                               double invstd)
{
    double sum_dy = tsl_acc_round_into(&acc[0], scratch);
    double sum_dy_x = tsl_acc_round_into(&acc[1], scratch);
    return tsl_hd_mul(invstd, fma(-mean, sum_dy, sum_dy_x));
}

#endif /* TESSEL_CODELETS_BATCHNORM_MATH_H */
