/* The executor's instances: the activations, gradients and labels of one batch size, made
 * on first use and kept for the next step of that size. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "executor/executor.h"

void tsl_exec_instance_free(struct tsl_model *m, instance *in)
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
        if (in->mask)
            tsl_tensor_destroy(in->mask[o]);
        tsl_tensor_t *slots[4] = {in->rx, in->ry, in->rdx, in->rdy};
        for (int k = 0; k < 4; k++)
            if (slots[k])
                tsl_tensor_destroy(slots[k][o]);
    }
    tsl_tensor_destroy(in->labels);
    for (int t = 0; t < TSL_MAX_LOSS_TERMS; t++)
        tsl_tensor_destroy(in->against[t]);
    tsl_mgrit_instance_free(m, in);
    free(in->act);
    free(in->grad);
    free(in->scratch);
    free(in->flat);
    for (int32_t o = 0; in->keep && o < m->g->nops * TSL_GRAPH_MAX_INPUTS; o++)
        tsl_halo_keep_release(m->ctx, &in->keep[o]);
    free(in->keep);
    for (int32_t o = 0; in->rin && o < m->g->nops * TSL_GRAPH_MAX_INPUTS; o++)
        tsl_tensor_destroy(in->rin[o]);
    free(in->rin);
    free(in->rx);
    free(in->ry);
    free(in->rdx);
    free(in->rdy);
    free(in->saved);
    free(in->pidx);
    free(in->mask);
    free(in->written);
    free(in->dropped);
    memset(in, 0, sizeof *in);
}

int32_t tsl_exec_value_stage(const struct tsl_model *m, int32_t v)
{
    return m->op_stage[m->g->values[v].producer];
}

/* The workers the tiles are for: the CUDA workers where there are any (a GPU takes a whole
 * sample tile; spatial tiles would send their windowed tasks to the CPU workers,
 * codelets/conv.c), else the CPU workers. */
static int32_t tile_workers(struct tsl_model *m)
{
    int32_t workers = 1, ncuda = 0;
    tsl_context_worker_count(m->ctx, TSL_WORKER_CUDA, &ncuda);
    if (ncuda > 0)
        workers = ncuda;
    else
        tsl_context_worker_count(m->ctx, TSL_WORKER_CPU, &workers);
    return workers;
}

tsl_status tsl_exec_batch_tensor(struct tsl_model *m, int64_t batch, int32_t stage,
                                 const tsl_shape *sample, int first, tsl_dtype dtype,
                                 tsl_tensor_t *out)
{
    tsl_shape s;
    tsl_batch_shape(batch, sample, &s);
    int32_t workers = tile_workers(m);
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
    int32_t stages = tsl_plan_depth(m->has_plan ? &m->plan : NULL);
    return stage * (m->ctx->size / stages);
}

int tsl_exec_pipelined(const struct tsl_model *m)
{
    return m->has_plan && (m->plan.stages > 1 || m->plan.micro > 1);
}

int tsl_exec_spatially_cut(tsl_tensor_t t)
{
    for (int d = 2; d < t->shape.ndim; d++)
        if (t->grid.splits[d] > 1)
            return 1;
    return 0;
}

/* *t again with its channels in one tile (same owners' map: filter group 0), if cut. */
tsl_status tsl_exec_channels_whole(struct tsl_model *m, tsl_tensor_t *t)
{
    tsl_tensor_t was = *t;
    if (was->shape.ndim < 2 || was->grid.splits[1] == 1)
        return TSL_OK;
    tsl_tile_grid grid = was->grid;
    grid.splits[1] = 1;
    tsl_tensor_t made = NULL;
    tsl_status st = tsl_tensor_create_transient(&made, m->ctx, was->dtype, &was->shape, &grid,
                                                &was->owners, was->layout);
    if (!st) {
        tsl_tensor_destroy(was);
        *t = made;
    }
    return st;
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
    in->mask = calloc((size_t)g->nops, sizeof *in->mask);
    in->flat = calloc((size_t)g->nvalues, sizeof *in->flat);
    in->keep = calloc((size_t)g->nops * TSL_GRAPH_MAX_INPUTS, sizeof *in->keep);
    in->rin = calloc((size_t)g->nops * TSL_GRAPH_MAX_INPUTS, sizeof *in->rin);
    in->rx = calloc((size_t)g->nops, sizeof *in->rx);
    in->ry = calloc((size_t)g->nops, sizeof *in->ry);
    in->rdx = calloc((size_t)g->nops, sizeof *in->rdx);
    in->rdy = calloc((size_t)g->nops, sizeof *in->rdy);
    in->written = calloc((size_t)g->nvalues, 1);
    in->dropped = calloc((size_t)g->nvalues, 1);
    if (!in->act || !in->grad || !in->scratch || !in->saved || !in->pidx || !in->mask ||
        !in->flat || !in->rx || !in->ry || !in->rdx || !in->rdy || !in->keep || !in->rin ||
        !in->written || !in->dropped) {
        tsl_exec_instance_free(m, in);
        return tsl_error(m->ctx, TSL_ERR_OUT_OF_MEMORY, "model: out of memory");
    }
    tsl_status st = TSL_OK;
    /* Pipelines run each rank's micro-batches through the layers in order (priorities). */
    for (int32_t v = 0; v < g->nvalues && !st; v++) {
        if (v == g->input)
            continue; /* made with the labels below */
        if (m->relu_of[g->values[v].producer] >= 0 || m->fold[g->values[v].producer] >= 0)
            continue; /* the fused ReLU's output holds it; a folded concatenation is not made */
        int32_t at = tsl_exec_value_stage(m, v);
        st = tsl_exec_batch_tensor(m, batch, at, &g->values[v].shape, 1, TSL_F32, &in->act[v]);
        if (!st && !tsl_graph_is_input(g, v)) /* (a further input: fed by the caller) */
            st = tsl_exec_batch_tensor(m, batch, at, &g->values[v].shape, 1, TSL_F32, &in->grad[v]);
        if (!st && v == g->output) /* the losses read whole channels (filters= cuts the rest) */
            st = tsl_exec_channels_whole(m, &in->act[v]);
        if (!st && v == g->output && in->grad[v])
            st = tsl_exec_channels_whole(m, &in->grad[v]);
        if (!st && tsl_exec_pipelined(m)) {
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
        } else if (g->ops[o].kind == TSL_OP_GROUPNORM) { /* (mean, invstd) per sample and group */
            int64_t dims[3] = {batch, g->ops[o].norm_groups, 2};
            tsl_shape s;
            tsl_shape_make(&s, 3, dims);
            tsl_owner_map on = tsl_owner_single(stage_rank(m, m->op_stage[o]));
            st = tsl_tensor_create(&in->saved[o], m->ctx, TSL_F64, &s, NULL, &on);
        }
    if (!st)
        st = tsl_exec_input_tensors(m, batch, &in->act[g->input], &in->labels);
    if (st)
        tsl_exec_instance_free(m, in);
    return st;
}

tsl_status tsl_exec_input_tensors(struct tsl_model *m, int64_t batch, tsl_tensor_t *x,
                                  tsl_tensor_t *labels)
{
    const struct tsl_graph *g = m->g;
    *x = *labels = NULL;
    tsl_status st = TSL_OK;
    const tsl_plan *plan = m->has_plan ? &m->plan : NULL;
    if (tsl_plan_domain_input_parts(plan, g)) { /* cut by channels onto the domain groups */
        tsl_tile_grid grid;
        tsl_owner_map owners;
        tsl_shape s;
        tsl_batch_shape(batch, &g->values[g->input].shape, &s);
        st = tsl_plan_value_tiling(plan, g, g->input, m->ctx->size,
                                   tsl_exec_value_stage(m, g->input), tile_workers(m), batch,
                                   &m->domain_owners, &grid, &owners);
        if (!st)
            st = tsl_tensor_create_transient(x, m->ctx, TSL_F32, &s, &grid, &owners,
                                             s.ndim >= 3 ? TSL_LAYOUT_CHANNELS_LAST
                                                         : TSL_LAYOUT_PLAIN);
    } else {
        st = tsl_exec_batch_tensor(m, batch, tsl_exec_value_stage(m, g->input),
                                   &g->values[g->input].shape, 1, TSL_F32, x);
    }
    if (!st && tsl_exec_pipelined(m))
        tsl_tensor_order_by_samples(*x);
    if (!st && m->targets) {
        /* Float targets: tiled as the output (the losses take the two tile by tile). */
        st = tsl_exec_batch_tensor(m, batch, tsl_exec_value_stage(m, g->output),
                                   &g->values[g->output].shape, 1, TSL_F32, labels);
        if (!st)
            st = tsl_exec_channels_whole(m, labels);
        if (!st && tsl_exec_pipelined(m))
            tsl_tensor_order_by_samples(*labels);
    } else if (!st) {
        /* Labels: one per sample, or one per position of a (classes, spatial...) output. */
        tsl_shape out = g->values[g->output].shape, ls;
        memset(&ls, 0, sizeof ls);
        ls.ndim = out.ndim - 1;
        for (int d = 1; d < out.ndim; d++)
            ls.dims[d - 1] = out.dims[d];
        st = tsl_exec_batch_tensor(m, batch, tsl_exec_value_stage(m, g->output), &ls, 0,
                                   tsl_graph_label_dtype(out.dims[0]), labels);
    }
    if (st) {
        tsl_tensor_destroy(*x);
        *x = NULL;
    }
    return st;
}

tsl_status tsl_exec_instance_for(struct tsl_model *m, int64_t batch, instance **out)
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
        tsl_exec_instance_free(m, in);
        m->ninst--;
    }
    tsl_status st = instance_make(m, batch, in);
    if (st)
        return st;
    m->ninst++;
    *out = in;
    return TSL_OK;
}
