/* tessel's CUDA codelets against direct cuDNN and cuBLAS calls on the same shapes (the GPU
 * counterpart of bench/ops.c; built only with TESSEL_CUDA): convolution forward, backward data
 * and backward weights on U-Net and CNN3D layer shapes (3x3 or 3x3x3, padding 1, f32, one
 * tile, channels-last as the models store activations, or plain NCHW/NCDHW), and a GEMM's
 * forward and backward (data + weights) through the linear op.
 *
 *   STARPU_NCUDA=1 STARPU_NCPU=1 ./bench_cuda_ops [ROWS|all] [channels-last|plain]
 *
 * ROWS: a comma-separated subset of the row names (default: all). tessel's side is the op
 * (tsl_conv_forward, tsl_conv_backward with dx only or dw only, tsl_linear_forward/backward)
 * with TSL_TASK_WHERE=cuda, so every task that can runs on the CUDA worker, timed from
 * submission to tsl_context_wait(); its tiles stay on the GPU between runs. The direct side is
 * cuDNN with the fastest algorithm cudnnFind*Algorithm measures (as PyTorch's
 * cudnn.benchmark), its workspace within 512 MiB, and cuBLAS SGEMM, each call followed by a
 * stream synchronisation. TF32 as tessel's TESSEL_CUDA_TF32 says (default on, as PyTorch
 * allows for convolutions): cuDNN's default math and CUBLAS_TF32_TENSOR_OP_MATH, or FMA math
 * and CUBLAS_DEFAULT_MATH with "0". Median of 15 runs after 3 warm-ups; the last column is
 * tessel's throughput over the direct call's (the target is >= 0.9), and the count of
 * tessel's tasks that ran on CUDA workers is printed with each row. */
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <starpu.h>

#include "bench_util.h"
#include "tessel/tessel.h"

#define RUNS 15
#define WARMUP 3
#define WORKSPACE_MAX ((size_t)512 << 20)

#define CUDA_OK(call)                                                                              \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)
#define CUDNN_OK(call)                                                                             \
    do {                                                                                           \
        cudnnStatus_t s_ = (call);                                                                 \
        if (s_ != CUDNN_STATUS_SUCCESS) {                                                          \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,                          \
                    cudnnGetErrorString(s_));                                                      \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)
#define CUBLAS_OK(call)                                                                            \
    do {                                                                                           \
        cublasStatus_t s_ = (call);                                                                \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                         \
            fprintf(stderr, "%s:%d: %s: cuBLAS status %d\n", __FILE__, __LINE__, #call, (int)s_);  \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* A convolution layer: N samples, Cin -> Cout channels, `spatial` sizes, kernel 3, padding 1. */
typedef struct conv_row {
    const char *name;
    int spatial;
    int64_t n, cin, cout, size[3];
} conv_row;

static const conv_row conv_rows[] = {
    {"unet2d-512-c1-16", 2, 8, 1, 16, {512, 512}},
    {"unet2d-512-c16-16", 2, 8, 16, 16, {512, 512}},
    {"unet2d-128-c64-64", 2, 8, 64, 64, {128, 128}},
    {"unet3d-128-c16-16", 3, 1, 16, 16, {128, 128, 128}},
    {"unet3d-32-c64-64", 3, 1, 64, 64, {32, 32, 32}},
    {"cnn3d-32-c16-32", 3, 4, 16, 32, {32, 32, 32}},
};

/* A GEMM: y (n, o) = x (n, k) w (o, k)^T, as the linear op. */
typedef struct gemm_row {
    const char *name;
    int64_t n, k, o;
} gemm_row;

static const gemm_row gemm_rows[] = {
    {"gemm-256x4096x1024", 256, 4096, 1024},
    {"gemm-4096x4096x4096", 4096, 4096, 4096},
};

static const char *selected;
static int tf32, channels_last = 1;
static cudaStream_t stream;
static cudnnHandle_t dnn;
static cublasHandle_t blas;
static void *workspace;
static size_t workspace_size;

static int wanted(const char *name)
{
    if (!selected || !*selected || strcmp(selected, "all") == 0)
        return 1;
    size_t len = strlen(name);
    for (const char *p = selected; (p = strstr(p, name)) != NULL; p += len)
        if ((p == selected || p[-1] == ',') && (p[len] == ',' || p[len] == '\0'))
            return 1;
    return 0;
}

static void ensure_workspace(size_t bytes)
{
    if (bytes <= workspace_size)
        return;
    if (workspace)
        CUDA_OK(cudaFree(workspace));
    CUDA_OK(cudaMalloc(&workspace, bytes));
    workspace_size = bytes;
}

/* A device buffer of `count` floats, uniform in [-1, 1) from a fixed generator. */
static float *device_random(int64_t count, uint64_t salt)
{
    float *h = malloc(sizeof(float) * (size_t)count), *d;
    if (!h) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    uint64_t s = 0x9e3779b97f4a7c15ull * (salt + 1);
    for (int64_t i = 0; i < count; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        h[i] = (float)((double)(s >> 11) / 9007199254740992.0 * 2.0 - 1.0);
    }
    CUDA_OK(cudaMalloc((void **)&d, sizeof(float) * (size_t)count));
    CUDA_OK(cudaMemcpy(d, h, sizeof(float) * (size_t)count, cudaMemcpyHostToDevice));
    free(h);
    return d;
}

/* Tasks executed by CUDA workers and by all workers since the last call (StarPU's profiling
 * counters, reset by reading). */
static void task_counts(long *cuda, long *all)
{
    *cuda = *all = 0;
    for (unsigned w = 0; w < starpu_worker_get_count(); w++) {
        struct starpu_profiling_worker_info info;
        if (starpu_profiling_worker_get_info((int)w, &info) != 0)
            continue;
        *all += info.executed_tasks;
        if (starpu_worker_get_type((int)w) == STARPU_CUDA_WORKER)
            *cuda += info.executed_tasks;
    }
}

/* One tessel op: what it submits, and the argument it needs. */
typedef tsl_status (*tessel_op)(void *arg);

static double time_tessel(tsl_context_t ctx, tessel_op op, void *arg, long *cuda, long *all)
{
    double t[RUNS];
    for (int r = -WARMUP; r < RUNS; r++) {
        if (r == 0)
            task_counts(cuda, all); /* resets the counters */
        double t0 = bench_now();
        CHECK(op(arg));
        CHECK(tsl_context_wait(ctx));
        if (r >= 0)
            t[r] = bench_now() - t0;
    }
    task_counts(cuda, all);
    return bench_median(t, RUNS);
}

/* The direct side of a row: one call on `stream`. */
typedef void (*direct_op)(void *arg);

static double time_direct(direct_op op, void *arg)
{
    double t[RUNS];
    for (int r = -WARMUP; r < RUNS; r++) {
        double t0 = bench_now();
        op(arg);
        CUDA_OK(cudaGetLastError());
        CUDA_OK(cudaStreamSynchronize(stream));
        if (r >= 0)
            t[r] = bench_now() - t0;
    }
    return bench_median(t, RUNS);
}

static void report(const char *name, const char *what, double flops, double tessel_s,
                   double direct_s, long cuda, long all)
{
    printf("%-22s %-8s %9.3f %9.3f %8.1f %8.1f %6.2f   %ld/%ld\n", name, what, 1e3 * tessel_s,
           1e3 * direct_s, flops / tessel_s * 1e-12, flops / direct_s * 1e-12, direct_s / tessel_s,
           cuda, all);
    fflush(stdout);
}

/* ---- convolution ---- */

typedef struct conv_case {
    tsl_conv_params params;
    tsl_tensor_t x, w, y, dy, dx, dw;
    /* direct */
    cudnnTensorDescriptor_t xd, yd;
    cudnnFilterDescriptor_t wd;
    cudnnConvolutionDescriptor_t cd;
    float *dev_x, *dev_w, *dev_y, *dev_dy, *dev_dx, *dev_dw;
    cudnnConvolutionFwdAlgo_t fwd;
    cudnnConvolutionBwdDataAlgo_t bwd_data;
    cudnnConvolutionBwdFilterAlgo_t bwd_filter;
    size_t ws_fwd, ws_data, ws_filter;
    cudnnMathType_t math_fwd, math_data, math_filter;
} conv_case;

static tsl_status tessel_conv_fwd(void *a)
{
    conv_case *c = a;
    return tsl_conv_forward(&c->params, c->x, c->w, NULL, c->y);
}
static tsl_status tessel_conv_bwd_data(void *a)
{
    conv_case *c = a;
    return tsl_conv_backward(&c->params, c->x, c->w, c->dy, c->dx, NULL, NULL);
}
static tsl_status tessel_conv_bwd_filter(void *a)
{
    conv_case *c = a;
    return tsl_conv_backward(&c->params, c->x, c->w, c->dy, NULL, c->dw, NULL);
}

static const float one = 1.0f, zero = 0.0f;

static void direct_conv_fwd(void *a)
{
    conv_case *c = a;
    CUDNN_OK(cudnnSetConvolutionMathType(c->cd, c->math_fwd));
    CUDNN_OK(cudnnConvolutionForward(dnn, &one, c->xd, c->dev_x, c->wd, c->dev_w, c->cd, c->fwd,
                                     workspace, c->ws_fwd, &zero, c->yd, c->dev_y));
}
static void direct_conv_bwd_data(void *a)
{
    conv_case *c = a;
    CUDNN_OK(cudnnSetConvolutionMathType(c->cd, c->math_data));
    CUDNN_OK(cudnnConvolutionBackwardData(dnn, &one, c->wd, c->dev_w, c->yd, c->dev_dy, c->cd,
                                          c->bwd_data, workspace, c->ws_data, &zero, c->xd,
                                          c->dev_dx));
}
static void direct_conv_bwd_filter(void *a)
{
    conv_case *c = a;
    CUDNN_OK(cudnnSetConvolutionMathType(c->cd, c->math_filter));
    CUDNN_OK(cudnnConvolutionBackwardFilter(dnn, &one, c->xd, c->dev_x, c->yd, c->dev_dy, c->cd,
                                            c->bwd_filter, workspace, c->ws_filter, &zero, c->wd,
                                            c->dev_dw));
}

/* The first measured algorithm that succeeded, fits the workspace limit and, without TF32,
 * uses FMA math. */
#define PICK(results, count, out_algo, out_ws, out_math)                                           \
    do {                                                                                           \
        int found_ = 0;                                                                            \
        for (int i_ = 0; i_ < (count) && !found_; i_++)                                            \
            if ((results)[i_].status == CUDNN_STATUS_SUCCESS &&                                    \
                (results)[i_].memory <= WORKSPACE_MAX &&                                           \
                (tf32 || (results)[i_].mathType == CUDNN_FMA_MATH)) {                              \
                (out_algo) = (results)[i_].algo;                                                   \
                (out_ws) = (results)[i_].memory;                                                   \
                (out_math) = (results)[i_].mathType;                                               \
                found_ = 1;                                                                        \
            }                                                                                      \
        if (!found_) {                                                                             \
            fprintf(stderr, "no usable cuDNN algorithm for %s\n", #out_algo);                      \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static void bench_conv(tsl_context_t ctx, const conv_row *row)
{
    conv_case c;
    memset(&c, 0, sizeof c);
    int sp = row->spatial, nd = sp + 2;
    int64_t xdims[5] = {row->n, row->cin}, wdims[5] = {row->cout, row->cin};
    int64_t pos = 1;
    for (int d = 0; d < sp; d++) {
        xdims[2 + d] = row->size[d];
        wdims[2 + d] = 3;
        pos *= row->size[d];
    }
    CHECK(tsl_conv_params_init(&c.params, sp));
    for (int d = 0; d < sp; d++)
        c.params.padding[d] = 1;
    tsl_shape xs, ws, ys;
    tsl_shape_make(&xs, nd, xdims);
    tsl_shape_make(&ws, nd, wdims);
    CHECK(tsl_conv_output_shape(&xs, &ws, &c.params, &ys));
    tsl_tile_grid one_tile = tsl_tile_grid_single();
    tsl_layout layout = channels_last ? TSL_LAYOUT_CHANNELS_LAST : TSL_LAYOUT_PLAIN;
    CHECK(tsl_tensor_create_layout(&c.x, ctx, TSL_F32, &xs, &one_tile, NULL, layout));
    CHECK(tsl_tensor_create_layout(&c.dx, ctx, TSL_F32, &xs, &one_tile, NULL, layout));
    CHECK(tsl_tensor_create(&c.w, ctx, TSL_F32, &ws, &one_tile, NULL)); /* weights: plain */
    CHECK(tsl_tensor_create(&c.dw, ctx, TSL_F32, &ws, &one_tile, NULL));
    CHECK(tsl_tensor_create_layout(&c.y, ctx, TSL_F32, &ys, &one_tile, NULL, layout));
    CHECK(tsl_tensor_create_layout(&c.dy, ctx, TSL_F32, &ys, &one_tile, NULL, layout));
    CHECK(tsl_tensor_fill_uniform(c.x, 1, -1, 1));
    CHECK(tsl_tensor_fill_uniform(c.w, 2, -0.2, 0.2));
    CHECK(tsl_tensor_fill_uniform(c.dy, 3, -1, 1));
    CHECK(tsl_context_wait(ctx));

    /* Direct cuDNN on the same shapes. */
    int xi[5], wi[5], yi[5], xstr[5], ystr[5], pad[3], str[3], dil[3];
    for (int d = 0; d < nd; d++) {
        xi[d] = (int)xdims[d];
        wi[d] = (int)wdims[d];
        yi[d] = (int)ys.dims[d];
    }
    /* Strides of plain (N, C, spatial...) or channels-last (N, spatial..., C) storage; the
     * filter in the same order (cuDNN's channels-last kernels want it so). */
    if (channels_last) {
        xstr[1] = ystr[1] = 1;
        xstr[nd - 1] = xi[1];
        ystr[nd - 1] = yi[1];
        for (int d = nd - 2; d >= 2; d--) {
            xstr[d] = xstr[d + 1] * xi[d + 1];
            ystr[d] = ystr[d + 1] * yi[d + 1];
        }
        xstr[0] = xstr[2] * xi[2];
        ystr[0] = ystr[2] * yi[2];
    } else {
        xstr[nd - 1] = ystr[nd - 1] = 1;
        for (int d = nd - 2; d >= 0; d--) {
            xstr[d] = xstr[d + 1] * xi[d + 1];
            ystr[d] = ystr[d + 1] * yi[d + 1];
        }
    }
    for (int d = 0; d < sp; d++) {
        pad[d] = 1;
        str[d] = dil[d] = 1;
    }
    CUDNN_OK(cudnnCreateTensorDescriptor(&c.xd));
    CUDNN_OK(cudnnCreateTensorDescriptor(&c.yd));
    CUDNN_OK(cudnnCreateFilterDescriptor(&c.wd));
    CUDNN_OK(cudnnCreateConvolutionDescriptor(&c.cd));
    CUDNN_OK(cudnnSetTensorNdDescriptor(c.xd, CUDNN_DATA_FLOAT, nd, xi, xstr));
    CUDNN_OK(cudnnSetTensorNdDescriptor(c.yd, CUDNN_DATA_FLOAT, nd, yi, ystr));
    CUDNN_OK(cudnnSetFilterNdDescriptor(
        c.wd, CUDNN_DATA_FLOAT, channels_last ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW, nd, wi));
    CUDNN_OK(cudnnSetConvolutionNdDescriptor(c.cd, sp, pad, str, dil, CUDNN_CROSS_CORRELATION,
                                             CUDNN_DATA_FLOAT));
    CUDNN_OK(cudnnSetConvolutionMathType(c.cd, tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH));
    int64_t xn = tsl_shape_numel(&xs), wn = tsl_shape_numel(&ws), yn = tsl_shape_numel(&ys);
    c.dev_x = device_random(xn, 11);
    c.dev_w = device_random(wn, 12);
    c.dev_dy = device_random(yn, 13);
    CUDA_OK(cudaMalloc((void **)&c.dev_y, sizeof(float) * (size_t)yn));
    CUDA_OK(cudaMalloc((void **)&c.dev_dx, sizeof(float) * (size_t)xn));
    CUDA_OK(cudaMalloc((void **)&c.dev_dw, sizeof(float) * (size_t)wn));
    int count = 0;
    cudnnConvolutionFwdAlgoPerf_t pf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    CUDNN_OK(cudnnFindConvolutionForwardAlgorithm(dnn, c.xd, c.wd, c.cd, c.yd,
                                                  CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &count, pf));
    PICK(pf, count, c.fwd, c.ws_fwd, c.math_fwd);
    cudnnConvolutionBwdDataAlgoPerf_t pd[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
    CUDNN_OK(cudnnFindConvolutionBackwardDataAlgorithm(
        dnn, c.wd, c.yd, c.cd, c.xd, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &count, pd));
    PICK(pd, count, c.bwd_data, c.ws_data, c.math_data);
    cudnnConvolutionBwdFilterAlgoPerf_t pw[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
    CUDNN_OK(cudnnFindConvolutionBackwardFilterAlgorithm(
        dnn, c.xd, c.yd, c.cd, c.wd, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &count, pw));
    PICK(pw, count, c.bwd_filter, c.ws_filter, c.math_filter);
    ensure_workspace(c.ws_fwd > c.ws_data ? (c.ws_fwd > c.ws_filter ? c.ws_fwd : c.ws_filter)
                                          : (c.ws_data > c.ws_filter ? c.ws_data : c.ws_filter));

    double flops = 2.0 * (double)row->n * (double)row->cout * (double)row->cin * (double)pos *
                   (sp == 2 ? 9.0 : 27.0);
    long cuda, all;
    double t;
    t = time_tessel(ctx, tessel_conv_fwd, &c, &cuda, &all);
    report(row->name, "fwd", flops, t, time_direct(direct_conv_fwd, &c), cuda, all);
    t = time_tessel(ctx, tessel_conv_bwd_data, &c, &cuda, &all);
    report(row->name, "bwd-data", flops, t, time_direct(direct_conv_bwd_data, &c), cuda, all);
    t = time_tessel(ctx, tessel_conv_bwd_filter, &c, &cuda, &all);
    report(row->name, "bwd-wgt", flops, t, time_direct(direct_conv_bwd_filter, &c), cuda, all);

    tsl_tensor_t ts[6] = {c.x, c.w, c.y, c.dy, c.dx, c.dw};
    for (int i = 0; i < 6; i++)
        CHECK(tsl_tensor_destroy(ts[i]));
    float *ds[6] = {c.dev_x, c.dev_w, c.dev_y, c.dev_dy, c.dev_dx, c.dev_dw};
    for (int i = 0; i < 6; i++)
        CUDA_OK(cudaFree(ds[i]));
    cudnnDestroyTensorDescriptor(c.xd);
    cudnnDestroyTensorDescriptor(c.yd);
    cudnnDestroyFilterDescriptor(c.wd);
    cudnnDestroyConvolutionDescriptor(c.cd);
}

/* ---- GEMM (the linear op) ---- */

typedef struct gemm_case {
    const gemm_row *row;
    tsl_tensor_t x, w, y, dy, dx, dw;
    float *dev_x, *dev_w, *dev_y, *dev_dy, *dev_dx, *dev_dw;
} gemm_case;

static tsl_status tessel_gemm_fwd(void *a)
{
    gemm_case *g = a;
    return tsl_linear_forward(g->x, g->w, NULL, g->y);
}
static tsl_status tessel_gemm_bwd(void *a)
{
    gemm_case *g = a;
    return tsl_linear_backward(g->x, g->w, g->dy, g->dx, g->dw, NULL);
}

/* Row-major x (n, k), w (o, k), y (n, o) are column-major x^T (k, n), w^T (k, o), y^T (o, n):
 * y^T = w x^T is (w^T)^T x^T; dx^T = w^T dy^T; dw^T = x^T dy. */
static void direct_gemm_fwd(void *a)
{
    gemm_case *g = a;
    int n = (int)g->row->n, k = (int)g->row->k, o = (int)g->row->o;
    CUBLAS_OK(cublasSgemm(blas, CUBLAS_OP_T, CUBLAS_OP_N, o, n, k, &one, g->dev_w, k, g->dev_x, k,
                          &zero, g->dev_y, o));
}
static void direct_gemm_bwd(void *a)
{
    gemm_case *g = a;
    int n = (int)g->row->n, k = (int)g->row->k, o = (int)g->row->o;
    CUBLAS_OK(cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, k, n, o, &one, g->dev_w, k, g->dev_dy, o,
                          &zero, g->dev_dx, k));
    CUBLAS_OK(cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_T, k, o, n, &one, g->dev_x, k, g->dev_dy, o,
                          &zero, g->dev_dw, k));
}

static void bench_gemm(tsl_context_t ctx, const gemm_row *row)
{
    gemm_case g;
    memset(&g, 0, sizeof g);
    g.row = row;
    int64_t xd[2] = {row->n, row->k}, wd[2] = {row->o, row->k}, yd[2] = {row->n, row->o};
    tsl_shape xs, ws, ys;
    tsl_shape_make(&xs, 2, xd);
    tsl_shape_make(&ws, 2, wd);
    tsl_shape_make(&ys, 2, yd);
    tsl_tile_grid one_tile = tsl_tile_grid_single();
    CHECK(tsl_tensor_create(&g.x, ctx, TSL_F32, &xs, &one_tile, NULL));
    CHECK(tsl_tensor_create(&g.dx, ctx, TSL_F32, &xs, &one_tile, NULL));
    CHECK(tsl_tensor_create(&g.w, ctx, TSL_F32, &ws, &one_tile, NULL));
    CHECK(tsl_tensor_create(&g.dw, ctx, TSL_F32, &ws, &one_tile, NULL));
    CHECK(tsl_tensor_create(&g.y, ctx, TSL_F32, &ys, &one_tile, NULL));
    CHECK(tsl_tensor_create(&g.dy, ctx, TSL_F32, &ys, &one_tile, NULL));
    CHECK(tsl_tensor_fill_uniform(g.x, 1, -1, 1));
    CHECK(tsl_tensor_fill_uniform(g.w, 2, -1, 1));
    CHECK(tsl_tensor_fill_uniform(g.dy, 3, -1, 1));
    CHECK(tsl_context_wait(ctx));
    g.dev_x = device_random(row->n * row->k, 21);
    g.dev_w = device_random(row->o * row->k, 22);
    g.dev_dy = device_random(row->n * row->o, 23);
    CUDA_OK(cudaMalloc((void **)&g.dev_y, sizeof(float) * (size_t)(row->n * row->o)));
    CUDA_OK(cudaMalloc((void **)&g.dev_dx, sizeof(float) * (size_t)(row->n * row->k)));
    CUDA_OK(cudaMalloc((void **)&g.dev_dw, sizeof(float) * (size_t)(row->o * row->k)));
    double flops = 2.0 * (double)row->n * (double)row->k * (double)row->o;
    long cuda, all;
    double t = time_tessel(ctx, tessel_gemm_fwd, &g, &cuda, &all);
    report(row->name, "fwd", flops, t, time_direct(direct_gemm_fwd, &g), cuda, all);
    t = time_tessel(ctx, tessel_gemm_bwd, &g, &cuda, &all);
    report(row->name, "bwd", 2 * flops, t, time_direct(direct_gemm_bwd, &g), cuda, all);
    tsl_tensor_t ts[6] = {g.x, g.w, g.y, g.dy, g.dx, g.dw};
    for (int i = 0; i < 6; i++)
        CHECK(tsl_tensor_destroy(ts[i]));
    float *ds[6] = {g.dev_x, g.dev_w, g.dev_y, g.dev_dy, g.dev_dx, g.dev_dw};
    for (int i = 0; i < 6; i++)
        CUDA_OK(cudaFree(ds[i]));
}

int main(int argc, char **argv)
{
    selected = argc > 1 ? argv[1] : NULL;
    if (argc > 2) {
        if (strcmp(argv[2], "plain") != 0 && strcmp(argv[2], "channels-last") != 0) {
            fprintf(stderr, "bench_cuda_ops: layout '%s': channels-last or plain\n", argv[2]);
            return 2;
        }
        channels_last = strcmp(argv[2], "channels-last") == 0;
    }
    const char *v = getenv("TESSEL_CUDA_TF32");
    tf32 = !(v && strcmp(v, "0") == 0);
    /* Every task that can runs on the CUDA worker (src/task_where.h); a value set by hand stays. */
    setenv("TSL_TASK_WHERE", "cuda", 0);
    tsl_context_t ctx;
    CHECK(tsl_context_create(&ctx, NULL));
    int32_t ncuda = 0, ncpu = 0;
    tsl_context_worker_count(ctx, TSL_WORKER_CUDA, &ncuda);
    tsl_context_worker_count(ctx, TSL_WORKER_CPU, &ncpu);
    if (ncuda < 1) {
        fprintf(stderr, "bench_cuda_ops: no CUDA worker (no GPU, or STARPU_NCUDA=0)\n");
        tsl_context_destroy(ctx);
        return 2;
    }
    starpu_profiling_status_set(STARPU_PROFILING_ENABLE);
    int dev = starpu_worker_get_devid(starpu_worker_get_by_type(STARPU_CUDA_WORKER, 0));
    CUDA_OK(cudaSetDevice(dev));
    struct cudaDeviceProp prop;
    CUDA_OK(cudaGetDeviceProperties(&prop, dev));
    CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    CUDNN_OK(cudnnCreate(&dnn));
    CUDNN_OK(cudnnSetStream(dnn, stream));
    CUBLAS_OK(cublasCreate(&blas));
    CUBLAS_OK(cublasSetStream(blas, stream));
    CUBLAS_OK(cublasSetMathMode(blas, tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
    printf("tessel CUDA codelets vs direct cuDNN %zu / cuBLAS on %s; %d CUDA, %d CPU workers; "
           "TF32 %s; TSL_TASK_WHERE=%s; convolutions %s; median of %d\n",
           cudnnGetVersion(), prop.name, (int)ncuda, (int)ncpu, tf32 ? "on" : "off",
           getenv("TSL_TASK_WHERE"), channels_last ? "channels-last" : "plain", RUNS);
    printf("%-22s %-8s %9s %9s %8s %8s %6s   %s\n", "row", "pass", "tessel_ms", "direct_ms",
           "tsl_TF/s", "dir_TF/s", "ratio", "tasks on CUDA");
    int rows = 0;
    for (size_t i = 0; i < sizeof conv_rows / sizeof conv_rows[0]; i++)
        if (wanted(conv_rows[i].name)) {
            bench_conv(ctx, &conv_rows[i]);
            rows++;
        }
    for (size_t i = 0; i < sizeof gemm_rows / sizeof gemm_rows[0]; i++)
        if (wanted(gemm_rows[i].name)) {
            bench_gemm(ctx, &gemm_rows[i]);
            rows++;
        }
    if (!rows)
        fprintf(stderr, "bench_cuda_ops: no row named in '%s'\n", selected);
    cublasDestroy(blas);
    cudnnDestroy(dnn);
    if (workspace)
        cudaFree(workspace);
    cudaStreamDestroy(stream);
    CHECK(tsl_context_destroy(ctx));
    return rows ? 0 : 2;
}
