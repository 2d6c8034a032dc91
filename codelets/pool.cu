/* Pooling and upsampling on CUDA: max and average pooling (with or without indices) and nearest
 * and linear upsampling, forward and backward, over whole tiles (f32, f64, plain or
 * channels-last) and over spatial tiles whose window is the tile itself; one thread an output
 * element (forward) or an input element (backward), launched on the worker's stream (the
 * codelets are STARPU_CUDA_ASYNC).
 *
 * Forward threads call pool_math.h's per-output functions, as the CPU loops. The backward is a
 * gather rather than the CPU's scatter: each input element visits the outputs whose windows
 * hold it, in the CPU's order of outputs, and rounds its sum to the dtype after each addition
 * as the CPU does, so the results are the same bits, with no atomics (deterministic). Where no
 * two windows share an element (2x2 stride 2, say) the backward instead zeroes dx and lets each
 * output write its window (tsl_pool_backward_disjoint(), the same bits): a quarter of the
 * threads and none of the gather's searches. Compiled with -fmad=false. */
#include <starpu.h>

#include "cuda_check.h"
#include "cuda_launch.h"
#include "pool.h"
#include "pool_math.h"

namespace
{

/* floor(a / b) for b > 0. */
__device__ int64_t floor_div(int64_t a, int64_t b)
{
    return a >= 0 ? a / b : -((-a + b - 1) / b);
}

/* The outputs [lo[d], hi[d]) (local, per dimension) whose pooling windows may hold input
 * position q (local). */
__device__ void pool_outputs_of(const tsl_pool_geom &g, const int64_t q[3], int64_t lo[3],
                                int64_t hi[3])
{
    for (int d = 0; d < 3; d++) {
        int64_t qg = q[d] + g.io[d];
        /* o s - p <= qg <= o s - p + k - 1 */
        int64_t first = floor_div(qg + g.p[d] - g.k[d], g.s[d]) + 1 - g.oo[d];
        int64_t last = floor_div(qg + g.p[d], g.s[d]) - g.oo[d];
        lo[d] = first > 0 ? first : 0;
        hi[d] = last + 1 < g.out[d] ? last + 1 : g.out[d];
    }
}

/* The outputs [lo[d], hi[d]) whose upsampling sources may include input position q: by an
 * integer scale k, nearest reads q from o in [q k, q k + k), linear from o in [(q - 1) k,
 * (q + 2) k) (floor or floor + 1 of (o + 0.5) / k - 0.5, clamped); by the sizes (k 0), o in
 * [(q - 1) out / in - 2, (q + 2) out / in + 2], which holds both modes' sources with room for the
 * float scale's rounding. The caller keeps only the outputs that do read q. */
__device__ void upsample_outputs_of(const tsl_pool_geom &g, const int64_t q[3], int64_t lo[3],
                                    int64_t hi[3])
{
    for (int d = 0; d < 3; d++) {
        int64_t qg = q[d] + g.io[d], first, last;
        if (g.k[d] > 0) {
            first = (qg - 1) * g.k[d];
            last = (qg + 2) * g.k[d];
        } else {
            first = qg > 0 ? (qg - 1) * g.gout[d] / g.gin[d] - 2 : 0;
            last = (qg + 2) * g.gout[d] / g.gin[d] + 3;
        }
        first -= g.oo[d];
        last -= g.oo[d];
        lo[d] = first > 0 ? first : 0;
        hi[d] = last < g.out[d] ? last : g.out[d];
    }
}

/* y (and, for max pooling with ix, the indices) from x. */
__global__ void pool_forward_kernel(tsl_pool_args a, tsl_pool_geom g, const void *x, void *y,
                                    void *ix)
{
    TSL_CUDA_FOR(m, a.planes * g.out_plane)
    {
        int64_t pl, out, o[3], best;
        tsl_pool_plane_position(&a, g.out_plane, m, &pl, &out);
        tsl_pool_split_position(g.out, out, o);
        double v = tsl_pool_output(&a, &g, x, tsl_pool_plane_base(&a, pl, g.in_plane), o[0], o[1],
                                   o[2], &best);
        if (ix && a.kind == TSL_POOL_MAX)
            tsl_pool_store_index(a.index_dtype, ix, m, best);
        tsl_store(a.dtype, y, m, v);
    }
}

/* dx from x and dy (max: to each window's choice; average: the share of each window), or with
 * `ix` from a max pooling's indices and dy. */
__global__ void pool_backward_kernel(tsl_pool_args a, tsl_pool_geom g, const void *x,
                                     const void *ix, const void *dy, void *dx)
{
    TSL_CUDA_FOR(m, a.planes * g.in_plane)
    {
        int64_t pl, pos, q[3], lo[3], hi[3];
        tsl_pool_plane_position(&a, g.in_plane, m, &pl, &pos);
        tsl_pool_split_position(g.in, pos, q);
        pool_outputs_of(g, q, lo, hi);
        int64_t xb = tsl_pool_plane_base(&a, pl, g.in_plane);
        int64_t yb = tsl_pool_plane_base(&a, pl, g.out_plane);
        double acc = 0;
        for (int64_t o0 = lo[0]; o0 < hi[0]; o0++)
            for (int64_t o1 = lo[1]; o1 < hi[1]; o1++)
                for (int64_t o2 = lo[2]; o2 < hi[2]; o2++) {
                    int64_t at = yb + ((o0 * g.out[1] + o1) * g.out[2] + o2) * g.cs;
                    double grad = tsl_load(a.dtype, dy, at);
                    if (ix) {
                        int64_t k = tsl_pool_load_index(a.index_dtype, ix, at);
                        if (k >= 0 && tsl_pool_index_position(&g, o0, o1, o2, k) == pos)
                            acc = tsl_pool_round(a.dtype, acc + grad);
                    } else if (a.kind == TSL_POOL_MAX) {
                        if (tsl_pool_max_at(&a, &g, x, xb, o0, o1, o2) == m)
                            acc = tsl_pool_round(a.dtype, acc + grad);
                    } else {
                        acc = tsl_pool_round(a.dtype,
                                             acc + grad / tsl_pool_avg_divisor(&a, &g, o0, o1, o2));
                    }
                }
        tsl_store(a.dtype, dx, m, acc);
    }
}

/* dx of a pooling whose windows are disjoint, zeroed before: one thread an output element
 * (tsl_pool_backward_disjoint()), a quarter of the gather's threads for 2x2 windows and no
 * search for the outputs of an input element. */
__global__ void pool_backward_disjoint_kernel(tsl_pool_args a, tsl_pool_geom g, const void *x,
                                              const void *ix, const void *dy, void *dx)
{
    TSL_CUDA_FOR(m, a.planes * g.out_plane)
    tsl_pool_backward_disjoint(&a, &g, x, ix, dy, dx, m);
}

__global__ void upsample_forward_kernel(tsl_pool_args a, tsl_pool_geom g, const void *x, void *y)
{
    TSL_CUDA_FOR(m, a.planes * g.out_plane)
    {
        int64_t pl, out;
        tsl_pool_plane_position(&a, g.out_plane, m, &pl, &out);
        tsl_store(a.dtype, y, m, tsl_upsample_output(&a, &g, x, pl, out));
    }
}

__global__ void upsample_backward_kernel(tsl_pool_args a, tsl_pool_geom g, const void *dy, void *dx)
{
    TSL_CUDA_FOR(m, a.planes * g.in_plane)
    {
        int64_t pl, pos, q[3], lo[3], hi[3], at[8];
        double weight[8];
        tsl_pool_plane_position(&a, g.in_plane, m, &pl, &pos);
        tsl_pool_split_position(g.in, pos, q);
        upsample_outputs_of(g, q, lo, hi);
        int64_t yb = tsl_pool_plane_base(&a, pl, g.out_plane);
        double acc = 0;
        for (int64_t o0 = lo[0]; o0 < hi[0]; o0++)
            for (int64_t o1 = lo[1]; o1 < hi[1]; o1++)
                for (int64_t o2 = lo[2]; o2 < hi[2]; o2++) {
                    int64_t out = (o0 * g.out[1] + o1) * g.out[2] + o2;
                    int n = tsl_upsample_sources(&a, &g, out, at, weight);
                    double grad = tsl_load(a.dtype, dy, yb + out * g.cs);
                    for (int t = 0; t < n; t++)
                        if (at[t] == pos)
                            acc = tsl_pool_round(a.dtype, acc + weight[t] * grad);
                }
        tsl_store(a.dtype, dx, m, acc);
    }
}

void *buf(void *buffers[], int i)
{
    return (void *)STARPU_VECTOR_GET_PTR(buffers[i]);
}

/* The checks every CUDA pooling function makes; the geometry. Upsampling's scale is its
 * kernel (0: the sizes map); it has no stride (its arguments leave stride 0). */
tsl_pool_geom checked_geometry(const tsl_pool_args &a, bool upsample, const char *what)
{
    TSL_CODELET_CHECK(a.dtype == TSL_F32 || a.dtype == TSL_F64, what);
    TSL_CODELET_CHECK(a.spatial >= 1 && a.spatial <= 3 && a.planes >= 0, what);
    TSL_CODELET_CHECK(!a.channels_last || (a.channels > 0 && a.planes % a.channels == 0), what);
    for (int d = 0; d < a.spatial; d++)
        TSL_CODELET_CHECK(upsample ? a.kernel[d] >= 0 : a.kernel[d] > 0 && a.stride[d] > 0, what);
    return tsl_pool_geometry(&a);
}

enum pool_op {
    POOL_FORWARD,
    POOL_FORWARD_INDEX,
    POOL_BACKWARD,
    POOL_BACKWARD_INDEX,
    POOL_BACKWARD_AVG,
    UPSAMPLE_FORWARD,
    UPSAMPLE_BACKWARD
};

/* Runs `op` (not POOL_FORWARD_INDEX: POOL_FORWARD with out1, the indices) over the inputs in0,
 * in1 and the outputs out0, out1. */
void launch(const tsl_pool_args &a, pool_op op, const void *in0, const void *in1, void *out0,
            void *out1)
{
    bool upsample = op == UPSAMPLE_FORWARD || op == UPSAMPLE_BACKWARD;
    tsl_pool_geom g = checked_geometry(a, upsample, "pooling (CUDA): arguments");
    bool forward = op == POOL_FORWARD || op == UPSAMPLE_FORWARD;
    int64_t n = a.planes * (forward ? g.out_plane : g.in_plane);
    if (n <= 0)
        return;
    if (op == POOL_FORWARD && out1)
        TSL_CODELET_CHECK(a.kind == TSL_POOL_MAX &&
                              (a.index_dtype == TSL_U8 || a.index_dtype == TSL_I32),
                          "pooling (CUDA): indices are for max pooling, u8 or i32");
    if (op == POOL_BACKWARD_INDEX)
        TSL_CODELET_CHECK(a.index_dtype == TSL_U8 || a.index_dtype == TSL_I32,
                          "pooling (CUDA): index dtype");
    if (op == POOL_BACKWARD_AVG)
        TSL_CODELET_CHECK(a.kind != TSL_POOL_MAX, "pooling (CUDA): max pooling's backward reads x");
    cudaStream_t stream = starpu_cuda_get_local_stream();
    unsigned blocks = tsl_cuda_blocks(n);
    switch (op) {
    case POOL_FORWARD:
        pool_forward_kernel<<<blocks, TSL_CUDA_THREADS, 0, stream>>>(a, g, in0, out0, out1);
        break;
    case POOL_BACKWARD:       /* x, dy */
    case POOL_BACKWARD_INDEX: /* indices, dy */
    case POOL_BACKWARD_AVG: { /* -, dy (average pooling reads no x) */
        const void *x = op == POOL_BACKWARD ? in0 : NULL;
        const void *ix = op == POOL_BACKWARD_INDEX ? in0 : NULL;
        if (tsl_pool_windows_disjoint(&g)) {
            size_t bytes = (size_t)n * (a.dtype == TSL_F32 ? sizeof(float) : sizeof(double));
            TSL_CUDA_CHECK(cudaMemsetAsync(out0, 0, bytes, stream));
            int64_t outputs = a.planes * g.out_plane;
            if (outputs > 0)
                pool_backward_disjoint_kernel<<<tsl_cuda_blocks(outputs), TSL_CUDA_THREADS, 0,
                                                stream>>>(a, g, x, ix, in1, out0);
        } else {
            pool_backward_kernel<<<blocks, TSL_CUDA_THREADS, 0, stream>>>(a, g, x, ix, in1, out0);
        }
        break;
    }
    case UPSAMPLE_FORWARD:
        upsample_forward_kernel<<<blocks, TSL_CUDA_THREADS, 0, stream>>>(a, g, in0, out0);
        break;
    case UPSAMPLE_BACKWARD:
        upsample_backward_kernel<<<blocks, TSL_CUDA_THREADS, 0, stream>>>(a, g, in0, out0);
        break;
    }
    TSL_CUDA_CHECK_LAUNCH();
}

/* The arguments of a whole tile's task, or of a spatial tile's (`window`), checked: its
 * window is the tile (the window codelets' can_execute keeps other windows on CPU workers). */
tsl_pool_args task_args(void *cl_arg, bool window)
{
    if (!window) {
        tsl_pool_args a;
        starpu_codelet_unpack_args(cl_arg, &a);
        return a;
    }
    tsl_pool_task_args t;
    starpu_codelet_unpack_args(cl_arg, &t);
    TSL_CODELET_CHECK(t.pool.dtype == TSL_F32, "pooling windows (CUDA) take f32 tiles");
    TSL_CODELET_CHECK(tsl_pool_window_is_tile(&t),
                      "pooling window (CUDA): the window must be the tile itself");
    return t.pool;
}

/* One codelet's CUDA function: forwards read buffer 0 and write buffer 1 (and the indices,
 * buffer 2); backwards read buffers 0 and 1 and write buffer 2 (upsampling and average
 * pooling's dy-only backward: read 0, write 1). */
void run(void *buffers[], void *cl_arg, bool window, pool_op op)
{
    tsl_pool_args a = task_args(cl_arg, window);
    void *b0 = buf(buffers, 0), *b1 = buf(buffers, 1);
    switch (op) {
    case POOL_FORWARD:
    case UPSAMPLE_FORWARD:
    case UPSAMPLE_BACKWARD:
        launch(a, op, b0, NULL, b1, NULL);
        return;
    case POOL_FORWARD_INDEX:
        launch(a, POOL_FORWARD, b0, NULL, b1, buf(buffers, 2));
        return;
    case POOL_BACKWARD:
    case POOL_BACKWARD_INDEX:
        launch(a, op, b0, b1, buf(buffers, 2), NULL);
        return;
    case POOL_BACKWARD_AVG: /* dy, dx */
        launch(a, op, NULL, b0, b1, NULL);
        return;
    }
}

} // namespace

/* ---- whole tiles ---- */

extern "C" void tsl_pool_forward_cuda(void *buffers[], void *cl_arg)
{
    run(buffers, cl_arg, false, POOL_FORWARD);
}

extern "C" void tsl_pool_backward_cuda(void *buffers[], void *cl_arg)
{
    run(buffers, cl_arg, false, POOL_BACKWARD);
}

extern "C" void tsl_pool_backward_avg_cuda(void *buffers[], void *cl_arg)
{
    run(buffers, cl_arg, false, POOL_BACKWARD_AVG);
}

extern "C" void tsl_pool_forward_index_cuda(void *buffers[], void *cl_arg)
{
    run(buffers, cl_arg, false, POOL_FORWARD_INDEX);
}

extern "C" void tsl_pool_backward_index_cuda(void *buffers[], void *cl_arg)
{
    run(buffers, cl_arg, false, POOL_BACKWARD_INDEX);
}

extern "C" void tsl_upsample_forward_cuda(void *buffers[], void *cl_arg)
{
    run(buffers, cl_arg, false, UPSAMPLE_FORWARD);
}

extern "C" void tsl_upsample_backward_cuda(void *buffers[], void *cl_arg)
{
    run(buffers, cl_arg, false, UPSAMPLE_BACKWARD);
}

/* ---- spatial tiles whose window is the tile: the same buffers as the whole-tile codelets ---- */

extern "C" void tsl_pool_window_forward_cuda(void *buffers[], void *cl_arg)
{
    run(buffers, cl_arg, true, POOL_FORWARD);
}

extern "C" void tsl_pool_window_backward_cuda(void *buffers[], void *cl_arg)
{
    run(buffers, cl_arg, true, POOL_BACKWARD);
}

extern "C" void tsl_pool_window_forward_index_cuda(void *buffers[], void *cl_arg)
{
    run(buffers, cl_arg, true, POOL_FORWARD_INDEX);
}

extern "C" void tsl_pool_window_backward_index_cuda(void *buffers[], void *cl_arg)
{
    run(buffers, cl_arg, true, POOL_BACKWARD_INDEX);
}

extern "C" void tsl_pool_window_backward_avg_cuda(void *buffers[], void *cl_arg)
{
    run(buffers, cl_arg, true, POOL_BACKWARD_AVG);
}

extern "C" void tsl_upsample_window_forward_cuda(void *buffers[], void *cl_arg)
{
    run(buffers, cl_arg, true, UPSAMPLE_FORWARD);
}

extern "C" void tsl_upsample_window_backward_cuda(void *buffers[], void *cl_arg)
{
    run(buffers, cl_arg, true, UPSAMPLE_BACKWARD);
}
