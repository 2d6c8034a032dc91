/* Synthetic segmentation volumes (include/tessel/data.h): objects of each class painted
 * into a volume, plus noise, every voxel drawn from the generator so that any box of any
 * sample is computed on its own. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "data_internal.h"

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

tsl_status tsl_data_synthetic_open(struct tsl_dataset *ds, dataset_spec *spec, tsl_split split)
{
    int64_t dims = 2, size = 32, samples = 64, classes = 3, channels = 1, objects = 4, seed = 0;
    double noise = 0.5;
    tsl_status st;
    const char *labels = tsl_data_spec_take(spec, "labels");
    if (labels && strcmp(labels, "voxel") && strcmp(labels, "sample"))
        return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                         "dataset spec '%s': labels=%s (want voxel or sample)", spec->original,
                         labels);
    if ((st = tsl_data_spec_int(spec, "dims", 1, 3, &dims)) ||
        (st = tsl_data_spec_int(spec, "size", 4, 1 << 16, &size)) ||
        (st = tsl_data_spec_int(spec, "samples", 1, 0x1p40, &samples)) ||
        (st = tsl_data_spec_int(spec, "classes", 2, 256, &classes)) ||
        (st = tsl_data_spec_int(spec, "channels", 1, 64, &channels)) ||
        (st = tsl_data_spec_int(spec, "objects", 1, 64, &objects)) ||
        (st = tsl_data_spec_number(spec, "noise", 0, 0.0, 1000.0, NULL, &noise)) ||
        (st = tsl_data_spec_int(spec, "seed", 0, 1e18, &seed)) ||
        (st = tsl_data_spec_check_used(spec,
                                       "dims, size, samples, classes, channels, objects, noise, "
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
    tsl_data_set_info(&ds->info, samples, classes, (int32_t)dims + 1, sample_dims, !p->per_sample);
    return TSL_OK;
}

/* Box `start`, `extent` (C, then the spatial axes) of sample `index`: every channel of every
 * voxel is its class id plus noise; y the box's labels, or the sample's one label. */
tsl_status tsl_data_synthetic_read_box(const struct tsl_dataset *ds, int64_t index,
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
