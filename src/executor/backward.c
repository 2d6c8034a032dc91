/* The backward pass of one op: gradient targets (accumulated where several ops read a value),
 * values made again for the backward, regridding, and the op's row of the execution table. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "executor/executor.h"
#include "trace.h"

tsl_status tsl_exec_scratch_of(struct tsl_model *m, instance *in, int32_t v, tsl_tensor_t *t)
{
    tsl_status st = TSL_OK;
    if (!in->scratch[v]) {
        st = tsl_exec_batch_tensor(m, in->batch, tsl_exec_value_stage(m, v), &m->g->values[v].shape,
                                   1, TSL_F32, &in->scratch[v]);
        /* the output's: tiled as its gradient, which the loss terms' add into */
        if (!st && v == m->g->output)
            st = tsl_exec_channels_whole(m, &in->scratch[v]);
        if (!st && v == m->g->output && tsl_exec_pipelined(m))
            tsl_tensor_order_by_samples(in->scratch[v]);
    }
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
    if (tsl_graph_is_input(m->g, v))
        return TSL_OK;
    if (!in->written[v]) {
        in->written[v] = 1;
        *t = in->grad[v];
        return TSL_OK;
    }
    *accumulate = 1;
    return tsl_exec_scratch_of(m, in, v, t);
}

/* Value v, dropped after the forward, from its norm's input and saved statistics, once
 * `after` (the gradient the backward reading v starts from) is written. Its tasks carry the
 * norm's remaking label in traces (the calibration times them apart). */
static tsl_status remake(struct tsl_model *m, instance *in, int32_t v, tsl_tensor_t after)
{
    int32_t b = tsl_graph_recomputed(m->g, v, m->op_stage);
    const tsl_graph_op *o = &m->g->ops[b];
    in->dropped[v] = 0;
    tsl_tensor_t x = in->act[o->inputs[0]], gamma = tsl_exec_op_param(m, o, 0, 0),
                 beta = tsl_exec_op_param(m, o, 1, 0);
    char label[TSL_GRAPH_NAME_MAX + 16];
    int32_t saved[2];
    tsl_trace_label_save(m->ctx, saved);
    tsl_trace_label(m->ctx, tsl_exec_remake_label(m, b, label, sizeof label), "backward");
    tsl_status st =
        o->kind == TSL_OP_GROUPNORM
            ? tsl_groupnorm_relu_recompute(x, gamma, beta, o->norm_groups, in->saved[b], in->act[v],
                                           o->eps, after)
            : tsl_batchnorm_relu_recompute(x, gamma, beta, in->saved[b], in->act[v], o->eps, after);
    tsl_trace_label_restore(m->ctx, saved);
    return st;
}

tsl_status tsl_exec_op_backward(struct tsl_model *m, instance *in, int32_t i)
{
    const tsl_graph_op *o = &m->g->ops[i];
    if (!tsl_exec_table[o->kind].backward || m->fused[i] || m->fold[i] >= 0)
        return TSL_OK; /* a fused ReLU's backward is its batch norm's, a folded concatenation's
                          its convolution's */
    /* A batch norm with a fused ReLU takes the ReLU's output gradient. */
    int32_t out = m->relu_of[i] >= 0 ? m->g->ops[m->relu_of[i]].output : o->output;
    if (!in->written[out]) {
        /* The loss does not depend on this op: its parameters get zero gradients. */
        tsl_status st = TSL_OK;
        for (int k = 0; k < o->nparams && !st; k++)
            if (tsl_exec_op_param(m, o, k, 1))
                st = tsl_tensor_fill_constant(tsl_exec_op_param(m, o, k, 1), 0.0);
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
    if (tsl_exec_needs_regrid(o, x, y)) {
        tsl_tensor_t cdy = NULL, cx = NULL, cy = NULL;
        if ((st = tsl_exec_on_common_grid(m, o, x, x, y, &in->rx[i], &cx)) ||
            (st = tsl_exec_on_common_grid(m, o, y, x, y, &in->ry[i], &cy)) ||
            (st = tsl_exec_on_common_grid(m, o, x, x, y, &in->rdx[i], &cdx)) ||
            (st = tsl_exec_on_common_grid(m, o, y, x, y, &in->rdy[i], &cdy)) ||
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
        st = tsl_exec_table[o->kind].backward(m, in, i, x, y, dy, dx);
    if (cdx && !st) {
        st = tsl_tensor_redistribute(dx0, cdx);
        dx[0] = dx0;
    }
    /* The common grid's copies are done with (made again by the next step). */
    tsl_tensor_release(in->rx[i]);
    tsl_tensor_release(in->ry[i]);
    tsl_tensor_release(in->rdx[i]);
    tsl_tensor_release(in->rdy[i]);
    for (int32_t k = 0; k < nin && !st; k++)
        if (acc[k])
            st = tsl_tensor_axpy(in->grad[ins[k]], 1.0, dx[k]);
    return st;
}
