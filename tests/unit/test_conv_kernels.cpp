// Convolution kernels (codelets/conv.c, oneDNN) against a naive reference written here
// (double accumulation) and central finite differences of L = sum(y * r), on random
// problems: 1-D/2-D/3-D, odd sizes, stride 1/2, dilation 1/2, padding 0/1/2, kernels 1/3/5,
// groups 1, 2 and depthwise, batch 1 and more. Outputs are poisoned before each run.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

extern "C" {
#include "../../codelets/conv.h"
#include "tessel/ops.h"
}

namespace
{

struct Problem {
    tsl_conv_args a{};
    size_t x_size = 1, w_size = 1, y_size = 1;
    int64_t in_pos = 1, out_pos = 1, k_pos = 1; // positions per channel
};

Problem make(int spatial, int64_t n, int64_t cin, int64_t cout, int64_t groups,
             std::vector<int64_t> size, int64_t k, int64_t stride, int64_t pad, int64_t dil)
{
    Problem p;
    tsl_conv_args &a = p.a;
    a.spatial = spatial;
    a.samples = n;
    a.in_channels = cin;
    a.out_channels = cout;
    a.groups = groups;
    for (int d = 0; d < spatial; d++) {
        a.in_size[d] = size[d];
        a.kernel[d] = k;
        a.stride[d] = stride;
        a.padding[d] = pad;
        a.dilation[d] = dil;
        a.out_size[d] = (size[d] + 2 * pad - dil * (k - 1) - 1) / stride + 1;
        p.in_pos *= size[d];
        p.out_pos *= a.out_size[d];
        p.k_pos *= k;
    }
    p.x_size = (size_t)(n * cin * p.in_pos);
    p.y_size = (size_t)(n * cout * p.out_pos);
    p.w_size = (size_t)(cout * (cin / groups) * p.k_pos);
    return p;
}

// Naive convolution in double.
std::vector<double> reference(const Problem &p, const std::vector<float> &x,
                              const std::vector<float> &w, const std::vector<float> &b)
{
    const tsl_conv_args &a = p.a;
    std::vector<double> y(p.y_size, 0);
    int64_t cin_g = a.in_channels / a.groups, cout_g = a.out_channels / a.groups;
    int64_t os[3] = {1, 1, 1}, is[3] = {1, 1, 1}, ks[3] = {1, 1, 1};
    for (int d = 0; d < a.spatial; d++) {
        os[d] = a.out_size[d];
        is[d] = a.in_size[d];
        ks[d] = a.kernel[d];
    }
    for (int64_t n = 0; n < a.samples; n++)
        for (int64_t o = 0; o < a.out_channels; o++)
            for (int64_t p0 = 0; p0 < os[0]; p0++)
                for (int64_t p1 = 0; p1 < os[1]; p1++)
                    for (int64_t p2 = 0; p2 < os[2]; p2++) {
                        double acc = b.empty() ? 0 : b[o];
                        int64_t g = o / cout_g;
                        for (int64_t c = 0; c < cin_g; c++)
                            for (int64_t k0 = 0; k0 < ks[0]; k0++)
                                for (int64_t k1 = 0; k1 < ks[1]; k1++)
                                    for (int64_t k2 = 0; k2 < ks[2]; k2++) {
                                        int64_t pos[3] = {p0, p1, p2}, kk[3] = {k0, k1, k2}, q[3];
                                        bool inside = true;
                                        for (int d = 0; d < 3; d++) {
                                            if (d >= a.spatial) {
                                                q[d] = 0;
                                                continue;
                                            }
                                            q[d] = pos[d] * a.stride[d] - a.padding[d] +
                                                   kk[d] * a.dilation[d];
                                            inside &= q[d] >= 0 && q[d] < is[d];
                                        }
                                        if (!inside)
                                            continue;
                                        int64_t ci = g * cin_g + c;
                                        double xv = x[((n * a.in_channels + ci) * is[0] + q[0]) *
                                                          is[1] * is[2] +
                                                      q[1] * is[2] + q[2]];
                                        double wv =
                                            w[((o * cin_g + c) * ks[0] + k0) * ks[1] * ks[2] +
                                              k1 * ks[2] + k2];
                                        acc += xv * wv;
                                    }
                        y[((n * a.out_channels + o) * os[0] + p0) * os[1] * os[2] + p1 * os[2] +
                          p2] = acc;
                    }
    return y;
}

std::vector<float> randf(std::mt19937_64 &rng, size_t n)
{
    std::uniform_real_distribution<float> d(-1, 1);
    std::vector<float> v(n);
    for (auto &x : v)
        x = d(rng);
    return v;
}

double dot(const std::vector<double> &y, const std::vector<float> &r)
{
    double s = 0;
    for (size_t i = 0; i < y.size(); i++)
        s += y[i] * r[i];
    return s;
}

} // namespace

TEST(ConvKernel, ForwardAndBackwardAgainstNaiveReferenceAndFiniteDifferences)
{
    std::mt19937_64 rng(20261123);
    struct Case {
        int spatial;
        int64_t n, cin, cout, groups;
        std::vector<int64_t> size;
        int64_t k, stride, pad, dil;
    };
    const Case cases[] = {
        {1, 2, 3, 4, 1, {17}, 3, 1, 1, 1},      {1, 1, 4, 4, 4, {16}, 5, 2, 2, 1},
        {1, 3, 2, 6, 2, {11}, 3, 2, 0, 2},      {2, 2, 3, 5, 1, {9, 7}, 3, 1, 1, 1},
        {2, 1, 4, 2, 2, {8, 11}, 5, 2, 2, 1},   {2, 2, 6, 6, 6, {7, 9}, 3, 1, 2, 2},
        {2, 1, 2, 3, 1, {5, 6}, 1, 2, 0, 1},    {3, 2, 2, 3, 1, {5, 6, 7}, 3, 2, 1, 1},
        {3, 1, 4, 4, 4, {6, 5, 5}, 3, 1, 2, 2}, {3, 1, 3, 2, 1, {4, 4, 5}, 1, 1, 0, 1},
    };
    for (const Case &c : cases) {
        Problem p =
            make(c.spatial, c.n, c.cin, c.cout, c.groups, c.size, c.k, c.stride, c.pad, c.dil);
        for (int bias = 0; bias < 2; bias++) {
            p.a.has_bias = bias;
            auto x = randf(rng, p.x_size), w = randf(rng, p.w_size), r = randf(rng, p.y_size);
            std::vector<float> b = bias ? randf(rng, (size_t)c.cout) : std::vector<float>();
            std::vector<float> y(p.y_size, NAN);
            tsl_conv_forward_kernel(&p.a, x.data(), w.data(), bias ? b.data() : nullptr, y.data());
            auto want = reference(p, x, w, b);
            for (size_t i = 0; i < y.size(); i++)
                ASSERT_NEAR(y[i], want[i], 1e-4 * (1 + std::fabs(want[i])))
                    << c.spatial << "-D case, bias " << bias << ", element " << i;
            // Backward: dx = dL/dx and dw = dL/dw for L = sum(y * r).
            std::vector<float> dx(p.x_size, NAN), dw(p.w_size, NAN), db(c.cout, NAN);
            tsl_conv_backward_data_kernel(&p.a, r.data(), w.data(), dx.data());
            tsl_conv_backward_weights_kernel(&p.a, x.data(), r.data(), dw.data(),
                                             bias ? db.data() : nullptr);
            const float h = 1e-2f; // L is linear in x and in w: differences are exact up to
                                   // rounding, so a large step is fine
            auto check = [&](std::vector<float> &v, const std::vector<float> &grad, bool weights) {
                for (size_t i = 0; i < v.size(); i += 1 + v.size() / 40) {
                    float keep = v[i];
                    v[i] = keep + h;
                    double up = dot(weights ? reference(p, x, v, b) : reference(p, v, w, b), r);
                    v[i] = keep - h;
                    double down = dot(weights ? reference(p, x, v, b) : reference(p, v, w, b), r);
                    v[i] = keep;
                    double fd = (up - down) / (2 * h);
                    ASSERT_NEAR(grad[i], fd, 1e-3 * (1 + std::fabs(fd)))
                        << (weights ? "dw " : "dx ") << c.spatial << "-D element " << i;
                }
            };
            auto xc = x, wc = w;
            check(xc, dx, false);
            check(wc, dw, true);
            if (bias)
                for (int64_t o = 0; o < c.cout; o++) {
                    double s = 0;
                    for (int64_t n = 0; n < c.n; n++)
                        for (int64_t i = 0; i < p.out_pos; i++)
                            s += r[(n * c.cout + o) * p.out_pos + i];
                    ASSERT_NEAR(db[o], s, 1e-4 * (1 + std::fabs(s)));
                }
        }
    }
}

TEST(ConvShape, BadSettingsAreRefusedBeforeAnythingRuns)
{
    auto shape = [](std::vector<int64_t> d) {
        tsl_shape s;
        tsl_shape_make(&s, (int32_t)d.size(), d.data());
        return s;
    };
    tsl_conv_params p;
    ASSERT_EQ(tsl_conv_params_init(&p, 2), TSL_OK);
    tsl_shape x = shape({2, 4, 8, 8}), w = shape({6, 4, 3, 3}), y;
    ASSERT_EQ(tsl_conv_output_shape(&x, &w, &p, &y), TSL_OK);
    EXPECT_EQ(y.dims[1], 6);
    EXPECT_EQ(y.dims[2], 6);
    p.padding[0] = -1;
    EXPECT_EQ(tsl_conv_output_shape(&x, &w, &p, &y), TSL_ERR_INVALID_ARG);
    p.padding[0] = 0;
    tsl_shape big = shape({6, 4, 9, 3});
    EXPECT_EQ(tsl_conv_output_shape(&x, &big, &p, &y), TSL_ERR_SHAPE); // kernel > padded input
    EXPECT_NE(std::strstr(tsl_last_error(), "kernel"), nullptr);
    tsl_shape wrong = shape({6, 3, 3, 3});
    EXPECT_EQ(tsl_conv_output_shape(&x, &wrong, &p, &y), TSL_ERR_SHAPE); // channels
    p.groups = 3;
    EXPECT_EQ(tsl_conv_output_shape(&x, &w, &p, &y), TSL_ERR_SHAPE); // 3 does not divide 4
    p.groups = 2;
    tsl_shape wg = shape({6, 2, 3, 3});
    EXPECT_EQ(tsl_conv_output_shape(&x, &wg, &p, &y), TSL_OK);
    p.stride[1] = 0;
    EXPECT_EQ(tsl_conv_output_shape(&x, &wg, &p, &y), TSL_ERR_INVALID_ARG);
    EXPECT_EQ(tsl_conv_params_init(&p, 4), TSL_ERR_INVALID_ARG);
    tsl_shape x1 = shape({2, 4, 8});
    ASSERT_EQ(tsl_conv_params_init(&p, 2), TSL_OK);
    EXPECT_EQ(tsl_conv_output_shape(&x1, &w, &p, &y), TSL_ERR_SHAPE); // 1-D input, 2-D conv
}

namespace
{

// Naive transposed convolution: every input position scatters into the output.
std::vector<double> transposed_reference(const tsl_conv_args &a, const std::vector<float> &x,
                                         const std::vector<float> &w, const std::vector<float> &b)
{
    int64_t is[3] = {1, 1, 1}, os[3] = {1, 1, 1}, ks[3] = {1, 1, 1};
    for (int d = 0; d < a.spatial; d++) {
        is[d] = a.in_size[d];
        os[d] = a.out_size[d];
        ks[d] = a.kernel[d];
    }
    int64_t in_g = a.in_channels / a.groups, out_g = a.out_channels / a.groups;
    int64_t opos = os[0] * os[1] * os[2], ipos = is[0] * is[1] * is[2],
            kpos = ks[0] * ks[1] * ks[2];
    std::vector<double> y((size_t)(a.samples * a.out_channels * opos), 0);
    for (int64_t n = 0; n < a.samples; n++)
        for (int64_t o = 0; o < a.out_channels; o++)
            for (int64_t q = 0; q < opos; q++)
                y[(n * a.out_channels + o) * opos + q] = b.empty() ? 0 : b[o];
    for (int64_t n = 0; n < a.samples; n++)
        for (int64_t i = 0; i < a.in_channels; i++)
            for (int64_t p = 0; p < ipos; p++)
                for (int64_t oc = 0; oc < out_g; oc++)
                    for (int64_t k = 0; k < kpos; k++) {
                        int64_t pp[3] = {p / (is[1] * is[2]), p / is[2] % is[1], p % is[2]};
                        int64_t kk[3] = {k / (ks[1] * ks[2]), k / ks[2] % ks[1], k % ks[2]};
                        int64_t qq[3] = {0, 0, 0};
                        bool inside = true;
                        for (int d = 0; d < a.spatial; d++) {
                            qq[d] = pp[d] * a.stride[d] - a.padding[d] + kk[d] * a.dilation[d];
                            inside &= qq[d] >= 0 && qq[d] < os[d];
                        }
                        if (!inside)
                            continue;
                        int64_t o = (i / in_g) * out_g + oc;
                        int64_t q = (qq[0] * os[1] + qq[1]) * os[2] + qq[2];
                        y[(n * a.out_channels + o) * opos + q] +=
                            (double)x[(n * a.in_channels + i) * ipos + p] *
                            w[(i * out_g + oc) * kpos + k];
                    }
    return y;
}

} // namespace

TEST(ConvKernel, TransposedAgainstNaiveReferenceAndFiniteDifferences)
{
    std::mt19937_64 rng(99);
    struct Case {
        int spatial;
        int64_t n, cin, cout, groups;
        std::vector<int64_t> size;
        int64_t k, stride, pad, dil, out_pad;
    };
    const Case cases[] = {
        {1, 2, 3, 4, 1, {7}, 3, 2, 1, 1, 1},       {2, 1, 4, 2, 1, {5, 6}, 2, 2, 0, 1, 0},
        {2, 2, 4, 6, 2, {4, 5}, 3, 2, 1, 1, 1},    {2, 1, 2, 2, 2, {5, 5}, 3, 1, 2, 2, 0},
        {3, 1, 2, 3, 1, {3, 4, 3}, 3, 2, 1, 1, 1},
    };
    for (const Case &c : cases) {
        tsl_conv_args a{};
        a.spatial = c.spatial;
        a.transposed = 1;
        a.samples = c.n;
        a.in_channels = c.cin;
        a.out_channels = c.cout;
        a.groups = c.groups;
        size_t xs = (size_t)(c.n * c.cin), ws = (size_t)(c.cin * (c.cout / c.groups));
        size_t ys = (size_t)(c.n * c.cout);
        for (int d = 0; d < c.spatial; d++) {
            a.in_size[d] = c.size[d];
            a.kernel[d] = c.k;
            a.stride[d] = c.stride;
            a.padding[d] = c.pad;
            a.dilation[d] = c.dil;
            a.out_size[d] =
                (c.size[d] - 1) * c.stride - 2 * c.pad + c.dil * (c.k - 1) + c.out_pad + 1;
            xs *= (size_t)c.size[d];
            ws *= (size_t)c.k;
            ys *= (size_t)a.out_size[d];
        }
        for (int bias = 0; bias < 2; bias++) {
            a.has_bias = bias;
            auto x = randf(rng, xs), w = randf(rng, ws), r = randf(rng, ys);
            std::vector<float> b = bias ? randf(rng, (size_t)c.cout) : std::vector<float>();
            std::vector<float> y(ys, NAN), dx(xs, NAN), dw(ws, NAN), db((size_t)c.cout, NAN);
            tsl_conv_forward_kernel(&a, x.data(), w.data(), bias ? b.data() : nullptr, y.data());
            auto want = transposed_reference(a, x, w, b);
            for (size_t i = 0; i < ys; i++)
                ASSERT_NEAR(y[i], want[i], 1e-4 * (1 + std::fabs(want[i])))
                    << c.spatial << "-D transposed, element " << i;
            tsl_conv_backward_data_kernel(&a, r.data(), w.data(), dx.data());
            tsl_conv_backward_weights_kernel(&a, x.data(), r.data(), dw.data(),
                                             bias ? db.data() : nullptr);
            const float h = 1e-2f;
            auto check = [&](std::vector<float> &v, const std::vector<float> &grad, bool weights) {
                for (size_t i = 0; i < v.size(); i += 1 + v.size() / 30) {
                    float keep = v[i];
                    v[i] = keep + h;
                    double up = dot(weights ? transposed_reference(a, x, v, b)
                                            : transposed_reference(a, v, w, b),
                                    r);
                    v[i] = keep - h;
                    double down = dot(weights ? transposed_reference(a, x, v, b)
                                              : transposed_reference(a, v, w, b),
                                      r);
                    v[i] = keep;
                    double fd = (up - down) / (2 * h);
                    ASSERT_NEAR(grad[i], fd, 1e-3 * (1 + std::fabs(fd)))
                        << (weights ? "dw " : "dx ") << c.spatial << "-D element " << i;
                }
            };
            auto xc = x, wc = w;
            check(xc, dx, false);
            check(wc, dw, true);
        }
    }
    // Shapes: a 2x up-sampling layer of a U-Net, and refused settings.
    tsl_conv_params p;
    tsl_conv_params_init(&p, 2);
    p.stride[0] = p.stride[1] = 2;
    int64_t xd[4] = {1, 8, 16, 16}, wd[4] = {8, 4, 2, 2};
    tsl_shape xsh, wsh, ysh;
    tsl_shape_make(&xsh, 4, xd);
    tsl_shape_make(&wsh, 4, wd);
    ASSERT_EQ(tsl_conv_transpose_output_shape(&xsh, &wsh, &p, &ysh), TSL_OK);
    EXPECT_EQ(ysh.dims[1], 4);
    EXPECT_EQ(ysh.dims[2], 32);
    p.output_padding[0] = 2; // not below the stride
    EXPECT_EQ(tsl_conv_transpose_output_shape(&xsh, &wsh, &p, &ysh), TSL_ERR_INVALID_ARG);
}
