/* Per-CUDA-worker library handles, built only with TESSEL_USE_CUDA (see cuda_handles.h). */
#include <pthread.h>
#include <starpu.h>
#include <stdlib.h>
#include <string.h>

#include "codelets/cuda_check.h"
#include "cuda_handles.h"

static cublasHandle_t cublas_handles[STARPU_NMAXWORKERS];
static cudnnHandle_t cudnn_handles[STARPU_NMAXWORKERS];
/* The dense families' workspaces (tsl_cuda_workspace), one per CUDA worker. */
static void *workspaces[STARPU_NMAXWORKERS];
static size_t workspace_bytes[STARPU_NMAXWORKERS];
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
    if (workspaces[id]) {
        cudaStream_t stream = starpu_cuda_get_local_stream();
        TSL_CUDA_CHECK(cudaFreeAsync(workspaces[id], stream));
        TSL_CUDA_CHECK(cudaStreamSynchronize(stream));
        workspaces[id] = NULL;
        workspace_bytes[id] = 0;
    }
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

/* ---- the dense families: TF32 and the worker's workspace ---- */

/* On/off settings read once from the environment: "0" off, anything else or unset on. */
static int tf32 = 1, deterministic = 1;
static pthread_once_t settings_once = PTHREAD_ONCE_INIT;

static int env_on(const char *name)
{
    const char *v = getenv(name);
    return !(v && strcmp(v, "0") == 0);
}

static void read_settings(void)
{
    tf32 = env_on("TESSEL_CUDA_TF32");
    deterministic = env_on("TESSEL_CUDA_DETERMINISTIC");
}

int tsl_cuda_tf32(void)
{
    pthread_once(&settings_once, read_settings);
    return tf32;
}

int tsl_cuda_deterministic(void)
{
    pthread_once(&settings_once, read_settings);
    return deterministic;
}

void *tsl_cuda_workspace(size_t bytes)
{
    int id = starpu_worker_get_id();
    TSL_CODELET_CHECK(id >= 0 && cudnn_handles[id], "tsl_cuda_workspace: not on a CUDA worker of "
                                                    "a running tessel context");
    if (bytes == 0)
        return NULL;
    if (workspace_bytes[id] < bytes) {
        /* Grow by at least half, in whole MiB, so that a few shapes settle it quickly. */
        size_t want = workspace_bytes[id] + workspace_bytes[id] / 2;
        if (want < bytes)
            want = bytes;
        want = (want + ((size_t)1 << 20) - 1) & ~(((size_t)1 << 20) - 1);
        cudaStream_t stream = starpu_cuda_get_local_stream();
        if (workspaces[id])
            TSL_CUDA_CHECK(cudaFreeAsync(workspaces[id], stream));
        workspaces[id] = NULL;
        workspace_bytes[id] = 0;
        TSL_CUDA_CHECK(cudaMallocAsync(&workspaces[id], want, stream));
        workspace_bytes[id] = want;
    }
    return workspaces[id];
}
