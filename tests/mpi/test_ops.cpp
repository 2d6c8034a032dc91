// Activations and optimizer updates on tiled tensors: every tile grid and owner map gives
// the one-tile result, bit for bit (the ops are elementwise), and the one-tile result
// matches the kernels applied to the whole array.
#include <gtest/gtest.h>

#include <random>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "mpi_test_env.h"

extern "C" {
#include "codelets/activation.h"
#include "codelets/optimizer.h"
#include "codelets/pool.h"
#include "graph/op_table.h"
}

using namespace tsltest;

namespace
{

struct Layout {
    std::string name;
    tsl_tile_grid grid;
    tsl_owner_map owners;
};

std::vector<Layout> layouts()
{
    tsl_tile_grid one = tsl_tile_grid_single(), split = tsl_tile_grid_single(),
                  uneven = tsl_tile_grid_single();
    split.splits[0] = 2;
    split.splits[2] = 2;
    uneven.splits[1] = 3;
    uneven.splits[2] = 4;
    int32_t pgrid[TSL_MAX_DIMS] = {1, 1, size, 0, 0}, block[TSL_MAX_DIMS] = {1, 1, 1, 1, 1};
    return {{"one tile", one, tsl_owner_single(0)},
            {"2x1x2 blocks", split, tsl_owner_block(nullptr)},
            {"uneven, block-cyclic", uneven, tsl_owner_block_cyclic(pgrid, block)},
            {"uneven, reversed", uneven, tsl_owner_callback(reversed, nullptr)}};
}

tsl_shape test_shape()
{
    int64_t dims[3] = {4, 7, 13};
    tsl_shape s;
    tsl_shape_make(&s, 3, dims);
    return s;
}

// Collective gather of an f64 tensor to rank 0.
std::vector<double> gather(tsl_tensor_t t)
{
    tsl_shape s;
    tsl_tensor_shape(t, &s);
    tsl_dtype dt;
    tsl_tensor_dtype(t, &dt);
    EXPECT_EQ(dt, TSL_F64) << "this helper gathers f64 tensors";
    std::vector<double> out((size_t)tsl_shape_numel(&s), NAN);
    EXPECT_EQ(tsl_tensor_gather(t, 0, rank == 0 ? out.data() : nullptr), TSL_OK);
    return out;
}

tsl_tensor_t make(const Layout &l, uint64_t fill_seed)
{
    tsl_shape s = test_shape();
    tsl_tensor_t t = nullptr;
    EXPECT_EQ(tsl_tensor_create(&t, ctx, TSL_F64, &s, &l.grid, &l.owners), TSL_OK)
        << tsl_context_last_error(ctx);
    EXPECT_EQ(tsl_tensor_fill_normal(t, fill_seed, 0.0, 2.0), TSL_OK);
    return t;
}

// Whether activation `kind` must match the C kernel bit for bit: always on CPU workers; with
// CUDA workers every kind but GELU (whose erfc and exp are the C library's or CUDA's).
bool exact_activation(tsl_activation kind)
{
    return starpu_cuda_worker_get_count() == 0 || kind != TSL_ACT_GELU;
}

void expect_close(const std::vector<double> &got, const std::vector<double> &want,
                  const std::string &what)
{
    ASSERT_EQ(got.size(), want.size()) << what;
    size_t bad = 0;
    for (size_t i = 0; i < got.size(); i++)
        if (!(std::fabs(got[i] - want[i]) <= 1e-14 * std::fmax(1.0, std::fabs(want[i]))))
            bad++;
    EXPECT_EQ(bad, 0u) << what << ": elements off by more than 1e-14 relative (or NaN)";
}

} // namespace

TEST(Activations, EveryLayoutMatchesTheKernelOnTheWholeArray)
{
    for (int k = 0; k < TSL_ACTIVATION_COUNT; k++) { // every kind: a new one is tested too
        tsl_activation kind = (tsl_activation)k;
        for (const Layout &l : layouts()) {
            // dy lives on other ranks than x: StarPU-MPI moves its tiles.
            Layout moved = l;
            moved.owners = tsl_owner_callback(reversed, nullptr);
            tsl_tensor_t x = make(l, seed), y = make(l, seed + 1), dy = make(moved, seed + 2),
                         dx = make(l, seed + 3);
            auto x0 = gather(x), dy0 = gather(dy);
            ASSERT_EQ(tsl_activation_forward(kind, 0.1, x, y), TSL_OK);
            ASSERT_EQ(tsl_activation_backward(kind, 0.1, x, y, dy, dx), TSL_OK)
                << tsl_context_last_error(ctx);
            auto y1 = gather(y), dx1 = gather(dx);
            // In place: x = act(x), then dy = act'(.) dy.
            bool uses_input = !tsl_activation_info_of(kind)->backward_reads_output;
            if (uses_input) {
                ASSERT_EQ(tsl_activation_backward(kind, 0.1, x, nullptr, dy, dy), TSL_OK);
                ASSERT_EQ(tsl_activation_forward(kind, 0.1, x, x), TSL_OK);
            } else {
                ASSERT_EQ(tsl_activation_forward(kind, 0.1, x, x), TSL_OK);
                ASSERT_EQ(tsl_activation_backward(kind, 0.1, nullptr, x, dy, dy), TSL_OK);
            }
            auto x2 = gather(x), dy2 = gather(dy);
            if (rank == 0) {
                tsl_act_args a{};
                a.kind = kind;
                a.dtype = TSL_F64;
                a.count = (int64_t)x0.size();
                a.slope = 0.1;
                std::vector<double> want_y(x0.size()), want_dx(x0.size());
                tsl_act_forward(&a, x0.data(), want_y.data());
                tsl_act_backward(&a, uses_input ? x0.data() : want_y.data(), dy0.data(),
                                 want_dx.data());
                // Bit for bit on CPU workers. A CUDA worker's erfc and exp may differ from the C
                // library's in the last place: with one, GELU is held to 1e-14 relative (and
                // still to every element written).
                if (exact_activation(kind)) {
                    EXPECT_EQ(y1, want_y) << l.name << " kind " << kind;
                    EXPECT_EQ(dx1, want_dx) << l.name << " kind " << kind;
                    EXPECT_EQ(x2, want_y) << l.name << " in place, kind " << kind;
                    EXPECT_EQ(dy2, want_dx) << l.name << " in place, kind " << kind;
                } else {
                    expect_close(y1, want_y, l.name + " kind " + std::to_string(k));
                    expect_close(dx1, want_dx, l.name + " kind " + std::to_string(k));
                    expect_close(x2, want_y, l.name + " in place, kind " + std::to_string(k));
                    expect_close(dy2, want_dx, l.name + " in place, kind " + std::to_string(k));
                }
            }
            for (tsl_tensor_t t : {x, y, dy, dx})
                tsl_tensor_destroy(t);
        }
    }
}

TEST(Optimizers, ThreeStepsOnEveryLayoutMatchTheWholeArrayUpdate)
{
    tsl_sgd_config sgd;
    tsl_sgd_config_init(&sgd);
    sgd.lr = 0.05;
    sgd.momentum = 0.9;
    sgd.weight_decay = 1e-2;
    sgd.nesterov = 1;
    tsl_adam_config adam, adamw;
    tsl_adam_config_init(&adam);
    adam.lr = 1e-2;
    adam.weight_decay = 1e-3;
    adamw = adam;
    adamw.decoupled = 1;
    tsl_sgd_config plain;
    tsl_sgd_config_init(&plain);
    for (int which = 0; which < 4; which++) {
        for (const Layout &l : layouts()) {
            tsl_optimizer_t opt = nullptr;
            ASSERT_EQ(which == 0   ? tsl_optimizer_create_sgd(&opt, ctx, &sgd)
                      : which == 1 ? tsl_optimizer_create_adam(&opt, ctx, &adam)
                      : which == 2 ? tsl_optimizer_create_adam(&opt, ctx, &adamw)
                                   : tsl_optimizer_create_sgd(&opt, ctx, &plain),
                      TSL_OK);
            Layout moved = l;
            moved.owners = tsl_owner_callback(reversed, nullptr);
            tsl_tensor_t p = make(l, seed + 10), g = make(moved, seed + 11);
            auto p0 = gather(p);
            std::vector<std::vector<double>> grads;
            for (int step = 0; step < 3; step++) {
                ASSERT_EQ(tsl_tensor_fill_normal(g, seed + 20 + step, 0.0, 1.0), TSL_OK);
                grads.push_back(gather(g));
                ASSERT_EQ(tsl_optimizer_step(opt, 1, &p, &g), TSL_OK)
                    << tsl_context_last_error(ctx);
            }
            int64_t steps = 0;
            tsl_optimizer_param_steps(opt, p, &steps);
            EXPECT_EQ(steps, 3);
            auto p3 = gather(p);
            if (rank == 0) {
                tsl_update_args a{};
                a.kind = which == 1 || which == 2 ? TSL_OPT_ADAM : TSL_OPT_SGD;
                a.dtype = TSL_F64;
                a.count = (int64_t)p0.size();
                a.sgd = which == 0 ? sgd : plain;
                a.adam = which == 1 ? adam : adamw;
                std::vector<double> want = p0, s0(p0.size(), 0), s1(p0.size(), 0);
                for (int step = 0; step < 3; step++) {
                    a.step = step + 1;
                    bool has_state0 = a.kind == TSL_OPT_ADAM || a.sgd.momentum > 0;
                    tsl_update(&a, want.data(), grads[step].data(),
                               has_state0 ? s0.data() : nullptr,
                               a.kind == TSL_OPT_ADAM ? s1.data() : nullptr);
                }
                EXPECT_EQ(p3, want) << l.name << " optimizer " << which;
                EXPECT_NE(p3, p0);
            }
            EXPECT_EQ(tsl_optimizer_destroy(opt), TSL_OK);
            tsl_tensor_destroy(p);
            tsl_tensor_destroy(g);
        }
    }
}

TEST(Optimizers, BadSettingsAndArgumentsAreErrors)
{
    tsl_optimizer_t opt = nullptr;
    tsl_sgd_config sgd;
    tsl_sgd_config_init(&sgd);
    sgd.lr = 0;
    EXPECT_EQ(tsl_optimizer_create_sgd(&opt, ctx, &sgd), TSL_ERR_INVALID_ARG);
    sgd.lr = 0.1;
    sgd.nesterov = 1; // without momentum
    EXPECT_EQ(tsl_optimizer_create_sgd(&opt, ctx, &sgd), TSL_ERR_INVALID_ARG);
    EXPECT_NE(std::strstr(tsl_last_error(), "Nesterov"), nullptr);
    sgd.nesterov = 0;
    sgd.dampening = 1.5;
    EXPECT_EQ(tsl_optimizer_create_sgd(&opt, ctx, &sgd), TSL_ERR_INVALID_ARG);
    tsl_adam_config adam;
    tsl_adam_config_init(&adam);
    adam.beta2 = 1.0;
    EXPECT_EQ(tsl_optimizer_create_adam(&opt, ctx, &adam), TSL_ERR_INVALID_ARG);
    adam.beta2 = 0.999;
    adam.eps = 0;
    EXPECT_EQ(tsl_optimizer_create_adam(&opt, ctx, &adam), TSL_ERR_INVALID_ARG);
    EXPECT_EQ(opt, nullptr);

    adam.eps = 1e-8;
    ASSERT_EQ(tsl_optimizer_create_adam(&opt, ctx, &adam), TSL_OK);
    auto ls = layouts();
    tsl_tensor_t p = make(ls[1], 1), g = make(ls[1], 2), other = make(ls[2], 3);
    tsl_tensor_t params[2] = {p, p}, grads[2] = {g, g};
    EXPECT_EQ(tsl_optimizer_step(opt, 2, params, grads), TSL_ERR_INVALID_ARG); // twice
    EXPECT_EQ(tsl_optimizer_step(opt, 1, &p, &other), TSL_ERR_SHAPE);          // grid differs
    EXPECT_EQ(tsl_optimizer_step(opt, 1, &p, &p), TSL_ERR_INVALID_ARG);
    EXPECT_EQ(tsl_optimizer_step(opt, 1, nullptr, nullptr), TSL_ERR_INVALID_ARG);
    EXPECT_EQ(tsl_optimizer_step(nullptr, 0, nullptr, nullptr), TSL_ERR_INVALID_ARG);
    int64_t steps = -1;
    EXPECT_EQ(tsl_optimizer_param_steps(opt, p, &steps), TSL_OK);
    EXPECT_EQ(steps, 0); // nothing ran
    EXPECT_EQ(tsl_activation_forward((tsl_activation)9, 0, p, g), TSL_ERR_INVALID_ARG);
    EXPECT_EQ(tsl_activation_forward(TSL_ACT_LEAKY_RELU, NAN, p, g), TSL_ERR_INVALID_ARG);
    EXPECT_EQ(tsl_activation_forward(TSL_ACT_RELU, 0, p, other), TSL_ERR_SHAPE);
    EXPECT_EQ(tsl_activation_backward(TSL_ACT_SIGMOID, 0, p, nullptr, g, g), TSL_ERR_INVALID_ARG);
    EXPECT_EQ(tsl_activation_backward(TSL_ACT_TANH, 0, nullptr, p, g, p), TSL_ERR_INVALID_ARG);
    tsl_tensor_t labels = nullptr;
    tsl_shape s = test_shape();
    ASSERT_EQ(tsl_tensor_create(&labels, ctx, TSL_I32, &s, &ls[1].grid, &ls[1].owners), TSL_OK);
    EXPECT_EQ(tsl_activation_forward(TSL_ACT_RELU, 0, labels, labels), TSL_ERR_DTYPE);
    EXPECT_EQ(tsl_optimizer_destroy(opt), TSL_OK);
    for (tsl_tensor_t t : {p, g, other, labels})
        tsl_tensor_destroy(t);
}

namespace
{

// Logits (N, C, spatial...) and labels tiled alike without C.
struct LossCase {
    std::string name;
    std::vector<int64_t> dims;   // logits
    std::vector<int32_t> splits; // logits grid (C never split)
};

} // namespace

TEST(Losses, CrossEntropyMseAndL1AreBitIdenticalOnEveryLayout)
{
    const LossCase cases[] = {
        {"classification", {12, 10}, {1, 1}},
        {"classification, samples split", {12, 10}, {4, 1}},
        {"segmentation 2-D", {3, 4, 9, 11}, {1, 1, 1, 1}},
        {"segmentation 2-D, space split", {3, 4, 9, 11}, {1, 1, 3, 2}},
        {"segmentation 3-D", {2, 3, 5, 6, 7}, {1, 1, 1, 1, 1}},
        {"segmentation 3-D, all split", {2, 3, 5, 6, 7}, {2, 1, 2, 3, 2}},
    };
    // Each shape starts with its one-tile case, which gives the reference values.
    double ref_ce = NAN, ref_mse = NAN, ref_l1 = NAN;
    std::vector<double> ref_grad, ref_mse_grad, ref_l1_grad;
    for (const LossCase &c : cases) {
        if (c.splits == std::vector<int32_t>(c.dims.size(), 1)) {
            ref_ce = NAN;
            ref_grad.clear();
        }
        for (int owners_kind = 0; owners_kind < 3; owners_kind++) { // 2: channels-last logits
            if (owners_kind == 2 && c.dims.size() < 3)
                continue; // channels-last needs spatial dimensions
            tsl_layout lay = owners_kind == 2 ? TSL_LAYOUT_CHANNELS_LAST : TSL_LAYOUT_PLAIN;
            tsl_owner_map own =
                owners_kind == 1 ? tsl_owner_callback(reversed, nullptr) : tsl_owner_block(nullptr);
            tsl_owner_map other = tsl_owner_block(nullptr);
            std::vector<int64_t> label_dims = c.dims;
            label_dims.erase(label_dims.begin() + 1);
            std::vector<int32_t> label_splits = c.splits;
            label_splits.erase(label_splits.begin() + 1);
            tsl_tensor_t x = make_tensor(TSL_F32, c.dims, c.splits, own, lay);
            tsl_tensor_t y = make_tensor(TSL_I32, label_dims, label_splits, other);
            tsl_tensor_t g = make_tensor(TSL_F32, c.dims, c.splits, other, lay);
            tsl_tensor_t t = make_tensor(TSL_F32, c.dims, c.splits, other, lay);
            ASSERT_EQ(tsl_tensor_fill_normal(x, seed + 30, 0.0, 2.0), TSL_OK);
            ASSERT_EQ(tsl_tensor_fill_uniform(y, seed + 31, 0.0, (double)c.dims[1]), TSL_OK);
            ASSERT_EQ(tsl_tensor_fill_normal(t, seed + 32, 0.0, 1.0), TSL_OK);
            double ce = NAN, ms = NAN;
            ASSERT_EQ(tsl_loss_cross_entropy(x, y, g, &ce), TSL_OK) << tsl_context_last_error(ctx);
            tsl_shape xs;
            tsl_tensor_shape(x, &xs);
            std::vector<float> grad(tsl_shape_numel(&xs), NAN);
            ASSERT_EQ(tsl_tensor_gather(g, 0, rank == 0 ? grad.data() : nullptr), TSL_OK);
            ASSERT_EQ(tsl_loss_mse(x, t, g, &ms), TSL_OK);
            std::vector<float> mgrad(grad.size(), NAN);
            ASSERT_EQ(tsl_tensor_gather(g, 0, rank == 0 ? mgrad.data() : nullptr), TSL_OK);
            ASSERT_EQ(tsl_tensor_fill_constant(g, -1e30), TSL_OK); // poison
            double l1 = NAN;
            ASSERT_EQ(tsl_loss_l1(x, t, g, &l1), TSL_OK);
            std::vector<float> lgrad(grad.size(), NAN), xs_host(grad.size()), ts_host(grad.size());
            ASSERT_EQ(tsl_tensor_gather(g, 0, rank == 0 ? lgrad.data() : nullptr), TSL_OK);
            ASSERT_EQ(tsl_tensor_gather(x, 0, rank == 0 ? xs_host.data() : nullptr), TSL_OK);
            ASSERT_EQ(tsl_tensor_gather(t, 0, rank == 0 ? ts_host.data() : nullptr), TSL_OK);
            if (rank == 0) { // against a reference in long double
                long double want = 0;
                const double n = (double)grad.size();
                for (size_t i = 0; i < grad.size(); i++) {
                    want += fabsl((long double)xs_host[i] - ts_host[i]);
                    float sgn = xs_host[i] > ts_host[i]   ? 1.0f
                                : xs_host[i] < ts_host[i] ? -1.0f
                                                          : 0.0f;
                    ASSERT_EQ(lgrad[i], (float)(sgn / n)) << c.name << " element " << i;
                }
                EXPECT_NEAR(l1, (double)(want / n), 1e-12 * (double)(want / n)) << c.name;
            }
            EXPECT_TRUE(std::isfinite(ce) && ce > 0) << c.name;
            double lo = ce, hi = ce;
            MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
            MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
            EXPECT_EQ(lo, hi) << "ranks disagree on the loss";
            if (std::isnan(ref_ce)) {
                ref_ce = ce;
                ref_mse = ms;
                ref_l1 = l1;
                ref_l1_grad.assign(lgrad.begin(), lgrad.end());
                ref_grad.assign(grad.begin(), grad.end());
                ref_mse_grad.assign(mgrad.begin(), mgrad.end());
            } else {
                EXPECT_EQ(ce, ref_ce) << c.name << " owners " << owners_kind;
                EXPECT_EQ(ms, ref_mse) << c.name << " owners " << owners_kind;
                EXPECT_EQ(l1, ref_l1) << c.name << " owners " << owners_kind;
                if (rank == 0) {
                    EXPECT_EQ(std::vector<double>(grad.begin(), grad.end()), ref_grad) << c.name;
                    EXPECT_EQ(std::vector<double>(mgrad.begin(), mgrad.end()), ref_mse_grad)
                        << c.name;
                    EXPECT_EQ(std::vector<double>(lgrad.begin(), lgrad.end()), ref_l1_grad)
                        << c.name;
                }
            }
            for (tsl_tensor_t z : {x, y, g, t})
                tsl_tensor_destroy(z);
        }
    }
}

// Accuracy counts on every tiling equal a count over the gathered logits made here: the first
// maximum over classes against the label, with ties (rounded logits) in the data.
TEST(Losses, ArgmaxHitsMatchACountOfTheWholeArray)
{
    const LossCase cases[] = {
        {"classification, samples split", {12, 5}, {4, 1}},
        {"segmentation 2-D, space split", {3, 4, 9, 11}, {1, 1, 3, 2}},
        {"segmentation 3-D, all split", {2, 3, 5, 6, 7}, {2, 1, 2, 3, 2}},
    };
    for (const LossCase &c : cases) {
        SCOPED_TRACE(c.name);
        tsl_owner_map own = tsl_owner_callback(reversed, nullptr), other = tsl_owner_block(nullptr);
        std::vector<int64_t> label_dims = c.dims;
        label_dims.erase(label_dims.begin() + 1);
        std::vector<int32_t> label_splits = c.splits;
        label_splits.erase(label_splits.begin() + 1);
        tsl_tensor_t x = make_tensor(TSL_F32, c.dims, c.splits, own);
        tsl_tensor_t y = make_tensor(TSL_I64, label_dims, label_splits, other);
        tsl_shape xs;
        tsl_tensor_shape(x, &xs);
        int64_t n = tsl_shape_numel(&xs), C = c.dims[1], inner = n / c.dims[0] / C;
        std::vector<float> xv((size_t)n);
        std::vector<int64_t> yv((size_t)(n / C));
        std::mt19937_64 gen(seed + 130);
        for (float &v : xv)
            v = (float)(gen() % 4); // few values: many ties
        // The first maximum of every position, counted here; a third of the labels are
        // set to it and a third to another class, so the count is neither 0 nor all.
        std::vector<int64_t> best((size_t)(n / C));
        for (int64_t s = 0; s < c.dims[0]; s++)
            for (int64_t p = 0; p < inner; p++) {
                int64_t b = 0;
                for (int64_t k = 1; k < C; k++)
                    if (xv[(size_t)((s * C + k) * inner + p)] >
                        xv[(size_t)((s * C + b) * inner + p)])
                        b = k;
                best[(size_t)(s * inner + p)] = b;
            }
        for (size_t i = 0; i < yv.size(); i++) {
            uint64_t r = gen() % (uint64_t)C;
            yv[i] = i % 3 == 0 ? best[i] : i % 3 == 1 ? (best[i] + 1) % C : (int64_t)r;
        }
        ASSERT_EQ(tsl_tensor_scatter(x, 0, rank == 0 ? xv.data() : nullptr), TSL_OK);
        ASSERT_EQ(tsl_tensor_scatter(y, 0, rank == 0 ? yv.data() : nullptr), TSL_OK);
        int64_t want = 0;
        for (size_t i = 0; i < yv.size(); i++)
            want += best[i] == yv[i];
        int64_t hits = -1;
        ASSERT_EQ(tsl_argmax_hits(x, y, &hits), TSL_OK) << tsl_context_last_error(ctx);
        EXPECT_EQ(hits, want);
        EXPECT_GE(want, (int64_t)(yv.size() + 2) / 3);
        EXPECT_LT(want, (int64_t)yv.size());
        yv[0] = C; // a bad label
        ASSERT_EQ(tsl_tensor_scatter(y, 0, rank == 0 ? yv.data() : nullptr), TSL_OK);
        EXPECT_EQ(tsl_argmax_hits(x, y, &hits), TSL_ERR_INVALID_ARG);
        tsl_tensor_destroy(x);
        tsl_tensor_destroy(y);
    }
}

TEST(Losses, BadLabelsAndLayoutsAreErrorsOnEveryRank)
{
    tsl_owner_map own = tsl_owner_block(nullptr);
    tsl_tensor_t x = make_tensor(TSL_F64, {8, 5}, {2, 1}, own);
    tsl_tensor_t y = make_tensor(TSL_I64, {8}, {2}, own);
    tsl_tensor_t y_other_grid = make_tensor(TSL_I64, {8}, {4}, own);
    tsl_tensor_t x_split_c = make_tensor(TSL_F64, {8, 5}, {2, 5}, own);
    tsl_tensor_t y_float = make_tensor(TSL_F64, {8}, {2}, own);
    ASSERT_EQ(tsl_tensor_fill_normal(x, 1, 0, 1), TSL_OK);
    ASSERT_EQ(tsl_tensor_fill_constant(y, 5), TSL_OK); // class 5 of 5: out of range
    double loss = 0;
    EXPECT_EQ(tsl_loss_cross_entropy(x, y, nullptr, &loss), TSL_ERR_INVALID_ARG);
    EXPECT_NE(std::strstr(tsl_context_last_error(ctx), "8 labels outside [0, 5)"), nullptr)
        << tsl_context_last_error(ctx);
    ASSERT_EQ(tsl_tensor_fill_constant(y, 4), TSL_OK);
    EXPECT_EQ(tsl_loss_cross_entropy(x, y, nullptr, &loss), TSL_OK);
    EXPECT_EQ(tsl_loss_cross_entropy(x, y_other_grid, nullptr, &loss), TSL_ERR_SHAPE);
    EXPECT_EQ(tsl_loss_cross_entropy(x_split_c, y, nullptr, &loss), TSL_ERR_SHAPE);
    EXPECT_EQ(tsl_loss_cross_entropy(x, y_float, nullptr, &loss), TSL_ERR_DTYPE);
    EXPECT_EQ(tsl_loss_cross_entropy(x, y, x, &loss), TSL_ERR_INVALID_ARG);
    EXPECT_EQ(tsl_loss_cross_entropy(x, y, nullptr, nullptr), TSL_ERR_INVALID_ARG);
    EXPECT_EQ(tsl_loss_mse(x, x_split_c, nullptr, &loss), TSL_ERR_SHAPE);
    for (tsl_tensor_t t : {x, y, y_other_grid, x_split_c, y_float})
        tsl_tensor_destroy(t);
}

TEST(Linear, EveryTilingMatchesOneTileWithinRounding)
{
    const int64_t n = 23, k = 17, o = 9;
    tsl_owner_map block = tsl_owner_block(nullptr), rev = tsl_owner_callback(reversed, nullptr),
                  last = tsl_owner_single(size - 1);
    std::vector<double> ref_y, ref_dx, ref_dw, ref_db;
    // dw one tile (a partial per sample tile, then a tree) or cut into 3 row blocks (per block
    // and rank, one task adding that rank's sample tiles, then a tree across ranks).
    for (int32_t splits : {1, 2, 3, 5, 23}) {
        for (int32_t wsplit : {1, 3})
            for (int owners = 0; owners < 2; owners++) {
                const tsl_owner_map &rows = owners ? rev : block;
                tsl_tensor_t x = make_tensor(TSL_F64, {n, k}, {splits, 1}, rows);
                tsl_tensor_t y = make_tensor(TSL_F64, {n, o}, {splits, 1}, block);
                tsl_tensor_t dy = make_tensor(TSL_F64, {n, o}, {splits, 1}, rev);
                tsl_tensor_t dx = make_tensor(TSL_F64, {n, k}, {splits, 1}, block);
                tsl_tensor_t w = make_tensor(TSL_F64, {o, k}, {1, 1}, last);
                tsl_tensor_t b = make_tensor(TSL_F64, {o}, {1}, block);
                tsl_tensor_t dw = make_tensor(TSL_F64, {o, k}, {wsplit, 1}, block);
                tsl_tensor_t db = make_tensor(TSL_F64, {o}, {1}, last);
                ASSERT_EQ(tsl_tensor_fill_normal(x, seed + 40, 0, 1), TSL_OK);
                ASSERT_EQ(tsl_tensor_fill_normal(w, seed + 41, 0, 1), TSL_OK);
                ASSERT_EQ(tsl_tensor_fill_normal(b, seed + 42, 0, 1), TSL_OK);
                ASSERT_EQ(tsl_tensor_fill_normal(dy, seed + 43, 0, 1), TSL_OK);
                ASSERT_EQ(tsl_tensor_fill_constant(dw, 1e9), TSL_OK); // poison: overwritten
                ASSERT_EQ(tsl_linear_forward(x, w, b, y), TSL_OK) << tsl_context_last_error(ctx);
                ASSERT_EQ(tsl_linear_backward(x, w, dy, dx, dw, db), TSL_OK)
                    << tsl_context_last_error(ctx);
                auto gy = gather(y), gdx = gather(dx), gdw = gather(dw), gdb = gather(db);
                if (splits == 1 && owners == 0 && wsplit == 1) {
                    // Independent reference for the one-tile run, from the gathered inputs.
                    auto gx = gather(x), gw = gather(w), gb = gather(b), gdy = gather(dy);
                    for (int64_t r = 0; rank == 0 && r < n; r++)
                        for (int64_t j = 0; j < o; j++) {
                            double want = gb[j];
                            for (int64_t q = 0; q < k; q++)
                                want += gx[r * k + q] * gw[j * k + q];
                            EXPECT_NEAR(gy[r * o + j], want, 1e-12);
                        }
                    for (int64_t j = 0; rank == 0 && j < o; j++) {
                        double sum = 0;
                        for (int64_t r = 0; r < n; r++)
                            sum += gdy[r * o + j];
                        EXPECT_NEAR(gdb[j], sum, 1e-12);
                        for (int64_t q = 0; q < k; q++) {
                            double want = 0;
                            for (int64_t r = 0; r < n; r++)
                                want += gdy[r * o + j] * gx[r * k + q];
                            EXPECT_NEAR(gdw[j * k + q], want, 1e-12);
                        }
                    }
                }
                if (rank == 0) {
                    if (ref_y.empty()) {
                        ref_y = gy;
                        ref_dx = gdx;
                        ref_dw = gdw;
                        ref_db = gdb;
                    } else {
                        auto near = [](const std::vector<double> &a, const std::vector<double> &b) {
                            double worst = 0;
                            for (size_t i = 0; i < a.size(); i++)
                                worst =
                                    std::max(worst, std::fabs(a[i] - b[i]) / (1 + std::fabs(b[i])));
                            return worst;
                        };
                        std::string at = std::to_string(splits) + " tiles, dw in " +
                                         std::to_string(wsplit) + " row blocks";
                        EXPECT_LT(near(gy, ref_y), 1e-13) << at;
                        EXPECT_LT(near(gdx, ref_dx), 1e-13) << at;
                        EXPECT_LT(near(gdw, ref_dw), 1e-13) << at;
                        EXPECT_LT(near(gdb, ref_db), 1e-13) << at;
                    }
                }
                for (tsl_tensor_t t : {x, y, dy, dx, w, b, dw, db})
                    tsl_tensor_destroy(t);
            }
    }
    // Bad layouts are errors before anything runs.
    tsl_tensor_t x = make_tensor(TSL_F64, {n, k}, {2, 1}, block);
    tsl_tensor_t xk = make_tensor(TSL_F64, {n, k}, {1, 2}, block);
    tsl_tensor_t w = make_tensor(TSL_F64, {o, k}, {1, 1}, block);
    tsl_tensor_t w2 = make_tensor(TSL_F64, {o, k}, {2, 1}, block);
    tsl_tensor_t y = make_tensor(TSL_F64, {n, o}, {3, 1}, block);
    tsl_tensor_t y2 = make_tensor(TSL_F64, {n, o}, {2, 1}, block);
    tsl_tensor_t wrong = make_tensor(TSL_F64, {o, k + 1}, {1, 1}, block);
    tsl_tensor_t bias = make_tensor(TSL_F64, {o}, {1}, block);
    EXPECT_EQ(tsl_linear_forward(x, w, nullptr, y), TSL_ERR_SHAPE); // N splits differ
    // K split: feature tiles (filters=/channels= plans) run in f32 only
    EXPECT_EQ(tsl_linear_forward(xk, w, nullptr, y2), TSL_ERR_DTYPE);
    EXPECT_EQ(tsl_linear_forward(x, w2, nullptr, y2), TSL_ERR_SHAPE); // weights tiled
    EXPECT_EQ(tsl_linear_forward(x, wrong, nullptr, y2), TSL_ERR_SHAPE);
    EXPECT_EQ(tsl_linear_forward(x, w, nullptr, y2), TSL_OK);
    EXPECT_EQ(tsl_linear_backward(x, w, y2, nullptr, nullptr, bias), TSL_ERR_INVALID_ARG);
    EXPECT_NE(std::strstr(tsl_context_last_error(ctx), "db needs dw"), nullptr);
    EXPECT_EQ(tsl_linear_backward(x, w, y2, nullptr, w, w), TSL_ERR_SHAPE); // db not a vector
    EXPECT_EQ(tsl_linear_backward(x, w, y2, x, nullptr, nullptr), TSL_ERR_INVALID_ARG);
    tsl_tensor_t wk = make_tensor(TSL_F64, {o, k}, {1, 2}, block); // dw cut along columns
    EXPECT_EQ(tsl_linear_backward(x, w, y2, nullptr, wk, nullptr), TSL_ERR_SHAPE);
    EXPECT_NE(std::strstr(tsl_context_last_error(ctx), "rows only"), nullptr);
    for (tsl_tensor_t t : {x, xk, w, w2, y, y2, wrong, bias, wk})
        tsl_tensor_destroy(t);
}

// A copy that needs only part of a tile on another rank cuts that part out where the tile
// lives, so only the part crosses: splitting one channel group of a tile off to another rank
// sends that group's bytes (StarPU-MPI's counts), not the whole tile.
TEST(Plumbing, PartsOfRemoteTilesMoveAlone)
{
    const int64_t N = 2, C = 6, H = 8, W = 8;
    tsl_owner_map first = tsl_owner_single(0), last = tsl_owner_single(size - 1);
    for (tsl_layout lay : {TSL_LAYOUT_PLAIN, TSL_LAYOUT_CHANNELS_LAST}) {
        tsl_tensor_t whole = make_tensor(TSL_F64, {N, C, H, W}, {}, first, lay);
        tsl_tensor_t parts[3];
        for (int k = 0; k < 3; k++)
            parts[k] = make_tensor(TSL_F64, {N, 2, H, W}, {}, k == 1 ? last : first, lay);
        ASSERT_EQ(tsl_tensor_fill_uniform(whole, seed + 130, -1, 1), TSL_OK);
        ASSERT_EQ(tsl_context_wait(ctx), TSL_OK);
        int64_t sent0, recv0, sent1, recv1;
        ASSERT_EQ(tsl_context_comm_bytes(ctx, &sent0, &recv0), TSL_OK);
        ASSERT_EQ(tsl_split_channels(whole, 3, parts), TSL_OK) << tsl_context_last_error(ctx);
        ASSERT_EQ(tsl_context_wait(ctx), TSL_OK);
        ASSERT_EQ(tsl_context_comm_bytes(ctx, &sent1, &recv1), TSL_OK);
        int64_t mine = sent1 - sent0, total = 0;
        MPI_Allreduce(&mine, &total, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
        EXPECT_EQ(total, size == 1 ? 0 : N * 2 * H * W * 8) << "layout " << lay;
        auto g = gather(whole), g1 = gather(parts[1]);
        for (int64_t n = 0; rank == 0 && n < N; n++)
            for (int64_t c = 0; c < 2; c++)
                for (int64_t i = 0; i < H * W; i++)
                    ASSERT_EQ(g1[(n * 2 + c) * H * W + i], g[(n * C + 2 + c) * H * W + i]);
        tsl_tensor_destroy(whole);
        for (tsl_tensor_t t : parts)
            tsl_tensor_destroy(t);
    }
}

TEST(Plumbing, ConcatSplitAndReshapeAreExactOnEveryLayout)
{
    tsl_owner_map block = tsl_owner_block(nullptr), rev = tsl_owner_callback(reversed, nullptr);
    const int64_t channels[3] = {2, 3, 1};
    const std::vector<std::vector<int32_t>> part_grids = {{1, 1, 1, 1}, {2, 1, 3, 1}, {4, 2, 1, 5}};
    const std::vector<std::vector<int32_t>> whole_grids = {
        {1, 1, 1, 1}, {2, 3, 2, 2}, {1, 6, 1, 1}};
    for (size_t pg = 0; pg < part_grids.size(); pg++) {
        for (size_t wg = 0; wg < whole_grids.size(); wg++) {
            tsl_tensor_t parts[3], back[3];
            std::vector<std::vector<double>> host(3);
            for (int k = 0; k < 3; k++) {
                std::vector<int32_t> g = part_grids[pg];
                g[1] = (int32_t)std::min<int64_t>(g[1], channels[k]);
                parts[k] = make_tensor(TSL_F64, {4, channels[k], 6, 5}, g, k % 2 ? rev : block);
                back[k] = make_tensor(TSL_F64, {4, channels[k], 6, 5}, g, k % 2 ? block : rev);
                ASSERT_EQ(tsl_tensor_fill_normal(parts[k], seed + 50 + k, 0, 1), TSL_OK);
                ASSERT_EQ(tsl_tensor_fill_constant(back[k], -99.0), TSL_OK);
                host[k] = gather(parts[k]);
            }
            tsl_tensor_t whole = make_tensor(TSL_F64, {4, 6, 6, 5}, whole_grids[wg], rev);
            ASSERT_EQ(tsl_tensor_fill_constant(whole, 77.0), TSL_OK); // poison
            ASSERT_EQ(tsl_concat_channels(3, parts, whole), TSL_OK) << tsl_context_last_error(ctx);
            ASSERT_EQ(tsl_split_channels(whole, 3, back), TSL_OK);
            auto got = gather(whole);
            if (rank == 0) {
                for (int64_t n = 0; n < 4; n++)
                    for (int64_t c = 0, k = 0, base = 0; c < 6; c++) {
                        if (c - base == channels[k])
                            base += channels[k++];
                        for (int64_t i = 0; i < 30; i++)
                            ASSERT_EQ(got[(n * 6 + c) * 30 + i],
                                      host[k][(n * channels[k] + c - base) * 30 + i])
                                << "grids " << pg << "/" << wg;
                    }
            }
            for (int k = 0; k < 3; k++) {
                auto again = gather(back[k]);
                if (rank == 0)
                    EXPECT_EQ(again, host[k]) << "split " << k;
                tsl_tensor_destroy(parts[k]);
                tsl_tensor_destroy(back[k]);
            }
            tsl_tensor_destroy(whole);
        }
    }
    for (int32_t splits : {1, 2, 3}) {
        tsl_tensor_t image = make_tensor(TSL_F64, {6, 2, 3, 4}, {splits, 1, 1, 1}, block);
        tsl_tensor_t flat = make_tensor(TSL_F64, {6, 24}, {splits, 1}, rev);
        tsl_tensor_t again = make_tensor(TSL_F64, {6, 2, 3, 4}, {splits, 1, 1, 1}, block);
        ASSERT_EQ(tsl_tensor_fill_uniform(image, seed + 60, -1, 1), TSL_OK);
        ASSERT_EQ(tsl_reshape_samples(image, flat), TSL_OK) << tsl_context_last_error(ctx);
        ASSERT_EQ(tsl_reshape_samples(flat, again), TSL_OK);
        auto a = gather(image), b = gather(flat), c = gather(again);
        if (rank == 0) {
            EXPECT_EQ(a, b);
            EXPECT_EQ(a, c);
        }
        for (tsl_tensor_t t : {image, flat, again})
            tsl_tensor_destroy(t);
    }
    tsl_tensor_t a = make_tensor(TSL_F64, {4, 2, 6}, {1, 1, 1}, block);
    tsl_tensor_t b = make_tensor(TSL_F64, {4, 2, 5}, {1, 1, 1}, block);
    tsl_tensor_t ab = make_tensor(TSL_F64, {4, 4, 6}, {1, 1, 1}, block);
    tsl_tensor_t flat = make_tensor(TSL_F64, {4, 12}, {1, 2}, block);
    tsl_tensor_t pair[2] = {a, b}, twice[2] = {a, a}, self[2] = {a, ab};
    EXPECT_EQ(tsl_concat_channels(2, pair, ab), TSL_ERR_SHAPE);       // spatial sizes differ
    EXPECT_EQ(tsl_concat_channels(2, twice, ab), TSL_OK);             // a twice is fine
    EXPECT_EQ(tsl_concat_channels(2, self, ab), TSL_ERR_INVALID_ARG); // dst among sources
    EXPECT_EQ(tsl_concat_channels(1, twice, ab), TSL_ERR_SHAPE);      // channels do not add up
    EXPECT_EQ(tsl_reshape_samples(a, flat), TSL_ERR_SHAPE);           // flat cut along features
    for (tsl_tensor_t t : {a, b, ab, flat})
        tsl_tensor_destroy(t);
}

TEST(BatchNorm, TrainingForwardAndBackwardAreBitIdenticalOnEveryLayout)
{
    const std::vector<int64_t> dims = {4, 6, 7, 5};
    const std::vector<std::vector<int32_t>> grids = {
        {1, 1, 1, 1}, {2, 1, 1, 1}, {1, 1, 3, 2}, {2, 3, 2, 1}, {4, 2, 3, 2}};
    tsl_owner_map block = tsl_owner_block(nullptr), rev = tsl_owner_callback(reversed, nullptr),
                  last = tsl_owner_single(size - 1);
    std::vector<std::vector<double>> ref;
    for (size_t gi = 0; gi < grids.size(); gi++) {
        for (int owners = 0; owners < 3; owners++) { // plain x 2 owner maps, channels-last
            const tsl_owner_map &xo = owners == 1 ? rev : block;
            tsl_layout lay = owners == 2 ? TSL_LAYOUT_CHANNELS_LAST : TSL_LAYOUT_PLAIN;
            tsl_tensor_t x = make_tensor(TSL_F64, dims, grids[gi], xo, lay);
            tsl_tensor_t y = make_tensor(TSL_F64, dims, grids[gi], block, lay);
            tsl_tensor_t dy = make_tensor(TSL_F64, dims, grids[gi], rev, lay);
            tsl_tensor_t dx = make_tensor(TSL_F64, dims, grids[gi], xo, lay);
            tsl_tensor_t gamma = make_tensor(TSL_F64, {6}, {1}, last);
            tsl_tensor_t beta = make_tensor(TSL_F64, {6}, {1}, block);
            tsl_tensor_t rm = make_tensor(TSL_F64, {6}, {1}, owners ? last : block);
            tsl_tensor_t rv = make_tensor(TSL_F64, {6}, {1}, block);
            tsl_tensor_t saved = make_tensor(TSL_F64, {2, 6}, {1, 1}, last);
            tsl_tensor_t dg = make_tensor(TSL_F64, {6}, {1}, block);
            tsl_tensor_t db = make_tensor(TSL_F64, {6}, {1}, last);
            tsl_tensor_t yi = make_tensor(TSL_F64, dims, grids[gi], rev, lay);
            ASSERT_EQ(tsl_tensor_fill_normal(x, seed + 70, 3.0, 2.0), TSL_OK);
            ASSERT_EQ(tsl_tensor_fill_normal(dy, seed + 71, 0.0, 1.0), TSL_OK);
            ASSERT_EQ(tsl_tensor_fill_uniform(gamma, seed + 72, 0.5, 1.5), TSL_OK);
            ASSERT_EQ(tsl_tensor_fill_uniform(beta, seed + 73, -1, 1), TSL_OK);
            ASSERT_EQ(tsl_tensor_fill_constant(rv, 1.0), TSL_OK);
            for (int step = 0; step < 2; step++) // running statistics move twice
                ASSERT_EQ(tsl_batchnorm_forward_train(x, gamma, beta, rm, rv, saved, y, 1e-5, 0.1),
                          TSL_OK)
                    << tsl_context_last_error(ctx);
            ASSERT_EQ(tsl_batchnorm_backward(x, dy, gamma, saved, dx, dg, db), TSL_OK)
                << tsl_context_last_error(ctx);
            ASSERT_EQ(tsl_batchnorm_forward_infer(x, gamma, beta, rm, rv, yi, 1e-5), TSL_OK);
            std::vector<std::vector<double>> got = {gather(y),  gather(saved), gather(rm),
                                                    gather(rv), gather(dx),    gather(dg),
                                                    gather(db), gather(yi)};
            auto gx = gather(x), gdy = gather(dy), gg = gather(gamma), gbeta = gather(beta);
            if (rank == 0) {
                if (ref.empty()) {
                    // The one-tile run against statistics computed here from x and dy.
                    for (int64_t c = 0; c < 6; c++) {
                        long double mean = 0, var = 0, sdy = 0, sdyx = 0;
                        auto at = [&](int64_t n, int64_t i) { return (n * 6 + c) * 35 + i; };
                        for (int64_t n = 0; n < 4; n++)
                            for (int64_t i = 0; i < 35; i++)
                                mean += gx[at(n, i)];
                        mean /= 140;
                        for (int64_t n = 0; n < 4; n++)
                            for (int64_t i = 0; i < 35; i++)
                                var += (gx[at(n, i)] - mean) * (gx[at(n, i)] - mean);
                        var /= 140;
                        long double invstd = 1 / std::sqrt(var + 1e-5L);
                        for (int64_t n = 0; n < 4; n++)
                            for (int64_t i = 0; i < 35; i++) {
                                sdy += gdy[at(n, i)];
                                sdyx += gdy[at(n, i)] * (gx[at(n, i)] - mean) * invstd;
                                EXPECT_NEAR(
                                    got[0][at(n, i)],
                                    (double)((gx[at(n, i)] - mean) * invstd * gg[c] + gbeta[c]),
                                    1e-12);
                            }
                        EXPECT_NEAR(got[1][c], (double)mean, 1e-13);
                        EXPECT_NEAR(got[1][6 + c], (double)invstd, 1e-12);
                        // Two steps from (0, 1) with momentum 0.1, unbiased variance.
                        EXPECT_NEAR(got[2][c], (double)(0.19L * mean), 1e-13);
                        EXPECT_NEAR(got[3][c], (double)(0.81L + 0.19L * var * 140 / 139), 1e-12);
                        EXPECT_NEAR(got[5][c], (double)sdyx, 1e-11);
                        EXPECT_NEAR(got[6][c], (double)sdy, 1e-11);
                    }
                    ref = got;
                } else {
                    const char *names[8] = {"y",  "saved",  "running mean", "running var",
                                            "dx", "dgamma", "dbeta",        "inference y"};
                    for (int k = 0; k < 8; k++)
                        EXPECT_EQ(got[k], ref[k])
                            << names[k] << ", grid " << gi << ", owners " << owners;
                }
            }
            for (tsl_tensor_t t : {x, y, dy, dx, gamma, beta, rm, rv, saved, dg, db, yi})
                tsl_tensor_destroy(t);
        }
    }
}

namespace
{

// Collective gather of a tensor of any dtype to rank 0, as bytes (0xff where unwritten).
std::vector<unsigned char> gather_bytes(tsl_tensor_t t)
{
    tsl_shape s;
    tsl_tensor_shape(t, &s);
    tsl_dtype dt;
    tsl_tensor_dtype(t, &dt);
    std::vector<unsigned char> out((size_t)tsl_shape_numel(&s) * (dt == TSL_F32 ? 4 : 8), 0xff);
    EXPECT_EQ(tsl_tensor_gather(t, 0, rank == 0 ? out.data() : nullptr), TSL_OK);
    return out;
}

} // namespace

// Batch norm + ReLU fused, in float32 (vectorised exact sums: rows long enough for them on
// some tiles, not on others) and float64: every layout gives the one-tile bits, and those are
// the bits of batch norm, then ReLU, then their backwards, unfused.
// (Channels-last float32 tiles take the in-place per-channel sums, tsl_acc_add_columns_f32, and
// the block-masked backward sums; plain tiles and float64 the row sums.)
TEST(BatchNorm, FusedReluIsBitIdenticalOnEveryLayoutAndEqualsUnfused)
{
    const std::vector<int64_t> dims = {4, 5, 24, 20};
    const std::vector<std::vector<int32_t>> grids = {{1, 1, 1, 1}, {3, 1, 3, 2}, {2, 5, 2, 1}};
    tsl_owner_map block = tsl_owner_block(nullptr), rev = tsl_owner_callback(reversed, nullptr),
                  last = tsl_owner_single(size - 1);
    const char *names[7] = {"y", "saved", "running mean", "running var", "dx", "dgamma", "dbeta"};
    for (tsl_dtype dt : {TSL_F32, TSL_F64}) {
        std::vector<std::vector<unsigned char>> ref;
        for (size_t gi = 0; gi < grids.size(); gi++) {
            for (int owners = 0; owners < 3; owners++) { // plain x 2 owner maps, channels-last
                const tsl_owner_map &xo = owners == 1 ? rev : block;
                tsl_layout lay = owners == 2 ? TSL_LAYOUT_CHANNELS_LAST : TSL_LAYOUT_PLAIN;
                auto big = [&](const tsl_owner_map &o) {
                    return make_tensor(dt, dims, grids[gi], o, lay);
                };
                auto vec = [&](const tsl_owner_map &o) { return make_tensor(dt, {5}, {1}, o); };
                tsl_tensor_t x = big(xo), y = big(block), dy = big(rev), dx = big(xo);
                tsl_tensor_t z = big(rev), yz = big(block), dz = big(xo), dxz = big(block);
                tsl_tensor_t gamma = vec(last), beta = vec(block), dg = vec(block), db = vec(last);
                tsl_tensor_t rm = vec(owners ? last : block), rv = vec(block);
                tsl_tensor_t rmz = vec(last), rvz = vec(block), dgz = vec(last), dbz = vec(block);
                tsl_tensor_t saved = make_tensor(TSL_F64, {2, 5}, {1, 1}, last);
                tsl_tensor_t savedz = make_tensor(TSL_F64, {2, 5}, {1, 1}, block);
                ASSERT_EQ(tsl_tensor_fill_normal(x, seed + 80, 0.5, 2.0), TSL_OK);
                ASSERT_EQ(tsl_tensor_fill_normal(dy, seed + 81, 0.0, 1.0), TSL_OK);
                ASSERT_EQ(tsl_tensor_fill_uniform(gamma, seed + 82, 0.5, 1.5), TSL_OK);
                ASSERT_EQ(tsl_tensor_fill_uniform(beta, seed + 83, -0.5, 0.5), TSL_OK);
                for (tsl_tensor_t t : {rv, rvz})
                    ASSERT_EQ(tsl_tensor_fill_constant(t, 1.0), TSL_OK);
                // The unfused ops are layout-independent (test above): compare them with the
                // fused ones on the most scattered layout.
                const bool with_unfused = gi + 1 == grids.size() && owners == 1;
                for (int step = 0; step < 2; step++) {
                    ASSERT_EQ(tsl_batchnorm_relu_forward_train(x, gamma, beta, rm, rv, saved, y,
                                                               1e-5, 0.1),
                              TSL_OK)
                        << tsl_context_last_error(ctx);
                    if (with_unfused)
                        ASSERT_EQ(tsl_batchnorm_forward_train(x, gamma, beta, rmz, rvz, savedz, z,
                                                              1e-5, 0.1),
                                  TSL_OK);
                }
                ASSERT_EQ(tsl_batchnorm_relu_backward(x, dy, gamma, beta, saved, dx, dg, db),
                          TSL_OK)
                    << tsl_context_last_error(ctx);
                std::vector<std::vector<unsigned char>> got = {
                    gather_bytes(y),  gather_bytes(saved), gather_bytes(rm), gather_bytes(rv),
                    gather_bytes(dx), gather_bytes(dg),    gather_bytes(db)};
                if (with_unfused) {
                    ASSERT_EQ(tsl_activation_forward(TSL_ACT_RELU, 0, z, yz), TSL_OK);
                    ASSERT_EQ(tsl_activation_backward(TSL_ACT_RELU, 0, z, nullptr, dy, dz), TSL_OK);
                    ASSERT_EQ(tsl_batchnorm_backward(x, dz, gamma, savedz, dxz, dgz, dbz), TSL_OK);
                    std::vector<std::vector<unsigned char>> unfused = {
                        gather_bytes(yz),  gather_bytes(savedz), gather_bytes(rmz),
                        gather_bytes(rvz), gather_bytes(dxz),    gather_bytes(dgz),
                        gather_bytes(dbz)};
                    for (int k = 0; rank == 0 && k < 7; k++)
                        EXPECT_EQ(got[k], unfused[k])
                            << names[k] << " fused vs unfused, dtype " << dt;
                }
                if (rank == 0) {
                    if (ref.empty()) {
                        // The ReLU masks a fair share of y, and outputs were all written.
                        size_t zeros = 0, n = got[0].size() / (dt == TSL_F32 ? 4 : 8);
                        for (size_t i = 0; i < n; i++) {
                            double v;
                            if (dt == TSL_F32) {
                                float f;
                                std::memcpy(&f, &got[0][4 * i], 4);
                                v = f;
                            } else {
                                std::memcpy(&v, &got[0][8 * i], 8);
                            }
                            ASSERT_FALSE(std::isnan(v)) << i;
                            zeros += v == 0;
                        }
                        EXPECT_GT(zeros, n / 5);
                        EXPECT_LT(zeros, n * 4 / 5);
                        ref = got;
                    } else {
                        for (int k = 0; k < 7; k++)
                            EXPECT_EQ(got[k], ref[k]) << names[k] << ", dtype " << dt << ", grid "
                                                      << gi << ", owners " << owners;
                    }
                }
                for (tsl_tensor_t t : {x,  y,  dy, dx, z,   yz,  dz,  dxz, gamma, beta,
                                       dg, db, rm, rv, rmz, rvz, dgz, dbz, saved, savedz})
                    tsl_tensor_destroy(t);
            }
        }
    }
}

TEST(BatchNorm, BadArgumentsAreErrors)
{
    tsl_owner_map block = tsl_owner_block(nullptr);
    tsl_tensor_t x = make_tensor(TSL_F64, {4, 3, 5}, {2, 1, 1}, block);
    tsl_tensor_t y = make_tensor(TSL_F64, {4, 3, 5}, {2, 1, 1}, block);
    tsl_tensor_t v3 = make_tensor(TSL_F64, {3}, {1}, block);
    tsl_tensor_t v4 = make_tensor(TSL_F64, {4}, {1}, block);
    tsl_tensor_t v3split = make_tensor(TSL_F64, {3}, {3}, block);
    tsl_tensor_t saved = make_tensor(TSL_F64, {2, 3}, {1, 1}, block);
    tsl_tensor_t saved_bad = make_tensor(TSL_F64, {3, 3}, {1, 1}, block);
    EXPECT_EQ(tsl_batchnorm_forward_train(x, v4, v3, v3, v3, saved, y, 1e-5, 0.1), TSL_ERR_SHAPE);
    EXPECT_EQ(tsl_batchnorm_forward_train(x, v3split, v3, v3, v3, saved, y, 1e-5, 0.1),
              TSL_ERR_SHAPE);
    EXPECT_EQ(tsl_batchnorm_forward_train(x, v3, v3, v3, v3, saved_bad, y, 1e-5, 0.1),
              TSL_ERR_SHAPE);
    EXPECT_EQ(tsl_batchnorm_forward_train(x, v3, v3, v3, v3, saved, y, 0.0, 0.1),
              TSL_ERR_INVALID_ARG);
    EXPECT_EQ(tsl_batchnorm_forward_train(x, v3, v3, v3, v3, saved, y, 1e-5, 1.5),
              TSL_ERR_INVALID_ARG);
    EXPECT_EQ(tsl_batchnorm_forward_train(x, v3, v3, v3, v3, saved, x, 1e-5, 0.1),
              TSL_ERR_INVALID_ARG);
    EXPECT_EQ(tsl_batchnorm_backward(x, y, v3, saved, x, nullptr, nullptr), TSL_ERR_INVALID_ARG);
    EXPECT_EQ(tsl_batchnorm_relu_forward_train(x, v3, v3, v3, v3, saved, x, 1e-5, 0.1),
              TSL_ERR_INVALID_ARG);
    EXPECT_EQ(tsl_batchnorm_relu_forward_train(x, v4, v3, v3, v3, saved, y, 1e-5, 0.1),
              TSL_ERR_SHAPE);
    tsl_tensor_t b3 = make_tensor(TSL_F64, {3}, {1}, block);
    // beta is needed, of C values, and may not receive dbeta.
    EXPECT_EQ(tsl_batchnorm_relu_backward(x, y, v3, nullptr, saved, nullptr, nullptr, nullptr),
              TSL_ERR_INVALID_ARG);
    EXPECT_EQ(tsl_batchnorm_relu_backward(x, y, v3, v4, saved, nullptr, nullptr, nullptr),
              TSL_ERR_SHAPE);
    EXPECT_EQ(tsl_batchnorm_relu_backward(x, y, v3, b3, saved, nullptr, nullptr, b3),
              TSL_ERR_INVALID_ARG);
    EXPECT_EQ(tsl_batchnorm_relu_backward(x, y, v3, b3, saved, x, nullptr, nullptr),
              TSL_ERR_INVALID_ARG);
    tsl_tensor_destroy(b3);
    for (tsl_tensor_t t : {x, y, v3, v4, v3split, saved, saved_bad})
        tsl_tensor_destroy(t);
}

TEST(Convolution, EverySampleTilingMatchesOneTile)
{
    tsl_owner_map block = tsl_owner_block(nullptr), rev = tsl_owner_callback(reversed, nullptr),
                  last = tsl_owner_single(size - 1);
    tsl_conv_params p;
    ASSERT_EQ(tsl_conv_params_init(&p, 2), TSL_OK);
    p.stride[0] = 2;
    p.padding[0] = 1;
    p.padding[1] = 2;
    p.dilation[1] = 2;
    p.groups = 2;
    const int64_t n = 6;
    std::vector<std::vector<float>> ref;
    for (int32_t splits : {1, 2, 3, 6}) {
        for (int owners = 0; owners < 2; owners++) {
            tsl_tensor_t x =
                make_tensor(TSL_F32, {n, 4, 11, 9}, {splits, 1, 1, 1}, owners ? rev : block);
            tsl_tensor_t w = make_tensor(TSL_F32, {6, 2, 3, 3}, {1, 1, 1, 1}, last);
            tsl_tensor_t b = make_tensor(TSL_F32, {6}, {1}, block);
            tsl_shape xs, ws, ys;
            tsl_tensor_shape(x, &xs);
            tsl_tensor_shape(w, &ws);
            ASSERT_EQ(tsl_conv_output_shape(&xs, &ws, &p, &ys), TSL_OK);
            std::vector<int64_t> yd(ys.dims, ys.dims + 4);
            tsl_tensor_t y = make_tensor(TSL_F32, yd, {splits, 1, 1, 1}, block);
            tsl_tensor_t dy = make_tensor(TSL_F32, yd, {splits, 1, 1, 1}, rev);
            tsl_tensor_t dx = make_tensor(TSL_F32, {n, 4, 11, 9}, {splits, 1, 1, 1}, block);
            tsl_tensor_t dw = make_tensor(TSL_F32, {6, 2, 3, 3}, {1, 1, 1, 1}, block);
            tsl_tensor_t db = make_tensor(TSL_F32, {6}, {1}, last);
            ASSERT_EQ(tsl_tensor_fill_uniform(x, seed + 80, -1, 1), TSL_OK);
            ASSERT_EQ(tsl_tensor_fill_uniform(w, seed + 81, -1, 1), TSL_OK);
            ASSERT_EQ(tsl_tensor_fill_uniform(b, seed + 82, -1, 1), TSL_OK);
            ASSERT_EQ(tsl_tensor_fill_uniform(dy, seed + 83, -1, 1), TSL_OK);
            ASSERT_EQ(tsl_tensor_fill_constant(dw, 1e6), TSL_OK); // poison
            ASSERT_EQ(tsl_conv_forward(&p, x, w, b, y), TSL_OK) << tsl_context_last_error(ctx);
            ASSERT_EQ(tsl_conv_backward(&p, x, w, dy, dx, dw, db), TSL_OK)
                << tsl_context_last_error(ctx);
            std::vector<std::vector<float>> got = gather_all({y, dx, dw, db});
            if (rank == 0) {
                if (ref.empty()) {
                    ref = got;
                } else {
                    // y and dx are per sample: the same oneDNN calls on fewer samples, so
                    // within rounding; dw and db add per-tile partials in another order.
                    const char *names[4] = {"y", "dx", "dw", "db"};
                    for (int k = 0; k < 4; k++)
                        EXPECT_LT(max_rel_diff(got[k], ref[k]), 1e-5)
                            << names[k] << ", " << splits << " tiles";
                }
            }
            for (tsl_tensor_t t : {x, w, b, y, dy, dx, dw, db})
                tsl_tensor_destroy(t);
        }
    }
}

// One spatial convolution case: x of `xdims` cut by `splits`, kernel k, stride, padding and
// dilation per dimension (the same along every spatial dimension).
struct SpatialCase {
    std::vector<int64_t> xdims;
    std::vector<int32_t> splits;
    int64_t cout, k, stride, padding, dilation, groups;
    tsl_layout layout;
    int transposed;   // then output padding = stride - 1
    int32_t mode = 0; // a tsl_padding_mode
};

// A layer's inputs x, w, b and dy random (seeds from `at`), its outputs poisoned.
static void fill_layer(tsl_tensor_t x, tsl_tensor_t w, tsl_tensor_t b, tsl_tensor_t dy,
                       std::initializer_list<tsl_tensor_t> outputs, uint64_t at)
{
    int k = 0;
    for (tsl_tensor_t t : {x, w, b, dy})
        EXPECT_EQ(tsl_tensor_fill_uniform(t, at + (uint64_t)k++, -1, 1), TSL_OK);
    for (tsl_tensor_t t : outputs)
        EXPECT_EQ(tsl_tensor_fill_constant(t, 1e6), TSL_OK); // poison
}

// Forward and backward of a convolution (transposed or not) on x, w, b and dy into y, dx, dw and
// db; those four gathered on rank 0, and every tensor destroyed.
static std::vector<std::vector<float>> conv_layer_results(const tsl_conv_params &p, bool transposed,
                                                          tsl_tensor_t x, tsl_tensor_t w,
                                                          tsl_tensor_t b, tsl_tensor_t dy,
                                                          tsl_tensor_t y, tsl_tensor_t dx,
                                                          tsl_tensor_t dw, tsl_tensor_t db)
{
    EXPECT_EQ((transposed ? tsl_conv_transpose_forward : tsl_conv_forward)(&p, x, w, b, y), TSL_OK)
        << tsl_context_last_error(ctx);
    EXPECT_EQ(
        (transposed ? tsl_conv_transpose_backward : tsl_conv_backward)(&p, x, w, dy, dx, dw, db),
        TSL_OK)
        << tsl_context_last_error(ctx);
    std::vector<std::vector<float>> got = gather_all({y, dx, dw, db});
    for (tsl_tensor_t t : {x, dx, w, dw, b, db, y, dy})
        tsl_tensor_destroy(t);
    return got;
}

// y, dx, dw and db of a convolution on tensors cut by `splits`, gathered on rank 0.
static std::vector<std::vector<float>> conv_results(const SpatialCase &c,
                                                    const std::vector<int32_t> &splits,
                                                    const tsl_owner_map &xo,
                                                    const tsl_owner_map &yo)
{
    int sp = (int)c.xdims.size() - 2;
    tsl_conv_params p;
    EXPECT_EQ(tsl_conv_params_init(&p, sp), TSL_OK);
    for (int d = 0; d < sp; d++) {
        p.stride[d] = c.stride;
        p.padding[d] = c.padding;
        p.dilation[d] = c.dilation;
    }
    p.groups = c.groups;
    p.padding_mode = c.mode;
    if (c.transposed)
        for (int d = 0; d < sp; d++)
            p.output_padding[d] = c.stride - 1;
    std::vector<int64_t> wd = {c.cout, c.xdims[1] / c.groups};
    if (c.transposed)
        wd = {c.xdims[1], c.cout / c.groups};
    for (int d = 0; d < sp; d++)
        wd.push_back(c.k);
    tsl_owner_map last = tsl_owner_single(size - 1);
    tsl_tensor_t x = make_tensor(TSL_F32, c.xdims, splits, xo, c.layout);
    tsl_tensor_t dx = make_tensor(TSL_F32, c.xdims, splits, xo, c.layout);
    tsl_tensor_t w = make_tensor(TSL_F32, wd, {}, last);
    tsl_tensor_t dw = make_tensor(TSL_F32, wd, {}, last);
    tsl_tensor_t b = make_tensor(TSL_F32, {c.cout}, {}, last);
    tsl_tensor_t db = make_tensor(TSL_F32, {c.cout}, {}, tsl_owner_single(0));
    tsl_shape xs, ws, ys;
    tsl_tensor_shape(x, &xs);
    tsl_tensor_shape(w, &ws);
    EXPECT_EQ(c.transposed ? tsl_conv_transpose_output_shape(&xs, &ws, &p, &ys)
                           : tsl_conv_output_shape(&xs, &ws, &p, &ys),
              TSL_OK);
    std::vector<int64_t> yd(ys.dims, ys.dims + ys.ndim);
    tsl_tensor_t y = make_tensor(TSL_F32, yd, splits, yo, c.layout);
    tsl_tensor_t dy = make_tensor(TSL_F32, yd, splits, yo, c.layout);
    fill_layer(x, w, b, dy, {y, dx, dw, db}, seed + 100); // poison: every output written
    return conv_layer_results(p, c.transposed, x, w, b, dy, y, dx, dw, db);
}

// Spatial tiles with halo exchange give the one-tile result: 1-D, 2-D and 3-D rank grids,
// even and uneven tiles, kernels 1, 3 and 5, stride 1 and 2, padding 0, 1 and 2, dilation,
// groups, both layouts; tiles dealt to ranks in blocks and, for the output, in reverse (so
// halos and results cross ranks).
TEST(Convolution, SpatialTilesMatchOneTile)
{
    const tsl_layout P = TSL_LAYOUT_PLAIN, CL = TSL_LAYOUT_CHANNELS_LAST;
    std::vector<SpatialCase> cases = {
        {{2, 3, 23}, {1, 1, 3}, 4, 3, 1, 1, 1, 1, P},
        {{2, 3, 23}, {1, 1, 4}, 4, 5, 2, 2, 1, 1, P},
        {{2, 3, 24}, {2, 1, 4}, 4, 3, 2, 0, 2, 1, P},
        {{2, 4, 17}, {1, 1, 3}, 4, 1, 1, 0, 1, 2, CL},
        {{3, 2, 13, 11}, {1, 1, 2, 3}, 5, 3, 1, 1, 1, 1, P},
        {{2, 2, 14, 12}, {2, 1, 2, 2}, 3, 5, 1, 2, 1, 1, CL},
        {{2, 4, 15, 9}, {1, 1, 3, 2}, 4, 3, 2, 1, 1, 4, P},
        {{2, 3, 12, 13}, {1, 1, 2, 2}, 2, 5, 2, 0, 1, 1, P},
        {{1, 2, 9, 8, 7}, {1, 1, 2, 2, 2}, 3, 3, 1, 1, 1, 1, P},
        {{2, 2, 10, 9, 8}, {1, 1, 2, 1, 3}, 2, 3, 2, 2, 2, 1, CL},
        // transposed: the U-Net up-path (k2 s2), k3 s2 p1 with output padding, k1 s2, k5 s1 p2,
        // dilation
        {{2, 3, 9}, {1, 1, 3}, 4, 2, 2, 0, 1, 1, P, 1},
        {{2, 3, 10}, {1, 1, 4}, 2, 3, 2, 1, 1, 1, P, 1},
        {{1, 2, 7}, {1, 1, 3}, 2, 1, 2, 0, 1, 1, P, 1},
        {{1, 2, 11}, {1, 1, 2}, 3, 5, 1, 2, 2, 1, CL, 1},
        {{2, 4, 7, 6}, {1, 1, 2, 3}, 4, 2, 2, 0, 1, 2, P, 1},
        {{1, 2, 6, 7}, {1, 1, 3, 2}, 3, 3, 2, 1, 1, 1, CL, 1},
        {{1, 2, 5, 4, 6}, {1, 1, 2, 2, 2}, 2, 2, 2, 0, 1, 1, P, 1},
        {{1, 2, 5, 6, 4}, {1, 1, 2, 2, 2}, 2, 3, 1, 1, 1, 1, P, 1},
    };
    tsl_owner_map block = tsl_owner_block(nullptr), rev = tsl_owner_callback(reversed, nullptr),
                  root = tsl_owner_single(0);
    for (size_t n = 0; n < cases.size(); n++) {
        const SpatialCase &c = cases[n];
        SCOPED_TRACE("case " + std::to_string(n));
        std::vector<std::vector<float>> ref = conv_results(c, {}, root, root);
        std::vector<std::vector<float>> got = conv_results(c, c.splits, block, rev);
        if (rank == 0) {
            // y and dx element by element. dw and db sum n = N x output positions terms of
            // magnitude up to 1 in another order on other tiles: float32's rounding of such a
            // sum grows as sqrt(n) times its partial sums, so their error is measured against
            // max(largest value, sqrt(n)) (one position lost or doubled is off by far more).
            const double n = (double)got[0].size() / (double)got[3].size();
            auto summed_diff = [n](const std::vector<float> &g, const std::vector<float> &r) {
                double worst = 0, scale = std::sqrt(n);
                for (size_t i = 0; i < r.size() && g.size() == r.size(); i++) {
                    worst = std::max(worst, (double)std::fabs(g[i] - r[i]));
                    scale = std::max(scale, (double)std::fabs(r[i]));
                }
                return g.size() == r.size() ? worst / scale : INFINITY;
            };
            EXPECT_LT(max_rel_diff(got[0], ref[0]), 1e-5) << "y";
            EXPECT_LT(max_rel_diff(got[1], ref[1]), 1e-5) << "dx";
            EXPECT_LT(summed_diff(got[2], ref[2]), 1e-5) << "dw";
            EXPECT_LT(summed_diff(got[3], ref[3]), 1e-5) << "db";
        }
    }
}

// Position q of a padded input of size n, mapped into [0, n) as PyTorch's padding modes do.
static int64_t padded_source(int32_t mode, int64_t q, int64_t n)
{
    if (mode == TSL_PADDING_REFLECT)
        return q < 0 ? -q : q >= n ? 2 * (n - 1) - q : q;
    if (mode == TSL_PADDING_CIRCULAR)
        return (q % n + n) % n;
    return q < 0 ? 0 : q >= n ? n - 1 : q;
}

// y, dx, dw and db of case c (one group, not transposed, reflect or replicate padding) by
// direct loops in double over the inputs conv_results fills (the same seeds, gathered from one
// tile): every kernel tap reads the padded input at its mapped position, and the data gradient
// adds each tap's term into that position.
static std::vector<std::vector<float>> padded_reference(const SpatialCase &c)
{
    int sp = (int)c.xdims.size() - 2;
    std::vector<int64_t> wd = {c.cout, c.xdims[1]};
    for (int d = 0; d < sp; d++)
        wd.push_back(c.k);
    tsl_owner_map root = tsl_owner_single(0);
    int64_t n = c.xdims[0], ci = c.xdims[1], co = c.cout;
    int64_t in[3] = {1, 1, 1}, out[3] = {1, 1, 1}, kk[3] = {1, 1, 1};
    for (int d = 0; d < sp; d++) {
        in[d] = c.xdims[2 + d];
        out[d] = (in[d] + 2 * c.padding - c.dilation * (c.k - 1) - 1) / c.stride + 1;
        kk[d] = c.k;
    }
    std::vector<int64_t> yd = {n, co};
    for (int d = 0; d < sp; d++)
        yd.push_back(out[d]);
    tsl_tensor_t x = make_tensor(TSL_F32, c.xdims, {}, root),
                 w = make_tensor(TSL_F32, wd, {}, root);
    tsl_tensor_t b = make_tensor(TSL_F32, {co}, {}, root), dy = make_tensor(TSL_F32, yd, {}, root);
    EXPECT_EQ(tsl_tensor_fill_uniform(x, seed + 100, -1, 1), TSL_OK);
    EXPECT_EQ(tsl_tensor_fill_uniform(w, seed + 101, -1, 1), TSL_OK);
    EXPECT_EQ(tsl_tensor_fill_uniform(b, seed + 102, -1, 1), TSL_OK);
    EXPECT_EQ(tsl_tensor_fill_uniform(dy, seed + 103, -1, 1), TSL_OK);
    std::vector<std::vector<float>> v = gather_all({x, w, b, dy});
    for (tsl_tensor_t t : {x, w, b, dy})
        tsl_tensor_destroy(t);
    const std::vector<float> &xv = v[0], &wv = v[1], &bv = v[2], &dyv = v[3];
    int64_t ns = in[0] * in[1] * in[2], os = out[0] * out[1] * out[2], ks = kk[0] * kk[1] * kk[2];
    std::vector<double> y((size_t)(n * co * os)), dx((size_t)(n * ci * ns)),
        dw((size_t)(co * ci * ks)), db((size_t)co);
    if (rank != 0)
        return {};
    for (int64_t s = 0; s < n; s++)
        for (int64_t o = 0; o < co; o++)
            for (int64_t p = 0; p < os; p++) {
                int64_t op[3] = {p / (out[1] * out[2]), p / out[2] % out[1], p % out[2]};
                size_t yi = (size_t)((s * co + o) * os + p);
                double acc = bv[(size_t)o], g = dyv[yi];
                db[(size_t)o] += g;
                for (int64_t i = 0; i < ci; i++)
                    for (int64_t t = 0; t < ks; t++) {
                        int64_t tp[3] = {t / (kk[1] * kk[2]), t / kk[2] % kk[1], t % kk[2]}, at = 0;
                        for (int d = 0; d < 3; d++) {
                            int64_t q =
                                d < sp ? op[d] * c.stride - c.padding + tp[d] * c.dilation : 0;
                            at = at * in[d] + (d < sp ? padded_source(c.mode, q, in[d]) : 0);
                        }
                        size_t xi = (size_t)((s * ci + i) * ns + at),
                               wi = (size_t)((o * ci + i) * ks + t);
                        acc += (double)wv[wi] * xv[xi];
                        dx[xi] += (double)wv[wi] * g;
                        dw[wi] += g * xv[xi];
                    }
                y[yi] = acc;
            }
    std::vector<std::vector<float>> r;
    for (const std::vector<double> *a : {&y, &dx, &dw, &db})
        r.emplace_back(a->begin(), a->end());
    return r;
}

// Reflect, replicate and circular padding (PyTorch's padding_mode) on one tile and on spatial
// tiles equal direct loops over the mapped positions: 1-D to 3-D, kernels 3 and 5, stride 1
// and 2, dilation 2, padding 1 and 2, both layouts, tiles as thin as the padding (a window
// fills its padding from a neighbour's halo; circular: from the tiles at the other end, or
// the tile itself where it spans a dimension), tiles dealt in blocks and outputs in reverse.
TEST(Convolution, ReflectReplicateAndCircularPaddingMatchDirectLoops)
{
    const tsl_layout P = TSL_LAYOUT_PLAIN, CL = TSL_LAYOUT_CHANNELS_LAST;
    std::vector<SpatialCase> cases;
    for (int32_t mode : {TSL_PADDING_REFLECT, TSL_PADDING_REPLICATE, TSL_PADDING_CIRCULAR}) {
        cases.push_back({{2, 3, 23}, {1, 1, 3}, 4, 3, 1, 1, 1, 1, P, 0, mode});
        cases.push_back({{2, 3, 10}, {1, 1, 5}, 2, 5, 1, 2, 1, 1, CL, 0, mode});
        cases.push_back({{2, 3, 24}, {2, 1, 4}, 4, 3, 2, 2, 2, 1, P, 0, mode});
        cases.push_back({{3, 2, 13, 11}, {1, 1, 2, 3}, 5, 3, 1, 1, 1, 1, P, 0, mode});
        cases.push_back({{2, 2, 14, 12}, {2, 1, 2, 2}, 3, 5, 2, 2, 1, 1, CL, 0, mode});
        cases.push_back({{1, 2, 9, 8, 7}, {1, 1, 2, 2, 2}, 3, 3, 1, 1, 1, 1, P, 0, mode});
    }
    // circular: padding over half the kernel's span; one tile along a dimension (it wraps onto
    // itself) beside two (both neighbours the same tile); tiles of one position (a window
    // wraps two tiles deep)
    const int32_t C = TSL_PADDING_CIRCULAR;
    cases.push_back({{2, 3, 11}, {1, 1, 2}, 3, 3, 1, 2, 1, 1, P, 0, C});
    cases.push_back({{2, 2, 6, 9}, {1, 1, 1, 2}, 3, 5, 1, 2, 1, 1, CL, 0, C});
    cases.push_back({{1, 2, 8}, {1, 1, 8}, 2, 5, 1, 2, 1, 1, P, 0, C});
    tsl_owner_map block = tsl_owner_block(nullptr), rev = tsl_owner_callback(reversed, nullptr),
                  root = tsl_owner_single(0);
    for (size_t n = 0; n < cases.size(); n++) {
        const SpatialCase &c = cases[n];
        SCOPED_TRACE("case " + std::to_string(n) + " mode " + std::to_string(c.mode));
        std::vector<std::vector<float>> ref = padded_reference(c);
        std::vector<std::vector<float>> one = conv_results(c, {}, root, root);
        std::vector<std::vector<float>> got = conv_results(c, c.splits, block, rev);
        if (rank != 0)
            continue;
        for (const auto *r : {&one, &got}) {
            const char *what = r == &one ? "one tile" : "tiles";
            EXPECT_LT(max_rel_diff((*r)[0], ref[0]), 1e-5) << "y, " << what;
            EXPECT_LT(max_rel_diff((*r)[1], ref[1]), 1e-5) << "dx, " << what;
            EXPECT_LT(max_norm_rel_diff((*r)[2], ref[2]), 1e-5) << "dw, " << what;
            EXPECT_LT(max_norm_rel_diff((*r)[3], ref[3]), 1e-5) << "db, " << what;
        }
    }
    // Zeros padding differs (the mode is used), and settings the halo windows cannot fill are
    // refused before any task.
    SpatialCase z = cases[0];
    z.mode = TSL_PADDING_ZEROS;
    std::vector<std::vector<float>> zeros = conv_results(z, {}, root, root);
    std::vector<std::vector<float>> reflect = padded_reference(cases[0]);
    if (rank == 0)
        EXPECT_GT(max_rel_diff(zeros[0], reflect[0]), 1e-3);
    tsl_conv_params p;
    ASSERT_EQ(tsl_conv_params_init(&p, 1), TSL_OK);
    tsl_shape xs, ws, ys;
    const int64_t xd[3] = {1, 2, 12}, wd[3] = {2, 2, 3};
    ASSERT_EQ(tsl_shape_make(&xs, 3, xd), TSL_OK);
    ASSERT_EQ(tsl_shape_make(&ws, 3, wd), TSL_OK);
    p.padding_mode = TSL_PADDING_REFLECT;
    p.padding[0] = 2; // kernel 3 spans 2: at most 1
    EXPECT_EQ(tsl_conv_output_shape(&xs, &ws, &p, &ys), TSL_ERR_SHAPE);
    EXPECT_NE(std::strstr(tsl_last_error(), "2 x padding <= dilation x (kernel - 1)"), nullptr)
        << tsl_last_error();
    p.padding[0] = 1;
    EXPECT_EQ(tsl_conv_output_shape(&xs, &ws, &p, &ys), TSL_OK);
    EXPECT_EQ(tsl_conv_transpose_output_shape(&xs, &ws, &p, &ys), TSL_ERR_INVALID_ARG);
    p.padding_mode = TSL_PADDING_CIRCULAR;
    p.padding[0] = 13; // wraps round the 12 inputs more than once
    EXPECT_EQ(tsl_conv_output_shape(&xs, &ws, &p, &ys), TSL_ERR_SHAPE);
    EXPECT_NE(std::strstr(tsl_last_error(), "more than once"), nullptr) << tsl_last_error();
    p.padding[0] = 2; // over half the kernel's span: circular padding may
    EXPECT_EQ(tsl_conv_output_shape(&xs, &ws, &p, &ys), TSL_OK) << tsl_last_error();
    p.padding_mode = 7;
    EXPECT_EQ(tsl_conv_output_shape(&xs, &ws, &p, &ys), TSL_ERR_INVALID_ARG);
}

// One convolution over concatenated inputs: the parts' channels, x's other dimensions, the
// tile grid, kernel, stride and padding (every spatial dimension alike).
struct ConcatCase {
    std::vector<int64_t> channels, dims; // dims: N, spatial...
    std::vector<int32_t> splits;
    int64_t cout, k, stride, padding;
    tsl_layout layout;
    bool first_dx; // the first part's gradient wanted (else NULL: the network input)
};

// y, dx of each part, dw and db gathered on rank 0: through tsl_conv_concat_* (concat 0), or
// through the materialised concatenation, tsl_conv_* and tsl_split_channels (concat 1).
static std::vector<std::vector<float>> concat_conv_results(const ConcatCase &c,
                                                           const std::vector<int32_t> &splits,
                                                           const tsl_owner_map &xo,
                                                           const tsl_owner_map &yo, int concat)
{
    int sp = (int)c.dims.size() - 1;
    tsl_conv_params p;
    EXPECT_EQ(tsl_conv_params_init(&p, sp), TSL_OK);
    for (int d = 0; d < sp; d++) {
        p.stride[d] = c.stride;
        p.padding[d] = c.padding;
    }
    int64_t cin = 0;
    for (int64_t ch : c.channels)
        cin += ch;
    auto dims_of = [&](int64_t ch) {
        std::vector<int64_t> d = {c.dims[0], ch};
        d.insert(d.end(), c.dims.begin() + 1, c.dims.end());
        return d;
    };
    std::vector<int64_t> wd = {c.cout, cin};
    for (int d = 0; d < sp; d++)
        wd.push_back(c.k);
    tsl_owner_map last = tsl_owner_single(size - 1);
    const int32_t n = (int32_t)c.channels.size();
    std::vector<tsl_tensor_t> xs, dxs;
    for (int32_t k = 0; k < n; k++) {
        xs.push_back(make_tensor(TSL_F32, dims_of(c.channels[k]), splits, xo, c.layout));
        dxs.push_back(make_tensor(TSL_F32, dims_of(c.channels[k]), splits, xo, c.layout));
        EXPECT_EQ(tsl_tensor_fill_uniform(xs[k], seed + 140 + k, -1, 1), TSL_OK);
        EXPECT_EQ(tsl_tensor_fill_constant(dxs[k], 1e6), TSL_OK); // poison
    }
    tsl_tensor_t w = make_tensor(TSL_F32, wd, {}, last), dw = make_tensor(TSL_F32, wd, {}, last);
    tsl_tensor_t b = make_tensor(TSL_F32, {c.cout}, {}, last);
    tsl_tensor_t db = make_tensor(TSL_F32, {c.cout}, {}, tsl_owner_single(0));
    tsl_shape xsh, wsh, ysh;
    tsl_tensor_t xc = make_tensor(TSL_F32, dims_of(cin), splits, xo, c.layout);
    tsl_tensor_t dxc = make_tensor(TSL_F32, dims_of(cin), splits, xo, c.layout);
    tsl_tensor_shape(xc, &xsh);
    tsl_tensor_shape(w, &wsh);
    EXPECT_EQ(tsl_conv_output_shape(&xsh, &wsh, &p, &ysh), TSL_OK);
    std::vector<int64_t> yd(ysh.dims, ysh.dims + ysh.ndim);
    tsl_tensor_t y = make_tensor(TSL_F32, yd, splits, yo, c.layout);
    tsl_tensor_t dy = make_tensor(TSL_F32, yd, splits, yo, c.layout);
    EXPECT_EQ(tsl_tensor_fill_uniform(w, seed + 150, -1, 1), TSL_OK);
    EXPECT_EQ(tsl_tensor_fill_uniform(b, seed + 151, -1, 1), TSL_OK);
    EXPECT_EQ(tsl_tensor_fill_uniform(dy, seed + 152, -1, 1), TSL_OK);
    for (tsl_tensor_t t : {y, dw, db})
        EXPECT_EQ(tsl_tensor_fill_constant(t, 1e6), TSL_OK);
    std::vector<tsl_tensor_t> want_dx = dxs;
    if (!c.first_dx)
        want_dx[0] = nullptr;
    if (concat) {
        EXPECT_EQ(tsl_concat_channels(n, xs.data(), xc), TSL_OK) << tsl_context_last_error(ctx);
        EXPECT_EQ(tsl_conv_forward(&p, xc, w, b, y), TSL_OK) << tsl_context_last_error(ctx);
        EXPECT_EQ(tsl_conv_backward(&p, xc, w, dy, dxc, dw, db), TSL_OK)
            << tsl_context_last_error(ctx);
        EXPECT_EQ(tsl_split_channels(dxc, n, dxs.data()), TSL_OK) << tsl_context_last_error(ctx);
    } else {
        EXPECT_EQ(tsl_conv_concat_forward(&p, n, xs.data(), w, b, y), TSL_OK)
            << tsl_context_last_error(ctx);
        EXPECT_EQ(tsl_conv_concat_backward(&p, n, xs.data(), w, dy, want_dx.data(), dw, db), TSL_OK)
            << tsl_context_last_error(ctx);
    }
    std::vector<std::vector<float>> got = gather_all({y, dw, db});
    for (int32_t k = c.first_dx ? 0 : 1; k < n; k++)
        got.push_back(gather_all({dxs[k]})[0]);
    for (int32_t k = 0; k < n; k++) {
        tsl_tensor_destroy(xs[k]);
        tsl_tensor_destroy(dxs[k]);
    }
    for (tsl_tensor_t t : {w, dw, b, db, xc, dxc, y, dy})
        tsl_tensor_destroy(t);
    return got;
}

// A convolution over a concatenation without making it (each part through its run of the
// weights, the U-Net decoder's first convolution) equals the convolution of the materialised
// concatenation on one tile: sample tiles and 1-D, 2-D and 3-D spatial tiles (even and
// uneven), kernels 1, 3 and 5, stride 1 and 2, padding 0 to 2, both layouts, two and three
// parts, a part without a gradient; tiles dealt in blocks, outputs in reverse.
TEST(Convolution, ConcatenatedInputsMatchTheMaterialisedConcatenation)
{
    const tsl_layout P = TSL_LAYOUT_PLAIN, CL = TSL_LAYOUT_CHANNELS_LAST;
    std::vector<ConcatCase> cases = {
        {{2, 3}, {4, 9}, {4, 1, 1}, 3, 3, 1, 1, P, true},
        {{2, 3}, {2, 23}, {1, 1, 3}, 4, 3, 1, 1, CL, true},
        {{1, 2, 2}, {2, 22}, {1, 1, 4}, 3, 5, 2, 2, P, false},
        {{3, 2}, {1, 13, 11}, {1, 1, 2, 3}, 4, 3, 1, 1, CL, true},
        {{2, 2}, {2, 12, 13}, {2, 1, 2, 2}, 2, 1, 1, 0, P, true},
        {{2, 1}, {1, 9, 8, 7}, {1, 1, 2, 2, 2}, 3, 3, 1, 1, CL, false},
        {{2, 2}, {1, 10, 9, 8}, {1, 1, 2, 1, 3}, 2, 3, 2, 1, P, true},
    };
    tsl_owner_map block = tsl_owner_block(nullptr), rev = tsl_owner_callback(reversed, nullptr),
                  root = tsl_owner_single(0);
    for (size_t n = 0; n < cases.size(); n++) {
        const ConcatCase &c = cases[n];
        SCOPED_TRACE("case " + std::to_string(n));
        std::vector<std::vector<float>> ref = concat_conv_results(c, {}, root, root, 1);
        std::vector<std::vector<float>> got = concat_conv_results(c, c.splits, block, rev, 0);
        if (rank == 0) {
            ASSERT_EQ(got.size(), ref.size());
            EXPECT_LT(max_rel_diff(got[0], ref[0]), 1e-5) << "y";
            EXPECT_LT(max_norm_rel_diff(got[1], ref[1]), 1e-5) << "dw";
            EXPECT_LT(max_norm_rel_diff(got[2], ref[2]), 1e-5) << "db";
            for (size_t k = 3; k < got.size(); k++)
                EXPECT_LT(max_rel_diff(got[k], ref[k]), 1e-5) << "dx of part " << k - 3;
        }
    }
}

// A convolution whose weights are cut along their input channels as x is (channels= plans):
// x's channel tiles, the weight's tiles (ky x kx), y's channel tiles (ky: 1 or kx), x's other
// splits, kernel, stride, padding and padding mode (every spatial dimension alike).
struct PartsCase {
    std::vector<int64_t> dims; // N, C, spatial...
    std::vector<int32_t> splits;
    int64_t cout, k, stride, padding;
    int32_t ky;
    tsl_padding_mode mode;
    tsl_layout layout;
};

// A layer's y, dx, dw and db (gathered on rank 0) against a reference: y and dx element by
// element, the parameter gradients (sums whose order the tiling changes) as whole tensors.
static void expect_layer_matches(const std::vector<std::vector<float>> &got,
                                 const std::vector<std::vector<float>> &ref)
{
    if (rank != 0)
        return;
    ASSERT_EQ(got.size(), 4u);
    EXPECT_LT(max_rel_diff(got[0], ref[0]), 1e-5) << "y";
    EXPECT_LT(max_rel_diff(got[1], ref[1]), 1e-5) << "dx";
    EXPECT_LT(max_norm_rel_diff(got[2], ref[2]), 1e-5) << "dw";
    EXPECT_LT(max_norm_rel_diff(got[3], ref[3]), 1e-5) << "db";
}

// y, dx, dw and db gathered on rank 0: on one tile each on rank 0 (tiled 0), or x cut by
// splits, the weight ky x kx, y and b ky along channels, dealt over the ranks (tiled 1). A
// transposed convolution (weights (I, O, k...)) has its weight cut 1 x ky, along its filters
// (transposed 1), or kx x ky (transposed 2, channels= parts).
static std::vector<std::vector<float>> parts_conv_results(const PartsCase &c, int tiled,
                                                          int transposed = 0)
{
    int sp = (int)c.dims.size() - 2;
    tsl_conv_params p;
    EXPECT_EQ(tsl_conv_params_init(&p, sp), TSL_OK);
    p.padding_mode = c.mode;
    for (int d = 0; d < sp; d++) {
        p.stride[d] = c.stride;
        p.padding[d] = c.padding;
    }
    tsl_owner_map root = tsl_owner_single(0), block = tsl_owner_block(nullptr),
                  rev = tsl_owner_callback(reversed, nullptr);
    std::vector<int64_t> wd = {c.cout, c.dims[1]};
    if (transposed)
        wd = {c.dims[1], c.cout};
    for (int d = 0; d < sp; d++)
        wd.push_back(c.k);
    std::vector<int32_t> none, ysplits = c.splits, wsplits = {c.ky, c.splits[1]};
    if (transposed) {
        wsplits.assign(wd.size(), 1);
        wsplits[0] = transposed == 2 ? c.splits[1] : 1;
        wsplits[1] = c.ky;
    }
    ysplits[1] = c.ky;
    tsl_tensor_t x =
        make_tensor(TSL_F32, c.dims, tiled ? c.splits : none, tiled ? block : root, c.layout);
    tsl_tensor_t dx =
        make_tensor(TSL_F32, c.dims, tiled ? c.splits : none, tiled ? block : root, c.layout);
    tsl_tensor_t w = make_tensor(TSL_F32, wd, tiled ? wsplits : none, tiled ? rev : root);
    tsl_tensor_t dw = make_tensor(TSL_F32, wd, tiled ? wsplits : none, tiled ? rev : root);
    std::vector<int32_t> bsplits = {c.ky};
    tsl_tensor_t b = make_tensor(TSL_F32, {c.cout}, tiled ? bsplits : none, tiled ? block : root);
    tsl_tensor_t db = make_tensor(TSL_F32, {c.cout}, tiled ? bsplits : none, tiled ? rev : root);
    tsl_shape xsh, wsh, ysh;
    tsl_tensor_shape(x, &xsh);
    tsl_tensor_shape(w, &wsh);
    EXPECT_EQ((transposed ? tsl_conv_transpose_output_shape : tsl_conv_output_shape)(&xsh, &wsh, &p,
                                                                                     &ysh),
              TSL_OK)
        << tsl_last_error();
    std::vector<int64_t> yd(ysh.dims, ysh.dims + ysh.ndim);
    tsl_tensor_t y = make_tensor(TSL_F32, yd, tiled ? ysplits : none, tiled ? rev : root, c.layout);
    tsl_tensor_t dy =
        make_tensor(TSL_F32, yd, tiled ? ysplits : none, tiled ? block : root, c.layout);
    fill_layer(x, w, b, dy, {y, dx, dw, db}, seed + 160);
    return conv_layer_results(p, transposed != 0, x, w, b, dy, y, dx, dw, db);
}

// Weights cut along their input channels (each pass where its input tile lives, the partial
// outputs summed on the output's owners; dy sent to the input tiles' ranks, dx made there)
// equal one tile: 1-D, 2-D and 3-D, two and three channel tiles, output channels cut as many
// times or whole, with and without spatial tiles (windows, halo slabs), stride 2, reflect and
// circular padding, both layouts; tiles dealt in blocks, the weights in reverse.
TEST(Convolution, InputChannelPartsMatchOneTile)
{
    const tsl_layout P = TSL_LAYOUT_PLAIN, CL = TSL_LAYOUT_CHANNELS_LAST;
    const tsl_padding_mode Z = TSL_PADDING_ZEROS;
    std::vector<PartsCase> cases = {
        {{2, 4, 7, 6}, {2, 2, 1, 1}, 6, 3, 1, 1, 2, Z, P},
        {{1, 6, 11}, {1, 3, 2}, 4, 3, 2, 1, 1, Z, CL},
        {{3, 6, 9}, {3, 3, 1}, 6, 1, 1, 0, 3, Z, P},
        {{1, 4, 5, 6, 5}, {1, 2, 1, 2, 1}, 4, 3, 1, 1, 2, Z, CL},
        {{1, 4, 8, 7}, {1, 2, 2, 1}, 4, 3, 1, 1, 2, TSL_PADDING_REFLECT, P},
        {{2, 4, 9, 8}, {1, 2, 1, 2}, 2, 3, 1, 1, 2, TSL_PADDING_CIRCULAR, CL},
    };
    for (size_t n = 0; n < cases.size(); n++) {
        SCOPED_TRACE("case " + std::to_string(n));
        std::vector<std::vector<float>> ref = parts_conv_results(cases[n], 0);
        expect_layer_matches(parts_conv_results(cases[n], 1), ref);
    }
    // a weight cut along its input channels unlike x, or over a concatenation, is refused
    tsl_owner_map block = tsl_owner_block(nullptr);
    tsl_conv_params p;
    ASSERT_EQ(tsl_conv_params_init(&p, 1), TSL_OK);
    tsl_tensor_t x = make_tensor(TSL_F32, {1, 4, 8}, {1, 2, 1}, block);
    tsl_tensor_t w3 = make_tensor(TSL_F32, {2, 4, 3}, {1, 3, 1}, block);
    tsl_tensor_t y = make_tensor(TSL_F32, {1, 2, 6}, {}, block);
    EXPECT_EQ(tsl_conv_forward(&p, x, w3, nullptr, y), TSL_ERR_SHAPE);
    EXPECT_NE(std::strstr(tsl_context_last_error(ctx), "cut along its input channels"), nullptr);
    tsl_tensor_t xs[2] = {make_tensor(TSL_F32, {1, 2, 8}, {1, 1, 1}, block),
                          make_tensor(TSL_F32, {1, 2, 8}, {1, 1, 1}, block)};
    tsl_tensor_t w2 = make_tensor(TSL_F32, {2, 4, 3}, {1, 2, 1}, block);
    EXPECT_EQ(tsl_conv_concat_forward(&p, 2, xs, w2, nullptr, y), TSL_ERR_SHAPE);
    EXPECT_NE(std::strstr(tsl_context_last_error(ctx), "not a concatenation"), nullptr);
    for (tsl_tensor_t t : {x, w3, y, xs[0], xs[1], w2})
        tsl_tensor_destroy(t);
}

// A linear layer on feature tiles (filters= and channels= plans): x (N, K) cut into sn x kx
// tiles, y ky along its features, w ky x wx (wx 1: rows cut as y, read by the output tile's
// owner; wx = kx: cut along its columns as x, partial outputs added by a tree).
struct FeatureCase {
    int64_t n, k, o;
    int32_t sn, kx, ky, wx;
};

// y, dx, dw and db gathered on rank 0: one tile each on rank 0 through the BLAS path (tiled 0),
// or cut as the case says and dealt over the ranks (tiled 1).
static std::vector<std::vector<float>> feature_linear_results(const FeatureCase &c, int tiled)
{
    tsl_owner_map root = tsl_owner_single(0), block = tsl_owner_block(nullptr),
                  rev = tsl_owner_callback(reversed, nullptr);
    std::vector<int32_t> none, xs = {c.sn, c.kx}, ys = {c.sn, c.ky}, ws = {c.ky, c.wx}, bs = {c.ky};
    tsl_tensor_t x = make_tensor(TSL_F32, {c.n, c.k}, tiled ? xs : none, tiled ? block : root);
    tsl_tensor_t dx = make_tensor(TSL_F32, {c.n, c.k}, tiled ? xs : none, tiled ? rev : root);
    tsl_tensor_t w = make_tensor(TSL_F32, {c.o, c.k}, tiled ? ws : none, tiled ? rev : root);
    tsl_tensor_t dw = make_tensor(TSL_F32, {c.o, c.k}, tiled ? ws : none, tiled ? rev : root);
    tsl_tensor_t b = make_tensor(TSL_F32, {c.o}, tiled ? bs : none, tiled ? block : root);
    tsl_tensor_t db = make_tensor(TSL_F32, {c.o}, tiled ? bs : none, tiled ? rev : root);
    tsl_tensor_t y = make_tensor(TSL_F32, {c.n, c.o}, tiled ? ys : none, tiled ? rev : root);
    tsl_tensor_t dy = make_tensor(TSL_F32, {c.n, c.o}, tiled ? ys : none, tiled ? block : root);
    fill_layer(x, w, b, dy, {y, dx, dw, db}, seed + 170);
    EXPECT_EQ(tsl_linear_forward(x, w, b, y), TSL_OK) << tsl_context_last_error(ctx);
    EXPECT_EQ(tsl_linear_backward(x, w, dy, dx, dw, db), TSL_OK) << tsl_context_last_error(ctx);
    std::vector<std::vector<float>> got = gather_all({y, dx, dw, db});
    for (tsl_tensor_t t : {x, dx, w, dw, b, db, y, dy})
        tsl_tensor_destroy(t);
    return got;
}

// Feature tiles equal the one-tile layer: the input cut and the output whole (a classifier
// under filters=), the output cut by filters and the input whole or cut, the weights cut along
// their columns with the output whole or cut (channels=), two and three feature tiles, one to
// three sample tiles; the tiles dealt in blocks, the weights and outputs in reverse. A layer
// whose tiles do not fit is refused.
TEST(Linear, FeatureTilesMatchOneTile)
{
    const std::vector<FeatureCase> cases = {
        {4, 6, 5, 2, 2, 1, 1}, {5, 6, 4, 1, 1, 2, 1}, {6, 9, 6, 3, 3, 3, 1},  {3, 8, 5, 1, 2, 1, 2},
        {4, 6, 6, 2, 3, 1, 3}, {5, 8, 6, 2, 2, 2, 2}, {7, 12, 9, 3, 3, 3, 3},
    };
    for (size_t n = 0; n < cases.size(); n++) {
        SCOPED_TRACE("case " + std::to_string(n));
        std::vector<std::vector<float>> ref = feature_linear_results(cases[n], 0);
        expect_layer_matches(feature_linear_results(cases[n], 1), ref);
    }
    tsl_owner_map block = tsl_owner_block(nullptr);
    tsl_tensor_t x = make_tensor(TSL_F32, {4, 6}, {1, 2}, block);
    tsl_tensor_t w = make_tensor(TSL_F32, {4, 6}, {}, block);
    tsl_tensor_t w3 = make_tensor(TSL_F32, {4, 6}, {1, 3}, block);
    tsl_tensor_t y2 = make_tensor(TSL_F32, {4, 4}, {1, 2}, block);
    tsl_tensor_t y = make_tensor(TSL_F32, {4, 4}, {}, block);
    tsl_tensor_t x64 = make_tensor(TSL_F64, {4, 6}, {1, 2}, block);
    tsl_tensor_t w64 = make_tensor(TSL_F64, {4, 6}, {}, block);
    tsl_tensor_t y64 = make_tensor(TSL_F64, {4, 4}, {}, block);
    EXPECT_EQ(tsl_linear_forward(x, w, nullptr, y2), TSL_ERR_SHAPE); // y cut, w whole
    EXPECT_NE(std::strstr(tsl_context_last_error(ctx), "cut into as many"), nullptr);
    EXPECT_EQ(tsl_linear_forward(x, w3, nullptr, y), TSL_ERR_SHAPE); // w's columns unlike x
    EXPECT_NE(std::strstr(tsl_context_last_error(ctx), "cut along its input channels"), nullptr);
    EXPECT_EQ(tsl_linear_forward(x64, w64, nullptr, y64), TSL_ERR_DTYPE);
    EXPECT_EQ(tsl_linear_forward(x, w, nullptr, x), TSL_ERR_SHAPE);
    for (tsl_tensor_t t : {x, w, w3, y2, y, x64, w64, y64})
        tsl_tensor_destroy(t);
}

// Inputs that cannot be concatenated, or a convolution that cannot read them apart, are
// refused before anything runs.
TEST(Convolution, ConcatenatedInputsThatDoNotFitAreErrors)
{
    tsl_owner_map block = tsl_owner_block(nullptr);
    tsl_conv_params p;
    ASSERT_EQ(tsl_conv_params_init(&p, 1), TSL_OK);
    p.padding[0] = 1;
    tsl_tensor_t a = make_tensor(TSL_F32, {1, 2, 12}, {1, 1, 2}, block);
    tsl_tensor_t b = make_tensor(TSL_F32, {1, 2, 12}, {1, 1, 2}, block);
    tsl_tensor_t other = make_tensor(TSL_F32, {1, 2, 12}, {1, 1, 3}, block);
    tsl_tensor_t longer = make_tensor(TSL_F32, {1, 2, 13}, {1, 1, 2}, block);
    tsl_tensor_t w = make_tensor(TSL_F32, {4, 4, 3}, {}, block);
    tsl_tensor_t w3 = make_tensor(TSL_F32, {4, 3, 3}, {}, block);
    tsl_tensor_t y = make_tensor(TSL_F32, {1, 4, 12}, {1, 1, 2}, block);
    tsl_tensor_t ab[2] = {a, b}, ao[2] = {a, other}, al[2] = {a, longer}, ay[2] = {a, y};
    EXPECT_EQ(tsl_conv_concat_forward(&p, 2, ab, w, nullptr, y), TSL_OK)
        << tsl_context_last_error(ctx);
    EXPECT_EQ(tsl_conv_concat_forward(&p, 2, ab, w3, nullptr, y), TSL_ERR_SHAPE);
    EXPECT_EQ(tsl_conv_concat_forward(&p, 2, ao, w, nullptr, y), TSL_ERR_SHAPE);
    EXPECT_NE(std::strstr(tsl_context_last_error(ctx), "tile grid"), nullptr);
    EXPECT_EQ(tsl_conv_concat_forward(&p, 2, al, w, nullptr, y), TSL_ERR_SHAPE);
    EXPECT_EQ(tsl_conv_concat_forward(&p, 2, ay, w, nullptr, y), TSL_ERR_SHAPE);
    EXPECT_EQ(tsl_conv_concat_forward(&p, 0, ab, w, nullptr, y), TSL_ERR_INVALID_ARG);
    EXPECT_EQ(tsl_conv_concat_forward(&p, TSL_CONV_MAX_INPUTS + 1, ab, w, nullptr, y),
              TSL_ERR_INVALID_ARG);
    tsl_tensor_t dab[2] = {b, a};
    EXPECT_EQ(tsl_conv_concat_backward(&p, 2, ab, w, y, dab, nullptr, nullptr),
              TSL_ERR_INVALID_ARG);
    p.groups = 2;
    EXPECT_EQ(tsl_conv_concat_forward(&p, 2, ab, w3, nullptr, y), TSL_ERR_INVALID_ARG);
    EXPECT_NE(std::strstr(tsl_context_last_error(ctx), "one group"), nullptr);
    for (tsl_tensor_t t : {a, b, other, longer, w, w3, y})
        tsl_tensor_destroy(t);
}

// Only halo slabs move: the bytes StarPU-MPI sends for a convolution on spatial tiles are the
// slabs whose source tile lives on another rank than the output tile, plus the weights and
// bias sent once to each other rank with work, and no rank receives a whole activation tile.
TEST(Convolution, SpatialTilesMoveOnlyHalos)
{
    tsl_owner_map block = tsl_owner_block(nullptr), root = tsl_owner_single(0);
    tsl_conv_params p;
    ASSERT_EQ(tsl_conv_params_init(&p, 2), TSL_OK);
    p.padding[0] = p.padding[1] = 1;
    const int64_t N = 2, C = 3, H = 20, W = 18;
    tsl_tensor_t x = make_tensor(TSL_F32, {N, C, H, W}, {1, 1, 2, 2}, block);
    tsl_tensor_t y = make_tensor(TSL_F32, {N, 4, H, W}, {1, 1, 2, 2}, block);
    tsl_tensor_t w = make_tensor(TSL_F32, {4, C, 3, 3}, {}, root);
    tsl_tensor_t b = make_tensor(TSL_F32, {4}, {}, root);
    for (tsl_tensor_t t : {x, w, b})
        ASSERT_EQ(tsl_tensor_fill_uniform(t, seed + 120, -1, 1), TSL_OK);
    ASSERT_EQ(tsl_context_wait(ctx), TSL_OK);
    // The halo the plan implies: tile (a, c) of the 2 x 2 grid needs one row and one column
    // from each neighbour and one corner element from the diagonal one.
    auto owner = [&](int64_t tile) {
        tsl_tile_grid g = tsl_tile_grid_single();
        g.splits[2] = g.splits[3] = 2;
        int32_t coords[TSL_MAX_DIMS] = {0, 0, (int32_t)(tile / 2), (int32_t)(tile % 2), 0};
        int32_t r = -1;
        EXPECT_EQ(tsl_owner_map_rank(&block, coords, 4, &g, size, &r), TSL_OK);
        return r;
    };
    int64_t expect = 0, tile_bytes = N * C * (H / 2) * (W / 2) * 4;
    std::vector<int> works(size, 0);
    for (int64_t i = 0; i < 4; i++) {
        works[owner(i)] = 1;
        for (int64_t j = 0; j < 4; j++) {
            if (j == i || owner(j) == owner(i))
                continue;
            bool row = i / 2 != j / 2, col = i % 2 != j % 2;
            int64_t area = row && col ? 1 : row ? W / 2 : H / 2;
            expect += N * C * area * 4;
        }
    }
    for (int r = 1; r < size; r++)
        expect += works[r] * (4 * C * 9 + 4) * 4;
    int64_t sent0, recv0, sent1, recv1;
    ASSERT_EQ(tsl_context_comm_bytes(ctx, &sent0, &recv0), TSL_OK) << tsl_context_last_error(ctx);
    ASSERT_EQ(tsl_conv_forward(&p, x, w, b, y), TSL_OK) << tsl_context_last_error(ctx);
    ASSERT_EQ(tsl_context_wait(ctx), TSL_OK);
    ASSERT_EQ(tsl_context_comm_bytes(ctx, &sent1, &recv1), TSL_OK);
    int64_t mine = sent1 - sent0, total = 0;
    MPI_Allreduce(&mine, &total, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
    if (size == 1)
        EXPECT_EQ(total, 0);
    else
        EXPECT_NEAR((double)total, (double)expect, 0.1 * (double)expect)
            << "bytes sent for one convolution, against the halo volume";
    EXPECT_LT(recv1 - recv0, tile_bytes) << "a rank received as much as a whole tile";
    for (tsl_tensor_t t : {x, y, w, b})
        tsl_tensor_destroy(t);
}

// What spatial tiling does not cover is refused with a clear message; channel tiles are taken.
TEST(Convolution, SpatialTilingLimitsAreErrors)
{
    tsl_owner_map block = tsl_owner_block(nullptr);
    tsl_conv_params p;
    ASSERT_EQ(tsl_conv_params_init(&p, 1), TSL_OK);
    tsl_tensor_t x = make_tensor(TSL_F32, {1, 2, 12}, {1, 1, 2}, block);
    tsl_tensor_t w = make_tensor(TSL_F32, {2, 2, 3}, {}, block);
    tsl_tensor_t y2 = make_tensor(TSL_F32, {1, 2, 10}, {1, 1, 2}, block);
    tsl_tensor_t y3 = make_tensor(TSL_F32, {1, 2, 10}, {1, 1, 3}, block);
    EXPECT_EQ(tsl_conv_forward(&p, x, w, nullptr, y3), TSL_ERR_SHAPE);
    EXPECT_NE(std::strstr(tsl_context_last_error(ctx), "same spatial tile grid"), nullptr);
    EXPECT_EQ(tsl_conv_forward(&p, x, w, nullptr, y2), TSL_OK) << tsl_context_last_error(ctx);
    // Channel tiles (filters= plans) with spatial tiles: the output of the whole channels; an
    // output cut along channels needs the weights cut the same way.
    tsl_tensor_t xc = make_tensor(TSL_F32, {1, 2, 12}, {1, 2, 2}, block);
    tsl_tensor_t y2c = make_tensor(TSL_F32, {1, 2, 10}, {1, 1, 2}, block);
    tsl_tensor_t yc = make_tensor(TSL_F32, {1, 2, 10}, {1, 2, 2}, block);
    ASSERT_EQ(tsl_tensor_fill_normal(x, seed + 40, 0.0, 1.0), TSL_OK);
    ASSERT_EQ(tsl_tensor_redistribute(xc, x), TSL_OK) << tsl_context_last_error(ctx);
    ASSERT_EQ(tsl_tensor_fill_normal(w, seed + 41, 0.0, 1.0), TSL_OK);
    ASSERT_EQ(tsl_conv_forward(&p, x, w, nullptr, y2), TSL_OK);
    ASSERT_EQ(tsl_conv_forward(&p, xc, w, nullptr, y2c), TSL_OK) << tsl_context_last_error(ctx);
    std::vector<std::vector<float>> got = gather_all({y2, y2c});
    if (rank == 0)
        EXPECT_LT(max_rel_diff(got[1], got[0]), 1e-5);
    EXPECT_EQ(tsl_conv_forward(&p, xc, w, nullptr, yc), TSL_ERR_SHAPE);
    EXPECT_NE(std::strstr(tsl_context_last_error(ctx), "channel tiles"), nullptr);
    // Tiles of one position with a kernel of 61 reach too many neighbours.
    tsl_tensor_t xf = make_tensor(TSL_F32, {1, 2, 40}, {1, 1, 40}, block);
    tsl_tensor_t wf = make_tensor(TSL_F32, {2, 2, 31}, {}, block);
    tsl_tensor_t yf = make_tensor(TSL_F32, {1, 2, 40}, {1, 1, 40}, block);
    p.padding[0] = 15;
    EXPECT_EQ(tsl_conv_forward(&p, xf, wf, nullptr, yf), TSL_ERR_SHAPE);
    EXPECT_NE(std::strstr(tsl_context_last_error(ctx), "larger spatial tiles"), nullptr);
    for (tsl_tensor_t t : {x, w, y2, y3, xc, y2c, yc, xf, wf, yf})
        tsl_tensor_destroy(t);
}

TEST(Convolution, TransposedSampleTilingsMatchOneTile)
{
    tsl_owner_map block = tsl_owner_block(nullptr), rev = tsl_owner_callback(reversed, nullptr);
    tsl_conv_params p;
    ASSERT_EQ(tsl_conv_params_init(&p, 2), TSL_OK);
    p.stride[0] = p.stride[1] = 2;
    p.padding[1] = 1;
    p.output_padding[1] = 1;
    std::vector<std::vector<float>> ref;
    for (int32_t splits : {1, 2, 5}) {
        tsl_tensor_t x = make_tensor(TSL_F32, {5, 4, 6, 7}, {splits, 1, 1, 1}, rev);
        tsl_tensor_t w = make_tensor(TSL_F32, {4, 3, 2, 3}, {1, 1, 1, 1}, block);
        tsl_shape xs, ws, ys;
        tsl_tensor_shape(x, &xs);
        tsl_tensor_shape(w, &ws);
        ASSERT_EQ(tsl_conv_transpose_output_shape(&xs, &ws, &p, &ys), TSL_OK);
        std::vector<int64_t> yd(ys.dims, ys.dims + 4);
        tsl_tensor_t y = make_tensor(TSL_F32, yd, {splits, 1, 1, 1}, block);
        tsl_tensor_t dx = make_tensor(TSL_F32, {5, 4, 6, 7}, {splits, 1, 1, 1}, block);
        tsl_tensor_t dw = make_tensor(TSL_F32, {4, 3, 2, 3}, {1, 1, 1, 1}, rev);
        ASSERT_EQ(tsl_tensor_fill_uniform(x, seed + 90, -1, 1), TSL_OK);
        ASSERT_EQ(tsl_tensor_fill_uniform(w, seed + 91, -1, 1), TSL_OK);
        ASSERT_EQ(tsl_conv_transpose_forward(&p, x, w, nullptr, y), TSL_OK)
            << tsl_context_last_error(ctx);
        ASSERT_EQ(tsl_conv_transpose_backward(&p, x, w, y, dx, dw, nullptr), TSL_OK)
            << tsl_context_last_error(ctx);
        std::vector<std::vector<float>> got = gather_all({y, dx, dw});
        if (rank == 0) {
            if (ref.empty())
                ref = got;
            for (int k = 0; k < 3; k++)
                for (size_t i = 0; i < ref[k].size(); i++)
                    ASSERT_NEAR(got[k][i], ref[k][i], 1e-4 * (1 + std::fabs(ref[k][i])))
                        << "tensor " << k << ", " << splits << " tiles";
        }
        for (tsl_tensor_t t : {x, w, y, dx, dw})
            tsl_tensor_destroy(t);
    }
}

// Channel tiles of a transposed convolution equal one tile: 1-D, 2-D and 3-D, the input cut
// into two or three channel tiles or whole, the output cut into two or whole, with and without
// spatial tiles (windows), stride 1 and 2, both layouts; the weights cut along their filters
// (filters=), or along their input channels as well (channels=: partial outputs added by
// trees). Weights cut along their input channels unlike x are refused.
TEST(Convolution, TransposedChannelTilesMatchOneTile)
{
    const tsl_layout P = TSL_LAYOUT_PLAIN, CL = TSL_LAYOUT_CHANNELS_LAST;
    const tsl_padding_mode Z = TSL_PADDING_ZEROS;
    const std::vector<PartsCase> cases = {
        {{2, 4, 5, 6}, {2, 2, 1, 1}, 6, 2, 2, 0, 2, Z, P},
        {{1, 6, 7}, {1, 3, 1}, 4, 3, 1, 1, 2, Z, CL},
        {{1, 4, 6, 6}, {1, 2, 2, 1}, 4, 2, 2, 0, 2, Z, CL},
        {{1, 4, 3, 4, 3}, {1, 2, 1, 1, 1}, 2, 2, 2, 0, 1, Z, P},
        {{2, 3, 5, 5}, {1, 1, 1, 1}, 4, 3, 1, 1, 2, Z, P},
    };
    for (size_t n = 0; n < cases.size(); n++)
        for (int parts = 0; parts < 2; parts++) {
            SCOPED_TRACE("case " + std::to_string(n) + (parts ? ", weights cut by inputs" : ""));
            std::vector<std::vector<float>> ref = parts_conv_results(cases[n], 0, 1 + parts);
            expect_layer_matches(parts_conv_results(cases[n], 1, 1 + parts), ref);
        }
    tsl_owner_map block = tsl_owner_block(nullptr);
    tsl_conv_params p;
    ASSERT_EQ(tsl_conv_params_init(&p, 1), TSL_OK);
    tsl_tensor_t x = make_tensor(TSL_F32, {1, 4, 5}, {1, 2, 1}, block);
    tsl_tensor_t w = make_tensor(TSL_F32, {4, 2, 3}, {1, 1, 1}, block);
    tsl_tensor_t w3 = make_tensor(TSL_F32, {4, 2, 3}, {3, 2, 1}, block); // 3 input tiles
    tsl_tensor_t y = make_tensor(TSL_F32, {1, 2, 7}, {1, 2, 1}, block);
    EXPECT_EQ(tsl_conv_transpose_forward(&p, x, w, nullptr, y), TSL_ERR_SHAPE);
    EXPECT_NE(std::strstr(tsl_context_last_error(ctx), "second dimension"), nullptr);
    EXPECT_EQ(tsl_conv_transpose_forward(&p, x, w3, nullptr, y), TSL_ERR_SHAPE);
    EXPECT_NE(std::strstr(tsl_context_last_error(ctx), "cut along its input channels"), nullptr);
    for (tsl_tensor_t t : {x, w, w3, y})
        tsl_tensor_destroy(t);
}

// Pooling and upsampling on spatial tiles against one tile: 1-D, 2-D and 3-D rank grids, even
// and uneven tiles, kernels 1, 2, 3 and 5, stride 1 and 2, padding 0, 1 and 2, both average
// divisors, nearest and linear upsampling by 2 and 3. op: 0 max, 1 avg, 2 avg without padding
// in the divisor, 3 nearest, 4 linear (k is then the scale).
struct WindowCase {
    std::vector<int64_t> xdims;
    std::vector<int32_t> splits;
    int op;
    int64_t k, stride, padding;
    int ceil = 0; // pooling's ceil_mode: a last window past the input's end
};

// indices: max pooling (op 0) through tsl_pool_forward_indices and tsl_pool_backward_indices,
// on inputs of five levels (ties in most windows).
static std::vector<std::vector<float>>
window_results(const WindowCase &c, const std::vector<int32_t> &splits, const tsl_owner_map &xo,
               const tsl_owner_map &yo, tsl_layout layout = TSL_LAYOUT_PLAIN, int indices = -1)
{
    int sp = (int)c.xdims.size() - 2;
    tsl_pool_params p;
    EXPECT_EQ(tsl_pool_params_init(&p, c.op == 0 ? TSL_POOL_MAX : TSL_POOL_AVG, sp, c.k), TSL_OK);
    int64_t scale[3] = {c.k, c.k, c.k};
    std::vector<int64_t> yd = c.xdims;
    if (c.op < 3) {
        p.count_include_pad = c.op != 2;
        p.ceil_mode = c.ceil;
        for (int d = 0; d < sp; d++) {
            p.stride[d] = c.stride;
            p.padding[d] = c.padding;
        }
        tsl_shape xs, ys;
        EXPECT_EQ(tsl_shape_make(&xs, (int32_t)c.xdims.size(), c.xdims.data()), TSL_OK);
        EXPECT_EQ(tsl_pool_output_shape(&xs, &p, &ys), TSL_OK);
        yd.assign(ys.dims, ys.dims + ys.ndim);
    } else {
        for (int d = 0; d < sp; d++)
            yd[2 + d] *= c.k;
    }
    tsl_tensor_t x = make_tensor(TSL_F32, c.xdims, splits, xo, layout);
    tsl_tensor_t dx = make_tensor(TSL_F32, c.xdims, splits, xo, layout);
    tsl_tensor_t y = make_tensor(TSL_F32, yd, splits, yo, layout);
    tsl_tensor_t dy = make_tensor(TSL_F32, yd, splits, yo, layout);
    tsl_tensor_t ix = indices >= 0 ? make_tensor(TSL_U8, yd, splits, yo, layout) : nullptr;
    EXPECT_EQ(tsl_tensor_fill_uniform(x, seed + 110, -1, 1), TSL_OK);
    EXPECT_EQ(tsl_tensor_fill_uniform(dy, seed + 111, -1, 1), TSL_OK);
    for (tsl_tensor_t t : {y, dx})
        EXPECT_EQ(tsl_tensor_fill_constant(t, 1e6), TSL_OK);
    if (indices >= 0) {
        tsl_shape xs;
        tsl_tensor_shape(x, &xs);
        std::vector<float> xv((size_t)tsl_shape_numel(&xs));
        std::mt19937_64 gen(seed + 120);
        std::uniform_int_distribution<int> level(-2, 2);
        for (auto &v : xv)
            v = 0.5f * (float)level(gen);
        EXPECT_EQ(tsl_tensor_scatter(x, 0, xv.data()), TSL_OK) << tsl_context_last_error(ctx);
    }
    if (indices == 1) {
        EXPECT_EQ(tsl_pool_forward_indices(&p, x, y, ix), TSL_OK) << tsl_context_last_error(ctx);
        EXPECT_EQ(tsl_pool_backward_indices(&p, ix, dy, dx), TSL_OK) << tsl_context_last_error(ctx);
    } else if (c.op < 3) {
        EXPECT_EQ(tsl_pool_forward(&p, x, y), TSL_OK) << tsl_context_last_error(ctx);
        EXPECT_EQ(tsl_pool_backward(&p, x, dy, dx), TSL_OK) << tsl_context_last_error(ctx);
    } else if (c.op == 3) {
        EXPECT_EQ(tsl_upsample_nearest_forward(scale, x, y), TSL_OK) << tsl_context_last_error(ctx);
        EXPECT_EQ(tsl_upsample_nearest_backward(scale, dy, dx), TSL_OK)
            << tsl_context_last_error(ctx);
    } else {
        EXPECT_EQ(tsl_upsample_linear_forward(scale, x, y), TSL_OK) << tsl_context_last_error(ctx);
        EXPECT_EQ(tsl_upsample_linear_backward(scale, dy, dx), TSL_OK)
            << tsl_context_last_error(ctx);
    }
    std::vector<std::vector<float>> got = gather_all({y, dx});
    for (tsl_tensor_t t : {x, dx, y, dy, ix})
        tsl_tensor_destroy(t);
    return got;
}

TEST(Pooling, SpatialTilesMatchOneTile)
{
    std::vector<WindowCase> cases = {
        {{2, 3, 22}, {1, 1, 3}, 0, 3, 1, 1},
        {{2, 3, 23}, {1, 2, 4}, 1, 5, 2, 2},
        {{2, 2, 21}, {2, 1, 3}, 2, 3, 2, 1},
        {{1, 2, 16}, {1, 1, 4}, 0, 2, 2, 0},
        {{1, 2, 15}, {1, 1, 3}, 1, 1, 1, 0},
        {{2, 2, 13, 11}, {1, 1, 2, 3}, 0, 3, 1, 1},
        {{1, 3, 14, 15}, {1, 1, 3, 2}, 2, 5, 1, 2},
        {{1, 2, 16, 12}, {1, 1, 2, 2}, 0, 2, 2, 0},
        {{1, 2, 15, 13}, {1, 1, 2, 2}, 1, 3, 2, 1},
        {{1, 2, 9, 8, 10}, {1, 1, 2, 2, 2}, 0, 3, 1, 1},
        {{1, 1, 10, 9, 8}, {1, 1, 2, 1, 3}, 2, 3, 2, 1},
        {{2, 2, 11}, {1, 1, 3}, 3, 2, 0, 0},
        {{2, 2, 10}, {1, 1, 4}, 4, 3, 0, 0},
        {{1, 2, 7, 9}, {1, 1, 2, 3}, 3, 3, 0, 0},
        {{1, 2, 9, 7}, {1, 1, 3, 2}, 4, 2, 0, 0},
        {{1, 1, 5, 6, 7}, {1, 1, 2, 2, 2}, 4, 2, 0, 0},
        // ceil mode: one more window, past the input's end (max, avg with and without padding)
        {{2, 3, 22}, {1, 1, 3}, 0, 3, 2, 0, 1},
        {{1, 2, 15, 12}, {1, 1, 2, 3}, 1, 3, 2, 1, 1},
        {{1, 2, 12, 15}, {1, 1, 3, 2}, 2, 2, 3, 1, 1},
        {{1, 1, 9, 8, 10}, {1, 1, 2, 2, 2}, 0, 2, 3, 0, 1},
    };
    tsl_owner_map block = tsl_owner_block(nullptr), rev = tsl_owner_callback(reversed, nullptr),
                  root = tsl_owner_single(0);
    for (size_t n = 0; n < cases.size(); n++) {
        SCOPED_TRACE("case " + std::to_string(n));
        std::vector<std::vector<float>> ref = window_results(cases[n], {}, root, root);
        // Plain tiles, and channels-last tiles for every other case (one tile and the grid).
        std::vector<std::vector<float>> got = window_results(cases[n], cases[n].splits, block, rev);
        std::vector<std::vector<float>> cl_one, cl_got;
        if (n % 2 == 0) {
            cl_one = window_results(cases[n], {}, root, root, TSL_LAYOUT_CHANNELS_LAST);
            cl_got =
                window_results(cases[n], cases[n].splits, block, rev, TSL_LAYOUT_CHANNELS_LAST);
        }
        if (rank == 0) {
            EXPECT_LT(max_rel_diff(got[0], ref[0]), 1e-5) << "y";
            EXPECT_LT(max_rel_diff(got[1], ref[1]), 1e-5) << "dx";
            for (const auto *cl : {&cl_one, &cl_got})
                for (size_t k = 0; k < cl->size(); k++)
                    EXPECT_LT(max_rel_diff((*cl)[k], ref[k]), 1e-5)
                        << (k ? "dx" : "y") << ", channels-last"
                        << (cl == &cl_one ? ", one tile" : ", tiled");
        }
    }
}

// Max pooling through indices (tsl_pool_forward_indices, tsl_pool_backward_indices): y and dx
// exactly those of tsl_pool_forward and tsl_pool_backward from x on the same tiles, and those
// of one tile: 1-D, 2-D and 3-D rank grids, even and uneven tiles, kernels 2, 3 and 5,
// overlapping windows, padding, sample and channel tiles, plain and channels-last tiles,
// inputs full of ties (the first maximum takes the gradient). Outputs poisoned first.
TEST(Pooling, IndicesGiveTheBackwardFromTheInput)
{
    std::vector<WindowCase> cases = {
        {{2, 3, 22}, {1, 1, 3}, 0, 3, 1, 1},
        {{1, 2, 16}, {1, 1, 4}, 0, 2, 2, 0},
        {{2, 2, 13, 11}, {1, 1, 2, 3}, 0, 3, 1, 1},
        {{1, 2, 16, 12}, {1, 1, 2, 2}, 0, 2, 2, 0},
        {{1, 2, 12, 11}, {1, 1, 2, 2}, 0, 5, 1, 2},
        {{1, 2, 9, 8, 10}, {1, 1, 2, 2, 2}, 0, 3, 1, 1},
        {{1, 2, 8, 8, 8}, {1, 1, 1, 2, 2}, 0, 2, 2, 0},
        {{4, 6, 9, 8}, {2, 3, 1, 1}, 0, 3, 2, 1},
    };
    tsl_owner_map block = tsl_owner_block(nullptr), rev = tsl_owner_callback(reversed, nullptr),
                  root = tsl_owner_single(0);
    for (size_t n = 0; n < cases.size(); n++)
        for (tsl_layout layout : {TSL_LAYOUT_PLAIN, TSL_LAYOUT_CHANNELS_LAST}) {
            SCOPED_TRACE("case " + std::to_string(n) +
                         (layout == TSL_LAYOUT_PLAIN ? ", plain" : ", channels-last"));
            const WindowCase &c = cases[n];
            auto one = window_results(c, {}, root, root, layout, 0);
            auto from_x = window_results(c, c.splits, block, rev, layout, 0);
            auto from_ix = window_results(c, c.splits, block, rev, layout, 1);
            auto one_ix = window_results(c, {}, root, root, layout, 1);
            if (rank == 0)
                for (int k = 0; k < 2; k++) {
                    EXPECT_EQ(from_ix[k], from_x[k]) << (k ? "dx" : "y") << ", tiled";
                    EXPECT_EQ(one_ix[k], one[k]) << (k ? "dx" : "y") << ", one tile";
                    EXPECT_LT(max_rel_diff(from_ix[k], one[k]), 1e-5) << (k ? "dx" : "y");
                }
        }
}

TEST(Pooling, IndicesThatDoNotFitAreErrors)
{
    tsl_owner_map block = tsl_owner_block(nullptr), rev = tsl_owner_callback(reversed, nullptr);
    tsl_pool_params mp, ap, big;
    ASSERT_EQ(tsl_pool_params_init(&mp, TSL_POOL_MAX, 2, 2), TSL_OK);
    ASSERT_EQ(tsl_pool_params_init(&ap, TSL_POOL_AVG, 2, 2), TSL_OK);
    ASSERT_EQ(tsl_pool_params_init(&big, TSL_POOL_MAX, 2, 16), TSL_OK); /* 256 positions */
    tsl_tensor_t x = make_tensor(TSL_F32, {2, 3, 16, 16}, {2, 1, 1, 1}, block);
    tsl_tensor_t y = make_tensor(TSL_F32, {2, 3, 8, 8}, {2, 1, 1, 1}, block);
    tsl_tensor_t y1 = make_tensor(TSL_F32, {2, 3, 1, 1}, {2, 1, 1, 1}, block);
    tsl_tensor_t ix = make_tensor(TSL_U8, {2, 3, 8, 8}, {2, 1, 1, 1}, block);
    tsl_tensor_t ix1 = make_tensor(TSL_U8, {2, 3, 1, 1}, {2, 1, 1, 1}, block);
    tsl_tensor_t ix32 = make_tensor(TSL_I32, {2, 3, 1, 1}, {2, 1, 1, 1}, block);
    tsl_tensor_t moved = make_tensor(TSL_U8, {2, 3, 8, 8}, {2, 1, 1, 1}, rev);
    tsl_tensor_t small = make_tensor(TSL_U8, {2, 3, 8, 7}, {2, 1, 1, 1}, block);
    tsl_tensor_t f = make_tensor(TSL_F32, {2, 3, 8, 8}, {2, 1, 1, 1}, block);
    tsl_tensor_t cl =
        make_tensor(TSL_U8, {2, 3, 8, 8}, {2, 1, 1, 1}, block, TSL_LAYOUT_CHANNELS_LAST);
    EXPECT_EQ(tsl_pool_forward_indices(&ap, x, y, ix), TSL_ERR_INVALID_ARG);
    EXPECT_EQ(tsl_pool_forward_indices(&big, x, y1, ix1), TSL_ERR_DTYPE);
    EXPECT_EQ(tsl_pool_forward_indices(&mp, x, y, f), TSL_ERR_DTYPE);
    EXPECT_EQ(tsl_pool_forward_indices(&mp, x, y, small), TSL_ERR_SHAPE);
    EXPECT_EQ(tsl_pool_forward_indices(&mp, x, y, cl), TSL_ERR_SHAPE);
    EXPECT_EQ(tsl_pool_backward_indices(&mp, nullptr, y, x), TSL_ERR_INVALID_ARG);
    if (size > 1)
        EXPECT_EQ(tsl_pool_backward_indices(&mp, moved, y, x), TSL_ERR_SHAPE);
    EXPECT_EQ(tsl_pool_forward_indices(&big, x, y1, ix32), TSL_OK) << tsl_context_last_error(ctx);
    EXPECT_EQ(tsl_pool_backward_indices(&big, ix32, y1, x), TSL_OK) << tsl_context_last_error(ctx);
    for (tsl_tensor_t t : {x, y, y1, ix, ix1, ix32, moved, small, f, cl})
        tsl_tensor_destroy(t);
}

// tsl_context_cached_bytes: a max pooling (3, stride 1, padding 1) of a (2, 3, 6, 4 x ranks + 1)
// tensor cut along its last dimension, a tile per rank: each rank's task reads a column slab
// of 2 x 3 x 6 floats from each neighbour (the only one at the ends), which StarPU-MPI caches
// until the flush after that task: at most 1 or 2 slabs at once, none after. One rank reads
// nothing remote. A whole remote tile read by a task (an addition whose output lives on the
// next rank) counts as the tile.
TEST(Context, CachedBytesCountTheRemoteDataATaskReads)
{
    int64_t now = -1, most = -1;
    ASSERT_EQ(tsl_context_wait(ctx), TSL_OK);
    ASSERT_EQ(tsl_context_cached_bytes(ctx, &now, &most), TSL_OK); // starts a period
    EXPECT_EQ(now, 0) << "copies left cached by earlier work";
    tsl_owner_map block = tsl_owner_block(nullptr), rev = tsl_owner_callback(reversed, nullptr);
    const int64_t w = 4 * size + 1, slab = 2 * 3 * 6 * 4;
    tsl_tensor_t x = make_tensor(TSL_F32, {2, 3, 6, w}, {1, 1, 1, size}, block);
    tsl_tensor_t y = make_tensor(TSL_F32, {2, 3, 6, w}, {1, 1, 1, size}, block);
    ASSERT_EQ(tsl_tensor_fill_uniform(x, seed + 130, -1, 1), TSL_OK);
    tsl_pool_params p;
    ASSERT_EQ(tsl_pool_params_init(&p, TSL_POOL_MAX, 2, 3), TSL_OK);
    p.stride[0] = p.stride[1] = 1;
    p.padding[0] = p.padding[1] = 1;
    ASSERT_EQ(tsl_pool_forward(&p, x, y), TSL_OK) << tsl_context_last_error(ctx);
    ASSERT_EQ(tsl_context_wait(ctx), TSL_OK);
    ASSERT_EQ(tsl_context_cached_bytes(ctx, &now, &most), TSL_OK);
    int64_t neighbours = size == 1 ? 0 : (rank == 0 || rank == size - 1 ? 1 : 2);
    EXPECT_EQ(most, neighbours * slab) << "rank " << rank;
    EXPECT_EQ(now, 0);
    ASSERT_EQ(tsl_context_cached_bytes(ctx, &now, &most), TSL_OK);
    EXPECT_EQ(most, 0) << "the previous call started a new period";
    // Whole tiles: z = x + x with z's tiles on other ranks (reversed owners) reads both
    // operands' tile from its owner, cached until tsl_tensor_add flushes it.
    tsl_tensor_t z = make_tensor(TSL_F32, {2, 3, 6, w}, {1, 1, 1, size}, rev);
    ASSERT_EQ(tsl_tensor_add(z, x, x), TSL_OK) << tsl_context_last_error(ctx);
    ASSERT_EQ(tsl_context_wait(ctx), TSL_OK);
    ASSERT_EQ(tsl_context_cached_bytes(ctx, &now, &most), TSL_OK);
    int64_t start[TSL_MAX_DIMS], extent[TSL_MAX_DIMS], remote = 0;
    int32_t coords[TSL_MAX_DIMS];
    for (int64_t i = 0; i < size; i++) {
        int32_t zo = -1, xo = -1;
        ASSERT_EQ(tsl_tensor_tile_info(z, i, coords, &zo, start, extent), TSL_OK);
        ASSERT_EQ(tsl_tensor_tile_info(x, i, coords, &xo, start, extent), TSL_OK);
        if (zo == rank && xo != rank)
            remote = std::max(remote, 2 * 3 * 6 * extent[3] * 4);
    }
    EXPECT_EQ(most, remote) << "rank " << rank;
    EXPECT_EQ(now, 0);
    for (tsl_tensor_t t : {x, y, z})
        tsl_tensor_destroy(t);
}

TEST(Pooling, SampleAndChannelTilingsAreExact)
{
    tsl_owner_map block = tsl_owner_block(nullptr), rev = tsl_owner_callback(reversed, nullptr);
    tsl_pool_params mp, ap;
    ASSERT_EQ(tsl_pool_params_init(&mp, TSL_POOL_MAX, 2, 3), TSL_OK);
    mp.stride[0] = 2;
    mp.padding[0] = mp.padding[1] = 1;
    ASSERT_EQ(tsl_pool_params_init(&ap, TSL_POOL_AVG, 2, 2), TSL_OK);
    const int64_t scale[3] = {2, 3, 1};
    std::vector<std::vector<double>> ref;
    for (std::vector<int32_t> g : {std::vector<int32_t>{1, 1, 1, 1}, {2, 1, 1, 1}, {3, 4, 1, 1}}) {
        tsl_tensor_t x = make_tensor(TSL_F64, {3, 4, 9, 8}, g, rev);
        tsl_shape xs, ms, as;
        tsl_tensor_shape(x, &xs);
        ASSERT_EQ(tsl_pool_output_shape(&xs, &mp, &ms), TSL_OK);
        ASSERT_EQ(tsl_pool_output_shape(&xs, &ap, &as), TSL_OK);
        tsl_tensor_t m = make_tensor(TSL_F64, std::vector<int64_t>(ms.dims, ms.dims + 4), g, block);
        tsl_tensor_t a = make_tensor(TSL_F64, std::vector<int64_t>(as.dims, as.dims + 4), g, rev);
        tsl_tensor_t u = make_tensor(TSL_F64, {3, 4, 18, 24}, g, block);
        tsl_tensor_t dxm = make_tensor(TSL_F64, {3, 4, 9, 8}, g, block);
        tsl_tensor_t dxa = make_tensor(TSL_F64, {3, 4, 9, 8}, g, rev);
        tsl_tensor_t dxu = make_tensor(TSL_F64, {3, 4, 9, 8}, g, rev);
        ASSERT_EQ(tsl_tensor_fill_normal(x, seed + 100, 0, 1), TSL_OK);
        ASSERT_EQ(tsl_pool_forward(&mp, x, m), TSL_OK) << tsl_context_last_error(ctx);
        ASSERT_EQ(tsl_pool_forward(&ap, x, a), TSL_OK);
        ASSERT_EQ(tsl_upsample_nearest_forward(scale, x, u), TSL_OK);
        ASSERT_EQ(tsl_pool_backward(&mp, x, m, dxm), TSL_OK) << tsl_context_last_error(ctx);
        ASSERT_EQ(tsl_pool_backward(&ap, x, a, dxa), TSL_OK);
        ASSERT_EQ(tsl_upsample_nearest_backward(scale, u, dxu), TSL_OK);
        std::vector<std::vector<double>> got = {gather(m),   gather(a),   gather(u),
                                                gather(dxm), gather(dxa), gather(dxu)};
        if (rank == 0) {
            if (ref.empty())
                ref = got;
            for (int k = 0; k < 6; k++)
                EXPECT_EQ(got[k], ref[k]) << "result " << k << ", grid " << g[0] << "x" << g[1];
        }
        for (tsl_tensor_t t : {x, m, a, u, dxm, dxa, dxu})
            tsl_tensor_destroy(t);
    }
    tsl_tensor_t xs = make_tensor(TSL_F64, {3, 4, 9, 8}, {1, 1, 3, 1}, block);
    tsl_tensor_t ys = make_tensor(TSL_F64, {3, 4, 5, 4}, {1, 1, 3, 1}, block);
    EXPECT_EQ(tsl_pool_forward(&mp, xs, ys), TSL_ERR_SHAPE);
    tsl_tensor_destroy(xs);
    tsl_tensor_destroy(ys);
}

namespace
{

// Collective gather of an f32 or f64 tensor to rank 0, as stored.
template <typename T> std::vector<T> gather_as(tsl_tensor_t t)
{
    tsl_shape s;
    tsl_tensor_shape(t, &s);
    std::vector<T> out((size_t)tsl_shape_numel(&s), (T)NAN);
    EXPECT_EQ(tsl_tensor_gather(t, 0, rank == 0 ? out.data() : nullptr), TSL_OK);
    return out;
}

// Linear upsampling of x (N, C, spatial...) on one grid and owner maps, x and dy drawn from the
// run's seed, outputs poisoned first. Gathered on rank 0: y, dx, and x, dy for the kernel check.
template <typename T>
std::vector<std::vector<T>> upsample_linear_on(tsl_dtype dt, const std::vector<int64_t> &xd,
                                               const int64_t *scale, const std::vector<int32_t> &g,
                                               const tsl_owner_map &in_owners,
                                               const tsl_owner_map &out_owners)
{
    std::vector<int64_t> yd = xd;
    for (size_t d = 2; d < xd.size(); d++)
        yd[d] *= scale[d - 2];
    tsl_tensor_t x = make_tensor(dt, xd, g, in_owners), y = make_tensor(dt, yd, g, out_owners);
    tsl_tensor_t dy = make_tensor(dt, yd, g, in_owners), dx = make_tensor(dt, xd, g, out_owners);
    EXPECT_EQ(tsl_tensor_fill_normal(x, seed + 120, 0, 1), TSL_OK);
    EXPECT_EQ(tsl_tensor_fill_normal(dy, seed + 121, 0, 1), TSL_OK);
    EXPECT_EQ(tsl_tensor_fill_constant(y, 1e30), TSL_OK); // poison: overwritten (NaN is refused)
    EXPECT_EQ(tsl_tensor_fill_constant(dx, 1e30), TSL_OK);
    EXPECT_EQ(tsl_upsample_linear_forward(scale, x, y), TSL_OK) << tsl_context_last_error(ctx);
    EXPECT_EQ(tsl_upsample_linear_backward(scale, dy, dx), TSL_OK) << tsl_context_last_error(ctx);
    std::vector<std::vector<T>> got = {gather_as<T>(y), gather_as<T>(dx), gather_as<T>(x),
                                       gather_as<T>(dy)};
    for (tsl_tensor_t t : {x, y, dy, dx})
        tsl_tensor_destroy(t);
    return got;
}

template <typename T>
void check_upsample_linear_layouts(tsl_dtype dt, const std::vector<int64_t> &xd,
                                   const int64_t *scale)
{
    tsl_owner_map block = tsl_owner_block(nullptr), rev = tsl_owner_callback(reversed, nullptr),
                  cyclic = tsl_owner_callback(round_robin, nullptr);
    const size_t nd = xd.size();
    auto grid = [nd](int32_t n, int32_t c) {
        std::vector<int32_t> g(nd, 1);
        g[0] = n;
        g[1] = c;
        return g;
    };
    std::vector<std::vector<T>> ref;
    struct Case {
        std::vector<int32_t> grid;
        tsl_owner_map in, out;
    };
    const Case cases[] = {{grid(1, 1), tsl_owner_single(0), tsl_owner_single(0)},
                          {grid(1, 1), rev, block},
                          {grid(2, 1), rev, block},
                          {grid(3, 2), cyclic, rev},
                          {grid(1, 4), block, cyclic},
                          {grid(3, 4), rev, cyclic}};
    for (const Case &c : cases) {
        auto got = upsample_linear_on<T>(dt, xd, scale, c.grid, c.in, c.out);
        if (rank != 0)
            continue;
        if (ref.empty()) {
            // The one-tile result is the kernel applied to the whole array.
            ref = got;
            tsl_pool_args a{};
            a.dtype = dt;
            a.kind = TSL_UPSAMPLE_LINEAR;
            a.spatial = (int32_t)nd - 2;
            a.planes = xd[0] * xd[1];
            for (int d = 0; d < a.spatial; d++) {
                a.in_size[d] = xd[(size_t)d + 2];
                a.kernel[d] = scale[d];
                a.out_size[d] = xd[(size_t)d + 2] * scale[d];
            }
            std::vector<T> y(ref[0].size(), (T)NAN), dx(ref[1].size(), (T)NAN);
            tsl_upsample_forward_kernel(&a, ref[2].data(), y.data());
            tsl_upsample_backward_kernel(&a, ref[3].data(), dx.data());
            EXPECT_EQ(ref[0], y) << "y, one tile vs kernel";
            EXPECT_EQ(ref[1], dx) << "dx, one tile vs kernel";
            for (int k = 0; k < 2; k++)
                for (T v : ref[(size_t)k])
                    ASSERT_LT(std::fabs(v), (T)1e3) << (k ? "dx" : "y") << " kept the poison";
        }
        // Tiles hold whole planes: every layout gives the one-tile bits.
        EXPECT_EQ(got[0], ref[0]) << "y, grid " << c.grid[0] << "x" << c.grid[1];
        EXPECT_EQ(got[1], ref[1]) << "dx, grid " << c.grid[0] << "x" << c.grid[1];
    }
}

} // namespace

TEST(Upsampling, LinearEveryLayoutMatchesOneTileAndTheKernel)
{
    const int64_t s1[1] = {3}, s2[2] = {2, 3}, s3[3] = {2, 1, 3};
    check_upsample_linear_layouts<double>(TSL_F64, {3, 4, 7}, s1);
    check_upsample_linear_layouts<double>(TSL_F64, {3, 4, 5, 7}, s2);
    check_upsample_linear_layouts<double>(TSL_F64, {3, 4, 3, 5, 1}, s3);
    check_upsample_linear_layouts<float>(TSL_F32, {3, 4, 5, 3}, s2);
}

namespace
{

// Upsampling to y's sizes (no scale) of x (f32) on tiles cut by `splits` (empty: one tile),
// owners xo for x and dy, yo for y and dx, outputs poisoned first; y and dx gathered on rank 0,
// then x and dy.
std::vector<std::vector<float>> resize_on(int linear, const std::vector<int64_t> &xd,
                                          const std::vector<int64_t> &yd,
                                          const std::vector<int32_t> &splits,
                                          const tsl_owner_map &xo, const tsl_owner_map &yo,
                                          tsl_layout layout)
{
    tsl_tensor_t x = make_tensor(TSL_F32, xd, splits, xo, layout);
    tsl_tensor_t dx = make_tensor(TSL_F32, xd, splits, yo, layout);
    tsl_tensor_t y = make_tensor(TSL_F32, yd, splits, yo, layout);
    tsl_tensor_t dy = make_tensor(TSL_F32, yd, splits, xo, layout);
    EXPECT_EQ(tsl_tensor_fill_uniform(x, seed + 130, -1, 1), TSL_OK);
    EXPECT_EQ(tsl_tensor_fill_uniform(dy, seed + 131, -1, 1), TSL_OK);
    for (tsl_tensor_t t : {y, dx})
        EXPECT_EQ(tsl_tensor_fill_constant(t, 1e6), TSL_OK);
    if (linear) {
        EXPECT_EQ(tsl_upsample_linear_forward(nullptr, x, y), TSL_OK)
            << tsl_context_last_error(ctx);
        EXPECT_EQ(tsl_upsample_linear_backward(nullptr, dy, dx), TSL_OK)
            << tsl_context_last_error(ctx);
    } else {
        EXPECT_EQ(tsl_upsample_nearest_forward(nullptr, x, y), TSL_OK)
            << tsl_context_last_error(ctx);
        EXPECT_EQ(tsl_upsample_nearest_backward(nullptr, dy, dx), TSL_OK)
            << tsl_context_last_error(ctx);
    }
    std::vector<std::vector<float>> got = gather_all({y, dx, x, dy});
    for (tsl_tensor_t t : {x, dx, y, dy})
        tsl_tensor_destroy(t);
    return got;
}

// The sources of output o of an upsampling from `in` to `out` positions, written here as
// PyTorch's upsample_nearest and upsample_linear (align_corners=False) compute them.
void resize_sources(int linear, int64_t in, int64_t out, int64_t o, int64_t *i0, int64_t *i1,
                    double *l1)
{
    if (!linear) {
        float r = (float)in / (float)out;
        *i0 = *i1 = std::min((int64_t)std::floor((float)o * r), in - 1);
        *l1 = 0;
        return;
    }
    double src = std::max(0.0, ((double)o + 0.5) * (double)in / (double)out - 0.5);
    *i0 = std::min((int64_t)std::floor(src), in - 1);
    *i1 = std::min(*i0 + 1, in - 1);
    *l1 = src - (double)*i0;
}

// y of x (N, C, spatial... in plain order) resized to yd, per element in double.
std::vector<double> resize_reference(int linear, const std::vector<int64_t> &xd,
                                     const std::vector<int64_t> &yd, const std::vector<float> &x)
{
    const size_t sp = xd.size() - 2;
    int64_t in_plane = 1, out_plane = 1;
    for (size_t d = 0; d < sp; d++) {
        in_plane *= xd[2 + d];
        out_plane *= yd[2 + d];
    }
    std::vector<double> y((size_t)(xd[0] * xd[1] * out_plane));
    for (int64_t pl = 0; pl < xd[0] * xd[1]; pl++)
        for (int64_t o = 0; o < out_plane; o++) {
            int64_t i0[3], i1[3], rest = o;
            double l1[3];
            for (int d = (int)sp - 1; d >= 0; d--) {
                resize_sources(linear, xd[2 + (size_t)d], yd[2 + (size_t)d],
                               rest % yd[2 + (size_t)d], &i0[d], &i1[d], &l1[d]);
                rest /= yd[2 + (size_t)d];
            }
            double v = 0;
            for (int corner = 0; corner < (1 << sp); corner++) {
                double w = 1;
                int64_t at = 0;
                for (size_t d = 0; d < sp; d++) {
                    bool upper = (corner >> d) & 1;
                    w *= upper ? l1[d] : 1 - l1[d];
                    at = at * xd[2 + d] + (upper ? i1[d] : i0[d]);
                }
                v += w * (double)x[(size_t)(pl * in_plane + at)];
            }
            y[(size_t)(pl * out_plane + o)] = v;
        }
    return y;
}

} // namespace

// Upsampling to any size (PyTorch's size=; larger and smaller than the input along different
// dimensions), nearest and linear, 1-D to 3-D: one tile against a per-element reference of
// PyTorch's source choice, the backward by the adjoint identity <up(x), dy> = <x, up^T(dy)>;
// spatial, sample and channel tiles (halos from the neighbours, several ranks) and
// channels-last tiles against one tile; outputs poisoned first.
TEST(Upsampling, ToAnySizeOnEveryTilingMatchesOneTileAndTheReference)
{
    struct Case {
        std::vector<int64_t> x, y;
        std::vector<int32_t> splits;
    };
    const Case cases[] = {
        {{2, 3, 9}, {2, 3, 20}, {1, 1, 3}},
        {{1, 2, 13}, {1, 2, 5}, {1, 1, 2}},
        {{2, 3, 7, 5}, {2, 3, 12, 4}, {1, 1, 2, 2}},
        {{2, 2, 6, 10}, {2, 2, 17, 7}, {2, 1, 3, 1}},
        {{1, 2, 5, 4, 3}, {1, 2, 7, 9, 2}, {1, 2, 2, 2, 1}},
    };
    tsl_owner_map block = tsl_owner_block(nullptr), rev = tsl_owner_callback(reversed, nullptr),
                  root = tsl_owner_single(0);
    for (int linear = 0; linear < 2; linear++)
        for (size_t n = 0; n < sizeof cases / sizeof cases[0]; n++) {
            const Case &c = cases[n];
            SCOPED_TRACE(std::string(linear ? "linear" : "nearest") + ", case " +
                         std::to_string(n));
            auto one = resize_on(linear, c.x, c.y, {}, root, root, TSL_LAYOUT_PLAIN);
            auto got = resize_on(linear, c.x, c.y, c.splits, block, rev, TSL_LAYOUT_PLAIN);
            auto cl = resize_on(linear, c.x, c.y, c.splits, rev, block, TSL_LAYOUT_CHANNELS_LAST);
            if (rank != 0)
                continue;
            std::vector<double> want = resize_reference(linear, c.x, c.y, one[2]);
            ASSERT_EQ(want.size(), one[0].size());
            for (size_t i = 0; i < want.size(); i++)
                ASSERT_NEAR(one[0][i], want[i], 1e-6 * (1 + std::fabs(want[i])))
                    << "y[" << i << "]";
            double lhs = 0, rhs = 0;
            for (size_t i = 0; i < want.size(); i++)
                lhs += (double)one[0][i] * (double)one[3][i];
            for (size_t i = 0; i < one[1].size(); i++) {
                ASSERT_LT(std::fabs(one[1][i]), 1e3f) << "dx kept the poison at " << i;
                rhs += (double)one[2][i] * (double)one[1][i];
            }
            EXPECT_NEAR(lhs, rhs, 1e-4 * (1 + std::fabs(lhs))) << "adjoint identity";
            // The inputs are the same draws on every tiling (the fill is layout-independent).
            EXPECT_EQ(got[2], one[2]);
            EXPECT_EQ(cl[2], one[2]);
            EXPECT_EQ(got[0], one[0]) << "y, tiled"; // the same arithmetic per output
            EXPECT_EQ(cl[0], one[0]) << "y, channels-last";
            EXPECT_LT(max_rel_diff(got[1], one[1]), 1e-5) << "dx, tiled";
            EXPECT_LT(max_rel_diff(cl[1], one[1]), 1e-5) << "dx, channels-last";
        }
}

TEST(Upsampling, LinearBadArgumentsAreErrors)
{
    tsl_owner_map block = tsl_owner_block(nullptr);
    const int64_t scale[2] = {2, 3}, zero[2] = {2, 0}, huge[2] = {(int64_t)1 << 21, 1};
    tsl_tensor_t x = make_tensor(TSL_F64, {2, 3, 5, 4}, {2, 1, 1, 1}, block);
    tsl_tensor_t y = make_tensor(TSL_F64, {2, 3, 10, 12}, {2, 1, 1, 1}, block);
    tsl_tensor_t wrong = make_tensor(TSL_F64, {2, 3, 10, 11}, {2, 1, 1, 1}, block);
    tsl_tensor_t other_tiles = make_tensor(TSL_F64, {2, 3, 10, 12}, {1, 1, 1, 1}, block);
    tsl_tensor_t spatial_tiles = make_tensor(TSL_F64, {2, 3, 10, 12}, {2, 1, 2, 1}, block);
    tsl_tensor_t yf = make_tensor(TSL_F32, {2, 3, 10, 12}, {2, 1, 1, 1}, block);
    ASSERT_EQ(tsl_tensor_fill_constant(x, 1.5), TSL_OK);
    ASSERT_EQ(tsl_tensor_fill_constant(y, -7.0), TSL_OK);
    ASSERT_EQ(tsl_tensor_fill_constant(wrong, -7.0), TSL_OK);

    EXPECT_EQ(tsl_upsample_linear_forward(zero, x, y), TSL_ERR_INVALID_ARG);
    EXPECT_NE(std::strstr(tsl_context_last_error(ctx), "tsl_upsample_linear_forward"), nullptr);
    EXPECT_EQ(tsl_upsample_linear_backward(zero, y, x), TSL_ERR_INVALID_ARG);
    EXPECT_NE(std::strstr(tsl_context_last_error(ctx), "tsl_upsample_linear_backward"), nullptr);
    EXPECT_EQ(tsl_upsample_linear_forward(huge, x, y), TSL_ERR_INVALID_ARG);
    // Without a scale, y's sizes are the output's: any, but N and C are x's and tiles match.
    EXPECT_EQ(tsl_upsample_linear_forward(nullptr, x, other_tiles), TSL_ERR_SHAPE);
    EXPECT_EQ(tsl_upsample_linear_forward(nullptr, x, spatial_tiles), TSL_ERR_SHAPE);
    EXPECT_EQ(tsl_upsample_nearest_forward(nullptr, x, yf), TSL_ERR_DTYPE);
    EXPECT_EQ(tsl_upsample_linear_forward(nullptr, x, x), TSL_ERR_INVALID_ARG); // y == x
    EXPECT_EQ(tsl_upsample_linear_forward(scale, x, wrong), TSL_ERR_SHAPE);
    EXPECT_EQ(tsl_upsample_linear_backward(scale, wrong, x), TSL_ERR_SHAPE);
    EXPECT_EQ(tsl_upsample_linear_forward(scale, y, x), TSL_ERR_SHAPE); // downsampling
    EXPECT_EQ(tsl_upsample_linear_forward(scale, x, other_tiles), TSL_ERR_SHAPE);
    EXPECT_EQ(tsl_upsample_linear_forward(scale, x, spatial_tiles), TSL_ERR_SHAPE);
    EXPECT_EQ(tsl_upsample_linear_forward(scale, x, yf), TSL_ERR_DTYPE);
    EXPECT_NE(tsl_upsample_linear_forward(scale, x, nullptr), TSL_OK);
    // Failed calls leave the output alone.
    for (tsl_tensor_t t : {y, wrong}) {
        std::vector<double> v = gather(t);
        if (rank == 0)
            for (double e : v)
                ASSERT_EQ(e, -7.0);
    }
    std::vector<double> xv = gather(x);
    if (rank == 0)
        for (double e : xv)
            ASSERT_EQ(e, 1.5);
    for (tsl_tensor_t t : {x, y, wrong, other_tiles, spatial_tiles, yf})
        tsl_tensor_destroy(t);
}

TEST(Losses, SoftDiceIsBitIdenticalOnEveryLayout)
{
    tsl_owner_map block = tsl_owner_block(nullptr), rev = tsl_owner_callback(reversed, nullptr);
    double ref = NAN;
    std::vector<float> ref_grad;
    for (int run = 0; run < 6; run++) { // four grids plain, two channels-last
        const std::vector<int32_t> grids[4] = {
            {1, 1, 1, 1}, {2, 1, 1, 1}, {1, 1, 3, 2}, {2, 1, 2, 3}};
        std::vector<int32_t> g = grids[run < 4 ? run : run - 3];
        tsl_layout lay = run < 4 ? TSL_LAYOUT_PLAIN : TSL_LAYOUT_CHANNELS_LAST;
        std::vector<int32_t> lg = {g[0], g[2], g[3]};
        tsl_tensor_t x = make_tensor(TSL_F32, {2, 4, 9, 7}, g, rev, lay);
        tsl_tensor_t y = make_tensor(TSL_U8, {2, 9, 7}, lg, block);
        tsl_tensor_t dx = make_tensor(TSL_F32, {2, 4, 9, 7}, g, block, lay);
        ASSERT_EQ(tsl_tensor_fill_normal(x, seed + 110, 0, 2), TSL_OK);
        ASSERT_EQ(tsl_tensor_fill_uniform(y, seed + 111, 0, 4), TSL_OK);
        double loss = NAN;
        ASSERT_EQ(tsl_loss_dice(x, y, dx, 1e-5, &loss), TSL_OK) << tsl_context_last_error(ctx);
        EXPECT_GT(loss, 0.0);
        EXPECT_LT(loss, 1.0);
        std::vector<float> grad(2 * 4 * 9 * 7, NAN);
        ASSERT_EQ(tsl_tensor_gather(dx, 0, rank == 0 ? grad.data() : nullptr), TSL_OK);
        if (std::isnan(ref)) {
            ref = loss;
            ref_grad = grad;
        } else {
            EXPECT_EQ(loss, ref) << g[0] << "x" << g[2] << "x" << g[3];
            if (rank == 0)
                EXPECT_EQ(grad, ref_grad) << g[0] << "x" << g[2] << "x" << g[3];
        }
        ASSERT_EQ(tsl_tensor_fill_constant(y, 4), TSL_OK); // class 4 of 4: out of range
        EXPECT_EQ(tsl_loss_dice(x, y, nullptr, 1e-5, &loss), TSL_ERR_INVALID_ARG);
        EXPECT_EQ(tsl_loss_dice(x, y, nullptr, -1.0, &loss), TSL_ERR_INVALID_ARG);
        for (tsl_tensor_t t : {x, y, dx})
            tsl_tensor_destroy(t);
    }
}

// Average pooling's backward reads dy alone: x is destroyed after the forward and the backward
// takes NULL for it (dx gives the input's tiles), on whole, sample and spatial tiles; dx (poisoned
// first) equals a direct sum of each window's share. Max pooling without x is an error that
// leaves dx as it was.
TEST(Pooling, AverageBackwardReadsNoInput)
{
    tsl_owner_map block = tsl_owner_block(nullptr);
    tsl_pool_params p, mp;
    ASSERT_EQ(tsl_pool_params_init(&p, TSL_POOL_AVG, 2, 3), TSL_OK);
    ASSERT_EQ(tsl_pool_params_init(&mp, TSL_POOL_MAX, 2, 3), TSL_OK);
    p.count_include_pad = 0;
    for (int d = 0; d < 2; d++) {
        p.stride[d] = mp.stride[d] = 2;
        p.padding[d] = mp.padding[d] = 1;
    }
    const int64_t n = 2, c = 3, h = 9, w = 10, oh = 5, ow = 5; // (9 + 2 - 3) / 2 + 1, likewise
    for (std::vector<int32_t> g : {std::vector<int32_t>{1, 1, 1, 1}, {2, 1, 1, 1}, {1, 1, 2, 2}}) {
        tsl_tensor_t x = make_tensor(TSL_F32, {n, c, h, w}, g, block);
        tsl_tensor_t y = make_tensor(TSL_F32, {n, c, oh, ow}, g, block);
        tsl_tensor_t dy = make_tensor(TSL_F32, {n, c, oh, ow}, g, block);
        tsl_tensor_t dx = make_tensor(TSL_F32, {n, c, h, w}, g, block);
        ASSERT_EQ(tsl_tensor_fill_uniform(x, seed + 130, -1, 1), TSL_OK);
        ASSERT_EQ(tsl_tensor_fill_uniform(dy, seed + 131, -1, 1), TSL_OK);
        ASSERT_EQ(tsl_tensor_fill_constant(dx, 1e6), TSL_OK);
        ASSERT_EQ(tsl_pool_forward(&p, x, y), TSL_OK) << tsl_context_last_error(ctx);
        tsl_tensor_destroy(x);
        EXPECT_EQ(tsl_pool_backward(&mp, nullptr, dy, dx), TSL_ERR_INVALID_ARG);
        std::vector<float> poisoned = gather_as<float>(dx);
        ASSERT_EQ(tsl_pool_backward(&p, nullptr, dy, dx), TSL_OK) << tsl_context_last_error(ctx);
        std::vector<float> got = gather_as<float>(dx), grad = gather_as<float>(dy);
        if (rank == 0) {
            for (float v : poisoned)
                ASSERT_EQ(v, 1e6f) << "max pooling without x changed dx";
            std::vector<double> want((size_t)(n * c * h * w), 0.0);
            for (int64_t pl = 0; pl < n * c; pl++)
                for (int64_t i = 0; i < oh; i++)
                    for (int64_t j = 0; j < ow; j++) {
                        int64_t r0 = std::max<int64_t>(2 * i - 1, 0),
                                r1 = std::min<int64_t>(2 * i + 2, h),
                                c0 = std::max<int64_t>(2 * j - 1, 0),
                                c1 = std::min<int64_t>(2 * j + 2, w);
                        double share = grad[(size_t)((pl * oh + i) * ow + j)] /
                                       (double)((r1 - r0) * (c1 - c0));
                        for (int64_t r = r0; r < r1; r++)
                            for (int64_t q = c0; q < c1; q++)
                                want[(size_t)((pl * h + r) * w + q)] += share;
                    }
            for (size_t i = 0; i < want.size(); i++)
                ASSERT_NEAR(got[i], want[i], 1e-6)
                    << "element " << i << ", grid " << g[2] << "x" << g[3];
        }
        for (tsl_tensor_t t : {y, dy, dx})
            tsl_tensor_destroy(t);
    }
}
