// Group normalization (tsl_groupnorm_forward/backward): y, the saved statistics, dx, dgamma and
// dbeta of the one-tile run against sums computed here in long double from x and dy, and every
// other tiling (samples, channels cut inside and across groups, spatial tiles), owner map and
// layout bit for bit equal to the one-tile run, on poisoned outputs, in f64 and f32, for one
// group (layer normalization), some groups and one channel per group. Runs at 1, 2 and 4 ranks.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "mpi_test_env.h"

using namespace tsltest;

namespace
{

// Collective gather of an f32 or f64 tensor to rank 0, as doubles.
std::vector<double> gather_f64(tsl_tensor_t t)
{
    tsl_shape s;
    tsl_tensor_shape(t, &s);
    tsl_dtype dt;
    tsl_tensor_dtype(t, &dt);
    size_t n = (size_t)tsl_shape_numel(&s);
    std::vector<double> out(n, NAN);
    if (dt == TSL_F64) {
        EXPECT_EQ(tsl_tensor_gather(t, 0, rank == 0 ? out.data() : nullptr), TSL_OK);
        return out;
    }
    std::vector<float> f(n, NAN);
    EXPECT_EQ(tsl_tensor_gather(t, 0, rank == 0 ? f.data() : nullptr), TSL_OK);
    for (size_t i = 0; i < n; i++)
        out[i] = f[i];
    return out;
}

// Bitwise equality of two arrays of doubles (NaNs of the same bits equal).
bool same_bits(const std::vector<double> &a, const std::vector<double> &b)
{
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0;
}

} // namespace

TEST(GroupNorm, ForwardAndBackwardMatchReferenceAndOneTileOnEveryTiling)
{
    const int64_t N = 4, C = 6, H = 5, W = 7, S = H * W;
    const std::vector<int64_t> dims = {N, C, H, W};
    const std::vector<std::vector<int32_t>> grids = {{1, 1, 1, 1}, {2, 1, 1, 1}, {1, 4, 1, 1},
                                                     {1, 1, 3, 2}, {2, 3, 2, 1}, {4, 5, 2, 3}};
    tsl_owner_map block = tsl_owner_block(nullptr), rev = tsl_owner_callback(reversed, nullptr),
                  last = tsl_owner_single(size - 1);
    for (tsl_dtype dt : {TSL_F64, TSL_F32})
        for (int64_t G : {1, 2, 3, 6}) {
            std::vector<std::vector<double>> ref;
            for (size_t gi = 0; gi < grids.size(); gi++)
                for (int owners = 0; owners < 3; owners++) { // plain x 2 owner maps, channels-last
                    const tsl_owner_map &xo = owners == 1 ? rev : block;
                    tsl_layout lay = owners == 2 ? TSL_LAYOUT_CHANNELS_LAST : TSL_LAYOUT_PLAIN;
                    tsl_tensor_t x = make_tensor(dt, dims, grids[gi], xo, lay);
                    tsl_tensor_t y = make_tensor(dt, dims, grids[gi], block, lay);
                    tsl_tensor_t dy = make_tensor(dt, dims, grids[gi], rev, lay);
                    tsl_tensor_t dx = make_tensor(dt, dims, grids[gi], owners ? block : rev, lay);
                    tsl_tensor_t gamma = make_tensor(dt, {C}, {1}, last);
                    tsl_tensor_t beta = make_tensor(dt, {C}, {1}, block);
                    tsl_tensor_t saved = make_tensor(TSL_F64, {N, G, 2}, {1, 1, 1}, last);
                    tsl_tensor_t dg = make_tensor(dt, {C}, {1}, owners == 1 ? last : block);
                    tsl_tensor_t db = make_tensor(dt, {C}, {1}, last);
                    ASSERT_EQ(tsl_tensor_fill_normal(x, seed + 80, 2.0, 3.0), TSL_OK);
                    ASSERT_EQ(tsl_tensor_fill_normal(dy, seed + 81, 0.0, 1.0), TSL_OK);
                    ASSERT_EQ(tsl_tensor_fill_uniform(gamma, seed + 82, 0.5, 1.5), TSL_OK);
                    ASSERT_EQ(tsl_tensor_fill_uniform(beta, seed + 83, -1, 1), TSL_OK);
                    for (tsl_tensor_t out : {y, dx, dg, db, saved}) // poisoned outputs
                        ASSERT_EQ(tsl_tensor_fill_constant(out, -1e30), TSL_OK);
                    ASSERT_EQ(tsl_groupnorm_forward(x, gamma, beta, G, saved, y, 1e-5), TSL_OK)
                        << tsl_context_last_error(ctx);
                    ASSERT_EQ(tsl_groupnorm_backward(x, dy, gamma, G, saved, dx, dg, db), TSL_OK)
                        << tsl_context_last_error(ctx);
                    std::vector<std::vector<double>> got = {gather_f64(y), gather_f64(saved),
                                                            gather_f64(dx), gather_f64(dg),
                                                            gather_f64(db)};
                    auto gx = gather_f64(x), gdy = gather_f64(dy), gg = gather_f64(gamma),
                         gb = gather_f64(beta);
                    if (rank == 0 && ref.empty()) {
                        // The one-tile run against sums taken here.
                        const double tol = dt == TSL_F64 ? 1e-11 : 2e-5;
                        const int64_t per = C / G;
                        std::vector<long double> sdy(C, 0), sdyx(C, 0);
                        for (int64_t n = 0; n < N; n++)
                            for (int64_t g = 0; g < G; g++) {
                                auto at = [&](int64_t c, int64_t i) {
                                    return (n * C + g * per + c) * S + i;
                                };
                                long double mean = 0, var = 0, m1 = 0, m2 = 0;
                                for (int64_t c = 0; c < per; c++)
                                    for (int64_t i = 0; i < S; i++)
                                        mean += gx[at(c, i)];
                                mean /= per * S;
                                for (int64_t c = 0; c < per; c++)
                                    for (int64_t i = 0; i < S; i++)
                                        var += (gx[at(c, i)] - mean) * (gx[at(c, i)] - mean);
                                var /= per * S;
                                long double invstd = 1 / std::sqrt(var + 1e-5L);
                                EXPECT_NEAR(got[1][(n * G + g) * 2], (double)mean, 1e-12);
                                EXPECT_NEAR(got[1][(n * G + g) * 2 + 1], (double)invstd, 1e-10);
                                for (int64_t c = 0; c < per; c++)
                                    for (int64_t i = 0; i < S; i++) {
                                        long double xh = (gx[at(c, i)] - mean) * invstd,
                                                    d = gdy[at(c, i)] * gg[g * per + c];
                                        m1 += d;
                                        m2 += d * xh;
                                        sdy[g * per + c] += gdy[at(c, i)];
                                        sdyx[g * per + c] += gdy[at(c, i)] * xh;
                                        EXPECT_NEAR(
                                            got[0][at(c, i)],
                                            (double)(xh * gg[g * per + c] + gb[g * per + c]), tol);
                                    }
                                m1 /= per * S;
                                m2 /= per * S;
                                for (int64_t c = 0; c < per; c++)
                                    for (int64_t i = 0; i < S; i++) {
                                        long double xh = (gx[at(c, i)] - mean) * invstd;
                                        long double d = gdy[at(c, i)] * gg[g * per + c];
                                        EXPECT_NEAR(got[2][at(c, i)],
                                                    (double)(invstd * (d - m1 - xh * m2)), tol)
                                            << "dx n " << n << " g " << g;
                                    }
                            }
                        for (int64_t c = 0; c < C; c++) {
                            EXPECT_NEAR(got[3][c], (double)sdyx[c], 100 * tol);
                            EXPECT_NEAR(got[4][c], (double)sdy[c], 100 * tol);
                        }
                        ref = got;
                    } else if (rank == 0) {
                        const char *names[5] = {"y", "saved", "dx", "dgamma", "dbeta"};
                        for (int k = 0; k < 5; k++)
                            EXPECT_TRUE(same_bits(got[k], ref[k]))
                                << names[k] << ", " << tsl_dtype_name(dt) << ", groups " << G
                                << ", grid " << gi << ", owners " << owners;
                    }
                    for (tsl_tensor_t t : {x, y, dy, dx, gamma, beta, saved, dg, db})
                        tsl_tensor_destroy(t);
                }
        }
}

// The fused ReLU (tsl_groupnorm_relu_forward/backward) against the unfused calls (group norm,
// ReLU forward, ReLU backward, group norm backward) on the same tensors: y, the saved statistics,
// dx, dgamma and dbeta bit for bit, on every tiling, owner map and layout, poisoned outputs.
// beta is set from gamma's magnitude so that channel 0 ends up (almost) all zero, channel 1 all
// positive and the others mixed, whatever the seed.
TEST(GroupNorm, FusedReluEqualsTheUnfusedCallsOnEveryTiling)
{
    const int64_t N = 3, C = 6, H = 5, W = 4;
    const std::vector<int64_t> dims = {N, C, H, W};
    const std::vector<std::vector<int32_t>> grids = {
        {1, 1, 1, 1}, {3, 1, 1, 1}, {1, 4, 1, 1}, {1, 1, 3, 2}, {2, 3, 2, 1}};
    tsl_owner_map block = tsl_owner_block(nullptr), rev = tsl_owner_callback(reversed, nullptr),
                  last = tsl_owner_single(size - 1);
    int compared = 0;
    for (tsl_dtype dt : {TSL_F64, TSL_F32})
        for (int64_t G : {1, 2, 6})
            for (size_t gi = 0; gi < grids.size(); gi++)
                for (int owners = 0; owners < 3; owners++) {
                    const tsl_owner_map &xo = owners == 1 ? rev : block;
                    tsl_layout lay = owners == 2 ? TSL_LAYOUT_CHANNELS_LAST : TSL_LAYOUT_PLAIN;
                    auto tile = [&](const tsl_owner_map &o) {
                        return make_tensor(dt, dims, grids[gi], o, lay);
                    };
                    tsl_tensor_t x = tile(xo), dy = tile(rev), y = tile(block), r = tile(block),
                                 dr = tile(xo), dx = tile(owners ? block : rev), yf = tile(rev),
                                 dxf = tile(block);
                    tsl_tensor_t gamma = make_tensor(dt, {C}, {1}, last);
                    tsl_tensor_t beta = make_tensor(dt, {C}, {1}, block);
                    tsl_tensor_t saved = make_tensor(TSL_F64, {N, G, 2}, {1, 1, 1}, last);
                    tsl_tensor_t savedf = make_tensor(TSL_F64, {N, G, 2}, {1, 1, 1}, block);
                    tsl_tensor_t dg = make_tensor(dt, {C}, {1}, block),
                                 db = make_tensor(dt, {C}, {1}, last);
                    tsl_tensor_t dgf = make_tensor(dt, {C}, {1}, last),
                                 dbf = make_tensor(dt, {C}, {1}, block);
                    ASSERT_EQ(tsl_tensor_fill_normal(x, seed + 90, 1.0, 2.0), TSL_OK);
                    ASSERT_EQ(tsl_tensor_fill_normal(dy, seed + 91, 0.0, 1.0), TSL_OK);
                    ASSERT_EQ(tsl_tensor_fill_uniform(gamma, seed + 92, -1.5, 1.5), TSL_OK);
                    { // beta: channel 0 shifted well below, channel 1 well above, the rest
                        // near the middle of the normalised values (mixed signs)
                        auto gv = gather_f64(gamma);
                        std::vector<double> bv(C);
                        std::vector<float> bf(C);
                        for (int64_t c = 0; c < C; c++) {
                            double g = rank == 0 ? std::fabs(gv[c]) + 0.1 : 0.0;
                            double u = ((seed + 93 * (c + 1)) % 1000) / 1000.0 - 0.5;
                            bv[c] = c == 0 ? -4.0 * g : c == 1 ? 4.0 * g : u * g;
                            bf[c] = (float)bv[c];
                        }
                        const void *src = dt == TSL_F64 ? (const void *)bv.data() : bf.data();
                        ASSERT_EQ(tsl_tensor_scatter(beta, 0, rank == 0 ? src : nullptr), TSL_OK);
                    }
                    for (tsl_tensor_t out :
                         {y, r, dr, dx, yf, dxf, saved, savedf, dg, db, dgf, dbf})
                        ASSERT_EQ(tsl_tensor_fill_constant(out, -1e30), TSL_OK);
                    // unfused
                    ASSERT_EQ(tsl_groupnorm_forward(x, gamma, beta, G, saved, y, 1e-5), TSL_OK);
                    ASSERT_EQ(tsl_activation_forward(TSL_ACT_RELU, 0, y, r), TSL_OK);
                    ASSERT_EQ(tsl_activation_backward(TSL_ACT_RELU, 0, y, r, dy, dr), TSL_OK);
                    ASSERT_EQ(tsl_groupnorm_backward(x, dr, gamma, G, saved, dx, dg, db), TSL_OK);
                    // fused
                    ASSERT_EQ(tsl_groupnorm_relu_forward(x, gamma, beta, G, savedf, yf, 1e-5),
                              TSL_OK)
                        << tsl_context_last_error(ctx);
                    ASSERT_EQ(
                        tsl_groupnorm_relu_backward(x, dy, gamma, beta, G, savedf, dxf, dgf, dbf),
                        TSL_OK)
                        << tsl_context_last_error(ctx);
                    const char *names[5] = {"y", "saved", "dx", "dgamma", "dbeta"};
                    tsl_tensor_t want[5] = {r, saved, dx, dg, db},
                                 got[5] = {yf, savedf, dxf, dgf, dbf};
                    for (int k = 0; k < 5; k++) {
                        auto a = gather_f64(want[k]), b = gather_f64(got[k]);
                        if (rank == 0) {
                            EXPECT_TRUE(same_bits(a, b))
                                << names[k] << ", " << tsl_dtype_name(dt) << ", groups " << G
                                << ", grid " << gi << ", owners " << owners;
                            compared++;
                        }
                    }
                    if (rank == 0 && gi == 0 && owners == 0) { // the mask is neither all nor none
                        auto rv = gather_f64(r);
                        size_t zero = 0;
                        for (double v : rv)
                            zero += v == 0;
                        EXPECT_GT(zero, rv.size() / 10) << "groups " << G;
                        EXPECT_LT(zero, rv.size() - rv.size() / 10) << "groups " << G;
                    } else if (gi == 0 && owners == 0) {
                        gather_f64(r);
                    }
                    for (tsl_tensor_t t : {x, dy, y, r, dr, dx, yf, dxf, gamma, beta, saved, savedf,
                                           dg, db, dgf, dbf})
                        tsl_tensor_destroy(t);
                }
    if (rank == 0)
        EXPECT_EQ(compared, 2 * 3 * 5 * 3 * 5);
}

TEST(GroupNorm, BadArgumentsAreErrors)
{
    tsl_owner_map block = tsl_owner_block(nullptr);
    tsl_tensor_t x = make_tensor(TSL_F32, {2, 6, 4}, {1, 2, 1}, block);
    tsl_tensor_t y = make_tensor(TSL_F32, {2, 6, 4}, {1, 2, 1}, block);
    tsl_tensor_t gamma = make_tensor(TSL_F32, {6}, {1}, block);
    tsl_tensor_t beta = make_tensor(TSL_F32, {6}, {1}, block);
    tsl_tensor_t g64 = make_tensor(TSL_F64, {6}, {1}, block);
    tsl_tensor_t saved = make_tensor(TSL_F64, {2, 3, 2}, {1, 1, 1}, block);
    tsl_tensor_t wrong = make_tensor(TSL_F64, {2, 2, 2}, {1, 1, 1}, block);
    EXPECT_EQ(tsl_groupnorm_forward(x, gamma, beta, 4, saved, y, 1e-5), TSL_ERR_SHAPE);
    EXPECT_EQ(tsl_groupnorm_forward(x, gamma, beta, 0, saved, y, 1e-5), TSL_ERR_SHAPE);
    EXPECT_EQ(tsl_groupnorm_forward(x, gamma, beta, 3, wrong, y, 1e-5), TSL_ERR_SHAPE);
    EXPECT_EQ(tsl_groupnorm_forward(x, g64, beta, 3, saved, y, 1e-5), TSL_ERR_SHAPE);
    EXPECT_EQ(tsl_groupnorm_forward(x, gamma, beta, 3, saved, x, 1e-5), TSL_ERR_INVALID_ARG);
    EXPECT_EQ(tsl_groupnorm_forward(x, gamma, beta, 3, saved, y, 0), TSL_ERR_INVALID_ARG);
    EXPECT_EQ(tsl_groupnorm_backward(x, y, gamma, 3, saved, x, nullptr, nullptr),
              TSL_ERR_INVALID_ARG);
    EXPECT_EQ(tsl_groupnorm_backward(x, y, gamma, 3, saved, nullptr, beta, beta),
              TSL_ERR_INVALID_ARG);
    EXPECT_EQ(tsl_groupnorm_relu_backward(x, y, gamma, nullptr, 3, saved, nullptr, gamma, nullptr),
              TSL_ERR_INVALID_ARG); // beta is required
    EXPECT_EQ(tsl_groupnorm_relu_backward(x, y, gamma, beta, 3, saved, nullptr, nullptr, beta),
              TSL_ERR_INVALID_ARG); // dbeta may not overwrite beta
    EXPECT_EQ(tsl_groupnorm_relu_backward(x, y, gamma, g64, 3, saved, nullptr, nullptr, nullptr),
              TSL_ERR_SHAPE);
    EXPECT_EQ(tsl_groupnorm_relu_forward(x, gamma, beta, 4, saved, y, 1e-5), TSL_ERR_SHAPE);
    for (tsl_tensor_t t : {x, y, gamma, beta, g64, saved, wrong})
        tsl_tensor_destroy(t);
}
