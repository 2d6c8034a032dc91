/* Max and average pooling (PyTorch's semantics: padding counts as -inf for max, as zeros
 * counted in the divisor for average unless count_include_pad is 0; the first maximum of a
 * window takes its gradient) and nearest and (bi/tri)linear upsampling by integer factors
 * (PyTorch's nn.Upsample, align_corners=False). Plain loops over (sample, channel) planes;
 * positions are handled as 3-D with unit trailing sizes. The codelets are in codelets/pool.c; the
 * per-output functions in pool_math.h, shared with the CUDA kernels (pool.cu). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "codelet.h"
#include "pool.h"
#include "pool_math.h"
#include "tessel/ops.h"

/* (the shared functions of pool_math.h, by shorter names) */
typedef tsl_pool_geom geom;
#define geometry tsl_pool_geometry
#define plane_base tsl_pool_plane_base
#define window_start tsl_pool_window_start
#define index_position tsl_pool_index_position
#define load_index tsl_pool_load_index

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

/* One output position's `inner` values (1, or a channels-last tile's channels) of y and the
 * indices from window w, channels innermost: y as the loop below (the last NaN, else the
 * maximum), the index the backward's choice (the first NaN, else the first maximum). */
TSL_VECTOR_KERNEL
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
                        /* selects, not branches, so the loop vectorises */
                        yc[c] = t > yc[c] || isnan(t) ? t : yc[c];
                        int take = t > bv[c] || (isnan(t) && !isnan(bv[c]));
                        bv[c] = take ? t : bv[c];
                        bk[c] = take ? k : bk[c];
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

/* One window's maxima over runs of `inner` values, without indices: a NaN wins (the last one),
 * else the largest. In chunks kept in a local array (the output is written once: updating it in
 * place made the compiler check aliasing for every window and store at every position). */
static void max_only_f32(const geom *g, const float *w, float *yo, int64_t inner)
{
    enum { CHUNK = 256 };
    for (int64_t c0 = 0; c0 < inner; c0 += CHUNK) {
        const int64_t cn = inner - c0 < CHUNK ? inner - c0 : CHUNK;
        float m[CHUNK];
        int first = 1; /* (the first position's values as they are: -inf < every non-NaN) */
        for (int64_t k0 = 0; k0 < g->k[0]; k0++)
            for (int64_t k1 = 0; k1 < g->k[1]; k1++)
                for (int64_t k2 = 0; k2 < g->k[2]; k2++) {
                    const float *restrict xr =
                        w + ((k0 * g->in[1] + k1) * g->in[2] + k2) * inner + c0;
                    if (first) {
                        for (int64_t c = 0; c < cn; c++)
                            m[c] = xr[c];
                        first = 0;
                        continue;
                    }
                    for (int64_t c = 0; c < cn; c++) {
                        float t = xr[c];
                        m[c] = t > m[c] || isnan(t) ? t : m[c];
                    }
                }
        for (int64_t c = 0; c < cn; c++)
            yo[c0 + c] = m[c];
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
                    max_only_f32(g, w, yo, inner);
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
TSL_VECTOR_KERNEL
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
                    int64_t out = (o0 * g.out[1] + o1) * g.out[2] + o2, best;
                    double v = tsl_pool_output(a, &g, x, xb, o0, o1, o2, &best);
                    if (ix && a->kind == TSL_POOL_MAX)
                        tsl_pool_store_index(a->index_dtype, ix, yb + out * g.cs, best);
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
TSL_VECTOR_KERNEL
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

TSL_VECTOR_KERNEL
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
                        int64_t best = tsl_pool_max_at(a, &g, x, xb, o0, o1, o2);
                        if (best >= 0)
                            tsl_store(a->dtype, dx, best, tsl_load(a->dtype, dx, best) + grad);
                    } else {
                        double share = grad / tsl_pool_avg_divisor(a, &g, o0, o1, o2);
                        TSL_POOL_FOR_WINDOW(g, o0, o1, o2, idx,
                                            tsl_store(a->dtype, dx, xb + idx,
                                                      tsl_load(a->dtype, dx, xb + idx) + share));
                    }
                }
    }
}

void tsl_upsample_forward_kernel(const tsl_pool_args *a, const void *x, void *y)
{
    geom g = geometry(a);
    for (int64_t pl = 0; pl < a->planes; pl++)
        for (int64_t out = 0; out < g.out_plane; out++)
            tsl_store(a->dtype, y, plane_base(a, pl, g.out_plane) + out * g.cs,
                      tsl_upsample_output(a, &g, x, pl, out));
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
            int n = tsl_upsample_sources(a, &g, out, at, weight);
            for (int t = 0; t < n; t++) {
                int64_t i = plane_base(a, pl, g.in_plane) + at[t] * g.cs;
                tsl_store(a->dtype, dx, i, tsl_load(a->dtype, dx, i) + weight[t] * grad);
            }
        }
}
