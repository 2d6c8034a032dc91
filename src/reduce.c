/* Exact reductions over tiles: one accumulator per tile on a chosen rank, a tree of merge
 * tasks, and the merged accumulator read on every rank. */
#include <stdlib.h>
#include <string.h>

#include "../codelets/tile_ops.h"
#include "internal.h"

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
            char unused = 0;
            tsl_task_desc desc = {
                .codelet = &tsl_cl_sum_merge,
                .args = &unused,
                .args_size = sizeof unused,
                .nhandles = 2,
                .handles = {acc[i + step], acc[i]},
                .modes = {STARPU_R, STARPU_RW},
                .flops = (double)(accs * TSL_ACC_LIMBS),
            };
            st = tsl_task_submit(ctx, &desc);
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

tsl_status tsl_tree_sum_into(struct tsl_context *ctx, starpu_data_handle_t *partials, int64_t count,
                             tsl_dtype dtype, int64_t elements, starpu_data_handle_t target,
                             int priority)
{
    tsl_status st = TSL_OK;
    tsl_elementwise_args args = {.dtype = dtype, .count = elements, .alpha = 1.0};
    for (int64_t step = 1; step < count && !st; step *= 2) {
        for (int64_t i = 0; i + step < count && !st; i += 2 * step) {
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
