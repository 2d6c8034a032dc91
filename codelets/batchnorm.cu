/* Batch normalization on CUDA: every codelet of batchnorm.h with the CPU's bits. The sums go
 * into exact accumulators (reduce_cuda.cuh), the per-channel results and the element-wise
 * passes use the CPU's own functions (batchnorm_math.h, whose arithmetic nvcc does not
 * contract), so statistics, outputs and gradients equal the CPU's.
 *
 * Tile kernels run on a grid of (blocks, channel groups) and walk a tile as bn_tile_walk.h
 * says: in a channels-last tile a block takes up to 16 neighbouring channels side by side (a
 * warp reads whole runs of them), in a plain tile one channel; every thread keeps one channel,
 * whose constants (affine, ReLU mask) the block computes once in shared memory. Per-channel
 * kernels run one thread per channel of the tensor. */
#include <starpu.h>

#include "batchnorm.h"
#include "batchnorm_math.h"
#include "bn_tile_walk.h"
#include "cuda_check.h"
#include "reduce_cuda.cuh"

namespace
{

using namespace tsl_exact;

constexpr int64_t max_tile_channels = 65535; /* gridDim.y (channel groups) */
constexpr int group_max = TSL_BN_WALK_GROUP;
static_assert(TSL_BN_WALK_THREADS == block_threads, "the walk's block is the exact sums' block");

tsl_bn_walk walk_of(const tsl_bn_args &a)
{
    return tsl_bn_walk_make(a.samples, a.inner, a.cext, a.channels_last);
}

/* Grid for a tile (bn_tile_walk.h): enough blocks to fill the GPU, and few enough elements a
 * block for the exact sums' bound; one grid row per channel group. */
dim3 tile_grid(const tsl_bn_args &a)
{
    tsl_bn_walk w = walk_of(a);
    int64_t gx, gy;
    tsl_bn_walk_grid(&w, max_grid, block_elements, &gx, &gy);
    return dim3((unsigned)gx, (unsigned)gy);
}

/* This thread's tile channel (-1: none) and its place in the block's group. */
__device__ inline int64_t my_channel(const tsl_bn_walk &w, int *local)
{
    *local = (int)(threadIdx.x % w.group);
    return tsl_bn_walk_channel(&w, blockIdx.y, threadIdx.x);
}

/* Channels of the block's group inside the tile. */
__device__ inline int group_channels(const tsl_bn_walk &w)
{
    int64_t left = w.cext - (int64_t)blockIdx.y * w.group;
    return (int)(left < w.group ? left : w.group);
}

/* f(i) for every element i of tile channel c this thread takes. */
template <typename F> __device__ inline void each_element(const tsl_bn_walk &w, int64_t c, F f)
{
    tsl_bn_cursor cur;
    int64_t i;
    for (int more = tsl_bn_walk_begin(&w, blockIdx.x, threadIdx.x, gridDim.x, c, &cur, &i); more;
         more = tsl_bn_walk_next(&w, c, &cur, &i))
        f(i);
}

/* dy where the forward's y > 0 (x in [lo, hi]), +0 elsewhere, as the CPU masks it. */
__device__ inline float masked(float g, float x, double lo, double hi)
{
    return tsl_bn_keep_f32(g, (x >= (float)lo) & (x <= (float)hi));
}

__device__ inline double masked(double g, double x, double lo, double hi)
{
    return (x >= lo) & (x <= hi) ? g : 0.0;
}

/* acc (zeroed) += per tile channel: sum x, sum x^2. */
template <typename T>
__global__ void stats_kernel(tsl_bn_walk w, int64_t c0, const T *x, tsl_acc *acc)
{
    __shared__ shared_acc shared[2 * group_max];
    const int n = group_channels(w);
    shared_zero(shared, 2 * n);
    __syncthreads();
    int local;
    const int64_t c = my_channel(w, &local);
    if (c >= 0) {
        shared_acc *s = &shared[2 * local];
        thread_acc sum, squares;
        each_element(w, c, [&](int64_t i) {
            T v = x[i];
            add_sum_product(sum, squares, s, v, v);
        });
        sum.flush(&s[0]);
        squares.flush(&s[1]);
    }
    __syncthreads();
    shared_merge_out(shared, acc + 2 * (c0 + (int64_t)blockIdx.y * w.group), 2 * n);
}

/* acc (zeroed) += per tile channel: sum g, sum g x, g being dy (masked by the fused ReLU). */
template <typename T>
__global__ void bwd_stats_kernel(tsl_bn_walk w, int64_t c0, int64_t acc_first, int64_t channels,
                                 int relu, int dtype, const T *x, const T *dy, const double *saved,
                                 const T *gamma, const T *beta, tsl_acc *acc)
{
    __shared__ shared_acc shared[2 * group_max];
    __shared__ double mask_lo[group_max], mask_hi[group_max];
    const int n = group_channels(w);
    const int64_t first = c0 + (int64_t)blockIdx.y * w.group;
    shared_zero(shared, 2 * n);
    if (relu && (int)threadIdx.x < n) {
        const int64_t ch = first + threadIdx.x;
        tsl_bn_relu_mask m = tsl_bn_relu_mask_for(
            dtype, tsl_bn_train_affine(saved[ch], saved[channels + ch], gamma[ch], beta[ch]));
        mask_lo[threadIdx.x] = m.lo;
        mask_hi[threadIdx.x] = m.hi;
    }
    __syncthreads();
    int local;
    const int64_t c = my_channel(w, &local);
    if (c >= 0) {
        shared_acc *s = &shared[2 * local];
        const double lo = relu ? mask_lo[local] : 0.0, hi = relu ? mask_hi[local] : 0.0;
        thread_acc sum, products;
        each_element(w, c, [&](int64_t i) {
            T v = x[i], d = dy[i];
            if (relu)
                d = masked(d, v, lo, hi);
            add_sum_product(sum, products, s, d, v);
        });
        sum.flush(&s[0]);
        products.flush(&s[1]);
    }
    __syncthreads();
    shared_merge_out(shared, acc + 2 * (first - acc_first), 2 * n);
}

__device__ inline float affine(float x, const tsl_bn_affine &f)
{
    return tsl_bn_affine_f32(x, f.mean, f.scale, f.shift);
}

__device__ inline double affine(double x, const tsl_bn_affine &f)
{
    return tsl_bn_affine_f64(x, f.mean, f.scale, f.shift);
}

/* y = affine(x) (max(y, 0) when relu, as the CPU's: NaN gives 0) with the channel's affine:
 * training (p0 = saved) or inference (p0, p1 = running mean and variance). */
template <typename T>
__global__ void affine_kernel(tsl_bn_walk w, int64_t c0, int64_t channels, int relu, int infer,
                              double eps, const void *p0, const T *p1, const T *gamma,
                              const T *beta, const T *x, T *y)
{
    __shared__ tsl_bn_affine f[group_max];
    if ((int)threadIdx.x < group_channels(w)) {
        const int64_t ch = c0 + (int64_t)blockIdx.y * w.group + threadIdx.x;
        if (infer)
            f[threadIdx.x] =
                tsl_bn_infer_affine(((const T *)p0)[ch], p1[ch], gamma[ch], beta[ch], eps);
        else
            f[threadIdx.x] = tsl_bn_train_affine(
                ((const double *)p0)[ch], ((const double *)p0)[channels + ch], gamma[ch], beta[ch]);
    }
    __syncthreads();
    int local;
    const int64_t c = my_channel(w, &local);
    if (c < 0)
        return;
    const tsl_bn_affine k = f[local];
    each_element(w, c, [&](int64_t i) {
        T v = affine(x[i], k);
        y[i] = relu && !(v > 0) ? (T)0 : v;
    });
}

__device__ inline float backward(float g, float x, const double *k)
{
    return tsl_bn_backward_f32(g, x, k[0], k[1], k[2], k[3]);
}

__device__ inline double backward(double g, double x, const double *k)
{
    return tsl_bn_backward_f64(g, x, k[0], k[1], k[2], k[3]);
}

/* dx = gamma invstd (dy - mean(dy) - xhat mean(dy xhat)), dy masked by the fused ReLU. */
template <typename T>
__global__ void bwd_data_kernel(tsl_bn_walk w, int64_t c0, int64_t channels, int relu, int dtype,
                                const T *x, const T *dy, const double *saved, const T *gamma,
                                const T *beta, const double *coef, T *dx)
{
    __shared__ double k[group_max][6]; /* scale, mean, mean_dy, slope, mask lo, mask hi */
    if ((int)threadIdx.x < group_channels(w)) {
        const int64_t ch = c0 + (int64_t)blockIdx.y * w.group + threadIdx.x;
        double *kc = k[threadIdx.x];
        tsl_bn_affine f = tsl_bn_train_affine(saved[ch], saved[channels + ch], gamma[ch], 0.0);
        kc[0] = f.scale;
        kc[1] = f.mean;
        kc[2] = coef[ch];
        kc[3] = tsl_hd_mul(saved[channels + ch], coef[channels + ch]);
        kc[4] = kc[5] = 0.0;
        if (relu) {
            tsl_bn_relu_mask m = tsl_bn_relu_mask_for(
                dtype, tsl_bn_train_affine(saved[ch], saved[channels + ch], gamma[ch], beta[ch]));
            kc[4] = m.lo;
            kc[5] = m.hi;
        }
    }
    __syncthreads();
    int local;
    const int64_t c = my_channel(w, &local);
    if (c < 0)
        return;
    double kk[6];
    for (int i = 0; i < 6; i++)
        kk[i] = k[local][i];
    each_element(w, c, [&](int64_t i) {
        T v = x[i], d = dy[i];
        if (relu)
            d = masked(d, v, kk[4], kk[5]);
        dx[i] = backward(d, v, kk);
    });
}

/* ---- per-channel kernels: one thread per channel of the tensor ---- */

/* From the batch moments: saved (mean, 1 / sqrt(var + eps)) when `saved`, else the running
 * statistic `which` of `running`. */
template <typename T>
__global__ void moments_kernel(int64_t channels, double m, double eps, int which, double momentum,
                               const tsl_acc *acc, double *saved, T *running)
{
    int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= channels)
        return;
    tsl_acc scratch;
    double mean, var;
    tsl_bn_moments(m, &acc[2 * c], &scratch, &mean, &var);
    if (saved) {
        saved[c] = mean;
        saved[channels + c] = tsl_hd_invstd(tsl_hd_add(var, eps));
    } else {
        running[c] = (T)tsl_bn_running_value(m, which, momentum, (double)running[c], mean, var);
    }
}

__global__ void coef_kernel(int64_t channels, double m, const tsl_acc *acc, const double *saved,
                            double *coef)
{
    int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= channels)
        return;
    tsl_acc scratch;
    coef[c] = tsl_hd_div(tsl_acc_round_into(&acc[2 * c], &scratch), m);
    coef[channels + c] =
        tsl_hd_div(tsl_bn_sum_dy_xhat(&acc[2 * c], &scratch, saved[c], saved[channels + c]), m);
}

template <typename T>
__global__ void param_grad_kernel(int64_t channels, int which, const tsl_acc *acc,
                                  const double *saved, T *grad)
{
    int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= channels)
        return;
    tsl_acc scratch;
    grad[c] =
        (T)(which == 1 ? tsl_bn_sum_dy_xhat(&acc[2 * c], &scratch, saved[c], saved[channels + c])
                       : tsl_acc_round_into(&acc[2 * c], &scratch));
}

unsigned channel_blocks(int64_t channels)
{
    return (unsigned)((channels + 63) / 64);
}

void *buf(void *buffers[], int i)
{
    return (void *)STARPU_VECTOR_GET_PTR(buffers[i]);
}

int64_t nx(void *buffers[], int i)
{
    return (int64_t)STARPU_VECTOR_GET_NX(buffers[i]);
}

/* Accumulators of a.acc_count channels from a.acc_first (a stats task's: they hold its tile's). */
bool acc_ok(void *buffers[], int i, const tsl_bn_args &a)
{
    return nx(buffers, i) * (int64_t)sizeof(int64_t) ==
               2 * a.acc_count * (int64_t)sizeof(tsl_acc) &&
           a.acc_first >= 0 && a.acc_first + a.acc_count <= a.channels;
}

bool tile_in_acc(const tsl_bn_args &a)
{
    return a.c0 >= a.acc_first && a.c0 + a.cext <= a.acc_first + a.acc_count;
}

/* The whole tensor's sums (finalize, running statistics, backward coefficients). */
bool acc_all(void *buffers[], int i, const tsl_bn_args &a)
{
    return acc_ok(buffers, i, a) && a.acc_first == 0 && a.acc_count == a.channels;
}

tsl_bn_args unpack(void *cl_arg, const char *what)
{
    tsl_bn_args a;
    starpu_codelet_unpack_args(cl_arg, &a);
    TSL_CODELET_CHECK(a.dtype == TSL_F32 || a.dtype == TSL_F64, what);
    TSL_CODELET_CHECK(a.channels > 0 && a.c0 >= 0 && a.cext >= 0 && a.c0 + a.cext <= a.channels &&
                          a.cext <= max_tile_channels && a.samples >= 0 && a.inner >= 0,
                      what);
    return a;
}

/* Whether a tile kernel has anything to do (a grid needs a channel and an element). */
bool tile_work(const tsl_bn_args &a)
{
    return a.cext > 0 && a.samples * a.inner > 0;
}

} // namespace

extern "C" void tsl_bn_stats_cuda(void *buffers[], void *cl_arg)
{
    tsl_bn_args a = unpack(cl_arg, "bn stats (CUDA): arguments");
    TSL_CODELET_CHECK(nx(buffers, 0) == a.samples * a.cext * a.inner && acc_ok(buffers, 1, a) &&
                          tile_in_acc(a),
                      "bn stats (CUDA): sizes");
    cudaStream_t stream = starpu_cuda_get_local_stream();
    tsl_acc *acc = (tsl_acc *)buf(buffers, 1);
    TSL_CUDA_CHECK(cudaMemsetAsync(acc, 0, (size_t)(2 * a.acc_count) * sizeof(tsl_acc), stream));
    if (tile_work(a)) {
        if (a.dtype == TSL_F32)
            stats_kernel<float><<<tile_grid(a), block_threads, 0, stream>>>(
                walk_of(a), a.c0 - a.acc_first, (const float *)buf(buffers, 0), acc);
        else
            stats_kernel<double><<<tile_grid(a), block_threads, 0, stream>>>(
                walk_of(a), a.c0 - a.acc_first, (const double *)buf(buffers, 0), acc);
        TSL_CUDA_CHECK_LAUNCH();
    }
    normalize(acc, 2 * a.acc_count, stream);
}

extern "C" void tsl_bn_finalize_cuda(void *buffers[], void *cl_arg)
{
    tsl_bn_args a = unpack(cl_arg, "bn finalize (CUDA): arguments");
    TSL_CODELET_CHECK(acc_all(buffers, 0, a) && nx(buffers, 1) == 2 * a.channels,
                      "bn finalize (CUDA): sizes");
    moments_kernel<double><<<channel_blocks(a.channels), 64, 0, starpu_cuda_get_local_stream()>>>(
        a.channels, (double)a.per_channel, a.eps, 0, 0.0, (const tsl_acc *)buf(buffers, 0),
        (double *)buf(buffers, 1), nullptr);
    TSL_CUDA_CHECK_LAUNCH();
}

extern "C" void tsl_bn_running_cuda(void *buffers[], void *cl_arg)
{
    tsl_bn_args a = unpack(cl_arg, "bn running statistics (CUDA): arguments");
    TSL_CODELET_CHECK(acc_all(buffers, 0, a) && nx(buffers, 1) == a.channels,
                      "bn running statistics (CUDA): sizes");
    cudaStream_t stream = starpu_cuda_get_local_stream();
    const tsl_acc *acc = (const tsl_acc *)buf(buffers, 0);
    if (a.dtype == TSL_F32)
        moments_kernel<float><<<channel_blocks(a.channels), 64, 0, stream>>>(
            a.channels, (double)a.per_channel, a.eps, a.which, a.momentum, acc, nullptr,
            (float *)buf(buffers, 1));
    else
        moments_kernel<double><<<channel_blocks(a.channels), 64, 0, stream>>>(
            a.channels, (double)a.per_channel, a.eps, a.which, a.momentum, acc, nullptr,
            (double *)buf(buffers, 1));
    TSL_CUDA_CHECK_LAUNCH();
}

/* Training (saved) or inference (running statistics): the two affine codelets. */
template <typename T>
void launch_affine(const tsl_bn_args &a, int infer, const void *p0, const void *p1,
                   const void *gamma, const void *beta, const void *x, void *y)
{
    affine_kernel<T><<<tile_grid(a), block_threads, 0, starpu_cuda_get_local_stream()>>>(
        walk_of(a), a.c0, a.channels, a.relu, infer, a.eps, p0, (const T *)p1, (const T *)gamma,
        (const T *)beta, (const T *)x, (T *)y);
    TSL_CUDA_CHECK_LAUNCH();
}

extern "C" void tsl_bn_normalize_cuda(void *buffers[], void *cl_arg)
{
    tsl_bn_args a = unpack(cl_arg, "bn normalize (CUDA): arguments");
    TSL_CODELET_CHECK(nx(buffers, 4) == a.samples * a.cext * a.inner &&
                          nx(buffers, 0) == nx(buffers, 4) && nx(buffers, 1) >= 2 * a.channels &&
                          nx(buffers, 2) >= a.channels && nx(buffers, 3) >= a.channels,
                      "bn normalize (CUDA): sizes");
    if (!tile_work(a))
        return;
    if (a.dtype == TSL_F32)
        launch_affine<float>(a, 0, buf(buffers, 1), nullptr, buf(buffers, 2), buf(buffers, 3),
                             buf(buffers, 0), buf(buffers, 4));
    else
        launch_affine<double>(a, 0, buf(buffers, 1), nullptr, buf(buffers, 2), buf(buffers, 3),
                              buf(buffers, 0), buf(buffers, 4));
}

extern "C" void tsl_bn_infer_cuda(void *buffers[], void *cl_arg)
{
    tsl_bn_args a = unpack(cl_arg, "bn inference (CUDA): arguments");
    TSL_CODELET_CHECK(nx(buffers, 5) == a.samples * a.cext * a.inner &&
                          nx(buffers, 0) == nx(buffers, 5) && nx(buffers, 1) >= a.channels &&
                          nx(buffers, 2) >= a.channels && nx(buffers, 3) >= a.channels &&
                          nx(buffers, 4) >= a.channels,
                      "bn inference (CUDA): sizes");
    if (!tile_work(a))
        return;
    if (a.dtype == TSL_F32)
        launch_affine<float>(a, 1, buf(buffers, 1), buf(buffers, 2), buf(buffers, 3),
                             buf(buffers, 4), buf(buffers, 0), buf(buffers, 5));
    else
        launch_affine<double>(a, 1, buf(buffers, 1), buf(buffers, 2), buf(buffers, 3),
                              buf(buffers, 4), buf(buffers, 0), buf(buffers, 5));
}

/* Buffers x, dy, the accumulators, then saved, gamma and beta when ReLU is fused. */
extern "C" void tsl_bn_bwd_stats_cuda(void *buffers[], void *cl_arg)
{
    tsl_bn_args a = unpack(cl_arg, "bn backward stats (CUDA): arguments");
    TSL_CODELET_CHECK(
        acc_ok(buffers, 2, a) && tile_in_acc(a) && nx(buffers, 0) == a.samples * a.cext * a.inner &&
            nx(buffers, 1) == nx(buffers, 0) &&
            (!a.relu || (nx(buffers, 3) == 2 * a.channels && nx(buffers, 4) == a.channels &&
                         nx(buffers, 5) == a.channels)),
        "bn backward stats (CUDA): sizes");
    cudaStream_t stream = starpu_cuda_get_local_stream();
    tsl_acc *acc = (tsl_acc *)buf(buffers, 2);
    TSL_CUDA_CHECK(cudaMemsetAsync(acc, 0, (size_t)(2 * a.acc_count) * sizeof(tsl_acc), stream));
    const double *saved = a.relu ? (const double *)buf(buffers, 3) : nullptr;
    void *gamma = a.relu ? buf(buffers, 4) : nullptr, *beta = a.relu ? buf(buffers, 5) : nullptr;
    if (tile_work(a)) {
        if (a.dtype == TSL_F32)
            bwd_stats_kernel<float><<<tile_grid(a), block_threads, 0, stream>>>(
                walk_of(a), a.c0, a.acc_first, a.channels, a.relu, a.dtype,
                (const float *)buf(buffers, 0), (const float *)buf(buffers, 1), saved,
                (const float *)gamma, (const float *)beta, acc);
        else
            bwd_stats_kernel<double><<<tile_grid(a), block_threads, 0, stream>>>(
                walk_of(a), a.c0, a.acc_first, a.channels, a.relu, a.dtype,
                (const double *)buf(buffers, 0), (const double *)buf(buffers, 1), saved,
                (const double *)gamma, (const double *)beta, acc);
        TSL_CUDA_CHECK_LAUNCH();
    }
    normalize(acc, 2 * a.acc_count, stream);
}

extern "C" void tsl_bn_bwd_coef_cuda(void *buffers[], void *cl_arg)
{
    tsl_bn_args a = unpack(cl_arg, "bn backward coef (CUDA): arguments");
    TSL_CODELET_CHECK(acc_all(buffers, 0, a) && nx(buffers, 1) == 2 * a.channels &&
                          nx(buffers, 2) == 2 * a.channels,
                      "bn backward coef (CUDA): sizes");
    coef_kernel<<<channel_blocks(a.channels), 64, 0, starpu_cuda_get_local_stream()>>>(
        a.channels, (double)a.per_channel, (const tsl_acc *)buf(buffers, 0),
        (const double *)buf(buffers, 1), (double *)buf(buffers, 2));
    TSL_CUDA_CHECK_LAUNCH();
}

extern "C" void tsl_bn_param_grad_cuda(void *buffers[], void *cl_arg)
{
    tsl_bn_args a = unpack(cl_arg, "bn parameter gradient (CUDA): arguments");
    TSL_CODELET_CHECK(acc_all(buffers, 0, a) && nx(buffers, 1) == 2 * a.channels &&
                          nx(buffers, 2) == a.channels,
                      "bn parameter gradient (CUDA): sizes");
    cudaStream_t stream = starpu_cuda_get_local_stream();
    const tsl_acc *acc = (const tsl_acc *)buf(buffers, 0);
    const double *saved = (const double *)buf(buffers, 1);
    if (a.dtype == TSL_F32)
        param_grad_kernel<float><<<channel_blocks(a.channels), 64, 0, stream>>>(
            a.channels, a.which, acc, saved, (float *)buf(buffers, 2));
    else
        param_grad_kernel<double><<<channel_blocks(a.channels), 64, 0, stream>>>(
            a.channels, a.which, acc, saved, (double *)buf(buffers, 2));
    TSL_CUDA_CHECK_LAUNCH();
}

/* Buffers x, dy, saved, gamma, coef, dx, then beta when ReLU is fused. */
extern "C" void tsl_bn_bwd_data_cuda(void *buffers[], void *cl_arg)
{
    tsl_bn_args a = unpack(cl_arg, "bn backward data (CUDA): arguments");
    TSL_CODELET_CHECK(nx(buffers, 5) == a.samples * a.cext * a.inner &&
                          nx(buffers, 0) == nx(buffers, 5) && nx(buffers, 1) == nx(buffers, 5) &&
                          nx(buffers, 2) >= 2 * a.channels && nx(buffers, 3) >= a.channels &&
                          nx(buffers, 4) >= 2 * a.channels &&
                          (!a.relu || nx(buffers, 6) == a.channels),
                      "bn backward data (CUDA): sizes");
    if (!tile_work(a))
        return;
    cudaStream_t stream = starpu_cuda_get_local_stream();
    const double *saved = (const double *)buf(buffers, 2), *coef = (const double *)buf(buffers, 4);
    void *beta = a.relu ? buf(buffers, 6) : nullptr;
    if (a.dtype == TSL_F32)
        bwd_data_kernel<float><<<tile_grid(a), block_threads, 0, stream>>>(
            walk_of(a), a.c0, a.channels, a.relu, a.dtype, (const float *)buf(buffers, 0),
            (const float *)buf(buffers, 1), saved, (const float *)buf(buffers, 3),
            (const float *)beta, coef, (float *)buf(buffers, 5));
    else
        bwd_data_kernel<double><<<tile_grid(a), block_threads, 0, stream>>>(
            walk_of(a), a.c0, a.channels, a.relu, a.dtype, (const double *)buf(buffers, 0),
            (const double *)buf(buffers, 1), saved, (const double *)buf(buffers, 3),
            (const double *)beta, coef, (double *)buf(buffers, 5));
    TSL_CUDA_CHECK_LAUNCH();
}
