/* tsl_model_calibrate(): the measured costs of the performance model (graph/plan_model.c). A
 * throwaway model of the graph with the default plan trains a few steps on random data under a
 * task trace; the trace's run time per op label, the workers' time outside tasks and a
 * ping-pong between ranks 0 and 1 give the numbers. */
#include <mpi.h>
#include <starpu.h>
#include <stdlib.h>
#include <string.h>

#include "executor/executor.h"
#include "trace.h"

/* a trace label's room: an op's name and " (recompute)" */
#define LABEL (TSL_GRAPH_NAME_MAX + 16)

/* Half the round trip of `bytes`-byte messages between ranks 0 and 1 (others wait), seconds. */
static double ping_pong(struct tsl_context *ctx, char *buf, int bytes, int reps)
{
    MPI_Barrier(ctx->ctl_comm);
    double t0 = MPI_Wtime();
    for (int i = 0; i < reps; i++) {
        if (ctx->rank == 0) {
            MPI_Send(buf, bytes, MPI_BYTE, 1, 7, ctx->ctl_comm);
            MPI_Recv(buf, bytes, MPI_BYTE, 1, 7, ctx->ctl_comm, MPI_STATUS_IGNORE);
        } else if (ctx->rank == 1) {
            MPI_Recv(buf, bytes, MPI_BYTE, 0, 7, ctx->ctl_comm, MPI_STATUS_IGNORE);
            MPI_Send(buf, bytes, MPI_BYTE, 0, 7, ctx->ctl_comm);
        }
    }
    return (MPI_Wtime() - t0) / (2.0 * reps);
}

tsl_status tsl_context_measure_link(tsl_context_t ctx, double *latency, double *bandwidth)
{
    if (!ctx || !latency || !bandwidth)
        return tsl_error(ctx, TSL_ERR_INVALID_ARG, "tsl_context_measure_link: bad argument");
    double got[2] = {0, 0};
    if (ctx->size > 1) {
        char *buf = calloc(4 << 20, 1);
        int ok = buf != NULL, all = 0;
        MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, ctx->ctl_comm);
        if (!all) {
            free(buf);
            return tsl_error(ctx, TSL_ERR_OUT_OF_MEMORY, "tsl_context_measure_link: out of memory");
        }
        got[0] = ping_pong(ctx, buf, 8, 200);
        double big = ping_pong(ctx, buf, 4 << 20, 8);
        got[1] = big > got[0] ? (double)(4 << 20) / (big - got[0]) : 0;
        free(buf);
        MPI_Bcast(got, 2, MPI_DOUBLE, 0, ctx->ctl_comm);
    }
    *latency = got[0];
    *bandwidth = got[1];
    return TSL_OK;
}

/* What one traced run measured: per op (and the loss, at nops, and each norm's remaking of its
 * ReLU output, at nops + 1 + o) the tasks' run time on this rank, the workers' time outside
 * tasks, the tasks. */
typedef struct measured {
    double *op;  /* 2 nops + 1 */
    double idle; /* workers x wall - busy */
    double tasks;
    double *step_idle, *step_tasks; /* per traced step: the same (NULL: not wanted) */
    double *step_wall;              /* per traced step: its wall time (NULL: not wanted) */
} measured;

/* The batch as tensors for a model of several inputs: input 0 from rank 0's x, the others
 * uniform in [-1, 1), the labels from rank 0's (uniform floats for float targets). */
static tsl_status batch_tensors(struct tsl_context *ctx, tsl_model_t model, tsl_graph_t g,
                                int64_t batch, const float *x, const int64_t *labels,
                                tsl_tensor_t *xs, tsl_tensor_t *y)
{
    const int32_t n = tsl_graph_input_count(g);
    tsl_status st = TSL_OK;
    for (int32_t k = 0; k < n && !st; k++) {
        tsl_shape s;
        tsl_batch_shape(batch, &g->values[tsl_graph_input_value(g, k)].shape, &s);
        st = tsl_tensor_create(&xs[k], ctx, TSL_F32, &s, NULL, NULL);
        if (!st)
            st = k ? tsl_tensor_fill_uniform(xs[k], 0x5eed + (uint64_t)k, -1.0, 1.0)
                   : tsl_tensor_scatter(xs[k], 0, x);
    }
    const tsl_shape *out = &g->values[g->output].shape;
    tsl_dtype dt = tsl_model_label_dtype(model);
    tsl_shape ls;
    memset(&ls, 0, sizeof ls);
    ls.dims[0] = batch;
    ls.ndim = dt == TSL_F32 ? out->ndim + 1 : out->ndim; /* targets: the output's shape */
    for (int d = 1; d < ls.ndim; d++)
        ls.dims[d] = out->dims[dt == TSL_F32 ? d - 1 : d];
    if (!st)
        st = tsl_tensor_create(y, ctx, dt, &ls, NULL, NULL);
    if (!st && dt == TSL_F32)
        return tsl_tensor_fill_uniform(*y, 0x5eed, -1.0, 1.0);
    int64_t count = tsl_shape_numel(&ls);
    void *buf = st || ctx->rank ? NULL : malloc((size_t)count * tsl_dtype_size(dt));
    if (!st && ctx->rank == 0 && !buf)
        st = TSL_ERR_OUT_OF_MEMORY;
    for (int64_t i = 0; buf && i < count; i++) {
        if (dt == TSL_U8)
            ((uint8_t *)buf)[i] = (uint8_t)labels[i];
        else
            ((int32_t *)buf)[i] = (int32_t)labels[i];
    }
    st = tsl_context_agree_all(ctx, st);
    if (!st)
        st = tsl_tensor_scatter(*y, 0, buf);
    free(buf);
    return st;
}

/* The median of v[s] - per * by[s] over the first min(steps, 64) steps (by NULL: of v). */
static double median_step(const double *v, const double *by, double per, int32_t steps)
{
    double w[64];
    int32_t n = steps < 64 ? steps : 64;
    for (int32_t s = 0; s < n; s++) {
        double x = v[s] - (by ? per * by[s] : 0), *at = w + s;
        for (; at > w && at[-1] > x; at--) /* (insertion sort) */
            at[0] = at[-1];
        *at = x;
    }
    return n < 1 ? 0 : n % 2 ? w[n / 2] : 0.5 * (w[n / 2 - 1] + w[n / 2]);
}

double tsl_calibration_step_waits(const double *step_idle, const double *step_tasks, int32_t steps,
                                  double per_task)
{
    return median_step(step_idle, step_tasks, per_task, steps);
}

/* A model of g under `plan` (NULL: the default) trains one warm-up step and `steps` traced steps
 * on the batch (rank 0's x and labels; every input's tensor for a graph of several); *m gets
 * this rank's totals (the remaking of the norms marked in `remade` apart). */
static tsl_status measure(struct tsl_context *ctx, tsl_graph_t g, const tsl_plan *plan,
                          int64_t batch, int32_t steps, const float *x, const int64_t *labels,
                          const uint8_t *remade, const char **names, char (*bufs)[LABEL],
                          measured *m)
{
    tsl_model_t model = NULL;
    tsl_optimizer_t opt = NULL;
    tsl_sgd_config sgd = {.lr = 1e-3};
    int32_t nops = g->nops;
    double busy = 0, t0 = 0;
    int64_t ntasks = 0;
    const int32_t ninputs = tsl_graph_input_count(g);
    tsl_tensor_t xs[TSL_GRAPH_MAX_GRAPH_INPUTS] = {NULL}, y = NULL;
    tsl_status st = tsl_model_create_plan(&model, ctx, g, 1, plan);
    if (!st)
        st = tsl_optimizer_create_sgd(&opt, ctx, &sgd);
    if (!st && ninputs > 1)
        st = batch_tensors(ctx, model, g, batch, x, labels, xs, &y);
    /* a warm-up step, then the traced ones, each waited for (their times apart: a step's waits
     * vary, and one slow step should not decide) */
    double *ends = calloc((size_t)steps + 1, sizeof *ends);
    if (!st && !ends)
        st = tsl_error(ctx, TSL_ERR_OUT_OF_MEMORY, "tsl_model_calibrate: out of memory");
    for (int32_t s = -1; s < steps && !st; s++) {
        if (s == 0) {
            st = tsl_context_trace_begin(ctx, (int64_t)1 << 24);
            t0 = ends[0] = starpu_timing_now();
        }
        if (!st)
            st = ninputs > 1 ? tsl_model_train_step_inputs(model, ninputs, xs, y, opt, NULL, NULL)
                             : tsl_model_train_step(model, batch, x, labels, opt, NULL, NULL);
        if (!st && s >= 0 && !(st = tsl_context_wait(ctx)))
            ends[s + 1] = starpu_timing_now();
    }
    tsl_status w = tsl_context_wait(ctx);
    double wall = (starpu_timing_now() - t0) * 1e-6;
    st = st ? st : w;
    for (int32_t s = 0; !st && m->step_idle && s < steps; s++) {
        double step_busy;
        int64_t n;
        st = tsl_trace_busy_between(ctx, ends[s], ends[s + 1], &step_busy, &n);
        m->step_idle[s] = (ends[s + 1] - ends[s]) * 1e-6 * starpu_worker_get_count() - step_busy;
        m->step_tasks[s] = (double)n;
    }
    for (int32_t s = 0; !st && m->step_wall && s < steps; s++)
        m->step_wall[s] = (ends[s + 1] - ends[s]) * 1e-6;
    free(ends);
    for (int32_t o = 0; !st && o < nops; o++) {
        names[o] = tsl_exec_op_label(model, o, bufs[o], sizeof bufs[o]);
        names[nops + 1 + o] =
            remade[o] ? tsl_exec_remake_label(model, o, bufs[nops + 1 + o], sizeof bufs[0]) : NULL;
    }
    /* the loss's tasks, labelled by the loss, count with the output's producer */
    names[nops] = model && model->nloss == 1 && model->loss[0].kind == TSL_MODEL_LOSS_CROSS_ENTROPY
                      ? "cross_entropy"
                      : "loss";
    if (!st)
        st = tsl_trace_totals(ctx, 2 * nops + 1, names, m->op, &busy, &ntasks);
    tsl_trace_destroy(ctx);
    for (int32_t k = 0; k < ninputs && k < TSL_GRAPH_MAX_GRAPH_INPUTS; k++)
        tsl_tensor_destroy(xs[k]);
    tsl_tensor_destroy(y);
    tsl_optimizer_destroy(opt);
    tsl_status d = tsl_model_destroy(model);
    m->idle = wall * (double)starpu_worker_get_count() - busy;
    m->tasks = (double)ntasks;
    return st ? st : d;
}

/* the calibration's runs (tsl_model_calibrate) */
#define RUNS 7

/* Ranks outnumbering their node's cores (tsl_context_core_sharing), the most that share one
 * core on any node; 1 where none do. Collective. */
static int32_t core_sharers(struct tsl_context *ctx)
{
    int32_t most = 1;
    if (ctx->size > 1 && ctx->node_ranks > ctx->node_cores && ctx->node_cores > 0) {
        int32_t here = ctx->node_ranks < ctx->size ? ctx->node_ranks : ctx->size;
        most = (here + ctx->node_cores - 1) / ctx->node_cores;
    }
    MPI_Allreduce(MPI_IN_PLACE, &most, 1, MPI_INT32_T, MPI_MAX, ctx->ctl_comm);
    return most;
}

/* Whether stages=k puts the ranks sharing each core (consecutive ranks node_ranks to a node,
 * local rank l on core l mod node_cores) in different stages: every core's ranks then work
 * in turn, one busy at a time. */
static int turns_apart(int32_t size, int32_t node_ranks, int32_t node_cores, int32_t k)
{
    if (k < 2 || size % k || node_ranks < 1 || node_cores < 1)
        return 0;
    int32_t group = size / k;
    for (int32_t r = 0; r < size; r++)
        for (int32_t q = r + 1; q < size && q / node_ranks == r / node_ranks; q++)
            if (q % node_ranks % node_cores == r % node_ranks % node_cores &&
                q / group == r / group)
                return 0;
    return 1;
}

/* costs->wait_seconds_turns: the median of the steps (wall, every rank's slowest) of the run
 * whose cores' ranks worked in turn (`turns`, SGD without momentum), beyond what the model
 * predicts of it without those waits. Collective. */
static tsl_status turns_waits(struct tsl_context *ctx, tsl_graph_t g, const tsl_plan *turns,
                              int64_t batch, double *wall, int32_t steps, tsl_plan_costs *costs)
{
    MPI_Allreduce(MPI_IN_PLACE, wall, steps, MPI_DOUBLE, MPI_MAX, ctx->ctl_comm);
    double median = median_step(wall, NULL, 0, steps);
    tsl_plan_prediction p;
    tsl_status st = tsl_plan_predict(turns, g, ctx->size, (int32_t)starpu_worker_get_count(), batch,
                                     0, costs, &p);
    costs->wait_seconds_turns = !st && median > p.seconds ? median - p.seconds : 0;
    return st;
}

/* Whether `plan` (filters=R) cuts some convolution's filters of g: its placement succeeds. */
static int filter_plan_fits(const tsl_plan *plan, tsl_graph_t g, int32_t nranks)
{
    int32_t np = tsl_graph_param_count(g);
    tsl_tile_grid *grids = calloc((size_t)np + 1, sizeof *grids);
    tsl_owner_map *owners = calloc((size_t)np + 1, sizeof *owners);
    int fits = grids && owners &&
               tsl_plan_param_placement(plan, g, nranks, NULL, grids, owners, NULL) == TSL_OK;
    free(grids);
    free(owners);
    return fits;
}

tsl_status tsl_model_calibrate(tsl_context_t ctx, tsl_graph_t g, int64_t batch, int32_t steps,
                               double *op_seconds, tsl_plan_costs *costs)
{
    const char *fn = "tsl_model_calibrate";
    if (!ctx || !g || !op_seconds || !costs || batch < 1 || steps < 1 || steps > 1000)
        return tsl_error(ctx, TSL_ERR_INVALID_ARG, "%s: bad argument", fn);
    if (g->input < 0 || g->output < 0)
        return tsl_error(ctx, TSL_ERR_STATE, "%s: the graph needs an input and an output", fn);
    /* per run: op, loss, remaking per norm, idle, tasks */
    int32_t nops = g->nops, n = 2 * nops + 3, idle_at = 2 * nops + 1, tasks_at = 2 * nops + 2;
    const tsl_shape *in = &g->values[g->input].shape, *out = &g->values[g->output].shape;
    int64_t per_sample = tsl_shape_numel(in), positions = 1;
    for (int d = 1; d < out->ndim; d++)
        positions *= out->dims[d];
    int spatial = in->ndim > 1;
    float *x = NULL;
    int64_t *labels = NULL;
    const char **names = calloc(2 * (size_t)nops + 1, sizeof *names);
    char(*bufs)[LABEL] = calloc(2 * (size_t)nops + 1, sizeof *bufs);
    uint8_t *remade = calloc((size_t)nops + 1, 1);
    /* seven runs' sums (per op and loss, idle, tasks): default, 4x the tiles, windows, output-
     * and input-channel tiles, windows cut along the last spatial dimension, a core's ranks in
     * turn */
    double *local = calloc(RUNS * (size_t)n, sizeof *local),
           *sums = calloc(RUNS * (size_t)n, sizeof *sums);
    /* the default and the windows' runs per traced step: idle time, tasks (4 x steps); the
     * turns' run's step times */
    double *per_step = calloc(5 * (size_t)steps, sizeof *per_step);
    tsl_status st =
        names && bufs && remade && local && sums && per_step ? TSL_OK : TSL_ERR_OUT_OF_MEMORY;
    int32_t remaking = st ? -1 : tsl_graph_remade_norms(g, NULL, remade);
    if (remaking < 0)
        st = TSL_ERR_OUT_OF_MEMORY;
    if (!st && ctx->rank == 0) {
        x = malloc(sizeof *x * (size_t)(batch * per_sample));
        labels = malloc(sizeof *labels * (size_t)(batch * positions));
        st = x && labels ? TSL_OK : TSL_ERR_OUT_OF_MEMORY;
        uint64_t r = 0x9e3779b97f4a7c15ull;
        for (int64_t i = 0; !st && i < batch * per_sample; i++) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            x[i] = (float)((double)(r >> 11) / 9007199254740992.0 * 2.0 - 1.0);
        }
        for (int64_t i = 0; !st && i < batch * positions; i++)
            labels[i] = (int64_t)((i * 7 + 3) % out->dims[0]);
    }
    if (st) /* (nothing runs then; the frees at the end) */
        st = tsl_error(ctx, TSL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    /* 1: the default plan; 2: the same tiles cut 4 times finer (micro=4: the tasks' fixed
     * cost), both with recompute=1 where some norm's ReLU output can be made again (those tasks
     * timed apart: the remaking's cost); 3: windows: on several ranks space=R (the samples cut
     * across the ranks along their first spatial dimension, halos exchanged between ranks as a
     * spatial plan runs them: its tasks run some 10 % longer than the same windows on one rank),
     * else, or where that plan does not fit, the samples cut in two along their longest dimension
     * (tiles=2); 4: on several ranks, filters=R where R divides some convolution's channels
     * (output-channel tiles); 5: there, channels=R too (input-channel tiles: a layer's partial
     * outputs and their sum; a plan that cannot take it leaves these costs as filters=R's) */
    tsl_plan base, finer, windows, halves, filters;
    tsl_plan_init(&base);
    base.data = ctx->size;
    base.recompute = remaking > 0;
    finer = base;
    finer.micro = 4;
    tsl_plan_init(&halves);
    halves.data = ctx->size;
    halves.tiles = 2;
    windows = halves;
    int across_ranks = 0; /* windows is space=R */
    tsl_plan last; /* 6: samples of 2 or 3 spatial dimensions cut across the ranks along the last
                      (windows of short rows: some 5-15 % slower than along the first) */
    tsl_plan_init(&last);
    int along_last = 0;
    if (spatial && ctx->size > 1) {
        tsl_plan across;
        tsl_plan_init(&across);
        across.space_ndim = 1;
        across.space[0] = ctx->size;
        across_ranks = tsl_plan_check(&across, in, ctx->size) == TSL_OK;
        if (across_ranks)
            windows = across;
        int32_t nsp = in->ndim - 1;
        if (nsp >= 2 && nsp <= 3) {
            last.space_ndim = nsp;
            last.space[nsp - 1] = ctx->size;
            along_last = across_ranks && tsl_plan_check(&last, in, ctx->size) == TSL_OK;
        }
    }
    tsl_plan_init(&filters);
    filters.filters = ctx->size;
    int channels = spatial && ctx->size > 1 && filter_plan_fits(&filters, g, ctx->size);
    tsl_plan inputs; /* 5: channels=R, the convolutions' input channels cut (their own costs:
                        partial outputs, then their sum) */
    tsl_plan_init(&inputs);
    inputs.channels = ctx->size;
    int by_inputs = channels && filter_plan_fits(&inputs, g, ctx->size);
    /* 7: where S ranks share a core (more ranks than cores on a node), stages=S with the
     * samples over each stage's ranks, a core's ranks in different stages: the tasks' time
     * with one rank of a core busy at a time, against the default run's with all busy (the
     * shared slowdown); a plan the model refuses leaves it 1 */
    const int32_t sharers = core_sharers(ctx);
    int in_turns =
        sharers > 1 && turns_apart(ctx->size, ctx->node_ranks > 0 ? ctx->node_ranks : ctx->size,
                                   ctx->node_cores > 0 ? ctx->node_cores : 1, sharers);
    MPI_Allreduce(MPI_IN_PLACE, &in_turns, 1, MPI_INT, MPI_MIN, ctx->ctl_comm);
    tsl_plan turns = base;
    turns.data = ctx->size / sharers;
    turns.stages = sharers;
    const tsl_plan *plans[RUNS] = {
        remaking > 0 ? &base : NULL, &finer, &windows, &filters, &inputs, &last, &turns};
    for (int k = 0; k < RUNS && !st; k++) {
        if ((k == 2 && !spatial) || (k == 3 && !channels) || (k == 4 && !by_inputs) ||
            (k == 5 && !along_last) || (k == 6 && !in_turns))
            continue;
        measured m = {local + (size_t)k * n,
                      0,
                      0,
                      k == 0 || k == 2 ? per_step + (size_t)k * steps : NULL,
                      k == 0 || k == 2 ? per_step + (size_t)(k + 1) * steps : NULL,
                      k == 6 ? per_step + 4 * (size_t)steps : NULL};
        st = measure(ctx, g, plans[k], batch, steps, x, labels, remade, names, bufs, &m);
        if (st && k == 2 && across_ranks) { /* (the model refused space=R) */
            memset(local + (size_t)k * n, 0, sizeof *local * (size_t)n);
            m.idle = m.tasks = 0;
            st = measure(ctx, g, &halves, batch, steps, x, labels, remade, names, bufs, &m);
        }
        if (st && k >= 4) { /* (the model refused channels=R: filters=R's costs serve; or the
                               cut along the last dimension: the first's; or the stages: no
                               slowdown measured) */
            memset(local + (size_t)k * n, 0, sizeof *local * (size_t)n);
            *(k == 4 ? &by_inputs : k == 5 ? &along_last : &in_turns) = 0;
            st = TSL_OK;
            continue;
        }
        if (!st) {
            local[(size_t)k * n + idle_at] = m.idle;
            local[(size_t)k * n + tasks_at] = m.tasks;
        }
    }
    if (!st) { /* the same on every rank: its own outcome decides nothing alone */
        MPI_Allreduce(local, sums, RUNS * n, MPI_DOUBLE, MPI_SUM, ctx->ctl_comm);
        MPI_Allreduce(MPI_IN_PLACE, &in_turns, 1, MPI_INT, MPI_MIN, ctx->ctl_comm);
        int32_t producer = g->values[g->output].producer;
        /* per run: its tasks' run time on all ranks (the default's, the finer tiles', the
         * windows' and the turns' count) */
        double busy[RUNS] = {0}, per = (double)steps * (double)batch;
        for (int k = 0; k < RUNS; k++) {
            double *r = sums + (size_t)k * n;
            r[g->ops[producer].kind == TSL_OP_INPUT ? 0 : producer] += r[nops];
            for (int32_t o = 0; o < nops; o++)
                busy[k] += r[o] + r[nops + 1 + o];
        }
        /* a task's fixed cost: the busy time and the workers' time outside tasks that the
         * finer tiles added per task they added; the default run's time outside tasks beyond
         * that per task is the step's waits, per worker and step (those do not grow with the
         * tasks: a pipeline of 8 micro-batches does not wait 8 times as often) */
        double *r0 = sums, *r1 = sums + n, extra = r1[tasks_at] - r0[tasks_at];
        double fixed = extra > 0 && busy[1] > busy[0] ? (busy[1] - busy[0]) / extra : 0;
        double idle =
            extra > 0 && r1[idle_at] > r0[idle_at] ? (r1[idle_at] - r0[idle_at]) / extra : 0;
        /* and the same waits of the windows' run: a spatial plan waits for halos beyond what
         * its tasks explain (a channel plan's waits for the input's other channel tiles are a
         * term of the model's own, on the critical path) */
        double head[5] = {fixed + idle, 0, 0, 0, 0}, waits[2];
        for (int k = 0; k < 2; k++) /* each rank's median step, then their mean */
            waits[k] =
                tsl_calibration_step_waits(per_step + (size_t)(2 * k) * steps,
                                           per_step + (size_t)(2 * k + 1) * steps, steps, idle);
        MPI_Allreduce(MPI_IN_PLACE, waits, 2, MPI_DOUBLE, MPI_SUM, ctx->ctl_comm);
        const double workers = (double)ctx->size * starpu_worker_get_count();
        const double slowdown =
            in_turns && busy[6] > 0 && busy[0] > busy[6] ? busy[0] / busy[6] : 1;
        for (int k = 0; k < 2; k++) {
            /* Where a core's S ranks share it, the model counts the core's turns itself
             * (core_turns(): S times one rank's tasks alone). What the tasks' own slowdown
             * (all busy against one) does not explain of them, the workers waited for. */
            double others = (sharers > slowdown ? sharers / slowdown - 1 : 0) * busy[2 * k] /
                            (workers * (double)steps);
            head[3 + k] = (k == 0 || spatial) && waits[k] / workers > others
                              ? waits[k] / workers - others
                              : 0;
        }
        st = tsl_context_measure_link(ctx, &head[1], &head[2]);
        MPI_Bcast(head, 5, MPI_DOUBLE, 0, ctx->ctl_comm);
        MPI_Bcast(sums, RUNS * n, MPI_DOUBLE, 0, ctx->ctl_comm);
        int32_t node[2] = {sharers > 1 ? ctx->node_ranks : 0, sharers > 1 ? ctx->node_cores : 0};
        MPI_Bcast(node, 2, MPI_INT32_T, 0, ctx->ctl_comm); /* (rank 0's node describes them) */
        for (int32_t o = 0; o < nops; o++) {
            op_seconds[o] = sums[o] / per;
            op_seconds[nops + o] = spatial ? sums[2 * (size_t)n + o] / per : op_seconds[o];
            op_seconds[2 * nops + o] = channels ? sums[3 * (size_t)n + o] / per : op_seconds[o];
            op_seconds[3 * nops + o] = sums[nops + 1 + o] / per;
            op_seconds[4 * nops + o] =
                by_inputs ? sums[4 * (size_t)n + o] / per : op_seconds[2 * nops + o];
            op_seconds[5 * nops + o] =
                along_last ? sums[5 * (size_t)n + o] / per : op_seconds[nops + o];
        }
        costs->nops = nops;
        costs->op_seconds = op_seconds;
        costs->op_seconds_windowed = spatial ? op_seconds + nops : NULL;
        costs->op_seconds_channels = channels ? op_seconds + 2 * nops : NULL;
        costs->op_seconds_recompute = remaking > 0 ? op_seconds + 3 * nops : NULL;
        costs->op_seconds_input_channels = by_inputs ? op_seconds + 4 * nops : NULL;
        costs->op_seconds_windowed_last = along_last ? op_seconds + 5 * nops : NULL;
        costs->task_seconds = head[0];
        costs->wait_seconds = head[3];
        costs->wait_seconds_windowed = head[4];
        costs->latency = head[1];
        costs->bandwidth = head[2];
        costs->node_ranks = node[0];
        costs->node_cores = node[1];
        costs->shared_slowdown = slowdown;
        costs->wait_seconds_turns = 0;
        if (in_turns) { /* the turns' run's median step beyond the model's time of it */
            tsl_status t =
                turns_waits(ctx, g, &turns, batch, per_step + 4 * (size_t)steps, steps, costs);
            st = st ? st : t;
        }
    }
    free(names);
    free(bufs);
    free(remade);
    free(local);
    free(sums);
    free(per_step);
    free(x);
    free(labels);
    return st;
}
