// Model graphs: shape inference, PyTorch parameter names and shapes, estimates, and errors
// for bad calls (which leave the graph unchanged).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

extern "C" {
#include "tessel/graph.h"
#include "tessel/plan.h"

extern "C" {
#include "graph_internal.h"
#include "op_table.h"
#include "plan_internal.h"
}
}

#include "graph_helpers.h"

namespace
{

std::vector<int64_t> dims_of(tsl_graph_t g, int32_t v)
{
    tsl_shape s;
    EXPECT_EQ(tsl_graph_value_shape(g, v, &s), TSL_OK);
    return std::vector<int64_t>(s.dims, s.dims + s.ndim);
}

} // namespace

TEST(Graph, ZooCnnHasPyTorchNamesShapesAndFlops)
{
    int64_t sample[3] = {1, 28, 28};
    tsl_graph_t g = nullptr;
    ASSERT_EQ(tsl_zoo_graph("cnn", 3, sample, 10, &g), TSL_OK) << tsl_last_error();
    // The state_dict of the same PyTorch module (conv without bias before batch norm).
    struct P {
        const char *name;
        std::vector<int64_t> shape;
        int trainable;
    };
    const P want[] = {
        {"conv1.weight", {32, 1, 3, 3}, 1},
        {"bn1.weight", {32}, 1},
        {"bn1.bias", {32}, 1},
        {"bn1.running_mean", {32}, 0},
        {"bn1.running_var", {32}, 0},
        {"conv2.weight", {64, 32, 3, 3}, 1},
        {"bn2.weight", {64}, 1},
        {"bn2.bias", {64}, 1},
        {"bn2.running_mean", {64}, 0},
        {"bn2.running_var", {64}, 0},
        {"fc1.weight", {128, 3136}, 1},
        {"fc1.bias", {128}, 1},
        {"fc2.weight", {10, 128}, 1},
        {"fc2.bias", {10}, 1},
    };
    ASSERT_EQ(tsl_graph_param_count(g), (int32_t)(sizeof want / sizeof want[0]));
    for (int32_t i = 0; i < tsl_graph_param_count(g); i++) {
        const char *name;
        tsl_shape s;
        int32_t trainable;
        ASSERT_EQ(tsl_graph_param_info(g, i, &name, &s, &trainable), TSL_OK);
        EXPECT_STREQ(name, want[i].name);
        EXPECT_EQ(std::vector<int64_t>(s.dims, s.dims + s.ndim), want[i].shape) << name;
        EXPECT_EQ(trainable, want[i].trainable) << name;
    }
    int32_t out = tsl_graph_output(g);
    ASSERT_GE(out, 0);
    EXPECT_EQ(dims_of(g, out), (std::vector<int64_t>{10}));
    // Forward flops by hand: conv1 28*28*32*9*2, conv2 14*14*64*32*9*2, fc1 3136*128*2 + 128,
    // fc2 128*10*2 + 10, batch norms 4 per element, ReLUs 1, 2x2 max pools 4 per output.
    double conv = 28.0 * 28 * 32 * 9 * 2 + 14.0 * 14 * 64 * 32 * 9 * 2;
    double fc = 3136.0 * 128 * 2 + 128 + 128.0 * 10 * 2 + 10;
    double bn = 4.0 * (28 * 28 * 32 + 14 * 14 * 64);
    double relu = 28 * 28 * 32 + 14 * 14 * 64 + 128;
    double pool = 4.0 * (14 * 14 * 32 + 7 * 7 * 64);
    double flops;
    int64_t act, par;
    ASSERT_EQ(tsl_graph_estimate(g, 3, &flops, &act, &par), TSL_OK);
    EXPECT_DOUBLE_EQ(flops, 3 * (conv + fc + bn + relu + pool));
    int64_t params = 32 * 9 + 4 * 32 + 64 * 32 * 9 + 4 * 64 + 128 * 3136 + 128 + 10 * 128 + 10;
    EXPECT_EQ(par, 4 * params);
    EXPECT_GT(act, 0);
    tsl_graph_destroy(g);
}

TEST(Graph, ShapesOfConvPoolUpsampleConcatAddTransposed)
{
    tsl_graph_t g = nullptr;
    ASSERT_EQ(tsl_graph_create(&g), TSL_OK);
    int64_t sample[4] = {3, 9, 10, 11};
    int32_t x, c, p, u, t, cat, sum;
    ASSERT_EQ(tsl_graph_input(g, 4, sample, &x), TSL_OK);
    tsl_conv_params cp;
    tsl_conv_params_init(&cp, 3);
    cp.stride[0] = 2;
    cp.padding[1] = 1;
    cp.dilation[2] = 2;
    int64_t k[3] = {3, 3, 3};
    ASSERT_EQ(tsl_graph_conv(g, "enc", x, 8, k, &cp, 0, 1, &c), TSL_OK) << tsl_last_error();
    EXPECT_EQ(dims_of(g, c), (std::vector<int64_t>{8, 4, 10, 7}));
    tsl_pool_params pp;
    tsl_pool_params_init(&pp, TSL_POOL_AVG, 3, 2);
    ASSERT_EQ(tsl_graph_pool(g, c, &pp, &p), TSL_OK);
    EXPECT_EQ(dims_of(g, p), (std::vector<int64_t>{8, 2, 5, 3}));
    int64_t scale[3] = {2, 2, 2};
    ASSERT_EQ(tsl_graph_upsample(g, p, scale, 1, &u), TSL_OK);
    EXPECT_EQ(dims_of(g, u), (std::vector<int64_t>{8, 4, 10, 6}));
    tsl_conv_params tp;
    tsl_conv_params_init(&tp, 3);
    tp.stride[0] = tp.stride[1] = tp.stride[2] = 2;
    int64_t k2[3] = {2, 2, 2};
    ASSERT_EQ(tsl_graph_conv(g, "up", p, 5, k2, &tp, 1, 0, &t), TSL_OK) << tsl_last_error();
    EXPECT_EQ(dims_of(g, t), (std::vector<int64_t>{5, 4, 10, 6}));
    const char *name;
    tsl_shape ws;
    ASSERT_EQ(tsl_graph_param_info(g, 2, &name, &ws, nullptr), TSL_OK);
    EXPECT_STREQ(name, "up.weight");
    EXPECT_EQ(std::vector<int64_t>(ws.dims, ws.dims + ws.ndim),
              (std::vector<int64_t>{8, 5, 2, 2, 2})); // (C_in, C_out / groups, k...)
    int32_t parts[2] = {u, t};
    ASSERT_EQ(tsl_graph_concat(g, 2, parts, &cat), TSL_OK);
    EXPECT_EQ(dims_of(g, cat), (std::vector<int64_t>{13, 4, 10, 6}));
    ASSERT_EQ(tsl_graph_add(g, u, u, &sum), TSL_OK);
    EXPECT_EQ(dims_of(g, sum), dims_of(g, u));
    tsl_graph_destroy(g);
}

// Inputs: named, numbered in the order added, of their own shapes, up to
// TSL_GRAPH_MAX_GRAPH_INPUTS; the first is the graph's input the data feeds.
TEST(Graph, SeveralInputs)
{
    tsl_graph_t g = nullptr;
    ASSERT_EQ(tsl_graph_create(&g), TSL_OK);
    EXPECT_EQ(tsl_graph_input_count(g), 0);
    EXPECT_LT(tsl_graph_input_value(g, 0), 0);
    const int64_t image[3] = {2, 6, 6}, feats[1] = {5};
    int32_t x, f, y;
    ASSERT_EQ(tsl_graph_input(g, 3, image, &x), TSL_OK);
    ASSERT_EQ(tsl_graph_add_input(g, "feats", 1, feats, &f), TSL_OK);
    ASSERT_EQ(tsl_graph_input(g, 1, feats, &y), TSL_OK); // unnamed: "input2"
    EXPECT_EQ(tsl_graph_input_count(g), 3);
    EXPECT_EQ(tsl_graph_input_value(g, 0), x);
    EXPECT_EQ(tsl_graph_input_value(g, 1), f);
    EXPECT_EQ(tsl_graph_input_value(g, 2), y);
    EXPECT_LT(tsl_graph_input_value(g, 3), 0);
    EXPECT_LT(tsl_graph_input_value(g, -1), 0);
    const char *names[3] = {};
    for (int32_t o = 0; o < 3; o++) {
        tsl_op_kind kind;
        ASSERT_EQ(tsl_graph_op_info(g, o, &kind, &names[o], nullptr), TSL_OK);
        EXPECT_EQ(kind, TSL_OP_INPUT);
    }
    EXPECT_STREQ(names[0], "input");
    EXPECT_STREQ(names[1], "feats");
    EXPECT_STREQ(names[2], "input2");
    EXPECT_EQ(dims_of(g, f), (std::vector<int64_t>{5}));
    // a further input gets no gradient: a loss term may not read it as the value it trains
    tsl_loss_term t[2] = {{TSL_MODEL_LOSS_CROSS_ENTROPY, 1.0, 0, 0},
                          {TSL_MODEL_LOSS_MSE, 1.0, f + 1, y + 1}};
    EXPECT_EQ(tsl_graph_set_loss(g, 2, t), TSL_ERR_INVALID_ARG);
    for (int k = 3; k < TSL_GRAPH_MAX_GRAPH_INPUTS; k++)
        ASSERT_EQ(tsl_graph_input(g, 1, feats, &y), TSL_OK);
    EXPECT_EQ(tsl_graph_input(g, 1, feats, &y), TSL_ERR_STATE);
    EXPECT_NE(std::strstr(tsl_last_error(), "at most 8 inputs"), nullptr) << tsl_last_error();
    EXPECT_EQ(tsl_graph_input_count(g), TSL_GRAPH_MAX_GRAPH_INPUTS);
    tsl_graph_destroy(g);
}

TEST(Graph, BadCallsAreErrorsAndChangeNothing)
{
    tsl_graph_t g = nullptr;
    ASSERT_EQ(tsl_graph_create(&g), TSL_OK);
    int64_t sample[3] = {2, 6, 6};
    int32_t x, y, v;
    ASSERT_EQ(tsl_graph_input(g, 3, sample, &x), TSL_OK);
    tsl_conv_params cp;
    tsl_conv_params_init(&cp, 2);
    int64_t k[2] = {3, 3}, big[2] = {9, 9};
    ASSERT_EQ(tsl_graph_conv(g, "c", x, 4, k, &cp, 0, 1, &y), TSL_OK);
    int32_t values = tsl_graph_value_count(g), ops = tsl_graph_op_count(g),
            params = tsl_graph_param_count(g);
    EXPECT_EQ(tsl_graph_conv(g, "c", x, 4, k, &cp, 0, 1, &v), TSL_ERR_INVALID_ARG); // name used
    EXPECT_NE(std::strstr(tsl_last_error(), "already used"), nullptr);
    EXPECT_EQ(tsl_graph_conv(g, "d", x, 4, big, &cp, 0, 1, &v), TSL_ERR_SHAPE); // kernel > input
    EXPECT_EQ(tsl_graph_conv(g, "bad/name", x, 4, k, &cp, 0, 1, &v), TSL_ERR_INVALID_ARG);
    EXPECT_EQ(tsl_graph_conv(g, "", x, 4, k, &cp, 0, 1, &v), TSL_ERR_INVALID_ARG);
    tsl_conv_params c3;
    tsl_conv_params_init(&c3, 3);
    int64_t k3[3] = {1, 1, 1};
    EXPECT_EQ(tsl_graph_conv(g, "e", x, 4, k3, &c3, 0, 1, &v), TSL_ERR_SHAPE); // 3-D on 2-D
    cp.groups = 3;
    EXPECT_EQ(tsl_graph_conv(g, "f", x, 4, k, &cp, 0, 1, &v), TSL_ERR_SHAPE); // groups
    EXPECT_EQ(tsl_graph_linear(g, "fc", y, 10, 1, &v), TSL_ERR_SHAPE);        // not flat
    EXPECT_NE(std::strstr(tsl_last_error(), "flatten"), nullptr);
    int32_t parts[2] = {x, y};
    EXPECT_EQ(tsl_graph_concat(g, 2, parts, &v), TSL_ERR_SHAPE); // 6x6 and 4x4
    EXPECT_EQ(tsl_graph_add(g, x, y, &v), TSL_ERR_SHAPE);
    EXPECT_EQ(tsl_graph_activation(g, 99, TSL_ACT_RELU, 0, &v), TSL_ERR_INVALID_ARG);
    EXPECT_EQ(tsl_graph_batchnorm(g, "bn", y, 0.0, 0.1, &v), TSL_ERR_INVALID_ARG);
    tsl_pool_params pp;
    tsl_pool_params_init(&pp, TSL_POOL_MAX, 2, 5);
    EXPECT_EQ(tsl_graph_pool(g, y, &pp, &v), TSL_ERR_SHAPE); // 5x5 window on 4x4
    int64_t zero[2] = {0, 1};
    EXPECT_EQ(tsl_graph_upsample(g, y, zero, 0, &v), TSL_ERR_INVALID_ARG);
    EXPECT_EQ(tsl_graph_set_output(g, 42), TSL_ERR_INVALID_ARG);
    EXPECT_EQ(tsl_graph_add_input(g, "input", 3, sample, &v), TSL_ERR_INVALID_ARG); // name used
    EXPECT_EQ(tsl_graph_add_input(g, "c", 3, sample, &v), TSL_ERR_INVALID_ARG);     // a layer's
    const int64_t empty[2] = {3, 0};
    EXPECT_EQ(tsl_graph_add_input(g, "z", 2, empty, &v), TSL_ERR_SHAPE);
    EXPECT_EQ(tsl_graph_add_input(g, "z", 5, sample, &v), TSL_ERR_SHAPE);
    EXPECT_EQ(tsl_graph_value_count(g), values);
    EXPECT_EQ(tsl_graph_op_count(g), ops);
    EXPECT_EQ(tsl_graph_param_count(g), params);
    EXPECT_LT(tsl_graph_output(g), 0);
    tsl_graph_destroy(g);
    // The zoo refuses what its networks cannot take.
    int64_t tiny[3] = {1, 3, 3};
    tsl_graph_t z = nullptr;
    EXPECT_EQ(tsl_zoo_graph("cnn", 3, tiny, 10, &z), TSL_ERR_SHAPE);
    EXPECT_EQ(z, nullptr);
    EXPECT_EQ(tsl_zoo_graph("no-such-net", 3, sample, 10, &z), TSL_ERR_INVALID_ARG);
    EXPECT_NE(std::strstr(tsl_last_error(), "cnn"), nullptr);
    EXPECT_EQ(tsl_zoo_graph("cnn", 3, sample, 1, &z), TSL_ERR_INVALID_ARG);
}

// ---------------------------------------------------------------- plans

// `text` parses into *p and *p formats back to `text`.
static void parses_and_formats_back(const char *text, tsl_plan *p)
{
    ASSERT_EQ(tsl_plan_parse(text, p), TSL_OK) << tsl_last_error();
    char back[256];
    ASSERT_EQ(tsl_plan_format(p, back, sizeof back), TSL_OK);
    EXPECT_STREQ(back, text);
}

// tsl_graph_share_params(): the op just added takes another op's parameters (its own names
// stay, as copies whose source tsl_graph_param_source() gives); bad calls change nothing.
TEST(Graph, SharedParametersPointAtTheirSource)
{
    tsl_graph_t g = nullptr;
    ASSERT_EQ(tsl_graph_create(&g), TSL_OK);
    const int64_t sample[3] = {4, 8, 8}, k[2] = {3, 3};
    tsl_conv_params cp;
    tsl_conv_params_init(&cp, 2);
    cp.padding[0] = cp.padding[1] = 1;
    int32_t x, a, r, b, c, n1, n2, bn1, bn2;
    ASSERT_EQ(tsl_graph_input(g, 3, sample, &x), TSL_OK);
    ASSERT_EQ(tsl_graph_conv(g, "a", x, 4, k, &cp, 0, 1, &a), TSL_OK);
    ASSERT_EQ(tsl_graph_activation(g, a, TSL_ACT_RELU, 0, &r), TSL_OK);
    EXPECT_EQ(tsl_graph_share_params(g, r, a), TSL_ERR_INVALID_ARG); // a ReLU has none
    ASSERT_EQ(tsl_graph_conv(g, "b", r, 4, k, &cp, 0, 1, &b), TSL_OK);
    EXPECT_EQ(tsl_graph_share_params(g, a, b), TSL_ERR_INVALID_ARG); // a is not the last op
    EXPECT_EQ(tsl_graph_share_params(g, b, b), TSL_ERR_INVALID_ARG); // itself
    EXPECT_EQ(tsl_graph_share_params(g, b, 99), TSL_ERR_INVALID_ARG);
    EXPECT_EQ(tsl_graph_share_params(nullptr, b, a), TSL_ERR_INVALID_ARG);
    for (int32_t i = 0; i < tsl_graph_param_count(g); i++)
        EXPECT_EQ(tsl_graph_param_source(g, i), i); // nothing changed
    ASSERT_EQ(tsl_graph_share_params(g, b, a), TSL_OK);
    EXPECT_EQ(tsl_graph_param_source(g, 2), 0); // b.weight holds a.weight
    EXPECT_EQ(tsl_graph_param_source(g, 3), 1); // b.bias, a.bias
    const char *name;
    ASSERT_EQ(tsl_graph_param_info(g, 2, &name, nullptr, nullptr), TSL_OK);
    EXPECT_STREQ(name, "b.weight");
    // Sharing a shared op's parameters shares its source's.
    ASSERT_EQ(tsl_graph_conv(g, "c", b, 4, k, &cp, 0, 1, &c), TSL_OK);
    ASSERT_EQ(tsl_graph_share_params(g, c, b), TSL_OK);
    EXPECT_EQ(tsl_graph_param_source(g, 4), 0);
    EXPECT_EQ(tsl_graph_param_source(g, 5), 1);
    // Another bias setting, another stride: another function.
    int32_t d;
    ASSERT_EQ(tsl_graph_conv(g, "d", c, 4, k, &cp, 0, 0, &d), TSL_OK);
    EXPECT_EQ(tsl_graph_share_params(g, d, a), TSL_ERR_INVALID_ARG);
    tsl_conv_params sp = cp;
    sp.stride[0] = 2;
    ASSERT_EQ(tsl_graph_conv(g, "e", d, 4, k, &sp, 0, 1, &d), TSL_OK);
    EXPECT_EQ(tsl_graph_share_params(g, d, a), TSL_ERR_INVALID_ARG);
    // Norms share; batch norm's running statistics do not.
    ASSERT_EQ(tsl_graph_groupnorm(g, "n1", d, 2, 1e-5, &n1), TSL_OK);
    ASSERT_EQ(tsl_graph_groupnorm(g, "n2", n1, 2, 1e-5, &n2), TSL_OK);
    ASSERT_EQ(tsl_graph_share_params(g, n2, n1), TSL_OK);
    ASSERT_EQ(tsl_graph_batchnorm(g, "bn1", n2, 1e-5, 0.1, &bn1), TSL_OK);
    ASSERT_EQ(tsl_graph_batchnorm(g, "bn2", bn1, 1e-5, 0.1, &bn2), TSL_OK);
    EXPECT_EQ(tsl_graph_share_params(g, bn2, bn1), TSL_ERR_INVALID_ARG);
    EXPECT_NE(std::string(tsl_last_error()).find("batch norm"), std::string::npos);
    EXPECT_EQ(tsl_graph_param_source(g, -1), -1);
    EXPECT_EQ(tsl_graph_param_source(g, tsl_graph_param_count(g)), -1);
    tsl_graph_destroy(g);
}

TEST(Plan, ParsesEveryPartAndFormatsBack)
{
    tsl_plan p;
    ASSERT_EQ(tsl_plan_parse("", &p), TSL_OK);
    EXPECT_EQ(tsl_plan_ranks(&p), 1);
    char text[64];
    ASSERT_EQ(tsl_plan_format(&p, text, sizeof text), TSL_OK);
    EXPECT_STREQ(text, "data=1");
    ASSERT_EQ(tsl_plan_parse("space=2x3,data=2,tiles=4", &p), TSL_OK) << tsl_last_error();
    EXPECT_EQ(p.data, 2);
    EXPECT_EQ(p.space_ndim, 2);
    EXPECT_EQ(p.space[0], 2);
    EXPECT_EQ(p.space[1], 3);
    EXPECT_EQ(p.space[2], 1);
    EXPECT_EQ(p.tiles, 4);
    EXPECT_EQ(p.stages, 1);
    EXPECT_EQ(tsl_plan_ranks(&p), 12);
    ASSERT_EQ(tsl_plan_format(&p, text, sizeof text), TSL_OK);
    EXPECT_STREQ(text, "data=2,space=2x3,tiles=4");
    ASSERT_EQ(tsl_plan_parse("data=1,space=2x2x2,stages=2,micro=4", &p), TSL_OK);
    EXPECT_EQ(tsl_plan_ranks(&p), 16);
    ASSERT_EQ(tsl_plan_format(&p, text, sizeof text), TSL_OK);
    EXPECT_STREQ(text, "space=2x2x2,stages=2,micro=4");
    EXPECT_EQ(tsl_plan_format(&p, text, 8), TSL_ERR_INVALID_ARG);
    ASSERT_EQ(tsl_plan_parse("balance=layers,stages=3", &p), TSL_OK) << tsl_last_error();
    EXPECT_EQ(p.balance, TSL_BALANCE_LAYERS);
    ASSERT_EQ(tsl_plan_format(&p, text, sizeof text), TSL_OK);
    EXPECT_STREQ(text, "stages=3,balance=layers");
    ASSERT_EQ(tsl_plan_parse("stages=2,balance=time", &p), TSL_OK);
    EXPECT_EQ(p.balance, TSL_BALANCE_TIME);
    ASSERT_EQ(tsl_plan_parse("stages=2,balance=memory", &p), TSL_OK);
    ASSERT_EQ(tsl_plan_format(&p, text, sizeof text), TSL_OK);
    EXPECT_STREQ(text, "stages=2");
    EXPECT_EQ(p.bucket, TSL_PLAN_BUCKET_DEFAULT);
    ASSERT_EQ(tsl_plan_parse("bucket=0,data=2", &p), TSL_OK) << tsl_last_error();
    EXPECT_EQ(p.bucket, 0);
    ASSERT_EQ(tsl_plan_format(&p, text, sizeof text), TSL_OK);
    EXPECT_STREQ(text, "data=2,bucket=0");
    ASSERT_EQ(tsl_plan_parse("data=2,bucket=1000", &p), TSL_OK);
    EXPECT_EQ(p.bucket, 1000);
    ASSERT_EQ(tsl_plan_format(&p, text, sizeof text), TSL_OK);
    EXPECT_STREQ(text, "data=2,bucket=1000");
    EXPECT_EQ(p.recompute, 0);
    ASSERT_EQ(tsl_plan_parse("recompute=1,space=2", &p), TSL_OK) << tsl_last_error();
    EXPECT_EQ(p.recompute, 1);
    ASSERT_EQ(tsl_plan_format(&p, text, sizeof text), TSL_OK);
    EXPECT_STREQ(text, "space=2,recompute=1");
    ASSERT_EQ(tsl_plan_parse("recompute=0", &p), TSL_OK);
    EXPECT_EQ(p.recompute, 0);
    EXPECT_EQ(p.filters, 1);
    parses_and_formats_back("data=2,filters=4", &p);
    EXPECT_EQ(p.filters, 4);
    EXPECT_EQ(tsl_plan_ranks(&p), 8);
    const int64_t sample[3] = {3, 8, 8};
    tsl_shape in;
    tsl_shape_make(&in, 3, sample);
    ASSERT_EQ(tsl_plan_parse("filters=2,layers=2", &p), TSL_OK);
    EXPECT_EQ(tsl_plan_check(&p, &in, 4), TSL_ERR_INVALID_ARG);
    EXPECT_NE(std::string(tsl_last_error()).find("filters="), std::string::npos);
    ASSERT_EQ(tsl_plan_parse("filters=2,space=2", &p), TSL_OK); // channels and space mix
    EXPECT_EQ(tsl_plan_check(&p, &in, 4), TSL_OK) << tsl_last_error();
}

// The tile grid (as a vector of its first four splits) tsl_plan_tensor_tiling() gives a batch
// of 4 activations (C, H, W) = dims on 4 ranks of one worker, the input's sample shape `in`.
static std::vector<int32_t> activation_splits(const tsl_plan &p, const tsl_shape &in,
                                              const int64_t *dims, tsl_tile_grid *grid,
                                              tsl_owner_map *owners)
{
    tsl_shape act;
    tsl_shape_make(&act, 3, dims);
    EXPECT_EQ(tsl_plan_tensor_tiling(&p, &in, 4, 0, 1, 4, &act, 1, grid, owners), TSL_OK);
    return std::vector<int32_t>(grid->splits, grid->splits + 4);
}

// filters=F: activations cut into F channel tiles where F divides their channels (on filter
// group f's ranks of the grid D x F x A x B x C), else whole on group 0; labels over D x F; a
// convolution's weight and bias cut like its output, tile f on group f's first rank.
TEST(Plan, FiltersCutChannelsAndTheirConvolutionsWeights)
{
    tsl_plan p;
    ASSERT_EQ(tsl_plan_parse("data=2,filters=2", &p), TSL_OK);
    const int64_t sample[3] = {1, 8, 8};
    tsl_shape in, labels;
    tsl_shape_make(&in, 3, sample);
    const int64_t a[3] = {4, 8, 8}, o[3] = {3, 8, 8}, l[2] = {8, 8};
    tsl_shape_make(&labels, 2, l);
    tsl_tile_grid grid;
    tsl_owner_map owners;
    EXPECT_EQ(activation_splits(p, in, a, &grid, &owners), std::vector<int32_t>({2, 2, 1, 1}));
    for (int n = 0; n < 2; n++)
        for (int c = 0; c < 2; c++) {
            int32_t t[TSL_MAX_DIMS] = {n, c, 0, 0}, rank = -1;
            ASSERT_EQ(tsl_owner_map_rank(&owners, t, 4, &grid, 4, &rank), TSL_OK);
            EXPECT_EQ(rank, n * 2 + c); // rank (d, f) = d x F + f
        }
    EXPECT_EQ(activation_splits(p, in, o, &grid, &owners)[1], 1); // 3 channels: whole, group 0
    for (int n = 0; n < 2; n++) {
        int32_t t[TSL_MAX_DIMS] = {n, 0, 0, 0}, rank = -1;
        ASSERT_EQ(tsl_owner_map_rank(&owners, t, 4, &grid, 4, &rank), TSL_OK);
        EXPECT_EQ(rank, n * 2);
    }
    ASSERT_EQ(tsl_plan_tensor_tiling(&p, &in, 4, 0, 1, 4, &labels, 0, &grid, &owners), TSL_OK);
    EXPECT_EQ(grid.splits[0], 2);
    EXPECT_EQ(grid.splits[1], 1);
    // the cnn's convolutions: weights and biases cut in 2, tile f on rank f (d = 0)
    tsl_graph_t g = nullptr;
    ASSERT_EQ(tsl_zoo_graph("cnn", 3, sample, 10, &g), TSL_OK);
    int32_t np = tsl_graph_param_count(g);
    std::vector<tsl_tile_grid> grids(np);
    std::vector<tsl_owner_map> maps(np);
    std::vector<int32_t> sharded(np);
    ASSERT_EQ(
        tsl_plan_param_placement(&p, g, 4, nullptr, grids.data(), maps.data(), sharded.data()),
        TSL_OK)
        << tsl_last_error();
    int cut = 0;
    for (int32_t i = 0; i < np; i++) {
        const char *name;
        tsl_shape s;
        ASSERT_EQ(tsl_graph_param_info(g, i, &name, &s, nullptr), TSL_OK);
        if (sharded[i] != 2)
            continue;
        cut++;
        EXPECT_EQ(grids[i].splits[0], 2) << name;
        for (int32_t f = 0; f < 2; f++) {
            int32_t t[TSL_MAX_DIMS] = {f}, rank = -1;
            ASSERT_EQ(tsl_owner_map_rank(&maps[i], t, s.ndim, &grids[i], 4, &rank), TSL_OK);
            EXPECT_EQ(rank, f) << name;
        }
    }
    EXPECT_GE(cut, 2); // at least one convolution's weight and bias
    // F dividing no convolution's channels (the cnn's are 32 and 64) is an error
    ASSERT_EQ(tsl_plan_parse("filters=3", &p), TSL_OK);
    EXPECT_EQ(
        tsl_plan_param_placement(&p, g, 3, nullptr, grids.data(), maps.data(), sharded.data()),
        TSL_ERR_INVALID_ARG);
    EXPECT_NE(std::string(tsl_last_error()).find("divides the output channels of none"),
              std::string::npos);
    tsl_graph_destroy(g);
}

// A graph's parameter placement under a plan (tsl_plan_param_placement).
struct Placement {
    tsl_graph_t g;
    std::vector<tsl_tile_grid> grids;
    std::vector<tsl_owner_map> maps;
    std::vector<int32_t> sharded;
    explicit Placement(tsl_graph_t graph)
        : g(graph), grids(tsl_graph_param_count(graph)), maps(grids.size()), sharded(grids.size())
    {
    }
    tsl_status place(const tsl_plan *p, int32_t ranks)
    {
        return tsl_plan_param_placement(p, g, ranks, nullptr, grids.data(), maps.data(),
                                        sharded.data());
    }
};

// channels=K: parsed, formatted, counted in the ranks, refused with filters= and layers=;
// activations cut as under filters=; a convolution whose input and output channels K divides
// (its input not the model's) has its weight cut K x K, tile (g, k) on channel group k's first
// rank (sharded 3), its bias like its output, and so is a linear layer's (1 x K for the
// classifier, whose output stays whole); the first convolution (on the model's input) is cut by
// filters only.
TEST(Plan, ChannelsCutWeightsAlongInputChannels)
{
    tsl_plan p;
    char text[256];
    parses_and_formats_back("data=2,channels=2", &p);
    EXPECT_EQ(p.channels, 2);
    EXPECT_EQ(p.filters, 1);
    EXPECT_EQ(tsl_plan_ranks(&p), 4);
    const int64_t sample[3] = {1, 8, 8};
    tsl_shape in;
    tsl_shape_make(&in, 3, sample);
    EXPECT_EQ(tsl_plan_check(&p, &in, 4), TSL_OK) << tsl_last_error();
    const int64_t a[3] = {4, 8, 8};
    tsl_tile_grid grid;
    tsl_owner_map owners;
    EXPECT_EQ(activation_splits(p, in, a, &grid, &owners), std::vector<int32_t>({2, 2, 1, 1}));
    tsl_plan bad;
    ASSERT_EQ(tsl_plan_parse("channels=2,filters=2", &bad), TSL_OK);
    EXPECT_EQ(tsl_plan_check(&bad, &in, 4), TSL_ERR_INVALID_ARG);
    EXPECT_NE(std::string(tsl_last_error()).find("channels= and filters="), std::string::npos);
    ASSERT_EQ(tsl_plan_parse("channels=2,layers=2", &bad), TSL_OK);
    EXPECT_EQ(tsl_plan_check(&bad, &in, 4), TSL_ERR_INVALID_ARG);
    EXPECT_NE(std::string(tsl_last_error()).find("channels="), std::string::npos);
    EXPECT_EQ(tsl_plan_parse("channels=0", &bad), TSL_ERR_INVALID_ARG);
    tsl_graph_t g = nullptr;
    ASSERT_EQ(tsl_zoo_graph("cnn", 3, sample, 10, &g), TSL_OK);
    Placement at(g);
    ASSERT_EQ(at.place(&p, 4), TSL_OK) << tsl_last_error();
    const std::vector<int32_t> &sharded = at.sharded;
    const std::vector<tsl_tile_grid> &grids = at.grids;
    int by_filters = 0, by_inputs = 0, by_linear = 0;
    for (int32_t i = 0; i < tsl_graph_param_count(g); i++) {
        const char *name;
        tsl_shape s;
        ASSERT_EQ(tsl_graph_param_info(g, i, &name, &s, nullptr), TSL_OK);
        by_filters += sharded[i] == 2;
        if (sharded[i] != 3)
            continue;
        by_inputs++;
        // the classifier (fc2, the model's output) keeps whole rows: 1 x 2
        bool output = std::string(name).rfind("fc2", 0) == 0;
        by_linear += std::string(name).rfind("fc", 0) == 0;
        EXPECT_EQ(grids[i].splits[0], output ? 1 : 2) << name;
        EXPECT_EQ(grids[i].splits[1], 2) << name;
        for (int32_t f = 0; f < grids[i].splits[0]; f++)
            for (int32_t k = 0; k < 2; k++) {
                int32_t t[TSL_MAX_DIMS] = {f, k}, rank = -1;
                ASSERT_EQ(tsl_owner_map_rank(&at.maps[i], t, s.ndim, &grids[i], 4, &rank), TSL_OK);
                EXPECT_EQ(rank, k) << name; // channel group k, sample group 0
            }
    }
    EXPECT_GE(by_inputs, 3);  // the second convolution's weight, fc1's and fc2's
    EXPECT_EQ(by_linear, 2);  // fc1 (128 x K: 2 x 2) and fc2 (1 x 2)
    EXPECT_GE(by_filters, 1); // the first convolution's weight (on the input: filters only)
    ASSERT_EQ(tsl_plan_parse("channels=3", &p), TSL_OK);
    EXPECT_EQ(at.place(&p, 3), TSL_ERR_INVALID_ARG);
    EXPECT_NE(std::string(tsl_last_error()).find("channels=3 divides the input or output"),
              std::string::npos);
    tsl_graph_destroy(g);
}

// A transposed convolution's weight (I, O, k...) is cut along its filters, its second
// dimension: under filters=2 1 x 2 with tile (0, f) on filter group f; under channels=2 along its
// input channels too, 2 x 2 with tile (k, g) on channel group k; its bias like its output.
TEST(Plan, TransposedWeightsCutAlongTheirFilters)
{
    const int64_t sample[3] = {1, 16, 16};
    tsl_graph_t g = nullptr;
    ASSERT_EQ(tsl_zoo_graph("unet2d", 3, sample, 3, &g), TSL_OK) << tsl_last_error();
    Placement at(g);
    for (const char *text : {"filters=2", "channels=2"}) {
        SCOPED_TRACE(text);
        tsl_plan p;
        ASSERT_EQ(tsl_plan_parse(text, &p), TSL_OK);
        ASSERT_EQ(at.place(&p, 2), TSL_OK) << tsl_last_error();
        bool parts = p.channels > 1;
        int weights = 0;
        for (int32_t i = 0; i < tsl_graph_param_count(g); i++) {
            const char *name;
            tsl_shape s;
            ASSERT_EQ(tsl_graph_param_info(g, i, &name, &s, nullptr), TSL_OK);
            std::string n(name);
            if (n.rfind("up", 0) != 0)
                continue;
            if (s.ndim == 1) { // the bias: cut as the output's channels
                EXPECT_EQ(at.grids[i].splits[0], 2) << n;
                EXPECT_EQ(at.sharded[i], 2) << n;
                continue;
            }
            weights++;
            EXPECT_EQ(at.sharded[i], parts ? 3 : 2) << n;
            EXPECT_EQ(at.grids[i].splits[0], parts ? 2 : 1) << n;
            EXPECT_EQ(at.grids[i].splits[1], 2) << n;
            for (int32_t a = 0; a < at.grids[i].splits[0]; a++)
                for (int32_t b = 0; b < 2; b++) {
                    int32_t t[TSL_MAX_DIMS] = {a, b}, rank = -1;
                    ASSERT_EQ(tsl_owner_map_rank(&at.maps[i], t, s.ndim, &at.grids[i], 2, &rank),
                              TSL_OK);
                    EXPECT_EQ(rank, parts ? a : b) << n; // the input's group, else the filters'
                }
        }
        EXPECT_EQ(weights, 2); // up2 and up1
    }
    tsl_graph_destroy(g);
}

// The layer-parallel (MGRIT) parts: defaults, every part, the rank count, formatting, and the
// combinations tsl_plan_check refuses.
TEST(Plan, LayerParallelParts)
{
    tsl_plan p;
    ASSERT_EQ(tsl_plan_parse("", &p), TSL_OK);
    EXPECT_EQ(p.layers, 1);
    EXPECT_EQ(p.levels, 1);
    EXPECT_EQ(p.cf, 2);
    EXPECT_EQ(p.iters, 2);
    EXPECT_EQ(p.biters, 1);
    EXPECT_EQ(p.relax, TSL_RELAX_FCF);
    EXPECT_EQ(p.skip, 0);
    EXPECT_EQ(p.infer, TSL_INFER_EXACT);
    EXPECT_EQ(tsl_plan_depth(&p), 1);
    EXPECT_EQ(tsl_plan_depth(nullptr), 1);
    ASSERT_EQ(tsl_plan_parse("layers=4,levels=3,cf=4,iters=5,biters=3,relax=F,data=2,skip=1", &p),
              TSL_OK)
        << tsl_last_error();
    EXPECT_EQ(p.layers, 4);
    EXPECT_EQ(p.levels, 3);
    EXPECT_EQ(p.cf, 4);
    EXPECT_EQ(p.iters, 5);
    EXPECT_EQ(p.biters, 3);
    EXPECT_EQ(p.relax, TSL_RELAX_F);
    EXPECT_EQ(tsl_plan_depth(&p), 4);
    EXPECT_EQ(tsl_plan_ranks(&p), 8);
    char text[256];
    ASSERT_EQ(tsl_plan_format(&p, text, sizeof text), TSL_OK);
    EXPECT_EQ(p.skip, 1);
    EXPECT_STREQ(text, "data=2,layers=4,levels=3,cf=4,iters=5,biters=3,relax=F,skip=1");
    tsl_plan back;
    ASSERT_EQ(tsl_plan_parse(text, &back), TSL_OK);
    EXPECT_EQ(memcmp(&back, &p, sizeof p), 0);
    ASSERT_EQ(tsl_plan_parse("layers=2,levels=2,infer=mgrit", &p), TSL_OK) << tsl_last_error();
    EXPECT_EQ(p.infer, TSL_INFER_MGRIT);
    ASSERT_EQ(tsl_plan_format(&p, text, sizeof text), TSL_OK);
    EXPECT_STREQ(text, "layers=2,levels=2,cf=2,iters=2,biters=1,relax=FCF,infer=mgrit");
    ASSERT_EQ(tsl_plan_parse("infer=exact", &p), TSL_OK);
    EXPECT_EQ(p.infer, TSL_INFER_EXACT);
    EXPECT_EQ(tsl_plan_parse("infer=serial", &p), TSL_ERR_INVALID_ARG);
    EXPECT_NE(std::string(tsl_last_error()).find("is not exact or mgrit"), std::string::npos)
        << tsl_last_error();
    ASSERT_EQ(tsl_plan_parse("stages=3", &p), TSL_OK);
    EXPECT_EQ(tsl_plan_depth(&p), 3);
    const int64_t sample[3] = {1, 8, 8};
    tsl_shape in;
    ASSERT_EQ(tsl_shape_make(&in, 3, sample), TSL_OK);
    const char *refused[] = {"layers=2,stages=2", "layers=2,micro=2", "cf=1,levels=2"};
    for (const char *t : refused) {
        ASSERT_EQ(tsl_plan_parse(t, &p), TSL_OK) << t;
        EXPECT_EQ(tsl_plan_check(&p, &in, (int32_t)tsl_plan_ranks(&p)), TSL_ERR_INVALID_ARG) << t;
    }
    EXPECT_EQ(tsl_plan_parse("relax=C", &p), TSL_ERR_INVALID_ARG);
    EXPECT_NE(std::string(tsl_last_error()).find("F or FCF"), std::string::npos);
    EXPECT_EQ(tsl_plan_parse("levels=0", &p), TSL_ERR_INVALID_ARG);
    EXPECT_EQ(tsl_plan_parse("skip=2", &p), TSL_ERR_INVALID_ARG);
}

// layers=P cuts the ODE steps into P groups of equal step counts; the stem goes with the first
// step, the head with the last; too few steps is an error.
TEST(Plan, LayerGroupsSplitTheStepsEvenly)
{
    const int64_t sample[3] = {1, 6, 6};
    tsl_graph_t g = nullptr;
    ASSERT_EQ(tsl_zoo_graph("odetanh8", 3, sample, 3, &g), TSL_OK) << tsl_last_error();
    tsl_ode_segment seg;
    int32_t nseg = 0;
    ASSERT_EQ(tsl_graph_ode_segments(g, 1, &seg, &nseg), TSL_OK);
    ASSERT_EQ(nseg, 1);
    ASSERT_EQ(seg.steps, 8);
    int32_t n = tsl_graph_op_count(g);
    std::vector<int32_t> stage((size_t)n);
    tsl_plan p;
    ASSERT_EQ(tsl_plan_parse("layers=4", &p), TSL_OK);
    ASSERT_EQ(tsl_plan_stages(&p, g, 2, 2, stage.data()), TSL_OK) << tsl_last_error();
    for (int32_t o = 0; o < n; o++) {
        int32_t want = o < seg.first_op  ? 0
                       : o > seg.last_op ? 3
                                         : (o - seg.first_op) / seg.ops_per_step / 2;
        EXPECT_EQ(stage[(size_t)o], want) << "op " << o;
    }
    ASSERT_EQ(tsl_plan_parse("layers=9", &p), TSL_OK);
    EXPECT_EQ(tsl_plan_stages(&p, g, 2, 2, stage.data()), TSL_ERR_INVALID_ARG);
    EXPECT_NE(std::string(tsl_last_error()).find("at least 9 residual steps"), std::string::npos)
        << tsl_last_error();
    tsl_graph_destroy(g);
}

TEST(Plan, BadStringsAreClearErrorsAndChangeNothing)
{
    tsl_plan p;
    ASSERT_EQ(tsl_plan_parse("data=3", &p), TSL_OK);
    const char *bad[][2] = {
        {"data=0", "not an integer"},
        {"data=two", "not an integer"},
        {"space=2x", "space='2x'"},
        {"space=2x2x2x2", "space="},
        {"space=0x2", "space="},
        {"data=2,data=2", "given twice"},
        {"pipeline=2", "unknown part"},
        {"data", "KEY=VALUE"},
        {"data=2,", "ends with a comma"},
        {"tiles=-1", "not an integer"},
        {"data=99999999", "not an integer"},
        {"stages=", "not an integer"},
        {"balance=fast", "not memory, layers or time"},
        {"balance=", "not memory, layers or time"},
        {"bucket=-1", "bucket='-1' is not an integer in [0,"},
        {"bucket=", "bucket='' is not an integer"},
        {"bucket=small", "bucket='small'"},
        {"recompute=2", "recompute='2' is not 0 or 1"},
        {"recompute=yes", "recompute='yes'"},
        {"recompute=", "recompute='' is not 0 or 1"},
    };
    for (auto &b : bad) {
        EXPECT_EQ(tsl_plan_parse(b[0], &p), TSL_ERR_INVALID_ARG) << b[0];
        EXPECT_NE(std::string(tsl_last_error()).find(b[1]), std::string::npos)
            << b[0] << ": " << tsl_last_error();
    }
    EXPECT_EQ(p.data, 3); // unchanged
    EXPECT_EQ(tsl_plan_parse(nullptr, &p), TSL_ERR_INVALID_ARG);
    EXPECT_EQ(tsl_plan_ranks(nullptr), 0);
}

// Buckets: per owner, the unsharded convolution and linear parameters in reverse order, each
// bucket within bucket= elements unless one parameter alone is larger; whole copies for every
// unsharded trainable parameter (batch norm's too); nothing on one rank per stage or with
// bucket=0.
TEST(Plan, BucketsPackSmallParametersPerOwner)
{
    int64_t sample[3] = {1, 16, 16};
    tsl_graph_t g = nullptr;
    ASSERT_EQ(tsl_zoo_graph("resnet", 3, sample, 10, &g), TSL_OK) << tsl_last_error();
    int32_t np = tsl_graph_param_count(g), nops = tsl_graph_op_count(g);
    // Each parameter's op kind, by name: parameter "OP.weight" belongs to op "OP".
    std::map<std::string, int32_t> kind_of;
    for (int32_t o = 0; o < nops; o++) {
        tsl_op_kind kind;
        const char *name;
        ASSERT_EQ(tsl_graph_op_info(g, o, &kind, &name, nullptr), TSL_OK);
        kind_of[name] = kind;
    }
    std::vector<int32_t> of_op((size_t)np, -1);
    for (int32_t i = 0; i < np; i++) {
        const char *name;
        ASSERT_EQ(tsl_graph_param_info(g, i, &name, nullptr, nullptr), TSL_OK);
        std::string op(name);
        op = op.substr(0, op.rfind('.'));
        ASSERT_TRUE(kind_of.count(op)) << name;
        of_op[(size_t)i] = kind_of[op];
    }
    struct Case {
        const char *plan;
        int32_t ranks;
        bool packs;
    } cases[] = {{"data=2", 2, true},
                 {"data=2,bucket=700", 2, true},
                 {"data=4", 4, true},
                 {"data=2,bucket=1", 2, true},
                 {"data=4,shard=100000", 4, true},
                 {"stages=2,data=2", 4, true},
                 {"data=2,bucket=0", 2, false},
                 {"stages=2", 2, false},
                 {"", 1, false}};
    for (const Case &c : cases) {
        SCOPED_TRACE(c.plan);
        tsl_plan p;
        ASSERT_EQ(tsl_plan_parse(c.plan, &p), TSL_OK);
        std::vector<int32_t> stage((size_t)nops), sharded((size_t)np), bucket((size_t)np, 7),
            replicated((size_t)np, 7);
        std::vector<tsl_tile_grid> grids((size_t)np);
        std::vector<tsl_owner_map> owners((size_t)np);
        ASSERT_EQ(tsl_plan_stages(&p, g, 4, 2, stage.data()), TSL_OK) << tsl_last_error();
        ASSERT_EQ(tsl_plan_param_placement(&p, g, c.ranks, stage.data(), grids.data(),
                                           owners.data(), sharded.data()),
                  TSL_OK);
        int32_t nb = -1;
        ASSERT_EQ(tsl_plan_buckets(&p, g, c.ranks, owners.data(), sharded.data(), bucket.data(),
                                   replicated.data(), &nb),
                  TSL_OK)
            << tsl_last_error();
        std::map<int32_t, int64_t> size_of, members_of;
        std::map<int32_t, int32_t> owner_of, last_of; // bucket's owner, owner's last bucket
        int32_t nrep = 0;
        for (int32_t i = 0; i < np; i++) {
            tsl_shape s;
            int32_t trainable;
            ASSERT_EQ(tsl_graph_param_info(g, i, nullptr, &s, &trainable), TSL_OK);
            bool small = trainable && !sharded[(size_t)i];
            EXPECT_EQ(replicated[(size_t)i], c.packs && small) << "parameter " << i;
            nrep += replicated[(size_t)i];
            int32_t kind = of_op[(size_t)i];
            bool reduced = small && (kind == TSL_OP_CONV || kind == TSL_OP_LINEAR);
            int32_t b = bucket[(size_t)i];
            if (!c.packs || !reduced) {
                EXPECT_EQ(b, -1) << "parameter " << i;
                continue;
            }
            ASSERT_GE(b, 0) << "parameter " << i;
            ASSERT_LT(b, nb);
            int32_t r = owners[(size_t)i].rank;
            if (owner_of.count(b))
                EXPECT_EQ(owner_of[b], r) << "one owner per bucket";
            // Backward's order: an owner's later parameters are in the same or earlier buckets.
            if (last_of.count(r))
                EXPECT_LE(b, last_of[r]) << "parameter " << i;
            owner_of[b] = r;
            last_of[r] = b;
            size_of[b] += tsl_shape_numel(&s);
            members_of[b]++;
        }
        EXPECT_EQ((int32_t)size_of.size(), nb) << "every bucket has members";
        for (auto &[b, size] : size_of)
            EXPECT_TRUE(size <= p.bucket || members_of[b] == 1)
                << "bucket " << b << ": " << size << " elements in " << members_of[b];
        if (c.packs) {
            EXPECT_GT(nrep, 10);
            EXPECT_GT(nb, 0);
        }
    }
    // bucket=1: every parameter alone; the default: one bucket per owner for this network.
    tsl_plan p;
    ASSERT_EQ(tsl_plan_parse("data=2", &p), TSL_OK);
    std::vector<int32_t> stage((size_t)nops), sharded((size_t)np), bucket((size_t)np);
    std::vector<tsl_tile_grid> grids((size_t)np);
    std::vector<tsl_owner_map> owners((size_t)np);
    ASSERT_EQ(
        tsl_plan_param_placement(&p, g, 2, nullptr, grids.data(), owners.data(), sharded.data()),
        TSL_OK);
    int32_t nb = 0, ones = 0;
    ASSERT_EQ(
        tsl_plan_buckets(&p, g, 2, owners.data(), sharded.data(), bucket.data(), nullptr, &nb),
        TSL_OK);
    EXPECT_EQ(nb, 2);
    p.bucket = 1;
    ASSERT_EQ(
        tsl_plan_buckets(&p, g, 2, owners.data(), sharded.data(), bucket.data(), nullptr, &nb),
        TSL_OK);
    for (int32_t i = 0; i < np; i++)
        ones += bucket[(size_t)i] >= 0;
    EXPECT_EQ(nb, ones);
    EXPECT_GT(nb, 2);
    tsl_graph_destroy(g);
}

TEST(Plan, TensorTilingFollowsThePlanAndCapsBySize)
{
    tsl_plan p;
    ASSERT_EQ(tsl_plan_parse("data=2,space=2x2,tiles=2", &p), TSL_OK);
    int64_t in_dims[3] = {1, 16, 12}, act_dims[3] = {8, 16, 12}, small[3] = {8, 3, 1};
    tsl_shape input, act, tiny;
    ASSERT_EQ(tsl_shape_make(&input, 3, in_dims), TSL_OK);
    ASSERT_EQ(tsl_shape_make(&act, 3, act_dims), TSL_OK);
    ASSERT_EQ(tsl_shape_make(&tiny, 3, small), TSL_OK);
    EXPECT_EQ(tsl_plan_check(&p, &input, 8), TSL_OK);
    EXPECT_EQ(tsl_plan_check(&p, &input, 4), TSL_ERR_INVALID_ARG);
    tsl_tile_grid grid;
    tsl_owner_map owners;
    // tiles=2 doubles the longest dimension (16): 4 x 2 spatial tiles, 2 sample groups.
    ASSERT_EQ(tsl_plan_tensor_tiling(&p, &input, 8, 0, 2, 6, &act, 1, &grid, &owners), TSL_OK);
    EXPECT_EQ(grid.splits[0], 2);
    EXPECT_EQ(grid.splits[1], 1);
    EXPECT_EQ(grid.splits[2], 4);
    EXPECT_EQ(grid.splits[3], 2);
    EXPECT_EQ(owners.kind, TSL_OWNER_BLOCK);
    EXPECT_EQ(owners.process_grid[0], 2);
    EXPECT_EQ(owners.process_grid[2], 2);
    EXPECT_EQ(owners.process_grid[3], 2);
    // Capped by the size; labels (no channel dimension) get the same spatial grid.
    ASSERT_EQ(tsl_plan_tensor_tiling(&p, &input, 8, 0, 2, 6, &tiny, 1, &grid, &owners), TSL_OK);
    EXPECT_EQ(grid.splits[2], 3);
    EXPECT_EQ(grid.splits[3], 1);
    int64_t label_dims[2] = {16, 12};
    tsl_shape labels;
    ASSERT_EQ(tsl_shape_make(&labels, 2, label_dims), TSL_OK);
    ASSERT_EQ(tsl_plan_tensor_tiling(&p, &input, 8, 0, 2, 6, &labels, 0, &grid, &owners), TSL_OK);
    EXPECT_EQ(grid.splits[1], 4);
    EXPECT_EQ(grid.splits[2], 2);
    // No plan, enough samples for every worker: sample tiles over ranks x workers.
    ASSERT_EQ(tsl_plan_tensor_tiling(nullptr, &input, 3, 0, 2, 7, &act, 1, &grid, &owners), TSL_OK);
    EXPECT_EQ(grid.splits[0], 6);
    EXPECT_EQ(grid.splits[2], 1);
    EXPECT_EQ(grid.splits[3], 1);
    // No plan, fewer samples per rank than workers (4 on 3 ranks of 2): one sample tile per rank,
    // cut in 2 along the longest dimension, so each rank has a tile per worker.
    ASSERT_EQ(tsl_plan_tensor_tiling(nullptr, &input, 3, 0, 2, 4, &act, 1, &grid, &owners), TSL_OK);
    EXPECT_EQ(grid.splits[0], 3);
    EXPECT_EQ(grid.splits[2], 2);
    EXPECT_EQ(grid.splits[3], 1);
    EXPECT_EQ(owners.process_grid[0], 3);
    // One sample on one rank of 4 workers: 4 tiles along the longest dimension.
    ASSERT_EQ(tsl_plan_tensor_tiling(nullptr, &input, 1, 0, 4, 1, &act, 1, &grid, &owners), TSL_OK);
    EXPECT_EQ(grid.splits[0], 1);
    EXPECT_EQ(grid.splits[2], 4);
    // ... and its flat tensors (no spatial dimension) keep sample tiles.
    int64_t flat_dims[1] = {10};
    tsl_shape flat;
    ASSERT_EQ(tsl_shape_make(&flat, 1, flat_dims), TSL_OK);
    ASSERT_EQ(tsl_plan_tensor_tiling(nullptr, &input, 3, 0, 2, 4, &flat, 1, &grid, &owners),
              TSL_OK);
    EXPECT_EQ(grid.splits[0], 4);
    // Fewer samples than ranks: no spatial tiles (the ranks without a sample stay idle).
    ASSERT_EQ(tsl_plan_tensor_tiling(nullptr, &input, 3, 0, 2, 2, &act, 1, &grid, &owners), TSL_OK);
    EXPECT_EQ(grid.splits[0], 2);
    EXPECT_EQ(grid.splits[2], 1);
}

namespace
{

// The largest per-stage sum of `cost` over ops, and whether stages run 0, 0, ..., S-1 in op
// order with none empty.
double largest_stage(const std::vector<int32_t> &stage, const std::vector<double> &cost,
                     int32_t stages, bool *ordered)
{
    std::vector<double> sum((size_t)stages, 0.0);
    std::vector<int> count((size_t)stages, 0);
    *ordered = true;
    for (size_t o = 0; o < stage.size(); o++) {
        sum[(size_t)stage[o]] += cost[o];
        count[(size_t)stage[o]]++;
        if (o > 0 && (stage[o] < stage[o - 1] || stage[o] > stage[o - 1] + 1))
            *ordered = false;
    }
    for (int c : count)
        *ordered = *ordered && c > 0;
    return *std::max_element(sum.begin(), sum.end());
}

} // namespace

// The largest rank's estimated peak (live tiles plus received copies) of g's training under p
// on `ranks` ranks, with batch 1 and Adam: what balance=memory makes smallest.
static int64_t largest_peak(const tsl_plan &p, tsl_graph_t g, int32_t ranks)
{
    std::vector<int64_t> live((size_t)ranks), received((size_t)ranks);
    EXPECT_EQ(tsl_plan_estimate_peak(&p, g, ranks, 1, 1, 2, live.data()), TSL_OK);
    EXPECT_EQ(tsl_plan_estimate_received(&p, g, ranks, 1, 1, 2, received.data()), TSL_OK);
    int64_t most = 0;
    for (int32_t r = 0; r < ranks; r++)
        most = std::max(most, live[(size_t)r] + received[(size_t)r]);
    return most;
}

// Each balance cuts consecutive ops into non-empty stages; the memory-aware split of a U-Net
// has a smaller largest rank, by the estimate of what lives at once (with received copies),
// than the naive split (same number of ops per stage), and the time-aware split a smaller
// largest stage by flops. With two stages, exhaustive searches over every cut find no better
// split for time (flops) nor memory (the estimate).
TEST(Plan, StagesCutConsecutiveOpsAsTheBalanceSays)
{
    int64_t sample[3] = {1, 128, 128};
    tsl_graph_t g = nullptr;
    ASSERT_EQ(tsl_zoo_graph("unet2d", 3, sample, 3, &g), TSL_OK);
    int32_t nops = tsl_graph_op_count(g);
    std::vector<double> flops((size_t)nops);
    for (int32_t o = 0; o < nops; o++)
        ASSERT_EQ(tsl_graph_op_flops(g, o, 1, &flops[(size_t)o]), TSL_OK);
    std::vector<double> ones((size_t)nops, 1.0);
    ones[0] = 0; // the input
    for (int32_t stages : {2, 4}) {
        SCOPED_TRACE("stages " + std::to_string(stages));
        std::map<int, std::vector<int32_t>> split;
        std::map<int, int64_t> largest_peak_of;
        for (int b : {TSL_BALANCE_MEMORY, TSL_BALANCE_LAYERS, TSL_BALANCE_TIME}) {
            tsl_plan p;
            ASSERT_EQ(tsl_plan_init(&p), TSL_OK);
            p.stages = stages;
            p.balance = b;
            std::vector<int32_t> stage((size_t)nops, -1);
            ASSERT_EQ(tsl_plan_stages(&p, g, 1, 2, stage.data()), TSL_OK) << tsl_last_error();
            bool ordered;
            largest_stage(stage, ones, stages, &ordered);
            EXPECT_TRUE(ordered) << b;
            split[b] = stage;
            std::vector<int64_t> bytes((size_t)stages);
            ASSERT_EQ(tsl_plan_estimate(&p, g, stages, 1, 1, 2, bytes.data()), TSL_OK);
            largest_peak_of[b] = largest_peak(p, g, stages);
            // One rank per stage, nothing sharded: the ranks together hold the one-rank total,
            // plus the concatenations one rank reads in place (its convolution's) and a cut
            // between stages makes (a tensor and its gradient).
            int64_t one = 0, sum = 0, unfolded = 0;
            ASSERT_EQ(tsl_plan_estimate(nullptr, g, 1, 1, 1, 2, &one), TSL_OK);
            for (int64_t x : bytes)
                sum += x;
            for (int32_t o = 0; o < nops; o++)
                if (tsl_graph_folded_concat(g, o, nullptr) >= 0 &&
                    tsl_graph_folded_concat(g, o, stage.data()) < 0)
                    unfolded += 2 * 4 * tsl_shape_numel(&g->values[g->ops[o].output].shape);
            EXPECT_EQ(sum, one + unfolded) << b;
        }
        // (at 4 stages both end with the same last stage, up1 -> classifier, the largest rank
        // whatever the other cuts: no worse then)
        if (stages == 2)
            EXPECT_LT(largest_peak_of[TSL_BALANCE_MEMORY], largest_peak_of[TSL_BALANCE_LAYERS]);
        EXPECT_LE(largest_peak_of[TSL_BALANCE_MEMORY], largest_peak_of[TSL_BALANCE_LAYERS]);
        EXPECT_LE(largest_peak_of[TSL_BALANCE_MEMORY], largest_peak_of[TSL_BALANCE_TIME]);
        bool ordered;
        double naive_ops = largest_stage(split[TSL_BALANCE_LAYERS], ones, stages, &ordered);
        // ceil, as even as it gets, but for a batch norm and its fused ReLU, which stay together
        EXPECT_LE(naive_ops, (nops - 1 + stages - 1) / stages + 1);
        double time_flops = largest_stage(split[TSL_BALANCE_TIME], flops, stages, &ordered);
        EXPECT_LT(time_flops, largest_stage(split[TSL_BALANCE_LAYERS], flops, stages, &ordered));
        EXPECT_LE(time_flops, largest_stage(split[TSL_BALANCE_MEMORY], flops, stages, &ordered));
        // Best of all two-stage cuts (the input op always with the first stage).
        if (stages == 2) {
            double best = 1e300;
            for (int32_t cut = 2; cut < nops; cut++) {
                std::vector<int32_t> st((size_t)nops, 0);
                for (int32_t o = cut; o < nops; o++)
                    st[(size_t)o] = 1;
                best = std::min(best, largest_stage(st, flops, 2, &ordered));
            }
            EXPECT_DOUBLE_EQ(time_flops, best);
            // The same cuts by hand (op `cut` starts stage 1), but for those between a batch
            // norm and the ReLU it fuses, which the split keeps together.
            tsl_plan p;
            ASSERT_EQ(tsl_plan_parse("stages=2", &p), TSL_OK);
            int64_t best_peak = INT64_MAX;
            for (int32_t cut = 2; cut < nops; cut++) {
                tsl_op_kind before, kind;
                int32_t out, unused;
                ASSERT_EQ(tsl_graph_op_info(g, cut - 1, &before, nullptr, &unused), TSL_OK);
                ASSERT_EQ(tsl_graph_op_info(g, cut, &kind, nullptr, &out), TSL_OK);
                if (before == TSL_OP_BATCHNORM && kind == TSL_OP_ACTIVATION)
                    continue;
                ASSERT_EQ(tsl_graph_set_stage(g, out, 1), TSL_OK);
                best_peak = std::min(best_peak, largest_peak(p, g, 2));
                ASSERT_EQ(tsl_graph_set_stage(g, out, -1), TSL_OK);
            }
            EXPECT_EQ(largest_peak_of[TSL_BALANCE_MEMORY], best_peak);
        }
    }
    // More stages than ops after the input is an error that says so.
    tsl_plan p;
    ASSERT_EQ(tsl_plan_init(&p), TSL_OK);
    p.stages = nops;
    std::vector<int32_t> stage((size_t)nops);
    EXPECT_EQ(tsl_plan_stages(&p, g, 1, 2, stage.data()), TSL_ERR_INVALID_ARG);
    EXPECT_NE(std::string(tsl_last_error()).find("need at least"), std::string::npos);
    tsl_graph_destroy(g);
}

// A padded 3x3 convolution of value x in g.
static tsl_status conv3(tsl_graph_t g, const char *name, int32_t x, int64_t out_channels,
                        int32_t *y)
{
    int64_t k[2] = {3, 3};
    tsl_conv_params cp;
    tsl_conv_params_init(&cp, 2);
    cp.padding[0] = cp.padding[1] = 1;
    return tsl_graph_conv(g, name, x, out_channels, k, &cp, 0, 1, y);
}

// A graph of one 1-channel 8x8 input and a padded 3x3 convolution of it (`a`, out_channels).
static tsl_graph_t input_and_conv(int64_t out_channels, int32_t *a)
{
    tsl_graph_t g = nullptr;
    int64_t sample[3] = {1, 8, 8};
    int32_t x;
    if (tsl_graph_create(&g) != TSL_OK || tsl_graph_input(g, 3, sample, &x) != TSL_OK ||
        conv3(g, "a", x, out_channels, a) != TSL_OK) {
        tsl_graph_destroy(g);
        return nullptr;
    }
    return g;
}

// Stages given by hand win over the balance; an op without one is on its predecessor's; a
// stage the plan does not have is an error.
// Received copies: a conv on stage 1 reads its input from stage 0 (forward), and the task on
// stage 0 writing that input's gradient reads the conv's output gradient and weight
// (backward), at stage 0's peak (x, a and a's gradient with them).
TEST(Plan, ReceivedCopiesAreTheValuesCrossingStages)
{
    int32_t a, b;
    tsl_graph_t g = input_and_conv(4, &a);
    ASSERT_NE(g, nullptr);
    ASSERT_EQ(conv3(g, "b", a, 2, &b), TSL_OK);
    ASSERT_EQ(tsl_graph_set_output(g, b), TSL_OK);
    ASSERT_EQ(tsl_graph_set_stage(g, a, 0), TSL_OK);
    ASSERT_EQ(tsl_graph_set_stage(g, b, 1), TSL_OK);
    tsl_plan p;
    ASSERT_EQ(tsl_plan_parse("stages=2", &p), TSL_OK);
    const int64_t batch = 3;
    int64_t got[2] = {-1, -1};
    ASSERT_EQ(tsl_plan_estimate_received(&p, g, 2, 1, batch, 0, got), TSL_OK) << tsl_last_error();
    EXPECT_EQ(got[1], batch * 4 * 8 * 8 * 4);                     // a's output, read by b
    EXPECT_EQ(got[0], batch * 2 * 8 * 8 * 4 + 2 * 4 * 3 * 3 * 4); // b's output gradient and
                                                                  // weight, read for a's
    // What moves between the stages each step: a forward, and again for b's weight gradient
    // (the forward's copy is dropped); back, the tasks making a's gradient on stage 0 read
    // b's output gradient and weight.
    int64_t sent[2 * TSL_TRAFFIC_TERMS];
    ASSERT_EQ(tsl_plan_estimate_traffic(&p, g, 2, 1, batch, 0, sent), TSL_OK) << tsl_last_error();
    EXPECT_EQ(sent[TSL_TRAFFIC_STAGES * 2], 2 * batch * 4 * 8 * 8 * 4);
    EXPECT_EQ(sent[TSL_TRAFFIC_STAGES * 2 + 1], batch * 2 * 8 * 8 * 4 + 2 * 4 * 3 * 3 * 4);
    int64_t none[1] = {-1};
    ASSERT_EQ(tsl_plan_estimate_received(nullptr, g, 1, 1, batch, 0, none), TSL_OK);
    EXPECT_EQ(none[0], 0);
    tsl_graph_destroy(g);
}

// Received copies are what they add to a rank's peak, placed where they live (P: one channel's
// plane). Two convolutions on stage 1 read a (4 P) and b (6 P) from stage 0: both copies are
// held the whole step, 10 P on stage 1's peak. Stage 0 holds x, a and b (11 P); in the
// backward d's output gradient (2 P, received) comes with b's gradient (19 P), c's (2 P) with
// a's (23 P), each gone once read, and the peak is b's backward making a's spare (25 P), when
// no copy is held: 0. A concatenation on stage 1 holds its inputs' copies (10 P) beside its
// output and the conv's gradients (24 P without, 34 P with them), then cuts its gradient into
// the two parts to send (10 P more: 42 P, 18 P over 24 P); stage 0 receives the parts (10 P)
// while it makes a's and b's gradients (21 P without them: 31 P; its peak without, 25 P, comes
// later): 6 P.
TEST(Plan, BackwardReadsOfEarlierStagesAddUp)
{
    const int64_t batch = 2, plane = 8 * 8 * 4 * batch; // bytes of one channel
    for (int concat = 0; concat < 2; concat++) {
        SCOPED_TRACE(concat ? "concatenation" : "two convolutions");
        int32_t a, b, c, d, e;
        tsl_graph_t g = input_and_conv(4, &a);
        ASSERT_NE(g, nullptr);
        ASSERT_EQ(conv3(g, "b", a, 6, &b), TSL_OK);
        if (concat) {
            int32_t ab[2] = {a, b};
            ASSERT_EQ(tsl_graph_concat(g, 2, ab, &c), TSL_OK);
            ASSERT_EQ(conv3(g, "d", c, 2, &e), TSL_OK);
        } else {
            ASSERT_EQ(conv3(g, "c", a, 2, &c), TSL_OK);
            ASSERT_EQ(conv3(g, "d", b, 2, &d), TSL_OK);
            ASSERT_EQ(tsl_graph_add(g, c, d, &e), TSL_OK);
        }
        ASSERT_EQ(tsl_graph_set_output(g, e), TSL_OK);
        ASSERT_EQ(tsl_graph_set_stage(g, a, 0), TSL_OK);
        ASSERT_EQ(tsl_graph_set_stage(g, b, 0), TSL_OK);
        ASSERT_EQ(tsl_graph_set_stage(g, c, 1), TSL_OK);
        tsl_plan p;
        ASSERT_EQ(tsl_plan_parse("stages=2", &p), TSL_OK);
        int64_t got[2] = {-1, -1};
        ASSERT_EQ(tsl_plan_estimate_received(&p, g, 2, 1, batch, 0, got), TSL_OK)
            << tsl_last_error();
        if (concat) {
            EXPECT_EQ(got[1], 18 * plane); // a and b, and the parts cut for stage 0
            EXPECT_EQ(got[0], 6 * plane);  // the parts received, as a's and b's gradients come
        } else {
            EXPECT_EQ(got[1], (4 + 6) * plane); // a and b, for c's and d's forward and dw
            EXPECT_EQ(got[0], 0);               // c's and d's output gradients, off the peak
        }
        tsl_graph_destroy(g);
    }
}

// The one-rank peak estimate of g under plan (NULL: none), batch 1 and 3, is `peak` planes of
// 8x8 floats beyond the parameters and labels (the all-tiles estimate less its `values`
// planes of values).
static void expect_peak_planes(tsl_graph_t g, int64_t values, int64_t peak_planes,
                               const tsl_plan *plan = nullptr)
{
    for (int64_t batch : {1, 3}) {
        const int64_t plane = 8 * 8 * 4 * batch;
        int64_t all = -1, peak = -1;
        ASSERT_EQ(tsl_plan_estimate(plan, g, 1, 1, batch, 2, &all), TSL_OK);
        ASSERT_EQ(tsl_plan_estimate_peak(plan, g, 1, 1, batch, 2, &peak), TSL_OK)
            << tsl_last_error();
        EXPECT_EQ(peak - (all - values * plane), peak_planes * plane) << batch;
    }
}

// The most tiles live at once, worked out by hand for x -> a = conv(x) -> b = conv(a),
// c = conv(a) -> e = b + c (output), in planes of 8x8 floats (P): the forward makes x, a, b, c
// and e (13 P) and releases b and c, which no backward reads (the addition's does not), after
// the addition (9 P); the backward makes e's gradient, then b's and c's (add), a's (c's conv,
// which releases c's gradient), a spare for a's second contribution (b's conv): 19 P, then
// releases as ops finish. The
// parameters and labels (live all the step) are what the all-tiles estimate has beyond its 27 P
// of values (x; a, its gradient and spare; b, c and e with their gradients).
TEST(Plan, PeakFollowsTheExecutorsOrder)
{
    int32_t a, b, c, e;
    tsl_graph_t g = input_and_conv(4, &a);
    ASSERT_NE(g, nullptr);
    ASSERT_EQ(conv3(g, "b", a, 2, &b), TSL_OK);
    ASSERT_EQ(conv3(g, "c", a, 2, &c), TSL_OK);
    ASSERT_EQ(tsl_graph_add(g, b, c, &e), TSL_OK);
    ASSERT_EQ(tsl_graph_set_output(g, e), TSL_OK);
    expect_peak_planes(g, 27, 19);
    int64_t bytes[1];
    EXPECT_EQ(tsl_plan_estimate_peak(nullptr, g, 0, 1, 1, 2, bytes), TSL_ERR_INVALID_ARG);
    tsl_graph_destroy(g);
    // An empty graph says what it lacks.
    ASSERT_EQ(tsl_graph_create(&g), TSL_OK);
    for (auto estimate : {tsl_plan_estimate, tsl_plan_estimate_peak}) {
        EXPECT_EQ(estimate(nullptr, g, 1, 1, 1, 2, bytes), TSL_ERR_STATE);
        EXPECT_NE(std::string(tsl_last_error()).find("an input and an output"), std::string::npos)
            << tsl_last_error();
    }
    tsl_graph_destroy(g);
}

// The readers index (tsl_graph_readers) against a look through every op's inputs: on a U-Net
// (values read by two ops, a concatenation), after the graph grows past a first query, and
// on a copy, which makes its own.
TEST(Graph, ReadersIndexListsEveryReadInOrder)
{
    const int64_t sample[3] = {1, 16, 16};
    tsl_graph_t g = nullptr;
    ASSERT_EQ(tsl_zoo_graph("unet2d", 3, sample, 3, &g), TSL_OK) << tsl_last_error();
    auto expect_index = [](const struct tsl_graph *h) {
        int multi = 0;
        for (int32_t v = 0; v < h->nvalues; v++) {
            std::vector<int32_t> want;
            for (int32_t o = 0; o < h->nops; o++)
                for (int32_t k = 0; k < h->ops[o].ninputs; k++)
                    if (h->ops[o].inputs[k] == v)
                        want.push_back(o);
            int32_t n = -2;
            const int32_t *got = tsl_graph_readers(h, v, &n);
            ASSERT_EQ(n, (int32_t)want.size()) << v;
            EXPECT_EQ(std::vector<int32_t>(got, got + n), want) << v;
            multi += n > 1;
        }
        EXPECT_GT(multi, 0); // (the skips)
    };
    expect_index(g);
    int32_t n = -2, grown = tsl_graph_output(g), relu;
    ASSERT_EQ(tsl_graph_activation(g, grown, TSL_ACT_RELU, 0, &relu), TSL_OK);
    expect_index(g); // the new op reads the old output
    EXPECT_EQ(tsl_graph_readers(g, relu, &n), g->rd_ops + g->rd_start[relu]);
    EXPECT_EQ(n, 0);
    EXPECT_EQ(tsl_graph_readers(g, g->nvalues, &n), nullptr); // no such value
    EXPECT_EQ(n, 0);
    struct tsl_graph *c = tsl_graph_copy(g);
    ASSERT_NE(c, nullptr);
    EXPECT_EQ(c->rd_start, nullptr);
    expect_index(c);
    EXPECT_NE(c->rd_start, g->rd_start);
    tsl_graph_destroy(c);
    expect_index(g);
    tsl_graph_destroy(g);
}

// A 1-D CNN's global average pooling under space=R (R = 2, 4): its input (64 channels, 8
// positions, 2 samples: 4096 bytes) is cut in R, its output (one position) is not, so the
// executor moves the input onto the output's one tile on rank 0, whole (cx), receiving the
// other ranks' tiles whole; the backward sends each of them its part of the input gradient
// (cut out on rank 0). The max poolings before it keep their tiles: nothing moves.
TEST(Plan, RegridsMoveTheInputOntoTheOutputsTiles)
{
    const int64_t sample[2] = {1, 64};
    tsl_graph_t g = nullptr;
    ASSERT_EQ(tsl_zoo_graph("cnn1d", 2, sample, 3, &g), TSL_OK) << tsl_last_error();
    for (int32_t ranks : {2, 4}) {
        SCOPED_TRACE(ranks);
        tsl_plan plan;
        ASSERT_EQ(tsl_plan_parse(ranks == 2 ? "space=2" : "space=4", &plan), TSL_OK);
        std::vector<int64_t> cx(ranks), cy(ranks), fwd(ranks), bwd(ranks), none(ranks, 0);
        int moved = 0, pools = 0;
        for (int32_t o = 0; o < g->nops; o++) {
            ASSERT_EQ(tsl_plan_regrid_bytes(&plan, g, o, ranks, 0, 1, 2, cx.data(), cy.data(),
                                            fwd.data(), bwd.data()),
                      TSL_OK);
            const tsl_graph_op &op = g->ops[o];
            const bool global = op.kind == TSL_OP_POOL && g->values[op.output].shape.dims[1] == 1;
            pools += op.kind == TSL_OP_POOL;
            EXPECT_EQ(cy, none) << o;
            if (!global) {
                EXPECT_EQ(cx, none) << o;
                EXPECT_EQ(fwd, none) << o;
                EXPECT_EQ(bwd, none) << o;
                continue;
            }
            moved++;
            const int64_t whole = 2 * 64 * 8 * 4, tile = whole / ranks;
            std::vector<int64_t> want_cx(ranks, 0), want_fwd(ranks, 0), want_bwd(ranks, tile);
            want_cx[0] = whole;
            want_fwd[0] = whole - tile;
            want_bwd[0] = 0;
            EXPECT_EQ(cx, want_cx);
            EXPECT_EQ(fwd, want_fwd);
            EXPECT_EQ(bwd, want_bwd);
        }
        EXPECT_EQ(moved, 1);
        EXPECT_EQ(pools, 4);
        // Without the space cut nothing moves.
        ASSERT_EQ(tsl_plan_parse(ranks == 2 ? "data=2" : "data=4", &plan), TSL_OK);
        for (int32_t o = 0; o < g->nops; o++) {
            ASSERT_EQ(tsl_plan_regrid_bytes(&plan, g, o, ranks, 0, 1, 2, cx.data(), cy.data(),
                                            fwd.data(), bwd.data()),
                      TSL_OK);
            EXPECT_EQ(cx, none) << o;
            EXPECT_EQ(fwd, none) << o;
        }
    }
    tsl_graph_destroy(g);
}

// The values a training step reads after the forward pass. Those it does not read: a U-Net's
// up-convolution outputs (transposed convolutions), which only a concatenation reads; the
// global average pooling before a classifier, which only the flattening reads; in ResNet the
// batch norms whose output only a residual addition reads; the ReLU outputs that pooling reads
// (max pooling keeps indices, average pooling spreads dy over its windows; a ReLU's backward
// reads its input), unless another reader's backward reads them (a U-Net's skips with their
// concatenation folded into the convolution: not here, without folding): ResNet's last ReLU
// before its global average pooling; in cnn3d the last max pooling's output, which only the
// global average pooling reads.
TEST(Plan, ValuesNoBackwardReads)
{
    typedef std::pair<tsl_op_kind, tsl_op_kind> producer_reader;
    struct Case {
        const char *model;
        int64_t sample[4];
        int ndims;
        std::vector<producer_reader> want; // at least these, nothing else
        int at_least_bn_add;
    };
    const producer_reader up = {TSL_OP_CONV, TSL_OP_CONCAT}, gap = {TSL_OP_POOL, TSL_OP_FLATTEN},
                          bn_add = {TSL_OP_BATCHNORM, TSL_OP_ADD},
                          relu_max = {TSL_OP_ACTIVATION, TSL_OP_POOL}, /* (or average) */
        max_gap = {TSL_OP_POOL, TSL_OP_POOL};
    const Case cases[] = {
        {"unet2d", {1, 16, 16}, 3, {relu_max, relu_max, up, up}, 0},
        {"unet3d", {1, 8, 8, 8}, 4, {relu_max, relu_max, up, up}, 0},
        {"cnn3d", {1, 8, 8, 8}, 4, {relu_max, relu_max, relu_max, max_gap, gap}, 0},
        {"resnet", {3, 16, 16}, 3, {relu_max, gap}, 3},
    };
    for (const Case &c : cases) {
        tsl_graph_t g = nullptr;
        ASSERT_EQ(tsl_zoo_graph(c.model, c.ndims, c.sample, 3, &g), TSL_OK) << c.model;
        std::vector<uint8_t> fused((size_t)g->nops, 0);
        for (int32_t o = 0; o < g->nops; o++)
            if (tsl_graph_fused_relu(g, o, nullptr) >= 0)
                fused[(size_t)tsl_graph_fused_relu(g, o, nullptr)] = 1;
        std::vector<producer_reader> got;
        int bn_adds = 0;
        for (int32_t v = 0; v < g->nvalues; v++) {
            if (tsl_graph_value_read_backward(g, v, fused.data(), nullptr))
                continue;
            const tsl_graph_op &p = g->ops[g->values[v].producer];
            std::vector<tsl_op_kind> readers;
            for (int32_t r = 0; r < g->nops; r++)
                for (int32_t k = 0; k < g->ops[r].ninputs; k++)
                    if (g->ops[r].inputs[k] == v)
                        readers.push_back(g->ops[r].kind);
            // One reader, or a max pooling and a concatenation (a U-Net's skip).
            ASSERT_TRUE(
                readers.size() == 1u ||
                (readers.size() == 2u && readers[0] == TSL_OP_POOL && readers[1] == TSL_OP_CONCAT))
                << c.model << ": value " << v;
            if (p.kind == TSL_OP_CONV)
                EXPECT_TRUE(p.transposed) << c.model << ": value " << v;
            if (producer_reader(p.kind, readers[0]) == bn_add)
                bn_adds++;
            else
                got.push_back({p.kind, readers[0]});
        }
        EXPECT_EQ(got, c.want) << c.model;
        EXPECT_GE(bn_adds, c.at_least_bn_add) << c.model;
        if (!c.at_least_bn_add)
            EXPECT_EQ(bn_adds, 0) << c.model;
        EXPECT_TRUE(tsl_graph_value_read_backward(g, g->input, fused.data(), nullptr));
        EXPECT_TRUE(tsl_graph_value_read_backward(g, g->output, fused.data(), nullptr));
        tsl_graph_destroy(g);
    }
}

// A concatenation whose only reader is a convolution keeping its spatial size, on one stage,
// is read in place by that convolution (tsl_graph_folded_concat()): no tensor, no gradient.
// Hand count for x -> a = conv(x), b = conv(a), c = concat(a, b), d = conv(c) (planes of
// 8x8 floats per channel, P): the values hold x 3 P, a 4 P with its gradient and spare, b 4 P
// with its gradient, d 2 P with its gradient, c nothing: 27 P. The peak: forward x, a, b, d
// (13 P, a and b stay for d's weight gradient); backward d's gradient (15), d's backward makes
// a's and b's gradients (23) and drops d's gradient (21), b's backward a's spare (25). Made,
// c would add 16 P to the values and lift the peak to 33 P.
TEST(Plan, ConcatenationsFoldIntoTheirConvolution)
{
    int32_t a, b, c, d;
    tsl_graph_t g = input_and_conv(4, &a);
    ASSERT_NE(g, nullptr);
    ASSERT_EQ(conv3(g, "b", a, 4, &b), TSL_OK);
    const int32_t ab[2] = {a, b};
    ASSERT_EQ(tsl_graph_concat(g, 2, ab, &c), TSL_OK);
    ASSERT_EQ(conv3(g, "d", c, 2, &d), TSL_OK);
    ASSERT_EQ(tsl_graph_set_output(g, d), TSL_OK);
    const int32_t concat = g->values[c].producer, reader = g->values[d].producer;
    EXPECT_EQ(tsl_graph_folded_concat(g, concat, nullptr), reader);
    EXPECT_EQ(tsl_graph_folded_concat(g, reader, nullptr), -1); // not a concatenation
    int32_t ins[8];
    std::vector<int32_t> fold((size_t)g->nops, -1);
    fold[(size_t)concat] = reader;
    ASSERT_EQ(tsl_graph_exec_inputs(g, reader, fold.data(), ins), 2);
    EXPECT_EQ(ins[0], a);
    EXPECT_EQ(ins[1], b);
    EXPECT_EQ(tsl_graph_exec_inputs(g, concat, fold.data(), ins), 0);
    EXPECT_FALSE(tsl_graph_last_reader(g, b, concat, fold.data())); // d reads it, later
    EXPECT_TRUE(tsl_graph_last_reader(g, b, concat, nullptr));
    EXPECT_TRUE(tsl_graph_value_read_backward(g, b, nullptr, fold.data()));
    EXPECT_FALSE(tsl_graph_value_read_backward(g, b, nullptr, nullptr));
    expect_peak_planes(g, 27, 25);
    // Across pipeline stages the parts stay apart: concatenated on the reader's stage.
    std::vector<int32_t> stage((size_t)g->nops, 0);
    EXPECT_EQ(tsl_graph_folded_concat(g, concat, stage.data()), reader);
    stage[(size_t)g->values[b].producer] = 1;
    stage[(size_t)concat] = stage[(size_t)reader] = 1;
    EXPECT_EQ(tsl_graph_folded_concat(g, concat, stage.data()), -1);
    tsl_graph_destroy(g);

    // Readers that cannot take the parts apart: the output itself, two readers, a strided,
    // a transposed or a grouped convolution, pooling.
    for (int variant = 0; variant < 6; variant++) {
        SCOPED_TRACE("variant " + std::to_string(variant));
        g = input_and_conv(4, &a);
        ASSERT_NE(g, nullptr);
        ASSERT_EQ(conv3(g, "b", a, 4, &b), TSL_OK);
        ASSERT_EQ(tsl_graph_concat(g, 2, ab, &c), TSL_OK);
        int64_t k[2] = {3, 3};
        tsl_conv_params cp;
        tsl_conv_params_init(&cp, 2);
        cp.padding[0] = cp.padding[1] = 1;
        int32_t out = c;
        if (variant == 1) {
            int32_t e;
            ASSERT_EQ(conv3(g, "d", c, 2, &d), TSL_OK);
            ASSERT_EQ(conv3(g, "e", c, 2, &e), TSL_OK);
            ASSERT_EQ(tsl_graph_add(g, d, e, &out), TSL_OK);
        } else if (variant == 2 || variant == 3 || variant == 4) {
            if (variant == 2)
                cp.stride[0] = cp.stride[1] = 2;
            if (variant == 4)
                cp.groups = 2;
            ASSERT_EQ(tsl_graph_conv(g, "d", c, 2, k, &cp, variant == 3, 1, &out), TSL_OK);
        } else if (variant == 5) {
            tsl_pool_params pp;
            ASSERT_EQ(tsl_pool_params_init(&pp, TSL_POOL_MAX, 2, 2), TSL_OK);
            ASSERT_EQ(tsl_graph_pool(g, c, &pp, &out), TSL_OK);
        }
        ASSERT_EQ(tsl_graph_set_output(g, out), TSL_OK);
        EXPECT_EQ(tsl_graph_folded_concat(g, g->values[c].producer, nullptr), -1);
        tsl_graph_destroy(g);
    }

    // The zoo's U-Nets: every concatenation folds into the decoder's first convolution, whose
    // backward then reads the up-convolution's output.
    for (const char *name : {"unet2d", "unet3d"}) {
        int64_t sample[4] = {1, 8, 8, 8};
        ASSERT_EQ(tsl_zoo_graph(name, name[4] == '2' ? 3 : 4, sample, 3, &g), TSL_OK);
        int concats = 0;
        for (int32_t o = 0; o < g->nops; o++) {
            if (g->ops[o].kind != TSL_OP_CONCAT)
                continue;
            concats++;
            int32_t r = tsl_graph_folded_concat(g, o, nullptr);
            ASSERT_GE(r, 0) << name;
            EXPECT_EQ(g->ops[r].kind, TSL_OP_CONV);
        }
        EXPECT_EQ(concats, 2) << name;
        tsl_graph_destroy(g);
    }
}

// x -> a = conv(x) (4 channels) -> r1 = relu(bn1(a)) -> b = conv(r1) (4) -> r2 = relu(bn2(b))
// (v: bn2's output) -> c = conv(r2) (2, the output); bn2 and what follows on stage bn2_stage
// (-1: none given).
static tsl_graph_t two_norms(int32_t bn2_stage, int32_t *a, int32_t *r1, int32_t *b, int32_t *r2,
                             int32_t *c, int32_t *v)
{
    tsl_graph_t g = input_and_conv(4, a);
    if (g && (tsl_graph_batchnorm(g, "bn1", *a, 1e-5, 0.1, v) != TSL_OK ||
              tsl_graph_activation(g, *v, TSL_ACT_RELU, 0, r1) != TSL_OK ||
              conv3(g, "b", *r1, 4, b) != TSL_OK ||
              tsl_graph_batchnorm(g, "bn2", *b, 1e-5, 0.1, v) != TSL_OK ||
              (bn2_stage >= 0 && tsl_graph_set_stage(g, *v, bn2_stage) != TSL_OK) ||
              tsl_graph_activation(g, *v, TSL_ACT_RELU, 0, r2) != TSL_OK ||
              conv3(g, "c", *r2, 2, c) != TSL_OK || tsl_graph_set_output(g, *c) != TSL_OK)) {
        tsl_graph_destroy(g);
        return nullptr;
    }
    return g;
}

// Batch norms with a fused ReLU: with recompute=1 the executor drops the ReLU's output after
// its last forward reader and makes it again before the first backward reading it
// (tsl_graph_recomputed()).
// Hand count for x -> a = conv(x) -> r1 = relu(bn(a)) -> b = conv(r1) -> r2 = relu(bn(b)) ->
// c = conv(r2) (output), planes of 8x8 floats per channel (P): values x 3, a, r1, b, r2 4 P
// each with their gradients, c 2 P with its gradient: 39 P. Forward: x, a, r1, b (r1 dropped
// after b's conv), r2, c (r2 dropped): 13 P. Backward: c's gradient (15), r2 made again (19)
// and its gradient (23), c's gradient gone (21), b's gradient (25), r2 and its gradient gone
// (17), r1 made again and its gradient (25), and so on: 25 P. Keeping r1 and r2 instead, the
// forward ends at 21 P and the backward peaks at 27 P: c's gradient (23) and r2's (27), then c's
// gradient and r2 go (no backward reads r2 after c's: the fused backward masks by b), before
// bn2's backward makes b's gradient (25).
TEST(Plan, FusedReluOutputsAreMadeAgainForTheBackward)
{
    int32_t a, r1, b, r2, c, v;
    tsl_graph_t g = two_norms(-1, &a, &r1, &b, &r2, &c, &v);
    ASSERT_NE(g, nullptr);
    EXPECT_EQ(tsl_graph_recomputed(g, r1, nullptr), g->values[a].producer + 1);
    EXPECT_EQ(tsl_graph_recomputed(g, r2, nullptr), g->values[b].producer + 1);
    for (int32_t w : {g->input, a, b, c, v}) // not a fused ReLU's output (v: the batch norm's)
        EXPECT_EQ(tsl_graph_recomputed(g, w, nullptr), -1) << w;
    tsl_plan plan;
    ASSERT_EQ(tsl_plan_parse("recompute=1", &plan), TSL_OK);
    expect_peak_planes(g, 39, 25, &plan);
    expect_peak_planes(g, 39, 27); // kept
    // Two micro-batches, kept: the stretch from c's backward down to bn2 (no batch norm in it)
    // takes micro-batch 0 through before micro-batch 1: from 23 (c's gradient), r2's gradient
    // half (25), c's gradient half gone (24), r2's half, which its fused backward does not read
    // (22); the other halves 24, 23, 21; then bn2's backward, whose statistics need both
    // micro-batches, makes b's gradient half by half (23, r2's gradient half gone: 21, 23, 21):
    // 25 P. Walked op by op (c's two halves, then bn2's) it would be 26; with r2 held to bn2's
    // backward, 27.
    tsl_plan two;
    ASSERT_EQ(tsl_plan_parse("micro=2", &two), TSL_OK);
    expect_peak_planes(g, 39, 25, &two);
    // A reader on another stage than the batch norm: kept.
    std::vector<int32_t> stage((size_t)g->nops, 0);
    stage[(size_t)g->values[c].producer] = 1;
    EXPECT_EQ(tsl_graph_recomputed(g, r2, stage.data()), -1);
    EXPECT_GE(tsl_graph_recomputed(g, r1, stage.data()), 0);
    tsl_graph_destroy(g);
    // The graph's output is never dropped.
    g = input_and_conv(4, &a);
    ASSERT_NE(g, nullptr);
    ASSERT_EQ(tsl_graph_batchnorm(g, "bn1", a, 1e-5, 0.1, &v), TSL_OK);
    ASSERT_EQ(tsl_graph_activation(g, v, TSL_ACT_RELU, 0, &r1), TSL_OK);
    ASSERT_EQ(tsl_graph_set_output(g, r1), TSL_OK);
    EXPECT_EQ(tsl_graph_recomputed(g, r1, nullptr), -1);
    tsl_graph_destroy(g);
    // Group norm's fused ReLU output is made again as batch norm's: the same peaks.
    g = input_and_conv(4, &a);
    ASSERT_NE(g, nullptr);
    ASSERT_EQ(tsl_graph_groupnorm(g, "gn1", a, 2, 1e-5, &v), TSL_OK);
    ASSERT_EQ(tsl_graph_activation(g, v, TSL_ACT_RELU, 0, &r1), TSL_OK);
    ASSERT_EQ(conv3(g, "b", r1, 4, &b), TSL_OK);
    ASSERT_EQ(tsl_graph_groupnorm(g, "gn2", b, 4, 1e-5, &v), TSL_OK);
    ASSERT_EQ(tsl_graph_activation(g, v, TSL_ACT_RELU, 0, &r2), TSL_OK);
    ASSERT_EQ(conv3(g, "c", r2, 2, &c), TSL_OK);
    ASSERT_EQ(tsl_graph_set_output(g, c), TSL_OK);
    EXPECT_EQ(tsl_graph_recomputed(g, r1, nullptr), g->values[a].producer + 1);
    EXPECT_EQ(tsl_graph_recomputed(g, r2, nullptr), g->values[b].producer + 1);
    expect_peak_planes(g, 39, 25, &plan);
    expect_peak_planes(g, 39, 27);
    tsl_graph_destroy(g);
}

// A batch norm's backward sums its statistics over every micro-batch, then makes its input
// gradient micro-batch by micro-batch, each going on through the ops below it. x -> a = conv(x)
// -> r1 = relu(bn1(a)) -> b = conv(r1) | stage 1: r2 = relu(bn2(b)) -> c = conv(r2), planes of
// 8x8 floats per channel (P; x 1 P, a, r1, b 4 P each). Rank 0 holds x, a, r1 and b at the
// backward's start (13 P; r2's gradient received from rank 1 is among the received copies,
// tsl_plan_estimate_received()). One micro-batch: bn2's backward makes b's gradient (17 P),
// conv b's r1's (21 P). Two: b's gradient half (15 P), r1's gradient half (17 P), then the
// halves of b, its gradient and r1 go (11 P), and the other micro-batch likewise: 17 P, 4 P
// less. Walked with bn2's backward making both halves of b's gradient (17 P) before conv b's
// takes one (19 P), 2 P less.
TEST(Plan, BatchNormBackwardTakesItsMicroBatchesOnThroughTheOpsBelow)
{
    int32_t a, r1, b, r2, c, v;
    tsl_graph_t g = two_norms(1, &a, &r1, &b, &r2, &c, &v);
    ASSERT_NE(g, nullptr);
    tsl_plan one, two;
    ASSERT_EQ(tsl_plan_parse("stages=2", &one), TSL_OK);
    ASSERT_EQ(tsl_plan_parse("stages=2,micro=2", &two), TSL_OK);
    for (int64_t batch : {8, 16}) {
        const double plane = 8 * 8 * 4 * (double)batch;
        int64_t peak1[2], peak2[2];
        ASSERT_EQ(tsl_plan_estimate_peak(&one, g, 2, 1, batch, 2, peak1), TSL_OK)
            << tsl_last_error();
        ASSERT_EQ(tsl_plan_estimate_peak(&two, g, 2, 1, batch, 2, peak2), TSL_OK)
            << tsl_last_error();
        EXPECT_EQ((double)(peak1[0] - peak2[0]), 4 * plane) << batch;
    }
    tsl_graph_destroy(g);
}

// Each sample tile's task makes a partial gradient of a layer's weight: the first tile's in the
// gradient itself, the others' in temporaries that a tree adds up as they come (0 + 1, 2 + 3,
// then 0 + 2, ...). Micro-batches in turn on one rank: with 2 the second's partial (1 weight
// more at once), with 4 the third's waiting for the fourth's (2), with 8 the fifth's (holding
// 4 + 5), the seventh's and the eighth's (3). x (1024 features) -> fc (256, no bias): a weight
// of 1 MiB beside 96 KiB of values and gradients in all, whose micro-batches' slices go as the
// passes go.
TEST(Plan, PartialWeightGradientsOfMicroBatchesWaitInATree)
{
    tsl_graph_t g = nullptr;
    const int64_t features = 1024;
    int32_t x, y;
    ASSERT_EQ(tsl_graph_create(&g), TSL_OK);
    ASSERT_EQ(tsl_graph_input(g, 1, &features, &x), TSL_OK);
    ASSERT_EQ(tsl_graph_linear(g, "fc", x, 256, 0, &y), TSL_OK);
    ASSERT_EQ(tsl_graph_set_output(g, y), TSL_OK);
    const double weight = 1024.0 * 256 * 4;
    int64_t base = 0;
    ASSERT_EQ(tsl_plan_estimate_peak(nullptr, g, 1, 1, 16, 0, &base), TSL_OK) << tsl_last_error();
    const struct {
        const char *plan;
        double weights;
    } cases[] = {{"micro=2", 1}, {"micro=4", 2}, {"micro=8", 3}};
    for (const auto &c : cases) {
        tsl_plan p;
        ASSERT_EQ(tsl_plan_parse(c.plan, &p), TSL_OK);
        int64_t peak = 0;
        ASSERT_EQ(tsl_plan_estimate_peak(&p, g, 1, 1, 16, 0, &peak), TSL_OK) << tsl_last_error();
        EXPECT_NEAR((double)(peak - base) / weight, c.weights, 0.1) << c.plan;
    }
    tsl_graph_destroy(g);
}

// The forward with micro-batches, as the backward: micro-batch 0 through a stretch (here the
// whole network, no batch norm) before micro-batch 1. x (1 channel) -> a = conv(x) (8) ->
// p = maxpool(a) (8 channels of 4x4) -> c = conv(p) (2 of 4x4, the output), planes of 8x8 floats
// (P): x 1, a 8, p 2, its indices 0.5, c 0.5. a goes after the pooling (whose backward reads the
// indices, not a). One micro-batch: the forward peaks at x, a, p and the indices (11.5 P); the
// backward at a's gradient (8 P) beside x, p, the indices, c and p's gradient (2 P; c's went
// with conv c's backward): 14 P. Two: the forward holds one half of a at a time (7.75 P); the
// backward c's gradient half (the loss wrote it whole), p's gradient half and a's (4 P): 9.25 P.
// Four: 6.875 P. With the forward's outputs made whole, both would peak at the forward's 11.5 P.
TEST(Plan, ForwardTakesMicroBatchesInTurn)
{
    int32_t a, p, c;
    tsl_graph_t g = input_and_conv(8, &a);
    ASSERT_NE(g, nullptr);
    tsl_pool_params pp;
    ASSERT_EQ(tsl_pool_params_init(&pp, TSL_POOL_MAX, 2, 2), TSL_OK);
    ASSERT_EQ(tsl_graph_pool(g, a, &pp, &p), TSL_OK);
    ASSERT_EQ(conv3(g, "c", p, 2, &c), TSL_OK);
    ASSERT_EQ(tsl_graph_set_output(g, c), TSL_OK);
    const double plane = 8 * 8 * 4 * 8; // (batch 8)
    auto peak = [&](const char *text) {
        tsl_plan plan;
        int64_t bytes = -1;
        EXPECT_EQ(tsl_plan_parse(text, &plan), TSL_OK);
        EXPECT_EQ(tsl_plan_estimate_peak(&plan, g, 1, 1, 8, 0, &bytes), TSL_OK) << tsl_last_error();
        return (double)bytes;
    };
    const double one = peak("micro=1");
    EXPECT_DOUBLE_EQ((one - peak("micro=2")) / plane, 14 - 9.25);
    EXPECT_DOUBLE_EQ((one - peak("micro=4")) / plane, 14 - 6.875);
    tsl_graph_destroy(g);
}

// Max pooling keeps u8 indices for its backward instead of its input; average pooling's
// backward reads neither (each window's share of dy).
// Hand count for x -> a = conv(x) (4 channels) -> p = maxpool(a) (3x3, stride 1, padding 1:
// 4 channels) -> d = conv(p) (2 channels, output), planes of 8x8 floats (P; the indices of p
// take 1 P): values x 1, a and p 4 P with their gradients, d 2 P with its gradient, the
// indices 1 P: 22 P. Forward: x, a, p and its indices (10 P), a released (6), d (8).
// Backward: d's gradient (10), p's (14), d's gradient gone (12), a's gradient (16), p, its
// gradient and indices gone (7): 16 P. Average pooling keeps no indices: 21 P of values, the
// forward ends at 7 P, the backward peaks at 15 P.
TEST(Plan, MaxPoolingKeepsIndicesInsteadOfItsInput)
{
    for (tsl_pool_kind kind : {TSL_POOL_MAX, TSL_POOL_AVG}) {
        int32_t a, p, d;
        tsl_graph_t g = input_and_conv(4, &a);
        ASSERT_NE(g, nullptr);
        tsl_pool_params pp;
        ASSERT_EQ(tsl_pool_params_init(&pp, kind, 2, 3), TSL_OK);
        pp.stride[0] = pp.stride[1] = 1;
        pp.padding[0] = pp.padding[1] = 1;
        ASSERT_EQ(tsl_graph_pool(g, a, &pp, &p), TSL_OK);
        ASSERT_EQ(conv3(g, "d", p, 2, &d), TSL_OK);
        ASSERT_EQ(tsl_graph_set_output(g, d), TSL_OK);
        const tsl_graph_op &pool = g->ops[g->values[p].producer];
        EXPECT_EQ(tsl_graph_pool_index_bytes(&pool), kind == TSL_POOL_MAX ? 1 : 0);
        EXPECT_FALSE(tsl_graph_op_reads_input_backward(&pool));
        EXPECT_FALSE(tsl_graph_value_read_backward(g, a, nullptr, nullptr));
        if (kind == TSL_POOL_MAX)
            expect_peak_planes(g, 22, 16);
        else
            expect_peak_planes(g, 21, 15);
        tsl_graph_destroy(g);
    }
    // Kernels of more than 255 positions keep i32 indices.
    tsl_graph_op big{};
    big.kind = TSL_OP_POOL;
    ASSERT_EQ(tsl_pool_params_init(&big.pool, TSL_POOL_MAX, 3, 7), TSL_OK);
    EXPECT_EQ(tsl_graph_pool_index_bytes(&big), 4);
}

TEST(Plan, StagesByHandAreKeptAndInherited)
{
    int64_t sample[3] = {1, 16, 16};
    tsl_graph_t g = nullptr;
    ASSERT_EQ(tsl_zoo_graph("cnn2d", 3, sample, 3, &g), TSL_OK);
    int32_t nops = tsl_graph_op_count(g), mid = nops / 2, out = -1;
    ASSERT_EQ(tsl_graph_op_info(g, mid, nullptr, nullptr, &out), TSL_OK);
    EXPECT_EQ(tsl_graph_stage(g, out), -1);
    ASSERT_EQ(tsl_graph_set_stage(g, out, 2), TSL_OK);
    EXPECT_EQ(tsl_graph_stage(g, out), 2);
    tsl_plan p;
    ASSERT_EQ(tsl_plan_parse("stages=3", &p), TSL_OK);
    std::vector<int32_t> stage((size_t)nops, -1);
    ASSERT_EQ(tsl_plan_stages(&p, g, 4, 1, stage.data()), TSL_OK);
    for (int32_t o = 0; o < nops; o++)
        EXPECT_EQ(stage[(size_t)o], o < mid ? 0 : 2) << o;
    ASSERT_EQ(tsl_plan_parse("stages=2", &p), TSL_OK);
    EXPECT_EQ(tsl_plan_stages(&p, g, 4, 1, stage.data()), TSL_ERR_INVALID_ARG);
    EXPECT_NE(std::string(tsl_last_error()).find("is on stage 2"), std::string::npos);
    EXPECT_EQ(tsl_graph_set_stage(g, out, -2), TSL_ERR_INVALID_ARG);
    EXPECT_EQ(tsl_graph_set_stage(g, 9999, 0), TSL_ERR_INVALID_ARG);
    ASSERT_EQ(tsl_graph_set_stage(g, out, -1), TSL_OK);
    ASSERT_EQ(tsl_plan_stages(&p, g, 4, 1, stage.data()), TSL_OK); // computed again
    EXPECT_EQ(stage[(size_t)nops - 1], 1);
    tsl_graph_destroy(g);
}

// The op table has a row for every kind and every activation: names of their own, and every
// fact filled in; an activation is found by its name.
TEST(OpTable, EveryKindHasItsFacts)
{
    std::map<std::string, int> names;
    for (int k = 0; k < TSL_OP_KIND_COUNT; k++) {
        const tsl_op_info *info = tsl_op_info_of((tsl_op_kind)k);
        ASSERT_NE(info, nullptr) << k;
        ASSERT_NE(info->name, nullptr) << k;
        EXPECT_STREQ(tsl_op_kind_name((tsl_op_kind)k), info->name);
        EXPECT_TRUE(info->infer && info->flops && info->reads_input_backward) << info->name;
        EXPECT_EQ(names[info->name]++, 0) << info->name << " twice";
    }
    EXPECT_EQ(tsl_op_info_of((tsl_op_kind)TSL_OP_KIND_COUNT), nullptr);
    EXPECT_STREQ(tsl_op_kind_name((tsl_op_kind)TSL_OP_KIND_COUNT), "invalid");
    names.clear();
    for (int k = 0; k < TSL_ACTIVATION_COUNT; k++) {
        const tsl_activation_info *info = tsl_activation_info_of((tsl_activation)k);
        ASSERT_NE(info, nullptr) << k;
        EXPECT_EQ(names[info->name]++, 0) << info->name << " twice";
        EXPECT_GT(info->forward_flops, 0) << info->name;
        EXPECT_GT(info->backward_flops, 0) << info->name;
        tsl_activation found = (tsl_activation)-1;
        EXPECT_EQ(tsl_activation_find(info->name, &found), 0) << info->name;
        EXPECT_EQ(found, (tsl_activation)k) << info->name;
    }
    tsl_activation none;
    EXPECT_EQ(tsl_activation_find("no_such_activation", &none), -1);
    EXPECT_EQ(tsl_activation_info_of((tsl_activation)TSL_ACTIVATION_COUNT), nullptr);
}

// Every activation's flops in a graph come from its row: the output's elements times the
// row's forward flops.
TEST(OpTable, ActivationFlopsComeFromTheTable)
{
    for (int k = 0; k < TSL_ACTIVATION_COUNT; k++) {
        tsl_graph_t g = nullptr;
        ASSERT_EQ(tsl_graph_create(&g), TSL_OK);
        int64_t sample[3] = {3, 5, 7};
        int32_t v;
        ASSERT_EQ(tsl_graph_input(g, 3, sample, &v), TSL_OK);
        ASSERT_EQ(tsl_graph_activation(g, v, (tsl_activation)k, 0.5, &v), TSL_OK);
        double flops = 0;
        ASSERT_EQ(tsl_graph_op_flops(g, 1, 4, &flops), TSL_OK);
        EXPECT_EQ(flops, 4 * 105 * tsl_activation_info_of((tsl_activation)k)->forward_flops) << k;
        tsl_graph_destroy(g);
    }
}

namespace
{

// A residual step u + h F(u) with F = conv-tanh-conv of `channels` (conv names prefix.a, .b).
int32_t ode_step(tsl_graph_t g, const char *prefix, int32_t u, int64_t channels, double h)
{
    tsl_conv_params p;
    tsl_conv_params_init(&p, 2);
    p.padding[0] = p.padding[1] = 1;
    const int64_t k[3] = {3, 3, 3};
    int32_t f = -1, out = -1;
    std::string a = std::string(prefix) + ".a", b = std::string(prefix) + ".b";
    EXPECT_EQ(tsl_graph_conv(g, a.c_str(), u, channels, k, &p, 0, 1, &f), TSL_OK);
    EXPECT_EQ(tsl_graph_activation(g, f, TSL_ACT_TANH, 0, &f), TSL_OK);
    EXPECT_EQ(tsl_graph_conv(g, b.c_str(), f, channels, k, &p, 0, 1, &f), TSL_OK);
    EXPECT_EQ(tsl_graph_add_scaled(g, f, u, h, &out), TSL_OK) << tsl_last_error();
    return out;
}

std::vector<tsl_ode_segment> segments_of(tsl_graph_t g)
{
    int32_t n = -1;
    EXPECT_EQ(tsl_graph_ode_segments(g, 0, nullptr, &n), TSL_OK);
    std::vector<tsl_ode_segment> s((size_t)n);
    int32_t again = -1;
    EXPECT_EQ(tsl_graph_ode_segments(g, n, s.data(), &again), TSL_OK);
    EXPECT_EQ(again, n);
    return s;
}

} // namespace

// ODE segments: the zoo's odenetN is one segment of N steps of size 1/N (up to 4096 steps);
// classic residual blocks (a ReLU after the add) are segments of one step, projection blocks
// none; runs split where h, the channels or F's structure change, where a pooling comes
// between, or where a value of a step is read outside it.
TEST(Graph, OdeSegmentsAreMaximalRunsOfResidualSteps)
{
    const int64_t sample[3] = {1, 12, 12};
    for (int n : {1, 7, 64, 4096}) {
        tsl_graph_t g = nullptr;
        std::string name = "odenet" + std::to_string(n);
        ASSERT_EQ(tsl_zoo_graph(name.c_str(), 3, sample, 10, &g), TSL_OK) << tsl_last_error();
        auto s = segments_of(g);
        ASSERT_EQ(s.size(), 1u) << name;
        EXPECT_EQ(s[0].steps, n);
        EXPECT_EQ(s[0].h, 1.0 / n);
        EXPECT_EQ(s[0].ops_per_step, 5); // conv, bn, relu, conv, add
        EXPECT_EQ(s[0].last_op - s[0].first_op + 1, 5 * n);
        const char *op_name = nullptr;
        tsl_op_kind kind;
        ASSERT_EQ(tsl_graph_op_info(g, s[0].first_op, &kind, &op_name, nullptr), TSL_OK);
        EXPECT_STREQ(op_name, "steps.0.conv1");
        ASSERT_EQ(tsl_graph_op_info(g, s[0].last_op, &kind, &op_name, nullptr), TSL_OK);
        EXPECT_EQ(kind, TSL_OP_ADD);
        EXPECT_EQ(g->ops[s[0].last_op].output, s[0].output);
        tsl_graph_destroy(g);
    }
    tsl_graph_t g = nullptr;
    EXPECT_NE(tsl_zoo_graph("odenet4097", 3, sample, 10, &g), TSL_OK);
    EXPECT_NE(tsl_zoo_graph("odenet0", 3, sample, 10, &g), TSL_OK);
    EXPECT_NE(tsl_zoo_graph("odenet", 3, sample, 10, &g), TSL_OK);
    EXPECT_NE(tsl_zoo_graph("odenet012", 3, sample, 10, &g), TSL_OK);

    // resnet2: the identity blocks layer1.0, layer1.1, layer2.1 and layer3.1 (a ReLU after each
    // add) are one step each; the projection blocks layer2.0 and layer3.0 are not steps.
    ASSERT_EQ(tsl_zoo_graph("resnet2", 3, sample, 10, &g), TSL_OK);
    auto r = segments_of(g);
    ASSERT_EQ(r.size(), 4u);
    for (auto &seg : r)
        EXPECT_EQ(seg.steps, 1);
    tsl_graph_destroy(g);

    // Hand-built: 3 steps of h 0.5, 2 of h 0.25 (a new run), a pooling, 2 steps of 16
    // channels, then 2 steps where the first step's tanh output is also read after the run.
    ASSERT_EQ(tsl_graph_create(&g), TSL_OK);
    int32_t x = -1;
    ASSERT_EQ(tsl_graph_input(g, 3, sample, &x), TSL_OK);
    tsl_conv_params p;
    tsl_conv_params_init(&p, 2);
    p.padding[0] = p.padding[1] = 1;
    const int64_t k[3] = {3, 3, 3};
    int32_t u = -1;
    ASSERT_EQ(tsl_graph_conv(g, "stem", x, 8, k, &p, 0, 1, &u), TSL_OK);
    for (int i = 0; i < 3; i++)
        u = ode_step(g, ("a" + std::to_string(i)).c_str(), u, 8, 0.5);
    for (int i = 0; i < 2; i++)
        u = ode_step(g, ("b" + std::to_string(i)).c_str(), u, 8, 0.25);
    tsl_pool_params pool;
    tsl_pool_params_init(&pool, TSL_POOL_MAX, 2, 2);
    ASSERT_EQ(tsl_graph_pool(g, u, &pool, &u), TSL_OK);
    for (int i = 0; i < 2; i++)
        u = ode_step(g, ("c" + std::to_string(i)).c_str(), u, 8, 0.25);
    ASSERT_EQ(tsl_graph_conv(g, "widen", u, 16, k, &p, 0, 1, &u), TSL_OK);
    int32_t leak = -1;
    int32_t first = tsl_graph_op_count(g);
    u = ode_step(g, "d0", u, 16, 0.25);
    leak = g->ops[first + 1].output; // d0's tanh
    u = ode_step(g, "d1", u, 16, 0.25);
    int32_t parts[2] = {u, leak}, cat = -1;
    ASSERT_EQ(tsl_graph_concat(g, 2, parts, &cat), TSL_OK);
    auto h = segments_of(g);
    ASSERT_EQ(h.size(), 4u);
    EXPECT_EQ(h[0].steps, 3);
    EXPECT_EQ(h[0].h, 0.5);
    EXPECT_EQ(h[1].steps, 2);
    EXPECT_EQ(h[1].h, 0.25);
    EXPECT_EQ(h[2].steps, 2); // after the pooling: the same F, a new run
    EXPECT_EQ(h[3].steps, 1); // d1 only: d0's tanh is read by the concatenation
    int32_t few = -1;
    tsl_ode_segment one;
    EXPECT_EQ(tsl_graph_ode_segments(g, 1, &one, &few), TSL_OK);
    EXPECT_EQ(few, 4);
    EXPECT_EQ(one.steps, 3);
    EXPECT_NE(tsl_graph_ode_segments(g, 1, nullptr, &few), TSL_OK);
    EXPECT_NE(tsl_graph_add_scaled(g, u, u, 0.0, &x), TSL_OK);
    EXPECT_NE(tsl_graph_add_scaled(g, u, u, INFINITY, &x), TSL_OK);
    tsl_graph_destroy(g);
}

// n-ary add: 2 to 8 values of one shape, a clear error otherwise, and a model file's round trip.
TEST(Graph, AddOfSeveralValues)
{
    tsl_graph_t g = nullptr;
    ASSERT_EQ(tsl_graph_create(&g), TSL_OK);
    const int64_t sample[3] = {2, 6, 6};
    int32_t x = -1, r = -1, t = -1, sum = -1, bad = -1;
    ASSERT_EQ(tsl_graph_input(g, 3, sample, &x), TSL_OK);
    ASSERT_EQ(tsl_graph_activation(g, x, TSL_ACT_RELU, 0, &r), TSL_OK);
    ASSERT_EQ(tsl_graph_activation(g, x, TSL_ACT_TANH, 0, &t), TSL_OK);
    const int32_t three[3] = {x, r, t};
    ASSERT_EQ(tsl_graph_add_n(g, 3, three, &sum), TSL_OK) << tsl_last_error();
    EXPECT_EQ(dims_of(g, sum), (std::vector<int64_t>{2, 6, 6}));
    EXPECT_EQ(g->ops[g->values[sum].producer].ninputs, 3);
    EXPECT_EQ(g->ops[g->values[sum].producer].h, 1.0);
    int32_t ops = tsl_graph_op_count(g);
    const int32_t nine[9] = {x, x, x, x, x, x, x, x, x};
    EXPECT_EQ(tsl_graph_add_n(g, 9, nine, &bad), TSL_ERR_INVALID_ARG);
    EXPECT_EQ(tsl_graph_add_n(g, 1, nine, &bad), TSL_ERR_INVALID_ARG);
    tsl_pool_params pool;
    tsl_pool_params_init(&pool, TSL_POOL_MAX, 2, 2);
    int32_t small = -1;
    ASSERT_EQ(tsl_graph_pool(g, x, &pool, &small), TSL_OK);
    ops = tsl_graph_op_count(g);
    const int32_t mixed[3] = {x, r, small};
    EXPECT_EQ(tsl_graph_add_n(g, 3, mixed, &bad), TSL_ERR_SHAPE);
    EXPECT_EQ(tsl_graph_op_count(g), ops); // nothing added by the failed calls
    tsl_graph_destroy(g);
}

// data=2,filters=2 on 4 ranks: a convolution's weight tile f lives on filter group f's first
// rank (f); the group's other rank (2 + f) reads it in the forward and keeps StarPU-MPI's copy
// through the backward. A convolution of 64 channels to 64 (3x3, no bias) pooled into the output
// (64 classes, whole along channels on group 0: ranks 0 and 2), no other parameter: ranks r and
// 2 + r hold the same activations, and the owner the tile's value and gradient against the
// other's one copy.
TEST(Plan, AFilterGroupsOtherRanksHoldItsWeightTile)
{
    int64_t k[2] = {3, 3};
    int32_t x, c, pl, f;
    tsl_conv_params cp;
    tsl_graph_t g = graph_on_8x8(64, &x, &cp);
    tsl_pool_params pp;
    tsl_pool_params_init(&pp, TSL_POOL_AVG, 2, 8);
    ASSERT_EQ(tsl_graph_conv(g, "c", x, 64, k, &cp, 0, 0, &c), TSL_OK) << tsl_last_error();
    ASSERT_EQ(tsl_graph_pool(g, c, &pp, &pl), TSL_OK) << tsl_last_error();
    ASSERT_EQ(tsl_graph_flatten(g, pl, &f), TSL_OK);
    ASSERT_EQ(tsl_graph_set_output(g, f), TSL_OK);
    tsl_plan p;
    ASSERT_EQ(tsl_plan_parse("data=2,filters=2", &p), TSL_OK);
    int64_t all[4];
    ASSERT_EQ(tsl_plan_estimate(&p, g, 4, 1, 4, 0, all), TSL_OK) << tsl_last_error();
    const int64_t tile = 4 * 32 * 64 * 9;
    EXPECT_EQ(all[0] - all[2], tile);
    EXPECT_EQ(all[1] - all[3], tile);
    tsl_graph_destroy(g);
}

// A weight sharded over the ranks (data=4, 4,096 elements and more) adds to every rank's peak,
// in its backward, its partial gradient of the whole weight and the three quarters of it the rank
// copies out to send; and from the backward's start on, for every sharded weight, the three
// quarters of a shard the rank receives (StarPU-MPI allocates them as the backward is submitted).
// Two 1x1 convolutions of 64 channels to 64 (4,096 weights each) on 1x1 samples, whose
// activations are a few hundred bytes: at the second's backward, the first in the backward, the
// peak is that far above the estimate of everything at once without those (tsl_plan_estimate()).
TEST(Plan, ShardedWeightsPeakWithTheirReduction)
{
    tsl_graph_t g = nullptr;
    ASSERT_EQ(tsl_graph_create(&g), TSL_OK);
    int64_t sample[3] = {64, 1, 1}, k[2] = {1, 1};
    int32_t x, c1, c2, f, y;
    tsl_conv_params cp;
    tsl_conv_params_init(&cp, 2);
    ASSERT_EQ(tsl_graph_input(g, 3, sample, &x), TSL_OK);
    ASSERT_EQ(tsl_graph_conv(g, "wide1", x, 64, k, &cp, 0, 0, &c1), TSL_OK) << tsl_last_error();
    ASSERT_EQ(tsl_graph_conv(g, "wide2", c1, 64, k, &cp, 0, 0, &c2), TSL_OK) << tsl_last_error();
    ASSERT_EQ(tsl_graph_flatten(g, c2, &f), TSL_OK);
    ASSERT_EQ(tsl_graph_linear(g, "fc", f, 2, 1, &y), TSL_OK);
    ASSERT_EQ(tsl_graph_set_output(g, y), TSL_OK);
    tsl_plan p;
    ASSERT_EQ(tsl_plan_parse("data=4", &p), TSL_OK);
    int64_t peak[4], all[4];
    ASSERT_EQ(tsl_plan_estimate_peak(&p, g, 4, 1, 4, 2, peak), TSL_OK) << tsl_last_error();
    ASSERT_EQ(tsl_plan_estimate(&p, g, 4, 1, 4, 2, all), TSL_OK) << tsl_last_error();
    const int64_t weight = 4 * 4096, quarters = weight / 4 * 3;
    const int64_t reduction = weight + quarters + 2 * quarters; /* partial, sent, 2 received */
    for (int r = 0; r < 4; r++) {
        EXPECT_GE(peak[r] - all[r], reduction - 2048) << "rank " << r;
        EXPECT_LE(peak[r] - all[r], reduction) << "rank " << r;
    }
    tsl_graph_destroy(g);
}

// The difference and similarity losses send gradients into both values they read: the value
// `against` names gets its gradient at the loss, live through the backward, where an MSE term
// against it takes it as a constant target (no gradient). A private branch (32 channels at
// 16 x 16, 4 samples: 128 KiB) read only by the term adds at least its size to the peak.
TEST(Plan, PeakCountsTheGradientsOfBothValuesOfADifference)
{
    auto peak_with = [](tsl_model_loss_kind kind) {
        tsl_graph_t g = nullptr;
        EXPECT_EQ(tsl_graph_create(&g), TSL_OK);
        int64_t sample[3] = {2, 16, 16}, k[2] = {3, 3};
        int32_t x, s, p, f, y;
        tsl_conv_params cp;
        tsl_conv_params_init(&cp, 2);
        cp.padding[0] = cp.padding[1] = 1;
        EXPECT_EQ(tsl_graph_input(g, 3, sample, &x), TSL_OK);
        EXPECT_EQ(tsl_graph_conv(g, "shared", x, 32, k, &cp, 0, 1, &s), TSL_OK);
        EXPECT_EQ(tsl_graph_conv(g, "private", x, 32, k, &cp, 0, 1, &p), TSL_OK);
        EXPECT_EQ(tsl_graph_flatten(g, s, &f), TSL_OK);
        EXPECT_EQ(tsl_graph_linear(g, "fc", f, 2, 1, &y), TSL_OK);
        EXPECT_EQ(tsl_graph_set_output(g, y), TSL_OK);
        const tsl_loss_term t[2] = {{TSL_MODEL_LOSS_CROSS_ENTROPY, 1.0, 0, 0},
                                    {kind, 0.1, s + 1, p + 1}};
        EXPECT_EQ(tsl_graph_set_loss(g, 2, t), TSL_OK) << tsl_last_error();
        int64_t peak = 0;
        EXPECT_EQ(tsl_plan_estimate_peak(nullptr, g, 1, 1, 4, 2, &peak), TSL_OK)
            << tsl_last_error();
        tsl_graph_destroy(g);
        return peak;
    };
    const int64_t branch = 4 * 32 * 16 * 16 * 4;
    const int64_t mse = peak_with(TSL_MODEL_LOSS_MSE);
    EXPECT_GE(peak_with(TSL_MODEL_LOSS_DIFFERENCE), mse + branch);
    EXPECT_GE(peak_with(TSL_MODEL_LOSS_SIMILARITY), mse + branch);
}

// Inputs after the first: under domains= each input (no slice reading it) starts a domain; under
// stages= an input sits on the first stage that reads it, not on the stage of the op before it.
TEST(Plan, FurtherInputsSitWhereTheyAreRead)
{
    tsl_graph_t g = nullptr;
    ASSERT_EQ(tsl_graph_create(&g), TSL_OK);
    const int64_t image[3] = {2, 8, 8}, k[2] = {3, 3};
    tsl_conv_params cp;
    tsl_conv_params_init(&cp, 2);
    cp.padding[0] = cp.padding[1] = 1;
    int32_t a, b, b1, y;
    ASSERT_EQ(tsl_graph_add_input(g, "a", 3, image, &a), TSL_OK);
    ASSERT_EQ(tsl_graph_conv(g, "a1", a, 4, k, &cp, 0, 1, &a), TSL_OK);
    ASSERT_EQ(tsl_graph_conv(g, "a2", a, 4, k, &cp, 0, 1, &a), TSL_OK);
    ASSERT_EQ(tsl_graph_add_input(g, "b", 3, image, &b), TSL_OK);
    ASSERT_EQ(tsl_graph_conv(g, "b1", b, 4, k, &cp, 0, 1, &b1), TSL_OK);
    ASSERT_EQ(tsl_graph_conv(g, "b2", b1, 4, k, &cp, 0, 1, &b), TSL_OK);
    ASSERT_EQ(tsl_graph_add(g, a, b, &y), TSL_OK);
    ASSERT_EQ(tsl_graph_flatten(g, y, &y), TSL_OK);
    ASSERT_EQ(tsl_graph_linear(g, "fc", y, 3, 1, &y), TSL_OK);
    ASSERT_EQ(tsl_graph_set_output(g, y), TSL_OK);
    const int32_t nops = tsl_graph_op_count(g);
    ASSERT_EQ(nops, 9);
    std::vector<int32_t> stage((size_t)nops, -1);
    tsl_plan p;
    ASSERT_EQ(tsl_plan_parse("domains=2", &p), TSL_OK);
    ASSERT_EQ(tsl_plan_stages(&p, g, 4, 1, stage.data()), TSL_OK) << tsl_last_error();
    // a, a1, a2 | b, b1, b2 | add (reads both domains), flatten, fc: domain 0
    EXPECT_EQ(stage, (std::vector<int32_t>{0, 0, 0, 1, 1, 1, 0, 0, 0}));
    ASSERT_EQ(tsl_plan_parse("domains=3", &p), TSL_OK);
    EXPECT_EQ(tsl_plan_stages(&p, g, 4, 1, stage.data()), TSL_ERR_INVALID_ARG);
    EXPECT_NE(std::strstr(tsl_last_error(), "has 2 domains"), nullptr) << tsl_last_error();
    // stages=3 by layers: the runs a1 a2 | b1 b2 add | flatten fc (and the inputs where read)
    ASSERT_EQ(tsl_plan_parse("stages=3,balance=layers", &p), TSL_OK);
    ASSERT_EQ(tsl_plan_stages(&p, g, 4, 1, stage.data()), TSL_OK) << tsl_last_error();
    EXPECT_EQ(stage[3], stage[4]) << "input b on the stage of b1";
    EXPECT_EQ(stage[0], 0);
    EXPECT_GT(stage[4], 0);
    // by hand: input b sits with its reader b1, not with a2 before it
    ASSERT_EQ(tsl_graph_set_stage(g, a, 1), TSL_OK);  // a2 on stage 1
    ASSERT_EQ(tsl_graph_set_stage(g, b1, 0), TSL_OK); // b1 (and b2, add) on stage 0
    ASSERT_EQ(tsl_graph_set_stage(g, y, 1), TSL_OK);  // fc on stage 1
    ASSERT_EQ(tsl_plan_parse("stages=2", &p), TSL_OK);
    ASSERT_EQ(tsl_plan_stages(&p, g, 4, 1, stage.data()), TSL_OK) << tsl_last_error();
    EXPECT_EQ(stage, (std::vector<int32_t>{0, 0, 1, 0, 0, 0, 0, 0, 1}));
    tsl_graph_destroy(g);
}

// x (4 channels of 32 x 32) -> two slices of channels [0, cut) and [cut, 4) -> global average
// pooling -> flatten -> linear (4) each, their sum -> linear (3).
static tsl_graph_t two_slice_graph(int64_t cut)
{
    const int64_t sample[3] = {4, 32, 32};
    tsl_pool_params gp;
    tsl_pool_params_init(&gp, TSL_POOL_AVG, 2, 32);
    tsl_graph_t g = nullptr;
    int32_t x, v, codes[2];
    bool ok = tsl_graph_create(&g) == TSL_OK && tsl_graph_input(g, 3, sample, &x) == TSL_OK;
    for (int d = 0; d < 2 && ok; d++) {
        const int64_t lo[3] = {d ? cut : 0, 0, 0}, hi[3] = {d ? 4 : cut, 32, 32};
        ok = tsl_graph_slice(g, x, lo, hi, &v) == TSL_OK &&
             tsl_graph_pool(g, v, &gp, &v) == TSL_OK && tsl_graph_flatten(g, v, &v) == TSL_OK &&
             tsl_graph_linear(g, d ? "code1" : "code0", v, 4, 1, &codes[d]) == TSL_OK;
    }
    ok = ok && tsl_graph_add(g, codes[0], codes[1], &v) == TSL_OK &&
         tsl_graph_linear(g, "head", v, 3, 1, &v) == TSL_OK && tsl_graph_set_output(g, v) == TSL_OK;
    if (!ok)
        tsl_graph_destroy(g);
    return ok ? g : nullptr;
}

// Under domains= the input is cut by channels onto the domain groups only where its slices are
// equal channel parts of it: the estimate then gives both ranks half of it; with unequal slices,
// or with filters= inside the groups, the input stays on group 0.
TEST(Plan, DomainsCutTheInputWhereTheSlicesAreEqualChannelParts)
{
    const int64_t batch = 4, input_bytes = 4 * batch * 4 * 32 * 32;
    struct Case {
        int64_t cut;
        const char *plan;
        int32_t ranks;
        bool split;
    } cases[] = {{2, "domains=2", 2, true},
                 {3, "domains=2", 2, false},
                 {2, "domains=2,data=2", 4, true},
                 {2, "domains=2,filters=2", 4, false}};
    for (const Case &c : cases) {
        SCOPED_TRACE(std::string(c.plan) + ", slices at " + std::to_string(c.cut));
        tsl_graph_t g = two_slice_graph(c.cut);
        ASSERT_NE(g, nullptr) << tsl_last_error();
        tsl_plan p;
        ASSERT_EQ(tsl_plan_parse(c.plan, &p), TSL_OK);
        std::vector<int64_t> bytes((size_t)c.ranks);
        ASSERT_EQ(tsl_plan_estimate(&p, g, c.ranks, 1, batch, 0, bytes.data()), TSL_OK)
            << tsl_last_error();
        // group 0's first rank against group 1's first: the input (and its read-ahead spare) on
        // group 0 makes the difference
        int64_t diff = bytes[0] - bytes[(size_t)c.ranks / 2];
        if (c.split)
            EXPECT_LT(std::llabs(diff), input_bytes / 8) << bytes[0] << " " << bytes[1];
        else
            EXPECT_GT(diff, input_bytes / 4) << bytes[0] << " " << bytes[1];
        tsl_graph_destroy(g);
    }
}

// domains=N (the zoo's dsn: one domain per input channel): each op on the group of the slice
// of the input it comes from, domain k of K on group k N / K, the classifier (domain 0's code)
// on group 0; the plan text round-trips; fewer domains than groups, domains= with stages=, and
// a dsn of 1 or 11 channels are errors.
TEST(Plan, DomainsPlaceEachDomainOnItsRankGroup)
{
    const int64_t sample[3] = {4, 8, 8};
    tsl_graph_t g = nullptr;
    ASSERT_EQ(tsl_zoo_graph("dsn", 3, sample, 3, &g), TSL_OK) << tsl_last_error();
    tsl_plan p;
    ASSERT_EQ(tsl_plan_parse("domains=2,space=2", &p), TSL_OK) << tsl_last_error();
    EXPECT_EQ(p.domains, 2);
    EXPECT_EQ(p.stages, 2);
    EXPECT_EQ(tsl_plan_ranks(&p), 4);
    char text[128];
    ASSERT_EQ(tsl_plan_format(&p, text, sizeof text), TSL_OK);
    EXPECT_STREQ(text, "space=2,domains=2");
    const int32_t nops = tsl_graph_op_count(g);
    std::vector<int32_t> stage((size_t)nops, -1);
    ASSERT_EQ(tsl_plan_stages(&p, g, 4, 1, stage.data()), TSL_OK) << tsl_last_error();
    int slices = 0, named = 0;
    for (int32_t o = 0; o < nops; o++) {
        tsl_op_kind kind;
        const char *name = nullptr;
        int32_t out = -1;
        ASSERT_EQ(tsl_graph_op_info(g, o, &kind, &name, &out), TSL_OK);
        std::string n = name ? name : "";
        if (kind == TSL_OP_SLICE)
            EXPECT_EQ(stage[(size_t)o], slices++ * 2 / 4) << "slice " << slices - 1;
        int want = -1; // the domain a named op belongs to
        if (n.rfind("private.", 0) == 0)
            want = n[8] - '0';
        else if (n.size() > 3 && n.compare(n.size() - 3, 2, "_d") == 0)
            want = n.back() - '0';
        else if (n == "shared.conv1" || n == "shared.conv2" || n == "decoder" ||
                 n == "shared.code" || n == "classifier")
            want = 0;
        if (want >= 0) {
            named++;
            EXPECT_EQ(stage[(size_t)o], want * 2 / 4) << n;
        }
        if (out == tsl_graph_output(g))
            EXPECT_EQ(stage[(size_t)o], 0) << "the classifier";
    }
    EXPECT_EQ(slices, 4);
    EXPECT_EQ(named, 4 * 7 + 1); // per domain 2 private convolutions and a code, 3 shared
                                 // convolutions and the shared code; the classifier
    // one group per domain
    ASSERT_EQ(tsl_plan_parse("domains=4", &p), TSL_OK);
    ASSERT_EQ(tsl_plan_stages(&p, g, 4, 1, stage.data()), TSL_OK);
    for (int32_t o = 0; o < nops; o++) {
        const char *name = nullptr;
        tsl_graph_op_info(g, o, nullptr, &name, nullptr);
        std::string n = name ? name : "";
        if (n.rfind("private.", 0) == 0)
            EXPECT_EQ(stage[(size_t)o], n[8] - '0') << n;
    }
    // bad ones
    ASSERT_EQ(tsl_plan_parse("domains=8", &p), TSL_OK);
    EXPECT_EQ(tsl_plan_stages(&p, g, 4, 1, stage.data()), TSL_ERR_INVALID_ARG);
    EXPECT_NE(std::string(tsl_last_error()).find("domains=8, but the network has 4 domains"),
              std::string::npos)
        << tsl_last_error();
    EXPECT_EQ(tsl_plan_parse("domains=2,stages=2", &p), TSL_ERR_INVALID_ARG);
    EXPECT_NE(std::string(tsl_last_error()).find("domains= and stages= both"), std::string::npos)
        << tsl_last_error();
    tsl_graph_t cnn = nullptr;
    ASSERT_EQ(tsl_zoo_graph("cnn", 3, sample, 3, &cnn), TSL_OK);
    ASSERT_EQ(tsl_plan_parse("domains=2", &p), TSL_OK);
    std::vector<int32_t> cstage((size_t)tsl_graph_op_count(cnn));
    EXPECT_EQ(tsl_plan_stages(&p, cnn, 4, 1, cstage.data()), TSL_ERR_INVALID_ARG);
    EXPECT_NE(std::string(tsl_last_error()).find("has 0 domains"), std::string::npos)
        << tsl_last_error();
    tsl_graph_destroy(cnn);
    for (int64_t channels : {1, 11}) {
        const int64_t bad[3] = {channels, 8, 8};
        tsl_graph_t x = nullptr;
        EXPECT_EQ(tsl_zoo_graph("dsn", 3, bad, 3, &x), TSL_ERR_SHAPE) << channels;
        EXPECT_NE(std::string(tsl_last_error()).find("2 to 10 channels"), std::string::npos)
            << tsl_last_error();
        EXPECT_EQ(x, nullptr);
    }
    tsl_graph_destroy(g);
}

// A difference or similarity term brings both values whole to the rank of the first's first
// tile and sends their gradients back: with data=2 on 2 ranks and 4 samples of 8-feature codes,
// rank 1 sends its two sample tiles (2 x 8 floats each) and receives their gradients, 128 bytes
// each way beyond the cross-entropy alone; an MSE term between the same values (on the same
// tiles: nothing moves) adds its sums, one accumulator from rank 1 and one back, as the
// cross-entropy's own sums do.
TEST(Plan, TrafficCountsTheValuesATwoValueLossGathers)
{
    auto losses = [](int32_t nterms, tsl_model_loss_kind kind, int64_t *sent) {
        tsl_graph_t g = nullptr;
        EXPECT_EQ(tsl_graph_create(&g), TSL_OK);
        int64_t sample[1] = {6};
        int32_t x, a, b, y;
        EXPECT_EQ(tsl_graph_input(g, 1, sample, &x), TSL_OK);
        EXPECT_EQ(tsl_graph_linear(g, "a", x, 8, 1, &a), TSL_OK);
        EXPECT_EQ(tsl_graph_linear(g, "b", x, 8, 1, &b), TSL_OK);
        EXPECT_EQ(tsl_graph_linear(g, "fc", a, 3, 1, &y), TSL_OK);
        EXPECT_EQ(tsl_graph_set_output(g, y), TSL_OK);
        const tsl_loss_term t[2] = {{TSL_MODEL_LOSS_CROSS_ENTROPY, 1.0, 0, 0},
                                    {kind, 0.1, a + 1, b + 1}};
        EXPECT_EQ(tsl_graph_set_loss(g, nterms, t), TSL_OK) << tsl_last_error();
        tsl_plan p;
        EXPECT_EQ(tsl_plan_parse("data=2", &p), TSL_OK);
        int64_t all[2 * TSL_TRAFFIC_TERMS];
        EXPECT_EQ(tsl_plan_estimate_traffic(&p, g, 2, 1, 4, 1, all), TSL_OK) << tsl_last_error();
        sent[0] = all[TSL_TRAFFIC_LOSSES * 2];
        sent[1] = all[TSL_TRAFFIC_LOSSES * 2 + 1];
        tsl_graph_destroy(g);
    };
    int64_t base[2], mse[2], diff[2], sim[2];
    losses(1, TSL_MODEL_LOSS_MSE, base);
    losses(2, TSL_MODEL_LOSS_MSE, mse);
    losses(2, TSL_MODEL_LOSS_DIFFERENCE, diff);
    losses(2, TSL_MODEL_LOSS_SIMILARITY, sim);
    const int64_t acc = base[0] / 2; // (the loss's and the accuracy's accumulator into rank 0)
    EXPECT_GT(acc, 0);
    for (int r = 0; r < 2; r++) {
        EXPECT_EQ(base[r], 2 * acc) << r;
        EXPECT_EQ(mse[r] - base[r], acc) << r;
        EXPECT_EQ(diff[r] - base[r], 128) << r;
        EXPECT_EQ(sim[r], diff[r]) << r;
    }
}

// Batch norm's exact sums a rank receives in one exchange (tsl_plan_sums_received, which the
// peak estimate holds from the step's start): 2 C accumulators from each other rank with
// tiles, and where the channels are cut, only each range's 2 C / F from that range's ranks.
namespace
{
// input (1, 8, 8) -> conv 3x3 to 64 channels -> batch norm [-> average pool of the whole map]
// -> flatten -> linear to 2; *conv and *bn the convolution's and batch norm's op indices.
tsl_graph_t conv_bn_graph(bool pooled, int32_t *conv, int32_t *bn)
{
    int64_t k[2] = {3, 3};
    int32_t x, c, b, p, f, y;
    tsl_conv_params cp;
    tsl_graph_t g = graph_on_8x8(1, &x, &cp);
    tsl_pool_params pp;
    tsl_pool_params_init(&pp, TSL_POOL_AVG, 2, 8);
    EXPECT_EQ(tsl_graph_conv(g, "c", x, 64, k, &cp, 0, 0, &c), TSL_OK);
    EXPECT_EQ(tsl_graph_batchnorm(g, "bn", c, 1e-5, 0.1, &b), TSL_OK) << tsl_last_error();
    p = b;
    if (pooled)
        EXPECT_EQ(tsl_graph_pool(g, b, &pp, &p), TSL_OK) << tsl_last_error();
    EXPECT_EQ(tsl_graph_flatten(g, p, &f), TSL_OK);
    EXPECT_EQ(tsl_graph_linear(g, "fc", f, 2, 1, &y), TSL_OK);
    EXPECT_EQ(tsl_graph_set_output(g, y), TSL_OK);
    *conv = g->values[c].producer;
    *bn = g->values[b].producer;
    return g;
}
} // namespace

TEST(Plan, BatchNormSumsReceivedPerChannelRange)
{
    int32_t conv, bn;
    tsl_graph_t g = conv_bn_graph(false, &conv, &bn);
    const int64_t whole = 2 * 64 * 616; // 2 C accumulators of 616 bytes
    struct Case {
        const char *plan;
        int32_t ranks;
        int64_t each; // what every rank receives
    } cases[] = {{"data=2", 2, whole},
                 {"filters=2", 2, whole / 2},
                 {"channels=2", 2, whole / 2},
                 {"data=4", 4, 3 * whole},
                 {"filters=4", 4, 3 * whole / 4},
                 // its own range from the other sample tile's rank, the other range from two
                 {"data=2,filters=2", 4, whole / 2 + 2 * (whole / 2)}};
    int64_t got[4];
    for (const Case &t : cases) {
        tsl_plan p;
        ASSERT_EQ(tsl_plan_parse(t.plan, &p), TSL_OK);
        ASSERT_EQ(tsl_plan_sums_received(&p, g, bn, t.ranks, 0, 1, 4, got), TSL_OK)
            << tsl_last_error();
        for (int32_t r = 0; r < t.ranks; r++)
            EXPECT_EQ(got[r], t.each) << t.plan << ", rank " << r;
    }
    ASSERT_EQ(tsl_plan_sums_received(nullptr, g, bn, 1, 0, 1, 4, got), TSL_OK);
    EXPECT_EQ(got[0], 0);
    ASSERT_EQ(tsl_plan_sums_received(nullptr, g, conv, 2, 0, 1, 4, got), TSL_OK);
    EXPECT_EQ(got[0] + got[1], 0) << "a convolution exchanges no sums";
    tsl_graph_destroy(g);
}

// What a step receives is allocated when its tasks are submitted (StarPU-MPI posts the
// receives then): the peak holds a batch norm's received sums of the backward and of the next
// step's forward on top of what one rank with the same tiles holds. A network whose parameters
// all stay whole (under 4096 elements): a data=2 rank holds one rank's tiles of half the batch.
TEST(Plan, PeakHoldsTheSumsAStepReceives)
{
    int32_t conv, bn;
    tsl_graph_t g = conv_bn_graph(true, &conv, &bn);
    tsl_plan data2;
    ASSERT_EQ(tsl_plan_parse("data=2", &data2), TSL_OK);
    int64_t one = 0, two[2] = {0, 0}, got[2];
    ASSERT_EQ(tsl_plan_estimate_peak(nullptr, g, 1, 1, 4, 2, &one), TSL_OK) << tsl_last_error();
    ASSERT_EQ(tsl_plan_estimate_peak(&data2, g, 2, 1, 8, 2, two), TSL_OK) << tsl_last_error();
    ASSERT_EQ(tsl_plan_sums_received(&data2, g, bn, 2, 0, 1, 8, got), TSL_OK);
    ASSERT_EQ(got[0], 2 * 64 * 616);
    for (int r = 0; r < 2; r++) {
        // (within 8 KiB, an eighth of an activation tile here: the two peaks fall at
        // slightly different points, where the loss's and labels' small tensors differ)
        EXPECT_GE(two[r] - one, 2 * got[r] - 8192) << "rank " << r;
        EXPECT_LE(two[r] - one, 2 * got[r] + 8192) << "rank " << r;
    }
    tsl_graph_destroy(g);
}

// A weight cut by filters whose filter group holds two ranks (data=2 inside it): the owner of
// a group's tile receives the other rank's partial gradient of it, posted with the backward (the
// other rank makes that partial): a tile more per cut weight on the busiest rank than the same
// tiles on groups of one rank (filters=2 alone, half the batch).
TEST(Plan, PeakHoldsTheFilterGroupsPartialGradients)
{
    int64_t k[2] = {3, 3};
    int32_t x, c1, r1, c2, y;
    tsl_conv_params cp;
    tsl_graph_t g = graph_on_8x8(64, &x, &cp);
    ASSERT_EQ(tsl_graph_conv(g, "c1", x, 64, k, &cp, 0, 0, &c1), TSL_OK);
    ASSERT_EQ(tsl_graph_activation(g, c1, TSL_ACT_RELU, 0, &r1), TSL_OK) << tsl_last_error();
    ASSERT_EQ(tsl_graph_conv(g, "c2", r1, 64, k, &cp, 0, 0, &c2), TSL_OK);
    ASSERT_EQ(tsl_graph_conv(g, "head", c2, 2, k, &cp, 0, 0, &y), TSL_OK);
    ASSERT_EQ(tsl_graph_set_output(g, y), TSL_OK);
    tsl_plan one_group, two_ranks;
    ASSERT_EQ(tsl_plan_parse("filters=2", &one_group), TSL_OK);
    ASSERT_EQ(tsl_plan_parse("data=2,filters=2", &two_ranks), TSL_OK);
    int64_t a[2], b[4];
    ASSERT_EQ(tsl_plan_estimate_peak(&one_group, g, 2, 1, 2, 2, a), TSL_OK) << tsl_last_error();
    ASSERT_EQ(tsl_plan_estimate_peak(&two_ranks, g, 4, 1, 4, 2, b), TSL_OK) << tsl_last_error();
    // c1's and c2's weights are cut (the head's output, the model's, keeps whole channels):
    // the busiest rank, a tile owner, receives one partial of each
    const int64_t tile = 4 * 32 * 64 * 9; // 32 filters over 64 channels, 3 x 3
    const int64_t most_a = std::max(a[0], a[1]), most_b = *std::max_element(b, b + 4);
    EXPECT_GE(most_b - most_a, 2 * tile - 8192);
    EXPECT_LE(most_b - most_a, 2 * tile + 8192);
    tsl_graph_destroy(g);
}

// filters=2: a convolution whose output keeps whole channels (the model's output) runs where
// its output tiles live (rank 0 here), reading the other rank's channel tile of its input
// there, a received copy held from the forward to the backward; each input gradient tile is
// made where it lives, the other rank reading the received output gradient.
TEST(Plan, AWholeOutputsConvolutionRunsWhereItsTilesLive)
{
    int64_t k[2] = {3, 3};
    int32_t x, c1, y;
    tsl_conv_params cp;
    tsl_graph_t g = graph_on_8x8(1, &x, &cp);
    ASSERT_EQ(tsl_graph_conv(g, "c1", x, 64, k, &cp, 0, 0, &c1), TSL_OK);
    ASSERT_EQ(tsl_graph_conv(g, "head", c1, 2, k, &cp, 0, 0, &y), TSL_OK);
    ASSERT_EQ(tsl_graph_set_output(g, y), TSL_OK);
    tsl_plan filters;
    ASSERT_EQ(tsl_plan_parse("filters=2", &filters), TSL_OK);
    int64_t a[2];
    ASSERT_EQ(tsl_plan_estimate_peak(&filters, g, 2, 1, 4, 2, a), TSL_OK) << tsl_last_error();
    // The head's output (2 channels, 2 KiB) is whole, on rank 0. At the head's backward rank 0
    // holds c1's tile (kept for the head's weight gradient), the copy of rank 1's and its
    // gradient tile, rank 1 its tile, its gradient tile and the received output gradient. The
    // rest (input, weights with gradients and states, the head's whole on rank 0, the loss's)
    // is about a tile on rank 0 and a third of one on rank 1. Parts of the input gradient made
    // on rank 0 for rank 1 and received there (or a copy on rank 1) would add a tile each.
    const int64_t tile = 4 * 4 * 32 * 8 * 8; // a rank's channel tile of c1: 4 samples, 32 of 64
    EXPECT_GE(a[0], 3 * tile);
    EXPECT_LT(a[0], 5 * tile);
    EXPECT_GE(a[1], 2 * tile);
    EXPECT_LT(a[1], 3 * tile);
    EXPECT_GE(a[0] - a[1], tile) << "rank 0 holds the copy of rank 1's tile, rank 1 none";
    tsl_graph_destroy(g);
}
