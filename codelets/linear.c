/* Fully connected layer on one tile of samples, with OpenBLAS (one thread: the context sets
 * OpenBLAS to a single thread, parallelism comes from tiles). */
#include <cblas.h>

#include "codelet.h"
#include "linear.h"
#include "tessel/tensor.h"

void tsl_linear_forward_kernel(const tsl_linear_args *a, const void *x, const void *w,
                               const void *b, void *y)
{
    const int n = (int)a->rows, k = (int)a->in, o = (int)a->out;
    if (a->dtype == TSL_F32) {
        float *out = y;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, o, k, 1.0f, x, k, w, k, 0.0f, out,
                    o);
        if (b)
            for (int r = 0; r < n; r++)
                for (int j = 0; j < o; j++)
                    out[(int64_t)r * o + j] += ((const float *)b)[j];
    } else {
        double *out = y;
        cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, o, k, 1.0, x, k, w, k, 0.0, out, o);
        if (b)
            for (int r = 0; r < n; r++)
                for (int j = 0; j < o; j++)
                    out[(int64_t)r * o + j] += ((const double *)b)[j];
    }
}

void tsl_linear_backward_data_kernel(const tsl_linear_args *a, const void *dy, const void *w,
                                     void *dx)
{
    const int n = (int)a->rows, k = (int)a->in, o = (int)a->out;
    if (a->dtype == TSL_F32)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, k, o, 1.0f, dy, o, w, k, 0.0f, dx,
                    k);
    else
        cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, k, o, 1.0, dy, o, w, k, 0.0, dx,
                    k);
}

void tsl_linear_backward_weights_kernel(const tsl_linear_args *a, const void *x, const void *dy,
                                        void *dw, void *db)
{
    const int n = (int)a->rows, k = (int)a->in, o = (int)a->out;
    if (a->dtype == TSL_F32) {
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, o, k, n, 1.0f, dy, o, x, k, 0.0f, dw,
                    k);
        if (db) {
            float *sum = db;
            for (int j = 0; j < o; j++)
                sum[j] = 0;
            for (int r = 0; r < n; r++)
                for (int j = 0; j < o; j++)
                    sum[j] += ((const float *)dy)[(int64_t)r * o + j];
        }
    } else {
        cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, o, k, n, 1.0, dy, o, x, k, 0.0, dw, k);
        if (db) {
            double *sum = db;
            for (int j = 0; j < o; j++)
                sum[j] = 0;
            for (int r = 0; r < n; r++)
                for (int j = 0; j < o; j++)
                    sum[j] += ((const double *)dy)[(int64_t)r * o + j];
        }
    }
}

void tsl_linear_weight_rows_kernel(const tsl_linear_rows_args *a, const void *const *x,
                                   const void *const *dy, void *dw, void *db)
{
    const int k = (int)a->in, o = (int)a->out, rows = (int)a->nrows;
    for (int t = 0; t < a->ntiles; t++) {
        const int n = (int)a->samples[t];
        if (a->dtype == TSL_F32)
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, rows, k, n, 1.0f,
                        (const float *)dy[t] + a->row0, o, x[t], k, t ? 1.0f : 0.0f, dw, k);
        else
            cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, rows, k, n, 1.0,
                        (const double *)dy[t] + a->row0, o, x[t], k, t ? 1.0 : 0.0, dw, k);
    }
    if (!db)
        return;
    for (int j = 0; j < o; j++)
        tsl_store(a->dtype, db, j, 0.0);
    for (int t = 0; t < a->ntiles; t++)
        for (int64_t r = 0; r < a->samples[t]; r++) {
            if (a->dtype == TSL_F32) {
                const float *row = (const float *)dy[t] + r * o;
                float *sum = db;
                for (int j = 0; j < o; j++)
                    sum[j] += row[j];
            } else {
                const double *row = (const double *)dy[t] + r * o;
                double *sum = db;
                for (int j = 0; j < o; j++)
                    sum[j] += row[j];
            }
        }
}

#define BUF(i) ((void *)STARPU_VECTOR_GET_PTR(buffers[i]))
#define NX(i) ((int64_t)STARPU_VECTOR_GET_NX(buffers[i]))

static void linear_forward_cpu(void *buffers[], void *cl_arg)
{
    tsl_linear_args a;
    starpu_codelet_unpack_args(cl_arg, &a);
    int yb = a.has_bias ? 3 : 2;
    TSL_CODELET_CHECK(NX(0) == a.rows * a.in && NX(1) == a.out * a.in && NX(yb) == a.rows * a.out,
                      "linear forward: tile sizes");
    tsl_linear_forward_kernel(&a, BUF(0), BUF(1), a.has_bias ? BUF(2) : NULL, BUF(yb));
}

static void linear_backward_data_cpu(void *buffers[], void *cl_arg)
{
    tsl_linear_args a;
    starpu_codelet_unpack_args(cl_arg, &a);
    TSL_CODELET_CHECK(NX(0) == a.rows * a.out && NX(2) == a.rows * a.in,
                      "linear backward data: tile sizes");
    tsl_linear_backward_data_kernel(&a, BUF(0), BUF(1), BUF(2));
}

static void linear_backward_weights_cpu(void *buffers[], void *cl_arg)
{
    tsl_linear_args a;
    starpu_codelet_unpack_args(cl_arg, &a);
    TSL_CODELET_CHECK(NX(2) == a.out * a.in, "linear backward weights: tile sizes");
    tsl_linear_backward_weights_kernel(&a, BUF(0), BUF(1), BUF(2), a.has_bias ? BUF(3) : NULL);
}

static void linear_weight_rows_cpu(void *buffers[], void *cl_arg)
{
    tsl_linear_rows_args a;
    starpu_codelet_unpack_args(cl_arg, &a);
    TSL_CODELET_CHECK(a.ntiles >= 1 && a.ntiles <= TSL_LINEAR_MAX_TILES,
                      "linear weight rows: tile count");
    const void *x[TSL_LINEAR_MAX_TILES], *dy[TSL_LINEAR_MAX_TILES];
    for (int t = 0; t < a.ntiles; t++) {
        TSL_CODELET_CHECK(NX(2 * t) == a.samples[t] * a.in && NX(2 * t + 1) == a.samples[t] * a.out,
                          "linear weight rows: tile sizes");
        x[t] = BUF(2 * t);
        dy[t] = BUF(2 * t + 1);
    }
    int at = 2 * a.ntiles;
    TSL_CODELET_CHECK(NX(at) == a.nrows * a.in && (!a.has_bias || NX(at + 1) == a.out),
                      "linear weight rows: gradient sizes");
    tsl_linear_weight_rows_kernel(&a, x, dy, BUF(at), a.has_bias ? BUF(at + 1) : NULL);
}

/* The footprint: the tile sizes, the dtype, the bias and the layer's shape. */
static uint32_t linear_variant(struct starpu_task *task)
{
    tsl_linear_args a;
    starpu_codelet_unpack_args(task->cl_arg, &a);
    uint32_t h = starpu_task_data_footprint(task);
    h = tsl_hash_i64(h, a.dtype);
    h = tsl_hash_i64(h, a.has_bias);
    h = tsl_hash_i64(h, a.in);
    return tsl_hash_i64(h, a.out);
}

/* The footprint: the tile sizes, the dtype, the bias, the layer's shape and the row block. */
static uint32_t weight_rows_variant(struct starpu_task *task)
{
    tsl_linear_rows_args a;
    starpu_codelet_unpack_args(task->cl_arg, &a);
    uint32_t h = starpu_task_data_footprint(task);
    h = tsl_hash_i64(h, a.dtype);
    h = tsl_hash_i64(h, a.has_bias);
    h = tsl_hash_i64(h, a.in);
    h = tsl_hash_i64(h, a.out);
    return tsl_hash_i64(h, a.nrows);
}

TSL_CODELET(tsl_cl_linear_forward, "tsl_linear_fwd", linear_forward_cpu, tsl_linear_forward_cuda,
            linear_variant, .nbuffers = STARPU_VARIABLE_NBUFFERS);
TSL_CODELET(tsl_cl_linear_backward_data, "tsl_linear_bwd_data", linear_backward_data_cpu,
            tsl_linear_backward_data_cuda, linear_variant, .nbuffers = 3,
            .modes = {STARPU_R, STARPU_R, STARPU_W});
TSL_CODELET(tsl_cl_linear_weight_rows, "tsl_linear_weight_rows", linear_weight_rows_cpu,
            tsl_linear_weight_rows_cuda, weight_rows_variant, .nbuffers = STARPU_VARIABLE_NBUFFERS);
TSL_CODELET(tsl_cl_linear_backward_weights, "tsl_linear_bwd_weights", linear_backward_weights_cpu,
            tsl_linear_backward_weights_cuda, linear_variant, .nbuffers = STARPU_VARIABLE_NBUFFERS);
