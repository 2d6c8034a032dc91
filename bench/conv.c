/* Convolution training step (forward with bias, backward data, backward weights and bias)
 * through tessel's tile tasks on channels-last tiles, against direct oneDNN calls on the same
 * shape and thread count.
 *
 *   STARPU_NCPU=1 OMP_NUM_THREADS=1 ./bench_conv 1   one worker, one tile; oneDNN on 1 thread
 *   STARPU_NCPU=2 OMP_NUM_THREADS=2 ./bench_conv 2   two workers, two sample tiles; 2 threads
 *
 * Direct oneDNN is timed two ways, before StarPU starts: "any" (every tensor resident in the
 * layout oneDNN picks for the forward primitive; only the reorders between primitives that
 * want one tensor in two layouts are timed) and "nhwc" (activations resident channels-last,
 * weights reordered from plain and the weight gradient back on every step, as tessel does).
 * The reference for the ratio is the faster of the two. Median of 7 runs after warm-up runs
 * (one direct, three through tasks, so every worker has built its primitives). */
#include <dnnl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_dnnl.h"
#include "bench_util.h"
#include "tessel/tessel.h"

#define RUNS 7

typedef struct shape {
    const char *name;
    int nsp;
    int64_t n, c, o, sp[3], k;
} shape;

static dnnl_engine_t engine;
static dnnl_stream_t stream;

static dnnl_memory_t memory(const dnnl_memory_desc_t *md)
{
    return bench_memory(engine, md, 1);
}

static void reorder(dnnl_memory_t from, dnnl_memory_t to)
{
    const dnnl_memory_desc_t *fmd, *tmd;
    DNNL_CHECK(dnnl_memory_get_memory_desc(from, &fmd));
    DNNL_CHECK(dnnl_memory_get_memory_desc(to, &tmd));
    if (dnnl_memory_desc_equal(fmd, tmd))
        return;
    /* Created per call: oneDNN caches primitives, and both variants pay the same. */
    dnnl_primitive_desc_t pd;
    dnnl_primitive_t p;
    DNNL_CHECK(dnnl_reorder_primitive_desc_create(&pd, fmd, engine, tmd, engine, NULL));
    DNNL_CHECK(dnnl_primitive_create(&p, pd));
    dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}};
    DNNL_CHECK(dnnl_primitive_execute(p, stream, 2, args));
    dnnl_primitive_destroy(p);
    dnnl_primitive_desc_destroy(pd);
}

/* Median step time of direct oneDNN; channels_last selects the "nhwc" variant. */
static double direct(const shape *s, int channels_last)
{
    int nd = s->nsp + 2;
    dnnl_dims_t sd = {s->n, s->c}, wd = {s->o, s->c}, dd = {s->n, s->o}, bd = {s->o};
    dnnl_dims_t str, dil, pad;
    for (int d = 0; d < s->nsp; d++) {
        sd[2 + d] = dd[2 + d] = s->sp[d];
        wd[2 + d] = s->k;
        str[d] = 1;
        dil[d] = 0;
        pad[d] = s->k / 2;
    }
    static const dnnl_format_tag_t nhwc[] = {dnnl_acb, dnnl_acdb, dnnl_acdeb};
    static const dnnl_format_tag_t plain[] = {dnnl_abc, dnnl_abcd, dnnl_abcde};
    dnnl_format_tag_t act = channels_last ? nhwc[s->nsp - 1] : dnnl_format_tag_any;
    dnnl_memory_desc_t src, wei, bias, dst, wplain;
    DNNL_CHECK(dnnl_memory_desc_init_by_tag(&src, nd, sd, dnnl_f32, act));
    DNNL_CHECK(dnnl_memory_desc_init_by_tag(&dst, nd, dd, dnnl_f32, act));
    DNNL_CHECK(dnnl_memory_desc_init_by_tag(&wei, nd, wd, dnnl_f32, dnnl_format_tag_any));
    DNNL_CHECK(dnnl_memory_desc_init_by_tag(&wplain, nd, wd, dnnl_f32, plain[s->nsp - 1]));
    DNNL_CHECK(dnnl_memory_desc_init_by_tag(&bias, 1, bd, dnnl_f32, dnnl_a));
    dnnl_convolution_desc_t fd, bdd, bwd;
    DNNL_CHECK(dnnl_dilated_convolution_forward_desc_init(&fd, dnnl_forward_training,
                                                          dnnl_convolution_direct, &src, &wei,
                                                          &bias, &dst, str, dil, pad, pad));
    DNNL_CHECK(dnnl_dilated_convolution_backward_data_desc_init(&bdd, dnnl_convolution_direct, &src,
                                                                &wei, &dst, str, dil, pad, pad));
    DNNL_CHECK(dnnl_dilated_convolution_backward_weights_desc_init(
        &bwd, dnnl_convolution_direct, &src, &wei, &bias, &dst, str, dil, pad, pad));
    dnnl_primitive_desc_t fpd, bdpd, bwpd;
    DNNL_CHECK(dnnl_primitive_desc_create(&fpd, &fd, NULL, engine, NULL));
    DNNL_CHECK(dnnl_primitive_desc_create(&bdpd, &bdd, NULL, engine, fpd));
    DNNL_CHECK(dnnl_primitive_desc_create(&bwpd, &bwd, NULL, engine, fpd));
#define MD(pd, q) dnnl_primitive_desc_query_md(pd, q, 0)
    /* Resident tensors in the forward primitive's layouts; the backward primitives get their
     * own copies where they want another layout (reordered inside the timed step). */
    dnnl_memory_t x = memory(MD(fpd, dnnl_query_src_md)),
                  w = memory(MD(fpd, dnnl_query_weights_md));
    dnnl_memory_t y = memory(MD(fpd, dnnl_query_dst_md)), b = memory(&bias);
    dnnl_memory_t w_user = memory(&wplain), dw_user = memory(&wplain), db = memory(&bias);
    dnnl_memory_t w_bd = memory(MD(bdpd, dnnl_query_weights_md));
    dnnl_memory_t dy_bd = memory(MD(bdpd, dnnl_query_diff_dst_md));
    dnnl_memory_t dx = memory(MD(bdpd, dnnl_query_diff_src_md));
    dnnl_memory_t x_bw = memory(MD(bwpd, dnnl_query_src_md));
    dnnl_memory_t dy_bw = memory(MD(bwpd, dnnl_query_diff_dst_md));
    dnnl_memory_t dw = memory(MD(bwpd, dnnl_query_diff_weights_md));
    dnnl_memory_t dy = memory(MD(fpd, dnnl_query_dst_md)); /* the incoming gradient */
    dnnl_primitive_t pf, pbd, pbw;
    DNNL_CHECK(dnnl_primitive_create(&pf, fpd));
    DNNL_CHECK(dnnl_primitive_create(&pbd, bdpd));
    DNNL_CHECK(dnnl_primitive_create(&pbw, bwpd));
    dnnl_exec_arg_t fa[4] = {
        {DNNL_ARG_SRC, x}, {DNNL_ARG_WEIGHTS, w}, {DNNL_ARG_BIAS, b}, {DNNL_ARG_DST, y}};
    dnnl_exec_arg_t ba[3] = {
        {DNNL_ARG_DIFF_DST, dy_bd}, {DNNL_ARG_WEIGHTS, w_bd}, {DNNL_ARG_DIFF_SRC, dx}};
    dnnl_exec_arg_t wa[4] = {{DNNL_ARG_SRC, x_bw},
                             {DNNL_ARG_DIFF_DST, dy_bw},
                             {DNNL_ARG_DIFF_WEIGHTS, dw},
                             {DNNL_ARG_DIFF_BIAS, db}};
    double t[RUNS];
    for (int r = -1; r < RUNS; r++) {
        double t0 = bench_now();
        if (channels_last)
            reorder(w_user, w); /* weights arrive plain */
        reorder(w, w_bd);
        reorder(dy, dy_bd);
        reorder(dy, dy_bw);
        reorder(x, x_bw);
        DNNL_CHECK(dnnl_primitive_execute(pf, stream, 4, fa));
        DNNL_CHECK(dnnl_primitive_execute(pbd, stream, 3, ba));
        DNNL_CHECK(dnnl_primitive_execute(pbw, stream, 4, wa));
        if (channels_last)
            reorder(dw, dw_user); /* the weight gradient leaves plain */
        DNNL_CHECK(dnnl_stream_wait(stream));
        if (r >= 0)
            t[r] = bench_now() - t0;
    }
#undef MD
    dnnl_memory_t all[14] = {x, w, y, b, w_user, dw_user, db, w_bd, dy_bd, dx, x_bw, dy_bw, dw, dy};
    for (int i = 0; i < 14; i++)
        dnnl_memory_destroy(all[i]);
    dnnl_primitive_destroy(pf);
    dnnl_primitive_destroy(pbd);
    dnnl_primitive_destroy(pbw);
    dnnl_primitive_desc_destroy(fpd);
    dnnl_primitive_desc_destroy(bdpd);
    dnnl_primitive_desc_destroy(bwpd);
    return bench_median(t, RUNS);
}

static double through_tasks(tsl_context_t ctx, const shape *s, int tiles)
{
    tsl_conv_params p;
    CHECK(tsl_conv_params_init(&p, s->nsp));
    int64_t xd[5] = {s->n, s->c}, wd[5] = {s->o, s->c}, yd[5] = {s->n, s->o}, bd[1] = {s->o};
    for (int d = 0; d < s->nsp; d++) {
        xd[2 + d] = yd[2 + d] = s->sp[d];
        wd[2 + d] = s->k;
        p.padding[d] = s->k / 2;
    }
    tsl_shape xs, ws, ys, bs;
    tsl_shape_make(&xs, s->nsp + 2, xd);
    tsl_shape_make(&ws, s->nsp + 2, wd);
    tsl_shape_make(&ys, s->nsp + 2, yd);
    tsl_shape_make(&bs, 1, bd);
    tsl_tile_grid g = tsl_tile_grid_single();
    g.splits[0] = tiles;
    tsl_tensor_t x, y, dy, dx, w, dw, b, db;
    const tsl_layout cl = TSL_LAYOUT_CHANNELS_LAST;
    CHECK(tsl_tensor_create_layout(&x, ctx, TSL_F32, &xs, &g, NULL, cl));
    CHECK(tsl_tensor_create_layout(&dx, ctx, TSL_F32, &xs, &g, NULL, cl));
    CHECK(tsl_tensor_create_layout(&y, ctx, TSL_F32, &ys, &g, NULL, cl));
    CHECK(tsl_tensor_create_layout(&dy, ctx, TSL_F32, &ys, &g, NULL, cl));
    CHECK(tsl_tensor_create(&w, ctx, TSL_F32, &ws, NULL, NULL));
    CHECK(tsl_tensor_create(&dw, ctx, TSL_F32, &ws, NULL, NULL));
    CHECK(tsl_tensor_create(&b, ctx, TSL_F32, &bs, NULL, NULL));
    CHECK(tsl_tensor_create(&db, ctx, TSL_F32, &bs, NULL, NULL));
    CHECK(tsl_tensor_fill_uniform(x, 1, -1, 1));
    CHECK(tsl_tensor_fill_uniform(w, 2, -1, 1));
    CHECK(tsl_tensor_fill_uniform(dy, 3, -1, 1));
    CHECK(tsl_context_wait(ctx));
    double t[RUNS];
    for (int r = -3; r < RUNS; r++) {
        double t0 = bench_now();
        CHECK(tsl_conv_forward(&p, x, w, b, y));
        CHECK(tsl_conv_backward(&p, x, w, dy, dx, dw, db));
        CHECK(tsl_context_wait(ctx));
        if (r >= 0)
            t[r] = bench_now() - t0;
    }
    tsl_tensor_t all[8] = {x, y, dy, dx, w, dw, b, db};
    for (int i = 0; i < 8; i++)
        tsl_tensor_destroy(all[i]);
    return bench_median(t, RUNS);
}

int main(int argc, char **argv)
{
    int threads = argc > 1 ? atoi(argv[1]) : 1;
    if (threads < 1)
        threads = 1;
    const shape shapes[] = {
        {"conv2d N=8 C=16->16 128x128 k3 p1", 2, 8, 16, 16, {128, 128, 0}, 3},
        {"conv3d N=2 C=8->8 64^3 k3 p1", 3, 2, 8, 8, {64, 64, 64}, 3},
        {"conv1d N=8 C=16->16 L=65536 k3 p1", 1, 8, 16, 16, {65536, 0, 0}, 3},
    };
    enum { NSHAPES = sizeof shapes / sizeof shapes[0] };
    DNNL_CHECK(dnnl_engine_create(&engine, dnnl_cpu, 0));
    DNNL_CHECK(dnnl_stream_create(&stream, engine, dnnl_stream_default_flags));
    double any[NSHAPES], nhwc[NSHAPES], tessel[NSHAPES];
    for (int i = 0; i < NSHAPES; i++) {
        any[i] = direct(&shapes[i], 0);
        nhwc[i] = direct(&shapes[i], 1);
    }
    tsl_context_t ctx;
    CHECK(tsl_context_create(&ctx, NULL));
    int32_t ncpu;
    tsl_context_worker_count(ctx, TSL_WORKER_CPU, &ncpu);
    for (int i = 0; i < NSHAPES; i++)
        tessel[i] = through_tasks(ctx, &shapes[i], threads);
    printf("convolution training step (fwd + bias, bwd data, bwd weights + bias), f32: tessel "
           "on %d CPU workers, %d sample tiles, channels-last; oneDNN direct on %s threads\n",
           (int)ncpu, threads, getenv("OMP_NUM_THREADS") ? getenv("OMP_NUM_THREADS") : "default");
    printf("%-36s %10s %12s %12s %8s\n", "shape", "tessel ms", "oneDNN any", "oneDNN nhwc",
           "ratio");
    for (int i = 0; i < NSHAPES; i++) {
        double best = any[i] < nhwc[i] ? any[i] : nhwc[i];
        printf("%-36s %10.2f %12.2f %12.2f %8.3f\n", shapes[i].name, 1e3 * tessel[i], 1e3 * any[i],
               1e3 * nhwc[i], best / tessel[i]);
    }
    tsl_context_destroy(ctx);
    dnnl_stream_destroy(stream);
    dnnl_engine_destroy(engine);
    return 0;
}
