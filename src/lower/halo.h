/* Halo exchange for ops whose window crosses tile borders (src/lower/halo.c): which boxes of
 * neighbouring tiles a tile's window needs, pack tasks that cut them into their own handles
 * on the neighbour's owner (StarPU-MPI moves only those), and the adjoint: gradient slabs
 * added back into the tiles they came from. Spatial boxes are in global coordinates. */
#ifndef TESSEL_SRC_LOWER_HALO_H
#define TESSEL_SRC_LOWER_HALO_H

#include "../../codelets/conv.h"
#include "../internal.h"

/* The halo of tile `tile` of x for `window` (spatial, global coordinates): the other tiles
 * of the same sample and channel range whose box meets window ∩ global input, and those
 * parts, in tile order. `own` gets the tile's own spatial box. More than `max` slabs is a
 * TSL_ERR_SHAPE error (tiles too small for the window). */
tsl_status tsl_halo_slabs(struct tsl_tensor *x, int64_t tile, int spatial,
                          const tsl_conv_box *window, tsl_conv_box *own, int32_t *nslabs,
                          int64_t *src_tile, tsl_conv_box *boxes, int32_t max);

/* Elements of a slab of `box` for tile `tile`'s samples and all channels. */
int64_t tsl_halo_numel(struct tsl_tensor *x, int64_t tile, int spatial, const tsl_conv_box *box);

/* A temporary handle holding `box` of x's tile `src_tile` (samples and channels of that
 * tile; the tile's layout), filled by a pack task on the tile's owner. Release it with
 * tsl_temp_handle_release() after its readers are submitted. */
tsl_status tsl_halo_pack(struct tsl_tensor *x, int64_t src_tile, int spatial,
                         const tsl_conv_box *box, starpu_data_handle_t *slab);

/* Add the slab `slab` (as packed for `box` of tile `tile`) into dx's tile `tile`: a task on
 * the tile's owner; StarPU-MPI brings the slab. */
tsl_status tsl_halo_accumulate(struct tsl_tensor *dx, int64_t tile, int spatial,
                               const tsl_conv_box *box, starpu_data_handle_t slab);

#endif /* TESSEL_SRC_LOWER_HALO_H */
