// Samples read by the owners of their tiles (tsl_tensors_read_samples): for every grid, owner
// map, layout and label type, the tiles hold exactly the batch that tsl_dataset_read() gives
// whole, poisoned tiles included; ranks that disagree on the batch, tensors that do not fit
// the dataset, and a file that breaks after it was opened are errors on every rank.
#include <gtest/gtest.h>
#include <hdf5.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <sys/stat.h>
#include <unistd.h>
#include <vector>

#include "../target_storage.h"
#include "model_test.h"
#include "mpi_test_env.h"

using namespace tsltest;

namespace
{

std::vector<uint8_t> gather_bytes(tsl_tensor_t t, size_t elem)
{
    tsl_shape s;
    tsl_tensor_shape(t, &s);
    std::vector<uint8_t> v((size_t)tsl_shape_numel(&s) * elem);
    EXPECT_EQ(tsl_tensor_gather(t, 0, rank == 0 ? v.data() : nullptr), TSL_OK)
        << tsl_context_last_error(ctx);
    return v;
}

// Scatter `value` bytes repeated into every element (a poison the read must overwrite).
void poison(tsl_tensor_t t, size_t elem, uint8_t value)
{
    tsl_shape s;
    tsl_tensor_shape(t, &s);
    std::vector<uint8_t> v((size_t)tsl_shape_numel(&s) * elem, value);
    ASSERT_EQ(tsl_tensor_scatter(t, 0, rank == 0 ? v.data() : nullptr), TSL_OK);
}

// A directory on the shared file system, made by rank 0, removed at the end.
struct SharedDir {
    std::string path;
    SharedDir()
    {
        char name[64] = {0};
        if (rank == 0) {
            std::snprintf(name, sizeof name, "/tmp/tessel-read-XXXXXX");
            EXPECT_NE(mkdtemp(name), nullptr);
        }
        MPI_Bcast(name, sizeof name, MPI_CHAR, 0, MPI_COMM_WORLD);
        path = name;
    }
    ~SharedDir()
    {
        MPI_Barrier(MPI_COMM_WORLD);
        if (rank == 0)
            std::system(("rm -rf " + path).c_str());
    }
};

// x: n x 2 x 5 x 7 normal floats, y: n x 5 x 7 labels in [0, 3), written by rank 0.
void write_npy_pair(const std::string &dir, int64_t n)
{
    if (rank == 0) {
        std::mt19937_64 gen(seed + 900);
        std::normal_distribution<float> normal;
        std::vector<float> x((size_t)n * 70);
        std::vector<int64_t> y((size_t)n * 35);
        for (float &v : x)
            v = normal(gen);
        for (int64_t &v : y)
            v = (int64_t)(gen() % 3);
        tsl_shape xs, ys;
        const int64_t xd[4] = {n, 2, 5, 7}, yd[3] = {n, 5, 7};
        tsl_shape_make(&xs, 4, xd);
        tsl_shape_make(&ys, 3, yd);
        EXPECT_EQ(tsl_npy_write((dir + "/x.npy").c_str(), TSL_F32, &xs, x.data()), TSL_OK);
        EXPECT_EQ(tsl_npy_write((dir + "/y.npy").c_str(), TSL_I64, &ys, y.data()), TSL_OK);
    }
    MPI_Barrier(MPI_COMM_WORLD);
}

// The npy pair of write_npy_pair(4) in dir, opened, then broken: x.npy loses sample 3 and the
// last two floats of sample 2 after every rank opened it.
tsl_dataset_t open_then_break(const SharedDir &dir)
{
    write_npy_pair(dir.path, 4);
    tsl_dataset_t ds = nullptr;
    EXPECT_EQ(tsl_dataset_open(&ds, ("npy:" + dir.path).c_str(), TSL_SPLIT_TRAIN), TSL_OK)
        << tsl_last_error();
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) {
        struct stat st;
        EXPECT_EQ(stat((dir.path + "/x.npy").c_str(), &st), 0);
        EXPECT_EQ(truncate((dir.path + "/x.npy").c_str(), st.st_size - 70 * 4 - 8), 0);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    return ds;
}

size_t dtype_size(tsl_dtype dt)
{
    return dt == TSL_U8 ? 1 : dt == TSL_I32 ? 4 : 8;
}

} // namespace

TEST(Read, OwnersReadTheirTilesOfTheBatch)
{
    SharedDir dir;
    write_npy_pair(dir.path, 5);
    tsl_owner_map block = tsl_owner_block(nullptr), rev = tsl_owner_callback(reversed, nullptr),
                  rr = tsl_owner_callback(round_robin, nullptr);
    struct Case {
        std::string spec;
        std::vector<int32_t> x_splits, y_splits;
        tsl_owner_map owners;
        tsl_layout layout;
        tsl_dtype labels;
    };
    const Case cases[] = {
        {"synthetic:dims=3,size=9,channels=2,samples=6",
         {1, 1, 2, 2, 1},
         {1, 3, 1, 1},
         block,
         TSL_LAYOUT_PLAIN,
         TSL_I64},
        {"synthetic:dims=3,size=9,channels=2,samples=6",
         {2, 1, 3, 1, 2},
         {2, 2, 1, 2},
         rev,
         TSL_LAYOUT_CHANNELS_LAST,
         TSL_U8},
        {"synthetic:dims=2,size=11,channels=3,samples=4,seed=5",
         {3, 3, 2, 1},
         {1, 4, 1},
         rr,
         TSL_LAYOUT_CHANNELS_LAST,
         TSL_I32},
        {"synthetic:dims=3,size=8,samples=6,labels=sample",
         {4, 1, 1, 2, 1},
         {2},
         rr,
         TSL_LAYOUT_PLAIN,
         TSL_U8},
        {"synthetic:dims=1,size=30,samples=4", {1, 1, 4}, {2, 3}, rev, TSL_LAYOUT_PLAIN, TSL_I64},
        {"npy:" + dir.path, {2, 2, 2, 3}, {1, 2, 3}, rev, TSL_LAYOUT_PLAIN, TSL_I32},
        {"npy:" + dir.path, {1, 1, 3, 2}, {3, 1, 1}, rr, TSL_LAYOUT_CHANNELS_LAST, TSL_U8},
        {"fashion-mnist", {4, 1, 2, 3}, {3}, block, TSL_LAYOUT_PLAIN, TSL_U8},
    };
    std::mt19937_64 gen(seed + 901);
    for (const Case &c : cases) {
        SCOPED_TRACE(c.spec);
        tsl_dataset_t ds;
        ASSERT_EQ(tsl_dataset_open(&ds, c.spec.c_str(), TSL_SPLIT_TRAIN), TSL_OK)
            << tsl_last_error();
        tsl_dataset_info info;
        tsl_dataset_get_info(ds, &info);
        const int64_t n = 7; // more rows than some sets have samples: repeats
        std::vector<int64_t> indices((size_t)n);
        for (int64_t &i : indices)
            i = (int64_t)(gen() % (uint64_t)info.samples);
        std::vector<int64_t> xd = {n}, yd = {n};
        for (int32_t d = 0; d < info.sample_shape.ndim; d++)
            xd.push_back(info.sample_shape.dims[d]);
        for (int32_t d = 0; d < info.label_shape.ndim; d++)
            yd.push_back(info.label_shape.dims[d]);
        tsl_tensor_t x = make_tensor(TSL_F32, xd, c.x_splits, c.owners, c.layout);
        tsl_tensor_t y = make_tensor(c.labels, yd, c.y_splits, c.owners);
        size_t ysize = dtype_size(c.labels);
        poison(x, 4, 0xff); // NaN
        poison(y, ysize, 0x5a);
        ASSERT_EQ(tsl_tensors_read_samples(x, y, ds, indices.data()), TSL_OK)
            << tsl_context_last_error(ctx);
        ASSERT_EQ(tsl_context_check_reads(ctx), TSL_OK) << tsl_context_last_error(ctx);
        std::vector<uint8_t> got_x = gather_bytes(x, 4), got_y = gather_bytes(y, ysize);
        if (rank == 0) {
            std::vector<float> want_x((size_t)(n * info.sample_numel));
            std::vector<int64_t> want_y((size_t)(n * info.label_numel));
            EXPECT_EQ(tsl_dataset_read(ds, indices.data(), n, want_x.data(), want_y.data()),
                      TSL_OK);
            EXPECT_EQ(std::memcmp(got_x.data(), want_x.data(), want_x.size() * 4), 0);
            size_t wrong = want_y.size(); // the first wrong label (EXPECT: rank 0 goes on)
            for (size_t i = 0; i < want_y.size() && wrong == want_y.size(); i++) {
                int64_t v = c.labels == TSL_U8    ? got_y[i]
                            : c.labels == TSL_I32 ? ((const int32_t *)got_y.data())[i]
                                                  : ((const int64_t *)got_y.data())[i];
                if (v != want_y[i])
                    wrong = i;
            }
            EXPECT_EQ(wrong, want_y.size()) << "the first wrong label";
        }
        // x alone, then labels alone.
        poison(x, 4, 0xff);
        ASSERT_EQ(tsl_tensors_read_samples(x, nullptr, ds, indices.data()), TSL_OK);
        ASSERT_EQ(tsl_tensors_read_samples(nullptr, y, ds, indices.data()), TSL_OK);
        ASSERT_EQ(tsl_context_check_reads(ctx), TSL_OK);
        EXPECT_EQ(gather_bytes(x, 4), got_x);
        EXPECT_EQ(gather_bytes(y, ysize), got_y);
        tsl_tensor_destroy(x);
        tsl_tensor_destroy(y);
        tsl_dataset_destroy(ds);
    }
}

TEST(Read, BatchesThatDoNotFitAreErrorsOnEveryRank)
{
    tsl_dataset_t ds;
    ASSERT_EQ(tsl_dataset_open(&ds, "synthetic:dims=2,size=6,samples=5", TSL_SPLIT_TRAIN), TSL_OK);
    tsl_owner_map block = tsl_owner_block(nullptr);
    tsl_tensor_t x = make_tensor(TSL_F32, {3, 1, 6, 6}, {1, 1, 2, 1}, block);
    tsl_tensor_t y = make_tensor(TSL_I64, {3, 6, 6}, {1, 2, 1}, block);
    tsl_tensor_t wrong = make_tensor(TSL_F32, {3, 1, 6, 5}, {1}, block);
    tsl_tensor_t f64 = make_tensor(TSL_F64, {3, 1, 6, 6}, {1}, block);
    std::vector<int64_t> indices = {4, 0, 2};
    EXPECT_EQ(tsl_tensors_read_samples(wrong, y, ds, indices.data()), TSL_ERR_SHAPE);
    EXPECT_NE(std::string(tsl_context_last_error(ctx)).find("x must be (3 samples"),
              std::string::npos)
        << tsl_context_last_error(ctx);
    EXPECT_EQ(tsl_tensors_read_samples(x, f64, ds, indices.data()), TSL_ERR_DTYPE);
    EXPECT_EQ(tsl_tensors_read_samples(f64, y, ds, indices.data()), TSL_ERR_DTYPE);
    EXPECT_EQ(tsl_tensors_read_samples(x, y, nullptr, indices.data()), TSL_ERR_INVALID_ARG);
    EXPECT_EQ(tsl_tensors_read_samples(x, y, ds, nullptr), TSL_ERR_INVALID_ARG);
    EXPECT_EQ(tsl_tensors_read_samples(nullptr, nullptr, ds, indices.data()), TSL_ERR_INVALID_ARG);
    std::vector<int64_t> outside = {4, 5, 0};
    EXPECT_EQ(tsl_tensors_read_samples(x, y, ds, outside.data()), TSL_ERR_INVALID_ARG);
    EXPECT_NE(std::string(tsl_context_last_error(ctx)).find("index 5 (position 1)"),
              std::string::npos);
    // Only the last rank reads other samples: every rank refuses, before any task.
    std::vector<int64_t> mine = indices;
    if (rank == size - 1 && size > 1)
        mine[2] = 3;
    tsl_status st = tsl_tensors_read_samples(x, y, ds, mine.data());
    if (size > 1) {
        EXPECT_EQ(st, TSL_ERR_INVALID_ARG);
        EXPECT_NE(std::string(tsl_context_last_error(ctx)).find("reads other samples"),
                  std::string::npos)
            << tsl_context_last_error(ctx);
    } else {
        EXPECT_EQ(st, TSL_OK);
    }
    EXPECT_EQ(tsl_context_check_reads(ctx), TSL_OK);
    for (tsl_tensor_t t : {x, y, wrong, f64})
        tsl_tensor_destroy(t);
    tsl_dataset_destroy(ds);
}

TEST(Read, AFileBrokenAfterOpeningIsAnErrorOnEveryRank)
{
    SharedDir dir;
    tsl_dataset_t ds = open_then_break(dir);
    ASSERT_NE(ds, nullptr);
    tsl_owner_map rr = tsl_owner_callback(round_robin, nullptr);
    tsl_tensor_t x = make_tensor(TSL_F32, {4, 2, 5, 7}, {4, 1, 1, 1}, rr);
    std::vector<int64_t> indices = {0, 1, 3, 2};
    ASSERT_EQ(tsl_tensors_read_samples(x, nullptr, ds, indices.data()), TSL_OK);
    EXPECT_EQ(tsl_context_check_reads(ctx), TSL_ERR_IO);
    EXPECT_NE(std::string(tsl_context_last_error(ctx)).find("ended early"), std::string::npos)
        << tsl_context_last_error(ctx);
    std::vector<uint8_t> got = gather_bytes(x, 4);
    if (rank == 0) {
        const float *v = (const float *)got.data();
        EXPECT_FALSE(std::isnan(v[0]));     // sample 0 read
        EXPECT_TRUE(std::isnan(v[2 * 70])); // sample 3 lost: poisoned, not stale
        EXPECT_TRUE(std::isnan(v[3 * 70 - 1]));
    }
    // The failure is reported once; the next good read is clean.
    std::vector<int64_t> good = {0, 1, 1, 0};
    ASSERT_EQ(tsl_tensors_read_samples(x, nullptr, ds, good.data()), TSL_OK);
    EXPECT_EQ(tsl_context_check_reads(ctx), TSL_OK);
    tsl_tensor_destroy(x);
    tsl_dataset_destroy(ds);
}

// A training step's read-ahead (tsl_model_train_step_read_next) of a sample that cannot be read:
// the step that started it succeeds, the step that takes it fails on every rank before any
// parameter changes, and the step after reads cleanly.
TEST(Read, AReadAheadFailureIsTheErrorOfTheStepThatTakesIt)
{
    SharedDir dir;
    tsl_dataset_t ds = open_then_break(dir);
    ASSERT_NE(ds, nullptr);
    // Per-position classes of the (2, 5, 7) samples: one 3x3 convolution to 3 channels.
    tsl_graph_t g = nullptr;
    ASSERT_EQ(tsl_graph_create(&g), TSL_OK);
    const int64_t sample[3] = {2, 5, 7}, k[2] = {3, 3};
    int32_t x = -1, y = -1;
    tsl_conv_params cp;
    tsl_conv_params_init(&cp, 2);
    cp.padding[0] = cp.padding[1] = 1;
    ASSERT_EQ(tsl_graph_input(g, 3, sample, &x), TSL_OK);
    ASSERT_EQ(tsl_graph_conv(g, "conv", x, 3, k, &cp, 0, 1, &y), TSL_OK);
    ASSERT_EQ(tsl_graph_set_output(g, y), TSL_OK);
    tsl_model_t m = nullptr;
    ASSERT_EQ(tsl_model_create(&m, ctx, g, seed + 980), TSL_OK) << tsl_context_last_error(ctx);
    tsl_optimizer_t opt = momentum_sgd();
    const int64_t good[4] = {0, 1, 1, 0}, bad[4] = {3, 2, 1, 0};
    double loss = 0;
    EXPECT_EQ(tsl_model_train_step_read_next(m, ds, 4, good, bad, opt, &loss, nullptr), TSL_OK)
        << tsl_context_last_error(ctx);
    EXPECT_TRUE(std::isfinite(loss));
    std::vector<std::vector<float>> before, after;
    push_params(m, g, false, &before);
    EXPECT_EQ(tsl_model_train_step_read_next(m, ds, 4, bad, good, opt, &loss, nullptr), TSL_ERR_IO);
    EXPECT_NE(std::string(tsl_context_last_error(ctx)).find("ended early"), std::string::npos)
        << tsl_context_last_error(ctx);
    push_params(m, g, false, &after);
    ASSERT_EQ(after.size(), before.size());
    for (size_t i = 0; i < before.size(); i++)
        EXPECT_EQ(std::memcmp(after[i].data(), before[i].data(), before[i].size() * 4), 0)
            << "parameter " << i << " changed by the failed step";
    // The failed step's own read-ahead (good) is taken by the next step, which is clean.
    EXPECT_EQ(tsl_model_train_step_read_next(m, ds, 4, good, nullptr, opt, &loss, nullptr), TSL_OK)
        << tsl_context_last_error(ctx);
    EXPECT_TRUE(std::isfinite(loss));
    tsl_optimizer_destroy(opt);
    tsl_model_destroy(m);
    tsl_graph_destroy(g);
    tsl_dataset_destroy(ds);
}

namespace
{

// An application's storage for tsl_dataset_create_callback: here another dataset's samples,
// the boxes asked for counted, and a sample that fails to read when `broken` is set.
struct Storage {
    tsl_dataset_t inner;
    int64_t broken = -1;
    std::atomic<int64_t> boxes{0}, whole{0};
};

tsl_status storage_read(int64_t index, const int64_t *start, const int64_t *extent, float *x,
                        int64_t *y, void *user)
{
    Storage *s = static_cast<Storage *>(user);
    if (index == s->broken)
        return TSL_ERR_IO;
    tsl_dataset_info info;
    tsl_dataset_get_info(s->inner, &info);
    bool all = true;
    for (int32_t d = 0; d < info.sample_shape.ndim; d++)
        all = all && start[d] == 0 && extent[d] == info.sample_shape.dims[d];
    s->boxes++;
    s->whole += all;
    return tsl_dataset_read_box(s->inner, index, start, extent, x, y);
}

// The batches both read-path tests train on.
const int64_t kReadBatches[3][2] = {{0, 5}, {3, 1}, {4, 2}};

// A model of g under plan, three momentum-SGD steps on kReadBatches of ds: the losses and every
// parameter after them, the model and its optimizer kept for the caller (who destroys them).
void train_three_steps(tsl_graph_t g, const tsl_plan *plan, tsl_dataset_t ds, uint64_t s,
                       double *losses, std::vector<std::vector<float>> *params, tsl_model_t *m,
                       tsl_optimizer_t *opt)
{
    ASSERT_EQ(tsl_model_create_plan(m, ctx, g, s, plan), TSL_OK) << tsl_context_last_error(ctx);
    *opt = momentum_sgd();
    for (int k = 0; k < 3; k++)
        ASSERT_EQ(tsl_model_train_step_read(*m, ds, 2, kReadBatches[k], *opt, &losses[k], nullptr),
                  TSL_OK)
            << tsl_context_last_error(ctx);
    push_params(*m, g, false, params);
}

// The same losses and parameters, bit for bit.
void expect_same_training(const double *losses0, const double *losses1,
                          const std::vector<std::vector<float>> &params0,
                          const std::vector<std::vector<float>> &params1)
{
    for (int k = 0; k < 3; k++)
        EXPECT_EQ(losses1[k], losses0[k]) << "step " << k;
    ASSERT_EQ(params1.size(), params0.size());
    for (size_t i = 0; i < params0.size(); i++)
        EXPECT_EQ(std::memcmp(params1[i].data(), params0[i].data(), params0[i].size() * 4), 0)
            << "parameter " << i;
}

// Three steps of g under the plan read from `a` and from `b`: the same losses and parameters,
// bit for bit; a's losses into losses (3).
void expect_datasets_train_alike(tsl_graph_t g, const char *plan_text, tsl_dataset_t a,
                                 tsl_dataset_t b, uint64_t s, double *losses)
{
    tsl_plan plan;
    ASSERT_EQ(tsl_plan_parse(plan_text, &plan), TSL_OK);
    std::vector<std::vector<float>> params[2];
    double loss[2][3];
    for (int via = 0; via < 2; via++) {
        tsl_model_t m = nullptr;
        tsl_optimizer_t opt = nullptr;
        train_three_steps(g, &plan, via ? b : a, s, loss[via], &params[via], &m, &opt);
        tsl_optimizer_destroy(opt);
        tsl_model_destroy(m);
    }
    expect_same_training(loss[0], loss[1], params[0], params[1]);
    for (int k = 0; k < 3; k++)
        losses[k] = loss[0][k];
}
} // namespace

// An application's own storage as a dataset (tsl_dataset_create_callback): training steps read
// through it equal steps on the dataset it serves, bit for bit, at 1, 2 and 4 ranks, each rank
// asking only for its tiles' boxes (under space= plans, never a whole sample); a sample the
// application cannot read fails the step on every rank before any parameter changes; bad
// descriptions are refused.
TEST(Read, AnApplicationsStorageTrainsLikeTheDatasetItServes)
{
    const char *spec = "synthetic:dims=2,size=16,samples=6,classes=3";
    const char *plan_text = size == 1 ? "tiles=2" : size == 2 ? "space=2" : "space=2x2";
    if (size == 3 || size > 4)
        GTEST_SKIP() << "plans for 1, 2 and 4 ranks";
    Storage storage;
    ASSERT_EQ(tsl_dataset_open(&storage.inner, spec, TSL_SPLIT_TRAIN), TSL_OK);
    tsl_dataset_info info;
    tsl_dataset_get_info(storage.inner, &info);
    tsl_dataset_t fed = nullptr;
    ASSERT_EQ(tsl_dataset_create_callback(&fed, info.samples, info.classes, info.sample_shape.ndim,
                                          info.sample_shape.dims, 1, storage_read, &storage),
              TSL_OK);
    tsl_dataset_info fed_info;
    tsl_dataset_get_info(fed, &fed_info);
    EXPECT_EQ(std::memcmp(&fed_info, &info, sizeof info), 0);
    tsl_graph_t g = nullptr;
    ASSERT_EQ(
        tsl_zoo_graph("unet2d", info.sample_shape.ndim, info.sample_shape.dims, info.classes, &g),
        TSL_OK);
    tsl_plan plan;
    ASSERT_EQ(tsl_plan_parse(plan_text, &plan), TSL_OK);
    std::vector<std::vector<float>> params[2];
    double losses[2][3];
    for (int via = 0; via < 2; via++) {
        tsl_model_t m = nullptr;
        tsl_optimizer_t opt = nullptr;
        train_three_steps(g, &plan, via ? fed : storage.inner, seed + 77, losses[via], &params[via],
                          &m, &opt);
        if (via) {
            // The application cannot read sample 4: the step fails everywhere and no trainable
            // parameter moves (the batch norms' running statistics took that forward's values).
            storage.broken = 4;
            EXPECT_EQ(tsl_model_train_step_read(m, fed, 2, kReadBatches[2], opt, nullptr, nullptr),
                      TSL_ERR_IO);
            EXPECT_NE(std::string(tsl_context_last_error(ctx)).find("read_box failed"),
                      std::string::npos)
                << tsl_context_last_error(ctx);
            for (int32_t i = 0; i < tsl_graph_param_count(g); i++) {
                tsl_tensor_t p, dp;
                ASSERT_EQ(tsl_model_param(m, i, &p, &dp), TSL_OK);
                if (dp) // trainable
                    EXPECT_EQ(std::memcmp(values(p).data(), params[1][(size_t)i].data(),
                                          params[1][(size_t)i].size() * 4),
                              0)
                        << "parameter " << i << " changed by the failed step";
            }
        }
        tsl_optimizer_destroy(opt);
        tsl_model_destroy(m);
    }
    expect_same_training(losses[0], losses[1], params[0], params[1]);
    // This rank asked for boxes of its tiles only: with spatial tiles, never a whole sample.
    EXPECT_GT(storage.boxes.load(), 0);
    EXPECT_EQ(storage.whole.load(), 0) << "a whole sample read on a rank that holds a part";
    // Descriptions that cannot be datasets.
    tsl_dataset_t bad = nullptr;
    const int64_t dims[2] = {1, 8};
    EXPECT_EQ(tsl_dataset_create_callback(&bad, 0, 3, 2, dims, 0, storage_read, &storage),
              TSL_ERR_INVALID_ARG);
    EXPECT_EQ(tsl_dataset_create_callback(&bad, 4, 1, 2, dims, 0, storage_read, &storage),
              TSL_ERR_INVALID_ARG);
    EXPECT_EQ(tsl_dataset_create_callback(&bad, 4, 3, 5, dims, 0, storage_read, &storage),
              TSL_ERR_SHAPE);
    EXPECT_EQ(tsl_dataset_create_callback(&bad, 4, 3, 2, dims, 0, nullptr, &storage),
              TSL_ERR_INVALID_ARG);
    EXPECT_EQ(bad, nullptr);
    tsl_graph_destroy(g);
    tsl_dataset_destroy(fed);
    tsl_dataset_destroy(storage.inner);
}

// An HDF5 file holding a synthetic set's samples (written by rank 0, float64 x and int32 labels
// per voxel) trains as the synthetic set does: the same losses and parameters, bit for bit,
// under a spatial plan where each rank reads only its tiles' boxes (hyperslabs), several
// workers at once.
TEST(Read, AnHdf5FileTrainsLikeTheSetItHolds)
{
    const char *spec = "synthetic:dims=2,size=16,samples=6,classes=3";
    const char *plan_text = size == 1 ? "tiles=2" : size == 2 ? "space=2" : "space=2x2";
    if (size == 3 || size > 4)
        GTEST_SKIP() << "plans for 1, 2 and 4 ranks";
    tsl_dataset_t synth = nullptr, h5 = nullptr;
    ASSERT_EQ(tsl_dataset_open(&synth, spec, TSL_SPLIT_TRAIN), TSL_OK);
    tsl_dataset_info info;
    tsl_dataset_get_info(synth, &info);
    char path[64] = "";
    if (rank == 0) {
        char tmpl[] = "/tmp/tessel-read-h5-XXXXXX";
        ASSERT_NE(mkdtemp(tmpl), nullptr);
        snprintf(path, sizeof path, "%s/set.h5", tmpl);
        const int64_t n = info.samples, per = info.sample_numel, labels = info.label_numel;
        std::vector<float> x((size_t)per);
        std::vector<int64_t> y((size_t)labels);
        std::vector<double> xs((size_t)(n * per));
        std::vector<int32_t> ys((size_t)(n * labels));
        for (int64_t i = 0; i < n; i++) {
            ASSERT_EQ(tsl_dataset_read(synth, &i, 1, x.data(), y.data()), TSL_OK);
            for (int64_t j = 0; j < per; j++)
                xs[(size_t)(i * per + j)] = x[(size_t)j];
            for (int64_t j = 0; j < labels; j++)
                ys[(size_t)(i * labels + j)] = (int32_t)y[(size_t)j];
        }
        hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
        ASSERT_GE(f, 0);
        hsize_t xd[4] = {(hsize_t)n, 1, 16, 16}, yd[3] = {(hsize_t)n, 16, 16};
        const char *names[2] = {"x", "y"};
        for (int k = 0; k < 2; k++) {
            hid_t space = H5Screate_simple(k ? 3 : 4, k ? yd : xd, nullptr);
            hid_t set = H5Dcreate2(f, names[k], k ? H5T_STD_I32LE : H5T_IEEE_F64LE, space,
                                   H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
            ASSERT_GE(H5Dwrite(set, k ? H5T_NATIVE_INT32 : H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL,
                               H5P_DEFAULT, k ? (const void *)ys.data() : (const void *)xs.data()),
                      0);
            H5Dclose(set);
            H5Sclose(space);
        }
        H5Fclose(f);
    }
    MPI_Bcast(path, sizeof path, MPI_CHAR, 0, MPI_COMM_WORLD);
    ASSERT_EQ(tsl_dataset_open(&h5, (std::string("hdf5:") + path).c_str(), TSL_SPLIT_TRAIN), TSL_OK)
        << tsl_last_error();
    tsl_graph_t g = nullptr;
    ASSERT_EQ(
        tsl_zoo_graph("unet2d", info.sample_shape.ndim, info.sample_shape.dims, info.classes, &g),
        TSL_OK);
    double losses[3];
    expect_datasets_train_alike(g, plan_text, synth, h5, seed + 78, losses);
    tsl_graph_destroy(g);
    tsl_dataset_destroy(h5);
    tsl_dataset_destroy(synth);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) {
        std::string dir(path, strrchr(path, '/') - path);
        ASSERT_EQ(std::system(("rm -rf '" + dir + "'").c_str()), 0);
    }
}

// Float targets from an HDF5 file (x and y of float types, y N x the output's shape) train as the
// same targets from an npy directory, bit for bit (losses and parameters after 3 steps of MSE +
// L1), at 1, 2 and 4 ranks under spatial plans: each rank reads its target tiles' boxes as
// hyperslabs.
TEST(Read, FloatTargetsFromAnHdf5FileTrainLikeAnNpyDirectory)
{
    const char *plan_text = size == 1 ? "tiles=2" : size == 2 ? "space=2" : "space=2x2";
    if (size == 3 || size > 4)
        GTEST_SKIP() << "plans for 1, 2 and 4 ranks";
    const int64_t n = 6, C = 2, S = 16, per = S * S, tper = C * S * S;
    char dir[64] = "";
    if (rank == 0) {
        char tmpl[] = "/tmp/tessel-read-targets-XXXXXX";
        ASSERT_NE(mkdtemp(tmpl), nullptr);
        snprintf(dir, sizeof dir, "%s", tmpl);
        std::mt19937_64 gen(seed + 79);
        std::normal_distribution<double> normal(0.0, 1.0);
        std::vector<double> x64((size_t)(n * per)), t64((size_t)(n * tper));
        std::vector<float> x32(x64.size()), t32(t64.size());
        for (size_t i = 0; i < x64.size(); i++)
            x32[i] = (float)(x64[i] = normal(gen));
        for (size_t i = 0; i < t64.size(); i++)
            t32[i] = (float)(t64[i] = normal(gen));
        hid_t f = H5Fcreate((std::string(dir) + "/set.h5").c_str(), H5F_ACC_TRUNC, H5P_DEFAULT,
                            H5P_DEFAULT);
        ASSERT_GE(f, 0);
        hsize_t xd[4] = {(hsize_t)n, 1, (hsize_t)S, (hsize_t)S},
                td[4] = {(hsize_t)n, (hsize_t)C, (hsize_t)S, (hsize_t)S};
        for (int k = 0; k < 2; k++) {
            hid_t space = H5Screate_simple(4, k ? td : xd, nullptr);
            hid_t set = H5Dcreate2(f, k ? "y" : "x", k ? H5T_IEEE_F32LE : H5T_IEEE_F64LE, space,
                                   H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
            ASSERT_GE(H5Dwrite(set, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT,
                               k ? t64.data() : x64.data()),
                      0);
            H5Dclose(set);
            H5Sclose(space);
        }
        H5Fclose(f);
        tsl_shape xs, ts;
        const int64_t xdims[4] = {n, 1, S, S}, tdims[4] = {n, C, S, S};
        tsl_shape_make(&xs, 4, xdims);
        tsl_shape_make(&ts, 4, tdims);
        ASSERT_EQ(tsl_npy_write((std::string(dir) + "/x.npy").c_str(), TSL_F32, &xs, x32.data()),
                  TSL_OK);
        ASSERT_EQ(tsl_npy_write((std::string(dir) + "/y.npy").c_str(), TSL_F32, &ts, t32.data()),
                  TSL_OK);
    }
    MPI_Bcast(dir, sizeof dir, MPI_CHAR, 0, MPI_COMM_WORLD);
    tsl_dataset_t h5 = nullptr, npy = nullptr;
    ASSERT_EQ(
        tsl_dataset_open(&h5, (std::string("hdf5:") + dir + "/set.h5").c_str(), TSL_SPLIT_TRAIN),
        TSL_OK)
        << tsl_last_error();
    ASSERT_EQ(tsl_dataset_open(&npy, (std::string("npy:") + dir).c_str(), TSL_SPLIT_TRAIN), TSL_OK)
        << tsl_last_error();
    tsl_dataset_info info;
    tsl_dataset_get_info(h5, &info);
    ASSERT_EQ(info.targets, 1);
    tsl_graph_t g = nullptr;
    ASSERT_EQ(tsl_zoo_graph("fcn2d", info.sample_shape.ndim, info.sample_shape.dims, C, &g),
              TSL_OK);
    const tsl_loss_term terms[2] = {{TSL_MODEL_LOSS_MSE, 1.0}, {TSL_MODEL_LOSS_L1, 0.3}};
    ASSERT_EQ(tsl_graph_set_loss(g, 2, terms), TSL_OK) << tsl_last_error();
    double losses[3];
    expect_datasets_train_alike(g, plan_text, npy, h5, seed + 80, losses);
    for (int k = 0; k < 3; k++)
        EXPECT_TRUE(std::isfinite(losses[k]) && losses[k] > 0) << "step " << k;
    // The same targets from an application's storage (tsl_dataset_create_callback_targets):
    // the same steps, each rank asking only for its tiles' boxes (never a whole sample under a
    // spatial plan of several ranks).
    TargetStorage storage;
    storage.inner = npy;
    tsl_dataset_t fed = nullptr;
    ASSERT_EQ(tsl_dataset_create_callback_targets(&fed, info.samples, info.sample_shape.ndim,
                                                  info.sample_shape.dims, info.label_shape.ndim,
                                                  info.label_shape.dims, target_storage_x,
                                                  target_storage_read, &storage),
              TSL_OK)
        << tsl_last_error();
    double fed_losses[3];
    expect_datasets_train_alike(g, plan_text, npy, fed, seed + 80, fed_losses);
    EXPECT_GT(storage.boxes.load(), 0);
    if (size > 1)
        EXPECT_EQ(storage.whole.load(), 0) << "a rank read a whole target";
    tsl_dataset_destroy(fed);
    tsl_graph_destroy(g);
    tsl_dataset_destroy(h5);
    tsl_dataset_destroy(npy);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0)
        ASSERT_EQ(std::system((std::string("rm -rf '") + dir + "'").c_str()), 0);
}
