/* Fully connected layer on tiled tensors: x (N, K) and y (N, O) cut along N only, the
 * weights (O, K) read whole (one tile, or a sharded weight's replicas) and the bias (O) one
 * tile. Forward and backward-data are one task per
 * sample tile; the weight and bias gradients are partial sums per sample tile, added by a
 * tree of tasks and copied into dw and db. */
#include <limits.h>

#include "../../codelets/linear.h"
#include "../internal.h"

static int is_matrix(tsl_tensor_t t)
{
    return t->shape.ndim == 2 && t->grid.splits[1] == 1;
}

static int is_one_tile(tsl_tensor_t t)
{
    return t->ntiles == 1;
}

/* x (N, K), w (O, K), rows tiled alike; checks shared by forward and backward. */
static tsl_status check_pair(tsl_tensor_t x, tsl_tensor_t w, tsl_tensor_t rows_like_x,
                             int64_t features, const char *what, const char *fn)
{
    tsl_status st = tsl_tensor_check(x, fn);
    if (st || (st = tsl_tensor_check(w, fn)) || (st = tsl_tensor_check(rows_like_x, fn)) ||
        (st = tsl_tensor_check_float(x, fn)))
        return st;
    struct tsl_context *ctx = x->ctx;
    if (w->ctx != ctx || rows_like_x->ctx != ctx)
        return tsl_error(ctx, TSL_ERR_INVALID_ARG, "%s: tensors of different contexts", fn);
    if (w->dtype != x->dtype || rows_like_x->dtype != x->dtype)
        return tsl_error(ctx, TSL_ERR_DTYPE, "%s: dtypes differ", fn);
    if (!is_matrix(x) || !is_matrix(rows_like_x) || w->shape.ndim != 2)
        return tsl_error(ctx, TSL_ERR_SHAPE,
                         "%s: x, %s must be (N, features) matrices cut along N only and w an "
                         "(out, in) matrix",
                         fn, what);
    if (!tsl_tensor_whole(w))
        return tsl_error(ctx, TSL_ERR_SHAPE,
                         "%s: the weights must be one tile (or a model's sharded weight)", fn);
    if (w->shape.dims[1] != x->shape.dims[1] || rows_like_x->shape.dims[1] != features ||
        rows_like_x->shape.dims[0] != x->shape.dims[0] ||
        rows_like_x->grid.splits[0] != x->grid.splits[0])
        return tsl_error(ctx, TSL_ERR_SHAPE,
                         "%s: shapes x (%lld, %lld), w (%lld, %lld), %s (%lld, %lld) or their "
                         "sample tiles do not fit",
                         fn, (long long)x->shape.dims[0], (long long)x->shape.dims[1],
                         (long long)w->shape.dims[0], (long long)w->shape.dims[1], what,
                         (long long)rows_like_x->shape.dims[0],
                         (long long)rows_like_x->shape.dims[1]);
    if (x->shape.dims[0] > INT_MAX || x->shape.dims[1] > INT_MAX || w->shape.dims[0] > INT_MAX)
        return tsl_error(ctx, TSL_ERR_SHAPE, "%s: dimensions beyond BLAS's int range", fn);
    return TSL_OK;
}

static tsl_status check_bias(tsl_tensor_t b, tsl_tensor_t w, const char *fn)
{
    if (!b)
        return TSL_OK;
    if (b->ctx != w->ctx || b->dtype != w->dtype || b->shape.ndim != 1 ||
        b->shape.dims[0] != w->shape.dims[0] || !is_one_tile(b))
        return tsl_error(w->ctx, TSL_ERR_SHAPE,
                         "%s: the bias must be one tile of %lld values of the weights' dtype", fn,
                         (long long)w->shape.dims[0]);
    return TSL_OK;
}

static tsl_linear_args args_for(tsl_tensor_t x, tsl_tensor_t w, int64_t tile, int has_bias)
{
    int64_t start[TSL_MAX_DIMS], extent[TSL_MAX_DIMS];
    tsl_tensor_tile_box(x, tile, start, extent);
    tsl_linear_args a = {.dtype = x->dtype,
                         .has_bias = has_bias,
                         .rows = extent[0],
                         .in = x->shape.dims[1],
                         .out = w->shape.dims[0]};
    return a;
}

typedef struct linear_forward_job {
    tsl_tensor_t x, w;
    int has_bias;
} linear_forward_job;

static double linear_tile_args(int64_t tile, void *args, void *user)
{
    linear_forward_job *job = user;
    tsl_linear_args *a = args;
    *a = args_for(job->x, job->w, tile, job->has_bias);
    return 2.0 * (double)(a->rows * a->in * a->out);
}

tsl_status tsl_linear_forward(tsl_tensor_t x, tsl_tensor_t w, tsl_tensor_t b, tsl_tensor_t y)
{
    const char *fn = "tsl_linear_forward";
    tsl_status st = check_pair(x, w, y, w ? w->shape.dims[0] : 0, "y", fn);
    if (st || (st = check_bias(b, w, fn)))
        return st;
    if (y == x)
        return tsl_error(x->ctx, TSL_ERR_INVALID_ARG, "%s: y may not overwrite x", fn);
    linear_forward_job job = {x, w, b != NULL};
    tsl_linear_args a;
    return tsl_weighted_forward(&tsl_cl_linear_forward, x, w, b, y, &a, sizeof a, linear_tile_args,
                                &job);
}

/* dw = dy^T x and db = column sums of dy: one partial per sample tile, reduced by a tree. */
typedef struct linear_grads {
    tsl_tensor_t x, w, dy;
} linear_grads;

static tsl_status linear_partial(int64_t tile, starpu_data_handle_t dw_part,
                                 starpu_data_handle_t db_part, void *user)
{
    linear_grads *g = user;
    tsl_linear_args a = args_for(g->x, g->w, tile, db_part != NULL);
    tsl_task_desc desc = {
        .codelet = &tsl_cl_linear_backward_weights,
        .args = &a,
        .args_size = sizeof a,
        .nhandles = db_part ? 4 : 3,
        .handles = {g->x->handles[tile], g->dy->handles[tile], dw_part, db_part},
        .modes = {STARPU_R, STARPU_R, STARPU_W, STARPU_W},
        .flops = 2.0 * (double)(a.rows * a.in * a.out),
    };
    return tsl_task_submit(g->x->ctx, &desc);
}

tsl_status tsl_linear_backward(tsl_tensor_t x, tsl_tensor_t w, tsl_tensor_t dy, tsl_tensor_t dx,
                               tsl_tensor_t dw, tsl_tensor_t db)
{
    const char *fn = "tsl_linear_backward";
    tsl_status st = check_pair(x, w, dy, w ? w->shape.dims[0] : 0, "dy", fn);
    if (st)
        return st;
    struct tsl_context *ctx = x->ctx;
    if (dx && (st = tsl_tensor_check_same_layout(dx, x, fn)))
        return st;
    if (dw && (st = tsl_tensor_check_same_layout(dw, w, fn)))
        return st;
    if (db && (st = check_bias(db, w, fn)))
        return st;
    if (db && !dw)
        return tsl_error(ctx, TSL_ERR_INVALID_ARG, "%s: db needs dw (computed together)", fn);
    if (dx == x || dx == dy || dw == w)
        return tsl_error(ctx, TSL_ERR_INVALID_ARG, "%s: a gradient may not overwrite an input", fn);
    /* Weight gradients first: their reduction tree then overlaps the data gradients. */
    linear_grads grads = {x, w, dy};
    if (dw && (st = tsl_param_gradients(x, dy, dw, db, linear_partial, &grads)))
        return st;
    for (int64_t i = 0; dx && i < x->ntiles; i++) {
        tsl_linear_args a = args_for(x, w, i, 0);
        tsl_task_desc desc = {
            .codelet = &tsl_cl_linear_backward_data,
            .args = &a,
            .args_size = sizeof a,
            .nhandles = 3,
            .handles = {dy->handles[i], tsl_whole_handle(w, dx->tile_owner[i]), dx->handles[i]},
            .modes = {STARPU_R, STARPU_R, STARPU_W},
            .flops = 2.0 * (double)(a.rows * a.in * a.out),
        };
        if ((st = tsl_task_submit(ctx, &desc)))
            return st;
    }
    tsl_whole_flush(w);
    return TSL_OK;
}
