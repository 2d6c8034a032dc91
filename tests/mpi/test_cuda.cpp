// CUDA activations and the workers' library handles (the shared runner and checks:
// cuda_test.h; the other families: test_cuda_<family>.cpp).
#include "cuda_test.h"

extern "C" {
#include "codelets/activation.h"
}

namespace
{
using namespace tsltest;

// Exact but for GELU (the GPU's erfc and exp: a few units in the last place); sigmoid, tanh and
// SiLU use tessel's own exp and tanh on both sides (hd_exp.h).
template <typename T> double tolerance(tsl_activation kind)
{
    if (kind != TSL_ACT_GELU)
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
    std::vector<T> y_cpu(n), y_gpu = poisoned<T>(n);
    tsl_act_forward(&a, x.data(), y_cpu.data());
    if (in_place) {
        y_gpu = x;
        run_on_cuda(tsl_cl_act_forward, a, {cuda_buf(y_gpu, STARPU_RW)});
    } else {
        std::vector<T> xin = x;
        run_on_cuda(tsl_cl_act_forward, a, {cuda_buf(xin, STARPU_R), cuda_buf(y_gpu, STARPU_W)});
        EXPECT_EQ(xin, x) << "forward wrote its input";
    }
    // Backward, from x (ReLU, LeakyReLU, GELU) or y (sigmoid, tanh).
    const std::vector<T> &in = (kind == TSL_ACT_SIGMOID || kind == TSL_ACT_TANH) ? y_cpu : x;
    std::vector<T> dx_cpu(n), dx_gpu = poisoned<T>(n);
    tsl_act_backward(&a, in.data(), dy.data(), dx_cpu.data());
    std::vector<T> in_copy = in;
    if (in_place) {
        dx_gpu = dy;
        run_on_cuda(tsl_cl_act_backward, a,
                    {cuda_buf(in_copy, STARPU_R), cuda_buf(dx_gpu, STARPU_RW)});
    } else {
        std::vector<T> dy_copy = dy;
        run_on_cuda(
            tsl_cl_act_backward, a,
            {cuda_buf(in_copy, STARPU_R), cuda_buf(dy_copy, STARPU_R), cuda_buf(dx_gpu, STARPU_W)});
    }

    const double tol = tolerance<T>(kind);
    double worst_y = worst_error(y_gpu, y_cpu), worst_dx = worst_error(dx_gpu, dx_cpu);
    EXPECT_LE(worst_y, tol) << "forward, kind " << kind << (in_place ? ", in place" : "");
    EXPECT_LE(worst_dx, tol) << "backward, kind " << kind << (in_place ? ", in place" : "");
}

const tsl_activation all_kinds[] = {TSL_ACT_RELU, TSL_ACT_LEAKY_RELU, TSL_ACT_SIGMOID,
                                    TSL_ACT_TANH, TSL_ACT_GELU,       TSL_ACT_SILU};
static_assert(sizeof all_kinds / sizeof all_kinds[0] == TSL_ACTIVATION_COUNT,
              "every activation kind on the GPU");

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
