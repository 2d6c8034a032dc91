/* Elementwise family (codelets/elementwise.c, CUDA in elementwise.cu): scale, axpy, add,
 * multiply, and placement marks. */
#ifndef TESSEL_CODELETS_ELEMENTWISE_H
#define TESSEL_CODELETS_ELEMENTWISE_H

#include <starpu.h>
#include <stdint.h>

#include "tessel/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tsl_elementwise_args {
    int32_t dtype; /* TSL_F32 or TSL_F64 */
    int64_t count;
    double alpha;
} tsl_elementwise_args;

extern struct starpu_codelet tsl_cl_scale; /* RW x:      x = alpha x */
extern struct starpu_codelet tsl_cl_axpy;  /* R x, RW y: y += alpha x */
extern struct starpu_codelet tsl_cl_add;   /* R a, R b, W|RW dst: dst = alpha a + b */
extern struct starpu_codelet tsl_cl_mul;   /* R a, R b, W|RW dst: dst = a b */
/* R x, R u (f32 uniform draws), W|RW dst (f32): dst = tsl_dropout_f32(x, u, alpha) */
extern struct starpu_codelet tsl_cl_dropout;

/* ---- placement marks ---- */

typedef struct tsl_mark_args {
    int32_t rank; /* rank the task was placed on */
    int64_t count;
} tsl_mark_args;

/* W tile (i32): every element = rank * 1000 + worker id. */
extern struct starpu_codelet tsl_cl_mark;

#ifdef TESSEL_USE_CUDA
/* The codelets' CUDA functions (elementwise.cu): the same arguments and buffers as the CPU
 * functions, launched on the worker's stream. */
void tsl_scale_cuda(void *buffers[], void *cl_arg);
void tsl_axpy_cuda(void *buffers[], void *cl_arg);
void tsl_add_cuda(void *buffers[], void *cl_arg);
void tsl_mul_cuda(void *buffers[], void *cl_arg);
void tsl_dropout_cuda(void *buffers[], void *cl_arg);
void tsl_mark_cuda(void *buffers[], void *cl_arg);
#endif

#ifdef __cplusplus
}
#endif

#endif /* TESSEL_CODELETS_ELEMENTWISE_H */
