/* The op table: every fact about an op kind and an activation kind, written once (DESIGN.md,
 * "The op table"). The graph builders, the JSON reader and writer, the estimators, the
 * lowering and the executor's execution table (src/exec_table.c) take their facts from here;
 * tests loop over TSL_OP_KIND_COUNT and TSL_ACTIVATION_COUNT. Pure C. */
#ifndef TESSEL_GRAPH_OP_TABLE_H
#define TESSEL_GRAPH_OP_TABLE_H

#include "graph_internal.h"

/* An activation kind. Its kernels are codelets/activation.c's; nothing else is needed to
 * add one (docs/adding-an-op.md). */
typedef struct tsl_activation_info {
    const char *name;              /* model files' "op" and messages: "relu" */
    int32_t takes_slope;           /* has a "slope" attribute (LeakyReLU's negative slope) */
    double default_slope;          /* its default (PyTorch's) */
    double forward_flops;          /* per element */
    double backward_flops;         /* per element */
    int32_t backward_reads_output; /* the backward reads y (sigmoid, tanh), else x */
} tsl_activation_info;

/* The row of activation `kind`, or NULL for a kind outside [0, TSL_ACTIVATION_COUNT). */
const tsl_activation_info *tsl_activation_info_of(tsl_activation kind);

/* The activation named `name` (tsl_activation_info.name): its kind in *kind, or -1. */
int tsl_activation_find(const char *name, tsl_activation *kind);

/* An op kind. */
typedef struct tsl_op_info {
    const char *name; /* tsl_op_kind_name() */
    /* The output's per-sample shape from the op's inputs and attributes (the op as the
     * builder made it, before it is added); `weight` is its weight's shape (convolution,
     * linear) or NULL. An error names `fn` and the layer. */
    tsl_status (*infer)(const struct tsl_graph *g, const tsl_graph_op *op, const tsl_shape *weight,
                        tsl_shape *y, const char *fn);
    /* Forward flops for one sample (multiply-adds count 2); the op is in the graph. */
    double (*flops)(const struct tsl_graph *g, const tsl_graph_op *op);
    /* Whether its backward reads its input x (the value, not a gradient). */
    int (*reads_input_backward)(const tsl_graph_op *op);
    /* Whether its backward reads its own (unfused) output y: the executor then keeps y. */
    int (*keeps_output)(const tsl_graph_op *op);
} tsl_op_info;

/* The row of kind `kind`, or NULL for a kind outside [0, TSL_OP_KIND_COUNT). */
const tsl_op_info *tsl_op_info_of(tsl_op_kind kind);

#endif /* TESSEL_GRAPH_OP_TABLE_H */
