/* Fully connected layer on CUDA: the GEMMs with cuBLAS on the worker's handle (bound to its
 * stream), the bias and its gradient with own kernels; f32 and f64, the CPU's row-major layout
 * (codelets/linear.c). cuBLAS is column-major: a row-major (r x c) matrix is its column-major
 * transpose, so each row-major product below is issued as the product of the transposes.
 *
 * Math: f64 always exact FMA; f32 uses TF32 tensor cores only when tsl_cuda_tf32() allows it
 * (CUBLAS_TF32_TENSOR_OP_MATH), else CUBLAS_DEFAULT_MATH. The handle is shared by the worker's
 * codelets, so the mode is set before each GEMM.
 *
 * The bias gradient sums every column of dy row after row in the dtype, as the CPU loop does,
 * one thread a column: the same additions in the same order, so the same bits. */
#include <limits.h>
#include <starpu.h>

#include "cuda_check.h"
#include "linear.h"

namespace
{

constexpr int threads_per_block = 256;
constexpr int64_t max_blocks = 65535;

unsigned blocks_for(int64_t n)
{
    int64_t b = (n + threads_per_block - 1) / threads_per_block;
    return (unsigned)(b < 1 ? 1 : b < max_blocks ? b : max_blocks);
}

void *buf(void *buffers[], int i)
{
    return (void *)STARPU_VECTOR_GET_PTR(buffers[i]);
}

int64_t nx(void *buffers[], int i)
{
    return (int64_t)STARPU_VECTOR_GET_NX(buffers[i]);
}

/* y (rows x out) += b, per column. */
template <typename T> __global__ void add_bias(int64_t rows, int64_t out, const T *b, T *y)
{
    int64_t n = rows * out, stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        y[i] += b[i % out];
}

/* The sample tiles of a bias gradient: db[j] = (first ? 0 : db[j]) + the column sums of each
 * tile's dy (rows x out), tile after tile, row after row. */
struct column_sums {
    const void *dy[TSL_LINEAR_MAX_TILES];
    int64_t rows[TSL_LINEAR_MAX_TILES];
    int ntiles;
};

template <typename T> __global__ void sum_columns(column_sums s, int64_t out, T *db)
{
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < out; j += stride) {
        T sum = 0;
        for (int t = 0; t < s.ntiles; t++) {
            const T *dy = (const T *)s.dy[t];
            for (int64_t r = 0; r < s.rows[t]; r++)
                sum += dy[r * out + j];
        }
        db[j] = sum;
    }
}

/* The GEMMs' sizes as cuBLAS's ints; the CPU path takes ints too. */
int as_int(int64_t v, const char *what)
{
    TSL_CODELET_CHECK(v >= 0 && v <= INT_MAX, what);
    return (int)v;
}

/* The handle with the math mode for the dtype. */
cublasHandle_t blas_for(int dtype)
{
    TSL_CODELET_CHECK(dtype == TSL_F32 || dtype == TSL_F64, "linear (CUDA): unknown dtype");
    cublasHandle_t h = tsl_cuda_cublas();
    TSL_CUBLAS_CHECK(cublasSetMathMode(
        h, dtype == TSL_F32 && tsl_cuda_tf32() ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
    return h;
}

/* Column-major C (m x n, ldc) = alpha op(A) op(B) + beta C, in the dtype. */
void gemm(cublasHandle_t h, int dtype, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
          int k, const void *A, int lda, const void *B, int ldb, double beta, void *C, int ldc)
{
    if (dtype == TSL_F32) {
        const float one = 1.0f, b = (float)beta;
        TSL_CUBLAS_CHECK(cublasSgemm(h, ta, tb, m, n, k, &one, (const float *)A, lda,
                                     (const float *)B, ldb, &b, (float *)C, ldc));
    } else {
        const double one = 1.0;
        TSL_CUBLAS_CHECK(cublasDgemm(h, ta, tb, m, n, k, &one, (const double *)A, lda,
                                     (const double *)B, ldb, &beta, (double *)C, ldc));
    }
}

void launch_sum_columns(int dtype, const column_sums &s, int64_t out, void *db)
{
    if (out == 0)
        return;
    cudaStream_t stream = starpu_cuda_get_local_stream();
    if (dtype == TSL_F32)
        sum_columns<float><<<blocks_for(out), threads_per_block, 0, stream>>>(s, out, (float *)db);
    else
        sum_columns<double>
            <<<blocks_for(out), threads_per_block, 0, stream>>>(s, out, (double *)db);
    TSL_CUDA_CHECK_LAUNCH();
}

} // namespace

extern "C" void tsl_linear_forward_cuda(void *buffers[], void *cl_arg)
{
    tsl_linear_args a;
    starpu_codelet_unpack_args(cl_arg, &a);
    int yb = a.has_bias ? 3 : 2;
    TSL_CODELET_CHECK(nx(buffers, 0) == a.rows * a.in && nx(buffers, 1) == a.out * a.in &&
                          nx(buffers, yb) == a.rows * a.out,
                      "linear forward (CUDA): tile sizes");
    int n = as_int(a.rows, "linear forward (CUDA): rows"), k = as_int(a.in, "linear: in"),
        o = as_int(a.out, "linear: out");
    cublasHandle_t h = blas_for(a.dtype);
    /* y (n x o) = x (n x k) w^T: column-major y^T (o x n) = w (o x k) x^T (k x n). */
    gemm(h, a.dtype, CUBLAS_OP_T, CUBLAS_OP_N, o, n, k, buf(buffers, 1), k, buf(buffers, 0), k, 0.0,
         buf(buffers, yb), o);
    if (!a.has_bias || (int64_t)n * o == 0)
        return;
    cudaStream_t stream = starpu_cuda_get_local_stream();
    unsigned blocks = blocks_for((int64_t)n * o);
    if (a.dtype == TSL_F32)
        add_bias<float><<<blocks, threads_per_block, 0, stream>>>(
            n, o, (const float *)buf(buffers, 2), (float *)buf(buffers, yb));
    else
        add_bias<double><<<blocks, threads_per_block, 0, stream>>>(
            n, o, (const double *)buf(buffers, 2), (double *)buf(buffers, yb));
    TSL_CUDA_CHECK_LAUNCH();
}

extern "C" void tsl_linear_backward_data_cuda(void *buffers[], void *cl_arg)
{
    tsl_linear_args a;
    starpu_codelet_unpack_args(cl_arg, &a);
    TSL_CODELET_CHECK(nx(buffers, 0) == a.rows * a.out && nx(buffers, 2) == a.rows * a.in,
                      "linear backward data (CUDA): tile sizes");
    int n = as_int(a.rows, "linear backward data (CUDA): rows"), k = as_int(a.in, "linear: in"),
        o = as_int(a.out, "linear: out");
    /* dx (n x k) = dy (n x o) w (o x k): column-major dx^T (k x n) = w^T (k x o) dy^T (o x n). */
    gemm(blas_for(a.dtype), a.dtype, CUBLAS_OP_N, CUBLAS_OP_N, k, n, o, buf(buffers, 1), k,
         buf(buffers, 0), o, 0.0, buf(buffers, 2), k);
}

extern "C" void tsl_linear_backward_weights_cuda(void *buffers[], void *cl_arg)
{
    tsl_linear_args a;
    starpu_codelet_unpack_args(cl_arg, &a);
    TSL_CODELET_CHECK(nx(buffers, 0) == a.rows * a.in && nx(buffers, 1) == a.rows * a.out &&
                          nx(buffers, 2) == a.out * a.in &&
                          (!a.has_bias || nx(buffers, 3) == a.out),
                      "linear backward weights (CUDA): tile sizes");
    int n = as_int(a.rows, "linear backward weights (CUDA): rows"), k = as_int(a.in, "linear: in"),
        o = as_int(a.out, "linear: out");
    /* dw (o x k) = dy^T (o x n) x (n x k): column-major dw^T (k x o) = x^T (k x n) dy (n x o). */
    gemm(blas_for(a.dtype), a.dtype, CUBLAS_OP_N, CUBLAS_OP_T, k, o, n, buf(buffers, 0), k,
         buf(buffers, 1), o, 0.0, buf(buffers, 2), k);
    if (!a.has_bias)
        return;
    column_sums s = {};
    s.ntiles = 1;
    s.dy[0] = buf(buffers, 1);
    s.rows[0] = a.rows;
    launch_sum_columns(a.dtype, s, a.out, buf(buffers, 3));
}

extern "C" void tsl_linear_weight_rows_cuda(void *buffers[], void *cl_arg)
{
    tsl_linear_rows_args a;
    starpu_codelet_unpack_args(cl_arg, &a);
    TSL_CODELET_CHECK(a.ntiles >= 1 && a.ntiles <= TSL_LINEAR_MAX_TILES,
                      "linear weight rows (CUDA): tile count");
    TSL_CODELET_CHECK(a.row0 >= 0 && a.nrows >= 0 && a.row0 + a.nrows <= a.out,
                      "linear weight rows (CUDA): row block");
    int at = 2 * a.ntiles;
    TSL_CODELET_CHECK(nx(buffers, at) == a.nrows * a.in &&
                          (!a.has_bias || nx(buffers, at + 1) == a.out),
                      "linear weight rows (CUDA): gradient sizes");
    int k = as_int(a.in, "linear: in"), o = as_int(a.out, "linear: out"),
        rows = as_int(a.nrows, "linear weight rows (CUDA): rows");
    cublasHandle_t h = blas_for(a.dtype);
    size_t elem = a.dtype == TSL_F32 ? sizeof(float) : sizeof(double);
    column_sums s = {};
    s.ntiles = a.ntiles;
    for (int t = 0; t < a.ntiles; t++) {
        TSL_CODELET_CHECK(nx(buffers, 2 * t) == a.samples[t] * a.in &&
                              nx(buffers, 2 * t + 1) == a.samples[t] * a.out,
                          "linear weight rows (CUDA): tile sizes");
        int n = as_int(a.samples[t], "linear weight rows (CUDA): samples");
        const char *dy = (const char *)buf(buffers, 2 * t + 1);
        /* dw (rows x k) (+)= dy[:, row0 ..]^T (rows x n) x (n x k): column-major
         * dw^T (k x rows) = x^T (k x n) dy[:, row0 ..] (n x rows), dy's rows o apart. */
        gemm(h, a.dtype, CUBLAS_OP_N, CUBLAS_OP_T, k, rows, n, buf(buffers, 2 * t), k,
             dy + (size_t)a.row0 * elem, o, t ? 1.0 : 0.0, buf(buffers, at), k);
        s.dy[t] = dy;
        s.rows[t] = a.samples[t];
    }
    if (a.has_bias)
        launch_sum_columns(a.dtype, s, a.out, buf(buffers, at + 1));
}
