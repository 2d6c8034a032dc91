/* How a plan tiles tensors and places parameters (include/tessel/plan.h): tile grids and
 * owners per tensor, parameter shards and buckets. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "graph_internal.h"
#include "plan_internal.h"
#include "tessel/plan.h"

/* The wanted tiles per spatial dimension of the input: space[d], times T on the longest. */
static int wanted_splits(const tsl_plan *plan, const tsl_shape *input, int32_t splits[3])
{
    int spatial = input->ndim - 1, longest = 0;
    for (int d = 0; d < 3; d++) {
        splits[d] = plan && d < spatial ? plan->space[d] : 1;
        if (d < spatial && input->dims[1 + d] > input->dims[1 + longest])
            longest = d;
    }
    if (plan && spatial > 0)
        splits[longest] *= plan->tiles;
    return splits[0] * splits[1] * splits[2] > 1;
}

/* The stages of a plan (1 for NULL) and the ranks of each. */
int32_t tsl_plan_stage_count(const tsl_plan *plan, int32_t nranks, int32_t *group)
{
    int32_t stages = tsl_plan_depth(plan);
    *group = nranks / stages > 0 ? nranks / stages : 1;
    return stages;
}

/* `map` on stage s's ranks (unchanged with one stage). */
static tsl_owner_map on_stage(tsl_owner_map map, int32_t stages, int32_t group, int32_t s)
{
    return stages > 1 ? tsl_owner_on_ranks(map, s * group, group) : map;
}

/* The default (no plan) when samples run out: with fewer samples per rank than workers, the
 * plan data=R,tiles=T, T the tiles along the longest spatial dimension that give each worker
 * one, in `fill`; NULL where samples alone give every worker one (a sample tile per worker) or
 * cannot (no spatial dimension, fewer samples than ranks: those ranks stay idle). */
static const tsl_plan *default_spatial_plan(const tsl_shape *input, int32_t nranks, int32_t workers,
                                            int64_t batch, tsl_plan *fill)
{
    int64_t per_rank = batch / nranks, w = workers > 0 ? workers : 1;
    if (input->ndim < 2 || per_rank < 1 || per_rank >= w)
        return NULL;
    tsl_plan_init(fill);
    fill->data = nranks;
    fill->tiles = (int32_t)((w + per_rank - 1) / per_rank);
    return fill;
}

tsl_status tsl_plan_tensor_tiling(const tsl_plan *plan, const tsl_shape *input, int32_t nranks,
                                  int32_t stage, int32_t workers, int64_t batch,
                                  const tsl_shape *sample, int32_t first, tsl_tile_grid *grid,
                                  tsl_owner_map *owners)
{
    int32_t group, stages = tsl_plan_stage_count(plan, nranks, &group);
    if (!input || !sample || !grid || !owners || batch < 1 || nranks < 1 || stage < 0 ||
        stage >= stages)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "tsl_plan_tensor_tiling: bad argument");
    tsl_plan fill;
    if (!plan && (plan = default_spatial_plan(input, nranks, workers, batch, &fill)))
        group = nranks; /* the default has one stage */
    int64_t micro = plan ? plan->micro : 1;
    int32_t splits[3], filters = tsl_plan_channel_groups(plan);
    *grid = tsl_tile_grid_single();
    int spatial = wanted_splits(plan, input, splits);
    if (first == 1 && sample->ndim == 1 && filters > 1) {
        /* features (no spatial dimension; the plan cuts none: tsl_plan_cuts_channels): the rank
         * grid D x F, features cut in F where they divide (else on the filter group 0), each
         * data group's sample tiles as without channel groups */
        int64_t tiles = (int64_t)plan->data * (workers > 0 ? workers : 1) * micro * plan->tiles;
        int32_t procs[TSL_MAX_DIMS] = {plan->data, filters};
        if (tsl_plan_cuts_channels(plan, sample)) {
            grid->splits[0] = (int32_t)(tiles < batch ? tiles : batch);
            grid->splits[1] = filters;
            *owners = on_stage(tsl_owner_block(procs), stages, group, stage);
            return TSL_OK;
        }
        if (plan->space[0] * plan->space[1] * plan->space[2] == 1) {
            grid->splits[0] = (int32_t)(tiles < batch ? tiles : batch);
            *owners = on_stage(tsl_owner_block(procs), stages, group, stage);
            return TSL_OK;
        }
    }
    if (first == 0 && sample->ndim == 0 && filters > 1 &&
        plan->space[0] * plan->space[1] * plan->space[2] == 1) {
        /* a classifier's labels: the sample tiles of its output (features above), on the
         * D x F sample groups */
        int64_t tiles = (int64_t)plan->data * (workers > 0 ? workers : 1) * micro * plan->tiles;
        int32_t procs[TSL_MAX_DIMS] = {plan->data * filters};
        grid->splits[0] = (int32_t)(tiles < batch ? tiles : batch);
        *owners = on_stage(tsl_owner_block(procs), stages, group, stage);
        return TSL_OK;
    }
    if ((!spatial && filters == 1) || sample->ndim <= first) {
        int64_t tiles =
            (int64_t)group * (workers > 0 ? workers : 1) * micro * (plan ? plan->tiles : 1);
        grid->splits[0] = (int32_t)(tiles < batch ? tiles : batch);
        *owners = on_stage(tsl_owner_block(NULL), stages, group, stage);
        return TSL_OK;
    }
    /* The rank grid D x F x A x B x C (row-major); channels cut in F where they divide (else
     * on the filter group 0), per-position labels on D x F sample groups. Without a spatial
     * split, each rank gets a sample tile per worker. */
    int32_t procs[TSL_MAX_DIMS] = {0};
    int64_t per = spatial ? 1 : (workers > 0 ? workers : 1);
    int64_t sample_tiles = (int64_t)plan->data * micro * per;
    grid->splits[0] = (int32_t)(sample_tiles < batch ? sample_tiles : batch);
    procs[0] = plan->data * (first == 0 ? filters : 1);
    for (int d = 1; d <= sample->ndim && d < TSL_MAX_DIMS; d++) {
        int sp = d - 1 - first; /* spatial index, or < 0 for channels */
        procs[d] = sp >= 0 ? plan->space[sp] : filters;
        if (sp >= 0) {
            int64_t size = sample->dims[d - 1];
            grid->splits[d] = (int32_t)(splits[sp] < size ? splits[sp] : size);
        } else if (filters > 1 && sample->dims[0] % filters == 0) {
            grid->splits[d] = filters;
        }
    }
    *owners = on_stage(tsl_owner_block(procs), stages, group, stage);
    return TSL_OK;
}

void tsl_batch_shape(int64_t batch, const tsl_shape *sample, tsl_shape *out)
{
    memset(out, 0, sizeof *out);
    out->ndim = sample->ndim + 1;
    out->dims[0] = batch;
    for (int d = 0; d < sample->ndim; d++)
        out->dims[d + 1] = sample->dims[d];
}

/* Whether parameter i is the weight of a convolution or linear layer. */
static int is_weight(const struct tsl_graph *g, int32_t i)
{
    for (int32_t o = 0; o < g->nops; o++)
        if ((g->ops[o].kind == TSL_OP_CONV || g->ops[o].kind == TSL_OP_LINEAR) &&
            g->ops[o].nparams > 0 && g->ops[o].params[0] == i)
            return 1;
    return 0;
}

int tsl_plan_takes_channel_tiles(const tsl_graph_op *o)
{
    switch (o->kind) {
    case TSL_OP_CONV:
        return o->conv.groups == 1;
    case TSL_OP_LINEAR:
    case TSL_OP_BATCHNORM:
    case TSL_OP_ACTIVATION:
    case TSL_OP_POOL:
    case TSL_OP_CONCAT:
    case TSL_OP_ADD:
    case TSL_OP_FLATTEN:
    case TSL_OP_MUL:
    case TSL_OP_SLICE:
    case TSL_OP_DROPOUT:
    case TSL_OP_GROUPNORM:
        return 1;
    default:
        return 0;
    }
}

int tsl_plan_filter_cut(const tsl_plan *plan, const struct tsl_graph *g, int32_t o)
{
    int32_t f = tsl_plan_channel_groups(plan);
    if (f < 2 || o < 0 || o >= g->nops)
        return 0;
    const tsl_graph_op *op = &g->ops[o];
    const tsl_shape *out = &g->values[op->output].shape;
    int conv = op->kind == TSL_OP_CONV && op->conv.groups == 1 && out->ndim >= 2;
    return (conv || (op->kind == TSL_OP_LINEAR && out->ndim == 1)) &&
           tsl_plan_cuts_channels(plan, out) && op->output != g->output;
}

int tsl_plan_input_channel_cut(const tsl_plan *plan, const struct tsl_graph *g, int32_t o)
{
    if (!plan || plan->channels < 2 || plan->filters > 1 || o < 0 || o >= g->nops)
        return 0;
    const tsl_graph_op *op = &g->ops[o];
    int conv = op->kind == TSL_OP_CONV && op->conv.groups == 1;
    if ((!conv && op->kind != TSL_OP_LINEAR) || op->ninputs < 1)
        return 0;
    int32_t v = op->inputs[0], producer = g->values[v].producer;
    const tsl_shape *in = &g->values[v].shape;
    return !tsl_graph_is_input(g, v) && v != g->output && (conv ? in->ndim >= 2 : in->ndim == 1) &&
           tsl_plan_cuts_channels(plan, in) &&
           !(producer >= 0 && g->ops[producer].kind == TSL_OP_CONCAT);
}

tsl_status tsl_plan_param_placement(const tsl_plan *plan, tsl_graph_t g, int32_t nranks,
                                    const int32_t *op_stage, tsl_tile_grid *grids,
                                    tsl_owner_map *owners, int32_t *sharded)
{
    const char *fn = "tsl_plan_param_placement";
    if (!g || nranks < 1 || (g->nparams > 0 && (!grids || !owners)))
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "%s: bad argument", fn);
    int32_t group, stages = tsl_plan_stage_count(plan, nranks, &group);
    if (stages > 1 && !op_stage)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "%s: a plan with %d stages needs op stages", fn,
                         (int)stages);
    for (int32_t o = 0; op_stage && o < g->nops; o++)
        if (op_stage[o] < 0 || op_stage[o] >= stages)
            return tsl_error(NULL, TSL_ERR_INVALID_ARG, "%s: op %d is on stage %d of %d", fn,
                             (int)o, (int)op_stage[o], (int)stages);
    int64_t min = plan ? plan->shard : TSL_PLAN_SHARD_DEFAULT;
    int64_t *load = calloc((size_t)nranks, sizeof *load);
    int32_t *op_of = calloc((size_t)g->nparams + 1, sizeof *op_of),
            *cut = calloc((size_t)g->nparams + 1, sizeof *cut);
    if (!load || !op_of || !cut) {
        free(load);
        free(op_of);
        free(cut);
        return tsl_error(NULL, TSL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    }
    tsl_plan_param_ops(g, op_of);
    for (int32_t i = 0; i < g->nparams; i++) {
        const tsl_shape *s = &g->params[i].shape;
        int32_t stage = op_stage ? op_stage[op_of[i]] : 0;
        grids[i] = tsl_tile_grid_single();
        owners[i] = on_stage(tsl_owner_single(0), stages, group, stage);
        int64_t numel = tsl_shape_numel(s);
        if (tsl_plan_input_channel_cut(plan, g, op_of[i]) && g->ops[op_of[i]].params[0] == i) {
            /* channels=K: the weight cut along its input channels (and its filters when the
             * output is cut), tile (g, k) on the first rank of channel group k (a transposed
             * convolution's weight (I, O, k...): tile (k, g)) */
            int32_t procs[TSL_MAX_DIMS] = {0}, id = g->ops[op_of[i]].transposed ? 0 : 1;
            for (int d = 0; d < TSL_MAX_DIMS; d++)
                procs[d] = 1;
            procs[id] = group / plan->data;
            grids[i].splits[1 - id] = tsl_plan_filter_cut(plan, g, op_of[i]) ? plan->channels : 1;
            grids[i].splits[id] = plan->channels;
            owners[i] = on_stage(tsl_owner_block(procs), stages, group, stage);
            cut[i] = 3;
            continue;
        }
        if (tsl_plan_filter_cut(plan, g, op_of[i]) && g->ops[op_of[i]].nparams > 0 &&
            (g->ops[op_of[i]].params[0] == i ||
             (g->ops[op_of[i]].nparams > 1 && g->ops[op_of[i]].params[1] == i))) {
            /* a convolution's weight and bias cut like its output's channels (a transposed
             * convolution's weight along its second dimension, its filters): tile f on the
             * first rank of filter group f (rank grid D x F x A x B x C) */
            int32_t procs[TSL_MAX_DIMS] = {0}, fdim = 0;
            for (int d = 0; d < TSL_MAX_DIMS; d++)
                procs[d] = 1;
            if (g->ops[op_of[i]].transposed && g->ops[op_of[i]].params[0] == i)
                fdim = 1;
            procs[fdim] = group / plan->data;
            grids[i].splits[fdim] = tsl_plan_channel_groups(plan);
            owners[i] = on_stage(tsl_owner_block(procs), stages, group, stage);
            cut[i] = 2;
            continue;
        }
        if (group > 1 && s->dims[0] > 1 && numel >= min && is_weight(g, i)) {
            grids[i].splits[0] = (int32_t)(s->dims[0] < group ? s->dims[0] : group);
            owners[i] = on_stage(tsl_owner_block(NULL), stages, group, stage);
            cut[i] = 1;
            tsl_plan_add_shards(s, grids[i].splits[0], group, 1, load + (int64_t)stage * group);
        }
    }
    int32_t filter_cut = 0;
    for (int32_t i = 0; i < g->nparams; i++)
        filter_cut += cut[i] >= 2;
    if (tsl_plan_channel_groups(plan) > 1 && !filter_cut) {
        free(load);
        free(op_of);
        free(cut);
        return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                         "plan: %s=%d divides the %s channels of none of the model's "
                         "convolutions (one group, not the model's output) or linear layers: "
                         "the ranks outside channel group 0 would have nothing "
                         "to do",
                         plan->filters > 1 ? "filters" : "channels",
                         (int)tsl_plan_channel_groups(plan),
                         plan->filters > 1 ? "output" : "input or output");
    }
    for (int32_t i = 0; i < g->nparams; i++) {
        if (sharded)
            sharded[i] = cut[i];
        if (cut[i])
            continue;
        int32_t first = (op_stage ? op_stage[op_of[i]] : 0) * group, best = first;
        for (int32_t r = first + 1; r < first + group; r++)
            if (load[r] < load[best])
                best = r;
        owners[i] = tsl_owner_single(best);
        load[best] += tsl_shape_numel(&g->params[i].shape);
    }
    free(load);
    free(op_of);
    free(cut);
    return TSL_OK;
}

tsl_status tsl_plan_buckets(const tsl_plan *plan, tsl_graph_t g, int32_t nranks,
                            const tsl_owner_map *owners, const int32_t *sharded, int32_t *bucket_of,
                            int32_t *replicated, int32_t *nbuckets)
{
    const char *fn = "tsl_plan_buckets";
    if (!g || nranks < 1 || !nbuckets || (g->nparams > 0 && (!owners || !sharded || !bucket_of)))
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "%s: bad argument", fn);
    int32_t group;
    tsl_plan_stage_count(plan, nranks, &group);
    int64_t cap = plan ? plan->bucket : TSL_PLAN_BUCKET_DEFAULT;
    *nbuckets = 0;
    int32_t *op_of = calloc((size_t)g->nparams + 1, sizeof *op_of),
            *current = malloc(sizeof *current * (size_t)nranks);
    int64_t *fill = calloc((size_t)nranks, sizeof *fill);
    if (!op_of || !current || !fill) {
        free(op_of);
        free(current);
        free(fill);
        return tsl_error(NULL, TSL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    }
    tsl_plan_param_ops(g, op_of);
    for (int32_t r = 0; r < nranks; r++)
        current[r] = -1;
    for (int32_t i = g->nparams - 1; i >= 0; i--) {
        const tsl_graph_param *p = &g->params[i];
        const tsl_graph_op *o = &g->ops[op_of[i]];
        int packed = group > 1 && cap > 0 && !sharded[i] && p->trainable;
        bucket_of[i] = -1;
        if (replicated)
            replicated[i] = packed;
        if (!packed || (o->kind != TSL_OP_CONV && o->kind != TSL_OP_LINEAR))
            continue;
        int32_t r = owners[i].rank;
        int64_t numel = tsl_shape_numel(&p->shape);
        if (current[r] < 0 || (fill[r] > 0 && fill[r] + numel > cap)) {
            current[r] = (*nbuckets)++;
            fill[r] = 0;
        }
        bucket_of[i] = current[r];
        fill[r] += numel;
    }
    free(op_of);
    free(current);
    free(fill);
    return TSL_OK;
}

int32_t tsl_plan_domain_input_parts(const tsl_plan *plan, const struct tsl_graph *g)
{
    if (!plan || plan->domains < 2 || plan->layers > 1 || tsl_plan_channel_groups(plan) > 1 ||
        g->input < 0 || tsl_graph_input_count((tsl_graph_t)g) != 1)
        return 0;
    const tsl_shape *in = &g->values[g->input].shape;
    int32_t k = 0;
    for (int32_t o = 0; o < g->nops; o++)
        k += g->ops[o].kind == TSL_OP_SLICE && g->ops[o].inputs[0] == g->input;
    if (k < plan->domains || in->ndim < 1 || in->dims[0] % k != 0)
        return 0;
    int32_t part = 0;
    for (int32_t o = 0; o < g->nops; o++) {
        const tsl_graph_op *op = &g->ops[o];
        if (op->kind != TSL_OP_SLICE || op->inputs[0] != g->input)
            continue;
        int fits = op->start[0] == part * (in->dims[0] / k) &&
                   op->stop[0] == (part + 1) * (in->dims[0] / k);
        for (int32_t d = 1; fits && d < in->ndim; d++)
            fits = op->start[d] == 0 && op->stop[d] == in->dims[d];
        if (!fits)
            return 0;
        part++;
    }
    return k;
}

/* Owner of a tile of the domain-cut input: channel tile c of C on group c N / C, at the rank
 * inside it that the plan's map gives the tile with its channels whole. */
static int32_t domain_rank_of(const int32_t tile[TSL_MAX_DIMS], int32_t ndim,
                              const tsl_tile_grid *grid, int32_t nranks, void *user)
{
    const tsl_domain_owners *d = user;
    int32_t t[TSL_MAX_DIMS], r = -1;
    memcpy(t, tile, sizeof t);
    tsl_tile_grid whole = *grid;
    if (ndim > 1) {
        t[1] = 0;
        whole.splits[1] = 1;
    }
    if (tsl_owner_map_rank(&d->within, t, ndim, &whole, nranks, &r) != TSL_OK)
        return -1;
    int32_t group = ndim > 1 ? (int32_t)((int64_t)tile[1] * d->groups / grid->splits[1]) : 0;
    return group * d->group_size + r;
}

tsl_status tsl_plan_value_tiling(const tsl_plan *plan, const struct tsl_graph *g, int32_t v,
                                 int32_t nranks, int32_t stage, int32_t workers, int64_t batch,
                                 tsl_domain_owners *own, tsl_tile_grid *grid, tsl_owner_map *owners)
{
    const tsl_shape *input = &g->values[g->input].shape;
    tsl_status st = tsl_plan_tensor_tiling(plan, input, nranks, stage, workers, batch,
                                           &g->values[v].shape, 1, grid, owners);
    int32_t parts = v == g->input ? tsl_plan_domain_input_parts(plan, g) : 0;
    if (st || !parts)
        return st;
    own->within = *owners;
    own->groups = tsl_plan_stage_count(plan, nranks, &own->group_size);
    grid->splits[1] = parts;
    *owners = tsl_owner_callback(domain_rank_of, own);
    return TSL_OK;
}
