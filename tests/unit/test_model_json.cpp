// Model files (docs/model-format.md): the examples equal the zoo's networks, writing and
// reading back gives the same graph, and every bad file is an error that names the problem.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <unistd.h>
#include <vector>

extern "C" {
#include "graph_internal.h" // to compare every attribute of two graphs
#include "tessel/graph.h"
#include "tessel/io.h"
}

namespace
{

namespace fs = std::filesystem;

// examples/models, found from this file's place in the source tree.
const fs::path examples_dir =
    fs::path(__FILE__).parent_path() / ".." / ".." / "examples" / "models";

std::string shape_text(const tsl_shape &s)
{
    std::string t;
    for (int d = 0; d < s.ndim; d++)
        t += (d ? "x" : "") + std::to_string(s.dims[d]);
    return t;
}

bool same_shape(const tsl_shape &a, const tsl_shape &b)
{
    if (a.ndim != b.ndim)
        return false;
    for (int d = 0; d < a.ndim; d++)
        if (a.dims[d] != b.dims[d])
            return false;
    return true;
}

bool same_ints(const int64_t *a, const int64_t *b, int n)
{
    for (int d = 0; d < n; d++)
        if (a[d] != b[d])
            return false;
    return true;
}

// The attributes an op of its kind has (those its kind ignores are not compared).
std::string op_difference(const tsl_graph_op &a, const tsl_graph_op &b, int spatial)
{
    switch (a.kind) {
    case TSL_OP_CONV: {
        const tsl_conv_params &p = a.conv, &q = b.conv;
        int n = p.spatial;
        if (p.spatial != q.spatial || !same_ints(p.stride, q.stride, n) ||
            !same_ints(p.padding, q.padding, n) || !same_ints(p.dilation, q.dilation, n) ||
            p.groups != q.groups || p.padding_mode != q.padding_mode ||
            a.transposed != b.transposed || a.bias != b.bias ||
            (a.transposed && !same_ints(p.output_padding, q.output_padding, n)))
            return "convolution settings";
        return "";
    }
    case TSL_OP_BATCHNORM:
        return a.eps == b.eps && a.momentum == b.momentum ? "" : "eps or momentum";
    case TSL_OP_GROUPNORM:
        return a.eps == b.eps && a.norm_groups == b.norm_groups && a.norm_kind == b.norm_kind
                   ? ""
                   : "groups, eps or layer norm";
    case TSL_OP_ADD:
        return a.h == b.h ? "" : "h";
    case TSL_OP_ACTIVATION:
        if (a.act != b.act || a.slope != b.slope)
            return "activation";
        return "";
    case TSL_OP_POOL: {
        const tsl_pool_params &p = a.pool, &q = b.pool;
        int n = p.spatial;
        if (p.spatial != q.spatial || p.kind != q.kind || !same_ints(p.kernel, q.kernel, n) ||
            !same_ints(p.stride, q.stride, n) || !same_ints(p.padding, q.padding, n) ||
            (p.kind == TSL_POOL_AVG && p.count_include_pad != q.count_include_pad) ||
            p.ceil_mode != q.ceil_mode)
            return "pooling settings";
        return "";
    }
    case TSL_OP_UPSAMPLE:
        return same_ints(a.scale, b.scale, spatial) && same_ints(a.size, b.size, spatial) &&
                       a.linear == b.linear
                   ? ""
                   : "upsampling";
    case TSL_OP_SLICE:
        return same_ints(a.start, b.start, spatial + 1) && same_ints(a.stop, b.stop, spatial + 1)
                   ? ""
                   : "slice";
    case TSL_OP_LINEAR:
        return a.bias == b.bias ? "" : "bias";
    default:
        return "";
    }
}

// What differs between two graphs (ops, attributes, names, values, parameters), or "".
std::string graph_difference(const tsl_graph *a, const tsl_graph *b)
{
    std::ostringstream why;
    if (a->nops != b->nops || a->nvalues != b->nvalues || a->nparams != b->nparams)
        why << "counts: " << a->nops << "/" << a->nvalues << "/" << a->nparams << " ops/values/"
            << "params vs " << b->nops << "/" << b->nvalues << "/" << b->nparams;
    else if (a->input != b->input || a->output != b->output)
        why << "input or output: " << a->input << "," << a->output << " vs " << b->input << ","
            << b->output;
    for (int32_t i = 0; why.str().empty() && i < a->nvalues; i++) {
        const tsl_graph_value &u = a->values[i], &v = b->values[i];
        if (!same_shape(u.shape, v.shape) || u.producer != v.producer || u.consumers != v.consumers)
            why << "value " << i << ": " << shape_text(u.shape) << " vs " << shape_text(v.shape);
    }
    for (int32_t i = 0; why.str().empty() && i < a->nparams; i++) {
        const tsl_graph_param &p = a->params[i], &q = b->params[i];
        if (std::strcmp(p.name, q.name) != 0 || !same_shape(p.shape, q.shape) ||
            p.trainable != q.trainable || p.init != q.init || p.init_bound != q.init_bound ||
            p.shares != q.shares)
            why << "parameter " << i << ": " << p.name << " " << shape_text(p.shape) << " vs "
                << q.name << " " << shape_text(q.shape);
    }
    for (int32_t i = 0; why.str().empty() && i < a->nops; i++) {
        const tsl_graph_op &o = a->ops[i], &p = b->ops[i];
        std::string what;
        if (o.kind != p.kind || std::strcmp(o.name, p.name) != 0)
            what = std::string("kind or name: ") + tsl_op_kind_name(o.kind) + " '" + o.name +
                   "' vs " + tsl_op_kind_name(p.kind) + " '" + p.name + "'";
        else if (o.ninputs != p.ninputs || o.output != p.output || o.nparams != p.nparams ||
                 std::memcmp(o.inputs, p.inputs, sizeof o.inputs[0] * (size_t)o.ninputs) ||
                 std::memcmp(o.params, p.params, sizeof o.params[0] * (size_t)o.nparams))
            what = "inputs, output or parameters";
        else
            what = op_difference(o, p, a->values[o.output].shape.ndim - 1);
        if (!what.empty())
            why << "op " << i << " (" << tsl_op_kind_name(o.kind) << " '" << o.name
                << "'): " << what;
    }
    return why.str();
}

std::string read_text(const fs::path &path)
{
    std::ifstream f(path);
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
}

std::string print_json(tsl_graph_t g)
{
    char *text = nullptr;
    EXPECT_EQ(tsl_graph_print_json(g, &text), TSL_OK) << tsl_last_error();
    std::string s = text ? text : "";
    tsl_free(text);
    return s;
}

// A model file around these layers.
std::string model(const std::string &layers, const std::string &more = "")
{
    return "{\"format\": \"tessel-model\", \"version\": 1, " + more + "\"layers\": [" + layers +
           "]}";
}

// Sample shapes to try each zoo network on: each takes some of them.
const std::vector<std::vector<int64_t>> sample_shapes = {
    {1, 28, 28}, {3, 32, 32}, {1, 64}, {2, 48}, {2, 16, 16, 16}, {1, 12, 8, 16}, {3, 20, 24}};

class ModelJson : public ::testing::Test
{
  protected:
    void SetUp() override
    {
        char tmpl[] = "/tmp/tessel-model-XXXXXX";
        ASSERT_NE(mkdtemp(tmpl), nullptr);
        dir = tmpl;
    }
    void TearDown() override
    {
        std::error_code ignored;
        fs::remove_all(dir, ignored);
    }
    std::string path(const std::string &name) const
    {
        return (dir / name).string();
    }
    void write(const std::string &name, const std::string &text) const
    {
        std::ofstream f(path(name), std::ios::binary);
        f << text;
    }
    fs::path dir;
};

// ---- the examples are the zoo ----

// The zoo's `name` and the model file `file` for a sample shape and class count: how they
// differ ("" when they do not), or "zoo refuses" when the zoo does not take the sample.
std::string zoo_vs_file(const char *name, const fs::path &file, const std::vector<int64_t> &sample,
                        int64_t classes)
{
    int32_t ndim = (int32_t)sample.size();
    tsl_graph_t zoo = nullptr, read = nullptr;
    if (tsl_zoo_graph(name, ndim, sample.data(), classes, &zoo) != TSL_OK)
        return "zoo refuses";
    std::string why;
    if (tsl_graph_read_json(file.c_str(), ndim, sample.data(), classes, &read) != TSL_OK)
        why = std::string("cannot read: ") + tsl_last_error();
    else
        why = graph_difference(zoo, read);
    tsl_graph_destroy(zoo);
    tsl_graph_destroy(read);
    return why;
}

TEST_F(ModelJson, ExamplesEqualTheZoo)
{
    int32_t count = 0;
    const char *const *names = tsl_zoo_names(&count, nullptr);
    ASSERT_GT(count, 0);
    for (int32_t i = 0; i < count; i++) {
        // the ODE families need their steps: their examples have 8
        std::string name = names[i];
        if (name.rfind("ode", 0) == 0)
            name += "8";
        fs::path file = examples_dir / (name + ".json");
        ASSERT_TRUE(fs::exists(file)) << "no example model file for the zoo's " << name;
        int tried = 0;
        for (const auto &sample : sample_shapes) {
            // a file has a fixed number of domains: dsn.json is the zoo's dsn of two
            if (name == "dsn" && sample[0] != 2)
                continue;
            for (int64_t classes : {10, 3}) {
                std::string why = zoo_vs_file(name.c_str(), file, sample, classes);
                if (why == "zoo refuses")
                    continue;
                tried++;
                tsl_shape s;
                tsl_shape_make(&s, (int32_t)sample.size(), sample.data());
                EXPECT_EQ(why, "")
                    << names[i] << " for " << shape_text(s) << ", " << classes << " classes";
            }
        }
        EXPECT_GT(tried, 0) << "no sample shape the zoo's " << names[i] << " takes";
    }
}

TEST(ModelJsonCnn, FashionMnistCnnFromItsFile)
{
    // The brief's case, spelled out: examples/models/cnn.json for 1x28x28 and 10 classes.
    fs::path file = examples_dir / "cnn.json";
    EXPECT_EQ(zoo_vs_file("cnn", file, {1, 28, 28}, 10), "");
    int64_t sample[3] = {1, 28, 28};
    tsl_graph_t read = nullptr;
    ASSERT_EQ(tsl_graph_read_json(file.c_str(), 3, sample, 10, &read), TSL_OK) << tsl_last_error();
    ASSERT_EQ(tsl_graph_param_count(read), 14);
    const char *name;
    tsl_shape s;
    ASSERT_EQ(tsl_graph_param_info(read, 10, &name, &s, nullptr), TSL_OK);
    EXPECT_STREQ(name, "fc1.weight");
    EXPECT_EQ(shape_text(s), "128x3136");
    ASSERT_EQ(tsl_graph_value_shape(read, tsl_graph_output(read), &s), TSL_OK);
    EXPECT_EQ(shape_text(s), "10");
    tsl_graph_destroy(read);
    // The file adapts: 3-D volumes, 4 classes; and the comparison can fail.
    EXPECT_EQ(zoo_vs_file("cnn", file, {2, 8, 12, 16}, 4), "");
    EXPECT_NE(zoo_vs_file("fcn2d", file, {1, 28, 28}, 10), "");
}

// ---- round trips ----

TEST_F(ModelJson, ZooNetworksRoundTrip)
{
    int32_t count = 0;
    const char *const *zoo_names = tsl_zoo_names(&count, nullptr);
    // The families that need their size in the name (resnetN, odenetN, odetanhN) as examples.
    std::vector<const char *> names(zoo_names, zoo_names + count);
    for (const char *sized : {"resnet2", "odenet5", "odetanh3"})
        names.push_back(sized);
    count = (int32_t)names.size();
    for (int32_t i = 0; i < count; i++) {
        for (const auto &sample : sample_shapes) {
            int32_t ndim = (int32_t)sample.size();
            tsl_graph_t zoo = nullptr, read = nullptr, parsed = nullptr;
            if (tsl_zoo_graph(names[i], ndim, sample.data(), 7, &zoo) != TSL_OK)
                continue;
            std::string file = path(std::string(names[i]) + ".json");
            ASSERT_EQ(tsl_graph_write_json(zoo, file.c_str()), TSL_OK) << tsl_last_error();
            ASSERT_EQ(tsl_graph_read_json(file.c_str(), ndim, sample.data(), 7, &read), TSL_OK)
                << names[i] << ": " << tsl_last_error();
            EXPECT_EQ(graph_difference(zoo, read), "") << names[i];
            // The string variants say the same, and writing what was read changes nothing.
            std::string text = print_json(zoo);
            EXPECT_EQ(text, read_text(file));
            EXPECT_EQ(print_json(read), text);
            ASSERT_EQ(tsl_graph_parse_json(text.c_str(), ndim, sample.data(), 7, &parsed), TSL_OK)
                << tsl_last_error();
            EXPECT_EQ(graph_difference(zoo, parsed), "") << names[i];
            tsl_graph_destroy(zoo);
            tsl_graph_destroy(read);
            tsl_graph_destroy(parsed);
        }
    }
}

// A graph with every kind of op and layer, attributes off their defaults, per-dimension
// settings that differ, and unnamed values read by later layers.
tsl_graph_t every_op_graph()
{
    tsl_graph_t g = nullptr;
    EXPECT_EQ(tsl_graph_create(&g), TSL_OK);
    int64_t sample[3] = {3, 16, 16};
    int32_t x, v, skip, cat;
    tsl_status st = tsl_graph_input(g, 3, sample, &x);
    tsl_conv_params cp;
    tsl_conv_params_init(&cp, 2);
    cp.padding[0] = 1;
    cp.padding[1] = 2;
    cp.padding_mode = TSL_PADDING_REPLICATE;
    int64_t k35[2] = {3, 5}, k3[2] = {3, 3}, k31[2] = {3, 1};
    st = st ? st : tsl_graph_conv(g, "stem", x, 8, k35, &cp, 0, 1, &v); // 8x16x16
    // Numbers that need all 17 digits to come back to the same bits.
    st = st ? st : tsl_graph_batchnorm(g, "bn", v, std::nextafter(1e-3, 1.0), 0.25, &v);
    st = st ? st : tsl_graph_activation(g, v, TSL_ACT_LEAKY_RELU, 1.0 / 3, &skip);
    tsl_pool_params pp;
    tsl_pool_params_init(&pp, TSL_POOL_MAX, 2, 3);
    pp.stride[0] = pp.stride[1] = 2;
    pp.padding[0] = pp.padding[1] = 1;
    st = st ? st : tsl_graph_pool(g, skip, &pp, &v); // 8x8x8
    tsl_conv_params gp;
    tsl_conv_params_init(&gp, 2);
    gp.padding[0] = gp.padding[1] = 2;
    gp.dilation[0] = gp.dilation[1] = 2;
    gp.groups = 4;
    gp.padding_mode = TSL_PADDING_REFLECT;
    int32_t pooled = v, grouped, again;
    st = st ? st : tsl_graph_conv(g, "grouped", pooled, 16, k3, &gp, 0, 0, &grouped); // 16x8x8
    // the same convolution (its parameters) once more
    st = st ? st : tsl_graph_conv(g, "grouped_again", pooled, 16, k3, &gp, 0, 0, &again);
    st = st ? st : tsl_graph_share_params(g, again, grouped);
    st = st ? st : tsl_graph_add(g, grouped, again, &v);
    tsl_pool_params ap;
    tsl_pool_params_init(&ap, TSL_POOL_AVG, 2, 2);
    ap.count_include_pad = 0;
    ap.ceil_mode = 1;
    st = st ? st : tsl_graph_pool(g, v, &ap, &v); // 16x4x4
    st = st ? st : tsl_graph_activation(g, v, TSL_ACT_SIGMOID, 0, &v);
    int64_t scale21[2] = {2, 1}, scale2[2] = {2, 2};
    st = st ? st : tsl_graph_upsample(g, v, scale21, 0, &v); // 16x8x4
    tsl_conv_params tp;
    tsl_conv_params_init(&tp, 2);
    tp.stride[1] = 2;
    tp.padding[0] = 1;
    tp.output_padding[1] = 1;
    st = st ? st : tsl_graph_conv(g, "up", v, 8, k31, &tp, 1, 1, &v); // 8x8x8
    const int64_t odd[2] = {11, 5}, back[2] = {8, 8};
    st = st ? st : tsl_graph_upsample_size(g, v, odd, 0, &v);  // 8x11x5
    st = st ? st : tsl_graph_upsample_size(g, v, back, 1, &v); // 8x8x8
    st = st ? st : tsl_graph_upsample(g, v, scale2, 1, &v);    // 8x16x16
    int32_t parts[2] = {v, skip};
    st = st ? st : tsl_graph_concat(g, 2, parts, &cat); // 16x16x16
    st = st ? st : tsl_graph_activation(g, cat, TSL_ACT_TANH, 0, &v);
    st = st ? st : tsl_graph_add(g, v, cat, &v);
    st = st ? st : tsl_graph_mul(g, v, cat, &v); // a gate
    st = st ? st : tsl_graph_sub(g, v, cat, &v);
    const int64_t box_lo[3] = {2, 0, 0}, box_hi[3] = {16, 16, 16};
    st = st ? st : tsl_graph_slice(g, v, box_lo, box_hi, &v); // 14x16x16: channels 2 to 15
    st = st ? st : tsl_graph_groupnorm(g, "gn", v, 7, 1e-4, &v);
    st = st ? st : tsl_graph_instancenorm(g, "in", v, 1e-3, &v);
    st = st ? st : tsl_graph_activation(g, v, TSL_ACT_RELU, 0, &v);
    tsl_pool_params gap;
    tsl_pool_params_init(&gap, TSL_POOL_AVG, 2, 16); // over the whole 16x16
    st = st ? st : tsl_graph_pool(g, v, &gap, &v);
    st = st ? st : tsl_graph_flatten(g, v, &v);
    st = st ? st : tsl_graph_dropout(g, v, 0.25, &v);
    st = st ? st : tsl_graph_layernorm(g, "ln", v, 1e-5, &v);
    st = st ? st : tsl_graph_linear(g, "hidden", v, 12, 0, &v);
    st = st ? st : tsl_graph_linear(g, "head", v, 5, 1, &v);
    st = st ? st : tsl_graph_set_output(g, v);
    EXPECT_EQ(st, TSL_OK) << tsl_last_error();
    return g;
}

TEST_F(ModelJson, EveryOpRoundTrips)
{
    tsl_graph_t g = every_op_graph();
    std::string file = path("every.json");
    ASSERT_EQ(tsl_graph_write_json(g, file.c_str()), TSL_OK) << tsl_last_error();
    std::string text = read_text(file);
    for (const char *op : {"input",
                           "conv",
                           "conv_transpose",
                           "batchnorm",
                           "relu",
                           "leaky_relu",
                           "sigmoid",
                           "tanh",
                           "maxpool",
                           "avgpool",
                           "global_avgpool",
                           "upsample_nearest",
                           "upsample_linear",
                           "concat",
                           "add",
                           "mul",
                           "slice",
                           "flatten",
                           "linear",
                           "group_norm",
                           "layer_norm",
                           "instance_norm"})
        EXPECT_NE(text.find("\"op\": \"" + std::string(op) + "\""), std::string::npos) << op;
    // Settings that differ per dimension are arrays; equal ones, one number.
    EXPECT_NE(text.find("\"kernel\": [3, 5], \"padding\": [1, 2]"), std::string::npos) << text;
    EXPECT_NE(text.find("\"output_padding\": [0, 1]"), std::string::npos) << text;
    EXPECT_NE(text.find("\"groups\": 4, \"padding_mode\": \"reflect\""), std::string::npos) << text;
    EXPECT_NE(text.find("\"padding_mode\": \"replicate\""), std::string::npos) << text;
    EXPECT_NE(text.find("\"ceil_mode\": true, \"count_include_pad\": false"), std::string::npos)
        << text;
    EXPECT_NE(text.find("\"eps\": 0.0010000000000000002, \"momentum\": 0.25"), std::string::npos)
        << text;
    EXPECT_NE(text.find("\"slope\": 0.3333333333333333"), std::string::npos) << text;
    EXPECT_NE(
        text.find("{\"name\": \"gn\", \"op\": \"group_norm\", \"groups\": 7, \"eps\": 0.0001}"),
        std::string::npos)
        << text;
    EXPECT_NE(text.find("\"out\": \"classes\""), std::string::npos) << text;
    EXPECT_NE(text.find("\"bias\": false, \"share\": \"grouped\"}"), std::string::npos) << text;
    // The skip (an unnamed leaky ReLU) got a name to be read by.
    EXPECT_NE(text.find("\"op\": \"upsample_nearest\", \"size\": [11, 5]"), std::string::npos)
        << text;
    EXPECT_NE(text.find("\"op\": \"upsample_linear\", \"size\": 8"), std::string::npos) << text;
    EXPECT_NE(text.find("\"inputs\": [\"upsample_linear_14\", \"leaky_relu_3\"]"),
              std::string::npos)
        << text;
    int64_t sample[3] = {3, 16, 16};
    tsl_graph_t read = nullptr;
    ASSERT_EQ(tsl_graph_read_json(file.c_str(), 3, sample, 5, &read), TSL_OK) << tsl_last_error();
    EXPECT_EQ(graph_difference(g, read), "");
    EXPECT_EQ(print_json(read), text);
    // Names given to unnamed layers stay in the file: the graph's ops have none.
    const char *name;
    tsl_op_kind kind;
    ASSERT_EQ(tsl_graph_op_info(read, 3, &kind, &name, nullptr), TSL_OK);
    EXPECT_EQ(kind, TSL_OP_ACTIVATION);
    EXPECT_STREQ(name, "");
    tsl_graph_destroy(read);
    tsl_graph_destroy(g);
}

// "sub" in a model file is tsl_graph_sub(): an add of (-1) b + a (written back as that add),
// and "mul" is tsl_graph_mul(); both take exactly two inputs of one shape.
TEST_F(ModelJson, SubAndMulReadAsTheirBuilders)
{
    const std::string layers =
        R"({"op": "input"}, {"name": "a", "op": "conv", "out": 4, "kernel": 3, "padding": 1},
        {"name": "b", "op": "conv", "out": 4, "kernel": 1, "inputs": ["input"]},
        {"name": "d", "op": "sub", "inputs": ["a", "b"]},
        {"name": "p", "op": "mul", "inputs": ["d", "b"]},
        {"op": "flatten"}, {"name": "head", "op": "linear", "out": "classes"})";
    write("sub.json", model(layers));
    int64_t sample[3] = {2, 5, 6};
    tsl_graph_t read = nullptr;
    ASSERT_EQ(tsl_graph_read_json(path("sub.json").c_str(), 3, sample, 3, &read), TSL_OK)
        << tsl_last_error();
    tsl_graph_t built = nullptr;
    ASSERT_EQ(tsl_graph_create(&built), TSL_OK);
    int32_t x, a, b, v;
    tsl_conv_params cp;
    tsl_conv_params_init(&cp, 2);
    int64_t k3[2] = {3, 3}, k1[2] = {1, 1};
    ASSERT_EQ(tsl_graph_input(built, 3, sample, &x), TSL_OK);
    cp.padding[0] = cp.padding[1] = 1;
    ASSERT_EQ(tsl_graph_conv(built, "a", x, 4, k3, &cp, 0, 1, &a), TSL_OK);
    cp.padding[0] = cp.padding[1] = 0;
    ASSERT_EQ(tsl_graph_conv(built, "b", x, 4, k1, &cp, 0, 1, &b), TSL_OK);
    ASSERT_EQ(tsl_graph_sub(built, a, b, &v), TSL_OK);
    ASSERT_EQ(tsl_graph_mul(built, v, b, &v), TSL_OK);
    ASSERT_EQ(tsl_graph_flatten(built, v, &v), TSL_OK);
    ASSERT_EQ(tsl_graph_linear(built, "head", v, 3, 1, &v), TSL_OK);
    ASSERT_EQ(tsl_graph_set_output(built, v), TSL_OK);
    EXPECT_EQ(graph_difference(built, read), "");
    // The sub: an add with h = -1 of (b, a).
    tsl_op_kind kind;
    ASSERT_EQ(tsl_graph_op_info(read, 3, &kind, nullptr, nullptr), TSL_OK);
    EXPECT_EQ(kind, TSL_OP_ADD);
    ASSERT_EQ(tsl_graph_op_info(read, 4, &kind, nullptr, nullptr), TSL_OK);
    EXPECT_EQ(kind, TSL_OP_MUL);
    std::string text = print_json(read);
    EXPECT_NE(text.find("\"op\": \"add\", \"inputs\": [\"b\", \"a\"], \"h\": -1"),
              std::string::npos)
        << text;
    // Two inputs, one shape.
    write("sub3.json", model(R"({"op": "input"}, {"op": "sub", "inputs": ["input", "input",
        "input"]})"));
    tsl_graph_t bad = nullptr;
    EXPECT_EQ(tsl_graph_read_json(path("sub3.json").c_str(), 3, sample, 3, &bad), TSL_ERR_FORMAT);
    write("mulshape.json", model(R"({"op": "input"}, {"name": "c", "op": "conv", "out": 3,
        "kernel": 1}, {"op": "mul", "inputs": ["input", "c"]})"));
    EXPECT_EQ(tsl_graph_read_json(path("mulshape.json").c_str(), 3, sample, 3, &bad), TSL_ERR_SHAPE)
        << tsl_last_error();
    tsl_graph_destroy(built);
    tsl_graph_destroy(read);
}

// "losses": the weighted terms a model built from the file minimises, read into the graph
// (tsl_graph_loss) and written back; bad sections are errors that say why.
TEST_F(ModelJson, LossesRoundTripAndBadOnesAreErrors)
{
    const std::string layers =
        R"({"op": "input"}, {"name": "c", "op": "conv", "out": "classes", "kernel": 1})";
    int64_t sample[3] = {2, 6, 5};
    write("losses.json", model(layers, R"("losses": [{"loss": "dice", "weight": 0.3},
        {"loss": "cross_entropy"}], )"));
    tsl_graph_t g = nullptr;
    ASSERT_EQ(tsl_graph_read_json(path("losses.json").c_str(), 3, sample, 3, &g), TSL_OK)
        << tsl_last_error();
    tsl_loss_term terms[TSL_MAX_LOSS_TERMS];
    int32_t count = -1;
    ASSERT_EQ(tsl_graph_loss(g, &count, terms), TSL_OK);
    ASSERT_EQ(count, 2);
    EXPECT_EQ(terms[0].kind, TSL_MODEL_LOSS_DICE);
    EXPECT_EQ(terms[0].weight, 0.3);
    EXPECT_EQ(terms[1].kind, TSL_MODEL_LOSS_CROSS_ENTROPY);
    EXPECT_EQ(terms[1].weight, 1.0);
    std::string text = print_json(g);
    EXPECT_NE(
        text.find(
            R"("losses": [{"loss": "dice", "weight": 0.3}, {"loss": "cross_entropy", "weight": 1}])"),
        std::string::npos)
        << text;
    write("again.json", text);
    tsl_graph_t again = nullptr;
    ASSERT_EQ(tsl_graph_read_json(path("again.json").c_str(), 3, sample, 3, &again), TSL_OK);
    EXPECT_EQ(print_json(again), text);
    // Losses on float targets: named, read and written back.
    write("targets.json",
          model(layers, R"("losses": [{"loss": "mse"}, {"loss": "l1", "weight": 0.25}], )"));
    tsl_graph_t targets = nullptr;
    ASSERT_EQ(tsl_graph_read_json(path("targets.json").c_str(), 3, sample, 3, &targets), TSL_OK)
        << tsl_last_error();
    ASSERT_EQ(tsl_graph_loss(targets, &count, terms), TSL_OK);
    ASSERT_EQ(count, 2);
    EXPECT_EQ(terms[0].kind, TSL_MODEL_LOSS_MSE);
    EXPECT_EQ(terms[1].kind, TSL_MODEL_LOSS_L1);
    EXPECT_EQ(terms[1].weight, 0.25);
    EXPECT_NE(print_json(targets).find(
                  R"("losses": [{"loss": "mse", "weight": 1}, {"loss": "l1", "weight": 0.25}])"),
              std::string::npos)
        << print_json(targets);
    tsl_graph_destroy(targets);
    // Without a section: none named (the default, cross-entropy), and none written.
    write("none.json", model(layers));
    tsl_graph_t none = nullptr;
    ASSERT_EQ(tsl_graph_read_json(path("none.json").c_str(), 3, sample, 3, &none), TSL_OK);
    ASSERT_EQ(tsl_graph_loss(none, &count, terms), TSL_OK);
    EXPECT_EQ(count, 0);
    EXPECT_EQ(print_json(none).find("losses"), std::string::npos);
    std::string thirty_three_terms = R"({"loss": "dice"})";
    for (int k = 1; k < TSL_MAX_LOSS_TERMS + 1; k++)
        thirty_three_terms += R"(, {"loss": "dice"})";
    const std::pair<std::string, std::string> bad[] = {
        {R"("losses": [], )", "must be an array of 1 to 32 terms"},
        {R"("losses": {"loss": "dice"}, )", "must be an array"},
        {R"("losses": [{"loss": "mae"}], )",
         "losses[0]: needs \"loss\", cross_entropy, dice, mse, l1, difference or similarity"},
        {R"("losses": [{"loss": "mse"}, {"loss": "dice"}], )", "all compare the output with"},
        {R"("losses": [{"loss": "dice", "weight": 0}], )", "\"weight\" must be a finite number"},
        {R"("losses": [{"loss": "dice", "weight": "2"}], )", "\"weight\" must be a finite"},
        {R"("losses": [{"loss": "dice", "scale": 2}], )", "unknown key 'scale'"},
        {R"("losses": [3], )", "losses[0]: a term must be a JSON object"},
        {R"("losses": [)" + thirty_three_terms + "], ", "1 to 32 terms"},
    };
    for (const auto &b : bad) {
        write("bad.json", model(layers, b.first));
        tsl_graph_t x = nullptr;
        EXPECT_EQ(tsl_graph_read_json(path("bad.json").c_str(), 3, sample, 3, &x), TSL_ERR_FORMAT)
            << b.first;
        EXPECT_NE(std::string(tsl_last_error()).find(b.second), std::string::npos)
            << b.first << ": " << tsl_last_error();
        EXPECT_EQ(x, nullptr);
    }
    // The builder's own checks.
    tsl_loss_term zero = {TSL_MODEL_LOSS_DICE, 0.0};
    EXPECT_EQ(tsl_graph_set_loss(g, 1, &zero), TSL_ERR_INVALID_ARG);
    EXPECT_EQ(tsl_graph_set_loss(g, TSL_MAX_LOSS_TERMS + 1, terms), TSL_ERR_INVALID_ARG);
    EXPECT_EQ(tsl_graph_set_loss(g, 0, nullptr), TSL_OK);
    ASSERT_EQ(tsl_graph_loss(g, &count, terms), TSL_OK);
    EXPECT_EQ(count, 0);
    tsl_graph_destroy(g);
    tsl_graph_destroy(again);
    tsl_graph_destroy(none);
}

// Every op kind is in every_op_graph(), so a new kind must be written and read back to pass.
// Terms between values ("on", "against": layer names): read into the graph as 1 + the values,
// written back by name, and refused where they do not fit: a target of another shape, a class
// loss against a value, a value against the batch, the input as the value compared, no term on
// the batch, names of no earlier layer.
TEST_F(ModelJson, LossTermsBetweenValuesRoundTripAndBadOnesAreErrors)
{
    const std::string layers = R"({"op": "input"},
        {"name": "hc", "op": "conv", "out": 4, "kernel": 3, "padding": 1}, {"name": "h", "op": "relu"},
        {"name": "recon", "op": "conv", "out": 2, "kernel": 1},
        {"name": "feat", "op": "conv", "inputs": ["input"], "out": 4, "kernel": 1},
        {"name": "c", "op": "conv", "inputs": ["feat"], "out": "classes", "kernel": 1})";
    int64_t sample[3] = {2, 6, 5};
    write("aux.json", model(layers, R"("output": "c", "losses": [{"loss": "cross_entropy"},
        {"loss": "mse", "weight": 0.5, "on": "recon", "against": "input"},
        {"loss": "l1", "weight": 0.25, "on": "feat", "against": "h"}], )"));
    tsl_graph_t g = nullptr;
    ASSERT_EQ(tsl_graph_read_json(path("aux.json").c_str(), 3, sample, 3, &g), TSL_OK)
        << tsl_last_error();
    tsl_loss_term terms[TSL_MAX_LOSS_TERMS];
    int32_t count = -1;
    ASSERT_EQ(tsl_graph_loss(g, &count, terms), TSL_OK);
    ASSERT_EQ(count, 3);
    EXPECT_EQ(terms[0].on, 0);
    EXPECT_EQ(terms[0].against, 0);
    // values by creation: input 0, hc 1, h 2, recon 3, feat 4, c 5
    EXPECT_EQ(terms[1].kind, TSL_MODEL_LOSS_MSE);
    EXPECT_EQ(terms[1].on, 3 + 1);
    EXPECT_EQ(terms[1].against, 0 + 1);
    EXPECT_EQ(terms[2].kind, TSL_MODEL_LOSS_L1);
    EXPECT_EQ(terms[2].weight, 0.25);
    EXPECT_EQ(terms[2].on, 4 + 1);
    EXPECT_EQ(terms[2].against, 2 + 1);
    std::string text = print_json(g);
    EXPECT_NE(text.find(R"({"loss": "mse", "weight": 0.5, "on": "recon", "against": "input"})"),
              std::string::npos)
        << text;
    // (a ReLU layer's name is not kept: the writer names the value the term reads)
    EXPECT_NE(text.find(R"({"loss": "l1", "weight": 0.25, "on": "feat", "against": "relu_2"})"),
              std::string::npos)
        << text;
    // the difference of two values of other shapes: both take its gradient, written back
    write("diff.json", model(layers, R"("output": "c", "losses": [{"loss": "cross_entropy"},
        {"loss": "difference", "weight": 0.1, "on": "h", "against": "recon"}], )"));
    tsl_graph_t diff = nullptr;
    ASSERT_EQ(tsl_graph_read_json(path("diff.json").c_str(), 3, sample, 3, &diff), TSL_OK)
        << tsl_last_error();
    EXPECT_NE(print_json(diff).find(
                  R"({"loss": "difference", "weight": 0.1, "on": "relu_2", "against": "recon"})"),
              std::string::npos)
        << print_json(diff);
    tsl_graph_destroy(diff);
    // the similarity of two values with one number of features (h and feat: 4 x 6 x 5)
    write("sim.json", model(layers, R"("output": "c", "losses": [{"loss": "cross_entropy"},
        {"loss": "similarity", "weight": 0.2, "on": "feat", "against": "h"}], )"));
    tsl_graph_t sim = nullptr;
    ASSERT_EQ(tsl_graph_read_json(path("sim.json").c_str(), 3, sample, 3, &sim), TSL_OK)
        << tsl_last_error();
    ASSERT_EQ(tsl_graph_loss(sim, &count, terms), TSL_OK);
    ASSERT_EQ(count, 2);
    EXPECT_EQ(terms[1].kind, TSL_MODEL_LOSS_SIMILARITY);
    EXPECT_EQ(terms[1].on, 4 + 1);
    EXPECT_EQ(terms[1].against, 2 + 1);
    EXPECT_NE(print_json(sim).find(
                  R"({"loss": "similarity", "weight": 0.2, "on": "feat", "against": "relu_2"})"),
              std::string::npos)
        << print_json(sim);
    tsl_graph_destroy(sim);
    write("aux_again.json", text);
    tsl_graph_t again = nullptr;
    ASSERT_EQ(tsl_graph_read_json(path("aux_again.json").c_str(), 3, sample, 3, &again), TSL_OK)
        << tsl_last_error() << "\n"
        << text;
    EXPECT_EQ(print_json(again), text);
    tsl_graph_destroy(again);
    const std::pair<std::string, std::string> bad[] = {
        {R"("losses": [{"loss": "cross_entropy"}, {"loss": "mse", "on": "recon", "against": "h"}], )",
         "two different values of one shape"},
        {R"("losses": [{"loss": "cross_entropy"}, {"loss": "l1", "on": "h", "against": "h"}], )",
         "two different values of one shape"},
        {R"("losses": [{"loss": "cross_entropy"}, {"loss": "dice", "on": "h", "against": "feat"}], )",
         "a term against another value is mse, l1, difference or similarity"},
        {R"("losses": [{"loss": "cross_entropy"}, {"loss": "mse", "on": "h"}], )",
         "fit the output only"},
        {R"("losses": [{"loss": "cross_entropy"}, {"loss": "mse", "on": "input", "against": "recon"}], )",
         "reads the input"},
        {R"("losses": [{"loss": "mse", "on": "recon", "against": "input"}], )",
         "no term reads the batch's labels or targets"},
        {R"("losses": [{"loss": "cross_entropy"}, {"loss": "mse", "on": "rec", "against": "input"}], )",
         "losses[1]: \"on\" 'rec' is no layer's name"},
        {R"("losses": [{"loss": "cross_entropy"}, {"loss": "mse", "on": 3, "against": "input"}], )",
         "losses[1]: \"on\" must be a layer name"},
        {R"("losses": [{"loss": "cross_entropy", "against": "c"}], )",
         "a term against another value is mse, l1, difference or similarity"},
        {R"("losses": [{"loss": "cross_entropy"}, {"loss": "difference", "on": "h"}], )",
         "difference compares two values of the network: it needs against"},
        {R"("losses": [{"loss": "cross_entropy"}, {"loss": "difference", "on": "h", "against": "input"}], )",
         "difference with the input"},
        {R"("losses": [{"loss": "cross_entropy"}, {"loss": "difference", "on": "h", "against": "h"}], )",
         "difference of value 2 with itself"},
        {R"("losses": [{"loss": "cross_entropy"}, {"loss": "similarity", "on": "h", "against": "recon"}], )",
         "similarity of value 2 (120 features per sample) and value 3 (60)"},
        {R"("losses": [{"loss": "cross_entropy"}, {"loss": "similarity", "on": "feat"}], )",
         "similarity compares two values of the network: it needs against"},
        {R"("losses": [{"loss": "cross_entropy"}, {"loss": "similarity", "on": "h", "against": "input"}], )",
         "similarity with the input"},
        {R"("losses": [{"loss": "cross_entropy"}, {"loss": "similarity", "on": "h", "against": "h"}], )",
         "similarity of value 2 with itself"},
        {R"("losses": [{"loss": "cross_entropy"}, {"loss": "mmd", "on": "h", "against": "feat"}], )",
         "needs \"loss\", cross_entropy, dice, mse, l1, difference or similarity"},
    };
    for (const auto &b : bad) {
        write("bad.json", model(layers, R"("output": "c", )" + b.first));
        tsl_graph_t x = nullptr;
        EXPECT_EQ(tsl_graph_read_json(path("bad.json").c_str(), 3, sample, 3, &x), TSL_ERR_FORMAT)
            << b.first;
        EXPECT_NE(std::string(tsl_last_error()).find(b.second), std::string::npos)
            << b.first << ": " << tsl_last_error();
        EXPECT_EQ(x, nullptr);
    }
    // The builder's checks: values of this graph only; a term may name the output as the value.
    tsl_loss_term far = {TSL_MODEL_LOSS_MSE, 1.0, 0, 0};
    far.on = 7;
    far.against = 1;
    const tsl_loss_term ce = {TSL_MODEL_LOSS_CROSS_ENTROPY, 1.0, 0, 0};
    tsl_loss_term two[2] = {ce, far};
    EXPECT_EQ(tsl_graph_set_loss(g, 2, two), TSL_ERR_INVALID_ARG);
    two[1].on = -1;
    EXPECT_EQ(tsl_graph_set_loss(g, 2, two), TSL_ERR_INVALID_ARG);
    two[0].on = tsl_graph_output(g) + 1; // the output by name: a term on the batch
    two[1] = terms[1];
    EXPECT_EQ(tsl_graph_set_loss(g, 2, two), TSL_OK) << tsl_last_error();
    ASSERT_EQ(tsl_graph_loss(g, &count, terms), TSL_OK);
    EXPECT_EQ(count, 2);
    tsl_graph_destroy(g);
}

TEST_F(ModelJson, EveryOpGraphHasEveryKind)
{
    tsl_graph_t g = every_op_graph();
    std::vector<int> seen(TSL_OP_KIND_COUNT, 0);
    for (int32_t i = 0; i < tsl_graph_op_count(g); i++) {
        tsl_op_kind kind;
        ASSERT_EQ(tsl_graph_op_info(g, i, &kind, nullptr, nullptr), TSL_OK);
        ASSERT_LT((int)kind, TSL_OP_KIND_COUNT);
        seen[kind]++;
    }
    for (int k = 0; k < TSL_OP_KIND_COUNT; k++)
        EXPECT_GT(seen[k], 0) << "op kind " << tsl_op_kind_name((tsl_op_kind)k);
    tsl_graph_destroy(g);
}

// Every activation kind is written under a name of its own and read back as itself, with its
// slope where it takes one.
TEST_F(ModelJson, EveryActivationRoundTrips)
{
    std::vector<std::string> names;
    for (int k = 0; k < TSL_ACTIVATION_COUNT; k++) {
        tsl_graph_t g = nullptr;
        ASSERT_EQ(tsl_graph_create(&g), TSL_OK);
        int64_t sample[2] = {2, 9};
        int32_t v;
        ASSERT_EQ(tsl_graph_input(g, 2, sample, &v), TSL_OK);
        ASSERT_EQ(tsl_graph_activation(g, v, (tsl_activation)k, 0.375, &v), TSL_OK);
        ASSERT_EQ(tsl_graph_flatten(g, v, &v), TSL_OK);
        ASSERT_EQ(tsl_graph_linear(g, "head", v, 3, 1, &v), TSL_OK);
        ASSERT_EQ(tsl_graph_set_output(g, v), TSL_OK);
        std::string file = path("act" + std::to_string(k) + ".json");
        ASSERT_EQ(tsl_graph_write_json(g, file.c_str()), TSL_OK) << tsl_last_error();
        std::string text = read_text(file);
        size_t at = text.find("\"op\": \"", text.find("\"op\": \"input\"") + 1); // layer 1
        ASSERT_NE(at, std::string::npos) << text;
        std::string name = text.substr(at + 7, text.find('"', at + 7) - at - 7);
        for (const std::string &other : names)
            EXPECT_NE(name, other) << "two activation kinds written as one";
        names.push_back(name);
        tsl_graph_t read = nullptr;
        ASSERT_EQ(tsl_graph_read_json(file.c_str(), 2, sample, 3, &read), TSL_OK)
            << tsl_last_error();
        EXPECT_EQ(graph_difference(g, read), "") << name;
        EXPECT_EQ(read->ops[1].act, (tsl_activation)k) << name;
        EXPECT_EQ(read->ops[1].slope != 0, text.find("\"slope\"") != std::string::npos) << text;
        tsl_graph_destroy(read);
        tsl_graph_destroy(g);
    }
}

TEST_F(ModelJson, WrittenNamesDoNotCollide)
{
    // An unnamed layer whose natural name ("relu_2") is already a layer's name.
    tsl_graph_t g = nullptr;
    ASSERT_EQ(tsl_graph_create(&g), TSL_OK);
    int64_t sample[1] = {6};
    int32_t x, a, r, s;
    ASSERT_EQ(tsl_graph_input(g, 1, sample, &x), TSL_OK);
    ASSERT_EQ(tsl_graph_linear(g, "relu_2", x, 6, 1, &a), TSL_OK);
    ASSERT_EQ(tsl_graph_activation(g, a, TSL_ACT_RELU, 0, &r), TSL_OK);
    ASSERT_EQ(tsl_graph_add(g, r, a, &s), TSL_OK);
    ASSERT_EQ(tsl_graph_set_output(g, r), TSL_OK); // not the last op
    std::string text = print_json(g);
    EXPECT_NE(text.find("\"name\": \"relu_2_1\""), std::string::npos) << text;
    EXPECT_NE(text.find("\"output\": \"relu_2_1\""), std::string::npos) << text;
    tsl_graph_t read = nullptr;
    ASSERT_EQ(tsl_graph_parse_json(text.c_str(), 1, sample, 0, &read), TSL_OK) << tsl_last_error();
    EXPECT_EQ(graph_difference(g, read), "");
    tsl_graph_destroy(read);
    tsl_graph_destroy(g);
}

// Every padding mode is written by its name and read back as itself.
TEST(ModelJsonFormat, PaddingModesRoundTrip)
{
    const int64_t sample[3] = {2, 9, 8};
    for (const char *mode : {"reflect", "replicate", "circular"}) {
        SCOPED_TRACE(mode);
        std::string text = model(
            std::string(R"({"op": "input"},
            {"name": "c", "op": "conv", "out": 4, "kernel": 3, "padding": 1, "padding_mode": ")") +
            mode + R"("}, {"op": "flatten"}, {"name": "fc", "op": "linear", "out": "classes"})");
        tsl_graph_t g = nullptr;
        ASSERT_EQ(tsl_graph_parse_json(text.c_str(), 3, sample, 3, &g), TSL_OK) << tsl_last_error();
        int32_t conv = 0;
        while (conv < g->nops && g->ops[conv].kind != TSL_OP_CONV)
            conv++;
        ASSERT_LT(conv, g->nops);
        EXPECT_EQ(g->ops[conv].conv.padding_mode,
                  std::string(mode) == "reflect"     ? TSL_PADDING_REFLECT
                  : std::string(mode) == "replicate" ? TSL_PADDING_REPLICATE
                                                     : TSL_PADDING_CIRCULAR);
        std::string back = print_json(g);
        EXPECT_NE(back.find("\"padding_mode\": \"" + std::string(mode) + "\""), std::string::npos)
            << back;
        tsl_graph_t again = nullptr;
        ASSERT_EQ(tsl_graph_parse_json(back.c_str(), 3, sample, 3, &again), TSL_OK);
        EXPECT_EQ(graph_difference(g, again), "");
        tsl_graph_destroy(again);
        tsl_graph_destroy(g);
    }
}

TEST_F(ModelJson, WriteIsAtomicAndChecksItsArguments)
{
    tsl_graph_t g = every_op_graph();
    std::string file = path("m.json");
    write("m.json", "old contents");
    ASSERT_EQ(tsl_graph_write_json(g, file.c_str()), TSL_OK) << tsl_last_error();
    EXPECT_EQ(read_text(file), print_json(g));
    int files = 0;
    for (const auto &entry : fs::directory_iterator(dir))
        files += entry.is_regular_file();
    EXPECT_EQ(files, 1); // no temporary file left behind
    EXPECT_EQ(tsl_graph_write_json(g, path("no/such/dir/m.json").c_str()), TSL_ERR_IO);
    EXPECT_NE(std::strstr(tsl_last_error(), "no/such/dir/m.json"), nullptr) << tsl_last_error();
    EXPECT_EQ(tsl_graph_write_json(nullptr, file.c_str()), TSL_ERR_INVALID_ARG);
    EXPECT_EQ(tsl_graph_write_json(g, nullptr), TSL_ERR_INVALID_ARG);
    char *text = nullptr;
    EXPECT_EQ(tsl_graph_print_json(g, nullptr), TSL_ERR_INVALID_ARG);
    tsl_graph_t empty = nullptr;
    ASSERT_EQ(tsl_graph_create(&empty), TSL_OK);
    EXPECT_EQ(tsl_graph_print_json(empty, &text), TSL_ERR_STATE); // no output
    EXPECT_EQ(text, nullptr);
    EXPECT_NE(std::strstr(tsl_last_error(), "no output"), nullptr);
    tsl_graph_destroy(empty);
    // JSON has no infinities: a graph that holds one is refused, not written as null.
    g->ops[2].eps = INFINITY;
    EXPECT_EQ(tsl_graph_write_json(g, file.c_str()), TSL_ERR_INVALID_ARG);
    EXPECT_NE(std::strstr(tsl_last_error(), "'bn' has eps inf"), nullptr) << tsl_last_error();
    tsl_graph_destroy(g);
}

// ---- what files may say ----

TEST(ModelJsonFormat, DefaultsNamesOutputAndInputShape)
{
    int64_t sample[3] = {2, 8, 8};
    tsl_graph_t g = nullptr;
    // Inputs default to the previous layer; "output" may name an earlier layer; a named
    // unnamed-op layer can be read from; "shape" checks the data.
    std::string text = model(R"({"op": "input", "shape": [2, 8, 8]},
                 {"name": "c", "op": "conv", "out": 4, "kernel": [3, 1], "bias": false},
                 {"name": "act", "op": "relu"},
                 {"op": "maxpool", "kernel": 2, "stride": [2, 1]},
                 {"op": "upsample_nearest", "scale": [2, 1], "inputs": ["act"]})",
                             R"("description": "a test", "output": "act", )");
    ASSERT_EQ(tsl_graph_parse_json(text.c_str(), 3, sample, 0, &g), TSL_OK) << tsl_last_error();
    tsl_shape s;
    ASSERT_EQ(tsl_graph_value_shape(g, tsl_graph_output(g), &s), TSL_OK);
    EXPECT_EQ(shape_text(s), "4x6x8");
    EXPECT_EQ(tsl_graph_output(g), 2);
    ASSERT_EQ(tsl_graph_value_shape(g, 3, &s), TSL_OK);
    EXPECT_EQ(shape_text(s), "4x3x7");
    ASSERT_EQ(tsl_graph_value_shape(g, 4, &s), TSL_OK);
    EXPECT_EQ(shape_text(s), "4x12x8"); // read "act", not the pool
    EXPECT_EQ(g->ops[4].inputs[0], 2);
    EXPECT_EQ(g->ops[1].bias, 0);
    EXPECT_EQ(g->ops[3].pool.stride[0], 2);
    EXPECT_EQ(g->ops[3].pool.stride[1], 1);
    tsl_graph_destroy(g);
    // The same file for other data: "shape" refuses it.
    int64_t other[3] = {2, 9, 8};
    EXPECT_EQ(tsl_graph_parse_json(text.c_str(), 3, other, 0, &g), TSL_ERR_SHAPE);
    EXPECT_EQ(g, nullptr);
    EXPECT_NE(std::strstr(tsl_last_error(), "layers[0] 'input' (input): \"shape\" must be the "
                                            "samples' shape (C, spatial...), and the data's "
                                            "samples are 2x9x8"),
              nullptr)
        << tsl_last_error();
    // PyTorch's defaults: bias on, eps 1e-5, momentum 0.1, slope 0.01, pool stride = kernel.
    std::string defaults = model(R"({"op": "input"},
        {"name": "c", "op": "conv", "out": 3, "kernel": 3}, {"name": "b", "op": "batchnorm"},
        {"op": "leaky_relu"}, {"op": "avgpool", "kernel": 2},
        {"op": "flatten"}, {"name": "l", "op": "linear", "out": "classes"})");
    ASSERT_EQ(tsl_graph_parse_json(defaults.c_str(), 3, sample, 6, &g), TSL_OK) << tsl_last_error();
    EXPECT_EQ(g->ops[1].bias, 1);
    EXPECT_EQ(g->ops[2].eps, 1e-5);
    EXPECT_EQ(g->ops[2].momentum, 0.1);
    EXPECT_EQ(g->ops[3].slope, 0.01);
    EXPECT_EQ(g->ops[4].pool.stride[0], 2);
    EXPECT_EQ(g->ops[4].pool.count_include_pad, 1);
    EXPECT_EQ(g->ops[6].bias, 1);
    ASSERT_EQ(tsl_graph_value_shape(g, tsl_graph_output(g), &s), TSL_OK);
    EXPECT_EQ(shape_text(s), "6");
    tsl_graph_destroy(g);
    // Without a class count, "classes" is an error that says so.
    EXPECT_EQ(tsl_graph_parse_json(defaults.c_str(), 3, sample, 0, &g), TSL_ERR_INVALID_ARG);
    EXPECT_NE(std::strstr(tsl_last_error(), "layers[6] 'l' (linear): \"out\": \"classes\" needs "
                                            "the data's class count"),
              nullptr)
        << tsl_last_error();
}

// "stage" puts a layer on a pipeline stage by hand (tsl_graph_set_stage()); a written graph
// keeps its stages; a stage that is not an integer >= 0 is an error.
TEST(ModelJsonFormat, StagesByHandRoundTrip)
{
    int64_t sample[3] = {1, 8, 8};
    tsl_graph_t g = nullptr;
    std::string text = model(R"({"op": "input"},
                 {"name": "c", "op": "conv", "out": 4, "kernel": 3, "stage": 0},
                 {"op": "relu", "stage": 1}, {"op": "flatten"},
                 {"name": "l", "op": "linear", "out": 3, "stage": 1})");
    ASSERT_EQ(tsl_graph_parse_json(text.c_str(), 3, sample, 0, &g), TSL_OK) << tsl_last_error();
    const int32_t want[5] = {-1, 0, 1, -1, 1};
    for (int32_t v = 0; v < 5; v++)
        EXPECT_EQ(tsl_graph_stage(g, v), want[v]) << v;
    char *written = nullptr;
    ASSERT_EQ(tsl_graph_print_json(g, &written), TSL_OK);
    tsl_graph_t back = nullptr;
    ASSERT_EQ(tsl_graph_parse_json(written, 3, sample, 3, &back), TSL_OK)
        << written << tsl_last_error();
    for (int32_t v = 0; v < 5; v++)
        EXPECT_EQ(tsl_graph_stage(back, v), want[v]) << v;
    free(written);
    tsl_graph_destroy(back);
    tsl_graph_destroy(g);
    for (const char *bad : {"-1", "1.5", "\"two\""}) {
        std::string t =
            model(std::string(R"({"op": "input"}, {"op": "relu", "stage": )") + bad + "}");
        EXPECT_EQ(tsl_graph_parse_json(t.c_str(), 3, sample, 0, &g), TSL_ERR_FORMAT) << bad;
        EXPECT_NE(std::strstr(tsl_last_error(), "'stage' must be an integer >= 0"), nullptr)
            << tsl_last_error();
    }
}

struct BadFile {
    const char *what;
    std::string text;
    tsl_status status;
    const char *message; // a part of the error message
};

TEST_F(ModelJson, BadFilesAreErrorsThatSayWhy)
{
    const std::string in = R"({"op": "input"}, )", input_only = R"({"op": "input"})";
    const std::string deep = std::string(2000, '[') + std::string(2000, ']');
    std::string concat9 = model(in + R"({"op": "concat", "inputs": ["input", "input", "input",
        "input", "input", "input", "input", "input", "input"]})");
    const std::vector<BadFile> bad = {
        {"malformed JSON", "{\"format\": \"tessel-model\",\n  \"version\": 1\n  \"layers\": []}",
         TSL_ERR_FORMAT, "malformed JSON at line 3, column 3 (near '\"layers\": []}')"},
        {"empty text", "", TSL_ERR_FORMAT, "malformed JSON at line 1, column 1 (at the end)"},
        {"trailing text", model(in + R"({"op": "relu"})") + " x", TSL_ERR_FORMAT,
         "malformed JSON at line 1"},
        {"nested too deep", deep, TSL_ERR_FORMAT, "malformed JSON"},
        {"not an object", "[1, 2]", TSL_ERR_FORMAT, "a model file is a JSON object"},
        {"another format", R"({"format": "onnx", "version": 1, "layers": []})", TSL_ERR_FORMAT,
         "not a model file: needs \"format\": \"tessel-model\""},
        {"no version", R"({"format": "tessel-model", "layers": [{"op": "input"}]})", TSL_ERR_FORMAT,
         "needs \"version\", an integer >= 1"},
        {"newer version", R"({"format": "tessel-model", "version": 2, "layers": []})",
         TSL_ERR_UNSUPPORTED, "format version 2 is newer than this tessel reads (1)"},
        {"unknown top-level key", model(input_only, R"("outputs": "x", )"), TSL_ERR_FORMAT,
         "unknown key 'outputs' (a model file takes: format, version, description, layers, "
         "output, losses)"},
        {"key given twice", model(R"({"op": "input", "op": "input"})"), TSL_ERR_FORMAT,
         "layers[0] (input): key 'op' is given twice"},
        {"no layers", model(""), TSL_ERR_FORMAT, "needs \"layers\", a non-empty array of layers"},
        {"a layer that is no object", model(in + "3"), TSL_ERR_FORMAT,
         "layers[1]: a layer must be a JSON object"},
        {"no op", model(in + R"({"name": "a"})"), TSL_ERR_FORMAT,
         "layers[1] 'a': needs \"op\", a string"},
        {"unknown op", model(in + R"({"name": "c", "op": "convolution"})"), TSL_ERR_FORMAT,
         "layers[1] 'c': unknown op 'convolution' (ops: input, conv,"},
        {"no input layer first", model(R"({"name": "c", "op": "conv", "out": 2, "kernel": 1})"),
         TSL_ERR_FORMAT,
         "layers[0] 'c' (conv): the first layer must be the input ({\"op\": \"input\"})"},
        {"a second input without its shape", model(in + R"({"name": "x", "op": "input"})"),
         TSL_ERR_FORMAT,
         "layers[1] 'x' (input): an input after the first needs \"shape\": its sample shape"},
        {"a second input without a name", model(in + R"({"op": "input", "shape": [2]})"),
         TSL_ERR_FORMAT, "layers[1] (input): an input after the first needs a \"name\""},
        {"a second input of a bad shape",
         model(in + R"({"name": "x", "op": "input", "shape": [2, 0]})"), TSL_ERR_FORMAT,
         "layers[1] 'x' (input): an input after the first needs \"shape\""},
        {"misspelt key", model(in + R"({"name": "c", "op": "conv", "out": 2, "kernal": 3})"),
         TSL_ERR_FORMAT,
         "layers[1] 'c' (conv): unknown key 'kernal' (a conv layer takes: name, op, inputs, out, "
         "kernel, stride, padding, dilation, groups, bias, stage, padding_mode, share)"},
        {"unknown padding mode",
         model(in + R"({"name": "c", "op": "conv", "out": 2, "kernel": 3, "padding": 1,
         "padding_mode": "periodic"})"),
         TSL_ERR_FORMAT,
         "layers[1] 'c' (conv): 'padding_mode' must be \"zeros\", \"reflect\", \"replicate\" or "
         "\"circular\""},
        {"circular padding round the input more than once",
         model(in + R"({"name": "c", "op": "conv", "out": 2, "kernel": 3, "padding": 8,
         "padding_mode": "circular"})"),
         TSL_ERR_SHAPE, "wraps round the input of 7 more than once"},
        {"padding mode on a transposed convolution",
         model(in + R"({"name": "t", "op": "conv_transpose", "out": 2, "kernel": 3,
         "padding_mode": "reflect"})"),
         TSL_ERR_FORMAT, "unknown key 'padding_mode'"},
        {"reflect padding over half the kernel",
         model(in + R"({"name": "c", "op": "conv", "out": 2, "kernel": 3, "padding": 2,
         "padding_mode": "reflect"})"),
         TSL_ERR_SHAPE, "2 x padding <= dilation x (kernel - 1)"},
        {"a key of another op", model(in + R"({"op": "relu", "kernel": 3})"), TSL_ERR_FORMAT,
         "layers[1] (relu): unknown key 'kernel' (a relu layer takes: name, op, inputs, stage)"},
        {"kernel of the wrong type", model(in + R"({"name": "c", "op": "conv", "out": 2,
         "kernel": "3"})"),
         TSL_ERR_FORMAT,
         "layers[1] 'c' (conv): 'kernel' must be an integer >= 1 or an array of 2 of them (one "
         "per spatial dimension of its input)"},
        {"kernel for three dimensions on 2-D data",
         model(in + R"({"name": "c", "op": "conv", "out": 2, "kernel": [3, 3, 3]})"),
         TSL_ERR_FORMAT, "'kernel' must be an integer >= 1 or an array of 2 of them"},
        {"fractional stride",
         model(in + R"({"name": "c", "op": "conv", "out": 2, "kernel": 3, "stride": 1.5})"),
         TSL_ERR_FORMAT, "'stride' must be an integer >= 1 or an array of 2"},
        {"negative padding", model(in + R"({"op": "maxpool", "kernel": 2, "padding": -1})"),
         TSL_ERR_FORMAT, "layers[1] (maxpool): 'padding' must be an integer >= 0"},
        {"no kernel", model(in + R"({"name": "c", "op": "conv", "out": 2})"), TSL_ERR_FORMAT,
         "layers[1] 'c' (conv): 'kernel' is required"},
        {"no out", model(in + R"({"name": "c", "op": "conv", "kernel": 1})"), TSL_ERR_FORMAT,
         "layers[1] 'c' (conv): 'out' is required"},
        {"out misspelt classes", model(in + R"({"name": "c", "op": "conv", "out": "clases",
         "kernel": 1})"),
         TSL_ERR_FORMAT, "'out' must be an integer >= 1 or \"classes\""},
        {"out too large", model(in + R"({"name": "c", "op": "conv", "out": 1e12, "kernel": 1})"),
         TSL_ERR_FORMAT, "'out' must be an integer >= 1 or \"classes\""},
        {"bias as a number", model(in + R"({"name": "c", "op": "conv", "out": 2, "kernel": 1,
         "bias": 0})"),
         TSL_ERR_FORMAT, "layers[1] 'c' (conv): 'bias' must be true or false"},
        {"eps as a string", model(in + R"({"name": "b", "op": "batchnorm", "eps": "small"})"),
         TSL_ERR_FORMAT, "layers[1] 'b' (batchnorm): 'eps' must be a finite number"},
        {"infinite slope", model(in + R"({"op": "leaky_relu", "slope": 1e999})"), TSL_ERR_FORMAT,
         "'slope' must be a finite number"},
        {"h as a string", model(in + R"({"name": "r", "op": "relu"}, {"name": "s", "op": "add",
         "inputs": ["r", "r"], "h": "tiny"})"),
         TSL_ERR_FORMAT, "layers[2] 's' (add): 'h' must be a finite number"},
        {"h zero", model(in + R"({"name": "r", "op": "relu"}, {"name": "s", "op": "add",
         "inputs": ["r", "r"], "h": 0})"),
         TSL_ERR_INVALID_ARG, "layers[2] 's' (add): h 0 must be finite and nonzero"},
        {"h on a relu", model(in + R"({"op": "relu", "h": 0.5})"), TSL_ERR_FORMAT,
         "unknown key 'h'"},
        {"h on an add of three", model(in + R"({"name": "r", "op": "relu"}, {"name": "s",
         "op": "add", "inputs": ["r", "r", "r"], "h": 0.5})"),
         TSL_ERR_FORMAT, "layers[2] 's' (add): 'h' takes an add of two inputs, not 3"},
        {"an add of nine", model(in + R"({"name": "r", "op": "relu"}, {"name": "s", "op": "add",
         "inputs": ["r", "r", "r", "r", "r", "r", "r", "r", "r"]})"),
         TSL_ERR_FORMAT, "layers[2] 's' (add): \"inputs\" must be an array of 2 to 8 layer names"},
        {"eps the builder refuses", model(in + R"({"name": "b", "op": "batchnorm", "eps": -1})"),
         TSL_ERR_INVALID_ARG,
         "layers[1] 'b' (batchnorm): 'b' needs eps > 0 and momentum in [0, 1]"},
        {"a conv without a name", model(in + R"({"op": "conv", "out": 2, "kernel": 1})"),
         TSL_ERR_FORMAT, "layers[1] (conv): a conv layer needs a \"name\""},
        {"a name that is no string", model(in + R"({"name": 7, "op": "relu"})"), TSL_ERR_FORMAT,
         "layers[1] (relu): \"name\" must be a non-empty string"},
        {"a name used twice", model(in + R"({"name": "a", "op": "relu"}, {"name": "a",
         "op": "tanh"})"),
         TSL_ERR_FORMAT, "layers[2] 'a' (tanh): the name 'a' is already used by layers[1]"},
        {"a name the graph refuses", model(in + R"({"name": "a/b", "op": "batchnorm"})"),
         TSL_ERR_INVALID_ARG, "layers[1] 'a/b' (batchnorm): name 'a/b' may hold only printable"},
        {"an unknown input", model(in + R"({"op": "relu", "inputs": ["conv9"]})"), TSL_ERR_FORMAT,
         "layers[1] (relu): input 'conv9' is no layer's name"},
        {"a later input", model(in + R"({"op": "relu", "inputs": ["t"]}, {"name": "t",
         "op": "tanh"})"),
         TSL_ERR_FORMAT,
         "layers[1] (relu): input 't' is layers[2], not an earlier layer (layers read earlier "
         "layers only)"},
        {"inputs as a string", model(in + R"({"op": "relu", "inputs": "input"})"), TSL_ERR_FORMAT,
         "\"inputs\" must be an array of 1 layer name, not another type"},
        {"inputs that are no names", model(in + R"({"op": "concat", "inputs": [0]})"),
         TSL_ERR_FORMAT, "\"inputs\" must hold layer names (strings)"},
        {"add without inputs", model(in + R"({"op": "relu"}, {"op": "add"})"), TSL_ERR_FORMAT,
         "layers[2] (add): needs \"inputs\": the names of its 2 inputs"},
        {"add with one input", model(in + R"({"op": "add", "inputs": ["input"]})"), TSL_ERR_FORMAT,
         "layers[1] (add): \"inputs\" must be an array of 2 to 8 layer names"},
        {"concat of nine", concat9, TSL_ERR_FORMAT,
         "layers[1] (concat): \"inputs\" must be an array of 1 to 8 layer names"},
        {"linear before flatten", model(in + R"({"name": "fc", "op": "linear", "out": 3})"),
         TSL_ERR_SHAPE,
         "layers[1] 'fc' (linear): 'fc' needs a flat input (features), not 3 "
         "dimensions; flatten it first"},
        {"a pool larger than its input", model(in + R"({"op": "maxpool", "kernel": 64})"),
         TSL_ERR_SHAPE, "layers[1] (maxpool): pooling: kernel 64 larger than the padded input"},
        {"a conv on flat features", model(in + R"({"op": "flatten"}, {"name": "c", "op": "conv",
         "out": 2, "kernel": 1})"),
         TSL_ERR_SHAPE,
         "layers[2] 'c' (conv): needs an input with channels and 1 to 3 spatial dimensions, not "
         "of shape 98"},
        {"an add of two shapes", model(in + R"({"op": "maxpool", "kernel": 2, "name": "p"},
         {"op": "add", "inputs": ["input", "p"]})"),
         TSL_ERR_SHAPE, "layers[2] (add): the two values differ in shape"},
        {"an upsampling by zero", model(in + R"({"op": "upsample_linear", "scale": 0})"),
         TSL_ERR_FORMAT, "layers[1] (upsample_linear): 'scale' must be an integer >= 1"},
        {"an upsampling too large", model(in + R"({"op": "upsample_linear", "scale": 4096})"),
         TSL_ERR_INVALID_ARG, "layers[1] (upsample_linear): scale 4096 outside [1, 1024]"},
        {"an upsampling by scale and to a size",
         model(in + R"({"op": "upsample_nearest", "scale": 2, "size": 9})"), TSL_ERR_FORMAT,
         "layers[1] (upsample_nearest): 'scale' and 'size' exclude each other"},
        {"an upsampling by nothing", model(in + R"({"op": "upsample_nearest"})"), TSL_ERR_FORMAT,
         "layers[1] (upsample_nearest): 'scale' or 'size' is required"},
        {"an upsampling to no size", model(in + R"({"op": "upsample_linear", "size": [9, 0]})"),
         TSL_ERR_FORMAT,
         "layers[1] (upsample_linear): 'size' must be an integer >= 1 or an array of 2 of them "
         "(one per spatial dimension of its input)"},
        {"an upsampling too large", model(in + R"({"op": "upsample_linear", "size": 20000000})"),
         TSL_ERR_INVALID_ARG, "layers[1] (upsample_linear): size 20000000 outside [1, 2^24]"},
        {"a share of an unknown layer",
         model(in + R"({"name": "c", "op": "conv", "out": 2, "kernel": 3, "share": "d"})"),
         TSL_ERR_FORMAT, "layers[1] 'c' (conv): the shared layer 'd' is no layer's name"},
        {"a share of a later layer",
         model(in + R"({"name": "c", "op": "conv", "out": 2, "kernel": 3, "share": "d"},
                       {"name": "d", "op": "conv", "out": 2, "kernel": 3})"),
         TSL_ERR_FORMAT, "the shared layer 'd' is layers[2], not an earlier layer"},
        {"a share that is no name",
         model(in + R"({"name": "c", "op": "conv", "out": 2, "kernel": 3, "share": 1})"),
         TSL_ERR_FORMAT, "'share' must be the name of an earlier layer"},
        {"a shared parameter of another shape",
         model(in + R"({"name": "c", "op": "conv", "out": 3, "kernel": 3, "padding": 1},
                       {"name": "d", "op": "conv", "out": 3, "kernel": 3, "padding": 1,
                        "share": "c"})"),
         TSL_ERR_SHAPE,
         "layers[2] 'd' (conv): 'd.weight' shares 'c.weight' of another shape (its input's "
         "channels or features differ)"},
        {"a share across kinds", model(in + R"({"name": "c", "op": "conv", "out": 2, "kernel": 1},
                       {"name": "d", "op": "conv_transpose", "out": 2, "kernel": 1,
                        "share": "c"})"),
         TSL_ERR_INVALID_ARG, "'d' and 'c' differ in kind or attributes"},
        {"a share with other attributes",
         model(in + R"({"name": "c", "op": "conv", "out": 2, "kernel": 3, "padding": 1},
                       {"name": "d", "op": "conv", "out": 2, "kernel": 3, "padding": 1,
                        "stride": 2, "share": "c"})"),
         TSL_ERR_INVALID_ARG, "'d' and 'c' differ in kind or attributes"},
        {"a shared batch norm",
         model(in + R"({"name": "b", "op": "batchnorm"}, {"name": "d", "op": "batchnorm",
                        "share": "b"})"),
         TSL_ERR_FORMAT, "unknown key 'share'"},
        {"an unknown output", model(in + R"({"op": "relu"})", R"("output": "logits", )"),
         TSL_ERR_FORMAT, "the output 'logits' is no layer's name"},
        {"an output that is no name", model(input_only, R"("output": 1, )"), TSL_ERR_FORMAT,
         "\"output\" must be a layer name (a string)"},
        {"a description that is no string", model(input_only, R"("description": [], )"),
         TSL_ERR_FORMAT, "\"description\" must be a string"},
        {"an input shape of other data", model(R"({"op": "input", "shape": [1, 28]})"),
         TSL_ERR_SHAPE,
         "\"shape\" must be the samples' shape (C, spatial...), and the data's "
         "samples are 2x7x7"},
    };
    ASSERT_GE(bad.size(), 15u);
    int64_t sample[3] = {2, 7, 7};
    for (const BadFile &b : bad) {
        tsl_graph_t g = reinterpret_cast<tsl_graph_t>(&g); // must be reset to NULL
        EXPECT_EQ(tsl_graph_parse_json(b.text.c_str(), 3, sample, 10, &g), b.status) << b.what;
        EXPECT_EQ(g, nullptr) << b.what;
        std::string message = tsl_last_error();
        EXPECT_EQ(message.rfind("model JSON: ", 0), 0u) << b.what << ": " << message;
        EXPECT_NE(message.find(b.message), std::string::npos)
            << b.what << ":\n  got  " << message << "\n  want " << b.message;
        // From a file, the message starts with its path.
        write("bad.json", b.text);
        g = nullptr;
        EXPECT_EQ(tsl_graph_read_json(path("bad.json").c_str(), 3, sample, 10, &g), b.status)
            << b.what;
        EXPECT_EQ(g, nullptr);
        message = tsl_last_error();
        EXPECT_EQ(message.rfind(path("bad.json") + ": ", 0), 0u) << message;
        EXPECT_NE(message.find(b.message), std::string::npos) << b.what << ": " << message;
    }
}

TEST_F(ModelJson, FilesThatCannotBeReadAndBadArguments)
{
    int64_t sample[3] = {1, 28, 28};
    tsl_graph_t g = nullptr;
    EXPECT_EQ(tsl_graph_read_json(path("missing.json").c_str(), 3, sample, 10, &g), TSL_ERR_IO);
    EXPECT_NE(std::strstr(tsl_last_error(), "cannot open the model file"), nullptr);
    EXPECT_EQ(tsl_graph_read_json(dir.c_str(), 3, sample, 10, &g), TSL_ERR_IO); // a folder
    write("nul.json", std::string("{\"format\": \"tessel-model\"\0}", 27));
    EXPECT_EQ(tsl_graph_read_json(path("nul.json").c_str(), 3, sample, 10, &g), TSL_ERR_FORMAT);
    EXPECT_NE(std::strstr(tsl_last_error(), "NUL byte"), nullptr) << tsl_last_error();
    EXPECT_EQ(g, nullptr);
    std::string ok = model(R"({"op": "input"})");
    EXPECT_EQ(tsl_graph_parse_json(nullptr, 3, sample, 10, &g), TSL_ERR_INVALID_ARG);
    EXPECT_EQ(tsl_graph_parse_json(ok.c_str(), 3, nullptr, 10, &g), TSL_ERR_INVALID_ARG);
    EXPECT_EQ(tsl_graph_parse_json(ok.c_str(), 0, sample, 10, &g), TSL_ERR_INVALID_ARG);
    EXPECT_EQ(tsl_graph_parse_json(ok.c_str(), 5, sample, 10, &g), TSL_ERR_INVALID_ARG);
    EXPECT_EQ(tsl_graph_parse_json(ok.c_str(), 3, sample, -1, &g), TSL_ERR_INVALID_ARG);
    EXPECT_EQ(tsl_graph_parse_json(ok.c_str(), 3, sample, 10, nullptr), TSL_ERR_INVALID_ARG);
    ASSERT_EQ(tsl_graph_parse_json(ok.c_str(), 3, sample, 10, &g), TSL_OK) << tsl_last_error();
    EXPECT_EQ(tsl_graph_output(g), 0); // the input alone is a network
    tsl_graph_destroy(g);
}

// ---- a zoo name or a file ----

TEST_F(ModelJson, ModelGraphTakesZooNamesAndFiles)
{
    int64_t sample[3] = {1, 28, 28};
    tsl_graph_t zoo = nullptr, named = nullptr, file = nullptr, local = nullptr, g = nullptr;
    ASSERT_EQ(tsl_zoo_graph("cnn", 3, sample, 10, &zoo), TSL_OK);
    ASSERT_EQ(tsl_model_graph("cnn", 3, sample, 10, &named), TSL_OK) << tsl_last_error();
    EXPECT_EQ(graph_difference(zoo, named), "");
    // A path (with '/') is a file, whatever its name ends in.
    std::string cnn_json = read_text(examples_dir / "cnn.json");
    ASSERT_FALSE(cnn_json.empty());
    write("cnn", cnn_json);
    ASSERT_EQ(tsl_model_graph(path("cnn").c_str(), 3, sample, 10, &file), TSL_OK)
        << tsl_last_error();
    EXPECT_EQ(graph_difference(zoo, file), "");
    // A name ending in .json is a file in the working directory.
    write("small.json", model(R"({"op": "input"}, {"op": "flatten"},
                                 {"name": "fc", "op": "linear", "out": "classes"})"));
    fs::path cwd = fs::current_path();
    fs::current_path(dir);
    tsl_status st = tsl_model_graph("small.json", 3, sample, 10, &local);
    fs::current_path(cwd);
    ASSERT_EQ(st, TSL_OK) << tsl_last_error();
    EXPECT_EQ(tsl_graph_param_count(local), 2);
    // Neither: the zoo's error, with a word about files.
    EXPECT_EQ(tsl_model_graph("nosuch", 3, sample, 10, &g), TSL_ERR_INVALID_ARG);
    EXPECT_NE(std::strstr(tsl_last_error(), "no network named 'nosuch'"), nullptr);
    EXPECT_NE(std::strstr(tsl_last_error(), "ending in .json"), nullptr) << tsl_last_error();
    EXPECT_EQ(tsl_model_graph("nosuch.json", 3, sample, 10, &g), TSL_ERR_IO);
    EXPECT_EQ(tsl_model_graph(path("nosuch").c_str(), 3, sample, 10, &g), TSL_ERR_IO);
    // A zoo network that refuses the data keeps the zoo's message.
    int64_t tiny[3] = {1, 3, 3};
    EXPECT_EQ(tsl_model_graph("cnn", 3, tiny, 10, &g), TSL_ERR_SHAPE);
    EXPECT_EQ(std::strstr(tsl_last_error(), ".json"), nullptr) << tsl_last_error();
    EXPECT_EQ(tsl_model_graph(nullptr, 3, sample, 10, &g), TSL_ERR_INVALID_ARG);
    EXPECT_EQ(g, nullptr);
    tsl_graph_destroy(zoo);
    tsl_graph_destroy(named);
    tsl_graph_destroy(file);
    tsl_graph_destroy(local);
}

} // namespace

// A slice that keeps all of space is written as "channels": [c0, c1] (so the file adapts to the
// data's size, as the zoo's dsn.json does), any other box as start and stop; both read back as
// they were; a slice given both ways, or channels that are not two integers, is an error.
TEST_F(ModelJson, SliceWritesChannelsOrABox)
{
    tsl_graph_t g = nullptr;
    ASSERT_EQ(tsl_graph_create(&g), TSL_OK);
    const int64_t sample[3] = {4, 6, 5}, c_lo[3] = {1, 0, 0}, c_hi[3] = {3, 6, 5},
                  b_lo[3] = {0, 1, 0}, b_hi[3] = {2, 5, 5};
    int32_t x, c, b;
    ASSERT_EQ(tsl_graph_input(g, 3, sample, &x), TSL_OK);
    ASSERT_EQ(tsl_graph_slice(g, x, c_lo, c_hi, &c), TSL_OK);
    ASSERT_EQ(tsl_graph_slice(g, c, b_lo, b_hi, &b), TSL_OK);
    ASSERT_EQ(tsl_graph_set_output(g, b), TSL_OK);
    const std::string file = path("slices.json");
    ASSERT_EQ(tsl_graph_write_json(g, file.c_str()), TSL_OK) << tsl_last_error();
    const std::string text = read_text(file);
    EXPECT_NE(text.find(R"("op": "slice", "channels": [1, 3]})"), std::string::npos) << text;
    EXPECT_NE(text.find(R"("start": [0, 1, 0], "stop": [2, 5, 5])"), std::string::npos) << text;
    tsl_graph_t read = nullptr;
    ASSERT_EQ(tsl_graph_read_json(file.c_str(), 3, sample, 3, &read), TSL_OK) << tsl_last_error();
    EXPECT_EQ(graph_difference(g, read), "");
    // the channels form on larger samples: all of their space
    const int64_t larger[3] = {4, 9, 7};
    tsl_graph_t big = nullptr;
    ASSERT_EQ(tsl_graph_read_json(file.c_str(), 3, larger, 3, &big), TSL_OK) << tsl_last_error();
    tsl_shape s;
    ASSERT_EQ(tsl_graph_value_shape(big, 1, &s), TSL_OK);
    EXPECT_EQ(shape_text(s), "2x9x7");
    tsl_graph_destroy(big);
    tsl_graph_destroy(read);
    tsl_graph_destroy(g);
    const std::pair<std::string, std::string> bad[] = {
        {R"({"op": "slice", "channels": [0, 1], "start": [0, 0, 0], "stop": [1, 6, 5]})",
         "give 'channels' or 'start' and 'stop', not both"},
        {R"({"op": "slice", "channels": [0]})", "'channels' must be [first, end]"},
        {R"({"op": "slice", "channels": [2, 1]})",
         "axis 0: [2, 1) is not a non-empty range of [0, 4)"},
        {R"({"op": "slice", "channels": "all"})", "'channels' must be [first, end]"},
    };
    for (const auto &e : bad) {
        write("bad.json",
              R"({"format": "tessel-model", "version": 1, "layers": [{"op": "input"}, )" + e.first +
                  "]}");
        tsl_graph_t none = nullptr;
        EXPECT_NE(tsl_graph_read_json(path("bad.json").c_str(), 3, sample, 3, &none), TSL_OK)
            << e.first;
        EXPECT_NE(std::string(tsl_last_error()).find(e.second), std::string::npos)
            << e.first << ": " << tsl_last_error();
        EXPECT_EQ(none, nullptr);
    }
}

// A network of several inputs: the first takes the data's shape, the others their own
// ("shape", required, written back); one of another shape feeds a linear layer.
TEST_F(ModelJson, SeveralInputsRoundTrip)
{
    tsl_graph_t g = nullptr;
    ASSERT_EQ(tsl_graph_create(&g), TSL_OK);
    const int64_t sample[3] = {2, 6, 5}, bd[3] = {3, 6, 5}, vd[1] = {4}, k[2] = {3, 3};
    tsl_conv_params cp;
    tsl_conv_params_init(&cp, 2);
    cp.padding[0] = cp.padding[1] = 1;
    int32_t x, b, v, y;
    ASSERT_EQ(tsl_graph_input(g, 3, sample, &x), TSL_OK);
    ASSERT_EQ(tsl_graph_add_input(g, "b", 3, bd, &b), TSL_OK);
    ASSERT_EQ(tsl_graph_add_input(g, "v", 1, vd, &v), TSL_OK);
    ASSERT_EQ(tsl_graph_conv(g, "cx", x, 4, k, &cp, 0, 1, &x), TSL_OK);
    ASSERT_EQ(tsl_graph_conv(g, "cb", b, 4, k, &cp, 0, 1, &b), TSL_OK);
    ASSERT_EQ(tsl_graph_add(g, x, b, &y), TSL_OK);
    ASSERT_EQ(tsl_graph_flatten(g, y, &y), TSL_OK);
    ASSERT_EQ(tsl_graph_linear(g, "fy", y, 3, 1, &y), TSL_OK);
    ASSERT_EQ(tsl_graph_linear(g, "fv", v, 3, 1, &v), TSL_OK);
    ASSERT_EQ(tsl_graph_add(g, y, v, &y), TSL_OK);
    ASSERT_EQ(tsl_graph_set_output(g, y), TSL_OK);
    const std::string file = path("inputs.json");
    ASSERT_EQ(tsl_graph_write_json(g, file.c_str()), TSL_OK) << tsl_last_error();
    const std::string text = read_text(file);
    EXPECT_NE(text.find(R"({"name": "b", "op": "input", "shape": [3, 6, 5]})"), std::string::npos)
        << text;
    EXPECT_NE(text.find(R"({"name": "v", "op": "input", "shape": [4]})"), std::string::npos)
        << text;
    tsl_graph_t read = nullptr;
    ASSERT_EQ(tsl_graph_read_json(file.c_str(), 3, sample, 3, &read), TSL_OK) << tsl_last_error();
    EXPECT_EQ(graph_difference(g, read), "");
    ASSERT_EQ(tsl_graph_input_count(read), 3);
    tsl_shape s;
    ASSERT_EQ(tsl_graph_value_shape(read, tsl_graph_input_value(read, 2), &s), TSL_OK);
    EXPECT_EQ(shape_text(s), "4");
    // the first input follows the data, the others keep their shapes: b no longer fits x
    const int64_t larger[3] = {2, 7, 5};
    tsl_graph_t none = nullptr;
    EXPECT_EQ(tsl_graph_read_json(file.c_str(), 3, larger, 3, &none), TSL_ERR_SHAPE);
    EXPECT_NE(std::string(tsl_last_error()).find("differ in shape"), std::string::npos)
        << tsl_last_error();
    tsl_graph_destroy(read);
    tsl_graph_destroy(g);
}
