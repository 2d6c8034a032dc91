/* The context's queries: rank, size, workers, scheduler, memory and traffic accounting,
 * StarPU-MPI tags, tracked tensors, agreement across ranks and worker times (creation,
 * StarPU start-up and destruction are in src/context.c). */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <starpu.h>

#include "host_cache.h"
#include "internal.h"
#include "tessel/starpu.h"

#define CHECK_CTX(ctx, out, fn)                                                                    \
    do {                                                                                           \
        if (!(ctx))                                                                                \
            return tsl_error(NULL, TSL_ERR_INVALID_ARG, fn ": ctx is NULL");                       \
        if (!(out))                                                                                \
            return tsl_error((ctx), TSL_ERR_INVALID_ARG, fn ": output pointer is NULL");           \
    } while (0)

tsl_status tsl_context_rank(tsl_context_t ctx, int32_t *rank)
{
    CHECK_CTX(ctx, rank, "tsl_context_rank");
    *rank = ctx->rank;
    return TSL_OK;
}

tsl_status tsl_context_size(tsl_context_t ctx, int32_t *size)
{
    CHECK_CTX(ctx, size, "tsl_context_size");
    *size = ctx->size;
    return TSL_OK;
}

tsl_status tsl_context_worker_count(tsl_context_t ctx, tsl_worker_kind kind, int32_t *count)
{
    CHECK_CTX(ctx, count, "tsl_context_worker_count");
    switch (kind) {
    case TSL_WORKER_CPU:
        *count = (int32_t)starpu_cpu_worker_get_count();
        return TSL_OK;
    case TSL_WORKER_CUDA:
        *count = (int32_t)starpu_cuda_worker_get_count();
        return TSL_OK;
    case TSL_WORKER_ANY:
        *count = (int32_t)starpu_worker_get_count();
        return TSL_OK;
    }
    return tsl_error(ctx, TSL_ERR_INVALID_ARG, "tsl_context_worker_count: unknown worker kind %d",
                     (int)kind);
}

tsl_status tsl_context_core_sharing(tsl_context_t ctx, int32_t *node_ranks, int32_t *node_cores)
{
    CHECK_CTX(ctx, node_ranks, "tsl_context_core_sharing");
    if (!node_cores)
        return tsl_error(ctx, TSL_ERR_INVALID_ARG, "tsl_context_core_sharing: bad argument");
    *node_ranks = ctx->node_ranks;
    *node_cores = ctx->node_cores;
    return TSL_OK;
}

tsl_status tsl_context_owns_runtime(tsl_context_t ctx, int32_t *owns)
{
    CHECK_CTX(ctx, owns, "tsl_context_owns_runtime");
    *owns = ctx->owns_runtime;
    return TSL_OK;
}

tsl_status tsl_context_scheduler(tsl_context_t ctx, const char **name)
{
    CHECK_CTX(ctx, name, "tsl_context_scheduler");
    struct starpu_sched_policy *policy = starpu_sched_ctx_get_sched_policy(0);
    *name = policy && policy->policy_name ? policy->policy_name : "unknown";
    return TSL_OK;
}

tsl_status tsl_context_owned_bytes(tsl_context_t ctx, int64_t *bytes)
{
    CHECK_CTX(ctx, bytes, "tsl_context_owned_bytes");
    *bytes = ctx->owned_bytes;
    return TSL_OK;
}

tsl_status tsl_context_host_cache(tsl_context_t ctx, int64_t *kept_bytes, int64_t *reused,
                                  int64_t *allocated)
{
    CHECK_CTX(ctx, kept_bytes, "tsl_context_host_cache");
    if (!reused || !allocated)
        return tsl_error(ctx, TSL_ERR_INVALID_ARG,
                         "tsl_context_host_cache: output pointer is NULL");
    tsl_host_cache_stats stats;
    size_t kept;
    tsl_host_cache_query(&stats, &kept);
    *kept_bytes = (int64_t)kept;
    *reused = stats.reused;
    *allocated = stats.allocated;
    return TSL_OK;
}

tsl_status tsl_context_buffer_bytes(tsl_context_t ctx, int64_t *in_use, int64_t *most)
{
    CHECK_CTX(ctx, in_use, "tsl_context_buffer_bytes");
    if (!most)
        return tsl_error(ctx, TSL_ERR_INVALID_ARG,
                         "tsl_context_buffer_bytes: output pointer is NULL");
    tsl_host_cache_stats stats;
    size_t kept;
    if (!ctx->owns_runtime || !tsl_host_cache_query(&stats, &kept))
        return tsl_error(ctx, TSL_ERR_UNSUPPORTED,
                         "tsl_context_buffer_bytes: StarPU's buffers are counted only by a "
                         "context that owns StarPU (tsl_context_create)");
    *in_use = (int64_t)stats.in_use;
    *most = (int64_t)stats.high_water;
    return TSL_OK;
}

tsl_status tsl_context_cached_bytes(tsl_context_t ctx, int64_t *now, int64_t *most)
{
    CHECK_CTX(ctx, now, "tsl_context_cached_bytes");
    if (!most)
        return tsl_error(ctx, TSL_ERR_INVALID_ARG,
                         "tsl_context_cached_bytes: output pointer is NULL");
    pthread_mutex_lock(&ctx->cache_lock);
    *now = ctx->cached_now;
    *most = ctx->cached_most;
    ctx->cached_most = ctx->cached_now;
    pthread_mutex_unlock(&ctx->cache_lock);
    return TSL_OK;
}

tsl_status tsl_context_tags_used(tsl_context_t ctx, int64_t *used)
{
    CHECK_CTX(ctx, used, "tsl_context_tags_used");
    *used = ctx->tags_used;
    return TSL_OK;
}

tsl_status tsl_context_set_log_level(tsl_context_t ctx, tsl_log_level level)
{
    if (!ctx)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "tsl_context_set_log_level: ctx is NULL");
    if (level < TSL_LOG_ERROR || level > TSL_LOG_DEBUG)
        return tsl_error(ctx, TSL_ERR_INVALID_ARG, "tsl_context_set_log_level: level %d",
                         (int)level);
    ctx->log_level = level;
    return TSL_OK;
}

const char *tsl_context_last_error(tsl_context_t ctx)
{
    return ctx ? ctx->last_error : tsl_last_error();
}

tsl_status tsl_context_comm(tsl_context_t ctx, MPI_Comm *comm)
{
    CHECK_CTX(ctx, comm, "tsl_context_comm");
    *comm = ctx->comm;
    return TSL_OK;
}

tsl_status tsl_context_next_tag(struct tsl_context *ctx, int64_t *tag)
{
    if (ctx->tags_used >= ctx->tag_count)
        return tsl_error(ctx, TSL_ERR_RESOURCE,
                         "StarPU-MPI tag range exhausted: all %lld tags from %lld on are used; "
                         "give the context a larger tag_count",
                         (long long)ctx->tag_count, (long long)ctx->tag_base);
    *tag = ctx->tag_base + ctx->tags_used;
    ctx->tags_used++;
    return TSL_OK;
}

void tsl_context_track_tensor(struct tsl_context *ctx, struct tsl_tensor *tensor)
{
    if (ctx->ntensors == ctx->tensors_cap) {
        int64_t cap = ctx->tensors_cap ? 2 * ctx->tensors_cap : 16;
        struct tsl_tensor **grown = realloc(ctx->tensors, (size_t)cap * sizeof *grown);
        if (!grown) /* the tensor still works; it just is not destroyed with the context */
            return;
        ctx->tensors = grown;
        ctx->tensors_cap = cap;
    }
    ctx->tensors[ctx->ntensors++] = tensor;
}

void tsl_context_untrack_tensor(struct tsl_context *ctx, struct tsl_tensor *tensor)
{
    for (int64_t i = ctx->ntensors - 1; i >= 0; i--) {
        if (ctx->tensors[i] == tensor) {
            ctx->tensors[i] = ctx->tensors[ctx->ntensors - 1];
            ctx->ntensors--;
            return;
        }
    }
}

tsl_status tsl_context_agree(struct tsl_context *ctx, int root, tsl_status status)
{
    int value = (int)status;
    if (MPI_Bcast(&value, 1, MPI_INT, root, ctx->ctl_comm) != MPI_SUCCESS)
        return tsl_error(ctx, TSL_ERR_RUNTIME, "MPI_Bcast of a status failed");
    if (value == TSL_OK)
        return TSL_OK;
    char message[TSL_ERROR_MAX];
    if (ctx->rank == root)
        snprintf(message, sizeof message, "%s", ctx->last_error);
    MPI_Bcast(message, (int)sizeof message, MPI_CHAR, root, ctx->ctl_comm);
    message[sizeof message - 1] = '\0';
    if (ctx->rank != root)
        tsl_error_set_message(ctx, message);
    return (tsl_status)value;
}

tsl_status tsl_context_agree_all(struct tsl_context *ctx, tsl_status status)
{
    int mine = status == TSL_OK ? ctx->size : ctx->rank, first = ctx->size;
    if (MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, ctx->ctl_comm) != MPI_SUCCESS)
        return tsl_error(ctx, TSL_ERR_RUNTIME, "MPI_Allreduce of a status failed");
    return first == ctx->size ? TSL_OK : tsl_context_agree(ctx, first, status);
}

int tsl_comm_stats_on(void)
{
    const char *env = getenv("STARPU_COMM_STATS");
    return env && atoi(env) > 0;
}

tsl_status tsl_context_comm_bytes(tsl_context_t ctx, int64_t *sent, int64_t *received)
{
    const char *fn = "tsl_context_comm_bytes";
    if (!ctx || !sent || !received)
        return tsl_error(ctx, TSL_ERR_INVALID_ARG, "%s: NULL argument", fn);
    if (!tsl_comm_stats_on())
        return tsl_error(ctx, TSL_ERR_STATE,
                         "%s: communication statistics are off (set "
                         "tsl_context_config.comm_stats, or STARPU_COMM_STATS=1 before StarPU "
                         "starts)",
                         fn);
    int n = ctx->size;
    size_t *amounts = calloc((size_t)n, sizeof *amounts);
    int64_t *to = calloc((size_t)n, sizeof *to), *all = calloc((size_t)n, sizeof *all);
    if (!amounts || !to || !all) {
        free(amounts);
        free(to);
        free(all);
        return tsl_error(ctx, TSL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    }
    starpu_mpi_comm_amounts_retrieve(amounts);
    int64_t mine = 0;
    for (int r = 0; r < n; r++) {
        to[r] = (int64_t)amounts[r];
        mine += to[r];
    }
    int bad = MPI_Allreduce(to, all, n, MPI_INT64_T, MPI_SUM, ctx->ctl_comm) != MPI_SUCCESS;
    if (!bad) {
        *sent = mine;
        *received = all[ctx->rank];
    }
    free(amounts);
    free(to);
    free(all);
    return bad ? tsl_error(ctx, TSL_ERR_RUNTIME, "%s: MPI_Allreduce failed", fn) : TSL_OK;
}

static double timespec_seconds(const struct timespec *t)
{
    return (double)t->tv_sec + 1e-9 * (double)t->tv_nsec;
}

tsl_status tsl_context_worker_seconds(tsl_context_t ctx, double *executing, double *total)
{
    if (!ctx || !executing || !total)
        return tsl_error(ctx, TSL_ERR_INVALID_ARG, "tsl_context_worker_seconds: NULL argument");
    tsl_worker_stats w;
    tsl_status st = tsl_context_worker_stats(ctx, &w);
    *executing = st ? 0 : w.executing[0] + w.executing[1];
    *total = st ? 0 : w.total[0] + w.total[1];
    return st;
}

tsl_status tsl_context_worker_stats(tsl_context_t ctx, tsl_worker_stats *stats)
{
    if (!ctx || !stats)
        return tsl_error(ctx, TSL_ERR_INVALID_ARG, "tsl_context_worker_stats: NULL argument");
    memset(stats, 0, sizeof *stats);
    if (starpu_profiling_status_get() != STARPU_PROFILING_ENABLE) {
        starpu_profiling_status_set(STARPU_PROFILING_ENABLE);
        return TSL_OK;
    }
    unsigned n = starpu_worker_get_count();
    for (unsigned w = 0; w < n; w++) {
        struct starpu_profiling_worker_info info;
        if (starpu_profiling_worker_get_info((int)w, &info) != 0)
            return tsl_error(ctx, TSL_ERR_RUNTIME,
                             "tsl_context_worker_stats: no profiling for worker %u", w);
        int k =
            starpu_worker_get_type((int)w) == STARPU_CUDA_WORKER ? TSL_WORKER_CUDA : TSL_WORKER_CPU;
        stats->tasks[k] += info.executed_tasks;
        stats->executing[k] += timespec_seconds(&info.executing_time);
        stats->total[k] += timespec_seconds(&info.total_time);
    }
    return TSL_OK;
}
