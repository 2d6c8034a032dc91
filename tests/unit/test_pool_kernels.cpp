// Pooling and nearest upsampling kernels (codelets/pool.c) against references written here:
// max and average pooling (both divisor conventions) with padding and stride, 1-D to 3-D;
// average pooling's backward against finite differences; max pooling's backward routes
// each gradient to the window's first maximum.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

extern "C" {
#include "../../codelets/pool.h"
#include "tessel/ops.h"
}

namespace
{

struct P {
    tsl_pool_args a{};
    int64_t in_plane = 1, out_plane = 1;
};

P make(int spatial, int kind, int incl, int64_t planes, std::vector<int64_t> in, int64_t k,
       int64_t s, int64_t pad)
{
    P p;
    p.a.dtype = TSL_F64;
    p.a.spatial = spatial;
    p.a.kind = kind;
    p.a.count_include_pad = incl;
    p.a.planes = planes;
    for (int d = 0; d < spatial; d++) {
        p.a.in_size[d] = in[d];
        p.a.kernel[d] = k;
        p.a.stride[d] = s;
        p.a.padding[d] = pad;
        p.a.out_size[d] = (in[d] + 2 * pad - k) / s + 1;
        p.in_plane *= in[d];
        p.out_plane *= p.a.out_size[d];
    }
    return p;
}

// Reference written independently: windows enumerated per dimension with explicit lists.
std::vector<double> reference(const P &p, const std::vector<double> &x, std::vector<int64_t> *arg)
{
    const tsl_pool_args &a = p.a;
    std::vector<double> y((size_t)(a.planes * p.out_plane));
    if (arg)
        arg->assign(y.size(), -1);
    int64_t in[3] = {1, 1, 1}, out[3] = {1, 1, 1};
    for (int d = 0; d < a.spatial; d++) {
        in[d] = a.in_size[d];
        out[d] = a.out_size[d];
    }
    for (int64_t pl = 0; pl < a.planes; pl++)
        for (int64_t o = 0; o < p.out_plane; o++) {
            int64_t oc[3] = {o / (out[1] * out[2]), o / out[2] % out[1], o % out[2]};
            std::vector<std::vector<int64_t>> pos(3);
            double padded_count = 1;
            for (int d = 0; d < 3; d++) {
                if (d >= a.spatial) {
                    pos[d] = {0};
                    continue;
                }
                int64_t lo = oc[d] * a.stride[d] - a.padding[d];
                int64_t hi = std::min(lo + a.kernel[d], in[d] + a.padding[d]);
                padded_count *= (double)(hi - lo);
                for (int64_t q = lo; q < lo + a.kernel[d]; q++)
                    if (q >= 0 && q < in[d])
                        pos[d].push_back(q);
            }
            double best = -INFINITY, sum = 0, count = 0;
            int64_t where = -1;
            for (int64_t q0 : pos[0])
                for (int64_t q1 : pos[1])
                    for (int64_t q2 : pos[2]) {
                        int64_t i = (q0 * in[1] + q1) * in[2] + q2;
                        double v = x[pl * p.in_plane + i];
                        if (where < 0 || v > best) {
                            best = v;
                            where = i;
                        }
                        sum += v;
                        count += 1;
                    }
            y[pl * p.out_plane + o] =
                a.kind == TSL_POOL_MAX ? best : sum / (a.count_include_pad ? padded_count : count);
            if (arg)
                (*arg)[pl * p.out_plane + o] = pl * p.in_plane + where;
        }
    return y;
}

} // namespace

TEST(PoolKernel, ForwardAndBackwardAgainstReferences)
{
    std::mt19937_64 rng(8);
    std::normal_distribution<double> d(0, 1);
    struct C {
        int spatial;
        std::vector<int64_t> in;
        int64_t k, s, pad;
    };
    const C cases[] = {{1, {13}, 3, 2, 1},
                       {2, {7, 9}, 2, 2, 0},
                       {2, {8, 7}, 3, 1, 1},
                       {3, {5, 6, 4}, 3, 2, 1},
                       {2, {6, 6}, 5, 3, 2}};
    for (const C &c : cases)
        for (int kind : {TSL_POOL_MAX, TSL_POOL_AVG})
            for (int incl : {1, 0}) {
                P p = make(c.spatial, kind, incl, 3, c.in, c.k, c.s, c.pad);
                std::vector<double> x((size_t)(3 * p.in_plane)), y((size_t)(3 * p.out_plane), NAN);
                for (auto &v : x)
                    v = d(rng);
                std::vector<int64_t> arg;
                auto want = reference(p, x, &arg);
                tsl_pool_forward_kernel(&p.a, x.data(), y.data());
                for (size_t i = 0; i < y.size(); i++)
                    ASSERT_NEAR(y[i], want[i], 1e-14) << c.spatial << "-D kind " << kind;
                std::vector<double> dy(y.size()), dx(x.size(), NAN);
                for (auto &v : dy)
                    v = d(rng);
                tsl_pool_backward_kernel(&p.a, x.data(), dy.data(), dx.data());
                if (kind == TSL_POOL_MAX) {
                    std::vector<double> routed(x.size(), 0);
                    for (size_t o = 0; o < dy.size(); o++)
                        routed[(size_t)arg[o]] += dy[o];
                    for (size_t i = 0; i < x.size(); i++)
                        ASSERT_NEAR(dx[i], routed[i], 1e-14);
                } else {
                    const double h = 1e-6;
                    for (size_t i = 0; i < x.size(); i += 3) {
                        auto xp = x, xm = x;
                        xp[i] += h;
                        xm[i] -= h;
                        auto yp = reference(p, xp, nullptr), ym = reference(p, xm, nullptr);
                        double fd = 0;
                        for (size_t o = 0; o < dy.size(); o++)
                            fd += dy[o] * (yp[o] - ym[o]) / (2 * h);
                        ASSERT_NEAR(dx[i], fd, 1e-7);
                    }
                }
            }
}

TEST(PoolKernel, NearestUpsampling)
{
    tsl_pool_args a{};
    a.dtype = TSL_F64;
    a.spatial = 2;
    a.planes = 2;
    a.in_size[0] = 2;
    a.in_size[1] = 3;
    a.kernel[0] = 2; // scale
    a.kernel[1] = 3;
    a.out_size[0] = 4;
    a.out_size[1] = 9;
    std::vector<double> x(12), y(72, NAN), dy(72), dx(12, NAN);
    for (int i = 0; i < 12; i++)
        x[i] = i + 1;
    for (int i = 0; i < 72; i++)
        dy[i] = 0.5 * i;
    tsl_upsample_forward_kernel(&a, x.data(), y.data());
    tsl_upsample_backward_kernel(&a, dy.data(), dx.data());
    for (int pl = 0; pl < 2; pl++)
        for (int r = 0; r < 4; r++)
            for (int c = 0; c < 9; c++)
                ASSERT_EQ(y[pl * 36 + r * 9 + c], x[pl * 6 + (r / 2) * 3 + c / 3]);
    for (int pl = 0; pl < 2; pl++)
        for (int i = 0; i < 6; i++) {
            double want = 0;
            for (int r = 0; r < 4; r++)
                for (int c = 0; c < 9; c++)
                    if ((r / 2) * 3 + c / 3 == i)
                        want += dy[pl * 36 + r * 9 + c];
            EXPECT_EQ(dx[pl * 6 + i], want);
        }
}

TEST(PoolShape, BadSettings)
{
    tsl_pool_params p;
    ASSERT_EQ(tsl_pool_params_init(&p, TSL_POOL_MAX, 2, 2), TSL_OK);
    int64_t xd[4] = {1, 3, 9, 9};
    tsl_shape x, y;
    tsl_shape_make(&x, 4, xd);
    ASSERT_EQ(tsl_pool_output_shape(&x, &p, &y), TSL_OK);
    EXPECT_EQ(y.dims[2], 4);
    p.padding[0] = 2; // more than kernel / 2
    EXPECT_EQ(tsl_pool_output_shape(&x, &p, &y), TSL_ERR_INVALID_ARG);
    p.padding[0] = 0;
    p.kernel[1] = 10;
    EXPECT_EQ(tsl_pool_output_shape(&x, &p, &y), TSL_ERR_SHAPE);
    EXPECT_EQ(tsl_pool_params_init(&p, (tsl_pool_kind)5, 2, 2), TSL_ERR_INVALID_ARG);
}
