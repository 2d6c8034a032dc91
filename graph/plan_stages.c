/* Pipeline stages of a plan (tsl_plan_stages()): per-op costs cut into runs. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "graph_internal.h"
#include "plan_internal.h"
#include "tessel/plan.h"

/* The op of each parameter. */
void tsl_plan_param_ops(const struct tsl_graph *g, int32_t *op_of)
{
    for (int32_t o = 0; o < g->nops; o++)
        for (int32_t k = 0; k < g->ops[o].nparams; k++)
            if (g->ops[o].params[k] >= 0)
                op_of[g->ops[o].params[k]] = o;
}

/* Activation-sized tensors the executor keeps for value v: the activation and, except for
 * the input, its gradient; a spare gradient where several ops read the value (the model adds
 * their contributions there) or where an unfolded concatenation reads the input (its part of
 * the gradient is thrown away there); none for a batch norm's output that its fused ReLU
 * replaces (tsl_graph_fused_relu()), nor for a concatenation its convolution reads in place
 * (tsl_graph_folded_concat()). */
int64_t tsl_plan_value_copies(const struct tsl_graph *g, int32_t v, const int32_t *op_stage)
{
    int32_t p = g->values[v].producer;
    if (tsl_graph_fused_relu(g, p, op_stage) >= 0 || tsl_graph_folded_concat(g, p, op_stage) >= 0)
        return 0;
    int32_t readers = 0, concat = 0;
    for (int32_t o = 0; o < g->nops; o++)
        for (int32_t k = 0; k < g->ops[o].ninputs; k++)
            if (g->ops[o].inputs[k] == v) {
                readers++;
                concat |=
                    g->ops[o].kind == TSL_OP_CONCAT && tsl_graph_folded_concat(g, o, op_stage) < 0;
            }
    return tsl_graph_is_input(g, v) ? 1 + concat : 2 + (readers > 1);
}

/* The stage cost of op o (see tsl_plan_stages()). */
static double op_cost(const tsl_plan *plan, const struct tsl_graph *g, int32_t o, int64_t batch,
                      int32_t states)
{
    const tsl_graph_op *op = &g->ops[o];
    if (plan->balance == TSL_BALANCE_LAYERS)
        return op->kind == TSL_OP_INPUT ? 0 : 1;
    if (plan->balance == TSL_BALANCE_TIME) {
        double f = 0;
        tsl_graph_op_flops((tsl_graph_t)g, o, batch, &f);
        return f;
    }
    /* (fused ReLUs as on one stage: the stages are not known yet) */
    double bytes = 4.0 * (double)batch * (double)tsl_shape_numel(&g->values[op->output].shape) *
                   (double)tsl_plan_value_copies(g, op->output, NULL);
    for (int32_t k = 0; k < op->nparams; k++) {
        const tsl_graph_param *p = &g->params[op->params[k]];
        bytes += 4.0 * (double)tsl_shape_numel(&p->shape) * (p->trainable ? 2 + states : 1);
    }
    return bytes;
}

/* Cut the m costs a[] into `parts` non-empty runs with the smallest largest sum: first[k] is
 * the first item of run k. Dynamic programming over prefixes, O(parts x m^2). */
static tsl_status split_runs(const double *a, int32_t m, int32_t parts, int32_t *first)
{
    size_t w = (size_t)m + 1;
    double *pre = malloc(sizeof *pre * w), *best = malloc(sizeof *best * w * (size_t)(parts + 1));
    int32_t *cut = malloc(sizeof *cut * w * (size_t)(parts + 1));
    if (!pre || !best || !cut) {
        free(pre);
        free(best);
        free(cut);
        return tsl_error(NULL, TSL_ERR_OUT_OF_MEMORY, "tsl_plan_stages: out of memory");
    }
    pre[0] = 0;
    for (int32_t i = 0; i < m; i++)
        pre[i + 1] = pre[i] + a[i];
    /* best[k][i]: the smallest largest sum of the first i items in k runs; cut[k][i]: where
     * its last run starts. */
    for (int32_t i = 1; i <= m; i++) {
        best[w + (size_t)i] = pre[i];
        cut[w + (size_t)i] = 0;
    }
    for (int32_t k = 2; k <= parts; k++)
        for (int32_t i = k; i <= m; i++) {
            double b = -1;
            int32_t at = k - 1;
            for (int32_t j = k - 1; j < i; j++) {
                double prev = best[(size_t)(k - 1) * w + (size_t)j], run = pre[i] - pre[j];
                double v = prev > run ? prev : run;
                if (b < 0 || v < b) {
                    b = v;
                    at = j;
                }
            }
            best[(size_t)k * w + (size_t)i] = b;
            cut[(size_t)k * w + (size_t)i] = at;
        }
    int32_t end = m;
    for (int32_t k = parts; k >= 1; k--) {
        first[k - 1] = cut[(size_t)k * w + (size_t)end];
        end = first[k - 1];
    }
    free(pre);
    free(best);
    free(cut);
    return TSL_OK;
}

/* Each op's stage when run k of the m items starts at item first[k] (ops before the first
 * item stay where they are: the input, on stage 0). */
static void assign_runs(const struct tsl_graph *g, const int32_t *item, int32_t m,
                        const int32_t *first, int32_t stages, int32_t *op_stage)
{
    for (int32_t k = 0; k < stages; k++)
        for (int32_t i = first[k]; i < (k + 1 < stages ? first[k + 1] : m); i++)
            for (int32_t o = item[i]; o < (i + 1 < m ? item[i + 1] : g->nops); o++)
                op_stage[o] = k;
}

/* How good a split is for balance=memory: the largest rank's estimated peak (live tiles,
 * tsl_plan_estimate_peak(), with the copies received from other stages where they live,
 * tsl_plan_estimate_received()), then, for
 * splits alike in that, the sum of every rank's squared. */
typedef struct split_score {
    int64_t most;
    double squares;
} split_score;

static tsl_status score_split(const tsl_plan *plan, tsl_graph_t g, int32_t nranks, int64_t batch,
                              int32_t states, const int32_t *op_stage, tsl_peak_memo *memo,
                              int64_t *peak, split_score *out)
{
    tsl_status st = tsl_plan_peak_memo(plan, g, nranks, 1, batch, states, op_stage, memo, 1, peak);
    out->most = 0;
    out->squares = 0;
    for (int32_t r = 0; r < nranks && !st; r++) {
        int64_t b = peak[r];
        out->most = b > out->most ? b : out->most;
        out->squares += (double)b * (double)b;
    }
    return st;
}

/* balance=memory, past the runs of smallest largest additive cost: those costs count every
 * activation and gradient of a stage as if all lived at once, and none of the copies a stage
 * receives from others (a U-Net's long skips), so the runs are only where a search over the
 * estimate of what lives at once starts. Each cut in turn moves to the place between its
 * neighbours with the best score_split(), until a pass moves none; in a network of more than
 * REFINE_WHOLE items a pass tries only REFINE_WINDOW places either side of each cut (an
 * estimate costs time quadratic in the ops). A split whose estimate fails (a plan that does
 * not fit the input, reported where the plan is used) keeps the additive runs. */
#define REFINE_WHOLE 96
#define REFINE_WINDOW 12
static void refine_runs(const tsl_plan *plan, tsl_graph_t g, int64_t batch, int32_t states,
                        const int32_t *item, int32_t m, int32_t stages, int32_t *first,
                        int32_t *op_stage)
{
    int32_t nranks = (int32_t)tsl_plan_ranks(plan);
    int64_t *peak = calloc((size_t)nranks, sizeof *peak);
    int32_t *start = malloc(sizeof *start * (size_t)stages);
    /* (NULL when out of memory: every estimate then works its tile bytes out again) */
    tsl_peak_memo *memo = tsl_peak_memo_create(g, stages, nranks);
    split_score best, score;
    assign_runs(g, item, m, first, stages, op_stage);
    if (!peak || !start || score_split(plan, g, nranks, batch, states, op_stage, memo, peak, &best))
        goto done;
    memcpy(start, first, sizeof *first * (size_t)stages);
    for (int pass = 0, moved = 1; moved && pass < 64; pass++) {
        moved = 0;
        for (int32_t k = 1; k < stages; k++) {
            int32_t at = first[k], lo = first[k - 1] + 1,
                    hi = k + 1 < stages ? first[k + 1] - 1 : m - 1;
            if (m > REFINE_WHOLE) { /* deep networks: a window around the cut per pass */
                lo = lo > at - REFINE_WINDOW ? lo : at - REFINE_WINDOW;
                hi = hi < at + REFINE_WINDOW ? hi : at + REFINE_WINDOW;
            }
            for (int32_t j = lo; j <= hi; j++) {
                if (j == at)
                    continue;
                int32_t keep = first[k];
                first[k] = j;
                assign_runs(g, item, m, first, stages, op_stage);
                first[k] = keep;
                if (score_split(plan, g, nranks, batch, states, op_stage, memo, peak, &score)) {
                    memcpy(first, start, sizeof *first * (size_t)stages);
                    goto done;
                }
                if (score.most < best.most ||
                    (score.most == best.most && score.squares < best.squares)) {
                    best = score;
                    first[k] = j;
                }
            }
            moved |= first[k] != at;
        }
    }
done:
    assign_runs(g, item, m, first, stages, op_stage);
    tsl_peak_memo_destroy(memo);
    free(peak);
    free(start);
}

/* layers=P: the steps of the ODE segments of two or more steps cut into P runs of (nearly)
 * equal step counts, in op order; every other op with the op before it. */
static tsl_status layer_groups(const tsl_plan *plan, tsl_graph_t g, int32_t *op_stage)
{
    const char *fn = "tsl_plan_stages";
    int32_t nseg = 0, total = 0, p = plan->layers;
    tsl_status st = tsl_graph_ode_segments(g, 0, NULL, &nseg);
    tsl_ode_segment *seg = nseg > 0 ? calloc((size_t)nseg, sizeof *seg) : NULL;
    if (!st && nseg > 0 && !seg)
        st = tsl_error(NULL, TSL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    if (!st && nseg > 0)
        st = tsl_graph_ode_segments(g, nseg, seg, &nseg);
    for (int32_t k = 0; k < nseg && !st; k++)
        total += seg[k].steps >= 2 ? seg[k].steps : 0;
    if (!st && total < p)
        st = tsl_error(NULL, TSL_ERR_INVALID_ARG,
                       "%s: layers=%d needs at least %d residual steps in ODE segments of two or "
                       "more steps (runs of u + h F(u)); the graph has %d",
                       fn, (int)p, (int)p, (int)total);
    int32_t before = 0, at = 0;
    for (int32_t o = 0, k = 0; o < g->nops && !st; o++) {
        while (k < nseg && (seg[k].steps < 2 || o > seg[k].last_op)) {
            if (seg[k].steps >= 2)
                before += seg[k].steps;
            k++;
        }
        if (k < nseg && o >= seg[k].first_op) {
            int64_t step = before + (o - seg[k].first_op) / seg[k].ops_per_step;
            at = (int32_t)(step * p / total);
        }
        op_stage[o] = at;
    }
    free(seg);
    return st;
}

/* Whether a slice op reads value v. */
static int sliced(const struct tsl_graph *g, int32_t v)
{
    for (int32_t o = 0; o < g->nops; o++)
        if (g->ops[o].kind == TSL_OP_SLICE && g->ops[o].inputs[0] == v)
            return 1;
    return 0;
}

/* domains=N: each slice op reading the (first) input starts a domain, and in a graph of
 * several inputs each input no slice reads (K in op order, K >= N); an op takes the domain its
 * inputs come from, none when they come from no domain, domain 0 when from several; domain k
 * runs on group k N / K, ops of no domain on group 0. */
static tsl_status domain_groups(const tsl_plan *plan, tsl_graph_t g, int32_t *op_stage)
{
    const int32_t n = g->nops, none = -1, several = -2;
    int32_t *dom = malloc(sizeof *dom * (size_t)(n > 0 ? n : 1)), k = 0;
    const int several_inputs = tsl_graph_input_count(g) > 1;
    if (!dom)
        return tsl_error(NULL, TSL_ERR_OUT_OF_MEMORY, "tsl_plan_stages: out of memory");
    for (int32_t o = 0; o < n; o++) {
        const tsl_graph_op *op = &g->ops[o];
        dom[o] = none;
        if ((op->kind == TSL_OP_SLICE && op->ninputs == 1 && op->inputs[0] == g->input) ||
            (op->kind == TSL_OP_INPUT && several_inputs && !sliced(g, op->output))) {
            dom[o] = k++;
            continue;
        }
        for (int32_t i = 0; i < op->ninputs; i++) {
            int32_t d = dom[g->values[op->inputs[i]].producer];
            if (d == none || d == dom[o])
                continue;
            dom[o] = dom[o] == none && d != several ? d : several;
        }
    }
    tsl_status st = TSL_OK;
    if (k < plan->domains)
        st = tsl_error(NULL, TSL_ERR_INVALID_ARG,
                       "tsl_plan_stages: domains=%d, but the network has %d domain%s (slices of "
                       "its input, or its inputs: each starts one, as the zoo's dsn does per "
                       "input channel)",
                       (int)plan->domains, (int)k, k == 1 ? "" : "s");
    for (int32_t o = 0; o < n && !st; o++)
        op_stage[o] = dom[o] >= 0 ? (int32_t)((int64_t)dom[o] * plan->domains / k) : 0;
    free(dom);
    return st;
}

static tsl_status stages_of(const tsl_plan *plan, tsl_graph_t g, int64_t batch,
                            int32_t optimizer_states, int32_t *op_stage);

tsl_status tsl_plan_stages(const tsl_plan *plan, tsl_graph_t g, int64_t batch,
                           int32_t optimizer_states, int32_t *op_stage)
{
    tsl_status st = stages_of(plan, g, batch, optimizer_states, op_stage);
    if (st || (plan && plan->domains > 1 && plan->layers <= 1))
        return st;
    /* An input after the first sits on the earliest stage that reads it (its batch goes
     * straight there), not on the stage of the op before it. */
    for (int32_t o = 0; o < g->nops; o++) {
        int32_t v = g->ops[o].output, at = -1;
        if (g->ops[o].kind != TSL_OP_INPUT || v == g->input)
            continue;
        for (int32_t r = o + 1; r < g->nops; r++)
            for (int32_t k = 0; k < g->ops[r].ninputs; k++)
                if (g->ops[r].inputs[k] == v && (at < 0 || op_stage[r] < at))
                    at = op_stage[r];
        op_stage[o] = at >= 0 ? at : op_stage[o];
    }
    return TSL_OK;
}

static tsl_status stages_of(const tsl_plan *plan, tsl_graph_t g, int64_t batch,
                            int32_t optimizer_states, int32_t *op_stage)
{
    const char *fn = "tsl_plan_stages";
    if (!g || !op_stage || batch < 1 || optimizer_states < 0)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "%s: bad argument", fn);
    if (plan && plan->domains > 1 && plan->layers <= 1)
        return domain_groups(plan, g, op_stage);
    int32_t stages = tsl_plan_depth(plan), n = g->nops, by_hand = 0;
    for (int32_t o = 0; o < n; o++)
        by_hand |= g->ops[o].stage > 0;
    if (by_hand) {
        int32_t at = 0;
        for (int32_t o = 0; o < n; o++) {
            if (g->ops[o].stage > 0)
                at = g->ops[o].stage - 1;
            if (at >= stages)
                return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                                 "%s: op %d (%s) is on stage %d, the plan has %d stage%s", fn,
                                 (int)o, tsl_op_kind_name(g->ops[o].kind), (int)at, (int)stages,
                                 stages == 1 ? "" : "s");
            op_stage[o] = at;
        }
        return TSL_OK;
    }
    memset(op_stage, 0, sizeof *op_stage * (size_t)n);
    if (stages == 1)
        return TSL_OK;
    if (plan->layers > 1)
        return layer_groups(plan, g, op_stage);
    /* The ops after the input, in order, as items to cut into runs: an op, or a batch norm with
     * the ReLU right after it that the executor fuses into it (kept on one stage, so the
     * fusion holds); the input op joins the first item. */
    int32_t m = 0;
    double *a = malloc(sizeof *a * (size_t)(n + 1));
    int32_t *item = malloc(sizeof *item * (size_t)(n + 1)),
            *first = malloc(sizeof *first * (size_t)stages);
    tsl_status st = a && item && first ? TSL_OK
                                       : tsl_error(NULL, TSL_ERR_OUT_OF_MEMORY,
                                                   "%s: out of "
                                                   "memory",
                                                   fn);
    double input_cost = 0;
    for (int32_t o = 0; o < n && !st; o++) {
        double c = op_cost(plan, g, o, batch, optimizer_states);
        if (g->ops[o].kind == TSL_OP_INPUT) {
            input_cost += c;
            continue;
        }
        if (m > 0 && item[m - 1] == o - 1 && tsl_graph_fused_relu(g, o - 1, NULL) == o) {
            a[m - 1] += c;
            continue;
        }
        a[m] = c;
        item[m++] = o;
    }
    if (!st && m < stages)
        st = tsl_error(NULL, TSL_ERR_INVALID_ARG,
                       "%s: %d stages need at least %d ops after the input (a batch norm and its "
                       "ReLU count as one), the network has %d",
                       fn, (int)stages, (int)stages, (int)m);
    if (!st) {
        a[0] += input_cost;
        st = split_runs(a, m, stages, first);
    }
    if (!st && plan->balance == TSL_BALANCE_MEMORY)
        refine_runs(plan, g, batch, optimizer_states, item, m, stages, first, op_stage);
    else if (!st)
        assign_runs(g, item, m, first, stages, op_stage);
    free(a);
    free(item);
    free(first);
    return st;
}
