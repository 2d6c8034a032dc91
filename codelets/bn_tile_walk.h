/* How the threads of a batch-norm tile kernel (batchnorm.cu) walk a tile: which channel a
 * thread takes and which elements of it, in functions the CPU tests run too
 * (tests/unit/test_batchnorm_kernels.cpp: every element exactly once, by a thread of its own
 * channel, and no block over the exact sums' bound).
 *
 * A block has TSL_BN_WALK_THREADS threads and one group of channels (grid row y). Channels-last
 * tiles put up to TSL_BN_WALK_GROUP channels side by side in a group: thread t takes channel
 * t % group of the group and rows (sample x position) t / group, t / group + rows a block, ...,
 * so a warp reads whole runs of neighbouring channels (coalesced), and each thread keeps one
 * channel (its own exact-sum accumulator, its channel's constants). Plain tiles have one
 * channel a group: the threads of a block walk that channel's samples x positions, contiguous
 * within a sample. Neither walk divides per element: the position advances by a constant
 * step. */
#ifndef TESSEL_CODELETS_BN_TILE_WALK_H
#define TESSEL_CODELETS_BN_TILE_WALK_H

#include <stdint.h>

#include "hd.h"

#define TSL_BN_WALK_THREADS 256
#define TSL_BN_WALK_GROUP 16

typedef struct tsl_bn_walk {
    int64_t samples, inner, cext; /* the tile: samples x channels x inner positions */
    int32_t channels_last;        /* elements channel-fastest, else plain */
    int32_t group;                /* channels a block takes */
} tsl_bn_walk;

/* Where one thread is in its walk. */
typedef struct tsl_bn_cursor {
    int64_t j, stride;    /* channels-last: the row and the rows between two of the thread's */
    int64_t s, p, ds, dp; /* plain: sample and position, and the step in both */
} tsl_bn_cursor;

static inline tsl_bn_walk tsl_bn_walk_make(int64_t samples, int64_t inner, int64_t cext,
                                           int channels_last)
{
    tsl_bn_walk w;
    w.samples = samples;
    w.inner = inner;
    w.cext = cext;
    w.channels_last = channels_last != 0;
    w.group = channels_last
                  ? (int32_t)(cext < TSL_BN_WALK_GROUP ? (cext > 0 ? cext : 1) : TSL_BN_WALK_GROUP)
                  : 1;
    return w;
}

/* Rows (sample x position) a block takes at once. */
TSL_HD static inline int64_t tsl_bn_walk_rows(const tsl_bn_walk *w)
{
    return w->channels_last ? TSL_BN_WALK_THREADS / w->group : TSL_BN_WALK_THREADS;
}

/* The grid: *gy channel groups, *gx blocks each, at most about max_blocks in all, and enough
 * that no block takes more than block_elements + TSL_BN_WALK_THREADS elements of a channel. */
static inline void tsl_bn_walk_grid(const tsl_bn_walk *w, int64_t max_blocks,
                                    int64_t block_elements, int64_t *gx, int64_t *gy)
{
    int64_t n = w->samples * w->inner, rows = tsl_bn_walk_rows(w);
    int64_t groups = (w->cext + w->group - 1) / w->group;
    int64_t per_group = groups > 0 && max_blocks / groups > 1 ? max_blocks / groups : 1;
    int64_t b = (n + rows - 1) / rows;
    b = b < per_group ? b : per_group;
    int64_t need = (n + block_elements - 1) / block_elements;
    b = b > need ? b : need;
    *gx = b > 0 ? b : 1;
    *gy = groups > 0 ? groups : 1;
}

/* The tile channel thread tx of a block in grid row by takes; -1 for none. */
TSL_HD static inline int64_t tsl_bn_walk_channel(const tsl_bn_walk *w, int64_t by, int tx)
{
    if (tx / w->group >= tsl_bn_walk_rows(w))
        return -1;
    int64_t c = by * w->group + tx % w->group;
    return c < w->cext ? c : -1;
}

/* The first element (*i, an index into the tile) of channel c that thread tx of block bx (of
 * gx along x) takes; 0 when it takes none. */
TSL_HD static inline int tsl_bn_walk_begin(const tsl_bn_walk *w, int64_t bx, int tx, int64_t gx,
                                           int64_t c, tsl_bn_cursor *cur, int64_t *i)
{
    int64_t n = w->samples * w->inner;
    if (w->channels_last) {
        int64_t rows = tsl_bn_walk_rows(w);
        cur->j = bx * rows + tx / w->group;
        cur->stride = gx * rows;
        *i = cur->j * w->cext + c;
        return cur->j < n;
    }
    int64_t j = bx * TSL_BN_WALK_THREADS + tx, stride = gx * TSL_BN_WALK_THREADS;
    if (j >= n)
        return 0;
    cur->s = j / w->inner;
    cur->p = j - cur->s * w->inner;
    cur->ds = stride / w->inner;
    cur->dp = stride - cur->ds * w->inner;
    *i = (cur->s * w->cext + c) * w->inner + cur->p;
    return 1;
}

/* The thread's next element of channel c; 0 after its last. */
TSL_HD static inline int tsl_bn_walk_next(const tsl_bn_walk *w, int64_t c, tsl_bn_cursor *cur,
                                          int64_t *i)
{
    if (w->channels_last) {
        cur->j += cur->stride;
        *i = cur->j * w->cext + c;
        return cur->j < w->samples * w->inner;
    }
    cur->p += cur->dp;
    cur->s += cur->ds;
    if (cur->p >= w->inner) {
        cur->p -= w->inner;
        cur->s++;
    }
    *i = (cur->s * w->cext + c) * w->inner + cur->p;
    return cur->s < w->samples;
}

#endif /* TESSEL_CODELETS_BN_TILE_WALK_H */
