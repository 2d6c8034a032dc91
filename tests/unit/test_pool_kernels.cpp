// Pooling and upsampling kernels (codelets/pool_kernels.c) against references written here:
// max and average pooling (both divisor conventions) with padding and stride, 1-D to 3-D;
// average pooling's backward against finite differences; max pooling's backward routes
// each gradient to the window's first maximum. Linear upsampling against PyTorch's published
// values and a per-element reference on random odd shapes, its backward against finite
// differences and the adjoint identity.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <vector>

extern "C" {
#include "codelets/pool.h"
#include "codelets/pool_math.h"
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

// 2 samples x 3 channels of the given layout and dtype, with the index dtype the kernel size
// needs (u8 up to 255 window positions).
P make_planes(int spatial, int kind, int incl, std::vector<int64_t> in, int64_t k, int64_t s,
              int64_t pad, int dtype, int last)
{
    const int64_t samples = 2, channels = 3;
    P p = make(spatial, kind, incl, samples * channels, in, k, s, pad);
    p.a.dtype = dtype;
    p.a.channels_last = last;
    p.a.channels = channels;
    int64_t kvol = 1;
    for (int d = 0; d < spatial; d++)
        kvol *= k;
    p.a.index_dtype = kvol > 255 ? TSL_I32 : TSL_U8;
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

// Max pooling of f32 tiles whose windows stay inside the input takes loops of its own
// (channels innermost on channels-last tiles); they must give what the general loops give on
// the same values in f64: ties (the first maximum gets the gradient), NaNs (they win),
// overlapping windows (stride below kernel), both layouts, 1-D to 3-D, and a tile of a larger
// tensor (input and output origins). Gradients are small integers, so sums are exact in both.
TEST(PoolKernel, MaxF32InsideWindowsEqualTheGeneralLoops)
{
    std::mt19937_64 rng(21);
    std::uniform_int_distribution<int> level(-3, 3), grad(-4, 4), pick(0, 40);
    struct C {
        int spatial;
        std::vector<int64_t> in;
        int64_t k, s;
    };
    const C cases[] = {{1, {13}, 3, 2},
                       {2, {8, 9}, 2, 2},
                       {2, {7, 7}, 3, 1},
                       {3, {5, 6, 4}, 2, 2},
                       {3, {6, 5, 7}, 3, 2}};
    for (const C &c : cases)
        for (int last : {0, 1})
            for (int tile : {0, 1}) {
                SCOPED_TRACE(std::to_string(c.spatial) + "-D, k " + std::to_string(c.k) + ", s " +
                             std::to_string(c.s) + (last ? ", channels-last" : "") +
                             (tile ? ", a tile" : ""));
                const int64_t samples = 2, channels = 3;
                P p = make(c.spatial, TSL_POOL_MAX, 1, samples * channels, c.in, c.k, c.s, 0);
                p.a.channels_last = last;
                p.a.channels = channels;
                if (tile) /* the tile holding outputs from 1 of a tensor one stride larger */
                    for (int d = 0; d < c.spatial; d++) {
                        p.a.global_in[d] = c.in[d] + c.s;
                        p.a.in_origin[d] = c.s;
                        p.a.out_origin[d] = 1;
                    }
                std::vector<double> x((size_t)(p.a.planes * p.in_plane));
                for (auto &v : x)
                    v = pick(rng) == 0 ? NAN : 0.5 * level(rng); // many ties, some NaNs
                std::vector<double> dy((size_t)(p.a.planes * p.out_plane));
                for (auto &v : dy)
                    v = grad(rng);
                std::vector<double> y(dy.size(), 7), dx(x.size(), 7);
                tsl_pool_forward_kernel(&p.a, x.data(), y.data());
                tsl_pool_backward_kernel(&p.a, x.data(), dy.data(), dx.data());
                P f = p;
                f.a.dtype = TSL_F32;
                std::vector<float> xf(x.begin(), x.end()), dyf(dy.begin(), dy.end());
                std::vector<float> yf(y.size(), 7), dxf(x.size(), 7);
                tsl_pool_forward_kernel(&f.a, xf.data(), yf.data());
                tsl_pool_backward_kernel(&f.a, xf.data(), dyf.data(), dxf.data());
                for (size_t i = 0; i < y.size(); i++)
                    ASSERT_TRUE((std::isnan(y[i]) && std::isnan(yf[i])) || (double)yf[i] == y[i])
                        << "y[" << i << "] " << yf[i] << " vs " << y[i];
                for (size_t i = 0; i < x.size(); i++)
                    ASSERT_EQ((double)dxf[i], dx[i]) << "dx[" << i << "]";
            }
}

// Max pooling's indices (tsl_pool_forward_index_kernel()): the same y as the plain forward,
// each index the reference's first maximum as a kernel position, and the backward from the
// indices the very bits of the backward from x: random (not integer) gradients on overlapping
// windows, so the order of the additions shows; ties and NaNs; padding (the general loops) and
// windows inside (the f32 loops); both layouts, a tile of a larger tensor, f32 and f64, u8 and
// (a 7^3 kernel) i32 indices.
TEST(PoolKernel, IndicesGiveTheBackwardsBits)
{
    std::mt19937_64 rng(34);
    std::uniform_int_distribution<int> level(-3, 3), pick(0, 40);
    std::normal_distribution<double> grad(0, 1);
    struct C {
        int spatial;
        std::vector<int64_t> in;
        int64_t k, s, pad;
    };
    const C cases[] = {{1, {13}, 3, 2, 1},     {2, {8, 7}, 3, 1, 1},    {2, {7, 7}, 3, 1, 0},
                       {2, {6, 6}, 5, 3, 2},   {3, {5, 6, 4}, 3, 2, 1}, {3, {6, 5, 7}, 2, 2, 0},
                       {3, {9, 8, 8}, 7, 1, 3}};
    for (const C &c : cases)
        for (int dtype : {TSL_F64, TSL_F32})
            for (int last : {0, 1})
                for (int tile : {0, 1})
                    for (int nans : {0, 1}) {
                        SCOPED_TRACE(std::to_string(c.spatial) + "-D, k " + std::to_string(c.k) +
                                     ", s " + std::to_string(c.s) + ", pad " +
                                     std::to_string(c.pad) + (dtype == TSL_F32 ? ", f32" : "") +
                                     (last ? ", channels-last" : "") + (tile ? ", a tile" : "") +
                                     (nans ? ", NaNs" : ""));
                        P p = make_planes(c.spatial, TSL_POOL_MAX, 1, c.in, c.k, c.s, c.pad, dtype,
                                          last);
                        int64_t kvol = 1;
                        for (int d = 0; d < c.spatial; d++)
                            kvol *= c.k;
                        if (tile) { /* the outputs from 1 of a tensor whose end it holds */
                            p.out_plane = 1;
                            for (int d = 0; d < c.spatial; d++) {
                                p.a.in_origin[d] = std::max<int64_t>(0, c.s - c.pad);
                                p.a.global_in[d] = p.a.in_origin[d] + c.in[d];
                                p.a.out_origin[d] = 1;
                                p.a.out_size[d] = (p.a.global_in[d] + 2 * c.pad - c.k) / c.s;
                                p.out_plane *= p.a.out_size[d];
                            }
                        }
                        std::vector<double> x((size_t)(p.a.planes * p.in_plane));
                        for (auto &v : x)
                            v = nans && pick(rng) == 0 ? NAN : 0.5 * level(rng);
                        std::vector<double> dy((size_t)(p.a.planes * p.out_plane));
                        for (auto &v : dy)
                            v = grad(rng);
                        size_t es = dtype == TSL_F32 ? 4 : 8, is = kvol > 255 ? 4 : 1;
                        std::vector<unsigned char> xb(x.size() * es), dyb(dy.size() * es);
                        for (size_t i = 0; i < x.size(); i++)
                            dtype == TSL_F32 ? (void)(((float *)xb.data())[i] = (float)x[i])
                                             : (void)(((double *)xb.data())[i] = x[i]);
                        for (size_t i = 0; i < dy.size(); i++)
                            dtype == TSL_F32 ? (void)(((float *)dyb.data())[i] = (float)dy[i])
                                             : (void)(((double *)dyb.data())[i] = dy[i]);
                        std::vector<unsigned char> y1(dy.size() * es, 7), y2(dy.size() * es, 9);
                        std::vector<unsigned char> dx1(xb.size(), 7), dx2(xb.size(), 9);
                        std::vector<unsigned char> ix(dy.size() * is, 0xee);
                        tsl_pool_forward_kernel(&p.a, xb.data(), y1.data());
                        tsl_pool_backward_kernel(&p.a, xb.data(), dyb.data(), dx1.data());
                        tsl_pool_forward_index_kernel(&p.a, xb.data(), y2.data(), ix.data());
                        tsl_pool_backward_index_kernel(&p.a, ix.data(), dyb.data(), dx2.data());
                        for (size_t i = 0; i < dy.size(); i++) {
                            double a = dtype == TSL_F32 ? ((float *)y1.data())[i]
                                                        : ((double *)y1.data())[i];
                            double b = dtype == TSL_F32 ? ((float *)y2.data())[i]
                                                        : ((double *)y2.data())[i];
                            ASSERT_TRUE((std::isnan(a) && std::isnan(b)) || a == b)
                                << "y[" << i << "] " << b << " vs " << a;
                        }
                        ASSERT_EQ(0, memcmp(dx1.data(), dx2.data(), dx1.size())) << "dx bits";
                        if (nans || tile || last)
                            continue;
                        // Without NaNs on a whole plain tensor: the reference's first maximum.
                        std::vector<int64_t> arg;
                        reference(p, x, &arg);
                        int64_t in[3] = {1, 1, 1}, out[3] = {1, 1, 1};
                        for (int d = 0; d < c.spatial; d++) {
                            in[d] = c.in[d];
                            out[d] = p.a.out_size[d];
                        }
                        for (size_t i = 0; i < dy.size(); i++) {
                            int64_t o = (int64_t)i % p.out_plane, at = arg[i] % p.in_plane;
                            int64_t oc[3] = {o / (out[1] * out[2]), o / out[2] % out[1],
                                             o % out[2]};
                            int64_t q[3] = {at / (in[1] * in[2]), at / in[2] % in[1], at % in[2]};
                            int64_t k = 0;
                            for (int d = 0; d < 3; d++) {
                                int64_t kd = d < c.spatial ? c.k : 1;
                                int64_t lo = d < c.spatial ? oc[d] * c.s - c.pad : 0;
                                k = k * kd + (q[d] - lo);
                            }
                            int64_t got = is == 1 ? ix[i] : ((int32_t *)ix.data())[i];
                            ASSERT_EQ(got, k) << "index of output " << i;
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

namespace
{

// Linear upsampling arguments as the lowering builds them.
tsl_pool_args linear_args(int dtype, int64_t planes, const std::vector<int64_t> &in,
                          const std::vector<int64_t> &scale)
{
    tsl_pool_args a{};
    a.dtype = dtype;
    a.kind = TSL_UPSAMPLE_LINEAR;
    a.spatial = (int32_t)in.size();
    a.planes = planes;
    for (size_t d = 0; d < in.size(); d++) {
        a.in_size[d] = in[d];
        a.kernel[d] = scale[d];
        a.out_size[d] = in[d] * scale[d];
    }
    return a;
}

int64_t plane_size(const int64_t *sizes, int spatial)
{
    int64_t n = 1;
    for (int d = 0; d < spatial; d++)
        n *= sizes[d];
    return n;
}

// PyTorch's align_corners=False rule written out per output element: along each dimension
// the source coordinate, its two neighbours and their weights; the value is the sum over the
// 2^spatial corners of the product of the weights times the corner's input.
std::vector<double> linear_reference(const tsl_pool_args &a, const std::vector<double> &x)
{
    const int sp = a.spatial;
    const int64_t in_plane = plane_size(a.in_size, sp), out_plane = plane_size(a.out_size, sp);
    std::vector<double> y((size_t)(a.planes * out_plane));
    for (int64_t pl = 0; pl < a.planes; pl++)
        for (int64_t o = 0; o < out_plane; o++) {
            int64_t i0[3], i1[3];
            double lambda[3];
            int64_t rest = o;
            for (int d = sp - 1; d >= 0; d--) {
                int64_t dst = rest % a.out_size[d];
                rest /= a.out_size[d];
                double src = std::max(0.0, (dst + 0.5) / (double)a.kernel[d] - 0.5);
                i0[d] = (int64_t)std::floor(src);
                i1[d] = std::min(i0[d] + 1, a.in_size[d] - 1);
                lambda[d] = src - (double)i0[d];
            }
            double v = 0;
            for (int corner = 0; corner < (1 << sp); corner++) {
                double w = 1;
                int64_t at = 0;
                for (int d = 0; d < sp; d++) {
                    bool upper = (corner >> d) & 1;
                    w *= upper ? lambda[d] : 1 - lambda[d];
                    at = at * a.in_size[d] + (upper ? i1[d] : i0[d]);
                }
                v += w * x[(size_t)(pl * in_plane + at)];
            }
            y[(size_t)(pl * out_plane + o)] = v;
        }
    return y;
}

std::vector<double> up(const tsl_pool_args &a, const std::vector<double> &x)
{
    std::vector<double> y((size_t)(a.planes * plane_size(a.out_size, a.spatial)), NAN);
    tsl_upsample_forward_kernel(&a, x.data(), y.data());
    return y;
}

std::vector<double> up_transpose(const tsl_pool_args &a, const std::vector<double> &dy)
{
    std::vector<double> dx((size_t)(a.planes * plane_size(a.in_size, a.spatial)), NAN);
    tsl_upsample_backward_kernel(&a, dy.data(), dx.data());
    return dx;
}

double dot(const std::vector<double> &u, const std::vector<double> &v)
{
    return std::inner_product(u.begin(), u.end(), v.begin(), 0.0);
}

uint64_t test_seed()
{
    static const uint64_t seed = [] {
        const char *fixed = std::getenv("TESSEL_TEST_SEED");
        uint64_t s = fixed ? std::strtoull(fixed, nullptr, 10)
                           : (uint64_t)std::chrono::steady_clock::now().time_since_epoch().count();
        std::printf("linear upsampling tests: seed %llu (set TESSEL_TEST_SEED to repeat)\n",
                    (unsigned long long)s);
        return s;
    }();
    return seed;
}

} // namespace

TEST(PoolKernel, LinearUpsamplingMatchesPyTorchValues)
{
    // torch.nn.Upsample(scale_factor=s, mode='linear' / 'bilinear'), align_corners=False.
    struct Known {
        std::vector<int64_t> in, scale;
        std::vector<double> x, y;
    };
    const Known known[] = {
        {{3}, {2}, {1, 2, 3}, {1, 1.25, 1.75, 2.25, 2.75, 3}},
        {{2}, {3}, {1, 2}, {1, 1, 4.0 / 3, 5.0 / 3, 2, 2}},
        {{2, 2},
         {2, 2},
         {1, 2, 3, 4},
         {1, 1.25, 1.75, 2, 1.5, 1.75, 2.25, 2.5, 2.5, 2.75, 3.25, 3.5, 3, 3.25, 3.75, 4}},
        {{1, 1, 1}, {2, 1, 3}, {-0.5}, std::vector<double>(6, -0.5)},
    };
    for (const Known &k : known) {
        tsl_pool_args a = linear_args(TSL_F64, 1, k.in, k.scale);
        std::vector<double> y = up(a, k.x);
        ASSERT_EQ(y.size(), k.y.size());
        for (size_t i = 0; i < y.size(); i++)
            EXPECT_NEAR(y[i], k.y[i], 1e-15) << k.in.size() << "-D, element " << i;
        EXPECT_EQ(linear_reference(a, k.x), y); // the reference agrees to the bit here
        a.dtype = TSL_F32;
        std::vector<float> xf(k.x.begin(), k.x.end()), yf(y.size(), NAN);
        tsl_upsample_forward_kernel(&a, xf.data(), yf.data());
        for (size_t i = 0; i < y.size(); i++)
            EXPECT_EQ(yf[i], (float)k.y[i]) << "f32, element " << i;
    }
}

TEST(PoolKernel, UpsamplingToAnySizeMatchesPyTorchValues)
{
    // torch.nn.functional.interpolate(x, size=..., mode='nearest' / 'linear' / 'bilinear',
    // align_corners=False) in float64, larger and smaller sizes: the kernel's scale 0 maps by
    // the global sizes.
    struct Known {
        int kind;
        std::vector<int64_t> in, out;
        std::vector<double> x, y;
    };
    const std::vector<double> x5 = {1, 2, 4, 8, 16};
    const Known known[] = {
        {TSL_UPSAMPLE_NEAREST, {5}, {7}, x5, {1, 1, 2, 4, 4, 8, 16}},
        {TSL_UPSAMPLE_NEAREST, {5}, {3}, x5, {1, 2, 8}},
        {TSL_UPSAMPLE_NEAREST, {2, 3}, {3, 2}, {0, 1, 2, 3, 4, 5}, {0, 1, 0, 1, 3, 4}},
        {TSL_UPSAMPLE_LINEAR,
         {5},
         {7},
         x5,
         {1, 1.5714285714285714, 2.5714285714285716, 4, 6.857142857142858, 11.42857142857143, 16}},
        {TSL_UPSAMPLE_LINEAR, {5}, {3}, x5, {1.3333333333333335, 4, 13.333333333333336}},
        {TSL_UPSAMPLE_LINEAR,
         {2, 3},
         {3, 2},
         {0, 1, 2, 3, 4, 5},
         {0.25, 1.75, 1.7499999999999998, 3.2499999999999996, 3.25, 4.749999999999999}},
    };
    for (const Known &k : known) {
        tsl_pool_args a{};
        a.dtype = TSL_F64;
        a.kind = k.kind;
        a.spatial = (int32_t)k.in.size();
        a.planes = 1;
        for (size_t d = 0; d < k.in.size(); d++) {
            a.in_size[d] = k.in[d];
            a.out_size[d] = k.out[d];
        }
        std::vector<double> y = up(a, k.x);
        ASSERT_EQ(y.size(), k.y.size());
        for (size_t i = 0; i < y.size(); i++)
            EXPECT_NEAR(y[i], k.y[i], 1e-14)
                << k.kind << ", " << k.in.size() << "-D, y[" << i << "]";
        // The backward is the forward's transpose: <up(x), g> = <x, up^T(g)> on a random g.
        std::mt19937_64 rng(test_seed());
        std::normal_distribution<double> normal(0, 1);
        std::vector<double> g(y.size());
        for (auto &v : g)
            v = normal(rng);
        std::vector<double> dx = up_transpose(a, g);
        EXPECT_NEAR(dot(y, g), dot(k.x, dx), 1e-12 * (1 + std::fabs(dot(y, g))));
    }
}

TEST(PoolKernel, LinearUpsamplingOnRandomOddShapes)
{
    std::mt19937_64 rng(test_seed());
    std::normal_distribution<double> normal(0, 1);
    std::uniform_int_distribution<int> any_scale(1, 3);
    int cases = 0;
    for (int spatial = 1; spatial <= 3; spatial++)
        for (int64_t planes : {1, 3})
            for (int scale_kind = 0; scale_kind < 4; scale_kind++) { // all 1, 2 or 3; mixed
                std::vector<int64_t> in((size_t)spatial), scale((size_t)spatial);
                std::uniform_int_distribution<int> half(0, spatial == 3 ? 2 : 3);
                for (int d = 0; d < spatial; d++) {
                    in[(size_t)d] = 2 * half(rng) + 1; // 1, 3, 5 (, 7)
                    scale[(size_t)d] = scale_kind < 3 ? scale_kind + 1 : any_scale(rng);
                }
                std::string what =
                    std::to_string(spatial) + "-D, " + std::to_string(planes) + " planes, in";
                for (int d = 0; d < spatial; d++)
                    what += " " + std::to_string(in[(size_t)d]) + "x" +
                            std::to_string(scale[(size_t)d]);
                SCOPED_TRACE(what);
                cases++;

                tsl_pool_args a = linear_args(TSL_F64, planes, in, scale);
                std::vector<double> x((size_t)(planes * plane_size(a.in_size, spatial)));
                std::vector<double> g((size_t)(planes * plane_size(a.out_size, spatial)));
                for (auto &v : x)
                    v = normal(rng);
                for (auto &v : g)
                    v = normal(rng);

                // Forward: the per-element reference.
                std::vector<double> y = up(a, x), want = linear_reference(a, x);
                for (size_t i = 0; i < y.size(); i++)
                    ASSERT_NEAR(y[i], want[i], 1e-13) << "y[" << i << "]";

                // Backward: adjoint identity <up(x), g> = <x, up^T(g)>.
                std::vector<double> dx = up_transpose(a, g);
                double lhs = dot(y, g), rhs = dot(x, dx);
                ASSERT_NEAR(lhs, rhs, 1e-12 * (1 + std::fabs(lhs)));

                // Backward: central differences of <up(x), g> in float64, every element.
                const double h = 1e-3; // up is linear: no truncation error, only rounding
                for (size_t i = 0; i < x.size(); i++) {
                    auto xp = x, xm = x;
                    xp[i] += h;
                    xm[i] -= h;
                    double fd = (dot(up(a, xp), g) - dot(up(a, xm), g)) / (2 * h);
                    ASSERT_NEAR(dx[i], fd, 1e-8 * (1 + std::fabs(fd))) << "dx[" << i << "]";
                }

                // Backward overwrites dx whatever it held: the same bits from another start.
                std::vector<double> again(dx.size(), 1e300);
                tsl_upsample_backward_kernel(&a, g.data(), again.data());
                ASSERT_EQ(again, dx);

                // f32: the same results within float rounding.
                a.dtype = TSL_F32;
                std::vector<float> xf(x.begin(), x.end()), gf(g.begin(), g.end());
                std::vector<float> yf(y.size(), NAN), dxf(dx.size(), NAN);
                tsl_upsample_forward_kernel(&a, xf.data(), yf.data());
                tsl_upsample_backward_kernel(&a, gf.data(), dxf.data());
                for (size_t i = 0; i < y.size(); i++)
                    ASSERT_NEAR(yf[i], y[i], 1e-6 * (1 + std::fabs(y[i]))) << "f32 y[" << i << "]";
                for (size_t i = 0; i < dx.size(); i++)
                    ASSERT_NEAR(dxf[i], dx[i], 1e-5 * (1 + std::fabs(dx[i])))
                        << "f32 dx[" << i << "]";
            }
    EXPECT_EQ(cases, 24);
}

// The CUDA backward of pools whose windows are disjoint (tsl_pool_backward_disjoint(), one call
// per output into a zeroed dx, in any order) gives the CPU backward's bits: max pooling from
// indices and from x (NaNs, ties, windows of padding only), average pooling with both divisors,
// f32 and f64, plain and channels-last, -0.0 gradients; geometries where windows overlap or
// leave the tile are refused.
TEST(PoolKernel, DisjointWindowsBackwardGivesTheGeneralBits)
{
    std::mt19937_64 rng(test_seed() + 71);
    std::uniform_int_distribution<int> level(-3, 3), pick(0, 30);
    std::normal_distribution<double> grad(0, 1);
    struct C {
        int spatial;
        std::vector<int64_t> in;
        int64_t k, s, pad;
    };
    const C cases[] = {{2, {8, 8}, 2, 2, 0}, {2, {7, 9}, 2, 2, 0}, {3, {6, 5, 7}, 2, 2, 0},
                       {2, {9, 9}, 3, 3, 1}, {1, {13}, 3, 4, 1},   {3, {5, 6, 4}, 2, 3, 1},
                       {2, {4, 6}, 3, 3, 2}};
    int compared = 0;
    for (const C &c : cases)
        for (int kind : {0, 1, 2, 3}) /* max from indices, max from x, average excl / incl pad */
            for (int dtype : {TSL_F64, TSL_F32})
                for (int last : {0, 1}) {
                    SCOPED_TRACE(std::to_string(c.spatial) + "-D, k " + std::to_string(c.k) +
                                 ", s " + std::to_string(c.s) + ", pad " + std::to_string(c.pad) +
                                 ", kind " + std::to_string(kind) +
                                 (dtype == TSL_F32 ? ", f32" : "") +
                                 (last ? ", channels-last" : ""));
                    P p = make_planes(c.spatial, kind < 2 ? TSL_POOL_MAX : TSL_POOL_AVG, kind == 3,
                                      c.in, c.k, c.s, c.pad, dtype, last);
                    tsl_pool_geom g = tsl_pool_geometry(&p.a);
                    ASSERT_TRUE(tsl_pool_windows_disjoint(&g));
                    size_t es = dtype == TSL_F32 ? 4 : 8, is = p.a.index_dtype == TSL_I32 ? 4 : 1;
                    size_t nx = (size_t)(p.a.planes * p.in_plane),
                           ny = (size_t)(p.a.planes * p.out_plane);
                    std::vector<unsigned char> x(nx * es), dy(ny * es);
                    auto put = [&](std::vector<unsigned char> &b, size_t i, double v) {
                        dtype == TSL_F32 ? (void)(((float *)b.data())[i] = (float)v)
                                         : (void)(((double *)b.data())[i] = v);
                    };
                    for (size_t i = 0; i < nx; i++)
                        put(x, i, pick(rng) == 0 ? NAN : 0.5 * level(rng));
                    for (size_t i = 0; i < ny; i++)
                        put(dy, i, pick(rng) == 0 ? -0.0 : grad(rng));
                    std::vector<unsigned char> y(ny * es), ix(ny * is, 0xee);
                    std::vector<unsigned char> want(nx * es, 7), got(nx * es, 0);
                    if (kind == 0) {
                        tsl_pool_forward_index_kernel(&p.a, x.data(), y.data(), ix.data());
                        tsl_pool_backward_index_kernel(&p.a, ix.data(), dy.data(), want.data());
                    } else {
                        tsl_pool_backward_kernel(&p.a, x.data(), dy.data(), want.data());
                    }
                    // Outputs visited backwards: no order is assumed.
                    for (int64_t m = (int64_t)ny - 1; m >= 0; m--)
                        tsl_pool_backward_disjoint(&p.a, &g, kind == 1 ? x.data() : nullptr,
                                                   kind == 0 ? ix.data() : nullptr, dy.data(),
                                                   got.data(), m);
                    ASSERT_EQ(0, memcmp(want.data(), got.data(), want.size())) << "dx bits";
                    compared++;
                }
    EXPECT_EQ(compared, 7 * 4 * 2 * 2);

    // Overlapping windows, and windows that reach past the tile, take the general backward.
    P overlap = make(2, TSL_POOL_MAX, 0, 1, {8, 8}, 3, 2, 1);
    tsl_pool_geom g = tsl_pool_geometry(&overlap.a);
    EXPECT_FALSE(tsl_pool_windows_disjoint(&g));
    P tile = make(2, TSL_POOL_MAX, 0, 1, {8, 8}, 2, 2, 0);
    tile.a.global_in[0] = tile.a.global_in[1] = 16;
    tile.a.in_origin[0] = 1; /* outputs 0..3 read rows 0..7, the tile holds rows 1..8 */
    g = tsl_pool_geometry(&tile.a);
    EXPECT_FALSE(tsl_pool_windows_disjoint(&g));
    tile.a.in_origin[0] = 0;
    g = tsl_pool_geometry(&tile.a);
    EXPECT_TRUE(tsl_pool_windows_disjoint(&g));
}
