/* Batch normalization's sums: the per-tile statistics, their finalization into the saved
 * mean and inverse deviation, the running statistics, and the backward's coefficients and
 * parameter gradients from the totals; see batchnorm.h. Tiles are (samples, cext, inner)
 * blocks in C order, or channels-last; the sums go through the float32 entry points of the
 * exact accumulator (codelets/reduce.c). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "batchnorm.h"
#include "batchnorm_internal.h"
#include "batchnorm_math.h"
#include "codelet.h"

/* This thread's buffers, through a call: in a shared library a thread-local access may call
 * __tls_get_addr, and compilers redo it inside loops when they see the variable. */
__attribute__((noinline)) stage_buffers *tsl_bn_thread_stage(void)
{
    static _Thread_local stage_buffers buffers;
    return &buffers;
}

/* sum += a[i] and products += a[i] * b[i] for doubles, exactly: a product is its rounded
 * value plus its rounding error (fma), each summed exactly. (Exact unless a product
 * overflows or falls below 2^-969, where the error term is no longer exact.) */
void tsl_bn_add_sum_products_f64(tsl_acc *sum, tsl_acc *products, const double *a, const double *b,
                                 int64_t count)
{
    double *hi = tsl_bn_thread_stage()->hi, *lo = tsl_bn_thread_stage()->lo;
    if (sum)
        tsl_acc_add_array(sum, TSL_F64, a, count);
    for (int64_t done = 0; done < count; done += CHUNK) {
        int64_t len = count - done < CHUNK ? count - done : CHUNK;
        for (int64_t i = 0; i < len; i++) {
            hi[i] = a[done + i] * b[done + i];
            lo[i] = fma(a[done + i], b[done + i], -hi[i]);
        }
        tsl_acc_add_array(products, TSL_F64, hi, len);
        tsl_acc_add_array(products, TSL_F64, lo, len);
    }
}

/* Positions per transposed block: their cext channels stay in L1 while the block's rows are
 * written, a run of contiguous elements each. */
#define CL_TRANSPOSE_BLOCK 32

/* Stage positions [p0, p0 + n) of sample s of a float64 tile: dst[c * S + i] =
 * src[(s, p0 + i, c)]. (Float32 tiles are summed in place, tsl_acc_add_columns_f32.) */
TSL_VECTOR_KERNEL
void tsl_bn_cl_transpose(const tsl_bn_args *a, const void *src, void *dst, int64_t s, int64_t p0,
                         int64_t n, int64_t S)
{
    TSL_CODELET_CHECK(a->dtype == TSL_F64, "batch norm: only float64 tiles are staged");
    const int64_t C = a->cext;
    const double *in = (const double *)src + (s * a->inner + p0) * C;
    double *out = dst;
    for (int64_t i0 = 0; i0 < n; i0 += CL_TRANSPOSE_BLOCK) {
        const int64_t m = n - i0 < CL_TRANSPOSE_BLOCK ? n - i0 : CL_TRANSPOSE_BLOCK;
        const double *blk = in + i0 * C;
        for (int64_t c = 0; c < C; c++) {
            double *row = out + c * S + i0;
            for (int64_t i = 0; i < m; i++)
                row[i] = blk[i * C + c];
        }
    }
}

static void cl_stats(const tsl_bn_args *a, const void *x, tsl_acc *acc)
{
    if (a->dtype == TSL_F32) { /* the channels are the columns of a (positions x cext) block */
        tsl_acc_add_columns_f32(&acc[2 * (a->c0 - a->acc_first)], 2,
                                &acc[2 * (a->c0 - a->acc_first) + 1], 2, x, NULL,
                                a->samples * a->inner, a->cext);
        return;
    }
    const int64_t P = cl_positions(a), S = cl_stride(a);
    void *stage = cl_staging(a, 1);
    for (int64_t s = 0; s < a->samples; s++)
        for (int64_t p0 = 0; p0 < a->inner; p0 += P) {
            int64_t n = a->inner - p0 < P ? a->inner - p0 : P;
            tsl_bn_cl_transpose(a, x, stage, s, p0, n, S);
            for (int64_t c = 0; c < a->cext; c++) {
                tsl_acc *sum = &acc[2 * (a->c0 - a->acc_first + c)];
                const double *row = cl_row(a, stage, c, S);
                tsl_bn_add_sum_products_f64(sum, sum + 1, row, row, n);
            }
        }
    free(stage);
}

void tsl_bn_stats_tile(const tsl_bn_args *a, const void *x, tsl_acc *acc)
{
    for (int64_t k = 0; k < 2 * a->acc_count; k++)
        tsl_acc_init(&acc[k]);
    if (a->channels_last)
        cl_stats(a, x, acc);
    for (int64_t s = 0; s < a->samples && !a->channels_last; s++)
        for (int64_t c = 0; c < a->cext; c++) {
            int64_t base = row_base(a, s, c);
            tsl_acc *sum = &acc[2 * (a->c0 - a->acc_first + c)];
            if (a->dtype == TSL_F32) {
                tsl_acc_add_moments_f32(sum, sum + 1, (const float *)x + base, a->inner);
            } else {
                const double *row = (const double *)x + base;
                tsl_bn_add_sum_products_f64(sum, sum + 1, row, row, a->inner);
            }
        }
    for (int64_t k = 0; k < 2 * a->acc_count; k++)
        tsl_acc_normalize(&acc[k]);
}

/* Batch mean and biased variance of channel c from the totals. */
static void channel_moments(const tsl_bn_args *a, const tsl_acc *acc, int64_t c, double *mean,
                            double *var)
{
    tsl_acc scratch;
    tsl_bn_moments((double)a->per_channel, &acc[2 * c], &scratch, mean, var);
}

void tsl_bn_finalize(const tsl_bn_args *a, const tsl_acc *acc, double *saved)
{
    for (int64_t c = 0; c < a->channels; c++) {
        double mean, var;
        channel_moments(a, acc, c, &mean, &var);
        saved[c] = mean;
        saved[a->channels + c] = tsl_hd_invstd(var + a->eps);
    }
}

void tsl_bn_running(const tsl_bn_args *a, const tsl_acc *acc, void *running)
{
    const double m = (double)a->per_channel;
    for (int64_t c = 0; c < a->channels; c++) {
        double mean, var;
        channel_moments(a, acc, c, &mean, &var);
        tsl_store(a->dtype, running, c,
                  tsl_bn_running_value(m, a->which, a->momentum, tsl_load(a->dtype, running, c),
                                       mean, var));
    }
}

/* sum(dy * xhat) of channel c (batchnorm_math.h). */
static double sum_dy_xhat(const tsl_bn_args *a, const tsl_acc *acc, const double *saved, int64_t c)
{
    tsl_acc scratch;
    return tsl_bn_sum_dy_xhat(&acc[2 * c], &scratch, saved[c], saved[a->channels + c]);
}

void tsl_bn_backward_coef(const tsl_bn_args *a, const tsl_acc *acc, const double *saved,
                          double *coef)
{
    const double m = (double)a->per_channel;
    for (int64_t c = 0; c < a->channels; c++) {
        coef[c] = tsl_acc_round(&acc[2 * c]) / m;
        coef[a->channels + c] = sum_dy_xhat(a, acc, saved, c) / m;
    }
}

void tsl_bn_param_grad(const tsl_bn_args *a, const tsl_acc *acc, const double *saved, void *grad)
{
    for (int64_t c = 0; c < a->channels; c++)
        tsl_store(a->dtype, grad, c,
                  a->which == 1 ? sum_dy_xhat(a, acc, saved, c) : tsl_acc_round(&acc[2 * c]));
}
