// Tile storage layouts: a channels-last tensor holds the same values as a plain one (scatter,
// gather, fills, redistribution between layouts, elementwise ops, sums), its tiles really are
// N (D) (H) W C in memory, convolutions on channels-last tiles match plain ones, and ops whose
// kernels index plain tiles refuse channels-last ones with a clear error.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "mpi_test_env.h"

using namespace tsltest;

namespace
{

template <typename T> std::vector<T> gather_as(tsl_tensor_t t)
{
    tsl_shape s;
    tsl_tensor_shape(t, &s);
    std::vector<T> v((size_t)tsl_shape_numel(&s));
    EXPECT_EQ(tsl_tensor_gather(t, 0, rank == 0 ? v.data() : nullptr), TSL_OK)
        << tsl_context_last_error(ctx);
    return v;
}

// On each owner, compare every owned tile's memory with the whole array `whole` (plain, f64)
// read in channels-last order: proves the storage order, not only the round trip.
bool tiles_are_channels_last(tsl_tensor_t t, const std::vector<double> &whole_on_all)
{
    tsl_shape s;
    tsl_tensor_shape(t, &s);
    int64_t ntiles;
    tsl_tensor_tile_count(t, &ntiles);
    bool ok = true;
    for (int64_t i = 0; i < ntiles; i++) {
        int32_t owner;
        int64_t start[TSL_MAX_DIMS], ext[TSL_MAX_DIMS];
        tsl_tensor_tile_info(t, i, nullptr, &owner, start, ext);
        if (owner != rank)
            continue;
        starpu_data_handle_t h;
        tsl_tensor_tile_handle(t, i, &h);
        starpu_data_acquire(h, STARPU_R);
        const double *p = (const double *)starpu_data_get_local_ptr(h);
        int nd = s.ndim;
        int64_t gstride[TSL_MAX_DIMS];
        gstride[nd - 1] = 1;
        for (int d = nd - 2; d >= 0; d--)
            gstride[d] = gstride[d + 1] * s.dims[d + 1];
        // Memory order N, spatial..., C.
        int order[TSL_MAX_DIMS];
        order[0] = 0;
        for (int d = 2; d < nd; d++)
            order[d - 1] = d;
        order[nd - 1] = 1;
        int64_t count = 1;
        for (int d = 0; d < nd; d++)
            count *= ext[d];
        for (int64_t k = 0; k < count && ok; k++) {
            int64_t rest = k, g = 0;
            for (int j = nd - 1; j >= 0; j--) {
                int d = order[j];
                g += (start[d] + rest % ext[d]) * gstride[d];
                rest /= ext[d];
            }
            ok = p[k] == whole_on_all[(size_t)g];
        }
        starpu_data_release(h);
    }
    return all_ranks(ok);
}

} // namespace

TEST(Layout, ChannelsLastHoldsTheSameValuesAsPlain)
{
    tsl_owner_map block = tsl_owner_block(nullptr), rev = tsl_owner_callback(reversed, nullptr),
                  rr = tsl_owner_callback(round_robin, nullptr);
    struct Case {
        std::vector<int64_t> dims;
        std::vector<int32_t> splits_a, splits_b;
    };
    const Case cases[] = {
        {{3, 5, 17}, {1, 1, 1}, {3, 2, 4}},
        {{4, 6, 7, 9}, {2, 1, 1, 1}, {1, 3, 2, 2}},
        {{2, 3, 5, 4, 6}, {2, 3, 1, 2, 1}, {1, 1, 5, 1, 3}},
    };
    std::mt19937_64 gen(seed + 300);
    for (const Case &c : cases) {
        std::string what = std::to_string(c.dims.size()) + "-D";
        size_t numel = 1;
        for (int64_t d : c.dims)
            numel *= (size_t)d;
        // The same random array on every rank (the generator is seeded alike).
        std::vector<double> whole(numel);
        std::normal_distribution<double> normal(0.0, 3.0);
        for (double &v : whole)
            v = normal(gen);
        tsl_tensor_t cl = make_tensor(TSL_F64, c.dims, c.splits_a, rev, TSL_LAYOUT_CHANNELS_LAST);
        tsl_layout got_layout;
        ASSERT_EQ(tsl_tensor_layout(cl, &got_layout), TSL_OK);
        EXPECT_EQ(got_layout, TSL_LAYOUT_CHANNELS_LAST);
        // Scatter / gather round trip, and the tiles' memory order.
        ASSERT_EQ(tsl_tensor_scatter(cl, 0, rank == 0 ? whole.data() : nullptr), TSL_OK);
        std::vector<double> back = gather_as<double>(cl);
        if (rank == 0)
            EXPECT_EQ(std::memcmp(back.data(), whole.data(), numel * sizeof(double)), 0) << what;
        EXPECT_TRUE(tiles_are_channels_last(cl, whole)) << what;
        // Redistribution converts layouts both ways, across different grids and owners.
        tsl_tensor_t plain = make_tensor(TSL_F64, c.dims, c.splits_b, rr, TSL_LAYOUT_PLAIN);
        tsl_tensor_t cl2 =
            make_tensor(TSL_F64, c.dims, c.splits_b, block, TSL_LAYOUT_CHANNELS_LAST);
        ASSERT_EQ(tsl_tensor_fill_constant(plain, 1e300), TSL_OK); // poison
        ASSERT_EQ(tsl_tensor_redistribute(plain, cl), TSL_OK) << tsl_context_last_error(ctx);
        ASSERT_EQ(tsl_tensor_redistribute(cl2, plain), TSL_OK) << tsl_context_last_error(ctx);
        std::vector<double> via_plain = gather_as<double>(plain), via_cl2 = gather_as<double>(cl2);
        if (rank == 0) {
            EXPECT_EQ(std::memcmp(via_plain.data(), whole.data(), numel * sizeof(double)), 0)
                << what;
            EXPECT_EQ(std::memcmp(via_cl2.data(), whole.data(), numel * sizeof(double)), 0) << what;
        }
        EXPECT_TRUE(tiles_are_channels_last(cl2, whole)) << what;
        // Fills depend on the logical index only; sums and elementwise ops agree.
        for (tsl_tensor_t t : {cl, plain})
            ASSERT_EQ(tsl_tensor_fill_normal(t, seed + 301, 1.0, 2.0), TSL_OK);
        std::vector<double> f_cl = gather_as<double>(cl), f_plain = gather_as<double>(plain);
        if (rank == 0)
            EXPECT_EQ(std::memcmp(f_cl.data(), f_plain.data(), numel * sizeof(double)), 0) << what;
        ASSERT_EQ(tsl_tensor_redistribute(cl2, cl), TSL_OK);
        double s_cl = 0, s_plain = 1;
        ASSERT_EQ(tsl_tensor_sum(cl2, &s_cl), TSL_OK);
        ASSERT_EQ(tsl_tensor_sum(plain, &s_plain), TSL_OK);
        EXPECT_EQ(s_cl, s_plain) << what;
        // Elementwise: cl2 = cl + cl (same grid and layout), then compared through gathers.
        tsl_tensor_t cl3 =
            make_tensor(TSL_F64, c.dims, c.splits_a, block, TSL_LAYOUT_CHANNELS_LAST);
        ASSERT_EQ(tsl_tensor_add(cl3, cl, cl), TSL_OK) << tsl_context_last_error(ctx);
        std::vector<double> twice = gather_as<double>(cl3);
        if (rank == 0)
            for (size_t i = 0; i < numel; i++)
                ASSERT_EQ(twice[i], 2 * f_plain[i]) << what << " element " << i;
        // Mixed layouts are refused by elementwise ops.
        EXPECT_EQ(tsl_tensor_add(cl3, cl, cl2), TSL_ERR_SHAPE);
        tsl_tensor_t plain_a = make_tensor(TSL_F64, c.dims, c.splits_a, block, TSL_LAYOUT_PLAIN);
        EXPECT_EQ(tsl_tensor_axpy(plain_a, 1.0, cl), TSL_ERR_SHAPE);
        EXPECT_NE(std::strstr(tsl_context_last_error(ctx), "channels_last"), nullptr);
        for (tsl_tensor_t t : {cl, plain, cl2, cl3, plain_a})
            tsl_tensor_destroy(t);
    }
    // Integer and byte tensors move through the layouts too.
    tsl_tensor_t u8 = make_tensor(TSL_U8, {2, 3, 4, 5}, {2, 1, 2, 1}, rr, TSL_LAYOUT_CHANNELS_LAST);
    std::vector<uint8_t> bytes(120);
    for (size_t i = 0; i < bytes.size(); i++)
        bytes[i] = (uint8_t)(i * 7 + 3);
    ASSERT_EQ(tsl_tensor_scatter(u8, 0, rank == 0 ? bytes.data() : nullptr), TSL_OK);
    std::vector<uint8_t> bytes_back = gather_as<uint8_t>(u8);
    if (rank == 0)
        EXPECT_EQ(bytes_back, bytes);
    tsl_tensor_destroy(u8);
}

TEST(Layout, ChannelsLastNeedsSpatialDimensionsAndAKnownLayout)
{
    tsl_owner_map block = tsl_owner_block(nullptr);
    tsl_shape s;
    int64_t dims[2] = {4, 5};
    ASSERT_EQ(tsl_shape_make(&s, 2, dims), TSL_OK);
    tsl_tensor_t t = nullptr;
    EXPECT_EQ(
        tsl_tensor_create_layout(&t, ctx, TSL_F32, &s, nullptr, &block, TSL_LAYOUT_CHANNELS_LAST),
        TSL_ERR_SHAPE);
    EXPECT_EQ(t, nullptr);
    EXPECT_EQ(tsl_tensor_create_layout(&t, ctx, TSL_F32, &s, nullptr, &block, (tsl_layout)7),
              TSL_ERR_INVALID_ARG);
    EXPECT_STREQ(tsl_layout_name(TSL_LAYOUT_CHANNELS_LAST), "channels_last");
    EXPECT_STREQ(tsl_layout_name((tsl_layout)7), "invalid");
}

TEST(Layout, OpsThatIndexPlainTilesRefuseChannelsLast)
{
    tsl_owner_map block = tsl_owner_block(nullptr);
    tsl_tensor_t x =
        make_tensor(TSL_F32, {2, 3, 8, 8}, {1, 1, 1, 1}, block, TSL_LAYOUT_CHANNELS_LAST);
    tsl_tensor_t y = make_tensor(TSL_F32, {2, 3, 4, 4}, {1, 1, 1, 1}, block, TSL_LAYOUT_PLAIN);
    tsl_pool_params pp;
    ASSERT_EQ(tsl_pool_params_init(&pp, TSL_POOL_MAX, 2, 2), TSL_OK);
    // Pooling takes either layout, but x and y in the same one.
    EXPECT_EQ(tsl_pool_forward(&pp, x, y), TSL_ERR_SHAPE);
    EXPECT_NE(std::strstr(tsl_context_last_error(ctx), "same tile layout"), nullptr);
    // Losses take channels-last logits, but labels (no channel dimension) stay plain.
    tsl_tensor_t labels =
        make_tensor(TSL_I32, {2, 8, 8}, {1, 1, 1}, block, TSL_LAYOUT_CHANNELS_LAST);
    double loss = 0;
    EXPECT_EQ(tsl_loss_cross_entropy(x, labels, nullptr, &loss), TSL_ERR_UNSUPPORTED);
    tsl_tensor_t g = make_tensor(TSL_F32, {3}, {1}, block, TSL_LAYOUT_PLAIN);
    tsl_tensor_t b = make_tensor(TSL_F32, {3}, {1}, block, TSL_LAYOUT_PLAIN);
    tsl_tensor_t rm = make_tensor(TSL_F32, {3}, {1}, block, TSL_LAYOUT_PLAIN);
    tsl_tensor_t rv = make_tensor(TSL_F32, {3}, {1}, block, TSL_LAYOUT_PLAIN);
    tsl_tensor_t flat = make_tensor(TSL_F32, {2, 192}, {1, 1}, block, TSL_LAYOUT_PLAIN);
    tsl_tensor_t other =
        make_tensor(TSL_F32, {2, 12, 4, 4}, {1, 1, 1, 1}, block, TSL_LAYOUT_CHANNELS_LAST);
    EXPECT_EQ(tsl_reshape_samples(x, other), TSL_ERR_UNSUPPORTED); // two channels-last shapes
    tsl_tensor_destroy(other);
    // A convolution needs x and y in one layout.
    tsl_tensor_t w = make_tensor(TSL_F32, {3, 3, 1, 1}, {1, 1, 1, 1}, block, TSL_LAYOUT_PLAIN);
    tsl_tensor_t yp = make_tensor(TSL_F32, {2, 3, 8, 8}, {1, 1, 1, 1}, block, TSL_LAYOUT_PLAIN);
    tsl_conv_params cp;
    ASSERT_EQ(tsl_conv_params_init(&cp, 2), TSL_OK);
    EXPECT_EQ(tsl_conv_forward(&cp, x, w, nullptr, yp), TSL_ERR_SHAPE);
    for (tsl_tensor_t t : {x, y, labels, g, b, rm, rv, flat, w, yp})
        tsl_tensor_destroy(t);
}

TEST(Layout, ConvolutionsOnChannelsLastTilesMatchPlainOnes)
{
    tsl_owner_map block = tsl_owner_block(nullptr), rev = tsl_owner_callback(reversed, nullptr);
    struct Case {
        const char *name;
        int spatial;
        int transposed;
        std::vector<int64_t> x, w;
        int64_t stride, padding, dilation, groups, out_pad;
    };
    const Case cases[] = {
        {"conv1d stride 2 pad 2", 1, 0, {5, 4, 23}, {6, 4, 5}, 2, 2, 1, 1, 0},
        {"conv2d dilation 2 groups 2", 2, 0, {3, 4, 11, 9}, {6, 2, 3, 3}, 1, 1, 2, 2, 0},
        {"conv2d depthwise", 2, 0, {4, 6, 7, 8}, {6, 1, 3, 3}, 1, 1, 1, 6, 0},
        {"conv3d stride 2", 3, 0, {2, 3, 7, 6, 5}, {4, 3, 3, 3, 3}, 2, 1, 1, 1, 0},
        {"transposed conv2d stride 2", 2, 1, {3, 4, 5, 6}, {4, 3, 3, 3}, 2, 1, 1, 1, 1},
        {"transposed conv3d", 3, 1, {2, 4, 3, 4, 3}, {4, 2, 2, 2, 2}, 2, 0, 1, 1, 0},
    };
    for (const Case &c : cases) {
        tsl_conv_params p;
        ASSERT_EQ(tsl_conv_params_init(&p, c.spatial), TSL_OK);
        for (int d = 0; d < c.spatial; d++) {
            p.stride[d] = c.stride;
            p.padding[d] = c.padding;
            p.dilation[d] = c.dilation;
            p.output_padding[d] = c.out_pad;
        }
        p.groups = c.groups;
        tsl_shape xs, ws, ys;
        tsl_shape_make(&xs, (int32_t)c.x.size(), c.x.data());
        tsl_shape_make(&ws, (int32_t)c.w.size(), c.w.data());
        ASSERT_EQ(c.transposed ? tsl_conv_transpose_output_shape(&xs, &ws, &p, &ys)
                               : tsl_conv_output_shape(&xs, &ws, &p, &ys),
                  TSL_OK)
            << c.name;
        std::vector<int64_t> yd(ys.dims, ys.dims + ys.ndim);
        int64_t outc = ys.dims[1];
        std::vector<std::vector<float>> ref;
        for (int variant = 0; variant < 3; variant++) {
            // 0: plain, one tile (the reference); 1: channels-last, one tile; 2: channels-last,
            // samples split in two tiles with other owners.
            tsl_layout lay = variant == 0 ? TSL_LAYOUT_PLAIN : TSL_LAYOUT_CHANNELS_LAST;
            int32_t n_split = variant == 2 ? 2 : 1;
            std::vector<int32_t> sp(c.x.size(), 1);
            sp[0] = n_split;
            const tsl_owner_map &own = variant == 2 ? rev : block;
            tsl_tensor_t x = make_tensor(TSL_F32, c.x, sp, own, lay);
            tsl_tensor_t y = make_tensor(TSL_F32, yd, sp, block, lay);
            tsl_tensor_t dy = make_tensor(TSL_F32, yd, sp, own, lay);
            tsl_tensor_t dx = make_tensor(TSL_F32, c.x, sp, block, lay);
            std::vector<int32_t> one(c.w.size(), 1);
            tsl_tensor_t w = make_tensor(TSL_F32, c.w, one, block, TSL_LAYOUT_PLAIN);
            tsl_tensor_t dw = make_tensor(TSL_F32, c.w, one, rev, TSL_LAYOUT_PLAIN);
            tsl_tensor_t b = make_tensor(TSL_F32, {outc}, {1}, block, TSL_LAYOUT_PLAIN);
            tsl_tensor_t db = make_tensor(TSL_F32, {outc}, {1}, rev, TSL_LAYOUT_PLAIN);
            ASSERT_EQ(tsl_tensor_fill_uniform(x, seed + 310, -1, 1), TSL_OK);
            ASSERT_EQ(tsl_tensor_fill_uniform(w, seed + 311, -1, 1), TSL_OK);
            ASSERT_EQ(tsl_tensor_fill_uniform(b, seed + 312, -1, 1), TSL_OK);
            ASSERT_EQ(tsl_tensor_fill_uniform(dy, seed + 313, -1, 1), TSL_OK);
            for (tsl_tensor_t t : {y, dx, dw, db}) // poison
                ASSERT_EQ(tsl_tensor_fill_constant(t, 1e30), TSL_OK);
            if (c.transposed) {
                ASSERT_EQ(tsl_conv_transpose_forward(&p, x, w, b, y), TSL_OK)
                    << tsl_context_last_error(ctx);
                ASSERT_EQ(tsl_conv_transpose_backward(&p, x, w, dy, dx, dw, db), TSL_OK)
                    << tsl_context_last_error(ctx);
            } else {
                ASSERT_EQ(tsl_conv_forward(&p, x, w, b, y), TSL_OK) << tsl_context_last_error(ctx);
                ASSERT_EQ(tsl_conv_backward(&p, x, w, dy, dx, dw, db), TSL_OK)
                    << tsl_context_last_error(ctx);
            }
            std::vector<std::vector<float>> got;
            for (tsl_tensor_t t : {y, dx, dw, db})
                got.push_back(gather_as<float>(t));
            if (rank == 0) {
                if (variant == 0) {
                    ref = got;
                } else {
                    const char *names[4] = {"y", "dx", "dw", "db"};
                    for (int k = 0; k < 4; k++)
                        EXPECT_LT(max_rel_diff(got[k], ref[k]), 1e-5)
                            << c.name << ": " << names[k] << ", variant " << variant;
                }
            }
            for (tsl_tensor_t t : {x, y, dy, dx, w, dw, b, db})
                tsl_tensor_destroy(t);
        }
    }
}

// Flatten of channels-last tiles (and its backward into channels-last tiles) gives the plain
// result: the same values in the same logical order, for 1-, 2- and 3-D samples and uneven
// sample tiles over the ranks.
TEST(Layout, FlattenOfChannelsLastTilesMatchesPlain)
{
    const std::vector<std::vector<int64_t>> shapes = {{5, 3, 7}, {5, 4, 3, 5}, {5, 2, 3, 4, 5}};
    tsl_owner_map block = tsl_owner_block(nullptr);
    for (const auto &dims : shapes) {
        SCOPED_TRACE("ndim " + std::to_string(dims.size()));
        int64_t per = 1;
        for (size_t d = 1; d < dims.size(); d++)
            per *= dims[d];
        int32_t tiles = std::min<int32_t>(size + 1, 5);
        std::vector<int32_t> splits(dims.size(), 1);
        splits[0] = tiles;
        tsl_tensor_t x = make_tensor(TSL_F32, dims, splits, block, TSL_LAYOUT_CHANNELS_LAST);
        tsl_tensor_t back = make_tensor(TSL_F32, dims, splits, block, TSL_LAYOUT_CHANNELS_LAST);
        tsl_tensor_t flat =
            make_tensor(TSL_F32, {dims[0], per}, {tiles, 1}, block, TSL_LAYOUT_PLAIN);
        ASSERT_EQ(tsl_tensor_fill_uniform(x, seed + 91, -1, 1), TSL_OK);
        ASSERT_EQ(tsl_tensor_fill_constant(flat, 1e30), TSL_OK); // poison
        ASSERT_EQ(tsl_tensor_fill_constant(back, 1e30), TSL_OK);
        ASSERT_EQ(tsl_reshape_samples(x, flat), TSL_OK) << tsl_context_last_error(ctx);
        ASSERT_EQ(tsl_reshape_samples(flat, back), TSL_OK) << tsl_context_last_error(ctx);
        auto got = gather_all({x, flat, back});
        if (rank == 0) {
            EXPECT_EQ(got[1], got[0]) << "flatten of channels-last tiles";
            EXPECT_EQ(got[2], got[0]) << "and back";
        }
        for (tsl_tensor_t t : {x, back, flat})
            tsl_tensor_destroy(t);
    }
}
