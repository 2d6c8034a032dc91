/* Exact sums: a fixed-point accumulator per tile, merged by a tree of tasks, rounded once.
 *
 * A finite double is m * 2^(p - 1074) with an integer m < 2^53 and p >= 0. Limb k holds
 * bits [32k, 32k + 32) of the fixed-point value; a deposit adds m << (p % 32) split into
 * three 32-bit pieces to limbs p/32 .. p/32 + 2. Limbs are int64, so up to 2^30 deposits
 * fit before carries must be propagated (normalisation). Large float arrays are first
 * summed exactly into one integer bin per exponent, so each bin makes one deposit. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "check.h"
#include "tile_ops.h"

#define LIMB_BITS 32
#define LIMB_MASK ((int64_t)0xffffffff)
#define DEPOSITS_BEFORE_NORMALIZE ((int64_t)1 << 30)
#define DOUBLE_BIAS 1074 /* exponent of bit 0 is -1074 */

_Static_assert(TSL_ACC_LIMBS *LIMB_BITS >= 2098 + 2 * LIMB_BITS,
               "accumulator must hold every finite double plus carry headroom");

void tsl_acc_init(tsl_acc *acc)
{
    memset(acc, 0, sizeof *acc);
}

void tsl_acc_normalize(tsl_acc *acc)
{
    for (int k = 0; k < TSL_ACC_LIMBS - 1; k++) {
        int64_t carry = acc->limb[k] >> LIMB_BITS; /* arithmetic shift: floor division */
        acc->limb[k] -= carry * ((int64_t)1 << LIMB_BITS);
        acc->limb[k + 1] += carry;
    }
    acc->deposits = 0;
}

/* Deposit magnitude * 2^exp2 (exp2 >= -1074, magnitude < 2^64) with a sign. */
static void acc_deposit(tsl_acc *acc, uint64_t magnitude, int exp2, int negative)
{
    if (!magnitude)
        return;
    int position = exp2 + DOUBLE_BIAS;
    int k = position / LIMB_BITS;
    TSL_CODELET_CHECK(position >= 0 && k + 2 < TSL_ACC_LIMBS, "deposit outside the accumulator");
    unsigned __int128 shifted = (unsigned __int128)magnitude << (position % LIMB_BITS);
    int64_t piece0 = (int64_t)(uint64_t)(shifted & 0xffffffffu);
    int64_t piece1 = (int64_t)(uint64_t)((shifted >> 32) & 0xffffffffu);
    int64_t piece2 = (int64_t)(uint64_t)(shifted >> 64);
    if (negative) {
        acc->limb[k] -= piece0;
        acc->limb[k + 1] -= piece1;
        acc->limb[k + 2] -= piece2;
    } else {
        acc->limb[k] += piece0;
        acc->limb[k + 1] += piece1;
        acc->limb[k + 2] += piece2;
    }
    if (++acc->deposits >= DEPOSITS_BEFORE_NORMALIZE)
        tsl_acc_normalize(acc);
}

void tsl_acc_add(tsl_acc *acc, double value)
{
    uint64_t bits;
    memcpy(&bits, &value, sizeof bits);
    int negative = (int)(bits >> 63);
    int exponent = (int)((bits >> 52) & 0x7ff);
    uint64_t fraction = bits & (((uint64_t)1 << 52) - 1);
    if (exponent == 0x7ff) {
        if (fraction)
            acc->nan_count++;
        else if (negative)
            acc->neg_inf++;
        else
            acc->pos_inf++;
        return;
    }
    uint64_t mantissa = exponent ? (fraction | ((uint64_t)1 << 52)) : fraction;
    /* value = mantissa * 2^(max(exponent, 1) - 1075) */
    acc_deposit(acc, mantissa, (exponent ? exponent : 1) - 1075, negative);
}

void tsl_acc_merge(tsl_acc *dst, const tsl_acc *src)
{
    tsl_acc copy = *src;
    tsl_acc_normalize(&copy);
    tsl_acc_normalize(dst);
    for (int k = 0; k < TSL_ACC_LIMBS; k++)
        dst->limb[k] += copy.limb[k];
    tsl_acc_normalize(dst);
    dst->nan_count += copy.nan_count;
    dst->pos_inf += copy.pos_inf;
    dst->neg_inf += copy.neg_inf;
    dst->flagged += copy.flagged;
}

/* Bits [low, low + count) of a normalised non-negative accumulator, count <= 64. */
static uint64_t acc_bits(const tsl_acc *acc, int low, int count)
{
    uint64_t out = 0;
    for (int i = 0; i < count; i++) {
        int bit = low + i;
        if (bit < 0)
            continue;
        uint64_t limb = (uint64_t)acc->limb[bit / LIMB_BITS];
        out |= ((limb >> (bit % LIMB_BITS)) & 1u) << i;
    }
    return out;
}

/* Whether any bit below `bit` is set. */
static int acc_any_below(const tsl_acc *acc, int bit)
{
    if (bit <= 0)
        return 0;
    int full = bit / LIMB_BITS;
    for (int k = 0; k < full; k++)
        if (acc->limb[k])
            return 1;
    int rest = bit % LIMB_BITS;
    return rest && ((uint64_t)acc->limb[full] & (((uint64_t)1 << rest) - 1)) != 0;
}

double tsl_acc_round(const tsl_acc *in)
{
    if (in->nan_count || (in->pos_inf && in->neg_inf))
        return NAN;
    if (in->pos_inf)
        return INFINITY;
    if (in->neg_inf)
        return -INFINITY;
    tsl_acc acc = *in;
    tsl_acc_normalize(&acc);
    double sign = 1.0;
    if (acc.limb[TSL_ACC_LIMBS - 1] < 0) {
        for (int k = 0; k < TSL_ACC_LIMBS; k++)
            acc.limb[k] = -acc.limb[k];
        tsl_acc_normalize(&acc);
        sign = -1.0;
    }
    int top = TSL_ACC_LIMBS - 1;
    while (top >= 0 && acc.limb[top] == 0)
        top--;
    if (top < 0)
        return 0.0;
    uint64_t top_limb = (uint64_t)acc.limb[top];
    TSL_CODELET_CHECK(top_limb < ((uint64_t)1 << 62), "accumulator not normalised");
    int highest = top * LIMB_BITS + 63 - __builtin_clzll(top_limb);
    if (highest <= 52) /* fits a 53-bit mantissa: exact */
        return sign * ldexp((double)acc_bits(&acc, 0, highest + 1), -DOUBLE_BIAS);
    int low = highest - 52;
    uint64_t mantissa = acc_bits(&acc, low, 53);
    int round_bit = (int)acc_bits(&acc, low - 1, 1);
    int sticky = acc_any_below(&acc, low - 1);
    if (round_bit && (sticky || (mantissa & 1u)))
        mantissa++; /* 2^53 is still exact as a double */
    return sign * ldexp((double)mantissa, low - DOUBLE_BIAS);
}

/* Deposit a signed 128-bit value times 2^exp2 as two 64-bit halves. */
static void acc_deposit_wide(tsl_acc *acc, __int128 value, int exp2)
{
    int negative = value < 0;
    unsigned __int128 magnitude = negative ? -(unsigned __int128)value : (unsigned __int128)value;
    acc_deposit(acc, (uint64_t)magnitude, exp2, negative);
    acc_deposit(acc, (uint64_t)(magnitude >> 64), exp2 + 64, negative);
}

/* Below this many elements, binning costs more than it saves. */
#define BINNED_MIN_COUNT 2048

/* float32: one signed integer bin per exponent field. A bin gains at most 2^24 per element
 * and a tile has fewer than 2^32 elements, so int64 bins cannot overflow. */
static void add_f32_binned(tsl_acc *acc, const float *x, int64_t count)
{
    int64_t bins[256] = {0};
    for (int64_t i = 0; i < count; i++) {
        uint32_t bits;
        memcpy(&bits, &x[i], sizeof bits);
        uint32_t exponent = (bits >> 23) & 0xffu;
        int64_t mantissa = (int64_t)((bits & 0x7fffffu) | (exponent ? 0x800000u : 0u));
        bins[exponent] += (bits >> 31) ? -mantissa : mantissa;
    }
    for (int e = 0; e < 255; e++) /* value = mantissa * 2^(max(e, 1) - 150) */
        if (bins[e])
            acc_deposit_wide(acc, bins[e], (e ? e : 1) - 150);
    if (bins[255]) /* non-finite values are rare: count them one by one */
        for (int64_t i = 0; i < count; i++)
            if (!isfinite(x[i]))
                tsl_acc_add(acc, x[i]);
}

/* float64: 2048 bins of 128-bit integers (each element adds at most 2^53). */
static void add_f64_binned(tsl_acc *acc, const double *x, int64_t count)
{
    static _Thread_local __int128 bins[2048];
    memset(bins, 0, sizeof bins);
    int nonfinite = 0;
    for (int64_t i = 0; i < count; i++) {
        uint64_t bits;
        memcpy(&bits, &x[i], sizeof bits);
        uint32_t exponent = (uint32_t)(bits >> 52) & 0x7ffu;
        int64_t mantissa =
            (int64_t)((bits & 0xfffffffffffffULL) | (exponent ? 0x10000000000000ULL : 0));
        bins[exponent] += (bits >> 63) ? -mantissa : mantissa;
        nonfinite |= exponent == 0x7ff;
    }
    for (int e = 0; e < 2047; e++) /* value = mantissa * 2^(max(e, 1) - 1075) */
        if (bins[e])
            acc_deposit_wide(acc, bins[e], (e ? e : 1) - 1075);
    if (nonfinite)
        for (int64_t i = 0; i < count; i++)
            if (!isfinite(x[i]))
                tsl_acc_add(acc, x[i]);
}

void tsl_acc_add_squares_f32(tsl_acc *acc, const float *x, int64_t count)
{
    /* x = m * 2^(max(e, 1) - 150) with m < 2^24, so x^2 = m^2 * 2^(2 (max(e, 1) - 150)):
     * one 128-bit bin per exponent field holds the exact sum of m^2 (< 2^48 each). */
    unsigned __int128 bins[256] = {0};
    int nonfinite = 0;
    for (int64_t i = 0; i < count; i++) {
        uint32_t bits;
        memcpy(&bits, &x[i], sizeof bits);
        uint32_t exponent = (bits >> 23) & 0xffu;
        uint64_t mantissa = (bits & 0x7fffffu) | (exponent ? 0x800000u : 0u);
        bins[exponent] += mantissa * mantissa;
        nonfinite |= exponent == 0xff;
    }
    for (int e = 0; e < 255; e++)
        if (bins[e])
            acc_deposit_wide(acc, (__int128)bins[e], 2 * ((e ? e : 1) - 150));
    if (nonfinite)
        for (int64_t i = 0; i < count; i++)
            if (!isfinite(x[i]))
                tsl_acc_add(acc, (double)x[i] * x[i]);
}

void tsl_acc_add_array(tsl_acc *acc, tsl_dtype dtype, const void *data, int64_t count)
{
    switch (dtype) {
    case TSL_F32:
        if (count >= BINNED_MIN_COUNT) {
            add_f32_binned(acc, data, count);
        } else {
            for (int64_t i = 0; i < count; i++)
                tsl_acc_add(acc, ((const float *)data)[i]);
        }
        return;
    case TSL_F64:
        if (count >= BINNED_MIN_COUNT) {
            add_f64_binned(acc, data, count);
        } else {
            for (int64_t i = 0; i < count; i++)
                tsl_acc_add(acc, ((const double *)data)[i]);
        }
        return;
    case TSL_I32: { /* 2^31 elements of at most 2^31 fit an int64; deposit before that */
        int64_t partial = 0;
        for (int64_t i = 0; i < count; i++) {
            partial += ((const int32_t *)data)[i];
            if ((i & 0x3fffffff) == 0x3fffffff) {
                acc_deposit_wide(acc, partial, 0);
                partial = 0;
            }
        }
        acc_deposit_wide(acc, partial, 0);
        return;
    }
    case TSL_U8: {
        int64_t partial = 0;
        for (int64_t i = 0; i < count; i++)
            partial += ((const uint8_t *)data)[i];
        acc_deposit_wide(acc, partial, 0);
        return;
    }
    case TSL_I64:
        break;
    }
    TSL_CODELET_CHECK(0, "sum: dtype");
}

static void sum_partial_cpu(void *buffers[], void *cl_arg)
{
    tsl_sum_args a;
    starpu_codelet_unpack_args(cl_arg, &a);
    const void *tile = (const void *)STARPU_VECTOR_GET_PTR(buffers[0]);
    tsl_acc *acc = (tsl_acc *)STARPU_VECTOR_GET_PTR(buffers[1]);
    TSL_CODELET_CHECK(STARPU_VECTOR_GET_NX(buffers[1]) * STARPU_VECTOR_GET_ELEMSIZE(buffers[1]) ==
                          sizeof(tsl_acc),
                      "sum: accumulator size");
    tsl_acc_init(acc);
    tsl_acc_add_array(acc, (tsl_dtype)a.dtype, tile, a.count);
    tsl_acc_normalize(acc);
}

/* Merge arrays of accumulators element by element (one or several per handle). */
static void sum_merge_cpu(void *buffers[], void *cl_arg)
{
    (void)cl_arg;
    size_t bytes = STARPU_VECTOR_GET_NX(buffers[0]) * STARPU_VECTOR_GET_ELEMSIZE(buffers[0]);
    TSL_CODELET_CHECK(bytes % sizeof(tsl_acc) == 0 &&
                          bytes == STARPU_VECTOR_GET_NX(buffers[1]) *
                                       STARPU_VECTOR_GET_ELEMSIZE(buffers[1]),
                      "merge: accumulator arrays differ");
    const tsl_acc *src = (const tsl_acc *)STARPU_VECTOR_GET_PTR(buffers[0]);
    tsl_acc *dst = (tsl_acc *)STARPU_VECTOR_GET_PTR(buffers[1]);
    for (size_t k = 0; k < bytes / sizeof(tsl_acc); k++)
        tsl_acc_merge(&dst[k], &src[k]);
}

static struct starpu_perfmodel sum_partial_model = {
    .type = STARPU_HISTORY_BASED,
    .symbol = "tsl_sum_partial",
};
static struct starpu_perfmodel sum_merge_model = {
    .type = STARPU_HISTORY_BASED,
    .symbol = "tsl_sum_merge",
};

struct starpu_codelet tsl_cl_sum_partial = {
    .cpu_funcs = {sum_partial_cpu},
    .cpu_funcs_name = {"sum_partial_cpu"},
    .nbuffers = 2,
    .modes = {STARPU_R, STARPU_W},
    .model = &sum_partial_model,
    .name = "tsl_sum_partial",
};

struct starpu_codelet tsl_cl_sum_merge = {
    .cpu_funcs = {sum_merge_cpu},
    .cpu_funcs_name = {"sum_merge_cpu"},
    .nbuffers = 2,
    .modes = {STARPU_R, STARPU_RW},
    .model = &sum_merge_model,
    .name = "tsl_sum_merge",
};
