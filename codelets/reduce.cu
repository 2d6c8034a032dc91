/* Exact sums on CUDA: the tile's partial sum into a fixed-point accumulator and the merge of
 * accumulator arrays, with the CPU's bits (reduce_cuda.cuh says how and why). */
#include <starpu.h>

#include "cuda_check.h"
#include "reduce.h"
#include "reduce_cuda.cuh"

namespace
{

using namespace tsl_exact;

__device__ inline void add_element(thread_acc &t, shared_acc *s, float v)
{
    t.add(s, (double)v);
}

__device__ inline void add_element(thread_acc &t, shared_acc *s, double v)
{
    t.add(s, v);
}

__device__ inline void add_element(thread_acc &t, shared_acc *s, int32_t v)
{
    t.add_integer(s, v);
}

__device__ inline void add_element(thread_acc &t, shared_acc *s, uint8_t v)
{
    t.add_integer(s, v);
}

/* out (zeroed) += the block's share of x[0 .. n). */
template <typename T> __global__ void sum_blocks(const T *x, int64_t n, tsl_acc *out)
{
    __shared__ shared_acc s;
    shared_zero(&s, 1);
    __syncthreads();
    thread_acc t;
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        add_element(t, &s, x[i]);
    t.flush(&s);
    __syncthreads();
    shared_merge_out(&s, out, 1);
}

/* out (zeroed) += the block's share of the squares of x[i] - y[i]: each difference rounded to
 * float, its square exact in double (24-bit significands), as the CPU's sum_sqdiff. */
__global__ void sqdiff_blocks(const float *x, const float *y, int64_t n, tsl_acc *out)
{
    __shared__ shared_acc s;
    shared_zero(&s, 1);
    __syncthreads();
    thread_acc t;
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float d = __fsub_rn(x[i], y[i]);
        t.add(&s, __dmul_rn((double)d, (double)d));
    }
    t.flush(&s);
    __syncthreads();
    shared_merge_out(&s, out, 1);
}

template <typename T> void launch_sum(const void *x, int64_t n, tsl_acc *out, cudaStream_t stream)
{
    sum_blocks<T><<<grid_for(n), block_threads, 0, stream>>>((const T *)x, n, out);
    TSL_CUDA_CHECK_LAUNCH();
}

} // namespace

extern "C" void tsl_sum_partial_cuda(void *buffers[], void *cl_arg)
{
    tsl_sum_args a;
    starpu_codelet_unpack_args(cl_arg, &a);
    const void *tile = (const void *)STARPU_VECTOR_GET_PTR(buffers[0]);
    tsl_acc *acc = (tsl_acc *)STARPU_VECTOR_GET_PTR(buffers[1]);
    TSL_CODELET_CHECK(tsl_acc_buffer_ok(buffers[1]), "sum (CUDA): accumulator size");
    uint64_t elem = a.dtype == TSL_F64 ? 8 : a.dtype == TSL_F32 || a.dtype == TSL_I32 ? 4 : 1;
    TSL_CODELET_CHECK(a.count >= 0 &&
                          (uint64_t)a.count * elem <= (uint64_t)STARPU_VECTOR_GET_NX(buffers[0]) *
                                                          STARPU_VECTOR_GET_ELEMSIZE(buffers[0]),
                      "sum (CUDA): tile size");
    cudaStream_t stream = starpu_cuda_get_local_stream();
    TSL_CUDA_CHECK(cudaMemsetAsync(acc, 0, sizeof(tsl_acc), stream));
    if (a.count > 0) {
        switch ((tsl_dtype)a.dtype) {
        case TSL_F32:
            launch_sum<float>(tile, a.count, acc, stream);
            break;
        case TSL_F64:
            launch_sum<double>(tile, a.count, acc, stream);
            break;
        case TSL_I32:
            launch_sum<int32_t>(tile, a.count, acc, stream);
            break;
        case TSL_U8:
            launch_sum<uint8_t>(tile, a.count, acc, stream);
            break;
        default:
            TSL_CODELET_CHECK(0, "sum (CUDA): dtype");
        }
    }
    normalize(acc, 1, stream);
}

/* The exact sum of (x[i] - y[i])^2 over two f32 tiles (a residual norm, tsl_cl_sum_sqdiff):
 * the CPU's accumulator bit for bit. */
extern "C" void tsl_sum_sqdiff_cuda(void *buffers[], void *cl_arg)
{
    tsl_sum_args a;
    starpu_codelet_unpack_args(cl_arg, &a);
    const float *x = (const float *)STARPU_VECTOR_GET_PTR(buffers[0]);
    const float *y = (const float *)STARPU_VECTOR_GET_PTR(buffers[1]);
    tsl_acc *acc = (tsl_acc *)STARPU_VECTOR_GET_PTR(buffers[2]);
    TSL_CODELET_CHECK(tsl_sqdiff_buffers_ok(buffers, &a),
                      "squared difference (CUDA): f32 tiles of the count and an accumulator");
    cudaStream_t stream = starpu_cuda_get_local_stream();
    TSL_CUDA_CHECK(cudaMemsetAsync(acc, 0, sizeof(tsl_acc), stream));
    if (a.count > 0) {
        sqdiff_blocks<<<grid_for(a.count), block_threads, 0, stream>>>(x, y, a.count, acc);
        TSL_CUDA_CHECK_LAUNCH();
    }
    normalize(acc, 1, stream);
}

extern "C" void tsl_sum_merge_cuda(void *buffers[], void *cl_arg)
{
    (void)cl_arg;
    size_t bytes = STARPU_VECTOR_GET_NX(buffers[0]) * STARPU_VECTOR_GET_ELEMSIZE(buffers[0]);
    TSL_CODELET_CHECK(bytes % sizeof(tsl_acc) == 0 &&
                          bytes == STARPU_VECTOR_GET_NX(buffers[1]) *
                                       STARPU_VECTOR_GET_ELEMSIZE(buffers[1]),
                      "merge (CUDA): accumulator arrays differ");
    int64_t count = (int64_t)(bytes / sizeof(tsl_acc));
    if (count == 0)
        return;
    const tsl_acc *src = (const tsl_acc *)STARPU_VECTOR_GET_PTR(buffers[0]);
    tsl_acc *dst = (tsl_acc *)STARPU_VECTOR_GET_PTR(buffers[1]);
    merge_accs<<<(unsigned)((count + 63) / 64), 64, 0, starpu_cuda_get_local_stream()>>>(dst, src,
                                                                                         count);
    TSL_CUDA_CHECK_LAUNCH();
}
