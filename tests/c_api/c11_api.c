/* The whole public API compiles as strict C11 (this file is built with -std=c11
 * -pedantic-errors -Werror) and its pure parts work from C. */
#include <stdio.h>
#include <string.h>

#include "tessel/tessel.h"

int main(void)
{
    tsl_context_config cfg;
    if (tsl_context_config_init(&cfg) != TSL_OK || cfg.ncpu != -1)
        return 1;
    int64_t dims[3] = {2, 3, 4};
    tsl_shape shape;
    if (tsl_shape_make(&shape, 3, dims) != TSL_OK || tsl_shape_numel(&shape) != 24)
        return 1;
    tsl_tile_grid grid = tsl_tile_grid_single();
    grid.splits[2] = 4;
    if (tsl_tile_grid_check(&grid, &shape) != TSL_OK || tsl_tile_grid_count(&grid, 3) != 4)
        return 1;
    tsl_owner_map map = tsl_owner_block(NULL);
    int32_t tile[TSL_MAX_DIMS] = {0, 0, 3, 0, 0}, rank = -1;
    if (tsl_owner_map_rank(&map, tile, 3, &grid, 2, &rank) != TSL_OK || rank != 1)
        return 1;
    if (tsl_context_destroy(NULL) != TSL_OK || tsl_tensor_destroy(NULL) != TSL_OK)
        return 1;
    if (tsl_tensor_scale(NULL, 1.0) != TSL_ERR_INVALID_ARG || strlen(tsl_last_error()) == 0)
        return 1;
    printf("tessel %s C API OK: %s\n", TSL_VERSION_STRING, tsl_status_string(TSL_OK));
    return 0;
}
