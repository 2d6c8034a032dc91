/* Batch normalization kernels and codelets: see batchnorm.h. Tiles are (samples, cext,
 * inner) blocks in C order; channel c of the tile is channel c0 + c of the tensor. */
#include <math.h>
#include <string.h>

#include "batchnorm.h"
#include "check.h"
#include "scalar.h"

/* Per-element terms are staged in chunks and summed by the binned exact path. */
#define CHUNK 8192
static _Thread_local double stage_hi[CHUNK], stage_lo[CHUNK];

/* acc += sum of v^2 over a run, exactly: for floats the square is exact in double; for
 * doubles it is the rounded square plus its rounding error (fma). */
static void add_squares(tsl_acc *acc, int dtype, const void *x, int64_t base, int64_t count)
{
    if (dtype == TSL_F32) {
        tsl_acc_add_squares_f32(acc, (const float *)x + base, count);
        return;
    }
    for (int64_t done = 0; done < count; done += CHUNK) {
        int64_t len = count - done < CHUNK ? count - done : CHUNK;
        for (int64_t i = 0; i < len; i++) {
            double v = tsl_load(dtype, x, base + done + i);
            stage_hi[i] = v * v;
            stage_lo[i] = fma(v, v, -stage_hi[i]);
        }
        tsl_acc_add_array(acc, TSL_F64, stage_hi, len);
        tsl_acc_add_array(acc, TSL_F64, stage_lo, len);
    }
}

void tsl_bn_stats_tile(const tsl_bn_args *a, const void *x, tsl_acc *acc)
{
    for (int64_t k = 0; k < 2 * a->channels; k++)
        tsl_acc_init(&acc[k]);
    size_t esize = a->dtype == TSL_F32 ? 4 : 8;
    for (int64_t s = 0; s < a->samples; s++)
        for (int64_t c = 0; c < a->cext; c++) {
            int64_t base = (s * a->cext + c) * a->inner;
            tsl_acc *sum = &acc[2 * (a->c0 + c)];
            tsl_acc_add_array(sum, (tsl_dtype)a->dtype, (const char *)x + (size_t)base * esize,
                              a->inner);
            add_squares(sum + 1, a->dtype, x, base, a->inner);
        }
    for (int64_t k = 0; k < 2 * a->channels; k++)
        tsl_acc_normalize(&acc[k]);
}

/* Batch mean and biased variance of channel c from the totals. */
static void channel_moments(const tsl_bn_args *a, const tsl_acc *acc, int64_t c, double *mean,
                            double *var)
{
    const double m = (double)a->per_channel;
    *mean = tsl_acc_round(&acc[2 * c]) / m;
    *var = tsl_acc_round(&acc[2 * c + 1]) / m - *mean * *mean;
    if (*var < 0)
        *var = 0;
}

void tsl_bn_finalize(const tsl_bn_args *a, const tsl_acc *acc, double *saved)
{
    for (int64_t c = 0; c < a->channels; c++) {
        double mean, var;
        channel_moments(a, acc, c, &mean, &var);
        saved[c] = mean;
        saved[a->channels + c] = 1.0 / sqrt(var + a->eps);
    }
}

void tsl_bn_running(const tsl_bn_args *a, const tsl_acc *acc, void *running)
{
    const double m = (double)a->per_channel;
    for (int64_t c = 0; c < a->channels; c++) {
        double mean, var;
        channel_moments(a, acc, c, &mean, &var);
        double batch = a->which == 0 ? mean : m > 1 ? var * m / (m - 1) : var;
        tsl_store(a->dtype, running, c,
                  (1 - a->momentum) * tsl_load(a->dtype, running, c) + a->momentum * batch);
    }
}

void tsl_bn_normalize_tile(const tsl_bn_args *a, const void *x, const double *saved,
                           const void *gamma, const void *beta, void *y)
{
    for (int64_t s = 0; s < a->samples; s++)
        for (int64_t c = 0; c < a->cext; c++) {
            int64_t ch = a->c0 + c, base = (s * a->cext + c) * a->inner;
            double mean = saved[ch], invstd = saved[a->channels + ch];
            double g = tsl_load(a->dtype, gamma, ch), b = tsl_load(a->dtype, beta, ch);
            for (int64_t i = 0; i < a->inner; i++)
                tsl_store(a->dtype, y, base + i,
                          (tsl_load(a->dtype, x, base + i) - mean) * invstd * g + b);
        }
}

void tsl_bn_infer_tile(const tsl_bn_args *a, const void *x, const void *running_mean,
                       const void *running_var, const void *gamma, const void *beta, void *y)
{
    for (int64_t s = 0; s < a->samples; s++)
        for (int64_t c = 0; c < a->cext; c++) {
            int64_t ch = a->c0 + c, base = (s * a->cext + c) * a->inner;
            double mean = tsl_load(a->dtype, running_mean, ch);
            double invstd = 1.0 / sqrt(tsl_load(a->dtype, running_var, ch) + a->eps);
            double g = tsl_load(a->dtype, gamma, ch), b = tsl_load(a->dtype, beta, ch);
            for (int64_t i = 0; i < a->inner; i++)
                tsl_store(a->dtype, y, base + i,
                          (tsl_load(a->dtype, x, base + i) - mean) * invstd * g + b);
        }
}

void tsl_bn_backward_stats_tile(const tsl_bn_args *a, const void *x, const void *dy,
                                const double *saved, tsl_acc *acc)
{
    for (int64_t k = 0; k < 2 * a->channels; k++)
        tsl_acc_init(&acc[k]);
    size_t esize = a->dtype == TSL_F32 ? 4 : 8;
    for (int64_t s = 0; s < a->samples; s++)
        for (int64_t c = 0; c < a->cext; c++) {
            int64_t ch = a->c0 + c, base = (s * a->cext + c) * a->inner;
            double mean = saved[ch], invstd = saved[a->channels + ch];
            tsl_acc_add_array(&acc[2 * ch], (tsl_dtype)a->dtype,
                              (const char *)dy + (size_t)base * esize, a->inner);
            for (int64_t done = 0; done < a->inner; done += CHUNK) {
                int64_t len = a->inner - done < CHUNK ? a->inner - done : CHUNK;
                for (int64_t i = 0; i < len; i++) {
                    int64_t at = base + done + i;
                    stage_hi[i] =
                        tsl_load(a->dtype, dy, at) * ((tsl_load(a->dtype, x, at) - mean) * invstd);
                }
                tsl_acc_add_array(&acc[2 * ch + 1], TSL_F64, stage_hi, len);
            }
        }
    for (int64_t k = 0; k < 2 * a->channels; k++)
        tsl_acc_normalize(&acc[k]);
}

void tsl_bn_backward_coef(const tsl_bn_args *a, const tsl_acc *acc, double *coef)
{
    const double m = (double)a->per_channel;
    for (int64_t c = 0; c < a->channels; c++) {
        coef[c] = tsl_acc_round(&acc[2 * c]) / m;
        coef[a->channels + c] = tsl_acc_round(&acc[2 * c + 1]) / m;
    }
}

void tsl_bn_param_grad(const tsl_bn_args *a, const tsl_acc *acc, void *grad)
{
    for (int64_t c = 0; c < a->channels; c++)
        tsl_store(a->dtype, grad, c, tsl_acc_round(&acc[2 * c + (a->which == 1)]));
}

void tsl_bn_backward_data_tile(const tsl_bn_args *a, const void *x, const void *dy,
                               const double *saved, const void *gamma, const double *coef, void *dx)
{
    for (int64_t s = 0; s < a->samples; s++)
        for (int64_t c = 0; c < a->cext; c++) {
            int64_t ch = a->c0 + c, base = (s * a->cext + c) * a->inner;
            double mean = saved[ch], invstd = saved[a->channels + ch];
            double scale = tsl_load(a->dtype, gamma, ch) * invstd;
            double mean_dy = coef[ch], mean_dy_xhat = coef[a->channels + ch];
            for (int64_t i = 0; i < a->inner; i++) {
                double xhat = (tsl_load(a->dtype, x, base + i) - mean) * invstd;
                double g = tsl_load(a->dtype, dy, base + i);
                tsl_store(a->dtype, dx, base + i, scale * (g - mean_dy - xhat * mean_dy_xhat));
            }
        }
}

#define BUF(i) ((void *)STARPU_VECTOR_GET_PTR(buffers[i]))
#define NX(i) ((int64_t)STARPU_VECTOR_GET_NX(buffers[i]))
#define ACC_OK(i, a)                                                                               \
    (NX(i) * (int64_t)sizeof(int64_t) == 2 * (a).channels * (int64_t)sizeof(tsl_acc))

static void stats_cpu(void *buffers[], void *cl_arg)
{
    tsl_bn_args a;
    starpu_codelet_unpack_args(cl_arg, &a);
    TSL_CODELET_CHECK(NX(0) == a.samples * a.cext * a.inner && ACC_OK(1, a), "bn stats: sizes");
    tsl_bn_stats_tile(&a, BUF(0), BUF(1));
}

static void finalize_cpu(void *buffers[], void *cl_arg)
{
    tsl_bn_args a;
    starpu_codelet_unpack_args(cl_arg, &a);
    TSL_CODELET_CHECK(ACC_OK(0, a) && NX(1) == 2 * a.channels, "bn finalize: sizes");
    tsl_bn_finalize(&a, BUF(0), BUF(1));
}

static void running_cpu(void *buffers[], void *cl_arg)
{
    tsl_bn_args a;
    starpu_codelet_unpack_args(cl_arg, &a);
    TSL_CODELET_CHECK(ACC_OK(0, a) && NX(1) == a.channels, "bn running statistics: sizes");
    tsl_bn_running(&a, BUF(0), BUF(1));
}

static void normalize_cpu(void *buffers[], void *cl_arg)
{
    tsl_bn_args a;
    starpu_codelet_unpack_args(cl_arg, &a);
    TSL_CODELET_CHECK(NX(4) == a.samples * a.cext * a.inner, "bn normalize: sizes");
    tsl_bn_normalize_tile(&a, BUF(0), BUF(1), BUF(2), BUF(3), BUF(4));
}

static void infer_cpu(void *buffers[], void *cl_arg)
{
    tsl_bn_args a;
    starpu_codelet_unpack_args(cl_arg, &a);
    TSL_CODELET_CHECK(NX(5) == a.samples * a.cext * a.inner, "bn inference: sizes");
    tsl_bn_infer_tile(&a, BUF(0), BUF(1), BUF(2), BUF(3), BUF(4), BUF(5));
}

static void bwd_stats_cpu(void *buffers[], void *cl_arg)
{
    tsl_bn_args a;
    starpu_codelet_unpack_args(cl_arg, &a);
    TSL_CODELET_CHECK(ACC_OK(3, a), "bn backward stats: sizes");
    tsl_bn_backward_stats_tile(&a, BUF(0), BUF(1), BUF(2), BUF(3));
}

static void bwd_coef_cpu(void *buffers[], void *cl_arg)
{
    tsl_bn_args a;
    starpu_codelet_unpack_args(cl_arg, &a);
    TSL_CODELET_CHECK(ACC_OK(0, a) && NX(1) == 2 * a.channels, "bn backward coef: sizes");
    tsl_bn_backward_coef(&a, BUF(0), BUF(1));
}

static void param_grad_cpu(void *buffers[], void *cl_arg)
{
    tsl_bn_args a;
    starpu_codelet_unpack_args(cl_arg, &a);
    TSL_CODELET_CHECK(ACC_OK(0, a) && NX(1) == a.channels, "bn parameter gradient: sizes");
    tsl_bn_param_grad(&a, BUF(0), BUF(1));
}

static void bwd_data_cpu(void *buffers[], void *cl_arg)
{
    tsl_bn_args a;
    starpu_codelet_unpack_args(cl_arg, &a);
    TSL_CODELET_CHECK(NX(5) == a.samples * a.cext * a.inner, "bn backward data: sizes");
    tsl_bn_backward_data_tile(&a, BUF(0), BUF(1), BUF(2), BUF(3), BUF(4), BUF(5));
}

#define BN_MODEL(var, sym)                                                                         \
    static struct starpu_perfmodel var = {.type = STARPU_HISTORY_BASED, .symbol = sym}
BN_MODEL(stats_model, "tsl_bn_stats");
BN_MODEL(finalize_model, "tsl_bn_finalize");
BN_MODEL(running_model, "tsl_bn_running");
BN_MODEL(param_grad_model, "tsl_bn_param_grad");
BN_MODEL(normalize_model, "tsl_bn_normalize");
BN_MODEL(infer_model, "tsl_bn_infer");
BN_MODEL(bwd_stats_model, "tsl_bn_bwd_stats");
BN_MODEL(bwd_coef_model, "tsl_bn_bwd_coef");
BN_MODEL(bwd_data_model, "tsl_bn_bwd_data");

struct starpu_codelet tsl_cl_bn_stats = {
    .cpu_funcs = {stats_cpu},
    .cpu_funcs_name = {"bn_stats_cpu"},
    .nbuffers = 2,
    .modes = {STARPU_R, STARPU_W},
    .model = &stats_model,
    .name = "tsl_bn_stats",
};

struct starpu_codelet tsl_cl_bn_finalize = {
    .cpu_funcs = {finalize_cpu},
    .cpu_funcs_name = {"bn_finalize_cpu"},
    .nbuffers = 2,
    .modes = {STARPU_R, STARPU_W},
    .model = &finalize_model,
    .name = "tsl_bn_finalize",
};

struct starpu_codelet tsl_cl_bn_running = {
    .cpu_funcs = {running_cpu},
    .cpu_funcs_name = {"bn_running_cpu"},
    .nbuffers = 2,
    .modes = {STARPU_R, STARPU_RW},
    .model = &running_model,
    .name = "tsl_bn_running",
};

struct starpu_codelet tsl_cl_bn_normalize = {
    .cpu_funcs = {normalize_cpu},
    .cpu_funcs_name = {"bn_normalize_cpu"},
    .nbuffers = 5,
    .modes = {STARPU_R, STARPU_R, STARPU_R, STARPU_R, STARPU_W},
    .model = &normalize_model,
    .name = "tsl_bn_normalize",
};

struct starpu_codelet tsl_cl_bn_infer = {
    .cpu_funcs = {infer_cpu},
    .cpu_funcs_name = {"bn_infer_cpu"},
    .nbuffers = 6,
    .modes = {STARPU_R, STARPU_R, STARPU_R, STARPU_R, STARPU_R, STARPU_W},
    .model = &infer_model,
    .name = "tsl_bn_infer",
};

struct starpu_codelet tsl_cl_bn_bwd_stats = {
    .cpu_funcs = {bwd_stats_cpu},
    .cpu_funcs_name = {"bn_bwd_stats_cpu"},
    .nbuffers = 4,
    .modes = {STARPU_R, STARPU_R, STARPU_R, STARPU_W},
    .model = &bwd_stats_model,
    .name = "tsl_bn_bwd_stats",
};

struct starpu_codelet tsl_cl_bn_bwd_coef = {
    .cpu_funcs = {bwd_coef_cpu},
    .cpu_funcs_name = {"bn_bwd_coef_cpu"},
    .nbuffers = 2,
    .modes = {STARPU_R, STARPU_W},
    .model = &bwd_coef_model,
    .name = "tsl_bn_bwd_coef",
};

struct starpu_codelet tsl_cl_bn_param_grad = {
    .cpu_funcs = {param_grad_cpu},
    .cpu_funcs_name = {"bn_param_grad_cpu"},
    .nbuffers = 2,
    .modes = {STARPU_R, STARPU_W},
    .model = &param_grad_model,
    .name = "tsl_bn_param_grad",
};

struct starpu_codelet tsl_cl_bn_bwd_data = {
    .cpu_funcs = {bwd_data_cpu},
    .cpu_funcs_name = {"bn_bwd_data_cpu"},
    .nbuffers = 6,
    .modes = {STARPU_R, STARPU_R, STARPU_R, STARPU_R, STARPU_R, STARPU_W},
    .model = &bwd_data_model,
    .name = "tsl_bn_bwd_data",
};
