/* Per-CUDA-worker library handles, built only with TESSEL_USE_CUDA (see cuda_handles.h). */
#include <starpu.h>

#include "codelets/cuda_check.h"
#include "cuda_handles.h"

static cublasHandle_t cublas_handles[STARPU_NMAXWORKERS];
static cudnnHandle_t cudnn_handles[STARPU_NMAXWORKERS];
static int users; /* contexts holding the handles; contexts start and stop one at a time */

/* On each CUDA worker, by starpu_execute_on_each_worker(). */
static void create_handles(void *arg)
{
    (void)arg;
    int id = starpu_worker_get_id_check();
    cudaStream_t stream = starpu_cuda_get_local_stream();
    TSL_CUBLAS_CHECK(cublasCreate(&cublas_handles[id]));
    TSL_CUBLAS_CHECK(cublasSetStream(cublas_handles[id], stream));
    TSL_CUDNN_CHECK(cudnnCreate(&cudnn_handles[id]));
    TSL_CUDNN_CHECK(cudnnSetStream(cudnn_handles[id], stream));
}

static void destroy_handles(void *arg)
{
    (void)arg;
    int id = starpu_worker_get_id_check();
    if (cudnn_handles[id])
        TSL_CUDNN_CHECK(cudnnDestroy(cudnn_handles[id]));
    if (cublas_handles[id])
        TSL_CUBLAS_CHECK(cublasDestroy(cublas_handles[id]));
    cudnn_handles[id] = NULL;
    cublas_handles[id] = NULL;
}

void tsl_cuda_handles_acquire(void)
{
    if (users++ == 0)
        starpu_execute_on_each_worker(create_handles, NULL, STARPU_CUDA);
}

void tsl_cuda_handles_release(void)
{
    if (users > 0 && --users == 0)
        starpu_execute_on_each_worker(destroy_handles, NULL, STARPU_CUDA);
}

cublasHandle_t tsl_cuda_cublas(void)
{
    int id = starpu_worker_get_id();
    TSL_CODELET_CHECK(id >= 0 && cublas_handles[id], "tsl_cuda_cublas: not on a CUDA worker of a "
                                                     "running tessel context");
    return cublas_handles[id];
}

cudnnHandle_t tsl_cuda_cudnn(void)
{
    int id = starpu_worker_get_id();
    TSL_CODELET_CHECK(id >= 0 && cudnn_handles[id], "tsl_cuda_cudnn: not on a CUDA worker of a "
                                                    "running tessel context");
    return cudnn_handles[id];
}
