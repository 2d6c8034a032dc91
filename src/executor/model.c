/* Models: a graph lowered to tile tasks. Forward calls the ops of tessel/ops.h in graph order;
 * backward visits the ops in reverse and calls their backward functions, accumulating the
 * gradient of a value read by several ops; the loss is softmax cross-entropy; the update is
 * the optimizer's tile tasks. Tensors for activations, gradients and labels are made per batch
 * size (an "instance") and kept for the next step of that size. */
#include <errno.h>
#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "executor/executor.h"

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
    m->seed = seed;
    m->loss[0].kind = TSL_MODEL_LOSS_CROSS_ENTROPY;
    m->loss[0].weight = 1.0;
    m->nloss = 1; /* (the graph's, if it names one, below) */
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
    m->defers = calloc((size_t)graph->nops + 1, sizeof *m->defers);
    if (!grids || !owners || !sharded || !bucket_of || !m->replicated || !m->op_stage ||
        !m->relu_of || !m->fused || !m->fold || !m->defers)
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
        m->defers[op] = pl && pl->stages > 1 && tsl_graph_defers_weights(m->g, m->op_stage, op);
    }
    if (!st)
        st = tsl_mgrit_plan(m);
    /* The graph's loss, once the fusions (which leave the values its terms read) are known. */
    if (!st && graph->nloss)
        st = tsl_model_set_loss(m, graph->nloss, graph->loss);
    for (int32_t i = 0; i < graph->nparams && !st; i++) {
        const tsl_graph_param *p = &graph->params[i];
        st = tsl_tensor_create(&m->params[i], ctx, TSL_F32, &p->shape, &grids[i], &owners[i]);
        if (!st && p->trainable)
            st = tsl_tensor_create(&m->pgrads[i], ctx, TSL_F32, &p->shape, &grids[i], &owners[i]);
        if (!st && sharded[i] == 1) /* (2: cut by filters, read tile by tile) */
            st = tsl_tensor_make_replicas(m->params[i]);
        if (!st && m->replicated[i]) {
            int32_t group = ctx->size / tsl_plan_depth(pl);
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
    if (!st) /* (shared ops' parameters: their sources' values from the start) */
        st = tsl_exec_sync_replicas(m);
    if (st) {
        tsl_model_destroy(m);
        return st;
    }
    *out = m;
    return TSL_OK;
}

int tsl_exec_loss_reads(const struct tsl_model *m, int32_t v)
{
    for (int32_t t = 0; t < m->nloss; t++)
        if (tsl_loss_term_value(m->g, &m->loss[t]) == v || m->loss[t].against == v + 1)
            return 1;
    return 0;
}

const char *tsl_exec_value_not_kept(const struct tsl_model *m, int32_t v)
{
    if (tsl_graph_is_input(m->g, v))
        return NULL;
    int32_t p = m->g->values[v].producer;
    if (m->relu_of[p] >= 0)
        return "is fused with the ReLU after it";
    if (m->fold[p] >= 0)
        return "is a concatenation folded into the convolution reading it";
    for (int32_t k = 0; k < m->nmg; k++)
        if (p >= m->mg[k].s.first_op && p <= m->mg[k].s.last_op && v != m->mg[k].s.output)
            return "lies inside a segment MGRIT solves";
    return NULL;
}

tsl_status tsl_model_set_loss(tsl_model_t m, int32_t count, const tsl_loss_term *terms)
{
    const char *fn = "tsl_model_set_loss";
    if (!m || !terms)
        return tsl_error(m ? m->ctx : NULL, TSL_ERR_INVALID_ARG, "%s: NULL argument", fn);
    if (count < 1 || count > TSL_MAX_LOSS_TERMS)
        return tsl_error(m->ctx, TSL_ERR_INVALID_ARG, "%s: %d terms (want 1 to %d)", fn, (int)count,
                         TSL_MAX_LOSS_TERMS);
    const tsl_shape *out = &m->g->values[m->g->output].shape;
    tsl_status st = tsl_loss_terms_check(m->g, count, terms, fn);
    if (st)
        return tsl_error(m->ctx, st, "%s", tsl_last_error());
    for (int32_t t = 0; t < count; t++) {
        if (!terms[t].against && terms[t].kind == TSL_MODEL_LOSS_DICE &&
            (out->ndim < 2 || out->dims[0] > 1024))
            return tsl_error(m->ctx, TSL_ERR_INVALID_ARG,
                             "%s: Dice needs an output with labels per position and at most "
                             "1024 classes, not a (%lld%s) output",
                             fn, (long long)out->dims[0], out->ndim < 2 ? "" : ", ...");
        int32_t reads[2] = {tsl_loss_term_value(m->g, &terms[t]), terms[t].against - 1};
        for (int k = 0; k < 2; k++) {
            const char *why = reads[k] >= 0 ? tsl_exec_value_not_kept(m, reads[k]) : NULL;
            if (why)
                return tsl_error(m->ctx, TSL_ERR_INVALID_ARG,
                                 "%s: term %d reads value %d, which this model does not keep: it "
                                 "%s (name the term in the graph's loss, tsl_graph_set_loss() or "
                                 "the model file's \"losses\", before the model is made)",
                                 fn, (int)t, (int)reads[k], why);
        }
    }
    const tsl_loss_term *first = &terms[tsl_loss_batch_term(count, terms)];
    const int32_t targets = tsl_model_loss_takes_targets(first->kind);
    if (targets != m->targets && (m->ninst > 0 || m->ahead_x))
        return tsl_error(m->ctx, TSL_ERR_INVALID_ARG,
                         "%s: %s takes %s, and this model's steps have run with %s: set a loss "
                         "of the other family before the first step",
                         fn, tsl_model_loss_name(first->kind),
                         targets ? "float targets" : "class labels",
                         targets ? "class labels" : "float targets");
    memcpy(m->loss, terms, sizeof *terms * (size_t)count);
    m->nloss = count;
    m->targets = targets;
    return TSL_OK;
}

tsl_status tsl_model_destroy(tsl_model_t m)
{
    if (!m)
        return TSL_OK;
    /* A read-ahead no step took: its tasks count in the model's groups until they end. */
    for (int k = 0; k < 2 && m->ctx; k++)
        tsl_read_group_wait(m->ctx, &m->ahead_reads[k]);
    free(m->ahead_indices);
    tsl_tensor_destroy(m->ahead_x);
    tsl_tensor_destroy(m->ahead_labels);
    for (int k = 0; k < TSL_GRAPH_MAX_GRAPH_INPUTS; k++)
        tsl_tensor_destroy(m->ahead_more[k]);
    for (int32_t i = 0; i < m->ninst; i++)
        tsl_exec_instance_free(m, &m->inst[i]);
    for (int32_t b = 0; m->buckets && b < m->nbuckets; b++)
        tsl_bucket_destroy(m->buckets[b]);
    free(m->buckets);
    free(m->replicated);
    free(m->keep);
    for (int32_t i = 0; m->g && i < m->g->nparams; i++) {
        if (m->params)
            tsl_tensor_destroy(m->params[i]);
        if (m->pgrads)
            tsl_tensor_destroy(m->pgrads[i]);
    }
    free(m->params);
    free(m->pgrads);
    tsl_mgrit_model_free(m);
    free(m->op_stage);
    free(m->relu_of);
    free(m->fused);
    free(m->defers);
    free(m->fold);
    tsl_graph_destroy(m->g);
    free(m);
    return TSL_OK;
}

int tsl_exec_recomputed(const struct tsl_model *m, int32_t v)
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

/* Owners of a tile of a tensor laid out as `user` (a tensor of the same shape and grid). */
static int32_t owner_as(const int32_t tile[TSL_MAX_DIMS], int32_t ndim, const tsl_tile_grid *grid,
                        int32_t nranks, void *user)
{
    (void)nranks;
    int64_t index = 0;
    for (int32_t d = 0; d < ndim; d++)
        index = index * grid->splits[d] + tile[d];
    return ((struct tsl_tensor *)user)->tile_owner[index];
}

tsl_status tsl_exec_add_shared_grads(struct tsl_model *m)
{
    tsl_status st = TSL_OK;
    for (int32_t i = 0; i < m->g->nparams && !st; i++) {
        int32_t s = tsl_graph_param_source(m->g, i);
        tsl_tensor_t to = m->pgrads[s], from = m->pgrads[i];
        if (s == i || !to || !from)
            continue;
        if (!memcmp(&to->grid, &from->grid, sizeof to->grid)) {
            st = tsl_tensor_axpy(to, 1.0, from); /* (moved to the source's tiles' owners) */
            continue;
        }
        tsl_tensor_t tmp = NULL;
        tsl_owner_map like = tsl_owner_callback(owner_as, to);
        if (!(st = tsl_tensor_create(&tmp, m->ctx, TSL_F32, &to->shape, &to->grid, &like)) &&
            !(st = tsl_tensor_redistribute(tmp, from)))
            st = tsl_tensor_axpy(to, 1.0, tmp);
        tsl_tensor_destroy(tmp);
    }
    return st;
}

tsl_status tsl_exec_sync_replicas(struct tsl_model *m)
{
    tsl_status st = TSL_OK;
    int32_t n = 0;
    /* A shared op's parameters: its source's values. */
    for (int32_t i = 0; i < m->g->nparams && !st; i++) {
        int32_t s = tsl_graph_param_source(m->g, i);
        if (s != i)
            st = tsl_tensor_redistribute(m->params[i], m->params[s]);
    }
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
