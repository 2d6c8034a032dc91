/* Exact reductions over tiles: one accumulator per tile on a chosen rank, a tree of merge
 * tasks, and the merged accumulator read on every rank. Sums of partials by task trees and
 * into the tiles of a tensor (what bucket.c builds on; nothing here calls the buckets). */
#include <stdlib.h>
#include <string.h>

#include "codelets/copy.h"
#include "codelets/elementwise.h"
#include "codelets/reduce.h"
#include "internal.h"
#include "plan_internal.h"
#include "tessel/tensor.h"

/* tessel plan's traffic estimate counts accumulators by this size. */
_Static_assert(sizeof(tsl_acc) == TSL_PLAN_ACC_BYTES, "TSL_PLAN_ACC_BYTES is sizeof(tsl_acc)");

/* dst (an accumulator of `accs` sums) absorbs src, exactly. */
static tsl_status acc_merge(struct tsl_context *ctx, starpu_data_handle_t src,
                            starpu_data_handle_t dst, int64_t accs)
{
    char unused = 0;
    tsl_task_desc desc = {
        .codelet = &tsl_cl_sum_merge,
        .args = &unused,
        .args_size = sizeof unused,
        .nhandles = 2,
        .handles = {src, dst},
        .modes = {STARPU_R, STARPU_RW},
        .flops = (double)(accs * TSL_ACC_LIMBS),
    };
    return tsl_task_submit(ctx, &desc);
}

/* A rank's own tiles as a list of their own (tsl_acc_allreduce_submit): fill through the
 * tile numbers of the whole. */
typedef struct tsl_acc_map {
    const int64_t *tiles;
    tsl_acc_fill_fn fill;
    void *user;
} tsl_acc_map;

static tsl_status acc_map_fill(int64_t k, starpu_data_handle_t acc, void *user)
{
    tsl_acc_map *map = user;
    return map->fill(map->tiles[k], acc, map->user);
}

tsl_status tsl_acc_tree_submit(struct tsl_context *ctx, int64_t ntiles, const int32_t *owner_of,
                               int64_t accs, tsl_acc_fill_fn fill, void *user,
                               starpu_data_handle_t *result)
{
    if (ctx->tag_count - ctx->tags_used < ntiles)
        return tsl_error(ctx, TSL_ERR_RESOURCE,
                         "exact reduction over %lld tiles: StarPU-MPI tags exhausted",
                         (long long)ntiles);
    starpu_data_handle_t *acc = calloc((size_t)ntiles, sizeof *acc);
    if (!acc)
        return tsl_error(ctx, TSL_ERR_OUT_OF_MEMORY, "exact reduction: out of memory");
    _Static_assert(sizeof(tsl_acc) % sizeof(int64_t) == 0, "accumulator is whole words");
    const int64_t words = accs * (int64_t)(sizeof(tsl_acc) / sizeof(int64_t));
    tsl_status st = TSL_OK;
    for (int64_t i = 0; i < ntiles && !st; i++) {
        if ((st = tsl_temp_handle_register(ctx, words, sizeof(int64_t), owner_of[i], &acc[i])))
            break;
        st = fill(i, acc[i], user);
    }
    /* Pairwise merge tree: level by level, acc[i] absorbs acc[i + step]. */
    for (int64_t step = 1; step < ntiles && !st; step *= 2) {
        for (int64_t i = 0; i + step < ntiles && !st; i += 2 * step) {
            st = acc_merge(ctx, acc[i + step], acc[i], accs);
            tsl_temp_handle_release(ctx, acc[i + step]);
            acc[i + step] = NULL;
        }
    }
    if (!st) {
        *result = acc[0];
        acc[0] = NULL;
    }
    for (int64_t i = 0; i < ntiles; i++)
        if (acc[i])
            tsl_temp_handle_release(ctx, acc[i]);
    free(acc);
    return st;
}

/* Up to this many ranks with tiles, every rank that needs the sum merges the ranks' partial
 * accumulators itself (one hop); beyond, one tree and a copy to each (two hops, fewer
 * messages). TSL_ACC_DIRECT_RANKS in the environment overrides it (the tests force the tree
 * with 1). */
static int32_t acc_direct_ranks(void)
{
    const char *env = getenv("TSL_ACC_DIRECT_RANKS");
    return env && *env ? (int32_t)atoi(env) : 8;
}

tsl_status tsl_acc_allreduce_submit(struct tsl_context *ctx, int64_t ntiles,
                                    const int32_t *owner_of, int64_t accs, tsl_acc_fill_fn fill,
                                    void *user, const uint8_t *need, starpu_data_handle_t *totals)
{
    const int32_t nranks = ctx->size;
    for (int32_t r = 0; r < nranks; r++)
        totals[r] = NULL;
    _Static_assert(sizeof(tsl_acc) % sizeof(int64_t) == 0, "accumulator is whole words");
    const int64_t words = accs * (int64_t)(sizeof(tsl_acc) / sizeof(int64_t));
    int32_t holders = 0;
    uint8_t *has = calloc((size_t)nranks, 1);
    if (!has)
        return tsl_error(ctx, TSL_ERR_OUT_OF_MEMORY, "exact reduction: out of memory");
    for (int64_t i = 0; i < ntiles; i++)
        holders += !has[owner_of[i]]++;
    if (ctx->tag_count - ctx->tags_used < ntiles + nranks) {
        free(has);
        return tsl_error(ctx, TSL_ERR_RESOURCE,
                         "exact reduction over %lld tiles: StarPU-MPI tags exhausted",
                         (long long)ntiles);
    }
    tsl_status st = TSL_OK;
    char unused = 0;
    tsl_task_desc copy = {.codelet = &tsl_cl_copy,
                          .args = &unused,
                          .args_size = sizeof unused,
                          .nhandles = 2,
                          .modes = {STARPU_R, STARPU_W}};
    if (holders > acc_direct_ranks()) {
        starpu_data_handle_t total = NULL;
        st = tsl_acc_tree_submit(ctx, ntiles, owner_of, accs, fill, user, &total);
        for (int32_t r = 0; r < nranks && !st; r++) {
            if (!need[r])
                continue;
            if ((st = tsl_temp_handle_register(ctx, words, sizeof(int64_t), r, &totals[r])))
                break;
            copy.handles[0] = total;
            copy.handles[1] = totals[r];
            st = tsl_task_submit(ctx, &copy);
        }
        if (total)
            tsl_temp_handle_release(ctx, total);
        free(has);
        return st;
    }
    /* Each rank's tiles merged on it (a pairwise tree of its own), then every rank that needs
     * the sum merges the ranks' partials in rank order: the accumulators are exact, so every
     * rank gets the same sum. */
    int64_t *mine = malloc(sizeof *mine * (size_t)(ntiles + 1));
    starpu_data_handle_t *part = calloc((size_t)nranks, sizeof *part);
    int32_t *own = malloc(sizeof *own * (size_t)(ntiles + 1));
    if (!mine || !part || !own)
        st = tsl_error(ctx, TSL_ERR_OUT_OF_MEMORY, "exact reduction: out of memory");
    for (int32_t q = 0; q < nranks && !st; q++) {
        int64_t n = 0;
        for (int64_t i = 0; i < ntiles; i++)
            if (owner_of[i] == q) {
                mine[n] = i;
                own[n++] = q;
            }
        if (n == 0)
            continue;
        tsl_acc_map map = {.tiles = mine, .fill = fill, .user = user};
        st = tsl_acc_tree_submit(ctx, n, own, accs, acc_map_fill, &map, &part[q]);
    }
    for (int32_t r = 0; r < nranks && !st; r++) {
        if (!need[r])
            continue;
        if ((st = tsl_temp_handle_register(ctx, words, sizeof(int64_t), r, &totals[r])))
            break;
        /* Start from the rank's own partial where it has one (no message). */
        int32_t first = part[r] ? r : -1;
        for (int32_t q = 0; first < 0 && q < nranks; q++)
            if (part[q])
                first = q;
        copy.handles[0] = part[first];
        copy.handles[1] = totals[r];
        st = tsl_task_submit(ctx, &copy);
        for (int32_t q = 0; q < nranks && !st; q++) {
            if (!part[q] || q == first)
                continue;
            st = acc_merge(ctx, part[q], totals[r], accs);
        }
    }
    for (int32_t q = 0; part && q < nranks; q++)
        if (part[q])
            tsl_temp_handle_release(ctx, part[q]);
    free(mine);
    free(part);
    free(own);
    free(has);
    return st;
}

tsl_status tsl_exact_reduce(struct tsl_context *ctx, int64_t ntiles, const int32_t *owner_of,
                            tsl_acc_fill_fn fill, void *user, tsl_acc *out)
{
    starpu_data_handle_t total;
    tsl_status st = tsl_acc_tree_submit(ctx, ntiles, owner_of, 1, fill, user, &total);
    if (st)
        return st;
    starpu_mpi_get_data_on_all_nodes_detached(ctx->comm, total);
    starpu_data_acquire(total, STARPU_R);
    memcpy(out, starpu_data_get_local_ptr(total), sizeof *out);
    starpu_data_release(total);
    tsl_temp_handle_release(ctx, total);
    return TSL_OK;
}

/* tsl_tree_sum_into, where partials[0] may be unwritten yet: it then becomes the box `init` of
 * `init_src` plus partials[1] in one task (tsl_box_add), sparing a pass over the piece. */
static tsl_status tree_sum(struct tsl_context *ctx, starpu_data_handle_t *partials, int64_t count,
                           tsl_dtype dtype, int64_t elements, starpu_data_handle_t target,
                           int priority, starpu_data_handle_t init_src,
                           const tsl_box_copy_args *init)
{
    tsl_status st = TSL_OK;
    tsl_elementwise_args args = {.dtype = dtype, .count = elements, .alpha = 1.0};
    if (init_src) {
        tsl_task_desc desc = {
            .codelet = &tsl_cl_box_copy,
            .args = init,
            .args_size = sizeof *init,
            .nhandles = count > 1 ? 3 : 2,
            .handles = {init_src, partials[0], count > 1 ? partials[1] : NULL},
            .modes = {STARPU_R, STARPU_W, STARPU_R},
            .flops = count > 1 ? (double)elements : 0,
            .priority = priority,
        };
        st = tsl_task_submit(ctx, &desc);
    }
    for (int64_t step = 1; step < count && !st; step *= 2) {
        for (int64_t i = init_src && step == 1 ? 2 : 0; i + step < count && !st; i += 2 * step) {
            tsl_task_desc desc = {
                .codelet = &tsl_cl_axpy,
                .args = &args,
                .args_size = sizeof args,
                .nhandles = 2,
                .handles = {partials[i + step], partials[i]},
                .modes = {STARPU_R, STARPU_RW},
                .flops = (double)elements,
                .priority = priority,
            };
            st = tsl_task_submit(ctx, &desc);
        }
    }
    if (!st && partials[0] != target) {
        char unused = 0;
        tsl_task_desc copy = {
            .codelet = &tsl_cl_copy,
            .args = &unused,
            .args_size = sizeof unused,
            .nhandles = 2,
            .handles = {partials[0], target},
            .modes = {STARPU_R, STARPU_W},
            .priority = priority,
        };
        st = tsl_task_submit(ctx, &copy);
    }
    for (int64_t i = 0; i < count; i++)
        if (partials[i] != target)
            tsl_temp_handle_release(ctx, partials[i]);
    return st;
}

tsl_status tsl_tree_sum_into(struct tsl_context *ctx, starpu_data_handle_t *partials, int64_t count,
                             tsl_dtype dtype, int64_t elements, starpu_data_handle_t target,
                             int priority)
{
    return tree_sum(ctx, partials, count, dtype, elements, target, priority, NULL, NULL);
}

int64_t tsl_first_owned(const int32_t *owner_of, int64_t n, int32_t owner)
{
    for (int64_t i = 0; i < n; i++)
        if (owner_of[i] == owner)
            return i;
    return -1;
}

void tsl_rooted_order(const int32_t *owner_of, int64_t n, int32_t owner,
                      const starpu_data_handle_t *partials, starpu_data_handle_t *out)
{
    int64_t root = tsl_first_owned(owner_of, n, owner);
    root = root < 0 ? 0 : root;
    for (int64_t i = 0; i < n; i++)
        out[i] = partials[(root + i) % n];
}

/* One partial per rank, at most. */
static int one_partial_per_rank(const int32_t *owner_of, int64_t n, int32_t nranks)
{
    uint8_t *seen = calloc((size_t)nranks, 1);
    int ok = seen != NULL;
    for (int64_t i = 0; i < n && ok; i++) {
        ok = !seen[owner_of[i]];
        seen[owner_of[i]] = 1;
    }
    free(seen);
    return ok;
}

static tsl_status submit_sum_task(struct tsl_context *ctx, struct starpu_codelet *cl, int nhandles,
                                  starpu_data_handle_t a, starpu_data_handle_t b,
                                  starpu_data_handle_t c, enum starpu_data_access_mode last,
                                  const tsl_elementwise_args *args, int priority)
{
    tsl_task_desc desc = {
        .codelet = cl,
        .args = args,
        .args_size = sizeof *args,
        .nhandles = nhandles,
        .handles = {a, b, c},
        .modes = {STARPU_R, nhandles == 3 ? STARPU_R : last, last},
        .flops = cl == &tsl_cl_copy ? 0 : (double)args->count,
        .priority = priority,
    };
    return tsl_task_submit(ctx, &desc);
}

/* tsl_sum_into_tiles when every rank holds one partial: each partial is partitioned on its
 * rank into one piece per destination tile (views of its memory: nothing is cut out), every
 * piece goes straight to the tile's owner, which adds the pieces into the tile (its own
 * piece plus the first received in one task, then one add per received piece). Other ranks
 * hold a stand-in handle of each piece with the same tag. */
static tsl_status sum_views(struct tsl_context *ctx, int64_t n,
                            const starpu_data_handle_t *partials, const int32_t *owner_of,
                            struct tsl_tensor *dst, int priority)
{
    const int64_t nt = dst->ntiles;
    const int32_t nranks = ctx->size;
    starpu_data_handle_t *piece = calloc((size_t)(n * nt), sizeof *piece);
    uint32_t *lengths = calloc((size_t)nt, sizeof *lengths);
    int64_t *of_rank = malloc((size_t)nranks * sizeof *of_rank);
    if (!piece || !lengths || !of_rank) {
        free(piece);
        free(lengths);
        free(of_rank);
        return tsl_error(ctx, TSL_ERR_OUT_OF_MEMORY, "sum into tiles: out of memory");
    }
    for (int64_t k = 0; k < nt; k++)
        lengths[k] = (uint32_t)tsl_tensor_tile_numel(dst, k);
    for (int32_t r = 0; r < nranks; r++)
        of_rank[r] = -1;
    tsl_status st = TSL_OK;
    for (int64_t i = 0; i < n && !st; i++) {
        int32_t q = owner_of[i];
        of_rank[q] = i;
        if (q == ctx->rank)
            tsl_views_begin(partials[i], nt, lengths, piece + i * nt);
        for (int64_t k = 0; k < nt && !st; k++) {
            int64_t tag;
            if ((st = tsl_context_next_tag(ctx, &tag)))
                break;
            if (q != ctx->rank)
                starpu_vector_data_register(&piece[i * nt + k], -1, 0, lengths[k], dst->elem_size);
            starpu_mpi_data_register_comm(piece[i * nt + k], tag, q, ctx->comm);
        }
    }
    tsl_elementwise_args args = {.dtype = dst->dtype, .alpha = 1.0};
    starpu_data_handle_t *list = malloc((size_t)n * sizeof *list);
    if (!list && !st)
        st = tsl_error(ctx, TSL_ERR_OUT_OF_MEMORY, "sum into tiles: out of memory");
    for (int64_t k = 0; k < nt && !st; k++) {
        /* The owner's piece first, then the other ranks' after the owner, in turn. */
        int32_t owner = dst->tile_owner[k];
        int64_t m = 0;
        for (int32_t j = 0; j < nranks; j++) {
            int32_t q = (owner + j) % nranks;
            if (of_rank[q] >= 0)
                list[m++] = piece[of_rank[q] * nt + k];
        }
        args.count = lengths[k];
        st = m == 1 ? submit_sum_task(ctx, &tsl_cl_copy, 2, list[0], dst->handles[k], NULL,
                                      STARPU_W, &args, priority)
                    : submit_sum_task(ctx, &tsl_cl_add, 3, list[0], list[1], dst->handles[k],
                                      STARPU_W, &args, priority);
        for (int64_t j = 2; j < m && !st; j++)
            st = submit_sum_task(ctx, &tsl_cl_axpy, 2, list[j], dst->handles[k], NULL, STARPU_RW,
                                 &args, priority);
    }
    free(list);
    for (int64_t i = 0; i < n; i++) {
        for (int64_t k = 0; k < nt; k++) {
            starpu_data_handle_t h = piece[i * nt + k];
            if (!h)
                continue;
            tsl_cache_flush(ctx, h);
            if (owner_of[i] != ctx->rank)
                starpu_data_unregister_submit(h);
        }
        if (owner_of[i] == ctx->rank && piece[i * nt])
            tsl_views_end(partials[i], nt, piece + i * nt);
    }
    free(piece);
    free(lengths);
    free(of_rank);
    return st;
}

tsl_status tsl_sum_into_tiles(struct tsl_context *ctx, int64_t n,
                              const starpu_data_handle_t *partials, const int32_t *owner_of,
                              struct tsl_tensor *dst, int priority, int views)
{
    const int32_t nranks = ctx->size;
    if (ctx->tag_count - ctx->tags_used < (int64_t)(nranks > n ? nranks : n) * dst->ntiles)
        return tsl_error(ctx, TSL_ERR_RESOURCE, "sum into tiles: StarPU-MPI tags exhausted");
    if (views && n > 1 && dst->ntiles > 1 && one_partial_per_rank(owner_of, n, nranks) &&
        tsl_views_enabled())
        return sum_views(ctx, n, partials, owner_of, dst, priority);
    starpu_data_handle_t *local = calloc((size_t)nranks, sizeof *local);
    starpu_data_handle_t *order = calloc((size_t)nranks, sizeof *order);
    if (!local || !order) {
        free(local);
        free(order);
        return tsl_error(ctx, TSL_ERR_OUT_OF_MEMORY, "sum into tiles: out of memory");
    }
    const int64_t numel = tsl_shape_numel(&dst->shape), row = numel / dst->shape.dims[0];
    tsl_status st = TSL_OK;
    tsl_box_copy_args init;
    for (int64_t k = 0; k < dst->ntiles && !st; k++) {
        int64_t start[TSL_MAX_DIMS], extent[TSL_MAX_DIMS];
        tsl_tensor_tile_box(dst, k, start, extent);
        int64_t len = tsl_tensor_tile_numel(dst, k);
        int32_t owner = dst->tile_owner[k];
        tsl_box_copy_args a;
        memset(&a, 0, sizeof a);
        a.ndim = 1;
        a.elem_size = (int32_t)dst->elem_size;
        a.src_extent[0] = numel;
        a.src_offset[0] = start[0] * row;
        a.dst_extent[0] = a.box[0] = len;
        /* Per rank, the pieces of its partials are added where they live (into the tile
         * itself on its owner, else into one temporary), starting from the owner's first
         * partial; then the ranks' sums meet by a tree rooted at the owner. */
        memset(local, 0, (size_t)nranks * sizeof *local);
        int32_t m = 0;
        int64_t first = tsl_first_owned(owner_of, n, owner), own = 0;
        first = first < 0 ? 0 : first;
        for (int64_t i = 0; i < n; i++)
            own += owner_of[i] == owner;
        /* The owner's one partial and the first sum received make the tile in one task. */
        starpu_data_handle_t init_src = NULL;
        for (int64_t j = 0; j < n && !st; j++) {
            int64_t i = (first + j) % n;
            int32_t q = owner_of[i];
            a.accumulate = local[q] != NULL;
            if (!local[q]) {
                if (q == owner)
                    local[q] = dst->handles[k];
                else if ((st = tsl_temp_handle_register(ctx, len, dst->elem_size, q, &local[q])))
                    break;
                order[m++] = local[q];
                if (q == owner && own == 1 && own < n) {
                    init = a;
                    init_src = partials[i];
                    continue;
                }
            }
            tsl_task_desc desc = {
                .codelet = &tsl_cl_box_copy,
                .args = &a,
                .args_size = sizeof a,
                .nhandles = 2,
                .handles = {partials[i], local[q]},
                .modes = {STARPU_R, a.accumulate ? STARPU_RW : STARPU_W},
                .flops = a.accumulate ? (double)len : 0,
                .priority = priority,
            };
            st = tsl_task_submit(ctx, &desc);
        }
        if (!st) /* (ends with a copy to the owner when it has no partial) */
            st = tree_sum(ctx, order, m, dst->dtype, len, dst->handles[k], priority, init_src,
                          &init);
        else
            for (int32_t q = 0; q < nranks; q++)
                if (local[q] && local[q] != dst->handles[k])
                    tsl_temp_handle_release(ctx, local[q]);
    }
    free(local);
    free(order);
    return st;
}
