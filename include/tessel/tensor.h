/**
 * @file tensor.h
 * @brief Tiled tensors: a logical N x C x (D x H x W) array cut into a grid of tiles,
 *        each tile one StarPU-MPI data handle owned by one rank.
 *
 * Dimensions are ordered N, C, then up to three spatial dimensions (D, H, W), in C
 * (row-major) order; a tensor has 1 to ::TSL_MAX_DIMS dimensions (labels may be 1-D).
 * A tile grid gives the number of splits per dimension; when a size does not divide,
 * the first (size % splits) tiles are one element larger. A rank allocates memory only
 * for the tiles it owns.
 *
 * Every call that takes a tensor is collective over the tensor's context (all ranks,
 * same order, same arguments) unless its comment says "Not collective". Operations
 * submit tile tasks and return without waiting, except where they hand a value or an
 * array back to the caller.
 */
#ifndef TESSEL_TENSOR_H
#define TESSEL_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#include "tessel/context.h"
#include "tessel/export.h"
#include "tessel/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Most dimensions a tensor has: N, C, D, H, W. */
#define TSL_MAX_DIMS 5

/** Element types. */
typedef enum tsl_dtype {
    TSL_F32 = 0,
    TSL_F64 = 1,
    TSL_I32 = 2,
    TSL_I64 = 3,
    TSL_U8 = 4,
} tsl_dtype;

/** Number of element types. */
#define TSL_DTYPE_COUNT 5

/** Logical shape: ndim in [1, TSL_MAX_DIMS], dims[0..ndim-1] > 0, the rest ignored. */
typedef struct tsl_shape {
    int32_t ndim;
    int64_t dims[TSL_MAX_DIMS];
} tsl_shape;

/** Tile grid: splits[d] tiles along dimension d, 1 <= splits[d] <= dims[d]. */
typedef struct tsl_tile_grid {
    int32_t splits[TSL_MAX_DIMS];
} tsl_tile_grid;

/**
 * @brief Owner callback: the rank that owns the tile at coordinates @p tile.
 * @param[in] tile   tile coordinates, tile[d] in [0, grid->splits[d])
 * @param[in] ndim   number of dimensions of the tensor
 * @param[in] grid   the tensor's tile grid
 * @param[in] nranks number of ranks of the context
 * @param[in] user   the pointer given with the callback
 * @return a rank in [0, nranks); anything else makes tensor creation fail
 */
typedef int32_t (*tsl_rank_of_fn)(const int32_t tile[TSL_MAX_DIMS], int32_t ndim,
                                  const tsl_tile_grid *grid, int32_t nranks, void *user);

/** Kinds of owner maps. */
typedef enum tsl_owner_kind {
    TSL_OWNER_BLOCK = 0,        /**< contiguous blocks of tiles over a process grid */
    TSL_OWNER_BLOCK_CYCLIC = 1, /**< blocks of tiles dealt cyclically over a process grid */
    TSL_OWNER_SINGLE = 2,       /**< every tile on one rank */
    TSL_OWNER_CALLBACK = 3,     /**< a user function decides */
} tsl_owner_kind;

/**
 * Owner map: which rank owns each tile. Build one with tsl_owner_block(),
 * tsl_owner_block_cyclic(), tsl_owner_single() or tsl_owner_callback().
 */
typedef struct tsl_owner_map {
    tsl_owner_kind kind;
    /** BLOCK and BLOCK_CYCLIC: ranks along each dimension (all 0: see tsl_owner_block()). */
    int32_t process_grid[TSL_MAX_DIMS];
    /** BLOCK_CYCLIC: tiles per block along each dimension. */
    int32_t block[TSL_MAX_DIMS];
    /** SINGLE: the owning rank. */
    int32_t rank;
    /** CALLBACK: the function and its pointer. */
    tsl_rank_of_fn rank_of;
    void *user;
    /** Rank group (tsl_owner_on_ranks()): with group_size > 0 the map deals tiles as if the
     *  context had group_size ranks and adds first_rank; 0: all ranks of the context. */
    int32_t first_rank;
    int32_t group_size;
} tsl_owner_map;

/**
 * @brief Block owner map.
 *
 * With a process grid P (P[d] ranks along dimension d, product <= ranks), tile t goes to
 * the rank whose grid coordinates are t[d] * P[d] / splits[d], numbered row-major: each
 * rank owns one contiguous box of tiles (the spatial decomposition). With
 * @p process_grid NULL, tiles taken in row-major order are cut into nranks contiguous runs.
 * @param[in] process_grid TSL_MAX_DIMS entries (unused dimensions 1), or NULL
 */
TSL_API tsl_owner_map tsl_owner_block(const int32_t *process_grid);

/**
 * @brief Block-cyclic owner map: along dimension d, blocks of block[d] tiles are dealt to
 * process-grid coordinates 0, 1, ..., P[d]-1, 0, 1, ... (ScaLAPACK style).
 * @param[in] process_grid TSL_MAX_DIMS entries, product <= ranks
 * @param[in] block        TSL_MAX_DIMS entries >= 1
 */
TSL_API tsl_owner_map tsl_owner_block_cyclic(const int32_t *process_grid, const int32_t *block);

/** @brief Every tile on @p rank. */
TSL_API tsl_owner_map tsl_owner_single(int32_t rank);

/** @brief A user function decides; it must return the same rank on every process. */
TSL_API tsl_owner_map tsl_owner_callback(tsl_rank_of_fn rank_of, void *user);

/**
 * @brief @p map over the ranks first, ..., first + count - 1 only: tiles are dealt as if the
 * context had @p count ranks, and rank k of the map is rank first + k of the context (a
 * single owner's rank too). What a pipeline stage or a rank group of a larger run uses. A group
 * that does not fit in the context makes tensor creation fail.
 */
TSL_API tsl_owner_map tsl_owner_on_ranks(tsl_owner_map map, int32_t first, int32_t count);

/** @brief The rank that @p map gives tile @p tile, or a negative status if the map or the
 *  tile is invalid. Pure: needs no context. */
TSL_API tsl_status tsl_owner_map_rank(const tsl_owner_map *map, const int32_t tile[TSL_MAX_DIMS],
                                      int32_t ndim, const tsl_tile_grid *grid, int32_t nranks,
                                      int32_t *rank);

/** @brief Bytes of one element of @p dtype (0 for an invalid dtype). */
TSL_API size_t tsl_dtype_size(tsl_dtype dtype);

/** @brief Name of @p dtype ("f32", ...), or "invalid". */
TSL_API const char *tsl_dtype_name(tsl_dtype dtype);

/** @brief Build a shape from @p ndim sizes. */
TSL_API tsl_status tsl_shape_make(tsl_shape *shape, int32_t ndim, const int64_t *dims);

/** @brief Check a shape: ndim in range, sizes positive, element count fits in int64. */
TSL_API tsl_status tsl_shape_check(const tsl_shape *shape);

/** @brief Number of elements of a valid shape; 0 for NULL or an invalid shape. */
TSL_API int64_t tsl_shape_numel(const tsl_shape *shape);

/** @brief Check that @p grid fits @p shape (1 <= splits[d] <= dims[d]). */
TSL_API tsl_status tsl_tile_grid_check(const tsl_tile_grid *grid, const tsl_shape *shape);

/** @brief A grid with one tile (every split 1). */
TSL_API tsl_tile_grid tsl_tile_grid_single(void);

/** @brief Number of tiles of a valid grid over @p ndim dimensions; 0 for NULL, ndim out of
 *  range or a split below 1. */
TSL_API int64_t tsl_tile_grid_count(const tsl_tile_grid *grid, int32_t ndim);

/**
 * @brief Start and size of tile @p index along a dimension of @p size cut in @p splits
 * (balanced: the first size % splits tiles are one element larger).
 * @return ::TSL_ERR_INVALID_ARG unless 1 <= splits <= size, 0 <= index < splits and both
 *         outputs are non-NULL
 */
TSL_API tsl_status tsl_tile_extent(int64_t size, int32_t splits, int32_t index, int64_t *start,
                                   int64_t *extent);

/** Opaque tiled tensor. */
typedef struct tsl_tensor *tsl_tensor_t;

/**
 * Storage order of the elements inside each tile. The logical order (shapes, tile boxes,
 * scatter/gather buffers, fills, `.npy` files) is always N C D H W; the layout only decides
 * how a tile keeps its box in memory, so the same tensor has the same values in every layout.
 */
typedef enum tsl_layout {
    TSL_LAYOUT_PLAIN = 0,         /**< N C D H W: C (row-major) order of the tile's box */
    TSL_LAYOUT_CHANNELS_LAST = 1, /**< N D H W C: channels innermost (3 to 5 dimensions) */
} tsl_layout;

/** @brief Name of @p layout ("plain", "channels_last"), or "invalid". */
TSL_API const char *tsl_layout_name(tsl_layout layout);

/**
 * @brief Create a tiled tensor; owned tiles are allocated and set to zero.
 * @param[out] tensor the new tensor (tsl_tensor_destroy())
 * @param[in]  ctx    context
 * @param[in]  dtype  element type
 * @param[in]  shape  logical shape
 * @param[in]  grid   tile grid, or NULL for one tile
 * @param[in]  owners owner map, or NULL for tsl_owner_block(NULL)
 */
TSL_API tsl_status tsl_tensor_create(tsl_tensor_t *tensor, tsl_context_t ctx, tsl_dtype dtype,
                                     const tsl_shape *shape, const tsl_tile_grid *grid,
                                     const tsl_owner_map *owners);

/**
 * @brief tsl_tensor_create() with tiles stored in @p layout. Channels-last tiles are what
 * the CPU convolution kernels run fastest on (`bench/RESULTS.md`); they need 3 to 5
 * dimensions. Convert between layouts with tsl_tensor_redistribute().
 */
TSL_API tsl_status tsl_tensor_create_layout(tsl_tensor_t *tensor, tsl_context_t ctx,
                                            tsl_dtype dtype, const tsl_shape *shape,
                                            const tsl_tile_grid *grid, const tsl_owner_map *owners,
                                            tsl_layout layout);

/** @brief Wait for the tensor's pending tasks, release its tiles and free it.
 *  NULL is a no-op. */
TSL_API tsl_status tsl_tensor_destroy(tsl_tensor_t tensor);

/** @brief Global shape of the tensor. Not collective. */
TSL_API tsl_status tsl_tensor_shape(tsl_tensor_t tensor, tsl_shape *shape);
/** @brief Element type of the tensor. Not collective. */
TSL_API tsl_status tsl_tensor_dtype(tsl_tensor_t tensor, tsl_dtype *dtype);
/** @brief Tile grid of the tensor. Not collective. */
TSL_API tsl_status tsl_tensor_grid(tsl_tensor_t tensor, tsl_tile_grid *grid);
/** @brief Context the tensor belongs to (not a new reference). Not collective. */
TSL_API tsl_status tsl_tensor_context(tsl_tensor_t tensor, tsl_context_t *ctx);
/** @brief Storage layout of the tiles. Not collective. */
TSL_API tsl_status tsl_tensor_layout(tsl_tensor_t tensor, tsl_layout *layout);

/** @brief Number of tiles. Not collective. */
TSL_API tsl_status tsl_tensor_tile_count(tsl_tensor_t tensor, int64_t *count);

/** @brief Coordinates, owner, start and extent of tile @p index (row-major tile number).
 *  Any output may be NULL. Not collective. */
TSL_API tsl_status tsl_tensor_tile_info(tsl_tensor_t tensor, int64_t index,
                                        int32_t coords[TSL_MAX_DIMS], int32_t *owner,
                                        int64_t start[TSL_MAX_DIMS], int64_t extent[TSL_MAX_DIMS]);

/** @brief Bytes allocated on this rank for the tiles it owns. Not collective. */
TSL_API tsl_status tsl_tensor_owned_bytes(tsl_tensor_t tensor, int64_t *bytes);

/** @brief Number of tiles this rank owns and, of all tiles, how many have memory
 *  allocated on this rank right now (owned ones and cached remote copies).
 *  Not collective. */
TSL_API tsl_status tsl_tensor_local_tiles(tsl_tensor_t tensor, int64_t *owned, int64_t *allocated);

/**
 * @brief Scatter a full C-order array held by @p root into the tiles.
 * @param[in] src array of numel elements of the tensor's dtype; read on @p root only
 *                (may be NULL elsewhere). May be reused as soon as the call returns.
 */
TSL_API tsl_status tsl_tensor_scatter(tsl_tensor_t tensor, int32_t root, const void *src);

/**
 * @brief Gather every tile into a full C-order array on @p root. Returns when @p dst on
 * root is complete; other ranks return once their part is submitted.
 * @param[out] dst numel elements on @p root (may be NULL elsewhere)
 */
TSL_API tsl_status tsl_tensor_gather(tsl_tensor_t tensor, int32_t root, void *dst);

/**
 * @brief dst = the sum of src over its first dimension: @p src is (P, dst's shape...) with one
 * tile per row (say one partial result per rank), @p dst is cut along its first dimension
 * only (f32 or f64, plain tiles). Reduce-scatter by placement: each row's piece for a dst
 * tile is cut where the row lives and the pieces are added by a tree of tasks rooted at that
 * tile's owner, so each rank sends and receives only the pieces it must; no rank holds the
 * whole sum unless it owns every tile. The summation order is fixed by the tile owners.
 */
TSL_API tsl_status tsl_tensor_sum_rows(tsl_tensor_t dst, tsl_tensor_t src);

/**
 * @brief tsl_tensor_sum_rows() for @p count pairs (dst[i], src[i]) at once, packing small
 * ones: the one-tile destinations of each owner are reduced together, each rank adding its
 * rows of all of them into one buffer, so that a rank sends one message per owner instead of
 * one per tensor (the buffers meet by a tree rooted at the owner, which cuts the sum into the
 * destinations). Destinations cut into several tiles are reduced as tsl_tensor_sum_rows()
 * does. Every pair is checked before anything is submitted; a destination may appear once.
 */
TSL_API tsl_status tsl_tensors_sum_rows(int32_t count, tsl_tensor_t *dst, tsl_tensor_t *src);

/** @brief Set every element to @p value (converted to the dtype). */
TSL_API tsl_status tsl_tensor_fill_constant(tsl_tensor_t tensor, double value);

/**
 * @brief Fill with uniform values in [@p low, @p high) from a counter-based generator:
 * element i (global C-order index) depends only on @p seed and i, so the result is the
 * same for every tile grid and owner map. Integer dtypes get floor of the value.
 */
TSL_API tsl_status tsl_tensor_fill_uniform(tsl_tensor_t tensor, uint64_t seed, double low,
                                           double high);

/** @brief Fill with normal values (mean, stddev), counter-based like the uniform fill. */
TSL_API tsl_status tsl_tensor_fill_normal(tsl_tensor_t tensor, uint64_t seed, double mean,
                                          double stddev);

/**
 * @brief Copy @p src into @p dst, two tensors of the same shape and dtype whose tile
 * grids, owner maps and layouts may differ (so this also converts between layouts). Each (source
 * tile, destination tile) overlap becomes one task on the destination's owner; StarPU-MPI moves
 * only the source tiles.
 */
TSL_API tsl_status tsl_tensor_redistribute(tsl_tensor_t dst, tsl_tensor_t src);

/**
 * @brief tsl_tensor_redistribute() for @p count pairs (dst[i], src[i]) at once, packing small
 * ones: where both tensors of a pair are one tile of one layout on different ranks, the
 * sources one rank owns are copied into one buffer there, and every destination rank
 * receives that buffer once and cuts its tensors out of it (one message per source rank
 * instead of one per tensor: what refreshing many small replicated parameters needs). Other
 * pairs are copied as tsl_tensor_redistribute() copies them. Every pair is checked before
 * anything is submitted.
 */
TSL_API tsl_status tsl_tensors_redistribute(int32_t count, tsl_tensor_t *dst, tsl_tensor_t *src);

/** @brief x = alpha * x (f32, f64). */
TSL_API tsl_status tsl_tensor_scale(tsl_tensor_t x, double alpha);

/** @brief y = y + alpha * x. Same shape, dtype (f32, f64) and tile grid; owners may differ. */
TSL_API tsl_status tsl_tensor_axpy(tsl_tensor_t y, double alpha, tsl_tensor_t x);

/** @brief dst = a + b. Same shape, dtype (f32, f64) and tile grid; owners may differ. */
TSL_API tsl_status tsl_tensor_add(tsl_tensor_t dst, tsl_tensor_t a, tsl_tensor_t b);

/** @brief dst = a * b elementwise (dst may be a or b). Same shape, dtype (f32, f64) and tile
 *  grid; owners may differ. */
TSL_API tsl_status tsl_tensor_mul(tsl_tensor_t dst, tsl_tensor_t a, tsl_tensor_t b);

/**
 * @brief Sum of all elements, on every rank. Each tile is summed into an exact
 * fixed-point accumulator and the accumulators are combined by a tree of tasks, so the
 * result is the exact sum rounded once to double: identical, bit for bit, for every tile
 * grid, owner map and rank count. f32, f64, i32 and u8. Waits for the result.
 */
TSL_API tsl_status tsl_tensor_sum(tsl_tensor_t tensor, double *sum);

/** @brief Wait until every task submitted so far that writes a tile this rank owns has
 *  completed. Not collective. */
TSL_API tsl_status tsl_tensor_wait(tsl_tensor_t tensor);

/**
 * @brief Show placement: one task per tile of the i32 tensor @p where writes
 * rank * 1000 + StarPU worker id of the worker that ran it into every element of its
 * tile. Gathering the tensor then tells which rank and worker handled each tile.
 */
TSL_API tsl_status tsl_tensor_mark_placement(tsl_tensor_t where);

#ifdef __cplusplus
}
#endif

#endif /* TESSEL_TENSOR_H */
