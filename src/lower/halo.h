/* Halo exchange for ops whose window crosses tile borders (src/lower/halo.c): which boxes of
 * neighbouring tiles a tile's window needs, pack tasks that cut them into their own handles
 * on the neighbour's owner (StarPU-MPI moves only those), and the adjoint: gradient slabs
 * added back into the tiles they came from. Spatial boxes are in global coordinates. */
#ifndef TESSEL_SRC_LOWER_HALO_H
#define TESSEL_SRC_LOWER_HALO_H

#include <string.h>

#include "codelets/conv.h"
#include "internal.h"

/* The halo of tile `tile` of x for `window` (spatial, global coordinates): the other tiles
 * of the same sample and channel range whose box meets window ∩ global input, and those
 * parts, in tile order. `own` gets the tile's own spatial box. More than `max` slabs is a
 * TSL_ERR_SHAPE error (tiles too small for the window). With `shift` (circular padding), the
 * window's parts outside the input too, wrapped round it: each image of the input (moved by
 * -1, 0 or +1 times its size per dimension) that the window meets gives the parts of every
 * tile in it (the own tile's as well, away from image 0), shift[k] the move of slab k. */
tsl_status tsl_halo_slabs(struct tsl_tensor *x, int64_t tile, int spatial,
                          const tsl_conv_box *window, tsl_conv_box *own, int32_t *nslabs,
                          int64_t *src_tile, tsl_conv_box *boxes, int64_t (*shift)[3], int32_t max);

/* Elements of a slab of `box` for tile `tile`'s samples and all channels. */
int64_t tsl_halo_numel(struct tsl_tensor *x, int64_t tile, int spatial, const tsl_conv_box *box);

/* A temporary handle holding `box` of x's tile `src_tile` (samples and channels of that
 * tile; the tile's layout), filled by a pack task on the tile's owner. Release it with
 * tsl_temp_handle_release() after its readers are submitted. */
tsl_status tsl_halo_pack(struct tsl_tensor *x, int64_t src_tile, int spatial,
                         const tsl_conv_box *box, starpu_data_handle_t *slab);

/* Add the slab `slab` (as packed for `box` of tile `tile`) into dx's tile `tile`: a task on
 * the tile's owner; StarPU-MPI brings the slab. */
tsl_status tsl_halo_accumulate(struct tsl_tensor *dx, int64_t tile, const tsl_conv_box *box,
                               starpu_data_handle_t slab);

/* A window of unit size in every dimension, no slabs: callers fill the spatial ones. */
static inline void tsl_halo_window_reset(tsl_conv_window *w)
{
    memset(w, 0, sizeof *w);
    for (int d = 0; d < 3; d++)
        w->global[d] = w->window.size[d] = 1;
}

/* Pack the `w->nslabs` halo slabs of window `w` (their source tiles in `src`) into
 * `slabs`; on error the ones made are released. */
tsl_status tsl_halo_pack_window(struct tsl_tensor *x, int spatial, const tsl_conv_window *w,
                                const int64_t *src, starpu_data_handle_t *slabs);

/* Release `n` slab handles (NULL entries skipped). */
void tsl_halo_release(struct tsl_context *ctx, starpu_data_handle_t *slabs, int64_t n);

/* Gradient slabs of a backward pass over windows: tile i's task writes its window gradient's
 * part for tile i and one slab per neighbour part; tsl_halo_returns_finish() then adds every
 * slab into the tile it belongs to, per tile in a fixed order (deterministic sums). */
typedef struct tsl_halo_returns {
    int64_t ntiles;
    int32_t *nslabs;             /* [ntiles] */
    int64_t *src;                /* [ntiles * TSL_CONV_MAX_SLABS] */
    tsl_conv_box *box;           /* [ntiles * TSL_CONV_MAX_SLABS] */
    starpu_data_handle_t *slabs; /* [ntiles * TSL_CONV_MAX_SLABS] */
} tsl_halo_returns;

tsl_status tsl_halo_returns_init(tsl_halo_returns *r, struct tsl_context *ctx, int64_t ntiles);

/* Register the gradient slabs of tile `tile`'s window `w` (sources `src`) for dx, owned by
 * `owner` (where the task writing them runs); their handles are then r->slabs + tile *
 * TSL_CONV_MAX_SLABS. */
tsl_status tsl_halo_returns_add(tsl_halo_returns *r, struct tsl_tensor *dx, int64_t tile,
                                int spatial, const tsl_conv_window *w, const int64_t *src,
                                int owner);

/* With `accumulate`, add every slab into its tile; always release and free everything. */
tsl_status tsl_halo_returns_finish(tsl_halo_returns *r, struct tsl_tensor *dx, int accumulate);

/* Halo slabs a forward pass keeps for the backward pass of the same op on the same input (the
 * weight gradient reads the same windows), so they are cut and sent once per step. Only a
 * caller that knows the input does not change in between may keep them (the model executor);
 * tsl_halo_keep_release() drops what is left. Zero-initialise before first use. */
typedef struct tsl_halo_keep {
    struct tsl_tensor *x; /* the input the slabs were cut from; NULL when nothing is kept */
    int64_t ntiles;
    int32_t *nslabs;             /* [ntiles] */
    starpu_data_handle_t *slabs; /* [ntiles * TSL_CONV_MAX_SLABS]; NULL once used */
} tsl_halo_keep;

void tsl_halo_keep_release(struct tsl_context *ctx, tsl_halo_keep *keep);

#endif /* TESSEL_SRC_LOWER_HALO_H */
