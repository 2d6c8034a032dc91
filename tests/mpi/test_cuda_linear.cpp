// CUDA linear codelets (cuBLAS) against the CPU kernels: forward with and without bias, backward
// data, backward weights, and the weight gradient of a row block over several sample tiles, in f32
// and f64, on sizes that are no multiple of any block. TF32 is off (mpi_test_main.cpp), so f32
// agrees within 1e-5; the bias gradients add the same values in the same order, so they are exact.
#include "cuda_test.h"

extern "C" {
#include "codelets/linear.h"
}

namespace
{
using namespace tsltest;

template <typename T> double gemm_tolerance()
{
    return std::is_same<T, float>::value ? 1e-5 : 1e-12;
}

template <typename T> void check_linear(int64_t rows, int64_t in, int64_t out, bool bias)
{
    tsl_linear_args a{};
    a.dtype = dtype_of<T>();
    a.has_bias = bias ? 1 : 0;
    a.rows = rows;
    a.in = in;
    a.out = out;
    const uint64_t salt = (uint64_t)(rows * 1000 + in * 10 + out);
    std::vector<T> x = random_values<T>((size_t)(rows * in), salt + 1, (T)-1, (T)1);
    std::vector<T> w = random_values<T>((size_t)(out * in), salt + 2, (T)-1, (T)1);
    std::vector<T> b = random_values<T>((size_t)out, salt + 3, (T)-1, (T)1);
    std::vector<T> dy = random_values<T>((size_t)(rows * out), salt + 4, (T)-1, (T)1);
    const std::string what = "rows " + std::to_string(rows) + ", in " + std::to_string(in) +
                             ", out " + std::to_string(out) + (bias ? ", bias" : "");

    // Forward.
    std::vector<T> y_cpu((size_t)(rows * out)), y_gpu = poisoned<T>(y_cpu.size());
    tsl_linear_forward_kernel(&a, x.data(), w.data(), bias ? b.data() : nullptr, y_cpu.data());
    if (bias)
        run_on_cuda(tsl_cl_linear_forward, a,
                    {cuda_buf(x, STARPU_R), cuda_buf(w, STARPU_R), cuda_buf(b, STARPU_R),
                     cuda_buf(y_gpu, STARPU_W)});
    else
        run_on_cuda(tsl_cl_linear_forward, a,
                    {cuda_buf(x, STARPU_R), cuda_buf(w, STARPU_R), cuda_buf(y_gpu, STARPU_W)});
    EXPECT_LE(worst_error(y_gpu, y_cpu), gemm_tolerance<T>()) << "forward, " << what;

    // Backward data.
    std::vector<T> dx_cpu((size_t)(rows * in)), dx_gpu = poisoned<T>(dx_cpu.size());
    tsl_linear_backward_data_kernel(&a, dy.data(), w.data(), dx_cpu.data());
    run_on_cuda(tsl_cl_linear_backward_data, a,
                {cuda_buf(dy, STARPU_R), cuda_buf(w, STARPU_R), cuda_buf(dx_gpu, STARPU_W)});
    EXPECT_LE(worst_error(dx_gpu, dx_cpu), gemm_tolerance<T>()) << "backward data, " << what;

    // Backward weights.
    std::vector<T> dw_cpu((size_t)(out * in)), dw_gpu = poisoned<T>(dw_cpu.size());
    std::vector<T> db_cpu((size_t)out), db_gpu = poisoned<T>(db_cpu.size());
    tsl_linear_backward_weights_kernel(&a, x.data(), dy.data(), dw_cpu.data(),
                                       bias ? db_cpu.data() : nullptr);
    if (bias)
        run_on_cuda(tsl_cl_linear_backward_weights, a,
                    {cuda_buf(x, STARPU_R), cuda_buf(dy, STARPU_R), cuda_buf(dw_gpu, STARPU_W),
                     cuda_buf(db_gpu, STARPU_W)});
    else
        run_on_cuda(tsl_cl_linear_backward_weights, a,
                    {cuda_buf(x, STARPU_R), cuda_buf(dy, STARPU_R), cuda_buf(dw_gpu, STARPU_W)});
    EXPECT_LE(worst_error(dw_gpu, dw_cpu), gemm_tolerance<T>()) << "backward weights, " << what;
    if (bias)
        EXPECT_EQ(worst_error(db_gpu, db_cpu), 0.0) << "bias gradient, " << what;
}

// The rows [row0, row0 + nrows) of the weight gradient over tiles of the given sample counts.
template <typename T>
void check_weight_rows(const std::vector<int64_t> &samples, int64_t in, int64_t out, int64_t row0,
                       int64_t nrows, bool bias)
{
    tsl_linear_rows_args a{};
    a.dtype = dtype_of<T>();
    a.ntiles = (int32_t)samples.size();
    a.has_bias = bias ? 1 : 0;
    a.in = in;
    a.out = out;
    a.row0 = row0;
    a.nrows = nrows;
    std::vector<std::vector<T>> x, dy;
    std::vector<const void *> xp, dyp;
    for (size_t t = 0; t < samples.size(); t++) {
        a.samples[t] = samples[t];
        x.push_back(random_values<T>((size_t)(samples[t] * in), 200 + t, (T)-1, (T)1));
        dy.push_back(random_values<T>((size_t)(samples[t] * out), 300 + t, (T)-1, (T)1));
    }
    for (size_t t = 0; t < samples.size(); t++) {
        xp.push_back(x[t].data());
        dyp.push_back(dy[t].data());
    }
    std::vector<T> dw_cpu((size_t)(nrows * in)), dw_gpu = poisoned<T>(dw_cpu.size());
    std::vector<T> db_cpu((size_t)out), db_gpu = poisoned<T>(db_cpu.size());
    tsl_linear_weight_rows_kernel(&a, xp.data(), dyp.data(), dw_cpu.data(),
                                  bias ? db_cpu.data() : nullptr);
    std::vector<CudaBuf> bufs;
    for (size_t t = 0; t < samples.size(); t++) {
        bufs.push_back(cuda_buf(x[t], STARPU_R));
        bufs.push_back(cuda_buf(dy[t], STARPU_R));
    }
    bufs.push_back(cuda_buf(dw_gpu, STARPU_W));
    if (bias)
        bufs.push_back(cuda_buf(db_gpu, STARPU_W));
    run_on_cuda(tsl_cl_linear_weight_rows, a, bufs);
    EXPECT_LE(worst_error(dw_gpu, dw_cpu), gemm_tolerance<T>())
        << "weight rows " << row0 << " + " << nrows << (bias ? ", bias" : "");
    if (bias)
        EXPECT_EQ(worst_error(db_gpu, db_cpu), 0.0) << "weight rows: bias gradient";
}

template <typename T> void check_all()
{
    for (bool bias : {false, true}) {
        check_linear<T>(7, 13, 5, bias);
        check_linear<T>(33, 300, 17, bias);
        check_linear<T>(1, 5, 129, bias);
    }
    check_weight_rows<T>({7, 3, 11}, 13, 9, 2, 5, true);
    check_weight_rows<T>({5}, 300, 17, 0, 17, false);
}

} // namespace

TEST(CudaLinear, F32MatchesCpu)
{
    SKIP_WITHOUT_CUDA();
    check_all<float>();
}

TEST(CudaLinear, F64MatchesCpu)
{
    SKIP_WITHOUT_CUDA();
    check_all<double>();
}
