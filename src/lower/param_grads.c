/* Sample-tiled ops with parameters (linear, convolution).
 *
 * Forward: one task per sample tile reading x, the weights and the optional bias, writing y.
 * Parameter gradients: each sample tile's task
 * writes a partial dw (and db); the first tile's partial lands in dw and db themselves (the
 * task runs on their owner), the others in temporaries on their dy tile's owner; trees of
 * axpy tasks add them up. */
#include <stdlib.h>

#include "../internal.h"

tsl_status tsl_param_gradients(tsl_tensor_t x, tsl_tensor_t dy, tsl_tensor_t dw, tsl_tensor_t db,
                               tsl_partial_grad_fn submit_partial, void *user)
{
    struct tsl_context *ctx = x->ctx;
    const char *fn = "parameter gradients";
    if (ctx->tag_count - ctx->tags_used < 2 * x->ntiles)
        return tsl_error(ctx, TSL_ERR_RESOURCE, "%s: StarPU-MPI tags exhausted", fn);
    tsl_status st = TSL_OK;
    starpu_data_handle_t *pw = calloc((size_t)x->ntiles, sizeof *pw);
    starpu_data_handle_t *pb = calloc((size_t)x->ntiles, sizeof *pb);
    if (!pw || !pb) {
        free(pw);
        free(pb);
        return tsl_error(ctx, TSL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    }
    int64_t wcount = tsl_shape_numel(&dw->shape), bcount = db ? tsl_shape_numel(&db->shape) : 0;
    for (int64_t i = 0; i < x->ntiles && !st; i++) {
        int32_t owner = i ? dy->tile_owner[i] : dw->tile_owner[0];
        if (i == 0) {
            pw[0] = dw->handles[0];
            if (db && db->tile_owner[0] == owner)
                pb[0] = db->handles[0];
            else if (db)
                st = tsl_temp_handle_register(ctx, bcount, db->elem_size, owner, &pb[0]);
        } else {
            st = tsl_temp_handle_register(ctx, wcount, dw->elem_size, owner, &pw[i]);
            if (!st && db)
                st = tsl_temp_handle_register(ctx, bcount, db->elem_size, owner, &pb[i]);
        }
        if (!st)
            st = submit_partial(i, pw[i], db ? pb[i] : NULL, user);
        for (int k = 0; k < 2 && !st; k++) {
            tsl_tensor_t read = k ? dy : x;
            if (read->tile_owner[i] != owner)
                starpu_mpi_cache_flush(ctx->comm, read->handles[i]);
        }
    }
    if (!st)
        st = tsl_tree_sum_into(ctx, pw, x->ntiles, dw->dtype, wcount, dw->handles[0]);
    if (!st && db)
        st = tsl_tree_sum_into(ctx, pb, x->ntiles, db->dtype, bcount, db->handles[0]);
    free(pw);
    free(pb);
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
            .handles = {x->handles[i], w->handles[0], b ? b->handles[0] : y->handles[i],
                        y->handles[i]},
            .modes = {STARPU_R, STARPU_R, b ? STARPU_R : STARPU_W, STARPU_W},
            .flops = fill(i, args, user),
        };
        st = tsl_task_submit(x->ctx, &desc);
        if (x->tile_owner[i] != y->tile_owner[i])
            starpu_mpi_cache_flush(x->ctx->comm, x->handles[i]);
    }
    starpu_mpi_cache_flush(x->ctx->comm, w->handles[0]);
    if (b)
        starpu_mpi_cache_flush(x->ctx->comm, b->handles[0]);
    return st;
}
