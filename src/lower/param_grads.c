/* Sample-tiled ops with parameters (linear, convolution).
 *
 * Forward: one task per sample tile reading x, the weights and the optional bias, writing y.
 * Parameter gradients: each sample tile's task writes a partial dw (and db) where its dy tile
 * lives: the first tile on dw's (db's) owner into dw (db) itself, the others into temporaries;
 * trees of axpy tasks rooted there add them up. A weight cut into shards (a model's sharded weight,
 * DESIGN rule 5) has every partial in a temporary, cut into one piece per shard where it was made,
 * and one tree per shard rooted at the shard's owner: each rank's piece goes to the owner as soon
 * as its backward task is done (reduce-scatter by placement); the optimizer then updates the shard
 * there and every rank reads it back into its whole copy (allgather by placement). */
#include <stdlib.h>
#include <string.h>

#include "../../codelets/tile_ops.h"
#include "../internal.h"

/* Reduction tasks run ahead of the rest of backward where the scheduler has priorities. */
#define REDUCE_PRIORITY 1

/* partials[] reordered so that the tree's root (entry 0) is the first one owned by `owner`
 * (if any): the total then ends where the target lives and crosses ranks once per level. */
static void rooted_at(const int32_t *owner_of, int64_t n, int32_t owner,
                      const starpu_data_handle_t *partials, starpu_data_handle_t *out)
{
    int64_t root = 0;
    while (root < n && owner_of[root] != owner)
        root++;
    if (root == n)
        root = 0;
    for (int64_t i = 0; i < n; i++)
        out[i] = partials[(root + i) % n];
}

/* A dw cut into shards along its first dimension: each tile's partial is cut on the tile's
 * owner into one piece per shard, and each shard's pieces are summed by a tree rooted at the
 * shard's owner (reduce-scatter by placement). */
static tsl_status reduce_shards(struct tsl_context *ctx, tsl_tensor_t dy, tsl_tensor_t dw,
                                starpu_data_handle_t *pw, starpu_data_handle_t *piece,
                                starpu_data_handle_t *order)
{
    const int64_t n = dy->ntiles, wcount = tsl_shape_numel(&dw->shape);
    tsl_status st = TSL_OK;
    for (int64_t k = 0; k < dw->ntiles && !st; k++) {
        int64_t start[TSL_MAX_DIMS], extent[TSL_MAX_DIMS];
        tsl_tensor_tile_box(dw, k, start, extent);
        int64_t row = wcount / dw->shape.dims[0], len = tsl_tensor_tile_numel(dw, k);
        tsl_box_copy_args a;
        memset(&a, 0, sizeof a);
        a.ndim = 1;
        a.elem_size = (int32_t)dw->elem_size;
        a.src_extent[0] = wcount;
        a.src_offset[0] = start[0] * row;
        a.dst_extent[0] = a.box[0] = len;
        for (int64_t i = 0; i < n && !st; i++) {
            if ((st = tsl_temp_handle_register(ctx, len, dw->elem_size, dy->tile_owner[i],
                                               &piece[i])))
                break;
            tsl_task_desc desc = {
                .codelet = &tsl_cl_box_copy,
                .args = &a,
                .args_size = sizeof a,
                .nhandles = 2,
                .handles = {pw[i], piece[i]},
                .modes = {STARPU_R, STARPU_W},
                .priority = REDUCE_PRIORITY,
            };
            st = tsl_task_submit(ctx, &desc);
        }
        if (st) {
            for (int64_t i = 0; i < n; i++)
                if (piece[i])
                    tsl_temp_handle_release(ctx, piece[i]);
            break;
        }
        rooted_at(dy->tile_owner, n, dw->tile_owner[k], piece, order);
        st = tsl_tree_sum_into(ctx, order, n, dw->dtype, len, dw->handles[k], REDUCE_PRIORITY);
        memset(piece, 0, (size_t)n * sizeof *piece);
    }
    return st;
}

/* The first tile of dy owned by `owner`, or -1. */
static int64_t first_owned(tsl_tensor_t dy, int32_t owner)
{
    for (int64_t i = 0; i < dy->ntiles; i++)
        if (dy->tile_owner[i] == owner)
            return i;
    return -1;
}

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
    if (ctx->tag_count - ctx->tags_used < (2 + dw->ntiles) * x->ntiles)
        return tsl_error(ctx, TSL_ERR_RESOURCE, "%s: StarPU-MPI tags exhausted", fn);
    tsl_status st = TSL_OK;
    const size_t n = (size_t)x->ntiles;
    starpu_data_handle_t *pw = calloc(n, sizeof *pw), *pb = calloc(n, sizeof *pb);
    starpu_data_handle_t *piece = calloc(n, sizeof *piece), *order = calloc(n, sizeof *order);
    if (!pw || !pb || !piece || !order) {
        free(pw);
        free(pb);
        free(piece);
        free(order);
        return tsl_error(ctx, TSL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    }
    /* Every partial is made where its dy tile lives; the first one on dw's (db's) owner lands
     * in dw (db) itself and roots the tree. */
    int64_t wroot = sharded ? -1 : first_owned(dy, dw->tile_owner[0]);
    int64_t broot = db ? first_owned(dy, db->tile_owner[0]) : -1;
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
        st = reduce_shards(ctx, dy, dw, pw, piece, order);
        for (size_t i = 0; i < n; i++)
            if (pw[i])
                tsl_temp_handle_release(ctx, pw[i]);
    } else if (!st) {
        rooted_at(dy->tile_owner, x->ntiles, dw->tile_owner[0], pw, order);
        st = tsl_tree_sum_into(ctx, order, x->ntiles, dw->dtype, wcount, dw->handles[0],
                               REDUCE_PRIORITY);
    }
    if (!st && db) {
        rooted_at(dy->tile_owner, x->ntiles, db->tile_owner[0], pb, order);
        st = tsl_tree_sum_into(ctx, order, x->ntiles, db->dtype, bcount, db->handles[0],
                               REDUCE_PRIORITY);
    }
    free(pw);
    free(pb);
    free(piece);
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
