// Convolution kernels (codelets/conv.c and conv_primitives.c, oneDNN) against a naive reference
// written here (double accumulation) and central finite differences of L = sum(y * r), on random
// problems: 1-D/2-D/3-D, odd sizes, stride 1/2, dilation 1/2, padding 0/1/2, kernels 1/3/5,
// groups 1, 2 and depthwise, batch 1 and more. Outputs are poisoned before each run.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <algorithm>
#include <random>
#include <string>
#include <vector>

extern "C" {
#include "codelets/conv.h"
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
        {1, 2, 3, 4, 1, {17}, 3, 1, 1, 1},
        {1, 1, 4, 4, 4, {16}, 5, 2, 2, 1},
        {1, 3, 2, 6, 2, {11}, 3, 2, 0, 2},
        {2, 2, 3, 5, 1, {9, 7}, 3, 1, 1, 1},
        {2, 1, 4, 2, 2, {8, 11}, 5, 2, 2, 1},
        {2, 2, 6, 6, 6, {7, 9}, 3, 1, 2, 2},
        {2, 1, 2, 3, 1, {5, 6}, 1, 2, 0, 1},
        {3, 2, 2, 3, 1, {5, 6, 7}, 3, 2, 1, 1},
        {3, 1, 4, 4, 4, {6, 5, 5}, 3, 1, 2, 2},
        {3, 1, 3, 2, 1, {4, 4, 5}, 1, 1, 0, 1},
        // kernel 1 over one position: one GEMM (a linear layer on feature tiles)
        {1, 5, 7, 3, 1, {1}, 1, 1, 0, 1},
        {2, 3, 4, 6, 1, {1, 1}, 1, 2, 0, 1},
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

namespace
{

// Index of (n, c, position p[]) in an (N, C, extent...) array, plain or channels-last.
int64_t at(const tsl_conv_args &a, const int64_t *extent, int64_t n, int64_t c, const int64_t *p,
           bool cl)
{
    int64_t pos = 0, vol = 1;
    for (int d = 0; d < a.spatial; d++) {
        pos = pos * extent[d] + p[d];
        vol *= extent[d];
    }
    int64_t ch = a.in_channels; // windows hold inputs
    return cl ? (n * vol + pos) * ch + c : (n * ch + c) * vol + pos;
}

// Calls f(n, c, position in box coordinates, position in global coordinates) over a box.
template <typename F>
void for_box(const tsl_conv_args &a, int64_t channels, const tsl_conv_box &b, F f)
{
    int64_t vol = 1;
    for (int d = 0; d < a.spatial; d++)
        vol *= b.size[d];
    for (int64_t n = 0; n < a.samples; n++)
        for (int64_t c = 0; c < channels; c++)
            for (int64_t i = 0; i < vol; i++) {
                int64_t local[3] = {0, 0, 0}, global[3] = {0, 0, 0}, rest = i;
                for (int d = a.spatial - 1; d >= 0; d--) {
                    local[d] = rest % b.size[d];
                    rest /= b.size[d];
                    global[d] = b.lo[d] + local[d];
                }
                f(n, c, local, global);
            }
}

// Even-ish split of [0, size) into `parts` pieces, the first ones one larger.
std::vector<std::pair<int64_t, int64_t>> split(int64_t size, int64_t parts)
{
    std::vector<std::pair<int64_t, int64_t>> out;
    int64_t lo = 0;
    for (int64_t k = 0; k < parts; k++) {
        int64_t len = size / parts + (k < size % parts ? 1 : 0);
        out.push_back({lo, len});
        lo += len;
    }
    return out;
}

// All boxes of a grid of `parts[d]` pieces over `size[d]`.
std::vector<tsl_conv_box> grid_boxes(int sp, const int64_t *size, const int64_t *parts)
{
    std::vector<tsl_conv_box> boxes(1);
    for (int d = 0; d < sp; d++) {
        std::vector<tsl_conv_box> next;
        for (const tsl_conv_box &b : boxes)
            for (auto [lo, len] : split(size[d], parts[d])) {
                tsl_conv_box nb = b;
                nb.lo[d] = lo;
                nb.size[d] = len;
                next.push_back(nb);
            }
        boxes = next;
    }
    return boxes;
}

// Run a codelet's CPU function on plain pointers, as StarPU would (vector interfaces, packed
// arguments).
void run_codelet(struct starpu_codelet &cl, const tsl_conv_task_args &args,
                 const std::vector<const void *> &ptrs)
{
    std::vector<starpu_vector_interface> ifs(ptrs.size());
    std::vector<void *> buffers(ptrs.size());
    for (size_t i = 0; i < ptrs.size(); i++) {
        std::memset(&ifs[i], 0, sizeof ifs[i]);
        ifs[i].ptr = (uintptr_t)ptrs[i];
        buffers[i] = &ifs[i];
    }
    void *packed = nullptr;
    size_t size = 0;
    starpu_codelet_pack_args(&packed, &size, STARPU_VALUE, &args, sizeof args, 0);
    cl.cpu_funcs[0](buffers.data(), packed);
    free(packed);
}

// Every element of got within tol (1 + |want|) of want; the first miss is reported.
template <typename G, typename W>
void expect_near_all(const std::vector<G> &got, const std::vector<W> &want, double tol,
                     const char *name)
{
    ASSERT_EQ(got.size(), want.size()) << name;
    for (size_t i = 0; i < want.size(); i++)
        ASSERT_NEAR(got[i], want[i], tol * (1 + std::fabs(want[i]))) << name << " " << i;
}

bool overlap(int sp, const tsl_conv_box &a, const tsl_conv_box &b, tsl_conv_box *out)
{
    for (int d = 0; d < sp; d++) {
        int64_t lo = std::max(a.lo[d], b.lo[d]);
        int64_t hi = std::min(a.lo[d] + a.size[d], b.lo[d] + b.size[d]);
        if (hi <= lo)
            return false;
        out->lo[d] = lo;
        out->size[d] = hi - lo;
    }
    return true;
}

} // namespace

// Spatial tiles: every output tile computed from its own input tile, halo slabs cut from the
// neighbouring input tiles and zeros at the global boundary gives the whole convolution's
// output; the window gradients scattered back to tiles and slabs and summed give the whole
// dx; the per-tile weight gradients sum to the whole dw and db. Input and output grids are
// chosen independently (uneven, and a tile's window may reach several neighbours deep).
TEST(ConvKernel, SpatialTilesWithHaloSlabsMatchTheWholeConvolution)
{
    std::mt19937_64 rng(20261124);
    struct Case {
        int spatial;
        int64_t n, cin, cout, groups;
        std::vector<int64_t> size;
        int64_t k, stride, pad, dil;
        std::vector<int64_t> in_tiles, out_tiles;
    };
    const Case cases[] = {
        {1, 2, 3, 4, 1, {23}, 3, 1, 1, 1, {3}, {3}},
        {1, 1, 4, 4, 4, {30}, 5, 2, 2, 1, {4}, {3}},
        {1, 2, 2, 3, 1, {19}, 3, 2, 0, 2, {5}, {2}},
        {2, 2, 3, 5, 1, {13, 11}, 3, 1, 1, 1, {2, 3}, {2, 3}},
        {2, 1, 4, 2, 2, {12, 14}, 5, 2, 2, 1, {3, 2}, {2, 2}},
        {2, 2, 6, 6, 6, {9, 10}, 3, 1, 2, 2, {2, 2}, {3, 2}},
        {2, 1, 2, 3, 1, {8, 9}, 1, 1, 0, 1, {2, 2}, {2, 2}},
        {3, 1, 2, 3, 1, {7, 8, 9}, 3, 2, 1, 1, {2, 2, 2}, {2, 2, 2}},
        {3, 2, 4, 4, 4, {6, 7, 6}, 3, 1, 2, 2, {2, 3, 2}, {2, 2, 2}},
    };
    // Chunk sizes: the default (one chunk for these sizes), one output row per chunk, and a
    // few rows per chunk (chunks of uneven sizes, windows sharing rows).
    for (size_t cap : {(size_t)0, (size_t)1, (size_t)96})
        for (const Case &c : cases)
            for (int cl = 0; cl < 2; cl++) {
                tsl_conv_set_chunk_floats(cap);
                SCOPED_TRACE(std::to_string(c.spatial) + "-D case, channels-last " +
                             std::to_string(cl) + ", chunk floats " + std::to_string(cap));
                Problem p = make(c.spatial, c.n, c.cin, c.cout, c.groups, c.size, c.k, c.stride,
                                 c.pad, c.dil);
                p.a.has_bias = 1;
                p.a.channels_last = cl;
                auto x = randf(rng, p.x_size), w = randf(rng, p.w_size), dy = randf(rng, p.y_size);
                auto b = randf(rng, (size_t)c.cout);
                std::vector<float> y(p.y_size), dx(p.x_size), dw(p.w_size), db((size_t)c.cout);
                tsl_conv_forward_kernel(&p.a, x.data(), w.data(), b.data(), y.data());
                tsl_conv_backward_data_kernel(&p.a, dy.data(), w.data(), dx.data());
                tsl_conv_backward_weights_kernel(&p.a, x.data(), dy.data(), dw.data(), db.data());

                std::vector<double> dx_sum(p.x_size, 0), dw_sum(p.w_size, 0), db_sum(c.cout, 0);
                auto in_boxes = grid_boxes(c.spatial, p.a.in_size, c.in_tiles.data());
                auto out_boxes = grid_boxes(c.spatial, p.a.out_size, c.out_tiles.data());
                tsl_conv_args out_shape = p.a; // indexes output arrays (C = out channels)
                out_shape.in_channels = c.cout;
                for (const tsl_conv_box &ob : out_boxes) {
                    tsl_conv_window win{};
                    tsl_conv_args a = p.a;
                    for (int d = 0; d < c.spatial; d++) {
                        int64_t span = c.dil * (c.k - 1) + 1;
                        win.global[d] = p.a.in_size[d];
                        win.window.lo[d] = ob.lo[d] * c.stride - c.pad;
                        win.window.size[d] = (ob.size[d] - 1) * c.stride + span;
                        a.in_size[d] = win.window.size[d];
                        a.out_size[d] = ob.size[d];
                        a.padding[d] = 0;
                    }
                    // The own tile: the input tile overlapping the window most; the others that
                    // the window reaches give slabs.
                    size_t own = 0;
                    int64_t best = -1;
                    for (size_t t = 0; t < in_boxes.size(); t++) {
                        tsl_conv_box o;
                        int64_t v = 0;
                        if (overlap(c.spatial, in_boxes[t], win.window, &o)) {
                            v = 1;
                            for (int d = 0; d < c.spatial; d++)
                                v *= o.size[d];
                        }
                        if (v > best) {
                            best = v;
                            own = t;
                        }
                    }
                    win.tile = in_boxes[own];
                    for (size_t t = 0; t < in_boxes.size(); t++) {
                        tsl_conv_box o;
                        if (t != own && overlap(c.spatial, in_boxes[t], win.window, &o))
                            win.slab[win.nslabs++] = o;
                    }
                    // Cut the tile and the slabs out of x (in the layout under test).
                    auto cut = [&](const std::vector<float> &whole, const tsl_conv_box &box) {
                        size_t vol = (size_t)(c.n * c.cin);
                        for (int d = 0; d < c.spatial; d++)
                            vol *= (size_t)box.size[d];
                        std::vector<float> part(vol);
                        for_box(a, c.cin, box,
                                [&](int64_t n, int64_t ch, const int64_t *l, const int64_t *g) {
                                    part[at(a, box.size, n, ch, l, cl)] =
                                        whole[at(p.a, p.a.in_size, n, ch, g, cl)];
                                });
                        return part;
                    };
                    std::vector<float> tile = cut(x, win.tile);
                    std::vector<std::vector<float>> slabs, dslabs;
                    std::vector<const float *> slab_ptrs;
                    std::vector<float *> dslab_ptrs;
                    for (int k = 0; k < win.nslabs; k++) {
                        slabs.push_back(cut(x, win.slab[k]));
                        dslabs.push_back(std::vector<float>(slabs.back().size(), NAN));
                    }
                    for (int k = 0; k < win.nslabs; k++) {
                        slab_ptrs.push_back(slabs[k].data());
                        dslab_ptrs.push_back(dslabs[k].data());
                    }
                    // Output tile and its dy.
                    size_t ovol = (size_t)(c.n * c.cout);
                    for (int d = 0; d < c.spatial; d++)
                        ovol *= (size_t)ob.size[d];
                    std::vector<float> yt(ovol, NAN), dyt(ovol);
                    for_box(out_shape, c.cout, ob,
                            [&](int64_t n, int64_t ch, const int64_t *l, const int64_t *g) {
                                dyt[at(out_shape, ob.size, n, ch, l, cl)] =
                                    dy[at(out_shape, p.a.out_size, n, ch, g, cl)];
                            });
                    tsl_conv_window_forward(&a, &win, tile.data(), slab_ptrs.data(), w.data(),
                                            b.data(), yt.data());
                    for_box(out_shape, c.cout, ob,
                            [&](int64_t n, int64_t ch, const int64_t *l, const int64_t *g) {
                                float want = y[at(out_shape, p.a.out_size, n, ch, g, cl)];
                                float got = yt[at(out_shape, ob.size, n, ch, l, cl)];
                                ASSERT_NEAR(got, want, 1e-5 * (1 + std::fabs(want)));
                            });
                    // The forward in two parts of the output tile, cut along the last dimension,
                    // each written at its offset in the tile (as the lowering's interior and border
                    // parts are): parts that are not runs of the tile go through a chunk buffer.
                    const int last = c.spatial - 1;
                    if (ob.size[last] >= 2) {
                        std::vector<float> yp(ovol, NAN);
                        const int64_t cut = ob.size[last] / 2;
                        for (int h = 0; h < 2; h++) {
                            tsl_conv_args pa = a;
                            tsl_conv_window pw = win;
                            int64_t off[3] = {0, 0, 0};
                            off[last] = h ? cut : 0;
                            pa.out_size[last] = h ? ob.size[last] - cut : cut;
                            pw.window.lo[last] = win.window.lo[last] + off[last] * c.stride;
                            pw.window.size[last] =
                                (pa.out_size[last] - 1) * c.stride + c.dil * (c.k - 1) + 1;
                            pa.in_size[last] = pw.window.size[last];
                            tsl_conv_window_forward_part(&pa, &pw, tile.data(), slab_ptrs.data(),
                                                         w.data(), b.data(), off, a.out_size,
                                                         yp.data());
                        }
                        for_box(out_shape, c.cout, ob,
                                [&](int64_t n, int64_t ch, const int64_t *l, const int64_t *g) {
                                    float want = y[at(out_shape, p.a.out_size, n, ch, g, cl)];
                                    float got = yp[at(out_shape, ob.size, n, ch, l, cl)];
                                    ASSERT_NEAR(got, want, 1e-5 * (1 + std::fabs(want))) << "part";
                                });
                    }
                    std::vector<float> dtile(tile.size(), NAN), dwt(p.w_size, NAN),
                        dbt(c.cout, NAN);
                    tsl_conv_window_backward_data(&a, &win, dyt.data(), w.data(), dtile.data(),
                                                  dslab_ptrs.data());
                    tsl_conv_window_backward_weights(&a, &win, tile.data(), slab_ptrs.data(),
                                                     dyt.data(), dwt.data(), dbt.data());
                    // The codelets route a windowed task to the same kernels, with the halo
                    // buffers after x (or dx): same bits.
                    tsl_conv_task_args targs{};
                    targs.conv = a;
                    targs.windowed = 1;
                    targs.window = win;
                    std::vector<float> yc(ovol, NAN), dtc(tile.size(), NAN), dwc(p.w_size, NAN),
                        dbc(c.cout, NAN);
                    std::vector<std::vector<float>> dsc;
                    std::vector<const void *> fwd = {tile.data()},
                                              bd = {dyt.data(), w.data(), dtc.data()},
                                              bw = {tile.data()};
                    for (int k = 0; k < win.nslabs; k++) {
                        fwd.push_back(slabs[k].data());
                        bw.push_back(slabs[k].data());
                        dsc.push_back(std::vector<float>(slabs[k].size(), NAN));
                    }
                    for (int k = 0; k < win.nslabs; k++)
                        bd.push_back(dsc[k].data());
                    fwd.insert(fwd.end(), {w.data(), b.data(), yc.data()});
                    bw.insert(bw.end(), {dyt.data(), dwc.data(), dbc.data()});
                    run_codelet(tsl_cl_conv_forward, targs, fwd);
                    run_codelet(tsl_cl_conv_backward_data, targs, bd);
                    run_codelet(tsl_cl_conv_backward_weights, targs, bw);
                    EXPECT_EQ(std::memcmp(yc.data(), yt.data(), ovol * sizeof(float)), 0);
                    EXPECT_EQ(std::memcmp(dtc.data(), dtile.data(), dtile.size() * sizeof(float)),
                              0);
                    for (int k = 0; k < win.nslabs; k++)
                        EXPECT_EQ(std::memcmp(dsc[k].data(), dslabs[k].data(),
                                              dsc[k].size() * sizeof(float)),
                                  0);
                    EXPECT_EQ(std::memcmp(dwc.data(), dwt.data(), dwt.size() * sizeof(float)), 0);
                    EXPECT_EQ(std::memcmp(dbc.data(), dbt.data(), dbt.size() * sizeof(float)), 0);
                    auto add_back = [&](const std::vector<float> &part, const tsl_conv_box &box) {
                        for_box(a, c.cin, box,
                                [&](int64_t n, int64_t ch, const int64_t *l, const int64_t *g) {
                                    dx_sum[at(p.a, p.a.in_size, n, ch, g, cl)] +=
                                        part[at(a, box.size, n, ch, l, cl)];
                                });
                    };
                    add_back(dtile, win.tile);
                    for (int k = 0; k < win.nslabs; k++)
                        add_back(dslabs[k], win.slab[k]);
                    for (size_t i = 0; i < dw_sum.size(); i++)
                        dw_sum[i] += dwt[i];
                    for (int64_t o = 0; o < c.cout; o++)
                        db_sum[o] += dbt[o];
                }
                expect_near_all(dx_sum, dx, 1e-5, "dx");
                expect_near_all(dw_sum, dw, 1e-4, "dw");
                expect_near_all(db_sum, db, 1e-4, "db");
            }
    tsl_conv_set_chunk_floats(0);
}

// A window that reaches a neighbour whose slab is missing is a codelet error, not garbage.
// The weight gradient of a strided 1x1 convolution over fewer than 16 input channels on
// channels-last tiles of 48^2 and more (ResNet's shortcut under filters=2): oneDNN 2.6.3's
// jit_1x1 AVX-512 implementation writes past its scratchpad there (the heap was corrupted and
// the process aborted); tessel takes the next implementation. Against a direct sum, repeated.
TEST(ConvKernel, StridedOneByOneWeightGradientOnFewChannels)
{
    std::mt19937_64 rng(91);
    for (int64_t cin : {3, 8, 12})
        for (int64_t size : {48, 64, 96}) {
            SCOPED_TRACE(std::to_string(cin) + " channels, " + std::to_string(size) + "^2");
            const int64_t n = 2, cout = 16, out = size / 2;
            Problem p = make(2, n, cin, cout, 1, {size, size}, 1, 2, 0, 1);
            p.a.channels_last = 1;
            std::vector<float> x = randf(rng, p.x_size), dy = randf(rng, p.y_size);
            for (int rep = 0; rep < 3; rep++) {
                std::vector<float> dw(p.w_size, 1e30f), db;
                tsl_conv_backward_weights_kernel(&p.a, x.data(), dy.data(), dw.data(), nullptr);
                double worst = 0;
                for (int64_t o = 0; o < cout; o++)
                    for (int64_t c = 0; c < cin; c++) {
                        double want = 0;
                        for (int64_t s = 0; s < n; s++)
                            for (int64_t i = 0; i < out; i++)
                                for (int64_t j = 0; j < out; j++)
                                    want += (double)dy[((s * out + i) * out + j) * cout + o] *
                                            x[((s * size + 2 * i) * size + 2 * j) * cin + c];
                        worst = std::max(worst, std::fabs(dw[o * cin + c] - want));
                    }
                ASSERT_LT(worst, 1e-3) << "repetition " << rep;
            }
        }
}

TEST(ConvKernelDeathTest, MissingHaloSlabAborts)
{
    Problem p = make(1, 1, 2, 2, 1, {10}, 3, 1, 1, 1);
    tsl_conv_args a = p.a;
    tsl_conv_window win{};
    win.global[0] = 10;
    win.tile = {{0, 0, 0}, {5, 1, 1}};
    win.window = {{-1, 0, 0}, {7, 1, 1}}; // output [0, 5) needs inputs [-1, 6): 5 is missing
    a.in_size[0] = 7;
    a.out_size[0] = 5;
    a.padding[0] = 0;
    std::vector<float> tile(10, 1.0f), w(p.w_size, 1.0f), y(10);
    EXPECT_DEATH(
        tsl_conv_window_forward(&a, &win, tile.data(), nullptr, w.data(), nullptr, y.data()),
        "halo slabs are missing");
}

// A convolution over a channel concatenation run part by part: each part through its run of
// the weights' input channels (w_in_offset of w_in_channels), the later parts adding to y,
// each part's dx from its run, and the parts' weight gradients filling their runs of one dw,
// equal the convolution of the concatenated input. Whole tiles and windows (halo-less, the
// padding in the window) in chunks of every size, both layouts, 1-D to 3-D, three parts.
TEST(ConvKernel, RunsOfInputChannelsAddUpToTheConcatenation)
{
    std::mt19937_64 rng(20261126);
    struct Case {
        int spatial;
        int64_t n, cout;
        std::vector<int64_t> parts, size;
        int64_t k, stride, pad;
    };
    const Case cases[] = {
        {1, 2, 3, {2, 3}, {17}, 3, 1, 1},      {2, 1, 4, {3, 1, 2}, {9, 8}, 3, 2, 1},
        {3, 1, 2, {2, 2}, {5, 6, 4}, 3, 1, 1}, {2, 2, 3, {1, 2}, {7, 6}, 1, 1, 0},
        {1, 4, 3, {2, 3, 1}, {1}, 1, 1, 0}, // one GEMM per part, runs as column offsets
    };
    for (size_t cap : {(size_t)0, (size_t)1, (size_t)96})
        for (const Case &c : cases)
            for (int cl = 0; cl < 2; cl++) {
                tsl_conv_set_chunk_floats(cap);
                SCOPED_TRACE(std::to_string(c.spatial) + "-D case, channels-last " +
                             std::to_string(cl) + ", chunk floats " + std::to_string(cap));
                int64_t cin = 0;
                for (int64_t ch : c.parts)
                    cin += ch;
                Problem p = make(c.spatial, c.n, cin, c.cout, 1, c.size, c.k, c.stride, c.pad, 1);
                p.a.has_bias = 1;
                p.a.channels_last = cl;
                auto x = randf(rng, p.x_size), w = randf(rng, p.w_size), dy = randf(rng, p.y_size);
                auto b = randf(rng, (size_t)c.cout);
                std::vector<float> y(p.y_size), dx(p.x_size), dw(p.w_size), db((size_t)c.cout);
                tsl_conv_forward_kernel(&p.a, x.data(), w.data(), b.data(), y.data());
                tsl_conv_backward_data_kernel(&p.a, dy.data(), w.data(), dx.data());
                tsl_conv_backward_weights_kernel(&p.a, x.data(), dy.data(), dw.data(), db.data());
                // The window of the whole output: the padding becomes zeros of the window.
                tsl_conv_window win{};
                tsl_conv_args wa = p.a;
                for (int d = 0; d < c.spatial; d++) {
                    win.global[d] = p.a.in_size[d];
                    win.window.lo[d] = -c.pad;
                    win.window.size[d] = (p.a.out_size[d] - 1) * c.stride + c.k;
                    win.tile.size[d] = p.a.in_size[d];
                    wa.in_size[d] = win.window.size[d];
                    wa.padding[d] = 0;
                }
                for (int windowed = 0; windowed < 2; windowed++) {
                    SCOPED_TRACE(windowed ? "window" : "whole tile");
                    std::vector<float> yp(p.y_size, NAN), dwp(p.w_size, NAN),
                        dbp((size_t)c.cout, NAN);
                    int64_t at0 = 0;
                    for (size_t k = 0; k < c.parts.size(); k++) {
                        const int64_t ch = c.parts[k];
                        tsl_conv_args a = windowed ? wa : p.a;
                        a.in_channels = ch;
                        a.w_in_channels = cin;
                        a.w_in_offset = at0;
                        a.accumulate = k > 0;
                        a.has_bias = k == 0;
                        // This part's channels of x, and its gradient.
                        std::vector<float> xk((size_t)(c.n * ch * p.in_pos)), dxk(xk.size(), NAN);
                        for (int64_t n = 0; n < c.n; n++)
                            for (int64_t q = 0; q < ch; q++)
                                for (int64_t i = 0; i < p.in_pos; i++)
                                    xk[(size_t)(cl ? (n * p.in_pos + i) * ch + q
                                                   : (n * ch + q) * p.in_pos + i)] =
                                        x[(size_t)(cl ? (n * p.in_pos + i) * cin + at0 + q
                                                      : (n * cin + at0 + q) * p.in_pos + i)];
                        float *dbk = k == 0 ? dbp.data() : nullptr;
                        if (windowed) {
                            tsl_conv_window_forward(&a, &win, xk.data(), nullptr, w.data(),
                                                    b.data(), yp.data());
                            tsl_conv_window_backward_data(&a, &win, dy.data(), w.data(), dxk.data(),
                                                          nullptr);
                            tsl_conv_window_backward_weights(&a, &win, xk.data(), nullptr,
                                                             dy.data(), dwp.data(), dbk);
                        } else {
                            tsl_conv_forward_kernel(&a, xk.data(), w.data(), b.data(), yp.data());
                            tsl_conv_backward_data_kernel(&a, dy.data(), w.data(), dxk.data());
                            tsl_conv_backward_weights_kernel(&a, xk.data(), dy.data(), dwp.data(),
                                                             dbk);
                        }
                        for (int64_t n = 0; n < c.n; n++)
                            for (int64_t q = 0; q < ch; q++)
                                for (int64_t i = 0; i < p.in_pos; i++) {
                                    float want =
                                        dx[(size_t)(cl ? (n * p.in_pos + i) * cin + at0 + q
                                                       : (n * cin + at0 + q) * p.in_pos + i)];
                                    float got = dxk[(size_t)(cl ? (n * p.in_pos + i) * ch + q
                                                                : (n * ch + q) * p.in_pos + i)];
                                    ASSERT_NEAR(got, want, 1e-5 * (1 + std::fabs(want)))
                                        << "dx of part " << k;
                                }
                        at0 += ch;
                    }
                    expect_near_all(yp, y, 1e-5, "y");
                    expect_near_all(dwp, dw, 1e-4, "dw");
                    expect_near_all(dbp, db, 1e-4, "db");
                }
            }
    tsl_conv_set_chunk_floats(0);
}
