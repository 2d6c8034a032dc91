/* Exact sums on CUDA, shared by the families that use them (reduce.cu, batchnorm.cu,
 * loss.cu): per-block accumulators in shared memory, merged into tsl_acc outputs in global
 * memory, normalised at the end, with the limb arithmetic of reduce_hd.h (the CPU's own).
 *
 * A value deposits its pieces (tsl_acc_split_double) into a thread's cache of one limb
 * window (limbs k .. k + 2; values of a tensor mostly share k, as a limb spans 32 binades),
 * flushed into the block's shared limbs with 64-bit atomicAdd when k changes and at the end.
 * Limbs are signed, added as unsigned long long: two's complement wraps to the right value
 * as long as no limb's true value leaves the int64 range. Bound: a block takes at most
 * block_elements + block_threads elements (grid_for below) and every element makes at most
 * two deposits into one accumulator (a double product's rounded value and its error), each
 * under 2^32 in magnitude in any limb, so a shared limb stays below (2^27 + 512) 2^32 < 2^60. The
 * block then normalises its limbs (each in [0, 2^32), the top one signed and small) and adds them
 * to the output's limbs with global atomics: at most 2^31 blocks add under 2^32 each, below 2^63. A
 * last kernel normalises the outputs exactly as the CPU does. Integer addition is associative, so
 * the order of the atomics changes no bit: the result equals the CPU's normalised accumulator (the
 * normalised form of a value is unique). */
#ifndef TESSEL_CODELETS_REDUCE_CUDA_CUH
#define TESSEL_CODELETS_REDUCE_CUDA_CUH

#include <starpu.h>

#include "cuda_check.h"
#include "reduce.h"
#include "reduce_hd.h"

namespace tsl_exact
{

constexpr int block_threads = 256;
constexpr int64_t block_elements = (int64_t)1 << 26; /* TSL_ACC_BLOCK_ELEMENTS above */
constexpr int64_t max_grid = 2048;                   /* enough blocks to fill a GPU */

/* Blocks for n elements (grid-stride): enough to fill the GPU, and enough that none takes
 * more than block_elements + block_threads elements (the bound above). */
inline unsigned grid_for(int64_t n)
{
    int64_t b = (n + block_threads - 1) / block_threads;
    b = b < max_grid ? b : max_grid;
    int64_t need = (n + block_elements - 1) / block_elements;
    b = b > need ? b : need;
    return (unsigned)(b > 0 ? b : 1);
}

/* One accumulator in shared memory. */
struct shared_acc {
    unsigned long long limb[TSL_ACC_LIMBS];
    unsigned long long nan_count, pos_inf, neg_inf;
};

__device__ inline void shared_zero(shared_acc *s, int count)
{
    unsigned long long *w = &s[0].limb[0];
    int words = count * (int)(sizeof(shared_acc) / sizeof(unsigned long long));
    for (int i = threadIdx.x; i < words; i += blockDim.x)
        w[i] = 0;
}

/* A thread's pending deposits into one accumulator: limbs k .. k + 2 and the counts. */
struct thread_acc {
    int k;
    long long piece[3];
    unsigned nan_count, pos_inf, neg_inf;

    __device__ thread_acc() : k(-1), piece{0, 0, 0}, nan_count(0), pos_inf(0), neg_inf(0)
    {
    }

    __device__ void flush_pieces(shared_acc *s)
    {
        if (k >= 0)
            for (int j = 0; j < 3; j++)
                if (piece[j])
                    atomicAdd(&s->limb[k + j], (unsigned long long)piece[j]);
        k = -1;
        piece[0] = piece[1] = piece[2] = 0;
    }

    /* Everything pending into s: call once, at the end. */
    __device__ void flush(shared_acc *s)
    {
        flush_pieces(s);
        if (nan_count)
            atomicAdd(&s->nan_count, (unsigned long long)nan_count);
        if (pos_inf)
            atomicAdd(&s->pos_inf, (unsigned long long)pos_inf);
        if (neg_inf)
            atomicAdd(&s->neg_inf, (unsigned long long)neg_inf);
    }

    /* Pieces for limbs at `at` (from tsl_acc_split). */
    __device__ void pieces(shared_acc *s, int at, const int64_t p[3])
    {
        if (at != k) {
            flush_pieces(s);
            k = at;
        }
        piece[0] += p[0];
        piece[1] += p[1];
        piece[2] += p[2];
    }

    /* Adds v as tsl_acc_add() does. */
    __device__ void add(shared_acc *s, double v)
    {
        int at;
        int64_t p[3];
        switch (tsl_acc_split_double(v, &at, p)) {
        case TSL_ACC_PIECES:
            pieces(s, at, p);
            break;
        case TSL_ACC_NAN:
            nan_count++;
            break;
        case TSL_ACC_POS_INF:
            pos_inf++;
            break;
        case TSL_ACC_NEG_INF:
            neg_inf++;
            break;
        default:
            break;
        }
    }

    /* Adds the integer v at 2^0 (i32 and u8 sums). */
    __device__ void add_integer(shared_acc *s, long long v)
    {
        int at;
        int64_t p[3];
        unsigned long long magnitude = v < 0 ? 0ull - (unsigned long long)v : (unsigned long long)v;
        if (tsl_acc_split(magnitude, 0, v < 0, &at, p))
            pieces(s, at, p);
    }
};

/* One block accumulator normalised and added into *out with global atomics. */
__device__ inline void shared_merge_one(shared_acc *acc, tsl_acc *out)
{
    long long carry = 0;
    for (int k = 0; k < TSL_ACC_LIMBS; k++) {
        long long v = (long long)acc->limb[k] + carry;
        if (k < TSL_ACC_LIMBS - 1) {
            carry = v >> TSL_ACC_LIMB_BITS; /* arithmetic: floor */
            v -= carry * ((long long)1 << TSL_ACC_LIMB_BITS);
        }
        if (v)
            atomicAdd((unsigned long long *)&out->limb[k], (unsigned long long)v);
    }
    if (acc->nan_count)
        atomicAdd((unsigned long long *)&out->nan_count, acc->nan_count);
    if (acc->pos_inf)
        atomicAdd((unsigned long long *)&out->pos_inf, acc->pos_inf);
    if (acc->neg_inf)
        atomicAdd((unsigned long long *)&out->neg_inf, acc->neg_inf);
}

/* After a __syncthreads(): the block's accumulators normalised (thread 0 of each warp takes
 * some) and added into out[0 .. count) with global atomics. Ends synchronised. */
__device__ inline void shared_merge_out(shared_acc *s, tsl_acc *out, int count)
{
    for (int a = threadIdx.x; a < count; a += blockDim.x)
        shared_merge_one(&s[a], &out[a]);
    __syncthreads();
}

/* out[0 .. count) normalised, as tsl_acc_normalize(). */
static __global__ void normalize_accs(tsl_acc *out, int64_t count)
{
    int64_t a = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (a < count) {
        tsl_acc_normalize_limbs(out[a].limb);
        out[a].deposits = 0;
    }
}

/* Launches normalize_accs over count accumulators on `stream`. */
inline void normalize(tsl_acc *out, int64_t count, cudaStream_t stream)
{
    if (count <= 0)
        return;
    normalize_accs<<<(unsigned)((count + 63) / 64), 64, 0, stream>>>(out, count);
    TSL_CUDA_CHECK_LAUNCH();
}

/* dst[i] += src[i] for count accumulators, as tsl_acc_merge(). */
static __global__ void merge_accs(tsl_acc *dst, const tsl_acc *src, int64_t count)
{
    int64_t a = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (a < count) {
        tsl_acc scratch;
        tsl_acc_merge_into(&dst[a], &src[a], &scratch);
    }
}

/* sum += a, products += a b (each as the CPU adds it: a float product is exact in double; a
 * double product as its rounded value and its rounding error). */
__device__ inline void add_sum_product(thread_acc &sum, thread_acc &prod, shared_acc *s, float a,
                                       float b)
{
    sum.add(&s[0], (double)a);
    prod.add(&s[1], __dmul_rn((double)a, (double)b));
}

__device__ inline void add_sum_product(thread_acc &sum, thread_acc &prod, shared_acc *s, double a,
                                       double b)
{
    sum.add(&s[0], a);
    double hi = __dmul_rn(a, b);
    prod.add(&s[1], hi);
    prod.add(&s[1], fma(a, b, -hi));
}

} // namespace tsl_exact

#endif /* TESSEL_CODELETS_REDUCE_CUDA_CUH */
