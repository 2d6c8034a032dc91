/**
 * @file data.h
 * @brief Datasets for training: Fashion-MNIST, a synthetic segmentation set and `.npy`
 *        directories, opened from a one-line spec; batches read into caller buffers; a
 *        deterministic epoch order; a loader that prefetches the next batch on a thread.
 *
 * Nothing here needs a context, StarPU or MPI: a dataset is read by one process (the rank
 * that then scatters a batch into tiled tensors), or by every rank, each reading the boxes
 * of the samples its tiles hold (tsl_dataset_read_box(), tsl_tensors_read_samples() in
 * tessel/io.h).
 *
 * Spec syntax: `NAME[:OPTIONS]`, OPTIONS a comma-separated list of `key=value`; the first
 * option may be a bare value, which means `dir=value`.
 *
 * - `fashion-mnist[:dir=DIR]`: Fashion-MNIST from its IDX files (gzip-compressed or plain;
 *   DIR defaults to ::TSL_FASHION_MNIST_DIR). x f32 1 x 28 x 28, one label 0..9 per sample.
 *   The test split is the t10k files.
 * - `synthetic[:dims=D,size=S,samples=N,classes=K,channels=C,objects=O,noise=F,seed=X,
 *   labels=voxel|sample]`: a segmentation set generated on demand (defaults 2, 32, 64, 3, 1,
 *   4, 0.5, 0, voxel; seed up to 10^18): in each sample O spheres or boxes of classes 1..K-1
 *   on background 0, voxel value = class id + F * noise (about N(0, 1)). x f32 C x S^D (D =
 *   1, 2 or 3), y one label per voxel, or with labels=sample one per sample (a classification
 *   set): the class covering the most voxels apart from background (the smaller on a tie; 0
 *   when nothing is painted). A sample depends only on (seed, split, index); the test split
 *   draws from another stream.
 * - `npy:DIR[,classes=K]`: DIR/x.npy (f32, N x C x 0 to 3 spatial sizes) and DIR/y.npy
 *   (i64, N labels, or N x the spatial sizes of x); the test split reads DIR/x_test.npy and
 *   DIR/y_test.npy. Samples are read from the files when asked (larger than memory is
 *   fine). K defaults to the largest label + 1.
 * - `hdf5:FILE[,x=NAME,y=NAME,x_test=NAME,y_test=NAME,classes=K]`: an HDF5 file with datasets
 *   x (any float type, read as f32; N x C x 0 to 3 spatial sizes) and y (any integer type, read
 *   as i64; N, or N x the spatial sizes of x); the test split reads x_test and y_test (names
 *   default to these). Each read is a hyperslab of one sample's box, from the file when asked
 *   (larger than memory is fine; several readers at once are serialised: HDF5's serial
 *   library). K defaults to the largest label + 1.
 *
 * npy directories and HDF5 files also give a model's further inputs by name
 * (tsl_dataset_input_shape()): DIR/NAME.npy (NAME_test.npy), or the file's dataset NAME
 * (NAME_test).
 *
 * Fashion-MNIST pixels p become (p / 255 - 0.2860) / 0.3530 (the training set's mean and
 * standard deviation). Unknown keys, bad values, missing or malformed files are refused
 * with a status and a message (tsl_last_error()); nothing aborts.
 */
#ifndef TESSEL_DATA_H
#define TESSEL_DATA_H

#include <stdint.h>

#include "tessel/export.h"
#include "tessel/status.h"
#include "tessel/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Fashion-MNIST normalisation: mean of the training pixels scaled to [0, 1]. */
#define TSL_FASHION_MNIST_MEAN 0.2860
/** Fashion-MNIST normalisation: standard deviation of the training pixels scaled to [0, 1]. */
#define TSL_FASHION_MNIST_STD 0.3530
/** Directory of the Debian package dataset-fashion-mnist. */
#define TSL_FASHION_MNIST_DIR "/usr/share/datasets/fashion-mnist"

/** Opaque dataset handle. */
typedef struct tsl_dataset *tsl_dataset_t;

/** Which part of a dataset to open. */
typedef enum tsl_split {
    TSL_SPLIT_TRAIN = 0, /**< training samples */
    TSL_SPLIT_TEST = 1,  /**< held-out samples */
} tsl_split;

/** What a dataset holds. */
typedef struct tsl_dataset_info {
    /** Number of samples, indices 0 .. samples - 1. */
    int64_t samples;
    /** Number of classes: labels are in [0, classes). */
    int32_t classes;
    /** Shape of one sample's x: C, then 0 to 3 spatial sizes (ndim 1 to 4). */
    tsl_shape sample_shape;
    /** Shape of one sample's labels: ndim 0 for one class id per sample (classification),
     *  otherwise the spatial sizes of x (one class id per voxel, segmentation). */
    tsl_shape label_shape;
    /** Floats per sample (product of sample_shape). */
    int64_t sample_numel;
    /** Labels per sample (1 for classification, product of label_shape otherwise). */
    int64_t label_numel;
    /** 1: the dataset gives float targets instead of class labels (an `.npy` directory whose
     *  y is f32, an HDF5 file whose y holds floats): label_shape is then one sample's target shape
     * (C, spatial...), classes 0, and the targets are read with tsl_dataset_read_target_box()
     * (losses on float targets: MSE, L1). */
    int32_t targets;
} tsl_dataset_info;

/**
 * @brief Open a dataset.
 * @param[out] dataset the dataset (tsl_dataset_destroy()); untouched on failure
 * @param[in]  spec    dataset spec (see the file comment), e.g. `fashion-mnist`,
 *                     `synthetic:dims=3,size=64,samples=32,classes=3`, `npy:/data/set`
 * @param[in]  split   ::TSL_SPLIT_TRAIN or ::TSL_SPLIT_TEST
 * @return ::TSL_ERR_INVALID_ARG for a bad spec (unknown name or key, bad value),
 *         ::TSL_ERR_IO for a missing file, ::TSL_ERR_FORMAT for a malformed file,
 *         ::TSL_ERR_SHAPE / ::TSL_ERR_DTYPE for arrays that do not fit together
 *
 * Fashion-MNIST and `.npy` data are read into memory here; synthetic samples are
 * generated when read.
 */
TSL_API tsl_status tsl_dataset_open(tsl_dataset_t *dataset, const char *spec, tsl_split split);

/**
 * @brief How an application feeds a dataset of its own storage (tsl_dataset_create_callback()):
 * read one box of sample @p index into @p x and its labels into @p y, as tsl_dataset_read_box()
 * defines the box (x: the sample's elements start[d] .. start[d] + extent[d] - 1 along each
 * axis of the sample shape, in C order, or NULL to skip; y: the labels of the same spatial box,
 * or the sample's one label, or NULL to skip), labels in [0, classes). Return ::TSL_OK, or an
 * error status (a message through the caller's own channel): the tile is then poisoned and
 * the step that reads it fails on every rank before it changes a parameter. Called from StarPU
 * worker threads, several at once and for boxes of the same sample: it must be thread-safe.
 */
typedef tsl_status (*tsl_read_box_fn)(int64_t index, const int64_t *start, const int64_t *extent,
                                      float *x, int64_t *y, void *user);

/**
 * @brief A dataset whose samples the application provides through @p read_box (with @p user):
 * @p samples samples of shape @p sample_dims (C, then 0 to 3 spatial sizes: @p sample_ndim 1
 * to 4), @p classes classes (2 to 2^24), one label per position of the spatial box when
 * @p per_position, else one per sample. tsl_dataset_read(), tsl_tensors_read_samples() and
 * the model's dataset steps read it as they read tessel's own kinds: each rank asks only for
 * the boxes of its tiles. Every rank of a collective call creates its own with the same
 * description. Not collective.
 */
TSL_API tsl_status tsl_dataset_create_callback(tsl_dataset_t *dataset, int64_t samples,
                                               int32_t classes, int32_t sample_ndim,
                                               const int64_t *sample_dims, int32_t per_position,
                                               tsl_read_box_fn read_box, void *user);

/**
 * @brief How an application feeds the float targets of a dataset of its own storage
 * (tsl_dataset_create_callback_targets()): the box @p start, @p extent (the target shape's axes:
 * C, spatial...) of sample @p index's targets into @p targets (row-major, the product of
 * @p extent floats), as tsl_dataset_read_target_box() defines it. Returns and threads as
 * ::tsl_read_box_fn.
 */
typedef tsl_status (*tsl_read_target_box_fn)(int64_t index, const int64_t *start,
                                             const int64_t *extent, float *targets, void *user);

/**
 * @brief A dataset of float targets whose samples and targets the application provides (losses
 * on float targets: MSE, L1): @p samples samples of shape @p sample_dims (@p sample_ndim 1 to
 * 4 axes, C first), each with a target of shape @p target_dims (@p target_ndim 1 to 4 axes, C
 * first: the model output's shape per sample). @p read_box gives the samples' boxes (its y is
 * always NULL), @p read_targets the targets' boxes; each rank asks only for its tiles' boxes,
 * as with tsl_dataset_create_callback(). Not collective.
 */
TSL_API tsl_status tsl_dataset_create_callback_targets(
    tsl_dataset_t *dataset, int64_t samples, int32_t sample_ndim, const int64_t *sample_dims,
    int32_t target_ndim, const int64_t *target_dims, tsl_read_box_fn read_box,
    tsl_read_target_box_fn read_targets, void *user);

/** @brief Free a dataset. NULL is a no-op. No loader may still use it. */
TSL_API tsl_status tsl_dataset_destroy(tsl_dataset_t dataset);

/** @brief Number of samples and classes, sample and label shapes. */
TSL_API tsl_status tsl_dataset_get_info(tsl_dataset_t dataset, tsl_dataset_info *info);

/**
 * @brief Read samples into caller buffers: sample indices[i] goes to
 * x + i * sample_numel and y + i * label_numel. Reading does not change the dataset, so
 * several threads may read one dataset at the same time.
 * @param[in]  indices @p count sample indices in [0, samples), repeats allowed
 * @param[in]  count   number of samples to read (0 reads nothing)
 * @param[out] x       count * sample_numel floats, or NULL to skip the samples
 * @param[out] y       count * label_numel labels, or NULL to skip the labels
 */
TSL_API tsl_status tsl_dataset_read(tsl_dataset_t dataset, const int64_t *indices, int64_t count,
                                    float *x, int64_t *y);

/**
 * @brief Read one box of one sample: @p x gets the sample's elements start[d] ..
 * start[d] + extent[d] - 1 along each axis d of sample_shape (C, then the spatial sizes),
 * in C order (the product of @p extent floats); @p y gets the labels of the same spatial box
 * (axes 1 .. of @p start and @p extent over label_shape), or the sample's one label for a
 * classification set. The values are exactly those of tsl_dataset_read()'s sample, and
 * nothing outside the box is read: `.npy` files are read a run of consecutive elements at a
 * time, synthetic samples generate only the box (the one label of a classification set
 * counts the whole volume's labels, a row at a time). Thread-safe like tsl_dataset_read().
 * @param[in]  index  sample index in [0, samples)
 * @param[in]  start  sample_shape.ndim first positions
 * @param[in]  extent sample_shape.ndim sizes, each >= 1, the box inside the sample
 * @param[out] x      the box's floats, or NULL to skip them
 * @param[out] y      the box's labels (or the one label), or NULL to skip them
 */
TSL_API tsl_status tsl_dataset_read_box(tsl_dataset_t dataset, int64_t index, const int64_t *start,
                                        const int64_t *extent, float *x, int64_t *y);

/**
 * @brief The box @p start, @p extent (label_shape's axes: C, spatial...) of sample @p index's
 * float targets into @p targets (row-major, extent's product of floats), for a dataset whose
 * info has targets set. ::TSL_ERR_INVALID_ARG for a dataset of class labels or a box outside
 * the targets.
 */
TSL_API tsl_status tsl_dataset_read_target_box(tsl_dataset_t dataset, int64_t index,
                                               const int64_t *start, const int64_t *extent,
                                               float *targets);

/**
 * @brief The per-sample shape of further input @p name of the dataset (a model of several
 * inputs, tsl_graph_add_input(): input 0 is x, each other is read by its name): an `.npy`
 * directory's NAME.npy (NAME_test.npy for the test split), f32, one row per sample, or an HDF5
 * file's dataset NAME (NAME_test), any float type; opened on first use. ::TSL_ERR_IO when it is
 * missing, ::TSL_ERR_DTYPE / ::TSL_ERR_SHAPE when it does
 * not fit, ::TSL_ERR_UNSUPPORTED for the kinds that give x alone. Thread-safe.
 */
TSL_API tsl_status tsl_dataset_input_shape(tsl_dataset_t dataset, const char *name,
                                           tsl_shape *shape);

/** @brief One box of sample @p index of further input @p name (tsl_dataset_input_shape()) into
 *  @p x, as tsl_dataset_read_box() reads x's. Thread-safe. */
TSL_API tsl_status tsl_dataset_read_input_box(tsl_dataset_t dataset, const char *name,
                                              int64_t index, const int64_t *start,
                                              const int64_t *extent, float *x);

/**
 * @brief The order in which an epoch visits the samples: order[i] = i without shuffling,
 * otherwise a permutation of [0, @p count) that depends only on (@p seed, @p epoch).
 *
 * Fisher-Yates (for i from count - 1 down to 1, swap i with j uniform in [0, i]) driven by
 * SplitMix64: initial state mix(mix(seed + G) ^ epoch), where mix is SplitMix64's output
 * function and G = 0x9e3779b97f4a7c15 its increment; each draw adds G to the state and
 * returns mix(state); j = r mod (i + 1), draws r below 2^64 mod (i + 1) rejected (no
 * bias). Integer arithmetic only: the same permutation on every machine.
 * @param[out] order   @p count indices
 * @param[in]  shuffle 0: identity order; otherwise shuffled
 */
TSL_API tsl_status tsl_dataset_epoch_order(int64_t *order, int64_t count, uint64_t seed,
                                           int64_t epoch, int32_t shuffle);

/** Opaque batch loader handle. */
typedef struct tsl_loader *tsl_loader_t;

/** One batch handed out by tsl_loader_next(). */
typedef struct tsl_batch {
    /** count * sample_numel floats, valid until the next tsl_loader_next() or destroy. */
    const float *x;
    /** count * label_numel labels, valid as long as @ref x; NULL for a dataset of float
     *  targets. */
    const int64_t *y;
    /** The sample index of every row of the batch, valid as long as @ref x. */
    const int64_t *indices;
    /** Samples in the batch: the batch size, except for the last batch of an epoch when
     *  the loader keeps incomplete batches. */
    int64_t count;
    /** Epoch of the batch, from 0. */
    int64_t epoch;
    /** Position of the batch in its epoch, from 0. */
    int64_t index;
    /** 1 for the last batch of its epoch, 0 otherwise. */
    int32_t last;
    /** A dataset of float targets (its info's targets set): count * label_numel floats, each
     *  sample's whole target (tsl_dataset_read_target_box()), valid as long as @ref x, for
     *  tsl_model_train_step_targets(); NULL for a dataset of class labels. */
    const float *targets;
} tsl_batch;

/**
 * @brief Create a loader: epoch after epoch, it cuts tsl_dataset_epoch_order(seed, epoch)
 * into batches, and a background thread reads the next batch while the caller works on the
 * current one (two buffers). A batch of more than 64 MiB (samples and labels) is read when
 * tsl_loader_next() asks for it, into one buffer, so that huge samples are not held twice.
 * The batches are exactly those tsl_dataset_read() gives for the same indices.
 * @param[out] loader     the loader (tsl_loader_destroy())
 * @param[in]  dataset    read by the loader's thread; must outlive the loader
 * @param[in]  batch_size samples per batch, >= 1
 * @param[in]  seed       shuffling seed
 * @param[in]  shuffle    0: every epoch visits samples in order; otherwise shuffled
 * @param[in]  drop_last  non-zero: an epoch's final incomplete batch is skipped (a dataset
 *                        smaller than one batch is then an error)
 */
TSL_API tsl_status tsl_loader_create(tsl_loader_t *loader, tsl_dataset_t dataset,
                                     int64_t batch_size, uint64_t seed, int32_t shuffle,
                                     int32_t drop_last);

/**
 * @brief The next batch; after an epoch's last batch comes the first batch of the next
 * epoch. Waits if the thread has not finished reading it. An error met by the thread is
 * returned here with its message, and again by every later call.
 * @param[out] batch the batch; its pointers stay valid until the next call or destroy
 */
TSL_API tsl_status tsl_loader_next(tsl_loader_t loader, tsl_batch *batch);

/**
 * @brief Make batch @p batch of epoch @p epoch (both from 0) the next one tsl_loader_next()
 * hands out, as if the earlier batches had been taken: resuming a run from a checkpoint.
 * Invalidates the pointers of the last batch. Clears an earlier read error.
 */
TSL_API tsl_status tsl_loader_seek(tsl_loader_t loader, int64_t epoch, int64_t batch);

/** @brief Batches per epoch. */
TSL_API tsl_status tsl_loader_batches_per_epoch(tsl_loader_t loader, int64_t *batches);

/** @brief Stop the thread and free the loader and its buffers. NULL is a no-op. */
TSL_API tsl_status tsl_loader_destroy(tsl_loader_t loader);

#ifdef __cplusplus
}
#endif

#endif /* TESSEL_DATA_H */
