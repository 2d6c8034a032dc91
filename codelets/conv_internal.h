/* What codelets/conv_primitives.c (oneDNN primitives, whole-tile kernels) and codelets/conv.c
 * (windows of spatial tiles, codelets) share; private to the conv family. */
#ifndef TESSEL_CODELETS_CONV_INTERNAL_H
#define TESSEL_CODELETS_CONV_INTERNAL_H

#include <dnnl.h>
#include <stddef.h>
#include <stdint.h>

#include "conv.h"

struct cache_entry;

typedef struct thread_cache {
    dnnl_engine_t engine;
    dnnl_stream_t stream;
    struct cache_entry *entries;
    float *scratch; /* assembled windows of spatial tiles */
    size_t scratch_floats;
    float *part; /* a chunk of outputs or output gradients */
    size_t part_floats;
    float *wtmp; /* a chunk's weight and bias gradients */
    size_t wtmp_floats;
    void *wbuf; /* weights in a primitive's layout: filled or emptied by every call, so one
                 * buffer serves all of the thread's primitives */
    size_t wbuf_bytes;
} thread_cache;

/* This thread's cache, made on first use (its oneDNN engine and stream included); freed when
 * the thread exits. */
thread_cache *tsl_conv_local_cache(void);

/* Values per input channel of a weight tensor (the kernel's volume). */
static inline int64_t kernel_volume(const tsl_conv_args *a)
{
    int64_t k = 1;
    for (int d = 0; d < a->spatial; d++)
        k *= a->kernel[d];
    return k;
}

/* Where a run of the weights' input channels starts (the weights themselves without one): in
 * (O, w_in_channels, k...) weights the run's columns start at w_in_offset (rows
 * w_in_channels x k apart); in a transposed convolution's (w_in_channels, O, k...) weights the
 * run is the contiguous block of rows from w_in_offset. */
static inline size_t weights_at(const tsl_conv_args *a)
{
    if (a->w_in_channels <= 0)
        return 0;
    int64_t row = a->transposed ? a->out_channels / a->groups * kernel_volume(a) : kernel_volume(a);
    return (size_t)(a->w_in_offset * row);
}

#endif /* TESSEL_CODELETS_CONV_INTERNAL_H */
