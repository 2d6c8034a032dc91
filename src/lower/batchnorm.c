/* Batch normalization on tiled tensors with exact statistics over every sample and spatial
 * tile (DESIGN rule 6): per-tile exact accumulators, merged on each rank and then on every
 * rank that needs the sums (one hop: tsl_acc_allreduce_submit), finalize tasks there, then one
 * elementwise task per tile. Nothing waits: the tasks run as their inputs arrive. */
#include <math.h>
#include <string.h>

#include "codelets/batchnorm.h"
#include "codelets/copy.h"
#include "internal.h"

/* A (C) vector, one tile, of x's dtype; or (2, C) f64 for the saved statistics. */
static tsl_status check_vector(tsl_tensor_t v, tsl_tensor_t x, int saved, const char *what,
                               const char *fn)
{
    tsl_status st = tsl_tensor_check(v, fn);
    if (st)
        return st;
    int64_t c = x->shape.dims[1];
    int ok = v->ctx == x->ctx && v->ntiles == 1 &&
             (saved ? v->dtype == TSL_F64 && v->shape.ndim == 2 && v->shape.dims[0] == 2 &&
                          v->shape.dims[1] == c
                    : v->dtype == x->dtype && v->shape.ndim == 1 && v->shape.dims[0] == c);
    if (!ok)
        return tsl_error(x->ctx, TSL_ERR_SHAPE, "%s: %s must be one tile of %s", fn, what,
                         saved ? "(2, C) f64" : "C values of x's dtype");
    return TSL_OK;
}

static tsl_status check_x(tsl_tensor_t x, const char *fn)
{
    tsl_status st = tsl_tensor_check(x, fn);
    if (st || (st = tsl_tensor_check_float(x, fn)))
        return st;
    if (x->shape.ndim < 2)
        return tsl_error(x->ctx, TSL_ERR_SHAPE, "%s: x needs N and C dimensions", fn);
    return TSL_OK;
}

static tsl_bn_args args_for(tsl_tensor_t x, int64_t tile, double eps, double momentum)
{
    tsl_bn_args a;
    memset(&a, 0, sizeof a);
    a.dtype = x->dtype;
    a.channels_last = x->layout == TSL_LAYOUT_CHANNELS_LAST;
    a.channels = x->shape.dims[1];
    a.per_channel = tsl_shape_numel(&x->shape) / x->shape.dims[1];
    a.eps = eps;
    a.momentum = momentum;
    a.acc_first = 0;
    a.acc_count = a.channels;
    if (tile >= 0) {
        int64_t start[TSL_MAX_DIMS], extent[TSL_MAX_DIMS];
        tsl_tensor_tile_box(x, tile, start, extent);
        a.samples = extent[0];
        a.c0 = start[1];
        a.cext = extent[1];
        a.inner = 1;
        for (int d = 2; d < x->shape.ndim; d++)
            a.inner *= extent[d];
    }
    return a;
}

static tsl_status submit(struct tsl_context *ctx, struct starpu_codelet *cl, const tsl_bn_args *a,
                         int n, const starpu_data_handle_t *handles,
                         const enum starpu_data_access_mode *modes, double flops)
{
    return tsl_task_submit_handles(ctx, cl, a, sizeof *a, n, handles, modes, flops);
}

/* The ranks that need a layer's sums: `a`'s tile owners and the owners of up to four more
 * one-tile tensors (NULL skipped). need: ctx->size entries. */
static void need_ranks(uint8_t *need, int32_t nranks, tsl_tensor_t a, tsl_tensor_t b,
                       tsl_tensor_t c, tsl_tensor_t d, tsl_tensor_t e)
{
    memset(need, 0, (size_t)nranks);
    for (int64_t i = 0; a && i < a->ntiles; i++)
        need[a->tile_owner[i]] = 1;
    tsl_tensor_t one[4] = {b, c, d, e};
    for (int k = 0; k < 4; k++)
        if (one[k])
            need[one[k]->tile_owner[0]] = 1;
}

/* The saved statistics have a copy on every rank from the lowest to the highest that needs
 * them (made on first use): each finalizes its own from its own sums, and its tasks read it. */
static tsl_status saved_copies(tsl_tensor_t saved, const uint8_t *need)
{
    int32_t lo = -1, hi = -1;
    for (int32_t r = 0; r < saved->ctx->size; r++)
        if (need[r]) {
            lo = lo < 0 ? r : lo;
            hi = r;
        }
    if (saved->replicas || lo < 0 || (lo == hi && lo == saved->tile_owner[0]))
        return TSL_OK;
    return tsl_tensor_make_replicas_on(saved, lo, hi - lo + 1);
}

static void release_all(struct tsl_context *ctx, starpu_data_handle_t *h)
{
    for (int32_t r = 0; r < ctx->size; r++)
        if (h[r])
            tsl_temp_handle_release(ctx, h[r]);
}

/* ---- forward, training ---- */

typedef struct stats_job {
    tsl_tensor_t x, dy;              /* backward: dy */
    tsl_tensor_t saved, gamma, beta; /* backward with ReLU fused: to recompute its mask */
    const int64_t *tiles;            /* the tiles of one channel range (NULL: all of x's) */
    int64_t acc_first, acc_count;    /* the channels the accumulators hold (0 and C: all) */
} stats_job;

static tsl_status stats_tile(int64_t k, starpu_data_handle_t acc, void *user)
{
    stats_job *job = user;
    int64_t tile = job->tiles ? job->tiles[k] : k;
    tsl_bn_args a = args_for(job->x, tile, 0, 0);
    if (job->tiles) {
        a.acc_first = job->acc_first;
        a.acc_count = job->acc_count;
    }
    double flops = 3.0 * (double)tsl_tensor_tile_numel(job->x, tile);
    if (!job->dy) {
        starpu_data_handle_t h[2] = {job->x->handles[tile], acc};
        enum starpu_data_access_mode m[2] = {STARPU_R, STARPU_W};
        return submit(job->x->ctx, &tsl_cl_bn_stats, &a, 2, h, m, flops);
    }
    a.relu = job->beta != NULL;
    starpu_data_handle_t h[6] = {job->x->handles[tile], job->dy->handles[tile], acc};
    enum starpu_data_access_mode m[6] = {STARPU_R, STARPU_R, STARPU_W,
                                         STARPU_R, STARPU_R, STARPU_R};
    if (a.relu) {
        int32_t rank = job->dy->tile_owner[tile]; /* where acc, the task's output, lives */
        h[3] = tsl_whole_handle(job->saved, rank);
        h[4] = tsl_whole_handle(job->gamma, rank);
        h[5] = tsl_whole_handle(job->beta, rank);
    }
    return submit(job->x->ctx, &tsl_cl_bn_bwd_stats, &a, a.relu ? 6 : 3, h, m, flops);
}

/* The layer's sums (2 C accumulators) on every rank `need` names, into totals[rank]
 * (tsl_acc_allreduce_submit). Where x is cut along its channels, each channel range's tiles
 * are summed among themselves into accumulators of that range only, and every rank that needs
 * the sums packs the ranges' totals into its 2 C (tsl_cl_pack): the ranks exchange each range's
 * 2 C / K accumulators instead of 2 C, K times fewer bytes under filters= and channels= plans,
 * whose ranges' tiles live on different ranks. The same exact sums either way. */
static tsl_status layer_sums(tsl_tensor_t x, const int32_t *owner_of, stats_job *job,
                             const uint8_t *need, starpu_data_handle_t *total)
{
    struct tsl_context *ctx = x->ctx;
    const int64_t C = x->shape.dims[1];
    const int32_t K = x->grid.splits[1];
    if (K <= 1 || K > TSL_PACK_MAX)
        return tsl_acc_allreduce_submit(ctx, x->ntiles, owner_of, 2 * C, stats_tile, job, need,
                                        total);
    for (int32_t r = 0; r < ctx->size; r++)
        total[r] = NULL;
    int64_t *tiles = malloc(sizeof *tiles * (size_t)x->ntiles);
    int32_t *owners = malloc(sizeof *owners * (size_t)x->ntiles);
    starpu_data_handle_t *part = calloc((size_t)K * (size_t)ctx->size, sizeof *part);
    tsl_pack_args pack;
    memset(&pack, 0, sizeof pack);
    pack.n = K;
    tsl_status st = tiles && owners && part
                        ? TSL_OK
                        : tsl_error(ctx, TSL_ERR_OUT_OF_MEMORY, "batch norm: out of memory");
    int64_t first = 0;
    for (int32_t k = 0; k < K && !st; k++) { /* range k: the tiles whose channels start at first */
        int64_t n = 0, count = 0, start[TSL_MAX_DIMS], extent[TSL_MAX_DIMS];
        for (int64_t i = 0; i < x->ntiles; i++) {
            tsl_tensor_tile_box(x, i, start, extent);
            if (start[1] == first) {
                tiles[n] = i;
                owners[n++] = owner_of[i];
                count = extent[1];
            }
        }
        stats_job range = *job;
        range.tiles = tiles;
        range.acc_first = first;
        range.acc_count = count;
        pack.offset[k] = 2 * first * (int64_t)sizeof(tsl_acc);
        st = tsl_acc_allreduce_submit(ctx, n, owners, 2 * count, stats_tile, &range, need,
                                      part + (int64_t)k * ctx->size);
        first += count;
    }
    for (int32_t r = 0; r < ctx->size && !st; r++) {
        if (!need[r])
            continue;
        st = tsl_temp_handle_register(ctx, 2 * C * (int64_t)(sizeof(tsl_acc) / sizeof(int64_t)),
                                      sizeof(int64_t), r, &total[r]);
        tsl_task_desc desc = {.codelet = &tsl_cl_pack,
                              .args = &pack,
                              .args_size = sizeof pack,
                              .nhandles = K + 1,
                              .name = "bn sums packed"};
        for (int32_t k = 0; k < K; k++) {
            desc.handles[k] = part[(int64_t)k * ctx->size + r];
            desc.modes[k] = STARPU_R;
        }
        desc.handles[K] = total[r];
        desc.modes[K] = STARPU_W;
        if (!st)
            st = tsl_task_submit(ctx, &desc);
    }
    for (int64_t i = 0; part && i < (int64_t)K * ctx->size; i++)
        if (part[i])
            tsl_temp_handle_release(ctx, part[i]);
    free(tiles);
    free(owners);
    free(part);
    return st;
}

/* Training forward, with ReLU fused into the normalize tasks when `relu`. */
starpu_data_handle_t tsl_tile_on(tsl_tensor_t after, int64_t ntiles, int64_t i, int32_t rank)
{
    if (!after)
        return NULL;
    if (after->ntiles == ntiles && after->tile_owner[i] == rank)
        return after->handles[i];
    for (int64_t j = 0; j < after->ntiles; j++)
        if (after->tile_owner[j] == rank)
            return after->handles[j];
    return NULL;
}

/* y from x with the statistics in saved: a task per tile on y's owner (with ReLU fused when
 * relu is set), each also reading a tile of `after` on that rank when given, so that it runs
 * only once that tile is written. */
static tsl_status normalize(tsl_tensor_t x, tsl_tensor_t gamma, tsl_tensor_t beta,
                            tsl_tensor_t saved, tsl_tensor_t y, int relu, double eps,
                            double momentum, tsl_tensor_t after)
{
    struct tsl_context *ctx = x->ctx;
    tsl_status st = TSL_OK;
    for (int64_t i = 0; i < x->ntiles && !st; i++) {
        tsl_bn_args t = args_for(x, i, eps, momentum);
        t.relu = relu;
        starpu_data_handle_t h[6] = {x->handles[i],
                                     tsl_whole_handle(saved, y->tile_owner[i]),
                                     tsl_whole_handle(gamma, y->tile_owner[i]),
                                     tsl_whole_handle(beta, y->tile_owner[i]),
                                     y->handles[i],
                                     tsl_tile_on(after, y->ntiles, i, y->tile_owner[i])};
        enum starpu_data_access_mode m[6] = {STARPU_R, STARPU_R, STARPU_R,
                                             STARPU_R, STARPU_W, STARPU_R};
        st = submit(ctx, &tsl_cl_bn_normalize, &t, h[5] ? 6 : 5, h, m,
                    4.0 * (double)tsl_tensor_tile_numel(x, i));
        if (x->tile_owner[i] != y->tile_owner[i])
            tsl_cache_flush(ctx, x->handles[i]);
    }
    /* Keep x's cached copies: backward reads them on the same ranks. Drop the small ones. */
    tsl_whole_flush(gamma);
    tsl_whole_flush(beta);
    return st;
}

static tsl_status forward_train(const char *fn, int relu, tsl_tensor_t x, tsl_tensor_t gamma,
                                tsl_tensor_t beta, tsl_tensor_t running_mean,
                                tsl_tensor_t running_var, tsl_tensor_t saved, tsl_tensor_t y,
                                double eps, double momentum)
{
    tsl_status st = check_x(x, fn);
    if (st || (st = check_vector(gamma, x, 0, "gamma", fn)) ||
        (st = check_vector(beta, x, 0, "beta", fn)) ||
        (st = check_vector(running_mean, x, 0, "the running mean", fn)) ||
        (st = check_vector(running_var, x, 0, "the running variance", fn)) ||
        (st = check_vector(saved, x, 1, "saved", fn)) || (st = tsl_tensor_check(y, fn)) ||
        (st = tsl_tensor_check_same_layout(y, x, fn)))
        return st;
    if (!(eps > 0) || !isfinite(eps) || !(momentum >= 0 && momentum <= 1))
        return tsl_error(x->ctx, TSL_ERR_INVALID_ARG,
                         "%s: eps %g must be > 0 and momentum %g in [0, 1]", fn, eps, momentum);
    if (y == x)
        return tsl_error(x->ctx, TSL_ERR_INVALID_ARG, "%s: y may not overwrite x", fn);
    struct tsl_context *ctx = x->ctx;
    stats_job job = {.x = x};
    /* The sums on every rank that normalizes a tile or keeps a result: one hop from the tiles
     * (tsl_acc_allreduce_submit); each such rank finalizes its own copy of the statistics. */
    uint8_t *need = malloc((size_t)ctx->size);
    starpu_data_handle_t *total = calloc((size_t)ctx->size, sizeof *total);
    if (!need || !total) {
        free(need);
        free(total);
        return tsl_error(ctx, TSL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    }
    need_ranks(need, ctx->size, y, saved, running_mean, running_var, NULL);
    st = saved_copies(saved, need);
    if (!st)
        st = layer_sums(x, x->tile_owner, &job, need, total);
    tsl_bn_args a = args_for(x, -1, eps, momentum);
    enum starpu_data_access_mode rw[2] = {STARPU_R, STARPU_W};
    for (int32_t r = 0; r < ctx->size && !st; r++) {
        if (!total[r])
            continue;
        if (tsl_whole_handle(saved, r) != saved->handles[0] || r == saved->tile_owner[0]) {
            starpu_data_handle_t fin[2] = {total[r], tsl_whole_handle(saved, r)};
            st = submit(ctx, &tsl_cl_bn_finalize, &a, 2, fin, rw, 0);
        }
        if (!st && r == saved->tile_owner[0] && tsl_whole_handle(saved, r) != saved->handles[0]) {
            starpu_data_handle_t fin[2] = {total[r], saved->handles[0]};
            st = submit(ctx, &tsl_cl_bn_finalize, &a, 2, fin, rw, 0);
        }
    }
    enum starpu_data_access_mode rrw[2] = {STARPU_R, STARPU_RW};
    for (int which = 0; which < 2 && !st; which++) {
        a.which = which;
        tsl_tensor_t running = which ? running_var : running_mean;
        starpu_data_handle_t h[2] = {total[running->tile_owner[0]], running->handles[0]};
        st = submit(ctx, &tsl_cl_bn_running, &a, 2, h, rrw, 0);
    }
    release_all(ctx, total);
    free(need);
    free(total);
    return st ? st : normalize(x, gamma, beta, saved, y, relu, eps, momentum, NULL);
}

tsl_status tsl_batchnorm_forward_train(tsl_tensor_t x, tsl_tensor_t gamma, tsl_tensor_t beta,
                                       tsl_tensor_t running_mean, tsl_tensor_t running_var,
                                       tsl_tensor_t saved, tsl_tensor_t y, double eps,
                                       double momentum)
{
    return forward_train("tsl_batchnorm_forward_train", 0, x, gamma, beta, running_mean,
                         running_var, saved, y, eps, momentum);
}

tsl_status tsl_batchnorm_relu_forward_train(tsl_tensor_t x, tsl_tensor_t gamma, tsl_tensor_t beta,
                                            tsl_tensor_t running_mean, tsl_tensor_t running_var,
                                            tsl_tensor_t saved, tsl_tensor_t y, double eps,
                                            double momentum)
{
    return forward_train("tsl_batchnorm_relu_forward_train", 1, x, gamma, beta, running_mean,
                         running_var, saved, y, eps, momentum);
}

tsl_status tsl_batchnorm_relu_recompute(tsl_tensor_t x, tsl_tensor_t gamma, tsl_tensor_t beta,
                                        tsl_tensor_t saved, tsl_tensor_t y, double eps,
                                        tsl_tensor_t after)
{
    const char *fn = "batch norm + ReLU recomputed";
    tsl_status st = check_x(x, fn);
    if (st || (st = check_vector(gamma, x, 0, "gamma", fn)) ||
        (st = check_vector(beta, x, 0, "beta", fn)) ||
        (st = check_vector(saved, x, 1, "saved", fn)) || (st = tsl_tensor_check(y, fn)) ||
        (st = tsl_tensor_check_same_layout(y, x, fn)))
        return st;
    if (y == x)
        return tsl_error(x->ctx, TSL_ERR_INVALID_ARG, "%s: y may not overwrite x", fn);
    return normalize(x, gamma, beta, saved, y, 1, eps, 0, after);
}

tsl_status tsl_batchnorm_forward_infer(tsl_tensor_t x, tsl_tensor_t gamma, tsl_tensor_t beta,
                                       tsl_tensor_t running_mean, tsl_tensor_t running_var,
                                       tsl_tensor_t y, double eps)
{
    const char *fn = "tsl_batchnorm_forward_infer";
    tsl_status st = check_x(x, fn);
    if (st || (st = check_vector(gamma, x, 0, "gamma", fn)) ||
        (st = check_vector(beta, x, 0, "beta", fn)) ||
        (st = check_vector(running_mean, x, 0, "the running mean", fn)) ||
        (st = check_vector(running_var, x, 0, "the running variance", fn)) ||
        (st = tsl_tensor_check(y, fn)) || (st = tsl_tensor_check_same_layout(y, x, fn)))
        return st;
    if (!(eps > 0) || !isfinite(eps))
        return tsl_error(x->ctx, TSL_ERR_INVALID_ARG, "%s: eps %g must be > 0", fn, eps);
    if (y == x)
        return tsl_error(x->ctx, TSL_ERR_INVALID_ARG, "%s: y may not overwrite x", fn);
    for (int64_t i = 0; i < x->ntiles && !st; i++) {
        tsl_bn_args t = args_for(x, i, eps, 0);
        starpu_data_handle_t h[6] = {x->handles[i],
                                     running_mean->handles[0],
                                     running_var->handles[0],
                                     tsl_whole_handle(gamma, y->tile_owner[i]),
                                     tsl_whole_handle(beta, y->tile_owner[i]),
                                     y->handles[i]};
        enum starpu_data_access_mode m[6] = {STARPU_R, STARPU_R, STARPU_R,
                                             STARPU_R, STARPU_R, STARPU_W};
        st = submit(x->ctx, &tsl_cl_bn_infer, &t, 6, h, m,
                    4.0 * (double)tsl_tensor_tile_numel(x, i));
        if (x->tile_owner[i] != y->tile_owner[i])
            tsl_cache_flush(x->ctx, x->handles[i]);
    }
    tsl_tensor_t small[4] = {running_mean, running_var, gamma, beta};
    for (int k = 0; k < 4; k++)
        tsl_whole_flush(small[k]);
    return st;
}

/* Backward; with ReLU fused when beta is given (each task recomputes the ReLU's mask from x). */
static tsl_status backward(const char *fn, tsl_tensor_t x, tsl_tensor_t dy, tsl_tensor_t gamma,
                           tsl_tensor_t beta, tsl_tensor_t saved, tsl_tensor_t dx,
                           tsl_tensor_t dgamma, tsl_tensor_t dbeta)
{
    tsl_status st = check_x(x, fn);
    if (st || (st = tsl_tensor_check(dy, fn)) || (st = tsl_tensor_check_same_layout(dy, x, fn)) ||
        (st = check_vector(gamma, x, 0, "gamma", fn)) ||
        (st = check_vector(saved, x, 1, "saved", fn)))
        return st;
    if (beta && (st = check_vector(beta, x, 0, "beta", fn)))
        return st;
    if (dx && (st = tsl_tensor_check_same_layout(dx, x, fn)))
        return st;
    if ((dgamma && (st = check_vector(dgamma, x, 0, "dgamma", fn))) ||
        (dbeta && (st = check_vector(dbeta, x, 0, "dbeta", fn))))
        return st;
    if (dx == x || dx == dy || dgamma == gamma || (beta && dbeta == beta))
        return tsl_error(x->ctx, TSL_ERR_INVALID_ARG, "%s: a gradient may not overwrite an input",
                         fn);
    struct tsl_context *ctx = x->ctx;
    stats_job job = {.x = x, .dy = dy};
    if (beta) {
        job.saved = saved;
        job.gamma = gamma;
        job.beta = beta;
    }
    /* The sums on every rank that makes an input gradient tile or a parameter gradient, one
     * hop from the tiles; each input-gradient rank computes its own coefficients. */
    uint8_t *need = malloc((size_t)ctx->size);
    starpu_data_handle_t *total = calloc((size_t)ctx->size, sizeof *total);
    starpu_data_handle_t *coef = calloc((size_t)ctx->size, sizeof *coef);
    if (!need || !total || !coef) {
        free(need);
        free(total);
        free(coef);
        return tsl_error(ctx, TSL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    }
    need_ranks(need, ctx->size, dx, dgamma, dbeta, NULL, NULL);
    st = layer_sums(x, dy->tile_owner, &job, need, total);
    tsl_bn_args a = args_for(x, -1, 0, 0);
    enum starpu_data_access_mode rrw[3] = {STARPU_R, STARPU_R, STARPU_W};
    for (int which = 0; which < 2 && !st; which++) {
        tsl_tensor_t grad = which ? dgamma : dbeta;
        if (!grad)
            continue;
        a.which = which;
        int32_t r = grad->tile_owner[0];
        starpu_data_handle_t h[3] = {total[r], tsl_whole_handle(saved, r), grad->handles[0]};
        st = submit(ctx, &tsl_cl_bn_param_grad, &a, 3, h, rrw, 0);
    }
    for (int64_t i = 0; dx && i < dx->ntiles && !st; i++) {
        int32_t r = dx->tile_owner[i];
        if (coef[r])
            continue;
        if (!(st = tsl_temp_handle_register(ctx, 2 * x->shape.dims[1], sizeof(double), r,
                                            &coef[r]))) {
            starpu_data_handle_t h[3] = {total[r], tsl_whole_handle(saved, r), coef[r]};
            st = submit(ctx, &tsl_cl_bn_bwd_coef, &a, 3, h, rrw, 0);
        }
    }
    release_all(ctx, total);
    for (int64_t i = 0; dx && i < x->ntiles && !st; i++) {
        tsl_bn_args t = args_for(x, i, 0, 0);
        t.relu = beta != NULL;
        int32_t r = dx->tile_owner[i];
        starpu_data_handle_t h[7] = {x->handles[i],
                                     dy->handles[i],
                                     tsl_whole_handle(saved, r),
                                     tsl_whole_handle(gamma, r),
                                     coef[r],
                                     dx->handles[i],
                                     beta ? tsl_whole_handle(beta, r) : NULL};
        enum starpu_data_access_mode m[7] = {STARPU_R, STARPU_R, STARPU_R, STARPU_R,
                                             STARPU_R, STARPU_W, STARPU_R};
        st = submit(ctx, &tsl_cl_bn_bwd_data, &t, beta ? 7 : 6, h, m,
                    6.0 * (double)tsl_tensor_tile_numel(x, i));
        for (int k = 0; k < 2; k++) {
            tsl_tensor_t read = k ? dy : x;
            if (read->tile_owner[i] != dx->tile_owner[i])
                tsl_cache_flush(ctx, read->handles[i]);
        }
    }
    release_all(ctx, coef);
    free(need);
    free(total);
    free(coef);
    tsl_tensor_t small[3] = {saved, gamma, beta};
    for (int k = 0; k < 3; k++)
        if (small[k])
            tsl_whole_flush(small[k]);
    return st;
}

tsl_status tsl_batchnorm_backward(tsl_tensor_t x, tsl_tensor_t dy, tsl_tensor_t gamma,
                                  tsl_tensor_t saved, tsl_tensor_t dx, tsl_tensor_t dgamma,
                                  tsl_tensor_t dbeta)
{
    return backward("tsl_batchnorm_backward", x, dy, gamma, NULL, saved, dx, dgamma, dbeta);
}

tsl_status tsl_batchnorm_relu_backward(tsl_tensor_t x, tsl_tensor_t dy, tsl_tensor_t gamma,
                                       tsl_tensor_t beta, tsl_tensor_t saved, tsl_tensor_t dx,
                                       tsl_tensor_t dgamma, tsl_tensor_t dbeta)
{
    const char *fn = "tsl_batchnorm_relu_backward";
    tsl_status st = tsl_tensor_check(beta, fn);
    return st ? st : backward(fn, x, dy, gamma, beta, saved, dx, dgamma, dbeta);
}
