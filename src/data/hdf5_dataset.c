/* The hdf5:FILE dataset (include/tessel/data.h): an HDF5 file holding x (N x C x 0 to 3
 * spatial sizes, any float type, read as f32) and y: class labels (N, or N x the spatial sizes
 * of x, any integer type, read as i64) or float targets (N x the model output's shape, C then 0
 * to 3 spatial sizes, any float type, read as f32), and for the test split x_test and y_test
 * (names changed by x=, y=, x_test=, y_test=). Each read is one hyperslab of one sample's box, read
 * from the file when asked. Debian's HDF5 is the serial library, not built thread-safe: every HDF5
 * call of this file holds one lock (tasks of several workers read at once). */
#include <hdf5.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data_internal.h"

static pthread_mutex_t h5_lock = PTHREAD_MUTEX_INITIALIZER;
static int h5_quiet; /* HDF5's own error printing off (its errors become tessel's) */

typedef struct h5_array {
    hid_t file, set, space;
    int32_t ndim;
    int64_t dims[TSL_MAX_DIMS];
    char name[256];
} h5_array;

struct tsl_h5_file {
    char *path;
    hid_t file;
    h5_array x, y;
    int test;                            /* the test split: further inputs are NAME_test */
    h5_array inputs[DATASET_MAX_INPUTS]; /* the dataset's further inputs, by slot */
};

static void array_close(h5_array *a)
{
    if (a->space > 0)
        H5Sclose(a->space);
    if (a->set > 0)
        H5Dclose(a->set);
    a->space = a->set = 0;
}

void tsl_data_hdf5_close(struct tsl_h5_file *f)
{
    if (!f)
        return;
    pthread_mutex_lock(&h5_lock);
    array_close(&f->x);
    array_close(&f->y);
    for (int k = 0; k < DATASET_MAX_INPUTS; k++)
        array_close(&f->inputs[k]);
    if (f->file > 0)
        H5Fclose(f->file);
    pthread_mutex_unlock(&h5_lock);
    free(f->path);
    free(f);
}

/* Dataset `name` of the file and its shape; its type must be a float (want 1), an integer (want
 * 0) or either (want 2, the labels: *is_float says which). Lock held. */
static tsl_status array_open(struct tsl_h5_file *f, h5_array *a, const char *name, int want,
                             int *is_float)
{
    snprintf(a->name, sizeof a->name, "%s", name);
    if (H5Lexists(f->file, name, H5P_DEFAULT) <= 0)
        return tsl_error(NULL, TSL_ERR_IO, "hdf5: '%s' has no dataset '%s'", f->path, name);
    if ((a->set = H5Dopen2(f->file, name, H5P_DEFAULT)) < 0 ||
        (a->space = H5Dget_space(a->set)) < 0)
        return tsl_error(NULL, TSL_ERR_IO, "hdf5: cannot open dataset '%s' of '%s'", name, f->path);
    hid_t type = H5Dget_type(a->set);
    H5T_class_t cls = type >= 0 ? H5Tget_class(type) : H5T_NO_CLASS;
    if (type >= 0)
        H5Tclose(type);
    if (want == 2 && (cls == H5T_FLOAT || cls == H5T_INTEGER))
        *is_float = cls == H5T_FLOAT;
    else if (cls != (want ? H5T_FLOAT : H5T_INTEGER))
        return tsl_error(NULL, TSL_ERR_DTYPE, "hdf5: dataset '%s' of '%s' holds %s; %s", name,
                         f->path,
                         cls == H5T_FLOAT     ? "floats"
                         : cls == H5T_INTEGER ? "integers"
                                              : "neither floats nor integers",
                         want == 1 ? "x must hold floats (read as f32)"
                                   : "y must hold integer class labels (read as i64) or float "
                                     "targets (read as f32)");
    int n = H5Sget_simple_extent_ndims(a->space);
    if (n < 1 || n > TSL_MAX_DIMS)
        return tsl_error(NULL, TSL_ERR_SHAPE, "hdf5: dataset '%s' of '%s' has %d axes (1 to %d)",
                         name, f->path, n, TSL_MAX_DIMS);
    hsize_t dims[TSL_MAX_DIMS];
    H5Sget_simple_extent_dims(a->space, dims, NULL);
    a->ndim = n;
    for (int d = 0; d < n; d++)
        a->dims[d] = (int64_t)dims[d];
    return TSL_OK;
}

/* Box `start`, `extent` (axes after the first) of row `row`, as `mem` (native float or
 * int64). Lock held. */
static tsl_status read_rows(const struct tsl_h5_file *f, const h5_array *a, int64_t row,
                            int64_t rows, const int64_t *start, const int64_t *extent, hid_t mem,
                            void *dst)
{
    hsize_t off[TSL_MAX_DIMS], cnt[TSL_MAX_DIMS];
    off[0] = (hsize_t)row;
    cnt[0] = (hsize_t)rows;
    for (int d = 1; d < a->ndim; d++) {
        off[d] = start ? (hsize_t)start[d - 1] : 0;
        cnt[d] = extent ? (hsize_t)extent[d - 1] : (hsize_t)a->dims[d];
    }
    hid_t memspace = H5Screate_simple(a->ndim, cnt, NULL);
    herr_t e =
        memspace < 0 ? -1 : H5Sselect_hyperslab(a->space, H5S_SELECT_SET, off, NULL, cnt, NULL);
    if (e >= 0)
        e = H5Dread(a->set, mem, memspace, a->space, H5P_DEFAULT, dst);
    if (memspace >= 0)
        H5Sclose(memspace);
    if (e < 0)
        return tsl_error(NULL, TSL_ERR_IO,
                         "hdf5: cannot read rows %lld to %lld of dataset '%s' of '%s' (was the "
                         "file changed after the dataset was opened?)",
                         (long long)row, (long long)(row + rows - 1), a->name, f->path);
    return TSL_OK;
}

/* Every label in [0, limit), in chunks of rows; the largest into *largest. Lock held. */
static tsl_status scan_labels(const struct tsl_h5_file *f, int64_t limit, int64_t *largest)
{
    const h5_array *y = &f->y;
    int64_t per_row = 1;
    for (int d = 1; d < y->ndim; d++)
        per_row *= y->dims[d];
    int64_t rows = per_row >= 65536 ? 1 : 65536 / per_row;
    int64_t *chunk = malloc(sizeof *chunk * (size_t)(rows * per_row));
    if (!chunk)
        return tsl_error(NULL, TSL_ERR_OUT_OF_MEMORY, "hdf5: out of memory");
    tsl_status st = TSL_OK;
    *largest = 0;
    for (int64_t first = 0; first < y->dims[0] && !st; first += rows) {
        int64_t n = y->dims[0] - first < rows ? y->dims[0] - first : rows;
        st = read_rows(f, y, first, n, NULL, NULL, H5T_NATIVE_INT64, chunk);
        for (int64_t i = 0; i < n * per_row && !st; i++) {
            if (chunk[i] < 0 || chunk[i] >= limit)
                st = tsl_error(NULL, TSL_ERR_FORMAT,
                               "hdf5: label %lld (sample %lld of dataset '%s' of '%s') is "
                               "outside [0, %lld)",
                               (long long)chunk[i], (long long)(first + i / per_row), y->name,
                               f->path, (long long)limit);
            else if (chunk[i] > *largest)
                *largest = chunk[i];
        }
    }
    free(chunk);
    return st;
}

tsl_status tsl_data_hdf5_open(struct tsl_dataset *ds, dataset_spec *spec, tsl_split split)
{
    const char *path = tsl_data_spec_take(spec, "dir");
    const int test = split == TSL_SPLIT_TEST;
    const char *xname = tsl_data_spec_take(spec, test ? "x_test" : "x");
    const char *yname = tsl_data_spec_take(spec, test ? "y_test" : "y");
    tsl_data_spec_take(spec, test ? "x" : "x_test"); /* (the other split's: allowed) */
    tsl_data_spec_take(spec, test ? "y" : "y_test");
    int64_t classes = 0, largest = 0;
    tsl_status st;
    if ((st = tsl_data_spec_int(spec, "classes", 2, MAX_CLASSES, &classes)) ||
        (st = tsl_data_spec_check_used(spec, "a bare FILE, x, y, x_test, y_test, classes")))
        return st;
    if (!path)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                         "dataset spec '%s': hdf5 needs a file (hdf5:FILE)", spec->original);
    struct tsl_h5_file *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(path))) {
        free(f);
        return tsl_error(NULL, TSL_ERR_OUT_OF_MEMORY, "hdf5: out of memory");
    }
    ds->h5 = f;
    f->test = test;
    pthread_mutex_lock(&h5_lock);
    if (!h5_quiet) {
        H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
        h5_quiet = 1;
    }
    if (H5Fis_hdf5(path) <= 0 || (f->file = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT)) < 0)
        st = tsl_error(NULL, TSL_ERR_IO, "hdf5: cannot open '%s' (missing, unreadable or not HDF5)",
                       path);
    int targets = 0;
    if (!st)
        st = array_open(f, &f->x, xname ? xname : test ? "x_test" : "x", 1, NULL);
    if (!st)
        st = array_open(f, &f->y, yname ? yname : test ? "y_test" : "y", 2, &targets);
    const h5_array *x = &f->x, *y = &f->y;
    if (!st && x->ndim < 2)
        st = tsl_error(NULL, TSL_ERR_SHAPE,
                       "hdf5: dataset '%s' of '%s' has %d axis; x must be N x C, then 0 to 3 "
                       "spatial sizes",
                       x->name, path, (int)x->ndim);
    if (!st && targets) { /* N x (C, spatial...) of the model's output */
        if (y->dims[0] != x->dims[0] || y->ndim < 2)
            st = tsl_error(NULL, TSL_ERR_SHAPE,
                           "hdf5: float targets '%s' (%d axes, %lld rows) do not fit x '%s' (%lld "
                           "rows) of '%s': targets must be N x the output's shape (C, then 0 to 3 "
                           "spatial sizes)",
                           y->name, (int)y->ndim, (long long)y->dims[0], x->name,
                           (long long)x->dims[0], path);
        else if (classes)
            st = tsl_error(NULL, TSL_ERR_INVALID_ARG,
                           "hdf5: classes= is for class labels, and '%s' of '%s' holds float "
                           "targets",
                           y->name, path);
        else if (x->dims[0] < 1)
            st = tsl_error(NULL, TSL_ERR_SHAPE, "hdf5: dataset '%s' of '%s' has no samples",
                           x->name, path);
        pthread_mutex_unlock(&h5_lock);
        if (!st)
            tsl_data_set_target_info(&ds->info, x->dims[0], x->ndim - 1, x->dims + 1, y->ndim - 1,
                                     y->dims + 1);
        return st;
    }
    int fits = !st && y->dims[0] == x->dims[0] && (y->ndim == 1 || y->ndim == x->ndim - 1);
    for (int d = 1; fits && y->ndim > 1 && d < y->ndim; d++)
        fits = y->dims[d] == x->dims[d + 1];
    if (!st && !fits)
        st = tsl_error(NULL, TSL_ERR_SHAPE,
                       "hdf5: labels '%s' (%d axes, %lld rows) do not fit x '%s' (%d axes, %lld "
                       "rows) of '%s': labels must be N (one per sample) or N x the spatial "
                       "sizes of x",
                       y->name, (int)y->ndim, (long long)y->dims[0], x->name, (int)x->ndim,
                       (long long)x->dims[0], path);
    if (!st && x->dims[0] < 1)
        st = tsl_error(NULL, TSL_ERR_SHAPE, "hdf5: dataset '%s' of '%s' has no samples", x->name,
                       path);
    if (!st)
        st = scan_labels(f, classes ? classes : MAX_CLASSES, &largest);
    pthread_mutex_unlock(&h5_lock);
    if (st)
        return st;
    if (!classes && largest < 1)
        return tsl_error(NULL, TSL_ERR_FORMAT,
                         "hdf5: every label of '%s' is 0; give classes= (at least 2)", path);
    tsl_data_set_info(&ds->info, x->dims[0], classes ? classes : largest + 1, x->ndim - 1,
                      x->dims + 1, y->ndim > 1);
    return TSL_OK;
}

tsl_status tsl_data_hdf5_read_target_box(const struct tsl_dataset *ds, int64_t index,
                                         const int64_t *start, const int64_t *extent, float *t)
{
    if (ds->kind != DATASET_HDF5 || !ds->info.targets)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "the dataset has no float targets");
    pthread_mutex_lock(&h5_lock);
    tsl_status st = read_rows(ds->h5, &ds->h5->y, index, 1, start, extent, H5T_NATIVE_FLOAT, t);
    pthread_mutex_unlock(&h5_lock);
    return st;
}

tsl_status tsl_data_hdf5_read_sample_box(const struct tsl_dataset *ds, int64_t index,
                                         const int64_t *start, const int64_t *extent, float *x,
                                         int64_t *y)
{
    const struct tsl_h5_file *f = ds->h5;
    const tsl_dataset_info *info = &ds->info;
    tsl_status st = TSL_OK;
    pthread_mutex_lock(&h5_lock);
    if (x)
        st = read_rows(f, &f->x, index, 1, start, extent, H5T_NATIVE_FLOAT, x);
    if (!st && y)
        st = read_rows(f, &f->y, index, 1, start + 1, extent + 1, H5T_NATIVE_INT64, y);
    pthread_mutex_unlock(&h5_lock);
    int64_t count = 1;
    for (int32_t d = 0; y && d < info->label_shape.ndim; d++)
        count *= extent[1 + d];
    for (int64_t i = 0; y && i < count && !st; i++)
        if (y[i] < 0 || y[i] >= info->classes)
            st = tsl_error(NULL, TSL_ERR_FORMAT,
                           "hdf5: label %lld of sample %lld in '%s' is outside [0, %lld) (was "
                           "the file changed after the dataset was opened?)",
                           (long long)y[i], (long long)index, f->path, (long long)info->classes);
    return st;
}

tsl_status tsl_data_hdf5_input(struct tsl_dataset *ds, const char *name, int32_t k)
{
    struct tsl_h5_file *f = ds->h5;
    h5_array *a = &f->inputs[k];
    char set[160];
    if (snprintf(set, sizeof set, "%s%s", name, f->test ? "_test" : "") >= (int)sizeof set)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "hdf5: input name '%s' too long", name);
    pthread_mutex_lock(&h5_lock);
    tsl_status st = array_open(f, a, set, 1, NULL);
    if (!st && (a->ndim < 2 || a->ndim > 5 || a->dims[0] != ds->info.samples))
        st = tsl_error(NULL, TSL_ERR_SHAPE,
                       "hdf5: dataset '%s' of '%s' has %d axes and %lld rows; an input must be N "
                       "= %lld samples x C, then 0 to 3 spatial sizes",
                       set, f->path, (int)a->ndim, (long long)a->dims[0],
                       (long long)ds->info.samples);
    if (st)
        array_close(a);
    pthread_mutex_unlock(&h5_lock);
    if (!st)
        tsl_shape_make(&ds->inputs[k].shape, a->ndim - 1, a->dims + 1);
    return st;
}

tsl_status tsl_data_hdf5_read_input_box(const struct tsl_dataset *ds, int32_t k, int64_t index,
                                        const int64_t *start, const int64_t *extent, float *x)
{
    pthread_mutex_lock(&h5_lock);
    tsl_status st =
        read_rows(ds->h5, &ds->h5->inputs[k], index, 1, start, extent, H5T_NATIVE_FLOAT, x);
    pthread_mutex_unlock(&h5_lock);
    return st;
}
