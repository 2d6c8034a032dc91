/* Convolution and transposed convolution kernels (oneDNN, codelets/conv_primitives.c) and
 * codelets (codelets/conv.c). A tile holds whole samples, in plain N C (D) (H) W order or
 * channels-last N (D) (H) W C order; weights are PyTorch's, plain: (O, I / groups, k...) for a
 * convolution, (I, O / groups, k...) for a transposed one. */
#ifndef TESSEL_CODELETS_CONV_H
#define TESSEL_CODELETS_CONV_H

#include <starpu.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tsl_conv_args {
    int32_t spatial;       /* 1, 2 or 3 */
    int32_t has_bias;      /* forward: bias buffer; backward weights: db buffer */
    int32_t transposed;    /* 1: transposed convolution; weights (I, O / groups, k...) */
    int32_t channels_last; /* x, y, dx, dy tiles are channels-last (the struct is a cache key:
                              six int32 keep it free of padding bytes) */
    int32_t pad_mode;      /* a tsl_padding_mode; other than zeros: every task on a window */
    int32_t unused;
    int64_t samples; /* N of the tile */
    int64_t in_channels, out_channels, groups;
    int64_t in_size[3], out_size[3], kernel[3];
    int64_t stride[3], padding[3], dilation[3]; /* dilation 1 = dense */
    /* Input channels of the weights when x is a run of them (a convolution over a channel
     * concatenation, each part on its own): x's in_channels are the weights' inputs from
     * w_in_offset of w_in_channels (for a transposed convolution, whose weights are
     * (I, O, k...), the block of rows from w_in_offset). 0: the weights take exactly x's
     * channels. Convolutions with one group only. */
    int64_t w_in_channels, w_in_offset;
    int64_t accumulate; /* forward: y += conv(x, w) (+ b) instead of y = */
} tsl_conv_args;

/* y = conv(x, w) + b (y += with a->accumulate). */
void tsl_conv_forward_kernel(const tsl_conv_args *a, const float *x, const float *w, const float *b,
                             float *y);
/* dx = conv^T(dy, w). */
void tsl_conv_backward_data_kernel(const tsl_conv_args *a, const float *dy, const float *w,
                                   float *dx);
/* dw (and db when not NULL) from x and dy; overwritten. */
void tsl_conv_backward_weights_kernel(const tsl_conv_args *a, const float *x, const float *dy,
                                      float *dw, float *db);

/* ---- spatial tiles: windows assembled from a tile, halo slabs and zeros ----
 *
 * With spatial tiles, the input an output tile needs is a window of the global input that
 * reaches into neighbouring tiles. The window is assembled from the tile's own box, halo slabs
 * cut from neighbours (each a dense (N, C, box) array in the tile layout), and zeros only
 * where the window leaves the global input; the convolution then runs unpadded on it. The
 * backward data pass is the adjoint: the window's gradient is cut back into the tile's part
 * and one part per slab (to be sent to and accumulated on the neighbours). Boxes are spatial,
 * in global input coordinates; the tile and the slabs must not overlap. */

#define TSL_CONV_MAX_SLABS 26 /* 3^3 - 1 neighbours of a 3-D tile */

typedef struct tsl_conv_box {
    int64_t lo[3], size[3];
} tsl_conv_box;

typedef struct tsl_conv_window {
    int32_t nslabs;
    int32_t pad_mode;    /* a tsl_padding_mode: what the window holds outside `global` */
    int64_t global[3];   /* spatial size of the whole input */
    tsl_conv_box window; /* may start below 0 and end past `global`: zeros there */
    tsl_conv_box tile;
    tsl_conv_box slab[TSL_CONV_MAX_SLABS];
    /* circular padding: where slab k sits in the window is its box (global, inside the
     * input) moved by slab_shift[k] (0 or +-global per dimension); 0 otherwise */
    int64_t slab_shift[TSL_CONV_MAX_SLABS][3];
} tsl_conv_window;

/* The arguments of a convolution on a window: `a` with in_size = the window's size and
 * out_size = the output tile's. A convolution's window starts at out_lo * stride - padding and
 * runs unpadded (padding 0); a transposed convolution's window is the range of inputs that
 * reach the output tile, with `padding` cropping the front of the window's full output.
 * Checks the boxes; aborts with a message if the tile and slabs leave part of the window
 * inside the global input uncovered, leave the global input, or overlap. */
void tsl_conv_window_check(const tsl_conv_args *a, const tsl_conv_window *w);
/* Window (N, C, window) in the tile layout from the tile, the slabs and zeros (or, with
 * w->pad_mode reflect or replicate, the window's own values inside the global input at the
 * mirrored or nearest position, which the window must hold). */
void tsl_conv_window_assemble(const tsl_conv_args *a, const tsl_conv_window *w, const float *tile,
                              const float *const *slabs, float *window);
/* Adjoint of the reflect or replicate fill: each window position outside the global input
 * adds its gradient into the position it was filled from, in place (nothing for zeros). */
void tsl_conv_window_fold(const tsl_conv_args *a, const tsl_conv_window *w, float *dwindow);
/* Adjoint of the assembly: the tile's part and each slab's part of a window gradient
 * (overwritten; positions outside the window get 0). */
void tsl_conv_window_scatter(const tsl_conv_args *a, const tsl_conv_window *w, const float *dwindow,
                             float *dtile, float *const *dslabs);
/* y = conv(window, w) + b for one output tile; dtile / dslabs from dy; dw (and db) from the
 * window and dy. `a` as for tsl_conv_window_check(). */
void tsl_conv_window_forward(const tsl_conv_args *a, const tsl_conv_window *w, const float *tile,
                             const float *const *slabs, const float *wt, const float *b, float *y);
/* The forward on a window whose outputs (a->out_size) are a box of a larger output tile of
 * spatial size tile_size: computed apart, then written at `offset` in the tile (the rest of
 * the tile is left as it is). */
void tsl_conv_window_forward_part(const tsl_conv_args *a, const tsl_conv_window *w,
                                  const float *tile, const float *const *slabs, const float *wt,
                                  const float *b, const int64_t *offset, const int64_t *tile_size,
                                  float *y);
void tsl_conv_window_backward_data(const tsl_conv_args *a, const tsl_conv_window *w,
                                   const float *dy, const float *wt, float *dtile,
                                   float *const *dslabs);
void tsl_conv_window_backward_weights(const tsl_conv_args *a, const tsl_conv_window *w,
                                      const float *tile, const float *const *slabs, const float *dy,
                                      float *dw, float *db);

/* Windowed convolutions run in chunks of output rows whose window, output chunk and weight
 * gradient buffers each hold about this many floats at most (at least one row). Setting 0
 * restores the default; for tests and tuning, before any task runs. */
#define TSL_CONV_CHUNK_FLOATS_DEFAULT ((size_t)1 << 20)
void tsl_conv_set_chunk_floats(size_t floats);

/* Arguments of the codelets: the problem and, for a spatial tile (windowed), its window. A
 * windowed task has window.nslabs halo buffers right after its x (or dx) buffer. */
typedef struct tsl_conv_task_args {
    tsl_conv_args conv;
    int32_t windowed;
    int32_t part; /* forward: conv.out_size is a box of the output tile (at out_offset in a tile
                     of out_tile): the interior or a border part of a tile split so the interior
                     need not wait for halo slabs */
    tsl_conv_window window;
    int64_t out_offset[3], out_tile[3];
} tsl_conv_task_args;

#ifdef TESSEL_USE_CUDA
/* The codelets' CUDA functions (conv.cu, cuDNN on the worker's handle and stream): the same
 * arguments and buffers as the CPU functions, for the tasks tsl_conv_cuda_supports() takes:
 * whole tiles (not windowed) whose sizes fit cuDNN's ints and whose output size is the one of
 * symmetric padding (PyTorch's). The codelets' can_execute keeps the others on CPU workers. */
int tsl_conv_cuda_supports(const tsl_conv_task_args *t);
void tsl_conv_forward_cuda(void *buffers[], void *cl_arg);
void tsl_conv_backward_data_cuda(void *buffers[], void *cl_arg);
void tsl_conv_backward_weights_cuda(void *buffers[], void *cl_arg);
#endif

/* R x, [R slabs], R w, [R b], W y (RW y for a part after the first) */
extern struct starpu_codelet tsl_cl_conv_forward;
extern struct starpu_codelet tsl_cl_conv_backward_data;    /* R dy, R w, W dx, [W dslabs] */
extern struct starpu_codelet tsl_cl_conv_backward_weights; /* R x, [R slabs], R dy, W dw, [W db] */

#ifdef __cplusplus
}
#endif

#endif /* TESSEL_CODELETS_CONV_H */
