// The exact accumulator behind tsl_tensor_sum (codelets/reduce.c), against a __float128
// reference, in every order and merge tree.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

extern "C" {
#include "../../codelets/tile_ops.h"
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
