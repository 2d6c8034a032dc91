/* Operator codelet path against direct library calls on the same shape and thread count.
 * Rows so far: linear (OpenBLAS), forward and backward (data + weights) in GFLOP/s; batch
 * norm + ReLU on the conv2d output shape (oneDNN, plain NCHW, fused ReLU, against tessel's
 * fused tsl_batchnorm_relu_* calls; tessel's unfused batch norm then ReLU for reference),
 * training forward and backward in milliseconds.
 *
 *   STARPU_NCPU=1 OMP_NUM_THREADS=1 ./bench_ops 1   one worker, one tile, one library thread
 *   STARPU_NCPU=2 OMP_NUM_THREADS=2 ./bench_ops 2   two workers, two sample tiles, two threads
 *
 * With T > 1 the linear layer's weight gradient is cut into T row blocks (one task per block
 * reads every sample tile: no partial of the whole matrix, no merge).
 *
 * Median of 7 runs after a warm-up. */
#include <cblas.h>
#include <dnnl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_dnnl.h"
#include "bench_util.h"
#include "codelets/conv.h"
#include "tessel/tessel.h"

#define RUNS 7

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
        double t0 = bench_now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, o, k, 1, x, k, w, k, 0, y, o);
        double t1 = bench_now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, k, o, 1, y, o, w, k, 0, dx, k);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, o, k, n, 1, y, o, x, k, 0, dw, k);
        double t2 = bench_now();
        if (r >= 0) {
            d_fwd[r] = t1 - t0;
            d_bwd[r] = t2 - t1;
        }
    }

    /* Direct oneDNN batch norm + fused ReLU, training forward and backward, plain NCHW. */
    const int bn_n = 8, bn_c = 16, bn_h = 128, bn_w = 128;
    dnnl_engine_t engine;
    dnnl_stream_t stream;
    DNNL_CHECK(dnnl_engine_create(&engine, dnnl_cpu, 0));
    DNNL_CHECK(dnnl_stream_create(&stream, engine, dnnl_stream_default_flags));
    dnnl_dims_t bn_dims = {bn_n, bn_c, bn_h, bn_w}, c_dims = {bn_c};
    dnnl_memory_desc_t data_md, c_md;
    DNNL_CHECK(dnnl_memory_desc_init_by_tag(&data_md, 4, bn_dims, dnnl_f32, dnnl_nchw));
    DNNL_CHECK(dnnl_memory_desc_init_by_tag(&c_md, 1, c_dims, dnnl_f32, dnnl_a));
    unsigned flags = dnnl_use_scale | dnnl_use_shift | dnnl_fuse_norm_relu;
    dnnl_batch_normalization_desc_t fd, bd;
    DNNL_CHECK(dnnl_batch_normalization_forward_desc_init(&fd, dnnl_forward_training, &data_md,
                                                          1e-5f, flags));
    DNNL_CHECK(dnnl_batch_normalization_backward_desc_init(&bd, dnnl_backward, &data_md, &data_md,
                                                           1e-5f, flags));
    dnnl_primitive_desc_t fpd, bpd;
    DNNL_CHECK(dnnl_primitive_desc_create(&fpd, &fd, NULL, engine, NULL));
    DNNL_CHECK(dnnl_primitive_desc_create(&bpd, &bd, NULL, engine, fpd));
    const dnnl_memory_desc_t *ws_md = dnnl_primitive_desc_query_md(fpd, dnnl_query_workspace_md, 0);
    dnnl_memory_t m_src, m_dst, m_dsrc, m_ddst, m_scale, m_shift, m_mean, m_var, m_ws, m_dscale,
        m_dshift;
    dnnl_memory_t *data_mems[4] = {&m_src, &m_dst, &m_dsrc, &m_ddst};
    for (int i = 0; i < 4; i++)
        DNNL_CHECK(dnnl_memory_create(data_mems[i], &data_md, engine, DNNL_MEMORY_ALLOCATE));
    dnnl_memory_t *c_mems[6] = {&m_scale, &m_shift, &m_mean, &m_var, &m_dscale, &m_dshift};
    for (int i = 0; i < 6; i++)
        DNNL_CHECK(dnnl_memory_create(c_mems[i], &c_md, engine, DNNL_MEMORY_ALLOCATE));
    DNNL_CHECK(dnnl_memory_create(&m_ws, ws_md, engine, DNNL_MEMORY_ALLOCATE));
    for (int i = 0; i < 4; i++) {
        float *p;
        DNNL_CHECK(dnnl_memory_get_data_handle(*data_mems[i], (void **)&p));
        for (long j = 0; j < (long)bn_n * bn_c * bn_h * bn_w; j++)
            p[j] = (float)((j * 7919 + i) % 1000) * 1e-3f - 0.3f;
    }
    for (int i = 0; i < 2; i++) {
        float *p;
        DNNL_CHECK(dnnl_memory_get_data_handle(*c_mems[i], (void **)&p));
        for (int j = 0; j < bn_c; j++)
            p[j] = 1.0f - 0.01f * j;
    }
    dnnl_primitive_t bn_fwd, bn_bwd;
    DNNL_CHECK(dnnl_primitive_create(&bn_fwd, fpd));
    DNNL_CHECK(dnnl_primitive_create(&bn_bwd, bpd));
    dnnl_exec_arg_t fargs[7] = {{DNNL_ARG_SRC, m_src},     {DNNL_ARG_DST, m_dst},
                                {DNNL_ARG_SCALE, m_scale}, {DNNL_ARG_SHIFT, m_shift},
                                {DNNL_ARG_MEAN, m_mean},   {DNNL_ARG_VARIANCE, m_var},
                                {DNNL_ARG_WORKSPACE, m_ws}};
    dnnl_exec_arg_t bargs[10] = {{DNNL_ARG_SRC, m_src},           {DNNL_ARG_DIFF_DST, m_ddst},
                                 {DNNL_ARG_MEAN, m_mean},         {DNNL_ARG_VARIANCE, m_var},
                                 {DNNL_ARG_SCALE, m_scale},       {DNNL_ARG_SHIFT, m_shift},
                                 {DNNL_ARG_WORKSPACE, m_ws},      {DNNL_ARG_DIFF_SRC, m_dsrc},
                                 {DNNL_ARG_DIFF_SCALE, m_dscale}, {DNNL_ARG_DIFF_SHIFT, m_dshift}};
    double bn_dfwd[RUNS], bn_dbwd[RUNS], bn_tfwd[RUNS], bn_tbwd[RUNS], bn_ufwd[RUNS], bn_ubwd[RUNS];
    for (int r = -1; r < RUNS; r++) {
        double t0 = bench_now();
        DNNL_CHECK(dnnl_primitive_execute(bn_fwd, stream, 7, fargs));
        DNNL_CHECK(dnnl_stream_wait(stream));
        double t1 = bench_now();
        DNNL_CHECK(dnnl_primitive_execute(bn_bwd, stream, 10, bargs));
        DNNL_CHECK(dnnl_stream_wait(stream));
        double t2 = bench_now();
        if (r >= 0) {
            bn_dfwd[r] = t1 - t0;
            bn_dbwd[r] = t2 - t1;
        }
    }

    /* Direct convolution: the oneDNN kernel tessel's codelets call (plain layout), on the
     * whole batch, timed before StarPU starts. The kernel keeps its thread to one OpenMP
     * thread, so this is the one-thread reference in both configurations. */
    tsl_conv_args ca;
    memset(&ca, 0, sizeof ca);
    ca.spatial = 2;
    ca.samples = 8;
    ca.in_channels = ca.out_channels = 16;
    ca.groups = 1;
    for (int d = 0; d < 2; d++) {
        ca.in_size[d] = ca.out_size[d] = 128;
        ca.kernel[d] = 3;
        ca.stride[d] = ca.dilation[d] = ca.padding[d] = 1;
    }
    size_t act = 8 * 16 * 128 * 128, wts = 16 * 16 * 9;
    float *cx = malloc(act * 4), *cy = malloc(act * 4), *cdx = malloc(act * 4);
    float *cw = malloc(wts * 4), *cdw = malloc(wts * 4);
    for (size_t i = 0; i < act; i++)
        cx[i] = (float)(i % 97) * 0.01f;
    for (size_t i = 0; i < wts; i++)
        cw[i] = (float)(i % 13) * 0.01f;
    double cv_d[RUNS], cv_t[RUNS];
    for (int r = -1; r < RUNS; r++) {
        double t0 = bench_now();
        tsl_conv_forward_kernel(&ca, cx, cw, NULL, cy);
        tsl_conv_backward_data_kernel(&ca, cy, cw, cdx);
        tsl_conv_backward_weights_kernel(&ca, cx, cy, cdw, NULL);
        if (r >= 0)
            cv_d[r] = bench_now() - t0;
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
    CHECK(tsl_tensor_create(&tdw, ctx, TSL_F32, &ws, &rows, NULL));
    CHECK(tsl_tensor_fill_uniform(tx, 1, -1, 1));
    CHECK(tsl_tensor_fill_uniform(tw, 2, -1, 1));
    CHECK(tsl_tensor_fill_uniform(tdy, 3, -1, 1));
    CHECK(tsl_context_wait(ctx));
    for (int r = -1; r < RUNS; r++) {
        double t0 = bench_now();
        CHECK(tsl_linear_forward(tx, tw, NULL, ty));
        CHECK(tsl_context_wait(ctx));
        double t1 = bench_now();
        CHECK(tsl_linear_backward(tx, tw, tdy, tdx, tdw, NULL));
        CHECK(tsl_context_wait(ctx));
        double t2 = bench_now();
        if (r >= 0) {
            t_fwd[r] = t1 - t0;
            t_bwd[r] = t2 - t1;
        }
    }
    /* tessel: batch norm (exact statistics) + ReLU fused, and unfused (batch norm then ReLU;
     * backward ReLU then batch norm) for reference. */
    int64_t bd4[4] = {bn_n, bn_c, bn_h, bn_w}, cd1[1] = {bn_c}, sd2[2] = {2, bn_c};
    tsl_shape bs, cs, ss;
    tsl_shape_make(&bs, 4, bd4);
    tsl_shape_make(&cs, 1, cd1);
    tsl_shape_make(&ss, 2, sd2);
    tsl_tile_grid samples = tsl_tile_grid_single();
    samples.splits[0] = threads;
    tsl_tensor_t bx, bz, by, bdy, bdz, bdx, gm, bt, rm, rv, sv, dg, dbt;
    tsl_tensor_t *big[6] = {&bx, &bz, &by, &bdy, &bdz, &bdx};
    for (int i = 0; i < 6; i++)
        CHECK(tsl_tensor_create(big[i], ctx, TSL_F32, &bs, &samples, NULL));
    tsl_tensor_t *small[6] = {&gm, &bt, &rm, &rv, &dg, &dbt};
    for (int i = 0; i < 6; i++)
        CHECK(tsl_tensor_create(small[i], ctx, TSL_F32, &cs, NULL, NULL));
    CHECK(tsl_tensor_create(&sv, ctx, TSL_F64, &ss, NULL, NULL));
    CHECK(tsl_tensor_fill_normal(bx, 4, 0.2, 1.0));
    CHECK(tsl_tensor_fill_normal(bdy, 5, 0.0, 1.0));
    CHECK(tsl_tensor_fill_constant(gm, 1.0));
    CHECK(tsl_tensor_fill_constant(rv, 1.0));
    CHECK(tsl_context_wait(ctx));
    for (int r = -1; r < RUNS; r++) {
        double t0 = bench_now();
        CHECK(tsl_batchnorm_relu_forward_train(bx, gm, bt, rm, rv, sv, by, 1e-5, 0.1));
        CHECK(tsl_context_wait(ctx));
        double t1 = bench_now();
        CHECK(tsl_batchnorm_relu_backward(bx, bdy, gm, bt, sv, bdx, dg, dbt));
        CHECK(tsl_context_wait(ctx));
        double t2 = bench_now();
        CHECK(tsl_batchnorm_forward_train(bx, gm, bt, rm, rv, sv, bz, 1e-5, 0.1));
        CHECK(tsl_activation_forward(TSL_ACT_RELU, 0, bz, by));
        CHECK(tsl_context_wait(ctx));
        double t3 = bench_now();
        CHECK(tsl_activation_backward(TSL_ACT_RELU, 0, bz, NULL, bdy, bdz));
        CHECK(tsl_batchnorm_backward(bx, bdz, gm, sv, bdx, dg, dbt));
        CHECK(tsl_context_wait(ctx));
        double t4 = bench_now();
        if (r >= 0) {
            bn_tfwd[r] = t1 - t0;
            bn_tbwd[r] = t2 - t1;
            bn_ufwd[r] = t3 - t2;
            bn_ubwd[r] = t4 - t3;
        }
    }
    /* tessel convolution: forward + backward through tasks, sample tiles. */
    {
        tsl_conv_params cp;
        tsl_conv_params_init(&cp, 2);
        cp.padding[0] = cp.padding[1] = 1;
        int64_t xd4[4] = {8, 16, 128, 128}, wd4[4] = {16, 16, 3, 3};
        tsl_shape cxs, cws;
        tsl_shape_make(&cxs, 4, xd4);
        tsl_shape_make(&cws, 4, wd4);
        tsl_tensor_t tcx, tcy, tcdx, tcw, tcdw;
        CHECK(tsl_tensor_create(&tcx, ctx, TSL_F32, &cxs, &samples, NULL));
        CHECK(tsl_tensor_create(&tcy, ctx, TSL_F32, &cxs, &samples, NULL));
        CHECK(tsl_tensor_create(&tcdx, ctx, TSL_F32, &cxs, &samples, NULL));
        CHECK(tsl_tensor_create(&tcw, ctx, TSL_F32, &cws, NULL, NULL));
        CHECK(tsl_tensor_create(&tcdw, ctx, TSL_F32, &cws, NULL, NULL));
        CHECK(tsl_tensor_fill_uniform(tcx, 7, -1, 1));
        CHECK(tsl_tensor_fill_uniform(tcw, 8, -1, 1));
        CHECK(tsl_context_wait(ctx));
        for (int r = -1; r < RUNS; r++) {
            double t0 = bench_now();
            CHECK(tsl_conv_forward(&cp, tcx, tcw, NULL, tcy));
            CHECK(tsl_conv_backward(&cp, tcx, tcw, tcy, tcdx, tcdw, NULL));
            CHECK(tsl_context_wait(ctx));
            if (r >= 0)
                cv_t[r] = bench_now() - t0;
        }
        tsl_tensor_t all[5] = {tcx, tcy, tcdx, tcw, tcdw};
        for (int i = 0; i < 5; i++)
            tsl_tensor_destroy(all[i]);
    }
    qsort(t_fwd, RUNS, sizeof(double), bench_compare);
    qsort(t_bwd, RUNS, sizeof(double), bench_compare);
    qsort(d_fwd, RUNS, sizeof(double), bench_compare);
    qsort(d_bwd, RUNS, sizeof(double), bench_compare);
    double tf = flops / t_fwd[RUNS / 2] / 1e9, tb = 2 * flops / t_bwd[RUNS / 2] / 1e9;
    double df = flops / d_fwd[RUNS / 2] / 1e9, db = 2 * flops / d_bwd[RUNS / 2] / 1e9;
    printf("linear N=%d K=%d O=%d f32: %d CPU workers, %d sample tiles, dw in %d row blocks; "
           "OpenBLAS on %d threads\n",
           n, k, o, (int)ncpu, threads, threads, threads);
    printf("%-10s %12s %12s %8s\n", "pass", "tessel GF/s", "direct GF/s", "ratio");
    printf("%-10s %12.1f %12.1f %8.3f\n", "forward", tf, df, tf / df);
    printf("%-10s %12.1f %12.1f %8.3f\n", "backward", tb, db, tb / db);
    double bf = 1e3 * bench_median(bn_tfwd, RUNS), bdf = 1e3 * bench_median(bn_dfwd, RUNS);
    double bb = 1e3 * bench_median(bn_tbwd, RUNS), bdb = 1e3 * bench_median(bn_dbwd, RUNS);
    double uf = 1e3 * bench_median(bn_ufwd, RUNS), ub = 1e3 * bench_median(bn_ubwd, RUNS);
    printf("batch norm + ReLU, f32 %dx%dx%dx%d, oneDNN plain NCHW with fused ReLU\n", bn_n, bn_c,
           bn_h, bn_w);
    printf("%-18s %12s %12s %8s\n", "pass", "tessel ms", "direct ms", "ratio");
    printf("%-18s %12.2f %12.2f %8.3f\n", "forward", bf, bdf, bdf / bf);
    printf("%-18s %12.2f %12.2f %8.3f\n", "backward", bb, bdb, bdb / bb);
    printf("%-18s %12.2f %12.2f %8.3f\n", "forward, unfused", uf, bdf, bdf / uf);
    printf("%-18s %12.2f %12.2f %8.3f\n", "backward, unfused", ub, bdb, bdb / ub);
    double cvt = 1e3 * bench_median(cv_t, RUNS), cvd = 1e3 * bench_median(cv_d, RUNS);
    printf("conv2d N=8 C=16->16 128x128 k3 p1, forward + backward (plain layout)\n");
    printf("%-10s %12s %20s %8s\n", "pass", "tessel ms", "kernel, 1 thread ms", "ratio");
    printf("%-10s %12.2f %20.2f %8.3f\n", "fwd+bwd", cvt, cvd, cvd / cvt);
    for (int i = 0; i < 6; i++) {
        tsl_tensor_destroy(*big[i]);
        tsl_tensor_destroy(*small[i]);
    }
    tsl_tensor_destroy(sv);
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
