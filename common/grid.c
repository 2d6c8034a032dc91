/* Shapes, tile grids and owner maps: pure C, no StarPU or MPI. */
#include <stdint.h>
#include <string.h>

#include "error.h"
#include "tessel/tensor.h"

size_t tsl_dtype_size(tsl_dtype dtype)
{
    switch (dtype) {
    case TSL_F32:
    case TSL_I32:
        return 4;
    case TSL_F64:
    case TSL_I64:
        return 8;
    case TSL_U8:
        return 1;
    }
    return 0;
}

const char *tsl_dtype_name(tsl_dtype dtype)
{
    switch (dtype) {
    case TSL_F32:
        return "f32";
    case TSL_F64:
        return "f64";
    case TSL_I32:
        return "i32";
    case TSL_I64:
        return "i64";
    case TSL_U8:
        return "u8";
    }
    return "invalid";
}

tsl_status tsl_shape_check(const tsl_shape *shape)
{
    if (!shape)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "shape is NULL");
    if (shape->ndim < 1 || shape->ndim > TSL_MAX_DIMS)
        return tsl_error(NULL, TSL_ERR_SHAPE, "shape has %d dimensions (want 1 to %d)",
                         (int)shape->ndim, TSL_MAX_DIMS);
    int64_t numel = 1;
    for (int d = 0; d < shape->ndim; d++) {
        if (shape->dims[d] <= 0)
            return tsl_error(NULL, TSL_ERR_SHAPE, "shape dimension %d has size %lld (want > 0)", d,
                             (long long)shape->dims[d]);
        if (numel > INT64_MAX / shape->dims[d])
            return tsl_error(NULL, TSL_ERR_SHAPE, "shape has more than 2^63 elements");
        numel *= shape->dims[d];
    }
    return TSL_OK;
}

tsl_status tsl_shape_make(tsl_shape *shape, int32_t ndim, const int64_t *dims)
{
    if (!shape || !dims)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "tsl_shape_make: NULL argument");
    if (ndim < 1 || ndim > TSL_MAX_DIMS)
        return tsl_error(NULL, TSL_ERR_SHAPE, "tsl_shape_make: %d dimensions (want 1 to %d)",
                         (int)ndim, TSL_MAX_DIMS);
    tsl_shape made;
    memset(&made, 0, sizeof made);
    made.ndim = ndim;
    for (int d = 0; d < TSL_MAX_DIMS; d++)
        made.dims[d] = d < ndim ? dims[d] : 1;
    tsl_status st = tsl_shape_check(&made);
    if (st)
        return st;
    *shape = made;
    return TSL_OK;
}

int64_t tsl_shape_numel(const tsl_shape *shape)
{
    if (!shape || shape->ndim < 1 || shape->ndim > TSL_MAX_DIMS)
        return 0;
    int64_t numel = 1;
    for (int d = 0; d < shape->ndim; d++)
        numel *= shape->dims[d];
    return numel;
}

tsl_tile_grid tsl_tile_grid_single(void)
{
    tsl_tile_grid grid;
    for (int d = 0; d < TSL_MAX_DIMS; d++)
        grid.splits[d] = 1;
    return grid;
}

tsl_status tsl_tile_grid_check(const tsl_tile_grid *grid, const tsl_shape *shape)
{
    tsl_status st = tsl_shape_check(shape);
    if (st)
        return st;
    if (!grid)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "tile grid is NULL");
    for (int d = 0; d < shape->ndim; d++) {
        if (grid->splits[d] < 1 || grid->splits[d] > shape->dims[d])
            return tsl_error(NULL, TSL_ERR_SHAPE,
                             "tile grid splits dimension %d of size %lld into %d tiles (want 1 "
                             "to %lld)",
                             d, (long long)shape->dims[d], (int)grid->splits[d],
                             (long long)shape->dims[d]);
    }
    int64_t count = 1;
    for (int d = 0; d < shape->ndim; d++) {
        if (count > INT32_MAX / grid->splits[d])
            return tsl_error(NULL, TSL_ERR_SHAPE, "tile grid has more than 2^31 tiles");
        count *= grid->splits[d];
    }
    return TSL_OK;
}

int64_t tsl_tile_grid_count(const tsl_tile_grid *grid, int32_t ndim)
{
    if (!grid || ndim < 1 || ndim > TSL_MAX_DIMS)
        return 0;
    int64_t count = 1;
    for (int d = 0; d < ndim; d++) {
        if (grid->splits[d] < 1)
            return 0;
        count *= grid->splits[d];
    }
    return count;
}

tsl_status tsl_tile_extent(int64_t size, int32_t splits, int32_t index, int64_t *start,
                           int64_t *extent)
{
    if (!start || !extent || splits < 1 || splits > size || index < 0 || index >= splits)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                         "tsl_tile_extent: tile %d of %d over a size of %lld", (int)index,
                         (int)splits, (long long)size);
    int64_t base = size / splits;
    int64_t rem = size % splits;
    *start = index * base + (index < rem ? index : rem);
    *extent = base + (index < rem ? 1 : 0);
    return TSL_OK;
}

tsl_owner_map tsl_owner_block(const int32_t *process_grid)
{
    tsl_owner_map map;
    memset(&map, 0, sizeof map);
    map.kind = TSL_OWNER_BLOCK;
    if (process_grid)
        memcpy(map.process_grid, process_grid, sizeof map.process_grid);
    return map;
}

tsl_owner_map tsl_owner_block_cyclic(const int32_t *process_grid, const int32_t *block)
{
    tsl_owner_map map;
    memset(&map, 0, sizeof map);
    map.kind = TSL_OWNER_BLOCK_CYCLIC;
    if (process_grid)
        memcpy(map.process_grid, process_grid, sizeof map.process_grid);
    if (block)
        memcpy(map.block, block, sizeof map.block);
    return map;
}

tsl_owner_map tsl_owner_single(int32_t rank)
{
    tsl_owner_map map;
    memset(&map, 0, sizeof map);
    map.kind = TSL_OWNER_SINGLE;
    map.rank = rank;
    return map;
}

tsl_owner_map tsl_owner_callback(tsl_rank_of_fn rank_of, void *user)
{
    tsl_owner_map map;
    memset(&map, 0, sizeof map);
    map.kind = TSL_OWNER_CALLBACK;
    map.rank_of = rank_of;
    map.user = user;
    return map;
}

tsl_owner_map tsl_owner_on_ranks(tsl_owner_map map, int32_t first, int32_t count)
{
    map.first_rank = first;
    map.group_size = count;
    return map;
}

static int process_grid_is_unset(const tsl_owner_map *map)
{
    for (int d = 0; d < TSL_MAX_DIMS; d++)
        if (map->process_grid[d] != 0)
            return 0;
    return 1;
}

/* Check the process grid of a BLOCK or BLOCK_CYCLIC map: every used entry >= 1, unused
 * entries 0 or 1, product <= nranks. */
static tsl_status check_process_grid(const tsl_owner_map *map, int32_t ndim, int32_t nranks)
{
    int64_t product = 1;
    for (int d = 0; d < TSL_MAX_DIMS; d++) {
        int32_t p = map->process_grid[d];
        if (d < ndim && p < 1)
            return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                             "owner map: process grid entry %d is %d (want >= 1)", d, (int)p);
        if (d >= ndim && p != 0 && p != 1)
            return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                             "owner map: process grid entry %d is %d but the tensor has %d "
                             "dimensions",
                             d, (int)p, (int)ndim);
        if (d < ndim)
            product *= p;
        if (product > nranks)
            return tsl_error(NULL, TSL_ERR_SHAPE,
                             "owner map: process grid needs more than the %d ranks there are",
                             (int)nranks);
    }
    return TSL_OK;
}

tsl_status tsl_owner_map_rank(const tsl_owner_map *map, const int32_t tile[TSL_MAX_DIMS],
                              int32_t ndim, const tsl_tile_grid *grid, int32_t nranks,
                              int32_t *rank)
{
    if (!map || !tile || !grid || !rank)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "tsl_owner_map_rank: NULL argument");
    if (ndim < 1 || ndim > TSL_MAX_DIMS || nranks < 1)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                         "tsl_owner_map_rank: ndim %d or nranks %d out of range", (int)ndim,
                         (int)nranks);
    for (int d = 0; d < ndim; d++)
        if (grid->splits[d] < 1 || tile[d] < 0 || tile[d] >= grid->splits[d])
            return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                             "tsl_owner_map_rank: tile coordinate %d is %d, grid has %d", d,
                             (int)tile[d], (int)grid->splits[d]);
    if (map->group_size != 0 || map->first_rank != 0) {
        if (map->group_size < 1 || map->first_rank < 0 ||
            (int64_t)map->first_rank + map->group_size > nranks)
            return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                             "owner map: rank group %d..%d does not fit in the %d ranks there are",
                             (int)map->first_rank, (int)(map->first_rank + map->group_size - 1),
                             (int)nranks);
        nranks = map->group_size;
    }
    int64_t result = -1;
    switch (map->kind) {
    case TSL_OWNER_BLOCK:
        if (process_grid_is_unset(map)) {
            int64_t linear = 0, count = 1;
            for (int d = 0; d < ndim; d++) {
                linear = linear * grid->splits[d] + tile[d];
                count *= grid->splits[d];
            }
            result = linear * nranks / count;
            break;
        }
        /* fall through */
    case TSL_OWNER_BLOCK_CYCLIC: {
        tsl_status st = check_process_grid(map, ndim, nranks);
        if (st)
            return st;
        int64_t linear = 0;
        for (int d = 0; d < ndim; d++) {
            int64_t p = map->process_grid[d], coord;
            if (map->kind == TSL_OWNER_BLOCK) {
                coord = (int64_t)tile[d] * p / grid->splits[d];
            } else {
                if (map->block[d] < 1)
                    return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                                     "owner map: block entry %d is %d (want >= 1)", d,
                                     (int)map->block[d]);
                coord = (tile[d] / map->block[d]) % p;
            }
            linear = linear * p + coord;
        }
        result = linear;
        break;
    }
    case TSL_OWNER_SINGLE:
        result = map->rank;
        break;
    case TSL_OWNER_CALLBACK:
        if (!map->rank_of)
            return tsl_error(NULL, TSL_ERR_INVALID_ARG, "owner map: callback is NULL");
        result = map->rank_of(tile, ndim, grid, nranks, map->user);
        break;
    default:
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "owner map: unknown kind %d", (int)map->kind);
    }
    if (result < 0 || result >= nranks)
        return tsl_error(NULL, TSL_ERR_SHAPE,
                         "owner map gives tile rank %lld, outside the %d ranks there are",
                         (long long)result, (int)nranks);
    *rank = (int32_t)result + map->first_rank;
    return TSL_OK;
}
