/* Element access for kernels that compute in double whatever the tile's float dtype. */
#ifndef TESSEL_CODELETS_SCALAR_H
#define TESSEL_CODELETS_SCALAR_H

#include <stdint.h>

#include "tessel/tensor.h"

/* Element i of an f32 or f64 buffer, as a double. */
static inline double tsl_load(int dtype, const void *p, int64_t i)
{
    return dtype == TSL_F32 ? (double)((const float *)p)[i] : ((const double *)p)[i];
}

/* Store v into element i of an f32 (rounded) or f64 buffer. */
static inline void tsl_store(int dtype, void *p, int64_t i, double v)
{
    if (dtype == TSL_F32)
        ((float *)p)[i] = (float)v;
    else
        ((double *)p)[i] = v;
}

#endif /* TESSEL_CODELETS_SCALAR_H */
