// CUDA pooling and upsampling codelets against the CPU kernels (codelets/pool_kernels.c): max
// and average pooling (padding counted or not, floor and ceil mode, 1-D to 3-D, plain and
// channels-last, tiles of a spatially cut tensor), with and without indices, nearest and linear
// upsampling, forward and backward, f32 and f64, into poisoned outputs. All exact: the forward
// threads share the CPU's per-output functions, and the backward gathers each input's sum in
// the CPU's order with the CPU's rounding. Ties and NaNs in the inputs check the choice of a
// window's maximum.
#include <cstring>

#include "cuda_test.h"

extern "C" {
#include "codelets/pool.h"
#include "tessel/ops.h"
}

namespace
{
using namespace tsltest;

int64_t plane_of(const int64_t *size, int spatial)
{
    int64_t n = 1;
    for (int d = 0; d < spatial; d++)
        n *= size[d];
    return n;
}

// Pooling arguments: PyTorch's output size (floor, or ceil mode: one more window where the last
// would start inside the input), planes of `channels` channels when channels-last.
tsl_pool_args pool_args(int dtype, int kind, int incl, bool channels_last, std::vector<int64_t> in,
                        int64_t k, int64_t s, int64_t pad, bool ceil = false)
{
    tsl_pool_args a;
    std::memset(&a, 0, sizeof a);
    a.dtype = dtype;
    a.spatial = (int32_t)in.size();
    a.kind = kind;
    a.count_include_pad = incl;
    a.channels_last = channels_last ? 1 : 0;
    a.channels = 3;
    a.planes = 2 * 3;
    a.index_dtype = TSL_I32;
    for (size_t d = 0; d < in.size(); d++) {
        a.in_size[d] = in[d];
        a.kernel[d] = k;
        a.stride[d] = s;
        a.padding[d] = pad;
        a.out_size[d] = (ceil ? (in[d] + 2 * pad - k + s - 1) / s : (in[d] + 2 * pad - k) / s) + 1;
        if (ceil && (a.out_size[d] - 1) * s >= in[d] + pad)
            a.out_size[d]--;
    }
    return a;
}

// x with ties (multiples of 1/4) and, for max pooling, a few NaNs.
template <typename T> std::vector<T> pool_input(size_t n, bool nans, uint64_t salt)
{
    std::vector<T> x = random_values<T>(n, salt, (T)-2, (T)2);
    for (size_t i = 0; i < n; i++) {
        x[i] = std::round(x[i] * 4) / 4;
        if (nans && i % 37 == 5)
            x[i] = std::numeric_limits<T>::quiet_NaN();
    }
    return x;
}

template <typename T> void check_pool(const tsl_pool_args &a, const char *what)
{
    const size_t nx = (size_t)(a.planes * plane_of(a.in_size, a.spatial));
    const size_t ny = (size_t)(a.planes * plane_of(a.out_size, a.spatial));
    const bool max = a.kind == TSL_POOL_MAX;
    std::vector<T> x = pool_input<T>(nx, max, 51), dy = random_values<T>(ny, 52, (T)-1, (T)1);

    std::vector<T> y(ny), yg = poisoned<T>(ny), xg = x, dyg = dy;
    tsl_pool_forward_kernel(&a, x.data(), y.data());
    run_on_cuda(tsl_cl_pool_forward, a, {cuda_buf(xg, STARPU_R), cuda_buf(yg, STARPU_W)});
    EXPECT_EQ(worst_error(yg, y), 0.0) << what << ": forward";

    std::vector<T> dx(nx), dxg = poisoned<T>(nx);
    tsl_pool_backward_kernel(&a, x.data(), dy.data(), dx.data());
    run_on_cuda(tsl_cl_pool_backward, a,
                {cuda_buf(xg, STARPU_R), cuda_buf(dyg, STARPU_R), cuda_buf(dxg, STARPU_W)});
    EXPECT_EQ(worst_error(dxg, dx), 0.0) << what << ": backward";
    if (!max) { /* average pooling's backward without x: the same bits */
        std::vector<T> dxa = poisoned<T>(nx);
        run_on_cuda(tsl_cl_pool_backward_avg, a,
                    {cuda_buf(dyg, STARPU_R), cuda_buf(dxa, STARPU_W)});
        EXPECT_EQ(worst_error(dxa, dx), 0.0) << what << ": backward without x";
        return;
    }

    for (int32_t index_dtype : {(int32_t)TSL_U8, (int32_t)TSL_I32}) {
        tsl_pool_args b = a;
        b.index_dtype = index_dtype;
        const size_t isize = index_dtype == TSL_U8 ? 1 : 4;
        std::vector<uint8_t> ix(ny * isize), ixg(ny * isize, 0xa5);
        std::vector<T> y2(ny), y2g = poisoned<T>(ny);
        tsl_pool_forward_index_kernel(&b, x.data(), y2.data(), ix.data());
        CudaBuf ixbuf{ixg.data(), ny, isize, STARPU_W};
        run_on_cuda(tsl_cl_pool_forward_index, b,
                    {cuda_buf(xg, STARPU_R), cuda_buf(y2g, STARPU_W), ixbuf});
        EXPECT_EQ(worst_error(y2g, y2), 0.0) << what << ": forward with indices";
        EXPECT_EQ(ixg, ix) << what << ": indices, " << isize << " bytes";

        std::vector<T> dx2(nx), dx2g = poisoned<T>(nx);
        tsl_pool_backward_index_kernel(&b, ix.data(), dy.data(), dx2.data());
        CudaBuf ixin{ix.data(), ny, isize, STARPU_R};
        run_on_cuda(tsl_cl_pool_backward_index, b,
                    {ixin, cuda_buf(dyg, STARPU_R), cuda_buf(dx2g, STARPU_W)});
        EXPECT_EQ(worst_error(dx2g, dx2), 0.0) << what << ": backward from indices";
    }
}

template <typename T> void check_pools()
{
    const int dt = dtype_of<T>();
    for (bool cl : {false, true})
        for (int kind : {(int)TSL_POOL_MAX, (int)TSL_POOL_AVG})
            for (int incl : {0, 1}) {
                if (kind == TSL_POOL_MAX && incl)
                    continue;
                check_pool<T>(pool_args(dt, kind, incl, cl, {13, 11}, 3, 2, 1), "2-D 3x3 s2 p1");
                check_pool<T>(pool_args(dt, kind, incl, cl, {14, 10}, 2, 2, 0), "2-D 2x2 s2");
                // disjoint windows (the backward's scatter path): padding, uncovered rows
                check_pool<T>(pool_args(dt, kind, incl, cl, {11, 10}, 3, 3, 1), "2-D 3x3 s3 p1");
                check_pool<T>(pool_args(dt, kind, incl, cl, {7, 6, 5}, 2, 2, 0), "3-D 2 s2");
                check_pool<T>(pool_args(dt, kind, incl, cl, {7, 6, 5}, 2, 1, 0), "3-D 2 s1");
                check_pool<T>(pool_args(dt, kind, incl, cl, {5, 7, 6}, 3, 2, 1), "3-D 3 s2 p1");
                check_pool<T>(pool_args(dt, kind, incl, cl, {29}, 4, 3, 2), "1-D 4 s3 p2");
                // ceil mode: a last window past the input's end
                check_pool<T>(pool_args(dt, kind, incl, cl, {12, 13}, 3, 2, 1, true),
                              "2-D 3x3 s2 p1 ceil");
                check_pool<T>(pool_args(dt, kind, incl, cl, {29}, 4, 3, 2, true),
                              "1-D 4 s3 p2 ceil");
            }
    // A tile of a spatially cut 1-D tensor of 40: outputs 5 to 10 of a 3 s2 p1 pooling, from
    // inputs 9 to 21.
    for (int kind : {(int)TSL_POOL_MAX, (int)TSL_POOL_AVG}) {
        tsl_pool_args a = pool_args(dt, kind, 1, false, {13}, 3, 2, 1);
        a.global_in[0] = 40;
        a.in_origin[0] = 9;
        a.out_origin[0] = 5;
        a.out_size[0] = 6;
        check_pool<T>(a, "a tile of a cut tensor");
    }
}

tsl_pool_args upsample_args(int dtype, int mode, bool channels_last, std::vector<int64_t> in,
                            std::vector<int64_t> scale)
{
    tsl_pool_args a;
    std::memset(&a, 0, sizeof a);
    a.dtype = dtype;
    a.spatial = (int32_t)in.size();
    a.kind = mode;
    a.channels_last = channels_last ? 1 : 0;
    a.channels = 3;
    a.planes = 2 * 3;
    for (size_t d = 0; d < in.size(); d++) {
        a.in_size[d] = in[d];
        a.kernel[d] = scale[d];
        a.out_size[d] = in[d] * scale[d];
    }
    return a;
}

// Upsampling to any size: scale 0, the sizes map (PyTorch's size=).
tsl_pool_args resize_args(int dtype, int mode, bool channels_last, std::vector<int64_t> in,
                          std::vector<int64_t> out)
{
    tsl_pool_args a =
        upsample_args(dtype, mode, channels_last, in, std::vector<int64_t>(in.size(), 0));
    for (size_t d = 0; d < in.size(); d++)
        a.out_size[d] = out[d];
    return a;
}

template <typename T> void check_upsample(const tsl_pool_args &a, const char *what)
{
    const size_t nx = (size_t)(a.planes * plane_of(a.in_size, a.spatial));
    const size_t ny = (size_t)(a.planes * plane_of(a.out_size, a.spatial));
    struct starpu_codelet &fwd =
        a.kind == TSL_UPSAMPLE_LINEAR ? tsl_cl_upsample_linear_forward : tsl_cl_upsample_forward;
    struct starpu_codelet &bwd =
        a.kind == TSL_UPSAMPLE_LINEAR ? tsl_cl_upsample_linear_backward : tsl_cl_upsample_backward;
    std::vector<T> x = random_values<T>(nx, 61, (T)-2, (T)2),
                   dy = random_values<T>(ny, 62, (T)-1, (T)1);
    std::vector<T> y(ny), yg = poisoned<T>(ny), xg = x, dyg = dy;
    tsl_upsample_forward_kernel(&a, x.data(), y.data());
    run_on_cuda(fwd, a, {cuda_buf(xg, STARPU_R), cuda_buf(yg, STARPU_W)});
    EXPECT_EQ(worst_error(yg, y), 0.0) << what << ": forward";
    std::vector<T> dx(nx), dxg = poisoned<T>(nx);
    tsl_upsample_backward_kernel(&a, dy.data(), dx.data());
    run_on_cuda(bwd, a, {cuda_buf(dyg, STARPU_R), cuda_buf(dxg, STARPU_W)});
    EXPECT_EQ(worst_error(dxg, dx), 0.0) << what << ": backward";
}

template <typename T> void check_upsamples()
{
    const int dt = dtype_of<T>();
    for (bool cl : {false, true})
        for (int mode : {(int)TSL_UPSAMPLE_NEAREST, (int)TSL_UPSAMPLE_LINEAR}) {
            check_upsample<T>(upsample_args(dt, mode, cl, {37}, {3}), "1-D x3");
            check_upsample<T>(upsample_args(dt, mode, cl, {9, 7}, {2, 3}), "2-D x2 x3");
            check_upsample<T>(upsample_args(dt, mode, cl, {5, 3, 4}, {2, 2, 2}), "3-D x2");
        }
    // A tile of a cut 1-D tensor of 20, scale 2: outputs 10 to 21 from inputs 4 to 11.
    for (int mode : {(int)TSL_UPSAMPLE_NEAREST, (int)TSL_UPSAMPLE_LINEAR}) {
        tsl_pool_args a = upsample_args(dt, mode, false, {8}, {2});
        a.global_in[0] = 20;
        a.in_origin[0] = 4;
        a.out_origin[0] = 10;
        a.out_size[0] = 12;
        check_upsample<T>(a, "a tile of a cut tensor");
    }
    for (bool cl : {false, true})
        for (int mode : {(int)TSL_UPSAMPLE_NEAREST, (int)TSL_UPSAMPLE_LINEAR}) {
            check_upsample<T>(resize_args(dt, mode, cl, {37}, {50}), "1-D 37 to 50");
            check_upsample<T>(resize_args(dt, mode, cl, {9, 7}, {13, 4}), "2-D 9x7 to 13x4");
            check_upsample<T>(resize_args(dt, mode, cl, {5, 3, 4}, {7, 8, 3}), "3-D to 7x8x3");
        }
    // A tile of a cut 1-D tensor of 20 resized to 33: outputs 10 to 21 from inputs 4 to 13.
    for (int mode : {(int)TSL_UPSAMPLE_NEAREST, (int)TSL_UPSAMPLE_LINEAR}) {
        tsl_pool_args a = resize_args(dt, mode, false, {10}, {12});
        a.global_in[0] = 20;
        a.global_out[0] = 33;
        a.in_origin[0] = 4;
        a.out_origin[0] = 10;
        check_upsample<T>(a, "a tile of a cut tensor resized");
    }
}

} // namespace

TEST(Cuda, PoolF32MatchesCpu)
{
    SKIP_WITHOUT_CUDA();
    check_pools<float>();
}

TEST(Cuda, PoolF64MatchesCpu)
{
    SKIP_WITHOUT_CUDA();
    check_pools<double>();
}

TEST(Cuda, UpsampleF32MatchesCpu)
{
    SKIP_WITHOUT_CUDA();
    check_upsamples<float>();
}

TEST(Cuda, UpsampleF64MatchesCpu)
{
    SKIP_WITHOUT_CUDA();
    check_upsamples<double>();
}

// Spatial tiles whose window is the tile itself (no halo slabs) run on CUDA workers: the
// window codelets against the kernels, f32 (the window codelets' dtype).
TEST(Cuda, PoolWindowsThatAreTheTileMatchCpu)
{
    SKIP_WITHOUT_CUDA();
    tsl_pool_task_args t;
    std::memset(&t, 0, sizeof t);
    t.pool = pool_args(TSL_F32, TSL_POOL_MAX, 0, true, {12, 10}, 2, 2, 0);
    t.pool.index_dtype = TSL_U8;
    for (int d = 0; d < 2; d++) {
        t.window.global[d] = t.pool.in_size[d];
        t.window.window.size[d] = t.window.tile.size[d] = t.pool.in_size[d];
    }
    t.window.window.size[2] = t.window.tile.size[2] = t.window.global[2] = 1;
    ASSERT_TRUE(tsl_pool_window_is_tile(&t));
    const tsl_pool_args &a = t.pool;
    const size_t nx = (size_t)(a.planes * 12 * 10), ny = (size_t)(a.planes * 6 * 5);
    std::vector<float> x = pool_input<float>(nx, true, 71),
                       dy = random_values<float>(ny, 72, -1.f, 1.f);
    std::vector<float> y(ny), yg = poisoned<float>(ny), dx(nx), dxg = poisoned<float>(nx);
    std::vector<uint8_t> ix(ny), ixg(ny, 0xa5);
    tsl_pool_forward_index_kernel(&a, x.data(), y.data(), ix.data());
    run_on_cuda(tsl_cl_pool_window_forward_index, t,
                {cuda_buf(x, STARPU_R), cuda_buf(yg, STARPU_W), cuda_buf(ixg, STARPU_W)});
    EXPECT_EQ(worst_error(yg, y), 0.0) << "window forward with indices";
    EXPECT_EQ(ixg, ix) << "window indices";
    tsl_pool_backward_index_kernel(&a, ix.data(), dy.data(), dx.data());
    run_on_cuda(tsl_cl_pool_window_backward_index, t,
                {cuda_buf(ix, STARPU_R), cuda_buf(dy, STARPU_R), cuda_buf(dxg, STARPU_W)});
    EXPECT_EQ(worst_error(dxg, dx), 0.0) << "window backward from indices";
    yg = poisoned<float>(ny);
    run_on_cuda(tsl_cl_pool_window_forward, t, {cuda_buf(x, STARPU_R), cuda_buf(yg, STARPU_W)});
    EXPECT_EQ(worst_error(yg, y), 0.0) << "window forward";
    tsl_pool_backward_kernel(&a, x.data(), dy.data(), dx.data());
    dxg = poisoned<float>(nx);
    run_on_cuda(tsl_cl_pool_window_backward, t,
                {cuda_buf(x, STARPU_R), cuda_buf(dy, STARPU_R), cuda_buf(dxg, STARPU_W)});
    EXPECT_EQ(worst_error(dxg, dx), 0.0) << "window backward";
    // average pooling's window backward reads dy alone
    t.pool.kind = TSL_POOL_AVG;
    tsl_pool_backward_kernel(&t.pool, nullptr, dy.data(), dx.data());
    dxg = poisoned<float>(nx);
    run_on_cuda(tsl_cl_pool_window_backward_avg, t,
                {cuda_buf(dy, STARPU_R), cuda_buf(dxg, STARPU_W)});
    EXPECT_EQ(worst_error(dxg, dx), 0.0) << "average pooling window backward";
    // nearest upsampling by 2 on a tile's window
    t.pool = upsample_args(TSL_F32, TSL_UPSAMPLE_NEAREST, false, {12, 10}, {2, 2});
    std::vector<float> uy(a.planes * 24 * 20), uyg = poisoned<float>(uy.size());
    tsl_upsample_forward_kernel(&t.pool, x.data(), uy.data());
    run_on_cuda(tsl_cl_upsample_window_forward, t,
                {cuda_buf(x, STARPU_R), cuda_buf(uyg, STARPU_W)});
    EXPECT_EQ(worst_error(uyg, uy), 0.0) << "upsampling window forward";
    std::vector<float> udx(nx), udxg = poisoned<float>(nx);
    tsl_upsample_backward_kernel(&t.pool, uy.data(), udx.data());
    run_on_cuda(tsl_cl_upsample_window_backward, t,
                {cuda_buf(uy, STARPU_R), cuda_buf(udxg, STARPU_W)});
    EXPECT_EQ(worst_error(udxg, udx), 0.0) << "upsampling window backward";
}
