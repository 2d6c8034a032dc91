/* Copy family (codelets/copy.c, CUDA in copy.cu): N-D box copies between tiles of any layout, packs
 * of whole vectors into one buffer and whole-buffer copies. */
#ifndef TESSEL_CODELETS_COPY_H
#define TESSEL_CODELETS_COPY_H

#include <starpu.h>
#include <stddef.h>
#include <stdint.h>

#include "tessel/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

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

/* A box copy's loops: the box's logical dimensions in the destination's memory order,
 * right-aligned into five (unused outer ones of size 1), with each one's stride in the source
 * and in the destination (elements), and the box's first element in each. */
typedef struct tsl_box_walk {
    int64_t box[TSL_MAX_DIMS], ss[TSL_MAX_DIMS], ds[TSL_MAX_DIMS];
    int64_t sbase, dbase;
} tsl_box_walk;

void tsl_box_copy_walk(const tsl_box_copy_args *args, tsl_box_walk *walk);

/* Copy (or, with `accumulate`, add) the box (extents and offsets are logical, in N C D H W
 * order); rows move with memcpy where both arrays store the destination's innermost dimension
 * contiguously. Pure. */
void tsl_box_copy(const tsl_box_copy_args *args, void *dst, const void *src);

/* dst = the box of src + addend, the addend stored like dst (f32). Pure. */
void tsl_box_add(const tsl_box_copy_args *args, float *dst, const float *src, const float *addend);

/* Aborts unless the arguments make a valid box copy (with an addend: `add`). */
void tsl_box_copy_check(const tsl_box_copy_args *args, int add);

/* A box copy task's arguments and buffers (src, dst, and the addend or NULL), checked. */
void tsl_box_copy_task(void *buffers[], void *cl_arg, tsl_box_copy_args *args, const void **src,
                       void **dst, const float **addend);

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

#ifdef TESSEL_USE_CUDA
/* The codelets' CUDA functions (copy.cu): the same arguments and buffers as the CPU
 * functions, launched on the worker's stream. */
void tsl_box_copy_cuda(void *buffers[], void *cl_arg);
void tsl_pack_cuda(void *buffers[], void *cl_arg);
void tsl_copy_cuda(void *buffers[], void *cl_arg);
#endif

#ifdef __cplusplus
}
#endif

#endif /* TESSEL_CODELETS_COPY_H */
