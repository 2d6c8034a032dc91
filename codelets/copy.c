/* Whole-buffer copies (scatter, gather) and N-D box copies (redistribution). The CUDA
 * functions are in copy.cu. */
#include <stdint.h>
#include <string.h>

#include "codelet.h"
#include "copy.h"
#include "copy_math.h"

void tsl_layout_order(int32_t layout, int32_t ndim, int32_t *order)
{
    for (int32_t k = 0; k < ndim; k++)
        order[k] = k;
    if (layout == TSL_LAYOUT_CHANNELS_LAST && ndim >= 3) {
        for (int32_t k = 1; k < ndim - 1; k++)
            order[k] = k + 1;
        order[ndim - 1] = 1;
    }
}

void tsl_layout_strides(int32_t layout, int32_t ndim, const int64_t *extent, int64_t *stride)
{
    int32_t order[TSL_MAX_DIMS];
    tsl_layout_order(layout, ndim, order);
    int64_t s = 1;
    for (int32_t k = ndim - 1; k >= 0; k--) {
        stride[order[k]] = s;
        s *= extent[order[k]];
    }
}

/* Copy `count` elements of `elem` bytes at source stride `ss` (elements) to consecutive
 * destination elements. */
static void strided_row(char *dst, const char *src, int64_t count, int64_t ss, size_t elem)
{
    switch (elem) {
    case 1:
        for (int64_t i = 0; i < count; i++)
            ((uint8_t *)dst)[i] = ((const uint8_t *)src)[i * ss];
        return;
    case 4:
        for (int64_t i = 0; i < count; i++)
            ((uint32_t *)dst)[i] = ((const uint32_t *)src)[i * ss];
        return;
    case 8:
        for (int64_t i = 0; i < count; i++)
            ((uint64_t *)dst)[i] = ((const uint64_t *)src)[i * ss];
        return;
    default:
        for (int64_t i = 0; i < count; i++)
            memcpy(dst + (size_t)i * elem, src + (size_t)(i * ss) * elem, elem);
    }
}

/* i64 labels into u8 or i32 (copy_math.h). */
static void narrow_row(char *dst, const int64_t *src, int64_t n, int64_t stride, size_t elem)
{
    if (elem == 1) {
        uint8_t *d = (uint8_t *)dst;
        for (int64_t i = 0; i < n; i++)
            d[i] = tsl_label_u8(src[i * stride]);
    } else {
        int32_t *d = (int32_t *)(void *)dst;
        for (int64_t i = 0; i < n; i++)
            d[i] = tsl_label_i32(src[i * stride]);
    }
}

static void add_row(float *restrict dst, const float *restrict src, int64_t n, int64_t stride)
{
    if (stride == 1)
        for (int64_t i = 0; i < n; i++)
            dst[i] += src[i];
    else
        for (int64_t i = 0; i < n; i++)
            dst[i] += src[i * stride];
}

/* dst = src + addend, the addend stored like dst. */
static void add2_row(float *restrict dst, const float *restrict src, const float *restrict addend,
                     int64_t n, int64_t stride)
{
    if (stride == 1) /* (a loop of its own: vectorized) */
        for (int64_t i = 0; i < n; i++)
            dst[i] = src[i] + addend[i];
    else
        for (int64_t i = 0; i < n; i++)
            dst[i] = src[i * stride] + addend[i];
}

void tsl_box_copy_walk(const tsl_box_copy_args *args, tsl_box_walk *w)
{
    int ndim = args->ndim;
    int64_t src_stride[TSL_MAX_DIMS], dst_stride[TSL_MAX_DIMS];
    tsl_layout_strides(args->src_layout, ndim, args->src_extent, src_stride);
    tsl_layout_strides(args->dst_layout, ndim, args->dst_extent, dst_stride);
    /* The logical dimensions in the destination's memory order (writes stream), right-aligned
     * into five; unused outer ones have size 1. */
    w->sbase = w->dbase = 0;
    for (int d = 0; d < ndim; d++) {
        w->sbase += args->src_offset[d] * src_stride[d];
        w->dbase += args->dst_offset[d] * dst_stride[d];
    }
    int pad = TSL_MAX_DIMS - ndim;
    for (int k = 0; k < pad; k++) {
        w->box[k] = 1;
        w->ss[k] = w->ds[k] = 0;
    }
    int32_t order[TSL_MAX_DIMS];
    tsl_layout_order(args->dst_layout, ndim, order);
    for (int k = 0; k < ndim; k++) {
        w->box[pad + k] = args->box[order[k]];
        w->ss[pad + k] = src_stride[order[k]];
        w->ds[pad + k] = dst_stride[order[k]];
    }
}

void tsl_box_copy_check(const tsl_box_copy_args *args, int add)
{
    TSL_CODELET_CHECK(!add || (!args->accumulate && !args->narrow_labels &&
                               args->elem_size == (int32_t)sizeof(float)),
                      "box add: f32 tiles, no accumulation");
    TSL_CODELET_CHECK(!args->accumulate || args->elem_size == (int32_t)sizeof(float),
                      "box copy: accumulation is for f32 tiles");
    TSL_CODELET_CHECK(!args->narrow_labels || args->elem_size == 1 || args->elem_size == 4,
                      "box copy: labels narrow to u8 or i32 only");
}

static void box_copy(const tsl_box_copy_args *args, void *dst, const void *src, const float *addend)
{
    tsl_box_copy_check(args, addend != NULL);
    size_t elem = (size_t)args->elem_size;
    tsl_box_walk w;
    tsl_box_copy_walk(args, &w);
    const int64_t *box = w.box, *ss = w.ss, *ds = w.ds;
    const int64_t dbase = w.dbase;
    size_t selem = args->narrow_labels ? sizeof(int64_t) : elem;
    const char *sp = (const char *)src + (size_t)w.sbase * selem;
    char *dp = (char *)dst + (size_t)dbase * elem;
    int contiguous = ss[4] == 1;
    size_t row_bytes = (size_t)box[4] * elem;
    for (int64_t i0 = 0; i0 < box[0]; i0++)
        for (int64_t i1 = 0; i1 < box[1]; i1++)
            for (int64_t i2 = 0; i2 < box[2]; i2++)
                for (int64_t i3 = 0; i3 < box[3]; i3++) {
                    int64_t so = i0 * ss[0] + i1 * ss[1] + i2 * ss[2] + i3 * ss[3];
                    int64_t doff = i0 * ds[0] + i1 * ds[1] + i2 * ds[2] + i3 * ds[3];
                    if (addend)
                        add2_row((float *)(void *)(dp + (size_t)doff * elem),
                                 (const float *)(const void *)(sp + (size_t)so * elem),
                                 addend + dbase + doff, box[4], ss[4]);
                    else if (args->narrow_labels)
                        narrow_row(dp + (size_t)doff * elem,
                                   (const int64_t *)(const void *)(sp + (size_t)so * selem), box[4],
                                   ss[4], elem);
                    else if (args->accumulate)
                        add_row((float *)(void *)(dp + (size_t)doff * elem),
                                (const float *)(const void *)(sp + (size_t)so * elem), box[4],
                                ss[4]);
                    else if (contiguous)
                        memcpy(dp + (size_t)doff * elem, sp + (size_t)so * elem, row_bytes);
                    else
                        strided_row(dp + (size_t)doff * elem, sp + (size_t)so * elem, box[4], ss[4],
                                    elem);
                }
}

void tsl_box_copy(const tsl_box_copy_args *args, void *dst, const void *src)
{
    box_copy(args, dst, src, NULL);
}

void tsl_box_add(const tsl_box_copy_args *args, float *dst, const float *src, const float *addend)
{
    box_copy(args, dst, src, addend);
}

void tsl_box_copy_task(void *buffers[], void *cl_arg, tsl_box_copy_args *args, const void **src,
                       void **dst, const float **addend)
{
    starpu_codelet_unpack_args(cl_arg, args);
    *src = (const void *)STARPU_VECTOR_GET_PTR(buffers[0]);
    *dst = (void *)STARPU_VECTOR_GET_PTR(buffers[1]);
    TSL_CODELET_CHECK(*src && *dst, "box copy on an unallocated tile");
    *addend = NULL;
    if (STARPU_TASK_GET_NBUFFERS(starpu_task_get_current()) > 2) {
        size_t dst_count = STARPU_VECTOR_GET_NX(buffers[1]);
        TSL_CODELET_CHECK(STARPU_VECTOR_GET_NX(buffers[2]) == dst_count,
                          "box add: the addend and the destination differ in size");
        *addend = (const float *)STARPU_VECTOR_GET_PTR(buffers[2]);
    }
}

static void box_copy_cpu(void *buffers[], void *cl_arg)
{
    tsl_box_copy_args args;
    const void *src;
    void *dst;
    const float *addend;
    tsl_box_copy_task(buffers, cl_arg, &args, &src, &dst, &addend);
    box_copy(&args, dst, src, addend);
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

void tsl_pack(const tsl_pack_args *args, void *pack, size_t pack_bytes, void *const *pieces,
              const size_t *bytes)
{
    for (int32_t i = 0; i < args->n; i++) {
        TSL_CODELET_CHECK(args->offset[i] >= 0 && (size_t)args->offset[i] + bytes[i] <= pack_bytes,
                          "pack: a piece outside the pack");
        char *at = (char *)pack + args->offset[i];
        if (args->unpack)
            memcpy(pieces[i], at, bytes[i]);
        else
            memcpy(at, pieces[i], bytes[i]);
    }
}

static void pack_cpu(void *buffers[], void *cl_arg)
{
    tsl_pack_args args;
    starpu_codelet_unpack_args(cl_arg, &args);
    TSL_CODELET_CHECK(args.n >= 1 && args.n <= TSL_PACK_MAX &&
                          STARPU_TASK_GET_NBUFFERS(starpu_task_get_current()) ==
                              (unsigned)args.n + 1,
                      "pack: bad piece count");
    void *pieces[TSL_PACK_MAX];
    size_t bytes[TSL_PACK_MAX];
    int first = args.unpack ? 1 : 0, at = args.unpack ? 0 : args.n;
    for (int32_t i = 0; i < args.n; i++) {
        pieces[i] = (void *)STARPU_VECTOR_GET_PTR(buffers[first + i]);
        bytes[i] = STARPU_VECTOR_GET_NX(buffers[first + i]) *
                   STARPU_VECTOR_GET_ELEMSIZE(buffers[first + i]);
        TSL_CODELET_CHECK(pieces[i], "pack on an unallocated tile");
    }
    void *pack = (void *)STARPU_VECTOR_GET_PTR(buffers[at]);
    TSL_CODELET_CHECK(pack, "pack on an unallocated buffer");
    tsl_pack(&args, pack,
             STARPU_VECTOR_GET_NX(buffers[at]) * STARPU_VECTOR_GET_ELEMSIZE(buffers[at]), pieces,
             bytes);
}

/* The footprint: the buffer sizes and packing or unpacking. */
static uint32_t pack_variant(struct starpu_task *task)
{
    tsl_pack_args a;
    starpu_codelet_unpack_args(task->cl_arg, &a);
    return tsl_hash_i64(starpu_task_data_footprint(task), a.unpack);
}

/* The footprint: the tile sizes, the element size, both layouts, copy or accumulate, label
 * narrowing and the box. */
static uint32_t box_copy_variant(struct starpu_task *task)
{
    tsl_box_copy_args a;
    starpu_codelet_unpack_args(task->cl_arg, &a);
    uint32_t h = starpu_task_data_footprint(task);
    h = tsl_hash_i64(h, a.elem_size);
    h = tsl_hash_i64(h, a.src_layout);
    h = tsl_hash_i64(h, a.dst_layout);
    h = tsl_hash_i64(h, a.accumulate);
    h = tsl_hash_i64(h, a.narrow_labels);
    return tsl_hash_i64s(h, a.box, a.ndim >= 0 && a.ndim <= TSL_MAX_DIMS ? a.ndim : 0);
}

/* The CUDA functions (copy.cu) fill the CUDA slots only when TESSEL_USE_CUDA is defined. */
TSL_CODELET(tsl_cl_pack, "tsl_pack", pack_cpu, tsl_pack_cuda, pack_variant,
            .nbuffers = STARPU_VARIABLE_NBUFFERS);
TSL_CODELET(tsl_cl_box_copy, "tsl_box_copy", box_copy_cpu, tsl_box_copy_cuda, box_copy_variant,
            .nbuffers = STARPU_VARIABLE_NBUFFERS);
TSL_CODELET(tsl_cl_copy, "tsl_copy", copy_cpu, tsl_copy_cuda, NULL, .nbuffers = 2,
            .modes = {STARPU_R, STARPU_W});
