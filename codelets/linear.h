/* Fully connected layer kernels (OpenBLAS GEMM) and codelets (codelets/linear.c). */
#ifndef TESSEL_CODELETS_LINEAR_H
#define TESSEL_CODELETS_LINEAR_H

#include <starpu.h>
#include <stdint.h>

typedef struct tsl_linear_args {
    int32_t dtype;    /* TSL_F32 or TSL_F64 */
    int32_t has_bias; /* forward: bias buffer present; backward weights: db buffer present */
    int64_t rows;     /* samples in the tile */
    int64_t in;       /* K: input features */
    int64_t out;      /* O: output features */
} tsl_linear_args;

/* y (rows x O) = x (rows x K) * w^T (w is O x K) + b. */
void tsl_linear_forward_kernel(const tsl_linear_args *a, const void *x, const void *w,
                               const void *b, void *y);
/* dx (rows x K) = dy (rows x O) * w. */
void tsl_linear_backward_data_kernel(const tsl_linear_args *a, const void *dy, const void *w,
                                     void *dx);
/* dw (O x K) = dy^T * x; db (O) = column sums of dy (when db != NULL). Overwrites. */
void tsl_linear_backward_weights_kernel(const tsl_linear_args *a, const void *x, const void *dy,
                                        void *dw, void *db);

extern struct starpu_codelet tsl_cl_linear_forward;          /* R x, R w, [R b], W y */
extern struct starpu_codelet tsl_cl_linear_backward_data;    /* R dy, R w, W dx */
extern struct starpu_codelet tsl_cl_linear_backward_weights; /* R x, R dy, W dw, [W db] */

#endif /* TESSEL_CODELETS_LINEAR_H */
