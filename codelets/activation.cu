/* Activations on CUDA: forward and backward over one tile (f32, f64), the element math of
 * activation_math.h, launched on the worker's stream (the codelets are STARPU_CUDA_ASYNC). */
#include <starpu.h>

#include "activation.h"
#include "activation_math.h"
#include "cuda_check.h"

namespace
{

constexpr int threads_per_block = 256;
constexpr int64_t max_blocks = 65535;

/* The blocks for n elements: one thread an element, up to max_blocks (then grid-stride). */
unsigned blocks_for(int64_t n)
{
    int64_t b = (n + threads_per_block - 1) / threads_per_block;
    return (unsigned)(b < max_blocks ? b : max_blocks);
}

#define ACT_KERNELS(T, SFX)                                                                        \
    __global__ void act_forward_##SFX(int kind, T slope, int64_t n, const T *x, T *y)              \
    {                                                                                              \
        int64_t stride = (int64_t)gridDim.x * blockDim.x;                                          \
        for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {     \
            T v = x[i];                                                                            \
            switch (kind) {                                                                        \
            case TSL_ACT_RELU:                                                                     \
                y[i] = tsl_relu_fwd_##SFX(v);                                                      \
                break;                                                                             \
            case TSL_ACT_LEAKY_RELU:                                                               \
                y[i] = tsl_leaky_relu_fwd_##SFX(v, slope);                                         \
                break;                                                                             \
            case TSL_ACT_SIGMOID:                                                                  \
                y[i] = tsl_sigmoid_fwd_##SFX(v);                                                   \
                break;                                                                             \
            case TSL_ACT_TANH:                                                                     \
                y[i] = tsl_tanh_fwd_##SFX(v);                                                      \
                break;                                                                             \
            case TSL_ACT_SILU:                                                                     \
                y[i] = tsl_silu_fwd_##SFX(v);                                                      \
                break;                                                                             \
            default:                                                                               \
                y[i] = tsl_gelu_fwd_##SFX(v);                                                      \
                break; /* TSL_ACT_GELU, checked on the host */                                     \
            }                                                                                      \
        }                                                                                          \
    }                                                                                              \
    __global__ void act_backward_##SFX(int kind, T slope, int64_t n, const T *in, const T *dy,     \
                                       T *dx)                                                      \
    {                                                                                              \
        int64_t stride = (int64_t)gridDim.x * blockDim.x;                                          \
        for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {     \
            T v = in[i], g = dy[i];                                                                \
            switch (kind) {                                                                        \
            case TSL_ACT_RELU:                                                                     \
                dx[i] = tsl_relu_bwd_##SFX(v, g);                                                  \
                break;                                                                             \
            case TSL_ACT_LEAKY_RELU:                                                               \
                dx[i] = tsl_leaky_relu_bwd_##SFX(v, g, slope);                                     \
                break;                                                                             \
            case TSL_ACT_SIGMOID:                                                                  \
                dx[i] = tsl_sigmoid_bwd_##SFX(v, g);                                               \
                break;                                                                             \
            case TSL_ACT_TANH:                                                                     \
                dx[i] = tsl_tanh_bwd_##SFX(v, g);                                                  \
                break;                                                                             \
            case TSL_ACT_SILU:                                                                     \
                dx[i] = tsl_silu_bwd_##SFX(v, g);                                                  \
                break;                                                                             \
            default:                                                                               \
                dx[i] = tsl_gelu_bwd_##SFX(v, g);                                                  \
                break;                                                                             \
            }                                                                                      \
        }                                                                                          \
    }

ACT_KERNELS(float, f32)
ACT_KERNELS(double, f64)

bool known_kind(int kind)
{
    switch (kind) {
    case TSL_ACT_RELU:
    case TSL_ACT_LEAKY_RELU:
    case TSL_ACT_SIGMOID:
    case TSL_ACT_TANH:
    case TSL_ACT_GELU:
    case TSL_ACT_SILU:
        return true;
    }
    return false;
}

void *buf(void *buffers[], int i)
{
    return (void *)STARPU_VECTOR_GET_PTR(buffers[i]);
}

} // namespace

extern "C" void tsl_act_forward_cuda(void *buffers[], void *cl_arg)
{
    tsl_act_args a;
    starpu_codelet_unpack_args(cl_arg, &a);
    int last = a.in_place ? 0 : 1;
    TSL_CODELET_CHECK((int64_t)STARPU_VECTOR_GET_NX(buffers[last]) == a.count,
                      "activation (CUDA): tile size");
    TSL_CODELET_CHECK(known_kind(a.kind), "activation forward (CUDA): unknown kind");
    if (a.count == 0)
        return;
    cudaStream_t stream = starpu_cuda_get_local_stream();
    unsigned blocks = blocks_for(a.count);
    if (a.dtype == TSL_F32)
        act_forward_f32<<<blocks, threads_per_block, 0, stream>>>(a.kind, (float)a.slope, a.count,
                                                                  (const float *)buf(buffers, 0),
                                                                  (float *)buf(buffers, last));
    else if (a.dtype == TSL_F64)
        act_forward_f64<<<blocks, threads_per_block, 0, stream>>>(a.kind, a.slope, a.count,
                                                                  (const double *)buf(buffers, 0),
                                                                  (double *)buf(buffers, last));
    else
        TSL_CODELET_CHECK(0, "activation forward (CUDA): unknown dtype");
    TSL_CUDA_CHECK_LAUNCH();
}

extern "C" void tsl_act_backward_cuda(void *buffers[], void *cl_arg)
{
    tsl_act_args a;
    starpu_codelet_unpack_args(cl_arg, &a);
    int last = a.in_place ? 1 : 2;
    TSL_CODELET_CHECK((int64_t)STARPU_VECTOR_GET_NX(buffers[last]) == a.count,
                      "activation backward (CUDA): tile size");
    TSL_CODELET_CHECK(known_kind(a.kind), "activation backward (CUDA): unknown kind");
    if (a.count == 0)
        return;
    cudaStream_t stream = starpu_cuda_get_local_stream();
    unsigned blocks = blocks_for(a.count);
    if (a.dtype == TSL_F32)
        act_backward_f32<<<blocks, threads_per_block, 0, stream>>>(
            a.kind, (float)a.slope, a.count, (const float *)buf(buffers, 0),
            (const float *)buf(buffers, 1), (float *)buf(buffers, last));
    else if (a.dtype == TSL_F64)
        act_backward_f64<<<blocks, threads_per_block, 0, stream>>>(
            a.kind, a.slope, a.count, (const double *)buf(buffers, 0),
            (const double *)buf(buffers, 1), (double *)buf(buffers, last));
    else
        TSL_CODELET_CHECK(0, "activation backward (CUDA): unknown dtype");
    TSL_CUDA_CHECK_LAUNCH();
}
