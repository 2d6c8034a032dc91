/* Launch sizes of the element-wise CUDA kernels (grid-stride loops): one thread an element,
 * up to TSL_CUDA_MAX_BLOCKS blocks of TSL_CUDA_THREADS threads; a kernel's loop strides by the
 * whole grid past that. Only for .cu files. */
#ifndef TESSEL_CODELETS_CUDA_LAUNCH_H
#define TESSEL_CODELETS_CUDA_LAUNCH_H

#include <stdint.h>

#define TSL_CUDA_THREADS 256
#define TSL_CUDA_MAX_BLOCKS 65535

/* The blocks for n > 0 elements. */
static inline unsigned tsl_cuda_blocks(int64_t n)
{
    int64_t b = (n + TSL_CUDA_THREADS - 1) / TSL_CUDA_THREADS;
    return (unsigned)(b < TSL_CUDA_MAX_BLOCKS ? b : TSL_CUDA_MAX_BLOCKS);
}

/* The grid-stride loop over [0, n): the body sees int64_t i. */
#define TSL_CUDA_FOR(i, n)                                                                         \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                      \
         i += (int64_t)gridDim.x * blockDim.x)

#endif /* TESSEL_CODELETS_CUDA_LAUNCH_H */
