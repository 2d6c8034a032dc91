/* Pooling and upsampling per-output functions, shared by codelets/pool_kernels.c's loops and
 * codelets/pool.cu's kernels: a tile's geometry, the window of an output and its traversal,
 * the value of one output (max: the last NaN, else the maximum; average: the sum in window
 * order over the divisor), the backward's choice of a window's maximum (a NaN first, else the
 * first maximum), and the sources and weights of one upsampled output. Arithmetic in double as
 * the CPU loops; the CUDA file is compiled without multiply-add contraction: the same bits. */
#ifndef TESSEL_CODELETS_POOL_MATH_H
#define TESSEL_CODELETS_POOL_MATH_H

#include <math.h>
#include <stdint.h>

#include "codelet.h"
#include "hd.h"
#include "pool.h"
#include "tessel/ops.h"

/* Sizes padded to three dimensions (unused ones 1, kernel 1, stride 1, padding 0). */
typedef struct tsl_pool_geom {
    int64_t in[3], out[3], k[3], s[3], p[3], in_plane, out_plane;
    int64_t cs; /* distance between a plane's positions: 1, or the channels (channels-last) */
    int64_t gin[3], io[3], oo[3]; /* global input size, origins of the input and output */
    int64_t gout[3];              /* upsampling: the global output size */
} tsl_pool_geom;

static inline TSL_HD tsl_pool_geom tsl_pool_geometry(const tsl_pool_args *a)
{
    tsl_pool_geom g;
    for (int d = 0; d < 3; d++) {
        int used = d < a->spatial;
        g.in[d] = used ? a->in_size[d] : 1;
        g.out[d] = used ? a->out_size[d] : 1;
        g.k[d] = used ? a->kernel[d] : 1;
        g.s[d] = used ? a->stride[d] : 1;
        g.p[d] = used ? a->padding[d] : 0;
        g.gin[d] = used && a->global_in[d] ? a->global_in[d] : g.in[d];
        g.io[d] = used ? a->in_origin[d] : 0;
        g.oo[d] = used ? a->out_origin[d] : 0;
        g.gout[d] = used && a->global_out[d] ? a->global_out[d] : g.out[d];
    }
    g.in_plane = g.in[0] * g.in[1] * g.in[2];
    g.out_plane = g.out[0] * g.out[1] * g.out[2];
    g.cs = a->channels_last ? a->channels : 1;
    return g;
}

/* Offset of plane `pl`'s first position in a tile of planes of `plane` positions. */
static inline TSL_HD int64_t tsl_pool_plane_base(const tsl_pool_args *a, int64_t pl, int64_t plane)
{
    return a->channels_last ? pl / a->channels * plane * a->channels + pl % a->channels
                            : pl * plane;
}

/* Visit the in-bounds input positions of the window of (local) output o: positions are
 * worked out globally, idx is the local offset in the input buffer; k0, k1, k2 the kernel
 * position. */
#define TSL_POOL_FOR_WINDOW(g, o0, o1, o2, idx, body)                                              \
    for (int64_t k0 = 0; k0 < (g).k[0]; k0++) {                                                    \
        int64_t q0 = ((o0) + (g).oo[0]) * (g).s[0] - (g).p[0] + k0;                                \
        if (q0 < 0 || q0 >= (g).gin[0])                                                            \
            continue;                                                                              \
        for (int64_t k1 = 0; k1 < (g).k[1]; k1++) {                                                \
            int64_t q1 = ((o1) + (g).oo[1]) * (g).s[1] - (g).p[1] + k1;                            \
            if (q1 < 0 || q1 >= (g).gin[1])                                                        \
                continue;                                                                          \
            for (int64_t k2 = 0; k2 < (g).k[2]; k2++) {                                            \
                int64_t q2 = ((o2) + (g).oo[2]) * (g).s[2] - (g).p[2] + k2;                        \
                if (q2 < 0 || q2 >= (g).gin[2])                                                    \
                    continue;                                                                      \
                int64_t idx = (((q0 - (g).io[0]) * (g).in[1] + (q1 - (g).io[1])) * (g).in[2] +     \
                               q2 - (g).io[2]) *                                                   \
                              (g).cs;                                                              \
                body;                                                                              \
            }                                                                                      \
        }                                                                                          \
    }

static inline TSL_HD double tsl_pool_avg_divisor(const tsl_pool_args *a, const tsl_pool_geom *g,
                                                 int64_t o0, int64_t o1, int64_t o2)
{
    if (a->count_include_pad) {
        /* The window clipped to the padded input, as PyTorch. */
        double n = 1;
        int64_t o[3] = {o0 + g->oo[0], o1 + g->oo[1], o2 + g->oo[2]};
        for (int d = 0; d < 3; d++) {
            int64_t lo = o[d] * g->s[d] - g->p[d];
            int64_t hi = lo + g->k[d];
            if (hi > g->gin[d] + g->p[d])
                hi = g->gin[d] + g->p[d];
            n *= (double)(hi - lo);
        }
        return n;
    }
    /* The window's positions inside the input (those TSL_POOL_FOR_WINDOW visits). */
    double n = 1;
    int64_t o[3] = {o0 + g->oo[0], o1 + g->oo[1], o2 + g->oo[2]};
    for (int d = 0; d < 3; d++) {
        int64_t lo = o[d] * g->s[d] - g->p[d];
        int64_t hi = lo + g->k[d];
        if (lo < 0)
            lo = 0;
        if (hi > g->gin[d])
            hi = g->gin[d];
        n *= hi > lo ? (double)(hi - lo) : 0.0;
    }
    return n;
}

/* Output (o0, o1, o2) of plane base xb (tsl_pool_plane_base()) of a max or average pooling of
 * x; for max pooling, *best is the backward's choice as a kernel position,
 * (k0 * k[1] + k1) * k[2] + k2 (-1 where the window holds only padding). */
static inline TSL_HD double tsl_pool_output(const tsl_pool_args *a, const tsl_pool_geom *g,
                                            const void *x, int64_t xb, int64_t o0, int64_t o1,
                                            int64_t o2, int64_t *best)
{
    double v;
    if (a->kind == TSL_POOL_MAX) {
        v = -INFINITY;
        double bv = -INFINITY;
        *best = -1;
        TSL_POOL_FOR_WINDOW(*g, o0, o1, o2, idx, {
            double t = tsl_load(a->dtype, x, xb + idx);
            if (t > v || isnan(t))
                v = t;
            if (*best < 0 || t > bv || (isnan(t) && !isnan(bv))) {
                bv = t;
                *best = (k0 * g->k[1] + k1) * g->k[2] + k2;
            }
        });
        return v;
    }
    v = 0;
    TSL_POOL_FOR_WINDOW(*g, o0, o1, o2, idx, v += tsl_load(a->dtype, x, xb + idx));
    return v / tsl_pool_avg_divisor(a, g, o0, o1, o2);
}

/* The backward's choice in output (o0, o1, o2)'s window of a max pooling: the offset in x of a
 * NaN first, else of the first maximum (-1 where the window holds only padding); the same
 * choice as tsl_pool_output()'s. */
static inline TSL_HD int64_t tsl_pool_max_at(const tsl_pool_args *a, const tsl_pool_geom *g,
                                             const void *x, int64_t xb, int64_t o0, int64_t o1,
                                             int64_t o2)
{
    double v = -INFINITY;
    int64_t best = -1;
    TSL_POOL_FOR_WINDOW(*g, o0, o1, o2, idx, {
        double t = tsl_load(a->dtype, x, xb + idx);
        if (best < 0 || t > v || (isnan(t) && !isnan(v))) {
            v = t;
            best = xb + idx;
        }
    });
    return best;
}

/* The first input element of output (o0, o1, o2)'s window, in positions of the tile. */
static inline TSL_HD int64_t tsl_pool_window_start(const tsl_pool_geom *g, int64_t o0, int64_t o1,
                                                   int64_t o2)
{
    int64_t q0 = (o0 + g->oo[0]) * g->s[0] - g->p[0] - g->io[0];
    int64_t q1 = (o1 + g->oo[1]) * g->s[1] - g->p[1] - g->io[1];
    int64_t q2 = (o2 + g->oo[2]) * g->s[2] - g->p[2] - g->io[2];
    return (q0 * g->in[1] + q1) * g->in[2] + q2;
}

/* The position in a tile of the input element at kernel position k of output (o0, o1, o2)'s
 * window (the window may start in the padding; the element itself is inside). */
static inline TSL_HD int64_t tsl_pool_index_position(const tsl_pool_geom *g, int64_t o0, int64_t o1,
                                                     int64_t o2, int64_t k)
{
    int64_t k2 = k % g->k[2], k1 = k / g->k[2] % g->k[1], k0 = k / (g->k[2] * g->k[1]);
    return tsl_pool_window_start(g, o0, o1, o2) + (k0 * g->in[1] + k1) * g->in[2] + k2;
}

/* Window positions as indices: -1 (a window of padding only) is 255 in u8 indices. */
static inline TSL_HD void tsl_pool_store_index(int dtype, void *ix, int64_t i, int64_t k)
{
    if (dtype == TSL_U8)
        ((uint8_t *)ix)[i] = k < 0 ? UINT8_MAX : (uint8_t)k;
    else
        ((int32_t *)ix)[i] = (int32_t)k;
}

static inline TSL_HD int64_t tsl_pool_load_index(int dtype, const void *ix, int64_t i)
{
    if (dtype == TSL_U8)
        return ((const uint8_t *)ix)[i] == UINT8_MAX ? -1 : ((const uint8_t *)ix)[i];
    return ((const int32_t *)ix)[i];
}

/* The sources of global output position o along one dimension of an upsampling: the first
 * (*lo) and, for linear, the second (*hi: the next, clamped to the last input) with its weight
 * (*w_hi; 0 for nearest). By the integer scale k when k > 0 (out = k in), by the global sizes
 * when k is 0 (any in and out, PyTorch's size=), as PyTorch computes them: nearest
 * min(floor(o * scale), in - 1) with scale = (float)(1 / k), or (float)in / (float)out, in float
 * (for some sizes, and scales from 41 up, the float scale picks another source than the exact
 * ratio; PyTorch's choice is kept); linear max((o + 0.5) / k - 0.5, 0), or
 * max((o + 0.5) in / out - 0.5, 0), in double. */
static inline TSL_HD void tsl_upsample_axis(int linear, int64_t k, int64_t gin, int64_t gout,
                                            int64_t o, int64_t *lo, int64_t *hi, double *w_hi)
{
    *w_hi = 0;
    if (!linear) {
        float scale = k > 0 ? (float)(1.0 / (double)k) : (float)gin / (float)gout;
        *lo = (int64_t)floorf((float)o * scale);
        if (*lo > gin - 1)
            *lo = gin - 1;
        *hi = *lo;
        return;
    }
    double src = k > 0 ? ((double)o + 0.5) / (double)k - 0.5
                       : ((double)o + 0.5) * (double)gin / (double)gout - 0.5;
    if (src < 0)
        src = 0;
    *lo = (int64_t)src;
    if (*lo > gin - 1) /* a downsampling's last output, rounding aside */
        *lo = gin - 1;
    *hi = *lo < gin - 1 ? *lo + 1 : *lo;
    *w_hi = src - (double)*lo;
}

/* The input positions (plane offsets) and weights that output position `out` of a plane reads;
 * returns how many (up to 8). Nearest reads one; linear reads two per used dimension, floor and
 * floor + 1 clamped to the last element (both may then be the same element). */
static inline TSL_HD int tsl_upsample_sources(const tsl_pool_args *a, const tsl_pool_geom *g,
                                              int64_t out, int64_t *at, double *weight)
{
    int64_t o[3] = {out / (g->out[1] * g->out[2]) + g->oo[0],
                    out / g->out[2] % g->out[1] + g->oo[1], out % g->out[2] + g->oo[2]};
    int64_t lo[3], hi[3];
    double w_hi[3];
    int taps[3];
    for (int d = 0; d < 3; d++) {
        int linear = a->kind == TSL_UPSAMPLE_LINEAR && d < a->spatial;
        tsl_upsample_axis(linear, g->k[d], g->gin[d], g->gout[d], o[d], &lo[d], &hi[d], &w_hi[d]);
        taps[d] = linear ? 2 : 1;
    }
    int n = 0;
    for (int t0 = 0; t0 < taps[0]; t0++)
        for (int t1 = 0; t1 < taps[1]; t1++)
            for (int t2 = 0; t2 < taps[2]; t2++) {
                int64_t q0 = t0 ? hi[0] : lo[0], q1 = t1 ? hi[1] : lo[1], q2 = t2 ? hi[2] : lo[2];
                at[n] = ((q0 - g->io[0]) * g->in[1] + q1 - g->io[1]) * g->in[2] + q2 - g->io[2];
                weight[n] = (t0 ? w_hi[0] : 1 - w_hi[0]) * (t1 ? w_hi[1] : 1 - w_hi[1]) *
                            (t2 ? w_hi[2] : 1 - w_hi[2]);
                n++;
            }
    return n;
}

/* Output `out` of plane `pl` of an upsampling of x: the weighted sum of its sources, in order. */
static inline TSL_HD double tsl_upsample_output(const tsl_pool_args *a, const tsl_pool_geom *g,
                                                const void *x, int64_t pl, int64_t out)
{
    int64_t at[8];
    double weight[8];
    int n = tsl_upsample_sources(a, g, out, at, weight);
    int64_t xb = tsl_pool_plane_base(a, pl, g->in_plane);
    double v = weight[0] * tsl_load(a->dtype, x, xb + at[0] * g->cs);
    for (int t = 1; t < n; t++)
        v += weight[t] * tsl_load(a->dtype, x, xb + at[t] * g->cs);
    return v;
}

/* Plane and position of element m of a tile of planes of `plane` positions (m in memory order:
 * consecutive CUDA threads touch consecutive elements in either layout). */
static inline TSL_HD void tsl_pool_plane_position(const tsl_pool_args *a, int64_t plane, int64_t m,
                                                  int64_t *pl, int64_t *pos)
{
    if (a->channels_last) {
        int64_t c = m % a->channels, r = m / a->channels;
        *pos = r % plane;
        *pl = r / plane * a->channels + c;
    } else {
        *pl = m / plane;
        *pos = m % plane;
    }
}

/* Position pos of a plane of `size` as three coordinates. */
static inline TSL_HD void tsl_pool_split_position(const int64_t *size, int64_t pos, int64_t q[3])
{
    q[0] = pos / (size[1] * size[2]);
    q[1] = pos / size[2] % size[1];
    q[2] = pos % size[2];
}

/* v rounded to the dtype (the CPU stores each partial sum in the tile). */
static inline TSL_HD double tsl_pool_round(int dtype, double v)
{
    return dtype == TSL_F32 ? (double)(float)v : v;
}

/* Whether no two pooling windows share an input element (stride >= kernel in every dimension)
 * and the in-bounds elements of every window lie in the tile: the backward then writes each
 * element of the tile from at most one output (tsl_pool_backward_disjoint()). */
static inline TSL_HD int tsl_pool_windows_disjoint(const tsl_pool_geom *g)
{
    for (int d = 0; d < 3; d++) {
        if (g->s[d] < g->k[d])
            return 0;
        if (g->out[d] <= 0)
            continue;
        int64_t lo = g->oo[d] * g->s[d] - g->p[d];
        int64_t hi = (g->oo[d] + g->out[d] - 1) * g->s[d] - g->p[d] + g->k[d];
        if (lo < 0)
            lo = 0;
        if (hi > g->gin[d])
            hi = g->gin[d];
        if (lo < g->io[d] || hi > g->io[d] + g->in[d])
            return 0;
    }
    return 1;
}

/* The backward of a pooling whose windows are disjoint, from output element m (memory order of
 * dy): into dx, zeroed before, writes 0 + dy's share rounded to the dtype (the bits of the
 * general backward's one-term sum) at the window's choice (max: from the indices ix, or from x
 * without them) or at each element of the window (average). One call per output, in any order
 * or at once: no two write the same element. */
static inline TSL_HD void tsl_pool_backward_disjoint(const tsl_pool_args *a, const tsl_pool_geom *g,
                                                     const void *x, const void *ix, const void *dy,
                                                     void *dx, int64_t m)
{
    int64_t pl, out, o[3];
    tsl_pool_plane_position(a, g->out_plane, m, &pl, &out);
    tsl_pool_split_position(g->out, out, o);
    int64_t xb = tsl_pool_plane_base(a, pl, g->in_plane);
    double grad = tsl_load(a->dtype, dy, m);
    if (a->kind == TSL_POOL_MAX) {
        int64_t at;
        if (ix) {
            int64_t k = tsl_pool_load_index(a->index_dtype, ix, m);
            if (k < 0)
                return;
            at = xb + tsl_pool_index_position(g, o[0], o[1], o[2], k) * g->cs;
        } else {
            at = tsl_pool_max_at(a, g, x, xb, o[0], o[1], o[2]);
            if (at < 0)
                return;
        }
        tsl_store(a->dtype, dx, at, tsl_pool_round(a->dtype, 0.0 + grad));
        return;
    }
    double share = grad / tsl_pool_avg_divisor(a, g, o[0], o[1], o[2]);
    TSL_POOL_FOR_WINDOW(*g, o[0], o[1], o[2], idx,
                        tsl_store(a->dtype, dx, xb + idx, tsl_pool_round(a->dtype, 0.0 + share)));
}

#endif /* TESSEL_CODELETS_POOL_MATH_H */
