/* Datasets (include/tessel/data.h): the spec parser, the dispatch to each dataset kind
 * (idx.c, synthetic.c, npy_dataset.c), the public dataset calls and the epoch order. Pure C:
 * no StarPU, no MPI. The prefetching loader is in loader.c. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data_internal.h"

tsl_status tsl_dataset_epoch_order(int64_t *order, int64_t count, uint64_t seed, int64_t epoch,
                                   int32_t shuffle)
{
    if (count < 0 || (count > 0 && !order))
        return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                         "tsl_dataset_epoch_order: need count >= 0 and an order array");
    for (int64_t i = 0; i < count; i++)
        order[i] = i;
    if (!shuffle)
        return TSL_OK;
    uint64_t state = splitmix_stream(seed, (uint64_t)epoch);
    for (int64_t i = count - 1; i > 0; i--) {
        int64_t j = (int64_t)uniform_below(&state, (uint64_t)i + 1);
        int64_t kept = order[i];
        order[i] = order[j];
        order[j] = kept;
    }
    return TSL_OK;
}

/* ---- the spec: NAME[:key=value,...] ---- */

static tsl_status spec_parse(dataset_spec *spec, const char *original)
{
    memset(spec, 0, sizeof *spec);
    spec->original = original;
    if (!(spec->text = strdup(original)))
        return tsl_error(NULL, TSL_ERR_OUT_OF_MEMORY, "dataset spec: out of memory");
    spec->name = spec->text;
    char *item = strchr(spec->text, ':');
    if (!item)
        return TSL_OK;
    *item++ = '\0';
    for (;;) {
        char *comma = strchr(item, ',');
        if (comma)
            *comma = '\0';
        char *equals = strchr(item, '=');
        spec_option option = {equals ? item : "dir", equals ? equals + 1 : item, !equals, 0};
        if (equals)
            *equals = '\0';
        if (*item == '\0' || *option.value == '\0')
            return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                             "dataset spec '%s': empty option (want key=value, comma-separated)",
                             original);
        if (!equals && spec->count > 0)
            return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                             "dataset spec '%s': option '%s' is not key=value", original, item);
        for (int k = 0; k < spec->count; k++)
            if (strcmp(spec->options[k].key, option.key) == 0)
                return tsl_error(NULL, TSL_ERR_INVALID_ARG, "dataset spec '%s': '%s' given twice",
                                 original, option.key);
        if (spec->count == SPEC_MAX_OPTIONS)
            return tsl_error(NULL, TSL_ERR_INVALID_ARG, "dataset spec '%s': more than %d options",
                             original, SPEC_MAX_OPTIONS);
        spec->options[spec->count++] = option;
        if (!comma)
            return TSL_OK;
        item = comma + 1;
    }
}

/* The value of `key` (marked as used), or NULL when the spec does not give it. */
const char *tsl_data_spec_take(dataset_spec *spec, const char *key)
{
    for (int k = 0; k < spec->count; k++)
        if (strcmp(spec->options[k].key, key) == 0) {
            spec->options[k].used = 1;
            return spec->options[k].value;
        }
    return NULL;
}

/* Refuse the first option no tsl_data_spec_take() asked for. */
tsl_status tsl_data_spec_check_used(const dataset_spec *spec, const char *valid_keys)
{
    for (int k = 0; k < spec->count; k++) {
        const spec_option *option = &spec->options[k];
        if (option->used)
            continue;
        if (option->bare)
            return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                             "dataset spec '%s': %s takes key=value options only, not '%s' "
                             "(valid keys: %s)",
                             spec->original, spec->name, option->value, valid_keys);
        return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                         "dataset spec '%s': unknown key '%s' for %s (valid: %s)", spec->original,
                         option->key, spec->name, valid_keys);
    }
    return TSL_OK;
}

/* A numeric option in [low, high], an integer when `integer` (into *int_value) or a real
 * number (into *real_value); the value is left alone when the spec does not give it. */
tsl_status tsl_data_spec_number(dataset_spec *spec, const char *key, int integer, double low,
                                double high, int64_t *int_value, double *real_value)
{
    const char *text = tsl_data_spec_take(spec, key);
    if (!text)
        return TSL_OK;
    char *end;
    errno = 0;
    long long whole = integer ? strtoll(text, &end, 10) : 0;
    double number = integer ? (double)whole : strtod(text, &end);
    if (errno || *end || !(number >= low && number <= high)) {
        if (integer)
            return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                             "dataset spec '%s': %s must be an integer in [%lld, %lld], got '%s'",
                             spec->original, key, (long long)low, (long long)high, text);
        return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                         "dataset spec '%s': %s must be a number in [%g, %g], got '%s'",
                         spec->original, key, low, high, text);
    }
    if (integer)
        *int_value = whole;
    else
        *real_value = number;
    return TSL_OK;
}

tsl_status tsl_data_spec_int(dataset_spec *spec, const char *key, double low, double high,
                             int64_t *value)
{
    return tsl_data_spec_number(spec, key, 1, low, high, value, NULL);
}

/* ---- the dataset ---- */

/* Sample shape `dims` (C, spatial...); labels per voxel (the spatial part) or per sample. */
void tsl_data_set_info(tsl_dataset_info *info, int64_t samples, int64_t classes, int32_t ndim,
                       const int64_t *dims, int per_voxel)
{
    memset(info, 0, sizeof *info);
    info->samples = samples;
    info->classes = (int32_t)classes;
    info->sample_shape.ndim = ndim;
    info->sample_numel = 1;
    info->label_numel = 1;
    for (int d = 0; d < TSL_MAX_DIMS; d++) {
        info->sample_shape.dims[d] = d < ndim ? dims[d] : 1;
        info->label_shape.dims[d] = 1;
    }
    for (int d = 0; d < ndim; d++)
        info->sample_numel *= dims[d];
    if (!per_voxel)
        return;
    info->label_shape.ndim = ndim - 1;
    for (int d = 1; d < ndim; d++) {
        info->label_shape.dims[d - 1] = dims[d];
        info->label_numel *= dims[d];
    }
}

void tsl_data_set_target_info(tsl_dataset_info *info, int64_t samples, int32_t ndim,
                              const int64_t *dims, int32_t target_ndim, const int64_t *target_dims)
{
    tsl_data_set_info(info, samples, 0, ndim, dims, 0);
    info->targets = 1;
    info->label_shape.ndim = target_ndim;
    info->label_numel = 1;
    for (int32_t d = 0; d < target_ndim; d++) {
        info->label_shape.dims[d] = target_dims[d];
        info->label_numel *= target_dims[d];
    }
}

/* ---- public calls ---- */

tsl_status tsl_dataset_open(tsl_dataset_t *dataset, const char *spec_text, tsl_split split)
{
    if (!dataset || !spec_text)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "tsl_dataset_open: NULL argument");
    if (split != TSL_SPLIT_TRAIN && split != TSL_SPLIT_TEST)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                         "tsl_dataset_open: split %d is not train (0) "
                         "or test (1)",
                         (int)split);
    struct tsl_dataset *ds = calloc(1, sizeof *ds);
    if (!ds)
        return tsl_error(NULL, TSL_ERR_OUT_OF_MEMORY, "tsl_dataset_open: out of memory");
    ds->x_file.fd = -1;
    ds->y_file.fd = -1;
    pthread_mutex_init(&ds->inputs_lock, NULL);
    dataset_spec spec;
    tsl_status st = spec_parse(&spec, spec_text);
    if (!st && strcmp(spec.name, "fashion-mnist") == 0) {
        ds->kind = DATASET_FASHION_MNIST;
        st = tsl_data_fashion_open(ds, &spec, split);
    } else if (!st && strcmp(spec.name, "synthetic") == 0) {
        ds->kind = DATASET_SYNTHETIC;
        st = tsl_data_synthetic_open(ds, &spec, split);
    } else if (!st && strcmp(spec.name, "npy") == 0) {
        ds->kind = DATASET_NPY;
        st = tsl_data_npy_open(ds, &spec, split);
    } else if (!st && strcmp(spec.name, "hdf5") == 0) {
        ds->kind = DATASET_HDF5;
        st = tsl_data_hdf5_open(ds, &spec, split);
    } else if (!st) {
        st = tsl_error(NULL, TSL_ERR_INVALID_ARG,
                       "dataset spec '%s': unknown dataset '%s' (want fashion-mnist, "
                       "synthetic, npy:DIR or hdf5:FILE)",
                       spec_text, spec.name);
    }
    free(spec.text);
    if (st) {
        tsl_dataset_destroy(ds);
        return st;
    }
    *dataset = ds;
    return TSL_OK;
}

/* A shape of 1 to 4 axes (C, spatial...) of sizes >= 1: the `what`'s. */
static tsl_status check_axes(int32_t ndim, const int64_t *dims, const char *what, const char *fn)
{
    if (ndim < 1 || ndim > 4)
        return tsl_error(NULL, TSL_ERR_SHAPE, "%s: a %s has 1 to 4 axes (C, spatial), not %d", fn,
                         what, (int)ndim);
    for (int32_t d = 0; d < ndim; d++)
        if (dims[d] < 1)
            return tsl_error(NULL, TSL_ERR_SHAPE, "%s: axis %d of the %s has size %lld", fn, (int)d,
                             what, (long long)dims[d]);
    return TSL_OK;
}

/* A callback dataset with its functions; the info is the caller's to set. */
static tsl_status new_callback(tsl_dataset_t *dataset, tsl_read_box_fn read_box,
                               tsl_read_target_box_fn read_targets, void *user, const char *fn)
{
    struct tsl_dataset *ds = calloc(1, sizeof *ds);
    if (!ds)
        return tsl_error(NULL, TSL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    ds->x_file.fd = -1;
    ds->y_file.fd = -1;
    pthread_mutex_init(&ds->inputs_lock, NULL);
    ds->kind = DATASET_CALLBACK;
    ds->callback = read_box;
    ds->callback_targets = read_targets;
    ds->callback_user = user;
    *dataset = ds;
    return TSL_OK;
}

tsl_status tsl_dataset_create_callback_targets(tsl_dataset_t *dataset, int64_t samples,
                                               int32_t sample_ndim, const int64_t *sample_dims,
                                               int32_t target_ndim, const int64_t *target_dims,
                                               tsl_read_box_fn read_box,
                                               tsl_read_target_box_fn read_targets, void *user)
{
    const char *fn = "tsl_dataset_create_callback_targets";
    if (!dataset || !sample_dims || !target_dims || !read_box || !read_targets)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "%s: NULL argument", fn);
    if (samples < 1)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "%s: %lld samples (want >= 1)", fn,
                         (long long)samples);
    tsl_status st = check_axes(sample_ndim, sample_dims, "sample", fn);
    if (st || (st = check_axes(target_ndim, target_dims, "target", fn)) ||
        (st = new_callback(dataset, read_box, read_targets, user, fn)))
        return st;
    tsl_data_set_target_info(&(*dataset)->info, samples, sample_ndim, sample_dims, target_ndim,
                             target_dims);
    return TSL_OK;
}

tsl_status tsl_dataset_create_callback(tsl_dataset_t *dataset, int64_t samples, int32_t classes,
                                       int32_t sample_ndim, const int64_t *sample_dims,
                                       int32_t per_position, tsl_read_box_fn read_box, void *user)
{
    const char *fn = "tsl_dataset_create_callback";
    if (!dataset || !sample_dims || !read_box)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "%s: NULL argument", fn);
    if (samples < 1 || classes < 2 || classes > (1 << 24))
        return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                         "%s: %lld samples of %d classes (want >= 1 samples, 2 to 2^24 classes)",
                         fn, (long long)samples, (int)classes);
    tsl_status st = check_axes(sample_ndim, sample_dims, "sample", fn);
    if (st)
        return st;
    if (per_position && sample_ndim < 2)
        return tsl_error(NULL, TSL_ERR_SHAPE,
                         "%s: labels per position need a spatial axis in the sample", fn);
    if ((st = new_callback(dataset, read_box, NULL, user, fn)))
        return st;
    tsl_data_set_info(&(*dataset)->info, samples, classes, sample_ndim, sample_dims,
                      per_position != 0);
    return TSL_OK;
}

tsl_status tsl_dataset_destroy(tsl_dataset_t ds)
{
    if (!ds)
        return TSL_OK;
    free(ds->pixels);
    free(ds->labels);
    tsl_data_npy_array_close(&ds->x_file);
    tsl_data_npy_array_close(&ds->y_file);
    tsl_data_hdf5_close(ds->h5);
    for (int32_t k = 0; k < ds->ninputs; k++)
        tsl_data_npy_array_close(&ds->inputs[k].file);
    free(ds->where.dir);
    pthread_mutex_destroy(&ds->inputs_lock);
    free(ds);
    return TSL_OK;
}

/* Slot of further input `name`, opened on first use (npy directories only). */
static tsl_status input_slot(tsl_dataset_t ds, const char *name, int32_t *k, const char *fn)
{
    if (!ds || !name)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "%s: NULL argument", fn);
    if (ds->kind != DATASET_NPY && ds->kind != DATASET_HDF5)
        return tsl_error(NULL, TSL_ERR_UNSUPPORTED,
                         "%s: input '%s': only npy directories (NAME.npy beside x.npy) and HDF5 "
                         "files (dataset NAME beside x) give further inputs; this dataset gives x "
                         "alone",
                         fn, name);
    tsl_status st = TSL_OK;
    pthread_mutex_lock(&ds->inputs_lock);
    *k = -1;
    for (int32_t i = 0; i < ds->ninputs && *k < 0; i++)
        if (strcmp(ds->inputs[i].name, name) == 0)
            *k = i;
    size_t len = strlen(name);
    if (*k >= 0)
        ; /* opened before */
    else if (!len || len >= sizeof ds->inputs[0].name || strchr(name, '/') || name[0] == '.' ||
             !strcmp(name, "x") || !strcmp(name, "y") ||
             (len >= 5 && !strcmp(name + len - 5, "_test")))
        st = tsl_error(NULL, TSL_ERR_INVALID_ARG,
                       "%s: an input named '%s' cannot be read from the data (not x or y, no '/', "
                       "no leading '.', no _test ending)",
                       fn, name);
    else if (ds->ninputs == DATASET_MAX_INPUTS)
        st = tsl_error(NULL, TSL_ERR_INVALID_ARG, "%s: more than %d further inputs", fn,
                       DATASET_MAX_INPUTS);
    else if (!(st = ds->kind == DATASET_NPY ? tsl_data_npy_input(ds, name, ds->ninputs)
                                            : tsl_data_hdf5_input(ds, name, ds->ninputs))) {
        snprintf(ds->inputs[ds->ninputs].name, sizeof ds->inputs[0].name, "%s", name);
        *k = ds->ninputs++;
    }
    pthread_mutex_unlock(&ds->inputs_lock);
    return st;
}

tsl_status tsl_dataset_input_shape(tsl_dataset_t ds, const char *name, tsl_shape *shape)
{
    int32_t k = 0;
    tsl_status st = input_slot(ds, name, &k, "tsl_dataset_input_shape");
    if (!st && !shape)
        st = tsl_error(NULL, TSL_ERR_INVALID_ARG, "tsl_dataset_input_shape: NULL shape");
    if (!st)
        *shape = ds->inputs[k].shape;
    return st;
}

tsl_status tsl_dataset_read_input_box(tsl_dataset_t ds, const char *name, int64_t index,
                                      const int64_t *start, const int64_t *extent, float *x)
{
    const char *fn = "tsl_dataset_read_input_box";
    int32_t k = 0;
    tsl_status st = input_slot(ds, name, &k, fn);
    if (!st && (!start || !extent || !x))
        st = tsl_error(NULL, TSL_ERR_INVALID_ARG, "%s: NULL argument", fn);
    if (!st && (index < 0 || index >= ds->info.samples))
        st = tsl_error(NULL, TSL_ERR_INVALID_ARG, "%s: sample index %lld is outside [0, %lld)", fn,
                       (long long)index, (long long)ds->info.samples);
    const tsl_shape *shape = st ? NULL : &ds->inputs[k].shape;
    for (int32_t d = 0; shape && d < shape->ndim && !st; d++)
        if (start[d] < 0 || extent[d] < 1 || start[d] + extent[d] > shape->dims[d])
            st = tsl_error(NULL, TSL_ERR_INVALID_ARG,
                           "%s: axis %d of the box is [%lld, %lld), outside input '%s''s [0, "
                           "%lld)",
                           fn, (int)d, (long long)start[d], (long long)(start[d] + extent[d]), name,
                           (long long)shape->dims[d]);
    if (st)
        return st;
    return ds->kind == DATASET_HDF5 ? tsl_data_hdf5_read_input_box(ds, k, index, start, extent, x)
                                    : tsl_data_npy_read_input_box(ds, k, index, start, extent, x);
}

tsl_status tsl_dataset_get_info(tsl_dataset_t ds, tsl_dataset_info *info)
{
    if (!ds || !info)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "tsl_dataset_get_info: NULL argument");
    *info = ds->info;
    return TSL_OK;
}

/* One sample's box, arguments checked. */
static tsl_status read_box(const struct tsl_dataset *ds, int64_t index, const int64_t *start,
                           const int64_t *extent, float *x, int64_t *y)
{
    if (y && ds->info.targets)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                         "the dataset gives float targets, not class labels (read them with "
                         "tsl_dataset_read_target_box)");
    switch (ds->kind) {
    case DATASET_FASHION_MNIST:
        tsl_data_fashion_read_box(ds, index, start, extent, x, y);
        return TSL_OK;
    case DATASET_SYNTHETIC:
        return tsl_data_synthetic_read_box(ds, index, start, extent, x, y);
    case DATASET_NPY:
        return tsl_data_npy_read_sample_box(ds, index, start, extent, x, y);
    case DATASET_HDF5:
        return tsl_data_hdf5_read_sample_box(ds, index, start, extent, x, y);
    case DATASET_CALLBACK: {
        tsl_status st = ds->callback(index, start, extent, x, y, ds->callback_user);
        if (st)
            return tsl_error(NULL, st, "the application's read_box failed (%s) on sample %lld",
                             tsl_status_string(st), (long long)index);
        int64_t labels = 1; /* the box's, or the one of the sample */
        for (int32_t d = 1; d < ds->info.sample_shape.ndim && ds->info.label_shape.ndim; d++)
            labels *= extent[d];
        for (int64_t i = 0; y && i < labels; i++)
            if (y[i] < 0 || y[i] >= ds->info.classes)
                return tsl_error(NULL, TSL_ERR_FORMAT,
                                 "the application's read_box gave label %lld (sample %lld) "
                                 "outside [0, %d)",
                                 (long long)y[i], (long long)index, (int)ds->info.classes);
        return TSL_OK;
    }
    }
    return tsl_error(NULL, TSL_ERR_STATE, "tsl_dataset_read: corrupt dataset handle");
}

static tsl_status check_index(const struct tsl_dataset *ds, int64_t index, int64_t position,
                              const char *fn)
{
    if (index < 0 || index >= ds->info.samples)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                         "%s: sample index %lld (position %lld) is outside [0, %lld)", fn,
                         (long long)index, (long long)position, (long long)ds->info.samples);
    return TSL_OK;
}

tsl_status tsl_dataset_read(tsl_dataset_t ds, const int64_t *indices, int64_t count, float *x,
                            int64_t *y)
{
    const char *fn = "tsl_dataset_read";
    if (!ds || count < 0 || (count > 0 && !indices))
        return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                         "%s: need a dataset, count >= 0 and the indices", fn);
    tsl_status st = TSL_OK;
    for (int64_t i = 0; i < count && !st; i++)
        st = check_index(ds, indices[i], i, fn);
    int64_t start[TSL_MAX_DIMS] = {0};
    const int64_t *whole = ds->info.sample_shape.dims;
    for (int64_t i = 0; i < count && !st; i++)
        st = read_box(ds, indices[i], start, whole, x ? x + i * ds->info.sample_numel : NULL,
                      y ? y + i * ds->info.label_numel : NULL);
    return st;
}

tsl_status tsl_dataset_read_target_box(tsl_dataset_t ds, int64_t index, const int64_t *start,
                                       const int64_t *extent, float *targets)
{
    const char *fn = "tsl_dataset_read_target_box";
    if (!ds || !start || !extent || !targets)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "%s: NULL argument", fn);
    if (!ds->info.targets)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                         "%s: the dataset gives class labels, not float targets", fn);
    tsl_status st = check_index(ds, index, 0, fn);
    const tsl_shape *shape = &ds->info.label_shape;
    for (int32_t d = 0; d < shape->ndim && !st; d++)
        if (start[d] < 0 || extent[d] < 1 || start[d] + extent[d] > shape->dims[d])
            st = tsl_error(NULL, TSL_ERR_INVALID_ARG,
                           "%s: axis %d of the box is [%lld, %lld), outside the targets' [0, "
                           "%lld)",
                           fn, (int)d, (long long)start[d], (long long)(start[d] + extent[d]),
                           (long long)shape->dims[d]);
    if (st)
        return st;
    if (ds->kind == DATASET_CALLBACK) {
        st = ds->callback_targets(index, start, extent, targets, ds->callback_user);
        return st ? tsl_error(NULL, st, "the application's read_targets failed (%s) on sample %lld",
                              tsl_status_string(st), (long long)index)
                  : TSL_OK;
    }
    return ds->kind == DATASET_HDF5
               ? tsl_data_hdf5_read_target_box(ds, index, start, extent, targets)
               : tsl_data_npy_read_target_box(ds, index, start, extent, targets);
}

tsl_status tsl_dataset_read_box(tsl_dataset_t ds, int64_t index, const int64_t *start,
                                const int64_t *extent, float *x, int64_t *y)
{
    const char *fn = "tsl_dataset_read_box";
    if (!ds || !start || !extent)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "%s: NULL argument", fn);
    tsl_status st = check_index(ds, index, 0, fn);
    const tsl_shape *shape = &ds->info.sample_shape;
    for (int32_t d = 0; d < shape->ndim && !st; d++)
        if (start[d] < 0 || extent[d] < 1 || start[d] + extent[d] > shape->dims[d])
            st = tsl_error(NULL, TSL_ERR_INVALID_ARG,
                           "%s: axis %d of the box is [%lld, %lld), outside the sample's [0, "
                           "%lld)",
                           fn, (int)d, (long long)start[d], (long long)(start[d] + extent[d]),
                           (long long)shape->dims[d]);
    return st ? st : read_box(ds, index, start, extent, x, y);
}
