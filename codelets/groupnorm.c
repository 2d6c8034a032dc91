/* Group normalization kernels and codelets: see groupnorm.h. Float32 tiles take the exact-sum
 * fast paths batch norm uses (a channels-last tile's per-channel columns in place,
 * tsl_acc_add_columns_f32; a plain tile's rows); float64 rows are summed through the exact
 * product split (tsl_bn_add_sum_products_f64), channels-last ones staged first. The sums are
 * exact, so the path changes no bit. The elementwise passes walk the tile in place with
 * per-channel constants. */
#include <stdlib.h>
#include <string.h>

#include "batchnorm_internal.h"
#include "batchnorm_math.h"
#include "codelet.h"
#include "groupnorm.h"
#include "groupnorm_math.h"
#include "groupnorm_slab.h"

#define GN_CHUNK 1024 /* positions per staged chunk of a float64 channels-last row */
/* Elements per staged block of a masked gradient (a fused ReLU's backward sums): large enough
 * that each exact-sum call's deposits are spread over many elements, small enough for L2. */
#define GN_MASK_BLOCK 32768

static void *checked_malloc(size_t bytes, const char *what)
{
    void *p = malloc(bytes ? bytes : 1);
    TSL_CODELET_CHECK(p, what);
    return p;
}

static void init_accs(tsl_acc *acc, int64_t n)
{
    for (int64_t k = 0; k < n; k++)
        tsl_acc_init(&acc[k]);
}

/* The group of tile channel c. */
static inline int64_t group_of(const tsl_gn_args *a, int64_t c)
{
    return (a->c0 + c) / (a->channels / a->groups);
}

/* First element of row (sample s, tile channel c) of a plain tile. */
static inline int64_t plain_row(const tsl_gn_args *a, int64_t s, int64_t c)
{
    return (s * a->cext + c) * a->inner;
}

/* Positions [p0, p0 + n) of channel c, sample s of a float64 channels-last tile, into dst. */
static void cl_gather_f64(const tsl_gn_args *a, const double *src, int64_t s, int64_t c, int64_t p0,
                          int64_t n, double *dst)
{
    const double *in = src + (s * a->inner + p0) * a->cext + c;
    for (int64_t i = 0; i < n; i++)
        dst[i] = in[i * a->cext];
}

/* Per tile channel c of sample s: sum[c * stride] += sum of a and prod[c * stride] += sum of a b
 * (b NULL: a^2) over the tile's positions, exactly. */
static void channel_sums(const tsl_gn_args *a, int64_t s, const void *av, const void *bv,
                         tsl_acc *sum, tsl_acc *prod, int64_t stride)
{
    const int64_t C = a->cext, n = a->inner;
    if (a->dtype == TSL_F32 && a->channels_last) {
        const float *pa = (const float *)av + s * n * C;
        const float *pb = bv ? (const float *)bv + s * n * C : NULL;
        tsl_acc_add_columns_f32(sum, stride, prod, stride, pa, pb, n, C);
        return;
    }
    if (a->dtype == TSL_F32) {
        for (int64_t c = 0; c < C; c++) {
            const float *pa = (const float *)av + plain_row(a, s, c);
            const float *pb = bv ? (const float *)bv + plain_row(a, s, c) : pa;
            tsl_acc_add_sum_products_f32(&sum[c * stride], &prod[c * stride], pa, pb, n);
        }
        return;
    }
    if (!a->channels_last) {
        for (int64_t c = 0; c < C; c++) {
            const double *pa = (const double *)av + plain_row(a, s, c);
            const double *pb = bv ? (const double *)bv + plain_row(a, s, c) : pa;
            tsl_bn_add_sum_products_f64(&sum[c * stride], &prod[c * stride], pa, pb, n);
        }
        return;
    }
    double *sa = checked_malloc(2 * GN_CHUNK * sizeof(double), "group norm: out of memory");
    double *sb = sa + GN_CHUNK;
    for (int64_t c = 0; c < C; c++)
        for (int64_t p = 0; p < n; p += GN_CHUNK) {
            int64_t k = n - p < GN_CHUNK ? n - p : GN_CHUNK;
            cl_gather_f64(a, av, s, c, p, k, sa);
            if (bv)
                cl_gather_f64(a, bv, s, c, p, k, sb);
            tsl_bn_add_sum_products_f64(&sum[c * stride], &prod[c * stride], sa, bv ? sb : sa, k);
        }
    free(sa);
}

/* The fused ReLU's mask of tile channel c in sample s (tile-local): y > 0 exactly where
 * lo <= x <= hi (batchnorm_math.h), y computed as the forward computes it. */
static tsl_bn_relu_mask relu_mask(const tsl_gn_args *a, const double *saved, const void *gamma,
                                  const void *beta, int64_t s, int64_t c)
{
    const double *ms = &saved[2 * ((a->n0 + s) * a->groups + group_of(a, c))];
    return tsl_bn_relu_mask_for(a->dtype, tsl_bn_train_affine(ms[0], ms[1],
                                                              tsl_load(a->dtype, gamma, a->c0 + c),
                                                              tsl_load(a->dtype, beta, a->c0 + c)));
}

/* dst = g where lo <= x <= hi, else +0, over a rows x cols block (row-major) whose column c
 * has mask m[c]: one channel's row (cols 1) or a channels-last block. Vectorised loops: one
 * mask for a whole row, or the columns' bounds side by side. */
TSL_VECTOR_KERNEL
static void mask_gradient(int dtype, const void *x, const void *g, int64_t rows, int64_t cols,
                          const tsl_bn_relu_mask *m, void *dst)
{
    const int64_t n = rows * cols;
    if (dtype == TSL_F32) {
        const float *xs = x, *gs = g;
        float *out = dst;
        if (cols == 1) {
            const float lo = (float)m[0].lo, hi = (float)m[0].hi;
            for (int64_t i = 0; i < n; i++)
                out[i] = tsl_bn_keep_f32(gs[i], (xs[i] >= lo) & (xs[i] <= hi));
            return;
        }
        float *lo = checked_malloc(sizeof(float) * (size_t)(2 * cols), "group norm: out of memory"),
              *hi = lo + cols;
        for (int64_t c = 0; c < cols; c++) {
            lo[c] = (float)m[c].lo;
            hi[c] = (float)m[c].hi;
        }
        for (int64_t r = 0; r < rows; r++) {
            const float *xr = xs + r * cols, *gr = gs + r * cols;
            float *o = out + r * cols;
            for (int64_t c = 0; c < cols; c++)
                o[c] = tsl_bn_keep_f32(gr[c], (xr[c] >= lo[c]) & (xr[c] <= hi[c]));
        }
        free(lo);
        return;
    }
    const double *xs = x, *gs = g;
    double *out = dst;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++)
            out[r * cols + c] = tsl_bn_relu_keep_f64(gs[r * cols + c], xs[r * cols + c], m[c]);
}

/* channel_sums(a, s, dy masked by the fused ReLU's masks m (one per tile channel), x, ...):
 * the masked dy staged a block at a time (the sums are exact: staging changes no bit). */
static void masked_channel_sums(const tsl_gn_args *a, int64_t s, const void *dy, const void *x,
                                const tsl_bn_relu_mask *m, tsl_acc *sum, tsl_acc *prod,
                                int64_t stride)
{
    const int64_t C = a->cext, n = a->inner;
    const size_t es = a->dtype == TSL_F32 ? sizeof(float) : sizeof(double);
    if (!a->channels_last) {
        void *stage = checked_malloc(es * GN_MASK_BLOCK, "group norm: out of memory");
        for (int64_t c = 0; c < C; c++)
            for (int64_t p = 0; p < n; p += GN_MASK_BLOCK) {
                const int64_t k = n - p < GN_MASK_BLOCK ? n - p : GN_MASK_BLOCK;
                const size_t at = (size_t)(plain_row(a, s, c) + p) * es;
                const void *xr = (const char *)x + at;
                mask_gradient(a->dtype, xr, (const char *)dy + at, k, 1, &m[c], stage);
                if (a->dtype == TSL_F32)
                    tsl_acc_add_sum_products_f32(&sum[c * stride], &prod[c * stride], stage, xr, k);
                else
                    tsl_bn_add_sum_products_f64(&sum[c * stride], &prod[c * stride], stage, xr, k);
            }
        free(stage);
        return;
    }
    /* channels-last: blocks of rows (positions x channels) */
    const int64_t rows = GN_MASK_BLOCK / C > 0 ? GN_MASK_BLOCK / C : 1;
    char *stage = checked_malloc(es * (size_t)(rows * C + 2 * rows), "group norm: out of memory");
    double *ga = (double *)(stage + es * (size_t)(rows * C)), *gb = ga + rows;
    for (int64_t r0 = 0; r0 < n; r0 += rows) {
        const int64_t k = n - r0 < rows ? n - r0 : rows;
        const size_t at = (size_t)((s * n + r0) * C) * es;
        const void *xb = (const char *)x + at;
        mask_gradient(a->dtype, xb, (const char *)dy + at, k, C, m, stage);
        if (a->dtype == TSL_F32) {
            tsl_acc_add_columns_f32(sum, stride, prod, stride, (const float *)stage, xb, k, C);
            continue;
        }
        for (int64_t c = 0; c < C; c++) {
            for (int64_t i = 0; i < k; i++) {
                ga[i] = ((const double *)stage)[i * C + c];
                gb[i] = ((const double *)xb)[i * C + c];
            }
            tsl_bn_add_sum_products_f64(&sum[c * stride], &prod[c * stride], ga, gb, k);
        }
    }
    free(stage);
}

void tsl_gn_stats_tile(const tsl_gn_args *a, const void *x, tsl_acc *acc)
{
    const int64_t C = a->cext;
    init_accs(acc, 2 * a->samples * a->groups);
    tsl_acc *tmp = checked_malloc(sizeof(tsl_acc) * (size_t)(2 * C), "group norm: out of memory");
    for (int64_t s = 0; s < a->samples; s++) {
        init_accs(tmp, 2 * C);
        channel_sums(a, s, x, NULL, tmp, tmp + 1, 2);
        for (int64_t c = 0; c < C; c++) {
            tsl_acc *g = &acc[2 * (s * a->groups + group_of(a, c))];
            tsl_acc_merge(g, &tmp[2 * c]);
            tsl_acc_merge(g + 1, &tmp[2 * c + 1]);
        }
    }
    free(tmp);
    for (int64_t k = 0; k < 2 * a->samples * a->groups; k++)
        tsl_acc_normalize(&acc[k]);
}

void tsl_gn_finalize(const tsl_gn_args *a, const tsl_acc *acc, double *stats)
{
    tsl_acc scratch;
    for (int64_t k = 0; k < a->samples * a->groups; k++)
        tsl_gn_finalize_one(a, acc, k, stats, &scratch);
}

/* y = affine(x) over one sample of a tile, tile channel c's affine (k[c], k[C + c], k[2C + c]);
 * max(y, 0) when RELU (NaN: 0). */
#define GN_RELU(v) (RELU && !((v) > 0) ? 0 : (v))
ROW_INLINE void affine_sample(const int DTYPE, const int RELU, const tsl_gn_args *a, int64_t s,
                              const void *x, void *y, const double *k)
{
    const int64_t C = a->cext, n = a->inner;
    const double *mean = k, *scale = k + C, *shift = k + 2 * C;
    if (a->channels_last) {
        for (int64_t p = 0; p < n; p++) {
            int64_t at = (s * n + p) * C;
            if (DTYPE == TSL_F32)
                for (int64_t c = 0; c < C; c++) {
                    float v =
                        tsl_bn_affine_f32(((const float *)x)[at + c], mean[c], scale[c], shift[c]);
                    ((float *)y)[at + c] = GN_RELU(v);
                }
            else
                for (int64_t c = 0; c < C; c++) {
                    double v =
                        tsl_bn_affine_f64(((const double *)x)[at + c], mean[c], scale[c], shift[c]);
                    ((double *)y)[at + c] = GN_RELU(v);
                }
        }
        return;
    }
    for (int64_t c = 0; c < C; c++) {
        int64_t at = plain_row(a, s, c);
        if (DTYPE == TSL_F32)
            for (int64_t i = 0; i < n; i++) {
                float v =
                    tsl_bn_affine_f32(((const float *)x)[at + i], mean[c], scale[c], shift[c]);
                ((float *)y)[at + i] = GN_RELU(v);
            }
        else
            for (int64_t i = 0; i < n; i++) {
                double v =
                    tsl_bn_affine_f64(((const double *)x)[at + i], mean[c], scale[c], shift[c]);
                ((double *)y)[at + i] = GN_RELU(v);
            }
    }
}
#undef GN_RELU

TSL_VECTOR_KERNEL
void tsl_gn_normalize_tile(const tsl_gn_args *a, const void *x, const double *stats,
                           const void *gamma, const void *beta, void *y)
{
    const int64_t C = a->cext;
    double *k = checked_malloc(sizeof(double) * (size_t)(3 * C), "group norm: out of memory");
    for (int64_t s = 0; s < a->samples; s++) {
        for (int64_t c = 0; c < C; c++) {
            const int64_t row = s + (a->saved_stats ? a->n0 : 0);
            const double *ms = &stats[2 * (row * a->groups + group_of(a, c))];
            tsl_bn_affine f =
                tsl_bn_train_affine(ms[0], ms[1], tsl_load(a->dtype, gamma, a->c0 + c),
                                    tsl_load(a->dtype, beta, a->c0 + c));
            k[c] = f.mean;
            k[C + c] = f.scale;
            k[2 * C + c] = f.shift;
        }
        if (a->dtype == TSL_F32 && a->relu)
            affine_sample(TSL_F32, 1, a, s, x, y, k);
        else if (a->dtype == TSL_F32)
            affine_sample(TSL_F32, 0, a, s, x, y, k);
        else if (a->relu)
            affine_sample(TSL_F64, 1, a, s, x, y, k);
        else
            affine_sample(TSL_F64, 0, a, s, x, y, k);
    }
    free(k);
}

void tsl_gn_backward_sums_tile(const tsl_gn_args *a, const void *x, const void *dy,
                               const double *saved, const void *gamma, const void *beta,
                               tsl_acc *acc)
{
    init_accs(acc, 2 * a->samples * a->channels);
    tsl_bn_relu_mask *m =
        a->relu ? checked_malloc(sizeof *m * (size_t)a->cext, "group norm: out of memory") : NULL;
    for (int64_t s = 0; s < a->samples; s++) {
        tsl_acc *row = &acc[2 * (s * a->channels + a->c0)];
        if (!a->relu) {
            channel_sums(a, s, dy, x, row, row + 1, 2);
            continue;
        }
        for (int64_t c = 0; c < a->cext; c++)
            m[c] = relu_mask(a, saved, gamma, beta, s, c);
        masked_channel_sums(a, s, dy, x, m, row, row + 1, 2);
    }
    free(m);
    for (int64_t k = 0; k < 2 * a->samples * a->channels; k++)
        tsl_acc_normalize(&acc[k]);
}

void tsl_gn_backward_coef(const tsl_gn_args *a, const tsl_acc *acc, const double *saved,
                          const void *gamma, double *coef)
{
    tsl_acc scratch;
    for (int64_t s = 0; s < a->samples; s++)
        for (int64_t g = 0; g < a->groups; g++)
            tsl_gn_coef_one(a, acc, saved, gamma, s, g, coef, &scratch);
}

void tsl_gn_slab_channels(const tsl_gn_args *a, const tsl_acc *acc, const double *saved,
                          tsl_acc *out)
{
    tsl_acc scratch;
    for (int64_t c = 0; c < a->channels; c++)
        tsl_gn_slab_channel_one(a, acc, saved, c, out, &scratch);
}

void tsl_gn_param_grad(const tsl_gn_args *a, const tsl_acc *acc, void *grad)
{
    tsl_acc scratch;
    for (int64_t c = 0; c < a->channels; c++)
        tsl_gn_param_grad_one(a, acc, c, grad, &scratch);
}

/* Element i of dy where the fused ReLU's y > 0 (x in [lo, hi]; float32 tiles compare with the
 * bounds as floats, flo and fhi), else +0. */
ROW_INLINE double gn_masked(const int DTYPE, const void *x, const void *dy, int64_t i, double lo,
                            double hi, float flo, float fhi)
{
    if (DTYPE == TSL_F32) {
        const float v = ((const float *)x)[i];
        return tsl_bn_keep_f32(((const float *)dy)[i], (v >= flo) & (v <= fhi));
    }
    const tsl_bn_relu_mask m = {lo, hi};
    return tsl_bn_relu_keep_f64(((const double *)dy)[i], ((const double *)x)[i], m);
}

/* dx over one sample of a tile; tile channel c's constants: k[c] mean, k[C + c] invstd,
 * k[2C + c] gamma, k[3C + c] m1, k[4C + c] m2, and with RELU its mask k[5C + c], k[6C + c]
 * (as floats: the 2C floats after k[7C - 1]). */
ROW_INLINE void dx_sample(const int DTYPE, const int RELU, const tsl_gn_args *a, int64_t s,
                          const void *x, const void *dy, void *dx, const double *k)
{
    const int64_t C = a->cext, n = a->inner;
    const double *mean = k, *invstd = k + C, *w = k + 2 * C, *m1 = k + 3 * C, *m2 = k + 4 * C;
    const double *lo = k + 5 * C, *hi = k + 6 * C;
    const float *flo = (const float *)(k + 7 * C), *fhi = flo + C;
#define GN_G(T, i, c)                                                                              \
    (RELU ? gn_masked(DTYPE, x, dy, i, lo[c], hi[c], flo[c], fhi[c]) : (double)((const T *)dy)[i])
#define GN_DX(T, i, c)                                                                             \
    tsl_gn_dx(tsl_hd_mul(GN_G(T, i, c), w[c]),                                                     \
              tsl_gn_xhat((double)((const T *)x)[i], mean[c], invstd[c]), invstd[c], m1[c], m2[c])
#define GN_DX_LOOPS(T)                                                                             \
    if (a->channels_last)                                                                          \
        for (int64_t p = 0; p < n; p++)                                                            \
            for (int64_t c = 0, at = (s * n + p) * C; c < C; c++)                                  \
                ((T *)dx)[at + c] = (T)GN_DX(T, at + c, c);                                        \
    else                                                                                           \
        for (int64_t c = 0; c < C; c++)                                                            \
            for (int64_t i = 0, at = plain_row(a, s, c); i < n; i++)                               \
                ((T *)dx)[at + i] = (T)GN_DX(T, at + i, c);
    if (DTYPE == TSL_F32) {
        GN_DX_LOOPS(float)
    } else {
        GN_DX_LOOPS(double)
    }
#undef GN_DX_LOOPS
#undef GN_DX
#undef GN_G
}

TSL_VECTOR_KERNEL
void tsl_gn_backward_data_tile(const tsl_gn_args *a, const void *x, const void *dy,
                               const double *saved, const void *gamma, const void *beta,
                               const double *coef, void *dx)
{
    const int64_t C = a->cext;
    double *k = checked_malloc(sizeof(double) * (size_t)(8 * C), "group norm: out of memory");
    float *flo = (float *)(k + 7 * C), *fhi = flo + C;
    for (int64_t s = 0; s < a->samples; s++) {
        for (int64_t c = 0; c < C; c++) {
            int64_t g = group_of(a, c);
            const double *ms = &saved[2 * ((a->n0 + s) * a->groups + g)];
            k[c] = ms[0];
            k[C + c] = ms[1];
            k[2 * C + c] = tsl_load(a->dtype, gamma, a->c0 + c);
            k[3 * C + c] = coef[2 * (s * a->groups + g)];
            k[4 * C + c] = coef[2 * (s * a->groups + g) + 1];
            if (a->relu) {
                tsl_bn_relu_mask m = relu_mask(a, saved, gamma, beta, s, c);
                k[5 * C + c] = m.lo;
                k[6 * C + c] = m.hi;
                flo[c] = (float)m.lo;
                fhi[c] = (float)m.hi;
            }
        }
        if (a->dtype == TSL_F32 && a->relu)
            dx_sample(TSL_F32, 1, a, s, x, dy, dx, k);
        else if (a->dtype == TSL_F32)
            dx_sample(TSL_F32, 0, a, s, x, dy, dx, k);
        else if (a->relu)
            dx_sample(TSL_F64, 1, a, s, x, dy, dx, k);
        else
            dx_sample(TSL_F64, 0, a, s, x, dy, dx, k);
    }
    free(k);
}

/* ---- codelets ---- */

#define BUF(i) ((void *)STARPU_VECTOR_GET_PTR(buffers[i]))
#define NX(i) ((int64_t)STARPU_VECTOR_GET_NX(buffers[i]))
#define BYTES(i) (NX(i) * (int64_t)STARPU_VECTOR_GET_ELEMSIZE(buffers[i]))
#define ACCS(i, n) (BYTES(i) == (n) * (int64_t)sizeof(tsl_acc))
#define TILE(a) ((a).samples * (a).cext * (a).inner)
#define SLAB(a) (2 * (a).samples * (a).groups)
#define SLAB_CHANNELS(a) (2 * (a).samples * (a).channels)
#define SAVED(a) (2 * (a).batch * (a).groups)

static void gn_stats_cpu(void *buffers[], void *cl_arg)
{
    tsl_gn_args a;
    starpu_codelet_unpack_args(cl_arg, &a);
    TSL_CODELET_CHECK(NX(0) == TILE(a) && ACCS(1, SLAB(a)), "group norm stats: sizes");
    tsl_gn_stats_tile(&a, BUF(0), BUF(1));
}

static void gn_finalize_cpu(void *buffers[], void *cl_arg)
{
    tsl_gn_args a;
    starpu_codelet_unpack_args(cl_arg, &a);
    TSL_CODELET_CHECK(ACCS(0, SLAB(a)) && NX(1) == SLAB(a), "group norm finalize: sizes");
    tsl_gn_finalize(&a, BUF(0), BUF(1));
}

/* The slab's rows of the whole batch's saved statistics. */
static void gn_save_cpu(void *buffers[], void *cl_arg)
{
    tsl_gn_args a;
    starpu_codelet_unpack_args(cl_arg, &a);
    TSL_CODELET_CHECK(ACCS(0, SLAB(a)) && NX(1) == SAVED(a) && a.n0 + a.samples <= a.batch,
                      "group norm save: sizes");
    tsl_gn_finalize(&a, BUF(0), (double *)BUF(1) + 2 * a.n0 * a.groups);
}

static void gn_normalize_cpu(void *buffers[], void *cl_arg)
{
    tsl_gn_args a;
    starpu_codelet_unpack_args(cl_arg, &a);
    TSL_CODELET_CHECK(NX(0) == TILE(a) &&
                          NX(1) == (a.saved_stats ? 2 * a.batch * a.groups : SLAB(a)) &&
                          NX(2) == a.channels && NX(3) == a.channels && NX(4) == TILE(a) &&
                          (!a.saved_stats || a.n0 + a.samples <= a.batch),
                      "group norm normalize: sizes");
    tsl_gn_normalize_tile(&a, BUF(0), BUF(1), BUF(2), BUF(3), BUF(4));
}

static void gn_bwd_sums_cpu(void *buffers[], void *cl_arg)
{
    tsl_gn_args a;
    starpu_codelet_unpack_args(cl_arg, &a);
    TSL_CODELET_CHECK(NX(0) == TILE(a) && NX(1) == TILE(a) && ACCS(2, SLAB_CHANNELS(a)) &&
                          (!a.relu || (NX(3) == SAVED(a) && NX(4) == a.channels &&
                                       NX(5) == a.channels && a.n0 + a.samples <= a.batch)),
                      "group norm backward sums: sizes");
    tsl_gn_backward_sums_tile(&a, BUF(0), BUF(1), a.relu ? BUF(3) : NULL, a.relu ? BUF(4) : NULL,
                              a.relu ? BUF(5) : NULL, BUF(2));
}

static void gn_bwd_coef_cpu(void *buffers[], void *cl_arg)
{
    tsl_gn_args a;
    starpu_codelet_unpack_args(cl_arg, &a);
    TSL_CODELET_CHECK(ACCS(0, SLAB_CHANNELS(a)) && NX(1) == SAVED(a) && NX(2) == a.channels &&
                          NX(3) == SLAB(a),
                      "group norm coef: sizes");
    tsl_gn_backward_coef(&a, BUF(0), BUF(1), BUF(2), BUF(3));
}

static void gn_slab_channels_cpu(void *buffers[], void *cl_arg)
{
    tsl_gn_args a;
    starpu_codelet_unpack_args(cl_arg, &a);
    TSL_CODELET_CHECK(ACCS(0, SLAB_CHANNELS(a)) && NX(1) == SAVED(a) && ACCS(2, 2 * a.channels),
                      "group norm slab channels: sizes");
    tsl_gn_slab_channels(&a, BUF(0), BUF(1), BUF(2));
}

static void gn_param_grad_cpu(void *buffers[], void *cl_arg)
{
    tsl_gn_args a;
    starpu_codelet_unpack_args(cl_arg, &a);
    TSL_CODELET_CHECK(ACCS(0, 2 * a.channels) && NX(1) == a.channels,
                      "group norm parameter gradient: sizes");
    tsl_gn_param_grad(&a, BUF(0), BUF(1));
}

static void gn_bwd_data_cpu(void *buffers[], void *cl_arg)
{
    tsl_gn_args a;
    starpu_codelet_unpack_args(cl_arg, &a);
    TSL_CODELET_CHECK(NX(0) == TILE(a) && NX(1) == TILE(a) && NX(2) == SAVED(a) &&
                          NX(3) == a.channels && NX(4) == SLAB(a) && NX(5) == TILE(a) &&
                          (!a.relu || NX(6) == a.channels),
                      "group norm backward data: sizes");
    tsl_gn_backward_data_tile(&a, BUF(0), BUF(1), BUF(2), BUF(3), a.relu ? BUF(6) : NULL, BUF(4),
                              BUF(5));
}

/* The footprint: the tile sizes, the dtype, the layout, the groups, the tile's channels, the
 * gradient a task writes and the fused ReLU. */
static uint32_t gn_variant(struct starpu_task *task)
{
    tsl_gn_args a;
    starpu_codelet_unpack_args(task->cl_arg, &a);
    uint32_t h = starpu_task_data_footprint(task);
    h = tsl_hash_i64(h, a.dtype);
    h = tsl_hash_i64(h, a.channels_last);
    h = tsl_hash_i64(h, a.groups);
    h = tsl_hash_i64(h, a.which);
    h = tsl_hash_i64(h, a.relu);
    return tsl_hash_i64(h, a.cext);
}

TSL_CODELET(tsl_cl_gn_stats, "tsl_gn_stats", gn_stats_cpu, tsl_gn_stats_cuda, gn_variant,
            .nbuffers = 2, .modes = {STARPU_R, STARPU_W});
TSL_CODELET(tsl_cl_gn_finalize, "tsl_gn_finalize", gn_finalize_cpu, tsl_gn_finalize_cuda,
            gn_variant, .nbuffers = 2, .modes = {STARPU_R, STARPU_W});
TSL_CODELET(tsl_cl_gn_save, "tsl_gn_save", gn_save_cpu, tsl_gn_save_cuda, gn_variant, .nbuffers = 2,
            .modes = {STARPU_R, STARPU_RW});
/* x, stats, gamma, beta, y; a sixth buffer, read only to order the task (a remade output's),
 * is ignored. */
TSL_CODELET(tsl_cl_gn_normalize, "tsl_gn_normalize", gn_normalize_cpu, tsl_gn_normalize_cuda,
            gn_variant, .nbuffers = STARPU_VARIABLE_NBUFFERS);
TSL_CODELET(tsl_cl_gn_bwd_sums, "tsl_gn_bwd_sums", gn_bwd_sums_cpu, tsl_gn_bwd_sums_cuda,
            gn_variant, .nbuffers = STARPU_VARIABLE_NBUFFERS);
TSL_CODELET(tsl_cl_gn_bwd_coef, "tsl_gn_bwd_coef", gn_bwd_coef_cpu, tsl_gn_bwd_coef_cuda,
            gn_variant, .nbuffers = 4, .modes = {STARPU_R, STARPU_R, STARPU_R, STARPU_W});
TSL_CODELET(tsl_cl_gn_slab_channels, "tsl_gn_slab_channels", gn_slab_channels_cpu,
            tsl_gn_slab_channels_cuda, gn_variant, .nbuffers = 3,
            .modes = {STARPU_R, STARPU_R, STARPU_W});
TSL_CODELET(tsl_cl_gn_param_grad, "tsl_gn_param_grad", gn_param_grad_cpu, tsl_gn_param_grad_cuda,
            gn_variant, .nbuffers = 2, .modes = {STARPU_R, STARPU_W});
TSL_CODELET(tsl_cl_gn_bwd_data, "tsl_gn_bwd_data", gn_bwd_data_cpu, tsl_gn_bwd_data_cuda,
            gn_variant, .nbuffers = STARPU_VARIABLE_NBUFFERS);
