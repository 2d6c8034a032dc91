/* Pooling and upsampling (nearest, (bi/tri)linear) kernels (codelets/pool_kernels.c) and codelets
 * (codelets/pool.c; CUDA in codelets/pool.cu). A tile holds whole (sample, channel) planes:
 * `planes` = samples x channels of the tile, each plane in C order, contiguous (plain tiles) or
 * with its positions `channels` apart (channels-last). */
#ifndef TESSEL_CODELETS_POOL_H
#define TESSEL_CODELETS_POOL_H

#include <starpu.h>
#include <stdint.h>

#include "conv.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tsl_pool_args {
    int32_t dtype;
    int32_t spatial;
    int32_t kind; /* tsl_pool_kind; for upsampling a tsl_upsample_mode */
    int32_t count_include_pad;
    int32_t channels_last; /* tiles stored N D H W C: a plane's positions are `channels` apart */
    int32_t index_dtype;   /* max pooling indices: TSL_U8 or TSL_I32 (the index kernels) */
    int64_t channels;      /* the tile's channels (planes = samples x channels) */
    int64_t planes;
    int64_t in_size[3], out_size[3];
    /* Upsampling: kernel holds the scale, or 0 along a dimension the global sizes map (an output
     * of any size, PyTorch's size=; tsl_upsample_axis()). */
    int64_t kernel[3], stride[3], padding[3];
    /* A window of a spatially tiled tensor: the global input size (0: in_size, a whole
     * tensor), the global position of the input buffer's first element and of the tile's
     * first output. Windows and padding are worked out in global positions, so a tile
     * computes exactly what the whole tensor would at its positions. */
    int64_t global_in[3], in_origin[3], out_origin[3];
    int64_t global_out[3]; /* upsampling: the global output size (0: out_size) */
} tsl_pool_args;

/* tsl_pool_args.kind of an upsampling. Linear is PyTorch's align_corners=False: source
 * coordinate max((dst + 0.5) / scale - 0.5, 0) per dimension (scale: out / in where the sizes
 * map), interpolated between its floor and the next element (clamped to the last). */
typedef enum tsl_upsample_mode {
    TSL_UPSAMPLE_NEAREST = 0,
    TSL_UPSAMPLE_LINEAR = 1,
} tsl_upsample_mode;

void tsl_pool_forward_kernel(const tsl_pool_args *a, const void *x, void *y);
/* dx from dy (and x, for max pooling; NULL for average pooling, which reads only dy);
 * overwrites dx. */
void tsl_pool_backward_kernel(const tsl_pool_args *a, const void *x, const void *dy, void *dx);
/* Max pooling: y as tsl_pool_forward_kernel(), and in `ix` (laid out as y, a->index_dtype) the
 * kernel position, (k0 * kernel[1] + k1) * kernel[2] + k2, of the element each output's
 * gradient goes to (the backward's choice: a NaN first, else the first maximum), -1 (u8: 255)
 * where a window holds only padding. */
void tsl_pool_forward_index_kernel(const tsl_pool_args *a, const void *x, void *y, void *ix);
/* dx from the indices and dy, the same bits as tsl_pool_backward_kernel() from x; overwrites
 * dx. */
void tsl_pool_backward_index_kernel(const tsl_pool_args *a, const void *ix, const void *dy,
                                    void *dx);
/* Upsampling by a->kernel (the scale) in mode a->kind; the backward overwrites dx, summing each
 * plane's contributions in a fixed order (deterministic). */
void tsl_upsample_forward_kernel(const tsl_pool_args *a, const void *x, void *y);
void tsl_upsample_backward_kernel(const tsl_pool_args *a, const void *dy, void *dx);

/* Spatial tiles (f32): the arguments with the window of the input the tile's task reads,
 * assembled from the tile and halo slabs (as for convolutions, codelets/conv.h; the window
 * lies inside the global input). pool.in_size is the window's size, pool.out_size the output
 * tile's, pool.in_origin the window's start. */
typedef struct tsl_pool_task_args {
    tsl_pool_args pool;
    tsl_conv_window window;
} tsl_pool_task_args;

/* Whether the window is exactly the task's own tile (no slabs, no zeros: an aligned
 * non-overlapping pooling such as 2x2 stride 2 on even tile borders); the kernels then run on
 * the tile buffers themselves, with no window copies (and on CUDA workers too). */
int tsl_pool_window_is_tile(const tsl_pool_task_args *t);

extern struct starpu_codelet tsl_cl_pool_window_forward; /* R x, [R slabs], W y */
extern struct starpu_codelet
    tsl_cl_pool_window_backward; /* R x, [R slabs], R dy, W dx, [W dslabs] */
extern struct starpu_codelet tsl_cl_pool_window_forward_index; /* R x, [R slabs], W y, W indices */
extern struct starpu_codelet
    tsl_cl_pool_window_backward_index; /* R indices, R dy, W dx, [W dslabs] */
extern struct starpu_codelet
    tsl_cl_pool_window_backward_avg; /* average pooling: R dy, W dx, [W dslabs] (no x) */
extern struct starpu_codelet tsl_cl_upsample_window_forward;  /* R x, [R slabs], W y */
extern struct starpu_codelet tsl_cl_upsample_window_backward; /* R dy, W dx, [W dslabs] */

extern struct starpu_codelet tsl_cl_pool_forward;             /* R x, W y */
extern struct starpu_codelet tsl_cl_pool_backward;            /* R x, R dy, W dx */
extern struct starpu_codelet tsl_cl_pool_backward_avg;        /* average pooling: R dy, W dx */
extern struct starpu_codelet tsl_cl_pool_forward_index;       /* R x, W y, W indices */
extern struct starpu_codelet tsl_cl_pool_backward_index;      /* R indices, R dy, W dx */
extern struct starpu_codelet tsl_cl_upsample_forward;         /* R x, W y */
extern struct starpu_codelet tsl_cl_upsample_backward;        /* R dy, W dx */
extern struct starpu_codelet tsl_cl_upsample_linear_forward;  /* R x, W y */
extern struct starpu_codelet tsl_cl_upsample_linear_backward; /* R dy, W dx */

#ifdef TESSEL_USE_CUDA
/* The codelets' CUDA functions (pool.cu): the same arguments and buffers as the CPU functions,
 * launched on the worker's stream; the window ones only for windows that are their tile. */
void tsl_pool_forward_cuda(void *buffers[], void *cl_arg);
void tsl_pool_backward_cuda(void *buffers[], void *cl_arg);
void tsl_pool_forward_index_cuda(void *buffers[], void *cl_arg);
void tsl_pool_backward_index_cuda(void *buffers[], void *cl_arg);
void tsl_pool_backward_avg_cuda(void *buffers[], void *cl_arg);
void tsl_upsample_forward_cuda(void *buffers[], void *cl_arg);
void tsl_upsample_backward_cuda(void *buffers[], void *cl_arg);
void tsl_pool_window_forward_cuda(void *buffers[], void *cl_arg);
void tsl_pool_window_backward_cuda(void *buffers[], void *cl_arg);
void tsl_pool_window_forward_index_cuda(void *buffers[], void *cl_arg);
void tsl_pool_window_backward_index_cuda(void *buffers[], void *cl_arg);
void tsl_pool_window_backward_avg_cuda(void *buffers[], void *cl_arg);
void tsl_upsample_window_forward_cuda(void *buffers[], void *cl_arg);
void tsl_upsample_window_backward_cuda(void *buffers[], void *cl_arg);
#endif

#ifdef __cplusplus
}
#endif

#endif /* TESSEL_CODELETS_POOL_H */
