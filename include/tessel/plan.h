/**
 * @file plan.h
 * @brief Parallel plans: how a model's tensors are tiled and which ranks own the tiles.
 *
 * A plan string is
 * `data=D,filters=F,channels=K,space=AxBxC,stages=S,micro=M,balance=B,tiles=T,shard=E,bucket=K,
 * recompute=R`, `domains=N` in stages=' place, with the layer-parallel parts
 * `layers=P,levels=L,cf=M,iters=F,biters=B,relax=F|FCF,skip=K,infer=exact|mgrit`;
 * every part is optional and defaults to 1 (balance= to memory, shard= to
 * ::TSL_PLAN_SHARD_DEFAULT, bucket= to ::TSL_PLAN_BUCKET_DEFAULT, recompute= to 0, cf= to 2,
 * iters= to 2, relax= to FCF, infer= to exact):
 * D sample groups (data parallelism), an A x B x C (or A x B, or A) rank grid over the spatial
 * dimensions (spatial parallelism, halo exchange), S pipeline stages with M micro-batches
 * (layer parallelism: consecutive ops split into S stages as B says, see tsl_plan_stages()),
 * T extra tiles per rank along the longest spatial dimension (over-decomposition, so every
 * worker of a rank has a tile; tensors without spatial dimensions, as a network's head, get T
 * times their sample tiles, so one rank with tiles=T cuts every tensor as T ranks with
 * space=T do), and E: the fewest elements a convolution or linear weight
 * needs to be cut into shards over the ranks (tsl_plan_param_placement()), and K: the most
 * elements of the small parameters whose gradients travel packed in one bucket
 * (tsl_plan_buckets(); 0: every small parameter on its own), and R: 1 to have training drop
 * each batch norm's fused ReLU output after the forward and make it again for the backward
 * (less memory for an elementwise pass per layer, the same bits; tsl_graph_recomputed()),
 * 0 to keep it. F rank groups along channels (filter parallelism: activations cut into F channel
 * tiles where F divides their channels, each convolution's and linear layer's filters with
 * them; features only without space=). channels=K
 * cuts the activations the same way but each convolution or linear layer whose input K divides
 * keeps its weights cut along their input channels too (K x K tiles, tile (g, k) with input
 * group k): group k convolves its input channels with them and the partial outputs are summed
 * onto the output's channel tiles (channel parallelism: partial outputs cross ranks, where
 * filters= moves the inputs); it takes the place of F in the rank grid and does not combine
 * with filters= or layers=. A plan runs on
 * D x F x A x B x C x S ranks: stage s on ranks s x G ... (s + 1) x G - 1, G = D x F x A x B x C,
 * each stage's tensors split over its G ranks as data=, filters= and space= say (rank grid
 * D x F x A x B x C, row-major; with channels=K, K in F's place).
 *
 * Domain parallelism (multi-domain networks, as the zoo's `dsn`): `domains=N` cuts the ranks
 * into N groups as stages=N does, but places ops by the domain they belong to instead of by
 * depth: each slice op reading the network's input (in op order) starts a domain (K of them,
 * K >= N), an op belongs to the domain of the slices its inputs come from, and ops that read
 * none or several (the input, a head merging domains) belong to domain 0; domain k runs on
 * group k N / K (tsl_plan_stages()). In a graph of several inputs each input that no slice
 * reads starts a domain. Where the domains are equal channel ranges of one input (its whole
 * space; no filters= or channels=), the input is cut by channels onto the groups, so each group
 * holds and reads only its views. Values and shared parameters (tsl_graph_share_params())
 * cross groups by StarPU-MPI: the shared ops' gradients are summed into their source as on one
 * rank. It takes the place of stages= and combines with data=, space=, filters= and micro=
 * inside each group.
 *
 * Layer-parallel training by multigrid in time: the residual steps of the graph's ODE segments
 * (tsl_graph_ode_segments(), runs of at least two steps) are cut into P consecutive groups of
 * steps on P rank groups (layers=P takes the place of stages=; the ops before a segment's steps
 * sit with the group of the step before them, the first ops on group 0), and with levels=L > 1
 * each segment's forward and backward are solved by L-level MGRIT: coarsening factor M (every
 * segment's steps divisible by M^(L-1), at least 2 points on the coarsest level), F forward and
 * B backward V-cycles of the given relaxation (FAS; coarse steps h M^l with the weights of the
 * fine step they start at; the coarsest level solved serially; skip=1: the first down-cycle's
 * work skipped, the first guess being the coarsest level's steps alone, brought up the levels by
 * injection and F-relaxation), then one fine sweep that makes
 * every step's values, batch-norm running statistics and parameter gradients. levels=1 runs the
 * layers one after the other (the serial executor). Inference (a forward outside training, as
 * tsl_model_forward() and a training run's test pass do it) sweeps the steps one after the other
 * with infer=exact, the default: the network the weights were trained for, exactly, as the
 * serial executor computes it; infer=mgrit solves it by the training forward's F V-cycles
 * instead (a shorter critical path across many rank groups, an approximation of the network).
 * Pure C: no StarPU, no MPI.
 */
#ifndef TESSEL_PLAN_H
#define TESSEL_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "tessel/export.h"
#include "tessel/graph.h"
#include "tessel/status.h"
#include "tessel/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Default of shard=: weights of at least 4096 elements (16 KiB) are cut into shards. */
#define TSL_PLAN_SHARD_DEFAULT 4096

/** Default of bucket=: the gradients of small parameters travel in packs of up to 65536
 *  elements (256 KiB). */
#define TSL_PLAN_BUCKET_DEFAULT 65536

/** How tsl_plan_stages() splits a network into stages (plan part balance=). */
typedef enum tsl_stage_balance {
    TSL_BALANCE_MEMORY = 0, /**< `memory`: the smallest largest-rank peak memory estimate */
    TSL_BALANCE_LAYERS = 1, /**< `layers`: the same number of ops per stage (naive) */
    TSL_BALANCE_TIME = 2,   /**< `time`: the smallest largest-stage flop estimate */
} tsl_stage_balance;

/** Default of skip=: MGRIT's first down-cycle is done (its work not skipped). */
#define TSL_PLAN_SKIP_DEFAULT 0

/** How inference runs an MGRIT segment (plan part infer=). */
typedef enum tsl_mgrit_infer {
    TSL_INFER_EXACT = 0, /**< `exact`: one sweep through the steps (the default) */
    TSL_INFER_MGRIT = 1, /**< `mgrit`: iters= V-cycles, as the training forward */
} tsl_mgrit_infer;

/** MGRIT relaxation (plan part relax=). */
typedef enum tsl_mgrit_relax {
    TSL_RELAX_F = 0,   /**< `F`: F-relaxation only */
    TSL_RELAX_FCF = 1, /**< `FCF`: F-, C- then F-relaxation (the default) */
} tsl_mgrit_relax;

/** A parsed plan. */
typedef struct tsl_plan {
    int32_t data;       /**< D: sample groups */
    int32_t space_ndim; /**< how many entries space= gave (0: none) */
    int32_t space[3];   /**< spatial rank grid; 1 past space_ndim */
    int32_t stages;     /**< S: pipeline stages */
    int32_t micro;      /**< M: micro-batches */
    int32_t balance;    /**< B: a ::tsl_stage_balance */
    int32_t tiles;      /**< T: tiles per rank along the longest spatial dimension */
    int32_t shard;      /**< E: fewest elements of a weight cut into shards */
    int32_t bucket;     /**< K: most elements of one bucket of small gradients (0: none) */
    int32_t recompute;  /**< R: 1: batch-, group-, layer-, instance-norm + ReLU outputs made
                             again for the backward */
    int32_t layers;     /**< P: rank groups along the depth of the ODE segments (MGRIT) */
    int32_t levels;     /**< L: MGRIT levels (1: the serial executor) */
    int32_t cf;         /**< M: MGRIT coarsening factor */
    int32_t iters;      /**< F: MGRIT forward iterations (V-cycles) */
    int32_t biters;     /**< B: MGRIT backward (adjoint) iterations */
    int32_t relax;      /**< a ::tsl_mgrit_relax */
    int32_t skip;       /**< 1: MGRIT's first down-cycle skipped (a coarse-level first guess) */
    int32_t filters;    /**< F: rank groups along the output channels (filter parallelism) */
    int32_t infer;      /**< a ::tsl_mgrit_infer: how inference runs an MGRIT segment */
    int32_t channels;   /**< C: rank groups along the input channels (channel parallelism) */
    int32_t domains;    /**< N: rank groups holding the network's domains (domain parallelism;
                             stages is N too, so the groups are the pipeline's) */
} tsl_plan;

/**
 * @brief Rank groups along depth: layers= where it splits (layer-parallel MGRIT), else
 * stages= (pipeline stages); 1 for a NULL plan. Group g holds ranks g x G ... (g + 1) x G - 1.
 */
TSL_API int32_t tsl_plan_depth(const tsl_plan *plan);

/** @brief The plan of one rank group with nothing split: every part 1, shard= its default. */
TSL_API tsl_status tsl_plan_init(tsl_plan *plan);

/**
 * @brief Parse a plan string (see the file comment; "" is the default plan). An unknown or
 * repeated part, a value that is not an integer in [1, 2^20] ([0, 2^20] for bucket=), or a space=
 * grid of more than three entries is a TSL_ERR_INVALID_ARG error naming it; @p plan is then
 * unchanged.
 */
TSL_API tsl_status tsl_plan_parse(const char *text, tsl_plan *plan);

/** @brief The ranks a plan runs on: D x F x K x A x B x C x S (K: channels=; 0 for a NULL plan). */
TSL_API int64_t tsl_plan_ranks(const tsl_plan *plan);

/** @brief Write the plan in its string form, parts that are not their default only ("data=1"
 *  when all are); TSL_ERR_INVALID_ARG when it does not fit in @p size bytes. */
TSL_API tsl_status tsl_plan_format(const tsl_plan *plan, char *text, size_t size);

/**
 * @brief Check @p plan for a model whose samples have shape @p input (C, spatial...) on
 * @p nranks ranks: the rank count must be D x F x A x B x C x S and space= may not split more
 * dimensions than the samples have. Errors name the plan.
 */
TSL_API tsl_status tsl_plan_check(const tsl_plan *plan, const tsl_shape *input, int32_t nranks);

/**
 * @brief The pipeline stage of every op of @p graph under @p plan (all 0 for a NULL plan or
 * stages=1). When the graph has stages of its own (tsl_graph_set_stage()), those: an op
 * without one takes its predecessor's. Otherwise consecutive ops (in graph order) are cut into
 * S non-empty stages so the largest stage cost is smallest, the cost of an op being, by
 * balance=: layers: 1; time: its forward flops for @p batch samples; memory: the bytes of its
 * output and the output's gradient for @p batch samples plus its parameters with their
 * gradients and @p optimizer_states more copies of each trainable one. That memory split is
 * then where a search starts that moves each cut in turn to the place between its neighbours
 * where the largest rank's estimate of what lives at once is smallest
 * (tsl_plan_estimate_peak() plus tsl_plan_estimate_received() on the plan's ranks: this
 * counts the activations a stage keeps for its backward and the copies it receives from
 * other stages, a U-Net's long skips included), until no cut moves; with two stages that is
 * the best cut. With layers=P (tsl_plan_depth()) the P groups of ODE steps instead (see the
 * file comment); fewer such steps than P is an error. With domains=N, the group of each op's
 * domain (see the file comment; the graph's own stages are not used); a network with fewer
 * than N domains is an error. A network with fewer ops than stages, or a graph stage >= S, is a
 * ::TSL_ERR_INVALID_ARG error.
 * @param[out] op_stage one per op (tsl_graph_op_count())
 */
TSL_API tsl_status tsl_plan_stages(const tsl_plan *plan, tsl_graph_t graph, int64_t batch,
                                   int32_t optimizer_states, int32_t *op_stage);

/**
 * @brief The tile grid and owners a plan gives one (batch, sample...) tensor of pipeline stage
 * @p stage of a model (what tsl_model_create_plan() uses): the tensor lives on the stage's G
 * ranks (tsl_owner_on_ranks()). Spatial dimensions of @p sample start at index @p first (1
 * after channels for activations, 0 for per-position labels). A NULL plan (the default) where
 * each of the R ranks gets fewer samples than it has workers (but at least one) is the plan
 * data=R,tiles=T with T = ceil(workers / (batch / R)): spatial tiles give every worker work.
 * With no spatial split in @p plan (or a NULL plan otherwise), or a sample with no spatial
 * dimension, the tensor gets sample tiles: min(batch, G x workers x M x T) of them, in contiguous
 * runs per rank. Otherwise:
 * min(D x M, batch) sample tiles (M micro-batches per sample group), space[d] tiles along
 * spatial dimension d (tiles=T times more along the longest dimension of @p input), each
 * capped by the size, owned by tsl_owner_block() over the process grid D x F x A x B x C.
 * With filters=F > 1 the same path also without a spatial split (then min(D x M x workers,
 * batch) sample tiles), activations with spatial dimensions get F channel tiles where F divides
 * their channels (else one, on filter group 0), and per-position labels the process grid
 * (D x F) x A x B x C. A sample without spatial dimensions (features) under filters=F (or
 * channels=F) and no spatial split gets min(batch, D x workers x M x T) sample tiles on the
 * process grid D x F, its features cut into F tiles where F divides them (else one, on group 0),
 * and per-sample labels (a 0-D sample, @p first 0) the same sample tiles on D x F groups.
 * The plan must have passed tsl_plan_check().
 */
TSL_API tsl_status tsl_plan_tensor_tiling(const tsl_plan *plan, const tsl_shape *input,
                                          int32_t nranks, int32_t stage, int32_t workers,
                                          int64_t batch, const tsl_shape *sample, int32_t first,
                                          tsl_tile_grid *grid, tsl_owner_map *owners);

/**
 * @brief Where a model keeps its parameters on @p nranks ranks (what tsl_model_create_plan()
 * uses). A parameter lives on the G ranks of its op's stage (@p op_stage, as
 * tsl_plan_stages() gives; NULL: every op on stage 0, which needs stages=1). With more than
 * one rank there, the weight of a convolution or linear layer with at least shard= elements
 * (TSL_PLAN_SHARD_DEFAULT for a NULL plan) is cut along its first dimension into
 * min(G, dims[0]) shards, owned by the stage's ranks in order: its gradient is reduced shard
 * by shard onto the owners, the optimizer updates each shard where it lives, and every rank
 * of the stage assembles the whole weight from the shards. Every other parameter and buffer is
 * one tile on the stage's rank holding the fewest parameter bytes so far (ties: the lowest
 * rank), taken in parameter order after the sharded weights.
 * @param[out] grids   one per parameter
 * @param[out] owners  one per parameter
 * With filters=F > 1, the weight and bias of a convolution or linear layer whose output channels
 * (features) the plan cuts (one group, output channels divisible by F, a transposed
 * convolution's weight then cut along its second dimension; for a
 * linear layer, no spatial split) are instead cut into F tiles
 * along their first dimension, tile f on the first rank of filter group f (rank grid D x F x
 * A x B x C), and read tile by tile: no whole copies.
 * With channels=K > 1, the weight of a convolution or linear layer whose input channels the
 * plan cuts (one group, its input neither the model's input nor a concatenation) is cut into
 * K tiles
 * along its input channels as well (along its filters too where its output is cut), tile
 * (g, k) on the first rank of channel group k; the other convolutions' weights and biases are
 * cut as under filters=K.
 * @param[out] sharded one per parameter: 1 for a sharded weight, 2 for one cut by filters, 3
 *                     for one cut along its input channels by channels= (may be NULL)
 */
TSL_API tsl_status tsl_plan_param_placement(const tsl_plan *plan, tsl_graph_t graph, int32_t nranks,
                                            const int32_t *op_stage, tsl_tile_grid *grids,
                                            tsl_owner_map *owners, int32_t *sharded);

/**
 * @brief How a model packs its small parameters' traffic (what tsl_model_create_plan() uses,
 * after tsl_plan_param_placement() gave @p owners and @p sharded). Only with bucket= K > 0 and
 * more than one rank in a stage. Every trainable parameter that is not sharded gets a whole
 * copy on each rank of its stage (@p replicated), refreshed from the owners in one packed
 * message per owner and rank. The weights and biases of convolution and linear layers that
 * are not sharded (their gradients are sums of partials made where the samples live) are
 * grouped into buckets: per owner, in reverse parameter order (the order backward makes
 * them), a bucket takes parameters while it holds at most K elements (a larger parameter gets
 * one of its own); each rank sends its partial gradients of a bucket's members as one message
 * to the owner.
 * @param[out] bucket_of  one per parameter: its bucket in [0, *nbuckets), or -1
 * @param[out] replicated one per parameter: 1 if it has whole copies per rank (may be NULL)
 * @param[out] nbuckets   how many buckets
 */
TSL_API tsl_status tsl_plan_buckets(const tsl_plan *plan, tsl_graph_t graph, int32_t nranks,
                                    const tsl_owner_map *owners, const int32_t *sharded,
                                    int32_t *bucket_of, int32_t *replicated, int32_t *nbuckets);

/**
 * @brief Estimated tiles per rank (all of them, as if they all lived at once; the most
 * that does is tsl_plan_estimate_peak()) of training @p graph under @p plan with batches of
 * @p batch: every value's activation and gradient (not the input's gradient) on its
 * producer's stage (tsl_plan_stages() with the same @p batch and @p optimizer_states), the
 * labels (u8 up to 254 classes, else i32) on the output's stage, and every parameter where
 * tsl_plan_param_placement() puts it, with its gradient and @p optimizer_states more copies of each
 * trainable one (Adam 2, SGD with momentum 1), plus on every rank of its stage the whole value of
 * each sharded weight and each replicated one (tsl_plan_buckets()), and the spare gradient of each
 * value several ops read. Not counted: copies between tile grids, halo slabs, batch-norm
 * statistics, StarPU-MPI's received copies of tiles read across ranks
 * (tsl_plan_estimate_received()).
 * @param[out] bytes @p nranks entries
 */
TSL_API tsl_status tsl_plan_estimate(const tsl_plan *plan, tsl_graph_t graph, int32_t nranks,
                                     int32_t workers, int64_t batch, int32_t optimizer_states,
                                     int64_t *bytes);

/**
 * @brief Estimated most tile memory per rank live at once while training @p graph, for the
 * same arguments as tsl_plan_estimate(). The executor makes activations and gradients as
 * transient tiles (StarPU allocates a tile when a task first writes it) and releases an op's
 * output, its gradient and spare gradient once the op's backward is submitted (the model's
 * output stays); parameters, their gradients and optimizer states and the labels live for the
 * whole step. The estimate follows that order on every rank: the forward makes every op's
 * output (with M > 1 micro-batches, each stretch from a batch norm up to the next micro-batch
 * by micro-batch, a value that no backward reads going after its last reader's slice); the
 * backward, op by op from the last, makes the op's input gradients (a spare one
 * for a value's second contribution), then releases what the op's backward was the last to
 * read; with M > 1 micro-batches it does so micro-batch by micro-batch (a rank takes them
 * through the backward in turn), so an op's input gradients for micro-batch j are made after
 * its output and output gradient for micro-batch j - 1 are gone: each stretch of the backward
 * from a batch norm (whose statistics wait for every micro-batch; then its input gradient is
 * made micro-batch by micro-batch) down to the next batch norm is walked once per micro-batch,
 * and an output gradient received from another stage goes micro-batch by micro-batch too. On
 * a stage of one rank, a convolution's or linear layer's weight gradient is made in partials,
 * one per sample tile, the first in the gradient and the others in temporaries a tree adds up
 * as they come (0 + 1, 2 + 3, then 0 + 2, ...): those waiting for their pair are held (up to
 * log2(M) with M micro-batches in turn). Each weight sharded over its stage's ranks of G adds, at
 * its op's backward, on every rank of its stage the partial gradient of the whole weight that rank
 * makes and the (G - 1) pieces of it that the rank sends (a linear layer's partial is those pieces
 * alone); and from the end of the forward, the (G - 1) / G of a shard the reduction's trees bring
 * the rank, until the reduction's tasks have added them, as soon as the other ranks' same backward
 * has sent theirs. What a rank receives is allocated when the reading task is submitted: the
 * forward's receives (batch norm's exact sums, a filter plan's input channel tiles, a channel
 * plan's partial outputs, halo slabs) are held from the step's start until their op's forward (the
 * input tiles until its backward), the backward's (the sums again, gradient parts, returned halo
 * gradients) from the end of the forward until their op's backward, and the next step's forward's
 * receives into new temporaries from the end of the forward on; a weight cut by filters whose
 * filter group holds several ranks adds, on its tile's owner, the other ranks' partial gradients of
 * the tile (from the end of the forward to the op's backward), and on those ranks their partial
 * during the op's backward and, for the whole step, the copy of the tile they read in the forward.
 * Counted and not counted otherwise as in tsl_plan_estimate().
 * @param[out] bytes @p nranks entries
 */
TSL_API tsl_status tsl_plan_estimate_peak(const tsl_plan *plan, tsl_graph_t graph, int32_t nranks,
                                          int32_t workers, int64_t batch, int32_t optimizer_states,
                                          int64_t *bytes);

/**
 * @brief Estimated received copies per rank, for the same arguments as tsl_plan_estimate():
 * what the copies of tiles a pipeline stage reads from another stage add to the rank's peak
 * (tsl_plan_estimate_peak()). StarPU-MPI holds them in received copies on top of the rank's
 * tiles, one per tile handle. An op's inputs made on another stage are received on the op's
 * stage and held for the whole step: the copy is flushed when the executor releases the value
 * and received again at once for the next step's forward, whose receives are posted by then.
 * In an op's backward, the tasks writing such an input's gradient run on the input's stage and
 * read the op's output gradient there (a concatenation: only the input's channels, cut into a
 * part on the concatenation's stage first): held during that backward. Each stage's share is
 * split evenly over its ranks, and the peak with these copies placed where they live, less the
 * peak without them, is the entry: a copy received while the rank holds less than its peak may
 * add nothing. Zero without stages (halo slabs, batch-norm sums and the other receives are in
 * tsl_plan_estimate_peak()).
 * @param[out] bytes @p nranks entries
 */
TSL_API tsl_status tsl_plan_estimate_received(const tsl_plan *plan, tsl_graph_t graph,
                                              int32_t nranks, int32_t workers, int64_t batch,
                                              int32_t optimizer_states, int64_t *bytes);

/** @brief The terms of tsl_plan_estimate_traffic(), each an array of one count per rank. */
typedef enum tsl_traffic_term {
    TSL_TRAFFIC_PARAMS = 0,    /**< gradients to the owners, parameters back to every copy */
    TSL_TRAFFIC_BATCHNORM = 1, /**< batch and group norm's exact sums, forward and backward */
    TSL_TRAFFIC_HALOS = 2,     /**< convolutions' halo slabs, forward and backward */
    TSL_TRAFFIC_STAGES = 3,    /**< values crossing pipeline stages, and what their
                                    gradients' tasks read back */
    TSL_TRAFFIC_LOSSES = 4,    /**< the loss terms' and the accuracy's sums, and the values loss
                                    terms between values move (and their gradients) */
    TSL_TRAFFIC_TOTAL = 5,     /**< the sum of the terms above */
    TSL_TRAFFIC_TERMS = 6
} tsl_traffic_term;

/**
 * @brief Estimated bytes each rank sends to other ranks in one training step of @p graph under
 * @p plan with batches of @p batch (same arguments as tsl_plan_estimate()), term by term as the
 * lowering moves them: the gradients of sharded weights reduced onto the shards' owners and the
 * shards gathered back into every rank's whole copy, the buckets' packed partial gradients
 * summed by a tree onto their owners, the replicated parameters refreshed from their owners;
 * batch norm's exact accumulators (2 per channel) sent from every rank with tiles to every other
 * rank that needs the sums, forward and backward (a tree and copies beyond 8 such ranks); the
 * halo slabs of spatially tiled convolutions forward and the window gradients' slabs backward;
 * values read by an op of another pipeline stage (again for a backward that reads them), and
 * back what the tasks making their gradients read there: the op's output gradient (a
 * concatenation's part, a slice's box) and a convolution's or linear layer's weight; the loss's
 * and the accuracy's accumulators. Not counted: copies between different tile grids of one value,
 * evaluation passes, StarPU-MPI's message headers.
 * @param[out] sent ::TSL_TRAFFIC_TERMS x @p nranks entries: term t of rank r at [t * nranks + r]
 */
TSL_API tsl_status tsl_plan_estimate_traffic(const tsl_plan *plan, tsl_graph_t graph,
                                             int32_t nranks, int32_t workers, int64_t batch,
                                             int32_t optimizer_states, int64_t *sent);

/**
 * @name Performance model and automatic plans
 * A plan's training step is predicted from measured costs (tsl_plan_costs: what one rank's
 * calibration run and a ping-pong between ranks give, see tsl_model_calibrate()) and the
 * plan's geometry. Per rank r of stage s, each op o of the stage costs
 * op_seconds[o] (op_seconds_windowed[o] where the plan cuts its output in space, the larger of it
 * and op_seconds_windowed_last[o] where along its last spatial dimension,
 * op_seconds_channels[o] where along channels (op_seconds_input_channels[o] under channels=),
 * the larger where both) x batch x (the
 * share of o's output tiles that r owns) / min(workers, r's tiles of it) of compute, and (2, or 3
 * with parameters) tasks per tile x task_seconds / the same parallelism (plus the step's waits
 * once, in the tasks term: wait_seconds, or wait_seconds_windowed for a plan cutting samples in
 * space); under recompute=1 a norm op whose fused ReLU output the backward makes again
 * (tsl_graph_recomputed()) adds op_seconds_recompute[o] (scaled as its op_seconds was for windows
 * or channel tiles) and one task per tile the same way; the bytes r sends
 * (tsl_plan_estimate_traffic(), term by term) cost bytes / bandwidth plus one latency per exchange.
 * Computation and the parameter, halo and stage traffic overlap (the rank's time is the larger of
 * the two); batch norm's exact sums are a synchronisation in the forward and the backward and add
 * their time. A pipeline of S stages (a stage's time: its slowest rank's, spread over its ops by
 * their compute, a third of it the forward for ops with parameters and half for the others) and M
 * micro-batches is played out: each stage takes its micro-batches through its forward and then its
 * backward one at a time, an op's micro-batch k waiting for micro-batch k of the ops of other
 * stages it depends on (forward: its inputs' producers; backward: its output's readers, and the
 * loss, which waits for the whole forward), so stages on parallel branches of the graph run at
 * once; a later stage's first convolution or linear layer makes its weights' gradients (half its
 * backward) after the rest of its stage's backward, filling the stage's waits or overlapping the
 * stages before it, as the executor orders them; a batch norm, whose
 * statistics are exact over the whole batch, waits for every micro-batch of its input (forward) and
 * of its output gradient (backward). Without batch norm that is GPipe's (the sum of the stage times
 * + (M - 1) x the slowest) / M for equal stages; with a batch norm in every block the stages
 * overlap only between the batch norms at their edges. The time beyond the slowest stage is the
 * bubble. Peak memory is tsl_plan_estimate_peak() plus tsl_plan_estimate_received().
 * @{
 */

/** Measured costs the performance model predicts with. */
typedef struct tsl_plan_costs {
    int32_t nops;             /**< entries of op_seconds: the graph's op count */
    const double *op_seconds; /**< per op: its tasks' run time (forward and backward) per sample
                                   on one worker, seconds, on sample tiles */
    const double *op_seconds_windowed; /**< the same on spatial tiles (windows with halos), for
                                            ops whose output a plan cuts in space; NULL: as
                                            op_seconds */
    const double *op_seconds_channels; /**< the same on channel tiles (filters=), for ops whose
                                            output a plan cuts along channels; NULL: as
                                            op_seconds */
    double task_seconds; /**< each task's cost beyond its run time (scheduling, waiting) */
    double latency;      /**< one message between two ranks, seconds */
    double bandwidth;    /**< bytes per second between two ranks (> 0 with several ranks) */
    double wait_seconds; /**< a step's waits that do not grow with its tasks (a worker's idle
                              time per step that more tasks did not add to), seconds; 0: none */
    const double *op_seconds_recompute; /**< per norm op: the backward's remaking of its fused
                                             ReLU output (recompute=1) per sample on one worker,
                                             on sample tiles; NULL: a quarter of the op's
                                             op_seconds (about one of its four passes) */
    double wait_seconds_windowed;       /**< wait_seconds of plans that cut samples in space (halos
                                             waited for beyond the halo term); 0: wait_seconds */
    const double *op_seconds_input_channels; /**< op_seconds_channels for plans cutting the
                                                  layers' input channels (channels=); NULL: as
                                                  op_seconds_channels */
    const double *op_seconds_windowed_last;  /**< op_seconds_windowed for outputs cut along
                                                  their last spatial dimension (short rows),
                                                  samples of 2 or 3; NULL: as
                                                  op_seconds_windowed */
    int32_t node_ranks;        /**< ranks per node (consecutive ranks on one node) where more ranks
                                    than cores share a node: local rank l's workers and StarPU-MPI
                                    thread on core l mod node_cores, as tessel binds them, taking turns
                                    with the node's other ranks on that core; 0: a core or more per
                                    rank, nothing shared */
    int32_t node_cores;        /**< the cores of such a node */
    double shared_slowdown;    /**< with node_ranks: how much longer the ops' tasks ran with every
                                    rank of a core busy (as op_seconds were measured) than with one
                                    busy at a time (>= 1; 0: 1); wait_seconds is then the waits
                                    beyond the core's other ranks' tasks, with every rank busy */
    double wait_seconds_turns; /**< with node_ranks: a step's waits where a core's ranks work in
                                    turn (a pipeline's stages), beyond the model's time of it */
} tsl_plan_costs;

/** The terms of a predicted step (tsl_plan_prediction). */
typedef enum tsl_plan_term {
    TSL_TERM_COMPUTE = 0,   /**< the tasks' run time */
    TSL_TERM_TASKS = 1,     /**< the tasks' fixed costs and the step's waits */
    TSL_TERM_PARAMS = 2,    /**< gradient reduction and parameter gathering */
    TSL_TERM_BATCHNORM = 3, /**< batch norm's exact sums (a synchronisation) */
    TSL_TERM_HALOS = 4,     /**< halo slabs */
    TSL_TERM_STAGES = 5,    /**< values and gradients crossing pipeline stages */
    TSL_TERM_BUBBLE = 6,    /**< the pipeline's fill and drain */
    TSL_TERM_CORES = 7,     /**< ranks sharing a core waiting for its other ranks' tasks */
    TSL_TERM_COUNT = 8
} tsl_plan_term;

/** @brief The name of a ::tsl_plan_term ("compute", "tasks", ...; "?" for another value). */
TSL_API const char *tsl_plan_term_name(int32_t term);

/** A plan's predicted training step. */
typedef struct tsl_plan_prediction {
    tsl_plan plan;
    double seconds;               /**< predicted seconds per training step */
    double terms[TSL_TERM_COUNT]; /**< the slowest rank's seconds per term */
    int32_t binding;              /**< the largest term: what binds the step */
    int64_t peak_bytes;           /**< the largest rank's tiles live at once + received copies */
    int64_t sent_bytes;           /**< the most bytes one rank sends per step */
} tsl_plan_prediction;

/**
 * @brief Predict training @p graph under @p plan on @p nranks ranks of @p workers workers with
 * batches of @p batch (see the group's description). The plan must pass tsl_plan_check() and
 * split no layers (layers= is MGRIT, whose cycles this model does not describe).
 */
TSL_API tsl_status tsl_plan_predict(const tsl_plan *plan, tsl_graph_t graph, int32_t nranks,
                                    int32_t workers, int64_t batch, int32_t optimizer_states,
                                    const tsl_plan_costs *costs, tsl_plan_prediction *out);

/**
 * @brief The plans tsl_plan_search() considers for @p graph on @p nranks ranks: every
 * factorisation nranks = D x F x A x B x C x S with D <= batch (F: filters=), a spatial grid over
 * at most the samples' spatial dimensions (each part at most that dimension's size), S at most the
 * ops; with S > 1, micro= 1, 2, 4 and 8 (at most batch / D); tiles= 1, and with a spatial split or
 * fewer samples per rank than workers also tiles=workers; where the backward would make some
 * norm's fused ReLU output again (tsl_graph_recomputed(): a batch or group norm followed by a
 * ReLU), each of those also with recompute=1, right after it; every other part its default. In a
 * fixed order (the same on every rank); @p count is how many there are, of which the first @p cap
 * are written to @p plans (may be NULL with cap 0).
 */
TSL_API tsl_status tsl_plan_candidates(tsl_graph_t graph, int32_t nranks, int32_t workers,
                                       int64_t batch, tsl_plan *plans, int32_t cap, int32_t *count);

/** What tsl_plan_search() minimises. */
typedef enum tsl_plan_objective {
    TSL_OBJECTIVE_TIME = 0,   /**< predicted seconds per step (ties: less memory) */
    TSL_OBJECTIVE_MEMORY = 1, /**< the largest rank's peak memory (ties: faster) */
} tsl_plan_objective;

/** A prediction in place of tsl_plan_predict() (a test's synthetic costs). */
typedef tsl_status (*tsl_plan_predict_fn)(const tsl_plan *plan, void *user,
                                          tsl_plan_prediction *out);

/**
 * @brief Rank every candidate of tsl_plan_candidates() that fits: predict it (with @p predict
 * where given, else tsl_plan_predict() with @p costs), drop those whose peak_bytes exceed
 * @p budget_bytes (<= 0: no budget), and sort the rest by @p objective (remaining ties in
 * candidate order). For time, a recompute=1 candidate is dropped where the same plan without
 * recompute fits: remaking values only adds work, it is there for plans that fit only with it.
 * The first @p cap go to @p ranked; @p count is how many are ranked. None fitting is a
 * ::TSL_ERR_RESOURCE error naming the smallest peak. Deterministic: every rank given the same
 * arguments chooses the same plan.
 */
TSL_API tsl_status tsl_plan_search(tsl_graph_t graph, int32_t nranks, int32_t workers,
                                   int64_t batch, int32_t optimizer_states,
                                   const tsl_plan_costs *costs, int64_t budget_bytes,
                                   int32_t objective, tsl_plan_predict_fn predict, void *user,
                                   tsl_plan_prediction *ranked, int32_t cap, int32_t *count);

/** @} */

#ifdef __cplusplus
}
#endif

#endif /* TESSEL_PLAN_H */
