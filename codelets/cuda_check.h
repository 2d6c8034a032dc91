/* What the CUDA codelets share (built only with TESSEL_USE_CUDA): the checks that wrap every
 * CUDA runtime, cuDNN and cuBLAS call, and the worker's library handles.
 *
 * A failed call aborts through TSL_CODELET_FAIL (codelet.h), which prints file, line, MPI
 * rank, the call and the library's error string. */
#ifndef TESSEL_CODELETS_CUDA_CHECK_H
#define TESSEL_CODELETS_CUDA_CHECK_H

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include "codelet.h"

#define TSL_CUDA_CHECK(call)                                                                       \
    do {                                                                                           \
        cudaError_t tsl_cuda_err_ = (call);                                                        \
        if (tsl_cuda_err_ != cudaSuccess)                                                          \
            TSL_CODELET_FAIL(#call, cudaGetErrorString(tsl_cuda_err_));                            \
    } while (0)

#define TSL_CUDNN_CHECK(call)                                                                      \
    do {                                                                                           \
        cudnnStatus_t tsl_cudnn_err_ = (call);                                                     \
        if (tsl_cudnn_err_ != CUDNN_STATUS_SUCCESS)                                                \
            TSL_CODELET_FAIL(#call, cudnnGetErrorString(tsl_cudnn_err_));                          \
    } while (0)

#define TSL_CUBLAS_CHECK(call)                                                                     \
    do {                                                                                           \
        cublasStatus_t tsl_cublas_err_ = (call);                                                   \
        if (tsl_cublas_err_ != CUBLAS_STATUS_SUCCESS)                                              \
            TSL_CODELET_FAIL(#call, cublasGetStatusString(tsl_cublas_err_));                       \
    } while (0)

/* Checks the last kernel launch (a bad configuration or an earlier asynchronous error). */
#define TSL_CUDA_CHECK_LAUNCH() TSL_CUDA_CHECK(cudaGetLastError())

#ifdef __cplusplus
extern "C" {
#endif

/* The calling CUDA worker's cuBLAS and cuDNN handles, bound to its stream
 * (starpu_cuda_get_local_stream()). Made for every CUDA worker when a tessel context starts
 * (src/cuda_handles.c); a call from anything but a CUDA worker of a running context aborts. */
cublasHandle_t tsl_cuda_cublas(void);
cudnnHandle_t tsl_cuda_cudnn(void);

/* ---- the dense families (convolution, linear): TF32 and the worker's workspace ---- */

/* Whether f32 convolutions and GEMMs may use TF32 tensor cores: environment variable
 * TESSEL_CUDA_TF32, read once ("0": no, FMA math only; "1" or unset: yes, as PyTorch allows for
 * convolutions by default). */
int tsl_cuda_tf32(void);

/* Whether convolutions take only algorithms cuDNN reports deterministic (the same bits on every
 * run: no floating-point atomics in the weight and data gradients): environment variable
 * TESSEL_CUDA_DETERMINISTIC, read once ("0": any algorithm, the heuristics' first; "1" or unset:
 * deterministic ones first, any other only where the problem has none). Run-to-run identical
 * results are what tessel's recompute, resume and plan-equality guarantees rest on. */
int tsl_cuda_deterministic(void);

/* The calling CUDA worker's device workspace, at least `bytes` long (NULL for 0 bytes). It grows
 * on the worker's stream (the old one freed stream-ordered after the work already queued that
 * uses it), so the pointer stays valid for the work the caller queues on that stream until the
 * caller's next call; take one workspace per codelet for everything it needs. Freed with the
 * handles. */
void *tsl_cuda_workspace(size_t bytes);

#ifdef __cplusplus
}
#endif

#endif /* TESSEL_CODELETS_CUDA_CHECK_H */
