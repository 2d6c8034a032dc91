/* The context: owns or attaches to StarPU + StarPU-MPI, hands out StarPU-MPI tags,
 * counts outstanding tasks, keeps the last error. Creation, StarPU start-up and destruction
 * here; queries and accounting in src/context_query.c. */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cblas.h>

#include <starpu_expert.h>

#include "cuda_handles.h"
#include "host_cache.h"
#include "node_share.h"
#include "internal.h"
#include "trace.h"
#include "tessel/starpu.h"

#define TSL_DEFAULT_TAG_BASE ((int64_t)1 << 40)
#define TSL_DEFAULT_TAG_COUNT ((int64_t)1 << 40)
#define TSL_HOST_CACHE_MIN ((int64_t)32 << 20)
#define TSL_HOST_CACHE_MAX ((int64_t)1 << 30)

/* Rank of this process for codelet abort messages (codelets/codelet.h). */
int tsl_codelet_rank = -1;

tsl_status tsl_context_config_init(tsl_context_config *config)
{
    if (!config)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "tsl_context_config_init: config is NULL");
    memset(config, 0, sizeof *config);
    config->ncpu = -1;
    config->ncuda = -1;
    config->scheduler = NULL;
    config->tag_base = TSL_DEFAULT_TAG_BASE;
    config->tag_count = TSL_DEFAULT_TAG_COUNT;
    config->log_level = TSL_LOG_WARN;
    config->log_fn = NULL;
    config->log_user = NULL;
    config->host_cache_bytes = TSL_HOST_CACHE_AUTO;
    config->yield_when_idle = 1;
    return TSL_OK;
}

static tsl_status check_config(const tsl_context_config *config, const char *fn)
{
    if (config->ncpu < -1)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "%s: ncpu %d (want -1 or >= 0)", fn,
                         (int)config->ncpu);
    if (config->ncuda < -1)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "%s: ncuda %d (want -1 or >= 0)", fn,
                         (int)config->ncuda);
    if (config->tag_base < 0 || config->tag_count <= 0 ||
        config->tag_base > INT64_MAX - config->tag_count)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                         "%s: tag range base %lld count %lld (want base >= 0, count > 0, no "
                         "overflow)",
                         fn, (long long)config->tag_base, (long long)config->tag_count);
    if (config->log_level < TSL_LOG_ERROR || config->log_level > TSL_LOG_DEBUG)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "%s: log level %d out of range", fn,
                         (int)config->log_level);
    if (config->host_cache_bytes < TSL_HOST_CACHE_AUTO)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                         "%s: host cache of %lld bytes (want >= 0, or TSL_HOST_CACHE_AUTO)", fn,
                         (long long)config->host_cache_bytes);
    if (config->scheduler && (config->scheduler[0] == '\0' || strlen(config->scheduler) > 64))
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "%s: scheduler name empty or too long", fn);
    return TSL_OK;
}

/* StarPU falls back to its default policy when a name is unknown; refuse instead. */
static tsl_status check_scheduler(const char *name, const char *fn)
{
    struct starpu_sched_policy **policies = starpu_sched_get_predefined_policies();
    char known[1024] = "";
    for (int i = 0; policies && policies[i]; i++) {
        if (strcmp(policies[i]->policy_name, name) == 0)
            return TSL_OK;
        size_t len = strlen(known);
        snprintf(known + len, sizeof known - len, "%s%s", len ? " " : "", policies[i]->policy_name);
    }
    return tsl_error(NULL, TSL_ERR_INVALID_ARG, "%s: unknown StarPU scheduler '%s' (known: %s)", fn,
                     name, known);
}

/* Errors and log lines made for a context (common/error.h): kept as its last error, and
 * written through its level, rank and callback. */
static void sink_record(struct tsl_context *ctx, const char *message)
{
    snprintf(ctx->last_error, sizeof ctx->last_error, "%s", message);
}

static int sink_wants(struct tsl_context *ctx, tsl_log_level level)
{
    return level <= ctx->log_level;
}

static void sink_emit(struct tsl_context *ctx, tsl_log_level level, const char *message)
{
    if (ctx->log_fn)
        ctx->log_fn(level, ctx->rank, message, ctx->log_user);
    else
        fprintf(stderr, "tessel[%d] %s: %s\n", ctx->rank, tsl_log_level_name(level), message);
}

static const tsl_log_sink context_sink = {sink_record, sink_wants, sink_emit};

static tsl_status context_alloc(const tsl_context_config *config, struct tsl_context **out)
{
    tsl_log_sink_register(&context_sink);
    struct tsl_context *ctx = calloc(1, sizeof *ctx);
    if (!ctx)
        return tsl_error(NULL, TSL_ERR_OUT_OF_MEMORY, "context: out of memory");
    ctx->tag_base = config->tag_base;
    ctx->tag_count = config->tag_count;
    ctx->log_level = config->log_level;
    ctx->log_fn = config->log_fn;
    ctx->log_user = config->log_user;
    ctx->comm = MPI_COMM_NULL;
    ctx->ctl_comm = MPI_COMM_NULL;
    ctx->idle_hook = -1;
    ctx->task_where = TSL_TASK_WHERE_AUTO;
    const char *where = getenv("TSL_TASK_WHERE");
    if (where && *where && tsl_task_where_parse(where, &ctx->task_where)) {
        free(ctx);
        return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                         "context: TSL_TASK_WHERE=%s: expected any, cpu, cuda or auto", where);
    }
    pthread_mutex_init(&ctx->pending_lock, NULL);
    pthread_cond_init(&ctx->pending_done, NULL);
    pthread_mutex_init(&ctx->cache_lock, NULL);
    *out = ctx;
    return TSL_OK;
}

static void context_free(struct tsl_context *ctx)
{
    tsl_trace_destroy(ctx);
    pthread_mutex_destroy(&ctx->pending_lock);
    pthread_cond_destroy(&ctx->pending_done);
    pthread_mutex_destroy(&ctx->cache_lock);
    free(ctx->cached);
    free(ctx->cached_size);
    free(ctx->scheduler);
    free(ctx->tensors);
    free(ctx);
}

/* Common tail of create and attach: communicators, rank, size, and single-threaded
 * OpenBLAS (DESIGN rule 7: one task, one core; parallelism comes from tiles). */
static tsl_status context_bind_comm(struct tsl_context *ctx, MPI_Comm comm)
{
    openblas_set_num_threads(1);
    ctx->comm = comm;
    if (MPI_Comm_dup(comm, &ctx->ctl_comm) != MPI_SUCCESS)
        return tsl_error(NULL, TSL_ERR_RUNTIME, "context: MPI_Comm_dup failed");
    MPI_Comm_rank(comm, &ctx->rank);
    MPI_Comm_size(comm, &ctx->size);
    tsl_codelet_rank = ctx->rank;
    tsl_cuda_handles_acquire(); /* cuBLAS and cuDNN handles of the CUDA workers */
    return TSL_OK;
}

int tsl_node_share(int local, int nlocal, int cores, int yielding, int *first, int *count)
{
    if (nlocal < 2 || local < 0 || local >= nlocal || cores < 1)
        return 0;
    if (cores >= 2 * nlocal) {
        *count = cores / nlocal;
        *first = local * *count;
        return 1;
    }
    if (!yielding)
        return 0;
    *count = 1;
    *first = local % cores;
    return 1;
}

/* starpu_mpi_init_conf(), the node's ranks in turn. StarPU's first start with a STARPU_HOME
 * measures the memory bus and writes the results there; ranks of one node starting together
 * with a fresh STARPU_HOME read each other's half-written files, and StarPU aborts
 * (check_bus_affinity_file). So the node's first rank starts first and the others once it has
 * (they then read finished files). A StarPU built with FxT synchronises the ranks inside its
 * start, so there every rank starts at once, as before. */
static int start_starpu(struct starpu_conf *conf)
{
    MPI_Comm node = MPI_COMM_NULL;
    int local = 0;
#ifndef STARPU_USE_FXT
    int world = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    if (world > 1 && MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL,
                                         &node) == MPI_SUCCESS)
        MPI_Comm_rank(node, &local);
    else
        node = MPI_COMM_NULL;
#endif
    if (node != MPI_COMM_NULL && local > 0)
        MPI_Barrier(node); /* the first rank has started */
    int ret = starpu_mpi_init_conf(NULL, NULL, 0, MPI_COMM_WORLD, conf);
    if (node != MPI_COMM_NULL) {
        if (local == 0)
            MPI_Barrier(node);
        MPI_Comm_free(&node);
    }
    return ret;
}

/* The memory of this process's node as the kernel sees it, lowered to its cgroup's limit
 * (cgroup v2 memory.max) when that is lower; 0 if unknown. */
static int64_t node_memory_bytes(void)
{
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    int64_t bytes = pages > 0 && page > 0 ? (int64_t)pages * page : 0;
    FILE *f = fopen("/sys/fs/cgroup/memory.max", "r");
    if (f) {
        long long limit = 0;
        if (fscanf(f, "%lld", &limit) == 1 && limit > 0 && (bytes == 0 || limit < bytes))
            bytes = limit;
        fclose(f);
    }
    return bytes;
}

/* TSL_HOST_CACHE_AUTO's limit: an eighth of this rank's share of its node's memory, between
 * TSL_HOST_CACHE_MIN and TSL_HOST_CACHE_MAX. Collective over MPI_COMM_WORLD. */
static int64_t auto_host_cache_bytes(void)
{
    int nlocal = 1, world = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    MPI_Comm node;
    if (world > 1 && MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL,
                                         &node) == MPI_SUCCESS) {
        MPI_Comm_size(node, &nlocal);
        MPI_Comm_free(&node);
    }
    int64_t limit = node_memory_bytes() / (nlocal > 0 ? nlocal : 1) / 8;
    return limit < TSL_HOST_CACHE_MIN   ? TSL_HOST_CACHE_MIN
           : limit > TSL_HOST_CACHE_MAX ? TSL_HOST_CACHE_MAX
                                        : limit;
}

/* Ranks sharing a node get cores of their own (DESIGN rule 7: one task, one core). StarPU
 * binds a process's workers from the node's first core on and its StarPU-MPI thread to the
 * next free one, knowing nothing of the other processes: without this, the workers of every
 * rank on a node share the same first cores and every rank's StarPU-MPI thread the next one.
 * Where the node has at least two cores per rank, local rank l gets the cores
 * tsl_node_share() gives: its workers bind to all but the last, its StarPU-MPI thread to the
 * last (C/L - 1 workers unless ncpu or STARPU_NCPU say otherwise; more go on round the
 * node). With fewer cores than that, and threads that yield when idle (yield_when_idle), each
 * rank's workers and StarPU-MPI thread share one core, local rank l's l mod C (one worker
 * unless ncpu or STARPU_NCPU say otherwise): data=2 on two cores measured 0.090 s/step against
 * 0.17 with StarPU's binding, which puts both ranks' workers on core 0 (bench/RESULTS.md).
 * Threads that spin instead keep StarPU's binding, where the progress threads have a core of
 * their own. Nothing changes either when the environment binds StarPU's workers
 * (STARPU_WORKERS_CPUID, _COREID or _NOBIND), or when the launcher gave the node's ranks
 * different CPU sets or a set that is not the node's first CPUs; the StarPU-MPI thread is
 * left where STARPU_MPI_THREAD_CPUID, _COREID or STARPU_MPI_NOBIND put it. Where the node's
 * ranks outnumber its cores, *node_ranks and *node_cores get both counts (else 0). Collective over
 * MPI_COMM_WORLD. A run of one rank in all keeps StarPU's binding, every core a worker's: its
 * StarPU-MPI thread has nothing to send (the Fashion-MNIST cnn ran at 1273 samples/s with a
 * core kept for it, 2119 without). A line for the log goes to `what`. */
static void share_node_cores(struct starpu_conf *conf, const tsl_context_config *config, char *what,
                             size_t size, int *node_ranks, int *node_cores)
{
    *node_ranks = *node_cores = 0;
    int user = getenv("STARPU_WORKERS_CPUID") || getenv("STARPU_WORKERS_COREID") ||
               getenv("STARPU_WORKERS_NOBIND");
    int user_mpi = getenv("STARPU_MPI_THREAD_CPUID") || getenv("STARPU_MPI_THREAD_COREID") ||
                   getenv("STARPU_MPI_NOBIND");
    snprintf(what, size, "StarPU binds the workers");
    int world = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    if (world == 1) { /* no other rank to talk to: no core kept for the StarPU-MPI thread */
        cpu_set_t all;
        CPU_ZERO(&all);
        if (config->ncpu < 0 && sched_getaffinity(0, sizeof all, &all) == 0 && CPU_COUNT(&all) > 0)
            conf->ncpus = CPU_COUNT(&all);
        snprintf(what, size, "one rank: a worker on each of its %d cores", conf->ncpus);
        return;
    }
    MPI_Comm node;
    if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) !=
        MPI_SUCCESS)
        return;
    int local = 0, nlocal = 1;
    MPI_Comm_rank(node, &local);
    MPI_Comm_size(node, &nlocal);
    cpu_set_t mine;
    CPU_ZERO(&mine);
    int known = sched_getaffinity(0, sizeof mine, &mine) == 0;
    cpu_set_t *all = calloc((size_t)nlocal, sizeof *all);
    int same = all != NULL;
    if (all) /* every rank takes part, whatever it finds */
        MPI_Allgather(&mine, (int)sizeof mine, MPI_BYTE, all, (int)sizeof mine, MPI_BYTE, node);
    for (int r = 0; same && r < nlocal; r++)
        same = CPU_EQUAL(&all[r], &mine);
    free(all);
    MPI_Comm_free(&node);
    int cores = CPU_COUNT(&mine), first = 0, count = 0;
    for (int c = 0; known && c < cores; c++)
        known = CPU_ISSET(c, &mine);
    if (user || !same || !known ||
        !tsl_node_share(local, nlocal, cores, config->yield_when_idle != 0, &first, &count))
        return;
    /* With one core, workers and StarPU-MPI thread share it; with more, the last is the
     * StarPU-MPI thread's. */
    int nworker_cores = count > 1 ? count - 1 : 1;
    if (nlocal > cores) {
        *node_ranks = nlocal;
        *node_cores = cores;
    }
    conf->use_explicit_workers_bindid = 1;
    for (int i = 0; i < STARPU_NMAXWORKERS; i++)
        conf->workers_bindid[i] = (unsigned)(count > 1 ? (first + i) % cores : first);
    if (config->ncpu < 0)
        conf->ncpus = nworker_cores;
    char id[16];
    snprintf(id, sizeof id, "%d", first + count - 1);
    if (!user_mpi)
        setenv("STARPU_MPI_THREAD_CPUID", id, 1);
    snprintf(what, size, "%d ranks share this node's %d cores: workers on cores %d-%d%s%s", nlocal,
             cores, first, first + nworker_cores - 1,
             user_mpi ? "" : ", the StarPU-MPI thread on core ", user_mpi ? "" : id);
}

/* StarPU's idle hook (run by a CPU worker that found no task, tsl_context_config::
 * yield_when_idle): the StarPU build spins its idle workers (non-blocking drivers), which keeps
 * a core from the StarPU-MPI progress thread and other ranks' threads wherever threads outnumber
 * cores; giving the core back lets them run at once. */
static unsigned idle_yield(void *arg)
{
    (void)arg;
    sched_yield();
    return 1; /* StarPU may block the worker where its build allows it */
}

tsl_status tsl_context_create(tsl_context_t *out, const tsl_context_config *config)
{
    if (!out)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "tsl_context_create: ctx is NULL");
    *out = NULL;
    tsl_context_config defaults;
    if (!config) {
        tsl_context_config_init(&defaults);
        config = &defaults;
    }
    tsl_status st = check_config(config, "tsl_context_create");
    if (st)
        return st;
    if (config->scheduler && (st = check_scheduler(config->scheduler, "tsl_context_create")))
        return st;
    if (starpu_is_initialized())
        return tsl_error(NULL, TSL_ERR_STATE,
                         "tsl_context_create: StarPU is already running in this process; "
                         "use tsl_context_attach() to embed tessel");

    int mpi_initialized = 0, mpi_finalized = 0;
    MPI_Initialized(&mpi_initialized);
    MPI_Finalized(&mpi_finalized);
    if (mpi_finalized)
        return tsl_error(NULL, TSL_ERR_STATE,
                         "tsl_context_create: MPI was already finalised in this process");

    struct tsl_context *ctx;
    st = context_alloc(config, &ctx);
    if (st)
        return st;
    ctx->owns_runtime = 1;

    if (!mpi_initialized) {
        /* Open MPI polls without yielding unless it counts more ranks than slots; tessel's
         * ranks poll from their StarPU-MPI thread and main thread next to busy workers. A
         * value the user set stays. */
        if (config->yield_when_idle)
            setenv("OMPI_MCA_mpi_yield_when_idle", "1", 0);
        int provided = 0;
        if (MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) {
            context_free(ctx);
            return tsl_error(NULL, TSL_ERR_RUNTIME, "tsl_context_create: MPI_Init_thread failed");
        }
        ctx->finalize_mpi = 1;
    }
    int provided = 0;
    MPI_Query_thread(&provided);
    int world_size = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &world_size);
    if (world_size > 1 && provided < MPI_THREAD_MULTIPLE) {
        if (ctx->finalize_mpi)
            MPI_Finalize();
        context_free(ctx);
        return tsl_error(NULL, TSL_ERR_RUNTIME,
                         "tsl_context_create: MPI provides thread level %d, tessel needs "
                         "MPI_THREAD_MULTIPLE with more than one rank",
                         provided);
    }

    struct starpu_conf conf;
    starpu_conf_init(&conf);
    if (config->ncpu >= 0)
        conf.ncpus = config->ncpu;
    if (config->ncuda >= 0)
        conf.ncuda = config->ncuda;
    conf.nopencl = 0;
    if (config->scheduler) {
        ctx->scheduler = strdup(config->scheduler);
        conf.sched_policy_name = ctx->scheduler;
    }
    if (config->comm_stats) { /* (a later context of the process finds tessel's variable) */
        static int set_here;
        if (!tsl_comm_stats_on()) {
            setenv("STARPU_COMM_STATS", "1", 1);
            set_here = 1;
        }
        ctx->own_comm_stats = set_here;
    }
    char binding[160];
    share_node_cores(&conf, config, binding, sizeof binding, &ctx->node_ranks, &ctx->node_cores);
    /* Before StarPU starts, so that every buffer it allocates and frees passes the cache
     * (which also counts them: with a limit of 0 it keeps nothing, and still counts). */
    int64_t cache = config->host_cache_bytes == TSL_HOST_CACHE_AUTO ? auto_host_cache_bytes()
                                                                    : config->host_cache_bytes;
    tsl_host_cache_install((size_t)cache);
    int ret = start_starpu(&conf);
    if (ret != 0) {
        tsl_host_cache_uninstall(NULL);
        if (ctx->finalize_mpi)
            MPI_Finalize();
        context_free(ctx);
        return tsl_error(NULL, TSL_ERR_RUNTIME,
                         "tsl_context_create: starpu_mpi_init_conf failed (%d%s)", ret,
                         ret == -ENODEV ? ": no worker available" : "");
    }
    ctx->idle_hook = config->yield_when_idle ? starpu_idle_hook_register(idle_yield, NULL) : -1;
    st = context_bind_comm(ctx, MPI_COMM_WORLD);
    ctx->yield_after_task = ctx->idle_hook >= 0 && ctx->size > 1;
    if (st) {
        starpu_mpi_shutdown();
        tsl_host_cache_uninstall(NULL);
        if (ctx->finalize_mpi)
            MPI_Finalize();
        context_free(ctx);
        return st;
    }
    const char *sched_name = "unknown";
    tsl_context_scheduler(ctx, &sched_name);
    tsl_log(ctx, TSL_LOG_INFO, "context created: %d ranks, %u workers, scheduler %s; %s", ctx->size,
            starpu_worker_get_count(), sched_name, binding);
    *out = ctx;
    return TSL_OK;
}

tsl_status tsl_context_attach(tsl_context_t *out, MPI_Comm comm, const tsl_context_config *config)
{
    if (!out)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "tsl_context_attach: ctx is NULL");
    *out = NULL;
    tsl_context_config defaults;
    if (!config) {
        tsl_context_config_init(&defaults);
        config = &defaults;
    }
    tsl_status st = check_config(config, "tsl_context_attach");
    if (st)
        return st;
    if (config->ncpu != -1 || config->ncuda != -1 || config->scheduler)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                         "tsl_context_attach: workers and scheduler belong to the host's "
                         "StarPU; leave ncpu, ncuda and scheduler at their defaults");
    int mpi_initialized = 0, mpi_finalized = 0;
    MPI_Initialized(&mpi_initialized);
    MPI_Finalized(&mpi_finalized);
    if (!mpi_initialized || mpi_finalized)
        return tsl_error(NULL, TSL_ERR_STATE, "tsl_context_attach: MPI is not running");
    if (comm == MPI_COMM_NULL)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "tsl_context_attach: comm is MPI_COMM_NULL");
    if (!starpu_is_initialized())
        return tsl_error(NULL, TSL_ERR_STATE,
                         "tsl_context_attach: StarPU is not running; start StarPU and "
                         "StarPU-MPI first, or use tsl_context_create()");
    int comm_size = 1, provided = 0;
    MPI_Comm_size(comm, &comm_size);
    MPI_Query_thread(&provided);
    if (comm_size > 1 && provided < MPI_THREAD_MULTIPLE)
        return tsl_error(NULL, TSL_ERR_STATE,
                         "tsl_context_attach: MPI thread level %d; tessel needs "
                         "MPI_THREAD_MULTIPLE on a communicator of more than one rank",
                         provided);
    struct tsl_context *ctx;
    st = context_alloc(config, &ctx);
    if (st)
        return st;
    st = context_bind_comm(ctx, comm);
    if (st) {
        context_free(ctx);
        return st;
    }
    *out = ctx;
    return TSL_OK;
}

tsl_status tsl_context_wait(tsl_context_t ctx)
{
    if (!ctx)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "tsl_context_wait: ctx is NULL");
    pthread_mutex_lock(&ctx->pending_lock);
    while (ctx->pending_tasks > 0)
        pthread_cond_wait(&ctx->pending_done, &ctx->pending_lock);
    pthread_mutex_unlock(&ctx->pending_lock);
    if (MPI_Barrier(ctx->ctl_comm) != MPI_SUCCESS)
        return tsl_error(ctx, TSL_ERR_RUNTIME, "tsl_context_wait: MPI_Barrier failed");
    return TSL_OK;
}

/* starpu_mpi_shutdown(), without the statistics StarPU-MPI prints to stderr at shutdown when
 * tessel turned its byte counts on for the caller (who reads them through
 * tsl_context_comm_bytes()): stderr goes to a temporary file meanwhile, and every other line
 * StarPU writes there is passed on. Below the info log level only; the user's own
 * STARPU_COMM_STATS keeps StarPU's print. */
static void mpi_shutdown(struct tsl_context *ctx)
{
    FILE *held = ctx->own_comm_stats && ctx->log_level < TSL_LOG_INFO ? tmpfile() : NULL;
    int saved = -1;
    fflush(stderr);
    if (held && (saved = dup(STDERR_FILENO)) >= 0 && dup2(fileno(held), STDERR_FILENO) < 0) {
        close(saved);
        saved = -1;
    }
    starpu_mpi_shutdown();
    if (saved >= 0) {
        fflush(stderr);
        dup2(saved, STDERR_FILENO);
        close(saved);
        rewind(held);
        char line[1024];
        while (fgets(line, sizeof line, held))
            if (strncmp(line, "[starpu_comm_stats]", 19) != 0)
                fputs(line, stderr);
    }
    if (held)
        fclose(held);
}

tsl_status tsl_context_destroy(tsl_context_t ctx)
{
    if (!ctx)
        return TSL_OK;
    if (ctx->ntensors > 0)
        tsl_log(ctx, TSL_LOG_WARN, "tsl_context_destroy: %lld tensors still alive, destroying them",
                (long long)ctx->ntensors);
    while (ctx->ntensors > 0)
        tsl_tensor_destroy(ctx->tensors[ctx->ntensors - 1]);
    tsl_status st = tsl_context_wait(ctx);
    tsl_cuda_handles_release();
    if (ctx->ctl_comm != MPI_COMM_NULL)
        MPI_Comm_free(&ctx->ctl_comm);
    if (ctx->owns_runtime) {
        if (ctx->idle_hook >= 0)
            starpu_idle_hook_deregister(ctx->idle_hook);
        mpi_shutdown(ctx);
        tsl_host_cache_stats cs;
        tsl_host_cache_uninstall(&cs);
        tsl_log(ctx, TSL_LOG_DEBUG,
                "host cache: %lld buffers allocated, %lld reused, %lld given back early, at "
                "most %.1f MiB kept, at most %.1f MiB in use",
                (long long)cs.allocated, (long long)cs.reused, (long long)cs.evicted,
                cs.most_cached / 1048576.0, cs.high_water / 1048576.0);
        if (ctx->finalize_mpi)
            MPI_Finalize();
    }
    tsl_codelet_rank = -1;
    context_free(ctx);
    return st;
}
