/* Sample-tiled ops with parameters (linear, convolution).
 *
 * Forward: one task per sample tile reading x, the weights and the optional bias, writing y.
 * Parameter gradients: each sample tile's task writes a partial dw (and db) where its dy tile
 * lives: the first tile on dw's (db's) owner into dw (db) itself, the others into temporaries;
 * trees of axpy tasks rooted there add them up. A weight cut into shards (a model's sharded weight,
 * DESIGN rule 5) has every partial in a temporary; each rank adds its partials' pieces of a shard
 * where they live and sends one sum to the shard's owner, where a tree adds them
 * (tsl_sum_into_tiles: reduce-scatter by placement); the optimizer then updates the shard there
 * and every rank reads it back into its whole copy (allgather by placement). */
#include <stdlib.h>

#include "../internal.h"

tsl_status tsl_param_gradients(tsl_tensor_t x, tsl_tensor_t dy, tsl_tensor_t dw, tsl_tensor_t db,
                               tsl_partial_grad_fn submit_partial, void *user)
{
    struct tsl_context *ctx = x->ctx;
    const char *fn = "parameter gradients";
    for (int d = 1; d < dw->shape.ndim; d++)
        if (dw->grid.splits[d] != 1)
            return tsl_error(ctx, TSL_ERR_SHAPE,
                             "%s: dw must be one tile or cut along its first dimension only", fn);
    const int sharded = dw->ntiles > 1;
    if (ctx->tag_count - ctx->tags_used < 2 * x->ntiles)
        return tsl_error(ctx, TSL_ERR_RESOURCE, "%s: StarPU-MPI tags exhausted", fn);
    tsl_status st = TSL_OK;
    const size_t n = (size_t)x->ntiles;
    starpu_data_handle_t *pw = calloc(n, sizeof *pw), *pb = calloc(n, sizeof *pb);
    starpu_data_handle_t *order = calloc(n, sizeof *order);
    if (!pw || !pb || !order) {
        free(pw);
        free(pb);
        free(order);
        return tsl_error(ctx, TSL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    }
    /* Every partial is made where its dy tile lives; the first one on dw's (db's) owner lands
     * in dw (db) itself and roots the tree. */
    int64_t wroot = sharded ? -1 : tsl_first_owned(dy->tile_owner, dy->ntiles, dw->tile_owner[0]);
    int64_t broot = db ? tsl_first_owned(dy->tile_owner, dy->ntiles, db->tile_owner[0]) : -1;
    int64_t wcount = tsl_shape_numel(&dw->shape), bcount = db ? tsl_shape_numel(&db->shape) : 0;
    for (int64_t i = 0; i < x->ntiles && !st; i++) {
        int32_t owner = dy->tile_owner[i];
        if (i == wroot)
            pw[i] = dw->handles[0];
        else
            st = tsl_temp_handle_register(ctx, wcount, dw->elem_size, owner, &pw[i]);
        if (!st && i == broot)
            pb[i] = db->handles[0];
        else if (!st && db)
            st = tsl_temp_handle_register(ctx, bcount, db->elem_size, owner, &pb[i]);
        if (!st)
            st = submit_partial(i, pw[i], db ? pb[i] : NULL, user);
        if (!st && x->tile_owner[i] != owner)
            starpu_mpi_cache_flush(ctx->comm, x->handles[i]);
    }
    if (!st && sharded) {
        st = tsl_sum_into_tiles(ctx, x->ntiles, pw, dy->tile_owner, dw, TSL_REDUCE_PRIORITY);
        for (size_t i = 0; i < n; i++)
            if (pw[i])
                tsl_temp_handle_release(ctx, pw[i]);
    } else if (!st) {
        tsl_rooted_order(dy->tile_owner, x->ntiles, dw->tile_owner[0], pw, order);
        st = tsl_tree_sum_into(ctx, order, x->ntiles, dw->dtype, wcount, dw->handles[0],
                               TSL_REDUCE_PRIORITY);
    }
    if (!st && db) {
        tsl_rooted_order(dy->tile_owner, x->ntiles, db->tile_owner[0], pb, order);
        st = tsl_tree_sum_into(ctx, order, x->ntiles, db->dtype, bcount, db->handles[0],
                               TSL_REDUCE_PRIORITY);
    }
    free(pw);
    free(pb);
    free(order);
    return st;
}

tsl_status tsl_weighted_forward(struct starpu_codelet *codelet, tsl_tensor_t x, tsl_tensor_t w,
                                tsl_tensor_t b, tsl_tensor_t y, void *args, size_t args_size,
                                tsl_tile_args_fn fill, void *user)
{
    tsl_status st = TSL_OK;
    for (int64_t i = 0; i < x->ntiles && !st; i++) {
        tsl_task_desc desc = {
            .codelet = codelet,
            .args = args,
            .args_size = args_size,
            .nhandles = b ? 4 : 3,
            .handles = {x->handles[i], tsl_whole_handle(w, y->tile_owner[i]),
                        b ? b->handles[0] : y->handles[i], y->handles[i]},
            .modes = {STARPU_R, STARPU_R, b ? STARPU_R : STARPU_W, STARPU_W},
            .flops = fill(i, args, user),
        };
        st = tsl_task_submit(x->ctx, &desc);
        if (x->tile_owner[i] != y->tile_owner[i])
            starpu_mpi_cache_flush(x->ctx->comm, x->handles[i]);
    }
    tsl_whole_flush(w);
    if (b)
        starpu_mpi_cache_flush(x->ctx->comm, b->handles[0]);
    return st;
}
