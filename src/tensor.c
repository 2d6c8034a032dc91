/* Tiled tensors: creation with owner maps, layout and tile queries, fills, placement marks.
 * Moving data between tensors and host arrays (scatter, gather, region copies,
 * redistribution, replicas) is in tensor_move.c. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "codelets/elementwise.h"
#include "codelets/fill.h"
#include "internal.h"
#include "tessel/starpu.h"

tsl_status tsl_tensor_check(struct tsl_tensor *tensor, const char *what)
{
    if (!tensor)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "%s: tensor is NULL", what);
    return TSL_OK;
}

tsl_status tsl_tensor_check_float(tsl_tensor_t t, const char *fn)
{
    if (t->dtype != TSL_F32 && t->dtype != TSL_F64)
        return tsl_error(t->ctx, TSL_ERR_DTYPE, "%s: needs f32 or f64, not %s", fn,
                         tsl_dtype_name(t->dtype));
    return TSL_OK;
}

/* Same context, dtype, shape and tile grid (owners may differ). */
tsl_status tsl_tensor_check_same_layout(tsl_tensor_t a, tsl_tensor_t b, const char *fn)
{
    if (a->ctx != b->ctx)
        return tsl_error(a->ctx, TSL_ERR_INVALID_ARG, "%s: tensors belong to different contexts",
                         fn);
    if (a->dtype != b->dtype)
        return tsl_error(a->ctx, TSL_ERR_DTYPE, "%s: dtypes %s and %s differ", fn,
                         tsl_dtype_name(a->dtype), tsl_dtype_name(b->dtype));
    if (a->shape.ndim != b->shape.ndim ||
        memcmp(a->shape.dims, b->shape.dims, sizeof a->shape.dims) != 0)
        return tsl_error(a->ctx, TSL_ERR_SHAPE, "%s: shapes differ", fn);
    if (memcmp(a->grid.splits, b->grid.splits, sizeof a->grid.splits) != 0)
        return tsl_error(a->ctx, TSL_ERR_SHAPE,
                         "%s: tile grids differ (use tsl_tensor_redistribute first)", fn);
    if (a->layout != b->layout)
        return tsl_error(a->ctx, TSL_ERR_SHAPE,
                         "%s: layouts %s and %s differ (use tsl_tensor_redistribute first)", fn,
                         tsl_layout_name(a->layout), tsl_layout_name(b->layout));
    return TSL_OK;
}

tsl_status tsl_tensor_check_plain(tsl_tensor_t t, const char *fn)
{
    if (t && t->layout != TSL_LAYOUT_PLAIN)
        return tsl_error(t->ctx, TSL_ERR_UNSUPPORTED,
                         "%s: needs plain tiles, not %s (convert with tsl_tensor_redistribute)", fn,
                         tsl_layout_name(t->layout));
    return TSL_OK;
}

void tsl_shape_strides(const tsl_shape *shape, int64_t strides[TSL_MAX_DIMS])
{
    int64_t stride = 1;
    for (int d = TSL_MAX_DIMS - 1; d >= 0; d--) {
        strides[d] = d < shape->ndim ? stride : 0;
        if (d < shape->ndim)
            stride *= shape->dims[d];
    }
}

/* Row-major tile number -> tile coordinates. */
static void tile_coords(const struct tsl_tensor *t, int64_t index, int32_t coords[TSL_MAX_DIMS])
{
    for (int d = TSL_MAX_DIMS - 1; d >= 0; d--) {
        if (d >= t->shape.ndim) {
            coords[d] = 0;
            continue;
        }
        coords[d] = (int32_t)(index % t->grid.splits[d]);
        index /= t->grid.splits[d];
    }
}

void tsl_tensor_tile_box(const struct tsl_tensor *t, int64_t index, int64_t start[TSL_MAX_DIMS],
                         int64_t extent[TSL_MAX_DIMS])
{
    int32_t coords[TSL_MAX_DIMS];
    tile_coords(t, index, coords);
    for (int d = 0; d < TSL_MAX_DIMS; d++) {
        if (d < t->shape.ndim) {
            tsl_tile_extent(t->shape.dims[d], t->grid.splits[d], coords[d], &start[d], &extent[d]);
        } else {
            start[d] = 0;
            extent[d] = 1;
        }
    }
}

int64_t tsl_tensor_tile_numel(const struct tsl_tensor *t, int64_t index)
{
    int64_t start[TSL_MAX_DIMS], extent[TSL_MAX_DIMS], numel = 1;
    tsl_tensor_tile_box(t, index, start, extent);
    for (int d = 0; d < t->shape.ndim; d++)
        numel *= extent[d];
    return numel;
}

static void tensor_free(struct tsl_tensor *t)
{
    free(t->tile_owner);
    free(t->handles);
    free(t->tile_memory);
    free(t);
}

const char *tsl_layout_name(tsl_layout layout)
{
    switch (layout) {
    case TSL_LAYOUT_PLAIN:
        return "plain";
    case TSL_LAYOUT_CHANNELS_LAST:
        return "channels_last";
    }
    return "invalid";
}

tsl_status tsl_tensor_create(tsl_tensor_t *out, tsl_context_t ctx, tsl_dtype dtype,
                             const tsl_shape *shape, const tsl_tile_grid *grid,
                             const tsl_owner_map *owners)
{
    return tsl_tensor_create_layout(out, ctx, dtype, shape, grid, owners, TSL_LAYOUT_PLAIN);
}

static tsl_status tensor_create(tsl_tensor_t *out, tsl_context_t ctx, tsl_dtype dtype,
                                const tsl_shape *shape, const tsl_tile_grid *grid,
                                const tsl_owner_map *owners, tsl_layout layout, int transient)
{
    if (!out)
        return tsl_error(ctx, TSL_ERR_INVALID_ARG, "tsl_tensor_create: tensor is NULL");
    *out = NULL;
    if (!ctx)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "tsl_tensor_create: ctx is NULL");
    if (tsl_dtype_size(dtype) == 0)
        return tsl_error(ctx, TSL_ERR_DTYPE, "tsl_tensor_create: unknown dtype %d", (int)dtype);
    tsl_status st = tsl_shape_check(shape);
    if (st)
        return tsl_error(ctx, st, "tsl_tensor_create: %s", tsl_last_error());
    if (layout != TSL_LAYOUT_PLAIN && layout != TSL_LAYOUT_CHANNELS_LAST)
        return tsl_error(ctx, TSL_ERR_INVALID_ARG, "tsl_tensor_create: unknown layout %d",
                         (int)layout);
    if (layout == TSL_LAYOUT_CHANNELS_LAST && shape->ndim < 3)
        return tsl_error(ctx, TSL_ERR_SHAPE,
                         "tsl_tensor_create: a channels-last tensor needs N, C and at least one "
                         "spatial dimension, not %d dimensions",
                         (int)shape->ndim);
    tsl_tile_grid single = tsl_tile_grid_single();
    if (!grid)
        grid = &single;
    st = tsl_tile_grid_check(grid, shape);
    if (st)
        return tsl_error(ctx, st, "tsl_tensor_create: %s", tsl_last_error());
    tsl_owner_map block = tsl_owner_block(NULL);
    if (!owners)
        owners = &block;

    struct tsl_tensor *t = calloc(1, sizeof *t);
    if (!t)
        return tsl_error(ctx, TSL_ERR_OUT_OF_MEMORY, "tsl_tensor_create: out of memory");
    t->ctx = ctx;
    t->dtype = dtype;
    t->layout = layout;
    t->transient = transient;
    t->elem_size = tsl_dtype_size(dtype);
    t->shape = *shape;
    for (int d = shape->ndim; d < TSL_MAX_DIMS; d++)
        t->shape.dims[d] = 1;
    t->grid = *grid;
    for (int d = shape->ndim; d < TSL_MAX_DIMS; d++)
        t->grid.splits[d] = 1;
    t->owners = *owners;
    t->ntiles = tsl_tile_grid_count(&t->grid, shape->ndim);
    t->tile_owner = calloc((size_t)t->ntiles, sizeof *t->tile_owner);
    t->handles = calloc((size_t)t->ntiles, sizeof *t->handles);
    t->tile_memory = calloc((size_t)t->ntiles, sizeof *t->tile_memory);
    if (!t->tile_owner || !t->handles || !t->tile_memory) {
        tensor_free(t);
        return tsl_error(ctx, TSL_ERR_OUT_OF_MEMORY, "tsl_tensor_create: out of memory");
    }
    /* Validate everything before registering anything, so a failure leaves no trace. */
    for (int64_t i = 0; i < t->ntiles; i++) {
        int32_t coords[TSL_MAX_DIMS];
        tile_coords(t, i, coords);
        st =
            tsl_owner_map_rank(owners, coords, shape->ndim, &t->grid, ctx->size, &t->tile_owner[i]);
        if (st) {
            tensor_free(t);
            return tsl_error(ctx, st, "tsl_tensor_create: %s", tsl_last_error());
        }
        if (tsl_tensor_tile_numel(t, i) > (int64_t)UINT32_MAX) {
            tensor_free(t);
            return tsl_error(ctx, TSL_ERR_SHAPE,
                             "tsl_tensor_create: tile %lld has more than 2^32 elements; use a "
                             "finer tile grid",
                             (long long)i);
        }
    }
    if (ctx->tag_count - ctx->tags_used < t->ntiles) {
        int64_t ntiles = t->ntiles;
        tensor_free(t);
        return tsl_error(ctx, TSL_ERR_RESOURCE,
                         "tsl_tensor_create: %lld tiles need as many StarPU-MPI tags, %lld left "
                         "in the context's range",
                         (long long)ntiles, (long long)(ctx->tag_count - ctx->tags_used));
    }
    for (int64_t i = 0; i < t->ntiles; i++) {
        int64_t numel = tsl_tensor_tile_numel(t, i);
        size_t bytes = (size_t)numel * t->elem_size;
        if (t->tile_owner[i] == ctx->rank && transient) {
            t->owned_bytes += (int64_t)bytes;
            starpu_vector_data_register(&t->handles[i], -1, 0, (uint32_t)numel, t->elem_size);
            /* Read before any write (a part of it written first): zeros, as tessel-allocated
             * tiles start. */
            starpu_data_set_reduction_methods(t->handles[i], NULL, &tsl_cl_zero);
        } else if (t->tile_owner[i] == ctx->rank) {
            void *memory = NULL;
            if (starpu_malloc(&memory, bytes) != 0 || !memory) {
                for (int64_t j = 0; j < i; j++) {
                    starpu_data_unregister(t->handles[j]);
                    if (t->tile_memory[j])
                        starpu_free(t->tile_memory[j]);
                }
                tensor_free(t);
                return tsl_error(ctx, TSL_ERR_OUT_OF_MEMORY,
                                 "tsl_tensor_create: cannot allocate a tile of %zu bytes", bytes);
            }
            memset(memory, 0, bytes);
            t->tile_memory[i] = memory;
            t->owned_bytes += (int64_t)bytes;
            starpu_vector_data_register(&t->handles[i], STARPU_MAIN_RAM, (uintptr_t)memory,
                                        (uint32_t)numel, t->elem_size);
        } else {
            starpu_vector_data_register(&t->handles[i], -1, 0, (uint32_t)numel, t->elem_size);
        }
        int64_t tag;
        tsl_context_next_tag(ctx, &tag); /* cannot fail: checked above */
        starpu_mpi_data_register_comm(t->handles[i], tag, t->tile_owner[i], ctx->comm);
    }
    ctx->owned_bytes += t->owned_bytes;
    tsl_context_track_tensor(ctx, t);
    *out = t;
    return TSL_OK;
}

tsl_status tsl_tensor_create_layout(tsl_tensor_t *out, tsl_context_t ctx, tsl_dtype dtype,
                                    const tsl_shape *shape, const tsl_tile_grid *grid,
                                    const tsl_owner_map *owners, tsl_layout layout)
{
    return tensor_create(out, ctx, dtype, shape, grid, owners, layout, 0);
}

tsl_status tsl_tensor_create_transient(tsl_tensor_t *out, tsl_context_t ctx, tsl_dtype dtype,
                                       const tsl_shape *shape, const tsl_tile_grid *grid,
                                       const tsl_owner_map *owners, tsl_layout layout)
{
    return tensor_create(out, ctx, dtype, shape, grid, owners, layout, 1);
}

void tsl_tensor_release(struct tsl_tensor *t)
{
    if (!t)
        return;
    for (int64_t i = 0; i < t->ntiles; i++) {
        tsl_cache_flush(t->ctx, t->handles[i]);
        if (t->tile_owner[i] == t->ctx->rank)
            starpu_data_invalidate_submit(t->handles[i]);
    }
}

tsl_status tsl_tensor_destroy(tsl_tensor_t t)
{
    if (!t)
        return TSL_OK;
    struct tsl_context *ctx = t->ctx;
    for (int32_t r = 0; t->replicas && r < ctx->size; r++)
        tsl_tensor_destroy(t->replicas[r]); /* untracked: untracking again does nothing */
    free(t->replicas);
    for (int64_t i = 0; i < t->ntiles; i++) {
        tsl_cache_flush(ctx, t->handles[i]);
        starpu_data_unregister(t->handles[i]);
        if (t->tile_memory[i])
            starpu_free(t->tile_memory[i]);
    }
    ctx->owned_bytes -= t->owned_bytes;
    tsl_context_untrack_tensor(ctx, t);
    tensor_free(t);
    return TSL_OK;
}

#define CHECK_OUT(t, out, fn)                                                                      \
    do {                                                                                           \
        tsl_status check_st = tsl_tensor_check((t), fn);                                           \
        if (check_st)                                                                              \
            return check_st;                                                                       \
        if (!(out))                                                                                \
            return tsl_error((t)->ctx, TSL_ERR_INVALID_ARG, fn ": output pointer is NULL");        \
    } while (0)

tsl_status tsl_tensor_shape(tsl_tensor_t t, tsl_shape *shape)
{
    CHECK_OUT(t, shape, "tsl_tensor_shape");
    *shape = t->shape;
    return TSL_OK;
}

tsl_status tsl_tensor_dtype(tsl_tensor_t t, tsl_dtype *dtype)
{
    CHECK_OUT(t, dtype, "tsl_tensor_dtype");
    *dtype = t->dtype;
    return TSL_OK;
}

tsl_status tsl_tensor_grid(tsl_tensor_t t, tsl_tile_grid *grid)
{
    CHECK_OUT(t, grid, "tsl_tensor_grid");
    *grid = t->grid;
    return TSL_OK;
}

tsl_status tsl_tensor_context(tsl_tensor_t t, tsl_context_t *ctx)
{
    CHECK_OUT(t, ctx, "tsl_tensor_context");
    *ctx = t->ctx;
    return TSL_OK;
}

tsl_status tsl_tensor_layout(tsl_tensor_t t, tsl_layout *layout)
{
    tsl_status st = tsl_tensor_check(t, "tsl_tensor_layout");
    if (!st && layout)
        *layout = t->layout;
    return st;
}

tsl_status tsl_tensor_tile_count(tsl_tensor_t t, int64_t *count)
{
    CHECK_OUT(t, count, "tsl_tensor_tile_count");
    *count = t->ntiles;
    return TSL_OK;
}

static tsl_status check_tile_index(tsl_tensor_t t, int64_t index, const char *fn)
{
    if (index < 0 || index >= t->ntiles)
        return tsl_error(t->ctx, TSL_ERR_INVALID_ARG, "%s: tile %lld out of range [0, %lld)", fn,
                         (long long)index, (long long)t->ntiles);
    return TSL_OK;
}

tsl_status tsl_tensor_tile_info(tsl_tensor_t t, int64_t index, int32_t coords[TSL_MAX_DIMS],
                                int32_t *owner, int64_t start[TSL_MAX_DIMS],
                                int64_t extent[TSL_MAX_DIMS])
{
    tsl_status st = tsl_tensor_check(t, "tsl_tensor_tile_info");
    if (st || (st = check_tile_index(t, index, "tsl_tensor_tile_info")))
        return st;
    if (coords)
        tile_coords(t, index, coords);
    if (owner)
        *owner = t->tile_owner[index];
    int64_t s[TSL_MAX_DIMS], e[TSL_MAX_DIMS];
    tsl_tensor_tile_box(t, index, s, e);
    if (start)
        memcpy(start, s, sizeof s);
    if (extent)
        memcpy(extent, e, sizeof e);
    return TSL_OK;
}

tsl_status tsl_tensor_tile_handle(tsl_tensor_t t, int64_t index, starpu_data_handle_t *handle)
{
    CHECK_OUT(t, handle, "tsl_tensor_tile_handle");
    tsl_status st = check_tile_index(t, index, "tsl_tensor_tile_handle");
    if (st)
        return st;
    *handle = t->handles[index];
    return TSL_OK;
}

tsl_status tsl_tensor_owned_bytes(tsl_tensor_t t, int64_t *bytes)
{
    CHECK_OUT(t, bytes, "tsl_tensor_owned_bytes");
    *bytes = t->owned_bytes;
    return TSL_OK;
}

tsl_status tsl_tensor_local_tiles(tsl_tensor_t t, int64_t *owned, int64_t *allocated)
{
    tsl_status st = tsl_tensor_check(t, "tsl_tensor_local_tiles");
    if (st)
        return st;
    if (!owned && !allocated)
        return tsl_error(t->ctx, TSL_ERR_INVALID_ARG,
                         "tsl_tensor_local_tiles: both outputs are NULL");
    int64_t own = 0, alloc = 0;
    for (int64_t i = 0; i < t->ntiles; i++) {
        own += t->tile_owner[i] == t->ctx->rank;
        alloc += starpu_data_test_if_allocated_on_node(t->handles[i], STARPU_MAIN_RAM) != 0;
    }
    if (owned)
        *owned = own;
    if (allocated)
        *allocated = alloc;
    return TSL_OK;
}

static tsl_status fill(tsl_tensor_t t, tsl_fill_mode mode, uint64_t seed, double a, double b,
                       const char *fn)
{
    tsl_status st = tsl_tensor_check(t, fn);
    if (st)
        return st;
    if (!isfinite(a) || !isfinite(b))
        return tsl_error(t->ctx, TSL_ERR_INVALID_ARG, "%s: parameters must be finite", fn);
    if (mode == TSL_FILL_UNIFORM && a > b)
        return tsl_error(t->ctx, TSL_ERR_INVALID_ARG, "%s: low %g > high %g", fn, a, b);
    if (mode != TSL_FILL_NORMAL && t->dtype != TSL_F32 && t->dtype != TSL_F64) {
        /* Integer fills store floor(value): every value drawn must fit the dtype. The
         * bounds are powers of two, exact as doubles: [lowest, limit). */
        double lowest = t->dtype == TSL_U8 ? 0.0 : t->dtype == TSL_I32 ? -0x1p31 : -0x1p63;
        double limit = t->dtype == TSL_U8 ? 256.0 : t->dtype == TSL_I32 ? 0x1p31 : 0x1p63;
        int fits =
            mode == TSL_FILL_CONSTANT ? (a >= lowest && a < limit) : (a >= lowest && b <= limit);
        if (!fits)
            return tsl_error(t->ctx, TSL_ERR_INVALID_ARG, "%s: values outside the range of %s", fn,
                             tsl_dtype_name(t->dtype));
    }
    if (mode == TSL_FILL_NORMAL && t->dtype != TSL_F32 && t->dtype != TSL_F64)
        return tsl_error(t->ctx, TSL_ERR_DTYPE, "%s: normal fill needs f32 or f64, not %s", fn,
                         tsl_dtype_name(t->dtype));
    if (mode == TSL_FILL_NORMAL && b < 0)
        return tsl_error(t->ctx, TSL_ERR_INVALID_ARG, "%s: stddev %g < 0", fn, b);
    tsl_fill_args args;
    memset(&args, 0, sizeof args);
    args.dtype = t->dtype;
    args.mode = mode;
    args.ndim = t->shape.ndim;
    args.layout = t->layout;
    args.seed = seed;
    args.a = a;
    args.b = b;
    tsl_shape_strides(&t->shape, args.global_strides);
    for (int64_t i = 0; i < t->ntiles; i++) {
        tsl_tensor_tile_box(t, i, args.start, args.extent);
        tsl_task_desc desc = {
            .codelet = &tsl_cl_fill,
            .args = &args,
            .args_size = sizeof args,
            .nhandles = 1,
            .handles = {t->handles[i]},
            .modes = {STARPU_W},
            .flops = (double)tsl_tensor_tile_numel(t, i),
        };
        st = tsl_task_submit(t->ctx, &desc);
        if (st)
            return st;
    }
    return TSL_OK;
}

tsl_status tsl_tensor_fill_constant(tsl_tensor_t t, double value)
{
    return fill(t, TSL_FILL_CONSTANT, 0, value, value, "tsl_tensor_fill_constant");
}

tsl_status tsl_tensor_fill_uniform(tsl_tensor_t t, uint64_t seed, double low, double high)
{
    return fill(t, TSL_FILL_UNIFORM, seed, low, high, "tsl_tensor_fill_uniform");
}

tsl_status tsl_tensor_fill_normal(tsl_tensor_t t, uint64_t seed, double mean, double stddev)
{
    return fill(t, TSL_FILL_NORMAL, seed, mean, stddev, "tsl_tensor_fill_normal");
}

void tsl_tensor_order_by_samples(struct tsl_tensor *t)
{
    int64_t per_sample_tile = t->ntiles / t->grid.splits[0];
    for (int64_t i = 0; i < t->ntiles; i++)
        starpu_data_set_user_data(t->handles[i], (void *)(intptr_t)(i / per_sample_tile + 1));
}

tsl_status tsl_tensor_wait(tsl_tensor_t t)
{
    tsl_status st = tsl_tensor_check(t, "tsl_tensor_wait");
    if (st)
        return st;
    for (int64_t i = 0; i < t->ntiles; i++) {
        if (t->tile_owner[i] != t->ctx->rank)
            continue;
        if (starpu_data_acquire(t->handles[i], STARPU_R) != 0)
            return tsl_error(t->ctx, TSL_ERR_RUNTIME, "tsl_tensor_wait: acquire failed");
        starpu_data_release(t->handles[i]);
    }
    return TSL_OK;
}

tsl_status tsl_tensor_mark_placement(tsl_tensor_t where)
{
    tsl_status st = tsl_tensor_check(where, "tsl_tensor_mark_placement");
    if (st)
        return st;
    if (where->dtype != TSL_I32)
        return tsl_error(where->ctx, TSL_ERR_DTYPE,
                         "tsl_tensor_mark_placement: needs an i32 "
                         "tensor, not %s",
                         tsl_dtype_name(where->dtype));
    for (int64_t i = 0; i < where->ntiles; i++) {
        tsl_mark_args args = {.rank = where->tile_owner[i],
                              .count = tsl_tensor_tile_numel(where, i)};
        tsl_task_desc desc = {
            .codelet = &tsl_cl_mark,
            .args = &args,
            .args_size = sizeof args,
            .nhandles = 1,
            .handles = {where->handles[i]},
            .modes = {STARPU_W},
        };
        st = tsl_task_submit(where->ctx, &desc);
        if (st)
            return st;
    }
    return TSL_OK;
}
