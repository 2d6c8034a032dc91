/**
 * @file ops.h
 * @brief Network operators on tiled tensors, lowered to tile tasks: convolutions and
 *        transposed convolutions, pooling, upsampling, activations, batch normalization,
 *        fully connected layers, channel concatenation, losses and optimizer updates.
 *
 * Every call is collective over the tensors' context, submits one task per tile on the
 * owner of the tile it writes, and returns without waiting (losses wait for their value). Tensors
 * passed together must share the context, dtype (f32 or f64), shape and tile grid; their owner maps
 * may differ (StarPU-MPI moves the tiles a task reads).
 */
#ifndef TESSEL_OPS_H
#define TESSEL_OPS_H

#include <stdint.h>

#include "tessel/export.h"
#include "tessel/op_params.h"
#include "tessel/status.h"
#include "tessel/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/**
 * @brief y = act(x). @p y may be @p x (in place).
 * @param[in] slope negative slope of ::TSL_ACT_LEAKY_RELU (finite); ignored otherwise
 */
TSL_API tsl_status tsl_activation_forward(tsl_activation kind, double slope, tsl_tensor_t x,
                                          tsl_tensor_t y);

/**
 * @brief dx = act'(.) * dy. ReLU and LeakyReLU read the forward input @p x; sigmoid and
 * tanh read the forward output @p y (the other may be NULL). At x = 0, ReLU's derivative is
 * taken as 0 and LeakyReLU's as slope, as PyTorch does. @p dx may be @p dy (in place).
 */
TSL_API tsl_status tsl_activation_backward(tsl_activation kind, double slope, tsl_tensor_t x,
                                           tsl_tensor_t y, tsl_tensor_t dy, tsl_tensor_t dx);

/**
 * @brief Mean softmax cross-entropy over classes, with its gradient.
 *
 * @p logits is (N, C) for classification or (N, C, spatial...) for per-voxel segmentation;
 * @p labels (i32, i64 or u8) has the same shape without C and the same tiling without C
 * (the class dimension must not be split). The loss is the mean over all N x spatial
 * positions of logsumexp(x) - x[label], summed exactly, so it is the same, bit for bit, for
 * every tiling and rank count; it is returned on every rank (the call waits for it). If
 * @p dlogits is not NULL (same layout as the logits) it receives the gradient of the mean
 * loss, (softmax - onehot) / positions. A label outside [0, C) makes the call fail with
 * ::TSL_ERR_INVALID_ARG after the tasks ran (its position gets a zero gradient).
 */
TSL_API tsl_status tsl_loss_cross_entropy(tsl_tensor_t logits, tsl_tensor_t labels,
                                          tsl_tensor_t dlogits, double *loss);

/**
 * @brief Accuracy counts: the number of positions (samples, or samples x spatial positions)
 * whose first maximum over the classes of @p logits is the label. Layouts as
 * tsl_loss_cross_entropy(); one task per tile on the logits' owner and an exact sum, so no
 * tile moves; the count is returned on every rank (the call waits for it). A label outside
 * [0, C) is ::TSL_ERR_INVALID_ARG.
 */
TSL_API tsl_status tsl_argmax_hits(tsl_tensor_t logits, tsl_tensor_t labels, int64_t *hits);

/**
 * @brief Soft Dice loss for segmentation, over the whole batch: with p = softmax of the
 * logits over classes and g = onehot(labels), per class I = sum p g and S = sum p + sum g +
 * smooth over every sample and position; loss = 1 - mean over classes of (2 I + smooth) / S.
 * Layouts as tsl_loss_cross_entropy(); the sums are exact, so the loss and @p dlogits (when
 * not NULL) are the same for every tiling and rank count. At most 1024 classes.
 */
TSL_API tsl_status tsl_loss_dice(tsl_tensor_t logits, tsl_tensor_t labels, tsl_tensor_t dlogits,
                                 double smooth, double *loss);

/**
 * @brief Mean squared error between @p x and @p target (same layout; owners may differ),
 * summed exactly like the cross-entropy, and its gradient 2 (x - target) / numel into
 * @p dx when not NULL. Waits for the loss.
 */
TSL_API tsl_status tsl_loss_mse(tsl_tensor_t x, tsl_tensor_t target, tsl_tensor_t dx, double *loss);

/**
 * @brief Mean absolute error (L1) between @p x and @p target, as tsl_loss_mse(): the loss is
 * the exact sum of |x - target| over numel, the gradient sign(x - target) / numel (0 where they
 * are equal, PyTorch's L1Loss). Waits for the loss.
 */
TSL_API tsl_status tsl_loss_l1(tsl_tensor_t x, tsl_tensor_t target, tsl_tensor_t dx, double *loss);

/**
 * @brief The difference loss of domain separation networks: the squared Frobenius norm of
 * A^T B, A and B the values @p a and @p b flattened per sample (batch x features; any per-sample
 * shapes, one batch size, any tilings and layouts), and its gradients 2 (B B^T) A into @p da and
 * 2 (A A^T) B into @p db (both or neither; tiled as a and b). Computed from A A^T and B B^T
 * (batch x batch), with the two values brought whole to the rank of a's first tile, so its bits
 * do not depend on the tilings; meant for codes (batch x a few thousand features), not for
 * feature maps larger than a rank's memory. Waits for the loss.
 */
TSL_API tsl_status tsl_loss_difference(tsl_tensor_t a, tsl_tensor_t b, tsl_tensor_t da,
                                       tsl_tensor_t db, double *loss);

/**
 * @brief The similarity loss of domain separation networks: the biased estimate of the squared
 * maximum mean discrepancy between the batch's samples of @p a and of @p b (flattened per
 * sample; one batch size and one number of features, any tilings and layouts),
 * MMD^2 = mean_ij k(a_i, a_j) + mean_ij k(b_i, b_j) - 2 mean_ij k(a_i, b_j), with the Gaussian
 * kernel mixture k(x, y) = sum_s exp(-||x - y||^2 / (2 s^2)) over the bandwidths s = 1e-6, 1e-5,
 * 1e-4, 1e-3, 0.01, 0.1, 1, 5, 10, 15, 20, 25, 30, 35, 100, 1e3, 1e4, 1e5, 1e6. Its gradients go
 * into @p da and @p db (both or neither; tiled as a and b). As tsl_loss_difference(), one task
 * on the rank of a's first tile computes it from the two values brought whole (batch^2 kernel
 * values of each pair), so its bits do not depend on the tilings, and CPU and CUDA workers give
 * the same bits (the exponential is tessel's own); meant for codes. Waits for the loss.
 */
TSL_API tsl_status tsl_loss_similarity(tsl_tensor_t a, tsl_tensor_t b, tsl_tensor_t da,
                                       tsl_tensor_t db, double *loss);

/**
 * @brief Fully connected layer: y = x w^T + b.
 *
 * @p x is (N, K) and @p y (N, O), both cut along N only, with the same N splits; @p w is
 * (O, K) and @p b (O) or NULL, one tile each (PyTorch's nn.Linear layout). One task per
 * sample tile runs on the owner of its y tile. f32 or f64.
 *
 * Feature tiles (f32; the filters= and channels= plans): @p x and @p y may also be cut along
 * their features, with the rules of tsl_conv_forward()'s channel tiles for a kernel of 1:
 * @p y cut into F feature tiles needs @p w and @p b cut into F row blocks (tile g, the rows
 * of y's tile g); @p w may also be cut along its columns as @p x is along its features (tile
 * (g, k) on the rank that makes the partial of y's tile g over x's tile k; the partials are
 * added by a tree on y's tile owner).
 */
TSL_API tsl_status tsl_linear_forward(tsl_tensor_t x, tsl_tensor_t w, tsl_tensor_t b,
                                      tsl_tensor_t y);

/**
 * @brief Backward of tsl_linear_forward(): dx = dy w (when @p dx is not NULL); dw = dy^T x
 * and db = sum of dy over samples (when not NULL; db needs dw). dw and db are overwritten:
 * each sample tile contributes a partial product, added by a tree of tasks, so they equal
 * the one-tile result up to float rounding (summation order).
 */
TSL_API tsl_status tsl_linear_backward(tsl_tensor_t x, tsl_tensor_t w, tsl_tensor_t dy,
                                       tsl_tensor_t dx, tsl_tensor_t dw, tsl_tensor_t db);

/**
 * @brief dst = the channels of @p srcs side by side (dimension 1), as torch.cat(dim=1): the
 * U-Net skip connection. All tensors agree in every other dimension; their tile grids and
 * owners are free (box copies between overlapping tiles).
 */
TSL_API tsl_status tsl_concat_channels(int32_t count, const tsl_tensor_t *srcs, tsl_tensor_t dst);

/** @brief The inverse of tsl_concat_channels() (and its backward): dsts[k] receives its
 *  run of channels of @p src. */
TSL_API tsl_status tsl_split_channels(tsl_tensor_t src, int32_t count, const tsl_tensor_t *dsts);

/**
 * @brief Copy @p src into @p dst of another shape with the same samples and elements per
 * sample, in C order (flatten (N, C, H, W) to (N, C*H*W), and back for its gradient). Both
 * tensors must be cut along N, and perhaps along dimension 1, so that tile i of each holds the
 * same samples and the same run of their elements (channel tiles flattened to feature tiles,
 * the filters= and channels= plans). Either side may have channels-last
 * tiles (the copy reorders them; the flat side is plain), not both unless shapes are equal.
 */
TSL_API tsl_status tsl_reshape_samples(tsl_tensor_t src, tsl_tensor_t dst);

/**
 * @brief Batch normalization, training mode: statistics over every sample and spatial
 * position of each channel, across all tiles and ranks.
 *
 * @p x is (N, C, spatial...) in any tiling; @p gamma, @p beta, @p running_mean and
 * @p running_var are C values of x's dtype, one tile each; @p saved is a (2, C) f64 tensor
 * of one tile that receives the batch mean and 1 / sqrt(var + eps) for the backward; @p y
 * has x's layout (not x itself). The per-channel sums are exact (fixed-point accumulators
 * merged by a task tree), so the statistics, y and the running statistics are identical for
 * every tiling and rank count. Running statistics move by @p momentum, the variance taking
 * the unbiased batch variance (PyTorch's convention). Does not wait.
 */
TSL_API tsl_status tsl_batchnorm_forward_train(tsl_tensor_t x, tsl_tensor_t gamma,
                                               tsl_tensor_t beta, tsl_tensor_t running_mean,
                                               tsl_tensor_t running_var, tsl_tensor_t saved,
                                               tsl_tensor_t y, double eps, double momentum);

/** @brief Batch normalization, inference mode: y = (x - running_mean) /
 *  sqrt(running_var + eps) * gamma + beta, one task per tile. */
TSL_API tsl_status tsl_batchnorm_forward_infer(tsl_tensor_t x, tsl_tensor_t gamma,
                                               tsl_tensor_t beta, tsl_tensor_t running_mean,
                                               tsl_tensor_t running_var, tsl_tensor_t y,
                                               double eps);

/**
 * @brief Backward of tsl_batchnorm_forward_train(), from its input @p x and @p saved:
 * dx = gamma / std * (dy - mean(dy) - xhat * mean(dy * xhat)) (when @p dx is not NULL),
 * dgamma = sum(dy * xhat) and dbeta = sum(dy) per channel (each may be NULL; overwritten).
 * sum(dy) and sum(dy * x) are exact, and sum(dy * xhat) is taken as
 * invstd * (sum(dy * x) - mean * sum(dy)) from them, each rounded once, so the results are
 * identical for every tiling and rank count (accurate unless |mean| is many orders of
 * magnitude above the standard deviation, as the variance).
 */
TSL_API tsl_status tsl_batchnorm_backward(tsl_tensor_t x, tsl_tensor_t dy, tsl_tensor_t gamma,
                                          tsl_tensor_t saved, tsl_tensor_t dx, tsl_tensor_t dgamma,
                                          tsl_tensor_t dbeta);

/**
 * @brief Group normalization (torch.nn.GroupNorm; with @p groups 1, layer normalization over
 * each sample's channels and positions): each sample's C channels form @p groups groups of
 * C / groups; y = (x - mean) / sqrt(var + eps) * gamma + beta, mean and biased variance over
 * the sample's group (its channels, every position), gamma and beta per channel (one tile of
 * C values of x's dtype). The same in training and inference (no running statistics). @p saved
 * (one f64 tile of (N, groups, 2)) receives each (sample, group)'s mean and 1 / sqrt(var + eps)
 * for the backward. The sums are exact and each sample slab's tiles merge their own (a
 * sample-cut plan exchanges nothing), so any tiling, layout and rank count gives the same bits.
 * Does not wait.
 */
TSL_API tsl_status tsl_groupnorm_forward(tsl_tensor_t x, tsl_tensor_t gamma, tsl_tensor_t beta,
                                         int64_t groups, tsl_tensor_t saved, tsl_tensor_t y,
                                         double eps);

/**
 * @brief Backward of tsl_groupnorm_forward(), from its input @p x and @p saved: with
 * xhat = (x - mean) invstd, dx = invstd (dy gamma - mean(dy gamma) - xhat mean(dy gamma xhat))
 * (means over the sample's group; when @p dx is not NULL), dgamma = sum(dy xhat) and
 * dbeta = sum(dy) per channel over every sample and position (each may be NULL; overwritten).
 * sum(dy) and sum(dy x) are exact per (sample, channel), and sum(dy xhat) is taken as
 * invstd (sum(dy x) - mean sum(dy)) from them, each rounded once (as batch norm's backward), so
 * the results are identical for every tiling and rank count.
 */
TSL_API tsl_status tsl_groupnorm_backward(tsl_tensor_t x, tsl_tensor_t dy, tsl_tensor_t gamma,
                                          int64_t groups, tsl_tensor_t saved, tsl_tensor_t dx,
                                          tsl_tensor_t dgamma, tsl_tensor_t dbeta);

/**
 * @brief Group normalization then ReLU, fused: as tsl_groupnorm_forward() (same arguments and
 * statistics) followed by tsl_activation_forward(::TSL_ACT_RELU) on @p y, in one pass over each
 * tile, with the same bits in @p y as those two calls. Does not wait.
 */
TSL_API tsl_status tsl_groupnorm_relu_forward(tsl_tensor_t x, tsl_tensor_t gamma, tsl_tensor_t beta,
                                              int64_t groups, tsl_tensor_t saved, tsl_tensor_t y,
                                              double eps);

/**
 * @brief Backward of tsl_groupnorm_relu_forward(), from its input @p x, @p gamma, @p beta and
 * @p saved: tsl_groupnorm_backward() with dy replaced by dy where the forward's output y > 0
 * and 0 elsewhere (ReLU's derivative at 0 taken as 0, as tsl_activation_backward()), with the
 * bits of those two unfused calls. y is not read: each task recomputes its sign from x with the
 * forward's own arithmetic, so @p x, @p gamma, @p beta and @p saved must be as the forward read
 * or left them. Arguments otherwise as tsl_groupnorm_backward(); @p dgamma and @p dbeta may not
 * be @p beta.
 */
TSL_API tsl_status tsl_groupnorm_relu_backward(tsl_tensor_t x, tsl_tensor_t dy, tsl_tensor_t gamma,
                                               tsl_tensor_t beta, int64_t groups,
                                               tsl_tensor_t saved, tsl_tensor_t dx,
                                               tsl_tensor_t dgamma, tsl_tensor_t dbeta);

/**
 * @brief Batch normalization then ReLU, training mode, fused: as
 * tsl_batchnorm_forward_train() (same arguments and statistics) followed by
 * tsl_activation_forward(::TSL_ACT_RELU) on @p y, in one pass over each tile, with the same
 * bits in @p y as those two calls. Does not wait.
 */
TSL_API tsl_status tsl_batchnorm_relu_forward_train(tsl_tensor_t x, tsl_tensor_t gamma,
                                                    tsl_tensor_t beta, tsl_tensor_t running_mean,
                                                    tsl_tensor_t running_var, tsl_tensor_t saved,
                                                    tsl_tensor_t y, double eps, double momentum);

/**
 * @brief Backward of tsl_batchnorm_relu_forward_train(), from its input @p x, @p gamma,
 * @p beta and @p saved: tsl_batchnorm_backward() with dy replaced by dy where the forward's
 * output y > 0 and 0 elsewhere (ReLU's derivative at 0 taken as 0, as
 * tsl_activation_backward()), with the bits of those two unfused calls. y is not read: each
 * task recomputes it from x with the forward's own arithmetic (a pass over y saved), so
 * @p x, @p gamma, @p beta and @p saved must be as the forward read or left them. Two passes
 * over the data; arguments otherwise as tsl_batchnorm_backward(), and @p dbeta may not be
 * @p beta.
 */
TSL_API tsl_status tsl_batchnorm_relu_backward(tsl_tensor_t x, tsl_tensor_t dy, tsl_tensor_t gamma,
                                               tsl_tensor_t beta, tsl_tensor_t saved,
                                               tsl_tensor_t dx, tsl_tensor_t dgamma,
                                               tsl_tensor_t dbeta);

/**
 * @brief y = conv(x, w) + b, f32. @p x and @p y (shape from tsl_conv_output_shape()) are cut
 * along N only, with the same N splits; @p w and @p b (C_out values, or NULL) are one tile
 * each. One task per sample tile runs oneDNN on the owner of its y tile.
 */
TSL_API tsl_status tsl_conv_forward(const tsl_conv_params *params, tsl_tensor_t x, tsl_tensor_t w,
                                    tsl_tensor_t b, tsl_tensor_t y);

/**
 * @brief Backward of tsl_conv_forward(): dx (when not NULL), dw and db (when not NULL; db
 * needs dw; overwritten), the weight gradients summed over sample tiles by task trees.
 */
TSL_API tsl_status tsl_conv_backward(const tsl_conv_params *params, tsl_tensor_t x, tsl_tensor_t w,
                                     tsl_tensor_t dy, tsl_tensor_t dx, tsl_tensor_t dw,
                                     tsl_tensor_t db);

/** @brief y = conv_transpose(x, w) + b (the U-Net up-path); tiling rules of
 *  tsl_conv_forward(). */
TSL_API tsl_status tsl_conv_transpose_forward(const tsl_conv_params *params, tsl_tensor_t x,
                                              tsl_tensor_t w, tsl_tensor_t b, tsl_tensor_t y);

/** @brief Backward of tsl_conv_transpose_forward(), as tsl_conv_backward(). */
TSL_API tsl_status tsl_conv_transpose_backward(const tsl_conv_params *params, tsl_tensor_t x,
                                               tsl_tensor_t w, tsl_tensor_t dy, tsl_tensor_t dx,
                                               tsl_tensor_t dw, tsl_tensor_t db);

/** Most inputs of tsl_conv_concat_forward(). */
#define TSL_CONV_MAX_INPUTS 8

/**
 * @brief y = conv(concat(xs[0], ..., xs[count - 1]), w) + b, the channel concatenation
 * (tsl_concat_channels()) never made: each input runs through its run of the weights' input
 * channels (w is (C_out, the inputs' channels summed, kernel...)), the later ones adding to y.
 * The U-Net decoder's convolution of its skip connection and up-sampled path, without the
 * concatenated copy. The inputs agree in every dimension but channels and in their tile grid;
 * one group, 1 to TSL_CONV_MAX_INPUTS inputs; tiling rules of tsl_conv_forward(). Equals the
 * convolution of the concatenation up to float rounding (the sum's order).
 */
TSL_API tsl_status tsl_conv_concat_forward(const tsl_conv_params *params, int32_t count,
                                           const tsl_tensor_t *xs, tsl_tensor_t w, tsl_tensor_t b,
                                           tsl_tensor_t y);

/**
 * @brief Backward of tsl_conv_concat_forward(): dxs[k] (a NULL array or entry: not wanted)
 * the gradient of xs[k], what tsl_split_channels() would cut from the concatenation's; dw
 * and db (when not NULL; db needs dw) as tsl_conv_backward().
 */
TSL_API tsl_status tsl_conv_concat_backward(const tsl_conv_params *params, int32_t count,
                                            const tsl_tensor_t *xs, tsl_tensor_t w, tsl_tensor_t dy,
                                            const tsl_tensor_t *dxs, tsl_tensor_t dw,
                                            tsl_tensor_t db);

/**
 * @brief y = pool(x). @p x and @p y may be cut along N and C (with the same splits) and, f32
 * only, along spatial dimensions with the same tile grid: each output tile's task then reads
 * its input tile and the halo slabs pack tasks cut from the neighbouring tiles. A global
 * average pool is an average pool whose kernel is the whole spatial extent.
 */
TSL_API tsl_status tsl_pool_forward(const tsl_pool_params *params, tsl_tensor_t x, tsl_tensor_t y);

/** @brief dx from dy; max pooling also reads x (the first maximum of each window gets the
 *  gradient, as PyTorch). Average pooling reads only dy (each window's share): its tasks do
 *  not touch x, which may be NULL, dx then giving the input's shape and tiles (a caller may
 *  free x's memory after the forward). dx is overwritten. */
TSL_API tsl_status tsl_pool_backward(const tsl_pool_params *params, tsl_tensor_t x, tsl_tensor_t dy,
                                     tsl_tensor_t dx);

/**
 * @brief Max pooling that keeps, for the backward, where each output's gradient goes instead
 * of the input: y as tsl_pool_forward(), and @p indices (y's shape, tile grid, owners and
 * layout; ::TSL_U8 for kernels of at most 255 positions, else ::TSL_I32) the position in
 * each output's window, (k0 * kernel[1] + k1) * kernel[2] + k2, of the element
 * tsl_pool_backward() gives its gradient (a NaN first, else the first maximum). Tiling as
 * tsl_pool_forward(), spatial tiles included. Only ::TSL_POOL_MAX.
 */
TSL_API tsl_status tsl_pool_forward_indices(const tsl_pool_params *params, tsl_tensor_t x,
                                            tsl_tensor_t y, tsl_tensor_t indices);

/** @brief dx from dy and the indices tsl_pool_forward_indices() wrote: the same values, bit
 *  for bit, as tsl_pool_backward() from x, without x (nor, on spatial tiles, its halo). dx,
 *  the input's gradient, is overwritten and sets the input's shape and tiles. */
TSL_API tsl_status tsl_pool_backward_indices(const tsl_pool_params *params, tsl_tensor_t indices,
                                             tsl_tensor_t dy, tsl_tensor_t dx);

/** @brief Nearest upsampling, as PyTorch's nn.Upsample(mode='nearest'): by integer factors
 *  @p scale[spatial] (>= 1; y has each spatial size times its factor, scale_factor=), or, with
 *  @p scale NULL, to y's spatial sizes, any of them (size=; smaller than x's too).
 *
 *  Along each spatial dimension of input size L and output size M, output position o reads
 *  x[min(floor(o * r), L - 1)] with r the float (float)(1 / s) or (float)L / (float)M, as
 *  PyTorch computes it. Tiling as for pooling: spatial tiles (f32) read the halo their outputs'
 *  sources need from the neighbouring tiles. */
TSL_API tsl_status tsl_upsample_nearest_forward(const int64_t *scale, tsl_tensor_t x,
                                                tsl_tensor_t y);

/** @brief Backward of tsl_upsample_nearest_forward(): each dx element sums the dy elements that
 *  read it (@p scale NULL: the sizes of dy and dx map). */
TSL_API tsl_status tsl_upsample_nearest_backward(const int64_t *scale, tsl_tensor_t dy,
                                                 tsl_tensor_t dx);

/** @brief Linear, bilinear or trilinear upsampling (by the number of spatial dimensions), as
 *  PyTorch's nn.Upsample(mode='linear'/'bilinear'/'trilinear', align_corners=False), by integer
 *  factors or (@p scale NULL) to y's spatial sizes, any of them.
 *
 *  Along each spatial dimension of input size L, output size M and factor s (L / M by size),
 *  output position o reads the source coordinate c = max((o + 0.5) / s - 0.5, 0) and
 *  interpolates between x[i0] and x[i1] with weights 1 - (c - i0) and c - i0, where
 *  i0 = min(floor(c), L - 1) and i1 = min(i0 + 1, L - 1); dimensions combine as a product of
 *  these weights. Tiling as for tsl_upsample_nearest_forward().
 *  @param[in] scale  factors, one per spatial dimension, each >= 1; NULL: y's sizes
 *  @param[in] x      input (N, C, spatial...), f32 or f64 (f32 only with spatial tiles)
 *  @param[out] y     output (N, C, spatial x scale...), same dtype and tile grid as @p x;
 *                    overwritten
 *  @return TSL_OK, TSL_ERR_INVALID_ARG (out-of-range scale, y == x),
 *          TSL_ERR_SHAPE (wrong output shape, different tile grids), TSL_ERR_DTYPE */
TSL_API tsl_status tsl_upsample_linear_forward(const int64_t *scale, tsl_tensor_t x,
                                               tsl_tensor_t y);

/** @brief Backward of tsl_upsample_linear_forward(): dx = the transpose of the interpolation
 *  applied to dy. Overwrites @p dx; each tile sums its planes in a fixed order, so the result is
 *  the same on every layout and rank count.
 *  @param[in] scale  the forward's factors, or NULL: the sizes of dy and dx map
 *  @param[in] dy     gradient of the output, shaped as the forward's y
 *  @param[out] dx    gradient of the input, shaped as the forward's x, same tile grid as @p dy
 *  @return as tsl_upsample_linear_forward() */
TSL_API tsl_status tsl_upsample_linear_backward(const int64_t *scale, tsl_tensor_t dy,
                                                tsl_tensor_t dx);

/** SGD settings, as PyTorch's torch.optim.SGD. */
typedef struct tsl_sgd_config {
    double lr;           /**< learning rate, > 0 */
    double momentum;     /**< >= 0; 0 disables the momentum buffer */
    double dampening;    /**< in [0, 1] */
    double weight_decay; /**< L2 penalty added to the gradient, >= 0 */
    int32_t nesterov;    /**< Nesterov momentum (needs momentum > 0 and dampening 0) */
} tsl_sgd_config;

/** Adam settings, as torch.optim.Adam (decoupled = 0) and torch.optim.AdamW (1). */
typedef struct tsl_adam_config {
    double lr;           /**< > 0 */
    double beta1;        /**< in [0, 1) */
    double beta2;        /**< in [0, 1) */
    double eps;          /**< > 0 */
    double weight_decay; /**< >= 0: added to the gradient (Adam) or decoupled (AdamW) */
    int32_t decoupled;   /**< 1: AdamW's decoupled weight decay */
} tsl_adam_config;

/** @brief PyTorch's defaults: lr 0.01 (SGD has none; tessel picks 0.01), no momentum. */
TSL_API tsl_status tsl_sgd_config_init(tsl_sgd_config *config);

/** @brief PyTorch's defaults: lr 1e-3, betas (0.9, 0.999), eps 1e-8, no weight decay. */
TSL_API tsl_status tsl_adam_config_init(tsl_adam_config *config);

/** Opaque optimizer: settings plus per-parameter state tensors (momentum buffer, or Adam's
 *  first and second moments), each with its parameter's tile grid and owners. */
typedef struct tsl_optimizer *tsl_optimizer_t;

/** @brief An SGD optimizer on @p ctx. */
TSL_API tsl_status tsl_optimizer_create_sgd(tsl_optimizer_t *opt, tsl_context_t ctx,
                                            const tsl_sgd_config *config);

/** @brief An Adam or AdamW optimizer on @p ctx. */
TSL_API tsl_status tsl_optimizer_create_adam(tsl_optimizer_t *opt, tsl_context_t ctx,
                                             const tsl_adam_config *config);

/** @brief Set the learning rate of the next steps (> 0, finite): a schedule calls it before
 *  each step. */
TSL_API tsl_status tsl_optimizer_set_lr(tsl_optimizer_t opt, double lr);

/** @brief Destroy the optimizer and its state tensors. NULL is a no-op. */
TSL_API tsl_status tsl_optimizer_destroy(tsl_optimizer_t opt);

/**
 * @brief One update of every parameter from its gradient: one task per parameter tile, on
 * the tile's owner, reading the gradient tile and updating the state tiles. A parameter's
 * state is created (zero) on its first step; each parameter counts its own steps (Adam's
 * bias correction). Parameters must stay alive as long as the optimizer.
 * @param[in] params parameter tensors (f32 or f64), each at most once
 * @param[in] grads  gradients, same layout as their parameters
 */
TSL_API tsl_status tsl_optimizer_step(tsl_optimizer_t opt, int32_t count,
                                      const tsl_tensor_t *params, const tsl_tensor_t *grads);

/** @brief Steps taken so far for @p param (0 before its first). Not collective. */
TSL_API tsl_status tsl_optimizer_param_steps(tsl_optimizer_t opt, tsl_tensor_t param,
                                             int64_t *steps);

/**
 * @brief Write the optimizer's state for @p params into @p dir (which must exist), named as
 * PyTorch's optimizer state_dict would: DIR/NAME.step.npy (int64, the parameter's step
 * count), and for a parameter that has state, DIR/NAME.exp_avg.npy and NAME.exp_avg_sq.npy
 * (Adam) or NAME.momentum_buffer.npy (SGD with momentum), in the parameter's dtype, shape
 * and plain layout. Each file is written atomically. Collective; rank 0 writes.
 * @param[in] names one file-name-safe name per parameter (no '/')
 */
TSL_API tsl_status tsl_optimizer_save_state(tsl_optimizer_t opt, int32_t count,
                                            const tsl_tensor_t *params, const char *const *names,
                                            const char *dir);

/**
 * @brief Replace the optimizer's state for @p params with what tsl_optimizer_save_state()
 * wrote into @p dir, so that the next step is the one the saving run would have taken. A
 * missing file, or one of the wrong dtype or shape, is an error naming it and changes
 * nothing. Collective; rank 0 reads.
 */
TSL_API tsl_status tsl_optimizer_load_state(tsl_optimizer_t opt, int32_t count,
                                            const tsl_tensor_t *params, const char *const *names,
                                            const char *dir);

#ifdef __cplusplus
}
#endif

#endif /* TESSEL_OPS_H */
