/* Whole-buffer copies (scatter, gather) and N-D box copies (redistribution). */
#include <string.h>

#include "check.h"
#include "tile_ops.h"

void tsl_box_copy(const tsl_box_copy_args *args, void *dst, const void *src)
{
    int ndim = args->ndim;
    size_t elem = (size_t)args->elem_size;
    int64_t src_stride[TSL_MAX_DIMS], dst_stride[TSL_MAX_DIMS];
    int64_t box[TSL_MAX_DIMS], src_off[TSL_MAX_DIMS], dst_off[TSL_MAX_DIMS];
    /* Right-align into five dimensions so the loops below are fixed. */
    int pad = TSL_MAX_DIMS - ndim;
    for (int d = 0; d < TSL_MAX_DIMS; d++) {
        int s = d - pad;
        box[d] = s >= 0 ? args->box[s] : 1;
        src_off[d] = s >= 0 ? args->src_offset[s] : 0;
        dst_off[d] = s >= 0 ? args->dst_offset[s] : 0;
    }
    int64_t ss = 1, ds = 1;
    for (int d = TSL_MAX_DIMS - 1; d >= 0; d--) {
        int s = d - pad;
        src_stride[d] = ss;
        dst_stride[d] = ds;
        ss *= s >= 0 ? args->src_extent[s] : 1;
        ds *= s >= 0 ? args->dst_extent[s] : 1;
    }
    const char *sbase = src;
    char *dbase = dst;
    size_t row_bytes = (size_t)box[4] * elem;
    for (int64_t i0 = 0; i0 < box[0]; i0++)
        for (int64_t i1 = 0; i1 < box[1]; i1++)
            for (int64_t i2 = 0; i2 < box[2]; i2++)
                for (int64_t i3 = 0; i3 < box[3]; i3++) {
                    int64_t so = (src_off[0] + i0) * src_stride[0] +
                                 (src_off[1] + i1) * src_stride[1] +
                                 (src_off[2] + i2) * src_stride[2] +
                                 (src_off[3] + i3) * src_stride[3] + src_off[4];
                    int64_t doff = (dst_off[0] + i0) * dst_stride[0] +
                                   (dst_off[1] + i1) * dst_stride[1] +
                                   (dst_off[2] + i2) * dst_stride[2] +
                                   (dst_off[3] + i3) * dst_stride[3] + dst_off[4];
                    memcpy(dbase + (size_t)doff * elem, sbase + (size_t)so * elem, row_bytes);
                }
}

static void box_copy_cpu(void *buffers[], void *cl_arg)
{
    tsl_box_copy_args args;
    starpu_codelet_unpack_args(cl_arg, &args);
    const void *src = (const void *)STARPU_VECTOR_GET_PTR(buffers[0]);
    void *dst = (void *)STARPU_VECTOR_GET_PTR(buffers[1]);
    TSL_CODELET_CHECK(src && dst, "box copy on an unallocated tile");
    tsl_box_copy(&args, dst, src);
}

static void copy_cpu(void *buffers[], void *cl_arg)
{
    (void)cl_arg;
    size_t src_bytes = STARPU_VECTOR_GET_NX(buffers[0]) * STARPU_VECTOR_GET_ELEMSIZE(buffers[0]);
    size_t dst_bytes = STARPU_VECTOR_GET_NX(buffers[1]) * STARPU_VECTOR_GET_ELEMSIZE(buffers[1]);
    TSL_CODELET_CHECK(src_bytes == dst_bytes, "copy between buffers of different sizes");
    memcpy((void *)STARPU_VECTOR_GET_PTR(buffers[1]),
           (const void *)STARPU_VECTOR_GET_PTR(buffers[0]), src_bytes);
}

static struct starpu_perfmodel box_copy_model = {
    .type = STARPU_HISTORY_BASED,
    .symbol = "tsl_box_copy",
};

static struct starpu_perfmodel copy_model = {
    .type = STARPU_HISTORY_BASED,
    .symbol = "tsl_copy",
};

struct starpu_codelet tsl_cl_box_copy = {
    .cpu_funcs = {box_copy_cpu},
    .cpu_funcs_name = {"box_copy_cpu"},
    .nbuffers = STARPU_VARIABLE_NBUFFERS,
    .model = &box_copy_model,
    .name = "tsl_box_copy",
};

struct starpu_codelet tsl_cl_copy = {
    .cpu_funcs = {copy_cpu},
    .cpu_funcs_name = {"copy_cpu"},
    .nbuffers = 2,
    .modes = {STARPU_R, STARPU_W},
    .model = &copy_model,
    .name = "tsl_copy",
};
