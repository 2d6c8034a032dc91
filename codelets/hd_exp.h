/* exp, expm1, tanh and log of doubles built from IEEE operations alone (hd_arith.h's, which round
 * the same on the CPU and the GPU, and exact bit manipulations), so that a CPU worker and a CUDA
 * worker give the same bits: the C library's exp/log and CUDA's differ in the last place for some
 * inputs, and then a loss or a gradient would depend on which worker ran its task.
 *
 * exp and log are faithful (within one unit in the last place; measured against the C library in
 * tests/unit/test_hd_exp.cpp) and handle every double: NaN, infinities, zeros, subnormal
 * arguments and results, overflow and underflow.
 *
 * exp(x): x = k ln2 + r, k = nearest integer to x / ln2 (by the 1.5 * 2^52 rounding trick),
 * r = (x - k ln2_hi) - k ln2_lo with ln2_hi's low 32 bits zero (k ln2_hi exact, the first
 * subtraction exact), |r| <= ln2 / 2; exp(r) by its Taylor polynomial to degree 13 in Horner
 * form (the truncation below 2^-60 relative); then the exact scaling by 2^k, in two steps
 * where 2^k is not a normal double.
 *
 * expm1(x) = 2^k expm1(r) + (2^k - 1) with the same reduction and polynomial; tanh(x) from
 * expm1(2|x|). Both within a few units in the last place (the test states the bound).
 *
 * log(x): x = m 2^e with m in [sqrt(1/2), sqrt(2)) (subnormal x scaled by 2^54 first), f = m - 1
 * (exact), s = f / (2 + f), log(m) = 2 atanh(s) = f - (f^2/2 - s (f^2/2 + R(s^2))) with
 * R(z) = sum_{j=1..10} 2 z^j / (2j + 1) (the series' truncation below 2^-56 relative), and
 * log(x) = e ln2_hi + (log(m) + e ln2_lo). */
#ifndef TESSEL_CODELETS_HD_EXP_H
#define TESSEL_CODELETS_HD_EXP_H

#include <stdint.h>

#include "hd_arith.h"

/* 2^k for k in [-1022, 1023], exactly (other k give other doubles, never undefined behaviour). */
TSL_HD_INLINE double tsl_hd_pow2(int64_t k)
{
    return tsl_double_from_bits((uint64_t)(k + 1023) << 52);
}

#define TSL_HD_LN2_HI 0x1.62e42feep-1       /* ln 2 rounded to 31 bits after the point */
#define TSL_HD_LN2_LO 0x1.a39ef35793c76p-33 /* ln 2 - TSL_HD_LN2_HI, rounded */
#define TSL_HD_LN2 0x1.62e42fefa39efp-1     /* ln 2, rounded */
#define TSL_HD_INV_LN2 0x1.71547652b82fep0  /* 1 / ln 2, rounded */

/* x = k ln2 + r: returns k (an integer, as a double) and sets r, |r| <= ln2 / 2 (about). */
TSL_HD_INLINE double tsl_hd_exp_reduce(double x, double *r)
{
    const double shift = 0x1.8p52;
    double kd = tsl_hd_sub(tsl_hd_add(tsl_hd_mul(x, TSL_HD_INV_LN2), shift), shift);
    *r = tsl_hd_sub(tsl_hd_sub(x, tsl_hd_mul(kd, TSL_HD_LN2_HI)), tsl_hd_mul(kd, TSL_HD_LN2_LO));
    return kd;
}

/* One Horner step: p x + c. */
#define TSL_HD_HORNER(p, x, c) ((p) = tsl_hd_add(tsl_hd_mul((p), (x)), (c)))

/* exp(r) - 1 for a reduced r: r + r^2 p with p = sum r^(j-2) / j!, j = 2..13, Horner from 1/13!
 * (each 1/j! a correctly rounded constant, the same on both sides). */
TSL_HD_INLINE double tsl_hd_expm1_reduced(double r)
{
    double p = 1.0 / 6227020800.0;
    TSL_HD_HORNER(p, r, 1.0 / 479001600.0);
    TSL_HD_HORNER(p, r, 1.0 / 39916800.0);
    TSL_HD_HORNER(p, r, 1.0 / 3628800.0);
    TSL_HD_HORNER(p, r, 1.0 / 362880.0);
    TSL_HD_HORNER(p, r, 1.0 / 40320.0);
    TSL_HD_HORNER(p, r, 1.0 / 5040.0);
    TSL_HD_HORNER(p, r, 1.0 / 720.0);
    TSL_HD_HORNER(p, r, 1.0 / 120.0);
    TSL_HD_HORNER(p, r, 1.0 / 24.0);
    TSL_HD_HORNER(p, r, 1.0 / 6.0);
    TSL_HD_HORNER(p, r, 0.5);
    return tsl_hd_add(r, tsl_hd_mul(tsl_hd_mul(r, r), p));
}

TSL_HD_INLINE double tsl_hd_exp(double x)
{
    /* Without branches (the CPU's loops vectorise it). x clamped to [-746, 710], where k stays
     * in [-1077, 1025]: beyond, the result rounds to 0 or overflows anyway; a NaN fails both
     * comparisons and stays NaN through e. */
    double xc = x < -746.0 ? -746.0 : x;
    xc = xc > 710.0 ? 710.0 : xc;
    double r, kd = tsl_hd_exp_reduce(xc, &r);
    /* exp(r) = 1 + (r + r^2 p), the small terms summed before the 1 */
    double e = tsl_hd_add(1.0, tsl_hd_expm1_reduced(r));
    /* k from kd's bits: kd + 1.5 * 2^52 holds k in its low bits (exact, no conversion) */
    int64_t k = (int64_t)(tsl_double_bits(tsl_hd_add(kd, 0x1.8p52)) - tsl_double_bits(0x1.8p52));
    /* e 2^k = (e 2^(k - s)) 2^s with s = +-60: the first product exact (a normal double), the
     * second rounds once where the result is subnormal or overflows */
    int64_t s = k > 0 ? 60 : -60;
    return tsl_hd_mul(tsl_hd_mul(e, tsl_hd_pow2(k - s)), k > 0 ? 0x1p60 : 0x1p-60);
}

/* exp(x) - 1, accurate near 0: 2^k expm1(r) + (2^k - 1) (both terms exact scalings or exact
 * differences for the k that occur, one rounding in the sum). */
TSL_HD_INLINE double tsl_hd_expm1(double x)
{
    if (!(x == x))
        return tsl_hd_add(x, x); /* NaN */
    if (x > 700.0)
        return tsl_hd_exp(x); /* the 1 is far below the last place (and inf stays inf) */
    if (x < -40.0)
        return -1.0; /* exp(x) is below half an ulp of 1 */
    if (x == 0)
        return x; /* (-0 keeps its sign) */
    double r, kd = tsl_hd_exp_reduce(x, &r);
    if (kd == 0.0)
        return tsl_hd_expm1_reduced(r);                          /* r = x */
    if (x > -0x1.62e42fefa39efp-1 && x < 0x1.62e42fefa39efp-1) { /* |x| < ln 2, k = +-1 */
        /* expm1(x) = 2e + e^2, e = expm1(x / 2) (|x / 2| within the polynomial's range): no
         * amplified error of 2 expm1(r) + 1 */
        double e = tsl_hd_expm1_reduced(tsl_hd_mul(x, 0.5));
        return tsl_hd_add(tsl_hd_add(e, e), tsl_hd_mul(e, e));
    }
    double em = tsl_hd_expm1_reduced(r);
    double t = tsl_hd_pow2((int64_t)kd);
    return tsl_hd_add(tsl_hd_mul(em, t), tsl_hd_sub(t, 1.0));
}

/* tanh(x) = sign(x) t / (t + 2), t = expm1(2 |x|); 1 from |x| > 22 (tanh rounds to 1 there). */
TSL_HD_INLINE double tsl_hd_tanh(double x)
{
    if (!(x == x))
        return tsl_hd_add(x, x); /* NaN */
    if (x == 0)
        return x; /* (-0 keeps its sign) */
    double a = x < 0 ? -x : x, y;
    if (a > 22.0) {
        y = 1.0;
    } else {
        double t = tsl_hd_expm1(tsl_hd_add(a, a));
        y = tsl_hd_div(t, tsl_hd_add(t, 2.0));
    }
    return x < 0 ? -y : y;
}

/* log(x 2^e0) for a positive normal x (0x1p-1022 <= x < inf), without branches (the CPU's loops
 * vectorise it). */
TSL_HD_INLINE double tsl_hd_log_scaled(double x, int64_t e0)
{
    int64_t bits = (int64_t)tsl_double_bits(x);
    int64_t e = (bits >> 52) - 1023 + e0;
    int64_t mant = bits & (((int64_t)1 << 52) - 1);
    /* m in [1, 2); above sqrt(2) (significand 0x6a09e667f3bcd) take m / 2 and e + 1 */
    int64_t high = mant > 0x6a09e667f3bcdLL;
    mant |= (int64_t)(1023 - high) << 52;
    e += high;
    double f = tsl_hd_sub(tsl_double_from_bits((uint64_t)mant), 1.0);
    double s = tsl_hd_div(f, tsl_hd_add(2.0, f));
    double z = tsl_hd_mul(s, s);
    /* R(z) = sum 2 z^j / (2j + 1), j = 1..10, Horner from j = 10 */
    double q = 2.0 / 21.0;
    TSL_HD_HORNER(q, z, 2.0 / 19.0);
    TSL_HD_HORNER(q, z, 2.0 / 17.0);
    TSL_HD_HORNER(q, z, 2.0 / 15.0);
    TSL_HD_HORNER(q, z, 2.0 / 13.0);
    TSL_HD_HORNER(q, z, 2.0 / 11.0);
    TSL_HD_HORNER(q, z, 2.0 / 9.0);
    TSL_HD_HORNER(q, z, 2.0 / 7.0);
    TSL_HD_HORNER(q, z, 2.0 / 5.0);
    TSL_HD_HORNER(q, z, 2.0 / 3.0);
    double R = tsl_hd_mul(q, z);
    double hfsq = tsl_hd_mul(tsl_hd_mul(0.5, f), f);
    /* (double)e without a conversion (none in vector form before AVX-512DQ): the bits of
     * 1.5 * 2^52 + e, less 1.5 * 2^52, exactly */
    double ed = tsl_hd_sub(tsl_double_from_bits(tsl_double_bits(0x1.8p52) + (uint64_t)e), 0x1.8p52);
    /* e ln2_hi - ((hfsq - (s (hfsq + R) + e ln2_lo)) - f) */
    double inner = tsl_hd_add(tsl_hd_mul(s, tsl_hd_add(hfsq, R)), tsl_hd_mul(ed, TSL_HD_LN2_LO));
    return tsl_hd_sub(tsl_hd_mul(ed, TSL_HD_LN2_HI), tsl_hd_sub(tsl_hd_sub(hfsq, inner), f));
}

/* log(x) for a positive normal x, without branches; tsl_hd_log() for every double. */
TSL_HD_INLINE double tsl_hd_log_normal(double x)
{
    return tsl_hd_log_scaled(x, 0);
}

/* Whether tsl_hd_log_normal() takes x. */
TSL_HD_INLINE int tsl_hd_log_normal_ok(double x)
{
    return x >= 0x1p-1022 && x <= 0x1.fffffffffffffp1023;
}

TSL_HD_INLINE double tsl_hd_log(double x)
{
    if (!(x == x))
        return tsl_hd_add(x, x); /* NaN */
    if (x < 0)
        return tsl_hd_div(0.0, 0.0); /* NaN */
    if (x == 0)
        return tsl_hd_div(-1.0, 0.0); /* -inf */
    if (x > 0x1.fffffffffffffp1023)
        return x;      /* +inf */
    if (x < 0x1p-1022) /* subnormal: x 2^54 is normal (the scaling exact) */
        return tsl_hd_log_scaled(tsl_hd_mul(x, 0x1p54), -54);
    return tsl_hd_log_scaled(x, 0);
}

#endif /* TESSEL_CODELETS_HD_EXP_H */
