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
