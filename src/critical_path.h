/* The critical path of a task graph in submission order (src/critical_path.c). */
#ifndef TESSEL_SRC_CRITICAL_PATH_H
#define TESSEL_SRC_CRITICAL_PATH_H

#include <stdint.h>

enum { TSL_ACCESS_R = 1, TSL_ACCESS_W = 2 }; /* read-write: both */

/* Tasks 0 .. ntasks - 1 in submission order; task t accesses the data ids[first[t] ..
 * first[t + 1] - 1] (each at most once) in the ways access[...] says, and runs duration[t]
 * (any unit; negative counts as 0). Each task starts when the last writer of every datum it
 * accesses has ended and, if it writes the datum, the readers since then too (StarPU's
 * sequential consistency); with as many workers as tasks, the last end is *critical, the sum
 * of the durations *total. 0, or -1 when out of memory. */
int tsl_critical_path(int64_t ntasks, const int64_t *first, const int64_t *ids,
                      const uint8_t *access, const double *duration, double *critical,
                      double *total);

#endif
