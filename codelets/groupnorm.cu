/* Group normalization on CUDA: the per-element codelets of groupnorm.h (the forward's and the
 * backward's sums, the normalization, the input gradient) with the CPU's bits. The sums go into
 * exact accumulators (reduce_cuda.cuh), so they equal the CPU's whatever the order; the
 * element-wise passes compute each element with the CPU's own functions (batchnorm_math.h,
 * groupnorm_math.h, not contracted by nvcc), a fused ReLU included. The per-slab codelets
 * (finalize, save, coefficients, the parameter gradients' channel totals and values) run the CPU's
 * own bodies (groupnorm_slab.h) one (sample, group) or one channel a thread, so a slab's small
 * results are made where its tiles are, without a trip to the host.
 *
 * The sums walk each sample's elements as batch norm's walk a tile (coalesced on
 * channels-last tiles: a block's threads take adjacent channels), grid z the sample; every
 * block merges its per-channel sums into the output accumulators with global atomics (the
 * channels of one group share theirs in the forward). The element-wise kernels walk the same
 * way, each thread one channel of one sample: its constants once, no division per element. */
#include <starpu.h>

#include "batchnorm_math.h"
#include "bn_tile_walk.h"
#include "cuda_check.h"
#include "groupnorm.h"
#include "groupnorm_math.h"
#include "groupnorm_slab.h"
#include "reduce_cuda.cuh"

namespace
{

using namespace tsl_exact;

constexpr int64_t max_grid_rows = 65535; /* gridDim.y and gridDim.z */

void *buf(void *buffers[], int i)
{
    return (void *)STARPU_VECTOR_GET_PTR(buffers[i]);
}

int64_t nx(void *buffers[], int i)
{
    return (int64_t)STARPU_VECTOR_GET_NX(buffers[i]);
}

int64_t bytes(void *buffers[], int i)
{
    return nx(buffers, i) * (int64_t)STARPU_VECTOR_GET_ELEMSIZE(buffers[i]);
}

tsl_gn_args unpack(void *cl_arg, const char *what)
{
    tsl_gn_args a;
    starpu_codelet_unpack_args(cl_arg, &a);
    TSL_CODELET_CHECK(a.dtype == TSL_F32 || a.dtype == TSL_F64, what);
    TSL_CODELET_CHECK(a.groups > 0 && a.channels % a.groups == 0 && a.c0 >= 0 && a.cext >= 0 &&
                          a.c0 + a.cext <= a.channels && a.samples >= 0 && a.inner >= 0 &&
                          a.cext <= max_grid_rows && a.samples <= max_grid_rows,
                      what);
    return a;
}

int64_t tile_elements(const tsl_gn_args &a)
{
    return a.samples * a.cext * a.inner;
}

constexpr int group_max = TSL_BN_WALK_GROUP;
/* The element-wise kernels bound no sum: as many elements a block as filling the GPU leaves. */
constexpr int64_t elementwise_block_elements = (int64_t)1 << 40;
static_assert(TSL_BN_WALK_THREADS == block_threads, "the walk's block is the exact sums' block");

/* One sample's elements of the tile, walked as batch norm walks a tile (bn_tile_walk.h): on
 * channels-last tiles a block's threads take a group of adjacent channels, so a warp's loads
 * are coalesced. A sample's elements are contiguous in both layouts. */
tsl_bn_walk sample_walk(const tsl_gn_args &a)
{
    return tsl_bn_walk_make(1, a.inner, a.cext, a.channels_last);
}

/* The grid of a walk over each sample (sample_walk): channel groups along y, samples along z. */
dim3 sample_grid(const tsl_gn_args &a, const tsl_bn_walk &w, int64_t elements_per_block)
{
    int64_t gx, gy;
    tsl_bn_walk_grid(&w, max_grid / a.samples > 1 ? max_grid / a.samples : 1, elements_per_block,
                     &gx, &gy);
    return dim3((unsigned)gx, (unsigned)gy, (unsigned)a.samples);
}

/* The fused ReLU's mask of tile channel c in slab sample s (the CPU's relu_mask). */
template <typename T>
__device__ inline tsl_bn_relu_mask relu_mask(const tsl_gn_args &a, const double *saved,
                                             const T *gamma, const T *beta, int64_t s, int64_t c)
{
    const int64_t ch = a.c0 + c;
    const double *ms = &saved[2 * ((a.n0 + s) * a.groups + ch / (a.channels / a.groups))];
    return tsl_bn_relu_mask_for(
        a.dtype, tsl_bn_train_affine(ms[0], ms[1], (double)gamma[ch], (double)beta[ch]));
}

__device__ inline float keep(float g, float x, tsl_bn_relu_mask m)
{
    return tsl_bn_relu_keep_f32(g, x, m);
}

__device__ inline double keep(double g, double x, tsl_bn_relu_mask m)
{
    return tsl_bn_relu_keep_f64(g, x, m);
}

/* Sample blockIdx.z, channel group blockIdx.y of the walk: per tile channel, sums of a and a b
 * (b NULL: a^2), added into out[2 k], out[2 k + 1], k = by_group ? s G + g : s C + c0 + c (out
 * zeroed): the block keeps one accumulator pair per channel and adds each into its channel's
 * (or group's) pair, so the sums are exact and independent of the order. With a.relu (the
 * backward: a = dy, b = x), a counts only where the fused ReLU's y > 0. */
template <typename T>
__global__ void sums_kernel(tsl_bn_walk w, tsl_gn_args a, int by_group, const T *pa, const T *pb,
                            const double *saved, const T *gamma, const T *beta, tsl_acc *out)
{
    __shared__ shared_acc shared[2 * group_max];
    const int64_t first = (int64_t)blockIdx.y * w.group;
    const int64_t left = w.cext - first;
    const int n = (int)(left < w.group ? left : w.group);
    shared_zero(shared, 2 * n);
    __syncthreads();
    const int64_t s = blockIdx.z, off = s * a.inner * a.cext;
    const int local = (int)(threadIdx.x % w.group);
    const int64_t c = tsl_bn_walk_channel(&w, blockIdx.y, threadIdx.x);
    if (c >= 0) {
        shared_acc *sh = &shared[2 * local];
        thread_acc sum, prod;
        tsl_bn_cursor cur;
        int64_t i;
        const int relu = a.relu && pb;
        const tsl_bn_relu_mask m =
            relu ? relu_mask(a, saved, gamma, beta, s, c) : tsl_bn_relu_mask{0.0, 0.0};
        for (int more = tsl_bn_walk_begin(&w, blockIdx.x, threadIdx.x, gridDim.x, c, &cur, &i);
             more; more = tsl_bn_walk_next(&w, c, &cur, &i)) {
            T v = pa[off + i];
            const T b = pb ? pb[off + i] : v;
            if (relu)
                v = keep(v, b, m);
            add_sum_product(sum, prod, sh, v, b);
        }
        sum.flush(&sh[0]);
        prod.flush(&sh[1]);
    }
    __syncthreads();
    for (int j = threadIdx.x; j < 2 * n; j += blockDim.x) {
        const int64_t ch = a.c0 + first + j / 2;
        const int64_t k =
            by_group ? s * a.groups + ch / (a.channels / a.groups) : s * a.channels + ch;
        shared_merge_one(&shared[j], &out[2 * k + j % 2]);
    }
}

template <typename T>
void launch_sums(const tsl_gn_args &a, int by_group, const void *pa, const void *pb,
                 const double *saved, const void *gamma, const void *beta, tsl_acc *out,
                 int64_t accs, cudaStream_t stream)
{
    TSL_CUDA_CHECK(cudaMemsetAsync(out, 0, (size_t)accs * sizeof(tsl_acc), stream));
    if (tile_elements(a) > 0) {
        tsl_bn_walk w = sample_walk(a);
        /* a group's accumulator takes up to group_max channels' deposits of a block: a
         * group_max-th of the elements a channel's accumulator may take (reduce_cuda.cuh) */
        dim3 grid = sample_grid(a, w, block_elements / group_max);
        sums_kernel<T><<<grid, block_threads, 0, stream>>>(w, a, by_group, (const T *)pa,
                                                           (const T *)pb, saved, (const T *)gamma,
                                                           (const T *)beta, out);
        TSL_CUDA_CHECK_LAUNCH();
    }
    normalize(out, accs, stream);
}

template <typename T> __device__ inline T affine(T x, const tsl_bn_affine &f);

template <> __device__ inline float affine(float x, const tsl_bn_affine &f)
{
    return tsl_bn_affine_f32(x, f.mean, f.scale, f.shift);
}

template <> __device__ inline double affine(double x, const tsl_bn_affine &f)
{
    return tsl_bn_affine_f64(x, f.mean, f.scale, f.shift);
}

/* f(i) for the elements of tile channel c of sample blockIdx.z that this thread takes, i an
 * index into the tile: no division per element. */
template <typename F>
__device__ inline void each_element(const tsl_bn_walk &w, const tsl_gn_args &a, int64_t c, F f)
{
    const int64_t off = (int64_t)blockIdx.z * a.inner * a.cext;
    tsl_bn_cursor cur;
    int64_t i;
    for (int more = tsl_bn_walk_begin(&w, blockIdx.x, threadIdx.x, gridDim.x, c, &cur, &i); more;
         more = tsl_bn_walk_next(&w, c, &cur, &i))
        f(off + i);
}

/* y = (x - mean) (invstd gamma) + beta, stats the slab's (mean, invstd) per (sample, group):
 * each thread keeps one channel of one sample (the walk's), so its affine is computed once. */
template <typename T>
__global__ void normalize_kernel(tsl_bn_walk w, tsl_gn_args a, const T *x, const double *stats,
                                 const T *gamma, const T *beta, T *y)
{
    const int64_t c = tsl_bn_walk_channel(&w, blockIdx.y, threadIdx.x);
    if (c < 0)
        return;
    const int64_t s = blockIdx.z, ch = a.c0 + c;
    const int64_t row = s + (a.saved_stats ? a.n0 : 0);
    const double *ms = &stats[2 * (row * a.groups + ch / (a.channels / a.groups))];
    const tsl_bn_affine f = tsl_bn_train_affine(ms[0], ms[1], (double)gamma[ch], (double)beta[ch]);
    const int relu = a.relu;
    each_element(w, a, c, [&](int64_t i) {
        T v = affine<T>(x[i], f);
        y[i] = relu && !(v > 0) ? (T)0 : v;
    });
}

/* dx = invstd (dy gamma - m1 - xhat m2), as tsl_gn_backward_data_tile (dy masked by the fused
 * ReLU when a.relu), one channel of one sample a thread. */
template <typename T>
__global__ void dx_kernel(tsl_bn_walk w, tsl_gn_args a, const T *x, const T *dy,
                          const double *saved, const T *gamma, const T *beta, const double *coef,
                          T *dx)
{
    const int64_t c = tsl_bn_walk_channel(&w, blockIdx.y, threadIdx.x);
    if (c < 0)
        return;
    const int64_t s = blockIdx.z, ch = a.c0 + c, g = ch / (a.channels / a.groups);
    const double *ms = &saved[2 * ((a.n0 + s) * a.groups + g)];
    const double *m = &coef[2 * (s * a.groups + g)];
    const double mean = ms[0], invstd = ms[1], w_c = (double)gamma[ch], m1 = m[0], m2 = m[1];
    const int relu = a.relu;
    const tsl_bn_relu_mask mask =
        relu ? relu_mask(a, saved, gamma, beta, s, c) : tsl_bn_relu_mask{0.0, 0.0};
    each_element(w, a, c, [&](int64_t i) {
        const T v = x[i], d = relu ? keep(dy[i], v, mask) : dy[i];
        double xhat = tsl_gn_xhat((double)v, mean, invstd);
        dx[i] = (T)tsl_gn_dx(tsl_hd_mul((double)d, w_c), xhat, invstd, m1, m2);
    });
}

/* ---- per-slab kernels: one (sample, group) or one channel a thread, the CPU's bodies ---- */

constexpr int slab_threads = 64;

unsigned slab_blocks(int64_t items)
{
    return (unsigned)((items + slab_threads - 1) / slab_threads);
}

__global__ void finalize_kernel(tsl_gn_args a, const tsl_acc *acc, double *stats)
{
    int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= a.samples * a.groups)
        return;
    tsl_acc scratch;
    tsl_gn_finalize_one(&a, acc, k, stats, &scratch);
}

__global__ void coef_kernel(tsl_gn_args a, const tsl_acc *acc, const double *saved,
                            const void *gamma, double *coef)
{
    int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= a.samples * a.groups)
        return;
    tsl_acc scratch;
    tsl_gn_coef_one(&a, acc, saved, gamma, k / a.groups, k % a.groups, coef, &scratch);
}

__global__ void slab_channels_kernel(tsl_gn_args a, const tsl_acc *acc, const double *saved,
                                     tsl_acc *out)
{
    int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= a.channels)
        return;
    tsl_acc scratch;
    tsl_gn_slab_channel_one(&a, acc, saved, c, out, &scratch);
}

__global__ void param_grad_kernel(tsl_gn_args a, const tsl_acc *acc, void *grad)
{
    int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= a.channels)
        return;
    tsl_acc scratch;
    tsl_gn_param_grad_one(&a, acc, c, grad, &scratch);
}

bool accs_of(void *buffers[], int i, int64_t count)
{
    return bytes(buffers, i) == count * (int64_t)sizeof(tsl_acc);
}

} // namespace

extern "C" void tsl_gn_stats_cuda(void *buffers[], void *cl_arg)
{
    tsl_gn_args a = unpack(cl_arg, "group norm stats (CUDA): arguments");
    const int64_t accs = 2 * a.samples * a.groups;
    TSL_CODELET_CHECK(nx(buffers, 0) == tile_elements(a) &&
                          bytes(buffers, 1) == accs * (int64_t)sizeof(tsl_acc),
                      "group norm stats (CUDA): sizes");
    cudaStream_t stream = starpu_cuda_get_local_stream();
    if (a.dtype == TSL_F32)
        launch_sums<float>(a, 1, buf(buffers, 0), nullptr, nullptr, nullptr, nullptr,
                           (tsl_acc *)buf(buffers, 1), accs, stream);
    else
        launch_sums<double>(a, 1, buf(buffers, 0), nullptr, nullptr, nullptr, nullptr,
                            (tsl_acc *)buf(buffers, 1), accs, stream);
}

extern "C" void tsl_gn_bwd_sums_cuda(void *buffers[], void *cl_arg)
{
    tsl_gn_args a = unpack(cl_arg, "group norm backward sums (CUDA): arguments");
    const int64_t accs = 2 * a.samples * a.channels;
    TSL_CODELET_CHECK(
        nx(buffers, 0) == tile_elements(a) && nx(buffers, 1) == tile_elements(a) &&
            bytes(buffers, 2) == accs * (int64_t)sizeof(tsl_acc) &&
            (!a.relu || (nx(buffers, 3) == 2 * a.batch * a.groups && nx(buffers, 4) == a.channels &&
                         nx(buffers, 5) == a.channels && a.n0 >= 0 && a.n0 + a.samples <= a.batch)),
        "group norm backward sums (CUDA): sizes");
    cudaStream_t stream = starpu_cuda_get_local_stream();
    const double *saved = a.relu ? (const double *)buf(buffers, 3) : nullptr;
    const void *gamma = a.relu ? buf(buffers, 4) : nullptr,
               *beta = a.relu ? buf(buffers, 5) : nullptr;
    /* sums of dy and dy x: a = dy, b = x */
    if (a.dtype == TSL_F32)
        launch_sums<float>(a, 0, buf(buffers, 1), buf(buffers, 0), saved, gamma, beta,
                           (tsl_acc *)buf(buffers, 2), accs, stream);
    else
        launch_sums<double>(a, 0, buf(buffers, 1), buf(buffers, 0), saved, gamma, beta,
                            (tsl_acc *)buf(buffers, 2), accs, stream);
}

extern "C" void tsl_gn_normalize_cuda(void *buffers[], void *cl_arg)
{
    tsl_gn_args a = unpack(cl_arg, "group norm normalize (CUDA): arguments");
    TSL_CODELET_CHECK(nx(buffers, 0) == tile_elements(a) &&
                          nx(buffers, 1) == 2 * (a.saved_stats ? a.batch : a.samples) * a.groups &&
                          (!a.saved_stats || a.n0 + a.samples <= a.batch) &&
                          nx(buffers, 2) == a.channels && nx(buffers, 3) == a.channels &&
                          nx(buffers, 4) == tile_elements(a),
                      "group norm normalize (CUDA): sizes");
    if (tile_elements(a) == 0)
        return;
    cudaStream_t stream = starpu_cuda_get_local_stream();
    const tsl_bn_walk w = sample_walk(a);
    const dim3 grid = sample_grid(a, w, elementwise_block_elements);
    if (a.dtype == TSL_F32)
        normalize_kernel<float><<<grid, block_threads, 0, stream>>>(
            w, a, (const float *)buf(buffers, 0), (const double *)buf(buffers, 1),
            (const float *)buf(buffers, 2), (const float *)buf(buffers, 3),
            (float *)buf(buffers, 4));
    else
        normalize_kernel<double><<<grid, block_threads, 0, stream>>>(
            w, a, (const double *)buf(buffers, 0), (const double *)buf(buffers, 1),
            (const double *)buf(buffers, 2), (const double *)buf(buffers, 3),
            (double *)buf(buffers, 4));
    TSL_CUDA_CHECK_LAUNCH();
}

extern "C" void tsl_gn_bwd_data_cuda(void *buffers[], void *cl_arg)
{
    tsl_gn_args a = unpack(cl_arg, "group norm backward data (CUDA): arguments");
    TSL_CODELET_CHECK(
        nx(buffers, 0) == tile_elements(a) && nx(buffers, 1) == tile_elements(a) &&
            nx(buffers, 2) == 2 * a.batch * a.groups && nx(buffers, 3) == a.channels &&
            nx(buffers, 4) == 2 * a.samples * a.groups && nx(buffers, 5) == tile_elements(a) &&
            (!a.relu || nx(buffers, 6) == a.channels) && a.n0 >= 0 && a.n0 + a.samples <= a.batch,
        "group norm backward data (CUDA): sizes");
    if (tile_elements(a) == 0)
        return;
    const void *beta = a.relu ? buf(buffers, 6) : nullptr;
    cudaStream_t stream = starpu_cuda_get_local_stream();
    const tsl_bn_walk w = sample_walk(a);
    const dim3 grid = sample_grid(a, w, elementwise_block_elements);
    if (a.dtype == TSL_F32)
        dx_kernel<float><<<grid, block_threads, 0, stream>>>(
            w, a, (const float *)buf(buffers, 0), (const float *)buf(buffers, 1),
            (const double *)buf(buffers, 2), (const float *)buf(buffers, 3), (const float *)beta,
            (const double *)buf(buffers, 4), (float *)buf(buffers, 5));
    else
        dx_kernel<double><<<grid, block_threads, 0, stream>>>(
            w, a, (const double *)buf(buffers, 0), (const double *)buf(buffers, 1),
            (const double *)buf(buffers, 2), (const double *)buf(buffers, 3), (const double *)beta,
            (const double *)buf(buffers, 4), (double *)buf(buffers, 5));
    TSL_CUDA_CHECK_LAUNCH();
}

extern "C" void tsl_gn_finalize_cuda(void *buffers[], void *cl_arg)
{
    tsl_gn_args a = unpack(cl_arg, "group norm finalize (CUDA): arguments");
    const int64_t k = a.samples * a.groups;
    TSL_CODELET_CHECK(accs_of(buffers, 0, 2 * k) && nx(buffers, 1) == 2 * k,
                      "group norm finalize (CUDA): sizes");
    if (k == 0)
        return;
    finalize_kernel<<<slab_blocks(k), slab_threads, 0, starpu_cuda_get_local_stream()>>>(
        a, (const tsl_acc *)buf(buffers, 0), (double *)buf(buffers, 1));
    TSL_CUDA_CHECK_LAUNCH();
}

/* The slab's rows of the whole batch's saved statistics. */
extern "C" void tsl_gn_save_cuda(void *buffers[], void *cl_arg)
{
    tsl_gn_args a = unpack(cl_arg, "group norm save (CUDA): arguments");
    const int64_t k = a.samples * a.groups;
    TSL_CODELET_CHECK(accs_of(buffers, 0, 2 * k) && nx(buffers, 1) == 2 * a.batch * a.groups &&
                          a.n0 >= 0 && a.n0 + a.samples <= a.batch,
                      "group norm save (CUDA): sizes");
    if (k == 0)
        return;
    finalize_kernel<<<slab_blocks(k), slab_threads, 0, starpu_cuda_get_local_stream()>>>(
        a, (const tsl_acc *)buf(buffers, 0), (double *)buf(buffers, 1) + 2 * a.n0 * a.groups);
    TSL_CUDA_CHECK_LAUNCH();
}

extern "C" void tsl_gn_bwd_coef_cuda(void *buffers[], void *cl_arg)
{
    tsl_gn_args a = unpack(cl_arg, "group norm coef (CUDA): arguments");
    const int64_t k = a.samples * a.groups;
    TSL_CODELET_CHECK(accs_of(buffers, 0, 2 * a.samples * a.channels) &&
                          nx(buffers, 1) == 2 * a.batch * a.groups &&
                          nx(buffers, 2) == a.channels && nx(buffers, 3) == 2 * k && a.n0 >= 0 &&
                          a.n0 + a.samples <= a.batch,
                      "group norm coef (CUDA): sizes");
    if (k == 0)
        return;
    coef_kernel<<<slab_blocks(k), slab_threads, 0, starpu_cuda_get_local_stream()>>>(
        a, (const tsl_acc *)buf(buffers, 0), (const double *)buf(buffers, 1), buf(buffers, 2),
        (double *)buf(buffers, 3));
    TSL_CUDA_CHECK_LAUNCH();
}

extern "C" void tsl_gn_slab_channels_cuda(void *buffers[], void *cl_arg)
{
    tsl_gn_args a = unpack(cl_arg, "group norm slab channels (CUDA): arguments");
    TSL_CODELET_CHECK(accs_of(buffers, 0, 2 * a.samples * a.channels) &&
                          nx(buffers, 1) == 2 * a.batch * a.groups &&
                          accs_of(buffers, 2, 2 * a.channels) && a.n0 >= 0 &&
                          a.n0 + a.samples <= a.batch,
                      "group norm slab channels (CUDA): sizes");
    slab_channels_kernel<<<slab_blocks(a.channels), slab_threads, 0,
                           starpu_cuda_get_local_stream()>>>(a, (const tsl_acc *)buf(buffers, 0),
                                                             (const double *)buf(buffers, 1),
                                                             (tsl_acc *)buf(buffers, 2));
    TSL_CUDA_CHECK_LAUNCH();
}

extern "C" void tsl_gn_param_grad_cuda(void *buffers[], void *cl_arg)
{
    tsl_gn_args a = unpack(cl_arg, "group norm parameter gradient (CUDA): arguments");
    TSL_CODELET_CHECK(accs_of(buffers, 0, 2 * a.channels) && nx(buffers, 1) == a.channels &&
                          (a.which == 0 || a.which == 1),
                      "group norm parameter gradient (CUDA): sizes");
    param_grad_kernel<<<slab_blocks(a.channels), slab_threads, 0, starpu_cuda_get_local_stream()>>>(
        a, (const tsl_acc *)buf(buffers, 0), buf(buffers, 1));
    TSL_CUDA_CHECK_LAUNCH();
}
