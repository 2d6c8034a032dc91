/* Copy element functions shared by codelets/copy.c's loops and codelets/copy.cu's kernels: an
 * i64 label narrowed to u8 or i32, exact where the value fits; otherwise an invalid label (255
 * or -1, outside [0, classes) for every class count the type serves), which the loss counts. */
#ifndef TESSEL_CODELETS_COPY_MATH_H
#define TESSEL_CODELETS_COPY_MATH_H

#include <stdint.h>

#include "hd.h"

static inline TSL_HD uint8_t tsl_label_u8(int64_t v)
{
    return v >= 0 && v < 255 ? (uint8_t)v : 255;
}

static inline TSL_HD int32_t tsl_label_i32(int64_t v)
{
    return v >= 0 && v <= INT32_MAX ? (int32_t)v : -1;
}

#endif /* TESSEL_CODELETS_COPY_MATH_H */
