/* oneDNN helpers shared by the convolution benchmarks. */
#ifndef TESSEL_BENCH_DNNL_H
#define TESSEL_BENCH_DNNL_H

#include <dnnl.h>
#include <stdio.h>
#include <stdlib.h>

/* Exit with a message when a oneDNN call fails. */
#define DNNL_CHECK(call)                                                                           \
    do {                                                                                           \
        dnnl_status_t s_ = (call);                                                                 \
        if (s_ != dnnl_success) {                                                                  \
            fprintf(stderr, "%s failed: status %d\n", #call, (int)s_);                             \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* A new memory of descriptor md; with fill, set to a fixed pattern in [-0.5, 0.5). */
static inline dnnl_memory_t bench_memory(dnnl_engine_t engine, const dnnl_memory_desc_t *md,
                                         int fill)
{
    dnnl_memory_t m;
    DNNL_CHECK(dnnl_memory_create(&m, md, engine, DNNL_MEMORY_ALLOCATE));
    if (fill) {
        void *p;
        DNNL_CHECK(dnnl_memory_get_data_handle(m, &p));
        size_t n = dnnl_memory_desc_get_size(md) / sizeof(float);
        for (size_t i = 0; i < n; i++)
            ((float *)p)[i] = (float)((i * 2654435761u) % 1000) * 1e-3f - 0.5f;
    }
    return m;
}

#endif /* TESSEL_BENCH_DNNL_H */
