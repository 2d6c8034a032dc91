/* Tiled tensors: moving data. Scatter from and gather to a host array on one rank, copies
 * of regions between tensors of any tile grids, redistribution, and the whole-tensor
 * replicas a tensor keeps on several ranks. Creation and queries are in tensor.c. */
#include <stdlib.h>
#include <string.h>

#include "codelets/copy.h"
#include "internal.h"
#include "tessel/starpu.h"

/* Box-copy description between a whole C-order array and one tile of it. */
static void whole_tile_box(const struct tsl_tensor *t, int64_t index, tsl_box_copy_args *to_tile,
                           tsl_box_copy_args *to_whole)
{
    int64_t start[TSL_MAX_DIMS], extent[TSL_MAX_DIMS];
    tsl_tensor_tile_box(t, index, start, extent);
    memset(to_tile, 0, sizeof *to_tile);
    to_tile->ndim = t->shape.ndim;
    to_tile->elem_size = (int32_t)t->elem_size;
    to_tile->src_layout = TSL_LAYOUT_PLAIN;
    to_tile->dst_layout = t->layout;
    for (int d = 0; d < t->shape.ndim; d++) {
        to_tile->src_extent[d] = t->shape.dims[d];
        to_tile->src_offset[d] = start[d];
        to_tile->dst_extent[d] = extent[d];
        to_tile->dst_offset[d] = 0;
        to_tile->box[d] = extent[d];
    }
    *to_whole = *to_tile;
    memcpy(to_whole->src_extent, to_tile->dst_extent, sizeof to_whole->src_extent);
    memcpy(to_whole->src_offset, to_tile->dst_offset, sizeof to_whole->src_offset);
    memcpy(to_whole->dst_extent, to_tile->src_extent, sizeof to_whole->dst_extent);
    memcpy(to_whole->dst_offset, to_tile->src_offset, sizeof to_whole->dst_offset);
    to_whole->src_layout = t->layout;
    to_whole->dst_layout = TSL_LAYOUT_PLAIN;
}

static tsl_status check_root(tsl_tensor_t t, int32_t root, const char *fn)
{
    if (root < 0 || root >= t->ctx->size)
        return tsl_error(t->ctx, TSL_ERR_INVALID_ARG, "%s: root %d outside [0, %d)", fn, (int)root,
                         t->ctx->size);
    return TSL_OK;
}

static tsl_status submit_copy(struct tsl_context *ctx, starpu_data_handle_t src,
                              starpu_data_handle_t dst)
{
    char unused = 0;
    tsl_task_desc desc = {
        .codelet = &tsl_cl_copy,
        .args = &unused,
        .args_size = sizeof unused,
        .nhandles = 2,
        .handles = {src, dst},
        .modes = {STARPU_R, STARPU_W},
    };
    return tsl_task_submit(ctx, &desc);
}

/* Root's own tiles from this size on are scattered in place: the staging copy would cost as
 * much memory as the tile, and waiting for the tile's earlier tasks is small against the work
 * on it. Smaller ones go through a staging copy, so the call does not wait (many small steps,
 * such as Fashion-MNIST batches, lost a fifth of their speed waiting). */
#define SCATTER_IN_PLACE_BYTES ((int64_t)1 << 20)

/* Scatter from root; with `narrow`, src holds i64 labels and t is u8 or i32 (the box copy
 * narrows them). */
static tsl_status scatter(tsl_tensor_t t, int32_t root, const void *src, int narrow)
{
    tsl_status st = tsl_tensor_check(t, "tsl_tensor_scatter");
    if (st || (st = check_root(t, root, "tsl_tensor_scatter")))
        return st;
    struct tsl_context *ctx = t->ctx;
    /* Every rank must learn whether root has data, or ranks would disagree on the tasks. */
    st = tsl_context_agree(
        ctx, root,
        ctx->rank == root && !src
            ? tsl_error(ctx, TSL_ERR_INVALID_ARG, "tsl_tensor_scatter: src is NULL on root")
            : TSL_OK);
    if (st)
        return st;
    if (ctx->tag_count - ctx->tags_used < t->ntiles)
        return tsl_error(ctx, TSL_ERR_RESOURCE, "tsl_tensor_scatter: StarPU-MPI tags exhausted");
    for (int64_t i = 0; i < t->ntiles; i++) {
        if (t->tile_owner[i] == root &&
            tsl_tensor_tile_numel(t, i) * (int64_t)t->elem_size >= SCATTER_IN_PLACE_BYTES) {
            /* Root's own large tiles are written in place, without a staging copy (waiting for
             * the tile's earlier tasks); the other ranks drop any cached copy of them. */
            tsl_cache_flush(ctx, t->handles[i]);
            if (ctx->rank == root) {
                tsl_box_copy_args to_tile, to_whole;
                whole_tile_box(t, i, &to_tile, &to_whole);
                to_tile.narrow_labels = narrow;
                starpu_data_acquire(t->handles[i], STARPU_W);
                tsl_box_copy(&to_tile, starpu_data_get_local_ptr(t->handles[i]), src);
                starpu_data_release(t->handles[i]);
            }
            continue;
        }
        starpu_data_handle_t staging;
        st = tsl_temp_handle_register(ctx, tsl_tensor_tile_numel(t, i), t->elem_size, root,
                                      &staging);
        if (st)
            return st;
        if (ctx->rank == root) {
            tsl_box_copy_args to_tile, to_whole;
            whole_tile_box(t, i, &to_tile, &to_whole);
            to_tile.narrow_labels = narrow;
            starpu_data_acquire(staging, STARPU_W);
            tsl_box_copy(&to_tile, starpu_data_get_local_ptr(staging), src);
            starpu_data_release(staging);
        }
        st = submit_copy(ctx, staging, t->handles[i]);
        tsl_temp_handle_release(ctx, staging);
        if (st)
            return st;
    }
    return TSL_OK;
}

tsl_status tsl_tensor_scatter(tsl_tensor_t t, int32_t root, const void *src)
{
    return scatter(t, root, src, 0);
}

tsl_status tsl_tensor_scatter_labels(tsl_tensor_t t, int32_t root, const int64_t *src)
{
    tsl_status st = tsl_tensor_check(t, "tsl_tensor_scatter");
    if (st)
        return st;
    if (t->dtype != TSL_U8 && t->dtype != TSL_I32 && t->dtype != TSL_I64)
        return tsl_error(t->ctx, TSL_ERR_DTYPE,
                         "tsl_tensor_scatter: labels go to u8, i32 or i64 "
                         "tensors, not %s",
                         tsl_dtype_name(t->dtype));
    return scatter(t, root, src, t->dtype != TSL_I64);
}

tsl_status tsl_tensor_gather(tsl_tensor_t t, int32_t root, void *dst)
{
    tsl_status st = tsl_tensor_check(t, "tsl_tensor_gather");
    if (st || (st = check_root(t, root, "tsl_tensor_gather")))
        return st;
    struct tsl_context *ctx = t->ctx;
    st = tsl_context_agree(
        ctx, root,
        ctx->rank == root && !dst
            ? tsl_error(ctx, TSL_ERR_INVALID_ARG, "tsl_tensor_gather: dst is NULL on root")
            : TSL_OK);
    if (st)
        return st;
    if (ctx->tag_count - ctx->tags_used < t->ntiles)
        return tsl_error(ctx, TSL_ERR_RESOURCE, "tsl_tensor_gather: StarPU-MPI tags exhausted");
    starpu_data_handle_t *staging = NULL;
    if (ctx->rank == root) {
        staging = calloc((size_t)t->ntiles, sizeof *staging);
        if (!staging)
            return tsl_error(ctx, TSL_ERR_OUT_OF_MEMORY, "tsl_tensor_gather: out of memory");
    }
    tsl_status failed = TSL_OK;
    for (int64_t i = 0; i < t->ntiles; i++) {
        starpu_data_handle_t h;
        st = tsl_temp_handle_register(ctx, tsl_tensor_tile_numel(t, i), t->elem_size, root, &h);
        if (st)
            return st; /* the range was checked above: only an internal error gets here */
        st = submit_copy(ctx, t->handles[i], h);
        if (st && !failed)
            failed = st;
        tsl_cache_flush(ctx, t->handles[i]);
        if (ctx->rank == root)
            staging[i] = h;
        else
            tsl_temp_handle_release(ctx, h);
    }
    if (ctx->rank == root) {
        for (int64_t i = 0; i < t->ntiles; i++) {
            if (!failed) {
                tsl_box_copy_args to_tile, to_whole;
                whole_tile_box(t, i, &to_tile, &to_whole);
                starpu_data_acquire(staging[i], STARPU_R);
                tsl_box_copy(&to_whole, dst, starpu_data_get_local_ptr(staging[i]));
                starpu_data_release(staging[i]);
            }
            tsl_temp_handle_release(ctx, staging[i]);
        }
        free(staging);
    }
    return failed;
}

static int32_t tile_containing(int64_t size, int32_t splits, int64_t position)
{
    int32_t low = 0, high = splits - 1;
    while (low < high) {
        int32_t mid = (low + high + 1) / 2;
        int64_t start, extent;
        tsl_tile_extent(size, splits, mid, &start, &extent);
        if (start <= position)
            low = mid;
        else
            high = mid - 1;
    }
    return low;
}

tsl_status tsl_copy_region(tsl_tensor_t dst, tsl_tensor_t src, const int64_t *src_lo,
                           const int64_t *dst_lo, const int64_t *extent)
{
    struct tsl_context *ctx = dst->ctx;
    int ndim = dst->shape.ndim;
    tsl_box_copy_args args;
    memset(&args, 0, sizeof args);
    args.ndim = ndim;
    args.elem_size = (int32_t)dst->elem_size;
    args.src_layout = src->layout;
    args.dst_layout = dst->layout;
    for (int64_t j = 0; j < dst->ntiles; j++) {
        int64_t dstart[TSL_MAX_DIMS], dext[TSL_MAX_DIMS];
        tsl_tensor_tile_box(dst, j, dstart, dext);
        /* The part of destination tile j inside the region, in source coordinates, and the
         * range of source tiles overlapping it, per dimension. */
        int64_t lo[TSL_MAX_DIMS], hi[TSL_MAX_DIMS];
        int32_t first[TSL_MAX_DIMS], count[TSL_MAX_DIMS];
        int64_t pairs = 1;
        int whole_tile = 1;
        for (int d = 0; d < TSL_MAX_DIMS; d++) {
            first[d] = 0;
            count[d] = 1;
            if (d >= ndim)
                continue;
            int64_t a = dstart[d] > dst_lo[d] ? dstart[d] : dst_lo[d];
            int64_t b = dstart[d] + dext[d] < dst_lo[d] + extent[d] ? dstart[d] + dext[d]
                                                                    : dst_lo[d] + extent[d];
            if (a >= b) {
                pairs = 0;
                break;
            }
            whole_tile &= a == dstart[d] && b == dstart[d] + dext[d];
            lo[d] = a - dst_lo[d] + src_lo[d];
            hi[d] = b - dst_lo[d] + src_lo[d];
            first[d] = tile_containing(src->shape.dims[d], src->grid.splits[d], lo[d]);
            int32_t last = tile_containing(src->shape.dims[d], src->grid.splits[d], hi[d] - 1);
            count[d] = last - first[d] + 1;
            pairs *= count[d];
        }
        for (int64_t p = 0; p < pairs; p++) {
            int64_t rest = p, src_index = 0;
            int32_t coords[TSL_MAX_DIMS];
            for (int d = TSL_MAX_DIMS - 1; d >= 0; d--) {
                coords[d] = first[d] + (int32_t)(rest % count[d]);
                rest /= count[d];
            }
            for (int d = 0; d < ndim; d++)
                src_index = src_index * src->grid.splits[d] + coords[d];
            int64_t sstart[TSL_MAX_DIMS], sext[TSL_MAX_DIMS];
            tsl_tensor_tile_box(src, src_index, sstart, sext);
            int64_t box_numel = 1;
            for (int d = 0; d < ndim; d++) {
                int64_t a = sstart[d] > lo[d] ? sstart[d] : lo[d];
                int64_t b = sstart[d] + sext[d] < hi[d] ? sstart[d] + sext[d] : hi[d];
                args.src_extent[d] = sext[d];
                args.src_offset[d] = a - sstart[d];
                args.dst_extent[d] = dext[d];
                args.dst_offset[d] = a - src_lo[d] + dst_lo[d] - dstart[d];
                args.box[d] = b - a;
                box_numel *= b - a;
            }
            /* A part of a tile on another rank is first cut out there (a pack task into a
             * temporary handle), so only the part crosses, as halo slabs do. */
            starpu_data_handle_t from = src->handles[src_index], packed = NULL;
            if (src->tile_owner[src_index] != dst->tile_owner[j] &&
                box_numel < tsl_tensor_tile_numel(src, src_index)) {
                tsl_box_copy_args pack = args;
                tsl_status st = tsl_temp_handle_register(ctx, box_numel, src->elem_size,
                                                         src->tile_owner[src_index], &packed);
                for (int d = 0; d < ndim && !st; d++) {
                    pack.dst_extent[d] = pack.box[d];
                    pack.dst_offset[d] = 0;
                    args.src_extent[d] = args.box[d];
                    args.src_offset[d] = 0;
                }
                pack.dst_layout = src->layout;
                tsl_task_desc pd = {
                    .codelet = &tsl_cl_box_copy,
                    .name = "tsl_copy_pack",
                    .args = &pack,
                    .args_size = sizeof pack,
                    .nhandles = 2,
                    .handles = {from, packed},
                    .modes = {STARPU_R, STARPU_W},
                };
                if (!st)
                    st = tsl_task_submit(ctx, &pd);
                if (st) {
                    if (packed)
                        tsl_temp_handle_release(ctx, packed);
                    return st;
                }
                from = packed;
            }
            tsl_task_desc desc = {
                .codelet = &tsl_cl_box_copy,
                .args = &args,
                .args_size = sizeof args,
                .nhandles = 2,
                .handles = {from, dst->handles[j]},
                /* One source box covering the whole destination tile overwrites it. */
                .modes = {STARPU_R, pairs == 1 && whole_tile ? STARPU_W : STARPU_RW},
            };
            tsl_status st = tsl_task_submit(ctx, &desc);
            if (packed)
                tsl_temp_handle_release(ctx, packed);
            if (st)
                return st;
        }
    }
    for (int64_t i = 0; i < src->ntiles; i++)
        tsl_cache_flush(ctx, src->handles[i]);
    return TSL_OK;
}

/* A whole copy (one tile, tessel's memory) of a plain tensor cut along its first dimension
 * only: every tile is one run of the copy's memory. */
static int gathers_whole(const struct tsl_tensor *dst, const struct tsl_tensor *src)
{
    if (dst->ntiles != 1 || src->ntiles < 2 || dst->transient || dst->layout != TSL_LAYOUT_PLAIN ||
        src->layout != TSL_LAYOUT_PLAIN)
        return 0;
    for (int d = 1; d < src->shape.ndim; d++)
        if (src->grid.splits[d] != 1)
            return 0;
    return tsl_views_enabled();
}

/* Gather into a whole copy without copying what arrives: on the copy's owner, the copy is
 * partitioned into one child per source tile; each remote tile is received straight into its
 * child (an explicit StarPU-MPI send from the tile's owner), the owner's own tiles are copied
 * by a task, and the children are gathered back (no copy: they are views of the copy's
 * memory). Every rank drops any cached value of the copy. */
static tsl_status gather_whole(struct tsl_tensor *dst, struct tsl_tensor *src)
{
    struct tsl_context *ctx = dst->ctx;
    const int64_t n = src->ntiles;
    const int32_t owner = dst->tile_owner[0];
    if (ctx->tag_count - ctx->tags_used < 2 * n)
        return tsl_error(ctx, TSL_ERR_RESOURCE,
                         "tsl_tensor_redistribute: StarPU-MPI tags exhausted");
    starpu_data_handle_t *children = NULL;
    uint32_t *lengths = NULL;
    if (ctx->rank == owner) {
        children = calloc((size_t)n, sizeof *children);
        lengths = calloc((size_t)n, sizeof *lengths);
        if (!children || !lengths) {
            free(children);
            free(lengths);
            return tsl_error(ctx, TSL_ERR_OUT_OF_MEMORY, "tsl_tensor_redistribute: out of memory");
        }
        for (int64_t i = 0; i < n; i++)
            lengths[i] = (uint32_t)tsl_tensor_tile_numel(src, i);
        tsl_views_begin(dst->handles[0], n, lengths, children);
    }
    tsl_status st = TSL_OK;
    for (int64_t i = 0; i < n && !st; i++) {
        int64_t child_tag, message_tag;
        if ((st = tsl_context_next_tag(ctx, &child_tag)) ||
            (st = tsl_context_next_tag(ctx, &message_tag)))
            break;
        int32_t from = src->tile_owner[i];
        if (ctx->rank == owner)
            starpu_mpi_data_register_comm(children[i], child_tag, owner, ctx->comm);
        if (from == owner) {
            if (ctx->rank == owner)
                st = submit_copy(ctx, src->handles[i], children[i]);
        } else if (ctx->rank == owner) {
            tsl_pending_add(ctx);
            if (starpu_mpi_irecv_detached(children[i], from, message_tag, ctx->comm,
                                          tsl_pending_done, ctx) != 0) {
                tsl_pending_done(ctx);
                st = tsl_error(ctx, TSL_ERR_RUNTIME, "tsl_tensor_redistribute: irecv failed");
            }
        } else if (ctx->rank == from) {
            tsl_pending_add(ctx);
            if (starpu_mpi_isend_detached(src->handles[i], owner, message_tag, ctx->comm,
                                          tsl_pending_done, ctx) != 0) {
                tsl_pending_done(ctx);
                st = tsl_error(ctx, TSL_ERR_RUNTIME, "tsl_tensor_redistribute: isend failed");
            }
        }
    }
    if (ctx->rank == owner)
        tsl_views_end(dst->handles[0], n, children);
    free(children);
    free(lengths);
    tsl_cache_flush(ctx, dst->handles[0]);
    return st;
}

tsl_status tsl_tensor_redistribute(tsl_tensor_t dst, tsl_tensor_t src)
{
    tsl_status st = tsl_tensor_check(dst, "tsl_tensor_redistribute");
    if (st || (st = tsl_tensor_check(src, "tsl_tensor_redistribute")))
        return st;
    struct tsl_context *ctx = dst->ctx;
    if (src->ctx != ctx)
        return tsl_error(ctx, TSL_ERR_INVALID_ARG,
                         "tsl_tensor_redistribute: tensors belong to different contexts");
    if (src == dst)
        return TSL_OK;
    if (src->dtype != dst->dtype)
        return tsl_error(ctx, TSL_ERR_DTYPE, "tsl_tensor_redistribute: dtypes %s and %s differ",
                         tsl_dtype_name(dst->dtype), tsl_dtype_name(src->dtype));
    if (src->shape.ndim != dst->shape.ndim ||
        memcmp(src->shape.dims, dst->shape.dims, sizeof src->shape.dims) != 0)
        return tsl_error(ctx, TSL_ERR_SHAPE, "tsl_tensor_redistribute: shapes differ");
    if (gathers_whole(dst, src))
        return gather_whole(dst, src);
    const int64_t zero[TSL_MAX_DIMS] = {0, 0, 0, 0, 0};
    return tsl_copy_region(dst, src, zero, zero, src->shape.dims);
}

tsl_status tsl_tensor_make_replicas(struct tsl_tensor *t)
{
    if (t->ntiles == 1)
        return TSL_OK;
    int32_t first = t->owners.first_rank;
    return tsl_tensor_make_replicas_on(
        t, first, t->owners.group_size > 0 ? t->owners.group_size : t->ctx->size - first);
}

tsl_status tsl_tensor_make_replicas_on(struct tsl_tensor *t, int32_t first, int32_t count)
{
    struct tsl_context *ctx = t->ctx;
    if (t->replicas)
        return TSL_OK;
    if (first < 0 || count < 1 || first + count > ctx->size)
        return tsl_error(ctx, TSL_ERR_INVALID_ARG, "replicas: ranks %d..%d outside the context",
                         (int)first, (int)(first + count - 1));
    t->replicas = calloc((size_t)ctx->size, sizeof *t->replicas);
    if (!t->replicas)
        return tsl_error(ctx, TSL_ERR_OUT_OF_MEMORY, "replicas: out of memory");
    for (int32_t r = first; r < first + count; r++) {
        tsl_owner_map on = tsl_owner_single(r);
        tsl_status st = tsl_tensor_create_layout(&t->replicas[r], ctx, t->dtype, &t->shape, NULL,
                                                 &on, t->layout);
        if (st)
            return st; /* tsl_tensor_destroy(t) frees those made */
        tsl_context_untrack_tensor(ctx, t->replicas[r]);
    }
    return TSL_OK;
}

tsl_status tsl_tensor_sync_replicas(struct tsl_tensor *t)
{
    tsl_status st = TSL_OK;
    for (int32_t r = 0; t->replicas && r < t->ctx->size && !st; r++)
        if (t->replicas[r])
            st = tsl_tensor_redistribute(t->replicas[r], t);
    return st;
}

void tsl_whole_flush(const struct tsl_tensor *t)
{
    if (!t->replicas || t->ntiles == 1) {
        tsl_cache_flush(t->ctx, t->handles[0]);
        return;
    }
    for (int32_t r = 0; t->owners.group_size > 0 && r < t->ctx->size; r++)
        if (t->replicas[r])
            tsl_cache_flush(t->ctx, t->replicas[r]->handles[0]);
}
