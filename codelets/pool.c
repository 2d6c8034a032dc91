/* Pooling and upsampling codelets, on whole tiles or on windows of spatial tiles assembled
 * from the tile and halo slabs (the kernels are in codelets/pool_kernels.c, the CUDA functions
 * in codelets/pool.cu). */
#include <stdlib.h>
#include <string.h>

#include "codelet.h"
#include "conv.h"
#include "pool.h"
#include "tessel/ops.h"

#define BUF(i) ((void *)STARPU_VECTOR_GET_PTR(buffers[i]))

static void pool_forward_cpu(void *buffers[], void *cl_arg)
{
    tsl_pool_args a;
    starpu_codelet_unpack_args(cl_arg, &a);
    tsl_pool_forward_kernel(&a, BUF(0), BUF(1));
}

static void pool_backward_cpu(void *buffers[], void *cl_arg)
{
    tsl_pool_args a;
    starpu_codelet_unpack_args(cl_arg, &a);
    tsl_pool_backward_kernel(&a, BUF(0), BUF(1), BUF(2));
}

/* Average pooling: dy -> dx (the windows' sizes alone; x is not read). */
static void pool_backward_avg_cpu(void *buffers[], void *cl_arg)
{
    tsl_pool_args a;
    starpu_codelet_unpack_args(cl_arg, &a);
    TSL_CODELET_CHECK(a.kind != TSL_POOL_MAX, "pooling: max pooling's backward reads x");
    tsl_pool_backward_kernel(&a, NULL, BUF(0), BUF(1));
}

static void pool_forward_index_cpu(void *buffers[], void *cl_arg)
{
    tsl_pool_args a;
    starpu_codelet_unpack_args(cl_arg, &a);
    tsl_pool_forward_index_kernel(&a, BUF(0), BUF(1), BUF(2));
}

static void pool_backward_index_cpu(void *buffers[], void *cl_arg)
{
    tsl_pool_args a;
    starpu_codelet_unpack_args(cl_arg, &a);
    tsl_pool_backward_index_kernel(&a, BUF(0), BUF(1), BUF(2));
}

static void upsample_forward_cpu(void *buffers[], void *cl_arg)
{
    tsl_pool_args a;
    starpu_codelet_unpack_args(cl_arg, &a);
    tsl_upsample_forward_kernel(&a, BUF(0), BUF(1));
}

static void upsample_backward_cpu(void *buffers[], void *cl_arg)
{
    tsl_pool_args a;
    starpu_codelet_unpack_args(cl_arg, &a);
    tsl_upsample_backward_kernel(&a, BUF(0), BUF(1));
}

/* ---- spatial tiles: the kernels on a window assembled from the tile and halo slabs ---- */

/* The assembly's view of a pooling window: plain planes as samples of one channel; a
 * channels-last tile as its samples and channels. */
static tsl_conv_args window_view(const tsl_pool_task_args *t)
{
    tsl_conv_args c;
    memset(&c, 0, sizeof c);
    c.spatial = t->pool.spatial;
    c.channels_last = t->pool.channels_last;
    c.samples = t->pool.channels_last ? t->pool.planes / t->pool.channels : t->pool.planes;
    c.in_channels = t->pool.channels_last ? t->pool.channels : 1;
    for (int d = 0; d < 3; d++)
        c.in_size[d] = d < c.spatial ? t->pool.in_size[d] : 1;
    return c;
}

static float *window_alloc(const tsl_pool_task_args *t)
{
    size_t n = (size_t)t->pool.planes;
    for (int d = 0; d < t->pool.spatial; d++)
        n *= (size_t)t->pool.in_size[d];
    float *w = malloc(n * sizeof *w);
    TSL_CODELET_CHECK(w, "pooling: out of memory for a window");
    return w;
}

int tsl_pool_window_is_tile(const tsl_pool_task_args *t)
{
    if (t->window.nslabs)
        return 0;
    for (int d = 0; d < t->pool.spatial; d++)
        if (t->window.window.lo[d] != t->window.tile.lo[d] ||
            t->window.window.size[d] != t->window.tile.size[d])
            return 0;
    return 1;
}

static int unpack_window(void *cl_arg, void *buffers[], int first, tsl_pool_task_args *t,
                         void **slabs)
{
    starpu_codelet_unpack_args(cl_arg, t);
    TSL_CODELET_CHECK(t->pool.dtype == TSL_F32, "pooling windows take f32 tiles");
    int ns = t->window.nslabs;
    TSL_CODELET_CHECK(ns >= 0 && ns <= TSL_CONV_MAX_SLABS, "pooling: halo slab count");
    for (int k = 0; k < ns; k++)
        slabs[k] = BUF(first + k);
    return ns;
}

enum window_kind { WINDOW_POOL, WINDOW_POOL_INDEX, WINDOW_UPSAMPLE };

/* x window -> y (pooling or upsampling forward), and a max pooling's indices after y. */
static void window_forward_cpu(void *buffers[], void *cl_arg, enum window_kind kind)
{
    tsl_pool_task_args t;
    void *slabs[TSL_CONV_MAX_SLABS];
    int ns = unpack_window(cl_arg, buffers, 1, &t, slabs);
    tsl_conv_args c = window_view(&t);
    tsl_conv_window_check(&c, &t.window);
    int direct = tsl_pool_window_is_tile(&t);
    float *win = direct ? BUF(0) : window_alloc(&t);
    if (!direct)
        tsl_conv_window_assemble(&c, &t.window, BUF(0), (const float *const *)slabs, win);
    if (kind == WINDOW_UPSAMPLE)
        tsl_upsample_forward_kernel(&t.pool, win, BUF(1 + ns));
    else if (kind == WINDOW_POOL_INDEX)
        tsl_pool_forward_index_kernel(&t.pool, win, BUF(1 + ns), BUF(2 + ns));
    else
        tsl_pool_forward_kernel(&t.pool, win, BUF(1 + ns));
    if (!direct)
        free(win);
}

static void pool_window_forward_cpu(void *buffers[], void *cl_arg)
{
    window_forward_cpu(buffers, cl_arg, WINDOW_POOL);
}

static void pool_window_forward_index_cpu(void *buffers[], void *cl_arg)
{
    window_forward_cpu(buffers, cl_arg, WINDOW_POOL_INDEX);
}

static void upsample_window_forward_cpu(void *buffers[], void *cl_arg)
{
    window_forward_cpu(buffers, cl_arg, WINDOW_UPSAMPLE);
}

/* x window, dy -> dx tile and gradient slabs. */
static void pool_window_backward_cpu(void *buffers[], void *cl_arg)
{
    tsl_pool_task_args t;
    void *slabs[TSL_CONV_MAX_SLABS], *dslabs[TSL_CONV_MAX_SLABS];
    int ns = unpack_window(cl_arg, buffers, 1, &t, slabs);
    for (int k = 0; k < ns; k++)
        dslabs[k] = BUF(3 + ns + k);
    tsl_conv_args c = window_view(&t);
    tsl_conv_window_check(&c, &t.window);
    if (tsl_pool_window_is_tile(&t)) {
        tsl_pool_backward_kernel(&t.pool, BUF(0), BUF(1), BUF(2));
        return;
    }
    float *win = window_alloc(&t), *dwin = window_alloc(&t);
    tsl_conv_window_assemble(&c, &t.window, BUF(0), (const float *const *)slabs, win);
    tsl_pool_backward_kernel(&t.pool, win, BUF(1 + ns), dwin);
    tsl_conv_window_scatter(&c, &t.window, dwin, BUF(2 + ns), (float *const *)dslabs);
    free(win);
    free(dwin);
}

enum dy_kind { DY_UPSAMPLE, DY_POOL_INDEX, DY_POOL_AVG };

/* [indices,] dy -> dx tile and gradient slabs: upsampling, max pooling from its indices, or
 * average pooling (x is not read). */
static void window_backward_dy_cpu(void *buffers[], void *cl_arg, enum dy_kind kind)
{
    tsl_pool_task_args t;
    void *dslabs[TSL_CONV_MAX_SLABS];
    const int index = kind == DY_POOL_INDEX;
    unpack_window(cl_arg, buffers, 2 + index, &t, dslabs); /* dx slabs follow dy and dx */
    TSL_CODELET_CHECK(kind != DY_POOL_AVG || t.pool.kind != TSL_POOL_MAX,
                      "pooling: max pooling's backward reads x");
    tsl_conv_args c = window_view(&t);
    tsl_conv_window_check(&c, &t.window);
    int direct = tsl_pool_window_is_tile(&t);
    float *dwin = direct ? BUF(1 + index) : window_alloc(&t);
    if (kind == DY_POOL_INDEX)
        tsl_pool_backward_index_kernel(&t.pool, BUF(0), BUF(1), dwin);
    else if (kind == DY_POOL_AVG)
        tsl_pool_backward_kernel(&t.pool, NULL, BUF(0), dwin);
    else
        tsl_upsample_backward_kernel(&t.pool, BUF(0), dwin);
    if (direct)
        return;
    tsl_conv_window_scatter(&c, &t.window, dwin, BUF(1 + index), (float *const *)dslabs);
    free(dwin);
}

static void upsample_window_backward_cpu(void *buffers[], void *cl_arg)
{
    window_backward_dy_cpu(buffers, cl_arg, DY_UPSAMPLE);
}

static void pool_window_backward_index_cpu(void *buffers[], void *cl_arg)
{
    window_backward_dy_cpu(buffers, cl_arg, DY_POOL_INDEX);
}

static void pool_window_backward_avg_cpu(void *buffers[], void *cl_arg)
{
    window_backward_dy_cpu(buffers, cl_arg, DY_POOL_AVG);
}

/* The footprint of a pooling or upsampling: the tile sizes, the dtype, the kind (max, average,
 * nearest, linear, ...), padding counted or not, the layout, the index dtype, the sizes, the
 * kernel (the scale), strides and padding. Positions (origins) stay out. */
static uint32_t pool_hash(uint32_t h, const tsl_pool_args *a)
{
    const int64_t flags[] = {a->dtype,         a->spatial,     a->kind,     a->count_include_pad,
                             a->channels_last, a->index_dtype, a->channels, a->planes};
    h = tsl_hash_i64s(h, flags, (int)(sizeof flags / sizeof flags[0]));
    h = tsl_hash_i64s(h, a->in_size, 3);
    h = tsl_hash_i64s(h, a->out_size, 3);
    h = tsl_hash_i64s(h, a->kernel, 3);
    h = tsl_hash_i64s(h, a->stride, 3);
    return tsl_hash_i64s(h, a->padding, 3);
}

static uint32_t pool_variant(struct starpu_task *task)
{
    tsl_pool_args a;
    starpu_codelet_unpack_args(task->cl_arg, &a);
    return pool_hash(starpu_task_data_footprint(task), &a);
}

/* A spatial tile's: the same, and its window's halo slabs. */
static uint32_t pool_window_variant(struct starpu_task *task)
{
    tsl_pool_task_args t;
    starpu_codelet_unpack_args(task->cl_arg, &t);
    return tsl_hash_i64(pool_hash(starpu_task_data_footprint(task), &t.pool), t.window.nslabs);
}

#ifdef TESSEL_USE_CUDA
/* Spatial tiles run on CUDA workers only where the window is the tile itself (no halo slabs to
 * assemble); other windows stay on CPU workers. */
static int window_can_execute(unsigned workerid, struct starpu_task *task, unsigned nimpl)
{
    (void)nimpl;
    if (starpu_worker_get_type((int)workerid) != STARPU_CUDA_WORKER)
        return 1;
    tsl_pool_task_args t;
    starpu_codelet_unpack_args(task->cl_arg, &t);
    return t.pool.dtype == TSL_F32 && tsl_pool_window_is_tile(&t);
}
/* (the CUDA slot and can_execute exist only with TESSEL_USE_CUDA) */
#define WINDOW_CAN_EXECUTE .can_execute = window_can_execute
#else
#define WINDOW_CAN_EXECUTE .can_execute = NULL
#endif

/* The CUDA functions (pool.cu) fill the CUDA slots only when TESSEL_USE_CUDA is defined. */
TSL_CODELET(tsl_cl_pool_window_forward, "tsl_pool_window_fwd", pool_window_forward_cpu,
            tsl_pool_window_forward_cuda, pool_window_variant, .nbuffers = STARPU_VARIABLE_NBUFFERS,
            WINDOW_CAN_EXECUTE);
TSL_CODELET(tsl_cl_pool_window_backward, "tsl_pool_window_bwd", pool_window_backward_cpu,
            tsl_pool_window_backward_cuda, pool_window_variant,
            .nbuffers = STARPU_VARIABLE_NBUFFERS, WINDOW_CAN_EXECUTE);
TSL_CODELET(tsl_cl_pool_window_forward_index, "tsl_pool_window_fwd_index",
            pool_window_forward_index_cpu, tsl_pool_window_forward_index_cuda, pool_window_variant,
            .nbuffers = STARPU_VARIABLE_NBUFFERS, WINDOW_CAN_EXECUTE);
TSL_CODELET(tsl_cl_pool_window_backward_index, "tsl_pool_window_bwd_index",
            pool_window_backward_index_cpu, tsl_pool_window_backward_index_cuda,
            pool_window_variant, .nbuffers = STARPU_VARIABLE_NBUFFERS, WINDOW_CAN_EXECUTE);
TSL_CODELET(tsl_cl_pool_window_backward_avg, "tsl_pool_window_bwd_avg",
            pool_window_backward_avg_cpu, tsl_pool_window_backward_avg_cuda, pool_window_variant,
            .nbuffers = STARPU_VARIABLE_NBUFFERS, WINDOW_CAN_EXECUTE);
TSL_CODELET(tsl_cl_upsample_window_forward, "tsl_upsample_window_fwd", upsample_window_forward_cpu,
            tsl_upsample_window_forward_cuda, pool_window_variant,
            .nbuffers = STARPU_VARIABLE_NBUFFERS, WINDOW_CAN_EXECUTE);
TSL_CODELET(tsl_cl_upsample_window_backward, "tsl_upsample_window_bwd",
            upsample_window_backward_cpu, tsl_upsample_window_backward_cuda, pool_window_variant,
            .nbuffers = STARPU_VARIABLE_NBUFFERS, WINDOW_CAN_EXECUTE);

TSL_CODELET(tsl_cl_pool_forward, "tsl_pool_fwd", pool_forward_cpu, tsl_pool_forward_cuda,
            pool_variant, .nbuffers = 2, .modes = {STARPU_R, STARPU_W});
TSL_CODELET(tsl_cl_pool_backward, "tsl_pool_bwd", pool_backward_cpu, tsl_pool_backward_cuda,
            pool_variant, .nbuffers = 3, .modes = {STARPU_R, STARPU_R, STARPU_W});
TSL_CODELET(tsl_cl_pool_backward_avg, "tsl_pool_bwd_avg", pool_backward_avg_cpu,
            tsl_pool_backward_avg_cuda, pool_variant, .nbuffers = 2, .modes = {STARPU_R, STARPU_W});
TSL_CODELET(tsl_cl_pool_forward_index, "tsl_pool_fwd_index", pool_forward_index_cpu,
            tsl_pool_forward_index_cuda, pool_variant, .nbuffers = 3,
            .modes = {STARPU_R, STARPU_W, STARPU_W});
TSL_CODELET(tsl_cl_pool_backward_index, "tsl_pool_bwd_index", pool_backward_index_cpu,
            tsl_pool_backward_index_cuda, pool_variant, .nbuffers = 3,
            .modes = {STARPU_R, STARPU_R, STARPU_W});
TSL_CODELET(tsl_cl_upsample_forward, "tsl_upsample_fwd", upsample_forward_cpu,
            tsl_upsample_forward_cuda, pool_variant, .nbuffers = 2, .modes = {STARPU_R, STARPU_W});
TSL_CODELET(tsl_cl_upsample_backward, "tsl_upsample_bwd", upsample_backward_cpu,
            tsl_upsample_backward_cuda, pool_variant, .nbuffers = 2, .modes = {STARPU_R, STARPU_W});
/* Linear upsampling runs the same CPU and CUDA functions (the mode travels in the arguments)
 * under perf models of its own: its tasks cost more than nearest ones of the same shape. */
TSL_CODELET(tsl_cl_upsample_linear_forward, "tsl_upsample_linear_fwd", upsample_forward_cpu,
            tsl_upsample_forward_cuda, pool_variant, .nbuffers = 2, .modes = {STARPU_R, STARPU_W});
TSL_CODELET(tsl_cl_upsample_linear_backward, "tsl_upsample_linear_bwd", upsample_backward_cpu,
            tsl_upsample_backward_cuda, pool_variant, .nbuffers = 2, .modes = {STARPU_R, STARPU_W});
