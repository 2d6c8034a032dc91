/* Convolution on tiled tensors: shape checks, one oneDNN task per sample tile, weight
 * gradients reduced over sample tiles. Spatial tiles (halo exchange) come with the spatial
 * parallelism work; until then x and y must be cut along N only. */
#include <string.h>

#include "../../codelets/conv.h"
#include "../internal.h"
#include "tessel/ops.h"

tsl_status tsl_conv_params_init(tsl_conv_params *p, int32_t spatial)
{
    if (!p || spatial < 1 || spatial > 3)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                         "tsl_conv_params_init: NULL or %d spatial dimensions (want 1 to 3)",
                         (int)spatial);
    memset(p, 0, sizeof *p);
    p->spatial = spatial;
    for (int d = 0; d < 3; d++) {
        p->stride[d] = 1;
        p->dilation[d] = 1;
    }
    p->groups = 1;
    return TSL_OK;
}

/* Arguments present, shapes valid, ranks that fit the number of spatial dimensions. */
static tsl_status check_shapes(const tsl_shape *x, const tsl_shape *w, const tsl_conv_params *p,
                               const tsl_shape *y, const char *fn)
{
    if (!x || !w || !p || !y)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "%s: NULL argument", fn);
    tsl_status st = tsl_shape_check(x);
    if (st || (st = tsl_shape_check(w)))
        return st;
    int sp = p->spatial;
    if (sp < 1 || sp > 3)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "%s: %d spatial dimensions (want 1 to 3)", fn,
                         sp);
    if (x->ndim != sp + 2 || w->ndim != sp + 2)
        return tsl_error(NULL, TSL_ERR_SHAPE,
                         "%s: x and w need %d dimensions for a %d-D convolution (have %d, %d)", fn,
                         sp + 2, sp, (int)x->ndim, (int)w->ndim);
    return TSL_OK;
}

tsl_status tsl_conv_output_shape(const tsl_shape *x, const tsl_shape *w, const tsl_conv_params *p,
                                 tsl_shape *y)
{
    const char *fn = "convolution";
    tsl_status st = check_shapes(x, w, p, y, fn);
    if (st)
        return st;
    int sp = p->spatial;
    if (p->groups < 1 || x->dims[1] % p->groups || w->dims[0] % p->groups)
        return tsl_error(NULL, TSL_ERR_SHAPE,
                         "%s: %lld groups must divide the %lld input and %lld output channels", fn,
                         (long long)p->groups, (long long)x->dims[1], (long long)w->dims[0]);
    if (w->dims[1] * p->groups != x->dims[1])
        return tsl_error(NULL, TSL_ERR_SHAPE,
                         "%s: weights take %lld input channels per group, x has %lld channels in "
                         "%lld groups",
                         fn, (long long)w->dims[1], (long long)x->dims[1], (long long)p->groups);
    tsl_shape out = *x;
    out.dims[1] = w->dims[0];
    for (int d = 0; d < sp; d++) {
        if (p->stride[d] < 1 || p->dilation[d] < 1 || p->padding[d] < 0)
            return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                             "%s: stride %lld, dilation %lld and padding %lld of dimension %d "
                             "must be >= 1, >= 1 and >= 0",
                             fn, (long long)p->stride[d], (long long)p->dilation[d],
                             (long long)p->padding[d], d);
        int64_t span = p->dilation[d] * (w->dims[2 + d] - 1) + 1;
        int64_t room = x->dims[2 + d] + 2 * p->padding[d];
        if (span > room)
            return tsl_error(NULL, TSL_ERR_SHAPE,
                             "%s: the kernel spans %lld along dimension %d, more than the padded "
                             "input's %lld",
                             fn, (long long)span, d, (long long)room);
        out.dims[2 + d] = (room - span) / p->stride[d] + 1;
    }
    *y = out;
    return TSL_OK;
}

tsl_status tsl_conv_transpose_output_shape(const tsl_shape *x, const tsl_shape *w,
                                           const tsl_conv_params *p, tsl_shape *y)
{
    const char *fn = "transposed convolution";
    tsl_status st = check_shapes(x, w, p, y, fn);
    if (st)
        return st;
    int sp = p->spatial;
    if (p->groups < 1 || x->dims[1] % p->groups || w->dims[0] != x->dims[1])
        return tsl_error(NULL, TSL_ERR_SHAPE,
                         "%s: weights (%lld, ...) must take the %lld input channels, in %lld "
                         "groups that divide them",
                         fn, (long long)w->dims[0], (long long)x->dims[1], (long long)p->groups);
    tsl_shape out = *x;
    out.dims[1] = w->dims[1] * p->groups;
    for (int d = 0; d < sp; d++) {
        if (p->stride[d] < 1 || p->dilation[d] < 1 || p->padding[d] < 0 ||
            p->output_padding[d] < 0 ||
            (p->output_padding[d] >= p->stride[d] && p->output_padding[d] >= p->dilation[d]))
            return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                             "%s: dimension %d needs stride >= 1, dilation >= 1, padding >= 0 "
                             "and 0 <= output padding < max(stride, dilation)",
                             fn, d);
        int64_t size = (x->dims[2 + d] - 1) * p->stride[d] - 2 * p->padding[d] +
                       p->dilation[d] * (w->dims[2 + d] - 1) + p->output_padding[d] + 1;
        if (size < 1)
            return tsl_error(NULL, TSL_ERR_SHAPE, "%s: padding leaves no output along dimension %d",
                             fn, d);
        out.dims[2 + d] = size;
    }
    *y = out;
    return TSL_OK;
}

/* Check the tensors against the settings; fill the per-tile arguments' shared part. */
static tsl_status check(const tsl_conv_params *p, int transposed, tsl_tensor_t x, tsl_tensor_t w,
                        tsl_tensor_t b, tsl_tensor_t y, const char *what, const char *fn,
                        tsl_conv_args *args)
{
    tsl_status st = tsl_tensor_check(x, fn);
    if (st || (st = tsl_tensor_check(w, fn)) || (st = tsl_tensor_check(y, fn)))
        return st;
    struct tsl_context *ctx = x->ctx;
    if (!p)
        return tsl_error(ctx, TSL_ERR_INVALID_ARG, "%s: params is NULL", fn);
    if (w->ctx != ctx || y->ctx != ctx || (b && b->ctx != ctx))
        return tsl_error(ctx, TSL_ERR_INVALID_ARG, "%s: tensors of different contexts", fn);
    if (x->dtype != TSL_F32 || w->dtype != TSL_F32 || y->dtype != TSL_F32 ||
        (b && b->dtype != TSL_F32))
        return tsl_error(ctx, TSL_ERR_DTYPE, "%s: convolutions take f32 tensors", fn);
    tsl_shape want;
    st = transposed ? tsl_conv_transpose_output_shape(&x->shape, &w->shape, p, &want)
                    : tsl_conv_output_shape(&x->shape, &w->shape, p, &want);
    if (st)
        return tsl_error(ctx, st, "%s", tsl_last_error());
    if (memcmp(want.dims, y->shape.dims, sizeof want.dims) != 0 || want.ndim != y->shape.ndim)
        return tsl_error(ctx, TSL_ERR_SHAPE, "%s: %s has the wrong shape for these settings", fn,
                         what);
    for (int d = 1; d < x->shape.ndim; d++)
        if (x->grid.splits[d] != 1 || y->grid.splits[d] != 1)
            return tsl_error(ctx, TSL_ERR_SHAPE,
                             "%s: x and %s must be cut along N only (spatial tiles need halo "
                             "exchange, which convolutions do not do yet)",
                             fn, what);
    if (y->layout != x->layout || w->layout != TSL_LAYOUT_PLAIN)
        return tsl_error(ctx, TSL_ERR_SHAPE,
                         "%s: x and %s need the same layout (plain or channels-last) and w must "
                         "be plain",
                         fn, what);
    if (x->grid.splits[0] != y->grid.splits[0] || w->ntiles != 1)
        return tsl_error(ctx, TSL_ERR_SHAPE,
                         "%s: x and %s need the same sample tiles, and w must be one tile", fn,
                         what);
    if (b && (b->shape.ndim != 1 || b->shape.dims[0] != want.dims[1] || b->ntiles != 1))
        return tsl_error(ctx, TSL_ERR_SHAPE, "%s: the bias must be one tile of %lld values", fn,
                         (long long)want.dims[1]);
    memset(args, 0, sizeof *args);
    args->spatial = p->spatial;
    args->has_bias = b != NULL;
    args->transposed = transposed;
    args->channels_last = x->layout == TSL_LAYOUT_CHANNELS_LAST;
    args->in_channels = x->shape.dims[1];
    args->out_channels = want.dims[1];
    args->groups = p->groups;
    for (int d = 0; d < p->spatial; d++) {
        args->in_size[d] = x->shape.dims[2 + d];
        args->out_size[d] = want.dims[2 + d];
        args->kernel[d] = w->shape.dims[2 + d];
        args->stride[d] = p->stride[d];
        args->padding[d] = p->padding[d];
        args->dilation[d] = p->dilation[d];
    }
    return TSL_OK;
}

static double conv_flops(const tsl_conv_args *a)
{
    double f =
        2.0 * (double)a->samples * (double)a->out_channels * (double)(a->in_channels / a->groups);
    for (int d = 0; d < a->spatial; d++) /* each small-side position meets each tap */
        f *= (double)((a->transposed ? a->in_size[d] : a->out_size[d]) * a->kernel[d]);
    return f;
}

static int64_t tile_samples(tsl_tensor_t x, int64_t tile)
{
    int64_t start[TSL_MAX_DIMS], extent[TSL_MAX_DIMS];
    tsl_tensor_tile_box(x, tile, start, extent);
    return extent[0];
}

/* Codelet arguments of a sample tile: whole samples, no window (oneDNN pads). */
static tsl_conv_task_args task_args(const tsl_conv_args *a, int64_t samples)
{
    tsl_conv_task_args t;
    memset(&t, 0, sizeof t);
    t.conv = *a;
    t.conv.samples = samples;
    return t;
}

/* Forward arguments of sample tile `tile`: the shared ones with this tile's sample count. */
static double conv_tile_args(int64_t tile, void *args, void *user)
{
    tsl_conv_task_args *t = args;
    t->conv.samples = tile_samples(user, tile);
    return conv_flops(&t->conv);
}

static tsl_status forward(const tsl_conv_params *p, int transposed, tsl_tensor_t x, tsl_tensor_t w,
                          tsl_tensor_t b, tsl_tensor_t y, const char *fn)
{
    tsl_conv_args a;
    tsl_status st = check(p, transposed, x, w, b, y, "y", fn, &a);
    if (st)
        return st;
    if (y == x)
        return tsl_error(x->ctx, TSL_ERR_INVALID_ARG, "%s: y may not overwrite x", fn);
    tsl_conv_task_args t = task_args(&a, 0);
    return tsl_weighted_forward(&tsl_cl_conv_forward, x, w, b, y, &t, sizeof t, conv_tile_args, x);
}

typedef struct conv_grads {
    tsl_conv_args args;
    tsl_tensor_t x, dy;
} conv_grads;

static tsl_status conv_partial(int64_t tile, starpu_data_handle_t dw_part,
                               starpu_data_handle_t db_part, void *user)
{
    conv_grads *g = user;
    tsl_conv_task_args a = task_args(&g->args, tile_samples(g->x, tile));
    a.conv.has_bias = db_part != NULL;
    tsl_task_desc desc = {
        .codelet = &tsl_cl_conv_backward_weights,
        .args = &a,
        .args_size = sizeof a,
        .nhandles = db_part ? 4 : 3,
        .handles = {g->x->handles[tile], g->dy->handles[tile], dw_part, db_part},
        .modes = {STARPU_R, STARPU_R, STARPU_W, STARPU_W},
        .flops = conv_flops(&a.conv),
    };
    return tsl_task_submit(g->x->ctx, &desc);
}

static tsl_status backward(const tsl_conv_params *p, int transposed, tsl_tensor_t x, tsl_tensor_t w,
                           tsl_tensor_t dy, tsl_tensor_t dx, tsl_tensor_t dw, tsl_tensor_t db,
                           const char *fn)
{
    conv_grads g;
    tsl_status st = check(p, transposed, x, w, NULL, dy, "dy", fn, &g.args);
    if (st)
        return st;
    struct tsl_context *ctx = x->ctx;
    if ((dx && (st = tsl_tensor_check_same_layout(dx, x, fn))) ||
        (dw && (st = tsl_tensor_check_same_layout(dw, w, fn))))
        return st;
    if (db && (db->ctx != ctx || db->dtype != TSL_F32 || db->shape.ndim != 1 ||
               db->shape.dims[0] != g.args.out_channels || db->ntiles != 1))
        return tsl_error(ctx, TSL_ERR_SHAPE, "%s: db must be one tile of %lld f32 values", fn,
                         (long long)g.args.out_channels);
    if (db && !dw)
        return tsl_error(ctx, TSL_ERR_INVALID_ARG, "%s: db needs dw (computed together)", fn);
    if (dx == x || dx == dy || dw == w)
        return tsl_error(ctx, TSL_ERR_INVALID_ARG, "%s: a gradient may not overwrite an input", fn);
    g.x = x;
    g.dy = dy;
    if (dw && (st = tsl_param_gradients(x, dy, dw, db, conv_partial, &g)))
        return st;
    for (int64_t i = 0; dx && i < x->ntiles && !st; i++) {
        tsl_conv_task_args a = task_args(&g.args, tile_samples(x, i));
        tsl_task_desc desc = {
            .codelet = &tsl_cl_conv_backward_data,
            .args = &a,
            .args_size = sizeof a,
            .nhandles = 3,
            .handles = {dy->handles[i], w->handles[0], dx->handles[i]},
            .modes = {STARPU_R, STARPU_R, STARPU_W},
            .flops = conv_flops(&a.conv),
        };
        st = tsl_task_submit(ctx, &desc);
    }
    starpu_mpi_cache_flush(ctx->comm, w->handles[0]);
    return st;
}

tsl_status tsl_conv_forward(const tsl_conv_params *p, tsl_tensor_t x, tsl_tensor_t w,
                            tsl_tensor_t b, tsl_tensor_t y)
{
    return forward(p, 0, x, w, b, y, "tsl_conv_forward");
}

tsl_status tsl_conv_backward(const tsl_conv_params *p, tsl_tensor_t x, tsl_tensor_t w,
                             tsl_tensor_t dy, tsl_tensor_t dx, tsl_tensor_t dw, tsl_tensor_t db)
{
    return backward(p, 0, x, w, dy, dx, dw, db, "tsl_conv_backward");
}

tsl_status tsl_conv_transpose_forward(const tsl_conv_params *p, tsl_tensor_t x, tsl_tensor_t w,
                                      tsl_tensor_t b, tsl_tensor_t y)
{
    return forward(p, 1, x, w, b, y, "tsl_conv_transpose_forward");
}

tsl_status tsl_conv_transpose_backward(const tsl_conv_params *p, tsl_tensor_t x, tsl_tensor_t w,
                                       tsl_tensor_t dy, tsl_tensor_t dx, tsl_tensor_t dw,
                                       tsl_tensor_t db)
{
    return backward(p, 1, x, w, dy, dx, dw, db, "tsl_conv_transpose_backward");
}
