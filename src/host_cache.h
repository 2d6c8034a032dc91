/* Caching allocator for StarPU's main-memory buffers (host_cache.c). Never installed. */
#ifndef TESSEL_SRC_HOST_CACHE_H
#define TESSEL_SRC_HOST_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include <starpu.h>

typedef struct tsl_host_cache_stats {
    int64_t allocated;  /* blocks obtained from the C library */
    int64_t reused;     /* blocks handed out again from the cache */
    int64_t evicted;    /* kept blocks given back to stay near the high-water mark */
    size_t most_cached; /* most bytes kept at once */
    size_t in_use;      /* bytes handed out and not freed (now) */
    size_t received;    /* of which for data StarPU acquires outside tasks (now) */
    size_t high_water;  /* most bytes in use at once; in use + kept stays within it plus
                         * a quarter of the limit */
} tsl_host_cache_stats;

/* Route StarPU's allocations through the cache, keeping at most @p limit bytes of freed blocks
 * (0: none, only counting); call before StarPU starts. */
void tsl_host_cache_install(size_t limit);

/* The hooks installed with starpu_malloc_set_hooks() (also called directly by the unit tests):
 * a block of @p dim bytes (pinned if @p flags asks and CUDA workers exist), and its release. */
int tsl_host_cache_malloc(unsigned node, void **out, size_t dim, int flags);
int tsl_host_cache_free(unsigned node, void *ptr, size_t dim, int flags);

/* Counters so far and the bytes kept now; returns 0 (zeros everywhere) if not installed. */
int tsl_host_cache_query(tsl_host_cache_stats *stats, size_t *kept);

/* Call @p fn with the bytes in use after every block handed out or freed, and of those the
 * bytes handed out for data StarPU acquires outside tasks (StarPU-MPI's receives: allocated
 * when the receive is posted), under the cache's lock: it must be short and allocate nothing
 * through StarPU; until replaced; NULL stops it. Only while installed are blocks counted. */
void tsl_host_cache_observe(void (*fn)(void *arg, size_t in_use, size_t received), void *arg);

/* Stop the observer if it is the one given @p arg (else leave the other in place). */
void tsl_host_cache_unobserve(void *arg);

/* Free every cached block and give StarPU its own allocator back; call after StarPU has
 * shut down. @p stats (may be NULL) receives the counters. Does nothing if not installed. */
void tsl_host_cache_uninstall(tsl_host_cache_stats *stats);

#endif
