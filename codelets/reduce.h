/* Exact-sum family (codelets/reduce.c): the fixed-point accumulator and the codelets that
 * sum tiles into it and merge accumulators (CUDA in reduce.cu; the shared limb arithmetic in
 * reduce_hd.h). */
#ifndef TESSEL_CODELETS_REDUCE_H
#define TESSEL_CODELETS_REDUCE_H

#include <starpu.h>
#include <stdint.h>

#include "tessel/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- exact sum ----
 * A fixed-point accumulator wide enough for every finite double: bit 0 of limb 0 is
 * 2^-1074. Each limb carries 32 bits of the value and spare high bits, so additions
 * deposit without carrying and only an occasional normalisation propagates carries.
 * The sum is exact; tsl_acc_round() rounds it once to double (to nearest, ties to even),
 * so any order of additions and merges gives the same bits. */

#define TSL_ACC_LIMBS 72

typedef struct tsl_acc {
    int64_t limb[TSL_ACC_LIMBS];
    int64_t deposits; /* additions since the last normalisation */
    int64_t nan_count;
    int64_t pos_inf;
    int64_t neg_inf;
    int64_t flagged; /* inputs a kernel rejected (such as labels out of range) */
} tsl_acc;

void tsl_acc_init(tsl_acc *acc);
void tsl_acc_add(tsl_acc *acc, double value);
void tsl_acc_normalize(tsl_acc *acc);
/* dst += src (both normalised or not). */
void tsl_acc_merge(tsl_acc *dst, const tsl_acc *src);
double tsl_acc_round(const tsl_acc *acc);
/* Add `count` elements of `dtype` (f32, f64, i32, u8) exactly. Large float arrays are
 * binned by exponent into integer counters first (float32: or split error-free into double
 * accumulators on CPUs with AVX2, see reduce.c), then each bin or accumulator is deposited
 * once. */
void tsl_acc_add_array(tsl_acc *acc, tsl_dtype dtype, const void *data, int64_t count);
/* Float32 arrays, exactly, through the same paths, any values (subnormals, zeros, signs;
 * infinities and NaNs counted as tsl_acc_add() counts them). A product of two floats is exact
 * in double, so each one adds as tsl_acc_add((double)a[i] * b[i]) would. */
/* acc += sum of x[i]^2. */
void tsl_acc_add_squares_f32(tsl_acc *acc, const float *x, int64_t count);
/* sum += sum of x[i] and squares += sum of x[i]^2, in one pass over x. */
void tsl_acc_add_moments_f32(tsl_acc *sum, tsl_acc *squares, const float *x, int64_t count);
/* acc += sum of a[i] * b[i]. */
void tsl_acc_add_products_f32(tsl_acc *acc, const float *a, const float *b, int64_t count);
/* sum += sum of a[i] and products += sum of a[i] * b[i], in one pass over a and b. */
void tsl_acc_add_sum_products_f32(tsl_acc *sum, tsl_acc *products, const float *a, const float *b,
                                  int64_t count);

/* The columns of a row-major rows x cols block of floats, exactly: for each column c,
 * sum[c * sum_stride] += sum of a[r * cols + c] and product[c * product_stride] += sum of
 * a[r * cols + c] * b[r * cols + c] (b NULL or a: squares); sum or product may be NULL. Each
 * column gets the bits tsl_acc_add_sum_products_f32 gives on that column alone (the sums of a
 * channels-last tile's channels, without transposing it). */
void tsl_acc_add_columns_f32(tsl_acc *sum, int64_t sum_stride, tsl_acc *product,
                             int64_t product_stride, const float *a, const float *b, int64_t rows,
                             int64_t cols);

/* Whether a codelet's vector buffer holds exactly one accumulator. */
static inline int tsl_acc_buffer_ok(void *buffer)
{
    return STARPU_VECTOR_GET_NX(buffer) * STARPU_VECTOR_GET_ELEMSIZE(buffer) == sizeof(tsl_acc);
}

typedef struct tsl_sum_args {
    int32_t dtype;
    int64_t count;
} tsl_sum_args;

/* Whether tsl_cl_sum_sqdiff's buffers fit its arguments: two f32 tiles of at least `count`
 * elements and one accumulator. */
static inline int tsl_sqdiff_buffers_ok(void *buffers[], const tsl_sum_args *a)
{
    uint64_t need = (uint64_t)a->count * 4;
    return tsl_acc_buffer_ok(buffers[2]) && a->dtype == TSL_F32 && a->count >= 0 &&
           need <= (uint64_t)STARPU_VECTOR_GET_NX(buffers[0]) *
                       STARPU_VECTOR_GET_ELEMSIZE(buffers[0]) &&
           need <=
               (uint64_t)STARPU_VECTOR_GET_NX(buffers[1]) * STARPU_VECTOR_GET_ELEMSIZE(buffers[1]);
}

#ifdef TESSEL_USE_CUDA
/* The codelets' CUDA functions (reduce.cu): the same arguments, buffers and bits as the CPU
 * functions, launched on the worker's stream. */
void tsl_sum_partial_cuda(void *buffers[], void *cl_arg);
void tsl_sum_merge_cuda(void *buffers[], void *cl_arg);
void tsl_sum_sqdiff_cuda(void *buffers[], void *cl_arg);
#endif

extern struct starpu_codelet tsl_cl_sum_partial; /* R tile, W acc */
extern struct starpu_codelet tsl_cl_sum_merge;   /* R src acc, RW dst acc */
/* R a, R b (f32 tiles of one layout), W acc: the exact sum of (a - b)^2, differences rounded
 * to float (MGRIT's residual norms); CPU and CUDA give the same bits. */
extern struct starpu_codelet tsl_cl_sum_sqdiff;

#ifdef __cplusplus
}
#endif

#endif /* TESSEL_CODELETS_REDUCE_H */
