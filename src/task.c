/* The one place tile tasks are submitted: starpu_mpi_task_build / submit / post_build, so
 * that every task this rank runs is counted (tsl_context_wait) and every call looks alike. */
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "trace.h"

/* Run by the worker right after each task. With yielding threads on several ranks, it also
 * gives the core away for a moment: the task may have made data another rank waits for, and
 * the StarPU-MPI thread that posts the send shares the core with this worker wherever ranks
 * have few cores; without the yield it runs when the scheduler next preempts the worker, which
 * is busy with the next task (a tick, 3.5-5 ms here, per batch-norm layer of a data-parallel
 * step: bench/RESULTS.md). */
void tsl_pending_add(struct tsl_context *ctx)
{
    pthread_mutex_lock(&ctx->pending_lock);
    ctx->pending_tasks++;
    pthread_mutex_unlock(&ctx->pending_lock);
}

void tsl_pending_done(void *arg)
{
    struct tsl_context *ctx = arg;
    pthread_mutex_lock(&ctx->pending_lock);
    if (--ctx->pending_tasks == 0)
        pthread_cond_broadcast(&ctx->pending_done);
    pthread_mutex_unlock(&ctx->pending_lock);
}

void tsl_task_finished(struct tsl_context *ctx)
{
    if (ctx->yield_after_task)
        sched_yield();
    tsl_pending_done(ctx);
}

static void task_done(void *arg)
{
    tsl_task_finished(arg);
}

/* ---- StarPU-MPI's cache of other ranks' data on this rank ----
 *
 * StarPU-MPI puts a remote handle in its receive cache when a task this rank runs reads it
 * (starpu_mpi_task_build) and keeps the copy until a flush, or until the owner writes the data
 * again. tessel notes each such handle as its task is built and drops it at its flush; entries
 * StarPU-MPI cleared itself are dropped before each new one is counted, so the count is exact
 * when the most is taken. */

static int64_t cached_find(const struct tsl_context *ctx, starpu_data_handle_t h)
{
    for (int64_t i = 0; i < ctx->ncached; i++)
        if (ctx->cached[i] == h)
            return i;
    return -1;
}

static void cached_drop(struct tsl_context *ctx, int64_t i)
{
    ctx->cached_now -= ctx->cached_size[i];
    ctx->ncached--;
    ctx->cached[i] = ctx->cached[ctx->ncached];
    ctx->cached_size[i] = ctx->cached_size[ctx->ncached];
}

/* After building a task this rank runs: its remote read handles StarPU-MPI now caches. */
static void cached_note(struct tsl_context *ctx, const struct starpu_data_descr *d, int n)
{
    pthread_mutex_lock(&ctx->cache_lock);
    for (int k = 0; k < n; k++) {
        starpu_data_handle_t h = d[k].handle;
        if (!(d[k].mode & STARPU_R) || starpu_mpi_data_get_rank(h) == ctx->rank ||
            cached_find(ctx, h) >= 0 || !starpu_mpi_cached_receive(h))
            continue;
        for (int64_t i = ctx->ncached - 1; i >= 0; i--)
            if (!starpu_mpi_cached_receive(ctx->cached[i]))
                cached_drop(ctx, i);
        if (ctx->ncached == ctx->cached_cap) {
            int64_t cap = ctx->cached_cap ? 2 * ctx->cached_cap : 64;
            starpu_data_handle_t *hs = realloc(ctx->cached, sizeof *hs * (size_t)cap);
            if (hs)
                ctx->cached = hs;
            int64_t *sz = hs ? realloc(ctx->cached_size, sizeof *sz * (size_t)cap) : NULL;
            if (sz)
                ctx->cached_size = sz;
            if (!hs || !sz)
                break; /* out of memory: this handle goes uncounted */
            ctx->cached_cap = cap;
        }
        ctx->cached[ctx->ncached] = h;
        ctx->cached_size[ctx->ncached++] = (int64_t)starpu_data_get_size(h);
        ctx->cached_now += (int64_t)starpu_data_get_size(h);
        if (ctx->cached_now > ctx->cached_most)
            ctx->cached_most = ctx->cached_now;
    }
    pthread_mutex_unlock(&ctx->cache_lock);
}

void tsl_cache_flush(struct tsl_context *ctx, starpu_data_handle_t handle)
{
    pthread_mutex_lock(&ctx->cache_lock);
    int64_t i = cached_find(ctx, handle);
    if (i >= 0)
        cached_drop(ctx, i);
    pthread_mutex_unlock(&ctx->cache_lock);
    starpu_mpi_cache_flush(ctx->comm, handle);
}

/* The same argument list goes to the build and post-build calls. */
#define TASK_ARGS(desc, descrs)                                                                    \
    STARPU_VALUE, (desc)->args, (desc)->args_size, STARPU_DATA_MODE_ARRAY, (descrs),               \
        (desc)->nhandles, STARPU_FLOPS, (desc)->flops, STARPU_PRIORITY, (desc)->priority,          \
        STARPU_NAME, (desc)->name ? (desc)->name : (desc)->codelet->name,                          \
        STARPU_CALLBACK_WITH_ARG_NFREE, task_done, ctx, 0

tsl_status tsl_task_where_parse(const char *text, tsl_task_where *out)
{
    static const char *const names[] = {"any", "cpu", "cuda", "auto"};
    for (int i = 0; text && i < 4; i++)
        if (strcmp(text, names[i]) == 0) {
            *out = (tsl_task_where)i;
            return TSL_OK;
        }
    return TSL_ERR_INVALID_ARG;
}

tsl_status tsl_context_set_task_where(tsl_context_t ctx, tsl_task_where where)
{
    if (!ctx)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "tsl_context_set_task_where: ctx is NULL");
    if (where != TSL_TASK_WHERE_ANY && where != TSL_TASK_WHERE_CPU &&
        where != TSL_TASK_WHERE_CUDA && where != TSL_TASK_WHERE_AUTO)
        return tsl_error(ctx, TSL_ERR_INVALID_ARG, "tsl_context_set_task_where: unknown value %d",
                         (int)where);
    ctx->task_where = where;
    return TSL_OK;
}

tsl_task_where tsl_context_task_where(tsl_context_t ctx)
{
    return ctx ? ctx->task_where : TSL_TASK_WHERE_AUTO;
}

/* task->where for a built task under TSL_TASK_WHERE_CPU or _CUDA: CUDA only where the choice
 * is CUDA, the process has a CUDA worker, the codelet has a CUDA function and its can_execute
 * (if any) accepts the task on that worker; CPU otherwise. */
static int32_t task_where_mask(tsl_task_where where, struct starpu_task *task)
{
    const struct starpu_codelet *cl = task->cl;
    if (where == TSL_TASK_WHERE_CUDA && cl->cuda_funcs[0]) {
        int cuda = starpu_worker_get_by_type(STARPU_CUDA_WORKER, 0);
        if (cuda >= 0 && (!cl->can_execute || cl->can_execute((unsigned)cuda, task, 0)))
            return STARPU_CUDA;
    }
    return STARPU_CPU;
}

tsl_status tsl_task_submit_handles(struct tsl_context *ctx, struct starpu_codelet *cl,
                                   const void *args, size_t args_size, int n,
                                   const starpu_data_handle_t *handles,
                                   const enum starpu_data_access_mode *modes, double flops)
{
    tsl_task_desc desc = {
        .codelet = cl, .args = args, .args_size = args_size, .nhandles = n, .flops = flops};
    for (int k = 0; k < n; k++) {
        desc.handles[k] = handles[k];
        desc.modes[k] = modes[k];
    }
    return tsl_task_submit(ctx, &desc);
}

tsl_status tsl_task_submit(struct tsl_context *ctx, const tsl_task_desc *desc)
{
    if (desc->nhandles < 1 || desc->nhandles > TSL_TASK_MAX_HANDLES || !desc->args ||
        desc->args_size == 0)
        return tsl_error(ctx, TSL_ERR_INVALID_ARG, "internal: malformed task description");
    struct starpu_data_descr descrs[TSL_TASK_MAX_HANDLES];
    /* The first written tile's sample-tile number + 1 (tsl_tensor_order_by_samples), or 0. */
    intptr_t sample = 0;
    for (int i = 0; i < desc->nhandles; i++) {
        descrs[i].handle = desc->handles[i];
        descrs[i].mode = desc->modes[i];
        if (!sample && (desc->modes[i] & STARPU_W))
            sample = (intptr_t)starpu_data_get_user_data(desc->handles[i]);
    }
    tsl_task_desc ordered;
    if (sample > 0 && desc->priority == 0) {
        ordered = *desc;
        ordered.priority = -(int)(sample - 1);
        desc = &ordered;
    } else if (desc->priority == 0 && ctx->task_priority != 0) {
        ordered = *desc;
        ordered.priority = ctx->task_priority;
        desc = &ordered;
    }
    const char *name = desc->name ? desc->name : desc->codelet->name;
    int64_t seq = ctx->trace ? tsl_trace_submitted(ctx, descrs, desc->nhandles, name) : -1;
    struct starpu_task *task =
        starpu_mpi_task_build(ctx->comm, desc->codelet, TASK_ARGS(desc, descrs));
    if (task) {
        tsl_task_where where = ctx->task_where;
        if (where == TSL_TASK_WHERE_AUTO)
            where = starpu_cuda_worker_get_count() > 0 ? TSL_TASK_WHERE_CUDA : TSL_TASK_WHERE_ANY;
        if (where != TSL_TASK_WHERE_ANY)
            task->where = task_where_mask(where, task);
        if (ctx->trace)
            tsl_trace_task(ctx, task, name, seq);
        cached_note(ctx, descrs, desc->nhandles);
        tsl_pending_add(ctx);
        int ret = starpu_task_submit(task);
        if (ret != 0) {
            task_done(ctx);
            return tsl_error(ctx, TSL_ERR_RUNTIME, "starpu_task_submit(%s) failed: %d",
                             desc->codelet->name, ret);
        }
    }
    int ret = starpu_mpi_task_post_build(ctx->comm, desc->codelet, TASK_ARGS(desc, descrs));
    if (ret != 0)
        return tsl_error(ctx, TSL_ERR_RUNTIME, "starpu_mpi_task_post_build(%s) failed: %d",
                         desc->codelet->name, ret);
    return TSL_OK;
}

tsl_status tsl_temp_handle_register(struct tsl_context *ctx, int64_t count, size_t elem_size,
                                    int owner, starpu_data_handle_t *handle)
{
    int64_t tag;
    tsl_status st = tsl_context_next_tag(ctx, &tag);
    if (st)
        return st;
    if (count < 1 || count > (int64_t)UINT32_MAX)
        return tsl_error(ctx, TSL_ERR_SHAPE, "internal: temporary buffer of %lld elements",
                         (long long)count);
    starpu_vector_data_register(handle, -1, 0, (uint32_t)count, elem_size);
    starpu_mpi_data_register_comm(*handle, tag, owner, ctx->comm);
    return TSL_OK;
}

void tsl_temp_handle_release(struct tsl_context *ctx, starpu_data_handle_t handle)
{
    tsl_cache_flush(ctx, handle);
    starpu_data_unregister_submit(handle);
}

tsl_status tsl_submit_tiles(struct starpu_codelet *codelet, int ntensors,
                            struct tsl_tensor *const *tensors,
                            const enum starpu_data_access_mode *modes, void *args, size_t args_size,
                            size_t count_offset, double flops_per_element)
{
    struct tsl_context *ctx = tensors[0]->ctx;
    int writer = -1;
    for (int k = 0; k < ntensors; k++)
        if (modes[k] & STARPU_W)
            writer = k;
    if (ntensors < 1 || ntensors > TSL_TASK_MAX_HANDLES || writer < 0)
        return tsl_error(ctx, TSL_ERR_INVALID_ARG, "internal: malformed tile task list");
    for (int64_t i = 0; i < tensors[0]->ntiles; i++) {
        int64_t count = tsl_tensor_tile_numel(tensors[0], i);
        memcpy((char *)args + count_offset, &count, sizeof count);
        tsl_task_desc desc = {
            .codelet = codelet,
            .args = args,
            .args_size = args_size,
            .nhandles = ntensors,
            .flops = flops_per_element * (double)count,
        };
        for (int k = 0; k < ntensors; k++) {
            desc.handles[k] = tensors[k]->handles[i];
            desc.modes[k] = modes[k];
        }
        tsl_status st = tsl_task_submit(ctx, &desc);
        if (st)
            return st;
        int32_t runs_on = tensors[writer]->tile_owner[i];
        for (int k = 0; k < ntensors; k++)
            if (modes[k] == STARPU_R && tensors[k]->tile_owner[i] != runs_on)
                tsl_cache_flush(ctx, tensors[k]->handles[i]);
    }
    return TSL_OK;
}

int tsl_views_enabled(void)
{
    return getenv("TSL_GATHER_COPIES") == NULL;
}

void tsl_views_begin(starpu_data_handle_t whole, int64_t n, uint32_t *lengths,
                     starpu_data_handle_t *views)
{
    struct starpu_data_filter f = {
        .filter_func = starpu_vector_filter_list,
        .nchildren = (unsigned)n,
        .filter_arg_ptr = lengths,
    };
    starpu_data_partition_plan(whole, &f, views);
    starpu_data_partition_submit(whole, (unsigned)n, views);
}

void tsl_views_end(starpu_data_handle_t whole, int64_t n, starpu_data_handle_t *views)
{
    /* Gathered where the handle's data is (-1: also for StarPU's own temporaries). */
    starpu_data_unpartition_submit(whole, (unsigned)n, views, -1);
    starpu_data_partition_clean(whole, (unsigned)n, views);
}
