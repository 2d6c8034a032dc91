/* The graph's representation, shared by graph/ (building, shape inference) and the model
 * executor in src/ (lowering to tile tasks). Pure C. */
#ifndef TESSEL_GRAPH_INTERNAL_H
#define TESSEL_GRAPH_INTERNAL_H

#include "tessel/graph.h"

#define TSL_GRAPH_MAX_INPUTS 8 /* most inputs of one op (concatenation) */
#define TSL_GRAPH_MAX_PARAMS 4 /* weight, bias, running mean, running variance */

typedef struct tsl_graph_value {
    tsl_shape shape;   /* per sample: C, spatial... */
    int32_t producer;  /* op index */
    int32_t consumers; /* number of op inputs that read it */
} tsl_graph_value;

typedef struct tsl_graph_param {
    char name[TSL_GRAPH_NAME_MAX];
    tsl_shape shape;
    int32_t trainable;
    int32_t init;      /* TSL_INIT_* */
    double init_bound; /* uniform bound for TSL_INIT_UNIFORM */
    int32_t shares;    /* 1 + the parameter whose values this one holds (its op shares another
                          op's parameters, tsl_graph_share_params()); 0: its own */
} tsl_graph_param;

enum { TSL_INIT_UNIFORM = 0, TSL_INIT_ZEROS = 1, TSL_INIT_ONES = 2 };

typedef struct tsl_graph_op {
    tsl_op_kind kind;
    char name[TSL_GRAPH_NAME_MAX];
    int32_t ninputs;
    int32_t inputs[TSL_GRAPH_MAX_INPUTS];
    int32_t output;
    int32_t nparams;
    int32_t params[TSL_GRAPH_MAX_PARAMS]; /* weight, bias (or -1), running mean, running var */
    /* attributes */
    tsl_conv_params conv;
    int32_t transposed;
    int32_t bias;
    double eps, momentum; /* batch norm */
    double h;             /* add: h * inputs[0] + inputs[1] (an ODE step's size; 1 by default) */
    double p;             /* dropout: the probability of zeroing an element */
    int64_t norm_groups;  /* group norm: groups (1 for layer norm) */
    int32_t norm_kind;    /* group norm: 0 group, 1 layer (tsl_graph_layernorm), 2 instance
                             (tsl_graph_instancenorm): its model-file name */
    tsl_activation act;
    double slope;
    tsl_pool_params pool;
    int64_t scale[3]; /* upsampling: integer factors, or 0: to `size` */
    int64_t size[3];  /* upsampling to these spatial sizes (PyTorch's size=) */
    int32_t linear;   /* upsampling mode */
    int64_t start[TSL_MAX_DIMS - 1], stop[TSL_MAX_DIMS - 1]; /* slice: per sample axis */
    int32_t stage; /* pipeline stage + 1 given by tsl_graph_set_stage(); 0: none */
} tsl_graph_op;

struct tsl_graph {
    tsl_graph_value *values;
    int32_t nvalues, cap_values;
    tsl_graph_op *ops;
    int32_t nops, cap_ops;
    tsl_graph_param *params;
    int32_t nparams, cap_params;
    int32_t input, output;
    tsl_loss_term loss[TSL_MAX_LOSS_TERMS]; /* tsl_graph_set_loss(); nloss 0: the default */
    int32_t nloss;
    /* Each value's readers (tsl_graph_readers()): ops rd_ops[rd_start[v] .. rd_start[v + 1]),
     * made on first use for the rd_nops ops then present (ops are only appended, their inputs
     * never change), again once there are more. */
    int32_t *rd_start, *rd_ops, rd_nops, rd_nvalues;
};

/* The ops reading value v, in ascending order (an op reading it twice twice): *count of them
 * (0: none). *count is -1 when the index cannot be made (out of memory): the caller then looks
 * through the ops itself. */
const int32_t *tsl_graph_readers(const struct tsl_graph *g, int32_t v, int32_t *count);

/* Whether value v is one of the graph's inputs (tsl_graph_add_input()). */
static inline int tsl_graph_is_input(const struct tsl_graph *g, int32_t v)
{
    return v >= 0 && v < g->nvalues && g->ops[g->values[v].producer].kind == TSL_OP_INPUT;
}

/* The shape of a (batch, sample...) tensor. */
void tsl_batch_shape(int64_t batch, const tsl_shape *sample, tsl_shape *out);

/* Whether no op after op o reads value v (ops run in order, forward). fold (nops entries, may
 * be NULL: none) marks the concatenations the executor folds into their convolution
 * (tsl_graph_folded_concat()): their reads count as the convolution's. */
int tsl_graph_last_reader(const struct tsl_graph *g, int32_t v, int32_t o, const int32_t *fold);

/* The values op o reads as the executor runs it, into inputs (TSL_GRAPH_MAX_INPUTS entries);
 * returns their count: none for a folded concatenation, its parts for the convolution that
 * reads it in place, else the op's inputs. fold as for tsl_graph_last_reader(). */
int32_t tsl_graph_exec_inputs(const struct tsl_graph *g, int32_t o, const int32_t *fold,
                              int32_t *inputs);

/* Whether op o, a convolution or linear layer of a later pipeline stage (op_stage: each op's;
 * NULL: one stage), makes its weights' gradients after the rest of its stage's backward
 * (TSL_DEFERRED_PRIORITY), so that they overlap the stages before it instead of delaying the
 * input gradient they wait for: the stage's first such layer on its path from an earlier stage
 * (none of its stage before it). Its output gradient and input stay until then, but the rest of
 * its stage's backward on that path is cheap (norms, activations). Deferring the stage's other
 * layers too ran up to 29 % faster on 2 ranks, but their gradients and inputs held until the
 * end raised the largest rank's peak buffers by 22 % (fcn2d 64^2) and 27 % (unet2d 64^2). */
int tsl_graph_defers_weights(const struct tsl_graph *g, const int32_t *op_stage, int32_t o);

/* The convolution that reads concatenation op o in place (tsl_conv_concat_forward()), or -1:
 * the concatenation's output is not the graph's output, its only reader is a convolution (one
 * group, not transposed) whose output has the concatenation's spatial size (so its parts
 * share the output's tile grid), all on one pipeline stage (op_stage may be NULL: one stage).
 * The concatenation then has no tensor of its own, nor a gradient. */
int32_t tsl_graph_folded_concat(const struct tsl_graph *g, int32_t o, const int32_t *op_stage);

/* Whether op's backward reads its input x (the value itself, not a gradient): convolution,
 * linear, batch norm, average pooling, ReLU and leaky ReLU. Max pooling's training keeps its
 * indices instead (tsl_pool_forward_indices(); tsl_graph_pool_index_bytes()). */
int tsl_graph_op_reads_input_backward(const tsl_graph_op *op);

/* Bytes per output element of the indices a training forward of op keeps for its backward:
 * 1 (u8) or 4 (i32) for max pooling, by its kernel's positions; 0 for other ops. */
int32_t tsl_graph_pool_index_bytes(const tsl_graph_op *op);

/* Whether a training step reads value v after the forward pass: the graph's input and output,
 * an unfused activation's output (sigmoid and tanh read it), and any input of an op whose
 * backward reads it (tsl_graph_op_reads_input_backward). `fused` (nops entries, may be NULL)
 * marks the ReLUs fused into their batch norms, `fold` (may be NULL) the folded
 * concatenations (tsl_graph_last_reader()), whose parts their convolution's backward reads. A
 * value no backward reads (a transposed convolution's output that only an unfolded
 * concatenation reads, a batch norm's output that only an addition reads) is released by the
 * executor after its last forward reader. */
int tsl_graph_value_read_backward(const struct tsl_graph *g, int32_t v, const uint8_t *fused,
                                  const int32_t *fold);

/* The ReLU op that the executor fuses into batch-norm or group-norm op o, or -1: the norm's
 * output is not the graph's output and its only reader is that ReLU, on the same pipeline stage
 * (op_stage may be NULL: one stage). The norm's output then has no tensor of its own: the fused
 * forward writes the ReLU's output, and the fused backward reads its gradient. */
int32_t tsl_graph_fused_relu(const struct tsl_graph *g, int32_t o, const int32_t *op_stage);

/* The batch-norm or group-norm op whose fused ReLU (tsl_graph_fused_relu()) writes value v, when
 * a plan with recompute=1 has the executor make v again for the backward instead of keeping it
 * from the forward, or -1: v is not the graph's output, and the ops reading it are on the
 * norm's stage (op_stage may be NULL: one stage). The executor drops v after its last forward
 * reader and makes it again from the norm's input and saved statistics (an elementwise pass)
 * before the first backward that reads it; the norm's backward, which reads its input, drops it
 * again. */
int32_t tsl_graph_recomputed(const struct tsl_graph *g, int32_t v, const int32_t *op_stage);

/* Marks remade[o] = 1 (nops entries, zeroed here) for each norm op o whose fused ReLU output a
 * recompute=1 plan drops after the forward and makes again in the backward: a value that
 * tsl_graph_recomputed() allows, that some backward reads (tsl_graph_value_read_backward()) and
 * that no loss reads. op_stage as there. Returns how many (-1: out of memory). */
int32_t tsl_graph_remade_norms(const struct tsl_graph *g, const int32_t *op_stage, uint8_t *remade);

/* Type of the labels of a `classes`-class output as the executor stores them: the narrowest
 * holding every class id and one invalid label, u8 up to 254 classes, else i32 (a per-pixel
 * label is then 1 byte instead of the 8 of the i64 labels callers pass). */
static inline tsl_dtype tsl_graph_label_dtype(int64_t classes)
{
    return classes < 255 ? TSL_U8 : TSL_I32;
}

/* Loss terms checked as tsl_graph_set_loss() takes them: kinds known and of one family,
 * weights finite and above 0 (the error's context is NULL: callers re-raise it). */
/* Check loss terms against graph g (tsl_graph_set_loss's rules; the output may be unset yet). */
tsl_status tsl_loss_terms_check(const struct tsl_graph *g, int32_t count,
                                const tsl_loss_term *terms, const char *fn);
/* 1 for the losses between two values of the network whose gradients flow into both
 * (difference, similarity), else 0. */
int tsl_model_loss_of_two_values(tsl_model_loss_kind kind);
/* The value term t reads: its `on`, else the output (negative while none is set). */
int32_t tsl_loss_term_value(const struct tsl_graph *g, const tsl_loss_term *t);
/* 1 when one of the graph's loss terms reads value v by name (on or against), else 0: the
 * model keeps it from the forward to the loss. */
int tsl_graph_loss_reads(const struct tsl_graph *g, int32_t v);
/* The first term on the batch's labels or targets (against 0), or -1. */
int32_t tsl_loss_batch_term(int32_t count, const tsl_loss_term *terms);

/* A deep copy of `g` (NULL when out of memory). */
struct tsl_graph *tsl_graph_copy(const struct tsl_graph *g);

#endif /* TESSEL_GRAPH_INTERNAL_H */
