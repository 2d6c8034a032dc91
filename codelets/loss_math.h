/* The losses' per-position and per-element arithmetic, shared by the CPU kernels
 * (codelets/loss.c) and the CUDA kernels (codelets/loss.cu), so the CPU tests check the GPU's
 * arithmetic. Products and sums go through hd_arith.h (no contraction on the GPU), and exp and
 * log through hd_exp.h (built from those operations, not the C library's or CUDA's, which
 * differ in the last place), so the GPU computes the CPU's bits for every loss. */
#ifndef TESSEL_CODELETS_LOSS_MATH_H
#define TESSEL_CODELETS_LOSS_MATH_H

#include <math.h>
#include <stdint.h>

#include "hd.h"
#include "hd_arith.h"
#include "hd_exp.h"
#include "loss.h"
#include "tessel/tensor.h"

/* Where logit (s, c, v) of a tile lives: sample s, class c, position v; plain tiles keep a
 * class's positions together, channels-last tiles a position's classes. */
static inline TSL_HD int64_t tsl_loss_class_stride(const tsl_loss_args *a)
{
    return a->channels_last ? 1 : a->inner;
}

static inline TSL_HD int64_t tsl_loss_logit_base(const tsl_loss_args *a, int64_t s, int64_t v)
{
    return a->channels_last ? (s * a->inner + v) * a->classes : s * a->classes * a->inner + v;
}

/* Element i of an f32 or f64 buffer, as a double; store v rounded to the buffer's dtype. */
static inline TSL_HD double tsl_loss_load(int dtype, const void *p, int64_t i)
{
    return dtype == TSL_F32 ? (double)((const float *)p)[i] : ((const double *)p)[i];
}

static inline TSL_HD void tsl_loss_store(int dtype, void *p, int64_t i, double v)
{
    if (dtype == TSL_F32)
        ((float *)p)[i] = (float)v;
    else
        ((double *)p)[i] = v;
}

/* Label i (i32, i64 or u8; -1, a bad label, for any other dtype). */
static inline TSL_HD int64_t tsl_loss_label(int dtype, const void *p, int64_t i)
{
    switch (dtype) {
    case TSL_I32:
        return ((const int32_t *)p)[i];
    case TSL_I64:
        return ((const int64_t *)p)[i];
    case TSL_U8:
        return ((const uint8_t *)p)[i];
    default:
        return -1;
    }
}

/* The softmax's terms at the position whose logits start at `base`: the largest logit (NaNs
 * ignored, as fmax does) and the sum of exp(x - top). */
static inline TSL_HD void tsl_loss_softmax_terms(const tsl_loss_args *a, const void *x,
                                                 int64_t base, double *top, double *total)
{
    const int64_t stride = tsl_loss_class_stride(a);
    double t = -INFINITY, sum = 0;
    for (int64_t c = 0; c < a->classes; c++)
        t = fmax(t, tsl_loss_load(a->dtype, x, base + c * stride));
    for (int64_t c = 0; c < a->classes; c++)
        sum = tsl_hd_add(sum,
                         tsl_hd_exp(tsl_hd_sub(tsl_loss_load(a->dtype, x, base + c * stride), t)));
    *top = t;
    *total = sum;
}

/* Softmax cross-entropy at a position with a good label: returns logsumexp(x) - x[label];
 * writes the gradient (softmax(x) - onehot(label)) * scale when grad is not NULL. */
static inline TSL_HD double tsl_loss_cross_entropy_at(const tsl_loss_args *a, const void *x,
                                                      int64_t base, int64_t label, void *grad)
{
    const int64_t stride = tsl_loss_class_stride(a);
    double top, total;
    tsl_loss_softmax_terms(a, x, base, &top, &total);
    double lse = tsl_hd_add(top, tsl_hd_log(total));
    if (grad)
        for (int64_t c = 0; c < a->classes; c++) {
            double p = tsl_hd_exp(tsl_hd_sub(tsl_loss_load(a->dtype, x, base + c * stride), lse));
            tsl_loss_store(a->dtype, grad, base + c * stride,
                           tsl_hd_mul(tsl_hd_sub(p, (double)(c == label)), a->scale));
        }
    return tsl_hd_sub(lse, tsl_loss_load(a->dtype, x, base + label * stride));
}

/* Zero gradient at a position (a bad label). */
static inline TSL_HD void tsl_loss_zero_at(const tsl_loss_args *a, int64_t base, void *grad)
{
    const int64_t stride = tsl_loss_class_stride(a);
    for (int64_t c = 0; c < a->classes; c++)
        tsl_loss_store(a->dtype, grad, base + c * stride, 0.0);
}

/* MSE at element i: returns (x - t)^2; writes the gradient 2 (x - t) scale when grad. */
static inline TSL_HD double tsl_loss_mse_at(const tsl_loss_args *a, const void *x,
                                            const void *target, int64_t i, void *grad)
{
    double d = tsl_hd_sub(tsl_loss_load(a->dtype, x, i), tsl_loss_load(a->dtype, target, i));
    if (grad)
        tsl_loss_store(a->dtype, grad, i, tsl_hd_mul(tsl_hd_mul(2.0, d), a->scale));
    return tsl_hd_mul(d, d);
}

/* L1 at element i: returns |x - t|; writes the gradient sign(x - t) scale when grad (0 where
 * x == t, NaN where x - t is NaN, as PyTorch's L1Loss). */
static inline TSL_HD double tsl_loss_l1_at(const tsl_loss_args *a, const void *x,
                                           const void *target, int64_t i, void *grad)
{
    double d = tsl_hd_sub(tsl_loss_load(a->dtype, x, i), tsl_loss_load(a->dtype, target, i));
    if (grad)
        tsl_loss_store(a->dtype, grad, i, d > 0 ? a->scale : d < 0 ? -a->scale : d == 0 ? 0.0 : d);
    return d < 0 ? -d : d;
}

/* Whether the position's first maximum over classes is `label` (a good label). */
static inline TSL_HD int tsl_loss_hit_at(const tsl_loss_args *a, const void *x, int64_t base,
                                         int64_t label)
{
    const int64_t stride = tsl_loss_class_stride(a);
    int64_t best = 0;
    double top = tsl_loss_load(a->dtype, x, base);
    for (int64_t c = 1; c < a->classes; c++) {
        double t = tsl_loss_load(a->dtype, x, base + c * stride);
        if (t > top) {
            top = t;
            best = c;
        }
    }
    return best == label;
}

/* ---- soft Dice ---- */

/* Softmax probability of a logit, from the position's softmax terms. */
static inline TSL_HD double tsl_dice_p(double logit, double top, double total)
{
    return tsl_hd_div(tsl_hd_exp(tsl_hd_sub(logit, top)), total);
}

/* dloss/dp_c at a position whose label is `label`, from the coefficients (tsl_dice_coef). */
static inline TSL_HD double tsl_dice_dp(const double *coef, int64_t classes, int64_t c,
                                        int64_t label)
{
    return tsl_hd_add(tsl_hd_mul(coef[c], (double)(c == label)), coef[classes + c]);
}

/* Class c's coefficients from its totals I, P and G (tsl_dice_coef in loss.h). */
static inline TSL_HD void tsl_dice_coef_class(double inter, double p_sum, double g_sum,
                                              double smooth, double classes, double *c0, double *c1)
{
    double S = tsl_hd_add(tsl_hd_add(p_sum, g_sum), smooth);
    double CS = tsl_hd_mul(classes, S);
    *c0 = tsl_hd_div(-2.0, CS);
    *c1 = tsl_hd_div(tsl_hd_add(tsl_hd_mul(2.0, inter), smooth), tsl_hd_mul(CS, S));
}

/* The difference loss (tsl_difference_tile): entry (i, j) of the Gram matrix of an n x f value,
 * a sum over the features in their order (the CPU's and the GPU's bits alike). */
static inline TSL_HD double tsl_diff_gram(int dtype, const void *a, int64_t f, int64_t i, int64_t j)
{
    double s = 0;
    for (int64_t k = 0; k < f; k++)
        s = tsl_hd_add(
            s, tsl_hd_mul(tsl_loss_load(dtype, a, i * f + k), tsl_loss_load(dtype, a, j * f + k)));
    return s;
}

/* Gradient element (i, k) of sum Ga . Gb with respect to A (n x f): 2 sum_j Gb[i, j] A[j, k],
 * `other` the other value's Gram matrix. */
static inline TSL_HD double tsl_diff_grad(int dtype, const void *a, int64_t n, int64_t f,
                                          const double *other, int64_t i, int64_t k)
{
    double s = 0;
    for (int64_t j = 0; j < n; j++)
        s = tsl_hd_add(s, tsl_hd_mul(other[i * n + j], tsl_loss_load(dtype, a, j * f + k)));
    return tsl_hd_mul(2.0, s);
}

/* The similarity loss (tsl_similarity_tile): the squared distance between row i of x and row j of
 * y (n x f each), a sum over the features in their order. */
static inline TSL_HD double tsl_mmd_dist(int dtype, const void *x, const void *y, int64_t f,
                                         int64_t i, int64_t j)
{
    double s = 0;
    for (int64_t k = 0; k < f; k++) {
        double e =
            tsl_hd_sub(tsl_loss_load(dtype, x, i * f + k), tsl_loss_load(dtype, y, j * f + k));
        s = tsl_hd_add(s, tsl_hd_mul(e, e));
    }
    return s;
}

#define TSL_MMD_BANDWIDTHS 19

/* The kernel of the similarity loss at squared distance dist, k = sum_s exp(-dist / (2 s^2))
 * over the 19 bandwidths s of the domain separation networks' MMD (1e-6 ... 1e6), and its
 * derivative in dist, dk = -sum_s exp(-dist / (2 s^2)) / (2 s^2). */
static inline TSL_HD void tsl_mmd_kernel(double dist, double *k, double *dk)
{
    const double sigma[TSL_MMD_BANDWIDTHS] = {1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1,   5,   10, 15,
                                              20,   25,   30,   35,   100,  1e3,  1e4, 1e5, 1e6};
    double ks = 0, dks = 0;
    for (int s = 0; s < TSL_MMD_BANDWIDTHS; s++) {
        double beta = tsl_hd_div(1.0, tsl_hd_mul(2.0, tsl_hd_mul(sigma[s], sigma[s])));
        double e = tsl_hd_exp(-tsl_hd_mul(beta, dist));
        ks = tsl_hd_add(ks, e);
        dks = tsl_hd_sub(dks, tsl_hd_mul(beta, e));
    }
    *k = ks;
    *dk = dks;
}

/* Gradient element (i, k) of the similarity loss with respect to x (n x f), y the other value:
 * 4 / n^2 (sum_j wself[i n + j] (x_ik - x_jk) - sum_j wcross[i rs + j cs] (x_ik - y_jk)), the w
 * the kernel's derivatives at the pairs' squared distances (wcross indexed (x's row, y's row)
 * through the strides rs and cs). */
static inline TSL_HD double tsl_mmd_grad(int dtype, const void *x, const void *y, int64_t n,
                                         int64_t f, const double *wself, const double *wcross,
                                         int64_t rs, int64_t cs, int64_t i, int64_t k)
{
    const double xi = tsl_loss_load(dtype, x, i * f + k);
    double s = 0;
    for (int64_t j = 0; j < n; j++) {
        s = tsl_hd_add(
            s, tsl_hd_mul(wself[i * n + j], tsl_hd_sub(xi, tsl_loss_load(dtype, x, j * f + k))));
        s = tsl_hd_sub(s, tsl_hd_mul(wcross[i * rs + j * cs],
                                     tsl_hd_sub(xi, tsl_loss_load(dtype, y, j * f + k))));
    }
    return tsl_hd_div(tsl_hd_mul(4.0, s), tsl_hd_mul((double)n, (double)n));
}

#endif /* TESSEL_CODELETS_LOSS_MATH_H */
