/* Fills on CUDA: constant and uniform fills of a tile (any dtype and layout), one thread an
 * element over the element functions of fill_math.h: the CPU's bits, whatever the worker.
 * Normal fills stay on CPU workers (fill.c's can_execute). Compiled with -fmad=false. */
#include <starpu.h>

#include "copy.h"
#include "cuda_check.h"
#include "cuda_launch.h"
#include "fill.h"
#include "fill_math.h"

namespace
{

/* The tile in memory order: extents and global strides right-aligned into five dimensions
 * (the innermost last), and the global index of the tile's first element. */
struct fill_walk {
    int64_t ext[TSL_MAX_DIMS], stride[TSL_MAX_DIMS], base;
};

__global__ void fill_kernel(int64_t n, fill_walk w, int32_t dtype, int32_t mode, uint64_t seed,
                            double a, double b, void *tile)
{
    TSL_CUDA_FOR(i, n)
    {
        /* the global C-order index of memory element i */
        int64_t rest = i, index = w.base;
        for (int k = TSL_MAX_DIMS - 1; k >= 0; k--) {
            index += rest % w.ext[k] * w.stride[k];
            rest /= w.ext[k];
        }
        tsl_fill_store(dtype, mode, a, b, tile, i,
                       tsl_fill_element(mode, seed, a, b, (uint64_t)index));
    }
}

} // namespace

extern "C" void tsl_fill_cuda(void *buffers[], void *cl_arg)
{
    tsl_fill_args args;
    starpu_codelet_unpack_args(cl_arg, &args);
    void *tile = (void *)STARPU_VECTOR_GET_PTR(buffers[0]);
    TSL_CODELET_CHECK(tile, "fill (CUDA) on an unallocated tile");
    TSL_CODELET_CHECK(args.mode == TSL_FILL_CONSTANT || args.mode == TSL_FILL_UNIFORM,
                      "fill (CUDA): constant and uniform fills only (normal ones run on CPUs)");
    TSL_CODELET_CHECK(args.dtype == TSL_F32 || args.dtype == TSL_F64 || args.dtype == TSL_I32 ||
                          args.dtype == TSL_I64 || args.dtype == TSL_U8,
                      "fill (CUDA): unknown dtype");
    TSL_CODELET_CHECK(args.ndim >= 0 && args.ndim <= TSL_MAX_DIMS, "fill (CUDA): dimensions");
    /* the same walk as tsl_fill_tile() */
    int32_t order[TSL_MAX_DIMS];
    tsl_layout_order(args.layout, args.ndim, order);
    fill_walk w;
    w.base = 0;
    int pad = TSL_MAX_DIMS - args.ndim;
    int64_t n = 1;
    for (int k = 0; k < TSL_MAX_DIMS; k++) {
        int d = k >= pad ? order[k - pad] : -1;
        w.ext[k] = d >= 0 ? args.extent[d] : 1;
        w.stride[k] = d >= 0 ? args.global_strides[d] : 0;
        n *= w.ext[k];
    }
    for (int d = 0; d < args.ndim; d++)
        w.base += args.start[d] * args.global_strides[d];
    TSL_CODELET_CHECK(n >= 0 && (int64_t)STARPU_VECTOR_GET_NX(buffers[0]) >= n,
                      "fill (CUDA): the tile is smaller than its extents");
    if (n == 0)
        return;
    fill_kernel<<<tsl_cuda_blocks(n), TSL_CUDA_THREADS, 0, starpu_cuda_get_local_stream()>>>(
        n, w, args.dtype, args.mode, args.seed, args.a, args.b, tile);
    TSL_CUDA_CHECK_LAUNCH();
}

/* tsl_cl_zero's CUDA function: StarPU calls it on the CUDA worker that first reads a transient
 * tile no task has written, before the reading task's kernels, which run on the same stream. */
extern "C" void tsl_zero_cuda(void *buffers[], void *cl_arg)
{
    (void)cl_arg;
    void *tile = (void *)STARPU_VECTOR_GET_PTR(buffers[0]);
    TSL_CODELET_CHECK(tile, "zero (CUDA) on an unallocated tile");
    TSL_CUDA_CHECK(cudaMemsetAsync(
        tile, 0, (size_t)STARPU_VECTOR_GET_NX(buffers[0]) * STARPU_VECTOR_GET_ELEMSIZE(buffers[0]),
        starpu_cuda_get_local_stream()));
}
