/* Gradient reduction alone: tessel's reduce-scatter, sharded update and allgather as tasks
 * (what a data-parallel step does with its parameters) against MPI_Allreduce of the same
 * bytes followed by the same SGD update on every rank, measured in one run.
 *
 *   mpirun -np R ./bench_reduce [--host-cache-mib M] [--params K] [--packed] [MiB...]
 *                                                                  (default 1 16 64 256)
 *
 * --host-cache-mib: the context's host cache limit (tsl_context_config::host_cache_bytes,
 * default 32 MiB); the pieces cut, received and freed each step are reused from the cache as
 * far as the limit holds them.
 * --params K: the set is K parameters of equal size (default 1). As in a model, one of at
 * least 4096 elements is cut into R shards; a smaller one is one tile, on rank k mod R.
 * --packed: the small parameters' gradients and copies travel packed, one message per owner
 * (tsl_tensors_sum_rows, tsl_tensors_redistribute), as a model's buckets do; without it, one
 * message per parameter (tsl_tensor_sum_rows, tsl_tensor_redistribute).
 *
 * tessel: every rank holds its partial gradient of each parameter as one row of an (R, n)
 * tensor; the sum goes to the gradient (tsl_tensor_sum_rows: for a sharded one, reduce-scatter
 * by placement), SGD updates each tile where it lives (tsl_optimizer_step), and every rank
 * rebuilds its whole copy of the parameters (tsl_tensor_redistribute into a one-tile tensor
 * it owns). MPI: MPI_Allreduce (in place, sum) of all n floats at once, then p -= lr g over
 * all n on every rank. Each row is the median of 5 runs after one warm-up, wall clock from a
 * barrier to completion on every rank; rank 0 prints. Both results are checked against each
 * other. */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "tessel/tessel.h"

#define RUNS 5
#define LR 0.01f
#define SHARD_MIN 4096

/* One parameter: partial gradient rows, gradient, value and each rank's whole copy. */
typedef struct set {
    int64_t len;
    tsl_tensor_t partial, grad, param, copies[64];
} set;

static void param_make(tsl_context_t ctx, set *ps, int64_t len, int64_t index, int32_t size)
{
    ps->len = len;
    tsl_shape rows, flat;
    int64_t rdims[2] = {size, len};
    CHECK_ALL(tsl_shape_make(&rows, 2, rdims));
    CHECK_ALL(tsl_shape_make(&flat, 1, &len));
    tsl_tile_grid by_row = tsl_tile_grid_single(), tiles = tsl_tile_grid_single();
    by_row.splits[0] = size;
    int sharded = size > 1 && len >= SHARD_MIN;
    tiles.splits[0] = sharded ? size : 1;
    tsl_owner_map block = tsl_owner_block(NULL), one = tsl_owner_single((int32_t)(index % size)),
                  *where = sharded ? &block : &one;
    CHECK_ALL(tsl_tensor_create(&ps->partial, ctx, TSL_F32, &rows, &by_row, &block));
    CHECK_ALL(tsl_tensor_create(&ps->grad, ctx, TSL_F32, &flat, &tiles, where));
    CHECK_ALL(tsl_tensor_create(&ps->param, ctx, TSL_F32, &flat, &tiles, where));
    for (int32_t r = 0; r < size && r < 64; r++) {
        tsl_owner_map on = tsl_owner_single(r);
        CHECK_ALL(tsl_tensor_create(&ps->copies[r], ctx, TSL_F32, &flat, NULL, &on));
    }
    CHECK_ALL(tsl_tensor_fill_uniform(ps->partial, 7 + 2 * (uint64_t)index, -1, 1));
    CHECK_ALL(tsl_tensor_fill_uniform(ps->param, 8 + 2 * (uint64_t)index, -1, 1));
}

/* The same start for the MPI side: this rank's row into g, the parameters into p. */
static void param_values(set *ps, int32_t rank, int32_t size, float *g, float *p)
{
    float *rows = rank == 0 ? malloc((size_t)(ps->len * size) * sizeof *rows) : NULL;
    if (rank == 0 && !rows)
        MPI_Abort(MPI_COMM_WORLD, 1);
    CHECK_ALL(tsl_tensor_gather(ps->partial, 0, rows));
    MPI_Scatter(rows, (int)ps->len, MPI_FLOAT, g, (int)ps->len, MPI_FLOAT, 0, MPI_COMM_WORLD);
    CHECK_ALL(tsl_tensor_gather(ps->param, 0, p));
    MPI_Bcast(p, (int)ps->len, MPI_FLOAT, 0, MPI_COMM_WORLD);
    free(rows);
}

/* Largest difference between this rank's copy and the MPI side's values. */
static double param_check(set *ps, int32_t rank, const float *p)
{
    float *got = malloc((size_t)ps->len * sizeof *got);
    if (!got)
        MPI_Abort(MPI_COMM_WORLD, 1);
    CHECK_ALL(tsl_tensor_gather(ps->copies[rank], rank, got));
    double worst = 0;
    for (int64_t i = 0; i < ps->len; i++)
        worst = fmax(worst, fabs((double)got[i] - p[i]));
    free(got);
    return worst;
}

static void param_free(set *ps, int32_t size)
{
    for (int32_t r = 0; r < size && r < 64; r++)
        tsl_tensor_destroy(ps->copies[r]);
    tsl_tensor_destroy(ps->partial);
    tsl_tensor_destroy(ps->grad);
    tsl_tensor_destroy(ps->param);
}

int main(int argc, char **argv)
{
    tsl_context_config cfg;
    CHECK_ALL(tsl_context_config_init(&cfg));
    int first = 1, packed = 0;
    int64_t nparams = 1;
    for (;;) {
        if (argc > first + 1 && strcmp(argv[first], "--host-cache-mib") == 0) {
            cfg.host_cache_bytes = atoll(argv[first + 1]) * 1024 * 1024;
            first += 2;
        } else if (argc > first + 1 && strcmp(argv[first], "--params") == 0) {
            nparams = atoll(argv[first + 1]);
            first += 2;
        } else if (argc > first && strcmp(argv[first], "--packed") == 0) {
            packed = 1;
            first++;
        } else {
            break;
        }
    }
    if (nparams < 1) {
        fprintf(stderr, "bench_reduce: --params needs a positive count\n");
        return 1;
    }
    tsl_context_t ctx;
    CHECK_ALL(tsl_context_create(&ctx, &cfg));
    int32_t rank, size;
    tsl_context_rank(ctx, &rank);
    tsl_context_size(ctx, &size);
    int64_t sizes[16] = {1, 16, 64, 256};
    int nsizes = 4;
    if (argc > first) {
        nsizes = 0;
        for (int i = first; i < argc && nsizes < 16; i++)
            if (atoll(argv[i]) > 0)
                sizes[nsizes++] = atoll(argv[i]);
    }
    if (rank == 0)
        printf("host cache %lld MiB, %s\n| MiB | params | ranks | tessel reduce+update+allgather "
               "(ms) | MPI_Allreduce+update (ms) | tessel / MPI |\n|---|---|---|---|---|---|\n",
               (long long)(cfg.host_cache_bytes >> 20),
               packed ? "small parameters packed" : "one message per parameter");
    for (int s = 0; s < nsizes; s++) {
        int64_t n = sizes[s] * 1024 * 1024 / 4;
        set *ps = calloc((size_t)nparams, sizeof *ps);
        tsl_tensor_t *params = calloc((size_t)nparams, sizeof *params);
        tsl_tensor_t *grads = calloc((size_t)nparams, sizeof *grads);
        tsl_tensor_t *partials = calloc((size_t)nparams, sizeof *partials);
        tsl_tensor_t *copies = calloc((size_t)(nparams * size), sizeof *copies);
        tsl_tensor_t *sources = calloc((size_t)(nparams * size), sizeof *sources);
        if (!ps || !params || !grads || !partials || !copies || !sources || size > 64)
            MPI_Abort(MPI_COMM_WORLD, 1);
        /* The MPI side starts from the same values: this rank's rows and the parameters. */
        float *g = malloc((size_t)n * sizeof *g), *p = malloc((size_t)n * sizeof *p);
        float *g0 = malloc((size_t)n * sizeof *g0);
        if (!g || !p || !g0)
            MPI_Abort(MPI_COMM_WORLD, 1);
        int64_t at = 0;
        for (int64_t j = 0; j < nparams; j++) {
            int64_t len = n / nparams + (j < n % nparams);
            param_make(ctx, &ps[j], len, j, size);
            params[j] = ps[j].param;
            grads[j] = ps[j].grad;
            partials[j] = ps[j].partial;
            for (int32_t r = 0; r < size; r++) {
                copies[j * size + r] = ps[j].copies[r];
                sources[j * size + r] = ps[j].param;
            }
            param_values(&ps[j], rank, size, g + at, p + at);
            at += len;
        }
        memcpy(g0, g, (size_t)n * sizeof *g);
        tsl_sgd_config sc;
        tsl_sgd_config_init(&sc);
        sc.lr = LR;
        tsl_optimizer_t opt;
        CHECK_ALL(tsl_optimizer_create_sgd(&opt, ctx, &sc));
        double tt[RUNS], tm[RUNS];
        for (int run = -1; run < RUNS; run++) {
            CHECK_ALL(tsl_context_wait(ctx));
            double t0 = bench_now();
            if (packed)
                CHECK_ALL(tsl_tensors_sum_rows((int32_t)nparams, grads, partials));
            else
                for (int64_t j = 0; j < nparams; j++)
                    CHECK_ALL(tsl_tensor_sum_rows(ps[j].grad, ps[j].partial));
            CHECK_ALL(tsl_optimizer_step(opt, (int32_t)nparams, params, grads));
            if (packed)
                CHECK_ALL(tsl_tensors_redistribute((int32_t)(nparams * size), copies, sources));
            else
                for (int64_t j = 0; j < nparams; j++)
                    for (int32_t r = 0; r < size; r++)
                        CHECK_ALL(tsl_tensor_redistribute(ps[j].copies[r], ps[j].param));
            CHECK_ALL(tsl_context_wait(ctx));
            double t1 = bench_now();
            memcpy(g, g0, (size_t)n * sizeof *g); /* the same partial every run */
            MPI_Barrier(MPI_COMM_WORLD);
            double t2 = bench_now();
            MPI_Allreduce(MPI_IN_PLACE, g, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            for (int64_t i = 0; i < n; i++)
                p[i] -= LR * g[i];
            MPI_Barrier(MPI_COMM_WORLD);
            double t3 = bench_now();
            if (run >= 0) {
                tt[run] = t1 - t0;
                tm[run] = t3 - t2;
            }
        }
        /* Both took the same RUNS + 1 steps from the same start: compare this rank's copies. */
        double worst = 0;
        at = 0;
        for (int64_t j = 0; j < nparams; j++) {
            worst = fmax(worst, param_check(&ps[j], rank, p + at));
            at += ps[j].len;
        }
        double all = 0;
        MPI_Reduce(&worst, &all, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
        double a = bench_median(tt, RUNS), b = bench_median(tm, RUNS);
        if (rank == 0)
            printf("| %lld | %lld | %d | %.1f | %.1f | %.2f |   (max difference %.1e)\n",
                   (long long)sizes[s], (long long)nparams, (int)size, 1e3 * a, 1e3 * b, a / b,
                   all);
        fflush(stdout);
        free(g0);
        free(g);
        free(p);
        tsl_optimizer_destroy(opt);
        for (int64_t j = 0; j < nparams; j++)
            param_free(&ps[j], size);
        free(ps);
        free(params);
        free(grads);
        free(partials);
        free(copies);
        free(sources);
    }
    tsl_context_destroy(ctx);
    return 0;
}
