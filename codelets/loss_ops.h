/* Loss kernels and codelet (codelets/loss.c). */
#ifndef TESSEL_CODELETS_LOSS_OPS_H
#define TESSEL_CODELETS_LOSS_OPS_H

#include <starpu.h>
#include <stdint.h>

#include "tile_ops.h"

typedef enum tsl_loss_kind {
    TSL_LOSS_CROSS_ENTROPY = 0,
    TSL_LOSS_MSE = 1,
} tsl_loss_kind;

typedef struct tsl_loss_args {
    int32_t kind;
    int32_t dtype;       /* of x, target (MSE) and gradient: f32 or f64 */
    int32_t label_dtype; /* cross-entropy labels: i32, i64 or u8 */
    int64_t samples;     /* samples in the tile */
    int64_t classes;     /* C (cross-entropy); MSE: elements per sample / inner */
    int64_t inner;       /* positions per sample and class (product of spatial extents) */
    double scale;        /* gradient factor: 1 / positions of the whole tensor */
} tsl_loss_args;

/* Add the tile's per-position losses to `acc` exactly; write the gradient if grad != NULL.
 * Labels outside [0, C) count in acc->flagged, add no loss and get a zero gradient. */
void tsl_loss_tile(const tsl_loss_args *args, const void *x, const void *target, void *grad,
                   tsl_acc *acc);

extern struct starpu_codelet tsl_cl_loss;

#endif /* TESSEL_CODELETS_LOSS_OPS_H */
