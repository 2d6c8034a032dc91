/* Error recording and logging, usable from every part of the library (graph/ included:
 * nothing here needs StarPU or MPI). */
#ifndef TESSEL_SRC_ERROR_H
#define TESSEL_SRC_ERROR_H

#include "tessel/status.h"

struct tsl_context;

/* Record an error on the calling thread (and on ctx when not NULL), log it at debug
 * level, and return status: `return tsl_error(ctx, TSL_ERR_..., "fmt", ...);` */
tsl_status tsl_error(struct tsl_context *ctx, tsl_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Copy an error message received from another rank into the thread and context. */
void tsl_error_set_message(struct tsl_context *ctx, const char *message);

void tsl_log(struct tsl_context *ctx, tsl_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif /* TESSEL_SRC_ERROR_H */
