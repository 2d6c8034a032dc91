/* Uses an installed tessel: the embedding header too, so StarPU and MPI come through the
 * package's dependencies. Starts a context and sums a tiled tensor. */
#include <stdio.h>

#include "tessel/starpu.h"
#include "tessel/tessel.h"

int main(void)
{
    tsl_context_t ctx;
    if (tsl_context_create(&ctx, NULL) != TSL_OK) {
        fprintf(stderr, "consumer: %s\n", tsl_last_error());
        return 1;
    }
    int64_t dims[2] = {6, 6};
    tsl_shape shape;
    tsl_shape_make(&shape, 2, dims);
    tsl_tile_grid grid = tsl_tile_grid_single();
    grid.splits[0] = 3;
    tsl_tensor_t t;
    double sum = 0;
    int ok = tsl_tensor_create(&t, ctx, TSL_F64, &shape, &grid, NULL) == TSL_OK &&
             tsl_tensor_fill_constant(t, 0.5) == TSL_OK && tsl_tensor_sum(t, &sum) == TSL_OK &&
             sum == 18.0;
    starpu_data_handle_t h;
    ok = ok && tsl_tensor_tile_handle(t, 0, &h) == TSL_OK && h != NULL;
    tsl_tensor_destroy(t);
    tsl_context_destroy(ctx);
    printf("consumer: tessel %s found, sum %g: %s\n", TSL_VERSION_STRING, sum, ok ? "ok" : "WRONG");
    return ok ? 0 : 1;
}
