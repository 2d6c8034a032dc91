/* Tensors read from and written to `.npy` files on one rank, through scatter and gather. */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

tsl_status tsl_tensor_read_npy(tsl_tensor_t *out, tsl_context_t ctx, const char *path, int32_t root,
                               const tsl_tile_grid *grid, const tsl_owner_map *owners)
{
    if (!out)
        return tsl_error(ctx, TSL_ERR_INVALID_ARG, "tsl_tensor_read_npy: tensor is NULL");
    *out = NULL;
    if (!ctx)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "tsl_tensor_read_npy: ctx is NULL");
    if (root < 0 || root >= ctx->size)
        return tsl_error(ctx, TSL_ERR_INVALID_ARG, "tsl_tensor_read_npy: root %d outside [0, %d)",
                         (int)root, ctx->size);
    tsl_npy_header header;
    memset(&header, 0, sizeof header);
    void *data = NULL;
    tsl_status st = TSL_OK;
    if (ctx->rank == root) {
        if (!path)
            st = tsl_error(ctx, TSL_ERR_INVALID_ARG, "tsl_tensor_read_npy: path is NULL");
        else if ((st = tsl_npy_read(path, &header, &data)))
            tsl_error(ctx, st, "%s", tsl_last_error());
    }
    if ((st = tsl_context_agree(ctx, root, st)))
        return st;
    if (MPI_Bcast(&header, (int)sizeof header, MPI_BYTE, root, ctx->ctl_comm) != MPI_SUCCESS) {
        free(data);
        return tsl_error(ctx, TSL_ERR_RUNTIME, "tsl_tensor_read_npy: MPI_Bcast failed");
    }
    tsl_tensor_t t;
    st = tsl_tensor_create(&t, ctx, header.dtype, &header.shape, grid, owners);
    if (!st) {
        st = tsl_tensor_scatter(t, root, data);
        if (st)
            tsl_tensor_destroy(t);
        else
            *out = t;
    }
    free(data);
    return st;
}

tsl_status tsl_tensor_write_npy(tsl_tensor_t t, const char *path, int32_t root)
{
    tsl_status st = tsl_tensor_check(t, "tsl_tensor_write_npy");
    if (st)
        return st;
    struct tsl_context *ctx = t->ctx;
    if (root < 0 || root >= ctx->size)
        return tsl_error(ctx, TSL_ERR_INVALID_ARG, "tsl_tensor_write_npy: root %d outside [0, %d)",
                         (int)root, ctx->size);
    void *whole = NULL;
    if (ctx->rank == root) {
        if (!path)
            st = tsl_error(ctx, TSL_ERR_INVALID_ARG, "tsl_tensor_write_npy: path is NULL");
        else if (!(whole = malloc((size_t)tsl_shape_numel(&t->shape) * t->elem_size)))
            st = tsl_error(ctx, TSL_ERR_OUT_OF_MEMORY,
                           "tsl_tensor_write_npy: cannot hold the whole tensor on rank %d",
                           (int)root);
    }
    if ((st = tsl_context_agree(ctx, root, st)))
        return st;
    st = tsl_tensor_gather(t, root, whole);
    if (!st && ctx->rank == root && (st = tsl_npy_write(path, t->dtype, &t->shape, whole)))
        tsl_error(ctx, st, "%s", tsl_last_error());
    free(whole);
    return tsl_context_agree(ctx, root, st);
}
