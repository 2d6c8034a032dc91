/* Sample-tiled ops with parameters (linear, convolution).
 *
 * Forward: one task per sample tile reading x, the weights and the optional bias, writing y.
 * Parameter gradients: each sample tile's task writes a partial dw (and db) where its dy tile
 * lives: the first tile on dw's (db's) owner into dw (db) itself, the others into temporaries;
 * trees of axpy tasks rooted there add them up, or, for a gradient in a bucket (small
 * parameters of a model), every partial goes to a temporary and the bucket packs them
 * (tsl_bucket_add). A weight cut into shards (a model's sharded weight,
 * DESIGN rule 5) has every partial in a temporary; each rank adds its partials' pieces of a shard
 * where they live and sends one sum to the shard's owner, where a tree adds them
 * (tsl_sum_into_tiles: reduce-scatter by placement); the optimizer then updates the shard there
 * and every rank reads it back into its whole copy (allgather by placement). */
#include <stdlib.h>

#include "internal.h"

/* Per channel tile g of dy (ky of them), its partials summed onto tile g of a parameter
 * gradient cut the same way (a convolution's filters under filters=): partial i belongs to g =
 * chan[i]. Releases the temporaries. */
static tsl_status sum_rows(struct tsl_context *ctx, tsl_tensor_t grad, int32_t ky, int64_t n,
                           const int32_t *chan, starpu_data_handle_t *partials,
                           const int32_t *owner_of)
{
    starpu_data_handle_t *mine = malloc(sizeof *mine * (size_t)n),
                         *order = malloc(sizeof *order * (size_t)n);
    int32_t *owners = malloc(sizeof *owners * (size_t)n);
    tsl_status st = mine && order && owners ? TSL_OK
                                            : tsl_error(ctx, TSL_ERR_OUT_OF_MEMORY,
                                                        "parameter gradients: out of memory");
    for (int32_t g = 0; g < ky && !st; g++) {
        int64_t m = 0;
        for (int64_t i = 0; i < n; i++)
            if (chan[i] == g) {
                mine[m] = partials[i];
                owners[m++] = owner_of[i];
            }
        if (!m)
            continue;
        tsl_rooted_order(owners, m, grad->tile_owner[g], mine, order);
        st = tsl_tree_sum_into(ctx, order, m, grad->dtype, tsl_tensor_tile_numel(grad, g),
                               grad->handles[g], TSL_REDUCE_PRIORITY);
    }
    free(mine);
    free(order);
    free(owners);
    return st;
}

tsl_status tsl_param_gradients(tsl_tensor_t x, tsl_tensor_t dy, tsl_tensor_t dw, tsl_tensor_t db,
                               tsl_partial_grad_fn submit_partial, void *user)
{
    struct tsl_context *ctx = x->ctx;
    const char *fn = "parameter gradients";
    /* dy cut along channels into ky tiles and dw (db) the same way along its filters (its first
     * dimension; a transposed convolution's second): one partial per dy tile of its tile's
     * size, summed per channel tile (rows); else a sharded weight's partials are whole
     * (sharded), or the gradient is one tile */
    const int32_t ky = dy->shape.ndim > 1 ? dy->grid.splits[1] : 1;
    const int by_second =
        ky > 1 && dw->shape.ndim > 1 && dw->grid.splits[0] == 1 && dw->grid.splits[1] == ky;
    for (int d = 1; d < dw->shape.ndim; d++)
        if (dw->grid.splits[d] != 1 && !(d == 1 && by_second))
            return tsl_error(ctx, TSL_ERR_SHAPE,
                             "%s: dw must be one tile or cut along its first dimension only (or "
                             "along its second, as dy's channels)",
                             fn);
    const int rows = ky > 1 && dw->ntiles == ky && (dw->grid.splits[0] == ky || by_second);
    const int sharded = !rows && dw->ntiles > 1;
    if (db && rows != (db->ntiles == ky && ky > 1))
        return tsl_error(ctx, TSL_ERR_SHAPE, "%s: db must be cut like dw", fn);
    const int64_t n = dy->ntiles;
    if (ctx->tag_count - ctx->tags_used < 2 * n)
        return tsl_error(ctx, TSL_ERR_RESOURCE, "%s: StarPU-MPI tags exhausted", fn);
    tsl_status st = TSL_OK;
    starpu_data_handle_t *pw = calloc((size_t)n, sizeof *pw), *pb = calloc((size_t)n, sizeof *pb);
    int32_t *chan = calloc((size_t)n, sizeof *chan);
    int64_t *wroots = calloc((size_t)ky, sizeof *wroots),
            *broots = calloc((size_t)ky, sizeof *broots);
    if (!pw || !pb || !chan || !wroots || !broots) {
        free(pw);
        free(pb);
        free(chan);
        free(wroots);
        free(broots);
        return tsl_error(ctx, TSL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    }
    int64_t inner = 1; /* tiles per channel coordinate step: the spatial tiles */
    for (int d = 2; d < dy->shape.ndim; d++)
        inner *= dy->grid.splits[d];
    for (int64_t i = 0; i < n; i++)
        chan[i] = ky > 1 ? (int32_t)((i / inner) % ky) : 0;
    for (int32_t g = 0; g < ky; g++) /* per channel tile, the partial that is the tile itself */
        wroots[g] = broots[g] = -1;
    for (int64_t i = 0; rows && i < n; i++) {
        int32_t g = chan[i];
        if (wroots[g] < 0 && dy->tile_owner[i] == dw->tile_owner[g])
            wroots[g] = i;
        if (db && broots[g] < 0 && dy->tile_owner[i] == db->tile_owner[g])
            broots[g] = i;
    }
    /* Every partial is made where its dy tile lives; the first one on dw's (db's) owner lands
     * in dw (db) itself and roots the tree. */
    int64_t wroot = sharded || rows ? -1 : tsl_grad_root(dw, dy->tile_owner, n);
    int64_t broot = db && !rows ? tsl_grad_root(db, dy->tile_owner, n) : -1;
    int64_t wcount = tsl_shape_numel(&dw->shape), bcount = db ? tsl_shape_numel(&db->shape) : 0;
    const int saved = tsl_param_grads_begin(ctx);
    for (int64_t i = 0; i < n && !st; i++) {
        int32_t owner = dy->tile_owner[i], g = chan[i];
        if (rows) {
            wcount = tsl_tensor_tile_numel(dw, g);
            bcount = db ? tsl_tensor_tile_numel(db, g) : 0;
        }
        if (i == wroot || (rows && i == wroots[g]))
            pw[i] = dw->handles[rows ? g : 0];
        else
            st = tsl_temp_handle_register(ctx, wcount, dw->elem_size, owner, &pw[i]);
        if (!st && (i == broot || (rows && db && i == broots[g])))
            pb[i] = db->handles[rows ? g : 0];
        else if (!st && db)
            st = tsl_temp_handle_register(ctx, bcount, db->elem_size, owner, &pb[i]);
        if (!st)
            st = submit_partial(i, pw[i], db ? pb[i] : NULL, user);
        if (!st && x->ntiles == n && x->tile_owner[i] != owner)
            tsl_cache_flush(ctx, x->handles[i]);
    }
    tsl_param_grads_end(ctx, saved);
    if (!st && rows) {
        st = sum_rows(ctx, dw, ky, n, chan, pw, dy->tile_owner);
        if (!st && db)
            st = sum_rows(ctx, db, ky, n, chan, pb, dy->tile_owner);
    } else if (!st && sharded) {
        st = tsl_sum_into_tiles(ctx, n, pw, dy->tile_owner, dw, TSL_REDUCE_PRIORITY, 0);
        for (int64_t i = 0; i < n; i++)
            if (pw[i])
                tsl_temp_handle_release(ctx, pw[i]);
    } else if (!st) {
        st = tsl_grad_sum(dw, n, pw, dy->tile_owner);
    }
    if (!st && db && !rows)
        st = tsl_grad_sum(db, n, pb, dy->tile_owner);
    free(pw);
    free(pb);
    free(chan);
    free(wroots);
    free(broots);
    return st;
}

int64_t tsl_grad_root(const struct tsl_tensor *g, const int32_t *owner_of, int64_t n)
{
    return g->bucket ? -1 : tsl_first_owned(owner_of, n, g->tile_owner[0]);
}

tsl_status tsl_grad_sum(struct tsl_tensor *g, int64_t n, starpu_data_handle_t *partials,
                        const int32_t *owner_of)
{
    struct tsl_context *ctx = g->ctx;
    tsl_status st;
    if (g->bucket) {
        st = tsl_bucket_add(g->bucket, g->bucket_member, n, partials, owner_of);
        for (int64_t i = 0; i < n; i++)
            tsl_temp_handle_release(ctx, partials[i]);
        return st;
    }
    starpu_data_handle_t *order = malloc(sizeof *order * (size_t)n);
    if (!order)
        return tsl_error(ctx, TSL_ERR_OUT_OF_MEMORY, "gradient sum: out of memory");
    tsl_rooted_order(owner_of, n, g->tile_owner[0], partials, order);
    st = tsl_tree_sum_into(ctx, order, n, g->dtype, tsl_shape_numel(&g->shape), g->handles[0],
                           TSL_REDUCE_PRIORITY);
    free(order);
    return st;
}

tsl_status tsl_weighted_forward(struct starpu_codelet *codelet, tsl_tensor_t x, tsl_tensor_t w,
                                tsl_tensor_t b, tsl_tensor_t y, int accumulate, void *args,
                                size_t args_size, tsl_tile_args_fn fill, void *user)
{
    enum starpu_data_access_mode out = accumulate ? STARPU_RW : STARPU_W;
    tsl_status st = TSL_OK;
    for (int64_t i = 0; i < x->ntiles && !st; i++) {
        tsl_task_desc desc = {
            .codelet = codelet,
            .args = args,
            .args_size = args_size,
            .nhandles = b ? 4 : 3,
            .handles = {x->handles[i], tsl_whole_handle(w, y->tile_owner[i]),
                        b ? tsl_whole_handle(b, y->tile_owner[i]) : y->handles[i], y->handles[i]},
            .modes = {STARPU_R, STARPU_R, b ? STARPU_R : out, out},
            .flops = fill(i, args, user),
        };
        st = tsl_task_submit(x->ctx, &desc);
        if (x->tile_owner[i] != y->tile_owner[i])
            tsl_cache_flush(x->ctx, x->handles[i]);
    }
    tsl_whole_flush(w);
    if (b)
        tsl_whole_flush(b);
    return st;
}
