/* Halo slabs: planning, packing on the neighbour's owner, and accumulation of gradient slabs
 * (see halo.h). */
#include <stdlib.h>
#include <string.h>

#include "codelets/copy.h"
#include "halo.h"

/* Intersection of two spatial boxes; 0 when empty. */
static int box_meet(int spatial, const tsl_conv_box *a, const tsl_conv_box *b, tsl_conv_box *out)
{
    for (int d = 0; d < spatial; d++) {
        int64_t lo = a->lo[d] > b->lo[d] ? a->lo[d] : b->lo[d];
        int64_t hi = a->lo[d] + a->size[d] < b->lo[d] + b->size[d] ? a->lo[d] + a->size[d]
                                                                   : b->lo[d] + b->size[d];
        if (lo >= hi)
            return 0;
        out->lo[d] = lo;
        out->size[d] = hi - lo;
    }
    for (int d = spatial; d < 3; d++) {
        out->lo[d] = 0;
        out->size[d] = 1;
    }
    return 1;
}

static void spatial_box(struct tsl_tensor *x, int64_t tile, int spatial, tsl_conv_box *box,
                        int64_t start[TSL_MAX_DIMS], int64_t extent[TSL_MAX_DIMS])
{
    tsl_tensor_tile_box(x, tile, start, extent);
    for (int d = 0; d < 3; d++) {
        box->lo[d] = d < spatial ? start[2 + d] : 0;
        box->size[d] = d < spatial ? extent[2 + d] : 1;
    }
}

tsl_status tsl_halo_slabs(struct tsl_tensor *x, int64_t tile, int spatial,
                          const tsl_conv_box *window, tsl_conv_box *own, int32_t *nslabs,
                          int64_t *src_tile, tsl_conv_box *boxes, int64_t (*shift)[3], int32_t max)
{
    int64_t start[TSL_MAX_DIMS], extent[TSL_MAX_DIMS];
    spatial_box(x, tile, spatial, own, start, extent);
    tsl_conv_box global = {{0, 0, 0}, {1, 1, 1}};
    for (int d = 0; d < spatial; d++)
        global.size[d] = x->shape.dims[2 + d];
    *nslabs = 0;
    /* Image m of the input (m = 0 .. 3^spatial - 1, digit d - 1 its move along dimension d;
     * image 0 alone without wrapping): the window's part in it, moved back into the input. */
    int32_t images = 1;
    for (int d = 0; shift && d < spatial; d++)
        images *= 3;
    for (int32_t m = 0; m < images; m++) {
        int64_t move[3] = {0, 0, 0};
        int centre = 1;
        for (int d = 0, code = m; shift && d < spatial; d++, code /= 3) {
            int64_t k = (code + 1) % 3 - 1; /* m = 0 is the input itself */
            move[d] = k * global.size[d];
            centre &= k == 0;
        }
        tsl_conv_box image = global, need;
        for (int d = 0; d < spatial; d++)
            image.lo[d] += move[d];
        if (!box_meet(spatial, window, &image, &need))
            continue;
        for (int d = 0; d < spatial; d++)
            need.lo[d] -= move[d];
        for (int64_t j = 0; j < x->ntiles; j++) {
            if (j == tile && centre)
                continue;
            int64_t s[TSL_MAX_DIMS], e[TSL_MAX_DIMS];
            tsl_conv_box other, part;
            spatial_box(x, j, spatial, &other, s, e);
            if (s[0] != start[0] || s[1] != start[1] || !box_meet(spatial, &other, &need, &part))
                continue; /* other samples or channels, or outside the window */
            if (*nslabs == max)
                return tsl_error(x->ctx, TSL_ERR_SHAPE,
                                 "halo exchange: the window of tile %lld reaches more than %d "
                                 "other tiles; use fewer, larger spatial tiles for this kernel",
                                 (long long)tile, (int)max);
            src_tile[*nslabs] = j;
            for (int d = 0; shift && d < 3; d++)
                shift[*nslabs][d] = move[d];
            boxes[(*nslabs)++] = part;
        }
    }
    return TSL_OK;
}

int64_t tsl_halo_numel(struct tsl_tensor *x, int64_t tile, int spatial, const tsl_conv_box *box)
{
    int64_t start[TSL_MAX_DIMS], extent[TSL_MAX_DIMS];
    tsl_tensor_tile_box(x, tile, start, extent);
    int64_t n = extent[0] * extent[1];
    for (int d = 0; d < spatial; d++)
        n *= box->size[d];
    return n;
}

/* Box-copy arguments between tile `tile` of x and a dense slab of `box`: from the tile into
 * the slab (pack) or back (accumulate). */
static void slab_args(struct tsl_tensor *x, int64_t tile, const tsl_conv_box *box, int into_slab,
                      tsl_box_copy_args *a)
{
    int64_t start[TSL_MAX_DIMS], extent[TSL_MAX_DIMS];
    tsl_tensor_tile_box(x, tile, start, extent);
    memset(a, 0, sizeof *a);
    a->ndim = x->shape.ndim;
    a->elem_size = (int32_t)x->elem_size;
    a->src_layout = a->dst_layout = x->layout;
    int64_t *tile_extent = into_slab ? a->src_extent : a->dst_extent;
    int64_t *tile_offset = into_slab ? a->src_offset : a->dst_offset;
    int64_t *slab_extent = into_slab ? a->dst_extent : a->src_extent;
    for (int d = 0; d < a->ndim; d++) {
        tile_extent[d] = extent[d];
        slab_extent[d] = a->box[d] = d < 2 ? extent[d] : box->size[d - 2];
        tile_offset[d] = d < 2 ? 0 : box->lo[d - 2] - start[d];
    }
}

/* Pack (into_slab) or accumulate (the reverse, adding) between a tile and a slab. */
static tsl_status slab_task(struct tsl_tensor *x, int64_t tile, const tsl_conv_box *box,
                            starpu_data_handle_t slab, int into_slab)
{
    tsl_box_copy_args a;
    slab_args(x, tile, box, into_slab, &a);
    a.accumulate = !into_slab;
    tsl_task_desc desc = {
        .codelet = &tsl_cl_box_copy,
        .name = into_slab ? "tsl_halo_pack" : "tsl_halo_accumulate",
        .args = &a,
        .args_size = sizeof a,
        .nhandles = 2,
        .handles = {into_slab ? x->handles[tile] : slab, into_slab ? slab : x->handles[tile]},
        .modes = {STARPU_R, into_slab ? STARPU_W : STARPU_RW},
    };
    return tsl_task_submit(x->ctx, &desc);
}

tsl_status tsl_halo_pack(struct tsl_tensor *x, int64_t src_tile, int spatial,
                         const tsl_conv_box *box, starpu_data_handle_t *slab)
{
    tsl_status st = tsl_temp_handle_register(x->ctx, tsl_halo_numel(x, src_tile, spatial, box),
                                             x->elem_size, x->tile_owner[src_tile], slab);
    return st ? st : slab_task(x, src_tile, box, *slab, 1);
}

tsl_status tsl_halo_accumulate(struct tsl_tensor *dx, int64_t tile, const tsl_conv_box *box,
                               starpu_data_handle_t slab)
{
    return slab_task(dx, tile, box, slab, 0);
}

tsl_status tsl_halo_pack_window(struct tsl_tensor *x, int spatial, const tsl_conv_window *w,
                                const int64_t *src, starpu_data_handle_t *slabs)
{
    tsl_status st = TSL_OK;
    for (int32_t k = 0; k < w->nslabs; k++)
        slabs[k] = NULL;
    for (int32_t k = 0; k < w->nslabs && !st; k++)
        st = tsl_halo_pack(x, src[k], spatial, &w->slab[k], &slabs[k]);
    if (st)
        tsl_halo_release(x->ctx, slabs, w->nslabs);
    return st;
}

void tsl_halo_release(struct tsl_context *ctx, starpu_data_handle_t *slabs, int64_t n)
{
    for (int64_t k = 0; k < n; k++)
        if (slabs[k]) {
            tsl_temp_handle_release(ctx, slabs[k]);
            slabs[k] = NULL;
        }
}

tsl_status tsl_halo_returns_init(tsl_halo_returns *r, struct tsl_context *ctx, int64_t ntiles)
{
    size_t n = (size_t)ntiles * TSL_CONV_MAX_SLABS;
    r->ntiles = ntiles;
    r->nslabs = calloc((size_t)ntiles, sizeof *r->nslabs);
    r->src = calloc(n, sizeof *r->src);
    r->box = calloc(n, sizeof *r->box);
    r->slabs = calloc(n, sizeof *r->slabs);
    if (!r->nslabs || !r->src || !r->box || !r->slabs) {
        free(r->nslabs);
        free(r->src);
        free(r->box);
        free(r->slabs);
        return tsl_error(ctx, TSL_ERR_OUT_OF_MEMORY, "halo exchange: out of memory");
    }
    return TSL_OK;
}

tsl_status tsl_halo_returns_add(tsl_halo_returns *r, struct tsl_tensor *dx, int64_t tile,
                                int spatial, const tsl_conv_window *w, const int64_t *src,
                                int owner)
{
    int64_t base = tile * TSL_CONV_MAX_SLABS;
    r->nslabs[tile] = w->nslabs;
    tsl_status st = TSL_OK;
    for (int32_t k = 0; k < w->nslabs && !st; k++) {
        r->src[base + k] = src[k];
        r->box[base + k] = w->slab[k];
        st = tsl_temp_handle_register(dx->ctx, tsl_halo_numel(dx, src[k], spatial, &w->slab[k]),
                                      dx->elem_size, owner, &r->slabs[base + k]);
    }
    return st;
}

tsl_status tsl_halo_returns_finish(tsl_halo_returns *r, struct tsl_tensor *dx, int accumulate)
{
    tsl_status st = TSL_OK;
    for (int64_t j = 0; j < dx->ntiles && accumulate && !st; j++)
        for (int64_t i = 0; i < r->ntiles && !st; i++)
            for (int32_t k = 0; k < r->nslabs[i] && !st; k++) {
                int64_t at = i * TSL_CONV_MAX_SLABS + k;
                if (r->src[at] == j)
                    st = tsl_halo_accumulate(dx, j, &r->box[at], r->slabs[at]);
            }
    tsl_halo_release(dx->ctx, r->slabs, r->ntiles * TSL_CONV_MAX_SLABS);
    free(r->nslabs);
    free(r->src);
    free(r->box);
    free(r->slabs);
    return st;
}

void tsl_halo_keep_release(struct tsl_context *ctx, tsl_halo_keep *keep)
{
    if (!keep)
        return;
    if (keep->slabs)
        tsl_halo_release(ctx, keep->slabs, keep->ntiles * TSL_CONV_MAX_SLABS);
    free(keep->slabs);
    free(keep->nslabs);
    memset(keep, 0, sizeof *keep);
}
