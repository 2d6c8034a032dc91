/* Internal declarations shared by src/: context and tensor structs, errors, logging,
 * tag allocation and the tile-task helper. Never installed. */
#ifndef TESSEL_SRC_INTERNAL_H
#define TESSEL_SRC_INTERNAL_H

#include <mpi.h>
#include <pthread.h>
#include <starpu.h>
#include <starpu_mpi.h>

#include "error.h"
#include "task_where.h"
#include "tessel/context.h"
#include "tessel/io.h"
#include "tessel/ops.h"
#include "tessel/tensor.h"

struct tsl_tensor;

/* Dataset reads submitted on this rank and not run yet, and the first that failed inside its
 * task (io.c). Under the context's pending_lock; pending_done is broadcast when `pending`
 * reaches 0. */
typedef struct tsl_read_group {
    int64_t pending;
    tsl_status status;
    char error[TSL_ERROR_MAX];
} tsl_read_group;

struct tsl_context {
    int owns_runtime;     /* initialised StarPU + StarPU-MPI, shuts them down */
    int finalize_mpi;     /* initialised MPI, finalises it */
    int own_comm_stats;   /* turned StarPU-MPI's byte counts on itself (not the user's variable) */
    int idle_hook;        /* StarPU idle hook that yields the core (tsl_context_create), or -1 */
    int yield_after_task; /* workers yield after each task (task.c: task_done) */
    int node_ranks, node_cores; /* ranks outnumbering cores on the node: both, else 0
                                   (tsl_context_core_sharing) */
    MPI_Comm comm;              /* StarPU-MPI transfers (WORLD when owning, the host's otherwise) */
    MPI_Comm ctl_comm;          /* duplicate for tessel's own control messages (bcast, barrier) */
    int rank;
    int size;
    char *scheduler;
    int64_t tag_base;
    int64_t tag_count;
    int64_t tags_used;
    int64_t owned_bytes;
    tsl_log_level log_level;
    tsl_log_fn log_fn;
    void *log_user;
    char last_error[TSL_ERROR_MAX];

    /* Tasks submitted on this rank and not finished yet: tsl_context_wait() waits on
     * this counter, never on StarPU's global task list (DESIGN rule 9). */
    pthread_mutex_t pending_lock;
    pthread_cond_t pending_done;
    int64_t pending_tasks;

    /* Dataset reads (tsl_tensors_read_samples) into the caller's tensors, reported by
     * tsl_context_check_reads(); a model's read-ahead has groups of its own. */
    tsl_read_group reads;

    /* Other ranks' data StarPU-MPI keeps in its cache on this rank (tsl_context_cached_bytes):
     * the handles tessel's tasks made it receive, their bytes, the most at once since the
     * last query. Under cache_lock. */
    pthread_mutex_t cache_lock;
    starpu_data_handle_t *cached;
    int64_t *cached_size;
    int64_t ncached, cached_cap, cached_now, cached_most;

    /* Where the tile tasks submitted from now on may run (task_where.h); read by
     * tsl_task_submit() on the submitting thread. */
    tsl_task_where task_where;
    int task_priority; /* what tasks without a priority of their own get (MGRIT's coarse levels) */
    /* What the tasks making partial parameter gradients get while it is set (0: as the others):
     * TSL_DEFERRED_PRIORITY in a later pipeline stage's backward (tsl_param_grads_begin()). */
    int param_grad_priority;
    /* The task trace being recorded (src/trace.c), or NULL. */
    struct tsl_trace *trace;

    /* Live tensors, destroyed with the context if the user forgot them. */
    struct tsl_tensor **tensors;
    int64_t ntensors;
    int64_t tensors_cap;
};

struct tsl_tensor {
    struct tsl_context *ctx;
    tsl_dtype dtype;
    tsl_layout layout; /* storage order inside each tile */
    size_t elem_size;
    tsl_shape shape;
    tsl_tile_grid grid;
    tsl_owner_map owners;
    int64_t ntiles;
    int32_t *tile_owner;           /* [ntiles] */
    starpu_data_handle_t *handles; /* [ntiles] */
    void **tile_memory;            /* [ntiles]: allocated by tessel for owned tiles */
    int64_t owned_bytes;
    /* A tensor cut into shards that tasks read whole (a sharded weight): per rank of its
     * owners' rank group (all ranks without one), a one-tile copy owned by that rank
     * (tsl_tensor_make_replicas); NULL otherwise and for ranks outside the group. */
    struct tsl_tensor **replicas; /* [ctx->size] */
    /* A parameter gradient whose partials travel packed (tsl_bucket_create): its bucket and
     * place there; NULL otherwise. */
    struct tsl_bucket *bucket;
    int32_t bucket_member;
    int transient; /* StarPU allocates the owned tiles (tsl_tensor_create_transient) */
};

/* Small gradients reduced together (bucket.c): every rank packs its partials of the members
 * into one buffer, the buffers meet by a tree rooted at the owner, and the sum is cut into
 * the members there. One set of partials per member and step. */
struct tsl_bucket {
    struct tsl_context *ctx;
    int32_t owner;
    int32_t n;                  /* members */
    struct tsl_tensor **grads;  /* [n]: one-tile f32 tensors owned by `owner` */
    int64_t *offset;            /* [n + 1]: each member's first element in a pack */
    starpu_data_handle_t *pack; /* [ctx->size]: this step's packed partials per rank */
    uint8_t *added;             /* [n]: whose partials this step has */
    int32_t nadded;
};

/* Make a bucket of `grads` (sets their `bucket`); destroy drops it (and unsets them). */
tsl_status tsl_bucket_create(struct tsl_context *ctx, int32_t n, struct tsl_tensor **grads,
                             struct tsl_bucket **out);
void tsl_bucket_destroy(struct tsl_bucket *b);

/* Add member's partials (partials[i] on rank owner_of[i], each the member's numel; the caller
 * still owns and releases them) into the ranks' packs; the last member's call reduces. */
tsl_status tsl_bucket_add(struct tsl_bucket *b, int32_t member, int64_t n,
                          const starpu_data_handle_t *partials, const int32_t *owner_of);

/* Sum the packs onto the owner and cut the sum into the members given this step (the others
 * are left as they are); the bucket is then empty for the next step. */
tsl_status tsl_bucket_reduce(struct tsl_bucket *b);

/* tsl_bucket_reduce() if any member was given this step (a step where some member's loss
 * path was cut). */
tsl_status tsl_bucket_finish(struct tsl_bucket *b);

/* tsl_tensor_scatter of i64 labels into a u8, i32 or i64 tensor: narrowed on the way, a value
 * the tensor's type cannot hold becoming an invalid label (255 or -1) that the loss counts. */
tsl_status tsl_tensor_scatter_labels(tsl_tensor_t t, int32_t root, const int64_t *src);

/* dst = alpha a + b, as tsl_tensor_add() (alpha 1) does a + b: a residual step of size alpha. */
tsl_status tsl_tensor_add_scaled(tsl_tensor_t dst, double alpha, tsl_tensor_t a, tsl_tensor_t b);

/* dst = x / (1 - p) where u >= p, else 0 (dropout: u the f32 uniform draws; dst may be x). Same
 * shape, tile grid and layout, all f32. */
tsl_status tsl_dropout_apply(tsl_tensor_t dst, tsl_tensor_t x, tsl_tensor_t u, double p);

/* Like tsl_tensor_create_layout(), but StarPU allocates each owned tile when a task first
 * writes it (the tile has no value before), and tsl_tensor_release() gives it back. */
tsl_status tsl_tensor_create_transient(struct tsl_tensor **out, struct tsl_context *ctx,
                                       tsl_dtype dtype, const tsl_shape *shape,
                                       const tsl_tile_grid *grid, const tsl_owner_map *owners,
                                       tsl_layout layout);

/* Drop t's value once the tasks submitted so far that use it have run: remote copies are
 * flushed and the owned tiles invalidated, so a transient tensor's memory goes back to
 * StarPU. The next task touching a tile must write it whole. */
void tsl_tensor_release(struct tsl_tensor *t);

/* Mark t's tiles so that the tasks writing them run in sample-tile order on each rank: a task
 * whose first written handle is tile (n, ...) of t gets priority -n (tsl_task_submit), so a
 * rank finishes micro-batch 0 through the layers before micro-batch 1 and the next pipeline
 * stage can start on it. */
void tsl_tensor_order_by_samples(struct tsl_tensor *t);

/* Give `t` (several tiles) a whole copy on every rank of its owners' group (every rank
 * without one), owned by the tensor, not tracked. */
tsl_status tsl_tensor_make_replicas(struct tsl_tensor *t);

/* The same for any `t` (one tile too) on ranks first .. first + count - 1. */
tsl_status tsl_tensor_make_replicas_on(struct tsl_tensor *t, int32_t first, int32_t count);

/* Submit the copies of t's tiles into every rank's replica (allgather by placement: rank r's
 * tasks read the tiles other ranks own). A one-tile tensor's replicas are better refreshed
 * together with others of its owner (tsl_tensors_redistribute). */
tsl_status tsl_tensor_sync_replicas(struct tsl_tensor *t);

/* FNV-1a (64-bit) of n bytes, continuing from h (start from TSL_FNV1A_START): the digests
 * ranks compare to agree that they read the same samples or submitted the same tasks. */
#define TSL_FNV1A_START 0xcbf29ce484222325ULL
static inline uint64_t tsl_fnv1a(uint64_t h, const void *bytes, size_t n)
{
    const unsigned char *p = (const unsigned char *)bytes;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 0x100000001b3ULL;
    return h;
}

/* Whether tasks can read `t` whole: one tile, or replicas. */
static inline int tsl_tensor_whole(const struct tsl_tensor *t)
{
    return t->ntiles == 1 || t->replicas != NULL;
}

/* The handle of t's whole value that a task running on `rank` reads: its one tile, or that
 * rank's replica; a rank outside the replicas' group (a task of another pipeline stage, such
 * as the input gradient of a stage's first convolution) reads the one tile or a group rank's
 * replica, which StarPU-MPI moves. */
static inline starpu_data_handle_t tsl_whole_handle(const struct tsl_tensor *t, int32_t rank)
{
    if (!t->replicas)
        return t->handles[0];
    if (t->replicas[rank])
        return t->replicas[rank]->handles[0];
    if (t->ntiles == 1)
        return t->handles[0];
    return t->replicas[t->owners.first_rank + rank % t->owners.group_size]->handles[0];
}

/* Drop the cached remote copies of t's whole value once its readers are submitted (replicas
 * are read remotely only by ranks outside their group). */
void tsl_whole_flush(const struct tsl_tensor *t);

/* ---- context (context.c, context_query.c) ---- */

/* Next StarPU-MPI data tag of the context's range; TSL_ERR_RESOURCE when exhausted.
 * Collective in effect: every rank allocates tags in the same order. */
tsl_status tsl_context_next_tag(struct tsl_context *ctx, int64_t *tag);

void tsl_context_track_tensor(struct tsl_context *ctx, struct tsl_tensor *tensor);
void tsl_context_untrack_tensor(struct tsl_context *ctx, struct tsl_tensor *tensor);

/* Collective: TSL_OK on every rank when every rank passes TSL_OK; otherwise the status and
 * message of the lowest rank that failed, on every rank. */
tsl_status tsl_context_agree_all(struct tsl_context *ctx, tsl_status status);

/* Agree on a status across ranks: every rank returns the status of `root` and, when it is
 * an error, root's message. Used after a step only root can do (file I/O). */
tsl_status tsl_context_agree(struct tsl_context *ctx, int root, tsl_status status);

/* ---- tile tasks (task.c) ---- */

/* Gradient reduction tasks run ahead of the rest of backward where the scheduler has
 * priorities (DESIGN rule 3). */
#define TSL_REDUCE_PRIORITY 1

/* Below every sample-ordered priority (tsl_tensor_order_by_samples): tasks nothing waits for
 * before the step's end, run where a worker has nothing else ready. A later pipeline stage's
 * backward gives it to its first layer's weights' gradients (tsl_graph_defers_weights()), so
 * the input gradient the stage before waits for leaves first and that work overlaps the stage
 * before's backward. */
#define TSL_DEFERRED_PRIORITY (-(1 << 20))

/* Around the submission of partial parameter-gradient tasks: from here they get
 * ctx->param_grad_priority where it is set; returns what tsl_param_grads_end() restores. (The
 * trees adding the partials keep TSL_REDUCE_PRIORITY: they free the temporaries.) */
static inline int tsl_param_grads_begin(struct tsl_context *ctx)
{
    int saved = ctx->task_priority;
    if (ctx->param_grad_priority)
        ctx->task_priority = ctx->param_grad_priority;
    return saved;
}

static inline void tsl_param_grads_end(struct tsl_context *ctx, int saved)
{
    ctx->task_priority = saved;
}

#define TSL_TASK_MAX_HANDLES 32 /* a windowed convolution: tile, 26 halo slabs, w, b, y */

/* One tile task: the codelet, a small argument struct copied into the task, the handles
 * with their access modes, the flop count for STARPU_FLOPS, and a priority. */
typedef struct tsl_task_desc {
    struct starpu_codelet *codelet;
    const void *args;
    size_t args_size;
    int nhandles;
    starpu_data_handle_t handles[TSL_TASK_MAX_HANDLES];
    enum starpu_data_access_mode modes[TSL_TASK_MAX_HANDLES];
    double flops;
    int priority;
    const char *name;
} tsl_task_desc;

/* Count one more asynchronous operation of this rank that tsl_context_wait() waits for; the
 * operation's completion callback is tsl_pending_done(ctx). */
void tsl_pending_add(struct tsl_context *ctx);
void tsl_pending_done(void *ctx);

/* tsl_tensors_read_samples() with the reads counted in `group` (io.c). */
tsl_status tsl_read_samples_grouped(tsl_tensor_t x, tsl_tensor_t labels, tsl_dataset_t dataset,
                                    const int64_t *indices, tsl_read_group *group);
/* tsl_read_samples_grouped() of x's tiles from the dataset's further input `input`
 * (tsl_dataset_read_input_box()). */
tsl_status tsl_read_input_samples_grouped(tsl_tensor_t x, tsl_dataset_t dataset, const char *input,
                                          const int64_t *indices, tsl_read_group *group);
/* Waits for the group's reads on this rank (not collective). */
void tsl_read_group_wait(struct tsl_context *ctx, tsl_read_group *group);
/* Waits for the group's reads, takes its first failure (the group is clean after) and agrees
 * on it with every rank, as tsl_context_check_reads() does for the context's group.
 * Collective. */
tsl_status tsl_read_group_check(struct tsl_context *ctx, tsl_read_group *group);
/* What a tile task's completion callback does (src/task.c): tsl_pending_done(), after yielding
 * the core when the context asks. */
void tsl_task_finished(struct tsl_context *ctx);
/* Whether StarPU-MPI counts the bytes it sends (STARPU_COMM_STATS set positive before StarPU
 * started: tsl_context_config.comm_stats sets it). */
int tsl_comm_stats_on(void);

/* Views of a vector handle (StarPU asynchronous partitioning): `n` consecutive pieces of
 * lengths[i] elements each, usable by what is submitted after tsl_views_begin() until
 * tsl_views_end() gathers them back (no copy: they share the handle's memory) and frees
 * them. tsl_views_enabled() is 0 when TSL_GATHER_COPIES is set in the environment (the
 * copying paths, for comparison). */
int tsl_views_enabled(void);
void tsl_views_begin(starpu_data_handle_t whole, int64_t n, uint32_t *lengths,
                     starpu_data_handle_t *views);
void tsl_views_end(starpu_data_handle_t whole, int64_t n, starpu_data_handle_t *views);

/* Submit a tile task with starpu_mpi_task_insert semantics: the owner of the written
 * handle runs it, StarPU-MPI moves what it reads. Counts it in ctx->pending_tasks. */
tsl_status tsl_task_submit(struct tsl_context *ctx, const tsl_task_desc *desc);

/* tsl_task_submit() of codelet `cl` with `args_size` bytes of arguments over n handles. */
tsl_status tsl_task_submit_handles(struct tsl_context *ctx, struct starpu_codelet *cl,
                                   const void *args, size_t args_size, int n,
                                   const starpu_data_handle_t *handles,
                                   const enum starpu_data_access_mode *modes, double flops);

/* One task per tile index over tensors that share a tile grid: tensors[k] is accessed with
 * modes[k] (each tensor once: pass an in-place operand once, RW). `args` is copied into
 * every task after writing the tile's element count at `count_offset` (an int64_t field).
 * The owner of the written tile runs the task; cached copies of read-only tiles owned
 * elsewhere are flushed once read. */
tsl_status tsl_submit_tiles(struct starpu_codelet *codelet, int ntensors,
                            struct tsl_tensor *const *tensors,
                            const enum starpu_data_access_mode *modes, void *args, size_t args_size,
                            size_t count_offset, double flops_per_element);

/* ---- exact reductions (reduce.c) ---- */

struct tsl_acc;

/* Submits the task of tile `tile` that writes accumulator handle `acc` (a tsl_acc). */
typedef tsl_status (*tsl_acc_fill_fn)(int64_t tile, starpu_data_handle_t acc, void *user);

/* Submit an exact reduction without waiting: per tile i a temporary handle of `accs`
 * accumulators owned by owner_of[i], written by fill(i); a tree of merge tasks; *result is
 * the merged handle (owned by owner_of[0]), for later tasks to read. The caller releases
 * it (tsl_temp_handle_release) after its last reader is submitted. */
tsl_status tsl_acc_tree_submit(struct tsl_context *ctx, int64_t ntiles, const int32_t *owner_of,
                               int64_t accs, tsl_acc_fill_fn fill, void *user,
                               starpu_data_handle_t *result);

/* The exact sum over `ntiles` accumulators (filled as in tsl_acc_tree_submit) on every rank r
 * with need[r]: totals[r] (ctx->size entries; NULL where not needed), identical on every rank,
 * to release (tsl_temp_handle_release) after their last reader. With few ranks holding tiles,
 * each rank's tiles are merged there and every needing rank merges the ranks' partials
 * itself, so the sum is one hop away from the tiles (a tree and a broadcast would be two). */
tsl_status tsl_acc_allreduce_submit(struct tsl_context *ctx, int64_t ntiles,
                                    const int32_t *owner_of, int64_t accs, tsl_acc_fill_fn fill,
                                    void *user, const uint8_t *need, starpu_data_handle_t *totals);

/* Exact reduction over `ntiles` accumulators, accumulator i owned by owner_of[i] and
 * written by fill(i); merged by a task tree; the result is copied to `out` on every rank.
 * Collective; waits for the result. */
tsl_status tsl_exact_reduce(struct tsl_context *ctx, int64_t ntiles, const int32_t *owner_of,
                            tsl_acc_fill_fn fill, void *user, struct tsl_acc *out);

/* Sum `count` temporary partial handles of `elements` values of `dtype` by a tree of
 * axpy tasks and copy the total into `target` (on target's owner). partials[0] may be
 * `target` itself (then the tree ends there, with no copy). Releases the temporaries. The
 * tasks get `priority`. */
tsl_status tsl_tree_sum_into(struct tsl_context *ctx, starpu_data_handle_t *partials, int64_t count,
                             tsl_dtype dtype, int64_t elements, starpu_data_handle_t target,
                             int priority);

/* The first i with owner_of[i] == owner, or -1. */
int64_t tsl_first_owned(const int32_t *owner_of, int64_t n, int32_t owner);

/* partials[] reordered into out[] so that entry 0 (a tree's root) is the first one whose
 * owner_of is `owner` (entry 0 if none): a tree then ends where its target lives. */
void tsl_rooted_order(const int32_t *owner_of, int64_t n, int32_t owner,
                      const starpu_data_handle_t *partials, starpu_data_handle_t *out);

/* Sum n partials (handle i owned by owner_of[i], each the whole of dst in C order, not
 * changed; f32) into dst, cut along its first dimension only: per dst tile, box-copy tasks
 * add each rank's pieces where they live (into the tile itself on its owner, else into one
 * temporary per rank), and a tree of axpy tasks rooted at the tile's owner adds the ranks'
 * sums (reduce-scatter by placement: one piece per rank crosses). Tasks get `priority`.
 * With `views` (the partials' memory is allocated: tessel's tiles, not StarPU's temporaries)
 * and at most one partial per rank, no piece is cut out: each partial is partitioned into
 * views that travel straight to the tiles' owners, which add them. */
tsl_status tsl_sum_into_tiles(struct tsl_context *ctx, int64_t n,
                              const starpu_data_handle_t *partials, const int32_t *owner_of,
                              struct tsl_tensor *dst, int priority, int views);

/* Submits the task of sample tile `tile` that writes the partial weight gradient `dw_part`
 * and, when not NULL, the partial bias gradient `db_part`. */
typedef tsl_status (*tsl_partial_grad_fn)(int64_t tile, starpu_data_handle_t dw_part,
                                          starpu_data_handle_t db_part, void *user);

/* Which of a one-tile gradient's partials (partial i made on owner_of[i]) may be the
 * gradient's own tile, rooting its tree: the first on its owner, or -1 (none: in a bucket). */
int64_t tsl_grad_root(const struct tsl_tensor *g, const int32_t *owner_of, int64_t n);

/* Sum a one-tile gradient's partials into it, with high priority: through its bucket, or a
 * tree rooted at its owner (the tsl_grad_root() partial first). Releases the temporaries. */
tsl_status tsl_grad_sum(struct tsl_tensor *g, int64_t n, starpu_data_handle_t *partials,
                        const int32_t *owner_of);

/* Parameter gradients of an op tiled along samples: one partial per tile of x / dy, summed
 * into dw (and db, when not NULL) by task trees (src/lower/param_grads.c). A dw cut into
 * shards gets each shard's tree rooted at the shard's owner (reduce-scatter by placement). */
tsl_status tsl_param_gradients(struct tsl_tensor *x, struct tsl_tensor *dy, struct tsl_tensor *dw,
                               struct tsl_tensor *db, tsl_partial_grad_fn submit_partial,
                               void *user);

/* Writes the arguments of sample tile `tile` into `args`; returns the tile's flop count. */
typedef double (*tsl_tile_args_fn)(int64_t tile, void *args, void *user);

/* Forward of a sample-tiled op with parameters: per tile of x (and y, tiled alike), one task
 * reading x, w (whole: tsl_whole_handle) and b (one tile, or NULL) and writing y (reading it
 * too with `accumulate`: the codelet adds), with the arguments `fill` writes into `args`
 * (src/lower/param_grads.c). */
tsl_status tsl_weighted_forward(struct starpu_codelet *codelet, struct tsl_tensor *x,
                                struct tsl_tensor *w, struct tsl_tensor *b, struct tsl_tensor *y,
                                int accumulate, void *args, size_t args_size, tsl_tile_args_fn fill,
                                void *user);

/* starpu_mpi_cache_flush() of a handle, and the handle leaves tessel's count of the cache
 * (tsl_context_cached_bytes). Every flush of a tessel handle goes through it; a handle is
 * flushed before it is unregistered. */
void tsl_cache_flush(struct tsl_context *ctx, starpu_data_handle_t handle);

/* Register a temporary handle of `count` elements owned by `owner`, with no memory yet
 * (StarPU allocates it where a task first needs it). */
tsl_status tsl_temp_handle_register(struct tsl_context *ctx, int64_t count, size_t elem_size,
                                    int owner, starpu_data_handle_t *handle);

/* Drop a temporary handle once its last task is submitted: flushes StarPU-MPI's cached
 * copies and unregisters it asynchronously. */
void tsl_temp_handle_release(struct tsl_context *ctx, starpu_data_handle_t handle);

/* ---- tensors (tensor.c; region copies and redistribution: tensor_move.c) ---- */

/* Validate a tensor argument: non-NULL. */
tsl_status tsl_tensor_check(struct tsl_tensor *tensor, const char *what);

/* dtype is f32 or f64 (TSL_ERR_DTYPE otherwise). */
tsl_status tsl_tensor_check_float(struct tsl_tensor *t, const char *fn);

/* Same context, dtype, shape, tile grid and storage layout; owners may differ. */
tsl_status tsl_tensor_check_same_layout(struct tsl_tensor *a, struct tsl_tensor *b, const char *fn);

/* Tiles stored plain (TSL_ERR_UNSUPPORTED otherwise): for ops whose kernels index tiles in
 * N C D H W order. NULL passes (optional tensors are checked where they are used). */
tsl_status tsl_tensor_check_plain(struct tsl_tensor *t, const char *fn);

/* Global C-order strides of the tensor's shape, in elements. */
void tsl_shape_strides(const tsl_shape *shape, int64_t strides[TSL_MAX_DIMS]);

/* Start and extent of tile `index` along every dimension (unused dims: 0 and 1). */
void tsl_tensor_tile_box(const struct tsl_tensor *tensor, int64_t index,
                         int64_t start[TSL_MAX_DIMS], int64_t extent[TSL_MAX_DIMS]);

int64_t tsl_tensor_tile_numel(const struct tsl_tensor *tensor, int64_t index);

/* Copy the box [src_lo, src_lo + extent) of `src` to [dst_lo, dst_lo + extent) of `dst`
 * (same ndim and dtype, any tile grids and owners): one box-copy task per overlapping
 * (source tile, destination tile) pair, on the destination's owner. Validated by callers. */
tsl_status tsl_copy_region(struct tsl_tensor *dst, struct tsl_tensor *src, const int64_t *src_lo,
                           const int64_t *dst_lo, const int64_t *extent);

/* ---- optimizer state in two phases (lower/optimizer.c), so that a checkpoint load can check
 * every file before changing anything ---- */

typedef struct tsl_optimizer_pending tsl_optimizer_pending;

/* Read and check the state files of tsl_optimizer_load_state(); changes nothing. Collective. */
tsl_status tsl_optimizer_read_state(tsl_optimizer_t opt, int32_t count, const tsl_tensor_t *params,
                                    const char *const *names, const char *dir,
                                    tsl_optimizer_pending **pending);

/* Install what tsl_optimizer_read_state() read, and free it. Collective. */
tsl_status tsl_optimizer_apply_state(tsl_optimizer_t opt, tsl_optimizer_pending *pending);

void tsl_optimizer_pending_free(tsl_optimizer_pending *pending);

/* y = ReLU(batch norm of x) with the batch statistics a training forward saved
 * (tsl_batchnorm_relu_forward_train): the forward's y bit for bit, from the same tasks. For an
 * executor that drops y after the forward and makes it again for the backward. Each tile's
 * task also reads a tile of `after` (may be NULL) on its rank, so it waits for that tile's
 * writer: its inputs are ready since the forward, and without it the backward's first tasks
 * would make every dropped value again at once. */
tsl_status tsl_batchnorm_relu_recompute(tsl_tensor_t x, tsl_tensor_t gamma, tsl_tensor_t beta,
                                        tsl_tensor_t saved, tsl_tensor_t y, double eps,
                                        tsl_tensor_t after);

/* A tile of `after` owned by `rank`, for a task that must wait for its writer: tile i when
 * after is tiled in `ntiles` tiles, else the first such tile; NULL when none (or no tensor). */
starpu_data_handle_t tsl_tile_on(tsl_tensor_t after, int64_t ntiles, int64_t i, int32_t rank);

/* y = ReLU(group norm of x) with the statistics a training forward saved
 * (tsl_groupnorm_relu_forward): the forward's y bit for bit, one task per tile reading the saved
 * rows; `after` as for tsl_batchnorm_relu_recompute(). */
tsl_status tsl_groupnorm_relu_recompute(tsl_tensor_t x, tsl_tensor_t gamma, tsl_tensor_t beta,
                                        int64_t groups, tsl_tensor_t saved, tsl_tensor_t y,
                                        double eps, tsl_tensor_t after);

/* ---- convolutions that keep their halo slabs from forward to backward (lower/conv.c) ---- */

struct tsl_halo_keep;

/* tsl_conv_forward / tsl_conv_transpose_forward (count 1) and tsl_conv_concat_forward that
 * keep each input's halo slabs in keeps[k] (lower/halo.h; NULL keeps nothing), and the
 * backward that uses and drops them. */
tsl_status tsl_conv_forward_keeping(const tsl_conv_params *p, int transposed, int32_t count,
                                    const tsl_tensor_t *xs, tsl_tensor_t w, tsl_tensor_t b,
                                    tsl_tensor_t y, struct tsl_halo_keep *keeps);
tsl_status tsl_conv_backward_keeping(const tsl_conv_params *p, int transposed, int32_t count,
                                     const tsl_tensor_t *xs, tsl_tensor_t w, tsl_tensor_t dy,
                                     const tsl_tensor_t *dxs, tsl_tensor_t dw, tsl_tensor_t db,
                                     struct tsl_halo_keep *keeps);

#endif /* TESSEL_SRC_INTERNAL_H */
