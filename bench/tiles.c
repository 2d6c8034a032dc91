/* Foundation costs: tile-task overhead, scatter/gather and redistribution throughput, and
 * the exact sum against a plain double loop.
 *
 *   mpirun -np R ./bench_tiles [MiB]      (default 64 MiB of f32)
 *
 * Each row is the median of 7 runs after one warm-up; rank 0 prints. Times are wall clock
 * from a barrier before submission to completion on every rank. */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "tessel/starpu.h"
#include "tessel/tessel.h"

#define RUNS 7

int main(int argc, char **argv)
{
    tsl_context_t ctx;
    CHECK_ALL(tsl_context_create(&ctx, NULL));
    int32_t rank, size, ncpu;
    tsl_context_rank(ctx, &rank);
    tsl_context_size(ctx, &size);
    tsl_context_worker_count(ctx, TSL_WORKER_CPU, &ncpu);
    int64_t mib = argc > 1 ? atoll(argv[1]) : 64;
    if (mib < 1)
        mib = 64;
    int64_t numel = mib * 1024 * 1024 / 4;
    /* N=16 images of C=16 x H x W with H = W, as large as mib allows. */
    int64_t side = (int64_t)sqrt((double)numel / 256.0);
    int64_t dims[4] = {16, 16, side, side};
    tsl_shape shape;
    CHECK_ALL(tsl_shape_make(&shape, 4, dims));
    numel = tsl_shape_numel(&shape);
    double bytes = (double)numel * 4;

    /* Layout A: 4 x 4 spatial tiles, boxes of tiles over a 2-D rank grid.
     * Layout B: 16 row bands dealt round the ranks. */
    tsl_tile_grid grid_a = tsl_tile_grid_single(), grid_b = tsl_tile_grid_single();
    grid_a.splits[2] = 4;
    grid_a.splits[3] = 4;
    grid_b.splits[2] = 16;
    int32_t pgrid[TSL_MAX_DIMS] = {1, 1, size >= 2 ? 2 : 1, size >= 4 ? size / 2 : 1, 1};
    int32_t ring[TSL_MAX_DIMS] = {1, 1, size, 1, 1}, one[TSL_MAX_DIMS] = {1, 1, 1, 1, 1};
    tsl_owner_map boxes = tsl_owner_block(pgrid), dealt = tsl_owner_block_cyclic(ring, one);
    tsl_tensor_t a, b;
    CHECK_ALL(tsl_tensor_create(&a, ctx, TSL_F32, &shape, &grid_a, &boxes));
    CHECK_ALL(tsl_tensor_create(&b, ctx, TSL_F32, &shape, &grid_b, &dealt));
    float *whole = NULL;
    if (rank == 0) {
        whole = malloc((size_t)numel * sizeof *whole);
        for (int64_t i = 0; i < numel; i++)
            whole[i] = (float)((i * 7919) % 1000) * 1e-3f;
    }

    double t_scatter[RUNS], t_gather[RUNS], t_redist[RUNS], t_fill[RUNS], t_sum[RUNS];
    double t_tiny[RUNS], t_plain[RUNS];
    double sum = 0;
    for (int run = -1; run < RUNS; run++) {
        int r = run < 0 ? 0 : run;
        double t0;
#define TIMED(slot, body)                                                                          \
    do {                                                                                           \
        MPI_Barrier(MPI_COMM_WORLD);                                                               \
        t0 = bench_now();                                                                          \
        body;                                                                                      \
        CHECK_ALL(tsl_context_wait(ctx));                                                          \
        slot[r] = bench_now() - t0;                                                                \
    } while (0)
        TIMED(t_scatter, CHECK_ALL(tsl_tensor_scatter(a, 0, whole)));
        TIMED(t_gather, CHECK_ALL(tsl_tensor_gather(a, 0, whole)));
        TIMED(t_redist, CHECK_ALL(tsl_tensor_redistribute(b, a)));
        TIMED(t_fill, CHECK_ALL(tsl_tensor_fill_normal(a, (uint64_t)run, 0.0, 1.0)));
        TIMED(t_sum, CHECK_ALL(tsl_tensor_sum(a, &sum)));
        /* The same sum as a plain double loop over the local tiles, one thread per rank. */
        MPI_Barrier(MPI_COMM_WORLD);
        t0 = bench_now();
        double local = 0;
        int64_t ntiles;
        tsl_tensor_tile_count(a, &ntiles);
        for (int64_t i = 0; i < ntiles; i++) {
            int32_t owner;
            tsl_tensor_tile_info(a, i, NULL, &owner, NULL, NULL);
            if (owner != rank)
                continue;
            starpu_data_handle_t h;
            tsl_tensor_tile_handle(a, i, &h);
            starpu_data_acquire(h, STARPU_R);
            const float *p = starpu_data_get_local_ptr(h);
            size_t n = starpu_vector_get_nx(h);
            for (size_t k = 0; k < n; k++)
                local += p[k];
            starpu_data_release(h);
        }
        double total = 0;
        MPI_Allreduce(&local, &total, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        t_plain[r] = bench_now() - t0;
    }

    /* Task overhead: 4096 one-element-per-row tiles, one scale task each. */
    int64_t tiny_dims[2] = {4096, 16};
    tsl_shape tiny_shape;
    CHECK_ALL(tsl_shape_make(&tiny_shape, 2, tiny_dims));
    tsl_tile_grid tiny_grid = tsl_tile_grid_single();
    tiny_grid.splits[0] = 4096;
    tsl_tensor_t tiny;
    CHECK_ALL(tsl_tensor_create(&tiny, ctx, TSL_F32, &tiny_shape, &tiny_grid, NULL));
    for (int run = -1; run < RUNS; run++) {
        int r = run < 0 ? 0 : run;
        double t0;
        TIMED(t_tiny, CHECK_ALL(tsl_tensor_scale(tiny, 1.0001)));
    }

    if (rank == 0) {
        double gib = bytes / (1024.0 * 1024.0 * 1024.0);
        printf("tessel bench_tiles: %d ranks x %d CPU workers, f32 tensor 16x16x%lldx%lld "
               "(%.0f MiB)\n",
               (int)size, (int)ncpu, (long long)side, (long long)side, bytes / 1048576.0);
        printf("%-44s %10s %12s\n", "operation", "median s", "rate");
        printf("%-44s %10.4f %9.2f GiB/s\n", "scatter from rank 0 (16 tiles)",
               bench_median(t_scatter, RUNS), gib / bench_median(t_scatter, RUNS));
        printf("%-44s %10.4f %9.2f GiB/s\n", "gather to rank 0 (16 tiles)",
               bench_median(t_gather, RUNS), gib / bench_median(t_gather, RUNS));
        printf("%-44s %10.4f %9.2f GiB/s\n", "redistribute 4x4 boxes -> 16 dealt row bands",
               bench_median(t_redist, RUNS), gib / bench_median(t_redist, RUNS));
        printf("%-44s %10.4f %9.1f Melem/s\n", "fill normal (counter-based)",
               bench_median(t_fill, RUNS), numel / bench_median(t_fill, RUNS) / 1e6);
        printf("%-44s %10.4f %9.1f Melem/s\n", "exact sum (accumulators + merge tree)",
               bench_median(t_sum, RUNS), numel / bench_median(t_sum, RUNS) / 1e6);
        printf("%-44s %10.4f %9.1f Melem/s\n", "plain double loop + MPI_Allreduce",
               bench_median(t_plain, RUNS), numel / bench_median(t_plain, RUNS) / 1e6);
        printf("%-44s %10.4f %9.2f us/task\n", "4096 tiny scale tasks", bench_median(t_tiny, RUNS),
               bench_median(t_tiny, RUNS) / 4096 * 1e6);
    }
    free(whole);
    tsl_tensor_destroy(tiny);
    tsl_tensor_destroy(b);
    tsl_tensor_destroy(a);
    tsl_context_destroy(ctx);
    return 0;
}
