/* Fashion-MNIST (include/tessel/data.h): IDX files of unsigned bytes, gzip-compressed or
 * not, read through zlib into memory when the dataset is opened. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "data_internal.h"

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

tsl_status tsl_data_fashion_open(struct tsl_dataset *ds, dataset_spec *spec, tsl_split split)
{
    const char *dir = tsl_data_spec_take(spec, "dir");
    tsl_status st = tsl_data_spec_check_used(spec, "dir");
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
    tsl_data_set_info(&ds->info, image_dims[0], 10, 3, sample_dims, 0);
    for (int p = 0; p < 256; p++)
        ds->pixel_value[p] =
            (float)(((double)p / 255.0 - TSL_FASHION_MNIST_MEAN) / TSL_FASHION_MNIST_STD);
    return TSL_OK;
}

void tsl_data_fashion_read_box(const struct tsl_dataset *ds, int64_t index, const int64_t *start,
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
