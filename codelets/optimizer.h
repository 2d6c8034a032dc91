/* Optimizer family (codelets/optimizer.c): SGD and Adam / AdamW updates of one parameter
 * tile, as PyTorch's single-tensor paths. */
#ifndef TESSEL_CODELETS_OPTIMIZER_H
#define TESSEL_CODELETS_OPTIMIZER_H

#include <starpu.h>
#include <stdint.h>

#include "tessel/ops.h"
#include "tessel/tensor.h"

typedef enum tsl_optimizer_kind {
    TSL_OPT_SGD = 0,
    TSL_OPT_ADAM = 1,
} tsl_optimizer_kind;

typedef struct tsl_update_args {
    int32_t kind; /* tsl_optimizer_kind */
    int32_t dtype;
    int64_t count;
    int64_t step; /* 1 on the parameter's first update */
    tsl_sgd_config sgd;
    tsl_adam_config adam;
} tsl_update_args;

/* One update of a parameter tile. SGD: state0 is the momentum buffer (NULL without
 * momentum). Adam: state0 and state1 are the first and second moments. */
void tsl_update(const tsl_update_args *args, void *param, const void *grad, void *state0,
                void *state1);

/* RW param, R grad, RW state... (2 to 4 buffers) */
extern struct starpu_codelet tsl_cl_update;

#endif /* TESSEL_CODELETS_OPTIMIZER_H */
