/* Exact sums: a fixed-point accumulator per tile, merged by a tree of tasks, rounded once.
 *
 * A finite double is m * 2^(p - 1074) with an integer m < 2^53 and p >= 0. Limb k holds
 * bits [32k, 32k + 32) of the fixed-point value; a deposit adds m << (p % 32) split into
 * three 32-bit pieces to limbs p/32 .. p/32 + 2. Limbs are int64, so up to 2^30 deposits
 * fit before carries must be propagated (normalisation). */
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
    if (!mantissa)
        return;
    int position = exponent ? exponent - 1 : 0;
    int k = position / LIMB_BITS;
    unsigned __int128 shifted = (unsigned __int128)mantissa << (position % LIMB_BITS);
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
    switch ((tsl_dtype)a.dtype) {
    case TSL_F32:
        for (int64_t i = 0; i < a.count; i++)
            tsl_acc_add(acc, ((const float *)tile)[i]);
        break;
    case TSL_F64:
        for (int64_t i = 0; i < a.count; i++)
            tsl_acc_add(acc, ((const double *)tile)[i]);
        break;
    case TSL_I32:
        for (int64_t i = 0; i < a.count; i++)
            tsl_acc_add(acc, ((const int32_t *)tile)[i]);
        break;
    case TSL_U8:
        for (int64_t i = 0; i < a.count; i++)
            tsl_acc_add(acc, ((const uint8_t *)tile)[i]);
        break;
    default:
        TSL_CODELET_CHECK(0, "sum: dtype");
    }
    tsl_acc_normalize(acc);
}

static void sum_merge_cpu(void *buffers[], void *cl_arg)
{
    (void)cl_arg;
    const tsl_acc *src = (const tsl_acc *)STARPU_VECTOR_GET_PTR(buffers[0]);
    tsl_acc *dst = (tsl_acc *)STARPU_VECTOR_GET_PTR(buffers[1]);
    tsl_acc_merge(dst, src);
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
