/* The exact accumulator's arithmetic that the CPU (codelets/reduce.c) and the CUDA kernels
 * (codelets/reduce.cu, batchnorm.cu, loss.cu) share: splitting a value into its limb pieces,
 * normalisation and the final rounding. Written once as TSL_HD functions, so the CPU tests
 * check the bits the GPU computes. */
#ifndef TESSEL_CODELETS_REDUCE_HD_H
#define TESSEL_CODELETS_REDUCE_HD_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "codelet.h"
#include "hd.h"
#include "hd_arith.h"
#include "reduce.h"

#define TSL_ACC_LIMB_BITS 32
#define TSL_ACC_BIAS 1074 /* exponent of bit 0 is -1074 */
/* Deposits an accumulator takes between normalisations: each adds under 2^32 to a limb, so a
 * limb stays far inside int64. */
#define TSL_ACC_DEPOSITS_BEFORE_NORMALIZE ((int64_t)1 << 30)

/* What one value adds to an accumulator. */
enum {
    TSL_ACC_NOTHING = 0, /* a zero */
    TSL_ACC_PIECES = 1,  /* piece[0..2] to limbs k .. k + 2 */
    TSL_ACC_NAN = 2,
    TSL_ACC_POS_INF = 3,
    TSL_ACC_NEG_INF = 4,
};

/* The pieces of +-magnitude * 2^exp2 (magnitude < 2^64, exp2 >= -1074): magnitude shifted to
 * its bit position, split into three 32-bit pieces for limbs *k .. *k + 2, negated when
 * `negative`. Each piece is below 2^32 in magnitude. Returns TSL_ACC_NOTHING for a zero
 * magnitude. The caller checks *k + 2 < TSL_ACC_LIMBS (always so for a double's exp2). */
static inline TSL_HD int tsl_acc_split(uint64_t magnitude, int exp2, int negative, int *k,
                                       int64_t piece[3])
{
    if (!magnitude)
        return TSL_ACC_NOTHING;
    int position = exp2 + TSL_ACC_BIAS;
    int shift = position % TSL_ACC_LIMB_BITS;
    *k = position / TSL_ACC_LIMB_BITS;
    uint64_t low = magnitude << shift;                      /* bits [0, 64) of the shifted */
    uint64_t high = shift ? magnitude >> (64 - shift) : 0u; /* bits [64, 96) */
    int64_t p0 = (int64_t)(low & 0xffffffffu), p1 = (int64_t)(low >> 32), p2 = (int64_t)high;
    piece[0] = negative ? -p0 : p0;
    piece[1] = negative ? -p1 : p1;
    piece[2] = negative ? -p2 : p2;
    return TSL_ACC_PIECES;
}

/* What a double adds: pieces for a finite nonzero value (its mantissa m < 2^53 at exponent
 * max(e, 1) - 1075), a count for NaN and the infinities, nothing for zeros. */
static inline TSL_HD int tsl_acc_split_double(double value, int *k, int64_t piece[3])
{
    uint64_t bits = tsl_double_bits(value);
    int negative = (int)(bits >> 63);
    int exponent = (int)((bits >> 52) & 0x7ff);
    uint64_t fraction = bits & (((uint64_t)1 << 52) - 1);
    if (exponent == 0x7ff)
        return fraction ? TSL_ACC_NAN : negative ? TSL_ACC_NEG_INF : TSL_ACC_POS_INF;
    uint64_t mantissa = exponent ? (fraction | ((uint64_t)1 << 52)) : fraction;
    return tsl_acc_split(mantissa, (exponent ? exponent : 1) - 1075, negative, k, piece);
}

/* Propagate carries: limbs 0 .. TSL_ACC_LIMBS - 2 end in [0, 2^32), the top limb takes the
 * rest (and the sign). */
static inline TSL_HD void tsl_acc_normalize_limbs(int64_t *limb)
{
    for (int k = 0; k < TSL_ACC_LIMBS - 1; k++) {
        int64_t carry = limb[k] >> TSL_ACC_LIMB_BITS; /* arithmetic shift: floor division */
        limb[k] -= carry * ((int64_t)1 << TSL_ACC_LIMB_BITS);
        limb[k + 1] += carry;
    }
}

/* acc += value exactly (tsl_acc_add()): its pieces deposited, NaN and the infinities counted,
 * the limbs normalised every TSL_ACC_DEPOSITS_BEFORE_NORMALIZE deposits. */
static inline TSL_HD void tsl_acc_add_value(tsl_acc *acc, double value)
{
    int k;
    int64_t piece[3];
    switch (tsl_acc_split_double(value, &k, piece)) {
    case TSL_ACC_PIECES:
        acc->limb[k] += piece[0];
        acc->limb[k + 1] += piece[1];
        acc->limb[k + 2] += piece[2];
        if (++acc->deposits >= TSL_ACC_DEPOSITS_BEFORE_NORMALIZE) {
            tsl_acc_normalize_limbs(acc->limb);
            acc->deposits = 0;
        }
        return;
    case TSL_ACC_NAN:
        acc->nan_count++;
        return;
    case TSL_ACC_POS_INF:
        acc->pos_inf++;
        return;
    case TSL_ACC_NEG_INF:
        acc->neg_inf++;
        return;
    default: /* a zero */
        return;
    }
}

/* dst += src (either normalised or not): both normalised (src into `scratch`), the limbs
 * added, the sum normalised, the counts added. */
static inline TSL_HD void tsl_acc_merge_into(tsl_acc *dst, const tsl_acc *src, tsl_acc *scratch)
{
    *scratch = *src;
    tsl_acc_normalize_limbs(scratch->limb);
    tsl_acc_normalize_limbs(dst->limb);
    for (int k = 0; k < TSL_ACC_LIMBS; k++)
        dst->limb[k] += scratch->limb[k];
    tsl_acc_normalize_limbs(dst->limb);
    dst->deposits = 0;
    dst->nan_count += scratch->nan_count;
    dst->pos_inf += scratch->pos_inf;
    dst->neg_inf += scratch->neg_inf;
    dst->flagged += scratch->flagged;
}

/* Bits [low, low + count) of a normalised non-negative accumulator, count <= 64. */
static inline TSL_HD uint64_t tsl_acc_bits(const tsl_acc *acc, int low, int count)
{
    uint64_t out = 0;
    for (int i = 0; i < count; i++) {
        int bit = low + i;
        if (bit < 0)
            continue;
        uint64_t limb = (uint64_t)acc->limb[bit / TSL_ACC_LIMB_BITS];
        out |= ((limb >> (bit % TSL_ACC_LIMB_BITS)) & 1u) << i;
    }
    return out;
}

/* Whether any bit below `bit` is set. */
static inline TSL_HD int tsl_acc_any_below(const tsl_acc *acc, int bit)
{
    if (bit <= 0)
        return 0;
    int full = bit / TSL_ACC_LIMB_BITS;
    for (int k = 0; k < full; k++)
        if (acc->limb[k])
            return 1;
    int rest = bit % TSL_ACC_LIMB_BITS;
    return rest && ((uint64_t)acc->limb[full] & (((uint64_t)1 << rest) - 1)) != 0;
}

static inline TSL_HD int tsl_clz64(uint64_t v)
{
#ifdef __CUDA_ARCH__
    return __clzll((long long)v);
#else
    return __builtin_clzll(v);
#endif
}

/* The accumulator's exact value rounded once to double (to nearest, ties to even); NaN,
 * +-inf from the counts. `scratch` (any accumulator, may be `in`) receives the normalised
 * magnitude. */
static inline TSL_HD double tsl_acc_round_into(const tsl_acc *in, tsl_acc *scratch)
{
    if (in->nan_count || (in->pos_inf && in->neg_inf))
        return NAN;
    if (in->pos_inf)
        return INFINITY;
    if (in->neg_inf)
        return -INFINITY;
    tsl_acc *acc = scratch;
    if (acc != in)
        *acc = *in;
    tsl_acc_normalize_limbs(acc->limb);
    double sign = 1.0;
    if (acc->limb[TSL_ACC_LIMBS - 1] < 0) {
        for (int k = 0; k < TSL_ACC_LIMBS; k++)
            acc->limb[k] = -acc->limb[k];
        tsl_acc_normalize_limbs(acc->limb);
        sign = -1.0;
    }
    int top = TSL_ACC_LIMBS - 1;
    while (top >= 0 && acc->limb[top] == 0)
        top--;
    if (top < 0)
        return 0.0;
    uint64_t top_limb = (uint64_t)acc->limb[top];
#ifndef __CUDA_ARCH__
    TSL_CODELET_CHECK(top_limb < ((uint64_t)1 << 62), "accumulator not normalised");
#endif
    int highest = top * TSL_ACC_LIMB_BITS + 63 - tsl_clz64(top_limb);
    if (highest <= 52) /* fits a 53-bit mantissa: exact */
        return sign * ldexp((double)tsl_acc_bits(acc, 0, highest + 1), -TSL_ACC_BIAS);
    int low = highest - 52;
    uint64_t mantissa = tsl_acc_bits(acc, low, 53);
    int round_bit = (int)tsl_acc_bits(acc, low - 1, 1);
    int sticky = tsl_acc_any_below(acc, low - 1);
    if (round_bit && (sticky || (mantissa & 1u)))
        mantissa++; /* 2^53 is still exact as a double */
    return sign * ldexp((double)mantissa, low - TSL_ACC_BIAS);
}

#endif /* TESSEL_CODELETS_REDUCE_HD_H */
