/* --plan auto: the measured costs of the performance model (calibrated once per model, batch and
 * workers, cached in the StarPU home), the memory budget, the search and its report. */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#include <errno.h>
#include <mpi.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"

int compare_doubles(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int64_t auto_budget_bytes(long mem_mib, long overhead_mib, long ranks_here)
{
    if (mem_mib > 0)
        return ((int64_t)mem_mib - overhead_mib) * 1048576;
    int nlocal = ranks_here > 0 ? (int)ranks_here : 1, inited = 0;
    MPI_Initialized(&inited);
    if (ranks_here <= 0 && inited) { /* the ranks sharing this node share its memory */
        MPI_Comm node;
        MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
        MPI_Comm_size(node, &nlocal);
        MPI_Comm_free(&node);
    }
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    int64_t node_bytes = pages > 0 && page > 0 ? (int64_t)pages * page : 0;
    return node_bytes / nlocal - (int64_t)overhead_mib * 1048576;
}

/* <STARPU_HOME or HOME>/.starpu/tessel/<name> (the folders made), in path; 0 on success. */
static int home_file(const char *name, char *path, size_t size)
{
    const char *home = getenv("STARPU_HOME");
    if (!home || !*home)
        home = getenv("HOME");
    if (!home)
        return -1;
    char dir[3072];
    snprintf(dir, sizeof dir, "%s/.starpu", home);
    mkdir(dir, 0755);
    snprintf(dir, sizeof dir, "%s/.starpu/tessel", home);
    mkdir(dir, 0755);
    return snprintf(path, size, "%s/%s", dir, name) < (int)size ? 0 : -1;
}

/* The cache file of a calibration: calibration-<key>.txt in the StarPU home's tessel folder,
 * the key a hash of the model (its JSON), its inputs' sample shapes, the batch, one rank or
 * several (only several measure channel tiles), the workers per rank and the most ranks
 * sharing a core (1: none; the ops' times and waits differ with it). */
static int cache_path(tsl_graph_t g, int64_t batch, int32_t ranks, int32_t workers, int32_t sharers,
                      char *path, size_t size)
{
    char *json = NULL;
    if (tsl_graph_print_json(g, &json) != TSL_OK)
        return -1;
    uint64_t h = 1469598103934665603ull;
    for (const char *c = json; *c; c++)
        h = (h ^ (unsigned char)*c) * 1099511628211ull;
    free(json);
    long long parts[4] = {(long long)batch, ranks > 1, workers, sharers > 1 ? sharers : 1};
    for (int k = 0; k < 4; k++)
        h = (h ^ (uint64_t)parts[k]) * 1099511628211ull;
    /* and every input's sample shape (the model text does not hold a zoo network's) */
    for (int32_t i = 0; i < tsl_graph_input_count(g); i++) {
        tsl_shape s;
        if (tsl_graph_value_shape(g, tsl_graph_input_value(g, i), &s) != TSL_OK)
            return -1;
        for (int d = 0; d < s.ndim; d++)
            h = (h ^ (uint64_t)s.dims[d]) * 1099511628211ull;
        h = (h ^ (uint64_t)s.ndim) * 1099511628211ull;
    }
    char name[64];
    snprintf(name, sizeof name, "calibration-%016llx.txt", (unsigned long long)h);
    return home_file(name, path, size);
}

/* Read a cached calibration of nops ops (6 x nops costs: sample tiles, windows, output-channel
 * tiles, remaking, input-channel tiles, windows cut along the last dimension), a task's cost,
 * the two waits (wait_seconds, windowed), whether it has each kind of cost but the first
 * (flags) and the node's sharing of cores (node: ranks, cores; shared: the tasks' slowdown,
 * the waits of ranks in turn); 0 when it was there and whole. */
static int cache_read(const char *path, int32_t nops, double *op_seconds, double *task,
                      double *wait, int *flags, int *node, double *shared)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    int n = 0,
        ok = fscanf(f,
                    "tessel calibration 10 ops %d windowed %d channels %d recompute %d inputs "
                    "%d last %d task %lg wait %lg %lg share %d %d %lg %lg",
                    &n, &flags[0], &flags[1], &flags[2], &flags[3], &flags[4], task, &wait[0],
                    &wait[1], &node[0], &node[1], &shared[0], &shared[1]) == 13 &&
             n == nops && node[0] >= 0 && node[1] >= 0 && shared[0] >= 0 && shared[1] >= 0;
    for (int32_t o = 0; ok && o < 6 * nops; o++)
        ok = fscanf(f, "%lg", &op_seconds[o]) == 1;
    fclose(f);
    return ok ? 0 : -1;
}

static int cache_write(FILE *f, const void *arg)
{
    const tsl_plan_costs *c = arg;
    fprintf(f,
            "tessel calibration 10 ops %d windowed %d channels %d recompute %d inputs %d last %d "
            "task %.17g wait %.17g %.17g share %d %d %.17g %.17g\n",
            (int)c->nops, c->op_seconds_windowed != NULL, c->op_seconds_channels != NULL,
            c->op_seconds_recompute != NULL, c->op_seconds_input_channels != NULL,
            c->op_seconds_windowed_last != NULL, c->task_seconds, c->wait_seconds,
            c->wait_seconds_windowed, (int)c->node_ranks, (int)c->node_cores, c->shared_slowdown,
            c->wait_seconds_turns);
    for (int32_t o = 0; o < 6 * c->nops; o++)
        fprintf(f, "%.17g\n", c->op_seconds[o]);
    return 0;
}

static int link_write(FILE *f, const void *arg)
{
    const tsl_plan_costs *c = arg;
    fprintf(f, "tessel link 1 latency %.17g bandwidth %.17g\n", c->latency, c->bandwidth);
    return 0;
}

int auto_cached_link(double *latency, double *bandwidth)
{
    char path[4096];
    FILE *f = home_file("link.txt", path, sizeof path) == 0 ? fopen(path, "r") : NULL;
    if (!f)
        return -1;
    int ok = fscanf(f, "tessel link 1 latency %lg bandwidth %lg", latency, bandwidth) == 2 &&
             *latency >= 0 && *bandwidth > 0;
    fclose(f);
    return ok ? 0 : -1;
}

tsl_status auto_costs(tsl_context_t ctx, tsl_graph_t g, int64_t batch, int32_t for_ranks,
                      double *op_seconds, tsl_plan_costs *costs, int *cached)
{
    int32_t ranks = 1, workers = 1, rank = 0, nops = tsl_graph_op_count(g);
    tsl_context_size(ctx, &ranks);
    tsl_context_rank(ctx, &rank);
    tsl_context_worker_count(ctx, TSL_WORKER_CPU, &workers);
    char path[4096] = "";
    /* task_seconds, wait_seconds, _windowed, shared_slowdown, wait_seconds_turns */
    double task[5] = {0, 0, 0, 0, 0};
    int have = 0, flags[7] = {0, 0, 0, 0, 0, 0, 0}; /* kinds of costs; node ranks, cores */
    /* the most ranks sharing a core: this run's, or for for_ranks of a run of one rank, those
     * ranks' on this node (as tessel binds them: more ranks than cores, one core each) */
    int32_t node_ranks = 0, node_cores = 0, sharers = 1;
    tsl_context_core_sharing(ctx, &node_ranks, &node_cores);
    if (node_cores > 0 && node_ranks > node_cores)
        sharers = ((node_ranks < ranks ? node_ranks : ranks) + node_cores - 1) / node_cores;
    MPI_Allreduce(MPI_IN_PLACE, &sharers, 1, MPI_INT32_T, MPI_MAX, MPI_COMM_WORLD);
    if (rank == 0 && ranks == 1 && for_ranks > 1) { /* a run on several ranks' first */
        cpu_set_t mine;
        int cores = sched_getaffinity(0, sizeof mine, &mine) == 0 ? CPU_COUNT(&mine) : 0;
        int32_t theirs = cores > 0 && for_ranks > cores ? (for_ranks + cores - 1) / cores : 1;
        have = cache_path(g, batch, for_ranks, workers, theirs, path, sizeof path) == 0 &&
                       cache_read(path, nops, op_seconds, &task[0], &task[1], flags, flags + 5,
                                  &task[3]) == 0
                   ? 2
                   : 0;
    }
    if (rank == 0 && !have)
        have =
            cache_path(g, batch, ranks, workers, sharers, path, sizeof path) == 0 &&
            cache_read(path, nops, op_seconds, &task[0], &task[1], flags, flags + 5, &task[3]) == 0;
    MPI_Bcast(&have, 1, MPI_INT, 0, MPI_COMM_WORLD);
    *cached = have;
    tsl_status st = TSL_OK;
    if (have) { /* the ops' costs from the cache, the network measured now */
        MPI_Bcast(task, 5, MPI_DOUBLE, 0, MPI_COMM_WORLD);
        MPI_Bcast(flags, 7, MPI_INT, 0, MPI_COMM_WORLD);
        MPI_Bcast(op_seconds, 6 * nops, MPI_DOUBLE, 0, MPI_COMM_WORLD);
        costs->nops = nops;
        costs->op_seconds = op_seconds;
        costs->op_seconds_windowed = flags[0] ? op_seconds + nops : NULL;
        costs->op_seconds_channels = flags[1] ? op_seconds + 2 * nops : NULL;
        costs->op_seconds_recompute = flags[2] ? op_seconds + 3 * nops : NULL;
        costs->op_seconds_input_channels = flags[3] ? op_seconds + 4 * nops : NULL;
        costs->op_seconds_windowed_last = flags[4] ? op_seconds + 5 * nops : NULL;
        costs->task_seconds = task[0];
        costs->wait_seconds = task[1];
        costs->wait_seconds_windowed = task[2];
        costs->node_ranks = flags[5];
        costs->node_cores = flags[6];
        costs->shared_slowdown = task[3];
        costs->wait_seconds_turns = task[4];
        st = tsl_context_measure_link(ctx, &costs->latency, &costs->bandwidth);
    } else {
        st = tsl_model_calibrate(ctx, g, batch, 3, op_seconds, costs);
        if (!st && rank == 0 && path[0] && write_file_atomic(path, cache_write, costs) != 0)
            fprintf(stderr, "tessel: warning: could not keep the calibration in %s: %s\n", path,
                    strerror(errno));
    }
    /* the network, for tessel plan --plan auto on one process */
    if (!st && rank == 0 && ranks > 1 && home_file("link.txt", path, sizeof path) == 0 &&
        write_file_atomic(path, link_write, costs) != 0)
        fprintf(stderr, "tessel: warning: could not keep the network in %s: %s\n", path,
                strerror(errno));
    return st;
}

void print_ranked(const tsl_plan_prediction *ranked, int32_t shown, int32_t fit, int32_t total)
{
    printf("plan auto: %d of %d candidate plans ranked (those in the memory budget, recompute=1 "
           "only where the plan without it is not); the best predicted:\n",
           (int)fit, (int)total);
    printf("  %-36s %12s %12s %12s  %s\n", "plan", "s/step", "peak MiB", "MB/step", "binding");
    for (int32_t i = 0; i < shown; i++) {
        char text[256];
        tsl_plan_format(&ranked[i].plan, text, sizeof text);
        printf("  %-36s %12.4g %12.1f %12.2f  %s\n", text, ranked[i].seconds,
               (double)ranked[i].peak_bytes / 1048576.0, (double)ranked[i].sent_bytes / 1e6,
               tsl_plan_term_name(ranked[i].binding));
    }
}
