/* Caching allocator for StarPU's main-memory buffers (host_cache.c). Never installed. */
#ifndef TESSEL_SRC_HOST_CACHE_H
#define TESSEL_SRC_HOST_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include <starpu.h>

typedef struct tsl_host_cache_stats {
    int64_t allocated;  /* blocks obtained from the C library */
    int64_t reused;     /* blocks handed out again from the cache */
    size_t most_cached; /* most bytes kept at once */
} tsl_host_cache_stats;

/* Route StarPU's allocations through the cache, keeping at most @p limit (> 0) bytes of
 * freed blocks; call before StarPU starts. */
void tsl_host_cache_install(size_t limit);

/* Counters so far and the bytes kept now; returns 0 (zeros everywhere) if not installed. */
int tsl_host_cache_query(tsl_host_cache_stats *stats, size_t *kept);

/* Free every cached block and give StarPU its own allocator back; call after StarPU has
 * shut down. @p stats (may be NULL) receives the counters. Does nothing if not installed. */
void tsl_host_cache_uninstall(tsl_host_cache_stats *stats);

#endif
