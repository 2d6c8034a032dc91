/* Group normalization on tiled tensors with exact statistics over any tiling (codelets in
 * codelets/groupnorm.h). A sample's statistics depend only on the tiles of its sample slab,
 * so each slab merges its own accumulators (one hop, on the ranks that normalize its tiles):
 * sample-parallel plans exchange nothing for them. The backward merges each slab's per-(sample,
 * channel) sums on the ranks of its input-gradient tiles, and the parameter gradients sum each
 * slab's per-channel accumulators over the slabs. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "codelets/groupnorm.h"
#include "internal.h"

static tsl_status check_x(tsl_tensor_t x, int64_t groups, const char *fn)
{
    tsl_status st = tsl_tensor_check(x, fn);
    if (st || (st = tsl_tensor_check_float(x, fn)))
        return st;
    if (x->shape.ndim < 2)
        return tsl_error(x->ctx, TSL_ERR_SHAPE, "%s: x needs N and C dimensions", fn);
    if (groups < 1 || x->shape.dims[1] % groups)
        return tsl_error(x->ctx, TSL_ERR_SHAPE, "%s: %lld groups do not divide %lld channels", fn,
                         (long long)groups, (long long)x->shape.dims[1]);
    return TSL_OK;
}

/* gamma, beta and their gradients: one tile of C values of x's dtype. */
static tsl_status check_vector(tsl_tensor_t v, tsl_tensor_t x, const char *what, const char *fn)
{
    tsl_status st = tsl_tensor_check(v, fn);
    if (st)
        return st;
    if (v->ctx != x->ctx || v->ntiles != 1 || v->dtype != x->dtype || v->shape.ndim != 1 ||
        v->shape.dims[0] != x->shape.dims[1])
        return tsl_error(x->ctx, TSL_ERR_SHAPE, "%s: %s must be one tile of C values of x's dtype",
                         fn, what);
    return TSL_OK;
}

/* The saved statistics: one f64 tile of (N, G, 2). */
static tsl_status check_saved(tsl_tensor_t saved, tsl_tensor_t x, int64_t groups, const char *fn)
{
    tsl_status st = tsl_tensor_check(saved, fn);
    if (st)
        return st;
    if (saved->ctx != x->ctx || saved->ntiles != 1 || saved->dtype != TSL_F64 ||
        saved->shape.ndim != 3 || saved->shape.dims[0] != x->shape.dims[0] ||
        saved->shape.dims[1] != groups || saved->shape.dims[2] != 2)
        return tsl_error(x->ctx, TSL_ERR_SHAPE, "%s: saved must be one f64 tile of (N, G, 2)", fn);
    return TSL_OK;
}

static tsl_gn_args args_for(tsl_tensor_t x, int64_t groups, int64_t tile, double eps)
{
    tsl_gn_args a;
    memset(&a, 0, sizeof a);
    a.dtype = x->dtype;
    a.channels_last = x->layout == TSL_LAYOUT_CHANNELS_LAST;
    a.channels = x->shape.dims[1];
    a.groups = groups;
    a.batch = x->shape.dims[0];
    a.per_group = tsl_shape_numel(&x->shape) / x->shape.dims[0] / groups;
    a.eps = eps;
    int64_t start[TSL_MAX_DIMS], extent[TSL_MAX_DIMS];
    tsl_tensor_tile_box(x, tile, start, extent);
    a.samples = extent[0];
    a.n0 = start[0];
    a.c0 = start[1];
    a.cext = extent[1];
    a.inner = 1;
    for (int d = 2; d < x->shape.ndim; d++)
        a.inner *= extent[d];
    return a;
}

static tsl_status submit(struct tsl_context *ctx, struct starpu_codelet *cl, const tsl_gn_args *a,
                         int n, const starpu_data_handle_t *handles,
                         const enum starpu_data_access_mode *modes, double flops)
{
    return tsl_task_submit_handles(ctx, cl, a, sizeof *a, n, handles, modes, flops);
}

/* One sample slab: its tiles (of x; dy and y are tiled alike) and their owners; with a fused
 * ReLU, what its backward sums read to mask dy. */
typedef struct slab_job {
    tsl_tensor_t x, dy;
    tsl_tensor_t saved, gamma, beta; /* beta non-NULL: ReLU fused */
    int64_t groups;
    int64_t count, *tile; /* [count] tile indices */
    int32_t *owner;       /* [count] the owners of the accumulators */
} slab_job;

/* The forward's per-(sample, group) sums of x, or with dy the backward's per-(sample,
 * channel) sums of dy and dy x, of slab tile k. */
static tsl_status slab_fill(int64_t k, starpu_data_handle_t acc, void *user)
{
    slab_job *job = user;
    int64_t i = job->tile[k];
    tsl_gn_args a = args_for(job->x, job->groups, i, 0);
    double numel = (double)tsl_tensor_tile_numel(job->x, i);
    if (!job->dy) {
        starpu_data_handle_t h[2] = {job->x->handles[i], acc};
        enum starpu_data_access_mode m[2] = {STARPU_R, STARPU_W};
        return submit(job->x->ctx, &tsl_cl_gn_stats, &a, 2, h, m, 3.0 * numel);
    }
    a.relu = job->beta != NULL;
    starpu_data_handle_t h[6] = {job->x->handles[i], job->dy->handles[i], acc};
    enum starpu_data_access_mode m[6] = {STARPU_R, STARPU_R, STARPU_W,
                                         STARPU_R, STARPU_R, STARPU_R};
    if (a.relu) {
        int32_t r = job->owner[k];
        h[3] = tsl_whole_handle(job->saved, r);
        h[4] = tsl_whole_handle(job->gamma, r);
        h[5] = tsl_whole_handle(job->beta, r);
    }
    return submit(job->x->ctx, &tsl_cl_gn_bwd_sums, &a, a.relu ? 6 : 3, h, m,
                  (a.relu ? 6.0 : 4.0) * numel);
}

/* The slabs of x: slab_of[i] for each tile, and the count. */
static int64_t slabs_of(tsl_tensor_t x, int64_t *slab_of, int64_t *first)
{
    int64_t n = 0;
    for (int64_t i = 0; i < x->ntiles; i++) {
        int64_t start[TSL_MAX_DIMS], extent[TSL_MAX_DIMS];
        tsl_tensor_tile_box(x, i, start, extent);
        int64_t s = 0;
        while (s < n && first[s] != start[0])
            s++;
        if (s == n)
            first[n++] = start[0];
        slab_of[i] = s;
    }
    return n;
}

typedef struct gn_work {
    int64_t *slab_of, *first, *tile;
    int32_t *owner;
    uint8_t *need;
    starpu_data_handle_t *total, *per_rank;
} gn_work;

static void work_free(gn_work *w)
{
    free(w->slab_of);
    free(w->first);
    free(w->tile);
    free(w->owner);
    free(w->need);
    free(w->total);
    free(w->per_rank);
}

static tsl_status work_alloc(struct tsl_context *ctx, tsl_tensor_t x, gn_work *w, const char *fn)
{
    memset(w, 0, sizeof *w);
    size_t n = (size_t)x->ntiles, r = (size_t)ctx->size;
    w->slab_of = malloc(n * sizeof *w->slab_of);
    w->first = malloc(n * sizeof *w->first);
    w->tile = malloc(n * sizeof *w->tile);
    w->owner = malloc(n * sizeof *w->owner);
    w->need = malloc(r);
    w->total = calloc(r, sizeof *w->total);
    w->per_rank = calloc(r, sizeof *w->per_rank);
    if (!w->slab_of || !w->first || !w->tile || !w->owner || !w->need || !w->total ||
        !w->per_rank) {
        work_free(w);
        return tsl_error(ctx, TSL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    }
    return TSL_OK;
}

/* Slab s's tiles into w->tile, with their accumulators' owners (`acc_owner`'s) and the ranks
 * of `placed`'s tiles marked in w->need; returns the count. */
static int64_t slab_tiles(tsl_tensor_t x, const gn_work *w, int64_t s, const int32_t *acc_owner,
                          tsl_tensor_t placed)
{
    int64_t n = 0;
    memset(w->need, 0, (size_t)x->ctx->size);
    for (int64_t i = 0; i < x->ntiles; i++)
        if (w->slab_of[i] == s) {
            w->tile[n] = i;
            w->owner[n++] = acc_owner[i];
            w->need[placed->tile_owner[i]] = 1;
        }
    return n;
}

static void release_all(struct tsl_context *ctx, starpu_data_handle_t *h)
{
    for (int32_t r = 0; r < ctx->size; r++)
        if (h[r]) {
            tsl_temp_handle_release(ctx, h[r]);
            h[r] = NULL;
        }
}

/* The forward, with ReLU fused into the normalize tasks when `relu`. */
static tsl_status forward(const char *fn, int relu, tsl_tensor_t x, tsl_tensor_t gamma,
                          tsl_tensor_t beta, int64_t groups, tsl_tensor_t saved, tsl_tensor_t y,
                          double eps)
{
    tsl_status st = check_x(x, groups, fn);
    if (st || (st = check_vector(gamma, x, "gamma", fn)) ||
        (st = check_vector(beta, x, "beta", fn)) || (st = check_saved(saved, x, groups, fn)) ||
        (st = tsl_tensor_check(y, fn)) || (st = tsl_tensor_check_same_layout(y, x, fn)))
        return st;
    if (!(eps > 0) || !isfinite(eps))
        return tsl_error(x->ctx, TSL_ERR_INVALID_ARG, "%s: eps %g must be > 0", fn, eps);
    if (y == x)
        return tsl_error(x->ctx, TSL_ERR_INVALID_ARG, "%s: y may not overwrite x", fn);
    struct tsl_context *ctx = x->ctx;
    gn_work w;
    if ((st = work_alloc(ctx, x, &w, fn)))
        return st;
    int64_t nslabs = slabs_of(x, w.slab_of, w.first);
    const int32_t keeper = saved->tile_owner[0];
    for (int64_t s = 0; s < nslabs && !st; s++) {
        slab_job job = {.x = x, .groups = groups, .tile = w.tile, .owner = w.owner};
        job.count = slab_tiles(x, &w, s, x->tile_owner, y);
        uint8_t normalizes_on_keeper = w.need[keeper];
        w.need[keeper] = 1;
        tsl_gn_args a = args_for(x, groups, w.tile[0], eps); /* the slab's samples and n0 */
        st = tsl_acc_allreduce_submit(ctx, job.count, w.owner, 2 * groups * a.samples, slab_fill,
                                      &job, w.need, w.total);
        enum starpu_data_access_mode rw[2] = {STARPU_R, STARPU_W}, rrw[2] = {STARPU_R, STARPU_RW};
        for (int32_t r = 0; r < ctx->size && !st; r++) {
            if (!w.total[r])
                continue;
            if (r == keeper) {
                starpu_data_handle_t h[2] = {w.total[r], saved->handles[0]};
                st = submit(ctx, &tsl_cl_gn_save, &a, 2, h, rrw, 0);
            }
            if (!st && (r != keeper || normalizes_on_keeper) &&
                !(st = tsl_temp_handle_register(ctx, 2 * a.samples * groups, sizeof(double), r,
                                                &w.per_rank[r]))) {
                starpu_data_handle_t h[2] = {w.total[r], w.per_rank[r]};
                st = submit(ctx, &tsl_cl_gn_finalize, &a, 2, h, rw, 0);
            }
        }
        release_all(ctx, w.total);
        for (int64_t k = 0; k < job.count && !st; k++) {
            int64_t i = w.tile[k];
            int32_t r = y->tile_owner[i];
            tsl_gn_args t = args_for(x, groups, i, eps);
            t.relu = relu;
            starpu_data_handle_t h[5] = {x->handles[i], w.per_rank[r], tsl_whole_handle(gamma, r),
                                         tsl_whole_handle(beta, r), y->handles[i]};
            enum starpu_data_access_mode m[5] = {STARPU_R, STARPU_R, STARPU_R, STARPU_R, STARPU_W};
            st = submit(ctx, &tsl_cl_gn_normalize, &t, 5, h, m,
                        4.0 * (double)tsl_tensor_tile_numel(x, i));
            if (x->tile_owner[i] != r)
                tsl_cache_flush(ctx, x->handles[i]);
        }
        release_all(ctx, w.per_rank);
    }
    release_all(ctx, w.total);
    work_free(&w);
    tsl_whole_flush(gamma);
    tsl_whole_flush(beta);
    return st;
}

tsl_status tsl_groupnorm_forward(tsl_tensor_t x, tsl_tensor_t gamma, tsl_tensor_t beta,
                                 int64_t groups, tsl_tensor_t saved, tsl_tensor_t y, double eps)
{
    return forward("tsl_groupnorm_forward", 0, x, gamma, beta, groups, saved, y, eps);
}

tsl_status tsl_groupnorm_relu_forward(tsl_tensor_t x, tsl_tensor_t gamma, tsl_tensor_t beta,
                                      int64_t groups, tsl_tensor_t saved, tsl_tensor_t y,
                                      double eps)
{
    return forward("tsl_groupnorm_relu_forward", 1, x, gamma, beta, groups, saved, y, eps);
}

tsl_status tsl_groupnorm_relu_recompute(tsl_tensor_t x, tsl_tensor_t gamma, tsl_tensor_t beta,
                                        int64_t groups, tsl_tensor_t saved, tsl_tensor_t y,
                                        double eps, tsl_tensor_t after)
{
    const char *fn = "group norm + ReLU recomputed";
    tsl_status st = check_x(x, groups, fn);
    if (st || (st = check_vector(gamma, x, "gamma", fn)) ||
        (st = check_vector(beta, x, "beta", fn)) || (st = check_saved(saved, x, groups, fn)) ||
        (st = tsl_tensor_check(y, fn)) || (st = tsl_tensor_check_same_layout(y, x, fn)))
        return st;
    if (y == x)
        return tsl_error(x->ctx, TSL_ERR_INVALID_ARG, "%s: y may not overwrite x", fn);
    struct tsl_context *ctx = x->ctx;
    for (int64_t i = 0; i < x->ntiles && !st; i++) {
        int32_t r = y->tile_owner[i];
        tsl_gn_args t = args_for(x, groups, i, eps);
        t.relu = 1;
        t.saved_stats = 1;
        /* (a tile of `after` on r: the task waits for the backward to get there) */
        starpu_data_handle_t order = tsl_tile_on(after, y->ntiles, i, r);
        starpu_data_handle_t h[6] = {x->handles[i],
                                     tsl_whole_handle(saved, r),
                                     tsl_whole_handle(gamma, r),
                                     tsl_whole_handle(beta, r),
                                     y->handles[i],
                                     order};
        enum starpu_data_access_mode m[6] = {STARPU_R, STARPU_R, STARPU_R,
                                             STARPU_R, STARPU_W, STARPU_R};
        st = submit(ctx, &tsl_cl_gn_normalize, &t, order ? 6 : 5, h, m,
                    4.0 * (double)tsl_tensor_tile_numel(x, i));
        if (x->tile_owner[i] != r)
            tsl_cache_flush(ctx, x->handles[i]);
    }
    tsl_whole_flush(gamma);
    tsl_whole_flush(beta);
    return st;
}

/* Each slab's per-channel accumulators for the parameter gradients, from its totals. */
typedef struct channel_job {
    struct tsl_context *ctx;
    tsl_tensor_t saved;
    starpu_data_handle_t *total; /* [slabs] each slab's totals, on owner[k] */
    int32_t *owner;
    tsl_gn_args *args; /* [slabs] */
} channel_job;

static tsl_status channel_fill(int64_t k, starpu_data_handle_t acc, void *user)
{
    channel_job *job = user;
    starpu_data_handle_t h[3] = {job->total[k], tsl_whole_handle(job->saved, job->owner[k]), acc};
    enum starpu_data_access_mode m[3] = {STARPU_R, STARPU_R, STARPU_W};
    return submit(job->ctx, &tsl_cl_gn_slab_channels, &job->args[k], 3, h, m, 0);
}

/* The backward; with ReLU fused when beta is given (each task masks dy by the forward's y > 0,
 * recomputed from x). */
static tsl_status backward(const char *fn, tsl_tensor_t x, tsl_tensor_t dy, tsl_tensor_t gamma,
                           tsl_tensor_t beta, int64_t groups, tsl_tensor_t saved, tsl_tensor_t dx,
                           tsl_tensor_t dgamma, tsl_tensor_t dbeta)
{
    tsl_status st = check_x(x, groups, fn);
    if (st || (st = tsl_tensor_check(dy, fn)) || (st = tsl_tensor_check_same_layout(dy, x, fn)) ||
        (st = check_vector(gamma, x, "gamma", fn)) || (st = check_saved(saved, x, groups, fn)))
        return st;
    if ((dx && (st = tsl_tensor_check_same_layout(dx, x, fn))) ||
        (dgamma && (st = check_vector(dgamma, x, "dgamma", fn))) ||
        (dbeta && (st = check_vector(dbeta, x, "dbeta", fn))))
        return st;
    if (beta && (st = check_vector(beta, x, "beta", fn)))
        return st;
    if (dx == x || dx == dy || dgamma == gamma || (dgamma && dgamma == dbeta) ||
        (beta && (dbeta == beta || dgamma == beta)))
        return tsl_error(x->ctx, TSL_ERR_INVALID_ARG,
                         "%s: a gradient may not overwrite an input or another gradient", fn);
    const int params = dgamma || dbeta;
    if (!dx && !params)
        return TSL_OK;
    struct tsl_context *ctx = x->ctx;
    gn_work w;
    if ((st = work_alloc(ctx, x, &w, fn)))
        return st;
    int64_t nslabs = slabs_of(x, w.slab_of, w.first);
    channel_job cj = {.ctx = ctx, .saved = saved};
    cj.total = calloc((size_t)nslabs, sizeof *cj.total);
    cj.owner = malloc(sizeof *cj.owner * (size_t)nslabs);
    cj.args = malloc(sizeof *cj.args * (size_t)nslabs);
    if (!cj.total || !cj.owner || !cj.args)
        st = tsl_error(ctx, TSL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    /* Each slab's per-(sample, channel) sums on the ranks of its dx tiles (and, for the
     * parameter gradients, on the rank of its first tile's), coefficients there, then dx. */
    for (int64_t s = 0; s < nslabs && !st; s++) {
        slab_job job = {.x = x,
                        .dy = dy,
                        .saved = saved,
                        .gamma = gamma,
                        .beta = beta,
                        .groups = groups,
                        .tile = w.tile,
                        .owner = w.owner};
        job.count = slab_tiles(x, &w, s, dy->tile_owner, dx ? dx : dy);
        tsl_gn_args a = args_for(x, groups, w.tile[0], 0); /* the slab's samples and n0 */
        int32_t keeper = (dx ? dx : dy)->tile_owner[w.tile[0]];
        if (!dx)
            memset(w.need, 0, (size_t)ctx->size);
        w.need[keeper] = 1;
        st = tsl_acc_allreduce_submit(ctx, job.count, w.owner, 2 * x->shape.dims[1] * a.samples,
                                      slab_fill, &job, w.need, w.total);
        enum starpu_data_access_mode m4[4] = {STARPU_R, STARPU_R, STARPU_R, STARPU_W};
        for (int32_t r = 0; dx && r < ctx->size && !st; r++)
            if (w.total[r] && !(st = tsl_temp_handle_register(ctx, 2 * a.samples * groups,
                                                              sizeof(double), r, &w.per_rank[r]))) {
                starpu_data_handle_t h[4] = {w.total[r], tsl_whole_handle(saved, r),
                                             tsl_whole_handle(gamma, r), w.per_rank[r]};
                st = submit(ctx, &tsl_cl_gn_bwd_coef, &a, 4, h, m4, 0);
            }
        if (params) { /* kept for the parameter gradients */
            cj.total[s] = w.total[keeper];
            cj.owner[s] = keeper;
            cj.args[s] = a;
            w.total[keeper] = NULL;
        }
        release_all(ctx, w.total);
        for (int64_t k = 0; dx && k < job.count && !st; k++) {
            int64_t i = w.tile[k];
            int32_t r = dx->tile_owner[i];
            tsl_gn_args t = args_for(x, groups, i, 0);
            t.relu = beta != NULL;
            starpu_data_handle_t h[7] = {x->handles[i],
                                         dy->handles[i],
                                         tsl_whole_handle(saved, r),
                                         tsl_whole_handle(gamma, r),
                                         w.per_rank[r],
                                         dx->handles[i],
                                         beta ? tsl_whole_handle(beta, r) : NULL};
            enum starpu_data_access_mode m[7] = {STARPU_R, STARPU_R, STARPU_R, STARPU_R,
                                                 STARPU_R, STARPU_W, STARPU_R};
            st = submit(ctx, &tsl_cl_gn_bwd_data, &t, beta ? 7 : 6, h, m,
                        (beta ? 10.0 : 8.0) * (double)tsl_tensor_tile_numel(x, i));
            for (int q = 0; q < 2; q++) {
                tsl_tensor_t read = q ? dy : x;
                if (read->tile_owner[i] != r)
                    tsl_cache_flush(ctx, read->handles[i]);
            }
        }
        release_all(ctx, w.per_rank);
    }
    /* the parameter gradients: the slabs' per-channel accumulators, summed on their owners */
    if (params && !st) {
        memset(w.need, 0, (size_t)ctx->size);
        if (dgamma)
            w.need[dgamma->tile_owner[0]] = 1;
        if (dbeta)
            w.need[dbeta->tile_owner[0]] = 1;
        st = tsl_acc_allreduce_submit(ctx, nslabs, cj.owner, 2 * x->shape.dims[1], channel_fill,
                                      &cj, w.need, w.total);
        tsl_gn_args a = args_for(x, groups, 0, 0);
        enum starpu_data_access_mode rw[2] = {STARPU_R, STARPU_W};
        for (int which = 0; which < 2 && !st; which++) {
            tsl_tensor_t grad = which ? dgamma : dbeta;
            if (!grad)
                continue;
            a.which = which;
            starpu_data_handle_t h[2] = {w.total[grad->tile_owner[0]], grad->handles[0]};
            st = submit(ctx, &tsl_cl_gn_param_grad, &a, 2, h, rw, 0);
        }
    }
    for (int64_t s = 0; cj.total && s < nslabs; s++)
        if (cj.total[s])
            tsl_temp_handle_release(ctx, cj.total[s]);
    free(cj.total);
    free(cj.owner);
    free(cj.args);
    release_all(ctx, w.total);
    release_all(ctx, w.per_rank);
    work_free(&w);
    tsl_whole_flush(gamma);
    tsl_whole_flush(saved);
    if (beta)
        tsl_whole_flush(beta);
    return st;
}

tsl_status tsl_groupnorm_backward(tsl_tensor_t x, tsl_tensor_t dy, tsl_tensor_t gamma,
                                  int64_t groups, tsl_tensor_t saved, tsl_tensor_t dx,
                                  tsl_tensor_t dgamma, tsl_tensor_t dbeta)
{
    return backward("tsl_groupnorm_backward", x, dy, gamma, NULL, groups, saved, dx, dgamma, dbeta);
}

tsl_status tsl_groupnorm_relu_backward(tsl_tensor_t x, tsl_tensor_t dy, tsl_tensor_t gamma,
                                       tsl_tensor_t beta, int64_t groups, tsl_tensor_t saved,
                                       tsl_tensor_t dx, tsl_tensor_t dgamma, tsl_tensor_t dbeta)
{
    const char *fn = "tsl_groupnorm_relu_backward";
    if (!beta) {
        tsl_status st = tsl_tensor_check(x, fn);
        return st ? st : tsl_error(x->ctx, TSL_ERR_INVALID_ARG, "%s: beta is required", fn);
    }
    return backward(fn, x, dy, gamma, beta, groups, saved, dx, dgamma, dbeta);
}
