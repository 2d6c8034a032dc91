/* Models: a graph lowered to tile tasks. Forward calls the ops of tessel/ops.h in graph order;
 * backward visits the ops in reverse and calls their backward functions, accumulating the
 * gradient of a value read by several ops; the loss is softmax cross-entropy; the update is
 * the optimizer's tile tasks. Tensors for activations, gradients and labels are made per batch
 * size (an "instance") and kept for the next step of that size. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "graph_internal.h"
#include "internal.h"
#include "lower/halo.h"
#include "tessel/io.h"
#include "tessel/model.h"
#include "tessel/plan.h"

#define MAX_INSTANCES 4

typedef struct instance {
    int64_t batch;
    tsl_tensor_t *act;       /* [nvalues] */
    tsl_tensor_t *grad;      /* [nvalues]; NULL for the input */
    tsl_tensor_t *scratch;   /* [nvalues]; made when a value's gradient needs accumulating */
    tsl_tensor_t *flat;      /* [nvalues]: a spatially tiled value cut along N only (flatten) */
    tsl_tensor_t *rx, *ry;   /* [nops]: input and output on a common tile grid, when the op's
                                input and output grids differ (see needs_regrid) */
    tsl_tensor_t *rdx, *rdy; /* [nops]: their gradients */
    tsl_tensor_t *saved;     /* [nops]: batch-norm statistics */
    tsl_tensor_t *pidx;      /* [nops]: a max pooling's indices, from forward to backward */
    tsl_halo_keep *keep;     /* [nops * TSL_GRAPH_MAX_INPUTS]: a convolution's input halo slabs
                                (one set per part of a folded concatenation), forward to backward */
    tsl_tensor_t labels;
    uint8_t *written; /* [nvalues]: gradient already holds a contribution this step */
    uint8_t *dropped; /* [nvalues]: dropped after the forward, to make again for the backward
                         (tsl_graph_recomputed) */
} instance;

struct tsl_model {
    struct tsl_context *ctx;
    struct tsl_graph *g;
    tsl_tensor_t *params; /* [nparams] */
    tsl_tensor_t *pgrads; /* [nparams]; NULL for buffers */
    tsl_plan plan;
    int has_plan;      /* else sample tiles over all ranks and workers */
    int32_t *op_stage; /* [nops]: each op's pipeline stage (tsl_plan_stages()) */
    /* Small trainable parameters with a whole copy per rank of their stage, refreshed in one
     * packed message per owner (tsl_plan_buckets()); buckets of their gradients. */
    int32_t *replicated; /* [nparams] */
    struct tsl_bucket **buckets;
    int32_t nbuckets;
    int32_t *relu_of;  /* [nops]: the ReLU fused into batch-norm op o (tsl_graph_fused_relu()),
                          or -1 */
    uint8_t *fused;    /* [nops]: a ReLU that its batch norm computes */
    int32_t *fold;     /* [nops]: the convolution that reads concatenation o's parts in place
                          (tsl_graph_folded_concat()), or -1 */
    int32_t recompute; /* the plan's recompute= */
    instance inst[MAX_INSTANCES];
    int32_t ninst;
    int32_t next_evict;
};

static void instance_free(struct tsl_model *m, instance *in)
{
    for (int32_t v = 0; v < m->g->nvalues; v++) {
        if (in->act)
            tsl_tensor_destroy(in->act[v]);
        if (in->grad)
            tsl_tensor_destroy(in->grad[v]);
        if (in->scratch)
            tsl_tensor_destroy(in->scratch[v]);
        if (in->flat)
            tsl_tensor_destroy(in->flat[v]);
    }
    for (int32_t o = 0; o < m->g->nops; o++) {
        if (in->saved)
            tsl_tensor_destroy(in->saved[o]);
        if (in->pidx)
            tsl_tensor_destroy(in->pidx[o]);
        tsl_tensor_t *slots[4] = {in->rx, in->ry, in->rdx, in->rdy};
        for (int k = 0; k < 4; k++)
            if (slots[k])
                tsl_tensor_destroy(slots[k][o]);
    }
    tsl_tensor_destroy(in->labels);
    free(in->act);
    free(in->grad);
    free(in->scratch);
    free(in->flat);
    for (int32_t o = 0; in->keep && o < m->g->nops * TSL_GRAPH_MAX_INPUTS; o++)
        tsl_halo_keep_release(m->ctx, &in->keep[o]);
    free(in->keep);
    free(in->rx);
    free(in->ry);
    free(in->rdx);
    free(in->rdy);
    free(in->saved);
    free(in->pidx);
    free(in->written);
    free(in->dropped);
    memset(in, 0, sizeof *in);
}

/* The pipeline stage of value v: its producer's. */
static int32_t value_stage(const struct tsl_model *m, int32_t v)
{
    return m->op_stage[m->g->values[v].producer];
}

/* A (batch, sample...) tensor of pipeline stage `stage` tiled and owned as the plan says
 * (tsl_plan_tensor_tiling(): sample tiles over the stage's ranks and workers without a
 * spatial plan; otherwise sample groups and spatial tiles over its rank grid). Spatial
 * dimensions of `sample` start at `first` (1 after channels, 0 for per-position labels;
 * sample->ndim for "none": sample tiles). */
static tsl_status batch_tensor(struct tsl_model *m, int64_t batch, int32_t stage,
                               const tsl_shape *sample, int first, tsl_dtype dtype,
                               tsl_tensor_t *out)
{
    tsl_shape s;
    tsl_batch_shape(batch, sample, &s);
    int32_t workers = 1;
    tsl_context_worker_count(m->ctx, TSL_WORKER_CPU, &workers);
    tsl_tile_grid grid;
    tsl_owner_map owners;
    tsl_status st =
        tsl_plan_tensor_tiling(m->has_plan ? &m->plan : NULL, &m->g->values[m->g->input].shape,
                               m->ctx->size, stage, workers, batch, sample, first, &grid, &owners);
    /* Activations with spatial dimensions are stored channels-last, the layout the convolution
     * kernels run fastest on and without im2col buffers (docs/architecture.md). */
    tsl_layout layout = first == 1 && s.ndim >= 3 ? TSL_LAYOUT_CHANNELS_LAST : TSL_LAYOUT_PLAIN;
    return st ? st : tsl_tensor_create_transient(out, m->ctx, dtype, &s, &grid, &owners, layout);
}

/* The first rank of pipeline stage `stage`. */
static int32_t stage_rank(const struct tsl_model *m, int32_t stage)
{
    int32_t stages = m->has_plan && m->plan.stages > 1 ? m->plan.stages : 1;
    return stage * (m->ctx->size / stages);
}

/* Whether the plan pipelines micro-batches (their tasks then go in sample order). */
static int pipelined(const struct tsl_model *m)
{
    return m->has_plan && (m->plan.stages > 1 || m->plan.micro > 1);
}

/* Whether a tensor is cut along a spatial dimension (from dimension 2). */
static int spatially_cut(tsl_tensor_t t)
{
    for (int d = 2; d < t->shape.ndim; d++)
        if (t->grid.splits[d] > 1)
            return 1;
    return 0;
}

static tsl_status instance_make(struct tsl_model *m, int64_t batch, instance *in)
{
    struct tsl_graph *g = m->g;
    memset(in, 0, sizeof *in);
    in->batch = batch;
    in->act = calloc((size_t)g->nvalues, sizeof *in->act);
    in->grad = calloc((size_t)g->nvalues, sizeof *in->grad);
    in->scratch = calloc((size_t)g->nvalues, sizeof *in->scratch);
    in->saved = calloc((size_t)g->nops, sizeof *in->saved);
    in->pidx = calloc((size_t)g->nops, sizeof *in->pidx);
    in->flat = calloc((size_t)g->nvalues, sizeof *in->flat);
    in->keep = calloc((size_t)g->nops * TSL_GRAPH_MAX_INPUTS, sizeof *in->keep);
    in->rx = calloc((size_t)g->nops, sizeof *in->rx);
    in->ry = calloc((size_t)g->nops, sizeof *in->ry);
    in->rdx = calloc((size_t)g->nops, sizeof *in->rdx);
    in->rdy = calloc((size_t)g->nops, sizeof *in->rdy);
    in->written = calloc((size_t)g->nvalues, 1);
    in->dropped = calloc((size_t)g->nvalues, 1);
    if (!in->act || !in->grad || !in->scratch || !in->saved || !in->pidx || !in->flat || !in->rx ||
        !in->ry || !in->rdx || !in->rdy || !in->keep || !in->written || !in->dropped) {
        instance_free(m, in);
        return tsl_error(m->ctx, TSL_ERR_OUT_OF_MEMORY, "model: out of memory");
    }
    tsl_status st = TSL_OK;
    /* Pipelines run each rank's micro-batches through the layers in order (priorities). */
    for (int32_t v = 0; v < g->nvalues && !st; v++) {
        if (m->relu_of[g->values[v].producer] >= 0 || m->fold[g->values[v].producer] >= 0)
            continue; /* the fused ReLU's output holds it; a folded concatenation is not made */
        int32_t at = value_stage(m, v);
        st = batch_tensor(m, batch, at, &g->values[v].shape, 1, TSL_F32, &in->act[v]);
        if (!st && v != g->input)
            st = batch_tensor(m, batch, at, &g->values[v].shape, 1, TSL_F32, &in->grad[v]);
        if (!st && pipelined(m)) {
            tsl_tensor_order_by_samples(in->act[v]);
            if (in->grad[v])
                tsl_tensor_order_by_samples(in->grad[v]);
        }
    }
    for (int32_t o = 0; o < g->nops && !st; o++)
        if (g->ops[o].kind == TSL_OP_BATCHNORM) {
            int64_t dims[2] = {2, g->values[g->ops[o].output].shape.dims[0]};
            tsl_shape s;
            tsl_shape_make(&s, 2, dims);
            tsl_owner_map on = tsl_owner_single(stage_rank(m, m->op_stage[o]));
            st = tsl_tensor_create(&in->saved[o], m->ctx, TSL_F64, &s, NULL, &on);
        }
    if (!st) {
        /* Labels: one per sample, or one per position of a (classes, spatial...) output. */
        tsl_shape out = g->values[g->output].shape, ls;
        memset(&ls, 0, sizeof ls);
        ls.ndim = out.ndim - 1;
        for (int d = 1; d < out.ndim; d++)
            ls.dims[d - 1] = out.dims[d];
        st = batch_tensor(m, batch, value_stage(m, g->output), &ls, 0,
                          tsl_graph_label_dtype(out.dims[0]), &in->labels);
    }
    if (st)
        instance_free(m, in);
    return st;
}

/* The instance for `batch` samples, made (and an old one evicted) when needed. */
static tsl_status instance_for(struct tsl_model *m, int64_t batch, instance **out)
{
    for (int32_t i = 0; i < m->ninst; i++)
        if (m->inst[i].batch == batch) {
            *out = &m->inst[i];
            return TSL_OK;
        }
    instance *in;
    if (m->ninst < MAX_INSTANCES) {
        in = &m->inst[m->ninst];
    } else {
        in = &m->inst[m->next_evict];
        m->next_evict = (m->next_evict + 1) % MAX_INSTANCES;
        instance_free(m, in);
        m->ninst--;
    }
    tsl_status st = instance_make(m, batch, in);
    if (st)
        return st;
    m->ninst++;
    *out = in;
    return TSL_OK;
}

/* A seed per parameter, so each tensor's values depend on (seed, its index) only. */
static uint64_t param_seed(uint64_t seed, int32_t index)
{
    return seed * 0x9e3779b97f4a7c15ULL + (uint64_t)index * 0xbf58476d1ce4e5b9ULL + 1;
}

static tsl_status init_params(struct tsl_model *m, uint64_t seed)
{
    tsl_status st = TSL_OK;
    for (int32_t i = 0; i < m->g->nparams && !st; i++) {
        const tsl_graph_param *p = &m->g->params[i];
        if (p->init == TSL_INIT_UNIFORM)
            st = tsl_tensor_fill_uniform(m->params[i], param_seed(seed, i), -p->init_bound,
                                         p->init_bound);
        else
            st = tsl_tensor_fill_constant(m->params[i], p->init == TSL_INIT_ONES ? 1.0 : 0.0);
    }
    return st;
}

/* Check `plan` against the context and the graph (tsl_plan_check()). */
static tsl_status adopt_plan(struct tsl_model *m, const tsl_plan *plan)
{
    tsl_status st = tsl_plan_check(plan, &m->g->values[m->g->input].shape, m->ctx->size);
    if (st)
        return tsl_error(m->ctx, st, "tsl_model_create_plan: %s", tsl_last_error());
    m->plan = *plan;
    m->has_plan = 1;
    m->recompute = plan->recompute != 0;
    return TSL_OK;
}

/* The gradient buckets tsl_plan_buckets() gave (bucket_of: one per parameter, or -1). */
static tsl_status make_buckets(struct tsl_model *m, const int32_t *bucket_of)
{
    int32_t np = m->g->nparams;
    m->buckets = calloc((size_t)m->nbuckets, sizeof *m->buckets);
    tsl_tensor_t *members = malloc(sizeof *members * (size_t)(np + 1));
    tsl_status st = TSL_OK;
    if (!m->buckets || !members)
        st = tsl_error(m->ctx, TSL_ERR_OUT_OF_MEMORY, "tsl_model_create: out of memory");
    for (int32_t b = 0; b < m->nbuckets && !st; b++) {
        int32_t n = 0;
        for (int32_t i = np - 1; i >= 0; i--) /* backward's order */
            if (bucket_of[i] == b)
                members[n++] = m->pgrads[i];
        st = tsl_bucket_create(m->ctx, n, members, &m->buckets[b]);
    }
    free(members);
    return st;
}

tsl_status tsl_model_create(tsl_model_t *out, tsl_context_t ctx, tsl_graph_t graph, uint64_t seed)
{
    return tsl_model_create_plan(out, ctx, graph, seed, NULL);
}

tsl_status tsl_model_create_plan(tsl_model_t *out, tsl_context_t ctx, tsl_graph_t graph,
                                 uint64_t seed, const tsl_plan *plan)
{
    if (!out || !ctx || !graph)
        return tsl_error(ctx, TSL_ERR_INVALID_ARG, "tsl_model_create: NULL argument");
    *out = NULL;
    if (graph->input < 0 || graph->output < 0)
        return tsl_error(ctx, TSL_ERR_STATE,
                         "tsl_model_create: the graph needs an input and an "
                         "output (tsl_graph_set_output)");
    const tsl_shape *o = &graph->values[graph->output].shape;
    if (o->dims[0] < 2)
        return tsl_error(ctx, TSL_ERR_SHAPE,
                         "tsl_model_create: the output needs at least two classes (channels)");
    struct tsl_model *m = calloc(1, sizeof *m);
    if (!m)
        return tsl_error(ctx, TSL_ERR_OUT_OF_MEMORY, "tsl_model_create: out of memory");
    m->ctx = ctx;
    m->g = tsl_graph_copy(graph);
    m->params = calloc((size_t)graph->nparams + 1, sizeof *m->params);
    m->pgrads = calloc((size_t)graph->nparams + 1, sizeof *m->pgrads);
    if (!m->g || !m->params || !m->pgrads) {
        tsl_model_destroy(m);
        return tsl_error(ctx, TSL_ERR_OUT_OF_MEMORY, "tsl_model_create: out of memory");
    }
    tsl_status st = TSL_OK;
    if (plan && (st = adopt_plan(m, plan))) {
        tsl_model_destroy(m);
        return st;
    }
    const tsl_plan *pl = m->has_plan ? &m->plan : NULL;
    tsl_tile_grid *grids = calloc((size_t)graph->nparams + 1, sizeof *grids);
    tsl_owner_map *owners = calloc((size_t)graph->nparams + 1, sizeof *owners);
    int32_t *sharded = calloc((size_t)graph->nparams + 1, sizeof *sharded);
    int32_t *bucket_of = calloc((size_t)graph->nparams + 1, sizeof *bucket_of);
    m->replicated = calloc((size_t)graph->nparams + 1, sizeof *m->replicated);
    m->op_stage = calloc((size_t)graph->nops + 1, sizeof *m->op_stage);
    m->relu_of = calloc((size_t)graph->nops + 1, sizeof *m->relu_of);
    m->fused = calloc((size_t)graph->nops + 1, sizeof *m->fused);
    m->fold = calloc((size_t)graph->nops + 1, sizeof *m->fold);
    if (!grids || !owners || !sharded || !bucket_of || !m->replicated || !m->op_stage ||
        !m->relu_of || !m->fused || !m->fold)
        st = tsl_error(ctx, TSL_ERR_OUT_OF_MEMORY, "tsl_model_create: out of memory");
    /* Without stages of the graph's own, the split for one sample per batch and Adam. */
    else if ((st = tsl_plan_stages(pl, graph, 1, 2, m->op_stage)) ||
             (st = tsl_plan_param_placement(pl, graph, ctx->size, m->op_stage, grids, owners,
                                            sharded)) ||
             (st = tsl_plan_buckets(pl, graph, ctx->size, owners, sharded, bucket_of, m->replicated,
                                    &m->nbuckets)))
        st = tsl_error(ctx, st, "tsl_model_create: %s", tsl_last_error());
    for (int32_t op = 0; op < graph->nops && !st; op++) {
        m->relu_of[op] = tsl_graph_fused_relu(m->g, op, m->op_stage);
        if (m->relu_of[op] >= 0)
            m->fused[m->relu_of[op]] = 1;
        m->fold[op] = tsl_graph_folded_concat(m->g, op, m->op_stage);
    }
    for (int32_t i = 0; i < graph->nparams && !st; i++) {
        const tsl_graph_param *p = &graph->params[i];
        st = tsl_tensor_create(&m->params[i], ctx, TSL_F32, &p->shape, &grids[i], &owners[i]);
        if (!st && p->trainable)
            st = tsl_tensor_create(&m->pgrads[i], ctx, TSL_F32, &p->shape, &grids[i], &owners[i]);
        if (!st && sharded[i])
            st = tsl_tensor_make_replicas(m->params[i]);
        if (!st && m->replicated[i]) {
            int32_t group = ctx->size / (pl && pl->stages > 1 ? pl->stages : 1);
            st = tsl_tensor_make_replicas_on(m->params[i], owners[i].rank / group * group, group);
        }
    }
    if (!st && m->nbuckets > 0)
        st = make_buckets(m, bucket_of);
    free(grids);
    free(owners);
    free(sharded);
    free(bucket_of);
    if (!st)
        st = init_params(m, seed);
    if (st) {
        tsl_model_destroy(m);
        return st;
    }
    *out = m;
    return TSL_OK;
}

tsl_status tsl_model_destroy(tsl_model_t m)
{
    if (!m)
        return TSL_OK;
    for (int32_t i = 0; i < m->ninst; i++)
        instance_free(m, &m->inst[i]);
    for (int32_t b = 0; m->buckets && b < m->nbuckets; b++)
        tsl_bucket_destroy(m->buckets[b]);
    free(m->buckets);
    free(m->replicated);
    for (int32_t i = 0; m->g && i < m->g->nparams; i++) {
        if (m->params)
            tsl_tensor_destroy(m->params[i]);
        if (m->pgrads)
            tsl_tensor_destroy(m->pgrads[i]);
    }
    free(m->params);
    free(m->pgrads);
    free(m->op_stage);
    free(m->relu_of);
    free(m->fused);
    free(m->fold);
    tsl_graph_destroy(m->g);
    free(m);
    return TSL_OK;
}

/* Whether training drops value v after its last forward reader and makes it again for the
 * backward (tsl_graph_recomputed()). */
static int recomputed(const struct tsl_model *m, int32_t v)
{
    return m->recompute && tsl_graph_recomputed(m->g, v, m->op_stage) >= 0;
}

tsl_status tsl_model_param(tsl_model_t m, int32_t index, tsl_tensor_t *param, tsl_tensor_t *grad)
{
    if (!m || index < 0 || index >= m->g->nparams)
        return tsl_error(m ? m->ctx : NULL, TSL_ERR_INVALID_ARG, "tsl_model_param: no parameter %d",
                         (int)index);
    if (param)
        *param = m->params[index];
    if (grad)
        *grad = m->pgrads[index];
    return TSL_OK;
}

/* Bring every sharded weight's whole copies up to date: at the start of every forward, so
 * whatever wrote the weights before (the optimizer, a load, the caller through
 * tsl_model_param) is seen, and every rank decides alike (tsl_model_param is not
 * collective, so the model cannot know on every rank whether a caller wrote). */
static tsl_status sync_replicas(struct tsl_model *m)
{
    tsl_status st = TSL_OK;
    int32_t n = 0;
    for (int32_t i = 0; i < m->g->nparams && !st; i++) {
        if (!m->replicated[i])
            st = tsl_tensor_sync_replicas(m->params[i]);
        for (int32_t r = 0; m->replicated[i] && r < m->ctx->size; r++)
            n += m->params[i]->replicas[r] != NULL;
    }
    if (st || n == 0)
        return st;
    /* The small ones: one packed message per owner and rank. */
    tsl_tensor_t *dst = malloc(sizeof *dst * (size_t)n), *src = malloc(sizeof *src * (size_t)n);
    if (!dst || !src)
        st = tsl_error(m->ctx, TSL_ERR_OUT_OF_MEMORY, "model: out of memory");
    n = 0;
    for (int32_t i = 0; i < m->g->nparams && !st; i++)
        for (int32_t r = 0; m->replicated[i] && r < m->ctx->size; r++)
            if (m->params[i]->replicas[r]) {
                dst[n] = m->params[i]->replicas[r];
                src[n++] = m->params[i];
            }
    if (!st)
        st = tsl_tensors_redistribute(n, dst, src);
    free(dst);
    free(src);
    return st;
}

/* The op's parameter slot k (weight 0, bias 1, running mean 2, running var 3), or NULL. */
static tsl_tensor_t op_param(struct tsl_model *m, const tsl_graph_op *o, int k, int grad)
{
    if (k >= o->nparams)
        return NULL;
    return grad ? m->pgrads[o->params[k]] : m->params[o->params[k]];
}

/* Whether flatten must first move x to sample tiles like y's: x is spatially cut, or cut
 * into a plan's sample groups rather than the sample tiles of values without space. */
static int flat_needed(tsl_tensor_t x, tsl_tensor_t y)
{
    return spatially_cut(x) || x->grid.splits[0] != y->grid.splits[0];
}

/* Value v cut along N only (flatten reads spatial tiles so): made on first use. */
static tsl_status flat_of(struct tsl_model *m, instance *in, int32_t v, tsl_tensor_t *t)
{
    const tsl_shape *s = &m->g->values[v].shape;
    tsl_status st = in->flat[v] ? TSL_OK
                                : batch_tensor(m, in->batch, value_stage(m, v), s, s->ndim, TSL_F32,
                                               &in->flat[v]);
    *t = in->flat[v];
    return st;
}

/* Whether op o's input and output must move to a common tile grid: convolutions, pooling
 * and upsampling pair output tile i with input tile i, and a plan's spatial tiles are capped
 * by each tensor's size, so the grids differ where a size falls below the wanted tiles. */
static int needs_regrid(const tsl_graph_op *o, tsl_tensor_t x, tsl_tensor_t y)
{
    if (o->kind != TSL_OP_CONV && o->kind != TSL_OP_POOL && o->kind != TSL_OP_UPSAMPLE)
        return 0;
    for (int d = 2; d < x->shape.ndim; d++)
        if (x->grid.splits[d] != y->grid.splits[d])
            return 1;
    return 0;
}

/* `like`'s shape on the common grid of x and y (the fewer tiles per spatial dimension), in
 * *slot (made on first use); NULL in *out when `like` already has that grid. */
static tsl_status on_common_grid(struct tsl_model *m, tsl_tensor_t like, tsl_tensor_t x,
                                 tsl_tensor_t y, tsl_tensor_t *slot, tsl_tensor_t *out)
{
    tsl_tile_grid grid = y->grid;
    grid.splits[1] = 1;
    int same = 1;
    for (int d = 2; d < x->shape.ndim; d++) {
        grid.splits[d] =
            x->grid.splits[d] < y->grid.splits[d] ? x->grid.splits[d] : y->grid.splits[d];
        same &= grid.splits[d] == like->grid.splits[d];
    }
    *out = NULL;
    if (same)
        return TSL_OK;
    tsl_status st = *slot ? TSL_OK
                          : tsl_tensor_create_layout(slot, m->ctx, TSL_F32, &like->shape, &grid,
                                                     &y->owners, like->layout);
    *out = *slot;
    return st;
}

/* Max pooling op i's indices for its output y as the op computes it (made on first use):
 * training keeps them instead of the input (tsl_graph_op_reads_input_backward()). */
static tsl_status indices_of(struct tsl_model *m, instance *in, int32_t i, tsl_tensor_t y)
{
    if (in->pidx[i])
        return TSL_OK;
    tsl_dtype dtype = tsl_graph_pool_index_bytes(&m->g->ops[i]) == 4 ? TSL_I32 : TSL_U8;
    tsl_status st = tsl_tensor_create_transient(&in->pidx[i], m->ctx, dtype, &y->shape, &y->grid,
                                                &y->owners, y->layout);
    if (!st && pipelined(m))
        tsl_tensor_order_by_samples(in->pidx[i]);
    return st;
}

/* Batch-norm op i on x, with its ReLU when fused (into the ReLU's output; inference then
 * applies the ReLU in place). */
static tsl_status batchnorm_forward(struct tsl_model *m, instance *in, int32_t i, tsl_tensor_t x,
                                    int train)
{
    const tsl_graph_op *o = &m->g->ops[i];
    int32_t r = m->relu_of[i];
    tsl_tensor_t y = in->act[r >= 0 ? m->g->ops[r].output : o->output];
    tsl_tensor_t gamma = op_param(m, o, 0, 0), beta = op_param(m, o, 1, 0),
                 mean = op_param(m, o, 2, 0), var = op_param(m, o, 3, 0);
    if (train)
        return (r >= 0 ? tsl_batchnorm_relu_forward_train : tsl_batchnorm_forward_train)(
            x, gamma, beta, mean, var, in->saved[i], y, o->eps, o->momentum);
    tsl_status st = tsl_batchnorm_forward_infer(x, gamma, beta, mean, var, y, o->eps);
    return st || r < 0 ? st : tsl_activation_forward(TSL_ACT_RELU, 0, y, y);
}

/* The inputs of convolution op i into xs, returning their count: the parts of the
 * concatenation it reads in place (tsl_graph_folded_concat()), else x. */
static int32_t conv_inputs(struct tsl_model *m, instance *in, int32_t i, tsl_tensor_t x,
                           tsl_tensor_t *xs)
{
    int32_t ins[TSL_GRAPH_MAX_INPUTS], n = tsl_graph_exec_inputs(m->g, i, m->fold, ins);
    if (m->fold[m->g->values[m->g->ops[i].inputs[0]].producer] != i) {
        xs[0] = x; /* perhaps moved to the output's grid */
        return 1;
    }
    for (int32_t k = 0; k < n; k++)
        xs[k] = in->act[ins[k]];
    return n;
}

/* Without training nothing reads an activation after its last reader: it is released then
 * (all but the output), so inference holds a few layers' activations at a time. Training
 * releases there the activations no backward reads (tsl_graph_value_read_backward: ResNet's
 * batch norms before the additions, an up-convolution's output that only an unfolded
 * concatenation reads); the others wait for the backward. */
/* ---- the execution table: how each op kind runs forward and backward ---- */

/* Forward of op i from x (its first input, on y's tile grid when the op regrids) into y. */
typedef tsl_status (*forward_fn)(struct tsl_model *m, instance *in, int32_t i, tsl_tensor_t x,
                                 tsl_tensor_t y, int train);
/* Backward of op i: dx[k] (NULL: not wanted) for the values it reads (tsl_graph_exec_inputs),
 * and its parameters' gradients. */
typedef tsl_status (*backward_fn)(struct tsl_model *m, instance *in, int32_t i, tsl_tensor_t x,
                                  tsl_tensor_t y, tsl_tensor_t dy, tsl_tensor_t *dx);

static tsl_status forward_none(struct tsl_model *m, instance *in, int32_t i, tsl_tensor_t x,
                               tsl_tensor_t y, int train)
{
    return TSL_OK;
}

/* Training keeps the input's halo slabs for the weight gradient. A folded concatenation's
 * parts are read in place. */
static tsl_status forward_conv(struct tsl_model *m, instance *in, int32_t i, tsl_tensor_t x,
                               tsl_tensor_t y, int train)
{
    const tsl_graph_op *o = &m->g->ops[i];
    tsl_tensor_t xs[TSL_GRAPH_MAX_INPUTS];
    int32_t n = conv_inputs(m, in, i, x, xs);
    return tsl_conv_forward_keeping(&o->conv, o->transposed, n, xs, op_param(m, o, 0, 0),
                                    op_param(m, o, 1, 0), y,
                                    train ? &in->keep[i * TSL_GRAPH_MAX_INPUTS] : NULL);
}

static tsl_status forward_batchnorm(struct tsl_model *m, instance *in, int32_t i, tsl_tensor_t x,
                                    tsl_tensor_t y, int train)
{
    return batchnorm_forward(m, in, i, x, train);
}

static tsl_status forward_activation(struct tsl_model *m, instance *in, int32_t i, tsl_tensor_t x,
                                     tsl_tensor_t y, int train)
{
    const tsl_graph_op *o = &m->g->ops[i];
    if (m->fused[i])
        return TSL_OK; /* its batch norm wrote y */
    return tsl_activation_forward(o->act, o->slope, x, y);
}

static tsl_status forward_pool(struct tsl_model *m, instance *in, int32_t i, tsl_tensor_t x,
                               tsl_tensor_t y, int train)
{
    const tsl_graph_op *o = &m->g->ops[i];
    if (!train || !tsl_graph_pool_index_bytes(o))
        return tsl_pool_forward(&o->pool, x, y);
    tsl_status st = indices_of(m, in, i, y);
    return st ? st : tsl_pool_forward_indices(&o->pool, x, y, in->pidx[i]);
}

static tsl_status forward_upsample(struct tsl_model *m, instance *in, int32_t i, tsl_tensor_t x,
                                   tsl_tensor_t y, int train)
{
    const tsl_graph_op *o = &m->g->ops[i];
    return o->linear ? tsl_upsample_linear_forward(o->scale, x, y)
                     : tsl_upsample_nearest_forward(o->scale, x, y);
}

static tsl_status forward_concat(struct tsl_model *m, instance *in, int32_t i, tsl_tensor_t x,
                                 tsl_tensor_t y, int train)
{
    const tsl_graph_op *o = &m->g->ops[i];
    if (m->fold[i] >= 0)
        return TSL_OK; /* its convolution reads the parts */
    tsl_tensor_t xs[TSL_GRAPH_MAX_INPUTS];
    for (int32_t k = 0; k < o->ninputs; k++)
        xs[k] = in->act[o->inputs[k]];
    return tsl_concat_channels(o->ninputs, xs, y);
}

static tsl_status forward_add(struct tsl_model *m, instance *in, int32_t i, tsl_tensor_t x,
                              tsl_tensor_t y, int train)
{
    return tsl_tensor_add(y, x, in->act[m->g->ops[i].inputs[1]]);
}

static tsl_status forward_flatten(struct tsl_model *m, instance *in, int32_t i, tsl_tensor_t x,
                                  tsl_tensor_t y, int train)
{
    if (flat_needed(x, y)) {
        tsl_tensor_t flat;
        tsl_status st = flat_of(m, in, m->g->ops[i].inputs[0], &flat);
        if (st || (st = tsl_tensor_redistribute(flat, x)))
            return st;
        x = flat;
    }
    return tsl_reshape_samples(x, y);
}

static tsl_status forward_linear(struct tsl_model *m, instance *in, int32_t i, tsl_tensor_t x,
                                 tsl_tensor_t y, int train)
{
    const tsl_graph_op *o = &m->g->ops[i];
    return tsl_linear_forward(x, op_param(m, o, 0, 0), op_param(m, o, 1, 0), y);
}

static tsl_status backward_conv(struct tsl_model *m, instance *in, int32_t i, tsl_tensor_t x,
                                tsl_tensor_t y, tsl_tensor_t dy, tsl_tensor_t *dx);
static tsl_status backward_batchnorm(struct tsl_model *m, instance *in, int32_t i, tsl_tensor_t x,
                                     tsl_tensor_t y, tsl_tensor_t dy, tsl_tensor_t *dx);
static tsl_status backward_activation(struct tsl_model *m, instance *in, int32_t i, tsl_tensor_t x,
                                      tsl_tensor_t y, tsl_tensor_t dy, tsl_tensor_t *dx);
static tsl_status backward_pool(struct tsl_model *m, instance *in, int32_t i, tsl_tensor_t x,
                                tsl_tensor_t y, tsl_tensor_t dy, tsl_tensor_t *dx);
static tsl_status backward_upsample(struct tsl_model *m, instance *in, int32_t i, tsl_tensor_t x,
                                    tsl_tensor_t y, tsl_tensor_t dy, tsl_tensor_t *dx);
static tsl_status backward_concat(struct tsl_model *m, instance *in, int32_t i, tsl_tensor_t x,
                                  tsl_tensor_t y, tsl_tensor_t dy, tsl_tensor_t *dx);
static tsl_status backward_add(struct tsl_model *m, instance *in, int32_t i, tsl_tensor_t x,
                               tsl_tensor_t y, tsl_tensor_t dy, tsl_tensor_t *dx);
static tsl_status backward_flatten(struct tsl_model *m, instance *in, int32_t i, tsl_tensor_t x,
                                   tsl_tensor_t y, tsl_tensor_t dy, tsl_tensor_t *dx);
static tsl_status backward_linear(struct tsl_model *m, instance *in, int32_t i, tsl_tensor_t x,
                                  tsl_tensor_t y, tsl_tensor_t dy, tsl_tensor_t *dx);

static const struct {
    forward_fn forward;
    backward_fn backward; /* NULL: nothing to do (the input) */
} exec_table[] = {
    [TSL_OP_INPUT] = {forward_none, NULL},
    [TSL_OP_CONV] = {forward_conv, backward_conv},
    [TSL_OP_BATCHNORM] = {forward_batchnorm, backward_batchnorm},
    [TSL_OP_ACTIVATION] = {forward_activation, backward_activation},
    [TSL_OP_POOL] = {forward_pool, backward_pool},
    [TSL_OP_UPSAMPLE] = {forward_upsample, backward_upsample},
    [TSL_OP_CONCAT] = {forward_concat, backward_concat},
    [TSL_OP_ADD] = {forward_add, backward_add},
    [TSL_OP_FLATTEN] = {forward_flatten, backward_flatten},
    [TSL_OP_LINEAR] = {forward_linear, backward_linear},
};
_Static_assert(sizeof exec_table / sizeof exec_table[0] == TSL_OP_KIND_COUNT,
               "one row of the execution table per op kind");

static tsl_status forward(struct tsl_model *m, instance *in, int train)
{
    struct tsl_graph *g = m->g;
    tsl_status st = sync_replicas(m);
    memset(in->dropped, 0, (size_t)g->nvalues);
    for (int32_t i = 0; i < g->nops && !st; i++) {
        const tsl_graph_op *o = &g->ops[i];
        tsl_tensor_t y = in->act[o->output], x = o->ninputs ? in->act[o->inputs[0]] : NULL;
        tsl_tensor_t y_final = y, cx = NULL, cy = NULL;
        if (x && needs_regrid(o, x, y)) {
            if ((st = on_common_grid(m, x, x, y, &in->rx[i], &cx)) ||
                (st = on_common_grid(m, y, x, y, &in->ry[i], &cy)) ||
                (cx && (st = tsl_tensor_redistribute(cx, x))))
                break;
            x = cx ? cx : x;
            y = cy ? cy : y;
        }
        st = exec_table[o->kind].forward(m, in, i, x, y, train);
        if (!st && y != y_final)
            st = tsl_tensor_redistribute(y_final, y);
        int32_t ins[TSL_GRAPH_MAX_INPUTS], nin = tsl_graph_exec_inputs(g, i, m->fold, ins);
        for (int32_t k = 0; k < nin && !st; k++) {
            int32_t v = ins[k];
            if (v == g->output || !tsl_graph_last_reader(g, v, i, m->fold))
                continue;
            int later = train && tsl_graph_value_read_backward(g, v, m->fused, m->fold);
            if (later && recomputed(m, v))
                in->dropped[v] = 1; /* made again for the backward */
            if (!later || in->dropped[v])
                tsl_tensor_release(in->act[v]);
        }
    }
    return st;
}

/* This instance's spare tensor shaped like value v (made on first use). */
static tsl_status scratch_of(struct tsl_model *m, instance *in, int32_t v, tsl_tensor_t *t)
{
    tsl_status st = TSL_OK;
    if (!in->scratch[v])
        st = batch_tensor(m, in->batch, value_stage(m, v), &m->g->values[v].shape, 1, TSL_F32,
                          &in->scratch[v]);
    *t = in->scratch[v];
    return st;
}

/* Where the gradient contribution of an op to value v goes: straight into grad[v] the first
 * time in a step, else into scratch[v], to be added (*accumulate set). NULL for the input. */
static tsl_status grad_target(struct tsl_model *m, instance *in, int32_t v, tsl_tensor_t *t,
                              int *accumulate)
{
    *accumulate = 0;
    *t = NULL;
    if (v == m->g->input)
        return TSL_OK;
    if (!in->written[v]) {
        in->written[v] = 1;
        *t = in->grad[v];
        return TSL_OK;
    }
    *accumulate = 1;
    return scratch_of(m, in, v, t);
}

/* Value v, dropped after the forward, from its batch norm's input and saved statistics, once
 * `after` (the gradient the backward reading v starts from) is written. */
static tsl_status remake(struct tsl_model *m, instance *in, int32_t v, tsl_tensor_t after)
{
    int32_t b = tsl_graph_recomputed(m->g, v, m->op_stage);
    const tsl_graph_op *o = &m->g->ops[b];
    in->dropped[v] = 0;
    return tsl_batchnorm_relu_recompute(in->act[o->inputs[0]], op_param(m, o, 0, 0),
                                        op_param(m, o, 1, 0), in->saved[b], in->act[v], o->eps,
                                        after);
}

static tsl_status backward_conv(struct tsl_model *m, instance *in, int32_t i, tsl_tensor_t x,
                                tsl_tensor_t y, tsl_tensor_t dy, tsl_tensor_t *dx)
{
    const tsl_graph_op *o = &m->g->ops[i];
    tsl_tensor_t xs[TSL_GRAPH_MAX_INPUTS];
    int32_t n = conv_inputs(m, in, i, x, xs);
    return tsl_conv_backward_keeping(&o->conv, o->transposed, n, xs, op_param(m, o, 0, 0), dy, dx,
                                     op_param(m, o, 0, 1), op_param(m, o, 1, 1),
                                     &in->keep[i * TSL_GRAPH_MAX_INPUTS]);
}

static tsl_status backward_batchnorm(struct tsl_model *m, instance *in, int32_t i, tsl_tensor_t x,
                                     tsl_tensor_t y, tsl_tensor_t dy, tsl_tensor_t *dx)
{
    const tsl_graph_op *o = &m->g->ops[i];
    if (m->relu_of[i] >= 0)
        return tsl_batchnorm_relu_backward(x, dy, op_param(m, o, 0, 0), op_param(m, o, 1, 0),
                                           in->saved[i], dx[0], op_param(m, o, 0, 1),
                                           op_param(m, o, 1, 1));
    return tsl_batchnorm_backward(x, dy, op_param(m, o, 0, 0), in->saved[i], dx[0],
                                  op_param(m, o, 0, 1), op_param(m, o, 1, 1));
}

static tsl_status backward_activation(struct tsl_model *m, instance *in, int32_t i, tsl_tensor_t x,
                                      tsl_tensor_t y, tsl_tensor_t dy, tsl_tensor_t *dx)
{
    const tsl_graph_op *o = &m->g->ops[i];
    return tsl_activation_backward(o->act, o->slope, x, y, dy, dx[0]);
}

static tsl_status backward_pool(struct tsl_model *m, instance *in, int32_t i, tsl_tensor_t x,
                                tsl_tensor_t y, tsl_tensor_t dy, tsl_tensor_t *dx)
{
    const tsl_graph_op *o = &m->g->ops[i];
    return in->pidx[i] ? tsl_pool_backward_indices(&o->pool, in->pidx[i], dy, dx[0])
                       : tsl_pool_backward(&o->pool, x, dy, dx[0]);
}

static tsl_status backward_upsample(struct tsl_model *m, instance *in, int32_t i, tsl_tensor_t x,
                                    tsl_tensor_t y, tsl_tensor_t dy, tsl_tensor_t *dx)
{
    const tsl_graph_op *o = &m->g->ops[i];
    return o->linear ? tsl_upsample_linear_backward(o->scale, dy, dx[0])
                     : tsl_upsample_nearest_backward(o->scale, dy, dx[0]);
}

/* The network input's part (no gradient wanted) goes to throw-away space. */
static tsl_status backward_concat(struct tsl_model *m, instance *in, int32_t i, tsl_tensor_t x,
                                  tsl_tensor_t y, tsl_tensor_t dy, tsl_tensor_t *dx)
{
    const tsl_graph_op *o = &m->g->ops[i];
    tsl_status st = TSL_OK;
    for (int32_t k = 0; k < o->ninputs && !st; k++)
        if (!dx[k])
            st = scratch_of(m, in, o->inputs[k], &dx[k]);
    return st ? st : tsl_split_channels(dy, o->ninputs, dx);
}

static tsl_status backward_add(struct tsl_model *m, instance *in, int32_t i, tsl_tensor_t x,
                               tsl_tensor_t y, tsl_tensor_t dy, tsl_tensor_t *dx)
{
    tsl_status st = TSL_OK;
    for (int32_t k = 0; k < 2 && !st; k++)
        if (dx[k])
            st = tsl_tensor_redistribute(dx[k], dy);
    return st;
}

static tsl_status backward_flatten(struct tsl_model *m, instance *in, int32_t i, tsl_tensor_t x,
                                   tsl_tensor_t y, tsl_tensor_t dy, tsl_tensor_t *dx)
{
    if (!flat_needed(x, y))
        return tsl_reshape_samples(dy, dx[0]);
    tsl_tensor_t flat;
    tsl_status st = flat_of(m, in, m->g->ops[i].inputs[0], &flat);
    if (st || (st = tsl_reshape_samples(dy, flat)))
        return st;
    return tsl_tensor_redistribute(dx[0], flat);
}

static tsl_status backward_linear(struct tsl_model *m, instance *in, int32_t i, tsl_tensor_t x,
                                  tsl_tensor_t y, tsl_tensor_t dy, tsl_tensor_t *dx)
{
    const tsl_graph_op *o = &m->g->ops[i];
    return tsl_linear_backward(x, op_param(m, o, 0, 0), dy, dx[0], op_param(m, o, 0, 1),
                               op_param(m, o, 1, 1));
}

static tsl_status op_backward(struct tsl_model *m, instance *in, int32_t i)
{
    const tsl_graph_op *o = &m->g->ops[i];
    if (!exec_table[o->kind].backward || m->fused[i] || m->fold[i] >= 0)
        return TSL_OK; /* a fused ReLU's backward is its batch norm's, a folded concatenation's
                          its convolution's */
    /* A batch norm with a fused ReLU takes the ReLU's output gradient. */
    int32_t out = m->relu_of[i] >= 0 ? m->g->ops[m->relu_of[i]].output : o->output;
    if (!in->written[out]) {
        /* The loss does not depend on this op: its parameters get zero gradients. */
        tsl_status st = TSL_OK;
        for (int k = 0; k < o->nparams && !st; k++)
            if (op_param(m, o, k, 1))
                st = tsl_tensor_fill_constant(op_param(m, o, k, 1), 0.0);
        return st;
    }
    tsl_tensor_t dy = in->grad[out], y = in->act[out];
    tsl_tensor_t dx[TSL_GRAPH_MAX_INPUTS];
    int acc[TSL_GRAPH_MAX_INPUTS];
    tsl_status st = TSL_OK;
    /* The values it reads: a folded concatenation's parts for its convolution. */
    int32_t ins[TSL_GRAPH_MAX_INPUTS], nin = tsl_graph_exec_inputs(m->g, i, m->fold, ins);
    for (int32_t k = 0; k < nin && !st; k++)
        st = grad_target(m, in, ins[k], &dx[k], &acc[k]);
    if (st)
        return st;
    tsl_tensor_t x = in->act[ins[0]];
    /* An input moved to the output's tile grid (forward kept the copy): its gradient is made
     * on that grid too and moved back below. */
    tsl_tensor_t dx0 = dx[0], cdx = NULL;
    if (needs_regrid(o, x, y)) {
        tsl_tensor_t cdy = NULL, cx = NULL, cy = NULL;
        if ((st = on_common_grid(m, x, x, y, &in->rx[i], &cx)) ||
            (st = on_common_grid(m, y, x, y, &in->ry[i], &cy)) ||
            (st = on_common_grid(m, x, x, y, &in->rdx[i], &cdx)) ||
            (st = on_common_grid(m, y, x, y, &in->rdy[i], &cdy)) ||
            (cdy && (st = tsl_tensor_redistribute(cdy, dy))))
            return st;
        x = cx ? cx : x; /* the forward left the copies there */
        y = cy ? cy : y;
        dy = cdy ? cdy : dy;
        if (dx0 && cdx)
            dx[0] = cdx;
        else
            cdx = NULL;
    }
    /* Inputs dropped after the forward are made again before a backward that reads them. */
    for (int32_t k = 0; k < nin && !st && tsl_graph_op_reads_input_backward(o); k++)
        if (in->dropped[ins[k]])
            st = remake(m, in, ins[k], dy);
    if (st)
        return st;
    /* Ops without parameters have nothing to do when no input wants a gradient. */
    if (o->nparams || dx[0] || o->ninputs > 1)
        st = exec_table[o->kind].backward(m, in, i, x, y, dy, dx);
    if (cdx && !st) {
        st = tsl_tensor_redistribute(dx0, cdx);
        dx[0] = dx0;
    }
    for (int32_t k = 0; k < nin && !st; k++)
        if (acc[k])
            st = tsl_tensor_axpy(in->grad[ins[k]], 1.0, dx[k]);
    return st;
}

/* Where a batch comes from: x and labels on rank 0 (scattered), or a dataset and sample
 * indices (every rank reads its own tiles). */
typedef struct batch_source {
    const float *x;
    const int64_t *labels;
    tsl_dataset_t dataset;
    const int64_t *indices;
    int read; /* from the dataset */
} batch_source;

/* The batch into the input (and the labels when asked). */
static tsl_status load_batch(struct tsl_model *m, instance *in, const batch_source *src,
                             int with_labels)
{
    if (src->read)
        return tsl_tensors_read_samples(in->act[m->g->input], with_labels ? in->labels : NULL,
                                        src->dataset, src->indices);
    tsl_status st = tsl_tensor_scatter(in->act[m->g->input], 0, src->x);
    if (!st && with_labels)
        st = tsl_tensor_scatter_labels(in->labels, 0, src->labels);
    return st;
}

/* Argmax hits of the output against the labels: a task per output tile where it lives and an
 * exact sum (nothing is gathered). */
static tsl_status count_correct(struct tsl_model *m, instance *in, int64_t *correct)
{
    int64_t hits = 0;
    tsl_status st = tsl_argmax_hits(in->act[m->g->output], in->labels, &hits);
    if (!st && correct)
        *correct = hits;
    return st;
}

static tsl_status check_batch(struct tsl_model *m, int64_t batch, const batch_source *src,
                              int need_labels, const char *fn)
{
    if (!m)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "%s: model is NULL", fn);
    tsl_status st = TSL_OK;
    if (batch < 1)
        st = tsl_error(m->ctx, TSL_ERR_INVALID_ARG, "%s: batch %lld < 1", fn, (long long)batch);
    else if (src->read)
        return TSL_OK; /* checked by every rank in tsl_tensors_read_samples() */
    else if (m->ctx->rank == 0 && (!src->x || (need_labels && !src->labels)))
        st = tsl_error(m->ctx, TSL_ERR_INVALID_ARG, "%s: the batch data is NULL on rank 0", fn);
    return tsl_context_agree(m->ctx, 0, st);
}

/* Forward, loss and backward: gradients land in the parameters' grad tensors. */
static tsl_status gradients(struct tsl_model *m, int64_t batch, const batch_source *src,
                            double *loss, instance **used)
{
    instance *in;
    tsl_status st = instance_for(m, batch, &in);
    if (st || (st = load_batch(m, in, src, 1)) || (st = forward(m, in, 1)))
        return st;
    memset(in->written, 0, (size_t)m->g->nvalues);
    double l = 0;
    st = tsl_loss_cross_entropy(in->act[m->g->output], in->labels, in->grad[m->g->output], &l);
    in->written[m->g->output] = 1;
    for (int32_t i = m->g->nops - 1; i >= 0 && !st; i--) {
        st = op_backward(m, in, i); /* a bucket reduces once all its members are in */
        tsl_tensor_release(in->pidx[i]);
        if (!st && !m->fused[i]) {
            int32_t out =
                m->relu_of[i] >= 0 ? m->g->ops[m->relu_of[i]].output : m->g->ops[i].output;
            tsl_tensor_release(in->grad[out]);
            tsl_tensor_release(in->scratch[out]);
            if (out != m->g->output)
                tsl_tensor_release(in->act[out]);
        }
    }
    for (int32_t b = 0; b < m->nbuckets; b++) { /* members without partials: left alone */
        tsl_status fin = tsl_bucket_finish(m->buckets[b]);
        st = st ? st : fin;
    }
    if (!st && loss)
        *loss = l;
    *used = in;
    return st;
}

tsl_status tsl_model_gradients(tsl_model_t m, int64_t batch, const float *x, const int64_t *labels,
                               double *loss)
{
    batch_source src = {.x = x, .labels = labels};
    tsl_status st = check_batch(m, batch, &src, 1, "tsl_model_gradients");
    instance *in;
    return st ? st : gradients(m, batch, &src, loss, &in);
}

static tsl_status train_step(tsl_model_t m, int64_t batch, const batch_source *src,
                             tsl_optimizer_t opt, double *loss, int64_t *correct, const char *fn)
{
    tsl_status st = check_batch(m, batch, src, 1, fn);
    if (st)
        return st;
    if (!opt)
        return tsl_error(m->ctx, TSL_ERR_INVALID_ARG, "%s: optimizer is NULL", fn);
    instance *in;
    if ((st = gradients(m, batch, src, loss, &in)))
        return st;
    /* A sample that could not be read stops the step before any parameter changes. */
    if (src->read && (st = tsl_context_check_reads(m->ctx)))
        return st;
    if (correct && (st = count_correct(m, in, correct)))
        return st;
    tsl_tensor_t *ps = malloc(sizeof *ps * (size_t)(m->g->nparams + 1));
    tsl_tensor_t *gs = malloc(sizeof *gs * (size_t)(m->g->nparams + 1));
    if (!ps || !gs) {
        free(ps);
        free(gs);
        return tsl_error(m->ctx, TSL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    }
    int32_t n = 0;
    for (int32_t i = 0; i < m->g->nparams; i++)
        if (m->pgrads[i]) {
            ps[n] = m->params[i];
            gs[n++] = m->pgrads[i];
        }
    st = n ? tsl_optimizer_step(opt, n, ps, gs) : TSL_OK;
    free(ps);
    free(gs);
    return st; /* the next forward reads the updated shards back (sync_replicas) */
}

tsl_status tsl_model_train_step(tsl_model_t m, int64_t batch, const float *x, const int64_t *labels,
                                tsl_optimizer_t opt, double *loss, int64_t *correct)
{
    batch_source src = {.x = x, .labels = labels};
    return train_step(m, batch, &src, opt, loss, correct, "tsl_model_train_step");
}

tsl_status tsl_model_train_step_read(tsl_model_t m, tsl_dataset_t dataset, int64_t batch,
                                     const int64_t *indices, tsl_optimizer_t opt, double *loss,
                                     int64_t *correct)
{
    batch_source src = {.dataset = dataset, .indices = indices, .read = 1};
    return train_step(m, batch, &src, opt, loss, correct, "tsl_model_train_step_read");
}

static tsl_status evaluate(tsl_model_t m, int64_t batch, const batch_source *src, double *loss,
                           int64_t *correct, const char *fn)
{
    tsl_status st = check_batch(m, batch, src, 1, fn);
    instance *in;
    if (st || (st = instance_for(m, batch, &in)) || (st = load_batch(m, in, src, 1)) ||
        (st = forward(m, in, 0)))
        return st;
    double l = 0;
    st = tsl_loss_cross_entropy(in->act[m->g->output], in->labels, NULL, &l);
    if (!st && src->read)
        st = tsl_context_check_reads(m->ctx);
    if (!st && loss)
        *loss = l;
    if (!st && correct)
        st = count_correct(m, in, correct);
    return st;
}

tsl_status tsl_model_evaluate(tsl_model_t m, int64_t batch, const float *x, const int64_t *labels,
                              double *loss, int64_t *correct)
{
    batch_source src = {.x = x, .labels = labels};
    return evaluate(m, batch, &src, loss, correct, "tsl_model_evaluate");
}

tsl_status tsl_model_evaluate_read(tsl_model_t m, tsl_dataset_t dataset, int64_t batch,
                                   const int64_t *indices, double *loss, int64_t *correct)
{
    batch_source src = {.dataset = dataset, .indices = indices, .read = 1};
    return evaluate(m, batch, &src, loss, correct, "tsl_model_evaluate_read");
}

tsl_status tsl_model_forward(tsl_model_t m, int64_t batch, const float *x, int32_t train,
                             float *out)
{
    batch_source src = {.x = x};
    tsl_status st = check_batch(m, batch, &src, 0, "tsl_model_forward");
    instance *in;
    if (st || (st = instance_for(m, batch, &in)) || (st = load_batch(m, in, &src, 0)) ||
        (st = forward(m, in, train)))
        return st;
    return tsl_tensor_gather(in->act[m->g->output], 0, out);
}

/* DIR/NAME.npy */
static tsl_status param_path(struct tsl_model *m, const char *dir, int32_t i, char *path,
                             size_t size)
{
    int n = snprintf(path, size, "%s/%s.npy", dir, m->g->params[i].name);
    if (n < 0 || (size_t)n >= size)
        return tsl_error(m->ctx, TSL_ERR_INVALID_ARG, "model: path too long in '%s'", dir);
    return TSL_OK;
}

tsl_status tsl_model_save_params(tsl_model_t m, const char *dir)
{
    if (!m || !dir)
        return tsl_error(m ? m->ctx : NULL, TSL_ERR_INVALID_ARG,
                         "tsl_model_save_params: NULL argument");
    tsl_status st = TSL_OK;
    if (m->ctx->rank == 0 && mkdir(dir, 0777) != 0 && errno != EEXIST)
        st = tsl_error(m->ctx, TSL_ERR_IO, "tsl_model_save_params: cannot create '%s': %s", dir,
                       strerror(errno));
    if ((st = tsl_context_agree(m->ctx, 0, st)))
        return st;
    char path[4096];
    for (int32_t i = 0; i < m->g->nparams && !st; i++)
        if (!(st = param_path(m, dir, i, path, sizeof path)))
            st = tsl_tensor_write_npy(m->params[i], path, 0);
    return st;
}

/* The trainable parameters and their names (for the optimizer state). */
static tsl_status trainable(struct tsl_model *m, tsl_tensor_t **params, const char ***names,
                            int32_t *count)
{
    int32_t np = m->g->nparams, n = 0;
    *params = calloc((size_t)np + 1, sizeof **params);
    *names = calloc((size_t)np + 1, sizeof **names);
    if (!*params || !*names) {
        free(*params);
        free(*names);
        return tsl_error(m->ctx, TSL_ERR_OUT_OF_MEMORY, "model: out of memory");
    }
    for (int32_t i = 0; i < np; i++)
        if (m->pgrads[i]) {
            (*params)[n] = m->params[i];
            (*names)[n++] = m->g->params[i].name;
        }
    *count = n;
    return TSL_OK;
}

static tsl_status optimizer_dir(struct tsl_model *m, const char *dir, char *path, size_t size)
{
    int n = snprintf(path, size, "%s/optimizer", dir);
    if (n < 0 || (size_t)n >= size)
        return tsl_error(m->ctx, TSL_ERR_INVALID_ARG, "model: path too long in '%s'", dir);
    return TSL_OK;
}

/* Read and check every parameter file of DIR into `files` (one tile on rank 0 each),
 * changing nothing. */
static tsl_status read_param_files(struct tsl_model *m, const char *dir, tsl_tensor_t *files)
{
    char path[4096];
    tsl_status st = TSL_OK;
    tsl_owner_map root = tsl_owner_single(0);
    for (int32_t i = 0; i < m->g->nparams && !st; i++) {
        if ((st = param_path(m, dir, i, path, sizeof path)) ||
            (st = tsl_tensor_read_npy(&files[i], m->ctx, path, 0, NULL, &root)))
            break;
        const tsl_shape *want = &m->g->params[i].shape;
        tsl_shape got;
        tsl_dtype dt;
        tsl_tensor_shape(files[i], &got);
        tsl_tensor_dtype(files[i], &dt);
        if (dt != TSL_F32 || got.ndim != want->ndim ||
            memcmp(got.dims, want->dims, sizeof(int64_t) * (size_t)want->ndim) != 0)
            st = tsl_error(m->ctx, TSL_ERR_SHAPE,
                           "tsl_model_load_params: '%s' is not an f32 array of the parameter's "
                           "shape",
                           path);
    }
    return st;
}

/* Load DIR's parameters and, with `opt`, the optimizer state of DIR/optimizer: every file
 * is read and checked before anything changes. */
static tsl_status load_files(struct tsl_model *m, tsl_optimizer_t opt, const char *dir)
{
    int32_t np = m->g->nparams;
    tsl_tensor_t *files = calloc((size_t)np + 1, sizeof *files);
    if (!files)
        return tsl_error(m->ctx, TSL_ERR_OUT_OF_MEMORY, "tsl_model_load_params: out of memory");
    tsl_optimizer_pending *pending = NULL;
    tsl_status st = read_param_files(m, dir, files);
    if (!st && opt) {
        char sub[4096];
        tsl_tensor_t *params;
        const char **names;
        int32_t n;
        if (!(st = optimizer_dir(m, dir, sub, sizeof sub)) &&
            !(st = trainable(m, &params, &names, &n))) {
            st = tsl_optimizer_read_state(opt, n, params, names, sub, &pending);
            free(names);
            if (!st)
                st = tsl_optimizer_apply_state(opt, pending);
            free(params);
        }
    }
    for (int32_t i = 0; i < np && !st; i++)
        st = tsl_tensor_redistribute(m->params[i], files[i]);
    for (int32_t i = 0; i < np; i++)
        tsl_tensor_destroy(files[i]);
    free(files);
    return st;
}

tsl_status tsl_model_load_params(tsl_model_t m, const char *dir)
{
    if (!m || !dir)
        return tsl_error(m ? m->ctx : NULL, TSL_ERR_INVALID_ARG,
                         "tsl_model_load_params: NULL argument");
    return load_files(m, NULL, dir);
}

tsl_status tsl_model_save_checkpoint(tsl_model_t m, tsl_optimizer_t opt, const char *dir)
{
    if (!m || !opt || !dir)
        return tsl_error(m ? m->ctx : NULL, TSL_ERR_INVALID_ARG,
                         "tsl_model_save_checkpoint: NULL argument");
    char sub[4096];
    tsl_status st = tsl_model_save_params(m, dir);
    if (st || (st = optimizer_dir(m, dir, sub, sizeof sub)))
        return st;
    if (m->ctx->rank == 0 && mkdir(sub, 0777) != 0 && errno != EEXIST)
        st = tsl_error(m->ctx, TSL_ERR_IO, "tsl_model_save_checkpoint: cannot create '%s': %s", sub,
                       strerror(errno));
    if ((st = tsl_context_agree(m->ctx, 0, st)))
        return st;
    tsl_tensor_t *params;
    const char **names;
    int32_t n;
    if ((st = trainable(m, &params, &names, &n)))
        return st;
    st = tsl_optimizer_save_state(opt, n, params, names, sub);
    free(params);
    free(names);
    return st;
}

tsl_status tsl_model_load_checkpoint(tsl_model_t m, tsl_optimizer_t opt, const char *dir)
{
    if (!m || !opt || !dir)
        return tsl_error(m ? m->ctx : NULL, TSL_ERR_INVALID_ARG,
                         "tsl_model_load_checkpoint: NULL argument");
    return load_files(m, opt, dir);
}
