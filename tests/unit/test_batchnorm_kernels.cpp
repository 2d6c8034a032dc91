// Batch-norm kernels (codelets/batchnorm_stats.c, batchnorm_normalize.c) on one whole-tensor tile:
// forward against a long double reference, backward against central finite differences in float64;
// the same for batch norm + ReLU fused, whose float32 kernels also match the unfused ones bit for
// bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <type_traits>
#include <vector>

extern "C" {
#include "codelets/batchnorm.h"
#include "codelets/bn_tile_walk.h"
}

namespace
{

const int64_t N = 3, C = 4, S = 5; // (N, C, S) of the float64 tests

uint64_t fresh_seed()
{
    uint64_t seed = ((uint64_t)std::random_device{}() << 32) ^ std::random_device{}();
    std::printf("seed %llu\n", (unsigned long long)seed);
    return seed;
}

template <typename T> tsl_bn_args tile_args(int64_t n, int64_t c, int64_t s, int relu)
{
    tsl_bn_args a{};
    a.dtype = std::is_same<T, float>::value ? TSL_F32 : TSL_F64;
    a.channels = c;
    a.acc_count = c;
    a.samples = n;
    a.cext = c;
    a.inner = s;
    a.per_channel = n * s;
    a.eps = 1e-5;
    a.momentum = 0.1;
    a.relu = relu;
    return a;
}

// Forward on one whole-tensor tile: stats, finalize, normalize (ReLU as a.relu says).
template <typename T>
std::vector<T> bn_forward(const tsl_bn_args &a, const std::vector<T> &x, const std::vector<T> &g,
                          const std::vector<T> &b, std::vector<double> &saved)
{
    std::vector<tsl_acc> acc(2 * a.channels);
    saved.assign(2 * a.channels, NAN);
    std::vector<T> y(x.size(), (T)NAN);
    tsl_bn_stats_tile(&a, x.data(), acc.data());
    tsl_bn_finalize(&a, acc.data(), saved.data());
    tsl_bn_normalize_tile(&a, x.data(), saved.data(), g.data(), b.data(), y.data());
    return y;
}

template <typename T> struct Grads {
    std::vector<T> dx, dgamma, dbeta;
};

// Backward on one tile (with the ReLU's mask recomputed from x, g, b and saved when a.relu).
template <typename T>
Grads<T> bn_backward(tsl_bn_args a, const std::vector<T> &x, const std::vector<T> &dy,
                     const std::vector<T> &g, const std::vector<T> &b,
                     const std::vector<double> &saved)
{
    std::vector<tsl_acc> acc(2 * a.channels);
    std::vector<double> coef(2 * a.channels, NAN);
    Grads<T> out{std::vector<T>(x.size(), (T)NAN), std::vector<T>(a.channels, (T)NAN),
                 std::vector<T>(a.channels, (T)NAN)};
    const double *sp = a.relu ? saved.data() : nullptr;
    const T *gp = a.relu ? g.data() : nullptr, *bp = a.relu ? b.data() : nullptr;
    tsl_bn_backward_stats_tile(&a, x.data(), dy.data(), sp, gp, bp, acc.data());
    tsl_bn_backward_coef(&a, acc.data(), saved.data(), coef.data());
    a.which = 0;
    tsl_bn_param_grad(&a, acc.data(), saved.data(), out.dbeta.data());
    a.which = 1;
    tsl_bn_param_grad(&a, acc.data(), saved.data(), out.dgamma.data());
    tsl_bn_backward_data_tile(&a, x.data(), dy.data(), saved.data(), g.data(), bp, coef.data(),
                              out.dx.data());
    return out;
}

template <typename T> bool same_bits(const std::vector<T> &u, const std::vector<T> &v)
{
    return u.size() == v.size() && std::memcmp(u.data(), v.data(), u.size() * sizeof(T)) == 0;
}

// Per-channel batch mean and biased variance of an (N, C, S) array, in long double.
template <typename T>
void reference_stats(const std::vector<T> &x, int64_t n, int64_t c, int64_t s,
                     std::vector<long double> &mean, std::vector<long double> &var)
{
    mean.assign(c, 0);
    var.assign(c, 0);
    for (int64_t ch = 0; ch < c; ch++) {
        long double m = 0, v = 0;
        for (int64_t k = 0; k < n; k++)
            for (int64_t i = 0; i < s; i++)
                m += x[(k * c + ch) * s + i];
        m /= n * s;
        for (int64_t k = 0; k < n; k++)
            for (int64_t i = 0; i < s; i++) {
                long double d = x[(k * c + ch) * s + i] - m;
                v += d * d;
            }
        mean[ch] = m;
        var[ch] = v / (n * s);
    }
}

// f32 shape whose rows (4109 elements) span two extraction chunks, a tail shorter than the
// vector width, and two backward staging chunks.
const int64_t FN = 2, FC = 3, FS = 4109;

// sum(y * r) for y the forward (ReLU fused when a.relu) of (x, gamma, beta): a loss whose
// gradients the backward gives.
auto weighted_output(const tsl_bn_args &a, const std::vector<double> &r)
{
    return [a, &r](const std::vector<double> &x, const std::vector<double> &g,
                   const std::vector<double> &b) {
        std::vector<double> saved;
        auto y = bn_forward(a, x, g, b, saved);
        double s = 0;
        for (size_t i = 0; i < y.size(); i++)
            s += y[i] * r[i];
        return s;
    };
}

// dx, dgamma and dbeta against central differences of loss(x, gamma, beta) in float64.
template <typename Loss>
void expect_central_differences(Loss loss, const std::vector<double> &x,
                                const std::vector<double> &g, const std::vector<double> &b,
                                const std::vector<double> &dx, const std::vector<double> &dg,
                                const std::vector<double> &db)
{
    const double h = 1e-5;
    auto xc = x, gc = g, bc = b;
    auto fd = [&](std::vector<double> &v, size_t i) {
        double keep = v[i];
        v[i] = keep + h;
        double up = loss(xc, gc, bc);
        v[i] = keep - h;
        double down = loss(xc, gc, bc);
        v[i] = keep;
        return (up - down) / (2 * h);
    };
    for (size_t i = 0; i < x.size(); i++)
        ASSERT_NEAR(dx[i], fd(xc, i), 1e-6) << "dx " << i;
    for (size_t c = 0; c < g.size(); c++) {
        EXPECT_NEAR(dg[c], fd(gc, c), 1e-6) << "dgamma " << c;
        EXPECT_NEAR(db[c], fd(bc, c), 1e-6) << "dbeta " << c;
    }
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
    tsl_bn_args a = tile_args<double>(N, C, S, 0);
    std::vector<double> saved;
    auto y = bn_forward(a, x, g, b, saved);
    std::vector<tsl_acc> acc(2 * C);
    tsl_bn_stats_tile(&a, x.data(), acc.data());
    std::vector<double> rm(C, 0.25), rv(C, 2.0);
    a.which = 0;
    tsl_bn_running(&a, acc.data(), rm.data());
    a.which = 1;
    tsl_bn_running(&a, acc.data(), rv.data());
    std::vector<long double> means, vars;
    reference_stats(x, N, C, S, means, vars);
    for (int64_t c = 0; c < C; c++) {
        long double mean = means[c], var = vars[c];
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
    const tsl_bn_args a = tile_args<double>(N, C, S, 0);
    std::vector<double> saved;
    bn_forward(a, x, g, b, saved);
    auto grads = bn_backward(a, x, r, g, b, saved);
    expect_central_differences(weighted_output(a, r), x, g, b, grads.dx, grads.dgamma, grads.dbeta);
}

// ---- batch norm + ReLU, fused (a.relu = 1) ----

TEST(BatchNormReluKernel, ForwardF32AgainstDoubleReference)
{
    std::mt19937_64 rng(fresh_seed());
    std::normal_distribution<double> d(0.5, 2.0);
    std::uniform_real_distribution<double> u(0.5, 1.5), v(-0.5, 0.5);
    std::vector<float> x(FN * FC * FS), g(FC), b(FC);
    for (auto &e : x)
        e = (float)d(rng);
    for (int64_t c = 0; c < FC; c++) {
        g[c] = (float)u(rng);
        b[c] = (float)v(rng);
    }
    std::vector<double> saved, saved_plain;
    auto y = bn_forward(tile_args<float>(FN, FC, FS, 1), x, g, b, saved);
    auto z = bn_forward(tile_args<float>(FN, FC, FS, 0), x, g, b, saved_plain);
    EXPECT_EQ(saved, saved_plain);
    std::vector<long double> mean, invstd;
    reference_stats(x, FN, FC, FS, mean, invstd);
    for (auto &v : invstd)
        v = 1 / std::sqrt(v + 1e-5L);
    int64_t zeros = 0;
    for (int64_t c = 0; c < FC; c++) {
        EXPECT_NEAR(saved[c], (double)mean[c], 1e-14 * (1 + std::fabs((double)mean[c])));
        EXPECT_NEAR(saved[FC + c], (double)invstd[c], 1e-12 * (double)invstd[c]);
        for (int64_t n = 0; n < FN; n++)
            for (int64_t i = 0; i < FS; i++) {
                int64_t at = (n * FC + c) * FS + i;
                double pre = (double)((x[at] - mean[c]) * invstd[c] * g[c] + b[c]);
                ASSERT_NEAR(z[at], pre, 2e-6 * (1 + std::fabs(pre))) << "plain " << at;
                ASSERT_NEAR(y[at], pre > 0 ? pre : 0.0, 2e-6 * (1 + std::fabs(pre)))
                    << "fused " << at;
                const float relu = z[at] > 0 ? z[at] : 0.0f; // as tsl_act_forward
                ASSERT_EQ(std::memcmp(&y[at], &relu, sizeof relu), 0)
                    << "fused " << y[at] << " != plain then ReLU " << relu << " at " << at;
                zeros += y[at] == 0;
            }
    }
    // The mask is not trivial.
    EXPECT_GT(zeros, (int64_t)x.size() / 5);
    EXPECT_LT(zeros, (int64_t)x.size() * 4 / 5);
}

TEST(BatchNormReluKernel, BackwardMatchesFiniteDifferences)
{
    std::mt19937_64 rng(fresh_seed());
    std::normal_distribution<double> d(0.5, 2.0);
    std::vector<double> x(N * C * S), r(N * C * S), g(C), b(C);
    for (auto &v : r)
        v = d(rng);
    for (int64_t c = 0; c < C; c++) {
        g[c] = 1.5 - 0.3 * c;
        b[c] = 0.2 * c - 0.3;
    }
    const tsl_bn_args fused = tile_args<double>(N, C, S, 1), plain = tile_args<double>(N, C, S, 0);
    // Keep every pre-activation away from the kink, where differences of +-h would cross it.
    std::vector<double> saved, pre;
    for (int attempt = 0;; attempt++) {
        ASSERT_LT(attempt, 100);
        for (auto &v : x)
            v = d(rng);
        pre = bn_forward(plain, x, g, b, saved);
        bool clear = true;
        for (double p : pre)
            clear = clear && std::fabs(p) > 1e-3;
        if (clear)
            break;
    }
    auto grads = bn_backward(fused, x, r, g, b, saved); // saved: as the fused forward's
    int masked = 0;
    for (double p : pre)
        masked += p <= 0;
    EXPECT_GT(masked, 0);
    EXPECT_LT(masked, (int)x.size());
    expect_central_differences(weighted_output(fused, r), x, g, b, grads.dx, grads.dgamma,
                               grads.dbeta);
}

TEST(BatchNormReluKernel, BackwardF32AgainstDoubleReferenceAndUnfused)
{
    std::mt19937_64 rng(fresh_seed());
    std::normal_distribution<double> d(0.5, 2.0), e(0.0, 1.0);
    std::uniform_real_distribution<double> u(0.5, 1.5), v(-0.5, 0.5);
    std::vector<float> x(FN * FC * FS), dy(x.size()), g(FC), b(FC);
    for (size_t i = 0; i < x.size(); i++) {
        x[i] = (float)d(rng);
        dy[i] = (float)e(rng);
    }
    for (int64_t c = 0; c < FC; c++) {
        g[c] = (float)u(rng);
        b[c] = (float)v(rng);
    }
    const tsl_bn_args fused = tile_args<float>(FN, FC, FS, 1);
    std::vector<double> saved;
    auto y = bn_forward(fused, x, g, b, saved);
    auto got = bn_backward(fused, x, dy, g, b, saved);
    // The unfused backward on the ReLU's gradient gives the same bits.
    std::vector<float> dz(dy.size());
    for (size_t i = 0; i < dy.size(); i++)
        dz[i] = y[i] > 0 ? dy[i] : 0.0f;
    auto plain = bn_backward(tile_args<float>(FN, FC, FS, 0), x, dz, g, b, saved);
    EXPECT_TRUE(same_bits(got.dx, plain.dx));
    EXPECT_TRUE(same_bits(got.dgamma, plain.dgamma));
    EXPECT_TRUE(same_bits(got.dbeta, plain.dbeta));
    // Against the formulas in long double, with the saved statistics.
    for (int64_t c = 0; c < FC; c++) {
        long double sdz = 0, sdzx = 0, mean = saved[c], invstd = saved[FC + c];
        for (int64_t n = 0; n < FN; n++)
            for (int64_t i = 0; i < FS; i++) {
                int64_t at = (n * FC + c) * FS + i;
                sdz += dz[at];
                sdzx += dz[at] * ((x[at] - mean) * invstd);
            }
        EXPECT_NEAR(got.dbeta[c], (double)sdz, 1e-6 * (1 + std::fabs((double)sdz)));
        EXPECT_NEAR(got.dgamma[c], (double)sdzx, 1e-6 * (1 + std::fabs((double)sdzx)));
        const long double m = FN * FS;
        for (int64_t n = 0; n < FN; n++)
            for (int64_t i = 0; i < FS; i++) {
                int64_t at = (n * FC + c) * FS + i;
                long double xhat = (x[at] - mean) * invstd;
                double want = (double)(g[c] * invstd * (dz[at] - sdz / m - xhat * sdzx / m));
                ASSERT_NEAR(got.dx[at], want, 2e-6 * (1 + std::fabs(want))) << "dx " << at;
            }
    }
}

TEST(BatchNormReluKernel, SumsDoNotDependOnTheTiling)
{
    // Forward and backward sums of a float32 (N, C, H, W) tensor over tiles cut along N, C and
    // H (copied out, as tiles are stored), merged, against the sums of one whole tile: the same
    // bits, whatever paths (short rows, vector chunks, tails) each tile took.
    const int64_t n = 4, c = 3, h = 20, w = 37;
    std::mt19937_64 rng(fresh_seed());
    std::normal_distribution<double> d(0.5, 2.0), e(0.0, 1.0);
    std::vector<float> x(n * c * h * w), dy(x.size()), g(c, 1.25f), b(c, 0.1f);
    for (size_t i = 0; i < x.size(); i++) {
        x[i] = (float)d(rng);
        dy[i] = (float)e(rng);
    }
    std::vector<double> saved;
    bn_forward(tile_args<float>(n, c, h * w, 1), x, g, b, saved);
    auto sums = [&](int64_t ns, int64_t cs, int64_t hs) {
        // 3 x 2C accumulators: forward, backward, backward with the ReLU mask.
        std::vector<tsl_acc> total(6 * c), part(2 * c);
        for (auto &t : total)
            tsl_acc_init(&t);
        for (int64_t n0 = 0; n0 < n; n0 += ns)
            for (int64_t c0 = 0; c0 < c; c0 += cs)
                for (int64_t h0 = 0; h0 < h; h0 += hs) {
                    int64_t ne = std::min(ns, n - n0), ce = std::min(cs, c - c0);
                    int64_t he = std::min(hs, h - h0);
                    std::vector<float> tx, tdy;
                    for (int64_t i = 0; i < ne; i++)
                        for (int64_t j = 0; j < ce; j++)
                            for (int64_t k = 0; k < he; k++) {
                                size_t at = (((n0 + i) * c + c0 + j) * h + h0 + k) * w;
                                tx.insert(tx.end(), &x[at], &x[at] + w);
                                tdy.insert(tdy.end(), &dy[at], &dy[at] + w);
                            }
                    tsl_bn_args a = tile_args<float>(ne, c, he * w, 0);
                    a.c0 = c0;
                    a.cext = ce;
                    a.per_channel = n * h * w;
                    // pass k: 0 forward, 1 backward, 2 backward with the ReLU mask
                    auto pass = [&](int k, const tsl_bn_args &args, tsl_acc *into) {
                        if (k == 0)
                            tsl_bn_stats_tile(&args, tx.data(), into);
                        else
                            tsl_bn_backward_stats_tile(&args, tx.data(), tdy.data(), saved.data(),
                                                       g.data(), b.data(), into);
                    };
                    for (int k = 0; k < 3; k++) {
                        a.relu = k == 2;
                        pass(k, a, part.data());
                        for (int64_t q = 0; q < 2 * c; q++)
                            tsl_acc_merge(&total[k * 2 * c + q], &part[q]);
                        // the same tile into accumulators of its channels only (a channel
                        // range's, acc_first = c0): the same bits at their place
                        tsl_bn_args win = a;
                        win.acc_first = c0;
                        win.acc_count = ce;
                        std::vector<tsl_acc> mine(2 * ce + 1);
                        tsl_acc_init(&mine[2 * ce]);
                        const tsl_acc guard = mine[2 * ce];
                        pass(k, win, mine.data());
                        for (int64_t q = 0; q < 2 * ce; q++)
                            EXPECT_EQ(std::memcmp(&mine[q], &part[2 * c0 + q], sizeof(tsl_acc)), 0)
                                << "channel range from " << c0 << ", sum " << q << ", pass " << k;
                        EXPECT_EQ(std::memcmp(&mine[2 * ce], &guard, sizeof(tsl_acc)), 0)
                            << "written past the range's accumulators";
                    }
                }
        std::vector<double> out;
        for (auto &t : total)
            out.push_back(tsl_acc_round(&t));
        return out;
    };
    auto whole = sums(n, c, h);
    for (auto cut :
         std::vector<std::vector<int64_t>>{{1, 1, 1}, {3, 2, 7}, {2, 1, 3}, {4, 3, 19}}) {
        auto got = sums(cut[0], cut[1], cut[2]);
        EXPECT_TRUE(same_bits(got, whole)) << cut[0] << "x" << cut[1] << "x" << cut[2];
    }
}

namespace
{

// Values of x around where the forward's y = (x - mean) * scale + shift crosses 0 (each step
// of the dtype), and special values.
template <typename T> std::vector<T> boundary_values(double mean, double scale, double shift)
{
    std::vector<T> v = {(T)0.0,
                        (T)-0.0,
                        std::numeric_limits<T>::infinity(),
                        -std::numeric_limits<T>::infinity(),
                        std::numeric_limits<T>::quiet_NaN(),
                        std::numeric_limits<T>::max(),
                        -std::numeric_limits<T>::max(),
                        std::numeric_limits<T>::denorm_min(),
                        (T)mean};
    T root = (T)(mean - shift / scale);
    if (std::isfinite(root)) {
        T up = root, down = root;
        for (int k = 0; k < 40; k++) {
            v.push_back(up);
            v.push_back(down);
            up = std::nextafter(up, std::numeric_limits<T>::infinity());
            down = std::nextafter(down, -std::numeric_limits<T>::infinity());
        }
    }
    return v;
}

bool same_or_both_nan(double u, double v)
{
    return (std::isnan(u) && std::isnan(v)) || std::memcmp(&u, &v, sizeof u) == 0;
}

// The fused backward's mask against the forward's own y > 0 for the channels' (gamma, beta),
// on x around each channel's zero crossing: fused stats and dx equal the unfused ones on dy
// masked by the forward output, bit for bit (NaNs alike).
template <typename T> void check_mask_at_the_boundary(uint64_t seed)
{
    const double inf = std::numeric_limits<double>::infinity();
    // scale > 0, < 0, == 0 (twice, shift of each sign), huge shift, non-finite gamma and beta.
    const std::vector<double> gammas = {1.25, -0.75, 0.0, 0.0, 1.0, inf, 1.0, 3.0};
    const std::vector<double> betas = {0.3, -0.2, 0.5, -0.5, 1e30, 0.0, NAN, -1e-3};
    const int64_t c = (int64_t)gammas.size();
    std::vector<double> saved(2 * c);
    std::mt19937_64 rng(seed);
    std::normal_distribution<double> d(0.0, 1.0);
    std::vector<std::vector<T>> rows(c);
    size_t s = 0;
    for (int64_t ch = 0; ch < c; ch++) {
        saved[ch] = 0.1 * (double)ch - 0.25;      // mean
        saved[c + ch] = 0.5 + 0.125 * (double)ch; // invstd
        rows[ch] = boundary_values<T>(saved[ch], saved[c + ch] * gammas[ch], betas[ch]);
        s = std::max(s, rows[ch].size());
    }
    std::vector<T> x(c * s), dy(c * s), g(gammas.begin(), gammas.end()),
        b(betas.begin(), betas.end());
    for (int64_t ch = 0; ch < c; ch++)
        for (size_t i = 0; i < s; i++) {
            x[ch * s + i] = rows[ch][i % rows[ch].size()];
            dy[ch * s + i] = (T)d(rng);
        }
    tsl_bn_args fused = tile_args<T>(1, c, (int64_t)s, 1),
                plain = tile_args<T>(1, c, (int64_t)s, 0);
    std::vector<T> y(x.size(), (T)NAN);
    tsl_bn_normalize_tile(&fused, x.data(), saved.data(), g.data(), b.data(), y.data());
    std::vector<T> dz(dy.size());
    for (size_t i = 0; i < dy.size(); i++)
        dz[i] = y[i] > 0 ? dy[i] : (T)0;
    auto got = bn_backward(fused, x, dy, g, b, saved);
    auto want = bn_backward(plain, x, dz, g, b, saved);
    for (size_t i = 0; i < x.size(); i++)
        ASSERT_TRUE(same_or_both_nan(got.dx[i], want.dx[i]))
            << "dx at x = " << x[i] << ", channel " << i / s << ": " << got.dx[i] << " vs "
            << want.dx[i];
    for (int64_t ch = 0; ch < c; ch++) {
        EXPECT_TRUE(same_or_both_nan(got.dgamma[ch], want.dgamma[ch])) << "dgamma " << ch;
        EXPECT_TRUE(same_or_both_nan(got.dbeta[ch], want.dbeta[ch])) << "dbeta " << ch;
    }
}

} // namespace

TEST(BatchNormReluKernel, MaskMatchesTheForwardAtTheBoundary)
{
    uint64_t seed = fresh_seed();
    check_mask_at_the_boundary<float>(seed);
    check_mask_at_the_boundary<double>(seed);
}

// The CUDA tile kernels' walk (codelets/bn_tile_walk.h), run here over every block and thread
// of the grid it makes: each element of the tile is taken exactly once, by a thread of the
// element's own channel, and no block takes more of a channel than the exact sums allow.
TEST(BatchNormTileWalk, EveryElementOnceByAThreadOfItsChannel)
{
    struct Tile {
        int64_t samples, inner, cext;
    };
    const Tile tiles[] = {{1, 1, 1},    {2, 7, 3},    {3, 50, 16},  {2, 33, 17}, {1, 300, 40},
                          {5, 1, 64},   {4, 129, 1},  {1, 1000, 5}, {7, 3, 31},  {2, 4096, 2},
                          {1, 513, 33}, {3, 255, 96}, {0, 5, 4},    {2, 0, 4}};
    for (const Tile &t : tiles)
        for (int channels_last : {0, 1})
            for (int64_t max_blocks : {1, 3, 2048})
                for (int64_t block_elements : {(int64_t)7, (int64_t)1 << 26}) {
                    SCOPED_TRACE(testing::Message()
                                 << t.samples << "x" << t.cext << "x" << t.inner
                                 << (channels_last ? " channels-last" : " plain") << ", at most "
                                 << max_blocks << " blocks, " << block_elements << " a block");
                    tsl_bn_walk w = tsl_bn_walk_make(t.samples, t.inner, t.cext, channels_last);
                    int64_t gx = 0, gy = 0;
                    tsl_bn_walk_grid(&w, max_blocks, block_elements, &gx, &gy);
                    ASSERT_GE(gx, 1);
                    ASSERT_EQ(gy, std::max<int64_t>(1, (t.cext + w.group - 1) / w.group));
                    const int64_t total = t.samples * t.cext * t.inner;
                    std::vector<int> seen((size_t)total, 0);
                    for (int64_t by = 0; by < gy; by++)
                        for (int64_t bx = 0; bx < gx; bx++) {
                            std::vector<int64_t> per_channel((size_t)std::max<int64_t>(t.cext, 1));
                            for (int tx = 0; tx < TSL_BN_WALK_THREADS; tx++) {
                                int64_t c = tsl_bn_walk_channel(&w, by, tx);
                                if (c < 0)
                                    continue;
                                ASSERT_LT(c, t.cext);
                                ASSERT_EQ(c / w.group, by) << "a channel of another group";
                                tsl_bn_cursor cur;
                                int64_t i;
                                for (int more = tsl_bn_walk_begin(&w, bx, tx, gx, c, &cur, &i);
                                     more; more = tsl_bn_walk_next(&w, c, &cur, &i)) {
                                    ASSERT_GE(i, 0);
                                    ASSERT_LT(i, total);
                                    int64_t channel =
                                        channels_last ? i % t.cext : (i / t.inner) % t.cext;
                                    ASSERT_EQ(channel, c) << "element " << i;
                                    seen[(size_t)i]++;
                                    per_channel[(size_t)c]++;
                                }
                            }
                            for (int64_t n : per_channel)
                                ASSERT_LE(n, block_elements + TSL_BN_WALK_THREADS);
                        }
                    for (int64_t i = 0; i < total; i++)
                        ASSERT_EQ(seen[(size_t)i], 1) << "element " << i;
                }
}
