/* Operator codelet path against direct library calls on the same shape and thread count.
 * Rows so far: linear (OpenBLAS). Forward, and backward (data + weights), in GFLOP/s.
 *
 *   STARPU_NCPU=1 ./bench_ops 1     one worker, one tile, against OpenBLAS on one thread
 *   STARPU_NCPU=2 ./bench_ops 2     two workers, two sample tiles, against two threads
 *
 * Median of 7 runs after a warm-up. */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "tessel/tessel.h"

#define RUNS 7

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static int compare(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

#define CHECK(call)                                                                                \
    do {                                                                                           \
        tsl_status st_ = (call);                                                                   \
        if (st_) {                                                                                 \
            fprintf(stderr, "%s: %s\n", #call, tsl_last_error());                                  \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

int main(int argc, char **argv)
{
    int threads = argc > 1 ? atoi(argv[1]) : 1;
    if (threads < 1)
        threads = 1;
    const int n = 256, k = 4096, o = 1024;
    const double flops = 2.0 * n * k * o;

    /* Direct OpenBLAS first, before StarPU's workers exist. */
    float *x = malloc(sizeof(float) * n * k), *w = malloc(sizeof(float) * o * k);
    float *y = malloc(sizeof(float) * n * o), *dx = malloc(sizeof(float) * n * k);
    float *dw = malloc(sizeof(float) * o * k);
    for (long i = 0; i < (long)n * k; i++)
        x[i] = (float)((i * 7) % 13) * 0.01f;
    for (long i = 0; i < (long)o * k; i++)
        w[i] = (float)((i * 5) % 11) * 0.01f;
    openblas_set_num_threads(threads);
    double t_fwd[RUNS], t_bwd[RUNS], d_fwd[RUNS], d_bwd[RUNS];
    for (int r = -1; r < RUNS; r++) {
        double t0 = now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, o, k, 1, x, k, w, k, 0, y, o);
        double t1 = now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, k, o, 1, y, o, w, k, 0, dx, k);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, o, k, n, 1, y, o, x, k, 0, dw, k);
        double t2 = now();
        if (r >= 0) {
            d_fwd[r] = t1 - t0;
            d_bwd[r] = t2 - t1;
        }
    }

    tsl_context_t ctx;
    CHECK(tsl_context_create(&ctx, NULL));
    int32_t ncpu;
    tsl_context_worker_count(ctx, TSL_WORKER_CPU, &ncpu);
    int64_t xd[2] = {n, k}, wd[2] = {o, k}, yd[2] = {n, o};
    tsl_shape xs, ws, ys;
    tsl_shape_make(&xs, 2, xd);
    tsl_shape_make(&ws, 2, wd);
    tsl_shape_make(&ys, 2, yd);
    tsl_tile_grid rows = tsl_tile_grid_single();
    rows.splits[0] = threads;
    tsl_tensor_t tx, tw, ty, tdy, tdx, tdw;
    CHECK(tsl_tensor_create(&tx, ctx, TSL_F32, &xs, &rows, NULL));
    CHECK(tsl_tensor_create(&tw, ctx, TSL_F32, &ws, NULL, NULL));
    CHECK(tsl_tensor_create(&ty, ctx, TSL_F32, &ys, &rows, NULL));
    CHECK(tsl_tensor_create(&tdy, ctx, TSL_F32, &ys, &rows, NULL));
    CHECK(tsl_tensor_create(&tdx, ctx, TSL_F32, &xs, &rows, NULL));
    CHECK(tsl_tensor_create(&tdw, ctx, TSL_F32, &ws, NULL, NULL));
    CHECK(tsl_tensor_fill_uniform(tx, 1, -1, 1));
    CHECK(tsl_tensor_fill_uniform(tw, 2, -1, 1));
    CHECK(tsl_tensor_fill_uniform(tdy, 3, -1, 1));
    CHECK(tsl_context_wait(ctx));
    for (int r = -1; r < RUNS; r++) {
        double t0 = now();
        CHECK(tsl_linear_forward(tx, tw, NULL, ty));
        CHECK(tsl_context_wait(ctx));
        double t1 = now();
        CHECK(tsl_linear_backward(tx, tw, tdy, tdx, tdw, NULL));
        CHECK(tsl_context_wait(ctx));
        double t2 = now();
        if (r >= 0) {
            t_fwd[r] = t1 - t0;
            t_bwd[r] = t2 - t1;
        }
    }
    qsort(t_fwd, RUNS, sizeof(double), compare);
    qsort(t_bwd, RUNS, sizeof(double), compare);
    qsort(d_fwd, RUNS, sizeof(double), compare);
    qsort(d_bwd, RUNS, sizeof(double), compare);
    double tf = flops / t_fwd[RUNS / 2] / 1e9, tb = 2 * flops / t_bwd[RUNS / 2] / 1e9;
    double df = flops / d_fwd[RUNS / 2] / 1e9, db = 2 * flops / d_bwd[RUNS / 2] / 1e9;
    printf("linear N=%d K=%d O=%d f32: %d CPU workers, %d sample tiles; OpenBLAS on %d "
           "threads\n",
           n, k, o, (int)ncpu, threads, threads);
    printf("%-10s %12s %12s %8s\n", "pass", "tessel GF/s", "direct GF/s", "ratio");
    printf("%-10s %12.1f %12.1f %8.3f\n", "forward", tf, df, tf / df);
    printf("%-10s %12.1f %12.1f %8.3f\n", "backward", tb, db, tb / db);
    tsl_tensor_t all[6] = {tx, tw, ty, tdy, tdx, tdw};
    for (int i = 0; i < 6; i++)
        tsl_tensor_destroy(all[i]);
    tsl_context_destroy(ctx);
    free(x);
    free(w);
    free(y);
    free(dx);
    free(dw);
    return 0;
}
