// Batch-norm kernels (codelets/batchnorm.c) on one whole-tensor tile: forward against a
// long double reference, backward against central finite differences in float64.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

extern "C" {
#include "../../codelets/batchnorm.h"
}

namespace
{

const int64_t N = 3, C = 4, S = 5; // (N, C, S)

tsl_bn_args whole(double eps, double momentum)
{
    tsl_bn_args a{};
    a.dtype = TSL_F64;
    a.channels = C;
    a.samples = N;
    a.c0 = 0;
    a.cext = C;
    a.inner = S;
    a.per_channel = N * S;
    a.eps = eps;
    a.momentum = momentum;
    return a;
}

std::vector<double> forward(const std::vector<double> &x, const std::vector<double> &g,
                            const std::vector<double> &b, std::vector<double> *saved = nullptr)
{
    tsl_bn_args a = whole(1e-5, 0.1);
    std::vector<tsl_acc> acc(2 * C);
    std::vector<double> sv(2 * C), y(x.size(), NAN);
    tsl_bn_stats_tile(&a, x.data(), acc.data());
    tsl_bn_finalize(&a, acc.data(), sv.data());
    tsl_bn_normalize_tile(&a, x.data(), sv.data(), g.data(), b.data(), y.data());
    if (saved)
        *saved = sv;
    return y;
}

} // namespace

TEST(BatchNormKernel, ForwardAndRunningStatisticsAgainstReference)
{
    std::mt19937_64 rng(3);
    std::normal_distribution<double> d(2.0, 3.0);
    std::vector<double> x(N * C * S), g(C), b(C);
    for (auto &v : x)
        v = d(rng);
    for (int64_t c = 0; c < C; c++) {
        g[c] = 0.5 + c;
        b[c] = -1.0 + c;
    }
    std::vector<double> saved;
    auto y = forward(x, g, b, &saved);
    tsl_bn_args a = whole(1e-5, 0.1);
    std::vector<tsl_acc> acc(2 * C);
    tsl_bn_stats_tile(&a, x.data(), acc.data());
    std::vector<double> rm(C, 0.25), rv(C, 2.0);
    a.which = 0;
    tsl_bn_running(&a, acc.data(), rm.data());
    a.which = 1;
    tsl_bn_running(&a, acc.data(), rv.data());
    for (int64_t c = 0; c < C; c++) {
        long double mean = 0, var = 0;
        for (int64_t n = 0; n < N; n++)
            for (int64_t s = 0; s < S; s++)
                mean += x[(n * C + c) * S + s];
        mean /= N * S;
        for (int64_t n = 0; n < N; n++)
            for (int64_t s = 0; s < S; s++)
                var += (x[(n * C + c) * S + s] - mean) * (x[(n * C + c) * S + s] - mean);
        var /= N * S;
        EXPECT_NEAR(saved[c], (double)mean, 1e-14);
        EXPECT_NEAR(saved[C + c], (double)(1 / std::sqrt(var + 1e-5L)), 1e-12);
        EXPECT_NEAR(rm[c], 0.9 * 0.25 + 0.1 * (double)mean, 1e-14);
        EXPECT_NEAR(rv[c], 0.9 * 2.0 + 0.1 * (double)(var * (N * S) / (N * S - 1)), 1e-12);
        for (int64_t n = 0; n < N; n++)
            for (int64_t s = 0; s < S; s++) {
                int64_t i = (n * C + c) * S + s;
                double want = (double)((x[i] - mean) / std::sqrt(var + 1e-5L) * g[c] + b[c]);
                ASSERT_NEAR(y[i], want, 1e-12);
            }
    }
    // Inference with the running statistics.
    std::vector<double> yi(x.size(), NAN);
    tsl_bn_infer_tile(&a, x.data(), rm.data(), rv.data(), g.data(), b.data(), yi.data());
    const int64_t c7 = (7 / S) % C; // channel of element 7
    EXPECT_NEAR(yi[7], (x[7] - rm[c7]) / std::sqrt(rv[c7] + 1e-5) * g[c7] + b[c7], 1e-12);
}

TEST(BatchNormKernel, BackwardMatchesFiniteDifferences)
{
    std::mt19937_64 rng(4);
    std::normal_distribution<double> d(0.5, 2.0);
    std::vector<double> x(N * C * S), r(N * C * S), g(C), b(C);
    for (auto &v : x)
        v = d(rng);
    for (auto &v : r)
        v = d(rng);
    for (int64_t c = 0; c < C; c++) {
        g[c] = 1.5 - 0.3 * c;
        b[c] = 0.1 * c;
    }
    auto loss = [&](const std::vector<double> &xx, const std::vector<double> &gg,
                    const std::vector<double> &bb) {
        auto y = forward(xx, gg, bb);
        double s = 0;
        for (size_t i = 0; i < y.size(); i++)
            s += y[i] * r[i];
        return s;
    };
    std::vector<double> saved;
    forward(x, g, b, &saved);
    tsl_bn_args a = whole(1e-5, 0.1);
    std::vector<tsl_acc> acc(2 * C);
    std::vector<double> coef(2 * C), dx(x.size(), NAN), dg(C, NAN), db(C, NAN);
    tsl_bn_backward_stats_tile(&a, x.data(), r.data(), saved.data(), acc.data());
    tsl_bn_backward_coef(&a, acc.data(), coef.data());
    a.which = 0;
    tsl_bn_param_grad(&a, acc.data(), db.data());
    a.which = 1;
    tsl_bn_param_grad(&a, acc.data(), dg.data());
    tsl_bn_backward_data_tile(&a, x.data(), r.data(), saved.data(), g.data(), coef.data(),
                              dx.data());
    const double h = 1e-5;
    auto fd = [&](std::vector<double> &v, size_t i, int which) {
        double keep = v[i];
        v[i] = keep + h;
        double up = which == 0 ? loss(v, g, b) : which == 1 ? loss(x, v, b) : loss(x, g, v);
        v[i] = keep - h;
        double down = which == 0 ? loss(v, g, b) : which == 1 ? loss(x, v, b) : loss(x, g, v);
        v[i] = keep;
        return (up - down) / (2 * h);
    };
    auto xc = x, gc = g, bc = b;
    for (size_t i = 0; i < x.size(); i++)
        ASSERT_NEAR(dx[i], fd(xc, i, 0), 1e-6) << "dx " << i;
    for (int64_t c = 0; c < C; c++) {
        EXPECT_NEAR(dg[c], fd(gc, (size_t)c, 1), 1e-6) << "dgamma " << c;
        EXPECT_NEAR(db[c], fd(bc, (size_t)c, 2), 1e-6) << "dbeta " << c;
    }
}
