/* Fully connected layer on one tile of samples, with OpenBLAS (one thread: the context sets
 * OpenBLAS to a single thread, parallelism comes from tiles). */
#include <cblas.h>

#include "check.h"
#include "linear.h"
#include "scalar.h"
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

static void forward_cpu(void *buffers[], void *cl_arg)
{
    tsl_linear_args a;
    starpu_codelet_unpack_args(cl_arg, &a);
    int yb = a.has_bias ? 3 : 2;
    TSL_CODELET_CHECK(NX(0) == a.rows * a.in && NX(1) == a.out * a.in && NX(yb) == a.rows * a.out,
                      "linear forward: tile sizes");
    tsl_linear_forward_kernel(&a, BUF(0), BUF(1), a.has_bias ? BUF(2) : NULL, BUF(yb));
}

static void backward_data_cpu(void *buffers[], void *cl_arg)
{
    tsl_linear_args a;
    starpu_codelet_unpack_args(cl_arg, &a);
    TSL_CODELET_CHECK(NX(0) == a.rows * a.out && NX(2) == a.rows * a.in,
                      "linear backward data: tile sizes");
    tsl_linear_backward_data_kernel(&a, BUF(0), BUF(1), BUF(2));
}

static void backward_weights_cpu(void *buffers[], void *cl_arg)
{
    tsl_linear_args a;
    starpu_codelet_unpack_args(cl_arg, &a);
    TSL_CODELET_CHECK(NX(2) == a.out * a.in, "linear backward weights: tile sizes");
    tsl_linear_backward_weights_kernel(&a, BUF(0), BUF(1), BUF(2), a.has_bias ? BUF(3) : NULL);
}

static void weight_rows_cpu(void *buffers[], void *cl_arg)
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

static struct starpu_perfmodel forward_model = {
    .type = STARPU_HISTORY_BASED,
    .symbol = "tsl_linear_fwd",
};
static struct starpu_perfmodel backward_data_model = {
    .type = STARPU_HISTORY_BASED,
    .symbol = "tsl_linear_bwd_data",
};
static struct starpu_perfmodel backward_weights_model = {
    .type = STARPU_HISTORY_BASED,
    .symbol = "tsl_linear_bwd_weights",
};

struct starpu_codelet tsl_cl_linear_forward = {
    .cpu_funcs = {forward_cpu},
    .cpu_funcs_name = {"linear_forward_cpu"},
    .nbuffers = STARPU_VARIABLE_NBUFFERS,
    .model = &forward_model,
    .name = "tsl_linear_fwd",
};

struct starpu_codelet tsl_cl_linear_backward_data = {
    .cpu_funcs = {backward_data_cpu},
    .cpu_funcs_name = {"linear_backward_data_cpu"},
    .nbuffers = 3,
    .modes = {STARPU_R, STARPU_R, STARPU_W},
    .model = &backward_data_model,
    .name = "tsl_linear_bwd_data",
};

static struct starpu_perfmodel weight_rows_model = {
    .type = STARPU_HISTORY_BASED,
    .symbol = "tsl_linear_weight_rows",
};

struct starpu_codelet tsl_cl_linear_weight_rows = {
    .cpu_funcs = {weight_rows_cpu},
    .cpu_funcs_name = {"linear_weight_rows_cpu"},
    .nbuffers = STARPU_VARIABLE_NBUFFERS,
    .model = &weight_rows_model,
    .name = "tsl_linear_weight_rows",
};

struct starpu_codelet tsl_cl_linear_backward_weights = {
    .cpu_funcs = {backward_weights_cpu},
    .cpu_funcs_name = {"linear_backward_weights_cpu"},
    .nbuffers = STARPU_VARIABLE_NBUFFERS,
    .model = &backward_weights_model,
    .name = "tsl_linear_bwd_weights",
};
