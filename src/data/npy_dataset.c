/* The npy:DIR dataset (include/tessel/data.h): x.npy and y.npy (x_test.npy, y_test.npy
 * for the test split) whose samples are read from disk when asked (src/npy.c parses the
 * headers). */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data_internal.h"
#include "file.h"

/* Headers longer than this are refused (numpy writes < 200 bytes for 5 dimensions). */
#define NPY_HEADER_READ 65536

static tsl_status pread_exact(const npy_array *a, void *buffer, int64_t bytes, int64_t offset)
{
    unsigned char *dst = buffer;
    while (bytes > 0) {
        ssize_t got = pread(a->fd, dst, (size_t)bytes, (off_t)offset);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0)
            return tsl_error(NULL, TSL_ERR_IO, "npy: cannot read '%s': %s", a->path,
                             strerror(errno));
        if (got == 0)
            return tsl_error(NULL, TSL_ERR_IO,
                             "npy: '%s' ended early (was it changed after the dataset was "
                             "opened?)",
                             a->path);
        dst += got;
        bytes -= got;
        offset += got;
    }
    return TSL_OK;
}

/* Open a `.npy` file, parse its header (tsl_npy_parse_header()) and check that the data
 * fills the rest of the file exactly; the data stays on disk. */
static tsl_status npy_array_open(npy_array *a, const char *path)
{
    if (!(a->path = strdup(path)))
        return tsl_error(NULL, TSL_ERR_OUT_OF_MEMORY, "npy: out of memory");
    struct stat file_info;
    const char *why;
    if ((a->fd = tsl_open_regular(path, &why)) < 0)
        return tsl_error(NULL, TSL_ERR_IO, "npy: cannot open '%s': %s", path, why);
    if (fstat(a->fd, &file_info) != 0)
        return tsl_error(NULL, TSL_ERR_IO, "npy: cannot open '%s': %s", path, strerror(errno));
    int64_t size = (int64_t)file_info.st_size;
    int64_t head_bytes = size < NPY_HEADER_READ ? size : NPY_HEADER_READ;
    unsigned char *head = malloc((size_t)head_bytes + 1);
    if (!head)
        return tsl_error(NULL, TSL_ERR_OUT_OF_MEMORY, "npy: out of memory");
    tsl_status st = pread_exact(a, head, head_bytes, 0);
    if (!st && (st = tsl_npy_parse_header(head, (size_t)head_bytes, &a->header)))
        tsl_error(NULL, st, "%s (in '%s')", tsl_last_error(), path);
    free(head);
    if (st)
        return st;
    int64_t available = size - a->header.data_offset;
    if (available != a->header.data_bytes)
        return tsl_error(NULL, TSL_ERR_FORMAT,
                         "npy: '%s' has %lld data bytes; its header describes %lld (%s)", path,
                         (long long)available, (long long)a->header.data_bytes,
                         available < a->header.data_bytes ? "truncated" : "trailing bytes");
    a->row_bytes = a->header.data_bytes / a->header.shape.dims[0];
    return TSL_OK;
}

void tsl_data_npy_array_close(npy_array *a)
{
    if (a->fd >= 0)
        close(a->fd);
    a->fd = -1;
    free(a->path);
    a->path = NULL;
}

/* "(2, 3, 4)" */
static const char *shape_text(const tsl_shape *shape, char *text, size_t cap)
{
    size_t n = (size_t)snprintf(text, cap, "(");
    for (int d = 0; d < shape->ndim && n < cap; d++)
        n +=
            (size_t)snprintf(text + n, cap - n, "%s%lld", d ? ", " : "", (long long)shape->dims[d]);
    if (n < cap)
        snprintf(text + n, cap - n, ")");
    return text;
}

/* Labels must be in [0, classes); the message tells where one is not. */
static tsl_status check_labels(const npy_array *y, const int64_t *labels, int64_t count,
                               int64_t first, int64_t classes)
{
    for (int64_t i = 0; i < count; i++)
        if (labels[i] >= MAX_CLASSES && classes == MAX_CLASSES)
            return tsl_error(NULL, TSL_ERR_FORMAT,
                             "npy: label %lld (element %lld of '%s') would make %lld classes; "
                             "labels are taken for at most 2^24 classes (as classes=)",
                             (long long)labels[i], (long long)(first + i), y->path,
                             (long long)labels[i] + (labels[i] < INT64_MAX));
        else if (labels[i] < 0 || labels[i] >= classes)
            return tsl_error(
                NULL, TSL_ERR_FORMAT, "npy: label %lld (element %lld of '%s') is outside [0, %lld)",
                (long long)labels[i], (long long)(first + i), y->path, (long long)classes);
    return TSL_OK;
}

/* The largest label of the file, streaming through it; every label must be in
 * [0, limit). */
static tsl_status scan_labels(const npy_array *y, int64_t limit, int64_t *largest)
{
    enum { CHUNK = 1 << 16 };
    int64_t *chunk = malloc(CHUNK * sizeof *chunk);
    if (!chunk)
        return tsl_error(NULL, TSL_ERR_OUT_OF_MEMORY, "npy: out of memory");
    int64_t total = y->header.data_bytes / (int64_t)sizeof *chunk;
    tsl_status st = TSL_OK;
    *largest = 0;
    for (int64_t first = 0; first < total && !st; first += CHUNK) {
        int64_t count = total - first < CHUNK ? total - first : CHUNK;
        st = pread_exact(y, chunk, count * (int64_t)sizeof *chunk,
                         y->header.data_offset + first * (int64_t)sizeof *chunk);
        if (!st)
            st = check_labels(y, chunk, count, first, limit);
        for (int64_t i = 0; i < count && !st; i++)
            if (chunk[i] > *largest)
                *largest = chunk[i];
    }
    free(chunk);
    return st;
}

/* x and y fit together: f32 N x C x spatial..., i64 N or N x spatial... */
static tsl_status npy_check_pair(const npy_array *x, const npy_array *y)
{
    const tsl_shape *xs = &x->header.shape, *ys = &y->header.shape;
    char x_text[96], y_text[96];
    shape_text(xs, x_text, sizeof x_text);
    shape_text(ys, y_text, sizeof y_text);
    if (x->header.dtype != TSL_F32)
        return tsl_error(NULL, TSL_ERR_DTYPE,
                         "npy: '%s' holds %s values; x must be f32 (numpy: x.astype(np.float32))",
                         x->path, tsl_dtype_name(x->header.dtype));
    if (y->header.dtype != TSL_I64 && y->header.dtype != TSL_F32)
        return tsl_error(NULL, TSL_ERR_DTYPE,
                         "npy: '%s' holds %s values; y must be i64 class labels (numpy: "
                         "y.astype(np.int64)) or f32 targets (y.astype(np.float32))",
                         y->path, tsl_dtype_name(y->header.dtype));
    if (xs->ndim < 2)
        return tsl_error(NULL, TSL_ERR_SHAPE,
                         "npy: '%s' has shape %s; x must be N x C, then 0 to 3 spatial sizes",
                         x->path, x_text);
    if (y->header.dtype == TSL_F32) { /* targets: N x (C, spatial...) of the model's output */
        if (ys->dims[0] != xs->dims[0] || ys->ndim < 2)
            return tsl_error(NULL, TSL_ERR_SHAPE,
                             "npy: '%s' has shape %s but x '%s' has shape %s; f32 targets must "
                             "be N x the output's shape (C, then 0 to 3 spatial sizes)",
                             y->path, y_text, x->path, x_text);
        return TSL_OK;
    }
    int fits = ys->dims[0] == xs->dims[0] && (ys->ndim == 1 || ys->ndim == xs->ndim - 1);
    for (int d = 1; fits && ys->ndim > 1 && d < ys->ndim; d++)
        fits = ys->dims[d] == xs->dims[d + 1];
    if (!fits)
        return tsl_error(NULL, TSL_ERR_SHAPE,
                         "npy: '%s' has shape %s but x '%s' has shape %s; labels must be N "
                         "(one per sample) or N x the spatial sizes of x",
                         y->path, y_text, x->path, x_text);
    return TSL_OK;
}

tsl_status tsl_data_npy_open(struct tsl_dataset *ds, dataset_spec *spec, tsl_split split)
{
    const char *dir = tsl_data_spec_take(spec, "dir");
    int64_t classes = 0, largest = 0;
    tsl_status st;
    if ((st = tsl_data_spec_int(spec, "classes", 2, MAX_CLASSES, &classes)) ||
        (st = tsl_data_spec_check_used(spec, "dir (or a bare DIR), classes")))
        return st;
    if (!dir)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                         "dataset spec '%s': npy needs a directory (npy:DIR)", spec->original);
    const char *suffix = split == TSL_SPLIT_TRAIN ? "" : "_test";
    if (!(ds->where.dir = strdup(dir)))
        return tsl_error(NULL, TSL_ERR_OUT_OF_MEMORY, "npy: out of memory");
    ds->where.suffix = suffix;
    char x_path[PATH_MAX], y_path[PATH_MAX];
    if (snprintf(x_path, sizeof x_path, "%s/x%s.npy", dir, suffix) >= (int)sizeof x_path)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "npy: directory name too long");
    snprintf(y_path, sizeof y_path, "%s/y%s.npy", dir, suffix);
    int have_x = access(x_path, F_OK) == 0, have_y = access(y_path, F_OK) == 0;
    if (split == TSL_SPLIT_TEST && (!have_x || !have_y))
        return tsl_error(NULL, TSL_ERR_IO,
                         "npy: the test split needs '%s' and '%s', and '%s' does not exist", x_path,
                         y_path, have_x ? y_path : x_path);
    if ((st = npy_array_open(&ds->x_file, x_path)) || (st = npy_array_open(&ds->y_file, y_path)) ||
        (st = npy_check_pair(&ds->x_file, &ds->y_file)))
        return st;
    const tsl_shape *xs = &ds->x_file.header.shape;
    if (ds->y_file.header.dtype == TSL_F32) { /* float targets */
        if (classes)
            return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                             "npy: classes= is for class labels, and '%s' holds f32 targets",
                             y_path);
        const tsl_shape *ys = &ds->y_file.header.shape;
        tsl_data_set_target_info(&ds->info, xs->dims[0], xs->ndim - 1, xs->dims + 1, ys->ndim - 1,
                                 ys->dims + 1);
        return TSL_OK;
    }
    if ((st = scan_labels(&ds->y_file, classes ? classes : MAX_CLASSES, &largest)))
        return st;
    if (!classes && largest < 1) /* (one class would train nothing; as the HDF5 reader) */
        return tsl_error(NULL, TSL_ERR_FORMAT,
                         "npy: every label of '%s' is 0; give classes= (at least 2)", y_path);
    tsl_data_set_info(&ds->info, xs->dims[0], classes ? classes : largest + 1, xs->ndim - 1,
                      xs->dims + 1, ds->y_file.header.shape.ndim > 1);
    return TSL_OK;
}

/* Box `start`, `extent` of row `row` of an array whose rows have shape `shape` (ndim axes):
 * one pread per run of consecutive elements (the box's innermost axis, merged with the axes
 * it spans whole). */
static tsl_status npy_read_box(const npy_array *a, int64_t row, int32_t ndim, const int64_t *shape,
                               const int64_t *start, const int64_t *extent, void *dst)
{
    int64_t elem = (int64_t)tsl_dtype_size(a->header.dtype);
    int32_t outer = ndim - 1; /* axes [outer, ndim) form one run */
    int64_t run = extent[outer];
    while (outer > 0 && extent[outer] == shape[outer]) {
        outer--;
        run *= extent[outer];
    }
    int64_t stride[TSL_MAX_DIMS], at[TSL_MAX_DIMS] = {0}, runs = 1, s = 1;
    for (int32_t d = ndim - 1; d >= 0; d--) {
        stride[d] = s;
        s *= shape[d];
    }
    for (int32_t d = 0; d < outer; d++)
        runs *= extent[d];
    char *out = dst;
    for (int64_t r = 0; r < runs; r++) {
        int64_t offset = 0;
        for (int32_t d = 0; d < ndim; d++)
            offset += (start[d] + (d < outer ? at[d] : 0)) * stride[d];
        tsl_status st = pread_exact(a, out + r * run * elem, run * elem,
                                    a->header.data_offset + row * a->row_bytes + offset * elem);
        if (st)
            return st;
        for (int32_t d = outer - 1; d >= 0 && ++at[d] == extent[d]; d--)
            at[d] = 0;
    }
    return TSL_OK;
}

tsl_status tsl_data_npy_read_target_box(const struct tsl_dataset *ds, int64_t index,
                                        const int64_t *start, const int64_t *extent, float *t)
{
    if (ds->kind != DATASET_NPY || !ds->info.targets)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "the dataset has no float targets");
    return npy_read_box(&ds->y_file, index, ds->info.label_shape.ndim, ds->info.label_shape.dims,
                        start, extent, t);
}

tsl_status tsl_data_npy_read_sample_box(const struct tsl_dataset *ds, int64_t index,
                                        const int64_t *start, const int64_t *extent, float *x,
                                        int64_t *y)
{
    const tsl_dataset_info *info = &ds->info;
    tsl_status st = TSL_OK;
    if (x)
        st = npy_read_box(&ds->x_file, index, info->sample_shape.ndim, info->sample_shape.dims,
                          start, extent, x);
    if (st || !y)
        return st;
    int32_t ndim = info->label_shape.ndim;
    int64_t whole[1] = {0}, one[1] = {1}, count = 1;
    for (int32_t d = 0; d < ndim; d++)
        count *= extent[1 + d];
    st = ndim ? npy_read_box(&ds->y_file, index, ndim, info->label_shape.dims, start + 1,
                             extent + 1, y)
              : npy_read_box(&ds->y_file, index, 1, one, whole, one, y);
    for (int64_t i = 0; i < count && !st; i++)
        if (y[i] < 0 || y[i] >= info->classes)
            st = tsl_error(NULL, TSL_ERR_FORMAT,
                           "npy: label %lld of sample %lld in '%s' is outside [0, %lld) (was the "
                           "file changed after the dataset was opened?)",
                           (long long)y[i], (long long)index, ds->y_file.path,
                           (long long)info->classes);
    return st;
}

tsl_status tsl_data_npy_input(struct tsl_dataset *ds, const char *name, int32_t k)
{
    dataset_input *in = &ds->inputs[k];
    memset(in, 0, sizeof *in);
    in->file.fd = -1;
    char path[PATH_MAX];
    if (snprintf(path, sizeof path, "%s/%s%s.npy", ds->where.dir, name, ds->where.suffix) >=
        (int)sizeof path)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "npy: directory name too long");
    tsl_status st = npy_array_open(&in->file, path);
    const tsl_shape *s = &in->file.header.shape;
    char text[96];
    if (!st && in->file.header.dtype != TSL_F32)
        st = tsl_error(NULL, TSL_ERR_DTYPE, "npy: '%s' holds %s values; an input must be f32", path,
                       tsl_dtype_name(in->file.header.dtype));
    else if (!st && (s->ndim < 2 || s->ndim > 5 || s->dims[0] != ds->info.samples))
        st = tsl_error(NULL, TSL_ERR_SHAPE,
                       "npy: '%s' has shape %s; the input must be N = %lld samples x C, then 0 "
                       "to 3 spatial sizes",
                       path, shape_text(s, text, sizeof text), (long long)ds->info.samples);
    if (st) {
        tsl_data_npy_array_close(&in->file);
        return st;
    }
    tsl_shape_make(&in->shape, s->ndim - 1, s->dims + 1);
    return TSL_OK;
}

tsl_status tsl_data_npy_read_input_box(const struct tsl_dataset *ds, int32_t k, int64_t index,
                                       const int64_t *start, const int64_t *extent, float *x)
{
    const dataset_input *in = &ds->inputs[k];
    return npy_read_box(&in->file, index, in->shape.ndim, in->shape.dims, start, extent, x);
}
