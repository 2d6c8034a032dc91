/* The forward pass: every op of the graph in order through the execution table, with the
 * regridding, releases and helpers the op rows share. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "executor/executor.h"
#include "plan_internal.h"
#include "trace.h"

tsl_tensor_t tsl_exec_op_param(struct tsl_model *m, const tsl_graph_op *o, int k, int grad)
{
    if (k >= o->nparams)
        return NULL;
    return grad ? m->pgrads[o->params[k]] : m->params[o->params[k]];
}

const char *tsl_exec_op_label(const struct tsl_model *m, int32_t i, char *buf, size_t size)
{
    const tsl_graph_op *o = &m->g->ops[i];
    if (o->name[0])
        return o->name;
    snprintf(buf, size, "%s#%d", tsl_op_kind_name(o->kind), (int)i);
    return buf;
}

const char *tsl_exec_remake_label(const struct tsl_model *m, int32_t i, char *buf, size_t size)
{
    char op[48];
    snprintf(buf, size, "%s (recompute)", tsl_exec_op_label(m, i, op, sizeof op));
    return buf;
}

int tsl_exec_flat_needed(tsl_tensor_t x, tsl_tensor_t y)
{
    return tsl_exec_spatially_cut(x) || tsl_exec_spatially_cut(y) ||
           x->grid.splits[0] != y->grid.splits[0] ||
           (x->shape.ndim > 1 ? x->grid.splits[1] : 1) !=
               (y->shape.ndim > 1 ? y->grid.splits[1] : 1);
}

tsl_status tsl_exec_flat_of(struct tsl_model *m, instance *in, int32_t v, tsl_tensor_t *t)
{
    const tsl_shape *s = &m->g->values[v].shape;
    tsl_status st = in->flat[v] ? TSL_OK
                                : tsl_exec_batch_tensor(m, in->batch, tsl_exec_value_stage(m, v), s,
                                                        s->ndim + 1, TSL_F32, &in->flat[v]);
    *t = in->flat[v];
    return st;
}

int tsl_exec_needs_regrid(const tsl_graph_op *o, tsl_tensor_t x, tsl_tensor_t y)
{
    if (!tsl_plan_takes_channel_tiles(o) && ((x->shape.ndim > 1 && x->grid.splits[1] != 1) ||
                                             (y->shape.ndim > 1 && y->grid.splits[1] != 1)))
        return 1;
    /* an element-wise op into whole channels (the model's output) from channel tiles */
    if ((o->kind == TSL_OP_ACTIVATION || o->kind == TSL_OP_DROPOUT) && x->shape.ndim > 1 &&
        x->grid.splits[1] != y->grid.splits[1])
        return 1;
    if (o->kind != TSL_OP_CONV && o->kind != TSL_OP_POOL && o->kind != TSL_OP_UPSAMPLE)
        return 0;
    for (int d = 2; d < x->shape.ndim; d++)
        if (x->grid.splits[d] != y->grid.splits[d])
            return 1;
    return 0;
}

tsl_status tsl_exec_on_common_grid(struct tsl_model *m, const tsl_graph_op *o, tsl_tensor_t like,
                                   tsl_tensor_t x, tsl_tensor_t y, tsl_tensor_t *slot,
                                   tsl_tensor_t *out)
{
    tsl_tile_grid grid = y->grid;
    const int keep = o->kind == TSL_OP_POOL && x->shape.ndim > 1 && y->shape.ndim > 1 &&
                     x->grid.splits[1] == y->grid.splits[1];
    grid.splits[1] = keep ? y->grid.splits[1] : 1;
    int same = like->shape.ndim < 2 || like->grid.splits[1] == grid.splits[1];
    for (int d = 2; d < x->shape.ndim; d++) {
        grid.splits[d] =
            x->grid.splits[d] < y->grid.splits[d] ? x->grid.splits[d] : y->grid.splits[d];
        same &= grid.splits[d] == like->grid.splits[d];
    }
    *out = NULL;
    if (same)
        return TSL_OK;
    tsl_status st = *slot ? TSL_OK
                          : tsl_tensor_create_transient(slot, m->ctx, TSL_F32, &like->shape, &grid,
                                                        &y->owners, like->layout);
    if (!st && tsl_exec_pipelined(m))
        tsl_tensor_order_by_samples(*slot);
    *out = *slot;
    return st;
}

tsl_status tsl_exec_indices_of(struct tsl_model *m, instance *in, int32_t i, tsl_tensor_t y)
{
    if (in->pidx[i])
        return TSL_OK;
    tsl_dtype dtype = tsl_graph_pool_index_bytes(&m->g->ops[i]) == 4 ? TSL_I32 : TSL_U8;
    tsl_status st = tsl_tensor_create_transient(&in->pidx[i], m->ctx, dtype, &y->shape, &y->grid,
                                                &y->owners, y->layout);
    if (!st && tsl_exec_pipelined(m))
        tsl_tensor_order_by_samples(in->pidx[i]);
    return st;
}

tsl_status tsl_exec_batchnorm_forward(struct tsl_model *m, instance *in, int32_t i, tsl_tensor_t x,
                                      int train)
{
    const tsl_graph_op *o = &m->g->ops[i];
    int32_t r = m->relu_of[i];
    tsl_tensor_t y = in->act[r >= 0 ? m->g->ops[r].output : o->output];
    tsl_tensor_t gamma = tsl_exec_op_param(m, o, 0, 0), beta = tsl_exec_op_param(m, o, 1, 0),
                 mean = tsl_exec_op_param(m, o, 2, 0), var = tsl_exec_op_param(m, o, 3, 0);
    if (train)
        return (r >= 0 ? tsl_batchnorm_relu_forward_train : tsl_batchnorm_forward_train)(
            x, gamma, beta, mean, var, in->saved[i], y, o->eps, o->momentum);
    tsl_status st = tsl_batchnorm_forward_infer(x, gamma, beta, mean, var, y, o->eps);
    return st || r < 0 ? st : tsl_activation_forward(TSL_ACT_RELU, 0, y, y);
}

int32_t tsl_exec_conv_inputs(struct tsl_model *m, instance *in, int32_t i, tsl_tensor_t x,
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

tsl_status tsl_exec_op_forward(struct tsl_model *m, instance *in, int32_t i, int train)
{
    const tsl_graph_op *o = &m->g->ops[i];
    tsl_tensor_t y = in->act[o->output], x = o->ninputs ? in->act[o->inputs[0]] : NULL;
    tsl_tensor_t y_final = y, cx = NULL, cy = NULL;
    tsl_status st = TSL_OK;
    if (x && tsl_exec_needs_regrid(o, x, y)) {
        if ((st = tsl_exec_on_common_grid(m, o, x, x, y, &in->rx[i], &cx)) ||
            (st = tsl_exec_on_common_grid(m, o, y, x, y, &in->ry[i], &cy)) ||
            (cx && (st = tsl_tensor_redistribute(cx, x))))
            return st;
        x = cx ? cx : x;
        y = cy ? cy : y;
    }
    char label[48];
    tsl_trace_label(m->ctx, tsl_exec_op_label(m, i, label, sizeof label),
                    train ? "forward" : "inference");
    st = tsl_exec_table[o->kind].forward(m, in, i, x, y, train);
    if (!st && y != y_final)
        st = tsl_tensor_redistribute(y_final, y);
    /* The copies on the common grid live until the backward that reads them, else no longer. */
    if (!train || !tsl_graph_op_reads_input_backward(o))
        tsl_tensor_release(cx);
    if (!train)
        tsl_tensor_release(cy);
    return st;
}

tsl_status tsl_exec_forward(struct tsl_model *m, instance *in, int train)
{
    struct tsl_graph *g = m->g;
    tsl_status st = tsl_exec_sync_replicas(m);
    memset(in->dropped, 0, (size_t)g->nvalues);
    if (train) /* this forward's dropout draws, and its backward's */
        in->dropout_step = m->step++;
    for (int32_t i = 0; i < g->nops && !st; i++) {
        const tsl_mgrit_segment *seg = tsl_mgrit_segment_at(m, i);
        /* the segment's steps by multigrid in time, then the op after it; inference with
         * infer=exact: one op after the other, as the serial executor */
        if (seg && (train || m->plan.infer == TSL_INFER_MGRIT)) {
            st = tsl_mgrit_forward(m, in, seg, train);
            i = seg->s.last_op;
            continue;
        }
        st = tsl_exec_op_forward(m, in, i, train);
        int32_t ins[TSL_GRAPH_MAX_INPUTS], nin = tsl_graph_exec_inputs(g, i, m->fold, ins);
        for (int32_t k = 0; k < nin && !st; k++) {
            int32_t v = ins[k];
            if (v == g->output || tsl_exec_loss_reads(m, v) || (m->keep && m->keep[v]) ||
                !tsl_graph_last_reader(g, v, i, m->fold))
                continue;
            int later = train && tsl_graph_value_read_backward(g, v, m->fused, m->fold);
            if (later && tsl_exec_recomputed(m, v))
                in->dropped[v] = 1; /* made again for the backward */
            if (!later || in->dropped[v])
                tsl_tensor_release(in->act[v]);
        }
    }
    tsl_trace_label(m->ctx, NULL, NULL);
    return st;
}
