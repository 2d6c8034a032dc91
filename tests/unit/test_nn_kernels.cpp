// Activation and optimizer kernels (codelets/activation.c, codelets/optimizer.c) against
// plain references written here, central finite differences in float64, and optimizer steps
// worked out by hand.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

extern "C" {
#include "codelets/activation.h"
#include "codelets/optimizer.h"
#include "graph/op_table.h"
}

namespace
{

double reference(tsl_activation kind, double slope, double x)
{
    switch (kind) {
    case TSL_ACT_RELU:
        return x > 0 ? x : 0;
    case TSL_ACT_LEAKY_RELU:
        return x > 0 ? x : slope * x;
    case TSL_ACT_SIGMOID:
        return 1 / (1 + std::exp(-x));
    case TSL_ACT_TANH:
        return std::tanh(x);
    case TSL_ACT_GELU:
        return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0)));
    case TSL_ACT_SILU:
        return x / (1 + std::exp(-x));
    }
    return NAN; // a kind without a reference here fails every check below
}

// Every activation kind, so a new one is tested the day it exists.
std::vector<tsl_activation> all_kinds()
{
    std::vector<tsl_activation> kinds;
    for (int k = 0; k < TSL_ACTIVATION_COUNT; k++)
        kinds.push_back((tsl_activation)k);
    return kinds;
}

// What the backward reads, as the op table says: the forward's output or its input.
bool backward_reads_input(tsl_activation kind)
{
    return !tsl_activation_info_of(kind)->backward_reads_output;
}

std::vector<double> inputs(std::mt19937_64 &rng, size_t n)
{
    std::uniform_real_distribution<double> u(-6, 6);
    std::vector<double> x(n);
    for (auto &v : x) {
        v = u(rng);
        if (std::fabs(v) < 1e-3) // keep finite differences away from the ReLU kink
            v = 0.5;
    }
    x[0] = 30; // saturated sigmoid / tanh
    x[1] = -30;
    return x;
}

} // namespace

TEST(Activation, ForwardMatchesReferenceF32AndF64)
{
    std::mt19937_64 rng(11);
    auto x = inputs(rng, 1001);
    for (tsl_activation kind : all_kinds()) {
        tsl_act_args a{};
        a.kind = kind;
        a.count = (int64_t)x.size();
        a.slope = 0.07;
        a.dtype = TSL_F64;
        std::vector<double> y(x.size(), NAN);
        tsl_act_forward(&a, x.data(), y.data());
        std::vector<float> xf(x.begin(), x.end()), yf(x.size(), NAN);
        a.dtype = TSL_F32;
        tsl_act_forward(&a, xf.data(), yf.data());
        for (size_t i = 0; i < x.size(); i++) {
            double want = reference(kind, 0.07, x[i]);
            ASSERT_NEAR(y[i], want, 1e-15 * (1 + std::fabs(want))) << kind << " " << x[i];
            double want_f = reference(kind, (float)0.07, xf[i]);
            ASSERT_NEAR(yf[i], want_f, 2e-7 * (1 + std::fabs(want_f))) << kind << " " << x[i];
        }
        // In place gives the same values.
        std::vector<double> inplace = x;
        a.dtype = TSL_F64;
        tsl_act_forward(&a, inplace.data(), inplace.data());
        EXPECT_EQ(inplace, y) << kind;
    }
}

TEST(Activation, BackwardMatchesFiniteDifferences)
{
    std::mt19937_64 rng(12);
    auto x = inputs(rng, 501);
    std::uniform_real_distribution<double> u(-2, 2);
    std::vector<double> dy(x.size());
    for (auto &v : dy)
        v = u(rng);
    const double h = 1e-6;
    for (tsl_activation kind : all_kinds()) {
        tsl_act_args a{};
        a.kind = kind;
        a.dtype = TSL_F64;
        a.count = (int64_t)x.size();
        a.slope = -0.3;
        std::vector<double> y(x.size()), dx(x.size(), NAN), plus(x.size()), minus(x.size());
        tsl_act_forward(&a, x.data(), y.data());
        bool uses_input = backward_reads_input(kind);
        tsl_act_backward(&a, uses_input ? x.data() : y.data(), dy.data(), dx.data());
        std::vector<double> xp = x, xm = x;
        for (size_t i = 0; i < x.size(); i++) {
            xp[i] += h;
            xm[i] -= h;
        }
        tsl_act_forward(&a, xp.data(), plus.data());
        tsl_act_forward(&a, xm.data(), minus.data());
        for (size_t i = 0; i < x.size(); i++) {
            double fd = dy[i] * (plus[i] - minus[i]) / (2 * h);
            ASSERT_NEAR(dx[i], fd, 1e-7 * (1 + std::fabs(fd))) << kind << " x=" << x[i];
        }
        // dx may overwrite dy.
        std::vector<double> g = dy;
        tsl_act_backward(&a, uses_input ? x.data() : y.data(), g.data(), g.data());
        EXPECT_EQ(g, dx) << kind;
    }
    // The kink: PyTorch's convention of 0 (ReLU) and slope (LeakyReLU) at x = 0.
    tsl_act_args a{};
    a.dtype = TSL_F64;
    a.count = 1;
    a.slope = 0.25;
    double zero = 0, one = 1, out = NAN;
    a.kind = TSL_ACT_RELU;
    tsl_act_backward(&a, &zero, &one, &out);
    EXPECT_EQ(out, 0.0);
    a.kind = TSL_ACT_LEAKY_RELU;
    tsl_act_backward(&a, &zero, &one, &out);
    EXPECT_EQ(out, 0.25);
}

namespace
{

tsl_update_args sgd_args(double lr, double momentum, double dampening, double wd, int nesterov)
{
    tsl_update_args a{};
    a.kind = TSL_OPT_SGD;
    a.dtype = TSL_F64;
    a.count = 1;
    a.sgd.lr = lr;
    a.sgd.momentum = momentum;
    a.sgd.dampening = dampening;
    a.sgd.weight_decay = wd;
    a.sgd.nesterov = nesterov;
    return a;
}

} // namespace

TEST(Optimizer, SgdStepsByHand)
{
    // Plain SGD with weight decay: p -= lr * (g + wd p).
    tsl_update_args a = sgd_args(0.1, 0, 0, 0.5, 0);
    double p = 2.0, g = 1.0;
    a.step = 1;
    tsl_update(&a, &p, &g, nullptr, nullptr);
    EXPECT_DOUBLE_EQ(p, 2.0 - 0.1 * (1.0 + 1.0)); // 1.8

    // Momentum 0.9: the first step's buffer is the gradient itself (no dampening).
    a = sgd_args(0.1, 0.9, 0.5, 0, 0);
    p = 1.0;
    double buf = 123.0; // whatever the state held: step 1 overwrites it
    g = 0.5;
    a.step = 1;
    tsl_update(&a, &p, &g, &buf, nullptr);
    EXPECT_DOUBLE_EQ(buf, 0.5);
    EXPECT_DOUBLE_EQ(p, 0.95);
    a.step = 2; // buf = 0.9 * 0.5 + (1 - 0.5) * 0.5 = 0.7; p = 0.95 - 0.07
    tsl_update(&a, &p, &g, &buf, nullptr);
    EXPECT_DOUBLE_EQ(buf, 0.7);
    EXPECT_DOUBLE_EQ(p, 0.88);

    // Nesterov: p -= lr * (g + momentum * buf).
    a = sgd_args(0.1, 0.9, 0, 0, 1);
    p = 1.0;
    buf = 0;
    g = 0.5;
    a.step = 1; // buf = 0.5; step = 0.5 + 0.45 = 0.95
    tsl_update(&a, &p, &g, &buf, nullptr);
    EXPECT_DOUBLE_EQ(p, 1.0 - 0.095);
    a.step = 2; // buf = 0.45 + 0.5 = 0.95; step = 0.5 + 0.855 = 1.355
    tsl_update(&a, &p, &g, &buf, nullptr);
    EXPECT_DOUBLE_EQ(buf, 0.95);
    EXPECT_NEAR(p, 0.905 - 0.1355, 1e-15);
}

TEST(Optimizer, AdamAndAdamWStepsByHand)
{
    tsl_update_args a{};
    a.kind = TSL_OPT_ADAM;
    a.dtype = TSL_F64;
    a.count = 1;
    a.adam.lr = 0.1;
    a.adam.beta1 = 0.9;
    a.adam.beta2 = 0.999;
    a.adam.eps = 1e-8;
    // Step 1: bias correction makes the update lr * g / (|g| + eps).
    double p = 1.0, g = 0.5, m = 0, v = 0;
    a.step = 1;
    tsl_update(&a, &p, &g, &m, &v);
    EXPECT_DOUBLE_EQ(m, 0.05);
    EXPECT_DOUBLE_EQ(v, 0.00025);
    EXPECT_NEAR(p, 1.0 - 0.1 * 0.5 / (0.5 + 1e-8), 1e-15);
    // Step 2 with g = -1: m = 0.045 - 0.1 = -0.055; v = 0.00024975 + 0.001 = 0.00124975.
    g = -1.0;
    a.step = 2;
    double before = p;
    tsl_update(&a, &p, &g, &m, &v);
    EXPECT_NEAR(m, -0.055, 1e-16);
    EXPECT_NEAR(v, 0.00124975, 1e-16);
    double mhat = -0.055 / (1 - 0.81), vhat = 0.00124975 / (1 - 0.998001);
    EXPECT_NEAR(p, before - 0.1 * mhat / (std::sqrt(vhat) + 1e-8), 1e-12);

    // Adam's L2 penalty joins the gradient; AdamW's decay scales the parameter first.
    a.step = 1;
    a.adam.weight_decay = 0.5;
    double pa = 2.0, ga = 0.0, ma = 0, va = 0;
    tsl_update(&a, &pa, &ga, &ma, &va); // g = 1.0: update 0.1 * 1 / (1 + 1e-8)
    EXPECT_NEAR(pa, 2.0 - 0.1 / (1 + 1e-8), 1e-15);
    a.adam.decoupled = 1;
    double pw = 2.0, gw = 0.0, mw = 0, vw = 0;
    tsl_update(&a, &pw, &gw, &mw, &vw); // p = 2 * (1 - 0.05) = 1.9; zero gradient: no step
    EXPECT_DOUBLE_EQ(pw, 1.9);
}

TEST(Optimizer, F32MatchesF64WithinRounding)
{
    std::mt19937_64 rng(5);
    std::normal_distribution<double> n01(0, 1);
    const int n = 257;
    std::vector<double> p(n), g(n), m(n, 0), v(n, 0);
    for (int i = 0; i < n; i++) {
        p[i] = n01(rng);
        g[i] = n01(rng);
    }
    // Both runs start from the same (float-representable) values.
    std::vector<float> pf(p.begin(), p.end()), gf(g.begin(), g.end()), mf(n, 0), vf(n, 0);
    for (int i = 0; i < n; i++) {
        p[i] = pf[i];
        g[i] = gf[i];
    }
    tsl_update_args a{};
    a.kind = TSL_OPT_ADAM;
    a.count = n;
    a.adam.lr = 1e-2;
    a.adam.beta1 = 0.9;
    a.adam.beta2 = 0.99;
    a.adam.eps = 1e-8;
    for (int step = 1; step <= 3; step++) {
        a.step = step;
        a.dtype = TSL_F64;
        tsl_update(&a, p.data(), g.data(), m.data(), v.data());
        a.dtype = TSL_F32;
        tsl_update(&a, pf.data(), gf.data(), mf.data(), vf.data());
    }
    for (int i = 0; i < n; i++)
        EXPECT_NEAR(pf[i], p[i], 1e-6 * (1 + std::fabs(p[i])));
}
