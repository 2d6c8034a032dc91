/* Gradient reduction alone: tessel's reduce-scatter, sharded update and allgather as tasks
 * (what a data-parallel step does with a sharded weight) against MPI_Allreduce of the same
 * bytes followed by the same SGD update on every rank, measured in one run.
 *
 *   mpirun -np R ./bench_reduce [--host-cache-mib M] [MiB...]      (default 1 16 64 256)
 *
 * --host-cache-mib: the context's host cache limit (tsl_context_config::host_cache_bytes,
 * default 32 MiB); the pieces cut, received and freed each step are reused from the cache as
 * far as the limit holds them.
 *
 * tessel: every rank holds its partial gradient as one row of an (R, n) tensor; the sum goes
 * to a gradient cut into R shards (tsl_tensor_sum_rows), SGD updates each shard where it
 * lives (tsl_optimizer_step), and every rank rebuilds its whole copy of the parameters from
 * the shards (tsl_tensor_redistribute into a one-tile tensor it owns). MPI: MPI_Allreduce
 * (in place, sum) of the n floats, then p -= lr g over all n on every rank. Each row is the
 * median of 5 runs after one warm-up, wall clock from a barrier to completion on every rank;
 * rank 0 prints. Both results are checked against each other. */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "tessel/tessel.h"

#define RUNS 5
#define LR 0.01f

int main(int argc, char **argv)
{
    tsl_context_config cfg;
    CHECK_ALL(tsl_context_config_init(&cfg));
    int first = 1;
    if (argc > 2 && strcmp(argv[1], "--host-cache-mib") == 0) {
        cfg.host_cache_bytes = atoll(argv[2]) * 1024 * 1024;
        first = 3;
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
        printf("host cache %lld MiB\n| MiB | ranks | tessel reduce+update+allgather (ms) | "
               "MPI_Allreduce+update (ms) | tessel / MPI |\n|---|---|---|---|---|\n",
               (long long)(cfg.host_cache_bytes >> 20));
    for (int s = 0; s < nsizes; s++) {
        int64_t n = sizes[s] * 1024 * 1024 / 4;
        tsl_shape rows, flat;
        int64_t rdims[2] = {size, n};
        CHECK_ALL(tsl_shape_make(&rows, 2, rdims));
        CHECK_ALL(tsl_shape_make(&flat, 1, &n));
        tsl_tile_grid by_row = tsl_tile_grid_single(), shards = tsl_tile_grid_single();
        by_row.splits[0] = size;
        shards.splits[0] = size;
        tsl_owner_map block = tsl_owner_block(NULL);
        tsl_tensor_t partial, grad, param, mine, copies[64];
        CHECK_ALL(tsl_tensor_create(&partial, ctx, TSL_F32, &rows, &by_row, &block));
        CHECK_ALL(tsl_tensor_create(&grad, ctx, TSL_F32, &flat, &shards, &block));
        CHECK_ALL(tsl_tensor_create(&param, ctx, TSL_F32, &flat, &shards, &block));
        for (int32_t r = 0; r < size && r < 64; r++) {
            tsl_owner_map on = tsl_owner_single(r);
            CHECK_ALL(tsl_tensor_create(&copies[r], ctx, TSL_F32, &flat, NULL, &on));
        }
        mine = copies[rank];
        CHECK_ALL(tsl_tensor_fill_uniform(partial, 7, -1, 1));
        CHECK_ALL(tsl_tensor_fill_uniform(param, 8, -1, 1));
        /* The MPI side starts from the same values: this rank's row and the parameters. */
        float *g = malloc((size_t)n * sizeof *g), *p = malloc((size_t)n * sizeof *p);
        float *rowbuf = rank == 0 ? malloc((size_t)(n * size) * sizeof *rowbuf) : NULL;
        if (!g || !p || (rank == 0 && !rowbuf))
            MPI_Abort(MPI_COMM_WORLD, 1);
        CHECK_ALL(tsl_tensor_gather(partial, 0, rowbuf));
        MPI_Scatter(rowbuf, (int)n, MPI_FLOAT, g, (int)n, MPI_FLOAT, 0, MPI_COMM_WORLD);
        CHECK_ALL(tsl_tensor_gather(param, 0, p));
        MPI_Bcast(p, (int)n, MPI_FLOAT, 0, MPI_COMM_WORLD);
        float *g0 = malloc((size_t)n * sizeof *g0);
        if (!g0)
            MPI_Abort(MPI_COMM_WORLD, 1);
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
            CHECK_ALL(tsl_tensor_sum_rows(grad, partial));
            CHECK_ALL(tsl_optimizer_step(opt, 1, &param, &grad));
            for (int32_t r = 0; r < size; r++)
                CHECK_ALL(tsl_tensor_redistribute(copies[r], param));
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
        /* Both took the same RUNS + 1 steps from the same start: compare this rank's copy. */
        float *got = malloc((size_t)n * sizeof *got);
        if (!got)
            MPI_Abort(MPI_COMM_WORLD, 1);
        CHECK_ALL(tsl_tensor_gather(mine, rank, got));
        double worst = 0;
        for (int64_t i = 0; i < n; i++)
            worst = fmax(worst, fabs((double)got[i] - p[i]));
        double all = 0;
        MPI_Reduce(&worst, &all, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
        double a = bench_median(tt, RUNS), b = bench_median(tm, RUNS);
        if (rank == 0)
            printf("| %lld | %d | %.1f | %.1f | %.2f |   (max difference %.1e)\n",
                   (long long)sizes[s], (int)size, 1e3 * a, 1e3 * b, a / b, all);
        fflush(stdout);
        free(got);
        free(g0);
        free(g);
        free(p);
        free(rowbuf);
        tsl_optimizer_destroy(opt);
        for (int32_t r = 0; r < size; r++)
            tsl_tensor_destroy(copies[r]);
        tsl_tensor_destroy(partial);
        tsl_tensor_destroy(grad);
        tsl_tensor_destroy(param);
    }
    tsl_context_destroy(ctx);
    return 0;
}
