// Dropout (tsl_graph_dropout): in training a fraction p of the elements is zeroed and the rest
// scaled by 1 / (1 - p), in inference x passes; the draws depend on the model's seed, the op,
// the step count (tsl_model_set_step) and the element alone, so every plan and rank count drops
// the same elements (the loss and gradients of spatial and data plans equal the one-tile run's
// within rounding, where another mask would be off by far more), and the backward uses the
// forward's mask (central finite differences at a fixed step). Runs at 1, 2 and 4 ranks.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "model_test.h"
#include "mpi_test_env.h"

using namespace tsltest;

namespace
{

const int64_t kClasses = 3;

// (2, 8, 8) -> conv 3x3 (4 channels) -> tanh -> dropout p -> conv 3x3 (4) -> global average
// pooling -> linear: a classifier with a dropout between two convolutions.
tsl_graph_t dropout_net(double p)
{
    const int64_t sample[3] = {2, 8, 8}, k[2] = {3, 3};
    tsl_conv_params cp;
    tsl_conv_params_init(&cp, 2);
    cp.padding[0] = cp.padding[1] = 1;
    tsl_pool_params gap;
    tsl_pool_params_init(&gap, TSL_POOL_AVG, 2, 8);
    tsl_graph_t g = nullptr;
    int32_t v;
    bool ok = tsl_graph_create(&g) == TSL_OK && tsl_graph_input(g, 3, sample, &v) == TSL_OK &&
              tsl_graph_conv(g, "c1", v, 4, k, &cp, 0, 1, &v) == TSL_OK &&
              tsl_graph_activation(g, v, TSL_ACT_TANH, 0, &v) == TSL_OK &&
              tsl_graph_dropout(g, v, p, &v) == TSL_OK &&
              tsl_graph_conv(g, "c2", v, 4, k, &cp, 0, 1, &v) == TSL_OK &&
              tsl_graph_pool(g, v, &gap, &v) == TSL_OK && tsl_graph_flatten(g, v, &v) == TSL_OK &&
              tsl_graph_linear(g, "fc", v, kClasses, 1, &v) == TSL_OK &&
              tsl_graph_set_output(g, v) == TSL_OK;
    EXPECT_TRUE(ok) << tsl_last_error();
    return ok ? g : nullptr;
}

double rel(const std::vector<float> &a, const std::vector<float> &b)
{
    double d = 0, s = 0;
    for (size_t i = 0; i < a.size(); i++) {
        d = std::max(d, (double)std::fabs(a[i] - b[i]));
        s = std::max(s, (double)std::fabs(b[i]));
    }
    return d / (s > 0 ? s : 1);
}

} // namespace

// A (4, 16, 16) input through dropout p = 0.3 alone (the output, 4 "classes" per position):
// every element is 0 or x times 1 / 0.7, about 30 % are 0, inference passes x, the next step
// draws another mask and setting the step back draws this one again.
TEST(Dropout, DropsAFractionPAndScalesTheRest)
{
    const int64_t sample[3] = {4, 16, 16}, n = 2, per = 4 * 16 * 16;
    const double p = 0.3;
    tsl_graph_t g = nullptr;
    int32_t x, y;
    ASSERT_EQ(tsl_graph_create(&g), TSL_OK);
    ASSERT_EQ(tsl_graph_input(g, 3, sample, &x), TSL_OK);
    ASSERT_EQ(tsl_graph_dropout(g, x, p, &y), TSL_OK);
    ASSERT_EQ(tsl_graph_set_output(g, y), TSL_OK);
    EXPECT_EQ(tsl_graph_dropout(g, x, 1.0, &y), TSL_ERR_INVALID_ARG);
    EXPECT_EQ(tsl_graph_dropout(g, x, -0.1, &y), TSL_ERR_INVALID_ARG);
    tsl_model_t m = nullptr;
    ASSERT_EQ(tsl_model_create(&m, ctx, g, seed + 3), TSL_OK) << tsl_context_last_error(ctx);
    Batch b = make_batch(n, per, 4, seed + 4);
    std::vector<float> out((size_t)(n * per)), again(out.size()), next(out.size()),
        infer(out.size());
    ASSERT_EQ(tsl_model_set_step(m, 11), TSL_OK);
    ASSERT_EQ(tsl_model_forward(m, n, b.x.data(), 1, out.data()), TSL_OK);
    int64_t step = 0;
    ASSERT_EQ(tsl_model_step(m, &step), TSL_OK);
    EXPECT_EQ(step, 12);
    ASSERT_EQ(tsl_model_forward(m, n, b.x.data(), 1, next.data()), TSL_OK);
    ASSERT_EQ(tsl_model_set_step(m, 11), TSL_OK);
    ASSERT_EQ(tsl_model_forward(m, n, b.x.data(), 1, again.data()), TSL_OK);
    ASSERT_EQ(tsl_model_forward(m, n, b.x.data(), 0, infer.data()), TSL_OK);
    if (rank == 0) {
        int64_t zeros = 0, kept = 0, other = 0, moved = 0;
        for (size_t i = 0; i < out.size(); i++) {
            float scaled = (float)((double)b.x[i] * (1.0 / (1.0 - p)));
            zeros += out[i] == 0.0f && b.x[i] != 0.0f;
            kept += out[i] == scaled;
            other += out[i] != 0.0f && out[i] != scaled;
            moved += (out[i] == 0.0f) != (next[i] == 0.0f);
        }
        double frac = (double)zeros / (double)out.size();
        EXPECT_EQ(other, 0) << "every element is 0 or x / (1 - p)";
        EXPECT_EQ(zeros + kept, (int64_t)out.size());
        EXPECT_NEAR(frac, p, 0.05) << zeros << " zeros of " << out.size();
        EXPECT_GT(moved, (int64_t)out.size() / 5) << "the next step draws another mask";
        EXPECT_EQ(again, out) << "the same step draws the same mask";
        EXPECT_EQ(infer, b.x) << "inference passes x";
    }
    tsl_model_destroy(m);
    tsl_graph_destroy(g);
}

// The loss and every gradient at a fixed step under the plans of this rank count equal the
// default plan's within the rounding other tiles bring (a different mask would change them by
// far more: the check below sees the step's mask change them).
TEST(Dropout, EveryPlanDropsTheSameElements)
{
    if (size == 3 || size > 4)
        GTEST_SKIP() << "plans for 1, 2 and 4 ranks";
    const std::vector<std::string> plans[3] = {{"tiles=2", "tiles=4"},
                                               {"space=2", "data=2", "space=1x2"},
                                               {"space=2x2", "data=2,space=2"}};
    tsl_graph_t g = dropout_net(0.4);
    ASSERT_NE(g, nullptr);
    const int64_t n = 4;
    Batch b = make_batch(n, 2 * 8 * 8, kClasses, seed + 5);
    auto run = [&](const tsl_plan *plan, int64_t step, double *loss,
                   std::vector<std::vector<float>> *res) {
        tsl_model_t m = nullptr;
        ASSERT_EQ(tsl_model_create_plan(&m, ctx, g, seed + 6, plan), TSL_OK)
            << tsl_context_last_error(ctx);
        ASSERT_EQ(tsl_model_set_step(m, step), TSL_OK);
        ASSERT_EQ(tsl_model_gradients(m, n, b.x.data(), b.y.data(), loss), TSL_OK)
            << tsl_context_last_error(ctx);
        push_params(m, g, true, res);
        tsl_model_destroy(m);
    };
    double ref_loss = 0, other_loss = 0;
    std::vector<std::vector<float>> ref, other;
    run(nullptr, 3, &ref_loss, &ref);
    run(nullptr, 4, &other_loss, &other);
    double mask_effect = 0;
    for (size_t k = 0; k < ref.size(); k++)
        mask_effect = std::max(mask_effect, rel(other[k], ref[k]));
    EXPECT_GT(mask_effect, 1e-2) << "another step's mask changes the gradients";
    for (const std::string &text : plans[size == 1 ? 0 : size == 2 ? 1 : 2]) {
        SCOPED_TRACE("plan " + text);
        tsl_plan plan;
        ASSERT_EQ(tsl_plan_parse(text.c_str(), &plan), TSL_OK);
        double loss = 0;
        std::vector<std::vector<float>> got;
        run(&plan, 3, &loss, &got);
        EXPECT_NEAR(loss, ref_loss, 1e-5 * std::fabs(ref_loss));
        ASSERT_EQ(got.size(), ref.size());
        for (size_t k = 0; k < ref.size(); k++)
            EXPECT_LT(rel(got[k], ref[k]), 1e-4) << "gradient " << k;
    }
    tsl_graph_destroy(g);
}

// The backward goes through the forward's mask: the gradient of the first convolution's
// weights equals central finite differences of the loss at the same step.
TEST(Dropout, GradientsMatchFiniteDifferencesAtAFixedStep)
{
    tsl_graph_t g = dropout_net(0.5);
    ASSERT_NE(g, nullptr);
    const int64_t n = 2, step = 9;
    Batch b = make_batch(n, 2 * 8 * 8, kClasses, seed + 7);
    tsl_model_t m = nullptr;
    ASSERT_EQ(tsl_model_create(&m, ctx, g, seed + 8), TSL_OK) << tsl_context_last_error(ctx);
    tsl_tensor_t w = nullptr, dw = nullptr;
    ASSERT_EQ(tsl_model_param(m, 0, &w, &dw), TSL_OK); // c1.weight
    double loss = 0;
    ASSERT_EQ(tsl_model_set_step(m, step), TSL_OK);
    ASSERT_EQ(tsl_model_gradients(m, n, b.x.data(), b.y.data(), &loss), TSL_OK);
    std::vector<float> grad = values(dw), w0 = values(w);
    const double eps = 1e-2;
    for (size_t i : {(size_t)0, (size_t)13, (size_t)40, w0.size() - 1}) {
        double l[2];
        for (int s = 0; s < 2; s++) {
            std::vector<float> wv = w0;
            wv[i] += (float)(s ? -eps : eps);
            set_values(w, wv);
            ASSERT_EQ(tsl_model_set_step(m, step), TSL_OK);
            ASSERT_EQ(tsl_model_gradients(m, n, b.x.data(), b.y.data(), &l[s]), TSL_OK);
        }
        double fd = (l[0] - l[1]) / (2 * eps);
        EXPECT_NEAR(grad[i], fd, 2e-3 + 2e-2 * std::fabs(fd)) << "weight " << i;
    }
    set_values(w, w0);
    tsl_model_destroy(m);
    tsl_graph_destroy(g);
}
