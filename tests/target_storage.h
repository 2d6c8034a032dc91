// An application's storage of float targets for tsl_dataset_create_callback_targets() in the
// tests: a dataset of float targets (`inner`) served through the two callbacks, counting the
// target boxes asked for and those that are whole targets; sample `broken` cannot be read.
#ifndef TESSEL_TESTS_TARGET_STORAGE_H
#define TESSEL_TESTS_TARGET_STORAGE_H

#include <atomic>
#include <cstdint>

#include "tessel/data.h"

struct TargetStorage {
    tsl_dataset_t inner = nullptr;
    int64_t broken = -1;
    std::atomic<int64_t> boxes{0}, whole{0};
};

// read_box: the samples' boxes (a dataset of targets asks for no labels).
inline tsl_status target_storage_x(int64_t index, const int64_t *start, const int64_t *extent,
                                   float *x, int64_t *y, void *user)
{
    auto *s = static_cast<TargetStorage *>(user);
    return y ? TSL_ERR_INVALID_ARG : tsl_dataset_read_box(s->inner, index, start, extent, x, y);
}

// read_targets: the targets' boxes.
inline tsl_status target_storage_read(int64_t index, const int64_t *start, const int64_t *extent,
                                      float *t, void *user)
{
    auto *s = static_cast<TargetStorage *>(user);
    if (index == s->broken)
        return TSL_ERR_IO;
    tsl_dataset_info info;
    tsl_dataset_get_info(s->inner, &info);
    bool all = true;
    for (int32_t d = 0; d < info.label_shape.ndim; d++)
        all = all && start[d] == 0 && extent[d] == info.label_shape.dims[d];
    s->boxes++;
    s->whole += all;
    return tsl_dataset_read_target_box(s->inner, index, start, extent, t);
}

#endif
