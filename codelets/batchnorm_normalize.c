/* Batch normalization's elementwise passes (normalize, inference, backward data) and the
 * backward's sums under the fused ReLU's mask; see batchnorm.h. Tiles are (samples, cext,
 * inner) blocks in C order; channel c of the tile is channel c0 + c of the tensor. The
 * element loops are always-inline functions of a constant dtype (and ReLU flag), so float32
 * tiles run loops specialised for float, without a per-element dtype switch. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "batchnorm.h"
#include "batchnorm_internal.h"
#include "batchnorm_math.h"
#include "codelet.h"

/* Training mode: scale = invstd * gamma, shift = beta (0 when beta is NULL). */
static tsl_bn_affine train_affine(const tsl_bn_args *a, const double *saved, const void *gamma,
                                  const void *beta, int64_t ch)
{
    return tsl_bn_train_affine(saved[ch], saved[a->channels + ch], tsl_load(a->dtype, gamma, ch),
                               beta ? tsl_load(a->dtype, beta, ch) : 0.0);
}

/* y = affine(x), then max(y, 0) when RELU (as tsl_act_forward: NaN gives 0), on one row. */
ROW_INLINE void affine_row(const int DTYPE, const int RELU, const void *x, void *y, int64_t base,
                           int64_t n, tsl_bn_affine f)
{
    if (DTYPE == TSL_F32) {
        const float *in = (const float *)x + base;
        float *out = (float *)y + base;
        for (int64_t i = 0; i < n; i++) {
            float v = tsl_bn_affine_f32(in[i], f.mean, f.scale, f.shift);
            out[i] = RELU ? (v > 0 ? v : 0.0f) : v; /* NaN and -0 give +0 */
        }
    } else {
        const double *in = (const double *)x + base;
        double *out = (double *)y + base;
        for (int64_t i = 0; i < n; i++) {
            double v = tsl_bn_affine_f64(in[i], f.mean, f.scale, f.shift);
            out[i] = RELU ? (v > 0 ? v : 0.0) : v;
        }
    }
}

static void affine_rows(const tsl_bn_args *a, const void *x, void *y, int64_t base, tsl_bn_affine f)
{
    if (a->dtype == TSL_F32 && a->relu)
        affine_row(TSL_F32, 1, x, y, base, a->inner, f);
    else if (a->dtype == TSL_F32)
        affine_row(TSL_F32, 0, x, y, base, a->inner, f);
    else if (a->relu)
        affine_row(TSL_F64, 1, x, y, base, a->inner, f);
    else
        affine_row(TSL_F64, 0, x, y, base, a->inner, f);
}

/* Per-channel affines of a channels-last tile as arrays (mean, scale, shift: 3 x cext). */
static double *cl_constants(const tsl_bn_args *a, int arrays)
{
    double *k = malloc(sizeof(double) * (size_t)(arrays * a->cext));
    TSL_CODELET_CHECK(k, "batch norm: out of memory for per-channel constants");
    return k;
}

/* affine_row over a channels-last tile: element (r, c) uses channel c's affine in k. */
ROW_INLINE void cl_affine_rows(const int DTYPE, const int RELU, const tsl_bn_args *a, const void *x,
                               void *y, const double *k)
{
    const int64_t C = a->cext, rows = a->samples * a->inner;
    const double *mean = k, *scale = k + C, *shift = k + 2 * C;
    for (int64_t r = 0; r < rows; r++) {
        if (DTYPE == TSL_F32) {
            const float *in = (const float *)x + r * C;
            float *out = (float *)y + r * C;
            for (int64_t c = 0; c < C; c++) {
                float v = tsl_bn_affine_f32(in[c], mean[c], scale[c], shift[c]);
                out[c] = RELU ? (v > 0 ? v : 0.0f) : v;
            }
        } else {
            const double *in = (const double *)x + r * C;
            double *out = (double *)y + r * C;
            for (int64_t c = 0; c < C; c++) {
                double v = tsl_bn_affine_f64(in[c], mean[c], scale[c], shift[c]);
                out[c] = RELU ? (v > 0 ? v : 0.0) : v;
            }
        }
    }
}

/* y = affine(x) on the whole tile, f(c) giving tile channel c's affine. */
typedef tsl_bn_affine (*affine_of)(const tsl_bn_args *a, int64_t c, const void *const *p);

TSL_VECTOR_KERNEL
static void affine_tile(const tsl_bn_args *a, const void *x, void *y, affine_of f,
                        const void *const *p)
{
    if (!a->channels_last) {
        for (int64_t s = 0; s < a->samples; s++)
            for (int64_t c = 0; c < a->cext; c++)
                affine_rows(a, x, y, row_base(a, s, c), f(a, c, p));
        return;
    }
    const int64_t C = a->cext;
    double *k = cl_constants(a, 3);
    for (int64_t c = 0; c < C; c++) {
        tsl_bn_affine fc = f(a, c, p);
        k[c] = fc.mean;
        k[C + c] = fc.scale;
        k[2 * C + c] = fc.shift;
    }
    if (a->dtype == TSL_F32 && a->relu)
        cl_affine_rows(TSL_F32, 1, a, x, y, k);
    else if (a->dtype == TSL_F32)
        cl_affine_rows(TSL_F32, 0, a, x, y, k);
    else if (a->relu)
        cl_affine_rows(TSL_F64, 1, a, x, y, k);
    else
        cl_affine_rows(TSL_F64, 0, a, x, y, k);
    free(k);
}

/* Training: p = {saved, gamma, beta}. */
static tsl_bn_affine train_affine_of(const tsl_bn_args *a, int64_t c, const void *const *p)
{
    return train_affine(a, p[0], p[1], p[2], a->c0 + c);
}

void tsl_bn_normalize_tile(const tsl_bn_args *a, const void *x, const double *saved,
                           const void *gamma, const void *beta, void *y)
{
    const void *p[3] = {saved, gamma, beta};
    affine_tile(a, x, y, train_affine_of, p);
}

/* Inference: p = {running mean, running var, gamma, beta}. */
static tsl_bn_affine infer_affine_of(const tsl_bn_args *a, int64_t c, const void *const *p)
{
    int64_t ch = a->c0 + c;
    return tsl_bn_infer_affine(tsl_load(a->dtype, p[0], ch), tsl_load(a->dtype, p[1], ch),
                               tsl_load(a->dtype, p[2], ch), tsl_load(a->dtype, p[3], ch), a->eps);
}

void tsl_bn_infer_tile(const tsl_bn_args *a, const void *x, const void *running_mean,
                       const void *running_var, const void *gamma, const void *beta, void *y)
{
    const void *p[4] = {running_mean, running_var, gamma, beta};
    affine_tile(a, x, y, infer_affine_of, p);
}

/* The fused ReLU's mask in the backward: batchnorm_math.h. */
/* Elements [at, at + n) of dy (n <= CHUNK); with a fused ReLU, dy where the forward's y > 0
 * and 0 elsewhere, staged. */
TSL_VECTOR_KERNEL
static const void *gradient_chunk(const tsl_bn_args *a, const void *x, const void *dy, int64_t at,
                                  int64_t n, tsl_bn_relu_mask m)
{
    if (!a->relu)
        return (const char *)dy + (size_t)at * elem_size(a);
    if (a->dtype == TSL_F32) {
        const float *in = (const float *)x + at, *g = (const float *)dy + at;
        float *stage = tsl_bn_thread_stage()->f32;
        const float lo = (float)m.lo, hi = (float)m.hi;
        for (int64_t i = 0; i < n; i++)
            stage[i] = tsl_bn_keep_f32(g[i], (in[i] >= lo) & (in[i] <= hi));
        return stage;
    }
    const double *in = (const double *)x + at, *g = (const double *)dy + at;
    double *stage = tsl_bn_thread_stage()->f64;
    for (int64_t i = 0; i < n; i++) {
        double gi = g[i]; /* loaded unconditionally: the select vectorises */
        stage[i] = (in[i] >= m.lo) & (in[i] <= m.hi) ? gi : 0.0;
    }
    return stage;
}

/* Calls visit(at, n, g) for the chunks of tile channel c's rows: elements [at, at + n), g
 * being their dy (masked by the ReLU's mask m when a->relu). */
typedef void (*chunk_visit)(const tsl_bn_args *a, const void *x, int64_t at, int64_t n,
                            const void *g, void *user);

static void for_each_chunk(const tsl_bn_args *a, const void *x, const void *dy, int64_t c,
                           tsl_bn_relu_mask m, chunk_visit visit, void *user)
{
    for (int64_t s = 0; s < a->samples; s++) {
        int64_t base = row_base(a, s, c);
        for (int64_t done = 0; done < a->inner; done += CHUNK) {
            int64_t len = a->inner - done < CHUNK ? a->inner - done : CHUNK;
            visit(a, x, base + done, len, gradient_chunk(a, x, dy, base + done, len, m), user);
        }
    }
}

/* Channel ch's mask when a->relu (everything otherwise, unused then). */
static tsl_bn_relu_mask channel_mask(const tsl_bn_args *a, const double *saved, const void *gamma,
                                     const void *beta, int64_t ch)
{
    tsl_bn_relu_mask all = {-INFINITY, INFINITY};
    return a->relu ? tsl_bn_relu_mask_for(a->dtype, train_affine(a, saved, gamma, beta, ch)) : all;
}

/* acc[0] += sum g, acc[1] += sum g x over a chunk. */
static void add_chunk_sums(const tsl_bn_args *a, const void *x, int64_t at, int64_t n,
                           const void *g, void *user)
{
    tsl_acc *sum = user;
    if (a->dtype == TSL_F32)
        tsl_acc_add_sum_products_f32(sum, sum + 1, g, (const float *)x + at, n);
    else
        tsl_bn_add_sum_products_f64(sum, sum + 1, g, (const double *)x + at, n);
}

/* Rows per masked block of cl_backward_stats_f32. */
#define CL_MASK_ROWS 256

/* cl_backward_stats for float32: sum g and sum g x per channel straight from the channels-last
 * tile (its channels are the columns of a positions x cext block), g being dy masked by each
 * channel's fused-ReLU mask a block of rows at a time, as gradient_chunk masks a row. */
TSL_VECTOR_KERNEL
static void cl_backward_stats_f32(const tsl_bn_args *a, const void *x, const void *dy,
                                  const tsl_bn_relu_mask *m, tsl_acc *acc)
{
    const int64_t C = a->cext, rows = a->samples * a->inner;
    const float *xs = x, *gs = dy;
    tsl_acc *sum = &acc[2 * (a->c0 - a->acc_first)], *products = sum + 1;
    if (!a->relu) {
        tsl_acc_add_columns_f32(sum, 2, products, 2, gs, xs, rows, C);
        return;
    }
    float *lo = malloc(sizeof(float) * (size_t)(2 * C + CL_MASK_ROWS * C)), *hi = lo + C,
          *stage = hi + C;
    TSL_CODELET_CHECK(lo, "batch norm: out of memory for a masked block");
    for (int64_t c = 0; c < C; c++) {
        lo[c] = (float)m[c].lo;
        hi[c] = (float)m[c].hi;
    }
    for (int64_t r0 = 0; r0 < rows; r0 += CL_MASK_ROWS) {
        const int64_t n = rows - r0 < CL_MASK_ROWS ? rows - r0 : CL_MASK_ROWS;
        const float *xr = xs + r0 * C, *gr = gs + r0 * C;
        for (int64_t r = 0; r < n; r++)
            for (int64_t c = 0; c < C; c++) {
                float v = xr[r * C + c];
                stage[r * C + c] = tsl_bn_keep_f32(gr[r * C + c], (v >= lo[c]) & (v <= hi[c]));
            }
        tsl_acc_add_columns_f32(sum, 2, products, 2, stage, xr, n, C);
    }
    free(lo);
}

static void cl_backward_stats(const tsl_bn_args *a, const void *x, const void *dy,
                              const double *saved, const void *gamma, const void *beta,
                              tsl_acc *acc)
{
    const int64_t P = cl_positions(a), S = cl_stride(a), C = a->cext;
    tsl_bn_relu_mask *m = malloc(sizeof *m * (size_t)C);
    TSL_CODELET_CHECK(m, "batch norm: out of memory for the ReLU masks");
    for (int64_t c = 0; c < C; c++)
        m[c] = channel_mask(a, saved, gamma, beta, a->c0 + c);
    if (a->dtype == TSL_F32) {
        cl_backward_stats_f32(a, x, dy, m, acc);
        free(m);
        return;
    }
    char *stage = cl_staging(a, 2), *gstage = stage + (size_t)(C * S) * elem_size(a);
    for (int64_t s = 0; s < a->samples; s++)
        for (int64_t p0 = 0; p0 < a->inner; p0 += P) {
            int64_t n = a->inner - p0 < P ? a->inner - p0 : P;
            tsl_bn_cl_transpose(a, x, stage, s, p0, n, S);
            tsl_bn_cl_transpose(a, dy, gstage, s, p0, n, S);
            for (int64_t c = 0; c < C; c++) {
                const void *xr = cl_row(a, stage, c, S), *gr = cl_row(a, gstage, c, S);
                for (int64_t done = 0; done < n; done += CHUNK) {
                    int64_t len = n - done < CHUNK ? n - done : CHUNK;
                    add_chunk_sums(a, xr, done, len, gradient_chunk(a, xr, gr, done, len, m[c]),
                                   &acc[2 * (a->c0 - a->acc_first + c)]);
                }
            }
        }
    free(m);
    free(stage);
}

void tsl_bn_backward_stats_tile(const tsl_bn_args *a, const void *x, const void *dy,
                                const double *saved, const void *gamma, const void *beta,
                                tsl_acc *acc)
{
    for (int64_t k = 0; k < 2 * a->acc_count; k++)
        tsl_acc_init(&acc[k]);
    if (a->channels_last)
        cl_backward_stats(a, x, dy, saved, gamma, beta, acc);
    for (int64_t c = 0; c < a->cext && !a->channels_last; c++) {
        int64_t ch = a->c0 + c;
        for_each_chunk(a, x, dy, c, channel_mask(a, saved, gamma, beta, ch), add_chunk_sums,
                       &acc[2 * (ch - a->acc_first)]);
    }
    for (int64_t k = 0; k < 2 * a->acc_count; k++)
        tsl_acc_normalize(&acc[k]);
}

/* dx = f.scale * ((g - mean_dy) - (x - f.mean) * slope) on elements [at, at + n), g being
 * those elements' (masked) dy; f.scale is gamma * invstd. */
ROW_INLINE void backward_chunk(const int DTYPE, const void *x, const void *g, void *dx, int64_t at,
                               int64_t n, tsl_bn_affine f, double mean_dy, double slope)
{
    if (DTYPE == TSL_F32) {
        const float *in = (const float *)x + at, *gi = g;
        float *grad = (float *)dx + at;
        for (int64_t i = 0; i < n; i++)
            grad[i] = tsl_bn_backward_f32(gi[i], in[i], f.scale, f.mean, mean_dy, slope);
    } else {
        const double *in = (const double *)x + at, *gi = g;
        double *grad = (double *)dx + at;
        for (int64_t i = 0; i < n; i++)
            grad[i] = tsl_bn_backward_f64(gi[i], in[i], f.scale, f.mean, mean_dy, slope);
    }
}

/* What backward_chunk needs besides the chunk. */
typedef struct data_chunk_args {
    void *dx;
    tsl_bn_affine f;
    double mean_dy, slope;
} data_chunk_args;

TSL_VECTOR_KERNEL
static void data_chunk(const tsl_bn_args *a, const void *x, int64_t at, int64_t n, const void *g,
                       void *user)
{
    const data_chunk_args *d = user;
    if (a->dtype == TSL_F32)
        backward_chunk(TSL_F32, x, g, d->dx, at, n, d->f, d->mean_dy, d->slope);
    else
        backward_chunk(TSL_F64, x, g, d->dx, at, n, d->f, d->mean_dy, d->slope);
}

/* backward_chunk over a channels-last tile, element (r, c) with channel c's constants in k:
 * scale, mean, mean_dy, slope, then the ReLU mask's ends lo and hi (6 x cext). */
ROW_INLINE void cl_backward_rows(const int DTYPE, const int RELU, const tsl_bn_args *a,
                                 const void *x, const void *dy, void *dx, const double *k)
{
    const int64_t C = a->cext, rows = a->samples * a->inner;
    const double *scale = k, *mean = k + C, *mean_dy = k + 2 * C, *slope = k + 3 * C;
    const double *lo = k + 4 * C, *hi = k + 5 * C;
    for (int64_t r = 0; r < rows; r++) {
        if (DTYPE == TSL_F32) {
            const float *in = (const float *)x + r * C, *g = (const float *)dy + r * C;
            float *grad = (float *)dx + r * C;
            for (int64_t c = 0; c < C; c++) {
                float gi =
                    RELU ? tsl_bn_keep_f32(g[c], (in[c] >= (float)lo[c]) & (in[c] <= (float)hi[c]))
                         : g[c];
                grad[c] = tsl_bn_backward_f32(gi, in[c], scale[c], mean[c], mean_dy[c], slope[c]);
            }
        } else {
            const double *in = (const double *)x + r * C, *g = (const double *)dy + r * C;
            double *grad = (double *)dx + r * C;
            for (int64_t c = 0; c < C; c++) {
                double gi = g[c];
                gi = !RELU || ((in[c] >= lo[c]) & (in[c] <= hi[c])) ? gi : 0.0;
                grad[c] = tsl_bn_backward_f64(gi, in[c], scale[c], mean[c], mean_dy[c], slope[c]);
            }
        }
    }
}

TSL_VECTOR_KERNEL
void tsl_bn_backward_data_tile(const tsl_bn_args *a, const void *x, const void *dy,
                               const double *saved, const void *gamma, const void *beta,
                               const double *coef, void *dx)
{
    const int64_t C = a->cext;
    double *k = a->channels_last ? cl_constants(a, 6) : NULL;
    for (int64_t c = 0; c < C; c++) {
        int64_t ch = a->c0 + c;
        /* dx = gamma invstd (dy - mean(dy) - xhat mean(dy xhat)), xhat = (x - mean) invstd */
        data_chunk_args d = {dx, train_affine(a, saved, gamma, NULL, ch), coef[ch],
                             saved[a->channels + ch] * coef[a->channels + ch]};
        tsl_bn_relu_mask m = channel_mask(a, saved, gamma, beta, ch);
        if (!k) {
            for_each_chunk(a, x, dy, c, m, data_chunk, &d);
            continue;
        }
        double v[6] = {d.f.scale, d.f.mean, d.mean_dy, d.slope, m.lo, m.hi};
        for (int j = 0; j < 6; j++)
            k[j * C + c] = v[j];
    }
    if (!k)
        return;
    if (a->dtype == TSL_F32 && a->relu)
        cl_backward_rows(TSL_F32, 1, a, x, dy, dx, k);
    else if (a->dtype == TSL_F32)
        cl_backward_rows(TSL_F32, 0, a, x, dy, dx, k);
    else if (a->relu)
        cl_backward_rows(TSL_F64, 1, a, x, dy, dx, k);
    else
        cl_backward_rows(TSL_F64, 0, a, x, dy, dx, k);
    free(k);
}
