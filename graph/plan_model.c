/* The performance model and the plan search (include/tessel/plan.h: tsl_plan_predict(),
 * tsl_plan_candidates(), tsl_plan_search()). Pure C: the measured costs come in as numbers. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "graph_internal.h"
#include "plan_internal.h"
#include "tessel/plan.h"

const char *tsl_plan_term_name(int32_t term)
{
    static const char *const names[TSL_TERM_COUNT] = {"compute", "tasks",  "params", "batchnorm",
                                                      "halos",   "stages", "bubble", "cores"};
    return term >= 0 && term < TSL_TERM_COUNT ? names[term] : "?";
}

/* Per rank: the share of op o's output volume it owns (shares) and its tiles of it (tiles);
 * elements: scratch. All nranks entries, zeroed here. *cut: whether the output is cut along a
 * spatial dimension (its op then runs on windows). */
static tsl_status op_shares(const tsl_plan *plan, const struct tsl_graph *g, const tsl_shape *input,
                            int32_t nranks, int32_t stage, int32_t workers, int64_t batch,
                            int32_t o, int64_t *elements, double *shares, int64_t *tiles, int *cut,
                            int *chan, int *last)
{
    const tsl_shape *sample = &g->values[g->ops[o].output].shape;
    tsl_tile_grid grid;
    tsl_owner_map owners;
    tsl_status st = tsl_plan_tensor_tiling(plan, input, nranks, stage, workers, batch, sample, 1,
                                           &grid, &owners);
    *cut = 0;
    for (int d = 2; !st && d <= sample->ndim; d++)
        *cut |= grid.splits[d] > 1;
    *chan = !st && sample->ndim >= 1 && grid.splits[1] > 1;
    *last = !st && sample->ndim >= 3 && grid.splits[sample->ndim] > 1;
    memset(elements, 0, sizeof *elements * (size_t)nranks);
    memset(tiles, 0, sizeof *tiles * (size_t)nranks);
    if (!st)
        st = tsl_plan_tensor_counts(plan, input, nranks, stage, workers, batch, sample, 1, 1,
                                    elements, tiles);
    double total = (double)batch * (double)tsl_shape_numel(sample);
    for (int32_t r = 0; r < nranks && !st; r++)
        shares[r] = (double)elements[r] / total;
    return st;
}

/* Exchanges (latencies) per step of each traffic term on a rank that sends bytes of it. */
static void exchanges(const tsl_plan *plan, const struct tsl_graph *g, int32_t group,
                      double *per_term)
{
    int32_t nbn = 0, nconv = 0, nparams = 0;
    for (int32_t o = 0; o < g->nops; o++) {
        nbn += g->ops[o].kind == TSL_OP_BATCHNORM || g->ops[o].kind == TSL_OP_GROUPNORM;
        nconv += g->ops[o].kind == TSL_OP_CONV || g->ops[o].kind == TSL_OP_POOL;
        nparams += g->ops[o].nparams > 0;
    }
    int32_t cut = 0;
    for (int d = 0; d < 3; d++)
        cut += plan->space[d] > 1;
    per_term[TSL_TRAFFIC_PARAMS] = 2.0 * nparams;
    /* forward and backward sums, a tree over the group's ranks */
    per_term[TSL_TRAFFIC_BATCHNORM] = 2.0 * nbn * ceil(log2(group > 1 ? group : 2));
    per_term[TSL_TRAFFIC_HALOS] = 2.0 * nconv * 2 * cut;
    per_term[TSL_TRAFFIC_STAGES] = 2.0 * 2 * plan->micro;
}

/* Ranks sharing cores (tsl_plan_costs::node_ranks): local rank l of a node of node_ranks on core
 * l mod node_cores. A core runs its ranks' tasks one at a time, so the step takes at least the
 * busiest core's sum of its ranks' work; and where its ranks are busy at once (every rank of a
 * plan without stages is; a pipeline's stages, one after the other, are not) their tasks run
 * slower than that sharing explains (shared_slowdown over the ranks of a core, where above 1)
 * and wait for each other (wait_seconds). The share of the time a core's ranks are busy at
 * once: 1 where the step (out->seconds, without stages the longest rank's work) is the core's
 * work over its ranks, 0 where it is the core's work whole. Raises out->seconds by the turns,
 * into the "cores" term; returns that share (for the waits). scratch: room for the ncores
 * cores' sums. */
static double core_turns(const tsl_plan_costs *costs, int32_t nranks, int32_t stages,
                         const double *compute, const double *tasks, double alone, double *scratch,
                         size_t ncores, tsl_plan_prediction *out)
{
    const int32_t per_node = costs->node_ranks < nranks ? costs->node_ranks : nranks,
                  cores = costs->node_cores;
    double busiest = 0, longest = 0;
    memset(scratch, 0, sizeof *scratch * ncores);
    for (int32_t r = 0; r < nranks; r++) {
        double work = compute[r] + tasks[r];
        int32_t core = r / costs->node_ranks * cores + r % costs->node_ranks % cores;
        scratch[core] += work;
        busiest = scratch[core] > busiest ? scratch[core] : busiest;
        longest = work > longest ? work : longest;
    }
    /* the most ranks a core has, and the step with them all busy at once */
    const double most = (double)((per_node + cores - 1) / cores);
    double step = stages > 1 ? out->seconds : longest;
    if (most < 2 || !(busiest > 0))
        return 1;
    step = step < busiest / most ? busiest / most : step > busiest ? busiest : step;
    double together = (busiest - step) / (busiest - busiest / most),
           beyond = alone > most ? alone / most : 1;
    double t = (busiest > out->seconds ? busiest : out->seconds) * (1 + (beyond - 1) * together);
    out->terms[TSL_TERM_CORES] = t > out->seconds ? t - out->seconds : 0;
    out->seconds = t > out->seconds ? t : out->seconds;
    return together;
}

/* The share of an op's measured time (forward and backward together) its forward takes: a
 * layer with weights computes its output, then its input's and its weights' gradients in the
 * backward (about a third forward); the others one pass each way. */
static double forward_share(const tsl_graph_op *op)
{
    return op->nparams > 0 ? 1.0 / 3.0 : 0.5;
}

/* The ops of other stages each op depends on, in CSR form (at[o] .. at[o + 1] in ops): in the
 * forward (pass 0) the producers of its inputs, in the backward (pass 1) the ops reading its
 * output. at: nops + 1 entries; ops: nops x TSL_GRAPH_MAX_INPUTS. */
static void cross_stage_deps(const struct tsl_graph *g, const int32_t *op_stage, int pass,
                             int32_t *at, int32_t *ops)
{
    int32_t count = 0;
    for (int32_t o = 0; o < g->nops; o++) {
        at[o] = count;
        for (int32_t j = 0; j < g->nops; j++) {
            int dep = 0;
            if (op_stage[j] == op_stage[o] || g->ops[j].kind == TSL_OP_INPUT)
                continue;
            if (!pass) /* j produces an input of o */
                for (int32_t i = 0; i < g->ops[o].ninputs && !dep; i++)
                    dep = g->values[g->ops[o].inputs[i]].producer == j;
            else /* j reads o's output */
                for (int32_t i = 0; i < g->ops[j].ninputs && !dep; i++)
                    dep = g->ops[j].inputs[i] == g->ops[o].output;
            if (dep && count < g->nops * TSL_GRAPH_MAX_INPUTS)
                ops[count++] = j;
        }
    }
    at[g->nops] = count;
}

/* When op o's micro-batch k can start, from the ops of other stages it depends on (deps, as
 * cross_stage_deps() gives them for the pass) and in the backward the loss, `loss`, where a loss
 * term reads o's output or it is the output. A batch norm waits for every micro-batch (its
 * statistics are exact over the batch). end: [nops x m] the end times of the stages done so
 * far. */
static double ready_at(const struct tsl_graph *g, const int32_t *at, const int32_t *deps,
                       const double *end, int32_t m, int pass, int32_t o, int32_t k, double loss)
{
    const int all = g->ops[o].kind == TSL_OP_BATCHNORM;
    double t = 0;
    for (int32_t d = at[o]; d < at[o + 1]; d++)
        for (int32_t q = all ? 0 : k; q < (all ? m : k + 1); q++) {
            double e = end[(size_t)deps[d] * m + q];
            t = e > t ? e : t;
        }
    if (pass && (g->ops[o].output == g->output || tsl_graph_loss_reads(g, g->ops[o].output)))
        t = loss > t ? loss : t;
    return t;
}

/* A pipeline's step: S stages of M micro-batches, each stage's ops in order with their times
 * (opw: an op's time on its stage's slowest rank, scaled so a stage's ops add up to its time
 * stage_t, which holds its exchanges too). A stage takes its micro-batches through its forward
 * then its backward one at a time (its tasks in priority order): micro-batch k of an op waits for
 * micro-batch k of the ops of other stages it depends on (ready_at(): in the forward its inputs'
 * producers, in the backward its output's readers and the loss, which waits for the whole
 * forward), so stages on parallel branches of the graph run at once. Batch norm's statistics are
 * exact over the whole batch, so a batch norm waits for every micro-batch of its input (forward)
 * and of its output gradient (backward): each starts a new segment there, which begins only when
 * the segment before it ends for every micro-batch. Without batch norm a chain of stages gives
 * GPipe's (M + S - 1) / M of the slowest stage for equal stages. later: per op, the share of
 * its backward its stage runs after the rest of its backward. scratch: nops M + S;
 * iscratch: nops (1 + TSL_GRAPH_MAX_INPUTS) + 1. */
static double pipeline_seconds(const struct tsl_graph *g, const int32_t *op_stage,
                               const double *opw, const double *later, const double *stage_t,
                               int32_t stages, int32_t micro, double *scratch, int32_t *iscratch)
{
    const int32_t n = g->nops, m = micro > 0 ? micro : 1;
    double *end = scratch;                 /* [n x m]: this pass's end of op o, batch k */
    double *free_at = end + (size_t)n * m; /* [stages]: when each stage's worker is free */
    double loss = 0;
    for (int32_t s = 0; s < stages; s++)
        free_at[s] = 0;
    int32_t *at = iscratch, *deps = at + n + 1;
    for (int pass = 0; pass < 2; pass++) { /* forward, then backward */
        cross_stage_deps(g, op_stage, pass, at, deps);
        for (size_t i = 0; i < (size_t)n * m; i++)
            end[i] = 0;
        for (int32_t i = 0; i < stages; i++) {
            int32_t s = pass ? stages - 1 - i : i;
            double total = 0;
            for (int32_t o = 0; o < n; o++)
                if (op_stage[o] == s && g->ops[o].kind != TSL_OP_INPUT)
                    total += opw[o];
            double scale = total > 0 ? stage_t[s] / total : 0;
            if (total <= 0) { /* a stage without ops: its time */
                free_at[s] += stage_t[s] / 2.0;
                continue;
            }
            /* the segments in the pass's op order, each closed at a batch norm; a segment takes
             * micro-batch 0 through its ops, then 1, ... A later stage's backward defers its
             * first layer's weights' gradients: they fill its worker's waits, the rest after its
             * last op. */
            const int defer = pass && s > 0;
            double pending = 0;
            int32_t first = 0; /* q of the segment's first op */
            int any = 0;       /* whether [first, q) holds an op of the stage */
            for (int32_t q = 0; q <= n; q++) {
                int32_t o = q < n ? (pass ? n - 1 - q : q) : -1;
                int in_stage = o >= 0 && op_stage[o] == s && g->ops[o].kind != TSL_OP_INPUT;
                int close = any && (o < 0 || (in_stage && g->ops[o].kind == TSL_OP_BATCHNORM));
                any |= in_stage;
                if (!close)
                    continue;
                double t = free_at[s]; /* close the segment [first, q) */
                for (int32_t k = 0; k < m; k++)
                    for (int32_t r = first; r < q; r++) {
                        int32_t p = pass ? n - 1 - r : r;
                        if (op_stage[p] != s || g->ops[p].kind == TSL_OP_INPUT)
                            continue;
                        double ready = ready_at(g, at, deps, end, m, pass, p, k, loss);
                        double share = forward_share(&g->ops[p]);
                        double w = opw[p] * scale * (pass ? 1 - share : share) / m;
                        if (ready > t) { /* the wait, filled with deferred work */
                            double fill = ready - t < pending ? ready - t : pending;
                            pending -= fill;
                            t = ready;
                        }
                        if (defer) {
                            pending += w * later[p];
                            w -= w * later[p];
                        }
                        t += w;
                        end[(size_t)p * m + k] = t;
                    }
                free_at[s] = t;
                first = q;
                any = in_stage;
            }
            free_at[s] += pending;
        }
        for (int32_t s = 0; s < stages && !pass; s++) /* the loss waits for the whole forward */
            loss = free_at[s] > loss ? free_at[s] : loss;
    }
    double finish = 0;
    for (int32_t s = 0; s < stages; s++)
        finish = free_at[s] > finish ? free_at[s] : finish;
    return finish;
}

tsl_status tsl_plan_predict(const tsl_plan *plan, tsl_graph_t g, int32_t nranks, int32_t workers,
                            int64_t batch, int32_t optimizer_states, const tsl_plan_costs *costs,
                            tsl_plan_prediction *out)
{
    const char *fn = "tsl_plan_predict";
    if (!plan || !g || !costs || !out || nranks < 1 || workers < 1 || batch < 1 ||
        !costs->op_seconds)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "%s: bad argument", fn);
    if (costs->nops != g->nops)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "%s: costs of %d ops for a graph of %d", fn,
                         (int)costs->nops, (int)g->nops);
    if (nranks > 1 && !(costs->bandwidth > 0))
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "%s: %d ranks need a bandwidth", fn,
                         (int)nranks);
    if (plan->layers > 1)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                         "%s: layers= (MGRIT) is not described by the performance model", fn);
    if (g->input < 0 || g->output < 0)
        return tsl_error(NULL, TSL_ERR_STATE, "%s: the graph needs an input and an output", fn);
    tsl_shape input = g->values[g->input].shape;
    tsl_status st = tsl_plan_check(plan, &input, nranks);
    if (st)
        return st;
    int32_t group, stages = tsl_plan_stage_count(plan, nranks, &group);
    /* Ranks outnumbering a node's cores take turns on them: the ops' tasks below at the speed
     * of one busy rank per core (the costs measured with all busy), the cores' turns after
     * the pipeline (core_turns()). */
    const int sharing =
        nranks > 1 && costs->node_cores > 0 && costs->node_ranks > costs->node_cores;
    const double alone = sharing && costs->shared_slowdown > 1 ? costs->shared_slowdown : 1;
    const size_t ncores = sharing ? (size_t)((nranks + costs->node_ranks - 1) / costs->node_ranks) *
                                        (size_t)costs->node_cores
                                  : 0;
    int32_t *op_stage = malloc(sizeof *op_stage * ((size_t)g->nops + 1));
    double *compute = calloc((size_t)nranks, sizeof *compute),
           *tasks = calloc((size_t)nranks, sizeof *tasks),
           *shares = calloc((size_t)nranks, sizeof *shares),
           *opw = calloc((size_t)g->nops + 1, sizeof *opw),
           *later = calloc((size_t)g->nops + 1, sizeof *later),
           *stage_t = calloc((size_t)stages + 1, sizeof *stage_t),
           *scratch = calloc((size_t)g->nops * (size_t)(plan->micro > 0 ? plan->micro : 1) +
                                 (size_t)stages + ncores + 1,
                             sizeof *scratch);
    int32_t *iscratch =
        malloc(sizeof *iscratch * ((size_t)g->nops * (1 + TSL_GRAPH_MAX_INPUTS) + 1));
    int64_t *tiles = calloc((size_t)nranks, sizeof *tiles),
            *elements = calloc((size_t)nranks, sizeof *elements),
            *sent = calloc((size_t)nranks * TSL_TRAFFIC_TERMS, sizeof *sent),
            *peak = calloc((size_t)nranks, sizeof *peak);
    if (!op_stage || !compute || !tasks || !shares || !opw || !later || !stage_t || !scratch ||
        !iscratch || !tiles || !elements || !sent || !peak)
        st = tsl_error(NULL, TSL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    if (!st)
        st = tsl_plan_stages(plan, g, batch, optimizer_states, op_stage);
    /* under recompute=1, the norms whose ReLU output the backward makes again */
    uint8_t *remade = !st && plan->recompute ? calloc((size_t)g->nops + 1, 1) : NULL;
    if (!st && plan->recompute && (!remade || tsl_graph_remade_norms(g, op_stage, remade) < 0))
        st = tsl_error(NULL, TSL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    for (int32_t o = 0; o < g->nops && !st; o++) {
        if (g->ops[o].kind == TSL_OP_INPUT)
            continue;
        /* a later stage's first layer with weights makes its weights' gradients, a second pass
         * over its output gradient about as long as its input gradient's, after the input
         * gradient the stage before waits for (the executor's TSL_DEFERRED_PRIORITY) */
        later[o] = stages > 1 && tsl_graph_defers_weights(g, op_stage, o) ? 0.5 : 0;
        int cut = 0, chan = 0, last = 0;
        if ((st = op_shares(plan, g, &input, nranks, op_stage[o], workers, batch, o, elements,
                            shares, tiles, &cut, &chan, &last)))
            break;
        /* an op on spatial tiles runs on windows, one on channel tiles passes over them: its
         * cost measured so where there is one (the larger for both). On channel tiles alone
         * that cost even where it is lower: the wide network's 256-channel layers ran 25-28 %
         * less task time per sample on filter groups than on samples, and taking the larger
         * had its filters=2 and channels=2 predicted with data=2, measured 13-25 % faster */
        double per_sample = costs->op_seconds[o];
        if (cut && costs->op_seconds_windowed)
            per_sample = costs->op_seconds_windowed[o];
        if (last && costs->op_seconds_windowed_last &&
            costs->op_seconds_windowed_last[o] > per_sample)
            per_sample = costs->op_seconds_windowed_last[o];
        const double *on_channels = plan->channels > 1 && costs->op_seconds_input_channels
                                        ? costs->op_seconds_input_channels
                                        : costs->op_seconds_channels;
        if (chan && on_channels && (!cut || on_channels[o] > per_sample))
            per_sample = on_channels[o];
        double per_tile = g->ops[o].nparams > 0 ? 3 : 2;
        if (remade && remade[o]) { /* the remaking pass, on the op's tiles (scaled as they are) */
            double base = costs->op_seconds[o];
            double again =
                costs->op_seconds_recompute ? costs->op_seconds_recompute[o] : 0.25 * base;
            per_sample += base > 0 ? again * per_sample / base : again;
            per_tile += 1;
        }
        for (int32_t r = 0; r < nranks; r++) {
            if (!tiles[r])
                continue;
            double par = (double)(tiles[r] < workers ? tiles[r] : workers);
            double c = per_sample * (double)batch * shares[r] / par / alone,
                   k = per_tile * (double)tiles[r] * costs->task_seconds / par;
            compute[r] += c;
            tasks[r] += k;
            opw[o] = c + k > opw[o] ? c + k : opw[o];
        }
    }
    if (!st)
        st = tsl_plan_traffic_for_stages(plan, g, nranks, workers, batch, optimizer_states,
                                         op_stage, sent);
    if (!st) /* (with the copies received from other stages) */
        st = tsl_plan_peak_memo(plan, g, nranks, workers, batch, optimizer_states, op_stage, NULL,
                                1, peak);
    if (!st) {
        memset(out, 0, sizeof *out);
        out->plan = *plan;
        double per_term[TSL_TRAFFIC_TERMS] = {0}, slowest = -1, longest = 0;
        exchanges(plan, g, group, per_term);
        for (int32_t s = 0; s < stages; s++) {
            double stage_time = 0; /* its slowest rank's */
            for (int32_t r = s * group; r < (s + 1) * group && r < nranks; r++) {
                double comm[TSL_TRAFFIC_TERMS] = {0};
                for (int t = 0; t < TSL_TRAFFIC_TOTAL && nranks > 1; t++) {
                    double bytes = (double)sent[(int64_t)t * nranks + r];
                    comm[t] =
                        bytes > 0 ? bytes / costs->bandwidth + per_term[t] * costs->latency : 0;
                }
                /* Spatial halos overlap the interior work that does not need them; under
                 * channel groups the "halos" are mostly the input's other channel tiles, which
                 * every output tile's pass needs before it starts: layer after layer on the
                 * critical path, as batch norm's sums are. */
                const int waited = tsl_plan_channel_groups(plan) > 1;
                double overlapped = comm[TSL_TRAFFIC_PARAMS] +
                                    (waited ? 0 : comm[TSL_TRAFFIC_HALOS]) +
                                    comm[TSL_TRAFFIC_STAGES] + comm[TSL_TRAFFIC_LOSSES];
                double work = compute[r] + tasks[r];
                double t = (work > overlapped ? work : overlapped) + comm[TSL_TRAFFIC_BATCHNORM] +
                           (waited ? comm[TSL_TRAFFIC_HALOS] : 0);
                stage_time = t > stage_time ? t : stage_time;
                if (t > slowest) {
                    slowest = t;
                    out->terms[TSL_TERM_COMPUTE] = compute[r];
                    out->terms[TSL_TERM_TASKS] = tasks[r];
                    out->terms[TSL_TERM_PARAMS] =
                        comm[TSL_TRAFFIC_PARAMS] + comm[TSL_TRAFFIC_LOSSES];
                    out->terms[TSL_TERM_BATCHNORM] = comm[TSL_TRAFFIC_BATCHNORM];
                    out->terms[TSL_TERM_HALOS] = comm[TSL_TRAFFIC_HALOS];
                    out->terms[TSL_TERM_STAGES] = comm[TSL_TRAFFIC_STAGES];
                }
                out->peak_bytes = peak[r] > out->peak_bytes ? peak[r] : out->peak_bytes;
                int64_t total = sent[(int64_t)TSL_TRAFFIC_TOTAL * nranks + r];
                out->sent_bytes = total > out->sent_bytes ? total : out->sent_bytes;
            }
            stage_t[s] = stage_time;
            longest = stage_time > longest ? stage_time : longest;
        }
        /* M micro-batches through S stages, batch norms waiting for all of them */
        out->seconds = stages > 1 || plan->micro > 1
                           ? pipeline_seconds(g, op_stage, opw, later, stage_t, stages, plan->micro,
                                              scratch, iscratch)
                           : stage_t[0];
        out->terms[TSL_TERM_BUBBLE] = out->seconds > longest ? out->seconds - longest : 0;
        /* the step's waits that do not grow with its tasks, once */
        /* (a spatial plan's: what the windows' run waited, halos beyond the halo term) */
        int spatial = 0;
        for (int d = 0; d < 3; d++)
            spatial |= plan->space[d] > 1;
        double wait = spatial && costs->wait_seconds_windowed > 0 ? costs->wait_seconds_windowed
                                                                  : costs->wait_seconds;
        wait = wait > 0 ? wait : 0;
        if (sharing) { /* the waits of ranks busy at once, and of ranks in turn */
            double together =
                core_turns(costs, nranks, stages, compute, tasks, alone, scratch, ncores, out);
            wait = together * wait +
                   (1 - together) * (costs->wait_seconds_turns > 0 ? costs->wait_seconds_turns : 0);
        }
        out->seconds += wait;
        out->terms[TSL_TERM_TASKS] += wait;
        out->binding = 0;
        for (int32_t t = 1; t < TSL_TERM_COUNT; t++)
            if (out->terms[t] > out->terms[out->binding])
                out->binding = t;
    }
    free(op_stage);
    free(remade);
    free(compute);
    free(tasks);
    free(shares);
    free(opw);
    free(later);
    free(stage_t);
    free(scratch);
    free(iscratch);
    free(tiles);
    free(elements);
    free(sent);
    free(peak);
    return st;
}

/* Append a plan to the list (counting it past cap), and with `twins` the same with
 * recompute=1 after it. */
static void emit(const tsl_plan *p, int twins, tsl_plan *plans, int32_t cap, int32_t *count)
{
    for (int k = 0; k <= (twins != 0); k++) {
        if (*count < cap && plans) {
            plans[*count] = *p;
            plans[*count].recompute = k;
        }
        (*count)++;
    }
}

/* Every ordered split of `rest` ranks over spatial dimensions d.. (each part at most that
 * dimension's size), then the stages' micro-batches and the tiles, for each. */
static void spatial_splits(tsl_plan *p, const tsl_shape *input, int32_t d, int32_t rest,
                           int32_t workers, int64_t batch, int twins, tsl_plan *plans, int32_t cap,
                           int32_t *count)
{
    int32_t nsp = input->ndim - 1;
    if (d < nsp && d < 3) {
        for (int32_t a = 1; a <= rest; a++) {
            if (rest % a || a > input->dims[1 + d])
                continue;
            p->space[d] = a;
            spatial_splits(p, input, d + 1, rest / a, workers, batch, twins, plans, cap, count);
        }
        p->space[d] = 1;
        return;
    }
    if (rest != 1)
        return;
    p->space_ndim = 0;
    for (int32_t k = 0; k < 3; k++)
        if (p->space[k] > 1)
            p->space_ndim = k + 1;
    int32_t split = p->space[0] * p->space[1] * p->space[2];
    int64_t per_rank = batch / p->data;
    static const int32_t micros[] = {1, 2, 4, 8};
    for (int32_t mi = 0; mi < 4; mi++) {
        p->micro = micros[mi];
        if (p->micro > 1 && (p->stages == 1 || p->micro > per_rank))
            break;
        p->tiles = 1;
        emit(p, twins, plans, cap, count);
        if (workers > 1 && nsp > 0 && (split > 1 || per_rank < workers)) {
            p->tiles = workers;
            emit(p, twins, plans, cap, count);
        }
    }
    p->micro = 1;
    p->tiles = 1;
}

tsl_status tsl_plan_candidates(tsl_graph_t g, int32_t nranks, int32_t workers, int64_t batch,
                               tsl_plan *plans, int32_t cap, int32_t *count)
{
    if (!g || nranks < 1 || workers < 1 || batch < 1 || !count || cap < 0 || (cap > 0 && !plans))
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "tsl_plan_candidates: bad argument");
    if (g->input < 0)
        return tsl_error(NULL, TSL_ERR_STATE, "tsl_plan_candidates: the graph has no input");
    const tsl_shape *input = &g->values[g->input].shape;
    /* recompute=1 twins where the backward would make some value again (on one stage; a
     * pipeline's cuts can only take that away) */
    uint8_t *remade = calloc((size_t)g->nops + 1, 1);
    int32_t twins = remade ? tsl_graph_remade_norms(g, NULL, remade) : -1;
    free(remade);
    if (twins < 0)
        return tsl_error(NULL, TSL_ERR_OUT_OF_MEMORY, "tsl_plan_candidates: out of memory");
    *count = 0;
    for (int32_t s = 1; s <= nranks; s++) {
        if (nranks % s || s > g->nops)
            continue;
        int32_t group = nranks / s;
        for (int32_t d = 1; d <= group; d++) {
            if (group % d || d > batch)
                continue;
            for (int32_t f = 1; f <= group / d; f++) {
                if ((group / d) % f)
                    continue;
                for (int32_t by_inputs = 0; by_inputs < (f > 1 ? 2 : 1); by_inputs++) {
                    tsl_plan p; /* filters=F, then channels=F */
                    tsl_plan_init(&p);
                    p.stages = s;
                    p.data = d;
                    *(by_inputs ? &p.channels : &p.filters) = f;
                    spatial_splits(&p, input, 0, group / d / f, workers, batch, twins > 0, plans,
                                   cap, count);
                }
            }
        }
    }
    return TSL_OK;
}

typedef struct ranked_plan {
    tsl_plan_prediction pred;
    int32_t index; /* candidate order, the last tie-break */
    int32_t objective;
} ranked_plan;

/* The order of the ranking: by time, then the fewest bytes sent (of plans predicted alike, the
 * one that leans least on the network the model can least foresee: measured on ResNet at 48^2,
 * filters=2 predicted as fast as data=2 ran 43 % slower), then peak memory; by memory, then
 * time; candidate order last. */
static int compare_ranked(const void *pa, const void *pb)
{
    const ranked_plan *a = pa, *b = pb;
    int memory = a->objective == TSL_OBJECTIVE_MEMORY;
    double ka[3] = {a->pred.seconds, (double)a->pred.sent_bytes, (double)a->pred.peak_bytes};
    double kb[3] = {b->pred.seconds, (double)b->pred.sent_bytes, (double)b->pred.peak_bytes};
    if (memory) {
        ka[0] = (double)a->pred.peak_bytes, ka[1] = a->pred.seconds, ka[2] = 0;
        kb[0] = (double)b->pred.peak_bytes, kb[1] = b->pred.seconds, kb[2] = 0;
    }
    for (int k = 0; k < 3; k++)
        if (ka[k] != kb[k])
            return ka[k] < kb[k] ? -1 : 1;
    return (a->index > b->index) - (a->index < b->index);
}

tsl_status tsl_plan_search(tsl_graph_t g, int32_t nranks, int32_t workers, int64_t batch,
                           int32_t optimizer_states, const tsl_plan_costs *costs,
                           int64_t budget_bytes, int32_t objective, tsl_plan_predict_fn predict,
                           void *user, tsl_plan_prediction *ranked, int32_t cap, int32_t *count)
{
    const char *fn = "tsl_plan_search";
    if (!g || !count || cap < 0 || (cap > 0 && !ranked) || (!predict && !costs) ||
        (objective != TSL_OBJECTIVE_TIME && objective != TSL_OBJECTIVE_MEMORY))
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "%s: bad argument", fn);
    int32_t n = 0;
    tsl_status st = tsl_plan_candidates(g, nranks, workers, batch, NULL, 0, &n);
    if (st)
        return st;
    tsl_plan *plans = malloc(sizeof *plans * ((size_t)n + 1));
    ranked_plan *fit = malloc(sizeof *fit * ((size_t)n + 1));
    if (!plans || !fit) {
        free(plans);
        free(fit);
        return tsl_error(NULL, TSL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    }
    st = tsl_plan_candidates(g, nranks, workers, batch, plans, n, &n);
    int32_t nfit = 0, predicted = 0;
    int64_t smallest = -1;
    tsl_status last = TSL_OK;
    char why[256] = "";
    int twin_fits = 0; /* whether the candidate before (a recompute=1 one's twin) fits */
    for (int32_t i = 0; i < n && !st; i++) {
        int fits_before = twin_fits;
        twin_fits = 0;
        if (objective == TSL_OBJECTIVE_TIME && plans[i].recompute && fits_before)
            continue; /* remaking values only adds time: the twin is the better plan */
        tsl_plan_prediction pr;
        tsl_status ps = predict ? predict(&plans[i], user, &pr)
                                : tsl_plan_predict(&plans[i], g, nranks, workers, batch,
                                                   optimizer_states, costs, &pr);
        if (ps) { /* a plan this graph cannot take (its stages, say): not a candidate */
            last = ps;
            snprintf(why, sizeof why, "%s", tsl_last_error());
            continue;
        }
        predicted++;
        pr.plan = plans[i];
        if (smallest < 0 || pr.peak_bytes < smallest)
            smallest = pr.peak_bytes;
        if (budget_bytes > 0 && pr.peak_bytes > budget_bytes)
            continue;
        twin_fits = 1;
        fit[nfit].pred = pr;
        fit[nfit].index = i;
        fit[nfit].objective = objective;
        nfit++;
    }
    if (!st && !predicted)
        st = tsl_error(NULL, last ? last : TSL_ERR_INVALID_ARG,
                       "%s: no plan for %d ranks could be predicted (%s)", fn, (int)nranks, why);
    else if (!st && !nfit)
        st = tsl_error(NULL, TSL_ERR_RESOURCE,
                       "%s: no plan on %d ranks fits in %.1f MiB per rank; the smallest needs "
                       "%.1f MiB",
                       fn, (int)nranks, (double)budget_bytes / 1048576.0,
                       (double)smallest / 1048576.0);
    if (!st) {
        qsort(fit, (size_t)nfit, sizeof *fit, compare_ranked);
        for (int32_t i = 0; i < nfit && i < cap; i++)
            ranked[i] = fit[i].pred;
        *count = nfit;
    }
    free(plans);
    free(fit);
    return st;
}
