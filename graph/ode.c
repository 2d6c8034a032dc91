/* ODE segments of a graph (tsl_graph_ode_segments()): maximal runs of residual steps
 * u + h F(u) of one shape, one h and one structure of F, each step's output the next step's
 * input and nothing else's: what layer-parallel training by multigrid in time works on. */
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "graph_internal.h"

/* Whether op a is a residual step: an add h F(u) + u whose F is the ops strictly between u's
 * producer and a, reading only u and each other, their values read by nothing outside the step
 * (no loss term either), and u read by nothing outside it either. Sets *pu to u's producer. */
static int residual_step(const struct tsl_graph *g, int32_t a, const int32_t *lo, const int32_t *hi,
                         int32_t *pu)
{
    const tsl_graph_op *add = &g->ops[a];
    if (add->kind != TSL_OP_ADD || add->ninputs != 2)
        return 0;
    int32_t u = add->inputs[1], f = add->inputs[0];
    int32_t first = g->values[u].producer;
    if (f == u || g->values[f].producer <= first || a - first < 2)
        return 0;
    /* inside the step: ops first+1 .. a; read u, or values of ops first+1 .. a-1 */
    int32_t reads_of_u = 0;
    for (int32_t o = first + 1; o < a; o++) {
        const tsl_graph_op *op = &g->ops[o];
        for (int32_t k = 0; k < op->ninputs; k++) {
            int32_t p = g->values[op->inputs[k]].producer;
            if (op->inputs[k] == u)
                reads_of_u++;
            else if (p <= first || p >= a)
                return 0;
        }
    }
    if (reads_of_u == 0)
        return 0; /* F does not depend on u */
    /* every read of u, and of F's values, comes from inside the step (lo, hi: the first and
     * last op reading each value) */
    if (lo[u] <= first || hi[u] > a || tsl_graph_loss_reads(g, u))
        return 0; /* (a loss term reads values outside every step) */
    for (int32_t o = first + 1; o < a; o++) {
        int32_t v = g->ops[o].output;
        if (v == g->output || tsl_graph_loss_reads(g, v) || hi[v] > a ||
            (hi[v] >= 0 && lo[v] <= first))
            return 0;
    }
    *pu = first;
    return 1;
}

/* Field by field (the structs' padding bytes are not theirs to compare). */
static int same_conv(const tsl_conv_params *a, const tsl_conv_params *b)
{
    if (a->spatial != b->spatial || a->groups != b->groups)
        return 0;
    for (int d = 0; d < 3; d++)
        if (a->stride[d] != b->stride[d] || a->padding[d] != b->padding[d] ||
            a->dilation[d] != b->dilation[d] || a->output_padding[d] != b->output_padding[d])
            return 0;
    return 1;
}

static int same_pool(const tsl_pool_params *a, const tsl_pool_params *b)
{
    if (a->spatial != b->spatial || a->kind != b->kind ||
        a->count_include_pad != b->count_include_pad)
        return 0;
    for (int d = 0; d < 3; d++)
        if (a->kernel[d] != b->kernel[d] || a->stride[d] != b->stride[d] ||
            a->padding[d] != b->padding[d])
            return 0;
    return 1;
}

/* Whether ops x and y (of two steps) have the same kind, attributes, output shape and
 * parameter shapes, and read the same relative inputs (`shift` ops apart). */
static int same_op(const struct tsl_graph *g, int32_t x, int32_t y, int32_t shift)
{
    const tsl_graph_op *a = &g->ops[x], *b = &g->ops[y];
    if (a->kind != b->kind || a->ninputs != b->ninputs || a->nparams != b->nparams ||
        a->transposed != b->transposed || a->bias != b->bias || a->act != b->act ||
        a->slope != b->slope || a->eps != b->eps || a->momentum != b->momentum || a->h != b->h ||
        a->p != b->p || !same_conv(&a->conv, &b->conv) || !same_pool(&a->pool, &b->pool) ||
        memcmp(a->scale, b->scale, sizeof a->scale) != 0 ||
        memcmp(a->size, b->size, sizeof a->size) != 0 || a->linear != b->linear)
        return 0;
    const tsl_shape *sa = &g->values[a->output].shape, *sb = &g->values[b->output].shape;
    if (sa->ndim != sb->ndim || memcmp(sa->dims, sb->dims, sizeof sa->dims[0] * sa->ndim) != 0)
        return 0;
    for (int32_t k = 0; k < a->ninputs; k++)
        if (g->values[b->inputs[k]].producer != g->values[a->inputs[k]].producer + shift)
            return 0;
    for (int32_t k = 0; k < a->nparams; k++) {
        if ((a->params[k] < 0) != (b->params[k] < 0))
            return 0;
        if (a->params[k] < 0)
            continue;
        const tsl_shape *pa = &g->params[a->params[k]].shape, *pb = &g->params[b->params[k]].shape;
        if (pa->ndim != pb->ndim || memcmp(pa->dims, pb->dims, sizeof pa->dims[0] * pa->ndim) != 0)
            return 0;
    }
    return 1;
}

tsl_status tsl_graph_ode_segments(tsl_graph_t g, int32_t max, tsl_ode_segment *segments,
                                  int32_t *count)
{
    if (!g || !count || max < 0 || (max > 0 && !segments))
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "tsl_graph_ode_segments: bad argument");
    *count = 0;
    int32_t *lo = malloc(sizeof *lo * ((size_t)g->nvalues + 1)),
            *hi = malloc(sizeof *hi * ((size_t)g->nvalues + 1));
    if (!lo || !hi) {
        free(lo);
        free(hi);
        return tsl_error(NULL, TSL_ERR_OUT_OF_MEMORY, "tsl_graph_ode_segments: out of memory");
    }
    for (int32_t v = 0; v < g->nvalues; v++)
        lo[v] = hi[v] = -1;
    for (int32_t o = 0; o < g->nops; o++)
        for (int32_t k = 0; k < g->ops[o].ninputs; k++) {
            int32_t v = g->ops[o].inputs[k];
            lo[v] = lo[v] < 0 ? o : lo[v];
            hi[v] = o;
        }
    tsl_ode_segment cur;
    int open = 0;
    for (int32_t a = 0; a < g->nops; a++) {
        int32_t pu;
        if (!residual_step(g, a, lo, hi, &pu))
            continue;
        int32_t len = a - pu; /* ops of the step: F's and the add */
        int extends = open && pu == cur.last_op && len == cur.ops_per_step;
        for (int32_t k = 1; extends && k <= len; k++)
            extends = same_op(g, pu + k - len, pu + k, len);
        if (extends) {
            cur.last_op = a;
            cur.output = g->ops[a].output;
            cur.steps++;
            continue;
        }
        if (open) {
            if (*count < max)
                segments[*count] = cur;
            ++*count;
        }
        cur = (tsl_ode_segment){.input = g->ops[a].inputs[1],
                                .output = g->ops[a].output,
                                .first_op = pu + 1,
                                .last_op = a,
                                .steps = 1,
                                .ops_per_step = len,
                                .h = g->ops[a].h};
        open = 1;
    }
    if (open) {
        if (*count < max)
            segments[*count] = cur;
        ++*count;
    }
    free(lo);
    free(hi);
    return TSL_OK;
}
