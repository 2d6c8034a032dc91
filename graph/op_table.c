/* The op table (op_table.h): names, shape inference, flops and what each backward reads, for
 * every op kind and every activation kind. */
#include <string.h>

#include "error.h"
#include "op_table.h"

/* ---- activations ---- */

static const tsl_activation_info activations[] = {
    [TSL_ACT_RELU] = {"relu", 0, 0.0, 1.0, 1.0, 0},
    [TSL_ACT_LEAKY_RELU] = {"leaky_relu", 1, 0.01, 1.0, 2.0, 0},
    [TSL_ACT_SIGMOID] = {"sigmoid", 0, 0.0, 4.0, 2.0, 1},
    [TSL_ACT_TANH] = {"tanh", 0, 0.0, 4.0, 2.0, 1},
    [TSL_ACT_GELU] = {"gelu", 0, 0.0, 10.0, 14.0, 0},
    [TSL_ACT_SILU] = {"silu", 0, 0.0, 5.0, 8.0, 0},
};
_Static_assert(sizeof activations / sizeof activations[0] == TSL_ACTIVATION_COUNT,
               "one row per activation kind");

const tsl_activation_info *tsl_activation_info_of(tsl_activation kind)
{
    return (unsigned)kind < TSL_ACTIVATION_COUNT ? &activations[kind] : NULL;
}

int tsl_activation_find(const char *name, tsl_activation *kind)
{
    for (int k = 0; k < TSL_ACTIVATION_COUNT; k++)
        if (strcmp(activations[k].name, name) == 0) {
            *kind = (tsl_activation)k;
            return 0;
        }
    return -1;
}

/* ---- shapes ---- */

static tsl_shape batched(const tsl_shape *s)
{
    tsl_shape b;
    tsl_batch_shape(1, s, &b);
    return b;
}

static tsl_shape unbatched(const tsl_shape *b)
{
    tsl_shape s;
    memset(&s, 0, sizeof s);
    s.ndim = b->ndim - 1;
    for (int d = 0; d < s.ndim; d++)
        s.dims[d] = b->dims[d + 1];
    return s;
}

static const tsl_shape *input_shape(const struct tsl_graph *g, const tsl_graph_op *op, int k)
{
    return &g->values[op->inputs[k]].shape;
}

static tsl_status infer_given(const struct tsl_graph *g, const tsl_graph_op *op,
                              const tsl_shape *given, tsl_shape *y, const char *fn)
{
    tsl_shape b = batched(given);
    tsl_status st = tsl_shape_check(&b);
    if (st)
        return tsl_error(NULL, st, "%s: %s", fn, tsl_last_error());
    *y = *given;
    return TSL_OK;
}

static tsl_status infer_same(const struct tsl_graph *g, const tsl_graph_op *op,
                             const tsl_shape *given, tsl_shape *y, const char *fn)
{
    *y = *input_shape(g, op, 0);
    return TSL_OK;
}

static tsl_status infer_conv(const struct tsl_graph *g, const tsl_graph_op *op,
                             const tsl_shape *weight, tsl_shape *y, const char *fn)
{
    tsl_shape xs = batched(input_shape(g, op, 0)), ys;
    tsl_status st = op->transposed ? tsl_conv_transpose_output_shape(&xs, weight, &op->conv, &ys)
                                   : tsl_conv_output_shape(&xs, weight, &op->conv, &ys);
    if (st)
        return tsl_error(NULL, st, "%s: '%s': %s", fn, op->name, tsl_last_error());
    *y = unbatched(&ys);
    return TSL_OK;
}

static tsl_status infer_pool(const struct tsl_graph *g, const tsl_graph_op *op,
                             const tsl_shape *given, tsl_shape *y, const char *fn)
{
    tsl_shape xs = batched(input_shape(g, op, 0)), ys;
    tsl_status st = tsl_pool_output_shape(&xs, &op->pool, &ys);
    if (st)
        return tsl_error(NULL, st, "%s: %s", fn, tsl_last_error());
    *y = unbatched(&ys);
    return TSL_OK;
}

static tsl_status infer_upsample(const struct tsl_graph *g, const tsl_graph_op *op,
                                 const tsl_shape *given, tsl_shape *y, const char *fn)
{
    tsl_shape s = *input_shape(g, op, 0);
    for (int d = 0; d < s.ndim - 1; d++)
        s.dims[1 + d] = op->scale[0] ? s.dims[1 + d] * op->scale[d] : op->size[d];
    return infer_given(g, op, &s, y, fn);
}

static tsl_status infer_concat(const struct tsl_graph *g, const tsl_graph_op *op,
                               const tsl_shape *given, tsl_shape *y, const char *fn)
{
    tsl_shape s = *input_shape(g, op, 0);
    for (int32_t k = 1; k < op->ninputs; k++) {
        const tsl_shape *v = input_shape(g, op, k);
        int ok = v->ndim == s.ndim && v->ndim >= 1;
        for (int d = 1; ok && d < s.ndim; d++)
            ok = v->dims[d] == s.dims[d];
        if (!ok)
            return tsl_error(NULL, TSL_ERR_SHAPE,
                             "%s: values must agree in every dimension but channels", fn);
        s.dims[0] += v->dims[0];
    }
    *y = s;
    return TSL_OK;
}

static tsl_status infer_add(const struct tsl_graph *g, const tsl_graph_op *op,
                            const tsl_shape *given, tsl_shape *y, const char *fn)
{
    const tsl_shape *a = input_shape(g, op, 0);
    for (int32_t k = 1; k < op->ninputs; k++) {
        const tsl_shape *b = input_shape(g, op, k);
        if (a->ndim != b->ndim || memcmp(a->dims, b->dims, sizeof a->dims) != 0)
            return tsl_error(NULL, TSL_ERR_SHAPE, "%s: the %s values differ in shape", fn,
                             op->ninputs == 2 ? "two" : "added");
    }
    *y = *a;
    return TSL_OK;
}

static tsl_status infer_slice(const struct tsl_graph *g, const tsl_graph_op *op,
                              const tsl_shape *given, tsl_shape *y, const char *fn)
{
    *y = *input_shape(g, op, 0);
    for (int d = 0; d < y->ndim; d++)
        y->dims[d] = op->stop[d] - op->start[d];
    return TSL_OK;
}

static tsl_status infer_flatten(const struct tsl_graph *g, const tsl_graph_op *op,
                                const tsl_shape *given, tsl_shape *y, const char *fn)
{
    memset(y, 0, sizeof *y);
    y->ndim = 1;
    y->dims[0] = tsl_shape_numel(input_shape(g, op, 0));
    return TSL_OK;
}

static tsl_status infer_linear(const struct tsl_graph *g, const tsl_graph_op *op,
                               const tsl_shape *weight, tsl_shape *y, const char *fn)
{
    memset(y, 0, sizeof *y);
    y->ndim = 1;
    y->dims[0] = weight->dims[0];
    return TSL_OK;
}

/* ---- flops for one sample ---- */

static double output_numel(const struct tsl_graph *g, const tsl_graph_op *op)
{
    return (double)tsl_shape_numel(&g->values[op->output].shape);
}

static double flops_none(const struct tsl_graph *g, const tsl_graph_op *op)
{
    return 0;
}

static double flops_per_output(const struct tsl_graph *g, const tsl_graph_op *op)
{
    return output_numel(g, op);
}

static double flops_conv(const struct tsl_graph *g, const tsl_graph_op *op)
{
    const tsl_shape *w = &g->params[op->params[0]].shape;
    double taps = (double)(tsl_shape_numel(w) / w->dims[0]), out = output_numel(g, op);
    if (op->transposed) /* each input position meets each tap of its group */
        return 2.0 * (double)tsl_shape_numel(input_shape(g, op, 0)) * taps;
    return out * 2.0 * taps + (op->bias ? out : 0);
}

static double flops_batchnorm(const struct tsl_graph *g, const tsl_graph_op *op)
{
    return 4.0 * output_numel(g, op);
}

static double flops_activation(const struct tsl_graph *g, const tsl_graph_op *op)
{
    return tsl_activation_info_of(op->act)->forward_flops * output_numel(g, op);
}

static double flops_pool(const struct tsl_graph *g, const tsl_graph_op *op)
{
    double k = 1;
    for (int d = 0; d < op->pool.spatial; d++)
        k *= (double)op->pool.kernel[d];
    return output_numel(g, op) * k;
}

static double flops_upsample(const struct tsl_graph *g, const tsl_graph_op *op)
{
    return (op->linear ? 4.0 : 1.0) * output_numel(g, op);
}

static double flops_linear(const struct tsl_graph *g, const tsl_graph_op *op)
{
    double out = output_numel(g, op);
    return 2.0 * out * (double)input_shape(g, op, 0)->dims[0] + (op->bias ? out : 0);
}

/* ---- what a backward reads ---- */

static int reads_never(const tsl_graph_op *op)
{
    return 0;
}

static int reads_always(const tsl_graph_op *op)
{
    return 1;
}

/* Average pooling's backward spreads dy over the windows (their sizes alone); max pooling's
 * training keeps its indices instead (tsl_graph_pool_index_bytes()). */
static int reads_pool(const tsl_graph_op *op)
{
    return op->pool.kind == TSL_POOL_MAX && tsl_graph_pool_index_bytes(op) == 0;
}

static int reads_activation(const tsl_graph_op *op)
{
    return !tsl_activation_info_of(op->act)->backward_reads_output;
}

/* (sigmoid and tanh: their backward reads y; ReLU's and the others' read x) */
static int keeps_activation(const tsl_graph_op *op)
{
    return tsl_activation_info_of(op->act)->backward_reads_output;
}

/* ---- the table ---- */

static const tsl_op_info ops[] = {
    [TSL_OP_INPUT] = {"input", infer_given, flops_none, reads_never, reads_never},
    [TSL_OP_CONV] = {"conv", infer_conv, flops_conv, reads_always, reads_never},
    [TSL_OP_BATCHNORM] = {"batchnorm", infer_same, flops_batchnorm, reads_always, reads_never},
    /* The executor hands every activation's backward its output; sigmoid and tanh read it. */
    [TSL_OP_ACTIVATION] = {"activation", infer_same, flops_activation, reads_activation,
                           keeps_activation},
    [TSL_OP_POOL] = {"pool", infer_pool, flops_pool, reads_pool, reads_never},
    [TSL_OP_UPSAMPLE] = {"upsample", infer_upsample, flops_upsample, reads_never, reads_never},
    [TSL_OP_CONCAT] = {"concat", infer_concat, flops_none, reads_never, reads_never},
    [TSL_OP_ADD] = {"add", infer_add, flops_per_output, reads_never, reads_never},
    [TSL_OP_FLATTEN] = {"flatten", infer_flatten, flops_none, reads_never, reads_never},
    [TSL_OP_LINEAR] = {"linear", infer_linear, flops_linear, reads_always, reads_never},
    /* (its backward reads both inputs: d(a b)/da = b, d(a b)/db = a) */
    [TSL_OP_MUL] = {"mul", infer_add, flops_per_output, reads_always, reads_never},
    [TSL_OP_SLICE] = {"slice", infer_slice, flops_none, reads_never, reads_never},
    /* (its backward reads the mask its forward kept, not x) */
    [TSL_OP_DROPOUT] = {"dropout", infer_same, flops_per_output, reads_never, reads_never},
    [TSL_OP_GROUPNORM] = {"groupnorm", infer_same, flops_batchnorm, reads_always, reads_never},
};
_Static_assert(sizeof ops / sizeof ops[0] == TSL_OP_KIND_COUNT, "one row per op kind");

const tsl_op_info *tsl_op_info_of(tsl_op_kind kind)
{
    return (unsigned)kind < TSL_OP_KIND_COUNT ? &ops[kind] : NULL;
}

const char *tsl_op_kind_name(tsl_op_kind kind)
{
    const tsl_op_info *info = tsl_op_info_of(kind);
    return info ? info->name : "invalid";
}

int tsl_graph_op_reads_input_backward(const tsl_graph_op *op)
{
    return tsl_op_info_of(op->kind)->reads_input_backward(op);
}

int32_t tsl_graph_pool_index_bytes(const tsl_graph_op *op)
{
    if (op->kind != TSL_OP_POOL || op->pool.kind != TSL_POOL_MAX)
        return 0;
    int64_t positions = 1;
    for (int d = 0; d < op->pool.spatial; d++)
        positions *= op->pool.kernel[d];
    return positions > 255 ? 4 : 1;
}
