/* Pooling and upsampling (nearest, linear) on tiled tensors: one task per tile of whole
 * (sample, channel) planes; on spatial tiles, one task per output tile on a window assembled
 * from its input tile and halo slabs packed on the neighbours' owners (src/lower/halo.c),
 * with gradient slabs added back into the neighbours in the backward pass. */
#include <string.h>

#include "codelets/pool.h"
#include "codelets/pool_math.h"
#include "internal.h"
#include "halo.h"
#include "tessel/ops.h"

/* x and y: same context and dtype (float), y of shape `want`, both cut along N and C only,
 * with the same splits. */
static tsl_status check_planes(tsl_tensor_t x, tsl_tensor_t y, const tsl_shape *want,
                               const char *fn)
{
    tsl_status st = tsl_tensor_check(x, fn);
    if (st || (st = tsl_tensor_check(y, fn)) || (st = tsl_tensor_check_float(x, fn)))
        return st;
    if (y->layout != x->layout)
        return tsl_error(x->ctx, TSL_ERR_SHAPE,
                         "%s: x and y need the same tile layout (plain or channels-last)", fn);
    struct tsl_context *ctx = x->ctx;
    if (y->ctx != ctx || y->dtype != x->dtype)
        return tsl_error(ctx, TSL_ERR_DTYPE, "%s: x and y differ in context or dtype", fn);
    if (y == x)
        return tsl_error(ctx, TSL_ERR_INVALID_ARG, "%s: the output may not overwrite the input",
                         fn);
    if (y->shape.ndim != want->ndim || memcmp(y->shape.dims, want->dims, sizeof want->dims))
        return tsl_error(ctx, TSL_ERR_SHAPE, "%s: the output has the wrong shape", fn);
    if (x->grid.splits[0] != y->grid.splits[0] || x->grid.splits[1] != y->grid.splits[1])
        return tsl_error(ctx, TSL_ERR_SHAPE, "%s: x and y need the same N and C tiles", fn);
    for (int d = 2; d < x->shape.ndim; d++) {
        if (x->grid.splits[d] != y->grid.splits[d])
            return tsl_error(ctx, TSL_ERR_SHAPE,
                             "%s: x and y need the same spatial tile grid (output tile i reads "
                             "input tile i and halos from its neighbours)",
                             fn);
        if (x->grid.splits[d] > 1 && x->dtype != TSL_F32)
            return tsl_error(ctx, TSL_ERR_DTYPE, "%s: spatial tiles take f32 tensors", fn);
    }
    return TSL_OK;
}

static int spatially_tiled(tsl_tensor_t x)
{
    for (int d = 2; d < x->shape.ndim; d++)
        if (x->grid.splits[d] > 1)
            return 1;
    return 0;
}

/* The range of `small` positions [*lo, *hi) that outputs [olo, ohi) along one dimension read:
 * pooling windows (clipped to the input), or the sources of nearest or linear upsampling. */
static void input_range(const tsl_pool_args *a, int pooling, int d, int64_t olo, int64_t ohi,
                        int64_t global, int64_t *lo, int64_t *hi)
{
    if (pooling) {
        *lo = olo * a->stride[d] - a->padding[d];
        *hi = (ohi - 1) * a->stride[d] - a->padding[d] + a->kernel[d];
    } else { /* the sources of the first and the last output (codelets/pool_math.h) */
        int linear = a->kind == TSL_UPSAMPLE_LINEAR;
        int64_t first, second, last;
        double w;
        tsl_upsample_axis(linear, a->kernel[d], global, a->global_out[d], olo, lo, &second, &w);
        tsl_upsample_axis(linear, a->kernel[d], global, a->global_out[d], ohi - 1, &first, &last,
                          &w);
        *hi = last + 1;
    }
    if (*lo < 0)
        *lo = 0;
    if (*hi > global)
        *hi = global;
}

/* Task arguments of tile `tile` of `big` (the output of a pooling, the upsampled side of an
 * upsampling) on a window of `small`, and the window's halo slabs' source tiles. */
static tsl_status window_args(const tsl_pool_args *a, int pooling, tsl_tensor_t small,
                              tsl_tensor_t big, int64_t tile, tsl_pool_task_args *t, int64_t *src)
{
    memset(t, 0, sizeof *t);
    t->pool = *a;
    int64_t bs[TSL_MAX_DIMS], be[TSL_MAX_DIMS];
    tsl_tensor_tile_box(big, tile, bs, be);
    t->pool.planes = be[0] * be[1];
    t->pool.channels = be[1];
    tsl_conv_window *w = &t->window;
    tsl_halo_window_reset(w);
    for (int d = 0; d < a->spatial; d++) {
        int64_t lo, hi, global = small->shape.dims[2 + d];
        input_range(a, pooling, d, bs[2 + d], bs[2 + d] + be[2 + d], global, &lo, &hi);
        if (hi <= lo)
            return tsl_error(small->ctx, TSL_ERR_SHAPE,
                             "pooling: an output tile reads only padding along dimension %d", d);
        w->global[d] = global;
        w->window.lo[d] = lo;
        w->window.size[d] = hi - lo;
        t->pool.global_in[d] = global;
        t->pool.in_size[d] = hi - lo;
        t->pool.in_origin[d] = lo;
        t->pool.out_size[d] = be[2 + d];
        t->pool.out_origin[d] = bs[2 + d];
    }
    return tsl_halo_slabs(small, tile, a->spatial, &w->window, &w->tile, &w->nslabs, src, w->slab,
                          NULL, TSL_CONV_MAX_SLABS);
}

/* Spatial tiles. Forward (pooling and upsampling): per output tile, pack the halo of `small`
 * and run one task on the window (max pooling with `ix` also writes its indices tile).
 * Backward: max pooling reads the x window and dy; upsampling, average pooling and max pooling
 * from indices `ix` dy only; each writes its dx tile's part and gradient slabs that go back to
 * the neighbours. */
static tsl_status windowed(const tsl_pool_args *a, int pooling, int backward, tsl_tensor_t small,
                           tsl_tensor_t big, tsl_tensor_t x, tsl_tensor_t dx, tsl_tensor_t ix)
{
    struct tsl_context *ctx = small->ctx;
    tsl_status st = TSL_OK;
    tsl_pool_task_args t;
    int64_t src[TSL_CONV_MAX_SLABS];
    for (int64_t i = 0; i < big->ntiles && !st; i++) /* validate before submitting */
        st = window_args(a, pooling, small, big, i, &t, src);
    tsl_halo_returns r;
    if (st || (backward && (st = tsl_halo_returns_init(&r, ctx, big->ntiles))))
        return st;
    /* (an average pooling's backward spreads dy over the windows: no x) */
    const int avg_backward = backward && pooling && !ix && a->kind != TSL_POOL_MAX;
    struct starpu_codelet *cl =
        ix ? (backward ? &tsl_cl_pool_window_backward_index : &tsl_cl_pool_window_forward_index)
        : avg_backward ? &tsl_cl_pool_window_backward_avg
        : pooling      ? (backward ? &tsl_cl_pool_window_backward : &tsl_cl_pool_window_forward)
                  : (backward ? &tsl_cl_upsample_window_backward : &tsl_cl_upsample_window_forward);
    for (int64_t i = 0; i < big->ntiles && !st; i++) {
        starpu_data_handle_t slabs[TSL_CONV_MAX_SLABS] = {0};
        window_args(a, pooling, small, big, i, &t, src);
        int32_t ns = t.window.nslabs, n = 0;
        int read_x = !backward || (pooling && !ix && !avg_backward);
        if (read_x && (st = tsl_halo_pack_window(x, a->spatial, &t.window, src, slabs)))
            break;
        if (backward &&
            (st = tsl_halo_returns_add(&r, dx, i, a->spatial, &t.window, src, dx->tile_owner[i])))
            break;
        tsl_task_desc desc = {.codelet = cl,
                              .args = &t,
                              .args_size = sizeof t,
                              .flops = (double)tsl_tensor_tile_numel(big, i)};
        if (read_x) {
            desc.handles[n] = x->handles[i];
            desc.modes[n++] = STARPU_R;
            for (int32_t k = 0; k < ns; k++) {
                desc.handles[n] = slabs[k];
                desc.modes[n++] = STARPU_R;
            }
        }
        if (backward) {
            if (ix) {
                desc.handles[n] = ix->handles[i];
                desc.modes[n++] = STARPU_R;
            }
            desc.handles[n] = big->handles[i];
            desc.modes[n++] = STARPU_R;
            desc.handles[n] = dx->handles[i];
            desc.modes[n++] = STARPU_W;
            for (int32_t k = 0; k < ns; k++) {
                desc.handles[n] = r.slabs[i * TSL_CONV_MAX_SLABS + k];
                desc.modes[n++] = STARPU_W;
            }
        } else {
            desc.handles[n] = big->handles[i];
            desc.modes[n++] = STARPU_W;
            if (ix) {
                desc.handles[n] = ix->handles[i];
                desc.modes[n++] = STARPU_W;
            }
        }
        desc.nhandles = n;
        st = tsl_task_submit(ctx, &desc);
        tsl_halo_release(ctx, slabs, ns);
    }
    if (backward) {
        tsl_status fin = tsl_halo_returns_finish(&r, dx, !st);
        st = st ? st : fin;
    }
    return st;
}

static tsl_pool_args args_of(tsl_tensor_t x, tsl_tensor_t y, int spatial)
{
    tsl_pool_args a;
    memset(&a, 0, sizeof a);
    a.dtype = x->dtype;
    a.spatial = spatial;
    a.channels_last = x->layout == TSL_LAYOUT_CHANNELS_LAST;
    for (int d = 0; d < spatial; d++) {
        a.in_size[d] = x->shape.dims[2 + d];
        a.out_size[d] = y->shape.dims[2 + d];
        a.global_out[d] = a.out_size[d];
    }
    return a;
}

/* One task per tile over (in, out[, extra]) with per-tile plane counts. */
static tsl_status per_tile(struct starpu_codelet *cl, tsl_pool_args a, tsl_tensor_t planes_of,
                           int n, tsl_tensor_t *tensors, const enum starpu_data_access_mode *modes)
{
    for (int64_t i = 0; i < planes_of->ntiles; i++) {
        int64_t start[TSL_MAX_DIMS], extent[TSL_MAX_DIMS];
        tsl_tensor_tile_box(planes_of, i, start, extent);
        a.planes = extent[0] * extent[1];
        a.channels = extent[1];
        tsl_task_desc desc = {.codelet = cl,
                              .args = &a,
                              .args_size = sizeof a,
                              .nhandles = n,
                              .flops = (double)tsl_tensor_tile_numel(tensors[n - 1], i)};
        for (int k = 0; k < n; k++) {
            desc.handles[k] = tensors[k]->handles[i];
            desc.modes[k] = modes[k];
        }
        tsl_status st = tsl_task_submit(planes_of->ctx, &desc);
        if (st)
            return st;
        for (int k = 0; k < n - 1; k++)
            if (tensors[k]->tile_owner[i] != tensors[n - 1]->tile_owner[i])
                tsl_cache_flush(planes_of->ctx, tensors[k]->handles[i]);
    }
    return TSL_OK;
}

static void fill_pool(tsl_pool_args *a, const tsl_pool_params *p)
{
    a->kind = p->kind;
    a->count_include_pad = p->count_include_pad;
    for (int d = 0; d < p->spatial; d++) {
        a->kernel[d] = p->kernel[d];
        a->stride[d] = p->stride[d];
        a->padding[d] = p->padding[d];
    }
}

tsl_status tsl_pool_forward(const tsl_pool_params *p, tsl_tensor_t x, tsl_tensor_t y)
{
    const char *fn = "tsl_pool_forward";
    tsl_status st = tsl_tensor_check(x, fn);
    if (st)
        return st;
    tsl_shape want;
    if ((st = tsl_pool_output_shape(&x->shape, p, &want)))
        return tsl_error(x->ctx, st, "%s", tsl_last_error());
    if ((st = check_planes(x, y, &want, fn)))
        return st;
    tsl_pool_args a = args_of(x, y, p->spatial);
    fill_pool(&a, p);
    if (spatially_tiled(x))
        return windowed(&a, 1, 0, x, y, x, NULL, NULL);
    tsl_tensor_t t[2] = {x, y};
    enum starpu_data_access_mode m[2] = {STARPU_R, STARPU_W};
    return per_tile(&tsl_cl_pool_forward, a, x, 2, t, m);
}

tsl_status tsl_pool_backward(const tsl_pool_params *p, tsl_tensor_t x, tsl_tensor_t dy,
                             tsl_tensor_t dx)
{
    const char *fn = "tsl_pool_backward";
    /* Average pooling reads no x: dx gives the input's shape and tiles where x is NULL. */
    const int avg = p && p->kind != TSL_POOL_MAX;
    tsl_tensor_t in = avg && !x ? dx : x;
    tsl_status st = tsl_tensor_check(in, fn);
    if (st || (st = tsl_tensor_check(dx, fn)))
        return st;
    if (!p)
        return tsl_error(in->ctx, TSL_ERR_INVALID_ARG, "%s: no pooling parameters", fn);
    tsl_shape want;
    if ((st = tsl_pool_output_shape(&in->shape, p, &want)))
        return tsl_error(in->ctx, st, "%s", tsl_last_error());
    if ((st = check_planes(in, dy, &want, fn)) || (st = tsl_tensor_check_same_layout(dx, in, fn)))
        return st;
    if ((x && dx == x) || dx == dy)
        return tsl_error(in->ctx, TSL_ERR_INVALID_ARG, "%s: dx may not overwrite an input", fn);
    tsl_pool_args a = args_of(in, dy, p->spatial);
    fill_pool(&a, p);
    if (spatially_tiled(in))
        return windowed(&a, 1, 1, in, dy, avg ? NULL : x, dx, NULL);
    if (avg) {
        tsl_tensor_t t[2] = {dy, dx};
        enum starpu_data_access_mode m[2] = {STARPU_R, STARPU_W};
        return per_tile(&tsl_cl_pool_backward_avg, a, dx, 2, t, m);
    }
    tsl_tensor_t t[3] = {x, dy, dx};
    enum starpu_data_access_mode m[3] = {STARPU_R, STARPU_R, STARPU_W};
    return per_tile(&tsl_cl_pool_backward, a, x, 3, t, m);
}

/* Indices of max pooling p for output y: TSL_U8 (a kernel of at most 255 positions) or TSL_I32,
 * y's shape, tile grid, owners and layout. Sets a->index_dtype. */
static tsl_status check_indices(const tsl_pool_params *p, tsl_tensor_t y, tsl_tensor_t ix,
                                tsl_pool_args *a, const char *fn)
{
    tsl_status st = tsl_tensor_check(ix, fn);
    if (st)
        return st;
    struct tsl_context *ctx = y->ctx;
    if (p->kind != TSL_POOL_MAX)
        return tsl_error(ctx, TSL_ERR_INVALID_ARG, "%s: only max pooling keeps indices", fn);
    int64_t positions = 1;
    for (int d = 0; d < p->spatial; d++)
        positions *= p->kernel[d];
    if (ix->ctx != ctx || (ix->dtype != TSL_U8 && ix->dtype != TSL_I32))
        return tsl_error(ctx, TSL_ERR_DTYPE, "%s: indices are u8 or i32 tensors of the context",
                         fn);
    if (ix->dtype == TSL_U8 && positions > UINT8_MAX)
        return tsl_error(ctx, TSL_ERR_DTYPE,
                         "%s: a kernel of %lld positions needs i32 indices (u8 holds up to 255)",
                         fn, (long long)positions);
    if (ix->shape.ndim != y->shape.ndim ||
        memcmp(ix->shape.dims, y->shape.dims, sizeof y->shape.dims) ||
        memcmp(ix->grid.splits, y->grid.splits, sizeof y->grid.splits) || ix->layout != y->layout)
        return tsl_error(ctx, TSL_ERR_SHAPE,
                         "%s: the indices need the output's shape, tile grid and layout", fn);
    for (int64_t i = 0; i < y->ntiles; i++)
        if (ix->tile_owner[i] != y->tile_owner[i])
            return tsl_error(ctx, TSL_ERR_SHAPE,
                             "%s: the indices' tiles need the output tiles' owners", fn);
    a->index_dtype = ix->dtype;
    return TSL_OK;
}

tsl_status tsl_pool_forward_indices(const tsl_pool_params *p, tsl_tensor_t x, tsl_tensor_t y,
                                    tsl_tensor_t indices)
{
    const char *fn = "tsl_pool_forward_indices";
    tsl_status st = tsl_tensor_check(x, fn);
    if (st || (st = tsl_tensor_check(y, fn)))
        return st;
    tsl_shape want;
    if ((st = tsl_pool_output_shape(&x->shape, p, &want)))
        return tsl_error(x->ctx, st, "%s", tsl_last_error());
    tsl_pool_args a = args_of(x, y, p->spatial);
    fill_pool(&a, p);
    if ((st = check_planes(x, y, &want, fn)) || (st = check_indices(p, y, indices, &a, fn)))
        return st;
    if (spatially_tiled(x))
        return windowed(&a, 1, 0, x, y, x, NULL, indices);
    tsl_tensor_t t[3] = {x, y, indices};
    enum starpu_data_access_mode m[3] = {STARPU_R, STARPU_W, STARPU_W};
    return per_tile(&tsl_cl_pool_forward_index, a, x, 3, t, m);
}

tsl_status tsl_pool_backward_indices(const tsl_pool_params *p, tsl_tensor_t indices,
                                     tsl_tensor_t dy, tsl_tensor_t dx)
{
    const char *fn = "tsl_pool_backward_indices";
    tsl_status st = tsl_tensor_check(dx, fn);
    if (st || (st = tsl_tensor_check(dy, fn)))
        return st;
    tsl_shape want;
    if ((st = tsl_pool_output_shape(&dx->shape, p, &want)))
        return tsl_error(dx->ctx, st, "%s", tsl_last_error());
    tsl_pool_args a = args_of(dx, dy, p->spatial);
    fill_pool(&a, p);
    if ((st = check_planes(dx, dy, &want, fn)) || (st = check_indices(p, dy, indices, &a, fn)))
        return st;
    if (spatially_tiled(dx))
        return windowed(&a, 1, 1, dx, dy, NULL, dx, indices);
    tsl_tensor_t t[3] = {indices, dy, dx};
    enum starpu_data_access_mode m[3] = {STARPU_R, STARPU_R, STARPU_W};
    return per_tile(&tsl_cl_pool_backward_index, a, dx, 3, t, m);
}

/* The shape x upsampled by `scale`; with no scale, big's shape, whose spatial sizes may be any. */
static tsl_status upsampled(tsl_tensor_t x, tsl_tensor_t big, const int64_t *scale, tsl_shape *out,
                            const char *fn)
{
    if (x->shape.ndim < 3 || x->shape.ndim > 5)
        return tsl_error(x->ctx, TSL_ERR_SHAPE, "%s: x needs 1 to 3 spatial dimensions", fn);
    *out = x->shape;
    for (int d = 2; d < x->shape.ndim; d++) {
        if (!scale) {
            if (big && big->shape.ndim == x->shape.ndim)
                out->dims[d] = big->shape.dims[d];
            continue;
        }
        if (scale[d - 2] < 1 || scale[d - 2] > (int64_t)1 << 20)
            return tsl_error(x->ctx, TSL_ERR_INVALID_ARG, "%s: scale %lld out of range", fn,
                             (long long)scale[d - 2]);
        out->dims[d] *= scale[d - 2];
    }
    return TSL_OK;
}

/* Upsampling in `mode` between `small` (x, or dx) and `big` (y, or dy): the forward reads small
 * and writes big, the backward reads big and writes small. One task per tile of small. Without
 * a scale, big's sizes map (tsl_upsample_axis()). */
static tsl_status upsample(const char *fn, tsl_upsample_mode mode, int backward,
                           const int64_t *scale, tsl_tensor_t small, tsl_tensor_t big)
{
    tsl_status st = tsl_tensor_check(small, fn);
    tsl_shape want;
    if (st || (!scale && (st = tsl_tensor_check(big, fn))) ||
        (st = upsampled(small, big, scale, &want, fn)) ||
        (st = check_planes(small, big, &want, fn)))
        return st;
    tsl_pool_args a = args_of(small, big, small->shape.ndim - 2);
    a.kind = mode;
    for (int d = 0; d < a.spatial; d++)
        a.kernel[d] = scale ? scale[d] : 0;
    if (spatially_tiled(small))
        return windowed(&a, 0, backward, small, big, backward ? NULL : small,
                        backward ? small : NULL, NULL);
    struct starpu_codelet *codelets[2][2] = {
        {&tsl_cl_upsample_forward, &tsl_cl_upsample_backward},
        {&tsl_cl_upsample_linear_forward, &tsl_cl_upsample_linear_backward}};
    tsl_tensor_t t[2] = {backward ? big : small, backward ? small : big};
    enum starpu_data_access_mode m[2] = {STARPU_R, STARPU_W};
    return per_tile(codelets[mode == TSL_UPSAMPLE_LINEAR][backward], a, small, 2, t, m);
}

tsl_status tsl_upsample_nearest_forward(const int64_t *scale, tsl_tensor_t x, tsl_tensor_t y)
{
    return upsample("tsl_upsample_nearest_forward", TSL_UPSAMPLE_NEAREST, 0, scale, x, y);
}

tsl_status tsl_upsample_nearest_backward(const int64_t *scale, tsl_tensor_t dy, tsl_tensor_t dx)
{
    return upsample("tsl_upsample_nearest_backward", TSL_UPSAMPLE_NEAREST, 1, scale, dx, dy);
}

tsl_status tsl_upsample_linear_forward(const int64_t *scale, tsl_tensor_t x, tsl_tensor_t y)
{
    return upsample("tsl_upsample_linear_forward", TSL_UPSAMPLE_LINEAR, 0, scale, x, y);
}

tsl_status tsl_upsample_linear_backward(const int64_t *scale, tsl_tensor_t dy, tsl_tensor_t dx)
{
    return upsample("tsl_upsample_linear_backward", TSL_UPSAMPLE_LINEAR, 1, scale, dx, dy);
}
