/* Max and average pooling (PyTorch's semantics: padding counts as -inf for max, as zeros
 * counted in the divisor for average unless count_include_pad is 0; the first maximum of a
 * window takes its gradient) and nearest and (bi/tri)linear upsampling by integer factors
 * (PyTorch's nn.Upsample, align_corners=False). Plain loops over (sample, channel) planes;
 * positions are handled as 3-D with unit trailing sizes. The codelets are in codelets/pool.c. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "codelet.h"
#include "pool.h"
#include "tessel/ops.h"

/* Sizes padded to three dimensions (unused ones 1, kernel 1, stride 1, padding 0). */
typedef struct geom {
    int64_t in[3], out[3], k[3], s[3], p[3], in_plane, out_plane;
    int64_t cs; /* distance between a plane's positions: 1, or the channels (channels-last) */
    int64_t gin[3], io[3], oo[3]; /* global input size, origins of the input and output */
} geom;

static geom geometry(const tsl_pool_args *a)
{
    geom g;
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
    }
    g.in_plane = g.in[0] * g.in[1] * g.in[2];
    g.out_plane = g.out[0] * g.out[1] * g.out[2];
    g.cs = a->channels_last ? a->channels : 1;
    return g;
}

/* Offset of plane `pl`'s first position in a tile of planes of `plane` positions. */
static int64_t plane_base(const tsl_pool_args *a, int64_t pl, int64_t plane)
{
    return a->channels_last ? pl / a->channels * plane * a->channels + pl % a->channels
                            : pl * plane;
}

/* Visit the in-bounds input positions of the window of (local) output o: positions are
 * worked out globally, idx is the local offset in the input buffer. */
#define FOR_WINDOW(g, o0, o1, o2, idx, body)                                                       \
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

static double avg_divisor(const tsl_pool_args *a, const geom *g, int64_t o0, int64_t o1, int64_t o2)
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
    double n = 0;
    FOR_WINDOW(*g, o0, o1, o2, idx, (void)idx; n += 1);
    return n;
}

/* Whether every output's window lies inside the tile's input (no padding reached): then max
 * pooling of f32 tiles takes the loops below, without bounds checks and, on channels-last
 * tiles, with the channels innermost. They make the same comparisons in the same order as the
 * general loops (a NaN wins, else the first maximum), so the results are the same. */
static int windows_inside(const geom *g)
{
    for (int d = 0; d < 3; d++) {
        int64_t first = g->oo[d] * g->s[d] - g->p[d];
        int64_t last = (g->out[d] - 1 + g->oo[d]) * g->s[d] - g->p[d] + g->k[d] - 1;
        if (g->out[d] > 0 &&
            (first < 0 || last >= g->gin[d] || first - g->io[d] < 0 || last - g->io[d] >= g->in[d]))
            return 0;
    }
    return 1;
}

/* The first input element of output (o0, o1, o2)'s window, in positions of the tile. */
static int64_t window_start(const geom *g, int64_t o0, int64_t o1, int64_t o2)
{
    int64_t q0 = (o0 + g->oo[0]) * g->s[0] - g->p[0] - g->io[0];
    int64_t q1 = (o1 + g->oo[1]) * g->s[1] - g->p[1] - g->io[1];
    int64_t q2 = (o2 + g->oo[2]) * g->s[2] - g->p[2] - g->io[2];
    return (q0 * g->in[1] + q1) * g->in[2] + q2;
}

/* Window positions as indices (tsl_pool_forward_index_kernel()): (k0 * k[1] + k1) * k[2] + k2,
 * or -1 where a window holds only padding (255 in u8 indices). */
static void store_index(int dtype, void *ix, int64_t i, int64_t k)
{
    if (dtype == TSL_U8)
        ((uint8_t *)ix)[i] = k < 0 ? UINT8_MAX : (uint8_t)k;
    else
        ((int32_t *)ix)[i] = (int32_t)k;
}

static int64_t load_index(int dtype, const void *ix, int64_t i)
{
    if (dtype == TSL_U8)
        return ((const uint8_t *)ix)[i] == UINT8_MAX ? -1 : ((const uint8_t *)ix)[i];
    return ((const int32_t *)ix)[i];
}

/* The position in a tile of the input element at kernel position k of output (o0, o1, o2)'s
 * window (the window may start in the padding; the element itself is inside). */
static int64_t index_position(const geom *g, int64_t o0, int64_t o1, int64_t o2, int64_t k)
{
    int64_t k2 = k % g->k[2], k1 = k / g->k[2] % g->k[1], k0 = k / (g->k[2] * g->k[1]);
    return window_start(g, o0, o1, o2) + (k0 * g->in[1] + k1) * g->in[2] + k2;
}

/* One output position's `inner` values (1, or a channels-last tile's channels) of y and the
 * indices from window w, channels innermost: y as the loop below (the last NaN, else the
 * maximum), the index the backward's choice (the first NaN, else the first maximum). */
static void max_index_f32(const tsl_pool_args *a, const geom *g, const float *w, float *yo,
                          void *ix, int64_t at)
{
    enum { CHUNK = 256 };
    const int64_t inner = a->channels_last ? a->channels : 1;
    for (int64_t c0 = 0; c0 < inner; c0 += CHUNK) {
        const int64_t cn = inner - c0 < CHUNK ? inner - c0 : CHUNK;
        float bv[CHUNK];
        int32_t bk[CHUNK];
        float *restrict yc = yo + c0;
        int32_t k = 0;
        for (int64_t k0 = 0; k0 < g->k[0]; k0++)
            for (int64_t k1 = 0; k1 < g->k[1]; k1++)
                for (int64_t k2 = 0; k2 < g->k[2]; k2++, k++) {
                    const float *restrict xr =
                        w + ((k0 * g->in[1] + k1) * g->in[2] + k2) * inner + c0;
                    if (k == 0) {
                        for (int64_t c = 0; c < cn; c++) {
                            yc[c] = bv[c] = xr[c];
                            bk[c] = 0;
                        }
                        continue;
                    }
                    for (int64_t c = 0; c < cn; c++) {
                        float t = xr[c];
                        if (t > yc[c] || isnan(t))
                            yc[c] = t;
                        if (t > bv[c] || (isnan(t) && !isnan(bv[c]))) {
                            bv[c] = t;
                            bk[c] = k;
                        }
                    }
                }
        if (a->index_dtype == TSL_U8)
            for (int64_t c = 0; c < cn; c++)
                ((uint8_t *)ix)[at + c0 + c] = (uint8_t)bk[c];
        else
            for (int64_t c = 0; c < cn; c++)
                ((int32_t *)ix)[at + c0 + c] = bk[c];
    }
}

/* Runs of `inner` values (1, or the channels of a channels-last tile) per position. With `ix`,
 * also each output's index, the backward's choice: a NaN first, else the first maximum. */
static void max_forward_f32(const tsl_pool_args *a, const geom *g, const float *x, float *y,
                            void *ix)
{
    const int64_t inner = a->channels_last ? a->channels : 1, outer = a->planes / inner;
    for (int64_t n = 0; n < outer; n++) {
        const float *xp = x + n * g->in_plane * inner;
        float *yp = y + n * g->out_plane * inner;
        for (int64_t o0 = 0; o0 < g->out[0]; o0++)
            for (int64_t o1 = 0; o1 < g->out[1]; o1++)
                for (int64_t o2 = 0; o2 < g->out[2]; o2++) {
                    const float *w = xp + window_start(g, o0, o1, o2) * inner;
                    int64_t out = ((o0 * g->out[1] + o1) * g->out[2] + o2) * inner;
                    float *restrict yo = yp + out;
                    if (ix) {
                        max_index_f32(a, g, w, yo, ix, n * g->out_plane * inner + out);
                        continue;
                    }
                    for (int64_t c = 0; c < inner; c++)
                        yo[c] = -INFINITY;
                    for (int64_t k0 = 0; k0 < g->k[0]; k0++)
                        for (int64_t k1 = 0; k1 < g->k[1]; k1++)
                            for (int64_t k2 = 0; k2 < g->k[2]; k2++) {
                                const float *restrict xr =
                                    w + ((k0 * g->in[1] + k1) * g->in[2] + k2) * inner;
                                for (int64_t c = 0; c < inner; c++) {
                                    float t = xr[c];
                                    if (t > yo[c] || isnan(t))
                                        yo[c] = t;
                                }
                            }
                }
    }
}

static void max_backward_f32(const tsl_pool_args *a, const geom *g, const float *x, const float *dy,
                             float *dx)
{
    const int64_t inner = a->channels_last ? a->channels : 1, outer = a->planes / inner;
    memset(dx, 0, sizeof *dx * (size_t)(a->planes * g->in_plane));
    for (int64_t n = 0; n < outer; n++) {
        const float *xp = x + n * g->in_plane * inner;
        float *dxp = dx + n * g->in_plane * inner;
        const float *dyp = dy + n * g->out_plane * inner;
        for (int64_t o0 = 0; o0 < g->out[0]; o0++)
            for (int64_t o1 = 0; o1 < g->out[1]; o1++)
                for (int64_t o2 = 0; o2 < g->out[2]; o2++) {
                    int64_t start = window_start(g, o0, o1, o2) * inner;
                    int64_t out = ((o0 * g->out[1] + o1) * g->out[2] + o2) * inner;
                    for (int64_t c = 0; c < inner; c++) {
                        float v = -INFINITY;
                        int64_t best = -1;
                        for (int64_t k0 = 0; k0 < g->k[0]; k0++)
                            for (int64_t k1 = 0; k1 < g->k[1]; k1++)
                                for (int64_t k2 = 0; k2 < g->k[2]; k2++) {
                                    int64_t at =
                                        start + ((k0 * g->in[1] + k1) * g->in[2] + k2) * inner + c;
                                    float t = xp[at];
                                    if (best < 0 || t > v || (isnan(t) && !isnan(v))) {
                                        v = t;
                                        best = at;
                                    }
                                }
                        dxp[best] += dyp[out + c];
                    }
                }
    }
}

/* y (and with `ix` a max pooling's indices) from x. */
static void pool_forward(const tsl_pool_args *a, const void *x, void *y, void *ix)
{
    geom g = geometry(a);
    if (a->kind == TSL_POOL_MAX && a->dtype == TSL_F32 && windows_inside(&g)) {
        max_forward_f32(a, &g, x, y, ix);
        return;
    }
    for (int64_t pl = 0; pl < a->planes; pl++) {
        int64_t xb = plane_base(a, pl, g.in_plane), yb = plane_base(a, pl, g.out_plane);
        for (int64_t o0 = 0; o0 < g.out[0]; o0++)
            for (int64_t o1 = 0; o1 < g.out[1]; o1++)
                for (int64_t o2 = 0; o2 < g.out[2]; o2++) {
                    int64_t out = (o0 * g.out[1] + o1) * g.out[2] + o2;
                    double v;
                    if (a->kind == TSL_POOL_MAX) {
                        v = -INFINITY;
                        double bv = -INFINITY;
                        int64_t best = -1;
                        FOR_WINDOW(g, o0, o1, o2, idx, {
                            double t = tsl_load(a->dtype, x, xb + idx);
                            if (t > v || isnan(t))
                                v = t;
                            if (best < 0 || t > bv || (isnan(t) && !isnan(bv))) {
                                bv = t;
                                best = (k0 * g.k[1] + k1) * g.k[2] + k2;
                            }
                        });
                        if (ix)
                            store_index(a->index_dtype, ix, yb + out * g.cs, best);
                    } else {
                        v = 0;
                        FOR_WINDOW(g, o0, o1, o2, idx, v += tsl_load(a->dtype, x, xb + idx));
                        v /= avg_divisor(a, &g, o0, o1, o2);
                    }
                    tsl_store(a->dtype, y, yb + out * g.cs, v);
                }
    }
}

void tsl_pool_forward_kernel(const tsl_pool_args *a, const void *x, void *y)
{
    pool_forward(a, x, y, NULL);
}

void tsl_pool_forward_index_kernel(const tsl_pool_args *a, const void *x, void *y, void *ix)
{
    pool_forward(a, x, y, ix);
}

/* Plane by plane, each output in order: the same additions in the same order as
 * tsl_pool_backward_kernel(), so the same bits. */
void tsl_pool_backward_index_kernel(const tsl_pool_args *a, const void *ix, const void *dy,
                                    void *dx)
{
    geom g = geometry(a);
    const int64_t inner = a->channels_last ? a->channels : 1, outer = a->planes / inner;
    const size_t esize = a->dtype == TSL_F32 ? sizeof(float) : sizeof(double);
    memset(dx, 0, esize * (size_t)(a->planes * g.in_plane));
    /* Each kernel position's offset from a window's start (else divisions per element). */
    const int64_t kvol = g.k[0] * g.k[1] * g.k[2];
    int64_t *offset = malloc(sizeof *offset * (size_t)kvol);
    for (int64_t k = 0; offset && k < kvol; k++)
        offset[k] = index_position(&g, 0, 0, 0, k) - window_start(&g, 0, 0, 0);
    for (int64_t n = 0; n < outer; n++)
        for (int64_t o0 = 0; o0 < g.out[0]; o0++)
            for (int64_t o1 = 0; o1 < g.out[1]; o1++)
                for (int64_t o2 = 0; o2 < g.out[2]; o2++) {
                    int64_t out =
                        n * g.out_plane * inner + ((o0 * g.out[1] + o1) * g.out[2] + o2) * inner;
                    int64_t start = window_start(&g, o0, o1, o2);
                    for (int64_t c = 0; c < inner; c++) {
                        int64_t k = load_index(a->index_dtype, ix, out + c);
                        if (k < 0)
                            continue;
                        int64_t pos =
                            offset ? start + offset[k] : index_position(&g, o0, o1, o2, k);
                        int64_t at = (n * g.in_plane + pos) * inner + c;
                        if (a->dtype == TSL_F32)
                            ((float *)dx)[at] += ((const float *)dy)[out + c];
                        else
                            ((double *)dx)[at] += ((const double *)dy)[out + c];
                    }
                }
    free(offset);
}

void tsl_pool_backward_kernel(const tsl_pool_args *a, const void *x, const void *dy, void *dx)
{
    geom g = geometry(a);
    if (a->kind == TSL_POOL_MAX && a->dtype == TSL_F32 && windows_inside(&g)) {
        max_backward_f32(a, &g, x, dy, dx);
        return;
    }
    for (int64_t i = 0; i < a->planes * g.in_plane; i++)
        tsl_store(a->dtype, dx, i, 0.0);
    for (int64_t pl = 0; pl < a->planes; pl++) {
        int64_t xb = plane_base(a, pl, g.in_plane), yb = plane_base(a, pl, g.out_plane);
        for (int64_t o0 = 0; o0 < g.out[0]; o0++)
            for (int64_t o1 = 0; o1 < g.out[1]; o1++)
                for (int64_t o2 = 0; o2 < g.out[2]; o2++) {
                    double grad =
                        tsl_load(a->dtype, dy, yb + ((o0 * g.out[1] + o1) * g.out[2] + o2) * g.cs);
                    if (a->kind == TSL_POOL_MAX) {
                        double v = -INFINITY;
                        int64_t best = -1;
                        FOR_WINDOW(g, o0, o1, o2, idx, {
                            double t = tsl_load(a->dtype, x, xb + idx);
                            if (best < 0 || t > v || (isnan(t) && !isnan(v))) {
                                v = t;
                                best = idx;
                            }
                        });
                        if (best >= 0)
                            tsl_store(a->dtype, dx, xb + best,
                                      tsl_load(a->dtype, dx, xb + best) + grad);
                    } else {
                        double share = grad / avg_divisor(a, &g, o0, o1, o2);
                        FOR_WINDOW(g, o0, o1, o2, idx,
                                   tsl_store(a->dtype, dx, xb + idx,
                                             tsl_load(a->dtype, dx, xb + idx) + share));
                    }
                }
    }
}

/* The input positions (plane offsets) and weights that output position `out` of a plane reads;
 * returns how many (up to 8). Nearest reads one; linear reads two per used dimension, floor and
 * floor + 1 clamped to the last element (both may then be the same element). */
static int upsample_sources(const tsl_pool_args *a, const geom *g, int64_t out, int64_t *at,
                            double *weight)
{
    int64_t o[3] = {out / (g->out[1] * g->out[2]) + g->oo[0],
                    out / g->out[2] % g->out[1] + g->oo[1], out % g->out[2] + g->oo[2]};
    int64_t lo[3], hi[3];
    double w_hi[3];
    int taps[3];
    for (int d = 0; d < 3; d++) {
        taps[d] = 1;
        w_hi[d] = 0;
        if (a->kind != TSL_UPSAMPLE_LINEAR || d >= a->spatial) {
            lo[d] = hi[d] = o[d] / g->k[d];
            continue;
        }
        double src = ((double)o[d] + 0.5) / (double)g->k[d] - 0.5;
        if (src < 0)
            src = 0;
        lo[d] = (int64_t)src;
        hi[d] = lo[d] < g->gin[d] - 1 ? lo[d] + 1 : lo[d];
        w_hi[d] = src - (double)lo[d];
        taps[d] = 2;
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

void tsl_upsample_forward_kernel(const tsl_pool_args *a, const void *x, void *y)
{
    geom g = geometry(a);
    int64_t at[8];
    double weight[8];
    for (int64_t pl = 0; pl < a->planes; pl++)
        for (int64_t out = 0; out < g.out_plane; out++) {
            int n = upsample_sources(a, &g, out, at, weight);
            int64_t xb = plane_base(a, pl, g.in_plane);
            double v = weight[0] * tsl_load(a->dtype, x, xb + at[0] * g.cs);
            for (int t = 1; t < n; t++)
                v += weight[t] * tsl_load(a->dtype, x, xb + at[t] * g.cs);
            tsl_store(a->dtype, y, plane_base(a, pl, g.out_plane) + out * g.cs, v);
        }
}

/* The transpose of the forward, scattered plane by plane in output order: deterministic. */
void tsl_upsample_backward_kernel(const tsl_pool_args *a, const void *dy, void *dx)
{
    geom g = geometry(a);
    int64_t at[8];
    double weight[8];
    for (int64_t i = 0; i < a->planes * g.in_plane; i++)
        tsl_store(a->dtype, dx, i, 0.0);
    for (int64_t pl = 0; pl < a->planes; pl++)
        for (int64_t out = 0; out < g.out_plane; out++) {
            double grad = tsl_load(a->dtype, dy, plane_base(a, pl, g.out_plane) + out * g.cs);
            int n = upsample_sources(a, &g, out, at, weight);
            for (int t = 0; t < n; t++) {
                int64_t i = plane_base(a, pl, g.in_plane) + at[t] * g.cs;
                tsl_store(a->dtype, dx, i, tsl_load(a->dtype, dx, i) + weight[t] * grad);
            }
        }
}
