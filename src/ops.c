/* Elementwise tensor ops and the exact sum, lowered to tile tasks. */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "../codelets/tile_ops.h"
#include "internal.h"

/* One task per tile of `out`, reading the same tile of each distinct input and writing
 * `out` with `out_mode`. */
static tsl_status submit_elementwise(struct starpu_codelet *codelet, tsl_tensor_t out,
                                     enum starpu_data_access_mode out_mode,
                                     const tsl_tensor_t *inputs, int ninputs, double alpha,
                                     double flops_per_element)
{
    tsl_tensor_t tensors[TSL_TASK_MAX_HANDLES];
    enum starpu_data_access_mode modes[TSL_TASK_MAX_HANDLES];
    for (int k = 0; k < ninputs; k++) {
        tensors[k] = inputs[k];
        modes[k] = STARPU_R;
    }
    tensors[ninputs] = out;
    modes[ninputs] = out_mode;
    tsl_elementwise_args args = {.dtype = out->dtype, .alpha = alpha};
    return tsl_submit_tiles(codelet, ninputs + 1, tensors, modes, &args, sizeof args,
                            offsetof(tsl_elementwise_args, count), flops_per_element);
}

tsl_status tsl_tensor_scale(tsl_tensor_t x, double alpha)
{
    tsl_status st = tsl_tensor_check(x, "tsl_tensor_scale");
    if (st || (st = tsl_tensor_check_float(x, "tsl_tensor_scale")))
        return st;
    return submit_elementwise(&tsl_cl_scale, x, STARPU_RW, NULL, 0, alpha, 1.0);
}

tsl_status tsl_tensor_axpy(tsl_tensor_t y, double alpha, tsl_tensor_t x)
{
    tsl_status st = tsl_tensor_check(y, "tsl_tensor_axpy");
    if (st || (st = tsl_tensor_check(x, "tsl_tensor_axpy")) ||
        (st = tsl_tensor_check_same_layout(y, x, "tsl_tensor_axpy")) ||
        (st = tsl_tensor_check_float(y, "tsl_tensor_axpy")))
        return st;
    if (x == y)
        return tsl_tensor_scale(y, 1.0 + alpha);
    return submit_elementwise(&tsl_cl_axpy, y, STARPU_RW, &x, 1, alpha, 2.0);
}

tsl_status tsl_tensor_add(tsl_tensor_t dst, tsl_tensor_t a, tsl_tensor_t b)
{
    tsl_status st = tsl_tensor_check(dst, "tsl_tensor_add");
    if (st || (st = tsl_tensor_check(a, "tsl_tensor_add")) ||
        (st = tsl_tensor_check(b, "tsl_tensor_add")) ||
        (st = tsl_tensor_check_same_layout(dst, a, "tsl_tensor_add")) ||
        (st = tsl_tensor_check_same_layout(dst, b, "tsl_tensor_add")) ||
        (st = tsl_tensor_check_float(dst, "tsl_tensor_add")))
        return st;
    /* dst may alias a or b: then the task reads and writes it. */
    const tsl_tensor_t inputs[2] = {a, b};
    return submit_elementwise(&tsl_cl_add, dst, dst == a || dst == b ? STARPU_RW : STARPU_W, inputs,
                              2, 1.0, 1.0);
}

tsl_status tsl_tensor_sum(tsl_tensor_t t, double *sum)
{
    tsl_status st = tsl_tensor_check(t, "tsl_tensor_sum");
    if (st)
        return st;
    struct tsl_context *ctx = t->ctx;
    if (!sum)
        return tsl_error(ctx, TSL_ERR_INVALID_ARG, "tsl_tensor_sum: sum is NULL");
    if (t->dtype == TSL_I64)
        return tsl_error(ctx, TSL_ERR_DTYPE,
                         "tsl_tensor_sum: i64 elements may not be exact as doubles; convert first");
    if (ctx->tag_count - ctx->tags_used < t->ntiles)
        return tsl_error(ctx, TSL_ERR_RESOURCE, "tsl_tensor_sum: StarPU-MPI tags exhausted");
    starpu_data_handle_t *acc = calloc((size_t)t->ntiles, sizeof *acc);
    if (!acc)
        return tsl_error(ctx, TSL_ERR_OUT_OF_MEMORY, "tsl_tensor_sum: out of memory");
    const int64_t acc_words = (int64_t)(sizeof(tsl_acc) / sizeof(int64_t));
    _Static_assert(sizeof(tsl_acc) % sizeof(int64_t) == 0, "accumulator is whole words");

    /* One accumulator per tile, on the tile's owner. */
    for (int64_t i = 0; i < t->ntiles && !st; i++) {
        if ((st = tsl_temp_handle_register(ctx, acc_words, sizeof(int64_t), t->tile_owner[i],
                                           &acc[i])))
            break;
        tsl_sum_args args = {.dtype = t->dtype, .count = tsl_tensor_tile_numel(t, i)};
        tsl_task_desc desc = {
            .codelet = &tsl_cl_sum_partial,
            .args = &args,
            .args_size = sizeof args,
            .nhandles = 2,
            .handles = {t->handles[i], acc[i]},
            .modes = {STARPU_R, STARPU_W},
            .flops = (double)args.count,
        };
        st = tsl_task_submit(ctx, &desc);
    }
    /* Pairwise merge tree: level by level, acc[i] absorbs acc[i + step]. */
    for (int64_t step = 1; step < t->ntiles && !st; step *= 2) {
        for (int64_t i = 0; i + step < t->ntiles && !st; i += 2 * step) {
            char unused = 0;
            tsl_task_desc desc = {
                .codelet = &tsl_cl_sum_merge,
                .args = &unused,
                .args_size = sizeof unused,
                .nhandles = 2,
                .handles = {acc[i + step], acc[i]},
                .modes = {STARPU_R, STARPU_RW},
                .flops = TSL_ACC_LIMBS,
            };
            st = tsl_task_submit(ctx, &desc);
            tsl_temp_handle_release(ctx, acc[i + step]);
            acc[i + step] = NULL;
        }
    }
    if (!st) {
        starpu_mpi_get_data_on_all_nodes_detached(ctx->comm, acc[0]);
        starpu_data_acquire(acc[0], STARPU_R);
        *sum = tsl_acc_round((const tsl_acc *)starpu_data_get_local_ptr(acc[0]));
        starpu_data_release(acc[0]);
    }
    for (int64_t i = 0; i < t->ntiles; i++)
        if (acc[i])
            tsl_temp_handle_release(ctx, acc[i]);
    free(acc);
    return st;
}
