/**
 * @file io.h
 * @brief `.npy` files: header parsing, whole-array read and write, streamed writes, tensors read
 * from and written to files through scatter and gather, and tensors filled from a dataset by the
 * owners of their tiles.
 *
 * Supported: format versions 1.0, 2.0 and 3.0; little-endian (or byte-sized) f32, f64,
 * i32, i64 and u8; C order; 1 to TSL_MAX_DIMS dimensions, none of them zero. Anything else
 * (Fortran order, big-endian, other dtypes, a truncated or oversized file, a malformed
 * header) is refused with ::TSL_ERR_FORMAT or ::TSL_ERR_UNSUPPORTED and a message.
 */
#ifndef TESSEL_IO_H
#define TESSEL_IO_H

#include <stddef.h>
#include <stdint.h>

#include "tessel/data.h"
#include "tessel/export.h"
#include "tessel/status.h"
#include "tessel/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/** What a `.npy` header says. */
typedef struct tsl_npy_header {
    int32_t version_major; /**< 1, 2 or 3 */
    int32_t version_minor; /**< 0 */
    tsl_dtype dtype;
    tsl_shape shape;
    int64_t data_offset; /**< byte offset of the first element */
    int64_t data_bytes;  /**< bytes of the array data */
} tsl_npy_header;

/**
 * @brief Parse a `.npy` header from the first bytes of a file. Pure; no I/O.
 * @param[in]  bytes     the file's first @p size bytes
 * @param[in]  size      how many bytes are available (the header must fit in them)
 * @param[out] header    what the header says
 */
TSL_API tsl_status tsl_npy_parse_header(const void *bytes, size_t size, tsl_npy_header *header);

/**
 * @brief Read a whole `.npy` file.
 * @param[in]  path   file name
 * @param[out] header what its header says
 * @param[out] data   header->data_bytes bytes, C order; free with tsl_free()
 */
TSL_API tsl_status tsl_npy_read(const char *path, tsl_npy_header *header, void **data);

/**
 * @brief Write a whole array as a `.npy` file, format version 1.0 (a header of at most
 * TSL_MAX_DIMS sizes always fits it), data aligned to 64 bytes. The file is written under
 * a temporary name, synced and renamed, so a failure never leaves a partial file under
 * @p path.
 */
TSL_API tsl_status tsl_npy_write(const char *path, tsl_dtype dtype, const tsl_shape *shape,
                                 const void *data);

/** A `.npy` file being written in pieces (tsl_npy_writer_open()). */
typedef struct tsl_npy_writer *tsl_npy_writer_t;

/**
 * @brief Start writing an array of @p dtype and @p shape to @p path a piece at a time, for
 * arrays too large to hold whole. The file is written under a temporary name and appears
 * under @p path only when tsl_npy_writer_close() finds every element appended.
 */
TSL_API tsl_status tsl_npy_writer_open(tsl_npy_writer_t *writer, const char *path, tsl_dtype dtype,
                                       const tsl_shape *shape);

/** @brief Append the next @p count elements (C order). More than the shape holds is an error
 *  that also makes the file fail to close. */
TSL_API tsl_status tsl_npy_writer_append(tsl_npy_writer_t writer, const void *data, int64_t count);

/** @brief Finish: sync and rename the file into place when every element was appended and no
 *  write failed; otherwise an error, and nothing appears under the path. Frees @p writer
 *  either way (NULL is a no-op). */
TSL_API tsl_status tsl_npy_writer_close(tsl_npy_writer_t writer);

/** @brief Abandon a writer: its temporary file is removed, nothing appears under the path. */
TSL_API void tsl_npy_writer_discard(tsl_npy_writer_t writer);

/** @brief Free memory returned by tessel (tsl_npy_read()). NULL is a no-op. */
TSL_API void tsl_free(void *ptr);

/**
 * @brief Read a `.npy` file on @p root and scatter it into a new tensor. Collective; an
 * error on root (missing or malformed file) is returned on every rank with its message.
 * @param[out] tensor the new tensor, with the file's dtype and shape
 * @param[in]  grid   tile grid, or NULL for one tile; must fit the file's shape
 * @param[in]  owners owner map, or NULL for tsl_owner_block(NULL)
 */
TSL_API tsl_status tsl_tensor_read_npy(tsl_tensor_t *tensor, tsl_context_t ctx, const char *path,
                                       int32_t root, const tsl_tile_grid *grid,
                                       const tsl_owner_map *owners);

/** @brief Gather @p tensor on @p root and write it there as a `.npy` file. Collective;
 *  an error on root is returned on every rank. */
TSL_API tsl_status tsl_tensor_write_npy(tsl_tensor_t tensor, const char *path, int32_t root);

/**
 * @brief Fill @p x and @p labels with samples of @p dataset, each tile read by its owner: a
 * task per tile reads the tile's box of each of its samples (tsl_dataset_read_box()), so no
 * rank holds or sends more of a sample than its own tiles. Row n of both tensors is sample
 * indices[n]. Collective: every rank passes the same indices and an opened copy of the same
 * dataset (checked against rank 0's; otherwise an error on every rank before any task).
 * Asynchronous: the tiles are ready for the tasks submitted after this call.
 * @param[in,out] x       (N, the dataset's sample shape) f32, any grid, owners and layout;
 *                        or NULL
 * @param[in,out] labels  (N, the dataset's label shape) u8, i32 or i64 (narrowed as by
 *                        tsl_tensor_scatter() of labels); or NULL (not both)
 * @param[in]     dataset read on every rank that owns a tile; must outlive the read tasks
 * @param[in]     indices N sample indices in [0, samples)
 *
 * A box that cannot be read inside its task (a `.npy` file changed or gone since it was
 * opened) leaves its tile NaN or invalid labels; tsl_context_check_reads() reports it.
 */
TSL_API tsl_status tsl_tensors_read_samples(tsl_tensor_t x, tsl_tensor_t labels,
                                            tsl_dataset_t dataset, const int64_t *indices);

/**
 * @brief Wait for this rank's tsl_tensors_read_samples() tasks submitted so far and agree
 * whether any failed: collective; the first failure of the lowest failing rank is returned
 * on every rank with its message (and then forgotten), TSL_OK when every read succeeded.
 */
TSL_API tsl_status tsl_context_check_reads(tsl_context_t ctx);

#ifdef __cplusplus
}
#endif

#endif /* TESSEL_IO_H */
