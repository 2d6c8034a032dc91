/* Pooling and nearest upsampling kernels and codelets (codelets/pool.c). A tile holds whole
 * (sample, channel) planes: `planes` = samples x channels of the tile, each plane in C order. */
#ifndef TESSEL_CODELETS_POOL_H
#define TESSEL_CODELETS_POOL_H

#include <starpu.h>
#include <stdint.h>

typedef struct tsl_pool_args {
    int32_t dtype;
    int32_t spatial;
    int32_t kind; /* tsl_pool_kind; ignored for upsampling */
    int32_t count_include_pad;
    int64_t planes;
    int64_t in_size[3], out_size[3];
    int64_t kernel[3], stride[3], padding[3]; /* upsampling: kernel holds the scale */
} tsl_pool_args;

void tsl_pool_forward_kernel(const tsl_pool_args *a, const void *x, void *y);
/* dx from dy (and x, for max pooling); overwrites dx. */
void tsl_pool_backward_kernel(const tsl_pool_args *a, const void *x, const void *dy, void *dx);
void tsl_upsample_forward_kernel(const tsl_pool_args *a, const void *x, void *y);
void tsl_upsample_backward_kernel(const tsl_pool_args *a, const void *dy, void *dx);

extern struct starpu_codelet tsl_cl_pool_forward;      /* R x, W y */
extern struct starpu_codelet tsl_cl_pool_backward;     /* R x, R dy, W dx */
extern struct starpu_codelet tsl_cl_upsample_forward;  /* R x, W y */
extern struct starpu_codelet tsl_cl_upsample_backward; /* R dy, W dx */

#endif /* TESSEL_CODELETS_POOL_H */
