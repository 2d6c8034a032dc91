// tsl_hd_exp and tsl_hd_log (codelets/hd_exp.h), the exp and log that CPU and CUDA workers share
// so that a loss's bits do not depend on where its task ran: against the C library, within one
// unit in the last place on random arguments of every magnitude, and exact on the special ones.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>

extern "C" {
#include "codelets/hd_exp.h"
}

namespace
{

// Distance in units in the last place between two finite doubles of one sign (or zeros).
int64_t ulps(double a, double b)
{
    int64_t ia, ib;
    std::memcpy(&ia, &a, sizeof ia);
    std::memcpy(&ib, &b, sizeof ib);
    if (ia < 0)
        ia = INT64_MIN - ia;
    if (ib < 0)
        ib = INT64_MIN - ib;
    return ia > ib ? ia - ib : ib - ia;
}

bool same_bits(double a, double b)
{
    return std::memcmp(&a, &b, sizeof a) == 0;
}

// Arguments checked against the C library: within `bound` ulps each; how many equal it, the
// worst.
struct UlpCheck {
    const char *name;
    double (*fn)(double);
    double (*ref)(double);
    int64_t bound = 1;
    double exact_share = 0.9; // the share of results equal to the C library's, at least
    int64_t worst = 0, exact = 0, n = 0;

    void operator()(double x)
    {
        double got = fn(x), want = ref(x);
        ASSERT_FALSE(std::isnan(got)) << name << "(" << x << ")";
        int64_t u = ulps(got, want);
        worst = std::max(worst, u);
        exact += u == 0;
        n++;
        ASSERT_LE(u, bound) << name << "(" << x << ") = " << got << ", the C library " << want;
    }

    void report()
    {
        EXPECT_GE((double)exact, exact_share * (double)n)
            << name << ": results equal to the C library's";
        std::printf("%s: %lld arguments, %lld equal to the C library's, worst %lld ulp\n", name,
                    (long long)n, (long long)exact, (long long)worst);
    }
};

double hd_exp(double x)
{
    return tsl_hd_exp(x);
}

double hd_log(double x)
{
    return tsl_hd_log(x);
}

double hd_expm1(double x)
{
    return tsl_hd_expm1(x);
}

double hd_tanh(double x)
{
    return tsl_hd_tanh(x);
}

double c_expm1(double x)
{
    return std::expm1(x);
}

double c_tanh(double x)
{
    return std::tanh(x);
}

double c_exp(double x)
{
    return std::exp(x);
}

double c_log(double x)
{
    return std::log(x);
}

} // namespace

TEST(HdExp, ExpWithinOneUlpOfTheCLibrary)
{
    std::mt19937_64 rng(2026);
    std::uniform_real_distribution<double> wide(-745.2, 709.8), unit(-1.0, 1.0),
        softmax(-60.0, 0.0);
    UlpCheck check{"exp", hd_exp, c_exp};
    for (int i = 0; i < 200000; i++) {
        check(wide(rng));
        check(unit(rng));
        check(softmax(rng)); // the losses' arguments: x - max(x) <= 0
        check(std::ldexp(unit(rng), -30));
    }
    // Around the ends of the range, the subnormal results and the reduction's edges.
    for (double x : {709.78, 709.782712893384, 708.4, -708.39, -708.4, -720.0, -744.44, -745.0,
                     -745.13, 0.34657359027997264, -0.34657359027997264, 1.0, -1.0, 1e-300, -1e-300,
                     0.5, 2.0, 100.0, -100.0})
        check(x);
    check.report();
}

TEST(HdExp, ExpSpecialValues)
{
    const double inf = std::numeric_limits<double>::infinity();
    EXPECT_TRUE(std::isnan(tsl_hd_exp(std::nan(""))));
    EXPECT_TRUE(same_bits(tsl_hd_exp(inf), inf));
    EXPECT_TRUE(same_bits(tsl_hd_exp(-inf), 0.0));
    EXPECT_TRUE(same_bits(tsl_hd_exp(0.0), 1.0));
    EXPECT_TRUE(same_bits(tsl_hd_exp(-0.0), 1.0));
    EXPECT_TRUE(same_bits(tsl_hd_exp(710.0), inf));
    EXPECT_TRUE(same_bits(tsl_hd_exp(-746.0), 0.0));
    EXPECT_GT(tsl_hd_exp(-745.0), 0.0); // the smallest subnormal, not 0
    EXPECT_TRUE(same_bits(tsl_hd_exp(-745.0), std::exp(-745.0)));
}

TEST(HdExp, LogWithinOneUlpOfTheCLibrary)
{
    std::mt19937_64 rng(2027);
    std::uniform_int_distribution<uint64_t> positive(1, 0x7fefffffffffffffULL); // every finite
    std::uniform_real_distribution<double> near_one(0.5, 2.0), sums(1.0, 1000.0);
    UlpCheck check{"log", hd_log, c_log};
    for (int i = 0; i < 200000; i++) {
        uint64_t b = positive(rng);
        double x;
        std::memcpy(&x, &b, sizeof x); // subnormals and every exponent
        check(x);
        check(near_one(rng));
        check(sums(rng)); // the losses' arguments: sums of exp(x - max) >= 1
    }
    for (double x : {1.0, 2.0, 0.5, M_SQRT2, M_SQRT1_2, std::nextafter(1.0, 2.0),
                     std::nextafter(1.0, 0.0), DBL_MAX, DBL_MIN, DBL_TRUE_MIN, 1e-310, 10.0})
        check(x);
    check.report();
}

TEST(HdExp, LogSpecialValues)
{
    const double inf = std::numeric_limits<double>::infinity();
    EXPECT_TRUE(std::isnan(tsl_hd_log(std::nan(""))));
    EXPECT_TRUE(std::isnan(tsl_hd_log(-1.0)));
    EXPECT_TRUE(std::isnan(tsl_hd_log(-inf)));
    EXPECT_TRUE(same_bits(tsl_hd_log(0.0), -inf));
    EXPECT_TRUE(same_bits(tsl_hd_log(-0.0), -inf));
    EXPECT_TRUE(same_bits(tsl_hd_log(inf), inf));
    EXPECT_TRUE(same_bits(tsl_hd_log(1.0), 0.0));
}

// expm1 within 2 ulps, tanh within 4 (t / (t + 2) adds the quotient's and the sum's roundings to
// expm1's error; float tanh, computed in double and rounded once, is not affected).
TEST(HdExp, Expm1AndTanhWithinAFewUlpsOfTheCLibrary)
{
    std::mt19937_64 rng(2028);
    std::uniform_real_distribution<double> wide(-50.0, 700.0), unit(-2.0, 2.0), act(-8.0, 8.0);
    UlpCheck expm1{"expm1", hd_expm1, c_expm1, 2, 0.9}, tanh{"tanh", hd_tanh, c_tanh, 4, 0.65};
    for (int i = 0; i < 200000; i++) {
        expm1(wide(rng));
        expm1(unit(rng));
        expm1(std::ldexp(unit(rng), -40));
        tanh(act(rng)); // activations' arguments
        tanh(unit(rng));
        tanh(std::ldexp(unit(rng), -30));
    }
    for (double x : {0.34657359027997264, 0.35, 0.5, 0.7, 1.0, -0.35, -0.7, 1e-300, 22.0, 21.9})
        expm1(x), tanh(x);
    expm1.report();
    tanh.report();
    const double inf = std::numeric_limits<double>::infinity();
    EXPECT_TRUE(same_bits(tsl_hd_expm1(-0.0), -0.0));
    EXPECT_TRUE(same_bits(tsl_hd_expm1(inf), inf));
    EXPECT_TRUE(same_bits(tsl_hd_expm1(-inf), -1.0));
    EXPECT_TRUE(std::isnan(tsl_hd_expm1(std::nan(""))));
    EXPECT_TRUE(same_bits(tsl_hd_tanh(-0.0), -0.0));
    EXPECT_TRUE(same_bits(tsl_hd_tanh(inf), 1.0));
    EXPECT_TRUE(same_bits(tsl_hd_tanh(-inf), -1.0));
    EXPECT_TRUE(same_bits(tsl_hd_tanh(30.0), 1.0));
    EXPECT_TRUE(std::isnan(tsl_hd_tanh(std::nan(""))));
}
