/**
 * @file status.h
 * @brief Status codes, error messages and logging levels shared by the whole API.
 *
 * Every public function returns a ::tsl_status: ::TSL_OK (0) on success, a negative
 * code on failure. The message that explains the last failure is kept per thread
 * (tsl_last_error()) and in the context the call was made on
 * (tsl_context_last_error()).
 */
#ifndef TESSEL_STATUS_H
#define TESSEL_STATUS_H

#include "tessel/export.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Result of every public call. */
typedef enum tsl_status {
    TSL_OK = 0,                 /**< success */
    TSL_ERR_INVALID_ARG = -1,   /**< an argument is out of range, NULL or inconsistent */
    TSL_ERR_OUT_OF_MEMORY = -2, /**< an allocation failed */
    TSL_ERR_IO = -3,            /**< a file could not be opened, read or written */
    TSL_ERR_FORMAT = -4,        /**< a file is malformed, truncated or of an unsupported kind */
    TSL_ERR_UNSUPPORTED = -5,   /**< a valid request this build or dtype does not support */
    TSL_ERR_RUNTIME = -6,       /**< StarPU, StarPU-MPI or MPI reported a failure */
    TSL_ERR_STATE = -7,         /**< the call is not allowed in the current state */
    TSL_ERR_SHAPE = -8,         /**< tensor shapes, grids or owners do not fit together */
    TSL_ERR_DTYPE = -9,         /**< element types do not fit the operation */
    TSL_ERR_RESOURCE = -10,     /**< a finite resource (such as the MPI tag range) ran out */
} tsl_status;

/** Log levels, from most to least severe. */
typedef enum tsl_log_level {
    TSL_LOG_ERROR = 0,
    TSL_LOG_WARN = 1,
    TSL_LOG_INFO = 2,
    TSL_LOG_DEBUG = 3,
} tsl_log_level;

/**
 * @brief Log callback.
 * @param[in] level severity of the message
 * @param[in] rank  MPI rank of the process that logs (-1 before a context exists)
 * @param[in] message NUL-terminated text without trailing newline; valid during the call only
 * @param[in] user  the pointer given with the callback
 */
typedef void (*tsl_log_fn)(tsl_log_level level, int rank, const char *message, void *user);

/** @brief Static, human-readable name of a status code ("TSL_ERR_IO: ..."). Never NULL. */
TSL_API const char *tsl_status_string(tsl_status status);

/**
 * @brief Message of the last error raised on the calling thread, or "" if none.
 * @return pointer to thread-local storage, valid until the next failing call on this thread.
 */
TSL_API const char *tsl_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* TESSEL_STATUS_H */
