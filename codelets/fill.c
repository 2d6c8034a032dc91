/* Fills: constant, and seeded uniform / normal from a counter-based generator, so that
 * element i of a tensor depends only on (seed, i), whatever the tile grid. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "codelet.h"
#include "copy.h"
#include "fill.h"

/* SplitMix64 finaliser: a bijective 64-bit mix with full avalanche. */
static inline uint64_t mix64(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* Two independent 64-bit words for (seed, index). */
static inline void counter_hash(uint64_t seed, uint64_t index, uint64_t *h1, uint64_t *h2)
{
    uint64_t key = mix64(seed);
    *h1 = mix64(key ^ mix64(2 * index));
    *h2 = mix64(key ^ mix64(2 * index + 1));
}

/* Uniform in [0, 1) with 53 random bits. */
static inline double unit_open_high(uint64_t h)
{
    return (double)(h >> 11) * 0x1.0p-53;
}

double tsl_fill_value(const tsl_fill_args *args, uint64_t index)
{
    if (args->mode == TSL_FILL_CONSTANT)
        return args->a;
    uint64_t h1, h2;
    counter_hash(args->seed, index, &h1, &h2);
    if (args->mode == TSL_FILL_UNIFORM)
        return args->a + (args->b - args->a) * unit_open_high(h1);
    /* Box-Muller: u1 in (0, 1] keeps the logarithm finite. */
    double u1 = (double)((h1 >> 11) + 1) * 0x1.0p-53;
    double u2 = unit_open_high(h2);
    const double two_pi = 6.283185307179586476925286766559;
    return args->a + args->b * sqrt(-2.0 * log(u1)) * cos(two_pi * u2);
}

/* Store a double as the tile's dtype. A uniform fill keeps values below `high` even
 * after rounding to float; integers take the floor. */
static inline void store(const tsl_fill_args *args, void *tile, int64_t i, double v)
{
    switch ((tsl_dtype)args->dtype) {
    case TSL_F32: {
        float f = (float)v;
        if (args->mode == TSL_FILL_UNIFORM && (double)f >= args->b && args->b > args->a)
            f = nextafterf((float)args->b, -INFINITY);
        ((float *)tile)[i] = f;
        return;
    }
    case TSL_F64:
        ((double *)tile)[i] = v;
        return;
    case TSL_I32:
        ((int32_t *)tile)[i] = (int32_t)floor(v);
        return;
    case TSL_I64:
        ((int64_t *)tile)[i] = (int64_t)floor(v);
        return;
    case TSL_U8:
        ((uint8_t *)tile)[i] = (uint8_t)floor(v);
        return;
    }
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

TSL_CODELET(tsl_cl_fill, "tsl_fill", fill_cpu, NULL, fill_variant, .nbuffers = 1,
            .modes = {STARPU_W});

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
    .nbuffers = 1,
    .modes = {STARPU_W},
    .name = "tsl_zero",
};
