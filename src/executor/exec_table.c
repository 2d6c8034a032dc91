/* The execution table: how each op kind runs forward and backward as tile tasks
 * (tessel/ops.h), one row per kind of the op table (graph/op_table.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "codelets/fill_math.h"
#include "executor/executor.h"

/* ---- the execution table: how each op kind runs forward and backward ---- */

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
    int32_t n = tsl_exec_conv_inputs(m, in, i, x, xs);
    return tsl_conv_forward_keeping(&o->conv, o->transposed, n, xs, tsl_exec_op_param(m, o, 0, 0),
                                    tsl_exec_op_param(m, o, 1, 0), y,
                                    train ? &in->keep[i * TSL_GRAPH_MAX_INPUTS] : NULL);
}

static tsl_status forward_batchnorm(struct tsl_model *m, instance *in, int32_t i, tsl_tensor_t x,
                                    tsl_tensor_t y, int train)
{
    return tsl_exec_batchnorm_forward(m, in, i, x, train);
}

/* The same in training and evaluation: statistics of each sample. With a fused ReLU it writes
 * the ReLU's output. */
static tsl_status forward_groupnorm(struct tsl_model *m, instance *in, int32_t i, tsl_tensor_t x,
                                    tsl_tensor_t y, int train)
{
    const tsl_graph_op *o = &m->g->ops[i];
    const int32_t r = m->relu_of[i];
    return (r >= 0 ? tsl_groupnorm_relu_forward : tsl_groupnorm_forward)(
        x, tsl_exec_op_param(m, o, 0, 0), tsl_exec_op_param(m, o, 1, 0), o->norm_groups,
        in->saved[i], r >= 0 ? in->act[m->g->ops[r].output] : y, o->eps);
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
    tsl_status st = tsl_exec_indices_of(m, in, i, y);
    return st ? st : tsl_pool_forward_indices(&o->pool, x, y, in->pidx[i]);
}

static tsl_status forward_upsample(struct tsl_model *m, instance *in, int32_t i, tsl_tensor_t x,
                                   tsl_tensor_t y, int train)
{
    const tsl_graph_op *o = &m->g->ops[i];
    const int64_t *scale = o->scale[0] ? o->scale : NULL; /* NULL: to the output's size */
    return o->linear ? tsl_upsample_linear_forward(scale, x, y)
                     : tsl_upsample_nearest_forward(scale, x, y);
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

/* a on the tile grid and layout of `like`: a itself where they match, else its copy moved there
 * in slot `slot` of op i (transient: its values moved again at every call, and its buffers
 * released by release_inputs_like once the op's tasks that read it are submitted). */
static tsl_status input_like(struct tsl_model *m, instance *in, int32_t i, int32_t slot,
                             tsl_tensor_t a, tsl_tensor_t like, tsl_tensor_t *out)
{
    *out = a;
    if (!memcmp(a->grid.splits, like->grid.splits, sizeof a->grid.splits) &&
        a->layout == like->layout)
        return TSL_OK;
    tsl_tensor_t *copy = &in->rin[(size_t)i * TSL_GRAPH_MAX_INPUTS + (size_t)slot];
    tsl_status st = *copy ? TSL_OK
                          : tsl_tensor_create_transient(copy, m->ctx, TSL_F32, &a->shape,
                                                        &like->grid, &like->owners, like->layout);
    if (!st)
        st = tsl_tensor_redistribute(*copy, a);
    *out = *copy;
    return st;
}

/* Op i's copies made by input_like: their readers are submitted, so StarPU frees their buffers
 * once those have run; the next call fills them again. */
static void release_inputs_like(instance *in, int32_t i)
{
    for (int32_t k = 0; k < TSL_GRAPH_MAX_INPUTS; k++)
        tsl_tensor_release(in->rin[(size_t)i * TSL_GRAPH_MAX_INPUTS + (size_t)k]);
}

static tsl_status forward_add(struct tsl_model *m, instance *in, int32_t i, tsl_tensor_t x,
                              tsl_tensor_t y, int train)
{
    const tsl_graph_op *o = &m->g->ops[i];
    tsl_tensor_t a, b;
    tsl_status st = input_like(m, in, i, 0, x, y, &a);
    if (!st)
        st = input_like(m, in, i, 1, in->act[o->inputs[1]], y, &b);
    if (!st)
        st = tsl_tensor_add_scaled(y, o->h, a, b);
    for (int32_t k = 2; k < o->ninputs && !st; k++) /* in order: ((h x0 + x1) + x2) + ... */
        if (!(st = input_like(m, in, i, k, in->act[o->inputs[k]], y, &b)))
            st = tsl_tensor_axpy(y, 1.0, b);
    release_inputs_like(in, i);
    return st;
}

static tsl_status forward_mul(struct tsl_model *m, instance *in, int32_t i, tsl_tensor_t x,
                              tsl_tensor_t y, int train)
{
    tsl_tensor_t a, b;
    tsl_status st = input_like(m, in, i, 0, x, y, &a);
    if (!st)
        st = input_like(m, in, i, 1, in->act[m->g->ops[i].inputs[1]], y, &b);
    if (!st)
        st = tsl_tensor_mul(y, a, b);
    release_inputs_like(in, i);
    return st;
}

/* Training: the op's uniform draws for this step (from the model's seed, the op and the step
 * count alone) into its mask tensor, kept for the backward; then y. Inference: y = x. */
static tsl_status forward_dropout(struct tsl_model *m, instance *in, int32_t i, tsl_tensor_t x,
                                  tsl_tensor_t y, int train)
{
    const tsl_graph_op *o = &m->g->ops[i];
    if (!train || o->p == 0)
        return tsl_tensor_redistribute(y, x);
    tsl_status st = TSL_OK;
    if (!in->mask[i]) {
        st = tsl_tensor_create_transient(&in->mask[i], m->ctx, TSL_F32, &y->shape, &y->grid,
                                         &y->owners, y->layout);
        if (!st && tsl_exec_pipelined(m))
            tsl_tensor_order_by_samples(in->mask[i]);
    }
    uint64_t seed =
        tsl_fill_mix64(m->seed ^ tsl_fill_mix64((uint64_t)i ^ tsl_fill_mix64(in->dropout_step)));
    if (!st)
        st = tsl_tensor_fill_uniform(in->mask[i], seed, 0.0, 1.0);
    return st ? st : tsl_dropout_apply(y, x, in->mask[i], o->p);
}

/* The op's box of x: its origin (batch axis 0) and extent (the whole batch). */
static void slice_box(const tsl_graph_op *o, tsl_tensor_t y, int64_t *lo, int64_t *extent)
{
    tsl_shape ys;
    tsl_tensor_shape(y, &ys);
    lo[0] = 0;
    for (int d = 0; d < ys.ndim; d++) {
        extent[d] = ys.dims[d];
        if (d)
            lo[d] = o->start[d - 1];
    }
}

static tsl_status forward_slice(struct tsl_model *m, instance *in, int32_t i, tsl_tensor_t x,
                                tsl_tensor_t y, int train)
{
    int64_t lo[TSL_MAX_DIMS], zero[TSL_MAX_DIMS] = {0}, extent[TSL_MAX_DIMS];
    slice_box(&m->g->ops[i], y, lo, extent);
    return tsl_copy_region(y, x, lo, zero, extent);
}

/* Flatten's sample-cut copies of its input and output (tsl_exec_flat_of): transient, their
 * readers submitted; the next pass fills them again. */
static void release_flat(struct tsl_model *m, instance *in, int32_t i)
{
    tsl_tensor_release(in->flat[m->g->ops[i].inputs[0]]);
    tsl_tensor_release(in->flat[m->g->ops[i].output]);
}

static tsl_status forward_flatten(struct tsl_model *m, instance *in, int32_t i, tsl_tensor_t x,
                                  tsl_tensor_t y, int train)
{
    if (!tsl_exec_flat_needed(x, y)) /* (channel tiles to feature tiles too) */
        return tsl_reshape_samples(x, y);
    tsl_tensor_t fx, fy = NULL;
    tsl_status st = tsl_exec_flat_of(m, in, m->g->ops[i].inputs[0], &fx);
    if (!st)
        st = tsl_tensor_redistribute(fx, x);
    if (!st && !tsl_exec_flat_needed(fx, y))
        st = tsl_reshape_samples(fx, y);
    else if (!st && !(st = tsl_exec_flat_of(m, in, m->g->ops[i].output, &fy)) &&
             !(st = tsl_reshape_samples(fx, fy)))
        st = tsl_tensor_redistribute(y, fy);
    release_flat(m, in, i);
    return st;
}

static tsl_status forward_linear(struct tsl_model *m, instance *in, int32_t i, tsl_tensor_t x,
                                 tsl_tensor_t y, int train)
{
    const tsl_graph_op *o = &m->g->ops[i];
    return tsl_linear_forward(x, tsl_exec_op_param(m, o, 0, 0), tsl_exec_op_param(m, o, 1, 0), y);
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
static tsl_status backward_mul(struct tsl_model *m, instance *in, int32_t i, tsl_tensor_t x,
                               tsl_tensor_t y, tsl_tensor_t dy, tsl_tensor_t *dx);
static tsl_status backward_slice(struct tsl_model *m, instance *in, int32_t i, tsl_tensor_t x,
                                 tsl_tensor_t y, tsl_tensor_t dy, tsl_tensor_t *dx);
static tsl_status backward_linear(struct tsl_model *m, instance *in, int32_t i, tsl_tensor_t x,
                                  tsl_tensor_t y, tsl_tensor_t dy, tsl_tensor_t *dx);
static tsl_status backward_dropout(struct tsl_model *m, instance *in, int32_t i, tsl_tensor_t x,
                                   tsl_tensor_t y, tsl_tensor_t dy, tsl_tensor_t *dx);
static tsl_status backward_groupnorm(struct tsl_model *m, instance *in, int32_t i, tsl_tensor_t x,
                                     tsl_tensor_t y, tsl_tensor_t dy, tsl_tensor_t *dx);

const tsl_exec_row tsl_exec_table[] = {
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
    [TSL_OP_MUL] = {forward_mul, backward_mul},
    [TSL_OP_SLICE] = {forward_slice, backward_slice},
    [TSL_OP_DROPOUT] = {forward_dropout, backward_dropout},
    [TSL_OP_GROUPNORM] = {forward_groupnorm, backward_groupnorm},
};
_Static_assert(sizeof tsl_exec_table / sizeof tsl_exec_table[0] == TSL_OP_KIND_COUNT,
               "one row of the execution table per op kind");

static tsl_status backward_conv(struct tsl_model *m, instance *in, int32_t i, tsl_tensor_t x,
                                tsl_tensor_t y, tsl_tensor_t dy, tsl_tensor_t *dx)
{
    const tsl_graph_op *o = &m->g->ops[i];
    tsl_tensor_t xs[TSL_GRAPH_MAX_INPUTS];
    int32_t n = tsl_exec_conv_inputs(m, in, i, x, xs);
    return tsl_conv_backward_keeping(&o->conv, o->transposed, n, xs, tsl_exec_op_param(m, o, 0, 0),
                                     dy, dx, tsl_exec_op_param(m, o, 0, 1),
                                     tsl_exec_op_param(m, o, 1, 1),
                                     &in->keep[i * TSL_GRAPH_MAX_INPUTS]);
}

static tsl_status backward_batchnorm(struct tsl_model *m, instance *in, int32_t i, tsl_tensor_t x,
                                     tsl_tensor_t y, tsl_tensor_t dy, tsl_tensor_t *dx)
{
    const tsl_graph_op *o = &m->g->ops[i];
    if (m->relu_of[i] >= 0)
        return tsl_batchnorm_relu_backward(
            x, dy, tsl_exec_op_param(m, o, 0, 0), tsl_exec_op_param(m, o, 1, 0), in->saved[i],
            dx[0], tsl_exec_op_param(m, o, 0, 1), tsl_exec_op_param(m, o, 1, 1));
    return tsl_batchnorm_backward(x, dy, tsl_exec_op_param(m, o, 0, 0), in->saved[i], dx[0],
                                  tsl_exec_op_param(m, o, 0, 1), tsl_exec_op_param(m, o, 1, 1));
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
    const int64_t *scale = o->scale[0] ? o->scale : NULL;
    return o->linear ? tsl_upsample_linear_backward(scale, dy, dx[0])
                     : tsl_upsample_nearest_backward(scale, dy, dx[0]);
}

/* The network input's part (no gradient wanted) goes to throw-away space. */
static tsl_status backward_concat(struct tsl_model *m, instance *in, int32_t i, tsl_tensor_t x,
                                  tsl_tensor_t y, tsl_tensor_t dy, tsl_tensor_t *dx)
{
    const tsl_graph_op *o = &m->g->ops[i];
    tsl_status st = TSL_OK;
    for (int32_t k = 0; k < o->ninputs && !st; k++)
        if (!dx[k])
            st = tsl_exec_scratch_of(m, in, o->inputs[k], &dx[k]);
    return st ? st : tsl_split_channels(dy, o->ninputs, dx);
}

static tsl_status backward_add(struct tsl_model *m, instance *in, int32_t i, tsl_tensor_t x,
                               tsl_tensor_t y, tsl_tensor_t dy, tsl_tensor_t *dx)
{
    tsl_status st = TSL_OK;
    for (int32_t k = 0; k < m->g->ops[i].ninputs && !st; k++)
        if (dx[k])
            st = tsl_tensor_redistribute(dx[k], dy);
    if (!st && dx[0] && m->g->ops[i].h != 1.0) /* d(h a)/da = h */
        st = tsl_tensor_scale(dx[0], m->g->ops[i].h);
    return st;
}

/* dx: dy in the op's box, zeros elsewhere. */
static tsl_status backward_slice(struct tsl_model *m, instance *in, int32_t i, tsl_tensor_t x,
                                 tsl_tensor_t y, tsl_tensor_t dy, tsl_tensor_t *dx)
{
    if (!dx[0])
        return TSL_OK;
    int64_t lo[TSL_MAX_DIMS], zero[TSL_MAX_DIMS] = {0}, extent[TSL_MAX_DIMS];
    slice_box(&m->g->ops[i], dy, lo, extent);
    tsl_status st = tsl_tensor_fill_constant(dx[0], 0.0);
    return st ? st : tsl_copy_region(dx[0], dy, zero, lo, extent);
}

/* d(a b)/da = b, d(a b)/db = a: dy (on the inputs' tiles) times the other input. */
static tsl_status backward_mul(struct tsl_model *m, instance *in, int32_t i, tsl_tensor_t x,
                               tsl_tensor_t y, tsl_tensor_t dy, tsl_tensor_t *dx)
{
    const tsl_graph_op *o = &m->g->ops[i];
    tsl_status st = TSL_OK;
    tsl_tensor_t other;
    for (int32_t k = 0; k < 2 && !st; k++) /* (slots 2, 3: the other input on dx[k]'s grid) */
        if (dx[k] && !(st = tsl_tensor_redistribute(dx[k], dy)) &&
            !(st = input_like(m, in, i, 2 + k, in->act[o->inputs[1 - k]], dx[k], &other)))
            st = tsl_tensor_mul(dx[k], dx[k], other);
    release_inputs_like(in, i);
    return st;
}

static tsl_status backward_flatten(struct tsl_model *m, instance *in, int32_t i, tsl_tensor_t x,
                                   tsl_tensor_t y, tsl_tensor_t dy, tsl_tensor_t *dx)
{
    if (!tsl_exec_flat_needed(x, y))
        return tsl_reshape_samples(dy, dx[0]);
    tsl_tensor_t fx, fy;
    tsl_status st = tsl_exec_flat_of(m, in, m->g->ops[i].inputs[0], &fx);
    if (!st && !tsl_exec_flat_needed(fx, dy))
        st = tsl_reshape_samples(dy, fx);
    else if (!st && !(st = tsl_exec_flat_of(m, in, m->g->ops[i].output, &fy)) &&
             !(st = tsl_tensor_redistribute(fy, dy)))
        st = tsl_reshape_samples(fy, fx);
    if (!st)
        st = tsl_tensor_redistribute(dx[0], fx);
    release_flat(m, in, i);
    return st;
}

static tsl_status backward_linear(struct tsl_model *m, instance *in, int32_t i, tsl_tensor_t x,
                                  tsl_tensor_t y, tsl_tensor_t dy, tsl_tensor_t *dx)
{
    const tsl_graph_op *o = &m->g->ops[i];
    return tsl_linear_backward(x, tsl_exec_op_param(m, o, 0, 0), dy, dx[0],
                               tsl_exec_op_param(m, o, 0, 1), tsl_exec_op_param(m, o, 1, 1));
}

/* dx = dy through the forward's mask (kept in in->mask[i]; none with p = 0). */
static tsl_status backward_dropout(struct tsl_model *m, instance *in, int32_t i, tsl_tensor_t x,
                                   tsl_tensor_t y, tsl_tensor_t dy, tsl_tensor_t *dx)
{
    const tsl_graph_op *o = &m->g->ops[i];
    if (!dx[0])
        return TSL_OK;
    if (o->p == 0)
        return tsl_tensor_redistribute(dx[0], dy);
    if (!in->mask[i])
        return tsl_error(m->ctx, TSL_ERR_STATE, "dropout %d: a backward without its forward",
                         (int)i);
    return tsl_dropout_apply(dx[0], dy, in->mask[i], o->p);
}

static tsl_status backward_groupnorm(struct tsl_model *m, instance *in, int32_t i, tsl_tensor_t x,
                                     tsl_tensor_t y, tsl_tensor_t dy, tsl_tensor_t *dx)
{
    const tsl_graph_op *o = &m->g->ops[i];
    if (m->relu_of[i] >= 0) /* dy: the fused ReLU's output gradient */
        return tsl_groupnorm_relu_backward(
            x, dy, tsl_exec_op_param(m, o, 0, 0), tsl_exec_op_param(m, o, 1, 0), o->norm_groups,
            in->saved[i], dx[0], tsl_exec_op_param(m, o, 0, 1), tsl_exec_op_param(m, o, 1, 1));
    return tsl_groupnorm_backward(x, dy, tsl_exec_op_param(m, o, 0, 0), o->norm_groups,
                                  in->saved[i], dx[0], tsl_exec_op_param(m, o, 0, 1),
                                  tsl_exec_op_param(m, o, 1, 1));
}
