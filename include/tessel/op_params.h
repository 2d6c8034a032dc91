/**
 * @file op_params.h
 * @brief Settings of the network operators (activation kinds, convolution and pooling
 *        settings) and the output shapes they give. Pure: shapes in, shapes out, no tensors
 *        and no runtime, so model graphs (tessel/graph.h) and the operators on tiled tensors
 *        (tessel/ops.h) share them.
 */
#ifndef TESSEL_OP_PARAMS_H
#define TESSEL_OP_PARAMS_H

#include <stdint.h>

#include "tessel/export.h"
#include "tessel/status.h"
#include "tessel/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Elementwise activations. */
typedef enum tsl_activation {
    TSL_ACT_RELU = 0,       /**< max(x, 0) */
    TSL_ACT_LEAKY_RELU = 1, /**< x if x > 0, slope * x otherwise */
    TSL_ACT_SIGMOID = 2,    /**< 1 / (1 + exp(-x)) */
    TSL_ACT_TANH = 3,       /**< tanh(x) */
    TSL_ACT_GELU = 4,       /**< x Phi(x), Phi the standard normal CDF (PyTorch's exact GELU) */
    TSL_ACT_SILU = 5,       /**< x / (1 + exp(-x)), x sigmoid(x) (PyTorch's SiLU, swish) */
} tsl_activation;

/** Number of activation kinds. */
#define TSL_ACTIVATION_COUNT 6

/** What a convolution's padding holds (PyTorch's padding_mode). */
typedef enum tsl_padding_mode {
    TSL_PADDING_ZEROS = 0,     /**< `zeros`: zeros (the default) */
    TSL_PADDING_REFLECT = 1,   /**< `reflect`: the input mirrored at its edge, the edge not
                                    repeated (x[-i] = x[i]) */
    TSL_PADDING_REPLICATE = 2, /**< `replicate`: the edge value repeated (x[-i] = x[0]) */
    TSL_PADDING_CIRCULAR = 3,  /**< `circular`: the input wrapped round (x[-i] = x[n - i]), a
                                    periodic domain */
} tsl_padding_mode;

/** Number of padding modes. */
#define TSL_PADDING_MODE_COUNT 4

/** Convolution settings, as PyTorch's nn.Conv1d/2d/3d. */
typedef struct tsl_conv_params {
    int32_t spatial; /**< 1, 2 or 3 spatial dimensions */
    /** a ::tsl_padding_mode (default zeros). Other modes: convolutions only (not transposed);
     *  reflect and replicate with padding at most half the kernel's span (2 padding <=
     *  dilation (k - 1), as a "same" convolution has), reflect below the input size (the
     *  halo windows fill it from their own values, their gradient folds back); circular with
     *  padding at most the input size (the windows take halo slabs from the tiles at the
     *  other end, whose gradients go back there). Any spatial tiling. Their tasks run on the
     *  window path, on CPU workers (as spatially tiled convolutions' do) */
    int32_t padding_mode;
    int64_t stride[3];   /**< >= 1 per spatial dimension */
    int64_t padding[3];  /**< added on both sides (zeros, or as padding_mode says), >= 0 */
    int64_t dilation[3]; /**< >= 1 (1 = dense) */
    int64_t groups;      /**< >= 1, dividing the input and output channels */
    /** transposed convolutions only: extra output size on one side, below the stride or the
     *  dilation (as PyTorch's output_padding); 0 for convolutions */
    int64_t output_padding[3];
} tsl_conv_params;

/** @brief Stride 1, padding 0, dilation 1, one group, for @p spatial dimensions. */
TSL_API tsl_status tsl_conv_params_init(tsl_conv_params *params, int32_t spatial);

/**
 * @brief Output shape of a convolution of input @p x (N, C_in, spatial...) with weights
 * @p w (C_out, C_in / groups, kernel...): each spatial size is
 * floor((L + 2 padding - dilation (k - 1) - 1) / stride) + 1. Pure; checks every setting
 * (negative padding, a kernel larger than the padded input, channels that do not match)
 * and returns an error before anything runs.
 */
TSL_API tsl_status tsl_conv_output_shape(const tsl_shape *x, const tsl_shape *w,
                                         const tsl_conv_params *params, tsl_shape *y);

/**
 * @brief Output shape of a transposed convolution (PyTorch's nn.ConvTranspose1d/2d/3d) of
 * @p x (N, C_in, spatial...) with weights @p w (C_in, C_out / groups, kernel...): each
 * spatial size is (L - 1) stride - 2 padding + dilation (k - 1) + output_padding + 1.
 */
TSL_API tsl_status tsl_conv_transpose_output_shape(const tsl_shape *x, const tsl_shape *w,
                                                   const tsl_conv_params *params, tsl_shape *y);

/** Pooling kinds. */
typedef enum tsl_pool_kind {
    TSL_POOL_MAX = 0,
    TSL_POOL_AVG = 1,
} tsl_pool_kind;

/** Pooling settings, as PyTorch's MaxPool/AvgPool 1d/2d/3d (no dilation). */
typedef struct tsl_pool_params {
    int32_t spatial;           /**< 1, 2 or 3 */
    tsl_pool_kind kind;        /**< max or average */
    int64_t kernel[3];         /**< >= 1 */
    int64_t stride[3];         /**< >= 1 */
    int64_t padding[3];        /**< 0 <= padding <= kernel / 2 */
    int32_t count_include_pad; /**< average: padded zeros count in the divisor (default 1) */
    /** output sizes rounded up (PyTorch's ceil_mode; default 0, floor): one more window where
     *  the last one would start inside the input, clipped at the input's end (and, for the
     *  average divisor, at the end of the right padding) */
    int32_t ceil_mode;
} tsl_pool_params;

/** @brief @p kind pooling with a cubic @p kernel, stride = kernel, no padding, as PyTorch's
 *  defaults. */
TSL_API tsl_status tsl_pool_params_init(tsl_pool_params *params, tsl_pool_kind kind,
                                        int32_t spatial, int64_t kernel);

/** @brief Output shape of pooling @p x (N, C, spatial...): floor((L + 2 padding - kernel) /
 *  stride) + 1 per spatial dimension, or with ceil_mode the ceiling, less one where that
 *  last window would start at or past L + padding (as PyTorch). Checks every setting. */
TSL_API tsl_status tsl_pool_output_shape(const tsl_shape *x, const tsl_pool_params *params,
                                         tsl_shape *y);

#ifdef __cplusplus
}
#endif

#endif /* TESSEL_OP_PARAMS_H */
