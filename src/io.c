/* Tensors read from and written to `.npy` files on one rank, through scatter and gather, and
 * tensors filled from a dataset by their tiles' owners (a read task per tile). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "codelets/copy.h"
#include "internal.h"
#include "tessel/data.h"

tsl_status tsl_tensor_read_npy(tsl_tensor_t *out, tsl_context_t ctx, const char *path, int32_t root,
                               const tsl_tile_grid *grid, const tsl_owner_map *owners)
{
    if (!out)
        return tsl_error(ctx, TSL_ERR_INVALID_ARG, "tsl_tensor_read_npy: tensor is NULL");
    *out = NULL;
    if (!ctx)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "tsl_tensor_read_npy: ctx is NULL");
    if (root < 0 || root >= ctx->size)
        return tsl_error(ctx, TSL_ERR_INVALID_ARG, "tsl_tensor_read_npy: root %d outside [0, %d)",
                         (int)root, ctx->size);
    tsl_npy_header header;
    memset(&header, 0, sizeof header);
    void *data = NULL;
    tsl_status st = TSL_OK;
    if (ctx->rank == root) {
        if (!path)
            st = tsl_error(ctx, TSL_ERR_INVALID_ARG, "tsl_tensor_read_npy: path is NULL");
        else if ((st = tsl_npy_read(path, &header, &data)))
            tsl_error(ctx, st, "%s", tsl_last_error());
    }
    if ((st = tsl_context_agree(ctx, root, st)))
        return st;
    if (MPI_Bcast(&header, (int)sizeof header, MPI_BYTE, root, ctx->ctl_comm) != MPI_SUCCESS) {
        free(data);
        return tsl_error(ctx, TSL_ERR_RUNTIME, "tsl_tensor_read_npy: MPI_Bcast failed");
    }
    tsl_tensor_t t;
    st = tsl_tensor_create(&t, ctx, header.dtype, &header.shape, grid, owners);
    if (!st) {
        st = tsl_tensor_scatter(t, root, data);
        if (st)
            tsl_tensor_destroy(t);
        else
            *out = t;
    }
    free(data);
    return st;
}

tsl_status tsl_tensor_write_npy(tsl_tensor_t t, const char *path, int32_t root)
{
    tsl_status st = tsl_tensor_check(t, "tsl_tensor_write_npy");
    if (st)
        return st;
    struct tsl_context *ctx = t->ctx;
    if (root < 0 || root >= ctx->size)
        return tsl_error(ctx, TSL_ERR_INVALID_ARG, "tsl_tensor_write_npy: root %d outside [0, %d)",
                         (int)root, ctx->size);
    void *whole = NULL;
    if (ctx->rank == root) {
        if (!path)
            st = tsl_error(ctx, TSL_ERR_INVALID_ARG, "tsl_tensor_write_npy: path is NULL");
        else if (!(whole = malloc((size_t)tsl_shape_numel(&t->shape) * t->elem_size)))
            st = tsl_error(ctx, TSL_ERR_OUT_OF_MEMORY,
                           "tsl_tensor_write_npy: cannot hold the whole tensor on rank %d",
                           (int)root);
    }
    if ((st = tsl_context_agree(ctx, root, st)))
        return st;
    st = tsl_tensor_gather(t, root, whole);
    if (!st && ctx->rank == root && (st = tsl_npy_write(path, t->dtype, &t->shape, whole)))
        tsl_error(ctx, st, "%s", tsl_last_error());
    free(whole);
    return tsl_context_agree(ctx, root, st);
}

/* ---- samples read by the owners of their tiles ---- */

/* One call's batch, shared by its read tasks on this rank; the last one frees it. */
typedef struct read_batch {
    struct tsl_context *ctx;
    tsl_dataset_t dataset;
    tsl_dataset_info info;
    int64_t *indices;
    tsl_read_group *group; /* where the reads are counted */
    int64_t tasks_left;    /* under ctx->pending_lock */
    char input[96];        /* a further input's name (tiles of it, not of x), or "" */
} read_batch;

typedef struct read_args {
    read_batch *batch; /* NULL on the ranks that do not run the task */
    int32_t labels;    /* 0: a tile of x (f32); 1: a tile of labels (u8, i32 or i64) or of
                        * float targets (f32, the dataset's info.targets) */
    int32_t ndim;
    int32_t layout;
    int32_t elem_size;
    int64_t start[TSL_MAX_DIMS]; /* the tile's box in the tensor */
    int64_t extent[TSL_MAX_DIMS];
} read_args;

/* A tile whose read failed: NaN samples, invalid labels (all bits set: 255 or -1, outside
 * every class range), so nothing trains on stale values before the failure is reported. */
static void poison_tile(const read_args *a, void *tile, int64_t numel)
{
    if (!a->labels || a->batch->info.targets) {
        float *x = tile;
        for (int64_t i = 0; i < numel; i++)
            x[i] = NAN;
    } else {
        memset(tile, 0xff, (size_t)numel * (size_t)a->elem_size);
    }
}

/* Read sample n of the tile (the box of the tile past the sample axis) into `tile`. */
static tsl_status read_tile_sample(const read_args *a, const read_batch *b, int64_t n, void *tile,
                                   void **scratch)
{
    int64_t index = b->indices[a->start[0] + n];
    int32_t sample_ndim = b->input[0] ? a->ndim - 1 : b->info.sample_shape.ndim;
    int64_t start[TSL_MAX_DIMS] = {0}, extent[TSL_MAX_DIMS], per_sample = 1;
    for (int32_t d = 1; d < a->ndim; d++)
        per_sample *= a->extent[d];
    const int targets = a->labels && b->info.targets; /* f32, boxed as x is */
    if (targets) {
        memcpy(start, a->start + 1, sizeof *start * (size_t)(a->ndim - 1));
        memcpy(extent, a->extent + 1, sizeof *extent * (size_t)(a->ndim - 1));
    } else if (!a->labels) {
        memcpy(start, a->start + 1, sizeof *start * (size_t)sample_ndim);
        memcpy(extent, a->extent + 1, sizeof *extent * (size_t)sample_ndim);
    } else { /* every channel axis of the box: the labels' box is axes 1 .. */
        memcpy(extent, b->info.sample_shape.dims, sizeof *extent * (size_t)sample_ndim);
        for (int32_t d = 1; d < a->ndim; d++) {
            start[d] = a->start[d];
            extent[d] = a->extent[d];
        }
    }
    int direct = a->layout == TSL_LAYOUT_PLAIN && (!a->labels || targets || a->elem_size == 8);
    void *dst = (char *)tile + (size_t)(n * per_sample) * (size_t)a->elem_size;
    if (!direct && !*scratch && !(*scratch = malloc((size_t)per_sample * 8)))
        return tsl_error(NULL, TSL_ERR_OUT_OF_MEMORY, "reading samples: out of memory");
    void *into = direct ? dst : *scratch;
    tsl_status st =
        b->input[0] ? tsl_dataset_read_input_box(b->dataset, b->input, index, start, extent, into)
        : targets   ? tsl_dataset_read_target_box(b->dataset, index, start, extent, into)
                  : tsl_dataset_read_box(b->dataset, index, start, extent, a->labels ? NULL : into,
                                         a->labels ? into : NULL);
    if (st || direct)
        return st;
    tsl_box_copy_args c;
    memset(&c, 0, sizeof c);
    c.ndim = a->ndim;
    c.elem_size = a->elem_size;
    c.src_layout = TSL_LAYOUT_PLAIN;
    c.dst_layout = a->layout;
    c.narrow_labels = a->labels && !targets && a->elem_size != 8;
    for (int32_t d = 0; d < a->ndim; d++) {
        c.src_extent[d] = d ? a->extent[d] : 1;
        c.dst_extent[d] = a->extent[d];
        c.dst_offset[d] = d ? 0 : n;
        c.box[d] = c.src_extent[d];
    }
    tsl_box_copy(&c, tile, *scratch);
    return TSL_OK;
}

static void read_samples_cpu(void *buffers[], void *cl_arg)
{
    read_args a;
    starpu_codelet_unpack_args(cl_arg, &a);
    read_batch *b = a.batch;
    void *tile = (void *)STARPU_VECTOR_GET_PTR(buffers[0]);
    int64_t numel = (int64_t)STARPU_VECTOR_GET_NX(buffers[0]);
    void *scratch = NULL;
    tsl_status st = TSL_OK;
    for (int64_t n = 0; n < a.extent[0] && !st; n++)
        st = read_tile_sample(&a, b, n, tile, &scratch);
    free(scratch);
    struct tsl_context *ctx = b->ctx;
    if (st)
        poison_tile(&a, tile, numel);
    tsl_read_group *group = b->group;
    pthread_mutex_lock(&ctx->pending_lock);
    if (st && !group->status) {
        group->status = st;
        snprintf(group->error, sizeof group->error, "%s", tsl_last_error());
    }
    int last = --b->tasks_left == 0;
    if (--group->pending == 0)
        pthread_cond_broadcast(&ctx->pending_done);
    pthread_mutex_unlock(&ctx->pending_lock);
    if (last) {
        free(b->indices);
        free(b);
    }
}

static struct starpu_perfmodel read_samples_model = {
    .type = STARPU_HISTORY_BASED,
    .symbol = "tsl_read_samples",
};

static struct starpu_codelet read_samples_cl = {
    .cpu_funcs = {read_samples_cpu},
    .cpu_funcs_name = {"read_samples_cpu"},
    .nbuffers = 1,
    .modes = {STARPU_W},
    .model = &read_samples_model,
    .name = "tsl_read_samples",
};

/* x (N, sample shape) f32 and labels (N, label shape) of an integer type, each NULL or
 * fitting the dataset; indices in range. */
static tsl_status check_read(struct tsl_context *ctx, tsl_tensor_t x, tsl_tensor_t labels,
                             const tsl_dataset_info *info, const int64_t *indices, int64_t count)
{
    const char *fn = "tsl_tensors_read_samples";
    if (x && x->dtype != TSL_F32)
        return tsl_error(ctx, TSL_ERR_DTYPE, "%s: x is %s, not f32", fn, tsl_dtype_name(x->dtype));
    if (labels && info->targets && labels->dtype != TSL_F32)
        return tsl_error(ctx, TSL_ERR_DTYPE,
                         "%s: the dataset gives float targets (for a loss such as mse or l1), "
                         "and the labels tensor is %s",
                         fn, tsl_dtype_name(labels->dtype));
    if (labels && !info->targets && labels->dtype != TSL_U8 && labels->dtype != TSL_I32 &&
        labels->dtype != TSL_I64)
        return tsl_error(ctx, TSL_ERR_DTYPE,
                         "%s: the dataset gives class labels, which go to u8, i32 or i64 "
                         "tensors, not %s%s",
                         fn, tsl_dtype_name(labels->dtype),
                         labels->dtype == TSL_F32 ? " (a loss on float targets needs a dataset "
                                                    "of them: an npy directory with f32 y)"
                                                  : "");
    for (int k = 0; k < 2; k++) {
        tsl_tensor_t t = k ? labels : x;
        const tsl_shape *want = k ? &info->label_shape : &info->sample_shape;
        if (!t)
            continue;
        int fits = t->shape.ndim == want->ndim + 1 && t->shape.dims[0] == count;
        for (int32_t d = 0; fits && d < want->ndim; d++)
            fits = t->shape.dims[d + 1] == want->dims[d];
        if (!fits)
            return tsl_error(ctx, TSL_ERR_SHAPE,
                             "%s: %s must be (%lld samples, the dataset's %s shape) with %d "
                             "axes in all",
                             fn, k ? "labels" : "x", (long long)count, k ? "label" : "sample",
                             (int)want->ndim + 1);
    }
    for (int64_t i = 0; i < count; i++)
        if (indices[i] < 0 || indices[i] >= info->samples)
            return tsl_error(ctx, TSL_ERR_INVALID_ARG,
                             "%s: sample index %lld (position %lld) is outside [0, %lld)", fn,
                             (long long)indices[i], (long long)i, (long long)info->samples);
    return TSL_OK;
}

/* FNV-1a over bytes. */
tsl_status tsl_tensors_read_samples(tsl_tensor_t x, tsl_tensor_t labels, tsl_dataset_t dataset,
                                    const int64_t *indices)
{
    tsl_tensor_t first = x ? x : labels;
    tsl_status st = tsl_tensor_check(first, "tsl_tensors_read_samples");
    return st ? st : tsl_read_samples_grouped(x, labels, dataset, indices, &first->ctx->reads);
}

static tsl_status read_grouped(tsl_tensor_t x, tsl_tensor_t labels, tsl_dataset_t dataset,
                               const char *input, const int64_t *indices, tsl_read_group *group);

tsl_status tsl_read_samples_grouped(tsl_tensor_t x, tsl_tensor_t labels, tsl_dataset_t dataset,
                                    const int64_t *indices, tsl_read_group *group)
{
    return read_grouped(x, labels, dataset, NULL, indices, group);
}

tsl_status tsl_read_input_samples_grouped(tsl_tensor_t x, tsl_dataset_t dataset, const char *input,
                                          const int64_t *indices, tsl_read_group *group)
{
    return read_grouped(x, NULL, dataset, input, indices, group);
}

/* x's tiles from further input `input` of the dataset (NULL: from x, and labels' too). */
static tsl_status read_grouped(tsl_tensor_t x, tsl_tensor_t labels, tsl_dataset_t dataset,
                               const char *input, const int64_t *indices, tsl_read_group *group)
{
    const char *fn = "tsl_tensors_read_samples";
    tsl_tensor_t first = x ? x : labels;
    tsl_status st = tsl_tensor_check(first, fn);
    if (st)
        return st;
    struct tsl_context *ctx = first->ctx;
    tsl_dataset_info info;
    memset(&info, 0, sizeof info);
    int64_t count = first->shape.dims[0];
    if (x && labels && ((st = tsl_tensor_check(labels, fn)) || labels->ctx != ctx))
        st = st ? st : tsl_error(ctx, TSL_ERR_INVALID_ARG, "%s: x and labels in two contexts", fn);
    else if (!dataset || !indices)
        st = tsl_error(ctx, TSL_ERR_INVALID_ARG, "%s: the dataset or the indices are NULL", fn);
    else if (!(st = tsl_dataset_get_info(dataset, &info)) && input) {
        /* a further input: x checked against its own shape */
        tsl_dataset_info as = info;
        if ((st = tsl_dataset_input_shape(dataset, input, &as.sample_shape)))
            st = tsl_error(ctx, st, "%s: %s", fn, tsl_last_error());
        else
            st = check_read(ctx, x, NULL, &as, indices, count);
    } else if (!st) {
        st = check_read(ctx, x, labels, &info, indices, count);
    }
    /* Every rank must read the same samples: rank 0's digest of the batch is the reference. */
    uint64_t digest = TSL_FNV1A_START, root_digest = 0;
    if (!st) {
        digest = tsl_fnv1a(digest, indices, (size_t)count * sizeof *indices);
        digest = tsl_fnv1a(digest, &info.samples, sizeof info.samples);
        digest = tsl_fnv1a(digest, info.sample_shape.dims, sizeof info.sample_shape.dims);
    }
    root_digest = digest;
    if (MPI_Bcast(&root_digest, 1, MPI_UINT64_T, 0, ctx->ctl_comm) != MPI_SUCCESS)
        st = tsl_error(ctx, TSL_ERR_RUNTIME, "%s: MPI_Bcast failed", fn);
    else if (!st && root_digest != digest)
        st = tsl_error(ctx, TSL_ERR_INVALID_ARG,
                       "%s: rank %d reads other samples (indices or dataset) than rank 0", fn,
                       ctx->rank);
    if ((st = tsl_context_agree_all(ctx, st)))
        return st;
    for (int k = 0; k < 2 && !st; k++) {
        tsl_tensor_t t = k ? labels : x;
        if (!t)
            continue;
        int64_t mine = 0;
        for (int64_t i = 0; i < t->ntiles; i++)
            mine += t->tile_owner[i] == ctx->rank;
        read_batch *b = NULL;
        if (mine) {
            b = calloc(1, sizeof *b);
            if (!b || !(b->indices = malloc((size_t)count * sizeof *indices))) {
                free(b);
                return tsl_error(ctx, TSL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
            }
            memcpy(b->indices, indices, (size_t)count * sizeof *indices);
            b->ctx = ctx;
            b->dataset = dataset;
            b->info = info;
            b->group = group;
            b->tasks_left = mine;
            if (input)
                snprintf(b->input, sizeof b->input, "%s", input);
            pthread_mutex_lock(&ctx->pending_lock);
            group->pending += mine;
            pthread_mutex_unlock(&ctx->pending_lock);
        }
        int64_t submitted = 0;
        for (int64_t i = 0; i < t->ntiles && !st; i++) {
            read_args a;
            memset(&a, 0, sizeof a);
            a.batch = t->tile_owner[i] == ctx->rank ? b : NULL;
            a.labels = k;
            a.ndim = t->shape.ndim;
            a.layout = t->layout;
            a.elem_size = (int32_t)t->elem_size;
            tsl_tensor_tile_box(t, i, a.start, a.extent);
            tsl_task_desc desc = {
                .codelet = &read_samples_cl,
                .args = &a,
                .args_size = sizeof a,
                .nhandles = 1,
                .handles = {t->handles[i]},
                .modes = {STARPU_W},
            };
            st = tsl_task_submit(ctx, &desc);
            submitted += !st && a.batch;
        }
        if (st && b) { /* the tasks never submitted will not count themselves off */
            pthread_mutex_lock(&ctx->pending_lock);
            b->tasks_left -= mine - submitted;
            group->pending -= mine - submitted;
            int last = b->tasks_left == 0;
            pthread_cond_broadcast(&ctx->pending_done);
            pthread_mutex_unlock(&ctx->pending_lock);
            if (last) {
                free(b->indices);
                free(b);
            }
        }
    }
    return st;
}

tsl_status tsl_context_check_reads(tsl_context_t ctx)
{
    if (!ctx)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "tsl_context_check_reads: ctx is NULL");
    return tsl_read_group_check(ctx, &ctx->reads);
}

void tsl_read_group_wait(struct tsl_context *ctx, tsl_read_group *group)
{
    pthread_mutex_lock(&ctx->pending_lock);
    while (group->pending > 0)
        pthread_cond_wait(&ctx->pending_done, &ctx->pending_lock);
    pthread_mutex_unlock(&ctx->pending_lock);
}

tsl_status tsl_read_group_check(struct tsl_context *ctx, tsl_read_group *group)
{
    pthread_mutex_lock(&ctx->pending_lock);
    while (group->pending > 0)
        pthread_cond_wait(&ctx->pending_done, &ctx->pending_lock);
    tsl_status st = group->status;
    char message[TSL_ERROR_MAX];
    snprintf(message, sizeof message, "%s", group->error);
    group->status = TSL_OK;
    pthread_mutex_unlock(&ctx->pending_lock);
    if (st)
        tsl_error(ctx, st, "reading samples: %s", message);
    return tsl_context_agree_all(ctx, st);
}
