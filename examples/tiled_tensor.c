/* A tiled tensor end to end: a 2-D image batch split in space over the ranks, filled,
 * updated by tile tasks, moved to another decomposition, summed exactly, saved as .npy.
 *
 *   mpirun -np 4 ./example_tiled_tensor out.npy
 */
#include <stdio.h>

#include "tessel/tessel.h"

#define TRY(call)                                                                                  \
    do {                                                                                           \
        tsl_status st_ = (call);                                                                   \
        if (st_ != TSL_OK) {                                                                       \
            fprintf(stderr, "%s failed: %s\n", #call, tsl_last_error());                           \
            goto out;                                                                              \
        }                                                                                          \
    } while (0)

int main(int argc, char **argv)
{
    tsl_context_t ctx;
    if (tsl_context_create(&ctx, NULL) != TSL_OK) {
        fprintf(stderr, "%s\n", tsl_last_error());
        return 1;
    }
    int32_t rank, size;
    tsl_context_rank(ctx, &rank);
    tsl_context_size(ctx, &size);
    int status = 1;
    tsl_tensor_t image = NULL, noise = NULL, rows = NULL;

    /* N=2, C=3, 96 x 80 pixels; 2 x 2 spatial tiles per sample, boxes of tiles per rank. */
    int64_t dims[4] = {2, 3, 96, 80};
    tsl_shape shape;
    TRY(tsl_shape_make(&shape, 4, dims));
    tsl_tile_grid space = tsl_tile_grid_single();
    space.splits[2] = 2;
    space.splits[3] = 2;
    int32_t process_grid[TSL_MAX_DIMS] = {1, 1, size >= 2 ? 2 : 1, size >= 4 ? 2 : 1, 1};
    tsl_owner_map boxes = tsl_owner_block(process_grid);
    TRY(tsl_tensor_create(&image, ctx, TSL_F32, &shape, &space, &boxes));
    TRY(tsl_tensor_create(&noise, ctx, TSL_F32, &shape, &space, &boxes));

    /* image = 0.5 + 0.1 * noise: fills and axpy are tile tasks on each tile's owner. */
    TRY(tsl_tensor_fill_constant(image, 0.5));
    TRY(tsl_tensor_fill_normal(noise, 2026, 0.0, 1.0));
    TRY(tsl_tensor_axpy(image, 0.1, noise));

    /* Another decomposition: rows of the image, dealt round the ranks. */
    tsl_tile_grid row_grid = tsl_tile_grid_single();
    row_grid.splits[2] = 8;
    int32_t ring[TSL_MAX_DIMS] = {1, 1, size, 1, 1}, one[TSL_MAX_DIMS] = {1, 1, 1, 1, 1};
    tsl_owner_map dealt = tsl_owner_block_cyclic(ring, one);
    TRY(tsl_tensor_create(&rows, ctx, TSL_F32, &shape, &row_grid, &dealt));
    TRY(tsl_tensor_redistribute(rows, image));

    double sum_space = 0, sum_rows = 0;
    TRY(tsl_tensor_sum(image, &sum_space));
    TRY(tsl_tensor_sum(rows, &sum_rows));
    int64_t owned = 0;
    TRY(tsl_tensor_owned_bytes(image, &owned));
    printf("rank %d owns %lld bytes of the image\n", (int)rank, (long long)owned);
    if (rank == 0)
        printf("sum over 2x2 spatial tiles %.17g, over 8 row tiles %.17g: %s\n", sum_space,
               sum_rows, sum_space == sum_rows ? "identical" : "DIFFERENT");
    if (argc > 1)
        TRY(tsl_tensor_write_npy(rows, argv[1], 0));
    status = sum_space == sum_rows ? 0 : 1;
out:
    tsl_tensor_destroy(rows);
    tsl_tensor_destroy(noise);
    tsl_tensor_destroy(image);
    tsl_context_destroy(ctx);
    return status;
}
