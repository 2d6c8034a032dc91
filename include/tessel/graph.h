/**
 * @file graph.h
 * @brief Model graphs: a network described as values (activations), named parameters and
 *        ops with attributes, with shape inference at every step. Pure description: no
 *        StarPU, no tensors; tsl_model_create() (tessel/model.h) turns a graph into tiled
 *        tensors and tile tasks.
 *
 * Shapes of values are per sample: (C, spatial...) without the batch dimension, which is
 * chosen when the graph runs. Parameters are named as PyTorch's `state_dict` names them for
 * the same network (`conv1.weight`, `conv1.bias`, `bn1.running_mean`, ...) and have PyTorch's
 * layouts (OIDHW weights), so parameter files can be exchanged with PyTorch.
 *
 * Builder calls check their arguments and infer the output shape; a bad call returns an
 * error (with a message, tsl_last_error()) and leaves the graph unchanged.
 */
#ifndef TESSEL_GRAPH_H
#define TESSEL_GRAPH_H

#include <stdint.h>

#include "tessel/export.h"
#include "tessel/op_params.h"
#include "tessel/status.h"
#include "tessel/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/** A model graph. */
typedef struct tsl_graph *tsl_graph_t;

/** Kinds of graph ops. */
typedef enum tsl_op_kind {
    TSL_OP_INPUT = 0,      /**< the network's input */
    TSL_OP_CONV = 1,       /**< convolution or transposed convolution, optional bias */
    TSL_OP_BATCHNORM = 2,  /**< batch normalization (affine, running statistics) */
    TSL_OP_ACTIVATION = 3, /**< ReLU, LeakyReLU, sigmoid, tanh */
    TSL_OP_POOL = 4,       /**< max or average pooling */
    TSL_OP_UPSAMPLE = 5,   /**< nearest or linear upsampling by integer factors */
    TSL_OP_CONCAT = 6,     /**< concatenation along channels */
    TSL_OP_ADD = 7,        /**< elementwise sum of two values (residual) */
    TSL_OP_FLATTEN = 8,    /**< (C, spatial...) to (C x spatial) */
    TSL_OP_LINEAR = 9,     /**< fully connected layer, optional bias */
    TSL_OP_MUL = 10,       /**< elementwise product of two values (gates) */
    TSL_OP_SLICE = 11,     /**< a box of each sample: channels and spatial ranges */
    TSL_OP_DROPOUT = 12,   /**< training: zero elements with probability p, scale the rest */
    TSL_OP_GROUPNORM = 13, /**< group (or layer) normalization, per-sample statistics */
} tsl_op_kind;

/** Number of op kinds. */
#define TSL_OP_KIND_COUNT 14

/** Longest name of a value, op or parameter, terminating zero included. */
#define TSL_GRAPH_NAME_MAX 96

/** @brief An empty graph. */
TSL_API tsl_status tsl_graph_create(tsl_graph_t *graph);

/** @brief Free a graph (NULL is a no-op). */
TSL_API void tsl_graph_destroy(tsl_graph_t graph);

/** @brief Most inputs of one graph (tsl_graph_add_input()). */
#define TSL_GRAPH_MAX_GRAPH_INPUTS 8

/**
 * @brief An input of the network named @p name (NULL: "input" for the first, "input1",
 * "input2", ... after it), per-sample shape (C, spatial...) with 1 to 4 dimensions; @p value
 * receives its id. A graph has 1 to ::TSL_GRAPH_MAX_GRAPH_INPUTS inputs, numbered in the order
 * they are added: input 0 is the x of batch arrays and datasets; a dataset step
 * (tsl_model_train_step_read() and its kin) reads each further input by its name
 * (tsl_dataset_input_shape()), and tsl_model_train_step_inputs(), tsl_model_evaluate_inputs()
 * and tsl_model_forward_values_inputs() take one application tensor per input (an image beside
 * a second modality, a field beside its coordinates, one domain's view each). Inputs may have
 * different shapes; the plan cuts each as it cuts any value of its shape.
 */
TSL_API tsl_status tsl_graph_add_input(tsl_graph_t graph, const char *name, int32_t ndim,
                                       const int64_t *sample_dims, int32_t *value);

/** @brief tsl_graph_add_input() with the default name: the graph's first input ("input"),
 *  or a further one. */
TSL_API tsl_status tsl_graph_input(tsl_graph_t graph, int32_t ndim, const int64_t *sample_dims,
                                   int32_t *value);

/** @brief The number of inputs of @p graph (0 for NULL). */
TSL_API int32_t tsl_graph_input_count(tsl_graph_t graph);

/** @brief The value of input @p index (in the order added), or a negative status. */
TSL_API int32_t tsl_graph_input_value(tsl_graph_t graph, int32_t index);

/**
 * @brief Convolution (or transposed convolution when @p transposed) named @p name: creates
 * parameters `name.weight` ((C_out, C_in / groups, k...), or (C_in, C_out / groups, k...)
 * transposed) and, with @p bias, `name.bias`. @p kernel has params->spatial entries.
 */
TSL_API tsl_status tsl_graph_conv(tsl_graph_t graph, const char *name, int32_t x,
                                  int64_t out_channels, const int64_t *kernel,
                                  const tsl_conv_params *params, int32_t transposed, int32_t bias,
                                  int32_t *value);

/** @brief Batch normalization over channels: parameters `name.weight` (ones),
 *  `name.bias` (zeros) and buffers `name.running_mean`, `name.running_var`. */
TSL_API tsl_status tsl_graph_batchnorm(tsl_graph_t graph, const char *name, int32_t x, double eps,
                                       double momentum, int32_t *value);

/**
 * @brief Group normalization (torch.nn.GroupNorm(groups, C, eps)): each sample's C channels in
 * @p groups groups (groups divides C), each normalized over its channels and positions with
 * that sample's statistics; parameters `name.weight` (ones) and `name.bias` (zeros) of C
 * values. The same in training and evaluation (tsl_groupnorm_forward()).
 */
TSL_API tsl_status tsl_graph_groupnorm(tsl_graph_t graph, const char *name, int32_t x,
                                       int64_t groups, double eps, int32_t *value);

/**
 * @brief Layer normalization: group normalization with one group, each sample normalized over
 * all its channels and positions, with a weight and bias per channel. On features (a (F)
 * value) it is torch.nn.LayerNorm(F, eps); on (C, spatial...) values torch.nn.GroupNorm(1, C,
 * eps). Written to model files as "layer_norm".
 */
TSL_API tsl_status tsl_graph_layernorm(tsl_graph_t graph, const char *name, int32_t x, double eps,
                                       int32_t *value);

/**
 * @brief Instance normalization with a weight and bias per channel
 * (torch.nn.InstanceNorm1d/2d/3d(C, eps, affine=True)): group normalization with one channel a
 * group, each channel of each sample normalized over its positions; @p x needs spatial
 * dimensions. Written to model files as "instance_norm".
 */
TSL_API tsl_status tsl_graph_instancenorm(tsl_graph_t graph, const char *name, int32_t x,
                                          double eps, int32_t *value);

/** @brief Activation (tsl_activation_forward()). */
TSL_API tsl_status tsl_graph_activation(tsl_graph_t graph, int32_t x, tsl_activation kind,
                                        double slope, int32_t *value);

/** @brief Pooling (tsl_pool_forward()). */
TSL_API tsl_status tsl_graph_pool(tsl_graph_t graph, int32_t x, const tsl_pool_params *params,
                                  int32_t *value);

/** @brief Upsampling by @p scale (one factor per spatial dimension); @p linear selects
 *  (bi/tri)linear instead of nearest. */
TSL_API tsl_status tsl_graph_upsample(tsl_graph_t graph, int32_t x, const int64_t *scale,
                                      int32_t linear, int32_t *value);

/** @brief Upsampling to the spatial sizes @p size (one per spatial dimension, each 1 to 2^24;
 *  any sizes, smaller than the input's too), as PyTorch's nn.Upsample(size=...); @p linear
 *  selects (bi/tri)linear instead of nearest (tsl_upsample_nearest_forward() with no scale). */
TSL_API tsl_status tsl_graph_upsample_size(tsl_graph_t graph, int32_t x, const int64_t *size,
                                           int32_t linear, int32_t *value);

/** @brief Makes the op just added (the last; it produced @p value) use the parameters of the
 *  op that produced @p from, as one PyTorch module called twice: a convolution (transposed or
 *  not), linear layer, group, layer or instance norm of the same kind, attributes and parameter
 *  shapes (batch norm, whose running statistics each call would update, is refused).
 *
 *  The op keeps its own parameter names (`NAME.weight`, ...) in the graph, as copies that a
 *  model fills from the source before every forward; their gradients are added to the
 *  source's (in op order) after the backward, the optimizer updates only the source, and
 *  parameter files and checkpoints hold only the source. Sharing a shared op's parameters
 *  shares its source's.
 *  @return TSL_OK; TSL_ERR_INVALID_ARG (no such values, @p value not the last op's, the ops
 *          differ in kind or attributes, batch norm, an op without parameters);
 *          TSL_ERR_SHAPE (the parameters' shapes differ) */
TSL_API tsl_status tsl_graph_share_params(tsl_graph_t graph, int32_t value, int32_t from);

/** @brief Concatenation of @p count values along channels (same spatial shape). */
TSL_API tsl_status tsl_graph_concat(tsl_graph_t graph, int32_t count, const int32_t *xs,
                                    int32_t *value);

/** @brief a + b (same shape). */
TSL_API tsl_status tsl_graph_add(tsl_graph_t graph, int32_t a, int32_t b, int32_t *value);

/**
 * @brief h a + b (same shape, h finite and nonzero): with a = F(b), a residual step
 * b + h F(b), one forward-Euler step of size @p h of the ODE du/dt = F(u)
 * (tsl_graph_ode_segments()). h = 1 is tsl_graph_add().
 */
TSL_API tsl_status tsl_graph_add_scaled(tsl_graph_t graph, int32_t a, int32_t b, double h,
                                        int32_t *value);

/** @brief The sum of @p count values (2 to 8, one shape), in order. */
TSL_API tsl_status tsl_graph_add_n(tsl_graph_t graph, int32_t count, const int32_t *xs,
                                   int32_t *value);

/**
 * @brief a - b (same shape): an add op of (-1) b + a (tsl_graph_add_scaled(b, a, -1)), the
 * same bits as a - b, and written to model files as such an add.
 */
TSL_API tsl_status tsl_graph_sub(tsl_graph_t graph, int32_t a, int32_t b, int32_t *value);

/**
 * @brief The box [start[d], stop[d]) of every sample along each sample axis d (C, then the
 * spatial ones; 0 <= start < stop <= size), as PyTorch's x[:, c0:c1, h0:h1, ...]; its
 * backward puts the gradient back in the box, zeros elsewhere.
 */
TSL_API tsl_status tsl_graph_slice(tsl_graph_t graph, int32_t x, const int64_t *start,
                                   const int64_t *stop, int32_t *value);

/** @brief a * b elementwise (same shape); its backward reads both. */
TSL_API tsl_status tsl_graph_mul(tsl_graph_t graph, int32_t a, int32_t b, int32_t *value);

/**
 * @brief Dropout with probability @p p (0 <= p < 1), as torch.nn.Dropout: in training each
 * element is zeroed with probability p and the others scaled by 1 / (1 - p); in inference it
 * passes x unchanged. Whether element i is kept depends only on (the model's seed, the op, the
 * model's training-step count, i), so every tiling, layout, rank count and worker kind drops
 * the same elements, and a step's backward, and MGRIT's repeated steps, see its forward's mask
 * (tsl_model_set_step()).
 */
TSL_API tsl_status tsl_graph_dropout(tsl_graph_t graph, int32_t x, double p, int32_t *value);

/** Losses a model's steps can minimise (tsl_model_set_loss(), tsl_graph_set_loss()). */
typedef enum tsl_model_loss_kind {
    /** softmax cross-entropy, per sample or per position (tsl_loss_cross_entropy()) */
    TSL_MODEL_LOSS_CROSS_ENTROPY = 0,
    /** soft Dice over the batch, smoothing 1 (tsl_loss_dice()): outputs with labels per
     *  position, at most 1024 classes */
    TSL_MODEL_LOSS_DICE = 1,
    /** mean squared error against float targets of the output's shape (tsl_loss_mse()) */
    TSL_MODEL_LOSS_MSE = 2,
    /** mean absolute error against float targets of the output's shape (tsl_loss_l1()) */
    TSL_MODEL_LOSS_L1 = 3,
    /** soft orthogonality of two values (a term with `against`; tsl_loss_difference()): the
     *  squared Frobenius norm of A^T B, A and B the batch's two values flattened per sample
     *  (batch x features), as the difference loss of domain separation networks; its gradient
     *  flows into both values */
    TSL_MODEL_LOSS_DIFFERENCE = 4,
    /** closeness of two values' distributions over the batch (a term with `against`;
     *  tsl_loss_similarity()): the squared maximum mean discrepancy with a Gaussian kernel
     *  mixture, as the similarity loss of domain separation networks between two domains'
     *  shared codes; the values have one number of features per sample, and the gradient flows
     *  into both */
    TSL_MODEL_LOSS_SIMILARITY = 5,
} tsl_model_loss_kind;

/** @brief The model-file and command-line name of a loss kind ("cross_entropy", "dice",
 *  "mse", "l1", "difference", "similarity"); NULL for an unknown kind. */
TSL_API const char *tsl_model_loss_name(tsl_model_loss_kind kind);

/** @brief The loss kind named @p name into @p kind; ::TSL_ERR_INVALID_ARG for an unknown name. */
TSL_API tsl_status tsl_model_loss_parse(const char *name, tsl_model_loss_kind *kind);

/** @brief 1 when the kind compares the output with float targets of its shape (MSE, L1: a
 *  regression loss), 0 when with class labels (cross-entropy, Dice). A model's terms are all
 *  of one family. */
TSL_API int tsl_model_loss_takes_targets(tsl_model_loss_kind kind);

/** Most terms of a model's loss. */
#define TSL_MAX_LOSS_TERMS 32

/**
 * One term of a model's loss: its kind, its weight (finite, > 0), the value it reads and what
 * it compares that value with. A zero-initialised term reads the output against the batch's
 * labels or float targets, as a model's loss always did.
 *
 * A term with @p against set compares value on (or the output) with another value of the
 * network. MSE and L1 take the other value as a constant target, of the same shape, as
 * PyTorch's `F.mse_loss(a, b.detach())` (a reconstruction against the input, a feature against
 * another layer's): the gradient flows into @p on's value and, through it, into every op that
 * made it. ::TSL_MODEL_LOSS_DIFFERENCE takes two values of any per-sample shapes and sends its
 * gradient into both; ::TSL_MODEL_LOSS_SIMILARITY two values with one number of features per
 * sample, its gradient into both. A term on another value than the output needs @p against (the
 * batch's labels and targets fit the output only).
 */
typedef struct tsl_loss_term {
    tsl_model_loss_kind kind;
    double weight;
    int32_t on;      /**< 0: the graph's output; else 1 + the value the term reads */
    int32_t against; /**< 0: the batch's labels or targets; else 1 + the value compared with */
} tsl_loss_term;

/**
 * @brief The loss a model built from the graph minimises (a model file's "losses"): @p count
 * terms (1 to ::TSL_MAX_LOSS_TERMS; kinds known, weights finite and above 0, at least one on the
 * batch's labels or targets and those all of one family, class labels or float targets; terms
 * between values as ::tsl_loss_term says, naming values of this graph other than its input for
 * @p on), or 0 for the default, cross-entropy alone. Models take it when created
 * (tsl_model_set_loss() checks it against the output then); the values the terms read are kept
 * from the forward to the loss (no fusion or release takes them).
 */
TSL_API tsl_status tsl_graph_set_loss(tsl_graph_t graph, int32_t count, const tsl_loss_term *terms);

/** @brief The graph's loss terms into @p terms (::TSL_MAX_LOSS_TERMS entries); *count 0
 *  when it names none. */
TSL_API tsl_status tsl_graph_loss(tsl_graph_t graph, int32_t *count, tsl_loss_term *terms);

/** @brief A run of residual steps of a graph (tsl_graph_ode_segments()). */
typedef struct tsl_ode_segment {
    int32_t input;        /**< u_0, the value the first step reads */
    int32_t output;       /**< u_N, the last step's output */
    int32_t first_op;     /**< the first op of the first step's F */
    int32_t last_op;      /**< the last step's add */
    int32_t steps;        /**< N */
    int32_t ops_per_step; /**< F's ops and the add */
    double h;             /**< the step size of every step */
} tsl_ode_segment;

/**
 * @brief The ODE segments of a graph, in op order: maximal runs of residual steps
 * u_{n+1} = u_n + h F_n(u_n) (tsl_graph_add_scaled(graph, F(u), u, h)) where F_n is the ops
 * between u_n's producer and the add, reading only u_n and each other, nothing outside the step
 * reads u_n or F_n's values, each step's output is the next step's input, and every step of a
 * run has the same h and the same F up to its parameters' values (op kinds, attributes, shapes).
 * A ReLU after the add (a classic residual block) ends its step's run: such blocks are segments
 * of one step. Up to @p max segments are written; @p count gets how many there are.
 */
TSL_API tsl_status tsl_graph_ode_segments(tsl_graph_t graph, int32_t max, tsl_ode_segment *segments,
                                          int32_t *count);

/** @brief Flatten (C, spatial...) to one feature dimension. */
TSL_API tsl_status tsl_graph_flatten(tsl_graph_t graph, int32_t x, int32_t *value);

/** @brief Fully connected layer on a flat value: `name.weight` (out, in), `name.bias`. */
TSL_API tsl_status tsl_graph_linear(tsl_graph_t graph, const char *name, int32_t x,
                                    int64_t out_features, int32_t bias, int32_t *value);

/** @brief Mark @p value as the network's output (logits). Exactly one output. */
TSL_API tsl_status tsl_graph_set_output(tsl_graph_t graph, int32_t value);

/**
 * @brief Put the op that makes @p value on pipeline stage @p stage of a plan with stages=
 * (tsl_plan_stages()); -1 clears it. Once any op has a stage, the graph's stages are used
 * instead of a computed split: an op without one is on its predecessor's stage (the input on
 * stage 0).
 */
TSL_API tsl_status tsl_graph_set_stage(tsl_graph_t graph, int32_t value, int32_t stage);

/** @brief The stage tsl_graph_set_stage() gave the op of @p value, or -1 when none. */
TSL_API int32_t tsl_graph_stage(tsl_graph_t graph, int32_t value);

/** @brief Forward flops of op @p index for @p batch samples (multiply-adds count 2). */
TSL_API tsl_status tsl_graph_op_flops(tsl_graph_t graph, int32_t index, int64_t batch,
                                      double *flops);

/** @brief Number of values (activations) in @p graph. Not NULL-safe for @p graph. */
TSL_API int32_t tsl_graph_value_count(tsl_graph_t graph);
/** @brief Number of ops in @p graph. Not NULL-safe for @p graph. */
TSL_API int32_t tsl_graph_op_count(tsl_graph_t graph);
/** @brief Number of parameters in @p graph. Not NULL-safe for @p graph. */
TSL_API int32_t tsl_graph_param_count(tsl_graph_t graph);

/** @brief Per-sample shape of a value. */
TSL_API tsl_status tsl_graph_value_shape(tsl_graph_t graph, int32_t value, tsl_shape *shape);

/** @brief The output value, or a negative status if none is set. */
TSL_API int32_t tsl_graph_output(tsl_graph_t graph);

/** @brief Name and shape of parameter @p index (in creation order); @p trainable is 0 for
 *  buffers (running statistics). Outputs may be NULL. */
TSL_API tsl_status tsl_graph_param_info(tsl_graph_t graph, int32_t index, const char **name,
                                        tsl_shape *shape, int32_t *trainable);

/** @brief The parameter whose values parameter @p index holds: @p index itself, or the
 *  parameter of the op its op shares them with (tsl_graph_share_params()); -1 when there is
 *  no parameter @p index. */
TSL_API int32_t tsl_graph_param_source(tsl_graph_t graph, int32_t index);

/** @brief Kind, name (may be "") and output value of op @p index (ops are in creation order,
 *  which is a topological order). */
TSL_API tsl_status tsl_graph_op_info(tsl_graph_t graph, int32_t index, tsl_op_kind *kind,
                                     const char **name, int32_t *output);

/**
 * @brief Estimates for a batch of @p batch samples: forward flops (multiply-adds count 2),
 * bytes of all activations (one float each), and bytes of the parameters and buffers.
 * Any output may be NULL.
 */
TSL_API tsl_status tsl_graph_estimate(tsl_graph_t graph, int64_t batch, double *forward_flops,
                                      int64_t *activation_bytes, int64_t *param_bytes);

/**
 * @brief A network of the model zoo for samples of shape (C, spatial...) (@p ndim entries)
 * and @p classes output classes, as a new graph (tsl_graph_destroy()). Names: see
 * tsl_zoo_names(); an unknown name or a sample the network cannot take (too small to pool,
 * wrong dimensionality) is an error that says so.
 */
TSL_API tsl_status tsl_zoo_graph(const char *name, int32_t ndim, const int64_t *sample_dims,
                                 int64_t classes, tsl_graph_t *graph);

/** @brief The zoo's network names, and a one-line description of each (same order). */
TSL_API const char *const *tsl_zoo_names(int32_t *count, const char *const **descriptions);

/** @brief Name of an op kind ("conv", ...), or "invalid". */
TSL_API const char *tsl_op_kind_name(tsl_op_kind kind);

/* ---- model files (docs/model-format.md) ---- */

/** Version of the model-file format that tsl_graph_write_json() writes and the newest that
 *  tsl_graph_read_json() reads. */
#define TSL_MODEL_FORMAT_VERSION 1

/**
 * @brief Build a graph from a model file: JSON describing the network's layers, their
 * attributes and their inputs by name (docs/model-format.md).
 *
 * A file adapts to the data as the zoo's networks do: the input layer takes the shape
 * @p sample_dims, a scalar attribute (`"kernel": 3`) stands for every spatial dimension, and
 * a conv, conv_transpose or linear layer may say `"out": "classes"` to take @p classes.
 * Every problem (malformed JSON with its line and column, an unknown op or key, a wrong type,
 * an unknown layer name, a shape the graph builder rejects) is an error whose message names
 * the file and the layer; nothing is returned then.
 * @param[in]  path        the model file
 * @param[in]  ndim        dimensions of a sample (C, spatial...): 1 to 4
 * @param[in]  sample_dims the sample's sizes, @p ndim entries
 * @param[in]  classes     the data's class count; 0 when unknown (a file that asks for it
 *                         is then an error)
 * @param[out] graph       the new graph (tsl_graph_destroy())
 * @return TSL_OK, TSL_ERR_IO (the file cannot be read), TSL_ERR_FORMAT (malformed or not a
 *         model file), TSL_ERR_UNSUPPORTED (a newer format version), or the graph builder's
 *         status (TSL_ERR_SHAPE, TSL_ERR_INVALID_ARG) for a layer it rejects
 */
TSL_API tsl_status tsl_graph_read_json(const char *path, int32_t ndim, const int64_t *sample_dims,
                                       int64_t classes, tsl_graph_t *graph);

/** @brief tsl_graph_read_json() from the text of a model file (NUL-terminated). */
TSL_API tsl_status tsl_graph_parse_json(const char *text, int32_t ndim, const int64_t *sample_dims,
                                        int64_t classes, tsl_graph_t *graph);

/**
 * @brief Write @p graph as a model file, atomically (a temporary file in the same folder,
 * renamed over @p path). Reading it back (tsl_graph_read_json()) with the graph's sample
 * shape and, as class count, the output's channels gives the same graph: ops, attributes,
 * names, value shapes and parameters. The input's shape is not written (it comes from the
 * data), the layer that makes the output is written with `"out": "classes"`, and unnamed
 * layers that later layers read get names of their own (`relu_3`); attributes left at their
 * defaults are left out.
 * @return TSL_OK, TSL_ERR_INVALID_ARG (NULL, or an infinite batch-norm eps: JSON has no
 *         infinities), TSL_ERR_STATE (no output set), TSL_ERR_IO
 */
TSL_API tsl_status tsl_graph_write_json(tsl_graph_t graph, const char *path);

/** @brief tsl_graph_write_json() into a new NUL-terminated string @p text (free it with
 *  tsl_free(), tessel/io.h). */
TSL_API tsl_status tsl_graph_print_json(tsl_graph_t graph, char **text);

/**
 * @brief The network @p name_or_path for the data: a model file when the text names one
 * (it contains '/' or ends in ".json"; tsl_graph_read_json()), a network of the zoo otherwise
 * (tsl_zoo_graph()). What `tessel train --model` takes.
 */
TSL_API tsl_status tsl_model_graph(const char *name_or_path, int32_t ndim,
                                   const int64_t *sample_dims, int64_t classes, tsl_graph_t *graph);

#ifdef __cplusplus
}
#endif

#endif /* TESSEL_GRAPH_H */
