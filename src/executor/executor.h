/* What the executor's files share (src/executor/): the model and its instances, the execution
 * table, and the helpers its rows and passes call. Never installed. */
#ifndef TESSEL_SRC_EXECUTOR_H
#define TESSEL_SRC_EXECUTOR_H

#include "graph_internal.h"
#include "plan_internal.h"
#include "internal.h"
#include "lower/halo.h"
#include "tessel/io.h"
#include "tessel/model.h"
#include "tessel/plan.h"

#define MAX_INSTANCES 4

/* Most MGRIT levels, and iterations whose residual norms a step reports. */
#define TSL_MGRIT_MAX_LEVELS 16
#define TSL_MGRIT_MAX_ITERS 64

/* An ODE segment the plan solves by MGRIT (levels= > 1, tsl_mgrit_plan()). */
typedef struct tsl_mgrit_segment {
    tsl_ode_segment s;
    int32_t index; /* in the model's mg[] */
    /* The residual norms of the last step: forward (it < iters) and backward iterations,
     * read at the end of the step (tsl_mgrit_finish()); pending: the exact sums' handles. */
    double res[2][TSL_MGRIT_MAX_ITERS];
    int32_t nres[2];
    starpu_data_handle_t pending[2][TSL_MGRIT_MAX_ITERS];
    int32_t npending[2];
} tsl_mgrit_segment;

typedef struct instance {
    int64_t batch;
    tsl_tensor_t *act;       /* [nvalues] */
    tsl_tensor_t *grad;      /* [nvalues]; NULL for the input */
    tsl_tensor_t *scratch;   /* [nvalues]; made when a value's gradient needs accumulating */
    tsl_tensor_t *flat;      /* [nvalues]: a spatially tiled value cut along N only (flatten) */
    tsl_tensor_t *rx, *ry;   /* [nops]: input and output on a common tile grid, when the op's
                                input and output grids differ (see needs_regrid) */
    tsl_tensor_t *rdx, *rdy; /* [nops]: their gradients */
    tsl_tensor_t *rin;       /* [nops * TSL_GRAPH_MAX_INPUTS]: an element-wise op's inputs on the
                                tile grid of its output (or, in the backward, of the gradient it
                                makes), where theirs differ: the model's output, whole channels,
                                beside channel tiles of filters= */
    tsl_tensor_t *saved;     /* [nops]: batch-norm and group-norm statistics */
    tsl_tensor_t *pidx;      /* [nops]: a max pooling's indices, from forward to backward */
    tsl_tensor_t *mask;      /* [nops]: a dropout's uniform draws, from forward to backward */
    uint64_t dropout_step;   /* the model's step count when its last training forward began */
    tsl_halo_keep *keep;     /* [nops * TSL_GRAPH_MAX_INPUTS]: a convolution's input halo slabs
                                (one set per part of a folded concatenation), forward to backward */
    tsl_tensor_t labels;
    uint8_t *written;  /* [nvalues]: gradient already holds a contribution this step */
    uint8_t *dropped;  /* [nvalues]: dropped after the forward, to make again for the backward
                          (tsl_graph_recomputed) */
    tsl_tensor_t **mg; /* [2 x model's nmg]: each MGRIT segment's coarse points and right-hand
                          sides, forward and adjoint (mgrit.c), made on first use */
    tsl_tensor_t against[TSL_MAX_LOSS_TERMS]; /* a loss term's target value on the tile grid
                                                 and layout of the value it compares */
} instance;

struct tsl_model {
    struct tsl_context *ctx;
    struct tsl_graph *g;
    tsl_tensor_t *params; /* [nparams] */
    tsl_tensor_t *pgrads; /* [nparams]; NULL for buffers */
    tsl_plan plan;
    tsl_domain_owners domain_owners; /* the input's owner map's data where the plan cuts the
                                        input by domains (tsl_plan_value_tiling()) */
    int has_plan;                    /* else sample tiles over all ranks and workers */
    int32_t *op_stage;               /* [nops]: each op's pipeline stage (tsl_plan_stages()) */
    /* Small trainable parameters with a whole copy per rank of their stage, refreshed in one
     * packed message per owner (tsl_plan_buckets()); buckets of their gradients. */
    int32_t *replicated; /* [nparams] */
    struct tsl_bucket **buckets;
    int32_t nbuckets;
    int32_t *relu_of;  /* [nops]: the ReLU fused into batch-norm op o (tsl_graph_fused_relu()),
                          or -1 */
    uint8_t *fused;    /* [nops]: a ReLU that its batch norm computes */
    uint8_t *defers;   /* [nops]: a later stage's layer making its weights' gradients last
                          (tsl_graph_defers_weights(), with stages) */
    int32_t *fold;     /* [nops]: the convolution that reads concatenation o's parts in place
                          (tsl_graph_folded_concat()), or -1 */
    int32_t recompute; /* the plan's recompute= */
    tsl_loss_term loss[TSL_MAX_LOSS_TERMS]; /* what the steps minimise (tsl_model_set_loss) */
    int32_t nloss;
    int32_t targets; /* the loss compares the output with float targets (MSE, L1), the labels
                      * tensors being f32 targets of the output's shape and tiling */
    instance inst[MAX_INSTANCES];
    int32_t ninst;
    int32_t next_evict;
    /* The read-ahead (tsl_model_train_step_read_next()): a coming step's batch read into
     * spare input and label tiles while the steps before it run. ahead_indices (NULL: none
     * pending) are the samples of ahead_dataset in ahead_x and ahead_labels, made for batches
     * of ahead_batch; their reads count in ahead_reads[ahead_group]. The step that takes them
     * swaps them with its instance's input and labels (the instance's become the spares) and
     * checks that group, while the next read-ahead counts in the other. */
    tsl_tensor_t ahead_x, ahead_labels;
    tsl_tensor_t ahead_more[TSL_GRAPH_MAX_GRAPH_INPUTS]; /* further inputs' (k >= 1) */
    int64_t ahead_batch;
    tsl_dataset_t ahead_dataset;
    int64_t *ahead_indices;
    tsl_read_group ahead_reads[2];
    int32_t ahead_group;
    uint64_t seed;         /* tsl_model_create_plan()'s: dropout draws from it */
    uint64_t step;         /* training forwards so far (tsl_model_set_step()) */
    tsl_mgrit_segment *mg; /* the segments MGRIT solves (levels= > 1) */
    int32_t nmg;
    uint8_t *keep; /* [nvalues]: values a forward keeps for its caller (forward_values) */
};

/* ---- the execution table (exec_table.c) ---- */

/* Forward of op i from x (its first input, on y's tile grid when the op regrids) into y. */
typedef tsl_status (*forward_fn)(struct tsl_model *m, instance *in, int32_t i, tsl_tensor_t x,
                                 tsl_tensor_t y, int train);
/* Backward of op i: dx[k] (NULL: not wanted) for the values it reads (tsl_graph_exec_inputs),
 * and its parameters' gradients. */
typedef tsl_status (*backward_fn)(struct tsl_model *m, instance *in, int32_t i, tsl_tensor_t x,
                                  tsl_tensor_t y, tsl_tensor_t dy, tsl_tensor_t *dx);

typedef struct tsl_exec_row {
    forward_fn forward;
    backward_fn backward; /* NULL: nothing to do (the input) */
} tsl_exec_row;

/* One row per op kind (TSL_OP_KIND_COUNT rows, asserted where it is defined). */
extern const tsl_exec_row tsl_exec_table[];

/* ---- instances, passes and the helpers the rows share ---- */

/* A (batch, sample...) tensor of pipeline stage `stage` tiled and owned as the plan says
 * (tsl_plan_tensor_tiling(): sample tiles over the stage's ranks and workers without a
 * spatial plan; otherwise sample groups and spatial tiles over its rank grid). Spatial
 * dimensions of `sample` start at `first` (1 after channels, 0 for per-position labels;
 * sample->ndim for "none": sample tiles). */
tsl_status tsl_exec_batch_tensor(struct tsl_model *m, int64_t batch, int32_t stage,
                                 const tsl_shape *sample, int first, tsl_dtype dtype,
                                 tsl_tensor_t *out);

/* The input (x) and labels tensors of an instance for `batch`, as tiled and owned as the
 * instance's (the read-ahead's spare tiles are made by it too). */
tsl_status tsl_exec_input_tensors(struct tsl_model *m, int64_t batch, tsl_tensor_t *x,
                                  tsl_tensor_t *labels);

/* Whether op o's input and output must move to a common tile grid: convolutions, pooling
 * and upsampling pair output tile i with input tile i, and a plan's spatial tiles are capped
 * by each tensor's size, so the grids differ where a size falls below the wanted tiles. */
int tsl_exec_needs_regrid(const tsl_graph_op *o, tsl_tensor_t x, tsl_tensor_t y);

/* `like`'s shape on the common grid of op o's x and y (the fewer tiles per spatial dimension;
 * whole channels, except for a pooling whose x and y have the same channel tiles, which keeps
 * them: its planes are independent, so each channel group gathers only its own), in *slot
 * (made on first use); NULL in *out when `like` already has that grid. */
tsl_status tsl_exec_on_common_grid(struct tsl_model *m, const tsl_graph_op *o, tsl_tensor_t like,
                                   tsl_tensor_t x, tsl_tensor_t y, tsl_tensor_t *slot,
                                   tsl_tensor_t *out);

/* A calibration run's waits (tsl_model_calibrate()): the median over its first 64 traced steps
 * of a step's idle worker time beyond `per_task` for each of its tasks. */
double tsl_calibration_step_waits(const double *step_idle, const double *step_tasks, int32_t steps,
                                  double per_task);

/* The op's parameter slot k (weight 0, bias 1, running mean 2, running var 3), or NULL. */
tsl_tensor_t tsl_exec_op_param(struct tsl_model *m, const tsl_graph_op *o, int k, int grad);

/* The pipeline stage of value v: its producer's. */
int32_t tsl_exec_value_stage(const struct tsl_model *m, int32_t v);

/* Batch-norm op i on x, with its ReLU when fused (into the ReLU's output; inference then
 * applies the ReLU in place). */
tsl_status tsl_exec_batchnorm_forward(struct tsl_model *m, instance *in, int32_t i, tsl_tensor_t x,
                                      int train);

/* The inputs of convolution op i into xs, returning their count: the parts of the
 * concatenation it reads in place (tsl_graph_folded_concat()), else x. */
int32_t tsl_exec_conv_inputs(struct tsl_model *m, instance *in, int32_t i, tsl_tensor_t x,
                             tsl_tensor_t *xs);

/* Whether flatten must go through sample tiles (tsl_exec_flat_of) rather than copy tile i of x
 * into tile i of y: either is spatially cut, their sample tiles differ (a plan's sample groups
 * against the sample tiles of values without space), or their channel and feature tiles. */
int tsl_exec_flat_needed(tsl_tensor_t x, tsl_tensor_t y);

/* Op i's layer label in traces: its name, or "<kind>#<i>" for an unnamed op (in buf). */
const char *tsl_exec_op_label(const struct tsl_model *m, int32_t i, char *buf, size_t size);

/* The layer label in traces of norm op i's remaking of its ReLU output in the backward
 * (recompute=1): "<op i's label> (recompute)", in buf (TSL_GRAPH_NAME_MAX + 16 bytes hold it). */
const char *tsl_exec_remake_label(const struct tsl_model *m, int32_t i, char *buf, size_t size);

/* Value v cut along N only (flatten's way between tilings that do not match): made on first
 * use. */
tsl_status tsl_exec_flat_of(struct tsl_model *m, instance *in, int32_t v, tsl_tensor_t *t);

/* Max pooling op i's indices for its output y as the op computes it (made on first use):
 * training keeps them instead of the input (tsl_graph_op_reads_input_backward()). */
tsl_status tsl_exec_indices_of(struct tsl_model *m, instance *in, int32_t i, tsl_tensor_t y);

/* This instance's spare tensor shaped like value v (made on first use). */
tsl_status tsl_exec_scratch_of(struct tsl_model *m, instance *in, int32_t v, tsl_tensor_t *t);

/* *t again with its channels in one tile (same owners' map: filter group 0), if cut: the
 * graph's output, its gradient, scratch and targets (the losses read whole channels). */
tsl_status tsl_exec_channels_whole(struct tsl_model *m, tsl_tensor_t *t);

/* Whether the plan pipelines micro-batches (their tasks then go in sample order). */
int tsl_exec_pipelined(const struct tsl_model *m);

/* 1 when one of the model's loss terms reads value v (as the value it compares or as its
 * target): the forward keeps v to the loss. */
int tsl_exec_loss_reads(const struct tsl_model *m, int32_t v);

/* Why the model does not make value v whole (its batch or group norm's ReLU is fused, a folded
 * concatenation, a value inside an MGRIT segment: u_N, the segment's output, is made), or NULL
 * when it does. */
const char *tsl_exec_value_not_kept(const struct tsl_model *m, int32_t v);

/* Whether training drops value v after its last forward reader and makes it again for the
 * backward (tsl_graph_recomputed()). */
int tsl_exec_recomputed(const struct tsl_model *m, int32_t v);

/* Whether a tensor is cut along a spatial dimension (from dimension 2). */
int tsl_exec_spatially_cut(tsl_tensor_t t);

/* Bring every sharded weight's whole copies, and every shared op's parameters (copies of their
 * sources', tsl_graph_share_params()), up to date: at the start of every forward, so
 * whatever wrote the weights before (the optimizer, a load, the caller through
 * tsl_model_param) is seen, and every rank decides alike (tsl_model_param is not
 * collective, so the model cannot know on every rank whether a caller wrote). */
tsl_status tsl_exec_sync_replicas(struct tsl_model *m);

/* The gradients of shared ops' parameters (tsl_graph_share_params()) added to their sources',
 * in parameter order, after the backward and its reductions: the source's gradient is then
 * the sum over every op that uses it, as PyTorch accumulates a module called twice. */
tsl_status tsl_exec_add_shared_grads(struct tsl_model *m);

void tsl_exec_instance_free(struct tsl_model *m, instance *in);

/* Without training nothing reads an activation after its last reader: it is released then
 * (all but the output), so inference holds a few layers' activations at a time. Training
 * releases there the activations no backward reads (tsl_graph_value_read_backward: ResNet's
 * batch norms before the additions, an up-convolution's output that only an unfolded
 * concatenation reads); the others wait for the backward. */
tsl_status tsl_exec_forward(struct tsl_model *m, instance *in, int train);

/* The instance for `batch` samples, made (and an old one evicted) when needed. */
tsl_status tsl_exec_instance_for(struct tsl_model *m, int64_t batch, instance **out);

tsl_status tsl_exec_op_backward(struct tsl_model *m, instance *in, int32_t i);

/* Forward of op i alone (with its regridding; no release). */
tsl_status tsl_exec_op_forward(struct tsl_model *m, instance *in, int32_t i, int train);

/* ---- layer-parallel MGRIT (mgrit.c) ---- */

/* The segments the model's plan solves by MGRIT into m->mg: with levels= > 1 every ODE
 * segment of two or more steps, each checked (steps divisible by cf^(levels-1), at least two
 * points on the coarsest level, not reading the model's input). */
tsl_status tsl_mgrit_plan(struct tsl_model *m);

/* The MGRIT segment whose first step starts at op i (its first op), or NULL. */
const tsl_mgrit_segment *tsl_mgrit_segment_at(const struct tsl_model *m, int32_t i);

/* The MGRIT segment whose last step ends at op i (its add), or NULL. */
const tsl_mgrit_segment *tsl_mgrit_segment_ending(const struct tsl_model *m, int32_t i);

/* The segment's steps forward: iters= V-cycles, then (training) the fine sweep that makes
 * every step's values and batch-norm running statistics once. */
tsl_status tsl_mgrit_forward(struct tsl_model *m, instance *in, const tsl_mgrit_segment *seg,
                             int train);

/* The segment's adjoint from grad[u_N] to grad[u_0]: biters= V-cycles, then the fine sweep
 * that makes every step's parameter gradients once; releases the segment's values. */
tsl_status tsl_mgrit_backward(struct tsl_model *m, instance *in, const tsl_mgrit_segment *seg);

/* Read the residual norms the step's cycles left pending (collective). */
void tsl_mgrit_finish(struct tsl_model *m);

/* Free the model's MGRIT segments (pending sums released unread). */
void tsl_mgrit_model_free(struct tsl_model *m);

/* Free an instance's MGRIT tensors. */
void tsl_mgrit_instance_free(struct tsl_model *m, instance *in);

#endif /* TESSEL_SRC_EXECUTOR_H */
