/* Optimizer updates on CUDA: SGD (with or without momentum, Nesterov) and Adam / AdamW of one
 * parameter tile (f32, f64), one thread an element over the element functions of
 * optimizer_math.h, in double as the CPU; launched on the worker's stream (the codelet is
 * STARPU_CUDA_ASYNC). Compiled with -fmad=false: the same bits as the CPU loops. */
#include <starpu.h>

#include "cuda_check.h"
#include "cuda_launch.h"
#include "optimizer.h"
#include "optimizer_math.h"

namespace
{

/* buf: the momentum buffer, or NULL (no momentum); first: the parameter's first update. */
template <typename T>
__global__ void sgd_kernel(int64_t n, tsl_sgd_config c, int first, T *param, const T *grad, T *buf)
{
    const int momentum = buf != NULL;
    TSL_CUDA_FOR(i, n)
    {
        double b = momentum && !first ? (double)buf[i] : 0.0;
        double p = tsl_sgd_element(&c, first, momentum, (double)param[i], (double)grad[i], &b);
        if (momentum)
            buf[i] = (T)b;
        param[i] = (T)p;
    }
}

template <typename T>
__global__ void adam_kernel(int64_t n, tsl_adam_config c, double step_size, double bias2_sqrt,
                            T *param, const T *grad, T *m, T *v)
{
    TSL_CUDA_FOR(i, n)
    {
        double mi = m[i], vi = v[i];
        double p = tsl_adam_element(&c, step_size, bias2_sqrt, (double)param[i], (double)grad[i],
                                    &mi, &vi);
        m[i] = (T)mi;
        v[i] = (T)vi;
        param[i] = (T)p;
    }
}

template <typename T> void launch(const tsl_update_args &a, void *const ptr[4], cudaStream_t stream)
{
    unsigned blocks = tsl_cuda_blocks(a.count);
    if (a.kind == TSL_OPT_SGD) {
        sgd_kernel<T><<<blocks, TSL_CUDA_THREADS, 0, stream>>>(
            a.count, a.sgd, a.step == 1, (T *)ptr[0], (const T *)ptr[1], (T *)ptr[2]);
        return;
    }
    double step_size, bias2_sqrt;
    tsl_adam_bias(&a, &step_size, &bias2_sqrt);
    adam_kernel<T><<<blocks, TSL_CUDA_THREADS, 0, stream>>>(a.count, a.adam, step_size, bias2_sqrt,
                                                            (T *)ptr[0], (const T *)ptr[1],
                                                            (T *)ptr[2], (T *)ptr[3]);
}

} // namespace

extern "C" void tsl_update_cuda(void *buffers[], void *cl_arg)
{
    tsl_update_args a;
    void *ptr[4];
    tsl_update_task(buffers, cl_arg, &a, ptr);
    tsl_update_check(&a, ptr[2], ptr[3]);
    if (a.count == 0)
        return;
    cudaStream_t stream = starpu_cuda_get_local_stream();
    if (a.dtype == TSL_F32)
        launch<float>(a, ptr, stream);
    else
        launch<double>(a, ptr, stream);
    TSL_CUDA_CHECK_LAUNCH();
}
