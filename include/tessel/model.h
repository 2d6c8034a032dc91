/**
 * @file model.h
 * @brief A model: a graph (tessel/graph.h) bound to a context, with its parameters as tiled
 *        tensors, run as tile tasks: training steps (forward, softmax cross-entropy loss,
 *        backward derived from the graph, optimizer update), evaluation, parameter files.
 *
 * Activations are cut into sample tiles, one per CPU worker of every rank by default, with
 * contiguous runs of tiles per rank (data parallelism falls out of the owner map); a plan
 * (tessel/plan.h) adds sample groups, spatial tiles and pipeline stages. Large weights are
 * sharded over their stage's ranks (gradients reduced shard by shard onto the owners, updated
 * there and read back by every rank); small ones have a copy per rank, refreshed in packed
 * messages. Backward: ops are visited in reverse creation order; each op's backward writes
 * the gradients of its inputs, and a value read by several ops accumulates their
 * contributions. Every call is collective. Batch data comes either as arrays on rank 0 (NULL
 * elsewhere; tsl_model_train_step()) or from a dataset that every rank reads its own tiles of
 * (tsl_model_train_step_read()).
 */
#ifndef TESSEL_MODEL_H
#define TESSEL_MODEL_H

#include <stdint.h>

#include "tessel/context.h"
#include "tessel/data.h"
#include "tessel/export.h"
#include "tessel/graph.h"
#include "tessel/ops.h"
#include "tessel/plan.h"
#include "tessel/status.h"
#include "tessel/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/** A model. */
typedef struct tsl_model *tsl_model_t;

/**
 * @brief Bind @p graph (which must have its output set; it is copied, so the caller may free
 * it) to @p ctx and initialise the parameters from @p seed as PyTorch does: convolution and
 * linear weights and biases U(-1/sqrt(fan_in), 1/sqrt(fan_in)), batch-norm weights 1, biases
 * 0, running means 0 and variances 1. Same seed, same parameters, whatever the rank count.
 */
TSL_API tsl_status tsl_model_create(tsl_model_t *model, tsl_context_t ctx, tsl_graph_t graph,
                                    uint64_t seed);

/**
 * @brief As tsl_model_create(), with activations tiled and owned as @p plan says
 * (tessel/plan.h; NULL: as tsl_model_create()). The plan must run on the context's rank
 * count. data=D cuts samples into D groups; space=AxBxC cuts the spatial dimensions over an
 * A x B x C rank grid (tiles=T more along the longest), with halo exchange in convolutions,
 * pooling and upsampling and exact batch-norm statistics and losses over all tiles; a tensor
 * smaller than the wanted tiles gets one tile per position, and an op whose input and output
 * grids then differ moves its input first. Values without spatial dimensions (after flatten)
 * keep sample tiles. stages=S puts runs of consecutive layers on their own rank groups, with
 * micro= sample tiles flowing through them. Same seed, same parameters, whatever the plan;
 * results equal the one-rank run within rounding.
 */
TSL_API tsl_status tsl_model_create_plan(tsl_model_t *model, tsl_context_t ctx, tsl_graph_t graph,
                                         uint64_t seed, const tsl_plan *plan);

/**
 * @brief Measure what the performance model (tsl_plan_predict(), tsl_plan_search()) needs for
 * @p graph on this context's ranks and workers. Collective. Models of @p graph (parameters
 * seeded with 1, plain SGD) each train one warm-up step and then @p steps steps on batches of
 * @p batch random samples and labels with a task trace on (a trace already on is dropped; none
 * is on afterwards): with the default plan, with data=R,micro=4 (the same work in 4 times the
 * tiles) and, for samples with spatial dimensions, with space=R on R > 1 ranks (every sample
 * cut across the ranks along its first spatial dimension: convolutions and pooling on windows,
 * halos exchanged between ranks) or, on one rank or where space=R does not fit, with
 * data=R,tiles=2 (every sample cut in two), and on R > 1 ranks with filters=R where R divides some
 * convolution's channels (output-channel tiles) and then with channels=R (input-channel tiles)
 * where that plan fits too, and for samples of 2 or 3 spatial dimensions on R > 1 ranks with the
 * samples cut across the ranks along their last spatial dimension; where the backward can make a
 * norm's fused ReLU output again (tsl_graph_recomputed()), the first two with recompute=1, those
 * remaking tasks timed apart. op_seconds[o] is the run time of op o's tasks, forward and backward
 * (the loss's with the output's producer), summed over every rank and worker, per sample, under the
 * default plan; op_seconds[nops + o] the same on windows (costs-> op_seconds_windowed points there;
 * NULL without spatial dimensions); op_seconds[2 nops + o] on channel tiles
 * (costs->op_seconds_channels; NULL when not measured); op_seconds[3 nops + o] the remaking of norm
 * o's ReLU output in the default run (costs->op_seconds_recompute; NULL, all 0, where nothing is
 * remade); op_seconds[4 nops + o] on input-channel tiles (costs->op_seconds_input_channels; NULL,
 * the output-channel costs, when not measured); op_seconds[5 nops + o] on windows cut along the
 * last spatial dimension (costs->op_seconds_windowed_last; NULL, the windows', when not measured).
 * costs->task_seconds is
 * the busy time and the workers' time outside tasks that the finer tiles added per task they
 * added; costs->wait_seconds the rest of the default run's time outside tasks, per worker and
 * step (waits that do not grow with the tasks: between ranks, at dependencies; every traced step
 * is waited for, and each rank's median step counts, averaged over the ranks), and
 * costs->wait_seconds_windowed the same of the windows' run (0 without spatial dimensions);
 * costs->latency and
 * costs->bandwidth from tsl_context_measure_link(). Every rank gets rank 0's numbers.
 * @param[out] op_seconds 6 x tsl_graph_op_count() entries (costs->op_seconds points at it)
 */
TSL_API tsl_status tsl_model_calibrate(tsl_context_t ctx, tsl_graph_t graph, int64_t batch,
                                       int32_t steps, double *op_seconds, tsl_plan_costs *costs);

/**
 * @brief The network between ranks 0 and 1 by a ping-pong on the context's control
 * communicator: @p latency half the round trip of 8-byte messages (200 of them), @p bandwidth
 * 4 MiB messages' bytes per second beyond that latency (8 of them); both 0 on one rank. Every
 * rank gets rank 0's numbers. Collective.
 */
TSL_API tsl_status tsl_context_measure_link(tsl_context_t ctx, double *latency, double *bandwidth);

/** @brief Wait for the model's tasks and free it (NULL is a no-op). */
TSL_API tsl_status tsl_model_destroy(tsl_model_t model);

/** @brief Parameter @p index (graph order) and its gradient tensor (NULL for buffers such as
 *  running statistics). Either output may be NULL. Not collective. */
TSL_API tsl_status tsl_model_param(tsl_model_t model, int32_t index, tsl_tensor_t *param,
                                   tsl_tensor_t *grad);

/**
 * @brief One training step on a batch of @p batch samples: forward in training mode, mean
 * softmax cross-entropy against @p labels (one per sample for a (classes) output, one per
 * position for a (classes, spatial...) output), backward, and @p opt's update of every
 * trainable parameter. @p x is (batch, sample shape) f32 and @p labels i64, both on rank 0
 * (ignored elsewhere). @p loss (the batch mean) and @p correct (argmax hits) are returned on
 * every rank; either may be NULL.
 */
TSL_API tsl_status tsl_model_train_step(tsl_model_t model, int64_t batch, const float *x,
                                        const int64_t *labels, tsl_optimizer_t opt, double *loss,
                                        int64_t *correct);

/**
 * @brief tsl_model_train_step() for a model whose loss compares its output with float targets
 * (MSE, L1; tsl_model_set_loss()): @p targets is (batch, output shape) f32 on rank 0 (ignored
 * elsewhere), scattered into tiles laid out as the output's. The model's other steps take
 * targets as tensors of tsl_model_label_dtype() (f32) and the output's shape
 * (tsl_model_train_step_tensors()), or read from a dataset of float targets (an `.npy`
 * directory whose y is f32) by the dataset steps.
 */
TSL_API tsl_status tsl_model_train_step_targets(tsl_model_t model, int64_t batch, const float *x,
                                                const float *targets, tsl_optimizer_t opt,
                                                double *loss);

/**
 * @brief tsl_model_train_step() on samples indices[0 .. batch - 1] of @p dataset, each rank
 * reading only the boxes of the samples its input and label tiles hold
 * (tsl_tensors_read_samples()): no rank holds or sends a whole batch, and a sample larger
 * than one process's memory can be trained on. Collective: every rank passes the same
 * indices and its own opened copy of the same dataset, whose sample and label shapes fit the
 * model. A sample that cannot be read is an error on every rank, returned before the
 * optimizer changes any parameter (batch-norm running statistics of that forward may have
 * taken its NaN values).
 */
TSL_API tsl_status tsl_model_train_step_read(tsl_model_t model, tsl_dataset_t dataset,
                                             int64_t batch, const int64_t *indices,
                                             tsl_optimizer_t opt, double *loss, int64_t *correct);

/**
 * @brief tsl_model_train_step_read() that also reads the next step's batch ahead: before this
 * step's own tasks it starts reading samples next[0 .. batch - 1] of @p dataset (NULL: none)
 * into spare input and label tiles, so the reading runs beside this step (on the CPU workers
 * while the GPUs compute, or on workers the step leaves idle) instead of before the next one.
 * The next training step whose dataset, batch and indices equal them takes those tiles instead
 * of reading (on every rank, or on none); a training step with other indices reads as usual
 * and a later read-ahead replaces one no step took. Results are the bits of
 * tsl_model_train_step_read(). A sample of the read-ahead that cannot be read is the error of
 * the step that takes it, before that step changes any parameter. The dataset must stay open
 * until that step, the next read-ahead or tsl_model_destroy(). One more input and label tensor
 * per rank (the spare tiles). Collective.
 */
TSL_API tsl_status tsl_model_train_step_read_next(tsl_model_t model, tsl_dataset_t dataset,
                                                  int64_t batch, const int64_t *indices,
                                                  const int64_t *next, tsl_optimizer_t opt,
                                                  double *loss, int64_t *correct);

/** @brief Forward in inference mode (running statistics) and the loss and argmax hits of one
 *  batch, as tsl_model_train_step() without changing anything. */
TSL_API tsl_status tsl_model_evaluate(tsl_model_t model, int64_t batch, const float *x,
                                      const int64_t *labels, double *loss, int64_t *correct);

/** @brief tsl_model_evaluate() for a model whose loss takes float targets
 *  (tsl_model_train_step_targets()). */
TSL_API tsl_status tsl_model_evaluate_targets(tsl_model_t model, int64_t batch, const float *x,
                                              const float *targets, double *loss);

/** @brief tsl_model_evaluate() on samples indices[0 .. batch - 1] of @p dataset, read as
 *  by tsl_model_train_step_read(). */
TSL_API tsl_status tsl_model_evaluate_read(tsl_model_t model, tsl_dataset_t dataset, int64_t batch,
                                           const int64_t *indices, double *loss, int64_t *correct);

/** @brief tsl_model_evaluate_read() with the read-ahead of
 *  tsl_model_train_step_read_next(): takes the batch if the read-ahead holds it, and starts
 *  reading @p next (NULL: none) while this evaluation runs. Collective. */
TSL_API tsl_status tsl_model_evaluate_read_next(tsl_model_t model, tsl_dataset_t dataset,
                                                int64_t batch, const int64_t *indices,
                                                const int64_t *next, double *loss,
                                                int64_t *correct);

/**
 * @brief The loss the model's training and evaluation steps compute: the weighted sum of
 * @p count terms (1 to ::TSL_MAX_LOSS_TERMS) on its output and labels, or between two of its
 * values (::tsl_loss_term); its gradient is the weighted sum of the terms' (each exact and
 * tiling-independent, as the loss functions are). The steps report this sum. Default: the
 * graph's (tsl_graph_set_loss(), a model file's "losses"), else cross-entropy alone, weight 1.
 * Checked against the model before anything changes (Dice needs labels per position; a value a
 * term reads must be one the model keeps: the graph's own terms are, while a value fused into
 * its batch norm's ReLU, a folded concatenation or a value inside an MGRIT segment is not).
 * Every rank must set the same loss.
 */
TSL_API tsl_status tsl_model_set_loss(tsl_model_t model, int32_t count, const tsl_loss_term *terms);

/**
 * @brief The dtype of a model's label tensors (tsl_model_train_step_tensors()): the graph's
 * (tsl_graph_label_dtype() of its classes: u8 up to 256 classes, else i32); f32 for a loss on
 * float targets (MSE, L1), whose label tensors are (batch, output shape) targets.
 */
TSL_API tsl_dtype tsl_model_label_dtype(tsl_model_t model);

/**
 * @brief The model's count of training forwards (each tsl_model_gradients(), training step, or
 * tsl_model_forward() with train set adds one): with the model's seed it draws the dropout
 * masks (tsl_graph_dropout()). 0 when the model is made.
 */
TSL_API tsl_status tsl_model_step(tsl_model_t model, int64_t *step);

/**
 * @brief Set the count of training forwards (tsl_model_step()), to resume a run exactly: the
 * next training forward draws the masks of step @p step (at least 0). Every rank must set the
 * same.
 */
TSL_API tsl_status tsl_model_set_step(tsl_model_t model, int64_t step);

/**
 * @brief How many ODE segments the model's plan solves by MGRIT (plan levels= > 1; see
 * tessel/plan.h): 0 otherwise.
 */
TSL_API int32_t tsl_model_mgrit_segments(tsl_model_t model);

/**
 * @brief The residual norms of MGRIT segment @p segment in the last step (forward, or with
 * @p backward the adjoint): one per V-cycle, the 2-norm over the fine C-points of
 * Phi(u_{kM-1}) - u_{kM} before the cycle's coarse correction, each an exact sum of squares
 * (the same bits for every tiling and rank count), read once at the end of the step (a forward
 * or evaluation alone reads its norms at the start of the next one, so a training step's are
 * what this gives). Up to @p max into @p norms; *count gets how many there are (0 before the
 * first step). The same on every rank; not collective.
 */
TSL_API tsl_status tsl_model_mgrit_residuals(tsl_model_t model, int32_t segment, int32_t backward,
                                             int32_t max, double *norms, int32_t *count);

/**
 * @brief tsl_model_train_step() on a batch held in tiled tensors that the application owns,
 * in the model's context: @p x (batch, sample shape) f32 and @p labels (batch, label shape) of
 * tsl_model_label_dtype(), of any tile grids, owner maps and layouts. Their tiles are copied
 * into the model's tiling by tile tasks (tsl_tensor_redistribute(): only tiles that change
 * owner cross the network, nothing is gathered), after the tasks the application submitted
 * on them and before any it submits later; they are only read. Collective.
 */
TSL_API tsl_status tsl_model_train_step_tensors(tsl_model_t model, tsl_tensor_t x,
                                                tsl_tensor_t labels, tsl_optimizer_t opt,
                                                double *loss, int64_t *correct);

/** @brief tsl_model_evaluate() on tensors, as tsl_model_train_step_tensors() takes them. */
TSL_API tsl_status tsl_model_evaluate_tensors(tsl_model_t model, tsl_tensor_t x,
                                              tsl_tensor_t labels, double *loss, int64_t *correct);

/**
 * @brief Forward only (training mode when @p train) from the application's tensor @p x into
 * its tensor @p out (batch, output shape) f32, any tiling: the output goes from the model's
 * tiles to @p out's owners by tile tasks, never whole to one rank. Collective.
 */
TSL_API tsl_status tsl_model_forward_tensors(tsl_model_t model, tsl_tensor_t x, int32_t train,
                                             tsl_tensor_t out);

/**
 * @brief tsl_model_forward_tensors() for several values of the network at once: one forward
 * from @p x, then value values[k] (a value id of the model's graph: its output, or any other
 * value the model keeps, as a loss term's; the input too) into the application's tensor
 * outs[k], (batch, that value's shape) f32, any tiling, by tile tasks (nothing gathered): the
 * heads of a network with several, a decoder's reconstruction beside a classifier's logits,
 * features for the application's own use. @p count is 1 to 64, values distinct. A value the
 * model fuses away (a batch or group norm's output with its ReLU fused), a folded
 * concatenation, or a value inside an MGRIT segment is an error before anything runs.
 * Collective: every rank passes the same values and the same tensors.
 */
TSL_API tsl_status tsl_model_forward_values_tensors(tsl_model_t model, tsl_tensor_t x,
                                                    int32_t train, int32_t count,
                                                    const int32_t *values, tsl_tensor_t *outs);

/**
 * @brief tsl_model_train_step_tensors() for a model of several inputs (tsl_graph_add_input()):
 * @p xs holds @p count tensors, one per input of the graph in its order (count =
 * tsl_graph_input_count()), each (batch, that input's sample shape) f32 of any tiling, one
 * batch size for all; @p labels as tsl_model_train_step_tensors() takes them. Works for a
 * model of one input too. The dataset steps read every input (tsl_dataset_input_shape());
 * the calls that take x as an array or one tensor refuse a model of several inputs.
 * Collective.
 */
TSL_API tsl_status tsl_model_train_step_inputs(tsl_model_t model, int32_t count,
                                               const tsl_tensor_t *xs, tsl_tensor_t labels,
                                               tsl_optimizer_t opt, double *loss, int64_t *correct);

/** @brief tsl_model_evaluate_tensors() for a model of several inputs, @p xs as
 *  tsl_model_train_step_inputs() takes them. */
TSL_API tsl_status tsl_model_evaluate_inputs(tsl_model_t model, int32_t count,
                                             const tsl_tensor_t *xs, tsl_tensor_t labels,
                                             double *loss, int64_t *correct);

/** @brief tsl_model_forward_values_tensors() for a model of several inputs: @p ninputs
 *  tensors @p xs as tsl_model_train_step_inputs() takes them (the output is one of the
 *  values it can ask for). */
TSL_API tsl_status tsl_model_forward_values_inputs(tsl_model_t model, int32_t ninputs,
                                                   const tsl_tensor_t *xs, int32_t train,
                                                   int32_t count, const int32_t *values,
                                                   tsl_tensor_t *outs);

/** @brief Forward only (training mode when @p train, else inference) and the output gathered
 *  on rank 0 into @p out (batch x output shape floats; ignored elsewhere). */
TSL_API tsl_status tsl_model_forward(tsl_model_t model, int64_t batch, const float *x,
                                     int32_t train, float *out);

/**
 * @brief Only the forward, loss and backward of a training step (no update): the gradients
 * are then in tsl_model_param()'s grad tensors. For tests and gradient checks.
 */
TSL_API tsl_status tsl_model_gradients(tsl_model_t model, int64_t batch, const float *x,
                                       const int64_t *labels, double *loss);

/** @brief tsl_model_gradients() for a model whose loss takes float targets
 *  (tsl_model_train_step_targets()). */
TSL_API tsl_status tsl_model_gradients_targets(tsl_model_t model, int64_t batch, const float *x,
                                               const float *targets, double *loss);

/** @brief Write every parameter and buffer as DIR/NAME.npy (PyTorch state_dict names and
 *  layouts), creating DIR if needed. Each file is written atomically. */
TSL_API tsl_status tsl_model_save_params(tsl_model_t model, const char *dir);

/** @brief Read every parameter and buffer from DIR/NAME.npy; a missing file or a file of the
 *  wrong dtype or shape is an error naming it, and leaves the parameters unchanged. */
TSL_API tsl_status tsl_model_load_params(tsl_model_t model, const char *dir);

/**
 * @brief Write a training checkpoint into @p dir (created if needed): every parameter and
 * buffer as DIR/NAME.npy (as tsl_model_save_params()) and @p opt's state for the trainable
 * parameters in DIR/optimizer (tsl_optimizer_save_state()). Each file is written atomically;
 * making the whole directory appear at once is the caller's part (write it under a
 * temporary name and rename it, as `tessel train --checkpoint` does). Collective.
 */
TSL_API tsl_status tsl_model_save_checkpoint(tsl_model_t model, tsl_optimizer_t opt,
                                             const char *dir);

/**
 * @brief Load what tsl_model_save_checkpoint() wrote: parameters, buffers and optimizer
 * state, so that the next training step is the one the saving run took next. Every file is
 * read and checked first; a missing or mismatched file is an error naming it and changes
 * nothing. Collective.
 */
TSL_API tsl_status tsl_model_load_checkpoint(tsl_model_t model, tsl_optimizer_t opt,
                                             const char *dir);

#ifdef __cplusplus
}
#endif

#endif /* TESSEL_MODEL_H */
