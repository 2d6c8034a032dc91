// Whole models on CUDA workers against the same models on CPU workers, in one process: StarPU
// fixes its workers when it starts, so the runs differ by where their tile tasks may run
// (src/task_where.h, chosen per task by tsl_task_submit).
//
// - Every zoo network, one rank: 3 momentum-SGD steps with every task whose codelet can run on
//   a CUDA worker there (TSL_TASK_WHERE_CUDA) equal the same steps on CPU workers only.
// - A heterogeneous run (TSL_TASK_WHERE_ANY: the scheduler places each task on a CPU or CUDA
//   worker; the GPU check kit runs it under dmdas with several CPU workers), with the default
//   plan and with spatial tiles, equals the CPU run of the same plan.
// - Two ranks sharing one GPU with the plan space=2 (halo slabs moved by StarPU-MPI out of GPU
//   memory) equal the CPU run of the default plan, which Model.SpatialPlansMatchSampleTiles
//   and the data-parallel tests show equal to one rank.
//
// A CUDA codelet that computed wrong values would change the loss of the first step (forward
// codelets), the gradients or the parameters after the steps (backward and optimizer
// codelets) far beyond the tolerances; each run also counts the tasks that ran on each kind
// of worker, so a run that quietly stayed on CPU workers fails rather than passes. TF32 is off
// in these tests (mpi_test_main.cpp). Without a CUDA worker every test skips and says why.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "cuda_test.h"
#include "model_test.h"
#include "mpi_test_env.h"
#include "src/task_where.h"

using namespace tsltest;

namespace
{

// Tasks executed by CPU and by CUDA workers since the last reset (StarPU's profiling counts).
struct KindCounts {
    long cpu = 0, cuda = 0;
};

void reset_counts()
{
    if (starpu_profiling_status_get() != STARPU_PROFILING_ENABLE)
        starpu_profiling_status_set(STARPU_PROFILING_ENABLE);
    for (unsigned w = 0; w < starpu_worker_get_count(); w++)
        starpu_profiling_worker_get_info((int)w, nullptr); // resets its counters
}

KindCounts read_counts()
{
    EXPECT_EQ(tsl_context_wait(ctx), TSL_OK);
    KindCounts k;
    for (unsigned w = 0; w < starpu_worker_get_count(); w++) {
        struct starpu_profiling_worker_info info;
        if (starpu_profiling_worker_get_info((int)w, &info) != 0)
            continue;
        if (starpu_worker_get_type((int)w) == STARPU_CUDA_WORKER)
            k.cuda += info.executed_tasks;
        else if (starpu_worker_get_type((int)w) == STARPU_CPU_WORKER)
            k.cpu += info.executed_tasks;
    }
    return k;
}

// A small sample each zoo network takes, and whether it labels every position.
struct Net {
    std::vector<int64_t> sample;
    bool segmentation;
};

const std::map<std::string, Net> &zoo_samples()
{
    static const std::map<std::string, Net> nets = {
        {"cnn", {{2, 8, 8}, false}},      {"cnn1d", {{2, 16}, false}},
        {"cnn2d", {{1, 8, 8}, false}},    {"cnn3d", {{1, 8, 8, 8}, false}},
        {"fcn2d", {{2, 9, 11}, true}},    {"unet2d", {{1, 16, 12}, true}},
        {"unet3d", {{1, 8, 8, 8}, true}}, {"resnet", {{2, 12, 10}, false}},
        {"resnet2", {{1, 32}, false}},    {"odenet3", {{2, 8, 6}, false}},
        {"odetanh3", {{1, 12}, false}},
    };
    return nets;
}

// What one run gives: the loss of each step, the output after the steps, the gradients of the
// last step and the parameters after it.
struct RunResult {
    std::vector<double> losses;
    std::vector<std::vector<float>> tensors; // output, gradients..., parameters...
    size_t ngrads = 0;
    KindCounts counts;
};

class ModelRunner
{
  public:
    ModelRunner(const std::string &name, const Net &net) : name_(name), net_(net)
    {
        int32_t ndim = (int32_t)net.sample.size();
        EXPECT_EQ(tsl_zoo_graph(name.c_str(), ndim, net.sample.data(), classes, &g_), TSL_OK)
            << name << ": " << tsl_last_error();
        per_ = 1;
        for (int64_t d : net.sample)
            per_ *= d;
        if (g_) {
            tsl_shape out;
            tsl_graph_value_shape(g_, tsl_graph_output(g_), &out);
            out_numel_ = n * tsl_shape_numel(&out);
        }
        new_batch(seed + 700);
    }
    ~ModelRunner()
    {
        tsl_graph_destroy(g_);
    }

    bool ok() const
    {
        return g_ != nullptr;
    }

    // The same n samples on every rank; per-position labels for segmentation networks.
    void new_batch(uint64_t s)
    {
        b_ = make_batch(n, per_, classes, s);
        if (net_.segmentation) {
            int64_t positions = per_ / net_.sample[0];
            b_.y.resize((size_t)(n * positions));
            for (int64_t i = 0; i < n * positions; i++)
                b_.y[i] = (int64_t)((i * 7 + i / 5) % classes);
        }
    }

    // Three momentum-SGD steps of a fresh model (the same initial parameters every time) with
    // the tasks placed as `where` says, under `plan` (NULL: the default plan).
    void run(tsl_task_where where, const tsl_plan *plan, RunResult *r)
    {
        *r = RunResult();
        ASSERT_EQ(tsl_context_set_task_where(ctx, where), TSL_OK);
        reset_counts();
        tsl_model_t m = nullptr;
        ASSERT_EQ(tsl_model_create_plan(&m, ctx, g_, seed + 701, plan), TSL_OK)
            << tsl_context_last_error(ctx);
        tsl_optimizer_t opt = momentum_sgd();
        ASSERT_NE(opt, nullptr);
        for (int k = 0; k < 3; k++) {
            double loss = 0;
            ASSERT_EQ(tsl_model_train_step(m, n, b_.x.data(), b_.y.data(), opt, &loss, nullptr),
                      TSL_OK)
                << tsl_context_last_error(ctx);
            r->losses.push_back(loss);
        }
        std::vector<float> y((size_t)out_numel_);
        ASSERT_EQ(tsl_model_forward(m, n, b_.x.data(), 1, rank == 0 ? y.data() : nullptr), TSL_OK);
        MPI_Bcast(y.data(), (int)y.size(), MPI_FLOAT, 0, MPI_COMM_WORLD);
        r->tensors.push_back(y);
        push_params(m, g_, true, &r->tensors);
        r->ngrads = r->tensors.size() - 1;
        push_params(m, g_, false, &r->tensors);
        r->counts = read_counts();
        tsl_optimizer_destroy(opt);
        tsl_model_destroy(m);
        ASSERT_EQ(tsl_context_set_task_where(ctx, TSL_TASK_WHERE_AUTO), TSL_OK);
    }

    // "" when `got` equals `ref` within float rounding, else the first difference. The loss of
    // every step within 1e-5 relative; the output, the gradients and the parameters, sums whose
    // order cuDNN's algorithms and the tiling change (and batch norm's backward magnifies), as
    // whole tensors within 1e-4 of their largest value: a wrong kernel is off by far more.
    static std::string compare(const RunResult &got, const RunResult &ref)
    {
        std::ostringstream why;
        if (got.tensors.size() != ref.tensors.size() || got.losses.size() != ref.losses.size())
            return "different numbers of results";
        for (size_t k = 0; k < ref.losses.size(); k++)
            if (!(std::fabs(got.losses[k] - ref.losses[k]) <=
                  1e-5 * (1 + std::fabs(ref.losses[k]))))
                return "loss of step " + std::to_string(k + 1) + ": " +
                       std::to_string(got.losses[k]) + " vs " + std::to_string(ref.losses[k]);
        for (size_t k = 0; k < ref.tensors.size(); k++) {
            double d = max_norm_rel_diff(got.tensors[k], ref.tensors[k]);
            if (!(d < 1e-4)) {
                why << (k == 0            ? "output"
                        : k <= got.ngrads ? "gradient "
                                          : "parameter ")
                    << (k == 0            ? 0
                        : k <= got.ngrads ? k
                                          : k - got.ngrads)
                    << ", " << d;
                return why.str();
            }
        }
        return "";
    }

    // Runs `where` under `plan` and the CPU reference (under ref_plan), compares them, and on a
    // difference both again on a fresh batch: where two values of a max-pool window, or a ReLU
    // input and zero, lie within rounding of each other, the last bit can send a gradient
    // another way (rare, gone on another batch); a wrong kernel differs on every batch.
    // Returns the counts of the run, and "" or the difference on both batches.
    std::string check(tsl_task_where where, const tsl_plan *plan, const tsl_plan *ref_plan,
                      KindCounts *counts)
    {
        RunResult ref, got;
        run(TSL_TASK_WHERE_CPU, ref_plan, &ref);
        EXPECT_EQ(ref.counts.cuda, 0) << name_ << ": the CPU reference ran tasks on CUDA";
        run(where, plan, &got);
        *counts = got.counts;
        std::string first = compare(got, ref);
        if (first.empty())
            return "";
        Batch keep = b_;
        new_batch(seed + 702);
        run(TSL_TASK_WHERE_CPU, ref_plan, &ref);
        run(where, plan, &got);
        std::string second = compare(got, ref);
        b_ = keep;
        return second.empty() ? "" : second + " (first batch: " + first + ")";
    }

    static constexpr int64_t n = 4, classes = 3;

  private:
    std::string name_;
    Net net_;
    tsl_graph_t g_ = nullptr;
    int64_t per_ = 1, out_numel_ = 0;
    Batch b_;
};

// Skips on every rank unless every rank has a CUDA worker (collective).
#define SKIP_UNLESS_EVERY_RANK_HAS_CUDA()                                                          \
    do {                                                                                           \
        const char *why = no_cuda_reason();                                                        \
        if (!all_ranks(why == nullptr))                                                            \
            GTEST_SKIP() << (why ? why : "another rank has no CUDA worker");                       \
    } while (0)

} // namespace

TEST(CudaModel, EveryZooNetworkOnCudaWorkersMatchesCpuWorkers)
{
    if (size != 1)
        GTEST_SKIP() << "one rank (the two-rank check is CudaModel.SpatialPlanOnTwoRanks...)";
    SKIP_WITHOUT_CUDA();
    int32_t count = 0;
    const char *const *names = tsl_zoo_names(&count, nullptr);
    for (int32_t i = 0; i < count; i++) {
        // The families named with their number of steps are run as three-step networks.
        std::string name = names[i];
        if (name.compare(0, 3, "ode") == 0)
            name += "3";
        SCOPED_TRACE(name);
        auto it = zoo_samples().find(name);
        ASSERT_NE(it, zoo_samples().end()) << "no sample shape for zoo network " << name;
        ModelRunner runner(name, it->second);
        ASSERT_TRUE(runner.ok());
        KindCounts k;
        EXPECT_EQ(runner.check(TSL_TASK_WHERE_CUDA, nullptr, nullptr, &k), "");
        EXPECT_GT(k.cuda, 0) << "no task ran on a CUDA worker";
        std::printf("[ cuda     ] %-8s tasks on CUDA workers %ld, on CPU workers %ld\n",
                    name.c_str(), k.cuda, k.cpu);
    }
    // resnetN: more blocks per stage, the same codelets.
    ModelRunner deep("resnet2", zoo_samples().at("resnet2"));
    KindCounts k;
    EXPECT_EQ(deep.check(TSL_TASK_WHERE_CUDA, nullptr, nullptr, &k), "") << "resnet2";
}

TEST(CudaModel, HeterogeneousRunMatchesCpuWorkers)
{
    if (size != 1)
        GTEST_SKIP() << "one rank";
    SKIP_WITHOUT_CUDA();
    const char *sched = "";
    tsl_context_scheduler(ctx, &sched);
    int32_t ncpu = 0;
    tsl_context_worker_count(ctx, TSL_WORKER_CPU, &ncpu);
    // The default plan (one sample tile per CUDA worker: each task of a layer on either kind),
    // and spatial tiles (tiles=2: the windowed convolutions on CPU workers, the other tasks of
    // the same layer on either kind).
    struct Case {
        const char *name, *plan;
    };
    const Case cases[] = {{"cnn", ""},          {"cnn3d", ""},        {"unet2d", ""},
                          {"resnet", ""},       {"cnn3d", "tiles=2"}, {"unet2d", "tiles=2"},
                          {"resnet", "tiles=2"}};
    KindCounts total;
    for (const Case &c : cases) {
        SCOPED_TRACE(std::string(c.name) + " plan '" + c.plan + "'");
        ModelRunner runner(c.name, zoo_samples().at(c.name));
        ASSERT_TRUE(runner.ok());
        tsl_plan plan;
        ASSERT_EQ(tsl_plan_parse(c.plan, &plan), TSL_OK);
        const tsl_plan *p = *c.plan ? &plan : nullptr;
        KindCounts k;
        EXPECT_EQ(runner.check(TSL_TASK_WHERE_ANY, p, p, &k), "");
        std::printf("[ hetero   ] %-8s %-8s %s, %d CPU workers: tasks on CUDA %ld, on CPU %ld\n",
                    c.name, *c.plan ? c.plan : "default", sched, (int)ncpu, k.cuda, k.cpu);
        total.cpu += k.cpu;
        total.cuda += k.cuda;
    }
    EXPECT_GT(total.cuda, 0) << "no task ran on a CUDA worker";
    // dmda and dmdas calibrate a fresh performance model by running tasks on each kind of
    // worker: both kinds must have run some (other schedulers may keep to one kind).
    if (std::string(sched).rfind("dmda", 0) == 0 && ncpu > 0)
        EXPECT_GT(total.cpu, 0) << "under " << sched << " no task ran on a CPU worker";
}

TEST(CudaModel, SpatialPlanOnTwoRanksSharingTheGpuMatchesCpuWorkers)
{
    if (size != 2)
        GTEST_SKIP() << "two ranks";
    SKIP_UNLESS_EVERY_RANK_HAS_CUDA();
    tsl_plan space2;
    ASSERT_EQ(tsl_plan_parse("space=2", &space2), TSL_OK);
    for (const char *name : {"unet2d", "cnn3d", "resnet"}) {
        SCOPED_TRACE(std::string(name) + " with plan space=2");
        ModelRunner runner(name, zoo_samples().at(name));
        ASSERT_TRUE(runner.ok());
        for (tsl_task_where where : {TSL_TASK_WHERE_CUDA, TSL_TASK_WHERE_ANY}) {
            KindCounts k;
            EXPECT_EQ(runner.check(where, &space2, nullptr, &k), "")
                << (where == TSL_TASK_WHERE_CUDA ? "CUDA where possible" : "any worker");
            if (where == TSL_TASK_WHERE_CUDA)
                EXPECT_TRUE(all_ranks(k.cuda > 0)) << "a rank ran no task on its CUDA worker";
            if (rank == 0)
                std::printf("[ cuda np2 ] %-8s %s: rank 0 tasks on CUDA %ld, on CPU %ld\n", name,
                            where == TSL_TASK_WHERE_CUDA ? "cuda" : "any ", k.cuda, k.cpu);
        }
    }
}

TEST(CudaModel, TaskWhereIsCheckedAndParsed)
{
    tsl_task_where w = TSL_TASK_WHERE_ANY;
    EXPECT_EQ(tsl_task_where_parse("cuda", &w), TSL_OK);
    EXPECT_EQ(w, TSL_TASK_WHERE_CUDA);
    EXPECT_EQ(tsl_task_where_parse("cpu", &w), TSL_OK);
    EXPECT_EQ(w, TSL_TASK_WHERE_CPU);
    EXPECT_EQ(tsl_task_where_parse("auto", &w), TSL_OK);
    EXPECT_EQ(w, TSL_TASK_WHERE_AUTO);
    EXPECT_EQ(tsl_task_where_parse("cpu", &w), TSL_OK);
    EXPECT_EQ(tsl_task_where_parse("gpu", &w), TSL_ERR_INVALID_ARG); // unchanged
    EXPECT_EQ(w, TSL_TASK_WHERE_CPU);
    EXPECT_EQ(tsl_context_set_task_where(ctx, (tsl_task_where)7), TSL_ERR_INVALID_ARG);
    EXPECT_EQ(tsl_context_set_task_where(nullptr, TSL_TASK_WHERE_CPU), TSL_ERR_INVALID_ARG);
    EXPECT_EQ(tsl_context_task_where(ctx), TSL_TASK_WHERE_AUTO);
    // CPU workers only: no task runs on a CUDA worker (in any build, with or without a GPU).
    ModelRunner runner("cnn", zoo_samples().at("cnn"));
    ASSERT_TRUE(runner.ok());
    RunResult r;
    runner.run(TSL_TASK_WHERE_CPU, nullptr, &r);
    EXPECT_EQ(r.counts.cuda, 0);
    EXPECT_GT(r.counts.cpu, 0);
    EXPECT_EQ(tsl_context_task_where(ctx), TSL_TASK_WHERE_AUTO);
    // The default places every task as TSL_TASK_WHERE_CUDA does where this process has a CUDA
    // worker (the same count on each kind), and leaves CUDA workers unused where it has none.
    RunResult cuda, automatic;
    runner.run(TSL_TASK_WHERE_CUDA, nullptr, &cuda);
    runner.run(TSL_TASK_WHERE_AUTO, nullptr, &automatic);
    int32_t ncuda = 0;
    tsl_context_worker_count(ctx, TSL_WORKER_CUDA, &ncuda);
    EXPECT_EQ(automatic.counts.cuda, cuda.counts.cuda);
    EXPECT_EQ(automatic.counts.cpu, cuda.counts.cpu);
    if (ncuda > 0)
        EXPECT_GT(automatic.counts.cuda, 0);
    else
        EXPECT_EQ(automatic.counts.cuda, 0);
}
