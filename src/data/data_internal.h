/* What the dataset files of src/data/ share: the dataset handle, the parsed spec, the
 * generator, and each dataset kind's open and read calls. Never installed. */
#ifndef TESSEL_SRC_DATA_INTERNAL_H
#define TESSEL_SRC_DATA_INTERNAL_H

#include <pthread.h>
#include <stdint.h>

#include "error.h"
#include "tessel/data.h"
#include "tessel/io.h"

/* ---- SplitMix64: the one generator of this file ---- */

#define GOLDEN_GAMMA 0x9e3779b97f4a7c15ULL

/* SplitMix64's output function: a bijective 64-bit mix with full avalanche. */
static inline uint64_t splitmix_mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static inline uint64_t splitmix_next(uint64_t *state)
{
    *state += GOLDEN_GAMMA;
    return splitmix_mix(*state);
}

/* Initial state of stream `stream` of key `key`. */
static inline uint64_t splitmix_stream(uint64_t key, uint64_t stream)
{
    return splitmix_mix(splitmix_mix(key + GOLDEN_GAMMA) ^ stream);
}

/* Uniform in [0, bound), bound >= 1, without modulo bias: draws below 2^64 mod bound are
 * rejected, so the accepted range is a whole number of copies of [0, bound). */
static inline uint64_t uniform_below(uint64_t *state, uint64_t bound)
{
    uint64_t threshold = (0 - bound) % bound;
    for (;;) {
        uint64_t r = splitmix_next(state);
        if (r >= threshold)
            return r % bound;
    }
}

/* The most classes a file dataset may have, given (classes=) or taken from its labels. */
#define MAX_CLASSES (INT64_C(1) << 24)

/* ---- the spec: NAME[:key=value,...] ---- */

#define SPEC_MAX_OPTIONS 16

typedef struct spec_option {
    const char *key;
    const char *value;
    int bare; /* given without a key: the value of `dir` */
    int used;
} spec_option;

typedef struct dataset_spec {
    const char *original; /* the caller's text, for messages */
    char *text;           /* a copy, cut in place */
    const char *name;
    int count;
    spec_option options[SPEC_MAX_OPTIONS];
} dataset_spec;

/* ---- the dataset ---- */

typedef enum dataset_kind {
    DATASET_FASHION_MNIST,
    DATASET_SYNTHETIC,
    DATASET_NPY,
    DATASET_CALLBACK, /* the application's read_box (tsl_dataset_create_callback) */
    DATASET_HDF5,
} dataset_kind;

typedef struct synthetic_params {
    int32_t dims;
    int64_t size;
    int32_t channels;
    int32_t classes;
    int32_t objects;
    int32_t per_sample; /* labels=sample: one label per sample (classification) */
    double noise;
    uint64_t split_key; /* the generator key of the split: (seed, split) mixed */
} synthetic_params;

/* An npy directory's path and split (the suffix of its file names). */
typedef struct split_dir {
    char *dir;
    const char *suffix; /* "" or "_test" */
} split_dir;

/* A `.npy` file whose samples (rows along the first dimension) are read when asked. */
typedef struct npy_array {
    int fd;
    char *path;
    tsl_npy_header header;
    int64_t row_bytes;
} npy_array;

/* The most further inputs a dataset gives (tsl_dataset_input_shape(); as a graph's). */
#define DATASET_MAX_INPUTS 8

/* A further input of an npy directory (NAME.npy, NAME_test.npy) or of an HDF5 file (dataset
 * NAME, NAME_test), opened on first use. */
typedef struct dataset_input {
    char name[96];
    npy_array file;
    tsl_shape shape; /* per sample */
} dataset_input;

struct tsl_dataset {
    dataset_kind kind;
    split_dir where;             /* an npy directory and its split: where further inputs are */
    pthread_mutex_t inputs_lock; /* guards ninputs; an entry never changes once counted */
    int32_t ninputs;
    dataset_input inputs[DATASET_MAX_INPUTS];
    tsl_dataset_info info;
    /* Fashion-MNIST: bytes in memory; pixel_value maps a byte to its normalised value. */
    uint8_t *pixels;
    uint8_t *labels;
    float pixel_value[256];
    synthetic_params synthetic;
    npy_array x_file;
    npy_array y_file;
    tsl_read_box_fn callback;
    tsl_read_target_box_fn callback_targets; /* a callback dataset of float targets */
    void *callback_user;
    struct tsl_h5_file *h5; /* hdf5_dataset.c's */
};

/* ---- the spec (spec.c) ---- */

/* The value of `key` (marked as used), or NULL when the spec does not give it. */
const char *tsl_data_spec_take(dataset_spec *spec, const char *key);

/* Refuse the first option no tsl_data_spec_take() asked for. */
tsl_status tsl_data_spec_check_used(const dataset_spec *spec, const char *valid_keys);

/* A numeric option in [low, high], an integer when `integer` (into *int_value) or a real
 * number (into *real_value); the value is left alone when the spec does not give it. */
tsl_status tsl_data_spec_number(dataset_spec *spec, const char *key, int integer, double low,
                                double high, int64_t *int_value, double *real_value);

tsl_status tsl_data_spec_int(dataset_spec *spec, const char *key, double low, double high,
                             int64_t *value);

/* Sample shape `dims` (C, spatial...); labels per voxel (the spatial part) or per sample. */
void tsl_data_set_info(tsl_dataset_info *info, int64_t samples, int64_t classes, int32_t ndim,
                       const int64_t *dims, int per_voxel);
/* The info of a dataset of float targets: samples of (ndim axes: C, spatial...) inputs, each
 * with a target of target_ndim axes (C, spatial...) of the model's output; classes 0. */
void tsl_data_set_target_info(tsl_dataset_info *info, int64_t samples, int32_t ndim,
                              const int64_t *dims, int32_t target_ndim, const int64_t *target_dims);

/* ---- the dataset kinds: open from a spec, read one sample's box (arguments checked) ---- */

/* Fashion-MNIST from IDX files (idx.c). */
tsl_status tsl_data_fashion_open(struct tsl_dataset *ds, dataset_spec *spec, tsl_split split);
void tsl_data_fashion_read_box(const struct tsl_dataset *ds, int64_t index, const int64_t *start,
                               const int64_t *extent, float *x, int64_t *y);

/* Synthetic segmentation volumes (synthetic.c). */
tsl_status tsl_data_synthetic_open(struct tsl_dataset *ds, dataset_spec *spec, tsl_split split);
tsl_status tsl_data_synthetic_read_box(const struct tsl_dataset *ds, int64_t index,
                                       const int64_t *start, const int64_t *extent, float *x,
                                       int64_t *y);

/* `.npy` directories read on demand (npy_dataset.c). */
tsl_status tsl_data_npy_open(struct tsl_dataset *ds, dataset_spec *spec, tsl_split split);
/* The box of sample `index`'s float targets (an npy or hdf5 dataset with targets set; the
 * box checked by the caller). */
tsl_status tsl_data_npy_read_target_box(const struct tsl_dataset *ds, int64_t index,
                                        const int64_t *start, const int64_t *extent, float *t);

tsl_status tsl_data_npy_read_sample_box(const struct tsl_dataset *ds, int64_t index,
                                        const int64_t *start, const int64_t *extent, float *x,
                                        int64_t *y);
void tsl_data_npy_array_close(npy_array *a);
/* Further input `name` of an npy dataset opened into slot k (NAME.npy, f32, one row per
 * sample); its shape into ds->inputs[k]. */
tsl_status tsl_data_npy_input(struct tsl_dataset *ds, const char *name, int32_t k);
/* Box of sample `index` of further input slot k (checked by the caller). */
tsl_status tsl_data_npy_read_input_box(const struct tsl_dataset *ds, int32_t k, int64_t index,
                                       const int64_t *start, const int64_t *extent, float *x);

/* HDF5 files read on demand (hdf5_dataset.c). */
struct tsl_h5_file;
tsl_status tsl_data_hdf5_open(struct tsl_dataset *ds, dataset_spec *spec, tsl_split split);
tsl_status tsl_data_hdf5_read_target_box(const struct tsl_dataset *ds, int64_t index,
                                         const int64_t *start, const int64_t *extent, float *t);
tsl_status tsl_data_hdf5_read_sample_box(const struct tsl_dataset *ds, int64_t index,
                                         const int64_t *start, const int64_t *extent, float *x,
                                         int64_t *y);
void tsl_data_hdf5_close(struct tsl_h5_file *f);
/* Further input `name` of an HDF5 dataset into slot k (its shape into ds->inputs[k]): dataset
 * NAME (NAME_test for the test split), floats, one row per sample. */
tsl_status tsl_data_hdf5_input(struct tsl_dataset *ds, const char *name, int32_t k);
tsl_status tsl_data_hdf5_read_input_box(const struct tsl_dataset *ds, int32_t k, int64_t index,
                                        const int64_t *start, const int64_t *extent, float *x);

#endif /* TESSEL_SRC_DATA_INTERNAL_H */
