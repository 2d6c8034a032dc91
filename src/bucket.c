/* Packed traffic for small tensors: one message per rank and bucket instead of one per tensor.
 *
 * Reduction (struct tsl_bucket): each rank adds its partials of the members' gradients into
 * one packed buffer of its own (zeroed by a fill task when the rank's first partial comes);
 * once every member has its partials (or at tsl_bucket_reduce), a tree of axpy tasks rooted at
 * the owner sums the ranks' buffers and pack tasks there cut the sum into the members.
 *
 * Copies (tsl_tensors_redistribute): the one-tile sources of one owner are packed there into
 * one buffer (pack tasks of up to TSL_PACK_MAX pieces each); every destination rank reads that
 * buffer once and cuts its tensors out of it.
 *
 * Row sums (tsl_tensor_sum_rows, tsl_tensors_sum_rows): the sums into tiles of reduce.c, with
 * the small one-tile destinations of one owner packed into a bucket. This file calls reduce.c
 * (tsl_tree_sum_into, tsl_sum_into_tiles), never the other way. */
#include <stdlib.h>
#include <string.h>

#include "codelets/copy.h"
#include "codelets/fill.h"
#include "internal.h"
#include "tessel/tensor.h"

/* 1-D box copy args: `len` elements from src[src_off ...) to dst[dst_off ...). */
static tsl_box_copy_args flat_box(int32_t elem_size, int64_t src_extent, int64_t src_off,
                                  int64_t dst_extent, int64_t dst_off, int64_t len)
{
    tsl_box_copy_args a;
    memset(&a, 0, sizeof a);
    a.ndim = 1;
    a.elem_size = elem_size;
    a.src_extent[0] = src_extent;
    a.src_offset[0] = src_off;
    a.dst_extent[0] = dst_extent;
    a.dst_offset[0] = dst_off;
    a.box[0] = len;
    return a;
}

static tsl_status box_task(struct tsl_context *ctx, const tsl_box_copy_args *a,
                           starpu_data_handle_t src, starpu_data_handle_t dst,
                           enum starpu_data_access_mode dst_mode, int priority)
{
    tsl_task_desc desc = {
        .codelet = &tsl_cl_box_copy,
        .args = a,
        .args_size = sizeof *a,
        .nhandles = 2,
        .handles = {src, dst},
        .modes = {STARPU_R, dst_mode},
        .flops = a->accumulate ? (double)a->box[0] : 0,
        .priority = priority,
    };
    return tsl_task_submit(ctx, &desc);
}

/* Pack tasks: pieces[i] (whole vectors) into (unpack 0) or out of (1) the byte range from
 * offset[i] of `pack`, at most TSL_PACK_MAX per task, a piece never twice in one task.
 * Packing, the first task writes the pack and later ones add their ranges to it; unpacking
 * tasks all read it, and the pieces of one task must share an owner (the task runs there). */
static tsl_status pack_tasks(struct tsl_context *ctx, int unpack, starpu_data_handle_t pack,
                             int32_t n, const starpu_data_handle_t *pieces, const int64_t *offset,
                             int priority)
{
    tsl_status st = TSL_OK;
    for (int32_t at = 0, first = 1; at < n && !st; first = 0) {
        tsl_pack_args a;
        memset(&a, 0, sizeof a);
        a.unpack = unpack;
        tsl_task_desc desc = {
            .codelet = &tsl_cl_pack, .args = &a, .args_size = sizeof a, .priority = priority};
        int32_t k = 0, h = unpack ? 1 : 0;
        for (; at < n && k < TSL_PACK_MAX; at++, k++) {
            int twice = 0;
            for (int32_t j = 0; j < k; j++)
                twice |= desc.handles[h + j] == pieces[at];
            if (twice)
                break;
            desc.handles[h + k] = pieces[at];
            desc.modes[h + k] = unpack ? STARPU_W : STARPU_R;
            a.offset[k] = offset[at];
        }
        a.n = k;
        int p = unpack ? 0 : k;
        desc.handles[p] = pack;
        desc.modes[p] = unpack ? STARPU_R : first ? STARPU_W : STARPU_RW;
        desc.nhandles = k + 1;
        st = tsl_task_submit(ctx, &desc);
    }
    return st;
}

tsl_status tsl_bucket_create(struct tsl_context *ctx, int32_t n, struct tsl_tensor **grads,
                             struct tsl_bucket **out)
{
    const char *fn = "gradient bucket";
    if (n < 1)
        return tsl_error(ctx, TSL_ERR_INVALID_ARG, "%s: no members", fn);
    for (int32_t i = 0; i < n; i++)
        if (grads[i]->ntiles != 1 || grads[i]->dtype != TSL_F32 || grads[i]->bucket ||
            grads[i]->tile_owner[0] != grads[0]->tile_owner[0])
            return tsl_error(ctx, TSL_ERR_INVALID_ARG,
                             "%s: members must be distinct one-tile f32 tensors of one owner, "
                             "in no other bucket",
                             fn);
    struct tsl_bucket *b = calloc(1, sizeof *b);
    if (b) {
        b->ctx = ctx; /* (first: tsl_bucket_destroy reads it) */
        b->grads = malloc(sizeof *b->grads * (size_t)n);
        b->offset = malloc(sizeof *b->offset * (size_t)(n + 1));
        b->added = calloc((size_t)n, 1);
        b->pack = calloc((size_t)ctx->size, sizeof *b->pack);
    }
    if (!b || !b->grads || !b->offset || !b->added || !b->pack) {
        tsl_bucket_destroy(b);
        return tsl_error(ctx, TSL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    }
    b->n = n;
    b->owner = grads[0]->tile_owner[0];
    b->offset[0] = 0;
    for (int32_t i = 0; i < n; i++) {
        b->grads[i] = grads[i];
        b->offset[i + 1] = b->offset[i] + tsl_shape_numel(&grads[i]->shape);
        grads[i]->bucket = b;
        grads[i]->bucket_member = i;
    }
    for (int32_t i = 0; i < n; i++)
        if (grads[i]->bucket_member != i) {
            tsl_bucket_destroy(b);
            return tsl_error(ctx, TSL_ERR_INVALID_ARG, "%s: a tensor given twice", fn);
        }
    *out = b;
    return TSL_OK;
}

void tsl_bucket_destroy(struct tsl_bucket *b)
{
    if (!b)
        return;
    for (int32_t r = 0; b->pack && r < b->ctx->size; r++)
        if (b->pack[r])
            tsl_temp_handle_release(b->ctx, b->pack[r]);
    for (int32_t i = 0; b->grads && i < b->n; i++)
        if (b->grads[i] && b->grads[i]->bucket == b)
            b->grads[i]->bucket = NULL;
    free(b->grads);
    free(b->offset);
    free(b->added);
    free(b->pack);
    free(b);
}

tsl_status tsl_bucket_add(struct tsl_bucket *b, int32_t member, int64_t n,
                          const starpu_data_handle_t *partials, const int32_t *owner_of)
{
    struct tsl_context *ctx = b->ctx;
    if (member < 0 || member >= b->n || b->added[member])
        return tsl_error(ctx, TSL_ERR_STATE, "gradient bucket: member %d given twice this step",
                         (int)member);
    const int64_t total = b->offset[b->n], len = b->offset[member + 1] - b->offset[member];
    tsl_status st = TSL_OK;
    for (int64_t i = 0; i < n && !st; i++) {
        int32_t q = owner_of[i];
        if (!b->pack[q]) {
            if ((st = tsl_temp_handle_register(ctx, total, sizeof(float), q, &b->pack[q])))
                break;
            tsl_fill_args zero;
            memset(&zero, 0, sizeof zero);
            zero.dtype = TSL_F32;
            zero.mode = TSL_FILL_CONSTANT;
            zero.ndim = 1;
            zero.global_strides[0] = 1;
            zero.extent[0] = total;
            tsl_task_desc desc = {
                .codelet = &tsl_cl_fill,
                .args = &zero,
                .args_size = sizeof zero,
                .nhandles = 1,
                .handles = {b->pack[q]},
                .modes = {STARPU_W},
                .priority = TSL_REDUCE_PRIORITY,
            };
            if ((st = tsl_task_submit(ctx, &desc)))
                break;
        }
        tsl_box_copy_args a = flat_box(sizeof(float), len, 0, total, b->offset[member], len);
        a.accumulate = 1;
        st = box_task(ctx, &a, partials[i], b->pack[q], STARPU_RW, TSL_REDUCE_PRIORITY);
    }
    if (st)
        return st;
    b->added[member] = 1;
    b->nadded++;
    return b->nadded == b->n ? tsl_bucket_reduce(b) : TSL_OK;
}

tsl_status tsl_bucket_reduce(struct tsl_bucket *b)
{
    struct tsl_context *ctx = b->ctx;
    const int32_t nranks = ctx->size;
    const int64_t total = b->offset[b->n];
    starpu_data_handle_t *order = malloc(sizeof *order * (size_t)nranks);
    if (!order)
        return tsl_error(ctx, TSL_ERR_OUT_OF_MEMORY, "gradient bucket: out of memory");
    /* The owner's buffer first: the tree is rooted there (else the sum is copied there). */
    const int own = b->pack[b->owner] != NULL;
    int32_t m = 0;
    for (int32_t j = 0; j < nranks; j++) {
        int32_t q = (b->owner + j) % nranks;
        if (b->pack[q])
            order[m++] = b->pack[q];
        b->pack[q] = NULL;
    }
    tsl_status st = TSL_OK;
    starpu_data_handle_t sum = own ? order[0] : NULL;
    if (m > 0 && !own &&
        (st = tsl_temp_handle_register(ctx, total, sizeof(float), b->owner, &sum))) {
        for (int32_t j = 0; j < m; j++)
            tsl_temp_handle_release(ctx, order[j]);
    } else if (m > 0) {
        st = tsl_tree_sum_into(ctx, order, m, TSL_F32, total, sum, TSL_REDUCE_PRIORITY);
        /* The members given this step, cut out of the sum. */
        starpu_data_handle_t *pieces = malloc(sizeof *pieces * (size_t)b->n);
        int64_t *bytes_at = malloc(sizeof *bytes_at * (size_t)b->n);
        int32_t k = 0;
        if (!st && (!pieces || !bytes_at))
            st = tsl_error(ctx, TSL_ERR_OUT_OF_MEMORY, "gradient bucket: out of memory");
        for (int32_t i = 0; i < b->n && !st; i++)
            if (b->added[i]) {
                pieces[k] = b->grads[i]->handles[0];
                bytes_at[k++] = b->offset[i] * (int64_t)sizeof(float);
            }
        if (!st)
            st = pack_tasks(ctx, 1, sum, k, pieces, bytes_at, TSL_REDUCE_PRIORITY);
        free(pieces);
        free(bytes_at);
        tsl_temp_handle_release(ctx, sum);
    }
    memset(b->added, 0, (size_t)b->n);
    b->nadded = 0;
    free(order);
    return st;
}

tsl_status tsl_bucket_finish(struct tsl_bucket *b)
{
    return b->nadded > 0 ? tsl_bucket_reduce(b) : TSL_OK;
}

/* Whether the pair travels packed: one tile each, one layout, different owners. */
static int packable(const struct tsl_tensor *dst, const struct tsl_tensor *src)
{
    return src->ntiles == 1 && dst->ntiles == 1 && src->layout == dst->layout &&
           src->tile_owner[0] != dst->tile_owner[0];
}

tsl_status tsl_tensors_redistribute(int32_t count, tsl_tensor_t *dst, tsl_tensor_t *src)
{
    const char *fn = "tsl_tensors_redistribute";
    if (count < 0 || (count > 0 && (!dst || !src)))
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "%s: bad count or NULL arrays", fn);
    tsl_status st = TSL_OK;
    for (int32_t i = 0; i < count && !st; i++) {
        if ((st = tsl_tensor_check(dst[i], fn)) || (st = tsl_tensor_check(src[i], fn)))
            break;
        if (dst[i]->ctx != src[i]->ctx || dst[i]->ctx != dst[0]->ctx)
            st = tsl_error(dst[i]->ctx, TSL_ERR_INVALID_ARG, "%s: tensors of different contexts",
                           fn);
        else if (dst[i]->dtype != src[i]->dtype)
            st = tsl_error(dst[i]->ctx, TSL_ERR_DTYPE, "%s: pair %d: dtypes %s and %s differ", fn,
                           (int)i, tsl_dtype_name(dst[i]->dtype), tsl_dtype_name(src[i]->dtype));
        else if (dst[i]->shape.ndim != src[i]->shape.ndim ||
                 memcmp(dst[i]->shape.dims, src[i]->shape.dims, sizeof dst[i]->shape.dims) != 0)
            st = tsl_error(dst[i]->ctx, TSL_ERR_SHAPE, "%s: pair %d: shapes differ", fn, (int)i);
    }
    if (st || count == 0)
        return st;
    struct tsl_context *ctx = dst[0]->ctx;
    int64_t *offset = malloc(sizeof *offset * (size_t)count),
            *at = malloc(sizeof *at * (size_t)count);
    starpu_data_handle_t *pieces = malloc(sizeof *pieces * (size_t)count);
    if (!offset || !at || !pieces) {
        free(offset);
        free(at);
        free(pieces);
        return tsl_error(ctx, TSL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    }
    for (int32_t i = 0; i < count && !st; i++)
        if (!packable(dst[i], src[i]))
            st = tsl_tensor_redistribute(dst[i], src[i]);
    /* Per source rank: each distinct source once in the pack, in order of first use. */
    for (int32_t s = 0; s < ctx->size && !st; s++) {
        int64_t total = 0;
        for (int32_t i = 0; i < count; i++) {
            if (!packable(dst[i], src[i]) || src[i]->tile_owner[0] != s)
                continue;
            offset[i] = -1;
            for (int32_t j = 0; j < i && offset[i] < 0; j++)
                if (src[j] == src[i] && packable(dst[j], src[j]))
                    offset[i] = offset[j];
            if (offset[i] < 0) {
                offset[i] = total;
                total += (int64_t)src[i]->elem_size * tsl_shape_numel(&src[i]->shape);
            }
        }
        if (total == 0)
            continue;
        starpu_data_handle_t pack;
        if ((st = tsl_temp_handle_register(ctx, total, 1, s, &pack)))
            break;
        /* The distinct sources, in the pack's order; then each destination rank's pieces. */
        int32_t k = 0;
        int64_t packed = 0;
        for (int32_t i = 0; i < count; i++)
            if (packable(dst[i], src[i]) && src[i]->tile_owner[0] == s && offset[i] == packed) {
                pieces[k] = src[i]->handles[0];
                at[k++] = offset[i];
                packed += (int64_t)src[i]->elem_size * tsl_shape_numel(&src[i]->shape);
            }
        st = pack_tasks(ctx, 0, pack, k, pieces, at, 0);
        for (int32_t d = 0; d < ctx->size && !st; d++) {
            k = 0;
            for (int32_t i = 0; i < count; i++)
                if (packable(dst[i], src[i]) && src[i]->tile_owner[0] == s &&
                    dst[i]->tile_owner[0] == d) {
                    pieces[k] = dst[i]->handles[0];
                    at[k++] = offset[i];
                }
            st = pack_tasks(ctx, 1, pack, k, pieces, at, 0);
        }
        tsl_temp_handle_release(ctx, pack);
    }
    free(offset);
    free(at);
    free(pieces);
    return st;
}

/* tsl_tensor_sum_rows()'s argument checks. */
static tsl_status sum_rows_check(tsl_tensor_t dst, tsl_tensor_t src, const char *fn)
{
    tsl_status st = tsl_tensor_check(dst, fn);
    if (st || (st = tsl_tensor_check(src, fn)))
        return st;
    struct tsl_context *ctx = dst->ctx;
    if (dst->dtype != TSL_F32)
        return tsl_error(ctx, TSL_ERR_DTYPE, "%s: needs f32, not %s", fn,
                         tsl_dtype_name(dst->dtype));
    if (src->ctx != ctx)
        return tsl_error(ctx, TSL_ERR_INVALID_ARG, "%s: tensors of different contexts", fn);
    if (src->dtype != dst->dtype)
        return tsl_error(ctx, TSL_ERR_DTYPE, "%s: dtypes %s and %s differ", fn,
                         tsl_dtype_name(dst->dtype), tsl_dtype_name(src->dtype));
    if (src->layout != TSL_LAYOUT_PLAIN || dst->layout != TSL_LAYOUT_PLAIN)
        return tsl_error(ctx, TSL_ERR_UNSUPPORTED, "%s: needs plain tiles", fn);
    int ok = src->shape.ndim == dst->shape.ndim + 1 && src->shape.ndim <= TSL_MAX_DIMS &&
             src->grid.splits[0] == src->shape.dims[0];
    for (int d = 0; ok && d < dst->shape.ndim; d++)
        ok = src->shape.dims[d + 1] == dst->shape.dims[d] && src->grid.splits[d + 1] == 1 &&
             (d == 0 || dst->grid.splits[d] == 1);
    if (!ok)
        return tsl_error(ctx, TSL_ERR_SHAPE,
                         "%s: src must be (P, dst's shape...) with one tile per row, and dst cut "
                         "along its first dimension only",
                         fn);
    return TSL_OK;
}

tsl_status tsl_tensor_sum_rows(tsl_tensor_t dst, tsl_tensor_t src)
{
    tsl_status st = sum_rows_check(dst, src, "tsl_tensor_sum_rows");
    return st ? st
              : tsl_sum_into_tiles(dst->ctx, src->ntiles, src->handles, src->tile_owner, dst, 0,
                                   !src->transient);
}

tsl_status tsl_tensors_sum_rows(int32_t count, tsl_tensor_t *dst, tsl_tensor_t *src)
{
    const char *fn = "tsl_tensors_sum_rows";
    if (count < 0 || (count > 0 && (!dst || !src)))
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "%s: bad count or NULL arrays", fn);
    tsl_status st = TSL_OK;
    for (int32_t i = 0; i < count && !st; i++) {
        st = sum_rows_check(dst[i], src[i], fn);
        if (!st && dst[i]->ctx != dst[0]->ctx)
            st = tsl_error(dst[i]->ctx, TSL_ERR_INVALID_ARG, "%s: tensors of different contexts",
                           fn);
        for (int32_t j = 0; j < i && !st; j++)
            if (dst[j] == dst[i])
                st = tsl_error(dst[i]->ctx, TSL_ERR_INVALID_ARG, "%s: destination %d is also %d",
                               fn, (int)i, (int)j);
    }
    if (st || count == 0)
        return st;
    struct tsl_context *ctx = dst[0]->ctx;
    struct tsl_tensor **members = malloc(sizeof *members * (size_t)count);
    int32_t *index = malloc(sizeof *index * (size_t)count);
    if (!members || !index) {
        free(members);
        free(index);
        return tsl_error(ctx, TSL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    }
    for (int32_t i = 0; i < count && !st; i++)
        if (dst[i]->ntiles > 1)
            st = tsl_sum_into_tiles(ctx, src[i]->ntiles, src[i]->handles, src[i]->tile_owner,
                                    dst[i], 0, !src[i]->transient);
    for (int32_t owner = 0; owner < ctx->size && !st; owner++) {
        int32_t n = 0;
        for (int32_t i = 0; i < count; i++)
            if (dst[i]->ntiles == 1 && dst[i]->tile_owner[0] == owner) {
                index[n] = i;
                members[n++] = dst[i];
            }
        struct tsl_bucket *b = NULL;
        if (n == 0 || (st = tsl_bucket_create(ctx, n, members, &b)))
            continue;
        for (int32_t k = 0; k < n && !st; k++) /* the last one reduces */
            st = tsl_bucket_add(b, k, src[index[k]]->ntiles, src[index[k]]->handles,
                                src[index[k]]->tile_owner);
        tsl_bucket_destroy(b);
    }
    free(members);
    free(index);
    return st;
}
