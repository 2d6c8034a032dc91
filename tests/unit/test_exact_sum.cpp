// The exact accumulator behind tsl_tensor_sum (codelets/reduce.c), against a __float128
// reference, in every order and merge tree.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

extern "C" {
#include "codelets/fill.h"
#include "codelets/reduce.h"
}

namespace
{

double acc_sum(const std::vector<double> &values)
{
    tsl_acc acc;
    tsl_acc_init(&acc);
    for (double v : values)
        tsl_acc_add(&acc, v);
    return tsl_acc_round(&acc);
}

// Exact while the values span at most 113 bits, which the generators below respect.
double quad_sum(const std::vector<double> &values)
{
    __float128 s = 0;
    for (double v : values)
        s += v;
    return (double)s;
}

std::vector<double> random_values(std::mt19937_64 &rng, size_t n, int min_exp, int max_exp)
{
    std::uniform_real_distribution<double> mant(-1.0, 1.0);
    std::uniform_int_distribution<int> ex(min_exp, max_exp);
    std::vector<double> v(n);
    for (auto &x : v)
        x = std::ldexp(mant(rng), ex(rng));
    return v;
}

bool same_bits(double a, double b)
{
    return std::memcmp(&a, &b, sizeof a) == 0;
}

} // namespace

TEST(ExactSum, MatchesQuadReference)
{
    std::mt19937_64 rng(20261123);
    for (int trial = 0; trial < 50; trial++) {
        auto v = random_values(rng, 1 + rng() % 5000, -25, 25);
        double got = acc_sum(v), want = quad_sum(v);
        ASSERT_TRUE(same_bits(got, want)) << "trial " << trial << ": " << got << " vs " << want;
    }
}

TEST(ExactSum, IndependentOfOrderAndMergeTree)
{
    std::mt19937_64 rng(7);
    auto v = random_values(rng, 20000, -40, 40);
    double reference = acc_sum(v);
    for (int trial = 0; trial < 20; trial++) {
        std::shuffle(v.begin(), v.end(), rng);
        // Cut into random chunks, accumulate each, merge in a random order.
        std::vector<tsl_acc> parts;
        size_t pos = 0;
        while (pos < v.size()) {
            size_t len = 1 + rng() % 3000;
            tsl_acc a;
            tsl_acc_init(&a);
            for (size_t i = pos; i < std::min(v.size(), pos + len); i++)
                tsl_acc_add(&a, v[i]);
            parts.push_back(a);
            pos += len;
        }
        while (parts.size() > 1) {
            size_t i = rng() % parts.size(), j = rng() % parts.size();
            if (i == j)
                continue;
            tsl_acc_merge(&parts[i], &parts[j]);
            parts.erase(parts.begin() + (long)j);
        }
        ASSERT_TRUE(same_bits(tsl_acc_round(&parts[0]), reference)) << "trial " << trial;
    }
}

TEST(ExactSum, CancellationAndExtremes)
{
    EXPECT_EQ(acc_sum({1e308, 1.0, -1e308}), 1.0);
    EXPECT_EQ(acc_sum({DBL_MAX, -DBL_MAX, 0x1p-1074}), 0x1p-1074);
    EXPECT_EQ(acc_sum({0x1p-1074, 0x1p-1074}), 0x1p-1073);
    EXPECT_EQ(acc_sum({-0x1p-1074, 0x1p-1070}), 0x1p-1070 - 0x1p-1074);
    EXPECT_EQ(acc_sum({DBL_MAX, DBL_MAX}), INFINITY);
    EXPECT_EQ(acc_sum({-DBL_MAX, -DBL_MAX}), -INFINITY);
    EXPECT_EQ(acc_sum({}), 0.0);
    EXPECT_EQ(acc_sum({3.5, -3.5}), 0.0);
    EXPECT_EQ(acc_sum({-1.25, -2.5}), -3.75);
}

TEST(ExactSum, RoundsToNearestEven)
{
    const double ulp = 0x1p-52;
    EXPECT_EQ(acc_sum({1.0, ulp / 2}), 1.0);                      // tie, even stays
    EXPECT_EQ(acc_sum({1.0 + ulp, ulp / 2}), 1.0 + 2 * ulp);      // tie, odd rounds up
    EXPECT_EQ(acc_sum({1.0, ulp / 2, 0x1p-80}), 1.0 + ulp);       // above the tie
    EXPECT_EQ(acc_sum({1.0, ulp / 2, -0x1p-80}), 1.0);            // below the tie
    EXPECT_EQ(acc_sum({-1.0, -ulp / 2, -0x1p-80}), -(1.0 + ulp)); // sign symmetric
    EXPECT_EQ(acc_sum({0x1p53, 1.0}), 0x1p53);                    // tie at 2^53
    EXPECT_EQ(acc_sum({0x1p53, 1.0, 0x1p-1000}), 0x1p53 + 2.0);   // sticky far below
}

TEST(ExactSum, NonFinite)
{
    EXPECT_TRUE(std::isnan(acc_sum({1.0, NAN})));
    EXPECT_TRUE(std::isnan(acc_sum({INFINITY, -INFINITY})));
    EXPECT_EQ(acc_sum({INFINITY, 1.0, -5.0}), INFINITY);
    EXPECT_EQ(acc_sum({-INFINITY, DBL_MAX}), -INFINITY);
}

TEST(Fill, CounterBasedValues)
{
    tsl_fill_args a{};
    a.mode = TSL_FILL_UNIFORM;
    a.seed = 99;
    a.a = -2.0;
    a.b = 3.0;
    double sum = 0;
    const int n = 200000;
    for (int i = 0; i < n; i++) {
        double v = tsl_fill_value(&a, (uint64_t)i);
        ASSERT_GE(v, -2.0);
        ASSERT_LT(v, 3.0);
        ASSERT_EQ(v, tsl_fill_value(&a, (uint64_t)i)); // a function of (seed, index)
        sum += v;
    }
    EXPECT_NEAR(sum / n, 0.5, 0.02);
    tsl_fill_args other = a;
    other.seed = 100;
    int same = 0;
    for (int i = 0; i < 1000; i++)
        same += tsl_fill_value(&a, (uint64_t)i) == tsl_fill_value(&other, (uint64_t)i);
    EXPECT_LT(same, 5);

    tsl_fill_args g{};
    g.mode = TSL_FILL_NORMAL;
    g.seed = 5;
    g.a = 1.0;
    g.b = 2.0;
    double m = 0, m2 = 0;
    for (int i = 0; i < n; i++) {
        double v = tsl_fill_value(&g, (uint64_t)i);
        ASSERT_TRUE(std::isfinite(v));
        m += v;
        m2 += v * v;
    }
    m /= n;
    double sd = std::sqrt(m2 / n - m * m);
    EXPECT_NEAR(m, 1.0, 0.03);
    EXPECT_NEAR(sd, 2.0, 0.03);
}

namespace
{

// Bits drawn over the whole range of the type: subnormals, huge values, signed zeros, and
// a few infinities and NaNs when `nonfinite`.
template <typename T, typename U>
std::vector<T> wild_values(std::mt19937_64 &rng, size_t n, bool nonfinite)
{
    std::vector<T> v(n);
    for (auto &x : v) {
        U bits = (U)rng();
        std::memcpy(&x, &bits, sizeof x);
        if (!std::isfinite(x) && !nonfinite)
            x = (T)0.5;
    }
    return v;
}

template <typename T> double per_element(const std::vector<T> &v)
{
    tsl_acc acc;
    tsl_acc_init(&acc);
    for (T x : v)
        tsl_acc_add(&acc, (double)x);
    return tsl_acc_round(&acc);
}

template <typename T> double binned(const std::vector<T> &v, tsl_dtype dt)
{
    tsl_acc acc;
    tsl_acc_init(&acc);
    tsl_acc_add_array(&acc, dt, v.data(), (int64_t)v.size());
    return tsl_acc_round(&acc);
}

bool same_or_both_nan(double a, double b)
{
    return (std::isnan(a) && std::isnan(b)) || std::memcmp(&a, &b, sizeof a) == 0;
}

} // namespace

TEST(ExactSum, ArrayPathsEqualPerElementPath)
{
    std::mt19937_64 rng(314159);
    for (size_t n : {1, 7, 2047, 2048, 5000, 100000}) {
        for (bool nonfinite : {false, true}) {
            auto f = wild_values<float, uint32_t>(rng, n, nonfinite);
            EXPECT_TRUE(same_or_both_nan(binned(f, TSL_F32), per_element(f))) << "f32 n=" << n;
            auto d = wild_values<double, uint64_t>(rng, n, nonfinite);
            EXPECT_TRUE(same_or_both_nan(binned(d, TSL_F64), per_element(d))) << "f64 n=" << n;
        }
        // Moderate ranges too, where the sum is not dominated by one huge element.
        auto g = random_values(rng, n, -60, 60);
        std::vector<float> gf(g.begin(), g.end());
        EXPECT_TRUE(same_or_both_nan(binned(g, TSL_F64), quad_sum(g))) << n;
        EXPECT_TRUE(same_or_both_nan(binned(gf, TSL_F32), per_element(gf))) << n;
        std::vector<int32_t> ints(n);
        std::vector<uint8_t> bytes(n);
        for (size_t i = 0; i < n; i++) {
            ints[i] = (int32_t)rng();
            bytes[i] = (uint8_t)rng();
        }
        EXPECT_EQ(binned(ints, TSL_I32), per_element(ints)) << n;
        EXPECT_EQ(binned(bytes, TSL_U8), per_element(bytes)) << n;
    }
    // Subnormal floats only, and cancellation to exactly zero.
    std::vector<float> tiny(4096, 1e-45f);
    EXPECT_EQ(binned(tiny, TSL_F32), 4096 * (double)1e-45f);
    std::vector<double> cancel(4096);
    for (size_t i = 0; i < cancel.size(); i++)
        cancel[i] = (i % 2 ? -1.0 : 1.0) * std::ldexp(1.0, (int)(i / 2 % 2000) - 1000);
    EXPECT_EQ(binned(cancel, TSL_F64), 0.0);
}

TEST(ExactSum, SquaresOfFloatsEqualPerElementSquares)
{
    std::mt19937_64 rng(2718);
    for (size_t n : {1, 100, 5000, 70000}) {
        for (bool nonfinite : {false, true}) {
            auto f = wild_values<float, uint32_t>(rng, n, nonfinite);
            tsl_acc binned_acc, element_acc;
            tsl_acc_init(&binned_acc);
            tsl_acc_init(&element_acc);
            tsl_acc_add_squares_f32(&binned_acc, f.data(), (int64_t)f.size());
            for (float v : f)
                tsl_acc_add(&element_acc, (double)v * (double)v); // exact in double
            EXPECT_TRUE(same_or_both_nan(tsl_acc_round(&binned_acc), tsl_acc_round(&element_acc)))
                << n << " " << nonfinite;
        }
    }
    std::vector<float> tiny(3000, 1e-45f); // subnormal squares underflow nothing here
    tsl_acc acc;
    tsl_acc_init(&acc);
    tsl_acc_add_squares_f32(&acc, tiny.data(), (int64_t)tiny.size());
    EXPECT_EQ(tsl_acc_round(&acc), 3000 * ((double)1e-45f * (double)1e-45f));
}

namespace
{

// The float32 entry points against the per-element path: one exact deposit per term
// (a product of two floats is exact in double).
struct F32Sums {
    double sum, products;
};

F32Sums per_element_f32(const std::vector<float> &a, const std::vector<float> &b, bool squares)
{
    tsl_acc s, p;
    tsl_acc_init(&s);
    tsl_acc_init(&p);
    for (size_t i = 0; i < a.size(); i++) {
        tsl_acc_add(&s, (double)a[i]);
        double other = squares ? (double)a[i] : (double)b[i];
        tsl_acc_add(&p, (double)a[i] * other);
    }
    return {tsl_acc_round(&s), tsl_acc_round(&p)};
}

// Every f32 entry point on (a, b), checked against the per-element path, bit for bit.
void expect_f32_paths_exact(const std::vector<float> &a, const std::vector<float> &b,
                            const std::string &what)
{
    const int64_t n = (int64_t)a.size();
    F32Sums want_sq = per_element_f32(a, b, true), want_ab = per_element_f32(a, b, false);
    tsl_acc s, p, q;
    tsl_acc_init(&s);
    tsl_acc_init(&p);
    tsl_acc_add_moments_f32(&s, &p, a.data(), n);
    EXPECT_TRUE(same_or_both_nan(tsl_acc_round(&s), want_sq.sum)) << what << ": moments, sum";
    EXPECT_TRUE(same_or_both_nan(tsl_acc_round(&p), want_sq.products)) << what << ": moments, x^2";
    tsl_acc_init(&q);
    tsl_acc_add_squares_f32(&q, a.data(), n);
    EXPECT_TRUE(same_or_both_nan(tsl_acc_round(&q), want_sq.products)) << what << ": squares";
    // Whole accumulators, normalised, not only their rounding (a NaN rounds the same whatever
    // the limbs hold): the squares of infinities and NaNs are counted, never deposited.
    {
        tsl_acc ws, wq;
        tsl_acc_init(&ws);
        tsl_acc_init(&wq);
        for (size_t i = 0; i < a.size(); i++) {
            tsl_acc_add(&ws, (double)a[i]);
            tsl_acc_add(&wq, (double)a[i] * (double)a[i]);
        }
        for (tsl_acc *x : {&s, &p, &q, &ws, &wq})
            tsl_acc_normalize(x);
        EXPECT_EQ(std::memcmp(&s, &ws, sizeof s), 0) << what << ": moments, sum, accumulator";
        EXPECT_EQ(std::memcmp(&p, &wq, sizeof p), 0) << what << ": moments, x^2, accumulator";
        EXPECT_EQ(std::memcmp(&q, &wq, sizeof q), 0) << what << ": squares, accumulator";
    }
    tsl_acc_init(&q);
    tsl_acc_add_array(&q, TSL_F32, a.data(), n);
    EXPECT_TRUE(same_or_both_nan(tsl_acc_round(&q), want_sq.sum)) << what << ": sum";
    tsl_acc_init(&q);
    tsl_acc_add_products_f32(&q, a.data(), b.data(), n);
    EXPECT_TRUE(same_or_both_nan(tsl_acc_round(&q), want_ab.products)) << what << ": products";
    tsl_acc_init(&s);
    tsl_acc_init(&p);
    tsl_acc_add_sum_products_f32(&s, &p, a.data(), b.data(), n);
    EXPECT_TRUE(same_or_both_nan(tsl_acc_round(&s), want_ab.sum)) << what << ": sum of a";
    EXPECT_TRUE(same_or_both_nan(tsl_acc_round(&p), want_ab.products))
        << what << ": sum and products";
    // The same arrays as column 1 of an 11-column row-major block (the columns of a
    // channels-last tile: one group of 8 columns that share vectors, 3 left over), through
    // tsl_acc_add_columns_f32: every column gets the bits of its own per-element sums. Column
    // 0 holds b and a, column j >= 2 a and b rotated by j.
    const int64_t cols = 11;
    std::vector<std::vector<float>> ca(cols), cb(cols);
    for (int64_t j = 0; j < cols; j++) {
        ca[j].resize(a.size());
        cb[j].resize(a.size());
        for (size_t i = 0; i < a.size(); i++) {
            size_t k = j >= 2 ? (i + (size_t)j) % a.size() : i;
            ca[j][i] = j == 0 ? b[k] : a[k];
            cb[j][i] = j == 0 ? a[k] : b[k];
        }
    }
    std::vector<float> blk_a((size_t)cols * a.size()), blk_b((size_t)cols * a.size());
    for (size_t i = 0; i < a.size(); i++)
        for (int64_t j = 0; j < cols; j++) {
            blk_a[i * cols + j] = ca[j][i];
            blk_b[i * cols + j] = cb[j][i];
        }
    std::vector<tsl_acc> cs(2 * cols), cp(cols), qs(cols), qq(cols);
    for (auto *v : {&cs, &cp, &qs, &qq})
        for (tsl_acc &x : *v)
            tsl_acc_init(&x);
    tsl_acc_add_columns_f32(cs.data(), 2, cp.data(), 1, blk_a.data(), blk_b.data(), n, cols);
    tsl_acc_add_columns_f32(cs.data() + 1, 2, nullptr, 0, blk_a.data(), nullptr, n, cols);
    tsl_acc_add_columns_f32(qs.data(), 1, qq.data(), 1, blk_a.data(), nullptr, n, cols);
    // Whole accumulators, normalised, not only their rounding: a lost low bit shows.
    auto same_acc = [](tsl_acc x, tsl_acc y) {
        tsl_acc_normalize(&x);
        tsl_acc_normalize(&y);
        return std::memcmp(&x, &y, sizeof x) == 0;
    };
    for (int64_t j = 0; j < cols; j++) {
        tsl_acc ws, wp;
        tsl_acc_init(&ws);
        tsl_acc_init(&wp);
        for (size_t i = 0; i < a.size(); i++) {
            tsl_acc_add(&ws, (double)ca[j][i]);
            tsl_acc_add(&wp, (double)ca[j][i] * (double)cb[j][i]);
        }
        EXPECT_TRUE(same_acc(cs[2 * j], ws)) << what << ": column " << j << " sum, accumulator";
        EXPECT_TRUE(same_acc(cp[j], wp)) << what << ": column " << j << " products, accumulator";
    }
    for (int64_t j = 0; j < cols; j++) {
        const std::string col = what + ": column " + std::to_string(j);
        F32Sums want = j == 1 ? want_ab : per_element_f32(ca[j], cb[j], false);
        F32Sums want_q = j == 1 ? want_sq : per_element_f32(ca[j], ca[j], true);
        EXPECT_TRUE(same_or_both_nan(tsl_acc_round(&cs[2 * j]), want.sum)) << col << " sum";
        EXPECT_TRUE(same_or_both_nan(tsl_acc_round(&cs[2 * j + 1]), want.sum))
            << col << " sum alone";
        EXPECT_TRUE(same_or_both_nan(tsl_acc_round(&cp[j]), want.products)) << col << " products";
        EXPECT_TRUE(same_or_both_nan(tsl_acc_round(&qs[j]), want_q.sum)) << col << " moments, sum";
        EXPECT_TRUE(same_or_both_nan(tsl_acc_round(&qq[j]), want_q.products))
            << col << " moments, squares";
    }
}

std::vector<float> normal_floats(std::mt19937_64 &rng, size_t n, double mean, double sd)
{
    std::normal_distribution<double> d(mean, sd);
    std::vector<float> v(n);
    for (auto &x : v)
        x = (float)d(rng);
    return v;
}

// Lengths around the vector width (8), the extraction chunk (2048) and the bins' threshold.
const size_t kLengths[] = {1,    7,    8,    9,    63,   64,   65,           100,
                           2047, 2048, 2049, 4095, 4096, 4097, 3 * 2048 + 5, 70001};

} // namespace

TEST(ExactSum, FloatMomentsAndProductsEqualPerElementPath)
{
    std::mt19937_64 rng(1123);
    for (size_t n : kLengths) {
        const std::string len = "n=" + std::to_string(n);
        // Ordinary data: the fast paths take it whole.
        expect_f32_paths_exact(normal_floats(rng, n, 0.3, 1.0), normal_floats(rng, n, 0.0, 2.0),
                               len + " normal");
        // Every bit pattern: subnormals, huge values, signed zeros, infinities and NaNs.
        for (bool nonfinite : {false, true})
            expect_f32_paths_exact(wild_values<float, uint32_t>(rng, n, nonfinite),
                                   wild_values<float, uint32_t>(rng, n, nonfinite),
                                   len + (nonfinite ? " wild with inf/nan" : " wild finite"));
    }
}

TEST(ExactSum, FloatPathsAgainstQuadReference)
{
    // Exponents within 2^-10 .. 2^10: sums of floats and of products (lowest bit 2^-68,
    // totals below 2^40) span fewer than 113 bits, so a __float128 sum is exact and rounds
    // once, as the accumulator does.
    std::mt19937_64 rng(99);
    std::uniform_real_distribution<double> mant(-1.0, 1.0);
    std::uniform_int_distribution<int> ex(-10, 10);
    for (size_t n : kLengths) {
        std::vector<float> a(n), b(n);
        for (size_t i = 0; i < n; i++) {
            a[i] = (float)std::ldexp(mant(rng), ex(rng));
            b[i] = (float)std::ldexp(mant(rng), ex(rng));
        }
        __float128 sa = 0, sab = 0, saa = 0;
        for (size_t i = 0; i < n; i++) {
            sa += a[i];
            sab += (__float128)a[i] * b[i];
            saa += (__float128)a[i] * a[i];
        }
        tsl_acc s, p, q;
        tsl_acc_init(&s);
        tsl_acc_init(&p);
        tsl_acc_init(&q);
        tsl_acc_add_sum_products_f32(&s, &p, a.data(), b.data(), (int64_t)n);
        tsl_acc_add_squares_f32(&q, a.data(), (int64_t)n);
        EXPECT_TRUE(same_bits(tsl_acc_round(&s), (double)sa)) << n;
        EXPECT_TRUE(same_bits(tsl_acc_round(&p), (double)sab)) << n;
        EXPECT_TRUE(same_bits(tsl_acc_round(&q), (double)saa)) << n;
    }
}

TEST(ExactSum, FloatPathsAdversarial)
{
    std::mt19937_64 rng(4242);
    for (size_t n : {(size_t)64, (size_t)2048, (size_t)5000}) {
        const std::string len = " n=" + std::to_string(n);
        // Huge cancellation: pairs +v, -v of huge values around small ones; the sum is the
        // small ones only, and the products cancel to exactly the small ones' products.
        std::vector<float> a = normal_floats(rng, n, 0.0, 1.0), b(n);
        for (size_t i = 0; i + 1 < n; i += 2) {
            a[i] = std::ldexp(a[i], 100);
            a[i + 1] = -a[i];
        }
        for (size_t i = 0; i < n; i++)
            b[i] = i % 2 ? a[i - 1] : a[i]; // a[i] b[i] = +-v^2 in pairs
        if (n % 2)
            a[n - 1] = 3.0f;
        expect_f32_paths_exact(a, b, "cancellation" + len);
        {
            tsl_acc s, p;
            tsl_acc_init(&s);
            tsl_acc_init(&p);
            tsl_acc_add_sum_products_f32(&s, &p, a.data(), b.data(), (int64_t)n);
            EXPECT_EQ(tsl_acc_round(&s), n % 2 ? 3.0 : 0.0) << len;
            EXPECT_EQ(tsl_acc_round(&p), n % 2 ? 3.0 * b[n - 1] : 0.0) << len;
        }
        // Mixed exponents in one chunk: one value 2^-70 or a product 2^-50 times smaller than
        // the rest leaves bits below the extraction's levels, so its chunk needs the bins.
        for (int shift : {-30, -50, -70, -126, -149}) {
            auto m = normal_floats(rng, n, 1.0, 0.1), o = normal_floats(rng, n, 1.0, 0.1);
            m[n / 3] = std::ldexp(1.0f + 0x1p-23f, shift); // low bit set
            o[n / 2] = std::ldexp(-1.0f - 0x1p-20f, shift / 2);
            expect_f32_paths_exact(m, o, "small among large, 2^" + std::to_string(shift) + len);
        }
        // Only subnormals, only zeros (signed), and one infinity in an ordinary chunk.
        std::vector<float> tiny(n), zeros(n), with_inf = normal_floats(rng, n, 0, 1);
        for (size_t i = 0; i < n; i++) {
            tiny[i] = std::ldexp((float)(1 + rng() % 1000), -149) * (i % 3 ? 1.0f : -1.0f);
            zeros[i] = i % 2 ? -0.0f : 0.0f;
        }
        with_inf[n - 1] = -INFINITY;
        expect_f32_paths_exact(tiny, tiny, "subnormals" + len);
        expect_f32_paths_exact(zeros, tiny, "zeros" + len);
        expect_f32_paths_exact(with_inf, tiny, "one -inf" + len);
        tsl_acc s;
        tsl_acc_init(&s);
        tsl_acc_add_products_f32(&s, with_inf.data(), zeros.data(), (int64_t)n); // inf * 0
        EXPECT_TRUE(std::isnan(tsl_acc_round(&s))) << len;
        // All positive with random significands in one binade at the top of the range: the
        // accumulators' partial sums grow as fast as they can.
        std::uniform_real_distribution<float> top(1.5f, 2.0f);
        std::vector<float> p(4 * n), r(4 * n);
        for (size_t i = 0; i < p.size(); i++) {
            p[i] = top(rng);
            r[i] = top(rng);
        }
        expect_f32_paths_exact(p, r, "same sign, one binade" + len);
        // The largest floats: squares and products near 2^256 stay exact.
        std::vector<float> big(n, FLT_MAX), neg(n, -FLT_MAX);
        expect_f32_paths_exact(big, neg, "FLT_MAX" + len);
    }
}

TEST(ExactSum, FloatPathsIndependentOfChunking)
{
    // The same array added whole or in random pieces (different chunk boundaries, so
    // different extraction levels and bin/extraction choices) rounds to the same bits.
    std::mt19937_64 rng(555);
    auto a = normal_floats(rng, 30000, 5.0, 3.0), b = normal_floats(rng, 30000, -1.0, 0.5);
    a[12345] = 1e-30f; // one chunk falls back to the bins
    tsl_acc whole_s, whole_p;
    tsl_acc_init(&whole_s);
    tsl_acc_init(&whole_p);
    tsl_acc_add_sum_products_f32(&whole_s, &whole_p, a.data(), b.data(), (int64_t)a.size());
    for (int trial = 0; trial < 10; trial++) {
        tsl_acc s, p;
        tsl_acc_init(&s);
        tsl_acc_init(&p);
        size_t pos = 0;
        while (pos < a.size()) {
            size_t len = std::min(a.size() - pos, (size_t)(1 + rng() % 5000));
            tsl_acc_add_sum_products_f32(&s, &p, a.data() + pos, b.data() + pos, (int64_t)len);
            pos += len;
        }
        EXPECT_TRUE(same_bits(tsl_acc_round(&s), tsl_acc_round(&whole_s))) << trial;
        EXPECT_TRUE(same_bits(tsl_acc_round(&p), tsl_acc_round(&whole_p))) << trial;
    }
}
