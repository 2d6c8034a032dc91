/**
 * @file context.h
 * @brief The tessel context: StarPU and StarPU-MPI, owned or attached.
 *
 * A context either owns the runtime (tsl_context_create() initialises MPI when needed,
 * StarPU and StarPU-MPI, and tsl_context_destroy() shuts them down) or attaches to a
 * runtime that a host application already started (tsl_context_attach() in
 * tessel/starpu.h). Every tensor and every operation belongs to one context.
 *
 * All calls that take a context are collective unless said otherwise: every rank of
 * the context's communicator makes them in the same order with the same arguments.
 */
#ifndef TESSEL_CONTEXT_H
#define TESSEL_CONTEXT_H

#include <stddef.h>
#include <stdint.h>

#include "tessel/export.h"
#include "tessel/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Opaque context handle. */
typedef struct tsl_context *tsl_context_t;

/** Kinds of StarPU workers. */
typedef enum tsl_worker_kind {
    TSL_WORKER_CPU = 0,
    TSL_WORKER_CUDA = 1,
    TSL_WORKER_ANY = 2, /**< all workers, whatever their kind */
} tsl_worker_kind;

/** tsl_context_config::host_cache_bytes: a limit chosen from the node's memory. */
#define TSL_HOST_CACHE_AUTO (-1)

/** Configuration of a context; initialise with tsl_context_config_init(). */
typedef struct tsl_context_config {
    /** CPU workers per rank; -1 lets StarPU decide (STARPU_NCPU, or the core count). */
    int32_t ncpu;
    /** CUDA workers per rank; -1 lets StarPU decide, 0 disables CUDA. */
    int32_t ncuda;
    /** StarPU scheduler name ("lws", "prio", "dmdas", ...); NULL keeps StarPU's choice
     *  (STARPU_SCHED, or StarPU's default). Copied by the context. */
    const char *scheduler;
    /** First StarPU-MPI data tag the context may use. */
    int64_t tag_base;
    /** Number of StarPU-MPI data tags the context may use, from tag_base on. */
    int64_t tag_count;
    /** Messages at or above this severity are logged (default ::TSL_LOG_WARN). */
    tsl_log_level log_level;
    /** Log callback; NULL writes "tessel[rank] level: message" lines to stderr. */
    tsl_log_fn log_fn;
    /** Pointer handed back to log_fn. */
    void *log_user;
    /** Non-zero: StarPU-MPI counts the bytes it sends (tsl_context_comm_bytes()); sets
     *  STARPU_COMM_STATS=1 before StarPU-MPI starts. The totals StarPU-MPI then prints at
     *  shutdown are left out below the info log level (the caller reads the counts); with the
     *  variable set by hand they stay. Default 0. */
    int32_t comm_stats;
    /** Bytes of freed main-memory buffers kept for reuse (tsl_context_create() only): StarPU
     *  frees an activation or gradient tile when the backward releases it and allocates it
     *  again the next step; a kept buffer spares the page faults of fresh memory. Blocks over
     *  a quarter of this are never kept, and the kept blocks plus those in use never exceed the
     *  most ever in use at once by more than that quarter (a new block first gives kept ones
     *  back), so a rank's peak grows by at most a quarter of this. A
     *  data-parallel run with large weights gains from a limit of a few times its gradient
     *  bytes: a gradient reduction cuts, receives and frees pieces of the same sizes every
     *  step (bench/RESULTS.md). 0 keeps none. Default ::TSL_HOST_CACHE_AUTO: an eighth of
     *  this rank's share of its node's memory (the node's memory, or its cgroup's limit when
     *  lower, divided by the ranks on the node), between 32 MiB and 1 GiB, so the peak grows
     *  by at most 1/32 of the share. An application that owns StarPU
     * (tsl_context_attach()) keeps its own allocator. */
    int64_t host_cache_bytes;
    /** Non-zero (default): waiting threads give their core to other runnable threads instead
     *  of spinning (tsl_context_create() only). An idle CPU worker calls sched_yield() from a
     *  StarPU idle hook, and Open MPI is asked to yield in its polling
     *  (OMPI_MCA_mpi_yield_when_idle=1, set only where tessel initialises MPI and the variable
     *  is unset). Where a rank's threads (workers, StarPU-MPI thread, main thread) outnumber
     *  its cores, spinning keeps the thread that would make progress off the core for a
     *  scheduler time slice at every hop: a 1 MiB gradient reduction over 4 ranks on 2 cores
     *  takes 2-6 ms with it and 64-70 ms without (bench/RESULTS.md). Where every thread has a
     *  core of its own it costs a system call per idle poll. 0 keeps StarPU's and the MPI
     *  library's spinning. */
    int32_t yield_when_idle;
} tsl_context_config;

/** @brief Fill @p config with defaults: StarPU decides workers and scheduler,
 *  tags [2^40, 2^40 + 2^40), warnings and errors logged to stderr, 32 MiB host cache,
 *  waiting threads yield their core. */
TSL_API tsl_status tsl_context_config_init(tsl_context_config *config);

/**
 * @brief Create a context that owns StarPU and StarPU-MPI on MPI_COMM_WORLD.
 *
 * Initialises MPI (with MPI_THREAD_MULTIPLE) if it is not initialised yet, then StarPU
 * and StarPU-MPI, and sets OpenBLAS to one thread (tasks run one per core). Fails with
 * ::TSL_ERR_STATE if StarPU is already running in this process (attach to it instead) or if MPI was
 * already finalised.
 *
 * @param[out] ctx    the new context, owned by the caller (tsl_context_destroy())
 * @param[in]  config configuration, or NULL for the defaults
 */
TSL_API tsl_status tsl_context_create(tsl_context_t *ctx, const tsl_context_config *config);

/**
 * @brief Destroy a context. Waits for the context's outstanding work; for an owning
 * context, shuts StarPU-MPI and StarPU down, and finalises MPI if the context
 * initialised it. Tensors still alive are destroyed first (with a warning).
 * An attached context leaves StarPU and MPI running. Passing NULL is a no-op.
 */
TSL_API tsl_status tsl_context_destroy(tsl_context_t ctx);

/** @brief This process's rank in the context's communicator. Not collective. */
TSL_API tsl_status tsl_context_rank(tsl_context_t ctx, int32_t *rank);

/** @brief Number of ranks in the context's communicator. Not collective. */
TSL_API tsl_status tsl_context_size(tsl_context_t ctx, int32_t *size);

/** @brief Number of StarPU workers of one kind on this rank. Not collective. */
TSL_API tsl_status tsl_context_worker_count(tsl_context_t ctx, tsl_worker_kind kind,
                                            int32_t *count);

/** @brief The node's sharing of cores: where its ranks outnumber its cores, tessel binds local
 *  rank l's workers and StarPU-MPI thread to core l mod cores, and the ranks of a core take
 *  turns on it; then *node_ranks is the node's rank count and *node_cores its cores, else both
 *  0 (a core or more per rank, or binding left to StarPU). Not collective. */
TSL_API tsl_status tsl_context_core_sharing(tsl_context_t ctx, int32_t *node_ranks,
                                            int32_t *node_cores);

/** @brief Whether the context owns StarPU (1) or is attached to a host's StarPU (0). */
TSL_API tsl_status tsl_context_owns_runtime(tsl_context_t ctx, int32_t *owns);

/** @brief Name of the StarPU scheduler in use ("lws", "dmdas", ...). Not collective.
 *  @param[out] name static string owned by StarPU */
TSL_API tsl_status tsl_context_scheduler(tsl_context_t ctx, const char **name);

/**
 * @brief Bytes of the tiles this rank owns, over all live tensors of the context (not
 * counting StarPU-MPI's cached copies of remote tiles): tessel's allocations, plus the size
 * of every transient tile (a model's activations and gradients, which StarPU allocates when
 * first written and frees when the backward is done with them), allocated or not.
 * Not collective.
 */
TSL_API tsl_status tsl_context_owned_bytes(tsl_context_t ctx, int64_t *bytes);

/**
 * @brief Worker time on this rank since the previous call (or since StarPU started
 * profiling): the seconds this rank's workers spent executing tasks and the seconds they
 * existed, summed over workers; 1 - executing / total is the time they waited (for data,
 * halos, dependencies). The first call switches StarPU's profiling on (then it only starts
 * measuring). Not collective.
 */
TSL_API tsl_status tsl_context_worker_seconds(tsl_context_t ctx, double *executing, double *total);

/** @brief What this rank's workers of each kind did: tasks, seconds executing and seconds
 *  existing, indexed by tsl_worker_kind (TSL_WORKER_CPU, TSL_WORKER_CUDA). */
typedef struct tsl_worker_stats {
    int64_t tasks[2];
    double executing[2], total[2];
} tsl_worker_stats;

/**
 * @brief tsl_context_worker_seconds() by kind of worker, with the tasks each kind executed:
 * where the scheduler put the work (CPU and CUDA workers). Since the previous call of either
 * (they read and restart the same counters); the first call switches StarPU's profiling on
 * and gives zeros. Not collective.
 */
TSL_API tsl_status tsl_context_worker_stats(tsl_context_t ctx, tsl_worker_stats *stats);

/**
 * @brief Bytes StarPU-MPI has sent from this rank and received by it since it started (data
 * transfers between ranks: tiles, halo slabs, partial sums). Collective (the received
 * counts are the other ranks' sent counts). Needs communication statistics
 * (tsl_context_config::comm_stats or STARPU_COMM_STATS=1), else ::TSL_ERR_STATE. Take the
 * difference of two calls around tsl_context_wait() to measure a piece of work.
 */
TSL_API tsl_status tsl_context_comm_bytes(tsl_context_t ctx, int64_t *sent, int64_t *received);

/**
 * @brief This rank's cache of freed main-memory buffers (tsl_context_config::host_cache_bytes):
 * bytes it keeps now, and since the context started the buffers it handed out again and
 * those it had to allocate. With a limit of 0 it keeps and reuses none; zeros for an attached
 * context. Not collective.
 */
TSL_API tsl_status tsl_context_host_cache(tsl_context_t ctx, int64_t *kept_bytes, int64_t *reused,
                                          int64_t *allocated);

/**
 * @brief Bytes of StarPU's main-memory data buffers on this rank: held now (@p in_use) and the
 * most held at once since the context started (@p most). They are the memory of every tile
 * this rank holds, whether tessel allocated it or StarPU did when a task first wrote it
 * (activations, gradients), of halo slabs, of copies of other ranks' tiles that StarPU-MPI
 * received, and of reduction pieces; not the freed blocks the host cache keeps, nor the
 * libraries' own memory (oneDNN scratch, MPI buffers). So @p most is a rank's measured peak of
 * training data, which tsl_plan_estimate_peak() estimates beforehand and the process's peak
 * resident memory adds the runtime to. Counted only by a context that owns StarPU
 * (tsl_context_create()); an attached context gets ::TSL_ERR_UNSUPPORTED. Not collective.
 */
TSL_API tsl_status tsl_context_buffer_bytes(tsl_context_t ctx, int64_t *in_use, int64_t *most);

/**
 * @brief Bytes of other ranks' data that StarPU-MPI keeps in its cache on this rank: copies
 * of remote tiles and halo slabs that tessel's tasks on this rank read, each from the
 * submission of its first reader here to its flush after the last (or until its owner writes
 * it again). @p now: held at the moment; @p most: the most held at once since the previous
 * call (or the context's start), which the call starts counting again from @p now. Counted
 * as StarPU-MPI's cache table holds them, in submission order: a copy counts from the
 * submission of its first reader, before its bytes arrive, and stops at its flush, which may
 * come before its last reader has run; the bytes themselves are among the buffers
 * (tsl_context_buffer_bytes). 0 where StarPU-MPI's cache is off (STARPU_MPI_CACHE=0: copies
 * are dropped after use). Not collective.
 */
TSL_API tsl_status tsl_context_cached_bytes(tsl_context_t ctx, int64_t *now, int64_t *most);

/** @brief Number of StarPU-MPI tags the context has handed out so far. Not collective. */
TSL_API tsl_status tsl_context_tags_used(tsl_context_t ctx, int64_t *used);

/** @brief Change the log level. Not collective. */
TSL_API tsl_status tsl_context_set_log_level(tsl_context_t ctx, tsl_log_level level);

/**
 * @brief Starts a task trace: every tile task this context runs on this rank from now on is
 * recorded when it ends, with its name (the codelet's), the layer and pass of the model step
 * that submitted it (forward, backward, loss, update; none for other calls), the worker that
 * ran it, and its start and end (StarPU's profiling interface, which this call turns on). At
 * most @p max_events tasks a rank are kept; later ones are only counted. Every task submitted
 * (here or on another rank) is noted too with the tiles it reads and writes, up to
 * @p max_events of them, for tsl_context_trace_critical_path(). Collective: it waits
 * for the tasks already submitted and the ranks leave a barrier together, whose moment is the
 * trace's time 0 on every rank. A trace already on is dropped. ::TSL_ERR_INVALID_ARG for
 * @p max_events outside [1, 2^40].
 */
TSL_API tsl_status tsl_context_trace_begin(tsl_context_t ctx, int64_t max_events);

/**
 * @brief Ends the trace begun by tsl_context_trace_begin() and writes every rank's tasks to
 * @p path on rank 0 (other ranks' @p path is not read) as one Chrome/Perfetto trace-event JSON
 * file: an "X" event per task (name, "cat" the pass, "ts" and "dur" in microseconds, "pid" the
 * rank, "tid" the worker, "args" the layer), the ranks and workers named by metadata events, and
 * "otherData" with the rank count and the events dropped over the limit. Open it in
 * https://ui.perfetto.dev or chrome://tracing. Collective; it waits for the context's tasks.
 * ::TSL_ERR_INVALID_ARG when some rank has no trace on (or rank 0 no path), ::TSL_ERR_IO when
 * the file cannot be written, on every rank; the trace is over either way.
 */
TSL_API tsl_status tsl_context_trace_write(tsl_context_t ctx, const char *path);

/**
 * @brief While a trace is on (tsl_context_trace_begin()), the critical path of the traced
 * tasks: with unlimited workers and free messages, each task starting once the tasks it
 * depends on (StarPU's sequential consistency on every tile it reads or writes, across all
 * ranks) have ended and lasting as long as it did, the time the last one ends (@p critical_s),
 * and the sum of every rank's task times (@p task_s); their ratio is the parallelism the
 * submitted work exposes. Collective; it waits for the context's tasks and leaves the trace on.
 * The trace keeps every submitted task's tiles for this, up to the max_events of
 * tsl_context_trace_begin().
 * ::TSL_ERR_INVALID_ARG when some rank has no trace on, ::TSL_ERR_OUT_OF_MEMORY when memory ran
 * out or more tasks than the trace's limit were submitted or run, ::TSL_ERR_STATE when the ranks
 * submitted different tasks (every rank must submit every task, as StarPU-MPI requires); on every
 * rank.
 */
TSL_API tsl_status tsl_context_trace_critical_path(tsl_context_t ctx, double *critical_s,
                                                   double *task_s);

/** @brief Message of the last error raised on this context, or "" if none.
 *  Valid until the next failing call on the context. Not collective. */
TSL_API const char *tsl_context_last_error(tsl_context_t ctx);

/**
 * @brief Wait until every task tessel submitted on this context has completed on all
 * ranks, then synchronise the ranks. On an attached context this waits only for
 * tessel's own tasks, never for the host's.
 */
TSL_API tsl_status tsl_context_wait(tsl_context_t ctx);

#ifdef __cplusplus
}
#endif

#endif /* TESSEL_CONTEXT_H */
