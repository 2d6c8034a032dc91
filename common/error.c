/* Status strings, per-thread error messages, logging; per-context ones through the sink a
 * context registers (common/error.h). */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "error.h"

static _Thread_local char thread_last_error[TSL_ERROR_MAX];
static const tsl_log_sink *context_sink;

void tsl_log_sink_register(const tsl_log_sink *sink)
{
    __atomic_store_n(&context_sink, sink, __ATOMIC_RELEASE);
}

static const tsl_log_sink *sink_for(struct tsl_context *ctx)
{
    return ctx ? __atomic_load_n(&context_sink, __ATOMIC_ACQUIRE) : NULL;
}

const char *tsl_status_string(tsl_status status)
{
    switch (status) {
    case TSL_OK:
        return "TSL_OK: success";
    case TSL_ERR_INVALID_ARG:
        return "TSL_ERR_INVALID_ARG: invalid argument";
    case TSL_ERR_OUT_OF_MEMORY:
        return "TSL_ERR_OUT_OF_MEMORY: out of memory";
    case TSL_ERR_IO:
        return "TSL_ERR_IO: input/output error";
    case TSL_ERR_FORMAT:
        return "TSL_ERR_FORMAT: malformed or unsupported file";
    case TSL_ERR_UNSUPPORTED:
        return "TSL_ERR_UNSUPPORTED: not supported";
    case TSL_ERR_RUNTIME:
        return "TSL_ERR_RUNTIME: StarPU or MPI failure";
    case TSL_ERR_STATE:
        return "TSL_ERR_STATE: not allowed in the current state";
    case TSL_ERR_SHAPE:
        return "TSL_ERR_SHAPE: shapes, grids or owners do not fit";
    case TSL_ERR_DTYPE:
        return "TSL_ERR_DTYPE: element type does not fit";
    case TSL_ERR_RESOURCE:
        return "TSL_ERR_RESOURCE: resource exhausted";
    }
    return "TSL_ERR_UNKNOWN: unknown status code";
}

const char *tsl_last_error(void)
{
    return thread_last_error;
}

void tsl_error_set_message(struct tsl_context *ctx, const char *message)
{
    snprintf(thread_last_error, sizeof thread_last_error, "%s", message);
    const tsl_log_sink *sink = sink_for(ctx);
    if (sink)
        sink->record(ctx, message);
}

tsl_status tsl_error(struct tsl_context *ctx, tsl_status status, const char *fmt, ...)
{
    char message[TSL_ERROR_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);
    tsl_error_set_message(ctx, message);
    tsl_log(ctx, TSL_LOG_DEBUG, "%s (%s)", message, tsl_status_string(status));
    return status;
}

const char *tsl_log_level_name(tsl_log_level level)
{
    switch (level) {
    case TSL_LOG_ERROR:
        return "error";
    case TSL_LOG_WARN:
        return "warning";
    case TSL_LOG_INFO:
        return "info";
    case TSL_LOG_DEBUG:
        return "debug";
    }
    return "log";
}

void tsl_log(struct tsl_context *ctx, tsl_log_level level, const char *fmt, ...)
{
    const tsl_log_sink *sink = sink_for(ctx);
    if (sink ? !sink->wants(ctx, level) : level > TSL_LOG_WARN)
        return;
    char message[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);
    if (sink)
        sink->emit(ctx, level, message);
    else
        fprintf(stderr, "tessel[-1] %s: %s\n", tsl_log_level_name(level), message);
}
