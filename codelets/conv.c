/* Convolution on spatial tiles: windows assembled from a tile, halo slabs and zeros, run in
 * chunks of output rows, and the codelets (the oneDNN primitives and whole-tile kernels are in
 * codelets/conv_primitives.c). */
#include <stdlib.h>
#include <string.h>

#include "codelet.h"
#include "conv.h"
#include "conv_internal.h"
#include "copy.h"
#include "tessel/op_params.h"

/* ---- spatial tiles ---- */

static int64_t box_volume(int sp, const tsl_conv_box *b)
{
    int64_t v = 1;
    for (int d = 0; d < sp; d++)
        v *= b->size[d];
    return v;
}

/* The intersection of two boxes; 0 when it is empty. */
static int intersect(int sp, const tsl_conv_box *a, const tsl_conv_box *b, tsl_conv_box *out)
{
    for (int d = 0; d < sp; d++) {
        int64_t lo = a->lo[d] > b->lo[d] ? a->lo[d] : b->lo[d];
        int64_t ahi = a->lo[d] + a->size[d], bhi = b->lo[d] + b->size[d];
        int64_t hi = ahi < bhi ? ahi : bhi;
        if (hi <= lo)
            return 0;
        out->lo[d] = lo;
        out->size[d] = hi - lo;
    }
    return 1;
}

/* Where slab k sits in the window: its box moved by its shift (circular padding). */
static tsl_conv_box placed(const tsl_conv_window *w, int k)
{
    tsl_conv_box b = w->slab[k];
    for (int d = 0; d < 3; d++)
        b.lo[d] += w->slab_shift[k][d];
    return b;
}

/* Copy (or add) `part` (a box inside both) from an (N, channels, from_box) array to an
 * (N, channels, to_box) one. */
static void copy_box(const tsl_conv_args *a, int64_t channels, const tsl_conv_box *part,
                     const tsl_conv_box *from_box, const float *from, const tsl_conv_box *to_box,
                     float *to, int accumulate)
{
    tsl_box_copy_args c;
    memset(&c, 0, sizeof c);
    c.ndim = 2 + a->spatial;
    c.elem_size = sizeof(float);
    c.accumulate = accumulate;
    c.src_layout = c.dst_layout = a->channels_last ? TSL_LAYOUT_CHANNELS_LAST : TSL_LAYOUT_PLAIN;
    c.src_extent[0] = c.dst_extent[0] = c.box[0] = a->samples;
    c.src_extent[1] = c.dst_extent[1] = c.box[1] = channels;
    for (int d = 0; d < a->spatial; d++) {
        c.src_extent[2 + d] = from_box->size[d];
        c.dst_extent[2 + d] = to_box->size[d];
        c.src_offset[2 + d] = part->lo[d] - from_box->lo[d];
        c.dst_offset[2 + d] = part->lo[d] - to_box->lo[d];
        c.box[2 + d] = part->size[d];
    }
    tsl_box_copy(&c, to, from);
}

/* Copy `part` of the input (in_channels) from an (N, C, from_box) array to an (N, C, to_box)
 * one. */
static void copy_part(const tsl_conv_args *a, const tsl_conv_box *part,
                      const tsl_conv_box *from_box, const float *from, const tsl_conv_box *to_box,
                      float *to)
{
    copy_box(a, a->in_channels, part, from_box, from, to_box, to, 0);
}

void tsl_conv_window_check(const tsl_conv_args *a, const tsl_conv_window *w)
{
    int sp = a->spatial;
    TSL_CODELET_CHECK(w->nslabs >= 0 && w->nslabs <= TSL_CONV_MAX_SLABS, "conv window: slabs");
    tsl_conv_box global = {{0, 0, 0}, {w->global[0], w->global[1], w->global[2]}};
    for (int d = 0; d < sp; d++)
        TSL_CODELET_CHECK(w->window.size[d] == a->in_size[d],
                          "conv window: the arguments' input size must be the window's");
    const tsl_conv_box *parts[TSL_CONV_MAX_SLABS + 1];
    tsl_conv_box at[TSL_CONV_MAX_SLABS + 1]; /* where each sits in the window */
    parts[0] = &w->tile;
    at[0] = w->tile;
    for (int k = 0; k < w->nslabs; k++) {
        parts[k + 1] = &w->slab[k];
        at[k + 1] = placed(w, k);
    }
    int64_t covered = 0;
    for (int k = 0; k <= w->nslabs; k++) {
        tsl_conv_box inside, part, overlap;
        TSL_CODELET_CHECK(intersect(sp, parts[k], &global, &inside) &&
                              box_volume(sp, &inside) == box_volume(sp, parts[k]),
                          "conv window: a tile or slab box leaves the global input");
        if (intersect(sp, &at[k], &w->window, &part))
            covered += box_volume(sp, &part);
        for (int j = 0; j < k; j++)
            TSL_CODELET_CHECK(!intersect(sp, &at[k], &at[j], &overlap),
                              "conv window: the tile and the slabs overlap");
    }
    tsl_conv_box needed; /* circular padding: the whole window, else its part in the input */
    int64_t need = w->pad_mode == TSL_PADDING_CIRCULAR           ? box_volume(sp, &w->window)
                   : intersect(sp, &w->window, &global, &needed) ? box_volume(sp, &needed)
                                                                 : 0;
    TSL_CODELET_CHECK(covered == need,
                      "conv window: halo slabs are missing for part of the window");
}

/* Position q of dimension d (global coordinates) mapped into the global input [0, n) as the
 * padding mode fills it. */
static int64_t pad_source(int mode, int64_t q, int64_t n)
{
    if (mode == TSL_PADDING_REFLECT) /* ... x[2] x[1] | x[0] x[1] ... x[n-1] | x[n-2] ... */
        return q < 0 ? -q : q >= n ? 2 * (n - 1) - q : q;
    return q < 0 ? 0 : q >= n ? n - 1 : q; /* replicate */
}

/* Visit every window position outside the global input with the offset (in elements of one
 * (sample, channel) plane or channels-last row, see below) of itself and of its source; add
 * (fold) or copy (fill) the values of all samples and channels. */
static void pad_walk(const tsl_conv_args *a, const tsl_conv_window *w, float *win, int fold)
{
    int sp = a->spatial;
    int64_t size[3] = {1, 1, 1}, lo[3] = {0, 0, 0}, n[3] = {1, 1, 1};
    for (int d = 0; d < sp; d++) {
        size[d] = w->window.size[d];
        lo[d] = w->window.lo[d];
        n[d] = w->global[d];
    }
    int64_t plane = size[0] * size[1] * size[2], channels = a->in_channels;
    for (int64_t i = 0; i < size[0]; i++)
        for (int64_t j = 0; j < size[1]; j++)
            for (int64_t k = 0; k < size[2]; k++) {
                int64_t q[3] = {lo[0] + i, lo[1] + j, lo[2] + k}, src[3];
                int outside = 0;
                for (int d = 0; d < 3; d++) {
                    src[d] = d < sp ? pad_source(w->pad_mode, q[d], n[d]) : q[d];
                    outside |= src[d] != q[d];
                }
                if (!outside)
                    continue;
                for (int d = 0; d < sp; d++)
                    TSL_CODELET_CHECK(src[d] >= lo[d] && src[d] < lo[d] + size[d],
                                      "conv window: a padded position's source is outside the "
                                      "window (padding over half the kernel's span)");
                int64_t at = (i * size[1] + j) * size[2] + k;
                int64_t from =
                    ((src[0] - lo[0]) * size[1] + (src[1] - lo[1])) * size[2] + (src[2] - lo[2]);
                for (int64_t s = 0; s < a->samples; s++) {
                    int64_t base = s * channels * plane;
                    for (int64_t c = 0; c < channels; c++) {
                        /* plain (N, C, spatial): c * plane + pos; channels-last: pos * C + c */
                        int64_t to_i =
                            base + (a->channels_last ? at * channels + c : c * plane + at);
                        int64_t from_i =
                            base + (a->channels_last ? from * channels + c : c * plane + from);
                        if (fold)
                            win[from_i] += win[to_i];
                        else
                            win[to_i] = win[from_i];
                    }
                }
            }
}

void tsl_conv_window_fold(const tsl_conv_args *a, const tsl_conv_window *w, float *dwindow)
{
    if (w->pad_mode == TSL_PADDING_REFLECT || w->pad_mode == TSL_PADDING_REPLICATE)
        pad_walk(a, w, dwindow, 1);
}

void tsl_conv_window_assemble(const tsl_conv_args *a, const tsl_conv_window *w, const float *tile,
                              const float *const *slabs, float *window)
{
    int64_t channels = a->in_channels;
    memset(window, 0,
           sizeof(float) * (size_t)(a->samples * channels * box_volume(a->spatial, &w->window)));
    tsl_conv_box part;
    if (intersect(a->spatial, &w->tile, &w->window, &part))
        copy_part(a, &part, &w->tile, tile, &w->window, window);
    for (int k = 0; k < w->nslabs; k++) {
        tsl_conv_box at = placed(w, k);
        if (intersect(a->spatial, &at, &w->window, &part))
            copy_part(a, &part, &at, slabs[k], &w->window, window);
    }
    if (w->pad_mode == TSL_PADDING_REFLECT || w->pad_mode == TSL_PADDING_REPLICATE)
        pad_walk(a, w, window, 0);
}

void tsl_conv_window_scatter(const tsl_conv_args *a, const tsl_conv_window *w, const float *dwindow,
                             float *dtile, float *const *dslabs)
{
    int64_t channels = a->in_channels;
    tsl_conv_box part;
    for (int k = -1; k < w->nslabs; k++) {
        tsl_conv_box box = k < 0 ? w->tile : placed(w, k);
        float *out = k < 0 ? dtile : dslabs[k];
        memset(out, 0,
               sizeof(float) * (size_t)(a->samples * channels * box_volume(a->spatial, &box)));
        if (intersect(a->spatial, &box, &w->window, &part))
            copy_part(a, &part, &w->window, dwindow, &box, out);
    }
}

/* A per-thread buffer of at least `floats` floats, grown as needed. */
static float *grow(float **buf, size_t *have, size_t floats)
{
    if (*have < floats) {
        free(*buf);
        *buf = malloc(floats * sizeof(float));
        TSL_CODELET_CHECK(*buf, "conv: out of memory for a scratch buffer");
        *have = floats;
    }
    return *buf;
}

/* ---- windows in chunks of output rows ----
 *
 * A windowed convolution runs over its output in chunks of rows (the first spatial dimension),
 * each from the part of the window those rows read, so a worker's buffers (the assembled
 * window, an output or gradient chunk, a weight-gradient chunk) stay near chunk_floats
 * instead of growing to a whole tile per buffer. Where a chunk is one contiguous run of a tile
 * (one sample, channels-last, all of the other dimensions) it is read or written in place.
 * Transposed convolutions run in one chunk. */

static size_t chunk_floats = TSL_CONV_CHUNK_FLOATS_DEFAULT;

void tsl_conv_set_chunk_floats(size_t floats)
{
    chunk_floats = floats ? floats : TSL_CONV_CHUNK_FLOATS_DEFAULT;
}

typedef struct chunk {
    tsl_conv_args a;   /* out_size[0]: the chunk's rows; in_size[0]: its window's rows */
    tsl_conv_window w; /* the window: the rows those outputs read */
    tsl_conv_box out;  /* the chunk's outputs, in the output tile's coordinates */
} chunk;

static int64_t span0(const tsl_conv_args *a)
{
    return a->dilation[0] * (a->kernel[0] - 1) + 1;
}

/* Output rows per chunk: every chunk's window and outputs stay within chunk_floats (at least
 * one row). */
static int64_t chunk_rows(const tsl_conv_args *a)
{
    if (a->transposed)
        return a->out_size[0];
    int64_t in_row = a->samples * a->in_channels, out_row = a->samples * a->out_channels;
    for (int d = 1; d < a->spatial; d++) {
        in_row *= a->in_size[d];
        out_row *= a->out_size[d];
    }
    int64_t cap = (int64_t)chunk_floats, by_out = cap / out_row;
    int64_t by_in = cap / in_row >= span0(a) ? (cap / in_row - span0(a)) / a->stride[0] + 1 : 1;
    int64_t rows = by_out < by_in ? by_out : by_in;
    return rows < 1 ? 1 : rows > a->out_size[0] ? a->out_size[0] : rows;
}

/* The chunk of `rows` output rows from row r0. One chunk for the whole tile is the problem
 * itself. */
static void chunk_at(const tsl_conv_args *a, const tsl_conv_window *w, int64_t r0, int64_t rows,
                     chunk *c)
{
    c->a = *a;
    c->w = *w;
    memset(&c->out, 0, sizeof c->out);
    for (int d = 0; d < a->spatial; d++)
        c->out.size[d] = a->out_size[d];
    if (r0 == 0 && rows == a->out_size[0])
        return;
    c->a.out_size[0] = rows;
    c->a.in_size[0] = (rows - 1) * a->stride[0] + span0(a);
    c->w.window.lo[0] = w->window.lo[0] + r0 * a->stride[0];
    c->w.window.size[0] = c->a.in_size[0];
    c->out.lo[0] = r0;
    c->out.size[0] = rows;
}

/* Whether `box` of an (N, channels, outer) array is one contiguous run of it (the whole array,
 * or, for one sample stored channels-last, rows of it spanning all of the other dimensions),
 * and if so the offset of its first element. */
static int run_of(const tsl_conv_args *a, int64_t channels, const tsl_conv_box *box,
                  const tsl_conv_box *outer, size_t *offset)
{
    int sp = a->spatial, whole = 1,
        rows_only = a->samples == 1 && (a->channels_last || channels == 1);
    int64_t row = channels;
    for (int d = 0; d < sp; d++) {
        if (box->lo[d] < outer->lo[d] || box->lo[d] + box->size[d] > outer->lo[d] + outer->size[d])
            return 0;
        if (box->lo[d] != outer->lo[d] || box->size[d] != outer->size[d]) {
            whole = 0;
            if (d > 0)
                rows_only = 0;
        }
        if (d > 0)
            row *= outer->size[d];
    }
    if (!whole && !rows_only)
        return 0;
    *offset = whole ? 0 : (size_t)((box->lo[0] - outer->lo[0]) * row);
    return 1;
}

/* The chunk's window: in place in the tile when it is a run of it, else assembled from the
 * tile, the slabs and zeros in this thread's scratch. */
static const float *chunk_input(const chunk *c, const float *tile, const float *const *slabs)
{
    tsl_conv_window_check(&c->a, &c->w);
    size_t offset;
    if (run_of(&c->a, c->a.in_channels, &c->w.window, &c->w.tile, &offset))
        return tile + offset;
    thread_cache *tc = tsl_conv_local_cache();
    float *window =
        grow(&tc->scratch, &tc->scratch_floats,
             (size_t)(c->a.samples * c->a.in_channels * box_volume(c->a.spatial, &c->w.window)));
    tsl_conv_window_assemble(&c->a, &c->w, tile, slabs, window);
    return window;
}

/* The chunk's rows of an output-shaped array (N, out_channels, out_size): in place when they
 * are a run of it, else copied into this thread's chunk buffer. */
static const float *chunk_rows_of(const tsl_conv_args *whole, const chunk *c, const float *full)
{
    tsl_conv_box outer;
    memset(&outer, 0, sizeof outer);
    for (int d = 0; d < whole->spatial; d++)
        outer.size[d] = whole->out_size[d];
    size_t offset;
    if (run_of(whole, whole->out_channels, &c->out, &outer, &offset))
        return full + offset;
    thread_cache *tc = tsl_conv_local_cache();
    float *buf =
        grow(&tc->part, &tc->part_floats,
             (size_t)(whole->samples * whole->out_channels * box_volume(whole->spatial, &c->out)));
    copy_box(whole, whole->out_channels, &c->out, &outer, full, &c->out, buf, 0);
    return buf;
}

/* The forward over the output box (a->out_size at `offset`) of an output tile of spatial size
 * tile_size. */
static void window_forward(const tsl_conv_args *a, const tsl_conv_window *w, const float *tile,
                           const float *const *slabs, const float *wt, const float *b,
                           const int64_t *offset, const int64_t *tile_size, float *y)
{
    tsl_conv_box outer;
    memset(&outer, 0, sizeof outer);
    for (int d = 0; d < a->spatial; d++)
        outer.size[d] = tile_size[d];
    int64_t rows = chunk_rows(a);
    for (int64_t r0 = 0; r0 < a->out_size[0]; r0 += rows) {
        chunk c;
        chunk_at(a, w, r0, a->out_size[0] - r0 < rows ? a->out_size[0] - r0 : rows, &c);
        const float *in = chunk_input(&c, tile, slabs);
        tsl_conv_box box = c.out; /* in the output tile */
        for (int d = 0; d < a->spatial; d++)
            box.lo[d] += offset[d];
        size_t at;
        if (run_of(a, a->out_channels, &box, &outer, &at)) {
            tsl_conv_forward_kernel(&c.a, in, wt, b, y + at);
            continue;
        }
        thread_cache *tc = tsl_conv_local_cache();
        float *buf = grow(&tc->part, &tc->part_floats,
                          (size_t)(a->samples * a->out_channels * box_volume(a->spatial, &box)));
        c.a.accumulate = 0; /* computed apart, then copied or added */
        tsl_conv_forward_kernel(&c.a, in, wt, b, buf);
        copy_box(a, a->out_channels, &box, &box, buf, &outer, y, (int)a->accumulate);
    }
}

void tsl_conv_window_forward(const tsl_conv_args *a, const tsl_conv_window *w, const float *tile,
                             const float *const *slabs, const float *wt, const float *b, float *y)
{
    static const int64_t origin[3] = {0, 0, 0};
    window_forward(a, w, tile, slabs, wt, b, origin, a->out_size, y);
}

void tsl_conv_window_forward_part(const tsl_conv_args *a, const tsl_conv_window *w,
                                  const float *tile, const float *const *slabs, const float *wt,
                                  const float *b, const int64_t *offset, const int64_t *tile_size,
                                  float *y)
{
    for (int d = 0; d < a->spatial; d++)
        TSL_CODELET_CHECK(offset[d] >= 0 && a->out_size[d] >= 1 &&
                              offset[d] + a->out_size[d] <= tile_size[d],
                          "conv: an output box leaves its tile");
    window_forward(a, w, tile, slabs, wt, b, offset, tile_size, y);
}

void tsl_conv_window_backward_data(const tsl_conv_args *a, const tsl_conv_window *w,
                                   const float *dy, const float *wt, float *dtile,
                                   float *const *dslabs)
{
    int sp = a->spatial;
    int64_t rows = chunk_rows(a);
    thread_cache *tc = tsl_conv_local_cache();
    if (rows == a->out_size[0]) { /* one chunk: the window's gradient cut into the parts */
        tsl_conv_window_check(a, w);
        size_t at;
        if (w->nslabs == 0 && run_of(a, a->in_channels, &w->window, &w->tile, &at) && at == 0 &&
            box_volume(sp, &w->window) == box_volume(sp, &w->tile)) {
            tsl_conv_backward_data_kernel(a, dy, wt, dtile); /* the window is the tile */
            return;
        }
        float *dwindow = grow(&tc->scratch, &tc->scratch_floats,
                              (size_t)(a->samples * a->in_channels * box_volume(sp, &w->window)));
        tsl_conv_backward_data_kernel(a, dy, wt, dwindow);
        tsl_conv_window_fold(a, w, dwindow);
        tsl_conv_window_scatter(a, w, dwindow, dtile, dslabs);
        return;
    }
    /* Chunks: each chunk's window gradient is added into the parts, whose rows chunks share. */
    for (int k = -1; k < w->nslabs; k++) {
        const tsl_conv_box *box = k < 0 ? &w->tile : &w->slab[k];
        memset(k < 0 ? dtile : dslabs[k], 0,
               sizeof(float) * (size_t)(a->samples * a->in_channels * box_volume(sp, box)));
    }
    for (int64_t r0 = 0; r0 < a->out_size[0]; r0 += rows) {
        chunk c;
        chunk_at(a, w, r0, a->out_size[0] - r0 < rows ? a->out_size[0] - r0 : rows, &c);
        tsl_conv_window_check(&c.a, &c.w);
        const float *dyc = chunk_rows_of(a, &c, dy);
        float *dwindow = grow(&tc->scratch, &tc->scratch_floats,
                              (size_t)(a->samples * a->in_channels * box_volume(sp, &c.w.window)));
        tsl_conv_backward_data_kernel(&c.a, dyc, wt, dwindow);
        tsl_conv_window_fold(&c.a, &c.w, dwindow);
        for (int k = -1; k < w->nslabs; k++) {
            tsl_conv_box box = k < 0 ? w->tile : placed(w, k);
            tsl_conv_box part;
            if (intersect(sp, &box, &c.w.window, &part))
                copy_box(a, a->in_channels, &part, &c.w.window, dwindow, &box,
                         k < 0 ? dtile : dslabs[k], 1);
        }
    }
}

void tsl_conv_window_backward_weights(const tsl_conv_args *a, const tsl_conv_window *w,
                                      const float *tile, const float *const *slabs, const float *dy,
                                      float *dw, float *db)
{
    int64_t rows = chunk_rows(a), k = kernel_volume(a), ci = a->in_channels / a->groups;
    int64_t count = a->out_channels * ci * k;
    /* A run of the weights' input channels: each output channel's part of dw is a run of
     * ci * k values, w_in_channels * k apart (a transposed convolution's run is one block). */
    int64_t stride = a->w_in_channels > 0 && !a->transposed ? a->w_in_channels * k : ci * k;
    float *dw_at = dw + weights_at(a);
    for (int64_t r0 = 0; r0 < a->out_size[0]; r0 += rows) {
        chunk c;
        chunk_at(a, w, r0, a->out_size[0] - r0 < rows ? a->out_size[0] - r0 : rows, &c);
        const float *in = chunk_input(&c, tile, slabs);
        const float *dyc = chunk_rows_of(a, &c, dy);
        if (r0 == 0) {
            tsl_conv_backward_weights_kernel(&c.a, in, dyc, dw, db);
            continue;
        }
        thread_cache *tc = tsl_conv_local_cache();
        float *tmp = grow(&tc->wtmp, &tc->wtmp_floats, (size_t)(count + a->out_channels));
        c.a.w_in_channels = 0; /* tmp holds this run of input channels only */
        c.a.w_in_offset = 0;
        tsl_conv_backward_weights_kernel(&c.a, in, dyc, tmp, db ? tmp + count : NULL);
        for (int64_t o = 0; o < a->out_channels; o++)
            for (int64_t i = 0; i < ci * k; i++)
                dw_at[o * stride + i] += tmp[o * ci * k + i];
        for (int64_t o = 0; db && o < a->out_channels; o++)
            db[o] += tmp[count + o];
    }
}

#define BUF(i) ((void *)STARPU_VECTOR_GET_PTR(buffers[i]))

/* The task's arguments and its halo buffers, which start at buffer `first`. */
static int unpack(void *cl_arg, void *buffers[], int first, tsl_conv_task_args *t, void **slabs)
{
    starpu_codelet_unpack_args(cl_arg, t);
    int ns = t->windowed ? t->window.nslabs : 0;
    TSL_CODELET_CHECK(ns >= 0 && ns <= TSL_CONV_MAX_SLABS, "conv: halo slab count");
    for (int k = 0; k < ns; k++)
        slabs[k] = BUF(first + k);
    return ns;
}

static void conv_forward_cpu(void *buffers[], void *cl_arg)
{
    tsl_conv_task_args t;
    void *slabs[TSL_CONV_MAX_SLABS];
    int ns = unpack(cl_arg, buffers, 1, &t, slabs), bias = t.conv.has_bias;
    const float *x = BUF(0), *w = BUF(1 + ns), *b = bias ? BUF(2 + ns) : NULL;
    float *y = BUF(2 + ns + bias);
    if (t.windowed && t.part)
        tsl_conv_window_forward_part(&t.conv, &t.window, x, (const float *const *)slabs, w, b,
                                     t.out_offset, t.out_tile, y);
    else if (t.windowed)
        tsl_conv_window_forward(&t.conv, &t.window, x, (const float *const *)slabs, w, b, y);
    else
        tsl_conv_forward_kernel(&t.conv, x, w, b, y);
}

static void conv_backward_data_cpu(void *buffers[], void *cl_arg)
{
    tsl_conv_task_args t;
    void *dslabs[TSL_CONV_MAX_SLABS];
    unpack(cl_arg, buffers, 3, &t, dslabs);
    if (t.windowed)
        tsl_conv_window_backward_data(&t.conv, &t.window, BUF(0), BUF(1), BUF(2),
                                      (float *const *)dslabs);
    else
        tsl_conv_backward_data_kernel(&t.conv, BUF(0), BUF(1), BUF(2));
}

static void conv_backward_weights_cpu(void *buffers[], void *cl_arg)
{
    tsl_conv_task_args t;
    void *slabs[TSL_CONV_MAX_SLABS];
    int ns = unpack(cl_arg, buffers, 1, &t, slabs);
    const float *x = BUF(0), *dy = BUF(1 + ns);
    float *dw = BUF(2 + ns), *db = t.conv.has_bias ? BUF(3 + ns) : NULL;
    if (t.windowed)
        tsl_conv_window_backward_weights(&t.conv, &t.window, x, (const float *const *)slabs, dy, dw,
                                         db);
    else
        tsl_conv_backward_weights_kernel(&t.conv, x, dy, dw, db);
}

/* The footprint: the tile sizes and the problem: kind, layout, bias, channels, sizes, kernel,
 * strides, padding, dilation, accumulation, and for a spatial tile its window's halo slabs and
 * whether it computes a part of its output tile. Positions (offsets, origins) stay out. */
static uint32_t conv_variant(struct starpu_task *task)
{
    tsl_conv_task_args t;
    starpu_codelet_unpack_args(task->cl_arg, &t);
    const tsl_conv_args *a = &t.conv;
    uint32_t h = starpu_task_data_footprint(task);
    const int64_t flags[] = {a->spatial,       a->has_bias,    a->transposed,   a->channels_last,
                             a->samples,       a->in_channels, a->out_channels, a->groups,
                             a->w_in_channels, a->accumulate,  t.windowed,      t.part,
                             t.window.nslabs};
    h = tsl_hash_i64s(h, flags, (int)(sizeof flags / sizeof flags[0]));
    h = tsl_hash_i64s(h, a->in_size, 3);
    h = tsl_hash_i64s(h, a->out_size, 3);
    h = tsl_hash_i64s(h, a->kernel, 3);
    h = tsl_hash_i64s(h, a->stride, 3);
    h = tsl_hash_i64s(h, a->padding, 3);
    return tsl_hash_i64s(h, a->dilation, 3);
}

#ifdef TESSEL_USE_CUDA
/* CUDA workers take the tasks the cuDNN path supports (tsl_conv_cuda_supports: whole tiles of
 * PyTorch's geometry); windowed tasks (halo slabs, chunks, parts of an output tile) run on CPU
 * workers only. */
static int conv_can_execute(unsigned workerid, struct starpu_task *task, unsigned nimpl)
{
    (void)nimpl;
    if (starpu_worker_get_type((int)workerid) != STARPU_CUDA_WORKER)
        return 1;
    tsl_conv_task_args t;
    starpu_codelet_unpack_args(task->cl_arg, &t);
    return tsl_conv_cuda_supports(&t);
}
/* (the CUDA slot and can_execute exist only with TESSEL_USE_CUDA) */
#define CONV_CAN_EXECUTE .can_execute = conv_can_execute
#else
#define CONV_CAN_EXECUTE .can_execute = NULL
#endif

TSL_CODELET(tsl_cl_conv_forward, "tsl_conv_fwd", conv_forward_cpu, tsl_conv_forward_cuda,
            conv_variant, CONV_CAN_EXECUTE, .nbuffers = STARPU_VARIABLE_NBUFFERS);
TSL_CODELET(tsl_cl_conv_backward_data, "tsl_conv_bwd_data", conv_backward_data_cpu,
            tsl_conv_backward_data_cuda, conv_variant, CONV_CAN_EXECUTE,
            .nbuffers = STARPU_VARIABLE_NBUFFERS);
TSL_CODELET(tsl_cl_conv_backward_weights, "tsl_conv_bwd_weights", conv_backward_weights_cpu,
            tsl_conv_backward_weights_cuda, conv_variant, CONV_CAN_EXECUTE,
            .nbuffers = STARPU_VARIABLE_NBUFFERS);
