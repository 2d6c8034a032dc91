/* Convolution and transposed convolution kernels (oneDNN) and codelets (codelets/conv.c). A
 * tile holds whole samples, in plain N C (D) (H) W order or channels-last N (D) (H) W C order;
 * weights are PyTorch's, plain: (O, I / groups, k...) for a convolution, (I, O / groups, k...)
 * for a transposed one. */
#ifndef TESSEL_CODELETS_CONV_H
#define TESSEL_CODELETS_CONV_H

#include <starpu.h>
#include <stdint.h>

typedef struct tsl_conv_args {
    int32_t spatial;       /* 1, 2 or 3 */
    int32_t has_bias;      /* forward: bias buffer; backward weights: db buffer */
    int32_t transposed;    /* 1: transposed convolution; weights (I, O / groups, k...) */
    int32_t channels_last; /* x, y, dx, dy tiles are channels-last (the struct is a cache key:
                              four int32 keep it free of padding bytes) */
    int64_t samples;       /* N of the tile */
    int64_t in_channels, out_channels, groups;
    int64_t in_size[3], out_size[3], kernel[3];
    int64_t stride[3], padding[3], dilation[3]; /* dilation 1 = dense */
} tsl_conv_args;

/* y = conv(x, w) + b. */
void tsl_conv_forward_kernel(const tsl_conv_args *a, const float *x, const float *w, const float *b,
                             float *y);
/* dx = conv^T(dy, w). */
void tsl_conv_backward_data_kernel(const tsl_conv_args *a, const float *dy, const float *w,
                                   float *dx);
/* dw (and db when not NULL) from x and dy; overwritten. */
void tsl_conv_backward_weights_kernel(const tsl_conv_args *a, const float *x, const float *dy,
                                      float *dw, float *db);

extern struct starpu_codelet tsl_cl_conv_forward;          /* R x, R w, [R b], W y */
extern struct starpu_codelet tsl_cl_conv_backward_data;    /* R dy, R w, W dx */
extern struct starpu_codelet tsl_cl_conv_backward_weights; /* R x, R dy, W dw, [W db] */

#endif /* TESSEL_CODELETS_CONV_H */
