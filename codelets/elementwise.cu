/* Elementwise tile ops on CUDA: scale, axpy, add, multiply (f32, f64) over the element functions of
 * elementwise_math.h, and placement marks; launched on the worker's stream (the codelets are
 * STARPU_CUDA_ASYNC). Compiled with -fmad=false: the same bits as the CPU loops. */
#include <starpu.h>

#include "cuda_check.h"
#include "cuda_launch.h"
#include "elementwise.h"
#include "elementwise_math.h"

namespace
{

#define ELEMENTWISE_KERNELS(T, SFX)                                                                \
    __global__ void scale_##SFX(int64_t n, T alpha, T *x)                                          \
    {                                                                                              \
        TSL_CUDA_FOR(i, n)                                                                         \
        {                                                                                          \
            x[i] = tsl_scale_##SFX(x[i], alpha);                                                   \
        }                                                                                          \
    }                                                                                              \
    __global__ void axpy_##SFX(int64_t n, T alpha, const T *x, T *y)                               \
    {                                                                                              \
        TSL_CUDA_FOR(i, n)                                                                         \
        {                                                                                          \
            y[i] = tsl_axpy_##SFX(y[i], alpha, x[i]);                                              \
        }                                                                                          \
    }                                                                                              \
    /* z may alias a or b (the same element read, then written) */                                 \
    __global__ void add_##SFX(int64_t n, T alpha, const T *a, const T *b, T *z)                    \
    {                                                                                              \
        TSL_CUDA_FOR(i, n)                                                                         \
        {                                                                                          \
            z[i] = tsl_add_##SFX(a[i], b[i], alpha);                                               \
        }                                                                                          \
    }                                                                                              \
    __global__ void mul_##SFX(int64_t n, const T *a, const T *b, T *z)                             \
    {                                                                                              \
        TSL_CUDA_FOR(i, n)                                                                         \
        {                                                                                          \
            z[i] = tsl_mul_##SFX(a[i], b[i]);                                                      \
        }                                                                                          \
    }

ELEMENTWISE_KERNELS(float, f32)
ELEMENTWISE_KERNELS(double, f64)

/* z may alias x */
__global__ void dropout_f32(int64_t n, double p, const float *x, const float *u, float *z)
{
    TSL_CUDA_FOR(i, n)
    {
        z[i] = tsl_dropout_f32(x[i], u[i], p);
    }
}

__global__ void mark_i32(int64_t n, int32_t value, int32_t *tile)
{
    TSL_CUDA_FOR(i, n)
    {
        tile[i] = value;
    }
}

void *buf(void *buffers[], int i)
{
    return (void *)STARPU_VECTOR_GET_PTR(buffers[i]);
}

int64_t count_of(void *buffers[], int i)
{
    return (int64_t)STARPU_VECTOR_GET_NX(buffers[i]);
}

} // namespace

extern "C" void tsl_scale_cuda(void *buffers[], void *cl_arg)
{
    tsl_elementwise_args a;
    starpu_codelet_unpack_args(cl_arg, &a);
    TSL_CODELET_CHECK(count_of(buffers, 0) == a.count, "scale (CUDA): tile size");
    TSL_CODELET_CHECK(a.dtype == TSL_F32 || a.dtype == TSL_F64, "scale (CUDA): dtype");
    if (a.count == 0)
        return;
    cudaStream_t stream = starpu_cuda_get_local_stream();
    unsigned blocks = tsl_cuda_blocks(a.count);
    if (a.dtype == TSL_F32)
        scale_f32<<<blocks, TSL_CUDA_THREADS, 0, stream>>>(a.count, (float)a.alpha,
                                                           (float *)buf(buffers, 0));
    else
        scale_f64<<<blocks, TSL_CUDA_THREADS, 0, stream>>>(a.count, a.alpha,
                                                           (double *)buf(buffers, 0));
    TSL_CUDA_CHECK_LAUNCH();
}

extern "C" void tsl_axpy_cuda(void *buffers[], void *cl_arg)
{
    tsl_elementwise_args a;
    starpu_codelet_unpack_args(cl_arg, &a);
    TSL_CODELET_CHECK(count_of(buffers, 0) == a.count && count_of(buffers, 1) == a.count,
                      "axpy (CUDA): tile sizes");
    TSL_CODELET_CHECK(a.dtype == TSL_F32 || a.dtype == TSL_F64, "axpy (CUDA): dtype");
    if (a.count == 0)
        return;
    cudaStream_t stream = starpu_cuda_get_local_stream();
    unsigned blocks = tsl_cuda_blocks(a.count);
    if (a.dtype == TSL_F32)
        axpy_f32<<<blocks, TSL_CUDA_THREADS, 0, stream>>>(
            a.count, (float)a.alpha, (const float *)buf(buffers, 0), (float *)buf(buffers, 1));
    else
        axpy_f64<<<blocks, TSL_CUDA_THREADS, 0, stream>>>(
            a.count, a.alpha, (const double *)buf(buffers, 0), (double *)buf(buffers, 1));
    TSL_CUDA_CHECK_LAUNCH();
}

extern "C" void tsl_add_cuda(void *buffers[], void *cl_arg)
{
    tsl_elementwise_args a;
    starpu_codelet_unpack_args(cl_arg, &a);
    TSL_CODELET_CHECK(starpu_task_get_current()->nbuffers == 3, "add (CUDA): three buffers");
    TSL_CODELET_CHECK(count_of(buffers, 0) >= a.count && count_of(buffers, 1) >= a.count &&
                          count_of(buffers, 2) == a.count,
                      "add (CUDA): tile sizes");
    TSL_CODELET_CHECK(a.dtype == TSL_F32 || a.dtype == TSL_F64, "add (CUDA): dtype");
    if (a.count == 0)
        return;
    cudaStream_t stream = starpu_cuda_get_local_stream();
    unsigned blocks = tsl_cuda_blocks(a.count);
    if (a.dtype == TSL_F32)
        add_f32<<<blocks, TSL_CUDA_THREADS, 0, stream>>>(
            a.count, (float)a.alpha, (const float *)buf(buffers, 0), (const float *)buf(buffers, 1),
            (float *)buf(buffers, 2));
    else
        add_f64<<<blocks, TSL_CUDA_THREADS, 0, stream>>>(
            a.count, a.alpha, (const double *)buf(buffers, 0), (const double *)buf(buffers, 1),
            (double *)buf(buffers, 2));
    TSL_CUDA_CHECK_LAUNCH();
}

extern "C" void tsl_mul_cuda(void *buffers[], void *cl_arg)
{
    tsl_elementwise_args a;
    starpu_codelet_unpack_args(cl_arg, &a);
    TSL_CODELET_CHECK(starpu_task_get_current()->nbuffers == 3, "mul (CUDA): three buffers");
    TSL_CODELET_CHECK(count_of(buffers, 0) >= a.count && count_of(buffers, 1) >= a.count &&
                          count_of(buffers, 2) == a.count,
                      "mul (CUDA): tile sizes");
    TSL_CODELET_CHECK(a.dtype == TSL_F32 || a.dtype == TSL_F64, "mul (CUDA): dtype");
    if (a.count == 0)
        return;
    cudaStream_t stream = starpu_cuda_get_local_stream();
    unsigned blocks = tsl_cuda_blocks(a.count);
    if (a.dtype == TSL_F32)
        mul_f32<<<blocks, TSL_CUDA_THREADS, 0, stream>>>(a.count, (const float *)buf(buffers, 0),
                                                         (const float *)buf(buffers, 1),
                                                         (float *)buf(buffers, 2));
    else
        mul_f64<<<blocks, TSL_CUDA_THREADS, 0, stream>>>(a.count, (const double *)buf(buffers, 0),
                                                         (const double *)buf(buffers, 1),
                                                         (double *)buf(buffers, 2));
    TSL_CUDA_CHECK_LAUNCH();
}

extern "C" void tsl_dropout_cuda(void *buffers[], void *cl_arg)
{
    tsl_elementwise_args a;
    starpu_codelet_unpack_args(cl_arg, &a);
    TSL_CODELET_CHECK(starpu_task_get_current()->nbuffers == 3, "dropout (CUDA): three buffers");
    TSL_CODELET_CHECK(count_of(buffers, 0) >= a.count && count_of(buffers, 1) >= a.count &&
                          count_of(buffers, 2) == a.count,
                      "dropout (CUDA): tile sizes");
    TSL_CODELET_CHECK(a.dtype == TSL_F32, "dropout (CUDA): dtype");
    if (a.count == 0)
        return;
    cudaStream_t stream = starpu_cuda_get_local_stream();
    dropout_f32<<<tsl_cuda_blocks(a.count), TSL_CUDA_THREADS, 0, stream>>>(
        a.count, a.alpha, (const float *)buf(buffers, 0), (const float *)buf(buffers, 1),
        (float *)buf(buffers, 2));
    TSL_CUDA_CHECK_LAUNCH();
}

extern "C" void tsl_mark_cuda(void *buffers[], void *cl_arg)
{
    tsl_mark_args a;
    starpu_codelet_unpack_args(cl_arg, &a);
    TSL_CODELET_CHECK(count_of(buffers, 0) >= a.count, "mark (CUDA): tile size");
    if (a.count == 0)
        return;
    int32_t value = a.rank * 1000 + starpu_worker_get_id();
    mark_i32<<<tsl_cuda_blocks(a.count), TSL_CUDA_THREADS, 0, starpu_cuda_get_local_stream()>>>(
        a.count, value, (int32_t *)buf(buffers, 0));
    TSL_CUDA_CHECK_LAUNCH();
}
