/* Optimizer family (codelets/optimizer.c, CUDA in optimizer.cu): SGD and Adam / AdamW updates of
 * one parameter tile, as PyTorch's single-tensor paths. */
#ifndef TESSEL_CODELETS_OPTIMIZER_H
#define TESSEL_CODELETS_OPTIMIZER_H

#include <starpu.h>
#include <stdint.h>

#include "tessel/ops.h"
#include "tessel/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

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

/* Aborts unless the arguments make a valid update with these state tiles. */
void tsl_update_check(const tsl_update_args *args, const void *state0, const void *state1);

/* An update task's arguments and its 2 to 4 buffers (param, grad, states; NULL past the
 * last), checked against the tile size. */
void tsl_update_task(void *buffers[], void *cl_arg, tsl_update_args *args, void *ptr[4]);

/* Adam's per-tile factors for args->step: step_size = lr / (1 - beta1^step) and
 * bias2_sqrt = sqrt(1 - beta2^step) (the CPU and CUDA functions compute them alike). */
void tsl_adam_bias(const tsl_update_args *args, double *step_size, double *bias2_sqrt);

/* RW param, R grad, RW state... (2 to 4 buffers) */
extern struct starpu_codelet tsl_cl_update;

#ifdef TESSEL_USE_CUDA
/* tsl_cl_update's CUDA function (optimizer.cu): the same arguments and buffers as the CPU
 * function, launched on the worker's stream; the CPU's bits. */
void tsl_update_cuda(void *buffers[], void *cl_arg);
#endif

#ifdef __cplusplus
}
#endif

#endif /* TESSEL_CODELETS_OPTIMIZER_H */
