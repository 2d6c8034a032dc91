/* Exact sums: a fixed-point accumulator per tile, merged by a tree of tasks, rounded once.
 *
 * A finite double is m * 2^(p - 1074) with an integer m < 2^53 and p >= 0. Limb k holds
 * bits [32k, 32k + 32) of the fixed-point value; a deposit adds m << (p % 32) split into
 * three 32-bit pieces to limbs p/32 .. p/32 + 2. Limbs are int64, so up to 2^30 deposits
 * fit before carries must be propagated (normalisation). Large float arrays are first
 * summed exactly into one integer bin per exponent, so each bin makes one deposit; float32
 * arrays, on CPUs with AVX2, into double accumulators by an error-free split (below). The
 * limb arithmetic (split, normalisation, merge, rounding) is in reduce_hd.h, shared with the
 * CUDA kernels (reduce.cu). */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "codelet.h"
#include "reduce.h"
#include "reduce_hd.h"

#define LIMB_BITS TSL_ACC_LIMB_BITS
#define DEPOSITS_BEFORE_NORMALIZE TSL_ACC_DEPOSITS_BEFORE_NORMALIZE
#define DOUBLE_BIAS TSL_ACC_BIAS /* exponent of bit 0 is -1074 */

_Static_assert(TSL_ACC_LIMBS *LIMB_BITS >= 2098 + 2 * LIMB_BITS,
               "accumulator must hold every finite double plus carry headroom");

void tsl_acc_init(tsl_acc *acc)
{
    memset(acc, 0, sizeof *acc);
}

void tsl_acc_normalize(tsl_acc *acc)
{
    tsl_acc_normalize_limbs(acc->limb);
    acc->deposits = 0;
}

/* Deposit magnitude * 2^exp2 (exp2 >= -1074, magnitude < 2^64) with a sign. */
static void acc_deposit(tsl_acc *acc, uint64_t magnitude, int exp2, int negative)
{
    if (!magnitude)
        return;
    int position = exp2 + DOUBLE_BIAS, k;
    TSL_CODELET_CHECK(position >= 0 && position / LIMB_BITS + 2 < TSL_ACC_LIMBS,
                      "deposit outside the accumulator");
    int64_t piece[3];
    tsl_acc_split(magnitude, exp2, negative, &k, piece);
    acc->limb[k] += piece[0];
    acc->limb[k + 1] += piece[1];
    acc->limb[k + 2] += piece[2];
    if (++acc->deposits >= DEPOSITS_BEFORE_NORMALIZE)
        tsl_acc_normalize(acc);
}

void tsl_acc_add(tsl_acc *acc, double value)
{
    tsl_acc_add_value(acc, value);
}

void tsl_acc_merge(tsl_acc *dst, const tsl_acc *src)
{
    tsl_acc scratch;
    tsl_acc_merge_into(dst, src, &scratch);
}

double tsl_acc_round(const tsl_acc *in)
{
    tsl_acc scratch;
    return tsl_acc_round_into(in, &scratch);
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

/* ---- float32, integer bins ----
 * A finite float is m * 2^(max(e, 1) - 150), e its exponent field and m < 2^24 its significand
 * (hidden bit included when e > 0). A sum bins signed m by e; a product a b is exactly
 * ma mb * 2^(max(ea, 1) + max(eb, 1) - 300) with ma mb < 2^48, so products (squares included)
 * bin signed ma mb by max(ea, 1) + max(eb, 1) (at most 508). Every bin is an exact integer
 * and makes one deposit at the end.
 *
 * Consecutive elements mostly share an exponent, so with one set of bins every add would
 * wait for the store of the previous one to the same bin. Elements go to BIN_SETS sets in
 * turn instead, so BIN_SETS chains run side by side. The sets are int64 and take at most
 * 2^14 elements of a block (each adds less than 2^48), then fold into 128-bit bins. */
#define BIN_SETS 4
#define BIN_BLOCK ((int64_t)BIN_SETS << 14)
#define SUM_BINS 256
#define PRODUCT_BINS 512
#define NONFINITE_PRODUCT 511 /* bin of products with an infinite or NaN factor: ignored */

typedef struct f32_bins {
    __int128 sum[SUM_BINS];
    __int128 product[PRODUCT_BINS];
    int nonfinite; /* some element (of a or b) is infinite or NaN */
} f32_bins;

static inline uint32_t f32_bits(float v)
{
    uint32_t bits;
    memcpy(&bits, &v, sizeof bits);
    return bits;
}

/* Exponent field and significand of a float's bits. */
#define F32_EXPONENT(bits) (((bits) >> 23) & 0xffu)
#define F32_SIGNIFICAND(bits, e) ((int64_t)(((bits)&0x7fffffu) | ((e) ? 0x800000u : 0u)))

/* Element i into bin set `set`: see bin_f32. */
#define BIN_ONE(set, i)                                                                            \
    do {                                                                                           \
        uint32_t bits_a = f32_bits(a[i]), e_a = F32_EXPONENT(bits_a);                              \
        int64_t m_a = F32_SIGNIFICAND(bits_a, e_a);                                                \
        int64_t sign_a = -(int64_t)(bits_a >> 31); /* 0 or -1 */                                   \
        if (SUM)                                                                                   \
            sums[set][e_a] += (m_a ^ sign_a) - sign_a;                                             \
        if (PRODUCT && SQUARES) {                                                                  \
            products[set][2 * (e_a ? e_a : 1)] += m_a * m_a;                                       \
        } else if (PRODUCT) {                                                                      \
            uint32_t bits_b = f32_bits(b[i]), e_b = F32_EXPONENT(bits_b);                          \
            int64_t m_b = F32_SIGNIFICAND(bits_b, e_b);                                            \
            int64_t sign = -(int64_t)((bits_a ^ bits_b) >> 31);                                    \
            uint32_t bin = (e_a ? e_a : 1) + (e_b ? e_b : 1);                                      \
            bin = (e_a == 0xffu) | (e_b == 0xffu) ? NONFINITE_PRODUCT : bin;                       \
            products[set][bin] += ((m_a * m_b) ^ sign) - sign;                                     \
            nonfinite |= e_b == 0xffu;                                                             \
        }                                                                                          \
        nonfinite |= e_a == 0xffu;                                                                 \
    } while (0)

/* Bins sums of a (when SUM), and products a b (when PRODUCT; squares of a when SQUARES, b
 * being a) of `count` floats into `out`. Inlined with constant flags, so each caller gets a
 * loop with only the work it asked for. */
static inline __attribute__((always_inline)) void bin_f32(f32_bins *out, const float *a,
                                                          const float *b, int64_t count,
                                                          const int SUM, const int PRODUCT,
                                                          const int SQUARES)
{
    int64_t sums[BIN_SETS][SUM_BINS], products[BIN_SETS][PRODUCT_BINS];
    uint32_t nonfinite = 0;
    for (int64_t start = 0; start < count; start += BIN_BLOCK) {
        int64_t end = count - start < BIN_BLOCK ? count : start + BIN_BLOCK;
        if (SUM)
            memset(sums, 0, sizeof sums);
        if (PRODUCT)
            memset(products, 0, sizeof products);
        int64_t i = start;
        for (; i + BIN_SETS <= end; i += BIN_SETS)
            for (int set = 0; set < BIN_SETS; set++)
                BIN_ONE(set, i + set);
        for (; i < end; i++)
            BIN_ONE(0, i);
        for (int set = 0; set < BIN_SETS; set++) {
            if (SUM)
                for (int e = 0; e < SUM_BINS; e++)
                    out->sum[e] += sums[set][e];
            if (PRODUCT)
                for (int e = 0; e < PRODUCT_BINS; e++)
                    out->product[e] += products[set][e];
        }
    }
    out->nonfinite |= nonfinite != 0;
}

/* Deposit the finite bins: sums are m * 2^(max(e, 1) - 150), products ma mb * 2^(bin - 300).
 * Finite products land in bins up to 2 * 254; squares of infinities and NaNs in 2 * 255 (the
 * squares' loop does not route them to NONFINITE_PRODUCT): neither is deposited. */
#define LAST_FINITE_PRODUCT_BIN (2 * 254)
static void deposit_f32_bins(tsl_acc *sum, tsl_acc *product, const f32_bins *bins)
{
    for (int e = 0; sum && e < SUM_BINS - 1; e++)
        if (bins->sum[e])
            acc_deposit_wide(sum, bins->sum[e], (e ? e : 1) - 150);
    for (int e = 0; product && e <= LAST_FINITE_PRODUCT_BIN; e++)
        if (bins->product[e])
            acc_deposit_wide(product, bins->product[e], e - 300);
}

/* This thread's bins, through a call: in a shared library a thread-local access may call
 * __tls_get_addr, and compilers redo it inside loops when they see the variable. */
static __attribute__((noinline)) f32_bins *thread_bins(void)
{
    static _Thread_local f32_bins bins;
    return &bins;
}

/* Sum of a into `sum` and products a b into `product` (either may be NULL; b is a for
 * squares), exactly, for any floats: binned when long, one deposit per element when short.
 * Non-finite values, rare, are added one by one as tsl_acc_add() counts them. */
static void add_f32_binned(tsl_acc *sum, tsl_acc *product, const float *a, const float *b,
                           int64_t count)
{
    if (count < BINNED_MIN_COUNT) {
        for (int64_t i = 0; i < count; i++) {
            if (sum)
                tsl_acc_add(sum, a[i]);
            if (product)
                tsl_acc_add(product, (double)a[i] * b[i]); /* exact in double */
        }
        return;
    }
    f32_bins *bins = thread_bins();
    memset(bins, 0, sizeof *bins);
    if (!product)
        bin_f32(bins, a, a, count, 1, 0, 0);
    else if (a == b)
        sum ? bin_f32(bins, a, a, count, 1, 1, 1) : bin_f32(bins, a, a, count, 0, 1, 1);
    else
        sum ? bin_f32(bins, a, b, count, 1, 1, 0) : bin_f32(bins, a, b, count, 0, 1, 0);
    deposit_f32_bins(sum, product, bins);
    if (bins->nonfinite)
        for (int64_t i = 0; i < count; i++) {
            if (sum && !isfinite(a[i]))
                tsl_acc_add(sum, a[i]);
            if (product && (!isfinite(a[i]) || !isfinite(b[i])))
                tsl_acc_add(product, (double)a[i] * b[i]);
        }
}

/* ---- float32, error-free extraction into double accumulators (x86-64 with AVX2) ----
 * Faster than the bins where the vector unit is wide. A float, and a product of two floats
 * (48 significant bits), is exact in double. Take a chunk whose values v are all below 2^T in
 * magnitude and s = 1.5 * 2^k with k = T + H + 2. Adding v to s rounds v to a multiple of
 * u = ulp(s) = 2^(k - 52): (s + v) - s is that multiple, exactly, and v minus it (at most
 * u / 2) is exact too. After 2^H such additions s is still in [2^k, 2^(k + 1)), so s minus
 * its start is the exact sum of the multiples (the indexed-sum step of ReproBLAS). Each of
 * the EXTRACT_LANES lanes of an accumulator takes at most 2^H values of a chunk; a second
 * level takes the rests, with T' = T + H - 51. A value with bits below the second level's
 * unit, 2^(T + 2H - 101), leaves a nonzero rest (a float 2^(78 - 2H) or a product
 * 2^(54 - 2H) times smaller than the chunk's largest): that chunk then goes to the bins, as
 * do chunks holding infinities or NaNs. Either way each chunk's sum is exact, so the result
 * does not depend on the path or the chunking. The lanes of a level add exactly (four
 * multiples of u below 2^(k - 2)), so a level makes one deposit per chunk. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

#define EXTRACT_SIMD 1
#define EXTRACT_LANES 4
#define EXTRACT_HEADROOM 9 /* H above */
#define EXTRACT_CHUNK ((int64_t)EXTRACT_LANES << EXTRACT_HEADROOM)
#define EXTRACT_ALIGN 8 /* the vector code takes counts that are multiples of this */
#define EXTRACT_MIN_COUNT 64
#define AVX2_INLINE static inline __attribute__((always_inline, target("avx2")))

typedef float f32x4 __attribute__((vector_size(16)));
typedef double f64x4 __attribute__((vector_size(32)));
typedef int64_t i64x4 __attribute__((vector_size(32)));

/* Largest |v[i]| of n (a multiple of 8) floats, as float bits: 0x7f800000 or more when some
 * value is infinite or NaN (their bits order as their magnitudes). */
AVX2_INLINE uint32_t max_abs_bits(const float *v, int64_t n)
{
    const __m256i magnitude = _mm256_set1_epi32(0x7fffffff);
    __m256i best0 = _mm256_setzero_si256(), best1 = best0;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i v0 = _mm256_loadu_si256((const __m256i *)(v + i));
        __m256i v1 = _mm256_loadu_si256((const __m256i *)(v + i + 8));
        best0 = _mm256_max_epi32(best0, _mm256_and_si256(v0, magnitude));
        best1 = _mm256_max_epi32(best1, _mm256_and_si256(v1, magnitude));
    }
    for (; i < n; i += 8)
        best0 = _mm256_max_epi32(
            best0, _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(v + i)), magnitude));
    int32_t lanes[8];
    _mm256_storeu_si256((__m256i *)lanes, _mm256_max_epi32(best0, best1));
    int32_t out = 0;
    for (int lane = 0; lane < 8; lane++)
        out = lanes[lane] > out ? lanes[lane] : out;
    return (uint32_t)out;
}

/* Start of the accumulator of a level whose values are below 2^top; the next level's top. */
static inline double level_start(int top)
{
    return ldexp(1.5, top + EXTRACT_HEADROOM + 2);
}
#define NEXT_LEVEL_TOP(top) ((top) + EXTRACT_HEADROOM - 51)

/* s gains v rounded to the level's unit; v keeps the rest. Both steps are exact. */
#define EXTRACT_LEVEL(v, s)                                                                        \
    do {                                                                                           \
        f64x4 sum_ = (s) + (v);                                                                    \
        (v) -= sum_ - (s);                                                                         \
        (s) = sum_;                                                                                \
    } while (0)

/* What the lanes of a level's accumulator gained, as one exact double. */
AVX2_INLINE double level_total(f64x4 s, double start)
{
    return ((s[0] - start) + (s[1] - start)) + ((s[2] - start) + (s[3] - start));
}

/* Sums of a and products a b (as bin_f32) of n floats, n a multiple of EXTRACT_ALIGN and at
 * most EXTRACT_CHUNK, deposited into sum and product. Returns 0, having deposited nothing,
 * when the chunk needs the bins. */
AVX2_INLINE int extract_f32_impl(tsl_acc *sum, tsl_acc *product, const float *a, const float *b,
                                 int64_t n, const int SUM, const int PRODUCT, const int SQUARES)
{
    uint32_t max_a = max_abs_bits(a, n);
    uint32_t max_b = PRODUCT && !SQUARES ? max_abs_bits(b, n) : max_a;
    if (max_a >= 0x7f800000u || max_b >= 0x7f800000u)
        return 0;
    float largest_a, largest_b;
    memcpy(&largest_a, &max_a, sizeof largest_a);
    memcpy(&largest_b, &max_b, sizeof largest_b);
    int sum_top, product_top; /* |a[i]| < 2^sum_top, |a[i] b[i]| < 2^product_top */
    frexp((double)largest_a, &sum_top);
    frexp((double)largest_a * largest_b, &product_top);
    const double sum_start0 = level_start(sum_top);
    const double sum_start1 = level_start(NEXT_LEVEL_TOP(sum_top));
    const double product_start0 = level_start(product_top);
    const double product_start1 = level_start(NEXT_LEVEL_TOP(product_top));
    const f64x4 zero = {0, 0, 0, 0};
    f64x4 sum0 = zero + sum_start0, sum1 = zero + sum_start1;
    f64x4 product0 = zero + product_start0, product1 = zero + product_start1;
    i64x4 rest = {0, 0, 0, 0};
    for (int64_t i = 0; i < n; i += EXTRACT_LANES) {
        f32x4 a4;
        memcpy(&a4, a + i, sizeof a4);
        f64x4 x = __builtin_convertvector(a4, f64x4);
        if (SUM) {
            f64x4 v = x;
            EXTRACT_LEVEL(v, sum0);
            EXTRACT_LEVEL(v, sum1);
            rest |= (i64x4)v;
        }
        if (PRODUCT) {
            f64x4 y = x;
            if (!SQUARES) {
                f32x4 b4;
                memcpy(&b4, b + i, sizeof b4);
                y = __builtin_convertvector(b4, f64x4);
            }
            f64x4 v = x * y; /* exact */
            EXTRACT_LEVEL(v, product0);
            EXTRACT_LEVEL(v, product1);
            rest |= (i64x4)v;
        }
    }
    for (int lane = 0; lane < EXTRACT_LANES; lane++)
        if (rest[lane] & INT64_MAX) /* a nonzero rest (-0.0 is none) */
            return 0;
    if (SUM) {
        tsl_acc_add(sum, level_total(sum0, sum_start0));
        tsl_acc_add(sum, level_total(sum1, sum_start1));
    }
    if (PRODUCT) {
        tsl_acc_add(product, level_total(product0, product_start0));
        tsl_acc_add(product, level_total(product1, product_start1));
    }
    return 1;
}

__attribute__((target("avx2"))) static int extract_f32(tsl_acc *sum, tsl_acc *product,
                                                       const float *a, const float *b, int64_t n)
{
    if (!product)
        return extract_f32_impl(sum, NULL, a, a, n, 1, 0, 0);
    if (a == b)
        return sum ? extract_f32_impl(sum, product, a, a, n, 1, 1, 1)
                   : extract_f32_impl(NULL, product, a, a, n, 0, 1, 1);
    return sum ? extract_f32_impl(sum, product, a, b, n, 1, 1, 0)
               : extract_f32_impl(NULL, product, a, b, n, 0, 1, 0);
}
#endif

/* The shared body of the float32 entry points: extraction chunk by chunk where the CPU has
 * AVX2, bins for the chunks it cannot take and everywhere else. */
static void add_f32(tsl_acc *sum, tsl_acc *product, const float *a, const float *b, int64_t count)
{
#ifdef EXTRACT_SIMD
    if (count >= EXTRACT_MIN_COUNT && __builtin_cpu_supports("avx2")) {
        int64_t vector_count = count - count % EXTRACT_ALIGN;
        for (int64_t start = 0; start < vector_count; start += EXTRACT_CHUNK) {
            int64_t len =
                vector_count - start < EXTRACT_CHUNK ? vector_count - start : EXTRACT_CHUNK;
            if (!extract_f32(sum, product, a + start, b + start, len))
                add_f32_binned(sum, product, a + start, b + start, len);
        }
        add_f32_binned(sum, product, a + vector_count, b + vector_count, count - vector_count);
        return;
    }
#endif
    add_f32_binned(sum, product, a, b, count);
}

void tsl_acc_add_squares_f32(tsl_acc *acc, const float *x, int64_t count)
{
    add_f32(NULL, acc, x, x, count);
}

void tsl_acc_add_moments_f32(tsl_acc *sum, tsl_acc *squares, const float *x, int64_t count)
{
    add_f32(sum, squares, x, x, count);
}

void tsl_acc_add_products_f32(tsl_acc *acc, const float *a, const float *b, int64_t count)
{
    add_f32(NULL, acc, a, b, count);
}

void tsl_acc_add_sum_products_f32(tsl_acc *sum, tsl_acc *products, const float *a, const float *b,
                                  int64_t count)
{
    add_f32(sum, products, a, b, count);
}

/* ---- float32 columns of a row-major block, exactly (channels-last tiles) ----
 * The extraction above with one lane per column instead of four per chunk: blocks of at most
 * 2^H rows, each column's levels started from that column's largest magnitude in the block,
 * plain C loops over the columns (the compiler vectorises them; TSL_VECTOR_KERNEL builds them
 * for the machine's widest vectors, and -ffp-contract=off keeps every step a separate IEEE
 * operation, as the extraction needs). A column whose block holds an infinity or a NaN, or
 * leaves a rest, goes through add_f32_binned for that block. Every path adds the column's
 * exact sum, so the result is the bits of tsl_acc_add_sum_products_f32 on the column. */
#define COLUMN_ROWS ((int64_t)1 << EXTRACT_HEADROOM_COLUMNS)
#define EXTRACT_HEADROOM_COLUMNS 9
#define COLUMN_GROUP 8 /* columns a vector holds */
typedef float f32xg __attribute__((vector_size(4 * COLUMN_GROUP)));
typedef double f64xg __attribute__((vector_size(8 * COLUMN_GROUP)));
typedef int64_t i64xg __attribute__((vector_size(8 * COLUMN_GROUP)));

static inline double column_level_start(int top)
{
    return ldexp(1.5, top + EXTRACT_HEADROOM_COLUMNS + 2);
}

/* Per-column state of one block (cols entries each). */
typedef struct column_block {
    double *s0, *s1, *p0, *p1; /* the four level accumulators */
    double *s0_start, *s1_start, *p0_start, *p1_start;
    uint32_t *max_a, *max_b; /* largest |value| bits in the block */
    uint64_t *rest;          /* OR of the rests' bits */
    float *column;           /* one column of the block, for the bins */
} column_block;

/* Largest |a| (bits) per column over `rows` rows of `cols`. */
static inline void column_max_bits(const float *a, int64_t rows, int64_t cols, uint32_t *max)
{
    for (int64_t c = 0; c < cols; c++)
        max[c] = 0;
    for (int64_t r = 0; r < rows; r++) {
        const float *row = a + r * cols;
        for (int64_t c = 0; c < cols; c++) {
            uint32_t bits;
            memcpy(&bits, &row[c], sizeof bits);
            bits &= 0x7fffffffu;
            max[c] = bits > max[c] ? bits : max[c];
        }
    }
}

/* s gains v rounded to its level's unit; v keeps the rest (both exact). */
#define COLUMN_LEVEL(v, s)                                                                         \
    do {                                                                                           \
        __typeof__(s) sum_ = (s) + (v);                                                            \
        (v) -= sum_ - (s);                                                                         \
        (s) = sum_;                                                                                \
    } while (0)

TSL_VECTOR_KERNEL
static void add_columns_block(tsl_acc *sum, int64_t sum_stride, tsl_acc *product,
                              int64_t product_stride, const float *a, const float *b, int64_t rows,
                              int64_t cols, const column_block *k)
{
    const int SQUARES = a == b;
    column_max_bits(a, rows, cols, k->max_a);
    if (product && !SQUARES)
        column_max_bits(b, rows, cols, k->max_b);
    for (int64_t c = 0; c < cols; c++) {
        float la, lb;
        uint32_t mb = product && !SQUARES ? k->max_b[c] : k->max_a[c];
        memcpy(&la, &k->max_a[c], sizeof la);
        memcpy(&lb, &mb, sizeof lb);
        int sum_top = 0, product_top = 0;
        if (k->max_a[c] < 0x7f800000u && mb < 0x7f800000u) {
            frexp((double)la, &sum_top);
            frexp((double)la * lb, &product_top);
        }
        k->s0[c] = k->s0_start[c] = column_level_start(sum_top);
        k->s1[c] = k->s1_start[c] = column_level_start(sum_top + EXTRACT_HEADROOM_COLUMNS - 51);
        k->p0[c] = k->p0_start[c] = column_level_start(product_top);
        k->p1[c] = k->p1_start[c] = column_level_start(product_top + EXTRACT_HEADROOM_COLUMNS - 51);
        k->rest[c] = 0;
    }
    /* Groups of COLUMN_GROUP columns keep their accumulators in vector registers through the
     * block's rows; the columns left over go one at a time. */
    int64_t c0 = 0;
    for (; c0 + COLUMN_GROUP <= cols; c0 += COLUMN_GROUP) {
        f64xg s0, s1, p0, p1;
        memcpy(&s0, k->s0 + c0, sizeof s0);
        memcpy(&s1, k->s1 + c0, sizeof s1);
        memcpy(&p0, k->p0 + c0, sizeof p0);
        memcpy(&p1, k->p1 + c0, sizeof p1);
        i64xg rest = {0};
        for (int64_t r = 0; r < rows; r++) {
            f32xg va;
            memcpy(&va, a + r * cols + c0, sizeof va);
            f64xg x = __builtin_convertvector(va, f64xg);
            if (sum) {
                f64xg v = x;
                COLUMN_LEVEL(v, s0);
                COLUMN_LEVEL(v, s1);
                rest |= (i64xg)v;
            }
            if (product) {
                f64xg y = x;
                if (!SQUARES) {
                    f32xg vb;
                    memcpy(&vb, b + r * cols + c0, sizeof vb);
                    y = __builtin_convertvector(vb, f64xg);
                }
                f64xg v = x * y; /* exact */
                COLUMN_LEVEL(v, p0);
                COLUMN_LEVEL(v, p1);
                rest |= (i64xg)v;
            }
        }
        memcpy(k->s0 + c0, &s0, sizeof s0);
        memcpy(k->s1 + c0, &s1, sizeof s1);
        memcpy(k->p0 + c0, &p0, sizeof p0);
        memcpy(k->p1 + c0, &p1, sizeof p1);
        memcpy(k->rest + c0, &rest, sizeof rest);
    }
    for (int64_t c = c0; c < cols; c++)
        for (int64_t r = 0; r < rows; r++) {
            double x = a[r * cols + c];
            if (sum) {
                double v = x;
                COLUMN_LEVEL(v, k->s0[c]);
                COLUMN_LEVEL(v, k->s1[c]);
                uint64_t bits;
                memcpy(&bits, &v, sizeof bits);
                k->rest[c] |= bits;
            }
            if (product) {
                double v = x * (double)b[r * cols + c]; /* exact */
                COLUMN_LEVEL(v, k->p0[c]);
                COLUMN_LEVEL(v, k->p1[c]);
                uint64_t bits;
                memcpy(&bits, &v, sizeof bits);
                k->rest[c] |= bits;
            }
        }
    for (int64_t c = 0; c < cols; c++) {
        uint32_t mb = product && !SQUARES ? k->max_b[c] : k->max_a[c];
        tsl_acc *sc = sum ? sum + c * sum_stride : NULL;
        tsl_acc *pc = product ? product + c * product_stride : NULL;
        if (k->max_a[c] >= 0x7f800000u || mb >= 0x7f800000u || (k->rest[c] & INT64_MAX)) {
            /* the bins take this column of the block (b's column after a's when not squares) */
            float *col = k->column, *colb = k->column + COLUMN_ROWS;
            for (int64_t r = 0; r < rows; r++) {
                col[r] = a[r * cols + c];
                colb[r] = b[r * cols + c];
            }
            add_f32_binned(sc, pc, col, SQUARES ? col : colb, rows);
            continue;
        }
        if (sc) {
            tsl_acc_add(sc, k->s0[c] - k->s0_start[c]);
            tsl_acc_add(sc, k->s1[c] - k->s1_start[c]);
        }
        if (pc) {
            tsl_acc_add(pc, k->p0[c] - k->p0_start[c]);
            tsl_acc_add(pc, k->p1[c] - k->p1_start[c]);
        }
    }
}

void tsl_acc_add_columns_f32(tsl_acc *sum, int64_t sum_stride, tsl_acc *product,
                             int64_t product_stride, const float *a, const float *b, int64_t rows,
                             int64_t cols)
{
    if (rows <= 0 || cols <= 0 || (!sum && !product))
        return;
    if (!b)
        b = a;
    size_t n = (size_t)cols;
    double *d = malloc(sizeof(double) * 8 * n);
    uint32_t *u = malloc(sizeof(uint32_t) * 2 * n);
    uint64_t *rest = malloc(sizeof(uint64_t) * n);
    float *column = malloc(sizeof(float) * 2 * COLUMN_ROWS);
    TSL_CODELET_CHECK(d && u && rest && column, "exact column sums: out of memory");
    column_block k = {d,         d + n,     d + 2 * n, d + 3 * n, d + 4 * n, d + 5 * n,
                      d + 6 * n, d + 7 * n, u,         u + n,     rest,      column};
    for (int64_t r0 = 0; r0 < rows; r0 += COLUMN_ROWS) {
        int64_t len = rows - r0 < COLUMN_ROWS ? rows - r0 : COLUMN_ROWS;
        add_columns_block(sum, sum_stride, product, product_stride, a + r0 * cols, b + r0 * cols,
                          len, cols, &k);
    }
    free(d);
    free(u);
    free(rest);
    free(column);
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

void tsl_acc_add_array(tsl_acc *acc, tsl_dtype dtype, const void *data, int64_t count)
{
    switch (dtype) {
    case TSL_F32:
        add_f32(acc, NULL, data, data, count);
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
    TSL_CODELET_CHECK(tsl_acc_buffer_ok(buffers[1]), "sum: accumulator size");
    tsl_acc_init(acc);
    tsl_acc_add_array(acc, (tsl_dtype)a.dtype, tile, a.count);
    tsl_acc_normalize(acc);
}

/* The exact sum of (a[i] - b[i])^2 over two f32 tiles of one layout: each difference rounded
 * to float, its square exact in double (a residual norm, the same bits for every tiling). */
static void sum_sqdiff_cpu(void *buffers[], void *cl_arg)
{
    tsl_sum_args a;
    starpu_codelet_unpack_args(cl_arg, &a);
    const float *x = (const float *)STARPU_VECTOR_GET_PTR(buffers[0]);
    const float *y = (const float *)STARPU_VECTOR_GET_PTR(buffers[1]);
    tsl_acc *acc = (tsl_acc *)STARPU_VECTOR_GET_PTR(buffers[2]);
    TSL_CODELET_CHECK(tsl_sqdiff_buffers_ok(buffers, &a),
                      "squared difference: f32 tiles of the count and an accumulator");
    tsl_acc_init(acc);
    float d[1024];
    for (int64_t at = 0; at < a.count; at += 1024) {
        int64_t n = a.count - at < 1024 ? a.count - at : 1024;
        for (int64_t i = 0; i < n; i++)
            d[i] = x[at + i] - y[at + i];
        tsl_acc_add_squares_f32(acc, d, n);
    }
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

/* The footprint: the tile size and its dtype (each takes its own path). */
static uint32_t sum_partial_variant(struct starpu_task *task)
{
    tsl_sum_args a;
    starpu_codelet_unpack_args(task->cl_arg, &a);
    return tsl_hash_i64(starpu_task_data_footprint(task), a.dtype);
}

TSL_CODELET(tsl_cl_sum_partial, "tsl_sum_partial", sum_partial_cpu, tsl_sum_partial_cuda,
            sum_partial_variant, .nbuffers = 2, .modes = {STARPU_R, STARPU_W});
TSL_CODELET(tsl_cl_sum_sqdiff, "tsl_sum_sqdiff", sum_sqdiff_cpu, tsl_sum_sqdiff_cuda, NULL,
            .nbuffers = 3, .modes = {STARPU_R, STARPU_R, STARPU_W});
TSL_CODELET(tsl_cl_sum_merge, "tsl_sum_merge", sum_merge_cpu, tsl_sum_merge_cuda, NULL,
            .nbuffers = 2, .modes = {STARPU_R, STARPU_RW});
