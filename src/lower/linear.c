/* Fully connected layer on tiled tensors: x (N, K) and y (N, O) cut along N only, the
 * weights (O, K) read whole (one tile, or a sharded weight's replicas) and the bias (O) one
 * tile. Forward and backward-data are one task per sample tile. The weight gradient dw is one
 * tile or cut along its rows (O): one tile takes a partial sum per sample tile, added by a
 * tree of tasks; a dw cut into row blocks takes, per block and rank, one task that adds the
 * GEMMs of all that rank's sample tiles into the block's rows (no partial of the whole matrix,
 * no merge on one rank), then the ranks' blocks meet by a tree on the block's owner.
 *
 * x or y cut along their features, or w along its columns (filters= and channels= plans): a
 * linear layer is a convolution of kernel 1 over one position, so those layers run through the
 * convolution's channel tiles (src/lower/conv.c): output tile (n, g) adds the passes of x's
 * feature tiles (n, k) with the weights' rows of g (on the output tile's owner), or, with w cut
 * along its columns as x is, partial outputs made where x's tiles live and added by a tree. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "codelets/linear.h"
#include "internal.h"

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

/* ---- feature tiles ---- */

/* Whether x or y (dy) is cut along its features, or w along its columns. */
static int feature_cut(tsl_tensor_t x, tsl_tensor_t w, tsl_tensor_t y)
{
    return (x && x->shape.ndim == 2 && x->grid.splits[1] > 1) ||
           (y && y->shape.ndim == 2 && y->grid.splits[1] > 1) ||
           (w && w->shape.ndim == 2 && w->grid.splits[1] > 1);
}

/* t (a matrix) seen as a one-position signal (rows, features, 1): the same tiles, owners and
 * handles, a trailing dimension of 1 (plain and channels-last alike in memory). */
static struct tsl_tensor as_signal(tsl_tensor_t t)
{
    struct tsl_tensor v = *t;
    int d = v.shape.ndim;
    v.shape.dims[d] = 1;
    v.grid.splits[d] = 1;
    if (v.owners.kind == TSL_OWNER_BLOCK && v.owners.process_grid[0] > 0)
        v.owners.process_grid[d] = 1;
    v.shape.ndim = d + 1;
    v.layout = TSL_LAYOUT_PLAIN;
    return v;
}

/* The convolution a linear layer is: kernel 1, stride 1, no padding, over one position. */
static tsl_conv_params kernel_one(void)
{
    tsl_conv_params p;
    memset(&p, 0, sizeof p);
    p.spatial = 1;
    p.stride[0] = p.dilation[0] = 1;
    p.groups = 1;
    p.padding_mode = TSL_PADDING_ZEROS;
    return p;
}

/* Shapes of a feature-cut layer: matrices, f32 (the convolution's type), whole rows of w. */
static tsl_status check_features(tsl_tensor_t x, tsl_tensor_t w, tsl_tensor_t y, const char *what,
                                 const char *fn)
{
    tsl_status st = tsl_tensor_check(x, fn);
    if (st || (st = tsl_tensor_check(w, fn)) || (st = tsl_tensor_check(y, fn)))
        return st;
    if (x->shape.ndim != 2 || w->shape.ndim != 2 || y->shape.ndim != 2 ||
        w->shape.dims[1] != x->shape.dims[1] || y->shape.dims[1] != w->shape.dims[0] ||
        y->shape.dims[0] != x->shape.dims[0])
        return tsl_error(x->ctx, TSL_ERR_SHAPE,
                         "%s: x (N, K), w (O, K) and %s (N, O) must be matrices of fitting "
                         "shapes",
                         fn, what);
    if (x->dtype != TSL_F32 || w->dtype != TSL_F32 || y->dtype != TSL_F32)
        return tsl_error(x->ctx, TSL_ERR_DTYPE,
                         "%s: tensors cut along their features take f32 (the convolution's "
                         "channel tiles run them)",
                         fn);
    return TSL_OK;
}

static tsl_status forward_features(tsl_tensor_t x, tsl_tensor_t w, tsl_tensor_t b, tsl_tensor_t y)
{
    tsl_status st = check_features(x, w, y, "y", "tsl_linear_forward");
    if (st)
        return st;
    struct tsl_tensor xv = as_signal(x), wv = as_signal(w), yv = as_signal(y);
    tsl_conv_params p = kernel_one();
    return tsl_conv_forward(&p, &xv, &wv, b, &yv);
}

static tsl_status backward_features(tsl_tensor_t x, tsl_tensor_t w, tsl_tensor_t dy,
                                    tsl_tensor_t dx, tsl_tensor_t dw, tsl_tensor_t db)
{
    const char *fn = "tsl_linear_backward";
    tsl_status st = check_features(x, w, dy, "dy", fn);
    if (st || (dx && (st = tsl_tensor_check_same_layout(dx, x, fn))))
        return st;
    if (dw && (dw->shape.ndim != 2 || dw->shape.dims[0] != w->shape.dims[0] ||
               dw->shape.dims[1] != w->shape.dims[1]))
        return tsl_error(x->ctx, TSL_ERR_SHAPE, "%s: dw must have w's shape", fn);
    if (db && !dw)
        return tsl_error(x->ctx, TSL_ERR_INVALID_ARG, "%s: db needs dw (computed together)", fn);
    struct tsl_tensor xv = as_signal(x), wv = as_signal(w), dyv = as_signal(dy);
    struct tsl_tensor dxv = dx ? as_signal(dx) : xv, dwv = dw ? as_signal(dw) : wv;
    tsl_conv_params p = kernel_one();
    return tsl_conv_backward(&p, &xv, &wv, &dyv, dx ? &dxv : NULL, dw ? &dwv : NULL, db);
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
    if (x && w && y && feature_cut(x, w, y))
        return forward_features(x, w, b, y);
    tsl_status st = check_pair(x, w, y, w ? w->shape.dims[0] : 0, "y", fn);
    if (st || (st = check_bias(b, w, fn)))
        return st;
    if (y == x)
        return tsl_error(x->ctx, TSL_ERR_INVALID_ARG, "%s: y may not overwrite x", fn);
    linear_forward_job job = {x, w, b != NULL};
    tsl_linear_args a;
    return tsl_weighted_forward(&tsl_cl_linear_forward, x, w, b, y, 0, &a, sizeof a,
                                linear_tile_args, &job);
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

/* A block of rows of dw (tile k) from up to TSL_LINEAR_MAX_TILES sample tiles `tiles`, into
 * `part` on the rank the tiles' dy live on; with db_part, the column sums of dy too. */
static tsl_status rows_task(tsl_tensor_t x, tsl_tensor_t dy, tsl_tensor_t dw, int64_t k,
                            const int64_t *tiles, int32_t count, starpu_data_handle_t part,
                            starpu_data_handle_t db_part)
{
    int64_t start[TSL_MAX_DIMS], extent[TSL_MAX_DIMS];
    tsl_tensor_tile_box(dw, k, start, extent);
    tsl_linear_rows_args a;
    memset(&a, 0, sizeof a);
    a.dtype = x->dtype;
    a.ntiles = count;
    a.has_bias = db_part != NULL;
    a.in = x->shape.dims[1];
    a.out = dy->shape.dims[1];
    a.row0 = start[0];
    a.nrows = extent[0];
    tsl_task_desc desc = {.codelet = &tsl_cl_linear_weight_rows, .args = &a, .args_size = sizeof a};
    int n = 0;
    for (int32_t t = 0; t < count; t++) {
        int64_t ts[TSL_MAX_DIMS], te[TSL_MAX_DIMS];
        tsl_tensor_tile_box(x, tiles[t], ts, te);
        a.samples[t] = te[0];
        desc.flops += 2.0 * (double)(te[0] * a.in * a.nrows);
        desc.handles[n] = x->handles[tiles[t]];
        desc.modes[n++] = STARPU_R;
        desc.handles[n] = dy->handles[tiles[t]];
        desc.modes[n++] = STARPU_R;
    }
    desc.handles[n] = part;
    desc.modes[n++] = STARPU_W;
    if (db_part) {
        desc.handles[n] = db_part;
        desc.modes[n++] = STARPU_W;
    }
    desc.nhandles = n;
    return tsl_task_submit(x->ctx, &desc);
}

/* dw cut along its rows (and db): per row block, every rank with samples adds its sample
 * tiles' GEMMs into one block (tasks of at most TSL_LINEAR_MAX_TILES tiles), into the block
 * itself on its owner; a tree rooted at the owner adds the ranks' blocks. db the same way,
 * from the tasks of block 0. */
static tsl_status weight_rows(tsl_tensor_t x, tsl_tensor_t dy, tsl_tensor_t dw, tsl_tensor_t db)
{
    struct tsl_context *ctx = x->ctx;
    const int64_t nt = x->ntiles, groups_max = nt + ctx->size;
    if (ctx->tag_count - ctx->tags_used < groups_max * (dw->ntiles + 1))
        return tsl_error(ctx, TSL_ERR_RESOURCE, "tsl_linear_backward: StarPU-MPI tags exhausted");
    int64_t *tiles = malloc(sizeof *tiles * (size_t)nt);
    int64_t *group_start = malloc(sizeof *group_start * (size_t)(groups_max + 1));
    int32_t *group_rank = malloc(sizeof *group_rank * (size_t)groups_max);
    starpu_data_handle_t *parts = calloc((size_t)groups_max, sizeof *parts);
    starpu_data_handle_t *db_parts = calloc((size_t)groups_max, sizeof *db_parts);
    if (!tiles || !group_start || !group_rank || !parts || !db_parts) {
        free(tiles);
        free(group_start);
        free(group_rank);
        free(parts);
        free(db_parts);
        return tsl_error(ctx, TSL_ERR_OUT_OF_MEMORY, "tsl_linear_backward: out of memory");
    }
    /* Groups of at most TSL_LINEAR_MAX_TILES sample tiles of one rank, rank by rank. */
    int64_t ngroups = 0, m = 0;
    for (int32_t q = 0; q < ctx->size; q++) {
        int32_t in_group = 0;
        for (int64_t i = 0; i < nt; i++) {
            if (dy->tile_owner[i] != q)
                continue;
            if (in_group == 0 || in_group == TSL_LINEAR_MAX_TILES) {
                group_start[ngroups] = m;
                group_rank[ngroups++] = q;
                in_group = 0;
            }
            tiles[m++] = i;
            in_group++;
        }
    }
    group_start[ngroups] = m;
    tsl_status st = TSL_OK;
    for (int64_t k = 0; k < dw->ntiles && !st; k++) {
        int32_t owner = dw->tile_owner[k];
        int64_t len = tsl_tensor_tile_numel(dw, k), first = 0;
        /* The tree's root: the owner's first group, else group 0 (then copied to the owner). */
        for (int64_t g = 0; g < ngroups; g++)
            if (group_rank[g] == owner) {
                first = g;
                break;
            }
        int want_db = db && k == 0;
        int64_t db_root = want_db ? tsl_grad_root(db, group_rank, ngroups) : -1;
        for (int64_t j = 0; j < ngroups && !st; j++) {
            int64_t g = (first + j) % ngroups;
            parts[j] = NULL;
            if (j == 0 && group_rank[g] == owner)
                parts[j] = dw->handles[k];
            else
                st = tsl_temp_handle_register(ctx, len, dw->elem_size, group_rank[g], &parts[j]);
            db_parts[g] = NULL;
            if (!st && want_db) {
                if (g == db_root)
                    db_parts[g] = db->handles[0];
                else
                    st = tsl_temp_handle_register(ctx, tsl_shape_numel(&db->shape), db->elem_size,
                                                  group_rank[g], &db_parts[g]);
            }
            if (!st)
                st = rows_task(x, dy, dw, k, tiles + group_start[g],
                               (int32_t)(group_start[g + 1] - group_start[g]), parts[j],
                               want_db ? db_parts[g] : NULL);
        }
        if (!st)
            st = tsl_tree_sum_into(ctx, parts, ngroups, dw->dtype, len, dw->handles[k],
                                   TSL_REDUCE_PRIORITY);
        if (!st && want_db)
            st = tsl_grad_sum(db, ngroups, db_parts, group_rank);
    }
    for (int64_t i = 0; i < nt; i++)
        if (x->tile_owner[i] != dy->tile_owner[i])
            tsl_cache_flush(ctx, x->handles[i]);
    free(tiles);
    free(group_start);
    free(group_rank);
    free(parts);
    free(db_parts);
    return st;
}

tsl_status tsl_linear_backward(tsl_tensor_t x, tsl_tensor_t w, tsl_tensor_t dy, tsl_tensor_t dx,
                               tsl_tensor_t dw, tsl_tensor_t db)
{
    const char *fn = "tsl_linear_backward";
    if (x && w && dy && feature_cut(x, w, dy))
        return backward_features(x, w, dy, dx, dw, db);
    tsl_status st = check_pair(x, w, dy, w ? w->shape.dims[0] : 0, "dy", fn);
    if (st)
        return st;
    struct tsl_context *ctx = x->ctx;
    if (dx && (st = tsl_tensor_check_same_layout(dx, x, fn)))
        return st;
    if (dw && ((st = tsl_tensor_check(dw, fn)) || dw->ctx != ctx || dw->dtype != w->dtype ||
               dw->shape.ndim != 2 || dw->shape.dims[0] != w->shape.dims[0] ||
               dw->shape.dims[1] != w->shape.dims[1] || dw->grid.splits[1] != 1 ||
               dw->layout != w->layout))
        return st ? st
                  : tsl_error(ctx, TSL_ERR_SHAPE,
                              "%s: dw must have w's shape and dtype, cut along its rows only", fn);
    if (db && (st = check_bias(db, w, fn)))
        return st;
    if (db && !dw)
        return tsl_error(ctx, TSL_ERR_INVALID_ARG, "%s: db needs dw (computed together)", fn);
    if (dx == x || dx == dy || dw == w)
        return tsl_error(ctx, TSL_ERR_INVALID_ARG, "%s: a gradient may not overwrite an input", fn);
    /* Weight gradients first: their reduction tree then overlaps the data gradients. */
    linear_grads grads = {x, w, dy};
    if (dw && dw->ntiles > 1)
        st = weight_rows(x, dy, dw, db);
    else if (dw)
        st = tsl_param_gradients(x, dy, dw, db, linear_partial, &grads);
    if (st)
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
