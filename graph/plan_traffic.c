/* The bytes each rank sends in one training step of a plan (tsl_plan_estimate_traffic()), term
 * by term, as the lowering moves them: parameters (sharded weights' reduce-scatter and
 * allgather, buckets' trees, the replicated parameters' refresh), batch-norm statistics (the
 * one-hop exchange of exact accumulators), halo slabs of spatially tiled convolutions (forward
 * and the backward's returned slabs), values crossing pipeline stages (activations forward,
 * gradients backward) and the losses' accumulators. Pure C: geometry and placement only. */
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "graph_internal.h"
#include "plan_internal.h"
#include "tessel/plan.h"

/* Up to this many ranks with tiles, batch-norm sums go one hop from each rank to every rank
 * that needs them (src/reduce.c, tsl_acc_allreduce_submit's default); beyond, one tree over the
 * tiles and a copy to each. */
#define TRAFFIC_DIRECT_RANKS 8

/* The tiles of one (batch, sample...) tensor: their boxes and owners. */
typedef struct tiles {
    int64_t n;
    int ndim;
    int32_t samples; /* sample tiles (the grid's first dimension): tile i has sample tile
                        i / (n / samples), tiles in row-major order */
    int64_t (*lo)[TSL_MAX_DIMS], (*ext)[TSL_MAX_DIMS];
    int32_t *rank;
} tiles;

static void tiles_free(tiles *t)
{
    free(t->lo);
    free(t->ext);
    free(t->rank);
    memset(t, 0, sizeof *t);
}

/* The tiles of value v of g on `stage` (tsl_plan_value_tiling()). */
/* The tiles of a (batch, sample...) tensor cut by `grid` and dealt by `owners`. */
static tsl_status tiles_of_grid(const tsl_tile_grid *grid_in, const tsl_owner_map *owners,
                                const tsl_shape *sample, int32_t nranks, int64_t batch, tiles *t)
{
    memset(t, 0, sizeof *t);
    const tsl_tile_grid grid = *grid_in;
    tsl_status st = TSL_OK;
    tsl_shape whole;
    tsl_batch_shape(batch, sample, &whole);
    t->ndim = whole.ndim;
    t->samples = grid.splits[0];
    t->n = 1;
    for (int d = 0; d < whole.ndim; d++)
        t->n *= grid.splits[d];
    t->lo = malloc(sizeof *t->lo * (size_t)t->n);
    t->ext = malloc(sizeof *t->ext * (size_t)t->n);
    t->rank = malloc(sizeof *t->rank * (size_t)t->n);
    if (!t->lo || !t->ext || !t->rank) {
        tiles_free(t);
        return tsl_error(NULL, TSL_ERR_OUT_OF_MEMORY, "tsl_plan_estimate_traffic: out of memory");
    }
    for (int64_t i = 0; i < t->n && !st; i++) {
        int32_t coords[TSL_MAX_DIMS] = {0};
        int64_t rest = i;
        for (int d = whole.ndim - 1; d >= 0; d--) {
            coords[d] = (int32_t)(rest % grid.splits[d]);
            rest /= grid.splits[d];
            tsl_tile_extent(whole.dims[d], grid.splits[d], coords[d], &t->lo[i][d], &t->ext[i][d]);
        }
        st = tsl_owner_map_rank(owners, coords, whole.ndim, &grid, nranks, &t->rank[i]);
    }
    if (st)
        tiles_free(t);
    return st;
}

static tsl_status tiles_of(const tsl_plan *plan, const struct tsl_graph *g, int32_t v,
                           int32_t nranks, int32_t stage, int32_t workers, int64_t batch, tiles *t)
{
    memset(t, 0, sizeof *t);
    tsl_tile_grid grid;
    tsl_owner_map owners;
    tsl_domain_owners own;
    tsl_status st =
        tsl_plan_value_tiling(plan, g, v, nranks, stage, workers, batch, &own, &grid, &owners);
    return st ? st : tiles_of_grid(&grid, &owners, &g->values[v].shape, nranks, batch, t);
}

static int64_t tile_numel(const tiles *t, int64_t i)
{
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++)
        n *= t->ext[i][d];
    return n;
}

/* The elements of tile i of t inside the per-sample box [start, stop) (all its samples). */
static int64_t box_numel(const tiles *t, int64_t i, const int64_t *start, const int64_t *stop)
{
    int64_t n = t->ext[i][0];
    for (int d = 1; d < t->ndim; d++) {
        int64_t lo = t->lo[i][d] > start[d - 1] ? t->lo[i][d] : start[d - 1];
        int64_t hi =
            t->lo[i][d] + t->ext[i][d] < stop[d - 1] ? t->lo[i][d] + t->ext[i][d] : stop[d - 1];
        n *= hi > lo ? hi - lo : 0;
    }
    return n;
}

/* Mark in `has` the ranks owning a tile of t. */
static void ranks_of(const tiles *t, int32_t nranks, uint8_t *has)
{
    memset(has, 0, (size_t)nranks);
    for (int64_t i = 0; i < t->n; i++)
        has[t->rank[i]] = 1;
}

/* The exact accumulators' exchange (tsl_acc_allreduce_submit): `bytes` per rank's partial,
 * counted where they are sent (or, with `received`, where they arrive). */
static void acc_exchange(const tiles *t, int32_t nranks, const uint8_t *need, int64_t bytes,
                         int received, int64_t *sent)
{
    uint8_t *has = calloc((size_t)nranks, 1);
    if (!has)
        return;
    ranks_of(t, nranks, has);
    int32_t holders = 0;
    for (int32_t r = 0; r < nranks; r++)
        holders += has[r];
    if (holders <= TRAFFIC_DIRECT_RANKS) {
        for (int32_t q = 0; q < nranks; q++)
            for (int32_t r = 0; r < nranks && has[q]; r++)
                sent[received ? r : q] += (r != q && need[r]) ? bytes : 0;
    } else { /* a pairwise tree over the tiles, then a copy to each rank that needs it */
        for (int64_t step = 1; step < t->n; step *= 2)
            for (int64_t i = 0; i + step < t->n; i += 2 * step)
                sent[t->rank[received ? i : i + step]] +=
                    t->rank[i + step] != t->rank[i] ? bytes : 0;
        for (int32_t r = 0; r < nranks; r++)
            sent[received ? r : t->rank[0]] += (need[r] && r != t->rank[0]) ? bytes : 0;
    }
    free(has);
}

static void acc_allreduce(const tiles *t, int32_t nranks, const uint8_t *need, int64_t bytes,
                          int64_t *sent)
{
    acc_exchange(t, nranks, need, bytes, 0, sent);
}

/* Batch norm's sums (src/lower/batchnorm.c, layer_sums): 2 C accumulators among all of x's
 * tiles, or where x is cut along its channels (up to 31 ranges, the pack's limit) each
 * range's 2 C_k among its own tiles. */
static void batchnorm_sums(const tiles *x, int32_t nranks, const uint8_t *need, int64_t channels,
                           int received, int64_t *sent)
{
    int32_t ranges = 0; /* the channel ranges: each step finds the next range's first */
    for (int64_t first = 0; x->ndim > 1 && first < channels; ranges++) {
        int64_t next = channels;
        for (int64_t i = 0; i < x->n; i++)
            if (x->lo[i][1] > first && x->lo[i][1] < next)
                next = x->lo[i][1];
        first = next;
    }
    if (ranges <= 1 || ranges > 31) {
        acc_exchange(x, nranks, need, 2 * channels * TSL_PLAN_ACC_BYTES, received, sent);
        return;
    }
    tiles part = *x;
    part.rank = malloc(sizeof *part.rank * (size_t)(x->n + 1));
    if (!part.rank)
        return;
    for (int64_t first = 0; first < channels;) {
        int64_t count = 0;
        part.n = 0;
        for (int64_t i = 0; i < x->n; i++)
            if (x->lo[i][1] == first) {
                part.rank[part.n++] = x->rank[i];
                count = x->ext[i][1];
            }
        acc_exchange(&part, nranks, need, 2 * count * TSL_PLAN_ACC_BYTES, received, sent);
        first += count > 0 ? count : channels;
    }
    free(part.rank);
}

/* Sample slab s of t (its tiles are in row-major order, the sample tile first). */
static tiles slab_of(const tiles *t, int32_t s)
{
    tiles slab = *t;
    int64_t per = t->n / t->samples;
    slab.n = per;
    slab.samples = 1;
    slab.lo += s * per;
    slab.ext += s * per;
    slab.rank += s * per;
    return slab;
}

/* Group norm (tsl_groupnorm_forward/backward): each sample slab's (sample, group) sums of x among
 * the slab's ranks (from x's ranks to y's and the statistics' keeper), and its backward's
 * (sample, channel) sums (from y's ranks to x's, those of the input gradient; without one, to
 * the first tile's rank); the saved statistics from the keeper to the other ranks of the input
 * gradient; each slab's 2 C parameter-gradient accumulators, made on the rank of its first
 * tile, to the parameters' owners. */
static void groupnorm_traffic(const struct tsl_graph *g, const tsl_graph_op *op, const tiles *x,
                              const tiles *y, int32_t keeper, const int32_t *param_owner,
                              int32_t nranks, uint8_t *need, int64_t *sent)
{
    const int has_dx = !tsl_graph_is_input(g, op->inputs[0]);
    const int64_t channels = g->values[op->inputs[0]].shape.dims[0];
    int64_t batch = 0;
    int32_t *first = malloc(sizeof *first * (size_t)x->samples);
    if (!first)
        return;
    for (int32_t s = 0; s < x->samples; s++) {
        tiles xs = slab_of(x, s), ys = slab_of(y, s);
        int64_t samples = xs.ext[0][0];
        batch += samples;
        memset(need, 0, (size_t)nranks);
        ranks_of(&ys, nranks, need);
        need[keeper] = 1;
        acc_allreduce(&xs, nranks, need, 2 * samples * op->norm_groups * TSL_PLAN_ACC_BYTES, sent);
        memset(need, 0, (size_t)nranks);
        if (has_dx)
            ranks_of(&xs, nranks, need);
        first[s] = has_dx ? xs.rank[0] : ys.rank[0];
        need[first[s]] = 1;
        acc_allreduce(&ys, nranks, need, 2 * samples * channels * TSL_PLAN_ACC_BYTES, sent);
    }
    memset(need, 0, (size_t)nranks);
    if (has_dx)
        ranks_of(x, nranks, need);
    for (int32_t s = 0; s < x->samples; s++)
        need[first[s]] = 1;
    for (int32_t r = 0; r < nranks; r++)
        sent[keeper] += need[r] && r != keeper ? 16 * batch * op->norm_groups : 0;
    memset(need, 0, (size_t)nranks);
    for (int32_t k = 0; k < op->nparams; k++)
        if (op->params[k] >= 0)
            need[param_owner[op->params[k]]] = 1;
    tiles slabs = {.n = x->samples, .ndim = 1, .samples = x->samples, .rank = first};
    acc_allreduce(&slabs, nranks, need, 2 * channels * TSL_PLAN_ACC_BYTES, sent);
    free(first);
}

/* tsl_exact_reduce over a tensor's tiles: a tree of one accumulator each, then the total to every
 * other rank. */
static void exact_reduce(const tiles *t, int32_t nranks, int64_t *sent)
{
    for (int64_t step = 1; step < t->n; step *= 2)
        for (int64_t i = 0; i + step < t->n; i += 2 * step)
            sent[t->rank[i + step]] += t->rank[i + step] != t->rank[i] ? TSL_PLAN_ACC_BYTES : 0;
    sent[t->rank[0]] += (int64_t)(nranks - 1) * TSL_PLAN_ACC_BYTES;
}

/* A two-value loss (difference, similarity): t's tiles brought whole to `root` and its
 * gradient's tiles sent back to their owners. */
static void whole_and_back(const tiles *t, int32_t root, int64_t *sent)
{
    for (int64_t i = 0; i < t->n; i++)
        if (t->rank[i] != root) {
            sent[t->rank[i]] += 4 * tile_numel(t, i);
            sent[root] += 4 * tile_numel(t, i);
        }
}

/* An MSE or L1 term against another value: that value regridded onto the compared one's tiles
 * where they differ (each tile of it sent by its owner, at most), then the term's sums. */
static void against_traffic(const tiles *on, const tiles *against, int32_t nranks, int64_t *sent)
{
    int same = on->n == against->n;
    for (int64_t i = 0; same && i < on->n; i++)
        same = on->rank[i] == against->rank[i];
    for (int64_t i = 0; !same && i < against->n; i++)
        sent[against->rank[i]] += 4 * tile_numel(against, i);
    exact_reduce(on, nranks, sent);
}

/* The input window [wlo, whi) of output tile i of a convolution (not transposed), per spatial
 * dimension, in input coordinates (may reach outside the input). */
static void conv_window(const tsl_conv_params *c, const tsl_shape *w, const tiles *y, int64_t i,
                        int64_t *wlo, int64_t *whi)
{
    for (int d = 0; d < c->spatial; d++) {
        int64_t lo = y->lo[i][2 + d], ext = y->ext[i][2 + d];
        wlo[d] = lo * c->stride[d] - c->padding[d];
        whi[d] = (lo + ext - 1) * c->stride[d] - c->padding[d] +
                 (w->dims[2 + d] - 1) * c->dilation[d] + 1;
    }
}

/* The input's spatial size: its tiles' reach. */
static void input_size(const tiles *x, int sp, int64_t *global)
{
    for (int d = 0; d < 3; d++)
        global[d] = 0;
    for (int64_t j = 0; j < x->n; j++)
        for (int d = 0; d < sp; d++)
            if (x->lo[j][2 + d] + x->ext[j][2 + d] > global[d])
                global[d] = x->lo[j][2 + d] + x->ext[j][2 + d];
}

/* The images of the input a window meets: the input itself, or with circular padding also
 * the input moved by +-size along each spatial dimension (3^spatial). */
static int32_t image_count(const tsl_conv_params *c)
{
    int32_t images = 1;
    for (int d = 0; c->padding_mode == TSL_PADDING_CIRCULAR && d < c->spatial; d++)
        images *= 3;
    return images;
}

/* How far image m of `images` is moved along each dimension (0 for the input itself). */
static void image_move(int32_t m, int32_t images, int sp, const int64_t *global, int64_t *move)
{
    for (int d = 0; d < 3; d++)
        move[d] = 0;
    for (int d = 0, code = m; images > 1 && d < sp; d++, code /= 3)
        move[d] = ((code + 1) % 3 - 1) * global[d];
}

/* Elements of x's tile j, moved by `move`, inside the window [wlo, whi). */
static int64_t window_overlap(const tiles *x, int64_t j, int sp, const int64_t *wlo,
                              const int64_t *whi, const int64_t *move)
{
    int64_t vol = x->ext[j][0] * x->ext[j][1];
    for (int d = 0; d < sp && vol; d++) {
        int64_t jlo = x->lo[j][2 + d] + move[d], jhi = jlo + x->ext[j][2 + d];
        int64_t lo = jlo > wlo[d] ? jlo : wlo[d], hi = jhi < whi[d] ? jhi : whi[d];
        vol = hi > lo ? vol * (hi - lo) : 0;
    }
    return vol;
}

/* Halo slabs of a convolution (not transposed) from x's tiles to y's: each output tile's input
 * window meets other input tiles; those on other ranks send the slab forward, and the backward
 * sends the window gradient's slab back (when x takes a gradient). With circular padding the
 * window also meets the tiles at the other end, moved round the input (the images of the input
 * one size away, per dimension). Under filters= (channel tiles) the same geometry gives the
 * channel tiles read across filter groups: every output tile reads the whole of each input tile
 * of its samples, and sends back its partial of the input gradient. */
static void conv_halos(const tsl_graph_op *op, const tiles *x, const tiles *y, const tsl_shape *w,
                       int backward, int channels, int64_t *sent, int64_t *got_fwd,
                       int64_t *got_bwd)
{
    const tsl_conv_params *c = &op->conv;
    const int sp = c->spatial;
    if (x->ndim != y->ndim || (x->n != y->n && !channels))
        return; /* regridded: not modelled */
    int64_t global[3];
    input_size(x, sp, global);
    const int32_t images = image_count(c);
    for (int64_t i = 0; i < y->n; i++) {
        int64_t wlo[3], whi[3];
        conv_window(c, w, y, i, wlo, whi);
        /* only x's tiles of the same samples can meet the window (all when the sample tiles
         * differ) */
        int64_t from = 0, to = x->n;
        if (x->samples == y->samples && x->samples > 0) {
            int64_t s0 = i / (y->n / y->samples), per = x->n / x->samples;
            from = s0 * per;
            to = from + per;
        }
        for (int32_t m = 0; m < images; m++) {
            int64_t move[3];
            image_move(m, images, sp, global, move);
            for (int64_t j = from; j < to; j++) {
                if ((!channels && j == i && m == 0) || x->rank[j] == y->rank[i] ||
                    x->lo[j][0] != y->lo[i][0])
                    continue; /* (tile i itself: a value from another stage, counted there) */
                int64_t vol = window_overlap(x, j, sp, wlo, whi, move);
                int whole = channels && m == 0; /* (the input tile under the window's centre:
                                                   under channel tiles, a copy counted apart) */
                for (int d = 0; d < sp && whole; d++) {
                    int64_t mid = (wlo[d] + whi[d]) / 2;
                    whole = x->lo[j][2 + d] <= mid && mid < x->lo[j][2 + d] + x->ext[j][2 + d];
                }
                if (got_fwd && whole)
                    continue;
                if (got_fwd) { /* counted where they arrive: the slab, its gradient back */
                    got_fwd[y->rank[i]] += 4 * vol;
                    got_bwd[x->rank[j]] += backward ? 4 * vol : 0;
                    continue;
                }
                sent[x->rank[j]] += 4 * vol;
                if (backward)
                    sent[y->rank[i]] += 4 * vol;
            }
        }
    }
}

/* Overlap of [alo, alo + aext) and [blo, blo + bext). */
static int64_t span_overlap(int64_t alo, int64_t aext, int64_t blo, int64_t bext)
{
    int64_t lo = alo > blo ? alo : blo, hi = alo + aext < blo + bext ? alo + aext : blo + bext;
    return hi > lo ? hi - lo : 0;
}

/* Windows of a pooling that reach input tiles on other ranks (a global pooling's window is
 * the whole input): each output tile's window over x's tiles of its samples and channels;
 * those on other ranks send what the window covers forward and take its gradient back (when x
 * takes one). Windows that stay inside their own tile (a 2x2 max pooling of even tiles) move
 * nothing. */
static void pool_windows(const tsl_pool_params *pp, const tiles *x, const tiles *y, int backward,
                         int64_t *sent)
{
    const int sp = pp->spatial;
    if (x->ndim != y->ndim)
        return;
    for (int64_t i = 0; i < y->n; i++) {
        int64_t wlo[3], whi[3];
        for (int d = 0; d < sp; d++) {
            int64_t lo = y->lo[i][2 + d], ext = y->ext[i][2 + d];
            wlo[d] = lo * pp->stride[d] - pp->padding[d];
            whi[d] = (lo + ext - 1) * pp->stride[d] - pp->padding[d] + pp->kernel[d];
        }
        for (int64_t j = 0; j < x->n; j++) {
            if (x->rank[j] == y->rank[i])
                continue;
            int64_t vol = span_overlap(x->lo[j][0], x->ext[j][0], y->lo[i][0], y->ext[i][0]) *
                          span_overlap(x->lo[j][1], x->ext[j][1], y->lo[i][1], y->ext[i][1]);
            for (int d = 0; d < sp && vol; d++)
                vol *= span_overlap(x->lo[j][2 + d], x->ext[j][2 + d], wlo[d], whi[d] - wlo[d]);
            sent[x->rank[j]] += 4 * vol;
            if (backward)
                sent[y->rank[i]] += 4 * vol;
        }
    }
}

/* Whether t is cut along a spatial dimension. */
static int spatially_cut(const tiles *t)
{
    for (int64_t i = 0; i < t->n; i++)
        for (int d = 2; d < t->ndim; d++)
            if (t->lo[i][d] != 0)
                return 1;
    return 0;
}

/* Channel tiles of t: those of its first sample tile at spatial position 0. */
static int64_t channel_tiles(const tiles *t)
{
    int64_t per = t->n / (t->samples > 0 ? t->samples : 1), c = 0;
    for (int64_t i = 0; i < per; i++) {
        int at0 = 1;
        for (int d = 2; d < t->ndim; d++)
            at0 &= t->lo[i][d] == 0;
        c += at0;
    }
    return c > 0 ? c : 1;
}

/* A channels= convolution whose weights are cut along their input channels
 * (tsl_plan_input_channel_cut): output tile (n, g, box) is the sum of one partial per input
 * channel tile (n, k, box), each made where that input tile lives and added by a binomial tree
 * rooted at the output tile's owner; the backward sends the output gradient's tile to every
 * rank of another channel group that holds an input tile of its samples and box (the input
 * gradient's parts are then made where they are summed). On spatial tiles each pass reads its
 * input tile's window: the slabs from the same channel tile's neighbours, once for the
 * forward pass and once for the weight-gradient pass of every output channel tile, and the
 * input gradient's slabs go back once per output channel tile. */
static void conv_parts(const tsl_graph_op *op, const tiles *x, const tiles *y, const tsl_shape *w,
                       int64_t *sent)
{
    if (x->samples != y->samples || x->samples < 1 || x->ndim != y->ndim)
        return;
    int64_t cx = channel_tiles(x), cy = channel_tiles(y), inner = y->n / y->samples / cy;
    if (inner < 1 || x->n != (int64_t)x->samples * cx * inner || cx > 4096)
        return;
    int32_t r[4096];
    const tsl_conv_params *c = &op->conv;
    const int sp = c->spatial;
    int64_t global[3];
    input_size(x, sp, global);
    const int32_t images = image_count(c);
    int windowed = c->padding_mode != TSL_PADDING_ZEROS;
    for (int d = 0; d < sp; d++) /* (as the lowering: x cut in space, or padding not zeros) */
        windowed |= x->ext[0][2 + d] != global[d];
    windowed &= !op->transposed; /* (a transposed convolution's windows: not modelled) */
    for (int64_t i = 0; i < y->n; i++) {
        int64_t s = i / (cy * inner), at = i % inner, bytes = 4 * tile_numel(y, i), root = 0;
        for (int64_t k = 0; k < cx; k++)
            r[k] = x->rank[(s * cx + k) * inner + at];
        for (int64_t k = 0; k < cx; k++)
            if (r[k] == y->rank[i]) {
                root = k;
                break;
            }
        for (int64_t step = 1; step < cx; step *= 2) /* the forward's tree */
            for (int64_t k = 0; k + step < cx; k += 2 * step) {
                int32_t to = r[(root + k) % cx], from = r[(root + k + step) % cx];
                sent[from] += from != to ? bytes : 0;
            }
        if (r[root] != y->rank[i])
            sent[r[root]] += bytes;
        for (int64_t k = 0; k < cx; k++) { /* dy to the other groups' ranks, once each */
            int seen = r[k] == y->rank[i];
            for (int64_t q = 0; q < k && !seen; q++)
                seen = r[q] == r[k];
            sent[y->rank[i]] += seen ? 0 : bytes;
        }
        if (!windowed)
            continue;
        int64_t wlo[3], whi[3];
        conv_window(c, w, y, i, wlo, whi);
        for (int64_t k = 0; k < cx; k++) {
            int64_t self = (s * cx + k) * inner + at;
            for (int32_t m = 0; m < images; m++) {
                int64_t move[3];
                image_move(m, images, sp, global, move);
                for (int64_t b = 0; b < inner; b++) {
                    int64_t j = (s * cx + k) * inner + b;
                    if ((j == self && m == 0) || x->rank[j] == x->rank[self])
                        continue;
                    int64_t vol = window_overlap(x, j, sp, wlo, whi, move);
                    sent[x->rank[j]] += 2 * 4 * vol;
                    sent[x->rank[self]] += 4 * vol;
                }
            }
        }
    }
}

/* An op that does not take channel tiles under filters= (tsl_plan_takes_channel_tiles): its
 * input's channel tiles outside the first go to the channel-whole tile on filter group 0 and its
 * output's come back from there; the backward does the same with the gradients (dx when x takes
 * one). Each moved tile's bytes once. */
static void channel_regrid(const tiles *x, const tiles *y, int backward, int64_t *sent)
{
    for (int pass = 0; pass < 2; pass++) { /* forward, then the gradients */
        if (pass && !backward)
            break;
        const tiles *in = pass ? y : x, *out = pass ? x : y; /* dy in, dx out */
        for (int64_t j = 0; j < in->n; j++)
            if (in->ndim > 1 && in->lo[j][1] != 0)
                sent[in->rank[j]] += 4 * tile_numel(in, j);
        for (int64_t j = 0; j < out->n; j++) { /* from the rank of the channel-0 tile */
            if (out->ndim < 2 || out->lo[j][1] == 0)
                continue;
            for (int64_t i = 0; i < out->n; i++) {
                int same = out->lo[i][1] == 0;
                for (int d = 0; same && d < out->ndim; d++)
                    same = d == 1 || out->lo[i][d] == out->lo[j][d];
                if (same) {
                    sent[out->rank[i]] += out->rank[i] != out->rank[j] ? 4 * tile_numel(out, j) : 0;
                    break;
                }
            }
        }
    }
}

/* Gradients and refreshed values of the parameters. */
static tsl_status param_traffic(const tsl_plan *plan, tsl_graph_t g, int32_t nranks,
                                const int32_t *op_stage, tiles *vt, int64_t *sent,
                                int32_t *param_owner)
{
    int32_t np = g->nparams;
    if (np == 0)
        return TSL_OK;
    tsl_tile_grid *grids = calloc((size_t)np, sizeof *grids);
    tsl_owner_map *owners = calloc((size_t)np, sizeof *owners);
    int32_t *sharded = calloc((size_t)np, sizeof *sharded), *op_of = calloc((size_t)np, 4);
    int32_t *bucket_of = calloc((size_t)np, 4), *replicated = calloc((size_t)np, 4), nb = 0;
    uint8_t *part = calloc(2 * (size_t)nranks, 1), *bpart = calloc((size_t)np * nranks, 1);
    int64_t *btotal = calloc((size_t)np, sizeof *btotal);
    int32_t *bowner = calloc((size_t)np, 4);
    int32_t group;
    tsl_plan_stage_count(plan, nranks, &group);
    tsl_status st =
        grids && owners && sharded && op_of && bucket_of && replicated && part && bpart && btotal &&
                bowner
            ? tsl_plan_param_placement(plan, g, nranks, op_stage, grids, owners, sharded)
            : tsl_error(NULL, TSL_ERR_OUT_OF_MEMORY, "tsl_plan_estimate_traffic: out of memory");
    if (!st)
        st = tsl_plan_buckets(plan, g, nranks, owners, sharded, bucket_of, replicated, &nb);
    if (!st)
        tsl_plan_param_ops(g, op_of);
    for (int32_t p = 0; p < np && !st; p++) {
        const tsl_graph_op *op = &g->ops[op_of[p]];
        const tsl_graph_param *prm = &g->params[p];
        const tiles *dy = &vt[op->output];
        int32_t first = op_stage[op_of[p]] * group, owner = 0;
        ranks_of(dy, nranks, part);
        const int32_t zero[TSL_MAX_DIMS] = {0};
        if ((st = tsl_owner_map_rank(&owners[p], zero, prm->shape.ndim, &grids[p], nranks, &owner)))
            break;
        param_owner[p] = owner;
        int64_t numel = tsl_shape_numel(&prm->shape), bytes = 4 * numel;
        if (sharded[p] == 3) { /* cut along both channels (channels=): tile (q0, q1) read by
                                * the ranks of input channel tile q1, its gradient's partials
                                * made there (one per output tile of channel tile q0) */
            const tiles *x = &vt[op->inputs[0]];
            int64_t cx = channel_tiles(x), cy = channel_tiles(dy),
                    inner = dy->n / (dy->samples > 0 ? dy->samples : 1) / cy;
            int64_t per = numel / prm->shape.dims[0] / prm->shape.dims[1];
            int fd = op->transposed ? 1 : 0, id = 1 - fd; /* filters' and inputs' dimensions */
            int32_t *pr = malloc(sizeof *pr * ((size_t)dy->n + 1));
            if (!pr) {
                st = tsl_error(NULL, TSL_ERR_OUT_OF_MEMORY,
                               "tsl_plan_estimate_traffic: out of memory");
                break;
            }
            for (int32_t q0 = 0; q0 < grids[p].splits[fd] && !st; q0++)
                for (int32_t q1 = 0; q1 < grids[p].splits[id] && !st; q1++) {
                    int64_t s0, e0, s1, e1;
                    int32_t coords[TSL_MAX_DIMS] = {0}, so;
                    coords[fd] = q0;
                    coords[id] = q1;
                    tsl_tile_extent(prm->shape.dims[fd], grids[p].splits[fd], q0, &s0, &e0);
                    tsl_tile_extent(prm->shape.dims[id], grids[p].splits[id], q1, &s1, &e1);
                    if ((st = tsl_owner_map_rank(&owners[p], coords, prm->shape.ndim, &grids[p],
                                                 nranks, &so)))
                        break;
                    int64_t tb = 4 * per * e0 * e1, m = 0, root = 0;
                    uint8_t *mark = part + nranks;
                    memset(mark, 0, (size_t)nranks);
                    for (int64_t j = 0; j < x->n; j++) /* the forward's reads */
                        if (x->lo[j][1] == s1 && x->rank[j] != so && !mark[x->rank[j]]) {
                            mark[x->rank[j]] = 1;
                            sent[so] += tb;
                        }
                    for (int64_t i = 0; i < dy->n && prm->trainable; i++) {
                        if (dy->lo[i][1] != s0 && grids[p].splits[fd] > 1)
                            continue;
                        int64_t smp = i / (cy * inner), at = i % inner;
                        pr[m++] = x->rank[(smp * cx + q1) * inner + at];
                    }
                    for (int64_t k = 0; k < m; k++)
                        if (pr[k] == so) {
                            root = k;
                            break;
                        }
                    for (int64_t step = 1; step < m; step *= 2)
                        for (int64_t k = 0; k + step < m; k += 2 * step) {
                            int32_t to = pr[(root + k) % m], from = pr[(root + k + step) % m];
                            sent[from] += from != to ? tb : 0;
                        }
                    if (m > 0 && pr[root] != so)
                        sent[pr[root]] += tb;
                }
            free(pr);
            continue;
        }
        if (sharded[p]) { /* reduce-scatter of the partials, allgather of the shards */
            /* (cut by filters: a transposed convolution's weight along its second dimension) */
            int cd = prm->shape.ndim > 1 && grids[p].splits[1] > 1 ? 1 : 0;
            int64_t row = numel / prm->shape.dims[cd];
            for (int32_t k = 0; k < grids[p].splits[cd]; k++) {
                int64_t start, extent;
                int32_t coords[TSL_MAX_DIMS] = {0}, so;
                coords[cd] = k;
                tsl_tile_extent(prm->shape.dims[cd], grids[p].splits[cd], k, &start, &extent);
                if ((st = tsl_owner_map_rank(&owners[p], coords, prm->shape.ndim, &grids[p], nranks,
                                             &so)))
                    break;
                if (sharded[p] == 2) { /* cut by filters: tile k to and from the ranks with
                                        * output tiles of channel tile k (once each) */
                    uint8_t *mark = part + nranks; /* (part has room for 2 x nranks) */
                    memset(mark, 0, (size_t)nranks);
                    for (int64_t i = 0; i < dy->n; i++)
                        if (dy->lo[i][1] == start && dy->rank[i] != so && !mark[dy->rank[i]]) {
                            mark[dy->rank[i]] = 1;
                            sent[dy->rank[i]] += 4 * row * extent;
                            sent[so] += 4 * row * extent;
                        }
                    continue;
                }
                for (int32_t r = first; r < first + group; r++) {
                    sent[r] += (part[r] && r != so) ? 4 * row * extent : 0;
                    sent[so] += r != so ? 4 * row * extent : 0; /* to every whole copy */
                }
            }
            continue;
        }
        if (replicated[p]) /* the owner refreshes every other rank's whole copy */
            sent[owner] += (int64_t)(group - 1) * bytes;
        if (!prm->trainable || op->kind == TSL_OP_BATCHNORM || op->kind == TSL_OP_GROUPNORM)
            continue; /* batch and group norm's parameter gradients come from exchanged sums */
        if (bucket_of[p] >= 0) {
            int32_t b = bucket_of[p];
            btotal[b] += bytes;
            bowner[b] = owner;
            for (int32_t r = 0; r < nranks; r++)
                bpart[(int64_t)b * nranks + r] |= part[r];
            continue;
        }
        /* a tree over the tiles' partials, rooted at the owner's first tile */
        int64_t root = 0;
        for (int64_t i = 0; i < dy->n; i++)
            if (dy->rank[i] == owner) {
                root = i;
                break;
            }
        for (int64_t step = 1; step < dy->n; step *= 2)
            for (int64_t i = 0; i + step < dy->n; i += 2 * step) {
                int32_t to = dy->rank[(root + i) % dy->n],
                        from = dy->rank[(root + i + step) % dy->n];
                sent[from] += from != to ? bytes : 0;
            }
        if (dy->rank[root] != owner)
            sent[dy->rank[root]] += bytes;
    }
    for (int32_t b = 0; b < nb && !st; b++) { /* one packed partial per rank, a tree to the owner */
        int32_t *order = malloc(sizeof *order * (size_t)nranks), m = 0;
        if (!order) {
            st = tsl_error(NULL, TSL_ERR_OUT_OF_MEMORY, "tsl_plan_estimate_traffic: out of memory");
            break;
        }
        for (int32_t j = 0; j < nranks; j++) {
            int32_t q = (bowner[b] + j) % nranks;
            if (bpart[(int64_t)b * nranks + q])
                order[m++] = q;
        }
        for (int32_t step = 1; step < m; step *= 2)
            for (int32_t i = 0; i + step < m; i += 2 * step)
                sent[order[i + step]] += btotal[b];
        if (m > 0 && order[0] != bowner[b])
            sent[order[0]] += btotal[b];
        free(order);
    }
    /* a shared op's parameter copies (tsl_graph_share_params()) whose owner is not their
     * source's: refreshed from the source before the forward, their gradients added into it
     * after the backward */
    for (int32_t p = 0; p < np && !st; p++) {
        int32_t src = tsl_graph_param_source(g, p);
        if (src == p || src < 0 || sharded[p] || sharded[src] || param_owner[p] == param_owner[src])
            continue;
        int64_t bytes = 4 * tsl_shape_numel(&g->params[p].shape);
        sent[param_owner[src]] += bytes;
        if (g->params[p].trainable)
            sent[param_owner[p]] += bytes;
    }
    free(grids);
    free(owners);
    free(sharded);
    free(op_of);
    free(bucket_of);
    free(replicated);
    free(part);
    free(bpart);
    free(btotal);
    free(bowner);
    return st;
}

tsl_status tsl_plan_estimate_traffic(const tsl_plan *plan, tsl_graph_t g, int32_t nranks,
                                     int32_t workers, int64_t batch, int32_t optimizer_states,
                                     int64_t *sent)
{
    return tsl_plan_traffic_for_stages(plan, g, nranks, workers, batch, optimizer_states, NULL,
                                       sent);
}

tsl_status tsl_plan_traffic_for_stages(const tsl_plan *plan, tsl_graph_t g, int32_t nranks,
                                       int32_t workers, int64_t batch, int32_t optimizer_states,
                                       const int32_t *given, int64_t *sent)
{
    if (!g || !sent || nranks < 1 || workers < 1 || batch < 1 || optimizer_states < 0)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "tsl_plan_estimate_traffic: bad argument");
    memset(sent, 0, sizeof *sent * (size_t)nranks * TSL_TRAFFIC_TERMS);
    int32_t out = tsl_graph_output(g);
    if (out < 0 || g->input < 0)
        return tsl_error(NULL, TSL_ERR_STATE,
                         "tsl_plan_estimate_traffic: the graph needs an input and an output");
    tsl_shape input;
    tsl_graph_value_shape(g, g->input, &input);
    tsl_status st = plan ? tsl_plan_check(plan, &input, nranks) : TSL_OK;
    int32_t *op_stage = calloc((size_t)g->nops + 1, sizeof *op_stage);
    tiles *vt = calloc((size_t)g->nvalues + 1, sizeof *vt);
    uint8_t *need = calloc((size_t)nranks, 1);
    int32_t *param_owner = calloc((size_t)g->nparams + 1, sizeof *param_owner);
    if (!st && (!op_stage || !vt || !need || !param_owner))
        st = tsl_error(NULL, TSL_ERR_OUT_OF_MEMORY, "tsl_plan_estimate_traffic: out of memory");
    if (!st && given)
        memcpy(op_stage, given, sizeof *op_stage * (size_t)g->nops);
    else if (!st)
        st = tsl_plan_stages(plan, g, batch, optimizer_states, op_stage);
    for (int32_t v = 0; v < g->nvalues && !st; v++)
        st = tiles_of(plan, g, v, nranks, op_stage[g->values[v].producer], workers, batch, &vt[v]);
    int64_t *params = sent + (int64_t)TSL_TRAFFIC_PARAMS * nranks;
    int64_t *bn = sent + (int64_t)TSL_TRAFFIC_BATCHNORM * nranks;
    int64_t *halo = sent + (int64_t)TSL_TRAFFIC_HALOS * nranks;
    int64_t *stagex = sent + (int64_t)TSL_TRAFFIC_STAGES * nranks;
    int64_t *loss = sent + (int64_t)TSL_TRAFFIC_LOSSES * nranks;
    if (!st && nranks > 1)
        st = param_traffic(plan, g, nranks, op_stage, vt, params, param_owner);
    for (int32_t o = 0; o < g->nops && !st && nranks > 1; o++) {
        const tsl_graph_op *op = &g->ops[o];
        const tiles *y = &vt[op->output];
        if (op->kind == TSL_OP_BATCHNORM) { /* sums forward and backward, 2 C accumulators */
            const tiles *x = &vt[op->inputs[0]];
            int64_t channels = g->values[op->inputs[0]].shape.dims[0];
            ranks_of(y, nranks, need); /* and the owners of its parameters and statistics */
            for (int32_t k = 0; k < op->nparams; k++)
                if (op->params[k] >= 0)
                    need[param_owner[op->params[k]]] = 1;
            batchnorm_sums(x, nranks, need, channels, 0, bn);
            batchnorm_sums(x, nranks, need, channels, 0, bn);
        }
        if (op->kind == TSL_OP_GROUPNORM)
            groupnorm_traffic(g, op, &vt[op->inputs[0]], y,
                              op_stage[o] * (nranks / tsl_plan_depth(plan)), param_owner, nranks,
                              need, bn);
        if (tsl_plan_channel_groups(plan) > 1 && op->ninputs > 0 &&
            !tsl_plan_takes_channel_tiles(op))
            channel_regrid(&vt[op->inputs[0]], y, !tsl_graph_is_input(g, op->inputs[0]), halo);
        /* a linear layer moves what a convolution of kernel 1 over one position does */
        tsl_graph_op lin;
        if (op->kind == TSL_OP_LINEAR) {
            lin = *op;
            memset(&lin.conv, 0, sizeof lin.conv);
            lin.conv.padding_mode = TSL_PADDING_ZEROS;
            op = &lin;
        }
        if (op->kind == TSL_OP_POOL && op->ninputs > 0 &&
            op_stage[g->values[op->inputs[0]].producer] == op_stage[o]) /* (else: a stage's) */
            pool_windows(&op->pool, &vt[op->inputs[0]], y, !tsl_graph_is_input(g, op->inputs[0]),
                         halo);
        if (tsl_plan_input_channel_cut(plan, g, o))
            conv_parts(op, &vt[op->inputs[0]], y, &g->params[op->params[0]].shape, halo);
        else if ((op->kind == TSL_OP_CONV && !op->transposed && op->ninputs > 0) ||
                 (op->kind == TSL_OP_LINEAR && tsl_plan_channel_groups(plan) > 1) ||
                 (op->kind == TSL_OP_CONV && op->transposed && op->conv.groups == 1 &&
                  tsl_plan_channel_groups(plan) > 1 && !spatially_cut(&vt[op->inputs[0]])))
            conv_halos(op, &vt[op->inputs[0]], y, &g->params[op->params[0]].shape,
                       !tsl_graph_is_input(g, op->inputs[0]), tsl_plan_channel_groups(plan) > 1,
                       halo, NULL, NULL);
        /* a convolution's or linear layer's weight, read by its input gradient's tasks */
        const int32_t weight =
            (op->kind == TSL_OP_CONV || op->kind == TSL_OP_LINEAR) && op->nparams > 0
                ? op->params[0]
                : -1;
        for (int32_t k = 0; k < op->ninputs; k++) { /* values from another stage */
            int32_t v = op->inputs[k];
            if (op_stage[g->values[v].producer] == op_stage[o])
                continue;
            const tiles *x = &vt[v];
            /* sent forward, and again for a backward that reads it (the forward's received
             * copy is dropped after the forward); a slice reads only its box of each tile */
            int64_t times = 1 + tsl_graph_op_reads_input_backward(op);
            const int32_t group = nranks / tsl_plan_depth(plan), first = op_stage[o] * group;
            const int64_t nx = tsl_shape_numel(&g->values[v].shape),
                          ny = tsl_shape_numel(&g->values[op->output].shape);
            memset(need, 0, (size_t)nranks);
            for (int64_t i = 0; i < x->n; i++) {
                if (x->rank[i] >= first && x->rank[i] < first + group)
                    continue; /* (a tile already on this stage's ranks: the input cut by domains) */
                int64_t moved = op->kind == TSL_OP_SLICE ? box_numel(x, i, op->start, op->stop)
                                                         : tile_numel(x, i);
                stagex[x->rank[i]] += times * 4 * moved;
                if (tsl_graph_is_input(g, v))
                    continue;
                /* Its gradient's tasks run where its tiles are and read the output gradient's
                 * tile from its peer on this stage: of the output's size (a concatenation's
                 * part and a slice's box: the input's). */
                int64_t back = op->kind == TSL_OP_CONCAT || op->kind == TSL_OP_SLICE
                                   ? moved
                                   : (nx > 0 ? moved * ny / nx : 0);
                stagex[y->rank[i % y->n]] += 4 * back;
                need[x->rank[i]] = 1;
            }
            for (int32_t r = 0; r < nranks && weight >= 0; r++)
                if (need[r])
                    stagex[param_owner[weight]] += 4 * tsl_shape_numel(&g->params[weight].shape);
        }
    }
    if (!st && nranks > 1) { /* the loss and the accuracy, one accumulator per tile each */
        exact_reduce(&vt[out], nranks, loss);
        exact_reduce(&vt[out], nranks, loss);
    }
    /* the loss terms between values (the first term on the batch is the loss above; every
     * other term on the batch has its own sums) */
    const int32_t batch_term = tsl_loss_batch_term(g->nloss, g->loss);
    for (int32_t t = 0; t < g->nloss && !st && nranks > 1; t++) {
        const tsl_loss_term *e = &g->loss[t];
        const tiles *on = &vt[tsl_loss_term_value(g, e)];
        if (!e->against && t != batch_term)
            exact_reduce(on, nranks, loss);
        else if (e->against && tsl_model_loss_of_two_values(e->kind)) {
            whole_and_back(on, on->rank[0], loss);
            whole_and_back(&vt[e->against - 1], on->rank[0], loss);
        } else if (e->against)
            against_traffic(on, &vt[e->against - 1], nranks, loss);
    }
    for (int32_t r = 0; r < nranks && !st; r++)
        for (int k = 0; k < TSL_TRAFFIC_TERMS - 1; k++)
            sent[(int64_t)TSL_TRAFFIC_TOTAL * nranks + r] += sent[(int64_t)k * nranks + r];
    for (int32_t v = 0; vt && v < g->nvalues; v++)
        tiles_free(&vt[v]);
    free(vt);
    free(op_stage);
    free(need);
    free(param_owner);
    return st;
}

tsl_status tsl_plan_sums_received(const tsl_plan *plan, const struct tsl_graph *g, int32_t o,
                                  int32_t nranks, int32_t stage, int32_t workers, int64_t batch,
                                  int64_t *received)
{
    memset(received, 0, sizeof *received * (size_t)nranks);
    const tsl_graph_op *op = &g->ops[o];
    if (nranks < 2 || op->kind != TSL_OP_BATCHNORM || op->ninputs < 1)
        return TSL_OK;
    tiles x, y;
    tsl_status st = tiles_of(plan, g, op->inputs[0], nranks, stage, workers, batch, &x);
    if (st)
        return st;
    if ((st = tiles_of(plan, g, op->output, nranks, stage, workers, batch, &y))) {
        tiles_free(&x);
        return st;
    }
    uint8_t *need = calloc((size_t)nranks, 1);
    if (need) {
        ranks_of(&y, nranks, need); /* (the parameters' owners hold a tile of y or get little) */
        batchnorm_sums(&x, nranks, need, g->values[op->inputs[0]].shape.dims[0], 1, received);
    } else {
        st = tsl_error(NULL, TSL_ERR_OUT_OF_MEMORY, "tsl_plan_estimate_peak: out of memory");
    }
    free(need);
    tiles_free(&x);
    tiles_free(&y);
    return st;
}

tsl_status tsl_plan_halos_received(const tsl_plan *plan, const struct tsl_graph *g, int32_t o,
                                   int32_t nranks, int32_t stage, int32_t workers, int64_t batch,
                                   int64_t *forward, int64_t *backward)
{
    memset(forward, 0, sizeof *forward * (size_t)nranks);
    memset(backward, 0, sizeof *backward * (size_t)nranks);
    const tsl_graph_op *op = &g->ops[o];
    const int channels = tsl_plan_channel_groups(plan) > 1;
    if (nranks < 2 || op->kind != TSL_OP_CONV || op->transposed || op->ninputs < 1 ||
        (channels && tsl_plan_input_channel_cut(plan, g, o)))
        return TSL_OK;
    tiles x, y;
    tsl_status st = tiles_of(plan, g, op->inputs[0], nranks, stage, workers, batch, &x);
    if (st)
        return st;
    if (!(st = tiles_of(plan, g, op->output, nranks, stage, workers, batch, &y))) {
        if (spatially_cut(&x))
            conv_halos(op, &x, &y, &g->params[op->params[0]].shape,
                       !tsl_graph_is_input(g, op->inputs[0]), channels, NULL, forward, backward);
        tiles_free(&y);
    }
    tiles_free(&x);
    return st;
}

/* Bytes of tile i of t. */
static int64_t tile_bytes(const tiles *t, int64_t i)
{
    return 4 * tile_numel(t, i);
}

/* The elements tiles i of a and j of b share. */
static int64_t tiles_shared(const tiles *a, int64_t i, const tiles *b, int64_t j)
{
    int64_t vol = 1;
    for (int d = 0; d < a->ndim && vol; d++)
        vol *= span_overlap(a->lo[i][d], a->ext[i][d], b->lo[j][d], b->ext[j][d]);
    return vol;
}

/* Add to got[r] what moving `from` onto `to`'s tiles receives on rank r (tsl_copy_region): the
 * part of each tile of `from` another rank owns that a tile of `to` rank r owns covers, cut out
 * on its owner; a tile covered whole crosses whole, once per rank. */
static void regrid_received(const tiles *to, const tiles *from, int32_t nranks, int64_t *got)
{
    uint8_t *whole = calloc((size_t)nranks, 1);
    for (int64_t j = 0; whole && j < from->n; j++) {
        memset(whole, 0, (size_t)nranks);
        for (int64_t i = 0; i < to->n; i++) {
            int32_t r = to->rank[i];
            int64_t part = r != from->rank[j] ? tiles_shared(to, i, from, j) : 0;
            if (part > 0 && part < tile_numel(from, j))
                got[r] += 4 * part;
            else if (part > 0 && !whole[r]) {
                whole[r] = 1;
                got[r] += tile_bytes(from, j);
            }
        }
    }
    free(whole);
}

tsl_status tsl_plan_regrid_bytes(const tsl_plan *plan, const struct tsl_graph *g, int32_t o,
                                 int32_t nranks, int32_t stage, int32_t workers, int64_t batch,
                                 int64_t *cx, int64_t *cy, int64_t *got_fwd, int64_t *got_bwd)
{
    int64_t *rows[4] = {cx, cy, got_fwd, got_bwd};
    for (int k = 0; k < 4; k++)
        memset(rows[k], 0, sizeof *rows[k] * (size_t)nranks);
    const tsl_graph_op *op = &g->ops[o];
    if ((op->kind != TSL_OP_CONV && op->kind != TSL_OP_POOL && op->kind != TSL_OP_UPSAMPLE) ||
        op->ninputs < 1)
        return TSL_OK;
    const int32_t v = op->inputs[0];
    tsl_tile_grid xg, yg;
    tsl_owner_map xo, yo;
    tsl_domain_owners xd, yd;
    tsl_status st = tsl_plan_value_tiling(plan, g, v, nranks, stage, workers, batch, &xd, &xg, &xo);
    if (!st)
        st = tsl_plan_value_tiling(plan, g, op->output, nranks, stage, workers, batch, &yd, &yg,
                                   &yo);
    const tsl_shape *xs = &g->values[v].shape, *ys = &g->values[op->output].shape;
    /* (channel tiles: the channel regrid's copies, counted apart) */
    if (st || xs->ndim != ys->ndim || xg.splits[1] != 1 || yg.splits[1] != 1)
        return st;
    tsl_tile_grid common = yg;
    int differs = 0, y_moves = 0;
    for (int d = 2; d <= xs->ndim; d++) {
        common.splits[d] = xg.splits[d] < yg.splits[d] ? xg.splits[d] : yg.splits[d];
        differs |= xg.splits[d] != yg.splits[d];
        y_moves |= common.splits[d] != yg.splits[d];
    }
    if (!differs)
        return TSL_OK;
    tiles x, y, cxt, cyt;
    memset(&y, 0, sizeof y);
    memset(&cyt, 0, sizeof cyt);
    if ((st = tiles_of_grid(&xg, &xo, xs, nranks, batch, &x)))
        return st;
    if (!(st = tiles_of_grid(&common, &yo, xs, nranks, batch, &cxt)) && y_moves &&
        !(st = tiles_of_grid(&yg, &yo, ys, nranks, batch, &y)))
        st = tiles_of_grid(&common, &yo, ys, nranks, batch, &cyt);
    if (!st) {
        for (int64_t i = 0; i < cxt.n; i++)
            cx[cxt.rank[i]] += tile_bytes(&cxt, i);
        for (int64_t i = 0; i < cyt.n; i++)
            cy[cyt.rank[i]] += tile_bytes(&cyt, i);
        regrid_received(&cxt, &x, nranks, got_fwd); /* x onto the common grid */
        if (!tsl_graph_is_input(g, v))
            regrid_received(&x, &cxt, nranks, got_bwd); /* its gradient back */
        if (y_moves)
            regrid_received(&cyt, &y, nranks, got_bwd); /* the output gradient onto it */
    }
    tiles_free(&x);
    tiles_free(&cxt);
    tiles_free(&y);
    tiles_free(&cyt);
    return st;
}
