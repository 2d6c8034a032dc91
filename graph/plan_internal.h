/* What the plan files (plan_parse.c, plan_tiling.c, plan_stages.c, plan_estimate.c) share.
 * Pure C. */
#ifndef TESSEL_GRAPH_PLAN_INTERNAL_H
#define TESSEL_GRAPH_PLAN_INTERNAL_H

#include "graph_internal.h"
#include "tessel/plan.h"

/* sizeof(tsl_acc), the exact accumulator (codelets/reduce.h; src/reduce.c checks it). */
#define TSL_PLAN_ACC_BYTES 616

/* The stages of a plan (1 for NULL) and the ranks of each (*group). */
int32_t tsl_plan_stage_count(const tsl_plan *plan, int32_t nranks, int32_t *group);

/* The data of the owner map of a domain-cut input (tsl_plan_value_tiling()): the plan's map of
 * one group's tiles, and the groups. It must outlive every use of the map. */
typedef struct tsl_domain_owners {
    tsl_owner_map within; /* stage 0's map: a tile (channels not cut) to a rank of group 0 */
    int32_t groups;       /* the plan's rank groups (domains=N) */
    int32_t group_size;   /* ranks per group */
} tsl_domain_owners;

/* The channel parts of the graph's input that a domains=N plan places on the domain groups, or
 * 0: a graph of one input read by K >= N slices (the domains, in op order) where slice k takes
 * channels [k C / K, (k + 1) C / K) of it and its whole space, K dividing its C channels, no
 * filters= or channels= (then channel tile k of the input lives on domain k's group, which
 * reads it: nothing of the input on the other groups). */
int32_t tsl_plan_domain_input_parts(const tsl_plan *plan, const struct tsl_graph *g);

/* tsl_plan_tensor_tiling() of value v of g on `stage` (activations: first 1), except the
 * graph's input under a plan that cuts it by domains (tsl_plan_domain_input_parts()): the plan's
 * tiles of it, cut along channels into the domains' parts too, part k on group k N / K, the same
 * place inside its group; its owner map calls back into *own (filled here). */
tsl_status tsl_plan_value_tiling(const tsl_plan *plan, const struct tsl_graph *g, int32_t v,
                                 int32_t nranks, int32_t stage, int32_t workers, int64_t batch,
                                 tsl_domain_owners *own, tsl_tile_grid *grid,
                                 tsl_owner_map *owners);

/* Add `elem` times the elements of each tile of a tensor of `grid` and `owners` (batch shape
 * `whole`) to its owner's count in bytes, and 1 to tiles (may be NULL). */
tsl_status tsl_plan_tiling_counts(const tsl_tile_grid *grid, const tsl_owner_map *owners,
                                  const tsl_shape *whole, int32_t nranks, int64_t elem,
                                  int64_t *bytes, int64_t *tiles);

/* Add `elem` times the elements of each tile of a (batch, sample...) tensor (tiled as
 * tsl_plan_tensor_tiling() says) to its owner's count in bytes, and 1 to tiles (may be NULL). */
tsl_status tsl_plan_tensor_counts(const tsl_plan *plan, const tsl_shape *input, int32_t nranks,
                                  int32_t stage, int32_t workers, int64_t batch,
                                  const tsl_shape *sample, int32_t first, int64_t elem,
                                  int64_t *bytes, int64_t *tiles);

/* The rank groups along channels: filters= or channels= (they do not combine), 1 for neither
 * or a NULL plan. Activations are cut alike under both. */
static inline int32_t tsl_plan_channel_groups(const tsl_plan *plan)
{
    return !plan ? 1 : plan->filters > 1 ? plan->filters : plan->channels > 1 ? plan->channels : 1;
}

/* Whether the plan cuts a value of sample shape s along its channels: F (filters= or channels=)
 * divides them; for a sample without spatial dimensions (a linear layer's features) only where
 * the plan cuts no spatial dimension (its ranks form the data x channel grid alone). The
 * model's output is then made whole along channels by the executor. */
static inline int tsl_plan_cuts_channels(const tsl_plan *plan, const tsl_shape *s)
{
    int32_t f = tsl_plan_channel_groups(plan);
    if (f < 2 || s->ndim < 1 || s->dims[0] % f != 0)
        return 0;
    return s->ndim >= 2 || plan->space[0] * plan->space[1] * plan->space[2] == 1;
}

/* Whether op o is a convolution or linear layer whose weights channels=K cuts along their input
 * channels too (K x K tiles, or 1 x K when its output keeps whole channels: the model's output;
 * a transposed convolution's weight K x K or K x 1): one group, an input the plan cuts along
 * channels (tsl_plan_cuts_channels), neither the model's input nor a concatenation (whose parts the
 * executor folds into the convolution). Tile (g, k) of the weight lives on the first rank of
 * channel group k; sharded 3. */
int tsl_plan_input_channel_cut(const tsl_plan *plan, const struct tsl_graph *g, int32_t o);

/* Whether the executor runs op o on channel tiles (filters= plans) as they are (convolutions of
 * one group, transposed or not, linear layers and the elementwise, pooling and normalising
 * ops); the others get their input and output moved to channel-whole tiles first (on filter
 * group 0). */
int tsl_plan_takes_channel_tiles(const tsl_graph_op *o);

/* Whether op o's weight and bias are cut along their filters like its output's channels under
 * plan's filters= (a convolution of one group, transposed or not, or a linear layer,
 * whose output the plan cuts along channels (tsl_plan_cuts_channels), not the model's output, which
 * the executor keeps whole along channels for the losses): then tsl_plan_param_placement() gives
 * them F tiles, tile f on filter group f's first rank, and sharded 2. */
int tsl_plan_filter_cut(const tsl_plan *plan, const struct tsl_graph *g, int32_t o);

/* The op of each parameter (op_of: nparams entries). */
void tsl_plan_param_ops(const struct tsl_graph *g, int32_t *op_of);

/* Add `per` times each shard's element count to its owner's count: the parameter `s` cut
 * along its first dimension into `splits` shards, owned as tsl_owner_block(NULL) deals them. */
void tsl_plan_add_shards(const tsl_shape *s, int32_t splits, int32_t nranks, int64_t per,
                         int64_t *count);

/* Activation-sized tensors the executor keeps for value v (plan_stages.c says which). */
int64_t tsl_plan_value_copies(const struct tsl_graph *g, int32_t v, const int32_t *op_stage);

/* tsl_plan_estimate_peak() and tsl_plan_estimate_received() for the op stages `given` (NULL:
 * tsl_plan_stages()). */
tsl_status tsl_plan_peak_for_stages(const tsl_plan *plan, tsl_graph_t g, int32_t nranks,
                                    int32_t workers, int64_t batch, int32_t optimizer_states,
                                    const int32_t *given, int64_t *bytes);
/* tsl_plan_estimate_traffic() for the op stages `given` (NULL: tsl_plan_stages()). */
/* The bytes each rank receives in one of batch norm op o's exchanges of exact sums (its forward
 * or its backward; tsl_acc_allreduce_submit, per channel range under channel tiles): the
 * partials it merges. 0 for other ops. received: nranks entries. */
tsl_status tsl_plan_sums_received(const tsl_plan *plan, const struct tsl_graph *g, int32_t o,
                                  int32_t nranks, int32_t stage, int32_t workers, int64_t batch,
                                  int64_t *received);

/* The halo slabs each rank receives for convolution op o on spatial tiles: the forward's window
 * slabs (forward) and the backward's window gradients returned (backward); under channel tiles
 * those of the neighbouring spatial tiles of every channel group (the input tiles under the
 * windows are the peak estimate's copies), none for a channels= convolution's input-channel
 * parts. 0 for other ops. nranks entries each. */
tsl_status tsl_plan_halos_received(const tsl_plan *plan, const struct tsl_graph *g, int32_t o,
                                   int32_t nranks, int32_t stage, int32_t workers, int64_t batch,
                                   int64_t *forward, int64_t *backward);

/* Op o's move onto a common tile grid (the executor's tsl_exec_needs_regrid(), for spatial
 * grids that differ: a pooling or convolution whose output has fewer tiles than its input),
 * per rank: the bytes of its input on that grid (cx; its gradient's alike), of its output there
 * where the output's own grid differs (cy), the input tiles received to make cx (got_fwd), and
 * what the backward receives: the input gradient's common tiles and the output gradient's tiles
 * (got_bwd). All 0 for an op that does not move. nranks entries each. */
tsl_status tsl_plan_regrid_bytes(const tsl_plan *plan, const struct tsl_graph *g, int32_t o,
                                 int32_t nranks, int32_t stage, int32_t workers, int64_t batch,
                                 int64_t *cx, int64_t *cy, int64_t *got_fwd, int64_t *got_bwd);

tsl_status tsl_plan_traffic_for_stages(const tsl_plan *plan, tsl_graph_t g, int32_t nranks,
                                       int32_t workers, int64_t batch, int32_t optimizer_states,
                                       const int32_t *given, int64_t *sent);
/* The tile bytes per (value, stage) and (pooling op, stage) that tsl_plan_peak_for_stages()
 * works out, kept across calls that differ only in the op stages: the memory-balanced stage
 * split (plan_stages.c) scores many splits of one plan. Each entry is made on first use. */
typedef struct tsl_peak_memo tsl_peak_memo;
tsl_peak_memo *tsl_peak_memo_create(const struct tsl_graph *g, int32_t stages, int32_t nranks);
void tsl_peak_memo_destroy(tsl_peak_memo *memo);
/* tsl_plan_peak_for_stages() with `memo` (NULL: none), made for this plan, graph, rank count,
 * workers and batch; with stage_copies, the copies ranks receive from other pipeline stages
 * counted where they live (tsl_plan_estimate_received()), as the peak a rank reaches. */
tsl_status tsl_plan_peak_memo(const tsl_plan *plan, tsl_graph_t g, int32_t nranks, int32_t workers,
                              int64_t batch, int32_t optimizer_states, const int32_t *given,
                              tsl_peak_memo *memo, int stage_copies, int64_t *bytes);
tsl_status tsl_plan_received_for_stages(const tsl_plan *plan, tsl_graph_t g, int32_t nranks,
                                        int32_t workers, int64_t batch, int32_t optimizer_states,
                                        const int32_t *given, int64_t *bytes);

#endif /* TESSEL_GRAPH_PLAN_INTERNAL_H */
