/* Group normalization's per-slab results from the exact totals, one (sample, group) or one
 * channel a call: the bodies the CPU codelets loop over (codelets/groupnorm.c) and the CUDA
 * kernels run one a thread (codelets/groupnorm.cu), so the CPU tests check the GPU's arithmetic
 * and both give the same bits. `scratch` is any accumulator the caller owns. */
#ifndef TESSEL_CODELETS_GROUPNORM_SLAB_H
#define TESSEL_CODELETS_GROUPNORM_SLAB_H

#include "batchnorm_math.h"
#include "codelet.h"
#include "groupnorm.h"
#include "hd.h"
#include "hd_arith.h"
#include "reduce_hd.h"

/* Slab statistic k (sample s, group g at k = s G + g): (mean, 1 / sqrt(var + eps)) into
 * stats[2k], stats[2k + 1] from its totals acc[2k] (sum x), acc[2k + 1] (sum x^2). */
static inline TSL_HD void tsl_gn_finalize_one(const tsl_gn_args *a, const tsl_acc *acc, int64_t k,
                                              double *stats, tsl_acc *scratch)
{
    double mean, var;
    tsl_bn_moments((double)a->per_group, &acc[2 * k], scratch, &mean, &var);
    stats[2 * k] = mean;
    stats[2 * k + 1] = tsl_hd_invstd(tsl_hd_add(var, a->eps));
}

/* sum(dy xhat) of slab sample s, channel c, from its exact sums and the saved statistics of
 * its group (tsl_bn_sum_dy_xhat). */
static inline TSL_HD double tsl_gn_sum_dy_xhat(const tsl_gn_args *a, const tsl_acc *acc,
                                               const double *saved, int64_t s, int64_t c,
                                               tsl_acc *scratch)
{
    const double *ms = &saved[2 * ((a->n0 + s) * a->groups + c / (a->channels / a->groups))];
    return tsl_bn_sum_dy_xhat(&acc[2 * (s * a->channels + c)], scratch, ms[0], ms[1]);
}

/* The backward coefficients of slab sample s, group g: the group means of dy gamma and of
 * dy gamma xhat, summed over the group's channels in order, into coef[2 (s G + g)] and the
 * next. */
static inline TSL_HD void tsl_gn_coef_one(const tsl_gn_args *a, const tsl_acc *acc,
                                          const double *saved, const void *gamma, int64_t s,
                                          int64_t g, double *coef, tsl_acc *scratch)
{
    const int64_t per = a->channels / a->groups;
    double m1 = 0, m2 = 0;
    for (int64_t c = g * per; c < (g + 1) * per; c++) {
        double w = tsl_load(a->dtype, gamma, c);
        double sum_dy = tsl_acc_round_into(&acc[2 * (s * a->channels + c)], scratch);
        m1 = tsl_hd_add(m1, tsl_hd_mul(w, sum_dy));
        m2 = tsl_hd_add(m2, tsl_hd_mul(w, tsl_gn_sum_dy_xhat(a, acc, saved, s, c, scratch)));
    }
    coef[2 * (s * a->groups + g)] = tsl_hd_div(m1, (double)a->per_group);
    coef[2 * (s * a->groups + g) + 1] = tsl_hd_div(m2, (double)a->per_group);
}

/* Channel c of the slab's per-channel totals: out[2c] = the slab's sum dy (its samples'
 * accumulators merged), out[2c + 1] = the exact sum of its samples' sum(dy xhat). */
static inline TSL_HD void tsl_gn_slab_channel_one(const tsl_gn_args *a, const tsl_acc *acc,
                                                  const double *saved, int64_t c, tsl_acc *out,
                                                  tsl_acc *scratch)
{
    memset(&out[2 * c], 0, 2 * sizeof(tsl_acc));
    for (int64_t s = 0; s < a->samples; s++) {
        tsl_acc_merge_into(&out[2 * c], &acc[2 * (s * a->channels + c)], scratch);
        tsl_acc_add_value(&out[2 * c + 1], tsl_gn_sum_dy_xhat(a, acc, saved, s, c, scratch));
    }
}

/* Channel c's parameter gradient from the channel totals: dbeta (which 0) or dgamma (which
 * 1), stored in the dtype. */
static inline TSL_HD void tsl_gn_param_grad_one(const tsl_gn_args *a, const tsl_acc *acc, int64_t c,
                                                void *grad, tsl_acc *scratch)
{
    tsl_store(a->dtype, grad, c, tsl_acc_round_into(&acc[2 * c + a->which], scratch));
}

#endif /* TESSEL_CODELETS_GROUPNORM_SLAB_H */
