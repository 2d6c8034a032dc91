/* Group normalization's per-element arithmetic (codelets/groupnorm.c), through hd_arith.h's
 * unfused operations so that any other kernel computing these elements with these functions
 * gets the same bits. */
#ifndef TESSEL_CODELETS_GROUPNORM_MATH_H
#define TESSEL_CODELETS_GROUPNORM_MATH_H

#include "hd.h"
#include "hd_arith.h"

/* xhat = (x - mean) invstd: the backward's normalized input. */
TSL_HD_INLINE double tsl_gn_xhat(double x, double mean, double invstd)
{
    return tsl_hd_mul(tsl_hd_sub(x, mean), invstd);
}

/* dx = invstd ((dy gamma - m1) - xhat m2), m1 and m2 the group means of dy gamma and of
 * dy gamma xhat. */
TSL_HD_INLINE double tsl_gn_dx(double dy_gamma, double xhat, double invstd, double m1, double m2)
{
    return tsl_hd_mul(invstd, tsl_hd_sub(tsl_hd_sub(dy_gamma, m1), tsl_hd_mul(xhat, m2)));
}

#endif /* TESSEL_CODELETS_GROUPNORM_MATH_H */
