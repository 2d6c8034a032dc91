/* TSL_HD marks a function that both the CPU kernels (C) and the CUDA kernels (nvcc) call:
 * __host__ __device__ under nvcc, nothing otherwise. Element-wise kernel bodies are written
 * once as `static inline TSL_HD` functions, so the CPU tests also check the GPU's arithmetic. */
#ifndef TESSEL_CODELETS_HD_H
#define TESSEL_CODELETS_HD_H

#ifdef __CUDACC__
#define TSL_HD __host__ __device__
#else
#define TSL_HD
#endif

#endif /* TESSEL_CODELETS_HD_H */
