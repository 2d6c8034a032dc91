/* Fully connected layer kernels (OpenBLAS GEMM) and codelets (codelets/linear.c). */
#ifndef TESSEL_CODELETS_LINEAR_H
#define TESSEL_CODELETS_LINEAR_H

#include <starpu.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

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

/* The weight gradient of a block of output rows over several sample tiles: the tiles'
 * samples and the rows [row0, row0 + nrows) of the (out x in) gradient. */
#define TSL_LINEAR_MAX_TILES 12
typedef struct tsl_linear_rows_args {
    int32_t dtype;    /* TSL_F32 or TSL_F64 */
    int32_t ntiles;   /* sample tiles read, 1 to TSL_LINEAR_MAX_TILES */
    int32_t has_bias; /* a db buffer (all O columns) follows the dw block */
    int32_t unused;   /* no padding bytes */
    int64_t in, out;  /* K and O of the layer */
    int64_t row0, nrows;
    int64_t samples[TSL_LINEAR_MAX_TILES];
} tsl_linear_rows_args;

/* dw (nrows x K) = sum over tiles t of dy_t[:, row0 .. row0 + nrows)^T x_t, each tile's GEMM
 * adding into the block in tile order; db (O) = column sums of every dy_t when db != NULL.
 * Overwrites. */
void tsl_linear_weight_rows_kernel(const tsl_linear_rows_args *a, const void *const *x,
                                   const void *const *dy, void *dw, void *db);

#ifdef TESSEL_USE_CUDA
/* The codelets' CUDA functions (linear.cu, cuBLAS on the worker's handle and stream): the same
 * arguments and buffers as the CPU functions. */
void tsl_linear_forward_cuda(void *buffers[], void *cl_arg);
void tsl_linear_backward_data_cuda(void *buffers[], void *cl_arg);
void tsl_linear_backward_weights_cuda(void *buffers[], void *cl_arg);
void tsl_linear_weight_rows_cuda(void *buffers[], void *cl_arg);
#endif

extern struct starpu_codelet tsl_cl_linear_forward;          /* R x, R w, [R b], W y */
extern struct starpu_codelet tsl_cl_linear_backward_data;    /* R dy, R w, W dx */
extern struct starpu_codelet tsl_cl_linear_backward_weights; /* R x, R dy, W dw, [W db] */
/* R x_0, R dy_0, R x_1, R dy_1, ..., W dw rows, [W db] */
extern struct starpu_codelet tsl_cl_linear_weight_rows;

#ifdef __cplusplus
}
#endif

#endif /* TESSEL_CODELETS_LINEAR_H */
