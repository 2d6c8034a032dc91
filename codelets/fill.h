/* Fill family (codelets/fill.c, CUDA in fill.cu): constant, and seeded uniform / normal fills that
 * depend on (seed, element index) only, whatever the tile grid; zeroed tiles. */
#ifndef TESSEL_CODELETS_FILL_H
#define TESSEL_CODELETS_FILL_H

#include <starpu.h>
#include <stdint.h>

#include "tessel/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum tsl_fill_mode {
    TSL_FILL_CONSTANT = 0,
    TSL_FILL_UNIFORM = 1,
    TSL_FILL_NORMAL = 2,
} tsl_fill_mode;

typedef struct tsl_fill_args {
    int32_t dtype;
    int32_t mode;
    int32_t ndim;
    uint64_t seed;
    double a;                             /* constant value, uniform low, normal mean */
    double b;                             /* uniform high, normal stddev */
    int32_t layout;                       /* tsl_layout of the tile's storage */
    int64_t global_strides[TSL_MAX_DIMS]; /* C-order strides of the whole tensor */
    int64_t start[TSL_MAX_DIMS];          /* tile start in the whole tensor */
    int64_t extent[TSL_MAX_DIMS];         /* tile size */
} tsl_fill_args;

/* Value of element `index` of a seeded fill: depends on (seed, index) only. Pure. */
double tsl_fill_value(const tsl_fill_args *args, uint64_t index);

/* Fill a tile buffer. Pure. */
void tsl_fill_tile(const tsl_fill_args *args, void *tile);

/* W tile. */
extern struct starpu_codelet tsl_cl_fill;
extern struct starpu_codelet tsl_cl_zero; /* (W tile): all bytes 0 */

#ifdef TESSEL_USE_CUDA
/* tsl_cl_fill's CUDA function (fill.cu): constant and uniform fills, the CPU's bits. */
void tsl_fill_cuda(void *buffers[], void *cl_arg);
/* tsl_cl_zero's CUDA function (fill.cu). */
void tsl_zero_cuda(void *buffers[], void *cl_arg);
#endif

#ifdef __cplusplus
}
#endif

#endif /* TESSEL_CODELETS_FILL_H */
