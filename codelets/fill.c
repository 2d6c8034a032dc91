/* Fills: constant, and seeded uniform / normal from a counter-based generator, so that
 * element i of a tensor depends only on (seed, i), whatever the tile grid. The element
 * functions are in fill_math.h, shared with the CUDA kernels (fill.cu). */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "codelet.h"
#include "copy.h"
#include "fill.h"
#include "fill_math.h"

double tsl_fill_value(const tsl_fill_args *args, uint64_t index)
{
    return tsl_fill_element(args->mode, args->seed, args->a, args->b, index);
}

static inline void store(const tsl_fill_args *args, void *tile, int64_t i, double v)
{
    if (!tsl_fill_store(args->dtype, args->mode, args->a, args->b, tile, i, v))
        TSL_CODELET_CHECK(0, "fill: unknown dtype");
}

void tsl_fill_tile(const tsl_fill_args *args, void *tile)
{
    /* Walk the tile in memory order; each element's value depends on its global C-order
     * index, whatever the tile's storage layout. */
    int ndim = args->ndim;
    int32_t order[TSL_MAX_DIMS];
    tsl_layout_order(args->layout, ndim, order);
    int64_t ext[TSL_MAX_DIMS], stride[TSL_MAX_DIMS], base = 0;
    int pad = TSL_MAX_DIMS - ndim;
    for (int k = 0; k < TSL_MAX_DIMS; k++) {
        int d = k >= pad ? order[k - pad] : -1;
        ext[k] = d >= 0 ? args->extent[d] : 1;
        stride[k] = d >= 0 ? args->global_strides[d] : 0;
    }
    for (int d = 0; d < ndim; d++)
        base += args->start[d] * args->global_strides[d];
    int64_t i = 0;
    for (int64_t i0 = 0; i0 < ext[0]; i0++)
        for (int64_t i1 = 0; i1 < ext[1]; i1++)
            for (int64_t i2 = 0; i2 < ext[2]; i2++)
                for (int64_t i3 = 0; i3 < ext[3]; i3++) {
                    int64_t row =
                        base + i0 * stride[0] + i1 * stride[1] + i2 * stride[2] + i3 * stride[3];
                    for (int64_t i4 = 0; i4 < ext[4]; i4++, i++)
                        store(args, tile, i,
                              tsl_fill_value(args, (uint64_t)(row + i4 * stride[4])));
                }
}

static void fill_cpu(void *buffers[], void *cl_arg)
{
    tsl_fill_args args;
    starpu_codelet_unpack_args(cl_arg, &args);
    void *tile = (void *)STARPU_VECTOR_GET_PTR(buffers[0]);
    TSL_CODELET_CHECK(tile, "fill on an unallocated tile");
    tsl_fill_tile(&args, tile);
}

/* The footprint: the tile size, the fill mode, the dtype and the tile's layout. */
static uint32_t fill_variant(struct starpu_task *task)
{
    tsl_fill_args a;
    starpu_codelet_unpack_args(task->cl_arg, &a);
    uint32_t h = starpu_task_data_footprint(task);
    h = tsl_hash_i64(h, a.mode);
    h = tsl_hash_i64(h, a.dtype);
    return tsl_hash_i64(h, a.layout);
}

#ifdef TESSEL_USE_CUDA
/* Normal fills only on CPU workers: CUDA's log and cos may differ from the C library's in the
 * last bit, and a tensor's values must not depend on where its tiles were filled. */
static int fill_can_execute(unsigned workerid, struct starpu_task *task, unsigned nimpl)
{
    (void)nimpl;
    if (starpu_worker_get_type((int)workerid) != STARPU_CUDA_WORKER)
        return 1;
    tsl_fill_args a;
    starpu_codelet_unpack_args(task->cl_arg, &a);
    return a.mode != TSL_FILL_NORMAL;
}
/* (the CUDA slot and can_execute exist only with TESSEL_USE_CUDA) */
#define FILL_CAN_EXECUTE .can_execute = fill_can_execute
#else
#define FILL_CAN_EXECUTE .can_execute = NULL
#endif

/* The CUDA function (fill.cu) fills the CUDA slot only when TESSEL_USE_CUDA is defined. */
TSL_CODELET(tsl_cl_fill, "tsl_fill", fill_cpu, tsl_fill_cuda, fill_variant, .nbuffers = 1,
            .modes = {STARPU_W}, FILL_CAN_EXECUTE);

/* Zeros a whole vector tile: the value StarPU gives a transient tile that a task reads before
 * any task wrote it (tsl_tensor_create_transient(), initialisation codelet of its handles). */
static void zero_cpu(void *buffers[], void *cl_arg)
{
    (void)cl_arg;
    void *tile = (void *)STARPU_VECTOR_GET_PTR(buffers[0]);
    TSL_CODELET_CHECK(tile, "zero on an unallocated tile");
    memset(tile, 0,
           (size_t)STARPU_VECTOR_GET_NX(buffers[0]) * STARPU_VECTOR_GET_ELEMSIZE(buffers[0]));
}

/* No perf model: StarPU runs it as a reduction's initialisation, not as a task of its own. */
struct starpu_codelet tsl_cl_zero = {
    .cpu_funcs = {zero_cpu},
    .cpu_funcs_name = {"zero_cpu"},
#ifdef TESSEL_USE_CUDA
    .cuda_funcs = {tsl_zero_cuda},
    .cuda_flags = {STARPU_CUDA_ASYNC},
#endif
    .nbuffers = 1,
    .modes = {STARPU_W},
    .name = "tsl_zero",
};
