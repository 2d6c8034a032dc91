/* Per-rank memory estimates of a plan (tsl_plan_estimate(), tsl_plan_estimate_peak(),
 * tsl_plan_estimate_received()). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "graph_internal.h"
#include "plan_internal.h"
#include "tessel/plan.h"

/* Add `per` times each shard's element count to its owner's count: the parameter `s` cut
 * along its first dimension into `splits` shards, owned as tsl_owner_block(NULL) deals them. */
void tsl_plan_add_shards(const tsl_shape *s, int32_t splits, int32_t nranks, int64_t per,
                         int64_t *count)
{
    int64_t row = tsl_shape_numel(s) / s->dims[0];
    for (int32_t k = 0; k < splits; k++) {
        int64_t start, extent;
        tsl_tile_extent(s->dims[0], splits, k, &start, &extent);
        count[(int64_t)k * nranks / splits] += per * row * extent;
    }
}

tsl_status tsl_plan_tensor_counts(const tsl_plan *plan, const tsl_shape *input, int32_t nranks,
                                  int32_t stage, int32_t workers, int64_t batch,
                                  const tsl_shape *sample, int32_t first, int64_t elem,
                                  int64_t *bytes, int64_t *tiles)
{
    tsl_tile_grid grid;
    tsl_owner_map owners;
    tsl_status st = tsl_plan_tensor_tiling(plan, input, nranks, stage, workers, batch, sample,
                                           first, &grid, &owners);
    if (st)
        return st;
    tsl_shape whole;
    tsl_batch_shape(batch, sample, &whole);
    return tsl_plan_tiling_counts(&grid, &owners, &whole, nranks, elem, bytes, tiles);
}

/* The counts of value v (tsl_plan_value_tiling()): the graph's input where a domains= plan
 * cuts it by domains, else tsl_plan_tensor_counts(). */
static tsl_status value_counts(const tsl_plan *plan, const struct tsl_graph *g, int32_t v,
                               int32_t nranks, int32_t stage, int32_t workers, int64_t batch,
                               int64_t elem, int64_t *bytes)
{
    tsl_tile_grid grid;
    tsl_owner_map owners;
    tsl_domain_owners own;
    tsl_status st =
        tsl_plan_value_tiling(plan, g, v, nranks, stage, workers, batch, &own, &grid, &owners);
    tsl_shape whole;
    tsl_batch_shape(batch, &g->values[v].shape, &whole);
    return st ? st : tsl_plan_tiling_counts(&grid, &owners, &whole, nranks, elem, bytes, NULL);
}

tsl_status tsl_plan_tiling_counts(const tsl_tile_grid *in_grid, const tsl_owner_map *in_owners,
                                  const tsl_shape *in_whole, int32_t nranks, int64_t elem,
                                  int64_t *bytes, int64_t *tiles)
{
    tsl_tile_grid grid = *in_grid;
    tsl_owner_map owners = *in_owners;
    tsl_shape whole = *in_whole;
    tsl_status st = TSL_OK;
    int64_t ntiles = 1;
    for (int d = 0; d < whole.ndim; d++)
        ntiles *= grid.splits[d];
    /* A block map over a process grid gives tile t the rank of its per-dimension process
     * coordinates t[d] x P[d] / splits[d]: the sums separate by dimension, so each rank's
     * elements and tiles are products of per-dimension sums (the plan search predicts
     * thousands of plans: this keeps it linear in the ranks, not in the tiles). */
    int32_t zero[TSL_MAX_DIMS] = {0}, first_rank;
    int block = owners.kind == TSL_OWNER_BLOCK && owners.process_grid[0] > 0 && ntiles > 64;
    if (block &&
        !(st = tsl_owner_map_rank(&owners, zero, whole.ndim, &grid, nranks, &first_rank))) {
        int64_t sums[TSL_MAX_DIMS][64], counts[TSL_MAX_DIMS][64], procs = 1;
        for (int d = 0; d < whole.ndim && block; d++) {
            int64_t p = owners.process_grid[d];
            block = p <= 64;
            for (int64_t q = 0; block && q < p; q++)
                sums[d][q] = counts[d][q] = 0;
            for (int32_t k = 0; block && k < grid.splits[d]; k++) {
                int64_t start, extent, q = (int64_t)k * p / grid.splits[d];
                tsl_tile_extent(whole.dims[d], grid.splits[d], k, &start, &extent);
                sums[d][q] += extent;
                counts[d][q]++;
            }
            procs *= p;
        }
        for (int64_t linear = 0; block && linear < procs; linear++) {
            int64_t rest = linear, count = elem, n = 1;
            for (int d = whole.ndim - 1; d >= 0; d--) {
                int64_t p = owners.process_grid[d], q = rest % p;
                rest /= p;
                count *= sums[d][q];
                n *= counts[d][q];
            }
            bytes[first_rank + linear] += count; /* (tile 0's rank is the group's first) */
            if (tiles)
                tiles[first_rank + linear] += n;
        }
        if (block)
            return TSL_OK;
    }
    /* Sample tiles dealt in contiguous runs (a block map without a process grid, only the first
     * dimension cut): tile t on the group's rank t x ranks / tiles. */
    int runs = owners.kind == TSL_OWNER_BLOCK && owners.process_grid[0] == 0 && ntiles > 64 &&
               ntiles == grid.splits[0];
    if (runs && !st &&
        !(st = tsl_owner_map_rank(&owners, zero, whole.ndim, &grid, nranks, &first_rank))) {
        int64_t inner = elem, nr = owners.group_size > 0 ? owners.group_size : nranks;
        for (int d = 1; d < whole.ndim; d++)
            inner *= whole.dims[d];
        for (int64_t t = 0; t < ntiles; t++) {
            int64_t start, extent, r = first_rank + t * nr / ntiles;
            tsl_tile_extent(whole.dims[0], grid.splits[0], (int32_t)t, &start, &extent);
            bytes[r] += inner * extent;
            if (tiles)
                tiles[r]++;
        }
        return TSL_OK;
    }
    for (int64_t t = 0; t < ntiles && !st; t++) {
        int32_t coords[TSL_MAX_DIMS] = {0};
        int64_t rest = t, count = elem;
        for (int d = whole.ndim - 1; d >= 0; d--) {
            coords[d] = (int32_t)(rest % grid.splits[d]);
            rest /= grid.splits[d];
            int64_t start, extent;
            tsl_tile_extent(whole.dims[d], grid.splits[d], coords[d], &start, &extent);
            count *= extent;
        }
        int32_t rank;
        if (!(st = tsl_owner_map_rank(&owners, coords, whole.ndim, &grid, nranks, &rank))) {
            bytes[rank] += count;
            if (tiles)
                tiles[rank]++;
        }
    }
    return st;
}

/* Add a (batch, sample...) tensor's tile bytes to the owners' counts. */
static tsl_status add_tensor(const tsl_plan *plan, const tsl_shape *input, int32_t nranks,
                             int32_t stage, int32_t workers, int64_t batch, const tsl_shape *sample,
                             int32_t first, int64_t elem, int64_t *bytes)
{
    return tsl_plan_tensor_counts(plan, input, nranks, stage, workers, batch, sample, first, elem,
                                  bytes, NULL);
}

/* What the estimates share: the op stages (op_stage, nops entries: `given`, or else
 * tsl_plan_stages()) and the tensors that live
 * for the whole step, added to bytes: the labels (tsl_graph_label_dtype) on the output's
 * stage, and every parameter where tsl_plan_param_placement() puts it, with its gradient and
 * optimizer states, plus each sharded weight's whole value on every rank of its stage and
 * each replicated one's (tsl_plan_buckets()). */
/* A weight sharded over ranks first .. first + count - 1 of `bytes` bytes, which its gradient's
 * reduction adds to each of them (tsl_plan_peak_memo's backward): a convolution's rank makes
 * its partial gradient of the whole weight and copies out the (count - 1) pieces of the other
 * ranks' shards to send, a linear layer's makes those parts only (its own it writes in place);
 * and the reduction's trees bring each rank (count - 1) pieces in all, received into buffers
 * StarPU-MPI allocates when the backward is submitted. */
typedef struct shard_reduce {
    int32_t first, count;
    int64_t bytes;
    /* A weight cut by filters (or channels): the most bytes of its tiles one rank owns (one
     * copy), and how many of them (ranks) own tiles. The other ranks of a filter group that
     * hold its samples or spatial tiles each make a partial gradient of the group's tile, which
     * the owner receives. */
    int64_t cut_tile;
    int32_t cut_owners;
    /* A whole weight of a stage of one rank (a convolution's or linear layer's, trainable): its
     * bytes. Each sample tile's task makes a partial gradient of it, the first in the gradient
     * itself, the others in temporaries that a tree adds up (tsl_tree_sum_into: 0 + 1, 2 + 3,
     * then 0 + 2, ...) as they come. */
    int64_t tree;
} shard_reduce;

/* What a rank makes for the reduction in the op's backward (its partial and the pieces it
 * sends), and what it receives (reduce_received). */
static int64_t reduce_bytes(const shard_reduce *rd, const tsl_graph_op *op)
{
    int64_t others = rd->bytes / rd->count * (rd->count - 1);
    return (op->kind == TSL_OP_LINEAR ? 0 : rd->bytes) + others;
}

static int64_t reduce_received(const shard_reduce *rd)
{
    return rd->count > 0 ? rd->bytes / rd->count * (rd->count - 1) : 0;
}

static tsl_status estimate_setup(const tsl_plan *plan, tsl_graph_t g, int32_t nranks,
                                 int32_t workers, int64_t batch, int32_t optimizer_states,
                                 const int32_t *given, int32_t *op_stage, int64_t *bytes,
                                 shard_reduce *reduce, uint8_t *owns, const char *fn)
{
    int32_t out = tsl_graph_output(g);
    if (out < 0 || g->input < 0)
        return tsl_error(NULL, TSL_ERR_STATE, "%s: the graph needs an input and an output", fn);
    tsl_shape input, shape;
    tsl_graph_value_shape(g, g->input, &input);
    tsl_status st = plan ? tsl_plan_check(plan, &input, nranks) : TSL_OK;
    int32_t np = tsl_graph_param_count(g);
    tsl_tile_grid *grids = calloc((size_t)np + 1, sizeof *grids);
    tsl_owner_map *owners = calloc((size_t)np + 1, sizeof *owners);
    int32_t *sharded = calloc((size_t)np + 1, sizeof *sharded);
    int32_t *bucket_of = calloc((size_t)np + 1, sizeof *bucket_of),
            *replicated = calloc((size_t)np + 1, sizeof *replicated), nbuckets = 0;
    if (!st && (!grids || !owners || !sharded || !bucket_of || !replicated))
        st = tsl_error(NULL, TSL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    if (!st && given)
        memcpy(op_stage, given, sizeof *op_stage * (size_t)g->nops);
    else if (!st)
        st = tsl_plan_stages(plan, g, batch, optimizer_states, op_stage);
    const int32_t batch_term = tsl_loss_batch_term(g->nloss, g->loss);
    if (!st && batch_term >= 0 && tsl_model_loss_takes_targets(g->loss[batch_term].kind)) {
        /* float targets of the output's shape, tiled as the output */
        tsl_graph_value_shape(g, out, &shape);
        st = add_tensor(plan, &input, nranks, op_stage[g->values[out].producer], workers, batch,
                        &shape, 1, 4, bytes);
    } else if (!st) { /* labels: one per sample, or per position of a (classes, spatial...) output
                       */
        tsl_graph_value_shape(g, out, &shape);
        tsl_shape labels;
        memset(&labels, 0, sizeof labels);
        labels.ndim = shape.ndim - 1;
        for (int d = 1; d < shape.ndim; d++)
            labels.dims[d - 1] = shape.dims[d];
        st = add_tensor(plan, &input, nranks, op_stage[g->values[out].producer], workers, batch,
                        &labels, 0, tsl_graph_label_dtype(shape.dims[0]) == TSL_U8 ? 1 : 4, bytes);
    }
    if (!st && np > 0 &&
        !(st = tsl_plan_param_placement(plan, g, nranks, op_stage, grids, owners, sharded)))
        st = tsl_plan_buckets(plan, g, nranks, owners, sharded, bucket_of, replicated, &nbuckets);
    int32_t group;
    tsl_plan_stage_count(plan, nranks, &group);
    for (int32_t i = 0; i < np && !st; i++) {
        int32_t trainable;
        if ((st = tsl_graph_param_info(g, i, NULL, &shape, &trainable)))
            break;
        int64_t copies = trainable ? 2 + optimizer_states : 1, numel = tsl_shape_numel(&shape);
        if (!sharded[i]) {
            const int32_t zero[TSL_MAX_DIMS] = {0};
            if (reduce && trainable && group == 1)
                reduce[i].tree = 4 * numel;
            int32_t rank;
            if (!(st = tsl_owner_map_rank(&owners[i], zero, shape.ndim, &grids[i], nranks, &rank)))
                bytes[rank] += 4 * numel * copies;
            for (int32_t r = rank / group * group; replicated[i] && r < (rank / group + 1) * group;
                 r++) /* each rank's whole copy */
                bytes[r] += 4 * numel;
            continue;
        }
        if (sharded[i] >= 2) { /* cut by channels: each tile on its owner, no whole copies */
            int32_t s1 = sharded[i] == 3 ? grids[i].splits[1] : 1;
            int64_t per = numel / shape.dims[0] / (sharded[i] == 3 ? shape.dims[1] : 1);
            int64_t *own = calloc((size_t)nranks, sizeof *own);
            if (!own) {
                st = tsl_error(NULL, TSL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
                break;
            }
            for (int32_t k = 0; k < grids[i].splits[0] && !st; k++)
                for (int32_t q = 0; q < s1 && !st; q++) {
                    int64_t start, extent, s, e = 1;
                    int32_t coords[TSL_MAX_DIMS] = {k, q}, rank;
                    tsl_tile_extent(shape.dims[0], grids[i].splits[0], k, &start, &extent);
                    if (sharded[i] == 3)
                        tsl_tile_extent(shape.dims[1], s1, q, &s, &e);
                    if (!(st = tsl_owner_map_rank(&owners[i], coords, shape.ndim, &grids[i], nranks,
                                                  &rank))) {
                        bytes[rank] += 4 * per * extent * e * copies;
                        own[rank] += 4 * per * extent * e;
                    }
                }
            for (int32_t r = 0; r < nranks && reduce && trainable; r++)
                if (own[r] > 0) {
                    if (owns) /* ([param * nranks + rank]: the rank owns a tile of it) */
                        owns[(int64_t)i * nranks + r] = 1;
                    reduce[i].cut_owners++;
                    reduce[i].cut_tile = own[r] > reduce[i].cut_tile ? own[r] : reduce[i].cut_tile;
                }
            /* The other ranks of a filter group (its samples or spatial tiles) read the group's
             * tile in the forward: StarPU-MPI's cached copy, received and kept through the
             * backward (wide cnn 16^2 data=2,filters=2: ranks 2 and 3 held the four 1.1 MiB
             * tiles of their group at their peak; 9.3 MiB estimated without, 13.3 measured). */
            int64_t tile = 0;
            int32_t at = -1;
            for (int32_t r = 0; r < nranks; r++)
                if (own[r] > 0) {
                    tile = own[r] > tile ? own[r] : tile;
                    at = r / group;
                }
            for (int32_t r = at * group; at >= 0 && r < (at + 1) * group && r < nranks; r++)
                if (own[r] == 0)
                    bytes[r] += tile;
            free(own);
            continue;
        }
        int32_t first = owners[i].first_rank,
                size = owners[i].group_size > 0 ? owners[i].group_size : nranks;
        if (reduce && trainable)
            reduce[i] = (shard_reduce){first, size, 4 * numel, 0, 0, 0};
        tsl_plan_add_shards(&shape, grids[i].splits[0], size, 4 * copies, bytes + first);
        for (int32_t r = first; r < first + size; r++) /* each rank's whole copy */
            bytes[r] += 4 * numel;
    }
    free(grids);
    free(owners);
    free(sharded);
    free(bucket_of);
    free(replicated);
    return st;
}

tsl_status tsl_plan_estimate(const tsl_plan *plan, tsl_graph_t g, int32_t nranks, int32_t workers,
                             int64_t batch, int32_t optimizer_states, int64_t *bytes)
{
    if (!g || !bytes || nranks < 1 || batch < 1 || optimizer_states < 0)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "tsl_plan_estimate: bad argument");
    memset(bytes, 0, sizeof *bytes * (size_t)nranks);
    int32_t *op_stage = calloc((size_t)g->nops + 1, sizeof *op_stage);
    tsl_status st =
        op_stage ? estimate_setup(plan, g, nranks, workers, batch, optimizer_states, NULL, op_stage,
                                  bytes, NULL, NULL, "tsl_plan_estimate")
                 : tsl_error(NULL, TSL_ERR_OUT_OF_MEMORY, "tsl_plan_estimate: out of memory");
    tsl_shape input, shape;
    if (!st) /* else no input: the error stays the setup's */
        tsl_graph_value_shape(g, g->input, &input);
    for (int32_t v = 0; v < tsl_graph_value_count(g) && !st; v++)
        st = value_counts(plan, g, v, nranks, op_stage[g->values[v].producer], workers, batch,
                          4 * tsl_plan_value_copies(g, v, op_stage), bytes);
    for (int32_t o = 0; o < g->nops && !st; o++) { /* max pooling's indices */
        int32_t ib = tsl_graph_pool_index_bytes(&g->ops[o]);
        tsl_graph_value_shape(g, g->ops[o].output, &shape);
        if (ib)
            st =
                add_tensor(plan, &input, nranks, op_stage[o], workers, batch, &shape, 1, ib, bytes);
    }
    free(op_stage);
    return st;
}

/* Whether the executor cuts value v along channels under the plan's filters= or channels=
 * (tsl_plan_cuts_channels; not the model's output). */
static int channel_cut(const tsl_plan *plan, tsl_graph_t g, int32_t v)
{
    return v != g->output && tsl_plan_cuts_channels(plan, &g->values[v].shape);
}

/* Add (sign 1) or take away (-1) value v's activation-sized tile bytes, size[v * nranks + r],
 * and keep each rank's largest total in peak. */
/* Entry v of `size` (per rank) added to (sign 1) or taken from (-1) what lives on each rank,
 * with each rank's peak. Entry v has bytes only on ranks lo[v] .. hi[v] - 1 (those of its
 * stage, all ranks with one stage), so only those are visited. */
static void live_add(int64_t *live, int64_t *peak, const int64_t *size, int32_t v, int32_t nranks,
                     const int32_t *lo, const int32_t *hi, int sign)
{
    for (int32_t r = lo[v]; r < hi[v]; r++) {
        live[r] += sign * size[(int64_t)v * nranks + r];
        peak[r] = live[r] > peak[r] ? live[r] : peak[r];
    }
}

/* Slice j of m of entry v of `size` (a micro-batch's tiles of it) added or taken away, as
 * live_add(); the m slices add up to the whole entry. */
static void live_slice(int64_t *live, int64_t *peak, const int64_t *size, int32_t v, int32_t nranks,
                       const int32_t *lo, const int32_t *hi, int sign, int32_t j, int32_t m)
{
    for (int32_t r = lo[v]; r < hi[v]; r++) {
        int64_t whole = size[(int64_t)v * nranks + r];
        live[r] += sign * (whole * (j + 1) / m - whole * j / m);
        peak[r] = live[r] > peak[r] ? live[r] : peak[r];
    }
}

/* live_slice() of micro-batch j of m, or with m = 1 live_add() of the whole entry. */
static void live_part(int64_t *live, int64_t *peak, const int64_t *size, int32_t v, int32_t nranks,
                      const int32_t *lo, const int32_t *hi, int sign, int32_t j, int32_t m)
{
    if (m > 1)
        live_slice(live, peak, size, v, nranks, lo, hi, sign, j, m);
    else
        live_add(live, peak, size, v, nranks, lo, hi, sign);
}

/* The temporaries of op o's partial weight gradients (shard_reduce::tree) on rank r, as its
 * backward takes micro-batch j of m, each of t sample tiles: its tiles' partials are made (the
 * very first in the gradient itself), then the tree adds what it can. held[o]: those kept
 * between micro-batches, which the tree's pairs leave waiting for a later tile, one per set bit
 * of the tiles made so far beyond the first (leaves 0..k-1 hold popcount(k) - 1), none after
 * the last micro-batch. (cnn 28^2 stages=2 on 2 ranks, the second stage's fc1 weight of
 * 1.6 MiB: measured 14.0, 15.2 and 17.0 MiB with 2, 4 and 8 micro-batches, as 1, 2 and 3 of
 * its temporaries at once; 14.0, 13.4 and 13.4 estimated without them.) */
static void partial_gradients(const struct tsl_graph *g, int32_t o, const shard_reduce *reduce,
                              int32_t j, int32_t m, int64_t t, int64_t *held, int64_t *live,
                              int64_t *peak, int32_t r)
{
    const tsl_graph_op *op = &g->ops[o];
    int64_t w = 0;
    for (int32_t q = 0; q < op->nparams && (op->kind == TSL_OP_CONV || op->kind == TSL_OP_LINEAR);
         q++)
        w += op->params[q] >= 0 ? reduce[op->params[q]].tree : 0;
    if (!(w > 0) || t < 1)
        return;
    int64_t made = (int64_t)(j + 1) * t, at_once = held[o] + t - (j == 0), after = 0;
    for (int64_t k = made; j < m - 1 && k; k &= k - 1) /* popcount(made) - 1 */
        after++;
    after = after > 0 ? after - 1 : 0;
    live[r] += (at_once - held[o]) * w;
    peak[r] = live[r] > peak[r] ? live[r] : peak[r];
    live[r] += (after - at_once) * w;
    held[o] = after;
}

/* Op o's entries of what a forward receives (a batch norm's sums, a filter plan's input copies
 * unless xcopy is NULL, a channel plan's partial outputs, halo slabs) added (sign 1) or taken
 * away. */
static void forward_receives(int64_t *live, int64_t *peak, const int64_t *sums,
                             const int64_t *xcopy, const int64_t *partials, const int64_t *hfwd,
                             int32_t o, int32_t nranks, const int32_t *lo, const int32_t *hi,
                             int sign)
{
    live_add(live, peak, sums, o, nranks, lo, hi, sign);
    if (xcopy)
        live_add(live, peak, xcopy, o, nranks, lo, hi, sign);
    live_add(live, peak, partials, o, nranks, lo, hi, sign);
    live_add(live, peak, hfwd, o, nranks, lo, hi, sign);
}

/* A rank's tile bytes `row` of a value the plan cuts along channels, made whole along them as
 * the executor makes the model's output (the losses read whole channels): each channel-whole
 * tile on filter group 0's rank of its samples and box (the owner grid D x F x space, row-major
 * within a stage's ranks), the F - 1 others' bytes moved onto it. */
static void whole_channels(const tsl_plan *plan, int32_t nranks, int64_t *row)
{
    int32_t f = tsl_plan_channel_groups(plan), group;
    tsl_plan_stage_count(plan, nranks, &group);
    int32_t stride = group / (plan->data * f);
    if (plan->domains > 1 || stride < 1 || group % (plan->data * f * stride) != 0)
        return;
    for (int32_t r = 0; r < nranks; r++)
        if ((r % group / stride) % f == 0)
            for (int32_t k = 1; k < f && r + k * stride < nranks; k++)
                row[r] += row[r + k * stride];
    for (int32_t r = 0; r < nranks; r++)
        if ((r % group / stride) % f != 0)
            row[r] = 0;
}

tsl_status tsl_plan_estimate_peak(const tsl_plan *plan, tsl_graph_t g, int32_t nranks,
                                  int32_t workers, int64_t batch, int32_t optimizer_states,
                                  int64_t *bytes)
{
    if (!g || !bytes || nranks < 1 || batch < 1 || optimizer_states < 0)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "tsl_plan_estimate_peak: bad argument");
    return tsl_plan_peak_for_stages(plan, g, nranks, workers, batch, optimizer_states, NULL, bytes);
}

struct tsl_peak_memo {
    int32_t stages, nranks;
    int64_t nvalues, nops;
    int64_t **values, **indices; /* [nvalues * stages], [nops * stages]: rank bytes, or NULL */
};

tsl_peak_memo *tsl_peak_memo_create(const struct tsl_graph *g, int32_t stages, int32_t nranks)
{
    tsl_peak_memo *m = calloc(1, sizeof *m);
    if (!m)
        return NULL;
    m->stages = stages;
    m->nranks = nranks;
    m->nvalues = g->nvalues;
    m->nops = g->nops;
    m->values = calloc((size_t)(m->nvalues * stages) + 1, sizeof *m->values);
    m->indices = calloc((size_t)(m->nops * stages) + 1, sizeof *m->indices);
    if (!m->values || !m->indices) {
        tsl_peak_memo_destroy(m);
        return NULL;
    }
    return m;
}

void tsl_peak_memo_destroy(tsl_peak_memo *m)
{
    if (!m)
        return;
    for (int64_t i = 0; m->values && i < m->nvalues * m->stages; i++)
        free(m->values[i]);
    for (int64_t i = 0; m->indices && i < m->nops * m->stages; i++)
        free(m->indices[i]);
    free(m->values);
    free(m->indices);
    free(m);
}

/* add_tensor() into `row` (zeroed, nranks entries), through the memo's entry `slot` where
 * there is one. */
static tsl_status add_tensor_memo(const tsl_plan *plan, const tsl_shape *input, int32_t nranks,
                                  int32_t stage, int32_t workers, int64_t batch,
                                  const tsl_shape *sample, int64_t elem, int64_t **slot,
                                  int64_t *row)
{
    if (!slot)
        return add_tensor(plan, input, nranks, stage, workers, batch, sample, 1, elem, row);
    if (!*slot) {
        int64_t *made = calloc((size_t)nranks, sizeof *made);
        if (!made)
            return tsl_error(NULL, TSL_ERR_OUT_OF_MEMORY, "tsl_plan_estimate_peak: out of memory");
        tsl_status st =
            add_tensor(plan, input, nranks, stage, workers, batch, sample, 1, elem, made);
        if (st) {
            free(made);
            return st;
        }
        *slot = made;
    }
    memcpy(row, *slot, sizeof *row * (size_t)nranks);
    return TSL_OK;
}

/* tsl_plan_estimate_peak() for the op stages `given` (NULL: tsl_plan_stages()). */
tsl_status tsl_plan_peak_for_stages(const tsl_plan *plan, tsl_graph_t g, int32_t nranks,
                                    int32_t workers, int64_t batch, int32_t optimizer_states,
                                    const int32_t *given, int64_t *bytes)
{
    return tsl_plan_peak_memo(plan, g, nranks, workers, batch, optimizer_states, given, NULL, 0,
                              bytes);
}

tsl_status tsl_plan_peak_memo(const tsl_plan *plan, tsl_graph_t g, int32_t nranks, int32_t workers,
                              int64_t batch, int32_t optimizer_states, const int32_t *given,
                              tsl_peak_memo *memo, int stage_copies, int64_t *bytes)
{
    const char *fn = "tsl_plan_estimate_peak";
    memset(bytes, 0, sizeof *bytes * (size_t)nranks);
    int32_t nv = g->nvalues, n = g->nops;
    int32_t *op_stage = calloc((size_t)n + 1, sizeof *op_stage);
    int32_t *relu_of = calloc((size_t)n + 1, sizeof *relu_of);
    uint8_t *fused = calloc((size_t)n + 1, 1);
    int32_t *fold = calloc((size_t)n + 1, sizeof *fold);
    uint8_t *written = calloc((size_t)nv + 1, 1), *spare = calloc((size_t)nv + 1, 1);
    uint8_t *gone = calloc((size_t)nv + 1, 1);    /* released after the forward's last reader */
    uint8_t *dropped = calloc((size_t)nv + 1, 1); /* and made again for the backward */
    int64_t *size = calloc((size_t)nv * (size_t)nranks + 1, sizeof *size);
    int64_t *isize = calloc((size_t)n * (size_t)nranks + 1, sizeof *isize); /* max pool indices */
    /* A convolution (or linear layer) over channel tiles runs where its output tiles live and
     * reads the input's other F - 1 channel tiles of the same samples there: received copies,
     * kept for its weight gradient until its backward. An op that takes no channel tiles (a
     * transposed convolution) reads a channel-cut input as a channel-whole copy on filter
     * group 0 (F times a rank's tiles of it), kept likewise. StarPU-MPI allocates what a rank
     * receives when the step's tasks are submitted, well ahead of their run: received copies
     * (these, the backward's received gradient parts in `early`, a batch norm's sums) are held
     * from the step's start. */
    int64_t *xcopy = calloc((size_t)n * (size_t)nranks + 1, sizeof *xcopy);
    /* Its data gradient is made in parts where the output gradient's tiles live: F - 1 parts
     * of a rank's input-gradient tiles made for other ranks, and F - 1 received from them,
     * alive while the op's backward adds them. */
    int64_t *dxpart = calloc((size_t)n * (size_t)nranks + 1, sizeof *dxpart);
    int64_t *early = calloc((size_t)n * (size_t)nranks + 1, sizeof *early);
    /* The pieces of sharded weights' gradients a rank receives (reduce_received): posted when
     * the backward is submitted, all of them at once, and freed with the reduction, after the
     * backward of the weight's first op (wide cnn 16^2 data=4: 12 pieces of 0.56 MiB allocated
     * before the first backward task ran; 28.8 MiB estimated with each weight's pieces counted
     * during its op's backward only, 35.2 measured). */
    int64_t *shrecv = calloc((size_t)n * (size_t)nranks + 1, sizeof *shrecv);
    uint8_t *seen = calloc((size_t)g->nparams + 1, 1); /* (a weight's first op found) */
    /* The backward's per op (found in its first pass): the gradients it makes, the copies of
     * its output it frees, the fused ReLU outputs it frees. */
    int32_t *made_at = calloc((size_t)n * TSL_GRAPH_MAX_INPUTS + 1, sizeof *made_at);
    int32_t *freed_at = calloc((size_t)n * TSL_GRAPH_MAX_INPUTS + 1, sizeof *freed_at);
    int32_t *nmade_at = calloc((size_t)n + 1, sizeof *nmade_at);
    int32_t *nfreed_at = calloc((size_t)n + 1, sizeof *nfreed_at);
    int32_t *copies_at = calloc((size_t)n + 1, sizeof *copies_at);
    /* A channels= convolution's partial outputs a rank receives in the forward's trees (F - 1
     * of its output tiles' size), likewise held from the step's start until that forward. */
    int64_t *partials = calloc((size_t)n * (size_t)nranks + 1, sizeof *partials);
    /* A batch norm's exact sums received from the other ranks (tsl_plan_sums_received), in each
     * of its forward and backward: StarPU-MPI allocates a receive when the step's tasks are
     * submitted, well ahead of their run, so both are held from the step's start until the
     * forward, and the backward, merges them. */
    int64_t *sums = calloc((size_t)n * (size_t)nranks + 1, sizeof *sums);
    /* A convolution's halo slabs (tsl_plan_halos_received), received for its forward and its
     * backward: held likewise, from the step's start until that pass. */
    int64_t *hfwd = calloc((size_t)n * (size_t)nranks + 1, sizeof *hfwd);
    int64_t *hbwd = calloc((size_t)n * (size_t)nranks + 1, sizeof *hbwd);
    /* An op moved onto a common tile grid (tsl_plan_regrid_bytes): its input there (made in
     * its forward; kept for a backward that reads it), its output there, and in its backward
     * their gradients alike. What the moves receive goes with the halos' and copies' entries. */
    int64_t *rcx = calloc((size_t)n * (size_t)nranks + 1, sizeof *rcx);
    int64_t *rcy = calloc((size_t)n * (size_t)nranks + 1, sizeof *rcy);
    /* The pieces a move onto the common grid receives for the forward (posted with the step)
     * and whether it receives any. The copy's own pieces are copied in as soon as they exist;
     * the copy and the received pieces wait for the other ranks' pieces and the op's task:
     * with the ranks out of step, until the forward's end (dsn space=2 on 2 ranks: an
     * allocation trace showed rank 0's peak holding the four global poolings' copies and
     * received pieces at once; 12.1 MiB estimated when each goes with its op, 13.9 held to the
     * forward's end, 14.0 measured). */
    int64_t *gotf = calloc((size_t)n * (size_t)nranks + 1, sizeof *gotf);
    uint8_t *pieces = calloc((size_t)n + 1, 1);
    uint32_t *freed_in = calloc((size_t)n + 1, sizeof *freed_in); /* (bit k: input k) */
    int64_t *got = calloc(2 * (size_t)nranks, sizeof *got);       /* (one op's received parts) */
    /* With stage_copies, what a pipeline stage receives from another (tsl_plan_estimate_received):
     * sin, op o's inputs made on other stages, received on o's stage; sout, in o's backward,
     * its output gradient received on the stage of each such input (a concatenation: the
     * input's part, cut on o's stage first). */
    int64_t *sin = calloc((size_t)n * (size_t)nranks + 1, sizeof *sin);
    int64_t *sout = calloc((size_t)n * (size_t)nranks + 1, sizeof *sout);
    int64_t *live = calloc((size_t)nranks, sizeof *live);
    int64_t *kept = calloc((size_t)n + 1, sizeof *kept); /* (an op's partials kept, in passes) */
    shard_reduce *reduce = calloc((size_t)g->nparams + 1, sizeof *reduce);
    uint8_t *owns = calloc((size_t)g->nparams * (size_t)nranks + 1, 1);
    tsl_status st = op_stage && relu_of && fused && fold && written && spare && gone && dropped &&
                            size && isize && xcopy && dxpart && early && partials && sums && hfwd &&
                            hbwd && rcx && rcy && gotf && pieces && freed_in && got && sin &&
                            sout && live && kept && reduce && owns && shrecv && seen && made_at &&
                            freed_at && nmade_at && nfreed_at && copies_at
                        ? estimate_setup(plan, g, nranks, workers, batch, optimizer_states, given,
                                         op_stage, live, reduce, owns, fn)
                        : tsl_error(NULL, TSL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    tsl_shape input, shape;
    if (!st) /* else no input: the error stays the setup's */
        tsl_graph_value_shape(g, g->input, &input);
    if (memo && (memo->nranks != nranks || memo->nvalues != nv || memo->nops != n))
        memo = NULL;
    const int32_t domain_cut = tsl_plan_domain_input_parts(plan, g) > 0;
    for (int32_t v = 0; v < nv && !st; v++) {
        int32_t s = op_stage[g->values[v].producer];
        tsl_graph_value_shape(g, v, &shape);
        if (domain_cut && v == g->input) { /* (cut onto the domain groups) */
            memset(size + (int64_t)v * nranks, 0, sizeof *size * (size_t)nranks);
            st = value_counts(plan, g, v, nranks, s, workers, batch, 4, size + (int64_t)v * nranks);
            continue;
        }
        st = add_tensor_memo(plan, &input, nranks, s, workers, batch, &shape, 4,
                             memo && s < memo->stages ? &memo->values[(int64_t)v * memo->stages + s]
                                                      : NULL,
                             size + (int64_t)v * nranks);
        if (!st && v == g->output && tsl_plan_cuts_channels(plan, &shape))
            whole_channels(plan, nranks, size + (int64_t)v * nranks);
    }
    for (int32_t o = 0; o < n && !st; o++) {
        int32_t ib = tsl_graph_pool_index_bytes(&g->ops[o]), s = op_stage[o];
        tsl_graph_value_shape(g, g->ops[o].output, &shape);
        if (ib)
            st = add_tensor_memo(
                plan, &input, nranks, s, workers, batch, &shape, ib,
                memo && s < memo->stages ? &memo->indices[(int64_t)o * memo->stages + s] : NULL,
                isize + (int64_t)o * nranks);
        const tsl_graph_op *op = &g->ops[o];
        if (!st && op->kind == TSL_OP_BATCHNORM)
            st = tsl_plan_sums_received(plan, g, o, nranks, s, workers, batch,
                                        sums + (int64_t)o * nranks);
        if (!st && op->kind == TSL_OP_CONV)
            st = tsl_plan_halos_received(plan, g, o, nranks, s, workers, batch,
                                         hfwd + (int64_t)o * nranks, hbwd + (int64_t)o * nranks);
        if (!st && nranks > 1 &&
            !(st = tsl_plan_regrid_bytes(plan, g, o, nranks, s, workers, batch,
                                         rcx + (int64_t)o * nranks, rcy + (int64_t)o * nranks, got,
                                         got + nranks)))
            for (int32_t r = 0; r < nranks; r++) { /* received parts: posted with the step,
                                                       dropped once copied */
                pieces[o] |= got[r] > 0;
                gotf[(int64_t)o * nranks + r] += got[r];
                hbwd[(int64_t)o * nranks + r] += got[nranks + r];
            }
        for (int32_t q = 0; q < op->nparams && !st; q++) { /* (on the weight's first op) */
            int32_t pq = op->params[q], first = pq >= 0 && !seen[pq];
            if (first)
                seen[pq] = 1;
            const shard_reduce *rd = pq >= 0 ? &reduce[pq] : NULL;
            for (int32_t r = rd ? rd->first : 0; first && rd && r < rd->first + rd->count; r++)
                shrecv[(int64_t)o * nranks + r] += reduce_received(rd);
        }
        int32_t f = tsl_plan_channel_groups(plan);
        /* A weight cut by filters whose group holds m ranks (samples or spatial tiles within
         * it): each non-owner makes a partial gradient of its group's tile during the op's
         * backward, and the owner receives the m - 1 others, posted with the backward. */
        const shard_reduce *cut =
            op->nparams > 0 && op->params[0] >= 0 ? &reduce[op->params[0]] : NULL;
        int32_t cut_group;
        tsl_plan_stage_count(plan, nranks, &cut_group);
        int32_t m = cut && cut->cut_owners > 0 ? cut_group / cut->cut_owners : 1;
        for (int32_t r = 0; r < nranks && m > 1; r++) {
            if (owns[(int64_t)op->params[0] * nranks + r])
                early[(int64_t)o * nranks + r] += (m - 1) * cut->cut_tile;
            else if (op_stage[o] == r / cut_group)
                dxpart[(int64_t)o * nranks + r] += cut->cut_tile;
        }
        /* The output's channel tiles: F, or 1 where the plan keeps it whole along channels
         * (the model's output, channels F does not divide). A whole output's tiles live on
         * some of the ranks holding its input's channel tiles; the others receive its gradient
         * (the largest rank's tile of it) for their input gradient tiles, made where those
         * live, posted with the backward. */
        const int32_t ky = channel_cut(plan, g, op->output) ? f : 1;
        int64_t ymax = 0;
        for (int32_t r = 0; r < nranks && ky == 1; r++)
            ymax = size[(int64_t)op->output * nranks + r] > ymax
                       ? size[(int64_t)op->output * nranks + r]
                       : ymax;
        if (tsl_plan_input_channel_cut(plan, g, o)) {
            /* channels=: nothing kept from the forward; its backward receives the output
             * gradient's ky - 1 other channel tiles (held from the step's start; a rank holding
             * input tiles but no output tile receives the output's) and makes ky parts of each
             * input gradient tile where it lives, one into the tile. A tree adds them pairwise
             * as they are made (1 + 2, 3 + 4, then 1 + 3 ...): at most log2(ky) temporaries
             * live at once (fcn2d channels=4, 4 ranks: 23.9 MiB estimated with all 3, 22.9
             * with 2, 20.6 measured). */
            int32_t pairs = 0;
            while ((1 << pairs) < ky)
                pairs++;
            for (int32_t r = 0; r < nranks; r++) {
                int64_t y = size[(int64_t)op->output * nranks + r],
                        x = size[(int64_t)op->inputs[0] * nranks + r];
                partials[(int64_t)o * nranks + r] += (f - 1) * y;
                early[(int64_t)o * nranks + r] += ky > 1 ? (ky - 1) * y : x > 0 && !y ? ymax : 0;
                dxpart[(int64_t)o * nranks + r] += pairs * x;
            }
            continue;
        }
        int weighted = (op->kind == TSL_OP_CONV || op->kind == TSL_OP_LINEAR) &&
                       tsl_plan_takes_channel_tiles(op);
        int64_t copies = weighted ? f - 1 : !tsl_plan_takes_channel_tiles(op) ? f : 0;
        /* filters=: the tasks of an output tile run where it lives and read its samples' F - 1
         * other input channel tiles there, received copies. Its input gradient is made in
         * ky parts where the output gradient's tiles live: ky - 1 made for other ranks, and
         * ky - 1 received. With a whole output (ky 1) each input gradient tile is made where
         * it lives, from the received output gradient on a rank holding no output tile. */
        for (int32_t k = 0; k < op->ninputs && !st && copies > 0; k++)
            if (channel_cut(plan, g, op->inputs[k]))
                for (int32_t r = 0; r < nranks; r++) {
                    int64_t b = size[(int64_t)op->inputs[k] * nranks + r],
                            y = size[(int64_t)op->output * nranks + r];
                    int held = !weighted || ky > 1 || y > 0; /* (runs output tiles) */
                    xcopy[(int64_t)o * nranks + r] += held ? copies * b : 0;
                    if (!weighted || tsl_graph_is_input(g, op->inputs[k]))
                        continue;
                    if (ky == 1) {
                        early[(int64_t)o * nranks + r] += b > 0 && !y ? ymax : 0;
                        continue;
                    }
                    early[(int64_t)o * nranks + r] += copies * b;  /* received parts */
                    dxpart[(int64_t)o * nranks + r] += copies * b; /* made for others */
                }
        if (!st && plan && !tsl_plan_takes_channel_tiles(op) && channel_cut(plan, g, op->output))
            for (int32_t r = 0; r < nranks; r++) /* and its output made channel-whole first */
                xcopy[(int64_t)o * nranks + r] += f * size[(int64_t)op->output * nranks + r];
    }
    /* The ranks each value's bytes are on (its producer's stage's), and each op's entries
     * (its stage's, its inputs' and its output's: the copies above). */
    int32_t group, stages = tsl_plan_stage_count(plan, nranks, &group);
    int32_t *vlo = malloc(sizeof *vlo * ((size_t)nv + 1)),
            *vhi = malloc(sizeof *vhi * ((size_t)nv + 1));
    int32_t *olo = malloc(sizeof *olo * ((size_t)n + 1)),
            *ohi = malloc(sizeof *ohi * ((size_t)n + 1));
    int32_t *all_lo = calloc((size_t)n + 1, sizeof *all_lo), /* (every rank, for sin, sout) */
        *all_hi = malloc(sizeof *all_hi * ((size_t)n + 1));
    if (!st && (!vlo || !vhi || !olo || !ohi || !all_lo || !all_hi))
        st = tsl_error(NULL, TSL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    for (int32_t o = 0; !st && o < n; o++)
        all_hi[o] = nranks;
    for (int32_t o = 0; !st && stage_copies && stages > 1 && o < n; o++) {
        const tsl_graph_op *op = &g->ops[o];
        int32_t so = op_stage[o];
        int64_t out = 4 * batch * tsl_shape_numel(&g->values[op->output].shape) / group;
        /* (and a convolution's or linear layer's weight, read by those tasks) */
        if ((op->kind == TSL_OP_CONV || op->kind == TSL_OP_LINEAR) && op->nparams > 0 &&
            op->params[0] >= 0)
            out += 4 * tsl_shape_numel(&g->params[op->params[0]].shape);
        for (int32_t k = 0; k < op->ninputs; k++) {
            int32_t v = op->inputs[k], sv = op_stage[g->values[v].producer];
            if (sv == so)
                continue;
            int64_t in = 4 * batch * tsl_shape_numel(&g->values[v].shape) / group;
            for (int32_t r = so * group; r < (so + 1) * group; r++)
                sin[(int64_t)o * nranks + r] += in;
            if (tsl_graph_is_input(g, v))
                continue;
            for (int32_t r = sv * group; r < (sv + 1) * group; r++)
                sout[(int64_t)o * nranks + r] += op->kind == TSL_OP_CONCAT ? in : out;
            for (int32_t r = so * group; r < (so + 1) * group && op->kind == TSL_OP_CONCAT; r++)
                sout[(int64_t)o * nranks + r] += in;
        }
    }
    for (int32_t v = 0; v < nv && !st; v++) {
        vlo[v] = stages > 1 ? op_stage[g->values[v].producer] * group : 0;
        vhi[v] = stages > 1 ? vlo[v] + group : nranks;
    }
    for (int32_t o = 0; o < n && !st; o++) {
        const tsl_graph_op *op = &g->ops[o];
        olo[o] = stages > 1 ? op_stage[o] * group : 0;
        ohi[o] = stages > 1 ? olo[o] + group : nranks;
        for (int32_t k = -1; k < op->ninputs; k++) {
            int32_t v = k < 0 ? op->output : op->inputs[k];
            olo[o] = vlo[v] < olo[o] ? vlo[v] : olo[o];
            ohi[o] = vhi[v] > ohi[o] ? vhi[v] : ohi[o];
        }
    }
    if (!st) {
        /* What the forward receives, posted when it is submitted. (The backward is submitted
         * once the loss is known, and the next step's forward right after it: from then on
         * both of their receives are held, below.) */
        for (int32_t o = 0; o < n; o++) {
            forward_receives(live, bytes, sums, xcopy, partials, hfwd, o, nranks, olo, ohi, 1);
            live_add(live, bytes, gotf, o, nranks, olo, ohi, 1);
        }
        /* The copies of values from other stages are StarPU-MPI's cached copies, one per tile
         * handle: flushed when the executor releases the value, and received again at once for
         * the next step's forward, posted by then. They are held for the whole step. */
        for (int32_t o = 0; o < n; o++)
            live_add(live, bytes, sin, o, nranks, all_lo, all_hi, 1);
        memcpy(bytes, live, sizeof *bytes * (size_t)nranks);
        for (int32_t o = 0; o < n; o++) {
            relu_of[o] = tsl_graph_fused_relu(g, o, op_stage);
            if (relu_of[o] >= 0)
                fused[relu_of[o]] = 1;
            fold[o] = tsl_graph_folded_concat(g, o, op_stage);
        }
        /* Forward: every op's output made (a batch norm's with a fused ReLU is the ReLU's, a
         * folded concatenation's none); a value no backward reads, or one the backward makes
         * again (tsl_graph_recomputed()), goes after its last forward reader. With micro-batches
         * a rank takes micro-batch 0 through a stretch of the forward before micro-batch 1 (the
         * tasks' priorities), as in the backward: from a batch norm (whose statistics wait for
         * every micro-batch of its input) up to the next. Such a stretch is walked once per
         * micro-batch, its outputs made and its values freed a micro-batch's slice a pass (cnn3d
         * 32^3 stages=2,micro=4's second stage: bn1's 16 MiB ReLU output, freed after the max
         * pooling, was estimated whole at once, 35.3 MiB; 29.7 measured, the peak in the
         * backward); what an op receives for all of them is added in the first pass and goes in
         * the last. The inputs an op frees are found in the first pass (freed_in). */
        const int32_t fmicro = plan && plan->micro > 1 ? plan->micro : 1;
        for (int32_t lo = 0, hi = 0; lo < n; lo = hi + 1) {
            hi = lo;
            if (fmicro > 1)
                while (hi + 1 < n && g->ops[hi + 1].kind != TSL_OP_BATCHNORM)
                    hi++;
            const int32_t passes = lo < hi ? fmicro : 1;
            for (int32_t pass = 0; pass < passes; pass++)
                for (int32_t o = lo; o <= hi; o++) {
                    const int first = pass == 0, last = pass == passes - 1;
                    if (first) {
                        live_add(live, bytes, rcx, o, nranks, olo, ohi, 1);
                        live_add(live, bytes, rcy, o, nranks, olo, ohi, 1);
                    }
                    if (relu_of[o] < 0 && fold[o] < 0)
                        live_part(live, bytes, size, g->ops[o].output, nranks, vlo, vhi, 1, pass,
                                  passes);
                    if (last && !tsl_graph_op_reads_input_backward(&g->ops[o]) && !pieces[o])
                        live_add(live, bytes, rcx, o, nranks, olo, ohi, -1);
                    /* a max pooling's indices */
                    live_part(live, bytes, isize, o, nranks, olo, ohi, 1, pass, passes);
                    if (last) { /* the forward's receives, merged */
                        live_add(live, bytes, sums, o, nranks, olo, ohi, -1);
                        live_add(live, bytes, partials, o, nranks, olo, ohi, -1);
                        live_add(live, bytes, hfwd, o, nranks, olo, ohi, -1);
                    }
                    int32_t ins[TSL_GRAPH_MAX_INPUTS], nin = tsl_graph_exec_inputs(g, o, fold, ins);
                    for (int32_t k = 0; k < nin; k++) {
                        int32_t v = ins[k];
                        if (first) {
                            if (gone[v] || tsl_graph_loss_reads(g, v) ||
                                !tsl_graph_last_reader(g, v, o, fold))
                                continue; /* (a loss term's value stays to the loss) */
                            int later = tsl_graph_value_read_backward(g, v, fused, fold);
                            dropped[v] = later && plan && plan->recompute &&
                                         tsl_graph_recomputed(g, v, op_stage) >= 0;
                            if (later && !dropped[v])
                                continue;
                            gone[v] = 1;
                            freed_in[o] |= 1u << k;
                        }
                        if (freed_in[o] & (1u << k))
                            live_part(live, bytes, size, v, nranks, vlo, vhi, -1, pass, passes);
                    }
                }
        }
        for (int32_t o = 0; o < n; o++) { /* (the moves that waited for other ranks) */
            if (!tsl_graph_op_reads_input_backward(&g->ops[o]) && pieces[o])
                live_add(live, bytes, rcx, o, nranks, olo, ohi, -1);
            live_add(live, bytes, gotf, o, nranks, olo, ohi, -1); /* (zero without pieces) */
        }
        /* Backward, as the executor runs it: an op's input gradients are made (a spare for a
         * value's second contribution); then the op's output, its gradient and spare are
         * released, since no later op in the backward reads them (the model's output stays,
         * the accuracy reads it). */
        for (int32_t o = 0; o < n; o++) {
            live_add(live, bytes, sums, o, nranks, olo, ohi, 1); /* the backward's receives */
            live_add(live, bytes, early, o, nranks, olo, ohi, 1);
            live_add(live, bytes, shrecv, o, nranks, olo, ohi, 1);
            live_add(live, bytes, hbwd, o, nranks, olo, ohi, 1);
            /* the next step's forward's into new temporaries, held to the end (its input
             * copies land in the buffers this step's copies hold) */
            forward_receives(live, bytes, sums, NULL, partials, hfwd, o, nranks, olo, ohi, 1);
            live_add(live, bytes, gotf, o, nranks, olo, ohi, 1);
        }
        int32_t out = tsl_graph_output(g);
        const int32_t micro = plan && plan->micro > 1 ? plan->micro : 1;
        /* a micro-batch's sample tiles on a rank (of a stage of one rank) */
        const int64_t per_batch = workers < batch / micro ? workers : batch / micro;
        written[out] = 1;
        live_add(live, bytes, size, out, nranks, vlo, vhi, 1);
        for (int32_t t = 0; t < g->nloss; t++) { /* the gradients loss terms write */
            int32_t into[2] = {tsl_loss_term_value(g, &g->loss[t]),
                               tsl_model_loss_of_two_values(g->loss[t].kind)
                                   ? g->loss[t].against - 1
                                   : -1}; /* (difference, similarity: both values) */
            for (int k = 0; k < 2; k++)
                if (into[k] >= 0 && !written[into[k]]) {
                    written[into[k]] = 1;
                    live_add(live, bytes, size, into[k], nranks, vlo, vhi, 1);
                }
        }
        /* With micro-batches a rank takes micro-batch 0 through a stretch of the backward before
         * micro-batch 1 (their tasks' priorities) where no op waits for all of them: from a
         * batch norm down to the next. A batch norm's exact statistics need every micro-batch;
         * once they are summed, its input gradient is made micro-batch by micro-batch, each
         * going on through the ops below it (fcn2d stages=2,micro=8's first stage: the trace
         * showed bn2's backward data task, then conv2's two backward tasks, micro-batch after
         * micro-batch, its peak 16.9 MiB at bn2's statistics; 20.2 estimated when the batch
         * norm made every micro-batch's input gradient before conv2's backward took any). (dsn
         * stages=2,micro=2's second stage, no batch norm: its peak was the forward's end, 8.1 MiB,
         * as it freed micro-batch 0's tiles through the whole branch before micro-batch 1's
         * gradients came; walked op by op, each op's micro-batches in turn, 11.3 MiB.) Such a
         * stretch is walked once per micro-batch, each pass making and freeing that micro-batch's
         * slices; what an op holds for all of them goes in the last pass. An op's gradients to make
         * and copies to free are found in the first pass (made_at, nmade_at, copies_at), and the
         * fused ReLU outputs it frees (freed_at, nfreed_at). */
        for (int32_t hi = n - 1, lo = n - 1; hi >= 0 && !st; hi = lo - 1) {
            lo = hi;
            if (micro > 1)
                while (lo > 0 && g->ops[lo - 1].kind != TSL_OP_BATCHNORM)
                    lo--;
            const int32_t passes = lo < hi ? micro : 1;
            for (int32_t pass = 0; pass < passes; pass++)
                for (int32_t o = hi; o >= lo; o--) {
                    const tsl_graph_op *op = &g->ops[o];
                    if (fused[o] || fold[o] >= 0)
                        continue;
                    const int first = pass == 0, last = pass == passes - 1;
                    const int32_t jlo = passes > 1 ? pass : 0, jhi = passes > 1 ? pass + 1 : micro;
                    int32_t y = relu_of[o] >= 0 ? g->ops[relu_of[o]].output : op->output;
                    int32_t ins[TSL_GRAPH_MAX_INPUTS], nin = tsl_graph_exec_inputs(g, o, fold, ins);
                    for (int32_t k = 0;
                         k < nin && first && written[y] && tsl_graph_op_reads_input_backward(op);
                         k++)
                        if (dropped[ins[k]]) { /* made again */
                            dropped[ins[k]] = gone[ins[k]] = 0;
                            live_add(live, bytes, size, ins[k], nranks, vlo, vhi, 1);
                        }
                    /* gradients (spares) it makes */
                    int32_t *made = made_at + (int64_t)o * TSL_GRAPH_MAX_INPUTS,
                            nmade = nmade_at[o];
                    for (int32_t k = 0; k < nin && first && written[y] && op->kind != TSL_OP_INPUT;
                         k++) {
                        int32_t v = ins[k];
                        if (tsl_graph_is_input(g, v)) {
                            if (op->kind == TSL_OP_CONCAT &&
                                !spare[v]) /* its part goes to a spare */
                                spare[v] = 1, made[nmade++] = v;
                        } else if (!written[v]) {
                            written[v] = 1;
                            made[nmade++] = v;
                        } else if (!spare[v]) {
                            spare[v] = 1;
                            made[nmade++] = v;
                        }
                    }
                    if (first) {
                        nmade_at[o] = nmade;
                        copies_at[o] = (y != out && !gone[y]) +
                                       written[y] * !tsl_graph_is_input(g, y) + spare[y];
                    }
                    const int copies = copies_at[o];
                    /* the output gradient received for its input gradients: the tasks making them
                     * run on the inputs' stages, and it goes once they have read it (with the
                     * stretch's passes, micro-batch by micro-batch) */
                    if (first)
                        live_add(live, bytes, sout, o, nranks, all_lo, all_hi, 1);
                    /* moved onto the common grid: the output gradient, and the input gradient made
                     * there (then moved back) */
                    const int moved = written[y] && op->ninputs > 0;
                    const int dx_moved = moved && !tsl_graph_is_input(g, op->inputs[0]);
                    if (moved)
                        live_add(live, bytes, rcy, o, nranks, olo, ohi, 1);
                    if (dx_moved)
                        live_add(live, bytes, rcx, o, nranks, olo, ohi, 1);
                    /* In a pipeline a rank takes its micro-batches through the backward one after
                     * the other (priorities), each tile's memory allocated when its task first
                     * writes it and freed after its last reader: micro-batch j's input gradients
                     * are made and its output, output gradient (and their copies) go before
                     * micro-batch j + 1's are made. Otherwise the op's input gradients are made
                     * while all of its output lives. */
                    for (int32_t j = jlo; j < jhi; j++) {
                        for (int32_t k = 0; k < nmade; k++)
                            live_slice(live, bytes, size, made[k], nranks, vlo, vhi, 1, j, micro);
                        live_slice(live, bytes, dxpart, o, nranks, olo, ohi, 1, j, micro);
                        live_slice(live, bytes, dxpart, o, nranks, olo, ohi, -1, j, micro);
                        partial_gradients(g, o, reduce, j, micro, per_batch, kept, live, bytes,
                                          vlo[op->output]);
                        for (int c = 0; c < copies && micro > 1; c++)
                            live_slice(live, bytes, size, y, nranks, vlo, vhi, -1, j, micro);
                        if (micro > 1) {
                            live_slice(live, bytes, isize, o, nranks, olo, ohi, -1, j, micro);
                            live_slice(live, bytes, xcopy, o, nranks, olo, ohi, -1, j, micro);
                        }
                    }
                    /* (with passes, this pass's micro-batch of it) */
                    live_part(live, bytes, sout, o, nranks, all_lo, all_hi, -1, pass, passes);
                    if (moved) /* the common grid's copies and their gradients released */
                        live_add(live, bytes, rcy, o, nranks, olo, ohi, -1);
                    if (dx_moved)
                        live_add(live, bytes, rcx, o, nranks, olo, ohi, -1);
                    if (last) { /* what the op holds for all micro-batches */
                        live_add(live, bytes, early, o, nranks, olo, ohi, -1);
                        live_add(live, bytes, hbwd, o, nranks, olo, ohi, -1);
                        live_add(live, bytes, sums, o, nranks, olo, ohi,
                                 -1); /* the backward's, merged */
                        live_add(live, bytes, rcy, o, nranks, olo, ohi, -1);
                        if (tsl_graph_op_reads_input_backward(op))
                            live_add(live, bytes, rcx, o, nranks, olo, ohi, -1);
                        /* A sharded weight's gradient reduction: its partial and the pieces sent,
                         * made with the op's backward and freed once sent; the pieces received,
                         * freed once the reduction's tasks have added them, which they do as soon
                         * as the other ranks' same backward has sent theirs, long before the step's
                         * end (cnn 28^2 data=2: estimated 15.1 MiB when held to the step's end,
                         * measured 13.5). */
                        for (int32_t q = 0; q < op->nparams; q++) {
                            const shard_reduce *rd = &reduce[op->params[q]];
                            int64_t add = rd->bytes > 0 ? reduce_bytes(rd, op) : 0;
                            for (int32_t r = rd->first; r < rd->first + rd->count && add > 0; r++) {
                                live[r] += add;
                                bytes[r] = live[r] > bytes[r] ? live[r] : bytes[r];
                                live[r] -= add;
                            }
                        }
                        live_add(live, bytes, shrecv, o, nranks, olo, ohi, -1);
                        for (int c = 0; c < copies && micro == 1; c++)
                            live_add(live, bytes, size, y, nranks, vlo, vhi, -1);
                        if (micro == 1) {
                            live_add(live, bytes, isize, o, nranks, olo, ohi, -1);
                            live_add(live, bytes, xcopy, o, nranks, olo, ohi, -1);
                        }
                    }
                    /* A norm's fused ReLU output is read in the backward only by the ops it feeds
                     * (the fused backward masks by its input): its memory goes once the last of
                     * them is done, before the norm's backward makes its input gradient (the
                     * executor releases it after submitting that backward, which runs ahead of the
                     * tasks). With micro-batches too, once the op has taken all of them: fcn2d
                     * stages=2,micro=2's second stage freed bn3's ReLU output micro-batch by
                     * micro-batch as the classifier's weight gradients ran, before bn3's backward
                     * (22.5 MiB estimated when held to it, 18.6 measured). */
                    for (int32_t k = 0; k < nfreed_at[o] && passes > 1;
                         k++) /* (found in the first) */
                        live_slice(live, bytes, size,
                                   freed_at[(int64_t)o * TSL_GRAPH_MAX_INPUTS + k], nranks, vlo,
                                   vhi, -1, pass, micro);
                    for (int32_t k = 0; k < nin && first; k++) {
                        int32_t v = ins[k], r = g->values[v].producer, later = 0;
                        if (v == out || gone[v] || r < 0 || !fused[r])
                            continue;
                        /* (a folded concatenation's reads are its convolution's) */
                        int32_t nr;
                        const int32_t *readers = tsl_graph_readers(g, v, &nr);
                        for (int32_t q = 0; q < nr && !later; q++) {
                            int32_t j = fold[readers[q]] >= 0 ? fold[readers[q]] : readers[q];
                            later = j < o && !fused[j] && j != r &&
                                    tsl_graph_op_reads_input_backward(&g->ops[j]);
                        }
                        for (int32_t j = 0; nr < 0 && j < o && !later; j++) { /* (no index) */
                            int32_t jin[TSL_GRAPH_MAX_INPUTS],
                                nj = tsl_graph_exec_inputs(g, j, fold, jin);
                            for (int32_t q = 0; q < nj && !later; q++)
                                later = jin[q] == v && !fused[j] && fold[j] < 0 && j != r &&
                                        tsl_graph_op_reads_input_backward(&g->ops[j]);
                        }
                        if (!later) {
                            gone[v] = 1;
                            if (passes > 1) /* (a slice a pass, from this one) */
                                freed_at[(int64_t)o * TSL_GRAPH_MAX_INPUTS + nfreed_at[o]++] = v;
                            live_part(live, bytes, size, v, nranks, vlo, vhi, -1, pass, passes);
                        }
                    }
                }
        }
    }
    free(op_stage);
    free(relu_of);
    free(fused);
    free(fold);
    free(written);
    free(spare);
    free(gone);
    free(dropped);
    free(size);
    free(isize);
    free(xcopy);
    free(dxpart);
    free(early);
    free(shrecv);
    free(kept);
    free(freed_in);
    free(seen);
    free(made_at);
    free(freed_at);
    free(nmade_at);
    free(nfreed_at);
    free(copies_at);
    free(partials);
    free(hfwd);
    free(hbwd);
    free(rcx);
    free(rcy);
    free(pieces);
    free(gotf);
    free(got);
    free(sin);
    free(sout);
    free(all_lo);
    free(all_hi);
    free(sums);
    free(live);
    free(reduce);
    free(owns);
    free(vlo);
    free(vhi);
    free(olo);
    free(ohi);
    return st;
}

tsl_status tsl_plan_estimate_received(const tsl_plan *plan, tsl_graph_t g, int32_t nranks,
                                      int32_t workers, int64_t batch, int32_t optimizer_states,
                                      int64_t *bytes)
{
    if (!g || !bytes || nranks < 1 || workers < 1 || batch < 1 || optimizer_states < 0)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "tsl_plan_estimate_received: bad argument");
    return tsl_plan_received_for_stages(plan, g, nranks, workers, batch, optimizer_states, NULL,
                                        bytes);
}

/* tsl_plan_estimate_received() for the op stages `given` (NULL: tsl_plan_stages()): the peak
 * with the copies from other stages less the peak without them. */
tsl_status tsl_plan_received_for_stages(const tsl_plan *plan, tsl_graph_t g, int32_t nranks,
                                        int32_t workers, int64_t batch, int32_t optimizer_states,
                                        const int32_t *given, int64_t *bytes)
{
    memset(bytes, 0, sizeof *bytes * (size_t)nranks);
    int32_t group;
    if (tsl_plan_stage_count(plan, nranks, &group) == 1)
        return TSL_OK;
    int64_t *without = calloc((size_t)nranks, sizeof *without);
    tsl_status st = without ? tsl_plan_peak_memo(plan, g, nranks, workers, batch, optimizer_states,
                                                 given, NULL, 1, bytes)
                            : tsl_error(NULL, TSL_ERR_OUT_OF_MEMORY,
                                        "tsl_plan_estimate_received: out of memory");
    if (!st)
        st = tsl_plan_peak_memo(plan, g, nranks, workers, batch, optimizer_states, given, NULL, 0,
                                without);
    for (int32_t r = 0; r < nranks; r++)
        bytes[r] = st ? 0 : bytes[r] - without[r];
    free(without);
    return st;
}
