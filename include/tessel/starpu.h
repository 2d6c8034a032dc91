/**
 * @file starpu.h
 * @brief Embedding: attach tessel to a StarPU and StarPU-MPI instance that a host
 *        application started, and reach the StarPU handles behind tiles.
 *
 * This is the only public header that exposes StarPU and MPI types. It is not included
 * by tessel.h.
 */
#ifndef TESSEL_STARPU_H
#define TESSEL_STARPU_H

#include <mpi.h>
#include <starpu.h>

#include "tessel/context.h"
#include "tessel/export.h"
#include "tessel/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/**
 * @brief Attach to a running StarPU and StarPU-MPI. The host initialised MPI (with
 * MPI_THREAD_MULTIPLE when @p comm has more than one rank, since tessel's collective
 * calls use MPI from the calling thread while StarPU-MPI's thread runs), StarPU and
 * StarPU-MPI; it keeps them running until after tsl_context_destroy().
 *
 * tessel uses only the StarPU-MPI data tags in [config->tag_base, tag_base + tag_count),
 * and waits only on its own tasks. Like tsl_context_create(), it sets OpenBLAS to one thread
 * for the whole process (one task, one core: parallelism comes from tiles).
 *
 * @param[out] ctx    the new context
 * @param[in]  comm   communicator tessel's tensors live on (duplicated for tessel's own
 *                    control messages; StarPU-MPI transfers use @p comm itself)
 * @param[in]  config tag range and logging; ncpu, ncuda and scheduler must keep their
 *                    defaults (the host chose them), or ::TSL_ERR_INVALID_ARG
 */
TSL_API tsl_status tsl_context_attach(tsl_context_t *ctx, MPI_Comm comm,
                                      const tsl_context_config *config);

/** @brief The communicator tessel's StarPU-MPI transfers use. Not collective. */
TSL_API tsl_status tsl_context_comm(tsl_context_t ctx, MPI_Comm *comm);

/**
 * @brief The StarPU handle of tile @p index (row-major tile number). The handle stays
 * owned by the tensor: do not unregister it. A host task may read or write it with
 * starpu_mpi_task_insert() on the context's communicator. Not collective.
 */
TSL_API tsl_status tsl_tensor_tile_handle(tsl_tensor_t tensor, int64_t index,
                                          starpu_data_handle_t *handle);

#ifdef __cplusplus
}
#endif

#endif /* TESSEL_STARPU_H */
