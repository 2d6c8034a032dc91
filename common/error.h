/* Errors and logging, the bottom floor of the library: usable from every part of it (graph/
 * and its tests included) without StarPU or MPI. An error is recorded on the calling thread
 * (tsl_last_error()); a context, which this floor knows only as an opaque pointer, registers
 * a sink (tsl_log_sink_register()) that keeps the message in the context too and routes log
 * lines through the context's level, rank and callback. */
#ifndef TESSEL_COMMON_ERROR_H
#define TESSEL_COMMON_ERROR_H

#include "tessel/status.h"

/* Longest error message kept, terminating zero included. */
#define TSL_ERROR_MAX 512

struct tsl_context;

/* What a context does with errors and log lines made for it (ctx never NULL here). */
typedef struct tsl_log_sink {
    /* Keep the message as the context's last error. */
    void (*record)(struct tsl_context *ctx, const char *message);
    /* Whether the context wants lines of this level. */
    int (*wants)(struct tsl_context *ctx, tsl_log_level level);
    /* Write one line (level already checked). */
    void (*emit)(struct tsl_context *ctx, tsl_log_level level, const char *message);
} tsl_log_sink;

/* The sink for errors and log lines with a context: registered by the runtime before its
 * first context exists; the same sink every time (a later call replaces it). */
void tsl_log_sink_register(const tsl_log_sink *sink);

/* Record an error on the calling thread (and on ctx when not NULL), log it at debug
 * level, and return status: `return tsl_error(ctx, TSL_ERR_..., "fmt", ...);` */
tsl_status tsl_error(struct tsl_context *ctx, tsl_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Copy an error message received from another rank into the thread and context. */
void tsl_error_set_message(struct tsl_context *ctx, const char *message);

/* A log line: through the context's sink, or without a context to stderr at warning level
 * and above ("tessel[-1] warning: ..."). */
void tsl_log(struct tsl_context *ctx, tsl_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* "error", "warning", "info", "debug". */
const char *tsl_log_level_name(tsl_log_level level);

#endif /* TESSEL_COMMON_ERROR_H */
