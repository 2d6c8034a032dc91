/* Layer-parallel training by multigrid reduction in time (MGRIT) over an ODE segment's
 * residual steps u_{n+1} = u_n + h F_n(u_n), as tile tasks.
 *
 * Level 0 is the segment's N steps; level l has N_l = N / M^l steps of size h M^l, step j of
 * it being the fine step j M^l's ops (its weights) with the add's h scaled. A step on one
 * level is the fine step's existing tile tasks, run on other tensors by binding them to the
 * step's input and output values for the submission (step_forward, step_adjoint). The first
 * point of every level is the segment's input (forward) or grad[u_N] (adjoint), never
 * written. Coarse levels keep their points w[l][j] and the FAS right-hand sides
 * g[l][j] = a[l][j] - b[l][j] (j >= 1) as their two terms: a coarse step is
 * (Phi(w_{j-1}) - b_j) + a_j, which is a_j to the bit once w_{j-1} is the value b_j was made
 * from, so a schedule that converges (two levels, as many cycles as coarse steps) gives the
 * serial executor's bits, not just its values within rounding.
 *
 * One V-cycle on level l: relaxation (F: each interval's F-points from its C-point, the
 * intervals independent, so StarPU runs them at once, on their rank groups; FCF: then every
 * C-point from the F-point before it, then F again); restriction to l + 1 (a_k, the
 * C-relaxation value Phi^l(w_{kM-1}) + g^l_{kM}; the injected w^{l+1}_k = w_{kM};
 * b_k = Phi^{l+1}(w^{l+1}_{k-1}); on level 0 the residual a_k - u_{kM} is summed exactly); the
 * cycle on l + 1 (the coarsest level: one serial sweep); correction (each fine C-point takes
 * its coarse point; the coarse tasks run at priority l); on coarse levels an F-relaxation. The
 * forward runs iters= cycles from C-points equal to the first point, then the fine sweep: an
 * F-relaxation and, into spare tensors, every step that ends at a C-point, so every step runs once
 * more at its final input: that run is what the backward reads (its saved statistics, kept halos)
 * and the only one that updates batch-norm running statistics (the others run with momentum 0,
 * which leaves them as they are, bit for bit).
 *
 * The adjoint lambda_n = lambda_{n+1} + h (dF_n/du)^T lambda_{n+1} (each step's backward ops
 * at the stored fine forward values, the add's h scaled on coarse levels) is the same
 * problem in reversed time: point j is grad[u_{N - j}]; biters= cycles, then the fine sweep in
 * which each step's backward runs once more with its parameters' gradients on (off before, so
 * each parameter gradient, bucket and shard reduction is made exactly once, as in the serial
 * backward). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codelets/reduce.h"
#include "executor/executor.h"
#include "trace.h"

/* ---- the plan ---- */

static int64_t ipow(int64_t b, int32_t e)
{
    int64_t r = 1;
    while (e-- > 0)
        r *= b;
    return r;
}

tsl_status tsl_mgrit_plan(struct tsl_model *m)
{
    const char *fn = "tsl_model_create_plan";
    if (!m->has_plan || m->plan.levels <= 1)
        return TSL_OK;
    const tsl_plan *p = &m->plan;
    if (p->levels > TSL_MGRIT_MAX_LEVELS || p->iters > TSL_MGRIT_MAX_ITERS ||
        p->biters > TSL_MGRIT_MAX_ITERS)
        return tsl_error(m->ctx, TSL_ERR_INVALID_ARG,
                         "%s: levels=%d, iters=%d, biters=%d: at most %d levels and %d "
                         "iterations",
                         fn, (int)p->levels, (int)p->iters, (int)p->biters, TSL_MGRIT_MAX_LEVELS,
                         TSL_MGRIT_MAX_ITERS);
    int32_t n = 0;
    tsl_status st = tsl_graph_ode_segments(m->g, 0, NULL, &n);
    tsl_ode_segment *all = n > 0 ? calloc((size_t)n, sizeof *all) : NULL;
    m->mg = calloc((size_t)n + 1, sizeof *m->mg);
    if (!st && (!m->mg || (n > 0 && !all)))
        st = tsl_error(m->ctx, TSL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    if (!st && n > 0)
        st = tsl_graph_ode_segments(m->g, n, all, &n);
    int64_t span = ipow(p->cf, p->levels - 1);
    for (int32_t k = 0; k < n && !st; k++) {
        const tsl_ode_segment *s = &all[k];
        if (s->steps < 2)
            continue;
        const char *first = m->g->ops[s->first_op].name;
        if (s->steps % span != 0 || s->steps / span < 2)
            st = tsl_error(m->ctx, TSL_ERR_INVALID_ARG,
                           "%s: plan levels=%d, cf=%d: the ODE segment of %d steps from op %d "
                           "(%s) needs a multiple of cf^(levels-1) = %lld steps and at least 2 "
                           "steps on the coarsest level",
                           fn, (int)p->levels, (int)p->cf, (int)s->steps, (int)s->first_op,
                           first ? first : "unnamed", (long long)span);
        else if (tsl_graph_is_input(m->g, s->input))
            st = tsl_error(m->ctx, TSL_ERR_INVALID_ARG,
                           "%s: the ODE segment from op %d reads the model's input itself; MGRIT "
                           "needs a layer before it (a stem)",
                           fn, (int)s->first_op);
        else {
            tsl_mgrit_segment *g = &m->mg[m->nmg];
            memset(g, 0, sizeof *g);
            g->s = *s;
            g->index = m->nmg++;
        }
    }
    if (!st && m->nmg == 0)
        st = tsl_error(m->ctx, TSL_ERR_INVALID_ARG,
                       "%s: plan levels=%d needs an ODE segment of two or more residual steps "
                       "(u + h F(u)); the graph has none",
                       fn, (int)p->levels);
    free(all);
    return st;
}

const tsl_mgrit_segment *tsl_mgrit_segment_at(const struct tsl_model *m, int32_t i)
{
    for (int32_t k = 0; k < m->nmg; k++)
        if (m->mg[k].s.first_op == i)
            return &m->mg[k];
    return NULL;
}

const tsl_mgrit_segment *tsl_mgrit_segment_ending(const struct tsl_model *m, int32_t i)
{
    for (int32_t k = 0; k < m->nmg; k++)
        if (m->mg[k].s.last_op == i)
            return &m->mg[k];
    return NULL;
}

/* ---- one problem: the forward or the adjoint of one segment ---- */

typedef struct problem {
    struct tsl_model *m;
    instance *in;
    tsl_mgrit_segment *seg;
    int adjoint;
    int train;
    int32_t levels, cf, k; /* k: ops per step */
    int32_t n[TSL_MGRIT_MAX_LEVELS];
    tsl_tensor_t *w[TSL_MGRIT_MAX_LEVELS]; /* [l][0 .. n_l] for l >= 1 (0 unused) */
    tsl_tensor_t *a[TSL_MGRIT_MAX_LEVELS], *b[TSL_MGRIT_MAX_LEVELS]; /* g = a - b */
} problem;

/* u_i, the value fine step i reads (i = N: the segment's output). */
static int32_t state_value(const struct tsl_model *m, const tsl_ode_segment *s, int32_t i)
{
    return i == 0 ? s->input : m->g->ops[s->first_op + i * s->ops_per_step - 1].output;
}

/* Fine index of point j on level l, in forward time. */
static int32_t fine_index(const problem *p, int32_t l, int32_t j)
{
    int64_t i = (int64_t)j * ipow(p->cf, l);
    return (int32_t)(p->adjoint ? p->seg->s.steps - i : i);
}

static tsl_tensor_t point(const problem *p, int32_t l, int32_t j)
{
    if (l == 0 || j == 0) {
        int32_t v = state_value(p->m, &p->seg->s, fine_index(p, 0, l == 0 ? j : 0));
        return p->adjoint ? p->in->grad[v] : p->in->act[v];
    }
    return p->w[l][j];
}

/* The coarse tensors of an instance's segment: made on first use, as u_i's (tiling, owners). */
static tsl_status make_levels(problem *p)
{
    struct tsl_model *m = p->m;
    instance *in = p->in;
    if (!in->mg) {
        in->mg = calloc(2 * (size_t)m->nmg, sizeof *in->mg);
        if (!in->mg)
            return tsl_error(m->ctx, TSL_ERR_OUT_OF_MEMORY, "MGRIT: out of memory");
    }
    size_t total = 0;
    for (int32_t l = 1; l < p->levels; l++)
        total += 3 * ((size_t)p->n[l] + 1);
    /* (the forward's and the adjoint's own: their points live with different steps) */
    tsl_tensor_t **slot = &in->mg[2 * p->seg->index + p->adjoint], *all = *slot;
    tsl_status st = TSL_OK;
    if (!all) {
        all = *slot = calloc(total, sizeof *all);
        if (!all)
            return tsl_error(m->ctx, TSL_ERR_OUT_OF_MEMORY, "MGRIT: out of memory");
        size_t at = 0;
        for (int32_t l = 1; l < p->levels && !st; l++)
            for (int32_t third = 0; third < 3 && !st; third++, at += (size_t)p->n[l] + 1)
                for (int32_t j = 1; j <= p->n[l] && !st; j++) {
                    int32_t v = state_value(m, &p->seg->s, fine_index(p, l, j));
                    st = tsl_exec_batch_tensor(m, in->batch, tsl_exec_value_stage(m, v),
                                               &m->g->values[v].shape, 1, TSL_F32, &all[at + j]);
                }
        if (st) { /* all or nothing: the next step makes them again */
            for (size_t i = 0; i < total; i++)
                tsl_tensor_destroy(all[i]);
            free(all);
            *slot = NULL;
            return st;
        }
    }
    size_t at = 0;
    for (int32_t l = 1; l < p->levels; l++) {
        p->w[l] = all + at;
        at += (size_t)p->n[l] + 1;
        p->a[l] = all + at;
        at += (size_t)p->n[l] + 1;
        p->b[l] = all + at;
        at += (size_t)p->n[l] + 1;
    }
    return st;
}

static tsl_status setup(problem *p, struct tsl_model *m, instance *in, const tsl_mgrit_segment *seg,
                        int adjoint, int train)
{
    memset(p, 0, sizeof *p);
    p->m = m;
    p->in = in;
    p->seg = &m->mg[seg->index];
    p->adjoint = adjoint;
    p->train = train;
    p->levels = m->plan.levels;
    p->cf = m->plan.cf;
    p->k = seg->s.ops_per_step;
    for (int32_t l = 0; l < p->levels; l++)
        p->n[l] = (int32_t)(seg->s.steps / ipow(p->cf, l));
    return make_levels(p);
}

/* Fine step n forward from x into y with the add's h times `scale`; batch norms update their
 * running statistics only when `final`. */
static tsl_status step_forward(problem *p, int32_t n, tsl_tensor_t x, tsl_tensor_t y, double scale,
                               int final)
{
    struct tsl_model *m = p->m;
    instance *in = p->in;
    struct tsl_graph *g = m->g;
    int32_t first = p->seg->s.first_op + n * p->k, add = first + p->k - 1;
    int32_t u = g->ops[add].inputs[1], v = g->ops[add].output;
    tsl_tensor_t keep_u = in->act[u], keep_v = in->act[v];
    double h = g->ops[add].h, *momentum = malloc(sizeof *momentum * (size_t)p->k);
    if (!momentum)
        return tsl_error(m->ctx, TSL_ERR_OUT_OF_MEMORY, "MGRIT: out of memory");
    in->act[u] = x;
    in->act[v] = y;
    g->ops[add].h = h * scale;
    for (int32_t i = first; i < add; i++)
        if (g->ops[i].kind == TSL_OP_BATCHNORM) {
            momentum[i - first] = g->ops[i].momentum;
            if (!final)
                g->ops[i].momentum = 0; /* running = 1 * running + 0 * batch: unchanged */
        }
    tsl_status st = TSL_OK;
    for (int32_t i = first; i <= add && !st; i++)
        st = tsl_exec_op_forward(m, in, i, p->train);
    for (int32_t i = first; i < add; i++)
        if (g->ops[i].kind == TSL_OP_BATCHNORM)
            g->ops[i].momentum = momentum[i - first];
    free(momentum);
    g->ops[add].h = h;
    in->act[u] = keep_u;
    in->act[v] = keep_v;
    return st;
}

/* Fine step n's backward from dy (the gradient of its output) into dx (of its input) with the
 * add's h times `scale`; its parameters' gradients only when `params`. */
static tsl_status step_adjoint(problem *p, int32_t n, tsl_tensor_t dy, tsl_tensor_t dx,
                               double scale, int params)
{
    struct tsl_model *m = p->m;
    instance *in = p->in;
    struct tsl_graph *g = m->g;
    int32_t first = p->seg->s.first_op + n * p->k, add = first + p->k - 1;
    int32_t u = g->ops[add].inputs[1], v = g->ops[add].output;
    tsl_tensor_t keep_u = in->grad[u], keep_v = in->grad[v];
    double h = g->ops[add].h;
    in->grad[u] = dx;
    in->grad[v] = dy;
    g->ops[add].h = h * scale;
    for (int32_t i = first; i < add; i++)
        in->written[g->ops[i].output] = 0;
    in->written[u] = 0;
    in->written[v] = 1;
    tsl_tensor_t *off = NULL;
    int32_t noff = 0;
    if (!params) {
        off = malloc(sizeof *off * (size_t)(p->k * TSL_GRAPH_MAX_PARAMS + 1));
        if (!off)
            return tsl_error(m->ctx, TSL_ERR_OUT_OF_MEMORY, "MGRIT: out of memory");
        for (int32_t i = first; i <= add; i++)
            for (int32_t q = 0; q < g->ops[i].nparams; q++)
                if (g->ops[i].params[q] >= 0) {
                    off[noff++] = m->pgrads[g->ops[i].params[q]];
                    m->pgrads[g->ops[i].params[q]] = NULL;
                }
    }
    tsl_status st = TSL_OK;
    for (int32_t i = add; i >= first && !st; i--)
        st = tsl_exec_op_backward(m, in, i);
    if (!params) {
        noff = 0;
        for (int32_t i = first; i <= add; i++)
            for (int32_t q = 0; q < g->ops[i].nparams; q++)
                if (g->ops[i].params[q] >= 0)
                    m->pgrads[g->ops[i].params[q]] = off[noff++];
        free(off);
    }
    g->ops[add].h = h;
    in->grad[u] = keep_u;
    in->grad[v] = keep_v;
    return st;
}

/* y = Phi^l_j(x): step j of level l (the fine step it starts at, h scaled); with `rhs`, plus
 * g^l_{j+1} on coarse levels. `final`: the fine sweep (running statistics, parameter
 * gradients). */
static tsl_status phi(problem *p, int32_t l, int32_t j, tsl_tensor_t x, tsl_tensor_t y, int rhs,
                      int final)
{
    double scale = (double)ipow(p->cf, l);
    int32_t stride = (int32_t)ipow(p->cf, l);
    /* The coarser the level, the nearer its chain is to the cycle's critical path: its tasks
     * go first where a scheduler honours priorities. */
    struct tsl_context *ctx = p->m->ctx;
    int keep = ctx->task_priority;
    ctx->task_priority = l;
    tsl_status st = p->adjoint
                        ? step_adjoint(p, p->seg->s.steps - (j + 1) * stride, x, y, scale, final)
                        : step_forward(p, j * stride, x, y, scale, final);
    if (!st && rhs && l > 0 && !(st = tsl_tensor_add_scaled(y, -1.0, p->b[l][j + 1], y)))
        st = tsl_tensor_axpy(y, 1.0, p->a[l][j + 1]); /* (y - b) + a */
    ctx->task_priority = keep;
    return st;
}

static tsl_status relax_f(problem *p, int32_t l, int final, int rhs)
{
    tsl_status st = TSL_OK;
    for (int32_t c = 0; c < p->n[l] / p->cf && !st; c++)
        for (int32_t i = 1; i < p->cf && !st; i++) {
            int32_t j = c * p->cf + i;
            st = phi(p, l, j - 1, point(p, l, j - 1), point(p, l, j), rhs, final);
        }
    return st;
}

static tsl_status relax_c(problem *p, int32_t l)
{
    tsl_status st = TSL_OK;
    for (int32_t c = 1; c <= p->n[l] / p->cf && !st; c++) {
        int32_t j = c * p->cf;
        st = phi(p, l, j - 1, point(p, l, j - 1), point(p, l, j), 1, 0);
    }
    return st;
}

typedef struct residual_job {
    const problem *p;
    int64_t ntiles; /* per C-point */
} residual_job;

static tsl_status residual_tile(int64_t i, starpu_data_handle_t acc, void *user)
{
    const residual_job *r = user;
    int32_t k = (int32_t)(i / r->ntiles) + 1;
    int64_t t = i % r->ntiles;
    tsl_tensor_t a = r->p->a[1][k], b = point(r->p, 0, k * r->p->cf);
    tsl_sum_args args = {.dtype = TSL_F32, .count = tsl_tensor_tile_numel(a, t)};
    tsl_task_desc desc = {
        .codelet = &tsl_cl_sum_sqdiff,
        .args = &args,
        .args_size = sizeof args,
        .nhandles = 3,
        .handles = {a->handles[t], b->handles[t], acc},
        .modes = {STARPU_R, STARPU_R, STARPU_W},
        .flops = 3.0 * (double)args.count,
    };
    tsl_status st = tsl_task_submit(a->ctx, &desc);
    if (b->tile_owner[t] != a->tile_owner[t])
        tsl_cache_flush(a->ctx, b->handles[t]);
    return st;
}

/* The exact sum of the level-0 residuals' squares, a_k - u_{kM} (before the correction),
 * left pending for tsl_mgrit_finish(). */
static tsl_status residual(problem *p)
{
    tsl_mgrit_segment *seg = p->seg;
    int dir = p->adjoint;
    if (seg->npending[dir] >= TSL_MGRIT_MAX_ITERS)
        return TSL_OK;
    tsl_tensor_t like = point(p, 0, p->cf);
    int64_t nt = like->ntiles, count = nt * p->n[1];
    int32_t *owner = malloc(sizeof *owner * (size_t)count);
    if (!owner)
        return tsl_error(p->m->ctx, TSL_ERR_OUT_OF_MEMORY, "MGRIT: out of memory");
    for (int64_t i = 0; i < count; i++)
        owner[i] = point(p, 0, (int32_t)(i / nt + 1) * p->cf)->tile_owner[i % nt];
    residual_job job = {.p = p, .ntiles = nt};
    starpu_data_handle_t total = NULL;
    tsl_status st = tsl_acc_tree_submit(p->m->ctx, count, owner, 1, residual_tile, &job, &total);
    free(owner);
    if (!st)
        seg->pending[dir][seg->npending[dir]++] = total;
    return st;
}

static tsl_status vcycle(problem *p, int32_t l)
{
    tsl_status st = TSL_OK;
    if (l == p->levels - 1) { /* the coarsest level: one serial sweep */
        for (int32_t j = 0; j < p->n[l] && !st; j++)
            st = phi(p, l, j, point(p, l, j), point(p, l, j + 1), 1, 0);
        return st;
    }
    st = relax_f(p, l, 0, 1);
    if (!st && p->m->plan.relax == TSL_RELAX_FCF && !(st = relax_c(p, l)))
        st = relax_f(p, l, 0, 1);
    const int32_t M = p->cf, nc = p->n[l + 1];
    for (int32_t k = 1; k <= nc && !st; k++) { /* restriction */
        /* a_k = Phi^l(w_{kM-1}) (+ g^l_{kM}); the injected w^{l+1}_k = w_{kM};
         * b_k = Phi^{l+1}(w^{l+1}_{k-1}) */
        if ((st = phi(p, l, k * M - 1, point(p, l, k * M - 1), p->a[l + 1][k], 1, 0)) ||
            (st = tsl_tensor_redistribute(p->w[l + 1][k], point(p, l, k * M))))
            break;
        st = phi(p, l + 1, k - 1, point(p, l + 1, k - 1), p->b[l + 1][k], 0, 0);
    }
    if (!st && l == 0)
        st = residual(p);
    if (!st)
        st = vcycle(p, l + 1);
    for (int32_t k = 1; k <= nc && !st; k++) /* correction */
        st = tsl_tensor_redistribute(point(p, l, k * M), p->w[l + 1][k]);
    if (!st && l > 0)
        st = relax_f(p, l, 0, 1);
    return st;
}

/* Read the residual norms one direction of a segment left pending (collective). */
static void drain(struct tsl_model *m, tsl_mgrit_segment *seg, int dir)
{
    seg->nres[dir] = 0;
    for (int32_t it = 0; it < seg->npending[dir]; it++) {
        starpu_data_handle_t h = seg->pending[dir][it];
        starpu_mpi_get_data_on_all_nodes_detached(m->ctx->comm, h);
        starpu_data_acquire(h, STARPU_R);
        tsl_acc total;
        memcpy(&total, starpu_data_get_local_ptr(h), sizeof total);
        starpu_data_release(h);
        tsl_temp_handle_release(m->ctx, h);
        seg->res[dir][seg->nres[dir]++] = sqrt(tsl_acc_round(&total));
    }
    seg->npending[dir] = 0;
}

/* skip=1: the first down-cycle's work skipped. The coarsest level's steps alone (no right-hand
 * side: the coarse ODE) from the first point, then up the levels: each level's C-points take
 * the coarser level's points and an F-relaxation fills the rest; the cycles start from there. */
static tsl_status coarse_start(problem *p)
{
    int32_t top = p->levels - 1;
    tsl_status st = TSL_OK;
    for (int32_t j = 0; j < p->n[top] && !st; j++)
        st = phi(p, top, j, point(p, top, j), point(p, top, j + 1), 0, 0);
    for (int32_t l = top - 1; l >= 0 && !st; l--) {
        for (int32_t k = 1; k <= p->n[l + 1] && !st; k++)
            st = tsl_tensor_redistribute(point(p, l, k * p->cf), point(p, l + 1, k));
        if (!st)
            st = relax_f(p, l, 0, 0);
    }
    return st;
}

/* iters V-cycles from C-points equal to the first point (or skip=1's start), then the fine
 * sweep. */
static tsl_status solve(problem *p, int32_t iters, int sweep)
{
    tsl_status st = TSL_OK;
    if (p->seg->npending[p->adjoint]) /* a forward alone before: its norms */
        drain(p->m, p->seg, p->adjoint);
    if (p->m->plan.skip) /* the first guess from the coarsest level alone */
        st = coarse_start(p);
    else
        for (int32_t c = 1; c <= p->n[0] / p->cf && !st; c++)
            st = tsl_tensor_redistribute(point(p, 0, c * p->cf), point(p, 0, 0));
    for (int32_t it = 0; it < iters && !st; it++)
        st = vcycle(p, 0);
    if (!st)
        st = relax_f(p, 0, 1, 1);
    /* the steps that end at C-points, into spare tensors (the C-points keep their values) */
    for (int32_t k = 1; sweep && k <= p->n[1] && !st; k++)
        st = phi(p, 0, k * p->cf - 1, point(p, 0, k * p->cf - 1), p->a[1][k], 0, 1);
    return st;
}

/* Release the segment's values but `keep` (their gradients too) and the coarse tensors. */
static void release(struct tsl_model *m, instance *in, const problem *p, int32_t keep)
{
    const tsl_ode_segment *s = &p->seg->s;
    for (int32_t i = s->first_op; i <= s->last_op; i++) {
        tsl_tensor_release(in->mask[i]);
        int32_t v = m->g->ops[i].output;
        if (v == keep)
            continue;
        tsl_tensor_release(in->act[v]);
        tsl_tensor_release(in->grad[v]);
        tsl_tensor_release(in->scratch[v]);
    }
    for (int32_t l = 1; l < p->levels; l++)
        for (int32_t j = 1; j <= p->n[l]; j++) {
            tsl_tensor_release(p->w[l][j]);
            tsl_tensor_release(p->a[l][j]);
            tsl_tensor_release(p->b[l][j]);
        }
}

tsl_status tsl_mgrit_forward(struct tsl_model *m, instance *in, const tsl_mgrit_segment *seg,
                             int train)
{
    problem p;
    tsl_status st = setup(&p, m, in, seg, 0, train);
    tsl_trace_label(m->ctx, "mgrit", train ? "forward" : "inference");
    if (!st)
        st = solve(&p, m->plan.iters, train);
    if (!train) /* nothing reads the steps' values again but the last */
        release(m, in, &p, state_value(m, &seg->s, seg->s.steps));
    return st;
}

tsl_status tsl_mgrit_backward(struct tsl_model *m, instance *in, const tsl_mgrit_segment *seg)
{
    problem p;
    tsl_status st = setup(&p, m, in, seg, 1, 1);
    const tsl_ode_segment *s = &seg->s;
    int32_t out = state_value(m, s, s->steps), u0 = s->input;
    tsl_trace_label(m->ctx, "mgrit", "backward");
    if (!st && !in->written[out]) { /* the loss does not depend on the segment */
        for (int32_t i = s->first_op; i <= s->last_op && !st; i++)
            st = tsl_exec_op_backward(m, in, i); /* zeros its parameters' gradients */
        return st;
    }
    if (!st)
        st = solve(&p, m->plan.biters, 1);
    in->written[u0] = 1;
    /* the segment's values are done with (its input's belong to the op before it) */
    if (!st)
        release(m, in, &p, m->g->output);
    return st;
}

void tsl_mgrit_finish(struct tsl_model *m)
{
    for (int32_t k = 0; k < m->nmg; k++)
        for (int dir = 0; dir < 2; dir++)
            if (m->mg[k].npending[dir])
                drain(m, &m->mg[k], dir);
}

void tsl_mgrit_model_free(struct tsl_model *m)
{
    for (int32_t k = 0; k < m->nmg; k++)
        for (int dir = 0; dir < 2; dir++)
            for (int32_t it = 0; it < m->mg[k].npending[dir]; it++)
                tsl_temp_handle_release(m->ctx, m->mg[k].pending[dir][it]);
    free(m->mg);
    m->mg = NULL;
    m->nmg = 0;
}

void tsl_mgrit_instance_free(struct tsl_model *m, instance *in)
{
    if (!in->mg)
        return;
    for (int32_t k = 0; k < 2 * m->nmg; k++) {
        if (!in->mg[k])
            continue;
        size_t total = 0;
        for (int32_t l = 1; l < m->plan.levels; l++)
            total += 3 * ((size_t)(m->mg[k / 2].s.steps / ipow(m->plan.cf, l)) + 1);
        for (size_t i = 0; i < total; i++)
            tsl_tensor_destroy(in->mg[k][i]);
        free(in->mg[k]);
    }
    free(in->mg);
    in->mg = NULL;
}

int32_t tsl_model_mgrit_segments(tsl_model_t m)
{
    return m ? m->nmg : 0;
}

tsl_status tsl_model_mgrit_residuals(tsl_model_t m, int32_t segment, int32_t backward, int32_t max,
                                     double *norms, int32_t *count)
{
    const char *fn = "tsl_model_mgrit_residuals";
    if (!m || !count || max < 0 || (max > 0 && !norms))
        return tsl_error(m ? m->ctx : NULL, TSL_ERR_INVALID_ARG, "%s: bad argument", fn);
    if (segment < 0 || segment >= m->nmg)
        return tsl_error(m->ctx, TSL_ERR_INVALID_ARG,
                         "%s: segment %d; the model's plan solves %d by MGRIT", fn, (int)segment,
                         (int)m->nmg);
    const tsl_mgrit_segment *seg = &m->mg[segment];
    int dir = backward != 0;
    *count = seg->nres[dir];
    for (int32_t i = 0; i < seg->nres[dir] && i < max; i++)
        norms[i] = seg->res[dir][i];
    return TSL_OK;
}
