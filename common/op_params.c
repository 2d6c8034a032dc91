/* Op settings and the shapes they give (tessel/op_params.h): pure functions of shapes and
 * settings, shared by graph/ (shape inference) and src/lower/ (checks before tasks). */
#include <string.h>

#include "error.h"
#include "tessel/op_params.h"

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
    if (p->padding_mode < 0 || p->padding_mode >= TSL_PADDING_MODE_COUNT)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                         "%s: padding mode %d (want zeros 0, reflect 1, replicate 2 or "
                         "circular 3)",
                         fn, (int)p->padding_mode);
    tsl_shape out = *x;
    out.dims[1] = w->dims[0];
    for (int d = 0; d < sp; d++) {
        int64_t reach = p->dilation[d] * (w->dims[2 + d] - 1);
        if (p->padding_mode == TSL_PADDING_CIRCULAR && p->padding[d] > x->dims[2 + d])
            return tsl_error(NULL, TSL_ERR_SHAPE,
                             "%s: circular padding %lld along dimension %d wraps round the input "
                             "of %lld more than once",
                             fn, (long long)p->padding[d], d, (long long)x->dims[2 + d]);
        if ((p->padding_mode == TSL_PADDING_REFLECT || p->padding_mode == TSL_PADDING_REPLICATE) &&
            p->padding[d] > 0 &&
            (2 * p->padding[d] > reach ||
             (p->padding_mode == TSL_PADDING_REFLECT && p->padding[d] >= x->dims[2 + d])))
            return tsl_error(
                NULL, TSL_ERR_SHAPE,
                "%s: %s padding %lld along dimension %d needs 2 x padding <= "
                "dilation x (kernel - 1) = %lld%s",
                fn, p->padding_mode == TSL_PADDING_REFLECT ? "reflect" : "replicate",
                (long long)p->padding[d], d, (long long)reach,
                p->padding_mode == TSL_PADDING_REFLECT ? " and padding below the input size" : "");
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
    if (p->padding_mode != TSL_PADDING_ZEROS)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                         "%s: padding mode %d: transposed convolutions pad with zeros only (as "
                         "PyTorch's)",
                         fn, (int)p->padding_mode);
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

tsl_status tsl_pool_params_init(tsl_pool_params *p, tsl_pool_kind kind, int32_t spatial,
                                int64_t kernel)
{
    if (!p || spatial < 1 || spatial > 3 || kernel < 1 ||
        (kind != TSL_POOL_MAX && kind != TSL_POOL_AVG))
        return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                         "tsl_pool_params_init: NULL, unknown kind, %d spatial dimensions or "
                         "kernel %lld",
                         (int)spatial, (long long)kernel);
    memset(p, 0, sizeof *p);
    p->spatial = spatial;
    p->kind = kind;
    p->count_include_pad = 1;
    for (int d = 0; d < spatial; d++)
        p->kernel[d] = p->stride[d] = kernel;
    return TSL_OK;
}

tsl_status tsl_pool_output_shape(const tsl_shape *x, const tsl_pool_params *p, tsl_shape *y)
{
    const char *fn = "pooling";
    if (!x || !p || !y)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "%s: NULL argument", fn);
    tsl_status st = tsl_shape_check(x);
    if (st)
        return st;
    if (p->spatial < 1 || p->spatial > 3 || (p->kind != TSL_POOL_MAX && p->kind != TSL_POOL_AVG))
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "%s: bad kind or spatial dimensions", fn);
    if (x->ndim != p->spatial + 2)
        return tsl_error(NULL, TSL_ERR_SHAPE, "%s: x needs %d dimensions, has %d", fn,
                         p->spatial + 2, (int)x->ndim);
    tsl_shape out = *x;
    for (int d = 0; d < p->spatial; d++) {
        if (p->kernel[d] < 1 || p->stride[d] < 1 || p->padding[d] < 0 ||
            2 * p->padding[d] > p->kernel[d])
            return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                             "%s: dimension %d needs kernel >= 1, stride >= 1 and 0 <= padding "
                             "<= kernel / 2",
                             fn, d);
        int64_t room = x->dims[2 + d] + 2 * p->padding[d];
        if (p->kernel[d] > room)
            return tsl_error(NULL, TSL_ERR_SHAPE,
                             "%s: kernel %lld larger than the padded input (%lld) along "
                             "dimension %d",
                             fn, (long long)p->kernel[d], (long long)room, d);
        int64_t span = room - p->kernel[d], s = p->stride[d];
        out.dims[2 + d] = (p->ceil_mode ? (span + s - 1) / s : span / s) + 1;
        if (p->ceil_mode && (out.dims[2 + d] - 1) * s >= x->dims[2 + d] + p->padding[d])
            out.dims[2 + d]--; /* the last window starts inside the input or its left padding */
    }
    *y = out;
    return TSL_OK;
}
