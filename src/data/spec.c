/* Datasets (include/tessel/data.h): the spec parser, Fashion-MNIST from IDX files (zlib),
 * synthetic segmentation volumes, `.npy` directories read on demand, and the epoch order.
 * Pure C: no StarPU, no MPI. The prefetching loader is in data_loader.c. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "error.h"
#include "tessel/data.h"
#include "tessel/io.h"

/* ---- SplitMix64: the one generator of this file ---- */

#define GOLDEN_GAMMA 0x9e3779b97f4a7c15ULL

/* SplitMix64's output function: a bijective 64-bit mix with full avalanche. */
static uint64_t splitmix_mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static uint64_t splitmix_next(uint64_t *state)
{
    *state += GOLDEN_GAMMA;
    return splitmix_mix(*state);
}

/* Initial state of stream `stream` of key `key`. */
static uint64_t splitmix_stream(uint64_t key, uint64_t stream)
{
    return splitmix_mix(splitmix_mix(key + GOLDEN_GAMMA) ^ stream);
}

/* Uniform in [0, bound), bound >= 1, without modulo bias: draws below 2^64 mod bound are
 * rejected, so the accepted range is a whole number of copies of [0, bound). */
static uint64_t uniform_below(uint64_t *state, uint64_t bound)
{
    uint64_t threshold = (0 - bound) % bound;
    for (;;) {
        uint64_t r = splitmix_next(state);
        if (r >= threshold)
            return r % bound;
    }
}

/* Uniform in [0, 1) with 53 random bits. */
static double uniform_unit(uint64_t *state)
{
    return (double)(splitmix_next(state) >> 11) * 0x1.0p-53;
}

/* 1 / sqrt((65536^2 - 1) / 3): the inverse standard deviation of a sum of four uniform
 * 16-bit integers. */
#define NOISE_SCALE (1.7320508075688772 / 65535.999992370605)

/* About N(0, 1): the centred sum of the four 16-bit parts of one draw (Irwin-Hall, bounded
 * by +-3.46). Integer sum and one product, so it is the same number on every machine. */
static double noise_of(uint64_t r)
{
    int64_t sum = (int64_t)(r & 0xffff) + (int64_t)((r >> 16) & 0xffff) +
                  (int64_t)((r >> 32) & 0xffff) + (int64_t)(r >> 48);
    return (double)(sum - 2 * 65535) * NOISE_SCALE;
}

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
static const char *spec_take(dataset_spec *spec, const char *key)
{
    for (int k = 0; k < spec->count; k++)
        if (strcmp(spec->options[k].key, key) == 0) {
            spec->options[k].used = 1;
            return spec->options[k].value;
        }
    return NULL;
}

/* Refuse the first option no spec_take() asked for. */
static tsl_status spec_check_used(const dataset_spec *spec, const char *valid_keys)
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
static tsl_status spec_number(dataset_spec *spec, const char *key, int integer, double low,
                              double high, int64_t *int_value, double *real_value)
{
    const char *text = spec_take(spec, key);
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

static tsl_status spec_int(dataset_spec *spec, const char *key, double low, double high,
                           int64_t *value)
{
    return spec_number(spec, key, 1, low, high, value, NULL);
}

/* ---- the dataset ---- */

typedef enum dataset_kind {
    DATASET_FASHION_MNIST,
    DATASET_SYNTHETIC,
    DATASET_NPY,
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

/* A `.npy` file whose samples (rows along the first dimension) are read when asked. */
typedef struct npy_array {
    int fd;
    char *path;
    tsl_npy_header header;
    int64_t row_bytes;
} npy_array;

struct tsl_dataset {
    dataset_kind kind;
    tsl_dataset_info info;
    /* Fashion-MNIST: bytes in memory; pixel_value maps a byte to its normalised value. */
    uint8_t *pixels;
    uint8_t *labels;
    float pixel_value[256];
    synthetic_params synthetic;
    npy_array x_file;
    npy_array y_file;
};

/* Sample shape `dims` (C, spatial...); labels per voxel (the spatial part) or per sample. */
static void set_info(tsl_dataset_info *info, int64_t samples, int64_t classes, int32_t ndim,
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

/* ---- Fashion-MNIST: IDX files through zlib ---- */

/* zlib's error text without the file name it starts with; *code is Z_OK when there is none. */
static const char *gz_message(gzFile file, const char *path, int *code)
{
    const char *message = gzerror(file, code);
    size_t len = strlen(path);
    if (strncmp(message, path, len) == 0 && strncmp(message + len, ": ", 2) == 0)
        message += len + 2;
    return message;
}

/* Read exactly `bytes` bytes of `what` from a file opened with gzopen (which also reads
 * files that are not compressed). */
static tsl_status gz_read_exact(gzFile file, void *buffer, int64_t bytes, const char *path,
                                const char *what)
{
    unsigned char *dst = buffer;
    int64_t done = 0;
    while (done < bytes) {
        int64_t chunk = bytes - done < (1 << 30) ? bytes - done : (1 << 30);
        int got = gzread(file, dst + done, (unsigned)chunk);
        if (got < 0) {
            int code;
            return tsl_error(NULL, TSL_ERR_FORMAT, "IDX: '%s' is a corrupt gzip stream (%s)", path,
                             gz_message(file, path, &code));
        }
        if (got == 0)
            break;
        done += got;
    }
    if (done == bytes)
        return TSL_OK;
    int code;
    const char *message = gz_message(file, path, &code);
    if (code != Z_OK)
        return tsl_error(NULL, TSL_ERR_FORMAT,
                         "IDX: '%s' is truncated: its gzip stream ends early (%s) after %lld of "
                         "the %lld bytes of %s",
                         path, message, (long long)done, (long long)bytes, what);
    return tsl_error(NULL, TSL_ERR_FORMAT,
                     "IDX: '%s' is truncated: %lld of the %lld bytes of %s are there", path,
                     (long long)done, (long long)bytes, what);
}

/* Nothing may follow the data: reading on reaches the end cleanly (which also makes zlib
 * check the gzip trailer's CRC and length). */
static tsl_status gz_expect_end(gzFile file, const char *path, int64_t bytes)
{
    unsigned char extra;
    int got = gzread(file, &extra, 1);
    int code;
    const char *message = gz_message(file, path, &code);
    if (got > 0)
        return tsl_error(NULL, TSL_ERR_FORMAT,
                         "IDX: '%s' holds more than the %lld bytes its header describes", path,
                         (long long)bytes);
    if (got < 0 || code != Z_OK)
        return tsl_error(NULL, TSL_ERR_FORMAT,
                         "IDX: '%s' is a corrupt or truncated gzip stream (%s)", path, message);
    return TSL_OK;
}

#define IDX_MAX_BYTES ((int64_t)1 << 36)

/* An IDX file of unsigned bytes (magic 00 00 08 ndim, ndim big-endian 32-bit sizes, the
 * bytes in C order), gzip-compressed or not. */
static tsl_status idx_read(const char *path, int32_t ndim, int64_t *dims, uint8_t **data)
{
    *data = NULL;
    errno = 0;
    gzFile file = gzopen(path, "rb");
    if (!file)
        return tsl_error(NULL, TSL_ERR_IO, "IDX: cannot open '%s': %s", path,
                         errno ? strerror(errno) : "out of memory");
    gzbuffer(file, 1 << 18);
    unsigned char head[4 + 4 * 3];
    tsl_status st = gz_read_exact(file, head, 4, path, "the header");
    if (!st && (head[0] != 0 || head[1] != 0))
        st = tsl_error(NULL, TSL_ERR_FORMAT,
                       "IDX: '%s' is not an IDX file (magic %02x %02x %02x %02x, want 00 00 08 "
                       "%02x)%s",
                       path, head[0], head[1], head[2], head[3], (unsigned)ndim,
                       gzdirect(file) ? "; it is not gzip-compressed either" : "");
    else if (!st && head[2] != 0x08)
        st = tsl_error(NULL, TSL_ERR_FORMAT,
                       "IDX: '%s' holds elements of type 0x%02x; want 0x08 (unsigned bytes)", path,
                       head[2]);
    else if (!st && head[3] != ndim)
        st = tsl_error(NULL, TSL_ERR_FORMAT, "IDX: '%s' has %d dimensions; want %d", path, head[3],
                       (int)ndim);
    if (!st)
        st = gz_read_exact(file, head + 4, 4 * ndim, path, "the header");
    int64_t bytes = 1;
    for (int d = 0; d < ndim && !st; d++) {
        const unsigned char *b = head + 4 + 4 * d;
        dims[d] = (int64_t)b[0] << 24 | (int64_t)b[1] << 16 | (int64_t)b[2] << 8 | b[3];
        if (dims[d] == 0 || dims[d] > IDX_MAX_BYTES / bytes)
            st = tsl_error(NULL, TSL_ERR_FORMAT,
                           "IDX: '%s' has an empty or implausibly large dimension %d (%lld)", path,
                           d, (long long)dims[d]);
        else
            bytes *= dims[d];
    }
    if (!st && !(*data = malloc((size_t)bytes)))
        st = tsl_error(NULL, TSL_ERR_OUT_OF_MEMORY, "IDX: cannot allocate %lld bytes for '%s'",
                       (long long)bytes, path);
    if (!st)
        st = gz_read_exact(file, *data, bytes, path, "data its header describes");
    if (!st)
        st = gz_expect_end(file, path, bytes);
    gzclose(file);
    if (st) {
        free(*data);
        *data = NULL;
    }
    return st;
}

/* DIR/NAME.gz, or DIR/NAME when only the uncompressed file is there. */
static tsl_status fashion_path(char *path, size_t cap, const char *dir, const char *name)
{
    if (snprintf(path, cap, "%s/%s.gz", dir, name) >= (int)cap)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "fashion-mnist: directory name too long");
    if (access(path, F_OK) == 0)
        return TSL_OK;
    snprintf(path, cap, "%s/%s", dir, name);
    if (access(path, F_OK) == 0)
        return TSL_OK;
    return tsl_error(NULL, TSL_ERR_IO,
                     "fashion-mnist: '%s/%s.gz' does not exist (install the Debian package "
                     "dataset-fashion-mnist, or give another directory: fashion-mnist:dir=DIR)",
                     dir, name);
}

static tsl_status fashion_open(struct tsl_dataset *ds, dataset_spec *spec, tsl_split split)
{
    const char *dir = spec_take(spec, "dir");
    tsl_status st = spec_check_used(spec, "dir");
    if (st)
        return st;
    const char *prefix = split == TSL_SPLIT_TRAIN ? "train" : "t10k";
    char name[64], images_path[PATH_MAX], labels_path[PATH_MAX];
    int64_t image_dims[3], label_count;
    snprintf(name, sizeof name, "%s-images-idx3-ubyte", prefix);
    if ((st = fashion_path(images_path, sizeof images_path, dir ? dir : TSL_FASHION_MNIST_DIR,
                           name)))
        return st;
    snprintf(name, sizeof name, "%s-labels-idx1-ubyte", prefix);
    if ((st = fashion_path(labels_path, sizeof labels_path, dir ? dir : TSL_FASHION_MNIST_DIR,
                           name)) ||
        (st = idx_read(images_path, 3, image_dims, &ds->pixels)) ||
        (st = idx_read(labels_path, 1, &label_count, &ds->labels)))
        return st;
    if (label_count != image_dims[0])
        return tsl_error(
            NULL, TSL_ERR_SHAPE, "fashion-mnist: '%s' holds %lld labels but '%s' holds %lld images",
            labels_path, (long long)label_count, images_path, (long long)image_dims[0]);
    for (int64_t i = 0; i < label_count; i++)
        if (ds->labels[i] >= 10)
            return tsl_error(NULL, TSL_ERR_FORMAT,
                             "fashion-mnist: label %d of sample %lld in '%s' is outside [0, 10)",
                             ds->labels[i], (long long)i, labels_path);
    int64_t sample_dims[3] = {1, image_dims[1], image_dims[2]};
    set_info(&ds->info, image_dims[0], 10, 3, sample_dims, 0);
    for (int p = 0; p < 256; p++)
        ds->pixel_value[p] =
            (float)(((double)p / 255.0 - TSL_FASHION_MNIST_MEAN) / TSL_FASHION_MNIST_STD);
    return TSL_OK;
}

static void fashion_read_box(const struct tsl_dataset *ds, int64_t index, const int64_t *start,
                             const int64_t *extent, float *x, int64_t *y)
{
    int64_t width = ds->info.sample_shape.dims[2];
    const uint8_t *src = ds->pixels + index * ds->info.sample_numel;
    for (int64_t i = 0; x && i < extent[1]; i++)
        for (int64_t j = 0; j < extent[2]; j++)
            x[i * extent[2] + j] = ds->pixel_value[src[(start[1] + i) * width + start[2] + j]];
    if (y)
        *y = ds->labels[index];
}

/* ---- synthetic segmentation volumes ---- */

/* Object radius as a fraction of the side, per number of dimensions: about the same share
 * of the volume per object in 1-D, 2-D and 3-D. */
static const double object_radius[3][2] = {{0.04, 0.10}, {0.08, 0.20}, {0.12, 0.25}};

/* One painted object: a sphere or box of one class, its centre and radii in voxels, and the
 * voxels [low, high) per axis that can lie inside (axes of a 1-D or 2-D set that do not
 * exist are [0, 1)). */
typedef struct synthetic_object {
    int box;
    int64_t label;
    double centre[3], radius[3];
    int64_t low[3], high[3];
} synthetic_object;

/* Draw one object from `state` (the order of draws defines the dataset). */
static void draw_object(const synthetic_params *p, uint64_t *state, synthetic_object *o)
{
    o->box = (int)uniform_below(state, 2);
    o->label = 1 + (int64_t)uniform_below(state, (uint64_t)p->classes - 1);
    const double *range = object_radius[p->dims - 1];
    double size = (double)p->size;
    double sphere_radius = size * (range[0] + (range[1] - range[0]) * uniform_unit(state));
    for (int axis = 0; axis < 3; axis++) {
        o->centre[axis] = 0.5;
        o->radius[axis] = 1;
        o->low[axis] = 0;
        o->high[axis] = 1;
    }
    for (int axis = 3 - p->dims; axis < 3; axis++) {
        o->centre[axis] = size * uniform_unit(state);
        o->radius[axis] = o->box ? size * (range[0] + (range[1] - range[0]) * uniform_unit(state))
                                 : sphere_radius;
        if (o->radius[axis] < 1.0)
            o->radius[axis] = 1.0;
        double first = floor(o->centre[axis] - o->radius[axis]);
        double last = ceil(o->centre[axis] + o->radius[axis]);
        o->low[axis] = first < 0 ? 0 : (int64_t)first;
        o->high[axis] = last >= size ? p->size : (int64_t)last + 1;
    }
}

/* The objects of sample `index`, and the generator state after them (where the noise draws
 * start: the k-th draw is mix(state + (k + 1) G), so any voxel's noise is found directly). */
static uint64_t draw_objects(const synthetic_params *p, int64_t index, synthetic_object *objects)
{
    uint64_t state = splitmix_stream(p->split_key, (uint64_t)index);
    for (int32_t o = 0; o < p->objects; o++)
        draw_object(p, &state, &objects[o]);
    return state;
}

/* Labels of the box start .. start + extent - 1 (three axes, C order into `labels`): the
 * objects painted in order, later ones on top, on background 0. */
static void paint_box(int32_t nobjects, const synthetic_object *objects, const int64_t start[3],
                      const int64_t extent[3], int64_t *labels)
{
    memset(labels, 0, (size_t)(extent[0] * extent[1] * extent[2]) * sizeof *labels);
    for (int32_t n = 0; n < nobjects; n++) {
        const synthetic_object *o = &objects[n];
        int64_t low[3], high[3];
        int empty = 0;
        for (int a = 0; a < 3; a++) {
            low[a] = o->low[a] > start[a] ? o->low[a] : start[a];
            high[a] = o->high[a] < start[a] + extent[a] ? o->high[a] : start[a] + extent[a];
            empty |= low[a] >= high[a];
        }
        if (empty)
            continue;
        for (int64_t i = low[0]; i < high[0]; i++)
            for (int64_t j = low[1]; j < high[1]; j++)
                for (int64_t k = low[2]; k < high[2]; k++) {
                    double t[3] = {((double)i + 0.5 - o->centre[0]) / o->radius[0],
                                   ((double)j + 0.5 - o->centre[1]) / o->radius[1],
                                   ((double)k + 0.5 - o->centre[2]) / o->radius[2]};
                    int inside = o->box ? fabs(t[0]) <= 1 && fabs(t[1]) <= 1 && fabs(t[2]) <= 1
                                        : t[0] * t[0] + t[1] * t[1] + t[2] * t[2] <= 1;
                    if (inside)
                        labels[((i - start[0]) * extent[1] + j - start[1]) * extent[2] + k -
                               start[2]] = o->label;
                }
    }
}

/* The label of a whole sample: the class covering the most voxels apart from background
 * (the smaller class on a tie), or 0 when nothing was painted. Painted a row at a time, so
 * it needs no whole-volume buffer. */
static tsl_status sample_label(const synthetic_params *p, int32_t nobjects,
                               const synthetic_object *objects, int64_t *label)
{
    int64_t side[3] = {1, 1, 1};
    for (int d = 0; d < p->dims; d++)
        side[3 - p->dims + d] = p->size;
    int64_t *row = malloc((size_t)side[2] * sizeof *row);
    if (!row)
        return tsl_error(NULL, TSL_ERR_OUT_OF_MEMORY, "synthetic: out of memory");
    int64_t count[256] = {0}, best = 0;
    int64_t extent[3] = {1, 1, side[2]};
    for (int64_t i = 0; i < side[0]; i++)
        for (int64_t j = 0; j < side[1]; j++) {
            int64_t start[3] = {i, j, 0};
            paint_box(nobjects, objects, start, extent, row);
            for (int64_t k = 0; k < side[2]; k++)
                count[row[k]]++;
        }
    free(row);
    for (int32_t c = 1; c < p->classes; c++)
        if (count[c] > count[best] || (best == 0 && count[c] > 0))
            best = c;
    *label = best;
    return TSL_OK;
}

static tsl_status synthetic_open(struct tsl_dataset *ds, dataset_spec *spec, tsl_split split)
{
    int64_t dims = 2, size = 32, samples = 64, classes = 3, channels = 1, objects = 4, seed = 0;
    double noise = 0.5;
    tsl_status st;
    const char *labels = spec_take(spec, "labels");
    if (labels && strcmp(labels, "voxel") && strcmp(labels, "sample"))
        return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                         "dataset spec '%s': labels=%s (want voxel or sample)", spec->original,
                         labels);
    if ((st = spec_int(spec, "dims", 1, 3, &dims)) ||
        (st = spec_int(spec, "size", 4, 1 << 16, &size)) ||
        (st = spec_int(spec, "samples", 1, 0x1p40, &samples)) ||
        (st = spec_int(spec, "classes", 2, 256, &classes)) ||
        (st = spec_int(spec, "channels", 1, 64, &channels)) ||
        (st = spec_int(spec, "objects", 1, 64, &objects)) ||
        (st = spec_number(spec, "noise", 0, 0.0, 1000.0, NULL, &noise)) ||
        (st = spec_int(spec, "seed", 0, 1e18, &seed)) ||
        (st = spec_check_used(spec, "dims, size, samples, classes, channels, objects, noise, "
                                    "seed, labels")))
        return st;
    int64_t sample_dims[4] = {channels, 1, 1, 1};
    double numel = (double)channels;
    for (int d = 1; d <= dims; d++) {
        sample_dims[d] = size;
        numel *= (double)size;
    }
    if (numel > (double)((int64_t)1 << 28))
        return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                         "dataset spec '%s': a sample of %lld x %lld^%lld floats is too large "
                         "(at most 2^28)",
                         spec->original, (long long)channels, (long long)size, (long long)dims);
    synthetic_params *p = &ds->synthetic;
    p->dims = (int32_t)dims;
    p->size = size;
    p->channels = (int32_t)channels;
    p->classes = (int32_t)classes;
    p->objects = (int32_t)objects;
    p->noise = noise;
    p->per_sample = labels && strcmp(labels, "sample") == 0;
    p->split_key = splitmix_stream((uint64_t)seed, (uint64_t)split);
    set_info(&ds->info, samples, classes, (int32_t)dims + 1, sample_dims, !p->per_sample);
    return TSL_OK;
}

/* Box `start`, `extent` (C, then the spatial axes) of sample `index`: every channel of every
 * voxel is its class id plus noise; y the box's labels, or the sample's one label. */
static tsl_status synthetic_read_box(const struct tsl_dataset *ds, int64_t index,
                                     const int64_t *start, const int64_t *extent, float *x,
                                     int64_t *y)
{
    const synthetic_params *p = &ds->synthetic;
    synthetic_object objects[64];
    uint64_t state = draw_objects(p, index, objects);
    if (y && p->per_sample) {
        tsl_status st = sample_label(p, p->objects, objects, y);
        if (st)
            return st;
    }
    if (!x && (!y || p->per_sample))
        return TSL_OK;
    /* The spatial box on three axes, the missing leading ones of size 1. */
    int64_t side[3] = {1, 1, 1}, box_start[3] = {0, 0, 0}, box_extent[3] = {1, 1, 1};
    for (int d = 0; d < p->dims; d++) {
        side[3 - p->dims + d] = p->size;
        box_start[3 - p->dims + d] = start[1 + d];
        box_extent[3 - p->dims + d] = extent[1 + d];
    }
    int64_t voxels = side[0] * side[1] * side[2];
    int64_t box_voxels = box_extent[0] * box_extent[1] * box_extent[2];
    int64_t *labels = y && !p->per_sample ? y : malloc((size_t)box_voxels * sizeof *labels);
    if (!labels)
        return tsl_error(NULL, TSL_ERR_OUT_OF_MEMORY, "synthetic: out of memory");
    paint_box(p->objects, objects, box_start, box_extent, labels);
    for (int64_t c = 0; x && c < extent[0]; c++) {
        uint64_t first = state + (uint64_t)((start[0] + c) * voxels + 1) * GOLDEN_GAMMA;
        float *xc = x + c * box_voxels;
        for (int64_t i = 0; i < box_extent[0]; i++)
            for (int64_t j = 0; j < box_extent[1]; j++) {
                int64_t v0 =
                    ((box_start[0] + i) * side[1] + box_start[1] + j) * side[2] + box_start[2];
                int64_t b0 = (i * box_extent[1] + j) * box_extent[2];
                for (int64_t k = 0; k < box_extent[2]; k++) {
                    uint64_t r = splitmix_mix(first + (uint64_t)(v0 + k) * GOLDEN_GAMMA);
                    xc[b0 + k] = (float)((double)labels[b0 + k] + p->noise * noise_of(r));
                }
            }
    }
    if (labels != y)
        free(labels);
    return TSL_OK;
}

/* ---- `.npy` directories ---- */

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
    if ((a->fd = open(path, O_RDONLY | O_CLOEXEC)) < 0 || fstat(a->fd, &file_info) != 0)
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

static void npy_array_close(npy_array *a)
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
        if (labels[i] < 0 || labels[i] >= classes)
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
    if (y->header.dtype != TSL_I64)
        return tsl_error(NULL, TSL_ERR_DTYPE,
                         "npy: '%s' holds %s values; labels must be i64 (numpy: "
                         "y.astype(np.int64))",
                         y->path, tsl_dtype_name(y->header.dtype));
    if (xs->ndim < 2)
        return tsl_error(NULL, TSL_ERR_SHAPE,
                         "npy: '%s' has shape %s; x must be N x C, then 0 to 3 spatial sizes",
                         x->path, x_text);
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

static tsl_status npy_open(struct tsl_dataset *ds, dataset_spec *spec, tsl_split split)
{
    const char *dir = spec_take(spec, "dir");
    int64_t classes = 0, largest = 0;
    tsl_status st;
    if ((st = spec_int(spec, "classes", 2, 0x1p24, &classes)) ||
        (st = spec_check_used(spec, "dir (or a bare DIR), classes")))
        return st;
    if (!dir)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                         "dataset spec '%s': npy needs a directory (npy:DIR)", spec->original);
    const char *suffix = split == TSL_SPLIT_TRAIN ? "" : "_test";
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
        (st = npy_check_pair(&ds->x_file, &ds->y_file)) ||
        (st = scan_labels(&ds->y_file, classes ? classes : INT32_MAX, &largest)))
        return st;
    const tsl_shape *xs = &ds->x_file.header.shape;
    set_info(&ds->info, xs->dims[0], classes ? classes : largest + 1, xs->ndim - 1, xs->dims + 1,
             ds->y_file.header.shape.ndim > 1);
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

static tsl_status npy_read_sample_box(const struct tsl_dataset *ds, int64_t index,
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
    dataset_spec spec;
    tsl_status st = spec_parse(&spec, spec_text);
    if (!st && strcmp(spec.name, "fashion-mnist") == 0) {
        ds->kind = DATASET_FASHION_MNIST;
        st = fashion_open(ds, &spec, split);
    } else if (!st && strcmp(spec.name, "synthetic") == 0) {
        ds->kind = DATASET_SYNTHETIC;
        st = synthetic_open(ds, &spec, split);
    } else if (!st && strcmp(spec.name, "npy") == 0) {
        ds->kind = DATASET_NPY;
        st = npy_open(ds, &spec, split);
    } else if (!st) {
        st = tsl_error(NULL, TSL_ERR_INVALID_ARG,
                       "dataset spec '%s': unknown dataset '%s' (want fashion-mnist, "
                       "synthetic or npy:DIR)",
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

tsl_status tsl_dataset_destroy(tsl_dataset_t ds)
{
    if (!ds)
        return TSL_OK;
    free(ds->pixels);
    free(ds->labels);
    npy_array_close(&ds->x_file);
    npy_array_close(&ds->y_file);
    free(ds);
    return TSL_OK;
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
    switch (ds->kind) {
    case DATASET_FASHION_MNIST:
        fashion_read_box(ds, index, start, extent, x, y);
        return TSL_OK;
    case DATASET_SYNTHETIC:
        return synthetic_read_box(ds, index, start, extent, x, y);
    case DATASET_NPY:
        return npy_read_sample_box(ds, index, start, extent, x, y);
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
