/* Tensor plumbing for networks: channel concatenation (U-Net skips) and its backward, the
 * channel split, and sample-preserving reshapes (flatten). Pure data movement: box copies
 * between tiles, so any tile grids and owners work and results are exact. */
#include <string.h>

#include "codelets/copy.h"
#include "internal.h"

/* `part` matches `whole` in every dimension but C (dimension 1). */
static tsl_status check_part(tsl_tensor_t whole, tsl_tensor_t part, const char *fn)
{
    tsl_status st = tsl_tensor_check(part, fn);
    if (st)
        return st;
    struct tsl_context *ctx = whole->ctx;
    if (part->ctx != ctx)
        return tsl_error(ctx, TSL_ERR_INVALID_ARG, "%s: tensors of different contexts", fn);
    if (part->dtype != whole->dtype)
        return tsl_error(ctx, TSL_ERR_DTYPE, "%s: dtypes differ", fn);
    if (part == whole)
        return tsl_error(ctx, TSL_ERR_INVALID_ARG, "%s: a part may not be the whole tensor", fn);
    int ok = part->shape.ndim == whole->shape.ndim;
    for (int d = 0; ok && d < whole->shape.ndim; d++)
        ok = d == 1 || part->shape.dims[d] == whole->shape.dims[d];
    if (!ok)
        return tsl_error(ctx, TSL_ERR_SHAPE,
                         "%s: tensors must agree in every dimension but channels", fn);
    return TSL_OK;
}

/* Concatenate (dir 0) or split (dir 1) along channels. */
static tsl_status channels(tsl_tensor_t whole, int32_t count, const tsl_tensor_t *parts, int dir,
                           const char *fn)
{
    tsl_status st = tsl_tensor_check(whole, fn);
    if (st)
        return st;
    if (whole->shape.ndim < 2)
        return tsl_error(whole->ctx, TSL_ERR_SHAPE, "%s: tensors need N and C dimensions", fn);
    if (count < 1 || !parts)
        return tsl_error(whole->ctx, TSL_ERR_INVALID_ARG, "%s: no parts", fn);
    int64_t channels = 0;
    for (int32_t k = 0; k < count; k++) {
        if ((st = check_part(whole, parts[k], fn)))
            return st;
        channels += parts[k]->shape.dims[1];
    }
    if (channels != whole->shape.dims[1])
        return tsl_error(whole->ctx, TSL_ERR_SHAPE,
                         "%s: the parts have %lld channels, the whole tensor %lld", fn,
                         (long long)channels, (long long)whole->shape.dims[1]);
    int64_t offset = 0;
    for (int32_t k = 0; k < count; k++) {
        int64_t zero[TSL_MAX_DIMS] = {0, 0, 0, 0, 0}, at[TSL_MAX_DIMS] = {0, 0, 0, 0, 0};
        at[1] = offset;
        st = dir == 0 ? tsl_copy_region(whole, parts[k], zero, at, parts[k]->shape.dims)
                      : tsl_copy_region(parts[k], whole, at, zero, parts[k]->shape.dims);
        if (st)
            return st;
        offset += parts[k]->shape.dims[1];
    }
    return TSL_OK;
}

tsl_status tsl_concat_channels(int32_t count, const tsl_tensor_t *srcs, tsl_tensor_t dst)
{
    return channels(dst, count, srcs, 0, "tsl_concat_channels");
}

tsl_status tsl_split_channels(tsl_tensor_t src, int32_t count, const tsl_tensor_t *dsts)
{
    return channels(src, count, dsts, 1, "tsl_split_channels");
}

/* The run of each sample's elements (C order) tile i of t holds: t cut along N and perhaps
 * along dimension 1 only; 0 otherwise. */
static int sample_run(tsl_tensor_t t, int64_t i, int64_t *n0, int64_t *n, int64_t *lo, int64_t *len)
{
    for (int d = 2; d < t->shape.ndim; d++)
        if (t->grid.splits[d] != 1)
            return 0;
    int64_t start[TSL_MAX_DIMS], extent[TSL_MAX_DIMS], inner = 1;
    tsl_tensor_tile_box(t, i, start, extent);
    for (int d = 2; d < t->shape.ndim; d++)
        inner *= t->shape.dims[d];
    *n0 = start[0];
    *n = extent[0];
    *lo = t->shape.ndim > 1 ? start[1] * inner : 0;
    *len = t->shape.ndim > 1 ? extent[1] * inner : 1;
    return 1;
}

/* Tile i of src and of dst hold the same samples and the same run of their elements. */
static int same_runs(tsl_tensor_t src, tsl_tensor_t dst)
{
    if (src->ntiles != dst->ntiles || src->grid.splits[0] != dst->grid.splits[0])
        return 0;
    for (int64_t i = 0; i < src->ntiles; i++) {
        int64_t a[4], b[4];
        if (!sample_run(src, i, &a[0], &a[1], &a[2], &a[3]) ||
            !sample_run(dst, i, &b[0], &b[1], &b[2], &b[3]) || memcmp(a, b, sizeof a) != 0)
            return 0;
    }
    return 1;
}

tsl_status tsl_reshape_samples(tsl_tensor_t src, tsl_tensor_t dst)
{
    const char *fn = "tsl_reshape_samples";
    tsl_status st = tsl_tensor_check(src, fn);
    if (st || (st = tsl_tensor_check(dst, fn)))
        return st;
    struct tsl_context *ctx = src->ctx;
    if (dst->ctx != ctx)
        return tsl_error(ctx, TSL_ERR_INVALID_ARG, "%s: tensors of different contexts", fn);
    if (dst->dtype != src->dtype)
        return tsl_error(ctx, TSL_ERR_DTYPE, "%s: dtypes differ", fn);
    if (dst == src)
        return TSL_OK;
    if (dst->shape.dims[0] != src->shape.dims[0] ||
        tsl_shape_numel(&dst->shape) != tsl_shape_numel(&src->shape))
        return tsl_error(ctx, TSL_ERR_SHAPE,
                         "%s: both tensors need the same samples and elements per sample", fn);
    if (!same_runs(src, dst))
        return tsl_error(ctx, TSL_ERR_SHAPE,
                         "%s: both tensors must be cut along N (and perhaps dimension 1) into "
                         "tiles that hold the same samples and the same run of their elements",
                         fn);
    tsl_tensor_t tensors[2] = {src, dst};
    enum starpu_data_access_mode modes[2] = {STARPU_R, STARPU_W};
    if (src->layout == TSL_LAYOUT_PLAIN && dst->layout == TSL_LAYOUT_PLAIN) {
        struct {
            int64_t count;
        } args = {0};
        return tsl_submit_tiles(&tsl_cl_copy, 2, tensors, modes, &args, sizeof args, 0, 0.0);
    }
    /* A channels-last side: the plain side's tile holds the same samples in C order, which is
     * the plain order of the channels-last side's (n, C, spatial...) box, so one box copy per
     * tile reorders between the layouts. */
    if (src->layout != TSL_LAYOUT_PLAIN && dst->layout != TSL_LAYOUT_PLAIN &&
        memcmp(src->shape.dims, dst->shape.dims, sizeof src->shape.dims) != 0)
        return tsl_error(ctx, TSL_ERR_UNSUPPORTED,
                         "%s: between two channels-last shapes (make one side plain)", fn);
    tsl_tensor_t cl = src->layout != TSL_LAYOUT_PLAIN ? src : dst;
    for (int64_t i = 0; i < src->ntiles && !st; i++) {
        tsl_box_copy_args a;
        memset(&a, 0, sizeof a);
        a.ndim = cl->shape.ndim;
        a.elem_size = (int32_t)src->elem_size;
        a.src_layout = src == cl ? cl->layout : TSL_LAYOUT_PLAIN;
        a.dst_layout = dst == cl ? cl->layout : TSL_LAYOUT_PLAIN;
        int64_t start[TSL_MAX_DIMS], extent[TSL_MAX_DIMS];
        tsl_tensor_tile_box(cl, i, start, extent);
        for (int d = 0; d < a.ndim; d++)
            a.src_extent[d] = a.dst_extent[d] = a.box[d] = extent[d];
        tsl_task_desc desc = {
            .codelet = &tsl_cl_box_copy,
            .args = &a,
            .args_size = sizeof a,
            .nhandles = 2,
            .handles = {src->handles[i], dst->handles[i]},
            .modes = {STARPU_R, STARPU_W},
        };
        st = tsl_task_submit(ctx, &desc);
        if (!st && src->tile_owner[i] != dst->tile_owner[i])
            tsl_cache_flush(ctx, src->handles[i]);
    }
    return st;
}
