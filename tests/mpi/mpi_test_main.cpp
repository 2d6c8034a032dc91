// GoogleTest under MPI: every rank runs every test (tensor calls are collective); rank 0
// prints the usual report, other ranks print only their failures; the exit code is non-zero
// if any rank failed.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <gtest/gtest.h>

#include "mpi_test_env.h"

namespace tsltest
{
tsl_context_t ctx = nullptr;
int rank = 0;
int size = 1;
uint64_t seed = 0;

bool all_ranks(bool ok)
{
    int mine = ok ? 1 : 0, all = 0;
    MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    return all == 1;
}

tsl_tensor_t make_tensor(tsl_dtype dt, const std::vector<int64_t> &dims,
                         const std::vector<int32_t> &splits, const tsl_owner_map &owners,
                         tsl_layout layout)
{
    tsl_shape s;
    EXPECT_EQ(tsl_shape_make(&s, (int32_t)dims.size(), dims.data()), TSL_OK);
    tsl_tile_grid g = tsl_tile_grid_single();
    for (size_t d = 0; d < splits.size(); d++)
        g.splits[d] = splits[d];
    tsl_tensor_t t = nullptr;
    EXPECT_EQ(tsl_tensor_create_layout(&t, ctx, dt, &s, &g, &owners, layout), TSL_OK)
        << tsl_context_last_error(ctx);
    return t;
}

std::vector<std::vector<float>> gather_all(std::initializer_list<tsl_tensor_t> tensors)
{
    std::vector<std::vector<float>> got;
    for (tsl_tensor_t t : tensors) {
        tsl_shape s;
        tsl_tensor_shape(t, &s);
        std::vector<float> v((size_t)tsl_shape_numel(&s), NAN);
        EXPECT_EQ(tsl_tensor_gather(t, 0, rank == 0 ? v.data() : nullptr), TSL_OK);
        got.push_back(v);
    }
    return got;
}

double max_norm_rel_diff(const std::vector<float> &got, const std::vector<float> &ref)
{
    if (got.size() != ref.size())
        return INFINITY;
    double worst = 0, scale = 1;
    for (size_t i = 0; i < ref.size(); i++) {
        worst = std::max(worst, (double)std::fabs(got[i] - ref[i]));
        scale = std::max(scale, (double)std::fabs(ref[i]));
    }
    return worst / scale;
}

double max_rel_diff(const std::vector<float> &got, const std::vector<float> &ref)
{
    double worst = 0;
    for (size_t i = 0; i < ref.size() && i < got.size(); i++)
        worst = std::max(worst, (double)std::fabs(got[i] - ref[i]) / (1 + std::fabs(ref[i])));
    return got.size() == ref.size() ? worst : INFINITY;
}

int32_t round_robin(const int32_t *tile, int32_t ndim, const tsl_tile_grid *grid, int32_t nranks,
                    void *)
{
    int64_t linear = 0;
    for (int d = 0; d < ndim; d++)
        linear = linear * grid->splits[d] + tile[d];
    return (int32_t)(linear % nranks);
}

int32_t reversed(const int32_t *tile, int32_t ndim, const tsl_tile_grid *grid, int32_t nranks,
                 void *)
{
    int64_t linear = 0, count = 1;
    for (int d = 0; d < ndim; d++) {
        linear = linear * grid->splits[d] + tile[d];
        count *= grid->splits[d];
    }
    return (int32_t)((count - 1 - linear) * nranks / count);
}
} // namespace tsltest

namespace
{
class RankFailurePrinter : public ::testing::EmptyTestEventListener
{
    void OnTestPartResult(const ::testing::TestPartResult &r) override
    {
        if (r.failed())
            std::fprintf(stderr, "[rank %d] %s:%d: failure\n%s\n", tsltest::rank,
                         r.file_name() ? r.file_name() : "?", r.line_number(), r.summary());
    }
};
} // namespace

int main(int argc, char **argv)
{
    ::testing::InitGoogleTest(&argc, argv);
    // The CUDA tests compare against the CPU within 1e-5: f32 convolutions and GEMMs without TF32
    // (read once, when the first CUDA codelet asks; an explicit TESSEL_CUDA_TF32 is kept).
    setenv("TESSEL_CUDA_TF32", "0", 0);
    tsl_context_config config;
    tsl_context_config_init(&config);
    config.comm_stats = 1; // tests measure the bytes that move between ranks
    tsl_status st = tsl_context_create(&tsltest::ctx, &config);
    if (st != TSL_OK) {
        std::fprintf(stderr, "cannot create the tessel context: %s\n", tsl_last_error());
        return 1;
    }
    tsl_context_rank(tsltest::ctx, &tsltest::rank);
    tsl_context_size(tsltest::ctx, &tsltest::size);

    unsigned long long seed = 0;
    if (tsltest::rank == 0) {
        const char *fixed = std::getenv("TESSEL_TEST_SEED");
        seed =
            fixed ? std::strtoull(fixed, nullptr, 10)
                  : (unsigned long long)std::chrono::steady_clock::now().time_since_epoch().count();
        std::printf("tessel distributed tests: %d ranks, seed %llu (set TESSEL_TEST_SEED to "
                    "repeat)\n",
                    tsltest::size, seed);
        std::fflush(stdout);
    }
    MPI_Bcast(&seed, 1, MPI_UNSIGNED_LONG_LONG, 0, MPI_COMM_WORLD);
    tsltest::seed = seed;

    auto &listeners = ::testing::UnitTest::GetInstance()->listeners();
    if (tsltest::rank != 0) {
        delete listeners.Release(listeners.default_result_printer());
        listeners.Append(new RankFailurePrinter);
    }
    int local = RUN_ALL_TESTS();
    int global = 0;
    MPI_Allreduce(&local, &global, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    st = tsl_context_destroy(tsltest::ctx);
    if (st != TSL_OK)
        global = 1;
    if (tsltest::rank == 0 && global)
        std::fprintf(stderr, "FAILED on at least one rank\n");
    return global ? 1 : 0;
}
