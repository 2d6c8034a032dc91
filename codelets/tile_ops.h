/* Tile-level codelets of the foundation: copies, box copies, fills, elementwise ops,
 * placement marks and the exact sum. A codelet sees one tile (a StarPU vector handle over
 * the tile's bytes) and a small argument struct; it knows nothing of ranks or graphs. */
#ifndef TESSEL_CODELETS_TILE_OPS_H
#define TESSEL_CODELETS_TILE_OPS_H

#include <starpu.h>
#include <stddef.h>
#include <stdint.h>

#include "tessel/tensor.h"

/* ---- box copy: an N-D sub-box between two arrays ---- */

/* Logical dimensions of an array of `ndim` dimensions stored in `layout` (tsl_layout), from
 * outermost to innermost in memory. */
void tsl_layout_order(int32_t layout, int32_t ndim, int32_t *order);

/* Position in memory of each logical dimension of an array of `ndim` dimensions stored in
 * `layout` (tsl_layout): stride[d] for logical dimension d, from the array's logical extents.
 * Plain arrays are C order; channels-last ones store N, then the spatial dimensions, then C. */
void tsl_layout_strides(int32_t layout, int32_t ndim, const int64_t *extent, int64_t *stride);

typedef struct tsl_box_copy_args {
    int32_t ndim;
    int32_t elem_size;
    int32_t src_layout; /* tsl_layout of the source array */
    int32_t dst_layout;
    int32_t accumulate;               /* 0: dst = src; 1: dst += src (f32 only) */
    int32_t narrow_labels;            /* 1: the source holds i64 labels, written narrowed to the
                                       * destination's integer type (elem_size 1: u8, 4: i32); a
                                       * value that type cannot hold becomes 255 or -1 */
    int64_t src_extent[TSL_MAX_DIMS]; /* shape of the source array */
    int64_t src_offset[TSL_MAX_DIMS]; /* first element of the box in the source */
    int64_t dst_extent[TSL_MAX_DIMS];
    int64_t dst_offset[TSL_MAX_DIMS];
    int64_t box[TSL_MAX_DIMS]; /* box size */
} tsl_box_copy_args;

/* Copy (or, with `accumulate`, add) the box (extents and offsets are logical, in N C D H W
 * order); rows move with memcpy where both arrays store the destination's innermost dimension
 * contiguously. Pure. */
void tsl_box_copy(const tsl_box_copy_args *args, void *dst, const void *src);

/* dst = the box of src + addend, the addend stored like dst (f32). Pure. */
void tsl_box_add(const tsl_box_copy_args *args, float *dst, const float *src, const float *addend);

/* R src, W|RW dst: box copy between two tiles; with a third handle (R addend, stored like dst,
 * f32, no accumulate), dst = box of src + addend (tsl_box_add). */
extern struct starpu_codelet tsl_cl_box_copy;

/* ---- pack ---- */

#define TSL_PACK_MAX 31 /* pieces per pack task (one more handle: the pack) */

typedef struct tsl_pack_args {
    int32_t n;      /* pieces */
    int32_t unpack; /* 0: pieces (buffers 0 .. n-1) into the pack (buffer n); 1: the pack
                     * (buffer 0) into the pieces (buffers 1 .. n) */
    int64_t offset[TSL_PACK_MAX]; /* each piece's first byte in the pack */
} tsl_pack_args;

/* Copy whole vectors into or out of one byte range each of a packed vector. Pure. */
void tsl_pack(const tsl_pack_args *args, void *pack, size_t pack_bytes, void *const *pieces,
              const size_t *bytes);

/* Variable buffers, see tsl_pack_args. */
extern struct starpu_codelet tsl_cl_pack;
/* R src, W dst: whole-buffer copy of two handles of equal size (args: none). */
extern struct starpu_codelet tsl_cl_copy;

/* ---- fill ---- */

typedef enum tsl_fill_mode {
    TSL_FILL_CONSTANT = 0,
    TSL_FILL_UNIFORM = 1,
    TSL_FILL_NORMAL = 2,
} tsl_fill_mode;

typedef struct tsl_fill_args {
    int32_t dtype;
    int32_t mode;
    int32_t ndim;
    uint64_t seed;
    double a;                             /* constant value, uniform low, normal mean */
    double b;                             /* uniform high, normal stddev */
    int32_t layout;                       /* tsl_layout of the tile's storage */
    int64_t global_strides[TSL_MAX_DIMS]; /* C-order strides of the whole tensor */
    int64_t start[TSL_MAX_DIMS];          /* tile start in the whole tensor */
    int64_t extent[TSL_MAX_DIMS];         /* tile size */
} tsl_fill_args;

/* Value of element `index` of a seeded fill: depends on (seed, index) only. Pure. */
double tsl_fill_value(const tsl_fill_args *args, uint64_t index);

/* Fill a tile buffer. Pure. */
void tsl_fill_tile(const tsl_fill_args *args, void *tile);

/* W tile. */
extern struct starpu_codelet tsl_cl_fill;
extern struct starpu_codelet tsl_cl_zero; /* (W tile): all bytes 0 */

/* ---- elementwise: scale, axpy, add ---- */

typedef struct tsl_elementwise_args {
    int32_t dtype; /* TSL_F32 or TSL_F64 */
    int64_t count;
    double alpha;
} tsl_elementwise_args;

extern struct starpu_codelet tsl_cl_scale; /* RW x:      x = alpha x */
extern struct starpu_codelet tsl_cl_axpy;  /* R x, RW y: y += alpha x */
extern struct starpu_codelet tsl_cl_add;   /* R a, R b, W|RW dst: dst = a + b */

/* ---- placement marks ---- */

typedef struct tsl_mark_args {
    int32_t rank; /* rank the task was placed on */
    int64_t count;
} tsl_mark_args;

/* W tile (i32): every element = rank * 1000 + worker id. */
extern struct starpu_codelet tsl_cl_mark;

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

typedef struct tsl_sum_args {
    int32_t dtype;
    int64_t count;
} tsl_sum_args;

extern struct starpu_codelet tsl_cl_sum_partial; /* R tile, W acc */
extern struct starpu_codelet tsl_cl_sum_merge;   /* R src acc, RW dst acc */

#endif /* TESSEL_CODELETS_TILE_OPS_H */
