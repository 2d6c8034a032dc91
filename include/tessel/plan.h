/**
 * @file plan.h
 * @brief Parallel plans: how a model's tensors are tiled and which ranks own the tiles.
 *
 * A plan string is `data=D,space=AxBxC,stages=S,micro=M,tiles=T`; every part is optional and
 * defaults to 1: D sample groups (data parallelism), an A x B x C (or A x B, or A) rank grid
 * over the spatial dimensions (spatial parallelism, halo exchange), S pipeline stages with M
 * micro-batches (layer parallelism), and T extra tiles per rank along the longest spatial
 * dimension (over-decomposition, so every worker of a rank has a tile). A plan runs on
 * D x A x B x C x S ranks. Pure C: no StarPU, no MPI.
 */
#ifndef TESSEL_PLAN_H
#define TESSEL_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "tessel/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/** A parsed plan. */
typedef struct tsl_plan {
    int32_t data;       /**< D: sample groups */
    int32_t space_ndim; /**< how many entries space= gave (0: none) */
    int32_t space[3];   /**< spatial rank grid; 1 past space_ndim */
    int32_t stages;     /**< S: pipeline stages */
    int32_t micro;      /**< M: micro-batches */
    int32_t tiles;      /**< T: tiles per rank along the longest spatial dimension */
} tsl_plan;

/** @brief The plan of one rank group with nothing split: every part 1. */
tsl_status tsl_plan_init(tsl_plan *plan);

/**
 * @brief Parse a plan string (see the file comment; "" is the default plan). An unknown or
 * repeated part, a value that is not an integer in [1, 2^20], or a space= grid of more than
 * three entries is a TSL_ERR_INVALID_ARG error naming it; @p plan is then unchanged.
 */
tsl_status tsl_plan_parse(const char *text, tsl_plan *plan);

/** @brief The ranks a plan runs on: D x A x B x C x S (0 for a NULL plan). */
int64_t tsl_plan_ranks(const tsl_plan *plan);

/** @brief Write the plan in its string form, parts that are not 1 only ("data=1" when all
 *  are); TSL_ERR_INVALID_ARG when it does not fit in @p size bytes. */
tsl_status tsl_plan_format(const tsl_plan *plan, char *text, size_t size);

#ifdef __cplusplus
}
#endif

#endif /* TESSEL_PLAN_H */
