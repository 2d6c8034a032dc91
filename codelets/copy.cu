/* Copies on CUDA: N-D box copies between tiles (copy, f32 accumulate, f32 add of a third tile,
 * i64 labels narrowed to u8 or i32), packs of whole vectors into one buffer and back, and
 * whole-buffer copies; kernels and cudaMemcpyAsync on the worker's stream (the codelets are
 * STARPU_CUDA_ASYNC). The same bits as copy.c: moves, and single f32 additions. */
#include <starpu.h>

#include "copy.h"
#include "copy_math.h"
#include "cuda_check.h"
#include "cuda_launch.h"

namespace
{

/* Offsets (elements) in the source and the destination of element i of the box, the box's
 * dimensions walked in the destination's memory order (tsl_box_copy_walk()). */
__device__ void box_offsets(const tsl_box_walk &w, int64_t i, int64_t *so, int64_t *doff)
{
    int64_t s = w.sbase, d = w.dbase;
    for (int k = TSL_MAX_DIMS - 1; k >= 0; k--) {
        int64_t ik = i % w.box[k];
        i /= w.box[k];
        s += ik * w.ss[k];
        d += ik * w.ds[k];
    }
    *so = s;
    *doff = d;
}

/* dst = src for elements of type T (1, 2, 4 or 8 bytes). */
template <typename T>
__global__ void box_move(int64_t n, tsl_box_walk w, const T *__restrict__ src, T *__restrict__ dst)
{
    TSL_CUDA_FOR(i, n)
    {
        int64_t so, doff;
        box_offsets(w, i, &so, &doff);
        dst[doff] = src[so];
    }
}

/* dst = src for elements of `elem` bytes of any other size, a byte at a time. */
__global__ void box_move_bytes(int64_t n, tsl_box_walk w, int64_t elem, const char *src, char *dst)
{
    TSL_CUDA_FOR(i, n)
    {
        int64_t so, doff;
        box_offsets(w, i, &so, &doff);
        for (int64_t b = 0; b < elem; b++)
            dst[doff * elem + b] = src[so * elem + b];
    }
}

/* dst += src (f32): each destination element once, so no two threads share one. */
__global__ void box_accumulate(int64_t n, tsl_box_walk w, const float *src, float *dst)
{
    TSL_CUDA_FOR(i, n)
    {
        int64_t so, doff;
        box_offsets(w, i, &so, &doff);
        dst[doff] += src[so];
    }
}

/* dst = src + addend, the addend stored like dst (f32). */
__global__ void box_add(int64_t n, tsl_box_walk w, const float *src, const float *addend,
                        float *dst)
{
    TSL_CUDA_FOR(i, n)
    {
        int64_t so, doff;
        box_offsets(w, i, &so, &doff);
        dst[doff] = src[so] + addend[doff];
    }
}

/* i64 labels into u8 (T uint8_t) or i32 (T int32_t). */
template <typename T>
__global__ void box_narrow(int64_t n, tsl_box_walk w, const int64_t *__restrict__ src,
                           T *__restrict__ dst)
{
    TSL_CUDA_FOR(i, n)
    {
        int64_t so, doff;
        box_offsets(w, i, &so, &doff);
        if (sizeof(T) == 1)
            dst[doff] = (T)tsl_label_u8(src[so]);
        else
            dst[doff] = (T)tsl_label_i32(src[so]);
    }
}

size_t bytes_of(void *buffer)
{
    return STARPU_VECTOR_GET_NX(buffer) * STARPU_VECTOR_GET_ELEMSIZE(buffer);
}

} // namespace

extern "C" void tsl_box_copy_cuda(void *buffers[], void *cl_arg)
{
    tsl_box_copy_args args;
    const void *src;
    void *dst;
    const float *addend;
    tsl_box_copy_task(buffers, cl_arg, &args, &src, &dst, &addend);
    tsl_box_copy_check(&args, addend != NULL);
    TSL_CODELET_CHECK(args.ndim >= 0 && args.ndim <= TSL_MAX_DIMS && args.elem_size > 0,
                      "box copy (CUDA): dimensions or element size");
    tsl_box_walk w;
    tsl_box_copy_walk(&args, &w);
    int64_t n = 1;
    for (int k = 0; k < TSL_MAX_DIMS; k++)
        n *= w.box[k];
    if (n <= 0)
        return;
    cudaStream_t stream = starpu_cuda_get_local_stream();
    unsigned blocks = tsl_cuda_blocks(n);
    if (addend)
        box_add<<<blocks, TSL_CUDA_THREADS, 0, stream>>>(n, w, (const float *)src, addend,
                                                         (float *)dst);
    else if (args.narrow_labels && args.elem_size == 1)
        box_narrow<uint8_t>
            <<<blocks, TSL_CUDA_THREADS, 0, stream>>>(n, w, (const int64_t *)src, (uint8_t *)dst);
    else if (args.narrow_labels)
        box_narrow<int32_t>
            <<<blocks, TSL_CUDA_THREADS, 0, stream>>>(n, w, (const int64_t *)src, (int32_t *)dst);
    else if (args.accumulate)
        box_accumulate<<<blocks, TSL_CUDA_THREADS, 0, stream>>>(n, w, (const float *)src,
                                                                (float *)dst);
    else if (args.elem_size == 1)
        box_move<uint8_t>
            <<<blocks, TSL_CUDA_THREADS, 0, stream>>>(n, w, (const uint8_t *)src, (uint8_t *)dst);
    else if (args.elem_size == 2)
        box_move<uint16_t>
            <<<blocks, TSL_CUDA_THREADS, 0, stream>>>(n, w, (const uint16_t *)src, (uint16_t *)dst);
    else if (args.elem_size == 4)
        box_move<uint32_t>
            <<<blocks, TSL_CUDA_THREADS, 0, stream>>>(n, w, (const uint32_t *)src, (uint32_t *)dst);
    else if (args.elem_size == 8)
        box_move<uint64_t>
            <<<blocks, TSL_CUDA_THREADS, 0, stream>>>(n, w, (const uint64_t *)src, (uint64_t *)dst);
    else
        box_move_bytes<<<blocks, TSL_CUDA_THREADS, 0, stream>>>(n, w, args.elem_size,
                                                                (const char *)src, (char *)dst);
    TSL_CUDA_CHECK_LAUNCH();
}

extern "C" void tsl_pack_cuda(void *buffers[], void *cl_arg)
{
    tsl_pack_args args;
    starpu_codelet_unpack_args(cl_arg, &args);
    TSL_CODELET_CHECK(args.n >= 1 && args.n <= TSL_PACK_MAX &&
                          STARPU_TASK_GET_NBUFFERS(starpu_task_get_current()) ==
                              (unsigned)args.n + 1,
                      "pack (CUDA): bad piece count");
    int first = args.unpack ? 1 : 0, at = args.unpack ? 0 : args.n;
    char *pack = (char *)STARPU_VECTOR_GET_PTR(buffers[at]);
    TSL_CODELET_CHECK(pack, "pack (CUDA) on an unallocated buffer");
    size_t pack_bytes = bytes_of(buffers[at]);
    cudaStream_t stream = starpu_cuda_get_local_stream();
    for (int32_t i = 0; i < args.n; i++) {
        void *piece = (void *)STARPU_VECTOR_GET_PTR(buffers[first + i]);
        size_t bytes = bytes_of(buffers[first + i]);
        TSL_CODELET_CHECK(piece, "pack (CUDA) on an unallocated tile");
        TSL_CODELET_CHECK(args.offset[i] >= 0 && (size_t)args.offset[i] + bytes <= pack_bytes,
                          "pack (CUDA): a piece outside the pack");
        if (bytes == 0)
            continue;
        char *in_pack = pack + args.offset[i];
        if (args.unpack)
            TSL_CUDA_CHECK(
                cudaMemcpyAsync(piece, in_pack, bytes, cudaMemcpyDeviceToDevice, stream));
        else
            TSL_CUDA_CHECK(
                cudaMemcpyAsync(in_pack, piece, bytes, cudaMemcpyDeviceToDevice, stream));
    }
}

extern "C" void tsl_copy_cuda(void *buffers[], void *cl_arg)
{
    (void)cl_arg;
    size_t src_bytes = bytes_of(buffers[0]), dst_bytes = bytes_of(buffers[1]);
    TSL_CODELET_CHECK(src_bytes == dst_bytes, "copy (CUDA) between buffers of different sizes");
    if (src_bytes == 0)
        return;
    TSL_CUDA_CHECK(cudaMemcpyAsync((void *)STARPU_VECTOR_GET_PTR(buffers[1]),
                                   (const void *)STARPU_VECTOR_GET_PTR(buffers[0]), src_bytes,
                                   cudaMemcpyDeviceToDevice, starpu_cuda_get_local_stream()));
}
