/* Caching allocator for StarPU's main-memory buffers.
 *
 * Activations and gradients are transient tiles: StarPU allocates a tile's buffer when a task
 * first writes it, and the backward releases it (tsl_tensor_release), which frees the buffer.
 * With the C library's allocator every such buffer comes back as fresh pages each step (large
 * blocks are mapped and unmapped, arena tops are trimmed), and the kernels then pay a page
 * fault for every 4 KiB they touch: about a quarter of a small data-parallel step. This
 * allocator, installed with starpu_malloc_set_hooks() while tessel owns StarPU, keeps freed
 * blocks for reuse by exact size, up to a byte limit; blocks larger than a quarter of the
 * limit are never kept.
 *
 * Kept blocks raise the peak of StarPU's buffers by at most a quarter of the limit (the largest
 * block kept), not by the limit: the bytes in use plus the bytes kept never exceed the most
 * bytes that were ever in use at once (the high-water mark) by more than that. Freeing a block
 * into the cache leaves that sum as it is, and so does handing a kept block out; a block that
 * has to come from the C library first releases kept blocks until the sum, with the new block,
 * fits (the new block may itself raise the mark). The victim is the smallest kept block that
 * covers the excess, else the largest, so no more is given back than needed. So the kept blocks
 * live in the valleys of a step (after the backward freed its activations, say), and when the
 * step climbs back to its peak they are handed out again or given back first. The quarter of
 * slack lets a step whose buffers change sizes (a 6 MiB activation where a step before had two
 * 3 MiB ones) keep both: with none, the one-rank Fashion-MNIST cnn step gave back and allocated
 * again 17 blocks a step and ran 20 % slower; with it, 2 and 32 blocks in two runs of 60 steps.
 *
 * Every block carries a header recording its size and whether it was pinned, because StarPU's
 * starpu_free() passes no size. Blocks are pinned (starpu_memory_pin) when StarPU asks for
 * pinned memory and CUDA workers exist, as StarPU's own allocator does with cudaHostAlloc.
 *
 * With a limit of 0 nothing is kept, and the hooks still count the bytes in use and their
 * high-water mark (tsl_context_buffer_bytes).
 *
 * TSL_POISON_ALLOC=1 in the environment (read when the cache is installed) fills every block
 * handed out with 0xff bytes (NaN as f32), so a kernel that
 * reads memory it never wrote shows up in the results. */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host_cache.h"

#define HEADER_BYTES 64 /* keeps the user pointer 64-byte aligned */
#define HEADER_MAGIC 0x7465737365ca4e31ULL

struct header {
    uint64_t magic;
    size_t dim;
    int pinned;
    int received; /* handed out for data StarPU acquires outside tasks (received_now()) */
    void *next;   /* chains blocks released together */
};

struct bin {
    size_t dim;
    int pinned;
    int32_t count;
    int32_t cap;
    void **blocks; /* raw pointers (header first) */
};

static struct {
    pthread_mutex_t lock;
    int installed;
    int poison;
    size_t limit;
    size_t max_block;
    size_t cached;
    size_t in_use;     /* bytes handed out and not freed */
    size_t received;   /* of which for data acquired outside tasks (received_now()) */
    size_t high_water; /* most bytes in use at once */
    struct bin *bins;
    int32_t nbins;
    int32_t bins_cap;
    tsl_host_cache_stats stats;
    void (*observe)(void *arg, size_t in_use, size_t received); /* (tsl_host_cache_observe) */
    void *observe_arg;
} cache = {.lock = PTHREAD_MUTEX_INITIALIZER};

static void release_block(void *raw)
{
    struct header *h = raw;
    if (h->pinned)
        starpu_memory_unpin((char *)raw + HEADER_BYTES, h->dim);
    free(raw);
}

/* Bin for (dim, pinned); NULL if absent and create is 0 or memory is short. Lock held. */
static struct bin *find_bin(size_t dim, int pinned, int create)
{
    for (int32_t i = 0; i < cache.nbins; i++)
        if (cache.bins[i].dim == dim && cache.bins[i].pinned == pinned)
            return &cache.bins[i];
    if (!create)
        return NULL;
    if (cache.nbins == cache.bins_cap) {
        int32_t cap = cache.bins_cap ? 2 * cache.bins_cap : 64;
        struct bin *bins = realloc(cache.bins, (size_t)cap * sizeof *bins);
        if (!bins)
            return NULL;
        cache.bins = bins;
        cache.bins_cap = cap;
    }
    struct bin *b = &cache.bins[cache.nbins++];
    memset(b, 0, sizeof *b);
    b->dim = dim;
    b->pinned = pinned;
    return b;
}

static int wants_pinning(int flags)
{
    return (flags & STARPU_MALLOC_PINNED) && starpu_cuda_worker_get_count() > 0;
}

/* Takes kept blocks off their bins (the smallest that covers the excess, else the largest)
 * until in use + kept + @p more is at most the high-water mark plus the largest block kept, or
 * nothing is kept; returns them chained through their headers, for release_chain() once the
 * lock is dropped. Lock held. */
static void *evict_over_high_water(size_t more)
{
    void *chain = NULL;
    while (cache.cached > 0 &&
           cache.in_use + cache.cached + more > cache.high_water + cache.max_block) {
        size_t excess = cache.in_use + cache.cached + more - cache.high_water - cache.max_block;
        struct bin *largest = NULL, *fit = NULL;
        for (int32_t i = 0; i < cache.nbins; i++) {
            struct bin *b = &cache.bins[i];
            if (b->count == 0)
                continue;
            if (!largest || b->dim > largest->dim)
                largest = b;
            if (b->dim >= excess && (!fit || b->dim < fit->dim))
                fit = b;
        }
        struct bin *victim = fit ? fit : largest;
        struct header *h = victim->blocks[--victim->count];
        cache.cached -= h->dim;
        cache.stats.evicted++;
        h->next = chain;
        chain = h;
    }
    return chain;
}

static void release_chain(void *chain)
{
    while (chain) {
        void *next = ((struct header *)chain)->next;
        release_block(chain);
        chain = next;
    }
}

/* Whether the block StarPU asks for now holds data it acquires outside tasks: StarPU-MPI posts
 * a receive by acquiring the handle it receives into (starpu_data_acquire_on_node_cb), and
 * StarPU allocates the buffer in the acquisition's internal task, named
 * "_starpu_data_acquire_cb_pre" (StarPU 1.3), on the submitting thread or a worker, as soon as
 * the handle is free: long before the data arrives. A task's own buffers are allocated while no
 * task or that task is current. */
static int received_now(void)
{
    struct starpu_task *t = starpu_task_get_current();
    const char *name = t ? (t->name ? t->name : t->cl ? t->cl->name : NULL) : NULL;
    return name && strcmp(name, "_starpu_data_acquire_cb_pre") == 0;
}

int tsl_host_cache_malloc(unsigned node, void **out, size_t dim, int flags)
{
    (void)node;
    int pinned = wants_pinning(flags), received = received_now();
    void *raw = NULL, *evicted = NULL;
    pthread_mutex_lock(&cache.lock);
    if (cache.in_use + dim > cache.high_water)
        cache.high_water = cache.in_use + dim;
    struct bin *b = find_bin(dim, pinned, 0);
    if (b && b->count > 0) {
        raw = b->blocks[--b->count];
        cache.cached -= dim;
        cache.stats.reused++;
    } else {
        cache.stats.allocated++;
        evicted = evict_over_high_water(dim);
    }
    cache.in_use += dim;
    cache.received += received ? dim : 0;
    if (raw)
        ((struct header *)raw)->received = received;
    if (cache.observe)
        cache.observe(cache.observe_arg, cache.in_use, cache.received);
    pthread_mutex_unlock(&cache.lock);
    release_chain(evicted);
    if (!raw) {
        if (dim > SIZE_MAX - HEADER_BYTES ||
            posix_memalign(&raw, HEADER_BYTES, dim + HEADER_BYTES)) {
            pthread_mutex_lock(&cache.lock);
            cache.in_use -= dim;
            cache.received -= received ? dim : 0;
            pthread_mutex_unlock(&cache.lock);
            return -ENOMEM;
        }
        struct header *h = raw;
        h->magic = HEADER_MAGIC;
        h->dim = dim;
        h->received = received;
        h->pinned = pinned && starpu_memory_pin((char *)raw + HEADER_BYTES, dim) == 0;
    }
    if (cache.poison)
        memset((char *)raw + HEADER_BYTES, 0xff, dim);
    *out = (char *)raw + HEADER_BYTES;
    return 0;
}

int tsl_host_cache_free(unsigned node, void *ptr, size_t dim, int flags)
{
    (void)node, (void)dim, (void)flags; /* starpu_free() passes no size: the header has it */
    void *raw = (char *)ptr - HEADER_BYTES;
    struct header *h = raw;
    if (h->magic != HEADER_MAGIC) {
        /* Not ours (cannot happen while the hooks span StarPU's whole life): keep it
         * rather than hand a foreign, possibly pinned, block to free(). */
        fprintf(stderr, "tessel: host cache: freeing a block it did not allocate; leaked\n");
        return 0;
    }
    size_t size = h->dim;
    pthread_mutex_lock(&cache.lock);
    cache.in_use -= size < cache.in_use ? size : cache.in_use;
    if (h->received)
        cache.received -= size < cache.received ? size : cache.received;
    h->received = 0;
    if (cache.observe)
        cache.observe(cache.observe_arg, cache.in_use, cache.received);
    if (cache.limit > 0 && size <= cache.max_block && cache.cached + size <= cache.limit) {
        struct bin *b = find_bin(size, h->pinned, 1);
        if (b && b->count == b->cap) {
            int32_t cap = b->cap ? 2 * b->cap : 4;
            void **blocks = realloc(b->blocks, (size_t)cap * sizeof *blocks);
            if (blocks) {
                b->blocks = blocks;
                b->cap = cap;
            }
        }
        if (b && b->count < b->cap) {
            b->blocks[b->count++] = raw;
            cache.cached += size;
            if (cache.cached > cache.stats.most_cached)
                cache.stats.most_cached = cache.cached;
            raw = NULL;
        }
    }
    pthread_mutex_unlock(&cache.lock);
    if (raw)
        release_block(raw);
    return 0;
}

void tsl_host_cache_install(size_t limit)
{
    pthread_mutex_lock(&cache.lock);
    cache.installed = 1;
    const char *poison = getenv("TSL_POISON_ALLOC");
    cache.poison = poison && poison[0] && strcmp(poison, "0") != 0;
    cache.limit = limit;
    cache.max_block = limit / 4;
    cache.cached = 0;
    cache.in_use = 0;
    cache.received = 0;
    cache.high_water = 0;
    memset(&cache.stats, 0, sizeof cache.stats);
    pthread_mutex_unlock(&cache.lock);
    starpu_malloc_set_hooks(tsl_host_cache_malloc, tsl_host_cache_free);
}

int tsl_host_cache_query(tsl_host_cache_stats *stats, size_t *kept)
{
    pthread_mutex_lock(&cache.lock);
    int installed = cache.installed;
    if (installed) {
        *stats = cache.stats;
        stats->in_use = cache.in_use;
        stats->received = cache.received;
        stats->high_water = cache.high_water;
        *kept = cache.cached;
    } else {
        memset(stats, 0, sizeof *stats);
        *kept = 0;
    }
    pthread_mutex_unlock(&cache.lock);
    return installed;
}

void tsl_host_cache_uninstall(tsl_host_cache_stats *stats)
{
    pthread_mutex_lock(&cache.lock);
    if (!cache.installed) {
        pthread_mutex_unlock(&cache.lock);
        return;
    }
    for (int32_t i = 0; i < cache.nbins; i++) {
        for (int32_t k = 0; k < cache.bins[i].count; k++)
            release_block(cache.bins[i].blocks[k]);
        free(cache.bins[i].blocks);
    }
    free(cache.bins);
    cache.bins = NULL;
    cache.nbins = cache.bins_cap = 0;
    cache.cached = 0;
    cache.installed = 0;
    if (stats) {
        *stats = cache.stats;
        stats->in_use = cache.in_use;
        stats->received = cache.received;
        stats->high_water = cache.high_water;
    }
    pthread_mutex_unlock(&cache.lock);
    starpu_malloc_set_hooks(NULL, NULL);
}

void tsl_host_cache_observe(void (*fn)(void *arg, size_t in_use, size_t received), void *arg)
{
    pthread_mutex_lock(&cache.lock);
    cache.observe = fn;
    cache.observe_arg = arg;
    pthread_mutex_unlock(&cache.lock);
}

void tsl_host_cache_unobserve(void *arg)
{
    pthread_mutex_lock(&cache.lock);
    if (cache.observe_arg == arg) {
        cache.observe = NULL;
        cache.observe_arg = NULL;
    }
    pthread_mutex_unlock(&cache.lock);
}
