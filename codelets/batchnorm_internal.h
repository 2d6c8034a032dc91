/* What the batch normalization files share (codelets/batchnorm_stats.c: the sums;
 * codelets/batchnorm_normalize.c: the elementwise passes and the backward's masked sums;
 * codelets/batchnorm.c: the codelets); private to the family. */
#ifndef TESSEL_CODELETS_BATCHNORM_INTERNAL_H
#define TESSEL_CODELETS_BATCHNORM_INTERNAL_H

#include <stdint.h>
#include <stdlib.h>

#include "batchnorm.h"
#include "codelet.h"

#define ROW_INLINE static inline __attribute__((always_inline))

/* Per-element terms are staged in chunks, in per-thread buffers. */
#define CHUNK 1024
typedef struct stage_buffers {
    double hi[CHUNK], lo[CHUNK], f64[CHUNK];
    float f32[CHUNK];
} stage_buffers;

/* This thread's buffers, through a call: in a shared library a thread-local access may call
 * __tls_get_addr, and compilers redo it inside loops when they see the variable. */
__attribute__((noinline)) stage_buffers *tsl_bn_thread_stage(void);

static inline size_t elem_size(const tsl_bn_args *a)
{
    return a->dtype == TSL_F32 ? sizeof(float) : sizeof(double);
}

/* First element of row (sample s, tile channel c). */
static inline int64_t row_base(const tsl_bn_args *a, int64_t s, int64_t c)
{
    return (s * a->cext + c) * a->inner;
}

/* sum += a[i] and products += a[i] * b[i] for doubles, exactly: a product is its rounded
 * value plus its rounding error (fma), each summed exactly. (Exact unless a product
 * overflows or falls below 2^-969, where the error term is no longer exact.) */
void tsl_bn_add_sum_products_f64(tsl_acc *sum, tsl_acc *products, const double *a, const double *b,
                                 int64_t count);

/* ---- channels-last tiles (N, positions, C) ----
 * The sums of a float32 tile read it in place as a positions x channels block
 * (tsl_acc_add_columns_f32); a float64 tile's transpose blocks of positions into staging rows,
 * one per channel, added as a plain tile's rows are (the sums are exact, so neither way changes
 * a bit); the elementwise passes walk the tile in place with per-channel constants, computing
 * each element with the plain path's own functions. */
#define CL_BLOCK 16384 /* elements per staged block */

/* Positions per staged block of a tile with `cext` channels. */
static inline int64_t cl_positions(const tsl_bn_args *a)
{
    int64_t p = CL_BLOCK / a->cext;
    p = p < 1 ? 1 : p;
    return p < a->inner ? p : a->inner;
}

/* Row stride of a staged block: the positions plus 16 elements. With a power-of-two stride
 * (16384 / 16 channels = 1024 floats, 4 KiB) element i of every row falls in one L1 set, and
 * the transpose's stores to the cext rows evict each other. */
static inline int64_t cl_stride(const tsl_bn_args *a)
{
    return cl_positions(a) + 16;
}

/* Staging for `rows` blocks: rows x cext x cl_stride() elements of the dtype. */
static inline void *cl_staging(const tsl_bn_args *a, int rows)
{
    void *p = malloc((size_t)rows * (size_t)(a->cext * cl_stride(a)) * elem_size(a));
    TSL_CODELET_CHECK(p, "batch norm: out of memory for a staging block");
    return p;
}

/* Stage positions [p0, p0 + n) of sample s: dst[c * S + i] = src[(s, p0 + i, c)], S the row
 * stride (cl_stride()). */
void tsl_bn_cl_transpose(const tsl_bn_args *a, const void *src, void *dst, int64_t s, int64_t p0,
                         int64_t n, int64_t S);

/* Staged row c of a block of row stride S. */
static inline const void *cl_row(const tsl_bn_args *a, const void *stage, int64_t c, int64_t S)
{
    return (const char *)stage + (size_t)(c * S) * elem_size(a);
}

#endif /* TESSEL_CODELETS_BATCHNORM_INTERNAL_H */
