/* Activation and optimizer kernels and codelets. Kernels are pure functions over one tile
 * so tests can check them against references directly. */
#ifndef TESSEL_CODELETS_NN_OPS_H
#define TESSEL_CODELETS_NN_OPS_H

#include <starpu.h>
#include <stdint.h>

#include "tessel/ops.h"
#include "tessel/tensor.h"

/* ---- activations ---- */

typedef struct tsl_act_args {
    int32_t kind;  /* tsl_activation */
    int32_t dtype; /* TSL_F32 or TSL_F64 */
    int64_t count;
    double slope;
    int32_t in_place; /* forward: one RW buffer; backward: dy and dx are one RW buffer */
} tsl_act_args;

/* y = act(x); y may equal x. */
void tsl_act_forward(const tsl_act_args *args, const void *x, void *y);
/* dx = act'(in) * dy, `in` being x (ReLU, LeakyReLU) or y (sigmoid, tanh); dx may equal dy. */
void tsl_act_backward(const tsl_act_args *args, const void *in, const void *dy, void *dx);

extern struct starpu_codelet tsl_cl_act_forward;  /* R x, W y | RW x */
extern struct starpu_codelet tsl_cl_act_backward; /* R in, R dy, W dx | R in, RW dy */

/* ---- optimizer updates ---- */

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

#endif /* TESSEL_CODELETS_NN_OPS_H */
