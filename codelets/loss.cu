/* Losses on CUDA: cross-entropy, MSE and argmax hits of a tile into an exact accumulator (with
 * the gradient when asked), and soft Dice's statistics, coefficients and gradient, with the
 * CPU's per-position functions (loss_math.h) and exact sums (reduce_cuda.cuh). The sums add
 * the same per-position values the CPU adds; those without exp or log (MSE, hits, the counts
 * of bad labels, Dice's label counts) are the CPU's bits. */
#include <starpu.h>

#include "cuda_check.h"
#include "loss.h"
#include "loss_math.h"
#include "reduce_cuda.cuh"

namespace
{

using namespace tsl_exact;

constexpr int64_t max_dice_classes = 1024; /* the CPU's limit (loss.c) */

/* Adds the block's bad-label count to out->flagged. */
__device__ inline void add_flagged(unsigned long long *block_flagged, unsigned count)
{
    if (count)
        atomicAdd(block_flagged, (unsigned long long)count);
}

/* acc (zeroed) += the tile's losses (or hits); grad written when not NULL. One thread per
 * position (cross-entropy, hits) or element (MSE). */
__global__ void loss_kernel(tsl_loss_args a, const void *x, const void *target, void *grad,
                            tsl_acc *acc)
{
    __shared__ shared_acc s;
    __shared__ unsigned long long flagged;
    shared_zero(&s, 1);
    if (threadIdx.x == 0)
        flagged = 0;
    __syncthreads();
    thread_acc t;
    unsigned bad = 0;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    const int64_t n =
        TSL_LOSS_ELEMENTWISE(a.kind) ? a.samples * a.classes * a.inner : a.samples * a.inner;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        if (a.kind == TSL_LOSS_MSE) {
            t.add(&s, tsl_loss_mse_at(&a, x, target, i, grad));
            continue;
        }
        if (a.kind == TSL_LOSS_L1) {
            t.add(&s, tsl_loss_l1_at(&a, x, target, i, grad));
            continue;
        }
        int64_t sample = i / a.inner, v = i - sample * a.inner;
        int64_t base = tsl_loss_logit_base(&a, sample, v);
        int64_t label = tsl_loss_label(a.label_dtype, target, i);
        if (label < 0 || label >= a.classes) {
            bad++;
            if (grad && a.kind == TSL_LOSS_CROSS_ENTROPY)
                tsl_loss_zero_at(&a, base, grad);
            continue;
        }
        if (a.kind == TSL_LOSS_HITS) {
            if (tsl_loss_hit_at(&a, x, base, label))
                t.add(&s, 1.0); /* the CPU adds the count once: the same exact sum */
        } else {
            t.add(&s, tsl_loss_cross_entropy_at(&a, x, base, label, grad));
        }
    }
    t.flush(&s);
    add_flagged(&flagged, bad);
    __syncthreads();
    if (threadIdx.x == 0 && flagged)
        atomicAdd((unsigned long long *)&acc->flagged, flagged);
    shared_merge_out(&s, acc, 1);
}

/* Dice statistics of class blockIdx.y: I += p where the label is the class, P += p,
 * G += 1 where the label is the class; bad labels counted (by class 0's blocks) in
 * acc[0].flagged. */
__global__ void dice_stats_kernel(tsl_loss_args a, const void *x, const void *labels, tsl_acc *acc)
{
    __shared__ shared_acc s[3];
    __shared__ unsigned long long flagged;
    shared_zero(s, 3);
    if (threadIdx.x == 0)
        flagged = 0;
    __syncthreads();
    const int64_t c = blockIdx.y, stride = (int64_t)gridDim.x * blockDim.x;
    const int64_t n = a.samples * a.inner, class_stride = tsl_loss_class_stride(&a);
    thread_acc inter, p_sum, g_sum;
    unsigned bad = 0;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        int64_t sample = i / a.inner, v = i - sample * a.inner;
        int64_t base = tsl_loss_logit_base(&a, sample, v);
        int64_t label = tsl_loss_label(a.label_dtype, labels, i);
        if (label < 0 || label >= a.classes) {
            bad += c == 0;
            continue;
        }
        double top, total;
        tsl_loss_softmax_terms(&a, x, base, &top, &total);
        double p = tsl_dice_p(tsl_loss_load(a.dtype, x, base + c * class_stride), top, total);
        p_sum.add(&s[1], p);
        if (label == c) {
            inter.add(&s[0], p);
            g_sum.add(&s[2], 1.0);
        }
    }
    inter.flush(&s[0]);
    p_sum.flush(&s[1]);
    g_sum.flush(&s[2]);
    add_flagged(&flagged, bad);
    __syncthreads();
    if (threadIdx.x == 0 && flagged)
        atomicAdd((unsigned long long *)&acc[0].flagged, flagged);
    shared_merge_out(s, acc + 3 * c, 3);
}

__global__ void dice_coef_kernel(tsl_loss_args a, const tsl_acc *acc, double *coef)
{
    int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= a.classes)
        return;
    tsl_acc scratch;
    double inter = tsl_acc_round_into(&acc[3 * c], &scratch);
    double p_sum = tsl_acc_round_into(&acc[3 * c + 1], &scratch);
    double g_sum = tsl_acc_round_into(&acc[3 * c + 2], &scratch);
    tsl_dice_coef_class(inter, p_sum, g_sum, a.smooth, (double)a.classes, &coef[c],
                        &coef[a.classes + c]);
}

/* Dice's gradient through the softmax, one thread per position: dz_c = p_c (dp_c - sum_k p_k
 * dp_k), p recomputed per class (the CPU's bits of p: tsl_dice_p). */
__global__ void dice_grad_kernel(tsl_loss_args a, const void *x, const void *labels,
                                 const double *coef, void *grad)
{
    const int64_t stride = (int64_t)gridDim.x * blockDim.x, C = a.classes;
    const int64_t n = a.samples * a.inner, class_stride = tsl_loss_class_stride(&a);
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        int64_t sample = i / a.inner, v = i - sample * a.inner;
        int64_t base = tsl_loss_logit_base(&a, sample, v);
        int64_t label = tsl_loss_label(a.label_dtype, labels, i);
        if (label < 0 || label >= C) {
            tsl_loss_zero_at(&a, base, grad);
            continue;
        }
        double top, total, dot = 0;
        tsl_loss_softmax_terms(&a, x, base, &top, &total);
        for (int64_t c = 0; c < C; c++) {
            double p = tsl_dice_p(tsl_loss_load(a.dtype, x, base + c * class_stride), top, total);
            dot = tsl_hd_add(dot, tsl_hd_mul(p, tsl_dice_dp(coef, C, c, label)));
        }
        for (int64_t c = 0; c < C; c++) {
            double p = tsl_dice_p(tsl_loss_load(a.dtype, x, base + c * class_stride), top, total);
            tsl_loss_store(a.dtype, grad, base + c * class_stride,
                           tsl_hd_mul(p, tsl_hd_sub(tsl_dice_dp(coef, C, c, label), dot)));
        }
    }
}

/* The two Gram matrices, one thread per entry (gram: Ga then Gb, n x n each). */
__global__ void diff_gram_kernel(tsl_diff_args d, const void *a, const void *b, double *gram)
{
    const int64_t nn = d.n * d.n, stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < 2 * nn; t += stride) {
        int64_t e = t % nn, i = e / d.n, j = e - i * d.n;
        gram[t] =
            t < nn ? tsl_diff_gram(d.dtype, a, d.fa, i, j) : tsl_diff_gram(d.dtype, b, d.fb, i, j);
    }
}

/* acc (zeroed) += Ga[e] Gb[e] over the n^2 entries, exactly (the CPU's sum). */
__global__ void diff_loss_kernel(int64_t nn, const double *gram, tsl_acc *acc)
{
    __shared__ shared_acc s;
    shared_zero(&s, 1);
    __syncthreads();
    thread_acc t;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < nn; e += stride)
        t.add(&s, tsl_hd_mul(gram[e], gram[nn + e]));
    t.flush(&s);
    __syncthreads();
    shared_merge_out(&s, acc, 1);
}

/* The gradients 2 Gb A and 2 Ga B, one thread per element (da's, then db's). */
__global__ void diff_grad_kernel(tsl_diff_args d, const void *a, const void *b, const double *gram,
                                 void *da, void *db)
{
    const int64_t na = d.n * d.fa, total = na + d.n * d.fb, nn = d.n * d.n;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += stride) {
        if (t < na)
            tsl_loss_store(d.dtype, da, t,
                           tsl_diff_grad(d.dtype, a, d.n, d.fa, gram + nn, t / d.fa, t % d.fa));
        else
            tsl_loss_store(
                d.dtype, db, t - na,
                tsl_diff_grad(d.dtype, b, d.n, d.fb, gram, (t - na) / d.fb, (t - na) % d.fb));
    }
}

/* The similarity loss's n^2 x 3 kernel values, one thread per pair (w: aa, bb, ab), their sum
 * into acc (zeroed) exactly as the CPU adds them: k for aa and bb, -2 k for ab. */
__global__ void sim_pairs_kernel(tsl_diff_args d, const void *a, const void *b, double *w,
                                 tsl_acc *acc)
{
    __shared__ shared_acc s;
    shared_zero(&s, 1);
    __syncthreads();
    thread_acc t;
    const int64_t nn = d.n * d.n, stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t p = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; p < 3 * nn; p += stride) {
        int64_t which = p / nn, e = p - which * nn, i = e / d.n, j = e - i * d.n;
        const void *x = which == 1 ? b : a, *y = which == 0 ? a : b;
        double k;
        tsl_mmd_kernel(tsl_mmd_dist(d.dtype, x, y, d.fa, i, j), &k, &w[p]);
        t.add(&s, which == 2 ? tsl_hd_mul(-2.0, k) : k);
    }
    t.flush(&s);
    __syncthreads();
    shared_merge_out(&s, acc, 1);
}

/* The similarity loss's gradients, one thread per element (da's, then db's). */
__global__ void sim_grad_kernel(tsl_diff_args d, const void *a, const void *b, const double *w,
                                void *da, void *db)
{
    const int64_t na = d.n * d.fa, nn = d.n * d.n;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < 2 * na; t += stride) {
        int64_t e = t < na ? t : t - na, i = e / d.fa, k = e - i * d.fa;
        if (t < na)
            tsl_loss_store(d.dtype, da, e,
                           tsl_mmd_grad(d.dtype, a, b, d.n, d.fa, w, w + 2 * nn, d.n, 1, i, k));
        else
            tsl_loss_store(
                d.dtype, db, e,
                tsl_mmd_grad(d.dtype, b, a, d.n, d.fa, w + nn, w + 2 * nn, 1, d.n, i, k));
    }
}

void *buf(void *buffers[], int i)
{
    return (void *)STARPU_VECTOR_GET_PTR(buffers[i]);
}

int64_t nx(void *buffers[], int i)
{
    return (int64_t)STARPU_VECTOR_GET_NX(buffers[i]);
}

tsl_loss_args unpack(void *cl_arg, const char *what)
{
    tsl_loss_args a;
    starpu_codelet_unpack_args(cl_arg, &a);
    TSL_CODELET_CHECK(a.dtype == TSL_F32 || a.dtype == TSL_F64, what);
    TSL_CODELET_CHECK(a.samples >= 0 && a.classes >= 0 && a.inner >= 0, what);
    return a;
}

} // namespace

extern "C" void tsl_loss_cuda(void *buffers[], void *cl_arg)
{
    tsl_loss_args a = unpack(cl_arg, "loss (CUDA): arguments");
    unsigned nbuffers = starpu_task_get_current()->nbuffers;
    TSL_CODELET_CHECK(nbuffers == 3 || nbuffers == 4, "loss (CUDA): buffers");
    TSL_CODELET_CHECK(a.kind == TSL_LOSS_CROSS_ENTROPY || TSL_LOSS_ELEMENTWISE(a.kind) ||
                          a.kind == TSL_LOSS_HITS,
                      "loss (CUDA): kind");
    const int64_t elements = a.samples * a.classes * a.inner;
    TSL_CODELET_CHECK(
        nx(buffers, 0) >= elements &&
            nx(buffers, 1) >= (TSL_LOSS_ELEMENTWISE(a.kind) ? elements : a.samples * a.inner) &&
            tsl_acc_buffer_ok(buffers[2]) && (nbuffers == 3 || nx(buffers, 3) >= elements),
        "loss (CUDA): sizes");
    cudaStream_t stream = starpu_cuda_get_local_stream();
    tsl_acc *acc = (tsl_acc *)buf(buffers, 2);
    TSL_CUDA_CHECK(cudaMemsetAsync(acc, 0, sizeof(tsl_acc), stream));
    const int64_t n = TSL_LOSS_ELEMENTWISE(a.kind) ? elements : a.samples * a.inner;
    if (n > 0) {
        loss_kernel<<<grid_for(n), block_threads, 0, stream>>>(
            a, buf(buffers, 0), buf(buffers, 1), nbuffers == 4 ? buf(buffers, 3) : nullptr, acc);
        TSL_CUDA_CHECK_LAUNCH();
    }
    normalize(acc, 1, stream);
}

extern "C" void tsl_dice_stats_cuda(void *buffers[], void *cl_arg)
{
    tsl_loss_args a = unpack(cl_arg, "dice stats (CUDA): arguments");
    TSL_CODELET_CHECK(a.classes <= max_dice_classes, "dice: too many classes");
    TSL_CODELET_CHECK(nx(buffers, 0) >= a.samples * a.classes * a.inner &&
                          nx(buffers, 1) >= a.samples * a.inner &&
                          nx(buffers, 2) * (int64_t)STARPU_VECTOR_GET_ELEMSIZE(buffers[2]) >=
                              3 * a.classes * (int64_t)sizeof(tsl_acc),
                      "dice stats (CUDA): sizes");
    cudaStream_t stream = starpu_cuda_get_local_stream();
    tsl_acc *acc = (tsl_acc *)buf(buffers, 2);
    TSL_CUDA_CHECK(cudaMemsetAsync(acc, 0, (size_t)(3 * a.classes) * sizeof(tsl_acc), stream));
    const int64_t n = a.samples * a.inner;
    if (n > 0 && a.classes > 0) {
        /* per class, enough blocks to fill the GPU with every class */
        int64_t per_class = max_grid / a.classes > 1 ? max_grid / a.classes : 1;
        int64_t b = (n + block_threads - 1) / block_threads;
        b = b < per_class ? b : per_class;
        int64_t need = (n + block_elements - 1) / block_elements;
        b = b > need ? b : need;
        dice_stats_kernel<<<dim3((unsigned)b, (unsigned)a.classes), block_threads, 0, stream>>>(
            a, buf(buffers, 0), buf(buffers, 1), acc);
        TSL_CUDA_CHECK_LAUNCH();
    }
    normalize(acc, 3 * a.classes, stream);
}

extern "C" void tsl_dice_coef_cuda(void *buffers[], void *cl_arg)
{
    tsl_loss_args a = unpack(cl_arg, "dice coef (CUDA): arguments");
    TSL_CODELET_CHECK(nx(buffers, 0) * (int64_t)STARPU_VECTOR_GET_ELEMSIZE(buffers[0]) >=
                              3 * a.classes * (int64_t)sizeof(tsl_acc) &&
                          nx(buffers, 1) >= 2 * a.classes,
                      "dice coef (CUDA): sizes");
    if (a.classes == 0)
        return;
    dice_coef_kernel<<<(unsigned)((a.classes + 63) / 64), 64, 0, starpu_cuda_get_local_stream()>>>(
        a, (const tsl_acc *)buf(buffers, 0), (double *)buf(buffers, 1));
    TSL_CUDA_CHECK_LAUNCH();
}

extern "C" void tsl_dice_grad_cuda(void *buffers[], void *cl_arg)
{
    tsl_loss_args a = unpack(cl_arg, "dice grad (CUDA): arguments");
    TSL_CODELET_CHECK(a.classes <= max_dice_classes, "dice: too many classes");
    TSL_CODELET_CHECK(nx(buffers, 0) >= a.samples * a.classes * a.inner &&
                          nx(buffers, 1) >= a.samples * a.inner &&
                          nx(buffers, 2) >= 2 * a.classes &&
                          nx(buffers, 3) >= a.samples * a.classes * a.inner,
                      "dice grad (CUDA): sizes");
    const int64_t n = a.samples * a.inner;
    if (n == 0)
        return;
    cudaStream_t stream = starpu_cuda_get_local_stream();
    dice_grad_kernel<<<grid_for(n), block_threads, 0, stream>>>(
        a, buf(buffers, 0), buf(buffers, 1), (const double *)buf(buffers, 2), buf(buffers, 3));
    TSL_CUDA_CHECK_LAUNCH();
}

/* The difference and similarity codelets' buffers: R a, R b, W scratch (`scratch` doubles per
 * n^2), W acc, and W da, W db for the gradient. */
static bool pair_buffers_ok(void *buffers[], unsigned nbuffers, const tsl_diff_args &d,
                            int64_t scratch)
{
    return (nbuffers == 4 || nbuffers == 6) && (d.dtype == TSL_F32 || d.dtype == TSL_F64) &&
           d.n >= 0 && d.fa >= 0 && d.fb >= 0 && nx(buffers, 0) >= d.n * d.fa &&
           nx(buffers, 1) >= d.n * d.fb && nx(buffers, 2) >= scratch * d.n * d.n &&
           tsl_acc_buffer_ok(buffers[3]);
}

extern "C" void tsl_difference_cuda(void *buffers[], void *cl_arg)
{
    tsl_diff_args d;
    starpu_codelet_unpack_args(cl_arg, &d);
    unsigned nbuffers = starpu_task_get_current()->nbuffers;
    TSL_CODELET_CHECK(pair_buffers_ok(buffers, nbuffers, d, 2),
                      "difference (CUDA): buffers and sizes");
    cudaStream_t stream = starpu_cuda_get_local_stream();
    tsl_acc *acc = (tsl_acc *)buf(buffers, 3);
    double *gram = (double *)buf(buffers, 2);
    TSL_CUDA_CHECK(cudaMemsetAsync(acc, 0, sizeof(tsl_acc), stream));
    const int64_t nn = d.n * d.n;
    if (nn > 0) {
        diff_gram_kernel<<<grid_for(2 * nn), block_threads, 0, stream>>>(d, buf(buffers, 0),
                                                                         buf(buffers, 1), gram);
        TSL_CUDA_CHECK_LAUNCH();
        diff_loss_kernel<<<grid_for(nn), block_threads, 0, stream>>>(nn, gram, acc);
        TSL_CUDA_CHECK_LAUNCH();
        const int64_t total = d.n * (d.fa + d.fb);
        if (nbuffers == 6 && total > 0) {
            diff_grad_kernel<<<grid_for(total), block_threads, 0, stream>>>(
                d, buf(buffers, 0), buf(buffers, 1), gram, buf(buffers, 4), buf(buffers, 5));
            TSL_CUDA_CHECK_LAUNCH();
        }
    }
    normalize(acc, 1, stream);
}

extern "C" void tsl_similarity_cuda(void *buffers[], void *cl_arg)
{
    tsl_diff_args d;
    starpu_codelet_unpack_args(cl_arg, &d);
    unsigned nbuffers = starpu_task_get_current()->nbuffers;
    TSL_CODELET_CHECK(pair_buffers_ok(buffers, nbuffers, d, 3) && d.fa == d.fb,
                      "similarity (CUDA): buffers and sizes");
    cudaStream_t stream = starpu_cuda_get_local_stream();
    tsl_acc *acc = (tsl_acc *)buf(buffers, 3);
    double *w = (double *)buf(buffers, 2);
    TSL_CUDA_CHECK(cudaMemsetAsync(acc, 0, sizeof(tsl_acc), stream));
    const int64_t nn = d.n * d.n;
    if (nn > 0) {
        sim_pairs_kernel<<<grid_for(3 * nn), block_threads, 0, stream>>>(d, buf(buffers, 0),
                                                                         buf(buffers, 1), w, acc);
        TSL_CUDA_CHECK_LAUNCH();
        const int64_t total = 2 * d.n * d.fa;
        if (nbuffers == 6 && total > 0) {
            sim_grad_kernel<<<grid_for(total), block_threads, 0, stream>>>(
                d, buf(buffers, 0), buf(buffers, 1), w, buf(buffers, 4), buf(buffers, 5));
            TSL_CUDA_CHECK_LAUNCH();
        }
    }
    normalize(acc, 1, stream);
}
