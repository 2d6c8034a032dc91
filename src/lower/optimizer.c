/* Optimizers: settings, per-parameter state tensors, and the update as one task per
 * parameter tile on the tile's owner. */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codelets/optimizer.h"
#include "internal.h"

typedef struct param_state {
    tsl_tensor_t param;
    tsl_tensor_t state[2]; /* SGD: momentum buffer (or none); Adam: first, second moments */
    int64_t steps;
} param_state;

/* The most steps a parameter may count: Adam's bias correction takes the count as a double,
 * exact up to 2^53, and a count read from a file must leave room for the next step. */
#define MAX_PARAM_STEPS (INT64_C(1) << 53)

struct tsl_optimizer {
    struct tsl_context *ctx;
    tsl_optimizer_kind kind;
    tsl_sgd_config sgd;
    tsl_adam_config adam;
    param_state *params;
    int64_t nparams;
    int64_t cap;
};

tsl_status tsl_optimizer_set_lr(tsl_optimizer_t opt, double lr)
{
    if (!opt)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "tsl_optimizer_set_lr: optimizer is NULL");
    if (!isfinite(lr) || !(lr > 0))
        return tsl_error(opt->ctx, TSL_ERR_INVALID_ARG,
                         "tsl_optimizer_set_lr: learning rate %g (want > 0)", lr);
    opt->sgd.lr = opt->adam.lr = lr;
    return TSL_OK;
}

tsl_status tsl_sgd_config_init(tsl_sgd_config *c)
{
    if (!c)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "tsl_sgd_config_init: config is NULL");
    memset(c, 0, sizeof *c);
    c->lr = 0.01;
    return TSL_OK;
}

tsl_status tsl_adam_config_init(tsl_adam_config *c)
{
    if (!c)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "tsl_adam_config_init: config is NULL");
    memset(c, 0, sizeof *c);
    c->lr = 1e-3;
    c->beta1 = 0.9;
    c->beta2 = 0.999;
    c->eps = 1e-8;
    return TSL_OK;
}

static tsl_status optimizer_alloc(struct tsl_optimizer **out, tsl_context_t ctx,
                                  tsl_optimizer_kind kind)
{
    struct tsl_optimizer *opt = calloc(1, sizeof *opt);
    if (!opt)
        return tsl_error(ctx, TSL_ERR_OUT_OF_MEMORY, "optimizer: out of memory");
    opt->ctx = ctx;
    opt->kind = kind;
    *out = opt;
    return TSL_OK;
}

static int finite_at_least(double v, double low)
{
    return isfinite(v) && v >= low;
}

tsl_status tsl_optimizer_create_sgd(tsl_optimizer_t *out, tsl_context_t ctx,
                                    const tsl_sgd_config *c)
{
    const char *fn = "tsl_optimizer_create_sgd";
    if (!out || !ctx || !c)
        return tsl_error(ctx, TSL_ERR_INVALID_ARG, "%s: NULL argument", fn);
    *out = NULL;
    if (!finite_at_least(c->lr, 0) || c->lr == 0)
        return tsl_error(ctx, TSL_ERR_INVALID_ARG, "%s: learning rate %g (want > 0)", fn, c->lr);
    if (!finite_at_least(c->momentum, 0) || !finite_at_least(c->weight_decay, 0))
        return tsl_error(ctx, TSL_ERR_INVALID_ARG,
                         "%s: momentum %g and weight decay %g must be "
                         ">= 0",
                         fn, c->momentum, c->weight_decay);
    if (!finite_at_least(c->dampening, 0) || c->dampening > 1)
        return tsl_error(ctx, TSL_ERR_INVALID_ARG, "%s: dampening %g outside [0, 1]", fn,
                         c->dampening);
    if (c->nesterov && (c->momentum <= 0 || c->dampening != 0))
        return tsl_error(ctx, TSL_ERR_INVALID_ARG,
                         "%s: Nesterov momentum needs momentum > 0 and dampening 0", fn);
    tsl_status st = optimizer_alloc(out, ctx, TSL_OPT_SGD);
    if (!st)
        (*out)->sgd = *c;
    return st;
}

tsl_status tsl_optimizer_create_adam(tsl_optimizer_t *out, tsl_context_t ctx,
                                     const tsl_adam_config *c)
{
    const char *fn = "tsl_optimizer_create_adam";
    if (!out || !ctx || !c)
        return tsl_error(ctx, TSL_ERR_INVALID_ARG, "%s: NULL argument", fn);
    *out = NULL;
    if (!finite_at_least(c->lr, 0) || c->lr == 0)
        return tsl_error(ctx, TSL_ERR_INVALID_ARG, "%s: learning rate %g (want > 0)", fn, c->lr);
    if (!finite_at_least(c->beta1, 0) || c->beta1 >= 1 || !finite_at_least(c->beta2, 0) ||
        c->beta2 >= 1)
        return tsl_error(ctx, TSL_ERR_INVALID_ARG, "%s: betas (%g, %g) outside [0, 1)", fn,
                         c->beta1, c->beta2);
    if (!finite_at_least(c->eps, 0) || c->eps == 0)
        return tsl_error(ctx, TSL_ERR_INVALID_ARG, "%s: eps %g (want > 0)", fn, c->eps);
    if (!finite_at_least(c->weight_decay, 0))
        return tsl_error(ctx, TSL_ERR_INVALID_ARG, "%s: weight decay %g (want >= 0)", fn,
                         c->weight_decay);
    tsl_status st = optimizer_alloc(out, ctx, TSL_OPT_ADAM);
    if (!st)
        (*out)->adam = *c;
    return st;
}

tsl_status tsl_optimizer_destroy(tsl_optimizer_t opt)
{
    if (!opt)
        return TSL_OK;
    for (int64_t i = 0; i < opt->nparams; i++)
        for (int k = 0; k < 2; k++)
            tsl_tensor_destroy(opt->params[i].state[k]);
    free(opt->params);
    free(opt);
    return TSL_OK;
}

static param_state *find_state(tsl_optimizer_t opt, tsl_tensor_t param)
{
    for (int64_t i = 0; i < opt->nparams; i++)
        if (opt->params[i].param == param)
            return &opt->params[i];
    return NULL;
}

static int state_count(const struct tsl_optimizer *opt)
{
    return opt->kind == TSL_OPT_ADAM ? 2 : opt->sgd.momentum > 0 ? 1 : 0;
}

/* The state tensors a parameter needs, zeroed, with the parameter's grid and owners. */
static tsl_status create_state(tsl_optimizer_t opt, tsl_tensor_t param, param_state **out)
{
    if (opt->nparams == opt->cap) {
        int64_t cap = opt->cap ? 2 * opt->cap : 16;
        param_state *grown = realloc(opt->params, (size_t)cap * sizeof *grown);
        if (!grown)
            return tsl_error(opt->ctx, TSL_ERR_OUT_OF_MEMORY, "optimizer: out of memory");
        opt->params = grown;
        opt->cap = cap;
    }
    param_state *ps = &opt->params[opt->nparams];
    memset(ps, 0, sizeof *ps);
    ps->param = param;
    int nstate = state_count(opt);
    for (int k = 0; k < nstate; k++) {
        tsl_status st = tsl_tensor_create(&ps->state[k], opt->ctx, param->dtype, &param->shape,
                                          &param->grid, &param->owners);
        if (st) {
            for (int j = 0; j < k; j++)
                tsl_tensor_destroy(ps->state[j]);
            return st;
        }
    }
    opt->nparams++;
    *out = ps;
    return TSL_OK;
}

tsl_status tsl_optimizer_step(tsl_optimizer_t opt, int32_t count, const tsl_tensor_t *params,
                              const tsl_tensor_t *grads)
{
    const char *fn = "tsl_optimizer_step";
    if (!opt)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "%s: optimizer is NULL", fn);
    if (count < 0 || (count > 0 && (!params || !grads)))
        return tsl_error(opt->ctx, TSL_ERR_INVALID_ARG, "%s: %d parameters without arrays", fn,
                         (int)count);
    /* Validate everything before submitting anything. */
    for (int32_t i = 0; i < count; i++) {
        tsl_status st = tsl_tensor_check(params[i], fn);
        if (st || (st = tsl_tensor_check(grads[i], fn)))
            return st;
        if (params[i]->ctx != opt->ctx)
            return tsl_error(opt->ctx, TSL_ERR_INVALID_ARG,
                             "%s: parameter %d belongs to another context", fn, (int)i);
        if ((st = tsl_tensor_check_float(params[i], fn)) ||
            (st = tsl_tensor_check_same_layout(params[i], grads[i], fn)))
            return st;
        if (params[i] == grads[i])
            return tsl_error(opt->ctx, TSL_ERR_INVALID_ARG, "%s: parameter %d is its own gradient",
                             fn, (int)i);
        for (int32_t j = 0; j < i; j++)
            if (params[j] == params[i])
                return tsl_error(opt->ctx, TSL_ERR_INVALID_ARG, "%s: parameter %d appears twice",
                                 fn, (int)i);
        const param_state *ps = find_state(opt, params[i]);
        if (ps && ps->steps >= MAX_PARAM_STEPS)
            return tsl_error(opt->ctx, TSL_ERR_STATE,
                             "%s: parameter %d has taken %lld steps, the most an optimizer counts",
                             fn, (int)i, (long long)ps->steps);
    }
    for (int32_t i = 0; i < count; i++) {
        param_state *ps = find_state(opt, params[i]);
        tsl_status st = ps ? TSL_OK : create_state(opt, params[i], &ps);
        if (st)
            return st;
        ps->steps++;
        tsl_update_args args = {.kind = opt->kind,
                                .dtype = params[i]->dtype,
                                .step = ps->steps,
                                .sgd = opt->sgd,
                                .adam = opt->adam};
        tsl_tensor_t tensors[4] = {params[i], grads[i], ps->state[0], ps->state[1]};
        enum starpu_data_access_mode modes[4] = {STARPU_RW, STARPU_R, STARPU_RW, STARPU_RW};
        int ntensors = 2 + (ps->state[0] != NULL) + (ps->state[1] != NULL);
        st = tsl_submit_tiles(&tsl_cl_update, ntensors, tensors, modes, &args, sizeof args,
                              offsetof(tsl_update_args, count),
                              opt->kind == TSL_OPT_ADAM ? 12.0 : 5.0);
        if (st)
            return st;
    }
    return TSL_OK;
}

tsl_status tsl_optimizer_param_steps(tsl_optimizer_t opt, tsl_tensor_t param, int64_t *steps)
{
    if (!opt || !param || !steps)
        return tsl_error(opt ? opt->ctx : NULL, TSL_ERR_INVALID_ARG,
                         "tsl_optimizer_param_steps: NULL argument");
    param_state *ps = find_state(opt, param);
    *steps = ps ? ps->steps : 0;
    return TSL_OK;
}

/* PyTorch's names for the state tensors (optimizer state_dict keys). */
static const char *state_name(tsl_optimizer_kind kind, int k)
{
    return kind == TSL_OPT_ADAM ? (k ? "exp_avg_sq" : "exp_avg") : "momentum_buffer";
}

/* DIR/NAME.WHAT.npy */
static tsl_status state_path(tsl_optimizer_t opt, const char *dir, const char *name,
                             const char *what, char *path, size_t size)
{
    int n = snprintf(path, size, "%s/%s.%s.npy", dir, name, what);
    if (n < 0 || (size_t)n >= size)
        return tsl_error(opt->ctx, TSL_ERR_INVALID_ARG, "optimizer: path too long in '%s'", dir);
    return TSL_OK;
}

static tsl_status check_state_args(tsl_optimizer_t opt, int32_t count, const tsl_tensor_t *params,
                                   const char *const *names, const char *dir, const char *fn)
{
    if (!opt)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "%s: optimizer is NULL", fn);
    if (!dir || count < 0 || (count > 0 && (!params || !names)))
        return tsl_error(opt->ctx, TSL_ERR_INVALID_ARG, "%s: NULL argument", fn);
    for (int32_t i = 0; i < count; i++) {
        tsl_status st = tsl_tensor_check(params[i], fn);
        if (st)
            return st;
        if (!names[i] || !names[i][0] || strchr(names[i], '/'))
            return tsl_error(opt->ctx, TSL_ERR_INVALID_ARG, "%s: parameter %d has no usable name",
                             fn, (int)i);
    }
    return TSL_OK;
}

tsl_status tsl_optimizer_save_state(tsl_optimizer_t opt, int32_t count, const tsl_tensor_t *params,
                                    const char *const *names, const char *dir)
{
    const char *fn = "tsl_optimizer_save_state";
    tsl_status st = check_state_args(opt, count, params, names, dir, fn);
    if (st)
        return st;
    char path[4096];
    for (int32_t i = 0; i < count && !st; i++) {
        param_state *ps = find_state(opt, params[i]);
        int64_t steps = ps ? ps->steps : 0;
        if ((st = state_path(opt, dir, names[i], "step", path, sizeof path)))
            break;
        if (opt->ctx->rank == 0) {
            tsl_shape one = {.ndim = 1, .dims = {1}};
            st = tsl_npy_write(path, TSL_I64, &one, &steps);
        }
        if ((st = tsl_context_agree(opt->ctx, 0, st)))
            break;
        for (int k = 0; ps && k < 2 && ps->state[k] && !st; k++)
            if (!(st = state_path(opt, dir, names[i], state_name(opt->kind, k), path, sizeof path)))
                st = tsl_tensor_write_npy(ps->state[k], path, 0);
    }
    return st;
}

struct tsl_optimizer_pending {
    int32_t count;
    const tsl_tensor_t *params;
    int64_t *steps;      /* [count] */
    tsl_tensor_t *files; /* [2 * count]: the state read from the files, or NULL */
};

void tsl_optimizer_pending_free(tsl_optimizer_pending *p)
{
    if (!p)
        return;
    for (int32_t i = 0; p->files && i < 2 * p->count; i++)
        tsl_tensor_destroy(p->files[i]);
    free(p->files);
    free(p->steps);
    free(p);
}

tsl_status tsl_optimizer_read_state(tsl_optimizer_t opt, int32_t count, const tsl_tensor_t *params,
                                    const char *const *names, const char *dir,
                                    tsl_optimizer_pending **out)
{
    const char *fn = "tsl_optimizer_load_state";
    *out = NULL;
    tsl_status st = check_state_args(opt, count, params, names, dir, fn);
    if (st)
        return st;
    struct tsl_context *ctx = opt->ctx;
    int nstate = state_count(opt);
    tsl_optimizer_pending *p = calloc(1, sizeof *p);
    if (!p || !(p->steps = calloc((size_t)count + 1, sizeof *p->steps)) ||
        !(p->files = calloc(2 * (size_t)count + 1, sizeof *p->files))) {
        tsl_optimizer_pending_free(p);
        return tsl_error(ctx, TSL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    }
    p->count = count;
    p->params = params;
    char path[4096];
    for (int32_t i = 0; i < count && !st; i++) {
        if ((st = state_path(opt, dir, names[i], "step", path, sizeof path)))
            break;
        if (ctx->rank == 0) {
            tsl_npy_header h;
            void *data = NULL;
            if (!(st = tsl_npy_read(path, &h, &data))) {
                if (h.dtype != TSL_I64 || tsl_shape_numel(&h.shape) != 1)
                    st = tsl_error(ctx, TSL_ERR_FORMAT, "%s: '%s' is not one int64 step count", fn,
                                   path);
                else if (*(int64_t *)data < 0 || *(int64_t *)data >= MAX_PARAM_STEPS)
                    st = tsl_error(ctx, TSL_ERR_FORMAT,
                                   "%s: '%s' holds the step count %lld; a step count must be in "
                                   "[0, 2^53)",
                                   fn, path, (long long)*(int64_t *)data);
                else
                    p->steps[i] = *(int64_t *)data;
            }
            tsl_free(data);
        }
        if ((st = tsl_context_agree(ctx, 0, st)))
            break;
        if (MPI_Bcast(&p->steps[i], 1, MPI_INT64_T, 0, ctx->ctl_comm) != MPI_SUCCESS) {
            st = tsl_error(ctx, TSL_ERR_RUNTIME, "%s: MPI_Bcast failed", fn);
            break;
        }
        for (int k = 0; k < nstate && p->steps[i] > 0 && !st; k++) {
            if ((st =
                     state_path(opt, dir, names[i], state_name(opt->kind, k), path, sizeof path)) ||
                (st = tsl_tensor_read_npy(&p->files[2 * i + k], ctx, path, 0, NULL, NULL)))
                break;
            tsl_tensor_t f = p->files[2 * i + k], q = params[i];
            if (f->dtype != q->dtype || f->shape.ndim != q->shape.ndim ||
                memcmp(f->shape.dims, q->shape.dims, sizeof(int64_t) * (size_t)q->shape.ndim))
                st = tsl_error(ctx, TSL_ERR_SHAPE,
                               "%s: '%s' does not have the dtype and shape of parameter '%s'", fn,
                               path, names[i]);
        }
    }
    if (st)
        tsl_optimizer_pending_free(p);
    else
        *out = p;
    return st;
}

tsl_status tsl_optimizer_apply_state(tsl_optimizer_t opt, tsl_optimizer_pending *p)
{
    tsl_status st = TSL_OK;
    int nstate = state_count(opt);
    for (int32_t i = 0; i < p->count && !st; i++) {
        param_state *ps = find_state(opt, p->params[i]);
        if (!ps && p->steps[i] > 0 && (st = create_state(opt, p->params[i], &ps)))
            break;
        if (!ps)
            continue;
        ps->steps = p->steps[i];
        for (int k = 0; k < nstate && !st; k++)
            st = p->steps[i] > 0 ? tsl_tensor_redistribute(ps->state[k], p->files[2 * i + k])
                                 : tsl_tensor_fill_constant(ps->state[k], 0);
    }
    tsl_optimizer_pending_free(p);
    return st;
}

tsl_status tsl_optimizer_load_state(tsl_optimizer_t opt, int32_t count, const tsl_tensor_t *params,
                                    const char *const *names, const char *dir)
{
    tsl_optimizer_pending *p;
    tsl_status st = tsl_optimizer_read_state(opt, count, params, names, dir, &p);
    return st ? st : tsl_optimizer_apply_state(opt, p);
}
