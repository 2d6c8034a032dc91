/* Per-CUDA-worker library handles (src/cuda_handles.c): one cuBLAS and one cuDNN handle for every
 * CUDA worker, bound to the worker's stream, for the CUDA codelets (codelets/cuda_check.h).
 * Without TESSEL_USE_CUDA both calls do nothing. */
#ifndef TESSEL_SRC_CUDA_HANDLES_H
#define TESSEL_SRC_CUDA_HANDLES_H

#ifdef TESSEL_USE_CUDA
/* Makes the handles on the first call (StarPU running), counts the later ones. */
void tsl_cuda_handles_acquire(void);
/* Destroys the handles when the last acquire is released (before StarPU stops). */
void tsl_cuda_handles_release(void);
#else
static inline void tsl_cuda_handles_acquire(void)
{
}
static inline void tsl_cuda_handles_release(void)
{
}
#endif

#endif /* TESSEL_SRC_CUDA_HANDLES_H */
