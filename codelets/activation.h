/* Activation family (codelets/activation.c, CUDA in activation.cu): ReLU, LeakyReLU, sigmoid, tanh
 * forward and backward over one tile. Kernels are pure functions so tests check them against
 * references directly. */
#ifndef TESSEL_CODELETS_ACTIVATION_H
#define TESSEL_CODELETS_ACTIVATION_H

#include <starpu.h>
#include <stdint.h>

#include "tessel/ops.h"
#include "tessel/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

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

#ifdef TESSEL_USE_CUDA
/* The codelets' CUDA functions (activation.cu): the same arguments and buffers as the CPU
 * functions, launched on the worker's stream. */
void tsl_act_forward_cuda(void *buffers[], void *cl_arg);
void tsl_act_backward_cuda(void *buffers[], void *cl_arg);
#endif

extern struct starpu_codelet tsl_cl_act_forward;  /* R x, W y | RW x */
extern struct starpu_codelet tsl_cl_act_backward; /* R in, R dy, W dx | R in, RW dy */

#ifdef __cplusplus
}
#endif

#endif /* TESSEL_CODELETS_ACTIVATION_H */
