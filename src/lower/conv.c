/* Convolution on tiled tensors: shape checks, one oneDNN task per output tile, weight
 * gradients reduced over tiles by task trees. Sample tiles need nothing from each other;
 * with spatial tiles, each output tile's task reads a window of the input assembled from its
 * own input tile and halo slabs that pack tasks cut from the neighbouring tiles on their
 * owners (src/lower/halo.c), and the backward data pass sends the window gradient's slabs
 * back to be added into the neighbours' tiles. */
#include <stdlib.h>
#include <string.h>

#include "codelets/conv.h"
#include "internal.h"
#include "halo.h"
#include "tessel/ops.h"

/* Whether w is cut along its input channels (channels= plans): its second dimension, a
 * transposed convolution's first (not a model's sharded weight, whose tasks read replicas). */
static int input_parts(tsl_tensor_t w, int transposed)
{
    return w->shape.ndim > 1 && !w->replicas && w->grid.splits[transposed ? 0 : 1] > 1;
}

/* The tile of w cut ky x kx along its filters and input channels holding the filters of y's
 * channel tile g over x's channel tile k (a transposed convolution's weight is cut kx x ky). */
static int64_t part_tile(int transposed, int32_t g, int32_t k, int32_t ky, int32_t kx)
{
    return transposed ? (int64_t)k * ky + g : (int64_t)g * kx + k;
}

/* The weights' input channels: their second dimension, a transposed convolution's first. */
static int64_t weight_inputs(tsl_tensor_t w, int transposed)
{
    return w->shape.dims[transposed ? 0 : 1];
}

/* Check the tensors against the settings; fill the per-tile arguments' shared part. The
 * input's shape is xs (x's own, or that of the concatenation x is the first part of). */
static tsl_status check(const tsl_conv_params *p, int transposed, tsl_tensor_t x,
                        const tsl_shape *xs, tsl_tensor_t w, tsl_tensor_t b, tsl_tensor_t y,
                        const char *what, const char *fn, tsl_conv_args *args)
{
    tsl_status st = tsl_tensor_check(x, fn);
    if (st || (st = tsl_tensor_check(w, fn)) || (st = tsl_tensor_check(y, fn)))
        return st;
    struct tsl_context *ctx = x->ctx;
    if (!p)
        return tsl_error(ctx, TSL_ERR_INVALID_ARG, "%s: params is NULL", fn);
    if (w->ctx != ctx || y->ctx != ctx || (b && b->ctx != ctx))
        return tsl_error(ctx, TSL_ERR_INVALID_ARG, "%s: tensors of different contexts", fn);
    if (x->dtype != TSL_F32 || w->dtype != TSL_F32 || y->dtype != TSL_F32 ||
        (b && b->dtype != TSL_F32))
        return tsl_error(ctx, TSL_ERR_DTYPE, "%s: convolutions take f32 tensors", fn);
    tsl_shape want;
    st = transposed ? tsl_conv_transpose_output_shape(xs, &w->shape, p, &want)
                    : tsl_conv_output_shape(xs, &w->shape, p, &want);
    if (st)
        return tsl_error(ctx, st, "%s", tsl_last_error());
    if (memcmp(want.dims, y->shape.dims, sizeof want.dims) != 0 || want.ndim != y->shape.ndim)
        return tsl_error(ctx, TSL_ERR_SHAPE, "%s: %s has the wrong shape for these settings", fn,
                         what);
    int32_t ky = y->grid.splits[1];
    int cut = x->grid.splits[1] != 1 || ky != 1;
    if (cut && p->groups != 1)
        return tsl_error(ctx, TSL_ERR_SHAPE,
                         "%s: x and %s may be cut along channels only for a convolution of one "
                         "group",
                         fn, what);
    /* y cut along channels: w (and b) cut the same way along their filters (the first
     * dimension; a transposed convolution's second), tile g holding the filters of y's channel
     * tile g; w cut along its input channels too (channels= plans, not transposed): as many
     * tiles there as x has channel tiles, tile (g, k) of the filters of y's channel tile g over
     * x's channel tile k */
    int32_t kx = x->grid.splits[1], fdim = transposed ? 1 : 0;
    int incut = input_parts(w, transposed);
    if (incut &&
        (p->groups != 1 || xs->dims[1] != x->shape.dims[1] || w->grid.splits[1 - fdim] != kx ||
         w->grid.splits[fdim] != ky || w->ntiles != (int64_t)ky * kx ||
         (b && (b->ntiles != ky || b->grid.splits[0] != ky))))
        return tsl_error(ctx, TSL_ERR_SHAPE,
                         "%s: w cut along its input channels (%d tiles) needs one input (not a "
                         "concatenation) of one group, cut into as many channel tiles (x has %d), "
                         "and w's filters (and b) cut as %s's channels (%d tiles)",
                         fn, (int)w->grid.splits[1 - fdim], (int)kx, what, (int)ky);
    int wcut = incut || (ky > 1 && w->grid.splits[fdim] == ky && w->ntiles == ky &&
                         (!b || (b->grid.splits[0] == ky && b->ntiles == ky)));
    if (ky > 1 && !wcut)
        return tsl_error(ctx, TSL_ERR_SHAPE,
                         "%s: %s is cut into %d channel tiles; w and b must be cut into as many "
                         "along their filters (w's %s dimension)",
                         fn, what, (int)ky, transposed ? "second" : "first");
    for (int d = 2; d < x->shape.ndim; d++) {
        if (x->grid.splits[d] != y->grid.splits[d])
            return tsl_error(ctx, TSL_ERR_SHAPE,
                             "%s: x and %s need the same spatial tile grid (output tile i reads "
                             "input tile i and halos from its neighbours)",
                             fn, what);
    }
    if (y->layout != x->layout || w->layout != TSL_LAYOUT_PLAIN)
        return tsl_error(ctx, TSL_ERR_SHAPE,
                         "%s: x and %s need the same layout (plain or channels-last) and w must "
                         "be plain",
                         fn, what);
    if (x->grid.splits[0] != y->grid.splits[0] || (!wcut && !tsl_tensor_whole(w)))
        return tsl_error(ctx, TSL_ERR_SHAPE,
                         "%s: x and %s need the same sample tiles, and w must be one tile (or a "
                         "model's sharded weight)",
                         fn, what);
    if (b && (b->shape.ndim != 1 || b->shape.dims[0] != want.dims[1] || (!wcut && b->ntiles != 1)))
        return tsl_error(ctx, TSL_ERR_SHAPE, "%s: the bias must be one tile of %lld values", fn,
                         (long long)want.dims[1]);
    memset(args, 0, sizeof *args);
    args->spatial = p->spatial;
    args->has_bias = b != NULL;
    args->transposed = transposed;
    args->channels_last = x->layout == TSL_LAYOUT_CHANNELS_LAST;
    args->in_channels = xs->dims[1];
    args->out_channels = want.dims[1];
    args->groups = p->groups;
    args->pad_mode = p->padding_mode;
    if (p->padding_mode != TSL_PADDING_ZEROS && transposed)
        return tsl_error(ctx, TSL_ERR_INVALID_ARG,
                         "%s: transposed convolutions pad with zeros only", fn);
    for (int d = 0; d < p->spatial; d++) {
        args->in_size[d] = x->shape.dims[2 + d];
        args->out_size[d] = want.dims[2 + d];
        args->kernel[d] = w->shape.dims[2 + d];
        args->stride[d] = p->stride[d];
        args->padding[d] = p->padding[d];
        args->dilation[d] = p->dilation[d];
    }
    return TSL_OK;
}

/* Check a convolution over the channel concatenation of xs[0..n) (one input when n is 1) and
 * fill each part's arguments: its run of the weights' input channels, the bias and a
 * written y for the first, the others adding to y. */
static tsl_status check_parts(const tsl_conv_params *p, int transposed, int32_t n,
                              const tsl_tensor_t *xs, tsl_tensor_t w, tsl_tensor_t b,
                              tsl_tensor_t y, const char *what, const char *fn, tsl_conv_args *args)
{
    if (n < 1 || n > TSL_CONV_MAX_INPUTS || !xs)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "%s: %d inputs (want 1 to %d)", fn, (int)n,
                         TSL_CONV_MAX_INPUTS);
    tsl_status st = tsl_tensor_check(xs[0], fn);
    if (st)
        return st;
    tsl_shape whole = xs[0]->shape;
    for (int32_t k = 1; k < n; k++) {
        if ((st = tsl_tensor_check(xs[k], fn)))
            return st;
        tsl_tensor_t x = xs[k];
        int same = x->ctx == xs[0]->ctx && x->shape.ndim == whole.ndim &&
                   x->layout == xs[0]->layout && x->dtype == xs[0]->dtype;
        for (int d = 0; same && d < whole.ndim; d++)
            same = (d == 1 || x->shape.dims[d] == whole.dims[d]) &&
                   x->grid.splits[d] == xs[0]->grid.splits[d];
        if (!same)
            return tsl_error(xs[0]->ctx, TSL_ERR_SHAPE,
                             "%s: input %d differs from input 0 in context, type, layout, a "
                             "dimension other than channels, or its tile grid",
                             fn, (int)k);
        whole.dims[1] += x->shape.dims[1];
    }
    if (n > 1 && (transposed || p->groups != 1))
        return tsl_error(xs[0]->ctx, TSL_ERR_INVALID_ARG,
                         "%s: a convolution over concatenated inputs takes one group and no "
                         "transposition",
                         fn);
    if ((st = check(p, transposed, xs[0], &whole, w, b, y, what, fn, &args[0])))
        return st;
    for (int32_t k = 0, at = 0; k < n; at += (int32_t)xs[k]->shape.dims[1], k++) {
        args[k] = args[0];
        if (n == 1)
            break;
        args[k].in_channels = xs[k]->shape.dims[1];
        args[k].w_in_channels = whole.dims[1];
        args[k].w_in_offset = at;
        args[k].has_bias = k == 0 && b;
        args[k].accumulate = k > 0;
    }
    return TSL_OK;
}

static double conv_flops(const tsl_conv_args *a)
{
    double f =
        2.0 * (double)a->samples * (double)a->out_channels * (double)(a->in_channels / a->groups);
    for (int d = 0; d < a->spatial; d++) /* each small-side position meets each tap */
        f *= (double)((a->transposed ? a->in_size[d] : a->out_size[d]) * a->kernel[d]);
    return f;
}

static int64_t tile_samples(tsl_tensor_t x, int64_t tile)
{
    int64_t start[TSL_MAX_DIMS], extent[TSL_MAX_DIMS];
    tsl_tensor_tile_box(x, tile, start, extent);
    return extent[0];
}

/* Codelet arguments of a sample tile: whole samples, no window (oneDNN pads). */
static tsl_conv_task_args task_args(const tsl_conv_args *a, int64_t samples)
{
    tsl_conv_task_args t;
    memset(&t, 0, sizeof t);
    t.conv = *a;
    t.conv.samples = samples;
    return t;
}

/* Forward arguments of sample tile `tile`: the shared ones with this tile's sample count. */
static double conv_tile_args(int64_t tile, void *args, void *user)
{
    tsl_conv_task_args *t = args;
    t->conv.samples = tile_samples(user, tile);
    return conv_flops(&t->conv);
}

/* Whether every task runs on a window: x is cut along a spatial dimension, or the padding
 * is not zeros (the window holds it). */
static int spatially_tiled(const tsl_conv_args *a, tsl_tensor_t x)
{
    if (a->pad_mode != TSL_PADDING_ZEROS)
        return 1;
    for (int d = 2; d < x->shape.ndim; d++)
        if (x->grid.splits[d] > 1)
            return 1;
    return 0;
}

/* floor(a / b) for b > 0. */
static int64_t floor_div(int64_t a, int64_t b)
{
    return a >= 0 ? a / b : -((-a + b - 1) / b);
}

/* Codelet arguments of output tile `tile` of y on a window of x: the input positions its
 * outputs reach (from out_lo * stride - padding, zeros outside the input), its own input
 * tile, and the halo slabs of the other tiles (their indices into `src`). */
static tsl_status window_args_of(const tsl_conv_args *a, tsl_tensor_t x, int64_t xtile,
                                 tsl_tensor_t y, int64_t tile, tsl_conv_task_args *t, int64_t *src)
{
    memset(t, 0, sizeof *t);
    t->conv = *a;
    t->windowed = 1;
    int64_t ys[TSL_MAX_DIMS], ye[TSL_MAX_DIMS];
    tsl_tensor_tile_box(y, tile, ys, ye);
    t->conv.samples = ye[0];
    tsl_conv_window *w = &t->window;
    tsl_halo_window_reset(w);
    w->pad_mode = a->pad_mode;
    for (int d = 0; d < a->spatial; d++) {
        int64_t s = a->stride[d], p = a->padding[d], reach = (a->kernel[d] - 1) * a->dilation[d];
        int64_t olo = ys[2 + d], ohi = olo + ye[2 + d], lo, hi, pad = 0;
        if (!a->transposed) { /* outputs [olo, ohi) read inputs from olo * s - p */
            lo = olo * s - p;
            hi = (ohi - 1) * s - p + reach + 1;
        } else {
            /* Input i reaches outputs i * s - p + [0, reach]. The window holds every input
             * that reaches the tile and is wide enough that its full output, which starts at
             * lo * s - p, covers the tile; `pad` crops its front. */
            lo = floor_div(olo + p - reach + s - 1, s);
            if (floor_div(olo + p, s) < lo)
                lo = floor_div(olo + p, s);
            hi = floor_div(ohi - 1 + p, s);
            if (floor_div(ohi - 1 + p - reach + s - 1, s) > hi)
                hi = floor_div(ohi - 1 + p - reach + s - 1, s);
            hi += 1;
            pad = olo + p - lo * s;
        }
        w->global[d] = a->in_size[d];
        w->window.lo[d] = lo;
        w->window.size[d] = hi - lo;
        t->conv.in_size[d] = hi - lo;
        t->conv.out_size[d] = ye[2 + d];
        t->conv.padding[d] = pad;
    }
    return tsl_halo_slabs(x, xtile, a->spatial, &w->window, &w->tile, &w->nslabs, src, w->slab,
                          a->pad_mode == TSL_PADDING_CIRCULAR ? w->slab_shift : NULL,
                          TSL_CONV_MAX_SLABS);
}

/* The window of output tile `tile` on input tile `tile` (the same grid). */
static tsl_status window_args(const tsl_conv_args *a, tsl_tensor_t x, tsl_tensor_t y, int64_t tile,
                              tsl_conv_task_args *t, int64_t *src)
{
    return window_args_of(a, x, tile, y, tile, t, src);
}

/* Plan every output tile's window before submitting anything: a window that reaches too
 * many tiles is an error with no task submitted. */
static tsl_status check_windows(const tsl_conv_args *a, tsl_tensor_t x, tsl_tensor_t y)
{
    tsl_status st = TSL_OK;
    for (int64_t i = 0; i < y->ntiles && !st; i++) {
        tsl_conv_task_args t;
        int64_t src[TSL_CONV_MAX_SLABS];
        st = window_args(a, x, y, i, &t, src);
    }
    return st;
}

/* One forward task of output tile i on window t (its slabs' handles `slabs`), writing y's
 * tile with `mode`. */
static tsl_status submit_window_forward(tsl_tensor_t x, tsl_tensor_t w, tsl_tensor_t b,
                                        tsl_tensor_t y, int64_t i, const tsl_conv_task_args *t,
                                        const starpu_data_handle_t *slabs,
                                        enum starpu_data_access_mode mode)
{
    int32_t n = 0;
    tsl_task_desc desc = {.codelet = &tsl_cl_conv_forward,
                          .args = t,
                          .args_size = sizeof *t,
                          .flops = conv_flops(&t->conv)};
    desc.handles[n] = x->handles[i];
    desc.modes[n++] = STARPU_R;
    for (int32_t k = 0; k < t->window.nslabs; k++) {
        desc.handles[n] = slabs[k];
        desc.modes[n++] = STARPU_R;
    }
    desc.handles[n] = tsl_whole_handle(w, y->tile_owner[i]);
    desc.modes[n++] = STARPU_R;
    if (b) {
        desc.handles[n] = tsl_whole_handle(b, y->tile_owner[i]);
        desc.modes[n++] = STARPU_R;
    }
    desc.handles[n] = y->handles[i];
    desc.modes[n++] = mode;
    desc.nhandles = n;
    return tsl_task_submit(x->ctx, &desc);
}

/* The outputs of tile i (box `out`, global) whose inputs lie in the tile's own input box or
 * in the zero padding, so they need no halo slab: per dimension the run of outputs o with
 * [o s - p, o s - p + reach] inside the input tile once clipped to the input (reflect and
 * replicate padding take their values from that clipped range, 2 p <= reach; circular
 * padding's from the other end: outputs that read it are not interior). 0 when empty in
 * some dimension. (Convolutions only: a transposed convolution's windows are not monotone
 * runs like these.) */
static int interior_box(const tsl_conv_args *a, const tsl_conv_window *w, const tsl_conv_box *out,
                        tsl_conv_box *in)
{
    for (int d = 0; d < a->spatial; d++) {
        int64_t s = a->stride[d], p = a->padding[d], reach = (a->kernel[d] - 1) * a->dilation[d];
        int64_t tlo = w->tile.lo[d], thi = tlo + w->tile.size[d], g = w->global[d];
        int64_t first = -1, last = -1;
        for (int64_t o = out->lo[d]; o < out->lo[d] + out->size[d]; o++) {
            int64_t lo = o * s - p, hi = lo + reach;
            if (a->pad_mode == TSL_PADDING_CIRCULAR && (lo < 0 || hi > g - 1))
                continue;
            lo = lo < 0 ? 0 : lo;
            hi = hi > g - 1 ? g - 1 : hi;
            if (lo > hi || (lo >= tlo && hi < thi)) {
                first = first < 0 ? o : first;
                last = o;
            }
        }
        if (first < 0)
            return 0;
        in->lo[d] = first;
        in->size[d] = last - first + 1;
    }
    for (int d = a->spatial; d < 3; d++) {
        in->lo[d] = 0;
        in->size[d] = 1;
    }
    return 1;
}

/* Window arguments of the outputs `box` (global) of tile i, a part of the tile's window
 * `whole` (a: the convolution's own arguments, whole's run unpadded): the inputs those
 * outputs read, with the tile and those of whole's slabs that meet them (their indices into
 * whole's slabs in `pick`). */
static void part_args(const tsl_conv_args *a, const tsl_conv_task_args *whole,
                      const tsl_conv_box *tile_out, const tsl_conv_box *box, tsl_conv_task_args *t,
                      int32_t *pick)
{
    *t = *whole;
    t->part = 1;
    tsl_conv_window *w = &t->window;
    for (int d = 0; d < a->spatial; d++) {
        int64_t s = a->stride[d], p = a->padding[d], reach = (a->kernel[d] - 1) * a->dilation[d];
        w->window.lo[d] = box->lo[d] * s - p;
        w->window.size[d] = (box->size[d] - 1) * s + reach + 1;
        t->conv.in_size[d] = w->window.size[d];
        t->conv.out_size[d] = box->size[d];
        t->out_offset[d] = box->lo[d] - tile_out->lo[d];
        t->out_tile[d] = tile_out->size[d];
    }
    w->nslabs = 0;
    for (int32_t k = 0; k < whole->window.nslabs; k++) {
        int meets = 1;
        for (int d = 0; d < a->spatial; d++) { /* where the slab sits in the window */
            int64_t lo = whole->window.slab[k].lo[d] + whole->window.slab_shift[k][d],
                    hi = lo + whole->window.slab[k].size[d];
            meets &= lo < w->window.lo[d] + w->window.size[d] && w->window.lo[d] < hi;
        }
        if (meets) {
            pick[w->nslabs] = k;
            memcpy(w->slab_shift[w->nslabs], whole->window.slab_shift[k], sizeof w->slab_shift[k]);
            w->slab[w->nslabs++] = whole->window.slab[k];
        }
    }
}

/* Output tile i's forward as parts when a halo slab comes from another rank and the outputs
 * that need no slab are at least a quarter of the tile: the interior part first (it waits
 * only for the input tile), then the border boxes around it, each reading only the slabs its
 * window meets. Returns 1 (and *st) when it submitted the parts, 0 to submit one task. */
static int forward_split(const tsl_conv_args *a, tsl_tensor_t x, tsl_tensor_t w, tsl_tensor_t b,
                         tsl_tensor_t y, int64_t i, const tsl_conv_task_args *whole,
                         const int64_t *src, const starpu_data_handle_t *slabs, tsl_status *st)
{
    int remote = 0;
    for (int32_t k = 0; k < whole->window.nslabs; k++)
        remote |= x->tile_owner[src[k]] != y->tile_owner[i];
    int64_t ys[TSL_MAX_DIMS], ye[TSL_MAX_DIMS];
    tsl_tensor_tile_box(y, i, ys, ye);
    tsl_conv_box out = {{0, 0, 0}, {1, 1, 1}}, in;
    for (int d = 0; d < a->spatial; d++) {
        out.lo[d] = ys[2 + d];
        out.size[d] = ye[2 + d];
    }
    if (a->transposed || !remote || !interior_box(a, &whole->window, &out, &in))
        return 0;
    int64_t vin = 1, vout = 1;
    for (int d = 0; d < a->spatial; d++) {
        vin *= in.size[d];
        vout *= out.size[d];
    }
    if (4 * vin < vout || vin == vout)
        return 0;
    /* The interior, then per dimension the boxes below and above it in that dimension (over
     * the interior's range in the dimensions before, the whole tile's after). */
    tsl_conv_box parts[1 + 2 * 3], cur = out;
    int32_t nparts = 0;
    parts[nparts++] = in;
    for (int d = 0; d < a->spatial; d++) {
        int64_t ilo = in.lo[d], ihi = in.lo[d] + in.size[d], chi = cur.lo[d] + cur.size[d];
        if (ilo > cur.lo[d]) {
            parts[nparts] = cur;
            parts[nparts++].size[d] = ilo - cur.lo[d];
        }
        if (ihi < chi) {
            parts[nparts] = cur;
            parts[nparts].lo[d] = ihi;
            parts[nparts++].size[d] = chi - ihi;
        }
        cur.lo[d] = ilo;
        cur.size[d] = in.size[d];
    }
    *st = TSL_OK;
    for (int32_t n = 0; n < nparts && !*st; n++) {
        tsl_conv_task_args t;
        int32_t pick[TSL_CONV_MAX_SLABS];
        starpu_data_handle_t used[TSL_CONV_MAX_SLABS];
        part_args(a, whole, &out, &parts[n], &t, pick);
        for (int32_t k = 0; k < t.window.nslabs; k++)
            used[k] = slabs[pick[k]];
        *st = submit_window_forward(x, w, b, y, i, &t, used,
                                    n == 0 && !a->accumulate ? STARPU_W : STARPU_RW);
    }
    return 1;
}

/* Forward on spatial tiles: per output tile, pack its halo, then one task reading the input
 * tile and the slabs (or the interior and border parts: forward_split). */
static tsl_status forward_windowed(const tsl_conv_args *a, tsl_tensor_t x, tsl_tensor_t w,
                                   tsl_tensor_t b, tsl_tensor_t y, tsl_halo_keep *keep)
{
    struct tsl_context *ctx = x->ctx;
    tsl_status st = TSL_OK;
    tsl_halo_keep_release(ctx, keep);
    if (keep) {
        keep->nslabs = calloc((size_t)y->ntiles, sizeof *keep->nslabs);
        keep->slabs = calloc((size_t)y->ntiles * TSL_CONV_MAX_SLABS, sizeof *keep->slabs);
        if (!keep->nslabs || !keep->slabs) {
            tsl_halo_keep_release(ctx, keep);
            keep = NULL; /* keep nothing; the backward cuts its own slabs */
        } else {
            keep->x = x;
            keep->ntiles = y->ntiles;
        }
    }
    for (int64_t i = 0; i < y->ntiles && !st; i++) {
        tsl_conv_task_args t;
        int64_t src[TSL_CONV_MAX_SLABS];
        starpu_data_handle_t slabs[TSL_CONV_MAX_SLABS] = {0};
        if ((st = window_args(a, x, y, i, &t, src)) ||
            (st = tsl_halo_pack_window(x, a->spatial, &t.window, src, slabs))) {
            tsl_halo_release(ctx, slabs, TSL_CONV_MAX_SLABS);
            break;
        }
        int32_t ns = t.window.nslabs;
        if (!forward_split(a, x, w, b, y, i, &t, src, slabs, &st))
            st = submit_window_forward(x, w, b, y, i, &t, slabs,
                                       a->accumulate ? STARPU_RW : STARPU_W);
        if (keep && !st) { /* the weight gradient reads them again */
            keep->nslabs[i] = ns;
            memcpy(keep->slabs + i * TSL_CONV_MAX_SLABS, slabs, (size_t)ns * sizeof *slabs);
        } else {
            tsl_halo_release(ctx, slabs, ns);
        }
        if (x->tile_owner[i] != y->tile_owner[i])
            tsl_cache_flush(ctx, x->handles[i]);
    }
    tsl_whole_flush(w);
    if (b)
        tsl_whole_flush(b);
    return st;
}

/* Backward data on spatial tiles: per output tile, one task writes its input tile's part of
 * the window gradient and one slab per neighbour part; then each input tile adds the slabs
 * aimed at it, in tile order (deterministic). */
static tsl_status backward_data_windowed(const tsl_conv_args *a, tsl_tensor_t x, tsl_tensor_t w,
                                         tsl_tensor_t dy, tsl_tensor_t dx)
{
    struct tsl_context *ctx = x->ctx;
    tsl_halo_returns r;
    tsl_status st = tsl_halo_returns_init(&r, ctx, dy->ntiles);
    if (st)
        return st;
    for (int64_t i = 0; i < dy->ntiles && !st; i++) {
        tsl_conv_task_args t;
        int64_t src[TSL_CONV_MAX_SLABS];
        if ((st = window_args(a, x, dy, i, &t, src)) ||
            (st = tsl_halo_returns_add(&r, dx, i, a->spatial, &t.window, src, dx->tile_owner[i])))
            break;
        int32_t n = 0;
        tsl_task_desc desc = {.codelet = &tsl_cl_conv_backward_data,
                              .args = &t,
                              .args_size = sizeof t,
                              .flops = conv_flops(&t.conv)};
        desc.handles[n] = dy->handles[i];
        desc.modes[n++] = STARPU_R;
        desc.handles[n] = tsl_whole_handle(w, dx->tile_owner[i]);
        desc.modes[n++] = STARPU_R;
        desc.handles[n] = dx->handles[i];
        desc.modes[n++] = STARPU_W;
        for (int32_t k = 0; k < t.window.nslabs; k++) {
            desc.handles[n] = r.slabs[i * TSL_CONV_MAX_SLABS + k];
            desc.modes[n++] = STARPU_W;
        }
        desc.nhandles = n;
        st = tsl_task_submit(ctx, &desc);
    }
    tsl_whole_flush(w);
    tsl_status fin = tsl_halo_returns_finish(&r, dx, !st);
    return st ? st : fin;
}

/* A window pass's first reads: the input tile, then its ns halo slabs; the handles so far. */
static int32_t window_reads(tsl_task_desc *desc, starpu_data_handle_t x,
                            const starpu_data_handle_t *slabs, int32_t ns)
{
    int32_t nh = 0;
    desc->handles[nh] = x;
    desc->modes[nh++] = STARPU_R;
    for (int32_t q = 0; q < ns; q++) {
        desc->handles[nh] = slabs[q];
        desc->modes[nh++] = STARPU_R;
    }
    return nh;
}

/* ---- channel tiles (filters= plans): no spatial cut ----
 * Output tile (n, g) is the sum over every input part and its channel tiles k of the
 * convolution of x tile (n, k) with its run of input channels of w's tile g (its filters), the
 * first writing, the others adding (the forward codelet's accumulate). The weight gradient of
 * dy tile (n, g) is one partial of w's tile g, each input tile writing its run of columns; the
 * partials of a g are summed onto w's tile g. The input gradient of x tile (n, k) sums the
 * contributions of every output channel tile by a tree rooted where the tile lives. */

/* The most channel tiles of a convolution's output. */
#define CHANNEL_TILES_MAX 1024

/* Whether x (any part) or y is cut along channels. */
static int channel_cut(int32_t n, const tsl_tensor_t *xs, tsl_tensor_t y)
{
    int cut = y->grid.splits[1] > 1;
    for (int32_t k = 0; k < n; k++)
        cut |= xs[k]->grid.splits[1] > 1;
    return cut;
}

/* The tile of t at grid coordinates c (row-major). */
static int64_t tile_at(tsl_tensor_t t, const int32_t *c)
{
    int64_t i = 0;
    for (int d = 0; d < t->shape.ndim; d++)
        i = i * t->grid.splits[d] + c[d];
    return i;
}

static void coords_of(tsl_tensor_t t, int64_t tile, int32_t *c)
{
    for (int d = t->shape.ndim - 1; d >= 0; d--) {
        c[d] = (int32_t)(tile % t->grid.splits[d]);
        tile /= t->grid.splits[d];
    }
}

/* The task arguments of the pass of x tile xt (input part args a) to y tile yt: the channels'
 * runs, and when x is cut in space the window of the output tile on input tile xt, with the
 * tiles its halo slabs come from in src. */
static tsl_status channel_pass(const tsl_conv_args *a, tsl_tensor_t w, tsl_tensor_t x, int64_t xt,
                               tsl_tensor_t y, int64_t yt, tsl_conv_task_args *t, int64_t *src)
{
    int64_t xs0[TSL_MAX_DIMS], xe[TSL_MAX_DIMS], ys0[TSL_MAX_DIMS], ye[TSL_MAX_DIMS];
    tsl_tensor_tile_box(x, xt, xs0, xe);
    tsl_tensor_tile_box(y, yt, ys0, ye);
    tsl_conv_args c = *a;
    c.in_channels = xe[1];
    c.w_in_channels = weight_inputs(w, a->transposed);
    c.w_in_offset = a->w_in_offset + xs0[1];
    c.out_channels = ye[1];
    c.accumulate = 0;
    if (spatially_tiled(&c, x))
        return window_args_of(&c, x, xt, y, yt, t, src);
    *t = task_args(&c, ye[0]);
    return TSL_OK;
}

/* w's handle (tile g when cut by filters, else the whole on `rank`). */
static starpu_data_handle_t filters_of(tsl_tensor_t w, int32_t ky, int32_t g, int32_t rank)
{
    return ky > 1 ? w->handles[g] : tsl_whole_handle(w, rank);
}

/* Every pass's window planned before any task: one that reaches too many tiles is an error
 * with nothing submitted. */
static tsl_status channel_windows(const tsl_conv_args *a, int32_t n, const tsl_tensor_t *xs,
                                  tsl_tensor_t w, tsl_tensor_t y)
{
    tsl_status st = TSL_OK;
    for (int64_t i = 0; i < y->ntiles && !st; i++) {
        int32_t c[TSL_MAX_DIMS];
        coords_of(y, i, c);
        for (int32_t p = 0; p < n && !st && spatially_tiled(&a[p], xs[p]); p++)
            for (int32_t k = 0; k < xs[p]->grid.splits[1] && !st; k++) {
                c[1] = k;
                tsl_conv_task_args t;
                int64_t src[TSL_CONV_MAX_SLABS];
                st = channel_pass(&a[p], w, xs[p], tile_at(xs[p], c), y, i, &t, src);
            }
    }
    return st;
}

static tsl_status forward_channels(const tsl_conv_args *a, int32_t n, const tsl_tensor_t *xs,
                                   tsl_tensor_t w, tsl_tensor_t b, tsl_tensor_t y)
{
    struct tsl_context *ctx = y->ctx;
    tsl_status st = channel_windows(a, n, xs, w, y);
    int32_t ky = y->grid.splits[1];
    for (int64_t i = 0; i < y->ntiles && !st; i++) {
        int32_t c[TSL_MAX_DIMS], g, first = 1, owner = y->tile_owner[i];
        coords_of(y, i, c);
        g = c[1];
        for (int32_t p = 0; p < n && !st; p++)
            for (int32_t k = 0; k < xs[p]->grid.splits[1] && !st; k++, first = 0) {
                c[1] = k;
                int64_t j = tile_at(xs[p], c), src[TSL_CONV_MAX_SLABS];
                starpu_data_handle_t slabs[TSL_CONV_MAX_SLABS] = {0};
                tsl_conv_task_args t;
                if ((st = channel_pass(&a[p], w, xs[p], j, y, i, &t, src)) ||
                    (t.windowed &&
                     (st = tsl_halo_pack_window(xs[p], a[p].spatial, &t.window, src, slabs))))
                    break;
                int32_t ns = t.windowed ? t.window.nslabs : 0, nh = 0;
                t.conv.has_bias = first && b;
                t.conv.accumulate = !first;
                tsl_task_desc desc = {.codelet = &tsl_cl_conv_forward,
                                      .args = &t,
                                      .args_size = sizeof t,
                                      .flops = conv_flops(&t.conv)};
                nh = window_reads(&desc, xs[p]->handles[j], slabs, ns);
                desc.handles[nh] = filters_of(w, ky, g, owner);
                desc.modes[nh++] = STARPU_R;
                if (t.conv.has_bias) {
                    desc.handles[nh] = filters_of(b, ky, g, owner);
                    desc.modes[nh++] = STARPU_R;
                }
                desc.handles[nh] = y->handles[i];
                desc.modes[nh++] = first ? STARPU_W : STARPU_RW;
                desc.nhandles = nh;
                st = tsl_task_submit(ctx, &desc);
                tsl_halo_release(ctx, slabs, ns);
            }
    }
    if (ky == 1) {
        tsl_whole_flush(w);
        if (b)
            tsl_whole_flush(b);
    }
    return st;
}

typedef struct channel_grads {
    int32_t n;
    const tsl_conv_args *args;
    const tsl_tensor_t *xs;
    tsl_tensor_t w, dy;
} channel_grads;

/* The weight-gradient partial of dy tile i: every input tile of its samples (and spatial box)
 * writes its run of columns (the first also db_part). */
static tsl_status channel_partial(int64_t i, starpu_data_handle_t dw_part,
                                  starpu_data_handle_t db_part, void *user)
{
    channel_grads *cg = user;
    struct tsl_context *ctx = cg->dy->ctx;
    tsl_status st = TSL_OK;
    int32_t c[TSL_MAX_DIMS], first = 1;
    coords_of(cg->dy, i, c);
    for (int32_t p = 0; p < cg->n && !st; p++)
        for (int32_t k = 0; k < cg->xs[p]->grid.splits[1] && !st; k++, first = 0) {
            c[1] = k;
            tsl_tensor_t x = cg->xs[p];
            int64_t j = tile_at(x, c), src[TSL_CONV_MAX_SLABS];
            starpu_data_handle_t slabs[TSL_CONV_MAX_SLABS] = {0};
            tsl_conv_task_args t;
            if ((st = channel_pass(&cg->args[p], cg->w, x, j, cg->dy, i, &t, src)) ||
                (t.windowed &&
                 (st = tsl_halo_pack_window(x, cg->args[p].spatial, &t.window, src, slabs))))
                break;
            int32_t ns = t.windowed ? t.window.nslabs : 0, nh = 0;
            t.conv.has_bias = first && db_part != NULL;
            tsl_task_desc desc = {.codelet = &tsl_cl_conv_backward_weights,
                                  .args = &t,
                                  .args_size = sizeof t,
                                  .flops = conv_flops(&t.conv)};
            nh = window_reads(&desc, x->handles[j], slabs, ns);
            desc.handles[nh] = cg->dy->handles[i];
            desc.modes[nh++] = STARPU_R;
            desc.handles[nh] = dw_part;
            desc.modes[nh++] = first ? STARPU_W : STARPU_RW;
            if (t.conv.has_bias) {
                desc.handles[nh] = db_part;
                desc.modes[nh++] = STARPU_W;
            }
            desc.nhandles = nh;
            st = tsl_task_submit(ctx, &desc);
            tsl_halo_release(ctx, slabs, ns);
        }
    return st;
}

static tsl_status part_pass(const tsl_conv_args *a, tsl_tensor_t w, tsl_tensor_t x, int64_t xt,
                            tsl_tensor_t y, int64_t yt, tsl_conv_task_args *t, int64_t *src);

/* dx (input part args a) from every output channel tile of dy: per pair (dy tile i, dx tile j
 * of its samples and box) one task writing its part of dx tile j (into the tile itself for the
 * pair on the tile's owner, else a temporary) and, on windows, the gradient slabs of j's
 * neighbours; then per dx tile a task tree adds its parts, and the slabs are added in tile
 * order. */
static tsl_status backward_data_channels(const tsl_conv_args *a, tsl_tensor_t w, tsl_tensor_t dy,
                                         tsl_tensor_t dx)
{
    struct tsl_context *ctx = dx->ctx;
    int32_t ky = dy->grid.splits[1], kx = dx->grid.splits[1];
    int windowed = spatially_tiled(a, dx), parts = input_parts(w, a->transposed);
    if (ky > CHANNEL_TILES_MAX)
        return tsl_error(ctx, TSL_ERR_SHAPE, "convolution backward: %d channel tiles (at most %d)",
                         (int)ky, CHANNEL_TILES_MAX);
    starpu_data_handle_t *part = calloc((size_t)dx->ntiles * ky, sizeof *part);
    int32_t *owner_of = calloc((size_t)dx->ntiles * ky, sizeof *owner_of);
    int64_t *root = calloc((size_t)dx->ntiles, sizeof *root);
    tsl_halo_returns r;
    memset(&r, 0, sizeof r);
    tsl_status st = part && owner_of && root ? TSL_OK
                                             : tsl_error(ctx, TSL_ERR_OUT_OF_MEMORY,
                                                         "convolution backward: out of memory");
    if (!st && windowed)
        st = tsl_halo_returns_init(&r, ctx, dy->ntiles * kx);
    int returns = !st && windowed;
    for (int64_t j = 0; j < dx->ntiles && !st; j++) { /* the part on each tile's owner */
        int32_t c[TSL_MAX_DIMS];
        coords_of(dx, j, c);
        for (int32_t g = 0; g < ky; g++) {
            c[1] = g;
            owner_of[j * ky + g] = parts ? dx->tile_owner[j] : dy->tile_owner[tile_at(dy, c)];
        }
        root[j] = ky == 1 ? 0 : tsl_first_owned(owner_of + j * ky, ky, dx->tile_owner[j]);
    }
    for (int64_t i = 0; i < dy->ntiles && !st; i++) {
        int32_t c[TSL_MAX_DIMS], g;
        coords_of(dy, i, c);
        g = c[1];
        for (int32_t k = 0; k < kx && !st; k++) {
            c[1] = k;
            int64_t j = tile_at(dx, c), src[TSL_CONV_MAX_SLABS], slot = i * kx + k;
            int32_t owner = parts ? dx->tile_owner[j] : dy->tile_owner[i];
            tsl_conv_task_args t;
            if ((st = (parts ? part_pass : channel_pass)(a, w, dx, j, dy, i, &t, src)))
                break;
            starpu_data_handle_t *to = &part[j * ky + g];
            if (g == root[j])
                *to = dx->handles[j];
            else if ((st = tsl_temp_handle_register(ctx, tsl_tensor_tile_numel(dx, j),
                                                    dx->elem_size, owner, to)))
                break;
            if (t.windowed &&
                (st = tsl_halo_returns_add(&r, dx, slot, a->spatial, &t.window, src, owner)))
                break;
            int32_t nh = 0, ns = t.windowed ? t.window.nslabs : 0;
            tsl_task_desc desc = {.codelet = &tsl_cl_conv_backward_data,
                                  .args = &t,
                                  .args_size = sizeof t,
                                  .flops = conv_flops(&t.conv)};
            desc.handles[nh] = dy->handles[i];
            desc.modes[nh++] = STARPU_R;
            desc.handles[nh] = parts ? w->handles[part_tile(a->transposed, g, k, ky, kx)]
                                     : filters_of(w, ky, g, owner);
            desc.modes[nh++] = STARPU_R;
            desc.handles[nh] = *to;
            desc.modes[nh++] = STARPU_W;
            for (int32_t q = 0; q < ns; q++) {
                desc.handles[nh] = r.slabs[slot * TSL_CONV_MAX_SLABS + q];
                desc.modes[nh++] = STARPU_W;
            }
            desc.nhandles = nh;
            st = tsl_task_submit(ctx, &desc);
        }
    }
    starpu_data_handle_t order[CHANNEL_TILES_MAX];
    for (int64_t j = 0; j < dx->ntiles && !st && ky > 1; j++) {
        tsl_rooted_order(owner_of + j * ky, ky, dx->tile_owner[j], part + j * ky, order);
        st = tsl_tree_sum_into(ctx, order, ky, dx->dtype, tsl_tensor_tile_numel(dx, j),
                               dx->handles[j], TSL_REDUCE_PRIORITY);
        memset(part + j * ky, 0, sizeof *part * (size_t)ky); /* released by the sum */
    }
    for (int64_t q = 0; part && q < dx->ntiles * ky; q++) /* (after an error) */
        if (part[q] && part[q] != dx->handles[q / ky])
            tsl_temp_handle_release(ctx, part[q]);
    tsl_status fin = returns ? tsl_halo_returns_finish(&r, dx, !st) : TSL_OK;
    if (ky == 1 && !parts)
        tsl_whole_flush(w);
    free(part);
    free(owner_of);
    free(root);
    return st ? st : fin;
}

/* ---- input-channel parts (channels= plans) ----
 * w is cut along its input channels as x is (and along its filters as y is): tile (g, k) holds
 * the filters of y's channel tile g over x's channel tile k, and lives with x's channel group k.
 * The pass of y tile (n, g) over x tile (n, k) runs where that x tile lives and writes a partial
 * output there (into the y tile itself where it lives); a tree rooted at the y tile's owner
 * adds the partials, so partial outputs cross ranks where filters= moves the inputs. The
 * gradient of w's tile (g, k) sums, over the dy tiles of channel tile g, the passes over the x
 * tiles (n, k), each made where its x tile lives; the input gradient of x tile (n, k) sums over
 * g the passes with w's tile (g, k), all where the tile lives (dy crosses ranks). */

/* The pass of x tile xt to y tile yt with w's tile of exactly x tile xt's channels. */
static tsl_status part_pass(const tsl_conv_args *a, tsl_tensor_t w, tsl_tensor_t x, int64_t xt,
                            tsl_tensor_t y, int64_t yt, tsl_conv_task_args *t, int64_t *src)
{
    tsl_status st = channel_pass(a, w, x, xt, y, yt, t, src);
    t->conv.w_in_channels = t->conv.w_in_offset = 0;
    return st;
}

static tsl_status forward_parts(const tsl_conv_args *a, tsl_tensor_t x, tsl_tensor_t w,
                                tsl_tensor_t b, tsl_tensor_t y)
{
    struct tsl_context *ctx = y->ctx;
    int32_t kx = x->grid.splits[1];
    if (kx > CHANNEL_TILES_MAX)
        return tsl_error(ctx, TSL_ERR_SHAPE, "convolution: %d channel tiles (at most %d)", (int)kx,
                         CHANNEL_TILES_MAX);
    tsl_status st = channel_windows(a, 1, &x, w, y);
    starpu_data_handle_t part[CHANNEL_TILES_MAX], order[CHANNEL_TILES_MAX];
    int32_t owner_of[CHANNEL_TILES_MAX];
    for (int64_t i = 0; i < y->ntiles && !st; i++) {
        int32_t c[TSL_MAX_DIMS], g;
        coords_of(y, i, c);
        g = c[1];
        for (int32_t k = 0; k < kx; k++) {
            c[1] = k;
            owner_of[k] = x->tile_owner[tile_at(x, c)];
            part[k] = NULL;
        }
        int64_t root = tsl_first_owned(owner_of, kx, y->tile_owner[i]);
        for (int32_t k = 0; k < kx && !st; k++) {
            c[1] = k;
            int64_t j = tile_at(x, c), src[TSL_CONV_MAX_SLABS];
            starpu_data_handle_t slabs[TSL_CONV_MAX_SLABS] = {0};
            tsl_conv_task_args t;
            if ((st = part_pass(a, w, x, j, y, i, &t, src)))
                break;
            if (k == root)
                part[k] = y->handles[i];
            else if ((st = tsl_temp_handle_register(ctx, tsl_tensor_tile_numel(y, i), y->elem_size,
                                                    owner_of[k], &part[k])))
                break;
            if (t.windowed && (st = tsl_halo_pack_window(x, a->spatial, &t.window, src, slabs)))
                break;
            int32_t ns = t.windowed ? t.window.nslabs : 0, nh = 0;
            t.conv.has_bias = k == 0 && b;
            t.conv.accumulate = 0;
            tsl_task_desc desc = {.codelet = &tsl_cl_conv_forward,
                                  .args = &t,
                                  .args_size = sizeof t,
                                  .flops = conv_flops(&t.conv)};
            nh = window_reads(&desc, x->handles[j], slabs, ns);
            desc.handles[nh] = w->handles[part_tile(a->transposed, g, k, y->grid.splits[1], kx)];
            desc.modes[nh++] = STARPU_R;
            if (t.conv.has_bias) {
                desc.handles[nh] = b->handles[b->ntiles > 1 ? g : 0];
                desc.modes[nh++] = STARPU_R;
            }
            desc.handles[nh] = part[k];
            desc.modes[nh++] = STARPU_W;
            desc.nhandles = nh;
            st = tsl_task_submit(ctx, &desc);
            tsl_halo_release(ctx, slabs, ns);
        }
        if (!st) {
            tsl_rooted_order(owner_of, kx, y->tile_owner[i], part, order);
            st = tsl_tree_sum_into(ctx, order, kx, y->dtype, tsl_tensor_tile_numel(y, i),
                                   y->handles[i], TSL_REDUCE_PRIORITY);
        } else {
            for (int32_t k = 0; k < kx; k++)
                if (part[k] && part[k] != y->handles[i])
                    tsl_temp_handle_release(ctx, part[k]);
        }
    }
    return st;
}

/* Sum partials[0..n) (owned by owner_of) onto tile `tile` of grad: the first one on the tile's
 * owner is the tile itself. Releases the temporaries. */
static tsl_status sum_onto_tile(struct tsl_context *ctx, tsl_tensor_t grad, int64_t tile, int64_t n,
                                const int32_t *owner_of, starpu_data_handle_t *partials,
                                starpu_data_handle_t *order)
{
    if (!n)
        return TSL_OK;
    tsl_rooted_order(owner_of, n, grad->tile_owner[tile], partials, order);
    return tsl_tree_sum_into(ctx, order, n, grad->dtype, tsl_tensor_tile_numel(grad, tile),
                             grad->handles[tile], TSL_REDUCE_PRIORITY);
}

/* dw (cut as w: ky x kx tiles) and db (ky tiles, or one) from x and dy: one pass per (dy tile,
 * x channel tile) where the x tile lives, the first of each dy tile also making its db part. */
static tsl_status weight_grads_parts(const tsl_conv_args *a, tsl_tensor_t x, tsl_tensor_t dy,
                                     tsl_tensor_t dw, tsl_tensor_t db)
{
    struct tsl_context *ctx = x->ctx;
    int32_t ky = dy->grid.splits[1], kx = x->grid.splits[1];
    int64_t n = dy->ntiles, nw = dw->ntiles;
    if (ctx->tag_count - ctx->tags_used < (int64_t)n * (kx + 1))
        return tsl_error(ctx, TSL_ERR_RESOURCE, "parameter gradients: StarPU-MPI tags exhausted");
    starpu_data_handle_t *pw = calloc((size_t)(n * kx), sizeof *pw),
                         *pb = calloc((size_t)n, sizeof *pb),
                         *mine = calloc((size_t)(n * kx), sizeof *mine),
                         *order = calloc((size_t)(n * kx), sizeof *order);
    /* per slot i * kx + k (dy tile i, x channel tile k): its partial and its owner; per dy
     * tile: its channel tile and where its db part is made (with x's channel tile 0) */
    int32_t *ow = calloc((size_t)(n * kx), sizeof *ow), *ob = calloc((size_t)n, sizeof *ob),
            *owners = calloc((size_t)(n * kx), sizeof *owners), *gof = calloc((size_t)n, 4);
    uint8_t *rooted = calloc((size_t)nw + (size_t)ky + (size_t)n, 1);
    tsl_status st =
        pw && pb && mine && order && ow && ob && owners && gof && rooted
            ? TSL_OK
            : tsl_error(ctx, TSL_ERR_OUT_OF_MEMORY, "parameter gradients: out of memory");
    uint8_t *brooted = rooted ? rooted + nw : NULL, *btile = rooted ? rooted + nw + ky : NULL;
    int whole_b = db && db->ntiles == 1;
    int64_t broot = -1;
    for (int64_t i = 0; !st && i < n; i++) {
        int32_t c[TSL_MAX_DIMS];
        coords_of(dy, i, c);
        gof[i] = c[1];
        c[1] = 0;
        ob[i] = x->tile_owner[tile_at(x, c)];
    }
    if (!st && whole_b)
        broot = tsl_grad_root(db, ob, n);
    const int saved = tsl_param_grads_begin(ctx);
    for (int64_t i = 0; i < n && !st; i++) {
        int32_t c[TSL_MAX_DIMS], g = gof[i];
        coords_of(dy, i, c);
        for (int32_t k = 0; k < kx && !st; k++) {
            c[1] = k;
            int64_t j = tile_at(x, c), q = part_tile(a->transposed, g, k, ky, kx),
                    slot = i * kx + k, src[TSL_CONV_MAX_SLABS];
            int32_t owner = x->tile_owner[j];
            ow[slot] = owner;
            starpu_data_handle_t slabs[TSL_CONV_MAX_SLABS] = {0};
            tsl_conv_task_args t;
            if ((st = part_pass(a, dw, x, j, dy, i, &t, src)))
                break;
            if (!rooted[q] && owner == dw->tile_owner[q]) {
                rooted[q] = 1;
                pw[slot] = dw->handles[q];
            } else if ((st = tsl_temp_handle_register(ctx, tsl_tensor_tile_numel(dw, q),
                                                      dw->elem_size, owner, &pw[slot]))) {
                break;
            }
            t.conv.has_bias = k == 0 && db;
            if (t.conv.has_bias) {
                int64_t bt = whole_b ? 0 : g;
                if (whole_b ? i == broot : (!brooted[g] && owner == db->tile_owner[g])) {
                    brooted[g] |= !whole_b;
                    btile[i] = 1;
                    pb[i] = db->handles[bt];
                } else if ((st = tsl_temp_handle_register(ctx, tsl_tensor_tile_numel(db, bt),
                                                          db->elem_size, owner, &pb[i]))) {
                    break;
                }
            }
            if (t.windowed && (st = tsl_halo_pack_window(x, a->spatial, &t.window, src, slabs)))
                break;
            int32_t ns = t.windowed ? t.window.nslabs : 0, nh = 0;
            tsl_task_desc desc = {.codelet = &tsl_cl_conv_backward_weights,
                                  .args = &t,
                                  .args_size = sizeof t,
                                  .flops = conv_flops(&t.conv)};
            nh = window_reads(&desc, x->handles[j], slabs, ns);
            desc.handles[nh] = dy->handles[i];
            desc.modes[nh++] = STARPU_R;
            desc.handles[nh] = pw[slot];
            desc.modes[nh++] = STARPU_W;
            if (t.conv.has_bias) {
                desc.handles[nh] = pb[i];
                desc.modes[nh++] = STARPU_W;
            }
            desc.nhandles = nh;
            st = tsl_task_submit(ctx, &desc);
            tsl_halo_release(ctx, slabs, ns);
        }
    }
    tsl_param_grads_end(ctx, saved);
    for (int64_t q = 0; q < nw && !st; q++) { /* each tile's partials, in dy tile order */
        int64_t m = 0, g = a->transposed ? q % ky : q / kx, k = a->transposed ? q / ky : q % kx;
        for (int64_t i = 0, s = k; i < n; i++, s += kx)
            if (gof[i] == g) {
                mine[m] = pw[s];
                owners[m++] = ow[s];
                pw[s] = NULL; /* released by the sum */
            }
        st = sum_onto_tile(ctx, dw, q, m, owners, mine, order);
    }
    if (!st && db && whole_b) {
        st = tsl_grad_sum(db, n, pb, ob);
        memset(pb, 0, sizeof *pb * (size_t)n);
    }
    for (int32_t g = 0; g < ky && !st && db && !whole_b; g++) {
        int64_t m = 0;
        for (int64_t i = 0; i < n; i++)
            if (gof[i] == g) {
                mine[m] = pb[i];
                owners[m++] = ob[i];
                pb[i] = NULL;
            }
        st = sum_onto_tile(ctx, db, g, m, owners, mine, order);
    }
    for (int64_t s = 0; pw && gof && s < n * kx; s++) /* (after an error) */
        if (pw[s] &&
            pw[s] != dw->handles[part_tile(a->transposed, gof[s / kx], (int32_t)(s % kx), ky, kx)])
            tsl_temp_handle_release(ctx, pw[s]);
    for (int64_t i = 0; pb && i < n; i++)
        if (pb[i] && !btile[i])
            tsl_temp_handle_release(ctx, pb[i]);
    free(pw);
    free(pb);
    free(mine);
    free(order);
    free(ow);
    free(ob);
    free(owners);
    free(gof);
    free(rooted);
    return st;
}

/* Forward over the channel concatenation of xs[0..n): one pass per part, each through its
 * run of the weights' input channels, the later ones adding to y. */
static tsl_status forward(const tsl_conv_params *p, int transposed, int32_t n,
                          const tsl_tensor_t *xs, tsl_tensor_t w, tsl_tensor_t b, tsl_tensor_t y,
                          const char *fn, tsl_halo_keep *keeps)
{
    tsl_conv_args a[TSL_CONV_MAX_INPUTS];
    tsl_status st = check_parts(p, transposed, n, xs, w, b, y, "y", fn, a);
    for (int32_t k = 0; k < n && !st; k++)
        if (y == xs[k])
            return tsl_error(y->ctx, TSL_ERR_INVALID_ARG, "%s: y may not overwrite x", fn);
    if (!st && input_parts(w, transposed))
        return forward_parts(&a[0], xs[0], w, b, y);
    if (!st && channel_cut(n, xs, y)) {
        for (int32_t k = 0; k < n; k++)
            if (!a[k].w_in_channels) /* the weights' whole input, of which tiles take runs */
                a[k].w_in_channels = weight_inputs(w, transposed);
        return forward_channels(a, n, xs, w, b, y);
    }
    int windowed = !st && spatially_tiled(&a[0], xs[0]);
    for (int32_t k = 0; windowed && k < n && !st; k++)
        st = check_windows(&a[k], xs[k], y);
    for (int32_t k = 0; k < n && !st; k++) {
        tsl_tensor_t bk = k == 0 ? b : NULL;
        if (windowed) {
            st = forward_windowed(&a[k], xs[k], w, bk, y, keeps ? &keeps[k] : NULL);
        } else {
            tsl_conv_task_args t = task_args(&a[k], 0);
            st = tsl_weighted_forward(&tsl_cl_conv_forward, xs[k], w, bk, y, (int)a[k].accumulate,
                                      &t, sizeof t, conv_tile_args, xs[k]);
        }
    }
    return st;
}

typedef struct conv_grads {
    int32_t n; /* inputs (the parts of a concatenation) */
    tsl_conv_args args[TSL_CONV_MAX_INPUTS];
    tsl_tensor_t x[TSL_CONV_MAX_INPUTS], dy;
    tsl_halo_keep *keep; /* [n]: the forward's slabs of each x, or NULL */
} conv_grads;

/* The weight-gradient task of input k's part for one tile: the first writes dw_part (its run
 * of input channels) and db_part, the others their runs of dw_part. */
static tsl_status part_partial(conv_grads *g, int32_t k, int64_t tile, starpu_data_handle_t dw_part,
                               starpu_data_handle_t db_part)
{
    tsl_tensor_t x = g->x[k];
    struct tsl_context *ctx = x->ctx;
    tsl_conv_task_args a;
    int64_t src[TSL_CONV_MAX_SLABS];
    starpu_data_handle_t slabs[TSL_CONV_MAX_SLABS] = {0};
    tsl_status st = TSL_OK;
    tsl_halo_keep *keep = g->keep ? &g->keep[k] : NULL;
    int kept = keep && keep->x == x && keep->ntiles == g->dy->ntiles;
    if (!spatially_tiled(&g->args[k], x)) {
        a = task_args(&g->args[k], tile_samples(x, tile));
    } else if ((st = window_args(&g->args[k], x, g->dy, tile, &a, src))) {
        return st;
    } else if (kept && keep->nslabs[tile] == a.window.nslabs) { /* the forward's slabs */
        memcpy(slabs, keep->slabs + tile * TSL_CONV_MAX_SLABS,
               (size_t)a.window.nslabs * sizeof *slabs);
        memset(keep->slabs + tile * TSL_CONV_MAX_SLABS, 0, (size_t)a.window.nslabs * sizeof *slabs);
    } else if ((st = tsl_halo_pack_window(x, g->args[k].spatial, &a.window, src, slabs))) {
        return st;
    }
    a.conv.has_bias = k == 0 && db_part != NULL;
    int32_t ns = a.windowed ? a.window.nslabs : 0, n = 0;
    tsl_task_desc desc = {
        .codelet = &tsl_cl_conv_backward_weights,
        .args = &a,
        .args_size = sizeof a,
        .flops = conv_flops(&a.conv),
    };
    desc.handles[n] = x->handles[tile];
    desc.modes[n++] = STARPU_R;
    for (int32_t j = 0; j < ns; j++) {
        desc.handles[n] = slabs[j];
        desc.modes[n++] = STARPU_R;
    }
    desc.handles[n] = g->dy->handles[tile];
    desc.modes[n++] = STARPU_R;
    desc.handles[n] = dw_part;
    desc.modes[n++] = k == 0 ? STARPU_W : STARPU_RW;
    if (a.conv.has_bias) {
        desc.handles[n] = db_part;
        desc.modes[n++] = STARPU_W;
    }
    desc.nhandles = n;
    st = tsl_task_submit(ctx, &desc);
    tsl_halo_release(ctx, slabs, ns);
    if (k > 0 && x->tile_owner[tile] != g->dy->tile_owner[tile]) /* (the first: by the caller) */
        tsl_cache_flush(ctx, x->handles[tile]);
    return st;
}

static tsl_status conv_partial(int64_t tile, starpu_data_handle_t dw_part,
                               starpu_data_handle_t db_part, void *user)
{
    conv_grads *g = user;
    tsl_status st = TSL_OK;
    for (int32_t k = 0; k < g->n && !st; k++)
        st = part_partial(g, k, tile, dw_part, db_part);
    return st;
}

/* dx of one input (its run of the weights' input channels in a). */
static tsl_status backward_data(const tsl_conv_args *a, tsl_tensor_t x, tsl_tensor_t w,
                                tsl_tensor_t dy, tsl_tensor_t dx)
{
    if (spatially_tiled(a, x))
        return backward_data_windowed(a, x, w, dy, dx);
    tsl_status st = TSL_OK;
    for (int64_t i = 0; i < x->ntiles && !st; i++) {
        tsl_conv_task_args t = task_args(a, tile_samples(x, i));
        tsl_task_desc desc = {
            .codelet = &tsl_cl_conv_backward_data,
            .args = &t,
            .args_size = sizeof t,
            .nhandles = 3,
            .handles = {dy->handles[i], tsl_whole_handle(w, dx->tile_owner[i]), dx->handles[i]},
            .modes = {STARPU_R, STARPU_R, STARPU_W},
            .flops = conv_flops(&t.conv),
        };
        st = tsl_task_submit(x->ctx, &desc);
    }
    return st;
}

/* Backward over the channel concatenation of xs[0..n): dxs[k] (each may be NULL) through
 * input k's run of the weights, dw (and db) summed over the tiles of every part. */
static tsl_status backward(const tsl_conv_params *p, int transposed, int32_t n,
                           const tsl_tensor_t *xs, tsl_tensor_t w, tsl_tensor_t dy,
                           const tsl_tensor_t *dxs, tsl_tensor_t dw, tsl_tensor_t db,
                           const char *fn, tsl_halo_keep *keeps)
{
    conv_grads g;
    memset(&g, 0, sizeof g);
    tsl_status st = check_parts(p, transposed, n, xs, w, NULL, dy, "dy", fn, g.args);
    if (st)
        return st;
    struct tsl_context *ctx = xs[0]->ctx;
    if (dw && (st = tsl_tensor_check_same_layout(dw, w, fn)))
        return st;
    for (int32_t k = 0; k < n; k++) {
        tsl_tensor_t dx = dxs ? dxs[k] : NULL;
        if (dx && (st = tsl_tensor_check_same_layout(dx, xs[k], fn)))
            return st;
        for (int32_t j = 0; dx && j < n; j++)
            if (dx == xs[j] || (j != k && dxs[j] == dx))
                return tsl_error(ctx, TSL_ERR_INVALID_ARG,
                                 "%s: a gradient may not overwrite an input or another gradient",
                                 fn);
        if (dx == dy)
            return tsl_error(ctx, TSL_ERR_INVALID_ARG, "%s: a gradient may not overwrite an input",
                             fn);
        g.x[k] = xs[k];
    }
    if (db && (db->ctx != ctx || db->dtype != TSL_F32 || db->shape.ndim != 1 ||
               db->shape.dims[0] != g.args[0].out_channels ||
               (db->ntiles != 1 && db->ntiles != dy->grid.splits[1])))
        return tsl_error(ctx, TSL_ERR_SHAPE, "%s: db must be one tile of %lld f32 values", fn,
                         (long long)g.args[0].out_channels);
    if (db && !dw)
        return tsl_error(ctx, TSL_ERR_INVALID_ARG, "%s: db needs dw (computed together)", fn);
    if (dw == w)
        return tsl_error(ctx, TSL_ERR_INVALID_ARG, "%s: a gradient may not overwrite an input", fn);
    if (input_parts(w, transposed)) { /* (check() took one input) */
        for (int32_t k = 0; keeps && k < n; k++)
            tsl_halo_keep_release(ctx, &keeps[k]);
        st = dw ? weight_grads_parts(&g.args[0], xs[0], dy, dw, db) : TSL_OK;
        if (!st && dxs && dxs[0])
            st = backward_data_channels(&g.args[0], w, dy, dxs[0]);
        return st;
    }
    if (channel_cut(n, xs, dy)) {
        for (int32_t k = 0; k < n; k++)
            if (!g.args[k].w_in_channels)
                g.args[k].w_in_channels = weight_inputs(w, transposed);
        channel_grads cg = {n, g.args, xs, w, dy};
        for (int32_t k = 0; keeps && k < n; k++) /* (no windows, no slabs kept) */
            tsl_halo_keep_release(ctx, &keeps[k]);
        st = dw ? tsl_param_gradients(xs[0], dy, dw, db, channel_partial, &cg) : TSL_OK;
        for (int32_t k = 0; k < n && !st; k++)
            if (dxs && dxs[k])
                st = backward_data_channels(&g.args[k], w, dy, dxs[k]);
        return st;
    }
    g.n = n;
    g.dy = dy;
    g.keep = keeps;
    for (int32_t k = 0; k < n && !st; k++)
        if (spatially_tiled(&g.args[k], xs[k]))
            st = check_windows(&g.args[k], xs[k], dy);
    if (st)
        return st;
    st = dw ? tsl_param_gradients(xs[0], dy, dw, db, conv_partial, &g) : TSL_OK;
    for (int32_t k = 0; keeps && k < n; k++) /* used (or not needed): gone either way */
        tsl_halo_keep_release(ctx, &keeps[k]);
    for (int32_t k = 0; k < n && !st; k++)
        if (dxs && dxs[k])
            st = backward_data(&g.args[k], xs[k], w, dy, dxs[k]);
    tsl_whole_flush(w);
    return st;
}

tsl_status tsl_conv_forward(const tsl_conv_params *p, tsl_tensor_t x, tsl_tensor_t w,
                            tsl_tensor_t b, tsl_tensor_t y)
{
    return forward(p, 0, 1, &x, w, b, y, "tsl_conv_forward", NULL);
}

tsl_status tsl_conv_backward(const tsl_conv_params *p, tsl_tensor_t x, tsl_tensor_t w,
                             tsl_tensor_t dy, tsl_tensor_t dx, tsl_tensor_t dw, tsl_tensor_t db)
{
    return backward(p, 0, 1, &x, w, dy, &dx, dw, db, "tsl_conv_backward", NULL);
}

tsl_status tsl_conv_transpose_forward(const tsl_conv_params *p, tsl_tensor_t x, tsl_tensor_t w,
                                      tsl_tensor_t b, tsl_tensor_t y)
{
    return forward(p, 1, 1, &x, w, b, y, "tsl_conv_transpose_forward", NULL);
}

tsl_status tsl_conv_transpose_backward(const tsl_conv_params *p, tsl_tensor_t x, tsl_tensor_t w,
                                       tsl_tensor_t dy, tsl_tensor_t dx, tsl_tensor_t dw,
                                       tsl_tensor_t db)
{
    return backward(p, 1, 1, &x, w, dy, &dx, dw, db, "tsl_conv_transpose_backward", NULL);
}

tsl_status tsl_conv_concat_forward(const tsl_conv_params *p, int32_t count, const tsl_tensor_t *xs,
                                   tsl_tensor_t w, tsl_tensor_t b, tsl_tensor_t y)
{
    return forward(p, 0, count, xs, w, b, y, "tsl_conv_concat_forward", NULL);
}

tsl_status tsl_conv_concat_backward(const tsl_conv_params *p, int32_t count, const tsl_tensor_t *xs,
                                    tsl_tensor_t w, tsl_tensor_t dy, const tsl_tensor_t *dxs,
                                    tsl_tensor_t dw, tsl_tensor_t db)
{
    return backward(p, 0, count, xs, w, dy, dxs, dw, db, "tsl_conv_concat_backward", NULL);
}

tsl_status tsl_conv_forward_keeping(const tsl_conv_params *p, int transposed, int32_t count,
                                    const tsl_tensor_t *xs, tsl_tensor_t w, tsl_tensor_t b,
                                    tsl_tensor_t y, struct tsl_halo_keep *keeps)
{
    const char *fn = count > 1    ? "tsl_conv_concat_forward"
                     : transposed ? "tsl_conv_transpose_forward"
                                  : "tsl_conv_forward";
    return forward(p, transposed, count, xs, w, b, y, fn, keeps);
}

tsl_status tsl_conv_backward_keeping(const tsl_conv_params *p, int transposed, int32_t count,
                                     const tsl_tensor_t *xs, tsl_tensor_t w, tsl_tensor_t dy,
                                     const tsl_tensor_t *dxs, tsl_tensor_t dw, tsl_tensor_t db,
                                     struct tsl_halo_keep *keeps)
{
    const char *fn = count > 1    ? "tsl_conv_concat_backward"
                     : transposed ? "tsl_conv_transpose_backward"
                                  : "tsl_conv_backward";
    return backward(p, transposed, count, xs, w, dy, dxs, dw, db, fn, keeps);
}
