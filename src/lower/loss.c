/* Losses on tiled tensors: one task per tile computes the tile's losses into an exact
 * accumulator and its part of the gradient; a merge tree gives the mean on every rank. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "codelets/loss.h"
#include "codelets/reduce.h"
#include "internal.h"

typedef struct loss_plan {
    tsl_loss_args args;
    tsl_tensor_t x, target, grad;
    int32_t *acc_owner; /* [tiles] */
} loss_plan;

static tsl_status loss_tile(int64_t tile, starpu_data_handle_t acc, void *user)
{
    loss_plan *p = user;
    int64_t start[TSL_MAX_DIMS], extent[TSL_MAX_DIMS];
    tsl_tensor_tile_box(p->x, tile, start, extent);
    tsl_loss_args args = p->args;
    int64_t inner = 1;
    for (int d = 2; d < p->x->shape.ndim; d++)
        inner *= extent[d];
    if (args.kind == TSL_LOSS_CROSS_ENTROPY || args.kind == TSL_LOSS_HITS) {
        args.samples = extent[0];
        args.inner = inner;
    } else {
        args.samples = 1;
        args.classes = 1;
        args.inner = tsl_tensor_tile_numel(p->x, tile);
    }
    tsl_task_desc desc = {
        .codelet = &tsl_cl_loss,
        .args = &args,
        .args_size = sizeof args,
        .nhandles = p->grad ? 4 : 3,
        .handles = {p->x->handles[tile], p->target->handles[tile], acc,
                    p->grad ? p->grad->handles[tile] : NULL},
        .modes = {STARPU_R, STARPU_R, STARPU_W, STARPU_W},
        .flops = 6.0 * (double)tsl_tensor_tile_numel(p->x, tile),
    };
    tsl_status st = tsl_task_submit(p->x->ctx, &desc);
    if (st)
        return st;
    for (int k = 0; k < 2; k++) {
        tsl_tensor_t read = k ? p->target : p->x;
        if (read->tile_owner[tile] != p->acc_owner[tile])
            tsl_cache_flush(read->ctx, read->handles[tile]);
    }
    return TSL_OK;
}

/* Run the plan: tasks, exact mean, label check. */
static tsl_status run(loss_plan *p, int64_t positions, double *loss, const char *fn)
{
    struct tsl_context *ctx = p->x->ctx;
    tsl_tensor_t placed = p->grad ? p->grad : p->x; /* the task runs where it writes */
    p->acc_owner = placed->tile_owner;
    p->args.scale = 1.0 / (double)positions;
    tsl_acc total;
    tsl_status st = tsl_exact_reduce(ctx, p->x->ntiles, p->acc_owner, loss_tile, p, &total);
    if (st)
        return st;
    if (total.flagged)
        return tsl_error(ctx, TSL_ERR_INVALID_ARG, "%s: %lld labels outside [0, %lld)", fn,
                         (long long)total.flagged, (long long)p->args.classes);
    *loss = tsl_acc_round(&total) / (double)positions;
    return TSL_OK;
}

static tsl_status check_common(tsl_tensor_t x, tsl_tensor_t grad, double *loss, const char *fn)
{
    tsl_status st = tsl_tensor_check(x, fn);
    if (st || (st = tsl_tensor_check_float(x, fn)))
        return st;
    if (!loss)
        return tsl_error(x->ctx, TSL_ERR_INVALID_ARG, "%s: loss is NULL", fn);
    if (grad && ((st = tsl_tensor_check_same_layout(grad, x, fn))))
        return st;
    if (grad == x)
        return tsl_error(x->ctx, TSL_ERR_INVALID_ARG, "%s: the gradient may not overwrite x", fn);
    return TSL_OK;
}

/* Logits (N, C, spatial...) with C unsplit; labels (N, spatial...) of an integer dtype,
 * tiled like the logits without C. */
static tsl_status check_labels(tsl_tensor_t logits, tsl_tensor_t labels, tsl_tensor_t dlogits,
                               double *loss, const char *fn)
{
    tsl_status st = check_common(logits, dlogits, loss, fn);
    if (st || (st = tsl_tensor_check(labels, fn)) || (st = tsl_tensor_check_plain(labels, fn)))
        return st;
    struct tsl_context *ctx = logits->ctx;
    if (labels->ctx != ctx)
        return tsl_error(ctx, TSL_ERR_INVALID_ARG, "%s: labels belong to another context", fn);
    if (labels->dtype != TSL_I32 && labels->dtype != TSL_I64 && labels->dtype != TSL_U8)
        return tsl_error(ctx, TSL_ERR_DTYPE, "%s: labels must be i32, i64 or u8, not %s", fn,
                         tsl_dtype_name(labels->dtype));
    const tsl_shape *ls = &logits->shape, *ys = &labels->shape;
    if (ls->ndim < 2)
        return tsl_error(ctx, TSL_ERR_SHAPE, "%s: logits need N and C dimensions", fn);
    int ok = ys->ndim == ls->ndim - 1 && ys->dims[0] == ls->dims[0];
    for (int d = 2; ok && d < ls->ndim; d++)
        ok = ys->dims[d - 1] == ls->dims[d];
    if (!ok)
        return tsl_error(ctx, TSL_ERR_SHAPE,
                         "%s: labels must have the logits' shape without C (N, spatial...)", fn);
    if (logits->grid.splits[1] != 1)
        return tsl_error(ctx, TSL_ERR_SHAPE,
                         "%s: the class dimension of the logits must not be split", fn);
    ok = labels->grid.splits[0] == logits->grid.splits[0];
    for (int d = 2; ok && d < ls->ndim; d++)
        ok = labels->grid.splits[d - 1] == logits->grid.splits[d];
    if (!ok)
        return tsl_error(ctx, TSL_ERR_SHAPE, "%s: labels must be tiled like the logits (without C)",
                         fn);
    return TSL_OK;
}

/* Per-position ops over logits and labels (cross-entropy, argmax hits): checks, then the exact
 * total over the tiles divided by `divide_by_positions ? positions : 1`. */
static tsl_status run_labels(tsl_loss_kind kind, tsl_tensor_t logits, tsl_tensor_t labels,
                             tsl_tensor_t dlogits, int divide_by_positions, double *value,
                             const char *fn)
{
    tsl_status st = check_labels(logits, labels, dlogits, value, fn);
    if (st)
        return st;
    const tsl_shape *ls = &logits->shape;
    loss_plan p;
    memset(&p, 0, sizeof p);
    p.args.kind = kind;
    p.args.dtype = logits->dtype;
    p.args.channels_last = logits->layout == TSL_LAYOUT_CHANNELS_LAST;
    p.args.label_dtype = labels->dtype;
    p.args.classes = ls->dims[1];
    p.x = logits;
    p.target = labels;
    p.grad = dlogits;
    return run(&p, divide_by_positions ? tsl_shape_numel(ls) / ls->dims[1] : 1, value, fn);
}

tsl_status tsl_loss_cross_entropy(tsl_tensor_t logits, tsl_tensor_t labels, tsl_tensor_t dlogits,
                                  double *loss)
{
    return run_labels(TSL_LOSS_CROSS_ENTROPY, logits, labels, dlogits, 1, loss,
                      "tsl_loss_cross_entropy");
}

tsl_status tsl_argmax_hits(tsl_tensor_t logits, tsl_tensor_t labels, int64_t *hits)
{
    double count = 0;
    tsl_status st = run_labels(TSL_LOSS_HITS, logits, labels, NULL, 0, &count, "tsl_argmax_hits");
    if (!st && hits)
        *hits = (int64_t)count;
    else if (!st)
        st = tsl_error(logits->ctx, TSL_ERR_INVALID_ARG, "tsl_argmax_hits: hits is NULL");
    return st;
}

/* Element-wise losses (MSE, L1) of x against a target of its shape and layout. */
static tsl_status run_elementwise(tsl_loss_kind kind, tsl_tensor_t x, tsl_tensor_t target,
                                  tsl_tensor_t dx, double *loss, const char *fn)
{
    tsl_status st = check_common(x, dx, loss, fn);
    if (st || (st = tsl_tensor_check(target, fn)) ||
        (st = tsl_tensor_check_same_layout(target, x, fn)))
        return st;
    if (dx == target)
        return tsl_error(x->ctx, TSL_ERR_INVALID_ARG,
                         "%s: the gradient may not overwrite the "
                         "target",
                         fn);
    loss_plan p;
    memset(&p, 0, sizeof p);
    p.args.kind = kind;
    p.args.dtype = x->dtype;
    p.x = x;
    p.target = target;
    p.grad = dx;
    return run(&p, tsl_shape_numel(&x->shape), loss, fn);
}

tsl_status tsl_loss_mse(tsl_tensor_t x, tsl_tensor_t target, tsl_tensor_t dx, double *loss)
{
    return run_elementwise(TSL_LOSS_MSE, x, target, dx, loss, "tsl_loss_mse");
}

tsl_status tsl_loss_l1(tsl_tensor_t x, tsl_tensor_t target, tsl_tensor_t dx, double *loss)
{
    return run_elementwise(TSL_LOSS_L1, x, target, dx, loss, "tsl_loss_l1");
}

typedef struct dice_job {
    tsl_loss_args args;
    tsl_tensor_t x, labels;
} dice_job;

static tsl_loss_args dice_tile_args(const dice_job *job, int64_t tile)
{
    int64_t start[TSL_MAX_DIMS], extent[TSL_MAX_DIMS];
    tsl_tensor_tile_box(job->x, tile, start, extent);
    tsl_loss_args a = job->args;
    a.samples = extent[0];
    a.inner = 1;
    for (int d = 2; d < job->x->shape.ndim; d++)
        a.inner *= extent[d];
    return a;
}

static tsl_status dice_stats(int64_t tile, starpu_data_handle_t acc, void *user)
{
    dice_job *job = user;
    tsl_loss_args a = dice_tile_args(job, tile);
    tsl_task_desc desc = {
        .codelet = &tsl_cl_dice_stats,
        .args = &a,
        .args_size = sizeof a,
        .nhandles = 3,
        .handles = {job->x->handles[tile], job->labels->handles[tile], acc},
        .modes = {STARPU_R, STARPU_R, STARPU_W},
        .flops = 8.0 * (double)tsl_tensor_tile_numel(job->x, tile),
    };
    return tsl_task_submit(job->x->ctx, &desc);
}

tsl_status tsl_loss_dice(tsl_tensor_t logits, tsl_tensor_t labels, tsl_tensor_t dlogits,
                         double smooth, double *loss)
{
    const char *fn = "tsl_loss_dice";
    tsl_status st = check_labels(logits, labels, dlogits, loss, fn);
    if (st)
        return st;
    struct tsl_context *ctx = logits->ctx;
    if (!(smooth >= 0) || !isfinite(smooth))
        return tsl_error(ctx, TSL_ERR_INVALID_ARG, "%s: smooth %g must be finite and >= 0", fn,
                         smooth);
    const int64_t C = logits->shape.dims[1];
    if (C > 1024)
        return tsl_error(ctx, TSL_ERR_UNSUPPORTED, "%s: more than 1024 classes", fn);
    dice_job job;
    memset(&job, 0, sizeof job);
    job.args.kind = TSL_LOSS_CROSS_ENTROPY; /* same tile geometry */
    job.args.dtype = logits->dtype;
    job.args.channels_last = logits->layout == TSL_LAYOUT_CHANNELS_LAST;
    job.args.label_dtype = labels->dtype;
    job.args.classes = C;
    job.args.smooth = smooth;
    job.x = logits;
    job.labels = labels;
    starpu_data_handle_t total, coef = NULL;
    if ((st = tsl_acc_tree_submit(ctx, logits->ntiles, logits->tile_owner, 3 * C, dice_stats, &job,
                                  &total)))
        return st;
    if (dlogits) {
        st = tsl_temp_handle_register(ctx, 2 * C, sizeof(double), dlogits->tile_owner[0], &coef);
        tsl_task_desc desc = {
            .codelet = &tsl_cl_dice_coef,
            .args = &job.args,
            .args_size = sizeof job.args,
            .nhandles = 2,
            .handles = {total, coef},
            .modes = {STARPU_R, STARPU_W},
        };
        if (!st)
            st = tsl_task_submit(ctx, &desc);
        for (int64_t i = 0; i < logits->ntiles && !st; i++) {
            tsl_loss_args a = dice_tile_args(&job, i);
            tsl_task_desc g = {
                .codelet = &tsl_cl_dice_grad,
                .args = &a,
                .args_size = sizeof a,
                .nhandles = 4,
                .handles = {logits->handles[i], labels->handles[i], coef, dlogits->handles[i]},
                .modes = {STARPU_R, STARPU_R, STARPU_R, STARPU_W},
                .flops = 10.0 * (double)tsl_tensor_tile_numel(logits, i),
            };
            st = tsl_task_submit(ctx, &g);
        }
        if (coef)
            tsl_temp_handle_release(ctx, coef);
    }
    if (!st) {
        starpu_mpi_get_data_on_all_nodes_detached(ctx->comm, total);
        starpu_data_acquire(total, STARPU_R);
        const tsl_acc *acc = starpu_data_get_local_ptr(total);
        int64_t flagged = acc[0].flagged;
        double value = tsl_dice_loss(&job.args, acc);
        starpu_data_release(total);
        if (flagged)
            st = tsl_error(ctx, TSL_ERR_INVALID_ARG, "%s: %lld labels outside [0, %lld)", fn,
                           (long long)flagged, (long long)C);
        else
            *loss = value;
    }
    tsl_temp_handle_release(ctx, total);
    return st;
}

/* ---- the difference and similarity losses: both values whole on one rank, one task ---- */

typedef struct diff_job {
    tsl_diff_args args;
    struct starpu_codelet *codelet;
    double flops;
    tsl_tensor_t a, b, gram, da, db;
} diff_job;

static tsl_status diff_tile(int64_t tile, starpu_data_handle_t acc, void *user)
{
    (void)tile;
    diff_job *j = user;
    tsl_task_desc desc = {
        .codelet = j->codelet,
        .args = &j->args,
        .args_size = sizeof j->args,
        .nhandles = j->da ? 6 : 4,
        .handles = {j->a->handles[0], j->b->handles[0], j->gram->handles[0], acc,
                    j->da ? j->da->handles[0] : NULL, j->db ? j->db->handles[0] : NULL},
        .modes = {STARPU_R, STARPU_R, STARPU_W, STARPU_W, STARPU_W, STARPU_W},
        .flops = j->flops,
    };
    return tsl_task_submit(j->a->ctx, &desc);
}

/* A whole, plain, one-tile copy of t on `rank` (or an empty one when `copy` is 0). */
static tsl_status whole_on(tsl_tensor_t t, int32_t rank, int copy, tsl_tensor_t *out)
{
    tsl_tile_grid one = tsl_tile_grid_single();
    tsl_owner_map on = tsl_owner_single(rank);
    tsl_status st =
        tsl_tensor_create_transient(out, t->ctx, t->dtype, &t->shape, &one, &on, TSL_LAYOUT_PLAIN);
    return st || !copy ? st : tsl_tensor_redistribute(*out, t);
}

/* A loss of two values computed by one task on the rank of a's first tile (the difference or the
 * similarity loss): `scratch` doubles per batch^2 for the codelet, the loss the exact sum
 * divided by `divide_by_n2` ? batch^2 : 1. */
static tsl_status pair_loss(const char *fn, struct starpu_codelet *codelet, int64_t scratch,
                            int same_features, int divide_by_n2, tsl_tensor_t a, tsl_tensor_t b,
                            tsl_tensor_t da, tsl_tensor_t db, double *loss)
{
    tsl_status st = tsl_tensor_check(a, fn);
    if (st || (st = tsl_tensor_check(b, fn)) || (st = tsl_tensor_check_float(a, fn)))
        return st;
    struct tsl_context *ctx = a->ctx;
    if (!loss)
        return tsl_error(ctx, TSL_ERR_INVALID_ARG, "%s: loss is NULL", fn);
    if (b->ctx != ctx || b->dtype != a->dtype)
        return tsl_error(ctx, TSL_ERR_INVALID_ARG, "%s: a and b of one context and dtype", fn);
    if (a->shape.ndim < 1 || b->shape.ndim < 1 || a->shape.dims[0] != b->shape.dims[0])
        return tsl_error(ctx, TSL_ERR_SHAPE, "%s: a and b need one batch size (first dimension)",
                         fn);
    if (same_features && tsl_shape_numel(&a->shape) != tsl_shape_numel(&b->shape))
        return tsl_error(ctx, TSL_ERR_SHAPE,
                         "%s: a and b need the same number of features per sample", fn);
    if (!da != !db)
        return tsl_error(ctx, TSL_ERR_INVALID_ARG, "%s: both gradients or neither", fn);
    if (da && ((st = tsl_tensor_check_same_layout(da, a, fn)) ||
               (st = tsl_tensor_check_same_layout(db, b, fn))))
        return st;
    if (da && (da == a || da == b || db == a || db == b || da == db))
        return tsl_error(ctx, TSL_ERR_INVALID_ARG, "%s: the gradients may not overwrite a or b",
                         fn);
    diff_job j;
    memset(&j, 0, sizeof j);
    const int64_t n = a->shape.dims[0];
    j.args.dtype = a->dtype;
    j.args.n = n;
    j.args.fa = n ? tsl_shape_numel(&a->shape) / n : 0;
    j.args.fb = n ? tsl_shape_numel(&b->shape) / n : 0;
    j.codelet = codelet;
    j.flops = 2.0 * (double)n * (double)n * (double)(j.args.fa + j.args.fb) * (da ? 2.0 : 1.0);
    int32_t rank = a->tile_owner[0];
    int64_t gdims[1] = {scratch * n * n > 0 ? scratch * n * n : 1};
    tsl_shape gs;
    tsl_shape_make(&gs, 1, gdims);
    tsl_tile_grid one = tsl_tile_grid_single();
    tsl_owner_map on = tsl_owner_single(rank);
    if (!(st = whole_on(a, rank, 1, &j.a)) && !(st = whole_on(b, rank, 1, &j.b)) &&
        !(st = tsl_tensor_create_transient(&j.gram, ctx, TSL_F64, &gs, &one, &on,
                                           TSL_LAYOUT_PLAIN)) &&
        (!da || (!(st = whole_on(da, rank, 0, &j.da)) && !(st = whole_on(db, rank, 0, &j.db))))) {
        tsl_acc total;
        st = tsl_exact_reduce(ctx, 1, &rank, diff_tile, &j, &total);
        if (!st)
            *loss = divide_by_n2 && n ? tsl_acc_round(&total) / ((double)n * (double)n)
                                      : tsl_acc_round(&total);
        if (!st && da && !(st = tsl_tensor_redistribute(da, j.da)))
            st = tsl_tensor_redistribute(db, j.db);
    }
    tsl_tensor_t temps[5] = {j.a, j.b, j.gram, j.da, j.db};
    for (int k = 0; k < 5; k++)
        tsl_tensor_destroy(temps[k]);
    return st;
}

tsl_status tsl_loss_difference(tsl_tensor_t a, tsl_tensor_t b, tsl_tensor_t da, tsl_tensor_t db,
                               double *loss)
{
    return pair_loss("tsl_loss_difference", &tsl_cl_difference, 2, 0, 0, a, b, da, db, loss);
}

tsl_status tsl_loss_similarity(tsl_tensor_t a, tsl_tensor_t b, tsl_tensor_t da, tsl_tensor_t db,
                               double *loss)
{
    return pair_loss("tsl_loss_similarity", &tsl_cl_similarity, 3, 1, 1, a, b, da, db, loss);
}
