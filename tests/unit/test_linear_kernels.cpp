// Linear kernels (codelets/linear.c) against loops written here and against central finite
// differences of L = sum(y * r) in float64.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

extern "C" {
#include "codelets/linear.h"
#include "tessel/tensor.h"
}

namespace
{
std::vector<double> randn(std::mt19937_64 &rng, size_t n)
{
    std::normal_distribution<double> d(0, 1);
    std::vector<double> v(n);
    for (auto &x : v)
        x = d(rng);
    return v;
}
} // namespace

TEST(LinearKernel, ForwardAndBackwardAgainstLoopsAndFiniteDifferences)
{
    std::mt19937_64 rng(101);
    const int64_t n = 5, k = 7, o = 3;
    auto x = randn(rng, n * k), w = randn(rng, o * k), b = randn(rng, o), r = randn(rng, n * o);
    tsl_linear_args a{TSL_F64, 1, n, k, o};
    std::vector<double> y(n * o, NAN), dx(n * k, NAN), dw(o * k, NAN), db(o, NAN);
    tsl_linear_forward_kernel(&a, x.data(), w.data(), b.data(), y.data());
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < o; j++) {
            double want = b[j];
            for (int64_t q = 0; q < k; q++)
                want += x[i * k + q] * w[j * k + q];
            ASSERT_NEAR(y[i * o + j], want, 1e-13);
        }
    tsl_linear_backward_data_kernel(&a, r.data(), w.data(), dx.data());
    tsl_linear_backward_weights_kernel(&a, x.data(), r.data(), dw.data(), db.data());
    auto loss = [&](const std::vector<double> &xx, const std::vector<double> &ww,
                    const std::vector<double> &bb) {
        std::vector<double> yy(n * o);
        tsl_linear_forward_kernel(&a, xx.data(), ww.data(), bb.data(), yy.data());
        double s = 0;
        for (int64_t i = 0; i < n * o; i++)
            s += yy[i] * r[i];
        return s;
    };
    const double h = 1e-6;
    auto check = [&](std::vector<double> &v, const std::vector<double> &grad, int which) {
        for (size_t i = 0; i < v.size(); i++) {
            double keep = v[i];
            v[i] = keep + h;
            double up = which == 0 ? loss(v, w, b) : which == 1 ? loss(x, v, b) : loss(x, w, v);
            v[i] = keep - h;
            double down = which == 0 ? loss(v, w, b) : which == 1 ? loss(x, v, b) : loss(x, w, v);
            v[i] = keep;
            ASSERT_NEAR(grad[i], (up - down) / (2 * h), 1e-7) << which << " " << i;
        }
    };
    auto xc = x, wc = w, bc = b;
    check(xc, dx, 0);
    check(wc, dw, 1);
    check(bc, db, 2);
    // f32 agrees with f64 within float rounding; no bias means no bias.
    std::vector<float> xf(x.begin(), x.end()), wf(w.begin(), w.end()), yf(n * o, NAN);
    tsl_linear_args af{TSL_F32, 0, n, k, o};
    tsl_linear_forward_kernel(&af, xf.data(), wf.data(), nullptr, yf.data());
    for (int64_t i = 0; i < n * o; i++)
        EXPECT_NEAR(yf[i], y[i] - b[i % o], 1e-5);
}
