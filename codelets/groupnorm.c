/* Group normalization kernels and codelets: see groupnorm.h. A tile is walked one (sample,
 * channel) row at a time, in chunks of positions staged as doubles (strided in a
 * channels-last tile); each chunk's sums go into the exact accumulators at once
 * (tsl_bn_add_sum_products_f64), so the sums, and with them every result, do not depend on
 * the chunking, the tiling or the layout. */
#include <stdlib.h>
#include <string.h>

#include "batchnorm_internal.h"
#include "batchnorm_math.h"
#include "codelet.h"
#include "groupnorm.h"
#include "groupnorm_math.h"

/* Positions per staged chunk. */
#define GN_CHUNK 1024

typedef struct gn_stage {
    double x[GN_CHUNK], dy[GN_CHUNK], t[GN_CHUNK], u[GN_CHUNK];
} gn_stage;

static gn_stage *stage_new(void)
{
    gn_stage *s = malloc(sizeof *s);
    TSL_CODELET_CHECK(s, "group norm: out of memory for a staging chunk");
    return s;
}

/* Element index of (tile-local sample s, tile channel c, position p). */
static inline int64_t at(const tsl_gn_args *a, int64_t s, int64_t c, int64_t p)
{
    return a->channels_last ? (s * a->inner + p) * a->cext + c : (s * a->cext + c) * a->inner + p;
}

/* dst[i] = element (s, c, p0 + i) as a double, i < n. */
static void gather(const tsl_gn_args *a, const void *src, int64_t s, int64_t c, int64_t p0,
                   int64_t n, double *dst)
{
    const int64_t stride = a->channels_last ? a->cext : 1, first = at(a, s, c, p0);
    if (a->dtype == TSL_F32) {
        const float *in = (const float *)src + first;
        for (int64_t i = 0; i < n; i++)
            dst[i] = in[i * stride];
    } else {
        const double *in = (const double *)src + first;
        for (int64_t i = 0; i < n; i++)
            dst[i] = in[i * stride];
    }
}

/* Element (s, c, p0 + i) = v[i], rounded to the dtype, i < n. */
static void scatter(const tsl_gn_args *a, void *dst, int64_t s, int64_t c, int64_t p0, int64_t n,
                    const double *v)
{
    const int64_t stride = a->channels_last ? a->cext : 1, first = at(a, s, c, p0);
    if (a->dtype == TSL_F32) {
        float *out = (float *)dst + first;
        for (int64_t i = 0; i < n; i++)
            out[i * stride] = (float)v[i];
    } else {
        double *out = (double *)dst + first;
        for (int64_t i = 0; i < n; i++)
            out[i * stride] = v[i];
    }
}

static inline int64_t group_of(const tsl_gn_args *a, int64_t c)
{
    return (a->c0 + c) / (a->channels / a->groups);
}

static void init_accs(tsl_acc *acc, int64_t n)
{
    for (int64_t k = 0; k < n; k++)
        tsl_acc_init(&acc[k]);
}

void tsl_gn_stats_tile(const tsl_gn_args *a, const void *x, tsl_acc *acc)
{
    init_accs(acc, 2 * a->samples * a->groups);
    gn_stage *st = stage_new();
    for (int64_t s = 0; s < a->samples; s++)
        for (int64_t c = 0; c < a->cext; c++) {
            tsl_acc *sum = &acc[2 * (s * a->groups + group_of(a, c))];
            for (int64_t p = 0; p < a->inner; p += GN_CHUNK) {
                int64_t n = a->inner - p < GN_CHUNK ? a->inner - p : GN_CHUNK;
                gather(a, x, s, c, p, n, st->x);
                tsl_bn_add_sum_products_f64(sum, sum + 1, st->x, st->x, n);
            }
        }
    free(st);
}

void tsl_gn_finalize(const tsl_gn_args *a, const tsl_acc *acc, double *stats)
{
    tsl_acc scratch;
    for (int64_t k = 0; k < a->samples * a->groups; k++) {
        double mean, var;
        tsl_bn_moments((double)a->per_group, &acc[2 * k], &scratch, &mean, &var);
        stats[2 * k] = mean;
        stats[2 * k + 1] = tsl_hd_invstd(tsl_hd_add(var, a->eps));
    }
}

void tsl_gn_normalize_tile(const tsl_gn_args *a, const void *x, const double *stats,
                           const void *gamma, const void *beta, void *y)
{
    gn_stage *st = stage_new();
    for (int64_t s = 0; s < a->samples; s++)
        for (int64_t c = 0; c < a->cext; c++) {
            const double *ms = &stats[2 * (s * a->groups + group_of(a, c))];
            tsl_bn_affine f =
                tsl_bn_train_affine(ms[0], ms[1], tsl_load(a->dtype, gamma, a->c0 + c),
                                    tsl_load(a->dtype, beta, a->c0 + c));
            for (int64_t p = 0; p < a->inner; p += GN_CHUNK) {
                int64_t n = a->inner - p < GN_CHUNK ? a->inner - p : GN_CHUNK;
                gather(a, x, s, c, p, n, st->x);
                for (int64_t i = 0; i < n; i++)
                    st->t[i] =
                        a->dtype == TSL_F32
                            ? (double)tsl_bn_affine_f32((float)st->x[i], f.mean, f.scale, f.shift)
                            : tsl_bn_affine_f64(st->x[i], f.mean, f.scale, f.shift);
                scatter(a, y, s, c, p, n, st->t);
            }
        }
    free(st);
}

/* Stage chunk [p, p + n) of row (s, c): x, dy and xhat (in st->t). */
static void stage_backward(const tsl_gn_args *a, const void *x, const void *dy, const double *ms,
                           int64_t s, int64_t c, int64_t p, int64_t n, gn_stage *st)
{
    gather(a, x, s, c, p, n, st->x);
    gather(a, dy, s, c, p, n, st->dy);
    for (int64_t i = 0; i < n; i++)
        st->t[i] = tsl_gn_xhat(st->x[i], ms[0], ms[1]);
}

/* The (mean, invstd) pair of tile-local sample s and tile channel c in the batch's saved rows. */
static inline const double *saved_pair(const tsl_gn_args *a, const double *saved, int64_t s,
                                       int64_t c)
{
    return &saved[2 * ((a->n0 + s) * a->groups + group_of(a, c))];
}

void tsl_gn_channel_sums_tile(const tsl_gn_args *a, const void *x, const void *dy,
                              const double *saved, tsl_acc *acc)
{
    init_accs(acc, 2 * a->channels);
    gn_stage *st = stage_new();
    for (int64_t s = 0; s < a->samples; s++)
        for (int64_t c = 0; c < a->cext; c++) {
            tsl_acc *sum = &acc[2 * (a->c0 + c)];
            for (int64_t p = 0; p < a->inner; p += GN_CHUNK) {
                int64_t n = a->inner - p < GN_CHUNK ? a->inner - p : GN_CHUNK;
                stage_backward(a, x, dy, saved_pair(a, saved, s, c), s, c, p, n, st);
                tsl_bn_add_sum_products_f64(sum, sum + 1, st->dy, st->t, n);
            }
        }
    free(st);
}

void tsl_gn_group_sums_tile(const tsl_gn_args *a, const void *x, const void *dy,
                            const double *saved, const void *gamma, tsl_acc *acc)
{
    init_accs(acc, 2 * a->samples * a->groups);
    gn_stage *st = stage_new();
    for (int64_t s = 0; s < a->samples; s++)
        for (int64_t c = 0; c < a->cext; c++) {
            tsl_acc *sum = &acc[2 * (s * a->groups + group_of(a, c))];
            const double g = tsl_load(a->dtype, gamma, a->c0 + c);
            for (int64_t p = 0; p < a->inner; p += GN_CHUNK) {
                int64_t n = a->inner - p < GN_CHUNK ? a->inner - p : GN_CHUNK;
                stage_backward(a, x, dy, saved_pair(a, saved, s, c), s, c, p, n, st);
                for (int64_t i = 0; i < n; i++)
                    st->u[i] = tsl_hd_mul(st->dy[i], g);
                tsl_bn_add_sum_products_f64(sum, sum + 1, st->u, st->t, n);
            }
        }
    free(st);
}

void tsl_gn_backward_coef(const tsl_gn_args *a, const tsl_acc *acc, double *coef)
{
    tsl_acc scratch;
    for (int64_t k = 0; k < 2 * a->samples * a->groups; k++)
        coef[k] = tsl_hd_div(tsl_acc_round_into(&acc[k], &scratch), (double)a->per_group);
}

void tsl_gn_param_grad(const tsl_gn_args *a, const tsl_acc *acc, void *grad)
{
    tsl_acc scratch;
    for (int64_t c = 0; c < a->channels; c++)
        tsl_store(a->dtype, grad, c, tsl_acc_round_into(&acc[2 * c + a->which], &scratch));
}

void tsl_gn_backward_data_tile(const tsl_gn_args *a, const void *x, const void *dy,
                               const double *saved, const void *gamma, const double *coef, void *dx)
{
    gn_stage *st = stage_new();
    for (int64_t s = 0; s < a->samples; s++)
        for (int64_t c = 0; c < a->cext; c++) {
            const double *ms = saved_pair(a, saved, s, c);
            const double *m = &coef[2 * (s * a->groups + group_of(a, c))];
            const double g = tsl_load(a->dtype, gamma, a->c0 + c);
            for (int64_t p = 0; p < a->inner; p += GN_CHUNK) {
                int64_t n = a->inner - p < GN_CHUNK ? a->inner - p : GN_CHUNK;
                stage_backward(a, x, dy, ms, s, c, p, n, st);
                for (int64_t i = 0; i < n; i++)
                    st->u[i] = tsl_gn_dx(tsl_hd_mul(st->dy[i], g), st->t[i], ms[1], m[0], m[1]);
                scatter(a, dx, s, c, p, n, st->u);
            }
        }
    free(st);
}

/* ---- codelets ---- */

#define BUF(i) ((void *)STARPU_VECTOR_GET_PTR(buffers[i]))
#define NX(i) ((int64_t)STARPU_VECTOR_GET_NX(buffers[i]))
#define BYTES(i) (NX(i) * (int64_t)STARPU_VECTOR_GET_ELEMSIZE(buffers[i]))
#define ACCS(i, n) (BYTES(i) == (n) * (int64_t)sizeof(tsl_acc))
#define TILE(a) ((a).samples * (a).cext * (a).inner)
#define SLAB(a) (2 * (a).samples * (a).groups)

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
    TSL_CODELET_CHECK(ACCS(0, SLAB(a)) && NX(1) == 2 * a.batch * a.groups &&
                          a.n0 + a.samples <= a.batch,
                      "group norm save: sizes");
    tsl_gn_finalize(&a, BUF(0), (double *)BUF(1) + 2 * a.n0 * a.groups);
}

static void gn_normalize_cpu(void *buffers[], void *cl_arg)
{
    tsl_gn_args a;
    starpu_codelet_unpack_args(cl_arg, &a);
    TSL_CODELET_CHECK(NX(0) == TILE(a) && NX(1) == SLAB(a) && NX(2) == a.channels &&
                          NX(3) == a.channels && NX(4) == TILE(a),
                      "group norm normalize: sizes");
    tsl_gn_normalize_tile(&a, BUF(0), BUF(1), BUF(2), BUF(3), BUF(4));
}

static void gn_channel_sums_cpu(void *buffers[], void *cl_arg)
{
    tsl_gn_args a;
    starpu_codelet_unpack_args(cl_arg, &a);
    TSL_CODELET_CHECK(NX(0) == TILE(a) && NX(1) == TILE(a) && NX(2) == 2 * a.batch * a.groups &&
                          ACCS(3, 2 * a.channels),
                      "group norm channel sums: sizes");
    tsl_gn_channel_sums_tile(&a, BUF(0), BUF(1), BUF(2), BUF(3));
}

static void gn_group_sums_cpu(void *buffers[], void *cl_arg)
{
    tsl_gn_args a;
    starpu_codelet_unpack_args(cl_arg, &a);
    TSL_CODELET_CHECK(NX(0) == TILE(a) && NX(1) == TILE(a) && NX(2) == 2 * a.batch * a.groups &&
                          NX(3) == a.channels && ACCS(4, SLAB(a)),
                      "group norm group sums: sizes");
    tsl_gn_group_sums_tile(&a, BUF(0), BUF(1), BUF(2), BUF(3), BUF(4));
}

static void gn_bwd_coef_cpu(void *buffers[], void *cl_arg)
{
    tsl_gn_args a;
    starpu_codelet_unpack_args(cl_arg, &a);
    TSL_CODELET_CHECK(ACCS(0, SLAB(a)) && NX(1) == SLAB(a), "group norm coef: sizes");
    tsl_gn_backward_coef(&a, BUF(0), BUF(1));
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
    TSL_CODELET_CHECK(NX(0) == TILE(a) && NX(1) == TILE(a) && NX(2) == 2 * a.batch * a.groups &&
                          NX(3) == a.channels && NX(4) == SLAB(a) && NX(5) == TILE(a),
                      "group norm backward data: sizes");
    tsl_gn_backward_data_tile(&a, BUF(0), BUF(1), BUF(2), BUF(3), BUF(4), BUF(5));
}

/* The footprint: the tile sizes, the dtype, the layout, the groups, the tile's channels and the
 * gradient a task writes. */
static uint32_t gn_variant(struct starpu_task *task)
{
    tsl_gn_args a;
    starpu_codelet_unpack_args(task->cl_arg, &a);
    uint32_t h = starpu_task_data_footprint(task);
    h = tsl_hash_i64(h, a.dtype);
    h = tsl_hash_i64(h, a.channels_last);
    h = tsl_hash_i64(h, a.groups);
    h = tsl_hash_i64(h, a.which);
    return tsl_hash_i64(h, a.cext);
}

TSL_CODELET(tsl_cl_gn_stats, "tsl_gn_stats", gn_stats_cpu, NULL, gn_variant, .nbuffers = 2,
            .modes = {STARPU_R, STARPU_W});
TSL_CODELET(tsl_cl_gn_finalize, "tsl_gn_finalize", gn_finalize_cpu, NULL, gn_variant, .nbuffers = 2,
            .modes = {STARPU_R, STARPU_W});
TSL_CODELET(tsl_cl_gn_save, "tsl_gn_save", gn_save_cpu, NULL, gn_variant, .nbuffers = 2,
            .modes = {STARPU_R, STARPU_RW});
TSL_CODELET(tsl_cl_gn_normalize, "tsl_gn_normalize", gn_normalize_cpu, NULL, gn_variant,
            .nbuffers = 5, .modes = {STARPU_R, STARPU_R, STARPU_R, STARPU_R, STARPU_W});
TSL_CODELET(tsl_cl_gn_channel_sums, "tsl_gn_channel_sums", gn_channel_sums_cpu, NULL, gn_variant,
            .nbuffers = 4, .modes = {STARPU_R, STARPU_R, STARPU_R, STARPU_W});
TSL_CODELET(tsl_cl_gn_group_sums, "tsl_gn_group_sums", gn_group_sums_cpu, NULL, gn_variant,
            .nbuffers = 5, .modes = {STARPU_R, STARPU_R, STARPU_R, STARPU_R, STARPU_W});
TSL_CODELET(tsl_cl_gn_bwd_coef, "tsl_gn_bwd_coef", gn_bwd_coef_cpu, NULL, gn_variant, .nbuffers = 2,
            .modes = {STARPU_R, STARPU_W});
TSL_CODELET(tsl_cl_gn_param_grad, "tsl_gn_param_grad", gn_param_grad_cpu, NULL, gn_variant,
            .nbuffers = 2, .modes = {STARPU_R, STARPU_W});
TSL_CODELET(tsl_cl_gn_bwd_data, "tsl_gn_bwd_data", gn_bwd_data_cpu, NULL, gn_variant, .nbuffers = 6,
            .modes = {STARPU_R, STARPU_R, STARPU_R, STARPU_R, STARPU_R, STARPU_W});
