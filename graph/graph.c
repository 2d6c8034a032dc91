/* Model graphs: building with shape inference, queries and estimates. Pure C. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "graph_internal.h"
#include "op_table.h"

/* Grow an array of `size`-byte elements to hold `need` of them. */
static int grow(void **array, int32_t *cap, int32_t need, size_t size)
{
    if (need <= *cap)
        return 0;
    int32_t cap2 = *cap ? 2 * *cap : 16;
    while (cap2 < need)
        cap2 *= 2;
    void *p = realloc(*array, (size_t)cap2 * size);
    if (!p)
        return -1;
    *array = p;
    *cap = cap2;
    return 0;
}

tsl_status tsl_graph_create(tsl_graph_t *out)
{
    if (!out)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "tsl_graph_create: graph is NULL");
    *out = calloc(1, sizeof **out);
    if (!*out)
        return tsl_error(NULL, TSL_ERR_OUT_OF_MEMORY, "tsl_graph_create: out of memory");
    (*out)->input = -1;
    (*out)->output = -1;
    return TSL_OK;
}

void tsl_graph_destroy(tsl_graph_t g)
{
    if (!g)
        return;
    free(g->values);
    free(g->ops);
    free(g->params);
    free(g->rd_start);
    free(g->rd_ops);
    free(g);
}

struct tsl_graph *tsl_graph_copy(const struct tsl_graph *g)
{
    struct tsl_graph *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    *c = *g;
    c->rd_start = c->rd_ops = NULL; /* (its own, made on first use) */
    c->rd_nops = 0;
    c->values = malloc(sizeof *c->values * (size_t)(g->nvalues ? g->nvalues : 1));
    c->ops = malloc(sizeof *c->ops * (size_t)(g->nops ? g->nops : 1));
    c->params = malloc(sizeof *c->params * (size_t)(g->nparams ? g->nparams : 1));
    c->cap_values = g->nvalues;
    c->cap_ops = g->nops;
    c->cap_params = g->nparams;
    if (!c->values || !c->ops || !c->params) {
        tsl_graph_destroy(c);
        return NULL;
    }
    memcpy(c->values, g->values, sizeof *c->values * (size_t)g->nvalues);
    memcpy(c->ops, g->ops, sizeof *c->ops * (size_t)g->nops);
    memcpy(c->params, g->params, sizeof *c->params * (size_t)g->nparams);
    return c;
}

const char *tsl_model_loss_name(tsl_model_loss_kind kind)
{
    switch (kind) {
    case TSL_MODEL_LOSS_CROSS_ENTROPY:
        return "cross_entropy";
    case TSL_MODEL_LOSS_DICE:
        return "dice";
    case TSL_MODEL_LOSS_MSE:
        return "mse";
    case TSL_MODEL_LOSS_L1:
        return "l1";
    case TSL_MODEL_LOSS_DIFFERENCE:
        return "difference";
    case TSL_MODEL_LOSS_SIMILARITY:
        return "similarity";
    }
    return NULL;
}

tsl_status tsl_model_loss_parse(const char *name, tsl_model_loss_kind *kind)
{
    for (int k = TSL_MODEL_LOSS_CROSS_ENTROPY; name && kind && k <= TSL_MODEL_LOSS_SIMILARITY; k++)
        if (strcmp(name, tsl_model_loss_name((tsl_model_loss_kind)k)) == 0) {
            *kind = (tsl_model_loss_kind)k;
            return TSL_OK;
        }
    return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                     "tsl_model_loss_parse: unknown loss '%s' (cross_entropy, dice, mse, l1, "
                     "difference or similarity)",
                     name ? name : "(null)");
}

int tsl_model_loss_takes_targets(tsl_model_loss_kind kind)
{
    return kind == TSL_MODEL_LOSS_MSE || kind == TSL_MODEL_LOSS_L1;
}

int tsl_model_loss_of_two_values(tsl_model_loss_kind kind)
{
    return kind == TSL_MODEL_LOSS_DIFFERENCE || kind == TSL_MODEL_LOSS_SIMILARITY;
}

int32_t tsl_loss_term_value(const struct tsl_graph *g, const tsl_loss_term *t)
{
    return t->on ? t->on - 1 : g->output;
}

/* The value a term reads, as text for messages: "the output" or "value V". */
static const char *term_value_text(const tsl_loss_term *t, char *buf, size_t size)
{
    if (!t->on)
        return "the output";
    snprintf(buf, size, "value %d", (int)(t->on - 1));
    return buf;
}

tsl_status tsl_loss_terms_check(const struct tsl_graph *g, int32_t count,
                                const tsl_loss_term *terms, const char *fn)
{
    int32_t batch_term = -1; /* the first term on the batch's labels or targets */
    for (int32_t t = 0; t < count; t++) {
        const tsl_loss_term *e = &terms[t];
        char on_text[32];
        if (!tsl_model_loss_name(e->kind))
            return tsl_error(NULL, TSL_ERR_INVALID_ARG, "%s: term %d: unknown loss kind %d", fn,
                             (int)t, (int)e->kind);
        if (!isfinite(e->weight) || !(e->weight > 0))
            return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                             "%s: term %d: weight %g (want finite and above 0)", fn, (int)t,
                             e->weight);
        if (e->on < 0 || e->on > g->nvalues || e->against < 0 || e->against > g->nvalues)
            return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                             "%s: term %d: on %d, against %d: want 0 (the output, the batch) or 1 "
                             "+ a value of this graph (%d values)",
                             fn, (int)t, (int)e->on, (int)e->against, (int)g->nvalues);
        int32_t on = tsl_loss_term_value(g, e);
        if (e->on && tsl_graph_is_input(g, on))
            return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                             "%s: term %d reads the input, which no parameter makes", fn, (int)t);
        if (e->against) {
            int32_t a = e->against - 1;
            if (tsl_model_loss_of_two_values(e->kind)) {
                const char *name = tsl_model_loss_name(e->kind);
                if (tsl_graph_is_input(g, a))
                    return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                                     "%s: term %d: %s with the input, which no parameter makes", fn,
                                     (int)t, name);
                if (on == a)
                    return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                                     "%s: term %d: %s of value %d with itself", fn, (int)t, name,
                                     (int)a);
                if (e->kind == TSL_MODEL_LOSS_SIMILARITY && on >= 0 &&
                    tsl_shape_numel(&g->values[on].shape) != tsl_shape_numel(&g->values[a].shape))
                    return tsl_error(NULL, TSL_ERR_SHAPE,
                                     "%s: term %d: similarity of %s (%lld features per sample) "
                                     "and value %d (%lld): the distributions compared need one "
                                     "number of features",
                                     fn, (int)t, term_value_text(e, on_text, sizeof on_text),
                                     (long long)tsl_shape_numel(&g->values[on].shape), (int)a,
                                     (long long)tsl_shape_numel(&g->values[a].shape));
                continue; /* (difference: any per-sample shapes) */
            }
            if (!tsl_model_loss_takes_targets(e->kind))
                return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                                 "%s: term %d: %s compares with class labels; a term against "
                                 "another value is mse, l1, difference or similarity",
                                 fn, (int)t, tsl_model_loss_name(e->kind));
            const tsl_shape *so = on >= 0 ? &g->values[on].shape : NULL, *sa = &g->values[a].shape;
            int same = so && so->ndim == sa->ndim;
            for (int d = 0; same && d < sa->ndim; d++)
                same = so->dims[d] == sa->dims[d];
            if (so && (on == a || !same))
                return tsl_error(NULL, TSL_ERR_SHAPE,
                                 "%s: term %d: %s against value %d: two different values of one "
                                 "shape, please",
                                 fn, (int)t, term_value_text(e, on_text, sizeof on_text), (int)a);
            continue;
        }
        if (tsl_model_loss_of_two_values(e->kind))
            return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                             "%s: term %d: %s compares two values of the network: it needs "
                             "against",
                             fn, (int)t, tsl_model_loss_name(e->kind));
        if (e->on && on != g->output)
            return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                             "%s: term %d reads %s against the batch: the batch's labels and "
                             "targets fit the output only; compare another value with a value "
                             "of the network (against)",
                             fn, (int)t, term_value_text(e, on_text, sizeof on_text));
        if (batch_term < 0) {
            batch_term = t;
            continue;
        }
        const tsl_loss_term *first = &terms[batch_term];
        if (tsl_model_loss_takes_targets(e->kind) != tsl_model_loss_takes_targets(first->kind))
            return tsl_error(
                NULL, TSL_ERR_INVALID_ARG,
                "%s: term %d: %s takes %s but term %d, %s, takes %s: a model's loss "
                "terms on the batch all compare the output with class labels or all with float "
                "targets",
                fn, (int)t, tsl_model_loss_name(e->kind),
                tsl_model_loss_takes_targets(e->kind) ? "float targets" : "class labels",
                (int)batch_term, tsl_model_loss_name(first->kind),
                tsl_model_loss_takes_targets(first->kind) ? "float targets" : "class labels");
    }
    if (count > 0 && batch_term < 0)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                         "%s: no term reads the batch's labels or targets (a term with against "
                         "0): the steps take a batch of them",
                         fn);
    return TSL_OK;
}

int32_t tsl_loss_batch_term(int32_t count, const tsl_loss_term *terms)
{
    for (int32_t t = 0; t < count; t++)
        if (!terms[t].against)
            return t;
    return -1;
}

tsl_status tsl_graph_set_loss(tsl_graph_t g, int32_t count, const tsl_loss_term *terms)
{
    const char *fn = "tsl_graph_set_loss";
    if (!g || (count && !terms))
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "%s: NULL argument", fn);
    if (count < 0 || count > TSL_MAX_LOSS_TERMS)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "%s: %d terms (want 0 to %d)", fn, (int)count,
                         TSL_MAX_LOSS_TERMS);
    tsl_status st = tsl_loss_terms_check(g, count, terms, fn);
    if (st)
        return st;
    if (count)
        memcpy(g->loss, terms, sizeof *terms * (size_t)count);
    g->nloss = count;
    return TSL_OK;
}

tsl_status tsl_graph_loss(tsl_graph_t g, int32_t *count, tsl_loss_term *terms)
{
    if (!g || !count || !terms)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "tsl_graph_loss: NULL argument");
    *count = g->nloss;
    memcpy(terms, g->loss, sizeof *terms * (size_t)g->nloss);
    return TSL_OK;
}

static tsl_status check_graph(tsl_graph_t g, const int32_t *value, const char *fn)
{
    if (!g || !value)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "%s: graph or value is NULL", fn);
    return TSL_OK;
}

static tsl_status check_value(tsl_graph_t g, int32_t v, const char *fn)
{
    if (v < 0 || v >= g->nvalues)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "%s: no value %d in the graph", fn, (int)v);
    return TSL_OK;
}

static tsl_status check_name(tsl_graph_t g, const char *name, const char *fn);

/* The common checks of an op reading x; a layer (name not NULL) also needs a valid name. */
static tsl_status check_op(tsl_graph_t g, const int32_t *value, int32_t x, const char *name,
                           const char *fn)
{
    tsl_status st = check_graph(g, value, fn);
    if (st || (st = check_value(g, x, fn)))
        return st;
    return name ? check_name(g, name, fn) : TSL_OK;
}

/* An op of `kind` reading x, named `name` (or unnamed). */
static tsl_graph_op unary_op(tsl_op_kind kind, int32_t x, const char *name)
{
    tsl_graph_op op;
    memset(&op, 0, sizeof op);
    op.kind = kind;
    if (name)
        snprintf(op.name, sizeof op.name, "%s", name);
    op.ninputs = 1;
    op.inputs[0] = x;
    return op;
}

/* Names of layers: non-empty, printable, no '/' (parameter files are named after them), and
 * not used by an earlier op. */
static tsl_status check_name(tsl_graph_t g, const char *name, const char *fn)
{
    if (!name || !*name)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "%s: a layer needs a name", fn);
    size_t len = strlen(name);
    if (len + sizeof ".running_mean" > TSL_GRAPH_NAME_MAX)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "%s: name '%s' is too long", fn, name);
    for (size_t i = 0; i < len; i++)
        if (name[i] == '/' || name[i] <= ' ' || name[i] > '~')
            return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                             "%s: name '%s' may hold only printable characters, no spaces or '/'",
                             fn, name);
    for (int32_t i = 0; i < g->nops; i++)
        if (strcmp(g->ops[i].name, name) == 0)
            return tsl_error(NULL, TSL_ERR_INVALID_ARG, "%s: name '%s' is already used", fn, name);
    return TSL_OK;
}

/* Append an op with its output value, of the shape the op table infers (`given`: its weight's
 * shape, or the input's sample shape; NULL for other kinds); params are added after. Nothing
 * is changed on failure. */
static tsl_status add_op(tsl_graph_t g, const tsl_graph_op *op, const tsl_shape *given,
                         int32_t *value, const char *fn)
{
    tsl_shape y;
    tsl_status st = tsl_op_info_of(op->kind)->infer(g, op, given, &y, fn);
    if (st)
        return st;
    const tsl_shape *shape = &y;
    if (grow((void **)&g->ops, &g->cap_ops, g->nops + 1, sizeof *g->ops) ||
        grow((void **)&g->values, &g->cap_values, g->nvalues + 1, sizeof *g->values) ||
        grow((void **)&g->params, &g->cap_params, g->nparams + TSL_GRAPH_MAX_PARAMS,
             sizeof *g->params))
        return tsl_error(NULL, TSL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    tsl_graph_op *o = &g->ops[g->nops];
    *o = *op;
    o->output = g->nvalues;
    tsl_graph_value *v = &g->values[g->nvalues++];
    memset(v, 0, sizeof *v);
    v->shape = *shape;
    v->producer = g->nops++;
    for (int32_t i = 0; i < o->ninputs; i++)
        g->values[o->inputs[i]].consumers++;
    *value = o->output;
    return TSL_OK;
}

/* Add a parameter `opname.suffix` to the last op. */
static void add_param(tsl_graph_t g, const char *suffix, const tsl_shape *shape, int32_t trainable,
                      int32_t init, double bound)
{
    tsl_graph_op *o = &g->ops[g->nops - 1];
    tsl_graph_param *p = &g->params[g->nparams];
    memset(p, 0, sizeof *p);
    /* NAME.suffix; it fits: check_name() left room for the longest suffix. */
    size_t n = strlen(o->name), k = strlen(suffix);
    if (n + 1 + k < sizeof p->name) {
        memcpy(p->name, o->name, n);
        p->name[n] = '.';
        memcpy(p->name + n + 1, suffix, k + 1);
    }
    p->shape = *shape;
    p->trainable = trainable;
    p->init = init;
    p->init_bound = bound;
    o->params[o->nparams++] = g->nparams++;
}

static tsl_shape shape_of(int32_t ndim, const int64_t *dims)
{
    tsl_shape s;
    memset(&s, 0, sizeof s);
    s.ndim = ndim;
    for (int d = 0; d < ndim; d++)
        s.dims[d] = dims[d];
    return s;
}

tsl_status tsl_graph_add_input(tsl_graph_t g, const char *name, int32_t ndim, const int64_t *dims,
                               int32_t *value)
{
    const char *fn = "tsl_graph_add_input";
    tsl_status st = check_graph(g, value, fn);
    if (st)
        return st;
    int32_t count = tsl_graph_input_count(g);
    if (count >= TSL_GRAPH_MAX_GRAPH_INPUTS)
        return tsl_error(NULL, TSL_ERR_STATE, "%s: a graph has at most %d inputs", fn,
                         TSL_GRAPH_MAX_GRAPH_INPUTS);
    if (ndim < 1 || ndim > TSL_MAX_DIMS - 1 || !dims)
        return tsl_error(NULL, TSL_ERR_SHAPE,
                         "%s: a sample has 1 to %d dimensions (C, spatial...), not %d", fn,
                         TSL_MAX_DIMS - 1, (int)ndim);
    for (int32_t d = 0; d < ndim; d++)
        if (dims[d] < 1)
            return tsl_error(NULL, TSL_ERR_SHAPE, "%s: dimension %d of the sample is %lld", fn,
                             (int)d, (long long)dims[d]);
    char made[32];
    if (!name) { /* "input", then "input1", "input2", ... */
        snprintf(made, sizeof made, count ? "input%d" : "input", (int)count);
        name = made;
    }
    if ((st = check_name(g, name, fn)))
        return st;
    tsl_shape s = shape_of(ndim, dims);
    tsl_graph_op op;
    memset(&op, 0, sizeof op);
    op.kind = TSL_OP_INPUT;
    snprintf(op.name, sizeof op.name, "%s", name);
    if ((st = add_op(g, &op, &s, value, fn)))
        return st;
    if (g->input < 0)
        g->input = *value;
    return TSL_OK;
}

tsl_status tsl_graph_input(tsl_graph_t g, int32_t ndim, const int64_t *dims, int32_t *value)
{
    return tsl_graph_add_input(g, NULL, ndim, dims, value);
}

int32_t tsl_graph_input_count(tsl_graph_t g)
{
    int32_t n = 0;
    for (int32_t o = 0; g && o < g->nops; o++)
        n += g->ops[o].kind == TSL_OP_INPUT;
    return n;
}

int32_t tsl_graph_input_value(tsl_graph_t g, int32_t index)
{
    for (int32_t o = 0, k = 0; g && o < g->nops; o++)
        if (g->ops[o].kind == TSL_OP_INPUT && k++ == index)
            return g->ops[o].output;
    return tsl_error(NULL, TSL_ERR_INVALID_ARG, "tsl_graph_input_value: the graph has no input %d",
                     (int)index);
}

tsl_status tsl_graph_conv(tsl_graph_t g, const char *name, int32_t x, int64_t out_channels,
                          const int64_t *kernel, const tsl_conv_params *p, int32_t transposed,
                          int32_t bias, int32_t *value)
{
    const char *fn = "tsl_graph_conv";
    tsl_status st = check_op(g, value, x, name, fn);
    if (st)
        return st;
    if (!p || !kernel || out_channels < 1)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                         "%s: '%s' needs settings, a kernel and at least one output channel", fn,
                         name);
    tsl_shape xs;
    tsl_batch_shape(1, &g->values[x].shape, &xs);
    if (xs.ndim != p->spatial + 2)
        return tsl_error(NULL, TSL_ERR_SHAPE,
                         "%s: '%s' is a %d-D convolution but its input has %d spatial dimensions",
                         fn, name, (int)p->spatial, (int)xs.ndim - 2);
    if (p->groups < 1 || xs.dims[1] % p->groups || out_channels % p->groups)
        return tsl_error(NULL, TSL_ERR_SHAPE,
                         "%s: '%s': %lld groups must divide the %lld input and %lld output "
                         "channels",
                         fn, name, (long long)p->groups, (long long)xs.dims[1],
                         (long long)out_channels);
    tsl_shape ws;
    memset(&ws, 0, sizeof ws);
    ws.ndim = p->spatial + 2;
    ws.dims[0] = transposed ? xs.dims[1] : out_channels;
    ws.dims[1] = transposed ? out_channels / p->groups : xs.dims[1] / p->groups;
    double fan_in = (double)(transposed ? out_channels / p->groups : xs.dims[1] / p->groups);
    for (int d = 0; d < p->spatial; d++) {
        if (kernel[d] < 1)
            return tsl_error(NULL, TSL_ERR_INVALID_ARG, "%s: '%s': kernel sizes must be >= 1", fn,
                             name);
        ws.dims[2 + d] = kernel[d];
        fan_in *= (double)kernel[d];
    }
    tsl_graph_op op = unary_op(TSL_OP_CONV, x, name);
    op.conv = *p;
    op.transposed = transposed != 0;
    op.bias = bias != 0;
    if ((st = add_op(g, &op, &ws, value, fn)))
        return st;
    /* PyTorch's default initialisation: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for both. */
    double bound = 1.0 / sqrt(fan_in);
    add_param(g, "weight", &ws, 1, TSL_INIT_UNIFORM, bound);
    if (bias) {
        tsl_shape bs = shape_of(1, &out_channels);
        add_param(g, "bias", &bs, 1, TSL_INIT_UNIFORM, bound);
    }
    return TSL_OK;
}

tsl_status tsl_graph_batchnorm(tsl_graph_t g, const char *name, int32_t x, double eps,
                               double momentum, int32_t *value)
{
    const char *fn = "tsl_graph_batchnorm";
    tsl_status st = check_op(g, value, x, name, fn);
    if (st)
        return st;
    if (!(eps > 0) || !(momentum >= 0 && momentum <= 1))
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "%s: '%s' needs eps > 0 and momentum in [0, 1]",
                         fn, name);
    tsl_graph_op op = unary_op(TSL_OP_BATCHNORM, x, name);
    op.eps = eps;
    op.momentum = momentum;
    tsl_shape cs = shape_of(1, &g->values[x].shape.dims[0]);
    if ((st = add_op(g, &op, NULL, value, fn)))
        return st;
    add_param(g, "weight", &cs, 1, TSL_INIT_ONES, 0);
    add_param(g, "bias", &cs, 1, TSL_INIT_ZEROS, 0);
    add_param(g, "running_mean", &cs, 0, TSL_INIT_ZEROS, 0);
    add_param(g, "running_var", &cs, 0, TSL_INIT_ONES, 0);
    return TSL_OK;
}

/* kind: 0 group, 1 layer, 2 instance norm (groups = C). */
static tsl_status group_norm(tsl_graph_t g, const char *name, int32_t x, int64_t groups, double eps,
                             int32_t kind, int32_t *value, const char *fn)
{
    tsl_status st = check_op(g, value, x, name, fn);
    if (st)
        return st;
    int64_t c = g->values[x].shape.dims[0];
    if (kind == 2 && g->values[x].shape.ndim < 2)
        return tsl_error(NULL, TSL_ERR_SHAPE,
                         "%s: '%s' needs spatial dimensions (each channel of each sample is "
                         "normalized over its positions)",
                         fn, name);
    if (kind == 2)
        groups = c;
    if (!(eps > 0) || !isfinite(eps))
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "%s: '%s' needs eps > 0", fn, name);
    if (groups < 1 || c % groups)
        return tsl_error(NULL, TSL_ERR_SHAPE, "%s: '%s': %lld groups do not divide %lld channels",
                         fn, name, (long long)groups, (long long)c);
    tsl_graph_op op = unary_op(TSL_OP_GROUPNORM, x, name);
    op.eps = eps;
    op.norm_groups = groups;
    op.norm_kind = kind;
    tsl_shape cs = shape_of(1, &c);
    if ((st = add_op(g, &op, NULL, value, fn)))
        return st;
    add_param(g, "weight", &cs, 1, TSL_INIT_ONES, 0);
    add_param(g, "bias", &cs, 1, TSL_INIT_ZEROS, 0);
    return TSL_OK;
}

tsl_status tsl_graph_groupnorm(tsl_graph_t g, const char *name, int32_t x, int64_t groups,
                               double eps, int32_t *value)
{
    return group_norm(g, name, x, groups, eps, 0, value, "tsl_graph_groupnorm");
}

tsl_status tsl_graph_layernorm(tsl_graph_t g, const char *name, int32_t x, double eps,
                               int32_t *value)
{
    return group_norm(g, name, x, 1, eps, 1, value, "tsl_graph_layernorm");
}

tsl_status tsl_graph_instancenorm(tsl_graph_t g, const char *name, int32_t x, double eps,
                                  int32_t *value)
{
    return group_norm(g, name, x, 0, eps, 2, value, "tsl_graph_instancenorm");
}

tsl_status tsl_graph_activation(tsl_graph_t g, int32_t x, tsl_activation kind, double slope,
                                int32_t *value)
{
    const char *fn = "tsl_graph_activation";
    tsl_status st = check_op(g, value, x, NULL, fn);
    if (st)
        return st;
    if ((unsigned)kind >= TSL_ACTIVATION_COUNT || !isfinite(slope))
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "%s: unknown activation %d or bad slope", fn,
                         (int)kind);
    tsl_graph_op op = unary_op(TSL_OP_ACTIVATION, x, NULL);
    op.act = kind;
    op.slope = tsl_activation_info_of(kind)->takes_slope ? slope : 0; /* kept only where read */
    return add_op(g, &op, NULL, value, fn);
}

tsl_status tsl_graph_pool(tsl_graph_t g, int32_t x, const tsl_pool_params *p, int32_t *value)
{
    const char *fn = "tsl_graph_pool";
    tsl_status st = check_op(g, value, x, NULL, fn);
    if (st)
        return st;
    if (!p)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "%s: params is NULL", fn);
    tsl_graph_op op = unary_op(TSL_OP_POOL, x, NULL);
    op.pool = *p;
    return add_op(g, &op, NULL, value, fn);
}

/* An upsampling of x by the factors v (by_size 0; 1 to 1024) or to the sizes v (1 to 2^24). */
static tsl_status upsample_op(tsl_graph_t g, int32_t x, const int64_t *v, int by_size,
                              int32_t linear, int32_t *value, const char *fn)
{
    tsl_status st = check_op(g, value, x, NULL, fn);
    if (st)
        return st;
    int spatial = g->values[x].shape.ndim - 1;
    const char *what = by_size ? "size" : "scale";
    if (spatial < 1 || spatial > 3 || !v)
        return tsl_error(NULL, TSL_ERR_SHAPE, "%s: needs 1 to 3 spatial dimensions and a %s", fn,
                         what);
    tsl_graph_op op;
    memset(&op, 0, sizeof op);
    const int64_t most = by_size ? (int64_t)1 << 24 : 1024;
    for (int d = 0; d < spatial; d++) {
        if (v[d] < 1 || v[d] > most)
            return tsl_error(NULL, TSL_ERR_INVALID_ARG, "%s: %s %lld outside [1, %s]", fn, what,
                             (long long)v[d], by_size ? "2^24" : "1024");
        (by_size ? op.size : op.scale)[d] = v[d];
    }
    op.kind = TSL_OP_UPSAMPLE;
    op.ninputs = 1;
    op.inputs[0] = x;
    op.linear = linear != 0;
    return add_op(g, &op, NULL, value, fn);
}

tsl_status tsl_graph_upsample(tsl_graph_t g, int32_t x, const int64_t *scale, int32_t linear,
                              int32_t *value)
{
    return upsample_op(g, x, scale, 0, linear, value, "tsl_graph_upsample");
}

tsl_status tsl_graph_upsample_size(tsl_graph_t g, int32_t x, const int64_t *size, int32_t linear,
                                   int32_t *value)
{
    return upsample_op(g, x, size, 1, linear, value, "tsl_graph_upsample_size");
}

tsl_status tsl_graph_concat(tsl_graph_t g, int32_t count, const int32_t *xs, int32_t *value)
{
    const char *fn = "tsl_graph_concat";
    tsl_status st = check_graph(g, value, fn);
    if (st)
        return st;
    if (count < 1 || count > TSL_GRAPH_MAX_INPUTS || !xs)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "%s: 1 to %d values, not %d", fn,
                         TSL_GRAPH_MAX_INPUTS, (int)count);
    tsl_graph_op op;
    memset(&op, 0, sizeof op);
    op.kind = TSL_OP_CONCAT;
    op.ninputs = count;
    for (int32_t k = 0; k < count; k++) {
        if ((st = check_value(g, xs[k], fn)))
            return st;
        op.inputs[k] = xs[k];
    }
    return add_op(g, &op, NULL, value, fn);
}

/* h xs[0] + xs[1] + ... + xs[count - 1]. */
static tsl_status add_values(tsl_graph_t g, int32_t count, const int32_t *xs, double h,
                             int32_t *value, const char *fn)
{
    tsl_status st = check_graph(g, value, fn);
    if (st)
        return st;
    if (!xs || count < 2 || count > TSL_GRAPH_MAX_INPUTS)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "%s: %d values (want 2 to %d)", fn, (int)count,
                         TSL_GRAPH_MAX_INPUTS);
    for (int32_t k = 0; k < count; k++)
        if ((st = check_value(g, xs[k], fn)))
            return st;
    if (!isfinite(h) || h == 0)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "%s: h %g must be finite and nonzero", fn, h);
    tsl_graph_op op;
    memset(&op, 0, sizeof op);
    op.kind = TSL_OP_ADD;
    op.ninputs = count;
    for (int32_t k = 0; k < count; k++)
        op.inputs[k] = xs[k];
    op.h = h;
    return add_op(g, &op, NULL, value, fn);
}

tsl_status tsl_graph_add_scaled(tsl_graph_t g, int32_t a, int32_t b, double h, int32_t *value)
{
    const int32_t xs[2] = {a, b};
    return add_values(g, 2, xs, h, value, "tsl_graph_add_scaled");
}

tsl_status tsl_graph_add(tsl_graph_t g, int32_t a, int32_t b, int32_t *value)
{
    const int32_t xs[2] = {a, b};
    return add_values(g, 2, xs, 1.0, value, "tsl_graph_add");
}

tsl_status tsl_graph_add_n(tsl_graph_t g, int32_t count, const int32_t *xs, int32_t *value)
{
    return add_values(g, count, xs, 1.0, value, "tsl_graph_add_n");
}

tsl_status tsl_graph_sub(tsl_graph_t g, int32_t a, int32_t b, int32_t *value)
{
    const int32_t xs[2] = {b, a}; /* (-1) b + a: -1 b is exact, so the sum rounds as a - b */
    return add_values(g, 2, xs, -1.0, value, "tsl_graph_sub");
}

tsl_status tsl_graph_slice(tsl_graph_t g, int32_t x, const int64_t *start, const int64_t *stop,
                           int32_t *value)
{
    const char *fn = "tsl_graph_slice";
    tsl_status st = check_op(g, value, x, NULL, fn);
    if (st)
        return st;
    if (!start || !stop)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "%s: NULL start or stop", fn);
    const tsl_shape *s = &g->values[x].shape;
    tsl_graph_op op;
    memset(&op, 0, sizeof op);
    for (int d = 0; d < s->ndim; d++) {
        if (start[d] < 0 || stop[d] <= start[d] || stop[d] > s->dims[d])
            return tsl_error(NULL, TSL_ERR_SHAPE,
                             "%s: axis %d: [%lld, %lld) is not a non-empty range of [0, %lld)", fn,
                             d, (long long)start[d], (long long)stop[d], (long long)s->dims[d]);
        op.start[d] = start[d];
        op.stop[d] = stop[d];
    }
    op.kind = TSL_OP_SLICE;
    op.ninputs = 1;
    op.inputs[0] = x;
    return add_op(g, &op, NULL, value, fn);
}

tsl_status tsl_graph_mul(tsl_graph_t g, int32_t a, int32_t b, int32_t *value)
{
    const char *fn = "tsl_graph_mul";
    tsl_status st = check_graph(g, value, fn);
    if (st || (st = check_value(g, a, fn)) || (st = check_value(g, b, fn)))
        return st;
    tsl_graph_op op;
    memset(&op, 0, sizeof op);
    op.kind = TSL_OP_MUL;
    op.ninputs = 2;
    op.inputs[0] = a;
    op.inputs[1] = b;
    return add_op(g, &op, NULL, value, fn);
}

tsl_status tsl_graph_dropout(tsl_graph_t g, int32_t x, double p, int32_t *value)
{
    const char *fn = "tsl_graph_dropout";
    tsl_status st = check_op(g, value, x, NULL, fn);
    if (st)
        return st;
    if (!(p >= 0 && p < 1))
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "%s: p %g must be in [0, 1)", fn, p);
    tsl_graph_op op = unary_op(TSL_OP_DROPOUT, x, NULL);
    op.p = p;
    return add_op(g, &op, NULL, value, fn);
}

tsl_status tsl_graph_flatten(tsl_graph_t g, int32_t x, int32_t *value)
{
    const char *fn = "tsl_graph_flatten";
    tsl_status st = check_op(g, value, x, NULL, fn);
    if (st)
        return st;
    tsl_graph_op op = unary_op(TSL_OP_FLATTEN, x, NULL);
    return add_op(g, &op, NULL, value, fn);
}

tsl_status tsl_graph_linear(tsl_graph_t g, const char *name, int32_t x, int64_t out_features,
                            int32_t bias, int32_t *value)
{
    const char *fn = "tsl_graph_linear";
    tsl_status st = check_op(g, value, x, name, fn);
    if (st)
        return st;
    const tsl_shape *xs = &g->values[x].shape;
    if (xs->ndim != 1)
        return tsl_error(NULL, TSL_ERR_SHAPE,
                         "%s: '%s' needs a flat input (features), not %d dimensions; flatten it "
                         "first",
                         fn, name, (int)xs->ndim);
    if (out_features < 1)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "%s: '%s' needs at least one output", fn, name);
    tsl_graph_op op = unary_op(TSL_OP_LINEAR, x, name);
    op.bias = bias != 0;
    int64_t wd[2] = {out_features, xs->dims[0]};
    tsl_shape ws = shape_of(2, wd), ys = shape_of(1, &out_features);
    double bound = 1.0 / sqrt((double)xs->dims[0]);
    if ((st = add_op(g, &op, &ws, value, fn)))
        return st;
    add_param(g, "weight", &ws, 1, TSL_INIT_UNIFORM, bound);
    if (bias)
        add_param(g, "bias", &ys, 1, TSL_INIT_UNIFORM, bound);
    return TSL_OK;
}

tsl_status tsl_graph_set_output(tsl_graph_t g, int32_t value)
{
    const char *fn = "tsl_graph_set_output";
    if (!g)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "%s: graph is NULL", fn);
    tsl_status st = check_value(g, value, fn);
    if (st)
        return st;
    g->output = value;
    return TSL_OK;
}

tsl_status tsl_graph_set_stage(tsl_graph_t g, int32_t value, int32_t stage)
{
    const char *fn = "tsl_graph_set_stage";
    if (!g)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "%s: graph is NULL", fn);
    tsl_status st = check_value(g, value, fn);
    if (st)
        return st;
    if (stage < -1 || stage >= (1 << 20))
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "%s: stage %d is not in [-1, 2^20)", fn,
                         (int)stage);
    g->ops[g->values[value].producer].stage = stage + 1;
    return TSL_OK;
}

int32_t tsl_graph_stage(tsl_graph_t g, int32_t value)
{
    if (!g || value < 0 || value >= g->nvalues)
        return -1;
    return g->ops[g->values[value].producer].stage - 1;
}

int32_t tsl_graph_value_count(tsl_graph_t g)
{
    return g->nvalues;
}

int32_t tsl_graph_op_count(tsl_graph_t g)
{
    return g->nops;
}

int32_t tsl_graph_param_count(tsl_graph_t g)
{
    return g->nparams;
}

int32_t tsl_graph_output(tsl_graph_t g)
{
    if (!g || g->output < 0)
        return tsl_error(NULL, TSL_ERR_STATE, "tsl_graph_output: no output set");
    return g->output;
}

tsl_status tsl_graph_value_shape(tsl_graph_t g, int32_t value, tsl_shape *shape)
{
    if (!g || !shape)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "tsl_graph_value_shape: NULL argument");
    tsl_status st = check_value(g, value, "tsl_graph_value_shape");
    if (!st)
        *shape = g->values[value].shape;
    return st;
}

tsl_status tsl_graph_param_info(tsl_graph_t g, int32_t index, const char **name, tsl_shape *shape,
                                int32_t *trainable)
{
    if (!g || index < 0 || index >= g->nparams)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "tsl_graph_param_info: no parameter %d",
                         (int)index);
    const tsl_graph_param *p = &g->params[index];
    if (name)
        *name = p->name;
    if (shape)
        *shape = p->shape;
    if (trainable)
        *trainable = p->trainable;
    return TSL_OK;
}

int32_t tsl_graph_param_source(tsl_graph_t g, int32_t index)
{
    if (!g || index < 0 || index >= g->nparams)
        return -1;
    return g->params[index].shares ? g->params[index].shares - 1 : index;
}

/* Whether ops a and b (one kind) compute the same function of their input and parameters. */
static int same_attributes(const tsl_graph_op *a, const tsl_graph_op *b)
{
    if (a->kind == TSL_OP_GROUPNORM)
        return a->norm_groups == b->norm_groups && a->norm_kind == b->norm_kind && a->eps == b->eps;
    if (a->kind == TSL_OP_LINEAR)
        return a->bias == b->bias;
    const tsl_conv_params *p = &a->conv, *q = &b->conv;
    int same = a->transposed == b->transposed && a->bias == b->bias && p->spatial == q->spatial &&
               p->padding_mode == q->padding_mode && p->groups == q->groups;
    for (int d = 0; d < p->spatial && d < 3; d++)
        same &= p->stride[d] == q->stride[d] && p->padding[d] == q->padding[d] &&
                p->dilation[d] == q->dilation[d] && p->output_padding[d] == q->output_padding[d];
    return same;
}

tsl_status tsl_graph_share_params(tsl_graph_t g, int32_t value, int32_t from)
{
    const char *fn = "tsl_graph_share_params";
    if (!g || value < 0 || value >= g->nvalues || from < 0 || from >= g->nvalues)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "%s: no such values", fn);
    int32_t o = g->values[value].producer, s = g->values[from].producer;
    if (o != g->nops - 1 || o == s)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                         "%s: the value must be the op just added's, and the source another op's",
                         fn);
    tsl_graph_op *op = &g->ops[o];
    const tsl_graph_op *src = &g->ops[s];
    if (op->kind != TSL_OP_CONV && op->kind != TSL_OP_LINEAR && op->kind != TSL_OP_GROUPNORM)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                         "%s: '%s' (%s) has no parameters to share (a convolution, linear layer, "
                         "group, layer or instance norm does; batch norm's running statistics "
                         "cannot be shared)",
                         fn, op->name, tsl_op_kind_name(op->kind));
    if (src->kind != op->kind || !same_attributes(op, src))
        return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                         "%s: '%s' and '%s' differ in kind or attributes: one module's parameters "
                         "serve one function",
                         fn, op->name, src->name);
    if (src->nparams != op->nparams)
        return tsl_error(NULL, TSL_ERR_SHAPE, "%s: '%s' and '%s' have different parameters", fn,
                         op->name, src->name);
    for (int32_t k = 0; k < op->nparams; k++) {
        const tsl_shape *a = &g->params[op->params[k]].shape, *b = &g->params[src->params[k]].shape;
        if (a->ndim != b->ndim || memcmp(a->dims, b->dims, sizeof(int64_t) * (size_t)a->ndim))
            return tsl_error(NULL, TSL_ERR_SHAPE,
                             "%s: '%s' shares '%s' of another shape (its input's channels or "
                             "features differ)",
                             fn, g->params[op->params[k]].name, g->params[src->params[k]].name);
    }
    for (int32_t k = 0; k < op->nparams; k++)
        g->params[op->params[k]].shares = tsl_graph_param_source(g, src->params[k]) + 1;
    return TSL_OK;
}

tsl_status tsl_graph_op_info(tsl_graph_t g, int32_t index, tsl_op_kind *kind, const char **name,
                             int32_t *output)
{
    if (!g || index < 0 || index >= g->nops)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "tsl_graph_op_info: no op %d", (int)index);
    const tsl_graph_op *o = &g->ops[index];
    if (kind)
        *kind = o->kind;
    if (name)
        *name = o->name;
    if (output)
        *output = o->output;
    return TSL_OK;
}

tsl_status tsl_graph_op_flops(tsl_graph_t g, int32_t index, int64_t batch, double *flops)
{
    if (!g || !flops || index < 0 || index >= g->nops || batch < 1)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "tsl_graph_op_flops: bad argument");
    *flops = tsl_op_info_of(g->ops[index].kind)->flops(g, &g->ops[index]) * (double)batch;
    return TSL_OK;
}

tsl_status tsl_graph_estimate(tsl_graph_t g, int64_t batch, double *flops,
                              int64_t *activation_bytes, int64_t *param_bytes)
{
    if (!g || batch < 1)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "tsl_graph_estimate: NULL graph or batch < 1");
    double f = 0;
    int64_t act = 0, par = 0;
    for (int32_t i = 0; i < g->nops; i++)
        f += tsl_op_info_of(g->ops[i].kind)->flops(g, &g->ops[i]);
    for (int32_t v = 0; v < g->nvalues; v++)
        act += tsl_shape_numel(&g->values[v].shape) * (int64_t)sizeof(float);
    for (int32_t p = 0; p < g->nparams; p++)
        par += tsl_shape_numel(&g->params[p].shape) * (int64_t)sizeof(float);
    if (flops)
        *flops = f * (double)batch;
    if (activation_bytes)
        *activation_bytes = act * batch;
    if (param_bytes)
        *param_bytes = par;
    return TSL_OK;
}

/* The readers index (struct tsl_graph): made while holding this lock, so that threads querying
 * one graph at once make it once. */
static pthread_mutex_t readers_lock = PTHREAD_MUTEX_INITIALIZER;

const int32_t *tsl_graph_readers(const struct tsl_graph *cg, int32_t v, int32_t *count)
{
    struct tsl_graph *g = (struct tsl_graph *)cg; /* (the index is a cache) */
    *count = 0;
    if (v < 0 || v >= g->nvalues)
        return NULL;
    pthread_mutex_lock(&readers_lock);
    if (!g->rd_start || g->rd_nops != g->nops || g->rd_nvalues != g->nvalues) {
        free(g->rd_start);
        free(g->rd_ops);
        g->rd_nops = g->rd_nvalues = 0;
        int64_t reads = 0;
        for (int32_t o = 0; o < g->nops; o++)
            reads += g->ops[o].ninputs;
        g->rd_start = calloc((size_t)g->nvalues + 1, sizeof *g->rd_start);
        g->rd_ops = malloc(sizeof *g->rd_ops * ((size_t)reads + 1));
        int32_t *at = malloc(sizeof *at * ((size_t)g->nvalues + 1));
        if (g->rd_start && g->rd_ops && at) {
            for (int32_t o = 0; o < g->nops; o++)
                for (int32_t k = 0; k < g->ops[o].ninputs; k++)
                    g->rd_start[g->ops[o].inputs[k] + 1]++;
            for (int32_t u = 0; u < g->nvalues; u++)
                g->rd_start[u + 1] += g->rd_start[u];
            memcpy(at, g->rd_start, sizeof *at * (size_t)g->nvalues);
            for (int32_t o = 0; o < g->nops; o++) /* (ascending: ops in order) */
                for (int32_t k = 0; k < g->ops[o].ninputs; k++)
                    g->rd_ops[at[g->ops[o].inputs[k]]++] = o;
            g->rd_nops = g->nops;
            g->rd_nvalues = g->nvalues;
        } else {
            free(g->rd_start);
            free(g->rd_ops);
            g->rd_start = g->rd_ops = NULL;
        }
        free(at);
    }
    const int32_t *out = NULL;
    if (g->rd_start) {
        *count = g->rd_start[v + 1] - g->rd_start[v];
        out = g->rd_ops + g->rd_start[v];
    } else {
        *count = -1;
    }
    pthread_mutex_unlock(&readers_lock);
    return out;
}

/* The readers of v one after the other (tsl_graph_readers()' list, or without it a look through
 * the ops): *cursor starts at 0; the next reading op, or -1. */
static int32_t next_reader(const struct tsl_graph *g, int32_t v, const int32_t *readers, int32_t n,
                           int64_t *cursor)
{
    if (n >= 0)
        return *cursor < n ? readers[(*cursor)++] : -1;
    const int64_t end = (int64_t)g->nops * TSL_GRAPH_MAX_INPUTS;
    for (int64_t c = *cursor; c < end; c++) {
        int32_t o = (int32_t)(c / TSL_GRAPH_MAX_INPUTS), k = (int32_t)(c % TSL_GRAPH_MAX_INPUTS);
        if (k < g->ops[o].ninputs && g->ops[o].inputs[k] == v) {
            *cursor = c + 1;
            return o;
        }
    }
    *cursor = end;
    return -1;
}

int tsl_graph_last_reader(const struct tsl_graph *g, int32_t v, int32_t o, const int32_t *fold)
{
    int32_t n, j;
    const int32_t *readers = tsl_graph_readers(g, v, &n);
    for (int64_t at = 0; (j = next_reader(g, v, readers, n, &at)) >= 0;)
        if ((fold && fold[j] >= 0 ? fold[j] : j) > o)
            return 0;
    return 1;
}

int32_t tsl_graph_exec_inputs(const struct tsl_graph *g, int32_t o, const int32_t *fold,
                              int32_t *inputs)
{
    const tsl_graph_op *op = &g->ops[o];
    if (fold && fold[o] >= 0)
        return 0; /* its convolution reads them */
    if (fold && op->kind == TSL_OP_CONV && op->ninputs == 1) {
        int32_t c = g->values[op->inputs[0]].producer;
        if (fold[c] == o) {
            memcpy(inputs, g->ops[c].inputs, sizeof *inputs * (size_t)g->ops[c].ninputs);
            return g->ops[c].ninputs;
        }
    }
    memcpy(inputs, op->inputs, sizeof *inputs * (size_t)op->ninputs);
    return op->ninputs;
}

/* Whether an op of op_stage[o] before o, on a path to o, has weights of its own (a convolution's
 * or linear layer's); seen: nops bytes, zero at the start. */
static int weighted_before(const struct tsl_graph *g, const int32_t *op_stage, int32_t o,
                           uint8_t *seen)
{
    for (int32_t i = 0; i < g->ops[o].ninputs; i++) {
        int32_t p = g->values[g->ops[o].inputs[i]].producer;
        if (p < 0 || seen[p] || op_stage[p] != op_stage[o])
            continue;
        seen[p] = 1;
        if (g->ops[p].kind == TSL_OP_CONV || g->ops[p].kind == TSL_OP_LINEAR ||
            weighted_before(g, op_stage, p, seen))
            return 1;
    }
    return 0;
}

int tsl_graph_defers_weights(const struct tsl_graph *g, const int32_t *op_stage, int32_t o)
{
    const tsl_graph_op *op = &g->ops[o];
    if (!op_stage || op_stage[o] == 0 || (op->kind != TSL_OP_CONV && op->kind != TSL_OP_LINEAR))
        return 0;
    uint8_t *seen = calloc((size_t)g->nops, 1);
    int entry = seen && !weighted_before(g, op_stage, o, seen);
    free(seen);
    return entry;
}

/* The only op reading op o's output (not the graph's output), when o is a `kind` op; else -1. */
int tsl_graph_loss_reads(const struct tsl_graph *g, int32_t v)
{
    for (int32_t t = 0; t < g->nloss; t++)
        if (g->loss[t].on == v + 1 || g->loss[t].against == v + 1)
            return 1;
    return 0;
}

static int32_t sole_reader(const struct tsl_graph *g, int32_t o, tsl_op_kind kind)
{
    if (o < 0 || o >= g->nops || g->ops[o].kind != kind)
        return -1;
    int32_t v = g->ops[o].output, reads;
    if (v == g->output || tsl_graph_loss_reads(g, v))
        return -1;
    const int32_t *readers = tsl_graph_readers(g, v, &reads);
    int64_t at = 0;
    int32_t reader = next_reader(g, v, readers, reads, &at);
    return reader >= 0 && next_reader(g, v, readers, reads, &at) < 0 ? reader : -1;
}

int32_t tsl_graph_folded_concat(const struct tsl_graph *g, int32_t o, const int32_t *op_stage)
{
    int32_t reader = sole_reader(g, o, TSL_OP_CONCAT);
    if (reader < 0)
        return -1;
    int32_t v = g->ops[o].output;
    const tsl_graph_op *c = &g->ops[reader];
    const tsl_shape *in = &g->values[v].shape, *out = &g->values[c->output].shape;
    if (c->kind != TSL_OP_CONV || c->transposed || c->conv.groups != 1 || in->ndim < 2 ||
        in->ndim != out->ndim)
        return -1;
    for (int d = 1; d < in->ndim; d++) /* the parts then share the output's tile grid */
        if (in->dims[d] != out->dims[d])
            return -1;
    for (int32_t k = 0; op_stage && k < g->ops[o].ninputs; k++)
        if (op_stage[g->values[g->ops[o].inputs[k]].producer] != op_stage[reader])
            return -1;
    if (op_stage && op_stage[o] != op_stage[reader])
        return -1;
    return reader;
}

int tsl_graph_value_read_backward(const struct tsl_graph *g, int32_t v, const uint8_t *fused,
                                  const int32_t *fold)
{
    if (v == g->output || tsl_graph_is_input(g, v))
        return 1;
    int32_t p = g->values[v].producer;
    if (tsl_op_info_of(g->ops[p].kind)->keeps_output(&g->ops[p]) && !(fused && fused[p]))
        return 1;
    int32_t n, r;
    const int32_t *readers = tsl_graph_readers(g, v, &n);
    for (int64_t at = 0; (r = next_reader(g, v, readers, n, &at)) >= 0;)
        if (tsl_graph_op_reads_input_backward(&g->ops[fold && fold[r] >= 0 ? fold[r] : r]))
            return 1;
    return 0;
}

int32_t tsl_graph_recomputed(const struct tsl_graph *g, int32_t v, const int32_t *op_stage)
{
    if (v < 0 || v >= g->nvalues || v == g->output || tsl_graph_is_input(g, v) ||
        tsl_graph_loss_reads(g, v))
        return -1;
    int32_t r = g->values[v].producer;
    if (g->ops[r].kind != TSL_OP_ACTIVATION || g->ops[r].ninputs != 1)
        return -1;
    int32_t b = g->values[g->ops[r].inputs[0]].producer;
    if ((g->ops[b].kind != TSL_OP_BATCHNORM && g->ops[b].kind != TSL_OP_GROUPNORM) ||
        tsl_graph_fused_relu(g, b, op_stage) != r)
        return -1;
    int32_t n, j;
    const int32_t *readers = tsl_graph_readers(g, v, &n);
    for (int64_t at = 0; op_stage && (j = next_reader(g, v, readers, n, &at)) >= 0;)
        if (op_stage[j] != op_stage[b])
            return -1;
    return b;
}

int32_t tsl_graph_remade_norms(const struct tsl_graph *g, const int32_t *op_stage, uint8_t *remade)
{
    const int32_t n = g->nops;
    uint8_t *fused = calloc((size_t)n + 1, 1);
    int32_t *fold = malloc(sizeof *fold * ((size_t)n + 1)), count = 0;
    memset(remade, 0, (size_t)n);
    if (!fused || !fold) {
        free(fused);
        free(fold);
        return -1;
    }
    for (int32_t o = 0; o < n; o++) {
        int32_t r = tsl_graph_fused_relu(g, o, op_stage);
        if (r >= 0)
            fused[r] = 1;
        fold[o] = tsl_graph_folded_concat(g, o, op_stage);
    }
    for (int32_t v = 0; v < g->nvalues; v++) {
        int32_t b = tsl_graph_recomputed(g, v, op_stage);
        if (b >= 0 && !remade[b] && tsl_graph_value_read_backward(g, v, fused, fold)) {
            remade[b] = 1;
            count++;
        }
    }
    free(fused);
    free(fold);
    return count;
}

int32_t tsl_graph_fused_relu(const struct tsl_graph *g, int32_t o, const int32_t *op_stage)
{
    if (o < 0 || o >= g->nops ||
        (g->ops[o].kind != TSL_OP_BATCHNORM && g->ops[o].kind != TSL_OP_GROUPNORM))
        return -1;
    int32_t reader = sole_reader(g, o, g->ops[o].kind);
    if (reader < 0 || g->ops[reader].kind != TSL_OP_ACTIVATION ||
        g->ops[reader].act != TSL_ACT_RELU || (op_stage && op_stage[reader] != op_stage[o]))
        return -1;
    return reader;
}
