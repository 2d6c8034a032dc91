// CUDA codelets against their CPU functions, on a CUDA worker of the test's context. Where the
// process has no CUDA worker (a build without TESSEL_USE_CUDA, or no GPU) every test skips and
// says why. Each rank runs its own tasks on its own data (no communication).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "mpi_test_env.h"

extern "C" {
#include "codelets/activation.h"
}
#ifdef TESSEL_USE_CUDA
#include "codelets/cuda_check.h"
#endif

namespace
{

// Why the CUDA tests cannot run here, or nullptr when they can.
const char *no_cuda_reason()
{
#ifndef TESSEL_USE_CUDA
    return "built without CUDA (TESSEL_CUDA off)";
#else
    if (starpu_cuda_worker_get_count() == 0)
        return "no CUDA worker in this process (no GPU, or STARPU_NCUDA=0)";
    return nullptr;
#endif
}

#define SKIP_WITHOUT_CUDA()                                                                        \
    do {                                                                                           \
        if (const char *why = no_cuda_reason())                                                    \
            GTEST_SKIP() << why;                                                                   \
    } while (0)

// Runs `cl` with `args` over the host vectors `bufs` (modes `modes`) on a CUDA worker and waits;
// the results are back in the vectors when it returns.
template <typename A, typename T>
void run_on_cuda(struct starpu_codelet &cl, const A &args, std::vector<std::vector<T> *> bufs,
                 std::vector<enum starpu_data_access_mode> modes)
{
    std::vector<starpu_data_handle_t> handles(bufs.size());
    for (size_t i = 0; i < bufs.size(); i++)
        starpu_vector_data_register(&handles[i], STARPU_MAIN_RAM, (uintptr_t)bufs[i]->data(),
                                    (uint32_t)bufs[i]->size(), sizeof(T));
    struct starpu_task *task = starpu_task_create();
    task->cl = &cl;
    task->where = STARPU_CUDA;
    task->synchronous = 1;
    task->nbuffers = (int)bufs.size();
    for (size_t i = 0; i < bufs.size(); i++) {
        STARPU_TASK_SET_HANDLE(task, handles[i], i);
        STARPU_TASK_SET_MODE(task, modes[i], i);
    }
    starpu_codelet_pack_args(&task->cl_arg, &task->cl_arg_size, STARPU_VALUE, &args, sizeof args,
                             0);
    task->cl_arg_free = 1;
    EXPECT_EQ(starpu_task_submit(task), 0) << cl.name;
    for (starpu_data_handle_t h : handles)
        starpu_data_unregister(h); // brings the results back to the host vectors
}

template <typename T> std::vector<T> random_values(size_t n, uint64_t salt, T lo, T hi)
{
    std::mt19937_64 gen(tsltest::seed + salt);
    std::uniform_real_distribution<double> dist((double)lo, (double)hi);
    std::vector<T> v(n);
    for (T &x : v)
        x = (T)dist(gen);
    return v;
}

template <typename T> int dtype_of();
template <> int dtype_of<float>()
{
    return TSL_F32;
}
template <> int dtype_of<double>()
{
    return TSL_F64;
}

// Exact for ReLU and LeakyReLU (a comparison and one product); a few units in the last place for
// the others (the GPU's exp, tanh and erfc, and contracted multiply-adds).
template <typename T> double tolerance(tsl_activation kind)
{
    if (kind == TSL_ACT_RELU || kind == TSL_ACT_LEAKY_RELU)
        return 0.0;
    return std::is_same<T, float>::value ? 2e-6 : 1e-14;
}

template <typename T> void check_activation(tsl_activation kind, bool in_place)
{
    const size_t n = 100003; // more than one block, not a multiple of one
    tsl_act_args a{};
    a.kind = kind;
    a.dtype = dtype_of<T>();
    a.count = (int64_t)n;
    a.slope = 0.125;
    a.in_place = in_place ? 1 : 0;
    std::vector<T> x = random_values<T>(n, 1 + kind, (T)-6, (T)6);
    std::vector<T> dy = random_values<T>(n, 101 + kind, (T)-1, (T)1);

    // Forward.
    std::vector<T> y_cpu(n), y_gpu(n);
    tsl_act_forward(&a, x.data(), y_cpu.data());
    if (in_place) {
        y_gpu = x;
        run_on_cuda(tsl_cl_act_forward, a, std::vector<std::vector<T> *>{&y_gpu}, {STARPU_RW});
    } else {
        std::vector<T> xin = x;
        run_on_cuda(tsl_cl_act_forward, a, std::vector<std::vector<T> *>{&xin, &y_gpu},
                    {STARPU_R, STARPU_W});
        EXPECT_EQ(xin, x) << "forward wrote its input";
    }
    // Backward, from x (ReLU, LeakyReLU, GELU) or y (sigmoid, tanh).
    const std::vector<T> &in = (kind == TSL_ACT_SIGMOID || kind == TSL_ACT_TANH) ? y_cpu : x;
    std::vector<T> dx_cpu(n), dx_gpu(n);
    tsl_act_backward(&a, in.data(), dy.data(), dx_cpu.data());
    std::vector<T> in_copy = in;
    if (in_place) {
        dx_gpu = dy;
        run_on_cuda(tsl_cl_act_backward, a, std::vector<std::vector<T> *>{&in_copy, &dx_gpu},
                    {STARPU_R, STARPU_RW});
    } else {
        std::vector<T> dy_copy = dy;
        run_on_cuda(tsl_cl_act_backward, a,
                    std::vector<std::vector<T> *>{&in_copy, &dy_copy, &dx_gpu},
                    {STARPU_R, STARPU_R, STARPU_W});
    }

    const double tol = tolerance<T>(kind);
    double worst_y = 0, worst_dx = 0;
    for (size_t i = 0; i < n; i++) {
        worst_y = std::max(worst_y, std::fabs((double)y_gpu[i] - (double)y_cpu[i]) /
                                        (1 + std::fabs((double)y_cpu[i])));
        worst_dx = std::max(worst_dx, std::fabs((double)dx_gpu[i] - (double)dx_cpu[i]) /
                                          (1 + std::fabs((double)dx_cpu[i])));
    }
    EXPECT_LE(worst_y, tol) << "forward, kind " << kind << (in_place ? ", in place" : "");
    EXPECT_LE(worst_dx, tol) << "backward, kind " << kind << (in_place ? ", in place" : "");
}

const tsl_activation all_kinds[] = {TSL_ACT_RELU, TSL_ACT_LEAKY_RELU, TSL_ACT_SIGMOID, TSL_ACT_TANH,
                                    TSL_ACT_GELU};

} // namespace

TEST(Cuda, ActivationF32MatchesCpu)
{
    SKIP_WITHOUT_CUDA();
    for (tsl_activation kind : all_kinds)
        for (bool in_place : {false, true})
            check_activation<float>(kind, in_place);
}

TEST(Cuda, ActivationF64MatchesCpu)
{
    SKIP_WITHOUT_CUDA();
    for (tsl_activation kind : all_kinds)
        for (bool in_place : {false, true})
            check_activation<double>(kind, in_place);
}

#ifdef TESSEL_USE_CUDA
namespace
{
// On a CUDA worker: its cuBLAS and cuDNN handles exist and run on the worker's stream.
void check_handles_cuda(void *buffers[], void *cl_arg)
{
    int *ok = (int *)cl_arg;
    cudaStream_t stream = starpu_cuda_get_local_stream(), s_blas = nullptr, s_dnn = nullptr;
    TSL_CUBLAS_CHECK(cublasGetStream(tsl_cuda_cublas(), &s_blas));
    TSL_CUDNN_CHECK(cudnnGetStream(tsl_cuda_cudnn(), &s_dnn));
    *ok = s_blas == stream && s_dnn == stream;
}
} // namespace
#endif

TEST(Cuda, HandlesOnEveryWorkerStream)
{
    SKIP_WITHOUT_CUDA();
#ifdef TESSEL_USE_CUDA
    struct starpu_codelet cl = {};
    cl.where = STARPU_CUDA;
    cl.cuda_funcs[0] = check_handles_cuda;
    cl.nbuffers = 0;
    cl.name = "tsl_test_cuda_handles";
    unsigned nworkers = starpu_worker_get_count();
    for (unsigned w = 0; w < nworkers; w++) {
        if (starpu_worker_get_type((int)w) != STARPU_CUDA_WORKER)
            continue;
        int ok = 0;
        struct starpu_task *task = starpu_task_create();
        task->cl = &cl;
        task->cl_arg = &ok;
        task->execute_on_a_specific_worker = 1;
        task->workerid = w;
        task->synchronous = 1;
        ASSERT_EQ(starpu_task_submit(task), 0);
        EXPECT_EQ(ok, 1) << "worker " << w << ": handles not bound to its stream";
    }
#endif
}
