/* Elementwise tensor ops and the exact sum, lowered to tile tasks. */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "codelets/elementwise.h"
#include "codelets/reduce.h"
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

/* dst = alpha a + b (tsl_cl_add) or a b (tsl_cl_mul), checked as `fn`. */
static tsl_status binary(struct starpu_codelet *codelet, tsl_tensor_t dst, double alpha,
                         tsl_tensor_t a, tsl_tensor_t b, const char *fn)
{
    tsl_status st = tsl_tensor_check(dst, fn);
    if (st || (st = tsl_tensor_check(a, fn)) || (st = tsl_tensor_check(b, fn)) ||
        (st = tsl_tensor_check_same_layout(dst, a, fn)) ||
        (st = tsl_tensor_check_same_layout(dst, b, fn)) || (st = tsl_tensor_check_float(dst, fn)))
        return st;
    /* dst may alias a or b: then the task reads and writes it. */
    const tsl_tensor_t inputs[2] = {a, b};
    return submit_elementwise(codelet, dst, dst == a || dst == b ? STARPU_RW : STARPU_W, inputs, 2,
                              alpha, codelet == &tsl_cl_add && alpha != 1.0 ? 2.0 : 1.0);
}

tsl_status tsl_tensor_add(tsl_tensor_t dst, tsl_tensor_t a, tsl_tensor_t b)
{
    return binary(&tsl_cl_add, dst, 1.0, a, b, "tsl_tensor_add");
}

tsl_status tsl_tensor_add_scaled(tsl_tensor_t dst, double alpha, tsl_tensor_t a, tsl_tensor_t b)
{
    return binary(&tsl_cl_add, dst, alpha, a, b, "tsl_tensor_add_scaled");
}

tsl_status tsl_tensor_mul(tsl_tensor_t dst, tsl_tensor_t a, tsl_tensor_t b)
{
    return binary(&tsl_cl_mul, dst, 1.0, a, b, "tsl_tensor_mul");
}

tsl_status tsl_dropout_apply(tsl_tensor_t dst, tsl_tensor_t x, tsl_tensor_t u, double p)
{
    const char *fn = "dropout";
    tsl_status st = tsl_tensor_check(dst, fn);
    if (st || (st = tsl_tensor_check(x, fn)) || (st = tsl_tensor_check(u, fn)) ||
        (st = tsl_tensor_check_same_layout(dst, x, fn)) ||
        (st = tsl_tensor_check_same_layout(dst, u, fn)))
        return st;
    if (dst->dtype != TSL_F32 || x->dtype != TSL_F32 || u->dtype != TSL_F32 || !(p >= 0 && p < 1))
        return tsl_error(dst->ctx, TSL_ERR_INVALID_ARG, "%s: f32 tensors and p in [0, 1)", fn);
    const tsl_tensor_t inputs[2] = {x, u};
    return submit_elementwise(&tsl_cl_dropout, dst, dst == x ? STARPU_RW : STARPU_W, inputs, 2, p,
                              1.0);
}

/* The partial task of tile `tile`: sum the tile into its accumulator. */
static tsl_status sum_tile(int64_t tile, starpu_data_handle_t acc, void *user)
{
    tsl_tensor_t t = user;
    tsl_sum_args args = {.dtype = t->dtype, .count = tsl_tensor_tile_numel(t, tile)};
    tsl_task_desc desc = {
        .codelet = &tsl_cl_sum_partial,
        .args = &args,
        .args_size = sizeof args,
        .nhandles = 2,
        .handles = {t->handles[tile], acc},
        .modes = {STARPU_R, STARPU_W},
        .flops = (double)args.count,
    };
    return tsl_task_submit(t->ctx, &desc);
}

tsl_status tsl_tensor_sum(tsl_tensor_t t, double *sum)
{
    tsl_status st = tsl_tensor_check(t, "tsl_tensor_sum");
    if (st)
        return st;
    if (!sum)
        return tsl_error(t->ctx, TSL_ERR_INVALID_ARG, "tsl_tensor_sum: sum is NULL");
    if (t->dtype == TSL_I64)
        return tsl_error(t->ctx, TSL_ERR_DTYPE,
                         "tsl_tensor_sum: i64 elements may not be exact as doubles; convert first");
    tsl_acc total;
    if ((st = tsl_exact_reduce(t->ctx, t->ntiles, t->tile_owner, sum_tile, t, &total)))
        return st;
    *sum = tsl_acc_round(&total);
    return TSL_OK;
}
