// What the model tests share (tests/mpi/test_model.cpp, tests/mpi/test_cuda_model.cpp): a
// seeded batch, zoo models, momentum SGD, and tensors gathered on every rank.
#ifndef TESSEL_TESTS_MPI_MODEL_TEST_H
#define TESSEL_TESTS_MPI_MODEL_TEST_H

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "mpi_test_env.h"
#include "src/task_where.h"

namespace tsltest
{

struct Batch {
    std::vector<float> x;
    std::vector<int64_t> y;
};

// The same batch on every rank (seeded alike); classes are made separable by a shift.
inline Batch make_batch(int64_t n, int64_t per_sample, int64_t classes, uint64_t s)
{
    std::mt19937_64 gen(s);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    Batch b;
    b.x.resize((size_t)(n * per_sample));
    b.y.resize((size_t)n);
    for (int64_t i = 0; i < n; i++) {
        b.y[i] = (int64_t)(gen() % (uint64_t)classes);
        for (int64_t j = 0; j < per_sample; j++)
            b.x[i * per_sample + j] = normal(gen) + (j % 3 == 0 ? 0.8f * (float)b.y[i] : 0.0f);
    }
    return b;
}

inline std::vector<float> values(tsl_tensor_t t)
{
    tsl_shape s;
    tsl_tensor_shape(t, &s);
    std::vector<float> v((size_t)tsl_shape_numel(&s));
    EXPECT_EQ(tsl_tensor_gather(t, 0, rank == 0 ? v.data() : nullptr), TSL_OK);
    MPI_Bcast(v.data(), (int)v.size(), MPI_FLOAT, 0, MPI_COMM_WORLD);
    return v;
}

// Every gradient (grads) or every parameter and buffer of m, gathered on every rank, appended
// to res in graph order.
inline void push_params(tsl_model_t m, tsl_graph_t g, bool grads,
                        std::vector<std::vector<float>> *res)
{
    for (int32_t i = 0; i < tsl_graph_param_count(g); i++) {
        tsl_tensor_t p, dp;
        ASSERT_EQ(tsl_model_param(m, i, &p, &dp), TSL_OK);
        if (!grads)
            res->push_back(values(p));
        else if (dp)
            res->push_back(values(dp));
    }
}

inline void set_values(tsl_tensor_t t, const std::vector<float> &v)
{
    ASSERT_EQ(tsl_tensor_scatter(t, 0, rank == 0 ? v.data() : nullptr), TSL_OK);
}

inline tsl_model_t make_model(const int64_t *sample, int32_t ndim, int64_t classes, uint64_t s,
                              const char *name = "cnn")
{
    tsl_graph_t g = nullptr;
    EXPECT_EQ(tsl_zoo_graph(name, ndim, sample, classes, &g), TSL_OK) << tsl_last_error();
    tsl_model_t m = nullptr;
    EXPECT_EQ(tsl_model_create(&m, ctx, g, s), TSL_OK) << tsl_context_last_error(ctx);
    tsl_graph_destroy(g);
    return m;
}

// SGD with lr 0.05 and momentum 0.9 (NULL and a failure on error).
inline tsl_optimizer_t momentum_sgd()
{
    tsl_sgd_config c;
    tsl_sgd_config_init(&c);
    c.lr = 0.05;
    c.momentum = 0.9;
    tsl_optimizer_t opt = nullptr;
    EXPECT_EQ(tsl_optimizer_create_sgd(&opt, ctx, &c), TSL_OK);
    return opt;
}

// Runs compared bit for bit must put each task on the same kind of worker in both: cuDNN and
// oneDNN round a convolution differently, and with the default placement the scheduler may put
// a tile's task on either. Where this process has a CUDA worker, the test's tasks go wherever
// they can run on it (TSL_TASK_WHERE_CUDA, one fixed choice per task); without one this changes
// nothing. The placement before is restored at the end of the scope.
class SamePlacementInEveryRun
{
  public:
    SamePlacementInEveryRun() : before_(tsl_context_task_where(ctx))
    {
        int32_t ncuda = 0;
        tsl_context_worker_count(ctx, TSL_WORKER_CUDA, &ncuda);
        if (ncuda > 0 && before_ != TSL_TASK_WHERE_CPU)
            EXPECT_EQ(tsl_context_set_task_where(ctx, TSL_TASK_WHERE_CUDA), TSL_OK);
    }
    ~SamePlacementInEveryRun()
    {
        tsl_context_set_task_where(ctx, before_);
    }

  private:
    tsl_task_where before_;
};

} // namespace tsltest

#endif
