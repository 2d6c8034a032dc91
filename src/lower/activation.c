/* Activations on tiled tensors: one task per tile. */
#include <math.h>
#include <stddef.h>

#include "codelets/activation.h"
#include "internal.h"
#include "op_table.h"

static tsl_status check_kind(struct tsl_context *ctx, tsl_activation kind, double slope,
                             const char *fn)
{
    const tsl_activation_info *info = tsl_activation_info_of(kind);
    if (!info)
        return tsl_error(ctx, TSL_ERR_INVALID_ARG, "%s: unknown activation %d", fn, (int)kind);
    if (info->takes_slope && !isfinite(slope))
        return tsl_error(ctx, TSL_ERR_INVALID_ARG, "%s: slope must be finite", fn);
    return TSL_OK;
}

tsl_status tsl_activation_forward(tsl_activation kind, double slope, tsl_tensor_t x, tsl_tensor_t y)
{
    const char *fn = "tsl_activation_forward";
    tsl_status st = tsl_tensor_check(x, fn);
    if (st || (st = tsl_tensor_check(y, fn)) || (st = check_kind(x->ctx, kind, slope, fn)) ||
        (st = tsl_tensor_check_float(x, fn)) || (st = tsl_tensor_check_same_layout(y, x, fn)))
        return st;
    tsl_act_args args = {.kind = kind, .dtype = x->dtype, .slope = slope, .in_place = x == y};
    tsl_tensor_t tensors[2] = {x, y};
    enum starpu_data_access_mode modes[2] = {STARPU_R, STARPU_W};
    if (x == y)
        modes[0] = STARPU_RW;
    return tsl_submit_tiles(&tsl_cl_act_forward, x == y ? 1 : 2, tensors, modes, &args, sizeof args,
                            offsetof(tsl_act_args, count),
                            tsl_activation_info_of(kind)->forward_flops);
}

tsl_status tsl_activation_backward(tsl_activation kind, double slope, tsl_tensor_t x,
                                   tsl_tensor_t y, tsl_tensor_t dy, tsl_tensor_t dx)
{
    const char *fn = "tsl_activation_backward";
    tsl_status st = tsl_tensor_check(dy, fn);
    if (st || (st = tsl_tensor_check(dx, fn)) || (st = check_kind(dy->ctx, kind, slope, fn)))
        return st;
    const tsl_activation_info *info = tsl_activation_info_of(kind);
    tsl_tensor_t saved = info->backward_reads_output ? y : x;
    if (!saved)
        return tsl_error(dy->ctx, TSL_ERR_INVALID_ARG, "%s: %s needs the forward %s", fn,
                         info->name, info->backward_reads_output ? "output y" : "input x");
    if ((st = tsl_tensor_check_float(dy, fn)) || (st = tsl_tensor_check_same_layout(dx, dy, fn)) ||
        (st = tsl_tensor_check_same_layout(dx, saved, fn)))
        return st;
    if (saved == dx && dx != dy)
        return tsl_error(dy->ctx, TSL_ERR_INVALID_ARG,
                         "%s: dx may overwrite dy, not the saved forward tensor", fn);
    tsl_act_args args = {.kind = kind, .dtype = dy->dtype, .slope = slope, .in_place = dx == dy};
    tsl_tensor_t tensors[3] = {saved, dy, dx};
    enum starpu_data_access_mode modes[3] = {STARPU_R, STARPU_R, STARPU_W};
    if (dx == dy)
        modes[1] = STARPU_RW;
    return tsl_submit_tiles(&tsl_cl_act_backward, dx == dy ? 2 : 3, tensors, modes, &args,
                            sizeof args, offsetof(tsl_act_args, count), info->backward_flops);
}
